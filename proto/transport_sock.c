/*
 * transport_sock.c: the life of one nng socket under every Baton socket
 * (REP, REQ, PUB, SUB): options, pipe events (peer death, peer pids),
 * listening or dialing, running an operation with a timeout, and closing.
 * Every blocking call is an aio started and waited for here, with its own
 * timeout; no aio has a callback, so none is ever freed or any socket
 * closed inside one.
 *
 * libnng 1.5.2 needs two kinds of care: "Closing" (below: a gate, cancel
 * and wait, then a close with a deadline), and a peer that hangs up during
 * the handshake (transport_hangup.c: it would stop a listener for good).
 */
#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "proto/transport_int.h"

#define DEFAULT_SEND_TIMEOUT_MS 5000
#define DEFAULT_IPC_MODE 0660
#define DEFAULT_CLOSE_TIMEOUT_MS 2000
/* nng counts its protocol header (REQ/REP: 4 bytes per hop) against
 * NNG_OPT_RECVMAXSZ; the body's own cap is the decoder's. */
#define HEADER_SLACK 64

/*
 * Closing. nng 1.5.2 has three defects around nng_close that this file
 * works around:
 *  1. When a context's last reference goes inside nng_ctx_send/recv/close
 *     while nng_close runs on another thread, nni_ctx_rele wakes the
 *     closer before the protocol's ctx fini locks the socket's mutex, which
 *     is then freed ("panic: pthread_mutex_lock: Invalid argument").
 *  2. Closing with operations pending leaves the closer racing them.
 *  3. Closing a pipe while a message is arriving on it can lose the
 *     transport's read: ipc_pipe_recv_cb resubmits a read on an rx aio that
 *     ipc_pipe_close has just stopped, nni_aio_begin refuses it without
 *     completing it, and the protocol's receive aio stays busy forever; the
 *     reaper thread then waits in nni_aio_stop, nng_close never returns,
 *     and neither does nng's atexit handler (nng_fini).
 * So closing goes: shut the gate (every nng call that takes a context or
 * socket reference holds it for reading; they return at once, the waits
 * happen outside it), cancel every operation still waiting and wait until
 * all have returned (1, 2), then nng_close on a helper thread with a
 * deadline (3): when it does not return in time the socket and its wrapper
 * are leaked, proto_nng_wedged() turns true, and the close function says
 * BATON_ETIMEDOUT. (3) needs a peer sending at the moment of the close: a
 * client with no call in flight and no timed-out call whose reply may still
 * come is safe, and so is a server whose clients are quiet.
 */

int proto__nng_err(int rv, bool dialing)
{
	switch (rv) {
	case 0: return 0;
	case NNG_ETIMEDOUT: return BATON_ETIMEDOUT;
	case NNG_ECLOSED:
	case NNG_ECANCELED: return BATON_ECLOSED;
	case NNG_ENOMEM: return BATON_ENOMEM;
	case NNG_EINVAL:
	case NNG_EADDRINVAL:
	case NNG_ENOTSUP: return BATON_EINVAL;
	case NNG_ECONNREFUSED:
	case NNG_ECONNRESET:
	case NNG_ECONNABORTED:
	case NNG_ECONNSHUT:
	case NNG_EUNREACHABLE: return BATON_ECONN;
	case NNG_ENOENT: return dialing ? BATON_ECONN : BATON_ENOTFOUND;
	case NNG_EADDRINUSE: return BATON_EEXIST;
	case NNG_EPERM: return BATON_EPERM;
	case NNG_EMSGSIZE: return BATON_ETOOBIG;
	case NNG_ESTATE: return BATON_ESTATE;
	case NNG_EBUSY: return BATON_EBUSY;
	default: return BATON_EIO;
	}
}

static void pids_put(struct psock *ps, uint32_t pipe, int pid)
{
	pthread_mutex_lock(&ps->mu);
	if (ps->npids == ps->cappids) {
		size_t cap = ps->cappids ? 2 * ps->cappids : 16;
		struct pid_entry *p = realloc(ps->pids, cap * sizeof *p);
		if (!p) {
			pthread_mutex_unlock(&ps->mu);
			return; /* the REM event will carry pid -1 */
		}
		ps->pids = p;
		ps->cappids = cap;
	}
	ps->pids[ps->npids++] = (struct pid_entry){ pipe, pid };
	pthread_mutex_unlock(&ps->mu);
}

