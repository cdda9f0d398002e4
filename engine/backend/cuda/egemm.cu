/*
 * egemm.cu: the MoE experts' GEMMs of a large pass on the tensor cores,
 * every expert of a step in one launch (tc_launch.c, BATON_TC_EXPERT_GEMM
 * 4). cuBLAS takes a pass's experts as several batched calls (one per
 * bucket of like counts), each with its own host cost and its own tail;
 * here a block is a tile of one expert's rows by a slab of its outputs,
 * and the tiles of all experts share one grid. The gate/up step computes
 * gate and up of the same outputs in one block and writes SwiGLU's bf16
 * product, so the f32 gate/up rows are never stored.
 *
 * mma.sync m16n8k16 (bf16 in, f32 sums) from ldmatrix of XOR-swizzled
 * shared tiles, fed by a 4-stage cp.async pipeline over k. Both operands
 * are k-contiguous rows: x's rows (tokens) and the weights' rows
 * (outputs), as the experts are stored.
 */
#include <stdint.h>
#include <cuda_bf16.h>

#include "engine/backend/cuda/tc.h"

static_assert(sizeof(baton_tc_egemm_args) == 72, "egemm args layout");

enum {
	BN = 128, /* weight rows in shared memory a stage */
	BK = 32,  /* k a stage: 4 chunks of 16 bytes a row */
};

static_assert(BATON_TC_EG_COLS_DOWN == BN && BATON_TC_EG_COLS_GU * 2 == BN, "tile widths");

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* Element offset of (row r, 16-byte chunk c) in a tile of BK-wide rows:
 * the chunk XORed with bits 1-2 of the row, so the 8 rows one ldmatrix
 * phase reads fall in 8 distinct 16-byte bank groups. */
__device__ __forceinline__ uint32_t swz(uint32_t r, uint32_t c)
{
	return r * BK + ((c ^ ((r >> 1) & 3)) << 3);
}

/* 16 bytes global to shared; zeros where !ok (rows past the tile's end). */
__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
	    "r"(ok ? 16 : 0));
}

__device__ __forceinline__ void ldm4(uint32_t r[4], uint32_t addr)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
	             : "r"(addr));
}

__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	             "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	             : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t bf_pair(float a, float b)
{
	return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
	    ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
}

/* The first shared row of n-tile pair ni (0, 2, 4, 6) of warp column wc:
 * down, 64 outputs a warp column; gate/up, gate's 32 in rows 0 .. 63 and
 * up's same 32 in rows 64 .. 127. */
__device__ __forceinline__ uint32_t nrow(uint32_t swiglu, uint32_t wc, uint32_t ni)
{
	if (!swiglu)
		return wc * 64 + ni * 8;
	return ni < 4 ? wc * 32 + ni * 8 : 64 + wc * 32 + (ni - 4) * 8;
}

/* Stage kt of x's tile and the weights' into shared memory (one thread's
 * chunks: 2 of x's, NB of the weights'). */
template <int NB>
__device__ __forceinline__ void eg_load(unsigned short *sa, unsigned short *sb,
    const unsigned short *const ga[2], const unsigned short *const gb[NB], const uint32_t oa[2],
    const uint32_t ob[NB], const bool va[2], uint32_t kt)
{
#pragma unroll
	for (int i = 0; i < 2; i++)
		cp16(smem_addr(sa + oa[i]), ga[i] + kt * BK, va[i]);
#pragma unroll
	for (int i = 0; i < NB; i++)
		cp16(smem_addr(sb + ob[i]), gb[i] + kt * BK, true);
}

/* A block of BM rows (2 BM threads: BM / 32 x 2 warps of 32 rows x 64
 * outputs) and ST stages of BM + BN rows of BK. */
