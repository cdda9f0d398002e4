/*
 * ops.cu: the row ops of the forward pass on the cuda backend (embedding
 * rows, RMSNorm, matmul, RoPE, qk_norm_rope, the KV store, SwiGLU, add),
 * slots of engine/backend/backend.h; ops_launch.c loads them from the
 * embedded fatbin and launches them. Attention is attn_split.cu's and
 * routing route.cu's; the device functions they share are ops.cuh's.
 *
 * Simple kernels, in the host's arithmetic (engine/backend/host/ops.c): every dot
 * is the fixed 32-lane order of host/host.h done by one warp (see
 * ops.h), multiplies and adds written as __fmul_rn / __fadd_rn so
 * that nvcc fuses none of them, divisions and square roots IEEE. What
 * differs from the host is expf, sinf and cosf (the device's, a couple of
 * ulp apart), which docs/internals/model.md's tolerance covers.
 */
#include <math.h>
#include <stdint.h>

#include "arena/arena.h"
#include "engine/backend/cuda/dtype.cuh"
#include "engine/backend/cuda/ops.cuh"
#include "engine/backend/cuda/ops.h"

static_assert(sizeof(baton_ops_embed_args) == 48, "embed args layout");
static_assert(sizeof(baton_ops_rmsnorm_args) == 40, "rmsnorm args layout");
static_assert(sizeof(baton_ops_rmsnorm_row_args) == 56, "rmsnorm row args layout");
static_assert(sizeof(baton_ops_matmul_args) == 72, "matmul args layout");
static_assert(sizeof(baton_ops_rope_args) == 40, "rope args layout");
static_assert(sizeof(baton_ops_qk_norm_rope_args) == 112, "qk norm rope args layout");
static_assert(sizeof(baton_ops_kv_store_args) == 48, "kv_store args layout");
static_assert(sizeof(baton_ops_swiglu_args) == 32, "swiglu args layout");
static_assert(sizeof(baton_ops_add_args) == 32, "add args layout");
static_assert(BATON_OPS_NT == 8, "the matmul kernels are made for 1 and 8 rows");

extern "C" __global__ void __launch_bounds__(256)
baton_ops_embed(baton_ops_embed_args a)
{
	if (blockIdx.x >= a.n)
		return;
	const uint32_t tok = ((const uint32_t *)a.tokens)[blockIdx.x];
	const uint8_t *row = (const uint8_t *)a.table + (uint64_t)tok * a.row_bytes;
	float *out = (float *)a.out + (uint64_t)blockIdx.x * a.cols;
	for (uint32_t i = threadIdx.x; i < a.cols; i += blockDim.x)
		out[i] = elem(row, a.dtype, i);
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_ops_rmsnorm(baton_ops_rmsnorm_args a)
{
	const uint32_t r = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (r >= a.rows)
		return; /* the whole warp */
	const float *x = (const float *)a.x + (uint64_t)r * a.cols;
	float *out = (float *)a.out + (uint64_t)r * a.cols;
	float ss2[2];
	warp_dot_f32_u<NORM_U>(x, NULL, x, a.cols, ss2);
	const float ss = ss2[0];
	const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)a.cols), a.eps)));
	__syncwarp(); /* every lane has read the tail before any writes in place */
	const uint8_t *w = (const uint8_t *)a.w;
	const uint64_t wa = a.w;
	if (!w)
		norm_row<NORM_NONE>(x, out, w, 0, a.cols, s, lane);
	else if (a.w_dtype == BATON_DT_F32 && wa % 4 == 0)
		norm_row<BATON_DT_F32>(x, out, w, 0, a.cols, s, lane);
	else if (a.w_dtype == BATON_DT_BF16 && wa % 2 == 0)
		norm_row<BATON_DT_BF16>(x, out, w, 0, a.cols, s, lane);
	else if (a.w_dtype == BATON_DT_F16 && wa % 2 == 0)
		norm_row<BATON_DT_F16>(x, out, w, 0, a.cols, s, lane);
	else
		norm_row<-1>(x, out, w, a.w_dtype, a.cols, s, lane); /* elem() at any address */
}

