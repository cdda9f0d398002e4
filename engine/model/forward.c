/*
 * forward.c: the forward pass of every supported MoE architecture, one
 * implementation steered by the switches of config.c, on the
 * backend's dense op slots (engine/backend/backend.h) and the engine's expert
 * cache. See model.h and docs/model.md.
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
 *     a = attention(q, K, V) per segment over its blocks (causal, GQA;
 *         all segments in one attention_segs call where the backend has it)
 *     x += o_proj a (+b)
 *     xn = rmsnorm(x, post_attention_layernorm)
 *     ids, w = route(router xn); x += sum_k w_k expert_k(xn) (the cache)
 *     qwen2_moe: x += sigmoid(shared_expert_gate xn) * shared_expert(xn)
 *   logits = head(rmsnorm(x[last], norm)) for each segment that ends an item
 * Every op computes each row alone (engine_int.h's fixed order), so a
 * sequence's logits do not depend on what else shares its pass.
 *
 * model_step builds the segments of a step (each item's sequence grown in
 * the KV pool, kv.c) and runs passes of max_batch rows; the default
 * sequence's prefill and decode are steps of one item.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/backend.h"
#include "engine/model/model_int.h"
#include "proto/base/base.h"

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

	if (be->matmuls) { /* q, k and v in one call (one launch at batch 1 on cuda) */
		const struct baton_matmuls mm = { .x = m->xn, .rows = n, .k = D, .n = 3, .m = {
			{ .w = L->q.p, .b = L->qb.p, .y = m->q, .w_dtype = L->q.dtype,
			    .b_dtype = L->qb.dtype, .n_out = QD },
			{ .w = L->k.p, .b = L->kb.p, .y = m->kx, .w_dtype = L->k.dtype,
			    .b_dtype = L->kb.dtype, .n_out = KD },
			{ .w = L->v.p, .b = L->vb.p, .y = m->vx, .w_dtype = L->v.dtype,
			    .b_dtype = L->vb.dtype, .n_out = KD } } };
		if (be->rmsnorm_matmuls) { /* with the input norm (one launch at batch 1 on cuda) */
			if ((rc = be->rmsnorm_matmuls(d, m->x, L->in_norm.p, L->in_norm.dtype, c->eps, &mm)))
				return rc;
		} else if ((rc = be->rmsnorm(d, m->x, m->xn, n, D, L->in_norm.p, L->in_norm.dtype,
		                c->eps)) ||
		    (rc = be->matmuls(d, &mm))) {
			return rc;
		}
	} else if ((rc = be->rmsnorm(d, m->x, m->xn, n, D, L->in_norm.p, L->in_norm.dtype,
	                c->eps)) ||
	    (rc = be->matmul(d, L->q.p, L->q.dtype, QD, D, L->qb.p, L->qb.dtype, m->xn, n,
	                m->q, 0)) ||
	    (rc = be->matmul(d, L->k.p, L->k.dtype, KD, D, L->kb.p, L->kb.dtype, m->xn, n, m->kx, 0)) ||
	    (rc = be->matmul(d, L->v.p, L->v.dtype, KD, D, L->vb.p, L->vb.dtype, m->xn, n, m->vx, 0))) {
		return rc;
	}
	int stored = 0;
	if (c->arch->qk_norm == BATON_QK_NORM_HEAD && be->qk_norm_rope) {
		/* the four ops below and kv_store in one call, their bits */
		const struct baton_qk_norm_rope nr = {
			.q = m->q, .k = m->kx, .wq = L->q_norm.p, .wk = L->k_norm.p,
			.wq_dtype = L->q_norm.dtype, .wk_dtype = L->k_norm.dtype, .rows = n,
			.heads = c->heads, .kv_heads = c->kv_heads, .head_dim = c->head_dim,
			.eps = c->eps, .mscale = c->rope_mscale, .pos = m->posv, .inv_freq = m->inv_freq,
			.v = m->vx, .k_cache = kv_k(m, l), .v_cache = kv_v(m, l), .slots = m->slots,
			.cache_rows = kv_pool_rows(m),
		};
		if (be->qk_attention_segs && be->attention_segs) {
			/* with attention: one launch for a pass of decode rows */
			for (uint32_t i = 0; i < n_seg; i++)
				m->asegs[i] = (struct baton_attn_seg){ .n_q = sg[i].n, .pos0 = sg[i].pos0,
					.blocks = sg[i].seq->blocks };
			const struct baton_attn_segs as = {
				.q = m->q, .k = kv_k(m, l), .v = kv_v(m, l), .out = m->ao, .n_seg = n_seg,
				.n_heads = c->heads, .n_kv_heads = c->kv_heads, .head_dim = c->head_dim,
				.block_size = BATON_KV_BLOCK, .scale = 1.0f / sqrtf((float)c->head_dim),
				.segs = m->asegs,
			};
			if ((rc = be->qk_attention_segs(d, &nr, &as)))
				return rc;
			return be->matmul(d, L->o.p, L->o.dtype, D, QD, L->ob.p, L->ob.dtype, m->ao, n,
			    m->x, 1);
		}
		if ((rc = be->qk_norm_rope(d, &nr)))
			return rc;
		stored = 1;
	} else if ((rc = qk_norm(m, m->q, n, c->heads, &L->q_norm)) ||
	    (rc = qk_norm(m, m->kx, n, c->kv_heads, &L->k_norm)) ||
	    (rc = be->rope(d, m->q, n, c->heads, c->head_dim, m->posv, m->inv_freq, c->rope_mscale)) ||
	    (rc = be->rope(d, m->kx, n, c->kv_heads, c->head_dim, m->posv, m->inv_freq,
	        c->rope_mscale))) {
		return rc;
	}
	struct baton_kv_store ks = {
		.k = m->kx, .v = m->vx, .k_cache = kv_k(m, l), .v_cache = kv_v(m, l),
		.slots = m->slots, .n = n, .cols = KD, .cache_rows = kv_pool_rows(m),
	};
	if (!stored && (rc = be->kv_store(d, &ks)))
		return rc;
	const float scale = 1.0f / sqrtf((float)c->head_dim);
	if (be->attention_segs) { /* every segment in one call: one launch, not one each */
		for (uint32_t i = 0; i < n_seg; i++)
			m->asegs[i] = (struct baton_attn_seg){ .n_q = sg[i].n, .pos0 = sg[i].pos0,
				.blocks = sg[i].seq->blocks };
		const struct baton_attn_segs as = {
			.q = m->q, .k = kv_k(m, l), .v = kv_v(m, l), .out = m->ao, .n_seg = n_seg,
			.n_heads = c->heads, .n_kv_heads = c->kv_heads, .head_dim = c->head_dim,
			.block_size = BATON_KV_BLOCK, .scale = scale, .segs = m->asegs,
		};
		if ((rc = be->attention_segs(d, &as)))
			return rc;
	} else {
		uint64_t row = 0;
		for (uint32_t i = 0; i < n_seg; i++) {
			struct baton_attn at = {
				.q = m->q + row * QD * sizeof(float), .k = kv_k(m, l), .v = kv_v(m, l),
				.out = m->ao + row * QD * sizeof(float),
				.n_q = sg[i].n, .n_heads = c->heads, .n_kv_heads = c->kv_heads,
				.head_dim = c->head_dim, .pos0 = sg[i].pos0, .scale = scale,
				.blocks = sg[i].seq->blocks, .block_size = BATON_KV_BLOCK,
			};
			if ((rc = be->attention(d, &at)))
				return rc;
			row += sg[i].n;
		}
	}
	return be->matmul(d, L->o.p, L->o.dtype, D, QD, L->ob.p, L->ob.dtype, m->ao, n, m->x, 1);
}

