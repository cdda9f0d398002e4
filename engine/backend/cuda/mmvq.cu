/*
 * mmvq.cu: matmul and the MoE experts at batch 1 on quantized weights
 * (q4_K, q6_K) against an activation quantized to int8 (mmvq.h): the
 * weights' integer quants meet the activation's in dp4a, four products
 * and their sum per instruction, so a row costs its bytes and little
 * arithmetic. Each 256-weight block is taken by 16 threads (SUB), a row
 * by tpr threads (32, 64 or 128: enough that a row's blocks are all in
 * flight at once), a block of 128 threads by 128 / tpr rows. Sums are in
 * a fixed order (each thread's blocks in turn, then the lane tree, then
 * the warps of a row in order): the same bits run to run.
 */
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/mmvq.h"

static_assert(sizeof(baton_mmvq_quant_args) == 32, "quant args layout");
static_assert(sizeof(baton_mmvq_args) == 72, "mmvq args layout");
static_assert(sizeof(baton_mmvq_moe_args) == 112, "mmvq moe args layout");
static_assert(sizeof(baton_mmvq_n_args) == 168, "mmvq matmuls args layout");

#define THREADS BATON_MMVQ_THREADS
#define SUB BATON_MMVQ_SUB

extern "C" __global__ void __launch_bounds__(256)
baton_mmvq_quant(baton_mmvq_quant_args a)
{
	const uint32_t i = blockIdx.x * 256 + threadIdx.x;
	if (i >= a.n)
		return; /* n % 32 == 0: whole warps */
	const float v = ((const float *)a.x)[i];
	float m = fabsf(v);
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
	const float d = m / 127.0f;
	const int q = m > 0.0f ? __float2int_rn(v / d) : 0;
	((int8_t *)a.q)[i] = (int8_t)max(-127, min(127, q));
	if ((threadIdx.x & 31) == 0)
		((float *)a.d)[i / 32] = d;
}

__device__ __forceinline__ int ld_i32(const uint8_t *p) /* 4-byte aligned */
{
	return __ldg((const int *)p);
}

__device__ __forceinline__ int ld_i32_2(const uint8_t *p) /* 2-byte aligned */
{
	const unsigned short *h = (const unsigned short *)p;
	return (int)((uint32_t)__ldg(h) | ((uint32_t)__ldg(h + 1) << 16));
}

/* Thread t (< 16) of a q4_K block b against the activation's 256 values
 * q (scales d[8]): 8 bytes of qs, that is 8 weights of sub-block 2j
 * (the low nibbles) and 8 of sub-block 2j + 1 (the high ones). With
 * w = dsc * n - dmin * m: sum = dsc * (n . q) * d8 - dmin * m * (sum q) * d8. */
__device__ __forceinline__ float dot_q4k(const uint8_t *b, const int8_t *q, const float *d,
    uint32_t t)
{
	const uint32_t j = t >> 2, o = (t & 3) * 8;
	const int v0 = ld_i32(b + 16 + 32 * j + o), v1 = ld_i32(b + 16 + 32 * j + o + 4);
	const int *ul = (const int *)(q + 64 * j + o), *uh = (const int *)(q + 64 * j + 32 + o);
	const int ul0 = ul[0], ul1 = ul[1], uh0 = uh[0], uh1 = uh[1];
	const int dl = __dp4a(v0 & 0x0F0F0F0F, ul0, __dp4a(v1 & 0x0F0F0F0F, ul1, 0));
	const int dh = __dp4a((v0 >> 4) & 0x0F0F0F0F, uh0, __dp4a((v1 >> 4) & 0x0F0F0F0F, uh1, 0));
	const int sl = __dp4a(0x01010101, ul0, __dp4a(0x01010101, ul1, 0));
	const int sh = __dp4a(0x01010101, uh0, __dp4a(0x01010101, uh1, 0));
	const uint8_t *sc = b + 4;
	uint32_t s0, m0, s1, m1; /* sub-blocks 2j and 2j + 1 (kq_scale_min's rule) */
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
	const uint32_t dd = (uint32_t)ld_i32(b);
	const float dw = f16f(dd & 0xFFFF), dm = f16f(dd >> 16);
	const float fl = d[2 * j], fh = d[2 * j + 1];
	return dw * (fl * (float)((int)s0 * dl) + fh * (float)((int)s1 * dh)) -
	    dm * (fl * (float)((int)m0 * sl) + fh * (float)((int)m1 * sh));
}

