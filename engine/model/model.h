/*
 * model.h: the door of engine/model/: one loaded model on one device and
 * what runs on it, in four parts, bottom to top:
 *
 *   the engine     (engine.c)   the arena, the backend, the dense GEN
 *                               tensors and the expert cache on a device
 *   the sampler    (sample.c)   the next token from a model's logits
 *   the model      (config.c, model.c, weights.c, kv.c, prefix.c,
 *                   forward.c,  the forward pass of a whole MoE language
 *                   release.c)  model, its paged KV cache and prefix cache
 *   the generator  (generate.c) text in, text out: template, tokenizer,
 *                               model, sampler
 *
 * engine/serve/ and the benchmarks include this header only; the rest of
 * the folder's headers (model_int.h; model_fixture.h for the tests) are
 * internal to it.
 */
#ifndef BATON_ENGINE_MODEL_H
#define BATON_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/cache/cache.h"
#include "text/grammar/grammar.h"
#include "text/text.h"

/* ==== the engine ============================================================
 *
 * One loaded model on one device: the arena, the backend, the dense
 * tensors on the device, the expert cache and the decode loop. The serve
 * loop (engine/serve/) and the benchmarks drive it.
 *
 * Not thread-safe: one thread at a time calls into an engine; the serve
 * loop serializes GEN and control commands. */

#define BATON_GEN_MAX_BATCH 256u
#define BATON_GEN_MAX_STEPS 100000u

struct baton_engine_config {
	const char *name;
	const char *arena_path;
	const char *backend;       /* "host", "cuda" or "auto" */
	int device;
	uint64_t cache_bytes;      /* ceiling; 0 = auto: the whole model, or what fits */
	int whole_cache;           /* cache_bytes 0: the whole model even past what is free
	                            * now (under a broker, which makes room) */
	uint64_t segment_bytes;    /* 0 = 256 MiB */
	uint64_t reserve_bytes;    /* headroom kept free when growing (--vram-reserve-mib) */
	uint64_t host_capacity;    /* host backend device size; 0 = its default */
	int verify;                /* --verify-refill */
	int warm;                  /* fill the cache at open (default 1) */
	int use_peer;              /* open peer_device as the peer tier's device */
	int peer_device;           /* same backend, != device (--peer-device) */
};

struct baton_gen_timings {
	double route_s, load_s, compute_s, total_s;
};

struct baton_engine;

/* Opens the arena, the backend and the cache, uploads the dense tensors and
 * (when cfg->warm) fills the cache. errbuf gets a sentence naming the
 * problem. The engine owns everything it opened; engine_close frees it. */
int engine_open(const struct baton_engine_config *cfg, struct baton_engine **out,
    char *errbuf, size_t errlen);
void engine_close(struct baton_engine *e);

/* Runs `steps` decode steps over `batch` tokens through every layer. The
 * start state is `input` (batch * d_model floats) or, when NULL, derived
 * from `seed`. `output` (may be NULL) receives batch * d_model floats;
 * *checksum is XXH3-64 of those bytes. Misses load experts; while released
 * or partial the cache maps what the request needs first. */
int engine_gen(struct baton_engine *e, uint32_t steps, uint32_t batch, uint64_t seed,
    const float *input, float *output, uint64_t *checksum, struct baton_gen_timings *t);

int engine_release(struct baton_engine *e, struct baton_cache_report *rep);
/* Gives back the device memory of the GEN path (each layer's router and
 * norm, the activations), for a release of everything (serve's release
 * with all); engine_gen uploads them again first. Idempotent; the bytes
 * freed. */
uint64_t engine_release_gen(struct baton_engine *e);
int engine_refill(struct baton_engine *e, struct baton_cache_report *rep);
/* reserve_bytes < 0: grow back to the configured size. */
int engine_vram(struct baton_engine *e, int64_t reserve_bytes, struct baton_cache_report *rep);
/* The peer tier (cache_peer_set on the peer device): bytes > 0 holds up to
 * that much there, 0 drops it. BATON_EUNSUPPORTED without a peer device. */
int engine_peer(struct baton_engine *e, uint64_t bytes, struct baton_cache_report *rep);
/* The peer device's free and total memory (any thread, like
 * engine_mem_info); BATON_EUNSUPPORTED without a peer device. */
