/*
 * server.c: the HTTP server's daemon (http.h) on libmicrohttpd's internal
 * epoll thread: open and close, a request's life and body bounds, the
 * workers and the reaper. Admission is admit.c's, replies reply.c's,
 * streams stream.c's.
 *
 * A request's life: the URI callback makes its record; the first access
 * call (headers only) runs the guard, which may answer at once, before a
 * body byte is read; the body is gathered up to max_body; then the
 * connection is suspended and the request queued for the worker threads.
 * An answer, from any thread, is parked in the record and the connection
 * resumed: libmicrohttpd calls the access handler again on its own
 * thread, which queues the response (it takes responses from its own
 * thread only). A stream's reader suspends the connection when its buffer
 * is empty; a write resumes it.
 *
 * What libmicrohttpd does not do, a reaper thread does every 50 ms: close
 * a connection whose request has not fully arrived within
 * header_timeout_s (its idle timeout restarts on every byte, so a slow
 * client would stay forever), and notice a client that hung up while its
 * connection is suspended (libmicrohttpd does not watch those sockets),
 * so that a producer can stop at once.
 *
 * Lifetimes: a request is held by libmicrohttpd (until its completion
 * callback), by the application (from the handler's call until its answer
 * or stream close) and by a stream's response (until libmicrohttpd frees
 * it); the server itself lives until http_close and its last request.
 */

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "http/http_int.h"

#define DEF_MAX_CONNS 4096
#define SPARE_CONNS 64   /* past max_conns, accepted to evict an idle one for each */
#define DEF_IDLE_S 30
#define DEF_HEADER_S 10
#define DEF_MAX_BODY HTTP_OPENAI_BODY_MAX
#define DEF_BODY_TOTAL (64u * 1024u * 1024u)
#define DEF_WORKERS 8
#define MAX_WORKERS 256
#define REAP_MS 50

/* ---- lifetimes (under h->mu) --------------------------------------------------- */

static void server_free(struct baton_http *h)
{
	for (unsigned i = 0; i < HTTP_ADDR_BUCKETS; i++)
		while (h->addrs[i]) {
			struct addr_rec *a = h->addrs[i];
			h->addrs[i] = a->next;
			free(a);
		}
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	pthread_cond_destroy(&h->reap_cv);
	pthread_cond_destroy(&h->sent_cv);
	free(h->th);
	free(h);
}

static void kv_free(struct kv *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].k);
		free(v[i].v);
	}
	free(v);
}

/* Drops one reference; returns true when the server itself should be
 * freed by the caller (after unlocking). */
static bool req_unref(struct baton_http_req *r)
{
	if (--r->refs > 0)
		return false;
	struct baton_http *h = r->h;
	if (r->prev)
		r->prev->next = r->next;
	else if (h->open == r)
		h->open = r->next;
	if (r->next)
		r->next->prev = r->prev;
	if (r->resp)
		MHD_destroy_response(r->resp);
	if (r->stream) {
		free(r->stream->buf);
		free(r->stream);
	}
	free(r->target);
	free(r->path);
	free(r->query);
	kv_free(r->hdr, r->n_hdr);
	kv_free(r->arg, r->n_arg);
	free(r->body);
	h->body_held -= r->held;
	free(r);
	return --h->refs == 0;
}

void hs_unref_unlock(struct baton_http_req *r)
{
	struct baton_http *h = r->h;
	bool last = req_unref(r);
	pthread_mutex_unlock(&h->mu);
	if (last)
		server_free(h);
}

/* Takes the on-gone callback out if it is due (called outside the lock). */
static void take_gone(struct baton_http_req *r, struct gone_cb *cb)
{
	r->gone = true;
	if (r->stream)
		r->stream->gone = true;
	cb->fn = NULL;
	if (!r->gone_fired && r->gone_cb.fn) {
		r->gone_fired = true;
		*cb = r->gone_cb;
	}
}

