/*
 * http_test.c: the HTTP server against real sockets on 127.0.0.1:0.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "http/http.h"
#include "tests/t.h"

/* ---- a test handler ---- */

static sem_t acked;                      /* the test got a stream chunk */
static atomic_int gone_calls, write_failed;
static struct baton_http_req *held;      /* /hold: answered later by the test */
static sem_t held_sem;

static void on_gone(void *owner, uint64_t id)
{
	(void)owner;
	(void)id;
	atomic_fetch_add(&gone_calls, 1);
}

static void *stream_steps(void *arg)
{
	struct baton_http_stream *s = arg;
	char buf[32];
	for (int i = 0; i < 4; i++) {
		int n = snprintf(buf, sizeof buf, "chunk%d;", i);
		if (http_stream_write(s, buf, (size_t)n) != 0)
			break; /* the server closed (t_close_with_open) */
		sem_wait(&acked); /* the next one only once the client has this one */
	}
	http_stream_close(s);
	return NULL;
}

static void *stream_forever(void *arg)
{
	struct baton_http_stream *s = arg;
	for (int i = 0; i < 1000; i++) {
		if (http_stream_write(s, "tick;", 5) != 0) {
			atomic_store(&write_failed, 1);
			break;
		}
		usleep(10000);
	}
	http_stream_close(s);
	return NULL;
}

static void handler(void *arg, struct baton_http_req *r)
{
	(void)arg;
	const char *p = http_req_path(r);
	if (strcmp(p, "/hello") == 0) {
		char b[128];
		const char *x = http_req_query(r, "x");
		int n = snprintf(b, sizeof b, "hi %s %s %d", http_req_method(r), x ? x : "-", http_req_authorized(r));
		const char *const hd[] = { "X-Test: yes", NULL };
		http_reply(r, 200, "text/plain", b, (size_t)n, hd);
	} else if (strcmp(p, "/json") == 0) {
		size_t len;
		const char *body = http_req_body(r, &len);
		http_reply_json(r, 201, json_pack("{s:I, s:s}", "n", (json_int_t)len, "body", body));
	} else if (strcmp(p, "/stream") == 0 || strcmp(p, "/forever") == 0) {
		http_req_on_gone(r, on_gone, NULL, 0);
		struct baton_http_stream *s = http_stream_open(r, 200, "text/event-stream", NULL);
		T_ASSERT(s);
		pthread_t t;
		T_ASSERT(pthread_create(&t, NULL, strcmp(p, "/stream") == 0 ? stream_steps : stream_forever, s) == 0);
		pthread_detach(t);
	} else if (strcmp(p, "/hold") == 0) {
		http_req_on_gone(r, on_gone, NULL, 0);
		held = r;
		sem_post(&held_sem);
	} else {
		http_reply_error(r, 404, BATON_ENOTFOUND, "no such path %s", p);
	}
}

static struct baton_http *start(struct baton_http_opts *o)
{
	sem_init(&acked, 0, 0);
	sem_init(&held_sem, 0, 0);
	char err[256];
	struct baton_http *h = NULL;
	if (!o->addr)
		o->addr = "127.0.0.1:0";
	int rc = http_open(o, handler, NULL, &h, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "http_open: %s", err);
	T_ASSERT(http_port(h) > 0);
	return h;
}

/* ---- a raw client ---- */

static int dial(struct baton_http *h)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)http_port(h)) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	T_ASSERT(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
	return fd;
}

/* From another loopback address (127.0.0.N): a client of its own address. */
static int dial_from(struct baton_http *h, unsigned n)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in src = { .sin_family = AF_INET };
	src.sin_addr.s_addr = htonl(INADDR_LOOPBACK + n - 1);
	T_ASSERT(fd >= 0 && bind(fd, (struct sockaddr *)&src, sizeof src) == 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)http_port(h)) };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	T_ASSERT(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
	return fd;
}

