/*
 * model.c: the forward pass of every supported MoE architecture, one
 * implementation steered by the switches of model_config.c, on the
 * backend's dense op slots (engine/backend/backend.h) and the engine's expert
 * cache. See model.h and docs/internals/model.md.
 *
 * A pass is rows of several sequences (segments: a sequence's tokens at
 * its positions pos0 .. pos0+n-1), every op but attention over all rows:
 *   x = embed(tokens)
 *   per layer:
 *     xn = rmsnorm(x, input_layernorm)
 *     q = q_proj xn (+b); k, v = k_proj, v_proj xn (+b)
 *     q, k = q_norm, k_norm (per head or over the projection, by arch)
 *     q, k = rope(q, k)
 *     kv_store(k, v) into each row's slot of its sequence's blocks
 *     a = attention(q, K, V) per segment over its blocks (causal, GQA)
 *     x += o_proj a (+b)
 *     xn = rmsnorm(x, post_attention_layernorm)
 *     ids, w = route(router xn); x += sum_k w_k expert_k(xn) (the cache)
 *     qwen2_moe: x += sigmoid(shared_expert_gate xn) * shared_expert(xn)
 *   logits = head(rmsnorm(x[last], norm)) for each segment that ends an item
 * Every op computes each row alone (engine_int.h's fixed order), so a
 * sequence's logits do not depend on what else shares its pass.
 *
 * The KV pool: n_blocks blocks of BATON_KV_BLOCK positions, laid out per
 * layer as K [n_blocks * BLOCK][kv_heads * head_dim] then V the same, so
 * a block id indexes every layer; free ids on a stack.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/model/model.h"

#define DEFAULT_CTX 4096u
#define DEFAULT_BATCH 256u
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

struct baton_seq {
	struct baton_seq *prev, *next; /* the model's open sequences */
	uint32_t pos;
	uint32_t n_blocks;             /* blocks[0 .. n_blocks) own positions */
	uint32_t *blocks;              /* ceil(max_ctx / BLOCK) entries */
	uint32_t mark;                 /* model_step: taken blocks before it, +1 */
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
	void *kv_saved;               /* the held blocks' KV rows while released */
	uint32_t *saved_ids, n_saved; /* which blocks kv_saved holds, in its order */
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
	struct baton_seq *seqs;       /* open sequences */
	struct baton_seq *def;        /* prefill/decode's sequence */
	/* host scratch */
	uint32_t *ids, *want, *posv, *slots, *toks;
	float *w;
	baton_dptr *blobs;
	struct segment *segs;         /* max_batch */
	/* The MoE block without a host round trip (moe_dev_ready): the
	 * cache's blob table on the device, each layer's routing results. */
	baton_dptr rt_base;           /* 0 until a pass first uses it */
	baton_dptr rt_tab;            /* u64 [layers * n_experts], the cache's addresses */
	baton_dptr rt_ids;            /* u32 [layers][RT_ROWS * top_k] */
	baton_dptr rt_w;              /* f32 [RT_ROWS * top_k], one layer's at a time */
	baton_dptr *tab_now, *tab_dev; /* host: the cache's table now; what rt_tab holds */
	uint32_t *rt_host;            /* rt_ids back on the host, for the cache's counts */
	int tab_ok, rt_on, rt_off;    /* rt_off: BATON_MODEL_HOST_ROUTE=1 */
	uint64_t rt_passes;
};

/* Passes of at most this many rows route on the device (decode); larger
 * ones (prefill) group tokens by expert on the host, sharing weight reads. */
#define RT_ROWS 8

static int add_upload(struct baton_model *m, struct dtensor *t, const void *src, uint64_t bytes)
{
	if (m->n_ups == m->cap_ups) {
		uint32_t cap = m->cap_ups ? m->cap_ups * 2 : 64;
		struct upload *n = realloc(m->ups, cap * sizeof *n);
		if (!n)
			return BATON_ENOMEM;
		m->ups = n;
		m->cap_ups = cap;
	}
	m->ups[m->n_ups++] = (struct upload){ t, src, bytes };
	return 0;
}

/* Allocates and queues the copy of one dense tensor. */
static int upload(struct baton_model *m, const struct upload *u)
{
	int rc = m->be->alloc(m->dev, u->bytes, &u->t->p);
	if (rc) {
		u->t->p = 0;
		return rc;
	}
	struct baton_copy c = { .dst = u->t->p, .src = u->src, .bytes = u->bytes };
	return m->be->copy_h2d(m->dev, &c, 1);
}

/* Frees every dense tensor and the activations; idempotent. */
static void free_device(struct baton_model *m)
{
	for (uint32_t i = 0; i < m->n_ups; i++)
		if (m->ups[i].t->p) {
			m->be->free(m->dev, m->ups[i].t->p);
			m->ups[i].t->p = 0;
		}
	if (m->cfg.tie_embeddings)
		m->head.p = 0;
	if (m->act_base)
		m->be->free(m->dev, m->act_base);
	m->act_base = 0;
	if (m->rt_base)
		m->be->free(m->dev, m->rt_base);
	m->rt_base = 0;
	m->tab_ok = 0;
}

/* Uploads tensor `name` of shape rows x cols (a 1-D tensor: rows 1).
 * Absent and optional: t->p = 0. Any other mismatch is refused by name. */
