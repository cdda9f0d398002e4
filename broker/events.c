/*
 * events.c: what the broker tells: its log lines and its events. An event
 * goes out on the events socket and to every subscriber (broker_observe:
 * the faces, such as the HTTP server), never to a face by name.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "broker/broker_int.h"

/* Under journald (JOURNAL_STREAM set) the journal stamps each line;
 * anywhere else a line carries its own time, UTC to the millisecond. */
static void vlog(const char *fmt, va_list ap)
{
	char line[1024], stamp[48] = "";
	vsnprintf(line, sizeof line, fmt, ap);
	const char *js = getenv("JOURNAL_STREAM");
	if (!js || !*js) {
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		size_t n = strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(stamp + n, sizeof stamp - n, ".%03ldZ ", ts.tv_nsec / 1000000L);
	}
	fprintf(stderr, "%sbaton-broker: %s\n", stamp, line);
}

void br_blog(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

void broker_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vlog(fmt, ap);
	va_end(ap);
}

const char *br_rate(uint64_t bytes, double ms, char *buf, size_t len)
{
	if (bytes && ms > 0)
		snprintf(buf, len, ", %.2f GB/s", (double)bytes / (ms / 1e3) / 1e9);
	else if (len)
		buf[0] = 0;
	return buf;
}

void br_log_move(const char *engine, const char *what, const char *reason, double ms, uint64_t bytes,
    uint64_t holds)
{
	char rate[48], took[32] = "";
	if (ms >= 0)
		snprintf(took, sizeof took, " in %.3f ms", ms);
	bool freed = strcmp(what, "release") == 0 || strncmp(reason, "release", 7) == 0;
	br_blog("engine %s: %s (%s)%s, %.1f MiB %s%s; holds %.1f MiB", engine, what, reason, took,
	    (double)bytes / BATON_MIB, freed ? "freed" : "copied", freed ? "" : br_rate(bytes, ms, rate, sizeof rate),
	    (double)holds / BATON_MIB);
}

static void publish(struct broker *b, struct baton_msg *ev);

void br_publish(struct broker *b, const char *kind, const struct eng *e, const char *reason,
    double ms, uint64_t bytes)
{
	struct baton_msg ev;
	proto_msg_init(&ev, PROTO_OP_EVENT);
	br_event_fill(b, &ev, kind, e, reason, ms, bytes);
	publish(b, &ev);
}

void br_publish_named(struct broker *b, const char *kind, const char *name, const char *reason, double ms,
    uint64_t bytes)
{
	const struct eng *e = *name ? br_eng_by_name(b, name) : NULL;
	struct baton_msg ev;
	proto_msg_init(&ev, PROTO_OP_EVENT);
	br_event_fill(b, &ev, kind, e, reason, ms, bytes);
	if (!e)
		ev.engine = name; /* a face's event about one not registered (yet): the fleet's */
	publish(b, &ev);
}

/* The handoff's phases ride along for subscribers in this process (the
 * metrics' histogram): no presence bit, so they stay off the wire, where
 * the reason says them. */
void br_publish_handoff(struct broker *b, const struct eng *e, const char *reason, double total_ms,
    uint64_t bytes, double decide_ms, double release_ms, double refill_ms)
{
	struct baton_msg ev;
	proto_msg_init(&ev, PROTO_OP_EVENT);
	br_event_fill(b, &ev, "handoff", e, reason, total_ms, bytes);
	ev.decide_ms = decide_ms;
	ev.release_ms = release_ms;
	ev.refill_ms = refill_ms;
	ev.total_ms = total_ms;
	publish(b, &ev);
}

void br_event_fill(struct broker *b, struct baton_msg *ev, const char *kind, const struct eng *e,
    const char *reason, double ms, uint64_t bytes)
{
	ev->seq = ++b->seq;
	ev->time_ms = baton_wall_ms();
	ev->kind = kind;
	ev->engine = e ? e->name : "";
	ev->gpu = e ? b->gpus[e->gpu].uuid : "";
	ev->state = e ? e->state : "";
	ev->reason = reason ? reason : "";
	if (ms >= 0) {
		ev->ms = ms;
		proto_set(ev, PF_MS);
	}
	ev->bytes = bytes;
	proto_set(ev, PF_BYTES);
	if (e && strcmp(kind, "progress") == 0) { /* bytes: copied of to_copy */
		ev->to_copy = e->to_copy;
		proto_set(ev, PF_TO_COPY);
	}
}

static void publish(struct broker *b, struct baton_msg *ev)
{
	pthread_mutex_lock(&b->omu);
	for (size_t i = 0; i < MAX_OBSERVERS; i++)
		if (b->obs[i].fn)
			b->obs[i].fn(b->obs[i].arg, ev);
	pthread_mutex_unlock(&b->omu);
	int rc = proto_publish(b->pub, ev);
	if (rc)
		br_blog("event %s not published: %s", ev->kind, baton_strerror(rc));
}

int broker_observe(struct broker *b, broker_event_fn fn, void *arg)
{
	int rc = BATON_ENOMEM;
	pthread_mutex_lock(&b->omu);
	for (size_t i = 0; i < MAX_OBSERVERS; i++) {
		if (!b->obs[i].fn) {
			b->obs[i].fn = fn;
			b->obs[i].arg = arg;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&b->omu);
	return rc;
}

void broker_unobserve(struct broker *b, broker_event_fn fn, void *arg)
{
	pthread_mutex_lock(&b->omu); /* waits for a publish in progress */
	for (size_t i = 0; i < MAX_OBSERVERS; i++)
		if (b->obs[i].fn == fn && b->obs[i].arg == arg)
			b->obs[i].fn = NULL;
	pthread_mutex_unlock(&b->omu);
}
