/*
 * dtype.cuh: the weight types on the device, shared by the kernels of
 * moe.cu, ops.cu, route.cu and the others (each compiled into its own
 * fatbin): a row's bytes, one element decoded at any alignment (elem),
 * and the vector decoders of the K-quants. The values are the host's (host/host.h:
 * f16, bf16, q8_0 and q6_K exact; q4_K / q5_K one rounding, which a fused
 * multiply-add keeps; the block types of arena/quant.c in its order of
 * roundings).
 */
#ifndef BATON_ENGINE_DTYPE_CUDA_CUH
#define BATON_ENGINE_DTYPE_CUDA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "arena/arena.h"

__device__ __forceinline__ float f16f(uint32_t h)
{
	return __half2float(__ushort_as_half((unsigned short)h));
}

__device__ __forceinline__ float bf16f(uint32_t b)
{
	return __uint_as_float(b << 16);
}

__device__ __forceinline__ uint64_t row_bytes(uint32_t dt, uint32_t cols)
{
	switch (dt) {
	case BATON_DT_F32: return 4ull * cols;
	case BATON_DT_F16:
	case BATON_DT_BF16: return 2ull * cols;
	case BATON_DT_Q8_0: return (uint64_t)(cols / 32) * 34;
	case BATON_DT_Q4_K: return (uint64_t)(cols / 256) * 144;
	case BATON_DT_Q5_K: return (uint64_t)(cols / 256) * 176;
	case BATON_DT_Q6_K: return (uint64_t)(cols / 256) * 210;
	case BATON_DT_Q4_0:
	case BATON_DT_IQ4_NL: return (uint64_t)(cols / 32) * 18;
	case BATON_DT_Q4_1: return (uint64_t)(cols / 32) * 20;
	case BATON_DT_Q5_0: return (uint64_t)(cols / 32) * 22;
	case BATON_DT_Q5_1: return (uint64_t)(cols / 32) * 24;
	case BATON_DT_MXFP4: return (uint64_t)(cols / 32) * 17;
	case BATON_DT_Q2_K: return (uint64_t)(cols / 256) * 84;
	case BATON_DT_Q3_K: return (uint64_t)(cols / 256) * 110;
	case BATON_DT_IQ4_XS: return (uint64_t)(cols / 256) * 136;
	}
	return 0;
}

/* Byte loads: the scalar path works at any alignment. */
__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p)
{
	return (uint32_t)__ldg(p) | ((uint32_t)__ldg(p + 1) << 8);
}

__device__ __forceinline__ float ld_f32(const uint8_t *p)
{
	return __uint_as_float(ld_u16(p) | (ld_u16(p + 2) << 16));
}

/* ---- K-quants ----------------------------------------------------------
 * ggml's q4_K, q5_K and q6_K (layouts in arena/kquant.c), values as
 * arena/kquant.c: (d * sc) * q - dmin * m and (d * sc) * q. The
 * products are exact in f32, so the fused multiply-add nvcc makes of the
 * first gives the host's bits. */

/* Scale and min j of q4_K / q5_K (12 packed bytes at sc), times d, dmin. */
__device__ __forceinline__ void kq_scale_min(const uint8_t *sc, uint32_t j, float d,
    float dmin, float *ds, float *dm)
{
	uint32_t s, m;
	if (j < 4) {
		s = __ldg(sc + j) & 63;
		m = __ldg(sc + j + 4) & 63;
	} else {
		s = (__ldg(sc + j + 4) & 0xF) | ((__ldg(sc + j - 4) >> 6) << 4);
		m = (__ldg(sc + j + 4) >> 4) | ((__ldg(sc + j) >> 6) << 4);
	}
	*ds = d * (float)s;
	*dm = dmin * (float)m;
}

/* Element e (< 256) of one K-quant block, at any alignment. */
__device__ __forceinline__ float kq_elem(const uint8_t *blk, uint32_t dt, uint32_t e)
{
	if (dt == BATON_DT_Q6_K) {
		const uint32_t n = e / 128, qd = (e % 128) / 32, l = e % 32;
		const uint32_t lo = __ldg(blk + 64 * n + 32 * (qd & 1) + l);
		const uint32_t hi = (__ldg(blk + 128 + 32 * n + l) >> (2 * qd)) & 3;
		const int q = (int)((qd >= 2 ? lo >> 4 : lo & 0xF) | (hi << 4)) - 32;
		const float ds = f16f(ld_u16(blk + 208)) *
		    (float)(int8_t)__ldg(blk + 192 + 8 * n + l / 16 + 2 * qd);
		return ds * (float)q;
	}
	const uint32_t j = e / 32, l = e % 32;
	float ds, dm;
	kq_scale_min(blk + 4, j, f16f(ld_u16(blk)), f16f(ld_u16(blk + 2)), &ds, &dm);
	const uint32_t b = __ldg(blk + (dt == BATON_DT_Q5_K ? 48 : 16) + 32 * (j / 2) + l);
	uint32_t q = j & 1 ? b >> 4 : b & 0xF;
	if (dt == BATON_DT_Q5_K)
		q += ((__ldg(blk + 16 + l) >> j) & 1) << 4;
	return ds * (float)q - dm;
}

