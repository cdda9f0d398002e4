/*
 * fleet.c: the models of the configuration's [model] sections, served by
 * engines the broker starts itself (door_int.h, docs/guides/fleet.md).
 *
 * One supervisor thread owns the children: per model, when a request
 * wants it (or preload), it makes the arena (baton-arena create, which
 * reuses a valid arena of the same source and refuses a full /dev/shm
 * before writing: arena/build.c), then starts baton-engine with --broker
 * (the engine registers itself; the door routes to it as to any engine),
 * and reads both children's output into the broker's log and a ring of
 * the last lines. A child that exits is reaped here (pidfd); an engine
 * that exits without being asked is restarted after a backoff (0.5 s,
 * doubling, at most 30 s); restart_max crashes within restart_window_s
 * mark the model failed, its last lines kept for /v1/models. An engine
 * idle past stop_after_s (nothing queued, nothing forwarded) is stopped
 * (SIGTERM: it gives its memory back and exits 0).
 *
 * States: stopped, arena (being made), starting (spawned, not
 * registered), running, stopping, down (crashed, restart pending), failed.
 *
 * Locking: f->mu guards the models. The door calls in under d->mu (so
 * the order is d->mu, then f->mu); the supervisor never takes d->mu while
 * it holds f->mu, and answers requests (door_fleet_fail) outside both.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "arena/arena.h"
#include "broker/door/fleet_int.h"

#define BACKOFF_MIN_S 0.5
#define BACKOFF_MAX_S 30.0
#define STOP_GRACE_S 10.0       /* SIGTERM, then SIGKILL after this */
#define START_LIMIT_S 600.0     /* an engine not registered this long after its start: killed (a crash) */
#define TICK_MS 100

static void wake(struct door_fleet *f)
{
	char c = 1;
	if (write(f->wake[1], &c, 1) < 0) {
		/* full: it wakes anyway */
	}
}

static struct fmodel *find(struct door_fleet *f, const char *name)
{
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		struct fmodel *m = &f->m[i];
		if (!m->used || m->removed)
			continue;
		if (strcmp(m->conf.name, name) == 0)
			return m;
	}
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		struct fmodel *m = &f->m[i];
		if (!m->used || m->removed)
			continue;
		char buf[256];
		snprintf(buf, sizeof buf, "%s", m->conf.aliases);
		char *save = NULL;
		for (char *t = strtok_r(buf, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save))
			if (strcmp(t, name) == 0)
				return m;
	}
	return NULL;
}

/* A child's own UTC stamp ("2026-12-01T21:50:07.611Z "): the broker's
 * line has its own. */
static const char *unstamped(const char *line)
{
	static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ ";
	for (size_t i = 0; shape[i]; i++) {
		bool digit = line[i] >= '0' && line[i] <= '9';
		if (shape[i] == 'd' ? !digit : line[i] != shape[i])
			return line;
	}
	return line + sizeof shape - 1;
}

static void keep_line(struct fmodel *m, const char *who, const char *line)
{
	line = unstamped(line);
	broker_log("%s %s: %s", who, m->conf.name, line);
	if (m->log_n == LOG_LINES) {
		memmove(m->log[0], m->log[1], sizeof m->log[0] * (LOG_LINES - 1));
		m->log_n--;
	}
	snprintf(m->log[m->log_n++], sizeof m->log[0], "%.255s", line);
}

static void last_lines(const struct fmodel *m, char *out, size_t n, unsigned want)
{
	out[0] = 0;
	unsigned from = m->log_n > want ? m->log_n - want : 0;
	size_t at = 0;
	for (unsigned i = from; i < m->log_n && at + 2 < n; i++)
		at += (size_t)snprintf(out + at, n - at, "%s%s", at ? " | " : "", m->log[i]);
}

/* ---- children ------------------------------------------------------------------ */

static int pidfd_of(pid_t pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

extern char **environ;

/* The broker's environment less systemd's notification variables: the
 * unit's main process is the broker (NotifyAccess=main), and an engine's
 * READY=1 there would be refused noise in the journal. Made before fork
 * (the child may only call async-signal-safe functions). */
static char **child_env(void)
{
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 1, sizeof *env);
	if (!env)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) != 0 && strncmp(environ[i], "WATCHDOG_PID=", 13) != 0 &&
		    strncmp(environ[i], "WATCHDOG_USEC=", 14) != 0)
			env[k++] = environ[i];
	return env;
}

