/*
 * guard.c: who may send what, decided on a request's headers before any
 * byte of its body is read (docs/internals/security.md).
 *
 * Loopback TCP is no permission boundary: any local user, and any web page
 * in a browser on the machine, can reach 127.0.0.1. So every request must
 * carry a Host that names this server (DNS rebinding: a page could read
 * what reads show), and a call that changes state (any method but GET and
 * HEAD; those too with token_for_reads) must carry an Origin, when a
 * browser sends one, that is the server's own, the bearer token (when one
 * is set) and, with a body, Content-Type: application/json (a cross-site
 * form or no-cors fetch cannot send it without a preflight, which we never
 * answer). A declared body over the limit is refused whatever the method.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/http_int.h"

int http_split_hostport(const char *s, char *host, size_t n, long *port)
{
	const char *end, *colon;
	*port = -1;
	if (*s == '[') {
		end = strchr(s, ']');
		if (!end)
			return -1;
		colon = end[1] == ':' ? end + 1 : NULL;
		if (end[1] && !colon)
			return -1;
		s++;
	} else {
		colon = strrchr(s, ':');
		end = colon ? colon : s + strlen(s);
		if (colon && strchr(s, ':') != colon)
			return -1; /* a bare v6 address: not a Host */
	}
	if (end == s || (size_t)(end - s) >= n)
		return -1;
	memcpy(host, s, (size_t)(end - s));
	host[end - s] = 0;
	if (colon) {
		unsigned long p = 0;
		const char *q = colon + 1;
		if (!*q)
			return -1;
		for (; *q; q++) {
			if (*q < '0' || *q > '9' || p > 65535)
				return -1;
			p = p * 10 + (unsigned long)(*q - '0');
		}
		if (p > 65535)
			return -1;
		*port = (long)p;
	}
	return 0;
}

static bool is_ip(const char *h, bool *loopback, bool *any)
{
	unsigned char a[16];
	*loopback = *any = false;
	if (inet_pton(AF_INET, h, a) == 1) {
		*loopback = a[0] == 127;
		*any = !a[0] && !a[1] && !a[2] && !a[3];
		return true;
	}
	if (inet_pton(AF_INET6, h, a) == 1) {
		static const unsigned char zero[16], one[16] = { [15] = 1 };
		*loopback = memcmp(a, one, 16) == 0;
		*any = memcmp(a, zero, 16) == 0;
		return true;
	}
	return false;
}

int http_is_loopback(const char *hostport)
{
	char host[HTTP_HOST_MAX];
	long port;
	bool lo, any;
	if (http_split_hostport(hostport, host, sizeof host, &port) != 0)
		return 0;
	return strcasecmp(host, "localhost") == 0 || (is_ip(host, &lo, &any) && lo);
}

int http_guard_init(struct http_guard *g, const char *host, unsigned port, const char *const *names,
    const char *token, bool token_for_reads, size_t max_body)
{
	bool lo = false, any = false;
	memset(g, 0, sizeof *g);
	if (strlen(host) >= sizeof g->host || (token && strlen(token) >= sizeof g->token))
		return -1;
	snprintf(g->host, sizeof g->host, "%s", host);
	g->port = port;
	g->loopback = strcasecmp(host, "localhost") == 0 || (is_ip(host, &lo, &any) && lo);
	g->wildcard = any;
	for (size_t i = 0; names && names[i]; i++) {
		const char *s = names[i];
		size_t k = strlen(s);
		if (k >= 2 && s[0] == '[' && s[k - 1] == ']') { /* "[::1]": the address inside */
			s++;
			k -= 2;
		}
		if (!k)
			continue;
		if (g->n_names == HTTP_NAMES_MAX || k >= HTTP_HOST_MAX)
			return -1;
		memcpy(g->names[g->n_names], s, k);
		g->names[g->n_names++][k] = 0;
	}
	snprintf(g->token, sizeof g->token, "%s", token ? token : "");
	g->token_for_reads = token_for_reads;
	g->max_body = max_body;
	return 0;
}

static bool host_ok(const struct http_guard *g, const char *hosthdr)
{
	char host[HTTP_HOST_MAX];
	long port;
	bool lo, any;
	if (!hosthdr || http_split_hostport(hosthdr, host, sizeof host, &port) != 0)
		return false;
	if (port >= 0 && port != (long)g->port)
		return false; /* the name is what DNS rebinding forges; a Host without a port is fine */
	if (!g->wildcard && strcasecmp(host, g->host) == 0)
		return true;
	for (unsigned i = 0; i < g->n_names; i++)
		if (strcasecmp(host, g->names[i]) == 0)
			return true;
	if (strcasecmp(host, "localhost") == 0) /* this machine, whatever it is bound to */
		return true;
	if (g->loopback && is_ip(host, &lo, &any) && lo)
		return true;
	/* Bound to every address: any address literal is this machine's (a
	 * rebinding page names its own host, never an address). */
	return g->wildcard && is_ip(host, &lo, &any) && !any;
}

bool http_guard_host(const struct http_guard *g, const char *host)
{
	return host_ok(g, host);
}

bool http_guard_cors(const struct http_guard *g, const char *origin)
{
	for (unsigned i = 0; origin && i < g->n_cors; i++)
		if (strcasecmp(origin, g->cors[i]) == 0)
			return true;
	return false;
}

