/*
 * baton: the command-line client of the broker (and of an engine's GEN,
 * for demos). See usage_text below and docs/reference/cli.md.
 *
 * Exit status, for scripts (stable):
 *   0  done
 *   1  failed: the broker or engine said no (pinned, device_oom, ...), no
 *      answer in time, or no broker at that address; the reason on stderr
 *   2  usage: bad flags or arguments (also the broker's "invalid")
 *   3  busy: the engine is in the middle of a request (try again)
 *   4  not found: no engine of that name
 *
 * Output: results on stdout (one line, or JSON with --json); errors on
 * stderr as "baton: <reason>". A long operation (refill, handoff, vram,
 * release) draws a progress line on stderr only when stderr is a terminal
 * (not with --quiet): it polls the broker's status every 200 ms from a
 * second thread, with its own connection, and erases the line before the
 * result is printed. Piped, nothing but the result is written.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker.h"
#include "broker/cli/cli.h"
#include "broker/cli/door_cmd.h"
#include "broker/cli/engine.h"
#include "broker/cli/run_cmd.h"
#include "broker/cli/text_cmd.h"
#include "broker/cli/tokenize_cmd.h"
#include "broker/cli/top.h"

static const char usage_text[] =
    "usage: baton [--broker URL] [--events URL] [--timeout T] [--json] [--quiet] COMMAND [ARGS]\n"
    "\n"
    "  status                     devices and engines: state, memory, priority, pins, idle, last refill\n"
    "  engines                    the engines only\n"
    "  gpus                       the devices only\n"
    "  watch [--count N]          print events as they come, until interrupted (alias: events)\n"
    "  top [--interval T] [--once]  a live view of devices and engines, redrawn every T (1s; a bare\n"
    "                             number is seconds, 500ms too; at least 100ms);\n"
    "                             q or Ctrl-C quits; --once (or not a terminal): one frame\n"
    "  release NAME [--all]       give NAME's device memory back (it keeps its model in RAM);\n"
    "                             --all: its dense weights and KV cache too (a whole model)\n"
    "  release --every [--gpu G]  release every engine that holds memory (of device G)\n"
    "  refill NAME                make NAME whole again (the broker makes room first)\n"
    "  vram NAME --reserve-mib N  keep N MiB of the device free (shrink); --full: grow back\n"
    "  handoff FROM TO            release (or shrink) FROM, then refill TO; prints the timings\n"
    "  pin NAME | unpin NAME      a pinned engine is never reclaimed or released\n"
    "  gen ENGINE [--steps N] [--batch N] [--seed N]   one request to an engine (its name or URL)\n"
    "  models [--json] [--http ADDR]  the front door's models: state, device, memory, requests\n"
    "  complete NAME PROMPT [...] continue a prompt with model NAME (the front door's), else engine\n"
    "                             NAME's (baton complete --help)\n"
    "  chat NAME [MESSAGE...]     chat with model NAME (the front door's), else engine NAME's, one\n"
    "                             turn per MESSAGE or line of stdin\n"
    "      complete and chat take their flags after the command: --max-tokens N, --temperature T,\n"
    "      --top-p P, --top-k K, --min-p P, --repetition-penalty R, --presence-penalty P,\n"
    "      --frequency-penalty F, --seed N, --stop TEXT, --system TEXT, --no-thinking, --json,\n"
    "      and the front door's --http ADDR (else $BATON_HTTP) and --token-file FILE\n"
    "  run --mib N [--gpu G] [--priority P] [--name NAME] [--wait T] -- COMMAND...\n"
    "                             lend N MiB to a job: the broker makes room, runs COMMAND,\n"
    "                             takes the memory back when it exits (exit status: the job's)\n"
    "  lease acquire --mib N (--ttl T | --pid P) [--gpu G] [--priority P] [--name NAME] [--wait T]\n"
    "  lease renew NAME [--ttl T] | lease release NAME   a lease a program manages itself\n"
    "  external add NAME (--pid P | --pid-file F | --unit U) [--gpu G] [--priority P] [--pinned]\n"
    "      [--mib N] [--url URL --model M] [--release HOOK --refill HOOK | --release park] [--hook-timeout T]\n"
    "  external remove NAME | external report NAME --mib N   a program that is not Baton's\n"
    "  park NAME | resume NAME    checkpoint an external CUDA process's memory to host memory, and back\n"
    "      run, lease, external, park and resume take their flags after the command\n"
    "  tokenize (ARENA | --tokenizer PATH) TEXT    token ids of TEXT [--no-add-special] [--no-parse-special]\n"
    "  detokenize (ARENA | --tokenizer PATH) IDS   the text of token ids [--skip-special]\n"
    "\n"
    "  --broker URL   the broker's control socket: else $BATON_BROKER, else " BROKER_DEFAULT_CONTROL "\n"
    "  --events URL   its event socket: else $BATON_EVENTS, else events.sock beside an ipc://\n"
    "                 --broker, else " BROKER_DEFAULT_EVENTS "\n"
    "  --timeout T    wait at most T for an answer (500ms, 30s, 2m; a bare number is ms;\n"
    "                 default 60s); for watch: stop after T\n"
    "  --json         machine-readable output on stdout (watch: one JSON object a line)\n"
    "  --version      print baton's version and exit\n"
    "  --quiet, -q    no progress line on a terminal\n"
    "\n"
    "Exit status: 0 done, 1 failed (reason on stderr), 2 usage, 3 busy (an engine is\n"
    "in the middle of a request), 4 not found.\n";

/* ---- options ------------------------------------------------------------------------ */

struct opts {
	const char *broker, *events;
	bool broker_given, events_given;
	int timeout_ms;          /* calls */
	bool timeout_given;
	bool json, quiet;
	long count;              /* watch: -1 forever */
	bool has_reserve, full;
	int interval_ms;         /* top */
	bool once;               /* top */
	uint64_t reserve_mib;
	bool has_steps, has_batch, has_seed;
	uint32_t steps, batch;
	uint64_t seed;
	const char *gpu;         /* release --every --gpu G */
	const char *pos[4];
	int npos;
	unsigned given;          /* bits of command-specific flags seen */
};

