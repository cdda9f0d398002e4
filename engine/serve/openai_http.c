/*
 * openai_http.c: the OpenAI-compatible API on the engine's --http address
 * (see openai.h, docs/reference/openai.md). A request is parsed on an HTTP worker
 * thread and handed to the scheduler; its answer is written from the
 * scheduler's thread: whole when it ends, or streamed as server-sent
 * events, a chunk per piece of text as it becomes final. A client that
 * goes away cancels its request at once (its KV blocks go back). A batch
 * (n > 1, a prompt list) is batch.c's, the usage report usage.c's, a
 * /v1/responses request's end responses.c's (openai_http.h).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "engine/serve/face.h"
#include "engine/serve/openai_http.h"
#include "engine/serve/sched.h"
#include "http/http.h"
#include "proto/base/base.h"

uint64_t oai_random64(void)
{
	uint64_t x = 0;
	if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec;
	}
	return x;
}

/* ---- the head every face's request begins with (openai.h) ---- */

void oai_live_split(struct oai_live *h, const struct oai_caps *c, oai_piece_fn fn, void *arg)
{
	if (h->q.kind != OAI_CHAT)
		return;
	enum oai_tool_format f = !h->q.tools ? OAI_TOOLS_NONE : h->q.tool_choice == OAI_TC_AUTO ? c->tools :
	    h->q.tool_choice == OAI_TC_NAMED ? OAI_TOOLS_FORCED_NAMED :
	    h->q.tool_choice == OAI_TC_REQUIRED ? OAI_TOOLS_FORCED_ARRAY : OAI_TOOLS_NONE;
	int think = c->think && f != OAI_TOOLS_FORCED_NAMED && f != OAI_TOOLS_FORCED_ARRAY;
	h->split_on = f != OAI_TOOLS_NONE || think;
	oai_split_init(&h->sp, f, think, h->q.parallel_tool_calls, h->q.tools, oai_random64(), fn, arg);
	h->sp.forced_name = h->q.tool_name;
}

void oai_live_free(struct oai_live *h)
{
	oai_request_free(&h->q);
	oai_split_free(&h->sp);
	free(h->content.p);
	free(h->reasoning.p);
	json_decref(h->calls);
}

void oreq_reply_error(struct baton_http_req *r, const struct oai_error *e, const char *const *headers)
{
	json_t *j = oai_error_json(e);
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!body) {
		http_reply(r, 500, "text/plain", "out of memory\n", 14, NULL);
		return;
	}
	http_reply(r, e->status, "application/json", body, strlen(body), headers);
	free(body);
}

void oreq_free(struct oreq *q)
{
	oai_live_free(&q->h);
	json_decref(q->lp);
	free(q->echo);
	oai_resp_free(q->resp);
	free(q);
}

/* echo: the prompt before the completion in a whole reply. */
json_t *oreq_with_echo(struct oreq *q, json_t *j)
{
	json_t *c = json_array_get(json_object_get(j, "choices"), 0), *t = json_object_get(c, "text");
	if (!q->echo || !json_is_string(t))
		return j;
	size_t n = json_string_length(t);
	char *both = malloc(q->echo_len + n + 1);
	if (both) {
		memcpy(both, q->echo, q->echo_len);
		memcpy(both + q->echo_len, json_string_value(t), n);
		json_object_set_new(c, "text", json_stringn(both, q->echo_len + n));
		free(both);
	}
	return j;
}

/* ---- logprobs ---- */

/* A token's text as it reads after the previous one (its own space kept). */
static json_t *token_text(const text_tok *t, int32_t prev, int32_t id)
{
	int32_t two[2] = { prev, id };
	char *a = NULL, *b = NULL, err[64];
	size_t al = 0, bl = 0;
	json_t *j = NULL;
	if (prev < 0) {
		if (text_decode(t, &id, 1, 0, &b, &bl, err, sizeof err) == 0)
			j = json_stringn(b, bl);
	} else if (text_decode(t, two, 2, 0, &b, &bl, err, sizeof err) == 0 &&
	    text_decode(t, &prev, 1, 0, &a, &al, err, sizeof err) == 0 && al <= bl && memcmp(a, b, al) == 0) {
		j = json_stringn(b + al, bl - al);
	}
	free(a);
	free(b);
	return j ? j : json_string("");
}

static json_t *bytes_of(json_t *s)
{
	json_t *a = json_array();
	const unsigned char *p = (const unsigned char *)json_string_value(s);
	for (size_t i = 0; p && i < json_string_length(s); i++)
		json_array_append_new(a, json_integer(p[i]));
	return a;
}

/* OpenAI's "bytes" of a token: its text's, or where its text is not whole
 * (a character split across tokens reads as U+FFFD, or as nothing after
 * such a token) the token's own bytes, so that a client that joins them
 * has the character again. */
static json_t *token_bytes(const text_tok *t, int32_t id, json_t *text)
{
	char b[256];
	size_t n = 0;
	if ((json_string_length(text) && !strstr(json_string_value(text), "\xef\xbf\xbd")) ||
	    text_token_bytes(t, id, b, sizeof b, &n) != 0 ||
	    n > sizeof b)
		return bytes_of(text);
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer((unsigned char)b[i]));
	return a;
}

/* JSON has no -inf: vLLM's stand-in. */
static double finite_lp(float x)
{
	return isfinite(x) ? (double)x : -9999.0;
}

