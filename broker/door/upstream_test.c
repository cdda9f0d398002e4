/*
 * upstream_test.c: the front door's client to an engine, against a
 * scripted server on 127.0.0.1 (a thread): chunked pieces arrive one by
 * one before the reply ends, Content-Length and read-until-close bodies,
 * chunk extensions and trailers, the request as sent (a GET, a DELETE), an answer sent
 * before the body was read, cancel from another thread, and replies that
 * are not HTTP.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>

#include "broker/door/door_int.h"
#include "tests/t.h"

struct srv {
	int lfd, port;
	const char *parts[8];   /* sent in turn; before each after the first, waits for `go` */
	int go[2];              /* a pipe: the test writes a byte to let the next part go */
	char got[4096];         /* the request as received */
	pthread_t th;
	bool hold;              /* keep the connection open after the parts (until the client closes) */
	bool refuse;            /* answer on the headers, never read the body, close */
};

static void *serve(void *arg)
{
	struct srv *s = arg;
	int fd = accept(s->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	size_t n = 0;
	/* the request: headers, then Content-Length bytes */
	for (;;) {
		ssize_t k = recv(fd, s->got + n, sizeof s->got - 1 - n, 0);
		if (k <= 0)
			break;
		n += (size_t)k;
		s->got[n] = 0;
		char *end = strstr(s->got, "\r\n\r\n");
		if (end && s->refuse)
			break;
		if (end) {
			const char *cl = strstr(s->got, "Content-Length: ");
			size_t want = cl ? (size_t)atoi(cl + 16) : 0;
			if (n >= (size_t)(end + 4 - s->got) + want)
				break;
		}
	}
	for (int i = 0; i < 8 && s->parts[i]; i++) {
		if (i > 0) {
			char c;
			if (read(s->go[0], &c, 1) != 1)
				break;
		}
		if (send(fd, s->parts[i], strlen(s->parts[i]), MSG_NOSIGNAL) < 0)
			break;
	}
	if (s->hold) {
		char c;
		while (recv(fd, &c, 1, 0) > 0)
			;
	}
	close(fd);
	return NULL;
}

static void srv_start(struct srv *s)
{
	s->lfd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	T_ASSERT(bind(s->lfd, (struct sockaddr *)&a, sizeof a) == 0);
	T_ASSERT(listen(s->lfd, 4) == 0);
	T_ASSERT(getsockname(s->lfd, (struct sockaddr *)&a, &al) == 0);
	s->port = ntohs(a.sin_port);
	T_ASSERT(pipe(s->go) == 0);
	T_ASSERT(pthread_create(&s->th, NULL, serve, s) == 0);
}

static void srv_go(struct srv *s)
{
	T_ASSERT(write(s->go[1], "x", 1) == 1);
}

static void srv_stop(struct srv *s)
{
	close(s->go[1]);
	pthread_join(s->th, NULL);
	close(s->lfd);
	close(s->go[0]);
}

static struct door_up *open_post(struct srv *s, const char *path, const char *body)
{
	char url[64], err[256];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", s->port);
	struct door_up *u = NULL;
	T_EQ_ERR(door_up_open(url, 2000, &u, err, sizeof err), 0);
	T_EQ_ERR(door_up_request(u, path, body, body ? strlen(body) : 0, 5000, err, sizeof err), 0);
	return u;
}

static void t_chunked_pieces_arrive_one_by_one(void)
{
	struct srv s = { .parts = {
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
		"f\r\ndata: {\"a\":1}\n\n\r\n",
		"F;ext=1\r\ndata: {\"b\":2}\n\n\r\n",
		"e\r\ndata: [DONE]\n\n\r\n0\r\nX-Trailer: 1\r\n\r\n",
	} };
	srv_start(&s);
	struct door_up *u = open_post(&s, "/v1/chat/completions", "{\"model\":\"m\",\"stream\":true}");
	T_EQ_INT(door_up_status(u), 200);
	char ct[64];
	T_EQ_STR(door_up_header(u, "content-type", ct, sizeof ct), "text/event-stream");
	uint64_t len;
	T_ASSERT(!door_up_has_length(u, &len));
	char buf[256];
	/* the first piece comes before the server sends the second */
	long n = door_up_read(u, buf, sizeof buf, 2000);
	T_EQ_INT(n, 15);
	T_ASSERT(memcmp(buf, "data: {\"a\":1}\n\n", 15) == 0);
	srv_go(&s);
	n = door_up_read(u, buf, sizeof buf, 2000);
	T_EQ_INT(n, 15);
	T_ASSERT(memcmp(buf, "data: {\"b\":2}\n\n", 15) == 0);
	srv_go(&s);
	n = door_up_read(u, buf, sizeof buf, 2000);
	T_EQ_INT(n, 14);
	T_ASSERT(memcmp(buf, "data: [DONE]\n\n", 14) == 0);
	T_EQ_INT(door_up_read(u, buf, sizeof buf, 2000), 0);
	T_EQ_INT(door_up_read(u, buf, sizeof buf, 2000), 0);
	door_up_close(u);
	srv_stop(&s);
	/* the request went out as given */
	T_ASSERT(strncmp(s.got, "POST /v1/chat/completions HTTP/1.1\r\n", 36) == 0);
	T_ASSERT(strstr(s.got, "Content-Type: application/json\r\n"));
	T_ASSERT(strstr(s.got, "\r\n\r\n{\"model\":\"m\",\"stream\":true}"));
}

static void t_content_length(void)
{
	struct srv s = { .parts = {
		"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\nRetry-After: 2\r\n\r\nhello",
		" world",
	} };
	srv_start(&s);
	struct door_up *u = open_post(&s, "/v1/completions", "{}");
	T_EQ_INT(door_up_status(u), 503);
	char ra[16];
	T_EQ_STR(door_up_header(u, "Retry-After", ra, sizeof ra), "2");
	T_ASSERT(door_up_header(u, "X-None", ra, sizeof ra) == NULL);
	uint64_t len = 0;
	T_ASSERT(door_up_has_length(u, &len));
	T_EQ_INT(len, 11);
	char buf[64];
	long n = door_up_read(u, buf, sizeof buf, 2000);
	T_EQ_INT(n, 5);
	srv_go(&s);
	long m = door_up_read(u, buf + n, sizeof buf - (size_t)n, 2000);
	T_EQ_INT(m, 6);
	T_ASSERT(memcmp(buf, "hello world", 11) == 0);
	T_EQ_INT(door_up_read(u, buf, sizeof buf, 2000), 0);
	door_up_close(u);
	srv_stop(&s);
}

/* Bodyless requests: a GET, and a DELETE when asked (a stored response's). */
static void t_get_and_delete(void)
{
	const char *methods[2] = { "GET", "DELETE" };
	for (int k = 0; k < 2; k++) {
		struct srv s = { .parts = { "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}" } };
		srv_start(&s);
		char url[64], err[256], want[64];
		snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
		struct door_up *u = NULL;
		T_EQ_ERR(door_up_open(url, 2000, &u, err, sizeof err), 0);
		if (k)
			door_up_set_delete(u);
		T_EQ_ERR(door_up_request(u, "/v1/responses/resp_1", NULL, 0, 5000, err, sizeof err), 0);
		T_EQ_INT(door_up_status(u), 200);
		door_up_close(u);
		srv_stop(&s);
		snprintf(want, sizeof want, "%s /v1/responses/resp_1 HTTP/1.1\r\n", methods[k]);
		T_ASSERT_MSG(strncmp(s.got, want, strlen(want)) == 0, "sent: %.60s", s.got);
		T_ASSERT(!strstr(s.got, "Content-Length"));
	}
}

/* An engine refuses a body on its headers (413) and closes before it read
 * it: the door's send fails, and the answer is read all the same (it was
 * "cannot send the request", then 502 engine_unreachable). */
static void t_answer_before_body(void)
{
	struct srv s = { .refuse = true, .parts = {
		"HTTP/1.1 413 Content Too Large\r\nContent-Length: 7\r\nConnection: close\r\n\r\ntoo big",
	} };
	srv_start(&s);
	size_t n = 32u << 20;
	char *body = malloc(n + 1);
	T_ASSERT(body != NULL);
	memset(body, 'x', n);
	body[n] = 0;
	char url[64], err[256];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
	struct door_up *u = NULL;
	T_EQ_ERR(door_up_open(url, 2000, &u, err, sizeof err), 0);
	T_EQ_ERR(door_up_request(u, "/v1/completions", body, n, 5000, err, sizeof err), 0);
	T_EQ_INT(door_up_status(u), 413);
	char buf[16];
	T_EQ_INT(door_up_read(u, buf, sizeof buf, 2000), 7);
	T_ASSERT(memcmp(buf, "too big", 7) == 0);
	door_up_close(u);
	free(body);
	srv_stop(&s);
}

static void t_until_close(void)
{
	struct srv s = { .parts = { "HTTP/1.0 200 OK\r\n\r\nabc" } };
	srv_start(&s);
	struct door_up *u = open_post(&s, "/v1/completions", "{}");
	char buf[16];
	T_EQ_INT(door_up_read(u, buf, sizeof buf, 2000), 3);
	T_EQ_INT(door_up_read(u, buf, sizeof buf, 2000), 0);
	door_up_close(u);
	srv_stop(&s);
}

struct canceller {
	struct door_up *u;
};

static void *cancel_later(void *arg)
{
	struct canceller *c = arg;
	usleep(100000);
	door_up_cancel(c->u);
	return NULL;
}

static void t_cancel_ends_a_wait(void)
{
	/* headers sent, the body never comes: a client that leaves cancels */
	struct srv s = { .parts = { "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" }, .hold = true };
	srv_start(&s);
	struct door_up *u = open_post(&s, "/v1/chat/completions", "{}");
	struct canceller c = { u };
	pthread_t th;
	T_ASSERT(pthread_create(&th, NULL, cancel_later, &c) == 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	char buf[16];
	long n = door_up_read(u, buf, sizeof buf, 10000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	pthread_join(th, NULL);
	T_EQ_INT(n, -BATON_ECLOSED);
	double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	T_ASSERT_MSG(dt < 5, "the read waited %.1f s after the cancel", dt);
	door_up_close(u); /* the server sees the close */
	srv_stop(&s);
}

static void t_not_http(void)
{
	struct srv s = { .parts = { "SSH-2.0-OpenSSH\r\n" } };
	srv_start(&s);
	char url[64], err[256];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
	struct door_up *u = NULL;
	T_EQ_ERR(door_up_open(url, 2000, &u, err, sizeof err), 0);
	T_EQ_ERR(door_up_request(u, "/v1/completions", "{}", 2, 2000, err, sizeof err), BATON_EMSG);
	T_ASSERT(strstr(err, "did not answer HTTP"));
	door_up_close(u);
	srv_stop(&s);
}

static void t_bad_urls(void)
{
	char err[256];
	struct door_up *u = NULL;
	const char *bad[] = { "ftp://x:1", "http://", "http://host", "http://host:", "http://host:12a",
		"http://[::1:80" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		T_EQ_ERR(door_up_open(bad[i], 100, &u, err, sizeof err), BATON_EINVAL);
		T_ASSERT(u == NULL);
	}
	/* a port where nobody listens */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	T_ASSERT(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
	T_ASSERT(getsockname(fd, (struct sockaddr *)&a, &al) == 0);
	char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d/", ntohs(a.sin_port));
	T_EQ_ERR(door_up_open(url, 1000, &u, err, sizeof err), BATON_ECONN);
	close(fd);
}

T_MAIN(T_CASE(t_chunked_pieces_arrive_one_by_one), T_CASE(t_content_length), T_CASE(t_get_and_delete),
    T_CASE(t_answer_before_body),
    T_CASE(t_until_close),
    T_CASE(t_cancel_ends_a_wait), T_CASE(t_not_http), T_CASE(t_bad_urls))
