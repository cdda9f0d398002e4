/* engine.c: one model on one device; see model.h, the engine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "engine/backend/backend.h"

#define DEFAULT_SEGMENT (256ull * BATON_MIB)
/* Slots start on 256 bytes (what the cache rounds a slot to, cache.c). */
#define SLOT_ALIGN 256u

struct dense_layer {
	baton_dptr router, norm;
	uint64_t gate_off, up_off, down_off;
	/* per layer: llama.cpp's quantization mixes give layers different
	 * types (the arena shape's are layer 0's) */
	uint32_t gate_dtype, up_dtype, down_dtype, router_dtype, norm_dtype;
};

struct baton_engine {
	char *name, *arena_path;
	struct baton_arena *arena;
	const struct baton_backend *be;
	struct baton_dev *dev;
	struct baton_dev *peer;     /* the peer tier's device, or NULL */
	int registered;             /* arena pinned with host_register */
	double pin_s;
	struct baton_cache_item *items;
	uint32_t n_items;
	struct baton_cache *cache;
	struct dense_layer *layers;
	uint64_t dense_bytes;
	baton_dptr x, xn;           /* activations, BATON_GEN_MAX_BATCH rows */
	int gen_released;           /* engine_release_gen: GEN uploads them again */
	uint64_t act_bytes;
	int computable;
	char compute_err[384];
	/* GEN scratch, sized for the largest batch */
	float *host_x;
	uint32_t *ids;
	float *weights;
	uint32_t *want;
	baton_dptr *blobs;
	int truncated_logged;       /* arena_check_src said why, once */
	char backend_warning[640];  /* "" unless auto fell back to host beside a GPU */
};

static void set_err(char *errbuf, size_t errlen, const char *fmt, const char *a, int code)
{
	if (errbuf && errlen)
		snprintf(errbuf, errlen, fmt, a, baton_strerror(code));
}

/* The cache's src_check: after each copy from the arena, is the file
 * still whole? One that shrank under us (truncated in place) read zeros
 * where its pages were (arena/guard.c): the copy fails, its slots are
 * dropped, and what is resident keeps serving. */
