/*
 * moe_test.c: the host backend's dtype kernels and MoE compute against an
 * independent double-precision reference.
 *
 * The reference decodes the weights with its own decoders (written from
 * the formats, not from dtype.c) and computes in double. Every supported
 * dtype dequantizes exactly to f32, so host and reference see the same
 * weights and the difference is only f32 accumulation (plus expf/sqrtf
 * rounding). Hence tight tolerances, the same for every dtype:
 *
 *   error measured                                    tolerance  measured max
 *   layer output delta  ||got - ref||inf / ||ref||inf   2e-6       8e-7
 *   routing weights     max |got - ref|                 1e-6       2e-7
 *   normed input xn     ||got - ref||inf / ||ref||inf   1e-6       2e-7
 *
 * the same for f32, f16, bf16, q8_0 and mixed layers (per dtype the worst
 * output error is 3e-7 to 5e-7; the mixed q8_0/f32/f16 layer 8e-7). The
 * values are printed by each t_moe_* case. The K-quants (q4_K, q5_K, q6_K)
 * decode to ggml's values, which kquant_test.c checks against ggml itself;
 * here their decoder is the reference's too, and the tolerances the same.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/host/host.h"
#include "proto/proto.h"
#include "tests/ref_math.h"
#include "tests/t.h"

#define TOL_OUT 2e-6
#define TOL_W 1e-6
#define TOL_XN 1e-6

/* ---- random numbers (splitmix64) ---------------------------------------- */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double urand(void) /* [0, 1) */
{
	return (double)(rnd() >> 11) * 0x1p-53;
}

static float uniform(double a) /* [-a, a) */
{
	return (float)((2 * urand() - 1) * a);
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static float bitsf(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* ---- the reference decoders are tests/ref_math.h's ------------------------ */

static uint16_t rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static size_t ref_row_bytes(int dt, uint32_t cols)
{
	switch (dt) {
	case BATON_DT_F32: return (size_t)cols * 4;
	case BATON_DT_F16:
	case BATON_DT_BF16: return (size_t)cols * 2;
	case BATON_DT_Q8_0: return (size_t)cols / 32 * 34;
	case BATON_DT_Q4_K: return (size_t)cols / 256 * 144;
	case BATON_DT_Q5_K: return (size_t)cols / 256 * 176;
	case BATON_DT_Q6_K: return (size_t)cols / 256 * 210;
	default: return 0;
	}
}

static void ref_dequant(int dt, const uint8_t *row, double *out, uint32_t cols)
{
	if (baton_kquant_is(dt)) {
		/* The K-quants' values are ggml's; kquant_test.c checks this
		 * decoder against ggml's own, so here it is the reference. */
		size_t bb = ref_row_bytes(dt, 256);
		for (uint32_t b = 0; b < cols / 256; b++) {
			float v[256];
			baton_kquant_decode_block(dt, row + b * bb, v);
			for (int i = 0; i < 256; i++)
				out[256 * b + i] = v[i];
		}
		return;
	}
	for (uint32_t i = 0; i < cols; i++) {
		switch (dt) {
		case BATON_DT_F32: {
			uint32_t u = (uint32_t)row[4 * i] | (uint32_t)row[4 * i + 1] << 8 |
			    (uint32_t)row[4 * i + 2] << 16 | (uint32_t)row[4 * i + 3] << 24;
			out[i] = bitsf(u);
			break;
		}
		case BATON_DT_F16: out[i] = ref_f16(rd16(row + 2 * i)); break;
		case BATON_DT_BF16: out[i] = ref_bf16(rd16(row + 2 * i)); break;
		case BATON_DT_Q8_0: {
			const uint8_t *blk = row + (i / 32) * 34;
			out[i] = ref_f16(rd16(blk)) * (double)(int8_t)blk[2 + i % 32];
			break;
		}
		default: T_FAIL("ref_dequant: dtype %d", dt);
		}
	}
}

/* Random row of `cols` values of magnitude up to `a`, encoded in dt. */
static void gen_row(int dt, uint8_t *row, uint32_t cols, double a)
{
	for (uint32_t i = 0; i < cols; i++) {
		if (dt == BATON_DT_F32) {
			float f = uniform(a);
			memcpy(row + 4 * i, &f, 4);
		} else if (dt == BATON_DT_F16 || dt == BATON_DT_BF16) {
			float f = uniform(a);
			uint16_t h = dt == BATON_DT_F16 ? baton_f32_to_f16(f) : baton_f32_to_bf16(f);
			memcpy(row + 2 * i, &h, 2);
		} else if (baton_kquant_is(dt)) {
			if (i % 256)
				continue;
			/* Random quants and scales, and f16 super-scales d that
			 * give the values the spread of uniform(a) (rms a / sqrt 3:
			 * the expert's output scales with the cube of the weights,
			 * and the error of x += out is relative to x). For q4_K /
			 * q5_K each sub-block's min equals its scale and dmin =
			 * d * 7.5 (15.5), which centres the values on zero as
			 * quantised weights are: d * sc * (q - 7.5), rms
			 * d * 42 * 4.61 (q5_K: d * 42 * 9.23), so d = a / 335
			 * (a / 671); q6_K: rms d * 73.9 * 18.5, d = a / 2368. */
			size_t bb = ref_row_bytes(dt, 256);
			uint8_t *blk = row + (i / 256) * bb;
			for (size_t k = 0; k < bb; k++)
				blk[k] = (uint8_t)rnd();
			if (dt == BATON_DT_Q6_K) {
				uint16_t d = baton_f32_to_f16((float)(a / 2368 * (0.8 + 0.4 * urand())));
				memcpy(blk + 208, &d, 2);
			} else {
				float half = dt == BATON_DT_Q4_K ? 7.5f : 15.5f;
				float df = (float)(a / (half < 8 ? 335 : 671) * (0.8 + 0.4 * urand()));
				uint16_t d = baton_f32_to_f16(df);
				uint16_t m = baton_f32_to_f16(df * half);
				uint8_t *sc = blk + 4;
				memcpy(blk, &d, 2);
				memcpy(blk + 2, &m, 2);
				for (int j = 0; j < 8; j++) { /* ggml's 6-bit packing, min = scale */
					uint8_t v = (uint8_t)(16 + rnd() % 48);
					if (j < 4) {
						sc[j] = v, sc[j + 4] = v;
					} else {
						sc[j + 4] = (uint8_t)((v & 0xF) | ((v & 0xF) << 4));
						sc[j - 4] = (uint8_t)((sc[j - 4] & 63) | ((v >> 4) << 6));
						sc[j] = (uint8_t)((sc[j] & 63) | ((v >> 4) << 6));
					}
				}
			}
		} else if (i % 32 == 0) { /* q8_0: one block at a time */
			uint8_t *blk = row + (i / 32) * 34;
			uint16_t d = baton_f32_to_f16((float)(a / 127 * (0.5 + urand())));
			memcpy(blk, &d, 2);
			for (int k = 0; k < 32; k++)
				blk[2 + k] = (uint8_t)(int8_t)((int)(rnd() % 255) - 127);
		}
	}
}

static const char *dt_name(int dt)
{
	switch (dt) {
	case BATON_DT_F32: return "f32";
	case BATON_DT_F16: return "f16";
	case BATON_DT_BF16: return "bf16";
	case BATON_DT_Q8_0: return "q8_0";
	case BATON_DT_Q4_K: return "q4_K";
	case BATON_DT_Q5_K: return "q5_K";
	case BATON_DT_Q6_K: return "q6_K";
	default: return "?";
	}
}

/* ---- f16 / bf16 rows (the codec: arena/dtype_test.c) -------------------- */

static void t_f16_exhaustive(void)
{
	/* The row decoder (four at a time) gives the same bits, at any offset. */
	uint16_t *all = malloc(65536 * 2 + 2);
	float *dec = malloc(65536 * sizeof(float));
	for (int off = 0; off < 2; off++) {
		for (uint32_t h = 0; h < 65536; h++)
			memcpy((uint8_t *)all + off + 2 * h, &(uint16_t){ (uint16_t)h }, 2);
		T_OK(baton_dequant_row(BATON_DT_F16, (uint8_t *)all + off, dec, 65536));
		for (uint32_t h = 0; h < 65536; h++)
			T_ASSERT_MSG(fbits(dec[h]) == fbits(baton_f16_to_f32((uint16_t)h)),
			    "f16 row decode of %04x: %08x", h, fbits(dec[h]));
	}
	free(all);
	free(dec);

	/* Every finite f16 (zeros, subnormals, the largest) in a shuffled row:
	 * the dot takes the rare paths of the decoders and still keeps the
	 * contract's bits, with either kernel set. */
	uint32_t n = 0;
	uint16_t *row = malloc(65536 * 2);
	float *w = malloc(65536 * sizeof(float)), *x = malloc(65536 * sizeof(float));
	for (uint32_t h = 0; h < 65536; h++)
		if ((h & 0x7c00) != 0x7c00)
			row[n++] = (uint16_t)h;
	for (uint32_t i = n - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1));
		uint16_t t = row[i];
		row[i] = row[j], row[j] = t;
	}
	for (uint32_t i = 0; i < n; i++) {
		w[i] = baton_f16_to_f32(row[i]);
		x[i] = uniform(1.0);
	}
	for (int k = 0; k < 2; k++) {
		if (baton_kernels_avx2(k) != k)
			break;
		for (uint32_t len = n - 40; len <= n; len += 13) {
			float got, want = canon_dot(w, x, len);
			T_OK(baton_dot_row(BATON_DT_F16, row, x, len, &got));
			T_ASSERT_MSG(fbits(got) == fbits(want), "avx2 %d, %u all-f16 row: %a, want %a",
			    k, len, got, want);
		}
	}
	free(row);
	free(w);
	free(x);
}

