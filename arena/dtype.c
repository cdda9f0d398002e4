/*
 * dtype.c: ggml's tensor types (block size, bytes per block, name), the
 * tree's one f16/bf16 codec, and the encoders the synthetic source needs
 * (f16, bf16, q8_0; the K-quants' are kquant.c's).
 *
 * The table follows ggml's type_traits (ggml.c) and the block structs of
 * ggml-common.h: a row of `cols` elements takes cols / block blocks.
 */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "arena/arena_int.h"

struct dt_traits {
	const char *name;
	uint32_t block;
	uint32_t bytes;
};

static const struct dt_traits dt_table[BATON_DT_COUNT] = {
	[BATON_DT_F32] = { "f32", 1, 4 },
	[BATON_DT_F16] = { "f16", 1, 2 },
	[BATON_DT_Q4_0] = { "q4_0", 32, 18 },
	[BATON_DT_Q4_1] = { "q4_1", 32, 20 },
	[BATON_DT_Q5_0] = { "q5_0", 32, 22 },
	[BATON_DT_Q5_1] = { "q5_1", 32, 24 },
	[BATON_DT_Q8_0] = { "q8_0", 32, 34 },
	[BATON_DT_Q8_1] = { "q8_1", 32, 36 },
	[BATON_DT_Q2_K] = { "q2_K", 256, 84 },
	[BATON_DT_Q3_K] = { "q3_K", 256, 110 },
	[BATON_DT_Q4_K] = { "q4_K", 256, 144 },
	[BATON_DT_Q5_K] = { "q5_K", 256, 176 },
	[BATON_DT_Q6_K] = { "q6_K", 256, 210 },
	[BATON_DT_Q8_K] = { "q8_K", 256, 292 },
	[BATON_DT_IQ2_XXS] = { "iq2_xxs", 256, 66 },
	[BATON_DT_IQ2_XS] = { "iq2_xs", 256, 74 },
	[BATON_DT_IQ3_XXS] = { "iq3_xxs", 256, 98 },
	[BATON_DT_IQ1_S] = { "iq1_s", 256, 50 },
	[BATON_DT_IQ4_NL] = { "iq4_nl", 32, 18 },
	[BATON_DT_IQ3_S] = { "iq3_s", 256, 110 },
	[BATON_DT_IQ2_S] = { "iq2_s", 256, 82 },
	[BATON_DT_IQ4_XS] = { "iq4_xs", 256, 136 },
	[BATON_DT_I8] = { "i8", 1, 1 },
	[BATON_DT_I16] = { "i16", 1, 2 },
	[BATON_DT_I32] = { "i32", 1, 4 },
	[BATON_DT_I64] = { "i64", 1, 8 },
	[BATON_DT_F64] = { "f64", 1, 8 },
	[BATON_DT_IQ1_M] = { "iq1_m", 256, 56 },
	[BATON_DT_BF16] = { "bf16", 1, 2 },
	[BATON_DT_TQ1_0] = { "tq1_0", 256, 54 },
	[BATON_DT_TQ2_0] = { "tq2_0", 256, 66 },
	[BATON_DT_MXFP4] = { "mxfp4", 32, 17 },
};

static const struct dt_traits *dt_get(int dtype)
{
	if (dtype < 0 || dtype >= BATON_DT_COUNT || !dt_table[dtype].name)
		return NULL;
	return &dt_table[dtype];
}

const char *baton_dtype_name(int dtype)
{
	const struct dt_traits *t = dt_get(dtype);
	return t ? t->name : NULL;
}

int baton_dtype_parse(const char *name)
{
	if (!name)
		return -1;
	for (int i = 0; i < BATON_DT_COUNT; i++)
		if (dt_table[i].name && strcasecmp(dt_table[i].name, name) == 0)
			return i;
	return -1;
}

uint64_t baton_dtype_row_bytes(int dtype, uint64_t cols)
{
	const struct dt_traits *t = dt_get(dtype);
	if (!t || cols % t->block != 0)
		return 0;
	uint64_t blocks = cols / t->block, bytes;
	if (__builtin_mul_overflow(blocks, (uint64_t)t->bytes, &bytes))
		return 0;
	return bytes;
}

uint32_t arena_dtype_block(int dtype)
{
	const struct dt_traits *t = dt_get(dtype);
	return t ? t->block : 0;
}

uint32_t arena_dtype_block_bytes(int dtype)
{
	const struct dt_traits *t = dt_get(dtype);
	return t ? t->bytes : 0;
}

