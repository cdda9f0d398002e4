/*
 * kquant.c: ggml's K-quants Q4_K, Q5_K and Q6_K (super-blocks of 256
 * elements) both ways, as ggml keeps them in one file: the encoders, so
 * that synthetic arenas can hold the types llama.cpp's Q4_K_M and Q5_K_M
 * files use, and the decoder the host backend's row kernels call per
 * block (arena.h: baton_kquant_decode_block).
 *
 * These are ggml's reference quantizers (quantize_row_q{4,5,6}_K_ref of
 * ggml-quants.c, no importance matrix), written again here operation for
 * operation: the same float expressions in the same order, so that the
 * bytes are ggml's (arena/kquant_test.c checks them against blocks made by
 * ggml's own code). The tree is built with -std=c11, which does not contract
 * a*b+c into a fused multiply-add, as ggml's reference build does not.
 *
 * Decoding is ggml's dequantize_row_q{4,5,6}_K, bit for bit
 * (engine/backend/host/kquant_test.c checks it against values made by
 * ggml's own code):
 *   q4_K: x = (d * sc_j) * q - dmin * m_j, q in 0..15, 8 sub-blocks of 32
 *   q5_K: the same with q in 0..31 (fifth bit from qh)
 *   q6_K: x = (d * sc_j) * q, q in -32..31, 16 sub-blocks of 16
 * Every product is exact in f32 (at most 11 + 8 + 6 bits), so q6_K values
 * are exact and q4_K / q5_K round once, in the subtraction: a fused
 * multiply-add of (d * sc_j, q, -dmin * m_j) gives the same bits, which is
 * why the CUDA kernels may contract it.
 *
 * Layouts (ggml-common.h), little-endian:
 *   q4_K (144 bytes): f16 d, f16 dmin, scales[12] (eight 6-bit scales and
 *        eight 6-bit mins), qs[128] (4-bit quants, two per byte)
 *   q5_K (176 bytes): as q4_K, then qh[32] (the fifth bit), then qs[128]
 *   q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits),
 *        int8 scales[16], f16 d
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "arena/arena_int.h"

#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Round to nearest, ties to even, for |f| <= 4194303 (ggml's nearest_int:
 * adding 1.5 * 2^23 leaves the integer in the mantissa). */
static inline int nearest_int(float fval)
{
	float val = fval + 12582912.f;
	int i;
	memcpy(&i, &val, sizeof i);
	return (i & 0x007fffff) - 0x00400000;
}

static inline float f16_at(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return baton_f16_to_f32(h);
}

static inline void f16_put(uint8_t *p, float f)
{
	uint16_t h = baton_f32_to_f16(f);
	memcpy(p, &h, 2);
}

/* ggml's make_qx_quants with qw == NULL. */
static float make_qx_quants(int n, int nmax, const float *restrict x, int8_t *restrict L,
    int rmse_type)
{
	float max = 0;
	float amax = 0;
	for (int i = 0; i < n; ++i) {
		float ax = fabsf(x[i]);
		if (ax > amax) {
			amax = ax;
			max = x[i];
		}
	}
	if (amax < GROUP_MAX_EPS) {
		for (int i = 0; i < n; ++i)
			L[i] = 0;
		return 0.f;
	}
	float iscale = -nmax / max;
	if (rmse_type == 0) {
		for (int i = 0; i < n; ++i) {
			int l = nearest_int(iscale * x[i]);
			L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
		}
		return 1 / iscale;
	}
	bool return_early = false;
	if (rmse_type < 0) {
		rmse_type = -rmse_type;
		return_early = true;
	}
	float sumlx = 0;
	float suml2 = 0;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * x[i]);
		l = imax(-nmax, imin(nmax - 1, l));
		L[i] = (int8_t)(l + nmax);
		float w = rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) : sqrtf(fabsf(x[i]));
		sumlx += w * x[i] * l;
		suml2 += w * l * l;
	}
	float scale = suml2 ? sumlx / suml2 : 0.0f;
	if (return_early)
		return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
	float best = scale * sumlx;
	for (int is = -9; is <= 9; ++is) {
		if (is == 0)
			continue;
		iscale = -(nmax + 0.1f * is) / max;
		sumlx = suml2 = 0;
		for (int i = 0; i < n; ++i) {
			int l = nearest_int(iscale * x[i]);
			l = imax(-nmax, imin(nmax - 1, l));
			float w = rmse_type == 1 ? x[i] * x[i] : rmse_type == 2 ? 1 : rmse_type == 3 ? fabsf(x[i]) : sqrtf(fabsf(x[i]));
			sumlx += w * x[i] * l;
			suml2 += w * l * l;
		}
		if (suml2 > 0 && sumlx * sumlx > best * suml2) {
			for (int i = 0; i < n; ++i) {
				int l = nearest_int(iscale * x[i]);
				L[i] = (int8_t)(nmax + imax(-nmax, imin(nmax - 1, l)));
			}
			scale = sumlx / suml2;
			best = scale * sumlx;
		}
	}
	return scale;
}