static void t_bf16_exhaustive(void)
{
	uint16_t *all = malloc(65536 * 2);
	float *dec = malloc(65536 * sizeof(float));
	for (uint32_t h = 0; h < 65536; h++)
		all[h] = (uint16_t)h;
	T_OK(baton_dequant_row(BATON_DT_BF16, all, dec, 65536));
	for (uint32_t h = 0; h < 65536; h++)
		T_ASSERT_MSG(fbits(dec[h]) == h << 16, "bf16 row decode of %04x", h);
	free(all);
	free(dec);
}


/* ---- dequant and dot ----------------------------------------------------- */

static void t_q8_0_dequant(void)
{
	uint32_t cols = 32 * 37;
	uint8_t *buf = malloc(ref_row_bytes(BATON_DT_Q8_0, cols) + 1);
	float *got = malloc(cols * sizeof(float));
	double *want = malloc(cols * sizeof(double));

	for (int align = 0; align < 2; align++) {
		uint8_t *row = buf + align; /* also at an odd address */
		gen_row(BATON_DT_Q8_0, row, cols, 3.0);
		/* Some special scales: negative, subnormal, zero, large. */
		uint16_t ds[] = { 0xbc00, 0x0001, 0x0000, 0x7bff, 0x8200 };
		for (int k = 0; k < 5; k++)
			memcpy(row + 34 * (k * 7), &ds[k], 2);
		T_OK(baton_dequant_row(BATON_DT_Q8_0, row, got, cols));
		ref_dequant(BATON_DT_Q8_0, row, want, cols);
		for (uint32_t i = 0; i < cols; i++)
			T_ASSERT_MSG((double)got[i] == want[i], "q8_0[%u]: %a want %a", i, got[i], want[i]);
	}
	/* One block by hand: d = 0.5, qs = -127, 0, 1, 127, ... */
	uint8_t blk[34] = { 0x00, 0x38 };
	blk[2] = (uint8_t)-127, blk[3] = 0, blk[4] = 1, blk[5] = 127;
	T_OK(baton_dequant_row(BATON_DT_Q8_0, blk, got, 32));
	T_ASSERT(got[0] == -63.5f && got[1] == 0.0f && got[2] == 0.5f && got[3] == 63.5f);
	free(buf);
	free(got);
	free(want);
}