/* Whether the server closed fd (EOF or reset within ms). */
static int closed_by_server(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, ms) <= 0)
		return 0;
	char c;
	return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

static void send_all(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
		T_ASSERT_MSG(k > 0, "send: %s", strerror(errno));
		s += k;
		n -= (size_t)k;
	}
}

static void send_str(int fd, const char *s)
{
	send_all(fd, s, strlen(s));
}

/* Reads until `want` appears (returns the bytes so far) or the peer ends
 * (0 past the end) or ms pass; *closed: the peer ended. */
static size_t read_until(int fd, char *buf, size_t cap, const char *want, int ms, int *closed)
{
	size_t n = 0;
	*closed = 0;
	buf[0] = 0;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		if (want && strstr(buf, want))
			return n;
		struct timespec t;
		clock_gettime(CLOCK_MONOTONIC, &t);
		long left = ms - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
		if (left <= 0)
			return n;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, (int)left) <= 0)
			continue;
		ssize_t k = recv(fd, buf + n, cap - 1 - n, 0);
		if (k <= 0) {
			*closed = 1;
			return n;
		}
		n += (size_t)k;
		buf[n] = 0;
		if (n == cap - 1)
			return n;
	}
}

static const char *req_get(const char *path, char *out, size_t n)
{
	snprintf(out, n, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
	return out;
}

/* ---- cases ---- */

static void t_reply(void)
{
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
	T_ASSERT(strncmp(http_url(h), "http://127.0.0.1:", 17) == 0);
	int fd = dial(h), closed;
	char b[4096], q[256];
	send_str(fd, req_get("/hello?x=a%20b", q, sizeof q));
	read_until(fd, b, sizeof b, "hi GET a b 1", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 200", 12) == 0 && strstr(b, "X-Test: yes") && strstr(b, "hi GET a b 1") &&
	    strstr(b, "Cache-Control: no-store") && strstr(b, "Content-Type: text/plain"), "%s", b);
	/* the same connection goes on; an unknown path gets the JSON error shape */
	send_str(fd, req_get("/nope", q, sizeof q));
	read_until(fd, b, sizeof b, "}}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 404", 12) == 0 && strstr(b, "\"code\":\"not_found\"") &&
	    strstr(b, "\"error\":{\"message\":\"no such path /nope\",\"type\":\"not_found_error\""), "%s", b);
	close(fd);
	http_close(h);
}

static void t_json_body(void)
{
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
	int fd = dial(h), closed;
	char b[4096];
	const char *body = "{\"a\": \"x\"}";
	char q[512];
	snprintf(q, sizeof q, "POST /json HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
	    "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
	send_str(fd, q);
	read_until(fd, b, sizeof b, "}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 201", 12) == 0 && strstr(b, "{\"n\":10,\"body\":\"{\\\"a\\\": \\\"x\\\"}\"}"),
	    "%s", b);
	/* chunked upload */
	send_str(fd, "POST /json HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
	    "Transfer-Encoding: chunked\r\n\r\n3\r\n{\"b\r\n4\r\n\":1}\r\n0\r\n\r\n");
	read_until(fd, b, sizeof b, "}\"}", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "{\"n\":7,"), "%s", b);
	close(fd);
	http_close(h);
}

static void t_stream(void)
{
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
	int fd = dial(h), closed;
	char b[8192], q[256];
	send_str(fd, req_get("/stream", q, sizeof q));
	for (int i = 0; i < 4; i++) {
		char want[16];
		snprintf(want, sizeof want, "chunk%d;", i);
		read_until(fd, b, sizeof b, want, 3000, &closed);
		T_ASSERT_MSG(strstr(b, want) && !closed, "chunk %d: %s", i, b);
		if (i == 0)
			T_ASSERT_MSG(strstr(b, "Transfer-Encoding: chunked") && strstr(b, "text/event-stream"), "%s", b);
		T_ASSERT_MSG(!strstr(b, "\r\n0\r\n\r\n"), "ended early: %s", b);
		sem_post(&acked); /* the writer waits for this before the next */
	}
	read_until(fd, b, sizeof b, "0\r\n\r\n", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "0\r\n\r\n"), "no chunked end: %s", b);
	close(fd);
	T_EQ_INT(atomic_load(&gone_calls), 0);
	http_close(h);
}

