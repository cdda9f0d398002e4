/*
 * batch.c: a /v1/completions prompt list or a chat's or completion's
 * n > 1 (see openai_http.h): one scheduler request per choice, one
 * answer when the last ends, a stream's chunks interleaved.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai_http.h"
#include "proto/base/base.h"

static void batch_free(struct obatch *b)
{
	json_decref(b->choices);
	pthread_mutex_destroy(&b->mu);
	free(b);
}

/* The batch's answer, once its last prompt is done (or failed to start). */
static void batch_answer(struct obatch *b, struct oreq *q)
{
	const char *type;
	if (b->opened) {
		if (b->st) {
			if (b->rc) {
				struct oai_error e;
				int status = oreq_status_of(b->rc, &type);
				oai_errorf(&e, status, type, NULL, NULL, "%s", b->err);
				size_t n;
				char *ev = oai_sse(oai_error_json(&e), &n);
				if (ev)
					http_stream_write(b->st, ev, n);
				free(ev);
			} else {
				if (b->include_usage) {
					size_t n;
					char *ev = oai_sse(oai_usage_chunk(b->kind, q->id, q->created, q->h.srv->model,
					    b->n_prompt, b->n_tokens, b->n_cached), &n);
					if (ev)
						http_stream_write(b->st, ev, n);
					free(ev);
				}
				oreq_usage_comment(q, NULL);
				http_stream_write(b->st, "data: [DONE]\n\n", 14);
			}
			http_stream_close(b->st);
		}
	} else if (b->rc) {
		struct oai_error e;
		int status = oreq_status_of(b->rc, &type);
		oai_errorf(&e, status, type, b->rc == BATON_EBUSY ? "queue_full" : NULL, NULL, "%s", b->err);
		static const char *const retry[] = { "Retry-After: 1", NULL };
		oreq_reply_error(b->r, &e, http_retry_after(status) ? retry : NULL);
	} else {
		json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:O, s:o}", "id", q->id, "object",
		    b->kind == OAI_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)q->created,
		    "model", q->h.srv->model, "choices", b->choices, "usage", oai_usage(b->n_prompt, b->n_tokens, b->n_cached));
		oreq_reply_whole(q, NULL, j);
	}
	batch_free(b);
}

/* One choice of a batch ended: its choice (or finish chunk) and counts. */
void obatch_done(struct oreq *q, int rc, const char *err, struct baton_gen_result *res)
{
	struct obatch *b = q->b;
	int cut = rc == 0 && strcmp(res->finish, "cancelled") == 0;
	if (rc == 0 && !cut && q->streaming && q->h.st)
		oreq_finish_chunk(q, res);
	json_t *choice = NULL;
	if (rc == 0 && !q->streaming) {
		json_t *j = q->h.q.kind == OAI_CHAT ? oreq_chat_whole(q, res) :
		    oreq_with_echo(q, oreq_with_lp(q, oai_reply(OAI_COMPLETION, q->id, q->created, q->h.srv->model, res)));
		choice = json_incref(json_array_get(json_object_get(j, "choices"), 0));
		json_decref(j);
		if (choice)
			json_object_set_new(choice, "index", json_integer(q->index));
	}
	pthread_mutex_lock(&b->mu);
	if (rc && !b->rc) {
		b->rc = rc;
		snprintf(b->err, sizeof b->err, "prompt %d: %s", q->index, err && err[0] ? err : baton_strerror(rc));
	}
	if (rc == 0) {
		b->n_prompt += q->copy == 0 ? res->n_prompt : 0;
		b->n_tokens += res->n_tokens;
		b->n_cached += q->copy == 0 ? res->n_cached : 0; /* of the prompt counted once */
		if (q->h.tm.t_first > 0 && (b->t_first <= 0 || q->h.tm.t_first < b->t_first))
			b->t_first = q->h.tm.t_first;
		const char *fin = res->finish ? res->finish : "stop";
		if (!b->finish[0] || strcmp(fin, "length") == 0)
			snprintf(b->finish, sizeof b->finish, "%s", fin);
	}
	if (choice)
		json_array_set_new(b->choices, (size_t)q->index, choice);
	int last = --b->left == 0;
	pthread_mutex_unlock(&b->mu);
	if (last)
		batch_answer(b, q);
	generator_result_free(res);
	oreq_free(q);
}

/* A batch's prompts: one client gone cancels them all (the id packs the
 * first and the count). */
static void on_gone_batch(void *owner, uint64_t packed)
{
	uint64_t first = packed & ((1ull << 48) - 1), n = packed >> 48;
	for (uint64_t i = 0; i < n; i++)
		sched_cancel(owner, first + i);
}

/* A batch: "prompt": [p0, p1, ...] (prompts NULL: the body's one) times
 * n: each choice parsed as the body with its prompt and n 1, a seeded
 * request's copy j > 0 on its own seed (copy 0 is the n: 1 answer), all
 * submitted. */
