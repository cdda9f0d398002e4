/*
 * http.c: the broker's HTTP face (see api.h and docs/reference/http-api.md): the
 * JSON API under /v1, Prometheus metrics on /metrics (metrics.c), the
 * dashboard page on /, and /healthz, /readyz; and the route table where
 * other faces (the front door) put their paths and metrics.
 *
 * The server is http/ (libmicrohttpd): it refuses a request on its
 * headers (Host, Origin, token, size) before reading a body, caps
 * connections and times out slow clients, and calls on_request() on one
 * of its worker threads with the body read. Reads are served there. A
 * POST may wait seconds for memory (a handoff), so POSTs go to threads of
 * our own, in a queue of their own: reads never wait behind them, and a
 * flood of POSTs gets 503 past QUEUE_MAX instead of taking every worker.
 * Either way a request goes through broker_call() (the same path as the
 * control socket: same checks, same errors, same events) and is answered
 * from the thread that ran it.
 *
 * It sits on the core's public door only: requests go in through
 * broker_call(), events come out through the subscription it takes
 * (broker_observe): http_event() keeps the last EVENTS_MAX in a ring (for
 * /v1/events?since=N) and hands each to the metrics' counters.
 *
 * Routes of other faces: a request whose path is none of the API's own
 * and matches a registered route goes to that route's handler on the
 * server's thread (after the method check: 405 with Allow); its body
 * limit is the route's. The table is filled before the broker starts and
 * only read after, each entry published by the count (an atomic).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "broker/api/api_int.h"
#include "broker/api/dashboard.h"
#include "http/http.h"

#define WRITE_THREADS 4            /* POSTs run here; reads on the server's workers */
#define READ_WORKERS 8
#define QUEUE_MAX 256              /* waiting POSTs; more: 503 */
#define BODY_MAX (64u * 1024u)      /* a JSON body above this: 413, before it is read */
#define EVENTS_MAX 1024
#define HOSTS_MAX 16

struct evrec {
	uint64_t seq, time_ms, bytes;
	double ms;
	bool has_ms;
	char kind[32], state[32];
	char engine[BROKER_NAME_MAX], gpu[BROKER_NAME_MAX];
	char reason[512];
};

struct face_metrics {
	void (*fn)(void *arg, FILE *f);
	void *arg;
};

struct hjob {
	struct hjob *next;
	struct baton_http_req *req;
};

struct broker_http {
	struct broker *b;
	struct baton_http *srv;
	pthread_t th[WRITE_THREADS];
	int n_th;
	bool observing;       /* subscribed to the broker's events */
	bool has_token;       /* POSTs are refused without one */
	atomic_bool ready;    /* /readyz: the broker runs its loop (broker_http_ready) */
	struct broker_metrics *metrics; /* counters from events, the /metrics text (metrics.c) */
	struct broker_http_route routes[BROKER_HTTP_ROUTES_MAX]; /* other faces' paths */
	atomic_size_t n_routes;   /* entries below it are filled (release/acquire) */
	struct face_metrics fmetrics[BROKER_HTTP_ROUTES_MAX]; /* other faces' /metrics lines */
	atomic_size_t n_fmetrics;

	pthread_mutex_t mu;   /* everything below */
	pthread_cond_t cv;
	struct hjob *head, *tail; /* POSTs waiting for a write thread */
	size_t n;
	bool stop;
	struct evrec *ev;     /* ring: seq s at ev[s % EVENTS_MAX] */
	uint64_t ev_last;     /* newest seq, 0: none */
	uint64_t ev_count;    /* held in the ring */
};

/* ---- events and counters (decision thread in, HTTP threads out) ---------------- */

/* snprintf("%s") that never cuts a UTF-8 sequence in two (jansson
 * refuses invalid UTF-8, and a whole reply would be lost to one reason). */
static void copy_utf8(char *dst, size_t n, const char *src)
{
	size_t len = strlen(src);
	if (len >= n) {
		len = n - 1;
		while (len > 0 && ((unsigned char)src[len] & 0xC0) == 0x80)
			len--; /* src[len] continues a sequence: cut before its start */
	}
	memcpy(dst, src, len);
	dst[len] = 0;
}

static void http_event(void *arg, const struct baton_msg *ev)
{
	struct broker_http *h = arg;
	const char *kind = ev->kind ? ev->kind : "", *reason = ev->reason ? ev->reason : "";
	pthread_mutex_lock(&h->mu);
	struct evrec *r = &h->ev[ev->seq % EVENTS_MAX];
	memset(r, 0, sizeof *r);
	r->seq = ev->seq;
	r->time_ms = ev->time_ms;
	r->bytes = ev->bytes;
	r->has_ms = proto_has(ev, PF_MS);
	r->ms = r->has_ms ? ev->ms : 0;
	copy_utf8(r->kind, sizeof r->kind, kind);
	copy_utf8(r->state, sizeof r->state, ev->state ? ev->state : "");
	copy_utf8(r->engine, sizeof r->engine, ev->engine ? ev->engine : "");
	copy_utf8(r->gpu, sizeof r->gpu, ev->gpu ? ev->gpu : "");
	copy_utf8(r->reason, sizeof r->reason, reason);
	h->ev_last = ev->seq;
	if (h->ev_count < EVENTS_MAX)
		h->ev_count++;

	pthread_mutex_unlock(&h->mu);
	broker_metrics_event(h->metrics, ev);
}

