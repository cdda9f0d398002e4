/*
 * intake.c: a completion request in (door_int.h): POST
 * /v1/chat/completions and /v1/completions (and /v1/responses, vLLM's
 * /tokenize and /detokenize, routed by their model the same way), on the
 * HTTP server's thread.
 * Its token and body are checked (a JSON object with a `model` the core
 * says an engine serves, `stream` a boolean; a previous_response_id the
 * door knows pins it to the engine that keeps it), it joins its model's queue
 * (at most door_queue_max wait; more: 503 queue_full) and the dispatch
 * thread takes it from there.
 *
 * A client that leaves: on_gone gets the door (its owner, alive until
 * after the HTTP server closed) and finds the request by id (a stale id
 * finds nothing), so it never holds a pointer to a request that may have
 * been freed.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "broker/door/door_int.h"
#include "http/http.h"

/* The dispatch thread starts with the first request: it talks to the
 * broker (broker_call), which serves only once started, and a broker
 * that fails to start must be able to close its faces. */
bool door_start_dispatch(struct broker_door *d)
{
	pthread_mutex_lock(&d->mu);
	if (!d->have_th && !d->stop && pthread_create(&d->th, NULL, door_dispatch, d) == 0)
		d->have_th = true;
	bool ok = d->have_th;
	pthread_mutex_unlock(&d->mu);
	return ok;
}

