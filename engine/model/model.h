/*
 * model.h: a whole MoE language model on an engine's device: the forward
 * pass from token ids to logits, one implementation for every supported
 * architecture, driven by a table of per-architecture switches (see
 * docs/internals/model.md).
 *
 *   qwen3_moe  q/k RMSNorm per head; softmax, top-k, renormalised when
 *              norm_topk_prob
 *   mixtral    no q/k norm; softmax, top-k, always renormalised (the same
 *              as a softmax over the top-k logits)
 *   olmoe      q/k RMSNorm over the whole projection; softmax, top-k,
 *              renormalised when norm_topk_prob
 *   qwen2_moe  q/k/v biases; a shared expert (SwiGLU) scaled by the
 *              sigmoid of its gate, added to the routed experts
 * Every one: RMSNorm, grouped-query attention with Hugging Face's
 * rotate_half RoPE (theta; rope type "default" or "linear"), SwiGLU experts
 * through the engine's expert cache, a final RMSNorm and the output head
 * (tied to the embeddings when the config says so).
 *
 * A model borrows an engine (engine.h): its arena (version 2: dense tensors
 * by Hugging Face name and config.json), backend, device and expert cache,
 * so release, refill, resize, partial and the peer tier behave as for GEN.
 * The model adds the dense tensors on the device and a paged KV cache
 * that several sequences share (model_step). Not thread-safe: one thread drives an engine and its model.
 */
#ifndef BATON_ENGINE_MODEL_H
#define BATON_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/model/engine.h"

#define BATON_MODEL_MAX_LAYERS 1024u

enum baton_qk_norm {
	BATON_QK_NORM_NONE = 0,
	BATON_QK_NORM_HEAD = 1,  /* weight [head_dim], each head's row apart */
	BATON_QK_NORM_WHOLE = 2, /* weight [heads * head_dim], the whole projection */
};

/* The switches that tell the architectures apart. */
struct baton_model_arch {
	const char *name;        /* Hugging Face model_type */
	int qk_norm;             /* enum baton_qk_norm */
	int always_renorm;       /* top-k weights renormalised whatever norm_topk_prob says */
	int shared_expert;       /* mlp.shared_expert.* and mlp.shared_expert_gate */
	const char *moe_prefix;  /* "mlp" or "block_sparse_moe": where the router is */
};

/* The configuration: config.json parsed and checked. */
struct baton_model_config {
	const struct baton_model_arch *arch;
	uint32_t vocab, hidden, layers, heads, kv_heads, head_dim;
	uint32_t n_experts, top_k, moe_ff, shared_ff;
	uint32_t max_pos;        /* max_position_embeddings */
	uint32_t window;         /* mixtral's sliding_window, 0 when none */
	float eps;               /* rms_norm_eps */
	double rope_theta;
	double rope_factor;      /* rope type "linear": positions / factor; 1 otherwise */
	int route_rule;          /* enum baton_route_rule */
	int qkv_bias;            /* q, k and v projections have biases */
	int o_bias;              /* o_proj has a bias (attention_bias) */
	int tie_embeddings;
	int64_t bos, eos;        /* -1 when absent (eos: the first when a list) */
};

/* Parses a Hugging Face config.json (bytes, not NUL-terminated) into *cfg.
 * An architecture, option or value this engine does not implement is
 * refused with BATON_EUNSUPPORTED and a message naming it; missing or
 * malformed fields with BATON_EINVAL naming the field. */
int model_config_parse(const char *json, size_t len, struct baton_model_config *cfg,
    char *errbuf, size_t errlen);
/* The switches of an architecture by model_type, or NULL. */
const struct baton_model_arch *model_arch_find(const char *model_type);

/* RoPE's inverse frequencies for cfg: inv_freq[i] for i < head_dim / 2,
 * as transformers computes them (1 / theta^(2i / head_dim), divided by the
 * linear factor), rounded to f32. */
void model_rope_inv_freq(const struct baton_model_config *cfg, float *inv_freq);

/* Positions per block of the paged KV cache. */
#define BATON_KV_BLOCK 16u

struct baton_model_opts {
	uint32_t max_ctx;   /* positions of one sequence; 0: min(max_position_embeddings, 4096) */
	uint32_t max_batch; /* token rows per batched pass; 0: 256 */
	uint32_t kv_blocks; /* blocks in the KV pool; 0: enough for max_ctx of one sequence */
};

struct baton_model;

/* Builds the model on engine `e` from its arena: parses config.json,
 * checks every tensor the architecture needs (name, shape, dtype the
 * backend computes) and uploads the dense ones to the device. The engine
 * must outlive the model. The KV cache is allocated on first use. */
int model_open(struct baton_engine *e, const struct baton_model_opts *opts,
    struct baton_model **out, char *errbuf, size_t errlen);
/* Frees the device memory the model holds (not the engine's); NULL allowed. */
void model_close(struct baton_model *m);

const struct baton_model_config *model_config(const struct baton_model *m);
/* Positions the default sequence holds now (prompt and decoded tokens). */
uint32_t model_pos(const struct baton_model *m);
uint32_t model_max_ctx(const struct baton_model *m);