static void t_stream_client_gone(void)
{
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
	int fd = dial(h), closed;
	char b[4096], q[256];
	send_str(fd, req_get("/forever", q, sizeof q));
	read_until(fd, b, sizeof b, "tick;", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "tick;"), "%s", b);
	close(fd);
	for (int i = 0; i < 300 && !(atomic_load(&write_failed) && atomic_load(&gone_calls)); i++)
		usleep(10000);
	T_ASSERT(atomic_load(&write_failed));
	T_EQ_INT(atomic_load(&gone_calls), 1);
	http_close(h);
}

static void t_held_client_gone(void)
{
	/* a client that hangs up while its answer is being made: on_gone at once */
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
	int fd = dial(h);
	char q[256];
	send_str(fd, req_get("/hold", q, sizeof q));
	sem_wait(&held_sem);
	close(fd);
	for (int i = 0; i < 200 && !atomic_load(&gone_calls); i++)
		usleep(10000);
	T_EQ_INT(atomic_load(&gone_calls), 1);
	T_EQ_ERR(http_reply(held, 200, "text/plain", "late", 4, NULL), 0); /* parked; the send fails */
	http_close(h);
}

static void t_too_big_before_body(void)
{
	struct baton_http_opts o = { .max_body = 1000 };
	struct baton_http *h = start(&o);
	int fd = dial(h), closed;
	char b[4096];
	/* headers only: the answer comes without a byte of the body sent */
	send_str(fd, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 1001\r\n\r\n");
	read_until(fd, b, sizeof b, "}}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 413", 12) == 0 && strstr(b, "\"code\":\"too_big\""), "%s", b);
	close(fd);
	/* a chunked body that grows past the limit: the connection is cut */
	fd = dial(h);
	send_str(fd, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Transfer-Encoding: chunked\r\n\r\n");
	char chunk[700];
	memset(chunk, 'x', sizeof chunk);
	/* the server may cut the connection after any of these: a send that
	 * fails then is what is tested, not an error */
	for (int i = 0; i < 3; i++) {
		if (send(fd, "2bc\r\n", 5, MSG_NOSIGNAL) < 0 ||
		    send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) < 0 ||
		    send(fd, "\r\n", 2, MSG_NOSIGNAL) < 0)
			break;
	}
	read_until(fd, b, sizeof b, NULL, 3000, &closed);
	T_ASSERT_MSG(closed && !strstr(b, "HTTP/1.1 201"), "%s", b);
	close(fd);
	struct http_stats st;
	http_stats(h, &st);
	T_ASSERT(st.body_bytes <= 1400 && st.refused == 2);
	http_close(h);
}

static void t_token_before_body(void)
{
	struct baton_http_opts o = { .token = "s3cret" };
	struct baton_http *h = start(&o);
	int fd = dial(h), closed;
	char b[4096];
	/* a 1 MiB body announced with a wrong token: 401 on the headers */
	send_str(fd, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Authorization: Bearer wrong\r\nContent-Length: 1048576\r\n\r\n");
	read_until(fd, b, sizeof b, "}}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 401", 12) == 0 && strstr(b, "WWW-Authenticate: Bearer"), "%s", b);
	/* whatever the client sends now is not read into a body */
	char *mib = malloc(1 << 20);
	memset(mib, '{', 1 << 20);
	(void)!send(fd, mib, 1 << 20, MSG_NOSIGNAL | MSG_DONTWAIT);
	free(mib);
	close(fd);
	struct http_stats st;
	http_stats(h, &st);
	T_EQ_INT(st.body_bytes, 0);
	/* reads need no token; the right token (scheme in any case) passes */
	fd = dial(h);
	send_str(fd, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
	read_until(fd, b, sizeof b, "hi GET - 0", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "hi GET - 0"), "%s", b);
	send_str(fd, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Authorization: bEaReR s3cret\r\nContent-Length: 2\r\n\r\n{}");
	read_until(fd, b, sizeof b, "}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 201", 12) == 0, "%s", b);
	close(fd);
	http_close(h);
	/* token_for_reads: GETs need it too */
	o.token_for_reads = 1;
	h = start(&o);
	fd = dial(h);
	send_str(fd, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
	read_until(fd, b, sizeof b, "}}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 401", 12) == 0, "%s", b);
	close(fd);
	http_close(h);
}

