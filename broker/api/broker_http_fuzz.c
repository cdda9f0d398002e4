/*
 * broker_http_fuzz.c: libFuzzer target for the broker's HTTP API, end to
 * end: a real broker (its decision thread, its HTTP server on 127.0.0.1
 * with a bearer token) runs inside the fuzzer, and each input is sent as
 * the raw bytes of a request over a fresh TCP connection, so libmicrohttpd's parser, http/'s checks and our
 * handlers (routing, query, token, JSON bodies) all see it.
 *
 * Checked for every input: the answer is empty (the server dropped a
 * request it could not parse) or an HTTP/1.x response whose status is one
 * the API documents (200, 400, 401, 403, 404, 405, 409, 413 and the like),
 * never a 5xx (but a 505 for a bad HTTP version): with the broker present
 * and nothing registered, no request may make it fail. Every 256 inputs, and at the end, GET /v1/status still
 * answers 200 with no engine and no device: nothing changed. Sanitizers
 * catch the rest.
 *
 * When the corpus directory given on the command line is empty, it is
 * seeded with one well-formed request of each endpoint.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "broker/api/api.h"
#include "tests/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define TOKEN "fuzz-token"
#define FUZZ_MAX_INPUT (256u << 10)

static struct broker *the_broker;
static struct broker_http *the_http;
static struct sockaddr_in addr;
static unsigned long n_inputs;

static const char *const seeds[] = {
	"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /v1/engines/a HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /v1/events?since=3 HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
	"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n",
	("POST /v1/engines/a/release HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
	 "\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"),
	("POST /v1/engines/a/vram HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
	 "\r\nContent-Type: application/json\r\nContent-Length: 19\r\n\r\n{\"reserve_mib\": 64}"),
	("POST /v1/handoff HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
	 "\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n{\"from\": \"a\", \"to\": \"b\"}"),
	("POST /v1/engines/b/refill HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
	 "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
};

static void seed(const char *dir)
{
	for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/seed-%zu", dir, i);
		FILE *f = fopen(path, "wb");
		if (!f)
			continue;
		fwrite(seeds[i], 1, strlen(seeds[i]), f);
		fclose(f);
	}
}

/* A connection to the broker's HTTP port, or -1. libFuzzer's timeout
 * alarm (SIGALRM every second) interrupts system calls: an interrupted
 * connect is abandoned and made again on a new socket. */
static int dial(void)
{
	for (int attempt = 0; attempt < 20; attempt++) {
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -1;
		if (connect(fd, (const struct sockaddr *)&addr, sizeof addr) == 0)
			return fd;
		int e = errno;
		close(fd);
		if (e != EINTR)
			return -1;
	}
	return -1;
}

/* Sends `len` bytes on a new connection and reads the answer (at most
 * `cap` bytes and 5 s). Returns the bytes read, or -1 when it could not
 * connect. */
static ssize_t exchange(const void *req, size_t len, char *out, size_t cap)
{
	int fd = dial();
	if (fd < 0)
		return -1;
	size_t off = 0;
	while (off < len) {
		ssize_t n = send(fd, (const char *)req + off, len - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break; /* the server may close early on garbage: read what it said */
		off += (size_t)n;
	}
	/* No half-close: libmicrohttpd takes a read side's end as the client
	 * gone and may close before answering. An answer is read until the
	 * server closes or stays quiet for 300 ms after it began (a kept-alive
	 * connection), or 2 s pass without one (a request it waits on). */
	size_t got = 0;
	double until = baton_now_s() + 5;
	for (;;) {
		long left = (long)((until - baton_now_s()) * 1e3);
		if (left <= 0)
			break;
		long wait = got ? 300 : 2000;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = poll(&p, 1, (int)(wait < left ? wait : left));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		ssize_t n = recv(fd, out + got, cap - 1 - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
		if (got == cap - 1)
			break;
	}
	out[got] = 0;
	close(fd);
	return (ssize_t)got;
}

static void check_unchanged(void)
{
	static const char req[] = "GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
	static char out[1 << 16];
	ssize_t n = exchange(req, sizeof req - 1, out, sizeof out);
	if (n <= 0 || strncmp(out, "HTTP/1.1 200", 12) != 0 || !strstr(out, "\"engines\":[]") ||
	    !strstr(out, "\"gpus\":[]")) {
		fprintf(stderr, "the broker changed or stopped answering after %lu inputs:\n%.2000s\n", n_inputs,
		    n > 0 ? out : "(no answer)");
		abort();
	}
}

static void at_exit(void)
{
	if (the_broker) {
		check_unchanged();
		broker_stop(the_broker);
		broker_http_close(the_http);
		the_http = NULL;
		broker_close(the_broker);
		the_broker = NULL;
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	if (corpus)
		seed(corpus);
	static char dir[] = "/tmp/baton-http-fuzz-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		abort();
	}
	static struct broker_config cfg;
	char err[512];
	broker_config_defaults(&cfg);
	snprintf(cfg.control, sizeof cfg.control, "ipc://%s/broker.sock", dir);
	snprintf(cfg.events, sizeof cfg.events, "ipc://%s/events.sock", dir);
	snprintf(cfg.state_file, sizeof cfg.state_file, "%s/broker.state", dir);
	cfg.state_file_set = true;
	cfg.nvml = false;
	snprintf(cfg.http_token, sizeof cfg.http_token, "%s", TOKEN);
	snprintf(cfg.http_hosts, sizeof cfg.http_hosts, "x"); /* the seeds' Host */
	if (broker_config_set_http(&cfg, "127.0.0.1:0", err, sizeof err) != 0 ||
	    broker_open(&cfg, &the_broker, err, sizeof err) != 0 ||
	    broker_http_open(the_broker, &cfg, &the_http, err, sizeof err) != 0 ||
	    broker_start(the_broker, err, sizeof err) != 0) {
		fprintf(stderr, "broker_http_fuzz: cannot start a broker: %s\n", err);
		abort();
	}
	const char *url = broker_http_url(the_http); /* http://127.0.0.1:PORT */
	const char *colon = url ? strrchr(url, ':') : NULL;
	if (!colon) {
		fprintf(stderr, "broker_http_fuzz: no HTTP address\n");
		abort();
	}
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t)atoi(colon + 1));
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	atexit(at_exit);
	check_unchanged();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char out[1 << 20];
	if (size > FUZZ_MAX_INPUT)
		return 0;
	n_inputs++;
	ssize_t n = exchange(data, size, out, sizeof out);
	if (n < 0) {
		fprintf(stderr, "cannot connect to the broker's HTTP server: %s\n", strerror(errno));
		abort();
	}
	if (n > 0) {
		int status = 0;
		if ((strncmp(out, "HTTP/1.1 ", 9) != 0 && strncmp(out, "HTTP/1.0 ", 9) != 0) ||
		    sscanf(out + 9, "%3d", &status) != 1 || status < 100) {
			fprintf(stderr, "not an HTTP response:\n%.500s\n", out);
			abort();
		}
		/* 505: libmicrohttpd's own answer to a request line with a bad version */
		if (status >= 500 && status != 505) {
			fprintf(stderr, "a %d for a request with no engine registered:\n--- request\n%.*s\n--- "
			    "response\n%.2000s\n", status, (int)(size < 2000 ? size : 2000), (const char *)data,
			    out);
			abort();
		}
	}
	if (n_inputs % 256 == 0)
		check_unchanged();
	return 0;
}