/* ---- request accessors ----------------------------------------------------------- */

const char *http_req_method(const struct baton_http_req *r)
{
	return r->method;
}

const char *http_req_path(const struct baton_http_req *r)
{
	return r->path;
}

const char *http_req_rawquery(const struct baton_http_req *r)
{
	return r->query ? r->query : "";
}

const char *http_req_query(const struct baton_http_req *r, const char *key)
{
	for (size_t i = 0; i < r->n_arg; i++)
		if (strcmp(r->arg[i].k, key) == 0)
			return r->arg[i].v;
	return NULL;
}

const char *http_req_header(const struct baton_http_req *r, const char *name)
{
	for (size_t i = 0; i < r->n_hdr; i++)
		if (strcasecmp(r->hdr[i].k, name) == 0)
			return r->hdr[i].v;
	return NULL;
}

const char *http_req_body(const struct baton_http_req *r, size_t *len)
{
	if (len)
		*len = r->len;
	return r->body ? r->body : "";
}

int http_req_authorized(const struct baton_http_req *r)
{
	return r->authorized;
}

/* ---- libmicrohttpd callbacks ----------------------------------------------------- */

struct kv_list {
	struct kv *v;
	size_t n, cap;
	bool fail;
};

static enum MHD_Result collect(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	(void)kind;
	struct kv_list *l = cls;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct kv *v = realloc(l->v, cap * sizeof *v);
		if (!v) {
			l->fail = true;
			return MHD_NO;
		}
		l->v = v;
		l->cap = cap;
	}
	char *k = strdup(key), *val = strdup(value ? value : "");
	if (!k || !val) {
		free(k);
		free(val);
		l->fail = true;
		return MHD_NO;
	}
	l->v[l->n].k = k;
	l->v[l->n++].v = val;
	return MHD_YES;
}

/* The request's record, made when its first line is in. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
	struct baton_http *h = cls;
	struct baton_http_req *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	r->h = h;
	r->target = strdup(uri ? uri : "");
	const char *q = r->target ? strchr(r->target, '?') : NULL;
	r->path = r->target ? strndup(r->target, q ? (size_t)(q - r->target) : strlen(r->target)) : NULL;
	r->query = q ? strdup(q + 1) : NULL;
	if (!r->target || !r->path || (q && !r->query)) {
		free(r->target);
		free(r->path);
		free(r->query);
		free(r);
		return NULL;
	}
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	r->c = ci ? ci->socket_context : NULL;
	r->fd = fi ? fi->connect_fd : -1;
	r->conn = c;
	r->refs = 1; /* libmicrohttpd's, until on_completed */
	pthread_mutex_lock(&h->mu);
	h->refs++;
	r->next = h->open;
	if (h->open)
		h->open->prev = r;
	h->open = r;
	pthread_mutex_unlock(&h->mu);
	return r;
}

/* Answers at once, on libmicrohttpd's thread (under h->mu). */
static enum MHD_Result answer_now(struct baton_http_req *r, struct MHD_Connection *c, int status, int err,
    const char *msg)
{
	struct MHD_Response *resp = hs_error_resp_for(r->path, status, err, msg);
	if (!resp)
		return MHD_NO;
	hs_cors_headers(r, resp);
	enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, resp);
	MHD_destroy_response(resp);
	r->answered = true;
	r->st = RQ_SENT;
	return ok;
}

/* How many Content-Length and Host headers a request has (libmicrohttpd's
 * lookups give the first only). */
