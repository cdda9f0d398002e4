/*
 * sample_test.c: the sampler (model.h). Each step on small hand-made
 * logit vectors with exact expectations; the order of the steps; stop ids
 * and max_tokens; repeatability by seed; the sampled frequencies against
 * the distribution (chi-square, fixed seed); top-p on a real-sized
 * vocabulary against a brute-force version of Hugging Face's rule; bad
 * parameters refused with a sentence naming them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/model.h"
#include "proto/proto.h"
#include "tests/t.h"

#define NEAR(got, want)                                                          \
	T_ASSERT_MSG(fabs((double)(got) - (double)(want)) <= 1e-6,               \
	    "%s = %.9g, want %.9g", #got, (double)(got), (double)(want))

static struct baton_sampler *mk(const struct baton_sample_params *p, uint32_t n)
{
	struct baton_sampler *s = NULL;
	char err[200] = "";
	int rc = baton_sampler_new(p, n, &s, err, sizeof err);
	T_ASSERT_MSG(rc == 0 && s, "sampler_new: %d %s", rc, err);
	return s;
}

/* probs for logits l[n] under p (the sampler records nothing). */
static void probs_of(const struct baton_sample_params *p, const float *l, uint32_t n, float *out)
{
	struct baton_sampler *s = mk(p, n);
	float *tmp = malloc(n * sizeof *tmp);
	memcpy(tmp, l, n * sizeof *tmp);
	T_OK(baton_sampler_probs(s, tmp, out));
	free(tmp);
	baton_sampler_free(s);
}

static void t_greedy(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	p.temperature = 0;
	float l[5] = { 1, 3, NAN, 3, 2 }, pr[5];
	probs_of(&p, l, 5, pr);
	T_ASSERT(pr[0] == 0 && pr[1] == 1 && pr[2] == 0 && pr[3] == 0 && pr[4] == 0);

	struct baton_sampler *s = mk(&p, 5);
	uint32_t t;
	enum baton_finish f;
	for (int i = 0; i < 3; i++) {
		float c[5] = { 1, 3, NAN, 3, 2 };
		T_OK(baton_sampler_next(s, c, &t, &f));
		T_EQ_INT(t, 1); /* ties to the lowest id; NaN never wins */
		T_EQ_INT(f, BATON_FINISH_NONE);
	}
	/* A temperature below 1e-5 is greedy too. */
	struct baton_sample_params q = baton_sample_defaults();
	q.temperature = 1e-6f;
	probs_of(&q, l, 5, pr);
	T_ASSERT(pr[1] == 1 && pr[3] == 0);
	/* Infinite logits and overflow under a small temperature: still a
	 * distribution, shared by those that reach the top (3e38 / 1e-4
	 * overflows too). */
	q.temperature = 1e-4f;
	float big[4] = { INFINITY, 3e38f, INFINITY, 1 };
	probs_of(&q, big, 4, pr);
	NEAR(pr[0], 1.0 / 3);
	NEAR(pr[1], 1.0 / 3);
	NEAR(pr[2], 1.0 / 3);
	T_ASSERT(pr[3] == 0);
	float none[5] = { -INFINITY, NAN, -INFINITY, -INFINITY, NAN };
	T_EQ_ERR(baton_sampler_next(s, none, &t, &f), BATON_EINVAL);
	T_EQ_INT(baton_sampler_count(s), 3);
	baton_sampler_free(s);
}

static void t_temperature(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	float l[3] = { 0, logf(2), logf(4) }, pr[3];
	probs_of(&p, l, 3, pr);
	NEAR(pr[0], 1.0 / 7);
	NEAR(pr[1], 2.0 / 7);
	NEAR(pr[2], 4.0 / 7);
	p.temperature = 2; /* logits halved: 1, sqrt 2, 2 */
	probs_of(&p, l, 3, pr);
	double z = 3 + sqrt(2.0);
	NEAR(pr[0], 1 / z);
	NEAR(pr[1], sqrt(2.0) / z);
	NEAR(pr[2], 2 / z);
	p.temperature = 0.5f; /* doubled: 1, 4, 16 */
	probs_of(&p, l, 3, pr);
	NEAR(pr[0], 1.0 / 21);
	NEAR(pr[1], 4.0 / 21);
	NEAR(pr[2], 16.0 / 21);
}