/* Thread t (< 16) of a q6_K block (210 bytes: 2-byte aligned): half
 * h = t / 8, weights l0 .. l0 + 3 (l0 = 4 (t % 8)) of each of its four
 * runs of 32 (ql's low and high nibbles, qh's four bit pairs). */
__device__ __forceinline__ float dot_q6k(const uint8_t *b, const int8_t *q, const float *d,
    uint32_t t)
{
	const uint32_t h = t >> 3, l0 = (t & 7) * 4;
	const int qa = ld_i32_2(b + 64 * h + l0), qb = ld_i32_2(b + 64 * h + 32 + l0);
	const int qh = ld_i32_2(b + 128 + 32 * h + l0);
	const int8_t *sc = (const int8_t *)b + 192 + 8 * h + l0 / 16;
	const int v[4] = {
		(qa & 0x0F0F0F0F) | ((qh << 4) & 0x30303030),
		(qb & 0x0F0F0F0F) | ((qh << 2) & 0x30303030),
		((qa >> 4) & 0x0F0F0F0F) | (qh & 0x30303030),
		((qb >> 4) & 0x0F0F0F0F) | ((qh >> 2) & 0x30303030),
	};
	float s = 0.0f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int u = *(const int *)(q + 128 * h + 32 * i + l0);
		const int dot = __dp4a((int)__vsubss4((unsigned)v[i], 0x20202020u), u, 0);
		s += d[4 * h + i] * (float)((int)__ldg(sc + 2 * i) * dot);
	}
	return f16f(__ldg((const unsigned short *)(b + 208))) * s;
}

__device__ __forceinline__ float dot_blk(uint32_t dt, const uint8_t *row, const int8_t *q,
    const float *d, uint32_t sb, uint32_t t)
{
	return dt == BATON_DT_Q4_K ? dot_q4k(row + 144ull * sb, q + 256 * sb, d + 8 * sb, t)
	                           : dot_q6k(row + 210ull * sb, q + 256 * sb, d + 8 * sb, t);
}

/* Thread i (< tpr) of a row's share of row . q: blocks i / 16, then
 * every tpr / 16 further. */
__device__ __forceinline__ float row_part(uint32_t dt, const uint8_t *row, const int8_t *q,
    const float *d, uint32_t nsb, uint32_t i, uint32_t tpr)
{
	float s = 0.0f;
#pragma unroll 4 /* a row's loads in flight together where tpr is short of its blocks */
	for (uint32_t it = i; it < nsb * SUB; it += tpr)
		s += dot_blk(dt, row, q, d, it / SUB, it % SUB);
	return s;
}

/* The sum of v over the tpr threads of each row, in the row's first
 * thread; every thread of the block must call it (a barrier). */
__device__ __forceinline__ float row_sum(float v, uint32_t tpr, float *sh)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	if (tpr == 32)
		return v;
	const uint32_t w = threadIdx.x >> 5;
	__syncthreads(); /* sh free from the last call */
	if ((threadIdx.x & 31) == 0)
		sh[w] = v;
	__syncthreads();
	float s = sh[w & ~(tpr / 32 - 1)];
	for (uint32_t i = 1; i < tpr / 32; i++)
		s += sh[(w & ~(tpr / 32 - 1)) + i];
	return s;
}

/* Block blk's rows of y = w . x (+ b) (accumulate: y +=), x as q / d:
 * baton_mmvq_matmul's and baton_mmvq_matmuls' one body, so their bits. */
