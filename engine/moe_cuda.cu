/*
 * moe_cuda.cu: the MoE kernels of the cuda backend (backend_cuda.c loads
 * them from the embedded fatbin and launches them with cuLaunchKernel).
 *
 * Shape: decode batches are small, so every matrix product is a GEMV that
 * reads each weight row once: one warp per output row, lanes reading
 * consecutive 16-byte pieces of the row (coalesced), and each warp carrying
 * up to BATON_CUDA_NT tokens through the row, so tokens that picked the
 * same expert share one read of its weights (backend_cuda.c groups the
 * (token, k) pairs by expert blob into chunks).
 *
 * Deterministic: every sum has a fixed order (per-lane running sums, a
 * fixed butterfly across the warp, a fixed order over warps and over k);
 * no atomics. The same inputs give the same bits on every run.
 *
 * Semantics match engine/backend.h and the host backend: rmsnorm with eps
 * 1e-6, f32 accumulation, h = silu(gate.xn) * (up.xn), x += w * down.h.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend_cuda.h"

static_assert(sizeof(baton_cuda_norm_args) == 40, "norm args layout");
static_assert(sizeof(baton_cuda_gemv_args) == 56, "gemv args layout");
static_assert(sizeof(baton_cuda_chunk) == 16, "chunk layout");
static_assert(sizeof(baton_cuda_ffn_args) == 104, "ffn args layout");
static_assert(sizeof(baton_cuda_reduce_args) == 32, "reduce args layout");

#define WARPS BATON_CUDA_WARPS
#define NT BATON_CUDA_NT
#define THREADS (WARPS * 32)

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

/* Element i of a row in dtype dt. */
__device__ __forceinline__ float elem(const uint8_t *row, uint32_t dt, uint32_t i)
{
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

/* acc[t] += sum of w[0..3] * x[0..3] in order. */
__device__ __forceinline__ float fma4(float a, const float w[4], float4 x)
{
	a = fmaf(w[0], x.x, a);
	a = fmaf(w[1], x.y, a);
	a = fmaf(w[2], x.z, a);
	return fmaf(w[3], x.w, a);
}

/* Eight weights of a f16 or bf16 row from one 16-byte load. */
template <int DT>
__device__ __forceinline__ void unpack8(uint4 raw, float w[8])
{
	const uint32_t v[4] = { raw.x, raw.y, raw.z, raw.w };
#pragma unroll
	for (int i = 0; i < 4; i++) {
		if (DT == BATON_DT_F16) {
			w[2 * i] = f16f(v[i] & 0xffffu);
			w[2 * i + 1] = f16f(v[i] >> 16);
		} else {
			w[2 * i] = __uint_as_float(v[i] << 16);
			w[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
		}
	}
}

/* Vector path: rows 16-byte aligned (f32, f16, bf16; cols a multiple of 4
 * or 8) or 2-byte aligned (q8_0); x rows 16-byte aligned. Each lane keeps
 * one running sum per token. */
template <int DT, int N>
__device__ __forceinline__ void dot_vec(const uint8_t *__restrict__ row, uint32_t cols,
    const float *const xp[N], int nt, float acc[N])
{
	const uint32_t lane = threadIdx.x & 31;
	if (DT == BATON_DT_F32) {
		const float4 *w4 = (const float4 *)row;
#pragma unroll 4
		for (uint32_t c = lane; c < cols / 4; c += 32) {
			float4 wv = __ldg(w4 + c);
			const float w[4] = { wv.x, wv.y, wv.z, wv.w };
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt)
					acc[t] = fma4(acc[t], w, __ldg((const float4 *)xp[t] + c));
		}
	} else if (DT == BATON_DT_F16 || DT == BATON_DT_BF16) {
		const uint4 *w8 = (const uint4 *)row;
#pragma unroll 4
		for (uint32_t c = lane; c < cols / 8; c += 32) {
			float w[8];
			unpack8<DT>(__ldg(w8 + c), w);
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt) {
					const float4 *x4 = (const float4 *)xp[t] + 2 * c;
					acc[t] = fma4(acc[t], w, __ldg(x4));
					acc[t] = fma4(acc[t], w + 4, __ldg(x4 + 1));
				}
		}
	} else { /* q8_0: four lanes per 32-value block, eight values each */
		const uint32_t nb = cols / 32, q = lane & 3;
#pragma unroll 4
		for (uint32_t b = lane >> 2; b < nb; b += 8) {
			const uint8_t *blk = row + (uint64_t)b * 34;
			const float d = f16f(__ldg((const unsigned short *)blk));
			const unsigned short *qs = (const unsigned short *)(blk + 2 + 8 * q);
			uint32_t r[4];
#pragma unroll
			for (int i = 0; i < 4; i++)
				r[i] = __ldg(qs + i);
			float w[8];
#pragma unroll
			for (int i = 0; i < 4; i++) {
				w[2 * i] = (float)(int8_t)(r[i] & 0xff);
				w[2 * i + 1] = (float)(int8_t)(r[i] >> 8);
			}
			const uint32_t c = b * 32 + q * 8;
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt) {
					const float4 *x4 = (const float4 *)(xp[t] + c);
					float s = fma4(0.0f, w, __ldg(x4));
					s = fma4(s, w + 4, __ldg(x4 + 1));
					acc[t] = fmaf(d, s, acc[t]);
				}
		}
	}
}

