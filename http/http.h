/*
 * http.h: Baton's HTTP server (libmicrohttpd underneath), used by the
 * broker and by engines.
 *
 * What nng's HTTP server could not do, this does: stream a reply while it
 * is produced, cap connections, close idle and slow clients, and refuse a
 * request on its headers (Host, Origin, token, Content-Type, size) before
 * a byte of its body is read (docs/internals/http.md, docs/internals/security.md).
 *
 * A request reaches the handler on one of `workers` threads with its
 * whole body read; its connection waits (suspended) meanwhile, other
 * connections go on. The handler may block briefly; long work answers
 * later from any thread. Each request gets exactly one answer:
 * http_reply / http_reply_json, or http_stream_open ... http_stream_close.
 */
#ifndef BATON_HTTP_H
#define BATON_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/proto.h"

/* The OpenAI API's body limit, one for every server of it: an engine's
 * default max_body and the front door's chat and completion bodies (a
 * door that took more than its engines would forward what they refuse). */
#define HTTP_OPENAI_BODY_MAX (1024u * 1024u)

struct baton_http_opts {
	const char *addr;           /* "127.0.0.1:8420", "[::1]:8420", "0.0.0.0:0" (port 0: kernel picks) */
	const char *token;          /* bearer token; NULL or "": none */
	int token_for_reads;        /* 1: GET and HEAD need the token too (else only the other methods) */
	const char *const *hosts;   /* more Host names accepted (NULL-terminated), besides the bound
	                             * address and localhost */
	unsigned max_conns;         /* 0: 4096, bounded by RLIMIT_NOFILE; past it the oldest connection
	                             * waiting for a request (not one that sent the token) is closed */
	unsigned max_conns_per_addr; /* 0: max_conns / 8 (512): connections of one client address
	                             * that have not carried the token; past it that address's
	                             * oldest one waiting for a request is closed (on loopback every
	                             * local user is one address: docs/internals/security.md) */
	unsigned idle_timeout_s;    /* 0: 30: a connection silent this long is closed */
	unsigned header_timeout_s;  /* 0: 10: a request's headers and body must arrive within this of
	                             * the connection's start or its previous answer (slowloris) */
	size_t max_body;            /* 0: HTTP_OPENAI_BODY_MAX (1 MiB); a larger body gets 413 before it is read */
	size_t max_body_total;      /* 0: 64 MiB: the bodies of all requests at once (declared ones
	                             * counted from their headers); past it 503 + Retry-After before
	                             * the body is read, a chunked one is cut */
	unsigned workers;           /* handler threads; 0: 8 */
	/* Optional: the body limit of one request, from its method and path
	 * (as http_req_path gives it), instead of max_body; 0: max_body.
	 * Called on the server's thread with the headers in: must not block.
	 * (The broker: 64 KiB for its own calls, more for the OpenAI API.) */
	size_t (*body_limit)(void *arg, const char *method, const char *path);
	/* CORS: origins ("https://app.example:8080", exact; NULL-terminated;
	 * NULL: none, the default) whose pages may call this server from a
	 * browser: their requests pass the Origin check (the token is still
	 * required), their OPTIONS preflight is answered 204, and every answer
	 * to them carries Access-Control-Allow-Origin. At most 16. */
	const char *const *cors_origins;
};

struct baton_http;              /* a server */
struct baton_http_req;          /* one request; valid until answered (reply, or stream closed) */
struct baton_http_stream;       /* a reply sent while it is produced (chunked) */

typedef void (*baton_http_fn)(void *arg, struct baton_http_req *r);

/* Listens on o->addr and starts the threads. Raises RLIMIT_NOFILE to its
 * hard limit. BATON_EINVAL (a bad address or option) or BATON_EIO (cannot
 * listen), with a message in err. */
int http_open(const struct baton_http_opts *o, baton_http_fn fn, void *arg, struct baton_http **out,
    char *err, size_t errlen);
/* Stops listening, answers requests still open 503 (streams end), joins
 * the threads. Answers given after it are accepted and dropped. */
void http_close(struct baton_http *h);
/* "http://127.0.0.1:PORT" (or "http://[::1]:PORT"), the real port. */
const char *http_url(const struct baton_http *h);
unsigned http_port(const struct baton_http *h);

/* Counters for tests and metrics: connections open now, bytes of request
 * bodies read so far, requests refused on their headers, bytes of bodies
 * held now (max_body_total's count). */
struct http_stats {
	unsigned conns;
	unsigned long long body_bytes, refused;
	size_t body_held;
	unsigned long long evicted;  /* connections shut to make room past max_conns */
};
void http_stats(struct baton_http *h, struct http_stats *s);

/* ---- a request (valid from the handler's call until it is answered) ---- */
const char *http_req_method(const struct baton_http_req *r);
/* The path as sent (not percent-decoded), without the query. */
const char *http_req_path(const struct baton_http_req *r);
/* The query string as sent, without '?'; "" when none. */
const char *http_req_rawquery(const struct baton_http_req *r);
/* A query parameter, percent-decoded; NULL if absent. */
const char *http_req_query(const struct baton_http_req *r, const char *key);
/* A header (name in any case); NULL if absent. */
const char *http_req_header(const struct baton_http_req *r, const char *name);
/* The whole body, NUL-terminated (len may be NULL). */
const char *http_req_body(const struct baton_http_req *r, size_t *len);
/* The token matched (or none is set). */
int http_req_authorized(const struct baton_http_req *r);

/* ---- answers: exactly one per request, from any thread ---- */
/* headers: "Name: value" strings, NULL-terminated; may be NULL. 0, or
 * BATON_ECLOSED when the client or the server is gone (r is freed all
 * the same). */
