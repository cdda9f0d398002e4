/*
 * transport_test.c: real nng sockets in a temporary folder: REQ/REP over
 * ipc and tcp, timeouts, the receive size cap, error replies to bad bytes,
 * concurrent contexts, PUB/SUB, pipe events when a peer is killed -9,
 * peers that hang up before the handshake, and resends across a server
 * restart.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/transport_int.h"
#include "tests/t.h"

extern char **environ;

static char tmpdir[64];
static char url_buf[4][128];

static const char *tmp_url(int i, const char *name)
{
	if (!tmpdir[0]) {
		strcpy(tmpdir, "/tmp/baton-proto-XXXXXX");
		T_ASSERT(mkdtemp(tmpdir) != NULL);
	}
	snprintf(url_buf[i], sizeof url_buf[i], "ipc://%s/%s", tmpdir, name);
	return url_buf[i];
}

static void cleanup_tmp(void)
{
	if (tmpdir[0]) {
		char cmd[128];
		snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
		if (system(cmd) != 0)
			fprintf(stderr, "cannot remove %s\n", tmpdir);
	}
}

static double now_ms(void)
{
	return t_now() * 1e3;
}

/* ---- a server on worker threads --------------------------------------------------- */

enum mode { ECHO, FAIL, SILENT, SLOW, BROKEN };

struct worker {
	struct proto_server *srv;
	struct proto_ctx *ctx;
	pthread_t th;
	enum mode mode;
	_Atomic int *handled;
	_Atomic int *bad;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	for (;;) {
		struct baton_msg req, rep;
		struct proto_diag d;
		int err = proto_ctx_recv(w->ctx, &req, -1, &d);
		if (err == BATON_ECLOSED)
			break;
		if (err) {
			atomic_fetch_add(w->bad, 1);
			continue;
		}
		atomic_fetch_add(w->handled, 1);
		switch (w->mode) {
		case ECHO:
			proto__sample(&rep, req.op, 1);
			rep.id = req.id;
			proto_ctx_reply(w->ctx, &rep);
			break;
		case SLOW:
			usleep(200 * 1000);
			proto__sample(&rep, req.op, 1);
			rep.id = req.id;
			proto_ctx_reply(w->ctx, &rep);
			break;
		case FAIL:
			proto_reply_error(&rep, req.op, req.id, BATON_ENOTFOUND, "no engine named qwen");
			proto_ctx_reply(w->ctx, &rep);
			break;
		case BROKEN:
			/* a release reply needs state: NULL here */
			proto_reply_init(&rep, &req);
			T_EQ_ERR(proto_ctx_reply(w->ctx, &rep), BATON_EMISSING);
			break;
		case SILENT:
			break;
		}
		proto_msg_free(&req);
	}
	return NULL;
}

struct server {
	struct proto_server *srv;
	struct worker w[8];
	int n;
	_Atomic int handled, bad;
};

static void server_start(struct server *s, const char *url, int workers, enum mode mode,
    const struct proto_opts *o)
{
	memset(s, 0, sizeof *s);
	T_OK(proto_server_open(&s->srv, url, o));
	s->n = workers;
	for (int i = 0; i < workers; i++) {
		struct worker *w = &s->w[i];
		w->srv = s->srv;
		w->mode = mode;
		w->handled = &s->handled;
		w->bad = &s->bad;
		T_OK(proto_ctx_open(s->srv, &w->ctx));
		T_ASSERT(pthread_create(&w->th, NULL, worker_main, w) == 0);
	}
}

static void server_stop(struct server *s)
{
	proto_server_shutdown(s->srv);
	for (int i = 0; i < s->n; i++) {
		pthread_join(s->w[i].th, NULL);
		proto_ctx_close(s->w[i].ctx);
	}
	proto_server_close(s->srv);
	s->srv = NULL;
}

/* Counters move after the reply is on its way: wait for them. */
static int wait_count(_Atomic int *c, int want)
{
	for (int i = 0; i < 300 && atomic_load(c) < want; i++)
		usleep(10 * 1000);
	return atomic_load(c);
}

/* ---- cases ------------------------------------------------------------------------- */

static void t_reqrep_ipc(void)
{
	struct server s;
	const char *url = tmp_url(0, "rep.sock");
	server_start(&s, url, 1, ECHO, NULL);
	T_EQ_STR(proto_server_url(s.srv), url);

	struct proto_client *cli;
	T_OK(proto_client_open(&cli, url, NULL));
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_EVENT; op++) {
		struct baton_msg req, rep;
		struct proto_diag d;
		char why[128];
		proto__sample(&req, (enum proto_op)op, 0);
		req.id = proto_next_id();
		int err = proto_client_call(cli, &req, &rep, 5000, &d);
		T_ASSERT_MSG(err == 0, "%s: %s: %s", proto_op_name((enum proto_op)op), baton_errname(err), d.text);
		struct baton_msg want;
		proto__sample(&want, (enum proto_op)op, 1);
		want.id = req.id;
		rep.pipe = 0;
		T_ASSERT_MSG(proto__msg_equal(&want, &rep, why, sizeof why), "%s: %s",
		    proto_op_name((enum proto_op)op), why);
		proto_msg_free(&rep);
	}
	T_EQ_INT(wait_count(&s.handled, PROTO_OP_EVENT - 1), PROTO_OP_EVENT - 1);
	proto_client_close(cli);

	/* the one-shot form */
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_call(url, &req, &rep, 5000, NULL));
	T_ASSERT(rep.reply && rep.ok && rep.id == req.id && rep.pipe != 0);
	T_ASSERT(rep.engines.n == 2);
	T_EQ_STR(rep.engines.v[0].name, "qwen");
	proto_msg_free(&rep);
	server_stop(&s);

	/* the socket file is 0660 */
	struct stat st;
	struct server s2;
	server_start(&s2, url, 1, ECHO, NULL);
	T_ASSERT(stat(url + 6, &st) == 0);
	T_EQ_INT(st.st_mode & 0777, 0660);
	server_stop(&s2);
	struct proto_opts o = { .ipc_mode = 0600 };
	server_start(&s2, url, 1, ECHO, &o);
	T_ASSERT(stat(url + 6, &st) == 0);
	T_EQ_INT(st.st_mode & 0777, 0600);
	server_stop(&s2);
	cleanup_tmp();
}

