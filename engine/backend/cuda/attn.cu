/*
 * attn.cu: prefill attention as two tensor-core GEMMs (tc_launch.c runs
 * them with cuBLAS; argument blocks in tc.h). Around them: the keys and
 * values of one sequence out of the (paged) f32 cache into bf16 rows per
 * KV head, the queries grouped by KV head, the causal softmax of the
 * scores, and the output back in the slot's layout. Every key of a query
 * is in one GEMM, so nothing is serial over keys.
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "engine/backend/cuda/tc.h"

static_assert(sizeof(baton_tc_attn_kv_args) == 64, "attn kv args layout");
static_assert(sizeof(baton_tc_attn_qo_args) == 32, "attn q/o args layout");
static_assert(sizeof(baton_tc_attn_softmax_args) == 40, "attn softmax args layout");

__device__ __forceinline__ unsigned short bf_u(float a)
{
	return __bfloat16_as_ushort(__float2bfloat16_rn(a));
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_attn_kv(const baton_tc_attn_kv_args a)
{
	const uint64_t n = (uint64_t)a.kv_heads * a.n_pad * a.head_dim;
	const uint32_t *blocks = (const uint32_t *)a.blocks;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t d = (uint32_t)(i % a.head_dim);
		const uint32_t c = (uint32_t)((i / a.head_dim) % a.n_pad);
		const uint32_t g = (uint32_t)(i / ((uint64_t)a.head_dim * a.n_pad));
		float kv = 0.0f, vv = 0.0f;
		if (c < a.n_ctx) {
			const uint64_t row = blocks ?
			    (uint64_t)blocks[c / a.block_size] * a.block_size + c % a.block_size : c;
			const uint64_t at = (row * a.kv_heads + g) * a.head_dim + d;
			kv = ((const float *)a.k)[at];
			vv = ((const float *)a.v)[at];
		}
		((unsigned short *)a.kb)[i] = bf_u(kv);
		((unsigned short *)a.vb)[i] = bf_u(vv);
	}
}

/* (g, t, j, d) of the grouped layout <-> (t, h = g * G + j, d) of the slot's */
__device__ __forceinline__ uint64_t slot_index(uint64_t i, const baton_tc_attn_qo_args &a)
{
	const uint32_t G = a.heads / a.kv_heads;
	const uint32_t d = (uint32_t)(i % a.head_dim);
	const uint32_t j = (uint32_t)((i / a.head_dim) % G);
	const uint32_t t = (uint32_t)((i / ((uint64_t)a.head_dim * G)) % a.nq);
	const uint32_t g = (uint32_t)(i / ((uint64_t)a.head_dim * G * a.nq));
	return ((uint64_t)t * a.heads + (uint64_t)g * G + j) * a.head_dim + d;
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_attn_q(const baton_tc_attn_qo_args a)
{
	const uint64_t n = (uint64_t)a.nq * a.heads * a.head_dim;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		((unsigned short *)a.dst)[i] = bf_u(((const float *)a.src)[slot_index(i, a)]);
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_attn_out(const baton_tc_attn_qo_args a)
{
	const uint64_t n = (uint64_t)a.nq * a.heads * a.head_dim;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		((float *)a.dst)[slot_index(i, a)] = ((const float *)a.src)[i];
}

__device__ __forceinline__ float block_reduce(float v, bool is_max, float *sh)
{
	const uint32_t lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) {
		const float o = __shfl_xor_sync(0xffffffffu, v, off);
		v = is_max ? fmaxf(v, o) : v + o;
	}
	__syncthreads(); /* sh may still be read from the last call */
	if (lane == 0)
		sh[w] = v;
	__syncthreads();
	v = sh[0];
	for (uint32_t i = 1; i < blockDim.x / 32; i++)
		v = is_max ? fmaxf(v, sh[i]) : v + sh[i];
	return v;
}

/* One row of n keys (of n_pad) held in registers, NPT a thread: one read
 * of s where the loop below reads it three times. The same sums in the
 * same order (a thread's keys c, c + blockDim.x, ..., then the block's
 * tree; the masked keys add 0), so the same bits. */
template <int NPT>
__device__ __forceinline__ void softmax_row(const float *s, unsigned short *p, uint32_t n,
    uint32_t n_pad, float *sh)
{
	float v[NPT];
	float m = -INFINITY;
#pragma unroll
	for (int i = 0; i < NPT; i++) {
		const uint32_t c = threadIdx.x + i * BATON_TC_THREADS;
		v[i] = c < n ? s[c] : -INFINITY;
		m = fmaxf(m, v[i]);
	}
	m = block_reduce(m, true, sh);
	float sum = 0.0f;
#pragma unroll
	for (int i = 0; i < NPT; i++) {
		const uint32_t c = threadIdx.x + i * BATON_TC_THREADS;
		v[i] = c < n ? expf(v[i] - m) : 0.0f;
		sum += v[i];
	}
	sum = block_reduce(sum, false, sh);
	const float inv = 1.0f / sum;
#pragma unroll
	for (int i = 0; i < NPT; i++) {
		const uint32_t c = threadIdx.x + i * BATON_TC_THREADS;
		if (c < n_pad)
			p[c] = c < n ? bf_u(v[i] * inv) : (unsigned short)0;
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_attn_softmax(const baton_tc_attn_softmax_args a)
{
	__shared__ float sh[BATON_TC_THREADS / 32];
	for (uint32_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
		const float *s = (const float *)a.s + (uint64_t)r * a.n_pad;
		unsigned short *p = (unsigned short *)a.p + (uint64_t)r * a.n_pad;
		const uint32_t t = (r % a.nq_g) / a.g, n = a.pos_q0 + t + 1; /* keys 0 .. n - 1 */
		if (a.n_pad <= 4 * BATON_TC_THREADS) {
			softmax_row<4>(s, p, n, a.n_pad, sh);
			continue;
		}
		if (a.n_pad <= 8 * BATON_TC_THREADS) {
			softmax_row<8>(s, p, n, a.n_pad, sh);
			continue;
		}
		if (a.n_pad <= 16 * BATON_TC_THREADS) {
			softmax_row<16>(s, p, n, a.n_pad, sh);
			continue;
		}
		if (a.n_pad <= 32 * BATON_TC_THREADS) {
			softmax_row<32>(s, p, n, a.n_pad, sh);
			continue;
		}
		float m = -INFINITY;
		for (uint32_t c = threadIdx.x; c < n; c += blockDim.x)
			m = fmaxf(m, s[c]);
		m = block_reduce(m, true, sh);
		float sum = 0.0f;
		for (uint32_t c = threadIdx.x; c < n; c += blockDim.x)
			sum += expf(s[c] - m);
		sum = block_reduce(sum, false, sh);
		const float inv = 1.0f / sum;
		for (uint32_t c = threadIdx.x; c < a.n_pad; c += blockDim.x)
			p[c] = c < n ? bf_u(expf(s[c] - m) * inv) : (unsigned short)0;
	}
}
