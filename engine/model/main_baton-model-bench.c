/*
 * baton-model-bench: a whole model's speed on one device (issue 17's
 * performance proof). Not a test: it prints figures and their ratios to
 * the physical limit measured in the same run.
 *
 *   baton-model-bench --arena PATH [--backend cuda|host|auto] [--device N]
 *                     [--steps N] [--prompts N,N,...] [--first-prompt N]
 *                     [--max-batch N] [--seed N] [--bandwidth-mib N]
 *                     [--json FILE]
 *   baton-model-bench --arena PATH --perplexity FILE [--ctx N] [--chunks N]
 *                     [--seqs N] [--tokenizer FILE] [--backend ...] [--device N]
 *                     [--json FILE]
 *
 * Figures:
 *   bandwidth   device-to-device copies of 2 GiB (--bandwidth-mib), best
 *               of 5: bytes read plus bytes written over the time (the
 *               memory roofline);
 *   decode      tokens/s at batch 1 (greedy, after a 32-token prompt): the
 *               engine step alone (token in, logits in pinned host
 *               memory, as llama-bench's tg times it) and with the host's
 *               greedy pick (the engine's sampler at temperature 0, as
 *               the scheduler samples); and the step's
 *               roofline ratio: the bytes one token must read (every
 *               dense matrix but the embedding table, one embedding row,
 *               top_k experts per layer, the KV rows so far) over the
 *               bandwidth, divided by the measured time per token;
 *   prefill     tokens/s of each prompt length, random token ids, in
 *               passes of --max-batch rows (default 512), each length
 *               timed after an untimed run of it;
 *   first token after a release of everything (expert cache and model):
 *               the prefill of a short prompt that loads what it needs
 *               first (hot-first), against a full refill of the expert
 *               cache and the model followed by the same prefill.
 * --perplexity: instead of the figures, the perplexity over a text file
 * as llama.cpp's llama-perplexity measures it (engine/model/perplexity.c):
 * the file tokenized by the arena's tokenizer as llama.cpp tokenizes
 * (BOS when the tokenizer adds one, special tokens' text as text),
 * chunks of --ctx tokens (default 512), the second half of each scored;
 * --chunks caps their count, --seqs runs that many side by side (64);
 * --tokenizer FILE (a tokenizer.json or GGUF-key JSON) instead of the
 * arena's, for an arena without one.
 * It prints "perplexity: PPL +/- ERR over N chunks of CTX (M tokens
 * scored, T tokens)".
 * Needs a model arena (baton-arena create --synthetic-arch ..., or one
 * made from a checkpoint) whose experts all fit the device.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "text/text.h"

#define MAX_PROMPTS 8

static void die(const char *what, int rc, const char *msg)
{
	fprintf(stderr, "baton-model-bench: %s: %s%s%s\n", what, baton_strerror(rc),
	    msg && *msg ? ": " : "", msg ? msg : "");
	exit(1);
}

static uint64_t parse_u64(const char *flag, const char *v, uint64_t lo, uint64_t hi)
{
	uint64_t x;
	if (baton_parse_u64(v, lo, hi, &x)) {
		fprintf(stderr, "baton-model-bench: %s wants an integer in %" PRIu64 "..%" PRIu64
		    ", got '%s'\n", flag, lo, hi, v);
		exit(2);
	}
	return x;
}

static uint64_t g_rng;

static uint32_t rnd(uint32_t n)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (uint32_t)(g_rng % n);
}

/* The next token as the scheduler picks it at temperature 0: the
 * engine's sampler (baton_sampler_next's greedy path, its first largest
 * logit); the decode figure "with the host's greedy pick" includes it. */
static uint32_t pick(struct baton_sampler *s, float *logits)
{
	uint32_t t;
	int rc = baton_sampler_next(s, logits, &t, NULL);
	if (rc)
		die("the greedy pick", rc, NULL);
	return t;
}

/* Read bandwidth of the device: d2d copies (each byte read once and
 * written once), best of 5, of `want` bytes or a quarter of what is free. */
static double measure_bandwidth(const struct baton_backend *be, struct baton_dev *dev,
    uint64_t want, uint64_t *bytes_out)
{
	uint64_t fr = 0, tot = 0, n = want;
	if (be->mem_info(dev, &fr, &tot) == 0 && fr / 4 < n)
		n = fr / 4 / BATON_MIB * BATON_MIB;
	baton_dptr a = 0, b = 0;
	int rc;
	if (n < BATON_MIB || (rc = be->alloc(dev, n, &a)) != 0 || (rc = be->alloc(dev, n, &b)) != 0)
		die("bandwidth buffers", BATON_EDEVMEM, "the device has no room for two copies");
	double best = 0;
	for (int i = 0; i < 6; i++) {
		double t0 = baton_now_s();
		if ((rc = backend_copy_d2d(be, dev, b, a, n)) != 0 || (rc = be->sync(dev)) != 0)
			die("device-to-device copy", rc, NULL);
		double gbps = 2.0 * (double)n / (baton_now_s() - t0) / 1e9;
		if (i > 0 && gbps > best) /* the first warms up */
			best = gbps;
	}
	be->free(dev, a);
	be->free(dev, b);
	*bytes_out = n;
	return best;
}

/* Bytes one decode step must read, KV aside: every dense tensor but the
 * embedding table (one row of it), top_k experts per layer. */
static uint64_t step_weight_bytes(const struct baton_arena *a, const struct baton_model_config *c,
    uint64_t expert_blob, uint64_t *dense_out)
{
	uint64_t dense = 0, n = arena_dense_count(a);
	for (uint64_t i = 0; i < n; i++) {
		const char *name;
		struct baton_arena_tensor t;
		if (arena_dense_at(a, i, &name, &t) != 0)
			continue;
		if (strcmp(name, "model.embed_tokens.weight") == 0 && !c->tie_embeddings)
			dense += t.rows ? t.bytes / t.rows : 0;
		else
			dense += t.bytes;
	}
	*dense_out = dense;
	return dense + (uint64_t)c->layers * c->top_k * expert_blob;
}