static void t_top_k(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	float l[5] = { 1, 5, 3, 5, 2 }, pr[5];

	p.top_k = 2; /* the two 5s */
	probs_of(&p, l, 5, pr);
	NEAR(pr[1], 0.5);
	NEAR(pr[3], 0.5);
	T_ASSERT(pr[0] == 0 && pr[2] == 0 && pr[4] == 0);
	p.top_k = 3;
	probs_of(&p, l, 5, pr);
	double z = 2 * exp(5.0) + exp(3.0);
	NEAR(pr[1], exp(5.0) / z);
	NEAR(pr[2], exp(3.0) / z);
	T_ASSERT(pr[0] == 0 && pr[4] == 0);
	/* Ties with the k-th are kept (Hugging Face: drop scores < k-th). */
	float m[5] = { 1, 5, 3, 3, 2 };
	p.top_k = 2;
	probs_of(&p, m, 5, pr);
	T_ASSERT(pr[1] > 0 && pr[2] > 0 && pr[3] > 0 && pr[0] == 0 && pr[4] == 0);
	p.top_k = 5; /* >= the vocabulary: off */
	probs_of(&p, m, 5, pr);
	T_ASSERT(pr[0] > 0 && pr[4] > 0);
}

static void t_top_p(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) }, pr[4];

	/* Ascending, the tail's running sums are 0.05, 0.2, 0.5, 1: with
	 * p = 0.75 the tail up to 0.2 (<= 0.25) goes. */
	p.top_p = 0.75f;
	probs_of(&p, l, 4, pr);
	NEAR(pr[0], 0.625);
	NEAR(pr[1], 0.375);
	T_ASSERT(pr[2] == 0 && pr[3] == 0);
	p.top_p = 0.85f; /* 1 - p = 0.15: only 0.05 goes */
	probs_of(&p, l, 4, pr);
	NEAR(pr[0], 0.5 / 0.95);
	NEAR(pr[2], 0.15 / 0.95);
	T_ASSERT(pr[3] == 0);
	p.top_p = 0.1f; /* at least one stays: the most likely */
	probs_of(&p, l, 4, pr);
	T_ASSERT(pr[0] == 1 && pr[1] == 0);
	p.top_p = 1.0f;
	probs_of(&p, l, 4, pr);
	NEAR(pr[3], 0.05);
}

static void t_min_p(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) }, pr[4];

	p.min_p = 0.2f; /* drops p < 0.1 */
	probs_of(&p, l, 4, pr);
	NEAR(pr[0], 0.5 / 0.95);
	NEAR(pr[1], 0.3 / 0.95);
	NEAR(pr[2], 0.15 / 0.95);
	T_ASSERT(pr[3] == 0);
	p.min_p = 0.7f; /* drops p < 0.35 */
	probs_of(&p, l, 4, pr);
	T_ASSERT(pr[0] == 1);
	p.min_p = 1.0f; /* only the top (and its ties) */
	float m[3] = { 2, 2, 1 };
	probs_of(&p, m, 3, pr);
	NEAR(pr[0], 0.5);
	NEAR(pr[1], 0.5);
	T_ASSERT(pr[2] == 0);
}

/* Greedy steps that emit the given tokens (their logit made largest). */
static void emit(struct baton_sampler *s, uint32_t n, const uint32_t *toks, size_t k)
{
	float *l = malloc(n * sizeof *l);
	for (size_t i = 0; i < k; i++) {
		uint32_t t;
		for (uint32_t j = 0; j < n; j++)
			l[j] = j == toks[i] ? 100.0f : 0.0f;
		T_OK(baton_sampler_next(s, l, &t, NULL));
		T_EQ_INT(t, toks[i]);
	}
	free(l);
}

