/*
 * gemv16.cu: matmul and the MoE experts at batch 1 on bf16 or f16 weights
 * (gemv16.h): a warp per weight row, 16-byte loads that skip L1 (the
 * weights are read once; L1 keeps x, which every row reads), U of them
 * issued before the first is used, so a row's bytes are in flight at
 * once and the kernels run at the memory's rate, not its latency.
 *
 * Order (fixed, so the same bits run to run and in a replayed graph):
 * lane l takes 16-byte chunks l, l + 32, ... of its row (weights 8c ..
 * 8c + 7 of chunk c), accumulating with fused multiply-adds in chunk order,
 * then the butterfly over 16, 8, 4, 2, 1. The down kernel walks the pairs'
 * rows as one sequence of chunks (pair p's chunks after pair p - 1's),
 * each chunk's dot weighted by w[p] as it is added.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/gemv16.h"

static_assert(sizeof(baton_g16_args) == 64, "gemv16 args layout");
static_assert(sizeof(baton_g16_moe_args) == 96, "gemv16 moe args layout");
static_assert(sizeof(baton_g16_n_args) == 168, "gemv16 matmuls args layout");

#define WARPS BATON_G16_WARPS
#define U 8            /* 16-byte loads a lane has in flight per row */
#define GR BATON_G16_GATE_ROWS /* gate_up: rows of gate (and of up) per warp */
#define GV 2           /* gate_up: loads in flight per row and lane */
#define DU 12          /* down: loads in flight per lane (two rounds of a top-8 step) */
#define MAX_TOP_K 32   /* pairs the down kernel keeps in shared memory */

/* 16 bytes of weights, not kept in L1 */
__device__ __forceinline__ uint4 ld_w(const uint8_t *p)
{
	uint4 r;
	asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
	    : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
	    : "l"(p));
	return r;
}

/* Programmatic dependent launch (cuda_launch_kx's pdl 2): a kernel so
 * launched may start while the one before it runs; pdl_wait blocks until
 * that one has finished and its writes are visible (a no-op for a kernel
 * launched the usual way), so nothing it wrote is read before; what it
 * did not write (the weights) may be loaded before. pdl_go lets the next
 * such launch start once every block here has passed it. */