int http_reply(struct baton_http_req *r, int status, const char *ctype, const void *body, size_t len,
    const char *const *headers);
/* The JSON (compact) with Content-Type application/json; takes the reference. */
int http_reply_json(struct baton_http_req *r, int status, json_t *j);
/* The error shape every Baton server answers: {"ok":false, "code":NAME,
 * "err":N, "message":MSG, "error":{"message":MSG, "type":TYPE, "code":NAME}}
 * (Baton's own fields and OpenAI's error object; type from the status). */
int http_reply_error(struct baton_http_req *r, int status, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
json_t *http_error_json(int status, int err, const char *msg);

/* ---- errors as HTTP answers (error.c) ---- */
/* The one table from a Baton error to an HTTP status, for every server
 * (the broker's API, the front door, engines): 400 a request that is
 * wrong (invalid, unsupported, bad_message, bad_type, missing_field,
 * extra_field, out_of_range, duplicate, unknown_op), 403 permission, 404
 * not_found, 409 a conflict with what is there (bad_state, exists), 413
 * too_big, 503 busy, closed, connect, device_oom (try again: answered
 * with Retry-After), 504 timeout, 500 the rest. */
int http_status_of(int err);
/* The OpenAI error type of a status: 400/405/413/415
 * invalid_request_error, 401 authentication_error, 403 permission_error,
 * 404 not_found_error, 409 conflict_error, 429 rate_limit_error, 5xx
 * server_error. */
const char *http_error_type(int status);
/* The seconds a client should wait before it tries again, as a header
 * value ("1"), for a status that asks for one (503); else NULL. */
const char *http_retry_after(int status);
/* OpenAI's error object, {"error": {"message", "type", "param", "code"}}
 * (param and code null when NULL; type from the status when NULL): a new
 * reference, NULL when out of memory. */
json_t *http_openai_error(int status, const char *message, const char *type, const char *param,
    const char *code);
/* The error body of the other faces a path belongs to, for a status and
 * message: Ollama's {"error": MSG} under /api/ (its clients read the
 * string), Anthropic's {"type": "error", "error": {"type", "message"}}
 * under /v1/messages; NULL for every other path (OpenAI's and Baton's
 * shapes). http_reply_error, http_reply_openai_error and the server's own
 * refusals (401, 403, 413...) answer in it. New reference. */
json_t *http_face_error(const char *path, int status, const char *msg);
/* The Ollama API version an engine's and the door's /api/version report
 * (the one their shapes follow). */
#define HTTP_OLLAMA_VERSION "0.12.6"
/* A model's "digest" in Ollama's lists: 64 hex digits made from its name
 * (an id that stays the same, not a hash of the weights), into out. */
void http_name_digest(const char *name, char out[65]);
/* Answers it as JSON, with "Retry-After: retry_after" when not NULL. */
int http_reply_openai_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
int http_vreply_openai_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, va_list ap);

/* Sends the status and headers now; the body follows as written. NULL
 * when out of memory or the client is gone (the request is then answered
 * and freed). */
struct baton_http_stream *http_stream_open(struct baton_http_req *r, int status, const char *ctype,
    const char *const *headers);
/* Buffers p and wakes the connection; never waits for the client.
 * BATON_ECLOSED once the client is gone, BATON_ETOOBIG when more than
 * 64 MiB wait unsent (a client that stopped reading). */
int http_stream_write(struct baton_http_stream *s, const void *p, size_t n);
int http_stream_gone(const struct baton_http_stream *s);
/* Ends the reply (the chunked end) once the buffer is sent; s is freed by
 * the server after that. Call it exactly once, also when gone. */
void http_stream_close(struct baton_http_stream *s);
/* Ends the reply as cut: once the buffer is sent the connection is closed
 * without the chunked end, so the client reads an incomplete body (what
 * a proxy must do when its upstream was cut). Instead of
 * http_stream_close, exactly once. */
void http_stream_abort(struct baton_http_stream *s);

/* fn(owner, id) is called once if the client goes away before the answer
 * ended (on a server thread; it must not block): a producer can cancel at
 * once. Set it from the handler. It may come after the answer was given
 * (the client left while it was sent), when r and what the caller made
 * for it may be freed: so it gets no pointer to either, but the owner (a
 * scheduler, a front door: alive until http_close has returned) and the
 * id the caller gave its request there (a finished id finds nothing). */
typedef void (*http_gone_fn)(void *owner, uint64_t id);
void http_req_on_gone(struct baton_http_req *r, http_gone_fn fn, void *owner, uint64_t id);

/* ---- the token file (token.c): one reader, the same rules for every server ---- */
#define HTTP_TOKEN_FILE_MAX 256     /* bytes of a token, with its NUL */
/* The bearer token on the first line of the file at path, into tok (n
 * bytes; at most HTTP_TOKEN_FILE_MAX are used). The file is opened
 * without following a symlink (O_NOFOLLOW) and must be a regular file no
 * other user may read or write; the token is 1 to n-1 (at most 255)
 * visible ASCII characters, its line end dropped. 0; else tok is
 * untouched and err has a sentence naming the path: BATON_EIO (cannot
 * open), BATON_EPERM (others may read or write it, or not a regular
 * file), BATON_EINVAL (empty, too long, or a character outside visible
 * ASCII). */
int http_token_read(const char *path, char *tok, size_t n, char *err, size_t errlen);

/* ---- the trust checks (guard.c), also for callers' own use ---- */
/* Splits "HOST:PORT", "[V6]:PORT", "HOST" or "[V6]" (brackets removed);
 * port -1: none. -1 when it is none of those. */
int http_split_hostport(const char *s, char *host, size_t n, long *port);
/* Is the host of HOST:PORT localhost or a loopback address? */
int http_is_loopback(const char *hostport);

#endif