static int load(struct baton_model *m, const char *name, uint32_t rows, uint32_t cols,
    int required, struct dtensor *t, char *eb, size_t el)
{
	const struct baton_arena *a = engine_arena(m->e);
	struct baton_arena_tensor at;
	int rc = arena_dense(a, name, &at);

	t->p = 0;
	if (rc == BATON_ENOTFOUND && !required)
		return 0;
	if (rc) {
		baton_errf(eb, el, "tensor %s: %s", name,
		    rc == BATON_ENOTFOUND ? "missing from the arena" : baton_strerror(rc));
		return rc;
	}
	if (at.rows != rows || at.cols != cols) {
		baton_errf(eb, el, "tensor %s is %u x %u, the config wants %u x %u", name, at.rows, at.cols,
		    rows, cols);
		return BATON_EINVAL;
	}
	if (!m->be->can_compute((int)at.dtype)) {
		const char *dn = baton_dtype_name((int)at.dtype);
		baton_errf(eb, el, "tensor %s: the %s backend cannot compute %s weights", name, m->be->name,
		    dn ? dn : "unknown");
		return BATON_EUNSUPPORTED;
	}
	if ((rc = add_upload(m, t, at.data, at.bytes)) != 0)
		return rc;
	if ((rc = upload(m, &m->ups[m->n_ups - 1])) != 0) {
		baton_errf(eb, el, "tensor %s: uploading %llu bytes: %s", name,
		    (unsigned long long)at.bytes, baton_strerror(rc));
		return rc;
	}
	t->dtype = at.dtype;
	m->dense_bytes += at.bytes;
	return 0;
}

/* load() of "model.layers.<l>.<suffix>". */
static int load_l(struct baton_model *m, uint32_t l, const char *suffix, uint32_t rows,
    uint32_t cols, int required, struct dtensor *t, char *eb, size_t el)
{
	char name[NAME_MAX_LEN + 32];
	snprintf(name, sizeof name, "model.layers.%u.%.*s", l, NAME_MAX_LEN, suffix);
	return load(m, name, rows, cols, required, t, eb, el);
}

static int load_layer(struct baton_model *m, uint32_t l, char *eb, size_t el)
{
	const struct baton_model_config *c = &m->cfg;
	const struct baton_model_arch *a = c->arch;
	struct layer *L = &m->layers[l];
	const uint32_t D = c->hidden, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
	char sfx[NAME_MAX_LEN];
	int rc;

	if ((rc = load_l(m, l, "input_layernorm.weight", 1, D, 1, &L->in_norm, eb, el)) ||
	    (rc = load_l(m, l, "post_attention_layernorm.weight", 1, D, 1, &L->post_norm, eb, el)) ||
	    (rc = load_l(m, l, "self_attn.q_proj.weight", QD, D, 1, &L->q, eb, el)) ||
	    (rc = load_l(m, l, "self_attn.k_proj.weight", KD, D, 1, &L->k, eb, el)) ||
	    (rc = load_l(m, l, "self_attn.v_proj.weight", KD, D, 1, &L->v, eb, el)) ||
	    (rc = load_l(m, l, "self_attn.o_proj.weight", D, QD, 1, &L->o, eb, el)))
		return rc;
	if (c->qkv_bias &&
	    ((rc = load_l(m, l, "self_attn.q_proj.bias", 1, QD, 1, &L->qb, eb, el)) ||
	     (rc = load_l(m, l, "self_attn.k_proj.bias", 1, KD, 1, &L->kb, eb, el)) ||
	     (rc = load_l(m, l, "self_attn.v_proj.bias", 1, KD, 1, &L->vb, eb, el))))
		return rc;
	if (c->o_bias && (rc = load_l(m, l, "self_attn.o_proj.bias", 1, D, 1, &L->ob, eb, el)))
		return rc;
	if (a->qk_norm == BATON_QK_NORM_HEAD &&
	    ((rc = load_l(m, l, "self_attn.q_norm.weight", 1, c->head_dim, 1, &L->q_norm, eb, el)) ||
	     (rc = load_l(m, l, "self_attn.k_norm.weight", 1, c->head_dim, 1, &L->k_norm, eb, el))))
		return rc;
	if (a->qk_norm == BATON_QK_NORM_WHOLE &&
	    ((rc = load_l(m, l, "self_attn.q_norm.weight", 1, QD, 1, &L->q_norm, eb, el)) ||
	     (rc = load_l(m, l, "self_attn.k_norm.weight", 1, KD, 1, &L->k_norm, eb, el))))
		return rc;
	snprintf(sfx, sizeof sfx, "%s.gate.weight", a->moe_prefix);
	if ((rc = load_l(m, l, sfx, c->n_experts, D, 1, &L->router, eb, el)))
		return rc;
	if (a->shared_expert &&
	    ((rc = load_l(m, l, "mlp.shared_expert.gate_proj.weight", c->shared_ff, D, 1, &L->sh_gate, eb, el)) ||
	     (rc = load_l(m, l, "mlp.shared_expert.up_proj.weight", c->shared_ff, D, 1, &L->sh_up, eb, el)) ||
	     (rc = load_l(m, l, "mlp.shared_expert.down_proj.weight", D, c->shared_ff, 1, &L->sh_down, eb, el)) ||
	     (rc = load_l(m, l, "mlp.shared_expert_gate.weight", 1, D, 1, &L->sh_g, eb, el))))
		return rc;

	/* The experts stay in the arena and come through the engine's cache;
	 * their shapes and types are checked here once. */
	const struct baton_arena *ar = engine_arena(m->e);
	struct baton_arena_tensor parts[3];
	struct baton_arena_expert ex;
	if ((rc = arena_expert(ar, l, 0, &ex)) || (rc = arena_expert_parts(ar, l, 0, parts))) {
		baton_errf(eb, el, "layer %u: no experts in the arena: %s", l, baton_strerror(rc));
		return rc;
	}
	static const char *const pn[3] = { "gate", "up", "down" };
	const uint32_t want_r[3] = { c->moe_ff, c->moe_ff, D }, want_c[3] = { D, D, c->moe_ff };
	for (int i = 0; i < 3; i++) {
		if (parts[i].rows != want_r[i] || parts[i].cols != want_c[i]) {
			baton_errf(eb, el, "layer %u expert %s is %u x %u, the config wants %u x %u", l, pn[i],
			    parts[i].rows, parts[i].cols, want_r[i], want_c[i]);
			return BATON_EINVAL;
		}
		if (!m->be->can_compute((int)parts[i].dtype)) {
			const char *dn = baton_dtype_name((int)parts[i].dtype);
			baton_errf(eb, el, "layer %u expert %s: the %s backend cannot compute %s weights", l,
			    pn[i], m->be->name, dn ? dn : "unknown");
			return BATON_EUNSUPPORTED;
		}
	}
	L->gate_off = ex.gate_off;
	L->up_off = ex.up_off;
	L->down_off = ex.down_off;
	L->gate_dt = parts[0].dtype;
	L->up_dt = parts[1].dtype;
	L->down_dt = parts[2].dtype;
	return 0;
}

