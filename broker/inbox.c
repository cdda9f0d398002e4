/*
 * inbox.c: the decision thread's inbox. Receivers (one nng context each)
 * and faces (broker_call) post requests with a waiter and sleep until the
 * decision thread has filled its reply; workers, the watcher and pipe
 * events post their news. Only the decision thread takes items out.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker/broker_int.h"

static void rbuf_reset(struct rbuf *rb)
{
	free(rb->block);
	memset(rb, 0, sizeof *rb);
}

/* The caller holds b->mu. */
static void append(struct broker *b, struct item *it)
{
	it->next = NULL;
	if (b->tail)
		b->tail->next = it;
	else
		b->head = it;
	b->tail = it;
	pthread_cond_signal(&b->cv);
}

void br_post(struct broker *b, struct item *it)
{
	pthread_mutex_lock(&b->mu);
	append(b, it);
	pthread_mutex_unlock(&b->mu);
}

int br_post_live(struct broker *b, struct item *it)
{
	int rc = BATON_ECLOSED;
	pthread_mutex_lock(&b->mu);
	if (!b->loop_done) {
		append(b, it);
		rc = 0;
	}
	pthread_mutex_unlock(&b->mu);
	return rc;
}

void broker_emit(struct broker *b, const char *kind, const char *engine, const char *reason, double ms,
    uint64_t bytes)
{
	struct item *it = calloc(1, sizeof *it);
	if (!it)
		return; /* an event is news, not state: lost without memory */
	it->kind = IT_EVENT;
	snprintf(it->ev_kind, sizeof it->ev_kind, "%s", kind);
	snprintf(it->ev_engine, sizeof it->ev_engine, "%s", engine ? engine : "");
	snprintf(it->err, sizeof it->err, "%s", reason ? reason : "");
	it->ms = ms;
	it->job_id = bytes;
	if (br_post_live(b, it) != 0)
		free(it);
}

void br_waiter_init(struct waiter *w)
{
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	memset(&w->rb, 0, sizeof w->rb);
	w->done = 0;
}

void br_waiter_wait(struct waiter *w)
{
	pthread_mutex_lock(&w->mu);
	while (!w->done)
		pthread_cond_wait(&w->cv, &w->mu);
	pthread_mutex_unlock(&w->mu);
}

void br_waiter_fini(struct waiter *w)
{
	rbuf_reset(&w->rb);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
}

void br_waiter_done(struct waiter *w)
{
	pthread_mutex_lock(&w->mu);
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* An error reply into the waiter; the receiver sends it. */
void br_reply_error(struct waiter *w, enum proto_op op, uint64_t id, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->rb.text, sizeof w->rb.text, fmt, ap);
	va_end(ap);
	proto_reply_error(&w->rb.m, op, id, err, w->rb.text);
	br_waiter_done(w);
}

/* ---- receivers ------------------------------------------------------------------ */

struct recv_arg {
	struct broker *b;
	struct proto_ctx *ctx;
};

static void *receiver(void *arg)
{
	struct broker *b = ((struct recv_arg *)arg)->b;
	struct proto_ctx *ctx = ((struct recv_arg *)arg)->ctx;
	free(arg);
	struct waiter w;
	br_waiter_init(&w);
	while (!atomic_load(&b->stopping)) {
		struct item *it = calloc(1, sizeof *it);
		if (!it) {
			sleep(1);
			continue;
		}
		struct proto_diag d;
		int rc = proto_ctx_recv(ctx, &it->req, 500, &d);
		if (rc) {
			free(it);
			if (rc == BATON_ECLOSED)
				break;
			if (rc != BATON_ETIMEDOUT)
				br_blog("bad request: %s: %s", baton_strerror(rc), d.text);
			continue;
		}
		w.done = 0;
		rbuf_reset(&w.rb);
		it->kind = IT_REQ;
		it->w = &w;
		struct baton_msg *req = &it->req;
		enum proto_op op = req->op;
		uint64_t id = req->id;
		br_post(b, it); /* the decision thread frees it (and the request) */
		br_waiter_wait(&w);
		if (!w.rb.m.reply)
			proto_reply_error(&w.rb.m, op, id, BATON_EINTERNAL, "no reply was made");
		rc = proto_ctx_reply(ctx, &w.rb.m);
		if (rc && rc != BATON_ECLOSED)
			br_blog("reply to %s failed: %s", proto_op_name(op), baton_strerror(rc));
		rbuf_reset(&w.rb);
	}
	br_waiter_fini(&w);
	return NULL;
}

/* A face's way in (broker.h): one request, as a receiver would post it,
 * answered ECLOSED once the decision thread is gone. */
void broker_call(struct broker *b, const struct baton_msg *req,
    void (*fn)(void *arg, const struct baton_msg *rep), void *arg)
{
	struct waiter w;
	br_waiter_init(&w);
	struct item *it = calloc(1, sizeof *it);
	bool posted = false;
	if (it) {
		it->kind = IT_REQ;
		it->w = &w;
		it->req = *req; /* owns nothing: proto_msg_free() leaves it alone */
		pthread_mutex_lock(&b->mu);
		if (!b->loop_done) {
			append(b, it);
			posted = true;
		}
		pthread_mutex_unlock(&b->mu);
	}
	if (posted) {
		br_waiter_wait(&w);
	} else {
		int code = it ? BATON_ECLOSED : BATON_ENOMEM;
		free(it);
		proto_reply_error(&w.rb.m, req->op, req->id, code,
		    code == BATON_ECLOSED ? "the broker is shutting down" : "out of memory");
	}
	if (!w.rb.m.reply)
		proto_reply_error(&w.rb.m, req->op, req->id, BATON_EINTERNAL, "no reply was made");
	fn(arg, &w.rb.m);
	br_waiter_fini(&w);
}

void br_inbox_close(struct broker *b)
{
	pthread_mutex_lock(&b->mu);
	b->loop_done = true;
	struct item *rest = b->head;
	b->head = b->tail = NULL;
	pthread_mutex_unlock(&b->mu);
	for (struct item *it = rest, *nx; it; it = nx) {
		nx = it->next;
		if (it->kind == IT_RELOAD) {
			br_reply_error(it->w, PROTO_OP_STATUS, 0, BATON_ECLOSED, "the broker is shutting down");
		} else if (it->kind == IT_REQ) {
			br_reply_error(it->w, it->req.op, it->req.id, BATON_ECLOSED, "the broker is shutting down");
			proto_msg_free(&it->req);
		} else if (it->kind == IT_DONE) {
			proto_msg_free(&it->rep);
		}
		free(it);
	}
}

int br_receivers_start(struct broker *b)
{
	for (int i = 0; i < RECEIVERS; i++) {
		struct recv_arg *ra = malloc(sizeof *ra);
		if (!ra || proto_ctx_open(b->srv, &b->ctx[i]) != 0) {
			free(ra);
			return BATON_ENOMEM;
		}
		ra->b = b;
		ra->ctx = b->ctx[i];
		if (pthread_create(&b->recv_th[i], NULL, receiver, ra) != 0) {
			free(ra);
			proto_ctx_close(b->ctx[i]);
			b->ctx[i] = NULL;
			return BATON_ENOMEM;
		}
		b->n_recv++;
	}
	return 0;
}
