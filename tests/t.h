/*
 * t.h: Baton's test harness, header only.
 *
 * Each test case runs in its own forked process with a timeout (alarm), so
 * a crash or hang fails that case and nothing else, as libuv's runner does.
 * A test binary prints one line per case and ends with "N passed, N failed";
 * tests/run.sh adds those up for the whole suite.
 *
 *   static void t_roundtrip(void) { T_ASSERT(1 + 1 == 2); }
 *   T_MAIN(T_CASE(t_roundtrip), T_CASE_TIMEOUT(t_slow, 60))
 *
 * A binary run with one argument runs only the case of that name, in the
 * foreground (no fork), which is what you want under gdb.
 */
#ifndef BATON_TESTS_T_H
#define BATON_TESTS_T_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct t_case {
	const char *name;
	void (*fn)(void);
	int timeout_s;
};

#define T_DEFAULT_TIMEOUT 30
#define T_CASE(f) { #f, f, T_DEFAULT_TIMEOUT }
#define T_CASE_TIMEOUT(f, s) { #f, f, (s) }

#define T_FAIL(...)                                                        \
	do {                                                               \
		fprintf(stderr, "  %s:%d: ", __FILE__, __LINE__);          \
		fprintf(stderr, __VA_ARGS__);                              \
		fprintf(stderr, "\n");                                     \
		exit(1);                                                   \
	} while (0)

#define T_ASSERT(c)                                                        \
	do {                                                               \
		if (!(c))                                                  \
			T_FAIL("assertion failed: %s", #c);                \
	} while (0)

#define T_ASSERT_MSG(c, ...)                                               \
	do {                                                               \
		if (!(c))                                                  \
			T_FAIL(__VA_ARGS__);                               \
	} while (0)

#define T_EQ_INT(got, want)                                                \
	do {                                                               \
		long long t_g_ = (long long)(got), t_w_ = (long long)(want); \
		if (t_g_ != t_w_)                                          \
			T_FAIL("%s == %lld, want %lld", #got, t_g_, t_w_); \
	} while (0)

#define T_EQ_STR(got, want)                                                \
	do {                                                               \
		const char *t_g_ = (got), *t_w_ = (want);                  \
		if (!t_g_ || strcmp(t_g_, t_w_) != 0)                      \
			T_FAIL("%s == \"%s\", want \"%s\"", #got,          \
			    t_g_ ? t_g_ : "(null)", t_w_);                 \
	} while (0)

/* Compares Baton error codes and prints their names (needs proto.h). */
#define T_EQ_ERR(got, want)                                                \
	do {                                                               \
		int t_g_ = (int)(got), t_w_ = (int)(want);                 \
		if (t_g_ != t_w_)                                          \
			T_FAIL("%s gave %s (%d: %s), want %s (%d)", #got,  \
			    baton_errname(t_g_), t_g_, baton_strerror(t_g_), \
			    baton_errname(t_w_), t_w_);                    \
	} while (0)

#define T_OK(expr) T_EQ_ERR((expr), 0)

static inline double t_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline int t_run_one(const struct t_case *c)
{
	double t0 = t_now();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		/* Own process group, so a test's children die with it. */
		setpgid(0, 0);
		alarm((unsigned)c->timeout_s);
		c->fn();
		fflush(NULL);
		_exit(0);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	kill(-pid, SIGKILL); /* leftovers of the test's process group */
	double dt = t_now() - t0;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		printf("ok   %-44s %7.3fs\n", c->name, dt);
		return 0;
	}
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
		printf("FAIL %-44s timed out after %ds\n", c->name, c->timeout_s);
	else if (WIFSIGNALED(st))
		printf("FAIL %-44s killed by signal %d\n", c->name, WTERMSIG(st));
	else
		printf("FAIL %-44s exit %d\n", c->name, WEXITSTATUS(st));
	return 1;
}

static inline int t_run(const struct t_case *cases, size_t n, int argc, char **argv)
{
	if (argc == 2) {
		for (size_t i = 0; i < n; i++)
			if (strcmp(cases[i].name, argv[1]) == 0) {
				cases[i].fn();
				printf("ok   %s\n", cases[i].name);
				return 0;
			}
		fprintf(stderr, "no test case named %s\n", argv[1]);
		return 2;
	}
	int failed = 0;
	for (size_t i = 0; i < n; i++)
		failed += t_run_one(&cases[i]);
	printf("%zu passed, %d failed\n", n - (size_t)failed, failed);
	return failed ? 1 : 0;
}

#define T_MAIN(...)                                                        \
	int main(int argc, char **argv)                                    \
	{                                                                  \
		static const struct t_case t_cases_[] = { __VA_ARGS__ };    \
		return t_run(t_cases_, sizeof t_cases_ / sizeof t_cases_[0], \
		    argc, argv);                                           \
	}

#endif
