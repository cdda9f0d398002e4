/*
 * transport.c: Baton messages over nng. REQ/REP for commands (through
 * nng contexts, so one socket serves or issues several requests at once),
 * PUB/SUB for events, pipe events for peer death. Every blocking call is
 * an aio started and waited for here, with its own timeout; no aio has a
 * callback, so none is ever freed or any socket closed inside one.
 *
 * libnng 1.5.2 needs three kinds of care, each described where it is
 * handled: "Closing" (a gate, cancel and wait, then a close with a
 * deadline), "The listener monitor" (a listener that stops accepting is
 * found by a probe and restarted), and one-shot dials that retry a refused
 * connection while such a restart happens.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "proto/proto_int.h"

#define DEFAULT_SEND_TIMEOUT_MS 5000
#define DEFAULT_RESEND_MS 60000
#define DEFAULT_IPC_MODE 0660
#define DEFAULT_CLOSE_TIMEOUT_MS 2000
/* PUB drops the oldest queued event for a subscriber whose queue is full
 * (nng's default is 16 messages); SUB keeps as many. Events carry seq, so
 * a subscriber sees a gap. */
#define EVENT_QUEUE 1024
/* nng counts its protocol header (REQ/REP: 4 bytes per hop) against
 * NNG_OPT_RECVMAXSZ; the body's own cap is the decoder's. */
#define HEADER_SLACK 64

/* ---- common socket part ---------------------------------------------------------- */

struct pid_entry {
	uint32_t pipe;
	int pid;
};

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
struct waiter {
	nng_aio *aio;
	struct waiter *prev, *next;
};

struct psock {
	nng_socket s;
	pthread_rwlock_t gate;
	bool closed;           /* written under gate and mu */
	bool open;             /* nng socket allocated */
	bool wedged;           /* nng_close did not return in time */
	int close_timeout_ms;
	char *url;             /* as given, or with the bound tcp port */
	int send_timeout_ms;
	proto_pipe_fn on_pipe;
	void *pipe_arg;
	pthread_mutex_t mu;    /* guards pids and waiters */
	pthread_cond_t idle;   /* signalled when a waiter leaves */
	struct waiter *waiters;
	struct pid_entry *pids;
	size_t npids, cappids;
	/* listeners: see "The listener monitor" */
	nng_listener lst;
	int ipc_mode;
	uint64_t lst_other;    /* the listener's "other" errors seen so far */
	bool mon_running;
	pthread_t mon;
	pthread_cond_t mon_cv;
	unsigned restarts;
	uint16_t peer_proto;   /* the SP protocol id a probe announces */
	bool probing;          /* under mu: a probe connection is open */
	int probe_port;        /* tcp: the probe's local port */
	bool probe_seen;       /* under mu: this probe's pipe was added */
	uint32_t probe_pipes[4]; /* probes' pipes, hidden from on_pipe */
};

static int map_nng(int rv, bool dialing)
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

