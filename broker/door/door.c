/*
 * door.c: the broker's OpenAI front door (broker.h, docs/front-door.md).
 *
 * Requests come from the HTTP server's threads (broker_door_route): the
 * body's `model` is read, the request joins its model's queue, and the
 * dispatch thread decides. Each round it takes the broker's status (which
 * engines serve which model at which URL, their state, the devices'
 * free memory), asks door_policy() per device which engines take
 * requests now and whether the device switches to another model, and:
 *   - forwards queued requests to the least loaded engine of their model
 *     that flows (a proxy thread each: door_upstream.c, the reply passed
 *     through as it arrives);
 *   - switches a device: stops sending to the holder, waits for its
 *     requests in flight to end (an engine answers release busy while it
 *     has sequences), then asks the broker to refill the new model's
 *     engine (the same path as `baton refill`: policies, priorities, pins
 *     pick what gives way), and forwards once it is back;
 *   - releases an engine kept past its keep-alive since its last request.
 *
 * Locking: d->mu guards everything below it in struct broker_door. No
 * HTTP call (reply, stream) and no broker_call is made under it.
 *
 * A request's on_gone callback (the client left) gets the door (its
 * owner, alive until after the HTTP server closed) and finds the request
 * by id (a stale id finds nothing), so it never holds a pointer to a
 * request that may have been freed.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "broker/door/door_int.h"
#include "http/http.h"

#define REFRESH_S 0.25            /* the broker's status is read this often */
#define UPSTREAM_TIMEOUT_MS 600000 /* an engine silent this long mid-reply: cut */
#define CONNECT_TIMEOUT_MS 5000
#define MAX_WHOLE (64u << 20)      /* a whole (non-streamed) reply read before it is passed on */
#define NB 12                      /* histogram buckets */

static const double bucket_s[NB] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 };

struct hist {
	uint64_t n, b[NB];
	double sum;
};

static void hist_add(struct hist *h, double s)
{
	h->n++;
	h->sum += s;
	for (int i = 0; i < NB; i++)
		if (s <= bucket_s[i])
			h->b[i]++;
}

/* One request through the door, from arrival to its answer's end. */
struct dreq {
	struct dreq *next;       /* in its model's queue, or the door's list of forwarded ones */
	uint64_t id;
	struct baton_http_req *r;
	int model;               /* index into d->models */
	const char *path;        /* "/v1/chat/completions" or "/v1/completions" */
	const char *body;        /* the request's own body, valid until answered */
	size_t len;
	bool stream;
	bool gone;               /* the client left */
	double t_in, t_fwd, refill_ms;
	int eng;                 /* index into d->eng once forwarded */
	char url[BROKER_URL_MAX];
	struct door_up *up;      /* while the proxy reads the engine's reply */
	struct broker_door *d;
};

struct deng {
	char name[BROKER_NAME_MAX], model[BROKER_NAME_MAX], gpu[BROKER_NAME_MAX];
	char http[BROKER_URL_MAX], state[32];
	uint64_t resident, ceiling;
	bool present;            /* in the broker's last status */
	unsigned inflight;
	double last_done;        /* its last door request ended */
	bool used;               /* served a door request since its last keep-alive release */
	bool releasing;
};

struct dmodel {
	char name[BROKER_NAME_MAX];
	struct dreq *qh, *qt;
	unsigned queued;
	bool queue_told;         /* door.queue published for the wait under way */
	uint64_t served, rejected_full, failed, gone;
	struct hist wait, refill, prefill;
};

struct ddev {
	char gpu[BROKER_NAME_MAX];
	uint64_t free_b, reserve;
	int holder;              /* index into d->eng, -1: none */
	double holder_since;
	bool switching, refilling;
	int target, from;        /* engines; from -1: a refill that evicts nobody */
	double sw_t0, drained_at;
	uint64_t switches;
};

struct broker_door {
	struct broker *b;
	double quantum_s, keep_alive_s;
	unsigned queue_max;
	struct broker_engine_conf *econf; /* copies of the [engine] sections (keep_alive_s) */
	size_t n_econf;

	pthread_mutex_t mu;
	pthread_cond_t cv;       /* the dispatch thread waits on it */
	pthread_cond_t idle_cv;  /* close waits on it for helpers to end */
	bool stop;
	bool again;              /* the dispatch thread goes round once more without waiting */
	pthread_t th;
	bool have_th;
	unsigned helpers;        /* proxy, refill and release threads running */
	uint64_t next_id;
	bool have_status;
	double next_refresh;
	struct deng eng[BROKER_MAX_ENGINES];
	size_t n_eng;
	struct dmodel models[BROKER_MAX_ENGINES];
	size_t n_models;
	struct ddev devs[BROKER_MAX_GPUS];
	size_t n_devs;
	struct dreq *fwd;        /* forwarded, not yet answered to the end */
	uint64_t switches_total;
	struct hist sw_drain, sw_refill; /* the parts of each switch */
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- answers in OpenAI's error shape ----------------------------------------------- */

static void reply_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static void reply_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", msg, "type", type, "param",
	    param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null());
	json_t *j = json_pack("{s:o}", "error", e);
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	char ra[64];
	const char *hdr[2] = { NULL, NULL };
	if (retry_after) {
		snprintf(ra, sizeof ra, "Retry-After: %s", retry_after);
		hdr[0] = ra;
	}
	const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
	http_reply(r, status, "application/json", body ? body : fallback, strlen(body ? body : fallback), hdr);
	free(body);
}

/* ---- the engines, from the broker's status ----------------------------------------- */

struct status_ctx {
	struct broker_door *d;
	bool ok;
};

