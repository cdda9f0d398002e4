/*
 * baton-grammar-bench: the cost of structured output per decode step
 * (text/grammar/'s token mask and the sampler's use of it) on the host
 * CPU, where it runs, over a vocabulary of Qwen3's size. Not a test: it
 * prints figures (docs/measurements/performance.md keeps them).
 *
 *   baton-grammar-bench [--tokenizer tokenizer.json] [--vocab N] [--seed N]
 *                       [--step-ms MS] [--reps N] [--trace]
 *
 * The vocabulary: a tokenizer's (--tokenizer) or a synthetic one of
 * --vocab tokens (default 151,936) drawn like a byte-level BPE's: the 256
 * bytes, words with and without a leading space, CJK pieces, code and
 * punctuation pieces (quotes among them), whitespace runs. Each document
 * (a typical schema's answer, pretty-printed, and the same under
 * json_object) is split into tokens greedily (longest first); for each
 * step: the mask (gram_match_mask), the accept (gram_match_accept), and
 * baton_sampler_next over random logits with the mask and without (the
 * difference is the sampler's share). The sum is set against --step-ms
 * (12: an H200 decode step at batch 1 today); --trace prints each step of
 * the first run to stderr. Times are the thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID), so a busy machine does not inflate them.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model/model.h"
#include "proto/base/base.h"

/* This thread's CPU time, s: the figures leave out the time other
 * processes hold the CPU (the wall clock on a shared machine does not). */
static double cpu_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}
static unsigned rn(unsigned n)
{
	return (unsigned)(rnd() % n);
}

struct voc {
	uint32_t n, cap;
	char **b;
	size_t *len;
	/* a hash set of the spellings, for dedup and greedy splitting */
	uint32_t *slot;
	size_t nslot;
};

