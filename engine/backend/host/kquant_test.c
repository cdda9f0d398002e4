/*
 * kquant_test.c: the host's Q4_K, Q5_K and Q6_K kernels against ggml.
 *
 * arena/testdata holds blocks and their values as ggml's own
 * dequantize_row_q{4,5,6}_K computes them (quant_gen.sh): random blocks
 * (random bits, every kind of f16 scale: zero, subnormal, negative, the
 * largest) and blocks ggml's quantizer made from varied rows. Decoding
 * must give those values bit for bit, at any alignment; the dot kernels
 * must give the contract's bits (host.h: 32 lanes, a fixed tree) of
 * those values, with the baseline and the AVX2 kernels, one vector or many.
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

static const struct { const char *name; int dt; } kinds[] = {
	{ "q4_K", BATON_DT_Q4_K }, { "q5_K", BATON_DT_Q5_K }, { "q6_K", BATON_DT_Q6_K },
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static uint64_t rng = 0x243f6a8885a308d3ull;

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
		T_ASSERT_MSG(fbits(got[i]) == fbits(want[i]), "%s %s [%zu] (block %zu): %a, ggml %a",
		    name, what, i, i / 256, got[i], want[i]);
}

static void t_dequant_matches_ggml(void)
{
	for (size_t k = 0; k < NKINDS; k++) {
		struct kq_fixture fx;
		kq_fixture_load(&fx, kinds[k].name);
		T_EQ_INT(fx.type, kinds[k].dt);
		T_EQ_INT(baton_compute_row_bytes(kinds[k].dt, 256), fx.bytes);
		T_EQ_INT(host_can_compute(kinds[k].dt), 1);

		size_t nmax = fx.n_dq > fx.n_q ? fx.n_dq : fx.n_q;
		float *got = malloc(nmax * 256 * sizeof(float));
		uint8_t *buf = malloc(nmax * fx.bytes + 3);
		for (int align = 0; align < 4; align += 3) {
			/* The random blocks as one row, then each alone. */
			memcpy(buf + align, fx.dq_blocks, (size_t)fx.n_dq * fx.bytes);
			T_OK(baton_dequant_row(kinds[k].dt, buf + align, got, fx.n_dq * 256));
			check_values(kinds[k].name, "random blocks", got, fx.dq_values, (size_t)fx.n_dq * 256);
			for (uint32_t b = 0; b < fx.n_dq; b++) {
				const uint8_t *blk = buf + align + (size_t)b * fx.bytes;
				float one[256];
				baton_kquant_decode_block(kinds[k].dt, blk, one);
				check_values(kinds[k].name, "one block", one, fx.dq_values + 256 * b, 256);
#if BATON_KQUANT_AVX2
				if (__builtin_cpu_supports("avx2")) {
					baton_kquant_decode_block_avx2(kinds[k].dt, blk, one);
					check_values(kinds[k].name, "one block (avx2)", one,
					    fx.dq_values + 256 * b, 256);
				}
#endif
			}
			memcpy(buf + align, fx.q_blocks, (size_t)fx.n_q * fx.bytes);
			T_OK(baton_dequant_row(kinds[k].dt, buf + align, got, fx.n_q * 256));
			check_values(kinds[k].name, "quantised rows", got, fx.q_values, (size_t)fx.n_q * 256);
		}
		printf("  %s: %u random and %u quantised blocks bit-exact with ggml\n",
		    kinds[k].name, fx.n_dq, fx.n_q);
		free(got);
		free(buf);
		kq_fixture_free(&fx);
	}
}

/* Dot products over rows made of the fixture's quantised blocks (finite,
 * realistic values), one to all of them long. */
static void t_dot_contract(void)
{
	enum { NX = 11 };

	for (int avx2 = 0; avx2 < 2; avx2++) {
		if (baton_kernels_avx2(avx2) != avx2) {
			printf("  no AVX2/F16C on this CPU: baseline kernels only\n");
			break;
		}
		for (size_t k = 0; k < NKINDS; k++) {
			struct kq_fixture fx;
			kq_fixture_load(&fx, kinds[k].name);
			uint32_t maxc = fx.n_q * 256;
			float *xv[NX];
			for (int v = 0; v < NX; v++) {
				xv[v] = malloc(maxc * sizeof(float));
				for (uint32_t i = 0; i < maxc; i++)
					xv[v][i] = uniform1();
			}
			uint8_t *buf = malloc((size_t)fx.n_q * fx.bytes + 1);
			memcpy(buf + 1, fx.q_blocks, (size_t)fx.n_q * fx.bytes);
			const uint32_t nblk[] = { 1, 2, 3, 7, 11, fx.n_q };
			for (size_t c = 0; c < sizeof nblk / sizeof nblk[0]; c++) {
				uint32_t cols = nblk[c] * 256;
				/* From an odd address, starting at block 1 when it fits. */
				const uint8_t *row = buf + 1 + (nblk[c] < fx.n_q ? fx.bytes : 0);
				const float *w = fx.q_values + (nblk[c] < fx.n_q ? 256 : 0);
				float got[NX], one;
				T_OK(baton_dot_rows(kinds[k].dt, row, cols, (const float *const *)xv, NX, got));
				for (int v = 0; v < NX; v++) {
					float want = canon_dot(w, xv[v], cols);
					T_OK(baton_dot_row(kinds[k].dt, row, xv[v], cols, &one));
					T_ASSERT_MSG(fbits(one) == fbits(want), "%s avx2 %d cols %u: %a, want %a",
					    kinds[k].name, avx2, cols, one, want);
					T_ASSERT_MSG(fbits(got[v]) == fbits(want), "%s avx2 %d cols %u v %d: rows %a, want %a",
					    kinds[k].name, avx2, cols, v, got[v], want);
				}
			}
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
	uint8_t row[210 * 2] = { 0 };
	float x[512] = { 0 }, out;

	for (size_t k = 0; k < NKINDS; k++) {
		int dt = kinds[k].dt;
		T_EQ_INT(baton_compute_row_bytes(dt, 128), 0);
		T_EQ_INT(baton_compute_row_bytes(dt, 0), 0);
		T_EQ_INT(baton_compute_row_bytes(dt, 512), 2 * baton_dtype_row_bytes(dt, 256));
		T_EQ_ERR(baton_dequant_row(dt, row, x, 255), BATON_EINVAL);
		T_EQ_ERR(baton_dequant_row(dt, row, x, 257), BATON_EINVAL);
		T_EQ_ERR(baton_dot_row(dt, row, x, 32, &out), BATON_EINVAL);
		T_EQ_ERR(baton_dot_row(dt, NULL, x, 256, &out), BATON_EINVAL);
		T_OK(baton_dot_row(dt, row, x, 256, &out));
		T_ASSERT(out == 0.0f);
	}
}

T_MAIN(T_CASE(t_dequant_matches_ggml), T_CASE_TIMEOUT(t_dot_contract, 60), T_CASE(t_bad_args))
