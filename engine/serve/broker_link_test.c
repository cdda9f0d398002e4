/*
 * broker_link_test.c: what the engine's broker client sends, read by a fake
 * broker (a REP server of proto/): the peer tier's fields in register,
 * heartbeat and report when the engine has a peer device, and none of them
 * when it has not; and what broker_link_wait_start says at an engine's
 * start: nobody there, a refusal (asked again each second, not ten times),
 * then a registration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/serve/broker_link.h"
#include "proto/proto.h"
#include "tests/t.h"

static void state(void *arg, struct broker_link_state *st)
{
	(void)arg;
	snprintf(st->state, sizeof st->state, "ready");
	st->resident = 1000;
	st->mapped = 4096;
	st->free_bytes = 1 << 20;
	st->epoch = 3;
	st->peer_mapped = 6u << 20;
	st->peer_free = 7u << 20;
}

/* Answers requests until one of op `want` came; returns it (caller frees). */
static struct baton_msg wait_op(struct proto_server *srv, int want)
{
	double t0 = t_now();
	while (t_now() - t0 < 10) {
		struct baton_msg req, rep;
		struct proto_diag d;
		int rc = proto_server_recv(srv, &req, 1000, &d);
		if (rc == BATON_ETIMEDOUT)
			continue;
		T_ASSERT_MSG(rc == 0, "recv: %s: %s", baton_strerror(rc), d.text);
		proto_reply_init(&rep, &req);
		rep.epoch = 9;
		proto_set(&rep, PF_EPOCH);
		T_OK(proto_server_reply(srv, &rep));
		if ((int)req.op == want)
			return req;
		proto_msg_free(&req);
	}
	T_FAIL("no %s within 10 s", proto_op_name(want));
}

static void run(const char *peer_gpu)
{
	char url[128];
	snprintf(url, sizeof url, "ipc:///tmp/baton-link-test-%d.sock", (int)getpid());
	struct proto_server *srv;
	T_OK(proto_server_open(&srv, url, NULL));
	struct broker_link_params p = {
		.url = url, .name = "e1", .gpu = "host-0", .model = "m", .ctl = "ipc:///x",
		.pid = (uint32_t)getpid(), .floor = 1, .ceiling = 2, .capacity = 3,
		.peer_gpu = peer_gpu, .peer_want = 36u << 20, .heartbeat_ms = 50,
		.state_fn = state,
	};
	struct broker_link *l;
	T_OK(broker_link_open(&p, &l));
	int peer = peer_gpu && *peer_gpu;

	struct baton_msg m = wait_op(srv, PROTO_OP_REGISTER);
	T_EQ_INT(proto_has(&m, PF_PEER_GPU), peer);
	T_EQ_INT(proto_has(&m, PF_PEER_WANT), peer);
	T_EQ_INT(proto_has(&m, PF_PEER_MAPPED), peer);
	T_EQ_INT(proto_has(&m, PF_PEER_FREE), peer);
	if (peer) {
		T_ASSERT(strcmp(m.peer_gpu, peer_gpu) == 0);
		T_EQ_INT(m.peer_want, 36u << 20);
		T_EQ_INT(m.peer_mapped, 6u << 20);
		T_EQ_INT(m.peer_free, 7u << 20);
	}
	proto_msg_free(&m);

	m = wait_op(srv, PROTO_OP_HEARTBEAT);
	T_EQ_INT(proto_has(&m, PF_PEER_MAPPED), peer);
	T_EQ_INT(proto_has(&m, PF_PEER_FREE), peer);
	if (peer)
		T_EQ_INT(m.peer_mapped, 6u << 20);
	proto_msg_free(&m);

	broker_link_report(l, "peer", 1.5, 42);
	m = wait_op(srv, PROTO_OP_REPORT);
	T_EQ_INT(proto_has(&m, PF_PEER_MAPPED), peer);
	T_EQ_INT(proto_has(&m, PF_PEER_FREE), peer);
	if (peer)
		T_EQ_INT(m.peer_free, 7u << 20);
	proto_msg_free(&m);

	broker_link_close(l, false);
	proto_server_close(srv);
}