static struct ddev *dev_of(struct broker_door *d, const char *gpu)
{
	for (size_t i = 0; i < d->n_devs; i++)
		if (strcmp(d->devs[i].gpu, gpu) == 0)
			return &d->devs[i];
	if (d->n_devs == BROKER_MAX_GPUS)
		return NULL;
	struct ddev *v = &d->devs[d->n_devs++];
	memset(v, 0, sizeof *v);
	snprintf(v->gpu, sizeof v->gpu, "%s", gpu);
	v->holder = v->target = v->from = -1;
	return v;
}

static int model_of(struct broker_door *d, const char *name, bool add)
{
	for (size_t i = 0; i < d->n_models; i++)
		if (strcmp(d->models[i].name, name) == 0)
			return (int)i;
	if (!add || d->n_models == BROKER_MAX_ENGINES)
		return -1;
	struct dmodel *m = &d->models[d->n_models];
	memset(m, 0, sizeof *m);
	snprintf(m->name, sizeof m->name, "%s", name);
	return (int)d->n_models++;
}

/* Under d->mu: the status reply applied to the door's view. */
static void apply_status(struct broker_door *d, const struct baton_msg *rep)
{
	for (size_t i = 0; i < d->n_eng; i++)
		d->eng[i].present = false;
	for (uint32_t k = 0; k < rep->engines.n; k++) {
		const struct proto_engine_info *x = &rep->engines.v[k];
		struct deng *e = NULL;
		for (size_t i = 0; i < d->n_eng && !e; i++)
			if (strcmp(d->eng[i].name, x->name) == 0)
				e = &d->eng[i];
		if (!e) {
			if (d->n_eng == BROKER_MAX_ENGINES)
				continue;
			e = &d->eng[d->n_eng++];
			memset(e, 0, sizeof *e);
			snprintf(e->name, sizeof e->name, "%s", x->name);
		}
		e->present = strcmp(x->state, "dead") != 0 && strcmp(x->state, "stopped") != 0;
		snprintf(e->model, sizeof e->model, "%s", x->model);
		snprintf(e->gpu, sizeof e->gpu, "%s", x->gpu);
		snprintf(e->http, sizeof e->http, "%s", x->http ? x->http : "");
		snprintf(e->state, sizeof e->state, "%s", x->state);
		e->resident = x->resident;
		e->ceiling = x->ceiling;
		if (*e->http)
			model_of(d, e->model, true);
		dev_of(d, e->gpu);
	}
	for (uint32_t k = 0; k < rep->gpus.n; k++) {
		struct ddev *v = dev_of(d, rep->gpus.v[k].uuid);
		if (v) {
			v->free_b = rep->gpus.v[k].free_bytes;
			v->reserve = rep->gpus.v[k].reserve;
		}
	}
	d->have_status = true;
}

static void on_status(void *arg, const struct baton_msg *rep)
{
	struct status_ctx *c = arg;
	if (!rep->ok)
		return;
	pthread_mutex_lock(&c->d->mu);
	apply_status(c->d, rep);
	pthread_mutex_unlock(&c->d->mu);
	c->ok = true;
}

/* Not under d->mu. */
static bool refresh(struct broker_door *d)
{
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_STATUS);
	struct status_ctx c = { d, false };
	broker_call(d->b, &m, on_status, &c);
	return c.ok;
}

static bool serves(const struct deng *e)
{
	return e->present && *e->http;
}

/* Holds its whole cache. An elastic engine shrunk to nothing by a vram
 * command still says "ready": its bytes tell. */
static bool ready(const struct deng *e)
{
	return strcmp(e->state, "ready") == 0 && e->resident >= e->ceiling;
}

static double keep_alive_of(struct broker_door *d, const struct deng *e)
{
	for (size_t i = 0; i < d->n_econf; i++)
		if (strcmp(d->econf[i].name, e->name) == 0 && d->econf[i].has_keep_alive)
			return d->econf[i].keep_alive_s;
	return d->keep_alive_s;
}

/* ---- helper threads ---------------------------------------------------------------- */

static void helper_done(struct broker_door *d)
{
	pthread_mutex_lock(&d->mu);
	d->helpers--;
	pthread_cond_broadcast(&d->idle_cv);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

/* Under d->mu. false when no thread could start. */
static bool spawn(struct broker_door *d, void *(*fn)(void *), void *arg)
{
	pthread_t t;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 256 << 10);
	d->helpers++;
	int rc = pthread_create(&t, &a, fn, arg);
	pthread_attr_destroy(&a);
	if (rc != 0)
		d->helpers--;
	return rc == 0;
}

/* ---- proxy: one forwarded request ---------------------------------------------------- */

