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
 * q4_K and q6_K blocks (for benchmarks of llama.cpp's K-quant shapes) are
 * random valid blocks, not a quantization of those values: their quants
 * and sub-block scales are draws, the super-block scale d is fixed so that
 * every value lies within about [-s, s] (see gen_row_kquant).
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
	char arch[ARENA_ARCH_LEN]; /* p.arch points here (the caller's may go) */
};

static uint16_t *make_table(uint32_t dtype, float scale);

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


/*
 * One row of random, valid K-quant blocks (ggml's block_q4_K: f16 d, f16
 * dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; block_q6_K:
 * 128 bytes low nibbles, 64 bytes high bits, 16 int8 scales, f16 d). Every
 * byte is a draw except d (and dmin), chosen so |value| <= about s:
 * q4_K: d * sc * q - dmin * m with sc, m <= 63, q <= 15;
 * q6_K: d * scale * (q - 32) with |scale| <= 128, |q - 32| <= 32.
 */
static void gen_row_kquant(uint64_t rk, int dtype, uint32_t cols, float s, uint8_t *dst)
{
	uint32_t nb = cols / 256, bb = dtype == BATON_DT_Q4_K ? 144 : 210;
	uint64_t k = 0;
	for (uint32_t b = 0; b < nb; b++) {
		uint8_t *o = dst + (size_t)b * bb;
		for (uint32_t i = 0; i < bb; i += 8) {
			uint64_t z = draw4(rk, k++);
			memcpy(o + i, &z, bb - i < 8 ? bb - i : 8);
		}
		if (dtype == BATON_DT_Q4_K) {
			uint16_t d = baton_f32_to_f16(s / (63.0f * 15.0f));
			uint16_t dmin = baton_f32_to_f16(s / (2.0f * 63.0f));
			memcpy(o, &d, 2);
			memcpy(o + 2, &dmin, 2);
		} else {
			uint16_t d = baton_f32_to_f16(s / (128.0f * 32.0f));
			memcpy(o + 208, &d, 2);
		}
	}
}

/* One row of cols random values into o in dtype: f32 as scale * r + bias,
 * f16 and bf16 through tab, q8_0 and the K-quants encoded at scale (buf:
 * cols floats of room). */