static void t_repetition_penalty(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	p.temperature = 0;
	p.repetition_penalty = 2;
	struct baton_sampler *s = mk(&p, 6);
	uint32_t prompt[] = { 0, 1, 1 }, out[] = { 4 };
	T_OK(baton_sampler_prompt(s, prompt, 3));
	emit(s, 6, out, 1);
	T_EQ_ERR(baton_sampler_prompt(s, prompt, 1), BATON_ESTATE); /* after a token */
	float l[6] = { 2, -2, 1, 0.5f, 3, -1 }, pr[6];
	T_OK(baton_sampler_probs(s, l, pr));
	/* Positive divided, negative multiplied, each distinct token once,
	 * prompt and output alike; the others unchanged. */
	T_ASSERT(l[0] == 1 && l[1] == -4 && l[2] == 1 && l[3] == 0.5f && l[4] == 1.5f && l[5] == -1);
	T_ASSERT(pr[4] == 1); /* 1.5 is now the largest */
	baton_sampler_free(s);
}

static void t_presence_frequency(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	p.temperature = 0;
	p.presence_penalty = 0.5f;
	p.frequency_penalty = 0.25f;
	struct baton_sampler *s = mk(&p, 5);
	uint32_t prompt[] = { 0, 0, 1 }, out[] = { 2, 2, 3, 2 };
	T_OK(baton_sampler_prompt(s, prompt, 3));
	emit(s, 5, out, 4);
	float l[5] = { 1, 1, 1, 1, 1 }, pr[5];
	T_OK(baton_sampler_probs(s, l, pr));
	/* Output counts only: token 2 three times, token 3 once. */
	T_ASSERT(l[0] == 1 && l[1] == 1 && l[4] == 1);
	T_ASSERT(l[2] == 1 - 3 * 0.25f - 0.5f);
	T_ASSERT(l[3] == 1 - 0.25f - 0.5f);
	T_ASSERT(pr[0] == 1);
	baton_sampler_free(s);

	p.presence_penalty = -2; /* negative: encourages repeats */
	p.frequency_penalty = 0;
	s = mk(&p, 5);
	emit(s, 5, out + 2, 1);
	float m[5] = { 1, 1, 1, 0, 1 };
	T_OK(baton_sampler_probs(s, m, pr));
	T_ASSERT(m[3] == 2 && pr[3] == 1);
	baton_sampler_free(s);
}

static void t_logit_bias(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	struct baton_logit_bias b[] = { { 3, 5 }, { 0, -100 } };
	p.bias = b;
	p.n_bias = 2;
	p.temperature = 0;
	float l[4] = { 10, 1, 2, 0 }, pr[4];
	probs_of(&p, l, 4, pr);
	T_ASSERT(pr[3] == 1);
	p.temperature = 1;
	float m[4] = { 0, 0, 0, 0 };
	probs_of(&p, m, 4, pr);
	double z = 2 + exp(5.0) + exp(-100.0);
	NEAR(pr[3], exp(5.0) / z);
	NEAR(pr[1], 1 / z);
}

/* The order: penalties before temperature; temperature before top-p. */
static void t_order(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	p.presence_penalty = 1;
	p.temperature = 0.5f;
	struct baton_sampler *s = mk(&p, 2);
	float l[2] = { 3, 2 }, pr[2];
	/* Token 0 drawn once (made certain). */
	float c[2] = { 100, -100 };
	uint32_t t;
	T_OK(baton_sampler_next(s, c, &t, NULL));
	T_EQ_INT(t, 0);
	/* (3 - 1) / 0.5 = 4 and 2 / 0.5 = 4: equal. Temperature first would
	 * give 6 - 1 = 5 against 4. */
	T_OK(baton_sampler_probs(s, l, pr));
	NEAR(pr[0], 0.5);
	NEAR(pr[1], 0.5);
	baton_sampler_free(s);

	/* top-p sees the tempered distribution: probs 0.5, 0.3, 0.15, 0.05
	 * at T = 1 keep two with p = 0.75; at T = 4 they flatten (0.33,
	 * 0.29, 0.24, 0.14) and the tail up to 0.25 is only the last. */
	p = baton_sample_defaults();
	p.top_p = 0.75f;
	p.temperature = 4;
	float q[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) }, pq[4];
	probs_of(&p, q, 4, pq);
	T_ASSERT(pq[2] > 0 && pq[3] == 0);
}

