/*
 * route.cu: routing on the device, bitwise the host's route (glibc's
 * expf computed as glibc does): baton_ops_route, one warp a row of
 * logits (the route_dev slot of engine/backend/backend.h), and
 * baton_ops_router_route, the post-attention norm, the router's f32
 * matmul and route in one launch (router_route_dev). Argument blocks in
 * ops.h; route_launch.c loads them from the embedded fatbin and launches
 * them; the norm and the dot are ops.cu's code (ops.cuh), so their bits.
 */
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/ops.cuh"
#include "engine/backend/cuda/ops.h"

static_assert(sizeof(baton_ops_route_args) == 40, "route args layout");
static_assert(sizeof(baton_ops_router_route_args) == 120, "router route args layout");

/* Lets a kernel launched after this one with programmatic dependent
 * launch (cuda_launch_kx: gemv16.cu's and mmvq.cu's) start once every
 * block here has begun: it loads its weights meanwhile and waits for this
 * grid's end before it reads anything written here. No effect on the
 * usual launches. rmsnorm_row and the attention rows kernels have it
 * inline; router_route (before the 16-bit experts) here. */
#define PDL_GO() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")

/* glibc's expf (2.28 on: ARM's optimized-routines algorithm, a 32-entry
 * table of 2^(i/32) and a cubic in double), so that the device's routing
 * weights are the host's bit for bit. Its float result is the same whether
 * the host build fuses the double multiply-adds or not (checked on every
 * 7th float against glibc 2.36); here every double op is written out. */
__constant__ uint64_t exp2f_tab[32] = {
	0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
	0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
	0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
	0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
	0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
	0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
	0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
	0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

__device__ __forceinline__ float expf_glibc(float x)
{
	const uint32_t ix = __float_as_uint(x), top = (ix >> 20) & 0x7ff;
	if (top >= 0x42b) { /* |x| >= 88, or inf, or NaN */
		if (ix == 0xff800000u)
			return 0.0f;
		if (top >= 0x7f8)
			return __fadd_rn(x, x);
		if (x > 0x1.62e42ep6f)
			return __int_as_float(0x7f800000);
		if (x < -0x1.9fe368p6f)
			return 0.0f;
	}
	const double inv = 0x1.71547652b82fep+0 * 32, shift = 0x1.8p+52;
	const double c0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32, c1 = 0x1.ebfce50fac4f3p-3 / 32 / 32,
		     c2 = 0x1.62e42ff0c52d6p-1 / 32;
	const double z = __dmul_rn(inv, (double)x);
	double kd = __dadd_rn(z, shift);
	const uint64_t ki = (uint64_t)__double_as_longlong(kd);
	kd = __dsub_rn(kd, shift);
	const double r = __dsub_rn(z, kd);
	const double s = __longlong_as_double((long long)(exp2f_tab[ki % 32] + (ki << 47)));
	const double zz = __dadd_rn(__dmul_rn(c0, r), c1);
	const double r2 = __dmul_rn(r, r);
	double y = __dadd_rn(__dmul_rn(c2, r), 1.0);
	y = __dadd_rn(__dmul_rn(zz, r2), y);
	return __double2float_rn(__dmul_rn(y, s));
}

/* host_op_route's steps for one row, in its order, by one warp: the max
 * (order free), p = expf(l - max) for each expert, their sum in expert
 * order (one lane), p / sum, then top_k rounds each taking the largest
 * untaken p (NaN as -inf, ties to the lower id: a total order, so the
 * warp's reduction finds the host's scan's choice), then the rule's
 * renorm. p: E floats of shared memory, taken: E bytes, sw: top_k floats
 * for the chosen weights (shared memory where top_k <= ROUTE_SW, so the
 * renorm reads nothing back from global memory; else w itself). The
 * logits are read through L2 (__ldcg): the fused router's last block
 * reads what other blocks wrote. */
__device__ __forceinline__ void route_row(const float *l, uint32_t E, uint32_t K, uint32_t rule,
    uint32_t *ids, float *w, float *p, unsigned char *taken, float *sw, uint32_t lane)
{
	float m = -INFINITY;
	for (uint32_t e = lane; e < E; e += 32) {
		const float v = __ldcg(l + e);
		if (v > m)
			m = v;
	}
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) {
		const float o = __shfl_xor_sync(0xffffffffu, m, off);
		if (o > m)
			m = o;
	}
	for (uint32_t e = lane; e < E; e += 32) {
		p[e] = expf_glibc(__fsub_rn(__ldcg(l + e), m));
		taken[e] = 0;
	}
	__syncwarp();
	float sum = 0.0f;
	if (lane == 0) {
		uint32_t e = 0;
		for (; e + 8 <= E; e += 8) { /* the loads of 8 ahead of their adds */
			float v[8];
#pragma unroll
			for (int i = 0; i < 8; i++)
				v[i] = p[e + i];
#pragma unroll
			for (int i = 0; i < 8; i++)
				sum = __fadd_rn(sum, v[i]);
		}
		for (; e < E; e++)
			sum = __fadd_rn(sum, p[e]);
	}
	sum = __shfl_sync(0xffffffffu, sum, 0);
	for (uint32_t e = lane; e < E; e += 32)
		p[e] = __fdiv_rn(p[e], sum);
	__syncwarp();
	for (uint32_t k = 0; k < K; k++) {
		uint32_t bi = UINT32_MAX;
		float bk = 0.0f;
		for (uint32_t e = lane; e < E; e += 32) {
			const float key = isnan(p[e]) ? -INFINITY : p[e];
			if (!taken[e] && (bi == UINT32_MAX || key > bk)) {
				bi = e;
				bk = key;
			}
		}
#pragma unroll
		for (int off = 16; off > 0; off >>= 1) {
			const uint32_t oi = __shfl_xor_sync(0xffffffffu, bi, off);
			const float ok = __shfl_xor_sync(0xffffffffu, bk, off);
			if (oi != UINT32_MAX &&
			    (bi == UINT32_MAX || ok > bk || (ok == bk && oi < bi))) {
				bi = oi;
				bk = ok;
			}
		}
		if (lane == 0) {
			taken[bi] = 1;
			ids[k] = bi;
			sw[k] = p[bi];
		}
		__syncwarp();
	}
	if (lane != 0)
		return;
	if (rule == 1) { /* BATON_ROUTE_SOFTMAX_TOPK_NORM */
		float s = 0.0f;
		for (uint32_t k = 0; k < K; k++)
			s = __fadd_rn(s, sw[k]);
		for (uint32_t k = 0; k < K; k++)
			w[k] = __fdiv_rn(sw[k], s);
	} else {
		for (uint32_t k = 0; k < K; k++)
			w[k] = sw[k];
	}
}

