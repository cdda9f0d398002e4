/*
 * dtype.c: the row kernels (decode, dot) of the dtypes the host computes
 * (the f16/bf16 codec itself is the arena's, in arena.h). The accumulation
 * order is the contract written in host.h (32 independent f32
 * lanes, a fixed tree, the tail); the baseline kernels are SSE2 (the
 * x86-64 baseline) through gcc's vector extension and intrinsics, with
 * AVX2 + F16C chosen at run time; every kernel keeps that order, so all
 * give the same bits.
 *
 * f16 is widened exactly with integer bit operations, not a 256 KiB table,
 * which would cost cache and could not be vectorized. SSE2 widens eight at
 * a time with a shift-mask-add, and falls back to the full formula for a
 * block holding a zero, subnormal, infinity or NaN; F16C's instruction is
 * exact too. All give the bits of baton_f16_to_f32 (checked on all 65536
 * values).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "arena/arena.h"
#include "engine/backend/host/host.h"

#define LANES 32u  /* accumulation lanes: the contract of host.h */
#define CHUNK 256u  /* elements decoded at a time; a multiple of LANES and 32,
		     * and one K-quant super-block */
#define NX_MAX 8u   /* vectors per pass of baton_dot_rows */
#define Q8_0_BLOCK 32u
#define Q8_0_BYTES 34u

static inline float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}

