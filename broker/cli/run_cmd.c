/*
 * run_cmd.c: `baton run`, `baton lease`, `baton external`, `baton park`
 * and `baton resume`: programs that are not Baton engines under the
 * broker (docs/reference/cli.md). Flags come after the command word, as
 * for complete and chat.
 *
 * baton run starts the job as its child, held before exec until the
 * broker granted the memory: the broker watches the job's pid and the
 * CLI's own (the socket's peer), so the lease ends when either exits,
 * kill -9 included; the child dies with the CLI (PR_SET_PDEATHSIG), so
 * no job runs on memory that is no longer lent to it.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker.h"
#include "broker/cli/cli.h"
#include "broker/cli/run_cmd.h"

struct ropts {
	const char *broker;
	int timeout_ms;
	bool json, quiet;
	uint64_t mib;
	bool has_mib;
	const char *gpu, *name;
	int32_t priority;
	bool has_priority;
	double ttl_s, wait_s;
	bool has_ttl, has_wait;
	int pid;
	/* external add */
	json_t *ext;
	const char *pos[4];
	int npos;
	char **cmd;           /* run: after -- */
};

static double parse_secs(const char *flag, const char *v)
{
	char *end;
	errno = 0;
	double x = strtod(v, &end);
	double mult = 1;
	if (strcmp(end, "ms") == 0)
		mult = 1e-3;
	else if (strcmp(end, "m") == 0)
		mult = 60;
	else if (strcmp(end, "h") == 0)
		mult = 3600;
	else if (*end && strcmp(end, "s") != 0)
		end = NULL;
	if (!end || end == v || errno || !(x >= 0) || x * mult > 30 * 86400.0)
		cli_die_usage("%s wants a duration (30, 30s, 500ms, 5m, 2h), not '%s'", flag, v);
	return x * mult;
}

static void parse(int argc, char **argv, struct ropts *o, bool external_add)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			o->cmd = argv + i + 1;
			return;
		}
		if (a[0] != '-' || !a[1]) {
			if (o->npos == 4)
				cli_die_usage("too many arguments ('%s')", a);
			o->pos[o->npos++] = a;
			continue;
		}
		if (strcmp(a, "--json") == 0) {
			o->json = true;
			continue;
		}
		if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
			o->quiet = true;
			continue;
		}
		if (external_add && strcmp(a, "--pinned") == 0) {
			json_object_set_new(o->ext, "pinned", json_true());
			continue;
		}
		char name[64];
		const char *val = NULL, *eq = strchr(a, '=');
		if (eq && (size_t)(eq - a) < sizeof name) {
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = 0;
			val = eq + 1;
		} else {
			snprintf(name, sizeof name, "%s", a);
			if (i + 1 >= argc)
				cli_die_usage("%s wants a value", a);
			val = argv[++i];
		}
		uint64_t u;
		int64_t s;
		if (strcmp(name, "--broker") == 0) {
			o->broker = val;
		} else if (strcmp(name, "--events") == 0) {
			/* baton's global flag: these commands use no event socket */
		} else if (strcmp(name, "--timeout") == 0) {
			o->timeout_ms = (int)(parse_secs(name, val) * 1e3);
		} else if (strcmp(name, "--mib") == 0) {
			if (baton_parse_u64(val, 1, PROTO_RESERVE_MIB_MAX, &u))
				cli_die_usage("--mib wants MiB (a whole number above 0), not '%s'", val);
			o->mib = u, o->has_mib = true;
			if (external_add)
				json_object_set_new(o->ext, "mib", json_integer((json_int_t)u));
		} else if (strcmp(name, "--gpu") == 0) {
			o->gpu = val;
			if (external_add)
				json_object_set_new(o->ext, "gpu", json_string(val));
		} else if (strcmp(name, "--name") == 0 && !external_add) {
			o->name = val;
		} else if (strcmp(name, "--priority") == 0) {
			if (baton_parse_i64(val, INT32_MIN, INT32_MAX, &s))
				cli_die_usage("--priority wants a whole number, not '%s'", val);
			o->priority = (int32_t)s, o->has_priority = true;
			if (external_add)
				json_object_set_new(o->ext, "priority", json_integer(s));
		} else if (strcmp(name, "--ttl") == 0 && !external_add) {
			o->ttl_s = parse_secs(name, val), o->has_ttl = true;
		} else if (strcmp(name, "--wait") == 0 && !external_add) {
			o->wait_s = parse_secs(name, val), o->has_wait = true;
			if (o->wait_s > 3600)
				cli_die_usage("--wait: at most 1h");
		} else if (strcmp(name, "--pid") == 0) {
			if (baton_parse_u64(val, 1, 4194304, &u))
				cli_die_usage("--pid wants a process id, not '%s'", val);
			o->pid = (int)u;
			if (external_add)
				json_object_set_new(o->ext, "pid", json_integer((json_int_t)u));
		} else if (external_add && (strcmp(name, "--pid-file") == 0 || strcmp(name, "--unit") == 0 ||
		    strcmp(name, "--url") == 0 || strcmp(name, "--model") == 0 || strcmp(name, "--release") == 0 ||
		    strcmp(name, "--refill") == 0 || strcmp(name, "--hook-timeout") == 0)) {
			char key[64];
			snprintf(key, sizeof key, "%s", strcmp(name, "--pid-file") == 0 ? "pid_file" :
			    strcmp(name, "--hook-timeout") == 0 ? "hook_timeout_s" : name + 2);
			if (strcmp(key, "hook_timeout_s") == 0)
				json_object_set_new(o->ext, key, json_real(parse_secs(name, val)));
			else
				json_object_set_new(o->ext, key, json_string(val));
		} else {
			cli_die_usage("unknown flag '%s'", name);
		}
	}
}

