/*
 * moe.cu: the MoE kernels of the cuda backend (backend.c loads
 * them from the embedded fatbin and launches them with cuLaunchKernel).
 *
 * Shape: decode batches are small, so every matrix product is a GEMV that
 * reads each weight row once: one warp per output row, lanes reading
 * consecutive 16-byte pieces of the row (coalesced), and each warp carrying
 * up to BATON_CUDA_NT tokens through the row, so tokens that picked the
 * same expert share one read of its weights (backend.c groups the
 * (token, k) pairs by expert blob into chunks).
 *
 * Deterministic: every sum has a fixed order (per-lane running sums, a
 * fixed butterfly across the warp, a fixed order over warps and over k);
 * no atomics. The same inputs give the same bits on every run.
 *
 * Semantics match engine/backend/backend.h and the host backend: rmsnorm with eps
 * 1e-6, f32 accumulation, h = silu(gate.xn) * (up.xn), x += w * down.h.
 */
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/moe.h"
#include "engine/backend/cuda/dtype.cuh"

static_assert(sizeof(baton_cuda_norm_args) == 40, "norm args layout");
static_assert(sizeof(baton_cuda_gemv_args) == 56, "gemv args layout");
static_assert(sizeof(baton_cuda_chunk) == 16, "chunk layout");
static_assert(sizeof(baton_cuda_ffn_args) == 104, "ffn args layout");
static_assert(sizeof(baton_cuda_reduce_args) == 32, "reduce args layout");
static_assert(sizeof(baton_cuda_chunks_args) == 40, "chunks args layout");

#define WARPS BATON_CUDA_WARPS
#define NT BATON_CUDA_NT
#define THREADS (WARPS * 32)

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
 * or 8), 8-byte aligned (q4_K, q5_K) or 2-byte aligned (q8_0, q6_K); x rows
 * 16-byte aligned. A warp walks R
 * rows at once, so each load of x serves R rows (x is f32: per weight byte
 * it is 2 to 4 times the traffic, and with several tokens the L1 becomes
 * the limit before HBM does). Each lane keeps one running sum per (row,
 * token); its order does not depend on R or N. */
template <int DT, int N, int R>
__device__ __forceinline__ void dot_vec(const uint8_t *const row[R], uint32_t cols,
    const float *const xp[N], int nt, float acc[R][N])
{
	const uint32_t lane = threadIdx.x & 31;
	if (DT == BATON_DT_F32) {
#pragma unroll 2
		for (uint32_t c = lane; c < cols / 4; c += 32) {
			float w[R][4];
#pragma unroll
			for (int r = 0; r < R; r++) {
				const float4 wv = __ldg((const float4 *)row[r] + c);
				w[r][0] = wv.x, w[r][1] = wv.y, w[r][2] = wv.z, w[r][3] = wv.w;
			}
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt) {
					const float4 x = __ldg((const float4 *)xp[t] + c);
#pragma unroll
					for (int r = 0; r < R; r++)
						acc[r][t] = fma4(acc[r][t], w[r], x);
				}
		}
	} else if (DT == BATON_DT_F16 || DT == BATON_DT_BF16) {
#pragma unroll 2
		for (uint32_t c = lane; c < cols / 8; c += 32) {
			float w[R][8];
#pragma unroll
			for (int r = 0; r < R; r++)
				unpack8<DT>(__ldg((const uint4 *)row[r] + c), w[r]);
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt) {
					const float4 *x4 = (const float4 *)xp[t] + 2 * c;
					const float4 x0 = __ldg(x4), x1 = __ldg(x4 + 1);
#pragma unroll
					for (int r = 0; r < R; r++) {
						acc[r][t] = fma4(acc[r][t], w[r], x0);
						acc[r][t] = fma4(acc[r][t], w[r] + 4, x1);
					}
				}
		}
	} else if (DT == BATON_DT_Q4_K || DT == BATON_DT_Q5_K || DT == BATON_DT_Q6_K) {
		/* One 256-value block per step, eight values a lane. */
		const uint32_t nb = cols / 256;
		const uint64_t bb = DT == BATON_DT_Q4_K ? 144 : DT == BATON_DT_Q5_K ? 176 : 210;
#pragma unroll 2
		for (uint32_t b = 0; b < nb; b++) {
			float w[R][8];
#pragma unroll
			for (int r = 0; r < R; r++)
				kq_w8<DT>(row[r] + b * bb, lane, w[r]);
			const uint32_t c = b * 256 + 8 * lane;
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt) {
					const float4 *x4 = (const float4 *)(xp[t] + c);
					const float4 x0 = __ldg(x4), x1 = __ldg(x4 + 1);
#pragma unroll
					for (int r = 0; r < R; r++) {
						acc[r][t] = fma4(acc[r][t], w[r], x0);
						acc[r][t] = fma4(acc[r][t], w[r] + 4, x1);
					}
				}
		}
	} else { /* q8_0: four lanes per 32-value block, eight values each */
		const uint32_t nb = cols / 32, q = lane & 3;
#pragma unroll 2
		for (uint32_t b = lane >> 2; b < nb; b += 8) {
			float d[R], w[R][8];
#pragma unroll
			for (int r = 0; r < R; r++) {
				const uint8_t *blk = row[r] + (uint64_t)b * 34;
				d[r] = f16f(__ldg((const unsigned short *)blk));
				const unsigned short *qs = (const unsigned short *)(blk + 2 + 8 * q);
#pragma unroll
				for (int i = 0; i < 4; i++) {
					const uint32_t v = __ldg(qs + i);
					w[r][2 * i] = (float)(int8_t)(v & 0xff);
					w[r][2 * i + 1] = (float)(int8_t)(v >> 8);
				}
			}
			const uint32_t c = b * 32 + q * 8;
#pragma unroll
			for (int t = 0; t < N; t++)
				if (t < nt) {
					const float4 *x4 = (const float4 *)(xp[t] + c);
					const float4 x0 = __ldg(x4), x1 = __ldg(x4 + 1);
#pragma unroll
					for (int r = 0; r < R; r++) {
						float s = fma4(0.0f, w[r], x0);
						s = fma4(s, w[r] + 4, x1);
						acc[r][t] = fmaf(d[r], s, acc[r][t]);
					}
				}
		}
	}
}

