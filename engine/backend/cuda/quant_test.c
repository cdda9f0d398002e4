/*
 * quant_test.c: the cuda backend's MoE route and experts in the
 * quantized dtypes on a real GPU (built only with CUDA=1; without a
 * driver or a device every case prints "skip: why" and passes): q8_0, the
 * K-quants q4_K, q5_K and q6_K, and the block types of arena/quant.c
 * (q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4, q2_K, q3_K, iq4_xs), each
 * against the double-precision reference and the host backend
 * (cuda_moe_fixture.h's check_layer, with cuda_test.c's tolerances). (The
 * K-quants' values come from arena/kquant.c's decoder, which
 * engine/backend/host/kquant_test.c checks bit for bit against ggml.)
 */
#include <stdlib.h>
#include <time.h>

#include "engine/backend/cuda/cuda_moe_fixture.h"
#include "tests/t.h"

static void t_moe_q8_0(void)
{
	check_layer(BATON_DT_Q8_0, 5, 256, 96, 16, 4, 0);
	check_layer(BATON_DT_Q8_0, 3, 96, 64, 8, 2, 1);
	check_layer(BATON_DT_Q8_0, 20, 128, 64, 4, 2, 0);
}

/* The K-quants: rows of whole 256-value blocks; vector loads (aligned),
 * the scalar path (misaligned), and chunks of several tokens. */
static void check_kquant(int dt)
{
	check_layer(dt, 5, 512, 256, 16, 4, 0);
	check_layer(dt, 3, 256, 512, 8, 2, 1);
	check_layer(dt, 20, 256, 256, 4, 2, 0);
	/* batch 1, Qwen3-30B-A3B's d_ff (3 blocks) and top-8; rows of 10
	 * blocks (more than the wide q4_K gate_up's one item a lane) */
	check_layer(dt, 1, 512, 768, 16, 8, 0);
	check_layer(dt, 1, 2560, 512, 8, 4, 0);
}

/* q4_K's batch 1 also on the 16-thread-per-block kernels that the wide
 * ones replace where rows are 16-byte aligned (BATON_CUDA_MMVQ_NARROW=1,
 * read at open): both within the same tolerance of the reference. */
static void t_moe_q4_K(void)
{
	check_kquant(BATON_DT_Q4_K);
	setenv("BATON_CUDA_MMVQ_NARROW", "1", 1);
	check_layer(BATON_DT_Q4_K, 1, 512, 768, 16, 8, 0);
	check_layer(BATON_DT_Q4_K, 1, 2560, 512, 8, 4, 0);
	unsetenv("BATON_CUDA_MMVQ_NARROW");
}

/* The block types of arena/quant.c (the scalar path, byte loads, at any
 * alignment): blocks of 32 at the demo models' shapes (D 192, F 128, rows
 * not whole 256-value blocks) and of 256. */
static void t_moe_bquant(void)
{
	const int b32[] = { BATON_DT_Q4_0, BATON_DT_Q4_1, BATON_DT_Q5_0, BATON_DT_Q5_1,
		BATON_DT_IQ4_NL, BATON_DT_MXFP4 };
	for (size_t i = 0; i < sizeof b32 / sizeof b32[0]; i++) {
		check_layer(b32[i], 1, 192, 128, 8, 2, 0); /* batch 1: the decode kernels */
		check_layer(b32[i], 5, 192, 128, 8, 2, 0);
		check_layer(b32[i], 3, 96, 64, 8, 2, 1);
	}
	const int b256[] = { BATON_DT_Q2_K, BATON_DT_Q3_K, BATON_DT_IQ4_XS };
	for (size_t i = 0; i < sizeof b256 / sizeof b256[0]; i++) {
		check_layer(b256[i], 1, 512, 256, 8, 2, 0);
		check_layer(b256[i], 5, 512, 256, 8, 2, 0);
		check_layer(b256[i], 3, 256, 256, 4, 2, 1);
	}
}
/* q4_K at 2 .. 64 rows on the device route: moe_rows.cu's grouped
 * experts (an expert's rows read once for its pairs). Qwen3-30B-A3B's
 * widths (d_model 2048: a lane each of 8 blocks; d_ff 768: down's 3
 * blocks) at serving's 16 rows (top-4 of 8: the double reference's
 * time); 63 rows on 8 experts (up to 63 pairs of one expert; 64 rows and
 * more would take the tensor-core path in check_layer's moe_experts, whose
 * bf16 error is above its tolerance); a pass of 2. */
static void t_moe_rows_q4_K(void)
{
	check_layer(BATON_DT_Q4_K, 16, 2048, 768, 8, 4, 0);
	check_layer(BATON_DT_Q4_K, 63, 256, 256, 8, 4, 0);
	check_layer(BATON_DT_Q4_K, 2, 512, 256, 32, 8, 0);
}

/* moe_experts_dev's speed at Qwen3-30B-A3B's expert shape (q4_K, 128
 * experts of 2,048 x 768, top-8) at 1 .. 64 rows: one expert's valid
 * random rows copied to all 128 (each read from DRAM), random distinct
 * ids a row; the time of a call back to back, and the distinct experts'
 * bytes over it. Figures only (no reference: t_moe_rows_q4_K checks). */
