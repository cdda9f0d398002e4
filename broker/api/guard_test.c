/*
 * guard_test.c: the made token file (mode, owner, refusals) and which
 * addresses are loopback. Which requests pass the header checks is
 * http/guard_test.c's.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/api/api.h"
#include "tests/t.h"

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

T_MAIN(T_CASE(t_loopback_names), T_CASE(t_token_file))