/* Scalar path: any alignment and any cols; DT >= 0 is dt known at
 * compile time (arena/quant.c's block types at batch 1: their decoder
 * without the dispatch). */
template <int N, int R, int DT = -1>
__device__ __forceinline__ void dot_scalar(const uint8_t *const row[R], uint32_t dt,
    uint32_t cols, const float *const xp[N], int nt, float acc[R][N])
{
#pragma unroll 2
	for (uint32_t c = threadIdx.x & 31; c < cols; c += 32) {
		float w[R];
#pragma unroll
		for (int r = 0; r < R; r++)
			w[r] = elem(row[r], DT < 0 ? dt : (uint32_t)DT, c);
#pragma unroll
		for (int t = 0; t < N; t++)
			if (t < nt) {
				const float x = xp[t][c];
#pragma unroll
				for (int r = 0; r < R; r++)
					acc[r][t] = fmaf(w[r], x, acc[r][t]);
			}
	}
}

/* acc[r][t] = row[r] . xp[t] for t < nt, the same value in every lane. */
template <int N, int R>
__device__ __forceinline__ void dot_rows(const uint8_t *const row[R], uint32_t dt,
    uint32_t cols, bool vec, const float *const xp[N], int nt, float acc[R][N])
{
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < N; t++)
			acc[r][t] = 0.0f;
	if (!vec) {
		/* batch 1's kernels (N 1, decode) with the type known at compile
		 * time; the others dispatch per element (fewer kernels to build) */
		switch (N == 1 ? dt : ~0u) {
		case BATON_DT_Q4_0: dot_scalar<N, R, BATON_DT_Q4_0>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_Q4_1: dot_scalar<N, R, BATON_DT_Q4_1>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_Q5_0: dot_scalar<N, R, BATON_DT_Q5_0>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_Q5_1: dot_scalar<N, R, BATON_DT_Q5_1>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_IQ4_NL: dot_scalar<N, R, BATON_DT_IQ4_NL>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_MXFP4: dot_scalar<N, R, BATON_DT_MXFP4>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_Q2_K: dot_scalar<N, R, BATON_DT_Q2_K>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_Q3_K: dot_scalar<N, R, BATON_DT_Q3_K>(row, dt, cols, xp, nt, acc); break;
		case BATON_DT_IQ4_XS: dot_scalar<N, R, BATON_DT_IQ4_XS>(row, dt, cols, xp, nt, acc); break;
		default: dot_scalar<N, R>(row, dt, cols, xp, nt, acc); break;
		}
	}
	else if (dt == BATON_DT_F32)
		dot_vec<BATON_DT_F32, N, R>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_F16)
		dot_vec<BATON_DT_F16, N, R>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_BF16)
		dot_vec<BATON_DT_BF16, N, R>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_Q4_K)
		dot_vec<BATON_DT_Q4_K, N, R>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_Q5_K)
		dot_vec<BATON_DT_Q5_K, N, R>(row, cols, xp, nt, acc);
	else if (dt == BATON_DT_Q6_K)
		dot_vec<BATON_DT_Q6_K, N, R>(row, cols, xp, nt, acc);
	else
		dot_vec<BATON_DT_Q8_0, N, R>(row, cols, xp, nt, acc);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < N; t++)
#pragma unroll
			for (int off = 16; off > 0; off >>= 1)
				acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], off);
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
 * the N = 1 kernels, with fewer registers and no per-token branches), each
 * warp taking BATON_CUDA_ROWS(N) rows (gate_up: BATON_CUDA_GATE_ROWS(N) rows
 * of gate and as many of up, walked together when their dtypes agree). */
