/*
 * upstream.c: the front door's client to an engine's OpenAI HTTP
 * (see door_int.h). One connection per request (Connection: close), plain
 * HTTP/1.1 over a socket: the peer is our own engine, usually over
 * loopback, and the door must hand each piece of a streamed reply on the
 * moment it arrives, which a client that reads whole replies cannot do.
 * Bodies come as Content-Length, chunked (decoded here) or until close.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "broker/door/door_int.h"

#define HEAD_MAX 16384  /* status line and headers of a reply */

enum body_mode { BODY_LENGTH, BODY_CHUNKED, BODY_CLOSE };

struct door_up {
	int fd;
	char host[256];           /* HOST:PORT, for Host: and messages */
	char auth[300];           /* "Authorization: Bearer TOKEN\r\n", or "" */
	bool del;                 /* a bodyless request is a DELETE (else a GET) */
	int status;
	char head[HEAD_MAX + 1];  /* the reply's header block, NUL-terminated lines */
	size_t head_len;
	/* bytes read past the headers, not yet handed out */
	char buf[16384];
	size_t pos, len;
	enum body_mode mode;
	uint64_t left;            /* BODY_LENGTH: bytes left; BODY_CHUNKED: of this chunk */
	bool chunk_done;          /* BODY_CHUNKED: the last chunk was read */
	bool eof;
};

/* Waits for the socket to be readable; BATON_ETIMEDOUT, BATON_ECLOSED. */
static int wait_in(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	for (;;) {
		int n = poll(&p, 1, timeout_ms);
		if (n > 0)
			return 0;
		if (n == 0)
			return BATON_ETIMEDOUT;
		if (errno != EINTR)
			return BATON_ECLOSED;
	}
}

/* More bytes into buf (after what is there); 0, or an error at EOF. */
static int fill(struct door_up *u, int timeout_ms)
{
	if (u->pos > 0 && u->pos == u->len)
		u->pos = u->len = 0;
	if (u->len == sizeof u->buf) {
		memmove(u->buf, u->buf + u->pos, u->len - u->pos);
		u->len -= u->pos;
		u->pos = 0;
	}
	int rc = wait_in(u->fd, timeout_ms);
	if (rc)
		return rc;
	ssize_t n;
	do
		n = recv(u->fd, u->buf + u->len, sizeof u->buf - u->len, 0);
	while (n < 0 && errno == EINTR);
	if (n <= 0) {
		u->eof = true;
		return BATON_ECLOSED;
	}
	u->len += (size_t)n;
	return 0;
}

/* One line (CRLF or LF ended) out of buf into out; BATON_EMSG when longer
 * than n. */
static int read_line(struct door_up *u, char *out, size_t n, int timeout_ms)
{
	for (;;) {
		char *nl = memchr(u->buf + u->pos, '\n', u->len - u->pos);
		if (nl) {
			size_t l = (size_t)(nl - (u->buf + u->pos));
			if (l >= n)
				return BATON_EMSG;
			memcpy(out, u->buf + u->pos, l);
			if (l && out[l - 1] == '\r')
				l--;
			out[l] = 0;
			u->pos += (size_t)(nl - (u->buf + u->pos)) + 1;
			return 0;
		}
		if (u->len - u->pos >= n)
			return BATON_EMSG;
		int rc = fill(u, timeout_ms);
		if (rc)
			return rc;
	}
}

/* Splits "http://HOST:PORT[/...]" (IPv6 host in brackets). */
static int split_url(const char *url, char *host, size_t hn, char *port, size_t pn)
{
	if (strncmp(url, "http://", 7) != 0)
		return BATON_EINVAL;
	const char *h = url + 7, *end;
	if (*h == '[') {
		end = strchr(h, ']');
		if (!end || end[1] != ':')
			return BATON_EINVAL;
		if ((size_t)(end - h - 1) >= hn)
			return BATON_EINVAL;
		snprintf(host, hn, "%.*s", (int)(end - h - 1), h + 1);
		end++;
	} else {
		end = strchr(h, ':');
		if (!end || (size_t)(end - h) >= hn || end == h)
			return BATON_EINVAL;
		snprintf(host, hn, "%.*s", (int)(end - h), h);
	}
	const char *p = end + 1;
	size_t l = strcspn(p, "/");
	if (l == 0 || l >= pn)
		return BATON_EINVAL;
	snprintf(port, pn, "%.*s", (int)l, p);
	for (size_t i = 0; i < l; i++)
		if (port[i] < '0' || port[i] > '9')
			return BATON_EINVAL;
	return 0;
}

