/*
 * events.c: what the broker tells: its log lines and its events. An event
 * goes out on the events socket and to every subscriber (broker_observe:
 * the faces, such as the HTTP server), never to a face by name.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "broker/broker_int.h"

void br_blog(const char *fmt, ...)
{
	va_list ap;
	char line[1024];
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "baton-broker: %s\n", line);
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
	ev->time_ms = wall_ms();
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