static const int all_dtypes[] = { BATON_DT_F32, BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0 };

static void t_dequant_and_dot(void)
{
	const uint32_t cols_any[] = { 1, 7, 31, 32, 33, 100, 255, 256, 257, 1000, 2816 };
	const uint32_t cols_q8[] = { 32, 96, 224, 256, 288, 1024, 2816 };
	enum { NX = 11 };

	for (size_t kd = 0; kd < 8; kd++) {
		int dt = all_dtypes[kd % 4];
		if (kd == 0 || kd == 4) {
			/* The baseline kernels, then AVX2 + F16C where the CPU has them. */
			if (baton_kernels_avx2(kd == 4) != (kd == 4)) {
				printf("    no AVX2/F16C on this CPU: baseline kernels only\n");
				break;
			}
		}
		const uint32_t *cl = dt == BATON_DT_Q8_0 ? cols_q8 : cols_any;
		size_t ncl = dt == BATON_DT_Q8_0 ? 7 : 11;
		for (size_t c = 0; c < ncl; c++) {
			uint32_t cols = cl[c];
			size_t rb = ref_row_bytes(dt, cols);
			uint8_t *buf = malloc(rb + 2);
			float *w = malloc(cols * sizeof(float));
			double *wd = malloc(cols * sizeof(double));
			float *xv[NX];
			float got[NX], one;

			for (int v = 0; v < NX; v++) {
				xv[v] = malloc(cols * sizeof(float));
				for (uint32_t i = 0; i < cols; i++)
					xv[v][i] = uniform(1.0);
			}
			for (int align = 0; align < 3; align += 2) {
				uint8_t *row = buf + align; /* f32 rows at a 2-byte offset too */
				gen_row(dt, row, cols, 1.0);
				ref_dequant(dt, row, wd, cols);
				T_OK(baton_dequant_row(dt, row, w, cols));
				for (uint32_t i = 0; i < cols; i++)
					T_ASSERT_MSG((double)w[i] == wd[i], "%s dequant [%u]", dt_name(dt), i);
				T_OK(baton_dot_rows(dt, row, cols, (const float *const *)xv, NX, got));
				for (int v = 0; v < NX; v++) {
					double ref = 0, mag = 0;
					for (uint32_t i = 0; i < cols; i++) {
						ref += wd[i] * xv[v][i];
						mag += fabs(wd[i] * xv[v][i]);
					}
					float canon = canon_dot(w, xv[v], cols);
					T_OK(baton_dot_row(dt, row, xv[v], cols, &one));
					T_ASSERT_MSG(fbits(one) == fbits(canon), "%s cols %u: dot %a, contract order %a",
					    dt_name(dt), cols, one, canon);
					T_ASSERT_MSG(fbits(one) == fbits(got[v]), "%s cols %u: dot_rows differs",
					    dt_name(dt), cols);
					T_ASSERT_MSG(fabs(one - ref) <= 1e-6 * mag, "%s cols %u: %g vs %g",
					    dt_name(dt), cols, one, ref);
				}
			}
			for (int v = 0; v < NX; v++)
				free(xv[v]);
			free(buf);
			free(w);
			free(wd);
		}
	}
}

/* ---- MoE layers ---------------------------------------------------------- */

struct layer_spec {
	int gate_dt, up_dt, down_dt, router_dt, norm_dt; /* norm_dt -1: no norm */
	uint32_t batch, d_model, d_ff, n_experts, top_k;
};

struct tlayer {
	struct layer_spec s;
	struct baton_moe_layer l;
	float *x, *xn;
	uint8_t *norm, *router;
	uint8_t **blob;
	uint64_t gate_off, up_off, down_off, blob_bytes;
};

static uint64_t up64(uint64_t n)
{
	return (n + 63) & ~(uint64_t)63;
}

static void *xalloc(size_t n)
{
	void *p = NULL;
	T_ASSERT(posix_memalign(&p, 64, n ? n : 1) == 0);
	return p;
}

static void gen_token(struct tlayer *L, uint32_t t)
{
	double mag = pow(10, 2 * urand() - 1); /* the norm must not care */
	for (uint32_t i = 0; i < L->s.d_model; i++)
		L->x[(size_t)t * L->s.d_model + i] = uniform(mag);
}

static void tlayer_make(struct tlayer *L, const struct layer_spec *s)
{
	const uint32_t D = s->d_model, F = s->d_ff, E = s->n_experts;

	memset(L, 0, sizeof *L);
	L->s = *s;
	L->x = xalloc((size_t)s->batch * D * sizeof(float));
	L->xn = xalloc((size_t)s->batch * D * sizeof(float));
	for (uint32_t t = 0; t < s->batch; t++)
		gen_token(L, t);
	if (s->norm_dt >= 0) {
		L->norm = xalloc(ref_row_bytes(s->norm_dt, D));
		/* norm weights in [0.5, 1.5]: gen in [-0.5, 0.5] and shift */
		for (uint32_t i = 0; i < D; i++) {
			float f = 1.0f + uniform(0.5);
			if (s->norm_dt == BATON_DT_F32)
				memcpy(L->norm + 4 * i, &f, 4);
			else {
				uint16_t h = s->norm_dt == BATON_DT_F16 ? baton_f32_to_f16(f) : baton_f32_to_bf16(f);
				memcpy(L->norm + 2 * i, &h, 2);
			}
		}
	}
	size_t rrb = ref_row_bytes(s->router_dt, D);
	L->router = xalloc(rrb * E);
	for (uint32_t e = 0; e < E; e++)
		gen_row(s->router_dt, L->router + e * rrb, D, 2 * sqrt(3.0 / D));
	size_t grb = ref_row_bytes(s->gate_dt, D), urb = ref_row_bytes(s->up_dt, D);
	size_t drb = ref_row_bytes(s->down_dt, F);
	L->gate_off = 0;
	L->up_off = up64(grb * F);
	L->down_off = L->up_off + up64(urb * F);
	L->blob_bytes = L->down_off + drb * D;
	L->blob = calloc(E, sizeof *L->blob);
	for (uint32_t e = 0; e < E; e++) {
		uint8_t *b = L->blob[e] = xalloc(L->blob_bytes);
		for (uint32_t j = 0; j < F; j++) {
			gen_row(s->gate_dt, b + L->gate_off + j * grb, D, sqrt(3.0 / D));
			gen_row(s->up_dt, b + L->up_off + j * urb, D, sqrt(3.0 / D));
		}
		for (uint32_t i = 0; i < D; i++)
			gen_row(s->down_dt, b + L->down_off + i * drb, F, sqrt(3.0 / F));
	}
	L->l = (struct baton_moe_layer){
		.batch = s->batch, .d_model = D, .d_ff = F, .n_experts = E, .top_k = s->top_k,
		.x = (uintptr_t)L->x, .xn = (uintptr_t)L->xn,
		.norm = (uintptr_t)L->norm, .norm_dtype = s->norm_dt >= 0 ? (uint32_t)s->norm_dt : 0,
		.router = (uintptr_t)L->router, .router_dtype = (uint32_t)s->router_dt,
		.gate_dtype = (uint32_t)s->gate_dt, .up_dtype = (uint32_t)s->up_dt,
		.down_dtype = (uint32_t)s->down_dt,
		.gate_off = L->gate_off, .up_off = L->up_off, .down_off = L->down_off,
	};
}

