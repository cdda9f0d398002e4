/*
 * gemv16_test.c: the 16-bit batch-1 path (gemv16.cu, gemv16_launch.c)
 * against the host backend, through the backend table as the model calls
 * it. Built only with CUDA=1; without a driver or a device every case
 * prints "skip: why" and passes.
 *
 * What must agree how:
 *   - matmul at rows == 1 on bf16 / f16 rows, 16-byte aligned, k % 8 == 0:
 *     within 2e-5 of the output's scale of host_op_matmul (the same
 *     products as f32 fused multiply-adds, summed in another order), not
 *     the exact kernels' bits in every row (so the fast kernel ran), the
 *     same bits twice; misaligned weights or x, a k not a multiple of 8,
 *     and BATON_CUDA_EXACT=1 take the exact kernels: the host's bits;
 *   - cuda_g16_matmuls (q, k and v in one launch): each output the bits of
 *     its own matmul's fast path, within 2e-5 of the host's, accumulate
 *     too; misaligned weights or x, 4 outputs, 2 rows and
 *     BATON_CUDA_EXACT=1 declined;
 *   - the decode step's experts (moe_experts_dev at batch 1) on bf16 / f16:
 *     cuda_moe_fixture.h's check_layer, within its 1e-4 of the double
 *     reference and the same bits twice; misaligned parts take moe.cu's
 *     kernels (moe_experts' bits).
 * t_perf16 prints timings at Qwen3-30B-A3B's batch-1 shapes; it asserts
 * nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/cuda/cuda_moe_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

static baton_dptr H(const void *p)
{
	return (baton_dptr)(uintptr_t)p;
}

static float frand(void)
{
	return (float)urand();
}

/* rows x cols of dt (bf16, f16 or f32) from [-1, 1). */
static uint8_t *wrand(int dt, uint32_t rows, uint32_t cols, uint64_t *bytes)
{
	const uint64_t rb = baton_compute_row_bytes(dt, cols);
	uint8_t *w = malloc(rows * rb);
	T_ASSERT(w);
	for (uint64_t i = 0; i < (uint64_t)rows * cols; i++) {
		const float f = frand();
		uint16_t h;
		if (dt == BATON_DT_F32)
			memcpy(w + 4 * i, &f, 4);
		else
			h = dt == BATON_DT_F16 ? baton_f32_to_f16(f) : baton_f32_to_bf16(f),
			memcpy(w + 2 * i, &h, 2);
	}
	*bytes = rows * rb;
	return w;
}

enum { FAST, EXACT };

/* One batch-1 matmul, the weights `woff` and x `xoff` bytes into their
 * buffers: FAST within 2e-5 of the host's and not its bits everywhere,
 * EXACT the host's bits; twice, the same bits. */
