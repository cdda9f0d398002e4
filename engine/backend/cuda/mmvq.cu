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
static_assert(sizeof(baton_mmvq_moe_args) == 128, "mmvq moe args layout");
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
	const float2 f2 = *(const float2 *)(d + 2 * j); /* d: 8-byte aligned (see dot_q6k) */
	const float fl = f2.x, fh = f2.y;
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
	/* the four scales of the activation's blocks at once (d is 16-byte
	 * aligned: the quantization's buffer, 8 scales a 256-value block) */
	const float4 d4 = *(const float4 *)(d + 4 * h);
	const float dv[4] = { d4.x, d4.y, d4.z, d4.w };
	float s = 0.0f;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		const int u = *(const int *)(q + 128 * h + 32 * i + l0);
		const int dot = __dp4a((int)__vsubss4((unsigned)v[i], 0x20202020u), u, 0);
		s += dv[i] * (float)((int)__ldg(sc + 2 * i) * dot);
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

/* A programmatic dependent launch's start (cuda_launch_kx): block blk's
 * weight rows on their way to L2, then the wait for the kernel ahead
 * (its writes visible; at once when not launched so). */
__device__ __forceinline__ void pdl_start(uint64_t w, uint64_t row_bytes, uint32_t n_out,
    uint32_t tpr, uint32_t blk)
{
	const uint32_t o = blk * (THREADS / tpr) + threadIdx.x / tpr, i = threadIdx.x % tpr;
	if (o < n_out)
		for (uint64_t off = (uint64_t)i * 128; off < row_bytes; off += (uint64_t)tpr * 128)
			asm volatile("prefetch.global.L2 [%0];" ::"l"(w + o * row_bytes + off));
	asm volatile("griddepcontrol.wait;" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_mmvq_matmul(baton_mmvq_args a)
{
	__shared__ float sh[THREADS / 32];
	pdl_start(a.w, a.row_bytes, a.n_out, a.tpr, blockIdx.x);
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
	pdl_start(a.w[i], a.row_bytes[i], a.n_out[i], a.tpr, blockIdx.x - a.start[i]);
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

/* ---- the decode step's experts on 16-byte-aligned q4_K rows -------------- */

/* Byte i (< 12, known per lane) of q4_K's scales, held in 3 words. */
__device__ __forceinline__ uint32_t sc_byte(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t i)
{
	const uint32_t w = i < 4 ? w0 : i < 8 ? w1 : w2;
	return (w >> (8 * (i & 3))) & 0xFF;
}

/* The activation's two 32-value runs of q4_K run j of block b: the int8
 * quants (8 ints each), their scales and their sums, which the min term
 * takes. Loaded once per lane and shared by every row it meets. */
struct q4_act {
	int lo[8], hi[8];
	float fl, fh;
	int sl, sh;
};

__device__ __forceinline__ void q4_act_load(q4_act &u, const int8_t *q, const float *d, uint32_t b,
    uint32_t j)
{
	const int4 *p = (const int4 *)(q + 256 * b + 64 * j);
	const int4 a0 = __ldg(p), a1 = __ldg(p + 1), a2 = __ldg(p + 2), a3 = __ldg(p + 3);
	u.lo[0] = a0.x, u.lo[1] = a0.y, u.lo[2] = a0.z, u.lo[3] = a0.w;
	u.lo[4] = a1.x, u.lo[5] = a1.y, u.lo[6] = a1.z, u.lo[7] = a1.w;
	u.hi[0] = a2.x, u.hi[1] = a2.y, u.hi[2] = a2.z, u.hi[3] = a2.w;
	u.hi[4] = a3.x, u.hi[5] = a3.y, u.hi[6] = a3.z, u.hi[7] = a3.w;
	u.fl = __ldg(d + 8 * b + 2 * j);
	u.fh = __ldg(d + 8 * b + 2 * j + 1);
	int sl = 0, sh = 0;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		sl = __dp4a(0x01010101, u.lo[i], sl);
		sh = __dp4a(0x01010101, u.hi[i], sh);
	}
	u.sl = sl;
	u.sh = sh;
}

/* The 48 bytes a lane reads of a q4_K block for run j: the header (d,
 * dmin, the 12 scale bytes) and the 32 bytes of qs. */
struct q4_w {
	uint4 h, a, b;
};

__device__ __forceinline__ void q4_w_load(q4_w &w, const uint8_t *blk, uint32_t j)
{
	const uint4 *p = (const uint4 *)blk;
	w.h = __ldg(p);
	w.a = __ldg(p + 1 + 2 * j);
	w.b = __ldg(p + 2 + 2 * j);
}

/* Run j of a q4_K block against the activation's: sub-blocks 2j (low
 * nibbles) and 2j + 1 (high), kq_scale_min's scales, the sums as
 * dot_q4k's. */
__device__ __forceinline__ float q4_dot(const q4_w &w, const q4_act &u, uint32_t j)
{
	const uint32_t v[8] = { w.a.x, w.a.y, w.a.z, w.a.w, w.b.x, w.b.y, w.b.z, w.b.w };
	int dl = 0, dh = 0;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		dl = __dp4a((int)(v[i] & 0x0F0F0F0Fu), u.lo[i], dl);
		dh = __dp4a((int)((v[i] >> 4) & 0x0F0F0F0Fu), u.hi[i], dh);
	}
	const uint32_t w0 = w.h.y, w1 = w.h.z, w2 = w.h.w;
	uint32_t s0, m0, s1, m1;
	if (j < 2) {
		s0 = sc_byte(w0, w1, w2, 2 * j) & 63, m0 = sc_byte(w0, w1, w2, 2 * j + 4) & 63;
		s1 = sc_byte(w0, w1, w2, 2 * j + 1) & 63, m1 = sc_byte(w0, w1, w2, 2 * j + 5) & 63;
	} else {
		const uint32_t a0 = sc_byte(w0, w1, w2, 2 * j + 4), a1 = sc_byte(w0, w1, w2, 2 * j + 5);
		s0 = (a0 & 0xF) | ((sc_byte(w0, w1, w2, 2 * j - 4) >> 6) << 4);
		m0 = (a0 >> 4) | ((sc_byte(w0, w1, w2, 2 * j) >> 6) << 4);
		s1 = (a1 & 0xF) | ((sc_byte(w0, w1, w2, 2 * j - 3) >> 6) << 4);
		m1 = (a1 >> 4) | ((sc_byte(w0, w1, w2, 2 * j + 1) >> 6) << 4);
	}
	const float dw = f16f(w.h.x & 0xFFFF), dm = f16f(w.h.x >> 16);
	return dw * (u.fl * (float)((int)s0 * dl) + u.fh * (float)((int)s1 * dh)) -
	    dm * (u.fl * (float)((int)m0 * u.sl) + u.fh * (float)((int)m1 * u.sh));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, off);
	return v;
}