static void expect_status(struct baton_http *h, const char *req, const char *status)
{
	int fd = dial(h), closed;
	char b[4096];
	send_str(fd, req);
	read_until(fd, b, sizeof b, "\r\n", 3000, &closed);
	T_ASSERT_MSG(strncmp(b + 9, status, 3) == 0, "want %s for\n%s\ngot: %s", status, req, b);
	close(fd);
}

static void t_guard(void)
{
	const char *const names[] = { "baton.example", NULL };
	struct baton_http_opts o = { .hosts = names };
	struct baton_http *h = start(&o);
	char q[512];
	unsigned port = http_port(h);
#define POST0 "POST /json HTTP/1.1\r\nContent-Length: 0\r\n"
	/* reads are open, on this server's Host only (DNS rebinding reads too) */
	expect_status(h, "GET /hello HTTP/1.1\r\nHost: evil.example\r\n\r\n", "403");
	expect_status(h, "GET /hello HTTP/1.1\r\nHost: baton.example\r\n\r\n", "200");
	expect_status(h, "GET /hello HTTP/1.0\r\n\r\n", "200"); /* no Host: no browser */
	expect_status(h, POST0 "Host: evil.example\r\n\r\n", "403");
	expect_status(h, POST0 "Host: baton.example\r\n\r\n", "201");
	expect_status(h, POST0 "Host: localhost\r\n\r\n", "201");
	snprintf(q, sizeof q, POST0 "Host: 127.0.0.1:%u\r\n\r\n", port + 1);
	expect_status(h, q, "403");
	snprintf(q, sizeof q, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nOrigin: http://127.0.0.1:%u\r\n\r\n", port,
	    port);
	expect_status(h, q, "200");
	snprintf(q, sizeof q, "POST /json HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nOrigin: http://evil.example\r\n"
	    "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", port);
	expect_status(h, q, "403");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
	    "Content-Length: 2\r\n\r\n{}", "415");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n\r\n{}", "415");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n", "201");
	/* two lengths (RFC 9112 6.3): 400, agreeing or not, before the body;
	 * two Hosts the same (issue 28) */
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}", "400");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 2\r\ncontent-length: 2\r\n\r\n{}", "400");
	expect_status(h, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n", "400");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "400");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json; charset=utf-8\r\n"
	    "Content-Length: 2\r\n\r\n{}", "201");
	struct http_stats st;
	http_stats(h, &st);
	T_EQ_INT(st.refused, 10);
	http_close(h);
	/* token_for_reads: reads are checked like the rest */
	o.token = "t";
	o.token_for_reads = 1;
	h = start(&o);
	expect_status(h, "GET /hello HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer t\r\n\r\n", "403");
	expect_status(h, "GET /hello HTTP/1.1\r\nHost: baton.example\r\nAuthorization: Bearer t\r\n\r\n", "200");
	http_close(h);
}