/* The activation buffers for max_batch rows, one device allocation. */
static int alloc_acts(struct baton_model *m)
{
	const struct baton_model_config *c = &m->cfg;
	const uint64_t B = m->max_batch, D = c->hidden, QD = (uint64_t)c->heads * c->head_dim;
	const uint64_t F = c->shared_ff ? c->shared_ff : 1, KD = (uint64_t)c->kv_heads * c->head_dim;
	const uint64_t HR = B < HEAD_ROWS ? B : HEAD_ROWS;
	/* offsets in floats, each part 64-byte aligned */
	uint64_t off = 0, o[12];
	const uint64_t n[12] = { B * D, B * D, B * QD, B * QD, B * c->n_experts, B * F, B * F,
		B * D, B, B * KD, B * KD, HR * c->vocab };
	for (int i = 0; i < 12; i++) {
		o[i] = off;
		off += (n[i] + 15) / 16 * 16;
	}
	m->act_bytes = off * sizeof(float);
	int rc = m->be->alloc(m->dev, m->act_bytes, &m->act_base);
	if (rc) {
		m->act_base = 0;
		return rc;
	}
	baton_dptr *dst[12] = { &m->x, &m->xn, &m->q, &m->ao, &m->rl, &m->sg, &m->su, &m->sy,
		&m->gl, &m->kx, &m->vx, &m->logits };
	for (int i = 0; i < 12; i++)
		*dst[i] = m->act_base + o[i] * sizeof(float);
	return 0;
}

/* Host scratch, once. */
static int alloc_host(struct baton_model *m)
{
	const struct baton_model_config *c = &m->cfg;
	const uint64_t B = m->max_batch;
	size_t nk = (size_t)B * c->top_k;
	m->ids = malloc(nk * sizeof *m->ids);
	m->want = malloc(nk * sizeof *m->want);
	m->w = malloc(nk * sizeof *m->w);
	m->blobs = malloc(nk * sizeof *m->blobs);
	m->posv = malloc(B * sizeof *m->posv);
	m->slots = malloc(B * sizeof *m->slots);
	m->toks = malloc(B * sizeof *m->toks);
	m->segs = malloc(B * sizeof *m->segs);
	m->inv_freq = malloc(c->head_dim / 2 * sizeof *m->inv_freq);
	m->free_ids = malloc((size_t)m->n_blocks * sizeof *m->free_ids);
	if (!m->ids || !m->want || !m->w || !m->blobs || !m->posv || !m->slots || !m->toks ||
	    !m->segs || !m->inv_freq || !m->free_ids)
		return BATON_ENOMEM;
	/* the stack pops block 0 first */
	for (uint32_t i = 0; i < m->n_blocks; i++)
		m->free_ids[i] = m->n_blocks - 1 - i;
	m->n_free = m->n_blocks;
	model_rope_inv_freq(c, m->inv_freq);
	return 0;
}

static const char *missing_op(const struct baton_backend *be)
{
	if (!be->embed)
		return "embed";
	if (!be->rmsnorm)
		return "rmsnorm";
	if (!be->matmul)
		return "matmul";
	if (!be->rope)
		return "rope";
	if (!be->attention)
		return "attention";
	if (!be->kv_store)
		return "kv_store";
	if (!be->swiglu)
		return "swiglu";
	if (!be->add)
		return "add";
	if (!be->route)
		return "route";
	if (!be->moe_experts)
		return "moe_experts";
	if (!be->can_compute)
		return "can_compute";
	return NULL;
}

int model_open(struct baton_engine *e, const struct baton_model_opts *opts,
    struct baton_model **out, char *eb, size_t el)
{
	int rc;
	const void *cj;
	uint64_t cj_len;