static void mm_case(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k, int bias_dt,
    int acc, uint32_t woff, uint32_t xoff, int want_path)
{
	uint64_t wb, bb = 0;
	uint8_t *w = wrand(dt, n_out, k, &wb);
	uint8_t *b = bias_dt >= 0 ? wrand(bias_dt, 1, n_out, &bb) : NULL;
	float *x = malloc((size_t)k * 4), *y = malloc((size_t)n_out * 4);
	float *want = malloc((size_t)n_out * 4), *got = malloc((size_t)n_out * 4);
	float *got2 = malloc((size_t)n_out * 4);
	T_ASSERT(x && y && want && got && got2);
	for (uint32_t i = 0; i < k; i++)
		x[i] = frand() * (1.0f + (float)(i % 7));
	for (uint32_t i = 0; i < n_out; i++)
		y[i] = frand();
	memcpy(want, y, (size_t)n_out * 4);
	baton_dptr dw0 = 0, dx0 = 0, dy = 0, db = 0;
	T_CU(dev, be->alloc(dev, wb + 32, &dw0));
	T_CU(dev, be->alloc(dev, (uint64_t)k * 4 + 32, &dx0));
	T_CU(dev, be->alloc(dev, (uint64_t)n_out * 4, &dy));
	if (b)
		T_CU(dev, be->alloc(dev, bb, &db));
	struct baton_copy c[3] = { { dw0 + woff, w, wb }, { dx0 + xoff, x, (uint64_t)k * 4 },
		{ db, b, bb } };
	T_CU(dev, be->copy_h2d(dev, c, b ? 3 : 2));
	for (int run = 0; run < 2; run++) {
		struct baton_copy yc = { dy, y, (uint64_t)n_out * 4 };
		T_CU(dev, be->copy_h2d(dev, &yc, 1));
		T_CU(dev, be->matmul(dev, dw0 + woff, (uint32_t)dt, n_out, k, db,
		    (uint32_t)(b ? bias_dt : 0), dx0 + xoff, 1, dy, acc));
		T_CU(dev, be->sync(dev));
		T_CU(dev, be->copy_d2h(dev, run ? got2 : got, dy, (uint64_t)n_out * 4));
	}
	T_OK(host_op_matmul(NULL, H(w), (uint32_t)dt, n_out, k, H(b), (uint32_t)(b ? bias_dt : 0),
	    H(x), 1, H(want), acc));
	char what[96];
	snprintf(what, sizeof what, "gemv16 %s n=%u k=%u woff=%u xoff=%u", baton_dtype_name(dt),
	    n_out, k, woff, xoff);
	T_ASSERT_MSG(memcmp(got, got2, (size_t)n_out * 4) == 0, "%s: two runs differ", what);
	uint32_t differ = 0;
	double md = 0, mw = 1;
	for (uint32_t i = 0; i < n_out; i++) {
		differ += memcmp(&got[i], &want[i], 4) != 0;
		const double d = fabs((double)got[i] - want[i]);
		md = isnan(d) || d > md ? (isnan(d) ? INFINITY : d) : md;
		mw = fmax(mw, fabs(want[i]));
	}
	if (want_path == EXACT) {
		T_ASSERT_MSG(differ == 0, "%s: %u outputs are not the exact kernels' bits", what, differ);
	} else {
		char name[112];
		snprintf(name, sizeof name, "%s max diff", what);
		fig(name, md / mw, "");
		T_ASSERT_MSG(md / mw <= 2e-5, "%s: max |cuda - host| %.3g of scale %.3g (> 2e-5)", what,
		    md, mw);
		/* n_out >= 16 rows of k >= 256 terms: the exact bits everywhere
		 * would mean the exact kernel ran */
		if (n_out >= 16 && k >= 256)
			T_ASSERT_MSG(differ > 0, "%s: the host's bits in every row: not the fast path", what);
	}
	be->free(dev, dw0), be->free(dev, dx0), be->free(dev, dy);
	if (db)
		be->free(dev, db);
	free(w), free(b), free(x), free(y), free(want), free(got), free(got2);
}

static void t_matmul16(void)
{
	T_ASSERT(setenv("BATON_CUDA_GEMM", "0", 1) == 0);
	struct baton_dev *dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_GEMM");
	const int dts[] = { BATON_DT_BF16, BATON_DT_F16 };
	for (size_t i = 0; i < 2; i++) {
		const int dt = dts[i];
		/* a row shorter than a warp's loads, one round of U loads per
		 * lane (k = 2,048: q/k/v, the router, the head), two (the o
		 * projection's 4,096), a round and a tail (2,056), bias of each
		 * type, accumulate, rows not a multiple of a block's */
		mm_case(dev, dt, 37, 24, -1, 0, 0, 0, FAST);
		mm_case(dev, dt, 37, 256, BATON_DT_F32, 0, 0, 0, FAST);
		mm_case(dev, dt, 301, 2048, -1, 1, 0, 0, FAST);
		mm_case(dev, dt, 128, 2048, -1, 0, 0, 0, FAST);
		mm_case(dev, dt, 19, 4096, BATON_DT_BF16, 1, 0, 0, FAST);
		mm_case(dev, dt, 21, 2056, BATON_DT_F16, 0, 0, 0, FAST);
		mm_case(dev, dt, 1030, 768, -1, 0, 0, 0, FAST);
		/* the exact kernels: weights or x off 16 bytes, k % 8 */
		mm_case(dev, dt, 19, 512, -1, 0, 2, 0, EXACT);
		mm_case(dev, dt, 19, 512, -1, 0, 0, 4, EXACT);
		mm_case(dev, dt, 19, 500, -1, 0, 0, 0, EXACT);
	}
	be->close(dev);

	/* BATON_CUDA_EXACT=1 at open: the exact kernels, the host's bits */
	T_ASSERT(setenv("BATON_CUDA_EXACT", "1", 1) == 0);
	dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_EXACT");
	mm_case(dev, BATON_DT_BF16, 301, 2048, -1, 1, 0, 0, EXACT);
	mm_case(dev, BATON_DT_F16, 64, 1024, BATON_DT_F32, 0, 0, 0, EXACT);
	be->close(dev);
}

