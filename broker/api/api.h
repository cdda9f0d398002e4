/*
 * api.h: the one door of the broker's HTTP face (broker/api/): the JSON
 * API under /v1, Prometheus metrics on /metrics, the dashboard on /,
 * /healthz and /readyz, on the http/ server (its checks: Host, Origin,
 * token, size, before a body is read), and the HTTP token the broker
 * makes (guard.c). See docs/http-api.md.
 *
 * It sits on the core's public door only (broker/broker.h): requests go
 * through broker_call, events come from broker_observe. Other faces on
 * the same address (the OpenAI front door, broker/door/) sit above it:
 * they register their routes and metrics here (broker_http_route,
 * broker_http_metrics); the API never names them.
 */
#ifndef BATON_BROKER_API_H
#define BATON_BROKER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "broker/broker.h"

struct broker_http;
struct baton_http_req;

/* Whether HOST:PORT names a loopback address (127/8, ::1, localhost). */
bool broker_http_loopback(const char *hostport);

/* The token POSTs need when none is configured (c->http_token empty):
 * with HTTP on a loopback address and an ipc:// control socket, the first
 * line of http.token beside that socket, made at first start (32 random
 * bytes in hex, mode 0640, written through an O_EXCL temporary file and a
 * rename) and refused when it is not ours, not a regular file or readable
 * by others; c->http_token_path names it. Without an ipc:// socket no
 * token is made and POSTs are refused until one is configured. HTTP on an
 * address other than loopback without a configured token: BATON_ECONFIG
 * (the broker refuses to start). Other failures: BATON_EIO/BATON_EPERM.
 * Nothing to do with HTTP off. */
int broker_http_token_prepare(struct broker_config *c, char *err, size_t errlen);

/* Listens on cfg->http (HOST:PORT) and starts its threads; BATON_EINVAL or
 * BATON_EIO with err when the address is bad or cannot be bound. Faces
 * register their routes before broker_start (requests for them meanwhile
 * get 404, as any unknown path). */
int broker_http_open(struct broker *b, const struct broker_config *cfg, struct broker_http **out,
    char *err, size_t errlen);
/* "http://HOST:PORT" it listens on (port 0 resolved). */
const char *broker_http_url(const struct broker_http *h);
/* GET /readyz answers 200 while ready, else 503: set once broker_start
 * has the decision loop running, cleared before broker_stop (and by
 * broker_http_close). NULL h allowed. */
void broker_http_ready(struct broker_http *h, bool ready);
/* Unsubscribes, stops listening, answers what is queued, joins its
 * threads and frees; NULL allowed. Before broker_close(), and before the
 * faces that registered routes close: once it returns no route is
 * called again. Quick after broker_stop(). */
void broker_http_close(struct broker_http *h);

/* ---- routes of other faces (as nng_http_handler: a path, its methods,
 * its body limit, its handler) ------------------------------------------ */

#define BROKER_HTTP_ROUTES_MAX 16

/* A face's route. A request whose path is `path` (or, with prefix, starts
 * with it) goes to fn(arg, r) on one of the server's threads, its body
 * read; fn answers it, now or later from any thread (http.h: exactly one
 * answer). A method not in `methods` gets 405 with Allow from the API.
 * The API's own paths come first; a face cannot take them. */
struct broker_http_route {
	const char *path;             /* "/v1/chat/completions"; kept, not copied */
	bool prefix;                  /* match every path that starts with path */
	const char *methods;          /* "POST", "GET, HEAD": the Allow header too */
	size_t body_max;              /* a body larger gets 413 before it is read; 0: 64 KiB */
	void (*fn)(void *arg, struct baton_http_req *r);
	void *arg;                    /* alive until broker_http_close returned */
};
/* Adds a route (copied; its strings kept); BATON_EINVAL (no path, no fn,
 * one of the API's own paths or one already taken), BATON_ENOMEM (more
 * than BROKER_HTTP_ROUTES_MAX). Before broker_start, from the program's
 * thread. */
int broker_http_route(struct broker_http *h, const struct broker_http_route *rt);
/* fn(arg, f) writes a face's Prometheus lines after the broker's own on
 * GET /metrics (any HTTP thread; arg alive until broker_http_close
 * returned). BATON_ENOMEM past BROKER_HTTP_ROUTES_MAX. As
 * broker_http_route. */
int broker_http_metrics(struct broker_http *h, void (*fn)(void *arg, FILE *f), void *arg);

#endif