int engine_peer_mem_info(struct baton_engine *e, uint64_t *free_bytes, uint64_t *total_bytes);

struct baton_engine_info {
	const char *name, *backend, *arena;
	char gpu[64];
	uint32_t d_model, layers, experts, top_k;
	uint64_t model_bytes;          /* every expert blob */
	uint64_t dense_bytes;          /* router + norms on the device */
	uint64_t dev_free, dev_total;
	const char *compute_error;     /* NULL when GEN can run on this backend */
	/* NULL, or why "auto" runs on the host backend although a GPU is
	 * present (/dev/nvidia0 or /proc/driver/nvidia): this build has no
	 * CUDA backend, or the driver failed. Said on stderr at open too. */
	const char *backend_warning;
	double pin_s;                  /* host_register of the arena at open */
	char peer_gpu[64];             /* the peer device's uuid; "" without one */
	uint64_t peer_want;            /* cache_peer_want: what a peer tier could use */
	struct baton_cache_stats cache;
};
void engine_info(struct baton_engine *e, struct baton_engine_info *info);
/* The device's free and total memory now; unlike the rest, any thread may
 * call it while another uses the engine. */
int engine_mem_info(struct baton_engine *e, uint64_t *free_bytes, uint64_t *total_bytes);
struct baton_cache *engine_cache(struct baton_engine *e);
/* The engine's own mapping of the arena (pinned when the backend pins). */
const struct baton_arena *engine_arena(struct baton_engine *e);
struct baton_dev *engine_dev(struct baton_engine *e);
/* The backend the engine drives its device with (the forward pass runs
 * its ops through it). */
const struct baton_backend *engine_backend(struct baton_engine *e);
/* The peer device, or NULL. */
struct baton_dev *engine_peer_dev(struct baton_engine *e);

/* ==== the sampler ===========================================================
 *
 * Choosing the next token from a model's logits: greedy,
 * temperature, top-k, top-p, min-p, repetition, presence and frequency
 * penalties, logit bias, stop token ids, max tokens, and a seed that makes
 * a run repeatable. The semantics and the order are Hugging Face's and
 * vLLM's (docs/sampling.md):
 *
 *   1. logit bias           l[t] += bias[t]                         (OpenAI)
 *   2. repetition penalty   for each distinct t in prompt + output:
 *                           l > 0 ? l / r : l * r                   (HF)
 *   3. presence, frequency  l[t] -= count[t] * freq + (count[t] > 0) * pres,
 *                           counts over the output only             (OpenAI)
 *   4. temperature < 1e-5   greedy: the largest logit, ties to the lowest id
 *   5. temperature          l /= T
 *   6. top-k                keep the k largest (ties with the k-th kept)
 *   7. top-p                drop the least likely while their total
 *                           probability stays <= 1 - p (keep at least one)
 *   8. min-p                drop tokens with p < min_p * p_max
 *   9. draw                 from softmax of what is left, with the
 *                           sampler's own PRNG (xoshiro256**, seeded)
 *
 * NaN logits count as -inf. Stop strings belong to the text layer: it
 * decodes the tokens as they come (baton_sampler_next's tokens, one at a
 * time) and, on a match, stops the loop and trims the text; the sampler
 * reports only stop token ids and the length limit.
 *
 * Not thread-safe: one sampler per sequence, used by one thread at a time. */

struct baton_logit_bias {
	uint32_t token;
	float bias;       /* finite; OpenAI's range is [-100, 100] */
};

/* All zeros is not valid (repetition_penalty and top_p 0): start from
 * baton_sample_defaults(), which is plain sampling at temperature 1. */
struct baton_sample_params {
	float temperature;          /* >= 0; below 1e-5 (0): greedy */
	uint32_t top_k;             /* 0: off; >= vocabulary: off */
	float top_p;                /* (0, 1]; 1: off */
	float min_p;                /* [0, 1]; 0: off */
	float repetition_penalty;   /* > 0; 1: off */
	float presence_penalty;     /* [-2, 2]; 0: off */
	float frequency_penalty;    /* [-2, 2]; 0: off */
	uint64_t seed;              /* the same seed, logits and calls: the same tokens */
	uint32_t max_tokens;        /* tokens to generate; 0: no limit */
	const uint32_t *stop_ids;   /* tokens that end the output (e.g. end of turn) */
	uint32_t n_stop_ids;
	const struct baton_logit_bias *bias;
	uint32_t n_bias;
};