static void t_reqrep_tcp(void)
{
	struct server s;
	server_start(&s, "tcp://127.0.0.1:0", 2, ECHO, NULL);
	const char *url = proto_server_url(s.srv);
	T_ASSERT_MSG(strncmp(url, "tcp://127.0.0.1:", 16) == 0 && strcmp(url, "tcp://127.0.0.1:0") != 0,
	    "url %s", url);
	struct baton_msg req, rep;
	proto__sample(&req, PROTO_OP_GEN, 0);
	T_OK(proto_call(url, &req, &rep, 5000, NULL));
	T_EQ_INT(rep.steps, 1000 + PF_STEPS);
	T_EQ_INT(rep.output.len, 32);
	T_EQ_INT(proto_pipe_pid(rep.pipe), -1); /* not ipc */
	proto_msg_free(&rep);
	server_stop(&s);
}

/* Pipe ids and peer pids of requests on ipc. */
static _Atomic int seen_pid;
static void *pid_worker(void *arg)
{
	struct proto_server *srv = arg;
	struct baton_msg req, rep;
	if (proto_server_recv(srv, &req, 5000, NULL) == 0) {
		atomic_store(&seen_pid, proto_pipe_pid(req.pipe));
		proto_reply_init(&rep, &req);
		proto_server_reply(srv, &rep);
		proto_msg_free(&req);
	}
	return NULL;
}

static void t_request_pipe_pid(void)
{
	struct proto_server *srv;
	pthread_t th;
	const char *url = tmp_url(0, "pid.sock");
	T_OK(proto_server_open(&srv, url, NULL));
	T_ASSERT(pthread_create(&th, NULL, pid_worker, srv) == 0);
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_call(url, &req, &rep, 5000, NULL));
	proto_msg_free(&rep);
	pthread_join(th, NULL);
	T_EQ_INT(atomic_load(&seen_pid), getpid());
	proto_server_close(srv);
	cleanup_tmp();
}

static void t_error_reply(void)
{
	struct server s;
	const char *url = tmp_url(0, "err.sock");
	server_start(&s, url, 1, FAIL, NULL);
	struct baton_msg req, rep;
	struct proto_diag d;
	proto_msg_init(&req, PROTO_OP_RELEASE);
	req.name = "qwen";
	proto_set(&req, PF_NAME);
	T_EQ_ERR(proto_call(url, &req, &rep, 5000, &d), BATON_ENOTFOUND);
	T_ASSERT(rep.reply && !rep.ok && rep.id == req.id && rep.op == PROTO_OP_RELEASE);
	T_EQ_STR(rep.msg, "no engine named qwen");
	T_EQ_STR(d.text, "no engine named qwen");
	proto_msg_free(&rep);
	server_stop(&s);

	/* a reply that does not encode becomes an internal error for the client */
	server_start(&s, url, 1, BROKEN, NULL);
	proto__sample(&req, PROTO_OP_RELEASE, 0);
	T_EQ_ERR(proto_call(url, &req, &rep, 5000, &d), BATON_EINTERNAL);
	T_EQ_INT(rep.op, PROTO_OP_RELEASE);
	T_ASSERT(strstr(rep.msg, "did not encode") != NULL);
	proto_msg_free(&rep);
	server_stop(&s);
	cleanup_tmp();
}

static void t_timeouts(void)
{
	const char *url = tmp_url(0, "silent.sock");
	struct baton_msg req, rep;
	struct proto_diag d;
	proto_msg_init(&req, PROTO_OP_STATUS);

	/* a server that never answers */
	struct server s;
	server_start(&s, url, 1, SILENT, NULL);
	double t0 = now_ms();
	T_EQ_ERR(proto_call(url, &req, &rep, 300, &d), BATON_ETIMEDOUT);
	double dt = now_ms() - t0;
	T_ASSERT_MSG(dt >= 290 && dt < 2000, "took %.0f ms", dt);
	T_ASSERT(!rep.reply);
	server_stop(&s);

	/* nobody listening: a background client times out, a one-shot call
	 * cannot connect */
	struct proto_client *cli;
	T_OK(proto_client_open(&cli, url, NULL));
	t0 = now_ms();
	T_EQ_ERR(proto_client_call(cli, &req, &rep, 200, &d), BATON_ETIMEDOUT);
	dt = now_ms() - t0;
	T_ASSERT_MSG(dt >= 190 && dt < 2000, "took %.0f ms", dt);
	proto_client_close(cli);
	T_EQ_ERR(proto_call(url, &req, &rep, 200, &d), BATON_ECONN);
	T_EQ_ERR(proto_call("tcp://127.0.0.1:1", &req, &rep, 200, &d), BATON_ECONN);

	/* a server receive with nobody sending */
	struct proto_server *srv;
	T_OK(proto_server_open(&srv, url, NULL));
	t0 = now_ms();
	T_EQ_ERR(proto_server_recv(srv, &req, 100, &d), BATON_ETIMEDOUT);
	dt = now_ms() - t0;
	T_ASSERT_MSG(dt >= 95 && dt < 2000, "took %.0f ms", dt);
	proto_server_close(srv);
	cleanup_tmp();
}