enum {
	F_COUNT = 1u << 0,
	F_RESERVE = 1u << 1,
	F_FULL = 1u << 2,
	F_GEN = 1u << 3,
	F_EVERY = 1u << 4,
	F_GPU = 1u << 5,
	F_ALL = 1u << 6,
	F_TOP = 1u << 7,
};

static struct opts opt = { .timeout_ms = 60000, .count = -1, .interval_ms = 1000 };

static uint64_t parse_u64(const char *flag, const char *v, uint64_t max)
{
	uint64_t x;
	if (baton_parse_u64(v, 0, max, &x))
		cli_die_usage("%s wants a whole number up to %" PRIu64 ", not '%s'", flag, max, v);
	return x;
}

/* "500ms", "30s", "2m" -> milliseconds; a bare number is bare_ms each
 * (1: milliseconds, for --timeout; 1000: seconds, for --interval). */
static int parse_duration_ms(const char *flag, const char *v, double bare_ms)
{
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	double mult = 1;
	if (*end == 0)
		mult = bare_ms;
	else if (strcmp(end, "ms") == 0)
		mult = 1;
	else if (strcmp(end, "s") == 0)
		mult = 1e3;
	else if (strcmp(end, "m") == 0)
		mult = 60e3;
	else
		end = (char *)v;
	if (errno || end == v || !(x > 0) || x * mult > 86400e3)
		cli_die_usage("%s wants a duration like 500ms, 30s or 2m, not '%s'", flag, v);
	int ms = (int)(x * mult + 0.5);
	return ms > 0 ? ms : 1;
}

static void parse_args(int argc, char **argv)
{
	bool only_pos = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (only_pos || a[0] != '-' || a[1] == 0) {
			if (opt.npos == (int)(sizeof opt.pos / sizeof opt.pos[0]))
				cli_die_usage("too many arguments ('%s')", a);
			opt.pos[opt.npos++] = a;
			continue;
		}
		if (strcmp(a, "--") == 0) {
			only_pos = true;
			continue;
		}
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			fputs(usage_text, stdout);
			exit(EXIT_DONE);
		}
		if (strcmp(a, "--version") == 0) {
			printf("baton %s\n", baton_version());
			exit(EXIT_DONE);
		}
		/* --flag=value or --flag value */
		char name[64];
		const char *val = NULL;
		const char *eq = strchr(a, '=');
		if (eq && a[1] == '-') {
			if ((size_t)(eq - a) >= sizeof name)
				cli_die_usage("unknown flag '%s'", a);
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = 0;
			val = eq + 1;
		} else {
			snprintf(name, sizeof name, "%s", a);
		}
		if (strcmp(name, "--json") == 0 || strcmp(name, "--quiet") == 0 || strcmp(name, "-q") == 0 ||
		    strcmp(name, "--full") == 0 || strcmp(name, "--every") == 0 || strcmp(name, "--all") == 0 ||
		    strcmp(name, "--once") == 0) {
			if (val)
				cli_die_usage("%s takes no value", name);
			if (strcmp(name, "--json") == 0)
				opt.json = true;
			else if (strcmp(name, "--full") == 0)
				opt.full = true, opt.given |= F_FULL;
			else if (strcmp(name, "--once") == 0)
				opt.once = true, opt.given |= F_TOP;
			else if (strcmp(name, "--every") == 0)
				opt.given |= F_EVERY;
			else if (strcmp(name, "--all") == 0)
				opt.given |= F_ALL;
			else
				opt.quiet = true;
			continue;
		}
		static const char *const with_value[] = { "--broker", "--events", "--timeout", "--count",
			"--reserve-mib", "--steps", "--batch", "--seed", "--gpu", "--interval" };
		bool known = false;
		for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
			known |= strcmp(name, with_value[k]) == 0;
		if (!known)
			cli_die_usage("unknown flag '%s'", name);
		if (!val) {
			if (i + 1 >= argc)
				cli_die_usage("%s wants a value", name);
			val = argv[++i];
		}
		if (strcmp(name, "--broker") == 0) {
			opt.broker = val, opt.broker_given = true;
		} else if (strcmp(name, "--events") == 0) {
			opt.events = val, opt.events_given = true;
		} else if (strcmp(name, "--timeout") == 0) {
			opt.timeout_ms = parse_duration_ms(name, val, 1), opt.timeout_given = true;
		} else if (strcmp(name, "--interval") == 0) {
			opt.interval_ms = parse_duration_ms(name, val, 1000), opt.given |= F_TOP;
			if (opt.interval_ms < 100)
				cli_die_usage("--interval '%s': at least 100ms (a bare number is seconds: --interval 2)", val);
		} else if (strcmp(name, "--count") == 0) {
			opt.count = (long)parse_u64(name, val, 1000000000), opt.given |= F_COUNT;
		} else if (strcmp(name, "--reserve-mib") == 0) {
			opt.reserve_mib = parse_u64(name, val, PROTO_RESERVE_MIB_MAX);
			opt.has_reserve = true, opt.given |= F_RESERVE;
		} else if (strcmp(name, "--gpu") == 0) {
			opt.gpu = val, opt.given |= F_GPU;
		} else if (strcmp(name, "--steps") == 0) {
			opt.steps = (uint32_t)parse_u64(name, val, UINT32_MAX), opt.has_steps = true, opt.given |= F_GEN;
		} else if (strcmp(name, "--batch") == 0) {
			opt.batch = (uint32_t)parse_u64(name, val, UINT32_MAX), opt.has_batch = true, opt.given |= F_GEN;
		} else {
			opt.seed = parse_u64(name, val, UINT64_MAX), opt.has_seed = true, opt.given |= F_GEN;
		}
	}
}

