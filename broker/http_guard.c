/*
 * http_guard.c: who may change state over HTTP (docs/security.md).
 *
 * Loopback TCP is no permission boundary: any local user, and any web page
 * in a browser on the machine, can reach 127.0.0.1. So a mutating call
 * needs the broker's bearer token (made at first start when none is
 * configured, readable by the service's group only), a Host that names
 * the broker (DNS rebinding), an Origin, when a browser sends one, that is
 * the broker's own, and Content-Type: application/json (a cross-site form
 * or no-cors fetch cannot send it without a preflight, which we never
 * answer). Reads stay open: they change nothing.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <sys/random.h>
#include <sys/stat.h>

#include "broker/broker.h"

/* Splits "HOST:PORT", "[V6]:PORT", "HOST" or "[V6]" into host (brackets
 * removed) and port (-1: none). -1 when it is none of those. */
static int split_hostport(const char *s, char *host, size_t n, long *port)
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

bool broker_http_loopback(const char *hostport)
{
	char host[BROKER_URL_MAX];
	long port;
	bool lo, any;
	if (split_hostport(hostport, host, sizeof host, &port) != 0)
		return false;
	return strcasecmp(host, "localhost") == 0 || (is_ip(host, &lo, &any) && lo);
}

void broker_http_guard_init(struct broker_http_guard *g, const char *host, unsigned port, const char *names,
    const char *token)
{
	bool lo = false, any = false;
	memset(g, 0, sizeof *g);
	snprintf(g->host, sizeof g->host, "%s", host);
	g->port = port;
	g->loopback = strcasecmp(host, "localhost") == 0 || (is_ip(host, &lo, &any) && lo);
	g->wildcard = any;
	snprintf(g->names, sizeof g->names, "%s", names ? names : "");
	snprintf(g->token, sizeof g->token, "%s", token ? token : "");
}

/* Is `name` one of the comma- or space-separated names in `list`? */
static bool listed(const char *list, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = list; *p;) {
		p += strspn(p, ", ");
		size_t k = strcspn(p, ", ");
		const char *q = p;
		size_t kk = k;
		if (kk >= 2 && q[0] == '[' && q[kk - 1] == ']') {
			q++;
			kk -= 2;
		}
		if (kk && kk == n && strncasecmp(q, name, n) == 0)
			return true;
		p += k;
	}
	return false;
}

static bool host_ok(const struct broker_http_guard *g, const char *hosthdr)
{
	char host[BROKER_URL_MAX];
	long port;
	bool lo, any;
	if (!hosthdr || split_hostport(hosthdr, host, sizeof host, &port) != 0)
		return false;
	if (port >= 0 && port != (long)g->port)
		return false; /* the name is what DNS rebinding forges; a Host without a port is fine */
	if ((!g->wildcard && strcasecmp(host, g->host) == 0) || listed(g->names, host))
		return true;
	if (strcasecmp(host, "localhost") == 0) /* this machine, whatever it is bound to */
		return true;
	if (g->loopback && is_ip(host, &lo, &any) && lo)
		return true;
	/* Bound to every address: any address literal is this machine's (a
	 * rebinding page names its own host, never an address). */
	return g->wildcard && is_ip(host, &lo, &any) && !any;
}

/* "Bearer TOKEN", the scheme in any case (RFC 7235), compared in the same
 * time for every wrong token of the right length. */
