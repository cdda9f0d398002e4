/*
 * status.c: the serve loop's state as others read it (see serve_int.h):
 * the STATUS snapshot and its reply, the broker link's view, GET /health's
 * fields, the log and the replies' helpers.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/serve/serve_int.h"

/* As the broker's lines (broker/events.c): each stamped with the UTC time
 * to the millisecond, unless under journald (JOURNAL_STREAM set: the
 * journal stamps it). */
const char *serve_stamp(char *stamp, size_t len)
{
	stamp[0] = 0;
	const char *js = getenv("JOURNAL_STREAM");
	if (!js || !*js) {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		size_t n = strftime(stamp, len, "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(stamp + n, len - n, ".%03ldZ ", ts.tv_nsec / 1000000L);
	}
	return stamp;
}

/* One write per line: stderr is unbuffered, and a line written in pieces
 * is cut by another thread's line (a pipe or the journal shows it). */
void serve_log(struct serve *s, const char *fmt, ...)
{
	char stamp[48], line[2048];
	serve_stamp(stamp, sizeof stamp);
	int n = snprintf(line, sizeof line, "%sbaton-engine[%s]: ", stamp, s->o.name ? s->o.name : "?");
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof line)
		vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
	va_end(ap);
	size_t l = strlen(line);
	if (l + 1 >= sizeof line)
		l = sizeof line - 2; /* cut: still one line */
	line[l] = '\n';
	line[l + 1] = 0;
	fputs(line, stderr);
}

/* The state's name: a cache that maps nothing is "released", also a
 * fresh one that was never filled (cache.h calls that partial) and one
 * shrunk to nothing by a reserve (cache.h calls that ready: its target is
 * met, but it holds no device memory and a GEN must acquire first). */
static const char *state_name(const struct baton_engine_info *in)
{
	if ((in->cache.state == BATON_CACHE_PARTIAL || in->cache.state == BATON_CACHE_READY) &&
	    in->cache.mapped_bytes == 0)
		return baton_state_name(BATON_STATE_RELEASED);
	return cache_state_name(in->cache.state);
}

/* Refreshes the STATUS snapshot; the caller holds run_mu. */
void serve_snapshot(struct serve *s, const char *state)
{
	struct baton_engine_info info;
	engine_info(s->e, &info);
	if (!state)
		state = state_name(&info);
	pthread_mutex_lock(&s->st_mu);
	s->info = info;
	s->kv_bytes = s->gen ? model_kv_bytes(generator_model(s->gen)) : 0;
	s->state = state;
	s->snap_epoch = s->epoch;
	pthread_mutex_unlock(&s->st_mu);
}

void serve_set_state(struct serve *s, int st)
{
	pthread_mutex_lock(&s->st_mu);
	s->state = baton_state_name(st);
	pthread_mutex_unlock(&s->st_mu);
}

/* The broker link's view of the engine (any thread). */
void serve_link_state(void *arg, struct broker_link_state *st)
{
	struct serve *s = arg;
	uint64_t fr = 0, tot = 0;
	engine_mem_info(s->e, &fr, &tot);
	pthread_mutex_lock(&s->st_mu);
	snprintf(st->state, sizeof st->state, "%s", s->state);
	st->resident = (uint64_t)s->info.cache.items_resident * s->info.cache.slot_bytes;
	st->mapped = s->info.cache.mapped_bytes;
	st->free_bytes = fr;
	st->busy = s->active > 0;
	double idle = baton_now_s() - s->last_active;
	if (s->sched) {
		struct sched_stats ss;
		sched_stats(s->sched, &ss);
		st->busy = st->busy || ss.running || ss.waiting;
		st->requests += ss.finished;
		st->has_prefix = true;
		st->prefix_prompt = ss.prompt_tokens;
		st->prefix_cached = ss.cached_tokens;
		st->prefix_evictions = ss.prefix.evictions;
		st->kv_host_bytes = ss.prefix.host_bytes;
		st->kv_total = ss.kv_total;
		st->kv_used = ss.kv_total > ss.kv_free ? ss.kv_total - ss.kv_free : 0;
	}
	st->idle_ms = st->busy || idle < 0 ? 0 : (uint64_t)(idle * 1e3);
	st->epoch = s->snap_epoch;
	st->has_keep_alive = s->has_keep_alive;
	st->keep_alive_s = s->keep_alive_s;
	st->peer_mapped = s->info.cache.peer_mapped_bytes;
	st->kv = s->kv_bytes;
	st->requests += s->requests;
	int now_st = baton_state_parse(s->state);
	bool moving = now_st == BATON_STATE_REFILLING || now_st == BATON_STATE_RESIZING;
	pthread_mutex_unlock(&s->st_mu);
	if (moving) /* the copy's progress: the broker waits while it moves */
		cache_progress(engine_cache(s->e), &st->copied, &st->to_copy);
	if (s->o.use_peer)
		engine_peer_mem_info(s->e, &st->peer_free, &tot);
}

void serve_link_log(void *arg, const char *line)
{
	struct serve *s = arg;
	serve_log(s, "broker: %s", line);
}

void serve_report(struct serve *s, const char *reason, double ms, uint64_t bytes)
{
	if (s->link)
		broker_link_report(s->link, reason, ms, bytes);
}