static uint64_t hash(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

static int64_t voc_find(const struct voc *v, const char *s, size_t n)
{
	for (size_t i = hash(s, n) & (v->nslot - 1);; i = (i + 1) & (v->nslot - 1)) {
		uint32_t t = v->slot[i];
		if (t == UINT32_MAX)
			return -1;
		if (v->len[t] == n && !memcmp(v->b[t], s, n))
			return t;
	}
}

static void voc_add(struct voc *v, const char *s, size_t n)
{
	if (v->n >= v->cap || voc_find(v, s, n) >= 0)
		return;
	uint32_t t = v->n++;
	v->b[t] = malloc(n);
	memcpy(v->b[t], s, n);
	v->len[t] = n;
	size_t i = hash(s, n) & (v->nslot - 1);
	while (v->slot[i] != UINT32_MAX)
		i = (i + 1) & (v->nslot - 1);
	v->slot[i] = t;
}

static void voc_init(struct voc *v, uint32_t cap)
{
	memset(v, 0, sizeof *v);
	v->cap = cap;
	v->b = calloc(cap, sizeof *v->b);
	v->len = calloc(cap, sizeof *v->len);
	v->nslot = 1;
	while (v->nslot < (size_t)cap * 2)
		v->nslot <<= 1;
	v->slot = malloc(v->nslot * sizeof *v->slot);
	memset(v->slot, 0xff, v->nslot * sizeof *v->slot);
}

static void word(char *s, size_t *n, int cap)
{
	static const char *syl[] = { "th", "e", "an", "in", "er", "on", "at", "re", "st", "en", "ing", "ion",
		"a", "o", "i", "u", "s", "t", "d", "m", "p", "ch", "ou", "al", "or", "ed", "es", "ly", "ment" };
	unsigned k = 1 + rn(4);
	for (unsigned i = 0; i < k; i++) {
		const char *x = syl[rn(sizeof syl / sizeof syl[0])];
		memcpy(s + *n, x, strlen(x));
		*n += strlen(x);
	}
	if (cap)
		s[*n - (*n > 0 ? *n : 0)] = s[0];
}

static void synthetic(struct voc *v, uint32_t n)
{
	voc_init(v, n);
	for (int c = 0; c < 256; c++) {
		char s[1] = { (char)c };
		voc_add(v, s, 1);
	}
	static const char punct[] = "{}[]()<>;:,.=+-*/\"'\\_#@!?%&|$`~";
	while (v->n < n) {
		char s[96];
		size_t k = 0;
		unsigned kind = rn(100);
		if (kind < 38) { /* " word" */
			s[k++] = ' ';
			word(s, &k, 0);
			if (rn(5) == 0)
				s[1] = (char)(s[1] - 32 > 'A' ? s[1] - 32 : s[1]);
		} else if (kind < 62) { /* "word" */
			word(s, &k, 0);
		} else if (kind < 78) { /* CJK: 1-3 characters, sometimes cut */
			unsigned m = 1 + rn(3);
			for (unsigned i = 0; i < m; i++) {
				s[k++] = (char)(0xE4 + rn(6));
				s[k++] = (char)(0x80 + rn(64));
				s[k++] = (char)(0x80 + rn(64));
			}
			if (rn(6) == 0)
				k--;
		} else if (kind < 90) { /* code and punctuation, letters among them */
			unsigned m = 1 + rn(4);
			if (rn(3) == 0)
				s[k++] = ' ';
			for (unsigned i = 0; i < m; i++)
				s[k++] = rn(3) ? punct[rn(sizeof punct - 1)] : (char)('a' + rn(26));
		} else if (kind < 95) { /* whitespace */
			if (rn(2))
				s[k++] = '\n';
			unsigned m = rn(33);
			char w = rn(5) ? ' ' : '\t';
			for (unsigned i = 0; i < m; i++)
				s[k++] = w;
			if (!k)
				s[k++] = ' ';
		} else { /* quoted pieces: "word, word", ",", ":" */
			unsigned f = rn(5);
			if (f == 0 || f == 3)
				s[k++] = ' ';
			if (f <= 1 || f == 3)
				s[k++] = '"';
			word(s, &k, 0);
			if (f >= 2)
				s[k++] = '"';
			if (f == 4)
				s[k++] = rn(2) ? ',' : ':';
		}
		voc_add(v, s, k);
	}
}

static void load_tok(struct voc *v, const char *path, uint32_t *n_special)
{
	char err[300];
	text_tok *t;
	int rc = text_tok_load_file(&t, path, err, sizeof err);
	if (rc) {
		fprintf(stderr, "baton-grammar-bench: %s: %s\n", path, err);
		exit(1);
	}
	uint32_t n = (uint32_t)text_vocab_size(t);
	voc_init(v, n);
	*n_special = 0;
	for (uint32_t i = 0; i < n; i++) {
		char b[1024];
		size_t len = 0;
		if (text_is_special(t, (int32_t)i) || text_token_bytes(t, (int32_t)i, b, sizeof b, &len)) {
			(*n_special)++;
			len = 0;
		}
		/* keep ids: duplicates stay (the set finds the first) */
		v->b[v->n] = malloc(len + 1);
		memcpy(v->b[v->n], b, len);
		v->len[v->n] = len;
		if (len && voc_find(v, b, len) < 0) {
			size_t j = hash(b, len) & (v->nslot - 1);
			while (v->slot[j] != UINT32_MAX)
				j = (j + 1) & (v->nslot - 1);
			v->slot[j] = v->n;
		}
		v->n++;
	}
	text_tok_free(t);
}

/* Greedy longest-first split of doc into token ids. */
static uint32_t split(const struct voc *v, const char *doc, uint32_t *ids)
{
	size_t at = 0, n = strlen(doc);
	uint32_t k = 0;
	while (at < n) {
		size_t best = 0;
		int64_t id = -1;
		for (size_t l = n - at < 64 ? n - at : 64; l > 0 && id < 0; l--)
			if ((id = voc_find(v, doc + at, l)) >= 0)
				best = l;
		if (id < 0) {
			fprintf(stderr, "baton-grammar-bench: byte %zu has no token\n", at);
			exit(1);
		}
		ids[k++] = (uint32_t)id;
		at += best;
	}
	return k;
}

static const char SCHEMA[] =
	"{\"type\":\"object\",\"properties\":{"
	"\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
	"\"email\":{\"type\":\"string\",\"maxLength\":64},"
	"\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":8},"
	"\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},"
	"\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"maxLength\":10}},"
	"\"required\":[\"street\",\"city\"],\"additionalProperties\":false},"
	"\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"score\":{\"type\":\"number\"},"
	"\"active\":{\"type\":\"boolean\"},\"notes\":{\"type\":\"string\"}},"
	"\"required\":[\"name\",\"age\",\"tags\",\"role\",\"active\",\"notes\"],\"additionalProperties\":false}";

