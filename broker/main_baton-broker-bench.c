/*
 * baton-broker-bench: the broker's benchmark (figures, not a test).
 *
 * Starts a broker and two engines of one synthetic model on a device that
 * holds one of them whole (host backend: a host device 1.5x the cache; cuda:
 * the broker manages 1.5x the cache of the GPU, [gpu "*"] total_mib), then
 * measures:
 *   - the control round trip, client -> broker -> engine -> broker ->
 *     client: `refill` of an engine that is already whole (the broker grants
 *     nothing, commands the engine with a new epoch, waits for its
 *     acknowledgement, answers), --commands times; with, for scale, the
 *     broker alone (`status`) and the engine alone (its `status`);
 *   - scripted handoffs (`handoff a b`), split into decide, release and
 *     refill (the broker's reply), then the first request served by b;
 *   - on-demand handoffs: a GEN to the engine that does not hold the device;
 *     its parts from the broker's handoff event, and the GEN's own latency
 *     (the first request served, everything included).
 *
 *   baton-broker-bench [--bin DIR] [--backend host|cuda] [--commands N]
 *       [--handoffs N] [--layers N --experts N --d-model N --d-ff N --dtype T]
 *       [--segment-mib N] [--json FILE]
 *
 * --bin is where baton-broker, baton-engine and baton-arena are (default:
 * this program's directory). Everything lives in a temporary directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "broker/broker.h"

extern char **environ;


static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static struct {
	pid_t pids[8];
	int n;
	char dir[PATH_MAX];
} kids;

static void stop_all(void)
{
	for (int i = kids.n - 1; i >= 0; i--)
		if (kids.pids[i] > 0)
			kill(kids.pids[i], SIGTERM);
	for (int i = kids.n - 1; i >= 0; i--)
		if (kids.pids[i] > 0)
			waitpid(kids.pids[i], NULL, 0);
	kids.n = 0;
	if (kids.dir[0]) {
		char cmd[PATH_MAX + 16];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", kids.dir);
		if (system(cmd) != 0)
			fprintf(stderr, "could not remove %s\n", kids.dir);
		kids.dir[0] = 0;
	}
}

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("baton-broker-bench: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	if (kids.dir[0]) { /* the logs go with the directory: show their ends */
		char cmd[PATH_MAX + 64];
		snprintf(cmd, sizeof cmd, "tail -n 20 '%s'/*.log >&2", kids.dir);
		if (system(cmd) != 0)
			fputs("(no logs)\n", stderr);
	}
	stop_all();
	exit(1);
}

/* Starts argv with stdout to a pipe and stderr to a log; waits for a line
 * starting with "ready" (timeout_s) unless ready is NULL. */
static pid_t spawn(char *const argv[], const char *log, int wait_ready, double timeout_s)
{
	int p[2];
	if (pipe(p) != 0)
		die("pipe: %s", strerror(errno));
	posix_spawn_file_actions_t fa;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, p[1], 1);
	posix_spawn_file_actions_addclose(&fa, p[0]);
	posix_spawn_file_actions_addopen(&fa, 2, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
	pid_t pid;
	int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(p[1]);
	if (rc != 0)
		die("cannot start %s: %s", argv[0], strerror(rc));
	kids.pids[kids.n++] = pid;
	if (!wait_ready) {
		close(p[0]);
		return pid;
	}
	char buf[512];
	size_t n = 0;
	double end = baton_now_s() + timeout_s;
	while (baton_now_s() < end) {
		struct pollfd pf = { .fd = p[0], .events = POLLIN };
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t r = read(p[0], buf + n, sizeof buf - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
		buf[n] = 0;
		if (strchr(buf, '\n')) {
			close(p[0]);
			if (strncmp(buf, "ready", 5) == 0)
				return pid;
			break;
		}
	}
	close(p[0]);
	die("%s did not start; see %s", argv[0], log);
}

/* snprintf that dies rather than cut a path */
#define PATHF(buf, ...) do { \
		if (snprintf((buf), sizeof(buf), __VA_ARGS__) >= (int)sizeof(buf)) \
			die("path too long"); \
	} while (0)