int host_can_compute(int dtype)
{
	switch (dtype) {
	case BATON_DT_F32:
	case BATON_DT_F16:
	case BATON_DT_BF16:
	case BATON_DT_Q8_0:
		return 1;
	default: /* the K-quants and the other block types of arena/quant.c */
		return baton_quant_decodes(dtype);
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
	default: /* 0 unless cols is a multiple of the block (32 or 256) */
		return baton_quant_decodes(dtype) ? baton_dtype_row_bytes(dtype, cols) : 0;
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
 * start is a multiple of CHUNK (so of 32). Loops with a fixed inner trip
 * count, which gcc -O2 vectorizes, or SSE2 where gcc would not. */

#if defined(__SSE2__)
/* Eight f16 (h) to two vectors of four f32, exactly as baton_f16_to_f32.
 * With w = h << 16 (an unpack with zero), a normal number is
 * ((w >>arith 3) & 0x8fffffff) + (112 << 23): the shift puts sign, exponent
 * and mantissa in place, the mask clears the copies of the sign, the add
 * rebiases. A block with a zero, subnormal, infinity or NaN (exponent 0 or
 * 31, rare in weights) takes the full path of baton_f16_to_f32, lane by
 * lane. */
static inline __m128 f16x4_normal(__m128i w)
{
	__m128i r = _mm_and_si128(_mm_srai_epi32(w, 3), _mm_set1_epi32((int)0x8fffffff));
	return _mm_castsi128_ps(_mm_add_epi32(r, _mm_set1_epi32(0x38000000)));
}

static inline __m128 f16x4_any(__m128i w)
{
	__m128i sign = _mm_and_si128(w, _mm_set1_epi32((int)0x80000000));
	__m128i em13 = _mm_srli_epi32(_mm_slli_epi32(w, 1), 4); /* em << 13 */
	__m128i normal = _mm_castps_si128(f16x4_normal(w));
	__m128i sub = _mm_castps_si128(_mm_sub_ps(
	    _mm_castsi128_ps(_mm_or_si128(_mm_srli_epi32(em13, 13), _mm_set1_epi32(0x3f000000))),
	    _mm_set1_ps(0.5f)));
	__m128i is_sub = _mm_cmplt_epi32(em13, _mm_set1_epi32(0x00800000));
	__m128i is_special = _mm_cmpgt_epi32(em13, _mm_set1_epi32(0x0f7fffff));
	__m128i r = _mm_or_si128(_mm_and_si128(is_sub, _mm_or_si128(sub, sign)),
	    _mm_andnot_si128(is_sub, normal));
	__m128i is_nan = _mm_cmpgt_epi32(em13, _mm_set1_epi32(0x0f800000));
	r = _mm_or_si128(r, _mm_and_si128(is_special, _mm_set1_epi32(0x7f800000)));
	r = _mm_or_si128(r, _mm_and_si128(is_nan, _mm_set1_epi32(0x00400000))); /* quiet */
	return _mm_castsi128_ps(r);
}

static inline void f16x8_widen(__m128i h, __m128 *lo, __m128 *hi)
{
	const __m128i zero = _mm_setzero_si128();
	const __m128i expo = _mm_set1_epi16(0x7c00);
	__m128i e = _mm_and_si128(h, expo);
	__m128i odd = _mm_or_si128(_mm_cmpeq_epi16(e, zero), _mm_cmpeq_epi16(e, expo));
	__m128i wl = _mm_unpacklo_epi16(zero, h), wh = _mm_unpackhi_epi16(zero, h);

	if (_mm_movemask_epi8(odd) == 0) {
		*lo = f16x4_normal(wl);
		*hi = f16x4_normal(wh);
	} else {
		*lo = f16x4_any(wl);
		*hi = f16x4_any(wh);
	}
}
#endif

static void decode_f16(const uint8_t *src, float *restrict dst, uint32_t n)
{
	uint32_t i = 0;

#if defined(__SSE2__)
	for (; i + 8 <= n; i += 8) {
		__m128 lo, hi;
		f16x8_widen(_mm_loadu_si128((const __m128i *)(const void *)(src + (size_t)i * 2)), &lo, &hi);
		_mm_storeu_ps(dst + i, lo);
		_mm_storeu_ps(dst + i + 4, hi);
	}
#endif
	for (; i < n; i++) {
		uint16_t h;
		memcpy(&h, src + (size_t)i * 2, sizeof h);
		dst[i] = baton_f16_to_f32(h);
	}
}

static void decode_bf16(const uint8_t *src, float *restrict dst, uint32_t n)
{
	uint16_t tmp[CHUNK];
	uint32_t i = 0, n16 = n & ~15u;

	memcpy(tmp, src, (size_t)n * 2);
	for (; i < n16; i += 16)
		for (uint32_t l = 0; l < 16; l++)
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
		float d = baton_f16_to_f32(dh);
		for (uint32_t l = 0; l < Q8_0_BLOCK; l++)
			dst[b * Q8_0_BLOCK + l] = d * (float)qs[l];
	}
}

/* n elements (whole blocks) of a block type from blk, which starts at a
 * block, into out (arena/quant.c's decoders): their AVX2 build while the
 * AVX2 kernels are in use, else the baseline; the same bits either way. */
static void quant_decode(int dtype, const uint8_t *blk, float *out, uint32_t n)
{
#if BATON_KQUANT_AVX2
	if (baton_kernels_avx2(-1)) {
		baton_quant_decode_avx2(dtype, blk, out, n);
		return;
	}
#endif
	baton_quant_decode(dtype, blk, out, n);
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
	case BATON_DT_Q8_0:
		decode_q8_0(row + (size_t)start / Q8_0_BLOCK * Q8_0_BYTES, buf, n);
		return buf;
	default: /* a block type: whole blocks (start and n multiples of the block) */
		quant_decode(dtype, row + baton_dtype_row_bytes(dtype, start), buf, n);
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
 * The contract (host.h): 32 f32 lanes, element i to lane i % 32 for
 * the first cols & ~31 elements, the lanes summed as a fixed tree, then
 * the tail in order. 32 lanes are eight SSE or four AVX registers: enough
 * independent additions in flight that the adds' latency does not limit a
 * one-vector dot. */

/* acc[l] += w[i+l] * x[i+l] over n (a multiple of 32) elements, with
 * gcc's (and clang's) vector extension so that the lanes surely stay in
 * registers: lane l of a<j> is lane 4j+l of the contract. */
typedef float v4f __attribute__((vector_size(16)));

static inline v4f v4f_load(const float *p)
{
	v4f v;
	memcpy(&v, p, sizeof v);
	return v;
}

#define REP4(X) X(0) X(1) X(2) X(3)
#define REP8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

static inline void lane_acc(float *restrict acc, const float *restrict w,
    const float *restrict x, uint32_t n)
{
#define LOAD(j) v4f a##j = v4f_load(acc + 4 * j);
#define STEP(j) a##j += v4f_load(w + i + 4 * j) * v4f_load(x + i + 4 * j);
#define STORE(j) memcpy(acc + 4 * j, &a##j, sizeof a##j);
	REP8(LOAD)
	for (uint32_t i = 0; i < n; i += LANES) {
		REP8(STEP)
	}
	REP8(STORE)
#undef LOAD
#undef STEP
#undef STORE
}

/* The lanes' fixed tree: halves added pairwise down to four, then
 * (0 + 2) + (1 + 3). */
static inline float lane_sum(const float *acc)
{
	float b[16], c[8], d[4];

	for (uint32_t l = 0; l < 16; l++)
		b[l] = acc[l] + acc[l + 16];
	for (uint32_t l = 0; l < 8; l++)
		c[l] = b[l] + b[l + 8];
	for (uint32_t l = 0; l < 4; l++)
		d[l] = c[l] + c[l + 4];
	return (d[0] + d[2]) + (d[1] + d[3]);
}

/* Element i of a row, decoded alone (the tails). */
static inline float w_at(int dtype, const uint8_t *row, uint32_t i)
{
	uint16_t h;

	switch (dtype) {
	case BATON_DT_F32: {
		float f;
		memcpy(&f, row + (size_t)i * 4, sizeof f);
		return f;
	}
	case BATON_DT_F16:
		memcpy(&h, row + (size_t)i * 2, sizeof h);
		return baton_f16_to_f32(h);
	case BATON_DT_BF16:
		memcpy(&h, row + (size_t)i * 2, sizeof h);
		return u2f((uint32_t)h << 16);
	default: { /* q8_0 (the block types have no tail: cols % 32 == 0) */
		const uint8_t *blk = row + (size_t)(i / Q8_0_BLOCK) * Q8_0_BYTES;
		memcpy(&h, blk, sizeof h);
		return baton_f16_to_f32(h) * (float)(int8_t)blk[2 + i % Q8_0_BLOCK];
	}
	}
}

static inline float finish(const float *acc, int dtype, const uint8_t *row,
    const float *x, uint32_t from, uint32_t n)
{
	float sum = lane_sum(acc);
	for (uint32_t i = from; i < n; i++)
		sum += w_at(dtype, row, i) * x[i];
	return sum;
}

#if defined(__SSE2__)
/* One vector, 16-bit weights, baseline: decode and multiply in registers. */
static float dot1_16bit(int dtype, const uint8_t *row, const float *x, uint32_t n)
{
	const __m128i zero = _mm_setzero_si128();
	uint32_t n32 = n & ~(LANES - 1);
	float acc[LANES];

#define ZERO(j) __m128 a##j = _mm_setzero_ps(), w##j;
	REP8(ZERO)
#undef ZERO
	for (uint32_t i = 0; i < n32; i += LANES) {
		const __m128i *p = (const __m128i *)(const void *)(row + (size_t)i * 2);
		__m128i h0 = _mm_loadu_si128(p), h1 = _mm_loadu_si128(p + 1);
		__m128i h2 = _mm_loadu_si128(p + 2), h3 = _mm_loadu_si128(p + 3);
		if (dtype == BATON_DT_F16) {
			f16x8_widen(h0, &w0, &w1);
			f16x8_widen(h1, &w2, &w3);
			f16x8_widen(h2, &w4, &w5);
			f16x8_widen(h3, &w6, &w7);
		} else {
#define BF(k, lo, hi)                                                          \
	lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, h##k));                 \
	hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, h##k));
			BF(0, w0, w1) BF(1, w2, w3) BF(2, w4, w5) BF(3, w6, w7)
#undef BF
		}
#define STEP(j) a##j = _mm_add_ps(a##j, _mm_mul_ps(w##j, _mm_loadu_ps(x + i + 4 * j)));
		REP8(STEP)
#undef STEP
	}
#define STORE(j) _mm_storeu_ps(acc + 4 * j, a##j);
	REP8(STORE)
#undef STORE
	return finish(acc, dtype, row, x, n32, n);
}
#endif

/* ---- AVX2 + F16C, chosen at run time --------------------------------------
 * The same 32 lanes as four 8-wide registers, the same multiplies and adds
 * in the same order, no FMA (the target does not include it), and F16C's
 * conversion is exact: the results are bitwise those of the baseline. The
 * row is decoded in registers and applied to one or two vectors at a time. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_KERNELS 1
#define TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define ALWAYS_INLINE __attribute__((always_inline)) inline

/* 32 weights from element i (a multiple of 32) into w0..w3. */
TARGET_AVX2 static ALWAYS_INLINE void avx2_w32(int dtype, const uint8_t *row, uint32_t i,
    __m256 *w0, __m256 *w1, __m256 *w2, __m256 *w3)
{
	switch (dtype) {
	case BATON_DT_F16: {
		const __m128i *p = (const __m128i *)(const void *)(row + (size_t)i * 2);
		*w0 = _mm256_cvtph_ps(_mm_loadu_si128(p));
		*w1 = _mm256_cvtph_ps(_mm_loadu_si128(p + 1));
		*w2 = _mm256_cvtph_ps(_mm_loadu_si128(p + 2));
		*w3 = _mm256_cvtph_ps(_mm_loadu_si128(p + 3));
		break;
	}
	case BATON_DT_BF16: {
		const __m128i *p = (const __m128i *)(const void *)(row + (size_t)i * 2);
#define BF(k) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p + k)), 16))
		*w0 = BF(0);
		*w1 = BF(1);
		*w2 = BF(2);
		*w3 = BF(3);
#undef BF
		break;
	}
	case BATON_DT_Q8_0: { /* one block: the scale, then 32 int8 */
		const uint8_t *blk = row + (size_t)(i / Q8_0_BLOCK) * Q8_0_BYTES;
		uint16_t h;
		memcpy(&h, blk, sizeof h);
		__m256 d = _mm256_set1_ps(baton_f16_to_f32(h));
#define Q8(k) _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32( \
	    _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + 8 * k)))))
		*w0 = Q8(0);
		*w1 = Q8(1);
		*w2 = Q8(2);
		*w3 = Q8(3);
