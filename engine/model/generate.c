/*
 * generate.c: a generator: tokenizer, chat template, model and sampler of
 * one engine, and the request loop that joins them (see model.h, the generator).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "proto/base/base.h"

#define MAX_EOS 8

struct baton_generator {
	struct baton_engine *e;
	struct baton_model *model;
	text_tok *tok;
	const char *tmpl;           /* the tokenizer's chat template; NULL: none */
	const char *family;         /* text_chat_family(tmpl), looked up once */
	uint32_t eos[MAX_EOS];      /* the model's end-of-sequence ids */
	uint32_t n_eos;
	uint32_t vocab;             /* the model's logits */
	uint32_t tok_vocab;         /* the tokenizer's ids: larger ids are never sampled */
	float *logits;
	int content_special;        /* baton_model_opts.content_special */
	gram_vocab *gv;             /* the token trie of structured output, made on first use */
};

static void add_eos(struct baton_generator *g, json_int_t id)
{
	if (id < 0 || (uint64_t)id >= g->vocab || g->n_eos == MAX_EOS)
		return;
	for (uint32_t i = 0; i < g->n_eos; i++)
		if (g->eos[i] == (uint32_t)id)
			return;
	g->eos[g->n_eos++] = (uint32_t)id;
}

/* eos_token_id of a config blob: an integer or a list of them. */
static void eos_from_blob(struct baton_generator *g, const char *key)
{
	const void *data;
	uint64_t len;
	if (arena_blob(engine_arena(g->e), key, &data, &len) != 0)
		return;
	json_t *root = baton_json_load(data, (size_t)len, 0, NULL);
	json_t *v = root ? json_object_get(root, "eos_token_id") : NULL;
	int64_t id;
	if (baton_json_whole(v, 0, INT32_MAX, &id) == 0)
		add_eos(g, id);
	else if (json_is_array(v)) {
		size_t i;
		json_t *x;
		json_array_foreach(v, i, x)
			if (baton_json_whole(x, 0, INT32_MAX, &id) == 0)
				add_eos(g, id);
	}
	json_decref(root);
}

int generator_open(struct baton_engine *e, const struct baton_model_opts *opts,
    struct baton_generator **out, char *errbuf, size_t errlen)
{
	*out = NULL;
	const void *cfg;
	uint64_t cfg_len;
	if (arena_blob(engine_arena(e), "config.json", &cfg, &cfg_len) != 0) {
		baton_errf(errbuf, errlen, "the arena holds experts only (a synthetic or --experts-only "
		    "arena), not a whole model: no text can be generated with it");
		return BATON_EUNSUPPORTED;
	}
	struct baton_generator *g = calloc(1, sizeof *g);
	if (!g)
		return BATON_ENOMEM;
	g->e = e;
	g->content_special = opts && opts->content_special;
	int rc = model_open(e, opts, &g->model, errbuf, errlen);
	if (rc)
		goto fail;
	if ((rc = model_kv_alloc(g->model)) != 0) {
		baton_errf(errbuf, errlen, "no device memory for the KV cache of %u positions (%s): "
		    "a smaller --ctx needs less", model_max_ctx(g->model), baton_strerror(rc));
		goto fail;
	}
	g->vocab = model_config(g->model)->vocab;
	char terr[400] = "";
	if ((rc = text_tok_load_arena(&g->tok, engine_arena(e), terr, sizeof terr)) != 0) {
		baton_errf(errbuf, errlen, "the arena's tokenizer: %s", terr);
		goto fail;
	}
	g->tok_vocab = (uint32_t)text_vocab_size(g->tok);
	if (g->tok_vocab > g->vocab)
		g->tok_vocab = g->vocab;
	if ((g->tmpl = text_chat_template(g->tok)) != NULL)
		g->family = text_chat_family(g->tmpl);
	add_eos(g, text_eos(g->tok));
	add_eos(g, model_config(g->model)->eos);
	eos_from_blob(g, "generation_config.json");
	eos_from_blob(g, "config.json");
	if (!(g->logits = malloc((size_t)g->vocab * sizeof(float)))) {
		rc = BATON_ENOMEM;
		goto fail;
	}
	*out = g;
	return 0;
fail:
	generator_close(g);
	return rc;
}

void generator_close(struct baton_generator *g)
{
	if (!g)
		return;
	model_close(g->model);
	text_tok_free(g->tok);
	free(g->logits);
	gram_vocab_free(g->gv);
	free(g);
}