static int pids_take(struct psock *ps, uint32_t pipe)
{
	int pid = -1;
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->npids; i++)
		if (ps->pids[i].pipe == pipe) {
			pid = ps->pids[i].pid;
			ps->pids[i] = ps->pids[--ps->npids];
			break;
		}
	pthread_mutex_unlock(&ps->mu);
	return pid;
}

/* Runs on an nng thread. */
static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct psock *ps = arg;
	struct proto_pipe_event e = { .pipe = nng_pipe_id(p), .pid = -1 };
	if (ev == NNG_PIPE_EV_ADD_POST) {
		uint64_t pid; /* a u64 option, despite the name */
		if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) == 0)
			e.pid = (int)pid;
		pids_put(ps, e.pipe, e.pid);
		e.ev = PROTO_PIPE_ADD;
	} else {
		e.pid = pids_take(ps, e.pipe);
		e.ev = PROTO_PIPE_REM;
	}
	ps->on_pipe(ps->pipe_arg, &e);
}

int proto_pipe_pid(uint32_t pipe)
{
	nng_pipe p;
	uint64_t pid;
	p.id = pipe;
	if (pipe == 0 || nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) != 0)
		return -1;
	return (int)pid;
}

/* The URL with the port a tcp://...:0 listener was given. */
static char *bound_url(const char *url, nng_listener l)
{
	size_t n = strlen(url);
	int port;
	if (strncmp(url, "tcp", 3) == 0 && n > 2 && strcmp(url + n - 2, ":0") == 0 &&
	    nng_listener_get_int(l, NNG_OPT_TCP_BOUND_PORT, &port) == 0) {
		char *s = malloc(n + 8);
		if (s)
			snprintf(s, n + 8, "%.*s:%d", (int)(n - 2), url, port);
		return s;
	}
	return strdup(url);
}

/* An ipc socket file gets mode before anyone can connect. An nng error. */
static int listener_open(struct psock *ps, const char *url, int mode, nng_listener *out)
{
	nng_listener l;
	int rv;
	if ((rv = nng_listener_create(&l, ps->s, url)) != 0)
		return rv;
	if (strncmp(url, "ipc://", 6) == 0 &&
	    (rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, mode)) != 0) {
		nng_listener_close(l);
		return rv;
	}
	if ((rv = nng_listener_start(l, 0)) != 0) {
		nng_listener_close(l);
		return rv;
	}
	*out = l;
	return 0;
}

