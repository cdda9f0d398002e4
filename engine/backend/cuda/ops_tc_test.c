/*
 * ops_tc_test.c: the tensor-core path of the cuda backend for passes of
 * 64 rows or more (engine/backend/cuda/tc_launch.c, blas.c, gemm.cu,
 * attn.cu) against the host backend's or a double-precision sum, through
 * the backend table (the helpers: cuda_ops_fixture.h); and prepare, which
 * starts the path. Built only with CUDA=1; without a driver or a device
 * every case prints "skip: why" and passes, and without cuBLAS the
 * tensor-core cases do.
 *
 * What must agree how: matmul within 0.008 sum |x| |w| of the double sum
 * (x and w rounded to bf16), f32 weights on the exact kernels (the host's
 * bits); attention within 2e-2 of the scale of the host's, the same bits
 * twice; moe_experts within 2e-2 of the largest magnitude of the experts'
 * sum, every way of BATON_TC_EXPERT_GEMM, and moe_experts_dev (bf16
 * experts routed on the device: planned there) with moe_experts's bits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/cuda/cuda_ops_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

/* ---- the tensor-core path (tc_launch.c) -------------------------------------- */

/* A device with the tensor-core path set by the environment (NULL: the
 * default), or NULL with "skip" printed when cuBLAS is not there. */
static struct baton_dev *tc_open(const char *rows, const char *scratch_mb)
{
	if (rows)
		T_ASSERT(setenv("BATON_CUDA_GEMM_ROWS", rows, 1) == 0);
	if (scratch_mb)
		T_ASSERT(setenv("BATON_CUDA_GEMM_SCRATCH_MB", scratch_mb, 1) == 0);
	struct baton_dev *dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_GEMM_ROWS");
	unsetenv("BATON_CUDA_GEMM_SCRATCH_MB");
	/* one matmul of 64 rows asks for cuBLAS */
	baton_dptr w, x, y;
	T_CU(dev, be->alloc(dev, 64 * 64 * 2, &w));
	T_CU(dev, be->alloc(dev, 64 * 64 * 4, &x));
	T_CU(dev, be->alloc(dev, 64 * 64 * 4, &y));
	T_CU(dev, be->matmul(dev, w, BATON_DT_BF16, 64, 64, 0, 0, x, 64, y, 0));
	T_CU(dev, be->sync(dev));
	be->free(dev, w), be->free(dev, x), be->free(dev, y);
	char line[768];
	cuda_backend_describe(dev, line, sizeof line);
	if (!strstr(line, "tensor cores through cuBLAS")) {
		printf("  skip: %s\n", line);
		be->close(dev);
		return NULL;
	}
	return dev;
}

/* y = (acc ? y : 0) + x w^T + b on the tensor cores against the double
 * sum: each element within 0.008 sum |x| |w| (bf16 rounds x and w by
 * 2^-9 each: a product by at most 0.0039 of itself; f32 sums add k 2^-24)
 * plus 1e-5 of what bias and y add. */
