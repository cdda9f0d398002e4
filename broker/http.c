/*
 * http.c: the broker's HTTP face (see broker.h and the README's
 * "HTTP API, metrics and dashboard"): the JSON API under /v1, Prometheus
 * metrics on /metrics, and the dashboard page on /.
 *
 * nng's HTTP server calls one handler (every path and method, so that odd
 * ones get our JSON errors) on an nng thread. That thread must never wait
 * for the decision thread: commands to engines travel on nng too, and a
 * pool of nng threads all blocked behind a handoff would stall the very
 * replies the handoff waits for. So the handler only queues the request;
 * threads of our own take it, run it through broker_call()
 * (the same path as the control socket: same checks, same errors, same
 * events) and finish the aio.
 *
 * It sits on the core's public door only: requests go in through
 * broker_call(), events come out through the subscription it takes
 * (broker_observe): http_event() keeps the last EVENTS_MAX in a ring (for
 * /v1/events?since=N) and counts what /metrics reports as counters and
 * histograms. Gauges come from a status request made per scrape.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "broker/broker.h"
#include "broker/dashboard.h"
#include "broker/http_int.h"

/* Two queues, so that reads (the page, /metrics) never wait behind
 * mutating calls, each of which may wait for memory for seconds. */
#define READ_THREADS 2
#define WRITE_THREADS 4
#define HTTP_THREADS (READ_THREADS + WRITE_THREADS)
#define QUEUE_MAX 256              /* waiting requests per queue; more: 503 */
#define BODY_MAX (64u * 1024u)      /* a JSON body above this: 413 */
#define NNG_BODY_MAX (1024u * 1024u) /* nng refuses (400) before reading above this */
#define URI_MAX 2048
#define EVENTS_MAX 1024

struct evrec {
	uint64_t seq, time_ms, bytes;
	double ms;
	bool has_ms;
	char kind[32], state[32];
	char engine[BROKER_NAME_MAX], gpu[BROKER_NAME_MAX];
	char reason[512];
};

struct hjob {
	struct hjob *next;
	nng_aio *aio;
};

struct broker_http {
	struct broker *b;
	nng_http_server *srv;
	char url[BROKER_URL_MAX + 16];
	pthread_t th[HTTP_THREADS];
	int n_th;
	bool observing;       /* subscribed to the broker's events */
	struct broker_metrics *metrics; /* counters from events, the /metrics text (metrics.c) */