/* ---- where a decode step's time goes -------------------------------------- */

struct parts {
	double layer, attn, route, experts, head, launch; /* seconds each */
	int ok, dev_route; /* dev_route: routing and lookup on the device, as forward.c does */
};

/* A device copy of dense tensor `name` (layer 0's weights: real bytes). */
static baton_dptr up_dense(const struct baton_backend *be, struct baton_dev *dev,
    const struct baton_arena *a, const char *name, uint32_t *dtype)
{
	struct baton_arena_tensor t;
	baton_dptr p = 0;
	if (arena_dense(a, name, &t) != 0)
		return 0;
	if (be->alloc(dev, t.bytes, &p) != 0)
		return 0;
	struct baton_copy c = { .dst = p, .src = t.data, .bytes = t.bytes };
	if (be->copy_h2d(dev, &c, 1) != 0 || be->sync(dev) != 0) {
		be->free(dev, p);
		return 0;
	}
	*dtype = t.dtype;
	return p;
}

/* The ops of one decode layer as forward.c queues them (attention block,
 * router and route, expert lookup and the experts), on layer 0's real
 * weights and the engine's cache, at context `ctx`; each part alone and
 * all together, `reps` times each with one sync at the end, so that a
 * part's time is what it costs in the queue (launch- or device-bound),
 * plus a one-block launch and the head with its logits copy. */
