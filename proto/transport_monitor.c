/*
 * transport_monitor.c: listening, and the listener monitor.
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
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "proto/transport_int.h"

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


#define MONITOR_MS 250

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
	double end = proto__now_ms() + 1000;
	while (got < sizeof head) {
		int left = (int)(end - proto__now_ms());
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


int proto__listen(struct psock *ps, const char *url)
{
	int rv;
	if ((rv = listener_open(ps, url)) != 0)
		return rv;
	ps->url = bound_url(url, ps->lst);
	if (ps->url && pthread_create(&ps->mon, NULL, monitor_main, ps) == 0)
		ps->mon_running = true;
	return 0;
}

void proto__monitor_stop(struct psock *ps)
{
	if (!ps->mon_running)
		return;
	pthread_mutex_lock(&ps->mu);
	pthread_cond_broadcast(&ps->mon_cv);
	pthread_mutex_unlock(&ps->mu);
	pthread_join(ps->mon, NULL);
	ps->mon_running = false;
}

bool proto__probe_pipe(struct psock *ps, nng_pipe p, int pid, bool add)
{
	return add ? is_probe(ps, p, pid) : was_probe(ps, nng_pipe_id(p));
}
