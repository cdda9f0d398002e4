/*
 * dtype_kquant.c: decoding ggml's K-quants Q4_K, Q5_K and Q6_K, the types
 * of llama.cpp's Q4_K_M and Q5_K_M files, one 256-element super-block at a
 * time; dtype.c's row kernels call it per chunk (a chunk is one block).
 *
 * The values are ggml's (dequantize_row_q{4,5,6}_K of ggml-quants.c), bit
 * for bit; engine/backend/host/kquant_test.c checks them against blocks and values made
 * by ggml's own code (arena/testdata). Layouts: see arena/kquant.c.
 *   q4_K: x = (d * sc_j) * q - dmin * m_j, q in 0..15, 8 sub-blocks of 32
 *   q5_K: the same with q in 0..31 (fifth bit from qh)
 *   q6_K: x = (d * sc_j) * q, q in -32..31, 16 sub-blocks of 16
 * Every product is exact in f32 (at most 11 + 8 + 6 bits), so q6_K values
 * are exact and q4_K / q5_K round once, in the subtraction: a fused
 * multiply-add of (d * sc_j, q, -dmin * m_j) gives the same bits, which is
 * why the CUDA kernels may contract it.
 */
#include <stdint.h>
#include <string.h>

#include "engine/backend/host/host.h"

static inline float f16_at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return baton_f16_to_f32(h);
}

/* Scale and min j (0..7) from q4_K / q5_K's 12 packed bytes. */
static inline void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
	}
}

/* q4_K (qh NULL) and q5_K: 64 elements per step, two sub-blocks sharing
 * the bytes of qs (low and high nibble); loops of 32 that gcc vectorizes. */
#define ALWAYS_INLINE __attribute__((always_inline)) inline

static ALWAYS_INLINE void decode_k4k5(const uint8_t *blk, const uint8_t *qh, const uint8_t *qs,
    float *restrict y)
{
	const float d = f16_at(blk), min = f16_at(blk + 2);
	const uint8_t *sc = blk + 4;

	for (int j = 0; j < 4; j++) {
		uint8_t s, m;
		scale_min_k4(2 * j, sc, &s, &m);
		const float d1 = d * s, m1 = min * m;
		scale_min_k4(2 * j + 1, sc, &s, &m);
		const float d2 = d * s, m2 = min * m;
		const uint8_t *q = qs + 32 * j;
		float *restrict y1 = y + 64 * j, *restrict y2 = y1 + 32;

		if (qh) {
			const int s1 = 2 * j, s2 = 2 * j + 1; /* the fifth bits */
			for (int l = 0; l < 32; l++) {
				int hi1 = ((qh[l] >> s1) & 1) << 4, hi2 = ((qh[l] >> s2) & 1) << 4;
				y1[l] = d1 * (float)((q[l] & 0xF) + hi1) - m1;
				y2[l] = d2 * (float)((q[l] >> 4) + hi2) - m2;
			}
		} else {
			for (int l = 0; l < 32; l++) {
				y1[l] = d1 * (float)(q[l] & 0xF) - m1;
				y2[l] = d2 * (float)(q[l] >> 4) - m2;
			}
		}
	}
}

/* Per half (128 values), as ggml walks it: byte l of ql and ql + 32 and
 * of qh give values l, l + 32, l + 64, l + 96 (low nibbles, then high;
 * two bits of qh each); the scale is 8 n + l / 16 + 0, 2, 4, 6. Loops of 16
 * with fixed scales and shifts, which gcc vectorizes. */
static ALWAYS_INLINE void decode_q6_k(const uint8_t *blk, float *restrict y)
{
	const int8_t *sc = (const int8_t *)(blk + 192);
	const float d = f16_at(blk + 208);

	for (int n = 0; n < 2; n++) {
		const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
		float *restrict o = y + 128 * n;
		for (int h = 0; h < 2; h++) {
			const int8_t *s = sc + 8 * n + h;
			const float d1 = d * (float)s[0], d2 = d * (float)s[2];
			const float d3 = d * (float)s[4], d4 = d * (float)s[6];
			for (int l = 16 * h; l < 16 * h + 16; l++) {
				const int a = ql[l], b = ql[l + 32], c = qh[l];
				o[l] = d1 * (float)(((a & 0xF) | ((c & 3) << 4)) - 32);
				o[l + 32] = d2 * (float)(((b & 0xF) | (((c >> 2) & 3) << 4)) - 32);
				o[l + 64] = d3 * (float)(((a >> 4) | (((c >> 4) & 3) << 4)) - 32);
				o[l + 96] = d4 * (float)(((b >> 4) | (((c >> 6) & 3) << 4)) - 32);
			}
		}
	}
}

int kquant_is(int dtype)
{
	return dtype == BATON_DT_Q4_K || dtype == BATON_DT_Q5_K || dtype == BATON_DT_Q6_K;
}

static ALWAYS_INLINE void decode_block(int dtype, const uint8_t *blk, float *out)
{
	switch (dtype) {
	case BATON_DT_Q4_K:
		decode_k4k5(blk, NULL, blk + 16, out);
		break;
	case BATON_DT_Q5_K:
		decode_k4k5(blk, blk + 16, blk + 48, out);
		break;
	default: /* BATON_DT_Q6_K */
		decode_q6_k(blk, out);
		break;
	}
}

/* The same code compiled twice: for the baseline (SSE2) and, where the
 * CPU has it, AVX2 (wider vectors for the same element-wise operations:
 * no sums, no FMA, so the values are the same bits). */
static void decode_block_base(int dtype, const uint8_t *blk, float *out)
{
	decode_block(dtype, blk, out);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2"))) static void decode_block_avx2(int dtype, const uint8_t *blk,
    float *out)
{
	decode_block(dtype, blk, out);
}
#endif

void kquant_decode_block(int dtype, const uint8_t *blk, float *out)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (baton_kernels_avx2(-1)) {
		decode_block_avx2(dtype, blk, out);
		return;
	}
#endif
	decode_block_base(dtype, blk, out);
}