/* route's choice for the n rows of m->rl into m->ids and m->w (host
 * arrays), for the passes that route on the host: made on the device by
 * route_dev (bitwise route's) and copied back, rather than the logits
 * copied and chosen on the host, which costs milliseconds a layer for a
 * prefill of hundreds of rows; route itself without route_dev or with
 * BATON_MODEL_HOST_ROUTE=1. */
static int route_rows(struct baton_model *m, uint32_t n)
{
	const struct baton_backend *be = m->be;
	const struct baton_model_config *c = &m->cfg;
	const uint32_t E = c->n_experts, K = c->top_k;
	const uint64_t nk = (uint64_t)n * K, cap = (uint64_t)m->max_batch * K * sizeof(uint32_t);
	int rc;

	if (!be->route_dev || m->rt_off)
		return be->route(m->dev, m->rl, n, E, K, c->route_rule, m->ids, m->w);
	if (!m->pr_base && (rc = be->alloc(m->dev, 2 * cap, &m->pr_base))) {
		m->pr_base = 0;
		return rc;
	}
	if ((rc = be->route_dev(m->dev, m->rl, n, E, K, c->route_rule, m->pr_base, m->pr_base + cap)) ||
	    (rc = be->copy_d2h(m->dev, m->ids, m->pr_base, nk * sizeof(uint32_t))))
		return rc;
	return be->copy_d2h(m->dev, m->w, m->pr_base + cap, nk * sizeof(float));
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

	/* layer l's n rows of ids, packed (moe_dev_account copies n rows a layer) */
	const baton_dptr ids = m->rt_ids + (uint64_t)l * n * K * sizeof(uint32_t);
	if (m->rt_on && be->router_route_dev) { /* the norm, router and route in one call */
		const struct baton_router_route rr = {
			.x = m->x, .xn = m->xn, .norm = L->post_norm.p, .w = L->router.p, .logits = m->rl,
			.ids = ids, .weights = m->rt_w, .norm_on = 1, .norm_dtype = L->post_norm.dtype,
			.w_dtype = L->router.dtype, .n_experts = E, .k = D, .rows = n, .top_k = K,
			.rule = c->route_rule, .eps = c->eps,
		};
		if ((rc = be->router_route_dev(d, &rr)))
			return rc;
	} else if ((rc = be->rmsnorm(d, m->x, m->xn, n, D, L->post_norm.p, L->post_norm.dtype,
	                c->eps)) ||
	    (rc = be->matmul(d, L->router.p, L->router.dtype, E, D, 0, 0, m->xn, n, m->rl, 0))) {
		return rc;
	} else if (m->rt_on) {
		if ((rc = be->route_dev(d, m->rl, n, E, K, c->route_rule, ids, m->rt_w)))
			return rc;
	} else {
		if ((rc = route_rows(m, n)))
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

/* Whether [p, p + n) lies in the buffer of model_logits_alloc. */
static int pinned(const struct baton_model *m, const float *p, uint64_t n)
{
	const char *c = (const char *)p;
	return m->pin_p && c >= m->pin_p && (uint64_t)(c - m->pin_p) + n <= m->pin_bytes;
}

float *model_logits_alloc(struct baton_model *m, uint64_t bytes)
{
	void *p = NULL;
	if (!m || !bytes)
		return NULL;
	if (!m->pin_p && m->be->host_alloc && m->be->host_free &&
	    m->be->host_alloc(m->dev, bytes, &p) == 0) {
		m->pin_p = p;
		m->pin_bytes = bytes;
		return p;
	}
	return malloc(bytes);
}

void model_logits_free(struct baton_model *m, float *p)
{
	if (!p)
		return;
	if (m && (const char *)p == m->pin_p) {
		m->be->host_free(m->dev, p);
		m->pin_p = NULL;
		m->pin_bytes = 0;
		return;
	}
	free(p);
}

double model_wait_seconds(const struct baton_model *m)
{
	return m && m->be->wait_seconds ? m->be->wait_seconds(m->dev) : 0;
}

void model_head_times(const struct baton_model *m, double *sync_s, double *copy_s)
{
	*sync_s = m ? m->t_head_sync : 0;
	*copy_s = m ? m->t_head_copy : 0;
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

	/* the norm over runs of consecutive last rows at once (a decode
	 * step's: every row), the bits of one call a row */
	uint32_t g0 = 0, first = 0;
	for (uint32_t i = 0; i < n_seg; i++) {
		row += sg[i].n;
		if (sg[i].logits) {
			if (g > g0 && first + (g - g0) != row - 1) {
				if ((rc = m->be->rmsnorm(m->dev, m->x + first * rowb, m->xn + g0 * rowb,
				         g - g0, D, m->norm.p, m->norm.dtype, c->eps)))
					return rc;
				g0 = g;
			}
			if (g == g0)
				first = (uint32_t)(row - 1);
			dst[g++] = sg[i].logits;
		}
		if (g && (g == HR || i + 1 == n_seg)) {
			if (g > g0 && (rc = m->be->rmsnorm(m->dev, m->x + first * rowb, m->xn + g0 * rowb,
			                   g - g0, D, m->norm.p, m->norm.dtype, c->eps)))
				return rc;
			if ((rc = m->be->matmul(m->dev, m->head.p, m->head.dtype, c->vocab, D, 0, 0, m->xn,
			         g, m->logits, 0)))
				return rc;
			if (m->capturing) { /* the pass recorded so far runs as one graph */
				m->capturing = 0;
				if ((rc = m->be->graph_end(m->dev, 1)))
					return rc;
				m->graph_runs++;
				m->graph_ran = 1;
			}
			const double t0 = baton_now_s();
			if ((rc = m->be->sync(m->dev)))
				return rc;
			const double t1 = baton_now_s();
			/* rows back to back in a pinned buffer (the scheduler's):
			 * one copy at the device's rate; else a staged copy each */
			for (uint32_t r = 0, e; r < g; r = e) {
				for (e = r + 1; e < g && dst[e] == dst[e - 1] + c->vocab && pinned(m, dst[r],
				         (uint64_t)(e + 1 - r) * vb); e++)
					;
				if ((rc = m->be->copy_d2h(m->dev, dst[r], m->logits + r * vb, (e - r) * vb)))
					return rc;
			}
			m->t_head_sync += t1 - t0;
			m->t_head_copy += baton_now_s() - t1;
			g = g0 = 0;
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
	int rc;

	m->rt_on = 0;
	const int large = m->rt_lo && n >= m->rt_lo && n <= m->rt_hi;
	if (m->rt_off || !m->be->route_dev || !m->be->moe_experts_dev || (n > m->rt_rows && !large) ||
	    !m->cache)
		return 0;
	if (!m->tab_now) { /* rt_host: the most rows a routed pass may have */
		const uint32_t rows = m->rt_hi > m->rt_rows ? m->rt_hi : m->rt_rows;
		const uint64_t ib = (uint64_t)c->layers * rows * c->top_k * sizeof(uint32_t);
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
	/* the device buffers hold rt_rows rows, rt_hi once a large pass came;
	 * a large pass that finds no device memory for them takes the host
	 * path, and so do the later ones */
	const int big = large && n > m->rt_rows;
	const uint32_t want = big ? m->rt_hi : m->rt_rows;
	if (!m->rt_base || m->rt_cap < want) {
		const uint64_t ibw = (uint64_t)c->layers * want * c->top_k * sizeof(uint32_t);
		const uint64_t bytes = tb + ibw + (uint64_t)want * c->top_k * sizeof(float);
		baton_dptr nb = 0;
		if ((rc = m->be->alloc(m->dev, bytes, &nb))) {
			if (!big)
				return rc;
			m->rt_lo = 0;
			return 0;
		}
		if (m->rt_base)
			m->be->free(m->dev, m->rt_base);
		m->rt_base = nb;
		m->rt_cap = want;
		m->rt_tab = m->rt_base;
		m->rt_ids = m->rt_base + tb;
		m->rt_w = m->rt_ids + ibw;
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

uint64_t model_graph_passes(const struct baton_model *m)
{
	return m ? m->graph_runs : 0;
}

uint64_t model_graph_replays(const struct baton_model *m)
{
	return m ? m->graph_replays : 0;
}

uint64_t model_passes(const struct baton_model *m)
{
	return m ? m->passes : 0;
}

uint32_t model_max_batch(const struct baton_model *m)
{
	return m ? m->max_batch : 0;
}

/* After a pass routed on the device: its choices, back in one copy, go
 * through cache_lookup as the host path's would have (all hits: the
 * cache's counts and heat stay what they were). */
static int moe_dev_account(struct baton_model *m, uint32_t n)
{
	const struct baton_model_config *c = &m->cfg;
	const uint32_t E = c->n_experts, K = c->top_k, nk = n * K;
	const uint64_t ib = (uint64_t)c->layers * nk * sizeof(uint32_t);
	int rc;

	if ((rc = m->be->copy_d2h(m->dev, m->rt_host, m->rt_ids, ib)))
		return rc;
	for (uint32_t l = 0; l < c->layers; l++) {
		const uint32_t *id = m->rt_host + (uint64_t)l * nk;
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

/* The pass's device work: embedding, the layers, the head. */
static int pass_ops(struct baton_model *m, const struct segment *sg, uint32_t n_seg, uint32_t n)
{
	const struct baton_model_config *c = &m->cfg;
	int rc;

	m->graph_ran = 0;
	if ((rc = m->be->embed(m->dev, m->embed.p, m->embed.dtype, c->vocab, c->hidden, m->toks, n,
	         m->x)))
		return rc;
	for (uint32_t l = 0; l < c->layers; l++)
		if ((rc = attention_block(m, l, sg, n_seg, n)) || (rc = moe_block(m, l, n)))
			return rc;
	return head(m, sg, n_seg);
}

/* One pass: the segments' rows, n of them in all (<= max_batch). The
 * sequences own the blocks of every position the pass writes. */
static int pass(struct baton_model *m, const struct segment *sg, uint32_t n_seg, uint32_t n)
{
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
	if ((rc = moe_dev_ready(m, n)))
		return rc;
	m->passes++;
	/* A pass that routes on the device waits for nothing until its head:
	 * recorded and queued as one graph where the backend can (the same
	 * work, the same bits; graph_begin/graph_end in backend.h), so the
	 * ~20 small kernels of a layer do not pay a launch each. If anything
	 * fails while recording, nothing of it ran: the pass is queued again
	 * as usual. */
	int replay = 0, graph = 0;
	for (int tries = 0; tries < 2; tries++) {
		/* a recording is checked against this pass and replayed; one the
		 * pass differs from is refused (nothing ran) and the pass is
		 * recorded anew */
		graph = m->rt_on && n <= m->rt_rows && m->be->graph_begin && m->be->graph_end &&
		    m->be->graph_begin(m->dev, &replay) == 0;
		m->capturing = graph;
		rc = pass_ops(m, sg, n_seg, n);
		if (m->capturing) { /* no head ended it: an op failed (drop it), or no logits */
			m->capturing = 0;
			if (rc)
				m->be->graph_end(m->dev, 0);
			else if ((rc = m->be->graph_end(m->dev, 1)) == 0)
				m->graph_ran = 1, m->graph_runs++;
		}
		if (!rc && m->graph_ran && replay)
			m->graph_replays++;
		if (!rc || !graph || !replay || m->graph_ran)
			break;
	}
	if (rc && graph && !m->graph_ran)
		rc = pass_ops(m, sg, n_seg, n);
	if (rc)
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
	if (!rc && need > kv_avail(m))
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
			s->blocks[s->n_blocks++] = kv_take(m);
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
		if (rc) {
			kv_seq_shrink(m, s, s->mark - 1);
		} else {
			kv_seq_fed(m, s, items[i].tokens, items[i].n); /* full blocks into the prefix cache */
			s->pos += items[i].n;
		}
	}
	for (i = 0; i < n_items; i++)
		items[i].seq->mark = 0;
	return rc;
}

uint32_t model_pos(const struct baton_model *m)
{
	return m->def ? m->def->pos : 0;
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