/* ggml's make_qkx2_quants: scale and min of a sub-block by a weighted
 * least-squares search over nstep candidate scales. */
static float make_qkx2_quants(int n, int nmax, const float *restrict x,
    const float *restrict weights, uint8_t *restrict L, float *restrict the_min,
    uint8_t *restrict Laux, float rmin, float rdelta, int nstep, bool use_mad)
{
	float min = x[0];
	float max = x[0];
	float sum_w = weights[0];
	float sum_x = sum_w * x[0];
	for (int i = 1; i < n; ++i) {
		if (x[i] < min)
			min = x[i];
		if (x[i] > max)
			max = x[i];
		float w = weights[i];
		sum_w += w;
		sum_x += w * x[i];
	}
	if (min > 0)
		min = 0;
	if (max == min) {
		for (int i = 0; i < n; ++i)
			L[i] = 0;
		*the_min = -min;
		return 0.f;
	}
	float iscale = nmax / (max - min);
	float scale = 1 / iscale;
	float best_error = 0;
	for (int i = 0; i < n; ++i) {
		int l = nearest_int(iscale * (x[i] - min));
		L[i] = (uint8_t)imax(0, imin(nmax, l));
		float diff = scale * L[i] + min - x[i];
		diff = use_mad ? fabsf(diff) : diff * diff;
		float w = weights[i];
		best_error += w * diff;
	}
	if (nstep < 1) {
		*the_min = -min;
		return scale;
	}
	for (int is = 0; is <= nstep; ++is) {
		iscale = (rmin + rdelta * is + nmax) / (max - min);
		float sum_l = 0, sum_l2 = 0, sum_xl = 0;
		for (int i = 0; i < n; ++i) {
			int l = nearest_int(iscale * (x[i] - min));
			l = imax(0, imin(nmax, l));
			Laux[i] = (uint8_t)l;
			float w = weights[i];
			sum_l += w * l;
			sum_l2 += w * l * l;
			sum_xl += w * l * x[i];
		}
		float D = sum_w * sum_l2 - sum_l * sum_l;
		if (D > 0) {
			float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
			float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
			if (this_min > 0) {
				this_min = 0;
				this_scale = sum_xl / sum_l2;
			}
			float cur_error = 0;
			for (int i = 0; i < n; ++i) {
				float diff = this_scale * Laux[i] + this_min - x[i];
				diff = use_mad ? fabsf(diff) : diff * diff;
				float w = weights[i];
				cur_error += w * diff;
			}
			if (cur_error < best_error) {
				for (int i = 0; i < n; ++i)
					L[i] = Laux[i];
				best_error = cur_error;
				scale = this_scale;
				min = this_min;
			}
		}
	}
	*the_min = -min;
	return scale;
}