/* A background client started before its server: the call goes through
 * once the server is up. */
static void t_client_before_server(void)
{
	const char *url = tmp_url(0, "late.sock");
	struct proto_client *cli;
	T_OK(proto_client_open(&cli, url, NULL));
	struct server s;
	server_start(&s, url, 1, ECHO, NULL);
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_client_call(cli, &req, &rep, 5000, NULL));
	proto_msg_free(&rep);
	proto_client_close(cli);
	server_stop(&s);
	cleanup_tmp();
}

/* Bytes our encoder would never send, through a client of our own (so its
 * close is bounded too). */
static int raw_call(const char *url, const void *buf, size_t len, struct baton_msg *rep,
    int timeout_ms)
{
	struct proto_client *cli;
	struct proto_diag d;
	/* no resend: a server that drops the connection fails the call */
	struct proto_opts o = { .dial_wait = true, .resend_ms = -1, .close_timeout_ms = 1000 };
	T_OK(proto_client_open(&cli, url, &o));
	int err = proto__client_call_raw(cli, buf, len, rep, timeout_ms, &d);
	if (err && getenv("T_VERBOSE"))
		fprintf(stderr, "raw call of %zu bytes: %s\n", len, d.text);
	proto_client_close(cli);
	return err;
}

static void t_bad_requests_get_error_replies(void)
{
	struct server s;
	const char *url = tmp_url(0, "bad.sock");
	server_start(&s, url, 1, ECHO, NULL);
	struct baton_msg rep;

	T_OK(raw_call(url, "garbage", 7, &rep, 3000));
	T_ASSERT(rep.reply && !rep.ok && rep.id == 0 && rep.op == PROTO_OP_NONE);
	T_EQ_ERR(rep.err, BATON_EMSG);
	proto_msg_free(&rep);

	T_OK(raw_call(url, "\xdd\xff\xff\xff\xff", 5, &rep, 3000));
	T_EQ_ERR(rep.err, BATON_ETOOBIG);
	proto_msg_free(&rep);

	/* {"v":1,"op":"frob","id":55} : the id comes back, no op */
	static const char unk[] = "\x83\xa1v\x01\xa2op\xa4" "frob\xa2id\x37";
	T_OK(raw_call(url, unk, sizeof unk - 1, &rep, 3000));
	T_EQ_ERR(rep.err, BATON_EUNKNOWNOP);
	T_EQ_INT(rep.id, 55);
	T_EQ_INT(rep.op, PROTO_OP_NONE);
	T_ASSERT(strstr(rep.msg, "frob") != NULL);
	proto_msg_free(&rep);

	/* {"v":1,"op":"release","id":56,"epoch":"x"} : id and op come back */
	static const char typ[] = "\x84\xa1v\x01\xa2op\xa7release\xa2id\x38\xa5" "epoch\xa1x";
	T_OK(raw_call(url, typ, sizeof typ - 1, &rep, 3000));
	T_EQ_ERR(rep.err, BATON_ETYPE);
	T_EQ_INT(rep.id, 56);
	T_EQ_INT(rep.op, PROTO_OP_RELEASE);
	proto_msg_free(&rep);

	/* a reply or an event sent to a server */
	struct baton_msg m;
	void *buf;
	size_t len;
	proto__sample(&m, PROTO_OP_EVENT, 0);
	T_OK(proto_encode(&m, &buf, &len, NULL));
	T_OK(raw_call(url, buf, len, &rep, 3000));
	T_EQ_ERR(rep.err, BATON_EINVAL);
	T_EQ_INT(rep.id, m.id);
	T_EQ_INT(rep.op, PROTO_OP_NONE);
	proto_msg_free(&rep);
	free(buf);
	proto__sample(&m, PROTO_OP_PIN, 1);
	T_OK(proto_encode(&m, &buf, &len, NULL));
	T_OK(raw_call(url, buf, len, &rep, 3000));
	T_EQ_ERR(rep.err, BATON_EINVAL);
	T_EQ_INT(rep.op, PROTO_OP_PIN);
	proto_msg_free(&rep);
	free(buf);

	T_EQ_INT(wait_count(&s.bad, 6), 6);
	T_EQ_INT(atomic_load(&s.handled), 0);
	server_stop(&s);
	cleanup_tmp();
}

/* A call that must be answered at the first try. The client of the
 * dropped call before it closes while its dialer reconnects: a hang-up
 * during a handshake, which stopped nng 1.5.2's listener before
 * transport_hangup.c. */
static void raw_call_ok(const char *url, const void *buf, size_t len, struct baton_msg *rep)
{
	T_OK(raw_call(url, buf, len, rep, 15000)); /* 64 MiB each way, on a busy machine */
}

static void call_ok(const char *url)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_call(url, &req, &rep, 3000, NULL));
	proto_msg_free(&rep);
}