#undef Q8
		break;
	}
	default: { /* f32 */
		const __m256i *p = (const __m256i *)(const void *)(row + (size_t)i * 4);
		*w0 = _mm256_castsi256_ps(_mm256_loadu_si256(p));
		*w1 = _mm256_castsi256_ps(_mm256_loadu_si256(p + 1));
		*w2 = _mm256_castsi256_ps(_mm256_loadu_si256(p + 2));
		*w3 = _mm256_castsi256_ps(_mm256_loadu_si256(p + 3));
		break;
	}
	}
}

/* out[v] = dot(row, xs[v]) for nv = 1 or 2 (a constant after inlining). */
TARGET_AVX2 static ALWAYS_INLINE void avx2_dot(int dtype, const uint8_t *row, uint32_t n,
    const float *const *xs, uint32_t nv, float *out)
{
	const float *x0 = xs[0], *x1 = xs[nv - 1];
	uint32_t n32 = n & ~(LANES - 1);
	float acc[LANES];
	/* Block types: 256 elements (or the rest of the row, whole blocks)
	 * decoded at a time, then read as f32. */
	const int kq = baton_quant_decodes(dtype);
	float kb[256];

#define ZERO(k) __m256 a##k = _mm256_setzero_ps(), b##k = a##k, w##k;
	REP4(ZERO)
#undef ZERO
	for (uint32_t i = 0; i < n32; i += LANES) {
		if (kq) {
			if (i % 256 == 0)
				quant_decode(dtype, row + baton_dtype_row_bytes(dtype, i), kb,
				    n - i < 256 ? n - i : 256);
			avx2_w32(BATON_DT_F32, (const uint8_t *)kb, i % 256,
			    &w0, &w1, &w2, &w3);
		} else {
			avx2_w32(dtype, row, i, &w0, &w1, &w2, &w3);
		}
#define STEP(k) a##k = _mm256_add_ps(a##k, _mm256_mul_ps(w##k, _mm256_loadu_ps(x0 + i + 8 * k)));
#define STEP2(k) b##k = _mm256_add_ps(b##k, _mm256_mul_ps(w##k, _mm256_loadu_ps(x1 + i + 8 * k)));
		REP4(STEP)
		if (nv == 2) {
			REP4(STEP2)
		}
#undef STEP
#undef STEP2
	}
#define STORE(k) _mm256_storeu_ps(acc + 8 * k, a##k);
	REP4(STORE)
#undef STORE
	out[0] = finish(acc, dtype, row, x0, n32, n);
	if (nv == 2) {
#define STORE(k) _mm256_storeu_ps(acc + 8 * k, b##k);
		REP4(STORE)
#undef STORE
		out[1] = finish(acc, dtype, row, x1, n32, n);
	}
}

