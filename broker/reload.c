/*
 * reload.c: a new configuration for a running broker (SIGHUP in
 * baton-broker). The program reads and checks the file; only a good one
 * comes here. The decision thread alone reads the configuration, so the
 * new one is handed to it as an inbox item and applied between two
 * decisions: engines, their memory and operations in progress stay as
 * they are; what the file decides (policies, pins, per-engine and
 * per-device settings, the timers) counts from the next decision.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker_int.h"

/* Decision thread: takes the reloadable parts of *next. The sockets, the
 * HTTP server, NVML and the state file stay as they were opened (a
 * restart changes them); a change there is named in the log. */
void br_apply_config(struct broker *b, const struct broker_config *next, char *msg, size_t n)
{
	struct broker_config *c = &b->cfg;
	/* what differs but stays until a restart (names short enough for kept) */
	char kept[128] = "";
	const struct {
		bool differs;
		const char *what;
	} fixed[] = {
		{ strcmp(c->control, next->control) != 0, "control" },
		{ strcmp(c->events, next->events) != 0, "events" },
		{ strcmp(c->http, next->http) != 0 || strcmp(c->http_hosts, next->http_hosts) != 0 ||
		    (next->http_token[0] && strcmp(c->http_token, next->http_token) != 0), "http" },
		{ c->nvml != next->nvml, "nvml" },
		{ next->state_file_set && strcmp(c->state_file, next->state_file) != 0, "state_file" },
	};
	for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
		if (!fixed[i].differs)
			continue;
		if (kept[0])
			strcat(kept, ", ");
		strcat(kept, fixed[i].what);
	}
	c->heartbeat_timeout_ms = next->heartbeat_timeout_ms;
	c->idle_release_s = next->idle_release_s;
	c->door_keep_alive_s = next->door_keep_alive_s; /* idle release of the door's engines */
	c->acquire_wait_ms = next->acquire_wait_ms;
	c->command_timeout_ms = next->command_timeout_ms;
	c->n_gpus = next->n_gpus;
	memcpy(c->gpus, next->gpus, next->n_gpus * sizeof c->gpus[0]);
	c->n_engines = next->n_engines;
	memcpy(c->engines, next->engines, next->n_engines * sizeof c->engines[0]);
	/* Devices known already take their new sections now (new ones read
	 * theirs when they come, br_gpu_find_or_add). A larger reserve takes
	 * nothing back: it is kept free from the next grant on. */
	for (size_t i = 0; i < b->n_gpus; i++) {
		struct gpu *g = &b->gpus[i];
		const struct broker_gpu_conf *gc = broker_config_gpu(c, g->uuid);
		g->reserve = gc ? gc->reserve_bytes : 0;
		g->cap = gc ? gc->total_bytes : 0;
		g->no_lend = gc ? gc->no_lend : false;
	}
	snprintf(msg, n, "%zu device and %zu engine sections; idle_release_s %g, acquire_wait_ms %d, "
	    "heartbeat_timeout_ms %d, command_timeout_ms %d%s%s", c->n_gpus, c->n_engines,
	    c->idle_release_s, c->acquire_wait_ms, c->heartbeat_timeout_ms, c->command_timeout_ms,
	    kept[0] ? "; unchanged until a restart: " : "", kept);
	br_blog("configuration reloaded: %s", msg);
	br_publish(b, "reload", NULL, msg, -1, 0);
}

int broker_reload(struct broker *b, const struct broker_config *next, char *msg, size_t n)
{
	struct waiter w;
	br_waiter_init(&w);
	struct item *it = calloc(1, sizeof *it);
	if (!it) {
		snprintf(msg, n, "out of memory");
		br_waiter_fini(&w);
		return BATON_ENOMEM;
	}
	it->kind = IT_RELOAD;
	it->w = &w;
	it->cfg = next;
	int rc = br_post_live(b, it);
	if (rc == 0) {
		br_waiter_wait(&w);
		snprintf(msg, n, "%s", w.rb.text);
		rc = w.rb.m.err;
	} else {
		free(it);
		snprintf(msg, n, "the broker is shutting down");
	}
	br_waiter_fini(&w);
	return rc;
}