static nng_duration dur(int ms)
{
	return ms < 0 ? NNG_DURATION_INFINITE : (nng_duration)ms;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
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
/* Whether a new pipe is the listener monitor's probe (see below). */
static bool is_probe(struct psock *ps, nng_pipe p, int pid)
{
	bool probe = false;
	pthread_mutex_lock(&ps->mu);
	if (ps->probing && !ps->probe_seen) {
		if (pid >= 0) {
			/* ipc: a connection from this process during the
			 * probe; an in-process client connecting in that
			 * millisecond would be taken for it, and hidden */
			probe = pid == (int)getpid();
		} else {
			nng_sockaddr sa;
			probe = nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0 &&
			    (sa.s_family == NNG_AF_INET || sa.s_family == NNG_AF_INET6) &&
			    ntohs(sa.s_family == NNG_AF_INET ? sa.s_in.sa_port : sa.s_in6.sa_port) ==
			        ps->probe_port;
		}
		if (probe) {
			ps->probe_seen = true;
			for (int i = 0; i < 4; i++)
				if (ps->probe_pipes[i] == 0) {
					ps->probe_pipes[i] = nng_pipe_id(p);
					break;
				}
			pthread_cond_broadcast(&ps->mon_cv);
		}
	}
	pthread_mutex_unlock(&ps->mu);
	return probe;
}

static bool was_probe(struct psock *ps, uint32_t pipe)
{
	bool probe = false;
	pthread_mutex_lock(&ps->mu);
	for (int i = 0; i < 4 && pipe; i++)
		if (ps->probe_pipes[i] == pipe) {
			ps->probe_pipes[i] = 0;
			probe = true;
		}
	pthread_mutex_unlock(&ps->mu);
	return probe;
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
		if (is_probe(ps, p, e.pid) || !ps->on_pipe)
			return;
		pids_put(ps, e.pipe, e.pid);
		e.ev = PROTO_PIPE_ADD;
	} else {
		if (was_probe(ps, e.pipe) || !ps->on_pipe)
			return;
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

static bool is_ipc(const char *url)
{
	return strncmp(url, "ipc://", 6) == 0;
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

/* ---- the listener monitor ------------------------------------------------------
 *
 * nng 1.5.2's listener stops accepting for good when a peer connects and
 * hangs up before the SP handshake: writing the handshake fails with EPIPE,
 * which becomes NNG_ECLOSED on the pending accept, and listener_accept_cb
 * takes that for "the listener is closing". Any local process (or a client
 * closed while it redials) can do it. nng counts such accept errors as
 * "other"; a thread per listening socket reads that counter a few times a
 * second and, when it moved, closes the listener and listens again on the
 * same address. Closing it resets the connections waiting in its backlog
 * (they would otherwise wait for a handshake forever) but also closes the
 * connections it accepted: their clients redial within 50 ms, REQ resends
 * requests in flight (unless resend_ms < 0), a subscriber may miss events
 * of that moment (seq shows the gap), and the server sees REM then ADD
 * pipe events for peers that are alive.
 */
#define MONITOR_MS 250

static bool gate_enter(struct psock *ps);
static void gate_leave(struct psock *ps);

static int listener_open(struct psock *ps, const char *url)
{
	nng_listener l;
	int rv;
	if ((rv = nng_listener_create(&l, ps->s, url)) != 0)
		return rv;
	if (is_ipc(url) && (rv = nng_listener_set_int(l, NNG_OPT_IPC_PERMISSIONS, ps->ipc_mode)) != 0) {
		nng_listener_close(l);
		return rv;
	}
	if ((rv = nng_listener_start(l, 0)) != 0) {
		nng_listener_close(l);
		return rv;
	}
	ps->lst = l;
	ps->lst_other = 0;
	return 0;
}

/* The listener's count of "other" accept errors; false when unknown. */
static bool listener_other(nng_listener l, uint64_t *out)
{
	nng_stat *all, *ls, *st;
	bool found = false;
	if (nng_stats_get(&all) != 0)
		return false;
	if ((ls = nng_stat_find_listener(all, l)) != NULL &&
	    (st = nng_stat_find(ls, "other")) != NULL) {
		*out = nng_stat_value(st);
		found = true;
	}
	nng_stats_free(all);
	return found;
}

static int listener_replace(struct psock *ps)
{
	nng_listener_close(ps->lst);
	return listener_open(ps, ps->url);
}

/* Waits for fd to be ready for events, up to ms; false on timeout. */
static bool wait_fd(int fd, short events, int ms)
{
	struct pollfd pfd = { fd, events, 0 };
	int rc;
	while ((rc = poll(&pfd, 1, ms)) < 0 && errno == EINTR)
		;
	return rc == 1;
}

/*
 * Connects to the listener's own address as a client would, completes
 * the SP handshake (so the probe cannot stop the listener itself) and
 * waits for the socket to add the connection as a pipe: 1 when it does,
 * 0 when it does not (a stopped listener's transport still negotiates,
 * then parks the connection for an accept that never comes), -1 when this
 * cannot tell (no descriptor, an address it cannot parse). Its pipe is
 * hidden from on_pipe.
 */
static int listener_probe(struct psock *ps)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, rc = -1;

	memset(&ss, 0, sizeof ss);
	if (is_ipc(ps->url)) {
		struct sockaddr_un *su = (struct sockaddr_un *)&ss;
		su->sun_family = AF_UNIX;
		if (strlen(ps->url + 6) >= sizeof su->sun_path)
			return -1;
		strcpy(su->sun_path, ps->url + 6);
		sl = sizeof *su;
	} else if (strncmp(ps->url, "tcp://", 6) == 0) {
		char host[256];
		const char *h = ps->url + 6, *colon = strrchr(h, ':');
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV }, *ai;
		if (!colon || (size_t)(colon - h) >= sizeof host)
			return -1;
		memcpy(host, h, (size_t)(colon - h));
		host[colon - h] = '\0';
		if (host[0] == '[') { /* [v6] */
			memmove(host, host + 1, strlen(host));
			host[strcspn(host, "]")] = '\0';
		}
		if (getaddrinfo(host[0] && strcmp(host, "*") ? host : "127.0.0.1", colon + 1, &hints, &ai) != 0)
			return -1;
		memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
		sl = ai->ai_addrlen;
		freeaddrinfo(ai);
	} else {
		return -1;
	}
	if ((fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)) < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&ss, sl) != 0) {
		int e = errno;
		if (e != EINPROGRESS && e != EAGAIN) {
			close(fd);
			return e == ECONNREFUSED || e == ENOENT ? 0 : -1;
		}
		int err = 0;
		socklen_t el = sizeof err;
		if (!wait_fd(fd, POLLOUT, 1000) ||
		    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
			close(fd);
			return err == ECONNREFUSED ? 0 : -1;
		}
	}
	pthread_mutex_lock(&ps->mu);
	ps->probing = true;
	ps->probe_seen = false;
	ps->probe_port = -1;
	if (ss.ss_family != AF_UNIX) {
		struct sockaddr_storage me;
		socklen_t ml = sizeof me;
		if (getsockname(fd, (struct sockaddr *)&me, &ml) == 0)
			ps->probe_port = ntohs(me.ss_family == AF_INET ?
			    ((struct sockaddr_in *)&me)->sin_port :
			    ((struct sockaddr_in6 *)&me)->sin6_port);
	}
	pthread_mutex_unlock(&ps->mu);

	unsigned char head[8];
	size_t got = 0;
	double end = now_ms() + 1000;
	while (got < sizeof head) {
		int left = (int)(end - now_ms());
		if (left <= 0 || !wait_fd(fd, POLLIN, left))
			break;
		ssize_t n = read(fd, head + got, sizeof head - got);
		if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN)))
			break;
		if (n > 0)
			got += (size_t)n;
	}
	rc = 0;
	if (got == sizeof head) {
		/* answer as a peer would, so the handshake succeeds */
		unsigned char mine[8] = { 0, 'S', 'P', 0, (unsigned char)(ps->peer_proto >> 8),
			(unsigned char)ps->peer_proto, 0, 0 };
		if (write(fd, mine, sizeof mine) == (ssize_t)sizeof mine) {
			struct timespec until;
			clock_gettime(CLOCK_MONOTONIC, &until);
			until.tv_nsec += 500 * 1000000L;
			if (until.tv_nsec >= 1000000000L) {
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			pthread_mutex_lock(&ps->mu);
			while (!ps->probe_seen && !ps->closed &&
			    pthread_cond_timedwait(&ps->mon_cv, &ps->mu, &until) == 0)
				;
			rc = ps->probe_seen ? 1 : ps->closed ? -1 : 0;
			pthread_mutex_unlock(&ps->mu);
		}
	}
	close(fd);
	pthread_mutex_lock(&ps->mu);
	ps->probing = false;
	pthread_mutex_unlock(&ps->mu);
	return rc;
}

