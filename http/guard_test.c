/*
 * guard_test.c: which requests pass the header checks (Host, Origin,
 * token, Content-Type, size), table-driven.
 */
#include <stdio.h>
#include <string.h>

#include "http/http_int.h"
#include "tests/t.h"

#define JSON "application/json"
#define AUTH "Bearer s3cret"

struct row {
	const char *host, *origin, *ctype, *auth;
	int want;
};

/* Each row as a POST with a 2-byte body, then (want 0 rows) as a GET. */
static void check(const struct http_guard *g, const struct row *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char msg[512] = "";
		bool authorized;
		int err;
		struct http_guard_in in = { .method = "POST", .host = rows[i].host, .origin = rows[i].origin,
			.ctype = rows[i].ctype, .auth = rows[i].auth, .clen = "2" };
		int got = http_guard_check(g, &in, &authorized, &err, msg, sizeof msg);
		T_ASSERT_MSG(got == rows[i].want, "row %zu (Host %s, Origin %s, Content-Type %s, %s): got %d, want %d: %s",
		    i, rows[i].host ? rows[i].host : "-", rows[i].origin ? rows[i].origin : "-",
		    rows[i].ctype ? rows[i].ctype : "-", rows[i].auth ? rows[i].auth : "-", got, rows[i].want, msg);
		T_ASSERT(got == 0 || msg[0]);
		T_ASSERT(got != 401 || (!authorized && err == BATON_EPERM));
		T_ASSERT(got != 415 || err == BATON_EUNSUPPORTED);
	}
}

static void init(struct http_guard *g, const char *host, unsigned port, const char *const *names, const char *tok,
    bool reads)
{
	T_EQ_INT(http_guard_init(g, host, port, names, tok, reads, 1000), 0);
}

static void t_loopback(void)
{
	struct http_guard g;
	init(&g, "127.0.0.1", 8420, NULL, "s3cret", false);
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
	struct http_guard g;
	const char *const names[] = { "gpu1.lab", "[fd00::1]", "baton", NULL };
	init(&g, "0.0.0.0", 8420, names, "s3cret", false);
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

	init(&g, "10.0.0.5", 9000, NULL, "s3cret", false);
	static const struct row rows2[] = {
		{ "10.0.0.5:9000", NULL, JSON, AUTH, 0 },
		{ "10.0.0.6:9000", NULL, JSON, AUTH, 403 },
		{ "localhost:9000", NULL, JSON, AUTH, 0 },
		{ "127.0.0.1:9000", NULL, JSON, AUTH, 403 },
	};
	check(&g, rows2, sizeof rows2 / sizeof rows2[0]);
	init(&g, "::1", 9000, NULL, NULL, false);
	static const struct row rows3[] = {
		{ "[::1]:9000", NULL, JSON, NULL, 0 },         /* no token set: none needed */
		{ "127.0.0.1:9000", NULL, JSON, NULL, 0 },
		{ "evil.example:9000", NULL, JSON, NULL, 403 },
	};
	check(&g, rows3, sizeof rows3 / sizeof rows3[0]);
	/* too many or too long names: refused at init */
	const char *many[HTTP_NAMES_MAX + 2];
	for (int i = 0; i <= HTTP_NAMES_MAX; i++)
		many[i] = "n";
	many[HTTP_NAMES_MAX + 1] = NULL;
	T_EQ_INT(http_guard_init(&g, "127.0.0.1", 1, many, NULL, false, 1), -1);
}

/* Reads are open unless token_for_reads; size is checked first, whatever
 * the method; a bodyless POST needs no Content-Type. */
static void t_reads_and_size(void)
{
	struct http_guard g;
	char msg[256];
	bool authorized;
	int err;
	init(&g, "127.0.0.1", 8420, NULL, "s3cret", false);
	/* reads are open, but only on this server's Host (DNS rebinding reads
	 * pids and URLs), or none (no browser sends none) */
	struct http_guard_in get = { .method = "GET", .host = "evil.example", .origin = "http://evil.example" };
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 403);
	get.auth = AUTH;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 403);
	get.host = "127.0.0.1:8420";
	get.auth = NULL;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 0);
	T_ASSERT(!authorized);
	get.auth = AUTH;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 0);
	T_ASSERT(authorized);
	get.host = NULL;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 0);
	get.method = "HEAD";
	get.host = "evil.example";
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 403);
	struct http_guard_in big = { .method = "POST", .host = "evil.example", .clen = "1001" };
	T_EQ_INT(http_guard_check(&g, &big, &authorized, &err, msg, sizeof msg), 413);
	T_EQ_INT(err, BATON_ETOOBIG);
	big.clen = "1000";
	T_EQ_INT(http_guard_check(&g, &big, &authorized, &err, msg, sizeof msg), 403); /* then the Host */
	struct http_guard_in empty = { .method = "POST", .host = "127.0.0.1:8420", .auth = AUTH, .clen = "0" };
	T_EQ_INT(http_guard_check(&g, &empty, &authorized, &err, msg, sizeof msg), 0);
	struct http_guard_in chunked = { .method = "POST", .host = "127.0.0.1:8420", .auth = AUTH, .te = "chunked" };
	T_EQ_INT(http_guard_check(&g, &chunked, &authorized, &err, msg, sizeof msg), 415);

	init(&g, "127.0.0.1", 8420, NULL, "s3cret", true);
	get.auth = NULL;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 403); /* Host, now */
	get.host = "127.0.0.1:8420";
	get.origin = NULL;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 401);
	get.auth = AUTH;
	T_EQ_INT(http_guard_check(&g, &get, &authorized, &err, msg, sizeof msg), 0);
}