/* ---- responses ------------------------------------------------------------------- */

struct resp {
	int status;
	const char *ctype;
	char *body;           /* malloc'd, or NULL with cbody */
	const char *cbody;
	size_t len;
	const char *allow;    /* 405: the methods that would do */
	bool close;           /* the connection cannot go on (a body left unread) */
};

static void resp_json(struct resp *r, int status, json_t *j)
{
	r->status = status;
	r->ctype = "application/json";
	r->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	r->len = r->body ? strlen(r->body) : 0;
	if (!r->body) {
		r->status = 500;
		r->cbody = "{\"ok\":false,\"code\":\"nomem\",\"err\":2,\"message\":\"out of memory\"}";
		r->len = strlen(r->cbody);
	}
	json_decref(j);
}

/* An error body: {"ok": false, "code": "busy", "err": 6, "message": "...",
 * "error": {...}} (http_error_json: OpenAI's error object as well). code
 * and err are those of proto/base/base.h, as on the control socket. */
static void resp_error(struct resp *r, int status, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void resp_error(struct resp *r, int status, int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	free(r->body);
	r->body = NULL;
	resp_json(r, status, http_error_json(status, err, msg));
}

static void send_resp(struct baton_http_req *req, struct resp *r)
{
	const char *hd[5];
	char allow[64];
	size_t n = 0;
	if (r->allow) {
		snprintf(allow, sizeof allow, "Allow: %s", r->allow);
		hd[n++] = allow;
	}
	if (r->status == 401)
		hd[n++] = "WWW-Authenticate: Bearer realm=\"baton\"";
	if (r->status == 413 || (r->status == 400 && r->close))
		hd[n++] = "Connection: close";
	if (http_retry_after(r->status))
		hd[n++] = "Retry-After: 1";
	hd[n] = NULL;
	http_reply(req, r->status, r->ctype, r->body ? r->body : r->cbody, r->len, hd);
	free(r->body);
	r->body = NULL;
}

/* ---- status as JSON -------------------------------------------------------------- */

struct status_ctx {
	struct broker_http *h;
	const char *only;     /* one engine's object, or NULL: everything */
	bool list;            /* {"ok", "engines"} only (GET /v1/engines) */
	json_t *out;          /* built here; NULL after an error */
	int err;
	char msg[512];
};

static void on_status_reply(void *arg, const struct baton_msg *rep)
{
	struct status_ctx *c = arg;
	if (!rep->ok) {
		c->err = rep->err;
		snprintf(c->msg, sizeof c->msg, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
		return;
	}
	if (c->only) {
		for (uint32_t i = 0; i < rep->engines.n; i++)
			if (strcmp(rep->engines.v[i].name, c->only) == 0)
				c->out = broker_engine_json(&rep->engines.v[i]);
		if (!c->out) {
			c->err = BATON_ENOTFOUND;
			snprintf(c->msg, sizeof c->msg, "no engine named '%s' is registered", c->only);
		}
		return;
	}
	json_t *st = broker_status_json(rep);
	if (c->list) {
		c->out = st ? json_pack("{s:b, s:O}", "ok", 1, "engines", json_object_get(st, "engines")) : NULL;
		json_decref(st);
		return;
	}
	pthread_mutex_lock(&c->h->mu);
	uint64_t last = c->h->ev_last;
	pthread_mutex_unlock(&c->h->mu);
	c->out = st ? json_pack("{s:b, s:O, s:I, s:O, s:O}", "ok", 1, "epoch", json_object_get(st, "epoch"),
	    "last_event", (json_int_t)last, "gpus", json_object_get(st, "gpus"), "engines",
	    json_object_get(st, "engines")) : NULL;
	json_decref(st);
}

/* ---- requests -------------------------------------------------------------------- */

struct cmd_ctx {
	struct resp *r;
	const char *name;
	bool pinned;          /* a pin's wish (its reply does not repeat it) */
};

static void on_cmd_reply(void *arg, const struct baton_msg *rep)
{
	struct cmd_ctx *c = arg;
	if (!rep->ok) {
		resp_error(c->r, http_status_of(rep->err), rep->err, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
		return;
	}
	json_t *j;
	if (rep->op == PROTO_OP_PIN) {
		j = json_pack("{s:b, s:s, s:b}", "ok", 1, "name", c->name, "pinned", c->pinned);
	} else if (rep->op == PROTO_OP_HANDOFF) {
		j = json_pack("{s:b, s:f, s:f, s:f, s:f}", "ok", 1, "decide_ms", rep->decide_ms, "release_ms",
		    rep->release_ms, "refill_ms", rep->refill_ms, "total_ms", rep->total_ms);
	} else {
		/* resident: the device memory its cache maps, as in /v1/status
		 * (the engine's own `resident` counts expert bytes only) */
		uint64_t held = proto_has(rep, PF_MAPPED) ? rep->mapped : rep->resident;
		j = json_pack("{s:b, s:s, s:s, s:I, s:I, s:f, s:I, s:I}", "ok", 1, "name", c->name, "state",
		    rep->state ? rep->state : "", "resident", (json_int_t)held, "experts_bytes",
		    (json_int_t)rep->resident, "ms", rep->ms, "bytes", (json_int_t)rep->bytes, "epoch",
		    (json_int_t)rep->epoch);
	}
	resp_json(c->r, 200, j);
}

/* The body of a POST: empty or a JSON object with exactly `keys` (NULL
 * ends; "?name" is optional). 0, or an error response made. */
static int parse_body(struct baton_http_req *req, struct resp *r, const char *const *keys, json_t **out)
{
	size_t len;
	const char *data = http_req_body(req, &len);
	*out = NULL;
	if (len > BODY_MAX) {
		resp_error(r, 413, BATON_ETOOBIG, "the body is %zu bytes; at most %u", len, BODY_MAX);
		return -1;
	}
	bool optional_only = true;
	for (size_t i = 0; keys[i]; i++)
		optional_only = optional_only && keys[i][0] == '?';
	if (len == 0 && optional_only) {
		*out = json_object();
		return 0;
	}
	json_error_t je;
	json_t *j = len ? json_loadb(data, len, JSON_REJECT_DUPLICATES, &je) : NULL;
	if (!j) {
		resp_error(r, 400, BATON_EMSG, "the body is not JSON: %s", len ? je.text : "empty");
		return -1;
	}
	if (!json_is_object(j)) {
		json_decref(j);
		resp_error(r, 400, BATON_ETYPE, "the body must be a JSON object");
		return -1;
	}
	const char *k;
	json_t *v;
	json_object_foreach(j, k, v) {
		bool known = false;
		for (size_t i = 0; keys[i]; i++)
			known = known || strcmp(keys[i] + (keys[i][0] == '?'), k) == 0;
		if (!known) {
			json_decref(j);
			resp_error(r, 400, BATON_EEXTRA, "unexpected key in the body (want %s%s%s)",
			    keys[0] ? keys[0] + (keys[0][0] == '?') : "nothing", keys[0] && keys[1] ? ", " : "",
			    keys[0] && keys[1] ? keys[1] + (keys[1][0] == '?') : "");
			return -1;
		}
	}
	for (size_t i = 0; keys[i]; i++) {
		if (keys[i][0] != '?' && !json_object_get(j, keys[i])) {
			json_decref(j);
			resp_error(r, 400, BATON_EMISSING, "the body needs \"%s\"", keys[i]);
			return -1;
		}
	}
	*out = j;
	return 0;
}

static void do_events(struct broker_http *h, const char *query, struct resp *r)
{
	uint64_t since = 0;
	if (query && *query) {
		if (strncmp(query, "since=", 6) != 0 || strchr(query, '&')) {
			resp_error(r, 400, BATON_EEXTRA, "the only query parameter is since=N");
			return;
		}
		if (baton_parse_u64(query + 6, 0, UINT64_MAX, &since)) {
			resp_error(r, 400, BATON_ETYPE, "since: want a whole number (the last seq seen)");
			return;
		}
	}
	json_t *arr = json_array();
	pthread_mutex_lock(&h->mu);
	uint64_t last = h->ev_last, first = last >= h->ev_count ? last - h->ev_count + 1 : 1;
	for (uint64_t s = since + 1 > first ? since + 1 : first; s <= last && h->ev_count; s++) {
		const struct evrec *e = &h->ev[s % EVENTS_MAX];
		json_t *o = json_pack("{s:I, s:I, s:s, s:s, s:s, s:s, s:s, s:I}", "seq", (json_int_t)e->seq,
		    "time_ms", (json_int_t)e->time_ms, "kind", e->kind, "engine", e->engine, "gpu", e->gpu,
		    "state", e->state, "reason", e->reason, "bytes", (json_int_t)e->bytes);
		if (o && e->has_ms)
			json_object_set_new(o, "ms", json_real(e->ms));
		json_array_append_new(arr, o);
	}
	pthread_mutex_unlock(&h->mu);
	resp_json(r, 200, json_pack("{s:b, s:I, s:I, s:o}", "ok", 1, "last", (json_int_t)last, "first",
	    (json_int_t)(h->ev_count ? first : 0), "events", arr));
}

/* POST /v1/release {"all": true} or {"gpu": "UUID"}: every engine (of one
 * device) that holds memory is released, one after another, as `baton
 * release --every` does. The answer lists what was released and what was
 * refused (a pinned or busy engine); its status is the first refusal's. */
struct every_ctx {
	const char *gpu;      /* NULL: every device */
	char names[BROKER_MAX_ENGINES][BROKER_NAME_MAX];
	size_t n;
	bool gpu_known;
	int err;
	char msg[512];
};

static void on_every_status(void *arg, const struct baton_msg *rep)
{
	struct every_ctx *c = arg;
	if (!rep->ok) {
		c->err = rep->err;
		snprintf(c->msg, sizeof c->msg, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
		return;
	}
	for (uint32_t i = 0; i < rep->gpus.n; i++)
		c->gpu_known = c->gpu_known || (c->gpu && strcmp(rep->gpus.v[i].uuid, c->gpu) == 0);
	for (uint32_t i = 0; i < rep->engines.n && c->n < BROKER_MAX_ENGINES; i++) {
		const struct proto_engine_info *e = &rep->engines.v[i];
		if (c->gpu && strcmp(e->gpu, c->gpu) != 0)
			continue;
		c->gpu_known = c->gpu_known || c->gpu;
		if (!broker_every_releases(e->state))
			continue;
		snprintf(c->names[c->n++], BROKER_NAME_MAX, "%s", e->name);
	}
}

struct one_ctx {
	int err;
	char msg[512];
	double ms;
	uint64_t bytes;
};

static void on_one_release(void *arg, const struct baton_msg *rep)
{
	struct one_ctx *c = arg;
	c->err = rep->ok ? 0 : rep->err;
	snprintf(c->msg, sizeof c->msg, "%s", rep->ok ? "" : rep->msg ? rep->msg : baton_strerror(rep->err));
	c->ms = rep->ok ? rep->ms : 0;
	c->bytes = rep->ok ? rep->bytes : 0;
}

static void do_release_every(struct broker_http *h, json_t *body, struct resp *r)
{
	json_t *all = json_object_get(body, "all"), *gpu = json_object_get(body, "gpu");
	if ((all != NULL) == (gpu != NULL)) {
		resp_error(r, 400, all ? BATON_EEXTRA : BATON_EMISSING,
		    "the body is {\"all\": true} or {\"gpu\": \"UUID\"}, one of them");
		return;
	}
	if (all && !json_is_true(all)) {
		resp_error(r, 400, json_is_boolean(all) ? BATON_EINVAL : BATON_ETYPE, "all: want true");
		return;
	}
	if (gpu && (!json_is_string(gpu) || !json_string_length(gpu) ||
	    strlen(json_string_value(gpu)) != json_string_length(gpu))) {
		resp_error(r, 400, BATON_ETYPE, "gpu: want a device's uuid (a string)");
		return;
	}
	struct every_ctx *c = calloc(1, sizeof *c);
	if (!c) {
		resp_error(r, 500, BATON_ENOMEM, "out of memory");
		return;
	}
	c->gpu = gpu ? json_string_value(gpu) : NULL;
	struct baton_msg m;
	proto_msg_init(&m, PROTO_OP_STATUS);
	broker_call(h->b, &m, on_every_status, c);
	if (c->err) {
		resp_error(r, http_status_of(c->err), c->err, "%s", c->msg);
		free(c);
		return;
	}
	if (c->gpu && !c->gpu_known) {
		resp_error(r, 404, BATON_ENOTFOUND, "no device '%s' (see GET /v1/status)", c->gpu);
		free(c);
		return;
	}
	json_t *done = json_array(), *failed = json_array();
	int first = 0;
	char first_msg[600] = "";
	for (size_t i = 0; i < c->n; i++) {
		struct one_ctx o = { 0 };
		proto_msg_init(&m, PROTO_OP_RELEASE);
		m.name = c->names[i];
		proto_set(&m, PF_NAME);
		broker_call(h->b, &m, on_one_release, &o);
		if (o.err == 0) {
			json_array_append_new(done, json_pack("{s:s, s:f, s:I}", "name", c->names[i], "ms", o.ms, "bytes",
			    (json_int_t)o.bytes));
			continue;
		}
		json_array_append_new(failed, json_pack("{s:s, s:s, s:i, s:s}", "name", c->names[i], "code",
		    baton_errname(o.err), "err", o.err, "message", o.msg));
		if (!first) {
			first = o.err;
			snprintf(first_msg, sizeof first_msg, "%s: %s", c->names[i], o.msg);
		}
	}
	free(c);
	if (!first) {
		json_decref(failed);
		resp_json(r, 200, json_pack("{s:b, s:o}", "ok", 1, "released", done));
		return;
	}
	json_t *e = http_error_json(http_status_of(first), first, first_msg);
	if (e) {
		json_object_set_new(e, "released", done);
		json_object_set_new(e, "failed", failed);
	} else {
		json_decref(done);
		json_decref(failed);
	}
	resp_json(r, http_status_of(first), e);
}

/* The engine verbs of POST /v1/engines/NAME/VERB. */
static const char *const verbs[] = { "release", "refill", "vram", "pin", "unpin", NULL };

static bool is_verb(const char *v)
{
	for (size_t i = 0; verbs[i]; i++)
		if (strcmp(v, verbs[i]) == 0)
			return true;
	return false;
}

static bool is_json(const char *ctype)
{
	size_t k = strlen("application/json");
	return ctype && strncasecmp(ctype, "application/json", k) == 0 && (!ctype[k] || ctype[k] == ';' ||
	    ctype[k] == ' ');
}

/* Other faces' lines after the broker's own (broker_http_metrics). */
static int append_face_metrics(struct broker_http *h, char **body, size_t *len)
{
	size_t nf = atomic_load_explicit(&h->n_fmetrics, memory_order_acquire);
	if (!nf)
		return 0;
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return BATON_ENOMEM;
	for (size_t i = 0; i < nf; i++)
		h->fmetrics[i].fn(h->fmetrics[i].arg, f);
	fclose(f);
	char *all = buf ? realloc(*body, *len + n + 1) : NULL;
	if (!all) {
		free(buf);
		return BATON_ENOMEM;
	}
	memcpy(all + *len, buf, n);
	all[*len + n] = 0;
	*body = all;
	*len += n;
	free(buf);
	return 0;
}

static void serve(struct broker_http *h, struct baton_http_req *req)
{
	const char *method = http_req_method(req);
	const char *path = http_req_path(req);
	const char *query = http_req_rawquery(req);
	struct resp r = { 0 };
	bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
	bool post = strcmp(method, "POST") == 0;

	bool is_get_path = strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0 ||
	    strcmp(path, "/metrics") == 0 || strcmp(path, "/v1/status") == 0 || strcmp(path, "/v1/events") == 0 ||
	    strcmp(path, "/v1/engines") == 0 || strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0;
	const char *eng = NULL, *verb = NULL;
	size_t eng_len = 0;
	if (strncmp(path, "/v1/engines/", 12) == 0) {
		eng = path + 12;
		const char *slash = strchr(eng, '/');
		eng_len = slash ? (size_t)(slash - eng) : strlen(eng);
		verb = slash ? slash + 1 : NULL;
		if (!verb)
			is_get_path = true;
		else if (!is_verb(verb)) {
			resp_error(&r, 404, BATON_ENOTFOUND,
			    "no such path (engines have release, refill, vram, pin, unpin)");
			send_resp(req, &r);
			return;
		}
	}
	bool lend = broker_http_lend_path(path); /* leases, external engines: lend_http.c */
	bool is_post_path = verb || lend || strcmp(path, "/v1/handoff") == 0 || strcmp(path, "/v1/release") == 0;
	if (!is_get_path && !is_post_path) {
		resp_error(&r, 404, BATON_ENOTFOUND, "no such path");
	} else if (is_get_path && !get) {
		r.allow = "GET, HEAD";
		resp_error(&r, 405, BATON_EUNSUPPORTED, "%s takes GET", path);
	} else if (is_post_path && !post) {
		r.allow = "POST";
		resp_error(&r, 405, BATON_EUNSUPPORTED, "%s takes POST", path);
	} else if (*query && strcmp(path, "/v1/events") != 0) {
		resp_error(&r, 400, BATON_EEXTRA, "%s takes no query parameters", path);
	} else if (strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0) {
		r.status = 200;
		r.ctype = "text/html; charset=utf-8";
		r.cbody = broker_dashboard_html;
		r.len = broker_dashboard_html_len;
	} else if (strcmp(path, "/healthz") == 0) {
		resp_json(&r, 200, json_pack("{s:b}", "ok", 1)); /* it answers: it lives */
	} else if (strcmp(path, "/readyz") == 0) {
		if (atomic_load(&h->ready))
			resp_json(&r, 200, json_pack("{s:b}", "ok", 1));
		else
			resp_error(&r, 503, BATON_ECLOSED, "the broker is starting or stopping");
	} else if (strcmp(path, "/metrics") == 0) {
		char msg[512];
		int err = broker_metrics_text(h->metrics, h->b, &r.body, &r.len, msg, sizeof msg);
		if (!err)
			err = append_face_metrics(h, &r.body, &r.len);
		if (err) {
			resp_error(&r, http_status_of(err), err, "%s", msg);
		} else {
			r.status = 200;
			r.ctype = "text/plain; version=0.0.4; charset=utf-8";
		}
	} else if (strcmp(path, "/v1/events") == 0) {
		do_events(h, query, &r);
	} else if (is_get_path) {
		char name[BROKER_NAME_MAX];
		struct status_ctx c = { .h = h, .list = strcmp(path, "/v1/engines") == 0 };
		if (eng) {
			if (!proto_name_valid(eng, eng_len)) {
				resp_error(&r, 404, BATON_ENOTFOUND, "no engine by that name (names: A-Z a-z 0-9 . _ -)");
				send_resp(req, &r);
				return;
			}
			memcpy(name, eng, eng_len);
			name[eng_len] = 0;
			c.only = name;
		}
		struct baton_msg m;
		proto_msg_init(&m, PROTO_OP_STATUS);
		broker_call(h->b, &m, on_status_reply, &c);
		if (c.err || !c.out) {
			json_decref(c.out);
			resp_error(&r, http_status_of(c.err ? c.err : BATON_ENOMEM), c.err ? c.err : BATON_ENOMEM, "%s",
			    c.err ? c.msg : "out of memory");
		} else {
			resp_json(&r, 200, c.out);
		}
	} else if (http_req_header(req, "Transfer-Encoding")) {
		r.close = true;
		resp_error(&r, 400, BATON_EMSG, "send the body with a Content-Length (chunked bodies are not read)");
	} else if (!h->has_token) {
		resp_error(&r, 403, BATON_EPERM, "%s: changes over HTTP are off until a token is set "
		    "([broker] http_token_file)", path);
	} else if (!is_json(http_req_header(req, "Content-Type"))) {
		/* every POST, a bodyless one too (the server asks it only with a body) */
		const char *ct = http_req_header(req, "Content-Type");
		resp_error(&r, 415, BATON_EUNSUPPORTED, "%s: send Content-Type: application/json (got '%.60s')", path,
		    ct ? ct : "none");
	} else if (lend) {
		size_t len;
		const char *data = http_req_body(req, &len);
		int status = 0, err = 0;
		char msg[512] = "";
		json_t *out = NULL;
		broker_http_lend(h->b, path, data, len, &status, &err, msg, sizeof msg, &out);
		if (out)
			resp_json(&r, status, out);
		else
			resp_error(&r, status, err, "%s", msg);
	} else {
		/* mutating calls: POST /v1/engines/NAME/VERB, /v1/handoff, /v1/release */
		static const char *const no_keys[] = { NULL };
		static const char *const vram_keys[] = { "reserve_mib", NULL };
		static const char *const ho_keys[] = { "from", "to", NULL };
		static const char *const every_keys[] = { "?all", "?gpu", NULL };
		json_t *body = NULL;
		char name[BROKER_NAME_MAX];
		struct baton_msg m;
		bool every = !verb && strcmp(path, "/v1/release") == 0;
		const char *const *keys = every ? every_keys : !verb ? ho_keys :
		    strcmp(verb, "vram") == 0 ? vram_keys : no_keys;
		struct cmd_ctx c = { .r = &r, .name = name };
		if (parse_body(req, &r, keys, &body) != 0)
			goto out;
		if (every) {
			do_release_every(h, body, &r);
			goto out;
		}
		if (verb) {
			if (!proto_name_valid(eng, eng_len)) {
				resp_error(&r, 404, BATON_ENOTFOUND, "no engine by that name (names: A-Z a-z 0-9 . _ -)");
				goto out;
			}
			memcpy(name, eng, eng_len);
			name[eng_len] = 0;
			bool pin = strcmp(verb, "pin") == 0, unpin = strcmp(verb, "unpin") == 0;
			enum proto_op op = strcmp(verb, "release") == 0 ? PROTO_OP_RELEASE :
			    strcmp(verb, "refill") == 0 ? PROTO_OP_REFILL : pin || unpin ? PROTO_OP_PIN : PROTO_OP_VRAM;
			proto_msg_init(&m, op);
			m.name = name;
			proto_set(&m, PF_NAME);
			if (op == PROTO_OP_PIN) {
				m.pinned = c.pinned = pin;
				proto_set(&m, PF_PINNED);
			}
			if (op == PROTO_OP_VRAM) {
				json_t *v = json_object_get(body, "reserve_mib");
				if (json_is_null(v)) {
					m.reserve_mib = PROTO_RESERVE_FULL;
				} else if (!json_is_integer(v)) {
					resp_error(&r, 400, BATON_ETYPE, "reserve_mib: want a whole number of MiB or null");
					goto out;
				} else if (json_integer_value(v) < 0 ||
				    (uint64_t)json_integer_value(v) > BROKER_RESERVE_MIB_MAX) {
					resp_error(&r, 400, BATON_ERANGE, "reserve_mib: want 0 to %" PRIu64 " MiB, or null",
					    (uint64_t)BROKER_RESERVE_MIB_MAX);
					goto out;
				} else {
					m.reserve_mib = (uint64_t)json_integer_value(v);
				}
			}
		} else {
			json_t *f = json_object_get(body, "from"), *t = json_object_get(body, "to");
			if (!json_is_string(f) || !json_is_string(t)) {
				resp_error(&r, 400, BATON_ETYPE, "from and to: want engine names (strings)");
				goto out;
			}
			const char *fs = json_string_value(f), *ts = json_string_value(t);
			if (!proto_name_valid(fs, json_string_length(f)) || !proto_name_valid(ts, json_string_length(t)) ||
			    strlen(fs) != json_string_length(f) || strlen(ts) != json_string_length(t)) {
				resp_error(&r, 404, BATON_ENOTFOUND, "no engine named '%s' or '%s' is registered", fs, ts);
				goto out;
			}
			proto_msg_init(&m, PROTO_OP_HANDOFF);
			m.from = fs;
			m.to = ts;
			snprintf(name, sizeof name, "%s", ts);
		}
		broker_call(h->b, &m, on_cmd_reply, &c);
	out:
		json_decref(body);
	}
	send_resp(req, &r);
}

/* ---- threads and the server's handler -------------------------------------------- */

static void *write_thread(void *arg)
{
	struct broker_http *h = arg;
	for (;;) {
		pthread_mutex_lock(&h->mu);
		while (!h->head && !h->stop)
			pthread_cond_wait(&h->cv, &h->mu);
		struct hjob *j = h->head;
		if (!j) {
			pthread_mutex_unlock(&h->mu);
			return NULL;
		}
		h->head = j->next;
		if (!h->head)
			h->tail = NULL;
		h->n--;
		pthread_mutex_unlock(&h->mu);
		serve(h, j->req); /* after stop, broker_call answers at once */
		free(j);
	}
}

/* ---- the route table ------------------------------------------------------------ */

/* The API's own paths: no face takes them. */
static bool api_path(const char *path)
{
	static const char *const own[] = { "/", "/index.html", "/metrics", "/v1/status", "/v1/events",
		"/v1/engines", "/v1/handoff", "/v1/release", "/healthz", "/readyz", "/v1/leases", "/v1/externals", NULL };
	for (size_t i = 0; own[i]; i++)
		if (strcmp(path, own[i]) == 0)
			return true;
	return strncmp(path, "/v1/engines/", 12) == 0 || broker_http_lend_path(path);
}

static const struct broker_http_route *route_of(struct broker_http *h, const char *path)
{
	if (api_path(path))
		return NULL;
	size_t n = atomic_load_explicit(&h->n_routes, memory_order_acquire);
	for (size_t i = 0; i < n; i++) {
		const struct broker_http_route *rt = &h->routes[i];
		if (rt->prefix ? strncmp(path, rt->path, strlen(rt->path)) == 0 : strcmp(path, rt->path) == 0)
			return rt;
	}
	return NULL;
}

/* Whether `method` is one of "GET, HEAD" (a comma or space separated list). */
static bool method_in(const char *methods, const char *method)
{
	size_t k = strlen(method);
	for (const char *p = methods; (p = strstr(p, method)) != NULL; p += k)
		if ((p == methods || p[-1] == ',' || p[-1] == ' ') && (p[k] == 0 || p[k] == ',' || p[k] == ' '))
			return true;
	return false;
}

int broker_http_route(struct broker_http *h, const struct broker_http_route *rt)
{
	if (!rt->path || rt->path[0] != '/' || !rt->fn || !rt->methods || api_path(rt->path) ||
	    route_of(h, rt->path))
		return BATON_EINVAL;
	size_t n = atomic_load(&h->n_routes);
	if (n == BROKER_HTTP_ROUTES_MAX)
		return BATON_ENOMEM;
	h->routes[n] = *rt;
	if (!h->routes[n].body_max)
		h->routes[n].body_max = BODY_MAX;
	atomic_store_explicit(&h->n_routes, n + 1, memory_order_release);
	return 0;
}

int broker_http_metrics(struct broker_http *h, void (*fn)(void *arg, FILE *f), void *arg)
{
	size_t n = atomic_load(&h->n_fmetrics);
	if (!fn)
		return BATON_EINVAL;
	if (n == BROKER_HTTP_ROUTES_MAX)
		return BATON_ENOMEM;
	h->fmetrics[n] = (struct face_metrics){ fn, arg };
	atomic_store_explicit(&h->n_fmetrics, n + 1, memory_order_release);
	return 0;
}

/* A route's body limit (the front door's chats are larger than the
 * broker's own calls), for the methods it takes. */
static size_t body_limit(void *arg, const char *method, const char *path)
{
	const struct broker_http_route *rt = route_of(arg, path);
	return rt && method_in(rt->methods, method) ? rt->body_max : BODY_MAX;
}

/* On one of the server's workers, the body read: reads are served here,
 * POSTs queued for the write threads. */
static void on_request(void *arg, struct baton_http_req *req)
{
	struct broker_http *h = arg;
	/* another face's route: it answers itself, now or later */
	const struct broker_http_route *rt = route_of(h, http_req_path(req));
	if (rt && method_in(rt->methods, http_req_method(req))) {
		rt->fn(rt->arg, req);
		return;
	}
	if (rt) {
		struct resp r = { .allow = rt->methods };
		resp_error(&r, 405, BATON_EUNSUPPORTED, "%s takes %s", http_req_path(req), rt->methods);
		send_resp(req, &r);
		return;
	}
	if (strcmp(http_req_method(req), "POST") != 0) {
		serve(h, req);
		return;
	}
	struct hjob *j = malloc(sizeof *j);
	if (!j) {
		http_reply_error(req, 500, BATON_ENOMEM, "out of memory");
		return;
	}
	j->next = NULL;
	j->req = req;
	pthread_mutex_lock(&h->mu);
	bool stopped = h->stop, full = h->n >= QUEUE_MAX;
	if (!stopped && !full) {
		if (h->tail)
			h->tail->next = j;
		else
			h->head = j;
		h->tail = j;
		h->n++;
		pthread_cond_signal(&h->cv);
	}
	pthread_mutex_unlock(&h->mu);
	if (stopped || full) {
		free(j);
		if (stopped)
			http_reply_error(req, 503, BATON_ECLOSED, "the broker is shutting down");
		else
			http_reply_error(req, 503, BATON_EBUSY, "%d requests are waiting already; try again", QUEUE_MAX);
	}
}

const char *broker_http_url(const struct broker_http *h)
{
	return http_url(h->srv);
}

void broker_http_ready(struct broker_http *h, bool ready)
{
	if (h)
		atomic_store(&h->ready, ready);
}

/* A list of names separated by commas or spaces (a [broker] key): copied
 * into buf (BROKER_URL_MAX bytes), its words in v, NULL after them. */
static int split_names(const char *list, const char *key, const char *what, char *buf, const char **v, size_t *n,
    char *err, size_t errlen)
{
	*n = 0;
	snprintf(buf, BROKER_URL_MAX, "%s", list);
	for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
		if (*n == HOSTS_MAX) {
			snprintf(err, errlen, "%s: at most %d %s", key, HOSTS_MAX, what);
			return -1;
		}
		v[(*n)++] = t;
	}
	v[*n] = NULL;
	return 0;
}

int broker_http_open(struct broker *b, const struct broker_config *cfg, struct broker_http **out,
    char *err, size_t errlen)
{
	*out = NULL;
	struct broker_http *h = calloc(1, sizeof *h);
	if (!h)
		return BATON_ENOMEM;
	h->b = b;
	h->has_token = cfg->http_token[0] != 0;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	h->ev = calloc(EVENTS_MAX, sizeof *h->ev);
	h->metrics = broker_metrics_new();
	int rc = BATON_ENOMEM;
	if (!h->ev || !h->metrics || broker_observe(b, http_event, h) != 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	h->observing = true;
	for (int i = 0; i < WRITE_THREADS; i++) {
		if (pthread_create(&h->th[i], NULL, write_thread, h) != 0) {
			snprintf(err, errlen, "cannot start threads");
			goto fail;
		}
		h->n_th++;
	}
	/* [broker] http_hosts and cors_origins: names separated by commas or
	 * spaces (the origins checked by http_open) */
	char names[BROKER_URL_MAX], origins[BROKER_URL_MAX];
	const char *hosts[HOSTS_MAX + 1], *cors[HOSTS_MAX + 1];
	size_t nh, nc;
	if (split_names(cfg->http_hosts, "http_hosts", "names", names, hosts, &nh, err, errlen) ||
	    split_names(cfg->cors_origins, "cors_origins", "origins", origins, cors, &nc, err, errlen)) {
		rc = BATON_EINVAL;
		goto fail;
	}
	struct baton_http_opts o = {
		.addr = cfg->http,
		.token = cfg->http_token,
		.hosts = hosts,
		.cors_origins = nc ? cors : NULL,
		.max_body = BODY_MAX,
		.workers = READ_WORKERS,
		.body_limit = body_limit,
	};
	if ((rc = http_open(&o, on_request, h, &h->srv, err, errlen)) != 0)
		goto fail;
	*out = h;
	return 0;
fail:
	broker_http_close(h);
	return rc;
}

void broker_http_close(struct broker_http *h)
{
	if (!h)
		return;
	/* No events from here on; new POSTs get 503; queued ones are served
	 * (broker_call answers soon once the broker stops); then the server
	 * closes, answering what is still open 503. */
	atomic_store(&h->ready, false);
	if (h->observing)
		broker_unobserve(h->b, http_event, h);
	pthread_mutex_lock(&h->mu);
	h->stop = true;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	for (int i = 0; i < h->n_th; i++)
		pthread_join(h->th[i], NULL);
	http_close(h->srv); /* no route is called after this */
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	free(h->ev);
	broker_metrics_free(h->metrics);
	free(h);
}
