/*
 * serve.h: the engine's serve loop: one model on one device (engine/model/model.h),
 * serving STATUS, GEN and the control commands (RELEASE, REFILL, VRAM,
 * PEER) on its own nng REP socket, optionally under a broker
 * (broker_link.h). The program (main_baton-engine.c) parses flags, calls
 * serve_open, waits for signals calling serve_tick, then serve_close.
 *
 * One serve loop per process (it is the process's engine), held by the
 * program as a struct serve and passed to every handler; its internals
 * are serve_int.h's. Logs go to stderr, one line each,
 * "baton-engine[NAME]: ...".
 */
#ifndef BATON_ENGINE_SERVE_H
#define BATON_ENGINE_SERVE_H

#include <stdint.h>

/* What the flags say (baton-engine --help). Strings must outlive the loop. */
struct baton_serve_config {
	const char *name, *arena, *listen, *backend, *broker;
	int32_t priority;
	int device, peer_device, use_peer;
	uint64_t cache_mib, segment_mib, reserve_mib, host_mib;
	int release, elastic, verify;
	double idle_s;
	uint32_t ctx;            /* --ctx: KV cache positions of a whole model; 0: its default */
	double broker_wait_s;    /* --broker-wait: how long to wait for the broker at start */
	int broker_optional;     /* --broker-optional: no broker then: serve alone */
	/* text serving (a whole model): continuous batching and the OpenAI API */
	uint32_t max_seqs;       /* --max-seqs: sequences decoded together; 0: default */
	uint32_t max_queue;      /* --max-queue: requests waiting; 0: default */
	uint32_t step_tokens;    /* --step-tokens: rows a step (and a pass); 0: default */
	uint32_t kv_blocks;      /* --kv-blocks: the KV pool; 0: one max_ctx sequence */
	int no_prefix_cache;     /* --no-prefix-cache */
	uint64_t kv_host_mib;    /* --kv-host-mib: the prefix cache kept in host memory at a release */
	const char *http;        /* --http ADDR: the OpenAI-compatible API; NULL: off */
	const char *http_token;  /* read from --http-token-file; NULL: none (loopback only) */
	int content_special;     /* --special-tokens-in-content */
	int no_access_log;       /* --no-access-log: no line per request */
	const char *served_model; /* --served-model-name; NULL: the arena's file name */
	const char **cors_origins; /* --cors-origins: origins browsers may call --http from; NULL: none */
	uint32_t max_n;          /* --max-n: choices one request may ask for; 0: default (8) */
};

struct serve;

/* Why serve_open failed at the broker, for the exit status. */
enum serve_broker_fail { SERVE_BROKER_OK, SERVE_BROKER_REFUSED, SERVE_BROKER_ABSENT };

/* Opens the engine, listens on cfg->listen, starts the receivers and,
 * with cfg->broker, registers and asks for the cache's memory (waiting up
 * to cfg->broker_wait_s for a broker to answer). 0 once it serves, with
 * *out the serve loop; else the engine's error (engine_open:
 * BATON_EINVAL, BATON_ENODEV, ...), BATON_ESERVE_START when it could not
 * listen or start, BATON_EEXIST (or another refusal) when the broker
 * refused to register it (the name is taken; *fail REFUSED), BATON_ECONN
 * or BATON_ETIMEDOUT when no broker answered in time and
 * cfg->broker_optional is not set (*fail ABSENT); the reason logged;
 * nothing is left open then. fail may be NULL. */
int serve_open(const struct baton_serve_config *cfg, struct serve **out, enum serve_broker_fail *fail);
/* The URL it listens on. */
const char *serve_url(const struct serve *s);
/* The OpenAI API's URL ("http://127.0.0.1:PORT"), "" without --http. */
const char *serve_http_url(const struct serve *s);
/* A warning the operator must see ("" when none): today, that "auto"
 * runs on the host backend although a GPU is present (the engine's
 * backend_warning, engine/model/model.h). Logged, in GET /health, and
 * printed by the program after its ready line. */
const char *serve_warning(const struct serve *s);
/* The idle-release timer (idle.c): the program calls it every 100 ms or
 * so, from one thread. */
void serve_tick(struct serve *s);
/* Stops the receivers, closes the socket, releases the cache (the device
 * memory goes back), tells the broker, closes the engine, frees s. NULL ok. */
void serve_close(struct serve *s);

#endif