/* Command-specific flags that this command does not take are usage errors. */
static void allow_only(const char *cmd, unsigned allowed)
{
	static const struct { unsigned bit; const char *flag; } names[] = {
		{ F_COUNT, "--count" }, { F_RESERVE, "--reserve-mib" }, { F_FULL, "--full" },
		{ F_GEN, "--steps/--batch/--seed" }, { F_EVERY, "--every" }, { F_GPU, "--gpu" },
		{ F_ALL, "--all" }, { F_TOP, "--interval/--once" },
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if ((opt.given & names[i].bit) && !(allowed & names[i].bit))
			cli_die_usage("%s does not take %s", cmd, names[i].flag);
}

static void want_args(const char *cmd, int n, const char *what)
{
	if (opt.npos - 1 != n)
		cli_die_usage("%s wants %s", cmd, what);
}

/* ---- formatting --------------------------------------------------------------------- */

/* Prints a JSON value on one line; false when stdout failed. */
static bool put_json(json_t *v)
{
	if (!v) {
		fputs("baton: out of memory\n", stderr);
		exit(EXIT_FAILED);
	}
	int rc = json_dumpf(v, stdout, JSON_COMPACT | JSON_ENSURE_ASCII);
	json_decref(v);
	fputc('\n', stdout);
	return rc == 0 && fflush(stdout) == 0;
}

static json_t *jint(uint64_t v)
{
	return json_integer((json_int_t)v);
}

/* ---- calls ------------------------------------------------------------------------ */

struct progress {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop, running;
	bool drawn;
	bool draw;               /* stderr is a terminal: draw the line */
	bool watch;              /* no --timeout: the call waits while the broker answers */
	struct proto_client *cli; /* the watched call's client (under mu) */
	bool gone;               /* the broker stopped answering: cli was shut down */
	double last_ok;          /* the last status answered */
	const char *label;       /* "refill qwen" */
	const char *names[2];    /* engines to show */
	uint64_t goal[2];        /* resident they head for, 0: unknown */
	double t0;
};

static void progress_stop(struct progress *p);

/* One request; on any failure prints "baton: ..." and exits with the code
 * for it (the progress line, if any, is erased first). */
static void call(const char *url, const char *what, struct baton_msg *req, struct baton_msg *rep,
    struct progress *prog)
{
	struct proto_diag d;
	memset(&d, 0, sizeof d);
	bool gone = false, dropped = false;
	bool watch = prog && prog->watch;
	/* A long operation without --timeout (watch) takes as long as it
	 * takes while the broker answers (its own rules end a stalled one);
	 * the progress thread ends the call if the broker stops answering for
	 * the timeout. No resend, with --timeout too: a second copy would
	 * queue a second operation, and a broker that dies under the call
	 * drops its connection, which fails the call at once (BATON_ECONN)
	 * instead of after the whole --timeout (issue 28). */
	struct proto_opts po = { .dial_wait = true, .resend_ms = -1 };
	struct proto_client *cli = NULL;
	int rc = proto_client_open(&cli, url, &po);
	if (rc == 0) {
		if (watch) {
			pthread_mutex_lock(&prog->mu);
			prog->cli = cli;
			pthread_mutex_unlock(&prog->mu);
		}
		rc = proto_client_call(cli, req, rep, watch ? -1 : opt.timeout_ms, &d);
		dropped = rc == BATON_ECONN;
		if (watch) {
			pthread_mutex_lock(&prog->mu);
			prog->cli = NULL;
			gone = prog->gone;
			pthread_mutex_unlock(&prog->mu);
		}
		proto_client_close(cli);
	} else {
		memset(rep, 0, sizeof *rep);
	}
	if (rc == 0)
		return;
	progress_stop(prog);
	if (gone) {
		fprintf(stderr, "baton: %s: the broker at %s stopped answering for %d ms (--timeout); "
		    "what it did is in baton status\n", what, url, opt.timeout_ms);
		exit(EXIT_FAILED);
	}
	if (rep->reply) {
		fprintf(stderr, "baton: %s: %s (%s)\n", what, rep->msg && rep->msg[0] ? rep->msg :
		    baton_strerror(rc), baton_errname(rc));
		proto_msg_free(rep);
		exit(cli_exit_code(rc));
	}
	if (dropped)
		fprintf(stderr, "baton: %s: the connection to the broker at %s dropped (did it stop?)\n", what, url);
	else if (rc == BATON_ECONN)
		fprintf(stderr, "baton: %s: nothing listens at %s (is the broker running? --broker URL)\n",
		    what, url);
	else if (rc == BATON_ETIMEDOUT)
		fprintf(stderr, "baton: %s: no answer from %s within %d ms (--timeout)\n", what, url,
		    opt.timeout_ms);
	else
		fprintf(stderr, "baton: %s: %s: %s%s%s\n", what, url, baton_strerror(rc), d.text[0] ? ": " : "",
		    d.text);
	exit(EXIT_FAILED);
}

/* ---- progress on a terminal -------------------------------------------------------- */


static volatile sig_atomic_t line_dirty;

static void on_fatal_signal(int sig)
{
	if (line_dirty) {
		static const char clear[] = "\r\033[K";
		ssize_t w = write(STDERR_FILENO, clear, sizeof clear - 1);
		(void)w;
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

static void progress_draw(struct progress *p, const struct baton_msg *st, unsigned frame)
{
	static const char spin[] = "|/-\\";
	char line[512], a[32], b[32];
	int n = snprintf(line, sizeof line, "\r%s  %c %.1fs", p->label, spin[frame % 4], baton_now_s() - p->t0);
	for (int k = 0; k < 2 && p->names[k]; k++) {
		const struct proto_engine_info *e = NULL;
		for (uint32_t i = 0; st && i < st->engines.n; i++)
			if (strcmp(st->engines.v[i].name, p->names[k]) == 0)
				e = &st->engines.v[i];
		if (!e || n >= (int)sizeof line)
			continue;
		/* what the broker knows: the state, the device memory mapped
		 * and, while it copies, the bytes copied of those to copy */
		if (e->to_copy) {
			/* its copy's progress, as its heartbeats report it */
			char bar[24];
			double f = e->copied >= e->to_copy ? 1.0 : (double)e->copied / (double)e->to_copy;
			int fill = (int)(f * 20 + 0.5);
			for (int i = 0; i < 20; i++)
				bar[i] = i < fill ? '#' : '.';
			bar[20] = 0;
			n += snprintf(line + n, sizeof line - (size_t)n, "  %s %s [%s] %3d%% of %s", e->name, e->state,
			    bar, (int)(f * 100), cli_fmt_bytes(e->to_copy, b, sizeof b));
			continue;
		}
		n += snprintf(line + n, sizeof line - (size_t)n, "  %s %s, holds %s", e->name, e->state,
		    cli_fmt_bytes(e->resident, a, sizeof a));
		if (p->goal[k] && n < (int)sizeof line)
			n += snprintf(line + n, sizeof line - (size_t)n, " of %s", cli_fmt_bytes(p->goal[k], b, sizeof b));
	}
	struct winsize ws;
	size_t cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 10 ? ws.ws_col : 80;
	size_t len = strlen(line);
	if (len > cols) /* "\r" takes no column; leave the last one free */
		len = cols;
	line_dirty = 1;
	fwrite(line, 1, len, stderr);
	fputs("\033[K", stderr);
	fflush(stderr);
	p->drawn = true;
}

static void *progress_main(void *arg)
{
	struct progress *p = arg;
	struct proto_client *cli = NULL;
	struct proto_opts po = { .dial_wait = true };
	if (proto_client_open(&cli, opt.broker, &po) != 0)
		cli = NULL;
	unsigned frame = 0;
	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		baton_cond_wait_for(&p->cv, &p->mu, 0.2);
		if (p->stop)
			break;
		pthread_mutex_unlock(&p->mu);
		struct baton_msg req, rep;
		bool have = false;
		if (cli) {
			proto_msg_init(&req, PROTO_OP_STATUS);
			have = proto_client_call(cli, &req, &rep, 1000, NULL) == 0;
		}
		pthread_mutex_lock(&p->mu);
		if (have)
			p->last_ok = baton_now_s();
		else if (p->watch && p->cli && !p->gone && baton_now_s() - p->last_ok > opt.timeout_ms / 1e3) {
			p->gone = true;
			proto_client_shutdown(p->cli); /* the call returns closed */
		}
		if (!p->stop && p->draw)
			progress_draw(p, have ? &rep : NULL, frame++);
		if (have)
			proto_msg_free(&rep);
	}
	if (p->drawn) {
		fputs("\r\033[K", stderr);
		fflush(stderr);
		line_dirty = 0;
	}
	pthread_mutex_unlock(&p->mu);
	proto_client_close(cli);
	return NULL;
}

/* Starts the progress thread: it draws the line when stderr is a terminal
 * (and not --quiet), and without --timeout watches that the broker still
 * answers while the call waits; with neither it does nothing. */
static void progress_start(struct progress *p, const char *label, const char *e1, uint64_t g1,
    const char *e2, uint64_t g2)
{
	memset(p, 0, sizeof *p);
	const char *term = getenv("TERM");
	p->draw = !opt.quiet && isatty(STDERR_FILENO) && !(term && strcmp(term, "dumb") == 0);
	p->watch = !opt.timeout_given;
	p->last_ok = baton_now_s();
	if (!p->draw && !p->watch)
		return;
	p->label = label;
	p->names[0] = e1;
	p->names[1] = e2;
	p->goal[0] = g1;
	p->goal[1] = g2;
	p->t0 = baton_now_s();
	pthread_mutex_init(&p->mu, NULL);
	baton_cond_init(&p->cv);
	if (p->draw) {
		signal(SIGINT, on_fatal_signal);
		signal(SIGTERM, on_fatal_signal);
	}
	if (pthread_create(&p->th, NULL, progress_main, p) == 0)
		p->running = true;
	else
		p->watch = false; /* no watcher: the plain call, with its timeout */
}

/* Erases the line and joins the thread. Idempotent; NULL allowed. */
static void progress_stop(struct progress *p)
{
	if (!p || !p->running)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->th, NULL);
	p->running = false;
}

/* ---- status ------------------------------------------------------------------------ */

static void get_status(struct baton_msg *rep)
{
	struct baton_msg req;
	proto_msg_init(&req, PROTO_OP_STATUS);
	call(opt.broker, "status", &req, rep, NULL);
}

static size_t widest(size_t w, const char *s)
{
	size_t n = strlen(s);
	return n > w ? n : w;
}

/* Devices as nvidia-smi shows them: index, product name, uuid. */
static void print_gpus(const struct baton_msg *st)
{
	size_t w = strlen("UUID"), wn = strlen("NAME");
	for (uint32_t i = 0; i < st->gpus.n; i++) {
		w = widest(w, st->gpus.v[i].uuid);
		wn = widest(wn, st->gpus.v[i].name && *st->gpus.v[i].name ? st->gpus.v[i].name : "-");
	}
	printf("%3s  %-*s %-*s %10s %10s %10s %10s %10s %8s\n", "GPU", (int)wn, "NAME", (int)w, "UUID", "TOTAL",
	    "FREE", "RESERVE", "HELD", "LENT", "ENGINES");
	for (uint32_t i = 0; i < st->gpus.n; i++) {
		const struct proto_gpu *g = &st->gpus.v[i];
		char a[32], b[32], c[32], d[32], l[32];
		unsigned ne = 0;
		for (uint32_t k = 0; k < st->engines.n; k++)
			ne += strcmp(st->engines.v[k].gpu, g->uuid) == 0;
		printf("%3u  %-*s %-*s %10s %10s %10s %10s %10s %8u\n", g->index, (int)wn,
		    g->name && *g->name ? g->name : "-", (int)w, g->uuid, cli_fmt_bytes(g->total, a, sizeof a),
		    cli_fmt_bytes(g->free_bytes, b, sizeof b), cli_fmt_bytes(g->reserve, c, sizeof c),
		    cli_fmt_bytes(g->held, d, sizeof d), cli_fmt_bytes(g->lent, l, sizeof l), ne);
	}
	if (st->gpus.n == 0)
		printf("(no devices: no engine has registered)\n");
}

static void print_engines(const struct baton_msg *st)
{
	size_t wn = strlen("ENGINE"), wg = strlen("GPU"), wm = strlen("MODEL");
	for (uint32_t i = 0; i < st->engines.n; i++) {
		wn = widest(wn, st->engines.v[i].name);
		wg = widest(wg, st->engines.v[i].gpu);
		wm = widest(wm, st->engines.v[i].model);
	}
	if (wg > 16)
		wg = 16; /* a GPU uuid is long; its first characters tell them apart */
	if (wm > 16)
		wm = 16;
	printf("%-*s %8s %-*s %-*s %-9s %10s %10s %10s %5s %6s %7s %11s\n", (int)wn, "ENGINE", "PID", (int)wg,
	    "GPU", (int)wm, "MODEL", "STATE", "RESIDENT", "PEER", "CEILING", "PRIO", "PINNED", "IDLE",
	    "LAST REFILL");
	for (uint32_t i = 0; i < st->engines.n; i++) {
		const struct proto_engine_info *e = &st->engines.v[i];
		char a[32], b[32], p[32], idle[32], fill[32];
		if (e->last_refill_gbps > 0)
			snprintf(fill, sizeof fill, "%.2f GB/s", e->last_refill_gbps);
		else
			snprintf(fill, sizeof fill, "-");
		if (*e->peer_gpu)
			cli_fmt_bytes(e->peer, p, sizeof p);
		else
			snprintf(p, sizeof p, "-");
		printf("%-*s %8u %-*.*s %-*.*s %-9s %10s %10s %10s %5d %6s %7s %11s\n", (int)wn, e->name, e->pid,
		    (int)wg, (int)wg, e->gpu, (int)wm, (int)wm, e->model, e->state,
		    cli_fmt_bytes(e->resident, a, sizeof a), p, cli_fmt_bytes(e->ceiling, b, sizeof b), e->priority,
		    e->pinned ? "yes" : "no", cli_fmt_idle(e->idle_ms, idle, sizeof idle), fill);
	}
	/* Engines that serve OpenAI HTTP (the front door routes to them by model). */
	for (uint32_t i = 0; i < st->engines.n; i++)
		if (*st->engines.v[i].http && baton_state_present(baton_state_parse(st->engines.v[i].state)))
			printf("%s serves model %s at %s\n", st->engines.v[i].name, st->engines.v[i].model,
			    st->engines.v[i].http);
	if (st->engines.n == 0)
		printf("(no engines)\n");
	/* Leases and external engines (their rows above): what they are. */
	for (uint32_t i = 0; i < st->engines.n; i++) {
		const struct proto_engine_info *e = &st->engines.v[i];
		const char *kind = broker_entry_kind(e);
		char a[32];
		if (strcmp(kind, "lease") == 0)
			printf("%s is a lease: %s lent to pid %u (%s)\n", e->name, cli_fmt_bytes(e->resident, a, sizeof a),
			    e->pid, e->model);
		else if (strcmp(kind, "external") == 0)
			printf("%s is an external engine (pid %u, released by %s)%s\n", e->name, e->pid, e->ctl + 9,
			    strcmp(e->state, "parked") == 0 ? ": parked, its memory checkpointed to host memory" : "");
	}
}

/* what: 3 status, 1 gpus, 2 engines */
static int cmd_status(int what)
{
	struct baton_msg st;
	get_status(&st);
	bool okw = true;
	if (opt.json) {
		/* the same shapes as the HTTP API's GET /v1/status */
		json_t *j = broker_status_json(&st);
		if (what == 3 || !j) {
			okw = put_json(j);
		} else {
			json_t *part = json_incref(json_object_get(j, what == 1 ? "gpus" : "engines"));
			json_decref(j);
			okw = put_json(part);
		}
	} else {
		if (what & 1)
			print_gpus(&st);
		if (what == 3)
			putchar('\n');
		if (what & 2)
			print_engines(&st);
		okw = fflush(stdout) == 0;
	}
	proto_msg_free(&st);
	return okw ? EXIT_DONE : EXIT_FAILED;
}

/* ---- engine operations --------------------------------------------------------- */

/* The ceiling of an engine as the broker knows it, for the progress line;
 * 0 when unknown (any failure: the progress line only loses its goal). */
static uint64_t ceiling_of(const char *name)
{
	if (opt.quiet || !isatty(STDERR_FILENO))
		return 0;
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	if (proto_call(opt.broker, &req, &rep, 1000, NULL) != 0)
		return 0;
	uint64_t c = 0;
	for (uint32_t i = 0; i < rep.engines.n; i++)
		if (strcmp(rep.engines.v[i].name, name) == 0)
			c = rep.engines.v[i].ceiling;
	proto_msg_free(&rep);
	return c;
}

static int cmd_engine_op(enum proto_op op, const char *name)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, op);
	req.name = name;
	proto_set(&req, PF_NAME);
	char label[300];
	uint64_t goal = 0;
	if (op == PROTO_OP_VRAM) {
		req.reserve_mib = opt.full ? PROTO_RESERVE_FULL : opt.reserve_mib;
		if (opt.full)
			snprintf(label, sizeof label, "vram %s --full", name);
		else
			snprintf(label, sizeof label, "vram %s --reserve-mib %" PRIu64, name, opt.reserve_mib);
		if (opt.full)
			goal = ceiling_of(name);
	} else {
		snprintf(label, sizeof label, "%s %s%s", proto_op_name(op), name,
		    opt.given & F_ALL ? " --all" : "");
		if (op == PROTO_OP_REFILL)
			goal = ceiling_of(name);
	}
	/* release --all goes to the engine itself (found through the
	 * broker): it gives back its dense weights and KV cache too, and
	 * reports the change to the broker */
	char *url = NULL;
	if (op == PROTO_OP_RELEASE && (opt.given & F_ALL)) {
		char err[512];
		int urc = cli_engine_url(opt.broker, name, opt.timeout_ms, &url, err, sizeof err);
		if (urc) {
			fprintf(stderr, "baton: %s: %s\n", label, err);
			return urc == BATON_ENOTFOUND ? EXIT_NOTFOUND : EXIT_FAILED;
		}
		req.all = true;
		proto_set(&req, PF_ALL);
	}
	struct progress prog;
	progress_start(&prog, label, name, goal, NULL, 0);
	double t0 = baton_now_s();
	call(url ? url : opt.broker, label, &req, &rep, &prog);
	free(url);
	double rtt = (baton_now_s() - t0) * 1e3;
	progress_stop(&prog);
	uint64_t holds = proto_has(&rep, PF_MAPPED) ? rep.mapped : rep.resident;
	bool okw;
	if (opt.json) {
		json_t *j = json_object();
		/* the keys of the HTTP API's reply, and a few more */
		json_object_set_new(j, "op", json_string(proto_op_name(op)));
		json_object_set_new(j, "name", json_string(name));
		json_object_set_new(j, "state", json_string(rep.state));
		json_object_set_new(j, "resident", jint(holds));
		if (proto_has(&rep, PF_MAPPED))
			json_object_set_new(j, "experts_bytes", jint(rep.resident));
		if (proto_has(&rep, PF_FREE))
			json_object_set_new(j, "free", jint(rep.free_bytes));
		json_object_set_new(j, "bytes", jint(rep.bytes));
		json_object_set_new(j, "ms", json_real(rep.ms));
		if (op != PROTO_OP_RELEASE && rep.ms > 0 && rep.bytes > 0)
			json_object_set_new(j, "gbps", json_real((double)rep.bytes / (rep.ms / 1e3) / 1e9));
		json_object_set_new(j, "round_trip_ms", json_real(rtt));
		json_object_set_new(j, "epoch", jint(rep.epoch));
		if (proto_has(&rep, PF_LEVEL))
			json_object_set_new(j, "level", json_string(rep.level));
		okw = put_json(j);
	} else {
		char a[32], b[32], rate[48] = "";
		if (op != PROTO_OP_RELEASE && rep.ms > 0 && rep.bytes > 0)
			snprintf(rate, sizeof rate, " (%.2f GB/s)", (double)rep.bytes / (rep.ms / 1e3) / 1e9);
		char level[80] = "";
		if (proto_has(&rep, PF_LEVEL))
			snprintf(level, sizeof level, " (released: %s)", strcmp(rep.level, "all") == 0 ?
			    "experts, dense weights and KV cache" : strcmp(rep.level, "experts") == 0 ?
			    "experts" : "nothing");
		printf("%s %s: %s%s, holds %s, %s %s in %.3f ms%s, round trip %.3f ms, epoch %" PRIu64 "\n",
		    proto_op_name(op), name, rep.state, level, cli_fmt_bytes(holds, a, sizeof a),
		    op == PROTO_OP_RELEASE ? "freed" : "moved", cli_fmt_bytes(rep.bytes, b, sizeof b), rep.ms, rate,
		    rtt, rep.epoch);
		okw = fflush(stdout) == 0;
	}
	proto_msg_free(&rep);
	return okw ? EXIT_DONE : EXIT_FAILED;
}

