/*
 * door_int.h: what the front door's files share (door.h, docs/reference/front-door.md).
 *
 *   door.c      open, reload, close; its routes and metrics on the HTTP face
 *   view.c      the engines and devices as the core says: the event
 *               subscription and the status read it triggers
 *   intake.c    a request in: its checks, its model's queue, a client that
 *               leaves (on_gone)
 *   dispatch.c  the dispatch thread: each round, per device, who takes
 *               requests and whether the device switches model
 *   proxy.c     one forwarded request: the engine's reply passed through
 *   refill.c    the refill of a switch, on a thread of its own
 *   models.c    GET /v1/models
 *   faces.c     Ollama's /api/ (its lists; chat, generate, show go on as
 *               completions do), beside Anthropic's /v1/messages (routed
 *               as a completion)
 *   metrics.c   its Prometheus lines and histograms
 *   errors.c    answers in OpenAI's error shape
 *   policy.c    which engines of a device take requests now and when the
 *               device switches to another model (pure)
 *   fleet.c     the [model] sections: engines the broker starts, watches,
 *               restarts and stops itself (below the rest: it calls only
 *               view.c's lookups and door_fleet_failed); fleet_int.h
 *   fleet_view.c what /v1/models and /metrics say of the fleet's models
 *   upstream.c  the HTTP/1.1 client to an engine's OpenAI HTTP
 *   usage.c     the engine's usage report (tokens, time to first token)
 *   stored.c    which engine keeps each stored response (an LRU of ids)
 *   responses.c GET and DELETE /v1/responses/{id}, routed by it
 *
 * The door is a face of the broker: it reads engines through broker_call
 * (a status, when the core's events say something changed; a refill of a
 * switch) and speaks through broker_emit; it never touches the registry
 * and keeps no state of an engine but the requests it forwarded there.
 *
 * Locking: d->mu guards everything below it in struct broker_door. No
 * HTTP call (reply, stream) and no broker_call is made under it.
 */
#ifndef BATON_BROKER_DOOR_INT_H
#define BATON_BROKER_DOOR_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "broker/door/door.h"

#define DOOR_NB 12                 /* histogram buckets (metrics.c) */

struct baton_http_req;


/* One request through the door, from arrival to its answer's end. */
struct dreq {
	struct dreq *next;       /* in its model's queue, or the door's list of forwarded ones */
	uint64_t id;
	struct baton_http_req *r;
	int model;               /* index into d->models */
	const char *path;        /* "/v1/chat/completions" or "/v1/completions" */
	const char *body;        /* the request's own body, valid until answered */
	char *own_body;          /* a body rewritten (an alias: the model's name), freed with it */
	size_t len;
	bool stream;
	bool gone;               /* the client left */
	double t_in, t_fwd, refill_ms;
	bool unserved;           /* no engine served its model when it came: it waited for a start */
	char eng[BROKER_NAME_MAX]; /* the engine it was forwarded to ("" before) */
	char url[BROKER_URL_MAX];
	char pin[BROKER_NAME_MAX]; /* only this engine takes it ("": any of its model's): it keeps the
	                              response its previous_response_id names */
	bool aside;              /* a stored response's GET or DELETE: straight to its engine, not
	                            counted among the model's served requests */
	bool del;                /* aside: a DELETE (else a GET) */
	struct door_up *up;      /* while the proxy reads the engine's reply */
	struct broker_door *d;
};

/* An engine with OpenAI HTTP, as the core's last status said (view.c). */
struct deng {
	char name[BROKER_NAME_MAX], model[BROKER_NAME_MAX], gpu[BROKER_NAME_MAX];
	char http[BROKER_URL_MAX], state[32];
	uint64_t resident, ceiling;
	int pid;
};