static void tlayer_free(struct tlayer *L)
{
	for (uint32_t e = 0; e < L->s.n_experts; e++)
		free(L->blob[e]);
	free(L->blob);
	free(L->x);
	free(L->xn);
	free(L->norm);
	free(L->router);
}

/* The double reference of one token's route: xn, ids, weights; returns
 * the smallest gap between consecutive logits among the top_k + 1 best. */
static double ref_route(const struct tlayer *L, uint32_t t, double *xn, uint32_t *ids, double *w)
{
	const uint32_t D = L->s.d_model, E = L->s.n_experts, K = L->s.top_k;
	const float *x = L->x + (size_t)t * D;
	double *nw = malloc(D * sizeof(double)), *row = malloc(D * sizeof(double));
	double *logit = malloc(E * sizeof(double));
	char *taken = calloc(E, 1);
	double ss = 0, gap = INFINITY;

	if (L->norm)
		ref_dequant(L->s.norm_dt, L->norm, nw, D);
	for (uint32_t i = 0; i < D; i++)
		ss += (double)x[i] * x[i];
	double s = 1 / sqrt(ss / D + 1e-6);
	for (uint32_t i = 0; i < D; i++)
		xn[i] = x[i] * s * (L->norm ? nw[i] : 1.0);
	size_t rrb = ref_row_bytes(L->s.router_dt, D);
	for (uint32_t e = 0; e < E; e++) {
		ref_dequant(L->s.router_dt, L->router + e * rrb, row, D);
		logit[e] = 0;
		for (uint32_t i = 0; i < D; i++)
			logit[e] += row[i] * xn[i];
	}
	double prev = 0;
	for (uint32_t r = 0; r < K + 1 && r < E; r++) {
		uint32_t best = UINT32_MAX;
		for (uint32_t e = 0; e < E; e++)
			if (!taken[e] && (best == UINT32_MAX || logit[e] > logit[best]))
				best = e;
		taken[best] = 1;
		if (r > 0 && prev - logit[best] < gap)
			gap = prev - logit[best];
		prev = logit[best];
		if (r < K)
			ids[r] = best;
	}
	double sum = 0;
	for (uint32_t k = 0; k < K; k++)
		sum += w[k] = exp(logit[ids[k]] - logit[ids[0]]);
	for (uint32_t k = 0; k < K; k++)
		w[k] /= sum;
	free(nw);
	free(row);
	free(logit);
	free(taken);
	return gap;
}

/* delta[i] += w * expert(xn)[i], in double. */
static void ref_expert(const struct tlayer *L, uint32_t e, const double *xn, double w, double *delta)
{
	const uint32_t D = L->s.d_model, F = L->s.d_ff;
	const uint8_t *b = L->blob[e];
	size_t grb = ref_row_bytes(L->s.gate_dt, D), urb = ref_row_bytes(L->s.up_dt, D);
	size_t drb = ref_row_bytes(L->s.down_dt, F);
	double *row = malloc((D > F ? D : F) * sizeof(double)), *h = malloc(F * sizeof(double));

	for (uint32_t j = 0; j < F; j++) {
		double g = 0, u = 0;
		ref_dequant(L->s.gate_dt, b + L->gate_off + j * grb, row, D);
		for (uint32_t i = 0; i < D; i++)
			g += row[i] * xn[i];
		ref_dequant(L->s.up_dt, b + L->up_off + j * urb, row, D);
		for (uint32_t i = 0; i < D; i++)
			u += row[i] * xn[i];
		h[j] = g / (1 + exp(-g)) * u;
	}
	for (uint32_t i = 0; i < D; i++) {
		double o = 0;
		ref_dequant(L->s.down_dt, b + L->down_off + i * drb, row, F);
		for (uint32_t j = 0; j < F; j++)
			o += row[j] * h[j];
		delta[i] += w * o;
	}
	free(row);
	free(h);
}

struct moe_errs {
	double out, w, xn;
};