static void t_stop_and_max_tokens(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	uint32_t stops[] = { 7, 2 };
	p.temperature = 0;
	p.stop_ids = stops;
	p.n_stop_ids = 2;
	p.max_tokens = 3;
	struct baton_sampler *s = mk(&p, 8);
	uint32_t a[] = { 1, 3 };
	emit(s, 8, a, 2);
	T_EQ_INT(baton_sampler_finish(s), BATON_FINISH_NONE);
	float l[8] = { 0, 0, 9, 0, 0, 0, 0, 0 };
	uint32_t t;
	enum baton_finish f;
	T_OK(baton_sampler_next(s, l, &t, &f)); /* a stop id wins over the length */
	T_EQ_INT(t, 2);
	T_EQ_INT(f, BATON_FINISH_STOP);
	T_EQ_ERR(baton_sampler_next(s, l, &t, &f), BATON_ESTATE);
	baton_sampler_free(s);

	s = mk(&p, 8);
	uint32_t b[] = { 1, 3, 4 };
	emit(s, 8, b, 3);
	T_EQ_INT(baton_sampler_finish(s), BATON_FINISH_LENGTH);
	T_EQ_INT(baton_sampler_count(s), 3);
	T_EQ_ERR(baton_sampler_next(s, l, &t, &f), BATON_ESTATE);
	baton_sampler_free(s);
}

static uint64_t rng = 0x853c49e6748fea9bull;

static float urand(void) /* [0, 1) */
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (float)((z ^ (z >> 31)) >> 40) * 0x1p-24f;
}

static void run_seq(uint64_t seed, uint32_t *toks, int n)
{
	struct baton_sample_params p = baton_sample_defaults();
	p.seed = seed;
	p.top_k = 40;
	p.top_p = 0.95f;
	p.repetition_penalty = 1.1f;
	p.temperature = 0.8f;
	struct baton_sampler *s = mk(&p, 1000);
	float *l = malloc(1000 * sizeof *l);
	uint64_t saved = rng;
	rng = 42; /* the same logits for every seed */
	for (int i = 0; i < n; i++) {
		for (int j = 0; j < 1000; j++)
			l[j] = 4 * urand();
		T_OK(baton_sampler_next(s, l, &toks[i], NULL));
	}
	rng = saved;
	free(l);
	baton_sampler_free(s);
}

static void t_seed_repeatable(void)
{
	uint32_t a[200], b[200], c[200];
	run_seq(1234, a, 200);
	run_seq(1234, b, 200);
	run_seq(1235, c, 200);
	T_ASSERT(memcmp(a, b, sizeof a) == 0);
	int differ = 0;
	for (int i = 0; i < 200; i++)
		differ += a[i] != c[i];
	T_ASSERT_MSG(differ > 100, "seeds 1234 and 1235 differ at only %d of 200 tokens", differ);
}

/* Frequencies of 200,000 draws against the distribution, by chi-square
 * (fixed seed, so the statistic is a fixed number; the bound is the 99.99%
 * point for the degrees of freedom, so a broken draw cannot pass by luck). */