/* A model the door has queued for (its queue and its counters). */
struct dmodel {
	char name[BROKER_NAME_MAX];
	struct dreq *qh, *qt;
	unsigned queued;
	bool queue_told;         /* door.queue published for the wait under way */
	uint64_t served, rejected_full, failed, gone;
	uint64_t client_error;   /* the engine answered 4xx: the client's request, never "failed" */
	struct baton_serving sv; /* the serving metrics (metrics.c writes them, proxy.c counts) */
	double last_active;      /* a request of it came or ended (the fleet's stop_after_s) */
	struct baton_hist wait, refill, prefill, start;
	double served_since;     /* an engine of it came into the view (0: none there) */
};

/* A device: what the core said of it, and the door's switch on it.
 * Engines are named, never indexed: the view is rebuilt at every read. */
struct ddev {
	char gpu[BROKER_NAME_MAX];
	uint64_t free_b, reserve;   /* the core's */
	char holder[BROKER_NAME_MAX]; /* the engine the door last switched it to, "": none */
	double holder_since;
	bool switching, refilling;
	char target[BROKER_NAME_MAX], from[BROKER_NAME_MAX]; /* from "": a refill that evicts nobody */
	double sw_t0, drained_at;
	uint64_t switches;
};

struct broker_door {
	struct broker *b;
	struct broker_http *h;
	bool observing;
	pthread_mutex_t read_mu; /* one status read at a time: applied in the order asked */

	pthread_mutex_t mu;
	double quantum_s;
	unsigned queue_max;
	pthread_cond_t cv;       /* the dispatch thread waits on it */
	pthread_cond_t idle_cv;  /* close waits on it for helpers to end */
	bool stop;
	bool again;              /* the dispatch thread goes round once more without waiting */
	bool stale;              /* an event came since the last status read */
	bool have_status;        /* one status was read */
	pthread_t th;
	bool have_th;
	unsigned helpers;        /* proxy and refill threads running */
	uint64_t next_id;
	struct deng eng[BROKER_MAX_ENGINES]; /* the core's last status: engines with HTTP */
	size_t n_eng;
	struct ddev devs[BROKER_MAX_GPUS];
	size_t n_devs;
	struct dmodel models[BROKER_MAX_ENGINES];
	size_t n_models;
	struct dreq *fwd;        /* forwarded, not yet answered to the end */
	struct door_fleet *fleet; /* the [model] sections (fleet.c); NULL: none */
	uint64_t switches_total;
	struct baton_hist sw_drain, sw_refill; /* the parts of each switch */
	bool access_log;         /* a log line per request ([broker] access_log) */
	struct door_stored *stored; /* response id -> the engine that keeps it (stored.c) */
};


/* ---- door.c ------------------------------------------------------------------- */

/* Under d->mu: runs fn(arg) on a detached helper thread (counted in
 * d->helpers); false when none could start. door_helper_done() at its end. */
bool door_spawn(struct broker_door *d, void *(*fn)(void *), void *arg);
void door_helper_done(struct broker_door *d);

/* ---- view.c ------------------------------------------------------------------- */

/* The core's event subscriber: marks the view stale, wakes the dispatch thread. */
void door_on_event(void *arg, const struct baton_msg *ev);
/* Reads the core's status (broker_call) and makes it the view; not under
 * d->mu. false when the core did not answer. */
bool door_refresh(struct broker_door *d);
/* Under d->mu: lookups in the view (NULL / -1: none). */
struct deng *door_eng(struct broker_door *d, const char *name);
struct ddev *door_dev(struct broker_door *d, const char *gpu);
int door_model(struct broker_door *d, const char *name, bool add);
/* Holds its whole cache. */
bool door_ready(const struct deng *e);
/* Whether an engine of this model is in the view. */
bool door_served(struct broker_door *d, const char *model);
/* Requests forwarded to it, not yet answered. */
unsigned door_inflight(struct broker_door *d, const char *name);

/* ---- intake.c, models.c ------------------------------------------------------- */

