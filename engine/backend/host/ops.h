/*
 * ops_host.h: internal to the engine component. The host backend's dense
 * ops of the forward pass (engine/backend/host/ops.c), the reference the other
 * backends are checked against; their exact semantics are those of the
 * slots of the same names in engine/backend/backend.h. A baton_dptr is a host
 * address; `dev` is not used and may be NULL. matmul and attention split
 * their outputs over the MoE kernels' worker pool (host_moe_set_threads);
 * each output is computed whole by one thread, so the bits do not depend
 * on the thread count.
 */
#ifndef BATON_ENGINE_OPS_HOST_H
#define BATON_ENGINE_OPS_HOST_H

#include <stdint.h>

#include "engine/backend/backend.h"

int host_op_embed(struct baton_dev *dev, baton_dptr table, uint32_t dtype, uint32_t vocab,
    uint32_t cols, const uint32_t *tokens, uint32_t n, baton_dptr out);
int host_op_rmsnorm(struct baton_dev *dev, baton_dptr x, baton_dptr out, uint32_t rows,
    uint32_t cols, baton_dptr w, uint32_t w_dtype, float eps);
int host_op_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate);
int host_op_rope(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t n_heads,
    uint32_t head_dim, const uint32_t *pos, const float *inv_freq, float mscale);
int host_op_attention(struct baton_dev *dev, const struct baton_attn *a);
int host_op_kv_store(struct baton_dev *dev, const struct baton_kv_store *s);
int host_op_swiglu(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
    uint64_t n);
int host_op_add(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
    uint32_t rows, uint32_t cols);
int host_op_route(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
    uint32_t top_k, int rule, uint32_t *ids, float *weights);
int host_op_route_dev(struct baton_dev *dev, baton_dptr logits, uint32_t rows,
    uint32_t n_experts, uint32_t top_k, int rule, baton_dptr ids, baton_dptr weights);

/* Rows of a call's k and v that it reads (paged: through the end of the
 * highest block of its table); 0 for a paged call without a block size.
 * kv_store_check: the kv_store slot's checks (0 or the error code). Both
 * shared with the cuda backend, so that both refuse the same calls. */
uint64_t attn_cache_rows(const struct baton_attn *a, uint64_t n_ctx);
int kv_store_check(const struct baton_kv_store *s);

/* moe_host.c's worker pool for other ops: fn(arg, part, nparts) for every
 * part, parts chosen from the work (`macs` multiply-adds over `rows`
 * independent rows; small work runs on the caller alone). Serialized with
 * the MoE kernels on their lock; returns when every part is done. An op
 * that computes each output in one part gives the same bits at any count. */
void host_parallel(void (*fn)(void *arg, unsigned part, unsigned nparts), void *arg,
    uint64_t macs, uint32_t rows);

#endif