/* Eight consecutive values of one K-quant block, those of lane `lane`
 * (elements 8 * lane ...): q4_K / q5_K with 8-byte loads (blocks of 144
 * and 176 bytes keep rows 8-byte aligned), q6_K with 2-byte ones. */
template <int DT>
__device__ __forceinline__ void kq_w8(const uint8_t *blk, uint32_t lane, float w[8])
{
	const uint32_t l0 = 8 * (lane & 3);
	if (DT == BATON_DT_Q6_K) {
		const uint32_t n = lane >> 4, qd = (lane >> 2) & 3;
		const float ds = f16f(__ldg((const unsigned short *)(blk + 208))) *
		    (float)(int8_t)__ldg(blk + 192 + 8 * n + l0 / 16 + 2 * qd);
		const unsigned short *ql = (const unsigned short *)(blk + 64 * n + 32 * (qd & 1) + l0);
		const unsigned short *qh = (const unsigned short *)(blk + 128 + 32 * n + l0);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const uint32_t a = __ldg(ql + i), h = __ldg(qh + i);
#pragma unroll
			for (int k = 0; k < 2; k++) {
				const uint32_t lo = (a >> (8 * k)) & 0xff, hb = (h >> (8 * k)) & 0xff;
				const int q = (int)((qd >= 2 ? lo >> 4 : lo & 0xF) |
				    (((hb >> (2 * qd)) & 3) << 4)) - 32;
				w[2 * i + k] = ds * (float)q;
			}
		}
	} else {
		const uint32_t j = lane >> 2;
		float ds, dm;
		kq_scale_min(blk + 4, j, f16f(__ldg((const unsigned short *)blk)),
		    f16f(__ldg((const unsigned short *)(blk + 2))), &ds, &dm);
		const uint2 v = __ldg((const uint2 *)(blk + (DT == BATON_DT_Q5_K ? 48 : 16) +
		    32 * (j >> 1) + l0));
		uint2 h = make_uint2(0, 0);
		if (DT == BATON_DT_Q5_K)
			h = __ldg((const uint2 *)(blk + 16 + l0));
#pragma unroll
		for (int k = 0; k < 8; k++) {
			const uint32_t b = ((k < 4 ? v.x : v.y) >> (8 * (k & 3))) & 0xff;
			uint32_t q = j & 1 ? b >> 4 : b & 0xF;
			if (DT == BATON_DT_Q5_K)
				q += ((((k < 4 ? h.x : h.y) >> (8 * (k & 3))) >> j) & 1) << 4;
			w[k] = ds * (float)q - dm;
		}
	}
}

/* ---- the other block types of arena/quant.c -----------------------------
 * q4_0, q4_1, q5_0, q5_1, iq4_nl, mxfp4 (blocks of 32) and q2_K, q3_K,
 * iq4_xs (blocks of 256), one element at any alignment with byte loads,
 * each value arena/quant.c's float expression in its order, every
 * multiply and add rounded on its own (__fmul_rn / __fadd_rn: no fused
 * multiply-add), so the bits are the host's. */