/* Route and experts on the host against the reference. */
static void check_layer(const struct layer_spec *s, struct moe_errs *worst)
{
	struct tlayer L;
	const uint32_t B = s->batch, D = s->d_model, K = s->top_k;
	double *xn_ref = malloc((size_t)B * D * sizeof(double));
	double *w_ref = malloc((size_t)B * K * sizeof(double));
	double *delta = calloc((size_t)B * D, sizeof(double));
	uint32_t *ids_ref = malloc((size_t)B * K * sizeof(uint32_t));
	uint32_t *ids = malloc((size_t)B * K * sizeof(uint32_t));
	float *w = malloc((size_t)B * K * sizeof(float));
	float *x0 = malloc((size_t)B * D * sizeof(float));
	baton_dptr *blobs = malloc((size_t)B * K * sizeof(baton_dptr));
	struct moe_errs e = { 0, 0, 0 };

	tlayer_make(&L, s);
	/* Tokens whose top_k + 1 logits are within 1e-3 of each other could
	 * rank differently in f32: draw them again. */
	for (uint32_t t = 0; t < B; t++) {
		int tries = 0;
		while (ref_route(&L, t, xn_ref + (size_t)t * D, ids_ref + (size_t)t * K,
		    w_ref + (size_t)t * K) < 1e-3) {
			T_ASSERT(++tries < 1000);
			gen_token(&L, t);
		}
	}
	memcpy(x0, L.x, (size_t)B * D * sizeof(float));

	T_OK(host_moe_route(NULL, &L.l, ids, w));
	double xn_max = 0, xn_err = 0;
	for (size_t i = 0; i < (size_t)B * D; i++) {
		xn_max = fmax(xn_max, fabs(xn_ref[i]));
		xn_err = fmax(xn_err, fabs(L.xn[i] - xn_ref[i]));
	}
	e.xn = xn_err / xn_max;
	for (uint32_t t = 0; t < B; t++) {
		double sum = 0;
		for (uint32_t k = 0; k < K; k++) {
			size_t p = (size_t)t * K + k;
			T_ASSERT_MSG(ids[p] == ids_ref[p], "token %u rank %u: expert %u, want %u",
			    t, k, ids[p], ids_ref[p]);
			e.w = fmax(e.w, fabs(w[p] - w_ref[p]));
			sum += w[p];
			blobs[p] = (uintptr_t)L.blob[ids[p]];
			ref_expert(&L, ids_ref[p], xn_ref + (size_t)t * D, w_ref[p], delta + (size_t)t * D);
		}
		T_ASSERT_MSG(fabs(sum - 1) < 1e-6, "token %u: weights sum to %.9g", t, sum);
	}

	T_OK(host_moe_experts(NULL, &L.l, blobs, w));
	double dmax = 0, derr = 0;
	for (size_t i = 0; i < (size_t)B * D; i++) {
		double got = (double)L.x[i] - x0[i];
		dmax = fmax(dmax, fabs(delta[i]));
		derr = fmax(derr, fabs(got - delta[i]));
	}
	e.out = derr / dmax;

	printf("    %-4s/%-4s/%-4s router %-4s norm %-4s B%-2u D%-4u F%-4u E%-3u K%u: "
	    "out %.1e  w %.1e  xn %.1e\n", dt_name(s->gate_dt), dt_name(s->up_dt),
	    dt_name(s->down_dt), dt_name(s->router_dt), s->norm_dt < 0 ? "none" : dt_name(s->norm_dt),
	    B, D, s->d_ff, s->n_experts, K, e.out, e.w, e.xn);
	T_ASSERT_MSG(e.xn <= TOL_XN, "xn error %.3g > %.3g", e.xn, TOL_XN);
	T_ASSERT_MSG(e.w <= TOL_W, "routing weight error %.3g > %.3g", e.w, TOL_W);
	T_ASSERT_MSG(e.out <= TOL_OUT, "output error %.3g > %.3g", e.out, TOL_OUT);
	worst->out = fmax(worst->out, e.out);
	worst->w = fmax(worst->w, e.w);
	worst->xn = fmax(worst->xn, e.xn);

	tlayer_free(&L);
	free(xn_ref);
	free(w_ref);
	free(delta);
	free(ids_ref);
	free(ids);
	free(w);
	free(x0);
	free(blobs);
}

/* Shapes for every dtype: batch 1 and 8, top_k 1 and 4, d_model a multiple
 * of 32 but no power of two; one with odd sizes (not for q8_0). */
struct shape {
	uint32_t batch, d_model, d_ff, n_experts, top_k;
	int norm; /* 0: none, 1: norm in the layer's dtype (f32 for q8_0) */
	int odd;  /* sizes not a multiple of 32 */
};

static const struct shape shapes[] = {
	{ 1, 96, 160, 4, 1, 1, 0 },
	{ 8, 160, 224, 8, 4, 1, 0 },
	{ 3, 288, 96, 6, 2, 0, 0 },
	{ 2, 37, 53, 5, 2, 1, 1 },
	{ 4, 480, 736, 16, 2, 1, 0 },
};

/* The K-quants' rows are multiples of 256 long. */
static const struct shape shapes_k[] = {
	{ 1, 256, 512, 4, 1, 1, 0 },
	{ 8, 512, 256, 8, 4, 1, 0 },
	{ 3, 768, 256, 6, 2, 0, 0 },
};

static void check_dtype(int dt)
{
	struct moe_errs worst = { 0, 0, 0 };
	int kq = baton_kquant_is(dt);
	const struct shape *shs = kq ? shapes_k : shapes;
	size_t nsh = kq ? sizeof shapes_k / sizeof shapes_k[0] : sizeof shapes / sizeof shapes[0];

	for (size_t i = 0; i < nsh; i++) {
		const struct shape *sh = &shs[i];
		if (sh->odd && dt == BATON_DT_Q8_0)
			continue;
		struct layer_spec s = {
			.gate_dt = dt, .up_dt = dt, .down_dt = dt, .router_dt = dt,
			.norm_dt = !sh->norm ? -1 : dt == BATON_DT_Q8_0 || kq ? BATON_DT_F32 : dt,
			.batch = sh->batch, .d_model = sh->d_model, .d_ff = sh->d_ff,
			.n_experts = sh->n_experts, .top_k = sh->top_k,
		};
		check_layer(&s, &worst);
	}
	printf("    %s worst: out %.2e (tol %.0e)  w %.2e (tol %.0e)  xn %.2e (tol %.0e)\n",
	    dt_name(dt), worst.out, TOL_OUT, worst.w, TOL_W, worst.xn, TOL_XN);
}

static void t_moe_f32(void) { check_dtype(BATON_DT_F32); }
static void t_moe_f16(void) { check_dtype(BATON_DT_F16); }
static void t_moe_bf16(void) { check_dtype(BATON_DT_BF16); }
static void t_moe_q8_0(void) { check_dtype(BATON_DT_Q8_0); }
static void t_moe_q4_K(void) { check_dtype(BATON_DT_Q4_K); }
static void t_moe_q5_K(void) { check_dtype(BATON_DT_Q5_K); }
static void t_moe_q6_K(void) { check_dtype(BATON_DT_Q6_K); }

