/*
 * transport_pubsub.c: events: a PUB socket that publishes (proto_pub_*)
 * and a SUB socket that receives every event (proto_sub_*).
 */
#include <stdlib.h>
#include <string.h>


#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/pubsub0/sub.h>

#include "proto/transport_int.h"

/* PUB drops the oldest queued event for a subscriber whose queue is full
 * (nng's default is 16 messages); SUB keeps as many. Events carry seq, so
 * a subscriber sees a gap. */
#define EVENT_QUEUE 1024

struct proto_pub {
	struct psock ps;
};

struct proto_sub {
	struct psock ps;
	nng_aio *aio;
};

int proto_pub_open(struct proto_pub **out, const char *url, const struct proto_opts *o)
{
	struct proto_pub *pub;
	int err, rv;
	*out = NULL;
	if (!(pub = calloc(1, sizeof *pub)))
		return BATON_ENOMEM;
	if ((err = proto__psock_open(&pub->ps, nng_pub0_open)))
		goto fail;
	if ((rv = nng_socket_set_int(pub->ps.s, NNG_OPT_SENDBUF, EVENT_QUEUE)) != 0) {
		err = proto__nng_err(rv, false);
		goto fail;
	}
	if ((err = proto__psock_start(&pub->ps, url, o, true)))
		goto fail;
	*out = pub;
	return 0;
fail:
	proto_pub_close(pub);
	return err;
}

int proto_publish(struct proto_pub *pub, const struct baton_msg *ev)
{
	nng_msg *msg;
	int err, rv;
	if (!pub || ev->op != PROTO_OP_EVENT || ev->reply)
		return BATON_EINVAL;
	if ((err = proto__encode_nng(ev, &msg, NULL)))
		return err;
	rv = NNG_ECLOSED;
	if (gate_enter(&pub->ps)) {
		rv = nng_sendmsg(pub->ps.s, msg, 0);
		gate_leave(&pub->ps);
	}
	if (rv != 0) {
		nng_msg_free(msg);
		return proto__nng_err(rv, false);
	}
	return 0;
}

int proto_pub_close(struct proto_pub *pub)
{
	if (!pub)
		return 0;
	if (proto__psock_fini(&pub->ps))
		return BATON_ETIMEDOUT;
	free(pub);
	return 0;
}

const char *proto_pub_url(const struct proto_pub *pub)
{
	return pub && pub->ps.url ? pub->ps.url : "";
}

int proto_sub_open(struct proto_sub **out, const char *url, const struct proto_opts *o)
{
	struct proto_sub *sub;
	int err, rv;
	*out = NULL;
	if (!(sub = calloc(1, sizeof *sub)))
		return BATON_ENOMEM;
	if ((err = proto__psock_open(&sub->ps, nng_sub0_open)))
		goto fail;
	if ((rv = nng_aio_alloc(&sub->aio, NULL, NULL)) != 0) {
		err = proto__nng_err(rv, false);
		goto fail;
	}
	/* topic-less: the empty prefix matches every message */
	if ((rv = nng_socket_set(sub->ps.s, NNG_OPT_SUB_SUBSCRIBE, "", 0)) != 0 ||
	    (rv = nng_socket_set_int(sub->ps.s, NNG_OPT_RECVBUF, EVENT_QUEUE)) != 0) {
		err = proto__nng_err(rv, false);
		goto fail;
	}
	if ((err = proto__psock_start(&sub->ps, url, o, false)))
		goto fail;
	*out = sub;
	return 0;
fail:
	proto_sub_close(sub);
	return err;
}

int proto_sub_recv(struct proto_sub *sub, struct baton_msg *ev, int timeout_ms,
    struct proto_diag *diag)
{
	struct proto_diag local;
	int err;
	if (!diag)
		diag = &local;
	memset(diag, 0, sizeof *diag);
	memset(ev, 0, sizeof *ev);
	if ((err = proto__aio_run(&sub->ps, sub->aio, timeout_ms, proto__start_sock_recv, &sub->ps.s)))
		return proto__fail(diag, err, "receive: %s", baton_strerror(err));
	nng_msg *msg = nng_aio_get_msg(sub->aio);
	err = proto_decode(nng_msg_body(msg), nng_msg_len(msg), ev, diag);
	if (!err)
		ev->pipe = nng_pipe_id(nng_msg_get_pipe(msg));
	nng_msg_free(msg);
	if (!err && ev->op != PROTO_OP_EVENT) {
		diag->id = ev->id;
		diag->op = ev->op;
		proto_msg_free(ev);
		err = proto__fail(diag, BATON_EINVAL, "a subscriber takes events only");
	}
	return err;
}

int proto_sub_close(struct proto_sub *sub)
{
	if (!sub)
		return 0;
	if (proto__psock_fini(&sub->ps))
		return BATON_ETIMEDOUT;
	if (sub->aio)
		nng_aio_free(sub->aio);
	free(sub);
	return 0;
}