/* gate and up on q4_K rows at 16-byte alignment, and h's quantization:
 * block (x, p) takes rows 32 x .. 32 x + 31 of pair p, warp w rows w,
 * w + GU_WARPS, ..., two at a time with all their loads issued first;
 * lane l takes run l % 4 of block l / 4 (then every 8 blocks further),
 * its activation loaded once for every row. The 32 h of the block are
 * quantized as baton_mmvq_quant does (its block of 32). */
extern "C" __global__ void __launch_bounds__(32 * BATON_MMVQ_GU_WARPS)
baton_mmvq_gate_up_q4k(baton_mmvq_moe_args a)
{
	__shared__ float hs[32];
	const uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, p = blockIdx.y;
	const uint32_t nsb = a.d_model / 256, r0 = blockIdx.x * 32, j = lane & 3;
	if (r0 >= a.d_ff || p >= a.top_k)
		return; /* the whole block (the empty launch at load) */
	const uint64_t rb = 144ull * nsb;
	const uint8_t *blob =
	    (const uint8_t *)((const uint64_t *)a.table)[((const uint32_t *)a.ids)[p]];
	const uint8_t *gate = blob + a.gate_off, *up = blob + a.up_off;
	const int8_t *q = (const int8_t *)a.q;
	const float *d = (const float *)a.d;
	if (nsb <= 8) { /* one item a lane: the activation once, in registers */
		const uint32_t b = lane >> 2;
		const bool on = b < nsb;
		q4_act u;
		if (on)
			q4_act_load(u, q, d, b, j);
		for (uint32_t rr = wi; rr < 32; rr += 2 * BATON_MMVQ_GU_WARPS) {
			const uint32_t ra = r0 + rr, rb2 = ra + BATON_MMVQ_GU_WARPS;
			float g0 = 0.0f, u0 = 0.0f, g1 = 0.0f, u1 = 0.0f;
			if (on) {
				q4_w wg0, wu0, wg1, wu1;
				q4_w_load(wg0, gate + ra * rb + 144 * b, j);
				q4_w_load(wu0, up + ra * rb + 144 * b, j);
				q4_w_load(wg1, gate + rb2 * rb + 144 * b, j);
				q4_w_load(wu1, up + rb2 * rb + 144 * b, j);
				g0 = q4_dot(wg0, u, j), u0 = q4_dot(wu0, u, j);
				g1 = q4_dot(wg1, u, j), u1 = q4_dot(wu1, u, j);
			}
			g0 = warp_sum(g0), u0 = warp_sum(u0), g1 = warp_sum(g1), u1 = warp_sum(u1);
			if (lane == 0) {
				hs[rr] = silu(g0) * u0;
				hs[rr + BATON_MMVQ_GU_WARPS] = silu(g1) * u1;
			}
		}
	} else { /* longer rows: items in turn, the activation loaded with each */
		for (uint32_t rr = wi; rr < 32; rr += BATON_MMVQ_GU_WARPS) {
			const uint32_t r = r0 + rr;
			float g = 0.0f, v = 0.0f;
			for (uint32_t it = lane; it < nsb * 4; it += 32) {
				const uint32_t b = it >> 2;
				q4_act u;
				q4_w wg, wu;
				q4_w_load(wg, gate + r * rb + 144 * b, j);
				q4_w_load(wu, up + r * rb + 144 * b, j);
				q4_act_load(u, q, d, b, j);
				g += q4_dot(wg, u, j);
				v += q4_dot(wu, u, j);
			}
			g = warp_sum(g), v = warp_sum(v);
			if (lane == 0)
				hs[rr] = silu(g) * v;
		}
	}
	__syncthreads();
	if (wi != 0)
		return;
	const float v = hs[lane];
	float m = fabsf(v);
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
	const float dq = m / 127.0f;
	const int qv = m > 0.0f ? __float2int_rn(v / dq) : 0;
	const uint64_t i = (uint64_t)p * a.d_ff + r0 + lane;
	((int8_t *)a.hq)[i] = (int8_t)max(-127, min(127, qv));
	if (lane == 0)
		((float *)a.hd)[i / 32] = dq;
}

