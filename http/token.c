/*
 * token.c: the one reader of a bearer-token file (http.h), for the broker
 * ([broker] http_token_file, --http-token-file, its made http.token) and
 * for baton-engine --http-token-file (docs/security.md).
 *
 * A secret others can read is no secret, and a link may point anywhere:
 * the file is opened without following a final symlink, must be a regular
 * file that no other user may read or write (group access is for the
 * service's group), and its first line is the token.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

#include "http/http.h"

int http_token_read(const char *path, char *tok, size_t n, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
	if (!f) {
		snprintf(err, errlen, "%s: cannot open the token file: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return BATON_EIO;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & (S_IROTH | S_IWOTH))) {
		snprintf(err, errlen, "%s: the token file %s (chmod o-rw %s)", path,
		    S_ISREG(st.st_mode) ? "can be read or written by any user" : "is not a regular file", path);
		fclose(f);
		return BATON_EPERM;
	}
	char line[HTTP_TOKEN_FILE_MAX + 2];
	size_t cap = n < HTTP_TOKEN_FILE_MAX ? n : HTTP_TOKEN_FILE_MAX; /* with the NUL */
	if (!fgets(line, sizeof line, f))
		line[0] = 0;
	fclose(f);
	size_t len = strcspn(line, "\r\n");
	/* one line: its end seen, or the file ends within the buffer */
	bool ok = cap > 1 && len > 0 && len < cap && (line[len] || strlen(line) < sizeof line - 1);
	for (size_t i = 0; ok && i < len; i++)
		ok = line[i] > ' ' && line[i] < 127;
	if (!ok) {
		snprintf(err, errlen, "%s: the token must be one line of 1 to %zu visible ASCII characters", path,
		    cap ? cap - 1 : 0);
		return BATON_EINVAL;
	}
	memcpy(tok, line, len);
	tok[len] = 0;
	return 0;
}
