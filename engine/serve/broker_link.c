/*
 * broker_link.c: the engine's client of the broker (see broker_link.h).
 *
 * One REQ client (nng keeps it connected and redials a restarted broker).
 * Its pipe events say whether the broker is there: a new pipe means a new
 * connection, maybe to a new broker, so the thread registers again at once;
 * no pipe means acquire returns BATON_ECONN without waiting.
 */
#include "engine/serve/broker_link.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/proto.h"

#define REPORTS 64
#define CALL_MS 1000            /* register, heartbeat, report */
#define ACQUIRE_SLACK_MS 30000  /* the broker answers within its own bounded wait */
#define ACQUIRE_RESEND_MS 1000  /* no answer this long: the same acquire again */

struct report {
	uint64_t seq;
	char reason[128];
	double ms;
	uint64_t bytes;
	struct broker_link_state st;
};

struct broker_link {
	struct broker_link_params p;
	char *url, *name, *gpu, *model, *ctl, *http, *http_token, *peer_gpu;
	struct proto_client *cli;
	pthread_t th;
	int have_th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;
	int pipes;          /* connections up now */
	bool registered;
	bool reregister;    /* a new connection, or not_found: register again */
	bool poke;          /* a heartbeat now */
	int refused;        /* the broker's last refusal of register (0: none) */
	char refused_text[256];
	uint64_t broker_epoch;
	struct report q[REPORTS];
	size_t qh, qn;
	uint64_t qseq;
};