struct header_count {
	unsigned clen, host;
};

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	(void)kind;
	(void)value;
	struct header_count *hc = cls;
	if (strcasecmp(key, "Content-Length") == 0)
		hc->clen++;
	else if (strcasecmp(key, "Host") == 0)
		hc->host++;
	return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
    const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	(void)url;
	(void)version;
	struct baton_http *h = cls;
	struct baton_http_req *r = *con_cls;
	if (!r)
		return MHD_NO; /* out of memory when it began */
	enum MHD_Result ret = MHD_YES;
	struct MHD_Response *drop = NULL; /* an answer parked by hs_park, to queue */
	unsigned status = 0;
	bool queue = false;
	pthread_mutex_lock(&h->mu);
	switch (r->st) {
	case RQ_NEW: {
		snprintf(r->method, sizeof r->method, "%s", method);
		if (h->stopping) {
			ret = answer_now(r, c, 503, BATON_ECLOSED, "the server is shutting down");
			break;
		}
		r->max_body = h->body_limit ? h->body_limit(h->arg, method, r->path) : 0;
		if (!r->max_body)
			r->max_body = h->max_body;
		struct header_count hc = { 0, 0 };
		MHD_get_connection_values(c, MHD_HEADER_KIND, count_framing, &hc);
		struct http_guard_in in = {
			.max_body = r->max_body,
			.n_clen = hc.clen,
			.n_host = hc.host,
			.method = method,
			.host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host"),
			.origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
			.ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
			.auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"),
			.api_key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"),
			.clen = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length"),
			.te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding"),
		};
		if (http_guard_cors(&h->guard, in.origin))
			snprintf(r->cors, sizeof r->cors, "%s", in.origin);
		/* a CORS preflight from an allowed origin: answered here (browsers
		 * send it without the token); from any other origin it falls to
		 * the checks below and is refused */
		if (r->cors[0] && strcmp(method, "OPTIONS") == 0 &&
		    MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Method") &&
		    http_guard_host(&h->guard, in.host)) {
			struct MHD_Response *pre = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
			if (!pre) {
				ret = MHD_NO;
				break;
			}
			hs_cors_headers(r, pre);
			MHD_add_response_header(pre, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
			/* the headers the page asks for (SDKs send their own x-*
			 * ones), when they are plain header names */
			const char *ask = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
			bool plain = ask && strlen(ask) < 1024 && strspn(ask, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			    "0123456789-_, ") == strlen(ask);
			MHD_add_response_header(pre, "Access-Control-Allow-Headers", plain ? ask :
			    "Authorization, Content-Type, x-api-key, anthropic-version");
			MHD_add_response_header(pre, "Access-Control-Max-Age", "600");
			ret = MHD_queue_response(c, 204, pre);
			MHD_destroy_response(pre);
			r->answered = true;
			r->st = RQ_SENT;
			break;
		}
		char msg[768];
		int err;
		int st = http_guard_check(&h->guard, &in, &r->authorized, &err, msg, sizeof msg);
		if (st) {
			h->refused++;
			ret = answer_now(r, c, st, err, msg);
			break;
		}
		/* The bodies every connection holds are bounded together, not
		 * only each (issue 28: 800 connections x 1 MiB raised an engine
		 * from 45 to 637 MiB without a token): a declared body is
		 * charged now, and past the bound refused before it is read. */
		size_t want = in.clen ? (size_t)strtoull(in.clen, NULL, 10) : 0;
		if (want > h->max_body_total - h->body_held) {
			h->refused++;
			snprintf(msg, sizeof msg, "the server holds %zu KiB of request bodies, its bound: try again",
			    h->body_held >> 10);
			ret = answer_now(r, c, 503, BATON_EBUSY, msg);
			break;
		}
		r->held = want;
		h->body_held += want;
		if (r->authorized && h->guard.token[0] && r->c)
			hs_conn_authed(h, r->c);
		r->st = RQ_BODY;
		break;
	}
	case RQ_BODY:
		if (*upload_size) {
			size_t n = *upload_size;
			h->body_bytes += n;
			*upload_size = 0;
			if (r->too_big || r->len + n > r->max_body ||
			    (r->len + n > r->held && r->len + n - r->held > h->max_body_total - h->body_held)) {
				r->too_big = true;
				/* libmicrohttpd takes no answer mid-body: end the connection */
				h->refused++;
				ret = MHD_NO;
				break;
			}
			if (r->len + n > r->held) { /* chunked, or more than declared */
				h->body_held += r->len + n - r->held;
				r->held = r->len + n;
			}
			if (r->len + n + 1 > r->cap) {
				size_t cap = r->cap ? r->cap : 1024;
				while (cap < r->len + n + 1)
					cap *= 2;
				char *b = realloc(r->body, cap);
				if (!b) {
					ret = MHD_NO;
					break;
				}
				r->body = b;
				r->cap = cap;
			}
			memcpy(r->body + r->len, upload, n);
			r->len += n;
			r->body[r->len] = 0;
			break;
		}
		/* the whole request is in */
		if (r->c)
			r->c->deadline = 0;
		struct kv_list hl = { 0 }, al = { 0 };
		MHD_get_connection_values(c, MHD_HEADER_KIND, collect, &hl);
		MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect, &al);
		r->hdr = hl.v;
		r->n_hdr = hl.n;
		r->arg = al.v;
		r->n_arg = al.n;
		if (hl.fail || al.fail) {
			ret = answer_now(r, c, 500, BATON_ENOMEM, "out of memory");
			break;
		}
		if (h->stopping) {
			ret = answer_now(r, c, 503, BATON_ECLOSED, "the server is shutting down");
			break;
		}
		r->st = RQ_QUEUED;
		r->refs++; /* the application's */
		MHD_suspend_connection(c);
		if (h->qtail)
			h->qtail->qnext = r;
		else
			h->qhead = r;
		h->qtail = r;
		pthread_cond_signal(&h->cv);
		break;
	case RQ_QUEUED:
	case RQ_HANDLING:
		MHD_suspend_connection(c); /* resumed without an answer: wait on */
		break;
	case RQ_ANSWER:
		/* queued and dropped after the unlock: queueing takes the
		 * response's lock, which libmicrohttpd holds while it calls a
		 * stream's reader (stream_read takes h->mu: ThreadSanitizer saw
		 * the two orders), and a stream's free callback takes h->mu */
		drop = r->resp;
		r->resp = NULL;
		r->st = RQ_SENT;
		status = r->status;
		queue = true;
		pthread_cond_broadcast(&h->sent_cv);
		break;
	case RQ_SENT:
		break;
	}
	pthread_mutex_unlock(&h->mu);
	if (queue) /* r stays: libmicrohttpd's reference goes in on_completed, on this thread */
		ret = MHD_queue_response(c, status, drop);
	if (drop)
		MHD_destroy_response(drop);
	return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	(void)c;
	struct baton_http *h = cls;
	struct baton_http_req *r = *con_cls;
	if (!r)
		return;
	*con_cls = NULL;
	struct gone_cb cb = { 0 };
	pthread_mutex_lock(&h->mu);
	r->mhd_done = true;
	r->conn = NULL;
	if (r->c)
		r->c->deadline = baton_now_s() + h->header_timeout_s; /* for the next request */
	bool ended = r->st == RQ_SENT && (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK || !r->stream);
	if (!ended || (r->stream && !r->stream->closed))
		take_gone(r, &cb);
	/* an answer parked but never queued: dropped after the unlock (a
	 * stream's response holds a reference of r, which keeps r until then) */
	struct MHD_Response *drop = r->resp;
	r->resp = NULL;
	pthread_cond_broadcast(&h->sent_cv);
	hs_unref_unlock(r);
	if (drop)
		MHD_destroy_response(drop);
	if (cb.fn)
		cb.fn(cb.owner, cb.id);
}

