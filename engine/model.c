/*
 * model.c: the forward pass of every supported MoE architecture, one
 * implementation steered by the switches of model_config.c, on the
 * backend's dense op slots (engine/backend.h) and the engine's expert
 * cache. See model.h and docs/model.md.
 *
 * Per batch of n tokens at positions pos0 .. pos0+n-1:
 *   x = embed(tokens)
 *   per layer:
 *     xn = rmsnorm(x, input_layernorm)
 *     q = q_proj xn (+b); k, v = k_proj, v_proj xn (+b), written straight
 *         into the KV cache rows pos0.. of this layer
 *     q, k = q_norm, k_norm (per head or over the projection, by arch)
 *     q, k = rope(q, k)
 *     a = attention(q, K, V) (causal, grouped-query)
 *     x += o_proj a (+b)
 *     xn = rmsnorm(x, post_attention_layernorm)
 *     ids, w = route(router xn); x += sum_k w_k expert_k(xn) (the cache)
 *     qwen2_moe: x += sigmoid(shared_expert_gate xn) * shared_expert(xn)
 *   logits = head(rmsnorm(x[last], norm))
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/model.h"

#define DEFAULT_CTX 4096u
#define DEFAULT_BATCH 256u
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
	void *kv_saved;               /* the sequence's KV rows while released */
	float *inv_freq;              /* head_dim / 2 */
	uint32_t max_ctx, max_batch;
	/* activations, max_batch rows */
	baton_dptr x, xn, q, ao, rl, sg, su, sy, gl, logits;
	baton_dptr act_base;
	uint64_t act_bytes;
	/* the KV cache: per layer K then V, [max_ctx][kv_heads * head_dim] */
	baton_dptr kv;
	uint64_t kv_bytes;
	uint32_t pos;
	int have_seq;
	/* host scratch */
	uint32_t *ids, *want, *posv;
	float *w;
	baton_dptr *blobs;
};

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
	const uint64_t F = c->shared_ff ? c->shared_ff : 1;
	/* offsets in floats, each part 64-byte aligned */
	uint64_t off = 0, o[10];
	const uint64_t n[10] = { B * D, B * D, B * QD, B * QD, B * c->n_experts, B * F, B * F,
		B * D, B, c->vocab };
	for (int i = 0; i < 10; i++) {
		o[i] = off;
		off += (n[i] + 15) / 16 * 16;
	}
	m->act_bytes = off * sizeof(float);
	int rc = m->be->alloc(m->dev, m->act_bytes, &m->act_base);
	if (rc) {
		m->act_base = 0;
		return rc;
	}
	baton_dptr *dst[10] = { &m->x, &m->xn, &m->q, &m->ao, &m->rl, &m->sg, &m->su, &m->sy,
		&m->gl, &m->logits };
	for (int i = 0; i < 10; i++)
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
	m->inv_freq = malloc(c->head_dim / 2 * sizeof *m->inv_freq);
	if (!m->ids || !m->want || !m->w || !m->blobs || !m->posv || !m->inv_freq)
		return BATON_ENOMEM;
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
	*out = m;
	return 0;
fail:
	model_close(m);
	return rc;
}

void model_kv_release(struct baton_model *m)
{
	if (!m)
		return;
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	m->pos = 0;
	m->have_seq = 0;
	free(m->kv_saved);
	m->kv_saved = NULL;
}

void model_close(struct baton_model *m)
{
	if (!m)
		return;
	model_kv_release(m);
	free_device(m);
	free(m->ups);
	free(m->kv_saved);
	free(m->layers);
	free(m->ids);
	free(m->want);
	free(m->w);
	free(m->blobs);
	free(m->posv);
	free(m->inv_freq);
	free(m);
}

const struct baton_model_config *model_config(const struct baton_model *m)
{
	return &m->cfg;
}

uint32_t model_pos(const struct baton_model *m)
{
	return m->pos;
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
	m->pos = 0;
	m->have_seq = 0;
}

static uint64_t kv_row(const struct baton_model *m)
{
	return (uint64_t)m->cfg.kv_heads * m->cfg.head_dim * sizeof(float);
}

static baton_dptr kv_k(const struct baton_model *m, uint32_t l)
{
	return m->kv + (uint64_t)l * 2 * m->max_ctx * kv_row(m);
}