/* One request; prints the broker's reason and exits on failure. */
static void call(const struct ropts *o, const char *what, struct baton_msg *req, struct baton_msg *rep)
{
	struct proto_opts po = { .dial_wait = true, .resend_ms = -1 };
	struct proto_client *cli = NULL;
	struct proto_diag d;
	memset(&d, 0, sizeof d);
	memset(rep, 0, sizeof *rep);
	int rc = proto_client_open(&cli, o->broker, &po);
	if (rc == 0) {
		rc = proto_client_call(cli, req, rep, o->timeout_ms, &d);
		proto_client_close(cli);
	}
	if (rc == 0)
		return;
	if (rep->reply) {
		fprintf(stderr, "baton: %s: %s (%s)\n", what, rep->msg && rep->msg[0] ? rep->msg : baton_strerror(rc),
		    baton_errname(rc));
		proto_msg_free(rep);
		exit(cli_exit_code(rc));
	}
	if (rc == BATON_ECONN)
		fprintf(stderr, "baton: %s: nothing listens at %s (is the broker running? --broker URL)\n", what, o->broker);
	else
		fprintf(stderr, "baton: %s: %s: %s%s%s\n", what, o->broker, baton_strerror(rc), d.text[0] ? ": " : "", d.text);
	exit(EXIT_FAILED);
}

static char what_buf[160];

static void lease_req(struct baton_msg *req, const struct ropts *o, const char *action, int pid, const char *what)
{
	proto_msg_init(req, PROTO_OP_LEASE);
	req->level = action;
	if (o->name || (o->npos >= 2 && strcmp(action, "acquire") != 0)) {
		req->name = o->name ? o->name : o->pos[1];
		proto_set(req, PF_NAME);
	}
	if (o->gpu) {
		req->gpu = o->gpu;
		proto_set(req, PF_GPU);
	}
	if (o->has_mib) {
		req->bytes = o->mib * BATON_MIB;
		proto_set(req, PF_BYTES);
	}
	if (o->has_priority) {
		req->priority = o->priority;
		proto_set(req, PF_PRIORITY);
	}
	if (pid > 0) {
		req->pid = (uint32_t)pid;
		proto_set(req, PF_PID);
	}
	if (o->has_ttl) {
		req->ms = o->ttl_s * 1e3;
		proto_set(req, PF_MS);
	}
	if (what) {
		req->reason = what;
		proto_set(req, PF_REASON);
	}
	if (o->has_wait && strcmp(action, "acquire") == 0) {
		req->duration_ms = o->wait_s * 1e3;
		proto_set(req, PF_DURATION_MS);
	}
}

static void print_lease(const struct ropts *o, const struct baton_msg *rep, const char *verb)
{
	char mb[32];
	if (o->json) {
		json_t *j = json_pack("{s:s, s:s, s:I, s:f, s:s}", "name", rep->name ? rep->name : "", "gpu",
		    rep->gpu ? rep->gpu : "", "granted", (json_int_t)rep->granted, "ttl_s", rep->ms / 1e3, "gave_way",
		    rep->reason ? rep->reason : "");
		json_dumpf(j, stdout, JSON_COMPACT);
		fputc('\n', stdout);
		json_decref(j);
	} else {
		printf("%s %s: %s of %s%s%s\n", verb, rep->name ? rep->name : "?", cli_fmt_bytes(rep->granted, mb, sizeof mb),
		    rep->gpu ? rep->gpu : "?", rep->reason && rep->reason[0] ? "; gave way: " : "",
		    rep->reason ? rep->reason : "");
	}
	fflush(stdout);
}

static volatile sig_atomic_t job_pid;

