/*
 * quant_test.c: the host's kernels for the other block types real GGUF
 * files use (q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, iq4_nl, iq4_xs, mxfp4;
 * decoders in arena/quant.c) against ggml.
 *
 * arena/testdata/quant_<type>.bin holds blocks and their values as ggml's
 * own dequantize_row_<type> computes them (quant_gen.sh): random blocks
 * (random bits, every kind of f16 scale: zero, subnormal, negative, the
 * largest; mxfp4's exponent edges) and blocks ggml's quantizer made from
 * varied rows. Decoding must give those values bit for bit, at any
 * alignment, with the baseline and the AVX2 decoders; the dot kernels
 * must give the contract's bits (host.h: 32 lanes, a fixed tree) of those
 * values, for rows of any whole number of blocks (1,408 columns: the
 * q5_0 / q8_0 fallback rows of Qwen1.5-MoE's experts).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "arena/testdata/kquant_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/ref_math.h"
#include "tests/t.h"

static const struct { const char *name; int dt; uint32_t block; } kinds[] = {
	{ "q4_0", BATON_DT_Q4_0, 32 }, { "q4_1", BATON_DT_Q4_1, 32 },
	{ "q5_0", BATON_DT_Q5_0, 32 }, { "q5_1", BATON_DT_Q5_1, 32 },
	{ "q2_K", BATON_DT_Q2_K, 256 }, { "q3_K", BATON_DT_Q3_K, 256 },
	{ "iq4_nl", BATON_DT_IQ4_NL, 32 }, { "iq4_xs", BATON_DT_IQ4_XS, 256 },
	{ "mxfp4", BATON_DT_MXFP4, 32 },
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static uint64_t rng = 0x13198a2e03707344ull;

static uint64_t rnd(void) /* splitmix64 */
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static float uniform1(void) /* [-1, 1) */
{
	return (float)((double)(rnd() >> 11) * 0x1p-52 - 1.0);
}

static uint32_t fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static void check_values(const char *name, const char *what, const float *got,
    const float *want, size_t n)
{
	for (size_t i = 0; i < n; i++)
		T_ASSERT_MSG(fbits(got[i]) == fbits(want[i]), "%s %s [%zu]: %a, ggml %a",
		    name, what, i, got[i], want[i]);
}

static void t_dequant_matches_ggml(void)
{
	for (size_t k = 0; k < NKINDS; k++) {
		const int dt = kinds[k].dt;
		struct kq_fixture fx;
		kq_fixture_load_from(&fx, "quant", kinds[k].name);
		T_EQ_INT(fx.type, dt);
		T_EQ_INT(baton_compute_row_bytes(dt, 256), fx.bytes);
		T_EQ_INT(baton_dtype_row_bytes(dt, 256), fx.bytes);
		T_EQ_INT(host_can_compute(dt), 1);
		T_EQ_INT(baton_quant_decodes(dt), 1);

		size_t nmax = fx.n_dq > fx.n_q ? fx.n_dq : fx.n_q;
		float *got = malloc(nmax * 256 * sizeof(float));
		uint8_t *buf = malloc(nmax * fx.bytes + 3);
		const uint32_t bb = (uint32_t)baton_dtype_row_bytes(dt, kinds[k].block);
		for (int align = 0; align < 4; align += 3) {
			/* The random blocks as one row, then each block alone. */
			memcpy(buf + align, fx.dq_blocks, (size_t)fx.n_dq * fx.bytes);
			T_OK(baton_dequant_row(dt, buf + align, got, fx.n_dq * 256));
			check_values(kinds[k].name, "random blocks", got, fx.dq_values, (size_t)fx.n_dq * 256);
			uint32_t nb = fx.n_dq * 256 / kinds[k].block;
			for (uint32_t b = 0; b < nb; b++) {
				const uint8_t *blk = buf + align + (size_t)b * bb;
				float one[256];
				const float *want = fx.dq_values + (size_t)b * kinds[k].block;
				baton_quant_decode(dt, blk, one, kinds[k].block);
				check_values(kinds[k].name, "one block", one, want, kinds[k].block);
#if BATON_KQUANT_AVX2
				if (__builtin_cpu_supports("avx2")) {
					baton_quant_decode_avx2(dt, blk, one, kinds[k].block);
					check_values(kinds[k].name, "one block (avx2)", one, want, kinds[k].block);
				}
#endif
			}
			memcpy(buf + align, fx.q_blocks, (size_t)fx.n_q * fx.bytes);
			T_OK(baton_dequant_row(dt, buf + align, got, fx.n_q * 256));
			check_values(kinds[k].name, "quantised rows", got, fx.q_values, (size_t)fx.n_q * 256);
		}
		/* The quantizer's rows are not all zero: the check saw values. */
		int nonzero = 0;
		for (size_t i = 0; i < (size_t)fx.n_q * 256; i++)
			nonzero += fx.q_values[i] != 0.0f;
		T_ASSERT(nonzero > 1000);
		printf("  %s: %u random and %u quantised runs of 256 bit-exact with ggml\n",
		    kinds[k].name, fx.n_dq, fx.n_q);
		free(got);
		free(buf);
		kq_fixture_free(&fx);
	}
}