/* fork/exec argv with stdout and stderr into a pipe; the child gets
 * SIGTERM when the broker dies (PR_SET_PDEATHSIG). */
static int spawn(struct child *c, char *const argv[], char *err, size_t errlen)
{
	char **env = child_env();
	if (!env) {
		snprintf(err, errlen, "out of memory");
		return BATON_ENOMEM;
	}
	int p[2];
	if (pipe2(p, O_CLOEXEC) != 0) {
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		free(env);
		return BATON_EIO;
	}
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		close(p[0]);
		close(p[1]);
		free(env);
		return BATON_ENOMEM;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(127);
		sigset_t none;
		sigemptyset(&none);
		pthread_sigmask(SIG_SETMASK, &none, NULL); /* the broker blocks its signals */
		signal(SIGPIPE, SIG_DFL);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, 0);
		dup2(p[1], 1);
		dup2(p[1], 2);
		/* nothing else of the broker's (its sockets, pipes a library
		 * opened without O_CLOEXEC) goes with the child */
		if (syscall(SYS_close_range, 3, ~0U, 0) != 0)
			for (int fd = 3; fd < 1024; fd++)
				close(fd);
		execve(argv[0], argv, env);
		/* async-signal-safe calls only, between fork and exec */
		if (write(2, "cannot run ", 11) < 0 || write(2, argv[0], strlen(argv[0])) < 0 || write(2, "\n", 1) < 0)
			_exit(127);
		_exit(127);
	}
	free(env);
	close(p[1]);
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	memset(c, 0, sizeof *c);
	c->pid = pid;
	c->outfd = p[0];
	c->pidfd = pidfd_of(pid);
	return 0;
}

/* Reads what the child wrote; each whole line to the log. */
static void drain(struct fmodel *m, struct child *c, const char *who)
{
	char buf[4096];
	ssize_t n;
	while (c->outfd >= 0 && (n = read(c->outfd, buf, sizeof buf)) > 0) {
		for (ssize_t i = 0; i < n; i++) {
			if (buf[i] == '\n' || c->partn == sizeof c->part - 1) {
				c->part[c->partn] = 0;
				if (c->partn)
					keep_line(m, who, c->part);
				c->partn = 0;
				if (buf[i] == '\n')
					continue;
			}
			c->part[c->partn++] = buf[i];
		}
	}
}

/* Whether it exited (reaped; *status its wait status). */
static bool reaped(struct child *c, int *status)
{
	if (c->pid <= 0)
		return false;
	pid_t r = waitpid(c->pid, status, WNOHANG);
	if (r != c->pid)
		return false;
	if (c->pidfd >= 0)
		close(c->pidfd);
	c->pidfd = -1;
	c->pid = 0;
	return true;
}

static void child_close(struct child *c)
{
	if (c->outfd >= 0)
		close(c->outfd);
	c->outfd = -1;
	if (c->pidfd >= 0)
		close(c->pidfd);
	c->pidfd = -1;
}