__device__ __forceinline__ void mmvq_rows(uint64_t w, uint32_t w_dtype, uint64_t row_bytes,
    uint32_t n_out, uint64_t b, uint32_t b_dtype, uint64_t y, uint32_t accumulate, uint64_t q,
    uint64_t d, uint32_t k, uint32_t tpr, uint32_t blk, float *sh)
{
	const uint32_t o = blk * (THREADS / tpr) + threadIdx.x / tpr;
	const uint32_t i = threadIdx.x % tpr;
	float s = 0.0f;
	if (o < n_out)
		s = row_part(w_dtype, (const uint8_t *)w + o * row_bytes, (const int8_t *)q,
		    (const float *)d, k / 256, i, tpr);
	s = row_sum(s, tpr, sh);
	if (i == 0 && o < n_out) {
		float *yo = (float *)y;
		if (b)
			s += elem((const uint8_t *)b, b_dtype, o);
		yo[o] = accumulate ? yo[o] + s : s;
	}
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_mmvq_matmul(baton_mmvq_args a)
{
	__shared__ float sh[THREADS / 32];
	mmvq_rows(a.w, a.w_dtype, a.row_bytes, a.n_out, a.b, a.b_dtype, a.y, a.accumulate, a.q, a.d,
	    a.k, a.tpr, blockIdx.x, sh);
}

/* Up to three matrices over one x: blocks start[i] .. of the grid are
 * matrix i's. */
extern "C" __global__ void __launch_bounds__(THREADS)
baton_mmvq_matmuls(baton_mmvq_n_args a)
{
	__shared__ float sh[THREADS / 32];
	const uint32_t i = blockIdx.x >= a.start[2] ? 2 : blockIdx.x >= a.start[1] ? 1 : 0;
	mmvq_rows(a.w[i], a.w_dtype[i], a.row_bytes[i], a.n_out[i], a.b[i], a.b_dtype[i], a.y[i], 0,
	    a.q, a.d, a.k, a.tpr, blockIdx.x - a.start[i], sh);
}

__device__ __forceinline__ float silu(float g)
{
	return g / (1.0f + expf(-g)); /* moe.cu's */
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_mmvq_gate_up(baton_mmvq_moe_args a)
{
	__shared__ float sh[THREADS / 32];
	const uint32_t r = blockIdx.x * (THREADS / a.tpr) + threadIdx.x / a.tpr;
	const uint32_t i = threadIdx.x % a.tpr, p = blockIdx.y, nsb = a.d_model / 256;
	const int8_t *q = (const int8_t *)a.q;
	const float *d = (const float *)a.d;
	float g = 0.0f, u = 0.0f;
	if (r < a.d_ff) {
		const uint8_t *blob =
		    (const uint8_t *)((const uint64_t *)a.table)[((const uint32_t *)a.ids)[p]];
		g = row_part(a.gate_dtype, blob + a.gate_off + r * row_bytes(a.gate_dtype, a.d_model),
		    q, d, nsb, i, a.tpr);
		u = row_part(a.up_dtype, blob + a.up_off + r * row_bytes(a.up_dtype, a.d_model), q, d,
		    nsb, i, a.tpr);
	}
	g = row_sum(g, a.tpr, sh);
	u = row_sum(u, a.tpr, sh);
	if (i == 0 && r < a.d_ff)
		((float *)a.h)[(uint64_t)p * a.d_ff + r] = silu(g) * u;
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_mmvq_down(baton_mmvq_moe_args a)
{
	__shared__ float sh[THREADS / 32];
	const uint32_t o = blockIdx.x * (THREADS / a.tpr) + threadIdx.x / a.tpr;
	const uint32_t i = threadIdx.x % a.tpr, nsb = a.d_ff / 256, per = nsb * SUB;
	const uint64_t db = row_bytes(a.down_dtype, a.d_ff);
	float s = 0.0f;
	if (o < a.d_model)
		for (uint32_t it = i; it < a.top_k * per; it += a.tpr) {
			const uint32_t p = it / per, sb = (it % per) / SUB;
			const uint8_t *blob =
			    (const uint8_t *)((const uint64_t *)a.table)[((const uint32_t *)a.ids)[p]];
			const int8_t *q = (const int8_t *)a.q + (uint64_t)p * a.d_ff;
			const float *d = (const float *)a.d + (uint64_t)p * (a.d_ff / 32);
			s += ((const float *)a.w)[p] *
			    dot_blk(a.down_dtype, blob + a.down_off + o * db, q, d, sb, it % SUB);
		}
	s = row_sum(s, a.tpr, sh);
	if (i == 0 && o < a.d_model)
		((float *)a.x)[o] += s;
}