/* Scale and min j (0..7) of a q4_K / q5_K block's 12 packed bytes. */
static inline void get_scale_min_k4(int j, const uint8_t *restrict q, uint8_t *restrict d,
    uint8_t *restrict m)
{
	if (j < 4) {
		*d = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
		*m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
	}
}

/* The part q4_K and q5_K share: per 32-element sub-block a scale and a
 * min (nmax 15 or 31), packed to 6 bits against the block's d and dmin
 * (written at blk[0..3], scales at blk[4..15]); L gets the quants. */
static void kx_scales_and_quants(const float *x, int nmax, float rmin, int nstep,
    uint8_t *blk, uint8_t L[QK_K])
{
	uint8_t Laux[32];
	float weights[32];
	float mins[QK_K / 32];
	float scales[QK_K / 32];
	uint8_t *sc = blk + 4;
	float max_scale = 0; /* as the min is taken off, scales are never negative */
	float max_min = 0;

	for (int j = 0; j < QK_K / 32; ++j) {
		float sum_x2 = 0;
		for (int l = 0; l < 32; ++l)
			sum_x2 += x[32 * j + l] * x[32 * j + l];
		float av_x = sqrtf(sum_x2 / 32);
		for (int l = 0; l < 32; ++l)
			weights[l] = av_x + fabsf(x[32 * j + l]);
		scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
		    rmin, 0.1f, nstep, false);
		if (scales[j] > max_scale)
			max_scale = scales[j];
		if (mins[j] > max_min)
			max_min = mins[j];
	}

	float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
	float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
	memset(sc, 0, 12);
	for (int j = 0; j < QK_K / 32; ++j) {
		uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
		uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
		ls = (uint8_t)imin(63, ls);
		lm = (uint8_t)imin(63, lm);
		if (j < 4) {
			sc[j] = ls;
			sc[j + 4] = lm;
		} else {
			sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
			sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
			sc[j - 0] |= (uint8_t)((lm >> 4) << 6);
		}
	}
	f16_put(blk, max_scale / 63.f);
	f16_put(blk + 2, max_min / 63.f);

	for (int j = 0; j < QK_K / 32; ++j) {
		uint8_t s, m;
		get_scale_min_k4(j, sc, &s, &m);
		const float d = f16_at(blk) * s;
		if (!d)
			continue;
		const float dm = f16_at(blk + 2) * m;
		for (int ii = 0; ii < 32; ++ii) {
			int l = nearest_int((x[32 * j + ii] + dm) / d);
			L[32 * j + ii] = (uint8_t)imax(0, imin(nmax, l));
		}
	}
}

static void quantize_q4_K(const float *x, uint8_t *blk)
{
	uint8_t L[QK_K];

	kx_scales_and_quants(x, 15, -1.f, 20, blk, L);
	uint8_t *q = blk + 16;
	for (int j = 0; j < QK_K; j += 64) {
		for (int l = 0; l < 32; ++l)
			q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
		q += 32;
	}
}

static void quantize_q5_K(const float *x, uint8_t *blk)
{
	uint8_t L[QK_K];

	kx_scales_and_quants(x, 31, -0.5f, 15, blk, L);
	uint8_t *qh = blk + 16, *ql = blk + 48;
	memset(qh, 0, QK_K / 8);
	uint8_t m1 = 1, m2 = 2;
	for (int n = 0; n < QK_K; n += 64) {
		for (int j = 0; j < 32; ++j) {
			int l1 = L[n + j];
			if (l1 > 15) {
				l1 -= 16;
				qh[j] |= m1;
			}
			int l2 = L[n + j + 32];
			if (l2 > 15) {
				l2 -= 16;
				qh[j] |= m2;
			}
			ql[j] = (uint8_t)(l1 | (l2 << 4));
		}
		m1 = (uint8_t)(m1 << 2);
		m2 = (uint8_t)(m2 << 2);
		ql += 32;
	}
}

