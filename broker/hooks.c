/*
 * hooks.c: commands to external engines. A release or refill of an
 * external engine runs its hook (a shell command, or an HTTP POST to a
 * URL such as vLLM's /sleep?level=1) or parks / resumes it through the
 * CUDA driver (park.c), on a thread of its own with a timeout, then
 * measures what the process holds and hands the result to the decision
 * thread as an IT_DONE item, as a worker does with an engine's reply.
 *
 * What is checked: the memory the process holds after the hook, from
 * NVML per process (the process and its descendants, on the engine's
 * device) where NVML knows the device; else from the hook's own report
 * (a line "mib=N" on its stdout); else nothing is measured and the
 * configured mib is assumed (the status says which: mem_src). A release
 * whose hook succeeded but whose measure did not fall fails as "freed
 * nothing", and the memory stays counted as the engine's.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "broker/broker_int.h"
#include "broker/park.h"
#include "engine/backend/host/host.h"

extern char **environ;

struct hookjob {
	struct broker *b;
	uint64_t id, epoch;
	enum proto_op op;
	char name[BROKER_NAME_MAX], uuid[BROKER_NAME_MAX];
	int pid;
	struct hook h;
	bool park, resume, explicit_park;
	uint64_t before, declared, granted, need;
};

/* Bytes of device memory the process and its descendants hold: NVML on a
 * GPU, the host device's own books on host-N; -1 when neither lists the
 * process (not measured: it may hold nothing there, or NVML cannot tell). */
int64_t br_proc_device_bytes(const char *uuid, int pid);
int64_t br_proc_device_bytes(const char *uuid, int pid)
{
	struct broker_nvml_proc p[256];
	size_t n = 0;
	if (pid <= 0)
		return -1;
	if (strncmp(uuid, "host-", 5) == 0) {
		struct host_device_owner o[256];
		if (host_device_owners(atoi(uuid + 5), o, 256, &n) != 0)
			return -1;
		for (size_t i = 0; i < n; i++)
			p[i] = (struct broker_nvml_proc){ o[i].pid, o[i].bytes };
	} else if (broker_nvml_procs(uuid, p, 256, &n) != 0) {
		return -1;
	}
	int64_t sum = 0;
	bool listed = false;
	for (size_t i = 0; i < n; i++) {
		/* p[i].pid or an ancestor of it is pid */
		int q = p[i].pid;
		for (int depth = 0; q > 1 && depth < 32; depth++) {
			if (q == pid) {
				sum += (int64_t)p[i].bytes;
				listed = true;
				break;
			}
			char path[64], buf[512];
			snprintf(path, sizeof path, "/proc/%d/stat", q);
			FILE *f = fopen(path, "r");
			if (!f)
				break;
			size_t k = fread(buf, 1, sizeof buf - 1, f);
			fclose(f);
			buf[k] = 0;
			const char *r = strrchr(buf, ')');
			int ppid = 0;
			if (!r || sscanf(r + 2, "%*c %d", &ppid) != 1)
				break;
			q = ppid;
		}
	}
	return listed ? sum : -1;
}

/* "mib=N" anywhere in the output (the last one): the hook's own report. */
static int64_t reported_bytes(const char *out)
{
	int64_t v = -1;
	for (const char *p = out; (p = strstr(p, "mib=")) != NULL; p += 4) {
		if (p != out && p[-1] != '\n' && p[-1] != ' ' && p[-1] != '\t')
			continue;
		char *end;
		unsigned long long x = strtoull(p + 4, &end, 10);
		if (end != p + 4)
			v = (int64_t)x * (int64_t)BATON_MIB;
	}
	return v;
}

static double now_s(void)
{
	return baton_now_s();
}

/* Runs cmd with /bin/sh -c in its own process group; its stdout into out.
 * 0, BATON_ETIMEDOUT (killed), BATON_EIO (exit status, in why). */