static void tc_matmul_case(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k,
    uint32_t rows, int bias, int acc, uint32_t off)
{
	uint64_t wb, bb = 0;
	uint8_t *w = weights(dt, n_out, k, &wb);
	uint8_t *b = bias ? weights(BATON_DT_F32, 1, n_out, &bb) : NULL;
	float *x = rvec((size_t)rows * k), *y = rvec((size_t)rows * n_out);
	float *got = malloc((size_t)rows * n_out * 4), *wd = malloc((size_t)n_out * k * 4);
	T_ASSERT(got && wd);
	const uint64_t rb = baton_compute_row_bytes(dt, k);
	for (uint32_t o = 0; o < n_out; o++)
		T_OK(baton_dequant_row(dt, w + o * rb, wd + (size_t)o * k, k));
	baton_dptr dw0 = 0, dx = up(dev, x, (uint64_t)rows * k * 4);
	T_CU(dev, be->alloc(dev, wb + 16, &dw0));
	struct baton_copy wc = { dw0 + off, w, wb };
	T_CU(dev, be->copy_h2d(dev, &wc, 1));
	baton_dptr dy = up(dev, y, (uint64_t)rows * n_out * 4), db = b ? up(dev, b, bb) : 0;
	T_CU(dev, be->matmul(dev, dw0 + off, (uint32_t)dt, n_out, k, db, b ? BATON_DT_F32 : 0, dx,
	    rows, dy, acc));
	down(dev, got, dy, (uint64_t)rows * n_out * 4);
	double worst = 0;
	for (uint32_t r = 0; r < rows; r++)
		for (uint32_t o = 0; o < n_out; o++) {
			double sum = 0, mag = 0;
			for (uint32_t i = 0; i < k; i++) {
				const double p = (double)x[(size_t)r * k + i] * wd[(size_t)o * k + i];
				sum += p;
				mag += fabs(p);
			}
			double extra = 0;
			if (acc)
				sum += y[(size_t)r * n_out + o], extra += fabs(y[(size_t)r * n_out + o]);
			if (b) {
				float bv;
				memcpy(&bv, b + 4 * o, 4);
				sum += bv, extra += fabs(bv);
			}
			const double err = fabs(got[(size_t)r * n_out + o] - sum);
			const double lim = 0.008 * mag + 1e-5 * (extra + 1e-3);
			if (mag > 0 && err / mag > worst)
				worst = err / mag;
			if (!(err <= lim))
				T_FAIL("tc matmul %s %ux%u rows %u: [%u][%u] %.9g, exact %.9g (limit %.3g)",
				    baton_dtype_name(dt), n_out, k, rows, r, o, got[(size_t)r * n_out + o], sum,
				    lim);
		}
	char name[80];
	snprintf(name, sizeof name, "tc matmul %s k=%u rows=%u off=%u err/sum|xw|",
	    baton_dtype_name(dt), k, rows, off);
	fig(name, worst);
	be->free(dev, dw0), be->free(dev, dx), be->free(dev, dy);
	if (db)
		be->free(dev, db);
	free(w), free(b), free(x), free(y), free(got), free(wd);
}

/* Within the bf16 bound of the double sum x w^T (w dequantized in wd). */
static void tc_close(const float *got, const float *x, const float *wd, uint32_t rows,
    uint32_t n_out, uint32_t k, const char *what)
{
	for (uint32_t r = 0; r < rows; r++)
		for (uint32_t o = 0; o < n_out; o++) {
			double sum = 0, mag = 0;
			for (uint32_t i = 0; i < k; i++) {
				const double p = (double)x[(size_t)r * k + i] * wd[(size_t)o * k + i];
				sum += p;
				mag += fabs(p);
			}
			if (!(fabs(got[(size_t)r * n_out + o] - sum) <= 0.008 * mag + 1e-8))
				T_FAIL("%s: [%u][%u] %.9g, exact %.9g", what, r, o, got[(size_t)r * n_out + o],
				    sum);
		}
}

/* q, k and v read one x: the second matmul takes the first's bf16 copy
 * of x; after x changes in place (a copy to the device, nothing
 * launched) the next one must convert it anew. */
