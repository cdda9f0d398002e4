/*
 * door_int.h: what the front door's files share (docs/reference/front-door.md).
 *
 *   door.c           the door: routes, per-model queues, the dispatch
 *                    thread, acquire (refill) and keep-alive, /v1/models,
 *                    its metrics and events
 *   door_policy.c    which engines of a device take requests now and when
 *                    the device switches to another model (pure)
 *   door_upstream.c  the HTTP/1.1 client to an engine's OpenAI HTTP
 *
 * The door is a face of the broker: it sees engines through broker_call
 * (status, refill, release) and speaks through broker_emit; it never
 * touches the registry.
 */
#ifndef BATON_BROKER_DOOR_INT_H
#define BATON_BROKER_DOOR_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "broker/broker.h"

/* ---- door_policy.c ------------------------------------------------------------ */

/* One engine (with OpenAI HTTP) on the device, as the policy sees it. */
struct door_pe {
	unsigned queued;     /* requests of its model waiting for an engine */
	double oldest_s;     /* how long the oldest of them has waited */
	unsigned inflight;   /* requests forwarded to it, not yet answered */
	bool ready;          /* it holds its whole cache (state "ready") */
	bool fits;           /* the device has room for its refill: nobody is evicted */
};

/* The device. */
struct door_pdev {
	int holder;          /* the engine the device was last switched to, -1: none */
	double held_s;       /* since when it holds it (seconds) */
	double quantum_s;    /* the longest a holder keeps the device while others wait */
	bool switching;      /* a switch is under way (drain, then refill) */
	int target;          /* the engine it switches to */
	int from;            /* the engine it switches out (drained), -1: none */
};

/*
 * flow[i]: engine i takes requests now. *switch_to: the engine the device
 * should switch to (refill it, after draining the holder unless the
 * engine fits), -1: none. Rules: an engine that holds its cache flows
 * (unless a switch drains it); a waiting engine that fits is refilled at
 * once; otherwise the holder keeps the device while it has work and its
 * quantum is not spent, then the engine whose oldest request waited
 * longest gets it. An idle holder gives way at once.
 */
void door_policy(const struct door_pe *e, size_t n, const struct door_pdev *d, bool *flow, int *switch_to);

/* ---- door_upstream.c ---------------------------------------------------------- */

struct door_up;

/* Connects to url ("http://HOST:PORT") within timeout_ms. BATON_EINVAL
 * (bad URL), BATON_ECONN, BATON_ENOMEM with a sentence in err. */
int door_up_open(const char *url, int timeout_ms, struct door_up **out, char *err, size_t errlen);
/* Sends `POST path` with the JSON body (a GET when body is NULL), then
 * reads the reply's status line and headers, each read bounded by
 * timeout_ms (a whole reply's headers come when it is done: make it
 * long). door_up_cancel() from another thread ends the wait.
 * BATON_ECLOSED, BATON_ETIMEDOUT, BATON_EMSG (not HTTP), BATON_ETOOBIG
 * with a sentence in err. */
int door_up_request(struct door_up *u, const char *path, const char *body, size_t len, int timeout_ms,
    char *err, size_t errlen);
int door_up_status(const struct door_up *u);
/* A reply header's value copied into out, or NULL when absent. */
const char *door_up_header(const struct door_up *u, const char *name, char *out, size_t n);
/* Whether the body has a declared length (then *len is it). */
bool door_up_has_length(const struct door_up *u, uint64_t *len);
/* Up to n bytes of the (de-chunked) body, as soon as some arrive: > 0
 * bytes, 0 at its end, -BATON_* on an error (-BATON_ECLOSED: the
 * connection closed early or was cancelled). */
long door_up_read(struct door_up *u, char *out, size_t n, int timeout_ms);
/* Ends the exchange from any thread: a read in progress returns at once. */
void door_up_cancel(struct door_up *u);
void door_up_close(struct door_up *u);

#endif
