/*
 * fleet_view.c: what the views say of the fleet's models: their part of
 * /v1/models and their Prometheus lines (door_int.h; the supervisor that
 * makes these states is fleet.c). Called under d->mu; takes f->mu.
 */
#include <stdio.h>
#include <string.h>

#include "broker/door/fleet_int.h"

static const char *const state_names[] = { "stopped", "arena", "starting", "running", "stopping", "down",
	"failed" };

/* ---- views: /v1/models and /metrics (under d->mu) ------------------------------- */

json_t *door_fleet_json(struct door_fleet *f, const char *name, const char **state)
{
	if (!f)
		return NULL;
	pthread_mutex_lock(&f->mu);
	struct fmodel *m = NULL;
	for (size_t i = 0; i < BROKER_MAX_MODELS && !m; i++)
		if (f->m[i].used && !f->m[i].removed && strcmp(f->m[i].conf.name, name) == 0)
			m = &f->m[i];
	json_t *j = NULL;
	if (m) {
		json_t *al = json_array();
		char buf[256];
		snprintf(buf, sizeof buf, "%s", m->conf.aliases);
		char *save = NULL;
		for (char *t = strtok_r(buf, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save))
			json_array_append_new(al, json_string(t));
		const char *st = state_names[m->st];
		if (m->st == FS_ARENA)
			st = "starting";
		if (state)
			*state = st;
		char device[48];
		snprintf(device, sizeof device, "%s:%d", m->conf.backend, m->conf.device);
		j = json_pack("{s:s, s:o, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:f}", "state", st, "aliases", al,
		    "source", m->conf.source, "device", device, "arena", m->arena[0] ? m->arena : "",
		    "pid", (json_int_t)(m->eng.pid > 0 ? m->eng.pid : 0), "starts", (json_int_t)m->starts,
		    "crashes", (json_int_t)m->crashes, "idle_stops", (json_int_t)m->idle_stops,
		    "stop_after_s", m->conf.stop_after_s);
		if (m->st == FS_ARENA)
			json_object_set_new(j, "phase", json_string("arena"));
		if (m->st == FS_FAILED)
			json_object_set_new(j, "error", json_string(m->why));
		if (m->ready_ms > 0)
			json_object_set_new(j, "start_ms", json_real(m->ready_ms));
		json_t *lines = json_array();
		for (unsigned i = 0; i < m->log_n; i++)
			json_array_append_new(lines, json_string(m->log[i]));
		json_object_set_new(j, "log", lines);
	}
	pthread_mutex_unlock(&f->mu);
	return j;
}

size_t door_fleet_names(struct door_fleet *f, char (*names)[BROKER_NAME_MAX], size_t max)
{
	if (!f)
		return 0;
	size_t n = 0;
	pthread_mutex_lock(&f->mu);
	for (size_t i = 0; i < BROKER_MAX_MODELS && n < max; i++)
		if (f->m[i].used && !f->m[i].removed)
			snprintf(names[n++], BROKER_NAME_MAX, "%s", f->m[i].conf.name);
	pthread_mutex_unlock(&f->mu);
	return n;
}

void door_fleet_metrics(struct door_fleet *f, FILE *out)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	baton_prom_family(out, "baton_fleet_model_state", "gauge",
	    "Fleet: 1 for the state each [model] is in (stopped, starting, running, stopping, down, failed).");
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		const struct fmodel *m = &f->m[i];
		if (!m->used || m->removed)
			continue;
		static const char *shown[] = { "stopped", "starting", "running", "stopping", "down", "failed" };
		const char *cur = m->st == FS_ARENA ? "starting" : state_names[m->st];
		for (size_t k = 0; k < sizeof shown / sizeof shown[0]; k++)
			baton_prom_u64(out, "baton_fleet_model_state",
			    (const char *[]){ "model", m->conf.name, "state", shown[k], NULL }, strcmp(cur, shown[k]) == 0);
	}
	const char *fam[3] = { "baton_fleet_engine_starts_total", "baton_fleet_engine_crashes_total",
		"baton_fleet_engine_idle_stops_total" };
	const char *help[3] = { "Fleet: engines the broker started, per model.",
		"Fleet: engines that exited without being asked, per model.",
		"Fleet: engines stopped after stop_after_s idle, per model." };
	for (int k = 0; k < 3; k++) {
		baton_prom_family(out, fam[k], "counter", help[k]);
		for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
			const struct fmodel *m = &f->m[i];
			if (!m->used || m->removed)
				continue;
			baton_prom_u64(out, fam[k], (const char *[]){ "model", m->conf.name, NULL },
			    k == 0 ? m->starts : k == 1 ? m->crashes : m->idle_stops);
		}
	}
	baton_prom_family(out, "baton_fleet_start_seconds", "histogram", "Fleet: the parts of each start of a "
	    "model: arena (baton-arena create, a few ms when it reuses one), engine (spawned until registered).");
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		const struct fmodel *m = &f->m[i];
		if (!m->used || m->removed)
			continue;
		baton_prom_hist(out, "baton_fleet_start_seconds", (const char *[]){ "model", m->conf.name, "phase", "arena",
		    NULL }, start_le, START_NB, &m->h_arena);
		baton_prom_hist(out, "baton_fleet_start_seconds", (const char *[]){ "model", m->conf.name, "phase",
		    "engine", NULL }, start_le, START_NB, &m->h_engine);
	}
	pthread_mutex_unlock(&f->mu);
}
