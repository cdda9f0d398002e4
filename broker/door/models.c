/*
 * models.c: GET /v1/models: every model an engine serves, with its state
 * (resident, partial, released: like `ollama ps`), its engines and how
 * many of its requests wait (door_int.h).
 */
#include <pthread.h>
#include <string.h>

#include <jansson.h>

#include "broker/door/door_int.h"
#include "http/http.h"

/* Under d->mu. */
static json_t *models_json(struct broker_door *d)
{
	json_t *data = json_array();
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		json_t *engs = json_array();
		bool any = false, res = false, part = false;
		for (size_t i = 0; i < d->n_eng; i++) {
			struct deng *e = &d->eng[i];
			if (strcmp(e->model, m->name) != 0)
				continue;
			any = true;
			int holds = baton_state_holds(baton_state_parse(e->state), e->resident, e->ceiling);
			res |= holds == BATON_HOLDS_WHOLE;
			part |= holds == BATON_HOLDS_PART;
			json_array_append_new(engs, json_pack("{s:s, s:s, s:s, s:I, s:I, s:i}", "name", e->name,
			    "gpu", e->gpu, "state", e->state, "resident", (json_int_t)e->resident, "ceiling",
			    (json_int_t)e->ceiling, "in_flight", (int)door_inflight(d, e->name)));
		}
		const char *fst = NULL;
		json_t *fl = door_fleet_json(d->fleet, m->name, &fst);
		if (!any && !fl) {
			json_decref(engs);
			continue;
		}
		/* a [model] whose engine does not serve now says why: stopped,
		 * starting (its arena or its engine), down (crashed, restarting), failed */
		const char *state = any ? (res ? "resident" : part ? "partial" : "released") : fst;
		if (fl && strcmp(fst, "running") != 0 && strcmp(fst, "stopping") != 0)
			state = fst;
		json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:o, s:i}", "id", m->name, "object",
		    "model", "created", 0, "owned_by", "baton", "state", state, "engines", engs, "queued", (int)m->queued);
		json_object_set_new(o, "requests", json_pack("{s:I, s:I, s:I, s:I, s:I}", "served", (json_int_t)m->served,
		    "failed", (json_int_t)m->failed, "queue_full", (json_int_t)m->rejected_full, "client_error",
		    (json_int_t)m->client_error, "gone", (json_int_t)m->gone));
		/* the serving metrics' sums (the dashboard's tokens per second and
		 * mean time to first token) */
		const struct baton_hist *tt = &m->sv.h[BATON_SV_TTFT];
		json_object_set_new(o, "serving", json_pack("{s:I, s:I, s:I, s:f}", "prompt_tokens",
		    (json_int_t)m->sv.c[BATON_SV_PROMPT_TOKENS], "generation_tokens",
		    (json_int_t)m->sv.c[BATON_SV_GEN_TOKENS], "ttft_count", (json_int_t)tt->count, "ttft_sum_s", tt->sum));
		if (fl)
			json_object_set_new(o, "fleet", fl);
		json_array_append_new(data, o);
	}
	/* the [model] sections no request named yet */
	static char names[BROKER_MAX_MODELS][BROKER_NAME_MAX];
	size_t n = door_fleet_names(d->fleet, names, BROKER_MAX_MODELS);
	for (size_t i = 0; i < n; i++) {
		if (door_model(d, names[i], false) >= 0)
			continue;
		const char *fst = NULL;
		json_t *fl = door_fleet_json(d->fleet, names[i], &fst);
		if (!fl)
			continue;
		json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:[], s:i}", "id", names[i], "object", "model",
		    "created", 0, "owned_by", "baton", "state", fst, "engines", "queued", 0);
		json_object_set_new(o, "fleet", fl);
		json_array_append_new(data, o);
	}
	return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

void door_on_models(void *arg, struct baton_http_req *r)
{
	struct broker_door *d = arg;
	if (!door_start_dispatch(d)) {
		door_reply_error(r, 503, "server_error", NULL, NULL, "1", "the front door cannot start its thread");
		return;
	}
	pthread_mutex_lock(&d->mu);
	bool fresh = d->have_status && !d->stale;
	pthread_mutex_unlock(&d->mu);
	if (!fresh)
		door_refresh(d);
	pthread_mutex_lock(&d->mu);
	json_t *j = models_json(d);
	pthread_mutex_unlock(&d->mu);
	http_reply_json(r, 200, j);
}