const text_tok *generator_tokenizer(const struct baton_generator *g)
{
	return g->tok;
}

const char *generator_arch(const struct baton_generator *g)
{
	return model_config(g->model)->arch->name;
}

const char *generator_chat_family(const struct baton_generator *g)
{
	return g->family;
}

const char *generator_chat_template(const struct baton_generator *g)
{
	return g->tmpl;
}

struct baton_model *generator_model(const struct baton_generator *g)
{
	return g->model;
}

void generator_result_free(struct baton_gen_result *res)
{
	if (!res)
		return;
	free(res->text);
	free(res->tokens);
	memset(res, 0, sizeof *res);
}

/* The prompt's ids: a raw prompt with the tokenizer's BOS, or the
 * conversation rendered by the template (which writes BOS itself) and
 * encoded without adding any, as transformers' apply_chat_template does. */
static int encode_prompt(struct baton_generator *g, const struct baton_gen_request *req,
    int32_t **ids, size_t *n, char *errbuf, size_t errlen)
{
	char err[400] = "";
	int rc;
	if (req->prompt_ids) {
		for (size_t i = 0; i < req->n_prompt_ids; i++)
			if (req->prompt_ids[i] >= g->tok_vocab) {
				baton_errf(errbuf, errlen, "prompt[%zu]: token id %u is outside the vocabulary (%u)", i,
				    req->prompt_ids[i], g->tok_vocab);
				return BATON_EINVAL;
			}
		if (!(*ids = malloc(sizeof(int32_t) * (req->n_prompt_ids + 1))))
			return BATON_ENOMEM;
		for (size_t i = 0; i < req->n_prompt_ids; i++)
			(*ids)[i] = (int32_t)req->prompt_ids[i];
		*n = req->n_prompt_ids;
		return 0;
	}
	if (!req->msgs) {
		rc = text_encode(g->tok, req->prompt, req->prompt_len, TEXT_ADD_SPECIAL, ids, n, err, sizeof err);
		if (rc)
			baton_errf(errbuf, errlen, "prompt: %s", err);
		return rc;
	}
	if (!g->tmpl) {
		baton_errf(errbuf, errlen, "the model has no chat template: send a prompt instead of messages");
		return BATON_EUNSUPPORTED;
	}
	struct text_chat_opts o = {
		.add_generation_prompt = true,
		.enable_thinking = req->enable_thinking,
		.tools = req->tools,
		.kwargs = req->template_kwargs,
	};
	/* a message's text is text: only the template makes control tokens
	 * (issue 28), unless --special-tokens-in-content */
	char tail[16];
	rc = text_chat_encode_opts(g->tok, req->msgs, req->n_msgs, &o,
	    g->content_special ? TEXT_CONTENT_SPECIAL : 0, ids, n, tail, sizeof tail, err, sizeof err);
	if (rc == 0 && req->think_open) {
		size_t k = strlen(tail);
		while (k && (tail[k - 1] == '\n' || tail[k - 1] == ' '))
			k--;
		*req->think_open = k >= 7 && memcmp(tail + k - 7, "<think>", 7) == 0;
	}
	if (rc)
		baton_errf(errbuf, errlen, "chat template: %s", err);
	return rc;
}

/* The text of a request as it grows: what the stream decoder made final,
 * how much of it the caller has seen, and the stop strings. */
struct out {
	char *buf;
	size_t len, cap, emitted;
	const char *const *stop;
	size_t n_stop;
	baton_gen_text_fn fn;
	void *arg;
	int cancelled, stopped;
};

/* The longest suffix of buf[from..len) that begins some stop string. */
static size_t held_back(const struct out *o, size_t from)
{
	size_t best = 0;
	for (size_t s = 0; s < o->n_stop; s++) {
		size_t sl = strlen(o->stop[s]);
		for (size_t k = sl - 1; k > best; k--)
			if (k <= o->len - from && memcmp(o->buf + o->len - k, o->stop[s], k) == 0) {
				best = k;
				break;
			}
	}
	return best;
}

static void emit(struct out *o, size_t upto)
{
	if (upto > o->emitted && o->fn && !o->cancelled &&
	    o->fn(o->arg, o->buf + o->emitted, upto - o->emitted) != 0)
		o->cancelled = 1;
	if (upto > o->emitted)
		o->emitted = upto;
}

