/*
 * door_cmd.c: the CLI through the broker's front door (HTTP): `baton
 * models`, and the requests of `baton chat` and `baton complete` by model
 * name (door_cmd.h). A small blocking HTTP/1.1 client: one request per
 * connection (Connection: close), a reply read whole.
 *
 * The door's address: --http URL, else $BATON_HTTP, else the broker's
 * default (BROKER_DEFAULT_HTTP). Its token (POSTs need it): --token-file,
 * else http.token beside an ipc:// control socket (--broker, $BATON_BROKER,
 * or the default), which the broker makes there.
 */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>

#include <jansson.h>

#include "broker/broker.h"
#include "broker/cli/cli.h"
#include "broker/cli/door_cmd.h"
#include "http/http.h"

void door_addr(const char *flag, char *out, size_t n)
{
	const char *v = flag;
	if (!v || !*v)
		v = getenv("BATON_HTTP");
	if (!v || !*v)
		v = BROKER_DEFAULT_HTTP;
	if (strncmp(v, "http://", 7) == 0)
		v += 7;
	snprintf(out, n, "%s", v);
	size_t l = strlen(out);
	while (l && out[l - 1] == '/')
		out[--l] = 0;
}

void door_token(const char *broker, const char *token_file, char *out, size_t n)
{
	out[0] = 0;
	char path[600], err[300];
	if (token_file) {
		snprintf(path, sizeof path, "%s", token_file);
	} else {
		const char *b = broker && *broker ? broker : getenv("BATON_BROKER");
		if (!b || !*b)
			b = BROKER_DEFAULT_CONTROL;
		if (strncmp(b, "ipc://", 6) != 0)
			return;
		snprintf(path, sizeof path, "%s", b + 6);
		char *slash = strrchr(path, '/');
		if (!slash)
			return;
		snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "http.token");
	}
	if (http_token_read(path, out, n, err, sizeof err) != 0)
		out[0] = 0; /* none: GETs work, POSTs get the door's 401 */
}

static int connect_to(const char *addr, int timeout_ms, char *err, size_t errlen)
{
	char host[256], port[16];
	const char *colon = strrchr(addr, ':');
	if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host || strlen(colon + 1) >= sizeof port) {
		snprintf(err, errlen, "'%s': want HOST:PORT", addr);
		return -1;
	}
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = 0;
	snprintf(port, sizeof port, "%s", colon + 1);
	char *h = host;
	if (h[0] == '[') { /* [::1] */
		h++;
		h[strlen(h) - 1] = 0;
	}
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	int rc = getaddrinfo(h, port, &hints, &res);
	if (rc) {
		snprintf(err, errlen, "%s: %s", addr, gai_strerror(rc));
		return -1;
	}
	int fd = -1;
	for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
		if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
			snprintf(err, errlen, "nothing listens at http://%s (%s)", addr, strerror(errno));
			close(fd);
			fd = -1;
		}
	}
	freeaddrinfo(res);
	(void)timeout_ms;
	return fd;
}

int door_http(const char *addr, const char *method, const char *path, const char *token, const char *body,
    int timeout_ms, int *status, char **reply, char *err, size_t errlen)
{
	*reply = NULL;
	*status = 0;
	int fd = connect_to(addr, timeout_ms, err, errlen);
	if (fd < 0)
		return BATON_ECONN;
	size_t blen = body ? strlen(body) : 0;
	char head[1024];
	int hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s%s%s"
	    "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n", method, path, addr,
	    token && *token ? "Authorization: Bearer " : "", token && *token ? token : "", token && *token ? "\r\n" : "",
	    blen);
	int rc = 0;
	if (write(fd, head, (size_t)hn) != hn || (blen && write(fd, body, blen) != (ssize_t)blen)) {
		snprintf(err, errlen, "cannot send to http://%s: %s", addr, strerror(errno));
		close(fd);
		return BATON_ECONN;
	}
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap);
	double deadline = baton_now_s() + timeout_ms / 1e3;
	for (;;) {
		if (!buf) {
			rc = BATON_ENOMEM;
			break;
		}
		int left = (int)((deadline - baton_now_s()) * 1e3);
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&pf, 1, left) <= 0) {
			snprintf(err, errlen, "no answer from http://%s within %d ms (--timeout)", addr, timeout_ms);
			rc = BATON_ETIMEDOUT;
			break;
		}
		if (len + 1 >= cap) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				rc = BATON_ENOMEM;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0) {
			snprintf(err, errlen, "http://%s: %s", addr, strerror(errno));
			rc = BATON_ECONN;
			break;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[len] = 0;
	char *sep = strstr(buf, "\r\n\r\n");
	if (strncmp(buf, "HTTP/1.", 7) != 0 || !sep || sscanf(buf + 8, " %d", status) != 1) {
		snprintf(err, errlen, "http://%s did not answer HTTP", addr);
		free(buf);
		return BATON_EMSG;
	}
	*sep = 0;
	bool chunked = strcasestr(buf, "\r\nTransfer-Encoding: chunked") != NULL;
	char *b = sep + 4;
	if (chunked) { /* de-chunk in place */
		char *w = b, *r = b;
		for (;;) {
			char *end;
			unsigned long n = strtoul(r, &end, 16);
			char *nl = strstr(end, "\r\n");
			if (!nl || n == 0)
				break;
			r = nl + 2;
			if (strlen(r) < n)
				n = strlen(r);
			memmove(w, r, n);
			w += n;
			r += n;
			if (strncmp(r, "\r\n", 2) == 0)
				r += 2;
		}
		*w = 0;
	}
	*reply = strdup(b);
	free(buf);
	return *reply ? 0 : BATON_ENOMEM;
}

