/*
 * arena_util.h: helpers the arena's C tests share (header only): temporary
 * folders, whole-file reads and writes, what the process has mapped and
 * open, and a small synthetic arena.
 */
#ifndef BATON_TESTS_ARENA_UTIL_H
#define BATON_TESTS_ARENA_UTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena/arena.h"
#include "tests/t.h"

/* A fresh folder under /dev/shm when it is there (where arenas live), else
 * under $TMPDIR or /tmp; removed by au_rmdir. */
static inline void au_tmpdir(char *buf, size_t len)
{
	const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR");
	snprintf(buf, len, "%s/baton-arena-test.XXXXXX", base ? base : "/tmp");
	T_ASSERT_MSG(mkdtemp(buf) != NULL, "mkdtemp %s", buf);
}

/* Removes the files of a flat folder, then the folder. */
static inline void au_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *de;
	while ((de = readdir(d)) != NULL)
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(dirfd(d), de->d_name, 0);
	closedir(d);
	rmdir(dir);
}

static inline uint8_t *au_read(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	T_ASSERT_MSG(f != NULL, "open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
	T_ASSERT(b != NULL);
	T_ASSERT(fread(b, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return b;
}

static inline void au_write(const char *path, const void *b, size_t len)
{
	FILE *f = fopen(path, "wb");
	T_ASSERT_MSG(f != NULL, "create %s", path);
	T_ASSERT(len == 0 || fwrite(b, 1, len, f) == len);
	T_ASSERT(fclose(f) == 0);
}

/* How many of this process's mappings are of `path`. */
static inline int au_mapped(const char *path)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[PATH_MAX + 256];
	int n = 0;
	size_t pl = strlen(path);
	T_ASSERT(f != NULL);
	while (fgets(line, sizeof line, f)) {
		size_t l = strlen(line);
		while (l && (line[l - 1] == '\n' || line[l - 1] == ' '))
			line[--l] = '\0';
		if (l >= pl && strcmp(line + l - pl, path) == 0)
			n++;
	}
	fclose(f);
	return n;
}

static inline int au_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;
	T_ASSERT(d != NULL);
	while (readdir(d))
		n++;
	closedir(d);
	return n;
}

static inline struct baton_synth_params au_small(void)
{
	struct baton_synth_params p = {
		.layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 128,
		.dtype = BATON_DT_F16, .seed = 7,
	};
	return p;
}

static inline void au_create(const char *path, const struct baton_synth_params *p)
{
	char err[512] = "";
	int rc = arena_create_synthetic(path, p, 1, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "create %s: %s (%s)", path, baton_errname(rc), err);
}

#endif