static baton_dptr kv_v(const struct baton_model *m, uint32_t l)
{
	return kv_k(m, l) + (uint64_t)m->max_ctx * kv_row(m);
}

static int kv_ensure(struct baton_model *m)
{
	if (m->kv)
		return 0;
	uint64_t bytes = (uint64_t)m->cfg.layers * 2 * m->max_ctx * kv_row(m);
	int rc = m->be->alloc(m->dev, bytes, &m->kv);
	if (rc) {
		m->kv = 0;
		return rc;
	}
	m->kv_bytes = bytes;
	return 0;
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

static int attention_block(struct baton_model *m, uint32_t l, uint32_t n, uint32_t pos0)
{
	const struct baton_backend *be = m->be;
	struct baton_dev *d = m->dev;
	const struct baton_model_config *c = &m->cfg;
	const struct layer *L = &m->layers[l];
	const uint32_t D = c->hidden, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
	baton_dptr kd = kv_k(m, l) + pos0 * kv_row(m), vd = kv_v(m, l) + pos0 * kv_row(m);
	int rc;

	if ((rc = be->rmsnorm(d, m->x, m->xn, n, D, L->in_norm.p, L->in_norm.dtype, c->eps)) ||
	    (rc = be->matmul(d, L->q.p, L->q.dtype, QD, D, L->qb.p, L->qb.dtype, m->xn, n, m->q, 0)) ||
	    (rc = be->matmul(d, L->k.p, L->k.dtype, KD, D, L->kb.p, L->kb.dtype, m->xn, n, kd, 0)) ||
	    (rc = be->matmul(d, L->v.p, L->v.dtype, KD, D, L->vb.p, L->vb.dtype, m->xn, n, vd, 0)) ||
	    (rc = qk_norm(m, m->q, n, c->heads, &L->q_norm)) ||
	    (rc = qk_norm(m, kd, n, c->kv_heads, &L->k_norm)) ||
	    (rc = be->rope(d, m->q, n, c->heads, c->head_dim, m->posv, m->inv_freq, 1.0f)) ||
	    (rc = be->rope(d, kd, n, c->kv_heads, c->head_dim, m->posv, m->inv_freq, 1.0f)))
		return rc;
	struct baton_attn at = {
		.q = m->q, .k = kv_k(m, l), .v = kv_v(m, l), .out = m->ao,
		.n_q = n, .n_heads = c->heads, .n_kv_heads = c->kv_heads, .head_dim = c->head_dim,
		.pos0 = pos0, .scale = 1.0f / sqrtf((float)c->head_dim),
	};
	if ((rc = be->attention(d, &at)))
		return rc;
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
	    (rc = be->matmul(d, L->router.p, L->router.dtype, E, D, 0, 0, m->xn, n, m->rl, 0)) ||
	    (rc = be->route(d, m->rl, n, E, K, c->route_rule, m->ids, m->w)))
		return rc;
	for (size_t i = 0; i < nk; i++)
		m->want[i] = l * E + m->ids[i];
	if ((rc = cache_lookup(m->cache, m->want, nk, m->blobs)))
		return rc;
	struct baton_moe_layer ml = {
		.batch = n, .d_model = D, .d_ff = c->moe_ff, .n_experts = E, .top_k = K,
		.x = m->x, .xn = m->xn,
		.router = L->router.p, .router_dtype = L->router.dtype,
		.gate_dtype = L->gate_dt, .up_dtype = L->up_dt, .down_dtype = L->down_dt,
		.gate_off = L->gate_off, .up_off = L->up_off, .down_off = L->down_off,
	};
	if ((rc = be->moe_experts(d, &ml, m->blobs, m->w)))
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

/* n tokens at positions pos0..; the last one's logits when `logits`. */
static int forward(struct baton_model *m, const uint32_t *tokens, uint32_t n, uint32_t pos0,
    float *logits)
{
	const struct baton_model_config *c = &m->cfg;
	const uint32_t D = c->hidden;
	int rc;

	for (uint32_t i = 0; i < n; i++)
		m->posv[i] = pos0 + i;
	if ((rc = m->be->embed(m->dev, m->embed.p, m->embed.dtype, c->vocab, D, tokens, n, m->x)))
		return rc;
	for (uint32_t l = 0; l < c->layers; l++)
		if ((rc = attention_block(m, l, n, pos0)) || (rc = moe_block(m, l, n)))
			return rc;
	if (!logits)
		return 0;
	baton_dptr last = m->x + (uint64_t)(n - 1) * D * sizeof(float);
	if ((rc = m->be->rmsnorm(m->dev, last, m->xn, 1, D, m->norm.p, m->norm.dtype, c->eps)) ||
	    (rc = m->be->matmul(m->dev, m->head.p, m->head.dtype, c->vocab, D, 0, 0, m->xn, 1,
	        m->logits, 0)) ||
	    (rc = m->be->sync(m->dev)))
		return rc;
	return m->be->copy_d2h(m->dev, logits, m->logits, (uint64_t)c->vocab * sizeof(float));
}

int model_release(struct baton_model *m)
{
	int rc;

	if (!m)
		return BATON_EINVAL;
	if (m->released)
		return 0;
	if (m->have_seq && m->kv && m->pos) {
		/* keep the sequence: its rows of every layer's K and V */
		uint64_t rows = (uint64_t)m->pos * kv_row(m);
		uint8_t *save = malloc(rows * 2 * m->cfg.layers);
		if (!save)
			return BATON_ENOMEM;
		if ((rc = m->be->sync(m->dev)) != 0) {
			free(save);
			return rc;
		}
		for (uint32_t l = 0; l < m->cfg.layers; l++)
			if ((rc = m->be->copy_d2h(m->dev, save + (uint64_t)l * 2 * rows, kv_k(m, l), rows)) ||
			    (rc = m->be->copy_d2h(m->dev, save + ((uint64_t)l * 2 + 1) * rows, kv_v(m, l),
			        rows))) {
				free(save);
				return rc;
			}
		free(m->kv_saved);
		m->kv_saved = save;
	}
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
	if (m->kv_saved) {
		uint64_t rows = (uint64_t)m->pos * kv_row(m);
		const uint8_t *save = m->kv_saved;
		if ((rc = kv_ensure(m)) != 0)
			goto fail;
		for (uint32_t l = 0; l < m->cfg.layers; l++) {
			struct baton_copy c[2] = {
				{ .dst = kv_k(m, l), .src = save + (uint64_t)l * 2 * rows, .bytes = rows },
				{ .dst = kv_v(m, l), .src = save + ((uint64_t)l * 2 + 1) * rows, .bytes = rows },
			};
			if ((rc = m->be->copy_h2d(m->dev, c, 2)) != 0)
				goto fail;
		}
	}
	if ((rc = m->be->sync(m->dev)) != 0)
		goto fail;
	free(m->kv_saved);
	m->kv_saved = NULL;
	m->released = 0;
	return 0;
fail:
	/* nothing half-made stays: released as before, the sequence kept */
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
	if (m->released) {
		free(m->kv_saved); /* a new sequence: the old rows need not come back */
		m->kv_saved = NULL;
		model_reset(m);
	}
	if ((rc = model_refill(m)))
		return rc;
	model_reset(m);
	if ((rc = kv_ensure(m)))
		return rc;
	for (uint32_t off = 0; off < n; off += m->max_batch) {
		uint32_t len = n - off < m->max_batch ? n - off : m->max_batch;
		if ((rc = forward(m, tokens + off, len, off, off + len == n ? logits : NULL))) {
			model_reset(m);
			return rc;
		}
	}
	m->pos = n;
	m->have_seq = 1;
	return 0;
}

int model_decode(struct baton_model *m, uint32_t token, float *logits)
{
	int rc;

	if (!m || !logits)
		return BATON_EINVAL;
	if (!m->have_seq)
		return BATON_ESTATE;
	if (m->pos >= m->max_ctx || token >= m->cfg.vocab)
		return BATON_ERANGE;
	if ((rc = model_refill(m)))
		return rc;
	if ((rc = forward(m, &token, 1, m->pos, logits)))
		return rc;
	m->pos++;
	return 0;
}

int model_kv_alloc(struct baton_model *m)
{
	return kv_ensure(m);
}
