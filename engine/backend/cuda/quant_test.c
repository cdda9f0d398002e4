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
 * time); 64 rows on 8 experts (up to 64 pairs of
 * one expert); rows of 10 blocks (gate_up's second pass of 8) and down
 * rows of 5 (its second pass of 4); a pass of 2. */
static void t_moe_rows_q4_K(void)
{
	check_layer(BATON_DT_Q4_K, 16, 2048, 768, 8, 4, 0);
	check_layer(BATON_DT_Q4_K, 64, 256, 256, 8, 4, 0);
	check_layer(BATON_DT_Q4_K, 3, 2560, 512, 8, 4, 0);
	check_layer(BATON_DT_Q4_K, 4, 256, 1280, 8, 2, 0);
	check_layer(BATON_DT_Q4_K, 2, 512, 256, 32, 8, 0);
}
static void t_moe_q5_K(void) { check_kquant(BATON_DT_Q5_K); }
static void t_moe_q6_K(void) { check_kquant(BATON_DT_Q6_K); }

T_MAIN(T_CASE_TIMEOUT(t_moe_q8_0, 60), T_CASE_TIMEOUT(t_moe_q4_K, 60),
    T_CASE_TIMEOUT(t_moe_rows_q4_K, 180),
    T_CASE_TIMEOUT(t_moe_q5_K, 60), T_CASE_TIMEOUT(t_moe_q6_K, 60),
    T_CASE_TIMEOUT(t_moe_bquant, 90))