	if (!e || !out) {
		baton_errf(eb, el, "model_open: no engine or no place for the result");
		return BATON_EINVAL;
	}
	*out = NULL;
	struct baton_model *m = calloc(1, sizeof *m);
	if (!m)
		return BATON_ENOMEM;
	m->e = e;
	m->be = engine_backend(e);
	m->dev = engine_dev(e);
	m->cache = engine_cache(e);
	/* the host round trip per layer even where the device path would do
	 * (benchmarks and tests compare the two) */
	const char *hr = getenv("BATON_MODEL_HOST_ROUTE");
	m->rt_off = hr && strcmp(hr, "1") == 0;
	const char *op = missing_op(m->be);
	if (op) {
		baton_errf(eb, el, "the %s backend cannot run a model: it has no %s op", m->be->name, op);
		rc = BATON_EUNSUPPORTED;
		goto fail;
	}
	const struct baton_arena *a = engine_arena(e);
	if ((rc = arena_blob(a, "config.json", &cj, &cj_len)) != 0) {
		baton_errf(eb, el, "the arena holds no config.json (%s): recreate it from the model's folder or GGUF file",
		    rc == BATON_ENOTFOUND ? "an experts-only arena" : baton_strerror(rc));
		goto fail;
	}
	if ((rc = model_config_parse(cj, (size_t)cj_len, &m->cfg, eb, el)) != 0)
		goto fail;
	const struct baton_model_config *c = &m->cfg;
	const struct baton_arena_shape *s = arena_shape(a);
	if (s->layers != c->layers || s->experts != c->n_experts || s->d_model != c->hidden ||
	    s->d_ff != c->moe_ff) {
		baton_errf(eb, el, "the arena's experts (%u layers x %u, %u x %u) do not match config.json "
		    "(%u layers x %u, %u x %u)", s->layers, s->experts, s->d_model, s->d_ff, c->layers,
		    c->n_experts, c->hidden, c->moe_ff);
		rc = BATON_EINVAL;
		goto fail;
	}
	m->max_ctx = opts && opts->max_ctx ? opts->max_ctx :
	    (c->max_pos < DEFAULT_CTX ? c->max_pos : DEFAULT_CTX);
	if (c->window && m->max_ctx > c->window)
		m->max_ctx = c->window; /* within the window, full attention is the same */
	m->max_batch = opts && opts->max_batch ? opts->max_batch : DEFAULT_BATCH;
	if (m->max_batch > BATON_GEN_MAX_BATCH * 16)
		m->max_batch = BATON_GEN_MAX_BATCH * 16;
	m->seq_blocks = (m->max_ctx + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
	m->n_blocks = opts && opts->kv_blocks ? opts->kv_blocks : m->seq_blocks;
	if (m->n_blocks > MAX_BLOCKS) {
		baton_errf(eb, el, "a KV pool of %u blocks is more than the %u this engine addresses",
		    m->n_blocks, MAX_BLOCKS);
		rc = BATON_ERANGE;
		goto fail;
	}

	m->layers = calloc(c->layers, sizeof *m->layers);
	if (!m->layers) {
		rc = BATON_ENOMEM;
		goto fail;
	}
	if ((rc = load(m, "model.embed_tokens.weight", c->vocab, c->hidden, 1, &m->embed, eb, el)) ||
	    (rc = load(m, "model.norm.weight", 1, c->hidden, 1, &m->norm, eb, el)))
		goto fail;
	if (c->tie_embeddings)
		m->head = m->embed;
	else if ((rc = load(m, "lm_head.weight", c->vocab, c->hidden, 1, &m->head, eb, el)))
		goto fail;
	for (uint32_t l = 0; l < c->layers; l++)
		if ((rc = load_layer(m, l, eb, el)) != 0)
			goto fail;
	if ((rc = m->be->sync(m->dev)) != 0) {
		baton_errf(eb, el, "uploading the dense tensors: %s", baton_strerror(rc));
		goto fail;
	}
	if ((rc = alloc_host(m)) != 0 || (rc = alloc_acts(m)) != 0) {
		baton_errf(eb, el, "allocating activations for %u tokens: %s", m->max_batch,
		    baton_strerror(rc));
		goto fail;
	}
	if ((rc = model_seq_open(m, &m->def)) != 0)
		goto fail;
	*out = m;
	return 0;
fail:
	model_close(m);
	return rc;
}

static uint64_t kv_row(const struct baton_model *m)
{
	return (uint64_t)m->cfg.kv_heads * m->cfg.head_dim * sizeof(float);
}

/* Rows of the pool per layer and per K or V. */
static uint64_t pool_rows(const struct baton_model *m)
{
	return (uint64_t)m->n_blocks * BATON_KV_BLOCK;
}

static baton_dptr kv_k(const struct baton_model *m, uint32_t l)
{
	return m->kv + (uint64_t)l * 2 * pool_rows(m) * kv_row(m);
}

static baton_dptr kv_v(const struct baton_model *m, uint32_t l)
{
	return kv_k(m, l) + pool_rows(m) * kv_row(m);
}

uint64_t model_kv_block_bytes(const struct baton_model *m)
{
	return (uint64_t)m->cfg.layers * 2 * BATON_KV_BLOCK * kv_row(m);
}

static int kv_ensure(struct baton_model *m)
{
	if (m->kv)
		return 0;
	uint64_t bytes = (uint64_t)m->n_blocks * model_kv_block_bytes(m);
	int rc = m->be->alloc(m->dev, bytes, &m->kv);
	if (rc) {
		m->kv = 0;
		return rc;
	}
	m->kv_bytes = bytes;
	return 0;
}

static void drop_saved(struct baton_model *m)
{
	free(m->kv_saved);
	m->kv_saved = NULL;
	free(m->saved_ids);
	m->saved_ids = NULL;
	m->n_saved = 0;
}

/* Gives blocks [keep, n_blocks) of s back to the pool, last first (so a
 * step undone leaves the stack as it found it). */
static void seq_shrink(struct baton_model *m, struct baton_seq *s, uint32_t keep)
{
	while (s->n_blocks > keep)
		m->free_ids[m->n_free++] = s->blocks[--s->n_blocks];
}

void model_kv_release(struct baton_model *m)
{
	if (!m)
		return;
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	for (struct baton_seq *s = m->seqs; s; s = s->next) {
		seq_shrink(m, s, 0);
		s->pos = 0;
	}
	drop_saved(m);
}

void model_close(struct baton_model *m)
{
	if (!m)
		return;
	model_kv_release(m);
	while (m->seqs)
		model_seq_close(m, m->seqs);
	free_device(m);
	free(m->ups);
	free(m->layers);
	free(m->ids);
	free(m->want);
	free(m->w);
	free(m->blobs);
	free(m->posv);
	free(m->slots);
	free(m->toks);
	free(m->segs);
	free(m->tab_now);
	free(m->tab_dev);
	free(m->rt_host);
	free(m->free_ids);
	free(m->inv_freq);
	free(m);
}

const struct baton_model_config *model_config(const struct baton_model *m)
{
	return &m->cfg;
}

uint32_t model_pos(const struct baton_model *m)
{
	return m->def ? m->def->pos : 0;
}

uint32_t model_max_ctx(const struct baton_model *m)
{
	return m->max_ctx;
}

uint64_t model_dense_bytes(const struct baton_model *m)
{
	return m->dense_bytes;
}

uint64_t model_kv_bytes(const struct baton_model *m)
{
	return m->kv_bytes;
}

void model_reset(struct baton_model *m)
{
	if (!m || !m->def)
		return;
	seq_shrink(m, m->def, 0);
	m->def->pos = 0;
}

/* ---- sequences ------------------------------------------------------------ */

int model_seq_open(struct baton_model *m, struct baton_seq **out)
{
	if (!m || !out)
		return BATON_EINVAL;
	*out = NULL;
	struct baton_seq *s = calloc(1, sizeof *s);
	if (!s)
		return BATON_ENOMEM;
	if (!(s->blocks = malloc((size_t)m->seq_blocks * sizeof *s->blocks))) {
		free(s);
		return BATON_ENOMEM;
	}
	s->next = m->seqs;
	if (m->seqs)
		m->seqs->prev = s;
	m->seqs = s;
	*out = s;
	return 0;
}

void model_seq_close(struct baton_model *m, struct baton_seq *s)
{
	if (!m || !s)
		return;
	seq_shrink(m, s, 0);
	if (s->prev)
		s->prev->next = s->next;
	else
		m->seqs = s->next;
	if (s->next)
		s->next->prev = s->prev;
	if (m->def == s)
		m->def = NULL;
	free(s->blocks);
	free(s);
}

uint32_t model_seq_pos(const struct baton_seq *s)
{
	return s ? s->pos : 0;
}

uint32_t model_kv_free_blocks(const struct baton_model *m)
{
	return m->n_free;
}

uint32_t model_kv_blocks_total(const struct baton_model *m)
{
	return m->n_blocks;
}

uint32_t model_seq_blocks_needed(const struct baton_model *m, const struct baton_seq *s,
    uint32_t n_more)
{
	(void)m;
	uint64_t end = (uint64_t)(s ? s->pos : 0) + n_more;
	uint64_t need = (end + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
	uint32_t have = s ? s->n_blocks : 0;
	return need > have ? (uint32_t)(need - have) : 0;
}

/* The qk norm of n rows of a projection of `heads` heads, in place. */
static int qk_norm(struct baton_model *m, baton_dptr p, uint32_t n, uint32_t heads,
    const struct dtensor *w)
{
	const struct baton_model_config *c = &m->cfg;
	if (c->arch->qk_norm == BATON_QK_NORM_HEAD)
		return m->be->rmsnorm(m->dev, p, p, n * heads, c->head_dim, w->p, w->dtype, c->eps);
	if (c->arch->qk_norm == BATON_QK_NORM_WHOLE)
		return m->be->rmsnorm(m->dev, p, p, n, heads * c->head_dim, w->p, w->dtype, c->eps);
	return 0;
}

static int attention_block(struct baton_model *m, uint32_t l, const struct segment *sg,
    uint32_t n_seg, uint32_t n)
{
	const struct baton_backend *be = m->be;
	struct baton_dev *d = m->dev;
	const struct baton_model_config *c = &m->cfg;
	const struct layer *L = &m->layers[l];
	const uint32_t D = c->hidden, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
	int rc;

	if ((rc = be->rmsnorm(d, m->x, m->xn, n, D, L->in_norm.p, L->in_norm.dtype, c->eps)) ||
	    (rc = be->matmul(d, L->q.p, L->q.dtype, QD, D, L->qb.p, L->qb.dtype, m->xn, n, m->q, 0)) ||
	    (rc = be->matmul(d, L->k.p, L->k.dtype, KD, D, L->kb.p, L->kb.dtype, m->xn, n, m->kx, 0)) ||
	    (rc = be->matmul(d, L->v.p, L->v.dtype, KD, D, L->vb.p, L->vb.dtype, m->xn, n, m->vx, 0)) ||
	    (rc = qk_norm(m, m->q, n, c->heads, &L->q_norm)) ||
	    (rc = qk_norm(m, m->kx, n, c->kv_heads, &L->k_norm)) ||
	    (rc = be->rope(d, m->q, n, c->heads, c->head_dim, m->posv, m->inv_freq, 1.0f)) ||
	    (rc = be->rope(d, m->kx, n, c->kv_heads, c->head_dim, m->posv, m->inv_freq, 1.0f)))
		return rc;
	struct baton_kv_store ks = {
		.k = m->kx, .v = m->vx, .k_cache = kv_k(m, l), .v_cache = kv_v(m, l),
		.slots = m->slots, .n = n, .cols = KD, .cache_rows = pool_rows(m),
	};
	if ((rc = be->kv_store(d, &ks)))
		return rc;
	uint64_t row = 0;
	for (uint32_t i = 0; i < n_seg; i++) {
		struct baton_attn at = {
			.q = m->q + row * QD * sizeof(float), .k = kv_k(m, l), .v = kv_v(m, l),
			.out = m->ao + row * QD * sizeof(float),
			.n_q = sg[i].n, .n_heads = c->heads, .n_kv_heads = c->kv_heads,
			.head_dim = c->head_dim, .pos0 = sg[i].pos0,
			.scale = 1.0f / sqrtf((float)c->head_dim),
			.blocks = sg[i].seq->blocks, .block_size = BATON_KV_BLOCK,
		};
		if ((rc = be->attention(d, &at)))
			return rc;
		row += sg[i].n;
	}
	return be->matmul(d, L->o.p, L->o.dtype, D, QD, L->ob.p, L->ob.dtype, m->ao, n, m->x, 1);
}

static int moe_block(struct baton_model *m, uint32_t l, uint32_t n)
{
	const struct baton_backend *be = m->be;
	struct baton_dev *d = m->dev;
	const struct baton_model_config *c = &m->cfg;
	const struct layer *L = &m->layers[l];
	const uint32_t D = c->hidden, E = c->n_experts, K = c->top_k;
	const size_t nk = (size_t)n * K;
	int rc;

	if ((rc = be->rmsnorm(d, m->x, m->xn, n, D, L->post_norm.p, L->post_norm.dtype, c->eps)) ||
	    (rc = be->matmul(d, L->router.p, L->router.dtype, E, D, 0, 0, m->xn, n, m->rl, 0)))
		return rc;
	const baton_dptr ids = m->rt_ids + (uint64_t)l * RT_ROWS * K * sizeof(uint32_t);
	if (m->rt_on) {
		if ((rc = be->route_dev(d, m->rl, n, E, K, c->route_rule, ids, m->rt_w)))
			return rc;
	} else {
		if ((rc = be->route(d, m->rl, n, E, K, c->route_rule, m->ids, m->w)))
			return rc;
		for (size_t i = 0; i < nk; i++)
			m->want[i] = l * E + m->ids[i];
		if ((rc = cache_lookup(m->cache, m->want, nk, m->blobs)))
			return rc;
	}
	struct baton_moe_layer ml = {
		.batch = n, .d_model = D, .d_ff = c->moe_ff, .n_experts = E, .top_k = K,
		.x = m->x, .xn = m->xn,
		.router = L->router.p, .router_dtype = L->router.dtype,
		.gate_dtype = L->gate_dt, .up_dtype = L->up_dt, .down_dtype = L->down_dt,
		.gate_off = L->gate_off, .up_off = L->up_off, .down_off = L->down_off,
	};
	if (m->rt_on)
		rc = be->moe_experts_dev(d, &ml, m->rt_tab + (uint64_t)l * E * sizeof(uint64_t), ids,
		    m->rt_w);
	else
		rc = be->moe_experts(d, &ml, m->blobs, m->w);
	if (rc)
		return rc;
	if (!c->arch->shared_expert)
		return 0;
	const uint32_t F = c->shared_ff;
	if ((rc = be->matmul(d, L->sh_gate.p, L->sh_gate.dtype, F, D, 0, 0, m->xn, n, m->sg, 0)) ||
	    (rc = be->matmul(d, L->sh_up.p, L->sh_up.dtype, F, D, 0, 0, m->xn, n, m->su, 0)) ||
	    (rc = be->swiglu(d, m->sg, m->su, m->sg, (uint64_t)n * F)) ||
	    (rc = be->matmul(d, L->sh_down.p, L->sh_down.dtype, D, F, 0, 0, m->sg, n, m->sy, 0)) ||
	    (rc = be->matmul(d, L->sh_g.p, L->sh_g.dtype, 1, D, 0, 0, m->xn, n, m->gl, 0)))
		return rc;
	return be->add(d, m->x, m->sy, m->gl, n, D);
}

/* The output head over the last rows of the segments that want logits,
 * HEAD_ROWS at a time. */
static int head(struct baton_model *m, const struct segment *sg, uint32_t n_seg)
{
	const struct baton_model_config *c = &m->cfg;
	const uint32_t D = c->hidden, HR = m->max_batch < HEAD_ROWS ? m->max_batch : HEAD_ROWS;
	const uint64_t rowb = (uint64_t)D * sizeof(float), vb = (uint64_t)c->vocab * sizeof(float);
	float *dst[HEAD_ROWS];
	uint32_t g = 0;
	uint64_t row = 0;
	int rc;

	for (uint32_t i = 0; i < n_seg; i++) {
		row += sg[i].n;
		if (sg[i].logits) {
			baton_dptr last = m->x + (row - 1) * rowb;
			if ((rc = m->be->rmsnorm(m->dev, last, m->xn + g * rowb, 1, D, m->norm.p,
			         m->norm.dtype, c->eps)))
				return rc;
			dst[g++] = sg[i].logits;
		}
		if (g && (g == HR || i + 1 == n_seg)) {
			if ((rc = m->be->matmul(m->dev, m->head.p, m->head.dtype, c->vocab, D, 0, 0, m->xn,
			         g, m->logits, 0)) ||
			    (rc = m->be->sync(m->dev)))
				return rc;
			for (uint32_t r = 0; r < g; r++)
				if ((rc = m->be->copy_d2h(m->dev, dst[r], m->logits + r * vb, vb)))
					return rc;
			g = 0;
		}
	}
	return 0;
}

/* Whether this pass of n rows routes on the device (m->rt_on): the
 * backend has route_dev and moe_experts_dev, the pass is small, and every
 * expert is resident, so no step can miss. The cache's table goes to the
 * device when it differs from the last one sent (after a refill, a
 * resize...); a pass that cannot use it takes the host path. */
static int moe_dev_ready(struct baton_model *m, uint32_t n)
{
	const struct baton_model_config *c = &m->cfg;
	const uint64_t NI = (uint64_t)c->layers * c->n_experts, tb = NI * sizeof(uint64_t);
	const uint64_t ib = (uint64_t)c->layers * RT_ROWS * c->top_k * sizeof(uint32_t);
	int rc;

	m->rt_on = 0;
	if (m->rt_off || !m->be->route_dev || !m->be->moe_experts_dev || n > RT_ROWS || !m->cache)
		return 0;
	if (!m->tab_now) {
		m->tab_now = malloc(tb);
		m->tab_dev = malloc(tb);
		m->rt_host = malloc(ib);
		if (!m->tab_now || !m->tab_dev || !m->rt_host)
			return BATON_ENOMEM;
	}
	if (!cache_all_resident(m->cache, m->tab_now))
		return 0;
	for (uint64_t i = 0; i < NI; i++)
		if (m->tab_now[i] % 256)
			return 0;
	if (!m->rt_base) {
		const uint64_t bytes = tb + ib + (uint64_t)RT_ROWS * c->top_k * sizeof(float);
		if ((rc = m->be->alloc(m->dev, bytes, &m->rt_base))) {
			m->rt_base = 0;
			return rc;
		}
		m->rt_tab = m->rt_base;
		m->rt_ids = m->rt_base + tb;
		m->rt_w = m->rt_ids + ib;
		m->tab_ok = 0;
	}
	if (!m->tab_ok || memcmp(m->tab_now, m->tab_dev, tb)) {
		memcpy(m->tab_dev, m->tab_now, tb);
		const struct baton_copy cp = { m->rt_tab, m->tab_dev, tb };
		/* synced: tab_dev may change before the next pass's sync */
		if ((rc = m->be->copy_h2d(m->dev, &cp, 1)) || (rc = m->be->sync(m->dev))) {
			m->tab_ok = 0;
			return rc;
		}
		m->tab_ok = 1;
	}
	m->rt_on = 1;
	m->rt_passes++;
	return 0;
}

uint64_t model_device_route_passes(const struct baton_model *m)
{
	return m ? m->rt_passes : 0;
}

/* After a pass routed on the device: its choices, back in one copy, go
 * through cache_lookup as the host path's would have (all hits: the
 * cache's counts and heat stay what they were). */
static int moe_dev_account(struct baton_model *m, uint32_t n)
{
	const struct baton_model_config *c = &m->cfg;
	const uint32_t E = c->n_experts, K = c->top_k, nk = n * K;
	const uint64_t ib = (uint64_t)c->layers * RT_ROWS * K * sizeof(uint32_t);
	int rc;

	if ((rc = m->be->copy_d2h(m->dev, m->rt_host, m->rt_ids, ib)))
		return rc;
	for (uint32_t l = 0; l < c->layers; l++) {
		const uint32_t *id = m->rt_host + (uint64_t)l * RT_ROWS * K;
		for (uint32_t i = 0; i < nk; i++) {
			if (id[i] >= E)
				return BATON_EIO;
			m->want[i] = l * E + id[i];
		}
		if ((rc = cache_lookup(m->cache, m->want, nk, m->blobs)))
			return rc;
	}
	return 0;
}

/* One pass: the segments' rows, n of them in all (<= max_batch). The
 * sequences own the blocks of every position the pass writes. */
static int pass(struct baton_model *m, const struct segment *sg, uint32_t n_seg, uint32_t n)
{
	const struct baton_model_config *c = &m->cfg;
	uint32_t r = 0;
	int rc;

	for (uint32_t i = 0; i < n_seg; i++)
		for (uint32_t t = 0; t < sg[i].n; t++, r++) {
			uint32_t p = sg[i].pos0 + t;
			m->toks[r] = sg[i].tokens[t];
			m->posv[r] = p;
			m->slots[r] = sg[i].seq->blocks[p / BATON_KV_BLOCK] * BATON_KV_BLOCK +
			    p % BATON_KV_BLOCK;
		}
	if ((rc = moe_dev_ready(m, n)) ||
	    (rc = m->be->embed(m->dev, m->embed.p, m->embed.dtype, c->vocab, c->hidden, m->toks, n,
	         m->x)))
		return rc;
	for (uint32_t l = 0; l < c->layers; l++)
		if ((rc = attention_block(m, l, sg, n_seg, n)) || (rc = moe_block(m, l, n)))
			return rc;
	if ((rc = head(m, sg, n_seg)))
		return rc;
	return m->rt_on ? moe_dev_account(m, n) : 0;
}

int model_step(struct baton_model *m, const struct baton_step_item *items, uint32_t n_items,
    float *logits)
{
	int rc = 0;

	if (!m || !items || !n_items || !logits)
		return BATON_EINVAL;
	/* every check before anything changes */
	uint64_t need = 0;
	uint32_t i;
	for (i = 0; i < n_items; i++) {
		struct baton_seq *s = items[i].seq;
		if (!s || !items[i].tokens || !items[i].n || s->mark) {
			rc = BATON_EINVAL;
			break;
		}
		s->mark = 1;
		if ((uint64_t)s->pos + items[i].n > m->max_ctx) {
			rc = BATON_ERANGE;
			break;
		}
		for (uint32_t t = 0; t < items[i].n; t++)
			if (items[i].tokens[t] >= m->cfg.vocab)
				rc = BATON_ERANGE;
		if (rc)
			break;
		need += model_seq_blocks_needed(m, s, items[i].n);
	}
	if (!rc && need > m->n_free)
		rc = BATON_ENOSPC;
	if (!rc && (rc = model_refill(m)) == 0)
		rc = kv_ensure(m);
	if (rc) {
		/* the marks set so far; the one at i may be another item's */
		for (uint32_t j = 0; j < n_items && j <= i; j++)
			if (items[j].seq)
				items[j].seq->mark = 0;
		return rc;
	}
	/* take the blocks; mark = blocks held before, + 1 */
	for (i = 0; i < n_items; i++) {
		struct baton_seq *s = items[i].seq;
		s->mark = s->n_blocks + 1;
		for (uint32_t b = model_seq_blocks_needed(m, s, items[i].n); b > 0; b--)
			s->blocks[s->n_blocks++] = m->free_ids[--m->n_free];
	}
	/* passes of up to max_batch rows; an item may span passes */
	uint32_t n_seg = 0, rows = 0, off = 0;
	const size_t V = m->cfg.vocab;
	for (i = 0; i < n_items && !rc;) {
		const struct baton_step_item *it = &items[i];
		uint32_t take = it->n - off;
		if (take > m->max_batch - rows)
			take = m->max_batch - rows;
		m->segs[n_seg++] = (struct segment){
			.seq = it->seq, .tokens = it->tokens + off, .n = take, .pos0 = it->seq->pos + off,
			.logits = off + take == it->n ? logits + i * V : NULL,
		};
		rows += take;
		off += take;
		if (off == it->n) {
			i++;
			off = 0;
		}
		if (rows == m->max_batch || i == n_items) {
			rc = pass(m, m->segs, n_seg, rows);
			n_seg = rows = 0;
		}
	}
	for (i = 0; i < n_items; i++) {
		struct baton_seq *s = items[i].seq;
		if (rc)
			seq_shrink(m, s, s->mark - 1);
		else
			s->pos += items[i].n;
	}
	for (i = 0; i < n_items; i++)
		items[i].seq->mark = 0;
	return rc;
}

/* ---- release and refill ---------------------------------------------------- */

int model_release(struct baton_model *m)
{
	int rc;

	if (!m)
		return BATON_EINVAL;
	if (m->released)
		return 0;
	uint32_t held = m->n_blocks - m->n_free;
	if (m->kv && held) {
		/* keep the sequences: the blocks they hold, every layer's K and V */
		const uint64_t half = BATON_KV_BLOCK * kv_row(m), bb = model_kv_block_bytes(m);
		uint8_t *save = malloc(held * bb);
		uint32_t *ids = malloc(held * sizeof *ids), k = 0;
		if (!save || !ids) {
			free(save);
			free(ids);
			return BATON_ENOMEM;
		}
		for (struct baton_seq *s = m->seqs; s; s = s->next)
			for (uint32_t b = 0; b < s->n_blocks; b++)
				ids[k++] = s->blocks[b];
		if ((rc = m->be->sync(m->dev)) != 0)
			goto fail;
		for (uint32_t b = 0; b < k; b++)
			for (uint32_t l = 0; l < m->cfg.layers; l++) {
				uint8_t *dst = save + b * bb + (uint64_t)l * 2 * half;
				uint64_t at = (uint64_t)ids[b] * half;
				if ((rc = m->be->copy_d2h(m->dev, dst, kv_k(m, l) + at, half)) ||
				    (rc = m->be->copy_d2h(m->dev, dst + half, kv_v(m, l) + at, half)))
					goto fail;
			}
		drop_saved(m);
		m->kv_saved = save;
		m->saved_ids = ids;
		m->n_saved = k;
		goto saved;
fail:
		free(save);
		free(ids);
		return rc;
	}
saved:
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	free_device(m);
	m->released = 1;
	return 0;
}

int model_refill(struct baton_model *m)
{
	int rc;

	if (!m)
		return BATON_EINVAL;
	if (!m->released)
		return 0;
	for (uint32_t i = 0; i < m->n_ups; i++)
		if ((rc = upload(m, &m->ups[i])) != 0)
			goto fail;
	if (m->cfg.tie_embeddings)
		m->head = m->embed;
	if ((rc = alloc_acts(m)) != 0)
		goto fail;
	if (m->n_saved) {
		const uint64_t half = BATON_KV_BLOCK * kv_row(m), bb = model_kv_block_bytes(m);
		const uint8_t *save = m->kv_saved;
		if ((rc = kv_ensure(m)) != 0)
			goto fail;
		for (uint32_t b = 0; b < m->n_saved; b++)
			for (uint32_t l = 0; l < m->cfg.layers; l++) {
				const uint8_t *src = save + b * bb + (uint64_t)l * 2 * half;
				uint64_t at = (uint64_t)m->saved_ids[b] * half;
				struct baton_copy c[2] = {
					{ .dst = kv_k(m, l) + at, .src = src, .bytes = half },
					{ .dst = kv_v(m, l) + at, .src = src + half, .bytes = half },
				};
				if ((rc = m->be->copy_h2d(m->dev, c, 2)) != 0)
					goto fail;
			}
	}
	if ((rc = m->be->sync(m->dev)) != 0)
		goto fail;
	drop_saved(m);
	m->released = 0;
	return 0;
fail:
	/* nothing half-made stays: released as before, the sequences kept */
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	free_device(m);
	return rc;
}

int model_released(const struct baton_model *m)
{
	return m->released;
}

uint64_t model_device_bytes(const struct baton_model *m)
{
	if (m->released)
		return 0;
	return m->dense_bytes + m->kv_bytes + (m->act_base ? m->act_bytes : 0);
}

/* ---- the default sequence -------------------------------------------------- */

int model_prefill(struct baton_model *m, const uint32_t *tokens, uint32_t n, float *logits)
{
	int rc;

	if (!m || !tokens || !n || !logits)
		return BATON_EINVAL;
	if (n > m->max_ctx)
		return BATON_ERANGE;
	for (uint32_t i = 0; i < n; i++)
		if (tokens[i] >= m->cfg.vocab)
			return BATON_ERANGE;
	if (!m->def && (rc = model_seq_open(m, &m->def)))
		return rc;
	model_reset(m); /* a new sequence: released, its old rows need not come back */
	struct baton_step_item it = { m->def, tokens, n };
	return model_step(m, &it, 1, logits);
}

int model_decode(struct baton_model *m, uint32_t token, float *logits)
{
	if (!m || !logits)
		return BATON_EINVAL;
	if (!m->def || !m->def->pos)
		return BATON_ESTATE;
	if (m->def->pos >= m->max_ctx || token >= m->cfg.vocab)
		return BATON_ERANGE;
	struct baton_step_item it = { m->def, &token, 1 };
	return model_step(m, &it, 1, logits);
}

int model_kv_alloc(struct baton_model *m)
{
	if (!m)
		return BATON_EINVAL;
	return kv_ensure(m);
}