static int run_wait(char *const argv[], const char *log)
{
	pid_t pid = spawn(argv, log, 0, 0);
	int st;
	waitpid(pid, &st, 0);
	kids.n--;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

struct stats {
	double p50, p90, p99, max, mean;
};

static struct stats stats_of(double *v, size_t n)
{
	struct stats s = { 0 };
	if (!n)
		return s;
	qsort(v, n, sizeof *v, cmp_d);
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	s.mean = sum / (double)n;
	s.p50 = v[(size_t)(0.50 * (double)(n - 1) + 0.5)];
	s.p90 = v[(size_t)(0.90 * (double)(n - 1) + 0.5)];
	s.p99 = v[(size_t)(0.99 * (double)(n - 1) + 0.5)];
	s.max = v[n - 1];
	return s;
}

static int call(struct proto_client *cli, struct baton_msg *req, struct baton_msg *rep)
{
	struct proto_diag d;
	int rc = proto_client_call(cli, req, rep, 60000, &d);
	if (rc)
		die("%s: %s", proto_op_name(req->op), d.text);
	return 0;
}

static double round_trips(struct proto_client *cli, enum proto_op op, const char *name, size_t n,
    double *v)
{
	double t_all = baton_now_s();
	for (size_t i = 0; i < n; i++) {
		struct baton_msg req, rep;
		proto_msg_init(&req, op);
		if (name) {
			req.name = name;
			proto_set(&req, PF_NAME);
		}
		double t0 = baton_now_s();
		call(cli, &req, &rep);
		v[i] = (baton_now_s() - t0) * 1e3;
		proto_msg_free(&rep);
	}
	return baton_now_s() - t_all;
}

static double gen_ms(struct proto_client *cli, uint64_t seed)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_GEN);
	req.steps = 1;
	req.batch = 1;
	req.seed = seed;
	double t0 = baton_now_s();
	call(cli, &req, &rep);
	double ms = (baton_now_s() - t0) * 1e3;
	proto_msg_free(&rep);
	return ms;
}

/* The next handoff event for `to`, its parts parsed from the reason. */
static int next_handoff(struct proto_sub *sub, const char *to, double *decide, double *release,
    double *refill, double *total)
{
	double end = baton_now_s() + 10;
	while (baton_now_s() < end) {
		struct baton_msg ev;
		if (proto_sub_recv(sub, &ev, 1000, NULL) != 0)
			continue;
		int found = strcmp(ev.kind, "handoff") == 0 && strcmp(ev.engine, to) == 0;
		if (found) {
			const char *p = strstr(ev.reason, ": decide ");
			if (!p || sscanf(p, ": decide %lf ms, release %lf ms, refill %lf ms", decide, release,
			        refill) != 3)
				found = 0;
			*total = ev.ms;
		}
		proto_msg_free(&ev);
		if (found)
			return 0;
	}
	return -1;
}

static long opt_long(int argc, char **argv, const char *flag, long dflt)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], flag) == 0) {
			int64_t v;
			if (baton_parse_i64(argv[i + 1], INT32_MIN, INT32_MAX, &v))
				die("%s wants a whole number, not '%s'", flag, argv[i + 1]);
			return (long)v;
		}
	return dflt;
}

static const char *opt_str(int argc, char **argv, const char *flag, const char *dflt)
{
	for (int i = 1; i + 1 < argc; i++)
		if (strcmp(argv[i], flag) == 0)
			return argv[i + 1];
	return dflt;
}

static void print_stats(FILE *f, const char *what, struct stats s)
{
	fprintf(f, "  %-44s p50 %9.3f  p90 %9.3f  p99 %9.3f  max %9.3f  mean %9.3f ms\n", what, s.p50, s.p90,
	    s.p99, s.max, s.mean);
}

