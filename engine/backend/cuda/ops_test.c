/*
 * ops_test.c: the cuda backend's forward-pass row ops and routing
 * (engine/backend/cuda/ops.cu, route.cu) against the host backend's
 * (engine/backend/host/ops.c, the reference), on random data, through the
 * backend table as the model calls them; and their refusals. Attention is
 * ops_attn_test.c's, the tensor-core path ops_tc_test.c's (the helpers of
 * all three: cuda_ops_fixture.h). Built only with CUDA=1; without a
 * driver or a device every case prints "skip: why" and passes.
 *
 * What must agree how:
 *   - embed, rmsnorm and matmul (with BATON_CUDA_EXACT=1): bit for bit, for every dtype the backend
 *     computes (f32, f16, bf16, q8_0, q4_K, q5_K, q6_K and arena/quant.c's
 *     q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, q2_K, q3_K, iq4_xs), with and without
 *     a tail of cols % 32, bias and accumulate: the weights decode exactly
 *     and the dots keep host/host.h's order (ops.h), divisions and
 *     square roots are IEEE on both sides.
 *   - route: bit for bit (the same host code chooses, on copied logits);
 *     route_dev and router_route_dev (the post-norm, router and route
 *     fused) too.
 *   - qk_norm_rope: bit for bit the rmsnorm and rope it fuses (this
 *     backend's), within rope's 1e-6 of the host's.
 *   - rope, swiglu, add: within 1e-6 of the magnitude, since the device's
 *     expf, sinf and cosf are not glibc's (CUDA's guide: 2 ulp at most,
 *     1.2e-7 each); a wrong index or formula is off by O(1).
 *     The figures print the largest difference.
 *   - matmul at batch 1 on q4_K / q6_K by default (mmvq.cu, the activation
 *     as int8 blocks): within 2e-5 of the host's on the activation
 *     quantized the same way, within 2e-2 of the host's on x, the same
 *     bits twice (t_matmul_fast); after a one-row rmsnorm, whose kernel
 *     quantizes its output itself, the bits of the separate quantization.
 * t_perf prints timings at Qwen3-30B-A3B's shapes (docs/internals/cuda-ops.md has an
 * H200's); it asserts nothing.
 */
#include <math.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/cuda/cuda_ops_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

/* ---- bit for bit ----------------------------------------------------------- */

static void t_matmul(void)
{
	/* the exact path: the tensor cores (t_tensor_cores) would take the
	 * calls of 64 rows and more */
	T_ASSERT(setenv("BATON_CUDA_GEMM", "0", 1) == 0);
	T_ASSERT(setenv("BATON_CUDA_EXACT", "1", 1) == 0); /* not mmvq.cu at batch 1 */
	struct baton_dev *dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_GEMM");
	unsetenv("BATON_CUDA_EXACT");
	for (size_t i = 0; i < N_DTS; i++) {
		const int dt = DTS[i];
		const int plain = dt == BATON_DT_F32 || dt == BATON_DT_F16 || dt == BATON_DT_BF16;
		/* k = 96: no 16-byte loads; 512: with them (plain types) */
		const uint32_t ks[] = { 96, 512 };
		for (int j = blk256(dt) ? 1 : 0; j < 2; j++) {
			const uint32_t k = ks[j];
			matmul_case(dev, dt, 37, k, 1, -1, 0);
			matmul_case(dev, dt, 37, k, 11, BATON_DT_F32, 0); /* two groups of 8 rows */
			matmul_case(dev, dt, 9, k, 3, BATON_DT_BF16, 1);
		}
		if (plain) {
			matmul_case(dev, dt, 21, 77, 5, -1, 1); /* a tail of 13 */
			/* prefill-sized calls: many groups of 8 rows and a part
			 * group, with bias, and accumulating */
			matmul_case(dev, dt, 37, 512, 70, BATON_DT_F32, 0);
			matmul_case(dev, dt, 70, 256, 65, -1, 1);
			/* the other kernels: byte loads, typed loads without vectors */
			matmul_case_at(dev, dt, 21, 512, 9, -1, 0, 1);
			matmul_case_at(dev, dt, 21, 512, 1, -1, 0, dt == BATON_DT_F32 ? 4 : 2);
			/* one row: the MoE router's shape (f32: all 16 chunks of a
			 * round in flight), and a round and a part */
			matmul_case(dev, dt, 128, 2048, 1, -1, 0);
			matmul_case(dev, dt, 19, 2560, 1, BATON_DT_F32, 1);
		} else {
			matmul_case_at(dev, dt, 21, blk256(dt) ? 512 : 96, 9, -1, 0, 1);
			/* blocks beyond one round of the kernel's loads (4 K-quant
			 * blocks, 32 q8_0 blocks in groups of 8) and a remainder,
			 * at odd addresses too */
			const uint32_t kl = blk256(dt) ? 1280 : 1088;
			matmul_case(dev, dt, 19, kl, 1, -1, 0);
			matmul_case(dev, dt, 19, kl, 11, BATON_DT_F32, 1);
			matmul_case_at(dev, dt, 19, kl, 3, -1, 0, 3);
		}
	}
	be->close(dev);
}

/* ---- the quantized batch-1 path (mmvq.cu) ---------------------------------- */

/* x as mmvq.cu quantizes it, back in f32: blocks of 32, d = max |x| / 127,
 * q = x / d rounded to nearest even (IEEE on both sides), clamped. */
static void quant_q8(const float *x, float *xq, size_t n)
{
	for (size_t b = 0; b < n; b += 32) {
		float m = 0;
		for (size_t i = b; i < b + 32; i++)
			m = fmaxf(m, fabsf(x[i]));
		const float d = m / 127.0f;
		for (size_t i = b; i < b + 32; i++) {
			float q = m > 0 ? nearbyintf(x[i] / d) : 0;
			q = q > 127 ? 127 : q < -127 ? -127 : q;
			xq[i] = q * d;
		}
	}
}

/* One batch-1 matmul on the fast path against the host's on x quantized
 * as above: the same products, summed in another order, so within
 * 2e-5 of the scale; against the host on x itself within 2e-2 (the
 * activation's 8 bits). Twice: the same bits. off: the weights' offset
 * in their buffer (q6_K's 2: still the fast path; 1: the exact one). */
static void matmul_fast_case(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k,
    int bias_dt, int acc, uint32_t off)
{
	uint64_t wb, bb = 0;
	uint8_t *w = weights(dt, n_out, k, &wb);
	uint8_t *b = bias_dt >= 0 ? weights(bias_dt, 1, n_out, &bb) : NULL;
	float *x = rvec(k), *xq = malloc((size_t)k * 4), *y = rvec(n_out);
	float *y0 = malloc((size_t)n_out * 4), *yq = malloc((size_t)n_out * 4);
	float *got = malloc((size_t)n_out * 4), *got2 = malloc((size_t)n_out * 4);
	T_ASSERT(xq && y0 && yq && got && got2);
	for (uint32_t i = 0; i < k; i++)
		x[i] *= 1.0f + (float)(i % 7); /* blocks of unequal scale */
	quant_q8(x, xq, k);
	memcpy(y0, y, (size_t)n_out * 4);
	memcpy(yq, y, (size_t)n_out * 4);
	baton_dptr dw0 = 0, dw, dx = up(dev, x, (uint64_t)k * 4);
	T_CU(dev, be->alloc(dev, wb + 16, &dw0));
	dw = dw0 + off;
	struct baton_copy wc = { dw, w, wb };
	T_CU(dev, be->copy_h2d(dev, &wc, 1));
	baton_dptr dy = up(dev, y, (uint64_t)n_out * 4), db = b ? up(dev, b, bb) : 0;
	for (int run = 0; run < 2; run++) {
		struct baton_copy yc = { dy, y, (uint64_t)n_out * 4 };
		T_CU(dev, be->copy_h2d(dev, &yc, 1));
		T_CU(dev, be->matmul(dev, dw, (uint32_t)dt, n_out, k, db, (uint32_t)(b ? bias_dt : 0),
		    dx, 1, dy, acc));
		down(dev, run ? got2 : got, dy, (uint64_t)n_out * 4);
	}
	T_ASSERT_MSG(memcmp(got, got2, (size_t)n_out * 4) == 0, "%s fast matmul: two runs differ",
	    baton_dtype_name(dt));
	T_OK(host_op_matmul(NULL, H(w), (uint32_t)dt, n_out, k, H(b), (uint32_t)(b ? bias_dt : 0),
	    H(x), 1, H(y0), acc));
	T_OK(host_op_matmul(NULL, H(w), (uint32_t)dt, n_out, k, H(b), (uint32_t)(b ? bias_dt : 0),
	    H(xq), 1, H(yq), acc));
	char what[80];
	snprintf(what, sizeof what, "mmvq %s n=%u k=%u off=%u", baton_dtype_name(dt), n_out, k, off);
	if (off % (dt == BATON_DT_Q4_K ? 4 : 2)) {
		same_bits(got, y0, n_out, what); /* misaligned: the exact kernels */
	} else {
		close_to(got, yq, n_out, 2e-5, what);
		snprintf(what, sizeof what, "mmvq %s n=%u k=%u vs f32 x", baton_dtype_name(dt), n_out, k);
		close_to(got, y0, n_out, 2e-2, what);
	}
	be->free(dev, dw0), be->free(dev, dx), be->free(dev, dy);
	if (db)
		be->free(dev, db);
	free(w), free(b), free(x), free(xq), free(y), free(y0), free(yq), free(got), free(got2);
}

