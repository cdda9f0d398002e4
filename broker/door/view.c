/*
 * view.c: the engines and devices as the core says, and nothing else
 * (door_int.h).
 *
 * The door subscribes to the core's events (broker_observe). An event that
 * may change what an engine serves, its state or a device's memory marks
 * the view stale and wakes the dispatch thread, which reads the core's
 * status (broker_call) and makes that reply the view: the engines with
 * OpenAI HTTP, the devices, rebuilt whole at every read, so an engine gone
 * from the core is gone from the door. No timer asks, and the door never
 * writes a state of its own into the view: what a refill did shows in the
 * status the core gives after it.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "broker/door/door_int.h"

/* Events that change nothing the door reads: its own (door.*, which it
 * publishes), a refill's progress (many a second), a reload (its settings
 * come through broker_door_reload). */
static bool changes_view(const char *kind)
{
	return strncmp(kind, "door.", 5) != 0 && strncmp(kind, "fleet.", 6) != 0 && strcmp(kind, "progress") != 0 &&
	    strcmp(kind, "reload") != 0;
}

/* On the decision thread: quick, never calls into the broker. */
void door_on_event(void *arg, const struct baton_msg *ev)
{
	struct broker_door *d = arg;
	if (!changes_view(ev->kind ? ev->kind : ""))
		return;
	pthread_mutex_lock(&d->mu);
	d->stale = true;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

struct deng *door_eng(struct broker_door *d, const char *name)
{
	for (size_t i = 0; i < d->n_eng; i++)
		if (strcmp(d->eng[i].name, name) == 0)
			return &d->eng[i];
	return NULL;
}

struct ddev *door_dev(struct broker_door *d, const char *gpu)
{
	for (size_t i = 0; i < d->n_devs; i++)
		if (strcmp(d->devs[i].gpu, gpu) == 0)
			return &d->devs[i];
	return NULL;
}

int door_model(struct broker_door *d, const char *name, bool add)
{
	for (size_t i = 0; i < d->n_models; i++)
		if (strcmp(d->models[i].name, name) == 0)
			return (int)i;
	if (!add || d->n_models == BROKER_MAX_ENGINES)
		return -1;
	struct dmodel *m = &d->models[d->n_models];
	memset(m, 0, sizeof *m);
	snprintf(m->name, sizeof m->name, "%s", name);
	return (int)d->n_models++;
}

/* An elastic engine shrunk to nothing by a vram command still says
 * "ready": its bytes tell. */
bool door_ready(const struct deng *e)
{
	return baton_state_holds(baton_state_parse(e->state), e->resident, e->ceiling) == BATON_HOLDS_WHOLE;
}

bool door_served(struct broker_door *d, const char *model)
{
	for (size_t i = 0; i < d->n_eng; i++)
		if (strcmp(d->eng[i].model, model) == 0)
			return true;
	return false;
}

unsigned door_inflight(struct broker_door *d, const char *name)
{
	unsigned n = 0;
	for (const struct dreq *q = d->fwd; q; q = q->next)
		n += strcmp(q->eng, name) == 0;
	return n;
}

/* Under d->mu: the status reply becomes the view. Devices keep the
 * door's switch state across reads (by uuid); one gone from the status
 * that is not switching is dropped. */
static void apply_status(struct broker_door *d, const struct baton_msg *rep)
{
	double now = baton_now_s();
	d->n_eng = 0;
	for (uint32_t k = 0; k < rep->engines.n && d->n_eng < BROKER_MAX_ENGINES; k++) {
		const struct proto_engine_info *x = &rep->engines.v[k];
		if (!x->http || !*x->http || !baton_state_present(baton_state_parse(x->state)))
			continue;
		struct deng *e = &d->eng[d->n_eng++];
		memset(e, 0, sizeof *e);
		snprintf(e->name, sizeof e->name, "%s", x->name);
		snprintf(e->model, sizeof e->model, "%s", x->model);
		snprintf(e->gpu, sizeof e->gpu, "%s", x->gpu);
		snprintf(e->http, sizeof e->http, "%s", x->http);
		snprintf(e->state, sizeof e->state, "%s", x->state);
		e->resident = x->resident;
		e->ceiling = x->ceiling;
		e->pid = (int)x->pid;
		int mi = door_model(d, e->model, true);
		if (mi >= 0 && d->models[mi].served_since == 0)
			d->models[mi].served_since = now; /* its engine came (a start, a registration) */
	}
	for (size_t mi = 0; mi < d->n_models; mi++)
		if (!door_served(d, d->models[mi].name))
			d->models[mi].served_since = 0;
	struct ddev old[BROKER_MAX_GPUS];
	size_t n_old = d->n_devs;
	memcpy(old, d->devs, n_old * sizeof *old);
	d->n_devs = 0;
	for (uint32_t k = 0; k < rep->gpus.n && d->n_devs < BROKER_MAX_GPUS; k++) {
		const struct proto_gpu *g = &rep->gpus.v[k];
		struct ddev *v = &d->devs[d->n_devs++];
		memset(v, 0, sizeof *v);
		for (size_t i = 0; i < n_old; i++)
			if (strcmp(old[i].gpu, g->uuid) == 0) {
				*v = old[i];
				old[i].gpu[0] = 0;
			}
		snprintf(v->gpu, sizeof v->gpu, "%s", g->uuid);
		v->free_b = g->free_bytes;
		v->reserve = g->reserve;
	}
	for (size_t i = 0; i < n_old && d->n_devs < BROKER_MAX_GPUS; i++)
		if (old[i].gpu[0] && old[i].switching)
			d->devs[d->n_devs++] = old[i];
	/* an engine's device the status did not list: its own, no free memory known */
	for (size_t i = 0; i < d->n_eng && d->n_devs < BROKER_MAX_GPUS; i++)
		if (!door_dev(d, d->eng[i].gpu)) {
			struct ddev *v = &d->devs[d->n_devs++];
			memset(v, 0, sizeof *v);
			snprintf(v->gpu, sizeof v->gpu, "%s", d->eng[i].gpu);
		}
	d->have_status = true;
}

struct status_ctx {
	struct broker_door *d;
	bool ok;
};

static void on_status(void *arg, const struct baton_msg *rep)
{
	struct status_ctx *c = arg;
	if (!rep->ok)
		return;
	pthread_mutex_lock(&c->d->mu);
	apply_status(c->d, rep);
	pthread_mutex_unlock(&c->d->mu);
	c->ok = true;
}

bool door_refresh(struct broker_door *d)
{
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_STATUS);
	struct status_ctx c = { d, false };
	pthread_mutex_lock(&d->read_mu);
	pthread_mutex_lock(&d->mu);
	d->stale = false; /* an event from here on asks again */
	pthread_mutex_unlock(&d->mu);
	broker_call(d->b, &m, on_status, &c);
	if (!c.ok) {
		pthread_mutex_lock(&d->mu);
		d->stale = true;
		pthread_mutex_unlock(&d->mu);
	}
	pthread_mutex_unlock(&d->read_mu);
	return c.ok;
}
