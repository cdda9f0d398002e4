/*
 * moe_rows.cu: the MoE experts of passes of 2 to BATON_MR_MAX_ROWS rows
 * routed on the device (moe_rows.h), on q4_K experts against activations
 * quantized to int8 blocks of 32: a pass's pairs grouped by expert
 * (baton_mr_group), then gate_up and down reading each chosen expert's
 * rows once for all its pairs, then moe.cu's baton_moe_reduce adding the
 * weighted parts in rank order. Every sum is in a fixed order (a lane's
 * blocks, the warp's fixed tree, a row's blocks of 8 in turn, the pairs of
 * an expert ascending): the same bits run to run, whatever the grouping.
 */
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/moe_rows.h"

static_assert(sizeof(baton_mr_quant_args) == 32, "mr quant args layout");
static_assert(sizeof(baton_mr_slot) == 16, "mr slot layout");
static_assert(sizeof(baton_mr_group_args) == 48, "mr group args layout");
static_assert(sizeof(baton_mr_moe_args) == 104, "mr moe args layout");

#define FULL 0xffffffffu
#define GU_W BATON_MR_GU_WARPS
#define DN_W BATON_MR_DN_WARPS
#define MAXR BATON_MR_MAX_ROWS

/* x (n floats) as int8 blocks of 32: the quants, each block's scale d and
 * d times the sum of its quants (the q4_K min term's factor). */
extern "C" __global__ void __launch_bounds__(256)
baton_mr_quant(baton_mr_quant_args a)
{
	const uint32_t i = blockIdx.x * 256 + threadIdx.x;
	if (i >= a.n)
		return; /* n % 32 == 0: whole warps */
	const float v = ((const float *)a.x)[i];
	float m = fabsf(v);
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		m = fmaxf(m, __shfl_xor_sync(FULL, m, off));
	const float d = m / 127.0f;
	const int q = m > 0.0f ? max(-127, min(127, __float2int_rn(v / d))) : 0;
	((int8_t *)a.q)[i] = (int8_t)q;
	int s = q;
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		s += __shfl_xor_sync(FULL, s, off);
	if ((threadIdx.x & 31) == 0)
		((float2 *)a.ds)[i / 32] = make_float2(d, d * (float)s);
}

/* The pass's pairs by expert: counts (atomics on integers: the same
 * counts in any order), the offsets by a warp's scan in id order, then
 * each expert's pairs in ascending index by one thread. */
extern "C" __global__ void __launch_bounds__(256)
baton_mr_group(baton_mr_group_args a)
{
	__shared__ uint32_t sid[BATON_MR_MAX_PAIRS];
	__shared__ uint32_t cnt[BATON_MR_MAX_E], off[BATON_MR_MAX_E];
	const uint32_t n = a.n, E = a.n_experts, tid = threadIdx.x;
	if (n > BATON_MR_MAX_PAIRS || E > BATON_MR_MAX_E)
		return; /* refused by the launcher; also the empty launch at load */
	const uint32_t *ids = (const uint32_t *)a.ids;
	const uint64_t *tab = (const uint64_t *)a.table;
	baton_mr_slot *slots = (baton_mr_slot *)a.slots;
	uint32_t *pairs = (uint32_t *)a.pairs;
	for (uint32_t i = tid; i < n; i += 256)
		sid[i] = ids[i];
	for (uint32_t e = tid; e < E; e += 256)
		cnt[e] = 0;
	__syncthreads();
	for (uint32_t i = tid; i < n; i += 256)
		if (sid[i] < E)
			atomicAdd(&cnt[sid[i]], 1u);
	__syncthreads();
	if (tid < 32) {
		uint32_t o = 0, s = 0;
		for (uint32_t base = 0; base < E; base += 32) {
			const uint32_t e = base + tid, c = e < E ? cnt[e] : 0;
			uint32_t v = c;
#pragma unroll
			for (uint32_t dd = 1; dd < 32; dd <<= 1) {
				const uint32_t t = __shfl_up_sync(FULL, v, dd);
				if (tid >= dd)
					v += t;
			}
			const uint32_t act = __ballot_sync(FULL, c > 0);
			if (c) {
				const uint32_t at = s + __popc(act & ((1u << tid) - 1u));
				off[e] = o + v - c;
				baton_mr_slot sl;
				sl.blob = tab[e];
				sl.first = o + v - c;
				sl.count = c;
				slots[at] = sl;
			}
			o += __shfl_sync(FULL, v, 31);
			s += __popc(act);
		}
		for (uint32_t i = s + tid; i < a.n_slots; i += 32) {
			baton_mr_slot sl;
			sl.blob = 0;
			sl.first = 0;
			sl.count = 0;
			slots[i] = sl;
		}
	}
	__syncthreads();
	for (uint32_t e = tid; e < E; e += 256)
		if (cnt[e]) {
			uint32_t k = off[e];
			for (uint32_t j = 0; j < n; j++)
				if (sid[j] == e)
					pairs[k++] = j;
		}
}

