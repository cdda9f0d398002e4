/*
 * hostdev_fixture.h: a host device of the test's own (header only), for the
 * C tests that open the host backend: a fresh directory named by
 * BATON_HOSTDEV_DIR, so no test shares a device's state file with another
 * or with a running engine; removed at the next setup's cleanup or at exit.
 */
#ifndef BATON_TESTS_HOSTDEV_FIXTURE_H
#define BATON_TESTS_HOSTDEV_FIXTURE_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/t.h"

/* The directory of the current host device ("" when none). */
static char hostdev_dir[64];
/* Only the process that made it removes it (cases fork children that exit). */
static pid_t hostdev_dir_owner;

/* Removes the directory and the files in it; idempotent. */
static inline void hostdev_cleanup(void)
{
	if (!hostdev_dir[0] || getpid() != hostdev_dir_owner)
		return;
	DIR *d = opendir(hostdev_dir);
	if (d) {
		struct dirent *e;
		char p[512];
		while ((e = readdir(d)))
			if (e->d_name[0] != '.') {
				snprintf(p, sizeof p, "%s/%s", hostdev_dir, e->d_name);
				unlink(p);
			}
		closedir(d);
	}
	rmdir(hostdev_dir);
	hostdev_dir[0] = '\0';
}

/* A fresh /tmp/baton-<tag>-XXXXXX as BATON_HOSTDEV_DIR (the one before, if
 * any, is removed first); the size and verify settings of the environment
 * are dropped so the test decides them. */
static inline void hostdev_setup(const char *tag)
{
	static int registered;
	hostdev_cleanup();
	snprintf(hostdev_dir, sizeof hostdev_dir, "/tmp/baton-%s-XXXXXX", tag);
	T_ASSERT_MSG(mkdtemp(hostdev_dir) != NULL, "mkdtemp %s", hostdev_dir);
	hostdev_dir_owner = getpid();
	if (!registered++)
		atexit(hostdev_cleanup);
	setenv("BATON_HOSTDEV_DIR", hostdev_dir, 1);
	unsetenv("BATON_HOSTDEV_MIB");
	unsetenv("BATON_VERIFY_REFILL");
}

#endif