static void chi_square_case(const struct baton_sample_params *p, const float *l, uint32_t n,
    double bound)
{
	enum { DRAWS = 200000 };
	float *pr = malloc(n * sizeof *pr), *c = malloc(n * sizeof *c);
	uint64_t *cnt = calloc(n, sizeof *cnt);
	probs_of(p, l, n, pr);
	struct baton_sampler *s = mk(p, n);
	for (int i = 0; i < DRAWS; i++) {
		uint32_t t;
		memcpy(c, l, n * sizeof *c);
		T_OK(baton_sampler_next(s, c, &t, NULL));
		cnt[t]++;
	}
	double chi = 0;
	int dof = -1;
	for (uint32_t i = 0; i < n; i++) {
		if (pr[i] == 0) {
			T_ASSERT_MSG(cnt[i] == 0, "token %u has p 0 but was drawn %llu times", i,
			    (unsigned long long)cnt[i]);
			continue;
		}
		double e = (double)pr[i] * DRAWS;
		chi += ((double)cnt[i] - e) * ((double)cnt[i] - e) / e;
		dof++;
	}
	printf("  chi-square %.2f with %d degrees of freedom (bound %.1f)\n", chi, dof, bound);
	T_ASSERT_MSG(chi < bound, "chi-square %.2f >= %.1f", chi, bound);
	baton_sampler_free(s);
	free(pr);
	free(c);
	free(cnt);
}

static void t_distribution(void)
{
	struct baton_sample_params p = baton_sample_defaults();
	float l[8] = { 0.1f, 1.5f, -0.7f, 2.2f, 0.0f, 1.1f, -2.0f, 0.9f };
	p.seed = 99;
	chi_square_case(&p, l, 8, 29.9); /* 7 dof: 99.99% point 29.9 */
	p.top_k = 4;
	p.temperature = 0.7f;
	chi_square_case(&p, l, 8, 21.1); /* 3 dof: 21.1 */
	p.top_k = 0;
	p.min_p = 0.1f;
	p.temperature = 1.3f;
	chi_square_case(&p, l, 8, 27.9); /* at most 6 dof: 27.9 */
}

/* Hugging Face's top-p, written plainly: sort all ascending, softmax,
 * running sum, drop while <= 1 - p, keep the last. */
static void brute_top_p(const float *l, uint32_t n, float top_p, uint8_t *keep)
{
	uint32_t *ix = malloc(n * sizeof *ix);
	double mx = -INFINITY, sum = 0;
	for (uint32_t i = 0; i < n; i++) {
		ix[i] = i;
		mx = fmax(mx, l[i]);
	}
	/* Shell sort by (logit ascending, id descending). */
	for (uint32_t gap = n / 2; gap > 0; gap /= 2)
		for (uint32_t i = gap; i < n; i++) {
			uint32_t t = ix[i], j = i;
			while (j >= gap && (l[ix[j - gap]] > l[t] || (l[ix[j - gap]] == l[t] && ix[j - gap] < t))) {
				ix[j] = ix[j - gap];
				j -= gap;
			}
			ix[j] = t;
		}
	for (uint32_t i = 0; i < n; i++)
		sum += exp((double)l[i] - mx);
	double cum = 0;
	memset(keep, 1, n);
	for (uint32_t i = 0; i + 1 < n; i++) {
		cum += exp((double)l[ix[i]] - mx) / sum;
		if (cum > 1 - (double)top_p)
			break;
		keep[ix[i]] = 0;
	}
	free(ix);
}

static void t_top_p_large_vocab(void)
{
	const uint32_t V = 151936;
	float *l = malloc(V * sizeof *l), *c = malloc(V * sizeof *c), *pr = malloc(V * sizeof *pr);
	uint8_t *keep = malloc(V);
	const float ps[] = { 0.5f, 0.9f, 0.99f };
	for (int k = 0; k < 3; k++) {
		/* Logits shaped like a model's: a few strong, a long tail. */
		for (uint32_t i = 0; i < V; i++) {
			float u = urand();
			l[i] = 12 * u * u * u * u - 3;
		}
		struct baton_sample_params p = baton_sample_defaults();
		p.top_p = ps[k];
		memcpy(c, l, V * sizeof *c);
		probs_of(&p, c, V, pr);
		brute_top_p(l, V, ps[k], keep);
		uint32_t kept = 0;
		for (uint32_t i = 0; i < V; i++) {
			T_ASSERT_MSG((pr[i] > 0) == keep[i], "p %.2f token %u: prob %g, keep %d", ps[k], i,
			    pr[i], keep[i]);
			kept += keep[i];
		}
		printf("  top_p %.2f keeps %u of %u\n", ps[k], kept, V);
	}
	free(l);
	free(c);
	free(pr);
	free(keep);
}

