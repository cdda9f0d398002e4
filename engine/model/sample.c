/*
 * sample.c: the sampler of model.h. The steps and their order are written
 * there and in docs/reference/sampling.md; this file keeps them cheap on large
 * vocabularies (151,936 for Qwen3): penalties touch only the tokens seen,
 * top-k keeps a heap of k, and top-p sorts only the tokens that could
 * survive it (those with probability above (1 - p) / n; the rest always
 * fall in the dropped tail).
 *
 * Deterministic: the same parameters, prompt and logits give the same
 * tokens on every run (the PRNG is the sampler's own, xoshiro256**, seeded
 * through splitmix64; every order that matters is a total order, ties by
 * token id). Probabilities are accumulated in double.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "proto/proto.h"

enum { SEEN = 1, IN_OUTPUT = 2 };

/* Temperatures below this are greedy, as in vLLM (_SAMPLING_EPS): dividing
 * by them only overflows. */
#define GREEDY_BELOW 1e-5f

struct cand {
	float l;      /* logit after temperature */
	uint32_t id;
};

struct baton_sampler {
	struct baton_sample_params p; /* arrays below, owned */
	uint32_t n_vocab;
	uint32_t *stop;               /* sorted */
	struct baton_logit_bias *bias;
	uint32_t *count;              /* [n_vocab] occurrences in the output */
	uint8_t *flags;               /* [n_vocab] SEEN | IN_OUTPUT */
	uint32_t *seen;               /* distinct tokens of prompt + output */
	uint32_t n_seen;
	uint32_t *outs;               /* distinct tokens of the output */
	uint32_t n_outs;
	struct cand *cand;            /* [n_vocab] scratch */
	double *w;                    /* [n_vocab] scratch: exp(l - max) */
	uint64_t rng[4];
	const uint64_t *mask;         /* baton_sampler_set_mask; NULL: none */
	uint32_t n_out;
	enum baton_finish finish;
};

struct baton_sample_params baton_sample_defaults(void)
{
	struct baton_sample_params p = {
		.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
		.repetition_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
	};
	return p;
}

/* ---- PRNG: xoshiro256** (Blackman and Vigna), seeded by splitmix64 -------- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro(uint64_t s[4])
{
	const uint64_t result = rotl(s[1] * 5, 7) * 9;
	const uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

/* ---- set-up ------------------------------------------------------------------ */