static const char *exit_text(int status, char *buf, size_t n)
{
	if (WIFEXITED(status))
		snprintf(buf, n, "exit status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(buf, n, "wait status %d", status);
	return buf;
}

/* ---- starting ------------------------------------------------------------------ */

static void fail_model(struct door_fleet *f, struct fmodel *m, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_arena_path(struct door_fleet *f, struct fmodel *m)
{
	if (m->conf.kind == BROKER_SRC_ARENA)
		snprintf(m->arena, sizeof m->arena, "%s", m->conf.path);
	else if (m->conf.arena[0])
		snprintf(m->arena, sizeof m->arena, "%s", m->conf.arena);
	else
		snprintf(m->arena, sizeof m->arena, "%s/%s.arena", f->arena_dir, m->conf.name);
}

static void start_tool(struct door_fleet *f, struct fmodel *m)
{
	char err[300];
	set_arena_path(f, m);
	m->t_start = m->t_arena = baton_now_s();
	m->log_n = 0;
	if (m->conf.kind == BROKER_SRC_ARENA) {
		m->st = FS_ARENA; /* nothing to make: the engine next */
		m->tool.pid = 0;
		return;
	}
	char dir[sizeof m->arena];
	snprintf(dir, sizeof dir, "%s", m->arena);
	char *slash = strrchr(dir, '/');
	if (slash && slash != dir) {
		*slash = 0;
		if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
			fail_model(f, m, "cannot make %s for its arena: %s", dir, strerror(errno));
			return;
		}
	}
	char *argv[] = { f->tool, "create", m->conf.kind == BROKER_SRC_GGUF ? "--gguf" : "--safetensors",
		m->conf.path, m->arena, NULL };
	if (spawn(&m->tool, argv, err, sizeof err)) {
		fail_model(f, m, "cannot start %s: %s", f->tool, err);
		return;
	}
	m->st = FS_ARENA;
	broker_log("fleet: %s: making its arena %s from %s (%s)", m->conf.name, m->arena, m->conf.path, f->tool);
	broker_emit(f->d->b, "fleet.arena", m->conf.name, m->arena, -1, 0);
}

/* The arena holds the weight type the section asks for. */
static bool dtype_ok(struct door_fleet *f, struct fmodel *m)
{
	if (!m->conf.dtype[0])
		return true;
	struct baton_arena *a;
	char err[300];
	if (arena_open(m->arena, &a, err, sizeof err) != 0) {
		fail_model(f, m, "cannot open its arena %s: %s", m->arena, err);
		return false;
	}
	const struct baton_arena_shape *s = arena_shape(a);
	int want = baton_dtype_parse(m->conf.dtype);
	bool ok = (int)s->gate_dtype == want && (int)s->up_dtype == want && (int)s->down_dtype == want;
	char got[64];
	snprintf(got, sizeof got, "%s/%s/%s", baton_dtype_name((int)s->gate_dtype), baton_dtype_name((int)s->up_dtype),
	    baton_dtype_name((int)s->down_dtype));
	arena_close(a);
	if (!ok)
		fail_model(f, m, "dtype = %s, but its arena's experts are %s (gate/up/down): baton-arena copies "
		    "weights byte for byte and does not convert; choose a source of that type", m->conf.dtype, got);
	return ok;
}

static void start_engine(struct door_fleet *f, struct fmodel *m)
{
	if (!dtype_ok(f, m))
		return;
	char listen[BROKER_PATH_MAX + 200], backend[16], device[16], ctx[16], kvb[16], seqs[16], prio[16];
	snprintf(listen, sizeof listen, "ipc://%s/engine-%s.sock", f->run_dir, m->conf.name);
	snprintf(backend, sizeof backend, "%s", m->conf.backend);
	snprintf(device, sizeof device, "%d", m->conf.device);
	char *argv[96];
	int n = 0;
	argv[n++] = f->engine;
	argv[n++] = "--name";
	argv[n++] = m->conf.name;
	argv[n++] = "--shared-expert-arena";
	argv[n++] = m->arena;
	argv[n++] = "--listen";
	argv[n++] = listen;
	argv[n++] = "--broker";
	argv[n++] = f->broker_url;
	argv[n++] = "--http";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--served-model-name";
	argv[n++] = m->conf.name;
	argv[n++] = "--backend";
	argv[n++] = backend;
	argv[n++] = "--device";
	argv[n++] = device;
	argv[n++] = "--expert-cache-release";
	argv[n++] = "--vram-elastic";
	if (!f->access_log)
		argv[n++] = "--no-access-log"; /* [broker] access_log = false */
	if (m->conf.ctx) {
		snprintf(ctx, sizeof ctx, "%u", m->conf.ctx);
		argv[n++] = "--ctx";
		argv[n++] = ctx;
	}
	if (m->conf.kv_blocks) {
		snprintf(kvb, sizeof kvb, "%u", m->conf.kv_blocks);
		argv[n++] = "--kv-blocks";
		argv[n++] = kvb;
	}
	if (m->conf.max_seqs) {
		snprintf(seqs, sizeof seqs, "%u", m->conf.max_seqs);
		argv[n++] = "--max-seqs";
		argv[n++] = seqs;
	}
	if (m->conf.no_prefix_cache)
		argv[n++] = "--no-prefix-cache";
	char kvh[24];
	if (m->conf.has_kv_host) {
		snprintf(kvh, sizeof kvh, "%" PRIu64, m->conf.kv_host_mib);
		argv[n++] = "--kv-host-mib";
		argv[n++] = kvh;
	}
	if (m->conf.has_priority) {
		snprintf(prio, sizeof prio, "%d", m->conf.priority);
		argv[n++] = "--priority";
		argv[n++] = prio;
	}
	char flags[sizeof m->conf.flags];
	snprintf(flags, sizeof flags, "%s", m->conf.flags);
	char *save = NULL;
	for (char *t = strtok_r(flags, " \t", &save); t && n < 94; t = strtok_r(NULL, " \t", &save))
		argv[n++] = t;
	argv[n] = NULL;
	char err[300];
	if (spawn(&m->eng, argv, err, sizeof err)) {
		fail_model(f, m, "cannot start %s: %s", f->engine, err);
		return;
	}
	m->st = FS_STARTING;
	m->starts++;
	m->t_start = baton_now_s();
	broker_log("fleet: %s: engine started (pid %d): %s on %s %s, arena %s", m->conf.name, (int)m->eng.pid,
	    f->engine, backend, device, m->arena);
	char why[64];
	snprintf(why, sizeof why, "pid %d", (int)m->eng.pid);
	broker_emit(f->d->b, "fleet.start", m->conf.name, why, -1, 0);
}

/* ---- the door's calls (under d->mu) --------------------------------------------- */

int door_fleet_resolve(struct door_fleet *f, const char *name, char *canon, size_t n, char *why, size_t wn)
{
	if (!f)
		return -1;
	pthread_mutex_lock(&f->mu);
	struct fmodel *m = find(f, name);
	int st = -1;
	if (m) {
		if (canon)
			snprintf(canon, n, "%s", m->conf.name);
		st = m->st == FS_FAILED ? 1 : 0;
		if (why)
			snprintf(why, wn, "%s", m->why);
	}
	pthread_mutex_unlock(&f->mu);
	return st;
}

void door_fleet_want(struct door_fleet *f, const char *name)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	struct fmodel *m = find(f, name);
	if (m && !m->wanted && (m->st == FS_STOPPED || m->st == FS_STOPPING)) {
		m->wanted = true;
		wake(f);
	}
	pthread_mutex_unlock(&f->mu);
}