static void *monitor_main(void *arg)
{
	struct psock *ps = arg;
	for (;;) {
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += MONITOR_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&ps->mu);
		while (!ps->closed && pthread_cond_timedwait(&ps->mon_cv, &ps->mu, &until) == 0)
			;
		bool stop = ps->closed;
		pthread_mutex_unlock(&ps->mu);
		if (stop || !gate_enter(ps))
			return NULL;
		uint64_t other;
		bool moved = listener_other(ps->lst, &other) && other > ps->lst_other;
		gate_leave(ps);
		if (!moved)
			continue;
		/* An accept failed: harmless (ECONNSHUT...) or fatal (ECLOSED).
		 * Ask the listener itself. */
		ps->lst_other = other;
		if (listener_probe(ps) != 0)
			continue;
		if (!gate_enter(ps))
			return NULL;
		if (listener_replace(ps) == 0)
			ps->restarts++;
		gate_leave(ps);
	}
}

/* Options, pipe hook, then listen or dial. On failure the caller closes. */
static int psock_start(struct psock *ps, const char *url, const struct proto_opts *o,
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
		return map_nng(rv, false);
	nng_socket_set_ms(ps->s, NNG_OPT_SENDTIMEO, dur(ps->send_timeout_ms));
	nng_socket_set_ms(ps->s, NNG_OPT_RECONNMINT, 50);
	nng_socket_set_ms(ps->s, NNG_OPT_RECONNMAXT, 1000);
	/* Listeners always watch their pipes: the monitor's probe needs it. */
	ps->on_pipe = o->on_pipe;
	ps->pipe_arg = o->pipe_arg;
	if (o->on_pipe || listen) {
		if ((rv = nng_pipe_notify(ps->s, NNG_PIPE_EV_ADD_POST, pipe_cb, ps)) != 0 ||
		    (rv = nng_pipe_notify(ps->s, NNG_PIPE_EV_REM_POST, pipe_cb, ps)) != 0)
			return map_nng(rv, false);
	}
	if (listen) {
		ps->ipc_mode = o->ipc_mode ? o->ipc_mode : DEFAULT_IPC_MODE;
		if ((rv = listener_open(ps, url)) != 0)
			return map_nng(rv, false);
		ps->url = bound_url(url, ps->lst);
		if (ps->url && pthread_create(&ps->mon, NULL, monitor_main, ps) == 0)
			ps->mon_running = true;
	} else {
		/* A refused connection is retried briefly: a server's listener
		 * may be in the middle of a restart by its monitor. A dialer
		 * whose first connection failed does not start again: each
		 * try is a new one. */
		for (int tries = 0;; tries++) {
			nng_dialer d;
			if ((rv = nng_dialer_create(&d, ps->s, url)) != 0)
				return map_nng(rv, true);
			rv = nng_dialer_start(d, o->dial_wait ? 0 : NNG_FLAG_NONBLOCK);
			if (rv == 0)
				break;
			nng_dialer_close(d);
			if (tries == 6 || (rv != NNG_ECONNREFUSED && rv != NNG_ENOENT))
				return map_nng(rv, true);
			usleep(50 * 1000);
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
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ps->mon_cv, &ca);
	pthread_condattr_destroy(&ca);
}

static bool gate_enter(struct psock *ps)
{
	pthread_rwlock_rdlock(&ps->gate);
	if (ps->closed) {
		pthread_rwlock_unlock(&ps->gate);
		return false;
	}
	return true;
}

static void gate_leave(struct psock *ps)
{
	pthread_rwlock_unlock(&ps->gate);
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
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
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
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&c->mu);
	while (!c->done && pthread_cond_timedwait(&c->cv, &c->mu, &until) == 0)
		;
	bool done = c->done;
	pthread_mutex_unlock(&c->mu);
	closer_put(c);
	return done;
}