static void tc_x_reuse_case(struct baton_dev *dev)
{
	const uint32_t n_out = 48, k = 512, rows = 66;
	const int dt = BATON_DT_Q4_K;
	uint64_t wb;
	uint8_t *w1 = weights(dt, n_out, k, &wb), *w2 = weights(dt, n_out, k, &wb);
	float *x1 = rvec((size_t)rows * k), *x2 = rvec((size_t)rows * k);
	float *wd1 = malloc((size_t)n_out * k * 4), *wd2 = malloc((size_t)n_out * k * 4);
	float *got = malloc((size_t)rows * n_out * 4);
	T_ASSERT(wd1 && wd2 && got);
	const uint64_t rb = baton_compute_row_bytes(dt, k);
	for (uint32_t o = 0; o < n_out; o++) {
		T_OK(baton_dequant_row(dt, w1 + o * rb, wd1 + (size_t)o * k, k));
		T_OK(baton_dequant_row(dt, w2 + o * rb, wd2 + (size_t)o * k, k));
	}
	baton_dptr dw1 = up(dev, w1, wb), dw2 = up(dev, w2, wb), dx = up(dev, x1, (uint64_t)rows * k * 4);
	baton_dptr dy;
	T_CU(dev, be->alloc(dev, (uint64_t)rows * n_out * 4, &dy));
	T_CU(dev, be->matmul(dev, dw1, dt, n_out, k, 0, 0, dx, rows, dy, 0));
	down(dev, got, dy, (uint64_t)rows * n_out * 4);
	tc_close(got, x1, wd1, rows, n_out, k, "tc x reuse: first");
	T_CU(dev, be->matmul(dev, dw2, dt, n_out, k, 0, 0, dx, rows, dy, 0));
	down(dev, got, dy, (uint64_t)rows * n_out * 4);
	tc_close(got, x1, wd2, rows, n_out, k, "tc x reuse: x's bf16 copy reused");
	struct baton_copy c = { dx, x2, (uint64_t)rows * k * 4 };
	T_CU(dev, be->copy_h2d(dev, &c, 1));
	T_CU(dev, be->matmul(dev, dw1, dt, n_out, k, 0, 0, dx, rows, dy, 0));
	down(dev, got, dy, (uint64_t)rows * n_out * 4);
	tc_close(got, x2, wd1, rows, n_out, k, "tc x reuse: x changed by a copy");
	be->free(dev, dw1), be->free(dev, dw2), be->free(dev, dx), be->free(dev, dy);
	free(w1), free(w2), free(x1), free(x2), free(wd1), free(wd2), free(got);
}

/* attention of n_q >= 64 queries on the tensor cores against the host's:
 * within 2e-2 of the scale (bf16 q, k, p and v: a few 1e-3 expected; a
 * key seen past the causal edge or a wrong head moves outputs by 1e-1). */
static void tc_attention_case(struct baton_dev *dev, uint32_t n_q, uint32_t pos0, uint32_t Hh,
    uint32_t KH, uint32_t hd, int paged)
{
	const uint32_t BS = 16;
	const uint64_t n_ctx = (uint64_t)pos0 + n_q, qn = (uint64_t)n_q * Hh * hd;
	const uint32_t nb = (uint32_t)((n_ctx + BS - 1) / BS), pool = nb + 3;
	const uint64_t rows = paged ? (uint64_t)pool * BS : n_ctx, kn = rows * KH * hd;
	float *q = rvec(qn), *k = rvec(kn), *v = rvec(kn);
	uint32_t *table = malloc(pool * sizeof *table);
	T_ASSERT(table);
	for (uint32_t i = 0; i < pool; i++)
		table[i] = pool - 1 - i;
	for (uint64_t i = 0; i < qn; i++)
		q[i] *= 2.0f;
	float *got = malloc(qn * 4), *want = malloc(qn * 4), *again = malloc(qn * 4);
	T_ASSERT(got && want && again);
	baton_dptr dq = up(dev, q, qn * 4), dk = up(dev, k, kn * 4), dv = up(dev, v, kn * 4), dout;
	T_CU(dev, be->alloc(dev, qn * 4, &dout));
	struct baton_attn a = { .q = dq, .k = dk, .v = dv, .out = dout, .n_q = n_q, .n_heads = Hh,
		.n_kv_heads = KH, .head_dim = hd, .pos0 = pos0, .scale = 1.0f / sqrtf((float)hd),
		.blocks = paged ? table : NULL, .block_size = paged ? BS : 0 };
	T_CU(dev, be->attention(dev, &a));
	down(dev, got, dout, qn * 4);
	T_CU(dev, be->attention(dev, &a));
	down(dev, again, dout, qn * 4);
	struct baton_attn ha = a;
	ha.q = H(q), ha.k = H(k), ha.v = H(v), ha.out = H(want);
	T_OK(host_op_attention(NULL, &ha));
	char what[80];
	snprintf(what, sizeof what, "tc attention n_q=%u pos0=%u%s", n_q, pos0, paged ? " paged" : "");
	close_to(got, want, qn, 2e-2, what);
	T_ASSERT_MSG(memcmp(got, again, qn * 4) == 0, "%s: two runs differ", what);
	be->free(dev, dq), be->free(dev, dk), be->free(dev, dv), be->free(dev, dout);
	free(q), free(k), free(v), free(got), free(want), free(again), free(table);
}