static void on_token(void *arg, uint32_t id, float logprob, const uint32_t *top_ids, const float *top_lps,
    uint32_t n_top)
{
	struct oreq *q = arg;
	const text_tok *t = q->h.srv->o.tok;
	json_t *tx = token_text(t, q->lp_prev, (int32_t)id);
	if (q->h.q.kind == OAI_CHAT) {
		if (!q->lp)
			q->lp = json_array();
		json_t *top = json_array();
		for (uint32_t i = 0; i < n_top; i++) {
			json_t *a = token_text(t, q->lp_prev, (int32_t)top_ids[i]);
			json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", a, "logprob", finite_lp(top_lps[i]),
			    "bytes", token_bytes(t, (int32_t)top_ids[i], a)));
		}
		json_array_append_new(q->lp, json_pack("{s:O, s:f, s:o, s:o}", "token", tx, "logprob",
		    finite_lp(logprob), "bytes", token_bytes(t, (int32_t)id, tx), "top_logprobs", top));
	} else {
		if (!q->lp)
			q->lp = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs",
			    "text_offset");
		json_t *top = json_object();
		for (uint32_t i = 0; i < n_top; i++) {
			json_t *a = token_text(t, q->lp_prev, (int32_t)top_ids[i]);
			if (!json_object_get(top, json_string_value(a)))
				json_object_set_new(top, json_string_value(a), json_real(finite_lp(top_lps[i])));
			json_decref(a);
		}
		json_array_append(json_object_get(q->lp, "tokens"), tx);
		json_array_append_new(json_object_get(q->lp, "token_logprobs"), json_real(finite_lp(logprob)));
		json_array_append_new(json_object_get(q->lp, "top_logprobs"), top);
		json_array_append_new(json_object_get(q->lp, "text_offset"), json_integer((json_int_t)q->lp_offset));
		q->lp_offset += json_string_length(tx);
	}
	json_decref(tx);
	q->lp_prev = (int32_t)id;
}

/* The entries so far go with this chunk (or whole reply): its choice's
 * logprobs. */
json_t *oreq_with_lp(struct oreq *q, json_t *j)
{
	if (!q->h.q.logprobs || !j)
		return j;
	json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
	if (!choice)
		return j;
	json_t *lp = q->lp;
	q->lp = NULL;
	if (!lp)
		lp = q->h.q.kind == OAI_CHAT ? json_array() : json_pack("{s:[], s:[], s:[], s:[]}", "tokens",
		    "token_logprobs", "top_logprobs", "text_offset");
	json_object_set_new(choice, "logprobs", q->h.q.kind == OAI_CHAT ? json_pack("{s:o, s:n}", "content", lp,
	    "refusal") : lp);
	return j;
}


/* The HTTP status of a scheduler's or generator's error (http.h's one
 * table) and its OpenAI type (a 4xx is the request's fault, as OpenAI's
 * own API says invalid_request_error for a missing model too). */
int oreq_status_of(int rc, const char **type)
{
	int status = http_status_of(rc);
	*type = status >= 500 ? "server_error" : "invalid_request_error";
	return status;
}

/* ---- the serving metrics and the access log ---- */

static void sv_end(struct oai_server *s, enum baton_sv_end e)
{
	pthread_mutex_lock(&s->mmu);
	s->sv.end[e]++;
	pthread_mutex_unlock(&s->mmu);
}

/* A request refused or failed with this status before it ran: counted,
 * and its access-log line. */
void oai_sv_refused(struct oai_server *s, int status, int rc)
{
	sv_end(s, rc == BATON_EBUSY ? BATON_SV_QUEUE_FULL : status < 500 ? BATON_SV_BAD_REQUEST : BATON_SV_FAILED);
	if (s->o.log && !s->o.no_access_log) {
		char line[256];
		snprintf(line, sizeof line, "access: model=%s status=%d prompt_tokens=0 completion_tokens=0 ttft_ms=0.0 "
		    "duration_ms=0.0 finish=%s stream=0", s->model, status, rc == BATON_EBUSY ? "queue_full" : "refused");
		s->o.log(s->o.log_arg, line);
	}
}

void oai_sv_done(struct oai_server *s, const struct oai_sv_times *t, int rc, const struct baton_gen_result *res,
    int stream)
{
	double now = baton_now_s();
	int status = 200;
	const char *finish = "";
	pthread_mutex_lock(&s->mmu);
	if (rc == 0) {
		finish = res->finish ? res->finish : "stop";
		s->sv.end[baton_sv_finish(finish)]++;
		s->sv.c[BATON_SV_PROMPT_TOKENS] += res->n_prompt;
		s->sv.c[BATON_SV_GEN_TOKENS] += res->n_tokens;
		baton_sv_observe(&s->sv, BATON_SV_E2E, now - t->t_in);
		baton_sv_observe(&s->sv, BATON_SV_PROMPT, res->n_prompt);
		baton_sv_observe(&s->sv, BATON_SV_GEN, res->n_tokens);
	} else {
		status = http_status_of(rc);
		/* cancelled while it waited: the client left */
		s->sv.end[rc == BATON_ECLOSED ? BATON_SV_CANCELLED : rc == BATON_EBUSY ? BATON_SV_QUEUE_FULL :
		    status < 500 ? BATON_SV_BAD_REQUEST : BATON_SV_FAILED]++;
	}
	pthread_mutex_unlock(&s->mmu);
	if (s->o.log && !s->o.no_access_log) {
		char line[512];
		snprintf(line, sizeof line, "access: model=%s status=%d prompt_tokens=%u completion_tokens=%u "
		    "ttft_ms=%.1f duration_ms=%.1f finish=%s stream=%d", s->model, status, rc == 0 ? res->n_prompt : 0,
		    rc == 0 ? res->n_tokens : 0, t->t_first > 0 ? (t->t_first - t->t_in) * 1e3 : 0.0,
		    (now - t->t_in) * 1e3, rc == 0 ? finish : "error", stream ? 1 : 0);
		s->o.log(s->o.log_arg, line);
	}
}

/* GET /metrics: the serving metrics (proto/base's table), the scheduler's
 * gauges as of now. */