int proto__psock_start(struct psock *ps, const char *url, const struct proto_opts *o,
    bool listen)
{
	static const struct proto_opts defaults;
	int rv;
	if (!o)
		o = &defaults;
	if (!url)
		return BATON_EINVAL;
	size_t recvmax = o->recvmax == 0 || o->recvmax > BATON_PROTO_MAX_MSG ?
	    BATON_PROTO_MAX_MSG : o->recvmax;
	ps->send_timeout_ms = o->send_timeout_ms ? o->send_timeout_ms : DEFAULT_SEND_TIMEOUT_MS;
	ps->close_timeout_ms = o->close_timeout_ms > 0 ? o->close_timeout_ms : DEFAULT_CLOSE_TIMEOUT_MS;
	if ((rv = nng_socket_set_size(ps->s, NNG_OPT_RECVMAXSZ, recvmax + HEADER_SLACK)) != 0)
		return proto__nng_err(rv, false);
	nng_socket_set_ms(ps->s, NNG_OPT_SENDTIMEO, proto__dur(ps->send_timeout_ms));
	nng_socket_set_ms(ps->s, NNG_OPT_RECONNMINT, 50);
	nng_socket_set_ms(ps->s, NNG_OPT_RECONNMAXT, 1000);
	ps->on_pipe = o->on_pipe;
	ps->pipe_arg = o->pipe_arg;
	if (o->on_pipe) {
		if ((rv = nng_pipe_notify(ps->s, NNG_PIPE_EV_ADD_POST, pipe_cb, ps)) != 0 ||
		    (rv = nng_pipe_notify(ps->s, NNG_PIPE_EV_REM_POST, pipe_cb, ps)) != 0)
			return proto__nng_err(rv, false);
	}
	/* Decided before any nng thread writes; and it links
	 * transport_hangup.c's sendmsg into every program that uses nng. */
	(void)proto__hangup_remap();
	if (listen) {
		nng_listener l;
		if ((rv = listener_open(ps, url, o->ipc_mode ? o->ipc_mode : DEFAULT_IPC_MODE, &l)) != 0)
			return proto__nng_err(rv, false);
		ps->url = bound_url(url, l);
	} else {
		nng_dialer d;
		if ((rv = nng_dialer_create(&d, ps->s, url)) != 0)
			return proto__nng_err(rv, true);
		/* with dial_wait, a failed first dial leaves the dialer stopped.
		 * EAGAIN is a full listen backlog (a burst of connects, such as
		 * the hang-ups of issue 14, not yet accepted): the server is
		 * there and busy, so try again for up to 2 s before giving up. */
		rv = nng_dialer_start(d, o->dial_wait ? 0 : NNG_FLAG_NONBLOCK);
		for (int i = 0; rv == NNG_EAGAIN && o->dial_wait && i < 200; i++) {
			usleep(10 * 1000);
			rv = nng_dialer_start(d, 0);
		}
		if (rv != 0) {
			nng_dialer_close(d);
			return proto__nng_err(rv, true);
		}
		ps->url = strdup(url);
	}
	return ps->url ? 0 : BATON_ENOMEM;
}

static void psock_init(struct psock *ps)
{
	memset(ps, 0, sizeof *ps);
	ps->close_timeout_ms = DEFAULT_CLOSE_TIMEOUT_MS;
	pthread_mutex_init(&ps->mu, NULL);
	pthread_cond_init(&ps->idle, NULL);
	pthread_rwlock_init(&ps->gate, NULL);
}

int proto__psock_open(struct psock *ps, int (*open_fn)(nng_socket *))
{
	psock_init(ps);
	int rv = open_fn(&ps->s);
	if (rv != 0)
		return proto__nng_err(rv, false);
	ps->open = true;
	return 0;
}

static _Atomic bool wedged;

bool proto_nng_wedged(void)
{
	return atomic_load(&wedged);
}

/* nng_close on its own thread, waited for up to a deadline. The closer
 * and the waiter share the record; the last one out frees it. */
struct closer {
	nng_socket s;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	int refs;
};

static void closer_put(struct closer *c)
{
	pthread_mutex_lock(&c->mu);
	bool last = --c->refs == 0;
	pthread_mutex_unlock(&c->mu);
	if (last) {
		pthread_cond_destroy(&c->cv);
		pthread_mutex_destroy(&c->mu);
		free(c);
	}
}

static void *closer_main(void *arg)
{
	struct closer *c = arg;
	nng_close(c->s);
	pthread_mutex_lock(&c->mu);
	c->done = true;
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	closer_put(c);
	return NULL;
}

/* true when nng_close returned within timeout_ms */
static bool close_bounded(nng_socket s, int timeout_ms)
{
	struct closer *c = calloc(1, sizeof *c);
	pthread_attr_t attr;
	pthread_t th;
	if (!c) {
		nng_close(s);
		return true;
	}
	c->s = s;
	c->refs = 2;
	pthread_mutex_init(&c->mu, NULL);
	baton_cond_init(&c->cv);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&th, &attr, closer_main, c);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		c->refs = 1;
		closer_put(c);
		nng_close(s);
		return true;
	}
	double until = baton_now_s() + timeout_ms / 1e3;
	pthread_mutex_lock(&c->mu);
	while (!c->done && baton_cond_wait_until(&c->cv, &c->mu, until) == 0)
		;
	bool done = c->done;
	pthread_mutex_unlock(&c->mu);
	closer_put(c);
	return done;
}