static void t_timeouts(void)
{
	struct baton_http_opts o = { .idle_timeout_s = 1, .header_timeout_s = 2 };
	struct baton_http *h = start(&o);
	char b[4096];
	int closed;
	struct timespec t0, t1;
	/* silent: closed after the idle timeout */
	int idle = dial(h);
	/* slow: a byte every 300 ms keeps it from being idle, not from the header deadline */
	int slow = dial(h);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	const char *req = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
	int slow_closed = 0;
	for (size_t i = 0; i < strlen(req) && !slow_closed; i++) {
		if (send(slow, req + i, 1, MSG_NOSIGNAL) != 1)
			slow_closed = 1;
		struct pollfd p = { .fd = slow, .events = POLLIN };
		if (poll(&p, 1, 300) > 0 && recv(slow, b, sizeof b, 0) <= 0)
			slow_closed = 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	T_ASSERT_MSG(slow_closed && secs >= 1.5 && secs < 4, "slow client: closed %d after %.2f s", slow_closed, secs);
	read_until(idle, b, sizeof b, NULL, 3000, &closed);
	T_ASSERT_MSG(closed, "the idle connection is still open");
	close(idle);
	close(slow);
	/* a prompt client is served */
	expect_status(h, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "200");
	http_close(h);
}

static void t_close_with_open(void)
{
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
	char b[4096], q[256];
	int closed;
	int hold = dial(h), st = dial(h);
	send_str(hold, req_get("/hold", q, sizeof q));
	sem_wait(&held_sem);
	send_str(st, req_get("/stream", q, sizeof q));
	read_until(st, b, sizeof b, "chunk0;", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "chunk0;"), "%s", b);
	http_close(h);
	read_until(hold, b, sizeof b, "}}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 503", 12) == 0, "%s", b);
	read_until(st, b, sizeof b, NULL, 3000, &closed);
	T_ASSERT_MSG(closed && !strstr(b, "\r\n0\r\n\r\n"), "the stream did not end: %s", b);
	/* answers after close: accepted and dropped */
	T_EQ_ERR(http_reply(held, 200, "text/plain", "x", 1, NULL), BATON_ECLOSED);
	sem_post(&acked); /* the stream's writer goes on and gets errors, then closes */
	sem_post(&acked);
	sem_post(&acked);
	sem_post(&acked);
	usleep(100000);
	close(hold);
	close(st);
}

/* Garbage, a NUL in the request line, a half-closed half request: the
 * next client is served as before. (Whether each junk connection ends at
 * once is libmicrohttpd's: with edge-triggered epoll it may notice a FIN
 * that came with the bytes only at the header timeout.) */
static void t_garbage_then_served(void)
{
	struct baton_http_opts o = { 0 };
	struct baton_http *h = start(&o);
#define JUNK(s) { s, sizeof(s) - 1 }
	static const struct { const char *p; size_t n; } junk[] = { JUNK("garbage"),
		JUNK("POST\0/v1/x HTTP/1.1\r\n"), JUNK("GET /v1/status\r\n"), JUNK("GET /hello HTTP/1.1\r\nHost: 127"),
		JUNK("\r\n\r\n") };
	for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
		int fd = dial(h), closed;
		char b[4096];
		send_all(fd, junk[i].p, junk[i].n);
		shutdown(fd, SHUT_WR);
		read_until(fd, b, sizeof b, NULL, 300, &closed);
		close(fd);
		expect_status(h, "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "200");
	}
	http_close(h);
}

static size_t limit_of(void *arg, const char *method, const char *path)
{
	(void)arg;
	return strcmp(method, "POST") == 0 && strcmp(path, "/json") == 0 ? 3000 : 0;
}

