/*
 * refill.c: the refill of a device's switch (door_int.h), on a helper
 * thread: the broker's refill of the engine switched in (the same path as
 * `baton refill`: its policies, priorities and pins pick what gives way),
 * then the core's status read again, so nothing is forwarded before the
 * view shows what the refill did. A failed refill answers its model's
 * waiting requests with the broker's reason. Either way a door.switch or
 * door.refill_failed event says what happened, with the drain and refill
 * times.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/door/door_int.h"

struct refill_job {
	struct broker_door *d;
	char gpu[BROKER_NAME_MAX];
	char name[BROKER_NAME_MAX];
};

void *door_refill_job(struct broker_door *d, const char *gpu, const char *eng)
{
	struct refill_job *j = calloc(1, sizeof *j);
	if (j) {
		j->d = d;
		snprintf(j->gpu, sizeof j->gpu, "%s", gpu);
		snprintf(j->name, sizeof j->name, "%s", eng);
	}
	return j;
}

struct cmd_ctx {
	bool ok;
	char msg[300];
};

static void on_cmd(void *arg, const struct baton_msg *rep)
{
	struct cmd_ctx *c = arg;
	c->ok = rep->ok;
	if (!rep->ok)
		snprintf(c->msg, sizeof c->msg, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
}

void *door_refill_thread(void *arg)
{
	struct refill_job *j = arg;
	struct broker_door *d = j->d;
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_REFILL);
	m.name = j->name;
	proto_set(&m, PF_NAME);
	char why[96];
	snprintf(why, sizeof why, "front door: requests wait for its model");
	m.reason = why;
	proto_set(&m, PF_REASON);
	struct cmd_ctx c = { 0 };
	double t0 = baton_now_s();
	broker_call(d->b, &m, on_cmd, &c);
	double refill_ms = (baton_now_s() - t0) * 1e3;
	door_refresh(d); /* the victim's release and the target's state, before anything is forwarded */
	pthread_mutex_lock(&d->mu);
	struct ddev *v = door_dev(d, j->gpu);
	struct deng *e = door_eng(d, j->name);
	char model[BROKER_NAME_MAX] = "";
	if (e)
		snprintf(model, sizeof model, "%s", e->model);
	int mi = e ? door_model(d, model, false) : -1;
	char reason[600];
	double total_ms = v ? (baton_now_s() - v->sw_t0) * 1e3 : refill_ms;
	double drain_ms = v ? (v->drained_at - v->sw_t0) * 1e3 : 0;
	char from[BROKER_NAME_MAX] = "";
	if (v)
		snprintf(from, sizeof from, "%s", v->from);
	bool counted = *from && strcmp(from, j->name) != 0;
	if (c.ok && v) {
		snprintf(v->holder, sizeof v->holder, "%s", j->name);
		v->holder_since = baton_now_s();
		if (counted) {
			v->switches++;
			d->switches_total++;
			door_hist_add(&d->sw_drain, drain_ms / 1e3);
			door_hist_add(&d->sw_refill, refill_ms / 1e3);
		}
	}
	if (c.ok) {
		if (mi >= 0)
			for (struct dreq *q = d->models[mi].qh; q; q = q->next)
				q->refill_ms += refill_ms;
		char what[2 * BROKER_NAME_MAX + 16];
		if (counted)
			snprintf(what, sizeof what, "switch %s -> %s", from, j->name);
		else
			snprintf(what, sizeof what, "refill %s", j->name);
		snprintf(reason, sizeof reason, "%s (model %s): drain %.1f ms, refill %.1f ms, %u waiting", what,
		    model, drain_ms, refill_ms, mi >= 0 ? d->models[mi].queued : 0);
	} else {
		snprintf(reason, sizeof reason, "refill of %s (model %s) failed after %.1f ms: %s", j->name, model,
		    refill_ms, c.msg);
	}
	if (v) {
		v->switching = v->refilling = false;
		v->target[0] = v->from[0] = 0;
	}
	/* A failed refill answers its model's waiting requests: the broker
	 * said why, and waiting longer would only wait for the same no. */
	struct dreq *fail = NULL;
	if (!c.ok && mi >= 0) {
		fail = d->models[mi].qh;
		d->models[mi].failed += d->models[mi].queued;
		d->models[mi].qh = d->models[mi].qt = NULL;
		d->models[mi].queued = 0;
		d->models[mi].queue_told = false;
	}
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	broker_emit(d->b, c.ok ? "door.switch" : "door.refill_failed", j->name, reason, total_ms, 0);
	for (struct dreq *q = fail, *nx; q; q = nx) {
		nx = q->next;
		door_reply_error(q->r, 503, "server_error", NULL, "device_busy", "1",
		    "cannot get device memory for model '%s': %s", model, c.msg);
		door_dreq_free(q);
	}
	free(j);
	door_helper_done(d);
	return NULL;
}