static void t_recvmax_drops_oversize(void)
{
	const char *url = tmp_url(0, "max.sock");
	struct proto_opts o = { .recvmax = 4096 };
	struct server s;
	server_start(&s, url, 1, ECHO, &o);
	struct baton_msg rep;
	static char big[8192];
	memset(big, 0x80, sizeof big);
	/* nng drops the connection; without resend the call fails */
	T_EQ_ERR(raw_call(url, big, sizeof big, &rep, 2000), BATON_ECONN);
	T_EQ_INT(atomic_load(&s.handled) + atomic_load(&s.bad), 0);
	/* the server still serves everyone else */
	call_ok(url);
	server_stop(&s);

	/* the real cap: nng drops what is larger than BATON_PROTO_MAX_MSG and
	 * its header slack; up to that, the decoder refuses it as too big */
	server_start(&s, url, 1, ECHO, NULL);
	size_t n = (size_t)BATON_PROTO_MAX_MSG + 65;
	char *huge = calloc(1, n);
	T_ASSERT(huge);
	huge[0] = (char)0x80;
	T_EQ_ERR(raw_call(url, huge, n, &rep, 3000), BATON_ECONN);
	T_EQ_INT(atomic_load(&s.handled) + atomic_load(&s.bad), 0);
	raw_call_ok(url, huge, BATON_PROTO_MAX_MSG + 1, &rep);
	T_EQ_ERR(rep.err, BATON_ETOOBIG);
	proto_msg_free(&rep);
	raw_call_ok(url, huge, BATON_PROTO_MAX_MSG, &rep);
	T_EQ_ERR(rep.err, BATON_EMSG); /* an empty map and trailing zeros */
	proto_msg_free(&rep);
	free(huge);
	T_EQ_INT(wait_count(&s.bad, 2), 2);
	server_stop(&s);
	cleanup_tmp();
}

/* Several contexts answer at once: 8 slow requests on 4 workers take
 * about two rounds, not eight. */
struct caller {
	struct proto_client *cli;
	int err;
	bool match;
};

static void *caller_main(void *arg)
{
	struct caller *c = arg;
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_HEARTBEAT);
	proto__sample(&req, PROTO_OP_HEARTBEAT, 0);
	req.id = proto_next_id();
	c->err = proto_client_call(c->cli, &req, &rep, 5000, NULL);
	c->match = rep.id == req.id && rep.op == PROTO_OP_HEARTBEAT;
	proto_msg_free(&rep);
	return NULL;
}

