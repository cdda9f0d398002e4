/*
 * ops_host.h: internal to the engine component. The host backend's dense
 * ops of the forward pass (engine/ops_host.c), the reference the other
 * backends are checked against; their exact semantics are those of the
 * slots of the same names in engine/backend.h. A baton_dptr is a host
 * address; `dev` is not used and may be NULL. Single-threaded, no shared
 * state: any thread may call them on its own buffers.
 */
#ifndef BATON_ENGINE_OPS_HOST_H
#define BATON_ENGINE_OPS_HOST_H

#include <stdint.h>

#include "engine/backend.h"

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
int host_op_swiglu(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
    uint64_t n);
int host_op_add(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
    uint32_t rows, uint32_t cols);
int host_op_route(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
    uint32_t top_k, int rule, uint32_t *ids, float *weights);

#endif
