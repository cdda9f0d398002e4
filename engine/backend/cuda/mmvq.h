/*
 * mmvq.h: internal to the `cuda` backend. The argument blocks of the
 * quantized batch-1 GEMVs of mmvq.cu, shared by their launcher
 * (mmvq_launch.c) and the CUDA compiler: fixed-width fields, no padding.
 *
 * The activation is quantized once to blocks of 32 int8 values with one
 * f32 scale each (q = round(x / d), d = max|x| / 127), and the weights'
 * q4_K / q6_K blocks are dotted against it with dp4a: integer sums, one
 * float multiply per 4 or 8 weights. Not the host's bits (the activation
 * is rounded to 8 bits): BATON_CUDA_EXACT=1 keeps ops.cu's exact kernels.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_MMVQ_H
#define BATON_ENGINE_BACKEND_CUDA_MMVQ_H

#include <stdint.h>

#define BATON_MMVQ_THREADS 128 /* per block; a row takes tpr of them */
#define BATON_MMVQ_SUB 16      /* threads per 256-weight block of a row */

/* baton_mmvq_quant: grid (ceil(n / 256)), block 256; n % 32 == 0.
 * q[i] = round(x[i] / d[i / 32]), d[b] = max |x| over block b / 127. */
struct baton_mmvq_quant_args {
	uint64_t x, q, d;
	uint32_t n, pad;
};

/* baton_mmvq_matmul: grid (ceil(n_out / (THREADS / tpr))), block THREADS;
 * y[o] = (accumulate ? y[o] : 0) + (w[o] . x + b[o]), x as q / d. */
struct baton_mmvq_args {
	uint64_t w, q, d, b, y, row_bytes;
	uint32_t w_dtype, b_dtype, n_out, k, tpr, accumulate;
};

/* baton_mmvq_matmuls: baton_mmvq_matmul over up to three matrices that
 * read the same x (attention's q, k, v), one grid: blocks start[i] ..
 * start[i + 1] - 1 take matrix i (start[0] = 0; an absent matrix's start
 * is UINT32_MAX), each as baton_mmvq_matmul's grid would (no accumulate). */
struct baton_mmvq_n_args {
	uint64_t w[3], b[3], y[3], row_bytes[3];
	uint64_t q, d;
	uint32_t w_dtype[3], b_dtype[3], n_out[3], start[3];
	uint32_t k, tpr;
};

/* The decode step's experts (pairs p < top_k of one token, blob =
 * table[ids[p]]):
 * baton_mmvq_gate_up: grid (ceil(d_ff / (THREADS / tpr)), top_k);
 *   h[p][r] = silu(gate[r] . xn) * (up[r] . xn), xn as q / d.
 * baton_mmvq_down: grid (ceil(d_model / (THREADS / tpr)));
 *   x[o] += sum over p, in order, of w[p] * (down[o] . h[p]), h as q / d.
 * baton_mmvq_gate_up_q4k: grid (d_ff / 32, top_k), block 32 * GU_WARPS;
 *   gate_up's h, quantized as baton_mmvq_quant does into hq / hd (q4_K
 *   rows at 16-byte alignment, d_ff % 32 == 0).
 * baton_mmvq_down_q4k: grid (ceil(d_model / DOWN_WARPS)), block
 *   32 * DOWN_WARPS; down's rule above (q4_K rows at 16-byte alignment). */
#define BATON_MMVQ_GU_WARPS 8
#define BATON_MMVQ_DOWN_WARPS 4
struct baton_mmvq_moe_args {
	uint64_t table, ids, w, q, d, h, x, hq, hd;
	uint64_t gate_off, up_off, down_off;
	uint32_t gate_dtype, up_dtype, down_dtype, d_model, d_ff, top_k, tpr, pad;
};

#endif
