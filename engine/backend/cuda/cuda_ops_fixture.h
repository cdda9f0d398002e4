/*
 * cuda_ops_fixture.h: what the cuda backend's forward-pass op tests share
 * (header only, tests inside engine/backend/cuda/ only): random data and
 * weights in every dtype the kernels read (the host decodes the same
 * bytes), device copies both ways, the two checks (the same bits, within
 * a tolerance of the scale, printing the figure), and one matmul on both
 * backends bit for bit. ops_test.c (the row ops and routing),
 * ops_attn_test.c (attention) and ops_tc_test.c (the tensor-core path)
 * use it; each case runs in its own process, so each starts from the same
 * random state whichever binary holds it.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_OPS_FIXTURE_H
#define BATON_ENGINE_BACKEND_CUDA_OPS_FIXTURE_H


#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

static const struct baton_backend *be = &baton_backend_cuda;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

__attribute__((unused))
static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

__attribute__((unused))
static float frand(void)
{
	return (float)((double)(rnd() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

__attribute__((unused))
static float *rvec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	T_ASSERT(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

__attribute__((unused))
static baton_dptr H(const void *p)
{
	return (baton_dptr)(uintptr_t)p;
}

__attribute__((unused))
static void fig(const char *name, double v)
{
	printf("  fig %-40s %12.6g\n", name, v);
	fflush(stdout);
}

/* A device copy of n host bytes. */
__attribute__((unused))
static baton_dptr up(struct baton_dev *dev, const void *p, uint64_t n)
{
	baton_dptr d = 0;
	T_CU(dev, be->alloc(dev, n, &d));
	struct baton_copy c = { d, p, n };
	T_CU(dev, be->copy_h2d(dev, &c, 1));
	T_CU(dev, be->sync(dev));
	return d;
}

__attribute__((unused))
static void down(struct baton_dev *dev, void *p, baton_dptr d, uint64_t n)
{
	T_CU(dev, be->sync(dev));
	T_CU(dev, be->copy_d2h(dev, p, d, n));
}

/* rows x cols random weights in dtype (any bytes for the quants' values,
 * sane f16 scales): the host decodes the same bytes. */
__attribute__((unused))
static uint8_t *weights(int dt, uint32_t rows, uint32_t cols, uint64_t *bytes)
{
	const uint64_t rb = baton_compute_row_bytes(dt, cols);
	T_ASSERT(rb);
	uint8_t *w = malloc(rows * rb);
	T_ASSERT(w);
	for (uint64_t i = 0; i < rows * rb; i++)
		w[i] = (uint8_t)rnd();
	for (uint32_t r = 0; r < rows; r++) {
		uint8_t *row = w + r * rb;
		for (uint32_t i = 0; i < cols; i++) {
			float f = frand();
			uint16_t h;
			if (dt == BATON_DT_F32)
				memcpy(row + 4 * i, &f, 4);
			else if (dt == BATON_DT_F16)
				h = baton_f32_to_f16(f), memcpy(row + 2 * i, &h, 2);
			else if (dt == BATON_DT_BF16)
				h = baton_f32_to_bf16(f), memcpy(row + 2 * i, &h, 2);
		}
		if (dt == BATON_DT_Q8_0)
			for (uint32_t b = 0; b < cols / 32; b++) {
				uint16_t h = baton_f32_to_f16(frand() / 100);
				memcpy(row + b * 34, &h, 2);
			}
		if (baton_quant_decodes(dt) && !baton_kquant_is(dt)) {
			/* arena/quant.c's types: f16 d (and min) at their offsets,
			 * mxfp4's exponent near 2^0 */
			int fd = 0, fm = -1;
			uint32_t bs = 32;
			if (dt == BATON_DT_Q4_1 || dt == BATON_DT_Q5_1)
				fm = 2;
			else if (dt == BATON_DT_Q2_K)
				fd = 80, fm = 82, bs = 256;
			else if (dt == BATON_DT_Q3_K)
				fd = 108, bs = 256;
			else if (dt == BATON_DT_IQ4_XS)
				bs = 256;
			const uint64_t bb = baton_compute_row_bytes(dt, bs);
			for (uint32_t b = 0; b < cols / bs; b++) {
				uint8_t *blk = row + b * bb;
				uint16_t d = baton_f32_to_f16(frand() / 100), m = baton_f32_to_f16(frand() / 20);
				if (dt == BATON_DT_MXFP4) {
					blk[0] = (uint8_t)(120 + rnd() % 12);
					continue;
				}
				memcpy(blk + fd, &d, 2);
				if (fm >= 0)
					memcpy(blk + fm, &m, 2);
			}
		}
		if (baton_kquant_is(dt))
			for (uint32_t b = 0; b < cols / 256; b++) {
				uint8_t *blk = row + b * (rb / (cols / 256));
				uint16_t d = baton_f32_to_f16(frand() / 200), m = baton_f32_to_f16(frand() / 50);
				if (dt == BATON_DT_Q6_K) {
					memcpy(blk + 208, &d, 2);
				} else {
					memcpy(blk, &d, 2);
					memcpy(blk + 2, &m, 2);
				}
			}
	}
	*bytes = rows * rb;
	return w;
}