/* route_row for E <= 32 * NP, its choices from registers: lane l holds
 * experts l, l + 32, ... (the logits read once), and each top-k round is
 * two warp reductions: the largest key among the lanes' best untaken
 * experts (key: 0 none, 1 NaN, else the float's bits + 2, which orders
 * the non-negative p as floats, NaN as -inf), then the lowest id holding
 * it (ties to the lower id); only the winning lane looks for its next
 * best. The host's choice, step for step the same p, sum and renorm. ps:
 * E floats of shared memory (16-byte aligned), sw as route_row's. */
__device__ __forceinline__ uint32_t route_key(float v)
{
	return isnan(v) ? 1u : __float_as_uint(v) + 2u;
}

template <int NP>
__device__ __forceinline__ void route_row_reg(const float *l, uint32_t E, uint32_t K, uint32_t rule,
    uint32_t *ids, float *w, float *ps, float *sw, uint32_t lane)
{
	float v[NP];
	float m = -INFINITY;
#pragma unroll
	for (int i = 0; i < NP; i++) {
		const uint32_t e = lane + 32 * i;
		v[i] = e < E ? __ldcg(l + e) : 0.0f;
		if (e < E && v[i] > m)
			m = v[i];
	}
#pragma unroll
	for (int off = 16; off > 0; off >>= 1) {
		const float o = __shfl_xor_sync(0xffffffffu, m, off);
		if (o > m)
			m = o;
	}
#pragma unroll
	for (int i = 0; i < NP; i++) {
		const uint32_t e = lane + 32 * i;
		if (e < E)
			ps[e] = v[i] = expf_glibc(__fsub_rn(v[i], m));
	}
	__syncwarp();
	float sum = 0.0f;
	if (lane == 0) { /* in expert order, four loaded at a time */
		uint32_t e = 0;
		for (; e + 4 <= E; e += 4) {
			const float4 q = *(const float4 *)(ps + e);
			sum = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(sum, q.x), q.y), q.z), q.w);
		}
		for (; e < E; e++)
			sum = __fadd_rn(sum, ps[e]);
	}
	sum = __shfl_sync(0xffffffffu, sum, 0);
	__syncwarp(); /* lane 0 has read ps */
	uint32_t bk = 0, bi = 0, taken = 0;