/* Closes the nng socket once (see "Closing" above); blocked operations
 * return BATON_ECLOSED. false when nng_close did not finish in time. */
static bool psock_shutdown(struct psock *ps)
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
	if (ps->mon_running) {
		pthread_mutex_lock(&ps->mu);
		pthread_cond_broadcast(&ps->mon_cv);
		pthread_mutex_unlock(&ps->mu);
		pthread_join(ps->mon, NULL);
		ps->mon_running = false;
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
static int psock_fini(struct psock *ps)
{
	if (!psock_shutdown(ps))
		return BATON_ETIMEDOUT;
	pthread_rwlock_destroy(&ps->gate);
	pthread_cond_destroy(&ps->mon_cv);
	pthread_cond_destroy(&ps->idle);
	pthread_mutex_destroy(&ps->mu);
	free(ps->pids);
	free(ps->url);
	return 0;
}

/* Starts an operation on aio through the gate (start(arg, aio): an
 * nng_ctx_send/recv or nng_recv_aio) and waits for it, cancelable by
 * psock_shutdown. The result as a Baton code. A send that never started
 * leaves its message in the aio, as a failed one does. */
static int aio_run(struct psock *ps, nng_aio *aio, int timeout_ms,
    void (*start)(void *, nng_aio *), void *arg)
{
	struct waiter w = { aio, NULL, NULL };
	nng_aio_set_timeout(aio, dur(timeout_ms));
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
	return map_nng(nng_aio_result(aio), false);
}

static void start_ctx_send(void *ctx, nng_aio *aio)
{
	nng_ctx_send(*(nng_ctx *)ctx, aio);
}

static void start_ctx_recv(void *ctx, nng_aio *aio)
{
	nng_ctx_recv(*(nng_ctx *)ctx, aio);
}

static void start_sock_recv(void *sock, nng_aio *aio)
{
	nng_recv_aio(*(nng_socket *)sock, aio);
}

/* ---- encoding straight into an nng message ----------------------------------------
 * Two passes: count the bytes, then write them into a message of exactly
 * that size, so a 64 MiB bin is copied once and never reallocated. */

struct counter {
	size_t n;
};

static int count_write(void *data, const char *buf, size_t len)
{
	(void)buf;
	((struct counter *)data)->n += len;
	return 0;
}

struct filler {
	char *p;
	size_t off, cap;
};

static int fill_write(void *data, const char *buf, size_t len)
{
	struct filler *f = data;
	if (len > f->cap - f->off)
		return -1;
	memcpy(f->p + f->off, buf, len);
	f->off += len;
	return 0;
}

static int encode_nng(const struct baton_msg *m, nng_msg **out, struct proto_diag *diag)
{
	struct counter c = { 0 };
	nng_msg *msg;
	int err, rv;
	*out = NULL;
	if ((err = proto__encode_to(m, count_write, &c, diag)))
		return err;
	if ((rv = nng_msg_alloc(&msg, c.n)) != 0)
		return proto__fail(diag, BATON_ENOMEM, "no memory for a message of %zu bytes", c.n);
	struct filler f = { nng_msg_body(msg), 0, c.n };
	if ((err = proto__encode_to(m, fill_write, &f, diag)) || f.off != c.n) {
		nng_msg_free(msg);
		return err ? err : proto__fail(diag, BATON_EINTERNAL, "encoder is not deterministic");
	}
	*out = msg;
	return 0;
}

/* ---- REP server ------------------------------------------------------------------ */

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
		return map_nng(rv, false);
	}
	rv = NNG_ECLOSED;
	if (gate_enter(&srv->ps)) {
		rv = nng_ctx_open(&c->ctx, srv->ps.s);
		gate_leave(&srv->ps);
	}
	if (rv != 0) {
		nng_aio_free(c->aio);
		free(c);
		return map_nng(rv, false);
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
	int err, rv;
	*out = NULL;
	if (!(srv = calloc(1, sizeof *srv)))
		return BATON_ENOMEM;
	psock_init(&srv->ps);
	srv->ps.peer_proto = 0x30; /* req0 */
	if ((rv = nng_rep0_open(&srv->ps.s)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	srv->ps.open = true;
	if ((err = psock_start(&srv->ps, url, o, true)))
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
	if (srv && !psock_shutdown(&srv->ps))
		return BATON_ETIMEDOUT;
	return 0;
}

int proto_server_close(struct proto_server *srv)
{
	if (!srv)
		return 0;
	proto_ctx_close(srv->own);
	srv->own = NULL;
	if (psock_fini(&srv->ps))
		return BATON_ETIMEDOUT; /* leaked: nng may still use it */
	free(srv);
	return 0;
}

const char *proto_server_url(const struct proto_server *srv)
{
	return srv && srv->ps.url ? srv->ps.url : "";
}

/* Fault injection (engine/fault.h has the syntax): BATON_FAULT="send:N" or
 * "send:N/every" makes the Nth send of a reply (proto_ctx_reply) or a request
 * (proto_client_call), counted together per process, fail with
 * BATON_ECLOSED before it reaches nng: a reply is dropped (the client's REQ
 * resends), a request is not sent. One line on stderr per fault. */
static unsigned long fault_nth, fault_every;
static _Atomic unsigned long fault_sends;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_parse(void)
{
	const char *v = getenv("BATON_FAULT");
	const char *p = v ? strstr(v, "send:") : NULL;
	if (p && (p == v || p[-1] == ',' || p[-1] == ' ')) {
		char *end;
		fault_nth = strtoul(p + 5, &end, 10);
		if (*end == '/')
			fault_every = strtoul(end + 1, NULL, 10);
	}
}

static bool send_fault(const char *what)
{
	pthread_once(&fault_once, fault_parse);
	if (fault_nth == 0)
		return false;
	unsigned long n = atomic_fetch_add(&fault_sends, 1) + 1;
	if (n < fault_nth || (n != fault_nth && (fault_every == 0 || (n - fault_nth) % fault_every != 0)))
		return false;
	fprintf(stderr, "baton-fault: send call %lu fails (%s): %s\n", n, what,
	    baton_strerror(BATON_ECLOSED));
	return true;
}

static int ctx_send_msg(struct proto_ctx *c, nng_msg *msg)
{
	nng_aio_set_msg(c->aio, msg);
	int err = aio_run(c->ps, c->aio, c->send_timeout_ms, start_ctx_send, &c->ctx);
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
	if (encode_nng(&rep, &msg, NULL)) {
		proto_reply_error(&rep, PROTO_OP_NONE, id, err, NULL);
		if (encode_nng(&rep, &msg, NULL))
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
	if ((err = aio_run(c->ps, c->aio, timeout_ms, start_ctx_recv, &c->ctx)))
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
	int err = encode_nng(rep, &msg, &d);
	if (err) {
		char text[sizeof d.text + 32];
		snprintf(text, sizeof text, "reply did not encode: %s", d.text);
		ctx_send_error(c, rep->op, rep->id, BATON_EINTERNAL, text);
		return err;
	}
	if (send_fault("reply")) {
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

/* ---- REQ client ------------------------------------------------------------------- */

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
	psock_init(&cli->ps);
	if ((rv = nng_req0_open(&cli->ps.s)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	cli->ps.open = true;
	int resend = o && o->resend_ms ? o->resend_ms : DEFAULT_RESEND_MS;
	if ((rv = nng_socket_set_ms(cli->ps.s, NNG_OPT_REQ_RESENDTIME, dur(resend))) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	if ((err = psock_start(&cli->ps, url, o, false)))
		goto fail;
	*out = cli;
	return 0;
fail:
	proto_client_close(cli);
	return err;
}

int proto_client_shutdown(struct proto_client *cli)
{
	if (cli && !psock_shutdown(&cli->ps))
		return BATON_ETIMEDOUT;
	return 0;
}

int proto_client_close(struct proto_client *cli)
{
	if (!cli)
		return 0;
	if (psock_fini(&cli->ps))
		return BATON_ETIMEDOUT;
	free(cli);
	return 0;
}

static int remaining(double deadline, int timeout_ms)
{
	if (timeout_ms < 0)
		return -1;
	double left = deadline - now_ms();
	return left <= 0 ? 0 : (int)(left + 0.999);
}

/* Sends msg (ours; freed here) on a fresh context and waits for the reply
 * message (*out, the caller's) within the deadline. */
static int call_msg(struct proto_client *cli, nng_msg *msg, const char *what,
    int timeout_ms, nng_msg **out, struct proto_diag *diag)
{
	double deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	nng_ctx ctx;
	nng_aio *aio;
	int err, rv;

	*out = NULL;
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		nng_msg_free(msg);
		return proto__fail(diag, map_nng(rv, false), "no aio");
	}
	rv = NNG_ECLOSED;
	if (gate_enter(&cli->ps)) {
		rv = nng_ctx_open(&ctx, cli->ps.s);
		gate_leave(&cli->ps);
	}
	if (rv != 0) {
		nng_msg_free(msg);
		nng_aio_free(aio);
		return proto__fail(diag, map_nng(rv, false), "%s: no context: %s", what,
		    baton_strerror(map_nng(rv, false)));
	}
	/* The send completes when the request is on a pipe: it waits for a
	 * connection, within the same deadline. */
	nng_aio_set_msg(aio, msg);
	if ((err = aio_run(&cli->ps, aio, remaining(deadline, timeout_ms), start_ctx_send, &ctx))) {
		nng_msg_free(nng_aio_get_msg(aio));
		proto__fail(diag, err, "%s %s: %s", what,
		    err == BATON_ETIMEDOUT ? "was not sent" : "send", baton_strerror(err));
	} else if ((err = aio_run(&cli->ps, aio, remaining(deadline, timeout_ms), start_ctx_recv, &ctx))) {
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
	if ((err = encode_nng(req, &msg, diag)))
		return err;
	if (send_fault("request")) {
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

/* ---- PUB/SUB ---------------------------------------------------------------------- */

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
	psock_init(&pub->ps);
	pub->ps.peer_proto = 0x21; /* sub0 */
	if ((rv = nng_pub0_open(&pub->ps.s)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	pub->ps.open = true;
	if ((rv = nng_socket_set_int(pub->ps.s, NNG_OPT_SENDBUF, EVENT_QUEUE)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	if ((err = psock_start(&pub->ps, url, o, true)))
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
	if ((err = encode_nng(ev, &msg, NULL)))
		return err;
	rv = NNG_ECLOSED;
	if (gate_enter(&pub->ps)) {
		rv = nng_sendmsg(pub->ps.s, msg, 0);
		gate_leave(&pub->ps);
	}
	if (rv != 0) {
		nng_msg_free(msg);
		return map_nng(rv, false);
	}
	return 0;
}

int proto_pub_close(struct proto_pub *pub)
{
	if (!pub)
		return 0;
	if (psock_fini(&pub->ps))
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
	psock_init(&sub->ps);
	if ((rv = nng_aio_alloc(&sub->aio, NULL, NULL)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	if ((rv = nng_sub0_open(&sub->ps.s)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	sub->ps.open = true;
	/* topic-less: the empty prefix matches every message */
	if ((rv = nng_socket_set(sub->ps.s, NNG_OPT_SUB_SUBSCRIBE, "", 0)) != 0 ||
	    (rv = nng_socket_set_int(sub->ps.s, NNG_OPT_RECVBUF, EVENT_QUEUE)) != 0) {
		err = map_nng(rv, false);
		goto fail;
	}
	if ((err = psock_start(&sub->ps, url, o, false)))
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
	if ((err = aio_run(&sub->ps, sub->aio, timeout_ms, start_sock_recv, &sub->ps.s)))
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
	if (psock_fini(&sub->ps))
		return BATON_ETIMEDOUT;
	if (sub->aio)
		nng_aio_free(sub->aio);
	free(sub);
	return 0;
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
	if (mkdir(path, 0770) != 0 && errno != EEXIST)
		return -1;
	return 0;
}
