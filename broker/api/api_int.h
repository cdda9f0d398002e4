/* api_int.h: what the broker's HTTP face (http.c) and its metrics
 * (metrics.c) share; not public. */
#ifndef BATON_BROKER_API_INT_H
#define BATON_BROKER_API_INT_H

#include <stddef.h>

#include "broker/api/api.h"

/* Counters and histograms from the broker's events (releases, refills,
 * grants, denials, handoffs, errors, events), and the Prometheus text. */
struct broker_metrics;
struct broker_metrics *broker_metrics_new(void);
void broker_metrics_free(struct broker_metrics *m);
/* Counts one event; any thread. */
void broker_metrics_event(struct broker_metrics *m, const struct baton_msg *ev);
/* The whole /metrics text (gauges from a status request through
 * broker_call, then the counters) into *out (malloc'd); 0, or a Baton
 * error with msg. */
int broker_metrics_text(struct broker_metrics *m, struct broker *b, char **out, size_t *len, char *msg,
    size_t n);

/* POST /v1/leases[/NAME/renew|release] and /v1/externals[/NAME/VERB]
 * (lend_http.c): whether path is one of them; and the call: *status and
 * *out (a JSON object: the answer, or {"error"...} made by the caller from
 * err and msg when *out is NULL). */
int broker_http_lend_path(const char *path);
void broker_http_lend(struct broker *b, const char *path, const char *body, size_t len, int *status, int *err,
    char *msg, size_t msglen, struct json_t **out);

#endif