/* ---- q4_K against int8 blocks -------------------------------------------- */

/* The 48 bytes a lane reads of a q4_K block for run j (of 4): the header
 * (d, dmin, the 12 scale bytes) and the run's 32 bytes of qs. */
struct q4raw {
	uint4 h, a, b;
};

__device__ __forceinline__ void raw_load(q4raw &w, const uint8_t *blk, uint32_t j)
{
	const uint4 *p = (const uint4 *)blk;
	w.h = __ldg(p);
	w.a = __ldg(p + 1 + 2 * j);
	w.b = __ldg(p + 2 + 2 * j);
}

/* Run j of a q4_K block ready for any number of activations: its 64
 * nibbles (sub-blocks 2j low, 2j + 1 high), d * scale and dmin * min of
 * each sub-block (kq_scale_min's 6-bit fields). */
struct q4w {
	uint32_t v[8];
	float s0, s1, m0, m1;
};

__device__ __forceinline__ uint32_t sc_byte(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t i)
{
	const uint32_t w = i < 4 ? w0 : i < 8 ? w1 : w2;
	return (w >> (8 * (i & 3))) & 0xFF;
}

__device__ __forceinline__ void q4w_make(q4w &r, const q4raw &w, uint32_t j)
{
	r.v[0] = w.a.x, r.v[1] = w.a.y, r.v[2] = w.a.z, r.v[3] = w.a.w;
	r.v[4] = w.b.x, r.v[5] = w.b.y, r.v[6] = w.b.z, r.v[7] = w.b.w;
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
	r.s0 = dw * (float)s0, r.s1 = dw * (float)s1;
	r.m0 = dm * (float)m0, r.m1 = dm * (float)m1;
}

/* An activation's two runs of 32 for q4_K run j of block b: the int8
 * quants and { d_lo, d_lo * sum_lo, d_hi, d_hi * sum_hi }. */
struct act4 {
	int lo[8], hi[8];
	float4 ds;
};

__device__ __forceinline__ void act_load(act4 &u, const int8_t *q, const float2 *ds, uint32_t b,
    uint32_t j)
{
	const int4 *p = (const int4 *)(q + 256 * b + 64 * j);
	const int4 a0 = __ldg(p), a1 = __ldg(p + 1), a2 = __ldg(p + 2), a3 = __ldg(p + 3);
	u.lo[0] = a0.x, u.lo[1] = a0.y, u.lo[2] = a0.z, u.lo[3] = a0.w;
	u.lo[4] = a1.x, u.lo[5] = a1.y, u.lo[6] = a1.z, u.lo[7] = a1.w;
	u.hi[0] = a2.x, u.hi[1] = a2.y, u.hi[2] = a2.z, u.hi[3] = a2.w;
	u.hi[4] = a3.x, u.hi[5] = a3.y, u.hi[6] = a3.z, u.hi[7] = a3.w;
	u.ds = __ldg((const float4 *)(ds + 8 * b + 2 * j));
}

/* With w = d * sc * n - dmin * m and x = d8 * q over a run of 32:
 * sum w x = d8 * (d * sc) * (n . q) - (dmin * m) * (d8 * sum q). */
__device__ __forceinline__ float q4_dot(const q4w &r, const act4 &u)
{
	int dl = 0, dh = 0;
#pragma unroll
	for (int i = 0; i < 8; i++) {
		dl = __dp4a((int)(r.v[i] & 0x0F0F0F0Fu), u.lo[i], dl);
		dh = __dp4a((int)((r.v[i] >> 4) & 0x0F0F0F0Fu), u.hi[i], dh);
	}
	return u.ds.x * (r.s0 * (float)dl) + u.ds.z * (r.s1 * (float)dh) -
	    (r.m0 * u.ds.y + r.m1 * u.ds.w);
}

/* Four sums over the warp in 6 shuffles: a's total lands in lanes 0-7,
 * b's in 8-15, c's in 16-23, d's in 24-31 (a fixed tree: the same bits). */