/* Why the output ended: not yet, a stop token (the last token is it; it is
 * not text), or max_tokens (the last token is ordinary output). */
enum baton_finish {
	BATON_FINISH_NONE = 0,
	BATON_FINISH_STOP = 1,
	BATON_FINISH_LENGTH = 2,
};

struct baton_sampler;

struct baton_sample_params baton_sample_defaults(void);

/* A sampler for one sequence over a vocabulary of n_vocab tokens. The
 * parameters are checked (BATON_EINVAL, with a sentence in errbuf naming
 * the field) and copied: the caller's arrays need not outlive the call.
 * BATON_ENOMEM. The caller frees *out with baton_sampler_free (NULL is
 * allowed there). */
int baton_sampler_new(const struct baton_sample_params *p, uint32_t n_vocab,
    struct baton_sampler **out, char *errbuf, size_t errlen);
void baton_sampler_free(struct baton_sampler *s);

/* Records the prompt's tokens (the repetition penalty covers them; the
 * presence and frequency penalties do not). May be called more than once
 * before the first token is drawn (chunks); BATON_ESTATE after it,
 * BATON_EINVAL for an id outside the vocabulary (nothing recorded then). */
int baton_sampler_prompt(struct baton_sampler *s, const uint32_t *ids, size_t n);

/* Draws the next token from logits[n_vocab] (which it modifies: the
 * caller's scratch), records it, and says whether the output ends here.
 * BATON_ESTATE once the output has ended; BATON_EINVAL when no logit is
 * finite after the penalties. */
int baton_sampler_next(struct baton_sampler *s, float *logits, uint32_t *token,
    enum baton_finish *finish);

/* Constrained decoding (text/grammar/): a bitset of the tokens that may
 * come next, bit t of allow[t / 64]; a clear bit makes token t's logit
 * -inf before step 1, in every baton_sampler_next and baton_sampler_probs
 * until it is set again. The caller rewrites the bits between calls and
 * keeps the array alive while it is set. NULL (the default): no mask, and
 * no cost. */
void baton_sampler_set_mask(struct baton_sampler *s, const uint64_t *allow);

/* The distribution step 9 would draw from, for these logits and the tokens
 * recorded so far: probs[n_vocab], zeros where a token was dropped (greedy:
 * 1 at the chosen token). Changes nothing in the sampler; logits are
 * modified as by baton_sampler_next. For tests and log-probabilities. */
int baton_sampler_probs(struct baton_sampler *s, float *logits, float *probs);

/* Tokens drawn so far, and the finish reason. */
uint32_t baton_sampler_count(const struct baton_sampler *s);
enum baton_finish baton_sampler_finish(const struct baton_sampler *s);

/* ==== the model =============================================================
 *
 * A whole MoE language model on an engine's device: the forward
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
 * rotate_half RoPE (theta; rope type "default", "linear" or "yarn"), SwiGLU experts
 * through the engine's expert cache, a final RMSNorm and the output head
 * (tied to the embeddings when the config says so).
 *
 * A model borrows an engine (above): its arena (version 2: dense tensors
 * by Hugging Face name and config.json), backend, device and expert cache,
 * so release, refill, resize, partial and the peer tier behave as for GEN.
 * The model adds the dense tensors on the device and a paged KV cache
 * that several sequences share (model_step). Not thread-safe: one thread drives an engine and its model. */

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