/* ---- baton models ------------------------------------------------------------ */

static const char models_usage[] =
    "usage: baton models [--json] [--http ADDR] [--timeout T]\n"
    "\n"
    "  every model the broker's front door serves or may start (its [model]\n"
    "  sections): state, device, memory, requests, engine, restarts\n"
    "\n"
    "  --http ADDR   the broker's HTTP address (else $BATON_HTTP, else " BROKER_DEFAULT_HTTP ")\n"
    "  --json        GET /v1/models as it is\n";

int models_cmd_main(int argc, char **argv)
{
	const char *http = NULL;
	int json_out = 0, timeout_ms = 10000;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json_out = 1;
		} else if (!strcmp(argv[i], "--http") && i + 1 < argc) {
			http = argv[++i];
		} else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			char *end;
			double s = strtod(argv[++i], &end);
			double mul = !strcmp(end, "ms") ? 1e-3 : (!*end || !strcmp(end, "s")) ? 1 : -1;
			if (mul < 0 || !(s > 0) || s * mul > 86400) {
				fprintf(stderr, "baton: models: --timeout '%s': want seconds (10, 10s, 500ms)\n", argv[i]);
				return EXIT_USAGE;
			}
			timeout_ms = (int)(s * mul * 1000 + 0.5);
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			fputs(models_usage, stdout);
			return EXIT_DONE;
		} else {
			fprintf(stderr, "baton: models: unexpected '%s' (baton models --help)\n", argv[i]);
			return EXIT_USAGE;
		}
	}
	char addr[300], err[512];
	door_addr(http, addr, sizeof addr);
	int st;
	char *body;
	int rc = door_http(addr, "GET", "/v1/models", NULL, NULL, timeout_ms, &st, &body, err, sizeof err);
	if (rc) {
		fprintf(stderr, "baton: models: %s (the broker's HTTP address: --http ADDR or $BATON_HTTP)\n", err);
		return EXIT_FAILED;
	}
	json_error_t je;
	json_t *j = json_loads(body, 0, &je);
	json_t *data = json_object_get(j, "data");
	if (st != 200 || !json_is_array(data)) {
		fprintf(stderr, "baton: models: http://%s/v1/models answered %d: %.300s\n", addr, st, body);
		free(body);
		json_decref(j);
		return EXIT_FAILED;
	}
	if (json_out) {
		puts(body);
	} else {
		printf("%-20s %-10s %-12s %10s %7s %7s %6s %6s %-10s %s\n", "MODEL", "STATE", "DEVICE", "MEMORY", "SERVED",
		    "FAILED", "QUEUED", "ACTIVE", "ENGINE", "RESTARTS");
		size_t i;
		json_t *m;
		json_array_foreach(data, i, m) {
			json_t *fl = json_object_get(m, "fleet"), *engs = json_object_get(m, "engines");
			json_t *e0 = json_array_get(engs, 0), *req = json_object_get(m, "requests");
			const char *dev = e0 ? json_string_value(json_object_get(e0, "gpu")) :
			    fl ? json_string_value(json_object_get(fl, "device")) : NULL;
			uint64_t mem = 0, active = 0;
			size_t k;
			json_t *e;
			json_array_foreach(engs, k, e) {
				mem += (uint64_t)json_integer_value(json_object_get(e, "resident"));
				active += (uint64_t)json_integer_value(json_object_get(e, "in_flight"));
			}
			char mb[32], eng[64] = "-", rs[32] = "-";
			if (e0)
				snprintf(eng, sizeof eng, "%s", json_string_value(json_object_get(e0, "name")));
			if (fl) {
				long long pid = json_integer_value(json_object_get(fl, "pid"));
				if (pid > 0)
					snprintf(eng + strlen(eng), sizeof eng - strlen(eng), " (%lld)", pid);
				long long starts = json_integer_value(json_object_get(fl, "starts"));
				snprintf(rs, sizeof rs, "%lld", starts > 0 ? starts - 1 : 0);
			}
			printf("%-20s %-10s %-12s %10s %7lld %7lld %6lld %6llu %-10s %s\n",
			    json_string_value(json_object_get(m, "id")), json_string_value(json_object_get(m, "state")),
			    dev ? dev : "-", cli_fmt_bytes(mem, mb, sizeof mb),
			    json_integer_value(json_object_get(req, "served")), json_integer_value(json_object_get(req, "failed")),
			    json_integer_value(json_object_get(m, "queued")), (unsigned long long)active, eng, rs);
			const char *why = fl ? json_string_value(json_object_get(fl, "error")) : NULL;
			if (why)
				printf("  failed: %s\n", why);
		}
	}
	free(body);
	json_decref(j);
	return fflush(stdout) == 0 ? EXIT_DONE : EXIT_FAILED;
}
