/*
 * metrics.c: the broker's Prometheus metrics (GET /metrics, docs/reference/http-api.md).
 *
 * Counters and histograms come from the broker's events (the HTTP face
 * hands each one to broker_metrics_event); gauges from a status request
 * made per scrape.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/api/api_int.h"

#define STATS_MAX (2 * BROKER_MAX_ENGINES)
#define HIST_N 14

static const double hist_le[HIST_N] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30 };

/* A handoff's phases, as the handoff event gives them (broker.h). */
enum { HO_DECIDE, HO_RELEASE, HO_REFILL, HO_TOTAL, HO_N };
static const char *const ho_phase[HO_N] = { "decide", "release", "refill", "total" };

struct estat {
	char name[BROKER_NAME_MAX];
	uint64_t releases, refills, grants, denials;
	struct baton_hist rel, ref;
	struct baton_hist ho[HO_N]; /* handoffs to this engine, by phase */
};

struct broker_metrics {
	pthread_mutex_t mu;   /* everything below */
	struct estat *st;
	size_t n_st;
	uint64_t handoffs, errors, events;
	uint64_t leases, lease_over, hook_failures; /* programs that are not engines (jobs.c, hooks.c) */
	double start_time;    /* wall clock seconds: when the broker's metrics began */
};

struct broker_metrics *broker_metrics_new(void)
{
	struct broker_metrics *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	m->st = calloc(STATS_MAX, sizeof *m->st);
	if (!m->st) {
		free(m);
		return NULL;
	}
	pthread_mutex_init(&m->mu, NULL);
	m->start_time = baton_wall_s();
	return m;
}

void broker_metrics_free(struct broker_metrics *m)
{
	if (!m)
		return;
	pthread_mutex_destroy(&m->mu);
	free(m->st);
	free(m);
}

static struct estat *stat_of(struct broker_metrics *h, const char *name)
{
	if (!name || !*name)
		return NULL;
	for (size_t i = 0; i < h->n_st; i++)
		if (strcmp(h->st[i].name, name) == 0)
			return &h->st[i];
	if (h->n_st == STATS_MAX)
		return NULL;
	struct estat *s = &h->st[h->n_st++];
	memset(s, 0, sizeof *s);
	snprintf(s->name, sizeof s->name, "%s", name);
	return s;
}

static void hist_add(struct baton_hist *x, double s)
{
	baton_hist_add(x, hist_le, HIST_N, s);
}

void broker_metrics_event(struct broker_metrics *h, const struct baton_msg *ev)
{
	const char *kind = ev->kind ? ev->kind : "", *reason = ev->reason ? ev->reason : "";
	pthread_mutex_lock(&h->mu);
	h->events++;
	/* Releases and refills: the broker's commands (kind release/refill),
	 * and what engines did on their own and reported (kind state: an
	 * engine's refill before a request, its idle release). */
	bool state = strcmp(kind, "state") == 0;
	bool failed = strstr(reason, "fail") != NULL;
	bool release = strcmp(kind, "release") == 0 || (state && !failed && strstr(reason, "release"));
	bool refill = strcmp(kind, "refill") == 0 || (state && !failed && strncmp(reason, "refill", 6) == 0);
	struct estat *s = stat_of(h, ev->engine);
	double secs = proto_has(ev, PF_MS) && ev->ms >= 0 ? ev->ms / 1e3 : 0;
	if (s && release) {
		s->releases++;
		hist_add(&s->rel, secs);
	}
	if (s && refill) {
		s->refills++;
		hist_add(&s->ref, secs);
	}
	if (s && strcmp(kind, "grant") == 0)
		s->grants++;
	if (strcmp(kind, "deny") == 0) {
		h->errors++;
		if (s)
			s->denials++;
	}
	h->leases += strcmp(kind, "lease") == 0;
	h->lease_over += strcmp(kind, "lease-over") == 0;
	h->hook_failures += strcmp(kind, "hook-failed") == 0;
	if (strcmp(kind, "handoff") == 0) {
		h->handoffs++;
		double ph[HO_N] = { ev->decide_ms, ev->release_ms, ev->refill_ms, ev->total_ms };
		for (int k = 0; s && k < HO_N; k++)
			hist_add(&s->ho[k], ph[k] > 0 ? ph[k] / 1e3 : 0);
	}
	pthread_mutex_unlock(&h->mu);
}

