/*
 * status_json.c: a status reply as JSON, the one encoder behind the CLI's
 * `baton status --json` and the HTTP API's GET /v1/status.
 */
#include <string.h>

#include <jansson.h>

#include "broker/broker.h"

static json_t *jint(uint64_t v)
{
	return json_integer((json_int_t)v);
}

json_t *broker_gpu_json(const struct proto_gpu *g)
{
	json_t *j = json_object();
	json_object_set_new(j, "index", jint(g->index));
	json_object_set_new(j, "name", json_string(g->name ? g->name : ""));
	json_object_set_new(j, "uuid", json_string(g->uuid));
	json_object_set_new(j, "total", jint(g->total));
	json_object_set_new(j, "free", jint(g->free_bytes));
	json_object_set_new(j, "used", jint(g->total > g->free_bytes ? g->total - g->free_bytes : 0));
	json_object_set_new(j, "held", jint(g->held));
	json_object_set_new(j, "reserve", jint(g->reserve));
	json_object_set_new(j, "lent", jint(g->lent));
	json_object_set_new(j, "kv", jint(g->kv));
	return j;
}

const char *broker_entry_kind(const struct proto_engine_info *e)
{
	if (e->ctl && strcmp(e->ctl, "lease") == 0)
		return "lease";
	if (e->ctl && strncmp(e->ctl, "external:", 9) == 0)
		return "external";
	return "engine";
}

json_t *broker_engine_json(const struct proto_engine_info *e)
{
	json_t *j = json_object();
	json_object_set_new(j, "kind", json_string(broker_entry_kind(e)));
	if (e->ctl && strncmp(e->ctl, "external:", 9) == 0) {
		json_object_set_new(j, "release_by", json_string(e->ctl + 9)); /* hook, park, none */
		json_object_set_new(j, "parked", json_boolean(strcmp(e->state, "parked") == 0));
	}
	json_object_set_new(j, "name", json_string(e->name));
	json_object_set_new(j, "pid", jint(e->pid));
	json_object_set_new(j, "gpu", json_string(e->gpu));
	json_object_set_new(j, "model", json_string(e->model));
	json_object_set_new(j, "state", json_string(e->state));
	json_object_set_new(j, "resident", jint(e->resident));
	json_object_set_new(j, "floor", jint(e->floor));
	json_object_set_new(j, "ceiling", jint(e->ceiling));
	json_object_set_new(j, "priority", json_integer(e->priority));
	json_object_set_new(j, "pinned", json_boolean(e->pinned));
	json_object_set_new(j, "idle_ms", jint(e->idle_ms));
	json_object_set_new(j, "last_refill_gbps", json_real(e->last_refill_gbps));
	json_object_set_new(j, "peer_gpu", json_string(e->peer_gpu));
	json_object_set_new(j, "peer", jint(e->peer));
	json_object_set_new(j, "requests", jint(e->requests));
	json_object_set_new(j, "kv_blocks_used", jint(e->kv_used));
	json_object_set_new(j, "kv_blocks", jint(e->kv_total));
	json_object_set_new(j, "copied", jint(e->copied));
	json_object_set_new(j, "to_copy", jint(e->to_copy));
	json_object_set_new(j, "idle_release_ms", jint(e->idle_release_ms));
	json_object_set_new(j, "http", json_string(e->http ? e->http : ""));
	json_object_set_new(j, "kv", jint(e->kv));
	json_object_set_new(j, "prefix_prompt_tokens", jint(e->prefix_prompt));
	json_object_set_new(j, "prefix_cached_tokens", jint(e->prefix_cached));
	json_object_set_new(j, "prefix_hit_rate",
	    json_real(e->prefix_prompt ? (double)e->prefix_cached / (double)e->prefix_prompt : 0.0));
	json_object_set_new(j, "prefix_evictions", jint(e->prefix_evictions));
	json_object_set_new(j, "kv_host_bytes", jint(e->kv_host_bytes));
	return j;
}

json_t *broker_status_json(const struct baton_msg *rep)
{
	json_t *g = json_array(), *e = json_array(), *j = json_object();
	if (!g || !e || !j) {
		json_decref(g);
		json_decref(e);
		json_decref(j);
		return NULL;
	}
	for (uint32_t i = 0; i < rep->gpus.n; i++)
		json_array_append_new(g, broker_gpu_json(&rep->gpus.v[i]));
	for (uint32_t i = 0; i < rep->engines.n; i++)
		json_array_append_new(e, broker_engine_json(&rep->engines.v[i]));
	json_object_set_new(j, "epoch", jint(rep->epoch));
	json_object_set_new(j, "gpus", g);
	json_object_set_new(j, "engines", e);
	return j;
}
