/*
 * quant.c: the decoders of ggml's other block types that real quantized
 * GGUF files use (llama.cpp's Q4_0/Q5_0/Q8_0 files, the q5_0/q5_1/q8_0
 * fallbacks of its K-quant mixes for rows not divisible by 256, Q2_K and
 * Q3_K mixes, IQ4_NL / IQ4_XS, gpt-oss's MXFP4), and one entry point for
 * every block type the host backend decodes (arena.h: baton_quant_decode),
 * the K-quants of kquant.c included.
 *
 * Written from the block layouts of ggml-common.h and the dequantize_row_*
 * functions of ggml-quants.c, value for value: each value is the float
 * expression ggml evaluates, in its order (no fused multiply-add: -std=c11
 * does not contract), so the bits are ggml's (engine/backend/host/
 * quant_test.c checks them against values made by ggml's own code,
 * arena/testdata/quant_gen.sh).
 *
 * Layouts, little-endian ("d" an f16 scale, "m" an f16 offset):
 *   q4_0   (32, 18 bytes): d, qs[16]            x = (q - 8) * d, q a nibble
 *   q4_1   (32, 20 bytes): d, m, qs[16]         x = q * d + m
 *   q5_0   (32, 22 bytes): d, qh[4], qs[16]     x = (q - 16) * d, q 5 bits
 *   q5_1   (32, 24 bytes): d, m, qh[4], qs[16]  x = q * d + m
 *          byte j of qs holds elements j (low nibble) and j + 16 (high);
 *          bit i of the 32-bit qh is the fifth bit of element i.
 *   q2_K  (256, 84 bytes): scales[16] (a 4-bit scale and a 4-bit min per
 *          16 elements), qs[64] (2 bits each), d, dmin
 *          x = (d * sc) * q - dmin * mn
 *   q3_K (256, 110 bytes): hmask[32] (the third bit, set meaning "no -4"),
 *          qs[64] (low 2 bits), scales[12] (sixteen 6-bit scales), d
 *          x = (d * (sc - 32)) * (q - 4 * !hbit)
 *   iq4_nl (32, 18 bytes): d, qs[16]   x = d * kvalues[q], q a nibble
 *   iq4_xs (256, 136 bytes): d, u16 scales_h, scales_l[4], qs[128]: eight
 *          blocks of 32 with a 6-bit scale ls (low nibble from scales_l,
 *          two bits from scales_h): x = (d * (ls - 32)) * kvalues[q]
 *   mxfp4  (32, 17 bytes): e (an E8M0 exponent), qs[16]
 *          x = kvalues_fp4[q] * 2^(e - 128) (the table holds 2 * E2M1)
 * kvalues are ggml's non-linear 4-bit grid (kvalues_iq4nl) and the FP4
 * E2M1 values doubled (kvalues_fp4, the OCP MX spec's).
 *
 * The IQ2 / IQ3 / IQ1 families and the ternary TQ types are not here: they
 * index large lattice tables (ggml's iq2xxs_grid and the like) that are
 * not derived from a formula; they are imported byte-exact and refused by
 * the backends by name (engine/model).
 */
#include <string.h>

#include "arena/arena_int.h"

#define ALWAYS_INLINE __attribute__((always_inline)) inline

