/*
 * model_int.h: internal to engine/model/'s model (model.c, weights.c,
 * kv.c, prefix.c, forward.c, release.c); the door is model.h. The model's
 * state and the few functions one part gives another. The calls go one
 * way: forward.c uses release.c (a step refills first), kv.c and prefix.c;
 * release.c and model.c use weights.c, kv.c and prefix.c; kv.c and prefix.c
 * use each other (the pool's blocks, the cache's index of them), weights.c
 * none of them.
 */
#ifndef BATON_ENGINE_MODEL_INT_H
#define BATON_ENGINE_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"

#define DEFAULT_CTX 4096u
#define DEFAULT_BATCH 256u
/* kv_size.c: the default KV pool (no --kv-blocks), in blocks, for a model
 * whose dense weights are on the device: max_seqs whole contexts, at most
 * a sixteenth of the device's memory and what is free there after the
 * expert cache's floor and reserve, at least one context. */
#define KV_DEFAULT_SHARE 16u
uint32_t kv_default_blocks(const struct baton_model *m, uint32_t max_seqs);
#define HEAD_ROWS 16u      /* output-head rows per matmul: bounds the logits buffer */
#define MAX_BLOCKS (1u << 27) /* slots (block * BLOCK + row) stay below 2^31 */
#define NAME_MAX_LEN 160

/* A dense tensor on the device. */
struct dtensor {
	baton_dptr p;      /* 0: absent (optional tensors) */
	uint32_t dtype;
};

/* A dense tensor's bytes in the arena, uploaded at open and at refill. */
struct upload {
	struct dtensor *t;
	const void *src;
	uint64_t bytes;
};

struct layer {
	struct dtensor in_norm, post_norm;
	struct dtensor q, k, v, o, qb, kb, vb, ob, q_norm, k_norm;
	struct dtensor router;
	struct dtensor sh_gate, sh_up, sh_down, sh_g; /* qwen2_moe's shared expert */
	uint64_t gate_off, up_off, down_off;          /* inside an expert blob */
	uint32_t gate_dt, up_dt, down_dt;
};

#define KV_NONE UINT32_MAX

/* One block of the pool, for the prefix cache (prefix.c). A block is free (on
 * the free stack), held (ref > 0: in some sequences' tables) or cached
 * and unheld (on the LRU list); a cached block is in the hash table
 * under hash, with its tokens and the cached block before it (parent,
 * and that block's gen then, so a parent evicted and reused is seen). */
struct kv_blk {
	uint64_t hash;
	uint32_t ref;
	uint32_t gen;                  /* grows when it leaves the cache */
	uint32_t parent, parent_gen;   /* KV_NONE: the first block of a sequence */
	uint32_t prev, next;           /* the LRU list (unheld cached blocks) */
	uint32_t hnext;                /* its hash bucket's chain */
	uint32_t cached;
	uint32_t toks[BATON_KV_BLOCK];
};

struct baton_seq {
	struct baton_seq *prev, *next; /* the model's open sequences */
	uint32_t pos;
	uint32_t n_blocks;             /* blocks[0 .. n_blocks) own positions */
	uint32_t *blocks;              /* ceil(max_ctx / BLOCK) entries */
	uint32_t mark;                 /* model_step: taken blocks before it, +1 */
	/* the prefix cache: the tokens of the block being filled, and the
	 * cached block that holds its last full block's prefix (chain_id
	 * KV_NONE with pos >= BLOCK: the chain broke, nothing more of it is
	 * cached) */
	uint32_t part[BATON_KV_BLOCK];
	uint64_t chain;
	uint32_t chain_id, chain_gen;
};

/* A part of a pass: n rows of one item's sequence from position pos0. */
struct segment {
	struct baton_seq *seq;
	const uint32_t *tokens;
	uint32_t n, pos0;
	float *logits;                 /* where its last row's logits go, or NULL */
};