static struct parts decode_parts(struct baton_engine *e, const struct baton_model_config *c,
    uint32_t ctx)
{
	struct parts r = { 0 };
	const struct baton_backend *be = engine_backend(e);
	struct baton_dev *dev = engine_dev(e);
	const struct baton_arena *a = engine_arena(e);
	const uint32_t D = c->hidden, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
	const uint32_t E = c->n_experts, K = c->top_k, reps = 50;
	uint32_t dq = 0, dk = 0, dv = 0, dO = 0, dn = 0, dqn = 0, dkn = 0, dr = 0, dpn = 0, dh = 0;
	baton_dptr wq = up_dense(be, dev, a, "model.layers.0.self_attn.q_proj.weight", &dq);
	baton_dptr wk = up_dense(be, dev, a, "model.layers.0.self_attn.k_proj.weight", &dk);
	baton_dptr wv = up_dense(be, dev, a, "model.layers.0.self_attn.v_proj.weight", &dv);
	baton_dptr wo = up_dense(be, dev, a, "model.layers.0.self_attn.o_proj.weight", &dO);
	baton_dptr nin = up_dense(be, dev, a, "model.layers.0.input_layernorm.weight", &dn);
	baton_dptr npost = up_dense(be, dev, a, "model.layers.0.post_attention_layernorm.weight", &dpn);
	baton_dptr nq = up_dense(be, dev, a, "model.layers.0.self_attn.q_norm.weight", &dqn);
	baton_dptr nk = up_dense(be, dev, a, "model.layers.0.self_attn.k_norm.weight", &dkn);
	baton_dptr wr = up_dense(be, dev, a, "model.layers.0.mlp.gate.weight", &dr);
	baton_dptr wh = up_dense(be, dev, a, c->tie_embeddings ? "model.embed_tokens.weight" :
	    "lm_head.weight", &dh);
	baton_dptr scratch = 0;
	const uint64_t fl = 4;
	const uint64_t n_scr = 2ull * D + QD + QD + E + 2ull * ctx * KD + c->vocab + 2ull * KD;
	float *host = calloc((size_t)D + c->vocab, sizeof(float));
	uint32_t *pos = calloc(1, sizeof *pos), ids[64], want[64];
	float *inv = malloc((size_t)c->head_dim / 2 * sizeof(float)), w[64];
	baton_dptr blobs[64], rt = 0;
	baton_dptr *tab = calloc(E, sizeof *tab);
	uint32_t *all_e = calloc(E, sizeof *all_e), *btab = NULL;
	const char *hr = getenv("BATON_MODEL_HOST_ROUTE");
	r.dev_route = be->route_dev && be->moe_experts_dev && !(hr && strcmp(hr, "1") == 0);
	if (!tab || !all_e || (r.dev_route && be->alloc(dev, (uint64_t)E * 8 + 512, &rt) != 0))
		goto out;
	/* the device path's table: layer 0's items are its expert ids */
	for (uint32_t i = 0; i < E; i++)
		all_e[i] = i;
	const baton_dptr dids = rt + (uint64_t)E * 8, dw = dids + 256;
	if (r.dev_route) {
		struct baton_copy ct = { .dst = rt, .src = tab, .bytes = (uint64_t)E * 8 };
		if (cache_lookup(engine_cache(e), all_e, E, tab) != 0 || be->copy_h2d(dev, &ct, 1) != 0 ||
		    be->sync(dev) != 0)
			goto out;
	}
	if (!wq || !wk || !wv || !wo || !nin || !npost || !wr || !wh || !host || !pos || !inv ||
	    K > 64 || be->alloc(dev, n_scr * fl, &scratch) != 0) {
		fprintf(stderr, "baton-model-bench: the decode breakdown needs qwen3_moe-named "
		    "tensors and room on the device: skipped\n");
		goto out;
	}
	const baton_dptr x = scratch, xn = x + D * fl, q = xn + D * fl, ao = q + QD * fl;
	const baton_dptr rl = ao + QD * fl, kc = rl + E * fl, vc = kc + (uint64_t)ctx * KD * fl;
	const baton_dptr lg = vc + (uint64_t)ctx * KD * fl;
	const baton_dptr kraw = lg + (uint64_t)c->vocab * fl, vraw = kraw + (uint64_t)KD * fl;
	for (uint32_t i = 0; i < D; i++)
		host[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
	struct baton_copy cx = { .dst = x, .src = host, .bytes = (uint64_t)D * 4 };
	struct baton_copy cz = { .dst = kc, .src = host, .bytes = (uint64_t)D * 4 };
	if (be->copy_h2d(dev, &cx, 1) != 0 || be->copy_h2d(dev, &cz, 1) != 0 || be->sync(dev) != 0)
		goto out;
	model_rope_inv_freq(c, inv);
	pos[0] = ctx - 1;
	struct baton_attn at = { .q = q, .k = kc, .v = vc, .out = ao, .n_q = 1, .n_heads = c->heads,
		.n_kv_heads = c->kv_heads, .head_dim = c->head_dim, .pos0 = ctx - 1,
		.scale = 1.0f / sqrtf((float)c->head_dim) };
	const baton_dptr kd = kc + (uint64_t)(ctx - 1) * KD * fl, vd = vc + (uint64_t)(ctx - 1) * KD * fl;
	/* the q/k norms and ropes in one call where the backend has it, as forward.c */
	const struct baton_qk_norm_rope nr = { .q = q, .k = kd, .wq = nq, .wk = nk, .wq_dtype = dqn,
		.wk_dtype = dkn, .rows = 1, .heads = c->heads, .kv_heads = c->kv_heads,
		.head_dim = c->head_dim, .eps = c->eps, .mscale = c->rope_mscale, .pos = pos,
		.inv_freq = inv };
	const int fused = nq && nk && be->qk_norm_rope;
	/* with attention where the backend has it, as forward.c: the raw k
	 * and v rows apart, the cache's rows through an identity block table */
	const uint32_t nblk = (ctx + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
	uint32_t slot = ctx - 1;
	btab = calloc(nblk, sizeof *btab);
	for (uint32_t i = 0; btab && i < nblk; i++)
		btab[i] = i;
	const int qkat = fused && be->qk_attention_segs && be->attention_segs && btab;
	const struct baton_qk_norm_rope nra = { .q = q, .k = kraw, .wq = nq, .wk = nk,
		.wq_dtype = dqn, .wk_dtype = dkn, .rows = 1, .heads = c->heads, .kv_heads = c->kv_heads,
		.head_dim = c->head_dim, .eps = c->eps, .mscale = c->rope_mscale, .pos = pos,
		.inv_freq = inv, .v = vraw, .k_cache = kc, .v_cache = vc, .slots = &slot,
		.cache_rows = (uint64_t)ctx };
	const struct baton_attn_seg aseg = { .n_q = 1, .pos0 = ctx - 1, .blocks = btab };
	const struct baton_attn_segs asg = { .q = q, .k = kc, .v = vc, .out = ao, .n_seg = 1,
		.n_heads = c->heads, .n_kv_heads = c->kv_heads, .head_dim = c->head_dim,
		.block_size = BATON_KV_BLOCK, .scale = 1.0f / sqrtf((float)c->head_dim), .segs = &aseg };
	const struct baton_matmuls mma = { .x = xn, .rows = 1, .k = D, .n = 3, .m = {
		{ .w = wq, .y = q, .w_dtype = dq, .n_out = QD },
		{ .w = wk, .y = kraw, .w_dtype = dk, .n_out = KD },
		{ .w = wv, .y = vraw, .w_dtype = dv, .n_out = KD } } };
	/* q, k and v in one call where the backend has it, as forward.c */
	const struct baton_matmuls mm = { .x = xn, .rows = 1, .k = D, .n = 3, .m = {
		{ .w = wq, .y = q, .w_dtype = dq, .n_out = QD },
		{ .w = wk, .y = kd, .w_dtype = dk, .n_out = KD },
		{ .w = wv, .y = vd, .w_dtype = dv, .n_out = KD } } };
	/* the same routed experts every time: this measures the queue, not misses */
	struct baton_moe_layer ml = { .batch = 1, .d_model = D, .d_ff = c->moe_ff, .n_experts = E,
		.top_k = K, .x = x, .xn = xn, .router = wr, .router_dtype = dr };
	struct baton_arena_expert ex;
	struct baton_arena_tensor parts[3];
	if (arena_expert(a, 0, 0, &ex) != 0 || arena_expert_parts(a, 0, 0, parts) != 0)
		goto out;
	ml.gate_off = ex.gate_off, ml.up_off = ex.up_off, ml.down_off = ex.down_off;
	ml.gate_dtype = parts[0].dtype, ml.up_dtype = parts[1].dtype, ml.down_dtype = parts[2].dtype;
	/* the post-norm, router and route in one call where the backend has it, as forward.c */
	const struct baton_router_route rr = { .x = x, .xn = xn, .norm = npost, .w = wr, .logits = rl,
		.ids = dids, .weights = dw, .norm_on = 1, .norm_dtype = dpn, .w_dtype = dr,
		.n_experts = E, .k = D, .rows = 1, .top_k = K, .rule = c->route_rule, .eps = c->eps };
	int rc = 0;
#define ATTN() (qkat ? ATTN_QKA() : ATTN_OLD())
#define ATTN_QKA()                                                                               \
	((be->rmsnorm_matmuls && be->matmuls ?                                                     \
	     (rc = be->rmsnorm_matmuls(dev, x, nin, dn, c->eps, &mma)) != 0 :                      \
	     ((rc = be->rmsnorm(dev, x, xn, 1, D, nin, dn, c->eps)) != 0)) ||                      \
	    (be->rmsnorm_matmuls && be->matmuls ? 0 :                                              \
	     be->matmuls ? (rc = be->matmuls(dev, &mma)) != 0 :                                    \
	     ((rc = be->matmul(dev, wq, dq, QD, D, 0, 0, xn, 1, q, 0)) ||                          \
	      (rc = be->matmul(dev, wk, dk, KD, D, 0, 0, xn, 1, kraw, 0)) ||                       \
	      (rc = be->matmul(dev, wv, dv, KD, D, 0, 0, xn, 1, vraw, 0)))) ||                     \
	    (rc = be->qk_attention_segs(dev, &nra, &asg)) ||                                       \
	    (rc = be->matmul(dev, wo, dO, D, QD, 0, 0, ao, 1, x, 1)))
#define ATTN_OLD()                                                                               \
	((rc = be->rmsnorm(dev, x, xn, 1, D, nin, dn, c->eps)) ||                                  \
	    (be->matmuls ? (rc = be->matmuls(dev, &mm)) != 0 :                                     \
	     ((rc = be->matmul(dev, wq, dq, QD, D, 0, 0, xn, 1, q, 0)) ||                          \
	      (rc = be->matmul(dev, wk, dk, KD, D, 0, 0, xn, 1, kd, 0)) ||                         \
	      (rc = be->matmul(dev, wv, dv, KD, D, 0, 0, xn, 1, vd, 0)))) ||                       \
	    (fused ? (rc = be->qk_norm_rope(dev, &nr)) != 0 :                                      \
	     ((nq && (rc = be->rmsnorm(dev, q, q, c->heads, c->head_dim, nq, dqn, c->eps))) ||     \
	      (nk && (rc = be->rmsnorm(dev, kd, kd, c->kv_heads, c->head_dim, nk, dkn, c->eps))) ||\
	      (rc = be->rope(dev, q, 1, c->heads, c->head_dim, pos, inv, c->rope_mscale)) ||       \
	      (rc = be->rope(dev, kd, 1, c->kv_heads, c->head_dim, pos, inv, c->rope_mscale)))) || \
	    (rc = be->attention(dev, &at)) ||                                                      \
	    (rc = be->matmul(dev, wo, dO, D, QD, 0, 0, ao, 1, x, 1)))
#define ROUTE()                                                                                  \
	(r.dev_route && be->router_route_dev ? (rc = be->router_route_dev(dev, &rr)) != 0 :        \
	    ((rc = be->rmsnorm(dev, x, xn, 1, D, npost, dpn, c->eps)) ||                           \
	        (rc = be->matmul(dev, wr, dr, E, D, 0, 0, xn, 1, rl, 0)) ||                        \
	        (rc = r.dev_route ? be->route_dev(dev, rl, 1, E, K, c->route_rule, dids, dw)       \
	                          : be->route(dev, rl, 1, E, K, c->route_rule, ids, w))))
#define EXPERTS()                                                                                \
	(r.dev_route ? (rc = be->moe_experts_dev(dev, &ml, rt, dids, dw)) != 0                     \
	             : ((rc = cache_lookup(engine_cache(e), want, K, blobs)) ||                   \
	                   (rc = be->moe_experts(dev, &ml, blobs, w))))
	if ((rc = be->rmsnorm(dev, x, xn, 1, D, npost, dpn, c->eps)) ||
	    (rc = be->matmul(dev, wr, dr, E, D, 0, 0, xn, 1, rl, 0)) ||
	    (rc = be->route(dev, rl, 1, E, K, c->route_rule, ids, w)) ||
	    (r.dev_route && (ROUTE() || (rc = be->sync(dev)))))
		goto fail;
	for (uint32_t i = 0; i < K; i++)
		want[i] = ids[i]; /* layer 0's items are its expert ids */
	double t0 = baton_now_s();
	for (uint32_t i = 0; i < reps; i++)
		if (ATTN() || ROUTE() || EXPERTS())
			goto fail;
	if ((rc = be->sync(dev)))
		goto fail;
	r.layer = (baton_now_s() - t0) / reps;
	t0 = baton_now_s();
	for (uint32_t i = 0; i < reps; i++)
		if (ATTN())
			goto fail;
	if ((rc = be->sync(dev)))
		goto fail;
	r.attn = (baton_now_s() - t0) / reps;
	t0 = baton_now_s();
	for (uint32_t i = 0; i < reps; i++)
		if (ROUTE())
			goto fail;
	if ((rc = be->sync(dev)))
		goto fail;
	r.route = (baton_now_s() - t0) / reps;
	for (uint32_t i = 0; i < K; i++)
		want[i] = ids[i];
	t0 = baton_now_s();
	for (uint32_t i = 0; i < reps; i++)
		if (EXPERTS())
			goto fail;
	if ((rc = be->sync(dev)))
		goto fail;
	r.experts = (baton_now_s() - t0) / reps;
	t0 = baton_now_s();
	for (uint32_t i = 0; i < reps; i++)
		if ((rc = be->rmsnorm(dev, x, xn, 1, D, npost, dpn, c->eps)) ||
		    (rc = be->matmul(dev, wh, dh, c->vocab, D, 0, 0, xn, 1, lg, 0)) ||
		    (rc = be->copy_d2h(dev, host + D, lg, (uint64_t)c->vocab * 4)))
			goto fail;
	r.head = (baton_now_s() - t0) / reps;
	t0 = baton_now_s();
	for (uint32_t i = 0; i < 10 * reps; i++)
		if ((rc = be->add(dev, rl, rl + 4, 0, 1, 1)))
			goto fail;
	if ((rc = be->sync(dev)))
		goto fail;
	r.launch = (baton_now_s() - t0) / (10 * reps);
	r.ok = 1;
#undef ATTN
#undef ATTN_QKA
#undef ATTN_OLD
#undef ROUTE
#undef EXPERTS
fail:
	if (!r.ok)
		fprintf(stderr, "baton-model-bench: the decode breakdown failed: %s\n", baton_strerror(rc));
out:
	{
		baton_dptr all[] = { wq, wk, wv, wo, nin, npost, nq, nk, wr, wh, scratch, rt };
		for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
			if (all[i])
				be->free(dev, all[i]);
	}
	free(host);
	free(pos);
	free(inv);
	free(tab);
	free(all_e);
	free(btab);
	return r;
}

/* --perplexity: the text of `file` through the arena's tokenizer, then
 * model_perplexity. */
static int perplexity_main(struct baton_engine_config *cfg, const char *file, uint32_t ctx,
    uint32_t chunks, uint32_t seqs, uint32_t max_batch, const char *tokpath, const char *json)
{
	char err[512] = "";
	size_t len = 0;
	char *textbuf = NULL;
	FILE *f = fopen(file, "rb");
	if (!f)
		die(file, BATON_EIO, strerror(errno));
	for (;;) {
		char *nb = realloc(textbuf, len + 65536 + 1);
		if (!nb)
			die("malloc", BATON_ENOMEM, NULL);
		textbuf = nb;
		size_t got = fread(textbuf + len, 1, 65536, f);
		len += got;
		if (got < 65536)
			break;
	}
	if (ferror(f))
		die(file, BATON_EIO, strerror(errno));
	fclose(f);
	textbuf[len] = 0;

	struct baton_engine *e;
	int rc = engine_open(cfg, &e, err, sizeof err);
	if (rc)
		die("opening the engine", rc, err);
	text_tok *tok;
	if (tokpath) {
		if ((rc = text_tok_load_file(&tok, tokpath, err, sizeof err)) != 0)
			die(tokpath, rc, err);
	} else if ((rc = text_tok_load_arena(&tok, engine_arena(e), err, sizeof err)) != 0) {
		die("the arena's tokenizer (--tokenizer names one for an arena without)", rc, err);
	}
	int32_t *ids = NULL;
	size_t n = 0;
	/* llama-perplexity: common_tokenize(text, add_special true, parse_special false) */
	if ((rc = text_encode(tok, textbuf, len, TEXT_ADD_SPECIAL | TEXT_NO_SPECIAL, &ids, &n, err,
	    sizeof err)) != 0)
		die(file, rc, err);
	/* with special tokens' text as text, a BOS first is the tokenizer's own */
	const int32_t bos = n && text_bos(tok) >= 0 && ids[0] == text_bos(tok) ? text_bos(tok) : -1;
	uint32_t *toks = malloc((n ? n : 1) * sizeof *toks);
	if (!toks)
		die("malloc", BATON_ENOMEM, NULL);
	for (size_t i = 0; i < n; i++)
		toks[i] = (uint32_t)ids[i];
	free(ids);
	size_t n_chunks = n / ctx;
	if (chunks && n_chunks > chunks)
		n_chunks = chunks;
	if (seqs > n_chunks && n_chunks)
		seqs = (uint32_t)n_chunks;
	struct baton_model_opts mo = { .max_ctx = ctx, .max_batch = max_batch,
		.kv_blocks = seqs * ((ctx + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK) };
	struct baton_model *m;
	if ((rc = model_open(e, &mo, &m, err, sizeof err)) != 0)
		die("opening the model", rc, err);
	struct baton_engine_info info;
	engine_info(e, &info);
	const double t0 = baton_now_s();
	struct baton_ppl r;
	if ((rc = model_perplexity(m, toks, n, ctx, bos, chunks, seqs, &r, err, sizeof err)) != 0)
		die("perplexity", rc, err);
	const double secs = baton_now_s() - t0;
	printf("baton-model-bench: backend %s, arena %s, text %s (%zu bytes, %zu tokens%s)\n",
	    info.backend, cfg->arena_path, file, len, n, bos >= 0 ? ", BOS added" : "");
	printf("perplexity: %.4f +/- %.5f over %u chunks of %u (%llu tokens scored, %.2f s)\n", r.ppl,
	    r.ppl_err, r.chunks, r.ctx, (unsigned long long)r.scored, secs);
	if (json) {
		FILE *jf = fopen(json, "w");
		if (!jf)
			die(json, BATON_EIO, strerror(errno));
		fprintf(jf, "{\"ppl\": %.6f, \"ppl_err\": %.6f, \"nll\": %.8f, \"chunks\": %u, "
		    "\"ctx\": %u, \"scored\": %llu, \"tokens\": %zu, \"bos\": %d, \"backend\": \"%s\", "
		    "\"seconds\": %.3f}\n", r.ppl, r.ppl_err, r.nll, r.chunks, r.ctx,
		    (unsigned long long)r.scored, n, bos, info.backend, secs);
		if (fclose(jf))
			die(json, BATON_EIO, strerror(errno));
	}
	model_close(m);
	text_tok_free(tok);
	engine_close(e);
	free(toks);
	free(textbuf);
	return 0;
}

int main(int argc, char **argv)
{
	struct baton_engine_config cfg = { .name = "model-bench", .backend = "auto", .warm = 1 };
	/* passes of 512 rows unless --max-batch says otherwise: llama.cpp's
	 * ubatch, what llama-bench's pp512 / pp2048 read a prompt in (the
	 * engine's own default is 256) */
	uint64_t steps = 64, first_n = 32, max_batch = 512, seed = 1, bw_mib = 2048;
	uint32_t prompts[MAX_PROMPTS] = { 512, 2048 }, n_prompts = 2;
	const char *json = NULL, *ppl_file = NULL, *ppl_tok = NULL;
	uint64_t ppl_ctx = 512, ppl_chunks = 0, ppl_seqs = 64;
	enum { O_ARENA = 1, O_BACKEND, O_DEVICE, O_STEPS, O_PROMPTS, O_FIRST, O_MAXB, O_SEED,
	       O_BW, O_JSON, O_PPL, O_CTX, O_CHUNKS, O_SEQS, O_TOK, O_HELP, O_VERSION };
	static const char usage[] =
	    "usage: baton-model-bench --arena PATH [--backend cuda|host|auto] [--device N]\n"
	    "                         [--steps N] [--prompts N,N,...] [--first-prompt N]\n"
	    "                         [--max-batch N] [--seed N] [--bandwidth-mib N] [--json FILE]\n"
	    "                         [--help] [--version]\n"
	    "       baton-model-bench --arena PATH --perplexity FILE [--ctx N] [--chunks N]\n"
	    "                         [--seqs N] [--tokenizer FILE] [--backend cuda|host|auto]\n"
	    "                         [--device N] [--json FILE]\n"
	    "Decode tokens/s at batch 1 against the memory roofline, prefill tokens/s,\n"
	    "and the first token after a release, for a model arena on one device;\n"
	    "or (--perplexity) the perplexity over a text file as llama.cpp's\n"
	    "llama-perplexity measures it.\n";
	static const struct option opts[] = {
		{ "arena", required_argument, 0, O_ARENA },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "device", required_argument, 0, O_DEVICE },
		{ "steps", required_argument, 0, O_STEPS },
		{ "prompts", required_argument, 0, O_PROMPTS },
		{ "first-prompt", required_argument, 0, O_FIRST },
		{ "max-batch", required_argument, 0, O_MAXB },
		{ "seed", required_argument, 0, O_SEED },
		{ "bandwidth-mib", required_argument, 0, O_BW },
		{ "json", required_argument, 0, O_JSON },
		{ "perplexity", required_argument, 0, O_PPL },
		{ "ctx", required_argument, 0, O_CTX },
		{ "chunks", required_argument, 0, O_CHUNKS },
		{ "seqs", required_argument, 0, O_SEQS },
		{ "tokenizer", required_argument, 0, O_TOK },
		{ "help", no_argument, 0, O_HELP },
		{ "version", no_argument, 0, O_VERSION },
		{ 0, 0, 0, 0 },
	};
	int o;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case O_ARENA: cfg.arena_path = optarg; break;
		case O_BACKEND: cfg.backend = optarg; break;
		case O_DEVICE: cfg.device = (int)parse_u64("--device", optarg, 0, 1024); break;
		case O_STEPS: steps = parse_u64("--steps", optarg, 1, 100000); break;
		case O_FIRST: first_n = parse_u64("--first-prompt", optarg, 1, 1u << 20); break;
		case O_MAXB: max_batch = parse_u64("--max-batch", optarg, 1, 1u << 16); break;
		case O_SEED: seed = parse_u64("--seed", optarg, 0, UINT64_MAX); break;
		case O_BW: bw_mib = parse_u64("--bandwidth-mib", optarg, 1, 1u << 20); break;
		case O_PROMPTS: {
			char buf[256], *save = NULL;
			snprintf(buf, sizeof buf, "%s", optarg);
			n_prompts = 0;
			for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
				if (n_prompts == MAX_PROMPTS) {
					fprintf(stderr, "baton-model-bench: --prompts: at most %d lengths\n",
					    MAX_PROMPTS);
					return 2;
				}
				prompts[n_prompts++] = (uint32_t)parse_u64("--prompts", t, 1, 1u << 20);
			}
			if (!n_prompts) {
				fprintf(stderr, "baton-model-bench: --prompts wants lengths like 512,2048\n");
				return 2;
			}
			break;
		}
		case O_JSON: json = optarg; break;
		case O_PPL: ppl_file = optarg; break;
		case O_CTX: ppl_ctx = parse_u64("--ctx", optarg, 4, 1u << 20); break;
		case O_CHUNKS: ppl_chunks = parse_u64("--chunks", optarg, 0, 1u << 24); break;
		case O_SEQS: ppl_seqs = parse_u64("--seqs", optarg, 1, 4096); break;
		case O_TOK: ppl_tok = optarg; break;
		case O_HELP: fputs(usage, stdout); return 0;
		case O_VERSION: printf("baton-model-bench %s\n", BATON_VERSION); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!cfg.arena_path || optind != argc) {
		fputs(usage, stderr);
		return 2;
	}
	if (ppl_file)
		return perplexity_main(&cfg, ppl_file, (uint32_t)ppl_ctx, (uint32_t)ppl_chunks,
		    (uint32_t)ppl_seqs, (uint32_t)max_batch, ppl_tok, json);
	g_rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;

	/* the engine with every expert in its cache, then the model */
	char err[512] = "";
	double t0 = baton_now_s();
	struct baton_engine *e;
	int rc = engine_open(&cfg, &e, err, sizeof err);
	if (rc)
		die("opening the engine", rc, err);
	const double open_s = baton_now_s() - t0;
	struct baton_engine_info info;
	engine_info(e, &info);
	t0 = baton_now_s();
	uint32_t max_prompt = first_n > 32 ? (uint32_t)first_n : 32; /* 32: the decode prompt */
	for (uint32_t i = 0; i < n_prompts; i++)
		if (prompts[i] > max_prompt)
			max_prompt = prompts[i];
	struct baton_model_opts mo = { .max_ctx = 0, .max_batch = (uint32_t)max_batch };
	struct baton_model *m;
	if ((rc = model_open(e, &mo, &m, err, sizeof err)) != 0)
		die("opening the model", rc, err);
	const double model_open_s = baton_now_s() - t0;
	const struct baton_model_config *c = model_config(m);
	const uint32_t ctx = model_max_ctx(m), dec_prompt = 32;
	if (max_prompt > ctx || dec_prompt + steps + 8 > ctx)
		die("sizes", BATON_ERANGE, "a prompt, or 32 + --steps + 8, exceeds the model's context");
	if (info.cache.state != BATON_CACHE_READY)
		fprintf(stderr, "baton-model-bench: warning: the expert cache is %s (not every expert "
		    "fits the device): decode loads misses\n", cache_state_name(info.cache.state));

	const struct baton_backend *be = engine_backend(e);
	struct baton_dev *dev = engine_dev(e);
	const struct baton_arena *ar = engine_arena(e);
	uint64_t bw_bytes = 0;
	const double bw = measure_bandwidth(be, dev, bw_mib * BATON_MIB, &bw_bytes);
	const uint64_t blob = info.model_bytes / ((uint64_t)info.layers * info.experts);
	uint64_t dense_read = 0;
	const uint64_t w_bytes = step_weight_bytes(ar, c, blob, &dense_read);

	/* pinned, as the scheduler's: a pageable buffer makes each step's
	 * logits copy a staged one, and llama.cpp's output buffer is pinned */
	float *logits = model_logits_alloc(m, (uint64_t)c->vocab * sizeof *logits);
	uint32_t *toks = malloc((size_t)max_prompt * sizeof *toks);
	if (!logits || !toks)
		die("malloc", BATON_ENOMEM, NULL);
	for (uint32_t i = 0; i < max_prompt; i++)
		toks[i] = rnd(c->vocab);

	printf("baton-model-bench: backend %s, device %s, arena %s\n", info.backend, info.gpu,
	    cfg.arena_path);
	printf("  model: %s, %u layers, %u experts top-%u, hidden %u, expert ffn %u, %u/%u heads of "
	    "%u, vocab %u; experts %.2f GiB, dense %.2f GiB on the device\n", c->arch->name,
	    c->layers, c->n_experts, c->top_k, c->hidden, c->moe_ff, c->heads, c->kv_heads,
	    c->head_dim, c->vocab, (double)info.model_bytes / BATON_GIB,
	    (double)model_dense_bytes(m) / BATON_GIB);
	fflush(stdout);

	/* decode at batch 1: a short prompt, 8 warm steps, then the timed ones */
	const struct baton_sample_params gp = { .temperature = 0, .top_p = 1.0f,
		.repetition_penalty = 1.0f };
	struct baton_sampler *smp;
	if ((rc = baton_sampler_new(&gp, c->vocab, &smp, err, sizeof err)) != 0)
		die("the greedy sampler", rc, err);
	if ((rc = model_prefill(m, toks, dec_prompt, logits)) != 0)
		die("prefill", rc, NULL);
	uint32_t tok = pick(smp, logits);
	/* FNV-1a of the greedy ids: two runs (or two paths) compare by it */
	uint64_t greedy = 0xcbf29ce484222325ull;
	for (int i = 0; i < 8; i++) {
		if ((rc = model_decode(m, tok, logits)) != 0)
			die("decode", rc, NULL);
		tok = pick(smp, logits);
		greedy = (greedy ^ tok) * 0x100000001b3ull;
	}
	/* Two clocks: the engine step alone (the token in, the logits in host
	 * memory: what llama-bench's tg times, which samples nothing), and
	 * the step with the host's greedy pick (the engine's sampler). */
	const uint32_t pos_start = model_pos(m);
	double step_s = 0;
	t0 = baton_now_s();
	for (uint64_t i = 0; i < steps; i++) {
		const double s0 = baton_now_s();
		if ((rc = model_decode(m, tok, logits)) != 0)
			die("decode", rc, NULL);
		step_s += baton_now_s() - s0;
		tok = pick(smp, logits);
		greedy = (greedy ^ tok) * 0x100000001b3ull;
	}
	const double greedy_s = (baton_now_s() - t0) / (double)steps;
	const double dec_s = step_s / (double)steps;
	baton_sampler_free(smp);
	/* KV read per step: keys and values of every position so far, f32 */
	const double kv_avg = (double)c->layers * 2 * c->kv_heads * c->head_dim * 4 *
	    (pos_start + (double)steps / 2 + 1);
	const double step_bytes = (double)w_bytes + kv_avg;
	const double roofline_s = step_bytes / (bw * 1e9);
	const double dec_tps = 1.0 / dec_s, ratio = roofline_s / dec_s;

	const struct parts pt = decode_parts(e, c, model_pos(m));

	/* prefill: each length once untimed, then timed (llama-bench's
	 * warm-up run): the first pass of a shape pays the scratch's growth
	 * and cuBLAS's first calls of its kernels */
	double pf_tps[MAX_PROMPTS];
	for (uint32_t i = 0; i < n_prompts; i++) {
		model_reset(m);
		if ((rc = model_prefill(m, toks, prompts[i], logits)) != 0)
			die("prefill", rc, NULL);
		model_reset(m);
		t0 = baton_now_s();
		if ((rc = model_prefill(m, toks, prompts[i], logits)) != 0)
			die("prefill", rc, NULL);
		pf_tps[i] = prompts[i] / (baton_now_s() - t0);
	}

	/* first token after a release of everything: hot-first, then full */
	struct baton_cache_report r, rr;
	model_reset(m);
	if ((rc = model_release(m)) != 0 || (rc = engine_release(e, &r)) != 0)
		die("release", rc, NULL);
	t0 = baton_now_s();
	if ((rc = model_prefill(m, toks, (uint32_t)first_n, logits)) != 0)
		die("prefill after release", rc, NULL);
	const double hot_s = baton_now_s() - t0;
	struct baton_cache_stats st;
	cache_stats(engine_cache(e), &st);
	const uint64_t hot_loaded = (uint64_t)st.items_resident * blob;
	if ((rc = engine_refill(e, &rr)) != 0)
		die("refill", rc, NULL);
	model_reset(m);
	if ((rc = model_release(m)) != 0 || (rc = engine_release(e, &r)) != 0)
		die("release", rc, NULL);
	t0 = baton_now_s();
	if ((rc = engine_refill(e, &rr)) != 0)
		die("refill", rc, NULL);
	const double refill_s = baton_now_s() - t0;
	if ((rc = model_refill(m)) != 0)
		die("model refill", rc, NULL);
	const double dense_s = baton_now_s() - t0 - refill_s;
	if ((rc = model_prefill(m, toks, (uint32_t)first_n, logits)) != 0)
		die("prefill after refill", rc, NULL);
	const double full_s = baton_now_s() - t0;

	printf("\n  %-50s %14s %10s %s\n", "figure", "value", "ratio", "target");
	printf("  %-50s %9.1f GB/s %10s\n", "device memory bandwidth (d2d copy, read+write)", bw,
	    "1.00");
	printf("  %-50s %9.3f GB\n", "bytes read per decode token (weights + KV)", step_bytes / 1e9);
	printf("  %-50s %9.3f GB\n", "  of them dense (attention, routers, norms, head)",
	    (double)dense_read / 1e9);
	printf("  %-50s %9.3f GB\n", "  top-k experts, all layers",
	    (double)c->layers * c->top_k * blob / 1e9);
	printf("  %-50s %9.1f tok/s %10.3f >= 0.5\n", "decode, batch 1 (vs memory roofline)", dec_tps,
	    ratio);
	printf("  %-50s %9.3f ms\n", "  per token (the engine step, as llama-bench's tg)",
	    dec_s * 1e3);
	printf("  %-50s %9.1f tok/s (%.3f ms)\n", "  with the host's greedy pick each step",
	    1.0 / greedy_s, greedy_s * 1e3);
	printf("  %-50s %016" PRIx64 "\n", "  greedy ids (FNV-1a, the warm and timed steps)", greedy);
	printf("  %-50s %9llu of %llu\n", "  passes queued as one CUDA graph",
	    (unsigned long long)model_graph_passes(m),
	    (unsigned long long)model_device_route_passes(m));
	printf("  %-50s %9llu\n", "    of them a recording replayed",
	    (unsigned long long)model_graph_replays(m));
	printf("  %-50s %9.3f ms\n", "  roofline per token", roofline_s * 1e3);
	if (pt.ok) {
		printf("  %-50s %9.1f us\n", "  one layer's ops, queued as forward.c queues them",
		    pt.layer * 1e6);
		printf("  %-50s %9.1f us\n", "    attention block (as forward.c queues it)", pt.attn * 1e6);
		printf("  %-50s %9.1f us\n", pt.dev_route ? "    router and route (on the device)" :
		    "    router and route (waits for the device)", pt.route * 1e6);
		printf("  %-50s %9.1f us\n", pt.dev_route ? "    experts (blobs from the device table)" :
		    "    expert lookup and experts", pt.experts * 1e6);
		printf("  %-50s %9.1f us\n", "  head and logits copy", pt.head * 1e6);
		printf("  %-50s %9.1f us\n", "  layers x layer + head", (c->layers * pt.layer +
		    pt.head) * 1e6);
		printf("  %-50s %9.2f us\n", "  one launch of a one-block op, queued", pt.launch * 1e6);
	}
	for (uint32_t i = 0; i < n_prompts; i++) {
		char name[64];
		snprintf(name, sizeof name, "prefill, %u-token prompt", prompts[i]);
		printf("  %-50s %9.1f tok/s\n", name, pf_tps[i]);
	}
	char name[96];
	snprintf(name, sizeof name, "first token after release, hot-first (%u tokens)",
	    (unsigned)first_n);
	printf("  %-50s %9.3f ms %10.3f\n", name, hot_s * 1e3, full_s > 0 ? hot_s / full_s : 0);
	printf("  %-50s %9.3f GiB\n", "  experts it loaded", (double)hot_loaded / BATON_GIB);
	printf("  %-50s %9.3f ms %10s\n", "full refill + model refill + the same prefill",
	    full_s * 1e3, "1.00");
	printf("  %-50s %9.3f ms (%.1f GB/s)\n", "  of it the expert refill", refill_s * 1e3,
	    refill_s > 0 ? (double)rr.bytes_copied / refill_s / 1e9 : 0);
	printf("  %-50s %9.3f ms\n", "  of it the dense upload", dense_s * 1e3);
	printf("  %-50s %9.3f s\n", "engine open (pin + warm cache)", open_s);
	printf("  %-50s %9.3f s\n", "model open (dense upload)", model_open_s);
	fflush(stdout);

	if (json) {
		FILE *f = fopen(json, "w");
		if (!f)
			die(json, BATON_EIO, strerror(errno));
		fprintf(f, "{\"backend\":\"%s\",\"device\":\"%s\",\"arch\":\"%s\",\"layers\":%u,"
		    "\"experts\":%u,\"top_k\":%u,\"hidden\":%u,\"vocab\":%u,\"dtype\":\"%s\","
		    "\"bandwidth_gbps\":%.3f,\"bandwidth_bytes\":%" PRIu64 ",\"step_bytes\":%.0f,"
		    "\"decode_tok_s\":%.3f,\"decode_ms\":%.4f,\"decode_greedy_tok_s\":%.3f,"
		    "\"roofline_ms\":%.4f,\"roofline_ratio\":%.4f,\"prefill\":[", info.backend,
		    info.gpu, c->arch->name, c->layers, c->n_experts, c->top_k, c->hidden, c->vocab,
		    baton_dtype_name((int)arena_shape(ar)->gate_dtype), bw, bw_bytes, step_bytes,
		    dec_tps, dec_s * 1e3, 1.0 / greedy_s, roofline_s * 1e3, ratio);
		for (uint32_t i = 0; i < n_prompts; i++)
			fprintf(f, "%s{\"tokens\":%u,\"tok_s\":%.3f}", i ? "," : "", prompts[i], pf_tps[i]);
		fprintf(f, "],\"layer_us\":%.2f,\"attn_us\":%.2f,\"route_us\":%.2f,"
		    "\"experts_us\":%.2f,\"head_us\":%.2f,\"launch_us\":%.3f,\"device_route\":%s",
		    pt.layer * 1e6, pt.attn * 1e6, pt.route * 1e6, pt.experts * 1e6, pt.head * 1e6,
		    pt.launch * 1e6, pt.dev_route ? "true" : "false");
		fprintf(f, ",\"first_prompt\":%u,\"first_hot_ms\":%.4f,\"first_full_ms\":%.4f,"
		    "\"first_ratio\":%.4f,\"hot_loaded_bytes\":%" PRIu64 ",\"refill_ms\":%.4f,"
		    "\"refill_bytes\":%" PRIu64 ",\"dense_upload_ms\":%.4f,\"engine_open_s\":%.3f,"
		    "\"model_open_s\":%.3f,\"greedy_fnv\":\"%016" PRIx64 "\"}\n",
		    (unsigned)first_n, hot_s * 1e3, full_s * 1e3, full_s > 0 ? hot_s / full_s : 0,
		    hot_loaded, refill_s * 1e3, rr.bytes_copied, dense_s * 1e3, open_s, model_open_s,
		    greedy);
		fclose(f);
	}
	model_logits_free(m, logits);
	free(toks);
	model_close(m);
	engine_close(e);
	return 0;
}
