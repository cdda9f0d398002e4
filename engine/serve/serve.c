/*
 * serve.c: the engine's serve loop (see serve.h): one model on one
 * device, serving GEN and control commands on its own nng REP socket.
 *
 * Threads:
 *   receivers (RECEIVERS of them, one nng context each) take requests.
 *     STATUS is answered at once from a snapshot. GEN waits its turn for
 *     the engine. RELEASE, REFILL, VRAM and PEER take the engine only if nobody
 *     holds it, and answer busy otherwise: a control command never waits
 *     behind, or disturbs, a running GEN.
 *   the program's main thread waits for signals and calls serve_tick (the
 *     idle-release timer).
 * The engine itself (arena, backend, cache) is used by one thread at a time,
 * under run_mu.
 *
 * With a broker (engine/serve/broker_link.h) the engine registers, sends
 * heartbeats and reports, and asks the broker before it maps memory on its
 * own initiative: at start (it opens cold) and when a GEN finds the cache
 * released, partial or shrunk. One GEN thread at a time asks (acq_mu); the
 * others then find the cache whole. The broker's commands come on the
 * control socket like anyone's, fenced by their epoch. A broker command
 * refused as busy makes the next GENs wait up to YIELD_S before starting,
 * so the broker's retry gets in between two requests: an engine under
 * steady load still gives way, never in the middle of a request. When the
 * broker is away, the engine serves on alone and maps what it needs.
 *
 * Layout, bottom to top: the state and its helpers (time, logging, the
 * STATUS snapshot), memory (make_full, ensure_memory), one function per
 * op (on_status, on_gen, on_control), the receivers that dispatch to
 * them, then open, tick and close. A new op is one on_* function and
 * one case in receiver(); GEN and COMPLETE share the work bracket
 * (work_begin, work_done, work_end).
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/serve/broker_link.h"
#include "engine/model/model.h"
#include "engine/serve/openai.h"
#include "engine/serve/sched.h"
#include "engine/serve/serve.h"
#include "proto/proto.h"

#define MIB (1024ull * 1024ull)
#define RECEIVERS 4
#define YIELD_S 0.1
/* A broker command refused busy stops admissions until it ran, or this long. */
#define DRAIN_S 2.0
/* serve_open could not listen or start its receivers (the log says why). */
#define BATON_ESERVE_START BATON_EIO

/* ---- state and helpers ---------------------------------------------------- */

/* The engine and everything about it that STATUS reports. */
static struct {
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
	uint64_t snap_epoch;        /* g.epoch when the snapshot was taken */
	uint64_t ceiling;           /* bytes the cache maps when whole */
	int active;                 /* GENs running or waiting */
	double yield_at;            /* a broker command was refused busy then */
	pthread_cond_t yield_cv;
	pthread_mutex_t acq_mu;     /* one GEN thread at a time asks the broker */
	struct broker_link *link;
	enum serve_broker_fail broker_fail;
	struct baton_generator *gen; /* NULL: the arena has no whole model (gen_error says why) */
	char gen_error[512];
	struct baton_sched *sched;  /* runs COMPLETE and the OpenAI API's requests (with gen) */
	struct oai_server *oai;     /* --http */
	char model_name[256];       /* the served model id */
	int released_all;           /* a release --all gave back the model too (under run_mu) */
	uint64_t model_bytes;       /* what the model held before it (under run_mu) */
	char listen_url[PATH_MAX];
	atomic_int stopping;        /* main sets it, receivers read it */
	uint32_t d_model;           /* set once at start */
	char peer_gpu[64];          /* set once at start; "" without --peer-device */
	struct baton_serve_config o;
	pthread_t th[RECEIVERS];
	struct proto_ctx *ctx[RECEIVERS];
	int nth;
} g = {
	.run_mu = PTHREAD_MUTEX_INITIALIZER,
	.st_mu = PTHREAD_MUTEX_INITIALIZER,
	.acq_mu = PTHREAD_MUTEX_INITIALIZER,
	.yield_cv = PTHREAD_COND_INITIALIZER,
	.state = "loading",
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "baton-engine[%s]: ", g.o.name ? g.o.name : "?");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* The state's name: a cache that maps nothing is "released", also a
 * fresh one that was never filled (cache.h calls that partial) and one
 * shrunk to nothing by a reserve (cache.h calls that ready: its target is
 * met, but it holds no device memory and a GEN must acquire first). */
static const char *state_name(const struct baton_engine_info *in)
{
	if ((in->cache.state == BATON_CACHE_PARTIAL || in->cache.state == BATON_CACHE_READY) &&
	    in->cache.mapped_bytes == 0)
		return "released";
	return cache_state_name(in->cache.state);
}

/* Refreshes the STATUS snapshot; the caller holds run_mu. */
static void snapshot(const char *state)
{
	struct baton_engine_info info;
	engine_info(g.e, &info);
	if (!state)
		state = state_name(&info);
	pthread_mutex_lock(&g.st_mu);
	g.info = info;
	g.state = state;
	g.snap_epoch = g.epoch;
	pthread_mutex_unlock(&g.st_mu);
}

static void set_state(const char *state)
{
	pthread_mutex_lock(&g.st_mu);
	g.state = state;
	pthread_mutex_unlock(&g.st_mu);
}

/* The broker link's view of the engine (any thread). */
static void link_state(void *arg, struct broker_link_state *st)
{
	(void)arg;
	uint64_t fr = 0, tot = 0;
	engine_mem_info(g.e, &fr, &tot);
	pthread_mutex_lock(&g.st_mu);
	snprintf(st->state, sizeof st->state, "%s", g.state);
	st->resident = (uint64_t)g.info.cache.items_resident * g.info.cache.slot_bytes;
	st->mapped = g.info.cache.mapped_bytes;
	st->free_bytes = fr;
	st->busy = g.active > 0;
	double idle = now_s() - g.last_active;
	if (g.sched) {
		struct sched_stats ss;
		sched_stats(g.sched, &ss);
		st->busy = st->busy || ss.running || ss.waiting;
		st->requests += ss.finished;
	}
	st->idle_ms = st->busy || idle < 0 ? 0 : (uint64_t)(idle * 1e3);
	st->epoch = g.snap_epoch;
	st->peer_mapped = g.info.cache.peer_mapped_bytes;
	st->requests += g.requests;
	bool moving = strcmp(g.state, "refilling") == 0 || strcmp(g.state, "resizing") == 0;
	pthread_mutex_unlock(&g.st_mu);
	if (moving) /* the copy's progress: the broker waits while it moves */
		cache_progress(engine_cache(g.e), &st->copied, &st->to_copy);
	if (g.o.use_peer)
		engine_peer_mem_info(g.e, &st->peer_free, &tot);
}

