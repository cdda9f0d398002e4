/*
 * synth.c: the seeded synthetic model, for tests, the demo and benchmarks.
 *
 * Every value is a pure function of (seed, layer, expert, tensor, row,
 * column), so blobs are made in any order on any number of threads and the
 * bytes never depend on the thread count:
 *   tensor key = mix64(seed ^ mix64(layer, expert, tensor))
 *   row key    = mix64(tensor key + row)
 *   group k    = draw4(row key, k): 64 bits, four 16-bit draws r
 *   value      = r / 32768 * s, uniform in [-s, s)
 * gate, up and the router s = 1/sqrt(d_model), down s = 1/sqrt(d_ff); the
 * norm is 1 + r / 32768 * 0.1. f16 and bf16 rows are looked up in a table
 * of the 65536 encodings (the values are the f32 ones, rounded to nearest
 * even); q8_0 blocks are those of the same values (see encode_q8_0).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_int.h"

#define SYNTH_ALGO 3u /* bump when the values change: part of the source hash */

enum { T_GATE, T_UP, T_DOWN, T_ROUTER, T_NORM };

/* 16-bit draws map to [-s, s): v = r * s / 32768. f16 and bf16 go through
 * a table of all 65536 encodings per scale (built once per plan). */
struct synth {
	struct baton_synth_params p;
	float s_in, s_down;     /* 1/sqrt(d_model), 1/sqrt(d_ff) */
	uint16_t *tab_in, *tab_down;
};

static uint64_t mix64(uint64_t z)
{
	z += 0x9E3779B97F4A7C15u;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
	return z ^ (z >> 31);
}

/* Four 16-bit draws for group k of a row: a counter-based hash, no state
 * carried from one group to the next. */
static inline uint64_t draw4(uint64_t rk, uint64_t k)
{
	uint64_t z = rk ^ (k * 0x9E3779B97F4A7C15u);
	z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93u;
	z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93u;
	return z ^ (z >> 32);
}

static inline float draw_value(uint64_t z, int i, float s)
{
	return (float)(int16_t)(uint16_t)(z >> (16 * i)) * s;
}

/* One row of floats (cols values). */
static void gen_row_f32(uint64_t rk, float *x, uint32_t cols, float scale, float bias)
{
	float s = scale * 0x1.0p-15f;
	uint32_t full = cols / 4, j;
	for (uint32_t k = 0; k < full; k++) {
		uint64_t z = draw4(rk, k);
		x[4 * k + 0] = bias + draw_value(z, 0, s);
		x[4 * k + 1] = bias + draw_value(z, 1, s);
		x[4 * k + 2] = bias + draw_value(z, 2, s);
		x[4 * k + 3] = bias + draw_value(z, 3, s);
	}
	j = full * 4;
	if (j < cols) {
		uint64_t z = draw4(rk, full);
		for (int i = 0; j < cols; i++, j++)
			x[j] = bias + draw_value(z, i, s);
	}
}

/* One row through a 16-bit table (f16, bf16). */
static void gen_row_tab(uint64_t rk, uint8_t *dst, uint32_t cols, const uint16_t *tab)
{
	uint32_t full = cols / 4, j;
	for (uint32_t k = 0; k < full; k++) {
		uint64_t z = draw4(rk, k);
		uint64_t w = (uint64_t)tab[(uint16_t)z] | (uint64_t)tab[(uint16_t)(z >> 16)] << 16 |
		    (uint64_t)tab[(uint16_t)(z >> 32)] << 32 | (uint64_t)tab[(uint16_t)(z >> 48)] << 48;
		memcpy(dst + 8 * (size_t)k, &w, 8);
	}
	j = full * 4;
	if (j < cols) {
		uint64_t z = draw4(rk, full);
		for (int i = 0; j < cols; i++, j++) {
			uint16_t h = tab[(uint16_t)(z >> (16 * i))];
			memcpy(dst + 2 * (size_t)j, &h, 2);
		}
	}
}

/* roundf (half away from zero) without a libm call, for |v| < 2^23. */
static inline int32_t round_away(float v)
{
	int32_t t = (int32_t)v;
	float f = v - (float)t; /* exact */
	return t + (int32_t)(f >= 0.5f) - (int32_t)(f <= -0.5f);
}

/* One row of raw 16-bit draws. */
static void gen_row_i16(uint64_t rk, int16_t *r, uint32_t cols)
{
	uint32_t full = cols / 4, j;
	for (uint32_t k = 0; k < full; k++) {
		uint64_t z = draw4(rk, k);
		memcpy(r + 4 * (size_t)k, &z, 8);
	}
	j = full * 4;
	if (j < cols) {
		uint64_t z = draw4(rk, full);
		for (int i = 0; j < cols; i++, j++)
			r[j] = (int16_t)(uint16_t)(z >> (16 * i));
	}
}