/* ---- threads --------------------------------------------------------------------- */

static void *worker(void *arg)
{
	struct baton_http *h = arg;
	pthread_mutex_lock(&h->mu);
	for (;;) {
		while (!h->qhead && !h->stopping)
			pthread_cond_wait(&h->cv, &h->mu);
		struct baton_http_req *r = h->qhead;
		if (!r)
			break;
		h->qhead = r->qnext;
		if (!h->qhead)
			h->qtail = NULL;
		r->qnext = NULL;
		if (h->stopping || r->st != RQ_QUEUED) {
			/* http_close answered it: drop the application's reference */
			bool last = req_unref(r);
			(void)last; /* h holds its own reference until http_close ends */
			continue;
		}
		r->st = RQ_HANDLING;
		pthread_mutex_unlock(&h->mu);
		h->fn(h->arg, r);
		pthread_mutex_lock(&h->mu);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* Closes connections whose request is late, and notices clients that hung
 * up on a suspended connection. */
static void *reaper(void *arg)
{
	struct baton_http *h = arg;
	struct pollfd *pf = NULL;
	struct baton_http_req **pr = NULL;
	size_t cap = 0;
	pthread_mutex_lock(&h->mu);
	while (!h->stopping) {
		baton_cond_wait_for(&h->reap_cv, &h->mu, REAP_MS / 1e3);
		if (h->stopping)
			break;
		double t = baton_now_s();
		/* under h->mu, hs_on_connection(CLOSED) has not run: the fd is still theirs */
		for (struct conn *k = h->conns; k; k = k->next) {
			if (k->deadline > 0 && t > k->deadline && k->fd >= 0) {
				k->deadline = 0;
				shutdown(k->fd, SHUT_RDWR); /* libmicrohttpd sees the end and closes it */
				if (getenv("BATON_HTTP_DEBUG"))
					fprintf(stderr, "baton http: fd %d: no whole request within %u s: closed\n", k->fd,
					    h->header_timeout_s);
			}
		}
		size_t n = 0;
		for (struct baton_http_req *r = h->open; r; r = r->next) {
			bool waiting = !r->mhd_done && !r->gone && r->fd >= 0 &&
			    (r->st == RQ_QUEUED || r->st == RQ_HANDLING || (r->stream && r->stream->waiting));
			if (!waiting)
				continue;
			if (n == cap) {
				size_t nc = cap ? 2 * cap : 64;
				struct pollfd *a = realloc(pf, nc * sizeof *a);
				if (a)
					pf = a;
				struct baton_http_req **b = a ? realloc(pr, nc * sizeof *b) : NULL;
				if (b)
					pr = b;
				if (!a || !b)
					break;
				cap = nc;
			}
			pf[n] = (struct pollfd){ .fd = r->fd, .events = POLLRDHUP };
			pr[n++] = r;
		}
		if (!n || poll(pf, n, 0) <= 0)
			continue;
		for (size_t i = 0; i < n; i++) {
			if (!(pf[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
				continue;
			struct baton_http_req *r = pr[i];
			struct gone_cb cb = { 0 };
			take_gone(r, &cb);
			if (r->stream && r->stream->waiting) {
				r->stream->waiting = false;
				MHD_resume_connection(r->conn); /* its reader ends the connection */
			}
			if (cb.fn) {
				r->refs++; /* keep r while fn runs unlocked */
				pthread_mutex_unlock(&h->mu);
				cb.fn(cb.owner, cb.id);
				pthread_mutex_lock(&h->mu);
				req_unref(r);
				break; /* the list may have changed: poll again next round */
			}
		}
	}
	pthread_mutex_unlock(&h->mu);
	free(pf);
	free(pr);
	return NULL;
}

/* ---- open and close -------------------------------------------------------------- */

static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static unsigned nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1u << 30)
		return 1u << 30;
	return (unsigned)rl.rlim_cur;
}

const char *http_url(const struct baton_http *h)
{
	return h->url;
}

unsigned http_port(const struct baton_http *h)
{
	return h->guard.port;
}

void http_stats(struct baton_http *h, struct http_stats *s)
{
	pthread_mutex_lock(&h->mu);
	s->conns = h->n_conns;
	s->body_bytes = h->body_bytes;
	s->body_held = h->body_held;
	s->refused = h->refused;
	s->evicted = h->evicted;
	pthread_mutex_unlock(&h->mu);
}

/* libmicrohttpd's own messages are about single clients (a peer gone, a
 * bad request line), which each get their answer: noise in a daemon's log
 * unless asked for with BATON_HTTP_DEBUG=1. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	(void)cls;
	const char *d = getenv("BATON_HTTP_DEBUG");
	if (!d || strcmp(d, "1") != 0)
		return;
	fputs("baton http: ", stderr);
	vfprintf(stderr, fmt, ap);
}

int http_open(const struct baton_http_opts *o, baton_http_fn fn, void *arg, struct baton_http **out,
    char *err, size_t errlen)
{
	*out = NULL;
	char host[HTTP_HOST_MAX];
	long port;
	if (!o || !o->addr || !fn || http_split_hostport(o->addr, host, sizeof host, &port) != 0 || port < 0) {
		snprintf(err, errlen, "http address '%s': want HOST:PORT or [V6]:PORT", o && o->addr ? o->addr : "");
		return BATON_EINVAL;
	}
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	bool v6 = strchr(host, ':') != NULL;
	if (v6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) {
			snprintf(err, errlen, "http address '%s': not an IPv6 address", o->addr);
			return BATON_EINVAL;
		}
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		if (inet_pton(AF_INET, host, &a->sin_addr) != 1) {
			/* a name (localhost): its first IPv4 address */
			struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *ai = NULL;
			if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) {
				snprintf(err, errlen, "http address '%s': cannot resolve '%s'", o->addr, host);
				return BATON_EINVAL;
			}
			a->sin_addr = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
			freeaddrinfo(ai);
		}
	}
	raise_nofile();
	struct baton_http *h = calloc(1, sizeof *h);
	if (!h) {
		snprintf(err, errlen, "out of memory");
		return BATON_ENOMEM;
	}
	h->fn = fn;
	h->arg = arg;
	h->refs = 1;
	h->header_timeout_s = o->header_timeout_s ? o->header_timeout_s : DEF_HEADER_S;
	h->max_body = o->max_body ? o->max_body : DEF_MAX_BODY;
	h->body_limit = o->body_limit;
	h->max_body_total = o->max_body_total ? o->max_body_total : DEF_BODY_TOTAL;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	baton_cond_init(&h->reap_cv);
	baton_cond_init(&h->sent_cv);
	if (http_guard_init(&h->guard, host, (unsigned)port, o->hosts, o->token, o->token_for_reads != 0,
	    h->max_body) != 0) {
		snprintf(err, errlen, "http: a host name or the token is too long, or more than %d names",
		    HTTP_NAMES_MAX);
		server_free(h);
		return BATON_EINVAL;
	}
	if (http_guard_set_cors(&h->guard, o->cors_origins) != 0) {
		snprintf(err, errlen, "http: a CORS origin is not scheme://host[:port] (exact, no wildcard), or more "
		    "than %d", HTTP_NAMES_MAX);
		server_free(h);
		return BATON_EINVAL;
	}
	unsigned max_conns = o->max_conns ? o->max_conns : DEF_MAX_CONNS;
	unsigned fds = nofile();
	if (fds > 64 + SPARE_CONNS && max_conns > fds - 64 - SPARE_CONNS)
		max_conns = fds - 64 - SPARE_CONNS; /* leave some for the process's other files */
	h->max_conns = max_conns;
	h->max_per_addr = o->max_conns_per_addr ? o->max_conns_per_addr : max_conns / 8;
	if (h->max_per_addr > max_conns)
		h->max_per_addr = max_conns;
	if (h->max_per_addr == 0)
		h->max_per_addr = 1;
	unsigned workers = o->workers ? o->workers : DEF_WORKERS;
	if (workers > MAX_WORKERS)
		workers = MAX_WORKERS;
	h->th = calloc(workers, sizeof *h->th);
	if (!h->th) {
		snprintf(err, errlen, "out of memory");
		server_free(h);
		return BATON_ENOMEM;
	}
	for (unsigned i = 0; i < workers; i++) {
		if (pthread_create(&h->th[i], NULL, worker, h) != 0)
			break;
		h->n_th++;
	}
	if (h->n_th == workers && pthread_create(&h->reaper, NULL, reaper, h) == 0)
		h->reaper_on = true;
	if (!h->reaper_on) {
		snprintf(err, errlen, "http: cannot start threads");
		http_close(h);
		return BATON_ENOMEM;
	}
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
	    MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
	h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, h,
	    MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
	    MHD_OPTION_CONNECTION_LIMIT, max_conns + SPARE_CONNS, /* evict_one keeps max_conns */
	    MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s ? o->idle_timeout_s : DEF_IDLE_S,
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
	    MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
	    MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
	    MHD_OPTION_NOTIFY_CONNECTION, hs_on_connection, h,
	    MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024u,
	    MHD_OPTION_END);
	if (!h->d) {
		snprintf(err, errlen, "cannot listen on http://%s: %s", o->addr, strerror(errno ? errno : EADDRINUSE));
		http_close(h);
		return BATON_EIO;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
	h->guard.port = di ? di->port : (unsigned)port;
	snprintf(h->url, sizeof h->url, "http://%s%s%s:%u", v6 ? "[" : "", host, v6 ? "]" : "", h->guard.port);
	*out = h;
	return 0;
}