static void t_concurrent_contexts(void)
{
	const char *url = tmp_url(0, "conc.sock");
	struct server s;
	server_start(&s, url, 4, SLOW, NULL);
	struct proto_client *cli;
	T_OK(proto_client_open(&cli, url, NULL));
	struct caller c[8];
	pthread_t th[8];
	double t0 = now_ms();
	for (int i = 0; i < 8; i++) {
		c[i] = (struct caller){ cli, -1, false };
		T_ASSERT(pthread_create(&th[i], NULL, caller_main, &c[i]) == 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(th[i], NULL);
		T_OK(c[i].err);
		T_ASSERT(c[i].match);
	}
	double dt = now_ms() - t0;
	T_ASSERT_MSG(dt < 1200, "8 calls of 200 ms on 4 workers took %.0f ms", dt);
	T_EQ_INT(wait_count(&s.handled, 8), 8);
	proto_client_close(cli);
	server_stop(&s);
	cleanup_tmp();
}

/* Shutting down while workers reply and clients call: the gate in
 * transport_sock.c keeps nng 1.5.2's close-time races away from our threads
 * (this case aborted or hung about one run in ten without it). A close
 * that meets nng's lost-read defect must come back within its deadline;
 * after one, nng's reaper is stuck for the rest of the process, so the
 * rounds stop there. */
struct hammer {
	struct proto_client *cli;
	_Atomic bool stop;
	_Atomic int calls;
};

static void *hammer_main(void *arg)
{
	struct hammer *h = arg;
	while (!atomic_load(&h->stop)) {
		struct baton_msg req, rep;
		proto_msg_init(&req, PROTO_OP_STATUS);
		int err = proto_client_call(h->cli, &req, &rep, 100, NULL);
		proto_msg_free(&rep);
		if (err == BATON_ECLOSED)
			break;
		atomic_fetch_add(&h->calls, 1);
	}
	return NULL;
}

static void t_shutdown_under_load(void)
{
	struct proto_opts o = { .close_timeout_ms = 500 };
	int total = 0, rounds = 0;
	for (int round = 0; round < 40 && !proto_nng_wedged(); round++, rounds++) {
		struct server s;
		struct hammer h;
		pthread_t th[4];
		char name[32];
		snprintf(name, sizeof name, "load%d.sock", round);
		const char *url = tmp_url(0, name);
		server_start(&s, url, 4, ECHO, &o);
		h.stop = false;
		h.calls = 0;
		T_OK(proto_client_open(&h.cli, url, &o));
		for (int i = 0; i < 4; i++)
			T_ASSERT(pthread_create(&th[i], NULL, hammer_main, &h) == 0);
		usleep((useconds_t)(2000 + (round % 7) * 1500));
		double t0 = now_ms();
		if (round % 2)
			proto_client_shutdown(h.cli); /* callers end with ECLOSED */
		server_stop(&s);
		atomic_store(&h.stop, true);
		for (int i = 0; i < 4; i++)
			pthread_join(th[i], NULL);
		proto_client_close(h.cli);
		double dt = now_ms() - t0;
		T_ASSERT_MSG(dt < 3 * 500 + 1000, "round %d: closing took %.0f ms", round, dt);
		total += atomic_load(&h.calls);
	}
	if (proto_nng_wedged())
		printf("  (nng 1.5.2 lost a read at close after %d rounds; bounded)\n", rounds);
	T_ASSERT_MSG(total >= rounds && total > 0, "only %d calls in %d rounds", total, rounds);
	cleanup_tmp();
}

/* The defect itself: a client closes while the reply of its timed-out
 * call arrives. Every close must come back within its deadline. */
static void t_close_races_bounded(void)
{
	struct proto_opts o = { .close_timeout_ms = 300 };
	struct server s;
	const char *url = tmp_url(0, "race.sock");
	server_start(&s, url, 2, SLOW, &o);
	int round, wedged_at = -1;
	for (round = 0; round < 60 && wedged_at < 0; round++) {
		struct proto_client *cli;
		struct baton_msg req, rep;
		T_OK(proto_client_open(&cli, url, &o));
		proto_msg_init(&req, PROTO_OP_STATUS);
		/* the server answers after 200 ms; give up about then */
		int e = proto_client_call(cli, &req, &rep, 185 + round % 21, NULL);
		T_ASSERT_MSG(e == 0 || e == BATON_ETIMEDOUT, "call: %s", baton_errname(e));
		proto_msg_free(&rep);
		double t0 = now_ms();
		int err = proto_client_close(cli);
		double dt = now_ms() - t0;
		T_ASSERT_MSG(dt < 300 + 500, "close took %.0f ms", dt);
		if (err) {
			T_EQ_ERR(err, BATON_ETIMEDOUT);
			T_ASSERT(proto_nng_wedged());
			wedged_at = round;
		}
	}
	if (wedged_at >= 0)
		printf("  (nng 1.5.2 lost a read at round %d; the close gave up in time)\n", wedged_at);
	double t0 = now_ms();
	server_stop(&s);
	T_ASSERT(now_ms() - t0 < 300 * 3 + 1000);
	cleanup_tmp();
}

static void *blocked_recv(void *arg)
{
	struct proto_server *srv = arg;
	struct baton_msg req;
	return (void *)(intptr_t)proto_server_recv(srv, &req, -1, NULL);
}

static void t_shutdown_unblocks(void)
{
	struct proto_server *srv;
	pthread_t th;
	void *ret;
	T_OK(proto_server_open(&srv, tmp_url(0, "shut.sock"), NULL));
	T_ASSERT(pthread_create(&th, NULL, blocked_recv, srv) == 0);
	usleep(100 * 1000);
	double t0 = now_ms();
	proto_server_shutdown(srv);
	proto_server_shutdown(srv); /* idempotent */
	pthread_join(th, &ret);
	T_EQ_ERR((int)(intptr_t)ret, BATON_ECLOSED);
	T_ASSERT(now_ms() - t0 < 1000);
	proto_server_close(srv);
	proto_server_close(NULL);
	proto_client_close(NULL);
	proto_pub_close(NULL);
	proto_sub_close(NULL);
	proto_ctx_close(NULL);
	cleanup_tmp();
}

static void t_listen_errors(void)
{
	struct proto_server *srv, *srv2;
	T_ASSERT(proto_server_open(&srv, "ipc:///nonexistent-dir-baton/x.sock", NULL) != 0);
	T_ASSERT(srv == NULL);
	T_EQ_ERR(proto_server_open(&srv, "bogus://x", NULL), BATON_EINVAL);
	T_EQ_ERR(proto_server_open(&srv, NULL, NULL), BATON_EINVAL);
	const char *url = tmp_url(0, "twice.sock");
	T_OK(proto_server_open(&srv, url, NULL));
	T_EQ_ERR(proto_server_open(&srv2, url, NULL), BATON_EEXIST);
	proto_server_close(srv);
	cleanup_tmp();
}

/* ---- PUB/SUB --------------------------------------------------------------------------- */

static void t_pubsub(void)
{
	const char *url = tmp_url(0, "events.sock");
	struct proto_pub *pub;
	struct proto_sub *sub, *sub2;
	T_OK(proto_pub_open(&pub, url, NULL));
	T_EQ_STR(proto_pub_url(pub), url);
	T_OK(proto_sub_open(&sub, url, NULL));
	T_OK(proto_sub_open(&sub2, url, NULL));

	/* subscribers connect in the background: publish until both hear */
	struct baton_msg ev, got;
	proto__sample(&ev, PROTO_OP_EVENT, 0);
	ev.kind = "hello";
	bool h1 = false, h2 = false;
	for (int i = 0; i < 100 && !(h1 && h2); i++) {
		T_OK(proto_publish(pub, &ev));
		if (!h1 && proto_sub_recv(sub, &got, 20, NULL) == 0) {
			h1 = true;
			proto_msg_free(&got);
		}
		if (!h2 && proto_sub_recv(sub2, &got, 20, NULL) == 0) {
			h2 = true;
			proto_msg_free(&got);
		}
	}
	T_ASSERT(h1 && h2);
	/* drain the hellos */
	while (proto_sub_recv(sub, &got, 50, NULL) == 0)
		proto_msg_free(&got);
	while (proto_sub_recv(sub2, &got, 50, NULL) == 0)
		proto_msg_free(&got);

	for (uint64_t seq = 1; seq <= 500; seq++) {
		proto__sample(&ev, PROTO_OP_EVENT, 0);
		ev.id = seq;
		ev.seq = seq;
		ev.kind = seq % 2 ? "state" : "grant";
		if (seq % 3 == 0)
			proto_unset(&ev, PF_MS);
		T_OK(proto_publish(pub, &ev));
	}
	for (uint64_t seq = 1; seq <= 500; seq++) {
		struct proto_diag d;
		int err = proto_sub_recv(sub, &got, 2000, &d);
		T_ASSERT_MSG(err == 0, "event %llu: %s", (unsigned long long)seq, d.text);
		T_EQ_INT(got.seq, seq);
		T_EQ_STR(got.kind, seq % 2 ? "state" : "grant");
		T_ASSERT(proto_has(&got, PF_MS) == (seq % 3 != 0));
		T_ASSERT(got.op == PROTO_OP_EVENT && got.pipe != 0);
		proto_msg_free(&got);
		T_OK(proto_sub_recv(sub2, &got, 2000, NULL));
		T_EQ_INT(got.seq, seq);
		proto_msg_free(&got);
	}
	T_EQ_ERR(proto_sub_recv(sub, &got, 100, NULL), BATON_ETIMEDOUT);

	/* only events are published */
	struct baton_msg req;
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_EQ_ERR(proto_publish(pub, &req), BATON_EINVAL);
	ev.name = NULL;
	ev.engine = NULL;
	T_EQ_ERR(proto_publish(pub, &ev), BATON_EMISSING);

	proto_sub_close(sub2);
	proto_sub_close(sub);
	proto_pub_close(pub);
	cleanup_tmp();
}

/* ---- peer death ------------------------------------------------------------------------- */

struct pipe_log {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct proto_pipe_event ev[32];
	int n;
};

static void on_pipe(void *arg, const struct proto_pipe_event *ev)
{
	struct pipe_log *l = arg;
	pthread_mutex_lock(&l->mu);
	if (l->n < 32)
		l->ev[l->n++] = *ev;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

/* Waits for an event of type ev (and pid, when >0); its index or -1. */
static int wait_pipe(struct pipe_log *l, enum proto_pipe_ev ev, int pid, uint32_t pipe, int ms)
{
	double end = now_ms() + ms;
	int found = -1;
	pthread_mutex_lock(&l->mu);
	while (found < 0) {
		for (int i = 0; i < l->n && found < 0; i++)
			if (l->ev[i].ev == ev && (pid <= 0 || l->ev[i].pid == pid) &&
			    (!pipe || l->ev[i].pipe == pipe))
				found = i;
		if (found >= 0 || now_ms() > end)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 20 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&l->cv, &l->mu, &ts);
	}
	pthread_mutex_unlock(&l->mu);
	return found;
}

/* BUILD/bin/baton-proto-tool: from $BUILD when set, else beside this
 * binary's own folder (BUILD/test/..), so the test runs however it is
 * started. */
static const char *tool_path(void)
{
	static char path[4096 + 32];
	const char *b = getenv("BUILD");
	if (b && *b) {
		snprintf(path, sizeof path, "%s/bin/baton-proto-tool", b);
		return path;
	}
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	char *slash;
	if (n > 0 && (self[n] = '\0', slash = strrchr(self, '/')) != NULL) {
		*slash = '\0';
		snprintf(path, sizeof path, "%s/../bin/baton-proto-tool", self);
	} else {
		snprintf(path, sizeof path, "build/bin/baton-proto-tool");
	}
	return path;
}

/* Starts `baton-proto-tool ARGS` (fork+exec through posix_spawn, never
 * fork-and-use-nng) with its stdin a pipe we keep, and waits for its
 * first output line. */
static pid_t spawn_tool(char *const args[], int *stdin_w, char *line, size_t linelen)
{
	int in[2], out[2];
	T_ASSERT(pipe(in) == 0 && pipe(out) == 0);
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, in[0], 0);
	posix_spawn_file_actions_adddup2(&fa, out[1], 1);
	posix_spawn_file_actions_addclose(&fa, in[1]);
	posix_spawn_file_actions_addclose(&fa, out[0]);
	pid_t pid;
	int rc = posix_spawn(&pid, tool_path(), &fa, NULL, args, environ);
	T_ASSERT_MSG(rc == 0, "spawn %s: %s", tool_path(), strerror(rc));
	posix_spawn_file_actions_destroy(&fa);
	close(in[0]);
	close(out[1]);
	size_t n = 0;
	while (n + 1 < linelen) {
		ssize_t r = read(out[0], line + n, 1);
		if (r <= 0 || line[n] == '\n')
			break;
		n++;
	}
	line[n] = '\0';
	close(out[0]);
	*stdin_w = in[1];
	return pid;
}