/* Random settings and logits (ties, NaN, infinities included): the
 * distribution sums to 1, every drawn token had a probability above 0,
 * and sampling never fails while a logit is finite. */
/* Greedy over large random vocabularies (lengths not a multiple of the
 * scan's 8 lanes) with NaN, -inf, +inf, ties, -0 and +0 and a logit
 * bias: the token of the plain scan `if (l[t] > best)` after NaN became
 * -inf and the bias was added, which the sampler was. */
static void t_greedy_scan(void)
{
	for (int it = 0; it < 300; it++) {
		const uint32_t V = 1 + (uint32_t)(urand() * 3000);
		float *l = malloc(V * sizeof *l), *c = malloc(V * sizeof *c);
		T_ASSERT(l && c);
		const int kind = it % 6;
		for (uint32_t i = 0; i < V; i++) {
			float u = urand();
			l[i] = kind == 0 ? (float)(int)(4 * urand()) - 2.0f /* many ties */
			     : kind == 1 ? (u < 0.5f ? -0.0f : 0.0f) /* only zeros */
			     : kind == 2 ? (u < 0.9f ? NAN : -INFINITY) /* maybe nothing */
			     : u < 0.05f ? NAN : u < 0.1f ? -INFINITY : u < 0.12f ? 5.0f : 10 * urand() - 5;
		}
		if (kind == 3)
			l[(uint32_t)(urand() * V)] = INFINITY;
		struct baton_sample_params p = baton_sample_defaults();
		p.temperature = 0;
		struct baton_logit_bias bias[2] = { { (uint32_t)(urand() * V), 3.0f },
			{ (uint32_t)(urand() * V), -100.0f } };
		p.bias = bias;
		p.n_bias = bias[0].token == bias[1].token ? 1 : 2;
		uint32_t want = UINT32_MAX;
		float bv = -INFINITY;
		for (uint32_t i = 0; i < V; i++) {
			float v = isnan(l[i]) ? -INFINITY : l[i];
			for (uint32_t b = 0; b < p.n_bias; b++)
				if (bias[b].token == i)
					v += bias[b].bias;
			if (v > bv)
				bv = v, want = i;
		}
		struct baton_sampler *s = mk(&p, V);
		memcpy(c, l, V * sizeof *c);
		uint32_t t = UINT32_MAX;
		int rc = baton_sampler_next(s, c, &t, NULL);
		if (want == UINT32_MAX)
			T_EQ_ERR(rc, BATON_EINVAL);
		else
			T_ASSERT_MSG(rc == 0 && t == want, "iteration %d (V %u, kind %d): %u, want %u", it, V,
			    kind, t, want);
		baton_sampler_free(s);
		free(l), free(c);
	}
}