static void metrics(struct oai_server *s, struct baton_http_req *r)
{
	struct sched_stats st;
	sched_stats(s->o.sched, &st);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		http_reply(r, 500, "text/plain", "out of memory\n", 14, NULL);
		return;
	}
	pthread_mutex_lock(&s->mmu);
	struct baton_serving sv = s->sv;
	pthread_mutex_unlock(&s->mmu);
	sv.g[BATON_SV_RUNNING] = st.running;
	sv.g[BATON_SV_WAITING] = st.waiting;
	sv.g[BATON_SV_KV_TOTAL] = st.kv_total;
	sv.g[BATON_SV_KV_USED] = st.kv_total > st.kv_free ? st.kv_total - st.kv_free : 0;
	sv.c[BATON_SV_PREEMPTIONS] = st.preempted;
	const struct baton_serving *one[1] = { &sv };
	const char *const *labels[1] = { (const char *[]){ "engine", s->engine ? s->engine : "", "model", s->model,
		NULL } };
	baton_sv_write(f, "baton_engine_", BATON_SV_ENGINE, one, labels, 1);
	if (fclose(f) != 0 || !buf) {
		free(buf);
		http_reply(r, 500, "text/plain", "out of memory\n", 14, NULL);
		return;
	}
	http_reply(r, 200, "text/plain; version=0.0.4", buf, len, NULL);
	free(buf);
}

static int write_event(struct oreq *q, json_t *j)
{
	json_t *c0 = q->b ? json_array_get(json_object_get(j, "choices"), 0) : NULL;
	if (c0)
		json_object_set_new(c0, "index", json_integer(q->index));
	size_t n;
	char *ev = oai_sse(j, &n);
	if (!ev)
		return BATON_ENOMEM;
	int rc = http_stream_write(q->h.st, ev, n);
	free(ev);
	return rc;
}

static int resp_write(void *arg, const char *ev, size_t n)
{
	struct oreq *q = arg;
	return http_stream_write(q->h.st, ev, n);
}

static void open_stream(struct oreq *q)
{
	static const char *const hdr[] = { "Cache-Control: no-cache", "X-Accel-Buffering: no", NULL };
	q->streaming = 1;
	if (q->b) { /* a batch's stream opens once (the scheduler's thread) */
		pthread_mutex_lock(&q->b->mu);
		if (!q->b->opened) {
			q->b->opened = 1;
			q->b->st = http_stream_open(q->h.r, 200, "text/event-stream", hdr);
		}
		q->h.st = q->b->st;
		pthread_mutex_unlock(&q->b->mu);
	} else {
		q->h.st = http_stream_open(q->h.r, 200, "text/event-stream", hdr);
	}
	if (q->resp) {
		if (q->h.st)
			oai_resp_begin(q->resp, q->h.srv->model, q->created, resp_write, q);
		return;
	}
	if (q->h.st && q->h.q.kind == OAI_CHAT)
		write_event(q, oai_chunk(q->h.q.kind, q->id, q->created, q->h.srv->model, "assistant", NULL, 0,
		    NULL, q->h.q.include_usage));
	if (q->h.st && q->echo && q->echo_len) /* echo: the prompt comes first */
		write_event(q, oai_chunk(q->h.q.kind, q->id, q->created, q->h.srv->model, NULL, q->echo, q->echo_len,
		    NULL, q->h.q.include_usage));
}

/* A piece of the split answer: a stream's chunk, or kept for the whole
 * reply. A tool call streams as OpenAI's do: its id and name with empty
 * arguments, then the arguments (in fragments as they come, or whole). */
static void on_piece(void *arg, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c)
{
	struct oreq *q = arg;
	if (q->resp) {
		if (q->h.q.logprobs) { /* the tokens' entries so far (on_token's) */
			oai_resp_logprobs(q->resp, q->lp);
			q->lp = NULL;
		}
		if (oai_resp_piece(q->resp, k, t, n, c))
			q->h.write_failed = 1;
		return;
	}
	if (!q->h.q.stream) {
		if (k == OAI_P_TOOL || k == OAI_P_TOOL_START) {
			if (!q->h.calls)
				q->h.calls = json_array();
			struct oai_tool_call w = *c;
			if (!w.args)
				w.args = "";
			json_array_append_new(q->h.calls, oai_tool_call_json(&w));
		} else if (k == OAI_P_TOOL_ARGS) {
			json_t *fn = json_object_get(json_array_get(q->h.calls, (size_t)c->index), "function");
			json_t *a = json_object_get(fn, "arguments");
			struct oai_buf b = { 0 };
			if (!json_is_string(a) || oai_buf_put(&b, json_string_value(a), json_string_length(a)) ||
			    oai_buf_put(&b, t, n) || json_object_set_new(fn, "arguments", json_stringn(b.p, b.n)))
				q->h.write_failed = 1;
			free(b.p);
		} else if (oai_buf_put(k == OAI_P_CONTENT ? &q->h.content : &q->h.reasoning, t, n)) {
			q->h.write_failed = 1;
		}
		return;
	}
	if (!q->h.st || q->h.write_failed)
		return;
	const char *m = q->h.srv->model;
	int rc;
	if (k == OAI_P_TOOL_ARGS) {
		json_t *d = json_pack("{s:[{s:i, s:{s:s%}}]}", "tool_calls", "index", c->index, "function", "arguments", t, n);
		rc = write_event(q, oai_chunk_delta(q->id, q->created, m, d, NULL, q->h.q.include_usage));
	} else if (k == OAI_P_TOOL || k == OAI_P_TOOL_START) {
		json_t *d = json_pack("{s:[{s:i, s:s, s:s, s:{s:s, s:s}}]}", "tool_calls", "index", c->index, "id", c->id,
		    "type", "function", "function", "name", c->name, "arguments", "");
		rc = write_event(q, oai_chunk_delta(q->id, q->created, m, d, NULL, q->h.q.include_usage));
		if (rc == 0 && k == OAI_P_TOOL) {
			d = json_pack("{s:[{s:i, s:{s:s}}]}", "tool_calls", "index", c->index, "function", "arguments", c->args);
			rc = write_event(q, oai_chunk_delta(q->id, q->created, m, d, NULL, q->h.q.include_usage));
		}
	} else {
		json_t *d = json_pack("{s:s%}", k == OAI_P_REASONING ? "reasoning_content" : "content", t, n);
		rc = write_event(q, oreq_with_lp(q, oai_chunk_delta(q->id, q->created, m, d, NULL, q->h.q.include_usage)));
	}
	if (rc)
		q->h.write_failed = 1;
}