/* matmuls: three matrices over one x (attention's q, k and v: q4_K,
 * q4_K with a bias, q6_K at a 2-byte offset), at 1 row one launch: each
 * output the bits of its own matmul call; at 3 rows (matmul per matrix)
 * the same; with a matrix the quantized path does not take (f32) the
 * bits of the three calls too; overlapping outputs refused, nothing
 * written. */
static void t_matmuls(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t k = 2048, no[3] = { 300, 64, 64 }, R = 3;
	const int dts[2][3] = { { BATON_DT_Q4_K, BATON_DT_Q4_K, BATON_DT_Q6_K },
		{ BATON_DT_Q4_K, BATON_DT_F32, BATON_DT_Q6_K } };
	uint64_t bb;
	uint8_t *bias = weights(BATON_DT_F32, 1, no[1], &bb);
	baton_dptr dbias = up(dev, bias, bb);
	float *x = rvec((size_t)R * k);
	baton_dptr dx = up(dev, x, (uint64_t)R * k * 4);
	for (int c = 0; c < 2; c++) {
		baton_dptr dw0[3], dw[3], dy[3], dz[3];
		uint8_t *w[3];
		struct baton_matmuls mm = { .x = dx, .k = k, .n = 3 };
		for (int i = 0; i < 3; i++) {
			uint64_t wb;
			w[i] = weights(dts[c][i], no[i], k, &wb);
			const uint32_t off = dts[c][i] == BATON_DT_Q6_K ? 2 : 0;
			T_CU(dev, be->alloc(dev, wb + 16, &dw0[i]));
			dw[i] = dw0[i] + off;
			struct baton_copy wc = { dw[i], w[i], wb };
			T_CU(dev, be->copy_h2d(dev, &wc, 1));
			T_CU(dev, be->alloc(dev, (uint64_t)R * no[i] * 4, &dy[i]));
			T_CU(dev, be->alloc(dev, (uint64_t)R * no[i] * 4, &dz[i]));
			mm.m[i] = (struct baton_matmul_out){ .w = dw[i], .b = i == 1 ? dbias : 0,
				.y = dy[i], .w_dtype = (uint32_t)dts[c][i], .b_dtype = BATON_DT_F32,
				.n_out = no[i] };
		}
		for (uint32_t rows = 1; rows <= R; rows += R - 1) {
			mm.rows = rows;
			T_CU(dev, be->matmuls(dev, &mm));
			for (int i = 0; i < 3; i++)
				T_CU(dev, be->matmul(dev, dw[i], (uint32_t)dts[c][i], no[i], k, mm.m[i].b,
				    BATON_DT_F32, dx, rows, dz[i], 0));
			for (int i = 0; i < 3; i++) {
				const size_t n = (size_t)rows * no[i];
				float *a = malloc(n * 4), *b = malloc(n * 4);
				T_ASSERT(a && b);
				down(dev, a, dy[i], n * 4);
				down(dev, b, dz[i], n * 4);
				char what[64];
				snprintf(what, sizeof what, "matmuls case %d, %u rows, matrix %d", c, rows, i);
				same_bits(a, b, n, what);
				free(a), free(b);
			}
		}
		/* refused: k's output over q's */
		float *before = malloc((size_t)no[0] * 4), *after = malloc((size_t)no[0] * 4);
		T_ASSERT(before && after);
		mm.rows = 1;
		down(dev, before, dy[0], (uint64_t)no[0] * 4);
		mm.m[1].y = dy[0] + 16;
		T_EQ_ERR(be->matmuls(dev, &mm), BATON_EINVAL);
		mm.n = 0;
		mm.m[1].y = dy[1];
		T_EQ_ERR(be->matmuls(dev, &mm), BATON_EINVAL);
		down(dev, after, dy[0], (uint64_t)no[0] * 4);
		T_ASSERT(memcmp(before, after, (size_t)no[0] * 4) == 0);
		free(before), free(after);
		for (int i = 0; i < 3; i++) {
			be->free(dev, dw0[i]), be->free(dev, dy[i]), be->free(dev, dz[i]);
			free(w[i]);
		}
	}
	be->free(dev, dbias), be->free(dev, dx);
	free(bias), free(x);
	be->close(dev);
}

/* rmsnorm_matmuls (the input norm and q/k/v in one call: rmsnorm_row and
 * the GEMVs at batch 1): the bits of rmsnorm then matmuls, for k 2,048 and 4,096, norm weights
 * f32, bf16 and none, q4_K and q6_K matrices (one with a bias) whose row
 * counts are not multiples of the kernel's 8 rows a block; several rows
 * (not fused: the two calls) too. */