static void t_pipe_rem_on_kill9(void)
{
	struct pipe_log log = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, { { 0 } }, 0 };
	struct proto_opts o = { .on_pipe = on_pipe, .pipe_arg = &log };
	const char *url = tmp_url(0, "broker.sock");
	struct server s;
	server_start(&s, url, 1, ECHO, &o);

	char line[256];
	int w;
	char *args[] = { "baton-proto-tool", "dial", (char *)url, NULL };
	pid_t pid = spawn_tool(args, &w, line, sizeof line);
	T_ASSERT_MSG(strncmp(line, "connected", 9) == 0, "tool said: %s", line);
	int a = wait_pipe(&log, PROTO_PIPE_ADD, pid, 0, 3000);
	T_ASSERT_MSG(a >= 0, "no ADD event with pid %d", (int)pid);
	uint32_t p = log.ev[a].pipe;
	T_ASSERT(p != 0);
	T_EQ_INT(proto_pipe_pid(p), pid);
	T_ASSERT(wait_pipe(&log, PROTO_PIPE_REM, 0, p, 200) < 0);

	double t0 = now_ms();
	T_ASSERT(kill(pid, SIGKILL) == 0);
	int r = wait_pipe(&log, PROTO_PIPE_REM, 0, p, 3000);
	T_ASSERT_MSG(r >= 0, "no REM event after kill -9");
	T_EQ_INT(log.ev[r].pid, pid);
	double dt = now_ms() - t0;
	T_ASSERT_MSG(dt < 1000, "REM came %.0f ms after the kill", dt);
	int st;
	waitpid(pid, &st, 0);
	close(w);

	/* a clean exit is a REM too */
	pid = spawn_tool(args, &w, line, sizeof line);
	a = wait_pipe(&log, PROTO_PIPE_ADD, pid, 0, 3000);
	T_ASSERT(a >= 0);
	p = log.ev[a].pipe;
	close(w); /* the tool exits on EOF */
	T_ASSERT(wait_pipe(&log, PROTO_PIPE_REM, pid, p, 3000) >= 0);
	waitpid(pid, &st, 0);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	server_stop(&s);
	cleanup_tmp();
}