/* Requests the scheduler answered (COMPLETE and HTTP). */
static uint64_t sched_done(struct serve *s)
{
	if (!s->sched)
		return 0;
	struct sched_stats st;
	sched_stats(s->sched, &st);
	return st.finished;
}

/* What a release gave back, from the snapshot (st_mu held): "all" (the
 * model too), "experts" (the expert cache maps nothing), or "none". */
const char *serve_level_name(struct serve *s)
{
	if (s->released_all)
		return "all";
	return s->info.cache.mapped_bytes == 0 ? "experts" : "none";
}

void serve_reply(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *rep)
{
	int rc = proto_ctx_reply(ctx, rep);
	if (rc)
		serve_log(s, "serve_reply to %s failed: %s", proto_op_name(rep->op), baton_strerror(rc));
}

void serve_reply_err(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req, int err, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	struct baton_msg rep;
	proto_reply_error(&rep, req->op, req->id, err, text);
	serve_reply(s, ctx, &rep);
}

void serve_on_status(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req)
{
	struct baton_msg rep;
	uint64_t dev_free = 0, dev_total = 0;
	engine_mem_info(s->e, &dev_free, &dev_total); /* live, not the serve_snapshot */
	uint64_t peer_free = 0, peer_total = 0;
	if (s->o.use_peer)
		engine_peer_mem_info(s->e, &peer_free, &peer_total);
	proto_reply_init(&rep, req);
	pthread_mutex_lock(&s->st_mu);
	const struct baton_engine_info *in = &s->info;
	char device[32];
	snprintf(device, sizeof device, "%s:%d", in->backend, s->o.device);
	rep.name = s->o.name;
	rep.state = s->state;
	rep.resident = (uint64_t)in->cache.items_resident * in->cache.slot_bytes;
	rep.mapped = in->cache.mapped_bytes;
	rep.target = in->cache.target_bytes;
	rep.ceiling = (uint64_t)in->cache.slots_total * in->cache.slot_bytes;
	rep.epoch = s->epoch;
	rep.requests = s->requests + sched_done(s);
	rep.level = serve_level_name(s);
	proto_set(&rep, PF_LEVEL);
	rep.hits = in->cache.hits;
	rep.misses = in->cache.misses;
	rep.last_refill_bytes = s->last_refill_bytes;
	rep.last_refill_s = s->last_refill_s;
	rep.device_name = device;
	rep.gpu = in->gpu;
	rep.free_bytes = dev_free;
	rep.total = dev_total;
	rep.kv = s->kv_bytes;
	static const enum proto_field fs[] = { PF_NAME, PF_STATE, PF_RESIDENT, PF_MAPPED,
		PF_TARGET, PF_CEILING, PF_EPOCH, PF_REQUESTS, PF_HITS, PF_MISSES,
		PF_LAST_REFILL_BYTES, PF_LAST_REFILL_S, PF_DEVICE_NAME, PF_GPU, PF_FREE, PF_TOTAL, PF_KV };
	for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++)
		proto_set(&rep, fs[i]);
	if (s->o.use_peer) {
		rep.peer_gpu = s->peer_gpu;
		rep.peer_mapped = in->cache.peer_mapped_bytes;
		rep.peer_free = peer_free;
		proto_set(&rep, PF_PEER_GPU);
		proto_set(&rep, PF_PEER_MAPPED);
		proto_set(&rep, PF_PEER_FREE);
	}
	serve_reply(s, ctx, &rep);
	pthread_mutex_unlock(&s->st_mu);
}

/* The OpenAI API's GET /health adds the engine's state. */
void serve_health_fields(void *arg, json_t *obj)
{
	struct serve *s = arg;
	pthread_mutex_lock(&s->st_mu);
	json_object_set_new(obj, "state", json_string(s->state));
	json_object_set_new(obj, "level", json_string(serve_level_name(s)));
	if (s->info.backend_warning)
		json_object_set_new(obj, "warning", json_string(s->info.backend_warning));
	pthread_mutex_unlock(&s->st_mu);
}

void serve_model_facts(void *arg, json_t *obj)
{
	struct serve *s = arg;
	const char *fam = s->gen ? generator_chat_family(s->gen) : NULL;
	const struct baton_model_config *cfg = s->gen ? model_config(generator_model(s->gen)) : NULL;
	pthread_mutex_lock(&s->st_mu);
	uint64_t size = s->info.model_bytes + s->info.dense_bytes, vram = s->info.cache.mapped_bytes + s->info.dense_bytes;
	double idle = baton_now_s() - s->last_active;
	double limit = s->has_keep_alive ? s->keep_alive_s : s->o.idle_s > 0 ? s->o.idle_s : -1;
	pthread_mutex_unlock(&s->st_mu);
	json_object_set_new(obj, "size", json_integer((json_int_t)size));
	json_object_set_new(obj, "size_vram", json_integer((json_int_t)vram));
	json_object_set_new(obj, "family", json_string(cfg && cfg->arch ? cfg->arch->name : fam ? fam : ""));
	json_object_set_new(obj, "context_length", json_integer(s->gen ? model_max_ctx(generator_model(s->gen)) : 0));
	json_object_set_new(obj, "modified_ns", json_integer((json_int_t)(s->started_wall * 1e9)));
	if (!s->o.broker && limit >= 0)
		json_object_set_new(obj, "expires_in_s", json_real(limit - idle > 0 ? limit - idle : 0));
}
