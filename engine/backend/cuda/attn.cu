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

/* Eight consecutive floats (16-byte aligned) to eight bf16 in one store. */
__device__ __forceinline__ void load8(const float *p, float v[8])
{
	const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
	v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void store8_bf(unsigned short *dst, const float v[8])
{
	uint4 o;
	o.x = bf_u(v[0]) | (uint32_t)bf_u(v[1]) << 16;
	o.y = bf_u(v[2]) | (uint32_t)bf_u(v[3]) << 16;
	o.z = bf_u(v[4]) | (uint32_t)bf_u(v[5]) << 16;
	o.w = bf_u(v[6]) | (uint32_t)bf_u(v[7]) << 16;
	*(uint4 *)dst = o;
}

/* Every kernel below moves 8 consecutive elements of a head's row a
 * thread (head_dim % 8 == 0: tc_launch.c checks), 16-byte loads and
 * stores where the cache rows allow (vec: both at 16 bytes). */
extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_attn_kv(const baton_tc_attn_kv_args a)
{
	const uint32_t hd8 = a.head_dim / 8;
	const uint64_t n = (uint64_t)a.kv_heads * a.n_pad * hd8;
	const uint32_t *blocks = (const uint32_t *)a.blocks;
	const bool vec = ((a.k | a.v) & 15) == 0;
	for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
	     u += (uint64_t)gridDim.x * blockDim.x) {
		const uint32_t d = (uint32_t)(u % hd8) * 8;
		const uint64_t gc = u / hd8;
		const uint32_t c = (uint32_t)(gc % a.n_pad), g = (uint32_t)(gc / a.n_pad);
		float kv[8] = { 0, 0, 0, 0, 0, 0, 0, 0 }, vv[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
		if (c < a.n_ctx) {
			const uint64_t row = blocks ?
			    (uint64_t)blocks[c / a.block_size] * a.block_size + c % a.block_size : c;
			const uint64_t at = (row * a.kv_heads + g) * a.head_dim + d;
			if (vec) {
				load8((const float *)a.k + at, kv);
				load8((const float *)a.v + at, vv);
			} else {
				for (int i = 0; i < 8; i++) {
					kv[i] = ((const float *)a.k)[at + i];
					vv[i] = ((const float *)a.v)[at + i];
				}
			}
		}
		store8_bf((unsigned short *)a.kb + u * 8, kv);
		store8_bf((unsigned short *)a.vb + u * 8, vv);
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
	const uint64_t n = (uint64_t)a.nq * a.heads * a.head_dim / 8;
	for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
	     u += (uint64_t)gridDim.x * blockDim.x) {
		float v[8];
		load8((const float *)a.src + slot_index(u * 8, a), v);
		store8_bf((unsigned short *)a.dst + u * 8, v);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_attn_out(const baton_tc_attn_qo_args a)
{
	const uint64_t n = (uint64_t)a.nq * a.heads * a.head_dim / 8;
	for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
	     u += (uint64_t)gridDim.x * blockDim.x) {
		const float4 *s = (const float4 *)((const float *)a.src + u * 8);
		float4 *d = (float4 *)((float *)a.dst + slot_index(u * 8, a));
		d[0] = s[0];
		d[1] = s[1];
	}
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