static void t_rmsnorm_matmuls(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t ks[2] = { 2048, 4096 }, no[3] = { 300, 61, 64 }, R = 2;
	const int dts[3] = { BATON_DT_Q4_K, BATON_DT_Q6_K, BATON_DT_Q4_K };
	const int nds[3] = { BATON_DT_F32, BATON_DT_BF16, -1 };
	uint64_t bb;
	uint8_t *bias = weights(BATON_DT_F32, 1, no[1], &bb);
	baton_dptr dbias = up(dev, bias, bb);
	T_ASSERT(be->rmsnorm_matmuls);
	for (int kc = 0; kc < 2; kc++) {
		const uint32_t k = ks[kc];
		float *x = rvec((size_t)R * k);
		for (size_t i = 0; i < (size_t)R * k; i++)
			x[i] *= 3.0f;
		baton_dptr dx = up(dev, x, (uint64_t)R * k * 4), dxn, dxn2;
		T_CU(dev, be->alloc(dev, (uint64_t)R * k * 4, &dxn));
		T_CU(dev, be->alloc(dev, (uint64_t)R * k * 4, &dxn2));
		baton_dptr dw0[3], dw[3], dy[3], dz[3];
		uint8_t *w[3];
		struct baton_matmuls mm = { .x = dxn, .k = k, .n = 3 };
		for (int i = 0; i < 3; i++) {
			uint64_t wb;
			w[i] = weights(dts[i], no[i], k, &wb);
			const uint32_t off = dts[i] == BATON_DT_Q6_K ? 2 : 0;
			T_CU(dev, be->alloc(dev, wb + 16, &dw0[i]));
			dw[i] = dw0[i] + off;
			struct baton_copy wc = { dw[i], w[i], wb };
			T_CU(dev, be->copy_h2d(dev, &wc, 1));
			T_CU(dev, be->alloc(dev, (uint64_t)R * no[i] * 4, &dy[i]));
			T_CU(dev, be->alloc(dev, (uint64_t)R * no[i] * 4, &dz[i]));
			mm.m[i] = (struct baton_matmul_out){ .w = dw[i], .b = i == 1 ? dbias : 0,
				.y = dy[i], .w_dtype = (uint32_t)dts[i], .b_dtype = BATON_DT_F32,
				.n_out = no[i] };
		}
		for (int nc = 0; nc < 3; nc++) {
			uint64_t nb = 0;
			uint8_t *nw = nds[nc] >= 0 ? weights(nds[nc], 1, k, &nb) : NULL;
			if (nw && nds[nc] == BATON_DT_BF16) /* near 1, as norms are */
				for (uint32_t i = 0; i < k; i++) {
					const uint16_t h = baton_f32_to_bf16(1.0f + frand() / 4);
					memcpy(nw + 2 * i, &h, 2);
				}
			const baton_dptr dnw = nw ? up(dev, nw, nb) : 0;
			const uint32_t ndt = nds[nc] >= 0 ? (uint32_t)nds[nc] : 0;
			for (uint32_t rows = 1; rows <= R; rows++) {
				mm.rows = rows;
				struct baton_matmuls m2 = mm;
				m2.x = dxn2;
				for (int i = 0; i < 3; i++)
					m2.m[i].y = dz[i];
				T_CU(dev, be->rmsnorm_matmuls(dev, dx, dnw, ndt, 1e-6f, &mm));
				T_CU(dev, be->rmsnorm(dev, dx, dxn2, rows, k, dnw, ndt, 1e-6f));
				T_CU(dev, be->matmuls(dev, &m2));
				for (int i = 0; i < 3; i++) {
					const size_t n = (size_t)rows * no[i];
					float *a = malloc(n * 4), *b = malloc(n * 4);
					T_ASSERT(a && b);
					down(dev, a, dy[i], n * 4);
					down(dev, b, dz[i], n * 4);
					char what[96];
					snprintf(what, sizeof what, "rmsnorm_matmuls k %u, norm %d, %u rows, matrix %d",
					    k, nc, rows, i);
					same_bits(a, b, n, what);
					free(a), free(b);
				}
			}
			if (dnw)
				be->free(dev, dnw);
			free(nw);
		}
		/* refused, nothing written: an output over x */
		mm.rows = 1;
		struct baton_matmuls bad = mm;
		bad.m[2].y = dx;
		T_EQ_ERR(be->rmsnorm_matmuls(dev, dx, 0, 0, 1e-6f, &bad), BATON_EINVAL);
		for (int i = 0; i < 3; i++) {
			be->free(dev, dw0[i]), be->free(dev, dy[i]), be->free(dev, dz[i]);
			free(w[i]);
		}
		be->free(dev, dx), be->free(dev, dxn), be->free(dev, dxn2);
		free(x);
	}
	be->free(dev, dbias);
	free(bias);
	be->close(dev);
}

static void t_matmul_fast(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const int dts[] = { BATON_DT_Q4_K, BATON_DT_Q6_K };
	for (size_t i = 0; i < 2; i++) {
		const int dt = dts[i];
		/* rows of 1, 3, 8 and 16 blocks (a row's 32, 64 and 128
		 * threads, and a row that loops), bias, accumulate, rows not a
		 * multiple of a block's */
		matmul_fast_case(dev, dt, 37, 256, -1, 0, 0);
		matmul_fast_case(dev, dt, 37, 768, BATON_DT_F32, 0, 0);
		matmul_fast_case(dev, dt, 301, 2048, -1, 1, 0);
		matmul_fast_case(dev, dt, 19, 4096, BATON_DT_BF16, 1, 0);
		matmul_fast_case(dev, dt, 19, 512, -1, 0, 2);
		matmul_fast_case(dev, dt, 19, 512, -1, 0, 1);
	}
	/* q, k and v of one x share its quantization; a changed x after
	 * another launch is quantized anew */
	uint64_t wb;
	const uint32_t k = 512, n = 64;
	uint8_t *w = weights(BATON_DT_Q4_K, n, k, &wb);
	float *x = rvec(k), *x2 = rvec(k), *xq = malloc(k * 4), *want = calloc(n, 4);
	float *got = malloc(n * 4);
	T_ASSERT(xq && want && got);
	baton_dptr dw = up(dev, w, wb), dx = up(dev, x, k * 4), dy = 0, dy2 = 0;
	T_CU(dev, be->alloc(dev, n * 4, &dy));
	T_CU(dev, be->alloc(dev, n * 4, &dy2));
	T_CU(dev, be->matmul(dev, dw, BATON_DT_Q4_K, n, k, 0, 0, dx, 1, dy, 0));
	T_CU(dev, be->rmsnorm(dev, dx, dx, 1, k, 0, 0, 1e-6f)); /* another launch writes x */
	T_CU(dev, be->matmul(dev, dw, BATON_DT_Q4_K, n, k, 0, 0, dx, 1, dy2, 0));
	down(dev, x2, dx, k * 4);
	down(dev, got, dy2, n * 4);
	quant_q8(x2, xq, k);
	T_OK(host_op_matmul(NULL, H(w), BATON_DT_Q4_K, n, k, 0, 0, H(xq), 1, H(want), 0));
	close_to(got, want, n, 2e-5, "mmvq after x changed");
	be->free(dev, dw), be->free(dev, dx), be->free(dev, dy), be->free(dev, dy2);
	free(w), free(x), free(x2), free(xq), free(want), free(got);

	/* a one-row 2,048-wide rmsnorm leaves its output quantized by its own
	 * kernel for the matmul right after it: the bits of the matmul that
	 * quantizes the same xn itself (after another launch), and within
	 * 2e-5 of the host's on xn quantized as mmvq.cu does */
	const uint32_t k2 = 2048, n2 = 96;
	uint64_t wb2, nb;
	uint8_t *w2 = weights(BATON_DT_Q6_K, n2, k2, &wb2), *nw = weights(BATON_DT_F32, 1, k2, &nb);
	float *xr = rvec(k2), *xn = malloc(k2 * 4), *xnq = malloc(k2 * 4), *ya = malloc(n2 * 4);
	float *yb = malloc(n2 * 4), *yw = calloc(n2, 4);
	T_ASSERT(xn && xnq && ya && yb && yw);
	for (uint32_t i = 0; i < k2; i++)
		xr[i] *= 1.0f + (float)(i % 5);
	baton_dptr dw2 = up(dev, w2, wb2), dnw = up(dev, nw, nb), dxr = up(dev, xr, k2 * 4);
	baton_dptr dn = 0, dya = 0, dyb = 0, dsc = up(dev, xr, 64 * 4);
	T_CU(dev, be->alloc(dev, k2 * 4, &dn));
	T_CU(dev, be->alloc(dev, n2 * 4, &dya));
	T_CU(dev, be->alloc(dev, n2 * 4, &dyb));
	T_CU(dev, be->rmsnorm(dev, dxr, dn, 1, k2, dnw, BATON_DT_F32, 1e-6f));
	T_CU(dev, be->matmul(dev, dw2, BATON_DT_Q6_K, n2, k2, 0, 0, dn, 1, dya, 0));
	T_CU(dev, be->rmsnorm(dev, dsc, dsc, 1, 64, 0, 0, 1e-6f)); /* another launch, not on dn */
	T_CU(dev, be->matmul(dev, dw2, BATON_DT_Q6_K, n2, k2, 0, 0, dn, 1, dyb, 0));
	down(dev, xn, dn, k2 * 4);
	down(dev, ya, dya, n2 * 4);
	down(dev, yb, dyb, n2 * 4);
	same_bits(ya, yb, n2, "mmvq on the norm's own quantization");
	quant_q8(xn, xnq, k2);
	T_OK(host_op_matmul(NULL, H(w2), BATON_DT_Q6_K, n2, k2, 0, 0, H(xnq), 1, H(yw), 0));
	close_to(ya, yw, n2, 2e-5, "mmvq after a one-row rmsnorm");
	be->free(dev, dw2), be->free(dev, dnw), be->free(dev, dxr), be->free(dev, dsc);
	be->free(dev, dn), be->free(dev, dya), be->free(dev, dyb);
	free(w2), free(nw), free(xr), free(xn), free(xnq), free(ya), free(yb), free(yw);
	be->close(dev);
}