/* cuda_g16_matmuls, attention's q, k and v over one x in one launch:
 * each output the bits of the same matmul through the slot (the fast
 * path's), within 2e-5 of the host's; accumulate; what it declines. */
static void t_matmuls16(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t k = 2048;
	const struct {
		int dt, bias_dt;
		uint32_t n;
	} m[3] = { { BATON_DT_BF16, BATON_DT_F32, 301 }, { BATON_DT_F16, -1, 37 },
		{ BATON_DT_BF16, BATON_DT_BF16, 64 } };
	uint8_t *w[3], *b[3];
	uint64_t wb[3], bb[3];
	baton_dptr dw[3], db[3], dy[3], dy1[3], dx;
	float *x = malloc(k * 4);
	T_ASSERT(x);
	for (uint32_t i = 0; i < k; i++)
		x[i] = frand() * (1.0f + (float)(i % 5));
	dx = 0;
	T_CU(dev, be->alloc(dev, k * 4, &dx));
	struct baton_copy cx = { dx, x, k * 4 };
	T_CU(dev, be->copy_h2d(dev, &cx, 1));
	struct cuda_g16_out o[3];
	for (int i = 0; i < 3; i++) {
		w[i] = wrand(m[i].dt, m[i].n, k, &wb[i]);
		b[i] = m[i].bias_dt >= 0 ? wrand(m[i].bias_dt, 1, m[i].n, &bb[i]) : NULL;
		dw[i] = db[i] = dy[i] = dy1[i] = 0;
		T_CU(dev, be->alloc(dev, wb[i], &dw[i]));
		T_CU(dev, be->alloc(dev, m[i].n * 4, &dy[i]));
		T_CU(dev, be->alloc(dev, m[i].n * 4, &dy1[i]));
		struct baton_copy c = { dw[i], w[i], wb[i] };
		T_CU(dev, be->copy_h2d(dev, &c, 1));
		if (b[i]) {
			T_CU(dev, be->alloc(dev, bb[i], &db[i]));
			struct baton_copy cb = { db[i], b[i], bb[i] };
			T_CU(dev, be->copy_h2d(dev, &cb, 1));
		}
		o[i] = (struct cuda_g16_out){ .w = dw[i], .b = db[i], .y = dy[i],
			.w_dtype = (uint32_t)m[i].dt, .b_dtype = b[i] ? (uint32_t)m[i].bias_dt : 0,
			.n_out = m[i].n };
	}
	T_CU(dev, be->sync(dev)); /* the context current for the internal call */
	for (int acc = 0; acc < 2; acc++) {
		/* accumulate: onto the last pass's outputs, on both sides */
		T_CU(dev, cuda_g16_matmuls(dev, dx, k, 1, o, 3, acc));
		for (int i = 0; i < 3; i++)
			T_CU(dev, be->matmul(dev, dw[i], (uint32_t)m[i].dt, m[i].n, k, db[i], o[i].b_dtype,
			    dx, 1, dy1[i], acc));
		for (int i = 0; i < 3; i++) {
			float *got = malloc(m[i].n * 4), *one = malloc(m[i].n * 4);
			float *want = calloc(m[i].n, 4);
			T_ASSERT(got && one && want);
			T_CU(dev, be->sync(dev));
			T_CU(dev, be->copy_d2h(dev, got, dy[i], m[i].n * 4));
			T_CU(dev, be->copy_d2h(dev, one, dy1[i], m[i].n * 4));
			T_ASSERT_MSG(memcmp(got, one, m[i].n * 4) == 0,
			    "matmuls output %d (acc %d): not the bits of its own matmul", i, acc);
			if (!acc) {
				T_OK(host_op_matmul(NULL, H(w[i]), (uint32_t)m[i].dt, m[i].n, k, H(b[i]),
				    o[i].b_dtype, H(x), 1, H(want), 0));
				double md = 0, mw = 1;
				for (uint32_t j = 0; j < m[i].n; j++) {
					md = fmax(md, fabs((double)got[j] - want[j]));
					mw = fmax(mw, fabs(want[j]));
				}
				T_ASSERT_MSG(md / mw <= 2e-5, "matmuls output %d: %.3g of the scale", i, md / mw);
			}
			free(got), free(one), free(want);
		}
	}
	/* declined: weights off 16 bytes, 4 outputs, 2 rows, x off 16 bytes */
	struct cuda_g16_out bad[4] = { o[0], o[1], o[2], o[0] };
	bad[1].w += 2;
	T_EQ_INT(cuda_g16_matmuls(dev, dx, k, 1, bad, 3, 0), CUDA_TC_FALLBACK);
	T_EQ_INT(cuda_g16_matmuls(dev, dx, k, 1, o, 4, 0), CUDA_TC_FALLBACK);
	T_EQ_INT(cuda_g16_matmuls(dev, dx, k, 2, o, 3, 0), CUDA_TC_FALLBACK);
	T_EQ_INT(cuda_g16_matmuls(dev, dx + 4, k - 8, 1, o, 3, 0), CUDA_TC_FALLBACK);
	for (int i = 0; i < 3; i++) {
		be->free(dev, dw[i]), be->free(dev, dy[i]), be->free(dev, dy1[i]);
		if (db[i])
			be->free(dev, db[i]);
		free(w[i]), free(b[i]);
	}
	be->free(dev, dx);
	free(x);
	be->close(dev);

	T_ASSERT(setenv("BATON_CUDA_EXACT", "1", 1) == 0); /* off: the exact kernels */
	dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_EXACT");
	struct cuda_g16_out none = { .w = 0x100000, .y = 0x200000, .w_dtype = BATON_DT_BF16, .n_out = 1 };
	T_EQ_INT(cuda_g16_matmuls(dev, 0x300000, 256, 1, &none, 1, 0), CUDA_TC_FALLBACK);
	be->close(dev);
}

