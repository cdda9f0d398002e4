/*
 * dispatch.c: the door's dispatch thread (door_int.h). It wakes on a
 * request, an answer's end, a client that left, an event of the core (the
 * view is read again first: view.c) or every 50 ms (quanta are the door's
 * own clock), and goes round:
 *   - drops what waits for a client that left, answers what waits for a
 *     model nobody serves any more;
 *   - asks door_policy() per device which engines take requests now and
 *     whether the device switches to another model;
 *   - forwards queued requests to the least loaded engine of their model
 *     that flows (proxy.c);
 *   - switches a device: stops sending to the holder, waits for its
 *     requests in flight to end (an engine answers release busy while it
 *     has sequences), then refills the new model's engine (refill.c) and
 *     forwards once the core's status says it is back;
 *   - says once per wait why a model's requests wait (door.queue).
 * Idle release is the core's (schedule.c: door_keep_alive_s and
 * [engine] keep_alive_s), not the door's.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/door/door_int.h"

#define TICK_S 0.05        /* quanta are looked at this often */
#define RETRY_S 0.25       /* a status read that failed is tried again after this */

/* Answers, outside the lock, what the round took out of the queues. */
struct outbox {
	struct dreq *gone, *orphan, *nothread, *failed;
};

static void drop_gone(struct broker_door *d, struct outbox *ob)
{
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		struct dreq **pp = &m->qh, *prev = NULL;
		while (*pp) {
			struct dreq *q = *pp;
			if (q->gone) {
				*pp = q->next;
				if (m->qt == q)
					m->qt = prev;
				m->queued--;
				m->gone++;
				q->next = ob->gone;
				ob->gone = q;
				continue;
			}
			prev = q;
			pp = &q->next;
		}
		if (!m->queued)
			m->queue_told = false;
	}
}

/* The least loaded engine of q's model that flows (its pinned one only),
 * or NULL. */
static const struct deng *pick(struct broker_door *d, const struct dreq *q, const bool *flow)
{
	const struct deng *best = NULL;
	unsigned best_n = 0;
	for (size_t i = 0; i < d->n_eng; i++) {
		if (!flow[i] || strcmp(d->eng[i].model, d->models[q->model].name) != 0 ||
		    (*q->pin && strcmp(d->eng[i].name, q->pin) != 0))
			continue;
		unsigned n = door_inflight(d, d->eng[i].name);
		if (!best || n < best_n) {
			best = &d->eng[i];
			best_n = n;
		}
	}
	return best;
}

/* One device: who flows, and its switch. */
static void device_round(struct broker_door *d, struct ddev *v, double now, bool *flow)
{
	int idx[BROKER_MAX_ENGINES];
	struct door_pe pe[BROKER_MAX_ENGINES] = { 0 };
	bool f[BROKER_MAX_ENGINES];
	size_t n = 0;
	int holder = -1, target = -1, from = -1;
	for (size_t i = 0; i < d->n_eng; i++) {
		struct deng *e = &d->eng[i];
		if (strcmp(e->gpu, v->gpu) != 0)
			continue;
		int mi = door_model(d, e->model, false);
		struct dmodel *m = mi >= 0 ? &d->models[mi] : NULL;
		uint64_t want = e->ceiling > e->resident ? e->ceiling - e->resident : 0;
		uint64_t avail = v->free_b > v->reserve ? v->free_b - v->reserve : 0;
		pe[n] = (struct door_pe){
			.queued = m ? m->queued : 0,
			.oldest_s = m && m->qh ? now - m->qh->t_in : 0,
			.inflight = door_inflight(d, e->name),
			.ready = door_ready(e),
			.fits = want <= avail,
		};
		if (!*v->holder && !v->switching && pe[n].ready) {
			snprintf(v->holder, sizeof v->holder, "%s", e->name); /* resident before the door switched anything */
			v->holder_since = now;
		}
		if (strcmp(e->name, v->holder) == 0)
			holder = (int)n;
		if (strcmp(e->name, v->target) == 0)
			target = (int)n;
		if (strcmp(e->name, v->from) == 0)
			from = (int)n;
		idx[n++] = (int)i;
	}
	if (*v->holder && holder < 0)
		v->holder[0] = 0; /* gone */
	struct door_pdev pd = {
		.holder = holder, .held_s = holder >= 0 ? now - v->holder_since : 0,
		.quantum_s = d->quantum_s, .switching = v->switching, .target = target, .from = from,
	};
	int sw = -1;
	door_policy(pe, n, &pd, f, &sw);
	for (size_t k = 0; k < n; k++)
		flow[idx[k]] = f[k];
	if (v->switching && !v->refilling) {
		/* draining the engine switched out; then the refill */
		bool drained = !*v->from || door_inflight(d, v->from) == 0;
		if (drained && target >= 0) {
			v->drained_at = now;
			void *j = door_refill_job(d, v->gpu, v->target);
			v->refilling = j && door_spawn(d, door_refill_thread, j);
			if (!v->refilling)
				free(j);
		} else if (target < 0) {
			v->switching = false; /* its engine went away */
		}
	} else if (!v->switching && sw >= 0 && (size_t)sw < n) {
		v->switching = true;
		v->refilling = false;
		snprintf(v->target, sizeof v->target, "%s", d->eng[idx[sw]].name);
		if (!pe[sw].fits && holder >= 0)
			snprintf(v->from, sizeof v->from, "%s", v->holder);
		else
			v->from[0] = 0;
		v->sw_t0 = now;
		v->drained_at = now;
		d->again = true; /* another round at once: the drain may be done */
	}
}