/* Scalar path: any alignment and any cols. */
template <int N>
__device__ __forceinline__ void dot_scalar(const uint8_t *row, uint32_t dt, uint32_t cols,
    const float *const xp[N], int nt, float acc[N])
{
	for (uint32_t c = threadIdx.x & 31; c < cols; c += 32) {
		const float w = elem(row, dt, c);
#pragma unroll
		for (int t = 0; t < N; t++)
			if (t < nt)
				acc[t] = fmaf(w, xp[t][c], acc[t]);
	}
}

/* acc[t] = row . xp[t] for t < nt, the same value in every lane. */
template <int N>
__device__ __forceinline__ void dot_row(const uint8_t *row, uint32_t dt, uint32_t cols,
    bool vec, const float *const xp[N], int nt, float acc[N])
{
#pragma unroll
	for (int t = 0; t < N; t++)
		acc[t] = 0.0f;
	if (!vec)
		dot_scalar<N>(row, dt, cols, xp, nt, acc);
	else if (dt == BATON_DT_F32)
		dot_vec<BATON_DT_F32, N>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_F16)
		dot_vec<BATON_DT_F16, N>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_BF16)
		dot_vec<BATON_DT_BF16, N>(row, cols, xp, nt, acc);
	else
		dot_vec<BATON_DT_Q8_0, N>(row, cols, xp, nt, acc);
#pragma unroll
	for (int t = 0; t < N; t++)
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
}

