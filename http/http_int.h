/* http_int.h: what the http/ files share (not public): the guard, and the
 * server's records (server.c, reply.c, stream.c, admit.c). */
#ifndef BATON_HTTP_INT_H
#define BATON_HTTP_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <microhttpd.h>

#include "http/http.h"

#define HTTP_HOST_MAX 256
#define HTTP_NAMES_MAX 16
#define HTTP_TOKEN_MAX 256

struct http_guard {
	char host[HTTP_HOST_MAX];    /* the bound address, brackets removed */
	unsigned port;
	bool loopback, wildcard;     /* bound to loopback; to every address */
	char names[HTTP_NAMES_MAX][HTTP_HOST_MAX]; /* more names Host may carry */
	unsigned n_names;
	char token[HTTP_TOKEN_MAX];  /* "": none */
	bool token_for_reads;
	size_t max_body;
	char cors[HTTP_NAMES_MAX][HTTP_HOST_MAX]; /* origins allowed cross-site (CORS) */
	unsigned n_cors;
};

/* The headers a check looks at (NULL: absent). */
struct http_guard_in {
	const char *method, *host, *origin, *ctype, *auth, *clen, *te;
	const char *api_key;         /* x-api-key (Anthropic's clients): the token, when no Authorization */
	size_t max_body;             /* this request's limit; 0: the guard's */
	unsigned n_clen, n_host;     /* how many Content-Length and Host headers
	                              * came (0 or 1: one or none) */
};

/* 0 when the request may be read, else the HTTP status to refuse it
 * with, a message in msg and its Baton error code in *err. *authorized:
 * the token matched or none is set. */
int http_guard_check(const struct http_guard *g, const struct http_guard_in *in, bool *authorized,
    int *err, char *msg, size_t n);
/* The origin is one of the CORS origins (exact, case-insensitive). */
bool http_guard_cors(const struct http_guard *g, const char *origin);
/* The Host names this server (as the check's first rule). */
bool http_guard_host(const struct http_guard *g, const char *host);
/* 0, or -1 when a CORS origin is too long, too many, or not
 * scheme://host[:port]. */
int http_guard_set_cors(struct http_guard *g, const char *const *origins);
/* 0, or -1 when a configured name is too long or too many. */
int http_guard_init(struct http_guard *g, const char *host, unsigned port, const char *const *names,
    const char *token, bool token_for_reads, size_t max_body);

/* ---- the server's records (server.c and its helpers) ---- */

enum rq_state {
	RQ_NEW,       /* headers in, guard not run */
	RQ_BODY,      /* reading the body */
	RQ_QUEUED,    /* suspended, waiting for a worker */
	RQ_HANDLING,  /* suspended, with the application */
	RQ_ANSWER,    /* suspended, an answer parked in resp, resumed */
	RQ_SENT,      /* response queued with libmicrohttpd */
};

struct kv {
	char *k, *v;
};

/* One client address (IPv4 as v4-mapped IPv6) and its connections that
 * count against max_conns_per_addr: not authed, not evicted (admit.c). */
struct addr_rec {
	struct addr_rec *next;  /* its bucket of h->addrs */
	unsigned char a[16];
	unsigned n;             /* connections counted now */
	unsigned conns;         /* connections of it open (the record lives while > 0) */
};
#define HTTP_ADDR_BUCKETS 1024u

struct conn {
	struct conn *prev, *next; /* h->conns, newest first */
	struct addr_rec *addr;  /* its client's address; NULL: unknown (counted nowhere) */
	bool counted;           /* it counts in addr->n */
	int fd;
	double deadline;        /* the request must be in by then; 0: none (one is in) */
	bool authed;            /* it carried a request with the server's token: never evicted */
	bool evicted;           /* shut down to make room: it is going */
};

struct baton_http_stream {
	struct baton_http_req *r;
	char *buf;
	size_t off, len, cap;   /* unsent bytes: buf[off, len) */
	bool waiting;           /* the reader found it empty and suspended the connection */
	bool closed;            /* http_stream_close or http_stream_abort called */
	bool aborted;           /* http_stream_abort: the connection ends without the chunked end */
	bool gone;              /* the client went away (or the server stops) */
};

/* What to call when a client leaves (http_req_on_gone). */
struct gone_cb {
	http_gone_fn fn;
	void *owner;
	uint64_t id;
};

struct baton_http_req {
	struct baton_http *h;
	struct baton_http_req *prev, *next;  /* h->open */
	struct baton_http_req *qnext;        /* h's worker queue */
	struct MHD_Connection *conn;         /* NULL once libmicrohttpd is done */
	struct conn *c;
	int fd;
	int refs;
	enum rq_state st;
	char *target;                        /* as sent: path?query */
	char *path, *query;                  /* split copies of target */
	char method[16];
	struct kv *hdr, *arg;
	size_t n_hdr, n_arg;
	char *body;
	size_t len, cap;
	bool too_big, authorized;
	size_t max_body;                     /* this request's limit */
	size_t held;                         /* bytes of h->body_held that are this request's */
	bool answered;                       /* the application answered (reply or stream) */
	bool gone;                           /* the client left before the answer ended */
	bool mhd_done;
	struct MHD_Response *resp;           /* parked answer */
	unsigned status;
	struct baton_http_stream *stream;
	struct gone_cb gone_cb;              /* http_req_on_gone's; fn NULL: none */
	bool gone_fired;
	char cors[HTTP_HOST_MAX];            /* its Origin, when a CORS origin; "" else */
};

struct baton_http {
	struct MHD_Daemon *d;
	baton_http_fn fn;
	void *arg;
	struct http_guard guard;
	char url[HTTP_HOST_MAX + 32];
	unsigned header_timeout_s;
	size_t max_body;
	size_t (*body_limit)(void *arg, const char *method, const char *path);

	pthread_mutex_t mu;                  /* everything below, and every request's fields */
	pthread_cond_t cv;                   /* workers: the queue */
	pthread_cond_t reap_cv;
	pthread_cond_t sent_cv;              /* http_close: answers queued */
	int refs;                            /* 1 until http_close, + open requests */
	bool stopping;
	struct baton_http_req *qhead, *qtail;
	struct baton_http_req *open;
	struct conn *conns, *conns_tail;
	unsigned n_conns, max_conns, n_going; /* n_going: evicted, not closed yet */
	unsigned max_per_addr;               /* unauthenticated connections of one address */
	struct addr_rec *addrs[HTTP_ADDR_BUCKETS];
	unsigned long long evicted;
	unsigned long long body_bytes, refused;
	size_t max_body_total, body_held;    /* bodies all requests may hold; hold now */
	pthread_t *th;
	unsigned n_th;
	pthread_t reaper;
	bool reaper_on;
};

void hs_unref_unlock(struct baton_http_req *r);
int hs_add_headers(struct MHD_Response *resp, const char *ctype, const char *const *headers);
struct MHD_Response *hs_error_resp(int status, int err, const char *msg);
/* The same in the shape of the face the path belongs to (http_face_error). */
struct MHD_Response *hs_error_resp_for(const char *path, int status, int err, const char *msg);
void hs_cors_headers(const struct baton_http_req *r, struct MHD_Response *resp);
void hs_park(struct baton_http_req *r, struct MHD_Response *resp, int status);
void hs_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
    enum MHD_ConnectionNotificationCode toe);
/* A connection carried the server's token: never evicted, and no longer
 * counted against its address (under h->mu). */
void hs_conn_authed(struct baton_http *h, struct conn *k);

#endif
