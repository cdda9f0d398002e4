/*
 * baton-broker: one per host; decides which engine holds device memory.
 * See broker/broker.h and docs/reference/broker.md.
 *
 * The program wires the core (broker/broker.h) and its faces: the HTTP API
 * (broker/api/api.h) and the front door above it (broker/door/door.h),
 * which registers its routes there. It lives in the topmost face's folder
 * because it includes every face: from here every include points down.
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "broker/api/api.h"
#include "broker/broker.h"
#include "broker/door/door.h"

static const char usage[] =
    "usage: baton-broker [--config FILE] [--control URL] [--events URL] [--http ADDR]\n"
    "                    [--http-token-file FILE] [--check]\n"
    "\n"
    "  --config FILE   INI configuration, see baton-broker.ini(5)\n"
    "  --control URL   control socket (default " BROKER_DEFAULT_CONTROL ")\n"
    "  --events URL    event socket (default " BROKER_DEFAULT_EVENTS ")\n"
    "  --http ADDR     HTTP API, /metrics and dashboard on HOST:PORT (default\n"
    "                  " BROKER_DEFAULT_HTTP "; port 0: any free port; off: none)\n"
    "  --http-token-file FILE  POSTs need \"Authorization: Bearer\" + its first line\n"
    "                  (default: a token made into http.token beside an ipc://\n"
    "                  control socket, mode 0640; not readable by others)\n"
    "  --check         read the configuration, print it, and exit\n"
    "  --help, --version\n"
    "\n"
    "Flags override the file. SIGHUP reads the file again: policies, pins,\n"
    "device and engine sections and timers change without dropping engines; a\n"
    "file that does not load is refused and the running configuration stays.\n"
    "Exit status: 0 after SIGTERM or SIGINT, 1 when\n"
    "the sockets cannot be opened or one was removed or replaced while it ran,\n"
    "2 for bad flags or configuration.\n"
    "Under systemd (Type=notify): READY=1 once listening, WATCHDOG=1 every\n"
    "WatchdogSec/2 while the decision thread answers, STOPPING=1 on SIGTERM.\n";

static void usage_error(const char *fmt, const char *arg) __attribute__((noreturn));
static void usage_error(const char *fmt, const char *arg)
{
	fputs("baton-broker: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\n(see baton-broker --help)\n", stderr);
	exit(2);
}

static void set_url(char *dst, const char *flag, const char *v)
{
	if (strlen(v) >= BROKER_URL_MAX ||
	    (strncmp(v, "ipc://", 6) != 0 && strncmp(v, "tcp://", 6) != 0) || strlen(v) < 7)
		usage_error("%s wants ipc://PATH or tcp://HOST:PORT", flag);
	snprintf(dst, BROKER_URL_MAX, "%s", v);
}

/*
 * The systemd watchdog (WatchdogSec= in the unit; sd_watchdog_enabled()
 * reads $WATCHDOG_USEC and $WATCHDOG_PID). WATCHDOG=1 goes out only after a
 * STATUS call on the broker's own control socket came back: that call is
 * answered by the decision thread, so a wedged decision thread stops the
 * pings and systemd restarts the broker. Not under systemd: nothing.
 */
struct watchdog {
	uint64_t interval_ms;       /* half of WatchdogSec; 0: off */
	struct proto_client *cli;   /* to our own control socket */
	double next;                /* monotonic seconds of the next ping */
};

static void watchdog_open(struct watchdog *w, const char *control)
{
	uint64_t usec = 0;
	memset(w, 0, sizeof *w);
	if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
		return;
	w->interval_ms = usec / 2000 ? usec / 2000 : 1;
	if (proto_client_open(&w->cli, control, NULL) != 0) {
		broker_log("watchdog: cannot open %s; no pings", control);
		w->interval_ms = 0;
		return;
	}
	broker_log("watchdog: a ping every %llu ms while the decision thread answers",
	    (unsigned long long)w->interval_ms);
	w->next = baton_now_s();
}

/* How long the main loop may wait for a signal before the next ping. */
static struct timespec watchdog_wait(const struct watchdog *w)
{
	struct timespec ts = { .tv_sec = 3600, .tv_nsec = 0 };
	if (!w->interval_ms)
		return ts;
	double left = w->next - baton_now_s();
	if (left < 0)
		left = 0;
	ts.tv_sec = (time_t)left;
	ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
	return ts;
}