static int cmd_handoff(const char *from, const char *to)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_HANDOFF);
	req.from = from;
	req.to = to;
	char label[600];
	snprintf(label, sizeof label, "handoff %s %s", from, to);
	struct progress prog;
	progress_start(&prog, label, from, 0, to, ceiling_of(to));
	call(opt.broker, label, &req, &rep, &prog);
	progress_stop(&prog);
	double decide = proto_has(&rep, PF_DECIDE_MS) ? rep.decide_ms : 0.0;
	bool okw;
	if (opt.json) {
		json_t *j = json_object();
		json_object_set_new(j, "from", json_string(from));
		json_object_set_new(j, "to", json_string(to));
		json_object_set_new(j, "decide_ms", json_real(decide));
		json_object_set_new(j, "release_ms", json_real(rep.release_ms));
		json_object_set_new(j, "refill_ms", json_real(rep.refill_ms));
		json_object_set_new(j, "total_ms", json_real(rep.total_ms));
		okw = put_json(j);
	} else {
		printf("handoff %s -> %s: decide %.3f ms, release %.3f ms, refill %.3f ms, total %.3f ms\n", from,
		    to, decide, rep.release_ms, rep.refill_ms, rep.total_ms);
		okw = fflush(stdout) == 0;
	}
	proto_msg_free(&rep);
	return okw ? EXIT_DONE : EXIT_FAILED;
}

