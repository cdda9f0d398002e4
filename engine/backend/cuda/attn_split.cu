/*
 * attn_split.cu: attention on the CUDA cores, the keys of each query
 * split into chunks whose partial results are merged: the kernels of the
 * attention, attention_segs and qk_attention_segs slots of
 * engine/backend/backend.h (argument blocks in ops.h), which
 * attn_split_launch.c loads from the embedded fatbin and launches.
 * baton_ops_attn_part and baton_ops_attn_combine: a query of one chunk
 * of 256 keys in the host's order, longer ones merged by the second
 * kernel; baton_ops_attn_rows: query rows of any sequences in one
 * launch, flash-decoding style, the last chunk to finish merging them;
 * baton_ops_attn_nr<NH>: the rows kernel for decode rows fused with
 * qk_norm_rope and its store (ops.cuh's head_nr: its bits). Passes of
 * 64 rows or more take the tensor cores instead (attn.cu, tc_launch.c).
 */
#include <math.h>
#include <stdint.h>

#include "engine/backend/cuda/ops.cuh"
#include "engine/backend/cuda/ops.h"

static_assert(sizeof(baton_ops_attention_args) == 96, "attention args layout");
static_assert(sizeof(baton_ops_attn_rows_args) == 112, "attention rows args layout");
static_assert(sizeof(baton_ops_attn_nr_args) == 168, "attention nr args layout");
static_assert(BATON_OPS_ATTN_CHUNK == BATON_OPS_WARPS * 32, "a thread per key of a chunk");

/* Key j's row in the cache: through the block table, or row j. */
__device__ __forceinline__ uint64_t key_row(const baton_ops_attention_args &a, uint64_t j)
{
	if (!a.blocks)
		return j;
	return (uint64_t)((const uint32_t *)a.blocks)[j / a.block_size] * a.block_size +
	    j % a.block_size;
}

/* The max of the block's v (one per thread) as the host's `p > max`
 * finds it: NaN never taken; every thread gets it. */
__device__ __forceinline__ float block_max(float m, float *red)
{
	const uint32_t tid = threadIdx.x;
	red[tid] = m;
	__syncthreads();
	for (uint32_t s = THREADS / 2; s > 0; s >>= 1) {
		if (tid < s && red[tid + s] > red[tid])
			red[tid] = red[tid + s];
		__syncthreads();
	}
	m = red[0];
	__syncthreads();
	return m;
}

/* Block (t, h, c): keys c * chunk .. of query q0 + t, head h. The scores
 * by warps (a fixed-order dot each), their max, expf, the sum in key order
 * by one thread, the output by dimension, each a sum over keys in order.
 * One chunk (nk <= chunk): the host's sequence exactly, p = e / sum before
 * the products. More: the chunk's max m, sum s and o = sum e * v go to
 * part for the combine. Which chunks a query has depends on its position
 * alone, so its bits do not depend on the other queries of the launch. */