static const char DOC[] =
	"{\n  \"name\": \"Margaret Hamilton\",\n  \"age\": 38,\n"
	"  \"email\": \"margaret@example.org\",\n"
	"  \"tags\": [\"software\", \"apollo\", \"engineering\", \"\u5de5\u7a0b\u5e08\"],\n"
	"  \"address\": {\n    \"street\": \"77 Massachusetts Avenue\",\n    \"city\": \"Cambridge\",\n"
	"    \"zip\": \"02139\"\n  },\n  \"role\": \"admin\",\n  \"score\": 97.5,\n  \"active\": true,\n"
	"  \"notes\": \"She led the team that wrote the on-board flight software for the Apollo "
	"missions, and she coined the term \\\"software engineering\\\" to give the discipline "
	"the legitimacy of the other kinds of engineering.\"\n}";

struct stat {
	double sum, max;
	double *v;
	uint32_t n;
};

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static void add(struct stat *s, double x)
{
	s->v[s->n++] = x;
	s->sum += x;
	if (x > s->max)
		s->max = x;
}

static double pct(struct stat *s, double p)
{
	qsort(s->v, s->n, sizeof *s->v, cmpd);
	return s->v[(uint32_t)(p * (s->n - 1))];
}

int main(int argc, char **argv)
{
	const char *tok = NULL;
	uint32_t nv = 151936, reps = 20;
	double step_ms = 12.0;
	int trace = 0;
	static const struct option opts[] = {
		{ "tokenizer", 1, 0, 't' }, { "vocab", 1, 0, 'v' }, { "seed", 1, 0, 's' },
		{ "step-ms", 1, 0, 'm' }, { "reps", 1, 0, 'r' }, { "trace", 0, 0, 'T' }, { "help", 0, 0, 'h' },
		{ "version", 0, 0, 'V' }, { 0, 0, 0, 0 } };
	int c;
	static const char usage[] = "usage: baton-grammar-bench [--tokenizer tokenizer.json] [--vocab N] "
	    "[--seed N] [--step-ms MS] [--reps N] [--trace] [--help] [--version]\n";
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end = NULL;
		errno = 0;
		switch (c) {
		case 't': tok = optarg; break;
		case 'v': nv = (uint32_t)strtoul(optarg, &end, 10); break;
		case 's': rs = strtoull(optarg, &end, 10) | 1; break;
		case 'm': step_ms = strtod(optarg, &end); break;
		case 'r': reps = (uint32_t)strtoul(optarg, &end, 10); break;
		case 'T': trace = 1; break;
		case 'h': fputs(usage, stdout); return 0;
		case 'V': printf("baton-grammar-bench %s\n", BATON_VERSION); return 0;
		default: fputs(usage, stderr); return 2;
		}
		/* a number flag takes a whole number (or, for --step-ms, a real) and nothing after it */
		if (end && (end == optarg || *end || errno || optarg[0] == '-' || (c == 'm' && !(step_ms > 0)))) {
			fprintf(stderr, "baton-grammar-bench: --%s '%s': not a valid number\n",
			    c == 'v' ? "vocab" : c == 's' ? "seed" : c == 'm' ? "step-ms" : "reps", optarg);
			return 2;
		}
	}
	if (nv < 512 || nv > 4000000 || reps == 0) {
		fprintf(stderr, "baton-grammar-bench: --vocab 512..4000000, --reps >= 1\n");
		return 2;
	}
	struct voc v;
	uint32_t n_special = 0;
	double t0 = baton_now_s();
	if (tok)
		load_tok(&v, tok, &n_special);
	else
		synthetic(&v, nv);
	uint8_t *use = malloc(v.n);
	for (uint32_t i = 0; i < v.n; i++)
		use[i] = v.len[i] > 0;
	gram_vocab *gv;
	double t1 = cpu_s();
	int rc = gram_vocab_new(&gv, v.n, (const char *const *)v.b, v.len, use);
	if (rc) {
		fprintf(stderr, "baton-grammar-bench: vocabulary: %s\n", baton_strerror(rc));
		return 1;
	}
	double t2 = cpu_s();
	uint32_t q = 0;
	for (uint32_t i = 0; i < v.n; i++)
		q += memchr(v.b[i], '"', v.len[i]) != NULL;
	printf("vocabulary: %u tokens (%s%s), %u with a '\"'; tries and tables built in %.1f ms of CPU\n", v.n,
	    tok ? tok : "synthetic", n_special ? ", special ones left out" : "", q, (t2 - t1) * 1e3);
	(void)t0;

	uint32_t ids[4096];
	uint32_t n_ids = split(&v, DOC, ids);
	float *base = malloc((size_t)v.n * sizeof *base), *l = malloc((size_t)v.n * sizeof *l);
	uint64_t *allow = malloc(((size_t)v.n + 63) / 64 * 8);
	for (uint32_t i = 0; i < v.n; i++)
		base[i] = (float)(rnd() % 20000) / 1000.0f - 10.0f;
	const char *names[] = { "json_schema (a 10-field object)", "json_object" };
	for (int which = 0; which < 2; which++) {
		gram *g;
		char err[300];
		json_t *s = json_loads(SCHEMA, 0, NULL);
		rc = which == 0 ? gram_compile_schema(&g, s, err, sizeof err) :
		    gram_compile_json_object(&g, err, sizeof err);
		json_decref(s);
		if (rc) {
			fprintf(stderr, "baton-grammar-bench: compile: %s\n", err);
			return 1;
		}
		struct stat mk = { .v = malloc(sizeof(double) * n_ids * reps) };
		struct stat ac = { .v = malloc(sizeof(double) * n_ids * reps) };
		struct stat sm = { .v = malloc(sizeof(double) * n_ids * reps) };
		struct stat su = { .v = malloc(sizeof(double) * n_ids * reps) };
		uint64_t visits = 0;
		for (uint32_t r = 0; r < reps; r++) {
			gram_match *m;
			if (gram_match_new(&m, g, gv))
				return 1;
			struct baton_sample_params p = baton_sample_defaults();
			p.seed = r;
			struct baton_sampler *sa, *sb;
			if (baton_sampler_new(&p, v.n, &sa, err, sizeof err) ||
			    baton_sampler_new(&p, v.n, &sb, err, sizeof err))
				return 1;
			baton_sampler_set_mask(sa, allow);
			for (uint32_t k = 0; k < n_ids; k++) {
				bool can_end;
				double a = cpu_s();
				if (gram_match_mask(m, allow, &can_end))
					return 1;
				double b = cpu_s();
				visits += gram_match_last_visits(m);
				if (trace && r == 0)
					fprintf(stderr, "step %u: %.1f us, %llu visits, token [%.*s]\n", k, (b - a) * 1e6,
					    (unsigned long long)gram_match_last_visits(m), (int)v.len[ids[k]], v.b[ids[k]]);
				if (!(allow[ids[k] / 64] >> (ids[k] % 64) & 1)) {
					fprintf(stderr, "baton-grammar-bench: token %u of the document masked\n", k);
					return 1;
				}
				uint32_t t;
				memcpy(l, base, (size_t)v.n * sizeof *l);
				double c0 = cpu_s();
				baton_sampler_next(sa, l, &t, NULL);
				double c1 = cpu_s();
				memcpy(l, base, (size_t)v.n * sizeof *l);
				double d0 = cpu_s();
				baton_sampler_next(sb, l, &t, NULL);
				double d1 = cpu_s();
				double e0 = cpu_s();
				if (gram_match_accept(m, ids[k]))
					return 1;
				double e1 = cpu_s();
				add(&mk, (b - a) * 1e6);
				add(&ac, (e1 - e0) * 1e6);
				add(&sm, (c1 - c0) * 1e6);
				add(&su, (d1 - d0) * 1e6);
			}
			if (!gram_match_can_end(m))
				return 1;
			baton_sampler_free(sa);
			baton_sampler_free(sb);
			gram_match_free(m);
		}
		uint32_t n = mk.n;
		double per = (mk.sum + ac.sum + sm.sum - su.sum) / n;
		printf("%s: %u tokens x %u runs; per step, us: mask mean %.1f p50 %.1f p99 %.1f max %.1f; "
		    "accept mean %.2f; sampler %.1f with the mask, %.1f without; trie nodes visited %.0f\n",
		    names[which], n_ids, reps, mk.sum / n, pct(&mk, 0.5), pct(&mk, 0.99), mk.max, ac.sum / n,
		    sm.sum / n, su.sum / n, (double)visits / n);
		printf("  structured output adds %.1f us per step: %.2f%% of a %.1f ms decode step\n", per,
		    per / (step_ms * 1e3) * 100, step_ms);
		free(mk.v), free(ac.v), free(sm.v), free(su.v);
		gram_free(g);
	}
	gram_vocab_free(gv);
	return 0;
}
