/*
 * trust.c: which files a process may take as its own (issue 28). Whoever
 * can write a directory can put their own file at a name a root process
 * opens there, or a link to any file; so a directory that holds what a
 * process loads or accounts in (arenas, host device files) must be a real
 * one, owned by this user or root, and writable by nobody else (root's
 * sticky directories, /dev/shm and /tmp, excepted: others cannot rename or
 * remove our files there). The file itself is opened without following a
 * link and must be a regular file of this user or root that others cannot
 * write (the group may: the service group).
 */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/base/base.h"

int baton_trust_dir(const char *dir, const char *what, char *errbuf, size_t errlen)
{
	/* "link/" (or "link//x.arena"'s directory): lstat would follow the
	 * link, so the trailing slashes go */
	char buf[PATH_MAX];
	size_t n = strlen(dir);
	if (n >= sizeof buf)
		return baton_fail(errbuf, errlen, BATON_EINVAL, "%.64s...: path too long", dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	memcpy(buf, dir, n);
	buf[n] = '\0';
	dir = buf;
	struct stat st;
	if (lstat(dir, &st) != 0)
		return baton_fail(errbuf, errlen, errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO,
		    "%s: %s", dir, strerror(errno));
	if (S_ISLNK(st.st_mode))
		return baton_fail(errbuf, errlen, BATON_EPERM,
		    "%s %s is a symbolic link: refusing it (use the real path)", what, dir);
	if (!S_ISDIR(st.st_mode))
		return baton_fail(errbuf, errlen, BATON_EINVAL, "%s: not a directory", dir);
	uid_t me = geteuid();
	if (st.st_uid != me && st.st_uid != 0)
		return baton_fail(errbuf, errlen, BATON_EPERM,
		    "%s %s belongs to uid %u, not to this user (uid %u) or root: "
		    "another user could replace the files in it; remove it or use another path",
		    what, dir, (unsigned)st.st_uid, (unsigned)me);
	if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_uid == 0 && (st.st_mode & S_ISVTX)))
		return baton_fail(errbuf, errlen, BATON_EPERM,
		    "%s %s is writable by %s (mode %04o): others could replace "
		    "the files in it; chmod go-w %s",
		    what, dir, (st.st_mode & S_IWOTH) ? "others" : "its group",
		    (unsigned)(st.st_mode & 07777), dir);
	return 0;
}

int baton_trust_dir_of(const char *path, const char *what, char *errbuf, size_t errlen)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	if (!slash)
		return baton_trust_dir(".", what, errbuf, errlen);
	size_t n = slash == path ? 1 : (size_t)(slash - path);
	if (n >= sizeof dir)
		return baton_fail(errbuf, errlen, BATON_EINVAL, "%s: path too long", path);
	memcpy(dir, path, n);
	dir[n] = '\0';
	return baton_trust_dir(dir, what, errbuf, errlen);
}

int baton_trust_file(int fd, const char *path, char *errbuf, size_t errlen)
{
	struct stat st;
	if (fstat(fd, &st) != 0)
		return baton_fail(errbuf, errlen, BATON_EIO, "%s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return baton_fail(errbuf, errlen, BATON_EIO, "%s: not a regular file", path);
	if (st.st_uid != geteuid() && st.st_uid != 0)
		return baton_fail(errbuf, errlen, BATON_EPERM,
		    "%s: belongs to uid %u, not to this user (uid %u) or root: refusing a "
		    "file another user wrote", path, (unsigned)st.st_uid, (unsigned)geteuid());
	if (st.st_mode & S_IWOTH)
		return baton_fail(errbuf, errlen, BATON_EPERM,
		    "%s: writable by others (mode %04o): refusing it; chmod o-w %s", path,
		    (unsigned)(st.st_mode & 07777), path);
	return 0;
}
