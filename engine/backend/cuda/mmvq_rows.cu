/*
 * mmvq_rows.cu: the dense matmuls of passes of 2 to 64 rows (mmvq_rows.h).
 *
 * baton_mmvq_rows_<RT>: q4_K / q6_K weights against the rows of x as int8
 * blocks, dp4a as mmvq.cu does. A weight row's bytes are loaded and its
 * scales decoded once for a tile of RT rows of x (each thread's share of
 * its blocks, as baton_mmvq_matmul's thread would take them), then dotted
 * with each row's quants: the weights cost their bytes once per tile, the
 * activations (k bytes a row) stay in L1. Every (row, output) is summed
 * in baton_mmvq_matmul's order with its expression per item, so a row's
 * bits are the batch-1 path's.
 *
 * baton_vr_f32_<RT>: the exact f32 matmul (the MoE routers: 128 outputs,
 * too few warps for ops.cu's 8-row kernel to fill the device) with a
 * warp per (output, tile of RT rows) and a weight row's loads in flight
 * together.
 */
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/mmvq.h"
#include "engine/backend/cuda/mmvq_rows.h"

static_assert(sizeof(baton_vr_args) == 176, "mmvq rows args layout");
static_assert(sizeof(baton_vr_f32_args) == 56, "vr f32 args layout");
static_assert(BATON_VR_THREADS == BATON_MMVQ_THREADS, "the batch-1 kernel's block");

#define THREADS BATON_VR_THREADS
#define SUB BATON_MMVQ_SUB

__device__ __forceinline__ int vr_ld_i32(const uint8_t *p) /* 4-byte aligned */
{
	return __ldg((const int *)p);
}

__device__ __forceinline__ int vr_ld_i32_2(const uint8_t *p) /* 2-byte aligned */
{
	const unsigned short *h = (const unsigned short *)p;
	return (int)((uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16));
}

/* Thread t (< 16) of q4_K block b (mmvq.cu's dot_q4k, its weights decoded
 * once) against rows r < nr of x: v[r] = the block's share (added to the
 * sums after the type's branch, as baton_mmvq_matmul adds dot_blk's). */
template <int RT>
__device__ __forceinline__ void item_q4k(float (&out)[RT], const uint8_t *b, const int8_t *q,
    const float *d, uint64_t qs, uint64_t ds, uint32_t nr, uint32_t t)
{
	const uint32_t j = t >> 2, o = (t & 3) * 8;
	const int v0 = vr_ld_i32(b + 16 + 32 * j + o), v1 = vr_ld_i32(b + 16 + 32 * j + o + 4);
	const uint8_t *sc = b + 4;
	uint32_t s0, m0, s1, m1;
	if (j < 2) {
		s0 = __ldg(sc + 2 * j) & 63, m0 = __ldg(sc + 2 * j + 4) & 63;
		s1 = __ldg(sc + 2 * j + 1) & 63, m1 = __ldg(sc + 2 * j + 5) & 63;
	} else {
		const uint32_t a0 = __ldg(sc + 2 * j + 4), a1 = __ldg(sc + 2 * j + 5);
		s0 = (a0 & 0xF) | ((__ldg(sc + 2 * j - 4) >> 6) << 4);
		m0 = (a0 >> 4) | ((__ldg(sc + 2 * j) >> 6) << 4);
		s1 = (a1 & 0xF) | ((__ldg(sc + 2 * j - 3) >> 6) << 4);
		m1 = (a1 >> 4) | ((__ldg(sc + 2 * j + 1) >> 6) << 4);
	}
	const uint32_t dd = (uint32_t)vr_ld_i32(b);
	const float dw = f16f(dd & 0xFFFF), dm = f16f(dd >> 16);
	const int wl0 = v0 & 0x0F0F0F0F, wl1 = v1 & 0x0F0F0F0F;
	const int wh0 = (v0 >> 4) & 0x0F0F0F0F, wh1 = (v1 >> 4) & 0x0F0F0F0F;
#pragma unroll
	for (int r = 0; r < RT; r++) {
		if ((uint32_t)r >= nr)
			break;
		const int8_t *qr = q + r * qs;
		const float *dr = d + r * ds;
		const int2 ul = *(const int2 *)(qr + 64 * j + o), uh = *(const int2 *)(qr + 64 * j + 32 + o);
		const int dl = __dp4a(wl0, ul.x, __dp4a(wl1, ul.y, 0));
		const int dh = __dp4a(wh0, uh.x, __dp4a(wh1, uh.y, 0));
		const int sl = __dp4a(0x01010101, ul.x, __dp4a(0x01010101, ul.y, 0));
		const int sh = __dp4a(0x01010101, uh.x, __dp4a(0x01010101, uh.y, 0));
		const float2 f = *(const float2 *)(dr + 2 * j);
		const float fl = f.x, fh = f.y;
		out[r] = dw * (fl * (float)((int)s0 * dl) + fh * (float)((int)s1 * dh)) -
		    dm * (fl * (float)((int)m0 * sl) + fh * (float)((int)m1 * sh));
	}
}

