/*
 * face.c: a request of another face (Ollama's, Anthropic's: face.h) run
 * through the OpenAI path's parser and the scheduler, its answer split
 * into content, reasoning and tool calls as openai_http.c splits a chat's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/serve/face.h"
#include "engine/serve/sched.h"
#include "proto/base/base.h"

void face_random_id(char *out, size_t n)
{
	static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	uint64_t x = oai_random64();
	for (size_t i = 0; i + 1 < n; i++) {
		if (i % 10 == 9)
			x = oai_random64();
		out[i] = abc[x % 62];
		x /= 62;
	}
	if (n)
		out[n - 1] = 0;
}

int64_t face_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void face_time(int64_t ns, char *out, size_t n)
{
	time_t t = (time_t)(ns / 1000000000);
	struct tm tm;
	gmtime_r(&t, &tm);
	char day[32];
	strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, n, "%s.%09lldZ", day, (long long)(ns % 1000000000));
}

static void face_free(struct face_req *f)
{
	oai_live_free(&f->h);
	free(f->arg);
	free(f);
}

/* A piece of the split: a stream's goes to the face at once, a whole
 * answer's is kept. */
static void on_piece(void *arg, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c)
{
	struct face_req *f = arg;
	if (f->stream) {
		if (!f->h.write_failed)
			f->ops->piece(f, k, t, n, c);
		return;
	}
	if (k == OAI_P_TOOL || k == OAI_P_TOOL_START) {
		if (!f->h.calls)
			f->h.calls = json_array();
		if (json_array_append_new(f->h.calls, json_pack("{s:s, s:s, s:s}", "id", c->id, "name", c->name,
		    "arguments", c->args ? c->args : "")))
			f->h.write_failed = 1;
	} else if (k == OAI_P_TOOL_ARGS) {
		json_t *call = json_array_get(f->h.calls, (size_t)c->index), *a = json_object_get(call, "arguments");
		struct oai_buf b = { 0 };
		if (!json_is_string(a) || oai_buf_put(&b, json_string_value(a), json_string_length(a)) ||
		    oai_buf_put(&b, t, n) || json_object_set_new(call, "arguments", json_stringn(b.p, b.n)))
			f->h.write_failed = 1;
		free(b.p);
	} else if (oai_buf_put(k == OAI_P_CONTENT ? &f->h.content : &f->h.reasoning, t, n)) {
		f->h.write_failed = 1;
	}
}

static void start_split(struct face_req *f)
{
	if (!f->h.split_started++ && f->h.think_open)
		oai_split_thinking(&f->h.sp);
}

static void on_admit(void *arg)
{
	struct face_req *f = arg;
	oai_sv_admit(f->h.srv, &f->h.tm);
	if (f->ops->admit)
		f->ops->admit(f);
}

static int on_text(void *arg, const char *text, size_t len)
{
	struct face_req *f = arg;
	if (!f->stream)
		return 0;
	if (f->h.write_failed)
		return 1; /* the client is gone: cancel */
	if (f->h.split_on) {
		start_split(f);
		return oai_split_push(&f->h.sp, text, len) != 0 || f->h.write_failed;
	}
	f->ops->piece(f, OAI_P_CONTENT, text, len, NULL);
	return f->h.write_failed;
}

static void on_token_time(void *arg)
{
	struct face_req *f = arg;
	oai_sv_token(f->h.srv, &f->h.tm);
}

static void on_done(void *arg, int rc, const char *err, struct baton_gen_result *res)
{
	struct face_req *f = arg;
	oai_sv_done(f->h.srv, &f->h.tm, rc, res, f->stream);
	if (rc == 0) {
		if (f->h.split_on) {
			start_split(f);
			if ((!f->stream && oai_split_push(&f->h.sp, res->text, res->text_len)) || oai_split_finish(&f->h.sp))
				f->h.write_failed = 1;
		} else if (!f->stream && oai_buf_put(&f->h.content, res->text, res->text_len)) {
			f->h.write_failed = 1;
		}
		if (f->h.write_failed && !f->stream) {
			rc = BATON_ENOMEM;
			err = "out of memory";
		}
	}
	f->ops->done(f, rc, err && err[0] ? err : rc ? baton_strerror(rc) : NULL, rc ? NULL : res);
	generator_result_free(res);
	face_free(f);
}

