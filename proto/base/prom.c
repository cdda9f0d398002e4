/* prom.c: the Prometheus text format (0.0.4) writer of /metrics. */
#include <inttypes.h>

#include "proto/base/base.h"

void baton_prom_family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s ", name);
	for (const char *s = help; s && *s; s++) {
		if (*s == '\\')
			fputs("\\\\", f);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
	fprintf(f, "\n# TYPE %s %s\n", name, type);
}

void baton_prom_escape(FILE *f, const char *s)
{
	for (; s && *s; s++) {
		if (*s == '\\' || *s == '"')
			fputc('\\', f);
		if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

/* The labels inside braces, and `le` last when given. */
static void labels_of(FILE *f, const char *const *labels, const char *le)
{
	bool any = false;
	for (size_t i = 0; labels && labels[i] && labels[i + 1]; i += 2) {
		fprintf(f, "%s%s=\"", any ? "," : "{", labels[i]);
		baton_prom_escape(f, labels[i + 1]);
		fputc('"', f);
		any = true;
	}
	if (le) {
		fprintf(f, "%sle=\"%s\"", any ? "," : "{", le);
		any = true;
	}
	if (any)
		fputc('}', f);
}

void baton_prom_series(FILE *f, const char *name, const char *const *labels)
{
	fputs(name, f);
	labels_of(f, labels, NULL);
}

void baton_prom_u64(FILE *f, const char *name, const char *const *labels, uint64_t v)
{
	baton_prom_series(f, name, labels);
	fprintf(f, " %" PRIu64 "\n", v);
}

void baton_prom_f(FILE *f, const char *name, const char *const *labels, int prec, double v)
{
	baton_prom_series(f, name, labels);
	fprintf(f, " %.*f\n", prec, v);
}

void baton_prom_one(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
	baton_prom_family(f, name, type, help);
	baton_prom_u64(f, name, NULL, v);
}

void baton_hist_add(struct baton_hist *h, const double *le, size_t n, double v)
{
	size_t i = 0;
	if (n > BATON_HIST_MAX)
		n = BATON_HIST_MAX;
	while (i < n && v > le[i])
		i++;
	if (i < n)
		h->b[i]++;
	h->count++;
	h->sum += v;
}

void baton_prom_hist(FILE *f, const char *name, const char *const *labels, const double *le, size_t n,
    const struct baton_hist *h)
{
	uint64_t cum = 0;
	if (n > BATON_HIST_MAX)
		n = BATON_HIST_MAX;
	for (size_t i = 0; i <= n; i++) {
		char bound[32];
		if (i < n) {
			cum += h->b[i];
			snprintf(bound, sizeof bound, "%g", le[i]);
		} else {
			cum = h->count;
			snprintf(bound, sizeof bound, "+Inf");
		}
		fprintf(f, "%s_bucket", name);
		labels_of(f, labels, bound);
		fprintf(f, " %" PRIu64 "\n", cum);
	}
	fprintf(f, "%s_sum", name);
	labels_of(f, labels, NULL);
	fprintf(f, " %.6f\n", h->sum);
	fprintf(f, "%s_count", name);
	labels_of(f, labels, NULL);
	fprintf(f, " %" PRIu64 "\n", h->count);
}