/* Thread t (< 16) of q6_K block b (mmvq.cu's dot_q6k, decoded once). */
template <int RT>
__device__ __forceinline__ void item_q6k(float (&out)[RT], const uint8_t *b, const int8_t *q,
    const float *d, uint64_t qs, uint64_t ds, uint32_t nr, uint32_t t)
{
	const uint32_t h = t >> 3, l0 = (t & 7) * 4;
	const int qa = vr_ld_i32_2(b + 64 * h + l0), qb = vr_ld_i32_2(b + 64 * h + 32 + l0);
	const int qh = vr_ld_i32_2(b + 128 + 32 * h + l0);
	const int8_t *sc = (const int8_t *)b + 192 + 8 * h + l0 / 16;
	const int v[4] = {
		(int)__vsubss4((unsigned)((qa & 0x0F0F0F0F) | ((qh << 4) & 0x30303030)), 0x20202020u),
		(int)__vsubss4((unsigned)((qb & 0x0F0F0F0F) | ((qh << 2) & 0x30303030)), 0x20202020u),
		(int)__vsubss4((unsigned)(((qa >> 4) & 0x0F0F0F0F) | (qh & 0x30303030)), 0x20202020u),
		(int)__vsubss4((unsigned)(((qb >> 4) & 0x0F0F0F0F) | ((qh >> 2) & 0x30303030)),
		    0x20202020u),
	};
	const int s[4] = { __ldg(sc), __ldg(sc + 2), __ldg(sc + 4), __ldg(sc + 6) };
	const float dw = f16f(__ldg((const unsigned short *)(b + 208)));
#pragma unroll
	for (int r = 0; r < RT; r++) {
		if ((uint32_t)r >= nr)
			break;
		const int8_t *qr = q + r * qs + 128 * h + l0;
		const float4 f = *(const float4 *)(d + r * ds + 4 * h);
		const float fd[4] = { f.x, f.y, f.z, f.w };
		float sum = 0.0f;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int u = *(const int *)(qr + 32 * i);
			const int dot = __dp4a(v[i], u, 0);
			sum += fd[i] * (float)(s[i] * dot);
		}
		out[r] = dw * sum;
	}
}

/* Block blk's output rows of one matrix for the tile of rows r0 .. r0 +
 * nr - 1: baton_mmvq_matmul's mmvq_rows with RT accumulators a thread. */
template <int RT>
__device__ __forceinline__ void vr_block(uint64_t w, uint32_t dt, uint64_t rb, uint32_t n_out,
    uint64_t b, uint32_t b_dtype, uint64_t y, uint32_t accumulate, const int8_t *q,
    const float *d, uint32_t k, uint32_t tpr, uint32_t blk, uint32_t r0, uint32_t nr)
{
	__shared__ float sh[RT][THREADS / 32];
	const uint32_t o = blk * (THREADS / tpr) + threadIdx.x / tpr;
	const uint32_t i = threadIdx.x % tpr, nsb = k / 256;
	const uint64_t qs = k, ds = k / 32;
	q += r0 * qs;
	d += r0 * ds;
	float acc[RT];
#pragma unroll
	for (int r = 0; r < RT; r++)
		acc[r] = 0.0f;
	if (o < n_out) {
		const uint8_t *row = (const uint8_t *)w + o * rb;
#pragma unroll 2
		for (uint32_t it = i; it < nsb * SUB; it += tpr) {
			const uint32_t sb = it / SUB, t = it % SUB;
			float v[RT];
			if (dt == BATON_DT_Q4_K)
				item_q4k<RT>(v, row + 144ull * sb, q + 256 * sb, d + 8 * sb, qs, ds, nr, t);
			else
				item_q6k<RT>(v, row + 210ull * sb, q + 256 * sb, d + 8 * sb, qs, ds, nr, t);
#pragma unroll
			for (int r = 0; r < RT; r++)
				if ((uint32_t)r < nr)
					acc[r] += v[r];
		}
	}
	/* the lane tree, then (tpr > 32) the warps of a row in order */
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
	if (tpr > 32) {
		const uint32_t wi = threadIdx.x >> 5, w0 = wi & ~(tpr / 32 - 1);
		if ((threadIdx.x & 31) == 0)
#pragma unroll
			for (int r = 0; r < RT; r++)
				sh[r][wi] = acc[r];
		__syncthreads();
#pragma unroll
		for (int r = 0; r < RT; r++) {
			float s = sh[r][w0];
			for (uint32_t v = 1; v < tpr / 32; v++)
				s += sh[r][w0 + v];
			acc[r] = s;
		}
	}
	if (i != 0 || o >= n_out)
		return;
	const float bo = b ? elem((const uint8_t *)b, b_dtype, o) : 0.0f;
#pragma unroll
	for (int r = 0; r < RT; r++) {
		if ((uint32_t)r >= nr)
			break;
		float s = acc[r];
		if (b)
			s += bo;
		float *yo = (float *)y + (uint64_t)(r0 + r) * n_out + o;
		*yo = accumulate ? *yo + s : s;
	}
}