/* After new text: cut at a stop string, else pass on what can no longer
 * become one. `final`: nothing more comes, hold nothing back. */
static void settle(struct out *o, int final)
{
	size_t first = o->len;
	for (size_t s = 0; s < o->n_stop; s++) {
		size_t sl = strlen(o->stop[s]);
		if (o->len - o->emitted < sl)
			continue;
		char *p = memmem(o->buf + o->emitted, o->len - o->emitted, o->stop[s], sl);
		if (p && (size_t)(p - o->buf) < first)
			first = (size_t)(p - o->buf);
	}
	if (first < o->len) {
		o->len = first;
		o->buf[first] = '\0';
		o->stopped = 1;
		emit(o, first);
		return;
	}
	emit(o, final ? o->len : o->len - held_back(o, o->emitted));
}

static int check_request(const struct baton_gen_request *req, char *errbuf, size_t errlen)
{
	if ((req->prompt != NULL) + (req->msgs != NULL) + (req->prompt_ids != NULL) != 1) {
		baton_errf(errbuf, errlen, "give exactly one of a prompt, token ids and messages");
		return BATON_EINVAL;
	}
	if (req->prompt_ids && req->n_prompt_ids == 0) {
		baton_errf(errbuf, errlen, "prompt: no token ids");
		return BATON_EINVAL;
	}
	if (req->msgs && req->n_msgs == 0) {
		baton_errf(errbuf, errlen, "messages: the conversation is empty");
		return BATON_EINVAL;
	}
	if (req->n_stop > BATON_GEN_MAX_STOP) {
		baton_errf(errbuf, errlen, "stop: at most %u strings", BATON_GEN_MAX_STOP);
		return BATON_ERANGE;
	}
	for (size_t i = 0; i < req->n_stop; i++)
		if (!req->stop[i] || !req->stop[i][0]) {
			baton_errf(errbuf, errlen, "stop: an empty string never matches; leave it out");
			return BATON_EINVAL;
		}
	return 0;
}

/* Test hook: BATON_TEST_FORCE="TRIGGER<TAB>TEXT" (more pairs apart by
 * an ASCII RS, 0x1e) makes a chat request whose last message holds
 * TRIGGER answer TEXT, then end of turn: every other token's logit is
 * -inf before the sampler draws, so the text goes through the sampler,
 * the stream decoder and the API's output parsers as a model's would.
 * The tiny test models' answers are random; the tool-call and reasoning
 * parsers need a known output end to end. Never set outside tests. */
static int test_forced(struct baton_generator *g, const struct baton_gen_request *req, int32_t **ids,
    size_t *n)
{
	const char *v = getenv("BATON_TEST_FORCE");
	*ids = NULL;
	*n = 0;
	if (!v || !req->msgs || req->n_msgs == 0 || g->n_eos == 0)
		return 0;
	const char *last = req->msgs[req->n_msgs - 1].content;
	while (*v && last) {
		const char *end = strchr(v, '\x1e'), *tab = strchr(v, '\t');
		if (!end)
			end = v + strlen(v);
		if (tab && tab > v && tab < end && memmem(last, strlen(last), v, (size_t)(tab - v))) {
			char err[64];
			return text_encode(g->tok, tab + 1, (size_t)(end - tab - 1), TEXT_NO_SPECIAL, ids, n, err,
			    sizeof err);
		}
		v = *end ? end + 1 : end;
	}
	return 0;
}

/* One request in flight: its prompt, sampler, text decoder and output. */
struct baton_gen_seq {
	struct baton_generator *g;
	int32_t *ids;               /* the prompt */
	uint32_t n_prompt;
	struct baton_sampler *smp;
	text_stream *ts;
	struct out o;
	uint32_t *toks;             /* sampled ids, max_tokens + 1 room */
	uint32_t n_tokens, max_tokens;
	uint32_t stops[MAX_EOS + 64];
	gram_match *gm;             /* structured output: the grammar's matcher, or NULL */
	uint64_t *allow;            /* its mask, one bit per token of the model's vocabulary */
	const gram *grammar;        /* the request's (a trigger starts a fresh matcher) */
	const char *trigger;        /* grammar_trigger, or NULL */
	int g_on;                   /* the grammar holds now (always without a trigger) */
	char tail[64];              /* a trigger's: the output's last bytes while free */
	size_t tail_n;
	const char *finish;         /* NULL while it runs */
	int cancelled;              /* generator_seq_cancel */
	float *raw;                 /* on_token: the step's logits before sampling */
	void (*on_token)(void *arg, uint32_t id, float logprob, const uint32_t *top_ids, const float *top_lps,
	    uint32_t n_top);
	void *arg;
	uint32_t n_top;
	int32_t *forced;            /* BATON_TEST_FORCE's tokens (tests only) */
	size_t n_forced;
	double t0, t1;              /* prefill began, first token sampled */
	/* generator_seq_pick's token, for generator_seq_take */
	int pending;
	uint32_t pend_t;
	enum baton_finish pend_fin;
};