__device__ __forceinline__ float silu(float g)
{
	return g / (1.0f + expf(-g));
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_moe_rmsnorm(baton_cuda_norm_args a)
{
	__shared__ float part[WARPS];
	__shared__ float inv_s;
	const float *x = (const float *)a.x + (uint64_t)blockIdx.x * a.d_model;
	float *xn = (float *)a.xn + (uint64_t)blockIdx.x * a.d_model;
	const uint8_t *norm = (const uint8_t *)a.norm;
	float s = 0.0f;
	for (uint32_t i = threadIdx.x; i < a.d_model; i += THREADS)
		s = fmaf(x[i], x[i], s);
	for (int off = 16; off > 0; off >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, off);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = s;
	__syncthreads();
	if (threadIdx.x == 0) {
		float tot = 0.0f;
		for (int w = 0; w < WARPS; w++)
			tot += part[w];
		inv_s = 1.0f / sqrtf(tot / (float)a.d_model + 1e-6f);
	}
	__syncthreads();
	const float inv = inv_s;
	for (uint32_t i = threadIdx.x; i < a.d_model; i += THREADS)
		xn[i] = x[i] * inv * (norm ? elem(norm, a.norm_dtype, i) : 1.0f);
}

/* The row kernels, for N = 1, 2, 4, 8 tokens per warp at most (the
 * launcher picks the smallest N that holds its largest chunk: batch 1 runs
 * the N = 1 kernels, with fewer registers and no per-token branches). */
template <int N>
__device__ __forceinline__ void gemv(const baton_cuda_gemv_args &a)
{
	const uint32_t r = blockIdx.y * WARPS + (threadIdx.x >> 5);
	if (r >= a.rows)
		return; /* the whole warp */
	const uint32_t t0 = blockIdx.x * N;
	const int nt = (int)min((uint32_t)N, a.batch - t0);
	const float *xp[N];
#pragma unroll
	for (int i = 0; i < N; i++)
		xp[i] = (const float *)a.x + (uint64_t)(t0 + (i < nt ? i : 0)) * a.ldx;
	const uint8_t *row = (const uint8_t *)a.w + (uint64_t)r * row_bytes(a.dtype, a.cols);
	float acc[N];
	dot_row<N>(row, a.dtype, a.cols, a.vec != 0, xp, nt, acc);
	if ((threadIdx.x & 31) == 0) {
#pragma unroll
		for (int i = 0; i < N; i++)
			if (i < nt)
				((float *)a.y)[(uint64_t)(t0 + i) * a.ldy + r] = acc[i];
	}
}

template <int N>
__device__ __forceinline__ void gate_up(const baton_cuda_ffn_args &a)
{
	const uint32_t r = blockIdx.y * WARPS + (threadIdx.x >> 5);
	if (r >= a.d_ff)
		return;
	const baton_cuda_chunk ch = ((const baton_cuda_chunk *)a.chunks)[blockIdx.x];
	const uint32_t *pairs = (const uint32_t *)a.pairs + ch.first;
	const int nt = (int)min((uint32_t)N, ch.n);
	uint32_t p[N];
	const float *xp[N];
#pragma unroll
	for (int i = 0; i < N; i++) {
		p[i] = pairs[i < nt ? i : 0];
		xp[i] = (const float *)a.xn + (uint64_t)(p[i] / a.top_k) * a.d_model;
	}
	const uint8_t *blob = (const uint8_t *)ch.blob;
	const uint8_t *gate = blob + a.gate_off + (uint64_t)r * row_bytes(a.gate_dtype, a.d_model);
	const uint8_t *up = blob + a.up_off + (uint64_t)r * row_bytes(a.up_dtype, a.d_model);
	float g[N], u[N];
	dot_row<N>(gate, a.gate_dtype, a.d_model, (a.vec & 1) != 0, xp, nt, g);
	dot_row<N>(up, a.up_dtype, a.d_model, (a.vec & 2) != 0, xp, nt, u);
	if ((threadIdx.x & 31) == 0) {
		float *h = (float *)a.h;
#pragma unroll
		for (int i = 0; i < N; i++)
			if (i < nt)
				h[(uint64_t)p[i] * a.d_ff + r] = silu(g[i]) * u[i];
	}
}

template <int N>
__device__ __forceinline__ void down(const baton_cuda_ffn_args &a)
{
	const uint32_t r = blockIdx.y * WARPS + (threadIdx.x >> 5);
	if (r >= a.d_model)
		return;
	const baton_cuda_chunk ch = ((const baton_cuda_chunk *)a.chunks)[blockIdx.x];
	const uint32_t *pairs = (const uint32_t *)a.pairs + ch.first;
	const int nt = (int)min((uint32_t)N, ch.n);
	uint32_t p[N];
	const float *xp[N];
#pragma unroll
	for (int i = 0; i < N; i++) {
		p[i] = pairs[i < nt ? i : 0];
		xp[i] = (const float *)a.h + (uint64_t)p[i] * a.d_ff;
	}
	const uint8_t *row = (const uint8_t *)ch.blob + a.down_off +
	    (uint64_t)r * row_bytes(a.down_dtype, a.d_ff);
	float acc[N];
	dot_row<N>(row, a.down_dtype, a.d_ff, (a.vec & 4) != 0, xp, nt, acc);
	if ((threadIdx.x & 31) == 0) {
		const float *w = (const float *)a.w;
		float *part = (float *)a.part;
#pragma unroll
		for (int i = 0; i < N; i++)
			if (i < nt)
				part[(uint64_t)p[i] * a.d_model + r] = w[p[i]] * acc[i];
	}
}

#define BATON_ROW_KERNELS(N)                                                   \
	extern "C" __global__ void __launch_bounds__(THREADS)                  \
	baton_moe_gemv_##N(baton_cuda_gemv_args a) { gemv<N>(a); }             \
	extern "C" __global__ void __launch_bounds__(THREADS)                  \
	baton_moe_gate_up_##N(baton_cuda_ffn_args a) { gate_up<N>(a); }        \
	extern "C" __global__ void __launch_bounds__(THREADS)                  \
	baton_moe_down_##N(baton_cuda_ffn_args a) { down<N>(a); }
BATON_ROW_KERNELS(1)
BATON_ROW_KERNELS(2)
BATON_ROW_KERNELS(4)
BATON_ROW_KERNELS(8)

extern "C" __global__ void __launch_bounds__(256)
baton_moe_reduce(baton_cuda_reduce_args a)
{
	const uint64_t idx = (uint64_t)blockIdx.x * 256 + threadIdx.x;
	if (idx >= (uint64_t)a.batch * a.d_model)
		return;
	const uint64_t t = idx / a.d_model, j = idx % a.d_model;
	const float *part = (const float *)a.part + t * a.top_k * a.d_model + j;
	float s = ((const float *)a.x)[idx];
	for (uint32_t k = 0; k < a.top_k; k++)
		s += part[(uint64_t)k * a.d_model];
	((float *)a.x)[idx] = s;
}