struct baton_model {
	struct baton_engine *e;
	const struct baton_backend *be;
	struct baton_dev *dev;
	struct baton_cache *cache;
	struct baton_model_config cfg;
	struct layer *layers;
	struct dtensor embed, norm, head;
	struct upload *ups;           /* every dense tensor: where it comes from */
	uint32_t n_ups, cap_ups;
	uint64_t dense_bytes;
	int released;                 /* model_release: nothing on the device */
	void *kv_saved;               /* saved blocks' KV rows while the pool is away: per
	                               * layer K then V, n_saved blocks each */
	uint32_t *saved_ids, n_saved; /* which blocks kv_saved holds, ascending */
	float *inv_freq;              /* head_dim / 2 */
	uint32_t max_ctx, max_batch;
	/* activations, max_batch rows (logits: HEAD_ROWS rows) */
	baton_dptr x, xn, q, ao, rl, sg, su, sy, gl, kx, vx, logits;
	baton_dptr act_base;
	uint64_t act_bytes;
	/* the KV pool (see the top); kv == 0 while not allocated */
	baton_dptr kv;
	uint64_t kv_bytes;
	uint32_t n_blocks, n_free, seq_blocks; /* seq_blocks: a table's length */
	uint32_t *free_ids;           /* the free stack, n_free of n_blocks */
	/* the prefix cache (prefix.c) */
	struct kv_blk *blk;           /* n_blocks */
	uint32_t *buckets, n_buckets; /* hash table heads (power of two) */
	uint32_t lru_head, lru_tail, n_lru; /* head: least recently used */
	uint32_t n_cached;
	int pc_on, pc_collide;
	uint64_t salt;                /* the model's identity: the chain's seed */
	uint64_t host_limit;          /* kv_host_bytes */
	uint64_t saved_bytes;         /* kv_saved's size */
	int saved_pinned;
	struct baton_prefix_stats pst;
	struct baton_seq *seqs;       /* open sequences */
	struct baton_seq *def;        /* prefill/decode's sequence */
	/* host scratch */
	uint32_t *ids, *want, *posv, *slots, *toks;
	float *w;
	baton_dptr *blobs;
	struct segment *segs;         /* max_batch */
	struct baton_attn_seg *asegs; /* max_batch: a pass's segments for attention_segs */
	/* The MoE block without a host round trip (moe_dev_ready): the
	 * cache's blob table on the device, each layer's routing results. */
	baton_dptr rt_base;           /* 0 until a pass first uses it */
	baton_dptr rt_tab;            /* u64 [layers * n_experts], the cache's addresses */
	baton_dptr rt_ids;            /* u32 [layers][n * top_k] of the pass (n <= rt_rows, or rt_hi) */
	baton_dptr rt_w;              /* f32 [rows * top_k], one layer's at a time */
	baton_dptr *tab_now, *tab_dev; /* host: the cache's table now; what rt_tab holds */
	uint32_t *rt_host;            /* rt_ids back on the host, for the cache's counts */
	int tab_ok, rt_on, rt_off;    /* rt_off: BATON_MODEL_HOST_ROUTE=1 */
	uint64_t rt_passes;
	uint32_t rt_rows; /* RT_ROWS unless BATON_MODEL_DEVICE_ROWS says */
	uint32_t rt_lo, rt_hi; /* large passes routed on the device (moe_dev_rows), or 0 */
	uint32_t rt_cap;       /* the rows rt_ids and rt_w hold (rt_rows, or rt_hi) */
	/* the other passes' routing, made on the device (forward.c's
	 * route_rows): u32 ids then f32 weights, max_batch * top_k each */
	baton_dptr pr_base;           /* 0 until a pass first uses it */
	/* forward.c's pass as one graph: recording now; the recording
	 * launched (so not to be queued again); passes run so */
	int capturing, graph_ran;
	uint64_t graph_runs, graph_replays; /* replays: passes that ran a recording again */
	uint64_t passes;                    /* every pass run, recorded or not */
	/* model_logits_alloc's pinned buffer (head() copies a pass's rows
	 * into it in one call where they lie back to back) */
	const char *pin_p;
	uint64_t pin_bytes;
	/* head()'s host time (model_head_times): waiting for the pass on the
	 * device, copying the logits back */
	double t_head_sync, t_head_copy;
};

