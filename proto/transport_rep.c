/*
 * transport_rep.c: the REP server (proto_server_*) and its contexts
 * (proto_ctx_*): several requests served at once, each answered on the
 * context it came in on; a request that does not decode is answered here
 * with an error reply.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "proto/transport_int.h"

struct proto_ctx {
	struct psock *ps;
	nng_ctx ctx;
	nng_aio *aio;
	int send_timeout_ms;
};

struct proto_server {
	struct psock ps;
	struct proto_ctx *own;
};

int proto_ctx_open(struct proto_server *srv, struct proto_ctx **out)
{
	struct proto_ctx *c;
	int rv;
	*out = NULL;
	if (!srv)
		return BATON_EINVAL;
	if (!(c = calloc(1, sizeof *c)))
		return BATON_ENOMEM;
	if ((rv = nng_aio_alloc(&c->aio, NULL, NULL)) != 0) {
		free(c);
		return proto__nng_err(rv, false);
	}
	rv = NNG_ECLOSED;
	if (gate_enter(&srv->ps)) {
		rv = nng_ctx_open(&c->ctx, srv->ps.s);
		gate_leave(&srv->ps);
	}
	if (rv != 0) {
		nng_aio_free(c->aio);
		free(c);
		return proto__nng_err(rv, false);
	}
	c->ps = &srv->ps;
	c->send_timeout_ms = srv->ps.send_timeout_ms;
	*out = c;
	return 0;
}

void proto_ctx_close(struct proto_ctx *c)
{
	if (!c)
		return;
	/* After a shutdown nng has closed the context with its socket. */
	if (gate_enter(c->ps)) {
		nng_ctx_close(c->ctx);
		gate_leave(c->ps);
	}
	nng_aio_free(c->aio);
	free(c);
}

int proto_server_open(struct proto_server **out, const char *url, const struct proto_opts *o)
{
	struct proto_server *srv;
	int err;
	*out = NULL;
	if (!(srv = calloc(1, sizeof *srv)))
		return BATON_ENOMEM;
	if ((err = proto__psock_open(&srv->ps, nng_rep0_open)))
		goto fail;
	if ((err = proto__psock_start(&srv->ps, url, o, true)))
		goto fail;
	if ((err = proto_ctx_open(srv, &srv->own)))
		goto fail;
	*out = srv;
	return 0;
fail:
	proto_server_close(srv);
	return err;
}

int proto_server_shutdown(struct proto_server *srv)
{
	if (srv && !proto__psock_shutdown(&srv->ps))
		return BATON_ETIMEDOUT;
	return 0;
}

int proto_server_close(struct proto_server *srv)
{
	if (!srv)
		return 0;
	proto_ctx_close(srv->own);
	srv->own = NULL;
	if (proto__psock_fini(&srv->ps))
		return BATON_ETIMEDOUT; /* leaked: nng may still use it */
	free(srv);
	return 0;
}

const char *proto_server_url(const struct proto_server *srv)
{
	return srv && srv->ps.url ? srv->ps.url : "";
}

static int ctx_send_msg(struct proto_ctx *c, nng_msg *msg)
{
	nng_aio_set_msg(c->aio, msg);
	int err = proto__aio_run(c->ps, c->aio, c->send_timeout_ms, proto__start_ctx_send, &c->ctx);
	if (err)
		nng_msg_free(nng_aio_get_msg(c->aio)); /* not sent: still ours */
	return err;
}

/* An error reply; when even that does not encode, a bare one. */
static int ctx_send_error(struct proto_ctx *c, enum proto_op op, uint64_t id, int err,
    const char *text)
{
	struct baton_msg rep;
	nng_msg *msg;
	if (op == PROTO_OP_EVENT)
		op = PROTO_OP_NONE; /* an event has no reply of its own */
	proto_reply_error(&rep, op, id, err, text && *text ? text : NULL);
	if (proto__encode_nng(&rep, &msg, NULL)) {
		proto_reply_error(&rep, PROTO_OP_NONE, id, err, NULL);
		if (proto__encode_nng(&rep, &msg, NULL))
			return BATON_ENOMEM;
	}
	return ctx_send_msg(c, msg);
}

int proto_ctx_recv(struct proto_ctx *c, struct baton_msg *req, int timeout_ms,
    struct proto_diag *diag)
{
	struct proto_diag local;
	int err;
	if (!diag)
		diag = &local;
	memset(diag, 0, sizeof *diag);
	memset(req, 0, sizeof *req);
	if ((err = proto__aio_run(c->ps, c->aio, timeout_ms, proto__start_ctx_recv, &c->ctx)))
		return proto__fail(diag, err, "receive: %s", baton_strerror(err));
	nng_msg *msg = nng_aio_get_msg(c->aio);
	uint32_t pipe = nng_pipe_id(nng_msg_get_pipe(msg));
	err = proto_decode(nng_msg_body(msg), nng_msg_len(msg), req, diag);
	nng_msg_free(msg);
	if (!err && (req->reply || req->op == PROTO_OP_EVENT)) {
		diag->id = req->id;
		diag->op = req->op;
		err = proto__fail(diag, BATON_EINVAL, "a server takes requests, not %s",
		    req->reply ? "replies" : "events");
		proto_msg_free(req);
	}
	if (err) {
		/* Answer, so the client is not left waiting; whether that works
		 * or not, the caller hears about the bad request. */
		ctx_send_error(c, diag->op, diag->id, err, diag->text);
		return err;
	}
	req->pipe = pipe;
	return 0;
}

int proto_ctx_reply(struct proto_ctx *c, const struct baton_msg *rep)
{
	struct proto_diag d;
	nng_msg *msg;
	int err = proto__encode_nng(rep, &msg, &d);
	if (err) {
		char text[sizeof d.text + 32];
		snprintf(text, sizeof text, "reply did not encode: %s", d.text);
		ctx_send_error(c, rep->op, rep->id, BATON_EINTERNAL, text);
		return err;
	}
	if (proto__send_fault("reply")) {
		nng_msg_free(msg);
		return BATON_ECLOSED;
	}
	return ctx_send_msg(c, msg);
}

int proto_server_recv(struct proto_server *srv, struct baton_msg *req, int timeout_ms,
    struct proto_diag *diag)
{
	return proto_ctx_recv(srv->own, req, timeout_ms, diag);
}

int proto_server_reply(struct proto_server *srv, const struct baton_msg *rep)
{
	return proto_ctx_reply(srv->own, rep);
}