/* Dot products over rows made of the fixture's quantised blocks (finite,
 * realistic values): whole numbers of blocks, from one block to all. */
static void t_dot_contract(void)
{
	enum { NX = 11 };

	for (int avx2 = 0; avx2 < 2; avx2++) {
		if (baton_kernels_avx2(avx2) != avx2) {
			printf("  no AVX2/F16C on this CPU: baseline kernels only\n");
			break;
		}
		for (size_t k = 0; k < NKINDS; k++) {
			const int dt = kinds[k].dt;
			const uint32_t blk = kinds[k].block;
			const uint32_t bb = (uint32_t)baton_dtype_row_bytes(dt, blk);
			struct kq_fixture fx;
			kq_fixture_load_from(&fx, "quant", kinds[k].name);
			uint32_t maxc = fx.n_q * 256;
			float *xv[NX];
			for (int v = 0; v < NX; v++) {
				xv[v] = malloc(maxc * sizeof(float));
				for (uint32_t i = 0; i < maxc; i++)
					xv[v][i] = uniform1();
			}
			uint8_t *buf = malloc((size_t)fx.n_q * fx.bytes + 1);
			memcpy(buf + 1, fx.q_blocks, (size_t)fx.n_q * fx.bytes);
			/* In elements; those not a multiple of the block are skipped. */
			const uint32_t cols_of[] = { 32, 64, 160, 256, 384, 512, 1408, 1792, 2816, maxc };
			int tried = 0;
			for (size_t c = 0; c < sizeof cols_of / sizeof cols_of[0]; c++) {
				uint32_t cols = cols_of[c];
				if (cols % blk)
					continue;
				tried++;
				/* From an odd address, starting at block 1 when it fits. */
				int skip = cols + blk <= maxc;
				const uint8_t *row = buf + 1 + (skip ? bb : 0);
				const float *w = fx.q_values + (skip ? blk : 0);
				float got[NX], one;
				T_OK(baton_dot_rows(dt, row, cols, (const float *const *)xv, NX, got));
				for (int v = 0; v < NX; v++) {
					float want = canon_dot(w, xv[v], cols);
					T_OK(baton_dot_row(dt, row, xv[v], cols, &one));
					T_ASSERT_MSG(fbits(one) == fbits(want), "%s avx2 %d cols %u: %a, want %a",
					    kinds[k].name, avx2, cols, one, want);
					T_ASSERT_MSG(fbits(got[v]) == fbits(want),
					    "%s avx2 %d cols %u v %d: rows %a, want %a", kinds[k].name, avx2, cols,
					    v, got[v], want);
				}
			}
			T_ASSERT(tried >= 5);
			for (int v = 0; v < NX; v++)
				free(xv[v]);
			free(buf);
			kq_fixture_free(&fx);
		}
	}
	baton_kernels_avx2(1);
}

static void t_bad_args(void)
{
	uint8_t row[256 * 2] = { 0 };
	float x[512] = { 0 }, out;

	for (size_t k = 0; k < NKINDS; k++) {
		const int dt = kinds[k].dt;
		const uint32_t blk = kinds[k].block;
		T_EQ_INT(baton_compute_row_bytes(dt, blk / 2), 0);
		T_EQ_INT(baton_compute_row_bytes(dt, 0), 0);
		T_EQ_INT(baton_compute_row_bytes(dt, 512), 2 * baton_dtype_row_bytes(dt, 256));
		T_EQ_ERR(baton_dequant_row(dt, row, x, blk - 1), BATON_EINVAL);
		T_EQ_ERR(baton_dequant_row(dt, row, x, blk + 1), BATON_EINVAL);
		T_EQ_ERR(baton_dot_row(dt, row, x, blk + 16, &out), BATON_EINVAL);
		T_EQ_ERR(baton_dot_row(dt, NULL, x, 256, &out), BATON_EINVAL);
		T_OK(baton_dot_row(dt, row, x, 256, &out));
		T_ASSERT(out == 0.0f);
	}
	/* The IQ1/IQ2/IQ3 and ternary families are not computed. */
	const int no[] = { BATON_DT_IQ2_XXS, BATON_DT_IQ2_XS, BATON_DT_IQ2_S, BATON_DT_IQ3_XXS,
		BATON_DT_IQ3_S, BATON_DT_IQ1_S, BATON_DT_IQ1_M, BATON_DT_TQ1_0, BATON_DT_TQ2_0,
		BATON_DT_Q8_1, BATON_DT_Q8_K };
	for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
		T_EQ_INT(host_can_compute(no[i]), 0);
		T_EQ_INT(baton_quant_decodes(no[i]), 0);
		T_EQ_ERR(baton_dot_row(no[i], row, x, 256, &out), BATON_EUNSUPPORTED);
	}
}

T_MAIN(T_CASE(t_dequant_matches_ggml), T_CASE_TIMEOUT(t_dot_contract, 60), T_CASE(t_bad_args))