static void t_loopback_names(void)
{
	T_ASSERT(http_is_loopback("127.0.0.1:8420"));
	T_ASSERT(http_is_loopback("127.9.9.9:0"));
	T_ASSERT(http_is_loopback("localhost:1"));
	T_ASSERT(http_is_loopback("[::1]:0"));
	T_ASSERT(!http_is_loopback("0.0.0.0:8420"));
	T_ASSERT(!http_is_loopback("[::]:8420"));
	T_ASSERT(!http_is_loopback("10.0.0.1:8420"));
	T_ASSERT(!http_is_loopback("gpu1.lab:8420"));
	T_ASSERT(!http_is_loopback("localhost.evil:8420"));
}

/* Two Content-Length headers (RFC 9112 6.3), two Hosts, or a length with
 * Transfer-Encoding: 400 before anything else, on reads too, whether the
 * values agree or not. */
static void t_framing(void)
{
	struct http_guard g;
	init(&g, "127.0.0.1", 8420, NULL, "s3cret", false);
	char msg[512];
	bool authorized;
	int err;
	struct http_guard_in in = { .method = "POST", .host = "127.0.0.1:8420", .ctype = JSON, .auth = AUTH,
		.clen = "2", .n_clen = 2, .n_host = 1 };
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 400);
	T_EQ_INT(err, BATON_EMSG);
	T_ASSERT_MSG(strstr(msg, "2 Content-Length headers"), "%s", msg);
	in.method = "GET";
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 400);
	in.n_clen = 1;
	in.n_host = 2;
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 400);
	T_ASSERT_MSG(strstr(msg, "2 Host headers"), "%s", msg);
	in.n_host = 1;
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 0);
	in.method = "POST";
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 0);
	/* a length and chunks: which one frames the body is the reader's guess */
	in.te = "chunked";
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 400);
	T_ASSERT_MSG(strstr(msg, "both Content-Length and Transfer-Encoding"), "%s", msg);
	in.clen = NULL;
	in.n_clen = 0;
	T_EQ_INT(http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg), 0);
}

/* CORS origins pass the Origin check, the token still asked for; others
 * do not; a list that is not exact origins is refused. */
static void t_cors(void)
{
	struct http_guard g;
	init(&g, "127.0.0.1", 8420, NULL, "s3cret", false);
	static const char *const ok[] = { "https://ui.example", "http://localhost:3000", NULL };
	T_EQ_INT(http_guard_set_cors(&g, ok), 0);
	static const struct row rows[] = {
		{ "127.0.0.1:8420", "https://ui.example", JSON, AUTH, 0 },
		{ "127.0.0.1:8420", "HTTPS://UI.EXAMPLE", JSON, AUTH, 0 },
		{ "127.0.0.1:8420", "http://localhost:3000", JSON, AUTH, 0 },
		{ "127.0.0.1:8420", "https://ui.example", JSON, NULL, 401 },   /* the token still counts */
		{ "127.0.0.1:8420", "https://ui.example.evil", JSON, AUTH, 403 },
		{ "127.0.0.1:8420", "http://localhost:3001", JSON, AUTH, 403 },
		{ "evil.example", "https://ui.example", JSON, AUTH, 403 },     /* the Host first */
	};
	check(&g, rows, sizeof rows / sizeof rows[0]);
	T_ASSERT(http_guard_cors(&g, "https://ui.example") && !http_guard_cors(&g, NULL));
	static const char *const bad[][2] = { { "https://*.example", NULL }, { "ui.example", NULL },
		{ "https://ui.example/path", NULL }, { "https://", NULL }, { "https://a, https://b", NULL } };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		T_EQ_INT(http_guard_set_cors(&g, bad[i]), -1);
	T_EQ_INT(http_guard_set_cors(&g, NULL), 0);
	T_ASSERT(!http_guard_cors(&g, "https://ui.example"));
}

/* x-api-key (Anthropic's clients) is the token when no Authorization came;
 * an Authorization, when there, decides. */
static void t_api_key(void)
{
	struct http_guard g;
	init(&g, "127.0.0.1", 8420, NULL, "s3cret", false);
	static const struct { const char *auth, *key; int want; } rows[] = {
		{ NULL, "s3cret", 0 },
		{ NULL, " s3cret", 0 },
		{ NULL, "s3cre", 401 },
		{ NULL, "s3cretx", 401 },
		{ NULL, "Bearer s3cret", 401 },
		{ NULL, "", 401 },
		{ "Bearer s3cret", "wrong", 0 },
		{ "Bearer wrong", "s3cret", 401 },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		char msg[512] = "";
		bool authorized;
		int err;
		struct http_guard_in in = { .method = "POST", .host = "127.0.0.1:8420", .ctype = JSON,
			.auth = rows[i].auth, .api_key = rows[i].key, .clen = "2" };
		int got = http_guard_check(&g, &in, &authorized, &err, msg, sizeof msg);
		T_ASSERT_MSG(got == rows[i].want, "row %zu: got %d, want %d: %s", i, got, rows[i].want, msg);
	}
}

T_MAIN(T_CASE(t_api_key), T_CASE(t_cors), T_CASE(t_loopback), T_CASE(t_names_and_wildcard), T_CASE(t_reads_and_size), T_CASE(t_loopback_names),
    T_CASE(t_framing))