static void t_random_settings(void)
{
	enum { V = 300 };
	float l[V], c[V], pr[V];
	for (int it = 0; it < 400; it++) {
		struct baton_sample_params p = baton_sample_defaults();
		p.temperature = it % 7 == 0 ? 0 : 0.05f + 3 * urand();
		p.top_k = it % 3 == 0 ? 0 : (uint32_t)(urand() * 400);
		p.top_p = it % 4 == 0 ? 1 : 0.01f + 0.99f * urand();
		p.min_p = it % 5 == 0 ? 0 : urand();
		p.repetition_penalty = 0.5f + 1.5f * urand();
		p.presence_penalty = 4 * urand() - 2;
		p.frequency_penalty = 4 * urand() - 2;
		p.seed = (uint64_t)it;
		struct baton_sampler *s = mk(&p, V);
		uint32_t prompt[8];
		for (int i = 0; i < 8; i++)
			prompt[i] = (uint32_t)(urand() * V);
		T_OK(baton_sampler_prompt(s, prompt, 8));
		for (int step = 0; step < 5; step++) {
			for (int i = 0; i < V; i++) {
				float u = urand();
				l[i] = u < 0.02f ? NAN : u < 0.04f ? -INFINITY : u < 0.05f ? 7.0f : 20 * urand() - 10;
			}
			if (it % 11 == 0)
				l[3] = INFINITY;
			memcpy(c, l, sizeof l);
			T_OK(baton_sampler_probs(s, c, pr));
			double sum = 0;
			for (int i = 0; i < V; i++) {
				T_ASSERT(pr[i] >= 0 && pr[i] <= 1);
				sum += pr[i];
			}
			T_ASSERT_MSG(fabs(sum - 1) < 1e-5, "iteration %d: probabilities sum to %.9g", it, sum);
			memcpy(c, l, sizeof l);
			uint32_t t;
			T_OK(baton_sampler_next(s, c, &t, NULL));
			T_ASSERT_MSG(t < V && pr[t] > 0, "iteration %d: drew %u with p %g", it, t, pr[t]);
		}
		baton_sampler_free(s);
	}
}

static void t_bad_params(void)
{
	struct baton_sample_params p;
	struct baton_sampler *s = (struct baton_sampler *)1;
	char err[200];
	uint32_t big[] = { 3, 50 };
	struct baton_logit_bias bb[] = { { 50, 1 } }, bn[] = { { 1, NAN } };

#define BAD(setup, word)                                                             \
	do {                                                                         \
		p = baton_sample_defaults();                                         \
		setup;                                                               \
		err[0] = '\0';                                                       \
		T_EQ_ERR(baton_sampler_new(&p, 10, &s, err, sizeof err), BATON_EINVAL); \
		T_ASSERT(s == NULL);                                                 \
		T_ASSERT_MSG(strstr(err, word) != NULL, "\"%s\" lacks \"%s\"", err, word); \
		s = (struct baton_sampler *)1;                                       \
	} while (0)
	BAD(p.temperature = -1, "temperature");
	BAD(p.temperature = NAN, "temperature");
	BAD(p.temperature = INFINITY, "temperature");
	BAD(p.top_p = 0, "top_p");
	BAD(p.top_p = 1.5f, "top_p");
	BAD(p.min_p = -0.1f, "min_p");
	BAD(p.min_p = 2, "min_p");
	BAD(p.repetition_penalty = 0, "repetition_penalty");
	BAD(p.repetition_penalty = NAN, "repetition_penalty");
	BAD(p.presence_penalty = 2.5f, "presence_penalty");
	BAD(p.frequency_penalty = -3, "frequency_penalty");
	BAD((p.stop_ids = big, p.n_stop_ids = 2), "stop token id 50");
	BAD(p.n_stop_ids = 1, "without its array");
	BAD((p.bias = bb, p.n_bias = 1), "logit bias token 50");
	BAD((p.bias = bn, p.n_bias = 1), "not a finite number");
#undef BAD
	p = baton_sample_defaults();
	T_EQ_ERR(baton_sampler_new(&p, 0, &s, err, sizeof err), BATON_EINVAL);
	T_EQ_ERR(baton_sampler_new(NULL, 10, &s, err, sizeof err), BATON_EINVAL);
	T_EQ_ERR(baton_sampler_new(&p, 10, NULL, err, sizeof err), BATON_EINVAL);
	baton_sampler_free(NULL);

	/* Arrays are copied; bad ids in the prompt change nothing. */
	uint32_t stops[] = { 4 };
	p.stop_ids = stops;
	p.n_stop_ids = 1;
	p.temperature = 0;
	s = mk(&p, 10);
	stops[0] = 5;
	uint32_t badp[] = { 1, 10 };
	T_EQ_ERR(baton_sampler_prompt(s, badp, 2), BATON_EINVAL);
	T_EQ_ERR(baton_sampler_prompt(s, NULL, 1), BATON_EINVAL);
	T_OK(baton_sampler_prompt(s, NULL, 0));
	float l[10] = { 0, 0, 0, 0, 9, 0, 0, 0, 0, 0 };
	uint32_t t;
	enum baton_finish f;
	T_OK(baton_sampler_next(s, l, &t, &f));
	T_ASSERT(t == 4 && f == BATON_FINISH_STOP);
	baton_sampler_free(s);
}