#define NORM_J (BATON_OPS_NORM_ROW_MAX / THREADS) /* values of a row per thread */

/* A wide row by a whole block: each thread loads all its values of x and
 * w at once (i = t, t + THREADS, ...: one round trip to memory, where a
 * warp alone waits on one per 8 values of a lane), x goes through shared
 * memory so that warp 0 sums the squares in baton_ops_rmsnorm's order
 * (lane l: l, l + 32, ... in turn, lane_tree, then the tail), and each
 * thread writes its own values: the same operations, so the same bits.
 * With q, a warp's 32 consecutive outputs are also one int8 block, as
 * baton_mmvq_quant makes it from the stored floats (its rule below). */
template <int DT>
__device__ __forceinline__ void norm_block(const baton_ops_rmsnorm_row_args &a, float *xs,
    float *ws)
{
	const uint32_t t = threadIdx.x, lane = t & 31, cols = a.cols;
	const uint64_t base = (uint64_t)blockIdx.x * cols;
	const float *x = (const float *)a.x + base;
	float *out = (float *)a.out + base;
	const uint8_t *w = (const uint8_t *)a.w;
	float xv[NORM_J], wv[NORM_J];
#pragma unroll
	for (int j = 0; j < NORM_J; j++) {
		const uint32_t i = t + THREADS * j;
		if (i < cols) {
			xv[j] = x[i];
			wv[j] = DT != NORM_NONE ? wload<DT>(w, a.w_dtype, i) : 1.0f;
		}
	}
#pragma unroll
	for (int j = 0; j < NORM_J; j++) {
		const uint32_t i = t + THREADS * j;
		if (i < cols) {
			xs[i] = xv[j];
			ws[i] = wv[j];
		}
	}
	__shared__ float scale;
	__syncthreads(); /* xs is whole; every read of x is done before any write in place */
	if (t < 32) {
		const uint32_t n32 = cols & ~31u;
		float ss = 0.0f;
		for (uint32_t i = lane; i < n32; i += 32)
			ss = __fadd_rn(ss, __fmul_rn(xs[i], xs[i]));
		ss = lane_tree(ss);
		for (uint32_t i = n32; i < cols; i++)
			ss = __fadd_rn(ss, __fmul_rn(xs[i], xs[i]));
		if (lane == 0)
			scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)cols), a.eps)));
	}
	__syncthreads();
	const float s = scale;
	/* a loop, not unrolled: each value's quantization (five shuffles,
	 * two IEEE divisions) unrolled 16 times made the kernel 8.8 us alone
	 * on the H200 where the loop takes 7.6 (ncu, 2026-12-04); x and the
	 * weight from shared memory: the same values, so the same bits */
#pragma unroll 1
	for (int j = 0; j < NORM_J; j++) {
		const uint32_t i = t + THREADS * j;
		if (i >= cols)
			break; /* i grows with j; with q, cols % 32 == 0 keeps this warp-uniform */
		float v = __fmul_rn(xs[i], s);
		if (DT != NORM_NONE)
			v = __fmul_rn(v, ws[i]);
		out[i] = v;
		if (a.q)
			quant_warp(v, (int8_t *)a.q, (float *)a.d, base + i, lane);
	}
}

