/*
 * source.c: where a [model]'s weights are (broker.h, broker_model_source):
 * a path, or a repo id in the local Hugging Face cache, laid out as
 * `huggingface-cli download` leaves it:
 *
 *   HUB/models--ORG--NAME/refs/main            the commit of the main branch
 *   HUB/models--ORG--NAME/snapshots/COMMIT/    the files (links into blobs/)
 *
 * HUB is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub (huggingface_hub's own order). Nothing is
 * downloaded: a repo not in the cache is an error that says how to get it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "broker/broker.h"

static int hub_dir(char *out, size_t n)
{
	const char *v;
	if ((v = getenv("HF_HUB_CACHE")) && *v)
		snprintf(out, n, "%s", v);
	else if ((v = getenv("HF_HOME")) && *v)
		snprintf(out, n, "%s/hub", v);
	else if ((v = getenv("XDG_CACHE_HOME")) && *v)
		snprintf(out, n, "%s/huggingface/hub", v);
	else if ((v = getenv("HOME")) && *v)
		snprintf(out, n, "%s/.cache/huggingface/hub", v);
	else
		return -1;
	return 0;
}

static bool ends_with(const char *s, const char *tail)
{
	size_t a = strlen(s), b = strlen(tail);
	return a >= b && strcmp(s + a - b, tail) == 0;
}

/* A folder with config.json and at least one .safetensors file. */
static int check_hf_dir(const char *dir, char *err, size_t errlen)
{
	char p[PATH_MAX];
	snprintf(p, sizeof p, "%s/config.json", dir);
	if (access(p, R_OK) != 0) {
		snprintf(err, errlen, "%s has no readable config.json (not a Hugging Face model folder)", dir);
		return BATON_EINVAL;
	}
	DIR *d = opendir(dir);
	if (!d) {
		snprintf(err, errlen, "%s: %s", dir, strerror(errno));
		return BATON_EIO;
	}
	bool st = false;
	struct dirent *de;
	while ((de = readdir(d)) && !st)
		st = ends_with(de->d_name, ".safetensors");
	closedir(d);
	if (!st) {
		snprintf(err, errlen, "%s has no .safetensors file", dir);
		return BATON_EINVAL;
	}
	return 0;
}

static int from_path(struct broker_model_conf *m, const char *path, char *err, size_t errlen)
{
	struct stat sb;
	if (stat(path, &sb) != 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return BATON_ENOTFOUND;
	}
	if (strlen(path) >= sizeof m->path) {
		snprintf(err, errlen, "the path is longer than %zu bytes", sizeof m->path - 1);
		return BATON_EINVAL;
	}
	if (S_ISDIR(sb.st_mode)) {
		int rc = check_hf_dir(path, err, errlen);
		if (rc)
			return rc;
		m->kind = BROKER_SRC_HF;
	} else if (S_ISREG(sb.st_mode)) {
		char magic[8] = { 0 };
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		ssize_t got = fd >= 0 ? read(fd, magic, 4) : -1;
		if (fd >= 0)
			close(fd);
		if (got == 4 && memcmp(magic, "GGUF", 4) == 0) {
			m->kind = BROKER_SRC_GGUF;
		} else if (ends_with(path, ".arena")) {
			m->kind = BROKER_SRC_ARENA;
		} else if (ends_with(path, ".safetensors")) {
			m->kind = BROKER_SRC_HF; /* one file: baton-arena reads its folder's config.json */
		} else {
			snprintf(err, errlen, "%s is neither a GGUF file (no GGUF magic), an .arena nor a folder", path);
			return BATON_EINVAL;
		}
	} else {
		snprintf(err, errlen, "%s is not a file or a folder", path);
		return BATON_EINVAL;
	}
	snprintf(m->path, sizeof m->path, "%s", path);
	return 0;
}