static void llog(struct broker_link *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void llog(struct broker_link *l, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (l->p.log)
		l->p.log(l->p.state_arg, line);
}

static void on_pipe(void *arg, const struct proto_pipe_event *ev)
{
	struct broker_link *l = arg;
	pthread_mutex_lock(&l->mu);
	if (ev->ev == PROTO_PIPE_ADD) {
		l->pipes++;
		l->reregister = true;
	} else if (l->pipes > 0) {
		l->pipes--;
		if (l->pipes == 0)
			l->registered = false;
	}
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

static void get_state(struct broker_link *l, struct broker_link_state *st)
{
	memset(st, 0, sizeof *st);
	l->p.state_fn(l->p.state_arg, st);
}

/* The peer tier's fields, for an engine that has a peer device. */
static void set_peer(const struct broker_link *l, struct baton_msg *m,
    const struct broker_link_state *st)
{
	if (!l->peer_gpu[0])
		return;
	proto_put_u64(m, PF_PEER_MAPPED, st->peer_mapped);
	proto_put_u64(m, PF_PEER_FREE, st->peer_free);
}

/* What a heartbeat and a report both say of the engine's state. */
static void set_state(const struct broker_link *l, struct baton_msg *m, const struct broker_link_state *st)
{
	m->name = l->name;
	m->state = st->state;
	m->resident = st->resident;
	proto_put_u64(m, PF_MAPPED, st->mapped);
	proto_put_u64(m, PF_FREE, st->free_bytes);
	proto_put_u64(m, PF_EPOCH, st->epoch);
	proto_put_u64(m, PF_KV, st->kv);
	set_peer(l, m, st);
}

static int do_register(struct broker_link *l)
{
	struct broker_link_state st;
	get_state(l, &st);
	struct baton_msg m, rep;
	struct proto_diag d;
	proto_msg_init(&m, PROTO_OP_REGISTER);
	m.name = l->name;
	m.pid = l->p.pid;
	m.gpu = l->gpu;
	m.device = l->p.device;
	m.model = l->model;
	m.ctl = l->ctl;
	if (l->http[0]) {
		m.http = l->http;
		proto_set(&m, PF_HTTP);
		if (l->http_token[0]) {
			m.http_token = l->http_token;
			proto_set(&m, PF_HTTP_TOKEN);
		}
	}
	m.floor = l->p.floor;
	m.ceiling = l->p.ceiling;
	m.priority = l->p.priority;
	m.state = st.state;
	m.resident = st.resident;
	m.capacity = l->p.capacity;
	m.epoch = st.epoch;
	m.mapped = st.mapped;
	m.free_bytes = st.free_bytes;
	m.kv = st.kv;
	proto_set(&m, PF_MAPPED);
	proto_set(&m, PF_FREE);
	proto_set(&m, PF_KV);
	if (l->peer_gpu[0]) {
		m.peer_gpu = l->peer_gpu;
		m.peer_want = l->p.peer_want;
		proto_set(&m, PF_PEER_GPU);
		proto_set(&m, PF_PEER_WANT);
	}
	set_peer(l, &m, &st);
	int rc = proto_client_call(l->cli, &m, &rep, CALL_MS, &d);
	if (rc == 0) {
		pthread_mutex_lock(&l->mu);
		l->broker_epoch = rep.epoch;
		l->refused = 0;
		pthread_mutex_unlock(&l->mu);
		llog(l, "registered with the broker at %s (%s, holds %.1f MiB, epoch %" PRIu64 ")",
		    l->url, st.state, (double)st.mapped / (1 << 20), rep.epoch);
	} else if (rc != BATON_ETIMEDOUT && rc != BATON_ECLOSED && rc != BATON_ECONN) {
		/* Logged when it changes, not at every retry. */
		pthread_mutex_lock(&l->mu);
		bool news = rc != l->refused || strcmp(d.text, l->refused_text) != 0;
		l->refused = rc;
		snprintf(l->refused_text, sizeof l->refused_text, "%s", d.text[0] ? d.text : baton_strerror(rc));
		pthread_cond_broadcast(&l->cv);
		pthread_mutex_unlock(&l->mu);
		if (news)
			llog(l, "register refused: %s", d.text);
	}
	proto_msg_free(&rep);
	return rc;
}

static int do_heartbeat(struct broker_link *l)
{
	struct broker_link_state st;
	get_state(l, &st);
	struct baton_msg m, rep;
	proto_msg_init(&m, PROTO_OP_HEARTBEAT);
	set_state(l, &m, &st);
	m.busy = st.busy;
	m.idle_ms = st.idle_ms;
	proto_put_u64(&m, PF_REQUESTS, st.requests);
	if (st.to_copy) {
		proto_put_u64(&m, PF_COPIED, st.copied);
		proto_put_u64(&m, PF_TO_COPY, st.to_copy);
	}
	if (st.has_prefix) {
		proto_put_u64(&m, PF_PREFIX_PROMPT, st.prefix_prompt);
		proto_put_u64(&m, PF_PREFIX_CACHED, st.prefix_cached);
		proto_put_u64(&m, PF_PREFIX_EVICTIONS, st.prefix_evictions);
		proto_put_u64(&m, PF_KV_HOST_BYTES, st.kv_host_bytes);
	}
	if (st.kv_total) {
		proto_put_u64(&m, PF_KV_USED, st.kv_used);
		proto_put_u64(&m, PF_KV_TOTAL, st.kv_total);
	}
	if (st.has_keep_alive)
		proto_put_f64(&m, PF_KEEP_ALIVE_S, st.keep_alive_s);
	int rc = proto_client_call(l->cli, &m, &rep, CALL_MS, NULL);
	proto_msg_free(&rep);
	return rc;
}

static int do_report(struct broker_link *l, const struct report *r)
{
	struct baton_msg m, rep;
	proto_msg_init(&m, PROTO_OP_REPORT);
	set_state(l, &m, &r->st);
	m.reason = r->reason;
	if (r->ms >= 0)
		proto_put_f64(&m, PF_DURATION_MS, r->ms);
	proto_put_u64(&m, PF_BYTES, r->bytes);
	int rc = proto_client_call(l->cli, &m, &rep, CALL_MS, NULL);
	proto_msg_free(&rep);
	return rc;
}

static void wait_until(struct broker_link *l, double t)
{
	if (t > baton_now_s())
		baton_cond_wait_until(&l->cv, &l->mu, t);
}

static void *link_thread(void *arg)
{
	struct broker_link *l = arg;
	double hb_s = (l->p.heartbeat_ms > 0 ? l->p.heartbeat_ms : 250) / 1e3;
	double next_hb = 0;
	bool was_up = false;
	pthread_mutex_lock(&l->mu);
	while (!l->stop) {
		double now = baton_now_s();
		if (l->pipes == 0) {
			if (was_up)
				llog(l, "lost the broker; serving on alone, registering again when it is back");
			was_up = false;
			l->registered = false;
			wait_until(l, now + 0.5);
			continue;
		}
		if (!l->registered || l->reregister) {
			l->reregister = false;
			pthread_mutex_unlock(&l->mu);
			int rc = do_register(l);
			pthread_mutex_lock(&l->mu);
			if (rc == 0) {
				l->registered = true;
				was_up = true;
				l->qn = 0; /* the registration carried the state */
				next_hb = baton_now_s() + hb_s;
				pthread_cond_broadcast(&l->cv);
			} else {
				/* A refusal (the name is taken) stands until the other
				 * engine goes: ask again each second, not ten times. */
				wait_until(l, baton_now_s() + (l->refused ? 1.0 : 0.1));
			}
			continue;
		}
		if (l->qn > 0) {
			struct report r = l->q[l->qh];
			pthread_mutex_unlock(&l->mu);
			int rc = do_report(l, &r);
			pthread_mutex_lock(&l->mu);
			if (rc == BATON_ENOTFOUND)
				l->registered = false; /* a new broker: registering sends the state */
			/* Sent or not, it goes: best effort, and a heartbeat follows. */
			if (l->qn > 0 && l->q[l->qh].seq == r.seq) {
				l->qh = (l->qh + 1) % REPORTS;
				l->qn--;
			}
			continue;
		}
		if (now >= next_hb || l->poke) {
			l->poke = false;
			pthread_mutex_unlock(&l->mu);
			int rc = do_heartbeat(l);
			pthread_mutex_lock(&l->mu);
			next_hb = baton_now_s() + hb_s;
			if (rc == BATON_ENOTFOUND) {
				llog(l, "the broker does not know this engine (restarted?); registering again");
				l->registered = false;
			}
			continue;
		}
		wait_until(l, next_hb);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

static char *dup_or_empty(const char *s)
{
	return strdup(s ? s : "");
}

int broker_link_open(const struct broker_link_params *p, struct broker_link **out)
{
	*out = NULL;
	if (!p || !p->url || !p->name || !p->state_fn)
		return BATON_EINVAL;
	struct broker_link *l = calloc(1, sizeof *l);
	if (!l)
		return BATON_ENOMEM;
	l->p = *p;
	pthread_mutex_init(&l->mu, NULL);
	baton_cond_init(&l->cv);
	l->url = dup_or_empty(p->url);
	l->name = dup_or_empty(p->name);
	l->gpu = dup_or_empty(p->gpu);
	l->peer_gpu = dup_or_empty(p->peer_gpu);
	l->model = dup_or_empty(p->model);
	l->http = dup_or_empty(p->http);
	l->http_token = dup_or_empty(p->http_token);
	l->ctl = dup_or_empty(p->ctl);
	int rc = BATON_ENOMEM;
	if (!l->url || !l->name || !l->gpu || !l->model || !l->ctl || !l->http || !l->http_token || !l->peer_gpu)
		goto fail;
	/* No timed resend: a request is resent when its connection drops
	 * (to a restarted broker), which is what we want. */
	struct proto_opts o = { .on_pipe = on_pipe, .pipe_arg = l, .resend_ms = -1 };
	if ((rc = proto_client_open(&l->cli, l->url, &o)) != 0)
		goto fail;
	if (pthread_create(&l->th, NULL, link_thread, l) != 0) {
		rc = BATON_ENOMEM;
		goto fail;
	}
	l->have_th = 1;
	*out = l;
	return 0;
fail:
	broker_link_close(l, false);
	return rc;
}

void broker_link_close(struct broker_link *l, bool goodbye)
{
	if (!l)
		return;
	if (goodbye && l->have_th && broker_link_up(l)) {
		struct report r = { .ms = -1 };
		snprintf(r.reason, sizeof r.reason, "shutdown");
		get_state(l, &r.st);
		snprintf(r.st.state, sizeof r.st.state, "stopped");
		do_report(l, &r);
	}
	if (l->have_th) {
		pthread_mutex_lock(&l->mu);
		l->stop = true;
		pthread_cond_broadcast(&l->cv);
		pthread_mutex_unlock(&l->mu);
		proto_client_shutdown(l->cli); /* a call in flight ends now */
		pthread_join(l->th, NULL);
	}
	proto_client_close(l->cli);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l->url);
	free(l->name);
	free(l->gpu);
	free(l->peer_gpu);
	free(l->model);
	free(l->http);
	free(l->http_token);
	free(l->ctl);
	free(l);
}

bool broker_link_up(struct broker_link *l)
{
	pthread_mutex_lock(&l->mu);
	bool up = l->pipes > 0 && l->registered;
	pthread_mutex_unlock(&l->mu);
	return up;
}

bool broker_link_wait_up(struct broker_link *l, int timeout_ms)
{
	double end = baton_now_s() + timeout_ms / 1e3;
	pthread_mutex_lock(&l->mu);
	while (!(l->pipes > 0 && l->registered) && baton_now_s() < end && !l->stop)
		wait_until(l, end);
	bool up = l->pipes > 0 && l->registered;
	pthread_mutex_unlock(&l->mu);
	return up;
}

int broker_link_wait_start(struct broker_link *l, int timeout_ms, char *err, size_t errlen)
{
	double end = baton_now_s() + timeout_ms / 1e3;
	pthread_mutex_lock(&l->mu);
	while (!(l->pipes > 0 && l->registered) && !l->refused && baton_now_s() < end && !l->stop)
		wait_until(l, end);
	int rc = 0;
	if (l->pipes > 0 && l->registered)
		rc = 0;
	else if (l->refused) {
		rc = l->refused;
		snprintf(err, errlen, "%s", l->refused_text);
	} else if (l->pipes > 0) {
		rc = BATON_ETIMEDOUT;
		snprintf(err, errlen, "the broker at %s did not answer register within %.1f s", l->url,
		    timeout_ms / 1e3);
	} else {
		rc = BATON_ECONN;
		snprintf(err, errlen, "no broker answered at %s within %.1f s", l->url, timeout_ms / 1e3);
	}
	pthread_mutex_unlock(&l->mu);
	return rc;
}

int broker_link_acquire(struct broker_link *l, uint64_t bytes, uint64_t *granted, uint64_t *epoch,
    char *err, size_t errlen)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		pthread_mutex_lock(&l->mu);
		bool connected = l->pipes > 0;
		pthread_mutex_unlock(&l->mu);
		if (!connected) {
			snprintf(err, errlen, "the broker is not connected");
			return BATON_ECONN;
		}
		/* After a reconnect, wait (briefly) for the registration. */
		if (!broker_link_wait_up(l, 1000)) {
			snprintf(err, errlen, "not registered with the broker");
			return BATON_ECONN;
		}
		struct baton_msg m, rep;
		struct proto_diag d;
		proto_msg_init(&m, PROTO_OP_ACQUIRE);
		m.name = l->name;
		m.bytes = bytes;
		/* A lost reply (or request) would hold us ACQUIRE_SLACK_MS: send
		 * the same request (same id) again every ACQUIRE_RESEND_MS. The
		 * broker takes a copy of one that waits as that one, and answers a
		 * copy of one it granted with the same grant (broker.c,
		 * on_engine_op), so waiting, and a grant, happen once. */
		double end = baton_now_s() + ACQUIRE_SLACK_MS / 1e3;
		int rc, sends = 0;
		for (;;) {
			int left = (int)((end - baton_now_s()) * 1e3);
			rc = proto_client_call(l->cli, &m, &rep, left < ACQUIRE_RESEND_MS ? (left > 0 ? left : 1) :
			    ACQUIRE_RESEND_MS, &d);
			sends++;
			/* ECLOSED without a reply: the request was not sent */
			bool again = rc == BATON_ETIMEDOUT || (rc == BATON_ECLOSED && !rep.reply && sends < 3);
			pthread_mutex_lock(&l->mu);
			again = again && !l->stop && l->pipes > 0;
			pthread_mutex_unlock(&l->mu);
			if (!again || baton_now_s() >= end)
				break;
			proto_msg_free(&rep);
		}
		if (rc == 0) {
			*granted = rep.granted;
			*epoch = rep.epoch;
			proto_msg_free(&rep);
			return 0;
		}
		snprintf(err, errlen, "%s", d.text[0] ? d.text : baton_strerror(rc));
		proto_msg_free(&rep);
		if (rc == BATON_ENOTFOUND) {
			/* a restarted broker that has not heard from us yet */
			pthread_mutex_lock(&l->mu);
			l->registered = false;
			pthread_cond_broadcast(&l->cv);
			pthread_mutex_unlock(&l->mu);
			continue;
		}
		if (rc == BATON_ETIMEDOUT || rc == BATON_ECLOSED || rc == BATON_ECONN)
			return BATON_ECONN;
		return rc;
	}
	return BATON_ECONN;
}

void broker_link_poke(struct broker_link *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&l->mu);
	l->poke = true;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

void broker_link_report(struct broker_link *l, const char *reason, double ms, uint64_t bytes)
{
	if (!l)
		return;
	struct report r = { .ms = ms, .bytes = bytes };
	snprintf(r.reason, sizeof r.reason, "%s", reason);
	get_state(l, &r.st);
	pthread_mutex_lock(&l->mu);
	if (l->qn == REPORTS) { /* full: the oldest goes (heartbeats carry the state too) */
		l->qh = (l->qh + 1) % REPORTS;
		l->qn--;
	}
	r.seq = ++l->qseq;
	l->q[(l->qh + l->qn) % REPORTS] = r;
	l->qn++;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
}