/* The finish_reason: "tool_calls" when the model called and was not cut. */
static const char *finish_of(struct oreq *q, const char *finish)
{
	const char *f = oai_finish_reason(finish);
	return q->h.sp.n_calls > 0 && strcmp(f, "stop") == 0 ? "tool_calls" : f;
}

/* ---- the scheduler's callbacks (its thread) ---- */

static void on_admit(void *arg)
{
	struct oreq *q = arg;
	oai_sv_admit(q->h.srv, &q->h.tm);
	if (q->h.q.stream)
		open_stream(q); /* the role chunk goes out while the prompt is read */
}

/* A token sampled: the first is the time to first token, each next one
 * an inter-token gap. */
static void on_token_time(void *arg)
{
	struct oreq *q = arg;
	oai_sv_token(q->h.srv, &q->h.tm);
}

void oai_sv_admit(struct oai_server *s, struct oai_sv_times *t)
{
	if (t->t_admit) /* not again after a preemption */
		return;
	t->t_admit = baton_now_s();
	pthread_mutex_lock(&s->mmu);
	baton_sv_observe(&s->sv, BATON_SV_QUEUE, t->t_admit - t->t_in);
	pthread_mutex_unlock(&s->mmu);
}

void oai_sv_token(struct oai_server *s, struct oai_sv_times *t)
{
	double now = baton_now_s();
	pthread_mutex_lock(&s->mmu);
	if (t->t_first <= 0) {
		t->t_first = now;
		baton_sv_observe(&s->sv, BATON_SV_TTFT, now - t->t_in);
	} else {
		baton_sv_observe(&s->sv, BATON_SV_ITL, now - t->t_last);
	}
	pthread_mutex_unlock(&s->mmu);
	t->t_last = now;
}

static int on_text(void *arg, const char *text, size_t len)
{
	struct oreq *q = arg;
	if (!q->h.q.stream && q->resp && q->h.q.logprobs) {
		/* a whole response with logprobs splits as it goes, so that each
		 * piece takes its own tokens' entries (responses.c) */
		q->split_live = 1;
		if (!q->h.split_started++ && q->h.think_open)
			oai_split_thinking(&q->h.sp);
		return oai_split_push(&q->h.sp, text, len) != 0 || q->h.write_failed;
	}
	if (!q->h.q.stream)
		return 0; /* a client gone cancels through on_gone */
	if (!q->h.st)
		return 1; /* the client was gone before the stream opened */
	if (q->h.split_on) {
		if (!q->h.split_started++ && q->h.think_open)
			oai_split_thinking(&q->h.sp);
		return oai_split_push(&q->h.sp, text, len) != 0 || q->h.write_failed;
	}
	return write_event(q, oreq_with_lp(q, oai_chunk(q->h.q.kind, q->id, q->created, q->h.srv->model, NULL, text, len,
	    NULL, q->h.q.include_usage))) != 0;
}

/* A stream's finish chunk (a chat's split answer ends first). */
void oreq_finish_chunk(struct oreq *q, struct baton_gen_result *res)
{
	if (q->h.split_on) {
		if (!q->h.split_started++ && q->h.think_open)
			oai_split_thinking(&q->h.sp);
		oai_split_finish(&q->h.sp);
		write_event(q, oreq_with_lp(q, oai_chunk_delta(q->id, q->created, q->h.srv->model, NULL, finish_of(q, res->finish),
		    q->h.q.include_usage)));
	} else {
		write_event(q, oreq_with_lp(q, oai_chunk(q->h.q.kind, q->id, q->created, q->h.srv->model, NULL, NULL, 0, res->finish,
		    q->h.q.include_usage)));
	}
}

/* A whole chat reply (its answer split when the split is on); NULL without memory. */
json_t *oreq_chat_whole(struct oreq *q, struct baton_gen_result *res)
{
	if (!q->h.split_on)
		return oreq_with_lp(q, oai_reply(OAI_CHAT, q->id, q->created, q->h.srv->model, res));
	if (q->h.think_open)
		oai_split_thinking(&q->h.sp);
	if (oai_split_push(&q->h.sp, res->text, res->text_len) || oai_split_finish(&q->h.sp) || q->h.write_failed)
		return NULL;
	struct oai_parts p = { q->h.content.p, q->h.content.n, q->h.reasoning.p, q->h.reasoning.n, q->h.calls };
	return oreq_with_lp(q, oai_reply_parts(q->id, q->created, q->h.srv->model, res, &p));
}

static void on_done(void *arg, int rc, const char *err, struct baton_gen_result *res)
{
	struct oreq *q = arg;
	const char *type;
	oai_sv_done(q->h.srv, &q->h.tm, rc, res, q->h.q.stream);
	if (q->b) {
		obatch_done(q, rc, err, res);
		return;
	}
	if (q->resp) {
		oreq_resp_done(q, rc, err, res);
		return;
	}
	if (q->streaming) {
		if (q->h.st) {
			if (rc == 0 && strcmp(res->finish, "cancelled") != 0) {
				oreq_finish_chunk(q, res);
				if (q->h.q.include_usage)
					write_event(q, oai_usage_chunk(q->h.q.kind, q->id, q->created, q->h.srv->model,
					    res->n_prompt, res->n_tokens, res->n_cached));
				oreq_usage_comment(q, res);
				http_stream_write(q->h.st, "data: [DONE]\n\n", 14);
			} else if (rc) {
				/* the stream's status is sent: the error goes as an event */
				struct oai_error e;
				int status = oreq_status_of(rc, &type);
				oai_errorf(&e, status, type, NULL, NULL, "%s", err);
				write_event(q, oai_error_json(&e));
			}
			http_stream_close(q->h.st);
		}
	} else if (rc == 0 && q->h.q.kind == OAI_CHAT) {
		json_t *j = oreq_chat_whole(q, res);
		if (j)
			oreq_reply_whole(q, res, j);
		else
			http_reply_error(q->h.r, 500, BATON_ENOMEM, "out of memory");
	} else if (rc == 0) {
		oreq_reply_whole(q, res, oreq_with_echo(q, oreq_with_lp(q, oai_reply(q->h.q.kind, q->id, q->created, q->h.srv->model, res))));
	} else {
		struct oai_error e;
		int status = oreq_status_of(rc, &type);
		oai_errorf(&e, status, type, NULL, NULL, "%s", err && err[0] ? err : baton_strerror(rc));
		static const char *const retry[] = { "Retry-After: 1", NULL };
		oreq_reply_error(q->h.r, &e, http_retry_after(status) ? retry : NULL);
	}
	generator_result_free(res);
	oreq_free(q);
}

