/*
 * ops.h: internal to the `cuda` backend. The argument blocks of the
 * forward-pass kernels in ops.cu, attn_split.cu and route.cu, shared by
 * their launchers (ops_launch.c, attn_split_launch.c, route_launch.c) and
 * the CUDA compiler: each kernel takes one struct by value, fixed-width
 * fields and no padding, so both sides agree on it.
 *
 * Every dot product of these kernels is the fixed order of host/host.h,
 * which one warp computes as it is written: lane l accumulates elements
 * l, l + 32, ... (a multiply, then an add: never fused), the butterfly
 * __shfl_xor over 16, 8, 4, 2, 1 is the contract's tree, the tail follows
 * in order. So matmul, rmsnorm and the attention scores give the host's
 * bits; expf, sinf and cosf are the device's (within 2 ulp of glibc).
 */
#ifndef BATON_ENGINE_OPS_CUDA_H
#define BATON_ENGINE_OPS_CUDA_H

#include <stdint.h>

#define BATON_OPS_WARPS 8     /* warps per block of the row kernels */
#define BATON_OPS_NT 8        /* most activation rows a matmul warp carries */

/* baton_ops_embed: grid (n), block 256. out[t][i] = decode(table row
 * tokens[t])[i]; tokens is a device copy of the host array. */
struct baton_ops_embed_args {
	uint64_t table, tokens, out, row_bytes;
	uint32_t dtype, cols, n, pad;
};

/* baton_ops_rmsnorm: grid (ceil(rows / WARPS)), block 32 * WARPS, a warp
 * per row. w == 0: no weight. */
struct baton_ops_rmsnorm_args {
	uint64_t x, out, w;
	uint32_t w_dtype, rows, cols;
	float eps;
};

/* baton_ops_qk_norm_rope: grid (rows, heads + kv_heads), block 32: a
 * warp per head row (q's heads, then k's), baton_ops_rmsnorm's warp then
 * baton_ops_rope's arithmetic, in place; pos and inv_freq device copies. */
struct baton_ops_qk_norm_rope_args {
	uint64_t q, k, wq, wk, pos, inv_freq;
	uint32_t wq_dtype, wk_dtype, heads, kv_heads, head_dim;
	float eps, mscale, pad;
	/* k_cache != 0: the k head rows, once rotated, and v's with them to
	 * rows slots[r] (a device copy) of k_cache and v_cache (kv_store) */
	uint64_t v, k_cache, v_cache, slots;
};

/* baton_ops_rmsnorm_row: grid (rows), block 32 * WARPS, a block per row,
 * cols <= BATON_OPS_NORM_ROW_MAX; the bits of baton_ops_rmsnorm. q != 0
 * (cols % 32 == 0): the output also as mmvq.cu's int8 blocks, q[i] and
 * the scale d[i / 32] of baton_mmvq_quant (mmvq.h), row after row. */
#define BATON_OPS_NORM_ROW_MAX 4096
struct baton_ops_rmsnorm_row_args {
	uint64_t x, out, w, q, d;
	uint32_t w_dtype, rows, cols;
	float eps;
};

/* baton_ops_matmul_<N>_<kind>: grid (ceil(n_out / WARPS), ceil(rows / N)),
 * block 32 * WARPS; a warp per output row o, carrying N (1 or 8) rows of
 * x. Kinds: the weight dtype known at compile time (f32, f16 and bf16
 * with aligned loads, whose rows must start at a multiple of their element
 * size; q8_0 and the K-quants with coalesced byte loads at any address,
 * lane l reading byte l of each 32-byte run; arena/quant.c's block types
 * through dtype.cuh's element decoder, the type known at compile time),
 * or `any` (w_dtype read at run time, bytes loaded one by one). */
#define BATON_OPS_KINDS 17
#define BATON_OPS_KIND_NAMES { "any", "f32", "f16", "bf16", "q8_0", "q4_K", "q5_K", "q6_K", \
	"q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4", "q2_K", "q3_K", "iq4_xs" }
struct baton_ops_matmul_args {
	uint64_t w, b, x, y, row_bytes;
	uint32_t w_dtype, b_dtype, n_out, k, rows, accumulate;
	/* f32, f16, bf16 kinds: 1 when rows start 16-byte aligned and k is a
	 * multiple of 128 (f32) or 256: 16-byte loads, put back in the fixed
	 * order through shared memory. */
	uint32_t vec, pad;
};

/* baton_ops_rope: grid (rows, n_heads), block min(head_dim / 2, 256);
 * pos (u32) and inv_freq (f32) are device copies of the host arrays. */
struct baton_ops_rope_args {
	uint64_t x, pos, inv_freq;
	uint32_t n_heads, head_dim;
	float mscale;
	uint32_t pad;
};

/* Attention, keys split into chunks of `chunk` (BATON_OPS_ATTN_CHUNK):
 * baton_ops_attn_part: grid (queries of this launch, n_heads, most chunks
 * of a query), block 32 * WARPS; block (t, h, c) takes keys c * chunk ..
 * of query q0 + t. A query of one chunk is finished there (the host's
 * order); else the chunk's max, sum of exps and unnormalised output go to
 * part[(t * n_heads + h) * chunks + c][head_dim + 2], and
 * baton_ops_attn_combine: grid (queries of this launch, n_heads), block
 * 32 * WARPS, merges them in chunk order. blocks: a device copy of the
 * block table, or 0 (contiguous rows). */