/*
 * ggml's block_q8_0 of the values x = r * s (s = scale / 32768): per 32,
 * an f16 scale d = amax / 127 and 32 int8 round(x / d). With amax = m * s
 * (m = max |r|), x / d = r * 127 / m: the integers give amax directly.
 */
static void encode_q8_0(const int16_t *r, uint32_t n, float s, uint8_t *dst)
{
	for (uint32_t b = 0; b < n / 32; b++) {
		const int16_t *v = r + 32 * (size_t)b;
		uint8_t *o = dst + 34 * (size_t)b;
		int32_t m = 0;
		for (int j = 0; j < 32; j++) {
			int32_t a = v[j] < 0 ? -(int32_t)v[j] : v[j];
			m = a > m ? a : m;
		}
		uint16_t hd = baton_f32_to_f16((float)m * s / 127.0f);
		memcpy(o, &hd, 2);
		float k = m ? 127.0f / (float)m : 0.0f;
		int32_t q[32];
		for (int j = 0; j < 32; j++)
			q[j] = round_away((float)v[j] * k);
		for (int j = 0; j < 32; j++)
			o[2 + j] = (uint8_t)q[j];
	}
}

static int gen_tensor(const struct synth *sy, uint32_t layer, uint32_t expert, int t,
    const struct arena_file_part *part, uint8_t *dst, float *buf)
{
	uint64_t tkey = mix64(sy->p.seed ^
	    mix64(((uint64_t)layer << 32) | ((uint64_t)expert << 8) | (uint64_t)t));
	float scale = t == T_DOWN ? sy->s_down : t == T_NORM ? 0.1f : sy->s_in;
	float bias = t == T_NORM ? 1.0f : 0.0f;
	const uint16_t *tab = t == T_DOWN ? sy->tab_down : sy->tab_in;
	uint64_t rb = baton_dtype_row_bytes((int)part->dtype, part->cols);
	for (uint32_t r = 0; r < part->rows; r++) {
		uint64_t rk = mix64(tkey + r);
		uint8_t *o = dst + (uint64_t)r * rb;
		switch (part->dtype) {
		case BATON_DT_F32:
			gen_row_f32(rk, buf, part->cols, scale, bias);
			memcpy(o, buf, (size_t)part->cols * 4);
			break;
		case BATON_DT_F16:
		case BATON_DT_BF16:
			if (t >= T_ROUTER)
				return BATON_EUNSUPPORTED; /* router and norm are f32 */
			gen_row_tab(rk, o, part->cols, tab);
			break;
		case BATON_DT_Q8_0:
			if (t >= T_ROUTER)
				return BATON_EUNSUPPORTED;
			gen_row_i16(rk, (int16_t *)(void *)buf, part->cols);
			encode_q8_0((const int16_t *)(void *)buf, part->cols, scale * 0x1.0p-15f, o);
			break;
		default:
			return BATON_EUNSUPPORTED;
		}
	}
	return 0;
}

static int synth_fill(void *ctx, const struct arena_file_entry *e, uint8_t *dst,
    char *errbuf, size_t errlen)
{
	const struct synth *sy = ctx;
	uint32_t cols = sy->p.d_model > sy->p.d_ff ? sy->p.d_model : sy->p.d_ff;
	float *buf = malloc((size_t)cols * sizeof *buf);
	if (!buf)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	int rc = 0;
	if (e->role == BATON_ROLE_EXPERT) {
		for (int i = 0; i < 3 && !rc; i++)
			rc = gen_tensor(sy, e->layer, e->expert, T_GATE + i, &e->part[i],
			    dst + e->part[i].offset, buf);
	} else {
		rc = gen_tensor(sy, e->layer, 0, e->role == BATON_ROLE_ROUTER ? T_ROUTER : T_NORM,
		    &e->part[0], dst, buf);
	}
	free(buf);
	if (rc)
		return arena_errf(errbuf, errlen, rc, "synthetic: cannot encode dtype %s",
		    baton_dtype_name((int)e->part[0].dtype));
	return 0;
}

static uint16_t *make_table(uint32_t dtype, float scale)
{
	if (dtype != BATON_DT_F16 && dtype != BATON_DT_BF16)
		return NULL;
	uint16_t *tab = malloc(65536 * sizeof *tab);
	if (!tab)
		return NULL;
	float s = scale * 0x1.0p-15f;
	for (uint32_t r = 0; r < 65536; r++) {
		float v = draw_value(r, 0, s);
		tab[r] = dtype == BATON_DT_F16 ? baton_f32_to_f16(v) : baton_f32_to_bf16(v);
	}
	return tab;
}