/* The scheduler's callbacks of a request (its thread). */
struct sched_cb oreq_callbacks(struct oreq *q)
{
	return (struct sched_cb){ .on_text = on_text, .on_admit = on_admit, .on_token = on_token_time,
		.on_done = on_done, .arg = q };
}

/* The client went away (a server thread): cancel at once. */
/* The client left. It may fire on a server thread even after the answer
 * was given, when the request's memory is gone: so its arguments are the
 * scheduler (alive until after http_close has joined the threads that
 * fire it) and the request's scheduler id (a finished id is ignored). */
static void on_gone(void *owner, uint64_t id)
{
	sched_cancel(owner, id);
}

/* ---- the handler (an HTTP worker thread) ---- */

/* A request parsed and bound, ready to submit; NULL with the error answered. */
struct oreq *oreq_prepare(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind, const char *body,
    size_t len, struct oai_error *e)
{
	struct oreq *q = calloc(1, sizeof *q);
	if (!q) {
		oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
		return NULL;
	}
	if (oai_parse(kind, s->model, body, len, oai_random64(), &q->h.q, e) != 0) {
		free(q);
		return NULL;
	}
	if (oai_bind(&q->h.q, &s->caps, e) != 0) {
		oreq_free(q);
		return NULL;
	}
	oai_live_split(&q->h, &s->caps, on_piece, q);
	q->h.srv = s;
	q->h.r = r;
	q->h.tm.t_in = baton_now_s();
	q->door = http_req_header(r, "X-Baton-Usage") != NULL;
	q->created = (long long)time(NULL);
	snprintf(q->id, sizeof q->id, "%s-%016llx%08llx", kind == OAI_CHAT ? "chatcmpl" : "cmpl",
	    (unsigned long long)oai_random64(), (unsigned long long)atomic_fetch_add(&s->next, 1));
	q->h.q.q.on_text = on_text;
	q->h.q.q.arg = q;
	q->lp_prev = -1;
	q->h.q.q.think_open = &q->h.think_open;
	if (q->h.q.echo) {
		char err[128];
		int32_t *ids = q->h.q.q.prompt_ids ? malloc(q->h.q.q.n_prompt_ids * sizeof *ids + 1) : NULL;
		for (size_t i = 0; ids && i < q->h.q.q.n_prompt_ids; i++)
			ids[i] = q->h.q.q.prompt_ids[i] < text_vocab_size(s->o.tok) ? (int32_t)q->h.q.q.prompt_ids[i] : 0;
		if (q->h.q.q.prompt) {
			q->echo = strndup(q->h.q.q.prompt, q->h.q.q.prompt_len);
			q->echo_len = q->h.q.q.prompt_len;
		} else if (!ids || !s->o.tok || text_decode(s->o.tok, ids, q->h.q.q.n_prompt_ids, TEXT_SKIP_SPECIAL,
		    &q->echo, &q->echo_len, err, sizeof err) != 0) {
			q->echo = NULL;
		}
		free(ids);
		if (!q->echo) {
			oai_errorf(e, 500, "server_error", NULL, NULL, "echo: the prompt could not be decoded");
			oreq_free(q);
			return NULL;
		}
	}
	if (q->h.q.logprobs && s->o.tok) {
		q->h.q.q.on_token = on_token;
		/* a completion's first token reads after its prompt's last (the
		 * space a SentencePiece decoder drops at a text's start is kept,
		 * as in the text) */
		if (q->h.q.q.prompt_ids) {
			q->lp_prev = (int32_t)q->h.q.q.prompt_ids[q->h.q.q.n_prompt_ids - 1];
		} else if (q->h.q.q.prompt) {
			int32_t *ids = NULL;
			size_t n = 0;
			char err[64];
			if (text_encode(s->o.tok, q->h.q.q.prompt, q->h.q.q.prompt_len, TEXT_ADD_SPECIAL, &ids, &n, err,
			    sizeof err) == 0 && n)
				q->lp_prev = ids[n - 1];
			free(ids);
		}
		if (q->lp_prev >= (int32_t)text_vocab_size(s->o.tok))
			q->lp_prev = -1;
	}
	return q;
}

static void refuse_submit(struct baton_http_req *r, int rc)
{
	struct oai_error e;
	oai_errorf(&e, 503, "server_error", rc == BATON_EBUSY ? "queue_full" : NULL, NULL, "%s",
	    rc == BATON_EBUSY ? "the engine's queue of waiting requests is full; retry later" :
	    "the engine is shutting down");
	static const char *const retry[] = { "Retry-After: 1", NULL };
	oreq_reply_error(r, &e, retry);
}

static void submit(struct oai_server *s, struct baton_http_req *r, struct oreq *q);