extern "C" __global__ void __launch_bounds__(THREADS)
baton_ops_attn_part(baton_ops_attention_args a)
{
	__shared__ float sc[BATON_OPS_ATTN_CHUNK];
	__shared__ uint64_t krow[BATON_OPS_ATTN_CHUNK];
	__shared__ float red[THREADS];
	__shared__ float total;
	if (!a.n_heads || !a.n_kv_heads || !a.head_dim)
		return;
	const uint32_t H = a.n_heads, KH = a.n_kv_heads, hd = a.head_dim, CH = BATON_OPS_ATTN_CHUNK;
	const uint32_t t = a.q0 + blockIdx.x, h = blockIdx.y, c = blockIdx.z;
	const uint32_t pos0 = a.pos0_dev ? *(const uint32_t *)a.pos0_dev : a.pos0;
	const uint64_t nk = (uint64_t)pos0 + t + 1, j0 = (uint64_t)c * CH;
	if (j0 >= nk)
		return; /* the whole block: this query has fewer chunks */
	const uint32_t n = (uint32_t)(nk - j0 < CH ? nk - j0 : CH);
	const uint32_t kvh = h / (H / KH), tid = threadIdx.x;
	const float *q = (const float *)a.q + ((uint64_t)t * H + h) * hd;
	const float *k = (const float *)a.k, *v = (const float *)a.v;
	/* the keys' rows once, so that no load below waits on the table's */
	for (uint32_t j = tid; j < n; j += THREADS)
		krow[j] = key_row(a, j0 + j);
	__syncthreads();

	/* two keys a warp at a time, each lane's loads of both in flight */
	for (uint32_t j = tid >> 5; j < n; j += 2 * WARPS) {
		const int two = j + WARPS < n;
		float d[2];
		warp_dot_f32_u<4>(k + (krow[j] * KH + kvh) * hd,
		    two ? k + (krow[j + WARPS] * KH + kvh) * hd : NULL, q, hd, d);
		if ((tid & 31) == 0) {
			sc[j] = __fmul_rn(d[0], a.scale);
			if (two)
				sc[j + WARPS] = __fmul_rn(d[1], a.scale);
		}
	}
	__syncthreads();
	const float m = block_max(tid < n ? sc[tid] : -INFINITY, red);
	if (tid < n)
		sc[tid] = expf(__fsub_rn(sc[tid], m));
	__syncthreads();
	if (tid == 0) {
		float s = 0.0f;
		for (uint32_t j = 0; j < n; j++)
			s = __fadd_rn(s, sc[j]);
		total = s;
	}
	__syncthreads();
	const float sum = total;
	const int whole = nk <= CH;
	if (whole && tid < n)
		sc[tid] = __fdiv_rn(sc[tid], sum);
	__syncthreads();
	float *out = whole ? (float *)a.out + ((uint64_t)t * H + h) * hd :
	    (float *)a.part + (((uint64_t)blockIdx.x * H + h) * a.chunks + c) * (hd + 2);
	for (uint32_t d = tid; d < hd; d += THREADS) {
		/* the keys in order, OUT_U values loaded before they are added */
		constexpr uint32_t OUT_U = 16;
		float o = 0.0f;
		uint32_t j = 0;
		for (; j + OUT_U <= n; j += OUT_U) {
			float vv[OUT_U];
#pragma unroll
			for (uint32_t u = 0; u < OUT_U; u++)
				vv[u] = v[(krow[j + u] * KH + kvh) * hd + d];
#pragma unroll
			for (uint32_t u = 0; u < OUT_U; u++)
				o = __fadd_rn(o, __fmul_rn(sc[j + u], vv[u]));
		}
		for (; j < n; j++)
			o = __fadd_rn(o, __fmul_rn(sc[j], v[(krow[j] * KH + kvh) * hd + d]));
		out[d] = o;
	}
	if (!whole && tid == 0) {
		out[hd] = m;
		out[hd + 1] = sum;
	}
}

/* Queries of more than one chunk: M = the max of the chunks' m (in chunk
 * order, NaN never taken), w_c = expf(m_c - M), S = sum of s_c * w_c and
 * out = (sum of o_c * w_c) / S, both sums in chunk order. */
extern "C" __global__ void __launch_bounds__(THREADS)
baton_ops_attn_combine(baton_ops_attention_args a)
{
	if (!a.n_heads || !a.head_dim)
		return;
	const uint32_t H = a.n_heads, hd = a.head_dim, CH = BATON_OPS_ATTN_CHUNK;
	const uint32_t t = a.q0 + blockIdx.x, h = blockIdx.y;
	const uint32_t pos0 = a.pos0_dev ? *(const uint32_t *)a.pos0_dev : a.pos0;
	const uint64_t nk = (uint64_t)pos0 + t + 1;
	if (nk <= CH)
		return; /* finished by the part kernel */
	const uint32_t nc = (uint32_t)((nk + CH - 1) / CH);
	const float *p = (const float *)a.part + ((uint64_t)blockIdx.x * H + h) * a.chunks * (hd + 2);
	float M = -INFINITY;
	for (uint32_t c = 0; c < nc; c++)
		if (p[c * (hd + 2) + hd] > M)
			M = p[c * (hd + 2) + hd];
	float S = 0.0f;
	for (uint32_t c = 0; c < nc; c++)
		S = __fadd_rn(S, __fmul_rn(p[c * (hd + 2) + hd + 1],
		    expf(__fsub_rn(p[c * (hd + 2) + hd], M))));
	float *out = (float *)a.out + ((uint64_t)t * H + h) * hd;
	for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
		float o = 0.0f;
		for (uint32_t c = 0; c < nc; c++)
			o = __fadd_rn(o, __fmul_rn(p[c * (hd + 2) + d],
			    expf(__fsub_rn(p[c * (hd + 2) + hd], M))));
		out[d] = __fdiv_rn(o, S);
	}
}

#define AR_CH BATON_OPS_AR_CHUNK
#define AR_NH BATON_OPS_AR_HEADS
#define AR_T BATON_OPS_AR_THREADS
#define AR_W (AR_T / 32)
#define AR_HD BATON_OPS_AR_HD_MAX
static_assert(AR_CH == 64, "the softmax takes a chunk's keys as two per lane");
static_assert(AR_CH % (AR_W * 8) == 0, "the scores take 8 keys a warp at a time");