static void on_gone(void *owner, uint64_t id)
{
	struct broker_door *d = owner;
	pthread_mutex_lock(&d->mu);
	bool found = false;
	for (struct dreq *q = d->fwd; q && !found; q = q->next)
		if (q->id == id) {
			q->gone = found = true;
			door_up_cancel(q->up); /* the engine sees the close and frees its sequence */
		}
	for (size_t mi = 0; mi < d->n_models && !found; mi++)
		for (struct dreq *q = d->models[mi].qh; q && !found; q = q->next)
			if (q->id == id)
				q->gone = found = true;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

/* Whether an engine serves the model, from a view no older than the last
 * event (read again when an event came since). */
static bool served(struct broker_door *d, const char *model)
{
	pthread_mutex_lock(&d->mu);
	bool fresh = d->have_status && !d->stale;
	bool yes = d->have_status && door_served(d, model);
	pthread_mutex_unlock(&d->mu);
	if (yes || fresh)
		return yes;
	door_refresh(d);
	pthread_mutex_lock(&d->mu);
	yes = door_served(d, model);
	pthread_mutex_unlock(&d->mu);
	return yes;
}

/* The other APIs' paths, forwarded to the model's engine as they came:
 * Ollama's (faces.c) and Anthropic's. */
static const char *const faces[] = { "/api/chat", "/api/generate", "/api/show", "/v1/messages",
	"/v1/messages/count_tokens", NULL };

void door_on_completion(void *arg, struct baton_http_req *r)
{
	struct broker_door *d = arg;
	const char *path = http_req_path(r);
	bool chat = strcmp(path, "/v1/chat/completions") == 0;
	bool ollama = strncmp(path, "/api/", 5) == 0;
	if (!door_start_dispatch(d)) {
		door_reply_error(r, 503, "server_error", NULL, NULL, "1", "the front door cannot start its thread");
		return;
	}
	if (!http_req_authorized(r)) {
		door_reply_error(r, 401, "invalid_request_error", NULL, "invalid_api_key", NULL,
		    "the broker's token is needed (pass it as the API key: Authorization: Bearer TOKEN)");
		return;
	}
	size_t len;
	const char *body = http_req_body(r, &len);
	json_error_t je;
	json_t *j = body ? json_loadb(body, len, 0, &je) : NULL;
	if (!j || !json_is_object(j)) {
		door_reply_error(r, 400, "invalid_request_error", NULL, NULL, NULL, "the body is not a JSON object%s%s",
		    j ? "" : ": ", j ? "" : je.text);
		json_decref(j);
		return;
	}
	json_t *jm = json_object_get(j, "model");
	json_t *js = json_object_get(j, "stream");
	if (ollama && (!json_is_string(jm) || !json_string_length(jm)))
		jm = json_object_get(j, "name"); /* Ollama's older name of the field */
	if (!json_is_string(jm) || json_string_length(jm) == 0 || json_string_length(jm) >= BROKER_NAME_MAX) {
		json_decref(j);
		door_reply_error(r, 400, "invalid_request_error", "model", NULL, NULL, "%s", ollama ? "model is required" :
		    "'model' must be a model's name");
		return;
	}
	if (js && !json_is_boolean(js)) {
		json_decref(j);
		door_reply_error(r, 400, "invalid_request_error", "stream", NULL, NULL, "'stream' must be true or false");
		return;
	}
	char model[BROKER_NAME_MAX], prev[DOOR_STORED_ID_MAX] = "";
	snprintf(model, sizeof model, "%s", json_string_value(jm));
	json_t *jp = strcmp(path, "/v1/responses") == 0 ? json_object_get(j, "previous_response_id") : NULL;
	if (json_is_string(jp) && json_string_length(jp) < sizeof prev)
		snprintf(prev, sizeof prev, "%s", json_string_value(jp));
	/* Ollama streams unless told not to; its clients name a model NAME:latest */
	bool stream = json_is_true(js) || (ollama && !js && strcmp(path, "/api/show") != 0);
	size_t ml = strlen(model);
	if (ollama && ml > 7 && strcmp(model + ml - 7, ":latest") == 0)
		model[ml - 7] = 0;
	/* a [model] of the fleet, by its name or an alias: its engine may not
	 * run yet (it is started, and the request waits for it) */
	char canon[BROKER_NAME_MAX], why[2048] = "";
	pthread_mutex_lock(&d->mu);
	int fl = door_fleet_resolve(d->fleet, model, canon, sizeof canon, why, sizeof why);
	pthread_mutex_unlock(&d->mu);
	char *own = NULL;
	if (fl >= 0 && strcmp(canon, model) != 0) {
		/* an alias: the engine knows its model by the name */
		json_object_set_new(j, "model", json_string(canon));
		own = json_dumps(j, JSON_COMPACT);
		if (!own) {
			json_decref(j);
			door_reply_error(r, 503, "server_error", NULL, NULL, "1", "out of memory");
			return;
		}
		body = own;
		len = strlen(own);
		snprintf(model, sizeof model, "%s", canon);
	}
	json_decref(j);
	if (fl == 1) {
		free(own);
		door_access_refused(d, model, 503, 0, false);
		door_reply_error(r, 503, "server_error", "model", "model_failed", "30",
		    "model '%s' failed and is not restarted until the configuration is reloaded: %s", model, why);
		return;
	}

	if (fl < 0 && !served(d, model)) {
		door_access_refused(d, model, 404, 0, false);
		door_reply_error(r, 404, "invalid_request_error", "model", "model_not_found", NULL,
		    ollama ? "model '%s' not found (GET /api/tags lists those the front door serves)" :
		    "The model '%s' does not exist (GET /v1/models lists those the broker serves)", model);
		return;
	}
	/* previous_response_id: the conversation is kept by the engine that
	 * made it (stored.c); one the door does not know goes by its model,
	 * and that engine says whether it keeps it */
	char pin[BROKER_NAME_MAX] = "", pmodel[BROKER_NAME_MAX] = "";
	pthread_mutex_lock(&d->mu);
	if (*prev && door_stored_get(d->stored, prev, pmodel, sizeof pmodel, pin, sizeof pin) &&
	    strcmp(pmodel, model) != 0) {
		pthread_mutex_unlock(&d->mu);
		free(own);
		door_access_refused(d, model, 400, 0, false);
		door_reply_error(r, 400, "invalid_request_error", "previous_response_id", NULL, NULL,
		    "response '%s' was made by model '%s', whose engine keeps its conversation: continue it with "
		    "that model", prev, pmodel);
		return;
	}
	int mi = door_model(d, model, fl >= 0);
	if (mi < 0) {
		pthread_mutex_unlock(&d->mu);
		free(own);
		door_reply_error(r, 503, "server_error", NULL, NULL, "1", "the front door knows too many models");
		return;
	}
	struct dmodel *m = &d->models[mi];
	if (m->queued >= d->queue_max) {
		m->rejected_full++;
		unsigned qm = d->queue_max;
		pthread_mutex_unlock(&d->mu);
		free(own);
		door_access_refused(d, model, 503, 0, false);
		door_reply_error(r, 503, "server_error", NULL, "queue_full", "1",
		    "model '%s' has %u requests waiting already; try again", model, qm);
		return;
	}
	uint64_t q_id = ++d->next_id;
	pthread_mutex_unlock(&d->mu);
	struct dreq *q = calloc(1, sizeof *q);
	if (!q) {
		free(own);
		door_reply_error(r, 503, "server_error", NULL, NULL, "1", "out of memory");
		return;
	}
	q->id = q_id;
	q->r = r;
	q->d = d;
	q->model = mi;
	q->path = chat ? "/v1/chat/completions" : strcmp(path, "/tokenize") == 0 ? "/tokenize" :
	    strcmp(path, "/detokenize") == 0 ? "/detokenize" : strcmp(path, "/v1/responses") == 0 ? "/v1/responses" :
	    "/v1/completions";
	q->body = body;
	q->own_body = own;
	snprintf(q->pin, sizeof q->pin, "%s", pin);
	q->len = len;
	q->stream = stream;
	for (size_t i = 0; faces[i]; i++) /* Ollama's and Anthropic's go on as they came */
		if (strcmp(path, faces[i]) == 0)
			q->path = faces[i];
	q->t_in = baton_now_s();
	/* before anyone else may answer it: a client that leaves from here on
	 * is seen (by id; a request not queued yet is looked for in vain, and
	 * its proxy then sees the client gone when it writes) */
	http_req_on_gone(r, on_gone, d, q_id);
	pthread_mutex_lock(&d->mu);
	m = &d->models[mi];
	if (m->qt)
		m->qt->next = q;
	else
		m->qh = q;
	m->qt = q;
	m->queued++;
	m->last_active = q->t_in;
	q->unserved = !door_served(d, model);
	if (fl >= 0)
		door_fleet_want(d->fleet, model);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}