/* down on q4_K rows at 16-byte alignment: a warp per output row o, lane l
 * taking items l, l + 32, ... of (pair, block, run), DN at a time with
 * their loads first (DN 4: Qwen3-30B-A3B's 96 items a row in one round
 * trip to memory, where 2 took two; the sum's order is the items', so
 * DN changes no bit); x[o] += the sum over pairs of w[p] * (down[o] . h[p]). */
template <int DN>
__device__ __forceinline__ void down_q4k(const baton_mmvq_moe_args &a)
{
	const uint32_t lane = threadIdx.x & 31;
	const uint32_t o = blockIdx.x * BATON_MMVQ_DOWN_WARPS + (threadIdx.x >> 5);
	if (o >= a.d_model)
		return; /* whole warps */
	const uint32_t nsb = a.d_ff / 256, per = nsb * 4, n = a.top_k * per, j = lane & 3;
	const uint64_t rb = 144ull * nsb;
	const int8_t *q = (const int8_t *)a.q;
	const float *d = (const float *)a.d, *wt = (const float *)a.w;
	const uint32_t *ids = (const uint32_t *)a.ids;
	const uint64_t *tab = (const uint64_t *)a.table;
	float s = 0.0f;
	for (uint32_t i0 = lane; i0 < n; i0 += 32 * DN) {
		q4_w w[DN];
#pragma unroll
		for (int u = 0; u < DN; u++) {
			const uint32_t i = i0 + 32 * u, p = i / per, b = (i % per) >> 2;
			if (i < n)
				q4_w_load(w[u], (const uint8_t *)tab[ids[p]] + a.down_off + o * rb + 144 * b, j);
		}
#pragma unroll
		for (int u = 0; u < DN; u++) {
			const uint32_t i = i0 + 32 * u, p = i / per, b = (i % per) >> 2;
			if (i < n) {
				q4_act u4;
				q4_act_load(u4, q + (uint64_t)p * a.d_ff, d + (uint64_t)p * (a.d_ff / 32), b, j);
				s += wt[p] * q4_dot(w[u], u4, j);
			}
		}
	}
	s = warp_sum(s);
	if (lane == 0)
		((float *)a.x)[o] += s;
}

extern "C" __global__ void __launch_bounds__(32 * BATON_MMVQ_DOWN_WARPS)
baton_mmvq_down_q4k(baton_mmvq_moe_args a)
{
	down_q4k<4>(a);
}