/* moe_experts of a large batch (per-expert GEMMs) against the host's:
 * x starts random and gains the weighted sum of the experts; within
 * 2e-2 of that sum's largest magnitude (bf16 inputs of both GEMMs). */
static void tc_moe_case_l(struct baton_dev *dev, int dt, uint32_t B, uint32_t D, uint32_t F,
    uint32_t E, uint32_t K, int skew, int apart)
{
	const uint64_t rbd = baton_compute_row_bytes(dt, D), rbf = baton_compute_row_bytes(dt, F);
	/* apart: gate, down, up (up not after gate: two GEMMs of F rows) */
	const uint64_t gate_off = 0, up_off = apart ? F * rbd + D * rbf : F * rbd;
	const uint64_t down_off = apart ? F * rbd : 2 * F * rbd;
	const uint64_t stride = (2 * F * rbd + D * rbf + 255) / 256 * 256;
	uint8_t *blobs = calloc(E, stride);
	T_ASSERT(blobs);
	for (uint32_t e = 0; e < E; e++) {
		uint64_t n1, n2;
		uint8_t *gu = weights(dt, 2 * F, D, &n1), *dn = weights(dt, D, F, &n2);
		memcpy(blobs + e * stride + gate_off, gu, F * rbd);
		memcpy(blobs + e * stride + up_off, gu + F * rbd, n1 - F * rbd);
		memcpy(blobs + e * stride + down_off, dn, n2);
		free(gu), free(dn);
	}
	const size_t BD = (size_t)B * D, BK = (size_t)B * K;
	float *xn = rvec(BD), *x = rvec(BD), *want = malloc(BD * 4), *got = malloc(BD * 4);
	float *wt = rvec(BK);
	baton_dptr *hb = malloc(BK * sizeof *hb), *db = malloc(BK * sizeof *db);
	T_ASSERT(x && want && got && hb && db);
	memcpy(want, x, BD * 4);
	baton_dptr dblobs = up(dev, blobs, E * stride), dxn = up(dev, xn, BD * 4),
	    dx = up(dev, x, BD * 4);
	for (uint32_t t = 0; t < B; t++)
		for (uint32_t j = 0; j < K; j++) {
			/* distinct per token; skewed: rank j of every token takes
			 * experts of its own range, 1, 3 and the rest of them (counts
			 * B, B / 3, ...: several buckets of padding) */
			const uint32_t e = !skew ? (t * 7 + j * 3 + (uint32_t)(rnd() % 2)) % E :
			    j == 0 ? 0 : j == 1 ? 1 + t % 3 : 4 + (t * K + j) % (E - 4);
			hb[t * K + j] = H(blobs + e * stride);
			db[t * K + j] = dblobs + e * stride;
			wt[t * K + j] = fabsf(wt[t * K + j]);
		}
	struct baton_moe_layer l = {
		.batch = B, .d_model = D, .d_ff = F, .n_experts = E, .top_k = K, .x = dx, .xn = dxn,
		.gate_dtype = (uint32_t)dt, .up_dtype = (uint32_t)dt, .down_dtype = (uint32_t)dt,
		.gate_off = gate_off, .up_off = up_off, .down_off = down_off,
	};
	T_CU(dev, be->moe_experts(dev, &l, db, wt));
	down(dev, got, dx, BD * 4);
	struct baton_moe_layer hl = l;
	hl.x = H(want), hl.xn = H(xn);
	T_OK(host_moe_experts(NULL, &hl, hb, wt));
	double md = 0, mw = 0;
	for (size_t i = 0; i < BD; i++) {
		md = fmax(md, fabs((double)got[i] - want[i]));
		mw = fmax(mw, fabs((double)want[i] - x[i]));
	}
	char name[80];
	snprintf(name, sizeof name, "tc moe %s B=%u%s%s max diff / max", baton_dtype_name(dt), B,
	    skew ? " skewed" : "", apart ? " apart" : "");
	fig(name, md / mw);
	T_ASSERT_MSG(mw > 0 && md <= 2e-2 * mw, "%s: %.3g of %.3g", name, md, mw);
	if (dt == BATON_DT_BF16) { /* routed on the device: moe_experts_dev's table and ids */
		uint64_t *tab = malloc(E * sizeof *tab);
		uint32_t *ids = malloc(BK * sizeof *ids);
		float *got2 = malloc(BD * 4);
		T_ASSERT(tab && ids && got2);
		for (uint32_t e = 0; e < E; e++)
			tab[e] = dblobs + e * stride;
		for (size_t p = 0; p < BK; p++)
			ids[p] = (uint32_t)((db[p] - dblobs) / stride);
		baton_dptr dtab = up(dev, tab, E * 8), dids = up(dev, ids, BK * 4),
		    dwt = up(dev, wt, BK * 4), dx2 = up(dev, x, BD * 4);
		struct baton_moe_layer l2 = l;
		l2.x = dx2;
		T_CU(dev, be->moe_experts_dev(dev, &l2, dtab, dids, dwt));
		down(dev, got2, dx2, BD * 4);
		double md2 = 0;
		for (size_t i = 0; i < BD; i++)
			md2 = fmax(md2, fabs((double)got2[i] - want[i]));
		/* backend.h: moe_experts_dev gives moe_experts's bits */
		const int same = memcmp(got, got2, BD * 4) == 0;
		snprintf(name, sizeof name, "tc moe_experts_dev B=%u%s%s max diff / max, same bits %d", B,
		    skew ? " skewed" : "", apart ? " apart" : "", same);
		fig(name, md2 / mw);
		T_ASSERT_MSG(md2 <= 2e-2 * mw, "%s: %.3g of %.3g", name, md2, mw);
		/* where both run egemm.cu (its mode, in place; other modes give
		 * moe_experts_dev the CUDA cores' kernels) */
		const char *mode = getenv("BATON_TC_EXPERT_GEMM"), *inpl = getenv("BATON_TC_INPLACE");
		if ((!mode || strcmp(mode, "4") == 0) && (!inpl || strcmp(inpl, "0") != 0) && D % 128 == 0 &&
		    F % 64 == 0)
			T_ASSERT_MSG(same, "%s: moe_experts_dev differs from moe_experts", name);
		be->free(dev, dtab), be->free(dev, dids), be->free(dev, dwt), be->free(dev, dx2);
		free(tab), free(ids), free(got2);
	}
	be->free(dev, dblobs), be->free(dev, dxn), be->free(dev, dx);
	free(blobs), free(xn), free(x), free(want), free(got), free(wt), free(hb), free(db);
}

