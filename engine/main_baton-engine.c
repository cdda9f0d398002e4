/*
 * baton-engine: one model on one device, serving GEN and control commands
 * on its own nng REP socket.
 *
 * Threads:
 *   receivers (RECEIVERS of them, one nng context each) take requests.
 *     STATUS is answered at once from a snapshot. GEN waits its turn for
 *     the engine. RELEASE, REFILL and VRAM take the engine only if nobody
 *     holds it, and answer busy otherwise: a control command never waits
 *     behind, or disturbs, a running GEN.
 *   the main thread waits for signals and runs the idle-release timer.
 * The engine itself (arena, backend, cache) is used by one thread at a time,
 * under run_mu.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/engine.h"
#include "proto/proto.h"

#define MIB (1024ull * 1024ull)
#define RECEIVERS 4

static const char usage[] =
    "usage: baton-engine --name NAME --shared-expert-arena PATH [options]\n"
    "\n"
    "  --name NAME                 engine name (letters, digits, '-', '_', '.')\n"
    "  --shared-expert-arena PATH  the model's arena (made by baton-arena create)\n"
    "  --listen URL                control socket (default ipc:///run/baton/engine-NAME.sock)\n"
    "  --backend host|cuda|auto    device backend (default auto: cuda when a GPU is present)\n"
    "  --device N                  device index (default 0)\n"
    "  --cache-mib N|auto          expert cache size (default auto: the model, or what fits)\n"
    "  --vram-segment-mib N        cache segment size (default 256, or the model when smaller)\n"
    "  --expert-cache-release      allow RELEASE and REFILL\n"
    "  --cache-release-idle SECS   release after SECS idle (implies --expert-cache-release)\n"
    "  --vram-elastic              allow VRAM (resize with a reserve)\n"
    "  --vram-reserve-mib N        device memory to leave free when growing (default 0)\n"
    "  --verify-refill             read back every refilled slot and compare checksums\n"
    "  --host-device-mib N         capacity of the host backend's device\n"
    "  --broker URL                register with a broker (not in this build)\n"
    "  --help\n";

struct opts {
	const char *name, *arena, *listen, *backend;
	int device;
	uint64_t cache_mib, segment_mib, reserve_mib, host_mib;
	int release, elastic, verify;
	double idle_s;
};

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
	volatile sig_atomic_t stopping;
	uint32_t d_model;           /* set once at start */
	struct opts o;
} g = {
	.run_mu = PTHREAD_MUTEX_INITIALIZER,
	.st_mu = PTHREAD_MUTEX_INITIALIZER,
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

static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("baton-engine: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\n(see baton-engine --help)\n", stderr);
	va_end(ap);
	exit(2);
}

static uint64_t parse_uint(const char *flag, const char *v, uint64_t max)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || v[0] == '+' || x > max)
		usage_error("%s wants an integer from 0 to %" PRIu64 ", got '%s'", flag, max, v);
	return x;
}

static int valid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		    c == '-' || c == '_' || c == '.'))
			return 0;
	}
	return 1;
}

static void parse_args(int argc, char **argv, struct opts *o)
{
	enum { O_NAME = 1, O_ARENA, O_LISTEN, O_BACKEND, O_DEVICE, O_CACHE, O_SEG, O_RELEASE,
	       O_IDLE, O_ELASTIC, O_RESERVE, O_VERIFY, O_HOSTMIB, O_BROKER, O_HELP };
	static const struct option lo[] = {
		{ "name", required_argument, 0, O_NAME },
		{ "shared-expert-arena", required_argument, 0, O_ARENA },
		{ "listen", required_argument, 0, O_LISTEN },
		{ "backend", required_argument, 0, O_BACKEND },
		{ "device", required_argument, 0, O_DEVICE },
		{ "cache-mib", required_argument, 0, O_CACHE },
		{ "vram-segment-mib", required_argument, 0, O_SEG },
		{ "expert-cache-release", no_argument, 0, O_RELEASE },
		{ "cache-release-idle", required_argument, 0, O_IDLE },
		{ "vram-elastic", no_argument, 0, O_ELASTIC },
		{ "vram-reserve-mib", required_argument, 0, O_RESERVE },
		{ "verify-refill", no_argument, 0, O_VERIFY },
		{ "host-device-mib", required_argument, 0, O_HOSTMIB },
		{ "broker", required_argument, 0, O_BROKER },
		{ "help", no_argument, 0, O_HELP },
		{ 0, 0, 0, 0 },
	};
	memset(o, 0, sizeof *o);
	o->backend = "auto";
	opterr = 0;
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case O_NAME: o->name = optarg; break;
		case O_ARENA: o->arena = optarg; break;
		case O_LISTEN: o->listen = optarg; break;
		case O_BACKEND:
			if (strcmp(optarg, "host") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"))
				usage_error("--backend wants host, cuda or auto, got '%s'", optarg);
			o->backend = optarg;
			break;
		case O_DEVICE: o->device = (int)parse_uint("--device", optarg, 255); break;
		case O_CACHE:
			o->cache_mib = strcmp(optarg, "auto") == 0 ? 0 :
			    parse_uint("--cache-mib", optarg, 16u << 20);
			if (strcmp(optarg, "auto") && o->cache_mib == 0)
				usage_error("--cache-mib wants a positive size or auto, got '%s'", optarg);
			break;
		case O_SEG:
			o->segment_mib = parse_uint("--vram-segment-mib", optarg, 65536);
			if (o->segment_mib == 0)
				usage_error("--vram-segment-mib must be positive");
			break;
		case O_RELEASE: o->release = 1; break;
		case O_IDLE: {
			char *end;
			errno = 0;
			double s = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(s > 0) || s > 1e7)
				usage_error("--cache-release-idle wants seconds > 0, got '%s'", optarg);
			o->idle_s = s;
			o->release = 1;
			break;
		}
		case O_ELASTIC: o->elastic = 1; break;
		case O_RESERVE: o->reserve_mib = parse_uint("--vram-reserve-mib", optarg, 16u << 20); break;
		case O_VERIFY: o->verify = 1; break;
		case O_HOSTMIB:
			o->host_mib = parse_uint("--host-device-mib", optarg, 16u << 20);
			if (o->host_mib == 0)
				usage_error("--host-device-mib must be positive");
			break;
		case O_BROKER:
			usage_error("--broker: registering with a broker is not in this build yet");
		case O_HELP:
			fputs(usage, stdout);
			exit(0);
		case ':':
			usage_error("%s needs a value", argv[optind - 1]);
		default:
			usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
	if (!o->name)
		usage_error("--name is required");
	if (!valid_name(o->name))
		usage_error("--name '%s': use 1 to 64 letters, digits, '-', '_' or '.'", o->name);
	if (!o->arena)
		usage_error("--shared-expert-arena is required");
}