/* A grammar with a trigger, after token t: once the document is whole
 * the text is free again (a fresh matcher waits for the next trigger);
 * while free, the trigger at the output's end turns the grammar on (what
 * a token held past the trigger is fed to it; bytes it refuses leave the
 * grammar off: the token was not under it). */
static int follow_trigger(struct baton_gen_seq *s, uint32_t t)
{
	struct baton_generator *g = s->g;
	int rc;
	if (s->g_on) {
		if (!gram_match_can_end(s->gm))
			return 0;
		gram_match_free(s->gm);
		s->gm = NULL;
		if ((rc = gram_match_new(&s->gm, s->grammar, g->gv)) != 0)
			return rc;
		s->g_on = 0;
		s->tail_n = 0;
		baton_sampler_set_mask(s->smp, NULL);
		return 0;
	}
	char b[256];
	size_t n = 0;
	if (text_token_bytes(g->tok, (int32_t)t, b, sizeof b, &n) != 0 || n > sizeof b)
		n = 0;
	size_t tn = strlen(s->trigger), keep = sizeof s->tail - 1;
	/* the tail: the last bytes, enough for a trigger that began earlier
	 * and this token's */
	char all[sizeof s->tail + sizeof b];
	memcpy(all, s->tail, s->tail_n);
	memcpy(all + s->tail_n, b, n);
	size_t an = s->tail_n + n;
	const char *hit = memmem(all, an, s->trigger, tn);
	if (!hit) {
		size_t from = an > keep ? an - keep : 0;
		memmove(s->tail, all + from, an - from);
		s->tail_n = an - from;
		return 0;
	}
	const char *rest = hit + tn;
	size_t rn = (size_t)(all + an - rest);
	s->tail_n = 0;
	if (rn && gram_match_accept_bytes(s->gm, rest, rn) != 0)
		return 0; /* past the trigger in the same token: not under the grammar */
	s->g_on = 1;
	baton_sampler_set_mask(s->smp, s->allow);
	return follow_trigger(s, t); /* whole already: free again */
}

