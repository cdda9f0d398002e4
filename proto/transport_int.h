/*
 * transport_int.h: what the transport's files share, below all of them:
 * the socket wrapper (struct psock) that every REQ, REP, PUB and SUB
 * socket embeds, its gate, and small helpers. transport_sock.c owns the
 * wrapper's life (options, pipe events, listening, closing), with
 * transport_hangup.c under it; transport_msg.c turns messages into nng
 * messages; the REP, REQ and PUB/SUB files are the faces of proto.h and
 * call only downward, into these.
 */
#ifndef BATON_PROTO_TRANSPORT_INT_H
#define BATON_PROTO_TRANSPORT_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <nng/nng.h>

#include "proto/proto_int.h"

struct pid_entry {
	uint32_t pipe;
	int pid;
};

/* An operation in flight, so a shutdown can cancel it (proto__aio_run). */
struct waiter {
	nng_aio *aio;
	struct waiter *prev, *next;
};

/* One nng socket and what Baton keeps around it; see "Closing" in
 * transport_sock.c for the gate. */
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
};

/* Every nng call that takes a socket or context reference holds the gate
 * for reading; false (nothing held) once the socket is shut. */
static inline bool gate_enter(struct psock *ps)
{
	pthread_rwlock_rdlock(&ps->gate);
	if (ps->closed) {
		pthread_rwlock_unlock(&ps->gate);
		return false;
	}
	return true;
}

static inline void gate_leave(struct psock *ps)
{
	pthread_rwlock_unlock(&ps->gate);
}

static inline double proto__now_ms(void)
{
	return baton_now_s() * 1e3;
}

static inline nng_duration proto__dur(int ms)
{
	return ms < 0 ? NNG_DURATION_INFINITE : (nng_duration)ms;
}

/* ---- transport_sock.c ---- */

/* An nng error as a Baton code; dialing: a missing ipc path is a refused
 * connection, not a missing object. */
int proto__nng_err(int rv, bool dialing);

/* The wrapper initialised, then the socket opened by open_fn (nng_req0_open...)
 * and marked open; an nng failure as a baton error. The caller's close
 * path (proto__psock_fini) undoes it either way. */
int proto__psock_open(struct psock *ps, int (*open_fn)(nng_socket *));
/* Options, pipe hook, then listen or dial. On failure the caller closes
 * (proto__psock_fini). */
int proto__psock_start(struct psock *ps, const char *url, const struct proto_opts *o,
    bool listen);
/* Closes the nng socket once; blocked operations return BATON_ECLOSED.
 * false when nng_close did not finish in time (the socket is leaked). */
bool proto__psock_shutdown(struct psock *ps);
/* Shuts down and frees what the socket used; BATON_ETIMEDOUT when nng
 * could not close it (then what nng may still touch stays allocated). */
int proto__psock_fini(struct psock *ps);

/* Starts an operation on aio through the gate (start(arg, aio)) and waits
 * for it, cancelable by a shutdown. The result as a Baton code. */
int proto__aio_run(struct psock *ps, nng_aio *aio, int timeout_ms,
    void (*start)(void *, nng_aio *), void *arg);
void proto__start_ctx_send(void *ctx, nng_aio *aio);
void proto__start_ctx_recv(void *ctx, nng_aio *aio);
void proto__start_sock_recv(void *sock, nng_aio *aio);

/* ---- transport_hangup.c ---- */

/* Whether an EPIPE from sendmsg reads as ECONNRESET to this process's nng
 * (older than 1.6.0); see there. */
bool proto__hangup_remap(void);

/* ---- transport_msg.c ---- */

/* Encodes m into a new nng message of exactly its size (*out, the
 * caller's). */
int proto__encode_nng(const struct baton_msg *m, nng_msg **out, struct proto_diag *diag);
/* Fault injection: whether this send (of a "reply" or "request") is to
 * fail; see BATON_FAULT in transport_msg.c. */
bool proto__send_fault(const char *what);

#endif