static int cmd_pin(const char *name, bool pinned)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_PIN);
	req.name = name;
	req.pinned = pinned;
	char label[300];
	snprintf(label, sizeof label, "%s %s", pinned ? "pin" : "unpin", name);
	call(opt.broker, label, &req, &rep, NULL);
	bool okw;
	if (opt.json) {
		json_t *j = json_object();
		json_object_set_new(j, "name", json_string(name));
		json_object_set_new(j, "pinned", json_boolean(pinned));
		okw = put_json(j);
	} else {
		printf("%s %s\n", name, pinned ? "pinned" : "unpinned");
		okw = fflush(stdout) == 0;
	}
	proto_msg_free(&rep);
	return okw ? EXIT_DONE : EXIT_FAILED;
}

/* release --every [--gpu G]: each engine (of device G) that holds memory,
 * one after another, as POST /v1/release does. A refusal (pinned, busy)
 * is said and the rest go on; the exit status is the first refusal's. */
static int cmd_release_every(const char *gpu)
{
	struct baton_msg req, st;
	proto_msg_init(&req, PROTO_OP_STATUS);
	call(opt.broker, "release --every", &req, &st, NULL);
	bool known = !gpu;
	for (uint32_t i = 0; i < st.gpus.n; i++)
		known = known || strcmp(st.gpus.v[i].uuid, gpu) == 0;
	if (!known) {
		fprintf(stderr, "baton: release --every: no device '%s' (baton gpus lists them)\n", gpu);
		proto_msg_free(&st);
		return EXIT_NOTFOUND;
	}
	json_t *done = json_array(), *failed = json_array();
	int rc = EXIT_DONE;
	bool okw = true;
	for (uint32_t i = 0; i < st.engines.n; i++) {
		const struct proto_engine_info *e = &st.engines.v[i];
		if ((gpu && strcmp(e->gpu, gpu) != 0) || !broker_every_releases(e->state))
			continue;
		struct baton_msg rel, rep;
		proto_msg_init(&rel, PROTO_OP_RELEASE);
		rel.name = e->name;
		proto_set(&rel, PF_NAME);
		struct proto_diag d;
		memset(&d, 0, sizeof d);
		int err = proto_call(opt.broker, &rel, &rep, opt.timeout_ms, &d);
		if (err == 0) {
			json_array_append_new(done, json_pack("{s:s, s:f, s:I}", "name", e->name, "ms", rep.ms, "bytes",
			    (json_int_t)rep.bytes));
			if (!opt.json)
				printf("%s released, %.3f ms\n", e->name, rep.ms);
		} else {
			const char *msg = rep.reply && rep.msg && rep.msg[0] ? rep.msg : baton_strerror(err);
			json_array_append_new(failed, json_pack("{s:s, s:s, s:i, s:s}", "name", e->name, "code",
			    baton_errname(err), "err", err, "message", msg));
			fprintf(stderr, "baton: release %s: %s (%s)\n", e->name, msg, baton_errname(err));
			if (rc == EXIT_DONE)
				rc = cli_exit_code(err);
		}
		proto_msg_free(&rep);
	}
	proto_msg_free(&st);
	if (opt.json)
		okw = put_json(json_pack("{s:o, s:o}", "released", done, "failed", failed));
	else {
		json_decref(done);
		json_decref(failed);
		okw = fflush(stdout) == 0;
	}
	return okw ? rc : EXIT_FAILED;
}