static int gen_row(int dtype, uint64_t rk, uint8_t *o, uint32_t cols, float scale, float bias,
    const uint16_t *tab, float *buf)
{
	switch (dtype) {
	case BATON_DT_F32:
		gen_row_f32(rk, buf, cols, scale, bias);
		memcpy(o, buf, (size_t)cols * 4);
		return 0;
	case BATON_DT_F16:
	case BATON_DT_BF16:
		gen_row_tab(rk, o, cols, tab);
		return 0;
	case BATON_DT_Q8_0:
		gen_row_i16(rk, (int16_t *)(void *)buf, cols);
		encode_q8_0((const int16_t *)(void *)buf, cols, scale * 0x1.0p-15f, o);
		return 0;
	case BATON_DT_Q4_K:
	case BATON_DT_Q6_K:
		gen_row_kquant(rk, dtype, cols, scale, o);
		return 0;
	default:
		return BATON_EUNSUPPORTED;
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
	if (t >= T_ROUTER && part->dtype != BATON_DT_F32)
		return BATON_EUNSUPPORTED; /* router and norm are f32 */
	uint64_t rb = baton_dtype_row_bytes((int)part->dtype, part->cols);
	int rc = 0;
	for (uint32_t r = 0; r < part->rows && !rc; r++)
		rc = gen_row((int)part->dtype, mix64(tkey + r), dst + (uint64_t)r * rb, part->cols, scale, bias, tab, buf);
	return rc;
}

/* A dense tensor of a full synthetic model: keyed by its name, scaled by
 * its kind (weights 1/sqrt(cols), norms 1 + 0.1 r, biases 0.02 r). */
static int gen_dense(const struct synth *sy, const struct arena_named *n,
    const struct arena_file_part *part, uint8_t *dst, float *buf)
{
	uint64_t tkey = mix64(sy->p.seed ^ arena_hash(n->name, strlen(n->name)));
	int kind = (int)n->aux;
	float scale = kind == ARENA_MT_NORM ? 0.1f : kind == ARENA_MT_BIAS ? 0.02f
	    : 1.0f / sqrtf((float)part->cols);
	float bias = kind == ARENA_MT_NORM ? 1.0f : 0.0f;
	uint64_t rb = baton_dtype_row_bytes((int)part->dtype, part->cols);
	uint16_t *tab = NULL;
	if (part->dtype == BATON_DT_F16 || part->dtype == BATON_DT_BF16) {
		if (bias != 0.0f || !(tab = make_table(part->dtype, scale)))
			return BATON_EUNSUPPORTED;
	}
	int rc = 0;
	for (uint32_t r = 0; r < part->rows && !rc; r++)
		rc = gen_row((int)part->dtype, mix64(tkey + r), dst + (uint64_t)r * rb, part->cols, scale, bias, tab, buf);
	free(tab);
	return rc;
}

static int synth_fill(void *ctx, const struct arena_file_entry *e, const struct arena_named *n,
    uint8_t *dst, char *errbuf, size_t errlen)
{
	const struct synth *sy = ctx;
	uint32_t cols = e->role == BATON_ROLE_EXPERT ? (sy->p.d_model > sy->p.d_ff ? sy->p.d_model : sy->p.d_ff)
	    : e->part[0].cols;
	float *buf = malloc((size_t)cols * sizeof *buf);
	if (!buf)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	int rc = 0;
	if (e->role == BATON_ROLE_EXPERT) {
		for (int i = 0; i < 3 && !rc; i++)
			rc = gen_tensor(sy, e->layer, e->expert, T_GATE + i, &e->part[i],
			    dst + e->part[i].offset, buf);
	} else if (!sy->p.arch || !sy->p.arch[0]) {
		/* the experts-only model: its values as they always were */
		rc = gen_tensor(sy, e->layer, 0, e->role == BATON_ROLE_ROUTER ? T_ROUTER : T_NORM,
		    &e->part[0], dst, buf);
	} else {
		rc = gen_dense(sy, n, &e->part[0], dst, buf);
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

/* A full model of a named architecture: every dense tensor the
 * architecture has (weights in the synthetic dtype, norms, biases and
 * routers f32) and a config.json. */
static int plan_full(struct synth *sy, const struct baton_synth_params *p, struct arena_plan *plan,
    char *errbuf, size_t errlen)
{
	struct arena_model_cfg c = { 0 };
	if (!arena_arch_known(p->arch))
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "synthetic architecture \"%.64s\" is not one of qwen3_moe, qwen2_moe, mixtral, olmoe",
		    p->arch);
	snprintf(c.arch, sizeof c.arch, "%s", p->arch);
	snprintf(sy->arch, sizeof sy->arch, "%s", p->arch);
	sy->p.arch = sy->arch;
	c.layers = p->layers;
	c.experts = p->experts;
	c.top_k = p->top_k;
	c.hidden = p->d_model;
	c.moe_ff = p->d_ff;
	c.head_dim = p->head_dim ? p->head_dim : p->d_model % 128 == 0 && p->d_model >= 1024 ? 128
	    : p->d_model % 64 == 0 && p->d_model >= 256 ? 64 : 16;
	c.heads = p->heads ? p->heads : p->d_model / c.head_dim;
	c.kv_heads = p->kv_heads ? p->kv_heads : c.heads % 4 == 0 ? c.heads / 4 : c.heads;
	c.vocab = p->vocab ? p->vocab : 32000;
	c.shared_ff = strcmp(p->arch, "qwen2_moe") == 0 ? (p->shared_ff ? p->shared_ff : 4 * p->d_ff) : 0;
	c.dense_ff = 0;
	c.max_pos = 32768;
	c.norm_topk = -1;
	c.qkv_bias = strcmp(p->arch, "qwen2_moe") == 0;
	c.rms_eps = 1e-6;
	c.rope_theta = strncmp(p->arch, "qwen", 4) == 0 ? 1000000.0 : 10000.0;
	c.bos = 1;
	c.eos = 2;
	if (c.heads == 0 || c.head_dim == 0 || c.head_dim % 2 || c.kv_heads == 0 ||
	    c.heads % c.kv_heads || (uint64_t)c.heads * c.head_dim >= ARENA_MAX_DIM ||
	    c.vocab > ARENA_MAX_DENSE_ROWS || c.shared_ff >= ARENA_MAX_DIM)
		return arena_errf(errbuf, errlen, BATON_EINVAL,
		    "synthetic %s: %" PRIu32 " heads of %" PRIu32 ", %" PRIu32 " key/value heads, "
		    "vocabulary %" PRIu32 " do not make a model", p->arch, c.heads, c.head_dim,
		    c.kv_heads, c.vocab);
	struct arena_model_tensor *mt;
	uint64_t nt;
	int rc = arena_model_tensors(&c, &mt, &nt, errbuf, errlen);
	if (rc)
		return rc;
	for (uint64_t i = 0; i < nt && !rc; i++) {
		struct arena_named *n = arena_plan_add(plan, mt[i].role, mt[i].name);
		if (!n) {
			rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
			break;
		}
		n->layer = mt[i].layer;
		n->rows = mt[i].rows;
		n->cols = mt[i].cols;
		n->aux = (uint64_t)mt[i].kind;
		int small = mt[i].kind == ARENA_MT_NORM || mt[i].kind == ARENA_MT_BIAS ||
		    mt[i].role == BATON_ROLE_ROUTER || mt[i].rows == 1;
		n->dtype = small ? BATON_DT_F32 : p->dtype;
		if (n->cols % arena_dtype_block((int)n->dtype))
			rc = arena_errf(errbuf, errlen, BATON_EINVAL,
			    "synthetic %s: %s has %" PRIu32 " columns, not a multiple of %" PRIu32,
			    baton_dtype_name((int)n->dtype), n->name, n->cols,
			    arena_dtype_block((int)n->dtype));
	}
	free(mt);
	if (rc)
		return rc;
	uint64_t len = 0;
	char *cfg = arena_model_config_json(&c, &len);
	if (!cfg)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	uint64_t chash = arena_hash(cfg, len);
	if ((rc = arena_plan_add_blob(plan, "config.json", cfg, len, errbuf, errlen)))
		return rc;
	if (p->tokenizer && (rc = arena_plan_add_tokenizer(plan, p->tokenizer, &chash, errbuf, errlen)))
		return rc;
	snprintf(plan->arch, sizeof plan->arch, "%s", p->arch);
	const uint64_t id[] = { SYNTH_ALGO, p->layers, p->experts, p->top_k, p->d_model,
		p->d_ff, p->dtype, p->seed, chash };
	plan->source_hash = arena_hash(id, sizeof id);
	snprintf(plan->source, sizeof plan->source, "synthetic %s seed=%" PRIu64 " dtype=%s",
	    p->arch, p->seed, baton_dtype_name((int)p->dtype));
	return 0;
}

int arena_synth_preset(const char *name, struct baton_synth_params *p)
{
	static const struct {
		const char *name, *arch;
		uint32_t layers, experts, top_k, d_model, d_ff, heads, kv_heads, head_dim, vocab, shared;
	} presets[] = {
		{ "qwen3-30b-a3b", "qwen3_moe", 48, 128, 8, 2048, 768, 32, 4, 128, 151936, 0 },
		{ "qwen3-235b-a22b", "qwen3_moe", 94, 128, 8, 4096, 1536, 64, 4, 128, 151936, 0 },
		{ "qwen1.5-moe-a2.7b", "qwen2_moe", 24, 60, 4, 2048, 1408, 16, 16, 128, 151936, 5632 },
		{ "mixtral-8x7b", "mixtral", 32, 8, 2, 4096, 14336, 32, 8, 128, 32000, 0 },
		{ "olmoe-1b-7b", "olmoe", 16, 64, 8, 2048, 1024, 16, 16, 128, 50304, 0 },
	};
	for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
		if (name && strcmp(name, presets[i].name) == 0) {
			p->arch = presets[i].arch;
			p->layers = presets[i].layers;
			p->experts = presets[i].experts;
			p->top_k = presets[i].top_k;
			p->d_model = presets[i].d_model;
			p->d_ff = presets[i].d_ff;
			p->heads = presets[i].heads;
			p->kv_heads = presets[i].kv_heads;
			p->head_dim = presets[i].head_dim;
			p->vocab = presets[i].vocab;
			p->shared_ff = presets[i].shared;
			return 0;
		}
	return BATON_ENOTFOUND;
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
	    p->dtype != BATON_DT_Q8_0 && p->dtype != BATON_DT_Q4_K && p->dtype != BATON_DT_Q6_K)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "synthetic dtype must be f32, f16, bf16, q8_0, q4_K or q6_K, not %s",
		    baton_dtype_name((int)p->dtype) ? baton_dtype_name((int)p->dtype) : "unknown");
	uint32_t blk = arena_dtype_block((int)p->dtype);
	if (p->d_model % blk || p->d_ff % blk)
		return arena_errf(errbuf, errlen, BATON_EINVAL,
		    "%s needs d_model and d_ff multiples of %" PRIu32 " (got %" PRIu32 ", %" PRIu32 ")",
		    baton_dtype_name((int)p->dtype), blk,
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
	plan->fill = synth_fill;
	plan->ctx = sy;
	sy->p.arch = NULL;
	int rc;
	if (p->arch && p->arch[0]) {
		if ((rc = plan_full(sy, p, plan, errbuf, errlen)))
			goto fail;
		return 0;
	}
	const uint64_t id[] = { SYNTH_ALGO, p->layers, p->experts, p->top_k, p->d_model,
		p->d_ff, p->dtype, p->seed };
	plan->source_hash = arena_hash(id, sizeof id);
	snprintf(plan->source, sizeof plan->source, "synthetic seed=%" PRIu64 " dtype=%s",
	    p->seed, baton_dtype_name((int)p->dtype));
	for (uint32_t l = 0; l < p->layers; l++)
		for (int r = 0; r < 2; r++) {
			char name[96];
			snprintf(name, sizeof name, r ? "model.layers.%" PRIu32 ".post_attention_layernorm.weight"
			    : "model.layers.%" PRIu32 ".mlp.gate.weight", l);
			struct arena_named *n = arena_plan_add(plan, r ? BATON_ROLE_NORM : BATON_ROLE_ROUTER, name);
			if (!n) {
				rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
				goto fail;
			}
			n->layer = l;
			n->dtype = BATON_DT_F32;
			n->rows = r ? 1 : p->experts;
			n->cols = p->d_model;
		}
	return 0;
fail:
	arena_plan_free_named(plan);
	arena_synthetic_free(plan);
	return rc;
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