static void watchdog_tick(struct watchdog *w)
{
	if (!w->interval_ms || baton_now_s() < w->next)
		return;
	w->next = baton_now_s() + (double)w->interval_ms / 1000.0;
	struct baton_msg req, rep;
	memset(&rep, 0, sizeof rep);
	proto_msg_init(&req, PROTO_OP_STATUS);
	/* At most half an interval: pings stay under 3/4 of WatchdogSec apart,
	 * and a later answer counts as a missed ping. */
	int rc = proto_client_call(w->cli, &req, &rep, (int)(w->interval_ms / 2 ? w->interval_ms / 2 : 1), NULL);
	proto_msg_free(&rep);
	if (rc == 0)
		sd_notify(0, "WATCHDOG=1");
	else
		broker_log("watchdog: no status from the decision thread (%s); no ping",
		    baton_strerror(rc));
}

/*
 * SIGHUP: the configuration file again. A file that does not load is
 * refused whole (the log names its line) and the running configuration
 * stays; a good one goes to the decision thread (broker_reload). The
 * flags given at start still override the file, as at start.
 */
static void reload(struct broker *b, struct broker_door *door, const char *path, const char *http,
    const char *token_file)
{
	static struct broker_config next; /* large: not on the stack */
	char err[1024];
	if (!path) {
		broker_log("SIGHUP: started without --config; nothing to reload");
		return;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	/* MONOTONIC_USEC: systemd 253 and later match it to the SIGHUP */
	sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=reloading %s",
	    (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL, path);
	broker_config_defaults(&next);
	int rc = broker_config_load(&next, path, err, sizeof err);
	if (rc == 0 && http && broker_config_set_http(&next, http, err, sizeof err))
		rc = BATON_ECONFIG;
	if (rc == 0 && token_file && broker_config_token_file(&next, token_file, err, sizeof err))
		rc = BATON_ECONFIG;
	if (rc) {
		broker_log("reload refused, the running configuration stays: %s", err);
		sd_notifyf(0, "READY=1\nSTATUS=reload of %s refused: %s", path, err);
		return;
	}
	rc = broker_reload(b, &next, err, sizeof err);
	if (rc)
		broker_log("reload: %s", err);
	else
		broker_door_reload(door, &next); /* the front door's settings */
	sd_notifyf(0, "READY=1\nSTATUS=configuration reloaded from %s", path);
}

static void print_models(const struct broker_config *c)
{
	for (size_t i = 0; i < c->n_models; i++) {
		const struct broker_model_conf *m = &c->models[i];
		static const char *kinds[] = { "", "huggingface", "gguf", "arena" };
		printf("\n[model \"%s\"]\nsource = %s\n; resolved: %s (%s)\n", m->name, m->source, m->path,
		    kinds[m->kind]);
		if (m->aliases[0])
			printf("aliases = %s\n", m->aliases);
		printf("backend = %s\ndevice = %d\n", m->backend, m->device);
		if (m->dtype[0])
			printf("dtype = %s\n", m->dtype);
		if (m->ctx)
			printf("ctx = %u\n", m->ctx);
		if (m->kv_blocks)
			printf("kv_blocks = %u\n", m->kv_blocks);
		if (m->max_seqs)
			printf("max_seqs = %u\n", m->max_seqs);
		if (m->stop_after_s > 0)
			printf("stop_after_s = %g\n", m->stop_after_s);
		if (m->drop_arena)
			printf("drop_arena = true\n");
		if (m->has_keep_alive && m->keep_alive_s < 0)
			printf("keep_alive_s = forever\n");
		else if (m->has_keep_alive)
			printf("keep_alive_s = %g\n", m->keep_alive_s);
		if (m->has_priority)
			printf("priority = %d\n", m->priority);
		printf("pinned = %s\n", m->pinned ? "true" : "false");
		printf("preload = %s\n", m->preload ? "true" : "false");
		if (m->arena[0])
			printf("arena = %s\n", m->arena);
		if (m->flags[0])
			printf("engine_flags = %s\n", m->flags);
	}
}

static void print_config(const struct broker_config *c)
{
	printf("[broker]\ncontrol = %s\nevents = %s\nheartbeat_timeout_ms = %d\nidle_release_s = %g\n"
	    "acquire_wait_ms = %d\ncommand_timeout_ms = %d\nnvml = %s\n",
	    c->control, c->events, c->heartbeat_timeout_ms, c->idle_release_s, c->acquire_wait_ms,
	    c->command_timeout_ms, c->nvml ? "true" : "false");
	printf("http = %s\n", c->http[0] ? c->http : "off");
	if (c->http_token[0])
		printf("; http_token is set (not shown)\n");
	printf("door_quantum_s = %g\n", c->door_quantum_s);
	if (c->door_keep_alive_s < 0)
		printf("door_keep_alive_s = forever\n");
	else
		printf("door_keep_alive_s = %g\n", c->door_keep_alive_s);
	printf("door_queue_max = %u\n", c->door_queue_max);
	printf("access_log = %s\n", c->access_log ? "true" : "false");
	printf("arena_dir = %s\nrestart_max = %u\nrestart_window_s = %g\n", c->arena_dir, c->restart_max,
	    c->restart_window_s);
	if (c->engine_path[0])
		printf("engine = %s\n", c->engine_path);
	if (c->arena_tool[0])
		printf("arena_tool = %s\n", c->arena_tool);
	if (c->run_dir[0])
		printf("run_dir = %s\n", c->run_dir);
	for (size_t i = 0; i < c->n_gpus; i++) {
		const struct broker_gpu_conf *g = &c->gpus[i];
		printf("\n[gpu \"%s\"]\nreserve_mib = %llu\n", g->uuid,
		    (unsigned long long)(g->reserve_bytes >> 20));
		if (g->total_bytes)
			printf("total_mib = %llu\n", (unsigned long long)(g->total_bytes >> 20));
	}
	for (size_t i = 0; i < c->n_engines; i++) {
		const struct broker_engine_conf *e = &c->engines[i];
		const struct broker_model_conf *mc = broker_config_model(c, e->name);
		if (mc && strcmp(mc->name, e->name) == 0)
			continue; /* a [model]'s own: printed with it */
		printf("\n[engine \"%s\"]\n", e->name);
		if (e->has_priority)
			printf("priority = %d\n", e->priority);
		printf("pinned = %s\n", e->pinned ? "true" : "false");
		if (e->idle_release_s >= 0)
			printf("idle_release_s = %g\n", e->idle_release_s);
		if (e->has_keep_alive && e->keep_alive_s < 0)
			printf("keep_alive_s = forever\n");
		else if (e->has_keep_alive)
			printf("keep_alive_s = %g\n", e->keep_alive_s);
	}
}

int main(int argc, char **argv)
{
	enum { O_CONFIG = 1, O_CONTROL, O_EVENTS, O_HTTP, O_TOKEN_FILE, O_CHECK, O_HELP, O_VERSION };
	static const struct option lo[] = {
		{ "config", required_argument, 0, O_CONFIG },
		{ "control", required_argument, 0, O_CONTROL },
		{ "events", required_argument, 0, O_EVENTS },
		{ "http", required_argument, 0, O_HTTP },
		{ "http-token-file", required_argument, 0, O_TOKEN_FILE },
		{ "check", no_argument, 0, O_CHECK },
		{ "help", no_argument, 0, O_HELP },
		{ "version", no_argument, 0, O_VERSION },
		{ 0, 0, 0, 0 },
	};
	const char *config = NULL, *control = NULL, *events = NULL, *http = NULL, *token_file = NULL;
	int check = 0, c;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case O_CONFIG: config = optarg; break;
		case O_CONTROL: control = optarg; break;
		case O_EVENTS: events = optarg; break;
		case O_HTTP: http = optarg; break;
		case O_TOKEN_FILE: token_file = optarg; break;
		case O_CHECK: check = 1; break;
		case O_HELP: fputs(usage, stdout); return 0;
		case O_VERSION: printf("baton-broker %s\n", baton_version()); return 0;
		case ':': usage_error("%s needs a value", argv[optind - 1]);
		default: usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);

	static struct broker_config cfg; /* large: not on the stack */
	broker_config_defaults(&cfg);
	char err[1024];
	if (config) {
		int rc = broker_config_load(&cfg, config, err, sizeof err);
		if (rc) {
			broker_log("%s", err);
			return 2;
		}
	}
	if (control)
		set_url(cfg.control, "--control", control);
	if (events)
		set_url(cfg.events, "--events", events);
	if (http && broker_config_set_http(&cfg, http, err, sizeof err))
		usage_error("--http: %s", err);
	if (token_file && broker_config_token_file(&cfg, token_file, err, sizeof err))
		usage_error("--http-token-file: %s", err);
	if (strcmp(cfg.control, cfg.events) == 0)
		usage_error("control and events must be different sockets (%s)", cfg.control);
	if (cfg.http[0] && !cfg.http_token[0] && !broker_http_loopback(cfg.http)) {
		broker_log("http = %s is not a loopback address and no token is set: set "
		    "[broker] http_token_file (or listen on 127.0.0.1)", cfg.http);
		return 2;
	}
	if (check) {
		print_config(&cfg);
		print_models(&cfg);
		return 0;
	}

	/* Signals go to this thread only: block them before any thread starts. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	/* The core, then its faces (they subscribe before anything happens),
	 * then the threads; closed in the reverse order. */
	struct broker *b;
	struct broker_http *h = NULL;
	struct broker_door *door = NULL;
	int rc = broker_open(&cfg, &b, err, sizeof err);
	if (rc) {
		broker_log("%s", err);
		return 1;
	}
	if (cfg.http[0] && (rc = broker_http_token_prepare(&cfg, err, sizeof err)) != 0) {
		broker_log("%s", err);
		broker_close(b);
		return rc == BATON_ECONFIG ? 2 : 1;
	}
	if (cfg.http_token_path[0])
		broker_log("HTTP changes need the token in %s (Authorization: Bearer ...)",
		    cfg.http_token_path);
	else if (cfg.http[0] && !cfg.http_token[0])
		broker_log("no HTTP token: changes over HTTP are refused until "
		    "[broker] http_token_file is set");
	if (cfg.http[0]) {
		rc = broker_http_open(b, &cfg, &h, err, sizeof err);
		if (rc && cfg.http_set) {
			broker_log("%s", err);
			broker_close(b);
			return 1;
		}
		if (rc)
			broker_log("warning: HTTP is OFF (no dashboard, /metrics or OpenAI "
			    "front door): %s; --http ADDR or [broker] http chooses another "
			    "address (port 0: any free one), off silences this", err);
	}
	/* the front door, on the HTTP face's address (its routes) */
	if (h && (rc = broker_door_open(b, h, &cfg, &door, err, sizeof err)) != 0) {
		broker_log("%s", err);
		broker_http_close(h);
		broker_close(b);
		return 1;
	}
	if ((rc = broker_start(b, err, sizeof err)) != 0) {
		broker_log("%s", err);
		broker_stop(b);
		broker_http_close(h);
		broker_door_close(door);
		broker_close(b);
		return 1;
	}
	if ((rc = broker_door_start(door)) != 0) {
		broker_log("front door: cannot start its threads: %s", baton_strerror(rc));
		broker_stop(b);
		broker_http_close(h);
		broker_door_close(door);
		broker_close(b);
		return 1;
	}
	broker_http_ready(h, true); /* GET /readyz: 200 from here */
	const char *http_url = h ? broker_http_url(h) : NULL;
	broker_log("control %s, events %s, http %s%s%s", broker_control_url(b),
	    broker_events_url(b), http_url ? http_url : "off", config ? ", configuration " : "",
	    config ? config : "");
	/* Ready: tests and scripts wait for this line; the third URL is the
	 * HTTP server's (its port resolved), absent when it is off. */
	printf("ready %s %s%s%s\n", broker_control_url(b), broker_events_url(b), http_url ? " " : "",
	    http_url ? http_url : "");
	fflush(stdout);
	/* systemd (Type=notify): ready once the sockets listen; a no-op
	 * without $NOTIFY_SOCKET. */
	sd_notifyf(0, "READY=1\nSTATUS=control %s, events %s, http %s", broker_control_url(b),
	    broker_events_url(b), http_url ? http_url : "off");
	struct watchdog wd;
	watchdog_open(&wd, broker_control_url(b));
	int status = 0;
	for (;;) {
		struct timespec wait = watchdog_wait(&wd);
		if (wait.tv_sec >= 1) /* the sockets are looked at every second */
			wait = (struct timespec){ .tv_sec = 1, .tv_nsec = 0 };
		int sig = sigtimedwait(&sigs, NULL, &wait);
		if (sig == SIGHUP)
			reload(b, door, config, http, token_file);
		else if (sig > 0)
			break;
		watchdog_tick(&wd);
		if (broker_sockets_check(b, err, sizeof err) != 0) {
			/* Someone else's socket in our place, or none: clients would
			 * talk to them or to no one. Exit; a restart binds afresh. */
			broker_log("%s; exiting", err);
			sd_notifyf(0, "STATUS=%s", err);
			status = 1;
			break;
		}
	}
	sd_notify(0, "STOPPING=1\nSTATUS=shutting down");
	broker_log("shutting down");
	proto_client_close(wd.cli);
	broker_http_ready(h, false);
	broker_stop(b);
	broker_http_close(h); /* no route reaches the door after this */
	broker_door_close(door);
	broker_close(b);
	broker_log("stopped");
	/* A close that nng 1.5.2 left hanging would hang exit() in its atexit
	 * handler too (proto.h, "Closing"). */
	if (proto_nng_wedged())
		_exit(status);
	return status;
}