#pragma unroll
	for (int i = 0; i < NP; i++) {
		const uint32_t e = lane + 32 * i;
		if (e < E) {
			ps[e] = v[i] = __fdiv_rn(v[i], sum);
			const uint32_t key = route_key(v[i]);
			if (key > bk)
				bk = key, bi = i;
		}
	}
	__syncwarp();
	for (uint32_t k = 0; k < K; k++) {
		const uint32_t top = __reduce_max_sync(0xffffffffu, bk);
		const uint32_t id = __reduce_min_sync(0xffffffffu, bk == top ? lane + 32 * bi : UINT32_MAX);
		if (lane == id % 32) { /* its next best untaken */
			taken |= 1u << (id / 32);
			bk = 0, bi = 0;
#pragma unroll
			for (int i = 0; i < NP; i++) {
				const uint32_t e = lane + 32 * i;
				if (e < E && !(taken >> i & 1)) {
					const uint32_t key = route_key(v[i]);
					if (key > bk)
						bk = key, bi = i;
				}
			}
		}
		if (lane == 0) {
			ids[k] = id;
			sw[k] = ps[id];
		}
	}
	if (lane != 0)
		return;
	if (rule == 1) { /* BATON_ROUTE_SOFTMAX_TOPK_NORM */
		float s = 0.0f;
		for (uint32_t k = 0; k < K; k++)
			s = __fadd_rn(s, sw[k]);
		for (uint32_t k = 0; k < K; k++)
			w[k] = __fdiv_rn(sw[k], s);
	} else {
		for (uint32_t k = 0; k < K; k++)
			w[k] = sw[k];
	}
}

/* route_row's fastest form for E experts (E <= 1,024 in registers). */
__device__ __forceinline__ void route_any(const float *l, uint32_t E, uint32_t K, uint32_t rule,
    uint32_t *ids, float *w, float *ps, unsigned char *taken, float *sw, uint32_t lane)
{
	if (E <= 128)
		route_row_reg<4>(l, E, K, rule, ids, w, ps, sw, lane);
	else if (E <= 1024)
		route_row_reg<32>(l, E, K, rule, ids, w, ps, sw, lane);
	else
		route_row(l, E, K, rule, ids, w, ps, taken, sw, lane);
}

#define ROUTE_SW 64

/* One warp per row. Dynamic shared memory: p[E], then taken[E]. */
extern "C" __global__ void __launch_bounds__(32)
baton_ops_route(baton_ops_route_args a)
{
	if (blockIdx.x >= a.rows)
		return;
	extern __shared__ float p[];
	__shared__ float sws[ROUTE_SW];
	unsigned char *taken = (unsigned char *)(p + a.n_experts);
	const uint64_t r = blockIdx.x;
	float *w = (float *)a.w + r * a.top_k;
	route_any((const float *)a.logits + r * a.n_experts, a.n_experts, a.top_k, a.rule,
	    (uint32_t *)a.ids + r * a.top_k, w, p, taken, a.top_k <= ROUTE_SW ? sws : w, threadIdx.x);
}

/* One f32 row's dot in the fixed order (mm_plain_vec<1, f32>'s: lane l
 * sums weights l, l + 32, ... in turn), split in two so that a caller
 * can issue the loads of the first RR_N * 32 weights before it has x:
 * each lane loads its own weights (coalesced 4-byte loads across the
 * warp), so no pass through shared memory puts them in lane order (the
 * 16-byte loads put back through shared memory were twice the
 * instructions; the kernel's time stayed within noise, 2026-12-04). */
#define RR_N 64 /* weights of a row a lane holds: the first 2,048 */
__device__ __forceinline__ void rr_load(float (&w)[RR_N], const float *row, uint32_t k,
    uint32_t lane)
{
#pragma unroll
	for (uint32_t u = 0; u < RR_N; u++)
		if (32 * u < k)
			w[u] = __ldg(row + 32 * u + lane);
}

__device__ __forceinline__ float rr_use(const float (&w)[RR_N], const float *row,
    const float *x, uint32_t k, uint32_t lane)
{
	float acc = 0.0f;
#pragma unroll
	for (uint32_t u = 0; u < RR_N; u++)
		if (32 * u < k)
			acc = __fadd_rn(acc, __fmul_rn(w[u], x[32 * u + lane]));
#pragma unroll 4
	for (uint32_t i = 32 * RR_N + lane; i < k; i += 32)
		acc = __fadd_rn(acc, __fmul_rn(__ldg(row + i), x[i]));
	return acc;
}

/* The post-attention norm, the router and route in one launch (struct
 * baton_router_route). Block (x, r), ROUTER_WARPS warps: logits
 * x * ROUTER_WARPS .. + ROUTER_WARPS - 1 of row r, a warp each, in the
 * one-row f32 matmul's order (its bits). With norm_on every block first
 * norms row r into shared memory as baton_ops_rmsnorm_row does (warp 0
 * sums the squares in its order; each value (x * s) * w), its router
 * loads already issued, and writes its share of xn (32-value runs x,
 * x + gridDim.x, ...) with their int8 blocks where q is set. The last
 * block of row r to finish (a counter per row, set back to 0 by that
 * block, so a replayed graph finds it 0) routes the row with route_row;
 * which block is last changes nothing: it reads every logit back. */
