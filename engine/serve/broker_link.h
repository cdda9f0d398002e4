/*
 * broker_link.h: the engine's side of the broker (baton-engine --broker).
 *
 * A thread registers the engine (retrying until the broker is up), sends a
 * heartbeat every heartbeat_ms with the engine's live state, and registers
 * again whenever the broker answers not_found or the connection comes back
 * (a restarted broker learns every engine's live state within a heartbeat
 * or two). Reports of state changes are queued and sent by that thread, so
 * broker_link_report() never blocks the caller.
 *
 * broker_link_acquire() is the one blocking call: an engine asks before it
 * refills or grows on its own initiative (a request arriving while its cache
 * is released or partial). When the broker is away it returns BATON_ECONN at
 * once, and the engine goes on by itself: serving matters more than
 * accounting, and the engine re-registers its real state when the broker
 * is back.
 *
 * Thread-safe: acquire and report may be called from any thread.
 *
 * Internal to engine/serve/ (its door is serve.h).
 */
#ifndef BATON_ENGINE_BROKER_LINK_H
#define BATON_ENGINE_BROKER_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The engine's live state, filled by the engine's callback. */
struct broker_link_state {
	char state[32];
	uint64_t resident, mapped, free_bytes;
	bool busy;
	uint64_t idle_ms;
	uint64_t epoch;     /* the epoch of this state (see proto.h, heartbeat) */
	uint64_t peer_mapped, peer_free; /* the peer tier (sent with a peer_gpu) */
	uint64_t requests;  /* GEN requests answered since start (heartbeats) */
	uint64_t copied, to_copy; /* a refill's progress (heartbeats; to_copy 0: none) */
	uint64_t kv;        /* the KV pool's device bytes (the broker accounts them apart) */
	bool has_prefix;    /* a text engine: the prefix cache's counts below */
	uint64_t prefix_prompt, prefix_cached, prefix_evictions, kv_host_bytes;
	uint64_t kv_used, kv_total; /* the KV pool's blocks (heartbeats; kv_total 0: none) */
	bool has_keep_alive;      /* an Ollama request's keep_alive (heartbeats): the */
	double keep_alive_s;      /* broker's idle release of this engine (< 0: never) */
};

typedef void (*broker_link_state_fn)(void *arg, struct broker_link_state *st);

struct broker_link_params {
	const char *url;          /* the broker's control socket */
	const char *name, *gpu, *model, *ctl;
	const char *http;         /* its OpenAI HTTP URL (--http), NULL or "" for none */
	const char *http_token;   /* the bearer token that URL needs, NULL or "" for none:
	                           * the broker's front door sends it */
	uint32_t pid, device;
	uint64_t floor, ceiling, capacity;
	int32_t priority;
	const char *peer_gpu;     /* the peer tier's device, NULL or "" for none */
	uint64_t peer_want;       /* bytes a peer tier could use (cache_peer_want) */
	int heartbeat_ms;         /* 0: 250 */
	broker_link_state_fn state_fn;
	void *state_arg;
	void (*log)(void *arg, const char *line); /* may be NULL; arg is state_arg */
};

struct broker_link;

/* Starts the thread; connects in the background. Strings are copied. */
int broker_link_open(const struct broker_link_params *p, struct broker_link **out);
/* Sends a last report (state "stopped", best effort, at most ~0.5 s) when
 * `goodbye`, stops the thread and frees. NULL allowed. */
void broker_link_close(struct broker_link *l, bool goodbye);

/* Connected and registered now. */
bool broker_link_up(struct broker_link *l);
/* Waits up to timeout_ms for registration; true when registered. */
bool broker_link_wait_up(struct broker_link *l, int timeout_ms);

/*
 * At start: waits up to timeout_ms for the first registration. 0:
 * registered. The broker's refusal (BATON_EEXIST: an engine of this name
 * is registered already) with its text in err, as soon as it answers so.
 * BATON_ECONN: nothing answered at the URL (not there, or mistyped);
 * BATON_ETIMEDOUT: connected but no answer to register. The link goes on
 * trying either way until closed.
 */
int broker_link_wait_start(struct broker_link *l, int timeout_ms, char *err, size_t errlen);

/*
 * Asks for `bytes` more device memory. 0: granted, *granted (may be less
 * than asked: what the device can ever give) and *epoch (the grant's) set.
 * BATON_ECONN: the broker is away (not connected, or it did not answer in
 * time): go on without it. Other codes are the broker's refusal (e.g.
 * BATON_EDEVMEM after its bounded wait), with its text in err.
 */
int broker_link_acquire(struct broker_link *l, uint64_t bytes, uint64_t *granted, uint64_t *epoch,
    char *err, size_t errlen);

/* Sends a heartbeat now rather than at its time (the engine went busy or
 * idle); never blocks. */
void broker_link_poke(struct broker_link *l);

/* Queues a report of the state now (taken through the state callback). */
void broker_link_report(struct broker_link *l, const char *reason, double ms, uint64_t bytes);

#endif