/* The route handlers (broker_http_route): a completion in; GET /v1/models. */
void door_on_completion(void *arg, struct baton_http_req *r);
void door_on_models(void *arg, struct baton_http_req *r);
/* Under d->mu: the names of the models a list shows, in its order: the
 * door's (named by a request or an engine), then the [model] sections
 * nothing named yet; at most max. */
size_t door_list_names(struct broker_door *d, char (*names)[BROKER_NAME_MAX], size_t max);
/* A list's answer: 200 with view(d), made under d->mu from a fresh view
 * of the engines (read first when stale); 503 when the door's thread
 * cannot start. */
void door_reply_list(struct broker_door *d, struct baton_http_req *r, json_t *(*view)(struct broker_door *d));
/* faces.c: everything under /api/ (Ollama's): its lists, and chat,
 * generate and show through door_on_completion. */
void door_on_ollama(void *arg, struct baton_http_req *r);
/* The dispatch thread, started with the first request; false when it cannot. */
bool door_start_dispatch(struct broker_door *d);

/* ---- dispatch.c, proxy.c, refill.c -------------------------------------------- */

void *door_dispatch(void *arg);
/* Under d->mu: q leaves its queue for engine e; false when no thread
 * could start (q is then the caller's to answer). */
bool door_forward(struct broker_door *d, struct dreq *q, const struct deng *e);
/* The refill of a device's switch (a helper thread; arg from door_refill_job). */
void *door_refill_thread(void *arg);
void *door_refill_job(struct broker_door *d, const char *gpu, const char *eng);

/* ---- fleet.c, fleet_view.c ----------------------------------------------------- */

struct door_fleet;

int door_fleet_open(struct broker_door *d, const struct broker_config *cfg, struct door_fleet **out, char *err,
    size_t errlen);
/* Starts the supervisor (once the broker runs). */
int door_fleet_start(struct door_fleet *f);
/* A reloaded configuration's [model] sections: added ones join, removed
 * ones are stopped and dropped, changed ones restarted (when their engine
 * runs), the others untouched. */
void door_fleet_reload(struct door_fleet *f, const struct broker_config *cfg);
/* Stops every engine it started (SIGTERM, then SIGKILL) and frees; NULL allowed. */
void door_fleet_close(struct door_fleet *f);
/* Under d->mu: the model of this name or alias: its name into canon and
 * 0 (1: failed, why into why), or -1 when no [model] has it; canon and
 * why may be NULL. */
int door_fleet_resolve(struct door_fleet *f, const char *name, char *canon, size_t n, char *why, size_t wn);
/* Under d->mu: a request waits for the model: start its engine when none runs. */
void door_fleet_want(struct door_fleet *f, const char *name);
/* Under d->mu: its /v1/models part ({state, aliases, source, device, pid,
 * starts, crashes, log...}) and its state name; NULL when not a [model]. */
json_t *door_fleet_json(struct door_fleet *f, const char *name, const char **state);
size_t door_fleet_names(struct door_fleet *f, char (*names)[BROKER_NAME_MAX], size_t max);
/* Under d->mu: its Prometheus lines. */
void door_fleet_metrics(struct door_fleet *f, FILE *out);
/* Not under d->mu (the supervisor): a model failed: what waits for it is
 * answered 503 with why (dispatch.c). */
void door_fleet_failed(struct broker_door *d, const char *name, const char *why);
/* Frees a request (its rewritten body too). */
void door_dreq_free(struct dreq *q);

/* ---- usage.c ------------------------------------------------------------------ */

/* What the engine said of a request it served: "prompt_tokens=P
 * completion_tokens=C ttft_s=T finish=F" (engine/serve/usage.c). */
struct door_usage {
	bool have;
	unsigned long prompt, completion;
	double ttft_s;
	char finish[16];
};
/* The report's text (the header's value, the comment's rest); u->have when it is one. */
void door_usage_parse(const char *s, struct door_usage *u);
/* A whole reply without the header (a batch of prompts): its "usage" object. */
void door_usage_of_body(const char *buf, size_t n, struct door_usage *u);
/* A stream's report is a comment line (": baton-usage ...") in its
 * [DONE] event: taken out, so the client gets the engine's stream as the
 * engine writes it to anyone else. Lines are followed across reads; a
 * comment line longer than line[] passes on as it is. */
