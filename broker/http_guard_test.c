/*
 * http_guard_test.c: which mutating HTTP calls pass (Host, Origin, token,
 * Content-Type), table-driven; and the made token file (mode, owner,
 * refusals).
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/broker.h"
#include "tests/t.h"

#define JSON "application/json"
#define AUTH "Bearer s3cret"

struct row {
	const char *host, *origin, *ctype, *auth;
	int want;
};

static void check(const struct broker_http_guard *g, const struct row *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char msg[512] = "";
		int got = broker_http_guard_check(g, rows[i].host, rows[i].origin, rows[i].ctype, rows[i].auth, msg,
		    sizeof msg);
		T_ASSERT_MSG(got == rows[i].want, "row %zu (Host %s, Origin %s, Content-Type %s, %s): got %d, want %d: %s",
		    i, rows[i].host ? rows[i].host : "-", rows[i].origin ? rows[i].origin : "-",
		    rows[i].ctype ? rows[i].ctype : "-", rows[i].auth ? rows[i].auth : "-", got, rows[i].want, msg);
		T_ASSERT(got == 0 || msg[0]);
	}
}

static void t_loopback(void)
{
	struct broker_http_guard g;
	broker_http_guard_init(&g, "127.0.0.1", 8420, "", "s3cret");
	static const struct row rows[] = {
		{ "127.0.0.1:8420", NULL, JSON, AUTH, 0 },
		{ "127.0.0.1", NULL, JSON, AUTH, 0 },                 /* no port: the name is what counts */
		{ "localhost:8420", NULL, JSON, AUTH, 0 },
		{ "127.0.0.2:8420", NULL, JSON, AUTH, 0 },
		{ "[::1]:8420", NULL, JSON, AUTH, 0 },
		{ "127.0.0.1:8420", NULL, "application/json; charset=utf-8", AUTH, 0 },
		{ "127.0.0.1:8420", NULL, "Application/JSON", AUTH, 0 },
		{ "127.0.0.1:8420", NULL, JSON, "bearer s3cret", 0 },  /* RFC 7235: any case */
		{ "127.0.0.1:8420", NULL, JSON, "BEARER  s3cret", 0 },
		{ "127.0.0.1:8420", "http://127.0.0.1:8420", JSON, AUTH, 0 },
		{ "localhost:8420", "http://localhost:8420", JSON, AUTH, 0 },
		/* DNS rebinding: the page's own name */
		{ "evil.example:8420", NULL, JSON, AUTH, 403 },
		{ "evil.example", NULL, JSON, AUTH, 403 },
		{ "127.0.0.1:8421", NULL, JSON, AUTH, 403 },
		{ "10.0.0.1:8420", NULL, JSON, AUTH, 403 },
		{ NULL, NULL, JSON, AUTH, 403 },
		{ "", NULL, JSON, AUTH, 403 },
		{ "127.0.0.1:", NULL, JSON, AUTH, 403 },
		{ "127.0.0.1:x", NULL, JSON, AUTH, 403 },
		{ "::1", NULL, JSON, AUTH, 403 },
		/* cross-site */
		{ "127.0.0.1:8420", "http://evil.example", JSON, AUTH, 403 },
		{ "127.0.0.1:8420", "null", JSON, AUTH, 403 },
		{ "127.0.0.1:8420", "https://127.0.0.1:8420", JSON, AUTH, 403 },
		{ "127.0.0.1:8420", "http://127.0.0.1:8421", JSON, AUTH, 403 },
		{ "127.0.0.1:8420", "http://localhost:8420", JSON, AUTH, 403 },
		/* the token */
		{ "127.0.0.1:8420", NULL, JSON, NULL, 401 },
		{ "127.0.0.1:8420", NULL, JSON, "Bearer s3cre", 401 },
		{ "127.0.0.1:8420", NULL, JSON, "Bearer s3cretx", 401 },
		{ "127.0.0.1:8420", NULL, JSON, "Bearer s3cret x", 401 },
		{ "127.0.0.1:8420", NULL, JSON, "Basic s3cret", 401 },
		{ "127.0.0.1:8420", NULL, JSON, "Bearers3cret", 401 },
		{ "127.0.0.1:8420", NULL, JSON, "s3cret", 401 },
		/* what a form or a no-cors fetch can send */
		{ "127.0.0.1:8420", NULL, "text/plain", AUTH, 415 },
		{ "127.0.0.1:8420", NULL, "application/x-www-form-urlencoded", AUTH, 415 },
		{ "127.0.0.1:8420", NULL, "multipart/form-data; boundary=x", AUTH, 415 },
		{ "127.0.0.1:8420", NULL, "application/jsonp", AUTH, 415 },
		{ "127.0.0.1:8420", NULL, NULL, AUTH, 415 },
	};
	check(&g, rows, sizeof rows / sizeof rows[0]);
}