/* ---- the f16 / bf16 codec ------------------------------------------------
 * The one codec of the tree (arena encodes with it, the engine decodes and
 * encodes with it). Its rules are those of the hardware conversions
 * (x86 F16C VCVTPS2PH / VCVTPH2PS, AVX512-BF16 VCVTNEPS2BF16), which is also
 * what numpy and torch give where they use those instructions:
 *   - narrowing rounds to nearest, ties to even; overflow gives infinity,
 *     tiny values subnormals or a signed zero;
 *   - a NaN stays a NaN, quiet (its quiet bit set), with its sign and the top
 *     bits of its payload. (torch's scalar c10::Half and c10::BFloat16 write
 *     the canonical 0x7E00 / 0x7FC0 instead: also quiet NaNs; keeping the
 *     payload is what the instructions do, so SIMD and scalar paths agree.)
 *   - f16 widening is exact; a signalling f16 NaN comes back quiet, as from
 *     VCVTPH2PS. bf16 widening is the 16-bit shift every library does.
 * No tables, no global state: thread-safe. */

static inline uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float f32_from(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* After F. Giesen's float_to_half_fast3_rtne. */
uint16_t baton_f32_to_f16(float f)
{
	uint32_t x = f32_bits(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;
	uint32_t o;

	if (ax > 0x7f800000u) {
		o = 0x7e00u | ((ax >> 13) & 0x3ffu); /* NaN: quiet, top payload */
	} else if (ax >= 0x477ff000u) {
		o = 0x7c00u; /* infinity, and >= 65520, which rounds to it */
	} else if (ax < 0x38800000u) {
		/* Below 2^-14: a subnormal or zero. Adding 0.5 (whose ulp is
		 * 2^-24) rounds to a multiple of 2^-24 in the FPU, ties to even. */
		o = f32_bits(f32_from(ax) + 0.5f) - 0x3f000000u;
	} else {
		uint32_t odd = (ax >> 13) & 1u;
		ax += 0xc8000fffu + odd; /* rebias 127 -> 15 and round */
		o = ax >> 13;
	}
	return (uint16_t)(o | sign);
}

/* Exact: normals by rebiasing the exponent, subnormals as
 * (0.5 + m * 2^-24) - 0.5 (both operands normal, the difference exact),
 * infinities and NaNs by setting the f32 exponent to all ones. */
float baton_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t em = h & 0x7fffu;
	uint32_t r;

	if (em >= 0x7c00u)
		r = 0x7f800000u | (em << 13) | (em > 0x7c00u ? 0x00400000u : 0);
	else if (em < 0x0400u)
		r = f32_bits(f32_from(0x3f000000u | em) - 0.5f);
	else
		r = (em << 13) + 0x38000000u;
	return f32_from(r | sign);
}

uint16_t baton_f32_to_bf16(float f)
{
	uint32_t x = f32_bits(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, sign and top payload */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

float baton_bf16_to_f32(uint16_t h)
{
	return f32_from((uint32_t)h << 16);
}

int arena_encode_row(int dtype, const float *x, uint64_t n, uint8_t *dst)
{
	switch (dtype) {
	case BATON_DT_F32:
		memcpy(dst, x, n * 4);
		return 0;
	case BATON_DT_F16:
		for (uint64_t i = 0; i < n; i++) {
			uint16_t h = baton_f32_to_f16(x[i]);
			memcpy(dst + 2 * i, &h, 2);
		}
		return 0;
	case BATON_DT_BF16:
		for (uint64_t i = 0; i < n; i++) {
			uint16_t h = baton_f32_to_bf16(x[i]);
			memcpy(dst + 2 * i, &h, 2);
		}
		return 0;
	case BATON_DT_Q8_0:
		/* ggml's block_q8_0: f16 scale d = amax / 127, then 32 int8
		 * round(x / d), as quantize_row_q8_0_ref does. */
		if (n % 32)
			return BATON_EINVAL;
		for (uint64_t b = 0; b < n / 32; b++) {
			const float *v = x + 32 * b;
			uint8_t *o = dst + 34 * b;
			float amax = 0.0f;
			for (int j = 0; j < 32; j++)
				amax = fmaxf(amax, fabsf(v[j]));
			float d = amax / 127.0f;
			float id = d != 0.0f ? 1.0f / d : 0.0f;
			uint16_t hd = baton_f32_to_f16(d);
			memcpy(o, &hd, 2);
			for (int j = 0; j < 32; j++)
				o[2 + j] = (uint8_t)(int8_t)roundf(v[j] * id);
		}
		return 0;
	case BATON_DT_Q4_K:
	case BATON_DT_Q5_K:
	case BATON_DT_Q6_K:
		return arena_encode_kquant(dtype, x, n, dst);
	default:
		return BATON_EUNSUPPORTED;
	}
}
