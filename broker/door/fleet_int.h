/*
 * fleet_int.h: what fleet.c (the supervisor: arenas, children, restarts)
 * and fleet_view.c (what /v1/models and /metrics say of the fleet) share.
 * Locking as fleet.c says: f->mu guards the models.
 */
#ifndef BATON_BROKER_DOOR_FLEET_INT_H
#define BATON_BROKER_DOOR_FLEET_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include "broker/door/door_int.h"

#define LOG_LINES 24
#define START_NB 12             /* the start histogram's buckets */

static const double start_le[START_NB] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120 };

enum fstate { FS_STOPPED, FS_ARENA, FS_STARTING, FS_RUNNING, FS_STOPPING, FS_DOWN, FS_FAILED };

struct child {
	pid_t pid;
	int pidfd, outfd;       /* -1: none */
	char part[512];         /* a line not ended yet */
	size_t partn;
};

struct fmodel {
	bool used;
	struct broker_model_conf conf;
	struct broker_model_conf next;  /* a changed section, taken when the engine is stopped */
	bool have_next, removed;
	enum fstate st;
	struct child eng, tool;
	bool wanted;                    /* a request waits for it */
	bool idle_stop;                 /* stopping after stop_after_s (drop_arena applies) */
	double t_start, restart_at, term_at, ready_ms, running_since;
	double crash_t[64];
	unsigned n_crash;
	uint64_t starts, crashes, idle_stops;
	struct baton_hist h_arena, h_engine;  /* the parts of each start */
	double t_arena;
	char log[LOG_LINES][256];
	unsigned log_n;
	char why[2048];                 /* failed: why, with the last lines */
	char arena[BROKER_PATH_MAX + 160];
};

struct door_fleet {
	struct broker_door *d;
	pthread_mutex_t mu;
	pthread_t th;
	bool have_th, stop;
	int wake[2];
	char engine[BROKER_PATH_MAX], tool[BROKER_PATH_MAX], arena_dir[BROKER_PATH_MAX], run_dir[BROKER_PATH_MAX];
	char broker_url[BROKER_URL_MAX];
	unsigned restart_max;
	double restart_window_s;
	bool access_log;                /* [broker] access_log: false gives engines --no-access-log */
	struct fmodel m[BROKER_MAX_MODELS];
};

#endif