static void t_body_limit(void)
{
	struct baton_http_opts o = { .max_body = 100, .body_limit = limit_of };
	struct baton_http *h = start(&o);
	char q[4096], body[2001];
	memset(body, 'x', 2000);
	body[0] = '"';
	body[1999] = '"';
	body[2000] = 0;
	snprintf(q, sizeof q, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 2000\r\n\r\n%s", body);
	expect_status(h, q, "201");
	expect_status(h, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 3001\r\n\r\n", "413");
	expect_status(h, "POST /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 101\r\n\r\n", "413");
	http_close(h);
}

/* Issue 28: bodies half sent on many connections are bounded together,
 * not only each: three connections that declare 1000 bytes hold a bound
 * of 3000; a fourth is refused 503 (Retry-After) on its headers; a chunked
 * body past what is left is cut; once one leaves, a body is taken again. */
static void t_bodies_bounded_together(void)
{
	struct baton_http_opts o = { .max_body = 1000, .max_body_total = 3000 };
	struct baton_http *h = start(&o);
	int fd[3], closed;
	char b[4096];
	for (int i = 0; i < 3; i++) {
		fd[i] = dial(h);
		send_str(fd[i], "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
		    "Content-Length: 1000\r\n\r\n\"");
	}
	struct http_stats st;
	for (int i = 0; i < 200; i++) {
		http_stats(h, &st);
		if (st.body_held == 3000)
			break;
		usleep(5000);
	}
	T_EQ_INT(st.body_held, 3000);
	int x = dial(h);
	send_str(x, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 10\r\n\r\n");
	read_until(x, b, sizeof b, "}}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 503", 12) == 0 && strstr(b, "Retry-After: 1") &&
	    strstr(b, "request bodies"), "%s", b);
	close(x);
	/* a chunked body has nothing left to grow into */
	x = dial(h);
	send_str(x, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Transfer-Encoding: chunked\r\n\r\n");
	if (send(x, "5\r\n\"abc\"\r\n", 10, MSG_NOSIGNAL) > 0)
		read_until(x, b, sizeof b, NULL, 3000, &closed);
	T_ASSERT_MSG(closed && !strstr(b, "HTTP/1.1 201"), "%s", b);
	close(x);
	/* one leaves: its bytes are free, and a body is read again */
	close(fd[0]);
	for (int i = 0; i < 200; i++) {
		http_stats(h, &st);
		if (st.body_held == 2000)
			break;
		usleep(5000);
	}
	T_EQ_INT(st.body_held, 2000);
	x = dial(h);
	send_str(x, "POST /json HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	    "Content-Length: 7\r\n\r\n\"hello\"");
	read_until(x, b, sizeof b, "}", 3000, &closed);
	T_ASSERT_MSG(strncmp(b, "HTTP/1.1 201", 12) == 0, "%s", b);
	close(x);
	close(fd[1]);
	close(fd[2]);
	for (int i = 0; i < 200; i++) {
		http_stats(h, &st);
		if (st.body_held == 0)
			break;
		usleep(5000);
	}
	T_EQ_INT(st.body_held, 0);
	http_close(h);
}

/* Issue 28: connections that reconnect as soon as they are reaped kept a
 * server unreachable (15 of 22 probes failed at the door over 40 s).
 * Past max_conns the oldest connection that waits for a request goes to
 * make room: a client that sends its request at once is served, and a
 * connection that carried the token is kept. */
static void t_flood_makes_room(void)
{
	struct baton_http_opts o = { .max_conns = 40, .token = "tok-123" };
	struct baton_http *h = start(&o);
	char b[4096], req[256];
	int closed;
	/* a client with the token, on a kept-alive connection */
	int a = dial(h);
	const char *authed = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-123\r\n\r\n";
	send_str(a, authed);
	read_until(a, b, sizeof b, "hi GET - 1", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "200 OK") && strstr(b, "hi GET - 1"), "%s", b);
	/* the flood: twice the cap, silent */
	enum { FLOOD = 80 };
	int fl[FLOOD];
	for (int i = 0; i < FLOOD; i++)
		fl[i] = dial(h);
	struct http_stats st;
	for (int i = 0; i < 200; i++) {
		http_stats(h, &st);
		if (st.evicted >= FLOOD - 40 + 1)
			break;
		usleep(5000);
	}
	printf("  %u connections open, %llu closed to make room\n", st.conns, st.evicted);
	T_ASSERT_MSG(st.evicted >= FLOOD - 40 + 1, "%llu evicted", st.evicted);
	/* a new client is served at once, without the token */
	for (int k = 0; k < 3; k++) {
		int p = dial(h);
		send_str(p, req_get("/hello", req, sizeof req));
		read_until(p, b, sizeof b, "hi GET - 0", 3000, &closed);
		T_ASSERT_MSG(strstr(b, "200 OK") && strstr(b, "hi GET - 0"), "probe %d: %s", k, b);
		close(p);
	}
	/* and the token's connection is still there */
	send_str(a, authed);
	read_until(a, b, sizeof b, "hi GET - 1", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "200 OK") && strstr(b, "hi GET - 1"), "%s", b);
	close(a);
	for (int i = 0; i < FLOOD; i++)
		close(fl[i]);
	http_close(h);
}

/* Issue 28: a per-address limit. One address (127.0.0.2) that floods
 * silent connections holds at most max_conns_per_addr of them, cycling its
 * own: another address's (127.0.0.3) silent connections are never closed
 * for it, and a connection of the flooding address that carried the token
 * does not count and stays. The flood is bounded in count (the server
 * holds at most the limit of it) and time (each is closed at once). */
static void t_per_addr_limit(void)
{
	struct baton_http_opts o = { .max_conns = 400, .max_conns_per_addr = 20, .token = "tok-123" };
	struct baton_http *h = start(&o);
	char b[4096], req[256];
	int closed;
	const char *authed = "GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-123\r\n\r\n";
	int a = dial_from(h, 2);
	send_str(a, authed);
	read_until(a, b, sizeof b, "hi GET - 1", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "200 OK"), "%s", b);
	enum { OTHER = 15, FLOOD = 200 };
	int other[OTHER], fl[FLOOD];
	for (int i = 0; i < OTHER; i++)
		other[i] = dial_from(h, 3);
	double t0 = baton_now_s();
	for (int i = 0; i < FLOOD; i++)
		fl[i] = dial_from(h, 2);
	int gone = 0;
	for (int i = 0; i < FLOOD; i++)
		gone += closed_by_server(fl[i], i < FLOOD - 20 ? 2000 : 0);
	double took = baton_now_s() - t0;
	struct http_stats st;
	for (int i = 0; i < 400; i++) { /* the evicted ones, shut down, close as the server's thread gets to them */
		http_stats(h, &st);
		if (st.conns <= 20 + OTHER + 1 + 2)
			break;
		usleep(5000);
	}
	printf("  %d of %d flooding connections closed in %.3f s, %u open, %llu evicted\n", gone, FLOOD, took,
	    st.conns, st.evicted);
	T_ASSERT_MSG(gone >= FLOOD - 20, "%d closed", gone);
	T_ASSERT_MSG(st.conns <= 20 + OTHER + 1 + 2, "%u open", st.conns);
	/* the other address's connections are all there, and served */
	for (int i = 0; i < OTHER; i++)
		T_ASSERT_MSG(!closed_by_server(other[i], 0), "the other address's %d was closed", i);
	send_str(other[0], req_get("/hello", req, sizeof req));
	read_until(other[0], b, sizeof b, "hi GET - 0", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "200 OK"), "%s", b);
	/* the flooding address's authenticated connection too */
	send_str(a, authed);
	read_until(a, b, sizeof b, "hi GET - 1", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "200 OK") && strstr(b, "hi GET - 1"), "%s", b);
	/* and a new client of that address that sends at once is served */
	int p = dial_from(h, 2);
	send_str(p, req_get("/hello", req, sizeof req));
	read_until(p, b, sizeof b, "hi GET - 0", 3000, &closed);
	T_ASSERT_MSG(strstr(b, "200 OK"), "%s", b);
	close(p);
	close(a);
	for (int i = 0; i < OTHER; i++)
		close(other[i]);
	for (int i = 0; i < FLOOD; i++)
		close(fl[i]);
	http_close(h);
}

