/*
 * host.h: the door of engine/backend/host/, the `host` backend (the CPU;
 * always built, runs everywhere): its backend table (baton_backend_host,
 * declared in engine/backend/backend.h), the row kernels every other
 * backend is checked against, the reference MoE math and the reference
 * dense ops. Other folders include this header only; device.h (the host
 * device's shared capacity file) is internal to host/.
 *
 * Files, bottom to top: dtype.c (row kernels for the weight types the host
 * can compute: f32, f16, bf16, q8_0, and the block types decoded by
 * arena/kquant.c and arena/quant.c through arena.h: q4_K, q5_K, q6_K,
 * q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, iq4_nl, iq4_xs, mxfp4), moe.c (the MoE math and the worker
 * pool), ops.c (the forward pass's dense ops), device.c (the memfd
 * device's capacity, device.h) and backend.c (the backend table).
 *
 * Numerics, the contract other backends are compared with:
 *   - Every supported dtype dequantizes to defined f32 values: exactly for
 *     f16, bf16, q8_0 (d * qs[i]) and q6_K ((d * sc) * q); q4_K and q5_K
 *     are ggml's (d * sc) * q - dmin * m, whose products are exact and
 *     whose subtraction rounds once (so a fused multiply-add gives the
 *     same bits); the other block types are ggml's dequantize_row_*
 *     expressions, bit for bit (arena/quant.c). A dot product of a weight row with an f32 vector is then
 *     a dot of f32 numbers, and its only rounding is the accumulation.
 *   - Accumulation is in f32 in one fixed order: 32 lanes, element i
 *     going to lane i % 32 (acc[l] += w[i] * x[i]) for the first
 *     (cols & ~31) elements; the lanes then summed as a fixed tree
 *     (acc[l] + acc[l+16] for l < 16, then l and l+8, then l and l+4,
 *     then (0 + 2) + (1 + 3)); then the remaining cols % 32 elements
 *     added in order. That order is the definition: every SIMD width that
 *     keeps it gives bitwise the same result, and so does any thread count
 *     or batching. (32 lanes, not fewer: enough independent additions for
 *     a one-vector dot not to wait on the adder's latency.)
 *   - No fused multiply-add anywhere (gcc -std=c11 does not contract).
 */
#ifndef BATON_ENGINE_BACKEND_HOST_H
#define BATON_ENGINE_BACKEND_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "arena/arena.h" /* the f16/bf16 codec, dtypes */
#include "engine/backend/backend.h"

/* ---- device.c: what the host device charges each process -------------- */

/* The live processes that hold memory of host device `index`
 * ($BATON_HOSTDEV_DIR/hostdev-<index>) and how much each, up to cap; the
 * broker's measure per process on the host backend, as NVML's is on a
 * GPU. Read under a shared lock, without opening the device.
 * BATON_ENODEV when no process ever opened it, BATON_EIO when its file is
 * not a host device's. */
struct host_device_owner {
	int pid;
	uint64_t bytes;
};
int host_device_owners(int index, struct host_device_owner *out, size_t cap, size_t *n_out);

/* ---- dtype.c ------------------------------------------------------------ */

/* 1 when the host kernels (and so moe_route / moe_experts of the host
 * backend) handle weights of this dtype: f32, f16, bf16, q8_0 and the
 * block types of baton_quant_decodes (arena.h). */
int host_can_compute(int dtype);

/* Bytes of one row of `cols` elements of a computable dtype; 0 when the
 * dtype is not computable, cols is 0, or cols is not a multiple of the
 * block size (32 for q8_0 and the other 32-element types, 256 for the
 * K-quants and iq4_xs). */
uint64_t baton_compute_row_bytes(int dtype, uint64_t cols);

/* Decodes one row of `cols` elements into out[cols] (exactly, see above).
 * q8_0: blocks of 34 bytes, an f16 scale d then 32 int8 qs, value d*qs[i];
 * the block types: ggml's blocks (baton_quant_decode, arena/quant.c).
 * The row may be at any alignment. BATON_EUNSUPPORTED for a dtype the host
 * cannot compute; BATON_EINVAL for NULL pointers, cols 0 or cols not a
 * multiple of the block size. */
int baton_dequant_row(int dtype, const void *row, float *out, uint32_t cols);

/* *out = dot(row, x) in the fixed order above, without a decoded copy of
 * the row. Errors as baton_dequant_row. */
int baton_dot_row(int dtype, const void *row, const float *x, uint32_t cols, float *out);

/* out[v] = dot(row, xs[v]) for v < nx: the row is decoded once for all the
 * vectors, and each out[v] is bitwise what baton_dot_row gives. */
int baton_dot_rows(int dtype, const void *row, uint32_t cols,
    const float *const *xs, uint32_t nx, float *out);

/* The dot kernels in use: AVX2 + F16C where the CPU has them (checked at
 * run time; the environment's BATON_HOST_AVX2=0 turns them off), else the
 * baseline (SSE2 on x86-64). Both give bitwise the same results; this is
 * for tests and benchmarks. on: 1 to use AVX2 if present, 0 not to, -1 to
 * ask. Returns 1 when the AVX2 kernels are now in use. Not to be called
 * while another thread computes. */
int baton_kernels_avx2(int on);

/* ---- moe.c -------------------------------------------------------------- */

