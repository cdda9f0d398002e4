/*
 * request.c: the requests that compute (see serve_int.h): GEN, the
 * synthetic decode loop run on the receiver's thread inside the work
 * bracket, and COMPLETE, text in and text out through the scheduler
 * like the OpenAI API's requests, its body parsed by the same parser.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/serve_int.h"

void serve_on_gen(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req)
{
	uint64_t n = (uint64_t)req->batch * s->d_model;
	if (req->steps == 0 || req->steps > BATON_GEN_MAX_STEPS || req->batch == 0 ||
	    req->batch > BATON_GEN_MAX_BATCH) {
		serve_reply_err(s, ctx, req, BATON_ERANGE, "gen: steps must be 1..%u and batch 1..%u",
		    BATON_GEN_MAX_STEPS, BATON_GEN_MAX_BATCH);
		return;
	}
	if (proto_has(req, PF_INPUT) && req->input.len != n * sizeof(float)) {
		serve_reply_err(s, ctx, req, BATON_ERANGE, "gen: input has %zu bytes, want batch*d_model*4 = %" PRIu64,
		    req->input.len, n * sizeof(float));
		return;
	}
	float *out = malloc(n * sizeof(float));
	if (!out) {
		serve_reply_err(s, ctx, req, BATON_ENOMEM, "gen: no memory for the output");
		return;
	}
	if (serve_work_begin(s, ctx, req) != 0) {
		free(out);
		return;
	}
	uint64_t sum = 0;
	struct baton_gen_timings t;
	int rc = engine_gen(s->e, req->steps, req->batch, req->seed,
	    proto_has(req, PF_INPUT) ? req->input.data : NULL, out, &sum, &t);
	int rest = serve_work_done(s, rc == 0);
	/* The bracket ends before the reply (the refill of the rest after an
	 * idle release too): a reply means the engine takes the next
	 * operation (a RELEASE sent on it was refused as busy, 11 in 160). */
	serve_work_end(s, rest);
	if (rc) {
		if (rc == BATON_EUNSUPPORTED && s->info.compute_error)
			serve_reply_err(s, ctx, req, rc, "gen: %s", s->info.compute_error);
		else
			serve_reply_err(s, ctx, req, rc, "gen failed: %s", baton_strerror(rc));
	} else {
		struct baton_msg rep;
		proto_reply_init(&rep, req);
		rep.steps = req->steps;
		rep.batch = req->batch;
		rep.checksum = sum;
		rep.output.data = out;
		rep.output.len = n * sizeof(float);
		rep.route_ms = t.route_s * 1e3;
		rep.load_ms = t.load_s * 1e3;
		rep.compute_ms = t.compute_s * 1e3;
		rep.total_ms = t.total_s * 1e3;
		proto_set(&rep, PF_ROUTE_MS);
		proto_set(&rep, PF_LOAD_MS);
		proto_set(&rep, PF_COMPUTE_MS);
		proto_set(&rep, PF_TOTAL_MS);
		serve_reply(s, ctx, &rep);
	}
	free(out);
}

/* COMPLETE: text in, text out through the scheduler (sched.h), like the
 * HTTP API's requests. The request is checked before it waits; the
 * receiver waits for its answer (its nng context answers one at a time). */
struct complete_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, rc;
	char err[512];
	struct baton_gen_result res;
};

static void complete_done(void *arg, int rc, const char *err, struct baton_gen_result *res)
{
	struct complete_wait *w = arg;
	pthread_mutex_lock(&w->mu);
	w->rc = rc;
	snprintf(w->err, sizeof w->err, "%s", err ? err : "");
	if (res)
		w->res = *res;
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

void serve_on_complete(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req)
{
	if (!s->gen) {
		serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED, "complete: %s", s->gen_error);
		return;
	}
	/* the HTTP API's parser (openai.h); unseeded, the sampler's default
	 * seed: a COMPLETE repeats (the HTTP API draws a random one) */
	struct oai_request c;
	struct oai_error oe;
	if (oai_parse(OAI_AUTO, s->model_name, req->body, strlen(req->body),
	        baton_sample_defaults().seed, &c, &oe) != 0) {
		serve_reply_err(s, ctx, req, oai_error_code(&oe), "complete: %s", oe.message);
		return;
	}
	struct oai_caps caps;
	oai_caps_of(generator_chat_template(s->gen), &caps);
	if (oai_bind(&c, &caps, &oe) != 0) {
		oai_request_free(&c);
		serve_reply_err(s, ctx, req, oai_error_code(&oe), "complete: %s", oe.message);
		return;
	}
	if (c.logprobs || c.echo || c.n > 1) {
		const char *what = c.logprobs ? "logprobs" : c.echo ? "echo" : "n > 1";
		oai_request_free(&c);
		serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED, "complete: %s: the complete op answers text and "
		    "tokens only (ask over the OpenAI API, --http)", what);
		return;
	}
	if (c.stream) {
		oai_request_free(&c);
		serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED, "complete: stream: the complete op answers whole "
		    "(stream over the OpenAI API, --http)");
		return;
	}
	struct complete_wait w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct sched_cb cb = { .on_done = complete_done, .arg = &w };
	double t0 = baton_now_s();
	int rc = sched_submit(s->sched, &c.q, &cb, NULL);
	if (rc) {
		oai_request_free(&c);
		serve_reply_err(s, ctx, req, rc, "complete: %s", rc == BATON_EBUSY ?
		    "the engine's queue of waiting requests is full; try again" : "the engine is shutting down");
		return;
	}
	pthread_mutex_lock(&w.mu);
	while (!w.done)
		pthread_cond_wait(&w.cv, &w.mu);
	pthread_mutex_unlock(&w.mu);
	struct baton_gen_result *res = &w.res;
	if (w.rc) {
		serve_reply_err(s, ctx, req, w.rc, "complete: %s", w.err);
	} else {
		uint8_t *ids = malloc((size_t)res->n_tokens * 4 + 1);
		if (!ids) {
			serve_reply_err(s, ctx, req, BATON_ENOMEM, "complete: no memory for the serve_reply");
		} else {
			for (uint32_t i = 0; i < res->n_tokens; i++)
				for (int b = 0; b < 4; b++)
					ids[i * 4 + b] = (uint8_t)(res->tokens[i] >> (8 * b));
			struct baton_msg rep;
			proto_reply_init(&rep, req);
			rep.text = res->text;
			rep.tokens.data = ids;
			rep.tokens.len = (size_t)res->n_tokens * 4;
			rep.prompt_tokens = res->n_prompt;
			rep.completion_tokens = res->n_tokens;
			rep.finish_reason = res->finish;
			rep.prefill_ms = res->prefill_s * 1e3;
			rep.decode_ms = res->decode_s * 1e3;
			rep.total_ms = (baton_now_s() - t0) * 1e3;
			proto_set(&rep, PF_PREFILL_MS);
			proto_set(&rep, PF_DECODE_MS);
			proto_set(&rep, PF_TOTAL_MS);
			serve_reply(s, ctx, &rep);
			free(ids);
		}
	}
	generator_result_free(res);
	oai_request_free(&c);
}
