/*
 * metrics.c: the front door's Prometheus lines (queue depth, waits,
 * outcomes, switches, requests in flight, time to first token in parts),
 * written after the broker's own on GET /metrics (broker_http_metrics),
 * and the histograms they come from.
 */
#include <pthread.h>
#include <stdio.h>

#include "broker/door/door_int.h"

static const double bucket_s[DOOR_NB] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };

void door_hist_add(struct baton_hist *h, double s)
{
	baton_hist_add(h, bucket_s, DOOR_NB, s);
}

/* ---- the Prometheus lines (proto/base's writer) --------------------------------------------------- */

#define BY_MODEL(m) ((const char *[]){ "model", (m), NULL })

/* Under d->mu: the serving metrics per model (proto/base's table, as the
 * engines write theirs): the gauges and the ends not counted in sv taken
 * from the door's own counters as of now. */
static void serving(struct broker_door *d, FILE *f)
{
	static struct baton_serving sv[BROKER_MAX_ENGINES];   /* under d->mu */
	const struct baton_serving *ps[BROKER_MAX_ENGINES];
	const char *const *labels[BROKER_MAX_ENGINES];
	const char *pairs[BROKER_MAX_ENGINES][3];
	for (size_t i = 0; i < d->n_models; i++) {
		const struct dmodel *m = &d->models[i];
		sv[i] = m->sv;
		unsigned running = 0;
		for (const struct dreq *q = d->fwd; q; q = q->next)
			running += q->model == (int)i;
		sv[i].g[BATON_SV_RUNNING] = running;
		sv[i].g[BATON_SV_WAITING] = m->queued;
		sv[i].end[BATON_SV_CANCELLED] += m->gone;
		sv[i].end[BATON_SV_QUEUE_FULL] = m->rejected_full;
		sv[i].end[BATON_SV_BAD_REQUEST] = m->client_error;
		sv[i].end[BATON_SV_FAILED] = m->failed;
		pairs[i][0] = "model";
		pairs[i][1] = m->name;
		pairs[i][2] = NULL;
		ps[i] = &sv[i];
		labels[i] = pairs[i];
	}
	baton_sv_write(f, "baton_door_", BATON_SV_DOOR, ps, labels, d->n_models);
	/* The whole broker as one model server, as a gateway that picks a
	 * node by its load reads it (the Gateway API inference extension's
	 * TotalQueuedRequests, TotalRunningRequests; KVCacheUtilization is
	 * the core's baton_kv_cache_usage_ratio, broker/api/metrics.c:
	 * docs/guides/kubernetes.md): no labels, one series each. */
	uint64_t waiting = 0, running = 0;
	for (size_t i = 0; i < d->n_models; i++) {
		waiting += sv[i].g[BATON_SV_WAITING];
		running += sv[i].g[BATON_SV_RUNNING];
	}
	baton_prom_one(f, "baton_requests_waiting", "gauge", "The broker's requests waiting for an engine, all "
	    "models (vllm:num_requests_waiting of the node).", waiting);
	baton_prom_one(f, "baton_requests_running", "gauge", "The broker's requests forwarded to an engine, not "
	    "yet answered, all models (vllm:num_requests_running of the node).", running);
}

void door_metrics(void *arg, FILE *f)
{
	struct broker_door *d = arg;
	pthread_mutex_lock(&d->mu);
	double now = baton_now_s();
	baton_prom_family(f, "baton_door_queue_depth", "gauge", "Front door: requests waiting for an engine, per model.");
	for (size_t i = 0; i < d->n_models; i++)
		baton_prom_u64(f, "baton_door_queue_depth", BY_MODEL(d->models[i].name), d->models[i].queued);
	baton_prom_family(f, "baton_door_oldest_wait_seconds", "gauge",
	    "Front door: how long the oldest waiting request of a model has waited.");
	for (size_t i = 0; i < d->n_models; i++)
		baton_prom_f(f, "baton_door_oldest_wait_seconds", BY_MODEL(d->models[i].name), 3,
		    d->models[i].qh ? now - d->models[i].qh->t_in : 0.0);
	baton_prom_family(f, "baton_door_requests_total", "counter",
	    "Front door: requests by outcome (served, queue_full, client_error: the engine answered 4xx, never "
	    "counted failed; failed, gone: the client left).");
	for (size_t i = 0; i < d->n_models; i++) {
		const struct dmodel *m = &d->models[i];
		const char *what[5] = { "served", "queue_full", "client_error", "failed", "gone" };
		uint64_t v[5] = { m->served, m->rejected_full, m->client_error, m->failed, m->gone };
		for (int k = 0; k < 5; k++)
			baton_prom_u64(f, "baton_door_requests_total",
			    (const char *[]){ "model", m->name, "outcome", what[k], NULL }, v[k]);
	}
	baton_prom_one(f, "baton_door_switches_total", "counter",
	    "Front door: a device switched from one model to another (rate() gives switches per second).",
	    d->switches_total);
	baton_prom_family(f, "baton_door_switch_seconds", "histogram", "Front door: the parts of a switch: drain "
	    "(the engine switched out finishes its requests), refill (the broker's refill of the one switched in).");
	baton_prom_hist(f, "baton_door_switch_seconds", (const char *[]){ "phase", "drain", NULL }, bucket_s, DOOR_NB,
	    &d->sw_drain);
	baton_prom_hist(f, "baton_door_switch_seconds", (const char *[]){ "phase", "refill", NULL }, bucket_s, DOOR_NB,
	    &d->sw_refill);
	baton_prom_family(f, "baton_door_in_flight", "gauge",
	    "Front door: requests forwarded to an engine, not yet answered.");
	for (size_t i = 0; i < d->n_eng; i++)
		baton_prom_u64(f, "baton_door_in_flight",
		    (const char *[]){ "engine", d->eng[i].name, "model", d->eng[i].model, NULL },
		    door_inflight(d, d->eng[i].name));
	const char *names[4] = { "baton_door_ttft_wait_seconds", "baton_door_ttft_refill_seconds",
		"baton_door_ttft_prefill_seconds", "baton_door_ttft_start_seconds" };
	const char *help[4] = {
		"Front door: time to first token, part 1: queued at the door until forwarded.",
		"Front door: time to first token, part 2: the refill (acquire) it waited for, within the wait.",
		"Front door: time to first token, part 3: forwarded until the engine's first byte.",
		"Front door: within the wait, the start of its model's engine (arena and engine) it waited for.",
	};
	for (int k = 0; k < 4; k++) {
		baton_prom_family(f, names[k], "histogram", help[k]);
		for (size_t i = 0; i < d->n_models; i++) {
			const struct dmodel *m = &d->models[i];
			baton_prom_hist(f, names[k], BY_MODEL(m->name), bucket_s, DOOR_NB,
			    k == 0 ? &m->wait : k == 1 ? &m->refill : k == 2 ? &m->prefill : &m->start);
		}
	}
	uint64_t evicted;
	size_t kept = door_stored_count(d->stored, &evicted);
	baton_prom_one(f, "baton_door_stored_responses", "gauge", "Front door: stored responses whose engine it "
	    "knows (GET, DELETE /v1/responses/ID and previous_response_id are routed by them).", kept);
	baton_prom_one(f, "baton_door_stored_evicted_total", "counter", "Front door: stored responses' ids "
	    "forgotten for room (the least recently used of its last 4096): their GET is 404 at the door.", evicted);
	serving(d, f);
	door_fleet_metrics(d->fleet, f);
	pthread_mutex_unlock(&d->mu);
}