/* The host backend's moe_route, moe_experts and can_compute (see
 * engine/backend/backend.h for the contract); a baton_dptr is a host address.
 * `dev` is not used by the math and may be NULL.
 *
 * Route, per token t:
 *   ss = dot(x, x) (the order above); s = 1 / sqrtf(ss / d_model + 1e-6f)
 *   xn[i] = (x[i] * s) * norm[i]      (norm == 0: xn[i] = x[i] * s)
 *   logit[e] = dot(router row e, xn)
 *   ids: top_k by logit descending, ties to the lower id (a NaN logit
 *        ranks as -inf), in rank order
 *   weights[k] = expf(logit[id_k] - logit[id_0]) / sum over k in rank order
 * Experts, per token t and rank k, blob = blobs[t*top_k + k]:
 *   h[j]   = silu(dot(gate row j, xn)) * dot(up row j, xn), silu(g) = g / (1 + expf(-g))
 *   out[i] = dot(down row i, h)
 *   x[i]  += weights[t*top_k + k] * out[i], for k = 0, 1, ... in that order
 * Tokens that share a blob are computed together (the weights are read once)
 * and large layers are split by rows over a pool of threads; neither changes
 * a bit of the result.
 *
 * Errors: BATON_EINVAL for NULL pointers or addresses, zero dimensions,
 * top_k > n_experts, misaligned or overlapping x / xn, or a q8_0 row length
 * not a multiple of 32; BATON_EUNSUPPORTED for a weight dtype the host
 * cannot compute (checked only for the tensors the call reads);
 * BATON_ENOMEM. Nothing is written on error.
 *
 * Concurrent calls (from several contexts) are serialized on one process-
 * wide lock that also guards the worker threads and the scratch memory. */
int host_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l,
    uint32_t *ids, float *weights);
int host_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *weights);
int host_moe_experts_dev(struct baton_dev *dev, const struct baton_moe_layer *l,
    baton_dptr table, baton_dptr ids, baton_dptr weights);

/* Threads the host MoE kernels may use, the caller included: n >= 1, or 0
 * for the default (the environment's BATON_HOST_THREADS, else the CPUs this
 * process may run on, at most 64). Returns the number now in effect.
 * Small layers run on the calling thread alone whatever this says. Worker
 * threads start on first need and live until the process exits; after a
 * job they spin for about 0.1 ms (the next layer's job usually follows at
 * once) and then sleep. */
int host_moe_set_threads(int n);

/* moe.c's worker pool for other ops: fn(arg, part, nparts) for every
 * part, parts chosen from the work (`macs` multiply-adds over `rows`
 * independent rows; small work runs on the caller alone). Serialized with
 * the MoE kernels on their lock; returns when every part is done. An op
 * that computes each output in one part gives the same bits at any count. */
void host_parallel(void (*fn)(void *arg, unsigned part, unsigned nparts), void *arg,
    uint64_t macs, uint32_t rows);

/* ---- ops.c ---------------------------------------------------------------
 * The host backend's dense ops of the forward pass, the reference the
 * other backends are checked against (cuda's route calls host_op_route on
 * copied logits); their exact semantics are those of the slots of the same
 * names in engine/backend/backend.h. A baton_dptr is a host address; `dev`
 * is not used and may be NULL. matmul and attention split their outputs
 * over the MoE kernels' worker pool (host_moe_set_threads); each output is
 * computed whole by one thread, so the bits do not depend on the thread
 * count. */

int host_op_embed(struct baton_dev *dev, baton_dptr table, uint32_t dtype, uint32_t vocab,
    uint32_t cols, const uint32_t *tokens, uint32_t n, baton_dptr out);
int host_op_rmsnorm(struct baton_dev *dev, baton_dptr x, baton_dptr out, uint32_t rows,
    uint32_t cols, baton_dptr w, uint32_t w_dtype, float eps);
int host_op_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate);
/* matmuls: every matmul's checks first, then host_op_matmul each. */
int host_op_matmuls(struct baton_dev *dev, const struct baton_matmuls *mm);
int host_op_rope(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t n_heads,
    uint32_t head_dim, const uint32_t *pos, const float *inv_freq, float mscale);
int host_op_attention(struct baton_dev *dev, const struct baton_attn *a);
/* attention_segs: the checks first (nothing written if one fails), then
 * host_op_attention per segment. */
int host_op_attention_segs(struct baton_dev *dev, const struct baton_attn_segs *a);
int host_op_kv_store(struct baton_dev *dev, const struct baton_kv_store *s);
int host_op_swiglu(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
    uint64_t n);
int host_op_add(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
    uint32_t rows, uint32_t cols);
int host_op_route(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
    uint32_t top_k, int rule, uint32_t *ids, float *weights);
int host_op_route_dev(struct baton_dev *dev, baton_dptr logits, uint32_t rows,
    uint32_t n_experts, uint32_t top_k, int rule, baton_dptr ids, baton_dptr weights);
int host_op_router_route_dev(struct baton_dev *dev, const struct baton_router_route *a);

/* Rows of a call's k and v that it reads (paged: through the end of the
 * highest block of its table); 0 for a paged call without a block size.
 * kv_store_check: the kv_store slot's checks (0 or the error code). Both
 * shared with the cuda backend, so that both refuse the same calls. */
uint64_t attn_cache_rows(const struct baton_attn *a, uint64_t n_ctx);
/* attention_segs' checks (0 or BATON_EINVAL; *rows, may be NULL: the
 * rows of all segments), and segment i as an attention call (row: the
 * rows of the segments before it). */
int attn_segs_check(const struct baton_attn_segs *s, uint64_t *rows);
void attn_seg_view(const struct baton_attn_segs *s, uint32_t i, uint64_t row,
    struct baton_attn *a);
int kv_store_check(const struct baton_kv_store *s);
/* matmuls' own check, shared with the cuda backend: 1 when n is not 1 ..
 * BATON_MATMULS_MAX or two y's overlap, else 0. */
int matmuls_overlap(const struct baton_matmuls *mm);

#endif