static void quantize_q6_K(const float *x, uint8_t *blk)
{
	int8_t L[QK_K];
	float scales[QK_K / 16];
	uint8_t *ql = blk, *qh = blk + 128;
	int8_t *sc = (int8_t *)(blk + 192);
	float max_scale = 0;
	float max_abs_scale = 0;

	for (int ib = 0; ib < QK_K / 16; ++ib) {
		const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
		scales[ib] = scale;
		const float abs_scale = fabsf(scale);
		if (abs_scale > max_abs_scale) {
			max_abs_scale = abs_scale;
			max_scale = scale;
		}
	}
	if (max_abs_scale < GROUP_MAX_EPS) {
		memset(blk, 0, 210);
		return;
	}

	float iscale = -128.f / max_scale;
	f16_put(blk + 208, 1 / iscale);
	for (int ib = 0; ib < QK_K / 16; ++ib)
		sc[ib] = (int8_t)imin(127, nearest_int(iscale * scales[ib]));

	for (int j = 0; j < QK_K / 16; ++j) {
		float d = f16_at(blk + 208) * sc[j];
		if (!d)
			continue;
		for (int ii = 0; ii < 16; ++ii) {
			int l = nearest_int(x[16 * j + ii] / d);
			l = imax(-32, imin(31, l));
			L[16 * j + ii] = (int8_t)(l + 32);
		}
	}

	for (int j = 0; j < QK_K; j += 128) {
		for (int l = 0; l < 32; ++l) {
			const uint8_t q1 = L[j + l + 0] & 0xF;
			const uint8_t q2 = L[j + l + 32] & 0xF;
			const uint8_t q3 = L[j + l + 64] & 0xF;
			const uint8_t q4 = L[j + l + 96] & 0xF;
			ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
			ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
			qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
			    ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
		}
		ql += 64;
		qh += 32;
	}
}

int arena_encode_kquant(int dtype, const float *x, uint64_t n, uint8_t *dst)
{
	void (*fn)(const float *, uint8_t *);
	uint32_t bytes;

	switch (dtype) {
	case BATON_DT_Q4_K: fn = quantize_q4_K, bytes = 144; break;
	case BATON_DT_Q5_K: fn = quantize_q5_K, bytes = 176; break;
	case BATON_DT_Q6_K: fn = quantize_q6_K, bytes = 210; break;
	default: return BATON_EUNSUPPORTED;
	}
	if (n % QK_K)
		return BATON_EINVAL;
	/* A NaN or infinity would make garbage quants (nearest_int's trick
	 * needs a finite value): refused, nothing written. */
	for (uint64_t i = 0; i < n; i++)
		if (!isfinite(x[i]))
			return BATON_EINVAL;
	for (uint64_t b = 0; b < n / QK_K; b++)
		fn(x + b * QK_K, dst + b * bytes);
	return 0;
}

/* ---- decoding ------------------------------------------------------------ */

int baton_kquant_is(int dtype)
{
	return dtype == BATON_DT_Q4_K || dtype == BATON_DT_Q5_K || dtype == BATON_DT_Q6_K;
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
		get_scale_min_k4(2 * j, sc, &s, &m);
		const float d1 = d * s, m1 = min * m;
		get_scale_min_k4(2 * j + 1, sc, &s, &m);
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

/* The same code compiled twice: for the baseline (SSE2 on x86-64) and
 * AVX2 (wider vectors for the same element-wise operations: no sums, no
 * FMA, so the values are the same bits). */
void baton_kquant_decode_block(int dtype, const uint8_t *blk, float *out)
{
	decode_block(dtype, blk, out);
}

#if BATON_KQUANT_AVX2
__attribute__((target("avx2"))) void baton_kquant_decode_block_avx2(int dtype,
    const uint8_t *blk, float *out)
{
	decode_block(dtype, blk, out);
}
#endif
