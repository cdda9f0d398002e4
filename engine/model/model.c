/*
 * model.c: a whole MoE language model on an engine's device (see model.h,
 * the model, and docs/internals/model.md): open and close, and what it says about
 * itself. The parts are model_int.h's: weights.c (dense tensors and
 * activations), kv.c (the KV pool and sequences), prefix.c (the prefix
 * cache and its host copy), forward.c (the forward pass), release.c
 * (giving the device memory back and taking it again).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/model/model_int.h"

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
	m->asegs = malloc(B * sizeof *m->asegs);
	m->inv_freq = malloc(c->head_dim / 2 * sizeof *m->inv_freq);
	m->free_ids = malloc((size_t)m->n_blocks * sizeof *m->free_ids);
	if (!m->ids || !m->want || !m->w || !m->blobs || !m->posv || !m->slots || !m->toks ||
	    !m->segs || !m->asegs || !m->inv_freq || !m->free_ids)
		return BATON_ENOMEM;
	/* the stack pops block 0 first */
	for (uint32_t i = 0; i < m->n_blocks; i++)
		m->free_ids[i] = m->n_blocks - 1 - i;
	m->n_free = m->n_blocks;
	model_rope_inv_freq(c, m->inv_freq);
	return 0;
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
	/* the largest pass routed on the device (BATON_MODEL_DEVICE_ROWS,
	 * 1 .. RT_ROWS_MAX, for comparing; default RT_ROWS) */
	m->rt_rows = RT_ROWS;
	const char *dr = getenv("BATON_MODEL_DEVICE_ROWS");
	if (dr && *dr) {
		char *end;
		unsigned long v = strtoul(dr, &end, 10);
		if (!*end && v >= 1 && v <= RT_ROWS_MAX)
			m->rt_rows = (uint32_t)v;
	}
	const int rows_set = m->rt_rows != RT_ROWS || (dr && *dr);
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
	if ((rc = weights_load(m, "model.embed_tokens.weight", c->vocab, c->hidden, 1, &m->embed, eb, el)) ||
	    (rc = weights_load(m, "model.norm.weight", 1, c->hidden, 1, &m->norm, eb, el)))
		goto fail;
	if (c->tie_embeddings)
		m->head = m->embed;
	else if ((rc = weights_load(m, "lm_head.weight", c->vocab, c->hidden, 1, &m->head, eb, el)))
		goto fail;
	for (uint32_t l = 0; l < c->layers; l++)
		if ((rc = weights_load_layer(m, l, eb, el)) != 0)
			goto fail;
	/* q4_K experts in every layer, of widths the cuda backend's grouped
	 * experts take (moe_rows.h: hidden <= 2048, moe_ff <= 1024, multiples
	 * of 256): passes up to RT_ROWS_Q4K rows route on the device too
	 * (serving's decode steps; each chosen expert read once for all its
	 * rows); other models keep RT_ROWS, whose larger passes group tokens
	 * on the host */
	int all_q4k = !rows_set && c->layers > 0 && c->hidden <= 2048 && c->hidden % 256 == 0 &&
	    c->moe_ff <= 1024 && c->moe_ff % 256 == 0;
	for (uint32_t l = 0; all_q4k && l < c->layers; l++)
		all_q4k = m->layers[l].gate_dt == BATON_DT_Q4_K && m->layers[l].up_dt == BATON_DT_Q4_K &&
		    m->layers[l].down_dt == BATON_DT_Q4_K;
	if (all_q4k)
		m->rt_rows = RT_ROWS_Q4K;
	/* experts the backend plans on the device in large passes too (the
	 * cuda backend's bf16 ones): those passes route there while all are
	 * resident, so no prefill layer waits for the host */
	uint32_t lo = 0, hi = UINT32_MAX;
	int large = !rows_set && m->be->moe_dev_rows && c->layers > 0;
	for (uint32_t l = 0; large && l < c->layers; l++) {
		const struct layer *L = &m->layers[l];
		const struct baton_moe_layer ml = {
			.d_model = c->hidden, .d_ff = c->moe_ff, .n_experts = c->n_experts, .top_k = c->top_k,
			.gate_dtype = L->gate_dt, .up_dtype = L->up_dt, .down_dtype = L->down_dt,
			.gate_off = L->gate_off, .up_off = L->up_off, .down_off = L->down_off,
		};
		uint32_t r_lo = 0, r_hi = 0;
		large = m->be->moe_dev_rows(m->dev, &ml, &r_lo, &r_hi) == 1 && r_lo > 1 && r_lo <= r_hi;
		lo = r_lo > lo ? r_lo : lo, hi = r_hi < hi ? r_hi : hi;
	}
	if (large && lo <= hi && lo <= m->max_batch && lo > m->rt_rows) {
		m->rt_lo = lo;
		m->rt_hi = hi < m->max_batch ? hi : m->max_batch;
	}
	if ((rc = m->be->sync(m->dev)) != 0) {
		baton_errf(eb, el, "uploading the dense tensors: %s", baton_strerror(rc));
		goto fail;
	}
	/* no --kv-blocks: the pool from the memory left once the dense weights
	 * are there (issue 28: one context let one chat hold the pool) */
	if (!(opts && opts->kv_blocks))
		m->n_blocks = kv_default_blocks(m, opts ? opts->kv_seqs : 0);
	if ((rc = alloc_host(m)) != 0 || (rc = weights_alloc_acts(m)) != 0) {
		baton_errf(eb, el, "allocating activations for %u tokens: %s", m->max_batch,
		    baton_strerror(rc));
		goto fail;
	}
	if ((rc = kv_cache_init(m, cj, (size_t)cj_len)) != 0)
		goto fail;
	if (m->be->prepare) /* what a pass of max_batch rows needs, now (cuda: cuBLAS) */
		(void)m->be->prepare(m->dev, m->max_batch);
	m->pc_on = !(opts && opts->no_prefix_cache);
	m->host_limit = opts ? opts->kv_host_bytes : 0;
	if ((rc = model_seq_open(m, &m->def)) != 0)
		goto fail;
	*out = m;
	return 0;