static void t_embed_rmsnorm(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t tokens[] = { 3, 0, 15, 3, 9 }, n = 5, V = 16;
	for (size_t i = 0; i < N_DTS; i++) {
		const int dt = DTS[i];
		const uint32_t C = blk256(dt) ? 256 : 64;
		uint64_t tb;
		uint8_t *table = weights(dt, V, C, &tb);
		float *got = malloc((size_t)n * C * 4), *want = malloc((size_t)n * C * 4);
		T_ASSERT(got && want);
		baton_dptr dt_ = up(dev, table, tb), dout = 0;
		T_CU(dev, be->alloc(dev, (uint64_t)n * C * 4, &dout));
		T_CU(dev, be->embed(dev, dt_, (uint32_t)dt, V, C, tokens, n, dout));
		down(dev, got, dout, (uint64_t)n * C * 4);
		T_OK(host_op_embed(NULL, H(table), (uint32_t)dt, V, C, tokens, n, H(want)));
		same_bits(got, want, (size_t)n * C, baton_dtype_name(dt));
		be->free(dev, dt_), be->free(dev, dout);
		free(table), free(got), free(want);
	}
	/* rmsnorm: weights f32 / bf16 / none / f16 / bf16 at an odd address
	 * (elem()), cols with and without a tail, out of place and in place
	 * (per-head norms are rows of head_dim), 13 rows and 1 (decode); from
	 * 512 to 4,096 cols a block per row (baton_ops_rmsnorm_row), the
	 * same bits */
	const uint32_t colss[] = { 64, 70, 2048, 1030, 4096, 4100, 512, 768 };
	for (size_t c = 0; c < 8; c++)
		for (int wk = 0; wk < 5; wk++)
			for (int inplace = 0; inplace < 2; inplace++) {
				const uint32_t R = (c + wk + inplace) % 2 ? 1 : 13, C = colss[c];
				float *x = rvec((size_t)R * C), *want = malloc((size_t)R * C * 4);
				float *got = malloc((size_t)R * C * 4);
				T_ASSERT(want && got);
				for (size_t i = 0; i < (size_t)R * C; i++)
					x[i] *= 3.0f;
				uint64_t wb = 0;
				const int wdt = wk == 0 ? BATON_DT_F32 : wk == 3 ? BATON_DT_F16 : BATON_DT_BF16;
				uint8_t *w = wk != 2 ? weights(wdt, 1, C, &wb) : NULL;
				baton_dptr dw0 = 0, dw = 0;
				if (w) { /* wk 4: one byte past an aligned address */
					T_CU(dev, be->alloc(dev, wb + 16, &dw0));
					dw = dw0 + (wk == 4);
					struct baton_copy wc = { dw, w, wb };
					T_CU(dev, be->copy_h2d(dev, &wc, 1));
				}
				baton_dptr dx = up(dev, x, (uint64_t)R * C * 4);
				baton_dptr dout = dx;
				if (!inplace)
					T_CU(dev, be->alloc(dev, (uint64_t)R * C * 4, &dout));
				T_CU(dev, be->rmsnorm(dev, dx, dout, R, C, dw, (uint32_t)wdt, 1e-6f));
				down(dev, got, dout, (uint64_t)R * C * 4);
				T_OK(host_op_rmsnorm(NULL, H(x), H(want), R, C, H(w), (uint32_t)wdt, 1e-6f));
				char what[64];
				snprintf(what, sizeof what, "rmsnorm %ux%u w%d%s", R, C, wk,
				    inplace ? " in place" : "");
				same_bits(got, want, (size_t)R * C, what);
				be->free(dev, dx);
				if (dw0)
					be->free(dev, dw0);
				if (!inplace)
					be->free(dev, dout);
				free(x), free(want), free(got), free(w);
			}
	be->close(dev);
}

static void t_route(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	enum { R = 7, E = 60, K = 4 };
	float *l = rvec((size_t)R * E);
	l[5] = l[6] = l[7] = 2.0f; /* a tie in row 0 */
	l[E + 3] = NAN;            /* a NaN in row 1 */
	baton_dptr dl = up(dev, l, (uint64_t)R * E * 4);
	for (int rule = 0; rule < 2; rule++) {
		uint32_t ids[R * K], hid[R * K];
		float w[R * K], hw[R * K];
		T_CU(dev, be->route(dev, dl, R, E, K, rule, ids, w));
		T_OK(host_op_route(NULL, H(l), R, E, K, rule, hid, hw));
		T_ASSERT(memcmp(ids, hid, sizeof ids) == 0);
		same_bits(w, hw, R * K, "route weights");
		T_EQ_INT(ids[0], 5);
		T_EQ_INT(ids[1], 6);
	}
	be->free(dev, dl);
	free(l);
	/* route_dev: the same choice left on the device, bitwise the host's
	 * (its expf is glibc's): logits spread wide so expf sees arguments
	 * from 0 down past its underflow, ties and a NaN (which makes its
	 * row's weights NaN on both, not of one bit pattern), both rules */
	enum { R2 = 64, E2 = 128, K2 = 8 };
	float *l2 = rvec((size_t)R2 * E2);
	for (size_t i = 0; i < (size_t)R2 * E2; i++)
		l2[i] *= (float)(1 + i % 61);
	l2[9] = l2[10] = l2[11] = 500.0f;
	l2[E2 + 7] = NAN;
	baton_dptr dl2 = up(dev, l2, (uint64_t)R2 * E2 * 4), dout = 0;
	T_CU(dev, be->alloc(dev, (uint64_t)R2 * K2 * 8, &dout));
	for (int rule = 0; rule < 2; rule++) {
		uint32_t *ids = malloc(R2 * K2 * 4), *hid = malloc(R2 * K2 * 4);
		float *w = malloc(R2 * K2 * 4), *hw = malloc(R2 * K2 * 4);
		T_ASSERT(ids && hid && w && hw);
		T_CU(dev, be->route_dev(dev, dl2, R2, E2, K2, rule, dout, dout + R2 * K2 * 4));
		T_CU(dev, be->copy_d2h(dev, ids, dout, R2 * K2 * 4));
		T_CU(dev, be->copy_d2h(dev, w, dout + R2 * K2 * 4, R2 * K2 * 4));
		T_OK(host_op_route(NULL, H(l2), R2, E2, K2, rule, hid, hw));
		T_ASSERT(memcmp(ids, hid, R2 * K2 * 4) == 0);
		for (int k = 0; k < K2; k++) {
			T_ASSERT(isnan(w[K2 + k]) && isnan(hw[K2 + k]));
			w[K2 + k] = hw[K2 + k] = 0;
		}
		same_bits(w, hw, R2 * K2, "route_dev weights");
		T_EQ_INT(ids[0], 9);
		free(ids), free(hid), free(w), free(hw);
	}
	/* the three forms of the route kernel: E <= 128 (above) and <= 1,024
	 * from registers, more from shared memory; ties across lanes */
	static const uint32_t big[] = { 300, 2000 };
	enum { RB = 3, KB = 8 };
	for (size_t b = 0; b < 2; b++) {
		const uint32_t EB = big[b];
		float *lb = rvec((size_t)RB * EB);
		lb[40] = lb[200] = lb[233] = 9.0f; /* a three-way tie in row 0: two in one lane, one in the next */
		baton_dptr dlb = up(dev, lb, (uint64_t)RB * EB * 4);
		uint32_t gi[RB * KB], hi[RB * KB];
		float gw[RB * KB], hwb[RB * KB];
		for (int rule = 0; rule < 2; rule++) {
			T_CU(dev, be->route_dev(dev, dlb, RB, EB, KB, rule, dout, dout + RB * KB * 4));
			T_CU(dev, be->copy_d2h(dev, gi, dout, sizeof gi));
			T_CU(dev, be->copy_d2h(dev, gw, dout + RB * KB * 4, sizeof gw));
			T_OK(host_op_route(NULL, H(lb), RB, EB, KB, rule, hi, hwb));
			T_ASSERT(memcmp(gi, hi, sizeof gi) == 0);
			same_bits(gw, hwb, RB * KB, "route_dev weights, many experts");
			T_EQ_INT(gi[0], 40);
			T_EQ_INT(gi[1], 200);
			T_EQ_INT(gi[2], 233);
		}
		be->free(dev, dlb);
		free(lb);
	}
	T_EQ_ERR(be->route_dev(dev, dl2, R2, E2, K2, 2, dout, dout + R2 * K2 * 4), BATON_EINVAL);
	T_EQ_ERR(be->route_dev(dev, dl2, R2, E2, E2 + 1, 0, dout, dout + R2 * K2 * 4), BATON_EINVAL);
	T_EQ_ERR(be->route_dev(dev, dl2, R2, E2, K2, 0, dout, dout + 4), BATON_EINVAL); /* overlap */
	be->free(dev, dout);
	be->free(dev, dl2);
	free(l2);
	be->close(dev);
}

