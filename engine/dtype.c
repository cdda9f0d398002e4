/*
 * dtype.c: f16/bf16 conversions and the row kernels (decode, dot) of the
 * dtypes the host computes. The accumulation order is the contract written
 * in engine_int.h; the loops are written as blocks of 16 independent lanes
 * so that gcc -O2 turns them into SSE2 without changing that order.
 *
 * f16 is widened with integer bit operations (plus one exact subtraction
 * for subnormals), not a 256 KiB table: it is exact, branch-free, costs no
 * cache, and vectorizes, so the scalar and SIMD paths agree by construction.
 */
#include <stdint.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/engine_int.h"

#define LANES 16u
#define CHUNK 256u  /* elements decoded at a time; a multiple of LANES and 32 */
#define NX_MAX 8u   /* vectors per pass of baton_dot_rows */
#define Q8_0_BLOCK 32u
#define Q8_0_BYTES 34u

static inline uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof u);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

/* Exact f16 -> f32 without branches: normals by rebiasing the exponent,
 * subnormals as (0.5 + m * 2^-24) - 0.5 (both operands normal, the
 * difference exact), infinities and NaNs by setting the f32 exponent to all
 * ones (the payload moves along). */
static inline float f16_widen(uint32_t h)
{
	uint32_t sign = (h & 0x8000u) << 16;
	uint32_t em = h & 0x7fffu;
	uint32_t normal = (em << 13) + 0x38000000u;
	uint32_t sub = f2u(u2f(0x3f000000u | em) - 0.5f);
	uint32_t special = (em << 13) | 0x7f800000u;
	uint32_t r = em < 0x0400u ? sub : normal;
	r = em >= 0x7c00u ? special : r;
	return u2f(r | sign);
}

float baton_f16_to_f32(uint16_t h)
{
	return f16_widen(h);
}