static void completion(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind)
{
	size_t len = 0;
	const char *body = http_req_body(r, &len);
	struct oai_error e;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
	json_t *p = kind == OAI_COMPLETION ? json_object_get(root, "prompt") : NULL;
	json_t *p0 = json_array_get(p, 0), *jn = json_object_get(root, "n");
	int many = json_is_array(p) && json_array_size(p) > 1 && (json_is_string(p0) || json_is_array(p0));
	unsigned max_n = s->o.max_n ? s->o.max_n : OAI_DEFAULT_MAX_N;
	/* n out of the parser's range is the parser's to refuse (as the COMPLETE op's) */
	json_int_t nv = json_is_integer(jn) ? json_integer_value(jn) : 1;
	if (json_is_object(root) && nv > (json_int_t)max_n && nv <= (json_int_t)OAI_MAX_N) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, "n", "n: %lld is more than this engine's --max-n "
		    "(%u)", (long long)nv, max_n);
		json_decref(root);
		oreq_reply_error(r, &e, NULL);
		return;
	}
	size_t n = nv > 1 && nv <= (json_int_t)max_n ? (size_t)nv : 1;
	if (json_is_object(root) && (many || n > 1)) {
		obatch_submit(s, r, kind, root, many ? p : NULL, n);
		json_decref(root);
		return;
	}
	json_decref(root);
	struct oreq *q = oreq_prepare(s, r, kind, body, len, &e);
	if (!q) {
		oai_sv_refused(s, e.status, 0);
		oreq_reply_error(r, &e, NULL);
		return;
	}
	submit(s, r, q);
}

static void submit(struct oai_server *s, struct baton_http_req *r, struct oreq *q)
{
	struct sched_cb cb = oreq_callbacks(q);
	/* on_gone is set before the request can end (and free r) */
	uint64_t sid = sched_new_id(s->o.sched);
	http_req_on_gone(r, on_gone, s->o.sched, sid);
	int rc = sched_submit(s->o.sched, &q->h.q.q, &cb, &sid);
	if (rc) {
		/* on_done never comes: answer here */
		oai_sv_refused(s, 503, rc);
		refuse_submit(r, rc);
		oreq_free(q);
	}
}

/* POST /v1/responses: translated into a chat request (responses.c), its
 * answer split into output items, whole or as the Responses API's events. */
static void responses(struct oai_server *s, struct baton_http_req *r)
{
	size_t len = 0;
	const char *body = http_req_body(r, &len);
	struct oai_error e;
	struct oai_resp *rs = NULL;
	char *chat = NULL;
	if (oai_resp_parse(body, len, s->model, oai_random64(), &chat, &rs, &e) != 0) {
		oreq_reply_error(r, &e, NULL);
		return;
	}
	struct oreq *q = oreq_prepare(s, r, OAI_CHAT, chat, strlen(chat), &e);
	free(chat);
	if (!q) {
		oai_resp_param(&e);
		oreq_reply_error(r, &e, NULL);
		oai_resp_free(rs);
		return;
	}
	q->resp = rs;
	if (!q->h.split_on) { /* no tools, no thinking: all content, split all the same */
		oai_split_free(&q->h.sp);
		oai_split_init(&q->h.sp, OAI_TOOLS_NONE, 0, 0, NULL, oai_random64(), on_piece, q);
		q->h.split_on = 1;
	}
	if (!oai_resp_streaming(rs))
		oai_resp_begin(rs, s->model, q->created, NULL, NULL);
	submit(s, r, q);
}

/* POST /tokenize, as vLLM's: {"prompt"} (add_special_tokens, default
 * true) or {"messages"} rendered with the chat template as a request would
 * be (tools, chat_template_kwargs; add_generation_prompt, default true)
 * -> {"count", "max_model_len", "tokens", "token_strs"}. */
static void tokenize(struct oai_server *s, struct baton_http_req *r)
{
	struct oai_error e;
	size_t len = 0;
	const char *body = http_req_body(r, &len);
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je), *v;
	json_t *model = json_object_get(root, "model"), *prompt = json_object_get(root, "prompt");
	json_t *msgs = json_object_get(root, "messages"), *strs = json_object_get(root, "return_token_strs");
	json_t *ast = json_object_get(root, "add_special_tokens"), *agp = json_object_get(root, "add_generation_prompt");
	char *text = NULL, err[512] = "";
	int32_t *ids = NULL;
	size_t n = 0;
	if (!json_is_object(root)) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object");
		goto fail;
	}
	if (json_is_string(model) && strcmp(json_string_value(model), s->model)) {
		oai_errorf(&e, 404, "invalid_request_error", "model_not_found", "model",
		    "The model '%.100s' does not exist: this engine serves '%s'", json_string_value(model), s->model);
		goto fail;
	}
	const char *bad = (ast && !json_is_boolean(ast)) ? "add_special_tokens" :
	    (agp && !json_is_boolean(agp)) ? "add_generation_prompt" : (strs && !json_is_boolean(strs)) ?
	    "return_token_strs" : NULL;
	if (bad) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, bad, "%s: want true or false", bad);
		goto fail;
	}
	if (!json_is_string(prompt) == !msgs) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, "prompt", "give prompt (a string) or messages");
		goto fail;
	}
	int rc;
	if (msgs) {
		/* the chat request's own parser and template */
		json_t *q = json_object();
		static const char *const keep[] = { "messages", "tools", "chat_template_kwargs", NULL };
		for (size_t i = 0; keep[i]; i++)
			if ((v = json_object_get(root, keep[i])))
				json_object_set(q, keep[i], v);
		char *qb = json_dumps(q, JSON_COMPACT);
		json_decref(q);
		struct oai_request c;
		if (!qb || oai_parse(OAI_CHAT, s->model, qb, strlen(qb), 0, &c, &e) != 0) {
			if (!qb)
				oai_errorf(&e, 500, "server_error", NULL, NULL, "out of memory");
			free(qb);
			goto fail;
		}
		free(qb);
		struct text_chat_opts o = {
			.bos_token = text_token_text(s->o.tok, text_bos(s->o.tok)),
			.eos_token = text_token_text(s->o.tok, text_eos(s->o.tok)),
			.add_generation_prompt = !agp || json_is_true(agp),
			.enable_thinking = c.q.enable_thinking,
			.tools = c.q.tools,
			.kwargs = c.q.template_kwargs,
		};
		/* as the generator encodes a chat (content is text unless the
		 * engine says --special-tokens-in-content) */
		rc = text_chat_encode_opts(s->o.tok, c.q.msgs, c.q.n_msgs, &o,
		    s->o.content_special ? TEXT_CONTENT_SPECIAL : 0, &ids, &n, NULL, 0, err, sizeof err);
		oai_request_free(&c);
		if (rc) {
			oai_errorf(&e, 400, "invalid_request_error", NULL, "messages", "chat template: %s", err);
			goto fail;
		}
		(void)ast; /* the template writes BOS itself */
	} else {
		rc = text_encode(s->o.tok, json_string_value(prompt), json_string_length(prompt),
		    !ast || json_is_true(ast) ? TEXT_ADD_SPECIAL : 0, &ids, &n, err, sizeof err);
	}
	if (rc) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, msgs ? "messages" : "prompt", "%s", err);
		goto fail;
	}
	json_t *toks = json_array(), *ts = strs && json_is_true(strs) ? json_array() : json_null();
	for (size_t i = 0; i < n; i++) {
		json_array_append_new(toks, json_integer(ids[i]));
		if (json_is_array(ts)) {
			/* the piece as the vocabulary stores it (byte-level or ▁ form), as vLLM's
			 * convert_ids_to_tokens */
			const char *pc = text_piece(s->o.tok, ids[i]);
			json_array_append_new(ts, json_string(pc ? pc : ""));
		}
	}
	http_reply_json(r, 200, json_pack("{s:I, s:I, s:o, s:o}", "count", (json_int_t)n, "max_model_len",
	    (json_int_t)s->o.max_model_len, "tokens", toks, "token_strs", ts));
	free(ids);
	free(text);
	json_decref(root);
	return;
