/*
 * responses.c: GET and DELETE /v1/responses/{id} through the front door
 * (door_int.h). A stored response lives in the memory of the engine that
 * made it; stored.c says which one that is, from the answers the door
 * passed on. The request goes straight to that engine (no queue: the
 * engine answers from its memory whether its cache is filled or not),
 * with the token checked as for a POST. An id the door does not know, or
 * whose engine is gone (its memory with it), is 404 in OpenAI's shape.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/door/door_int.h"
#include "http/http.h"

#define PREFIX "/v1/responses/"

void door_on_stored(void *arg, struct baton_http_req *r)
{
	struct broker_door *d = arg;
	const char *path = http_req_path(r), *id = path + strlen(PREFIX);
	bool del = strcmp(http_req_method(r), "DELETE") == 0;
	if (!http_req_authorized(r)) {
		door_reply_error(r, 401, "invalid_request_error", NULL, "invalid_api_key", NULL,
		    "the broker's token is needed (pass it as the API key: Authorization: Bearer TOKEN)");
		return;
	}
	if (!door_stored_id_ok(id)) {
		/* input_items and the rest: the engines keep no more than the response */
		door_reply_error(r, 404, "invalid_request_error", NULL, "not_found", NULL,
		    "no such path: %.100s (a stored response is GET or DELETE /v1/responses/ID)", path);
		return;
	}
	char model[BROKER_NAME_MAX], eng[BROKER_NAME_MAX];
	pthread_mutex_lock(&d->mu);
	bool known = door_stored_get(d->stored, id, model, sizeof model, eng, sizeof eng);
	const struct deng *e = known ? door_eng(d, eng) : NULL;
	if (known && (!e || strcmp(e->model, model) != 0)) {
		door_stored_forget(d->stored, id); /* its engine went away, and its memory */
		known = false;
	}
	if (!known) {
		pthread_mutex_unlock(&d->mu);
		door_reply_error(r, 404, "invalid_request_error", NULL, "not_found", NULL,
		    "response '%s' is not kept (the front door knows the last %u stored responses it passed on, "
		    "while their engines run)", id, DOOR_STORED_MAX);
		return;
	}
	int mi = door_model(d, model, true);
	struct dreq *q = mi >= 0 ? calloc(1, sizeof *q) : NULL;
	if (!q) {
		pthread_mutex_unlock(&d->mu);
		door_reply_error(r, 503, "server_error", NULL, NULL, "1", "out of memory");
		return;
	}
	q->id = ++d->next_id;
	q->r = r;
	q->d = d;
	q->model = mi;
	q->path = path; /* r's, valid until it is answered */
	q->aside = true;
	q->del = del;
	q->t_in = baton_now_s();
	bool ok = door_forward(d, q, e);
	pthread_mutex_unlock(&d->mu);
	if (!ok) {
		door_reply_error(r, 503, "server_error", NULL, NULL, "1", "the broker cannot start a thread now");
		door_dreq_free(q);
	}
}
