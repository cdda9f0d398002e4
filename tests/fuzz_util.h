/*
 * fuzz_util.h: what the libFuzzer targets share: seeding an empty corpus
 * directory given on the command line.
 */
#ifndef BATON_TESTS_FUZZ_UTIL_H
#define BATON_TESTS_FUZZ_UTIL_H

#include <dirent.h>
#include <stdbool.h>
#include <string.h>

/* The first corpus directory of the command line when it is empty (the
 * target seeds it then), else NULL. */
static inline const char *fuzz_empty_corpus(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (a[0] == '-')
			continue;
		DIR *d = opendir(a);
		if (!d)
			return NULL;
		struct dirent *e;
		bool empty = true;
		while ((e = readdir(d)) != NULL)
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				empty = false;
		closedir(d);
		return empty ? a : NULL;
	}
	return NULL;
}

#endif