#define AVX2_DOT_FOR(dt, name)                                                 \
	TARGET_AVX2 static void name(const uint8_t *row, uint32_t n,           \
	    const float *const *xs, uint32_t nx, float *out)                   \
	{                                                                      \
		uint32_t v = 0;                                                \
		for (; v + 2 <= nx; v += 2)                                    \
			avx2_dot(dt, row, n, xs + v, 2, out + v);              \
		if (v < nx)                                                    \
			avx2_dot(dt, row, n, xs + v, 1, out + v);              \
	}
AVX2_DOT_FOR(BATON_DT_F32, avx2_dot_f32)
AVX2_DOT_FOR(BATON_DT_F16, avx2_dot_f16)
AVX2_DOT_FOR(BATON_DT_BF16, avx2_dot_bf16)
AVX2_DOT_FOR(BATON_DT_Q8_0, avx2_dot_q8_0)
AVX2_DOT_FOR(BATON_DT_Q4_K, avx2_dot_q4_k)
AVX2_DOT_FOR(BATON_DT_Q5_K, avx2_dot_q5_k)
AVX2_DOT_FOR(BATON_DT_Q6_K, avx2_dot_q6_k)
#undef AVX2_DOT_FOR

/* The other block types (arena/quant.c), decoded into f32 first like the
 * K-quants: one function, the type a run-time value. */
