/*
 * engine.h: one loaded model on one device: the arena, the backend, the
 * dense tensors on the device, the expert cache and the decode loop. The
 * serve loop (main_baton-engine.c) and the benchmark drive it.
 *
 * Not thread-safe: one thread at a time calls into an engine; the serve
 * loop serializes GEN and control commands.
 */
#ifndef BATON_ENGINE_ENGINE_H
#define BATON_ENGINE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"
#include "engine/cache/cache.h"

#define BATON_GEN_MAX_BATCH 256u
#define BATON_GEN_MAX_STEPS 100000u

struct baton_engine_config {
	const char *name;
	const char *arena_path;
	const char *backend;       /* "host", "cuda" or "auto" */
	int device;
	uint64_t cache_bytes;      /* ceiling; 0 = auto: the whole model, or what fits */
	uint64_t segment_bytes;    /* 0 = 256 MiB */
	uint64_t reserve_bytes;    /* headroom kept free when growing (--vram-reserve-mib) */
	uint64_t host_capacity;    /* host backend device size; 0 = its default */
	int verify;                /* --verify-refill */
	int warm;                  /* fill the cache at open (default 1) */
	int use_peer;              /* open peer_device as the peer tier's device */
	int peer_device;           /* same backend, != device (--peer-device) */
};

struct baton_gen_timings {
	double route_s, load_s, compute_s, total_s;
};

struct baton_engine;

/* Opens the arena, the backend and the cache, uploads the dense tensors and
 * (when cfg->warm) fills the cache. errbuf gets a sentence naming the
 * problem. The engine owns everything it opened; engine_close frees it. */
int engine_open(const struct baton_engine_config *cfg, struct baton_engine **out,
    char *errbuf, size_t errlen);
void engine_close(struct baton_engine *e);

/* Runs `steps` decode steps over `batch` tokens through every layer. The
 * start state is `input` (batch * d_model floats) or, when NULL, derived
 * from `seed`. `output` (may be NULL) receives batch * d_model floats;
 * *checksum is XXH3-64 of those bytes. Misses load experts; while released
 * or partial the cache maps what the request needs first. */
int engine_gen(struct baton_engine *e, uint32_t steps, uint32_t batch, uint64_t seed,
    const float *input, float *output, uint64_t *checksum, struct baton_gen_timings *t);

int engine_release(struct baton_engine *e, struct baton_cache_report *rep);
/* Gives back the device memory of the GEN path (each layer's router and
 * norm, the activations), for a release of everything (serve's release
 * with all); engine_gen uploads them again first. Idempotent; the bytes
 * freed. */
uint64_t engine_release_gen(struct baton_engine *e);
int engine_refill(struct baton_engine *e, struct baton_cache_report *rep);
/* reserve_bytes < 0: grow back to the configured size. */
int engine_vram(struct baton_engine *e, int64_t reserve_bytes, struct baton_cache_report *rep);
/* The peer tier (cache_peer_set on the peer device): bytes > 0 holds up to
 * that much there, 0 drops it. BATON_EUNSUPPORTED without a peer device. */
int engine_peer(struct baton_engine *e, uint64_t bytes, struct baton_cache_report *rep);
/* The peer device's free and total memory (any thread, like
 * engine_mem_info); BATON_EUNSUPPORTED without a peer device. */
int engine_peer_mem_info(struct baton_engine *e, uint64_t *free_bytes, uint64_t *total_bytes);

struct baton_engine_info {
	const char *name, *backend, *arena;
	char gpu[64];
	uint32_t d_model, layers, experts, top_k;
	uint64_t model_bytes;          /* every expert blob */
	uint64_t dense_bytes;          /* router + norms on the device */
	uint64_t dev_free, dev_total;
	const char *compute_error;     /* NULL when GEN can run on this backend */
	double pin_s;                  /* host_register of the arena at open */
	char peer_gpu[64];             /* the peer device's uuid; "" without one */
	uint64_t peer_want;            /* cache_peer_want: what a peer tier could use */
	struct baton_cache_stats cache;
};
void engine_info(struct baton_engine *e, struct baton_engine_info *info);
/* The device's free and total memory now; unlike the rest, any thread may
 * call it while another uses the engine. */
int engine_mem_info(struct baton_engine *e, uint64_t *free_bytes, uint64_t *total_bytes);
struct baton_cache *engine_cache(struct baton_engine *e);
/* The engine's own mapping of the arena (pinned when the backend pins). */
const struct baton_arena *engine_arena(struct baton_engine *e);
struct baton_dev *engine_dev(struct baton_engine *e);
/* The backend the engine drives its device with (engine/model/model.c runs the
 * forward pass's ops through it). */
const struct baton_backend *engine_backend(struct baton_engine *e);
/* The peer device, or NULL. */
struct baton_dev *engine_peer_dev(struct baton_engine *e);

#endif