static void link_log(const char *line)
{
	logf_("broker: %s", line);
}

static void report(const char *reason, double ms, uint64_t bytes)
{
	if (g.link)
		broker_link_report(g.link, reason, ms, bytes);
}

/* Test hook: BATON_TEST_REFILL_DELAY_MS makes every refill this engine
 * starts on a grant or command wait first, so tests can kill it mid-way. */
static void test_refill_delay(void)
{
	const char *v = getenv("BATON_TEST_REFILL_DELAY_MS");
	long ms = v ? atol(v) : 0;
	if (ms > 0 && ms < 60000) {
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* Test hook: BATON_TEST_REFILL_STEP_MS makes each segment of a refill
 * take this much longer (a slow link), so that a refill outlasts the
 * broker's command timeout while its progress moves. */
static void refill_step(void *ctx, uint64_t done, uint64_t total)
{
	(void)ctx, (void)done, (void)total;
	const char *v = getenv("BATON_TEST_REFILL_STEP_MS");
	long ms = v ? atol(v) : 0;
	if (ms > 0 && ms < 60000) {
		struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* After a release --all: the dense weights and the KV pool back on the
 * device (caller holds run_mu). BATON_EDEVMEM leaves them released, to be
 * tried again. */
static int refill_model(void)
{
	if (!g.gen || !g.released_all)
		return 0;
	double t0 = now_s();
	int rc = model_refill(generator_model(g.gen));
	if (rc) {
		logf_("refill of the model's dense weights and KV cache failed: %s", baton_strerror(rc));
		return rc;
	}
	pthread_mutex_lock(&g.st_mu);
	g.released_all = 0;
	pthread_mutex_unlock(&g.st_mu);
	logf_("model refilled: %.1f MiB of dense weights and KV cache in %.3f ms",
	    (double)g.model_bytes / MIB, (now_s() - t0) * 1e3);
	return 0;
}

/* Makes the cache whole again (caller holds run_mu): back to the full
 * target and the configured reserve, then filled. With `limit` below what
 * is missing (a partial grant), it maps only that much: the reserve is set
 * so that the device keeps all but `limit` of its free memory. */
static int make_full(uint64_t limit, struct baton_cache_report *sum)
{
	struct baton_cache_report r;
	memset(sum, 0, sizeof *sum);
	struct baton_cache_stats st;
	cache_stats(engine_cache(g.e), &st);
	uint64_t missing = g.ceiling > st.mapped_bytes ? g.ceiling - st.mapped_bytes : 0;
	int64_t reserve = -1;
	if (limit < missing) {
		uint64_t fr = 0, tot = 0;
		engine_mem_info(g.e, &fr, &tot);
		reserve = fr > limit ? (int64_t)(fr - limit) : 0;
	}
	test_refill_delay();
	int rc = engine_vram(g.e, reserve, &r);
	if (rc)
		return rc;
	cache_report_add(sum, &r);
	cache_stats(engine_cache(g.e), &st);
	if (st.state != BATON_CACHE_READY) {
		rc = engine_refill(g.e, &r);
		if (rc)
			return rc;
		cache_report_add(sum, &r);
	}
	g.idle_released = 0;
	if (sum->bytes_copied) {
		pthread_mutex_lock(&g.st_mu);
		g.last_refill_bytes = sum->bytes_copied;
		g.last_refill_s = sum->total_s;
		pthread_mutex_unlock(&g.st_mu);
	}
	return 0;
}

/* Whole: ready, at the full target, nothing missing. */
static int cache_whole(void)
{
	struct baton_cache_stats st;
	cache_stats(engine_cache(g.e), &st);
	return st.state == BATON_CACHE_READY && st.target_bytes >= g.ceiling;
}

/* With a broker: asks before making the cache whole. Called with run_mu
 * held; returns with it held. 0 to go on; else the GEN fails with the
 * broker's refusal in err. */
static int ensure_memory(const char *why, char *err, size_t errlen)
{
	if (!g.link || (cache_whole() && !g.released_all))
		return 0;
	pthread_mutex_unlock(&g.run_mu);
	pthread_mutex_lock(&g.acq_mu);
	pthread_mutex_lock(&g.run_mu);
	if (cache_whole() && !g.released_all) {
		pthread_mutex_unlock(&g.acq_mu);
		return 0;
	}
	struct baton_cache_stats st;
	cache_stats(engine_cache(g.e), &st);
	uint64_t need = g.ceiling > st.mapped_bytes ? g.ceiling - st.mapped_bytes : 0;
	uint64_t model_need = g.released_all ? g.model_bytes : 0; /* after a release --all */
	need += model_need;
	pthread_mutex_unlock(&g.run_mu);
	uint64_t granted = 0, epoch = 0;
	double t0 = now_s();
	int rc = broker_link_acquire(g.link, need, &granted, &epoch, err, errlen);
	double wait_s = now_s() - t0;
	pthread_mutex_lock(&g.run_mu);
	if (rc && rc != BATON_ECONN) {
		pthread_mutex_unlock(&g.acq_mu);
		return rc;
	}
	char reason[160];
	if (rc == BATON_ECONN) {
		logf_("%s: the broker is away (%s): mapping on my own", why, err);
		granted = UINT64_MAX;
		snprintf(reason, sizeof reason, "refill (%s, broker away)", why);
	} else {
		pthread_mutex_lock(&g.st_mu);
		if (epoch > g.epoch)
			g.epoch = epoch; /* the grant's epoch: its state is news after it */
		pthread_mutex_unlock(&g.st_mu);
		snprintf(reason, sizeof reason, "refill (%s, granted %.1f MiB after %.3f ms)", why,
		    (double)granted / MIB, wait_s * 1e3);
	}
	set_state("refilling");
	struct baton_cache_report r;
	memset(&r, 0, sizeof r);
	/* the model first: the cache's share is what the grant leaves */
	int mrc = refill_model();
	if (mrc == 0)
		mrc = make_full(granted > model_need ? granted - model_need : 0, &r);
	snapshot(NULL);
	pthread_mutex_unlock(&g.acq_mu);
	if (mrc) {
		logf_("%s: refill failed: %s", why, baton_strerror(mrc));
		report("refill failed", r.total_s * 1e3, 0);
	} else {
		report(reason, r.total_s * 1e3, r.bytes_copied);
	}
	return 0; /* the GEN maps what it needs even when that failed */
}

/* A broker command was refused as busy: let it in before the next GEN. */
static void gen_yield(void)
{
	pthread_mutex_lock(&g.st_mu);
	for (;;) {
		double until = g.yield_at + YIELD_S, now = now_s();
		if (g.yield_at == 0 || now >= until || g.stopping)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + (until - now);
		ts.tv_sec = (time_t)t;
		ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
		pthread_cond_timedwait(&g.yield_cv, &g.st_mu, &ts);
	}
	pthread_mutex_unlock(&g.st_mu);
}


/* Requests the scheduler answered (COMPLETE and HTTP). */
static uint64_t sched_done(void)
{
	if (!g.sched)
		return 0;
	struct sched_stats st;
	sched_stats(g.sched, &st);
	return st.finished;
}

/* What a release gave back, from the snapshot (st_mu held): "all" (the
 * model too), "experts" (the expert cache maps nothing), or "none". */
static const char *level_name(void)
{
	if (g.released_all)
		return "all";
	return g.info.cache.mapped_bytes == 0 ? "experts" : "none";
}

static void reply(struct proto_ctx *ctx, const struct baton_msg *rep)
{
	int rc = proto_ctx_reply(ctx, rep);
	if (rc)
		logf_("reply to %s failed: %s", proto_op_name(rep->op), baton_strerror(rc));
}

static void reply_err(struct proto_ctx *ctx, const struct baton_msg *req, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void reply_err(struct proto_ctx *ctx, const struct baton_msg *req, int err, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	struct baton_msg rep;
	proto_reply_error(&rep, req->op, req->id, err, text);
	reply(ctx, &rep);
}

static void on_status(struct proto_ctx *ctx, const struct baton_msg *req)
{
	struct baton_msg rep;
	uint64_t dev_free = 0, dev_total = 0;
	engine_mem_info(g.e, &dev_free, &dev_total); /* live, not the snapshot */
	uint64_t peer_free = 0, peer_total = 0;
	if (g.o.use_peer)
		engine_peer_mem_info(g.e, &peer_free, &peer_total);
	proto_reply_init(&rep, req);
	pthread_mutex_lock(&g.st_mu);
	const struct baton_engine_info *in = &g.info;
	char device[32];
	snprintf(device, sizeof device, "%s:%d", in->backend, g.o.device);
	rep.name = g.o.name;
	rep.state = g.state;
	rep.resident = (uint64_t)in->cache.items_resident * in->cache.slot_bytes;
	rep.mapped = in->cache.mapped_bytes;
	rep.target = in->cache.target_bytes;
	rep.ceiling = (uint64_t)in->cache.slots_total * in->cache.slot_bytes;
	rep.epoch = g.epoch;
	rep.requests = g.requests + sched_done();
	rep.level = level_name();
	proto_set(&rep, PF_LEVEL);
	rep.hits = in->cache.hits;
	rep.misses = in->cache.misses;
	rep.last_refill_bytes = g.last_refill_bytes;
	rep.last_refill_s = g.last_refill_s;
	rep.device_name = device;
	rep.gpu = in->gpu;
	rep.free_bytes = dev_free;
	rep.total = dev_total;
	static const enum proto_field fs[] = { PF_NAME, PF_STATE, PF_RESIDENT, PF_MAPPED,
		PF_TARGET, PF_CEILING, PF_EPOCH, PF_REQUESTS, PF_HITS, PF_MISSES,
		PF_LAST_REFILL_BYTES, PF_LAST_REFILL_S, PF_DEVICE_NAME, PF_GPU, PF_FREE, PF_TOTAL };
	for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
		proto_set(&rep, fs[i]);
	if (g.o.use_peer) {
		rep.peer_gpu = g.peer_gpu;
		rep.peer_mapped = in->cache.peer_mapped_bytes;
		rep.peer_free = peer_free;
		proto_set(&rep, PF_PEER_GPU);
		proto_set(&rep, PF_PEER_MAPPED);
		proto_set(&rep, PF_PEER_FREE);
	}
	reply(ctx, &rep);
	pthread_mutex_unlock(&g.st_mu);
}

/* The bracket of a request that computes (GEN, COMPLETE). work_begin
 * counts it busy (the broker asks idle engines first), lets a refused
 * broker command in first, takes the engine and makes its memory whole; 0
 * when the caller holds the engine, else it has replied with the error.
 * work_done counts the request done (before the reply, so a STATUS after
 * the reply sees it); work_end, after the reply, refills the rest after an
 * idle release and gives the engine back. */
static int work_begin(struct proto_ctx *ctx, const struct baton_msg *req)
{
	pthread_mutex_lock(&g.st_mu);
	int first = g.active++ == 0;
	pthread_mutex_unlock(&g.st_mu);
	if (first && g.link)
		broker_link_poke(g.link); /* busy now: the broker asks idle engines first */
	gen_yield();
	pthread_mutex_lock(&g.run_mu);
	char aerr[512] = "";
	int arc = ensure_memory(proto_op_name(req->op), aerr, sizeof aerr);
	if (arc) {
		pthread_mutex_unlock(&g.run_mu);
		pthread_mutex_lock(&g.st_mu);
		int none = --g.active == 0;
		g.last_active = now_s();
		pthread_mutex_unlock(&g.st_mu);
		if (none)
			broker_link_poke(g.link);
		reply_err(ctx, req, arc, "%s: no device memory from the broker: %s", proto_op_name(req->op), aerr);
		return arc;
	}
	return 0;
}

static int work_done(int ok)
{
	pthread_mutex_lock(&g.st_mu);
	if (ok)
		g.requests++;
	g.last_active = now_s();
	int last = --g.active == 0;
	pthread_mutex_unlock(&g.st_mu);
	snapshot(NULL);
	if (last && g.link)
		broker_link_poke(g.link);
	return ok && !g.link && g.idle_released && g.info.cache.state != BATON_CACHE_READY;
}

static void work_end(int refill_rest)
{
	/* After an idle release the first request loaded what it needed; the
	 * rest comes back now, so the release stays invisible to clients. */
	if (refill_rest) {
		struct baton_cache_report r;
		set_state("refilling");
		int rc = engine_refill(g.e, &r);
		pthread_mutex_lock(&g.st_mu);
		if (rc == 0) {
			g.idle_released = 0;
			g.last_refill_bytes = r.bytes_copied;
			g.last_refill_s = r.total_s;
		}
		/* the idle time counts from the end of this work: a refill
		 * slower than the idle timeout must not be released at once */
		g.last_active = now_s();
		pthread_mutex_unlock(&g.st_mu);
		snapshot(NULL);
	}
	pthread_mutex_unlock(&g.run_mu);
}

static void on_gen(struct proto_ctx *ctx, const struct baton_msg *req)
{
	uint64_t n = (uint64_t)req->batch * g.d_model;
	if (req->steps == 0 || req->steps > BATON_GEN_MAX_STEPS || req->batch == 0 ||
	    req->batch > BATON_GEN_MAX_BATCH) {
		reply_err(ctx, req, BATON_ERANGE, "gen: steps must be 1..%u and batch 1..%u",
		    BATON_GEN_MAX_STEPS, BATON_GEN_MAX_BATCH);
		return;
	}
	if (proto_has(req, PF_INPUT) && req->input.len != n * sizeof(float)) {
		reply_err(ctx, req, BATON_ERANGE, "gen: input has %zu bytes, want batch*d_model*4 = %" PRIu64,
		    req->input.len, n * sizeof(float));
		return;
	}
	float *out = malloc(n * sizeof(float));
	if (!out) {
		reply_err(ctx, req, BATON_ENOMEM, "gen: no memory for the output");
		return;
	}
	if (work_begin(ctx, req) != 0) {
		free(out);
		return;
	}
	uint64_t sum = 0;
	struct baton_gen_timings t;
	int rc = engine_gen(g.e, req->steps, req->batch, req->seed,
	    proto_has(req, PF_INPUT) ? req->input.data : NULL, out, &sum, &t);
	int rest = work_done(rc == 0);
	if (rc) {
		if (rc == BATON_EUNSUPPORTED && g.info.compute_error)
			reply_err(ctx, req, rc, "gen: %s", g.info.compute_error);
		else
			reply_err(ctx, req, rc, "gen failed: %s", baton_strerror(rc));
	} else {
		struct baton_msg rep;
		proto_reply_init(&rep, req);
		rep.steps = req->steps;
		rep.batch = req->batch;
		rep.checksum = sum;
		rep.output.data = out;
		rep.output.len = n * sizeof(float);
		rep.route_ms = t.route_s * 1e3;
		rep.load_ms = t.load_s * 1e3;
		rep.compute_ms = t.compute_s * 1e3;
		rep.total_ms = t.total_s * 1e3;
		proto_set(&rep, PF_ROUTE_MS);
		proto_set(&rep, PF_LOAD_MS);
		proto_set(&rep, PF_COMPUTE_MS);
		proto_set(&rep, PF_TOTAL_MS);
		reply(ctx, &rep);
	}
	free(out);
	work_end(rest);
}

/* ---- the scheduler's hooks: the work bracket of continuous batching ---- */

/* Before the scheduler's first step after idle: busy now, a refused
 * broker command first, the engine taken, its memory made whole (the
 * broker asked), the model back after a release --all. 0 with run_mu
 * held by the scheduler's thread until sched_end. */
static int sched_begin(void *arg, char *err, size_t errlen)
{
	(void)arg;
	if (g.link)
		broker_link_poke(g.link); /* busy now: the broker asks idle engines first */
	gen_yield();
	pthread_mutex_lock(&g.run_mu);
	char aerr[512] = "";
	int rc = ensure_memory("complete", aerr, sizeof aerr);
	if (rc) {
		baton_errf(err, errlen, "no device memory from the broker: %s", aerr);
	} else if ((rc = refill_model()) != 0) {
		baton_errf(err, errlen, "no device memory for the model's dense weights and KV cache "
		    "(%s)", baton_strerror(rc));
	}
	if (rc) {
		snapshot(NULL);
		pthread_mutex_unlock(&g.run_mu);
		pthread_mutex_lock(&g.st_mu);
		g.last_active = now_s();
		pthread_mutex_unlock(&g.st_mu);
		if (g.link)
			broker_link_poke(g.link);
		return rc;
	}
	return 0;
}

/* The last sequence ended and nothing is admitted: the engine goes back
 * (after an idle release without a broker, the rest is refilled first). */
static void sched_end(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g.st_mu);
	g.last_active = now_s();
	pthread_mutex_unlock(&g.st_mu);
	snapshot(NULL);
	int rest = !g.link && g.idle_released && g.info.cache.state != BATON_CACHE_READY;
	work_end(rest);
	if (g.link)
		broker_link_poke(g.link);
}

/* No new sequence while a refused broker command waits to get in. */
static int sched_may_admit(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&g.st_mu);
	int ok = g.yield_at == 0 || now_s() >= g.yield_at + DRAIN_S || g.stopping;
	pthread_mutex_unlock(&g.st_mu);
	return ok;
}

/* COMPLETE: text in, text out through the scheduler (sched.h), like the
 * HTTP API's requests. The request is checked before it waits; the
 * receiver waits for its answer (its nng context answers one at a time). */
struct complete_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, rc;
	char err[512];
	struct baton_gen_result res;
};

static void complete_done(void *arg, int rc, const char *err, struct baton_gen_result *res)
{
	struct complete_wait *w = arg;
	pthread_mutex_lock(&w->mu);
	w->rc = rc;
	snprintf(w->err, sizeof w->err, "%s", err ? err : "");
	if (res)
		w->res = *res;
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static void on_complete(struct proto_ctx *ctx, const struct baton_msg *req)
{
	if (!g.gen) {
		reply_err(ctx, req, BATON_EUNSUPPORTED, "complete: %s", g.gen_error);
		return;
	}
	/* the HTTP API's parser (openai.h); unseeded, the sampler's default
	 * seed: a COMPLETE repeats (the HTTP API draws a random one) */
	struct oai_request c;
	struct oai_error oe;
	if (oai_parse(OAI_AUTO, g.model_name, req->body, strlen(req->body),
	        baton_sample_defaults().seed, &c, &oe) != 0) {
		reply_err(ctx, req, oai_error_code(&oe), "complete: %s", oe.message);
		return;
	}
	if (c.stream) {
		oai_request_free(&c);
		reply_err(ctx, req, BATON_EUNSUPPORTED, "complete: stream: the complete op answers whole "
		    "(stream over the OpenAI API, --http)");
		return;
	}
	struct complete_wait w = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	struct sched_cb cb = { .on_done = complete_done, .arg = &w };
	double t0 = now_s();
	int rc = sched_submit(g.sched, &c.q, &cb, NULL);
	if (rc) {
		oai_request_free(&c);
		reply_err(ctx, req, rc, "complete: %s", rc == BATON_EBUSY ?
		    "the engine's queue of waiting requests is full; try again" : "the engine is shutting down");
		return;
	}
	pthread_mutex_lock(&w.mu);
	while (!w.done)
		pthread_cond_wait(&w.cv, &w.mu);
	pthread_mutex_unlock(&w.mu);
	struct baton_gen_result *res = &w.res;
	if (w.rc) {
		reply_err(ctx, req, w.rc, "complete: %s", w.err);
	} else {
		uint8_t *ids = malloc((size_t)res->n_tokens * 4 + 1);
		if (!ids) {
			reply_err(ctx, req, BATON_ENOMEM, "complete: no memory for the reply");
		} else {
			for (uint32_t i = 0; i < res->n_tokens; i++)
				for (int b = 0; b < 4; b++)
					ids[i * 4 + b] = (uint8_t)(res->tokens[i] >> (8 * b));
			struct baton_msg rep;
			proto_reply_init(&rep, req);
			rep.text = res->text;
			rep.tokens.data = ids;
			rep.tokens.len = (size_t)res->n_tokens * 4;
			rep.prompt_tokens = res->n_prompt;
			rep.completion_tokens = res->n_tokens;
			rep.finish_reason = res->finish;
			rep.prefill_ms = res->prefill_s * 1e3;
			rep.decode_ms = res->decode_s * 1e3;
			rep.total_ms = (now_s() - t0) * 1e3;
			proto_set(&rep, PF_PREFILL_MS);
			proto_set(&rep, PF_DECODE_MS);
			proto_set(&rep, PF_TOTAL_MS);
			reply(ctx, &rep);
			free(ids);
		}
	}
	generator_result_free(res);
	oai_request_free(&c);
}

/* The OpenAI API's GET /health adds the engine's state. */
static void health_fields(void *arg, json_t *obj)
{
	(void)arg;
	pthread_mutex_lock(&g.st_mu);
	json_object_set_new(obj, "state", json_string(g.state));
	json_object_set_new(obj, "level", json_string(level_name()));
	if (g.info.backend_warning)
		json_object_set_new(obj, "warning", json_string(g.info.backend_warning));
	pthread_mutex_unlock(&g.st_mu);
}

/* RELEASE, REFILL, VRAM, PEER: fenced by epoch, refused while the engine works. */
static void on_control(struct proto_ctx *ctx, const struct baton_msg *req)
{
	const char *op = proto_op_name(req->op);
	if (proto_has(req, PF_NAME) && strcmp(req->name, g.o.name) != 0) {
		reply_err(ctx, req, BATON_ENOTFOUND, "%s: this engine is '%s', not '%s'", op,
		    g.o.name, req->name);
		return;
	}
	if ((req->op == PROTO_OP_RELEASE || req->op == PROTO_OP_REFILL) && !g.o.release) {
		reply_err(ctx, req, BATON_EUNSUPPORTED,
		    "%s: start the engine with --expert-cache-release to allow it", op);
		return;
	}
	int all = req->op == PROTO_OP_RELEASE && proto_has(req, PF_ALL) && req->all;
	if (all && !g.gen) {
		reply_err(ctx, req, BATON_EUNSUPPORTED, "release --all: this engine holds no whole model "
		    "(its arena has experts only): a plain release gives back all it can");
		return;
	}
	if (req->op == PROTO_OP_VRAM && !g.o.elastic) {
		reply_err(ctx, req, BATON_EUNSUPPORTED, "vram: start the engine with --vram-elastic to allow it");
		return;
	}
	if (req->op == PROTO_OP_VRAM && req->reserve_mib != PROTO_RESERVE_FULL &&
	    req->reserve_mib > (UINT64_C(1) << 24)) {
		reply_err(ctx, req, BATON_ERANGE, "vram: reserve_mib %" PRIu64 " is out of range",
		    req->reserve_mib);
		return;
	}
	if (req->op == PROTO_OP_PEER) {
		if (!g.o.use_peer) {
			reply_err(ctx, req, BATON_EUNSUPPORTED,
			    "peer: this engine has no peer device (start it with --peer-device N)");
			return;
		}
		if (req->peer_mib > (UINT64_C(1) << 24)) {
			reply_err(ctx, req, BATON_ERANGE, "peer: peer_mib %" PRIu64 " is out of range",
			    req->peer_mib);
			return;
		}
		if (proto_has(req, PF_PEER_GPU) && strcmp(req->peer_gpu, g.peer_gpu) != 0) {
			reply_err(ctx, req, BATON_EINVAL, "peer: this engine's peer device is %s, not %s",
			    g.peer_gpu, req->peer_gpu);
			return;
		}
	}
	if (pthread_mutex_trylock(&g.run_mu) != 0) {
		if (proto_has(req, PF_EPOCH)) {
			/* the broker asks again in a moment: hold the next GEN
			 * back, admit no new sequence until it ran (DRAIN_S) */
			pthread_mutex_lock(&g.st_mu);
			g.yield_at = now_s();
			pthread_mutex_unlock(&g.st_mu);
		}
		reply_err(ctx, req, BATON_EBUSY, "%s: the engine is serving a request; try again", op);
		return;
	}
	pthread_mutex_lock(&g.st_mu);
	if (proto_has(req, PF_EPOCH)) {
		if (req->epoch < g.epoch) {
			uint64_t cur = g.epoch;
			pthread_mutex_unlock(&g.st_mu);
			pthread_mutex_unlock(&g.run_mu);
			reply_err(ctx, req, BATON_ESTALE, "%s: epoch %" PRIu64 " is older than %" PRIu64,
			    op, req->epoch, cur);
			return;
		}
		g.epoch = req->epoch;
	}
	pthread_mutex_unlock(&g.st_mu);

	struct baton_cache_report r;
	int rc;
	if (req->op == PROTO_OP_RELEASE) {
		set_state("releasing");
		rc = engine_release(g.e, &r);
		g.idle_released = 0;
		if (rc == 0 && all && !g.released_all) {
			/* the dense weights and the KV pool too: only the device
			 * context stays (queued requests wait; the next one
			 * refills, asking the broker first) */
			struct baton_model *m = generator_model(g.gen);
			uint64_t held = model_device_bytes(m);
			double t0 = now_s();
			rc = model_release(m);
			if (rc == 0) {
				pthread_mutex_lock(&g.st_mu);
				g.released_all = 1;
				g.model_bytes = held;
				pthread_mutex_unlock(&g.st_mu);
				/* and the synthetic GEN path's routers (GEN
				 * brings them back if it is ever asked) */
				r.bytes_freed += held + engine_release_gen(g.e);
				r.total_s += now_s() - t0;
			}
		}
	} else if (req->op == PROTO_OP_REFILL) {
		/* whole again: the model (after a release --all), back to the
		 * full target, then filled */
		set_state("refilling");
		rc = refill_model();
		if (rc == 0)
			rc = make_full(UINT64_MAX, &r);
	} else if (req->op == PROTO_OP_PEER) {
		/* "resizing" while it maps or unmaps peer segments: a broker
		 * that probes a slow lend or revoke with STATUS sees work in
		 * progress, not a lost command (the own tier does not change) */
		set_state("resizing");
		rc = engine_peer(g.e, req->peer_mib * MIB, &r);
	} else {
		int64_t reserve = req->reserve_mib == PROTO_RESERVE_FULL ? -1 :
		    (int64_t)(req->reserve_mib * MIB);
		set_state("resizing");
		rc = engine_vram(g.e, reserve, &r);
	}
	if (rc == 0 && r.bytes_copied) {
		pthread_mutex_lock(&g.st_mu);
		g.last_refill_bytes = r.bytes_copied;
		g.last_refill_s = r.total_s;
		pthread_mutex_unlock(&g.st_mu);
	}
	snapshot(NULL);
	pthread_mutex_lock(&g.st_mu);
	g.yield_at = 0;
	pthread_cond_broadcast(&g.yield_cv);
	uint64_t peer_mapped = g.info.cache.peer_mapped_bytes;
	pthread_mutex_unlock(&g.st_mu);
	pthread_mutex_unlock(&g.run_mu);
	if (rc == BATON_ESTATE && req->op == PROTO_OP_PEER) {
		reply_err(ctx, req, rc, "peer: the cache is released; a released engine borrows "
		    "no memory (refill first)");
		return;
	}
	if (rc) {
		reply_err(ctx, req, rc, "%s failed: %s", op, baton_strerror(rc));
		return;
	}
	if (req->op == PROTO_OP_PEER)
		logf_("peer: %.1f MiB on %s asked, %.1f MiB mapped, %" PRIu64 " bytes copied, %"
		    PRIu64 " freed, %.3f ms", (double)req->peer_mib,
		    g.peer_gpu, (double)peer_mapped / MIB, r.bytes_copied,
		    r.peer_bytes_freed, r.total_s * 1e3);
	else
		logf_("%s%s: %s, %.3f ms, %" PRIu64 " bytes copied, %" PRIu64 " freed", op,
		    all ? " --all" : "", cache_state_name(r.state), r.total_s * 1e3, r.bytes_copied,
		    r.bytes_freed);
	uint64_t fr = 0, tot = 0;
	engine_mem_info(g.e, &fr, &tot);
	struct baton_msg rep;
	proto_reply_init(&rep, req);
	pthread_mutex_lock(&g.st_mu);
	rep.state = g.state;
	rep.resident = (uint64_t)g.info.cache.items_resident * g.info.cache.slot_bytes;
	rep.epoch = g.snap_epoch;
	rep.mapped = g.info.cache.mapped_bytes;
	rep.level = level_name();
	pthread_mutex_unlock(&g.st_mu);
	proto_set(&rep, PF_LEVEL);
	rep.free_bytes = fr;
	proto_set(&rep, PF_MAPPED);
	proto_set(&rep, PF_FREE);
	if (g.o.use_peer) {
		uint64_t pf = 0, pt = 0;
		engine_peer_mem_info(g.e, &pf, &pt);
		rep.peer_mapped = peer_mapped;
		rep.peer_free = pf;
		proto_set(&rep, PF_PEER_MAPPED);
		proto_set(&rep, PF_PEER_FREE);
	}
	rep.ms = r.total_s * 1e3;
	rep.bytes = req->op == PROTO_OP_RELEASE || (req->op == PROTO_OP_VRAM && r.bytes_copied == 0) ?
	    r.bytes_freed : r.bytes_copied;
	if (req->op == PROTO_OP_PEER) /* lend: copied into the peer tier; revoke: freed there */
		rep.bytes = req->peer_mib ? r.bytes_copied : r.peer_bytes_freed;
	reply(ctx, &rep);
	/* The broker hears the new state from the reply when it sent the
	 * command; anyone else's command is news to it. */
	if (!proto_has(req, PF_EPOCH))
		report(op, r.total_s * 1e3, rep.bytes);
}

static void *receiver(void *arg)
{
	struct proto_ctx *ctx = arg;
	while (!g.stopping) {
		struct baton_msg req;
		struct proto_diag d;
		int rc = proto_ctx_recv(ctx, &req, 500, &d);
		if (rc == BATON_ECLOSED)
			break;
		if (rc == BATON_ETIMEDOUT)
			continue;
		if (rc) {
			/* the transport already answered with the error */
			logf_("bad request: %s: %s", baton_strerror(rc), d.text);
			continue;
		}
		if (g.stopping) {
			reply_err(ctx, &req, BATON_ECLOSED, "the engine is shutting down");
			proto_msg_free(&req);
			break;
		}
		switch (req.op) {
		case PROTO_OP_STATUS: on_status(ctx, &req); break;
		case PROTO_OP_GEN: on_gen(ctx, &req); break;
		case PROTO_OP_COMPLETE: on_complete(ctx, &req); break;
		case PROTO_OP_RELEASE:
		case PROTO_OP_REFILL:
		case PROTO_OP_VRAM:
		case PROTO_OP_PEER: on_control(ctx, &req); break;
		default:
			reply_err(ctx, &req, BATON_EUNKNOWNOP, "an engine does not serve '%s'",
			    proto_op_name(req.op));
		}
		proto_msg_free(&req);
	}
	return NULL;
}

/* Releases the cache when nobody asked for anything for idle_s seconds. */
void serve_tick(void)
{
	if (g.o.idle_s <= 0)
		return;
	pthread_mutex_lock(&g.st_mu);
	double idle = now_s() - g.last_active;
	pthread_mutex_unlock(&g.st_mu);
	if (idle < g.o.idle_s || pthread_mutex_trylock(&g.run_mu) != 0)
		return;
	if (g.info.cache.state == BATON_CACHE_READY || g.info.cache.state == BATON_CACHE_PARTIAL) {
		struct baton_cache_report r;
		set_state("releasing");
		int rc = engine_release(g.e, &r);
		if (rc == 0) {
			g.idle_released = 1;
			logf_("idle for %.1f s: released %" PRIu64 " bytes in %.3f ms", idle,
			    r.bytes_freed, r.total_s * 1e3);
		} else {
			logf_("idle release failed: %s", baton_strerror(rc));
		}
		snapshot(NULL);
		if (rc == 0)
			report("idle release (engine)", r.total_s * 1e3, r.bytes_freed);
	}
	pthread_mutex_unlock(&g.run_mu);
}

/* ---- open and close ------------------------------------------------------- */

/* The text side, in its order (openai.h): no request comes in, the
 * scheduler ends those in flight, then memory goes. */
static void close_text(void)
{
	oai_server_stop(g.oai);
	sched_close(g.sched);
	g.sched = NULL;
	oai_server_close(g.oai);
	g.oai = NULL;
	generator_close(g.gen);
	g.gen = NULL;
}

/* With a broker the cache is sized for the whole model (not for what
 * happens to be free now: the broker makes room); engine.c computes it. */
int serve_open(const struct baton_serve_config *conf)
{
	g.o = *conf;
	const char *listen = g.o.listen;
	struct baton_engine_config cfg = {
		.name = g.o.name,
		.arena_path = g.o.arena,
		.backend = g.o.backend,
		.device = g.o.device,
		.cache_bytes = g.o.cache_mib * MIB,
		.whole_cache = g.o.broker != NULL,
		.segment_bytes = g.o.segment_mib * MIB,
		.reserve_bytes = g.o.reserve_mib * MIB,
		.host_capacity = g.o.host_mib * MIB,
		.verify = g.o.verify || (getenv("BATON_VERIFY_REFILL") && atoi(getenv("BATON_VERIFY_REFILL"))),
		.warm = g.o.broker ? 0 : 1,
		.use_peer = g.o.use_peer,
		.peer_device = g.o.peer_device,
	};
	char err[512] = "";
	double t0 = now_s();
	int rc = engine_open(&cfg, &g.e, err, sizeof err);
	if (rc) {
		logf_("%s", err);
		return rc;
	}
	snapshot(NULL);
	if (getenv("BATON_TEST_REFILL_STEP_MS"))
		cache_set_progress(engine_cache(g.e), refill_step, NULL);
	g.d_model = g.info.d_model;
	/* A whole model (arena v2 with config.json) also speaks text. */
	struct baton_model_opts mo = { .max_ctx = g.o.ctx, .kv_blocks = g.o.kv_blocks };
	rc = generator_open(g.e, &mo, &g.gen, g.gen_error, sizeof g.gen_error);
	if (rc == 0) {
		struct baton_model *m = generator_model(g.gen);
		logf_("text generation: %s model, chat template %s, KV pool %u blocks of %u positions "
		    "(%.1f MiB)", generator_arch(g.gen),
		    generator_chat_family(g.gen) ? generator_chat_family(g.gen) : "none",
		    model_kv_blocks_total(m), BATON_KV_BLOCK, (double)model_kv_bytes(m) / MIB);
	} else if (rc != BATON_EUNSUPPORTED || !strstr(g.gen_error, "experts only")) {
		logf_("warning: no text generation: %s", g.gen_error);
	}
	/* The served model id: --served-model-name, else the arena's file
	 * name without .arena (what the broker registers as the model). */
	if (g.o.served_model) {
		snprintf(g.model_name, sizeof g.model_name, "%s", g.o.served_model);
	} else {
		const char *base = strrchr(g.o.arena, '/');
		snprintf(g.model_name, sizeof g.model_name, "%s", base ? base + 1 : g.o.arena);
		char *dot = strstr(g.model_name, ".arena");
		if (dot && dot[6] == 0)
			*dot = 0;
	}
	if (g.gen) {
		struct sched_opts so = { .max_seqs = g.o.max_seqs, .max_queue = g.o.max_queue };
		struct sched_hooks sh = { .begin = sched_begin, .end = sched_end, .may_admit = sched_may_admit };
		if ((rc = sched_open(g.gen, &so, &sh, &g.sched)) != 0) {
			logf_("cannot start the scheduler: %s", baton_strerror(rc));
			close_text();
			engine_close(g.e);
			g.e = NULL;
			return BATON_ESERVE_START;
		}
	}
	if (g.o.http) {
		char herr[512] = "";
		struct oai_server_opts oo = { .addr = g.o.http, .token = g.o.http_token, .model = g.model_name,
			.sched = g.sched, .health = health_fields };
		rc = g.sched ? oai_server_open(&oo, &g.oai, herr, sizeof herr) : BATON_EUNSUPPORTED;
		if (rc) {
			logf_("--http %s: %s", g.o.http, g.sched ? herr : g.gen_error);
			close_text();
			engine_close(g.e);
			g.e = NULL;
			return rc == BATON_EPERM || rc == BATON_EINVAL || rc == BATON_EUNSUPPORTED ? BATON_EINVAL :
			    BATON_ESERVE_START;
		}
		logf_("OpenAI API on %s, model '%s'", oai_server_url(g.oai), g.model_name);
	}
	snprintf(g.peer_gpu, sizeof g.peer_gpu, "%s", g.info.peer_gpu);
	g.ceiling = g.info.cache.target_bytes;
	logf_("%s on %s (%s): %u layers x %u experts, cache %.1f MiB %s, ready in %.3f s", g.o.arena,
	    g.info.backend, g.info.gpu, g.info.layers, g.info.experts,
	    (double)g.info.cache.mapped_bytes / MIB, cache_state_name(g.info.cache.state), now_s() - t0);
	if (g.info.compute_error)
		logf_("warning: %s; GEN will be refused", g.info.compute_error);
	if (g.info.backend_warning)
		logf_("WARNING: %s", g.info.backend_warning);
	if (g.o.use_peer)
		logf_("peer tier on %s (device %d): empty until lent; it could use %.1f MiB",
		    g.peer_gpu, g.o.peer_device, (double)g.info.peer_want / MIB);

	if (proto_ipc_dir(listen) != 0)
		logf_("cannot create the directory of %s: %s", listen, strerror(errno));
	if ((rc = proto_server_open(&g.srv, listen, NULL)) != 0) {
		logf_("cannot listen on %s: %s", listen, baton_strerror(rc));
		close_text();
		engine_close(g.e);
		g.e = NULL;
		return BATON_ESERVE_START;
	}
	g.nth = 0;
	for (int i = 0; i < RECEIVERS; i++) {
		if (proto_ctx_open(g.srv, &g.ctx[i]) != 0)
			break;
		if (pthread_create(&g.th[i], NULL, receiver, g.ctx[i]) != 0) {
			proto_ctx_close(g.ctx[i]);
			g.ctx[i] = NULL;
			break;
		}
		g.nth++;
	}
	if (g.nth == 0) {
		logf_("cannot start the receivers");
		proto_server_close(g.srv);
		g.srv = NULL;
		close_text();
		engine_close(g.e);
		g.e = NULL;
		return BATON_ESERVE_START;
	}
	pthread_mutex_lock(&g.st_mu); /* the receivers run already */
	g.last_active = now_s();
	pthread_mutex_unlock(&g.st_mu);
	logf_("listening on %s", listen);
	if (g.o.broker && g.o.idle_s > 0)
		logf_("warning: --cache-release-idle under a broker: the engine releases on its own "
		    "timer too; idle release is the broker's rule (idle_release_s)");
	if (g.o.broker) {
		/* Register, then ask for the whole cache; a refusal leaves it
		 * cold until the first request. No broker in 2 s: warm alone. */
		struct broker_link_params lp = {
			.url = g.o.broker,
			.name = g.o.name,
			.gpu = g.info.gpu,
			.model = g.model_name,
			.http = serve_http_url(),
			.ctl = proto_server_url(g.srv),
			.pid = (uint32_t)getpid(),
			.device = (uint32_t)g.o.device,
			.floor = g.info.cache.segment_bytes,
			.ceiling = g.ceiling,
			.capacity = g.info.dev_total,
			.priority = g.o.priority,
			.peer_gpu = g.peer_gpu,
			.peer_want = g.info.peer_want,
			.state_fn = link_state,
			.log = link_log,
		};
		if ((rc = broker_link_open(&lp, &g.link)) != 0)
			logf_("cannot start the broker link to %s: %s", g.o.broker, baton_strerror(rc));
		/* A refusal (the name is taken) always ends the start: serving
		 * outside the broker's control under a name it gives to another
		 * would fight that one for the device. No answer ends it unless
		 * the user asked to go on alone (--broker-optional): a mistyped
		 * URL must not pass for a broker that is away. */
		double wait_s = g.o.broker_wait_s > 0 ? g.o.broker_wait_s : g.o.broker_optional ? 2 : 10;
		char lerr[512] = "";
		int lrc = g.link ? broker_link_wait_start(g.link, (int)(wait_s * 1e3), lerr, sizeof lerr) :
		    BATON_ECONN;
		if (lrc && g.link && (lrc != BATON_ECONN && lrc != BATON_ETIMEDOUT)) {
			logf_("error: the broker refused to register this engine: %s", lerr);
			g.broker_fail = SERVE_BROKER_REFUSED;
			serve_close();
			return lrc;
		}
		if (lrc && !g.o.broker_optional) {
			logf_("error: %s (is --broker right? --broker-optional serves without one)",
			    g.link ? lerr : "no broker link");
			g.broker_fail = SERVE_BROKER_ABSENT;
			serve_close();
			return lrc == BATON_ETIMEDOUT ? BATON_ETIMEDOUT : BATON_ECONN;
		}
		if (lrc)
			logf_("no broker at %s yet: warming alone (it will hear from me when it is up)",
			    g.o.broker);
		char aerr[512] = "";
		pthread_mutex_lock(&g.run_mu);
		rc = ensure_memory("startup", aerr, sizeof aerr);
		if (rc)
			logf_("startup: the broker gave no memory (%s): cold until the first request", aerr);
		/* The receivers already run: read the snapshot under its lock. */
		pthread_mutex_lock(&g.st_mu);
		double mapped_mib = (double)g.info.cache.mapped_bytes / MIB;
		const char *state = g.state;
		pthread_mutex_unlock(&g.st_mu);
		pthread_mutex_unlock(&g.run_mu);
		logf_("cache %.1f of %.1f MiB, %s", mapped_mib, (double)g.ceiling / MIB, state);
	}
	return 0;
}

enum serve_broker_fail serve_broker_fail(void)
{
	return g.broker_fail;
}

const char *serve_url(void)
{
	return g.srv ? proto_server_url(g.srv) : "";
}

const char *serve_warning(void)
{
	return g.e && g.info.backend_warning ? g.info.backend_warning : "";
}

const char *serve_http_url(void)
{
	return g.oai ? oai_server_url(g.oai) : "";
}

void serve_close(void)
{
	logf_("shutting down");
	g.stopping = 1;
	/* requests in flight end first (a receiver waiting on one hears
	 * ECLOSED), then the receivers stop */
	oai_server_stop(g.oai);
	sched_stop(g.sched);
	proto_server_shutdown(g.srv);
	for (int i = 0; i < g.nth; i++)
		pthread_join(g.th[i], NULL);
	for (int i = 0; i < g.nth; i++)
		proto_ctx_close(g.ctx[i]);
	proto_server_close(g.srv);
	/* Nobody uses the engine now: give the device memory back, then tell
	 * the broker (it counts the memory free from then on). */
	struct baton_cache_report r;
	close_text();
	engine_release(g.e, &r);
	broker_link_close(g.link, true);
	g.link = NULL;
	engine_close(g.e);
	g.e = NULL;
	logf_("stopped");
}