/* ---- watch ------------------------------------------------------------------------ */

static volatile sig_atomic_t stop_watch;

static void on_stop_signal(int sig)
{
	(void)sig;
	stop_watch = 1;
}

/* The events URL: --events, $BATON_EVENTS, events.sock beside an ipc://
 * broker socket given by --broker or $BATON_BROKER, else the default. A
 * guessed one that nobody listens on falls back to the default. */
static int open_events(struct proto_sub **sub, const char **used)
{
	struct proto_opts po = { .dial_wait = true };
	const char *env = getenv("BATON_EVENTS");
	if (opt.events_given || (env && env[0])) {
		*used = opt.events_given ? opt.events : env;
		return proto_sub_open(sub, *used, &po);
	}
	static char guess[BROKER_URL_MAX + 16];
	const char *slash = strrchr(opt.broker, '/');
	if (strncmp(opt.broker, "ipc://", 6) == 0 && strcmp(opt.broker, BROKER_DEFAULT_CONTROL) != 0 && slash &&
	    slash - opt.broker >= 6 && (size_t)(slash - opt.broker) < BROKER_URL_MAX) {
		snprintf(guess, sizeof guess, "%.*s/events.sock", (int)(slash - opt.broker), opt.broker);
		*used = guess;
		if (proto_sub_open(sub, guess, &po) == 0)
			return 0;
	}
	*used = BROKER_DEFAULT_EVENTS;
	return proto_sub_open(sub, *used, &po);
}