#define BATON_OPS_ATTN_CHUNK 256u
struct baton_ops_attention_args {
	uint64_t q, k, v, out, part, blocks;
	uint64_t pos0_dev; /* nonzero: pos0 is the u32 there (a pass replayed as a graph) */
	uint32_t q0, n_q, n_heads, n_kv_heads, head_dim, pos0;
	uint32_t block_size, chunks; /* chunks: gridDim.z of the part launch (at least the most
	                                chunks of a query; blocks past a query's keys return) */
	float scale;
	uint32_t pad;
};

/* baton_ops_attn_rows: attention of query rows of any sequences in one
 * launch (the attention_segs slot, and attention's paged or contiguous
 * calls), flash-decoding style. grid (rows of this launch, n_kv_heads *
 * tiles, chunks), block BATON_OPS_AR_THREADS; block (r, y, c) takes
 * keys c * BATON_OPS_AR_CHUNK .. of row r for query heads tile y % tiles
 * (up to BATON_OPS_AR_HEADS) of KV head y / tiles, reading each key and
 * value once for all of them. rows: u32 [4] per row: its q (and out)
 * row, its position (the row sees keys 0 .. pos), the offset of its
 * block table in tab, 0. tab: the block tables, or 0: key j is row j.
 * A row of one chunk is finished in its block; else each chunk writes
 * its max, sum of exps and unnormalised output to part[((r * n_heads +
 * h) * chunks + c)][head_dim + 2], counts itself in cnt[r * gridDim.y +
 * y] (zeroed before the first launch, left zeroed), and the last chunk
 * to finish merges them all in chunk order. A row's chunks depend on its
 * position alone: its bits do not depend on the other rows, on chunks
 * (a graph's bucket) or on which block finished last. head_dim a
 * multiple of 32 up to BATON_OPS_AR_HD_MAX; q, k, v, out 16-byte aligned. */
#define BATON_OPS_AR_CHUNK 64u
#define BATON_OPS_AR_HEADS 8u
#define BATON_OPS_AR_THREADS 128u
#define BATON_OPS_AR_HD_MAX 256u
struct baton_ops_attn_rows_args {
	uint64_t q, k, v, out, part, rows, tab, cnt;
	uint64_t oq, od; /* oq != 0 (a launch of one row): out also as mmvq.h's int8
	                    blocks, q oq[i] and scale od[i / 32], for the o projection */
	uint32_t n_heads, n_kv_heads, head_dim, block_size, chunks, tiles;
	float scale;
	uint32_t pad;
};

/* baton_ops_attn_nr<NH> (NH 1, 2, 4 or 8 query heads a block, tiles =
 * ceil(heads per KV head / NH)): baton_ops_attn_rows for decode rows (a
 * row per sequence: no row reads another's new key) fused with
 * qk_norm_rope and its store. q holds the rows' raw q (not changed), kn
 * and vn the raw new k and v rows ([row][n_kv_heads * head_dim], by the
 * row's q row); each block norms and rotates its heads' q (weight wq,
 * eps, at the row's position, inv_freq a device copy of head_dim / 2
 * floats, mscale) as qk_norm_rope does, and the block(s) of a row's last
 * chunk do the same to its new key (weight wk) and store it and its v
 * row to the key's slot of the cache (the row's position through its
 * table) before reading any key: qk_norm_rope's bits, then
 * baton_ops_attn_rows's. */
struct baton_ops_attn_nr_args {
	struct baton_ops_attn_rows_args ar;
	uint64_t kn, vn, wq, wk, inv_freq;
	uint32_t wq_dtype, wk_dtype;
	float eps, mscale;
};

/* baton_ops_kv_store: grid (n), block 128. Rows r of k and v to rows
 * slots[r] of k_cache and v_cache; slots a device copy. */
struct baton_ops_kv_store_args {
	uint64_t k, v, k_cache, v_cache, slots;
	uint32_t n, cols;
};

/* baton_ops_swiglu: grid-stride over n. out[i] = silu(gate[i]) * up[i]. */
struct baton_ops_swiglu_args {
	uint64_t gate, up, out, n;
};

/* baton_ops_add: grid-stride over rows * cols. x += g(r) * y. */
struct baton_ops_add_args {
	uint64_t x, y, gate;
	uint32_t rows, cols;
};

/* baton_ops_route: one warp per row (grid rows), dynamic shared memory of
 * n_experts floats and n_experts bytes. route's rule, bitwise the host's
 * (its expf is glibc's, computed the same way): ids u32 and w f32, rows *
 * top_k each, left on the device. */
struct baton_ops_route_args {
	uint64_t logits, ids, w;
	uint32_t rows, n_experts, top_k, rule;
};

/* baton_ops_router_route: grid (ceil(n_experts / ROUTER_WARPS), rows),
 * block 32 * ROUTER_WARPS: struct baton_router_route (backend.h) with f32
 * router rows at 4-byte alignment, k a multiple of 32 (and at most
 * NORM_ROW_MAX with the norm). norm_on: xn = rmsnorm(x) first (norm_row's bits), and
 * with q != 0 (one row) its int8 blocks as baton_mmvq_quant makes them;
 * then logits = w . xn (the one-row f32 matmul's bits), and row r routed
 * as baton_ops_route does into ids and w_out by the last of its blocks
 * to finish; count: rows u32 counters, 0 between launches. */
#define BATON_OPS_ROUTER_WARPS 2
#define BATON_OPS_ROUTER_MAX_E 1024  /* experts the fused kernel's shared memory holds */
#define BATON_OPS_ROUTER_MAX_ROWS 64 /* rows of counters */
struct baton_ops_router_route_args {
	uint64_t x, xn, norm, w, logits, ids, w_out, count, q, d;
	uint32_t norm_on, norm_dtype, k, rows, n_experts, top_k, rule;
	float eps;
	uint32_t pad[2];
};

#endif
