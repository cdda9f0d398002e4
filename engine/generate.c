/*
 * generate.c: a generator: tokenizer, chat template, model and sampler of
 * one engine, and the request loop that joins them (see generate.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "arena/arena.h"
#include "engine/generate.h"
#include "engine/model.h"
#include "proto/err.h"

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
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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
	json_t *root = json_loadb(data, (size_t)len, 0, NULL);
	json_t *v = root ? json_object_get(root, "eos_token_id") : NULL;
	if (json_is_integer(v))
		add_eos(g, json_integer_value(v));
	else if (json_is_array(v)) {
		size_t i;
		json_t *x;
		json_array_foreach(v, i, x)
			if (json_is_integer(x))
				add_eos(g, json_integer_value(x));
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
		.bos_token = text_token_text(g->tok, text_bos(g->tok)),
		.eos_token = text_token_text(g->tok, text_eos(g->tok)),
		.add_generation_prompt = true,
		.enable_thinking = req->enable_thinking,
	};
	char *rendered = NULL;
	rc = text_chat_render(g->tmpl, req->msgs, req->n_msgs, &o, &rendered, err, sizeof err);
	if (rc) {
		baton_errf(errbuf, errlen, "chat template: %s", err);
		return rc;
	}
	rc = text_encode(g->tok, rendered, strlen(rendered), 0, ids, n, err, sizeof err);
	free(rendered);
	if (rc)
		baton_errf(errbuf, errlen, "messages: %s", err);
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
	if ((req->prompt == NULL) == (req->msgs == NULL)) {
		baton_errf(errbuf, errlen, "give exactly one of a prompt and messages");
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

int generator_run(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_result *res, char *errbuf, size_t errlen)
{
	memset(res, 0, sizeof *res);
	int rc = check_request(req, errbuf, errlen);
	if (rc)
		return rc;
	int32_t *ids = NULL;
	size_t n = 0;
	if ((rc = encode_prompt(g, req, &ids, &n, errbuf, errlen)) != 0)
		return rc;
	uint32_t ctx = model_max_ctx(g->model);
	if (n == 0 || n >= ctx) {
		baton_errf(errbuf, errlen, "the prompt has %zu tokens; this engine's context holds %u", n, ctx);
		free(ids);
		return n == 0 ? BATON_EINVAL : BATON_ERANGE;
	}

	/* The model's end-of-sequence ids stop it, and the caller's. */
	struct baton_sample_params sp = req->sp;
	uint32_t stops[MAX_EOS + 64];
	uint32_t ns = 0;
	for (uint32_t i = 0; i < g->n_eos; i++)
		stops[ns++] = g->eos[i];
	for (uint32_t i = 0; i < sp.n_stop_ids && ns < sizeof stops / sizeof stops[0]; i++)
		stops[ns++] = sp.stop_ids[i];
	sp.stop_ids = stops;
	sp.n_stop_ids = ns;
	uint32_t room = ctx - (uint32_t)n;
	if (sp.max_tokens == 0 || sp.max_tokens > room)
		sp.max_tokens = room;

	struct baton_sampler *smp = NULL;
	text_stream *ts = NULL;
	struct out o = { .stop = req->stop, .n_stop = req->n_stop, .fn = req->on_text, .arg = req->arg };
	uint32_t *toks = malloc(sizeof(uint32_t) * ((size_t)sp.max_tokens + 1));
	char err[400] = "";
	if (!toks) {
		rc = BATON_ENOMEM;
		goto out;
	}
	if ((rc = baton_sampler_new(&sp, g->vocab, &smp, err, sizeof err)) != 0) {
		baton_errf(errbuf, errlen, "%s", err);
		goto out;
	}
	if ((rc = baton_sampler_prompt(smp, (const uint32_t *)ids, n)) != 0) {
		baton_errf(errbuf, errlen, "prompt: a token outside the model's vocabulary");
		goto out;
	}
	if ((rc = text_stream_open(&ts, g->tok, TEXT_SKIP_SPECIAL)) != 0)
		goto out;

	double t0 = now_s();
	if ((rc = model_prefill(g->model, (const uint32_t *)ids, (uint32_t)n, g->logits)) != 0) {
		baton_errf(errbuf, errlen, "prefill of %zu tokens failed: %s", n, baton_strerror(rc));
		goto out;
	}
	double t1 = now_s();
	res->prefill_s = t1 - t0;
	const char *finish = "length";
	for (;;) {
		for (uint32_t i = g->tok_vocab; i < g->vocab; i++)
			g->logits[i] = -INFINITY; /* ids the tokenizer cannot spell */
		uint32_t t;
		enum baton_finish fin;
		if ((rc = baton_sampler_next(smp, g->logits, &t, &fin)) != 0) {
			baton_errf(errbuf, errlen, "sampling failed: %s", baton_strerror(rc));
			goto out;
		}
		toks[res->n_tokens++] = t;
		if (fin == BATON_FINISH_STOP) {
			finish = "stop";
			break;
		}
		if ((rc = text_stream_push(ts, (int32_t)t, &o.buf, &o.len, &o.cap)) != 0)
			goto out;
		settle(&o, 0);
		if (o.stopped) {
			finish = "stop";
			break;
		}
		if (o.cancelled) {
			finish = "cancelled";
			break;
		}
		if (fin == BATON_FINISH_LENGTH || model_pos(g->model) >= ctx)
			break;
		if ((rc = model_decode(g->model, t, g->logits)) != 0) {
			baton_errf(errbuf, errlen, "decode at position %u failed: %s", model_pos(g->model),
			    baton_strerror(rc));
			goto out;
		}
	}
	if (!o.stopped && !o.cancelled) {
		if ((rc = text_stream_finish(ts, &o.buf, &o.len, &o.cap)) != 0)
			goto out;
		settle(&o, 1);
		if (o.stopped)
			finish = "stop";
	}
	res->decode_s = now_s() - t1;
	if (!o.buf && !(o.buf = calloc(1, 1))) {
		rc = BATON_ENOMEM;
		goto out;
	}
	res->text = o.buf;
	res->text_len = o.len;
	o.buf = NULL;
	res->tokens = toks;
	toks = NULL;
	res->n_prompt = (uint32_t)n;
	res->finish = o.cancelled ? "cancelled" : finish;
out:
	if (rc) {
		res->n_tokens = 0;
		if (errbuf && errlen && !errbuf[0])
			baton_errf(errbuf, errlen, "%s", baton_strerror(rc));
	}
	text_stream_close(ts);
	baton_sampler_free(smp);
	free(o.buf);
	free(toks);
	free(ids);
	return rc;
}