	pthread_mutex_t mu;   /* everything below */
	pthread_cond_t cv;
	struct broker_http_guard guard; /* set once listening (the port known) */
	struct queue {
		struct hjob *head, *tail;
		size_t n;
		pthread_cond_t cv;
	} q[2];                /* 0: reads, 1: POSTs */
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

/* An error body: {"ok": false, "code": "busy", "err": 6, "message": "..."}.
 * code and err are those of proto/err.h, as on the control socket. */
static void resp_error(struct resp *r, int status, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void resp_error(struct resp *r, int status, int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	for (char *q = msg; *q; q++) /* a path echoed back may be any bytes: ASCII only */
		if ((unsigned char)*q >= 0x80 || (unsigned char)*q < 0x20)
			*q = '?';
	resp_json(r, status, json_pack("{s:b, s:s, s:i, s:s}", "ok", 0, "code", baton_errname(err), "err",
	    err, "message", msg));
}

/* The HTTP status for a broker error. A pinned engine (permission) is 403:
 * 401 means the token, and the token was right. */
static int status_of(int err)
{
	switch (err) {
	case BATON_EBUSY:
	case BATON_ESTATE:
	case BATON_EEXIST:
		return 409;
	case BATON_ENOTFOUND:
		return 404;
	case BATON_EINVAL:
	case BATON_EUNSUPPORTED:
	case BATON_ETYPE:
	case BATON_ERANGE:
	case BATON_EMISSING:
	case BATON_EEXTRA:
	case BATON_EMSG:
	case BATON_EDUP:
	case BATON_EUNKNOWNOP:
		return 400;
	case BATON_EPERM:
		return 403;
	case BATON_ETOOBIG:
		return 413;
	case BATON_ETIMEDOUT:
		return 504;
	case BATON_ECLOSED:
	case BATON_EDEVMEM:
		return 503;
	default:
		return 500;
	}
}

static void send_resp(nng_aio *aio, struct resp *r)
{
	nng_http_res *res;
	if (nng_http_res_alloc(&res) != 0) {
		free(r->body);
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	nng_http_res_set_status(res, (uint16_t)r->status);
	/* nng 1.5.2 knows no phrase for these: it would send none */
	if (r->status == 413)
		nng_http_res_set_reason(res, "Payload Too Large");
	else if (r->status == 415)
		nng_http_res_set_reason(res, "Unsupported Media Type");
	nng_http_res_set_header(res, "Content-Type", r->ctype);
	nng_http_res_set_header(res, "Cache-Control", "no-store");
	nng_http_res_set_header(res, "X-Content-Type-Options", "nosniff");
	if (r->allow)
		nng_http_res_set_header(res, "Allow", r->allow);
	if (r->status == 401)
		nng_http_res_set_header(res, "WWW-Authenticate", "Bearer realm=\"baton\"");
	if (r->status == 413 || (r->status == 400 && r->close))
		nng_http_res_set_header(res, "Connection", "close");
	int rc = nng_http_res_copy_data(res, r->body ? r->body : r->cbody, r->len);
	free(r->body);
	r->body = NULL;
	if (rc) {
		nng_http_res_free(res);
		nng_aio_finish(aio, rc);
		return;
	}
	nng_aio_set_output(aio, 0, res);
	nng_aio_finish(aio, 0);
}

/* ---- status as JSON -------------------------------------------------------------- */

struct status_ctx {
	struct broker_http *h;
	const char *only;     /* one engine's object, or NULL: everything */
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
};

static void on_cmd_reply(void *arg, const struct baton_msg *rep)
{
	struct cmd_ctx *c = arg;
	if (!rep->ok) {
		resp_error(c->r, status_of(rep->err), rep->err, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
		return;
	}
	json_t *j;
	if (rep->op == PROTO_OP_HANDOFF) {
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
static int parse_body(nng_http_req *req, struct resp *r, const char *const *keys, json_t **out)
{
	void *data;
	size_t len;
	*out = NULL;
	nng_http_req_get_data(req, &data, &len);
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

/* Token, Host, Origin, Content-Type of a mutating call (http_guard.c). */
static int guard_check(struct broker_http *h, nng_http_req *req, char *msg, size_t n)
{
	pthread_mutex_lock(&h->mu);
	int st = broker_http_guard_check(&h->guard, nng_http_req_get_header(req, "Host"),
	    nng_http_req_get_header(req, "Origin"), nng_http_req_get_header(req, "Content-Type"),
	    nng_http_req_get_header(req, "Authorization"), msg, n);
	pthread_mutex_unlock(&h->mu);
	return st;
}

static void do_events(struct broker_http *h, const char *query, struct resp *r)
{
	uint64_t since = 0;
	if (query && *query) {
		if (strncmp(query, "since=", 6) != 0 || strchr(query, '&')) {
			resp_error(r, 400, BATON_EEXTRA, "the only query parameter is since=N");
			return;
		}
		const char *v = query + 6;
		size_t n = strlen(v);
		bool ok = n > 0 && n <= 19;
		for (size_t i = 0; ok && i < n; i++)
			ok = v[i] >= '0' && v[i] <= '9';
		if (!ok) {
			resp_error(r, 400, BATON_ETYPE, "since: want a whole number (the last seq seen)");
			return;
		}
		since = strtoull(v, NULL, 10);
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

static void serve(struct broker_http *h, nng_aio *aio)
{
	nng_http_req *req = nng_aio_get_input(aio, 0);
	const char *method = nng_http_req_get_method(req);
	const char *uri = nng_http_req_get_uri(req);
	struct resp r = { 0 };
	char path[URI_MAX];
	if (strlen(uri) >= sizeof path) {
		resp_error(&r, 404, BATON_ENOTFOUND, "no such path");
		send_resp(aio, &r);
		return;
	}
	snprintf(path, sizeof path, "%s", uri);
	char *query = strchr(path, '?');
	if (query)
		*query++ = 0;
	bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
	bool post = strcmp(method, "POST") == 0;
	char gmsg[512];
	int gst;

	/* reads */
	bool is_get_path = strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0 ||
	    strcmp(path, "/metrics") == 0 || strcmp(path, "/v1/status") == 0 || strcmp(path, "/v1/events") == 0;
	const char *eng = NULL, *verb = NULL;
	size_t eng_len = 0;
	if (strncmp(path, "/v1/engines/", 12) == 0) {
		eng = path + 12;
		const char *slash = strchr(eng, '/');
		eng_len = slash ? (size_t)(slash - eng) : strlen(eng);
		verb = slash ? slash + 1 : NULL;
		if (!verb)
			is_get_path = true;
		else if (strcmp(verb, "release") != 0 && strcmp(verb, "refill") != 0 && strcmp(verb, "vram") != 0) {
			resp_error(&r, 404, BATON_ENOTFOUND, "no such path (engines have release, refill, vram)");
			send_resp(aio, &r);
			return;
		}
	}
	bool is_post_path = verb || strcmp(path, "/v1/handoff") == 0;
	if (!is_get_path && !is_post_path) {
		resp_error(&r, 404, BATON_ENOTFOUND, "no such path");
	} else if (is_get_path && !get) {
		r.allow = "GET, HEAD";
		resp_error(&r, 405, BATON_EUNSUPPORTED, "%s takes GET", path);
	} else if (is_post_path && !post) {
		r.allow = "POST";
		resp_error(&r, 405, BATON_EUNSUPPORTED, "%s takes POST", path);
	} else if (query && *query && strcmp(path, "/v1/events") != 0) {
		resp_error(&r, 400, BATON_EEXTRA, "%s takes no query parameters", path);
	} else if (strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0) {
		r.status = 200;
		r.ctype = "text/html; charset=utf-8";
		r.cbody = broker_dashboard_html;
		r.len = broker_dashboard_html_len;
	} else if (strcmp(path, "/metrics") == 0) {
		char msg[512];
		int err = broker_metrics_text(h->metrics, h->b, &r.body, &r.len, msg, sizeof msg);
		if (err) {
			resp_error(&r, status_of(err), err, "%s", msg);
		} else {
			r.status = 200;
			r.ctype = "text/plain; version=0.0.4; charset=utf-8";
		}
	} else if (strcmp(path, "/v1/events") == 0) {
		do_events(h, query, &r);
	} else if (is_get_path) {
		char name[BROKER_NAME_MAX];
		struct status_ctx c = { .h = h };
		if (eng) {
			if (!proto_name_valid(eng, eng_len)) {
				resp_error(&r, 404, BATON_ENOTFOUND, "no engine by that name (names: A-Z a-z 0-9 . _ -)");
				send_resp(aio, &r);
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
			resp_error(&r, status_of(c.err ? c.err : BATON_ENOMEM), c.err ? c.err : BATON_ENOMEM, "%s",
			    c.err ? c.msg : "out of memory");
		} else {
			resp_json(&r, 200, c.out);
		}
	} else if (nng_http_req_get_header(req, "Transfer-Encoding")) {
		r.close = true;
		resp_error(&r, 400, BATON_EMSG, "send the body with a Content-Length (chunked bodies are not read)");
	} else if ((gst = guard_check(h, req, gmsg, sizeof gmsg)) != 0) {
		resp_error(&r, gst, gst == 415 ? BATON_EUNSUPPORTED : BATON_EPERM, "%s: %s", path, gmsg);
	} else {
		/* mutating calls: POST /v1/engines/NAME/{release,refill,vram}, /v1/handoff */
		static const char *const no_keys[] = { NULL };
		static const char *const vram_keys[] = { "reserve_mib", NULL };
		static const char *const ho_keys[] = { "from", "to", NULL };
		json_t *body = NULL;
		char name[BROKER_NAME_MAX];
		struct baton_msg m;
		const char *const *keys = !verb ? ho_keys : strcmp(verb, "vram") == 0 ? vram_keys : no_keys;
		if (parse_body(req, &r, keys, &body) != 0)
			goto out;
		if (verb) {
			if (!proto_name_valid(eng, eng_len)) {
				resp_error(&r, 404, BATON_ENOTFOUND, "no engine by that name (names: A-Z a-z 0-9 . _ -)");
				goto out;
			}
			memcpy(name, eng, eng_len);
			name[eng_len] = 0;
			enum proto_op op = strcmp(verb, "release") == 0 ? PROTO_OP_RELEASE :
			    strcmp(verb, "refill") == 0 ? PROTO_OP_REFILL : PROTO_OP_VRAM;
			proto_msg_init(&m, op);
			m.name = name;
			proto_set(&m, PF_NAME);
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
		struct cmd_ctx c = { .r = &r, .name = name };
		broker_call(h->b, &m, on_cmd_reply, &c);
	out:
		json_decref(body);
	}
	send_resp(aio, &r);
}

/* ---- threads and the nng handler ------------------------------------------------- */

struct thread_arg {
	struct broker_http *h;
	struct queue *q;
};

static void *http_thread(void *arg)
{
	struct broker_http *h = ((struct thread_arg *)arg)->h;
	struct queue *q = ((struct thread_arg *)arg)->q;
	free(arg);
	for (;;) {
		pthread_mutex_lock(&h->mu);
		while (!q->head && !h->stop)
			pthread_cond_wait(&q->cv, &h->mu);
		struct hjob *j = q->head;
		if (!j) {
			pthread_mutex_unlock(&h->mu);
			return NULL;
		}
		q->head = j->next;
		if (!q->head)
			q->tail = NULL;
		q->n--;
		pthread_mutex_unlock(&h->mu);
		serve(h, j->aio); /* after stop, broker_call answers at once */
		free(j);
	}
}

/* On an nng thread: queue it and return. */
static void on_request(nng_aio *aio)
{
	struct broker_http *h = nng_http_handler_get_data(nng_aio_get_input(aio, 1));
	nng_http_req *req = nng_aio_get_input(aio, 0);
	struct queue *q = &h->q[strcmp(nng_http_req_get_method(req), "POST") == 0];
	struct hjob *j = malloc(sizeof *j);
	if (!j) {
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	j->next = NULL;
	j->aio = aio;
	pthread_mutex_lock(&h->mu);
	bool stopped = h->stop, full = q->n >= QUEUE_MAX;
	if (!stopped && !full) {
		if (q->tail)
			q->tail->next = j;
		else
			q->head = j;
		q->tail = j;
		q->n++;
		pthread_cond_signal(&q->cv);
	}
	pthread_mutex_unlock(&h->mu);
	if (stopped || full) {
		free(j);
		struct resp r = { 0 };
		if (stopped)
			resp_error(&r, 503, BATON_ECLOSED, "the broker is shutting down");
		else
			resp_error(&r, 503, BATON_EBUSY, "%d requests are waiting already; try again", QUEUE_MAX);
		send_resp(aio, &r);
	}
}

const char *broker_http_url(const struct broker_http *h)
{
	return h->url;
}

int broker_http_open(struct broker *b, const struct broker_config *cfg, struct broker_http **out,
    char *err, size_t errlen)
{
	*out = NULL;
	struct broker_http *h = calloc(1, sizeof *h);
	if (!h)
		return BATON_ENOMEM;
	h->b = b;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->q[0].cv, NULL);
	pthread_cond_init(&h->q[1].cv, NULL);
	h->ev = calloc(EVENTS_MAX, sizeof *h->ev);
	h->metrics = broker_metrics_new();
	int rc = BATON_ENOMEM;
	nng_url *u = NULL;
	nng_http_handler *hd = NULL;
	char url[BROKER_URL_MAX + 16];
	snprintf(url, sizeof url, "http://%s", cfg->http);
	if (!h->ev || !h->metrics || broker_observe(b, http_event, h) != 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	h->observing = true;
	int nrc;
	if ((nrc = nng_url_parse(&u, url)) != 0 || (nrc = nng_http_server_hold(&h->srv, u)) != 0) {
		snprintf(err, errlen, "http %s: %s", cfg->http, nng_strerror(nrc));
		rc = BATON_EINVAL;
		goto fail;
	}
	if ((nrc = nng_http_handler_alloc(&hd, "/", on_request)) != 0 ||
	    (nrc = nng_http_handler_set_method(hd, NULL)) != 0 || (nrc = nng_http_handler_set_tree(hd)) != 0 ||
	    (nrc = nng_http_handler_collect_body(hd, true, NNG_BODY_MAX)) != 0 ||
	    (nrc = nng_http_handler_set_data(hd, h, NULL)) != 0 ||
	    (nrc = nng_http_server_add_handler(h->srv, hd)) != 0) {
		snprintf(err, errlen, "http %s: %s", cfg->http, nng_strerror(nrc));
		if (hd)
			nng_http_handler_free(hd);
		goto fail;
	}
	for (int i = 0; i < HTTP_THREADS; i++) {
		struct thread_arg *ta = malloc(sizeof *ta);
		if (ta) {
			ta->h = h;
			ta->q = &h->q[i >= READ_THREADS];
		}
		if (!ta || pthread_create(&h->th[i], NULL, http_thread, ta) != 0) {
			free(ta);
			snprintf(err, errlen, "cannot start threads");
			goto fail;
		}
		h->n_th++;
	}
	if ((nrc = nng_http_server_start(h->srv)) != 0) {
		snprintf(err, errlen, "cannot listen on http://%s: %s", cfg->http, nng_strerror(nrc));
		rc = BATON_EIO;
		goto fail;
	}
	nng_sockaddr sa;
	unsigned port = 0;
	if (nng_http_server_get_addr(h->srv, &sa) == 0)
		port = sa.s_family == NNG_AF_INET6 ? ntohs(sa.s_in6.sa_port) : ntohs(sa.s_in.sa_port);
	bool v6 = strchr(u->u_hostname, ':') != NULL;
	snprintf(h->url, sizeof h->url, "http://%s%s%s:%u", v6 ? "[" : "", u->u_hostname, v6 ? "]" : "", port);
	pthread_mutex_lock(&h->mu);
	broker_http_guard_init(&h->guard, u->u_hostname, port, cfg->http_hosts, cfg->http_token);
	pthread_mutex_unlock(&h->mu);
	nng_url_free(u);
	*out = h;
	return 0;
fail:
	if (u)
		nng_url_free(u);
	broker_http_close(h);
	return rc;
}

void broker_http_close(struct broker_http *h)
{
	if (!h)
		return;
	/* No events from here on; new requests get 503 from on_request;
	 * queued ones are served (broker_call answers soon once the broker
	 * stops); then the server stops, which waits for nothing of ours. */
	if (h->observing)
		broker_unobserve(h->b, http_event, h);
	pthread_mutex_lock(&h->mu);
	h->stop = true;
	pthread_cond_broadcast(&h->q[0].cv);
	pthread_cond_broadcast(&h->q[1].cv);
	pthread_mutex_unlock(&h->mu);
	for (int i = 0; i < h->n_th; i++)
		pthread_join(h->th[i], NULL);
	if (h->srv) {
		nng_http_server_stop(h->srv);
		nng_http_server_release(h->srv);
	}
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->q[0].cv);
	pthread_cond_destroy(&h->q[1].cv);
	free(h->ev);
	broker_metrics_free(h->metrics);
	free(h);
}