/* Peers that connect and hang up before the handshake: each one whose
 * hang-up nng sees as an EPIPE stopped nng 1.5.2's listener for good,
 * until transport_hangup.c. */
static void abort_connects(const char *url, int n)
{
	for (int i = 0; i < n; i++) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		T_ASSERT(fd >= 0);
		snprintf(sa.sun_path, sizeof sa.sun_path, "%s", url + 6);
		T_ASSERT_MSG(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect %d: %s", i,
		    strerror(errno));
		close(fd);
	}
}

/* A peer that reads the handshake and hangs up is harmless: the
 * listener and its connections are left alone, and no pipe event shows. */
static void t_listener_left_alone_when_alive(void)
{
	struct pipe_log log = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, { { 0 } }, 0 };
	struct proto_opts o = { .on_pipe = on_pipe, .pipe_arg = &log };
	const char *url = tmp_url(0, "alive.sock");
	struct server s;
	server_start(&s, url, 1, ECHO, &o);
	struct proto_client *cli;
	struct baton_msg req, rep;
	T_OK(proto_client_open(&cli, url, NULL));
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_client_call(cli, &req, &rep, 3000, NULL));
	proto_msg_free(&rep);
	for (int i = 0; i < 10; i++) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		char head[8];
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		snprintf(sa.sun_path, sizeof sa.sun_path, "%s", url + 6);
		T_ASSERT(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
		T_ASSERT(read(fd, head, sizeof head) == (ssize_t)sizeof head);
		close(fd);
	}
	usleep(300 * 1000);
	T_OK(proto_client_call(cli, &req, &rep, 3000, NULL));
	proto_msg_free(&rep);
	pthread_mutex_lock(&log.mu);
	int n = log.n;
	pthread_mutex_unlock(&log.mu);
	T_ASSERT_MSG(n == 1 && log.ev[0].ev == PROTO_PIPE_ADD, "%d pipe events", n);
	proto_client_close(cli);
	server_stop(&s);
	cleanup_tmp();
}

static void t_listener_survives_aborted_connects(void)
{
	const char *url = tmp_url(0, "abort.sock");
	struct server s;
	server_start(&s, url, 1, ECHO, NULL);
	for (int round = 0; round < 5; round++) {
		abort_connects(url, 20);
		struct proto_client *cli;
		struct baton_msg req, rep;
		T_OK(proto_client_open(&cli, url, NULL)); /* dials in the background */
		proto_msg_init(&req, PROTO_OP_STATUS);
		T_OK(proto_client_call(cli, &req, &rep, 3000, NULL));
		proto_msg_free(&rep);
		proto_client_close(cli);
	}
	server_stop(&s);

	/* the same for an event publisher */
	const char *eurl = tmp_url(1, "abort-events.sock");
	struct proto_pub *pub;
	struct proto_sub *sub;
	T_OK(proto_pub_open(&pub, eurl, NULL));
	abort_connects(eurl, 20);
	T_OK(proto_sub_open(&sub, eurl, NULL));
	struct baton_msg ev, got;
	proto__sample(&ev, PROTO_OP_EVENT, 0);
	bool heard = false;
	for (int i = 0; i < 150 && !heard; i++) {
		T_OK(proto_publish(pub, &ev));
		if (proto_sub_recv(sub, &got, 20, NULL) == 0) {
			heard = true;
			proto_msg_free(&got);
		}
	}
	T_ASSERT_MSG(heard, "no event reached a subscriber after aborted connects");
	proto_sub_close(sub);
	proto_pub_close(pub);
	cleanup_tmp();
}

static int count_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	T_ASSERT(d != NULL);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

struct rem_watch {
	_Atomic uint32_t pipe;  /* the pipe whose removal counts */
	_Atomic int removed;
};

static void on_rem(void *arg, const struct proto_pipe_event *ev)
{
	struct rem_watch *w = arg;
	if (ev->ev == PROTO_PIPE_REM && ev->pipe == atomic_load(&w->pipe))
		atomic_fetch_add(&w->removed, 1);
}

/* Issue 14: 1,000 hang-ups before the handshake cost nothing: a client
 * connected before them keeps its connection (no REM event: the listener
 * was never restarted), every later call is answered at its first try,
 * and the process has as many descriptors as before. */
static void t_hangups_leave_nothing(void)
{
	struct rem_watch w = { 0, 0 };
	struct proto_opts o = { .on_pipe = on_rem, .pipe_arg = &w };
	const char *url = tmp_url(0, "hangup.sock");
	struct server s;
	struct proto_client *cli;
	struct baton_msg req, rep;
	server_start(&s, url, 2, ECHO, &o);
	T_OK(proto_client_open(&cli, url, &(struct proto_opts){ .dial_wait = true }));
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_client_call(cli, &req, &rep, 3000, NULL));
	atomic_store(&w.pipe, rep.pipe);
	proto_msg_free(&rep);
	int before = count_fds();

	abort_connects(url, 1000);
	for (int i = 0; i < 200; i++) {
		struct proto_diag dg = { 0 };
		int crc = proto_call(url, &req, &rep, 3000, &dg);
		T_ASSERT_MSG(crc == 0, "call %d: %s: %s", i, baton_strerror(crc), dg.text);
		proto_msg_free(&rep);
	}
	T_OK(proto_client_call(cli, &req, &rep, 3000, NULL));
	proto_msg_free(&rep);
	T_EQ_INT(atomic_load(&w.removed), 0);
	int after = count_fds();
	for (int i = 0; i < 100 && after != before; i++) { /* nng reaps closed pipes late */
		usleep(20 * 1000);
		after = count_fds();
	}
	T_EQ_INT(after, before);
	proto_client_close(cli);
	server_stop(&s);
	cleanup_tmp();
}