static int dial(const char *host, const char *port, int timeout_ms, int *out)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICSERV }, *res = NULL;
	if (getaddrinfo(host, port, &hints, &res) != 0 || !res)
		return BATON_ECONN;
	int rc = BATON_ECONN;
	for (struct addrinfo *a = res; a && rc; a = a->ai_next) {
		int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
		if (fd < 0)
			continue;
		int c = connect(fd, a->ai_addr, a->ai_addrlen);
		if (c != 0 && errno == EINPROGRESS) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int err = 0;
			socklen_t el = sizeof err;
			if (poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 &&
			    err == 0)
				c = 0;
		}
		if (c == 0) {
			/* blocking from here: reads wait in poll(), sends under SO_SNDTIMEO */
			struct timeval tv = { .tv_sec = 30 };
			int fl = fcntl(fd, F_GETFL);
			if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 ||
			    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
				close(fd);
				continue;
			}
			*out = fd;
			rc = 0;
		} else {
			close(fd);
		}
	}
	freeaddrinfo(res);
	return rc;
}


static int send_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return BATON_ECLOSED;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

static bool name_is(const char *line, const char *name, const char **val)
{
	size_t l = strlen(name);
	if (strncasecmp(line, name, l) != 0 || line[l] != ':')
		return false;
	const char *v = line + l + 1;
	while (*v == ' ' || *v == '\t')
		v++;
	*val = v;
	return true;
}

int door_up_open(const char *url, int timeout_ms, struct door_up **out, char *err, size_t errlen)
{
	*out = NULL;
	char host[256], port[16];
	if (split_url(url, host, sizeof host, port, sizeof port)) {
		snprintf(err, errlen, "the engine's URL '%.128s' is not http://HOST:PORT", url);
		return BATON_EINVAL;
	}
	struct door_up *u = calloc(1, sizeof *u);
	if (!u) {
		snprintf(err, errlen, "out of memory");
		return BATON_ENOMEM;
	}
	u->fd = -1;
	int rc = dial(host, port, timeout_ms, &u->fd);
	if (rc) {
		snprintf(err, errlen, "cannot connect to the engine at %.128s", url);
		free(u);
		return rc;
	}
	size_t hl = strcspn(url + 7, "/");
	if (hl >= sizeof u->host)
		hl = sizeof u->host - 1;
	memcpy(u->host, url + 7, hl);
	u->host[hl] = 0;
	*out = u;
	return 0;
}

int door_up_request(struct door_up *u, const char *path, const char *body, size_t len, int timeout_ms,
    char *err, size_t errlen)
{
	int rc;
	const char *url = u->host;
	char req[1024];
	int n = snprintf(req, sizeof req,
	    "POST %s HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\n"
	    "Accept: application/json, text/event-stream\r\nX-Baton-Usage: 1\r\nContent-Length: %zu\r\n"
	    "Connection: close\r\n\r\n",
	    path, u->host, u->auth, len);
	if (body == NULL) /* a GET, or a DELETE */
		n = snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n",
		    u->del ? "DELETE" : "GET", path, u->host, u->auth);
	if (n < 0 || (size_t)n >= sizeof req || send_all(u->fd, req, (size_t)n)) {
		snprintf(err, errlen, "cannot send the request to the engine at %.128s", url);
		return BATON_ECLOSED;
	}
	/* An engine that refuses a request on its headers (413) answers and
	 * closes before it has read the body: its answer is read all the same,
	 * and passed on as it is (never turned into engine_unreachable). */
	bool cut = body && send_all(u->fd, body, len) != 0;
	/* the status line, then the headers */
	char line[4096];
	rc = read_line(u, line, sizeof line, timeout_ms);
	int major, minor, st;
	if (rc && cut) {
		snprintf(err, errlen, "cannot send the request to the engine at %.128s", url);
		return BATON_ECLOSED;
	}
	if (rc || sscanf(line, "HTTP/%d.%d %d", &major, &minor, &st) != 3 || st < 100 || st > 599) {
		snprintf(err, errlen, "the engine at %.128s %s", url,
		    rc == BATON_ETIMEDOUT ? "did not answer in time" : rc ? "closed the connection" :
		    "did not answer HTTP");
		return rc ? rc : BATON_EMSG;
	}
	u->status = st;
	u->mode = BODY_CLOSE;
	for (;;) {
		rc = read_line(u, line, sizeof line, timeout_ms);
		if (rc) {
			snprintf(err, errlen, "the engine at %.128s sent a bad reply header", url);
			return rc;
		}
		if (!*line)
			break;
		size_t l = strlen(line);
		if (u->head_len + l + 1 > HEAD_MAX) {
			snprintf(err, errlen, "the engine at %.128s sent too large a reply header", url);
			return BATON_ETOOBIG;
		}
		memcpy(u->head + u->head_len, line, l + 1);
		u->head_len += l + 1;
		const char *v;
		if (name_is(line, "Transfer-Encoding", &v) && strcasestr(v, "chunked")) {
			u->mode = BODY_CHUNKED;
		} else if (name_is(line, "Content-Length", &v) && u->mode != BODY_CHUNKED) {
			char *end;
			errno = 0;
			unsigned long long cl = strtoull(v, &end, 10);
			if (errno || end == v) {
				snprintf(err, errlen, "the engine at %.128s sent a bad Content-Length", url);
				return BATON_EMSG;
			}
			u->mode = BODY_LENGTH;
			u->left = cl;
		}
	}
	if (st == 204 || st == 304 || (st >= 100 && st < 200)) {
		u->mode = BODY_LENGTH;
		u->left = 0;
	}
	return 0;
}