__constant__ int8_t bq_kv_iq4nl[16] = {
	-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

__constant__ int8_t bq_kv_fp4[16] = {
	0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12,
};

/* Nibble e (< 32) of a block-32 qs: byte e % 16, low half for e < 16. */
__device__ __forceinline__ uint32_t bq_nib(const uint8_t *qs, uint32_t e)
{
	const uint32_t b = __ldg(qs + (e & 15));
	return e < 16 ? b & 0xF : b >> 4;
}

/* Bit e of the little-endian 32-bit qh at p. */
__device__ __forceinline__ uint32_t bq_bit(const uint8_t *p, uint32_t e)
{
	return (__ldg(p + e / 8) >> (e % 8)) & 1;
}

/* ggml_e8m0_to_fp32_half, as arena/quant.c */
__device__ __forceinline__ float bq_e8m0_half(uint32_t e)
{
	return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
}

/* Element e of one block (32 or 256 values) of the types above. */
__device__ __forceinline__ float bq_elem(const uint8_t *b, uint32_t dt, uint32_t e)
{
	switch (dt) {
	case BATON_DT_Q4_0:
		return __fmul_rn((float)((int)bq_nib(b + 2, e) - 8), f16f(ld_u16(b)));
	case BATON_DT_Q4_1:
		return __fadd_rn(__fmul_rn((float)bq_nib(b + 4, e), f16f(ld_u16(b))),
		    f16f(ld_u16(b + 2)));
	case BATON_DT_Q5_0:
		return __fmul_rn((float)((int)(bq_nib(b + 6, e) | bq_bit(b + 2, e) << 4) - 16),
		    f16f(ld_u16(b)));
	case BATON_DT_Q5_1:
		return __fadd_rn(__fmul_rn((float)(bq_nib(b + 8, e) | bq_bit(b + 4, e) << 4),
		    f16f(ld_u16(b))), f16f(ld_u16(b + 2)));
	case BATON_DT_IQ4_NL:
		return __fmul_rn(f16f(ld_u16(b)), (float)bq_kv_iq4nl[bq_nib(b + 2, e)]);
	case BATON_DT_MXFP4:
		return __fmul_rn((float)bq_kv_fp4[bq_nib(b + 1, e)], bq_e8m0_half(__ldg(b)));
	case BATON_DT_Q2_K: {
		/* half n, shift j, run h of 16, l: element 128 n + 32 j + 16 h + l */
		const uint32_t n = e / 128, j = (e % 128) / 32, h = (e % 32) / 16, l = e % 16;
		const uint32_t sc = __ldg(b + 8 * n + 2 * j + h);
		const float dl = __fmul_rn(f16f(ld_u16(b + 80)), (float)(sc & 0xF));
		const float ml = __fmul_rn(f16f(ld_u16(b + 82)), (float)(sc >> 4));
		const uint32_t q = (__ldg(b + 16 + 32 * n + l + 16 * h) >> (2 * j)) & 3;
		return __fsub_rn(__fmul_rn(dl, (float)q), ml);
	}
	case BATON_DT_Q3_K: {
		const uint32_t n = e / 128, j = (e % 128) / 32, h = (e % 32) / 16, l = e % 16;
		const uint32_t i = 8 * n + 2 * j + h, k = l + 16 * h; /* scale i, byte k */
		const uint32_t lo = i < 8 ? __ldg(b + 96 + i) & 0xF : __ldg(b + 96 + i - 8) >> 4;
		const uint32_t hi = (__ldg(b + 104 + i % 4) >> (2 * (i / 4))) & 3;
		const float dl = __fmul_rn(f16f(ld_u16(b + 108)), (float)((int)(lo | hi << 4) - 32));
		const int q = (int)((__ldg(b + 32 + 32 * n + k) >> (2 * j)) & 3) -
		    ((__ldg(b + k) >> (4 * n + j)) & 1 ? 0 : 4);
		return __fmul_rn(dl, (float)q);
	}
	case BATON_DT_IQ4_XS: {
		const uint32_t ib = e / 32, sh = ld_u16(b + 2);
		const int ls = (int)(((__ldg(b + 4 + ib / 2) >> (4 * (ib % 2))) & 0xF) |
		    ((sh >> (2 * ib)) & 3) << 4);
		const float dl = __fmul_rn(f16f(ld_u16(b)), (float)(ls - 32));
		return __fmul_rn(dl, (float)bq_kv_iq4nl[bq_nib(b + 8 + 16 * ib, e % 32)]);
	}
	}
	return 0.0f;
}

/* 1 for the types of bq_elem; *blk gets their block size. */
__device__ __forceinline__ bool is_bquant(uint32_t dt, uint32_t *blk)
{
	switch (dt) {
	case BATON_DT_Q4_0:
	case BATON_DT_Q4_1:
	case BATON_DT_Q5_0:
	case BATON_DT_Q5_1:
	case BATON_DT_IQ4_NL:
	case BATON_DT_MXFP4: *blk = 32; return true;
	case BATON_DT_Q2_K:
	case BATON_DT_Q3_K:
	case BATON_DT_IQ4_XS: *blk = 256; return true;
	}
	return false;
}

__device__ __forceinline__ bool is_kquant(uint32_t dt)
{
	return dt == BATON_DT_Q4_K || dt == BATON_DT_Q5_K || dt == BATON_DT_Q6_K;
}

/* Element i of a row in dtype dt. */
__device__ __forceinline__ float elem(const uint8_t *row, uint32_t dt, uint32_t i)
{
	if (is_kquant(dt))
		return kq_elem(row + (uint64_t)(i / 256) * row_bytes(dt, 256), dt, i % 256);
	uint32_t bs;
	if (is_bquant(dt, &bs))
		return bq_elem(row + (uint64_t)(i / bs) * row_bytes(dt, bs), dt, i % bs);
	switch (dt) {
	case BATON_DT_F32: return ld_f32(row + 4ull * i);
	case BATON_DT_F16: return f16f(ld_u16(row + 2ull * i));
	case BATON_DT_BF16: return bf16f(ld_u16(row + 2ull * i));
	case BATON_DT_Q8_0: {
		const uint8_t *b = row + (uint64_t)(i / 32) * 34;
		return f16f(ld_u16(b)) * (float)(int8_t)__ldg(b + 2 + i % 32);
	}
	}
	return 0.0f;
}

#endif