void http_close(struct baton_http *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	h->stopping = true;
	/* every request still waiting for its answer gets 503; streams end */
	for (struct baton_http_req *r = h->open; r; r = r->next) {
		if (r->mhd_done)
			continue;
		if ((r->st == RQ_QUEUED || r->st == RQ_HANDLING) && !r->answered) {
			r->answered = true;
			struct MHD_Response *e = hs_error_resp(503, BATON_ECLOSED, "the server is shutting down");
			if (e) {
				hs_park(r, e, 503);
			} else {
				r->st = RQ_SENT; /* no answer: the connection ends with the daemon */
				MHD_resume_connection(r->conn);
			}
		} else if (r->stream) {
			r->stream->gone = true;
			if (r->stream->waiting) {
				r->stream->waiting = false;
				MHD_resume_connection(r->conn);
			}
		}
	}
	pthread_cond_broadcast(&h->cv);
	pthread_cond_broadcast(&h->reap_cv);
	pthread_mutex_unlock(&h->mu);
	for (unsigned i = 0; i < h->n_th; i++)
		pthread_join(h->th[i], NULL);
	if (h->reaper_on)
		pthread_join(h->reaper, NULL);
	if (h->d) {
		/* give the 503s (and answers made just before) a moment to go out
		 * before the connections close: until libmicrohttpd is done with
		 * each (on_completed), not only until it queued it (RQ_SENT): a
		 * queued answer is written later by the epoll thread, and
		 * MHD_stop_daemon drops what it has not written yet */
		double until = baton_now_s() + 1;
		pthread_mutex_lock(&h->mu);
		for (;;) {
			bool unsent = false;
			for (struct baton_http_req *r = h->open; r && !unsent; r = r->next)
				unsent = !r->mhd_done && (r->st == RQ_ANSWER || (r->st == RQ_SENT && !r->stream));
			if (!unsent || baton_cond_wait_until(&h->sent_cv, &h->mu, until) != 0)
				break;
		}
		pthread_mutex_unlock(&h->mu);
		MHD_stop_daemon(h->d);
		h->d = NULL;
	}
	pthread_mutex_lock(&h->mu);
	bool last = --h->refs == 0;
	pthread_mutex_unlock(&h->mu);
	if (last)
		server_free(h);
}
