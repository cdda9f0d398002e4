/*
 * tc.h: internal to the `cuda` backend. The argument blocks of the kernels
 * around the tensor-core path (tc_launch.c): gemm.cu (weights decoded to
 * bf16, activations to bf16 and back, the MoE block's gather, SwiGLU and
 * weighted sum) and attn.cu (prefill attention as two GEMMs: the K/V and Q
 * layouts, the causal softmax, the output back in place). Shared by C and
 * CUDA: fixed-width fields, no padding. Every kernel runs a grid-stride
 * loop over its elements, block BATON_TC_THREADS, unless it says
 * otherwise.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_TC_H
#define BATON_ENGINE_BACKEND_CUDA_TC_H

#include <stdint.h>

#define BATON_TC_THREADS 256
#define BATON_TC_NONE 0xffffffffu /* a padding row of a map */

/* baton_tc_dequant: grid (x, n_mat). Matrix z (< n_mat) is `rows` rows of
 * `cols` in dtype at (table ? table[z] : src) + src_off, row_bytes apart;
 * it goes to dst + z * dst_stride + dst_row0 * cols as bf16 (elements
 * rounded to nearest even). vec: 1 when every row start suits the vector
 * decoders (8 bytes for q4_K / q5_K, 2 for q6_K, q8_0, f16, bf16);
 * cols % 8 == 0 always. */
struct baton_tc_dequant_args {
	uint64_t table, src, src_off, row_bytes, dst, dst_stride, dst_row0;
	uint32_t rows, cols, dtype, vec;
};

/* baton_tc_rows: dst row r (bf16, cols) = src row (map ? map[r] / div :
 * r) (f32, cols, src_ld apart), or zeros where map[r] == BATON_TC_NONE. */
struct baton_tc_rows_args {
	uint64_t src, dst, map;
	uint32_t rows, cols, src_ld, div;
};

/* baton_tc_bias: y[r][o] += decode(b)[o], r < rows, o < n_out. */
struct baton_tc_bias_args {
	uint64_t y, b;
	uint32_t rows, n_out, b_dtype, pad;
};

/* baton_tc_swiglu: h[r][i] = bf16(silu(gu[r][i]) * gu[r][f + i]), gu f32
 * [rows][2f], h bf16 [rows][f]. */
struct baton_tc_swiglu_args {
	uint64_t gu, h;
	uint32_t rows, f;
};

/* baton_tc_combine: grid (x over cols / 4, y over tokens). x[t][c] +=
 * w[p] * o[prow[p]][c] for p = t * top_k + k in k order, each product
 * rounded before its add: the bits of the pairs' weighted rows summed in
 * rank order by moe_reduce, without writing them out. cols % 4 == 0. */
struct baton_tc_combine_args {
	uint64_t o, x, prow, w;
	uint32_t tokens, cols, top_k, pad;
};

/* baton_tc_mm_f32: y[r][o] = (accumulate ? y[r][o] : 0) + w[o] . x[r]
 * on f32 weights and x, k % 32 == 0, in the host's order for every dot
 * (lane l sums elements l, l + 32, ... with a multiply then an add, then
 * the lanes' tree: ops.cu's exact kernels' bits). A warp takes
 * BATON_TC_MMF_R rows by BATON_TC_MMF_O outputs, a block of
 * BATON_TC_MMF_WARPS warps the same rows and WARPS x O outputs, so each
 * x row is read from L2 once for 32 outputs, not once for each: grid
 * (ceil(n_out / (WARPS * O)), ceil(rows / R)), block 32 * WARPS. For the
 * MoE routers of large passes (128 outputs: too few for cuBLAS's tiles,
 * and their logits pick the experts, so the exact bits). */
#define BATON_TC_MMF_R 8
#define BATON_TC_MMF_O 8
#define BATON_TC_MMF_WARPS 4
struct baton_tc_mm_f32_args {
	uint64_t w, x, y;
	uint32_t n_out, k, rows, accumulate;
};

