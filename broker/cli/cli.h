/*
 * cli.h: what every `baton` command shares: the exit status, a stable
 * contract for scripts (docs/reference/cli.md), and the one map from an error code
 * to it.
 */
#ifndef BATON_BROKER_CLI_H
#define BATON_BROKER_CLI_H

#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/base/base.h"

enum {
	EXIT_DONE = 0,     /* done */
	EXIT_FAILED = 1,   /* failed: said no, no answer in time, nobody there */
	EXIT_USAGE = 2,    /* bad flags or arguments, or a request refused as invalid */
	EXIT_BUSY = 3,     /* the engine is in the middle of a request */
	EXIT_NOTFOUND = 4, /* no engine of that name */
};

/* The exit status for an error a broker or engine answered with. */
static inline int cli_exit_code(int err)
{
	switch (err) {
	case BATON_EBUSY: return EXIT_BUSY;
	case BATON_ENOTFOUND: return EXIT_NOTFOUND;
	case BATON_EINVAL: return EXIT_USAGE;
	default: return EXIT_FAILED;
	}
}

/* A usage error: "baton: WHY" and where to read more, then EXIT_USAGE. */
static inline void cli_die_usage(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void cli_die_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("baton: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputs("\n(see baton --help)\n", stderr);
	va_end(ap);
	exit(EXIT_USAGE);
}

/* Bytes as people read them: "512 B", "1.50 MiB", "28.0 MiB", "140 GiB". */
static inline const char *cli_fmt_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB" };
	if (b < 1024) {
		snprintf(buf, len, "%" PRIu64 " B", b);
		return buf;
	}
	double v = (double)b / 1024;
	size_t u = 0;
	while (v >= 1024 && u + 1 < sizeof unit / sizeof unit[0])
		v /= 1024, u++;
	snprintf(buf, len, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, unit[u]);
	return buf;
}

/* A duration of ms: "-" for 0, "4.2s", "3m07s", "2h05m", "1d03h". */
static inline const char *cli_fmt_idle(uint64_t ms, char *buf, size_t len)
{
	double s = (double)ms / 1e3;
	if (ms == 0)
		snprintf(buf, len, "-");
	else if (s < 60)
		snprintf(buf, len, "%.1fs", s);
	else if (s < 3600)
		snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
	else if (s < 86400)
		snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
	else
		snprintf(buf, len, "%dd%02dh", (int)(s / 86400), (int)(s / 3600) % 24);
	return buf;
}

#endif