extern "C" __global__ void __launch_bounds__(THREADS)
baton_ops_rmsnorm_row(baton_ops_rmsnorm_row_args a)
{
	__shared__ float xs[BATON_OPS_NORM_ROW_MAX], ws[BATON_OPS_NORM_ROW_MAX];
	/* the GEMV after it may start now (a programmatic dependent launch,
	 * cuda_launch_kx: it waits for this kernel's end before reading) */
	asm volatile("griddepcontrol.launch_dependents;");
	if (blockIdx.x >= a.rows || a.cols > BATON_OPS_NORM_ROW_MAX)
		return; /* the whole block */
	const uint64_t wa = a.w;
	if (!a.w)
		norm_block<NORM_NONE>(a, xs, ws);
	else if (a.w_dtype == BATON_DT_F32 && wa % 4 == 0)
		norm_block<BATON_DT_F32>(a, xs, ws);
	else if (a.w_dtype == BATON_DT_BF16 && wa % 2 == 0)
		norm_block<BATON_DT_BF16>(a, xs, ws);
	else if (a.w_dtype == BATON_DT_F16 && wa % 2 == 0)
		norm_block<BATON_DT_F16>(a, xs, ws);
	else
		norm_block<-1>(a, xs, ws); /* elem() at any address */
}

/* acc[t] += w * x[t][i] for the nt rows, a multiply then an add. */
template <int N>
__device__ __forceinline__ void acc_w(float (&acc)[N], float w, const float *x, uint64_t k,
    uint32_t i, int nt)
{
#pragma unroll
	for (int t = 0; t < N; t++)
		if (t < nt)
			acc[t] = __fadd_rn(acc[t], __fmul_rn(w, x[(uint64_t)t * k + i]));
}

/* Small unsigned integers as floats without I2F (a quarter-rate
 * instruction): 2^23 + u has u in its low mantissa bits; the subtraction
 * is exact, so this is (float)(u - bias) for u < 2^23. */
__device__ __forceinline__ float u2f(uint32_t u, float bias)
{
	return __fsub_rn(__uint_as_float(0x4B000000u | u), 8388608.0f + bias);
}

/* Rows of f32, f16 or bf16, 16-byte aligned, k a multiple of the chunk:
 * chunks of 32 * E weights, a 16-byte load of E consecutive ones per lane,
 * U chunks loaded before any is used (bytes in flight hide the latency),
 * each written to shared memory and read back as the order wants it: lane
 * l takes l, l + 32, ... of each chunk. */