static const int8_t kv_iq4nl[16] = {
	-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

static const int8_t kv_fp4[16] = {
	0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

static inline float f16_at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return baton_f16_to_f32(h);
}

static inline uint32_t u32_at(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ggml_e8m0_to_fp32_half: 2^(e - 128); e 0 and 1 are the subnormals
 * 2^-128 and 2^-127. */
static inline float e8m0_half(uint8_t e)
{
	uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

/* ---- blocks of 32 ---------------------------------------------------------- */

static ALWAYS_INLINE void dec_q4_0(const uint8_t *b, float *restrict y)
{
	const float d = f16_at(b);
	const uint8_t *qs = b + 2;
	for (int j = 0; j < 16; j++) {
		y[j] = (float)((qs[j] & 0x0F) - 8) * d;
		y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
	}
}

static ALWAYS_INLINE void dec_q4_1(const uint8_t *b, float *restrict y)
{
	const float d = f16_at(b), m = f16_at(b + 2);
	const uint8_t *qs = b + 4;
	for (int j = 0; j < 16; j++) {
		y[j] = (float)(qs[j] & 0x0F) * d + m;
		y[j + 16] = (float)(qs[j] >> 4) * d + m;
	}
}

static ALWAYS_INLINE void dec_q5_0(const uint8_t *b, float *restrict y)
{
	const float d = f16_at(b);
	const uint32_t qh = u32_at(b + 2);
	const uint8_t *qs = b + 6;
	for (int j = 0; j < 16; j++) {
		const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
		y[j] = (float)(((qs[j] & 0x0F) | h0) - 16) * d;
		y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
	}
}

static ALWAYS_INLINE void dec_q5_1(const uint8_t *b, float *restrict y)
{
	const float d = f16_at(b), m = f16_at(b + 2);
	const uint32_t qh = u32_at(b + 4);
	const uint8_t *qs = b + 8;
	for (int j = 0; j < 16; j++) {
		const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
		y[j] = (float)((qs[j] & 0x0F) | h0) * d + m;
		y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
	}
}

static ALWAYS_INLINE void dec_iq4_nl(const uint8_t *b, float *restrict y)
{
	const float d = f16_at(b);
	const uint8_t *qs = b + 2;
	for (int j = 0; j < 16; j++) {
		y[j] = d * (float)kv_iq4nl[qs[j] & 0x0F];
		y[j + 16] = d * (float)kv_iq4nl[qs[j] >> 4];
	}
}

static ALWAYS_INLINE void dec_mxfp4(const uint8_t *b, float *restrict y)
{
	const float d = e8m0_half(b[0]);
	const uint8_t *qs = b + 1;
	for (int j = 0; j < 16; j++) {
		y[j] = (float)kv_fp4[qs[j] & 0x0F] * d;
		y[j + 16] = (float)kv_fp4[qs[j] >> 4] * d;
	}
}

/* ---- super-blocks of 256 ----------------------------------------------------- */

/* Per half (128 values, 32 bytes of qs): four shifts of 2 bits, each two
 * runs of 16 with their own scale byte (ggml's walk). */
static ALWAYS_INLINE void dec_q2_K(const uint8_t *b, float *restrict y)
{
	const uint8_t *scales = b, *qs = b + 16;
	const float d = f16_at(b + 80), dmin = f16_at(b + 82);

	for (int n = 0; n < 2; n++) {
		const uint8_t *q = qs + 32 * n;
		for (int j = 0; j < 4; j++) {
			const int shift = 2 * j;
			for (int h = 0; h < 2; h++) {
				const uint8_t sc = scales[8 * n + 2 * j + h];
				const float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
				float *restrict o = y + 128 * n + 32 * j + 16 * h;
				for (int l = 0; l < 16; l++)
					o[l] = dl * (float)((q[l + 16 * h] >> shift) & 3) - ml;
			}
		}
	}
}

/* The sixteen 6-bit scales of q3_K: the low nibbles of bytes 0..7 give
 * scales 0..7 and their high nibbles 8..15; bytes 8..11 hold the two high
 * bits of each, four to a byte (scale i: byte 8 + i % 4, bits 2 (i / 4)). */
static ALWAYS_INLINE void q3_K_scales(const uint8_t *s, int *out)
{
	for (int i = 0; i < 16; i++) {
		const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
		const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
		out[i] = (lo | hi << 4) - 32;
	}
}

static ALWAYS_INLINE void dec_q3_K(const uint8_t *b, float *restrict y)
{
	const uint8_t *hm = b, *qs = b + 32;
	const float d = f16_at(b + 108);
	int sc[16];

	q3_K_scales(b + 96, sc);
	for (int n = 0; n < 2; n++) {
		const uint8_t *q = qs + 32 * n;
		for (int j = 0; j < 4; j++) {
			const int shift = 2 * j;
			const uint8_t m = (uint8_t)(1u << (4 * n + j));
			for (int h = 0; h < 2; h++) {
				const float dl = d * (float)sc[8 * n + 2 * j + h];
				float *restrict o = y + 128 * n + 32 * j + 16 * h;
				for (int l = 0; l < 16; l++) {
					const int k = l + 16 * h;
					o[l] = dl * (float)(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
				}
			}
		}
	}
}

static ALWAYS_INLINE void dec_iq4_xs(const uint8_t *b, float *restrict y)
{
	const float d = f16_at(b);
	const unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
	const uint8_t *sl = b + 4, *qs = b + 8;

	for (int ib = 0; ib < 8; ib++) {
		const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xF) | (int)((sh >> (2 * ib)) & 3) << 4;
		const float dl = d * (float)(ls - 32);
		const uint8_t *q = qs + 16 * ib;
		float *restrict o = y + 32 * ib;
		for (int j = 0; j < 16; j++) {
			o[j] = dl * (float)kv_iq4nl[q[j] & 0xF];
			o[j + 16] = dl * (float)kv_iq4nl[q[j] >> 4];
		}
	}
}

/* ---- the entry points -------------------------------------------------------- */

int baton_quant_decodes(int dtype)
{
	switch (dtype) {
	case BATON_DT_Q4_0:
	case BATON_DT_Q4_1:
	case BATON_DT_Q5_0:
	case BATON_DT_Q5_1:
	case BATON_DT_Q2_K:
	case BATON_DT_Q3_K:
	case BATON_DT_Q4_K:
	case BATON_DT_Q5_K:
	case BATON_DT_Q6_K:
	case BATON_DT_IQ4_NL:
	case BATON_DT_IQ4_XS:
	case BATON_DT_MXFP4:
		return 1;
	default:
		return 0;
	}
}

static ALWAYS_INLINE void decode_blocks(int dtype, const uint8_t *src, float *out, uint32_t n)
{
	const uint32_t bs = arena_dtype_block(dtype), bb = arena_dtype_block_bytes(dtype);

	for (uint32_t e = 0; e < n; e += bs, src += bb, out += bs) {
		switch (dtype) {
		case BATON_DT_Q4_0: dec_q4_0(src, out); break;
		case BATON_DT_Q4_1: dec_q4_1(src, out); break;
		case BATON_DT_Q5_0: dec_q5_0(src, out); break;
		case BATON_DT_Q5_1: dec_q5_1(src, out); break;
		case BATON_DT_IQ4_NL: dec_iq4_nl(src, out); break;
		case BATON_DT_MXFP4: dec_mxfp4(src, out); break;
		case BATON_DT_Q2_K: dec_q2_K(src, out); break;
		case BATON_DT_Q3_K: dec_q3_K(src, out); break;
		case BATON_DT_IQ4_XS: dec_iq4_xs(src, out); break;
		default: baton_kquant_decode_block(dtype, src, out); break;
		}
	}
}

void baton_quant_decode(int dtype, const uint8_t *src, float *out, uint32_t n)
{
	decode_blocks(dtype, src, out, n);
}

#if BATON_KQUANT_AVX2
__attribute__((target("avx2"))) void baton_quant_decode_avx2(int dtype, const uint8_t *src,
    float *out, uint32_t n)
{
	if (baton_kquant_is(dtype)) {
		for (uint32_t e = 0; e < n; e += 256)
			baton_kquant_decode_block_avx2(dtype, src + (size_t)e / 256 * arena_dtype_block_bytes(dtype),
			    out + e);
		return;
	}
	decode_blocks(dtype, src, out, n);
}
#endif