static bool token_ok(const struct broker_http_guard *g, const char *a)
{
	if (!a || strncasecmp(a, "Bearer", 6) != 0 || (a[6] != ' ' && a[6] != '\t'))
		return false;
	a += 6;
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

int broker_http_guard_check(const struct broker_http_guard *g, const char *host, const char *origin,
    const char *ctype, const char *auth, char *msg, size_t n)
{
	if (!host_ok(g, host)) {
		snprintf(msg, n, "Host '%.100s' is not this broker's address (%s:%u%s%s); add the name to "
		    "[broker] http_hosts", host ? host : "(none)", g->host, g->port, *g->names ? " or " : "",
		    g->names);
		return 403;
	}
	if (origin) {
		/* The broker's own origin: http:// and the (checked) Host. */
		if (strncasecmp(origin, "http://", 7) != 0 || strcasecmp(origin + 7, host) != 0) {
			snprintf(msg, n, "Origin '%.100s' is not this broker's (http://%.100s): cross-site requests "
			    "are refused", origin, host);
			return 403;
		}
	}
	if (!g->token[0]) {
		snprintf(msg, n, "changes over HTTP are off until a token is set ([broker] http_token_file)");
		return 403;
	}
	if (!token_ok(g, auth)) {
		snprintf(msg, n, "this call needs the broker's token (Authorization: Bearer ...)");
		return 401;
	}
	size_t k = strlen("application/json");
	if (!ctype || strncasecmp(ctype, "application/json", k) != 0 ||
	    (ctype[k] && ctype[k] != ';' && ctype[k] != ' ')) {
		snprintf(msg, n, "send Content-Type: application/json (got '%.60s')", ctype ? ctype : "none");
		return 415;
	}
	return 0;
}

/* ---- the token file ------------------------------------------------------------- */

static int read_token(struct broker_config *c, const char *path, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO;
	struct stat st;
	int ok = fstat(fd, &st) == 0 && st.st_uid == geteuid();
	close(fd);
	if (!ok) {
		snprintf(err, errlen, "%s: the token file belongs to another user; remove it", path);
		return BATON_EPERM;
	}
	return broker_config_token_file(c, path, err, errlen);
}

/* 32 random bytes in hex into `path`: an O_EXCL temporary file (never a
 * file or link someone left there), fsync'd, renamed over. */
static int make_token(struct broker_config *c, const char *path, char *err, size_t errlen)
{
	unsigned char r[32];
	char tok[2 * sizeof r + 2], tmp[BROKER_URL_MAX + 32];
	if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
		snprintf(err, errlen, "cannot make a token: getrandom: %s", strerror(errno));
		return BATON_EIO;
	}
	for (size_t i = 0; i < sizeof r; i++)
		snprintf(tok + 2 * i, 3, "%02x", r[i]);
	tok[2 * sizeof r] = '\n';
	tok[2 * sizeof r + 1] = 0;
	snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
	int fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "cannot write the token to %s: %s", path, strerror(errno));
		return BATON_EIO;
	}
	bool ok = fchmod(fd, 0640) == 0 && write(fd, tok, strlen(tok)) == (ssize_t)strlen(tok) && fsync(fd) == 0;
	ok = close(fd) == 0 && ok;
	if (!ok || rename(tmp, path) != 0) {
		snprintf(err, errlen, "cannot write the token to %s: %s", path, strerror(errno));
		unlink(tmp);
		return BATON_EIO;
	}
	tok[2 * sizeof r] = 0;
	snprintf(c->http_token, sizeof c->http_token, "%s", tok);
	return 0;
}

int broker_http_token_prepare(struct broker_config *c, char *err, size_t errlen)
{
	c->http_token_path[0] = 0;
	if (!c->http[0] || c->http_token[0])
		return 0;
	if (!broker_http_loopback(c->http)) {
		snprintf(err, errlen, "http = %s is not a loopback address and no token is set: set [broker] "
		    "http_token_file (or listen on 127.0.0.1)", c->http);
		return BATON_ECONFIG;
	}
	const char *slash = strncmp(c->control, "ipc://", 6) == 0 ? strrchr(c->control + 6, '/') : NULL;
	if (!slash)
		return 0; /* no directory of ours: POSTs refused until a token is set */
	char path[BROKER_URL_MAX];
	if ((size_t)snprintf(path, sizeof path, "%.*s/http.token", (int)(slash - (c->control + 6)),
	    c->control + 6) >= sizeof path) {
		snprintf(err, errlen, "the control socket's path is too long for http.token beside it");
		return BATON_EINVAL;
	}
	int rc = read_token(c, path, err, errlen);
	if (rc == BATON_ENOTFOUND)
		rc = make_token(c, path, err, errlen);
	else if (rc == BATON_EIO)
		snprintf(err, errlen, "%s: cannot read the token file: %s", path, strerror(errno));
	if (rc == 0)
		snprintf(c->http_token_path, sizeof c->http_token_path, "%s", path);
	return rc;
}