/* The mask of constrained decoding: a clear bit is never drawn (greedy or
 * sampled, bias or not), the rest keep their ratios; NULL is no mask. */
static void t_mask(void)
{
	enum { N = 200 };
	uint64_t allow[(N + 63) / 64] = { 0 };
	for (uint32_t t = 0; t < N; t += 7)
		allow[t / 64] |= 1ull << (t % 64);
	float base[N], l[N], pm[N], pu[N];
	for (uint32_t t = 0; t < N; t++)
		base[t] = (float)((t * 37) % 23) / 4.0f;
	base[1] = 50; /* the favourite, masked */
	struct baton_sample_params p = baton_sample_defaults();
	struct baton_logit_bias b = { 3, 90 }; /* a bias does not lift a masked token */
	p.bias = &b;
	p.n_bias = 1;
	for (int greedy = 0; greedy < 2; greedy++) {
		p.temperature = greedy ? 0.0f : 1.0f;
		struct baton_sampler *s = mk(&p, N);
		baton_sampler_set_mask(s, allow);
		for (int i = 0; i < 300; i++) {
			uint32_t t;
			memcpy(l, base, sizeof l);
			T_OK(baton_sampler_next(s, l, &t, NULL));
			T_ASSERT_MSG(t % 7 == 0, "token %u drawn through the mask", t);
		}
		memcpy(l, base, sizeof l);
		T_OK(baton_sampler_probs(s, l, pm));
		baton_sampler_set_mask(s, NULL);
		memcpy(l, base, sizeof l);
		T_OK(baton_sampler_probs(s, l, pu));
		baton_sampler_free(s);
		T_ASSERT(pu[3] > 0.5f); /* unmasked, the biased token is back */
		if (greedy) {
			T_ASSERT(pu[3] == 1.0f && pm[3] == 0.0f);
			continue;
		}
		double sum = 0;
		for (uint32_t t = 0; t < N; t++) {
			if (t % 7)
				T_ASSERT(pm[t] == 0.0f);
			sum += pm[t];
		}
		NEAR(sum, 1.0);
		/* the allowed keep their ratios: pm = pu / (mass of the allowed) */
		double mass = 0;
		for (uint32_t t = 0; t < N; t += 7)
			mass += pu[t];
		for (uint32_t t = 0; t < N; t += 7)
			T_ASSERT_MSG(fabs(pm[t] - pu[t] / mass) <= 1e-5 * (pm[t] + 1e-9) + 1e-7, "token %u: %g vs %g", t,
			    (double)pm[t], pu[t] / mass);
	}
}

T_MAIN(T_CASE(t_mask), T_CASE(t_greedy), T_CASE(t_greedy_scan), T_CASE(t_temperature), T_CASE(t_top_k), T_CASE(t_top_p),
    T_CASE(t_min_p), T_CASE(t_repetition_penalty), T_CASE(t_presence_frequency),
    T_CASE(t_logit_bias), T_CASE(t_order), T_CASE(t_stop_and_max_tokens),
    T_CASE(t_seed_repeatable), T_CASE_TIMEOUT(t_distribution, 60),
    T_CASE_TIMEOUT(t_top_p_large_vocab, 120), T_CASE(t_random_settings), T_CASE(t_bad_params))