static int run_cmd(const struct hookjob *j, const char *action, char *out, size_t cap, char *why, size_t len)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) != 0) {
		snprintf(why, len, "pipe: %s", strerror(errno));
		return BATON_EIO;
	}
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawnattr_init(&at);
	posix_spawnattr_setpgroup(&at, 0);
	sigset_t def;
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
	/* the environment plus what the hook may want */
	size_t ne = 0;
	while (environ[ne])
		ne++;
	char **env = calloc(ne + 4, sizeof *env);
	char e1[BROKER_NAME_MAX + 32], e2[48], e3[48];
	snprintf(e1, sizeof e1, "BATON_EXTERNAL=%s", j->name);
	snprintf(e2, sizeof e2, "BATON_PID=%d", j->pid);
	snprintf(e3, sizeof e3, "BATON_ACTION=%s", action);
	size_t k = 0;
	for (size_t i = 0; env && i < ne; i++)
		if (strncmp(environ[i], "BATON_EXTERNAL=", 15) && strncmp(environ[i], "BATON_PID=", 10) &&
		    strncmp(environ[i], "BATON_ACTION=", 13))
			env[k++] = environ[i];
	if (env) {
		env[k++] = e1;
		env[k++] = e2;
		env[k++] = e3;
	}
	char *argv[] = { "sh", "-c", (char *)j->h.cmd, NULL };
	pid_t child;
	int rc = env ? posix_spawn(&child, "/bin/sh", &fa, &at, argv, env) : ENOMEM;
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	free(env);
	close(fds[1]);
	if (rc != 0) {
		close(fds[0]);
		snprintf(why, len, "cannot start /bin/sh: %s", strerror(rc));
		return BATON_EIO;
	}
	size_t got = 0;
	double deadline = now_s() + j->h.timeout_s;
	bool eof = false, timed_out = false;
	int status = 0;
	for (;;) {
		double left = deadline - now_s();
		if (left <= 0 || atomic_load(&j->b->stopping)) {
			timed_out = true;
			break;
		}
		if (left > 0.2)
			left = 0.2; /* look at `stopping` now and then */
		if (eof) {
			pid_t w = waitpid(child, &status, WNOHANG);
			if (w == child)
				break;
			usleep(left > 0.01 ? 10000 : (useconds_t)(left * 1e6));
			continue;
		}
		struct pollfd p = { .fd = fds[0], .events = POLLIN };
		int pr = poll(&p, 1, (int)(left * 1e3) + 1);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr > 0) {
			char buf[1024];
			ssize_t n = read(fds[0], buf, sizeof buf);
			if (n <= 0) {
				eof = true;
				continue;
			}
			size_t take = (size_t)n < cap - 1 - got ? (size_t)n : cap - 1 - got;
			memcpy(out + got, buf, take);
			got += take;
		}
	}
	out[got] = 0;
	close(fds[0]);
	if (timed_out) {
		kill(-child, SIGKILL);
		waitpid(child, &status, 0);
		snprintf(why, len, "timed out after %g s (killed)", j->h.timeout_s);
		return BATON_ETIMEDOUT;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	/* the last line of its output says why, usually */
	char last[160] = "";
	size_t l = got;
	while (l && (out[l - 1] == '\n' || out[l - 1] == ' '))
		l--;
	size_t s = l;
	while (s && out[s - 1] != '\n')
		s--;
	snprintf(last, sizeof last, "%.*s", (int)(l - s), out + s);
	if (WIFEXITED(status))
		snprintf(why, len, "exited %d%s%s", WEXITSTATUS(status), last[0] ? ": " : "", last);
	else
		snprintf(why, len, "killed by signal %d", WTERMSIG(status));
	return BATON_EIO;
}