static void t_experts16(void)
{
	/* Qwen3-30B-A3B's expert shape (2,048 x 768, top-8): gate_up's two
	 * rounds of loads, down's pairs walked as one run of chunks */
	check_layer(BATON_DT_BF16, 1, 2048, 768, 16, 8, 0);
	check_layer(BATON_DT_F16, 1, 2048, 768, 16, 8, 0);
	/* small: every load in the tail loops; top-k of 1 and of 32 */
	check_layer(BATON_DT_BF16, 1, 512, 128, 32, 8, 0);
	check_layer(BATON_DT_BF16, 1, 256, 64, 8, 1, 0);
	check_layer(BATON_DT_F16, 1, 256, 40, 40, 32, 0);
	/* misaligned parts: moe.cu's kernels, moe_experts' bits */
	check_layer(BATON_DT_BF16, 1, 256, 96, 8, 4, 1);
}

/* ---- figures (assert nothing) ------------------------------------------------ */

static double time_mm(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k)
{
	baton_dptr w, x, y;
	const uint64_t wb = 2ull * k * n_out;
	T_CU(dev, be->alloc(dev, wb, &w));
	T_CU(dev, be->alloc(dev, (uint64_t)k * 4, &x));
	T_CU(dev, be->alloc(dev, (uint64_t)n_out * 4, &y));
	T_CU(dev, be->matmul(dev, w, (uint32_t)dt, n_out, k, 0, 0, x, 1, y, 0));
	T_CU(dev, be->sync(dev));
	const int reps = 50;
	const double t0 = baton_now_s();
	for (int i = 0; i < reps; i++)
		T_CU(dev, be->matmul(dev, w, (uint32_t)dt, n_out, k, 0, 0, x, 1, y, 0));
	T_CU(dev, be->sync(dev));
	const double t = (baton_now_s() - t0) / reps;
	be->free(dev, w), be->free(dev, x), be->free(dev, y);
	return t;
}

