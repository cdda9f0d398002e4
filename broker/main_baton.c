/*
 * baton: a small command-line client of the broker (and of an engine's
 * GEN, for demos). The HTTP API and a fuller CLI are a later issue.
 *
 *   baton status [--json]
 *   baton release NAME | refill NAME | vram NAME MIB|full
 *   baton handoff FROM TO
 *   baton pin NAME | unpin NAME
 *   baton events [--count N] [--timeout MS]
 *   baton gen ENGINE_URL [--steps N] [--batch N] [--seed N]
 *
 * The broker is --broker URL, else $BATON_BROKER, else the default socket;
 * events likewise with --events / $BATON_EVENTS.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/broker.h"

#define MIB (1024.0 * 1024.0)

static const char usage_text[] =
    "usage: baton [--broker URL] [--events URL] [--timeout MS] COMMAND\n"
    "\n"
    "  status [--json]          devices and engines as the broker sees them\n"
    "  release NAME             give NAME's device memory back (it keeps its model in RAM)\n"
    "  refill NAME              make NAME whole again (the broker makes room first)\n"
    "  vram NAME MIB|full       keep MIB of the device free (shrink), or grow back\n"
    "  handoff FROM TO          release (or shrink) FROM, then refill TO; prints the timings\n"
    "  pin NAME | unpin NAME    a pinned engine is never reclaimed\n"
    "  events [--count N] [--timeout MS]   print events as they come\n"
    "  gen ENGINE_URL [--steps N] [--batch N] [--seed N]   one request to an engine\n"
    "\n"
    "Broker: --broker, else $BATON_BROKER, else " BROKER_DEFAULT_CONTROL ".\n"
    "Exit status: 0 ok, 1 the broker or engine said no, 2 usage, 3 no answer.\n";

static const char *broker_url, *events_url;
static int timeout_ms = 60000;

static void usage(void) __attribute__((noreturn));
static void usage(void)
{
	fputs(usage_text, stderr);
	exit(2);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int call(const char *url, struct baton_msg *req, struct baton_msg *rep)
{
	struct proto_diag d;
	int rc = proto_call(url, req, rep, timeout_ms, &d);
	if (rc == 0)
		return 0;
	if (rep->reply) {
		fprintf(stderr, "baton: %s: %s (%s)\n", proto_op_name(req->op), rep->msg ? rep->msg : "",
		    baton_errname(rc));
		proto_msg_free(rep);
		exit(1);
	}
	fprintf(stderr, "baton: %s: no answer from %s: %s\n", proto_op_name(req->op), url, d.text);
	exit(3);
}

static const char *mib(uint64_t b, char *buf, size_t len)
{
	snprintf(buf, len, "%.1f MiB", (double)b / MIB);
	return buf;
}

static int cmd_status(int json)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_STATUS);
	call(broker_url, &req, &rep);
	char a[32], b[32], c[32], d[32];
	if (json) {
		printf("{\"epoch\": %" PRIu64 ", \"gpus\": [", rep.epoch);
		for (uint32_t i = 0; i < rep.gpus.n; i++) {
			const struct proto_gpu *g = &rep.gpus.v[i];
			printf("%s{\"uuid\": \"%s\", \"total\": %" PRIu64 ", \"free\": %" PRIu64
			    ", \"reserve\": %" PRIu64 ", \"held\": %" PRIu64 "}", i ? ", " : "", g->uuid,
			    g->total, g->free_bytes, g->reserve, g->held);
		}
		printf("], \"engines\": [");
		for (uint32_t i = 0; i < rep.engines.n; i++) {
			const struct proto_engine_info *e = &rep.engines.v[i];
			printf("%s{\"name\": \"%s\", \"pid\": %u, \"gpu\": \"%s\", \"model\": \"%s\", "
			    "\"state\": \"%s\", \"resident\": %" PRIu64 ", \"floor\": %" PRIu64
			    ", \"ceiling\": %" PRIu64 ", \"priority\": %d, \"pinned\": %s, \"idle_ms\": %" PRIu64
			    ", \"last_refill_gbps\": %.3f}", i ? ", " : "", e->name, e->pid, e->gpu, e->model,
			    e->state, e->resident, e->floor, e->ceiling, e->priority, e->pinned ? "true" : "false",
			    e->idle_ms, e->last_refill_gbps);
		}
		printf("]}\n");
		proto_msg_free(&rep);
		return 0;
	}
	printf("%-40s %12s %12s %12s %12s\n", "DEVICE", "TOTAL", "FREE", "RESERVE", "HELD");
	for (uint32_t i = 0; i < rep.gpus.n; i++) {
		const struct proto_gpu *g = &rep.gpus.v[i];
		printf("%-40s %12s %12s %12s %12s\n", g->uuid, mib(g->total, a, sizeof a),
		    mib(g->free_bytes, b, sizeof b), mib(g->reserve, c, sizeof c), mib(g->held, d, sizeof d));
	}
	printf("\n%-12s %8s %-10s %-10s %-10s %11s %11s %5s %4s %8s %11s\n", "ENGINE", "PID", "DEVICE",
	    "MODEL", "STATE", "HOLDS", "CEILING", "PRIO", "PIN", "IDLE", "LAST FILL");
	for (uint32_t i = 0; i < rep.engines.n; i++) {
		const struct proto_engine_info *e = &rep.engines.v[i];
		char idle[32], fill[32];
		snprintf(idle, sizeof idle, "%.1f s", (double)e->idle_ms / 1e3);
		if (e->last_refill_gbps > 0)
			snprintf(fill, sizeof fill, "%.2f GB/s", e->last_refill_gbps);
		else
			snprintf(fill, sizeof fill, "-");
		printf("%-12s %8u %-10.10s %-10.10s %-10s %11s %11s %5d %4s %8s %11s\n", e->name, e->pid,
		    e->gpu, e->model, e->state, mib(e->resident, a, sizeof a), mib(e->ceiling, b, sizeof b),
		    e->priority, e->pinned ? "yes" : "no", idle, fill);
	}
	proto_msg_free(&rep);
	return 0;
}

static int cmd_engine_op(enum proto_op op, const char *name, const char *mibs)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, op);
	req.name = name;
	proto_set(&req, PF_NAME);
	if (op == PROTO_OP_VRAM) {
		if (strcmp(mibs, "full") == 0) {
			req.reserve_mib = PROTO_RESERVE_FULL;
		} else {
			char *end;
			errno = 0;
			unsigned long long v = strtoull(mibs, &end, 10);
			if (errno || end == mibs || *end || mibs[0] == '-')
				usage();
			req.reserve_mib = v;
		}
	}
	double t0 = now_s();
	call(broker_url, &req, &rep);
	char a[32];
	printf("%s %s: %s, holds %s, %s %.1f MiB in %.3f ms (round trip %.3f ms), epoch %" PRIu64 "\n",
	    proto_op_name(op), name, rep.state, mib(proto_has(&rep, PF_MAPPED) ? rep.mapped : rep.resident,
	    a, sizeof a), op == PROTO_OP_RELEASE ? "freed" : "moved", (double)rep.bytes / MIB, rep.ms,
	    (now_s() - t0) * 1e3, rep.epoch);
	proto_msg_free(&rep);
	return 0;
}

static int cmd_handoff(const char *from, const char *to)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_HANDOFF);
	req.from = from;
	req.to = to;
	call(broker_url, &req, &rep);
	printf("handoff %s -> %s: decide %.3f ms, release %.3f ms, refill %.3f ms, total %.3f ms\n", from, to,
	    proto_has(&rep, PF_DECIDE_MS) ? rep.decide_ms : 0.0, rep.release_ms, rep.refill_ms, rep.total_ms);
	proto_msg_free(&rep);
	return 0;
}

static int cmd_pin(const char *name, bool pinned)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_PIN);
	req.name = name;
	req.pinned = pinned;
	call(broker_url, &req, &rep);
	printf("%s %s\n", name, pinned ? "pinned" : "unpinned");
	proto_msg_free(&rep);
	return 0;
}

static long opt_long(int argc, char **argv, const char *flag, long dflt)
{
	for (int i = 0; i + 1 < argc; i++)
		if (strcmp(argv[i], flag) == 0) {
			char *end;
			errno = 0;
			long v = strtol(argv[i + 1], &end, 10);
			if (errno || end == argv[i + 1] || *end)
				usage();
			return v;
		}
	return dflt;
}

static int cmd_events(int argc, char **argv)
{
	long count = opt_long(argc, argv, "--count", -1);
	int tmo = (int)opt_long(argc, argv, "--timeout", -1);
	struct proto_sub *sub;
	int rc = proto_sub_open(&sub, events_url, NULL);
	if (rc) {
		fprintf(stderr, "baton: events: %s: %s\n", events_url, baton_strerror(rc));
		return 3;
	}
	int ret = 0;
	for (long n = 0; count < 0 || n < count; n++) {
		struct baton_msg ev;
		rc = proto_sub_recv(sub, &ev, tmo, NULL);
		if (rc == BATON_ETIMEDOUT || rc == BATON_ECLOSED) {
			ret = rc == BATON_ETIMEDOUT ? 3 : 0;
			break;
		}
		if (rc)
			continue;
		time_t t = (time_t)(ev.time_ms / 1000);
		struct tm tm;
		localtime_r(&t, &tm);
		char when[32], ms[32] = "";
		strftime(when, sizeof when, "%H:%M:%S", &tm);
		if (proto_has(&ev, PF_MS))
			snprintf(ms, sizeof ms, " %.3f ms", ev.ms);
		printf("%s.%03u #%-5" PRIu64 " %-9s %-10s %-9s %8.1f MiB%s  %s\n", when,
		    (unsigned)(ev.time_ms % 1000), ev.seq, ev.kind, ev.engine[0] ? ev.engine : "-",
		    ev.state[0] ? ev.state : "-", (double)ev.bytes / MIB, ms, ev.reason);
		fflush(stdout);
		proto_msg_free(&ev);
	}
	proto_sub_close(sub);
	return ret;
}

static int cmd_gen(int argc, char **argv)
{
	if (argc < 1)
		usage();
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_GEN);
	req.steps = (uint32_t)opt_long(argc, argv, "--steps", 4);
	req.batch = (uint32_t)opt_long(argc, argv, "--batch", 1);
	req.seed = (uint64_t)opt_long(argc, argv, "--seed", 1);
	double t0 = now_s();
	call(argv[0], &req, &rep);
	double ms = (now_s() - t0) * 1e3;
	printf("gen %s: checksum %016" PRIx64 ", %.3f ms (engine: %.3f ms, of which loading experts %.3f ms)\n",
	    argv[0], rep.checksum, ms, rep.total_ms, rep.load_ms);
	proto_msg_free(&rep);
	return 0;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	broker_url = getenv("BATON_BROKER") ? getenv("BATON_BROKER") : BROKER_DEFAULT_CONTROL;
	events_url = getenv("BATON_EVENTS") ? getenv("BATON_EVENTS") : BROKER_DEFAULT_EVENTS;
	int i = 1;
	for (; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			fputs(usage_text, stdout);
			return 0;
		}
		if (i + 1 >= argc)
			usage();
		if (strcmp(argv[i], "--broker") == 0)
			broker_url = argv[++i];
		else if (strcmp(argv[i], "--events") == 0)
			events_url = argv[++i];
		else if (strcmp(argv[i], "--timeout") == 0)
			timeout_ms = atoi(argv[++i]);
		else
			usage();
	}
	if (i >= argc)
		usage();
	const char *cmd = argv[i++];
	int n = argc - i;
	char **a = argv + i;
	if (strcmp(cmd, "status") == 0)
		return cmd_status(n > 0 && strcmp(a[0], "--json") == 0);
	if (strcmp(cmd, "release") == 0 && n == 1)
		return cmd_engine_op(PROTO_OP_RELEASE, a[0], NULL);
	if (strcmp(cmd, "refill") == 0 && n == 1)
		return cmd_engine_op(PROTO_OP_REFILL, a[0], NULL);
	if (strcmp(cmd, "vram") == 0 && n == 2)
		return cmd_engine_op(PROTO_OP_VRAM, a[0], a[1]);
	if (strcmp(cmd, "handoff") == 0 && n == 2)
		return cmd_handoff(a[0], a[1]);
	if (strcmp(cmd, "pin") == 0 && n == 1)
		return cmd_pin(a[0], true);
	if (strcmp(cmd, "unpin") == 0 && n == 1)
		return cmd_pin(a[0], false);
	if (strcmp(cmd, "events") == 0)
		return cmd_events(n, a);
	if (strcmp(cmd, "gen") == 0)
		return cmd_gen(n, a);
	usage();
}
