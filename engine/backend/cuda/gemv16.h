/*
 * gemv16.h: internal to the `cuda` backend. The argument blocks of the
 * 16-bit batch-1 GEMVs of gemv16.cu (bf16 and f16 weights against the f32
 * activation), shared by their launcher (gemv16_launch.c) and the CUDA
 * compiler: fixed-width fields, no padding.
 *
 * A warp takes a weight row in 16-byte loads (8 weights a lane), several
 * loads in flight before any is used; lane l takes weights 8l .. 8l + 7 of
 * each 256, summed with fused multiply-adds, then the lane tree. Not the
 * host's order (ops.cu's exact kernels keep it: BATON_CUDA_EXACT=1), but a
 * fixed one: the same bits run to run.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_GEMV16_H
#define BATON_ENGINE_BACKEND_CUDA_GEMV16_H

#include <stdint.h>

#define BATON_G16_WARPS 4 /* warps per block, a row each */
/* gate_up's rows of gate and of up per warp: fewer, longer warps, so that
 * a decode step's 8 x 768 rows fit the device in one wave */
#define BATON_G16_GATE_ROWS 2

/* baton_g16_matmul: grid (ceil(n_out / WARPS)), block 32 * WARPS;
 * y[o] = (accumulate ? y[o] : 0) + (w[o] . x + b[o]).
 * w rows and x 16-byte aligned, k % 8 == 0. */
struct baton_g16_args {
	uint64_t w, x, b, y, row_bytes;
	uint32_t w_dtype, b_dtype, n_out, k, accumulate, pad;
};

/* baton_g16_matmuls: matrices m < n (n <= 3) over one x, the blocks of
 * matrix m from start[m] (ceil(n_out[m] / WARPS) of them; start[0] = 0):
 * y[m][o] = (accumulate ? y[m][o] : 0) + (w[m][o] . x + b[m][o]), each
 * row as baton_g16_matmul computes it. */
struct baton_g16_n_args {
	uint64_t x, w[3], b[3], y[3], row_bytes[3];
	uint32_t w_dtype[3], b_dtype[3], n_out[3], start[3];
	uint32_t k, n, accumulate, pad;
};

/* The decode step's experts (pairs p < top_k of one token, blob =
 * table[ids[p]]; rows 16-byte aligned, d_model and d_ff % 8 == 0, d_ff
 * >= GATE_ROWS):
 * baton_g16_gate_up: grid (ceil(d_ff / (WARPS * GATE_ROWS)), top_k);
 *   h[p][r] = silu(gate[r] . xn) * (up[r] . xn).
 * baton_g16_down: grid (ceil(d_model / WARPS));
 *   x[o] += sum over p of w[p] * (down[o] . h[p]). */
struct baton_g16_moe_args {
	uint64_t table, ids, w, xn, h, x;
	uint64_t gate_off, up_off, down_off;
	uint32_t gate_dtype, up_dtype, down_dtype, d_model, d_ff, top_k;
};

#endif