static void t_bad_addr(void)
{
	char err[256];
	struct baton_http *h;
	struct baton_http_opts o = { .addr = "127.0.0.1" };
	T_EQ_ERR(http_open(&o, handler, NULL, &h, err, sizeof err), BATON_EINVAL);
	o.addr = "nosuch.invalid:80";
	T_EQ_ERR(http_open(&o, handler, NULL, &h, err, sizeof err), BATON_EINVAL);
	o.addr = "[::1]:0";
	int rc = http_open(&o, handler, NULL, &h, err, sizeof err);
	if (rc == 0) { /* no IPv6 in some containers */
		T_ASSERT(strncmp(http_url(h), "http://[::1]:", 13) == 0);
		http_close(h);
	}
	o.addr = "127.0.0.1:0";
	struct baton_http *a;
	T_EQ_ERR(http_open(&o, handler, NULL, &a, err, sizeof err), 0);
	char addr[64];
	snprintf(addr, sizeof addr, "127.0.0.1:%u", http_port(a));
	o.addr = addr;
	T_EQ_ERR(http_open(&o, handler, NULL, &h, err, sizeof err), BATON_EIO);
	T_ASSERT_MSG(strstr(err, "cannot listen"), "%s", err);
	http_close(a);
}

/* The other APIs' error shapes by path (http_face_error); none elsewhere. */
static void t_face_error(void)
{
	json_t *j = http_face_error("/api/chat", 404, "model 'x' not found");
	T_ASSERT(j && json_object_size(j) == 1);
	T_EQ_STR(json_string_value(json_object_get(j, "error")), "model 'x' not found");
	json_decref(j);
	static const struct { int status; const char *type; } rows[] = {
		{ 400, "invalid_request_error" }, { 401, "authentication_error" }, { 403, "permission_error" },
		{ 404, "not_found_error" }, { 413, "request_too_large" }, { 429, "rate_limit_error" },
		{ 503, "overloaded_error" }, { 500, "api_error" },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		j = http_face_error(i % 2 ? "/v1/messages" : "/v1/messages/count_tokens", rows[i].status, "m");
		T_ASSERT(j);
		T_EQ_STR(json_string_value(json_object_get(j, "type")), "error");
		T_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "type")), rows[i].type);
		T_EQ_STR(json_string_value(json_object_get(json_object_get(j, "error"), "message")), "m");
		json_decref(j);
	}
	static const char *const none[] = { "/v1/chat/completions", "/api", "/apix", "/v1/messagesx", "/", NULL };
	for (size_t i = 0; none[i]; i++)
		T_ASSERT(http_face_error(none[i], 400, "m") == NULL);
	T_ASSERT(http_face_error(NULL, 400, "m") == NULL);
	char a[65], b[65], a2[65];
	http_name_digest("kjv-qwen3-moe", a);
	http_name_digest("kjv-mixtral", b);
	http_name_digest("kjv-qwen3-moe", a2);
	T_ASSERT(strlen(a) == 64 && strspn(a, "0123456789abcdef") == 64 && strcmp(a, a2) == 0 && strcmp(a, b) != 0);
}

T_MAIN(T_CASE(t_face_error), T_CASE(t_reply), T_CASE(t_json_body), T_CASE(t_stream), T_CASE(t_stream_client_gone),
    T_CASE(t_held_client_gone), T_CASE(t_too_big_before_body), T_CASE(t_token_before_body), T_CASE(t_guard),
    T_CASE(t_timeouts), T_CASE(t_close_with_open), T_CASE(t_body_limit), T_CASE(t_garbage_then_served),
    T_CASE(t_bad_addr), T_CASE(t_bodies_bounded_together), T_CASE(t_flood_makes_room),
    T_CASE(t_per_addr_limit))