__device__ __forceinline__ void pdl_wait()
{
	asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void pdl_go()
{
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* Two 16-bit weights (the low half first) as floats. */
template <int DT>
__device__ __forceinline__ float2 w2(uint32_t v)
{
	if (DT == BATON_DT_BF16)
		return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
	__half2 h;
	memcpy(&h, &v, 4);
	return __half22float2(h);
}

/* s + the 8 weights of r . x[0..7] (x 16-byte aligned), in order. */
template <int DT>
__device__ __forceinline__ float dot8(uint4 r, const float *x, float s)
{
	const float4 a = __ldg((const float4 *)x), b = __ldg((const float4 *)x + 1);
	const float2 w0 = w2<DT>(r.x), w1 = w2<DT>(r.y), w2_ = w2<DT>(r.z), w3 = w2<DT>(r.w);
	s = fmaf(w0.x, a.x, s);
	s = fmaf(w0.y, a.y, s);
	s = fmaf(w1.x, a.z, s);
	s = fmaf(w1.y, a.w, s);
	s = fmaf(w2_.x, b.x, s);
	s = fmaf(w2_.y, b.y, s);
	s = fmaf(w3.x, b.z, s);
	s = fmaf(w3.y, b.w, s);
	return s;
}

__device__ __forceinline__ float lane_sum(float v)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

/* Lane l's share of row . x over n chunks of 16 bytes: its first U
 * chunks loaded before pdl_wait (x is read after), the rest in rounds of
 * U; the chunks in the order c, c + 32, ... either way. */
template <int DT>
__device__ __forceinline__ float dot_row(const uint8_t *row, const float *x, uint32_t n,
    uint32_t lane)
{
	float s = 0.0f;
	{
		uint4 v[U];
#pragma unroll
		for (int u = 0; u < U; u++)
			if (lane + 32 * u < n)
				v[u] = ld_w(row + 16ull * (lane + 32 * u));
		pdl_wait();
#pragma unroll
		for (int u = 0; u < U; u++)
			if (lane + 32 * u < n)
				s = dot8<DT>(v[u], x + 8 * (lane + 32 * u), s);
	}
	uint32_t c = lane + 32 * U;
	for (; c + 32 * (U - 1) < n; c += 32 * U) {
		uint4 v[U];
#pragma unroll
		for (int u = 0; u < U; u++)
			v[u] = ld_w(row + 16ull * (c + 32 * u));
#pragma unroll
		for (int u = 0; u < U; u++)
			s = dot8<DT>(v[u], x + 8 * (c + 32 * u), s);
	}
	for (; c < n; c += 32)
		s = dot8<DT>(ld_w(row + 16ull * c), x + 8 * c, s);
	return s;
}

/* GR gate rows and their GR up rows against one x (gate_up's warp), GV
 * loads of each row in flight a round: 2 * GR * GV. */
template <int DT>
__device__ __forceinline__ void dot_gate_up(const uint8_t *g, const uint8_t *up, uint64_t rb,
    const float *x, uint32_t n, uint32_t lane, float (&sg)[GR], float (&su)[GR])
{
#pragma unroll
	for (int i = 0; i < GR; i++)
		sg[i] = su[i] = 0.0f;
	uint32_t c = lane;
	for (; c + 32 * (GV - 1) < n; c += 32 * GV) {
		uint4 vg[GR][GV], vu[GR][GV];
#pragma unroll
		for (int i = 0; i < GR; i++)
#pragma unroll
			for (int v = 0; v < GV; v++) {
				vg[i][v] = ld_w(g + i * rb + 16ull * (c + 32 * v));
				vu[i][v] = ld_w(up + i * rb + 16ull * (c + 32 * v));
			}
#pragma unroll
		for (int i = 0; i < GR; i++)
#pragma unroll
			for (int v = 0; v < GV; v++) {
				sg[i] = dot8<DT>(vg[i][v], x + 8 * (c + 32 * v), sg[i]);
				su[i] = dot8<DT>(vu[i][v], x + 8 * (c + 32 * v), su[i]);
			}
	}
	for (; c < n; c += 32)
#pragma unroll
		for (int i = 0; i < GR; i++) {
			sg[i] = dot8<DT>(ld_w(g + i * rb + 16ull * c), x + 8 * c, sg[i]);
			su[i] = dot8<DT>(ld_w(up + i * rb + 16ull * c), x + 8 * c, su[i]);
		}
}

__device__ __forceinline__ float bias_elem(const uint8_t *b, uint32_t dt, uint32_t o)
{
	if (dt == BATON_DT_F32)
		return ((const float *)b)[o];
	const uint32_t v = ((const unsigned short *)b)[o];
	if (dt == BATON_DT_BF16)
		return __uint_as_float(v << 16);
	return __half2float(__ushort_as_half((unsigned short)v));
}

/* Output row o of one matrix: y[o] = (acc ? y[o] : 0) + w[o] . x + b[o]
 * (the whole warp; lane 0 writes). */
__device__ __forceinline__ void matmul_row(uint64_t w, uint32_t w_dtype, uint64_t row_bytes,
    uint64_t b, uint32_t b_dtype, uint64_t y, uint64_t x, uint32_t k, uint32_t acc, uint32_t o,
    uint32_t lane)
{
	const uint8_t *row = (const uint8_t *)w + o * row_bytes;
	const float *xv = (const float *)x;
	float s = w_dtype == BATON_DT_BF16 ? dot_row<BATON_DT_BF16>(row, xv, k / 8, lane)
	                                   : dot_row<BATON_DT_F16>(row, xv, k / 8, lane);
	s = lane_sum(s);
	if (lane == 0) {
		if (b)
			s += bias_elem((const uint8_t *)b, b_dtype, o);
		float *yv = (float *)y;
		yv[o] = acc ? yv[o] + s : s;
	}
}

extern "C" __global__ void __launch_bounds__(32 * WARPS)
baton_g16_matmul(baton_g16_args a)
{
	const uint32_t o = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
	if (o >= a.n_out)
		return; /* the whole warp */
	matmul_row(a.w, a.w_dtype, a.row_bytes, a.b, a.b_dtype, a.y, a.x, a.k, a.accumulate, o, lane);
}

/* Up to 3 matrices over one x: block i of matrix m from start[m]; the
 * rows are matmul_row's, so each output has baton_g16_matmul's bits. */
extern "C" __global__ void __launch_bounds__(32 * WARPS)
baton_g16_matmuls(baton_g16_n_args a)
{
	const uint32_t bx = blockIdx.x, lane = threadIdx.x & 31;
	const uint32_t m = a.n > 2 && bx >= a.start[2] ? 2 : a.n > 1 && bx >= a.start[1] ? 1 : 0;
	const uint32_t o = (bx - a.start[m]) * WARPS + threadIdx.x / 32;
	if (m >= a.n || o >= a.n_out[m])
		return; /* the whole warp */
	matmul_row(a.w[m], a.w_dtype[m], a.row_bytes[m], a.b[m], a.b_dtype[m], a.y[m], a.x, a.k,
	    a.accumulate, o, lane);
}

__device__ __forceinline__ float silu(float g)
{
	return g / (1.0f + expf(-g)); /* moe.cu's */
}

/* A warp per GR rows r0 .. r0 + GR - 1 of pair p (the last warp's rows
 * past d_ff repeat row d_ff - GR, its results not written; d_ff >= GR). */
extern "C" __global__ void __launch_bounds__(32 * WARPS)
baton_g16_gate_up(baton_g16_moe_args a)
{
	const uint32_t w = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
	const uint32_t p = blockIdx.y, r0 = w * GR;
	/* ids and xn come from the kernels before; after the wait the down
	 * kernel may start (it reads ids, written before this one started) */
	pdl_wait();
	pdl_go();
	if (r0 >= a.d_ff)
		return;
	const uint32_t rs = r0 + GR <= a.d_ff ? r0 : a.d_ff - GR; /* rows rs .. rs + GR - 1 */
	const uint8_t *blob = (const uint8_t *)((const uint64_t *)a.table)[((const uint32_t *)a.ids)[p]];
	const uint64_t rb = 2ull * a.d_model;
	const uint8_t *g = blob + a.gate_off + rs * rb, *u = blob + a.up_off + rs * rb;
	const float *xn = (const float *)a.xn;
	float sg[GR], su[GR];
	if (a.gate_dtype == BATON_DT_BF16)
		dot_gate_up<BATON_DT_BF16>(g, u, rb, xn, a.d_model / 8, lane, sg, su);
	else
		dot_gate_up<BATON_DT_F16>(g, u, rb, xn, a.d_model / 8, lane, sg, su);
#pragma unroll
	for (int i = 0; i < GR; i++) {
		const float gi = lane_sum(sg[i]), ui = lane_sum(su[i]);
		if (lane == 0 && rs + i >= r0)
			((float *)a.h)[(uint64_t)p * a.d_ff + rs + i] = silu(gi) * ui;
	}
}

/* One output row o: chunks i of the pairs' rows in turn (pair i / n). */
template <int DT>
__device__ __forceinline__ float down_row(const baton_g16_moe_args &a, const uint8_t *const *blob,
    const float *wp, uint32_t o, uint32_t lane)
{
	const uint32_t n = a.d_ff / 8, total = a.top_k * n;
	const uint64_t roff = a.down_off + o * 2ull * a.d_ff;
	const float *h = (const float *)a.h;
	float s = 0.0f;
	{ /* the first round's weights before the wait, h (gate_up's) after */
		uint4 v[DU];
		uint32_t pp[DU], cc[DU];
#pragma unroll
		for (int u = 0; u < DU; u++) {
			const uint32_t j = lane + 32 * u;
			pp[u] = j / n;
			cc[u] = j - pp[u] * n;
			if (j < total)
				v[u] = ld_w(blob[pp[u]] + roff + 16ull * cc[u]);
		}
		pdl_wait();
#pragma unroll
		for (int u = 0; u < DU; u++)
			if (lane + 32 * u < total)
				s = fmaf(wp[pp[u]],
				    dot8<DT>(v[u], h + (uint64_t)pp[u] * a.d_ff + 8 * cc[u], 0.0f), s);
	}
	uint32_t i = lane + 32 * DU;
	for (; i + 32 * (DU - 1) < total; i += 32 * DU) {
		uint4 v[DU];
		uint32_t pp[DU], cc[DU];
#pragma unroll
		for (int u = 0; u < DU; u++) {
			const uint32_t j = i + 32 * u;
			pp[u] = j / n;
			cc[u] = j - pp[u] * n;
			v[u] = ld_w(blob[pp[u]] + roff + 16ull * cc[u]);
		}
#pragma unroll
		for (int u = 0; u < DU; u++)
			s = fmaf(wp[pp[u]], dot8<DT>(v[u], h + (uint64_t)pp[u] * a.d_ff + 8 * cc[u], 0.0f), s);
	}
	for (; i < total; i += 32) {
		const uint32_t p = i / n, c = i - p * n;
		s = fmaf(wp[p], dot8<DT>(ld_w(blob[p] + roff + 16ull * c), h + (uint64_t)p * a.d_ff + 8 * c, 0.0f), s);
	}
	return s;
}

extern "C" __global__ void __launch_bounds__(32 * WARPS)
baton_g16_down(baton_g16_moe_args a)
{
	__shared__ const uint8_t *blob[MAX_TOP_K];
	__shared__ float wp[MAX_TOP_K];
	const uint32_t o = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
	if (a.top_k > MAX_TOP_K)
		return; /* the launcher never asks */
	if (threadIdx.x < a.top_k) {
		blob[threadIdx.x] =
		    (const uint8_t *)((const uint64_t *)a.table)[((const uint32_t *)a.ids)[threadIdx.x]];
		wp[threadIdx.x] = ((const float *)a.w)[threadIdx.x];
	}
	__syncthreads();
	if (o >= a.d_model)
		return;
	float s = a.down_dtype == BATON_DT_BF16 ? down_row<BATON_DT_BF16>(a, blob, wp, o, lane)
	                                        : down_row<BATON_DT_F16>(a, blob, wp, o, lane);
	s = lane_sum(s);
	if (lane == 0)
		((float *)a.x)[o] += s;
}
