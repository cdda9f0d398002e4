/*
 * models.c: GET /v1/models: every model an engine serves, with its state
 * (resident, partial, released: like `ollama ps`), its engines and how
 * many of its requests wait; the list's names and its reply, which
 * Ollama's lists share (faces.c) (door_int.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "broker/door/door_int.h"
#include "http/http.h"

size_t door_list_names(struct broker_door *d, char (*names)[BROKER_NAME_MAX], size_t max)
{
	size_t n = 0;
	for (size_t mi = 0; mi < d->n_models && n < max; mi++)
		snprintf(names[n++], BROKER_NAME_MAX, "%s", d->models[mi].name);
	static char fleet[BROKER_MAX_MODELS][BROKER_NAME_MAX];
	size_t nf = door_fleet_names(d->fleet, fleet, BROKER_MAX_MODELS);
	for (size_t i = 0; i < nf && n < max; i++)
		if (door_model(d, fleet[i], false) < 0)
			snprintf(names[n++], BROKER_NAME_MAX, "%s", fleet[i]);
	return n;
}

/* Under d->mu: a model's entry, NULL when it is not shown (no engine
 * serves it and no [model] has it). */
static json_t *model_json(struct broker_door *d, const char *name)
{
	const char *fst = NULL;
	json_t *fl = door_fleet_json(d->fleet, name, &fst);
	int mi = door_model(d, name, false);
	if (mi < 0) { /* a [model] section no request named yet */
		if (!fl)
			return NULL;
		json_t *o = json_pack("{s:s, s:s, s:i, s:s, s:s, s:[], s:i}", "id", name, "object", "model",
		    "created", 0, "owned_by", "baton", "state", fst, "engines", "queued", 0);
		json_object_set_new(o, "fleet", fl);
		return o;
	}
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
	if (!any && !fl) {
		json_decref(engs);
		return NULL;
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
	return o;
}

/* Under d->mu. */
static json_t *models_json(struct broker_door *d)
{
	json_t *data = json_array();
	static char names[BROKER_MAX_ENGINES + BROKER_MAX_MODELS][BROKER_NAME_MAX];
	size_t n = door_list_names(d, names, BROKER_MAX_ENGINES + BROKER_MAX_MODELS);
	for (size_t i = 0; i < n; i++) {
		json_t *o = model_json(d, names[i]);
		if (o)
			json_array_append_new(data, o);
	}
	return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

void door_reply_list(struct broker_door *d, struct baton_http_req *r, json_t *(*view)(struct broker_door *d))
{
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
	json_t *j = view(d);
	pthread_mutex_unlock(&d->mu);
	http_reply_json(r, 200, j);
}

void door_on_models(void *arg, struct baton_http_req *r)
{
	door_reply_list(arg, r, models_json);
}
