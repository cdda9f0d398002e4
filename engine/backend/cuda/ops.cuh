/*
 * ops.cuh: the device functions that the dense ops' kernels share, each
 * file compiled into its own fatbin: ops.cu (the row ops), attn_split.cu
 * (attention) and route.cu (routing). The warp's fixed-order sums of
 * host/host.h (lane_tree, warp_dot_f32_u), mmvq.cu's int8 blocks of a
 * warp's values (quant_warp), the weight loads and the normed row of
 * rmsnorm (wload, norm_row), and rope and rmsnorm-then-rope on one head
 * row (rope_head, head_nr): one definition, so that qk_norm_rope and the
 * fused decode attention give the same bits. The arithmetic is ops.cu's
 * (its header).
 */
#ifndef BATON_ENGINE_OPS_CUDA_CUH
#define BATON_ENGINE_OPS_CUDA_CUH

#include <math.h>
#include <stdint.h>

#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/ops.h"

#define WARPS BATON_OPS_WARPS
#define THREADS (WARPS * 32)

/* baton_mmvq_quant (mmvq.cu), operation for operation, on the value v
 * of each lane of a warp holding 32 consecutive values from element i
 * (i % 32 == lane): q[i] and, by lane 0, the block's scale d[i / 32]. */
__device__ __forceinline__ void quant_warp(float v, int8_t *q, float *d, uint64_t i,
    uint32_t lane)
{
	float m = fabsf(v);
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
	const float s = __fdiv_rn(m, 127.0f);
	const int qv = m > 0.0f ? __float2int_rn(__fdiv_rn(v, s)) : 0;
	q[i] = (int8_t)max(-127, min(127, qv));
	if (lane == 0)
		d[i / 32] = s;
}

/* The contract's tree over the 32 lanes: every lane ends with the sum. */
__device__ __forceinline__ float lane_tree(float s)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
	return s;
}

/* dot(a0, b) of two f32 vectors of n, in the fixed order (lane l sums
 * l, l + 32, ..., then lane_tree, then the tail in order), in every lane;
 * and dot(a1, b) beside it unless a1 is NULL (s[0], s[1]). U loads of
 * each vector in flight per lane, the adds in their sequence. One load at a time left a 2,048-wide rmsnorm waiting
 * on 64 round trips to memory (22 us), and attention's scores on one per
 * 32 values of each key. */
template <int U>
__device__ __forceinline__ void warp_dot_f32_u(const float *a0, const float *a1, const float *b,
    uint32_t n, float s[2])
{
	const uint32_t lane = threadIdx.x & 31, n32 = n & ~31u;
	float s0 = 0.0f, s1 = 0.0f;
	uint32_t i = lane;
	for (; i + 32 * (U - 1) < n32; i += 32 * U) {
		float x0[U], x1[U], y[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			x0[u] = a0[i + 32 * u];
			y[u] = b[i + 32 * u];
			if (a1)
				x1[u] = a1[i + 32 * u];
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			s0 = __fadd_rn(s0, __fmul_rn(x0[u], y[u]));
			if (a1)
				s1 = __fadd_rn(s1, __fmul_rn(x1[u], y[u]));
		}
	}
	for (; i < n32; i += 32) {
		s0 = __fadd_rn(s0, __fmul_rn(a0[i], b[i]));
		if (a1)
			s1 = __fadd_rn(s1, __fmul_rn(a1[i], b[i]));
	}
	s0 = lane_tree(s0);
	if (a1)
		s1 = lane_tree(s1);
	for (i = n32; i < n; i++) {
		s0 = __fadd_rn(s0, __fmul_rn(a0[i], b[i]));
		if (a1)
			s1 = __fadd_rn(s1, __fmul_rn(a1[i], b[i]));
	}
	s[0] = s0;
	s[1] = s1;
}

/* Weight i of a row: typed loads for the 16- and 32-bit types (rows
 * aligned to their element), the byte loads of elem() for the rest or
 * when DT < 0 (the dtype read at run time, any alignment). */