int generator_start(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_seq **out, char *errbuf, size_t errlen)
{
	*out = NULL;
	if (errbuf && errlen)
		errbuf[0] = '\0';
	int rc = check_request(req, errbuf, errlen);
	if (rc)
		return rc;
	struct baton_gen_seq *s = calloc(1, sizeof *s);
	if (!s)
		return BATON_ENOMEM;
	s->g = g;
	size_t n = 0;
	if ((rc = encode_prompt(g, req, &s->ids, &n, errbuf, errlen)) != 0)
		goto fail;
	uint32_t ctx = model_max_ctx(g->model);
	if (n == 0 || n >= ctx) {
		baton_errf(errbuf, errlen, "the prompt has %zu tokens; this engine's context holds %u", n, ctx);
		rc = n == 0 ? BATON_EINVAL : BATON_ERANGE;
		goto fail;
	}
	s->n_prompt = (uint32_t)n;

	/* The model's end-of-sequence ids stop it, and the caller's. */
	struct baton_sample_params sp = req->sp;
	uint32_t ns = 0;
	for (uint32_t i = 0; i < g->n_eos; i++)
		s->stops[ns++] = g->eos[i];
	for (uint32_t i = 0; i < sp.n_stop_ids && ns < sizeof s->stops / sizeof s->stops[0]; i++)
		s->stops[ns++] = sp.stop_ids[i];
	sp.stop_ids = s->stops;
	sp.n_stop_ids = ns;
	uint32_t room = ctx - (uint32_t)n;
	if (sp.max_tokens == 0 || sp.max_tokens > room)
		sp.max_tokens = room;
	s->max_tokens = sp.max_tokens;
	s->o = (struct out){ .stop = req->stop, .n_stop = req->n_stop, .fn = req->on_text, .arg = req->arg };
	char err[400] = "";
	if (!(s->toks = malloc(sizeof(uint32_t) * ((size_t)sp.max_tokens + 1)))) {
		rc = BATON_ENOMEM;
		goto fail;
	}
	if ((rc = baton_sampler_new(&sp, g->vocab, &s->smp, err, sizeof err)) != 0) {
		baton_errf(errbuf, errlen, "%s", err);
		goto fail;
	}
	if ((rc = baton_sampler_prompt(s->smp, (const uint32_t *)s->ids, n)) != 0) {
		baton_errf(errbuf, errlen, "prompt: a token outside the model's vocabulary");
		goto fail;
	}
	/* a raw prompt's completion continues its text: its first piece keeps
	 * the space a SentencePiece decoder drops at the start of a text */
	if ((rc = text_stream_open_after(&s->ts, g->tok, req->keep_special ? 0 : TEXT_SKIP_SPECIAL,
	        req->msgs ? NULL : s->ids, req->msgs ? 0 : n)) != 0)
		goto fail;
	if ((rc = test_forced(g, req, &s->forced, &s->n_forced)) != 0)
		goto fail;
	if (req->on_token) {
		s->on_token = req->on_token;
		s->arg = req->arg;
		s->n_top = req->n_top < BATON_GEN_MAX_TOP ? req->n_top : BATON_GEN_MAX_TOP;
		if (!(s->raw = malloc(sizeof(float) * g->vocab))) {
			rc = BATON_ENOMEM;
			goto fail;
		}
	}
	if (req->grammar) {
		if (!g->gv && (rc = gram_vocab_from_tok(&g->gv, g->tok, g->vocab, g->eos, g->n_eos, err,
		                   sizeof err)) != 0) {
			baton_errf(errbuf, errlen, "structured output: %s", err[0] ? err : baton_strerror(rc));
			goto fail;
		}
		if ((rc = gram_match_new(&s->gm, req->grammar, g->gv)) != 0 ||
		    !(s->allow = malloc(((size_t)g->vocab + 63) / 64 * sizeof *s->allow))) {
			rc = rc ? rc : BATON_ENOMEM;
			goto fail;
		}
		s->grammar = req->grammar;
		s->trigger = req->grammar_trigger && req->grammar_trigger[0] ? req->grammar_trigger : NULL;
		s->g_on = !s->trigger;
		if (s->trigger && strlen(s->trigger) >= sizeof s->tail / 2) {
			baton_errf(errbuf, errlen, "structured output: the trigger is longer than %zu bytes",
			    sizeof s->tail / 2 - 1);
			rc = BATON_EINVAL;
			goto fail;
		}
		baton_sampler_set_mask(s->smp, s->g_on ? s->allow : NULL);
	}
	s->t0 = baton_now_s();
	*out = s;
	return 0;
fail:
	if (errbuf && errlen && !errbuf[0])
		baton_errf(errbuf, errlen, "%s", baton_strerror(rc));
	generator_seq_free(s);
	return rc;
}

const uint32_t *generator_seq_prompt(const struct baton_gen_seq *s, uint32_t *n)
{
	*n = s->n_prompt;
	return (const uint32_t *)s->ids;
}

uint32_t generator_seq_max_tokens(const struct baton_gen_seq *s)
{
	return s->max_tokens;
}

void generator_seq_begin(struct baton_gen_seq *s)
{
	s->t0 = baton_now_s();
}

void generator_seq_cancel(struct baton_gen_seq *s)
{
	s->cancelled = 1;
	if (!s->finish)
		s->finish = "cancelled";
}

const char *generator_seq_finished(const struct baton_gen_seq *s)
{
	return s->finish;
}

/* The token's log-probability and the most likely ones, from the raw
 * logits (log-softmax; -inf logits have probability 0). */
