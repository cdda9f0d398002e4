/*
 * token_test.c: the token-file reader (http_token_read) that the broker
 * and baton-engine share: what it reads, what it refuses and why.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/http.h"
#include "tests/t.h"

static char dir[64];

static const char *put(const char *name, const char *text, mode_t mode)
{
	static char path[128];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	T_ASSERT(fd >= 0);
	T_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	T_ASSERT(chmod(path, mode) == 0);
	return path;
}

static void mkdir_tmp(void)
{
	snprintf(dir, sizeof dir, "/tmp/baton-token-XXXXXX");
	T_ASSERT(mkdtemp(dir));
}

/* The first line, its end dropped; group access is allowed. */
static void t_reads(void)
{
	mkdir_tmp();
	char tok[HTTP_TOKEN_FILE_MAX] = "", err[512];
	T_EQ_INT(http_token_read(put("a", "s3cret\nsecond line\n", 0600), tok, sizeof tok, err, sizeof err), 0);
	T_ASSERT(strcmp(tok, "s3cret") == 0);
	T_EQ_INT(http_token_read(put("b", "crlf-token\r\n", 0640), tok, sizeof tok, err, sizeof err), 0);
	T_ASSERT(strcmp(tok, "crlf-token") == 0);
	T_EQ_INT(http_token_read(put("c", "no-newline", 0400), tok, sizeof tok, err, sizeof err), 0);
	T_ASSERT(strcmp(tok, "no-newline") == 0);
}

/* Others may read or write it, a link, a directory, none: refused, and
 * the token given stays as it was. */
static void t_refuses(void)
{
	mkdir_tmp();
	char tok[HTTP_TOKEN_FILE_MAX] = "before", err[512], path[128], link[128];
	T_EQ_INT(http_token_read(put("r", "tok\n", 0644), tok, sizeof tok, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "any user") && strstr(err, "chmod o-rw"), "%s", err);
	T_EQ_INT(http_token_read(put("w", "tok\n", 0602), tok, sizeof tok, err, sizeof err), BATON_EPERM);
	snprintf(path, sizeof path, "%s", put("t", "tok\n", 0600));
	snprintf(link, sizeof link, "%s/link", dir);
	T_ASSERT(symlink(path, link) == 0);
	T_EQ_INT(http_token_read(link, tok, sizeof tok, err, sizeof err), BATON_EIO);
	T_ASSERT_MSG(strstr(err, link), "%s", err);
	T_EQ_INT(http_token_read(dir, tok, sizeof tok, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "not a regular file"), "%s", err);
	snprintf(path, sizeof path, "%s/none", dir);
	T_EQ_INT(http_token_read(path, tok, sizeof tok, err, sizeof err), BATON_EIO);
	T_ASSERT(strcmp(tok, "before") == 0);
}

/* Empty, a space or control character, longer than the buffer: refused. */
static void t_content(void)
{
	mkdir_tmp();
	char tok[HTTP_TOKEN_FILE_MAX] = "before", small[8], err[512], big[HTTP_TOKEN_FILE_MAX + 8];
	T_EQ_INT(http_token_read(put("e", "", 0600), tok, sizeof tok, err, sizeof err), BATON_EINVAL);
	T_EQ_INT(http_token_read(put("n", "\nafter\n", 0600), tok, sizeof tok, err, sizeof err), BATON_EINVAL);
	T_EQ_INT(http_token_read(put("s", "two words\n", 0600), tok, sizeof tok, err, sizeof err), BATON_EINVAL);
	T_EQ_INT(http_token_read(put("t", "tab\there\n", 0600), tok, sizeof tok, err, sizeof err), BATON_EINVAL);
	T_ASSERT_MSG(strstr(err, "visible ASCII"), "%s", err);
	T_EQ_INT(http_token_read(put("u", "ok-1234\n", 0600), small, sizeof small, err, sizeof err), 0);
	T_EQ_INT(http_token_read(put("v", "toolong1\n", 0600), small, sizeof small, err, sizeof err), BATON_EINVAL);
	memset(big, 'x', sizeof big - 2);
	big[sizeof big - 2] = '\n';
	big[sizeof big - 1] = 0;
	T_EQ_INT(http_token_read(put("w", big, 0600), tok, sizeof tok, err, sizeof err), BATON_EINVAL);
	big[HTTP_TOKEN_FILE_MAX - 1] = '\n';
	big[HTTP_TOKEN_FILE_MAX] = 0;
	T_EQ_INT(http_token_read(put("x", big, 0600), tok, sizeof tok, err, sizeof err), 0);
	T_EQ_INT(strlen(tok), HTTP_TOKEN_FILE_MAX - 1);
}

T_MAIN(T_CASE(t_reads), T_CASE(t_refuses), T_CASE(t_content))