/* Qwen3-30B-A3B's batch-1 shapes in bf16: each matmul's time and GB/s of
 * weights (calls back to back: launch latency hides behind the previous
 * kernel), and a decode step's experts (top-8 of 16 blobs, the ids
 * rotating so that no call finds the last one's rows in L2). */
static void perf16(const char *sfx)
{
	struct baton_dev *dev = cuda_fixture_open();
	static const struct {
		const char *name;
		uint32_t n, k;
	} mm[] = { { "head", 151936, 2048 }, { "q", 4096, 2048 }, { "kv", 512, 2048 },
		{ "o", 2048, 4096 }, { "router", 128, 2048 } };
	char name[80];
	for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
		const double t = time_mm(dev, BATON_DT_BF16, mm[i].n, mm[i].k);
		snprintf(name, sizeof name, "g16_%s_bf16%s_us", mm[i].name, sfx);
		fig(name, t * 1e6, "us");
		snprintf(name, sizeof name, "g16_%s_bf16%s_GB/s", mm[i].name, sfx);
		fig(name, 2.0 * mm[i].n * mm[i].k / t / 1e9, "GB/s");
	}
	{ /* q, k and v: three launches, then one */
		baton_dptr w[3], y[3], x;
		const uint32_t n[3] = { 4096, 512, 512 }, k = 2048;
		struct cuda_g16_out o[3];
		T_CU(dev, be->alloc(dev, k * 4, &x));
		for (int i = 0; i < 3; i++) {
			T_CU(dev, be->alloc(dev, 2ull * k * n[i], &w[i]));
			T_CU(dev, be->alloc(dev, n[i] * 4, &y[i]));
			o[i] = (struct cuda_g16_out){ .w = w[i], .y = y[i], .w_dtype = BATON_DT_BF16,
				.n_out = n[i] };
		}
		for (int one = 0; one < 2; one++) {
			const int reps = 50;
			T_CU(dev, be->sync(dev));
			const double t0 = baton_now_s();
			for (int r = 0; r < reps; r++) {
				if (one) {
					const int rc = cuda_g16_matmuls(dev, x, k, 1, o, 3, 0);
					if (rc == CUDA_TC_FALLBACK) /* BATON_CUDA_EXACT=1 */
						for (int i = 0; i < 3; i++)
							T_CU(dev, be->matmul(dev, w[i], BATON_DT_BF16, n[i], k, 0, 0, x, 1,
							    y[i], 0));
					else
						T_CU(dev, rc);
				} else {
					for (int i = 0; i < 3; i++)
						T_CU(dev, be->matmul(dev, w[i], BATON_DT_BF16, n[i], k, 0, 0, x, 1, y[i],
						    0));
				}
			}
			T_CU(dev, be->sync(dev));
			snprintf(name, sizeof name, "g16_qkv_%s_bf16%s_us", one ? "one_launch" : "three",
			    sfx);
			fig(name, (baton_now_s() - t0) / reps * 1e6, "us");
		}
		for (int i = 0; i < 3; i++)
			be->free(dev, w[i]), be->free(dev, y[i]);
		be->free(dev, x);
	}
	enum { E = 16, K = 8, D = 2048, F = 768 };
	const uint64_t part = 2ull * D * F, blob = 3 * part, stride = (blob + 4095) & ~4095ull;
	baton_dptr blobs, x, xn, tab, sel;
	T_CU(dev, be->alloc(dev, E * stride, &blobs));
	T_CU(dev, be->alloc(dev, D * 4, &x));
	T_CU(dev, be->alloc(dev, D * 4, &xn));
	T_CU(dev, be->alloc(dev, E * 8, &tab));
	T_CU(dev, be->alloc(dev, 2 * K * 8 * 2, &sel));
	uint16_t *hb = malloc(blob);
	float *hx = malloc(D * 4);
	T_ASSERT(hb && hx);
	for (uint64_t i = 0; i < blob / 2; i++)
		hb[i] = baton_f32_to_bf16(frand() * 0.05f);
	for (uint32_t i = 0; i < D; i++)
		hx[i] = frand();
	uint64_t ht[E];
	uint32_t hs[2][2 * K]; /* two selections: ids then weights' bits */
	for (uint32_t e = 0; e < E; e++) {
		ht[e] = blobs + e * stride;
		struct baton_copy c = { blobs + e * stride, hb, blob };
		T_CU(dev, be->copy_h2d(dev, &c, 1));
	}
	for (int s = 0; s < 2; s++)
		for (uint32_t k = 0; k < K; k++) {
			const float w = 1.0f / K;
			hs[s][k] = (uint32_t)s * K + k;
			memcpy(&hs[s][K + k], &w, 4);
		}
	struct baton_copy c[4] = { { tab, ht, sizeof ht }, { sel, hs, sizeof hs }, { x, hx, D * 4 },
		{ xn, hx, D * 4 } };
	T_CU(dev, be->copy_h2d(dev, c, 4));
	struct baton_moe_layer l = { .batch = 1, .d_model = D, .d_ff = F, .n_experts = E, .top_k = K,
		.x = x, .xn = xn, .gate_dtype = BATON_DT_BF16, .up_dtype = BATON_DT_BF16,
		.down_dtype = BATON_DT_BF16, .gate_off = 0, .up_off = part, .down_off = 2 * part };
	T_CU(dev, be->moe_experts_dev(dev, &l, tab, sel, sel + K * 4));
	T_CU(dev, be->sync(dev));
	const int reps = 50;
	const double t0 = baton_now_s();
	for (int i = 0; i < reps; i++) {
		const baton_dptr si = sel + (uint64_t)(i & 1) * 2 * K * 4;
		T_CU(dev, be->moe_experts_dev(dev, &l, tab, si, si + K * 4));
	}
	T_CU(dev, be->sync(dev));
	const double t = (baton_now_s() - t0) / reps;
	snprintf(name, sizeof name, "g16_experts_top8_bf16%s_us", sfx);
	fig(name, t * 1e6, "us");
	snprintf(name, sizeof name, "g16_experts_top8_bf16%s_GB/s", sfx);
	fig(name, (double)K * blob / t / 1e9, "GB/s");
	be->free(dev, blobs), be->free(dev, x), be->free(dev, xn), be->free(dev, tab);
	be->free(dev, sel);
	free(hb), free(hx);
	be->close(dev);
}

/* the path, then the exact kernels it replaces (BATON_CUDA_EXACT=1) */
static void t_perf16(void)
{
	perf16("");
	T_ASSERT(setenv("BATON_CUDA_EXACT", "1", 1) == 0);
	perf16("_exact");
	unsetenv("BATON_CUDA_EXACT");
}

T_MAIN(T_CASE(t_matmul16), T_CASE(t_matmuls16), T_CASE_TIMEOUT(t_experts16, 120), T_CASE_TIMEOUT(t_perf16, 60))