/* hf:ORG/NAME[@REV] in the local cache. */
static int from_hub(struct broker_model_conf *m, const char *id, char *err, size_t errlen)
{
	char repo[256], rev[128] = "main";
	snprintf(repo, sizeof repo, "%s", id);
	char *at = strchr(repo, '@');
	if (at) {
		snprintf(rev, sizeof rev, "%s", at + 1);
		*at = 0;
	}
	char *slash = strchr(repo, '/');
	bool ok = slash && slash != repo && slash[1] && !strchr(slash + 1, '/') && *rev && !strchr(rev, '/') &&
	    strcmp(rev, "..") != 0 && strcmp(rev, ".") != 0;
	for (const char *q = repo; ok && *q; q++)
		ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
		    strchr("-_./", *q);
	if (!ok || strstr(repo, "..")) {
		snprintf(err, errlen, "want hf:ORG/NAME or hf:ORG/NAME@REVISION");
		return BATON_EINVAL;
	}
	char hub[PATH_MAX - 300];
	if (hub_dir(hub, sizeof hub)) {
		snprintf(err, errlen, "no Hugging Face cache: set HF_HUB_CACHE or HF_HOME");
		return BATON_ENOTFOUND;
	}
	*slash = 0;
	char base[PATH_MAX];
	snprintf(base, sizeof base, "%s/models--%s--%s", hub, repo, slash + 1);
	*slash = '/';
	struct stat sb;
	if (stat(base, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
		snprintf(err, errlen, "%s is not in the local Hugging Face cache (%s); the broker never downloads: "
		    "huggingface-cli download %s", repo, base, repo);
		return BATON_ENOTFOUND;
	}
	/* a branch or tag names a commit in refs/; else REV is the commit */
	char commit[128];
	snprintf(commit, sizeof commit, "%s", rev);
	char refp[PATH_MAX + 160];
	snprintf(refp, sizeof refp, "%s/refs/%s", base, rev);
	FILE *f = fopen(refp, "r");
	if (f) {
		char line[128] = "";
		if (fgets(line, sizeof line, f))
			line[strcspn(line, "\r\n \t")] = 0;
		fclose(f);
		if (line[0] && !strchr(line, '/'))
			snprintf(commit, sizeof commit, "%s", line);
	}
	char snap[PATH_MAX + 300];
	snprintf(snap, sizeof snap, "%s/snapshots/%s", base, commit);
	if (stat(snap, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
		snprintf(err, errlen, "%s: no snapshot for revision '%s' in %s/snapshots", repo, rev, base);
		return BATON_ENOTFOUND;
	}
	/* a snapshot holds one model: a folder of safetensors, or GGUF files (one
	 * .gguf: that file) */
	char cfg[PATH_MAX + 320];
	snprintf(cfg, sizeof cfg, "%s/config.json", snap);
	if (access(cfg, R_OK) == 0)
		return from_path(m, snap, err, errlen);
	DIR *d = opendir(snap);
	char gguf[256] = "";
	int n = 0;
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (ends_with(de->d_name, ".gguf") && n++ == 0)
			snprintf(gguf, sizeof gguf, "%s", de->d_name);
	if (d)
		closedir(d);
	if (n != 1) {
		snprintf(err, errlen, "%s has %s (want config.json and .safetensors, or one .gguf file; name the "
		    "file as source = PATH)", snap, n ? "several .gguf files" : "neither config.json nor a .gguf file");
		return BATON_EINVAL;
	}
	char file[PATH_MAX + 600];
	snprintf(file, sizeof file, "%s/%s", snap, gguf);
	return from_path(m, file, err, errlen);
}

int broker_model_source(struct broker_model_conf *m, const char *dir, char *err, size_t errlen)
{
	const char *s = m->source;
	if (strncmp(s, "hf:", 3) == 0)
		return from_hub(m, s + 3, err, errlen);
	char path[PATH_MAX];
	if (s[0] == '/' || !dir || !*dir)
		snprintf(path, sizeof path, "%s", s);
	else
		snprintf(path, sizeof path, "%s/%s", dir, s);
	return from_path(m, path, err, errlen);
}