struct metrics_ctx {
	FILE *f;
	int err;
	char msg[512];
	unsigned live, lost, dead; /* engines by liveness */
};

/* The labels of an engine's series, and of one on a device. */
#define BY_ENGINE(e) ((const char *[]){ "engine", (e), NULL })
#define BY_ENGINE_GPU(e, g) ((const char *[]){ "engine", (e), "gpu", (g), NULL })

/* The engine families of a status reply: a row each, in the order they
 * are written. Which engines have a series (who), its labels (by) and its
 * value (val: the field at off, or one worked out of the entry). */
enum ewho { E_ALL, E_BATON, E_EXTERNAL, E_WITH_KV, E_WITH_PEER, E_NODE };
enum eby { BY_E, BY_E_GPU, BY_E_PEER };
enum eval { V_U64, V_BOOL, V_MS_AS_S, V_GBPS_AS_BPS, V_KIND, V_PARKED, V_STATE, V_KV_RATIO };

#define EF(field) offsetof(struct proto_engine_info, field)

static const struct efam {
	const char *name, *type, *help;
	enum ewho who;
	enum eby by;
	enum eval val;
	size_t off;
} efam[] = {
	{ "baton_engine_kind", "gauge", "1 for what an entry is: engine (Baton's), lease (memory lent to a job), "
	  "external (a program that is not Baton's).", E_ALL, BY_E, V_KIND, 0 },
	{ "baton_external_parked", "gauge", "1 while an external engine is parked (its device memory checkpointed "
	  "to host memory by the CUDA driver).", E_EXTERNAL, BY_E, V_PARKED, 0 },
	{ "baton_engine_resident_bytes", "gauge", "Device memory an engine's expert cache maps.", E_ALL, BY_E_GPU,
	  V_U64, EF(resident) },
	{ "baton_engine_kv_bytes", "gauge", "Device memory an engine's KV pool holds (apart from its expert cache).",
	  E_BATON, BY_E_GPU, V_U64, EF(kv) },
	{ "baton_engine_requests_total", "counter", "GEN requests an engine answered since it started (from its "
	  "heartbeats).", E_ALL, BY_E, V_U64, EF(requests) },
	/* the prefix cache (issue 29), beside the engine's other counts */
	{ "baton_engine_prefix_prompt_tokens_total", "counter", "Prompt tokens a text engine admitted (its "
	  "heartbeats).", E_ALL, BY_E, V_U64, EF(prefix_prompt) },
	{ "baton_engine_prefix_cached_tokens_total", "counter", "Of them, tokens taken from the prefix cache "
	  "instead of read (hit rate: this over prompt tokens).", E_ALL, BY_E, V_U64, EF(prefix_cached) },
	{ "baton_engine_prefix_evictions_total", "counter", "Cached KV blocks evicted for other positions (least "
	  "recently used first).", E_ALL, BY_E, V_U64, EF(prefix_evictions) },
	{ "baton_engine_kv_host_bytes", "gauge", "KV blocks an engine keeps in host memory while released "
	  "(--kv-host-mib bounds them).", E_ALL, BY_E, V_U64, EF(kv_host_bytes) },
	/* the KV pools, as the engines' heartbeats say: per engine, and the
	 * whole broker as one model server (a gateway's KVCacheUtilization,
	 * docs/guides/kubernetes.md) */
	{ "baton_engine_kv_blocks_used", "gauge", "KV cache blocks an engine uses (from its heartbeats; engines "
	  "with text generation).", E_WITH_KV, BY_E, V_U64, EF(kv_used) },
	{ "baton_kv_cache_usage_ratio", "gauge", "KV cache blocks in use over all, 0 to 1, of every engine as their "
	  "heartbeats say (vllm:kv_cache_usage_perc of the node).", E_NODE, BY_E, V_KV_RATIO, 0 },
	{ "baton_engine_peer_bytes", "gauge", "Memory an engine's peer tier holds on another device (lent by the "
	  "broker).", E_WITH_PEER, BY_E_PEER, V_U64, EF(peer) },
	{ "baton_engine_ceiling_bytes", "gauge", "Device memory an engine's whole expert cache takes.", E_ALL,
	  BY_E_GPU, V_U64, EF(ceiling) },
	{ "baton_engine_state", "gauge", "1 for the state an engine is in, 0 for the others.", E_ALL, BY_E, V_STATE,
	  0 },
	{ "baton_engine_pinned", "gauge", "1 when an engine is pinned (never reclaimed).", E_ALL, BY_E, V_BOOL,
	  EF(pinned) },
	{ "baton_engine_idle_seconds", "gauge", "Seconds since an engine's last request ended (0 while busy; a dead "
	  "engine's since it died or last served).", E_ALL, BY_E, V_MS_AS_S, EF(idle_ms) },
	{ "baton_engine_last_refill_bytes_per_second", "gauge", "Bytes copied per second by an engine's last "
	  "refill (0: none yet).", E_ALL, BY_E, V_GBPS_AS_BPS, EF(last_refill_gbps) },
};