__device__ __forceinline__ float warp_sum4(float a, float b, float c, float d, uint32_t lane)
{
	const bool hi16 = lane & 16, hi8 = lane & 8;
	const float y0 = __shfl_xor_sync(FULL, hi16 ? a : c, 16);
	const float y1 = __shfl_xor_sync(FULL, hi16 ? b : d, 16);
	const float k0 = (hi16 ? c : a) + y0, k1 = (hi16 ? d : b) + y1;
	const float z = __shfl_xor_sync(FULL, hi8 ? k0 : k1, 8);
	float m = (hi8 ? k1 : k0) + z;
	m += __shfl_xor_sync(FULL, m, 4);
	m += __shfl_xor_sync(FULL, m, 2);
	m += __shfl_xor_sync(FULL, m, 1);
	return m;
}

__device__ __forceinline__ float silu(float g)
{
	return g / (1.0f + expf(-g)); /* moe.cu's */
}

/* Block (x, s): rows 32 x .. 32 x + 31 of gate and up of slot s's expert
 * for each of its pairs. Warp w takes rows w, w + 8 (then w + 16, w + 24),
 * gate and up of both, a lane run j = lane % 4 of block b0 + lane / 4
 * (blocks 8 at a time): the four rows' bytes loaded first, then dotted
 * with each pair's activation in turn; the sums of each (pair, row) in
 * shared memory, added in block order. Then h = silu(g) * u per pair, as
 * int8 blocks of the 32 rows. */
extern "C" __global__ void __launch_bounds__(32 * GU_W)
baton_mr_gate_up(baton_mr_moe_args a)
{
	__shared__ float sg[MAXR][32], su[MAXR][32];
	__shared__ uint32_t sp[MAXR];
	if (!a.slots)
		return; /* the empty launch at load */
	const baton_mr_slot sl = ((const baton_mr_slot *)a.slots)[blockIdx.y];
	const uint32_t c = sl.count, r0 = blockIdx.x * 32;
	if (!c || c > MAXR || r0 >= a.d_ff)
		return; /* the whole block */
	const uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, j = lane & 3;
	const uint32_t D = a.d_model, nsb = D / 256;
	const uint64_t rb = 144ull * nsb;
	const uint8_t *gate = (const uint8_t *)sl.blob + a.gate_off;
	const uint8_t *up = (const uint8_t *)sl.blob + a.up_off;
	const int8_t *xq = (const int8_t *)a.xq;
	const float2 *xds = (const float2 *)a.xds;
	for (uint32_t i = threadIdx.x; i < c * 32; i += 32 * GU_W)
		sg[i / 32][i % 32] = su[i / 32][i % 32] = 0.0f;
	for (uint32_t i = threadIdx.x; i < c; i += 32 * GU_W)
		sp[i] = ((const uint32_t *)a.pairs)[sl.first + i];
	__syncthreads();
	for (uint32_t rr = wi; rr < 32; rr += 2 * GU_W) {
		const uint32_t ra = r0 + rr, rc = ra + GU_W;
		for (uint32_t b0 = 0; b0 < nsb; b0 += 8) {
			const uint32_t b = b0 + (lane >> 2);
			const bool on = b < nsb;
			q4w g0, u0, g1, u1;
			if (on) {
				q4raw w0, w1, w2, w3;
				raw_load(w0, gate + ra * rb + 144 * b, j);
				raw_load(w1, up + ra * rb + 144 * b, j);
				raw_load(w2, gate + rc * rb + 144 * b, j);
				raw_load(w3, up + rc * rb + 144 * b, j);
				q4w_make(g0, w0, j), q4w_make(u0, w1, j);
				q4w_make(g1, w2, j), q4w_make(u1, w3, j);
			}
			for (uint32_t t = 0; t < c; t++) {
				const uint32_t row = sp[t] / a.top_k;
				float vg0 = 0.0f, vu0 = 0.0f, vg1 = 0.0f, vu1 = 0.0f;
				if (on) {
					act4 u;
					act_load(u, xq + (uint64_t)row * D, xds + (uint64_t)row * (D / 32), b, j);
					vg0 = q4_dot(g0, u), vu0 = q4_dot(u0, u);
					vg1 = q4_dot(g1, u), vu1 = q4_dot(u1, u);
				}
				const float s = warp_sum4(vg0, vu0, vg1, vu1, lane);
				if (lane == 0)
					sg[t][rr] += s;
				else if (lane == 8)
					su[t][rr] += s;
				else if (lane == 16)
					sg[t][rr + GU_W] += s;
				else if (lane == 24)
					su[t][rr + GU_W] += s;
			}
		}
	}
	__syncthreads();
	for (uint32_t t = wi; t < c; t += GU_W) {
		const uint32_t p = sp[t];
		const float v = silu(sg[t][lane]) * su[t][lane];
		float m = fabsf(v);
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			m = fmaxf(m, __shfl_xor_sync(FULL, m, off));
		const float dq = m / 127.0f;
		const int q = m > 0.0f ? max(-127, min(127, __float2int_rn(v / dq))) : 0;
		const uint64_t i = (uint64_t)p * a.d_ff + r0 + lane;
		((int8_t *)a.hq)[i] = (int8_t)q;
		int s = q;
#pragma unroll
		for (int off = 16; off > 0; off >>= 1)
			s += __shfl_xor_sync(FULL, s, off);
		if (lane == 0)
			((float2 *)a.hds)[i / 32] = make_float2(dq, dq * (float)s);
	}
}