/* ---- sequences over the paged KV cache ------------------------------------
 * The KV cache is a pool of blocks of BATON_KV_BLOCK positions, each
 * holding the K and V rows of every layer, one device allocation
 * (model_kv_alloc). A sequence owns a block table and its position: it
 * takes a block from the pool when it grows into one and gives them all
 * back when closed. */
struct baton_seq;

/* A new empty sequence (no blocks yet). BATON_ENOMEM. */
int model_seq_open(struct baton_model *m, struct baton_seq **out);
/* Gives its blocks back to the pool at once and frees it; NULL ok. */
void model_seq_close(struct baton_model *m, struct baton_seq *s);
/* Positions the sequence holds (prompt and decoded tokens). */
uint32_t model_seq_pos(const struct baton_seq *s);
uint32_t model_kv_free_blocks(const struct baton_model *m);
uint32_t model_kv_blocks_total(const struct baton_model *m);
/* Blocks the sequence must take from the pool to grow by n_more. */
uint32_t model_seq_blocks_needed(const struct baton_model *m, const struct baton_seq *s,
    uint32_t n_more);

struct baton_step_item {
	struct baton_seq *seq;
	const uint32_t *tokens;
	uint32_t n;
};

/* One forward pass over n_items sequences: item i appends its n tokens (a
 * prompt or a chunk of one, or one decoded token) to its sequence; the
 * logits of each item's last token go to logits + i * vocab. Dense ops run
 * once over all rows of the pass; attention runs per sequence over its own
 * blocks. Each sequence's logits are bitwise those of running it alone
 * (same backend). Errors: BATON_ENOSPC when the pool lacks blocks,
 * BATON_ERANGE past max_ctx or for a token id >= vocab, BATON_EINVAL for a
 * sequence twice in one step, n == 0 or no items; on error no sequence
 * changes. Rows per pass are bounded by max_batch: a larger step is split
 * inside. Refills a released model first (as prefill and decode do). */
int model_step(struct baton_model *m, const struct baton_step_item *items, uint32_t n_items,
    float *logits);

/* ---- one sequence: a convenience on a default sequence ------------------- */

/* Starts a new sequence with the n tokens of a prompt, in batched passes
 * of up to max_batch tokens, and writes the logits of the last token to
 * logits[vocab]. BATON_ERANGE for a token id >= vocab or a prompt longer
 * than max_ctx; BATON_ENOSPC when the pool lacks blocks; BATON_EINVAL for
 * n == 0. Bad input leaves the sequence as it was; other errors leave no
 * sequence (model_pos() == 0). */
int model_prefill(struct baton_model *m, const uint32_t *tokens, uint32_t n, float *logits);
/* Appends one token to the sequence and writes its logits. BATON_ESTATE
 * before a prefill; BATON_ERANGE when the context is full or the id is out
 * of range (the sequence is kept). */
int model_decode(struct baton_model *m, uint32_t token, float *logits);
/* Forgets the default sequence (its blocks go back to the pool). */
void model_reset(struct baton_model *m);
/* Allocates the KV pool now instead of at the first step, so a serving
 * engine holds it from the start (the broker counts it with the dense
 * weights, outside the expert cache). Idempotent; BATON_EOOM or
 * BATON_EDEVMEM when the device has no room. */
int model_kv_alloc(struct baton_model *m);
/* Frees the KV pool's device memory and empties every sequence (each
 * stays open, at position 0, holding no blocks); the next step allocates
 * the pool again. Idempotent. */
void model_kv_release(struct baton_model *m);
/* Device bytes the model holds: dense tensors, and the KV pool when
 * allocated (model_kv_block_bytes() per block). */
uint64_t model_dense_bytes(const struct baton_model *m);
uint64_t model_kv_bytes(const struct baton_model *m);
uint64_t model_kv_block_bytes(const struct baton_model *m);
/* Everything the model holds on the device now (dense tensors, KV cache,
 * activations); 0 while released. */
uint64_t model_device_bytes(const struct baton_model *m);

/* Gives back every byte of device memory the model holds (the engine's
 * expert cache is released apart, with engine_release): the KV blocks that
 * sequences hold are copied to host memory first (only those), so nothing
 * is lost. Idempotent. model_refill uploads the dense tensors again and
 * puts the blocks back where they were; step, prefill and decode refill by
 * themselves. A refill that runs out of device memory (BATON_EDEVMEM)
 * leaves the model released, its sequences kept, to be tried again.
 * Outputs after a refill are bitwise those without the release. */
int model_release(struct baton_model *m);
int model_refill(struct baton_model *m);
int model_released(const struct baton_model *m);
/* Passes whose MoE blocks routed on the device (no host round trip per
 * layer: small passes while every expert is resident and the backend has
 * route_dev; BATON_MODEL_HOST_ROUTE=1 at model_open turns it off). */
uint64_t model_device_route_passes(const struct baton_model *m);

#endif