static void t_moe_mixed(void)
{
	struct moe_errs worst = { 0, 0, 0 };
	struct layer_spec s = {
		.gate_dt = BATON_DT_F16, .up_dt = BATON_DT_BF16, .down_dt = BATON_DT_Q8_0,
		.router_dt = BATON_DT_F32, .norm_dt = BATON_DT_BF16,
		.batch = 5, .d_model = 192, .d_ff = 320, .n_experts = 8, .top_k = 3,
	};
	check_layer(&s, &worst);
	s = (struct layer_spec){
		.gate_dt = BATON_DT_Q8_0, .up_dt = BATON_DT_F32, .down_dt = BATON_DT_F16,
		.router_dt = BATON_DT_BF16, .norm_dt = BATON_DT_F16,
		.batch = 8, .d_model = 224, .d_ff = 64, .n_experts = 4, .top_k = 4,
	};
	check_layer(&s, &worst);
}

/* Exact ties rank the lower id first; a NaN logit ranks last. */
static void t_route_ties(void)
{
	struct layer_spec s = {
		.gate_dt = BATON_DT_F32, .up_dt = BATON_DT_F32, .down_dt = BATON_DT_F32,
		.router_dt = BATON_DT_F32, .norm_dt = -1,
		.batch = 2, .d_model = 32, .d_ff = 32, .n_experts = 7, .top_k = 4,
	};
	struct tlayer L;
	uint32_t ids[2 * 7];
	float w[2 * 7];
	float *r;

	tlayer_make(&L, &s);
	r = (float *)(void *)L.router;
	for (uint32_t i = 0; i < 32; i++) {
		float a = 0.25f * (float)(i % 5) - 0.5f;
		r[0 * 32 + i] = a;          /* logit s */
		r[1 * 32 + i] = a * 0.5f;   /* s / 2 */
		r[2 * 32 + i] = a;          /* s */
		r[3 * 32 + i] = a * 0.5f;   /* s / 2 */
		r[4 * 32 + i] = -3 * a;     /* -3 s */
		r[5 * 32 + i] = a;          /* s */
		r[6 * 32 + i] = i == 3 ? NAN : a; /* NaN */
		L.x[i] = a;                 /* token 0: s > 0 */
		L.x[32 + i] = -a;           /* token 1: s < 0, the order flips */
	}
	T_OK(host_moe_route(NULL, &L.l, ids, w));
	uint32_t want0[] = { 0, 2, 5, 1 }, want1[] = { 4, 1, 3, 0 };
	for (int k = 0; k < 4; k++) {
		T_EQ_INT(ids[k], want0[k]);
		T_EQ_INT(ids[4 + k], want1[k]);
	}
	T_ASSERT(w[0] == w[1] && w[1] == w[2] && w[3] < w[0]);
	T_ASSERT(w[5] == w[6] && w[7] < w[6]);

	/* All seven: the NaN logit comes last. */
	L.l.top_k = 7;
	T_OK(host_moe_route(NULL, &L.l, ids, w));
	uint32_t all0[] = { 0, 2, 5, 1, 3, 4, 6 };
	for (int k = 0; k < 7; k++)
		T_EQ_INT(ids[k], all0[k]);
	/* NaN at the lowest id too: still after every number. */
	r[3] = NAN;
	T_OK(host_moe_route(NULL, &L.l, ids, w));
	uint32_t nan0[] = { 2, 5, 1, 3, 4, 0, 6 };
	for (int k = 0; k < 7; k++)
		T_EQ_INT(ids[k], nan0[k]);
	tlayer_free(&L);
}

/* ---- errors -------------------------------------------------------------- */

static void t_unsupported(void)
{
	const int yes[] = { BATON_DT_F32, BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0,
		BATON_DT_Q4_K, BATON_DT_Q5_K, BATON_DT_Q6_K, BATON_DT_Q4_0, BATON_DT_Q4_1,
		BATON_DT_Q5_0, BATON_DT_Q5_1, BATON_DT_Q2_K, BATON_DT_Q3_K, BATON_DT_IQ4_NL,
		BATON_DT_IQ4_XS, BATON_DT_MXFP4 };
	const int no[] = { BATON_DT_IQ2_XXS, BATON_DT_IQ3_S, BATON_DT_IQ1_M, BATON_DT_F64,
		BATON_DT_I8, BATON_DT_TQ2_0, -1, 4, 40, 1000 };
	for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
		T_EQ_INT(host_can_compute(yes[i]), 1);
	for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
		T_EQ_INT(host_can_compute(no[i]), 0);

	uint8_t row[256] = { 0 };
	float x[64] = { 0 }, out;
	T_EQ_ERR(baton_dot_row(BATON_DT_IQ3_XXS, row, x, 64, &out), BATON_EUNSUPPORTED);
	T_EQ_ERR(baton_dequant_row(BATON_DT_IQ3_XXS, row, x, 64), BATON_EUNSUPPORTED);
	T_EQ_INT(baton_compute_row_bytes(BATON_DT_IQ3_XXS, 256), 0);

	struct layer_spec s = {
		.gate_dt = BATON_DT_F16, .up_dt = BATON_DT_F16, .down_dt = BATON_DT_F16,
		.router_dt = BATON_DT_F32, .norm_dt = BATON_DT_F32,
		.batch = 2, .d_model = 64, .d_ff = 32, .n_experts = 4, .top_k = 2,
	};
	struct tlayer L;
	uint32_t ids[4];
	float w[4];
	baton_dptr blobs[4];
	struct baton_moe_layer l;

	tlayer_make(&L, &s);
	for (int p = 0; p < 4; p++)
		blobs[p] = (uintptr_t)L.blob[p];
	T_OK(host_moe_route(NULL, &L.l, ids, w));
	l = L.l, l.gate_dtype = BATON_DT_IQ3_XXS;
	T_EQ_ERR(host_moe_experts(NULL, &l, blobs, w), BATON_EUNSUPPORTED);
	T_OK(host_moe_route(NULL, &l, ids, w)); /* route reads no expert */
	l = L.l, l.up_dtype = BATON_DT_IQ3_XXS;
	T_EQ_ERR(host_moe_experts(NULL, &l, blobs, w), BATON_EUNSUPPORTED);
	l = L.l, l.down_dtype = BATON_DT_IQ3_XXS;
	T_EQ_ERR(host_moe_experts(NULL, &l, blobs, w), BATON_EUNSUPPORTED);
	l = L.l, l.router_dtype = BATON_DT_IQ3_XXS;
	T_EQ_ERR(host_moe_route(NULL, &l, ids, w), BATON_EUNSUPPORTED);
	l = L.l, l.norm_dtype = BATON_DT_IQ3_XXS;
	T_EQ_ERR(host_moe_route(NULL, &l, ids, w), BATON_EUNSUPPORTED);
	l.norm = 0; /* no norm: its dtype does not matter */
	T_OK(host_moe_route(NULL, &l, ids, w));
	T_OK(host_moe_experts(NULL, &L.l, blobs, w));
	tlayer_free(&L);
}

