/*
 * mmvq_rows.h: internal to the `cuda` backend. The argument block of the
 * quantized GEMVs of passes of 2 to 64 rows (mmvq_rows.cu), shared by
 * their launcher (mmvq_rows_launch.c) and the CUDA compiler: fixed-width
 * fields, no padding.
 *
 * Each of the pass's rows of x is quantized as mmvq.h says (blocks of 32
 * int8 values, one f32 scale each, baton_mmvq_quant over the rows at
 * once: a block never straddles two rows as k % 256 == 0), and each
 * weight row (q4_K / q6_K) is read once per tile of up to RT rows of x and
 * dotted with every row of the tile. Each (row, output) is computed by the
 * threads, the items and the sums of baton_mmvq_matmul's batch-1 kernel
 * (tpr threads a row, items i, i + tpr, ..., the lane tree, the warps in
 * order, the same expression per item): a row's outputs are the bits of
 * that row alone through the batch-1 path, whatever the pass's other rows.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_MMVQ_ROWS_H
#define BATON_ENGINE_BACKEND_CUDA_MMVQ_ROWS_H

#include <stdint.h>

#define BATON_VR_THREADS 128 /* per block, as BATON_MMVQ_THREADS */
#define BATON_VR_TILE_MAX 16 /* rows of x a block dots with each weight row */

/* baton_mmvq_rows_<RT> (RT 2, 4, 8, 16): grid (sum over matrices of
 * ceil(n_out[i] / (THREADS / tpr)), ceil(rows / RT)), block THREADS;
 * blocks start[i] .. of grid x take matrix i (start[0] = 0; an absent
 * matrix's start is UINT32_MAX); grid y the tile of rows RT y ..
 * RT y + RT - 1 (< rows). For each row r and output o of matrix i:
 *   y[i][r n_out[i] + o] = (accumulate ? that : 0) + w[i][o] . x[r] + b[i][o],
 * x[r] as q + r k (int8) and d + r k / 32 (f32 scales). */
struct baton_vr_args {
	uint64_t w[3], b[3], y[3], row_bytes[3];
	uint64_t q, d;
	uint32_t w_dtype[3], b_dtype[3], n_out[3], start[3];
	uint32_t k, tpr, rows, accumulate;
};

/* baton_vr_f32_<RT> (RT 4, 8): the exact f32 matmul of 2 to 64 rows with
 * more blocks than ops.cu's 8-row kernel: a warp per (output o, tile of
 * RT rows), grid (ceil(n_out / WARPS), ceil(rows / RT)), block 32 WARPS.
 * Lane l sums w[o][e] x[r][e] for e = l, l + 32, ... (k % 32 == 0), a
 * multiply then an add, never fused, then the butterfly over 16 .. 1:
 * engine_int.h's order, so the bits of the host and of ops.cu's kernels
 * (any rows). */
#define BATON_VR_F32_WARPS 4
struct baton_vr_f32_args {
	uint64_t w, x, y, b;
	uint32_t n_out, k, rows, accumulate, b_dtype, pad;
};

#endif