static void forward(int sig)
{
	if (job_pid > 0)
		kill((pid_t)job_pid, sig);
}

static int cmd_run(struct ropts *o)
{
	if (!o->cmd || !o->cmd[0])
		cli_die_usage("run wants a command after --: baton run --mib N -- COMMAND...");
	if (!o->has_mib)
		cli_die_usage("run wants --mib N: the memory the job needs");
	if (o->npos > 1)
		cli_die_usage("run: the command goes after --");
	/* what the job is, for status: its command line */
	size_t l = 0;
	for (char **p = o->cmd; *p && l + 2 < sizeof what_buf; p++)
		l += (size_t)snprintf(what_buf + l, sizeof what_buf - l, "%s%s", l ? " " : "", *p);
	int go[2];
	if (pipe(go) != 0) {
		perror("baton: run: pipe");
		return EXIT_FAILED;
	}
	fflush(NULL);
	pid_t child = fork();
	if (child < 0) {
		perror("baton: run: fork");
		return EXIT_FAILED;
	}
	if (child == 0) {
		/* held until the memory is granted; dies with the CLI */
		close(go[1]);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		char c;
		if (read(go[0], &c, 1) != 1)
			_exit(127);
		close(go[0]);
		execvp(o->cmd[0], o->cmd);
		fprintf(stderr, "baton: run: %s: %s\n", o->cmd[0], strerror(errno));
		_exit(127);
	}
	close(go[0]);
	job_pid = child;
	struct baton_msg req, rep;
	lease_req(&req, o, "acquire", child, what_buf);
	struct proto_opts po = { .dial_wait = true, .resend_ms = -1 };
	struct proto_client *cli = NULL;
	struct proto_diag d;
	memset(&d, 0, sizeof d);
	memset(&rep, 0, sizeof rep);
	int rc = proto_client_open(&cli, o->broker, &po);
	if (rc == 0)
		rc = proto_client_call(cli, &req, &rep, o->timeout_ms, &d);
	if (rc) {
		kill(child, SIGKILL);
		waitpid(child, NULL, 0);
		if (rep.reply)
			fprintf(stderr, "baton: run: %s (%s); the job was not started\n", rep.msg && rep.msg[0] ? rep.msg :
			    baton_strerror(rc), baton_errname(rc));
		else
			fprintf(stderr, "baton: run: %s: %s%s%s; the job was not started\n", o->broker, baton_strerror(rc),
			    d.text[0] ? ": " : "", d.text);
		proto_client_close(cli);
		int code = rep.reply ? cli_exit_code(rc) : EXIT_FAILED;
		proto_msg_free(&rep);
		return code;
	}
	char name[BROKER_NAME_MAX];
	snprintf(name, sizeof name, "%s", rep.name ? rep.name : "");
	if (!o->quiet) {
		char mb[32];
		fprintf(stderr, "baton: run: lease %s: %s of %s granted%s%s\n", name,
		    cli_fmt_bytes(rep.granted, mb, sizeof mb), rep.gpu ? rep.gpu : "?",
		    rep.reason && rep.reason[0] ? "; gave way: " : "", rep.reason ? rep.reason : "");
	}
	proto_msg_free(&rep);
	struct sigaction sa = { .sa_handler = forward };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	if (write(go[1], "g", 1) != 1) {
		/* the child is gone already: waitpid says how */
	}
	close(go[1]);
	int status = 0;
	while (waitpid(child, &status, 0) < 0 && errno == EINTR)
		;
	/* the broker saw the exit too (pidfd); this makes it at once and says so */
	struct ropts ro = *o;
	ro.name = name;
	ro.has_ttl = false;
	lease_req(&req, &ro, "release", 0, NULL);
	char why[96];
	if (WIFEXITED(status))
		snprintf(why, sizeof why, "the job exited %d", WEXITSTATUS(status));
	else
		snprintf(why, sizeof why, "the job was killed by signal %d", WTERMSIG(status));
	req.reason = why;
	proto_set(&req, PF_REASON);
	if (proto_client_call(cli, &req, &rep, 5000, &d) == 0 || rep.reply)
		proto_msg_free(&rep); /* not found: the broker ended it first */
	proto_client_close(cli);
	if (!o->quiet)
		fprintf(stderr, "baton: run: lease %s returned (%s)\n", name, why);
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int cmd_lease(struct ropts *o)
{
	const char *a = o->npos >= 1 ? o->pos[0] : "";
	struct baton_msg req, rep;
	if (strcmp(a, "acquire") == 0) {
		if (!o->has_mib)
			cli_die_usage("lease acquire wants --mib N");
		if (o->npos != 1)
			cli_die_usage("lease acquire takes flags only (--name NAME)");
		if (!o->has_ttl && o->pid <= 0)
			cli_die_usage("lease acquire wants --ttl T (renew within it) or --pid P (ends when P exits): "
			    "this command exits at once, so it cannot be the lease's holder");
		lease_req(&req, o, "acquire", o->pid, o->name ? NULL : "lease");
		call(o, "lease acquire", &req, &rep);
		print_lease(o, &rep, "lease");
	} else if (strcmp(a, "renew") == 0 || strcmp(a, "release") == 0) {
		if (o->npos != 2)
			cli_die_usage("lease %s wants the lease's name", a);
		if (o->has_mib || o->gpu || o->has_priority || o->pid)
			cli_die_usage("lease %s takes only --ttl", a);
		lease_req(&req, o, a, 0, NULL);
		call(o, a[2] == 'n' ? "lease renew" : "lease release", &req, &rep);
		print_lease(o, &rep, a[2] == 'n' ? "renewed" : "released");
	} else {
		cli_die_usage("lease wants acquire, renew or release");
	}
	proto_msg_free(&rep);
	return EXIT_DONE;
}

static int cmd_external(struct ropts *o, const char *verb)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_EXTERNAL);
	const char *action = verb;
	const char *name = NULL;
	char *body = NULL;
	if (strcmp(verb, "external") == 0) {
		action = o->npos >= 1 ? o->pos[0] : "";
		if (strcmp(action, "add") && strcmp(action, "remove") && strcmp(action, "report"))
			cli_die_usage("external wants add, remove or report");
		if (o->npos != 2)
			cli_die_usage("external %s wants the engine's name", action);
		name = o->pos[1];
	} else {
		if (o->npos != 1)
			cli_die_usage("%s wants an external engine's name", verb);
		name = o->pos[0];
	}
	req.level = action;
	req.name = name;
	proto_set(&req, PF_NAME);
	if (strcmp(action, "add") == 0) {
		json_object_set_new(o->ext, "name", json_string(name));
		body = json_dumps(o->ext, JSON_COMPACT);
		req.body = body;
		proto_set(&req, PF_BODY);
	} else if (strcmp(action, "report") == 0) {
		if (!o->has_mib)
			cli_die_usage("external report wants --mib N: what it holds now");
		req.mapped = o->mib * BATON_MIB;
		proto_set(&req, PF_MAPPED);
	}
	char what[64];
	snprintf(what, sizeof what, "%s%s%s", strcmp(verb, "external") == 0 ? "external " : "", action, "");
	call(o, what, &req, &rep);
	free(body);
	char mb[32];
	if (o->json) {
		json_t *j = json_pack("{s:s, s:s, s:I, s:f}", "name", rep.name ? rep.name : name, "state",
		    rep.state ? rep.state : "", "mapped", (json_int_t)rep.mapped, "ms", rep.ms);
		json_dumpf(j, stdout, JSON_COMPACT);
		fputc('\n', stdout);
		json_decref(j);
	} else {
		printf("%s %s: %s, holds %s%s%s\n", action, name, rep.state ? rep.state : "?",
		    cli_fmt_bytes(rep.mapped, mb, sizeof mb), rep.ms > 0 ? "" : "", "");
	}
	proto_msg_free(&rep);
	return EXIT_DONE;
}