/* ---- the supervisor ------------------------------------------------------------- */

struct fail_note {
	char name[BROKER_NAME_MAX];
	char why[2048];
};

static struct fail_note *notes;   /* the supervisor's: failures to answer outside f->mu */
static size_t n_notes;

static void fail_model(struct door_fleet *f, struct fmodel *m, const char *fmt, ...)
{
	char what[1024], lines[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	last_lines(m, lines, sizeof lines, 5);
	snprintf(m->why, sizeof m->why, "%.1000s%s%.1000s", what, lines[0] ? "; last lines: " : "", lines);
	m->st = FS_FAILED;
	m->wanted = false;
	broker_log("fleet: %s: failed: %s", m->conf.name, m->why);
	broker_emit(f->d->b, "fleet.failed", m->conf.name, what, -1, 0);
	if (notes && n_notes < BROKER_MAX_MODELS) {
		snprintf(notes[n_notes].name, sizeof notes[n_notes].name, "%s", m->conf.name);
		snprintf(notes[n_notes].why, sizeof notes[n_notes].why, "%s", m->why);
		n_notes++;
	}
}

static void on_engine_exit(struct door_fleet *f, struct fmodel *m, int status, double now)
{
	char how[96];
	exit_text(status, how, sizeof how);
	drain(m, &m->eng, "engine");
	child_close(&m->eng);
	bool asked = m->st == FS_STOPPING;
	bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	if (asked || (clean && m->st == FS_RUNNING)) {
		broker_log("fleet: %s: engine stopped (%s)", m->conf.name, how);
		broker_emit(f->d->b, "fleet.stopped", m->conf.name, how, -1, 0);
		m->st = FS_STOPPED;
		/* an arena the fleet made, dropped after an idle stop: its RAM back
		 * (an engine that maps it still reads its pages until it unmaps) */
		if (m->idle_stop && m->conf.drop_arena && m->conf.kind != BROKER_SRC_ARENA && m->arena[0]) {
			if (unlink(m->arena) == 0)
				broker_log("fleet: %s: arena %s deleted (drop_arena); made again at the next start",
				    m->conf.name, m->arena);
			else if (errno != ENOENT)
				broker_log("fleet: %s: cannot delete its arena %s: %s", m->conf.name, m->arena, strerror(errno));
		}
		m->idle_stop = false;
		return;
	}
	m->crashes++;
	/* crashes within the window */
	unsigned keep = 0;
	for (unsigned i = 0; i < m->n_crash; i++)
		if (now - m->crash_t[i] <= f->restart_window_s)
			m->crash_t[keep++] = m->crash_t[i];
	m->n_crash = keep;
	if (m->n_crash < sizeof m->crash_t / sizeof m->crash_t[0])
		m->crash_t[m->n_crash++] = now;
	if (m->n_crash >= f->restart_max) {
		fail_model(f, m, "its engine crashed %u times within %g s (last: %s)", m->n_crash, f->restart_window_s, how);
		return;
	}
	double backoff = BACKOFF_MIN_S;
	for (unsigned i = 1; i < m->n_crash && backoff < BACKOFF_MAX_S; i++)
		backoff *= 2;
	if (backoff > BACKOFF_MAX_S)
		backoff = BACKOFF_MAX_S;
	m->st = FS_DOWN;
	m->restart_at = now + backoff;
	broker_log("fleet: %s: engine %s (%s); restart in %.1f s (crash %u of %u within %g s)", m->conf.name,
	    m->starts ? "crashed" : "failed", how, backoff, m->n_crash, f->restart_max, f->restart_window_s);
	char why[160];
	snprintf(why, sizeof why, "%s; restart in %.1f s", how, backoff);
	broker_emit(f->d->b, "fleet.crash", m->conf.name, why, -1, 0);
}

static void on_tool_exit(struct door_fleet *f, struct fmodel *m, int status)
{
	drain(m, &m->tool, "arena");
	child_close(&m->tool);
	if (m->st != FS_ARENA)
		return; /* removed or stopped meanwhile */
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		char how[96];
		fail_model(f, m, "baton-arena create %s %s failed (%s)", m->conf.path, m->arena,
		    exit_text(status, how, sizeof how));
		return;
	}
	broker_log("fleet: %s: arena %s ready in %.2f s", m->conf.name, m->arena, baton_now_s() - m->t_arena);
	baton_hist_add(&m->h_arena, start_le, START_NB, baton_now_s() - m->t_arena);
	start_engine(f, m);
}

