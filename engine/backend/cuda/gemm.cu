/*
 * gemm.cu: the small kernels around the tensor-core GEMMs of tc_launch.c
 * (argument blocks in tc.h): weights of every dtype decoded to bf16,
 * f32 activation rows to bf16 (gathered through a map for the MoE
 * experts), the experts' rows planned on the device, the bias, SwiGLU from a GEMM's f32 output to bf16, and the
 * experts' outputs, weighted, added into each token's row. Not the host's
 * order: these feed cuBLAS, whose sums are its own (docs/internals/cuda-ops.md,
 * "Prefill on the tensor cores").
 */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/tc.h"

static_assert(sizeof(baton_tc_dequant_args) == 72, "dequant args layout");
static_assert(sizeof(baton_tc_rows_args) == 40, "rows args layout");
static_assert(sizeof(baton_tc_bias_args) == 32, "bias args layout");
static_assert(sizeof(baton_tc_plan_args) == 48, "plan args layout");
static_assert(sizeof(baton_tc_swiglu_args) == 24, "swiglu args layout");
static_assert(sizeof(baton_tc_combine_args) == 48, "combine args layout");
static_assert(sizeof(baton_tc_mm_f32_args) == 40, "mm f32 args layout");

__device__ __forceinline__ uint32_t bf_bits(float a)
{
	return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a));
}

__device__ __forceinline__ uint32_t bf_pair(float a, float b)
{
	return bf_bits(a) | (bf_bits(b) << 16);
}

__device__ __forceinline__ void store8(unsigned short *dst, const float v[8])
{
	uint4 o;
	o.x = bf_pair(v[0], v[1]);
	o.y = bf_pair(v[2], v[3]);
	o.z = bf_pair(v[4], v[5]);
	o.w = bf_pair(v[6], v[7]);
	*(uint4 *)dst = o;
}

/* Eight elements e0 .. e0 + 7 of a row (e0 % 8 == 0). */
__device__ __forceinline__ void decode8(const uint8_t *row, uint32_t dt, uint32_t e0, uint32_t vec,
    float v[8])
{
	if (vec) {
		switch (dt) {
		case BATON_DT_Q4_K:
			kq_w8<BATON_DT_Q4_K>(row + (uint64_t)(e0 / 256) * 144, (e0 % 256) / 8, v);
			return;
		case BATON_DT_Q5_K:
			kq_w8<BATON_DT_Q5_K>(row + (uint64_t)(e0 / 256) * 176, (e0 % 256) / 8, v);
			return;
		case BATON_DT_Q6_K:
			kq_w8<BATON_DT_Q6_K>(row + (uint64_t)(e0 / 256) * 210, (e0 % 256) / 8, v);
			return;
		case BATON_DT_Q8_0: {
			const uint8_t *b = row + (uint64_t)(e0 / 32) * 34;
			const float d = f16f(__ldg((const unsigned short *)b));
			const unsigned short *q = (const unsigned short *)(b + 2 + e0 % 32);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				const uint32_t u = __ldg(q + i);
				v[2 * i] = d * (float)(int8_t)(u & 0xff);
				v[2 * i + 1] = d * (float)(int8_t)(u >> 8);
			}
			return;
		}
		case BATON_DT_F16:
		case BATON_DT_BF16: {
			const unsigned short *p = (const unsigned short *)(row + 2ull * e0);
#pragma unroll
			for (int i = 0; i < 8; i++) {
				const uint32_t u = __ldg(p + i);
				v[i] = dt == BATON_DT_F16 ? f16f(u) : bf16f(u);
			}
			return;
		}
		}
	}