int run_cmd_main(int argc, char **argv)
{
	const char *verb = argv[0];
	struct ropts o = { .timeout_ms = -1 };
	const char *env = getenv("BATON_BROKER");
	o.broker = env && env[0] ? env : BROKER_DEFAULT_CONTROL;
	o.ext = json_object();
	bool add = strcmp(verb, "external") == 0 && argc >= 2 && strcmp(argv[1], "add") == 0;
	parse(argc, argv, &o, add);
	if (strstr(o.broker, "http://") == o.broker || !strstr(o.broker, "://"))
		cli_die_usage("--broker '%s': want ipc://PATH or tcp://HOST:PORT", o.broker);
	if (o.cmd && strcmp(verb, "run") != 0)
		cli_die_usage("%s takes no command after --", verb);
	if (o.timeout_ms < 0) /* the answer may come after the wait for memory (and hooks) */
		o.timeout_ms = 60000 + (o.has_wait ? (int)(o.wait_s * 1e3) : 0);
	int rc;
	if (strcmp(verb, "run") == 0)
		rc = cmd_run(&o);
	else if (strcmp(verb, "lease") == 0)
		rc = cmd_lease(&o);
	else
		rc = cmd_external(&o, verb);
	json_decref(o.ext);
	return rc;
}

bool run_cmd_is(const char *word)
{
	return word && (strcmp(word, "run") == 0 || strcmp(word, "lease") == 0 || strcmp(word, "external") == 0 ||
	    strcmp(word, "park") == 0 || strcmp(word, "resume") == 0);
}