/* Passes of at most this many rows route on the device (decode); larger
 * ones (prefill) group tokens by expert on the host, sharing weight reads.
 * A model whose experts are q4_K in every layer (hidden <= 2048, moe_ff
 * <= 1024: model.c) routes passes of up to RT_ROWS_Q4K rows on the device
 * (the cuda backend groups them by expert there: moe_rows.cu). Passes of
 * the rows the backend's moe_dev_rows gives (m->rt_lo .. rt_hi: the cuda
 * backend's bf16 experts from 64 rows, planned there) route on the
 * device too; only passes of up to rt_rows are recorded as graphs.
 * BATON_MODEL_DEVICE_ROWS sets rt_rows from 1 to RT_ROWS_MAX (and no
 * large passes). */
#define RT_ROWS 8
#define RT_ROWS_MAX 64
#define RT_ROWS_Q4K 64

/* ---- weights.c ----------------------------------------------------------- */

/* Allocates and queues the copy of one dense tensor. */
int weights_upload(struct baton_model *m, const struct upload *u);

/* Frees every dense tensor and the activations; idempotent. */
void weights_free(struct baton_model *m);

/* Uploads tensor `name` of shape rows x cols (a 1-D tensor: rows 1).
 * Absent and optional: t->p = 0. Any other mismatch is refused by name. */
int weights_load(struct baton_model *m, const char *name, uint32_t rows, uint32_t cols,
    int required, struct dtensor *t, char *eb, size_t el);

/* Every tensor of layer l (the architecture says which). */
int weights_load_layer(struct baton_model *m, uint32_t l, char *eb, size_t el);

/* The activation buffers for max_batch rows, one device allocation. */
int weights_alloc_acts(struct baton_model *m);

/* ---- kv.c ---------------------------------------------------------------- */

/* Floats of one position's K (or V) row: kv_heads * head_dim. */
uint64_t kv_row(const struct baton_model *m);

/* Rows of the pool per layer and per K or V. */
uint64_t kv_pool_rows(const struct baton_model *m);

/* Layer l's K and V rows in the pool. */
baton_dptr kv_k(const struct baton_model *m, uint32_t l);
baton_dptr kv_v(const struct baton_model *m, uint32_t l);

/* The pool on the device (allocated at the first use), the blocks a
 * release saved copied back into it (kv_restore). */
int kv_ensure(struct baton_model *m);

/* Gives blocks [keep, n_blocks) of s back to the pool, last first (so a
 * step undone leaves the stack as it found it); a cached block nobody
 * holds any more goes to the LRU list's recent end. */
void kv_seq_shrink(struct baton_model *m, struct baton_seq *s, uint32_t keep);

/* Blocks a step may take: free, then evictable. */
uint32_t kv_avail(const struct baton_model *m);
/* One block for a sequence (ref 1): a free one, else the least recently
 * used unheld cached one (evicted). kv_avail() > 0 first. */
uint32_t kv_take(struct baton_model *m);
/* One reference to block id let go of: at 0 it goes on the LRU list if
 * cached, else free. */
void kv_put(struct baton_model *m, uint32_t id);

/* ---- prefix.c ------------------------------------------------------------ */

/* The prefix cache's part of model_open: its tables, the model's
 * identity (salt) as the chain's seed. */
int kv_cache_init(struct baton_model *m, const void *identity, size_t len);
void kv_cache_free(struct baton_model *m);
/* A cached block nobody holds any more, to the LRU list's recent end. */
void kv_lru_push(struct baton_model *m, uint32_t id);
/* The least recently used unheld cached block, out of the cache (an
 * eviction); the LRU list is not empty. */
uint32_t kv_evict(struct baton_model *m);
/* After a step: s's tokens [pos, pos + n) are in its blocks; every block
 * they fill goes into the cache. */
void kv_seq_fed(struct baton_model *m, struct baton_seq *s, const uint32_t *tokens, uint32_t n);
/* Copies the pool's blocks worth keeping to host memory (kv_saved):
 * every held one, then unheld cached ones most recently used first while
 * they fit host_limit; those past it leave the cache. No pool: 0. */
int kv_save(struct baton_model *m);
/* The saved blocks into the pool just allocated (kv_ensure), then the host
 * copy freed; on failure the copy is kept, for the next try. */
int kv_restore(struct baton_model *m);
/* Forgets the KV rows a release saved on the host. */
void kv_drop_saved(struct baton_model *m);
/* Drops every unheld cached block (they go free). */
void kv_cache_drop(struct baton_model *m);

#endif