/* Round to nearest even; after F. Giesen's float_to_half_fast3_rtne. */
uint16_t baton_f32_to_f16(float f)
{
	uint32_t x = f2u(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;
	uint32_t o;

	if (ax >= 0x7f800000u) {
		/* Infinity, or NaN keeping its top 10 payload bits. */
		uint32_t m = (ax >> 13) & 0x3ffu;
		if (ax > 0x7f800000u && m == 0)
			m = 0x200u;
		o = 0x7c00u | (ax > 0x7f800000u ? m : 0);
	} else if (ax >= 0x477ff000u) {
		o = 0x7c00u; /* >= 65520 rounds to infinity */
	} else if (ax < 0x38800000u) {
		/* Below 2^-14: a subnormal or zero. Adding 0.5 (whose ulp is
		 * 2^-24) rounds to a multiple of 2^-24 in the FPU, ties to even. */
		o = f2u(u2f(ax) + 0.5f) - 0x3f000000u;
	} else {
		uint32_t odd = (ax >> 13) & 1u;
		ax += 0xc8000fffu + odd; /* rebias 127 -> 15 and round */
		o = ax >> 13;
	}
	return (uint16_t)(o | sign);
}

float baton_bf16_to_f32(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

uint16_t baton_f32_to_bf16(float f)
{
	uint32_t x = f2u(f);

	if ((x & 0x7fffffffu) > 0x7f800000u) {
		uint32_t h = x >> 16;
		if ((h & 0x7fu) == 0)
			h |= 0x40u;
		return (uint16_t)h;
	}
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

int host_can_compute(int dtype)
{
	switch (dtype) {
	case BATON_DT_F32:
	case BATON_DT_F16:
	case BATON_DT_BF16:
	case BATON_DT_Q8_0:
		return 1;
	default:
		return 0;
	}
}

uint64_t baton_compute_row_bytes(int dtype, uint64_t cols)
{
	if (cols == 0 || cols > UINT32_MAX)
		return 0;
	switch (dtype) {
	case BATON_DT_F32:
		return cols * 4;
	case BATON_DT_F16:
	case BATON_DT_BF16:
		return cols * 2;
	case BATON_DT_Q8_0:
		return cols % Q8_0_BLOCK ? 0 : cols / Q8_0_BLOCK * Q8_0_BYTES;
	default:
		return 0;
	}
}

static int check_row(int dtype, const void *row, uint32_t cols)
{
	if (!host_can_compute(dtype))
		return BATON_EUNSUPPORTED;
	if (!row || baton_compute_row_bytes(dtype, cols) == 0)
		return BATON_EINVAL;
	return 0;
}

/* ---- decoding ------------------------------------------------------------
 * Each decoder writes n elements starting at element `start` of the row;
 * start is a multiple of CHUNK (so of 32). The bulk runs in blocks of 16
 * with a fixed inner trip count, which gcc -O2 vectorizes. */

/* f16_widen on four values at once, with masks instead of branches (gcc
 * would otherwise keep the subnormal subtraction behind a branch). Same
 * operations, same bits. */
typedef uint16_t v4h __attribute__((vector_size(8)));
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));

static inline v4f f16_widen4(v4h h16)
{
	v4u h = __builtin_convertvector(h16, v4u);
	v4u sign = (h & 0x8000u) << 16;
	v4u em = h & 0x7fffu;
	v4u normal = (em << 13) + 0x38000000u;
	v4u sub = (v4u)((v4f)(em | 0x3f000000u) - 0.5f);
	v4u special = (em << 13) | 0x7f800000u;
	v4u is_sub = (v4u)((v4i)em < 0x0400);    /* em < 2^15: signed compare is fine */
	v4u is_special = (v4u)((v4i)em > 0x7bff);
	v4u r = (sub & is_sub) | (normal & ~is_sub);
	r = (special & is_special) | (r & ~is_special);
	return (v4f)(r | sign);
}

static void decode_f16(const uint8_t *src, float *restrict dst, uint32_t n)
{
	uint32_t i = 0, n4 = n & ~3u;

	for (; i < n4; i += 4) {
		v4h h;
		v4f f;
		memcpy(&h, src + (size_t)i * 2, sizeof h);
		f = f16_widen4(h);
		memcpy(dst + i, &f, sizeof f);
	}
	for (; i < n; i++) {
		uint16_t h;
		memcpy(&h, src + (size_t)i * 2, sizeof h);
		dst[i] = f16_widen(h);
	}
}

static void decode_bf16(const uint8_t *src, float *restrict dst, uint32_t n)
{
	uint16_t tmp[CHUNK];
	uint32_t i = 0, n16 = n & ~(LANES - 1);

	memcpy(tmp, src, (size_t)n * 2);
	for (; i < n16; i += LANES)
		for (uint32_t l = 0; l < LANES; l++)
			dst[i + l] = u2f((uint32_t)tmp[i + l] << 16);
	for (; i < n; i++)
		dst[i] = u2f((uint32_t)tmp[i] << 16);
}

/* n is a multiple of 32 here (checked at the door). */
static void decode_q8_0(const uint8_t *src, float *restrict dst, uint32_t n)
{
	for (uint32_t b = 0; b < n / Q8_0_BLOCK; b++) {
		const uint8_t *blk = src + (size_t)b * Q8_0_BYTES;
		uint16_t dh;
		int8_t qs[Q8_0_BLOCK];

		memcpy(&dh, blk, 2);
		memcpy(qs, blk + 2, Q8_0_BLOCK);
		float d = f16_widen(dh);
		for (uint32_t l = 0; l < Q8_0_BLOCK; l++)
			dst[b * Q8_0_BLOCK + l] = d * (float)qs[l];
	}
}

/* Elements [start, start+n) of the row as f32: a pointer into the row for
 * aligned f32, else decoded into buf. */
static const float *decode_chunk(int dtype, const uint8_t *row, uint32_t start,
    uint32_t n, float *buf)
{
	switch (dtype) {
	case BATON_DT_F32: {
		const uint8_t *p = row + (size_t)start * 4;
		if (((uintptr_t)p & 3u) == 0)
			return (const float *)(const void *)p;
		memcpy(buf, p, (size_t)n * 4);
		return buf;
	}
	case BATON_DT_F16:
		decode_f16(row + (size_t)start * 2, buf, n);
		return buf;
	case BATON_DT_BF16:
		decode_bf16(row + (size_t)start * 2, buf, n);
		return buf;
	default: /* BATON_DT_Q8_0 */
		decode_q8_0(row + (size_t)start / Q8_0_BLOCK * Q8_0_BYTES, buf, n);
		return buf;
	}
}

int baton_dequant_row(int dtype, const void *row, float *out, uint32_t cols)
{
	int err = check_row(dtype, row, cols);
	if (err)
		return err;
	if (!out)
		return BATON_EINVAL;
	for (uint32_t start = 0; start < cols; start += CHUNK) {
		uint32_t n = cols - start < CHUNK ? cols - start : CHUNK;
		float buf[CHUNK];
		const float *w = decode_chunk(dtype, row, start, n, buf);
		memcpy(out + start, w, (size_t)n * 4);
	}
	return 0;
}

/* ---- dot products --------------------------------------------------------
 * acc[l] += w[i+l] * x[i+l] over n (a multiple of 16) elements. Written
 * with gcc's vector extension (also clang's) so that the 16 lanes surely
 * live in four SSE registers: lane l of a<j> is lane 4j+l of the contract,
 * so this is exactly the scalar definition. */
static inline v4f v4f_load(const float *p)
{
	v4f v;
	memcpy(&v, p, sizeof v);
	return v;
}

static inline void lane_acc(float *restrict acc, const float *restrict w,
    const float *restrict x, uint32_t n)
{
	v4f a0 = v4f_load(acc), a1 = v4f_load(acc + 4);
	v4f a2 = v4f_load(acc + 8), a3 = v4f_load(acc + 12);

	for (uint32_t i = 0; i < n; i += LANES) {
		a0 += v4f_load(w + i) * v4f_load(x + i);
		a1 += v4f_load(w + i + 4) * v4f_load(x + i + 4);
		a2 += v4f_load(w + i + 8) * v4f_load(x + i + 8);
		a3 += v4f_load(w + i + 12) * v4f_load(x + i + 12);
	}
	memcpy(acc, &a0, sizeof a0);
	memcpy(acc + 4, &a1, sizeof a1);
	memcpy(acc + 8, &a2, sizeof a2);
	memcpy(acc + 12, &a3, sizeof a3);
}

static inline float lane_sum(const float *acc)
{
	float b[8], c[4];

	for (uint32_t l = 0; l < 8; l++)
		b[l] = acc[l] + acc[l + 8];
	for (uint32_t l = 0; l < 4; l++)
		c[l] = b[l] + b[l + 4];
	return (c[0] + c[2]) + (c[1] + c[3]);
}

/* nx <= NX_MAX; arguments checked by the caller. */
static void dot_core(int dtype, const uint8_t *row, uint32_t cols,
    const float *const *xs, uint32_t nx, float *out)
{
	float acc[NX_MAX][LANES];
	float buf[CHUNK];
	const float *w = NULL;
	uint32_t start = 0, n = 0;

	memset(acc, 0, sizeof acc);
	for (uint32_t s = 0; s < cols; s += CHUNK) {
		start = s;
		n = cols - s < CHUNK ? cols - s : CHUNK;
		w = decode_chunk(dtype, row, start, n, buf);
		for (uint32_t v = 0; v < nx; v++)
			lane_acc(acc[v], w, xs[v] + start, n & ~(LANES - 1));
	}
	/* The last chunk (still in w) holds the cols % 16 tail. */
	for (uint32_t v = 0; v < nx; v++) {
		float sum = lane_sum(acc[v]);
		for (uint32_t i = n & ~(LANES - 1); i < n; i++)
			sum += w[i] * xs[v][start + i];
		out[v] = sum;
	}
}

int baton_dot_row(int dtype, const void *row, const float *x, uint32_t cols, float *out)
{
	int err = check_row(dtype, row, cols);
	if (err)
		return err;
	if (!x || !out)
		return BATON_EINVAL;
	dot_core(dtype, row, cols, &x, 1, out);
	return 0;
}

int baton_dot_rows(int dtype, const void *row, uint32_t cols,
    const float *const *xs, uint32_t nx, float *out)
{
	int err = check_row(dtype, row, cols);
	if (err)
		return err;
	if (!xs || !out)
		return BATON_EINVAL;
	for (uint32_t v = 0; v < nx; v++)
		if (!xs[v])
			return BATON_EINVAL;
	for (uint32_t v = 0; v < nx; v += NX_MAX) {
		uint32_t m = nx - v < NX_MAX ? nx - v : NX_MAX;
		dot_core(dtype, row, cols, xs + v, m, out + v);
	}
	return 0;
}