static void unlink_fwd(struct broker_door *d, struct dreq *q)
{
	for (struct dreq **pp = &d->fwd; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
}

static void *proxy(void *arg)
{
	struct dreq *q = arg;
	struct broker_door *d = q->d;
	char err[300];
	struct door_up *up = NULL;
	int rc = door_up_open(q->url, CONNECT_TIMEOUT_MS, &up, err, sizeof err);
	bool ok = false, gone = false;
	double t_first = -1;
	if (rc == 0) {
		pthread_mutex_lock(&d->mu);
		q->up = up; /* from here a client that leaves cancels it (on_gone) */
		gone = q->gone;
		pthread_mutex_unlock(&d->mu);
		if (!gone)
			rc = door_up_request(up, q->path, q->body, q->len, UPSTREAM_TIMEOUT_MS, err, sizeof err);
	}
	if (gone) {
		reply_error(q->r, 503, "invalid_request_error", NULL, NULL, NULL, "the client went away");
	} else if (rc) {
		reply_error(q->r, 502, "server_error", NULL, "engine_unreachable", NULL, "%s", err);
	} else {
		int st = door_up_status(up);
		char ctype[128], ra[64], ra_hdr[96];
		if (!door_up_header(up, "Content-Type", ctype, sizeof ctype))
			snprintf(ctype, sizeof ctype, "application/json");
		const char *hdr[2] = { NULL, NULL };
		if (door_up_header(up, "Retry-After", ra, sizeof ra)) {
			snprintf(ra_hdr, sizeof ra_hdr, "Retry-After: %s", ra);
			hdr[0] = ra_hdr;
		}
		uint64_t clen;
		if (door_up_has_length(up, &clen)) {
			/* a whole reply: passed on as it is, with its length */
			char *buf = clen <= MAX_WHOLE ? malloc(clen ? clen : 1) : NULL;
			size_t got = 0;
			long n = 1;
			while (buf && got < clen && (n = door_up_read(up, buf + got, clen - got, UPSTREAM_TIMEOUT_MS)) > 0)
				got += (size_t)n;
			if (!buf)
				reply_error(q->r, 502, "server_error", NULL, NULL, NULL, "the engine's reply is too large");
			else if (got < clen)
				reply_error(q->r, 502, "server_error", NULL, NULL, NULL, "the engine's reply was cut short");
			else
				ok = http_reply(q->r, st, ctype, buf, got, hdr) == 0 && st < 400;
			free(buf);
		} else {
			/* a stream (server-sent events): each piece on as it comes */
			struct baton_http_stream *s = http_stream_open(q->r, st, ctype, hdr);
			char buf[16384];
			long n;
			ok = s != NULL;
			while (s && (n = door_up_read(up, buf, sizeof buf, UPSTREAM_TIMEOUT_MS)) != 0) {
				if (t_first < 0 && n > 0)
					t_first = now_s();
				if (n < 0 || http_stream_write(s, buf, (size_t)n) != 0) {
					ok = false;
					break;
				}
			}
			if (s)
				http_stream_close(s);
			ok = ok && st < 400;
		}
	}
	pthread_mutex_lock(&d->mu);
	q->up = NULL;
	unlink_fwd(d, q);
	struct deng *e = &d->eng[q->eng];
	if (e->inflight)
		e->inflight--;
	e->last_done = now_s();
	struct dmodel *m = &d->models[q->model];
	if (ok) {
		m->served++;
		hist_add(&m->wait, q->t_fwd - q->t_in);
		hist_add(&m->refill, q->refill_ms / 1e3);
		if (t_first >= 0) /* streams only: a whole reply's first byte is its last */
			hist_add(&m->prefill, t_first - q->t_fwd);
	} else if (q->gone) {
		m->gone++;
	} else {
		m->failed++;
	}
	pthread_mutex_unlock(&d->mu);
	door_up_close(up);
	free(q);
	helper_done(d);
	return NULL;
}

/* Under d->mu: q leaves its queue for engine ei; false when no thread
 * could start (q is then the caller's to answer). */
static bool forward(struct broker_door *d, struct dreq *q, int ei)
{
	struct deng *e = &d->eng[ei];
	q->eng = ei;
	q->t_fwd = now_s();
	snprintf(q->url, sizeof q->url, "%s", e->http);
	e->inflight++;
	e->used = true;
	q->next = d->fwd;
	d->fwd = q;
	if (spawn(d, proxy, q))
		return true;
	e->inflight--;
	unlink_fwd(d, q);
	d->models[q->model].failed++;
	return false;
}

/* ---- refill (a switch) and release (keep-alive) ------------------------------------ */

struct cmd_ctx {
	bool ok;
	char msg[300];
};

static void on_cmd(void *arg, const struct baton_msg *rep)
{
	struct cmd_ctx *c = arg;
	c->ok = rep->ok;
	if (!rep->ok)
		snprintf(c->msg, sizeof c->msg, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
}

struct refill_job {
	struct broker_door *d;
	size_t dev;
	int eng;
	char name[BROKER_NAME_MAX];
};

static void *refill_thread(void *arg)
{
	struct refill_job *j = arg;
	struct broker_door *d = j->d;
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_REFILL);
	m.name = j->name;
	proto_set(&m, PF_NAME);
	struct cmd_ctx c = { 0 };
	double t0 = now_s();
	broker_call(d->b, &m, on_cmd, &c);
	double refill_ms = (now_s() - t0) * 1e3;
	refresh(d); /* the victim's release and the target's state, before anything is forwarded */
	pthread_mutex_lock(&d->mu);
	struct ddev *v = &d->devs[j->dev];
	struct deng *e = &d->eng[j->eng];
	int mi = model_of(d, e->model, false);
	char reason[512];
	double total_ms = (now_s() - v->sw_t0) * 1e3;
	double drain_ms = (v->drained_at - v->sw_t0) * 1e3;
	const char *from = v->from >= 0 ? d->eng[v->from].name : "";
	bool counted = v->from >= 0 && v->from != j->eng;
	if (c.ok) {
		snprintf(e->state, sizeof e->state, "ready");
		if (e->resident < e->ceiling)
			e->resident = e->ceiling; /* the refill's answer; the next status says the same */
		v->holder = j->eng;
		v->holder_since = now_s();
		if (counted) {
			v->switches++;
			d->switches_total++;
			hist_add(&d->sw_drain, drain_ms / 1e3);
			hist_add(&d->sw_refill, refill_ms / 1e3);
		}
		if (mi >= 0)
			for (struct dreq *q = d->models[mi].qh; q; q = q->next)
				q->refill_ms += refill_ms;
		char what[2 * BROKER_NAME_MAX + 16];
		if (counted)
			snprintf(what, sizeof what, "switch %s -> %s", from, e->name);
		else
			snprintf(what, sizeof what, "refill %s", e->name);
		snprintf(reason, sizeof reason, "%s (model %s): drain %.1f ms, refill %.1f ms, %u waiting", what,
		    e->model, drain_ms, refill_ms, mi >= 0 ? d->models[mi].queued : 0);
	} else {
		snprintf(reason, sizeof reason, "refill of %s (model %s) failed after %.1f ms: %s", e->name,
		    e->model, refill_ms, c.msg);
	}
	v->switching = v->refilling = false;
	v->target = v->from = -1;
	/* A failed refill answers its model's waiting requests: the broker
	 * said why, and waiting longer would only wait for the same no. */
	struct dreq *fail = NULL;
	if (!c.ok && mi >= 0) {
		fail = d->models[mi].qh;
		d->models[mi].failed += d->models[mi].queued;
		d->models[mi].qh = d->models[mi].qt = NULL;
		d->models[mi].queued = 0;
		d->models[mi].queue_told = false;
	}
	char ename[BROKER_NAME_MAX];
	snprintf(ename, sizeof ename, "%s", e->name);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	broker_emit(d->b, c.ok ? "door.switch" : "door.refill_failed", ename, reason, total_ms, 0);
	for (struct dreq *q = fail, *nx; q; q = nx) {
		nx = q->next;
		reply_error(q->r, 503, "server_error", NULL, "device_busy", "1",
		    "cannot get device memory for model '%s': %s", e->model, c.msg);
		free(q);
	}
	free(j);
	helper_done(d);
	return NULL;
}

struct release_job {
	struct broker_door *d;
	int eng;
	char name[BROKER_NAME_MAX];
};

static void *release_thread(void *arg)
{
	struct release_job *j = arg;
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_RELEASE);
	m.name = j->name;
	proto_set(&m, PF_NAME);
	struct cmd_ctx c = { 0 };
	broker_call(j->d->b, &m, on_cmd, &c);
	refresh(j->d);
	pthread_mutex_lock(&j->d->mu);
	j->d->eng[j->eng].releasing = false;
	if (!c.ok)
		j->d->eng[j->eng].used = true; /* try again at the next round past its keep-alive */
	pthread_mutex_unlock(&j->d->mu);
	if (c.ok)
		broker_emit(j->d->b, "door.keep_alive", j->name, "released: its keep-alive passed", -1, 0);
	struct broker_door *d = j->d;
	free(j);
	helper_done(d);
	return NULL;
}