void door_up_set_delete(struct door_up *u)
{
	u->del = true;
}

int door_up_set_token(struct door_up *u, const char *token)
{
	u->auth[0] = 0;
	if (!token || !*token)
		return 0;
	/* a token is visible ASCII (http_token_read's rule): never a header break */
	for (const char *c = token; *c; c++)
		if (*c <= ' ' || *c >= 127)
			return BATON_EINVAL;
	if ((size_t)snprintf(u->auth, sizeof u->auth, "Authorization: Bearer %s\r\n", token) >= sizeof u->auth) {
		u->auth[0] = 0;
		return BATON_ETOOBIG;
	}
	return 0;
}

int door_up_status(const struct door_up *u)
{
	return u->status;
}

const char *door_up_header(const struct door_up *u, const char *name, char *out, size_t n)
{
	for (size_t off = 0; off < u->head_len; off += strlen(u->head + off) + 1) {
		const char *v;
		if (name_is(u->head + off, name, &v)) {
			snprintf(out, n, "%s", v);
			return out;
		}
	}
	return NULL;
}

bool door_up_has_length(const struct door_up *u, uint64_t *len)
{
	if (u->mode != BODY_LENGTH)
		return false;
	*len = u->left;
	return true;
}

/* Hands out up to n buffered bytes, at most `cap` of them. */
static size_t take(struct door_up *u, char *out, size_t n, uint64_t cap)
{
	size_t k = u->len - u->pos;
	if (k > n)
		k = n;
	if (k > cap)
		k = (size_t)cap;
	memcpy(out, u->buf + u->pos, k);
	u->pos += k;
	return k;
}

long door_up_read(struct door_up *u, char *out, size_t n, int timeout_ms)
{
	int rc;
	switch (u->mode) {
	case BODY_LENGTH:
		if (u->left == 0)
			return 0;
		if (u->pos == u->len && (rc = fill(u, timeout_ms)) != 0)
			return -rc;
		{
			size_t k = take(u, out, n, u->left);
			u->left -= k;
			return (long)k;
		}
	case BODY_CLOSE:
		if (u->pos == u->len) {
			rc = fill(u, timeout_ms);
			if (rc == BATON_ECLOSED && u->eof)
				return 0;
			if (rc)
				return -rc;
		}
		return (long)take(u, out, n, UINT64_MAX);
	case BODY_CHUNKED:
		for (;;) {
			if (u->chunk_done)
				return 0;
			if (u->left > 0) {
				if (u->pos == u->len && (rc = fill(u, timeout_ms)) != 0)
					return -rc;
				size_t k = take(u, out, n, u->left);
				u->left -= k;
				if (u->left == 0) {
					/* the CRLF after the chunk's data */
					char crlf[8];
					if ((rc = read_line(u, crlf, sizeof crlf, timeout_ms)) != 0 && k == 0)
						return -rc;
					if (rc)
						u->eof = true;
				}
				if (k)
					return (long)k;
				continue;
			}
			char line[128];
			if ((rc = read_line(u, line, sizeof line, timeout_ms)) != 0)
				return -rc;
			char *end;
			errno = 0;
			unsigned long long sz = strtoull(line, &end, 16);
			if (errno || end == line || (*end && *end != ';' && *end != ' '))
				return -BATON_EMSG;
			if (sz == 0) {
				/* trailers, up to the empty line */
				do {
					if ((rc = read_line(u, line, sizeof line, timeout_ms)) != 0)
						break;
				} while (*line);
				u->chunk_done = true;
				return 0;
			}
			u->left = sz;
		}
	}
	return -BATON_EINTERNAL;
}

void door_up_cancel(struct door_up *u)
{
	if (u && u->fd >= 0)
		shutdown(u->fd, SHUT_RDWR);
}

void door_up_close(struct door_up *u)
{
	if (!u)
		return;
	explicit_bzero(u->auth, sizeof u->auth);
	if (u->fd >= 0)
		close(u->fd);
	free(u);
}