template <int BM, int ST>
__device__ __forceinline__ void eg_body(const baton_tc_egemm_args &a)
{
	enum { NT = 2 * BM, NB = BN * 4 / NT };
	static_assert(ST * (BM + BN) * BK * 2 <= 48 * 1024, "static shared memory");
	__shared__ __align__(128) unsigned short sa[ST][BM * BK];
	__shared__ __align__(128) unsigned short sb[ST][BN * BK];
	/* no tiles: one matrix (a dense matmul), rows in tiles of BM */
	const uint4 tile = a.tiles ? ((const uint4 *)a.tiles)[blockIdx.x] :
	    make_uint4(blockIdx.x * BM, min(a.rows - blockIdx.x * BM, (uint32_t)BM), 0, 0);
	const uint32_t row0 = tile.x, rows = tile.y, e = tile.z;
	if (!rows)
		return; /* past the plan's tiles (baton_tc_plan's bound) */
	const uint32_t k = a.k, sw = a.swiglu, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	const uint32_t wr = warp >> 1, wc = warp & 1;
	const unsigned short *x = (const unsigned short *)a.x;
	const unsigned short *w =
	    (const unsigned short *)((a.tiles ? ((const uint64_t *)a.w)[e] : a.w) + a.w_off);
	const unsigned short *w2 = sw == 1 ?
	    (const unsigned short *)(((const uint64_t *)a.w2)[e] + a.w2_off) : w;
	const uint32_t c0 = blockIdx.y * (sw == 1 ? BATON_TC_EG_COLS_GU : BATON_TC_EG_COLS_DOWN);

	/* each thread's chunks: 2 of x's tile (BM rows x 4), NB of the weights' */
	const unsigned short *ga[2], *gb[NB];
	uint32_t oa[2], ob[NB];
	bool va[2];
#pragma unroll
	for (int i = 0; i < 2; i++) {
		const uint32_t idx = tid + i * NT, r = idx >> 2, c = idx & 3;
		va[i] = r < rows;
		ga[i] = x + (uint64_t)(row0 + (va[i] ? r : 0)) * k + c * 8;
		oa[i] = swz(r, c);
	}
#pragma unroll
	for (int i = 0; i < NB; i++) {
		const uint32_t idx = tid + i * NT, r = idx >> 2, c = idx & 3;
		const unsigned short *src = sw != 1 ? w + (uint64_t)(c0 + r) * k :
		    r < 64                      ? w + (uint64_t)(c0 + r) * k :
		                                  w2 + (uint64_t)(c0 + r - 64) * k;
		gb[i] = src + c * 8;
		ob[i] = swz(r, c);
	}
	const uint32_t kt_n = k / BK;
	float acc[2][8][4];
#pragma unroll
	for (int mi = 0; mi < 2; mi++)
#pragma unroll
		for (int ni = 0; ni < 8; ni++)
#pragma unroll
			for (int j = 0; j < 4; j++)
				acc[mi][ni][j] = 0.0f;

#pragma unroll
	for (int s = 0; s < ST - 1; s++) {
		if ((uint32_t)s < kt_n)
			eg_load<NB>(sa[s], sb[s], ga, gb, oa, ob, va, (uint32_t)s);
		asm volatile("cp.async.commit_group;\n" ::);
	}
	for (uint32_t kt = 0; kt < kt_n; kt++) {
		asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 2));
		__syncthreads(); /* stage kt landed; every warp is done with kt - 1's */
		const uint32_t nk = kt + ST - 1;
		if (nk < kt_n)
			eg_load<NB>(sa[nk % ST], sb[nk % ST], ga, gb, oa, ob, va, nk);
		asm volatile("cp.async.commit_group;\n" ::);
		const uint32_t s = kt % ST;
#pragma unroll
		for (uint32_t kk = 0; kk < 2; kk++) { /* two k16 steps a stage */
			uint32_t af[2][4], bf[8][2];
#pragma unroll
			for (int mi = 0; mi < 2; mi++) {
				const uint32_t r = wr * 32 + mi * 16 + (lane & 15), c = kk * 2 + (lane >> 4);
				ldm4(af[mi], smem_addr(&sa[s][swz(r, c)]));
			}
#pragma unroll
			for (uint32_t ni = 0; ni < 8; ni += 2) {
				const uint32_t r = nrow(sw == 1, wc, ni) + (lane & 7) + ((lane >> 4) << 3);
				const uint32_t c = kk * 2 + ((lane >> 3) & 1);
				uint32_t q[4];
				ldm4(q, smem_addr(&sb[s][swz(r, c)]));
				bf[ni][0] = q[0], bf[ni][1] = q[1], bf[ni + 1][0] = q[2], bf[ni + 1][1] = q[3];
			}
#pragma unroll
			for (int mi = 0; mi < 2; mi++)
#pragma unroll
				for (int ni = 0; ni < 8; ni++)
					mma(acc[mi][ni], af[mi], bf[ni]);
		}
	}
	asm volatile("cp.async.wait_group 0;\n" ::);

	/* acc[mi][ni][h * 2 + j]: row wr * 32 + mi * 16 + lane / 4 + 8 h,
	 * n-tile ni's column (lane % 4) * 2 + j */
	const uint32_t g = lane >> 2, t2 = (lane & 3) * 2;
#pragma unroll
	for (int mi = 0; mi < 2; mi++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const uint32_t r = wr * 32 + mi * 16 + g + h * 8;
			if (r >= rows)
				continue;
			const uint64_t orow = (uint64_t)(row0 + r) * a.n;
			if (sw == 1) {
				uint32_t *hrow = (uint32_t *)((unsigned short *)a.out + orow);
#pragma unroll
				for (int ni = 0; ni < 4; ni++) {
					float v[2];
#pragma unroll
					for (int j = 0; j < 2; j++) {
						const float gt = acc[mi][ni][h * 2 + j], u = acc[mi][ni + 4][h * 2 + j];
						v[j] = gt / (1.0f + expf(-gt)) * u; /* baton_tc_swiglu's */
					}
					hrow[(c0 + wc * 32 + ni * 8 + t2) / 2] = bf_pair(v[0], v[1]);
				}
			} else {
				float *orow_p = (float *)a.out + orow;
#pragma unroll
				for (int ni = 0; ni < 8; ni++) {
					float2 *o = (float2 *)(orow_p + c0 + wc * 64 + ni * 8 + t2);
					float2 v = make_float2(acc[mi][ni][h * 2], acc[mi][ni][h * 2 + 1]);
					if (sw == 2) { /* accumulate */
						const float2 y = *o;
						v.x += y.x, v.y += y.y;
					}
					*o = v;
				}
			}
		}
}

/* 64 rows a block, 4 stages: the default (BATON_TC_EG_ROWS) */
extern "C" __global__ void __launch_bounds__(128, 3) baton_tc_egemm(const baton_tc_egemm_args a)
{
	eg_body<64, 4>(a);
}

/* 128 rows a block, 3 stages: each weight tile read half as often */
extern "C" __global__ void __launch_bounds__(256, 2) baton_tc_egemm_m128(const baton_tc_egemm_args a)
{
	eg_body<128, 3>(a);
}