int main(int argc, char **argv)
{
	static const char usage[] =
	    "usage: baton-broker-bench [--bin DIR] [--backend host|cuda] [--commands N] [--handoffs N]\n"
	    "       [--layers N --experts N --d-model N --d-ff N --dtype T] [--segment-mib N] [--json FILE]\n"
	    "       [--help] [--version]\n";
	/* Every flag takes a value; anything else is a mistake, not a run of
	 * the whole benchmark with defaults. */
	static const char *const valued[] = { "--bin", "--backend", "--commands", "--handoffs", "--layers",
	    "--experts", "--d-model", "--d-ff", "--dtype", "--segment-mib", "--json" };
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0) {
			fputs(usage, stdout);
			return 0;
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("baton-broker-bench %s\n", BATON_VERSION);
			return 0;
		}
		size_t k = 0, nv = sizeof valued / sizeof valued[0];
		while (k < nv && strcmp(argv[i], valued[k]) != 0)
			k++;
		if (k == nv || i + 1 >= argc) {
			fprintf(stderr, "baton-broker-bench: %s '%s'\n%s", k == nv ? "unknown option" : "no value for",
			    argv[i], usage);
			return 2;
		}
		i++;
	}
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	char self[PATH_MAX], bindir[PATH_MAX];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
	self[sl > 0 ? sl : 0] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = 0;
	snprintf(bindir, sizeof bindir, "%s", opt_str(argc, argv, "--bin", self));
	const char *backend = opt_str(argc, argv, "--backend", "host");
	size_t n_cmd = (size_t)opt_long(argc, argv, "--commands", 10000);
	size_t n_ho = (size_t)opt_long(argc, argv, "--handoffs", 20);
	const char *layers = opt_str(argc, argv, "--layers", "4");
	const char *experts = opt_str(argc, argv, "--experts", "16");
	const char *d_model = opt_str(argc, argv, "--d-model", "512");
	const char *d_ff = opt_str(argc, argv, "--d-ff", "1024");
	const char *dtype = opt_str(argc, argv, "--dtype", "f16");
	const char *seg = opt_str(argc, argv, "--segment-mib", "32");
	const char *json = opt_str(argc, argv, "--json", NULL);

	snprintf(kids.dir, sizeof kids.dir, "/tmp/baton-broker-bench.XXXXXX");
	if (!mkdtemp(kids.dir))
		die("mkdtemp: %s", strerror(errno));
	setenv("BATON_HOSTDEV_DIR", kids.dir, 1);
	char path[PATH_MAX], log[PATH_MAX], arena[PATH_MAX], ini[PATH_MAX];
	char control[PATH_MAX + 8], events[PATH_MAX + 8], url_a[PATH_MAX + 8], url_b[PATH_MAX + 8];
	PATHF(arena, "%s/bench.arena", kids.dir);
	PATHF(control, "ipc://%s/broker.sock", kids.dir);
	PATHF(events, "ipc://%s/events.sock", kids.dir);
	PATHF(url_a, "ipc://%s/a.sock", kids.dir);
	PATHF(url_b, "ipc://%s/b.sock", kids.dir);

	/* the model */
	PATHF(path, "%s/baton-arena", bindir);
	PATHF(log, "%s/arena.log", kids.dir);
	{
		char *av[] = { path, "create", "--synthetic", "--layers", (char *)layers, "--experts",
			(char *)experts, "--top-k", "2", "--d-model", (char *)d_model, "--d-ff", (char *)d_ff,
			"--dtype", (char *)dtype, "--seed", "1", arena, NULL };
		if (run_wait(av, log) != 0)
			die("baton-arena create failed; see %s", log);
	}
	struct stat st;
	if (stat(arena, &st) != 0)
		die("no arena");
	double model_mib = (double)st.st_size / BATON_MIB;
	/* a device for one whole cache and a half */
	long dev_mib = (long)(model_mib * 1.5) + 64;

	PATHF(ini, "%s/broker.ini", kids.dir);
	FILE *f = fopen(ini, "w");
	if (!f)
		die("%s: %s", ini, strerror(errno));
	fprintf(f, "[broker]\ncontrol = %s\nevents = %s\nacquire_wait_ms = 30000\n", control, events);
	if (strcmp(backend, "cuda") == 0)
		fprintf(f, "[gpu \"*\"]\ntotal_mib = %ld\n", dev_mib);
	fclose(f);

	PATHF(path, "%s/baton-broker", bindir);
	PATHF(log, "%s/broker.log", kids.dir);
	{
		char *av[] = { path, "--config", ini, NULL };
		spawn(av, log, 1, 10);
	}
	struct proto_sub *sub;
	if (proto_sub_open(&sub, events, NULL) != 0)
		die("cannot subscribe to %s", events);
	char devmib[32];
	snprintf(devmib, sizeof devmib, "%ld", dev_mib);
	const char *names[2] = { "a", "b" };
	const char *urls[2] = { url_a, url_b };
	PATHF(path, "%s/baton-engine", bindir);
	for (int i = 0; i < 2; i++) {
		PATHF(log, "%s/%s.log", kids.dir, names[i]);
		char *av[] = { path, "--name", (char *)names[i], "--shared-expert-arena", arena, "--listen",
			(char *)urls[i], "--broker", control, "--backend", (char *)backend, "--host-device-mib",
			devmib, "--vram-segment-mib", (char *)seg, "--expert-cache-release", NULL };
		spawn(av, log, 1, 120);
	}
	struct proto_client *broker, *ea, *eb;
	if (proto_client_open(&broker, control, NULL) || proto_client_open(&ea, url_a, NULL) ||
	    proto_client_open(&eb, url_b, NULL))
		die("cannot connect");
	usleep(200000); /* the subscription is up */

	/* b's start took the device from a: give it back for the round trips */
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_HANDOFF);
	req.from = "b";
	req.to = "a";
	call(broker, &req, &rep);
	proto_msg_free(&rep);
	proto_msg_init(&req, PROTO_OP_STATUS);
	call(broker, &req, &rep);
	uint64_t ceiling = 0;
	for (uint32_t i = 0; i < rep.engines.n; i++)
		if (strcmp(rep.engines.v[i].name, "a") == 0)
			ceiling = rep.engines.v[i].ceiling;
	char device[160] = "";
	if (rep.gpus.n)
		snprintf(device, sizeof device, "%s, %.0f MiB managed", rep.gpus.v[0].uuid,
		    (double)rep.gpus.v[0].total / BATON_MIB);
	proto_msg_free(&rep);

	/* control round trips */
	double *v = calloc(n_cmd ? n_cmd : 1, sizeof *v);
	if (!v)
		die("no memory");
	for (size_t i = 0; i < 200; i++) /* warm up */
		round_trips(broker, PROTO_OP_REFILL, "a", 1, v);
	double wall = round_trips(broker, PROTO_OP_REFILL, "a", n_cmd, v);
	struct stats rt = stats_of(v, n_cmd);
	round_trips(broker, PROTO_OP_STATUS, NULL, n_cmd, v);
	struct stats rt_broker = stats_of(v, n_cmd);
	round_trips(ea, PROTO_OP_STATUS, NULL, n_cmd, v);
	struct stats rt_engine = stats_of(v, n_cmd);

	/* scripted handoffs: a -> b, first request to b; b -> a, first to a */
	size_t nh = 2 * n_ho;
	double *hd = calloc(nh, sizeof *hd), *hr = calloc(nh, sizeof *hr), *hf = calloc(nh, sizeof *hf),
	       *ht = calloc(nh, sizeof *ht), *hg = calloc(nh, sizeof *hg), *hs = calloc(nh, sizeof *hs);
	if (!hd || !hr || !hf || !ht || !hg || !hs)
		die("no memory");
	for (size_t i = 0; i < nh; i++) {
		int to_b = i % 2 == 0;
		proto_msg_init(&req, PROTO_OP_HANDOFF);
		req.from = to_b ? "a" : "b";
		req.to = to_b ? "b" : "a";
		double t0 = baton_now_s();
		call(broker, &req, &rep);
		hg[i] = gen_ms(to_b ? eb : ea, i);
		hs[i] = (baton_now_s() - t0) * 1e3;
		hd[i] = rep.decide_ms;
		hr[i] = rep.release_ms;
		hf[i] = rep.refill_ms;
		ht[i] = rep.total_ms;
		proto_msg_free(&rep);
	}
	double refill_p50 = stats_of(hf, nh).p50;
	struct stats s_hd = stats_of(hd, nh), s_hr = stats_of(hr, nh), s_hf = stats_of(hf, nh),
	             s_ht = stats_of(ht, nh), s_hg = stats_of(hg, nh), s_hs = stats_of(hs, nh);

	/* on-demand handoffs: a GEN to the engine without the device */
	double *od = calloc(nh, sizeof *od), *orl = calloc(nh, sizeof *orl), *orf = calloc(nh, sizeof *orf),
	       *og = calloc(nh, sizeof *og);
	if (!od || !orl || !orf || !og)
		die("no memory");
	size_t nod = 0;
	for (;;) { /* the events so far are not these */
		struct baton_msg ev;
		if (proto_sub_recv(sub, &ev, 300, NULL) == BATON_ETIMEDOUT)
			break;
		proto_msg_free(&ev);
	}
	for (size_t i = 0; i < nh; i++) {
		int to_b = i % 2 == 0;
		double ms = gen_ms(to_b ? eb : ea, 100 + i);
		double d, r, fl, tot;
		if (next_handoff(sub, to_b ? "b" : "a", &d, &r, &fl, &tot) != 0)
			die("no handoff event for the GEN to %s", to_b ? "b" : "a");
		od[nod] = d;
		orl[nod] = r;
		orf[nod] = fl;
		og[nod] = ms;
		nod++;
	}
	struct stats s_od = stats_of(od, nod), s_orl = stats_of(orl, nod), s_orf = stats_of(orf, nod),
	             s_og = stats_of(og, nod);

	char host[256] = "?";
	gethostname(host, sizeof host);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	time_t t = time(NULL);
	char date[32];
	strftime(date, sizeof date, "%Y-%m-%d", localtime(&t));
	printf("baton-broker-bench, %s, %s backend (%s), %ld CPUs, host %s\n", date, backend, device, cpus, host);
	printf("model: %s layers x %s experts, d_model %s, d_ff %s, %s: arena %.1f MiB, cache %.1f MiB "
	    "(segments of %s MiB)\n\n", layers, experts, d_model, d_ff, dtype, model_mib,
	    (double)ceiling / BATON_MIB, seg);
	printf("control round trip, %zu commands each (%.0f commands/s end to end):\n", n_cmd,
	    (double)n_cmd / wall);
	print_stats(stdout, "client -> broker -> engine -> back (refill)", rt);
	print_stats(stdout, "client -> broker -> back (status)", rt_broker);
	print_stats(stdout, "client -> engine -> back (status)", rt_engine);
	printf("\nscripted handoff (baton handoff), %zu, alternating a <-> b, %.1f MiB each:\n", nh,
	    (double)ceiling / BATON_MIB);
	print_stats(stdout, "decide", s_hd);
	print_stats(stdout, "release (command + acknowledgement)", s_hr);
	print_stats(stdout, "refill (command + copy + acknowledgement)", s_hf);
	print_stats(stdout, "handoff total (broker's)", s_ht);
	print_stats(stdout, "first request served after (GEN latency)", s_hg);
	print_stats(stdout, "handoff + first request (client's clock)", s_hs);
	printf("  refill rate at p50: %.2f GB/s (the arena's %.1f MiB, command and acknowledgement included)\n",
	    (double)st.st_size / (refill_p50 / 1e3) / 1e9, model_mib);
	printf("\non-demand handoff (a GEN to the engine without the device), %zu:\n", nod);
	print_stats(stdout, "decide", s_od);
	print_stats(stdout, "release (the idle engine's, acknowledged)", s_orl);
	print_stats(stdout, "refill (the asking engine's)", s_orf);
	print_stats(stdout, "first request served (GEN latency, all in)", s_og);
	if (json) {
		FILE *j = fopen(json, "w");
		if (j) {
			fprintf(j, "{\"date\": \"%s\", \"backend\": \"%s\", \"cpus\": %ld, \"cache_bytes\": %" PRIu64
			    ", \"commands\": %zu, \"rt_p50_ms\": %.4f, \"rt_p99_ms\": %.4f, "
			    "\"broker_status_p50_ms\": %.4f, \"engine_status_p50_ms\": %.4f, "
			    "\"handoff\": {\"decide_p50_ms\": %.4f, \"release_p50_ms\": %.4f, \"refill_p50_ms\": %.4f, "
			    "\"total_p50_ms\": %.4f, \"first_gen_p50_ms\": %.4f}, "
			    "\"on_demand\": {\"decide_p50_ms\": %.4f, \"release_p50_ms\": %.4f, \"refill_p50_ms\": %.4f, "
			    "\"first_gen_p50_ms\": %.4f}}\n",
			    date, backend, cpus, ceiling, n_cmd, rt.p50, rt.p99, rt_broker.p50, rt_engine.p50,
			    s_hd.p50, s_hr.p50, s_hf.p50, s_ht.p50, s_hg.p50, s_od.p50, s_orl.p50, s_orf.p50,
			    s_og.p50);
			fclose(j);
		}
	}
	proto_sub_close(sub);
	proto_client_close(broker);
	proto_client_close(ea);
	proto_client_close(eb);
	free(v);
	free(hd), free(hr), free(hf), free(ht), free(hg), free(hs);
	free(od), free(orl), free(orf), free(og);
	stop_all();
	return 0;
}