/* router_route_dev: the fused norm, router and route (one launch) give
 * the bits of the host's rmsnorm, matmul and route, row for row: 1, 3, 8
 * and 64 rows (one counter per row), 2,048- and 512-wide rows, 128 and 60
 * experts (an odd last block), top 8 and top 100 (the weights kept in w,
 * not shared memory), both rules, with the norm (f32 and bf16 weights,
 * none) and without, twice in a row (the counters go back to 0); 96-wide
 * rows (the fused kernel's loads of one weight a lane), and 200-wide ones
 * (k % 32 != 0) take the calls in turn. */
static void t_router_route(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	static const struct {
		uint32_t rows, k, E, K, norm_dt; /* norm_dt: 0 none, else the dtype + 1 */
	} cs[] = { { 1, 2048, 128, 8, BATON_DT_F32 + 1 }, { 1, 2048, 128, 8, 0 },
		   { 3, 2048, 128, 8, BATON_DT_BF16 + 1 }, { 8, 512, 60, 4, BATON_DT_F32 + 1 },
		   { 64, 512, 128, 8, 0 }, { 1, 2048, 128, 100, BATON_DT_F32 + 1 },
		   { 2, 96, 8, 2, BATON_DT_F32 + 1 }, { 2, 200, 128, 8, BATON_DT_F32 + 1 } };
	for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
		const uint32_t R = cs[c].rows, k = cs[c].k, E = cs[c].E, K = cs[c].K;
		for (int norm_on = 0; norm_on < 2; norm_on++) {
			float *w = rvec((size_t)E * k), *x = rvec((size_t)R * k), *nw = rvec(k);
			float *hxn = malloc((size_t)R * k * 4), *gxn = malloc((size_t)R * k * 4);
			float *hl = malloc((size_t)R * E * 4), *gl = malloc((size_t)R * E * 4);
			uint32_t *hid = malloc((size_t)R * K * 4), *gid = malloc((size_t)R * K * 4);
			float *hw = malloc((size_t)R * K * 4), *gw = malloc((size_t)R * K * 4);
			uint16_t *nb = malloc((size_t)k * 2);
			T_ASSERT(hxn && gxn && hl && gl && hid && gid && hw && gw && nb);
			const uint32_t ndt = cs[c].norm_dt ? cs[c].norm_dt - 1 : 0;
			for (uint32_t i = 0; i < k; i++) {
				nw[i] = 1.0f + 0.1f * nw[i];
				uint32_t b;
				memcpy(&b, &nw[i], 4);
				nb[i] = (uint16_t)(b >> 16);
				b &= 0xffff0000u; /* the bf16 weight's value, for f32 too */
				memcpy(&nw[i], &b, 4);
			}
			const void *nhost = ndt == BATON_DT_BF16 ? (const void *)nb : (const void *)nw;
			baton_dptr dw = up(dev, w, (uint64_t)E * k * 4), dx = up(dev, x, (uint64_t)R * k * 4);
			baton_dptr dn = up(dev, nhost, (uint64_t)k * (ndt == BATON_DT_BF16 ? 2 : 4));
			baton_dptr dxn = norm_on ? 0 : up(dev, x, (uint64_t)R * k * 4), dl = 0, dout = 0;
			if (norm_on)
				T_CU(dev, be->alloc(dev, (uint64_t)R * k * 4, &dxn));
			T_CU(dev, be->alloc(dev, (uint64_t)R * E * 4, &dl));
			T_CU(dev, be->alloc(dev, (uint64_t)R * K * 8, &dout));
			const baton_dptr hn = cs[c].norm_dt ? H(nhost) : 0;
			if (norm_on)
				T_OK(host_op_rmsnorm(NULL, H(x), H(hxn), R, k, hn, ndt, 1e-6f));
			else
				memcpy(hxn, x, (size_t)R * k * 4);
			T_OK(host_op_matmul(NULL, H(w), BATON_DT_F32, E, k, 0, 0, H(hxn), R, H(hl), 0));
			for (int rule = 0; rule < 2; rule++) {
				T_OK(host_op_route(NULL, H(hl), R, E, K, rule, hid, hw));
				struct baton_router_route rr = { .x = dx, .xn = dxn,
					.norm = cs[c].norm_dt ? dn : 0, .w = dw, .logits = dl, .ids = dout,
					.weights = dout + (uint64_t)R * K * 4, .norm_on = (uint32_t)norm_on,
					.norm_dtype = ndt, .w_dtype = BATON_DT_F32, .n_experts = E, .k = k,
					.rows = R, .top_k = K, .rule = rule, .eps = 1e-6f };
				for (int rep = 0; rep < 2; rep++) {
					T_CU(dev, be->router_route_dev(dev, &rr));
					T_CU(dev, be->copy_d2h(dev, gxn, dxn, (uint64_t)R * k * 4));
					T_CU(dev, be->copy_d2h(dev, gl, dl, (uint64_t)R * E * 4));
					T_CU(dev, be->copy_d2h(dev, gid, dout, (uint64_t)R * K * 4));
					T_CU(dev, be->copy_d2h(dev, gw, dout + (uint64_t)R * K * 4,
					    (uint64_t)R * K * 4));
					same_bits(gxn, hxn, (size_t)R * k, "router_route_dev xn");
					same_bits(gl, hl, (size_t)R * E, "router_route_dev logits");
					T_ASSERT(memcmp(gid, hid, (size_t)R * K * 4) == 0);
					same_bits(gw, hw, (size_t)R * K, "router_route_dev weights");
				}
				struct baton_router_route bad = rr;
				bad.rule = 2;
				T_EQ_ERR(be->router_route_dev(dev, &bad), BATON_EINVAL);
				bad = rr;
				bad.top_k = E + 1;
				T_EQ_ERR(be->router_route_dev(dev, &bad), BATON_EINVAL);
				bad = rr;
				bad.logits = dxn + 4; /* over xn */
				T_EQ_ERR(be->router_route_dev(dev, &bad), BATON_EINVAL);
				if (norm_on) {
					bad = rr;
					bad.xn = dx; /* in place: refused, not raced */
					T_EQ_ERR(be->router_route_dev(dev, &bad), BATON_EINVAL);
				}
			}
			be->free(dev, dout), be->free(dev, dl), be->free(dev, dx), be->free(dev, dw);
			be->free(dev, dn), be->free(dev, dxn);
			free(w), free(x), free(nw), free(nb), free(hxn), free(gxn), free(hl), free(gl);
			free(hid), free(gid), free(hw), free(gw);
		}
	}
	be->close(dev);
}

/* ---- within the device's expf / sinf / cosf ------------------------------ */