/* Under d->mu. */
static void round_(struct broker_door *d, double now, struct outbox *ob)
{
	bool flow[BROKER_MAX_ENGINES] = { 0 };
	drop_gone(d, ob);
	/* requests of a model nobody serves any more */
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		int fl = m->qh && !door_served(d, m->name) ? door_fleet_resolve(d->fleet, m->name, NULL, 0, NULL, 0) : -1;
		if (fl == 0) {
			door_fleet_want(d->fleet, m->name); /* its engine is (re)starting: they wait */
		} else if (fl == 1) {
			/* the model failed: its requests get the reason (door_fleet_failed) */
			m->qt->next = ob->failed;
			ob->failed = m->qh;
			m->failed += m->queued;
			m->qh = m->qt = NULL;
			m->queued = 0;
			m->queue_told = false;
		} else if (m->qh && !door_served(d, m->name)) {
			m->qt->next = ob->orphan;
			ob->orphan = m->qh;
			m->failed += m->queued;
			m->qh = m->qt = NULL;
			m->queued = 0;
			m->queue_told = false;
		}
	}
	for (size_t di = 0; di < d->n_devs; di++)
		device_round(d, &d->devs[di], now, flow);
	/* queued requests to the engines that flow */
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		/* in order; one pinned to an engine that does not flow now waits
		 * without holding up the rest */
		struct dreq **pp = &m->qh, *prev = NULL;
		while (*pp) {
			struct dreq *q = *pp;
			const struct deng *pe = *q->pin ? door_eng(d, q->pin) : NULL;
			if (*q->pin && (!pe || strcmp(pe->model, m->name) != 0))
				q->pin[0] = 0; /* its engine went away (with what it kept): any of the model's says so */
			const struct deng *e = pick(d, q, flow);
			if (!e) {
				prev = q;
				pp = &q->next;
				continue;
			}
			*pp = q->next;
			if (m->qt == q)
				m->qt = prev;
			m->queued--;
			if (!door_forward(d, q, e)) {
				q->next = ob->nothread;
				ob->nothread = q;
				break;
			}
		}
		if (!m->queued)
			m->queue_told = false;
	}
	/* a model whose requests wait (no engine of it takes requests now):
	 * told once per wait */
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		if (!m->queued || m->queue_told)
			continue;
		m->queue_told = true;
		const char *why = "waiting for its engine's refill";
		for (size_t di = 0; di < d->n_devs; di++) {
			struct ddev *v = &d->devs[di];
			const struct deng *h = *v->holder ? door_eng(d, v->holder) : NULL;
			const struct deng *fr = *v->from ? door_eng(d, v->from) : NULL;
			if (h && strcmp(h->model, m->name) != 0 && !v->switching && door_inflight(d, h->name))
				why = "the device's holder keeps it for its quantum";
			else if (v->switching && fr && strcmp(fr->model, m->name) != 0)
				why = "waiting for the holder to drain";
		}
		char reason[BROKER_NAME_MAX + 128];
		snprintf(reason, sizeof reason, "model %s: %u waiting (%s)", m->name, m->queued, why);
		/* bytes are device memory in every event (docs/reference/broker.md):
		 * none moved here; the count is in the reason */
		broker_emit(d->b, "door.queue", NULL, reason, -1, 0);
	}
}