static void t_names_and_wildcard(void)
{
	struct broker_http_guard g;
	broker_http_guard_init(&g, "0.0.0.0", 8420, "gpu1.lab, [fd00::1] baton", "s3cret");
	static const struct row rows[] = {
		{ "gpu1.lab:8420", "http://gpu1.lab:8420", JSON, AUTH, 0 },
		{ "GPU1.LAB:8420", NULL, JSON, AUTH, 0 },
		{ "baton:8420", NULL, JSON, AUTH, 0 },
		{ "[fd00::1]:8420", NULL, JSON, AUTH, 0 },
		{ "10.1.2.3:8420", NULL, JSON, AUTH, 0 },      /* any address literal: this machine's */
		{ "gpu1:8420", NULL, JSON, AUTH, 403 },
		{ "lab:8420", NULL, JSON, AUTH, 403 },
		{ "gpu1.lab.evil:8420", NULL, JSON, AUTH, 403 },
		{ "0.0.0.0:8420", NULL, JSON, AUTH, 403 },
		{ "localhost:8420", NULL, JSON, AUTH, 0 },     /* kubectl port-forward */
	};
	check(&g, rows, sizeof rows / sizeof rows[0]);

	broker_http_guard_init(&g, "10.0.0.5", 9000, "", "s3cret");
	static const struct row rows2[] = {
		{ "10.0.0.5:9000", NULL, JSON, AUTH, 0 },
		{ "10.0.0.6:9000", NULL, JSON, AUTH, 403 },
		{ "localhost:9000", NULL, JSON, AUTH, 0 },
		{ "127.0.0.1:9000", NULL, JSON, AUTH, 403 },
	};
	check(&g, rows2, sizeof rows2 / sizeof rows2[0]);
}

static void t_no_token_refuses(void)
{
	struct broker_http_guard g;
	broker_http_guard_init(&g, "127.0.0.1", 8420, "", "");
	static const struct row rows[] = {
		{ "127.0.0.1:8420", NULL, JSON, NULL, 403 },
		{ "127.0.0.1:8420", NULL, JSON, "Bearer ", 403 },
		{ "127.0.0.1:8420", NULL, JSON, "Bearer x", 403 },
	};
	check(&g, rows, sizeof rows / sizeof rows[0]);
}

static void t_loopback_names(void)
{
	T_ASSERT(broker_http_loopback("127.0.0.1:8420"));
	T_ASSERT(broker_http_loopback("127.9.9.9:0"));
	T_ASSERT(broker_http_loopback("localhost:1"));
	T_ASSERT(broker_http_loopback("[::1]:0"));
	T_ASSERT(!broker_http_loopback("0.0.0.0:8420"));
	T_ASSERT(!broker_http_loopback("[::]:8420"));
	T_ASSERT(!broker_http_loopback("10.0.0.1:8420"));
	T_ASSERT(!broker_http_loopback("gpu1.lab:8420"));
	T_ASSERT(!broker_http_loopback("localhost.evil:8420"));
}

/* A made token: 64 hex digits, mode 0640, the same on the next start; a
 * token file others can read, a link, or nothing configured off loopback:
 * refused. */
static void t_token_file(void)
{
	char dir[] = "/tmp/baton-guard-XXXXXX", err[512], path[256], other[256];
	T_ASSERT(mkdtemp(dir));
	static struct broker_config c;
	broker_config_defaults(&c);
	snprintf(c.control, sizeof c.control, "ipc://%s/broker.sock", dir);
	snprintf(c.http, sizeof c.http, "127.0.0.1:0");
	T_ASSERT_MSG(broker_http_token_prepare(&c, err, sizeof err) == 0, "%s", err);
	snprintf(path, sizeof path, "%s/http.token", dir);
	T_ASSERT(strcmp(c.http_token_path, path) == 0);
	T_EQ_INT(strlen(c.http_token), 64);
	struct stat st;
	T_ASSERT(lstat(path, &st) == 0 && S_ISREG(st.st_mode));
	T_EQ_INT(st.st_mode & 0777, 0640);
	char first[BROKER_TOKEN_MAX];
	snprintf(first, sizeof first, "%s", c.http_token);
	c.http_token[0] = 0;
	T_EQ_INT(broker_http_token_prepare(&c, err, sizeof err), 0);
	T_ASSERT(strcmp(first, c.http_token) == 0);

	/* others can read it: refused */
	T_ASSERT(chmod(path, 0644) == 0);
	c.http_token[0] = 0;
	T_EQ_INT(broker_http_token_prepare(&c, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "any user"), "%s", err);
	T_EQ_INT(broker_config_token_file(&c, path, err, sizeof err), BATON_EPERM);
	/* a link where the token goes: not followed */
	snprintf(other, sizeof other, "%s/elsewhere", dir);
	T_ASSERT(rename(path, other) == 0 && chmod(other, 0600) == 0 && symlink(other, path) == 0);
	c.http_token[0] = 0;
	T_ASSERT(broker_http_token_prepare(&c, err, sizeof err) != 0);
	T_ASSERT(!c.http_token[0]);
	unlink(path);
	unlink(other);

	/* a configured token: nothing made */
	snprintf(c.http_token, sizeof c.http_token, "mine");
	T_EQ_INT(broker_http_token_prepare(&c, err, sizeof err), 0);
	T_ASSERT(!c.http_token_path[0] && access(path, F_OK) != 0);
	/* off loopback: a configured token or no start */
	snprintf(c.http, sizeof c.http, "0.0.0.0:8420");
	T_EQ_INT(broker_http_token_prepare(&c, err, sizeof err), 0);
	c.http_token[0] = 0;
	T_EQ_INT(broker_http_token_prepare(&c, err, sizeof err), BATON_ECONFIG);
	T_ASSERT_MSG(strstr(err, "not a loopback address"), "%s", err);
	/* a tcp:// control socket: no directory to make it in, nothing made */
	snprintf(c.http, sizeof c.http, "127.0.0.1:0");
	snprintf(c.control, sizeof c.control, "tcp://127.0.0.1:5555");
	T_EQ_INT(broker_http_token_prepare(&c, err, sizeof err), 0);
	T_ASSERT(!c.http_token[0] && !c.http_token_path[0]);
	rmdir(dir);
}

T_MAIN(T_CASE(t_loopback), T_CASE(t_names_and_wildcard), T_CASE(t_no_token_refuses), T_CASE(t_loopback_names),
    T_CASE(t_token_file))