static void t_rope(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	enum { R = 4, NH = 3, HD = 64 };
	const uint32_t pos[] = { 0, 7, 1000, 40000 };
	float inv[HD / 2];
	for (uint32_t i = 0; i < HD / 2; i++)
		inv[i] = (float)pow(1e6, -(double)(2 * i) / HD);
	for (int s = 0; s < 2; s++) {
		const float mscale = s ? 0.7f : 1.0f;
		float *x = rvec((size_t)R * NH * HD), *got = malloc((size_t)R * NH * HD * 4);
		T_ASSERT(got);
		baton_dptr dx = up(dev, x, (uint64_t)R * NH * HD * 4);
		T_CU(dev, be->rope(dev, dx, R, NH, HD, pos, inv, mscale));
		down(dev, got, dx, (uint64_t)R * NH * HD * 4);
		T_OK(host_op_rope(NULL, H(x), R, NH, HD, pos, inv, mscale));
		close_to(got, x, (size_t)R * NH * HD, 1e-6, "rope");
		be->free(dev, dx);
		free(x), free(got);
	}
	be->close(dev);
}

/* qk_norm_rope against rmsnorm then rope of the same backend, bit for
 * bit (the same operations in one launch), and within rope's tolerance of
 * the host's two ops: head_dim 128 and 64, f32, bf16 and no weights, k's
 * weight at an odd address (byte loads), one row and several. */
/* qk_norm_rope with its kv_store (k_cache set): q, k and both caches the
 * bits of qk_norm_rope then kv_store; a slot past the cache refused with
 * nothing written. */
static void t_qk_norm_rope_store(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t R = 3, NH = 8, KH = 2, HD = 128, CR = 10, KD = KH * HD;
	const uint32_t pos[3] = { 17, 18, 300 }, slots[3] = { 7, 2, 5 };
	const size_t qn = (size_t)R * NH * HD, kn = (size_t)R * KD, cn = (size_t)CR * KD;
	float inv[64];
	for (uint32_t i = 0; i < HD / 2; i++)
		inv[i] = (float)pow(1e6, -(double)(2 * i) / HD);
	uint64_t wb;
	uint8_t *wq = weights(BATON_DT_F32, 1, HD, &wb), *wk = weights(BATON_DT_F32, 1, HD, &wb);
	float *q = rvec(qn), *k = rvec(kn), *v = rvec(kn), *zero = calloc(cn, 4);
	float *a = malloc((qn > cn ? qn : cn) * 4), *b = malloc((qn > cn ? qn : cn) * 4);
	T_ASSERT(zero && a && b);
	baton_dptr dwq = up(dev, wq, wb), dwk = up(dev, wk, wb), dv = up(dev, v, kn * 4);
	baton_dptr dq[2], dk[2], dkc[2], dvc[2];
	for (int i = 0; i < 2; i++) {
		dq[i] = up(dev, q, qn * 4), dk[i] = up(dev, k, kn * 4);
		dkc[i] = up(dev, zero, cn * 4), dvc[i] = up(dev, zero, cn * 4);
	}
	struct baton_qk_norm_rope nr = { .q = dq[0], .k = dk[0], .wq = dwq, .wk = dwk,
		.wq_dtype = BATON_DT_F32, .wk_dtype = BATON_DT_F32, .rows = R, .heads = NH,
		.kv_heads = KH, .head_dim = HD, .eps = 1e-6f, .mscale = 1.0f, .pos = pos,
		.inv_freq = inv, .v = dv, .k_cache = dkc[0], .v_cache = dvc[0], .slots = slots,
		.cache_rows = CR };
	T_CU(dev, be->qk_norm_rope(dev, &nr));
	struct baton_qk_norm_rope n2 = nr;
	n2.q = dq[1], n2.k = dk[1], n2.k_cache = 0;
	T_CU(dev, be->qk_norm_rope(dev, &n2));
	const struct baton_kv_store ks = { .k = dk[1], .v = dv, .k_cache = dkc[1], .v_cache = dvc[1],
		.slots = slots, .n = R, .cols = KD, .cache_rows = CR };
	T_CU(dev, be->kv_store(dev, &ks));
	const baton_dptr pairs[4][2] = { { dq[0], dq[1] }, { dk[0], dk[1] }, { dkc[0], dkc[1] },
		{ dvc[0], dvc[1] } };
	const size_t ns[4] = { qn, kn, cn, cn };
	const char *names[4] = { "q", "k", "k cache", "v cache" };
	for (int i = 0; i < 4; i++) {
		down(dev, a, pairs[i][0], ns[i] * 4);
		down(dev, b, pairs[i][1], ns[i] * 4);
		same_bits(a, b, ns[i], names[i]);
	}
	T_ASSERT(memcmp(a, zero, 4) == 0); /* row 0 of the caches: no slot there */
	/* refused: slot 10 of 10 rows; q (already normed once) unchanged */
	const uint32_t bad[3] = { 7, 10, 5 };
	nr.slots = bad;
	down(dev, b, dq[0], qn * 4);
	T_EQ_ERR(be->qk_norm_rope(dev, &nr), BATON_ERANGE);
	down(dev, a, dq[0], qn * 4);
	T_ASSERT(memcmp(a, b, qn * 4) == 0);
	for (int i = 0; i < 2; i++)
		be->free(dev, dq[i]), be->free(dev, dk[i]), be->free(dev, dkc[i]), be->free(dev, dvc[i]);
	be->free(dev, dwq), be->free(dev, dwk), be->free(dev, dv);
	free(wq), free(wk), free(q), free(k), free(v), free(zero), free(a), free(b);
	be->close(dev);
}

static void t_qk_norm_rope(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t pos[] = { 5, 0, 1000, 40000 };
	const struct { uint32_t R, NH, KH, HD; int wdt; } cs[] = {
		{ 1, 32, 4, 128, BATON_DT_F32 }, { 4, 6, 2, 64, BATON_DT_BF16 }, { 3, 4, 4, 128, -1 },
	};
	for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
		const uint32_t R = cs[c].R, NH = cs[c].NH, KH = cs[c].KH, HD = cs[c].HD;
		const size_t qn = (size_t)R * NH * HD, kn = (size_t)R * KH * HD;
		float inv[64];
		for (uint32_t i = 0; i < HD / 2; i++)
			inv[i] = (float)pow(1e6, -(double)(2 * i) / HD);
		float *q = rvec(qn), *k = rvec(kn), *gq = malloc(qn * 4), *gk = malloc(kn * 4);
		float *wq_ = malloc(qn * 4), *wk_ = malloc(kn * 4);
		T_ASSERT(gq && gk && wq_ && wk_);
		for (size_t i = 0; i < qn; i++)
			q[i] *= 2.0f;
		uint64_t wb = 0;
		const int wdt = cs[c].wdt;
		uint8_t *wq = wdt >= 0 ? weights(wdt, 1, HD, &wb) : NULL;
		uint8_t *wk = wdt >= 0 ? weights(wdt, 1, HD, &wb) : NULL;
		baton_dptr dwq = wq ? up(dev, wq, wb) : 0, dwk0 = 0, dwk = 0;
		if (wk) {
			T_CU(dev, be->alloc(dev, wb + 16, &dwk0));
			dwk = dwk0 + (wdt == BATON_DT_BF16); /* elem() at an odd address */
			struct baton_copy wc = { dwk, wk, wb };
			T_CU(dev, be->copy_h2d(dev, &wc, 1));
		}
		baton_dptr dq = up(dev, q, qn * 4), dk = up(dev, k, kn * 4);
		baton_dptr dq2 = up(dev, q, qn * 4), dk2 = up(dev, k, kn * 4);
		const struct baton_qk_norm_rope a = { .q = dq, .k = dk, .wq = dwq, .wk = dwk,
			.wq_dtype = (uint32_t)(wdt >= 0 ? wdt : 0), .wk_dtype = (uint32_t)(wdt >= 0 ? wdt : 0),
			.rows = R, .heads = NH, .kv_heads = KH, .head_dim = HD, .eps = 1e-6f,
			.mscale = c == 1 ? 0.7f : 1.0f, .pos = pos, .inv_freq = inv };
		T_CU(dev, be->qk_norm_rope(dev, &a));
		T_CU(dev, be->rmsnorm(dev, dq2, dq2, R * NH, HD, dwq, a.wq_dtype, 1e-6f));
		T_CU(dev, be->rmsnorm(dev, dk2, dk2, R * KH, HD, dwk, a.wk_dtype, 1e-6f));
		T_CU(dev, be->rope(dev, dq2, R, NH, HD, pos, inv, a.mscale));
		T_CU(dev, be->rope(dev, dk2, R, KH, HD, pos, inv, a.mscale));
		down(dev, gq, dq, qn * 4);
		down(dev, gk, dk, kn * 4);
		down(dev, wq_, dq2, qn * 4);
		down(dev, wk_, dk2, kn * 4);
		same_bits(gq, wq_, qn, "qk_norm_rope q");
		same_bits(gk, wk_, kn, "qk_norm_rope k");
		T_OK(host_op_rmsnorm(NULL, H(q), H(q), R * NH, HD, H(wq), a.wq_dtype, 1e-6f));
		T_OK(host_op_rmsnorm(NULL, H(k), H(k), R * KH, HD, H(wk), a.wk_dtype, 1e-6f));
		T_OK(host_op_rope(NULL, H(q), R, NH, HD, pos, inv, a.mscale));
		T_OK(host_op_rope(NULL, H(k), R, KH, HD, pos, inv, a.mscale));
		close_to(gq, q, qn, 1e-6, "qk_norm_rope q vs host");
		close_to(gk, k, kn, 1e-6, "qk_norm_rope k vs host");
		be->free(dev, dq), be->free(dev, dk), be->free(dev, dq2), be->free(dev, dk2);
		if (dwq)
			be->free(dev, dwq), be->free(dev, dwk0);
		free(q), free(k), free(gq), free(gk), free(wq_), free(wk_), free(wq), free(wk);
	}
	/* refused, nothing written: an odd head_dim, q and k overlapping */
	baton_dptr b = 0;
	T_CU(dev, be->alloc(dev, 4096, &b));
	struct baton_qk_norm_rope bad = { .q = b, .k = b + 2048, .rows = 1, .heads = 1,
		.kv_heads = 1, .head_dim = 7, .eps = 1e-6f, .mscale = 1, .pos = pos, .inv_freq = (float[4]){ 1 } };
	T_EQ_ERR(be->qk_norm_rope(dev, &bad), BATON_EINVAL);
	bad.head_dim = 8;
	bad.k = b + 16;
	T_EQ_ERR(be->qk_norm_rope(dev, &bad), BATON_EINVAL);
	be->free(dev, b);
	be->close(dev);
}