static void term(struct fmodel *m, double now)
{
	if (m->eng.pid > 0) {
		kill(m->eng.pid, SIGTERM);
		m->term_at = now;
	}
	if (m->tool.pid > 0)
		kill(m->tool.pid, SIGTERM);
	m->st = FS_STOPPING;
}

/* What the door says of each model: registered, busy, idle since. */
struct seen {
	bool registered, busy;
	double idle_s;
};

static void look(struct door_fleet *f, struct seen *s)
{
	struct broker_door *d = f->d;
	char names[BROKER_MAX_MODELS][BROKER_NAME_MAX];
	int pids[BROKER_MAX_MODELS];
	pthread_mutex_lock(&f->mu);
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		snprintf(names[i], sizeof names[i], "%s", f->m[i].used ? f->m[i].conf.name : "");
		pids[i] = f->m[i].eng.pid;
	}
	pthread_mutex_unlock(&f->mu);
	double now = baton_now_s();
	pthread_mutex_lock(&d->mu);
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		memset(&s[i], 0, sizeof s[i]);
		if (!names[i][0])
			continue;
		struct deng *e = door_eng(d, names[i]);
		s[i].registered = e && pids[i] > 0 && e->pid == pids[i]; /* this engine, not one that died */
		int mi = door_model(d, names[i], false);
		const struct dmodel *dm = mi >= 0 ? &d->models[mi] : NULL;
		s[i].busy = (dm && dm->queued) || door_inflight(d, names[i]) > 0;
		double last = dm ? dm->last_active : 0;
		s[i].idle_s = last > 0 ? now - last : 1e9;
	}
	pthread_mutex_unlock(&d->mu);
}