/* ---- the dispatch round (under d->mu) -------------------------------------------- */

/* Answers, outside the lock, what the round took out of the queues. */
struct outbox {
	struct dreq *gone, *orphan, *nothread;
};

static void drop_gone(struct broker_door *d, struct outbox *ob)
{
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		struct dreq **pp = &m->qh, *prev = NULL;
		while (*pp) {
			struct dreq *q = *pp;
			if (q->gone) {
				*pp = q->next;
				if (m->qt == q)
					m->qt = prev;
				m->queued--;
				m->gone++;
				q->next = ob->gone;
				ob->gone = q;
				continue;
			}
			prev = q;
			pp = &q->next;
		}
		if (!m->queued)
			m->queue_told = false;
	}
}

static int pick(struct broker_door *d, int mi, const bool *flow)
{
	int best = -1;
	for (size_t i = 0; i < d->n_eng; i++) {
		if (!flow[i] || !serves(&d->eng[i]) || strcmp(d->eng[i].model, d->models[mi].name) != 0)
			continue;
		if (best < 0 || d->eng[i].inflight < d->eng[best].inflight)
			best = (int)i;
	}
	return best;
}

static void round_(struct broker_door *d, double now, struct outbox *ob)
{
	bool flow[BROKER_MAX_ENGINES] = { 0 };
	drop_gone(d, ob);
	/* requests of a model nobody serves any more */
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		bool any = false;
		for (size_t i = 0; i < d->n_eng && !any; i++)
			any = serves(&d->eng[i]) && strcmp(d->eng[i].model, m->name) == 0;
		if (!any && m->qh) {
			m->qt->next = ob->orphan;
			ob->orphan = m->qh;
			m->failed += m->queued;
			m->qh = m->qt = NULL;
			m->queued = 0;
			m->queue_told = false;
		}
	}
	for (size_t di = 0; di < d->n_devs; di++) {
		struct ddev *v = &d->devs[di];
		int idx[BROKER_MAX_ENGINES];
		struct door_pe pe[BROKER_MAX_ENGINES];
		bool f[BROKER_MAX_ENGINES];
		size_t n = 0;
		int holder = -1, target = -1, from = -1;
		for (size_t i = 0; i < d->n_eng; i++) {
			struct deng *e = &d->eng[i];
			if (!serves(e) || strcmp(e->gpu, v->gpu) != 0)
				continue;
			int mi = model_of(d, e->model, false);
			struct dmodel *m = mi >= 0 ? &d->models[mi] : NULL;
			uint64_t want = e->ceiling > e->resident ? e->ceiling - e->resident : 0;
			uint64_t avail = v->free_b > v->reserve ? v->free_b - v->reserve : 0;
			pe[n] = (struct door_pe){
				.queued = m ? m->queued : 0,
				.oldest_s = m && m->qh ? now - m->qh->t_in : 0,
				.inflight = e->inflight,
				.ready = ready(e) && !e->releasing,
				.fits = want <= avail,
			};
			if (v->holder < 0 && !v->switching && pe[n].ready) {
				v->holder = (int)i; /* resident before the door switched anything */
				v->holder_since = now;
			}
			if ((int)i == v->holder)
				holder = (int)n;
			if ((int)i == v->target)
				target = (int)n;
			if ((int)i == v->from)
				from = (int)n;
			idx[n++] = (int)i;
		}
		if (v->holder >= 0 && holder < 0)
			v->holder = -1; /* gone */
		struct door_pdev pd = {
			.holder = holder, .held_s = holder >= 0 ? now - v->holder_since : 0,
			.quantum_s = d->quantum_s, .switching = v->switching, .target = target, .from = from,
		};
		int sw = -1;
		door_policy(pe, n, &pd, f, &sw);
		for (size_t k = 0; k < n; k++)
			flow[idx[k]] = f[k];
		if (v->switching && !v->refilling) {
			/* draining the engine switched out; then the refill */
			bool drained = v->from < 0 || d->eng[v->from].inflight == 0;
			if (drained && target >= 0) {
				v->drained_at = now;
				struct refill_job *j = calloc(1, sizeof *j);
				if (j) {
					*j = (struct refill_job){ d, di, v->target, "" };
					snprintf(j->name, sizeof j->name, "%s", d->eng[v->target].name);
					v->refilling = spawn(d, refill_thread, j);
					if (!v->refilling)
						free(j);
				}
			} else if (target < 0) {
				v->switching = false; /* its engine went away */
			}
		} else if (!v->switching && sw >= 0) {
			v->switching = true;
			v->refilling = false;
			v->target = idx[sw];
			v->from = !pe[sw].fits && holder >= 0 ? v->holder : -1;
			v->sw_t0 = now;
			v->drained_at = now;
			d->again = true; /* another round at once: the drain may be done */
		}
	}
	/* queued requests to the engines that flow */
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		while (m->qh) {
			int ei = pick(d, (int)mi, flow);
			if (ei < 0)
				break;
			struct dreq *q = m->qh;
			m->qh = q->next;
			if (!m->qh)
				m->qt = NULL;
			m->queued--;
			if (!forward(d, q, ei)) {
				q->next = ob->nothread;
				ob->nothread = q;
				break;
			}
		}
		if (!m->queued)
			m->queue_told = false;
	}
	/* a model whose requests wait (no engine of it takes requests now):
	 * told once per wait */
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		if (!m->queued || m->queue_told)
			continue;
		m->queue_told = true;
		const char *why = "waiting for its engine's refill";
		for (size_t di = 0; di < d->n_devs; di++) {
			struct ddev *v = &d->devs[di];
			if (v->holder >= 0 && strcmp(d->eng[v->holder].model, m->name) != 0 && !v->switching &&
			    d->eng[v->holder].inflight)
				why = "the device's holder keeps it for its quantum";
			else if (v->switching && v->from >= 0 && strcmp(d->eng[v->from].model, m->name) != 0)
				why = "waiting for the holder to drain";
		}
		char reason[BROKER_NAME_MAX + 128];
		snprintf(reason, sizeof reason, "model %s: %u waiting (%s)", m->name, m->queued, why);
		broker_emit(d->b, "door.queue", NULL, reason, -1, m->queued);
	}
	/* keep-alive */
	for (size_t i = 0; i < d->n_eng; i++) {
		struct deng *e = &d->eng[i];
		if (!serves(e) || !e->used || e->releasing || e->inflight || !ready(e))
			continue;
		double ka = keep_alive_of(d, e);
		int mi = model_of(d, e->model, false);
		if (ka < 0 || now - e->last_done < ka || (mi >= 0 && d->models[mi].queued))
			continue;
		bool busy_dev = false;
		for (size_t di = 0; di < d->n_devs; di++)
			busy_dev |= d->devs[di].switching && (d->devs[di].target == (int)i || d->devs[di].from == (int)i);
		if (busy_dev)
			continue;
		struct release_job *j = calloc(1, sizeof *j);
		if (!j)
			continue;
		*j = (struct release_job){ d, (int)i, "" };
		snprintf(j->name, sizeof j->name, "%s", e->name);
		e->releasing = true;
		e->used = false;
		if (!spawn(d, release_thread, j)) {
			e->releasing = false;
			free(j);
		}
	}
}