/* Refreshes the STATUS snapshot; the caller holds run_mu. */
static void snapshot(const char *state)
{
	struct baton_engine_info info;
	engine_info(g.e, &info);
	if (!state)
		state = cache_state_name(info.cache.state);
	pthread_mutex_lock(&g.st_mu);
	g.info = info;
	g.state = state;
	pthread_mutex_unlock(&g.st_mu);
}

static void set_state(const char *state)
{
	pthread_mutex_lock(&g.st_mu);
	g.state = state;
	pthread_mutex_unlock(&g.st_mu);
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
	rep.requests = g.requests;
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
	reply(ctx, &rep);
	pthread_mutex_unlock(&g.st_mu);
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
	pthread_mutex_lock(&g.run_mu);
	uint64_t sum = 0;
	struct baton_gen_timings t;
	int rc = engine_gen(g.e, req->steps, req->batch, req->seed,
	    proto_has(req, PF_INPUT) ? req->input.data : NULL, out, &sum, &t);
	pthread_mutex_lock(&g.st_mu);
	if (rc == 0)
		g.requests++;
	g.last_active = now_s();
	pthread_mutex_unlock(&g.st_mu);
	snapshot(NULL);
	int refill_rest = rc == 0 && g.idle_released && g.info.cache.state != BATON_CACHE_READY;
	if (rc) {
		pthread_mutex_unlock(&g.run_mu);
		if (rc == BATON_EUNSUPPORTED && g.info.compute_error)
			reply_err(ctx, req, rc, "gen: %s", g.info.compute_error);
		else
			reply_err(ctx, req, rc, "gen failed: %s", baton_strerror(rc));
		free(out);
		return;
	}
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
	free(out);
	/* After an idle release the first request loaded what it needed; the
	 * rest comes back now, so the release stays invisible to clients. */
	if (refill_rest) {
		struct baton_cache_report r;
		set_state("refilling");
		if (engine_refill(g.e, &r) == 0) {
			g.idle_released = 0;
			pthread_mutex_lock(&g.st_mu);
			g.last_refill_bytes = r.bytes_copied;
			g.last_refill_s = r.total_s;
			pthread_mutex_unlock(&g.st_mu);
		}
		snapshot(NULL);
	}
	pthread_mutex_unlock(&g.run_mu);
}

