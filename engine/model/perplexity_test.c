/*
 * perplexity_test.c: model_perplexity (engine/model/perplexity.c), the
 * measure of llama.cpp's llama-perplexity, on the two trained demo models
 * of models/ over the start of the held-out text (models/heldout/), against
 * a figure computed another way: each scored position's logits from a
 * prefill of its own (the chunk's prefix up to it, BOS in front where the
 * tokenizer adds one), its log-softmax in long double, the mean over the
 * second halves of the chunks done here. The step-batched path of
 * model_perplexity (chunks side by side, one token per step) must agree
 * within 1e-6 of the mean nll and score exactly chunks x (ctx - 1 - ctx / 2)
 * tokens; and bad arguments are refused with a sentence.
 * Runs on BATON_MODEL_BACKEND (host by default).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model_fixture.h"
#include "text/text.h"

/* The first `bytes` of the held-out text, tokenized as llama-perplexity
 * tokenizes (BOS when the tokenizer adds one, special text as text). */
static uint32_t *heldout_tokens(struct rig *r, size_t bytes, size_t *n, int32_t *bos)
{
	char path[600], err[256] = "";
	snprintf(path, sizeof path, "%s/heldout/coriolanus.txt", rig_models());
	FILE *f = fopen(path, "rb");
	T_ASSERT_MSG(f, "%s missing", path);
	char *buf = malloc(bytes + 1);
	T_ASSERT(buf);
	size_t got = fread(buf, 1, bytes, f);
	fclose(f);
	T_ASSERT(got == bytes);
	text_tok *t;
	T_ASSERT_MSG(text_tok_load_arena(&t, engine_arena(r->e), err, sizeof err) == 0, "%s", err);
	int32_t *ids;
	T_ASSERT_MSG(text_encode(t, buf, got, TEXT_ADD_SPECIAL | TEXT_NO_SPECIAL, &ids, n, err,
	    sizeof err) == 0, "%s", err);
	*bos = *n && text_bos(t) >= 0 && ids[0] == text_bos(t) ? text_bos(t) : -1;
	uint32_t *u = malloc(*n * sizeof *u);
	T_ASSERT(u);
	for (size_t i = 0; i < *n; i++)
		u[i] = (uint32_t)ids[i];
	free(ids);
	free(buf);
	text_tok_free(t);
	return u;
}

/* -log softmax(logits)[tok] in long double */
static long double ref_nll(const float *lg, uint32_t V, uint32_t tok)
{
	long double mx = lg[0], s = 0;
	for (uint32_t i = 1; i < V; i++)
		if (lg[i] > mx)
			mx = lg[i];
	for (uint32_t i = 0; i < V; i++)
		s += expl((long double)lg[i] - mx);
	return -(((long double)lg[tok] - mx) - logl(s));
}

static void check_model(const char *model, int want_bos)
{
	struct rig r;
	rig_engine(&r, rig_models(), model, model);
	const uint32_t ctx = 32, chunks = 3;
	struct baton_model_opts mo = { .max_ctx = 64, .kv_blocks = 2 * (ctx / BATON_KV_BLOCK) };
	rig_model(&r, &mo);
	size_t n;
	int32_t bos;
	uint32_t *toks = heldout_tokens(&r, 1200, &n, &bos);
	T_ASSERT_MSG((bos >= 0) == want_bos, "%s: BOS %d", model, bos);
	T_ASSERT(n >= (size_t)ctx * (chunks + 1)); /* a tail past the capped chunks */

	/* two chunks side by side, then the third alone */
	struct baton_ppl p;
	char err[256] = "";
	T_ASSERT_MSG(model_perplexity(r.m, toks, n, ctx, bos, chunks, 2, &p, err, sizeof err) == 0,
	    "%s", err);
	T_EQ_INT(p.chunks, chunks);
	T_EQ_INT(p.ctx, ctx);
	T_EQ_INT(p.scored, (uint64_t)chunks * (ctx - 1 - ctx / 2));

	/* the reference: a prefill per scored position */
	float *lg = malloc((size_t)r.V * sizeof *lg);
	uint32_t *pre = malloc(ctx * sizeof *pre);
	T_ASSERT(lg && pre);
	long double sum = 0;
	unsigned count = 0;
	for (uint32_t c = 0; c < chunks; c++)
		for (uint32_t pos = ctx / 2; pos + 1 < ctx; pos++) {
			memcpy(pre, toks + (size_t)c * ctx, (pos + 1) * sizeof *pre);
			if (bos >= 0)
				pre[0] = (uint32_t)bos;
			T_OK(model_prefill(r.m, pre, pos + 1, lg));
			sum += ref_nll(lg, r.V, toks[(size_t)c * ctx + pos + 1]);
			count++;
		}
	model_reset(r.m);
	const double ref = (double)(sum / count);
	printf("  %s: ppl %.4f (nll %.8f), reference nll %.8f, %u tokens, BOS %d\n", model, p.ppl,
	    p.nll, ref, count, bos);
	T_ASSERT_MSG(fabs(p.nll - ref) <= 1e-6 * fmax(1, fabs(ref)), "%s: nll %.9g, reference %.9g",
	    model, p.nll, ref);
	T_ASSERT(fabs(p.ppl - exp(ref)) <= 1e-5 * exp(ref));
	/* one sequence at a time: the same figure */
	struct baton_ppl p1;
	T_OK(model_perplexity(r.m, toks, n, ctx, bos, chunks, 1, &p1, err, sizeof err));
	T_ASSERT_MSG(fabs(p1.nll - p.nll) <= 1e-7 * fmax(1, fabs(p.nll)), "%.9g vs %.9g", p1.nll, p.nll);

	/* refusals, each with a sentence */
	err[0] = 0;
	T_EQ_ERR(model_perplexity(r.m, toks, 2 * ctx - 1, ctx, bos, 0, 1, &p1, err, sizeof err),
	    BATON_EINVAL);
	T_ASSERT(strstr(err, "needs"));
	T_EQ_ERR(model_perplexity(r.m, toks, n, 128, bos, 0, 1, &p1, err, sizeof err), BATON_ERANGE);
	T_EQ_ERR(model_perplexity(r.m, toks, n, 2, bos, 0, 1, &p1, err, sizeof err), BATON_EINVAL);
	const uint32_t keep = toks[5];
	toks[5] = r.V;
	err[0] = 0;
	T_EQ_ERR(model_perplexity(r.m, toks, n, ctx, bos, 0, 1, &p1, err, sizeof err), BATON_ERANGE);
	T_ASSERT(strstr(err, "token 5"));
	toks[5] = keep;
	/* a pool too small for the sequences side by side */
	T_EQ_ERR(model_perplexity(r.m, toks, n, ctx, bos, chunks, 3, &p1, err, sizeof err),
	    BATON_ENOSPC);
	free(lg);
	free(pre);
	free(toks);
	rig_close(&r);
}

static void t_qwen3_moe(void) { check_model("kjv-qwen3-moe", 0); }
static void t_mixtral(void) { check_model("kjv-mixtral", 1); }

T_MAIN(T_CASE_TIMEOUT(t_qwen3_moe, 120), T_CASE_TIMEOUT(t_mixtral, 120))
