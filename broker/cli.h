/*
 * cli.h: what every `baton` command shares: the exit status, a stable
 * contract for scripts (docs/cli.md), and the one map from an error code
 * to it.
 */
#ifndef BATON_BROKER_CLI_H
#define BATON_BROKER_CLI_H

#include "proto/err.h"

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

#endif
