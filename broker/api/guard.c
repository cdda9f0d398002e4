/*
 * guard.c: the broker's HTTP token (docs/internals/security.md).
 *
 * Loopback TCP is no permission boundary: any local user, and any web page
 * in a browser on the machine, can reach 127.0.0.1. So a mutating call
 * needs the broker's bearer token, made at first start when none is
 * configured, readable by the service's group only. The checks themselves
 * (Host, Origin, token, Content-Type, before a body is read) are http/'s
 * (http/guard.c).
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

#include "broker/api/api.h"
#include "http/http.h"

bool broker_http_loopback(const char *hostport)
{
	return http_is_loopback(hostport) != 0;
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