#pragma unroll
	for (int i = 0; i < 8; i++)
		v[i] = elem(row, dt, e0 + i);
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_dequant(const baton_tc_dequant_args a)
{
	const uint32_t per_row = a.cols / 8;
	const uint64_t units = (uint64_t)a.rows * per_row;
	const uint32_t z = blockIdx.y;
	const uint8_t *base = (const uint8_t *)(a.table ? ((const uint64_t *)a.table)[z] : a.src) +
	    a.src_off;
	unsigned short *dst = (unsigned short *)a.dst + (uint64_t)z * a.dst_stride +
	    a.dst_row0 * a.cols;
	if (units <= 0xffffffffull - (uint64_t)gridDim.x * blockDim.x) {
		/* 32-bit division: a 64-bit one per 8 weights was a good part of
		 * the kernel's instructions */
		for (uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < (uint32_t)units;
		     u += gridDim.x * blockDim.x) {
			const uint32_t r = u / per_row, e0 = (u - r * per_row) * 8;
			float v[8];
			decode8(base + (uint64_t)r * a.row_bytes, a.dtype, e0, a.vec, v);
			store8(dst + (uint64_t)r * a.cols + e0, v);
		}
		return;
	}
	for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
	     u += (uint64_t)gridDim.x * blockDim.x) {
		const uint64_t r = u / per_row;
		const uint32_t e0 = (uint32_t)(u % per_row) * 8;
		float v[8];
		decode8(base + r * a.row_bytes, a.dtype, e0, a.vec, v);
		store8(dst + r * a.cols + e0, v);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_rows(const baton_tc_rows_args a)
{
	const uint32_t per_row = a.cols / 8;
	const uint64_t units = (uint64_t)a.rows * per_row; /* < 2^28: tc_launch.c's bounds */
	const uint32_t *map = (const uint32_t *)a.map;
	for (uint32_t u = blockIdx.x * blockDim.x + threadIdx.x; u < (uint32_t)units;
	     u += gridDim.x * blockDim.x) {
		const uint32_t r = u / per_row, c = (u - r * per_row) * 8;
		float v[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
		const uint32_t m = map ? map[r] : r;
		if (m != BATON_TC_NONE) {
			const float *s = (const float *)a.src + (uint64_t)(map ? m / a.div : m) * a.src_ld + c;
#pragma unroll
			for (int i = 0; i < 8; i++)
				v[i] = s[i];
		}
		store8((unsigned short *)a.dst + (uint64_t)r * a.cols + c, v);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_bias(const baton_tc_bias_args a)
{
	const uint64_t n = (uint64_t)a.rows * a.n_out;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		((float *)a.y)[i] += elem((const uint8_t *)a.b, a.b_dtype, (uint32_t)(i % a.n_out));
}

/* Eight elements a thread, 32-bit indices (rows * f < 2^31: tc_launch.c
 * checks), 16-byte loads and one 16-byte store. */
extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_swiglu(const baton_tc_swiglu_args a)
{
	const uint32_t f8 = a.f / 8, n = a.rows * f8;
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		const uint32_t r = i / f8, c = (i % f8) * 8;
		const float4 *g4 = (const float4 *)((const float *)a.gu + (uint64_t)r * 2 * a.f + c);
		const float4 *u4 = (const float4 *)((const float *)a.gu + (uint64_t)r * 2 * a.f + a.f + c);
		const float4 ga = g4[0], gb = g4[1], ua = u4[0], ub = u4[1];
		const float g[8] = { ga.x, ga.y, ga.z, ga.w, gb.x, gb.y, gb.z, gb.w };
		const float u[8] = { ua.x, ua.y, ua.z, ua.w, ub.x, ub.y, ub.z, ub.w };
		float v[8];
#pragma unroll
		for (int j = 0; j < 8; j++)
			v[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
		store8((unsigned short *)a.h + (uint64_t)r * a.f + c, v);
	}
}

extern "C" __global__ void __launch_bounds__(BATON_TC_THREADS)
baton_tc_combine(const baton_tc_combine_args a)
{
	const uint32_t c4 = a.cols / 4;
	const uint32_t *prow = (const uint32_t *)a.prow;
	const float *w = (const float *)a.w;
	const float4 *o = (const float4 *)a.o;
	for (uint32_t t = blockIdx.y; t < a.tokens; t += gridDim.y)
		for (uint32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < c4;
		     c += gridDim.x * blockDim.x) {
			float4 *xp = (float4 *)a.x + (uint64_t)t * c4 + c;
			float4 s = *xp;
			for (uint32_t k = 0; k < a.top_k; k++) {
				const uint32_t p = t * a.top_k + k;
				const float wp = w[p];
				const float4 v = o[(uint64_t)prow[p] * c4 + c];
				s.x = __fadd_rn(s.x, __fmul_rn(wp, v.x));
				s.y = __fadd_rn(s.y, __fmul_rn(wp, v.y));
				s.z = __fadd_rn(s.z, __fmul_rn(wp, v.z));
				s.w = __fadd_rn(s.w, __fmul_rn(wp, v.w));
			}
			*xp = s;
		}
}

/* The contract's tree over the 32 lanes (ops.cuh's lane_tree). */
__device__ __forceinline__ float tree32(float s)
{
#pragma unroll
	for (int off = 16; off > 0; off >>= 1)
		s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
	return s;
}

extern "C" __global__ void __launch_bounds__(32 * BATON_TC_MMF_WARPS)
baton_tc_mm_f32(baton_tc_mm_f32_args a)
{
	enum { R = BATON_TC_MMF_R, O = BATON_TC_MMF_O };
	const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const uint32_t o0 = (blockIdx.x * BATON_TC_MMF_WARPS + warp) * O, r0 = blockIdx.y * R;
	if (o0 >= a.n_out || r0 >= a.rows)
		return; /* the whole warp */
	const uint32_t k = a.k;
	const float *x = (const float *)a.x, *w = (const float *)a.w;
	/* rows and outputs past the ends repeat the last one (not written) */
	const float *xr[R], *wr[O];
#pragma unroll
	for (int t = 0; t < R; t++)
		xr[t] = x + (uint64_t)min(r0 + t, a.rows - 1) * k;
#pragma unroll
	for (int j = 0; j < O; j++)
		wr[j] = w + (uint64_t)min(o0 + j, a.n_out - 1) * k;
	float acc[R][O];
#pragma unroll
	for (int t = 0; t < R; t++)
#pragma unroll
		for (int j = 0; j < O; j++)
			acc[t][j] = 0.0f;
#pragma unroll 2
	for (uint32_t i = lane; i < k; i += 32) {
		float xv[R], wv[O];
#pragma unroll
		for (int t = 0; t < R; t++)
			xv[t] = __ldg(xr[t] + i);
#pragma unroll
		for (int j = 0; j < O; j++)
			wv[j] = __ldg(wr[j] + i);
#pragma unroll
		for (int t = 0; t < R; t++)
#pragma unroll
			for (int j = 0; j < O; j++)
				acc[t][j] = __fadd_rn(acc[t][j], __fmul_rn(wv[j], xv[t]));
	}
#pragma unroll
	for (int t = 0; t < R; t++)
#pragma unroll
		for (int j = 0; j < O; j++)
			acc[t][j] = tree32(acc[t][j]);
	/* lane t * O + j writes (row t, output j): one store each */
#pragma unroll
	for (int t = 0; t < R; t++)
#pragma unroll
		for (int j = 0; j < O; j++)
			if (lane == (uint32_t)((t * O + j) & 31) && r0 + t < a.rows && o0 + j < a.n_out) {
				float *y = (float *)a.y + (uint64_t)(r0 + t) * a.n_out + o0 + j;
				*y = a.accumulate ? __fadd_rn(*y, acc[t][j]) : acc[t][j];
			}
}

/* A chunk of 1024 pairs at a time: within a warp, a pair's rank among
 * the lanes of its expert below it (match_any); across the chunk's warps,
 * each warp's count per expert turned into its start; so every expert's
 * pairs keep p order, whatever the scheduling (the same rows every run). */
extern "C" __global__ void __launch_bounds__(1024)
baton_tc_plan(const baton_tc_plan_args a)
{
	enum { EM = BATON_TC_PLAN_E_MAX, W = 32 };
	__shared__ uint32_t cnt[EM + 1], tb[EM + 1], wc[W][EM];
	const uint32_t tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, E = a.n_experts;
	const uint32_t *ids = (const uint32_t *)a.ids;
	uint32_t *prow = (uint32_t *)a.prow, *rowmap = (uint32_t *)a.rowmap;
	uint4 *tiles = (uint4 *)a.tiles;
	for (uint32_t e = tid; e < E; e += blockDim.x)
		cnt[e] = 0;
	for (uint32_t c0 = 0; c0 < a.n; c0 += blockDim.x) {
		for (uint32_t i = tid; i < W * E; i += blockDim.x)
			wc[i / E][i % E] = 0;
		__syncthreads();
		const uint32_t p = c0 + tid;
		const bool on = p < a.n;
		/* an id past the experts (never from route_dev) is clamped: the
		 * pass's accounting on the host refuses it afterwards */
		const uint32_t id = on ? min(ids[p], E - 1) : 0xffffffffu;
		const uint32_t same = __match_any_sync(0xffffffffu, id);
		const uint32_t rk = __popc(same & ((1u << lane) - 1));
		if (on && rk == 0)
			wc[warp][id] = __popc(same);
		__syncthreads();
		for (uint32_t e = tid; e < E; e += blockDim.x) {
			uint32_t run = cnt[e];
			for (uint32_t w = 0; w < W; w++) {
				const uint32_t t = wc[w][e];
				wc[w][e] = run;
				run += t;
			}
			cnt[e] = run;
		}
		__syncthreads();
		if (on)
			prow[p] = wc[warp][id] + rk; /* the rank within its expert */
		__syncthreads();
	}
	if (tid == 0) { /* cnt becomes each expert's first row, tb its first tile */
		uint32_t r = 0, t = 0;
		for (uint32_t e = 0; e < E; e++) {
			const uint32_t c = cnt[e];
			cnt[e] = r, tb[e] = t;
			r += c, t += (c + a.tile_rows - 1) / a.tile_rows;
		}
		cnt[E] = r, tb[E] = t;
	}
	__syncthreads();
	for (uint32_t p = tid; p < a.n; p += blockDim.x) {
		const uint32_t r = cnt[min(ids[p], E - 1)] + prow[p];
		prow[p] = r;
		rowmap[r] = p;
	}
	for (uint32_t e = tid; e < E; e += blockDim.x) {
		const uint32_t r0 = cnt[e], c = cnt[e + 1] - r0;
		for (uint32_t t = 0; t * a.tile_rows < c; t++) {
			const uint32_t left = c - t * a.tile_rows;
			tiles[tb[e] + t] = make_uint4(r0 + t * a.tile_rows,
			    left < a.tile_rows ? left : a.tile_rows, e, 0);
		}
	}
	for (uint32_t i = tb[E] + tid; i < a.max_tiles; i += blockDim.x)
		tiles[i] = make_uint4(0, 0, 0, 0);
}