static void t_bad_args(void)
{
	struct layer_spec s = {
		.gate_dt = BATON_DT_Q8_0, .up_dt = BATON_DT_Q8_0, .down_dt = BATON_DT_Q8_0,
		.router_dt = BATON_DT_F32, .norm_dt = -1,
		.batch = 2, .d_model = 64, .d_ff = 96, .n_experts = 4, .top_k = 2,
	};
	struct tlayer L;
	uint32_t ids[4];
	float w[4] = { 0.5f, 0.5f, 0.5f, 0.5f };
	baton_dptr blobs[4];
	struct baton_moe_layer l;

	tlayer_make(&L, &s);
	for (int p = 0; p < 4; p++)
		blobs[p] = (uintptr_t)L.blob[p];
	float *x0 = malloc(2 * 64 * sizeof(float));
	memcpy(x0, L.x, 2 * 64 * sizeof(float));

#define BOTH_EINVAL(mutate)                                                    \
	do {                                                                   \
		l = L.l;                                                       \
		mutate;                                                        \
		T_EQ_ERR(host_moe_route(NULL, &l, ids, w), BATON_EINVAL);      \
		T_EQ_ERR(host_moe_experts(NULL, &l, blobs, w), BATON_EINVAL);  \
	} while (0)
	BOTH_EINVAL(l.batch = 0);
	BOTH_EINVAL(l.d_model = 0);
	BOTH_EINVAL(l.d_ff = 0);
	BOTH_EINVAL(l.n_experts = 0);
	BOTH_EINVAL(l.top_k = 0);
	BOTH_EINVAL(l.top_k = 5);
	BOTH_EINVAL(l.x = 0);
	BOTH_EINVAL(l.xn = 0);
	BOTH_EINVAL(l.x += 2);                 /* misaligned */
	BOTH_EINVAL(l.xn = l.x + 4 * 64 * 2 - 4); /* overlaps x */
	BOTH_EINVAL(l.xn = l.x);
	BOTH_EINVAL(l.batch = UINT32_MAX; l.d_model = UINT32_MAX); /* sizes overflow */
#undef BOTH_EINVAL
	T_EQ_ERR(host_moe_route(NULL, NULL, ids, w), BATON_EINVAL);
	T_EQ_ERR(host_moe_experts(NULL, NULL, blobs, w), BATON_EINVAL);
	T_EQ_ERR(host_moe_route(NULL, &L.l, NULL, w), BATON_EINVAL);
	T_EQ_ERR(host_moe_route(NULL, &L.l, ids, NULL), BATON_EINVAL);
	T_EQ_ERR(host_moe_experts(NULL, &L.l, NULL, w), BATON_EINVAL);
	T_EQ_ERR(host_moe_experts(NULL, &L.l, blobs, NULL), BATON_EINVAL);
	l = L.l, l.router = 0;
	T_EQ_ERR(host_moe_route(NULL, &l, ids, w), BATON_EINVAL);
	blobs[3] = 0;
	T_EQ_ERR(host_moe_experts(NULL, &L.l, blobs, w), BATON_EINVAL);
	blobs[3] = (uintptr_t)L.blob[3];
	/* q8_0 rows must be whole blocks of 32. */
	l = L.l, l.d_model = 48;
	T_EQ_ERR(host_moe_experts(NULL, &l, blobs, w), BATON_EINVAL);
	l = L.l, l.d_ff = 40;
	T_EQ_ERR(host_moe_experts(NULL, &l, blobs, w), BATON_EINVAL);
	l = L.l, l.router_dtype = BATON_DT_Q8_0, l.d_model = 48;
	T_EQ_ERR(host_moe_route(NULL, &l, ids, w), BATON_EINVAL);
	/* Nothing was written by any failed call. */
	T_ASSERT(memcmp(x0, L.x, 2 * 64 * sizeof(float)) == 0);

	uint8_t row[68] = { 0 };
	float x[64] = { 0 }, out;
	const float *xs[1] = { x };
	T_EQ_ERR(baton_dot_row(BATON_DT_Q8_0, row, x, 48, &out), BATON_EINVAL);
	T_EQ_ERR(baton_dot_row(BATON_DT_F16, row, x, 0, &out), BATON_EINVAL);
	T_EQ_ERR(baton_dot_row(BATON_DT_F16, NULL, x, 8, &out), BATON_EINVAL);
	T_EQ_ERR(baton_dot_row(BATON_DT_F16, row, NULL, 8, &out), BATON_EINVAL);
	T_EQ_ERR(baton_dot_row(BATON_DT_F16, row, x, 8, NULL), BATON_EINVAL);
	T_EQ_ERR(baton_dot_rows(BATON_DT_F16, row, 8, NULL, 1, &out), BATON_EINVAL);
	T_OK(baton_dot_rows(BATON_DT_F16, row, 8, xs, 1, &out));
	T_EQ_ERR(baton_dequant_row(BATON_DT_Q8_0, row, x, 33), BATON_EINVAL);
	T_EQ_ERR(baton_dequant_row(BATON_DT_F32, row, NULL, 8), BATON_EINVAL);
	T_EQ_INT(baton_compute_row_bytes(BATON_DT_Q8_0, 48), 0);
	T_EQ_INT(baton_compute_row_bytes(BATON_DT_Q8_0, 64), 68);
	T_EQ_INT(baton_compute_row_bytes(BATON_DT_BF16, 3), 6);
	free(x0);
	tlayer_free(&L);
}