#define ROWS(N) BATON_CUDA_ROWS(N)

template <int N>
__device__ __forceinline__ void gemv(const baton_cuda_gemv_args &a)
{
	const uint32_t r0 = (blockIdx.y * WARPS + (threadIdx.x >> 5)) * ROWS(N);
	if (r0 >= a.rows)
		return; /* the whole warp */
	const uint32_t t0 = blockIdx.x * N;
	const int nt = (int)min((uint32_t)N, a.batch - t0);
	const float *xp[N];
#pragma unroll
	for (int i = 0; i < N; i++)
		xp[i] = (const float *)a.x + (uint64_t)(t0 + (i < nt ? i : 0)) * a.ldx;
	const uint64_t rb = row_bytes(a.dtype, a.cols);
	const uint8_t *row[ROWS(N)];
#pragma unroll
	for (int r = 0; r < ROWS(N); r++)
		row[r] = (const uint8_t *)a.w + (uint64_t)(r0 + r < a.rows ? r0 + r : r0) * rb;
	float acc[ROWS(N)][N];
	dot_rows<N, ROWS(N)>(row, a.dtype, a.cols, a.vec != 0, xp, nt, acc);
	if ((threadIdx.x & 31) == 0) {
#pragma unroll
		for (int r = 0; r < ROWS(N); r++)
#pragma unroll
			for (int i = 0; i < N; i++)
				if (i < nt && r0 + r < a.rows)
					((float *)a.y)[(uint64_t)(t0 + i) * a.ldy + r0 + r] = acc[r][i];
	}
}

template <int N>
__device__ __forceinline__ void gate_up(const baton_cuda_ffn_args &a)
{
	constexpr int R = BATON_CUDA_GATE_ROWS(N);
	const uint32_t r0 = (blockIdx.y * WARPS + (threadIdx.x >> 5)) * R;
	if (r0 >= a.d_ff)
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
	const uint64_t gb = row_bytes(a.gate_dtype, a.d_model), ub = row_bytes(a.up_dtype, a.d_model);
	const uint8_t *row[2 * R]; /* gate rows, then up rows */
#pragma unroll
	for (int r = 0; r < R; r++) {
		const uint64_t rr = r0 + r < a.d_ff ? r0 + r : r0;
		row[r] = blob + a.gate_off + rr * gb;
		row[R + r] = blob + a.up_off + rr * ub;
	}
	float acc[2 * R][N];
	const bool vg = (a.vec & 1) != 0, vu = (a.vec & 2) != 0;
	if (a.gate_dtype == a.up_dtype && vg == vu) {
		dot_rows<N, 2 * R>(row, a.gate_dtype, a.d_model, vg, xp, nt, acc);
	} else {
		dot_rows<N, R>(row, a.gate_dtype, a.d_model, vg, xp, nt, acc);
		dot_rows<N, R>(row + R, a.up_dtype, a.d_model, vu, xp, nt, acc + R);
	}
	if ((threadIdx.x & 31) == 0) {
		float *h = (float *)a.h;
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int i = 0; i < N; i++)
				if (i < nt && r0 + r < a.d_ff)
					h[(uint64_t)p[i] * a.d_ff + r0 + r] = silu(acc[r][i]) * acc[R + r][i];
	}
}

template <int N>
__device__ __forceinline__ void down(const baton_cuda_ffn_args &a)
{
	constexpr int R = ROWS(N);
	const uint32_t r0 = (blockIdx.y * WARPS + (threadIdx.x >> 5)) * R;
	if (r0 >= a.d_model)
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
	const uint64_t db = row_bytes(a.down_dtype, a.d_ff);
	const uint8_t *row[R];
#pragma unroll
	for (int r = 0; r < R; r++)
		row[r] = (const uint8_t *)ch.blob + a.down_off +
		    (uint64_t)(r0 + r < a.d_model ? r0 + r : r0) * db;
	float acc[R][N];
	dot_rows<N, R>(row, a.down_dtype, a.d_ff, (a.vec & 4) != 0, xp, nt, acc);
	if ((threadIdx.x & 31) == 0) {
		const float *w = (const float *)a.w;
		float *part = (float *)a.part;
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int i = 0; i < N; i++)
				if (i < nt && r0 + r < a.d_model)
					part[(uint64_t)p[i] * a.d_model + r0 + r] = w[p[i]] * acc[r][i];
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

extern "C" __global__ void __launch_bounds__(256)
baton_moe_chunks(baton_cuda_chunks_args a)
{
	const uint32_t p = blockIdx.x * 256 + threadIdx.x;
	if (p >= a.n)
		return;
	const uint32_t id = ((const uint32_t *)a.ids)[p];
	baton_cuda_chunk c;
	c.blob = ((const uint64_t *)a.table)[id];
	c.first = p;
	c.n = 1;
	((baton_cuda_chunk *)a.chunks)[p] = c;
	((uint32_t *)a.pairs)[p] = p;
}