static void tc_moe_case(struct baton_dev *dev, int dt, uint32_t B, uint32_t D, uint32_t F,
    uint32_t E, uint32_t K, int skew)
{
	tc_moe_case_l(dev, dt, B, D, F, E, K, skew, 0);
}

/* The experts' GEMMs each way (BATON_TC_EXPERT_GEMM 0 to 4, bf16 in place
 * or decoded): the same tolerance, on even and skewed routing (an expert
 * of 200 rows: egemm.cu's tiles of 64, the last one of 8), gate and up
 * apart, a k of many pipeline stages, and in groups of experts (a 1 MiB
 * scratch). */
static void t_tc_expert_gemms(void)
{
	static const char *const modes[] = { "0", "1", "2", "3", "4", "4" };
	for (int mode = 0; mode < 6; mode++) /* the last: egemm.cu's blocks of 128 rows */
		for (int inplace = 0; inplace < 2; inplace++) {
			T_ASSERT(setenv("BATON_TC_EXPERT_GEMM", modes[mode], 1) == 0);
			T_ASSERT(setenv("BATON_TC_INPLACE", inplace ? "1" : "0", 1) == 0);
			T_ASSERT(setenv("BATON_TC_EG_ROWS", mode == 5 ? "128" : "64", 1) == 0);
			struct baton_dev *dev = tc_open(NULL, NULL);
			if (!dev)
				break;
			printf("  mode %d, in place %d\n", mode, inplace);
			tc_moe_case_l(dev, BATON_DT_BF16, 96, 256, 256, 6, 2, 0, 0);
			tc_moe_case_l(dev, BATON_DT_BF16, 200, 256, 128, 40, 4, 1, 0);
			tc_moe_case_l(dev, BATON_DT_BF16, 200, 256, 128, 40, 4, 1, 1);
			tc_moe_case_l(dev, BATON_DT_BF16, 300, 256, 256, 64, 8, 0, 0);
			tc_moe_case_l(dev, BATON_DT_BF16, 160, 1024, 512, 16, 4, 1, 0);
			tc_moe_case_l(dev, BATON_DT_Q4_K, 200, 256, 256, 40, 4, 1, 0);
			tc_moe_case_l(dev, BATON_DT_F16, 96, 256, 256, 6, 2, 0, 1);
			be->close(dev);
			if (!(dev = tc_open(NULL, "1")))
				break;
			tc_moe_case_l(dev, BATON_DT_Q4_K, 200, 256, 256, 40, 4, 1, 0);
			tc_moe_case_l(dev, BATON_DT_BF16, 200, 256, 256, 40, 4, 1, 1);
			be->close(dev);
		}
	unsetenv("BATON_TC_EXPERT_GEMM");
	unsetenv("BATON_TC_INPLACE");
	unsetenv("BATON_TC_EG_ROWS");
}