template <int DT>
__device__ __forceinline__ float wload(const uint8_t *row, uint32_t dt, uint32_t i)
{
	if (DT == BATON_DT_F32)
		return __ldg((const float *)row + i);
	if (DT == BATON_DT_F16)
		return f16f(__ldg((const unsigned short *)row + i));
	if (DT == BATON_DT_BF16)
		return bf16f(__ldg((const unsigned short *)row + i));
	return elem(row, DT < 0 ? dt : (uint32_t)DT, i);
}

#define NORM_U 8
#define NORM_NONE (-2) /* no weight */

/* out = x * s (* w): each lane writes only elements it reads, so loading
 * U of them before storing any is safe in place and keeps the loads in
 * flight. The weight's dtype is a template argument (wload's typed loads):
 * elem()'s run-time switch between each load and the next made every
 * element wait for the one before (64 round trips for 2,048 values). */
template <int DT, int U>
__device__ __forceinline__ uint32_t norm_out(const float *x, float *out, const uint8_t *w,
    uint32_t dt, uint32_t cols, float s, uint32_t i)
{
	for (; i + 32 * (U - 1) < cols; i += 32 * U) {
		float v[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			v[u] = __fmul_rn(x[i + 32 * u], s);
			if (DT != NORM_NONE)
				v[u] = __fmul_rn(v[u], wload<DT>(w, dt, i + 32 * u));
		}
#pragma unroll
		for (int u = 0; u < U; u++)
			out[i + 32 * u] = v[u];
	}
	return i;
}

template <int DT>
__device__ __forceinline__ void norm_row(const float *x, float *out, const uint8_t *w, uint32_t dt,
    uint32_t cols, float s, uint32_t lane)
{
	uint32_t i = norm_out<DT, NORM_U>(x, out, w, dt, cols, s, lane);
	i = norm_out<DT, 4>(x, out, w, dt, cols, s, i); /* the per-head norms' 128 */
	norm_out<DT, 1>(x, out, w, dt, cols, s, i);
}

/* One head's rotation at position p, pairs i = t, t + stride, ... */
__device__ __forceinline__ void rope_head(float *v, float p, const float *inv, uint32_t half,
    float mscale, uint32_t t, uint32_t stride)
{
	for (uint32_t i = t; i < half; i += stride) {
		const float ang = __fmul_rn(p, inv[i]);
		const float c = __fmul_rn(cosf(ang), mscale), s = __fmul_rn(sinf(ang), mscale);
		const float x1 = v[i], x2 = v[i + half];
		v[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
		v[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
	}
}

/* rmsnorm then rope on one head row v (global or shared memory), by one
 * warp: baton_ops_rmsnorm's warp (the same functions, so the same bits),
 * then, once the warp's stores are visible to it (__syncwarp orders
 * them), baton_ops_rope's. */
__device__ __forceinline__ void head_nr(float *v, uint64_t wa, uint32_t wdt, uint32_t hd, float eps,
    float p, const float *inv, float mscale, uint32_t lane)
{
	const uint8_t *w = (const uint8_t *)wa;
	float ss2[2];
	warp_dot_f32_u<NORM_U>(v, NULL, v, hd, ss2);
	const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss2[0], (float)hd), eps)));
	__syncwarp(); /* every lane has read the tail before any writes in place */
	if (!w)
		norm_row<NORM_NONE>(v, v, w, 0, hd, s, lane);
	else if (wdt == BATON_DT_F32 && wa % 4 == 0)
		norm_row<BATON_DT_F32>(v, v, w, 0, hd, s, lane);
	else if (wdt == BATON_DT_BF16 && wa % 2 == 0)
		norm_row<BATON_DT_BF16>(v, v, w, 0, hd, s, lane);
	else if (wdt == BATON_DT_F16 && wa % 2 == 0)
		norm_row<BATON_DT_F16>(v, v, w, 0, hd, s, lane);
	else
		norm_row<-1>(v, v, w, wdt, hd, s, lane);
	__syncwarp(); /* the normed row, written by every lane, before the pairs are read */
	rope_head(v, p, inv, hd / 2, mscale, lane, 32);
}

#endif
