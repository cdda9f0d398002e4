/*
 * perplexity.c: a model's perplexity over a token stream, measured as
 * llama.cpp's llama-perplexity measures it (tools/perplexity/perplexity.cpp,
 * its default path, without --ppl-stride), so the two figures of one GGUF
 * file can be compared:
 *
 *   - the tokens are cut into n / ctx chunks of ctx tokens (the tail that
 *     fills no chunk is left out), at most max_chunks of them;
 *   - each chunk is a fresh sequence; when the tokenizer adds BOS, the
 *     chunk's first token is replaced by BOS (llama.cpp does so for every
 *     chunk, the first one's BOS included);
 *   - only the second half is scored: the logits at positions
 *     first = ctx / 2 .. ctx - 2 against the token that follows, so
 *     ctx - 1 - ctx / 2 tokens a chunk;
 *   - each score is llama.cpp's log_softmax: the largest logit in f32,
 *     the sum of expf(logit - max) in double, nll = -(logit[tok] - max -
 *     log(sum)); ppl = exp(sum of nll / count).
 *
 * The positions of a chunk come from model_step: the first half and one
 * more token as one item (its last logits score position `first`), then
 * one token per step. `seqs` chunks run side by side, one item each per
 * step, so the passes are batched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "proto/base/base.h"

/* llama.cpp's log_softmax, negated: the nll of token tok. */
static double nll_of(const float *logits, uint32_t vocab, uint32_t tok)
{
	float max = logits[0];
	for (uint32_t i = 1; i < vocab; i++)
		max = logits[i] > max ? logits[i] : max;
	double sum = 0.0;
	for (uint32_t i = 0; i < vocab; i++)
		sum += expf(logits[i] - max);
	return -((double)(logits[tok] - max) - log(sum));
}

int model_perplexity(struct baton_model *m, const uint32_t *tokens, size_t n, uint32_t ctx,
    int32_t bos, uint32_t max_chunks, uint32_t seqs, struct baton_ppl *out, char *err,
    size_t errlen)
{
	const struct baton_model_config *c = model_config(m);
	const uint32_t V = c->vocab;
	memset(out, 0, sizeof *out);
	if (!tokens || ctx < 4 || seqs == 0) {
		baton_errf(err, errlen, "perplexity: a context of 4 tokens at least, one sequence at least");
		return BATON_EINVAL;
	}
	if (ctx > model_max_ctx(m)) {
		baton_errf(err, errlen, "perplexity: a context of %u exceeds the model's %u", ctx,
		    model_max_ctx(m));
		return BATON_ERANGE;
	}
	if (n < 2 * (size_t)ctx) { /* llama-perplexity's own rule */
		baton_errf(err, errlen, "perplexity: %zu tokens; a context of %u needs %u at least", n,
		    ctx, 2 * ctx);
		return BATON_EINVAL;
	}
	if (bos >= 0 && (uint32_t)bos >= V) {
		baton_errf(err, errlen, "perplexity: BOS id %d outside the vocabulary of %u", bos, V);
		return BATON_ERANGE;
	}
	for (size_t i = 0; i < n; i++)
		if (tokens[i] >= V) {
			baton_errf(err, errlen, "perplexity: token %zu is id %u, outside the vocabulary of %u",
			    i, tokens[i], V);
			return BATON_ERANGE;
		}
	size_t n_chunks = n / ctx;
	if (max_chunks && n_chunks > max_chunks)
		n_chunks = max_chunks;
	if (seqs > n_chunks)
		seqs = (uint32_t)n_chunks;
	const uint32_t first = ctx / 2;

	struct baton_seq **sq = calloc(seqs, sizeof *sq);
	struct baton_step_item *it = calloc(seqs, sizeof *it);
	uint32_t *head = malloc((size_t)seqs * (first + 1) * sizeof *head);
	float *lg = malloc((size_t)seqs * V * sizeof *lg);
	int rc = 0;
	if (!sq || !it || !head || !lg) {
		rc = BATON_ENOMEM;
		goto done;
	}
	double nll = 0, nll2 = 0;
	uint64_t count = 0;
	for (size_t c0 = 0; c0 < n_chunks && !rc; c0 += seqs) {
		const uint32_t k = (uint32_t)(n_chunks - c0 < seqs ? n_chunks - c0 : seqs);
		for (uint32_t s = 0; s < k; s++) {
			if ((rc = model_seq_open(m, &sq[s])) != 0) {
				baton_errf(err, errlen, "perplexity: a sequence: %s", baton_strerror(rc));
				goto close;
			}
			const uint32_t *ch = tokens + (c0 + s) * ctx;
			uint32_t *h = head + (size_t)s * (first + 1);
			memcpy(h, ch, (first + 1) * sizeof *h);
			if (bos >= 0)
				h[0] = (uint32_t)bos;
			it[s] = (struct baton_step_item){ .seq = sq[s], .tokens = h, .n = first + 1 };
		}
		/* positions first .. ctx - 2: the logits of token p score p + 1 */
		for (uint32_t p = first; p + 1 < ctx; p++) {
			if (p > first)
				for (uint32_t s = 0; s < k; s++) {
					it[s].tokens = tokens + (c0 + s) * ctx + p;
					it[s].n = 1;
				}
			if ((rc = model_step(m, it, k, lg)) != 0) {
				baton_errf(err, errlen, "perplexity: the forward pass of chunk %zu, position %u: %s%s",
				    c0 + 1, p, baton_strerror(rc), rc == BATON_ENOSPC ?
				    " (the KV pool holds fewer than seqs x ctx positions)" : "");
				goto close;
			}
			for (uint32_t s = 0; s < k; s++) {
				const double v = nll_of(lg + (size_t)s * V, V, tokens[(c0 + s) * ctx + p + 1]);
				nll += v;
				nll2 += v * v;
				count++;
			}
		}
close:
		for (uint32_t s = 0; s < k; s++) {
			model_seq_close(m, sq[s]);
			sq[s] = NULL;
		}
	}
	if (!rc) {
		out->chunks = (uint32_t)n_chunks;
		out->ctx = ctx;
		out->scored = count;
		out->nll = nll / (double)count;
		out->ppl = exp(out->nll);
		/* llama-perplexity's "+/-": sqrt(var / (count - 1)) of the nll, times ppl */
		const double var = nll2 / (double)count - out->nll * out->nll;
		out->ppl_err = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) * out->ppl : 0;
	}
done:
	free(sq);
	free(it);
	free(head);
	free(lg);
	return rc;
}