static void round_(struct door_fleet *f, const struct seen *s, double now)
{
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		struct fmodel *m = &f->m[i];
		if (!m->used)
			continue;
		int status;
		if (reaped(&m->tool, &status))
			on_tool_exit(f, m, status);
		if (reaped(&m->eng, &status))
			on_engine_exit(f, m, status, now);
		drain(m, &m->eng, "engine");
		drain(m, &m->tool, "arena");
		if (m->removed) {
			if (m->eng.pid <= 0 && m->tool.pid <= 0) {
				broker_log("fleet: %s: removed", m->conf.name);
				child_close(&m->eng);
				child_close(&m->tool);
				memset(m, 0, sizeof *m);
				continue;
			}
			if (m->st != FS_STOPPING)
				term(m, now);
		}
		if (m->have_next && m->eng.pid <= 0 && m->tool.pid <= 0) {
			/* a changed section: taken now that nothing runs */
			m->conf = m->next;
			m->have_next = false;
			m->st = FS_STOPPED;
			m->n_crash = 0;
			m->why[0] = 0;
			m->wanted = m->wanted || m->conf.preload;
		} else if (m->have_next && m->st != FS_STOPPING) {
			term(m, now);
		}
		switch (m->st) {
		case FS_STOPPED:
			if (m->wanted || m->conf.preload)
				start_tool(f, m);
			break;
		case FS_ARENA:
			if (m->tool.pid <= 0 && m->conf.kind == BROKER_SRC_ARENA)
				start_engine(f, m);
			break;
		case FS_STARTING:
			if (!s[i].registered && now - m->t_start > START_LIMIT_S && m->eng.pid > 0) {
				broker_log("fleet: %s: engine pid %d not registered %.0f s after its start: killing it",
				    m->conf.name, (int)m->eng.pid, START_LIMIT_S);
				kill(m->eng.pid, SIGKILL); /* its exit counts as a crash */
			}
			if (s[i].registered) {
				m->st = FS_RUNNING;
				m->running_since = now;
				m->wanted = false;
				m->ready_ms = (now - m->t_start) * 1e3;
				baton_hist_add(&m->h_engine, start_le, START_NB, now - m->t_start);
				broker_log("fleet: %s: engine registered %.0f ms after its start", m->conf.name, m->ready_ms);
				broker_emit(f->d->b, "fleet.ready", m->conf.name, "registered", m->ready_ms, 0);
			}
			break;
		case FS_RUNNING:
			if (m->conf.stop_after_s > 0 && !s[i].busy && s[i].idle_s >= m->conf.stop_after_s &&
			    now - m->running_since >= m->conf.stop_after_s) { /* a preloaded one: idle from its start */
				m->idle_stops++;
				m->idle_stop = true;
				broker_log("fleet: %s: idle %.1f s (stop_after_s %g): stopping its engine", m->conf.name,
				    s[i].idle_s, m->conf.stop_after_s);
				term(m, now);
			}
			break;
		case FS_STOPPING:
			if (m->eng.pid > 0 && now - m->term_at > STOP_GRACE_S)
				kill(m->eng.pid, SIGKILL);
			if (m->eng.pid <= 0 && m->tool.pid <= 0)
				m->st = FS_STOPPED;
			break;
		case FS_DOWN:
			if (now >= m->restart_at)
				start_engine(f, m);
			break;
		case FS_FAILED:
			break;
		}
	}
}

static void *supervise(void *arg)
{
	struct door_fleet *f = arg;
	static struct seen s[BROKER_MAX_MODELS];
	static struct fail_note fail_notes[BROKER_MAX_MODELS];
	for (;;) {
		struct pollfd pf[2 * 2 * BROKER_MAX_MODELS + 1];
		nfds_t n = 0;
		pf[n++] = (struct pollfd){ .fd = f->wake[0], .events = POLLIN };
		pthread_mutex_lock(&f->mu);
		bool stop = f->stop;
		for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
			struct fmodel *m = &f->m[i];
			if (!m->used)
				continue;
			struct child *cs[2] = { &m->eng, &m->tool };
			for (int k = 0; k < 2; k++) {
				if (cs[k]->outfd >= 0 && cs[k]->pid > 0)
					pf[n++] = (struct pollfd){ .fd = cs[k]->outfd, .events = POLLIN };
				if (cs[k]->pidfd >= 0 && cs[k]->pid > 0)
					pf[n++] = (struct pollfd){ .fd = cs[k]->pidfd, .events = POLLIN };
			}
		}
		pthread_mutex_unlock(&f->mu);
		if (stop)
			break;
		if (poll(pf, n, TICK_MS) > 0 && (pf[0].revents & POLLIN)) {
			char buf[64];
			while (read(f->wake[0], buf, sizeof buf) > 0) {
			}
		}
		look(f, s);
		pthread_mutex_lock(&f->mu);
		notes = fail_notes;
		n_notes = 0;
		round_(f, s, baton_now_s());
		size_t nf = n_notes;
		notes = NULL;
		pthread_mutex_unlock(&f->mu);
		for (size_t i = 0; i < nf; i++)
			door_fleet_failed(f->d, fail_notes[i].name, fail_notes[i].why);
	}
	return NULL;
}