fail:
	if (!root)
		oai_errorf(&e, 400, "invalid_request_error", NULL, NULL, "the body is not JSON: %s", je.text);
	oreq_reply_error(r, &e, NULL);
	free(ids);
	free(text);
	json_decref(root);
}

/* POST /detokenize: {"tokens": [ids]} -> {"prompt": text}, special
 * tokens included (as vLLM's, transformers' decode's default). */
static void detokenize(struct oai_server *s, struct baton_http_req *r)
{
	struct oai_error e;
	size_t len = 0;
	const char *body = http_req_body(r, &len);
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL);
	json_t *model = json_object_get(root, "model"), *toks = json_object_get(root, "tokens"), *v;
	int32_t *ids = NULL;
	char *text = NULL, err[256] = "";
	size_t n = json_array_size(toks), i, tl = 0;
	if (json_is_string(model) && strcmp(json_string_value(model), s->model)) {
		oai_errorf(&e, 404, "invalid_request_error", "model_not_found", "model",
		    "The model '%.100s' does not exist: this engine serves '%s'", json_string_value(model), s->model);
		goto fail;
	}
	if (!json_is_array(toks) || !(ids = malloc((n + 1) * sizeof *ids))) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, "tokens", "tokens: want an array of token ids");
		goto fail;
	}
	json_array_foreach(toks, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (json_int_t)text_vocab_size(s->o.tok)) {
			oai_errorf(&e, 400, "invalid_request_error", NULL, "tokens", "tokens[%zu]: not a token id of this "
			    "model (0..%zu)", i, text_vocab_size(s->o.tok) - 1);
			goto fail;
		}
		ids[i] = (int32_t)json_integer_value(v);
	}
	if (text_decode(s->o.tok, ids, n, 0, &text, &tl, err, sizeof err) != 0) {
		oai_errorf(&e, 400, "invalid_request_error", NULL, "tokens", "tokens: %s", err);
		goto fail;
	}
	http_reply_json(r, 200, json_pack("{s:s%}", "prompt", text, tl));
	free(ids);
	free(text);
	json_decref(root);
	return;
fail:
	oreq_reply_error(r, &e, NULL);
	free(ids);
	free(text);
	json_decref(root);
}