static void report_token(struct baton_gen_seq *s, uint32_t t)
{
	const float *l = s->raw;
	uint32_t V = s->g->vocab, k = s->n_top;
	float mx = -INFINITY;
	for (uint32_t i = 0; i < V; i++)
		if (l[i] > mx)
			mx = l[i];
	double sum = 0;
	for (uint32_t i = 0; i < V && isfinite(mx); i++)
		if (isfinite(l[i]))
			sum += exp((double)l[i] - mx);
	float lse = isfinite(mx) ? (float)(mx + log(sum)) : 0;
	uint32_t ids[BATON_GEN_MAX_TOP];
	float lps[BATON_GEN_MAX_TOP];
	uint32_t n = 0;
	/* the k largest, by insertion (k <= 20); ties to the lower id */
	for (uint32_t i = 0; i < V && k; i++) {
		float x = l[i];
		if (!isfinite(x) || (n == k && x <= lps[n - 1]))
			continue;
		uint32_t j = n < k ? n++ : k - 1;
		while (j > 0 && lps[j - 1] < x) {
			lps[j] = lps[j - 1];
			ids[j] = ids[j - 1];
			j--;
		}
		lps[j] = x;
		ids[j] = i;
	}
	for (uint32_t i = 0; i < n; i++)
		lps[i] -= lse;
	float lp = isfinite(l[t]) ? l[t] - lse : -INFINITY;
	s->on_token(s->arg, t, lp, ids, lps, n);
}

int generator_seq_pick(struct baton_gen_seq *s, float *logits, char *errbuf, size_t errlen)
{
	struct baton_generator *g = s->g;
	s->pending = 0;
	if (s->finish) {
		baton_errf(errbuf, errlen, "the request has ended (%s)", s->finish);
		return BATON_ESTATE;
	}
	if (s->n_tokens == 0)
		s->t1 = baton_now_s();
	for (uint32_t i = g->tok_vocab; i < g->vocab; i++)
		logits[i] = -INFINITY; /* ids the tokenizer cannot spell */
	if (s->forced) { /* the test hook above */
		uint32_t keep = s->n_tokens < s->n_forced ? (uint32_t)s->forced[s->n_tokens] : g->eos[0];
		for (uint32_t i = 0; i < g->vocab; i++)
			if (i != keep)
				logits[i] = -INFINITY;
		logits[keep] = 0;
	}
	if (s->on_token)
		memcpy(s->raw, logits, sizeof(float) * g->vocab);
	int rc;
	if (s->gm && s->g_on) {
		/* structured output: only the tokens that keep the output a
		 * prefix of a document; the end once it is a whole one */
		bool can_end, any = false;
		if ((rc = gram_match_mask(s->gm, s->allow, &can_end)) != 0) {
			baton_errf(errbuf, errlen, "structured output: %s", baton_strerror(rc));
			return rc;
		}
		if (can_end)
			for (uint32_t i = 0; i < g->n_eos; i++)
				s->allow[g->eos[i] / 64] |= 1ull << (g->eos[i] % 64);
		for (uint32_t w = 0; w < (g->vocab + 63) / 64 && !any; w++)
			any = s->allow[w] != 0;
		if (!any) {
			if (!can_end) {
				/* a vocabulary that cannot spell what the grammar needs
				 * (a model that has no token for '"' or '{', say) */
				baton_errf(errbuf, errlen, "response_format: this model's vocabulary has no token "
				    "that can %s the document (after %u tokens): it cannot spell what the schema "
				    "needs", s->n_tokens ? "continue" : "begin", s->n_tokens);
				return BATON_EUNSUPPORTED;
			}
			s->finish = "stop"; /* whole, and the model has no end token */
			return 0;
		}
	}
	uint32_t t;
	enum baton_finish fin;
	rc = baton_sampler_next(s->smp, logits, &t, &fin);
	if (rc) {
		baton_errf(errbuf, errlen, "sampling failed: %s", baton_strerror(rc));
		return rc;
	}
	s->pending = 1;
	s->pend_t = t;
	s->pend_fin = fin;
	return 0;
}

