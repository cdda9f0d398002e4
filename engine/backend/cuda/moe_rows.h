/*
 * moe_rows.h: internal to the `cuda` backend. The argument blocks of the
 * grouped expert kernels of moe_rows.cu (passes of 2 to BATON_MR_MAX_ROWS
 * rows routed on the device: serving's decode steps), shared by their
 * launcher (moe_rows_launch.c) and the CUDA compiler: fixed-width fields,
 * no padding.
 *
 * The pass's (row, rank) pairs are grouped by expert on the device
 * (baton_mr_group: a count, an offset scan, each expert's pairs in
 * ascending order), and each chosen expert's q4_K rows are read ONCE for
 * all the pairs routed to it: a warp holds a row's blocks in registers and
 * dots them with every pair's int8 activation (dp4a), as mmvq.cu's batch-1
 * kernels do for one. Sums in a fixed order: the same bits run to run.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_MOE_ROWS_H
#define BATON_ENGINE_BACKEND_CUDA_MOE_ROWS_H

#include <stdint.h>

#define BATON_MR_MAX_ROWS 64    /* rows of a pass (so pairs of one expert) */
#define BATON_MR_MAX_PAIRS 4096 /* rows * top_k */
#define BATON_MR_MAX_E 1024     /* experts a layer */
/* The widths the launcher takes: gate_up's rows in one pass of 8 blocks
 * and down's in one of 4, the shapes measured on the H200 (2026-12-02,
 * Qwen3-30B-A3B's 2,048 x 768). The kernels loop over longer rows, but
 * that loop never ran on a GPU: wider models keep the older path. */
#define BATON_MR_MAX_D 2048
#define BATON_MR_MAX_F 1024
#define BATON_MR_GU_WARPS 8     /* gate_up: a block of 32 d_ff rows */
#define BATON_MR_DN_WARPS 4     /* down: a block of 32 d_model rows, 8 a warp */

/* baton_mr_quant: grid (ceil(n / 256)), block 256; n % 32 == 0.
 * q[i] = round(x[i] / d), ds[i / 32] = { d, d * (sum of the block's q) },
 * d = max |x| over the block of 32 / 127. */
struct baton_mr_quant_args {
	uint64_t x, q, ds;
	uint32_t n, pad;
};

/* One expert's run of pairs in a pass: pairs[first .. first + count). */
struct baton_mr_slot {
	uint64_t blob;
	uint32_t first, count; /* count 0: an unused slot */
};

/* baton_mr_group: grid (1), block 256; n <= MAX_PAIRS, n_experts <= MAX_E.
 * slots[0 .. active) the experts with pairs in ascending id, the rest of
 * n_slots with count 0; pairs[] each expert's pair indices ascending. */
struct baton_mr_group_args {
	uint64_t ids, table, slots, pairs;
	uint32_t n, n_experts, n_slots, pad;
};

/* baton_mr_gate_up: grid (d_ff / 32, n_slots), block 32 * GU_WARPS;
 *   for each pair p of the slot (row t = p / top_k): h = silu(gate . x[t])
 *   * (up . x[t]) over the block's 32 rows, quantized into hq[p][...] and
 *   hds[p][...] as baton_mr_quant does (x as xq / xds).
 * baton_mr_down: grid (d_model / 32, n_slots), block 32 * DN_WARPS;
 *   part[p][o] = w[p] * (down[o] . h[p]) (h as hq / hds).
 * q4_K rows at 16-byte alignment; d_model, d_ff multiples of 256. */
struct baton_mr_moe_args {
	uint64_t slots, pairs, w, xq, xds, hq, hds, part;
	uint64_t gate_off, up_off, down_off;
	uint32_t d_model, d_ff, top_k, pad;
};

#endif