/* Closes the nng socket once (see "Closing" above); blocked operations
 * return BATON_ECLOSED. false when nng_close did not finish in time. */
bool proto__psock_shutdown(struct psock *ps)
{
	pthread_rwlock_wrlock(&ps->gate);
	pthread_mutex_lock(&ps->mu);
	bool was = ps->closed;
	ps->closed = true;
	pthread_mutex_unlock(&ps->mu);
	pthread_rwlock_unlock(&ps->gate);
	if (was || !ps->open) {
		pthread_mutex_lock(&ps->mu);
		bool ok = !ps->wedged;
		pthread_mutex_unlock(&ps->mu);
		return ok;
	}
	/* No operation starts any more; end those that wait. */
	pthread_mutex_lock(&ps->mu);
	for (struct waiter *w = ps->waiters; w; w = w->next)
		nng_aio_cancel(w->aio);
	while (ps->waiters)
		pthread_cond_wait(&ps->idle, &ps->mu);
	pthread_mutex_unlock(&ps->mu);
	if (!close_bounded(ps->s, ps->close_timeout_ms)) {
		pthread_mutex_lock(&ps->mu);
		ps->wedged = true;
		pthread_mutex_unlock(&ps->mu);
		atomic_store(&wedged, true);
		return false;
	}
	return true;
}

/* Shuts down and frees what the socket used; when nng could not close it,
 * everything nng may still touch (the pipe callback's argument) is left
 * allocated. BATON_ETIMEDOUT then. */
int proto__psock_fini(struct psock *ps)
{
	if (!proto__psock_shutdown(ps))
		return BATON_ETIMEDOUT;
	pthread_rwlock_destroy(&ps->gate);
	pthread_cond_destroy(&ps->idle);
	pthread_mutex_destroy(&ps->mu);
	free(ps->pids);
	free(ps->url);
	return 0;
}

/* Starts an operation on aio through the gate (start(arg, aio): an
 * nng_ctx_send/recv or nng_recv_aio) and waits for it, cancelable by
 * proto__psock_shutdown. The result as a Baton code. A send that never started
 * leaves its message in the aio, as a failed one does. */
int proto__aio_run(struct psock *ps, nng_aio *aio, int timeout_ms,
    void (*start)(void *, nng_aio *), void *arg)
{
	struct waiter w = { aio, NULL, NULL };
	nng_aio_set_timeout(aio, proto__dur(timeout_ms));
	if (!gate_enter(ps))
		return BATON_ECLOSED;
	pthread_mutex_lock(&ps->mu);
	w.next = ps->waiters;
	if (w.next)
		w.next->prev = &w;
	ps->waiters = &w;
	pthread_mutex_unlock(&ps->mu);
	start(arg, aio);
	gate_leave(ps);
	nng_aio_wait(aio);
	pthread_mutex_lock(&ps->mu);
	if (w.prev)
		w.prev->next = w.next;
	else
		ps->waiters = w.next;
	if (w.next)
		w.next->prev = w.prev;
	pthread_cond_broadcast(&ps->idle);
	pthread_mutex_unlock(&ps->mu);
	return proto__nng_err(nng_aio_result(aio), false);
}

void proto__start_ctx_send(void *ctx, nng_aio *aio)
{
	nng_ctx_send(*(nng_ctx *)ctx, aio);
}

void proto__start_ctx_recv(void *ctx, nng_aio *aio)
{
	nng_ctx_recv(*(nng_ctx *)ctx, aio);
}

void proto__start_sock_recv(void *sock, nng_aio *aio)
{
	nng_recv_aio(*(nng_socket *)sock, aio);
}

int proto_ipc_dir(const char *url)
{
	if (strncmp(url, "ipc://", 6) != 0)
		return 0;
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s", url + 6);
	char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return 0;
	*slash = 0;
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		mkdir(path, 0755);
		*p = '/';
	}
	/* 0750: the group connects (it needs only search here and write on
	 * the 0660 socket); writable by the group, the directory would be
	 * refused by the trust rule (baton_trust_dir) */
	if (mkdir(path, 0750) != 0 && errno != EEXIST)
		return -1;
	return 0;
}