static bool engine_has(const struct efam *r, const struct proto_engine_info *e)
{
	switch (r->who) {
	case E_BATON:
		return strcmp(broker_entry_kind(e), "engine") == 0;
	case E_EXTERNAL:
		return strcmp(broker_entry_kind(e), "external") == 0;
	case E_WITH_KV:
		return e->kv_total != 0;
	case E_WITH_PEER:
		return *e->peer_gpu != 0;
	default:
		return true;
	}
}

/* One engine's series of a family. */
static void engine_series(FILE *f, const struct efam *r, const struct proto_engine_info *e)
{
	const char *field = (const char *)e + r->off;
	const char *const *by = r->by == BY_E_GPU ? BY_ENGINE_GPU(e->name, e->gpu) :
	    r->by == BY_E_PEER ? BY_ENGINE_GPU(e->name, e->peer_gpu) : BY_ENGINE(e->name);
	switch (r->val) {
	case V_U64:
		baton_prom_u64(f, r->name, by, *(const uint64_t *)field);
		break;
	case V_BOOL:
		baton_prom_u64(f, r->name, by, *(const bool *)field);
		break;
	case V_MS_AS_S:
		baton_prom_f(f, r->name, by, 3, (double)*(const uint64_t *)field / 1e3);
		break;
	case V_GBPS_AS_BPS:
		baton_prom_f(f, r->name, by, 0, *(const double *)field * 1e9);
		break;
	case V_KIND:
		baton_prom_u64(f, r->name, (const char *[]){ "engine", e->name, "kind", broker_entry_kind(e), NULL }, 1);
		break;
	case V_PARKED:
		baton_prom_u64(f, r->name, by, strcmp(e->state, "parked") == 0);
		break;
	case V_STATE: {
		int in = baton_state_parse(e->state);
		for (int st = 1; st < BATON_STATE_N; st++)
			baton_prom_u64(f, r->name, (const char *[]){ "engine", e->name, "state", baton_state_name(st),
			    NULL }, in == st);
		if (in == BATON_STATE_UNKNOWN) /* a newer engine's word: shown as it is */
			baton_prom_u64(f, r->name, (const char *[]){ "engine", e->name, "state", e->state, NULL }, 1);
		break;
	}
	case V_KV_RATIO:
		break; /* the node's, in engine_family */
	}
}

/* A family of the engines' table: its header, then a series an engine it
 * has one for (or the node's one). */
static void engine_family(FILE *f, const struct efam *r, const struct proto_engine_info *ev, uint32_t n)
{
	baton_prom_family(f, r->name, r->type, r->help);
	if (r->who == E_NODE) {
		uint64_t used = 0, total = 0;
		for (uint32_t i = 0; i < n; i++) {
			used += ev[i].kv_used;
			total += ev[i].kv_total;
		}
		baton_prom_f(f, r->name, NULL, 4, total ? (double)used / (double)total : 0.0);
		return;
	}
	for (uint32_t i = 0; i < n; i++)
		if (engine_has(r, &ev[i]))
			engine_series(f, r, &ev[i]);
}