static void *dispatch(void *arg)
{
	struct broker_door *d = arg;
	pthread_mutex_lock(&d->mu);
	while (!d->stop) {
		double now = now_s();
		if (now >= d->next_refresh) {
			d->next_refresh = now + REFRESH_S;
			pthread_mutex_unlock(&d->mu);
			refresh(d);
			pthread_mutex_lock(&d->mu);
			if (d->stop)
				break;
			now = now_s();
		}
		struct outbox ob = { 0 };
		round_(d, now, &ob);
		if (ob.gone || ob.orphan || ob.nothread) {
			pthread_mutex_unlock(&d->mu);
			for (struct dreq *q = ob.gone, *nx; q; q = nx) {
				nx = q->next;
				reply_error(q->r, 503, "invalid_request_error", NULL, NULL, NULL, "the client went away");
				free(q);
			}
			for (struct dreq *q = ob.nothread, *nx; q; q = nx) {
				nx = q->next;
				reply_error(q->r, 503, "server_error", NULL, NULL, "1", "the broker cannot start a thread now");
				free(q);
			}
			for (struct dreq *q = ob.orphan, *nx; q; q = nx) {
				nx = q->next;
				reply_error(q->r, 503, "server_error", "model", "model_not_served", "5",
				    "no engine serves this model any more");
				free(q);
			}
			pthread_mutex_lock(&d->mu);
			continue;
		}
		if (d->again) {
			d->again = false;
			continue;
		}
		/* sleep until the next status, or a change (a request, an end) */
		double wake = d->next_refresh;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double dt = wake - now_s();
		if (dt > 0.05)
			dt = 0.05; /* quanta and keep-alives are looked at this often */
		if (dt < 0)
			dt = 0;
		ts.tv_sec += (time_t)dt;
		ts.tv_nsec += (long)((dt - floor(dt)) * 1e9);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&d->cv, &d->mu, &ts);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ---- requests in ----------------------------------------------------------------- */

static void on_gone(void *owner, uint64_t id)
{
	struct broker_door *d = owner;
	{
		pthread_mutex_lock(&d->mu);
		bool found = false;
		for (struct dreq *q = d->fwd; q && !found; q = q->next)
			if (q->id == id) {
				q->gone = found = true;
				door_up_cancel(q->up); /* the engine sees the close and frees its sequence */
			}
		for (size_t mi = 0; mi < d->n_models && !found; mi++)
			for (struct dreq *q = d->models[mi].qh; q && !found; q = q->next)
				if (q->id == id)
					q->gone = found = true;
		pthread_cond_signal(&d->cv);
		pthread_mutex_unlock(&d->mu);
	}
}

static json_t *models_json(struct broker_door *d)
{
	json_t *data = json_array();
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		json_t *engs = json_array();
		bool any = false, res = false, part = false;
		for (size_t i = 0; i < d->n_eng; i++) {
			struct deng *e = &d->eng[i];
			if (!serves(e) || strcmp(e->model, m->name) != 0)
				continue;
			any = true;
			res |= ready(e);
			part |= strcmp(e->state, "partial") == 0 || strcmp(e->state, "refilling") == 0 ||
			    (strcmp(e->state, "ready") == 0 && e->resident > 0 && e->resident < e->ceiling);
			json_array_append_new(engs, json_pack("{s:s, s:s, s:s, s:I, s:I, s:i}", "name", e->name,
			    "gpu", e->gpu, "state", e->state, "resident", (json_int_t)e->resident, "ceiling",
			    (json_int_t)e->ceiling, "in_flight", (int)e->inflight));
		}
		if (!any) {
			json_decref(engs);
			continue;
		}
		json_array_append_new(data, json_pack("{s:s, s:s, s:i, s:s, s:s, s:o, s:i}", "id", m->name, "object",
		    "model", "created", 0, "owned_by", "baton", "state",
		    res ? "resident" : part ? "partial" : "released", "engines", engs, "queued", (int)m->queued));
	}
	return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

/* The dispatch thread starts with the first request: it talks to the
 * broker (broker_call), which serves only once started, and a broker
 * that fails to start must be able to close its faces. */
static bool start_dispatch(struct broker_door *d)
{
	pthread_mutex_lock(&d->mu);
	if (!d->have_th && !d->stop && pthread_create(&d->th, NULL, dispatch, d) == 0)
		d->have_th = true;
	bool ok = d->have_th;
	pthread_mutex_unlock(&d->mu);
	return ok;
}

bool broker_door_route(struct broker_door *d, struct baton_http_req *r)
{
	const char *path = http_req_path(r), *method = http_req_method(r);
	bool chat = strcmp(path, "/v1/chat/completions") == 0, comp = strcmp(path, "/v1/completions") == 0;
	bool models = strcmp(path, "/v1/models") == 0;
	if (!chat && !comp && !models)
		return false;
	if (!start_dispatch(d)) {
		reply_error(r, 503, "server_error", NULL, NULL, "1", "the front door cannot start its thread");
		return true;
	}
	if (models) {
		if (strcmp(method, "GET") != 0) {
			reply_error(r, 405, "invalid_request_error", NULL, NULL, NULL, "/v1/models takes GET");
			return true;
		}
		pthread_mutex_lock(&d->mu);
		bool have = d->have_status;
		pthread_mutex_unlock(&d->mu);
		if (!have)
			refresh(d);
		pthread_mutex_lock(&d->mu);
		json_t *j = models_json(d);
		pthread_mutex_unlock(&d->mu);
		http_reply_json(r, 200, j);
		return true;
	}
	if (strcmp(method, "POST") != 0) {
		reply_error(r, 405, "invalid_request_error", NULL, NULL, NULL, "%s takes POST", path);
		return true;
	}
	if (!http_req_authorized(r)) {
		reply_error(r, 401, "invalid_request_error", NULL, "invalid_api_key", NULL,
		    "the broker's token is needed (pass it as the API key: Authorization: Bearer TOKEN)");
		return true;
	}
	size_t len;
	const char *body = http_req_body(r, &len);
	json_error_t je;
	json_t *j = body ? json_loadb(body, len, 0, &je) : NULL;
	if (!j || !json_is_object(j)) {
		reply_error(r, 400, "invalid_request_error", NULL, NULL, NULL, "the body is not a JSON object%s%s",
		    j ? "" : ": ", j ? "" : je.text);
		json_decref(j);
		return true;
	}
	json_t *jm = json_object_get(j, "model");
	json_t *js = json_object_get(j, "stream");
	if (!json_is_string(jm) || json_string_length(jm) == 0 || json_string_length(jm) >= BROKER_NAME_MAX) {
		json_decref(j);
		reply_error(r, 400, "invalid_request_error", "model", NULL, NULL, "'model' must be a model's name");
		return true;
	}
	if (js && !json_is_boolean(js)) {
		json_decref(j);
		reply_error(r, 400, "invalid_request_error", "stream", NULL, NULL, "'stream' must be true or false");
		return true;
	}
	char model[BROKER_NAME_MAX];
	snprintf(model, sizeof model, "%s", json_string_value(jm));
	bool stream = json_is_true(js);
	json_decref(j);

	pthread_mutex_lock(&d->mu);
	bool have = d->have_status;
	pthread_mutex_unlock(&d->mu);
	if (!have)
		refresh(d);
	pthread_mutex_lock(&d->mu);
	int mi = model_of(d, model, false);
	bool served = false;
	for (size_t i = 0; mi >= 0 && i < d->n_eng && !served; i++)
		served = serves(&d->eng[i]) && strcmp(d->eng[i].model, model) == 0;
	if (!served) {
		pthread_mutex_unlock(&d->mu);
		reply_error(r, 404, "invalid_request_error", "model", "model_not_found", NULL,
		    "The model '%s' does not exist (GET /v1/models lists those the broker serves)", model);
		return true;
	}
	struct dmodel *m = &d->models[mi];
	uint64_t q_id;
	if (m->queued >= d->queue_max) {
		m->rejected_full++;
		unsigned qm = d->queue_max;
		pthread_mutex_unlock(&d->mu);
		reply_error(r, 503, "server_error", NULL, "queue_full", "1",
		    "model '%s' has %u requests waiting already; try again", model, qm);
		return true;
	}
	q_id = ++d->next_id;
	pthread_mutex_unlock(&d->mu);
	struct dreq *q = calloc(1, sizeof *q);
	if (!q) {
		reply_error(r, 503, "server_error", NULL, NULL, "1", "out of memory");
		return true;
	}
	q->id = q_id;
	q->r = r;
	q->d = d;
	q->model = mi;
	q->path = chat ? "/v1/chat/completions" : "/v1/completions";
	q->body = body;
	q->len = len;
	q->stream = stream;
	q->t_in = now_s();
	q->eng = -1;
	/* before anyone else may answer it: a client that leaves from here on
	 * is seen (by id; a request not queued yet is looked for in vain, and
	 * its proxy then sees the client gone when it writes) */
	http_req_on_gone(r, on_gone, d, q_id);
	pthread_mutex_lock(&d->mu);
	m = &d->models[mi];
	if (m->qt)
		m->qt->next = q;
	else
		m->qh = q;
	m->qt = q;
	m->queued++;
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	return true;
}

/* ---- metrics ----------------------------------------------------------------------- */

static void label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void write_hist(FILE *f, const char *name, const char *model, const struct hist *h)
{
	for (int i = 0; i < NB; i++) {
		fprintf(f, "%s_bucket{model=\"", name);
		label(f, model);
		fprintf(f, "\",le=\"%g\"} %" PRIu64 "\n", bucket_s[i], h->b[i]);
	}
	fprintf(f, "%s_bucket{model=\"", name);
	label(f, model);
	fprintf(f, "\",le=\"+Inf\"} %" PRIu64 "\n%s_sum{model=\"", h->n, name);
	label(f, model);
	fprintf(f, "\"} %.6f\n%s_count{model=\"", h->sum, name);
	label(f, model);
	fprintf(f, "\"} %" PRIu64 "\n", h->n);
}

void broker_door_metrics(struct broker_door *d, FILE *f)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	double now = now_s();
	fprintf(f, "# HELP baton_door_queue_depth Front door: requests waiting for an engine, per model.\n"
	    "# TYPE baton_door_queue_depth gauge\n");
	for (size_t i = 0; i < d->n_models; i++) {
		fputs("baton_door_queue_depth{model=\"", f);
		label(f, d->models[i].name);
		fprintf(f, "\"} %u\n", d->models[i].queued);
	}
	fprintf(f, "# HELP baton_door_oldest_wait_seconds Front door: how long the oldest waiting request of a model has waited.\n"
	    "# TYPE baton_door_oldest_wait_seconds gauge\n");
	for (size_t i = 0; i < d->n_models; i++) {
		fputs("baton_door_oldest_wait_seconds{model=\"", f);
		label(f, d->models[i].name);
		fprintf(f, "\"} %.3f\n", d->models[i].qh ? now - d->models[i].qh->t_in : 0.0);
	}
	fprintf(f, "# HELP baton_door_requests_total Front door: requests by outcome (served, queue_full, failed, gone: the client left).\n"
	    "# TYPE baton_door_requests_total counter\n");
	for (size_t i = 0; i < d->n_models; i++) {
		const struct dmodel *m = &d->models[i];
		const char *what[4] = { "served", "queue_full", "failed", "gone" };
		uint64_t v[4] = { m->served, m->rejected_full, m->failed, m->gone };
		for (int k = 0; k < 4; k++) {
			fputs("baton_door_requests_total{model=\"", f);
			label(f, m->name);
			fprintf(f, "\",outcome=\"%s\"} %" PRIu64 "\n", what[k], v[k]);
		}
	}
	fprintf(f, "# HELP baton_door_switches_total Front door: a device switched from one model to another "
	    "(rate() gives switches per second).\n# TYPE baton_door_switches_total counter\n");
	fprintf(f, "baton_door_switches_total %" PRIu64 "\n", d->switches_total);
	fprintf(f, "# HELP baton_door_switch_seconds Front door: the parts of a switch: drain (the engine "
	    "switched out finishes its requests), refill (the broker's refill of the one switched in).\n"
	    "# TYPE baton_door_switch_seconds histogram\n");
	for (int k = 0; k < 2; k++) {
		const struct hist *h = k ? &d->sw_refill : &d->sw_drain;
		const char *ph = k ? "refill" : "drain";
		for (int i = 0; i < NB; i++)
			fprintf(f, "baton_door_switch_seconds_bucket{phase=\"%s\",le=\"%g\"} %" PRIu64 "\n", ph, bucket_s[i],
			    h->b[i]);
		fprintf(f, "baton_door_switch_seconds_bucket{phase=\"%s\",le=\"+Inf\"} %" PRIu64 "\n"
		    "baton_door_switch_seconds_sum{phase=\"%s\"} %.6f\nbaton_door_switch_seconds_count{phase=\"%s\"} %"
		    PRIu64 "\n", ph, h->n, ph, h->sum, ph, h->n);
	}
	fprintf(f, "# HELP baton_door_in_flight Front door: requests forwarded to an engine, not yet answered.\n"
	    "# TYPE baton_door_in_flight gauge\n");
	for (size_t i = 0; i < d->n_eng; i++) {
		if (!serves(&d->eng[i]))
			continue;
		fputs("baton_door_in_flight{engine=\"", f);
		label(f, d->eng[i].name);
		fputs("\",model=\"", f);
		label(f, d->eng[i].model);
		fprintf(f, "\"} %u\n", d->eng[i].inflight);
	}
	const char *names[3] = { "baton_door_ttft_wait_seconds", "baton_door_ttft_refill_seconds",
		"baton_door_ttft_prefill_seconds" };
	const char *help[3] = {
		"time to first token, part 1: queued at the door until forwarded",
		"time to first token, part 2: the refill (acquire) it waited for, within the wait",
		"time to first token, part 3: forwarded until the engine's first byte",
	};
	for (int k = 0; k < 3; k++) {
		fprintf(f, "# HELP %s Front door: %s.\n# TYPE %s histogram\n", names[k], help[k], names[k]);
		for (size_t i = 0; i < d->n_models; i++) {
			const struct dmodel *m = &d->models[i];
			write_hist(f, names[k], m->name, k == 0 ? &m->wait : k == 1 ? &m->refill : &m->prefill);
		}
	}
	pthread_mutex_unlock(&d->mu);
}