int http_guard_set_cors(struct http_guard *g, const char *const *origins)
{
	g->n_cors = 0;
	for (size_t i = 0; origins && origins[i]; i++) {
		const char *o = origins[i], *sep = strstr(o, "://");
		size_t k = strlen(o);
		/* an origin is scheme://host[:port]: no path, no wildcard */
		if (!sep || sep == o || !sep[3] || strchr(sep + 3, '/') || strchr(o, '*') || strpbrk(o, " \t\r\n,") ||
		    g->n_cors == HTTP_NAMES_MAX || k >= HTTP_HOST_MAX)
			return -1;
		memcpy(g->cors[g->n_cors++], o, k + 1);
	}
	return 0;
}

/* "Bearer TOKEN", the scheme in any case (RFC 7235), or with no
 * Authorization an x-api-key of the token; compared in the same time for
 * every wrong token of the right length. */
static bool token_ok(const struct http_guard *g, const char *a, const char *api_key)
{
	if (!a && api_key) { /* x-api-key: the token alone (Anthropic's clients send it so) */
		a = api_key;
	} else {
		if (!a || strncasecmp(a, "Bearer", 6) != 0 || (a[6] != ' ' && a[6] != '\t'))
			return false;
		a += 6;
	}
	while (*a == ' ' || *a == '\t')
		a++;
	size_t n = strcspn(a, " \t"), m = strlen(g->token);
	if (a[n + strspn(a + n, " \t")])
		return false; /* more than one word */
	unsigned char d = n != m;
	for (size_t i = 0; i < m; i++)
		d |= (unsigned char)(a[i < n ? i : 0] ^ g->token[i]);
	return d == 0;
}

static void names_of(const struct http_guard *g, char *out, size_t n)
{
	size_t k = 0;
	out[0] = 0;
	for (unsigned i = 0; i < g->n_names && k < n; i++)
		k += (size_t)snprintf(out + k, n - k, " or %s", g->names[i]);
}

int http_guard_check(const struct http_guard *g, const struct http_guard_in *in, bool *authorized,
    int *err, char *msg, size_t n)
{
	bool read = strcmp(in->method, "GET") == 0 || strcmp(in->method, "HEAD") == 0;
	*authorized = !g->token[0] || token_ok(g, in->auth, in->api_key);
	*err = BATON_EPERM;
	uint64_t clen;
	size_t max = in->max_body ? in->max_body : g->max_body;
	/* before all: two lengths, or two Hosts, and the request means one
	 * thing here and another to a proxy in front (RFC 9112 6.3 and 3.2:
	 * 400, whether the values agree or not; the server read the first) */
	if (in->n_clen > 1 || in->n_host > 1) {
		*err = BATON_EMSG;
		snprintf(msg, n, "%u %s headers: send one", in->n_clen > 1 ? in->n_clen : in->n_host,
		    in->n_clen > 1 ? "Content-Length" : "Host");
		return 400;
	}
	/* both framings: the server reads the chunks, a proxy may read the
	 * length (RFC 9112 6.1 lets a server refuse it: request smuggling) */
	if (in->clen && in->te) {
		*err = BATON_EMSG;
		snprintf(msg, n, "both Content-Length and Transfer-Encoding: send one");
		return 400;
	}
	/* first: whatever else is wrong, this body is never read (a length
	 * past 2^64 is too large as well) */
	if (in->clen && baton_parse_u64(in->clen, 0, max, &clen) == BATON_ERANGE) {
		*err = BATON_ETOOBIG;
		snprintf(msg, n, "the body is %.40s bytes; at most %zu", in->clen, max);
		return 413;
	}
	/* The Host before all else, reads too: a page that rebinds its name to
	 * us could read what reads show (engines' pids and URLs). Browsers
	 * always send a Host; a client without one (HTTP/1.0) is no page, and
	 * reads stay open to it. */
	bool open_read = read && !g->token_for_reads;
	if (!(open_read && !in->host) && !host_ok(g, in->host)) {
		char names[512];
		names_of(g, names, sizeof names);
		bool v6 = strchr(g->host, ':') != NULL;
		snprintf(msg, n, "Host '%.100s' is not this server's address (%s%s%s:%u%s); add the name to its "
		    "accepted hosts (the broker's [broker] http_hosts)", in->host ? in->host : "(none)", v6 ? "[" : "",
		    g->host, v6 ? "]" : "", g->port, names);
		return 403;
	}
	if (open_read)
		return 0; /* reads are open: they change nothing (the server's choice) */
	if (in->origin && !http_guard_cors(g, in->origin)) {
		/* the server's own origin: http:// and the (checked) Host; or
		 * one the operator allowed (cors_origins: the token is still
		 * asked for below) */
		if (strncasecmp(in->origin, "http://", 7) != 0 || strcasecmp(in->origin + 7, in->host) != 0) {
			snprintf(msg, n, "Origin '%.100s' is not this server's (http://%.100s): cross-site requests "
			    "are refused", in->origin, in->host);
			return 403;
		}
	}
	if (!*authorized) {
		snprintf(msg, n, "this call needs the token (Authorization: Bearer ...)");
		return 401;
	}
	bool body = (in->clen && strcmp(in->clen, "0") != 0) || in->te;
	if (!read && (body || in->ctype)) {
		size_t k = strlen("application/json");
		const char *c = in->ctype;
		if (!c || strncasecmp(c, "application/json", k) != 0 || (c[k] && c[k] != ';' && c[k] != ' ')) {
			*err = BATON_EUNSUPPORTED;
			snprintf(msg, n, "send Content-Type: application/json (got '%.60s')", c ? c : "none");
			return 415;
		}
	}
	return 0;
}