/* kv_store: bitwise the host's, refusals alike. */
static void t_kv_store(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t N = 5, C = 96, ROWS = 40;
	float *k = rvec((size_t)N * C), *v = rvec((size_t)N * C);
	float *kc = rvec((size_t)ROWS * C), *vc = rvec((size_t)ROWS * C);
	float *got = malloc((size_t)ROWS * C * 4);
	T_ASSERT(got);
	const uint32_t slots[5] = { 17, 3, 39, 0, 18 }, bad[5] = { 17, 3, 40, 0, 18 };
	baton_dptr dk = up(dev, k, N * C * 4), dv = up(dev, v, N * C * 4);
	baton_dptr dkc = up(dev, kc, ROWS * C * 4), dvc = up(dev, vc, ROWS * C * 4);
	struct baton_kv_store st = { .k = dk, .v = dv, .k_cache = dkc, .v_cache = dvc,
		.slots = bad, .n = N, .cols = C, .cache_rows = ROWS };
	T_EQ_ERR(be->kv_store(dev, &st), BATON_ERANGE);
	st.slots = slots;
	st.k_cache = dk; /* overlaps k */
	T_EQ_ERR(be->kv_store(dev, &st), BATON_EINVAL);
	st.k_cache = dkc;
	T_CU(dev, be->kv_store(dev, &st));
	struct baton_kv_store hs = st;
	hs.k = H(k), hs.v = H(v), hs.k_cache = H(kc), hs.v_cache = H(vc);
	T_OK(host_op_kv_store(NULL, &hs));
	down(dev, got, dkc, ROWS * C * 4);
	T_ASSERT(memcmp(got, kc, (size_t)ROWS * C * 4) == 0);
	down(dev, got, dvc, ROWS * C * 4);
	T_ASSERT(memcmp(got, vc, (size_t)ROWS * C * 4) == 0);
	be->free(dev, dk), be->free(dev, dv), be->free(dev, dkc), be->free(dev, dvc);
	free(k), free(v), free(kc), free(vc), free(got);
	be->close(dev);
}

static void t_swiglu_add(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t R = 5, C = 300;
	const uint64_t n = (uint64_t)R * C;
	float *g = rvec(n), *u = rvec(n), *got = malloc(n * 4), *want = malloc(n * 4);
	T_ASSERT(got && want);
	for (uint64_t i = 0; i < n; i++)
		g[i] *= 8.0f;
	baton_dptr dg = up(dev, g, n * 4), du = up(dev, u, n * 4), dout;
	T_CU(dev, be->alloc(dev, n * 4, &dout));
	T_CU(dev, be->swiglu(dev, dg, du, dout, n));
	down(dev, got, dout, n * 4);
	T_OK(host_op_swiglu(NULL, H(g), H(u), H(want), n));
	close_to(got, want, n, 1e-6, "swiglu");
	/* in place over gate, as the model calls it */
	T_CU(dev, be->swiglu(dev, dg, du, dg, n));
	down(dev, got, dg, n * 4);
	close_to(got, want, n, 1e-6, "swiglu in place");

	float *x = rvec(n), *y = rvec(n), *gl = rvec(R);
	for (int gated = 0; gated < 2; gated++) {
		baton_dptr dx = up(dev, x, n * 4), dy = up(dev, y, n * 4), dgl = up(dev, gl, R * 4);
		T_CU(dev, be->add(dev, dx, dy, gated ? dgl : 0, R, C));
		down(dev, got, dx, n * 4);
		memcpy(want, x, n * 4);
		T_OK(host_op_add(NULL, H(want), H(y), gated ? H(gl) : 0, R, C));
		if (gated)
			close_to(got, want, n, 1e-6, "add gated");
		else
			same_bits(got, want, n, "add");
		be->free(dev, dx), be->free(dev, dy), be->free(dev, dgl);
	}
	be->free(dev, dg), be->free(dev, du), be->free(dev, dout);
	free(g), free(u), free(got), free(want), free(x), free(y), free(gl);
	be->close(dev);
}

/* ---- timings (figures only, nothing asserted) ----------------------------- */

/* Seconds per call of matmul (n_out x k in dt, `rows` rows), on device
 * memory as it comes (the values do not matter to the time). */
static double time_matmul_at(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k,
    uint32_t rows, uint32_t off)
{
	baton_dptr w0, w, x, y;
	const uint64_t wb = baton_compute_row_bytes(dt, k) * n_out;
	T_CU(dev, be->alloc(dev, wb + 16, &w0));
	w = w0 + off;
	T_CU(dev, be->alloc(dev, (uint64_t)rows * k * 4, &x));
	T_CU(dev, be->alloc(dev, (uint64_t)rows * n_out * 4, &y));
	T_CU(dev, be->matmul(dev, w, (uint32_t)dt, n_out, k, 0, 0, x, rows, y, 0));
	T_CU(dev, be->sync(dev));
	const int reps = 20;
	double t0 = baton_now_s();
	for (int i = 0; i < reps; i++)
		T_CU(dev, be->matmul(dev, w, (uint32_t)dt, n_out, k, 0, 0, x, rows, y, 0));
	T_CU(dev, be->sync(dev));
	double t = (baton_now_s() - t0) / reps;
	be->free(dev, w0), be->free(dev, x), be->free(dev, y);
	return t;
}

static double time_matmul(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k, uint32_t rows)
{
	return time_matmul_at(dev, dt, n_out, k, rows, 0);
}