static int fail(char *errbuf, size_t errlen, const char *msg)
{
	if (errbuf && errlen)
		snprintf(errbuf, errlen, "%s", msg);
	return BATON_EINVAL;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static int check_params(const struct baton_sample_params *p, uint32_t n_vocab, char *errbuf,
    size_t errlen)
{
	char msg[160];

	if (!p)
		return fail(errbuf, errlen, "no sampling parameters");
	if (n_vocab == 0)
		return fail(errbuf, errlen, "the vocabulary is empty");
	if (!(p->temperature >= 0.0f) || isinf(p->temperature))
		return fail(errbuf, errlen, "temperature must be a number >= 0 (0: greedy)");
	if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
		return fail(errbuf, errlen, "top_p must be in (0, 1] (1: off)");
	if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
		return fail(errbuf, errlen, "min_p must be in [0, 1] (0: off)");
	if (!(p->repetition_penalty > 0.0f) || isinf(p->repetition_penalty))
		return fail(errbuf, errlen, "repetition_penalty must be a number > 0 (1: off)");
	if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
		return fail(errbuf, errlen, "presence_penalty must be in [-2, 2] (0: off)");
	if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
		return fail(errbuf, errlen, "frequency_penalty must be in [-2, 2] (0: off)");
	if ((p->n_stop_ids && !p->stop_ids) || (p->n_bias && !p->bias))
		return fail(errbuf, errlen, "a stop_ids or bias count without its array");
	for (uint32_t i = 0; i < p->n_stop_ids; i++)
		if (p->stop_ids[i] >= n_vocab) {
			snprintf(msg, sizeof msg, "stop token id %u is not in the vocabulary of %u",
			    p->stop_ids[i], n_vocab);
			return fail(errbuf, errlen, msg);
		}
	for (uint32_t i = 0; i < p->n_bias; i++) {
		if (p->bias[i].token >= n_vocab) {
			snprintf(msg, sizeof msg, "logit bias token %u is not in the vocabulary of %u",
			    p->bias[i].token, n_vocab);
			return fail(errbuf, errlen, msg);
		}
		if (!isfinite(p->bias[i].bias)) {
			snprintf(msg, sizeof msg, "logit bias of token %u is not a finite number",
			    p->bias[i].token);
			return fail(errbuf, errlen, msg);
		}
	}
	return 0;
}

int baton_sampler_new(const struct baton_sample_params *p, uint32_t n_vocab,
    struct baton_sampler **out, char *errbuf, size_t errlen)
{
	if (!out)
		return fail(errbuf, errlen, "no place for the sampler");
	*out = NULL;
	int rc = check_params(p, n_vocab, errbuf, errlen);
	if (rc)
		return rc;

	struct baton_sampler *s = calloc(1, sizeof *s);
	if (!s)
		goto nomem;
	s->p = *p;
	s->n_vocab = n_vocab;
	s->count = calloc(n_vocab, sizeof *s->count);
	s->flags = calloc(n_vocab, 1);
	s->seen = malloc((size_t)n_vocab * sizeof *s->seen);
	s->outs = malloc((size_t)n_vocab * sizeof *s->outs);
	s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
	s->w = malloc((size_t)n_vocab * sizeof *s->w);
	s->stop = malloc(((size_t)p->n_stop_ids + 1) * sizeof *s->stop);
	s->bias = malloc(((size_t)p->n_bias + 1) * sizeof *s->bias);
	if (!s->count || !s->flags || !s->seen || !s->outs || !s->cand || !s->w || !s->stop ||
	    !s->bias)
		goto nomem;
	if (p->n_stop_ids)
		memcpy(s->stop, p->stop_ids, (size_t)p->n_stop_ids * sizeof *s->stop);
	qsort(s->stop, p->n_stop_ids, sizeof *s->stop, cmp_u32);
	if (p->n_bias)
		memcpy(s->bias, p->bias, (size_t)p->n_bias * sizeof *s->bias);
	s->p.stop_ids = s->stop;
	s->p.bias = s->bias;
	uint64_t x = p->seed;
	for (int i = 0; i < 4; i++)
		s->rng[i] = splitmix64(&x);
	*out = s;
	return 0;

nomem:
	baton_sampler_free(s);
	if (errbuf && errlen)
		snprintf(errbuf, errlen, "out of memory for a sampler over %u tokens", n_vocab);
	return BATON_ENOMEM;
}

void baton_sampler_free(struct baton_sampler *s)
{
	if (!s)
		return;
	free(s->count);
	free(s->flags);
	free(s->seen);
	free(s->outs);
	free(s->cand);
	free(s->w);
	free(s->stop);
	free(s->bias);
	free(s);
}

static void note_seen(struct baton_sampler *s, uint32_t t)
{
	if (!(s->flags[t] & SEEN)) {
		s->flags[t] |= SEEN;
		s->seen[s->n_seen++] = t;
	}
}

int baton_sampler_prompt(struct baton_sampler *s, const uint32_t *ids, size_t n)
{
	if (!s || (n && !ids))
		return BATON_EINVAL;
	if (s->n_out)
		return BATON_ESTATE;
	for (size_t i = 0; i < n; i++)
		if (ids[i] >= s->n_vocab)
			return BATON_EINVAL;
	for (size_t i = 0; i < n; i++)
		note_seen(s, ids[i]);
	return 0;
}

void baton_sampler_set_mask(struct baton_sampler *s, const uint64_t *allow)
{
	s->mask = allow;
}

/* ---- the steps ------------------------------------------------------------- */

/* Steps 1-3 on the logits, in place; NaN becomes -inf first (not for
 * greedy: its scan never picks a NaN, nor a -inf, and what the steps
 * make of a NaN stays NaN, of a -inf stays -inf, so the same token). */
static void penalize(const struct baton_sampler *s, float *l, int greedy)
{
	const struct baton_sample_params *p = &s->p;

	for (uint32_t t = 0; t < s->n_vocab && !greedy; t++)
		if (isnan(l[t]))
			l[t] = -INFINITY;
	if (s->mask)
		for (uint32_t w = 0; w * 64 < s->n_vocab; w++) {
			uint64_t bits = s->mask[w];
			if (bits == ~0ull)
				continue;
			uint32_t end = w * 64 + 64 < s->n_vocab ? w * 64 + 64 : s->n_vocab;
			for (uint32_t t = w * 64; t < end; t++)
				if (!(bits >> (t - w * 64) & 1))
					l[t] = -INFINITY;
		}
	for (uint32_t i = 0; i < p->n_bias; i++)
		l[p->bias[i].token] += p->bias[i].bias;
	if (p->repetition_penalty != 1.0f)
		for (uint32_t i = 0; i < s->n_seen; i++) {
			float v = l[s->seen[i]];
			l[s->seen[i]] = v < 0 ? v * p->repetition_penalty : v / p->repetition_penalty;
		}
	if (p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f)
		for (uint32_t i = 0; i < s->n_outs; i++) {
			uint32_t t = s->outs[i];
			l[t] -= p->frequency_penalty * (float)s->count[t];
			l[t] -= p->presence_penalty;
		}
}

/* Min-heap of logits (ties: the higher id is the smaller), for top-k. */
static inline int cand_less(struct cand a, struct cand b)
{
	return a.l < b.l || (a.l == b.l && a.id > b.id);
}

static void heap_down(struct cand *h, uint32_t n, uint32_t i)
{
	for (;;) {
		uint32_t m = i, a = 2 * i + 1, b = a + 1;
		if (a < n && cand_less(h[a], h[m]))
			m = a;
		if (b < n && cand_less(h[b], h[m]))
			m = b;
		if (m == i)
			return;
		struct cand t = h[i];
		h[i] = h[m], h[m] = t;
		i = m;
	}
}

/* The k-th largest logit of c[0..n) (k < n), c left unchanged. */
static float kth_largest(const struct cand *c, uint32_t n, uint32_t k, struct cand *heap)
{
	for (uint32_t i = 0; i < k; i++)
		heap[i] = c[i];
	for (uint32_t i = k / 2; i-- > 0;)
		heap_down(heap, k, i);
	for (uint32_t i = k; i < n; i++)
		if (cand_less(heap[0], c[i])) {
			heap[0] = c[i];
			heap_down(heap, k, 0);
		}
	return heap[0].l;
}

static int cmp_cand_asc(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return cand_less(*x, *y) ? -1 : cand_less(*y, *x) ? 1 : 0;
}

/* Fills s->w[i] = exp(c[i].l - max) for i < n; returns their sum. */
static double weights(struct baton_sampler *s, const struct cand *c, uint32_t n)
{
	float mx = -INFINITY;
	double sum = 0;

	for (uint32_t i = 0; i < n; i++)
		mx = c[i].l > mx ? c[i].l : mx;
	for (uint32_t i = 0; i < n; i++) {
		s->w[i] = exp((double)c[i].l - (double)mx);
		sum += s->w[i];
	}
	return sum;
}

/* The first id of the largest logit above -inf (NaN never; -0 and +0
 * one value), UINT32_MAX if none: the scan `if (l[t] > best)`'s choice.
 * The largest of each block of 256 first, in 8 interleaved lanes of
 * `x > m ? x : m` (maxps's rule: a NaN never wins), so the compiler can
 * use vector compares; the first block whose largest beats the blocks
 * before it holds the answer, its first value equal to that. One chain
 * of compares over 151,936 logits took 325 us on a loaded 2-core EPYC VM,
 * this 85. */
static uint32_t first_max(const float *l, uint32_t n)
{
	enum { LN = 8, BLK = 256 };
	float bv = -INFINITY;
	uint32_t bb = UINT32_MAX;
	for (uint32_t b0 = 0; b0 < n; b0 += BLK) {
		const uint32_t e = n - b0 < BLK ? n : b0 + BLK;
		float m[LN];
		for (int u = 0; u < LN; u++)
			m[u] = -INFINITY;
		uint32_t t = b0;
		for (; t + LN <= e; t += LN)
			for (int u = 0; u < LN; u++)
				m[u] = l[t + u] > m[u] ? l[t + u] : m[u];
		for (; t < e; t++)
			m[0] = l[t] > m[0] ? l[t] : m[0];
		float mb = m[0];
		for (int u = 1; u < LN; u++)
			mb = m[u] > mb ? m[u] : mb;
		if (mb > bv) {
			bv = mb;
			bb = b0;
		}
	}
	if (bb == UINT32_MAX)
		return UINT32_MAX;
	for (uint32_t t = bb;; t++)
		if (l[t] == bv)
			return t;
}

/* Steps 4-8: the candidates that survive, in s->cand[0..*n), with their
 * weights in s->w and the sum returned in *total. */
static int select_cands(struct baton_sampler *s, float *l, uint32_t *n, double *total)
{
	const struct baton_sample_params *p = &s->p;
	struct cand *c = s->cand;
	uint32_t m = 0;

	const int greedy = p->temperature < GREEDY_BELOW;
	penalize(s, l, greedy);
	if (greedy) {
		const uint32_t best = first_max(l, s->n_vocab);
		if (best == UINT32_MAX)
			return BATON_EINVAL;
		c[0] = (struct cand){ l[best], best };
		s->w[0] = 1.0;
		*n = 1;
		*total = 1.0;
		return 0;
	}
	for (uint32_t t = 0; t < s->n_vocab; t++) {
		float v = l[t] / p->temperature;
		if (v > -INFINITY) /* +inf (huge logits): the largest float, so exp stays defined */
			c[m++] = (struct cand){ v < FLT_MAX ? v : FLT_MAX, t };
	}
	if (m == 0)
		return BATON_EINVAL;

	if (p->top_k && p->top_k < m) {
		/* The heap borrows the tail of s->w's memory (no longer than
		 * k candidates, and w is not in use yet). */
		float kth = kth_largest(c, m, p->top_k, (struct cand *)(void *)s->w);
		uint32_t k = 0;
		for (uint32_t i = 0; i < m; i++)
			if (c[i].l >= kth)
				c[k++] = c[i];
		m = k;
	}

	if (p->top_p < 1.0f && m > 1) {
		double sum = weights(s, c, m), cut = 1.0 - (double)p->top_p;
		double thr = cut / m * sum, low = 0;
		uint32_t h = 0;
		/* Tokens at or below (1 - p) / m of the mass are together at
		 * most 1 - p and the least likely: always dropped. */
		for (uint32_t i = 0; i < m; i++) {
			if (s->w[i] <= thr)
				low += s->w[i];
			else
				c[h++] = c[i];
		}
		qsort(c, h, sizeof *c, cmp_cand_asc);
		double cum = low / sum;
		uint32_t drop = 0;
		weights(s, c, h); /* the same max: the top token is among c */
		while (drop + 1 < h) {
			cum += s->w[drop] / sum;
			if (cum > cut)
				break;
			drop++;
		}
		memmove(c, c + drop, (size_t)(h - drop) * sizeof *c);
		m = h - drop;
	}

	if (p->min_p > 0.0f && m > 1) {
		weights(s, c, m);
		uint32_t k = 0;
		for (uint32_t i = 0; i < m; i++)
			if (s->w[i] >= (double)p->min_p)
				c[k++] = c[i];
		m = k;
	}

	*total = weights(s, c, m);
	*n = m;
	return 0;
}

static int is_stop(const struct baton_sampler *s, uint32_t t)
{
	return bsearch(&t, s->stop, s->p.n_stop_ids, sizeof *s->stop, cmp_u32) != NULL;
}

int baton_sampler_next(struct baton_sampler *s, float *logits, uint32_t *token,
    enum baton_finish *finish)
{
	uint32_t n;
	double total;

	if (!s || !logits || !token)
		return BATON_EINVAL;
	if (s->finish != BATON_FINISH_NONE)
		return BATON_ESTATE;
	int rc = select_cands(s, logits, &n, &total);
	if (rc)
		return rc;

	/* Step 9: u in [0, 1) from the top 53 bits; the first candidate
	 * whose running sum passes u * total. */
	double target = (double)(xoshiro(s->rng) >> 11) * 0x1p-53 * total, cum = 0;
	uint32_t i = 0;
	for (; i + 1 < n; i++) {
		cum += s->w[i];
		if (cum > target)
			break;
	}
	uint32_t t = s->cand[i].id;

	s->count[t]++;
	note_seen(s, t);
	if (!(s->flags[t] & IN_OUTPUT)) {
		s->flags[t] |= IN_OUTPUT;
		s->outs[s->n_outs++] = t;
	}
	s->n_out++;
	if (is_stop(s, t))
		s->finish = BATON_FINISH_STOP;
	else if (s->p.max_tokens && s->n_out >= s->p.max_tokens)
		s->finish = BATON_FINISH_LENGTH;
	*token = t;
	if (finish)
		*finish = s->finish;
	return 0;
}

int baton_sampler_probs(struct baton_sampler *s, float *logits, float *probs)
{
	uint32_t n;
	double total;

	if (!s || !logits || !probs)
		return BATON_EINVAL;
	int rc = select_cands(s, logits, &n, &total);
	if (rc)
		return rc;
	memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
	for (uint32_t i = 0; i < n; i++)
		probs[s->cand[i].id] = (float)(s->w[i] / total);
	return 0;
}

uint32_t baton_sampler_count(const struct baton_sampler *s)
{
	return s ? s->n_out : 0;
}

enum baton_finish baton_sampler_finish(const struct baton_sampler *s)
{
	return s ? s->finish : BATON_FINISH_NONE;
}
