/*
 * proxy.c: one forwarded request (door_int.h), on a thread of its own:
 * the body goes to the engine's OpenAI HTTP (upstream.c) as the client
 * sent it, and the reply comes back as it arrives: a whole reply with its
 * length, a stream (server-sent events) piece by piece; a stream the
 * engine cuts ends with an error event and no chunked end. A client that
 * leaves cancels the exchange (on_gone), and the engine sees the close
 * and frees its sequence.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/door/door_int.h"
#include "http/http.h"

#define UPSTREAM_TIMEOUT_MS 600000 /* an engine silent this long mid-reply: cut */
#define CONNECT_TIMEOUT_MS 5000
#define MAX_WHOLE (64u << 20)      /* a whole (non-streamed) reply read before it is passed on */

static void unlink_fwd(struct broker_door *d, struct dreq *q)
{
	for (struct dreq **pp = &d->fwd; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
}

/* A stream whose engine was cut (it died, or went silent past the
 * timeout) ends as a cut upstream must, as nginx ends it: an error event
 * (on an event boundary: a piece of an event cut short is ended first),
 * then the connection closed without the chunked end, so a client reads
 * an incomplete body and raises, never a stream that looks complete. */
static void cut_stream(struct baton_http_stream *s, const char *path, const char *url, int err, const char tail[2])
{
	/* in the face's own shape: Ollama's an NDJSON line, Anthropic's an
	 * "error" event, OpenAI's a data: event */
	bool ndjson = strncmp(path, "/api/", 5) == 0, anthropic = strncmp(path, "/v1/messages", 12) == 0;
	if (tail[1] != '\n' || (!ndjson && tail[0] != '\n'))
		http_stream_write(s, ndjson ? "\n" : "\n\n", ndjson ? 1 : 2);
	char msg[300];
	snprintf(msg, sizeof msg, "the engine at %.128s %s mid-stream", url,
	    err == BATON_ETIMEDOUT ? "went silent" : "was cut off");
	json_t *j = http_face_error(path, 502, msg);
	if (!j)
		j = http_openai_error(502, msg, "server_error", NULL, "engine_unreachable");
	char *txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (txt) {
		if (anthropic)
			http_stream_write(s, "event: error\n", 13);
		if (!ndjson)
			http_stream_write(s, "data: ", 6);
		http_stream_write(s, txt, strlen(txt));
		http_stream_write(s, ndjson ? "\n" : "\n\n", ndjson ? 1 : 2);
	}
	free(txt);
	json_decref(j);
	http_stream_abort(s);
}

/* The access log's line of a request through the door. */
static void access_line(struct broker_door *d, const struct dreq *q, int status, const struct door_usage *u,
    double now)
{
	if (!d->access_log)
		return;
	broker_log("access: model=%s engine=%s status=%d prompt_tokens=%lu completion_tokens=%lu ttft_ms=%.1f "
	    "duration_ms=%.1f wait_ms=%.1f stream=%d", d->models[q->model].name, q->eng[0] ? q->eng : "-", status,
	    u->have ? u->prompt : 0, u->have ? u->completion : 0,
	    u->have && u->ttft_s > 0 ? (q->t_fwd - q->t_in + u->ttft_s) * 1e3 : 0.0, (now - q->t_in) * 1e3,
	    (q->t_fwd - q->t_in) * 1e3, q->stream ? 1 : 0);
}

void door_access_refused(struct broker_door *d, const char *model, int status, double t_in, bool stream)
{
	pthread_mutex_lock(&d->mu);
	bool on = d->access_log;
	pthread_mutex_unlock(&d->mu);
	if (!on)
		return;
	double ms = t_in > 0 ? (baton_now_s() - t_in) * 1e3 : 0.0;
	broker_log("access: model=%s engine=- status=%d prompt_tokens=0 completion_tokens=0 ttft_ms=0.0 "
	    "duration_ms=%.1f wait_ms=%.1f stream=%d", model, status, ms, ms, stream ? 1 : 0);
}

/* The door's memory of stored responses, changed before the client has
 * any of the answer: a GET it sends next finds the engine (or, after a
 * DELETE, finds it gone). A 404 of the engine is passed on and changes
 * nothing: a stream's response is kept at its end, so a GET mid-stream
 * is 404 there, and a wrong entry costs only a slot of the LRU. */
static void stored_seen(struct dreq *q, const char *rid, int status)
{
	struct broker_door *d = q->d;
	pthread_mutex_lock(&d->mu);
	if (rid && *rid)
		door_stored_put(d->stored, rid, d->models[q->model].name, q->eng);
	if (q->aside && q->del && status == 200)
		door_stored_forget(d->stored, q->path + strlen("/v1/responses/"));
	pthread_mutex_unlock(&d->mu);
}

static void *proxy(void *arg)
{
	struct dreq *q = arg;
	struct broker_door *d = q->d;
	char err[300];
	struct door_up *up = NULL;
	int rc = door_up_open(q->url, CONNECT_TIMEOUT_MS, &up, err, sizeof err);
	bool ok = false, gone = false;
	bool engine_failed = false; /* the engine's side failed (not a client that left): counted failed */
	double t_first = -1;
	int status = 503;
	struct door_usage us = { 0 };
	/* a stored response's id, read from the answer (stored.c) */
	bool responses = !q->aside && strcmp(q->path, "/v1/responses") == 0;
	char rid[DOOR_STORED_ID_MAX] = "";
	struct door_sniff sn = { 0 };
	if (rc == 0) {
		/* the engine's own token (issue 28): only the door holds it */
		char tok[BROKER_URL_MAX];
		if (broker_engine_http_token(d->b, q->eng, tok, sizeof tok) == 0 && door_up_set_token(up, tok) != 0)
			broker_log("door: the token engine %s registered is not one line of visible ASCII; "
			    "sending none", q->eng);
		explicit_bzero(tok, sizeof tok);
		if (q->aside && q->del)
			door_up_set_delete(up);
	}
	if (rc == 0) {
		pthread_mutex_lock(&d->mu);
		q->up = up; /* from here a client that leaves cancels it (on_gone) */
		gone = q->gone;
		pthread_mutex_unlock(&d->mu);
		if (!gone)
			rc = door_up_request(up, q->path, q->body, q->len, UPSTREAM_TIMEOUT_MS, err, sizeof err);
	}
	if (gone) {
		door_reply_error(q->r, 503, "invalid_request_error", NULL, NULL, NULL, "the client went away");
	} else if (rc) {
		/* the engine died or is restarting: try again soon (503, never a hang) */
		engine_failed = true;
		door_reply_error(q->r, 503, "server_error", NULL, "engine_unreachable", "1", "%s", err);
	} else {
		int st = door_up_status(up);
		status = st;
		char ctype[128], ra[64], ra_hdr[96], rep[256];
		if (door_up_header(up, "X-Baton-Usage", rep, sizeof rep))
			door_usage_parse(rep, &us);
		if (!door_up_header(up, "Content-Type", ctype, sizeof ctype))
			snprintf(ctype, sizeof ctype, "application/json");
		const char *hdr[2] = { NULL, NULL };
		if (door_up_header(up, "Retry-After", ra, sizeof ra)) {
			snprintf(ra_hdr, sizeof ra_hdr, "Retry-After: %s", ra);
			hdr[0] = ra_hdr;
		}
		uint64_t clen;
		if (door_up_has_length(up, &clen)) {
			/* a whole reply: passed on as it is, with its length */
			char *buf = clen <= MAX_WHOLE ? malloc(clen ? clen : 1) : NULL;
			size_t got = 0;
			long n = 1;
			while (buf && got < clen && (n = door_up_read(up, buf + got, clen - got, UPSTREAM_TIMEOUT_MS)) > 0)
				got += (size_t)n;
			if (!buf)
				door_reply_error(q->r, 502, "server_error", NULL, NULL, NULL, "the engine's reply is too large");
			else if (got < clen && (engine_failed = true))
				door_reply_error(q->r, 503, "server_error", NULL, "engine_unreachable", "1",
				    "the engine's reply was cut short (it went away mid-reply)");
			else {
				if (!us.have && st == 200)
					door_usage_of_body(buf, got, &us);
				if (responses && st == 200 && !door_stored_id_of_body(buf, got, rid, sizeof rid))
					rid[0] = 0;
				if (*rid || q->aside)
					stored_seen(q, rid, st);
				ok = http_reply(q->r, st, ctype, buf, got, hdr) == 0 && st < 400;
			}
			if (!buf || got < clen)
				status = !buf ? 502 : 503;
			free(buf);
		} else {
			/* a stream (server-sent events): each piece on as it comes */
			struct baton_http_stream *s = http_stream_open(q->r, st, ctype, hdr);
			char buf[16384], out[sizeof buf + 256], tail[2] = { '\n', '\n' };
			struct door_strip sp = { 0 };
			long n = 0;
			ok = s != NULL;
			while (s && (n = door_up_read(up, buf, sizeof buf, UPSTREAM_TIMEOUT_MS)) > 0) {
				if (t_first < 0)
					t_first = baton_now_s();
				if (responses && st == 200 && !sn.done && door_sniff_feed(&sn, buf, (size_t)n) &&
				    door_sniff_id(&sn, rid, sizeof rid))
					stored_seen(q, rid, st); /* before the first event goes on */
				size_t on = door_strip_usage(&sp, buf, (size_t)n, out, &us);
				if (on && http_stream_write(s, out, on) != 0) {
					ok = false;
					break;
				}
				if (on > 1)
					tail[0] = out[on - 2];
				else if (on == 1)
					tail[0] = tail[1];
				if (on)
					tail[1] = out[on - 1];
			}
			if (s && ok && n == 0 && sp.held && sp.n && http_stream_write(s, sp.line, sp.n) != 0)
				ok = false; /* a comment line the engine never ended: passed on */
			if (s && ok && n < 0) {
				/* the engine was cut mid-stream: never a clean end. Whether
				 * the client had left (its cancel ends the read too) is
				 * taken now: the cut makes it leave after. */
				pthread_mutex_lock(&d->mu);
				engine_failed = !q->gone;
				pthread_mutex_unlock(&d->mu);
				cut_stream(s, q->path, q->url, -n, tail);
				ok = false;
			} else if (s) {
				http_stream_close(s);
			}
			ok = ok && st < 400;
		}
	}
	door_sniff_free(&sn);
	pthread_mutex_lock(&d->mu);
	q->up = NULL;
	unlink_fwd(d, q);
	struct dmodel *m = &d->models[q->model];
	double now = baton_now_s();
	if (!q->aside)
		m->last_active = now;
	bool client = !ok && !engine_failed && status >= 400 && status < 500 && !q->gone;
	if (q->aside) {
		/* a stored response read or deleted: no completion, not the serving metrics' */
	} else if (ok) {
		m->served++;
		/* the serving metrics: the client's view (arrival at the door) */
		m->sv.end[us.have ? baton_sv_finish(us.finish) : BATON_SV_STOP]++;
		baton_sv_observe(&m->sv, BATON_SV_E2E, now - q->t_in);
		baton_sv_observe(&m->sv, BATON_SV_QUEUE, q->t_fwd - q->t_in);
		if (us.have) {
			m->sv.c[BATON_SV_PROMPT_TOKENS] += us.prompt;
			m->sv.c[BATON_SV_GEN_TOKENS] += us.completion;
			baton_sv_observe(&m->sv, BATON_SV_PROMPT, (double)us.prompt);
			baton_sv_observe(&m->sv, BATON_SV_GEN, (double)us.completion);
			if (us.ttft_s > 0)
				baton_sv_observe(&m->sv, BATON_SV_TTFT, q->t_fwd - q->t_in + us.ttft_s);
		}
		door_hist_add(&m->wait, q->t_fwd - q->t_in);
		door_hist_add(&m->refill, q->refill_ms / 1e3);
		/* the start of its engine it waited for (0: it was there) */
		double start = q->unserved && m->served_since > q->t_in ? m->served_since - q->t_in : 0;
		door_hist_add(&m->start, start);
		if (t_first >= 0) /* streams only: a whole reply's first byte is its last */
			door_hist_add(&m->prefill, t_first - q->t_fwd);
	} else if (client) {
		m->client_error++; /* the engine said the request was wrong: not a failure */
	} else if (q->gone && !engine_failed) {
		m->gone++;
	} else {
		m->failed++;
	}
	access_line(d, q, q->gone && !engine_failed ? 499 : status, &us, now);
	pthread_mutex_unlock(&d->mu);
	door_up_close(up);
	door_dreq_free(q);
	door_helper_done(d);
	return NULL;
}

bool door_forward(struct broker_door *d, struct dreq *q, const struct deng *e)
{
	snprintf(q->eng, sizeof q->eng, "%s", e->name);
	q->t_fwd = baton_now_s();
	snprintf(q->url, sizeof q->url, "%s", e->http);
	q->next = d->fwd;
	d->fwd = q;
	if (door_spawn(d, proxy, q))
		return true;
	unlink_fwd(d, q);
	d->models[q->model].failed++;
	return false;
}
