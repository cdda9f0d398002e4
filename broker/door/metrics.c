/*
 * metrics.c: the front door's Prometheus lines (queue depth, waits,
 * outcomes, switches, requests in flight, time to first token in parts),
 * written after the broker's own on GET /metrics (broker_http_metrics),
 * and the histograms they come from.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>

#include "broker/door/door_int.h"

static const double bucket_s[DOOR_NB] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };

void door_hist_add(struct door_hist *h, double s)
{
	h->n++;
	h->sum += s;
	for (int i = 0; i < DOOR_NB; i++)
		if (s <= bucket_s[i])
			h->b[i]++;
}

/* ---- the Prometheus lines ----------------------------------------------------------------------- */

static void label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void write_hist(FILE *f, const char *name, const char *model, const struct door_hist *h)
{
	for (int i = 0; i < DOOR_NB; i++) {
		fprintf(f, "%s_bucket{model=\"", name);
		label(f, model);
		fprintf(f, "\",le=\"%g\"} %" PRIu64 "\n", bucket_s[i], h->b[i]);
	}
	fprintf(f, "%s_bucket{model=\"", name);
	label(f, model);
	fprintf(f, "\",le=\"+Inf\"} %" PRIu64 "\n%s_sum{model=\"", h->n, name);
	label(f, model);
	fprintf(f, "\"} %.6f\n%s_count{model=\"", h->sum, name);
	label(f, model);
	fprintf(f, "\"} %" PRIu64 "\n", h->n);
}

void door_metrics(void *arg, FILE *f)
{
	struct broker_door *d = arg;
	pthread_mutex_lock(&d->mu);
	double now = door_now();
	fprintf(f, "# HELP baton_door_queue_depth Front door: requests waiting for an engine, per model.\n"
	    "# TYPE baton_door_queue_depth gauge\n");
	for (size_t i = 0; i < d->n_models; i++) {
		fputs("baton_door_queue_depth{model=\"", f);
		label(f, d->models[i].name);
		fprintf(f, "\"} %u\n", d->models[i].queued);
	}
	fprintf(f, "# HELP baton_door_oldest_wait_seconds Front door: how long the oldest waiting request of a model has waited.\n"
	    "# TYPE baton_door_oldest_wait_seconds gauge\n");
	for (size_t i = 0; i < d->n_models; i++) {
		fputs("baton_door_oldest_wait_seconds{model=\"", f);
		label(f, d->models[i].name);
		fprintf(f, "\"} %.3f\n", d->models[i].qh ? now - d->models[i].qh->t_in : 0.0);
	}
	fprintf(f, "# HELP baton_door_requests_total Front door: requests by outcome (served, queue_full, failed, gone: the client left).\n"
	    "# TYPE baton_door_requests_total counter\n");
	for (size_t i = 0; i < d->n_models; i++) {
		const struct dmodel *m = &d->models[i];
		const char *what[4] = { "served", "queue_full", "failed", "gone" };
		uint64_t v[4] = { m->served, m->rejected_full, m->failed, m->gone };
		for (int k = 0; k < 4; k++) {
			fputs("baton_door_requests_total{model=\"", f);
			label(f, m->name);
			fprintf(f, "\",outcome=\"%s\"} %" PRIu64 "\n", what[k], v[k]);
		}
	}
	fprintf(f, "# HELP baton_door_switches_total Front door: a device switched from one model to another "
	    "(rate() gives switches per second).\n# TYPE baton_door_switches_total counter\n");
	fprintf(f, "baton_door_switches_total %" PRIu64 "\n", d->switches_total);
	fprintf(f, "# HELP baton_door_switch_seconds Front door: the parts of a switch: drain (the engine "
	    "switched out finishes its requests), refill (the broker's refill of the one switched in).\n"
	    "# TYPE baton_door_switch_seconds histogram\n");
	for (int k = 0; k < 2; k++) {
		const struct door_hist *h = k ? &d->sw_refill : &d->sw_drain;
		const char *ph = k ? "refill" : "drain";
		for (int i = 0; i < DOOR_NB; i++)
			fprintf(f, "baton_door_switch_seconds_bucket{phase=\"%s\",le=\"%g\"} %" PRIu64 "\n", ph, bucket_s[i],
			    h->b[i]);
		fprintf(f, "baton_door_switch_seconds_bucket{phase=\"%s\",le=\"+Inf\"} %" PRIu64 "\n"
		    "baton_door_switch_seconds_sum{phase=\"%s\"} %.6f\nbaton_door_switch_seconds_count{phase=\"%s\"} %"
		    PRIu64 "\n", ph, h->n, ph, h->sum, ph, h->n);
	}
	fprintf(f, "# HELP baton_door_in_flight Front door: requests forwarded to an engine, not yet answered.\n"
	    "# TYPE baton_door_in_flight gauge\n");
	for (size_t i = 0; i < d->n_eng; i++) {
		fputs("baton_door_in_flight{engine=\"", f);
		label(f, d->eng[i].name);
		fputs("\",model=\"", f);
		label(f, d->eng[i].model);
		fprintf(f, "\"} %u\n", door_inflight(d, d->eng[i].name));
	}
	const char *names[3] = { "baton_door_ttft_wait_seconds", "baton_door_ttft_refill_seconds",
		"baton_door_ttft_prefill_seconds" };
	const char *help[3] = {
		"time to first token, part 1: queued at the door until forwarded",
		"time to first token, part 2: the refill (acquire) it waited for, within the wait",
		"time to first token, part 3: forwarded until the engine's first byte",
	};
	for (int k = 0; k < 3; k++) {
		fprintf(f, "# HELP %s Front door: %s.\n# TYPE %s histogram\n", names[k], help[k], names[k]);
		for (size_t i = 0; i < d->n_models; i++) {
			const struct dmodel *m = &d->models[i];
			write_hist(f, names[k], m->name, k == 0 ? &m->wait : k == 1 ? &m->refill : &m->prefill);
		}
	}
	pthread_mutex_unlock(&d->mu);
}