/* POSTs to http://HOST[:PORT]/PATH [BODY] (body {} when none given). */
static int post_url(const struct hookjob *j, char *out, size_t cap, char *why, size_t len)
{
	char spec[BROKER_HOOK_MAX];
	snprintf(spec, sizeof spec, "%s", j->h.url);
	char *body = strchr(spec, ' ');
	if (body) {
		*body++ = 0;
		while (*body == ' ')
			body++;
	}
	if (!body || !*body)
		body = "{}";
	const char *hp = spec + 7;
	const char *slash = strchr(hp, '/');
	char host[BROKER_NAME_MAX], port[16] = "80";
	size_t hl = slash ? (size_t)(slash - hp) : strlen(hp);
	if (hl == 0 || hl >= sizeof host) {
		snprintf(why, len, "bad URL %.120s", spec);
		return BATON_EINVAL;
	}
	memcpy(host, hp, hl);
	host[hl] = 0;
	char *colon = strrchr(host, ':');
	if (colon && !strchr(colon, ']')) {
		snprintf(port, sizeof port, "%s", colon + 1);
		*colon = 0;
	}
	const char *path = slash ? slash : "/";
	double deadline = now_s() + j->h.timeout_s;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
	if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai) {
		snprintf(why, len, "POST %.120s: cannot resolve %s", spec, host);
		return BATON_EIO;
	}
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	if (fd < 0 || (rc != 0 && errno != EINPROGRESS)) {
		snprintf(why, len, "POST %.120s: %s", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		return BATON_EIO;
	}
	char req[BROKER_HOOK_MAX + 512];
	int rl = snprintf(req, sizeof req, "POST %.120s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
	    "Content-Length: %zu\r\nConnection: close\r\nUser-Agent: baton-broker\r\n\r\n%s", path, host, port,
	    strlen(body), body);
	size_t sent = 0, got = 0;
	for (;;) {
		double left = deadline - now_s();
		if (left <= 0 || atomic_load(&j->b->stopping)) {
			close(fd);
			snprintf(why, len, "POST %.120s: timed out after %g s", spec, j->h.timeout_s);
			return BATON_ETIMEDOUT;
		}
		struct pollfd p = { .fd = fd, .events = sent < (size_t)rl ? POLLOUT : POLLIN };
		int pr = poll(&p, 1, left > 0.2 ? 200 : (int)(left * 1e3) + 1);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0)
			continue;
		if (sent < (size_t)rl) {
			int soerr = 0;
			socklen_t sl = sizeof soerr;
			getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
			if (soerr) {
				close(fd);
				snprintf(why, len, "POST %.120s: %s", spec, strerror(soerr));
				return BATON_EIO;
			}
			ssize_t n = send(fd, req + sent, (size_t)rl - sent, MSG_NOSIGNAL);
			if (n < 0 && errno != EAGAIN) {
				close(fd);
				snprintf(why, len, "POST %.120s: %s", spec, strerror(errno));
				return BATON_EIO;
			}
			if (n > 0)
				sent += (size_t)n;
			continue;
		}
		ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
		if (n < 0 && errno == EAGAIN)
			continue;
		if (n <= 0 || got + (size_t)n >= cap - 1) {
			if (n > 0)
				got += (size_t)n;
			break;
		}
		got += (size_t)n;
	}
	close(fd);
	out[got] = 0;
	int status = 0;
	if (sscanf(out, "HTTP/%*d.%*d %d", &status) != 1) {
		snprintf(why, len, "POST %.120s: no HTTP answer", spec);
		return BATON_EIO;
	}
	if (status < 200 || status > 299) {
		const char *b = strstr(out, "\r\n\r\n");
		snprintf(why, len, "POST %.120s: HTTP %d%s%.120s", spec, status, b ? ": " : "", b ? b + 4 : "");
		return BATON_EIO;
	}
	/* the body, for a "mib=N" report */
	const char *b = strstr(out, "\r\n\r\n");
	if (b)
		memmove(out, b + 4, strlen(b + 4) + 1);
	return 0;
}

