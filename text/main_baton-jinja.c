/*
 * baton-jinja: renders a chat template with Baton's Jinja engine (a tool
 * for checking templates, and what text/jinja_test.py drives).
 *
 *   baton-jinja TEMPLATE [CONTEXT.json]   one render to stdout (context
 *                                         from the file, else stdin)
 *   baton-jinja --batch TEMPLATE          JSON lines on stdin, each a
 *                                         context; one line out each:
 *                                         {"text": ...} or {"error": ...}
 *
 * Exit status: 0 rendered, 1 the render failed, 2 the template was refused
 * at load (the reason on stderr, or {"load_error": ...} in batch mode).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proto/base/base.h"
#include "text/text.h"

static char *slurp(FILE *f, size_t *n)
{
	size_t cap = 1 << 16, len = 0;
	char *p = malloc(cap);
	while (p) {
		size_t k = fread(p + len, 1, cap - len - 1, f);
		len += k;
		if (len + 1 < cap)
			break;
		char *q = realloc(p, cap *= 2);
		if (!q) {
			free(p);
			return NULL;
		}
		p = q;
	}
	if (p) {
		p[len] = 0;
		*n = len;
	}
	return p;
}

static char *read_file(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *p = slurp(f, n);
	fclose(f);
	return p;
}

static int batch(const text_jinja *j)
{
	char *line = NULL, err[512];
	size_t cap = 0;
	ssize_t len;
	while ((len = getline(&line, &cap, stdin)) > 0) {
		char *out = NULL;
		size_t n = 0;
		int rc = text_jinja_render(j, line, (size_t)len, &out, &n, err, sizeof(err));
		json_t *o = rc ? json_pack("{s:s, s:s}", "error", err, "code", baton_strerror(rc))
		               : json_pack("{s:s%}", "text", out, n);
		char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
		if (s)
			puts(s);
		else
			puts("{\"error\": \"cannot encode the result\"}");
		free(s);
		json_decref(o);
		free(out);
		fflush(stdout);
	}
	free(line);
	return 0;
}

int main(int argc, char **argv)
{
	static const char usage[] =
	    "usage: baton-jinja TEMPLATE [CONTEXT.json] | --batch TEMPLATE | --help | --version\n";
	if (argc < 2 || !strcmp(argv[1], "--help")) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "--version")) {
		printf("baton-jinja %s\n", BATON_VERSION);
		return 0;
	}
	if (argv[1][0] == '-' && argv[1][1] && strcmp(argv[1], "--batch")) {
		fprintf(stderr, "baton-jinja: unknown option %s\n%s", argv[1], usage);
		return 2;
	}
	bool is_batch = !strcmp(argv[1], "--batch");
	const char *tpath = argv[is_batch ? 2 : 1];
	if (!tpath) {
		fputs(usage, stderr);
		return 2;
	}
	size_t tn = 0, cn = 0;
	char *tmpl = read_file(tpath, &tn), err[512];
	if (!tmpl) {
		fprintf(stderr, "baton-jinja: cannot read %s\n", tpath);
		return 2;
	}
	text_jinja *j = NULL;
	int rc = text_jinja_load(&j, tmpl, tn, err, sizeof(err));
	free(tmpl);
	if (rc) {
		if (is_batch) {
			json_t *o = json_pack("{s:s}", "load_error", err);
			char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
			puts(s ? s : "{\"load_error\": \"?\"}");
			free(s);
			json_decref(o);
		} else
			fprintf(stderr, "baton-jinja: %s: %s\n", tpath, err);
		return 2;
	}
	if (is_batch) {
		rc = batch(j);
		text_jinja_free(j);
		return rc;
	}
	char *ctx = argc > 2 ? read_file(argv[2], &cn) : slurp(stdin, &cn), *out = NULL;
	if (!ctx) {
		fprintf(stderr, "baton-jinja: cannot read the context\n");
		text_jinja_free(j);
		return 2;
	}
	size_t n = 0;
	rc = text_jinja_render(j, ctx, cn, &out, &n, err, sizeof(err));
	free(ctx);
	text_jinja_free(j);
	if (rc) {
		fprintf(stderr, "baton-jinja: %s\n", err);
		return 1;
	}
	fwrite(out, 1, n, stdout);
	free(out);
	return 0;
}