/* RELEASE, REFILL, VRAM: fenced by epoch, refused while the engine works. */
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
	if (pthread_mutex_trylock(&g.run_mu) != 0) {
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
	} else if (req->op == PROTO_OP_REFILL) {
		set_state("refilling");
		rc = engine_refill(g.e, &r);
		g.idle_released = 0;
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
	pthread_mutex_unlock(&g.run_mu);
	if (rc) {
		reply_err(ctx, req, rc, "%s failed: %s", op, baton_strerror(rc));
		return;
	}
	logf_("%s: %s, %.3f ms, %" PRIu64 " bytes copied, %" PRIu64 " freed", op,
	    cache_state_name(r.state), r.total_s * 1e3, r.bytes_copied, r.bytes_freed);
	struct baton_msg rep;
	proto_reply_init(&rep, req);
	pthread_mutex_lock(&g.st_mu);
	rep.state = g.state;
	rep.resident = (uint64_t)g.info.cache.items_resident * g.info.cache.slot_bytes;
	rep.epoch = g.epoch;
	pthread_mutex_unlock(&g.st_mu);
	rep.ms = r.total_s * 1e3;
	rep.bytes = req->op == PROTO_OP_RELEASE ? r.bytes_freed : r.bytes_copied;
	reply(ctx, &rep);
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
		case PROTO_OP_RELEASE:
		case PROTO_OP_REFILL:
		case PROTO_OP_VRAM: on_control(ctx, &req); break;
		default:
			reply_err(ctx, &req, BATON_EUNKNOWNOP, "an engine does not serve '%s'",
			    proto_op_name(req.op));
		}
		proto_msg_free(&req);
	}
	return NULL;
}

/* Releases the cache when nobody asked for anything for idle_s seconds. */
static void idle_tick(void)
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
	}
	pthread_mutex_unlock(&g.run_mu);
}

static int ensure_ipc_dir(const char *url)
{
	if (strncmp(url, "ipc://", 6) != 0)
		return 0;
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s", url + 6);
	char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return 0;
	*slash = 0;
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		mkdir(path, 0755);
		*p = '/';
	}
	if (mkdir(path, 0770) != 0 && errno != EEXIST)
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	parse_args(argc, argv, &g.o);
	char listen[PATH_MAX];
	if (g.o.listen)
		snprintf(listen, sizeof listen, "%s", g.o.listen);
	else
		snprintf(listen, sizeof listen, "ipc:///run/baton/engine-%s.sock", g.o.name);

	/* Signals go to the main thread only: block them before any thread
	 * (ours or nng's) starts. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	struct baton_engine_config cfg = {
		.name = g.o.name,
		.arena_path = g.o.arena,
		.backend = g.o.backend,
		.device = g.o.device,
		.cache_bytes = g.o.cache_mib * MIB,
		.segment_bytes = g.o.segment_mib * MIB,
		.reserve_bytes = g.o.reserve_mib * MIB,
		.host_capacity = g.o.host_mib * MIB,
		.verify = g.o.verify || (getenv("BATON_VERIFY_REFILL") && atoi(getenv("BATON_VERIFY_REFILL"))),
		.warm = 1,
	};
	char err[512] = "";
	double t0 = now_s();
	int rc = engine_open(&cfg, &g.e, err, sizeof err);
	if (rc) {
		logf_("%s", err);
		return rc == BATON_EINVAL || rc == BATON_ENODEV ? 2 : 1;
	}
	snapshot(NULL);
	g.d_model = g.info.d_model;
	logf_("%s on %s (%s): %u layers x %u experts, cache %.1f MiB %s, ready in %.3f s", g.o.arena,
	    g.info.backend, g.info.gpu, g.info.layers, g.info.experts,
	    (double)g.info.cache.mapped_bytes / MIB, cache_state_name(g.info.cache.state), now_s() - t0);
	if (g.info.compute_error)
		logf_("warning: %s; GEN will be refused", g.info.compute_error);

	if (ensure_ipc_dir(listen) != 0)
		logf_("cannot create the directory of %s: %s", listen, strerror(errno));
	if ((rc = proto_server_open(&g.srv, listen, NULL)) != 0) {
		logf_("cannot listen on %s: %s", listen, baton_strerror(rc));
		engine_close(g.e);
		return 1;
	}
	pthread_t th[RECEIVERS];
	struct proto_ctx *ctx[RECEIVERS] = { 0 };
	int nth = 0;
	for (int i = 0; i < RECEIVERS; i++) {
		if (proto_ctx_open(g.srv, &ctx[i]) != 0)
			break;
		if (pthread_create(&th[i], NULL, receiver, ctx[i]) != 0) {
			proto_ctx_close(ctx[i]);
			ctx[i] = NULL;
			break;
		}
		nth++;
	}
	if (nth == 0) {
		logf_("cannot start the receivers");
		proto_server_close(g.srv);
		engine_close(g.e);
		return 1;
	}
	g.last_active = now_s();
	logf_("listening on %s", listen);
	/* Ready: tests and scripts wait for this line. */
	printf("ready %s\n", proto_server_url(g.srv));
	fflush(stdout);

	for (;;) {
		struct timespec tick = { .tv_sec = 0, .tv_nsec = 100 * 1000 * 1000 };
		int sig = sigtimedwait(&sigs, NULL, &tick);
		if (sig > 0)
			break;
		idle_tick();
	}
	logf_("shutting down");
	g.stopping = 1;
	proto_server_shutdown(g.srv);
	for (int i = 0; i < nth; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < nth; i++)
		proto_ctx_close(ctx[i]);
	proto_server_close(g.srv);
	/* Nobody uses the engine now: give the device memory back. */
	struct baton_cache_report r;
	engine_release(g.e, &r);
	engine_close(g.e);
	logf_("stopped");
	return 0;
}
