/*
 * transport_req.c: the REQ client (proto_client_*, proto_call): each call
 * on a context of its own, so one client issues several at once; nng
 * resends a request whose reply is late (resend_ms).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "proto/transport_int.h"

#define DEFAULT_RESEND_MS 60000

struct proto_client {
	struct psock ps;
};

int proto_client_open(struct proto_client **out, const char *url, const struct proto_opts *o)
{
	struct proto_client *cli;
	int err, rv;
	*out = NULL;
	if (!(cli = calloc(1, sizeof *cli)))
		return BATON_ENOMEM;
	if ((err = proto__psock_open(&cli->ps, nng_req0_open)))
		goto fail;
	int resend = o && o->resend_ms ? o->resend_ms : DEFAULT_RESEND_MS;
	if ((rv = nng_socket_set_ms(cli->ps.s, NNG_OPT_REQ_RESENDTIME, proto__dur(resend))) != 0) {
		err = proto__nng_err(rv, false);
		goto fail;
	}
	if ((err = proto__psock_start(&cli->ps, url, o, false)))
		goto fail;
	*out = cli;
	return 0;
fail:
	proto_client_close(cli);
	return err;
}

int proto_client_shutdown(struct proto_client *cli)
{
	if (cli && !proto__psock_shutdown(&cli->ps))
		return BATON_ETIMEDOUT;
	return 0;
}

int proto_client_close(struct proto_client *cli)
{
	if (!cli)
		return 0;
	if (proto__psock_fini(&cli->ps))
		return BATON_ETIMEDOUT;
	free(cli);
	return 0;
}

static int remaining(double deadline, int timeout_ms)
{
	if (timeout_ms < 0)
		return -1;
	double left = deadline - proto__now_ms();
	return left <= 0 ? 0 : (int)(left + 0.999);
}

/* Sends msg (ours; freed here) on a fresh context and waits for the reply
 * message (*out, the caller's) within the deadline. */
static int call_msg(struct proto_client *cli, nng_msg *msg, const char *what,
    int timeout_ms, nng_msg **out, struct proto_diag *diag)
{
	double deadline = proto__now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	nng_ctx ctx;
	nng_aio *aio;
	int err, rv;

	*out = NULL;
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		nng_msg_free(msg);
		return proto__fail(diag, proto__nng_err(rv, false), "no aio");
	}
	rv = NNG_ECLOSED;
	if (gate_enter(&cli->ps)) {
		rv = nng_ctx_open(&ctx, cli->ps.s);
		gate_leave(&cli->ps);
	}
	if (rv != 0) {
		nng_msg_free(msg);
		nng_aio_free(aio);
		return proto__fail(diag, proto__nng_err(rv, false), "%s: no context: %s", what,
		    baton_strerror(proto__nng_err(rv, false)));
	}
	/* The send completes when the request is on a pipe: it waits for a
	 * connection, within the same deadline. */
	nng_aio_set_msg(aio, msg);
	if ((err = proto__aio_run(&cli->ps, aio, remaining(deadline, timeout_ms), proto__start_ctx_send, &ctx))) {
		nng_msg_free(nng_aio_get_msg(aio));
		proto__fail(diag, err, "%s %s: %s", what,
		    err == BATON_ETIMEDOUT ? "was not sent" : "send", baton_strerror(err));
	} else if ((err = proto__aio_run(&cli->ps, aio, remaining(deadline, timeout_ms), proto__start_ctx_recv, &ctx))) {
		proto__fail(diag, err, "%s: no reply: %s", what, baton_strerror(err));
	} else {
		*out = nng_aio_get_msg(aio);
	}
	if (gate_enter(&cli->ps)) {
		nng_ctx_close(ctx);
		gate_leave(&cli->ps);
	}
	nng_aio_free(aio);
	return err;
}

int proto_client_call(struct proto_client *cli, const struct baton_msg *req,
    struct baton_msg *rep, int timeout_ms, struct proto_diag *diag)
{
	struct proto_diag local;
	nng_msg *msg;
	int err;

	if (!diag)
		diag = &local;
	memset(diag, 0, sizeof *diag);
	memset(rep, 0, sizeof *rep);
	if (!cli || req->reply || req->op == PROTO_OP_EVENT)
		return proto__fail(diag, BATON_EINVAL, "a call sends a request");
	if ((err = proto__encode_nng(req, &msg, diag)))
		return err;
	if (proto__send_fault("request")) {
		nng_msg_free(msg);
		return proto__fail(diag, BATON_ECLOSED, "%s send: %s (injected)",
		    proto_op_name(req->op), baton_strerror(BATON_ECLOSED));
	}
	if ((err = call_msg(cli, msg, proto_op_name(req->op), timeout_ms, &msg, diag)))
		return err;
	err = proto_decode(nng_msg_body(msg), nng_msg_len(msg), rep, diag);
	rep->pipe = err ? 0 : nng_pipe_id(nng_msg_get_pipe(msg));
	nng_msg_free(msg);
	if (err)
		return err;
	if (!rep->reply) {
		err = proto__fail(diag, BATON_EMSG, "the answer to %s is not a reply",
		    proto_op_name(req->op));
	} else if (rep->ok || rep->id != 0 || rep->op != PROTO_OP_NONE) {
		/* An error reply with neither id nor op answers a request the
		 * server could not read; nng matched it to ours anyway. */
		if (rep->id != req->id)
			err = proto__fail(diag, BATON_EMSG, "reply id %" PRIu64 " is not the request's %" PRIu64,
			    rep->id, req->id);
		else if (rep->op != req->op && !(!rep->ok && rep->op == PROTO_OP_NONE))
			err = proto__fail(diag, BATON_EMSG, "reply op %s is not the request's %s",
			    proto_op_name(rep->op), proto_op_name(req->op));
	}
	if (err) {
		proto_msg_free(rep);
		return err;
	}
	if (!rep->ok) {
		err = rep->err;
		proto__fail(diag, err, "%s", rep->msg);
	}
	return err;
}

int proto__client_call_raw(struct proto_client *cli, const void *buf, size_t len,
    struct baton_msg *rep, int timeout_ms, struct proto_diag *diag)
{
	struct proto_diag local;
	nng_msg *msg;
	int err, rv;

	if (!diag)
		diag = &local;
	memset(diag, 0, sizeof *diag);
	memset(rep, 0, sizeof *rep);
	if ((rv = nng_msg_alloc(&msg, len)) != 0)
		return proto__fail(diag, BATON_ENOMEM, "no memory for %zu bytes", len);
	if (len)
		memcpy(nng_msg_body(msg), buf, len);
	if ((err = call_msg(cli, msg, "raw request", timeout_ms, &msg, diag)))
		return err;
	err = proto_decode(nng_msg_body(msg), nng_msg_len(msg), rep, diag);
	rep->pipe = err ? 0 : nng_pipe_id(nng_msg_get_pipe(msg));
	nng_msg_free(msg);
	return err;
}

int proto_call(const char *url, const struct baton_msg *req, struct baton_msg *rep,
    int timeout_ms, struct proto_diag *diag)
{
	struct proto_opts o = { .dial_wait = true };
	struct proto_client *cli;
	int err = proto_client_open(&cli, url, &o);
	if (err) {
		memset(rep, 0, sizeof *rep);
		if (diag) {
			memset(diag, 0, sizeof *diag);
			proto__fail(diag, err, "cannot connect to %s: %s", url ? url : "(null)",
			    baton_strerror(err));
		}
		return err;
	}
	err = proto_client_call(cli, req, rep, timeout_ms, diag);
	proto_client_close(cli);
	return err;
}
