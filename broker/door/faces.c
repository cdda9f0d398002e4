/*
 * faces.c: Ollama's API on the front door (door_int.h;
 * docs/reference/ollama-anthropic.md). GET /api/version, /api/tags and
 * /api/ps are the door's own answers, from its view of the engines (as
 * GET /v1/models); POST /api/chat, /api/generate and /api/show go to
 * the model's engine as a completion does (intake.c), which answers them
 * in Ollama's shapes. Anthropic's /v1/messages is routed the same way
 * (door.c). Errors under /api/ are Ollama's {"error": "..."} (http/'s
 * http_face_error).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "broker/door/door_int.h"
#include "http/http.h"

static void now_rfc3339(char *out, size_t n)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char day[32];
	strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, n, "%s.%09ldZ", day, ts.tv_nsec);
}

/* Under d->mu: /api/tags (every model the door serves or may start) or
 * /api/ps (those an engine holds on its device now, whole or in part). */
static json_t *list_json(struct broker_door *d, bool ps)
{
	json_t *models = json_array();
	char when[64], dg[65];
	now_rfc3339(when, sizeof when);
	static char names[BROKER_MAX_ENGINES + BROKER_MAX_MODELS][BROKER_NAME_MAX];
	size_t n = door_list_names(d, names, BROKER_MAX_ENGINES + BROKER_MAX_MODELS);
	for (size_t k = 0; k < n; k++) {
		uint64_t size = 0, vram = 0;
		bool any = false;
		for (size_t i = 0; i < d->n_eng; i++) {
			struct deng *e = &d->eng[i];
			if (strcmp(e->model, names[k]) != 0)
				continue;
			any = true;
			size = e->ceiling > size ? e->ceiling : size;
			vram = e->resident > vram ? e->resident : vram;
		}
		const char *fst = NULL;
		json_t *fl = door_fleet_json(d->fleet, names[k], &fst);
		json_decref(fl);
		if (!any && !fl)
			continue;
		if (ps && vram == 0)
			continue;
		http_name_digest(names[k], dg);
		json_t *x = json_pack("{s:s, s:s, s:I, s:s, s:{s:s, s:s, s:s, s:[], s:s, s:s}}", "name", names[k], "model",
		    names[k], "size", (json_int_t)size, "digest", dg, "details", "parent_model", "", "format",
		    "baton-arena", "family", "", "families", "parameter_size", "", "quantization_level", "");
		if (ps) {
			/* the release is the broker's (keep_alive_s): no time to say */
			json_object_set_new(x, "expires_at", json_string("2262-04-11T23:47:16.854775807Z"));
			json_object_set_new(x, "size_vram", json_integer((json_int_t)vram));
		} else {
			json_object_set_new(x, "modified_at", json_string(when));
		}
		json_array_append_new(models, x);
	}
	return json_pack("{s:o}", "models", models);
}

static json_t *tags_json(struct broker_door *d)
{
	return list_json(d, false);
}

static json_t *ps_json(struct broker_door *d)
{
	return list_json(d, true);
}

#define WANT_POST "{\"error\":\"method not allowed: want POST\"}"
#define WANT_GET "{\"error\":\"method not allowed: want GET\"}"

void door_on_ollama(void *arg, struct baton_http_req *r)
{
	struct broker_door *d = arg;
	const char *p = http_req_path(r), *m = http_req_method(r);
	bool get = strcmp(m, "GET") == 0 || strcmp(m, "HEAD") == 0;
	if (strcmp(p, "/api/chat") == 0 || strcmp(p, "/api/generate") == 0 || strcmp(p, "/api/show") == 0) {
		if (get) {
			static const char *const allow[] = { "Allow: POST", NULL };
			http_reply(r, 405, "application/json", WANT_POST, strlen(WANT_POST), allow);
			return;
		}
		door_on_completion(d, r);
		return;
	}
	bool tags = strcmp(p, "/api/tags") == 0, ps = strcmp(p, "/api/ps") == 0, ver = strcmp(p, "/api/version") == 0;
	if (!tags && !ps && !ver) {
		door_reply_error(r, 404, "invalid_request_error", NULL, "not_found", NULL, "%.200s is not served here: the "
		    "front door serves Ollama's chat, generate, show, tags, ps and version (it pulls, copies and "
		    "deletes no models)", p);
		return;
	}
	if (!get) {
		static const char *const allow[] = { "Allow: GET", NULL };
		http_reply(r, 405, "application/json", WANT_GET, strlen(WANT_GET), allow);
		return;
	}
	if (ver) {
		http_reply_json(r, 200, json_pack("{s:s}", "version", HTTP_OLLAMA_VERSION));
		return;
	}
	/* a list shows what it shows to whoever may read /v1/models */
	door_reply_list(d, r, ps ? ps_json : tags_json);
}