struct door_strip {
	bool mid;            /* inside a line (not at its start) */
	bool held;           /* holding a comment line */
	char line[256];
	size_t n;
};
/* in[0..n) to out (room for n + sizeof s->line bytes); returns out's
 * length; a report found goes into u. At the stream's end a line still
 * held (s->held, s->n bytes of s->line) is the caller's to pass on. */
size_t door_strip_usage(struct door_strip *s, const char *in, size_t n, char *out, struct door_usage *u);

/* The access log's line of a request answered without an engine (a full
 * queue, a failed model, a client gone while it waited); not under d->mu. */
void door_access_refused(struct broker_door *d, const char *model, int status, double t_in, bool stream);

/* ---- stored.c, responses.c ------------------------------------------------------ */

#define DOOR_STORED_MAX 4096       /* stored responses' ids remembered */
#define DOOR_STORED_ID_MAX 128     /* an id's bytes, with NUL */
#define DOOR_SNIFF_MAX (8u << 20)  /* a stream's first event held to read its id */

struct door_stored;
struct door_stored *door_stored_new(void);
void door_stored_free(struct door_stored *m);
/* One line of visible ASCII without '/', shorter than DOOR_STORED_ID_MAX. */
bool door_stored_id_ok(const char *id);
/* Under d->mu: remembers id -> model, engine (the most recently used
 * now; the least recently used goes when full, counted); false for an
 * id that is not door_stored_id_ok. */
bool door_stored_put(struct door_stored *m, const char *id, const char *model, const char *eng);
/* Under d->mu: its model and engine (used now); false when not known. */
bool door_stored_get(struct door_stored *m, const char *id, char *model, size_t mn, char *eng, size_t en);
bool door_stored_forget(struct door_stored *m, const char *id);
/* How many are remembered; *evicted: how many went for room. */
size_t door_stored_count(const struct door_stored *m, uint64_t *evicted);
/* A whole /v1/responses answer's id, when it is stored (store not false). */
bool door_stored_id_of_body(const char *buf, size_t len, char *id, size_t n);
/* A stream's first event, held as it passes (at most DOOR_SNIFF_MAX). */
struct door_sniff {
	char *buf;
	size_t len, cap;
	char last, last2;    /* the bytes before this piece */
	bool done, over;
};
/* Feeds a piece of the stream; true once the first event is whole (or
 * too large: over). */
bool door_sniff_feed(struct door_sniff *s, const char *in, size_t n);
/* The first event's response id, when it is response.created of a stored response. */
bool door_sniff_id(const struct door_sniff *s, char *id, size_t n);
void door_sniff_free(struct door_sniff *s);
/* The route handler of /v1/responses/{id} (GET, DELETE). */
void door_on_stored(void *arg, struct baton_http_req *r);

/* ---- metrics.c ---------------------------------------------------------------- */

void door_hist_add(struct baton_hist *h, double s);
/* Its Prometheus lines (broker_http_metrics). */
void door_metrics(void *arg, FILE *f);

/* ---- errors.c ----------------------------------------------------------------- */

/* Answers r in OpenAI's error shape ({"error": {message, type, param,
 * code}}), with Retry-After when retry_after is set. */
void door_reply_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

/* ---- policy.c ----------------------------------------------------------------- */

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

/* ---- upstream.c --------------------------------------------------------------- */

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
/* The bearer token the engine's HTTP needs (NULL or "": none), sent with
 * the next request; BATON_EINVAL for one that is not visible ASCII. */
int door_up_set_token(struct door_up *u, const char *token);
/* The next bodyless request is a DELETE, not a GET. */
void door_up_set_delete(struct door_up *u);
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
