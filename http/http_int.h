/* http_int.h: what server.c and guard.c share (not public). */
#ifndef BATON_HTTP_INT_H
#define BATON_HTTP_INT_H

#include <stdbool.h>

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

#endif