/* The mechanism itself: a write to a peer that has gone reads as a reset
 * (nng 1.5.2 retries it) rather than EPIPE (which it takes for its own
 * close), on nng older than 1.6.0 only. */
static void t_hangup_write_is_reset(void)
{
	int sv[2];
	char byte = 1;
	struct iovec iov = { &byte, 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	int major = 0, minor = 0;
	T_ASSERT(sscanf(nng_version(), "%d.%d", &major, &minor) == 2);
	bool old = major == 1 && minor < 6;
	T_EQ_INT(proto__hangup_remap(), old);
	T_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	close(sv[1]);
	errno = 0;
	T_EQ_INT(sendmsg(sv[0], &mh, MSG_NOSIGNAL), -1);
	T_EQ_INT(errno, old ? ECONNRESET : EPIPE);
	close(sv[0]);
	/* everything else is the system call's own */
	T_ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	T_EQ_INT(sendmsg(sv[0], &mh, MSG_NOSIGNAL), 1);
	T_EQ_INT(sendmsg(-1, &mh, MSG_NOSIGNAL), -1);
	T_EQ_INT(errno, EBADF);
	close(sv[0]);
	close(sv[1]);
}

/* A server killed -9 leaves its socket file; the next one takes the path. */
static void t_stale_socket_file(void)
{
	const char *url = tmp_url(0, "stale.sock");
	char line[256];
	int w, st;
	char *args[] = { "baton-proto-tool", "serve", (char *)url, NULL };
	pid_t pid = spawn_tool(args, &w, line, sizeof line);
	T_ASSERT_MSG(strncmp(line, "listening", 9) == 0, "tool said: %s", line);
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	T_OK(proto_call(url, &req, &rep, 5000, NULL));
	proto_msg_free(&rep);
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	close(w);
	struct stat sb;
	T_ASSERT(stat(url + 6, &sb) == 0); /* still there */
	struct server s;
	server_start(&s, url, 1, ECHO, NULL);
	T_OK(proto_call(url, &req, &rep, 5000, NULL));
	proto_msg_free(&rep);
	server_stop(&s);
	cleanup_tmp();
}

/* A request whose server dies unanswered is resent to the next server on
 * the same URL, with the same id: why every request is idempotent. */
static void t_resend_after_restart(void)
{
	const char *url = tmp_url(0, "restart.sock");
	struct proto_server *srv;
	struct proto_client *cli;
	struct baton_msg req, rep, got;
	T_OK(proto_server_open(&srv, url, NULL));
	T_OK(proto_client_open(&cli, url, NULL));

	struct caller c = { cli, -1, false };
	pthread_t th;
	T_ASSERT(pthread_create(&th, NULL, caller_main, &c) == 0);
	T_OK(proto_server_recv(srv, &got, 3000, NULL));
	uint64_t first_id = got.id;
	proto_msg_free(&got);
	proto_server_close(srv); /* dies without answering */

	T_OK(proto_server_open(&srv, url, NULL));
	T_OK(proto_server_recv(srv, &got, 3000, NULL));
	T_EQ_INT(got.id, first_id);
	T_EQ_INT(got.op, PROTO_OP_HEARTBEAT);
	proto__sample(&rep, PROTO_OP_HEARTBEAT, 1);
	rep.id = got.id;
	T_OK(proto_server_reply(srv, &rep));
	proto_msg_free(&got);
	pthread_join(th, NULL);
	T_OK(c.err);
	T_ASSERT(c.match);

	/* and the timer: a short resend time repeats an unanswered request */
	proto_client_close(cli);
	struct proto_opts o = { .resend_ms = 100 };
	T_OK(proto_client_open(&cli, url, &o));
	c = (struct caller){ cli, -1, false };
	T_ASSERT(pthread_create(&th, NULL, caller_main, &c) == 0);
	T_OK(proto_server_recv(srv, &got, 3000, NULL));
	first_id = got.id;
	proto_msg_free(&got);
	/* not answered: the same request comes again on the same context */
	T_OK(proto_server_recv(srv, &got, 3000, NULL));
	T_EQ_INT(got.id, first_id);
	proto_reply_init(&rep, &got);
	proto_msg_free(&got);
	T_OK(proto_server_reply(srv, &rep));
	pthread_join(th, NULL);
	T_OK(c.err);
	proto_client_close(cli);
	proto_server_close(srv);
	(void)req;
	cleanup_tmp();
}

T_MAIN(T_CASE(t_reqrep_ipc), T_CASE(t_reqrep_tcp), T_CASE(t_request_pipe_pid),
    T_CASE(t_error_reply), T_CASE(t_timeouts), T_CASE(t_client_before_server),
    T_CASE(t_bad_requests_get_error_replies), T_CASE(t_recvmax_drops_oversize),
    T_CASE(t_concurrent_contexts), T_CASE(t_shutdown_under_load),
    T_CASE(t_close_races_bounded),
    T_CASE(t_shutdown_unblocks), T_CASE(t_listen_errors),
    T_CASE(t_pubsub), T_CASE(t_pipe_rem_on_kill9), T_CASE(t_listener_left_alone_when_alive),
    T_CASE(t_listener_survives_aborted_connects), T_CASE(t_hangups_leave_nothing),
    T_CASE(t_hangup_write_is_reset),
    T_CASE(t_stale_socket_file),
    T_CASE(t_resend_after_restart))
