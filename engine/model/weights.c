/*
 * weights.c: what the model holds on the device beside the KV pool (see
 * model_int.h): its dense tensors, checked against the architecture and
 * uploaded from the arena (and again at refill), and the activations.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/model/model_int.h"

static int weights_add(struct baton_model *m, struct dtensor *t, const void *src, uint64_t bytes)
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
int weights_upload(struct baton_model *m, const struct upload *u)
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
void weights_free(struct baton_model *m)
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
	m->rt_cap = 0;
	if (m->pr_base)
		m->be->free(m->dev, m->pr_base);
	m->pr_base = 0;
	m->tab_ok = 0;
}

/* Uploads tensor `name` of shape rows x cols (a 1-D tensor: rows 1).
 * Absent and optional: t->p = 0. Any other mismatch is refused by name. */
int weights_load(struct baton_model *m, const char *name, uint32_t rows, uint32_t cols,
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
		baton_errf(eb, el, "tensor %s: the %s backend cannot compute %s weights (%s)", name,
		    m->be->name, dn ? dn : "unknown", backend_dtype_advice(m->be, (int)at.dtype));
		return BATON_EUNSUPPORTED;
	}
	if ((rc = weights_add(m, t, at.data, at.bytes)) != 0)
		return rc;
	if ((rc = weights_upload(m, &m->ups[m->n_ups - 1])) != 0) {
		baton_errf(eb, el, "tensor %s: uploading %llu bytes: %s", name,
		    (unsigned long long)at.bytes, baton_strerror(rc));
		return rc;
	}
	t->dtype = at.dtype;
	m->dense_bytes += at.bytes;
	return 0;
}

/* weights_load() of "model.layers.<l>.<suffix>". */
static int weights_load_l(struct baton_model *m, uint32_t l, const char *suffix, uint32_t rows,
    uint32_t cols, int required, struct dtensor *t, char *eb, size_t el)
{
	char name[NAME_MAX_LEN + 32];
	snprintf(name, sizeof name, "model.layers.%u.%.*s", l, NAME_MAX_LEN, suffix);
	return weights_load(m, name, rows, cols, required, t, eb, el);
}

int weights_load_layer(struct baton_model *m, uint32_t l, char *eb, size_t el)
{
	const struct baton_model_config *c = &m->cfg;
	const struct baton_model_arch *a = c->arch;
	struct layer *L = &m->layers[l];
	const uint32_t D = c->hidden, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
	char sfx[NAME_MAX_LEN];
	int rc;

	if ((rc = weights_load_l(m, l, "input_layernorm.weight", 1, D, 1, &L->in_norm, eb, el)) ||
	    (rc = weights_load_l(m, l, "post_attention_layernorm.weight", 1, D, 1, &L->post_norm, eb, el)) ||
	    (rc = weights_load_l(m, l, "self_attn.q_proj.weight", QD, D, 1, &L->q, eb, el)) ||
	    (rc = weights_load_l(m, l, "self_attn.k_proj.weight", KD, D, 1, &L->k, eb, el)) ||
	    (rc = weights_load_l(m, l, "self_attn.v_proj.weight", KD, D, 1, &L->v, eb, el)) ||
	    (rc = weights_load_l(m, l, "self_attn.o_proj.weight", D, QD, 1, &L->o, eb, el)))
		return rc;
	if (c->qkv_bias &&
	    ((rc = weights_load_l(m, l, "self_attn.q_proj.bias", 1, QD, 1, &L->qb, eb, el)) ||
	     (rc = weights_load_l(m, l, "self_attn.k_proj.bias", 1, KD, 1, &L->kb, eb, el)) ||
	     (rc = weights_load_l(m, l, "self_attn.v_proj.bias", 1, KD, 1, &L->vb, eb, el))))
		return rc;
	if (c->o_bias && (rc = weights_load_l(m, l, "self_attn.o_proj.bias", 1, D, 1, &L->ob, eb, el)))
		return rc;
	if (a->qk_norm == BATON_QK_NORM_HEAD &&
	    ((rc = weights_load_l(m, l, "self_attn.q_norm.weight", 1, c->head_dim, 1, &L->q_norm, eb, el)) ||
	     (rc = weights_load_l(m, l, "self_attn.k_norm.weight", 1, c->head_dim, 1, &L->k_norm, eb, el))))
		return rc;
	if (a->qk_norm == BATON_QK_NORM_WHOLE &&
	    ((rc = weights_load_l(m, l, "self_attn.q_norm.weight", 1, QD, 1, &L->q_norm, eb, el)) ||
	     (rc = weights_load_l(m, l, "self_attn.k_norm.weight", 1, KD, 1, &L->k_norm, eb, el))))
		return rc;
	snprintf(sfx, sizeof sfx, "%s.gate.weight", a->moe_prefix);
	if ((rc = weights_load_l(m, l, sfx, c->n_experts, D, 1, &L->router, eb, el)))
		return rc;
	if (a->shared_expert &&
	    ((rc = weights_load_l(m, l, "mlp.shared_expert.gate_proj.weight", c->shared_ff, D, 1, &L->sh_gate, eb, el)) ||
	     (rc = weights_load_l(m, l, "mlp.shared_expert.up_proj.weight", c->shared_ff, D, 1, &L->sh_up, eb, el)) ||
	     (rc = weights_load_l(m, l, "mlp.shared_expert.down_proj.weight", D, c->shared_ff, 1, &L->sh_down, eb, el)) ||
	     (rc = weights_load_l(m, l, "mlp.shared_expert_gate.weight", 1, D, 1, &L->sh_g, eb, el))))
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
			baton_errf(eb, el, "layer %u expert %s: the %s backend cannot compute %s weights (%s)",
			    l, pn[i], m->be->name, dn ? dn : "unknown",
			    backend_dtype_advice(m->be, (int)parts[i].dtype));
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
int weights_alloc_acts(struct baton_model *m)
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