/* ---- life ----------------------------------------------------------------------- */

static void beside_program(char *out, size_t n, const char *prog)
{
	char self[PATH_MAX];
	ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
	if (l <= 0) {
		snprintf(out, n, "%s", prog);
		return;
	}
	self[l] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = 0;
	snprintf(out, n, "%.400s/%s", self, prog);
}

/* Under f->mu: the configuration's models become the fleet's. */
static void take_models(struct door_fleet *f, const struct broker_config *cfg, char *msg, size_t n)
{
	f->access_log = cfg->access_log;
	char added[512] = "", removed[512] = "", changed[512] = "";
	unsigned same = 0;
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		struct fmodel *m = &f->m[i];
		if (!m->used || m->removed)
			continue;
		const struct broker_model_conf *c = NULL;
		for (size_t k = 0; k < cfg->n_models && !c; k++)
			if (strcmp(cfg->models[k].name, m->conf.name) == 0)
				c = &cfg->models[k];
		if (!c) {
			m->removed = true;
			m->wanted = false;
			snprintf(removed + strlen(removed), sizeof removed - strlen(removed), "%s%s", *removed ? ", " : "",
			    m->conf.name);
		} else if (broker_model_conf_same(&m->conf, c)) {
			/* what changes without a restart */
			snprintf(m->conf.aliases, sizeof m->conf.aliases, "%s", c->aliases);
			m->conf.stop_after_s = c->stop_after_s;
			m->conf.preload = c->preload;
			m->conf.drop_arena = c->drop_arena;
			m->conf.keep_alive_s = c->keep_alive_s;
			m->conf.has_keep_alive = c->has_keep_alive;
			m->conf.priority = c->priority;
			m->conf.has_priority = c->has_priority;
			m->conf.pinned = c->pinned;
			m->conf.line = c->line;
			same++;
		} else {
			m->next = *c;
			m->have_next = true;
			if (m->st == FS_FAILED) {
				m->st = FS_STOPPED;
			}
			snprintf(changed + strlen(changed), sizeof changed - strlen(changed), "%s%s", *changed ? ", " : "",
			    m->conf.name);
		}
	}
	for (size_t k = 0; k < cfg->n_models; k++) {
		const struct broker_model_conf *c = &cfg->models[k];
		bool have = false;
		for (size_t i = 0; i < BROKER_MAX_MODELS && !have; i++)
			have = f->m[i].used && !f->m[i].removed && strcmp(f->m[i].conf.name, c->name) == 0;
		if (have)
			continue;
		struct fmodel *m = NULL;
		for (size_t i = 0; i < BROKER_MAX_MODELS && !m; i++)
			if (!f->m[i].used)
				m = &f->m[i];
		if (!m) {
			broker_log("fleet: no room for model %s (%d at most, stopping ones included)", c->name,
			    BROKER_MAX_MODELS);
			continue;
		}
		memset(m, 0, sizeof *m);
		m->used = true;
		m->conf = *c;
		m->eng.pidfd = m->eng.outfd = m->tool.pidfd = m->tool.outfd = -1;
		m->st = FS_STOPPED;
		snprintf(added + strlen(added), sizeof added - strlen(added), "%s%s", *added ? ", " : "", c->name);
	}
	snprintf(msg, n, "added: %s; removed: %s; changed: %s; unchanged: %u", *added ? added : "none",
	    *removed ? removed : "none", *changed ? changed : "none", same);
	wake(f);
}

