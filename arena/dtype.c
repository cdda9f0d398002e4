/*
 * dtype.c: ggml's tensor types (block size, bytes per block, name) and the
 * row encoders (f16, bf16, q8_0 here, the K-quants in kquant.c), which use
 * the tree's one f16/bf16 codec (arena.h).
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

/* The f16 / bf16 codec is in arena.h (static inline: the engine's kernels
 * call it per block inside vectorized loops). */

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