/* The access log's line of q, answered here with status. */
static void refused(struct dreq *q, int status)
{
	char name[BROKER_NAME_MAX];
	pthread_mutex_lock(&q->d->mu);
	snprintf(name, sizeof name, "%s", q->d->models[q->model].name);
	pthread_mutex_unlock(&q->d->mu);
	door_access_refused(q->d, name, status, q->t_in, q->stream);
}

static void answer(struct outbox *ob)
{
	for (struct dreq *q = ob->gone, *nx; q; q = nx) {
		nx = q->next;
		refused(q, 499);
		door_reply_error(q->r, 503, "invalid_request_error", NULL, NULL, NULL, "the client went away");
		door_dreq_free(q);
	}
	for (struct dreq *q = ob->nothread, *nx; q; q = nx) {
		nx = q->next;
		refused(q, 503);
		door_reply_error(q->r, 503, "server_error", NULL, NULL, "1", "the broker cannot start a thread now");
		door_dreq_free(q);
	}
	for (struct dreq *q = ob->failed, *nx; q; q = nx) {
		nx = q->next;
		char why[2048] = "", name[BROKER_NAME_MAX] = "";
		pthread_mutex_lock(&q->d->mu);
		snprintf(name, sizeof name, "%s", q->d->models[q->model].name);
		door_fleet_resolve(q->d->fleet, name, NULL, 0, why, sizeof why);
		pthread_mutex_unlock(&q->d->mu);
		door_access_refused(q->d, name, 503, q->t_in, q->stream);
		door_reply_error(q->r, 503, "server_error", "model", "model_failed", "30", "model '%s' failed: %s", name,
		    why);
		door_dreq_free(q);
	}
	for (struct dreq *q = ob->orphan, *nx; q; q = nx) {
		nx = q->next;
		refused(q, 503);
		door_reply_error(q->r, 503, "server_error", "model", "model_not_served", "5",
		    "no engine serves this model any more");
		door_dreq_free(q);
	}
}

void *door_dispatch(void *arg)
{
	struct broker_door *d = arg;
	double retry_at = 0;
	pthread_mutex_lock(&d->mu);
	while (!d->stop) {
		double now = baton_now_s();
		if ((d->stale || !d->have_status) && now >= retry_at) {
			/* the core said something changed: read it before deciding */
			pthread_mutex_unlock(&d->mu);
			bool ok = door_refresh(d);
			pthread_mutex_lock(&d->mu);
			if (d->stop)
				break;
			now = baton_now_s();
			retry_at = ok ? 0 : now + RETRY_S;
		}
		struct outbox ob = { 0 };
		round_(d, now, &ob);
		if (ob.gone || ob.orphan || ob.nothread || ob.failed) {
			pthread_mutex_unlock(&d->mu);
			answer(&ob);
			pthread_mutex_lock(&d->mu);
			continue;
		}
		if (d->again) {
			d->again = false;
			continue;
		}
		/* sleep until a change (a request, an end, an event), or a tick */
		double dt = TICK_S;
		if ((d->stale || !d->have_status) && retry_at > now && retry_at - now < dt)
			dt = retry_at - now;
		if (d->stale && retry_at <= now)
			continue;
		baton_cond_wait_for(&d->cv, &d->mu, dt);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

void door_fleet_failed(struct broker_door *d, const char *name, const char *why)
{
	pthread_mutex_lock(&d->mu);
	int mi = door_model(d, name, false);
	struct dreq *fail = NULL;
	if (mi >= 0) {
		struct dmodel *m = &d->models[mi];
		fail = m->qh;
		m->failed += m->queued;
		m->qh = m->qt = NULL;
		m->queued = 0;
		m->queue_told = false;
	}
	pthread_mutex_unlock(&d->mu);
	for (struct dreq *q = fail, *nx; q; q = nx) {
		nx = q->next;
		door_access_refused(d, name, 503, q->t_in, q->stream);
		door_reply_error(q->r, 503, "server_error", "model", "model_failed", "30", "model '%s' failed: %s", name,
		    why);
		door_dreq_free(q);
	}
}