static void t_moe_rows_perf(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const int dt = BATON_DT_Q4_K;
	const uint32_t D = 2048, F = 768, E = 128, K = 8, RMAX = 64;
	const uint64_t gu = rowb(dt, D) * F, stride = up4k(3 * gu);
	uint8_t *one = calloc(1, stride);
	double *v = malloc(D * sizeof *v);
	T_ASSERT(one && v);
	for (uint32_t r = 0; r < F; r++) {
		for (uint32_t i = 0; i < D; i++)
			v[i] = urand() / 20;
		encode_row(dt, v, D, one + r * rowb(dt, D));
		for (uint32_t i = 0; i < D; i++)
			v[i] = urand() / 20;
		encode_row(dt, v, D, one + gu + r * rowb(dt, D));
	}
	for (uint32_t r = 0; r < D; r++) {
		for (uint32_t i = 0; i < F; i++)
			v[i] = urand() / 20;
		encode_row(dt, v, F, one + 2 * gu + r * rowb(dt, F));
	}
	const uint64_t g = be->granularity(dev), range = (E * stride + g - 1) / g * g;
	baton_dptr base = 0, tab = 0, sel = 0, x = 0, xn = 0;
	T_CU(dev, be->reserve(dev, range, &base));
	T_CU(dev, be->map(dev, base, range));
	for (uint32_t e = 0; e < E; e++) {
		struct baton_copy c = { base + e * stride, one, stride };
		T_CU(dev, be->copy_h2d(dev, &c, 1));
	}
	uint64_t *t = malloc(E * 8);
	uint32_t *ids = malloc(RMAX * K * 4);
	float *w = malloc(RMAX * K * 4), *hx = malloc((size_t)RMAX * D * 4);
	T_ASSERT(t && ids && w && hx);
	for (uint32_t e = 0; e < E; e++)
		t[e] = base + e * stride;
	for (uint32_t r = 0; r < RMAX; r++)
		for (uint32_t k = 0; k < K; k++) {
			uint32_t id, dup;
			do {
				id = (uint32_t)((urand() + 1) * 0.5 * E) % E;
				dup = 0;
				for (uint32_t j = 0; j < k; j++)
					dup |= ids[r * K + j] == id;
			} while (dup);
			ids[r * K + k] = id;
			w[r * K + k] = 1.0f / K;
		}
	for (size_t i = 0; i < (size_t)RMAX * D; i++)
		hx[i] = (float)urand() * 0.1f;
	T_CU(dev, be->alloc(dev, E * 8, &tab));
	T_CU(dev, be->alloc(dev, RMAX * K * 8, &sel));
	T_CU(dev, be->alloc(dev, (uint64_t)RMAX * D * 4, &x));
	T_CU(dev, be->alloc(dev, (uint64_t)RMAX * D * 4, &xn));
	struct baton_copy c[4] = { { tab, t, E * 8 }, { x, hx, (uint64_t)RMAX * D * 4 },
		{ xn, hx, (uint64_t)RMAX * D * 4 }, { sel + RMAX * K * 4, w, RMAX * K * 4 } };
	T_CU(dev, be->copy_h2d(dev, c, 4));
	const uint32_t bs[] = { 1, 2, 4, 8, 16, 32, 64 };
	for (size_t bi = 0; bi < sizeof bs / sizeof bs[0]; bi++) {
		const uint32_t B = bs[bi];
		/* this pass's ids: rows 0 .. B - 1 */
		struct baton_copy ci = { sel, ids, (uint64_t)B * K * 4 };
		T_CU(dev, be->copy_h2d(dev, &ci, 1));
		uint8_t seen[128] = { 0 };
		uint32_t distinct = 0;
		for (uint32_t i = 0; i < B * K; i++)
			distinct += !seen[ids[i]]++;
		struct baton_moe_layer l = {
			.batch = B, .d_model = D, .d_ff = F, .n_experts = E, .top_k = K, .x = x, .xn = xn,
			.gate_dtype = dt, .up_dtype = dt, .down_dtype = dt,
			.gate_off = 0, .up_off = gu, .down_off = 2 * gu,
		};
		for (int i = 0; i < 3; i++)
			T_CU(dev, be->moe_experts_dev(dev, &l, tab, sel, sel + RMAX * K * 4));
		T_CU(dev, be->sync(dev));
		const int N = 30;
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (int i = 0; i < N; i++)
			T_CU(dev, be->moe_experts_dev(dev, &l, tab, sel, sel + RMAX * K * 4));
		T_CU(dev, be->sync(dev));
		clock_gettime(CLOCK_MONOTONIC, &t1);
		const double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / N;
		const double gb = (double)distinct * 3 * gu / 1e9;
		printf("  q4_K experts %2u rows: %3u experts (%.1f MB), %8.1f us a call, %6.0f GB/s\n", B,
		    distinct, gb * 1e3, us, gb / (us * 1e-6));
		char name[64];
		snprintf(name, sizeof name, "moe_rows_q4_K_%u_us", B);
		fig(name, us, "us");
	}
	be->free(dev, tab), be->free(dev, sel), be->free(dev, x), be->free(dev, xn);
	T_CU(dev, be->unmap(dev, base, range));
	T_CU(dev, be->unreserve(dev, base, range));
	free(one), free(v), free(t), free(ids), free(w), free(hx);
	be->close(dev);
}

static void t_moe_q5_K(void) { check_kquant(BATON_DT_Q5_K); }
static void t_moe_q6_K(void) { check_kquant(BATON_DT_Q6_K); }

T_MAIN(T_CASE_TIMEOUT(t_moe_q8_0, 60), T_CASE_TIMEOUT(t_moe_q4_K, 60),
    T_CASE_TIMEOUT(t_moe_rows_q4_K, 180), T_CASE_TIMEOUT(t_moe_rows_perf, 60),
    T_CASE_TIMEOUT(t_moe_q5_K, 60), T_CASE_TIMEOUT(t_moe_q6_K, 60),
    T_CASE_TIMEOUT(t_moe_bquant, 90))