int door_fleet_open(struct broker_door *d, const struct broker_config *cfg, struct door_fleet **out, char *err,
    size_t errlen)
{
	*out = NULL;
	struct door_fleet *f = calloc(1, sizeof *f);
	if (!f) {
		snprintf(err, errlen, "fleet: out of memory");
		return BATON_ENOMEM;
	}
	f->d = d;
	pthread_mutex_init(&f->mu, NULL);
	if (pipe2(f->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
		snprintf(err, errlen, "fleet: pipe: %s", strerror(errno));
		pthread_mutex_destroy(&f->mu);
		free(f);
		return BATON_EIO;
	}
	if (cfg->engine_path[0])
		snprintf(f->engine, sizeof f->engine, "%s", cfg->engine_path);
	else
		beside_program(f->engine, sizeof f->engine, "baton-engine");
	if (cfg->arena_tool[0])
		snprintf(f->tool, sizeof f->tool, "%s", cfg->arena_tool);
	else
		beside_program(f->tool, sizeof f->tool, "baton-arena");
	snprintf(f->arena_dir, sizeof f->arena_dir, "%s", cfg->arena_dir[0] ? cfg->arena_dir : "/dev/shm/baton");
	const char *ctl = broker_control_url(d->b);
	snprintf(f->broker_url, sizeof f->broker_url, "%s", ctl);
	if (cfg->run_dir[0]) {
		snprintf(f->run_dir, sizeof f->run_dir, "%s", cfg->run_dir);
	} else if (strncmp(ctl, "ipc://", 6) == 0) {
		snprintf(f->run_dir, sizeof f->run_dir, "%s", ctl + 6);
		char *slash = strrchr(f->run_dir, '/');
		if (slash && slash != f->run_dir)
			*slash = 0;
	} else {
		snprintf(f->run_dir, sizeof f->run_dir, "/run/baton");
	}
	f->restart_max = cfg->restart_max ? cfg->restart_max : 5;
	f->restart_window_s = cfg->restart_window_s > 0 ? cfg->restart_window_s : 60;
	for (const char *p = f->engine; cfg->n_models && p; p = p == f->engine ? f->tool : NULL)
		if (access(p, X_OK) != 0) {
			snprintf(err, errlen, "fleet: %s: %s (the [model] sections need it; [broker] %s = PATH names "
			    "another)", p, strerror(errno), p == f->engine ? "engine" : "arena_tool");
			close(f->wake[0]);
			close(f->wake[1]);
			pthread_mutex_destroy(&f->mu);
			free(f);
			return BATON_ECONFIG;
		}
	char msg[2048];
	take_models(f, cfg, msg, sizeof msg);
	if (cfg->n_models)
		broker_log("fleet: %zu models (engine %s, arenas in %s, sockets in %s)", cfg->n_models, f->engine,
		    f->arena_dir, f->run_dir);
	*out = f;
	return 0;
}

int door_fleet_start(struct door_fleet *f)
{
	if (!f || f->have_th)
		return 0;
	if (pthread_create(&f->th, NULL, supervise, f) != 0)
		return BATON_ENOMEM;
	f->have_th = true;
	return 0;
}

void door_fleet_reload(struct door_fleet *f, const struct broker_config *cfg)
{
	if (!f)
		return;
	char msg[2048];
	pthread_mutex_lock(&f->mu);
	f->restart_max = cfg->restart_max ? cfg->restart_max : 5;
	f->restart_window_s = cfg->restart_window_s > 0 ? cfg->restart_window_s : 60;
	take_models(f, cfg, msg, sizeof msg);
	pthread_mutex_unlock(&f->mu);
	broker_log("fleet: reload: %s", msg);
	broker_emit(f->d->b, "fleet.reload", NULL, msg, -1, 0);
}

void door_fleet_close(struct door_fleet *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->stop = true;
	wake(f);
	pthread_mutex_unlock(&f->mu);
	if (f->have_th)
		pthread_join(f->th, NULL);
	/* every child: SIGTERM, then SIGKILL after the grace */
	double t0 = baton_now_s();
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++)
		if (f->m[i].used)
			term(&f->m[i], t0);
	for (;;) {
		bool left = false;
		for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
			struct fmodel *m = &f->m[i];
			if (!m->used)
				continue;
			int status;
			if (m->eng.pid > 0 && !reaped(&m->eng, &status)) {
				left = true;
				drain(m, &m->eng, "engine");
				if (baton_now_s() - t0 > STOP_GRACE_S)
					kill(m->eng.pid, SIGKILL);
			}
			if (m->tool.pid > 0 && !reaped(&m->tool, &status)) {
				left = true;
				if (baton_now_s() - t0 > STOP_GRACE_S)
					kill(m->tool.pid, SIGKILL);
			}
		}
		if (!left)
			break;
		usleep(20000);
	}
	for (size_t i = 0; i < BROKER_MAX_MODELS; i++) {
		child_close(&f->m[i].eng);
		child_close(&f->m[i].tool);
	}
	close(f->wake[0]);
	close(f->wake[1]);
	pthread_mutex_destroy(&f->mu);
	free(f);
}