static void t_perf(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	char name[64];
	/* Qwen3-30B-A3B's shapes: the output head (151936 x 2048), the q
	 * projection (4096 x 2048) at batch 1; a 512-token prefill of it */
	const int dts[] = { BATON_DT_BF16, BATON_DT_F16, BATON_DT_F32, BATON_DT_Q8_0, BATON_DT_Q4_K,
		BATON_DT_Q5_K, BATON_DT_Q6_K, BATON_DT_Q4_0, BATON_DT_Q5_0, BATON_DT_IQ4_NL,
		BATON_DT_Q3_K, BATON_DT_IQ4_XS };
	for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
		const int dt = dts[i];
		double t = time_matmul(dev, dt, 151936, 2048, 1);
		snprintf(name, sizeof name, "matmul_head_%s_B1", baton_dtype_name(dt));
		fig(name, t * 1e6);
		snprintf(name, sizeof name, "matmul_head_%s_B1_GB/s", baton_dtype_name(dt));
		fig(name, (double)baton_compute_row_bytes(dt, 2048) * 151936 / t / 1e9);
	}
	/* the same bf16 head through the other two kernels (weights 2 and 1
	 * bytes off 16-byte alignment): typed 2-byte loads, byte loads */
	for (uint32_t off = 2; off > 0; off--) {
		double t = time_matmul_at(dev, BATON_DT_BF16, 151936, 2048, 1, off);
		snprintf(name, sizeof name, "matmul_head_bf16_B1_off%u_GB/s", off);
		fig(name, 2.0 * 2048 * 151936 / t / 1e9);
	}
	double t = time_matmul(dev, BATON_DT_BF16, 4096, 2048, 1);
	fig("matmul_q_bf16_B1_us", t * 1e6);
	t = time_matmul(dev, BATON_DT_BF16, 4096, 2048, 512);
	fig("matmul_q_bf16_B512_us", t * 1e6);
	fig("matmul_q_bf16_B512_GFLOP/s", 2.0 * 4096 * 2048 * 512 / t / 1e9);
	/* the same 512 rows over K-quant weights, and an expert-sized one at
	 * batch 1 (768 x 2048: a launch too small to fill the device) */
	const int qdts[] = { BATON_DT_Q4_K, BATON_DT_Q6_K, BATON_DT_Q8_0 };
	for (size_t i = 0; i < sizeof qdts / sizeof qdts[0]; i++) {
		t = time_matmul(dev, qdts[i], 4096, 2048, 512);
		snprintf(name, sizeof name, "matmul_q_%s_B512_GFLOP/s", baton_dtype_name(qdts[i]));
		fig(name, 2.0 * 4096 * 2048 * 512 / t / 1e9);
	}
	t = time_matmul(dev, BATON_DT_BF16, 768, 2048, 1);
	fig("matmul_768x2048_bf16_B1_us", t * 1e6);

	/* attention: one decode query over 2048 and 8192 positions, 32 heads
	 * over 4 of 128 */
	const uint32_t ctxs[] = { 2048, 8192 };
	for (int c = 0; c < 2; c++) {
		baton_dptr q, k, v, o;
		const uint64_t kn = (uint64_t)ctxs[c] * 4 * 128 * 4;
		T_CU(dev, be->alloc(dev, 32 * 128 * 4, &q));
		T_CU(dev, be->alloc(dev, 32 * 128 * 4, &o));
		T_CU(dev, be->alloc(dev, kn, &k));
		T_CU(dev, be->alloc(dev, kn, &v));
		struct baton_attn a = { .q = q, .k = k, .v = v, .out = o, .n_q = 1, .n_heads = 32,
			.n_kv_heads = 4, .head_dim = 128, .pos0 = ctxs[c] - 1, .scale = 0.088f };
		T_CU(dev, be->attention(dev, &a));
		T_CU(dev, be->sync(dev));
		double t0 = baton_now_s();
		for (int i = 0; i < 20; i++)
			T_CU(dev, be->attention(dev, &a));
		T_CU(dev, be->sync(dev));
		snprintf(name, sizeof name, "attention_decode_ctx%u_us", ctxs[c]);
		fig(name, (baton_now_s() - t0) / 20 * 1e6);
		be->free(dev, q), be->free(dev, o), be->free(dev, k), be->free(dev, v);
	}

	/* rope of one row, back to back: the staging ring lets them queue */
	baton_dptr x;
	T_CU(dev, be->alloc(dev, 32 * 128 * 4, &x));
	float inv[64];
	for (int i = 0; i < 64; i++)
		inv[i] = 1.0f / (float)(i + 1);
	double t0 = baton_now_s();
	for (uint32_t i = 0; i < 2000; i++)
		T_CU(dev, be->rope(dev, x, 1, 32, 128, &i, inv, 1.0f));
	T_CU(dev, be->sync(dev));
	fig("rope_B1_call_us", (baton_now_s() - t0) / 2000 * 1e6);
	be->free(dev, x);
	be->close(dev);
}

/* ---- refusals: the host's codes, nothing queued ---------------------------- */

static void t_refusals(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	baton_dptr b = 0;
	T_CU(dev, be->alloc(dev, 1 << 16, &b));
	const uint32_t tok_bad[] = { 16 }, pos[] = { 0 };
	const float inv[2] = { 1, 1 };
	uint32_t ids[4];
	float w[4];
	/* the lattice types (IQ2 / IQ3 / IQ1, TQ) are refused by name */
	T_EQ_ERR(be->matmul(dev, b, BATON_DT_IQ3_S, 2, 256, 0, 0, b + 4096, 1, b + 8192, 0),
	    BATON_EUNSUPPORTED);
	T_ASSERT(strstr(cuda_backend_last_error(dev), "iq3_s") != NULL);
	/* a row that is not whole blocks of a block type */
	T_EQ_ERR(be->matmul(dev, b, BATON_DT_Q3_K, 2, 192, 0, 0, b + 4096, 1, b + 8192, 0),
	    BATON_EINVAL);
	T_EQ_ERR(be->matmul(dev, b, BATON_DT_Q8_0, 2, 33, 0, 0, b + 4096, 1, b + 8192, 0),
	    BATON_EINVAL);
	T_EQ_ERR(be->matmul(dev, b, BATON_DT_F32, 2, 8, 0, 0, b + 4096, 1, b + 4100, 0),
	    BATON_EINVAL); /* y overlaps x */
	T_EQ_ERR(be->matmul(dev, b, BATON_DT_F32, 2, 8, 0, 0, b + 4098, 1, b + 8192, 0),
	    BATON_EINVAL); /* misaligned x */
	T_EQ_ERR(be->embed(dev, b, BATON_DT_F32, 16, 8, tok_bad, 1, b + 8192), BATON_ERANGE);
	T_EQ_ERR(be->rmsnorm(dev, b, b + 4, 2, 8, 0, 0, 1e-6f), BATON_EINVAL);
	T_EQ_ERR(be->rope(dev, b, 1, 1, 3, pos, inv, 1.0f), BATON_EINVAL); /* odd head_dim */
	struct baton_attn a = { .q = b, .k = b + 4096, .v = b + 8192, .out = b + 12288, .n_q = 1,
		.n_heads = 3, .n_kv_heads = 2, .head_dim = 8, .scale = 1.0f };
	T_EQ_ERR(be->attention(dev, &a), BATON_EINVAL); /* 3 heads over 2 KV heads */
	const uint32_t tbl[1] = { 0 };
	a.n_heads = 2;
	a.blocks = tbl; /* a table without a block size */
	T_EQ_ERR(be->attention(dev, &a), BATON_EINVAL);
	T_EQ_ERR(be->add(dev, b, b + 4, 0, 1, 8), BATON_EINVAL);
	T_EQ_ERR(be->route(dev, b, 1, 4, 5, 0, ids, w), BATON_EINVAL);
	T_EQ_ERR(be->route(dev, b, 1, 4, 2, 7, ids, w), BATON_EINVAL);
	T_CU(dev, be->sync(dev));
	be->free(dev, b);
	be->close(dev);
}

T_MAIN(T_CASE(t_matmul), T_CASE(t_matmul_fast), T_CASE(t_embed_rmsnorm), T_CASE(t_route), T_CASE(t_router_route), T_CASE(t_rope),
    T_CASE(t_qk_norm_rope), T_CASE(t_qk_norm_rope_store), T_CASE(t_matmuls), T_CASE(t_rmsnorm_matmuls), T_CASE(t_kv_store), T_CASE(t_swiglu_add), T_CASE(t_refusals),
    T_CASE_TIMEOUT(t_perf, 120))