int arena_plan_synthetic(const struct baton_synth_params *p, struct arena_plan *plan,
    char *errbuf, size_t errlen)
{
	memset(plan, 0, sizeof *plan);
	if (!p)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "no synthetic parameters");
	if (p->layers == 0 || p->layers > BATON_ARENA_MAX_LAYERS)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "layers %" PRIu32 " not in 1..%u",
		    p->layers, BATON_ARENA_MAX_LAYERS);
	if (p->experts == 0 || p->experts > BATON_ARENA_MAX_EXPERTS)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "experts %" PRIu32 " not in 1..%u",
		    p->experts, BATON_ARENA_MAX_EXPERTS);
	if (p->top_k == 0 || p->top_k > p->experts)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "top-k %" PRIu32 " not in 1..%" PRIu32,
		    p->top_k, p->experts);
	if (p->d_model == 0 || p->d_model >= ARENA_MAX_DIM || p->d_ff == 0 || p->d_ff >= ARENA_MAX_DIM)
		return arena_errf(errbuf, errlen, BATON_EINVAL,
		    "d_model %" PRIu32 " and d_ff %" PRIu32 " must be in 1..%u",
		    p->d_model, p->d_ff, ARENA_MAX_DIM - 1);
	if (p->dtype != BATON_DT_F32 && p->dtype != BATON_DT_F16 && p->dtype != BATON_DT_BF16 &&
	    p->dtype != BATON_DT_Q8_0)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "synthetic dtype must be f32, f16, bf16 or q8_0, not %s",
		    baton_dtype_name((int)p->dtype) ? baton_dtype_name((int)p->dtype) : "unknown");
	if (p->dtype == BATON_DT_Q8_0 && (p->d_model % 32 || p->d_ff % 32))
		return arena_errf(errbuf, errlen, BATON_EINVAL,
		    "q8_0 needs d_model and d_ff multiples of 32 (got %" PRIu32 ", %" PRIu32 ")",
		    p->d_model, p->d_ff);

	struct synth *sy = calloc(1, sizeof *sy);
	uint32_t *dt = calloc((size_t)p->layers * ARENA_DT_N, sizeof *dt);
	if (!sy || !dt) {
		free(sy);
		free(dt);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	sy->p = *p;
	sy->s_in = 1.0f / sqrtf((float)p->d_model);
	sy->s_down = 1.0f / sqrtf((float)p->d_ff);
	sy->tab_in = make_table(p->dtype, sy->s_in);
	sy->tab_down = make_table(p->dtype, sy->s_down);
	if ((p->dtype == BATON_DT_F16 || p->dtype == BATON_DT_BF16) && (!sy->tab_in || !sy->tab_down)) {
		free(sy->tab_in);
		free(sy->tab_down);
		free(sy);
		free(dt);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	for (uint32_t l = 0; l < p->layers; l++) {
		uint32_t *d = &dt[(size_t)l * ARENA_DT_N];
		d[ARENA_DT_GATE] = d[ARENA_DT_UP] = d[ARENA_DT_DOWN] = p->dtype;
		d[ARENA_DT_ROUTER] = d[ARENA_DT_NORM] = BATON_DT_F32;
	}
	plan->shape = (struct baton_arena_shape){
		.layers = p->layers, .experts = p->experts, .top_k = p->top_k,
		.d_model = p->d_model, .d_ff = p->d_ff,
	};
	plan->flags = ARENA_F_ROUTER | ARENA_F_NORM;
	plan->layer_dt = dt;
	plan->source_kind = ARENA_SRC_SYNTHETIC;
	const uint64_t id[] = { SYNTH_ALGO, p->layers, p->experts, p->top_k, p->d_model,
		p->d_ff, p->dtype, p->seed };
	plan->source_hash = arena_hash(id, sizeof id);
	snprintf(plan->source, sizeof plan->source, "synthetic seed=%" PRIu64 " dtype=%s",
	    p->seed, baton_dtype_name((int)p->dtype));
	plan->fill = synth_fill;
	plan->ctx = sy;
	return 0;
}

void arena_synthetic_free(struct arena_plan *plan)
{
	struct synth *sy = plan->ctx;
	if (sy) {
		free(sy->tab_in);
		free(sy->tab_down);
	}
	free(sy);
	free(plan->layer_dt);
	memset(plan, 0, sizeof *plan);
}
