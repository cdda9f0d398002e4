/*
 * serve_int.h: internal to engine/serve/'s serve loop (serve.c, status.c,
 * work.c, request.c, control.c, idle.c); the door is serve.h.
 *
 * One struct serve per engine process, made by serve_open and handed to
 * every handler: no process global. Its locks:
 *   run_mu  held while the engine works (a GEN, a COMPLETE's scheduler
 *           steps between sched_begin and sched_end, a control command,
 *           the idle release): the engine is used by one thread at a time
 *   st_mu   guards the STATUS snapshot and the counters below it
 *   acq_mu  one thread at a time asks the broker for memory
 *
 * The calls go one way: serve.c (open, close, the receivers) calls the
 * handlers (request.c, control.c, status.c's on_status) and idle.c is
 * called by the program; the handlers use work.c (memory and the work
 * bracket) and status.c (the snapshot, logging, replies); work.c uses
 * status.c; status.c uses nothing of the others.
 */
#ifndef BATON_ENGINE_SERVE_INT_H
#define BATON_ENGINE_SERVE_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/model/model.h"
#include "engine/serve/broker_link.h"
#include "engine/serve/openai.h"
#include "engine/serve/sched.h"
#include "engine/serve/serve.h"
#include "proto/proto.h"

#define RECEIVERS 4
#define YIELD_S 0.1
/* A broker command refused busy stops admissions until it ran, or this long. */
#define DRAIN_S 2.0
/* serve_open could not listen or start its receivers (the log says why). */
#define BATON_ESERVE_START BATON_EIO

struct serve;

/* One receiver thread and its nng context. */
struct serve_receiver {
	struct serve *s;
	struct proto_ctx *ctx;
	pthread_t th;
};

/* The engine and everything about it that STATUS reports. */
struct serve {
	struct baton_engine *e;
	struct proto_server *srv;
	pthread_mutex_t run_mu;     /* held while the engine works */
	pthread_mutex_t st_mu;      /* guards the fields below */
	const char *state;          /* "ready", "releasing", ... */
	struct baton_engine_info info;
	uint64_t epoch, requests;
	uint64_t last_refill_bytes;
	double last_refill_s;
	double last_active;         /* monotonic seconds of the last request */
	int idle_released;          /* the last release was the idle timer's */
	int has_keep_alive;         /* an Ollama request set keep_alive_s (idle.c) */
	double keep_alive_s;        /* in place of o.idle_s: 0 at once, < 0 never */
	double started_wall;        /* when the engine started (wall clock seconds) */
	uint64_t snap_epoch;        /* epoch when the snapshot was taken */
	uint64_t ceiling;           /* bytes the cache maps when whole */
	uint64_t kv_bytes;          /* the KV pool's device bytes at the snapshot */
	int active;                 /* GENs running or waiting */
	double yield_at;            /* a broker command was refused busy then */
	pthread_cond_t yield_cv;
	pthread_mutex_t acq_mu;     /* one GEN thread at a time asks the broker */
	struct broker_link *link;
	struct baton_generator *gen; /* NULL: the arena has no whole model (gen_error says why) */
	char gen_error[512];
	struct baton_sched *sched;  /* runs COMPLETE and the OpenAI API's requests (with gen) */
	struct oai_server *oai;     /* --http */
	char model_name[256];       /* the served model id */
	int released_all;           /* a release --all gave back the model too (under run_mu) */
	uint64_t model_bytes;       /* what the model held before it (under run_mu) */
	atomic_int stopping;        /* main sets it, receivers read it */
	uint32_t d_model;           /* set once at start */
	const char *warning;        /* set once at start: the engine's backend_warning, or "" */
	char peer_gpu[64];          /* set once at start; "" without --peer-device */
	struct baton_serve_config o;
	char made_token[80];        /* the HTTP token made under a broker (o.http_token points here) */
	struct serve_receiver rx[RECEIVERS];
	int nth;                    /* receivers started */
};

/* ---- status.c: the snapshot, logging, replies, what others read -------- */

void serve_log(struct serve *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The UTC stamp a log line starts with ("2026-12-01T21:50:07.611Z "), or
 * "" under journald (JOURNAL_STREAM set): into stamp, returned. */
const char *serve_stamp(char *stamp, size_t len);
/* Refreshes the STATUS snapshot (state NULL: from the cache's); the
 * caller holds run_mu. */
void serve_snapshot(struct serve *s, const char *state);
void serve_set_state(struct serve *s, int st); /* a BATON_STATE_* */
/* Tells the broker (when linked) what changed and why. */
void serve_report(struct serve *s, const char *reason, double ms, uint64_t bytes);
/* What a release gave back, from the snapshot (st_mu held): "all", "experts", "none". */
const char *serve_level_name(struct serve *s);
void serve_reply(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *rep);
void serve_reply_err(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req, int err,
    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void serve_on_status(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req);
/* The broker link's callbacks (arg: the serve) and GET /health's. */
void serve_link_state(void *arg, struct broker_link_state *st);
void serve_link_log(void *arg, const char *line);
void serve_health_fields(void *arg, json_t *obj);
/* The Ollama face's hooks (openai.h): the model's facts; keep_alive (idle.c). */
void serve_model_facts(void *arg, json_t *obj);
void serve_keep_alive(void *arg, double seconds);

/* ---- work.c: device memory and the work bracket ------------------------- */

/* After a release --all: the model back on the device (run_mu held). */
int serve_refill_model(struct serve *s);
/* The cache whole again, or `limit` bytes of it (run_mu held). */
int serve_make_full(struct serve *s, uint64_t limit, struct baton_cache_report *sum);
int serve_fill_to(struct serve *s, int64_t reserve, struct baton_cache_report *sum);
/* With a broker: asks before making the cache whole (run_mu held; it may
 * drop it while it waits). 0 to go on, else the broker's refusal. */
int serve_ensure_memory(struct serve *s, const char *why, char *err, size_t errlen);
/* The bracket of a request that computes (GEN; COMPLETE through the
 * scheduler's hooks): begin takes the engine (0) or has replied the error;
 * done counts it (before the reply); end gives the engine back (after
 * refilling the rest of an idle release), before the reply too: a reply
 * means the next operation is taken. */
int serve_work_begin(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req);
int serve_work_done(struct serve *s, int ok);
void serve_work_end(struct serve *s, int refill_rest);
/* The scheduler's hooks (arg: s). */
void serve_sched_hooks(struct serve *s, struct sched_hooks *h);
/* Test hook for cache_set_progress (BATON_TEST_REFILL_STEP_MS). */
void serve_refill_step(void *ctx, uint64_t done, uint64_t total);

/* ---- the handlers ------------------------------------------------------- */

/* request.c: GEN and COMPLETE. */
void serve_on_gen(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req);
void serve_on_complete(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req);
/* control.c: RELEASE, REFILL, VRAM, PEER. */
void serve_on_control(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req);

#endif