template <int RT>
__device__ __forceinline__ void vr_kernel(const baton_vr_args &a)
{
	const uint32_t i = blockIdx.x >= a.start[2] ? 2 : blockIdx.x >= a.start[1] ? 1 : 0;
	const uint32_t r0 = blockIdx.y * RT;
	if (r0 >= a.rows)
		return; /* the whole block */
	const uint32_t nr = min((uint32_t)RT, a.rows - r0);
	vr_block<RT>(a.w[i], a.w_dtype[i], a.row_bytes[i], a.n_out[i], a.b[i], a.b_dtype[i], a.y[i],
	    a.accumulate, (const int8_t *)a.q, (const float *)a.d, a.k, a.tpr, blockIdx.x - a.start[i],
	    r0, nr);
}

#define VR_KERNEL(RT)                                                          \
	extern "C" __global__ void __launch_bounds__(THREADS)                  \
	baton_mmvq_rows_##RT(baton_vr_args a) { vr_kernel<RT>(a); }
VR_KERNEL(2)
VR_KERNEL(4)
VR_KERNEL(8)
VR_KERNEL(16)

/* ---- the exact f32 matmul of a few rows --------------------------------- */

template <int RT>
__device__ __forceinline__ void vr_f32(const baton_vr_f32_args &a)
{
	const uint32_t lane = threadIdx.x & 31;
	const uint32_t o = blockIdx.x * BATON_VR_F32_WARPS + (threadIdx.x >> 5);
	const uint32_t r0 = blockIdx.y * RT;
	if (o >= a.n_out || r0 >= a.rows)
		return; /* whole warps */
	const uint32_t k = a.k, nr = min((uint32_t)RT, a.rows - r0);
	const float *w = (const float *)a.w + (uint64_t)o * k;
	const float *x = (const float *)a.x + (uint64_t)r0 * k;
	float acc[RT];
#pragma unroll
	for (int r = 0; r < RT; r++)
		acc[r] = 0.0f;
	for (uint32_t e0 = lane; e0 < k; e0 += 32 * 8) {
		float wv[8];
#pragma unroll
		for (int u = 0; u < 8; u++)
			wv[u] = e0 + 32 * u < k ? __ldg(w + e0 + 32 * u) : 0.0f;
#pragma unroll
		for (int u = 0; u < 8; u++) {
			const uint32_t e = e0 + 32 * u;
			if (e >= k)
				break;
#pragma unroll
			for (int r = 0; r < RT; r++)
				if ((uint32_t)r < nr)
					acc[r] = __fadd_rn(acc[r], __fmul_rn(wv[u], __ldg(x + (uint64_t)r * k + e)));
		}
	}
#pragma unroll
	for (int r = 0; r < RT; r++)
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			acc[r] = __fadd_rn(acc[r], __shfl_xor_sync(0xffffffffu, acc[r], off));
	if (lane != 0)
		return;
	const float b = a.b ? elem((const uint8_t *)a.b, a.b_dtype, o) : 0.0f;
#pragma unroll
	for (int r = 0; r < RT; r++)
		if ((uint32_t)r < nr) {
			float *y = (float *)a.y + (uint64_t)(r0 + r) * a.n_out + o;
			const float v = a.b ? __fadd_rn(acc[r], b) : acc[r];
			*y = a.accumulate ? __fadd_rn(*y, v) : v;
		}
}

#define VR_F32(RT)                                                             \
	extern "C" __global__ void __launch_bounds__(32 * BATON_VR_F32_WARPS)  \
	baton_vr_f32_##RT(baton_vr_f32_args a) { vr_f32<RT>(a); }
VR_F32(4)
VR_F32(8)