static bool print_event(const struct baton_msg *ev)
{
	if (opt.json) {
		json_t *j = json_object();
		json_object_set_new(j, "seq", jint(ev->seq));
		json_object_set_new(j, "time_ms", jint(ev->time_ms));
		json_object_set_new(j, "kind", json_string(ev->kind));
		json_object_set_new(j, "engine", json_string(ev->engine));
		json_object_set_new(j, "gpu", json_string(ev->gpu));
		json_object_set_new(j, "state", json_string(ev->state));
		json_object_set_new(j, "reason", json_string(ev->reason));
		if (proto_has(ev, PF_MS))
			json_object_set_new(j, "ms", json_real(ev->ms));
		if (proto_has(ev, PF_BYTES))
			json_object_set_new(j, "bytes", jint(ev->bytes));
		return put_json(j);
	}
	time_t t = (time_t)(ev->time_ms / 1000);
	struct tm tm;
	localtime_r(&t, &tm);
	char when[32], ms[48] = "", bytes[32] = "-";
	strftime(when, sizeof when, "%H:%M:%S", &tm);
	if (proto_has(ev, PF_MS))
		snprintf(ms, sizeof ms, " %.3f ms", ev->ms);
	if (proto_has(ev, PF_BYTES))
		cli_fmt_bytes(ev->bytes, bytes, sizeof bytes);
	printf("%s.%03u #%-5" PRIu64 " %-9s %-12s %-10s %10s%s  %s\n", when, (unsigned)(ev->time_ms % 1000),
	    ev->seq, ev->kind, ev->engine[0] ? ev->engine : "-", ev->state[0] ? ev->state : "-", bytes, ms,
	    ev->reason);
	return fflush(stdout) == 0;
}

static int cmd_watch(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop_signal; /* no SA_RESTART: the wait ends */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	struct proto_sub *sub;
	const char *url;
	int rc = open_events(&sub, &url);
	if (rc) {
		fprintf(stderr, "baton: watch: cannot subscribe to %s: %s (is the broker running? --events URL)\n",
		    url, baton_strerror(rc));
		return EXIT_FAILED;
	}
	double deadline = opt.timeout_given ? baton_now_s() + opt.timeout_ms / 1e3 : 0;
	long seen = 0;
	int ret = EXIT_DONE;
	while (!stop_watch && (opt.count < 0 || seen < opt.count)) {
		int wait_ms = 200;
		if (deadline) {
			double left = deadline - baton_now_s();
			if (left <= 0) {
				if (opt.count >= 0) {
					fprintf(stderr, "baton: watch: %ld of %ld events in %d ms (--timeout)\n", seen,
					    opt.count, opt.timeout_ms);
					ret = EXIT_FAILED;
				}
				break;
			}
			if (left * 1e3 < wait_ms)
				wait_ms = (int)(left * 1e3) + 1;
		}
		struct baton_msg ev;
		rc = proto_sub_recv(sub, &ev, wait_ms, NULL);
		if (rc == BATON_ETIMEDOUT)
			continue;
		if (rc == BATON_ECLOSED)
			break;
		if (rc) /* an event that does not decode: skip it */
			continue;
		seen++;
		bool okw = print_event(&ev);
		proto_msg_free(&ev);
		if (!okw) /* the reader went away (baton watch | head) */
			break;
	}
	proto_sub_close(sub);
	return ret;
}

/* ---- gen --------------------------------------------------------------------------- */

static int cmd_gen(const char *url)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_GEN);
	req.steps = opt.has_steps ? opt.steps : 4;
	req.batch = opt.has_batch ? opt.batch : 1;
	req.seed = opt.has_seed ? opt.seed : 1;
	double t0 = baton_now_s();
	call(url, "gen", &req, &rep, NULL);
	double ms = (baton_now_s() - t0) * 1e3;
	bool okw;
	if (opt.json) {
		char sum[32];
		snprintf(sum, sizeof sum, "%016" PRIx64, rep.checksum);
		json_t *j = json_object();
		json_object_set_new(j, "checksum", json_string(sum));
		json_object_set_new(j, "ms", json_real(ms));
		json_object_set_new(j, "engine_ms", json_real(rep.total_ms));
		json_object_set_new(j, "load_ms", json_real(rep.load_ms));
		okw = put_json(j);
	} else {
		printf("gen %s: checksum %016" PRIx64 ", %.3f ms (engine: %.3f ms, of which loading experts %.3f ms)\n",
		    url, rep.checksum, ms, rep.total_ms, rep.load_ms);
		okw = fflush(stdout) == 0;
	}
	proto_msg_free(&rep);
	return okw ? EXIT_DONE : EXIT_FAILED;
}

