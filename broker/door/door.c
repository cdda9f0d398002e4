/*
 * door.c: the front door's life (door.h, docs/front-door.md): open (the
 * core's events, its routes and metrics on the HTTP face), reload, close;
 * and the helper threads its proxies and refills run on.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/door/door_int.h"
#include "http/http.h"


void door_helper_done(struct broker_door *d)
{
	pthread_mutex_lock(&d->mu);
	d->helpers--;
	pthread_cond_broadcast(&d->idle_cv);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

bool door_spawn(struct broker_door *d, void *(*fn)(void *), void *arg)
{
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 << 10);
	d->helpers++;
	int rc = pthread_create(&t, &a, fn, arg);
	pthread_attr_destroy(&a);
	if (rc != 0)
		d->helpers--;
	return rc == 0;
}

/* Under d->mu (or before the door runs). */
static void set_config(struct broker_door *d, const struct broker_config *cfg)
{
	d->quantum_s = cfg->door_quantum_s;
	d->queue_max = cfg->door_queue_max ? cfg->door_queue_max : 64;
	d->access_log = cfg->access_log;
}

void broker_door_reload(struct broker_door *d, const struct broker_config *cfg)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	set_config(d, cfg);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	door_fleet_reload(d->fleet, cfg);
	/* the keep-alive is the core's (schedule.c), named here with the rest */
	broker_log("front door: quantum %g s, keep-alive %g s, queue %u per model", cfg->door_quantum_s,
	    cfg->door_keep_alive_s, cfg->door_queue_max);
}

int broker_door_open(struct broker *b, struct broker_http *h, const struct broker_config *cfg,
    struct broker_door **out, char *err, size_t errlen)
{
	*out = NULL;
	struct broker_door *d = calloc(1, sizeof *d);
	if (!d) {
		snprintf(err, errlen, "front door: out of memory");
		return BATON_ENOMEM;
	}
	d->b = b;
	d->h = h;
	set_config(d, cfg);
	pthread_mutex_init(&d->mu, NULL);
	pthread_mutex_init(&d->read_mu, NULL);
	baton_cond_init(&d->cv);
	baton_cond_init(&d->idle_cv);
	d->stale = true;
	d->stored = door_stored_new();
	if (!d->stored) {
		snprintf(err, errlen, "front door: out of memory");
		broker_door_close(d);
		return BATON_ENOMEM;
	}
	int rc = broker_observe(b, door_on_event, d);
	if (rc) {
		snprintf(err, errlen, "front door: cannot subscribe to the broker's events: %s", baton_strerror(rc));
		broker_door_close(d);
		return rc;
	}
	d->observing = true;
	const struct broker_http_route routes[] = {
		{ .path = "/v1/chat/completions", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
		{ .path = "/v1/completions", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
		{ .path = "/v1/responses", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
		/* a stored response, at the engine that keeps it (responses.c) */
		{ .path = "/v1/responses/", .prefix = true, .methods = "GET, DELETE", .fn = door_on_stored, .arg = d },
		{ .path = "/v1/models", .methods = "GET, HEAD", .fn = door_on_models, .arg = d },
		/* vLLM's, answered by the model's engine */
		{ .path = "/tokenize", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
		{ .path = "/detokenize", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
		/* the other faces (faces.c): Ollama's, Anthropic's */
		{ .path = "/api/", .prefix = true, .methods = "GET, HEAD, POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_ollama, .arg = d },
		{ .path = "/v1/messages", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
		{ .path = "/v1/messages/count_tokens", .methods = "POST", .body_max = HTTP_OPENAI_BODY_MAX,
		  .fn = door_on_completion, .arg = d },
	};
	for (size_t i = 0; h && i < sizeof routes / sizeof routes[0] && !rc; i++)
		rc = broker_http_route(h, &routes[i]);
	if (!rc && h)
		rc = broker_http_metrics(h, door_metrics, d);
	if (!rc && (rc = door_fleet_open(d, cfg, &d->fleet, err, errlen)) != 0) {
		broker_door_close(d);
		return rc;
	}
	if (rc) {
		snprintf(err, errlen, "front door: cannot register its routes: %s", baton_strerror(rc));
		broker_door_close(d);
		return rc;
	}
	*out = d;
	return 0;
}

int broker_door_start(struct broker_door *d)
{
	if (!d)
		return 0;
	if (!door_start_dispatch(d))
		return BATON_ENOMEM;
	return door_fleet_start(d->fleet);
}

void door_dreq_free(struct dreq *q)
{
	if (q)
		free(q->own_body);
	free(q);
}

void broker_door_close(struct broker_door *d)
{
	if (!d)
		return;
	door_fleet_close(d->fleet); /* its engines stopped; no supervisor calls in after this */
	d->fleet = NULL;
	if (d->observing)
		broker_unobserve(d->b, door_on_event, d);
	pthread_mutex_lock(&d->mu);
	d->stop = true;
	pthread_cond_signal(&d->cv);
	bool joined = d->have_th;
	pthread_mutex_unlock(&d->mu);
	if (joined)
		pthread_join(d->th, NULL);
	/* what waits is answered; what is forwarded is cut (its proxy answers) */
	struct dreq *rest = NULL;
	pthread_mutex_lock(&d->mu);
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		if (m->qh) {
			m->qt->next = rest;
			rest = m->qh;
		}
		m->qh = m->qt = NULL;
		m->queued = 0;
	}
	for (struct dreq *q = d->fwd; q; q = q->next)
		door_up_cancel(q->up);
	pthread_mutex_unlock(&d->mu);
	for (struct dreq *q = rest, *nx; q; q = nx) {
		nx = q->next;
		door_reply_error(q->r, 503, "server_error", NULL, NULL, "5", "the broker is shutting down");
		door_dreq_free(q);
	}
	pthread_mutex_lock(&d->mu);
	while (d->helpers) {
		for (struct dreq *q = d->fwd; q; q = q->next)
			door_up_cancel(q->up);
		baton_cond_wait_for(&d->idle_cv, &d->mu, 0.1);
	}
	pthread_mutex_unlock(&d->mu);
	pthread_mutex_destroy(&d->mu);
	pthread_mutex_destroy(&d->read_mu);
	pthread_cond_destroy(&d->cv);
	pthread_cond_destroy(&d->idle_cv);
	door_stored_free(d->stored);
	free(d);
}
