/*
 * model.h: a whole MoE language model on an engine's device: the forward
 * pass from token ids to logits, one implementation for every supported
 * architecture, driven by a table of per-architecture switches (see
 * docs/model.md).
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
 * The model adds the dense tensors on the device and a KV cache for one
 * sequence. Not thread-safe: one thread drives an engine and its model.
 */
#ifndef BATON_ENGINE_MODEL_H
#define BATON_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend.h"
#include "engine/engine.h"

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

struct baton_model_opts {
	uint32_t max_ctx;   /* KV cache positions; 0: min(max_position_embeddings, 4096) */
	uint32_t max_batch; /* prompt tokens per batched pass; 0: 256 */
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
/* Positions the sequence holds now (prompt and decoded tokens). */
uint32_t model_pos(const struct baton_model *m);
uint32_t model_max_ctx(const struct baton_model *m);

/* Starts a new sequence with the n tokens of a prompt, in batched passes
 * of up to max_batch tokens, and writes the logits of the last token to
 * logits[vocab]. BATON_ERANGE for a token id >= vocab or a prompt longer
 * than max_ctx; BATON_EINVAL for n == 0. Errors leave no sequence
 * (model_pos() == 0). */
int model_prefill(struct baton_model *m, const uint32_t *tokens, uint32_t n, float *logits);
/* Appends one token to the sequence and writes its logits. BATON_ESTATE
 * before a prefill; BATON_ERANGE when the context is full or the id is out
 * of range (the sequence is kept). */
int model_decode(struct baton_model *m, uint32_t token, float *logits);
/* Forgets the sequence (the KV cache stays allocated). */
void model_reset(struct baton_model *m);
/* Allocates the KV cache now (max_ctx positions) instead of at the first
 * prefill, so a serving engine holds it from the start (the broker counts
 * it with the dense weights, outside the expert cache). Idempotent;
 * BATON_EOOM when the device has no room. */
int model_kv_alloc(struct baton_model *m);
/* Frees the KV cache's device memory and forgets the sequence; the next
 * prefill allocates it again. Idempotent. */
void model_kv_release(struct baton_model *m);
/* Device bytes the model holds: dense tensors, and the KV cache when
 * allocated. */
uint64_t model_dense_bytes(const struct baton_model *m);
uint64_t model_kv_bytes(const struct baton_model *m);
/* Everything the model holds on the device now (dense tensors, KV cache,
 * activations); 0 while released. */
uint64_t model_device_bytes(const struct baton_model *m);

/* Gives back every byte of device memory the model holds (the engine's
 * expert cache is released apart, with engine_release): the sequence's KV
 * rows are copied to host memory first, so nothing is lost. Idempotent.
 * model_refill uploads the dense tensors again and puts the KV rows back;
 * prefill and decode refill by themselves. A refill that runs out of
 * device memory (BATON_EDEVMEM) leaves the model released, its sequence
 * kept, to be tried again. Outputs after a refill are bitwise those
 * without the release. */
int model_release(struct baton_model *m);
int model_refill(struct baton_model *m);
int model_released(const struct baton_model *m);

#endif