static void handler(void *arg, struct baton_http_req *r)
{
	struct oai_server *s = arg;
	const char *m = http_req_method(r), *p = http_req_path(r);
	int get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0;
	struct oai_error e;
	if (strcmp(p, "/v1/chat/completions") == 0 || strcmp(p, "/v1/completions") == 0) {
		if (!post) {
			oai_errorf(&e, 405, "invalid_request_error", NULL, NULL, "%s wants POST", p);
			static const char *const allow[] = { "Allow: POST", NULL };
			oreq_reply_error(r, &e, allow);
			return;
		}
		completion(s, r, p[4] == 'c' && p[5] == 'h' ? OAI_CHAT : OAI_COMPLETION);
		return;
	}
	if (strcmp(p, "/v1/responses") == 0) {
		if (!post) {
			oai_errorf(&e, 405, "invalid_request_error", NULL, NULL, "%s wants POST", p);
			static const char *const allow[] = { "Allow: POST", NULL };
			oreq_reply_error(r, &e, allow);
			return;
		}
		responses(s, r);
		return;
	}
	int del = strcmp(m, "DELETE") == 0;
	if (strncmp(p, "/v1/responses/", 14) == 0 && (get || del)) {
		json_t *j = get ? oai_resp_stored(p + 14) : oai_resp_delete(p + 14) == 0 ?
		    json_pack("{s:s, s:s, s:b}", "id", p + 14, "object", "response", "deleted", 1) : NULL;
		if (j) {
			http_reply_json(r, 200, j);
		} else {
			oai_errorf(&e, 404, "invalid_request_error", "not_found", NULL, "response '%.100s' is not kept by "
			    "this engine (it keeps its last 256 stored responses, in memory)", p + 14);
			oreq_reply_error(r, &e, NULL);
		}
		return;
	}
	if ((strcmp(p, "/tokenize") == 0 || strcmp(p, "/detokenize") == 0) && s->o.tok) {
		if (!post) {
			oai_errorf(&e, 405, "invalid_request_error", NULL, NULL, "%s wants POST", p);
			static const char *const allow[] = { "Allow: POST", NULL };
			oreq_reply_error(r, &e, allow);
		} else if (p[1] == 't') {
			tokenize(s, r);
		} else {
			detokenize(s, r);
		}
		return;
	}
	if (strcmp(p, "/v1/models") == 0 && get) {
		http_reply_json(r, 200, oai_models(s->model, (long long)time(NULL)));
		return;
	}
	if (strcmp(p, "/v1/models/") > 0 && strncmp(p, "/v1/models/", 11) == 0 && get) {
		if (strcmp(p + 11, s->model) == 0) {
			json_t *j = oai_models(s->model, (long long)time(NULL));
			http_reply_json(r, 200, json_incref(json_array_get(json_object_get(j, "data"), 0)));
			json_decref(j);
		} else {
			oai_errorf(&e, 404, "invalid_request_error", "model_not_found", "model",
			    "The model '%.100s' does not exist: this engine serves '%s'", p + 11, s->model);
			oreq_reply_error(r, &e, NULL);
		}
		return;
	}
	if (strcmp(p, "/metrics") == 0 && get) {
		metrics(s, r);
		return;
	}
	if (strcmp(p, "/health") == 0 && get) {
		struct sched_stats st;
		sched_stats(s->o.sched, &st);
		json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:I, s:I, s:I, s:I, s:I}", "status", "ok",
		    "model", s->model, "running", (json_int_t)st.running, "waiting", (json_int_t)st.waiting,
		    "kv_blocks_free", (json_int_t)st.kv_free, "kv_blocks_total", (json_int_t)st.kv_total,
		    "steps", (json_int_t)st.steps, "passes", (json_int_t)st.passes, "cancelled", (json_int_t)st.cancelled, "refused_busy",
		    (json_int_t)st.refused_busy, "preempted", (json_int_t)st.preempted);
		const struct baton_prefix_stats *ps = &st.prefix;
		json_t *pc = json_pack("{s:b, s:I, s:I, s:f, s:i, s:i, s:I, s:I, s:I, s:i, s:I, s:I, s:f, s:I, s:I}",
		    "enabled", ps->enabled, "prompt_tokens", (json_int_t)st.prompt_tokens, "cached_tokens",
		    (json_int_t)st.cached_tokens, "hit_rate",
		    st.prompt_tokens ? (double)st.cached_tokens / (double)st.prompt_tokens : 0.0, "cached_blocks",
		    (json_int_t)ps->cached_blocks, "evictable_blocks", (json_int_t)ps->evictable_blocks, "evictions",
		    (json_int_t)ps->evictions, "host_kv_bytes", (json_int_t)ps->host_bytes, "host_kv_limit_bytes",
		    (json_int_t)ps->host_limit, "host_kv_blocks", (json_int_t)ps->host_blocks, "host_dropped_blocks",
		    (json_int_t)ps->host_dropped, "restored_blocks", (json_int_t)ps->restored_blocks,
		    "last_restore_s", ps->last_restore_s, "read_tokens", (json_int_t)st.read_tokens, "followed",
		    (json_int_t)st.followed);
		if (j && pc)
			json_object_set_new(j, "prefix_cache", pc);
		if (j && s->o.health)
			s->o.health(s->o.health_arg, j);
		if (j)
			oai_ignored_fields(j);
		http_reply_json(r, 200, j);
		return;
	}
	if (ollama_route(s, r, m, p) || anthropic_route(s, r, m, p)) /* the other faces (face.h) */
		return;
	oai_errorf(&e, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %.200s", m, p);
	oreq_reply_error(r, &e, NULL);
}

int oai_server_open(const struct oai_server_opts *o, struct oai_server **out, char *err, size_t errlen)
{
	*out = NULL;
	int has_token = o->token && o->token[0];
	if (!has_token && !http_is_loopback(o->addr)) {
		baton_errf(err, errlen, "--http %s is beyond loopback: set a token (--http-token-file) "
		    "or listen on 127.0.0.1 or [::1]", o->addr);
		return BATON_EPERM;
	}
	struct oai_server *s = calloc(1, sizeof *s);
	if (!s || !(s->model = strdup(o->model))) {
		free(s);
		return BATON_ENOMEM;
	}
	s->o = *o;
	s->o.model = s->model;
	s->engine = o->engine ? strdup(o->engine) : NULL;
	s->o.engine = s->engine;
	pthread_mutex_init(&s->mmu, NULL);
	oai_caps_of(o->chat_template, &s->caps);
	atomic_init(&s->next, 1);
	struct baton_http_opts ho = {
		.addr = o->addr,
		.token = has_token ? o->token : NULL,
		.token_for_reads = 1,
		.cors_origins = o->cors_origins,
	};
	int rc = http_open(&ho, handler, s, &s->http, err, errlen);
	if (rc) {
		pthread_mutex_destroy(&s->mmu);
		free(s->engine);
		free(s->model);
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

const char *oai_server_url(const struct oai_server *s)
{
	return http_url(s->http);
}

void oai_server_stop(struct oai_server *s)
{
	if (s && s->http) {
		http_close(s->http);
		s->http = NULL;
	}
}

void oai_server_close(struct oai_server *s)
{
	if (!s)
		return;
	oai_server_stop(s);
	pthread_mutex_destroy(&s->mmu);
	free(s->engine);
	free(s->model);
	free(s);
}

/* ---- what the other faces read (face.h) ---- */

const char *oai_server_model(const struct oai_server *s)
{
	return s->model;
}

struct baton_sched *oai_server_sched(const struct oai_server *s)
{
	return s->o.sched;
}

const text_tok *oai_server_tok(const struct oai_server *s)
{
	return s->o.tok;
}

const struct oai_caps *oai_server_caps(const struct oai_server *s)
{
	return &s->caps;
}

const struct oai_server_opts *oai_server_opts(const struct oai_server *s)
{
	return &s->o;
}