static void t_tensor_cores(void)
{
	struct baton_dev *dev = tc_open(NULL, NULL);
	if (!dev)
		return;
	const int dts[] = { BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0, BATON_DT_Q4_K,
		BATON_DT_Q5_K, BATON_DT_Q6_K, BATON_DT_Q4_0, BATON_DT_Q4_1, BATON_DT_Q5_0,
		BATON_DT_Q5_1, BATON_DT_IQ4_NL, BATON_DT_MXFP4, BATON_DT_Q2_K, BATON_DT_Q3_K,
		BATON_DT_IQ4_XS };
	for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
		const int dt = dts[i];
		tc_matmul_case(dev, dt, 300, 512, 70, 1, 0, 0);
		tc_matmul_case(dev, dt, 64, blk256(dt) ? 1280 : 1088, 100, 0, 1, 0);
		/* at odd addresses: the element decoder (bf16: decoded, not in place) */
		tc_matmul_case(dev, dt, 40, 512, 64, 0, 0, dt == BATON_DT_BF16 ? 2 : 1);
		tc_moe_case(dev, dt, 96, 256, 256, 6, 2, 0);
	}
	tc_moe_case(dev, BATON_DT_Q4_K, 200, 256, 256, 40, 4, 1);
	tc_x_reuse_case(dev);
	/* f32 weights stay on the exact kernels: the host's bits at 70 rows */
	matmul_case(dev, BATON_DT_F32, 37, 512, 70, BATON_DT_F32, 0);
	/* without a bias on baton_tc_mm_f32: the same bits (a router's shape,
	 * outputs and rows off its tiles, accumulating, a tail of k) */
	matmul_case(dev, BATON_DT_F32, 128, 2048, 300, -1, 0);
	matmul_case(dev, BATON_DT_F32, 37, 512, 70, -1, 1);
	matmul_case(dev, BATON_DT_F32, 60, 96, 65, -1, 0);
	matmul_case(dev, BATON_DT_F32, 21, 77, 64, -1, 1);
	for (int paged = 0; paged < 2; paged++) {
		tc_attention_case(dev, 100, 0, 8, 2, 64, paged);
		tc_attention_case(dev, 70, 300, 4, 4, 128, paged);
		tc_attention_case(dev, 64, 37, 6, 3, 72, paged);
		tc_attention_case(dev, 600, 40, 4, 2, 64, paged); /* in groups of 256 queries */
	}
	be->close(dev);
	/* a small scratch: weights in slabs, experts in groups, queries in groups */
	if (!(dev = tc_open(NULL, "1")))
		return;
	tc_matmul_case(dev, BATON_DT_Q4_K, 2100, 256, 65, 1, 1, 0);
	tc_moe_case(dev, BATON_DT_Q4_K, 96, 256, 256, 6, 2, 0);
	tc_moe_case(dev, BATON_DT_Q4_K, 200, 256, 256, 40, 4, 1);
	tc_attention_case(dev, 200, 500, 8, 2, 64, 1);
	be->close(dev);
	/* bf16 matmuls on egemm.cu's kernel (BATON_TC_MM_EG=1): rows off its
	 * tiles, accumulating, with a bias; shapes it does not take go to cuBLAS */
	T_ASSERT(setenv("BATON_TC_MM_EG", "1", 1) == 0);
	dev = tc_open(NULL, NULL);
	unsetenv("BATON_TC_MM_EG");
	if (!dev)
		return;
	tc_matmul_case(dev, BATON_DT_BF16, 256, 512, 100, 0, 0, 0);
	tc_matmul_case(dev, BATON_DT_BF16, 384, 2048, 70, 1, 1, 0);
	tc_matmul_case(dev, BATON_DT_BF16, 300, 512, 64, 0, 1, 0);
	be->close(dev);
	T_ASSERT(setenv("BATON_TC_MM_EG", "1", 1) == 0);
	T_ASSERT(setenv("BATON_TC_EG_ROWS", "128", 1) == 0);
	dev = tc_open(NULL, NULL);
	unsetenv("BATON_TC_MM_EG");
	unsetenv("BATON_TC_EG_ROWS");
	if (!dev)
		return;
	tc_matmul_case(dev, BATON_DT_BF16, 384, 2048, 200, 1, 1, 0);
	be->close(dev);
}

/* prepare starts the tensor-core path for passes of at least its rows
 * (what the first such pass would do), and not for fewer. */
static void t_prepare(void)
{
	T_ASSERT(setenv("BATON_CUDA_GEMM_ROWS", "64", 1) == 0);
	struct baton_dev *dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_GEMM_ROWS");
	char line[768];
	T_OK(be->prepare(dev, 63));
	cuda_backend_describe(dev, line, sizeof line);
	T_ASSERT_MSG(strstr(line, "not asked yet"), "%s", line);
	T_OK(be->prepare(dev, 64));
	cuda_backend_describe(dev, line, sizeof line);
	printf("  %s\n", line);
	T_ASSERT_MSG(strstr(line, "tensor cores through cuBLAS") || strstr(line, "tensor cores off"),
	    "%s", line);
	T_OK(be->prepare(dev, 4096)); /* again: nothing more */
	be->close(dev);
}

T_MAIN(T_CASE(t_prepare), T_CASE_TIMEOUT(t_tensor_cores, 120), T_CASE_TIMEOUT(t_tc_expert_gemms, 120))