/* The control and event sockets speak nng, not HTTP: say so at once. */
static void check_url(const char *what, const char *url)
{
	if (!url)
		return;
	if (strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0)
		cli_die_usage("%s '%s': baton speaks to the broker's nng socket (ipc://PATH or tcp://HOST:PORT); "
		    "the HTTP API is for curl and browsers", what, url);
	if (!strstr(url, "://"))
		cli_die_usage("%s '%s': want ipc://PATH or tcp://HOST:PORT", what, url);
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	if (argc >= 2 && (strcmp(argv[1], "complete") == 0 || strcmp(argv[1], "chat") == 0))
		return text_cmd_main(argc - 1, argv + 1); /* flags after the command */
	if (argc >= 2 && strcmp(argv[1], "models") == 0)
		return models_cmd_main(argc - 1, argv + 1); /* the front door's models, over HTTP */
	{
		/* run, lease, external, park, resume: their own flags after the
		 * command word; the global ones before it move right after it */
		int i = 1;
		while (i < argc && argv[i][0] == '-' && strcmp(argv[i], "--") != 0) {
			bool with_value = !strchr(argv[i], '=') && (strcmp(argv[i], "--broker") == 0 ||
			    strcmp(argv[i], "--timeout") == 0 || strcmp(argv[i], "--events") == 0);
			i += with_value ? 2 : 1;
		}
		if (i < argc && run_cmd_is(argv[i])) {
			char *verb = argv[i]; /* argv[1..i] rotated in place: the verb, then the global flags */
			memmove(argv + 2, argv + 1, (size_t)(i - 1) * sizeof *argv);
			argv[1] = verb;
			return run_cmd_main(argc - 1, argv + 1);
		}
	}
	int tok_rc = tokenize_cmd_main(argc, argv); /* tokenize, detokenize: no broker needed */
	if (tok_rc >= 0)
		return tok_rc;
	parse_args(argc, argv);
	if (!opt.broker_given) {
		const char *env = getenv("BATON_BROKER");
		opt.broker = env && env[0] ? env : BROKER_DEFAULT_CONTROL;
	}
	check_url("--broker", opt.broker);
	check_url("--events", opt.events_given ? opt.events : getenv("BATON_EVENTS"));
	{
		char terr[768];
		if (cli_socket_trusted(opt.broker, terr, sizeof terr) != 0) {
			fprintf(stderr, "baton: --broker %s\n", terr);
			return EXIT_FAILED;
		}
	}
	if (opt.npos == 0)
		cli_die_usage("no command given");
	const char *cmd = opt.pos[0];
	const char *const *a = opt.pos + 1;
	if (strcmp(cmd, "status") == 0 || strcmp(cmd, "gpus") == 0 || strcmp(cmd, "engines") == 0) {
		allow_only(cmd, 0);
		want_args(cmd, 0, "no arguments");
		return cmd_status(cmd[0] == 's' ? 3 : cmd[0] == 'g' ? 1 : 2);
	}
	if (strcmp(cmd, "top") == 0) {
		allow_only(cmd, F_TOP);
		want_args(cmd, 0, "no arguments (--interval T, --once)");
		struct top_opts to = { .broker = opt.broker, .interval_ms = opt.interval_ms,
			.timeout_ms = opt.timeout_given ? opt.timeout_ms : 2000, .once = opt.once };
		return top_run(&to);
	}
	if (strcmp(cmd, "watch") == 0 || strcmp(cmd, "events") == 0) {
		allow_only(cmd, F_COUNT);
		want_args(cmd, 0, "no arguments (--count N, --timeout T, --json)");
		return cmd_watch();
	}
	if (strcmp(cmd, "release") == 0 && (opt.given & F_EVERY)) {
		allow_only(cmd, F_EVERY | F_GPU);
		want_args(cmd, 0, "no engine's name with --every");
		return cmd_release_every(opt.gpu);
	}
	if (strcmp(cmd, "release") == 0 || strcmp(cmd, "refill") == 0) {
		allow_only(cmd, cmd[2] == 'l' ? F_ALL : 0);
		want_args(cmd, 1, "an engine's name");
		return cmd_engine_op(cmd[2] == 'l' ? PROTO_OP_RELEASE : PROTO_OP_REFILL, a[0]);
	}
	if (strcmp(cmd, "vram") == 0) {
		allow_only(cmd, F_RESERVE | F_FULL);
		/* also the older form: vram NAME MIB|full */
		if (opt.npos == 3 && !opt.has_reserve && !opt.full) {
			if (strcmp(a[1], "full") == 0)
				opt.full = true;
			else
				opt.reserve_mib = parse_u64("vram", a[1], PROTO_RESERVE_MIB_MAX), opt.has_reserve = true;
			opt.npos = 2;
		}
		want_args(cmd, 1, "an engine's name and --reserve-mib N or --full");
		if (opt.has_reserve == opt.full)
			cli_die_usage("vram wants one of --reserve-mib N or --full");
		return cmd_engine_op(PROTO_OP_VRAM, a[0]);
	}
	if (strcmp(cmd, "handoff") == 0) {
		allow_only(cmd, 0);
		want_args(cmd, 2, "two engines' names: FROM TO");
		return cmd_handoff(a[0], a[1]);
	}
	if (strcmp(cmd, "pin") == 0 || strcmp(cmd, "unpin") == 0) {
		allow_only(cmd, 0);
		want_args(cmd, 1, "an engine's name");
		return cmd_pin(a[0], cmd[0] == 'p');
	}
	if (strcmp(cmd, "gen") == 0) {
		allow_only(cmd, F_GEN);
		want_args(cmd, 1, "an engine's name or URL");
		if (strstr(a[0], "://"))
			check_url("gen", a[0]);
		char *url, err[512];
		int rc = cli_engine_url(opt.broker, a[0], opt.timeout_ms, &url, err, sizeof err);
		if (rc) {
			fprintf(stderr, "baton: gen: %s\n", err);
			return rc == BATON_ENOTFOUND ? EXIT_NOTFOUND : EXIT_FAILED;
		}
		rc = cmd_gen(url);
		free(url);
		return rc;
	}
	cli_die_usage("unknown command '%s'", cmd);
}