/* Block (x, s): output rows 32 x .. 32 x + 31 of slot s's expert's down
 * for each of its pairs. Warp w takes rows 8 w .. 8 w + 7, four lanes a
 * row (lane run j of each of the row's blocks, 4 at a time): the blocks
 * loaded first, then dotted with each pair's h in turn; part[p][o] =
 * w[p] * the row's sum. */
extern "C" __global__ void __launch_bounds__(32 * DN_W, 4) /* 128 registers: 16 warps an SM */
baton_mr_down(baton_mr_moe_args a)
{
	__shared__ float acc[MAXR][32];
	__shared__ uint32_t sp[MAXR];
	if (!a.slots)
		return; /* the empty launch at load */
	const baton_mr_slot sl = ((const baton_mr_slot *)a.slots)[blockIdx.y];
	const uint32_t c = sl.count, o0 = blockIdx.x * 32;
	if (!c || c > MAXR || o0 >= a.d_model)
		return;
	const uint32_t lane = threadIdx.x & 31, wi = threadIdx.x >> 5, j = lane & 3;
	const uint32_t row = wi * 8 + (lane >> 2), F = a.d_ff, nsb = F / 256;
	const uint8_t *wr = (const uint8_t *)sl.blob + a.down_off + (uint64_t)(o0 + row) * 144 * nsb;
	const int8_t *hq = (const int8_t *)a.hq;
	const float2 *hds = (const float2 *)a.hds;
	for (uint32_t i = threadIdx.x; i < c * 32; i += 32 * DN_W)
		acc[i / 32][i % 32] = 0.0f;
	for (uint32_t i = threadIdx.x; i < c; i += 32 * DN_W)
		sp[i] = ((const uint32_t *)a.pairs)[sl.first + i];
	__syncthreads();
	for (uint32_t b0 = 0; b0 < nsb; b0 += 4) {
		const uint32_t nb = nsb - b0 < 4 ? nsb - b0 : 4;
		q4w r[4];
		{
			q4raw w[4];
#pragma unroll
			for (uint32_t u = 0; u < 4; u++)
				if (u < nb)
					raw_load(w[u], wr + 144 * (b0 + u), j);
#pragma unroll
			for (uint32_t u = 0; u < 4; u++)
				if (u < nb)
					q4w_make(r[u], w[u], j);
		}
		for (uint32_t t = 0; t < c; t++) {
			const uint32_t p = sp[t];
			const int8_t *q = hq + (uint64_t)p * F;
			const float2 *ds = hds + (uint64_t)p * (F / 32);
			float s = 0.0f;
#pragma unroll
			for (uint32_t u = 0; u < 4; u++)
				if (u < nb) {
					act4 x;
					act_load(x, q, ds, b0 + u, j);
					s += q4_dot(r[u], x);
				}
			s += __shfl_xor_sync(FULL, s, 1);
			s += __shfl_xor_sync(FULL, s, 2);
			if (j == 0)
				acc[t][row] += s;
		}
	}
	__syncthreads();
	const float *w = (const float *)a.w;
	for (uint32_t i = threadIdx.x; i < c * 32; i += 32 * DN_W) {
		const uint32_t t = i / 32, p = sp[t];
		((float *)a.part)[(uint64_t)p * a.d_model + o0 + i % 32] = w[p] * acc[t][i % 32];
	}
}