static void on_metrics_reply(void *arg, const struct baton_msg *rep)
{
	struct metrics_ctx *c = arg;
	FILE *f = c->f;
	if (!rep->ok) {
		c->err = rep->err;
		snprintf(c->msg, sizeof c->msg, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
		return;
	}
	static const struct {
		const char *name, *help;
		int which;
	} gm[] = {
		{ "baton_gpu_memory_total_bytes", "Device memory the broker manages (total_mib or the device's size).", 0 },
		{ "baton_gpu_memory_free_bytes", "Device memory free, as the broker counts it (NVML when present).", 1 },
		{ "baton_gpu_memory_used_bytes", "Device memory in use: total minus free.", 2 },
		{ "baton_gpu_memory_held_bytes", "Device memory held by Baton engines' expert caches (and grants), lent memory included.", 3 },
		{ "baton_gpu_memory_reserve_bytes", "The reserve: memory the broker never grants (reserve_mib).", 4 },
		{ "baton_gpu_memory_lent_bytes", "Device memory lent to engines of other devices as their peer tier.", 5 },
		{ "baton_gpu_memory_kv_bytes", "Device memory the engines' KV pools hold (not in held).", 6 },
	};
	for (size_t k = 0; k < sizeof gm / sizeof gm[0]; k++) {
		baton_prom_family(f, gm[k].name, "gauge", gm[k].help);
		for (uint32_t i = 0; i < rep->gpus.n; i++) {
			const struct proto_gpu *g = &rep->gpus.v[i];
			uint64_t v[7] = { g->total, g->free_bytes, g->total > g->free_bytes ? g->total - g->free_bytes : 0,
				g->held, g->reserve, g->lent, g->kv };
			baton_prom_u64(f, gm[k].name, (const char *[]){ "gpu", g->uuid, NULL }, v[gm[k].which]);
		}
	}
	const struct proto_engine_info *ev = rep->engines.v;
	for (size_t k = 0; k < sizeof efam / sizeof efam[0]; k++)
		engine_family(f, &efam[k], ev, rep->engines.n);
	for (uint32_t i = 0; i < rep->engines.n; i++) {
		int st = baton_state_parse(ev[i].state);
		if (st == BATON_STATE_DEAD)
			c->dead++;
		else if (st == BATON_STATE_LOST)
			c->lost++;
		else
			c->live++;
	}
	/* the counters follow in metrics_counters(), under the server's lock */
}

/* One histogram's series: labels engine="E" and, when phase, phase="P". */
static void write_hist(FILE *f, const char *name, const char *engine, const char *phase,
    const struct baton_hist *x)
{
	baton_prom_hist(f, name, (const char *[]){ "engine", engine, phase ? "phase" : NULL, phase, NULL },
	    hist_le, HIST_N, x);
}

static void metrics_counters(struct broker_metrics *h, FILE *f, const struct metrics_ctx *c)
{
	pthread_mutex_lock(&h->mu);
	static const struct {
		const char *name, *help;
		size_t off;
	} cm[] = {
		{ "baton_engine_releases_total", "Releases of an engine's cache (by the broker or the engine).",
		    offsetof(struct estat, releases) },
		{ "baton_engine_refills_total", "Refills of an engine's cache (by the broker or the engine).",
		    offsetof(struct estat, refills) },
		{ "baton_engine_grants_total", "Memory requests granted to an engine (acquire, refill, handoff).",
		    offsetof(struct estat, grants) },
		{ "baton_engine_denials_total", "Memory requests for an engine that ended in an error.",
		    offsetof(struct estat, denials) },
	};
	for (size_t k = 0; k < sizeof cm / sizeof cm[0]; k++) {
		baton_prom_family(f, cm[k].name, "counter", cm[k].help);
		for (size_t i = 0; i < h->n_st; i++)
			baton_prom_u64(f, cm[k].name, BY_ENGINE(h->st[i].name),
			    *(const uint64_t *)((const char *)&h->st[i] + cm[k].off));
	}
	baton_prom_family(f, "baton_engine_release_duration_seconds", "histogram", "How long releases took.");
	for (size_t i = 0; i < h->n_st; i++)
		write_hist(f, "baton_engine_release_duration_seconds", h->st[i].name, NULL, &h->st[i].rel);
	baton_prom_family(f, "baton_engine_refill_duration_seconds", "histogram", "How long refills took.");
	for (size_t i = 0; i < h->n_st; i++)
		write_hist(f, "baton_engine_refill_duration_seconds", h->st[i].name, NULL, &h->st[i].ref);
	baton_prom_family(f, "baton_handoff_duration_seconds", "histogram",
	    "Handoffs to an engine, by phase: decide (the broker's choice), release (what the giver gave back, "
	    "acknowledged), refill (the copy to the receiver), total.");
	for (size_t i = 0; i < h->n_st; i++)
		if (h->st[i].ho[HO_TOTAL].count)
			for (int k = 0; k < HO_N; k++)
				write_hist(f, "baton_handoff_duration_seconds", h->st[i].name, ho_phase[k], &h->st[i].ho[k]);
	baton_prom_family(f, "baton_engines", "gauge",
	    "Engines the broker knows, by liveness: live (answering), lost (silent, its process alive), dead.");
	fprintf(f, "baton_engines{status=\"live\"} %u\nbaton_engines{status=\"lost\"} %u\n"
	    "baton_engines{status=\"dead\"} %u\n", c->live, c->lost, c->dead);
	static const struct {
		const char *name, *help;
		size_t off;
	} nm[] = {
		{ "baton_handoffs_total", "Handoffs completed (scripted, and on demand after a reclaim).",
		    offsetof(struct broker_metrics, handoffs) },
		{ "baton_errors_total", "Operations that ended in an error (deny events).",
		    offsetof(struct broker_metrics, errors) },
		{ "baton_leases_total", "Leases granted (baton run, baton lease, POST /v1/leases).",
		    offsetof(struct broker_metrics, leases) },
		{ "baton_lease_over_grant_total", "Times a job was seen holding more device memory than its lease "
		  "granted (lease-over events).", offsetof(struct broker_metrics, lease_over) },
		{ "baton_external_hook_failures_total", "Release or refill hooks (or parks) of external engines that "
		  "failed, timed out or freed nothing.", offsetof(struct broker_metrics, hook_failures) },
		{ "baton_events_total", "Events the broker published.", offsetof(struct broker_metrics, events) },
	};
	for (size_t k = 0; k < sizeof nm / sizeof nm[0]; k++)
		baton_prom_one(f, nm[k].name, "counter", nm[k].help, *(const uint64_t *)((const char *)h + nm[k].off));
	double start = h->start_time;
	pthread_mutex_unlock(&h->mu);
	baton_prom_family(f, "baton_build_info", "gauge", "The broker's version; always 1.");
	baton_prom_u64(f, "baton_build_info", (const char *[]){ "version", baton_version(), NULL }, 1);
	baton_prom_family(f, "baton_start_time_seconds", "gauge", "When the broker started, in seconds since the Unix epoch.");
	fprintf(f, "baton_start_time_seconds %.3f\n", start);
}

int broker_metrics_text(struct broker_metrics *h, struct broker *b, char **out, size_t *outlen, char *msg,
    size_t n)
{
	struct metrics_ctx c = { 0 };
	size_t len = 0;
	char *buf = NULL;
	*out = NULL;
	*outlen = 0;
	c.f = open_memstream(&buf, &len);
	if (!c.f) {
		snprintf(msg, n, "out of memory");
		return BATON_ENOMEM;
	}
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_STATUS);
	broker_call(b, &m, on_metrics_reply, &c);
	if (!c.err)
		metrics_counters(h, c.f, &c);
	fclose(c.f);
	if (c.err) {
		free(buf);
		snprintf(msg, n, "%s", c.msg);
		return c.err;
	}
	*out = buf;
	*outlen = len;
	return 0;
}