fail:
	model_close(m);
	return rc;
}

void model_close(struct baton_model *m)
{
	if (!m)
		return;
	m->host_limit = 0; /* nothing to keep for later */
	if (m->pin_p) /* its owner did not free it: the backend's memory goes now */
		m->be->host_free(m->dev, (void *)m->pin_p);
	m->pin_p = NULL;
	if (m->blk)
		model_kv_release(m);
	else if (m->kv)
		m->be->free(m->dev, m->kv);
	kv_drop_saved(m);
	while (m->seqs)
		model_seq_close(m, m->seqs);
	kv_cache_free(m);
	weights_free(m);
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
	free(m->asegs);
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

int model_warm(struct baton_model *m, uint32_t rows, int force)
{
	if (!m)
		return BATON_EINVAL;
	if ((!force && !m->be->prepare) || m->released)
		return 0;
	if (m->cache) { /* a pass that would load experts (the broker's grant first) is not warm-up */
		const uint64_t ni = (uint64_t)m->cfg.layers * m->cfg.n_experts;
		baton_dptr *tab = malloc((ni ? ni : 1) * sizeof *tab);
		const int all = tab && cache_all_resident(m->cache, tab);
		free(tab);
		if (!all)
			return 0;
	}
	if (rows > m->max_batch)
		rows = m->max_batch;
	if (rows > m->max_ctx)
		rows = m->max_ctx;
	if (rows > kv_avail(m) * BATON_KV_BLOCK)
		rows = kv_avail(m) * BATON_KV_BLOCK;
	if (rows < 2)
		return 0;
	const uint32_t V = m->cfg.vocab;
	uint32_t *toks = malloc((size_t)rows * sizeof *toks);
	float *logits = malloc((size_t)V * sizeof *logits);
	struct baton_seq *s = NULL;
	int rc = toks && logits ? model_seq_open(m, &s) : BATON_ENOMEM;
	if (rc == 0) {
		/* spread over the vocabulary, so the experts get uneven counts
		 * as real prompts give them */
		for (uint32_t i = 0; i < rows; i++)
			toks[i] = (uint32_t)(((uint64_t)i * 7919u + 13u) % V);
		const int pc = m->pc_on;
		m->pc_on = 0;
		const struct baton_step_item it = { .seq = s, .tokens = toks, .n = rows };
		rc = model_step(m, &it, 1, logits);
		m->pc_on = pc;
	}
	model_seq_close(m, s);
	free(toks);
	free(logits);
	return rc;
}

uint32_t model_max_ctx(const struct baton_model *m)
{
	return m->max_ctx;
}

uint64_t model_dense_bytes(const struct baton_model *m)
{
	return m->dense_bytes;
}