__attribute__((unused))
static void same_bits(const float *got, const float *want, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &want[i], 4) != 0)
			T_FAIL("%s[%zu]: cuda %.9g, host %.9g (not the same bits)", what, i, got[i], want[i]);
}

/* max |got - want| / max(1, max |want|); fails beyond tol. */
__attribute__((unused))
static void close_to(const float *got, const float *want, size_t n, double tol, const char *what)
{
	double md = 0, mw = 1;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= md))
			md = isnan(d) ? INFINITY : d;
		if (fabs(want[i]) > mw)
			mw = fabs(want[i]);
	}
	char name[96]; /* what (a caller's 80 at most) and " max diff" */
	snprintf(name, sizeof name, "%s max diff", what);
	fig(name, md / mw);
	T_ASSERT_MSG(md / mw <= tol, "%s: max |cuda - host| %.3g of scale %.3g (> %g)", what, md, mw,
	    tol);
}

static const int DTS[] = { BATON_DT_F32, BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0,
	BATON_DT_Q4_K, BATON_DT_Q5_K, BATON_DT_Q6_K, BATON_DT_Q4_0, BATON_DT_Q4_1, BATON_DT_Q5_0,
	BATON_DT_Q5_1, BATON_DT_IQ4_NL, BATON_DT_MXFP4, BATON_DT_Q2_K, BATON_DT_Q3_K,
	BATON_DT_IQ4_XS };

/* 1 for the types of 256-value blocks (the K-quants, iq4_xs) */
__attribute__((unused))
static int blk256(int dt)
{
	return baton_compute_row_bytes(dt, 32) == 0;
}
#define N_DTS (sizeof DTS / sizeof DTS[0])

/* One matmul on both backends; the weights sit `off` bytes into their
 * device buffer (1: the kernel that loads bytes one by one; 2 for 16-bit
 * types, 4 for f32: typed loads without the 16-byte ones). */
__attribute__((unused))
static void matmul_case_at(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k,
    uint32_t rows, int bias_dt, int acc, uint32_t off)
{
	uint64_t wb, bb = 0;
	uint8_t *w = weights(dt, n_out, k, &wb);
	uint8_t *b = bias_dt >= 0 ? weights(bias_dt, 1, n_out, &bb) : NULL;
	float *x = rvec((size_t)rows * k), *y = rvec((size_t)rows * n_out);
	float *got = malloc((size_t)rows * n_out * 4);
	T_ASSERT(got);
	baton_dptr dw0 = 0, dw, dx = up(dev, x, (uint64_t)rows * k * 4);
	T_CU(dev, be->alloc(dev, wb + 16, &dw0));
	dw = dw0 + off;
	struct baton_copy wc = { dw, w, wb };
	T_CU(dev, be->copy_h2d(dev, &wc, 1));
	baton_dptr dy = up(dev, y, (uint64_t)rows * n_out * 4), db = b ? up(dev, b, bb) : 0;
	T_CU(dev, be->matmul(dev, dw, (uint32_t)dt, n_out, k, db, (uint32_t)(b ? bias_dt : 0), dx,
	    rows, dy, acc));
	down(dev, got, dy, (uint64_t)rows * n_out * 4);
	T_OK(host_op_matmul(NULL, H(w), (uint32_t)dt, n_out, k, H(b), (uint32_t)(b ? bias_dt : 0),
	    H(x), rows, H(y), acc));
	char what[64];
	snprintf(what, sizeof what, "matmul %s k=%u rows=%u off=%u", baton_dtype_name(dt), k, rows,
	    off);
	same_bits(got, y, (size_t)rows * n_out, what);
	be->free(dev, dw0), be->free(dev, dx), be->free(dev, dy);
	if (db)
		be->free(dev, db);
	free(w), free(b), free(x), free(y), free(got);
}

__attribute__((unused))
static void matmul_case(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k, uint32_t rows,
    int bias_dt, int acc)
{
	matmul_case_at(dev, dt, n_out, k, rows, bias_dt, acc, 0);
}

#endif