template <int RW>
__device__ __forceinline__ void router_route(const baton_ops_router_route_args &a)
{
	__shared__ __align__(16) float xs[BATON_OPS_NORM_ROW_MAX], ns[BATON_OPS_NORM_ROW_MAX];
	__shared__ __align__(16) float p[BATON_OPS_ROUTER_MAX_E];
	__shared__ float sws[ROUTE_SW];
	__shared__ unsigned char taken[BATON_OPS_ROUTER_MAX_E];
	__shared__ uint32_t last;
	__shared__ float scale;
	const uint32_t r = blockIdx.y, t = threadIdx.x, lane = t & 31, wi = t >> 5;
	if (r >= a.rows)
		return; /* the whole block */
	const uint32_t o = blockIdx.x * RW + wi, E = a.n_experts, k = a.k;
	const float *row = (const float *)a.w + (uint64_t)o * k;
	float wr[RR_N];
	if (o < E)
		rr_load(wr, row, k, lane); /* in flight while the norm runs */
	const float *x = (const float *)a.xn + (uint64_t)r * k;
	if (a.norm_on) {
		/* x and the norm's weights into shared memory, all loads in
		 * flight at once (16 bytes each where the weights are f32) */
		const float4 *xr = (const float4 *)((const float *)a.x + (uint64_t)r * k);
		const uint8_t *nw = (const uint8_t *)a.norm;
		const bool w4 = nw && a.norm_dtype == BATON_DT_F32 && a.norm % 16 == 0;
#pragma unroll 8
		for (uint32_t i = t; i < k / 4; i += 32 * RW) {
			((float4 *)xs)[i] = __ldg(xr + i);
			if (w4)
				((float4 *)ns)[i] = __ldg((const float4 *)nw + i);
		}
		if (nw && !w4)
#pragma unroll 8
			for (uint32_t i = t; i < k; i += 32 * RW)
				ns[i] = elem(nw, a.norm_dtype, i);
		__syncthreads();
		if (wi == 0) { /* norm_block's sum, k % 32 == 0 */
			float ss = 0.0f;
			for (uint32_t i = lane; i < k; i += 32)
				ss = __fadd_rn(ss, __fmul_rn(xs[i], xs[i]));
			ss = lane_tree(ss);
			if (lane == 0)
				scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)k), a.eps)));
		}
		__syncthreads();
		const float s = scale;
		for (uint32_t i = t; i < k; i += 32 * RW) {
			float v = __fmul_rn(xs[i], s);
			if (nw)
				v = __fmul_rn(v, ns[i]);
			xs[i] = v;
		}
		__syncthreads();
		float *xn = (float *)a.xn + (uint64_t)r * k;
		if (wi == 0)
			for (uint32_t b = blockIdx.x; b < k / 32; b += gridDim.x) {
				const uint32_t i = 32 * b + lane;
				const float v = xs[i];
				xn[i] = v;
				if (a.q) { /* baton_mmvq_quant's rule, as norm_block writes it */
					float m = fabsf(v);
#pragma unroll
					for (int off = 16; off > 0; off >>= 1)
						m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
					const float d = __fdiv_rn(m, 127.0f);
					const int q = m > 0.0f ? __float2int_rn(__fdiv_rn(v, d)) : 0;
					((int8_t *)a.q)[i] = (int8_t)max(-127, min(127, q));
					if (lane == 0)
						((float *)a.d)[b] = d;
				}
			}
	}
	float *logits = (float *)a.logits + (uint64_t)r * E;
	if (o < E) {
		/* x in shared memory (normed here) or global: two calls, so that
		 * each reads its own space rather than through generic loads */
		float acc = a.norm_on ? rr_use(wr, row, xs, k, lane) : rr_use(wr, row, x, k, lane);
		acc = lane_tree(acc);
		if (lane == 0) {
			logits[o] = acc;
			__threadfence(); /* the logit before the block's count */
		}
	}
	__syncthreads();
	if (t == 0) {
		uint32_t *cnt = (uint32_t *)a.count + r;
		last = atomicAdd(cnt, 1u) == gridDim.x - 1;
		if (last) {
			*cnt = 0; /* for the next launch (or replay) */
			__threadfence();
		}
	}
	__syncthreads();
	if (!last || wi != 0)
		return;
	float *w = (float *)a.w_out + (uint64_t)r * a.top_k;
	route_any(logits, E, a.top_k, a.rule, (uint32_t *)a.ids + (uint64_t)r * a.top_k, w, p, taken,
	    a.top_k <= ROUTE_SW ? sws : w, lane);
}

extern "C" __global__ void __launch_bounds__(32 * BATON_OPS_ROUTER_WARPS)
baton_ops_router_route(baton_ops_router_route_args a)
{
	PDL_GO();
	router_route<BATON_OPS_ROUTER_WARPS>(a);
}