static void *hook_main(void *arg)
{
	struct hookjob *j = arg;
	struct item *it = calloc(1, sizeof *it);
	char why[sizeof ((struct item *)0)->err] = "", out[4096] = ""; /* why: it->err's size, copied whole */
	double t0 = now_s();
	const char *action = j->op == PROTO_OP_RELEASE ? "release" : "refill";
	int rc = 0;
	const char *state = j->op == PROTO_OP_RELEASE ? baton_state_name(BATON_STATE_RELEASED) :
	    baton_state_name(BATON_STATE_READY);
	if (j->resume && !park_may_resume(j->granted, j->need)) {
		/* the rule first, before the driver is even looked for */
		snprintf(why, sizeof why, "process %d stays parked: it needs %.1f MiB, %.1f MiB were granted", j->pid,
		    (double)j->need / BATON_MIB, (double)j->granted / BATON_MIB);
		rc = BATON_EDEVMEM;
		state = "parked";
	} else if (j->park || j->resume) {
		char err[200];
		const struct park_driver *d = park_cuda(err, sizeof err);
		if (!d) {
			snprintf(why, sizeof why, "cannot %s: %s", j->park ? "park" : "resume", err);
			/* configured to park: never asked again; a `baton park`: just refused */
			rc = j->park && !j->explicit_park ? BATON_EUNSUPPORTED : BATON_EDRIVER;
		} else if (j->park) {
			rc = park_process(d, j->pid, (unsigned)(j->h.timeout_s * 1e3), why, sizeof why);
			state = "parked";
		} else {
			rc = park_resume(d, j->pid, j->granted, j->need, why, sizeof why);
		}
	} else if (j->op != PROTO_OP_RELEASE && j->op != PROTO_OP_REFILL) {
		rc = BATON_EUNSUPPORTED; /* a shrink: an external engine gives all or nothing */
		snprintf(why, sizeof why, "an external engine is released whole, never shrunk");
	} else if (!j->h.cmd[0] && !j->h.url[0]) {
		rc = BATON_EUNSUPPORTED;
		snprintf(why, sizeof why, "it has no %s hook", action);
	} else {
		char w2[280] = "";
		rc = j->h.url[0] ? post_url(j, out, sizeof out, w2, sizeof w2) : run_cmd(j, action, out, sizeof out, w2, sizeof w2);
		if (rc)
			snprintf(why, sizeof why, "%s hook %.200s", action, w2);
	}
	/* what it holds now: NVML, else its own word, else the configuration's */
	int64_t seen = br_proc_device_bytes(j->uuid, j->pid);
	const char *src = strncmp(j->uuid, "host-", 5) == 0 ? "hostdev" : "nvml";
	if (seen < 0) {
		seen = reported_bytes(out);
		src = "report";
	}
	if (seen < 0) {
		seen = j->op == PROTO_OP_RELEASE ? 0 : (int64_t)j->declared;
		src = "declared";
	}
	if (rc == 0 && j->op == PROTO_OP_RELEASE && strcmp(src, "declared") != 0 && j->before > 0 &&
	    (uint64_t)seen >= j->before) {
		rc = BATON_EIO;
		snprintf(why, sizeof why, "%s succeeded but freed nothing: %s sees %.1f MiB held by process %d (%.1f before)",
		    j->park ? "park" : "the release hook", src, (double)seen / BATON_MIB, j->pid,
		    (double)j->before / BATON_MIB);
	}
	if (!it) {
		atomic_fetch_sub(&j->b->hooks_running, 1);
		free(j);
		return NULL;
	}
	it->kind = IT_DONE;
	it->job_id = j->id;
	it->rc = rc;
	it->ms = (now_s() - t0) * 1e3;
	snprintf(it->err, sizeof it->err, "%s", why);
	struct baton_msg *r = &it->rep;
	proto_msg_init(r, j->op);
	r->reply = true;
	r->ok = rc == 0;
	r->err = rc;
	r->state = state;              /* static strings: the item owns nothing */
	r->resident = (uint64_t)seen;
	r->mapped = (uint64_t)seen;
	proto_set(r, PF_MAPPED);
	r->ms = it->ms;
	r->bytes = br_moved(j->before, (uint64_t)seen);
	r->epoch = j->epoch;
	r->level = src;                /* where `mapped` came from (br_ext_result) */
	proto_set(r, PF_LEVEL);
	struct broker *b = j->b;
	free(j);
	br_post(b, it);
	atomic_fetch_sub(&b->hooks_running, 1); /* broker_close waits for none */
	return NULL;
}

int br_ext_queue(struct broker *b, struct eng *e, enum proto_op op, uint64_t *job_id)
{
	if (op == PROTO_OP_STATUS || op == PROTO_OP_PEER)
		return BATON_EUNSUPPORTED;
	struct hookjob *j = calloc(1, sizeof *j);
	if (!j)
		return BATON_ENOMEM;
	j->b = b;
	j->id = ++b->job_seq;
	j->epoch = ++b->epoch;
	j->op = op;
	snprintf(j->name, sizeof j->name, "%s", e->name);
	snprintf(j->uuid, sizeof j->uuid, "%s", b->gpus[e->gpu].uuid);
	j->pid = e->pid;
	bool parked = strcmp(e->state, "parked") == 0;
	if (op == PROTO_OP_RELEASE) {
		j->park = e->ext.mode == EXT_MODE_PARK || e->ext.park_next;
		j->explicit_park = e->ext.park_next;
		j->h = e->ext.release;
	} else if (op == PROTO_OP_REFILL) {
		j->resume = parked;
		j->h = e->ext.refill;
	}
	if (j->h.timeout_s <= 0)
		j->h.timeout_s = 30;
	e->ext.park_next = false;
	j->before = e->mapped;
	j->declared = e->ext.declared ? e->ext.declared : e->ceiling;
	j->granted = e->grant;
	j->need = e->ext.parked_bytes;
	uint64_t id = j->id;
	atomic_fetch_add(&b->hooks_running, 1);
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_t th;
	int rc = pthread_create(&th, &at, hook_main, j);
	pthread_attr_destroy(&at);
	if (rc != 0) {
		atomic_fetch_sub(&b->hooks_running, 1);
		free(j);
		return BATON_ENOMEM;
	}
	e->in_flight = true;
	e->job_id = id; /* j is the thread's now */
	e->job_long = false;
	e->job_t0 = baton_now_s();
	*job_id = e->job_id;
	return 0;
}