static void t_peer_fields(void)
{
	run("host-1");
}

static void t_no_peer_fields(void)
{
	run(NULL);
	run("");
}

static void t_wait_start_nobody(void)
{
	char url[128];
	snprintf(url, sizeof url, "ipc:///tmp/baton-link-test-none-%d.sock", (int)getpid());
	struct broker_link_params p = { .url = url, .name = "e1", .gpu = "host-0", .ctl = "ipc:///x",
		.state_fn = state };
	struct broker_link *l;
	T_OK(broker_link_open(&p, &l));
	char err[512] = "";
	double t0 = t_now();
	T_EQ_INT(broker_link_wait_start(l, 300, err, sizeof err), BATON_ECONN);
	T_ASSERT(t_now() - t0 >= 0.29);
	T_ASSERT_MSG(strstr(err, url) != NULL, "%s", err);
	broker_link_close(l, false);
}

/* A broker that refuses register (the name is taken) for `refuse_s`
 * seconds, then accepts it: wait_start answers the refusal at once, the
 * link asks again each second, and registers when the name is free. */
static void t_wait_start_refused(void)
{
	char url[128];
	snprintf(url, sizeof url, "ipc:///tmp/baton-link-test-r-%d.sock", (int)getpid());
	struct proto_server *srv;
	T_OK(proto_server_open(&srv, url, NULL));
	struct broker_link_params p = { .url = url, .name = "e1", .gpu = "host-0", .ctl = "ipc:///x",
		.heartbeat_ms = 50, .state_fn = state };
	struct broker_link *l;
	T_OK(broker_link_open(&p, &l));
	struct baton_msg req, rep;
	struct proto_diag d;
	T_OK(proto_server_recv(srv, &req, 5000, &d));
	T_EQ_INT(req.op, PROTO_OP_REGISTER);
	proto_reply_error(&rep, req.op, req.id, BATON_EEXIST,
	    "register: an engine named 'e1' is already registered (pid 1)");
	T_OK(proto_server_reply(srv, &rep));
	proto_msg_free(&req);
	char err[512] = "";
	double t0 = t_now();
	T_EQ_INT(broker_link_wait_start(l, 5000, err, sizeof err), BATON_EEXIST);
	T_ASSERT_MSG(t_now() - t0 < 1.0, "the refusal took %.3f s", t_now() - t0);
	T_ASSERT_MSG(strstr(err, "already registered") != NULL, "%s", err);
	T_ASSERT(!broker_link_up(l));
	/* 1.5 s of refusals: two or three asks, not fifteen */
	int asks = 0;
	t0 = t_now();
	while (t_now() - t0 < 1.5) {
		int rc = proto_server_recv(srv, &req, 100, &d);
		if (rc == BATON_ETIMEDOUT)
			continue;
		T_OK(rc);
		T_EQ_INT(req.op, PROTO_OP_REGISTER);
		proto_reply_error(&rep, req.op, req.id, BATON_EEXIST, "taken");
		T_OK(proto_server_reply(srv, &rep));
		proto_msg_free(&req);
		asks++;
	}
	T_ASSERT_MSG(asks >= 1 && asks <= 3, "%d asks in 1.5 s", asks);
	/* The name is free now: the next ask registers. */
	struct baton_msg m = wait_op(srv, PROTO_OP_REGISTER);
	proto_msg_free(&m);
	T_ASSERT(broker_link_wait_up(l, 2000));
	T_EQ_INT(broker_link_wait_start(l, 2000, err, sizeof err), 0);
	broker_link_close(l, false);
	proto_server_close(srv);
}

T_MAIN(T_CASE(t_peer_fields), T_CASE(t_no_peer_fields), T_CASE(t_wait_start_nobody),
    T_CASE(t_wait_start_refused))