/* The rope types (rope_scaling's / rope_parameters' rope_type). */
enum baton_rope_type {
	BATON_ROPE_DEFAULT = 0,
	BATON_ROPE_LINEAR = 1,
	BATON_ROPE_YARN = 2,
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
	int rope_type;           /* enum baton_rope_type */
	double rope_factor;      /* linear: positions / factor; yarn: its factor; 1 otherwise */
	float rope_mscale;       /* cos and sin times this: yarn's attention factor; 1 otherwise */
	uint32_t rope_orig_max_pos; /* yarn: original_max_position_embeddings */
	double rope_beta_fast, rope_beta_slow; /* yarn */
	int rope_truncate;       /* yarn: the correction range rounded out to whole dims */
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
 * as transformers computes them: 1 / theta^(2i / head_dim), divided by the
 * linear factor, rounded to f32; for yarn, transformers' f32 blend of the
 * interpolated and extrapolated frequencies (config.c). The cos and sin of
 * the angles are then multiplied by cfg->rope_mscale. */
void model_rope_inv_freq(const struct baton_model_config *cfg, float *inv_freq);

/* Positions per block of the paged KV cache. */
#define BATON_KV_BLOCK 16u

struct baton_model_opts {
	uint32_t max_ctx;   /* positions of one sequence; 0: min(max_position_embeddings, 4096) */
	uint32_t max_batch; /* token rows per batched pass; 0: 256 */
	uint32_t kv_blocks; /* blocks in the KV pool; 0: sized from the device (kv_size.c:
	                     * kv_seqs whole contexts, at most a sixteenth of the device's
	                     * memory and what is free, at least one context) */
	uint32_t kv_seqs;   /* sequences that run at once (--max-seqs), for that size; 0: 16 */
	int content_special; /* generators: special tokens' text in a message is the token
	                      * (HF's way); 0: it is text, only the template makes them */
	int no_prefix_cache; /* 1: full blocks are not kept for later sequences (--no-prefix-cache) */
	uint64_t kv_host_bytes; /* a release keeps up to this much of the prefix cache's
	                         * unheld blocks in host memory (--kv-host-mib); 0: none */
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

/* ---- the prefix cache ------------------------------------------------------
 * A full block (BATON_KV_BLOCK positions) is keyed by a hash chain over
 * its tokens and every token before it (seeded with the model's
 * identity), and kept after its sequence lets go of it: a later sequence
 * that starts with the same tokens takes it (a reference) instead of
 * computing it again. Blocks nobody holds are evicted least recently used
 * when the pool needs room, after the free ones; a block some sequence
 * holds never is. A match compares the tokens and the block before it
 * too, so a hash collision never gives a block of another prefix.
 * model_kv_free_blocks counts free and evictable blocks. See
 * docs/internals/prefix-cache.md. */

/* Takes the longest cached prefix of tokens[0 .. n) for the empty
 * sequence s (no blocks, position 0): whole blocks only, and never the
 * last token (its logits must be computed). Returns the positions taken
 * (a multiple of BATON_KV_BLOCK; s's position is then that), 0 with the
 * cache off or for a sequence not empty. Counts a lookup of n tokens. */
uint32_t model_seq_prefix(struct baton_model *m, struct baton_seq *s, const uint32_t *tokens,
    uint32_t n);

/* What model_seq_prefix would take now, taking nothing and counting
 * nothing; *unheld (may be NULL): how many of those blocks no sequence
 * holds (taking them makes them unevictable, so the free count drops by
 * that much). */
uint32_t model_prefix_peek(const struct baton_model *m, const uint32_t *tokens, uint32_t n,
    uint32_t *unheld);

struct baton_prefix_stats {
	int enabled;
	uint64_t lookups;           /* model_seq_prefix calls */
	uint64_t lookup_tokens;     /* tokens they asked for */
	uint64_t hit_tokens;        /* tokens they found cached */
	uint64_t evictions;         /* cached blocks taken for other positions */
	uint64_t host_dropped;      /* cached blocks a release dropped (past kv_host_bytes) */
	uint32_t cached_blocks;     /* blocks in the cache now (held or not) */
	uint32_t evictable_blocks;  /* of them, held by no sequence */
	uint64_t host_bytes;        /* KV bytes held in host memory while released */
	uint32_t host_blocks;       /* blocks of them (held ones and cached ones) */
	uint64_t host_limit;        /* kv_host_bytes */
	uint64_t restored_blocks;   /* blocks copied back from host memory, in all */
	double last_restore_s;      /* the last copy back, seconds */
};
void model_prefix_stats(const struct baton_model *m, struct baton_prefix_stats *st);
/* Test hook: every block hashes alike (forced collisions); also
 * BATON_TEST_KV_HASH_COLLIDE=1 at model_open. */
void model_prefix_test_collide(struct baton_model *m, int on);
/* A block's holders (its reference count), for the tests; s's block b. */
uint32_t model_seq_block_refs(const struct baton_model *m, const struct baton_seq *s, uint32_t b);
uint32_t model_seq_block_id(const struct baton_seq *s, uint32_t b);

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

/* ---- perplexity (perplexity.c) --------------------------------------------
 * llama.cpp's llama-perplexity over tokens[0..n): n / ctx chunks of ctx
 * tokens (at most max_chunks, 0: all), each a fresh sequence whose first
 * token is replaced by bos (when bos >= 0: the tokenizer adds BOS), the
 * logits at positions ctx / 2 .. ctx - 2 scored against the next token
 * with llama.cpp's log-softmax; `seqs` chunks side by side (the KV pool
 * must hold seqs x ctx positions). BATON_EINVAL for ctx < 4, seqs 0 or
 * fewer than 2 ctx tokens (llama.cpp's rule); BATON_ERANGE for ctx past
 * the model's context or an id outside the vocabulary; err says which. */
struct baton_ppl {
	uint32_t chunks, ctx;
	uint64_t scored;       /* tokens scored: chunks x (ctx - 1 - ctx / 2) */
	double nll;            /* their mean negative log-likelihood */
	double ppl, ppl_err;   /* exp(nll), and llama.cpp's "+/-" */
};
int model_perplexity(struct baton_model *m, const uint32_t *tokens, size_t n, uint32_t ctx,
    int32_t bos, uint32_t max_chunks, uint32_t seqs, struct baton_ppl *out, char *err,
    size_t errlen);
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
/* How many of those passes ran as one graph (backends with graph_begin /
 * graph_end: cuda, on by default; BATON_CUDA_GRAPH=0 turns them off). */
uint64_t model_graph_passes(const struct baton_model *m);
/* How many of those replayed an earlier pass's recording (checked against
 * it on the host, nothing recorded: cuda), not recorded anew. */
uint64_t model_graph_replays(const struct baton_model *m);
/* Forward passes run (model_step splits a step of more than max_batch
 * rows into several), and the rows a pass takes at most. */
uint64_t model_passes(const struct baton_model *m);
/* One pass of up to `rows` made-up tokens (at most max_batch, max_ctx and
 * what the KV pool holds) in a sequence of its own, closed after, with
 * nothing kept in the prefix cache: what a backend makes on first use for
 * such passes (cuda: cuBLAS's kernels for the shapes the experts' token
 * counts give, scratch buffers) is made now, not in the first requests'
 * steps. Only on a backend with `prepare` (one that has such state),
 * unless force, and only while every expert is resident (it loads none:
 * an engine under a broker starts released). The sequences, the pool and
 * every later output are what
 * they were; the expert cache counts the pass's lookups as any pass's. */
int model_warm(struct baton_model *m, uint32_t rows, int force);
uint32_t model_max_batch(const struct baton_model *m);
/* A buffer for the logits of model_step (the scheduler's: max_seqs x
 * vocab floats): the backend's pinned host memory where it has it
 * (host_alloc), so that a step's rows come back in one copy at the
 * device's rate, straight into it, instead of a staged copy and a memcpy
 * each; else malloc's. The same outputs either way. NULL when out of
 * memory. model_logits_free before model_close. */
float *model_logits_alloc(struct baton_model *m, uint64_t bytes);
void model_logits_free(struct baton_model *m, float *p);
/* Seconds head() has spent so far waiting for passes on the device (the
 * sync before the logits copy) and copying logits to the host. */
void model_head_times(const struct baton_model *m, double *sync_s, double *copy_s);
/* Seconds the host has waited for the device so far, every wait (the
 * backend's wait_seconds; 0 without it). */
double model_wait_seconds(const struct baton_model *m);

/* ==== the generator =========================================================
 *
 * Text in, text out. A generator joins the three parts of a language
 * model that an arena (version 2) holds: its tokenizer and chat template
 * (text/text.h), its forward pass and a sampler (above). One request: render the conversation with the model's own
 * chat template (or take a raw prompt), encode it, prefill, then decode
 * and sample one token per step until a stop token, a stop string or the
 * length limit, streaming the text as it becomes final.
 *
 * A request in flight is a struct baton_gen_seq: generator_start renders
 * and encodes its prompt and seeds its own sampler; generator_seq_next
 * takes the logits of its last position, samples, and passes on the text
 * that became final; generator_seq_result hands over the answer. Who runs
 * the forward passes is the caller's: generator_run (one request alone,
 * on the model's own sequence) or the scheduler (engine/serve/sched.c: many requests
 * sharing each step). The same request and seed give the same answer
 * either way, since each sequence's logits do not depend on the others.
 *
 * Not thread-safe: one thread drives a generator and its requests (the
 * serve loop's scheduler thread). */

#define BATON_GEN_MAX_STOP 16u          /* stop strings of one request */

struct baton_generator;

/* Builds a generator on engine `e`: the tokenizer from the arena's
 * tokenizer.json (+ tokenizer_config.json) or gguf_tokenizer.json, the
 * chat template from chat_template.jinja or the tokenizer's config, the
 * end-of-sequence ids from the tokenizer, config.json and
 * generation_config.json, and the model (model_open with `opts`, NULL for
 * the defaults) with its KV cache allocated now: the dense weights and the
 * KV cache are held for as long as the generator lives (a release gives
 * back the experts only). An arena without a
 * whole model (the synthetic experts-only kind) is BATON_EUNSUPPORTED
 * with a sentence saying so. The engine must outlive the generator. */
int generator_open(struct baton_engine *e, const struct baton_model_opts *opts,
    struct baton_generator **out, char *errbuf, size_t errlen);
void generator_close(struct baton_generator *g);

/* The tokenizer, for tests and for `baton tokenize`-like uses. */
const text_tok *generator_tokenizer(const struct baton_generator *g);
/* The architecture's name (Hugging Face model_type: "qwen3_moe", ...). */
const char *generator_arch(const struct baton_generator *g);
/* The chat template's family ("qwen3", "mixtral", ...), or NULL when the
 * model has no template this engine renders. */
const char *generator_chat_family(const struct baton_generator *g);
/* The chat template's source, or NULL (the API reads its tool-call and
 * reasoning formats from it). */
const char *generator_chat_template(const struct baton_generator *g);

/* Called with each piece of text as it becomes final (never a partial
 * UTF-8 character, never a piece of a stop string). Returning nonzero
 * cancels the request: it ends with finish "cancelled". */
typedef int (*baton_gen_text_fn)(void *arg, const char *text, size_t len);

struct baton_gen_request {
	/* exactly one of prompt, prompt_ids and msgs */
	const char *prompt;             /* raw text; BOS added as the tokenizer says */
	size_t prompt_len;
	const uint32_t *prompt_ids;     /* token ids, taken as they are (no BOS added) */
	size_t n_prompt_ids;
	const struct text_msg *msgs;    /* rendered with the model's chat template */
	size_t n_msgs;
	int enable_thinking;            /* -1: the template's default (Qwen3) */
	const char *tools;              /* JSON array for the template's `tools`; NULL: None */
	const char *template_kwargs;    /* JSON object of more template variables; NULL: none */
	int keep_special;               /* the text keeps special tokens (Mistral's [TOOL_CALLS]) */
	int *think_open;                /* out (may be NULL): set to 1 at start when the rendered
	                                 * prompt ends inside a <think> (DeepSeek-R1, Qwen3
	                                 * thinking-2507): the answer begins with reasoning */
	struct baton_sample_params sp;  /* stop_ids: extra to the model's own */
	const char *const *stop;        /* stop strings, not part of the text */
	size_t n_stop;
	baton_gen_text_fn on_text;      /* may be NULL */
	void *arg;
	/* Log-probabilities (OpenAI's logprobs): with on_token set, each
	 * sampled token that is text (not the stop token) is passed on, before
	 * its text, with its log-probability under the model's own distribution
	 * (log-softmax of the raw logits, before bias, penalties and
	 * temperature: vLLM's default) and the n_top (<= BATON_GEN_MAX_TOP)
	 * most likely tokens with theirs, most likely first. */
	void (*on_token)(void *arg, uint32_t id, float logprob, const uint32_t *top_ids, const float *top_lps,
	    uint32_t n_top);
	uint32_t n_top;
	/* structured output: the output must be a document of this grammar
	 * (text/grammar/grammar.h; it must outlive the request). A matcher
	 * masks every sampled token; the model's end-of-sequence ids are
	 * allowed only once the document is whole. NULL: free text. */
	const gram *grammar;
	/* with grammar: the output is free text until it ends with this
	 * string (a tool call's opening tag, "<tool_call>"); from there the
	 * grammar holds until its document is whole, then the text is free
	 * again, up to the next one (strict tools with tool_choice auto).
	 * NULL: the grammar holds from the first token. */
	const char *grammar_trigger;
};

#define BATON_GEN_MAX_TOP 20u

struct baton_gen_result {
	char *text;                     /* the completion, NUL-terminated (malloc) */
	size_t text_len;
	uint32_t *tokens;               /* its ids, a stop token included (malloc) */
	uint32_t n_tokens;
	uint32_t n_prompt;              /* prompt tokens */
	uint32_t n_cached;              /* of them, read from the prefix cache (the scheduler's) */
	const char *finish;             /* "stop", "length" or "cancelled" */
	double prefill_s, decode_s;
};

/* Runs one request. Errors (a bad request: BATON_EINVAL, BATON_ERANGE for
 * a prompt longer than the context; the model's or the template's) come
 * with a sentence in errbuf and leave *res empty. On success the caller
 * frees *res with generator_result_free. */
int generator_run(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_result *res, char *errbuf, size_t errlen);
void generator_result_free(struct baton_gen_result *res);

/* The model the generator drives (its forward passes are the caller's
 * when it runs requests with generator_start). */
struct baton_model *generator_model(const struct baton_generator *g);

/* ---- one request in flight ---- */
struct baton_gen_seq;

/* Checks req, encodes its prompt, makes its sampler. The request's
 * strings (stop) and on_text's arg must outlive the sequence. Errors as
 * generator_run's, nothing left then. */
int generator_start(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_seq **out, char *errbuf, size_t errlen);
/* The prompt's token ids (owned by s) and how many. */
const uint32_t *generator_seq_prompt(const struct baton_gen_seq *s, uint32_t *n);
/* Tokens it may still sample: max_tokens capped by the context's room. */
uint32_t generator_seq_max_tokens(const struct baton_gen_seq *s);
/* Its prefill starts now (the time counted as prefill_s starts here, not
 * at generator_start: a scheduler's queue wait is not prefill). */
void generator_seq_begin(struct baton_gen_seq *s);
/* Takes the logits of the sequence's last position (modified: scratch),
 * samples the next token into *token and passes on the text that became
 * final (on_text). Then generator_seq_finished says whether it ended; if
 * not, *token is what the model must take next. BATON_ESTATE after the
 * end; the sampler's errors. */
/* generator_seq_next in two halves, for a scheduler that samples its
 * sequences on several threads: pick (the logits' masks, the sampler:
 * nothing but s and its logits is written, so picks of different
 * sequences may run at once) and take (the token's text, its callbacks;
 * on the caller's thread). next = pick, then take if pick returned 0. */
int generator_seq_pick(struct baton_gen_seq *s, float *logits, char *errbuf, size_t errlen);
int generator_seq_take(struct baton_gen_seq *s, uint32_t *token, char *errbuf, size_t errlen);
int generator_seq_next(struct baton_gen_seq *s, float *logits, uint32_t *token,
    char *errbuf, size_t errlen);
/* NULL while it runs; "stop", "length" or "cancelled" once it ended. */
const char *generator_seq_finished(const struct baton_gen_seq *s);
/* Ends it now as "cancelled" (the client went away); idempotent. */
void generator_seq_cancel(struct baton_gen_seq *s);
/* After the end: the answer, as generator_run gives it (the stream's last
 * text is passed on first). The caller frees *res. BATON_ESTATE before. */
int generator_seq_result(struct baton_gen_seq *s, struct baton_gen_result *res,
    char *errbuf, size_t errlen);
void generator_seq_free(struct baton_gen_seq *s);

#endif
