/*
 * moe.h: internal to the `cuda` backend. The argument blocks of the MoE
 * kernels in moe.cu, shared by their launcher (moe_launch.c) and the CUDA
 * compiler: each kernel takes one struct by value, made of fixed-width
 * fields with no padding, so both sides agree on it.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_MOE_H
#define BATON_ENGINE_BACKEND_CUDA_MOE_H

#include <stdint.h>

/* Warps per block of the row kernels (one warp per output row), and the
 * most tokens one warp carries through a weight row at once. */
#define BATON_CUDA_WARPS 8
#define BATON_CUDA_NT 8
/* Rows per warp of the kernels for at most N tokens per warp (N = 1, 2, 4,
 * 8): more rows share each load of x when there are more tokens (x is f32,
 * so with several tokens the L1 limits before HBM does). gate_up walks
 * GATE_ROWS gate rows and as many up rows together. */
#define BATON_CUDA_ROWS(N) ((N) == 1 ? 1 : (N) == 2 ? 2 : 4)
#define BATON_CUDA_GATE_ROWS(N) ((N) <= 2 ? 1 : 2)

/* baton_moe_rmsnorm: grid (batch), block 256.
 * xn[t] = x[t] / sqrt(mean(x[t]^2) + 1e-6) * norm (norm 0: weight 1). */
struct baton_cuda_norm_args {
	uint64_t x, xn, norm;
	uint32_t norm_dtype, d_model, batch, pad;
};

/* baton_moe_gemv_N: grid (ceil(batch / N), ceil(rows / (WARPS * ROWS(N)))).
 * y[t*ldy + r] = w[r] . x[t*ldx ...] for t < batch, r < rows.
 * vec: 1 when w rows and x rows are aligned for vector loads. */
struct baton_cuda_gemv_args {
	uint64_t w, x, y;
	uint32_t dtype, rows, cols, ldx, ldy, batch, vec, pad;
};

/* One group of up to NT (token, k) pairs that use the same expert blob. */
struct baton_cuda_chunk {
	uint64_t blob;
	uint32_t first; /* index into pairs[] */
	uint32_t n;     /* 1..NT */
};

/* baton_moe_gate_up_N: grid (n_chunks, ceil(d_ff / (WARPS * GATE_ROWS(N))));
 *   h[p][r] = silu(gate[r] . xn[t]) * (up[r] . xn[t]), p = t*top_k + k.
 * baton_moe_down_N: grid (n_chunks, ceil(d_model / (WARPS * ROWS(N))));
 *   part[p][r] = w[p] * (down[r] . h[p]).
 * vec: bit 0 gate, bit 1 up, bit 2 down may use vector loads. */
struct baton_cuda_ffn_args {
	uint64_t chunks; /* struct baton_cuda_chunk[n_chunks] */
	uint64_t pairs;  /* uint32_t p, grouped by chunk */
	uint64_t w;      /* float[batch*top_k], by p */
	uint64_t xn;     /* float[batch][d_model] */
	uint64_t h;      /* float[batch*top_k][d_ff] */
	uint64_t part;   /* float[batch*top_k][d_model] */
	uint64_t gate_off, up_off, down_off;
	uint32_t d_model, d_ff, top_k, n_chunks;
	uint32_t gate_dtype, up_dtype, down_dtype, vec;
};

/* baton_moe_reduce: grid (ceil(batch*d_model / 256)), block 256;
 * x[t][j] += part[t*top_k+k][j] for k = 0, 1, ... in that order (as the
 * host backend adds them). */
struct baton_cuda_reduce_args {
	uint64_t x, part;
	uint32_t d_model, top_k, batch, pad;
};

/* baton_moe_chunks: one thread per pair p < n: chunks[p] = { table[ids[p]],
 * p, 1 } and pairs[p] = p, moe_experts_dev's chunks made on the device
 * (one pair each: a decode step's pairs rarely share an expert). */
struct baton_cuda_chunks_args {
	uint64_t table, ids, chunks, pairs;
	uint32_t n, pad;
};

#endif
