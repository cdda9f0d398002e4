/*
 * broker_int.h: what the broker's own files share and nobody else uses:
 * the daemon's blocking request path (broker.c) and the HTTP server that
 * sits on it (http.c). Not a public door: see broker.h.
 */
#ifndef BATON_BROKER_INT_H
#define BATON_BROKER_INT_H

#include "broker/broker.h"

struct broker_http;

/*
 * Runs one request through the decision thread exactly as a control-socket
 * receiver does, and blocks the calling thread until it is answered (a
 * refill or handoff may wait for memory: up to acquire_wait_ms plus the
 * command timeout). `fn(arg, rep)` then sees the reply, valid only during
 * the call. Strings in *req are borrowed for the duration. Once the
 * decision thread has stopped, the reply is an error BATON_ECLOSED at once.
 * Never call it from the decision thread or from an nng callback.
 */
void broker_call(struct broker *b, const struct baton_msg *req,
    void (*fn)(void *arg, const struct baton_msg *rep), void *arg);

/*
 * The HTTP server (http.c). broker_http_open() listens on cfg->http and
 * starts its threads; BATON_EIO (with err) when the address cannot be
 * bound. broker_http_event() records one published event (the events
 * ring behind /v1/events and the counters behind /metrics); the decision
 * thread calls it, it takes only the server's own lock. broker_http_close()
 * stops listening, answers what is queued, joins its threads and frees; it
 * must run after the decision thread has stopped. NULL allowed.
 */
int broker_http_open(struct broker *b, const struct broker_config *cfg, struct broker_http **out,
    char *err, size_t errlen);
void broker_http_event(struct broker_http *h, const struct baton_msg *ev);
const char *broker_http_server_url(const struct broker_http *h);
void broker_http_close(struct broker_http *h);

/* The dashboard page (dashboard_page.c, generated from dashboard.html). */
extern const char broker_dashboard_html[];
extern const unsigned long broker_dashboard_html_len;

#endif