/* ---- open, reload and close ------------------------------------------------------- */

/* Under d->mu (or before the door runs). */
static int set_config(struct broker_door *d, const struct broker_config *cfg)
{
	struct broker_engine_conf *ec = NULL;
	if (cfg->n_engines) {
		ec = calloc(cfg->n_engines, sizeof *ec);
		if (!ec)
			return BATON_ENOMEM;
		memcpy(ec, cfg->engines, cfg->n_engines * sizeof *ec);
	}
	free(d->econf);
	d->econf = ec;
	d->n_econf = cfg->n_engines;
	d->quantum_s = cfg->door_quantum_s;
	d->keep_alive_s = cfg->door_keep_alive_s;
	d->queue_max = cfg->door_queue_max ? cfg->door_queue_max : 64;
	return 0;
}

void broker_door_reload(struct broker_door *d, const struct broker_config *cfg)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	int rc = set_config(d, cfg);
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
	if (rc)
		fprintf(stderr, "baton-broker: front door: reload: out of memory; its settings stay\n");
	else
		fprintf(stderr, "baton-broker: front door: quantum %g s, keep-alive %g s, queue %u per model\n",
		    cfg->door_quantum_s, cfg->door_keep_alive_s, cfg->door_queue_max);
}


int broker_door_open(struct broker *b, const struct broker_config *cfg, struct broker_door **out, char *err,
    size_t errlen)
{
	*out = NULL;
	struct broker_door *d = calloc(1, sizeof *d);
	if (!d) {
		snprintf(err, errlen, "front door: out of memory");
		return BATON_ENOMEM;
	}
	d->b = b;
	if (set_config(d, cfg) != 0) {
		free(d);
		snprintf(err, errlen, "front door: out of memory");
		return BATON_ENOMEM;
	}
	pthread_mutex_init(&d->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&d->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_cond_init(&d->idle_cv, NULL);
	*out = d;
	return 0;
}

void broker_door_close(struct broker_door *d)
{
	if (!d)
		return;
	pthread_mutex_lock(&d->mu);
	d->stop = true;
	pthread_cond_signal(&d->cv);
	bool joined = d->have_th;
	pthread_mutex_unlock(&d->mu);
	if (joined)
		pthread_join(d->th, NULL);
	/* what waits is answered; what is forwarded is cut (its proxy answers) */
	struct dreq *rest = NULL;
	pthread_mutex_lock(&d->mu);
	for (size_t mi = 0; mi < d->n_models; mi++) {
		struct dmodel *m = &d->models[mi];
		if (m->qh) {
			m->qt->next = rest;
			rest = m->qh;
		}
		m->qh = m->qt = NULL;
		m->queued = 0;
	}
	for (struct dreq *q = d->fwd; q; q = q->next)
		door_up_cancel(q->up);
	pthread_mutex_unlock(&d->mu);
	for (struct dreq *q = rest, *nx; q; q = nx) {
		nx = q->next;
		reply_error(q->r, 503, "server_error", NULL, NULL, "5", "the broker is shutting down");
		free(q);
	}
	pthread_mutex_lock(&d->mu);
	while (d->helpers) {
		for (struct dreq *q = d->fwd; q; q = q->next)
			door_up_cancel(q->up);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&d->idle_cv, &d->mu, &ts);
	}
	pthread_mutex_unlock(&d->mu);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->cv);
	pthread_cond_destroy(&d->idle_cv);
	free(d->econf);
	free(d);
}