/* baton_tc_egemm (egemm.cu): the experts' GEMMs of a step in one launch,
 * grid (n_tiles, n / BATON_TC_EG_COLS_GU or _DOWN), block
 * BATON_TC_EG_THREADS. Tile t (tiles: uint32 [n_tiles][4]) is rows row0
 * .. row0 + rows - 1 (rows <= 64, or 128 for baton_tc_egemm_m128) of x (bf16 [][k]), all
 * expert e's. w, w2: device arrays of each expert's weights (bf16 [n][k],
 * 16-byte aligned) at w[e] + w_off and w2[e] + w2_off; a tile of 0
 * rows does nothing. tiles 0: one matrix at w + w_off (a dense matmul),
 * tile t rows 64 t .. of `rows`. swiglu 1: out bf16 [][n] =
 * bf16(silu(x . w[e]) * (x . w2[e])), w the gate, w2 the up matrix;
 * swiglu 0: out f32 [][n] = x . w[e]; 2: out += x . w[e]. k % 32 == 0; n a multiple of the block's outputs. Sums are
 * the tensor cores' (not the host's order). */
#define BATON_TC_EG_THREADS 128 /* tiles of 64 rows; baton_tc_egemm_m128: 256, of 128 */
#define BATON_TC_EG_COLS_GU 64
#define BATON_TC_EG_COLS_DOWN 128
struct baton_tc_egemm_args {
	uint64_t tiles, w, w2, w_off, w2_off, x, out;
	uint32_t k, n, swiglu, rows;
};
/* baton_tc_plan (gemm.cu): one block of 1024 threads. The pairs' rows
 * grouped by expert on the device (a pass routed there): pair p (ids[p],
 * its expert, < n_experts <= BATON_TC_PLAN_E_MAX) gets row prow[p], the
 * experts in id order, each expert's pairs in p order, and rowmap[r] = p;
 * tiles (uint32 [max_tiles][4], max_tiles >= ceil(n / 64) + the experts
 * used) get each expert's {row0, rows, expert, 0} in tiles of up to
 * tile_rows (egemm's block: 64 or 128), then zeros (tiles egemm skips). */
#define BATON_TC_PLAN_E_MAX 256
struct baton_tc_plan_args {
	uint64_t ids, prow, rowmap, tiles;
	uint32_t n, n_experts, max_tiles, tile_rows;
};
/* attn.cu. G = heads / kv_heads query heads per KV head.
 * baton_tc_attn_kv: kb, vb bf16 [kv_heads][n_pad][head_dim] from the
 * cache (rows of kv_heads * head_dim f32; key c at row blocks[c /
 * block_size] * block_size + c % block_size, or row c without blocks),
 * zeros for c >= n_ctx. */
struct baton_tc_attn_kv_args {
	uint64_t k, v, kb, vb, blocks;
	uint32_t n_ctx, n_pad, kv_heads, head_dim, block_size, pad;
};

/* baton_tc_attn_q: qb bf16 [kv_heads][nq][G][head_dim] from q f32
 * [nq][heads][head_dim] (query t, head g * G + j);
 * baton_tc_attn_out: out f32 [nq][heads][head_dim] from o f32 in qb's
 * layout. */
struct baton_tc_attn_qo_args {
	uint64_t src, dst;
	uint32_t nq, heads, kv_heads, head_dim;
};

/* baton_tc_attn_softmax: one block per row of s (f32, kv_heads * nq * G
 * rows of n_pad, the scores already scaled); row R is query t = (R % (nq
 * * G)) / G, which sees keys c <= pos_q0 + t: p (bf16, same shape) =
 * exp(s - max) / sum over those, 0 elsewhere. */
struct baton_tc_attn_softmax_args {
	uint64_t s, p;
	uint32_t rows, n_pad, nq_g, g, pos_q0, pad;
};

#endif
