/*
 * top.h: `baton top` (top.c), a live view of the broker's devices and
 * engines, redrawn like `nvidia-smi -l` or htop.
 */
#ifndef BATON_BROKER_TOP_H
#define BATON_BROKER_TOP_H

struct top_opts {
	const char *broker;   /* the broker's control socket */
	int interval_ms;      /* between two frames */
	int timeout_ms;       /* one status call */
	int once;             /* one frame, then exit */
	const char *http;     /* the front door's HOST:PORT (NULL: $BATON_HTTP, else the default) */
};

/* On a terminal (stdout a tty, not `once`): takes the alternate screen,
 * redraws every interval until q, Q, Ctrl-C or SIGTERM, then restores the
 * terminal (its modes, the cursor, the screen) and returns 0. Otherwise
 * prints one frame, without escape sequences, and returns 0. A broker that
 * does not answer: the frame says so (live), or 1 with the reason on
 * stderr (one frame). */
int top_run(const struct top_opts *o);

#endif