template <int N, int DT>
__device__ __forceinline__ void mm_plain_vec(float (&acc)[N], const uint8_t *row, const float *x,
    uint32_t k, int nt, uint32_t lane, float *ws)
{
	/* one chunk at a time with 8 rows: the registers of 4 would cost
	 * occupancy, and prefill is bound by the arithmetic, not the loads.
	 * One f32 row: 16 chunks, a 2,048-wide row in one round trip (the
	 * MoE router's 128 rows are 128 warps, too few to hide 4 of them) */
	constexpr uint32_t E = DT == BATON_DT_F32 ? 4 : 8, CH = 32 * E;
	constexpr uint32_t U = N != 1 ? 1 : DT == BATON_DT_F32 ? 16 : 4;
	if constexpr (U == 1) { /* as before this path had U: prefill's registers */
		for (uint32_t c = 0; c < k; c += CH) {
			const uint4 raw = __ldg((const uint4 *)(row + (uint64_t)c * (16 / E)) + lane);
			const uint32_t v[4] = { raw.x, raw.y, raw.z, raw.w };
#pragma unroll
			for (int i = 0; i < 4; i++) {
				if (DT == BATON_DT_F32) {
					ws[E * lane + i] = __uint_as_float(v[i]);
				} else if (DT == BATON_DT_F16) {
					ws[E * lane + 2 * i] = f16f(v[i] & 0xffffu);
					ws[E * lane + 2 * i + 1] = f16f(v[i] >> 16);
				} else {
					ws[E * lane + 2 * i] = __uint_as_float(v[i] << 16);
					ws[E * lane + 2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
				}
			}
			__syncwarp();
#pragma unroll
			for (uint32_t j = 0; j < E; j++) {
				const float w = ws[lane + 32 * j];
#pragma unroll
				for (int t = 0; t < N; t++)
					if (t < nt)
						acc[t] = __fadd_rn(acc[t],
						    __fmul_rn(w, x[(uint64_t)t * k + c + lane + 32 * j]));
			}
			__syncwarp();
		}
	} else {
		for (uint32_t c0 = 0; c0 < k; c0 += U * CH) {
			uint4 raw[U];
#pragma unroll
			for (uint32_t u = 0; u < U; u++)
				if (c0 + u * CH < k)
					raw[u] = __ldg((const uint4 *)(row + (uint64_t)(c0 + u * CH) * (16 / E)) + lane);
#pragma unroll
			for (uint32_t u = 0; u < U; u++) {
				const uint32_t c = c0 + u * CH;
				if (c >= k)
					break;
				const uint32_t v[4] = { raw[u].x, raw[u].y, raw[u].z, raw[u].w };
#pragma unroll
				for (int i = 0; i < 4; i++) {
					if (DT == BATON_DT_F32) {
						ws[E * lane + i] = __uint_as_float(v[i]);
					} else if (DT == BATON_DT_F16) {
						ws[E * lane + 2 * i] = f16f(v[i] & 0xffffu);
						ws[E * lane + 2 * i + 1] = f16f(v[i] >> 16);
					} else {
						ws[E * lane + 2 * i] = __uint_as_float(v[i] << 16);
						ws[E * lane + 2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
					}
				}
				__syncwarp();
#pragma unroll
				for (uint32_t j = 0; j < E; j++)
					acc_w<N>(acc, ws[lane + 32 * j], x, k, c + lane + 32 * j, nt);
				__syncwarp();
			}
		}
	}
}

/* q8_0 rows (blocks of 34 bytes: f16 d, 32 int8), any alignment: lane l
 * takes byte l of each block, one coalesced 32-byte read per block for the
 * warp, so the fixed order falls out of the layout. The d of 32 blocks are
 * decoded once, one per lane, and passed round with shuffles. */
template <int N>
__device__ __forceinline__ void mm_q8_0(float (&acc)[N], const uint8_t *row, const float *x,
    uint32_t k, int nt, uint32_t lane)
{
	const uint32_t nb = k / 32;
	for (uint32_t b0 = 0; b0 < nb; b0 += 32) {
		const uint32_t n = min(32u, nb - b0);
		const float dl = lane < n ? f16f(ld_u16(row + (uint64_t)(b0 + lane) * 34)) : 0.0f;
		for (uint32_t u0 = 0; u0 < n; u0 += 8) {
			uint32_t q[8];
#pragma unroll
			for (uint32_t u = 0; u < 8; u++)
				q[u] = u0 + u < n ? __ldg(row + (uint64_t)(b0 + u0 + u) * 34 + 2 + lane) : 0;
#pragma unroll
			for (uint32_t u = 0; u < 8; u++) {
				const float d = __shfl_sync(0xffffffffu, dl, u0 + u);
				if (u0 + u >= n)
					break;
				/* (float)(int8_t)q: q ^ 0x80 is q + 128 */
				const float w = __fmul_rn(d, u2f(q[u] ^ 0x80u, 128.0f));
				acc_w<N>(acc, w, x, k, (b0 + u0 + u) * 32 + lane, nt);
			}
		}
	}
}

/* q4_K, q5_K and q6_K rows, any alignment. Element l + 32 j of a block is
 * byte l of a 32-byte run in all three layouts (arena/kquant.c), so lane l
 * reads its bytes with coalesced byte loads and accumulates j = 0..7 in
 * order. The scales of 4 blocks are decoded once, one per lane (two for
 * q6_K's 16 per block), into the warp's shared memory: sc[8 u + j] is
 * (d * sc_j, dmin * m_j) of block u, q6_K's sc[16 u + i] is d * scale_i. */
template <int N, int DT>
__device__ __forceinline__ void mm_kquant(float (&acc)[N], const uint8_t *row, const float *x,
    uint32_t k, int nt, uint32_t lane, float2 *sc)
{
	constexpr uint32_t BB = DT == BATON_DT_Q4_K ? 144 : DT == BATON_DT_Q5_K ? 176 : 210;
	constexpr uint32_t U = 4;
	const uint32_t nb = k / 256;
	for (uint32_t b0 = 0; b0 < nb; b0 += U) {
		const uint32_t n = min(U, nb - b0);
		if (DT == BATON_DT_Q6_K) {
#pragma unroll
			for (uint32_t e = lane; e < 16 * U; e += 32) {
				const uint32_t u = e / 16;
				if (u < n) {
					const uint8_t *p = row + (uint64_t)(b0 + u) * BB;
					sc[e].x = f16f(ld_u16(p + 208)) * (float)(int8_t)__ldg(p + 192 + e % 16);
				}
			}
		} else {
			const uint32_t u = lane / 8;
			if (u < n) {
				const uint8_t *p = row + (uint64_t)(b0 + u) * BB;
				float ds, dm;
				kq_scale_min(p + 4, lane % 8, f16f(ld_u16(p)), f16f(ld_u16(p + 2)), &ds, &dm);
				sc[lane] = make_float2(ds, dm);
			}
		}
		/* the quant bytes of the U blocks, all loads before any use */
		uint32_t qb[U][4], qh[U][2];
#pragma unroll
		for (uint32_t u = 0; u < U; u++) {
			if (u >= n)
				break;
			const uint8_t *p = row + (uint64_t)(b0 + u) * BB;
			if (DT == BATON_DT_Q6_K) {
#pragma unroll
				for (int h = 0; h < 4; h++)
					qb[u][h] = __ldg(p + 32 * h + lane); /* ql: 64 n + 32 (qd & 1) */
				qh[u][0] = __ldg(p + 128 + lane);
				qh[u][1] = __ldg(p + 160 + lane);
			} else {
				const uint32_t q0 = DT == BATON_DT_Q5_K ? 48 : 16;
#pragma unroll
				for (int h = 0; h < 4; h++)
					qb[u][h] = __ldg(p + q0 + 32 * h + lane);
				qh[u][0] = DT == BATON_DT_Q5_K ? __ldg(p + 16 + lane) : 0;
			}
		}
		__syncwarp(); /* the scales are written */
#pragma unroll
		for (uint32_t u = 0; u < U; u++) {
			if (u >= n)
				break;
			const uint32_t c = (b0 + u) * 256 + lane;
#pragma unroll
			for (uint32_t j = 0; j < 8; j++) {
				float w;
				if (DT == BATON_DT_Q6_K) {
					const uint32_t nn = j / 4, qd = j % 4;
					const uint32_t lo = qb[u][2 * nn + (qd & 1)];
					const uint32_t q = (qd >= 2 ? lo >> 4 : lo & 0xF) |
					    (((qh[u][nn] >> (2 * qd)) & 3) << 4);
					const float ds = sc[16 * u + 8 * nn + 2 * qd + lane / 16].x;
					w = __fmul_rn(ds, u2f(q, 32.0f));
				} else {
					const uint32_t b = qb[u][j / 2];
					uint32_t q = j & 1 ? b >> 4 : b & 0xF;
					if (DT == BATON_DT_Q5_K)
						q |= ((qh[u][0] >> j) & 1) << 4;
					const float2 s = sc[8 * u + j];
					/* ds * q is exact: one rounding, the host's */
					w = __fmaf_rn(s.x, u2f(q, 0.0f), -s.y);
				}
				acc_w<N>(acc, w, x, k, c + 32 * j, nt);
			}
		}
		__syncwarp(); /* every lane has read the scales before the next write */
	}
}

/* A warp per output row o, carrying up to N rows of x through it: each
 * weight is decoded once for the N rows; each row's sum is its own, in
 * the fixed order, so N changes no bit. */
template <int N, int DT>
__device__ __forceinline__ void matmul(const baton_ops_matmul_args &a)
{
	__shared__ __align__(16) float sm[WARPS][256];
	const uint32_t o = blockIdx.x * WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (o >= a.n_out || blockIdx.y * N >= a.rows)
		return;
	const uint32_t r0 = blockIdx.y * N, k = a.k, k32 = k & ~31u, dt = a.w_dtype;
	const int nt = (int)min((uint32_t)N, a.rows - r0);
	const uint8_t *row = (const uint8_t *)a.w + (uint64_t)o * a.row_bytes;
	const float *x = (const float *)a.x + (uint64_t)r0 * k;
	float *ws = sm[threadIdx.x >> 5];
	float acc[N];
#pragma unroll
	for (int t = 0; t < N; t++)
		acc[t] = 0.0f;
	if ((DT == BATON_DT_F32 || DT == BATON_DT_F16 || DT == BATON_DT_BF16) && a.vec) {
		mm_plain_vec<N, DT>(acc, row, x, k, nt, lane, ws);
	} else if (DT == BATON_DT_Q8_0) {
		mm_q8_0<N>(acc, row, x, k, nt, lane);
	} else if (DT == BATON_DT_Q4_K || DT == BATON_DT_Q5_K || DT == BATON_DT_Q6_K) {
		mm_kquant<N, DT>(acc, row, x, k, nt, lane, (float2 *)ws);
	} else {
#pragma unroll 4
		for (uint32_t i = lane; i < k32; i += 32)
			acc_w<N>(acc, wload<DT>(row, dt, i), x, k, i, nt);
	}
#pragma unroll
	for (int t = 0; t < N; t++)
		acc[t] = lane_tree(acc[t]);
	for (uint32_t i = k32; i < k; i++)
		acc_w<N>(acc, wload<DT>(row, dt, i), x, k, i, nt);
	if (lane != 0)
		return;
	const float b = a.b ? elem((const uint8_t *)a.b, a.b_dtype, o) : 0.0f;
#pragma unroll
	for (int t = 0; t < N; t++)
		if (t < nt) {
			float *y = (float *)a.y + (uint64_t)(r0 + t) * a.n_out + o;
			const float v = a.b ? __fadd_rn(acc[t], b) : acc[t];
			*y = a.accumulate ? __fadd_rn(*y, v) : v;
		}
}

/* baton_ops_matmul_<N>_<kind>, the kinds of ops.h in its order */
#define BATON_MATMUL(N, NAME, DT)                                              \
	extern "C" __global__ void __launch_bounds__(THREADS)                  \
	baton_ops_matmul_##N##_##NAME(baton_ops_matmul_args a) { matmul<N, DT>(a); }
#define BATON_MATMULS(N)                                                       \
	BATON_MATMUL(N, any, -1)                                               \
	BATON_MATMUL(N, f32, BATON_DT_F32)                                     \
	BATON_MATMUL(N, f16, BATON_DT_F16)                                     \
	BATON_MATMUL(N, bf16, BATON_DT_BF16)                                   \
	BATON_MATMUL(N, q8_0, BATON_DT_Q8_0)                                   \
	BATON_MATMUL(N, q4_K, BATON_DT_Q4_K)                                   \
	BATON_MATMUL(N, q5_K, BATON_DT_Q5_K)                                   \
	BATON_MATMUL(N, q6_K, BATON_DT_Q6_K)                                   \
	BATON_MATMUL(N, q4_0, BATON_DT_Q4_0)                                   \
	BATON_MATMUL(N, q4_1, BATON_DT_Q4_1)                                   \
	BATON_MATMUL(N, q5_0, BATON_DT_Q5_0)                                   \
	BATON_MATMUL(N, q5_1, BATON_DT_Q5_1)                                   \
	BATON_MATMUL(N, iq4_nl, BATON_DT_IQ4_NL)                               \
	BATON_MATMUL(N, mxfp4, BATON_DT_MXFP4)                                 \
	BATON_MATMUL(N, q2_K, BATON_DT_Q2_K)                                   \
	BATON_MATMUL(N, q3_K, BATON_DT_Q3_K)                                   \
	BATON_MATMUL(N, iq4_xs, BATON_DT_IQ4_XS)
BATON_MATMULS(1)
BATON_MATMULS(8)

extern "C" __global__ void __launch_bounds__(256)
baton_ops_rope(baton_ops_rope_args a)
{
	const uint32_t half = a.head_dim / 2;
	if (!half)
		return;
	float *v = (float *)a.x + ((uint64_t)blockIdx.x * a.n_heads + blockIdx.y) * a.head_dim;
	const float p = (float)((const uint32_t *)a.pos)[blockIdx.x];
	rope_head(v, p, (const float *)a.inv_freq, half, a.mscale, threadIdx.x, blockDim.x);
}

/* head_nr on one head row in place, by one warp; k's rows then stored
 * with v's where k_cache is given. */
extern "C" __global__ void __launch_bounds__(32)
baton_ops_qk_norm_rope(baton_ops_qk_norm_rope_args a)
{
	const uint32_t r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, hd = a.head_dim;
	if (h >= a.heads + a.kv_heads || hd < 2)
		return; /* the whole warp */
	const bool isk = h >= a.heads;
	const uint32_t nh = isk ? a.kv_heads : a.heads, hh = isk ? h - a.heads : h;
	float *v = (float *)(isk ? a.k : a.q) + ((uint64_t)r * nh + hh) * hd;
	const uint64_t wa = isk ? a.wk : a.wq;
	const uint32_t wdt = isk ? a.wk_dtype : a.wq_dtype;
	head_nr(v, wa, wdt, hd, a.eps, (float)((const uint32_t *)a.pos)[r], (const float *)a.inv_freq,
	    a.mscale, lane);
	if (!isk || !a.k_cache)
		return;
	__syncwarp(); /* the rotated row, before it is copied */
	const uint64_t cols = (uint64_t)a.kv_heads * hd, slot = ((const uint32_t *)a.slots)[r];
	const float *vr = (const float *)a.v + r * cols + (uint64_t)hh * hd;
	float *kc = (float *)a.k_cache + slot * cols + (uint64_t)hh * hd;
	float *vc = (float *)a.v_cache + slot * cols + (uint64_t)hh * hd;
	for (uint32_t i = lane; i < hd; i += 32) {
		kc[i] = v[i];
		vc[i] = vr[i];
	}
}

/* New K and V rows into their slots of a paged cache. */
extern "C" __global__ void __launch_bounds__(128)
baton_ops_kv_store(baton_ops_kv_store_args a)
{
	if (blockIdx.x >= a.n)
		return;
	const uint64_t r = blockIdx.x, dst = ((const uint32_t *)a.slots)[r];
	const float *k = (const float *)a.k + r * a.cols, *v = (const float *)a.v + r * a.cols;
	float *kc = (float *)a.k_cache + dst * a.cols, *vc = (float *)a.v_cache + dst * a.cols;
	for (uint32_t i = threadIdx.x; i < a.cols; i += blockDim.x) {
		kc[i] = k[i];
		vc[i] = v[i];
	}
}

extern "C" __global__ void __launch_bounds__(256)
baton_ops_swiglu(baton_ops_swiglu_args a)
{
	const float *g = (const float *)a.gate, *u = (const float *)a.up;
	float *o = (float *)a.out;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		o[i] = __fmul_rn(__fdiv_rn(g[i], __fadd_rn(1.0f, expf(-g[i]))), u[i]);
}

extern "C" __global__ void __launch_bounds__(256)
baton_ops_add(baton_ops_add_args a)
{
	const uint64_t n = (uint64_t)a.rows * a.cols;
	float *x = (float *)a.x;
	const float *y = (const float *)a.y, *gate = (const float *)a.gate;
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		if (gate) {
			const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-gate[i / a.cols])));
			x[i] = __fadd_rn(x[i], __fmul_rn(g, y[i]));
		} else {
			x[i] = __fadd_rn(x[i], y[i]);
		}
	}
}