/* The max of a warp's values (every lane gets it; NaN never taken). */
__device__ __forceinline__ float warp_max(float m)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
	return m;
}

__device__ __forceinline__ float warp_sum(float s)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		s += __shfl_xor_sync(0xffffffffu, s, off);
	return s;
}

/* Block (r, y, c) of ops.h's baton_ops_attn_rows: a chunk of one row's
 * keys for a tile of the query heads of one KV head. Scores: four lanes
 * a key (each a quarter of the dims, float4 loads, every head of the tile
 * against the one key load), eight keys a warp at a time; the softmax of
 * each head by a warp (two keys a lane); the output by warps over keys
 * (lane: 4 dims, float4 loads of each value row once for every head),
 * the four warps' sums added in warp order. Fused multiply-adds and tree
 * sums: not the host's order (the tolerance holds it), but a fixed one
 * that depends on the row's position and data alone. */
__device__ __forceinline__ const baton_ops_attn_rows_args &ar_of(const baton_ops_attn_rows_args &a)
{
	return a;
}

__device__ __forceinline__ const baton_ops_attn_rows_args &ar_of(const baton_ops_attn_nr_args &a)
{
	return a.ar;
}

/* The rows kernel's body for tiles of NH query heads (the same bits for
 * any NH: a head's sums do not depend on the others of its tile). NR:
 * the rows are decode rows whose q and new k come raw from the q/k/v
 * matmuls (baton_ops_attn_nr_args): each block norms and rotates its
 * heads' q in shared memory with qk_norm_rope's functions (head_nr: its
 * bits), and the block holding the row's last key norms and rotates
 * that key and stores it and its v row to the cache before any key is
 * read (qk_norm_rope's store, so the same cache bits). */