static int arena_check_src(void *ctx)
{
	struct baton_engine *e = ctx;
	char msg[512];
	int rc = arena_intact(e->arena, msg, sizeof msg);
	if (rc && !e->truncated_logged) {
		e->truncated_logged = 1;
		fprintf(stderr, "baton-engine %s: %s\n", e->name, msg);
	}
	return rc;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

/* The expert cache's geometry, computed here only (engine/serve asks
 * through engine_open's whole_cache): slots of the largest blob, rounded
 * up to SLOT_ALIGN (the cache's own rounding then changes nothing);
 * segments of segment_bytes (0: 256 MiB, or the whole model when that is
 * smaller), whole slots each, rounded up to the device's granularity;
 * *whole: the segments that hold every expert. */
static void cache_geometry(const struct baton_engine *e, uint64_t segment_bytes, uint64_t *slot,
    uint64_t *seg, uint64_t *whole)
{
	uint64_t gran = e->be->granularity(e->dev);
	if (!gran)
		gran = 1;
	uint64_t sl = round_up(arena_max_expert_bytes(e->arena), SLOT_ALIGN);
	uint64_t all = round_up(sl * e->n_items, gran);
	uint64_t sg = segment_bytes ? segment_bytes : DEFAULT_SEGMENT;
	if (!segment_bytes && sg > all)
		sg = all;
	sg = round_up(sg < sl ? sl : sg, gran);
	uint64_t sps = sg / sl;
	*slot = sl;
	*seg = sg;
	*whole = (e->n_items + sps - 1) / sps * sg;
}

/* Copies one dense tensor of the arena into device memory. */
static int upload_tensor(struct baton_engine *e, uint32_t layer, enum baton_role role,
    baton_dptr *out, uint32_t *dtype)
{
	struct baton_arena_tensor t;
	int rc = arena_tensor(e->arena, layer, role, &t);
	if (rc == BATON_ENOTFOUND && role == BATON_ROLE_NORM) {
		*out = 0; /* no norm: weight 1 */
		return 0;
	}
	if (rc)
		return rc;
	*dtype = t.dtype;
	if ((rc = e->be->alloc(e->dev, t.bytes, out)) != 0)
		return rc;
	e->dense_bytes += t.bytes;
	struct baton_copy c = { .dst = *out, .src = t.data, .bytes = t.bytes };
	if ((rc = e->be->copy_h2d(e->dev, &c, 1)) != 0)
		return rc;
	return e->be->sync(e->dev);
}

/* Every layer's types: a mix the backend cannot compute is cached, not
 * computed (GEN answers unsupported, naming the layer). */
static void check_computable(struct baton_engine *e)
{
	const struct baton_arena_shape *s = arena_shape(e->arena);
	e->computable = e->be->can_compute != NULL && e->be->moe_route != NULL &&
	    e->be->moe_experts != NULL;
	if (!e->computable) {
		snprintf(e->compute_err, sizeof e->compute_err,
		    "the %s backend cannot compute", e->be->name);
		return;
	}
	for (uint32_t l = 0; l < s->layers; l++) {
		uint32_t dts[4] = { s->gate_dtype, s->up_dtype, s->down_dtype, s->router_dtype };
		struct baton_arena_tensor t;
		arena_layer_dtypes(e->arena, l, dts);
		if (arena_tensor(e->arena, l, BATON_ROLE_ROUTER, &t) == 0)
			dts[3] = t.dtype;
		for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
			if (!e->be->can_compute((int)dts[i])) {
				const char *n = baton_dtype_name((int)dts[i]);
				snprintf(e->compute_err, sizeof e->compute_err,
				    "the %s backend cannot compute %s weights (layer %u; cached, not computed; %s)",
				    e->be->name, n ? n : "unknown", l, backend_dtype_advice(e->be, (int)dts[i]));
				e->computable = 0;
				return;
			}
	}
}

/* The paths whose presence says a GPU is there (an NVIDIA driver loaded);
 * BATON_TEST_GPU_NODE replaces them, for tests on machines without one. */
static const char *gpu_node(void)
{
	const char *t = getenv("BATON_TEST_GPU_NODE");
	if (t && *t)
		return access(t, F_OK) == 0 ? t : NULL;
	static const char *const nodes[] = { "/dev/nvidia0", "/proc/driver/nvidia" };
	for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
		if (access(nodes[i], F_OK) == 0)
			return nodes[i];
	return NULL;
}

/* "auto" chose the host backend: with a GPU present that is a surprise
 * (a build without nvcc, a broken driver) the user must hear about, not
 * a quiet run on host memory. */
static void host_fallback_check(struct baton_engine *e)
{
	const char *node = gpu_node();
	if (!node)
		return;
	const struct baton_backend *cuda = NULL;
	char why[256] = "";
	if (backend_find("cuda", &cuda, why, sizeof why) == 0)
		snprintf(why, sizeof why, "the cuda backend was not chosen");
	snprintf(e->backend_warning, sizeof e->backend_warning,
	    "a GPU is present (%s) but this engine runs on the HOST backend (host memory, CPU "
	    "compute): %s; use --backend cuda to make that an error", node, why);
	fprintf(stderr, "baton-engine %s: WARNING: %s\n", e->name, e->backend_warning);
}

/* The peer tier's device: the same backend, another index, reachable. */
static int open_peer(struct baton_engine *e, const struct baton_backend *inner,
    const struct baton_engine_config *cfg, char *errbuf, size_t errlen)
{
	char sub[256] = "";
	int rc;
	if (cfg->peer_device == cfg->device) {
		if (errbuf)
			snprintf(errbuf, errlen, "the peer device must differ from the device (%d)",
			    cfg->device);
		return BATON_EINVAL;
	}
	if (!backend_has_peer(inner)) {
		if (errbuf)
			snprintf(errbuf, errlen, "the %s backend has no peer tier", inner->name);
		return BATON_EUNSUPPORTED;
	}
	if ((rc = inner->open(cfg->peer_device, cfg->host_capacity, &e->peer, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s peer device %d: %s", inner->name, cfg->peer_device, sub);
		e->peer = NULL;
		return rc;
	}
	/* the fault table serves both devices (a peer map counts as a map) */
	const struct baton_backend *be = inner;
	if ((rc = fault_wrap(inner, e->peer, &be, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s", sub);
		inner->close(e->peer);
		e->peer = NULL;
		return rc;
	}
	if ((rc = backend_peer_access(inner, e->dev, e->peer)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s device %d cannot read memory of peer device %d: %s",
			    inner->name, cfg->device, cfg->peer_device,
			    rc == BATON_EUNSUPPORTED ? "no peer access between them" : baton_strerror(rc));
		return rc; /* engine_close closes the peer */
	}
	return 0;
}

int engine_open(const struct baton_engine_config *cfg, struct baton_engine **out,
    char *errbuf, size_t errlen)
{
	char sub[256] = "";
	int rc;
	struct baton_engine *e = calloc(1, sizeof *e);
	if (!e)
		return BATON_ENOMEM;
	e->name = strdup(cfg->name ? cfg->name : "engine");
	e->arena_path = strdup(cfg->arena_path ? cfg->arena_path : "");
	if (!e->name || !e->arena_path) {
		rc = BATON_ENOMEM;
		goto fail;
	}

	if ((rc = arena_open(cfg->arena_path, &e->arena, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "arena %s: %s", cfg->arena_path, sub);
		goto fail;
	}
	if ((rc = backend_find(cfg->backend ? cfg->backend : "auto", &e->be, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s", sub);
		goto fail;
	}
	if ((!cfg->backend || strcmp(cfg->backend, "auto") == 0) && e->be == &baton_backend_host)
		host_fallback_check(e);
	if ((rc = e->be->open(cfg->device, cfg->host_capacity, &e->dev, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s device %d: %s", e->be->name, cfg->device, sub);
		goto fail;
	}
	/* BATON_FAULT: fail the Nth map/alloc/copy (engine/backend/backend.h, fault_wrap). */
	const struct baton_backend *inner = e->be;
	if ((rc = fault_wrap(inner, e->dev, &e->be, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "%s", sub);
		goto fail;
	}
	if (cfg->use_peer && (rc = open_peer(e, inner, cfg, errbuf, errlen)) != 0)
		goto fail;
	check_computable(e);

	/* Pin the arena once per process: every refill copies from it. */
	double t0 = baton_now_s();
	rc = backend_host_register(e->be, e->dev, arena_base(e->arena), arena_size(e->arena));
	if (rc) {
		set_err(errbuf, errlen, "pinning arena %s: %s", cfg->arena_path, rc);
		goto fail;
	}
	e->registered = 1;
	e->pin_s = baton_now_s() - t0;

	const struct baton_arena_shape *s = arena_shape(e->arena);
	e->n_items = s->layers * s->experts;
	e->items = calloc(e->n_items, sizeof *e->items);
	e->layers = calloc(s->layers, sizeof *e->layers);
	if (!e->items || !e->layers) {
		rc = BATON_ENOMEM;
		goto fail;
	}
	for (uint32_t l = 0; l < s->layers; l++) {
		for (uint32_t x = 0; x < s->experts; x++) {
			struct baton_arena_expert ex;
			if ((rc = arena_expert(e->arena, l, x, &ex)) != 0)
				goto fail;
			struct baton_cache_item *it = &e->items[l * s->experts + x];
			it->src = ex.blob;
			it->bytes = ex.bytes;
			it->checksum = ex.checksum;
			if (x == 0) {
				e->layers[l].gate_off = ex.gate_off;
				e->layers[l].up_off = ex.up_off;
				e->layers[l].down_off = ex.down_off;
			}
		}
		uint32_t d3[3];
		if ((rc = arena_layer_dtypes(e->arena, l, d3)) != 0) {
			set_err(errbuf, errlen, "reading the expert types in %s: %s", cfg->arena_path, rc);
			goto fail;
		}
		e->layers[l].gate_dtype = d3[0];
		e->layers[l].up_dtype = d3[1];
		e->layers[l].down_dtype = d3[2];
		e->layers[l].router_dtype = s->router_dtype;
		e->layers[l].norm_dtype = s->norm_dtype;
		if ((rc = upload_tensor(e, l, BATON_ROLE_ROUTER, &e->layers[l].router,
		        &e->layers[l].router_dtype)) != 0 ||
		    (rc = upload_tensor(e, l, BATON_ROLE_NORM, &e->layers[l].norm,
		        &e->layers[l].norm_dtype)) != 0) {
			set_err(errbuf, errlen, "uploading dense tensors of %s: %s", cfg->arena_path, rc);
			goto fail;
		}
	}
	e->act_bytes = (uint64_t)BATON_GEN_MAX_BATCH * s->d_model * sizeof(float);
	if ((rc = e->be->alloc(e->dev, e->act_bytes, &e->x)) != 0 ||
	    (rc = e->be->alloc(e->dev, e->act_bytes, &e->xn)) != 0) {
		set_err(errbuf, errlen, "allocating activations for %s: %s", e->name, rc);
		goto fail;
	}
	size_t nk = (size_t)BATON_GEN_MAX_BATCH * s->top_k;
	e->host_x = malloc(e->act_bytes);
	e->ids = malloc(nk * sizeof *e->ids);
	e->weights = malloc(nk * sizeof *e->weights);
	e->want = malloc(nk * sizeof *e->want);
	e->blobs = malloc(nk * sizeof *e->blobs);
	if (!e->host_x || !e->ids || !e->weights || !e->want || !e->blobs) {
		rc = BATON_ENOMEM;
		goto fail;
	}

	uint64_t slot, seg, whole;
	cache_geometry(e, cfg->segment_bytes, &slot, &seg, &whole);
	uint64_t ceiling = cfg->cache_bytes;
	if (ceiling == 0) {
		/* auto: the whole model; without whole_cache no more than what
		 * the device has free now */
		uint64_t fr = 0, tot = 0;
		ceiling = whole;
		if (!cfg->whole_cache && e->be->mem_info(e->dev, &fr, &tot) == 0) {
			uint64_t avail = fr > cfg->reserve_bytes + e->act_bytes ? fr - cfg->reserve_bytes : 0;
			if (ceiling > avail)
				ceiling = avail / seg * seg;
		}
	}
	if (ceiling < seg)
		ceiling = seg;
	struct baton_cache_config cc = {
		.slot_bytes = slot,
		.segment_bytes = seg,
		.ceiling_bytes = ceiling,
		.reserve_bytes = cfg->reserve_bytes,
		.verify = cfg->verify,
	};
	if ((rc = cache_create(e->be, e->dev, &cc, e->items, e->n_items, &e->cache, sub, sizeof sub)) != 0) {
		if (errbuf)
			snprintf(errbuf, errlen, "expert cache: %s", sub);
		goto fail;
	}
	cache_set_src_check(e->cache, arena_check_src, e);
	if (cfg->warm) {
		struct baton_cache_report rep;
		if ((rc = cache_refill(e->cache, &rep)) != 0) {
			set_err(errbuf, errlen, "warming the cache of %s: %s", e->name, rc);
			goto fail;
		}
	}
	*out = e;
	return 0;
fail:
	engine_close(e);
	return rc;
}

/* The GEN path's device memory: router and norm of each layer, activations. */
static void gen_free(struct baton_engine *e)
{
	if (e->layers) {
		const struct baton_arena_shape *s = arena_shape(e->arena);
		for (uint32_t l = 0; l < s->layers; l++) {
			if (e->layers[l].router)
				e->be->free(e->dev, e->layers[l].router);
			if (e->layers[l].norm)
				e->be->free(e->dev, e->layers[l].norm);
			e->layers[l].router = e->layers[l].norm = 0;
		}
	}
	if (e->x)
		e->be->free(e->dev, e->x);
	if (e->xn)
		e->be->free(e->dev, e->xn);
	e->x = e->xn = 0;
	e->dense_bytes = 0;
}

/* Uploads them again after engine_release_gen (as engine_open did). */
static int gen_upload(struct baton_engine *e)
{
	const struct baton_arena_shape *s = arena_shape(e->arena);
	int rc = 0;
	for (uint32_t l = 0; l < s->layers && rc == 0; l++)
		if ((rc = upload_tensor(e, l, BATON_ROLE_ROUTER, &e->layers[l].router,
		        &e->layers[l].router_dtype)) == 0)
			rc = upload_tensor(e, l, BATON_ROLE_NORM, &e->layers[l].norm, &e->layers[l].norm_dtype);
	if (rc == 0 && (rc = e->be->alloc(e->dev, e->act_bytes, &e->x)) == 0)
		rc = e->be->alloc(e->dev, e->act_bytes, &e->xn);
	if (rc) {
		gen_free(e);
		return rc;
	}
	e->gen_released = 0;
	return 0;
}

uint64_t engine_release_gen(struct baton_engine *e)
{
	if (e->gen_released)
		return 0;
	uint64_t bytes = e->dense_bytes + (e->x ? e->act_bytes : 0) + (e->xn ? e->act_bytes : 0);
	gen_free(e);
	e->gen_released = 1;
	return bytes;
}

void engine_close(struct baton_engine *e)
{
	if (!e)
		return;
	cache_destroy(e->cache);
	if (e->dev) {
		gen_free(e);
		if (e->registered)
			backend_host_unregister(e->be, e->dev, arena_base(e->arena), arena_size(e->arena));
		e->be->close(e->dev);
	}
	if (e->peer)
		e->be->close(e->peer); /* after the cache: its peer segments are gone */
	arena_close(e->arena);
	free(e->items);
	free(e->layers);
	free(e->host_x);
	free(e->ids);
	free(e->weights);
	free(e->want);
	free(e->blobs);
	free(e->name);
	free(e->arena_path);
	free(e);
}

/* splitmix64: the start state of a GEN from its seed, the same everywhere. */
static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int engine_gen(struct baton_engine *e, uint32_t steps, uint32_t batch, uint64_t seed,
    const float *input, float *output, uint64_t *checksum, struct baton_gen_timings *t)
{
	struct baton_gen_timings tm = { 0 };
	double t0 = baton_now_s(), t1;
	int rc;
	if (steps == 0 || steps > BATON_GEN_MAX_STEPS || batch == 0 || batch > BATON_GEN_MAX_BATCH)
		return BATON_ERANGE;
	if (e->gen_released && (rc = gen_upload(e)) != 0)
		return rc;
	const struct baton_arena_shape *s = arena_shape(e->arena);
	size_t n = (size_t)batch * s->d_model;
	if (input) {
		memcpy(e->host_x, input, n * sizeof(float));
	} else {
		uint64_t st = seed;
		for (size_t i = 0; i < n; i++)
			e->host_x[i] = (float)((double)(splitmix64(&st) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
	}
	for (size_t i = 0; i < n; i++)
		if (!isfinite(e->host_x[i]))
			return BATON_ERANGE;
	if (!e->computable)
		return BATON_EUNSUPPORTED;
	struct baton_copy c = { .dst = e->x, .src = e->host_x, .bytes = n * sizeof(float) };
	if ((rc = e->be->copy_h2d(e->dev, &c, 1)) != 0 || (rc = e->be->sync(e->dev)) != 0)
		return rc;

	struct baton_moe_layer ml = {
		.batch = batch, .d_model = s->d_model, .d_ff = s->d_ff,
		.n_experts = s->experts, .top_k = s->top_k,
		.x = e->x, .xn = e->xn,
		.norm_dtype = s->norm_dtype, .router_dtype = s->router_dtype,
		.gate_dtype = s->gate_dtype, .up_dtype = s->up_dtype, .down_dtype = s->down_dtype,
	};
	size_t nk = (size_t)batch * s->top_k;
	for (uint32_t step = 0; step < steps; step++) {
		for (uint32_t l = 0; l < s->layers; l++) {
			ml.norm = e->layers[l].norm;
			ml.router = e->layers[l].router;
			ml.gate_off = e->layers[l].gate_off;
			ml.up_off = e->layers[l].up_off;
			ml.down_off = e->layers[l].down_off;
			ml.gate_dtype = e->layers[l].gate_dtype;
			ml.up_dtype = e->layers[l].up_dtype;
			ml.down_dtype = e->layers[l].down_dtype;
			ml.router_dtype = e->layers[l].router_dtype;
			ml.norm_dtype = e->layers[l].norm_dtype;
			t1 = baton_now_s();
			if ((rc = e->be->moe_route(e->dev, &ml, e->ids, e->weights)) != 0)
				return rc;
			tm.route_s += baton_now_s() - t1;
			for (size_t i = 0; i < nk; i++)
				e->want[i] = l * s->experts + e->ids[i];
			t1 = baton_now_s();
			if ((rc = cache_lookup(e->cache, e->want, nk, e->blobs)) != 0)
				return rc;
			tm.load_s += baton_now_s() - t1;
			t1 = baton_now_s();
			if ((rc = e->be->moe_experts(e->dev, &ml, e->blobs, e->weights)) != 0)
				return rc;
			tm.compute_s += baton_now_s() - t1;
		}
	}
	if ((rc = e->be->sync(e->dev)) != 0 ||
	    (rc = e->be->copy_d2h(e->dev, e->host_x, e->x, n * sizeof(float))) != 0)
		return rc;
	if (output)
		memcpy(output, e->host_x, n * sizeof(float));
	if (checksum)
		*checksum = XXH3_64bits(e->host_x, n * sizeof(float));
	tm.total_s = baton_now_s() - t0;
	if (t)
		*t = tm;
	return 0;
}

int engine_release(struct baton_engine *e, struct baton_cache_report *rep)
{
	return cache_release(e->cache, rep);
}

int engine_refill(struct baton_engine *e, struct baton_cache_report *rep)
{
	return cache_refill(e->cache, rep);
}

int engine_vram(struct baton_engine *e, int64_t reserve_bytes, struct baton_cache_report *rep)
{
	return cache_resize(e->cache, reserve_bytes, rep);
}

int engine_peer(struct baton_engine *e, uint64_t bytes, struct baton_cache_report *rep)
{
	if (!e->peer) {
		if (rep)
			memset(rep, 0, sizeof *rep);
		return BATON_EUNSUPPORTED;
	}
	return cache_peer_set(e->cache, e->peer, bytes, rep);
}

int engine_peer_mem_info(struct baton_engine *e, uint64_t *free_bytes, uint64_t *total_bytes)
{
	if (!e->peer)
		return BATON_EUNSUPPORTED;
	return e->be->mem_info(e->peer, free_bytes, total_bytes);
}

struct baton_dev *engine_peer_dev(struct baton_engine *e)
{
	return e->peer;
}

void engine_info(struct baton_engine *e, struct baton_engine_info *info)
{
	const struct baton_arena_shape *s = arena_shape(e->arena);
	memset(info, 0, sizeof *info);
	info->name = e->name;
	info->backend = e->be->name;
	info->arena = e->arena_path;
	if (e->be->uuid(e->dev, info->gpu, sizeof info->gpu) != 0)
		snprintf(info->gpu, sizeof info->gpu, "unknown");
	info->d_model = s->d_model;
	info->layers = s->layers;
	info->experts = s->experts;
	info->top_k = s->top_k;
	for (uint32_t i = 0; i < e->n_items; i++)
		info->model_bytes += e->items[i].bytes;
	info->dense_bytes = e->dense_bytes;
	info->compute_error = e->computable ? NULL : e->compute_err;
	info->backend_warning = e->backend_warning[0] ? e->backend_warning : NULL;
	info->pin_s = e->pin_s;
	e->be->mem_info(e->dev, &info->dev_free, &info->dev_total);
	cache_stats(e->cache, &info->cache);
	if (e->peer && e->be->uuid(e->peer, info->peer_gpu, sizeof info->peer_gpu) != 0)
		snprintf(info->peer_gpu, sizeof info->peer_gpu, "unknown");
	info->peer_want = cache_peer_want(e->cache);
}

int engine_mem_info(struct baton_engine *e, uint64_t *free_bytes, uint64_t *total_bytes)
{
	return e->be->mem_info(e->dev, free_bytes, total_bytes);
}

struct baton_cache *engine_cache(struct baton_engine *e)
{
	return e->cache;
}

const struct baton_arena *engine_arena(struct baton_engine *e)
{
	return e->arena;
}

struct baton_dev *engine_dev(struct baton_engine *e)
{
	return e->dev;
}

const struct baton_backend *engine_backend(struct baton_engine *e)
{
	return e->be;
}
