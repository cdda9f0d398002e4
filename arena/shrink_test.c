/*
 * shrink_test.c: an arena truncated under a process that has it mapped
 * (issue 14, item 7). Reads past the new end yield zeros instead of
 * SIGBUS, arena_intact reports BATON_ETRUNCATED with a message, and a
 * SIGBUS outside any arena still kills as before.
 */
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "tests/arena_util.h"

static char dir[PATH_MAX - 64];

static uint64_t sum_all(const struct baton_arena *a)
{
	const volatile uint8_t *p = arena_base(a);
	uint64_t s = 0;
	for (uint64_t i = 0; i < arena_size(a); i += 512)
		s += p[i];
	return s;
}

static void t_intact_until_truncated(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], msg[512];
	snprintf(path, sizeof path, "%s/m.arena", dir);
	struct baton_synth_params p = au_small();
	au_create(path, &p);
	struct baton_arena *a;
	T_OK(arena_open(path, &a, msg, sizeof msg));
	T_OK(arena_intact(a, msg, sizeof msg));
	sum_all(a);
	T_OK(arena_intact(a, msg, sizeof msg));
	/* The engine's case: truncated in place, then every expert copied
	 * again (release and refill). The process lives; the check says so. */
	uint64_t size = arena_size(a);
	T_ASSERT(truncate(path, (off_t)(size / 2)) == 0);
	T_EQ_ERR(arena_intact(a, msg, sizeof msg), BATON_ETRUNCATED);
	T_ASSERT_MSG(strstr(msg, "shrank") != NULL, "%s", msg);
	sum_all(a); /* SIGBUS here without the guard */
	struct baton_arena_expert e;
	T_OK(arena_expert(a, arena_shape(a)->layers - 1, arena_shape(a)->experts - 1, &e));
	uint8_t *copy = malloc(e.bytes);
	T_ASSERT(copy != NULL);
	memcpy(copy, e.blob, e.bytes); /* the last expert: past the new end */
	free(copy);
	/* Grown back to its size: the lost bytes are still lost (zeros), and
	 * it keeps saying so. */
	T_ASSERT(truncate(path, (off_t)size) == 0);
	T_EQ_ERR(arena_intact(a, msg, sizeof msg), BATON_ETRUNCATED);
	T_ASSERT_MSG(strstr(msg, "shrank from") != NULL, "%s", msg);
	arena_close(a);
	au_rmdir(dir);
}

/* A SIGBUS that is not an arena's keeps its default action. */
static void t_other_sigbus_still_kills(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], other[PATH_MAX], msg[512];
	snprintf(path, sizeof path, "%s/m.arena", dir);
	snprintf(other, sizeof other, "%s/other", dir);
	struct baton_synth_params p = au_small();
	au_create(path, &p);
	static uint8_t page[8192];
	au_write(other, page, sizeof page);
	fflush(NULL);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		struct baton_arena *a;
		if (arena_open(path, &a, msg, sizeof msg) != 0)
			_exit(3);
		int fd = open(other, O_RDONLY);
		volatile uint8_t *m = mmap(NULL, sizeof page, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED || truncate(other, 0) != 0)
			_exit(4);
		(void)m[4096];
		_exit(0);
	}
	int st;
	T_ASSERT(waitpid(pid, &st, 0) == pid);
	T_ASSERT_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS, "status %#x", st);
	au_rmdir(dir);
}

T_MAIN(T_CASE(t_intact_until_truncated), T_CASE(t_other_sigbus_still_kills))