void obatch_submit(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind, json_t *root,
    json_t *prompts, size_t n_copies)
{
	size_t n_prompts = prompts ? json_array_size(prompts) : 1, n = n_prompts * n_copies;
	struct oai_error e;
	if (prompts && n_prompts > OAI_MAX_BATCH) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, "prompt", "prompt: %zu prompts in one request; at "
		    "most %u", n_prompts, OAI_MAX_BATCH);
		oai_sv_refused(s, 400, 0);
		oreq_reply_error(r, &e, NULL);
		return;
	}
	if (n > OAI_MAX_BATCH) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, "n", "n: %zu prompts times n %zu is %zu choices; at most "
		    "%u in one request", n_prompts, n_copies, n, OAI_MAX_BATCH);
		oai_sv_refused(s, 400, 0);
		oreq_reply_error(r, &e, NULL);
		return;
	}
	struct oreq *qs[OAI_MAX_BATCH];
	json_t *all = json_incref(prompts);
	if (n_copies > 1)
		json_object_set_new(root, "n", json_integer(1));
	size_t k;
	for (k = 0; k < n; k++) {
		size_t pi = k / n_copies;
		if (prompts)
			json_object_set(root, "prompt", json_array_get(all, pi));
		char *b1 = json_dumps(root, JSON_COMPACT);
		qs[k] = b1 ? oreq_prepare(s, r, kind, b1, strlen(b1), &e) : NULL;
		if (!b1)
			oai_errorf(&e, 500, "server_error", NULL, NULL, "out of memory");
		free(b1);
		if (!qs[k]) {
			if (prompts && strcmp(e.param, "prompt") == 0) { /* which prompt: in param and words */
				char m[sizeof e.message];
				const char *rest = strncmp(e.message, "prompt", 6) == 0 ? e.message + 6 : e.message;
				snprintf(m, sizeof m, "prompt[%zu]%.480s", pi, rest);
				memcpy(e.message, m, sizeof m);
				snprintf(e.param, sizeof e.param, "prompt[%zu]", pi);
			}
			break;
		}
		qs[k]->copy = (int)(k % n_copies);
		if (qs[k]->copy && qs[k]->h.q.seeded)
			qs[k]->h.q.q.sp.seed += (uint64_t)qs[k]->copy * 0x9e3779b97f4a7c15ull;
	}
	json_decref(all);
	struct obatch *b = k == n ? calloc(1, sizeof *b) : NULL;
	if (!b) {
		for (size_t i = 0; i < k; i++)
			oreq_free(qs[i]);
		if (k == n)
			oai_errorf(&e, 500, "server_error", NULL, NULL, "out of memory");
		oai_sv_refused(s, e.status, 0);
		oreq_reply_error(r, &e, NULL);
		return;
	}
	pthread_mutex_init(&b->mu, NULL);
	b->r = r;
	b->n = b->left = (int)n;
	b->include_usage = qs[0]->h.q.include_usage;
	b->kind = kind;
	b->t_in = qs[0]->h.tm.t_in;
	b->choices = json_array();
	for (size_t i = 0; i < n; i++) {
		json_array_append_new(b->choices, json_null());
		qs[i]->b = b;
		qs[i]->index = (int)i;
		memcpy(qs[i]->id, qs[0]->id, sizeof qs[i]->id);
		qs[i]->created = qs[0]->created;
	}
	uint64_t first = sched_new_ids(s->o.sched, (uint32_t)n);
	http_req_on_gone(r, on_gone_batch, s->o.sched, first | ((uint64_t)n << 48));
	/* all at once, all or none: the scheduler admits the copies in one
	 * step, so those after the first follow its read of the prompt */
	const struct baton_gen_request **reqs = calloc(n, sizeof *reqs);
	struct sched_cb *cbs = calloc(n, sizeof *cbs);
	uint64_t *ids = calloc(n, sizeof *ids);
	int rc = reqs && cbs && ids ? 0 : BATON_ENOMEM;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		reqs[i] = &qs[i]->h.q.q;
		cbs[i] = oreq_callbacks(qs[i]);
		ids[i] = first + i;
	}
	if (rc == 0)
		rc = sched_submit_many(s->o.sched, reqs, cbs, ids, n);
	free(reqs);
	free(cbs);
	free(ids);
	if (rc == 0)
		return;
	/* none started: the batch fails now */
	pthread_mutex_lock(&b->mu);
	if (!b->rc) {
		b->rc = rc;
		snprintf(b->err, sizeof b->err, "%s", rc == BATON_EBUSY ? "the engine's queue of waiting requests "
		    "is full; retry later" : rc == BATON_ENOMEM ? "out of memory" : "the engine is shutting down");
	}
	b->left -= (int)n;
	int last = b->left == 0;
	oai_sv_refused(s, 503, rc);
	pthread_mutex_unlock(&b->mu);
	struct oreq *q0 = qs[0];
	for (size_t j = 1; j < n; j++)
		oreq_free(qs[j]);
	if (last)
		batch_answer(b, q0);
	oreq_free(q0);
}