int generator_seq_take(struct baton_gen_seq *s, uint32_t *token, char *errbuf, size_t errlen)
{
	struct baton_generator *g = s->g;
	if (!s->pending)
		return 0; /* pick ended it (or failed): nothing to take */
	s->pending = 0;
	const uint32_t t = s->pend_t;
	const enum baton_finish fin = s->pend_fin;
	int rc;
	s->toks[s->n_tokens++] = t;
	*token = t;
	if (fin == BATON_FINISH_STOP) {
		s->finish = "stop";
		return 0;
	}
	if (s->on_token)
		report_token(s, t);
	if (s->gm && s->g_on && (rc = gram_match_accept(s->gm, t)) != 0) {
		baton_errf(errbuf, errlen, "structured output: token %u was sampled outside the mask", t);
		return BATON_EINTERNAL;
	}
	if (s->gm && s->trigger && (rc = follow_trigger(s, t)) != 0) {
		baton_errf(errbuf, errlen, "structured output: %s", baton_strerror(rc));
		return rc;
	}
	if ((rc = text_stream_push(s->ts, (int32_t)t, &s->o.buf, &s->o.len, &s->o.cap)) != 0) {
		baton_errf(errbuf, errlen, "decoding token %u: %s", t, baton_strerror(rc));
		return rc;
	}
	settle(&s->o, 0);
	if (s->o.stopped)
		s->finish = "stop";
	else if (s->o.cancelled)
		s->finish = "cancelled";
	else if (fin == BATON_FINISH_LENGTH ||
	    s->n_prompt + s->n_tokens - 1 >= model_max_ctx(g->model))
		s->finish = "length"; /* the model holds no position for another token */
	return 0;
}

int generator_seq_next(struct baton_gen_seq *s, float *logits, uint32_t *token,
    char *errbuf, size_t errlen)
{
	int rc = generator_seq_pick(s, logits, errbuf, errlen);
	return rc ? rc : generator_seq_take(s, token, errbuf, errlen);
}

int generator_seq_result(struct baton_gen_seq *s, struct baton_gen_result *res,
    char *errbuf, size_t errlen)
{
	memset(res, 0, sizeof *res);
	if (!s->finish) {
		baton_errf(errbuf, errlen, "the request has not ended");
		return BATON_ESTATE;
	}
	int rc;
	const char *finish = s->finish;
	if (!s->o.stopped && !s->o.cancelled && !s->cancelled) {
		if ((rc = text_stream_finish(s->ts, &s->o.buf, &s->o.len, &s->o.cap)) != 0) {
			baton_errf(errbuf, errlen, "decoding the end: %s", baton_strerror(rc));
			return rc;
		}
		settle(&s->o, 1);
		if (s->o.stopped)
			finish = "stop";
		if (s->o.cancelled)
			finish = "cancelled";
	}
	if (!s->o.buf && !(s->o.buf = calloc(1, 1)))
		return BATON_ENOMEM;
	double end = baton_now_s();
	res->prefill_s = s->n_tokens ? s->t1 - s->t0 : end - s->t0;
	res->decode_s = s->n_tokens ? end - s->t1 : 0;
	res->text = s->o.buf;
	res->text_len = s->o.len;
	s->o.buf = NULL;
	s->o.len = s->o.cap = s->o.emitted = 0;
	res->tokens = s->toks;
	res->n_tokens = s->n_tokens;
	s->toks = NULL;
	res->n_prompt = s->n_prompt;
	res->finish = finish;
	return 0;
}

void generator_seq_free(struct baton_gen_seq *s)
{
	if (!s)
		return;
	text_stream_close(s->ts);
	baton_sampler_free(s->smp);
	gram_match_free(s->gm);
	free(s->allow);
	free(s->o.buf);
	free(s->toks);
	free(s->ids);
	free(s->forced);
	free(s->raw);
	free(s);
}

/* One request alone, on the model's own sequence: prefill, then one decode
 * per sampled token. The scheduler (sched.h) drives the same steps for
 * many requests at once. */
int generator_run(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_result *res, char *errbuf, size_t errlen)
{
	memset(res, 0, sizeof *res);
	struct baton_gen_seq *s;
	int rc = generator_start(g, req, &s, errbuf, errlen);
	if (rc)
		return rc;
	uint32_t n;
	const uint32_t *ids = generator_seq_prompt(s, &n);
	if ((rc = model_prefill(g->model, ids, n, g->logits)) != 0) {
		baton_errf(errbuf, errlen, "prefill of %u tokens failed: %s", n, baton_strerror(rc));
		goto out;
	}
	for (;;) {
		uint32_t t;
		if ((rc = generator_seq_next(s, g->logits, &t, errbuf, errlen)) != 0)
			goto out;
		if (generator_seq_finished(s))
			break;
		if ((rc = model_decode(g->model, t, g->logits)) != 0) {
			baton_errf(errbuf, errlen, "decode at position %u failed: %s", model_pos(g->model),
			    baton_strerror(rc));
			goto out;
		}
	}
	rc = generator_seq_result(s, res, errbuf, errlen);
out:
	model_reset(g->model); /* its KV blocks go back to the pool */
	generator_seq_free(s);
	return rc;
}