/* ---- determinism --------------------------------------------------------- */

struct run_out {
	uint32_t *ids;
	float *w, *x, *xn;
};

static void run_layer(struct tlayer *L, const float *x0, struct run_out *o)
{
	size_t BK = (size_t)L->s.batch * L->s.top_k, BD = (size_t)L->s.batch * L->s.d_model;
	baton_dptr *blobs = malloc(BK * sizeof(baton_dptr));

	o->ids = malloc(BK * sizeof(uint32_t));
	o->w = malloc(BK * sizeof(float));
	o->x = malloc(BD * sizeof(float));
	o->xn = malloc(BD * sizeof(float));
	memcpy(L->x, x0, BD * sizeof(float));
	T_OK(host_moe_route(NULL, &L->l, o->ids, o->w));
	for (size_t p = 0; p < BK; p++)
		blobs[p] = (uintptr_t)L->blob[o->ids[p]];
	T_OK(host_moe_experts(NULL, &L->l, blobs, o->w));
	memcpy(o->x, L->x, BD * sizeof(float));
	memcpy(o->xn, L->xn, BD * sizeof(float));
	free(blobs);
}

static void run_free(struct run_out *o)
{
	free(o->ids);
	free(o->w);
	free(o->x);
	free(o->xn);
}

static void same_bits(const struct run_out *a, const struct run_out *b, size_t BK, size_t BD,
    const char *what)
{
	T_ASSERT_MSG(memcmp(a->ids, b->ids, BK * sizeof(uint32_t)) == 0, "%s: ids differ", what);
	T_ASSERT_MSG(memcmp(a->w, b->w, BK * sizeof(float)) == 0, "%s: weights differ", what);
	T_ASSERT_MSG(memcmp(a->xn, b->xn, BD * sizeof(float)) == 0, "%s: xn differs", what);
	T_ASSERT_MSG(memcmp(a->x, b->x, BD * sizeof(float)) == 0, "%s: x differs", what);
}

/* Same inputs -> the same bits: twice, with 1..N threads, with either
 * kernel set, and per token whatever else is in the batch. Sized so that route and experts both
 * split over several threads. */
static void t_determinism(void)
{
	const int dts[] = { BATON_DT_F16, BATON_DT_Q8_0, BATON_DT_F32, BATON_DT_BF16 };

	for (size_t d = 0; d < 4; d++) {
		struct layer_spec s = {
			.gate_dt = dts[d], .up_dt = dts[d], .down_dt = dts[d],
			.router_dt = dts[d], .norm_dt = BATON_DT_F32,
			.batch = 16, .d_model = 256, .d_ff = 288, .n_experts = 96, .top_k = 2,
		};
		struct tlayer L;
		const size_t BK = 16 * 2, BD = 16 * 256;
		struct run_out ref, o;

		tlayer_make(&L, &s);
		float *x0 = malloc(BD * sizeof(float));
		memcpy(x0, L.x, BD * sizeof(float));
		/* Several tokens on the same expert: give tokens 8..15 the inputs
		 * of tokens 0..7 scaled (same route after the norm). */
		for (size_t i = 0; i < BD / 2; i++)
			x0[BD / 2 + i] = x0[i] * 4;

		T_EQ_INT(host_moe_set_threads(1), 1);
		baton_kernels_avx2(0);
		run_layer(&L, x0, &ref);
		const int threads[] = { 1, 2, 3, 4, 7, 16 };
		for (int k = 0; k < 2; k++) {
			if (baton_kernels_avx2(k) != k)
				break;
			for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
				char what[64];
				snprintf(what, sizeof what, "%s, avx2 %d, %d threads",
				    dt_name(dts[d]), k, threads[i]);
				T_EQ_INT(host_moe_set_threads(threads[i]), threads[i]);
				run_layer(&L, x0, &o);
				same_bits(&ref, &o, BK, BD, what);
				run_free(&o);
			}
		}
		/* Each token alone gives the same bits as in the batch. */
		T_ASSERT(host_moe_set_threads(0) >= 1);
		for (uint32_t t = 0; t < 16; t += 5) {
			struct tlayer one = L;
			char what[64];
			one.s.batch = one.l.batch = 1;
			snprintf(what, sizeof what, "%s, token %u alone", dt_name(dts[d]), t);
			run_layer(&one, x0 + (size_t)t * 256, &o);
			struct run_out sub = {
				ref.ids + t * 2, ref.w + t * 2, ref.x + (size_t)t * 256,
				ref.xn + (size_t)t * 256,
			};
			same_bits(&sub, &o, 2, 256, what);
			run_free(&o);
		}
		run_free(&ref);
		free(x0);
		tlayer_free(&L);
	}
}

T_MAIN(T_CASE(t_f16_exhaustive), T_CASE(t_bf16_exhaustive),
    T_CASE(t_q8_0_dequant), T_CASE(t_dequant_and_dot),
    T_CASE_TIMEOUT(t_moe_f32, 120), T_CASE_TIMEOUT(t_moe_f16, 120),
    T_CASE_TIMEOUT(t_moe_bf16, 120), T_CASE_TIMEOUT(t_moe_q8_0, 120),
    T_CASE_TIMEOUT(t_moe_q4_K, 120), T_CASE_TIMEOUT(t_moe_q5_K, 120), T_CASE_TIMEOUT(t_moe_q6_K, 120),
    T_CASE_TIMEOUT(t_moe_mixed, 120), T_CASE(t_route_ties), T_CASE(t_unsupported),
    T_CASE(t_bad_args), T_CASE_TIMEOUT(t_determinism, 120))