static void on_gone(void *owner, uint64_t id)
{
	sched_cancel(owner, id);
}

int face_submit(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind, json_t *body, int stream,
    const struct face_ops *ops, void *arg, struct oai_error *e)
{
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	struct face_req *f = text ? calloc(1, sizeof *f) : NULL;
	if (!f) {
		free(text);
		free(arg);
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	f->arg = arg;
	int rc = oai_parse(kind, oai_server_model(s), text, strlen(text), oai_random64(), &f->h.q, e);
	free(text);
	if (rc) {
		free(arg);
		free(f);
		oai_sv_refused(s, e->status, 0);
		return e->status;
	}
	const struct oai_caps *caps = oai_server_caps(s);
	if (oai_bind(&f->h.q, caps, e) != 0) {
		face_free(f);
		oai_sv_refused(s, e->status, 0);
		return e->status;
	}
	oai_live_split(&f->h, caps, on_piece, f);
	f->h.srv = s;
	f->h.r = r;
	f->ops = ops;
	f->stream = stream;
	f->door = http_req_header(r, "X-Baton-Usage") != NULL;
	f->t0 = baton_now_s();
	f->h.tm.t_in = f->t0;
	f->created_ns = face_now_ns();
	f->h.q.q.on_text = on_text;
	f->h.q.q.arg = f;
	f->h.q.q.think_open = &f->h.think_open;
	struct baton_sched *sc = oai_server_sched(s);
	struct sched_cb cb = { .on_text = on_text, .on_admit = on_admit, .on_token = on_token_time, .on_done = on_done,
		.arg = f };
	uint64_t sid = sched_new_id(sc);
	http_req_on_gone(r, on_gone, sc, sid);
	rc = sched_submit(sc, &f->h.q.q, &cb, &sid);
	if (rc) {
		face_free(f);
		oai_sv_refused(s, 503, rc);
		return oai_errorf(e, 503, "server_error", rc == BATON_EBUSY ? "queue_full" : NULL, NULL, "%s",
		    rc == BATON_EBUSY ? "the engine's queue of waiting requests is full; retry later" :
		    "the engine is shutting down");
	}
	return 0;
}

void face_reply_whole(struct face_req *f, const struct baton_gen_result *res, json_t *j)
{
	char rep[200];
	if (f->door)
		oai_usage_report(&f->h.tm, res->n_prompt, res->n_tokens, res->finish, rep, sizeof rep);
	oai_reply_usage(f->h.r, f->door ? rep : NULL, j);
}

void face_usage_comment(struct face_req *f, const struct baton_gen_result *res)
{
	if (!f->door || !f->h.st)
		return;
	char rep[200];
	oai_usage_report(&f->h.tm, res->n_prompt, res->n_tokens, res->finish, rep, sizeof rep);
	oai_usage_comment(f->h.st, rep);
}

const char *face_stop_string(struct face_req *f, const struct baton_gen_result *res)
{
	const text_tok *tok = oai_server_tok(f->h.srv);
	if (!res || strcmp(res->finish, "stop") != 0 || !f->h.q.q.n_stop || !tok || !res->n_tokens)
		return NULL;
	int32_t *ids = malloc(res->n_tokens * sizeof *ids);
	char *all = NULL, err[64];
	size_t n = 0;
	const char *hit = NULL;
	for (uint32_t i = 0; ids && i < res->n_tokens; i++)
		ids[i] = (int32_t)res->tokens[i];
	/* the decoded tokens go on past the text with the stop string (the
	 * text ends where it begins) */
	if (ids && text_decode(tok, ids, res->n_tokens, 0, &all, &n, err, sizeof err) == 0) {
		const char *tail = n >= res->text_len && memcmp(all, res->text, res->text_len) == 0 ?
		    all + res->text_len : NULL;
		for (size_t i = 0; tail && !hit && i < f->h.q.q.n_stop; i++)
			if (strncmp(tail, f->h.q.q.stop[i], strlen(f->h.q.q.stop[i])) == 0)
				hit = f->h.q.q.stop[i];
		/* the text may not be a prefix (a decoder's spacing): look for it anywhere after */
		for (size_t i = 0; !tail && !hit && i < f->h.q.q.n_stop; i++)
			if (strstr(all, f->h.q.q.stop[i]))
				hit = f->h.q.q.stop[i];
	}
	free(ids);
	free(all);
	return hit;
}