TARGET_AVX2 static void avx2_dot_quant(int dtype, const uint8_t *row, uint32_t n,
    const float *const *xs, uint32_t nx, float *out)
{
	uint32_t v = 0;
	for (; v + 2 <= nx; v += 2)
		avx2_dot(dtype, row, n, xs + v, 2, out + v);
	if (v < nx)
		avx2_dot(dtype, row, n, xs + v, 1, out + v);
}

/* -1: not decided yet; then 0 or 1. */
static atomic_int g_avx2 = -1;

/* AVX2 (the builtin also checks that the OS saves ymm registers) and F16C
 * (from cpuid: clang's builtin does not know "f16c"). */
static int cpu_has_avx2(void)
{
	unsigned a, b, c, d;

	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2"))
		return 0;
	return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

static int use_avx2(void)
{
	int on = atomic_load_explicit(&g_avx2, memory_order_relaxed);
	if (on < 0) {
		const char *env = getenv("BATON_HOST_AVX2");
		on = cpu_has_avx2() && !(env && strcmp(env, "0") == 0);
		atomic_store_explicit(&g_avx2, on, memory_order_relaxed);
	}
	return on;
}
#endif

int baton_kernels_avx2(int on)
{
#if defined(HAVE_AVX2_KERNELS)
	if (on >= 0)
		atomic_store_explicit(&g_avx2, on && cpu_has_avx2(), memory_order_relaxed);
	return use_avx2();
#else
	(void)on;
	return 0;
#endif
}

/* nx <= NX_MAX; arguments checked by the caller. */
static void dot_core(int dtype, const uint8_t *row, uint32_t cols,
    const float *const *xs, uint32_t nx, float *out)
{
	float acc[NX_MAX][LANES];
	float buf[CHUNK];
	const float *w = NULL;
	uint32_t start = 0, n = 0;

#if defined(HAVE_AVX2_KERNELS)
	if (use_avx2()) {
		switch (dtype) {
		case BATON_DT_F32: avx2_dot_f32(row, cols, xs, nx, out); return;
		case BATON_DT_F16: avx2_dot_f16(row, cols, xs, nx, out); return;
		case BATON_DT_BF16: avx2_dot_bf16(row, cols, xs, nx, out); return;
		case BATON_DT_Q4_K: avx2_dot_q4_k(row, cols, xs, nx, out); return;
		case BATON_DT_Q5_K: avx2_dot_q5_k(row, cols, xs, nx, out); return;
		case BATON_DT_Q6_K: avx2_dot_q6_k(row, cols, xs, nx, out); return;
		case BATON_DT_Q8_0: avx2_dot_q8_0(row, cols, xs, nx, out); return;
		default: avx2_dot_quant(dtype, row, cols, xs, nx, out); return;
		}
	}
#endif
#if defined(__SSE2__)
	if (nx == 1 && (dtype == BATON_DT_F16 || dtype == BATON_DT_BF16)) {
		out[0] = dot1_16bit(dtype, row, xs[0], cols);
		return;
	}
#endif
	/* Decode a chunk at a time, apply it to every vector. */
	memset(acc, 0, sizeof acc);
	for (uint32_t s = 0; s < cols; s += CHUNK) {
		start = s;
		n = cols - s < CHUNK ? cols - s : CHUNK;
		w = decode_chunk(dtype, row, start, n, buf);
		for (uint32_t v = 0; v < nx; v++)
			lane_acc(acc[v], w, xs[v] + start, n & ~(LANES - 1));
	}
	/* The last chunk (still in w) holds the tail. */
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