template <int NH, bool NR, typename A>
__device__ __forceinline__ void attn_rows_t(const A &aa)
{
	const baton_ops_attn_rows_args &a = ar_of(aa);
	__shared__ __align__(16) float qs[NH * AR_HD];
	__shared__ __align__(16) float big[AR_W * NH * AR_HD]; /* the warps' outputs, then the merge's weights */
	__shared__ float sc[NH][AR_CH];                        /* scores, then their exps */
	__shared__ uint64_t krow[AR_CH];
	__shared__ float mx[NH], sm[NH];
	__shared__ uint32_t last;
	__shared__ __align__(16) float ks[NR ? AR_HD : 1];
	asm volatile("griddepcontrol.launch_dependents;"); /* as baton_ops_rmsnorm_row's */
	if (!a.n_heads || !a.n_kv_heads || !a.head_dim || !a.tiles)
		return;
	const uint32_t H = a.n_heads, KH = a.n_kv_heads, hd = a.head_dim, G = H / KH;
	const uint32_t tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
	const uint32_t r = blockIdx.x, kvh = blockIdx.y / a.tiles;
	const uint32_t h0 = kvh * G + (blockIdx.y % a.tiles) * NH;
	const uint32_t nh = kvh * G + G - h0 < NH ? kvh * G + G - h0 : NH;
	const uint32_t *ri = (const uint32_t *)a.rows + 4 * (uint64_t)r;
	const uint32_t qrow = ri[0], toff = ri[2];
	const uint64_t nk = (uint64_t)ri[1] + 1, j0 = (uint64_t)blockIdx.z * AR_CH;
	if (j0 >= nk)
		return; /* this row has fewer chunks (a graph's bucket) */
	const uint32_t n = (uint32_t)(nk - j0 < AR_CH ? nk - j0 : AR_CH);
	const uint32_t nc = (uint32_t)((nk + AR_CH - 1) / AR_CH);
	const uint64_t rowf = (uint64_t)KH * hd;
	const float *kc = (const float *)a.k + (uint64_t)kvh * hd;
	const float *vc = (const float *)a.v + (uint64_t)kvh * hd;
	{
		const float4 *qg = (const float4 *)((const float *)a.q + ((uint64_t)qrow * H + h0) * hd);
		for (uint32_t i = tid; i < nh * hd / 4; i += AR_T)
			((float4 *)qs)[i] = qg[i];
	}
	for (uint32_t j = tid; j < n; j += AR_T) {
		const uint64_t jj = j0 + j;
		krow[j] = a.tab ? (uint64_t)((const uint32_t *)a.tab)[toff + jj / a.block_size] *
		        a.block_size + jj % a.block_size : jj;
		if constexpr (NR) {
			/* the key's k and v rows on their way to L2 while q is normed
			 * (the new key's too: its store lands in L2 as well) */
			const float *kp = kc + krow[j] * rowf, *vp = vc + krow[j] * rowf;
			for (uint32_t d = 0; d < hd; d += 32) {
				asm volatile("prefetch.global.L2 [%0];" ::"l"(kp + d));
				asm volatile("prefetch.global.L2 [%0];" ::"l"(vp + d));
			}
		}
	}
	if constexpr (NR) {
		/* q's heads of the tile (and, in the last chunk, the new key) by
		 * a warp each: qk_norm_rope's arithmetic in shared memory */
		const bool dok = blockIdx.z == nc - 1;
		const float p = (float)ri[1];
		if (dok && warp == nh % AR_W)
			for (uint32_t i = lane; i < hd; i += 32)
				ks[i] = ((const float *)aa.kn)[(uint64_t)qrow * rowf + (uint64_t)kvh * hd + i];
		__syncthreads(); /* qs (and ks) loaded */
		for (uint32_t it = warp; it < nh + (dok ? 1u : 0u); it += AR_W) {
			const bool isk = it == nh;
			head_nr(isk ? ks : qs + it * hd, isk ? aa.wk : aa.wq, isk ? aa.wk_dtype : aa.wq_dtype,
			    hd, aa.eps, p, (const float *)aa.inv_freq, aa.mscale, lane);
			if (isk) {
				__syncwarp(); /* the rotated row, before it is stored */
				const uint64_t pj = ri[1], srow = a.tab ?
				    (uint64_t)((const uint32_t *)a.tab)[toff + pj / a.block_size] * a.block_size +
				        pj % a.block_size : pj;
				const float *vr = (const float *)aa.vn + (uint64_t)qrow * rowf + (uint64_t)kvh * hd;
				float *kd = (float *)a.k + srow * rowf + (uint64_t)kvh * hd;
				float *vd = (float *)a.v + srow * rowf + (uint64_t)kvh * hd;
				for (uint32_t i = lane; i < hd; i += 32) {
					kd[i] = ks[i];
					vd[i] = vr[i];
				}
			}
		}
	}
	__syncthreads(); /* krow, qs; with NR the new key's row stored (visible to the block) */

	for (uint32_t jb = warp * 8; jb < n; jb += AR_W * 8) {
		const uint32_t j = jb + (lane >> 2);
		float acc[NH];
#pragma unroll
		for (uint32_t h = 0; h < NH; h++)
			acc[h] = 0.0f;
		if (j < n) {
			const float *kr = kc + krow[j] * rowf;
#pragma unroll 8
			for (uint32_t d = (lane & 3) * 4; d < hd; d += 16) {
				const float4 kv = *(const float4 *)(kr + d);
#pragma unroll
				for (uint32_t h = 0; h < NH; h++) {
					const float4 qv = *(const float4 *)(qs + h * hd + d);
					acc[h] = fmaf(kv.x, qv.x, acc[h]);
					acc[h] = fmaf(kv.y, qv.y, acc[h]);
					acc[h] = fmaf(kv.z, qv.z, acc[h]);
					acc[h] = fmaf(kv.w, qv.w, acc[h]);
				}
			}
		}
#pragma unroll
		for (uint32_t h = 0; h < NH; h++) {
			acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
			acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 2);
		}
		if ((lane & 3) == 0 && j < n)
			for (uint32_t h = 0; h < nh; h++)
				sc[h][j] = acc[h] * a.scale;
	}
	__syncthreads();
	for (uint32_t h = warp; h < nh; h += AR_W) {
		const float s0 = lane < n ? sc[h][lane] : -INFINITY;
		const float s1 = lane + 32 < n ? sc[h][lane + 32] : -INFINITY;
		const float m = warp_max(fmaxf(s0, s1));
		const float e0 = lane < n ? expf(s0 - m) : 0.0f;
		const float e1 = lane + 32 < n ? expf(s1 - m) : 0.0f;
		sc[h][lane] = e0;
		sc[h][lane + 32] = e1;
		const float sum = warp_sum(e0 + e1);
		if (lane == 0) {
			mx[h] = m;
			sm[h] = sum;
		}
	}
	__syncthreads();
	for (uint32_t d = lane * 4; d < hd; d += 128) {
		float4 o[NH];
#pragma unroll
		for (uint32_t h = 0; h < NH; h++)
			o[h] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
		for (uint32_t j = warp; j < n; j += AR_W) {
			const float4 vv = *(const float4 *)(vc + krow[j] * rowf + d);
#pragma unroll
			for (uint32_t h = 0; h < NH; h++) {
				const float e = sc[h][j];
				o[h].x = fmaf(e, vv.x, o[h].x);
				o[h].y = fmaf(e, vv.y, o[h].y);
				o[h].z = fmaf(e, vv.z, o[h].z);
				o[h].w = fmaf(e, vv.w, o[h].w);
			}
		}
		for (uint32_t h = 0; h < nh; h++)
			*(float4 *)(big + (warp * NH + h) * hd + d) = o[h];
	}
	__syncthreads();
	const int whole = nc == 1;
	float *out = (float *)a.out;
	float *part = (float *)a.part + ((uint64_t)r * H + h0) * a.chunks * (hd + 2);
	const uint64_t pstride = (uint64_t)a.chunks * (hd + 2); /* from one head to the next */
	for (uint32_t i = tid; i < nh * hd; i += AR_T) {
		const uint32_t h = i / hd, d = i % hd;
		float o = big[h * hd + d];
		for (uint32_t w = 1; w < AR_W; w++)
			o += big[(w * NH + h) * hd + d];
		if (whole) {
			const uint64_t oi = ((uint64_t)qrow * H + h0 + h) * hd + d;
			out[oi] = o / sm[h];
			if (a.oq) /* i steps by whole warps: nh * hd % 32 == 0 */
				quant_warp(out[oi], (int8_t *)a.oq, (float *)a.od, oi, lane);
		} else {
			part[h * pstride + (uint64_t)blockIdx.z * (hd + 2) + d] = o;
		}
	}
	if (whole)
		return;
	if (tid < nh) {
		part[tid * pstride + (uint64_t)blockIdx.z * (hd + 2) + hd] = mx[tid];
		part[tid * pstride + (uint64_t)blockIdx.z * (hd + 2) + hd + 1] = sm[tid];
	}
	/* the last of the row's chunks to finish merges them (the CUDA
	 * samples' threadFenceReduction): in chunk order, whichever it is */
	__threadfence();
	__syncthreads();
	uint32_t *cnt = (uint32_t *)a.cnt + (uint64_t)r * gridDim.y + blockIdx.y;
	if (tid == 0)
		last = atomicAdd(cnt, 1u) == nc - 1;
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	const int fit = nh * nc <= AR_W * NH * AR_HD; /* the chunks' weights in big */
	for (uint32_t h = warp; h < nh; h += AR_W) {
		const float *ph = part + h * pstride;
		float m = -INFINITY;
		for (uint32_t c = lane; c < nc; c += 32)
			m = fmaxf(m, __ldcg(ph + (uint64_t)c * (hd + 2) + hd));
		m = warp_max(m);
		float s = 0.0f;
		for (uint32_t c = lane; c < nc; c += 32) {
			const float w = expf(__ldcg(ph + (uint64_t)c * (hd + 2) + hd) - m);
			if (fit)
				big[h * nc + c] = w;
			s = fmaf(__ldcg(ph + (uint64_t)c * (hd + 2) + hd + 1), w, s);
		}
		s = warp_sum(s);
		if (lane == 0) {
			mx[h] = m;
			sm[h] = s;
		}
	}
	__syncthreads();
	for (uint32_t i = tid; i < nh * hd; i += AR_T) { /* warp-uniform: nh * hd % 32 == 0 */
		const uint32_t h = i / hd, d = i % hd;
		const float *ph = part + h * pstride;
		float o = 0.0f;
		for (uint32_t c = 0; c < nc; c++) {
			const float *pc = ph + (uint64_t)c * (hd + 2);
			const float w = fit ? big[h * nc + c] : expf(__ldcg(pc + hd) - mx[h]);
			o = fmaf(__ldcg(pc + d), w, o);
		}
		const uint64_t oi = ((uint64_t)qrow * H + h0 + h) * hd + d;
		out[oi] = o / sm[h];
		if (a.oq)
			quant_warp(out[oi], (int8_t *)a.oq, (float *)a.od, oi, lane);
	}
	if (tid == 0)
		*cnt = 0; /* for the next launch */
}

extern "C" __global__ void __launch_bounds__(AR_T)
baton_ops_attn_rows(baton_ops_attn_rows_args a)
{
	attn_rows_t<AR_NH, false>(a);
}

/* the decode rows' fused kernels, by heads a block (ops.h) */
#define BATON_ATTN_NR(NH)                                                      \
	extern "C" __global__ void __launch_bounds__(AR_T)                     \
	baton_ops_attn_nr##NH(baton_ops_attn_nr_args a) { attn_rows_t<NH, true>(a); }
BATON_ATTN_NR(1)
BATON_ATTN_NR(2)
BATON_ATTN_NR(4)
BATON_ATTN_NR(8)
