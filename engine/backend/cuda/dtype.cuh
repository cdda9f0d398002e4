/*
 * dtype.cuh: the weight types on the device, shared by the kernels of
 * moe.cu and ops.cu (each compiled into its own fatbin): a row's
 * bytes, one element decoded at any alignment (elem), and the vector
 * decoders of the K-quants. The values are the host's (host/host.h:
 * f16, bf16, q8_0 and q6_K exact; q4_K / q5_K one rounding, which a fused
 * multiply-add keeps).
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

__device__ __forceinline__ bool is_kquant(uint32_t dt)
{
	return dt == BATON_DT_Q4_K || dt == BATON_DT_Q5_K || dt == BATON_DT_Q6_K;
}

/* Element i of a row in dtype dt. */
__device__ __forceinline__ float elem(const uint8_t *row, uint32_t dt, uint32_t i)
{
	if (is_kquant(dt))
		return kq_elem(row + (uint64_t)(i / 256) * row_bytes(dt, 256), dt, i % 256);
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
