/*
 * share_test.c: N processes that open the same arena share one copy of it
 * in RAM. Each child opens it and reads every page; the parent then reads
 * the children's /proc/PID/smaps for the arena's mapping: Rss is the whole
 * arena in each, and Pss (the proportional share) is about size/N: N
 * engines cost one copy of RAM.
 */
#include <inttypes.h>
#include <signal.h>
#include <sys/wait.h>

#include "arena/arena_int.h"
#include "tests/arena_util.h"

static char dir[PATH_MAX - 64], path[PATH_MAX];

struct child {
	pid_t pid;
	int go[2];  /* parent -> child: may exit */
	uintptr_t base;
};

static void child_main(int ready_fd, int go_fd)
{
	struct baton_arena *a;
	char msg[256];
	if (arena_open(path, &a, msg, sizeof msg) != 0)
		_exit(3);
	const volatile uint8_t *p = arena_base(a);
	uint64_t n = arena_size(a), sum = 0;
	for (uint64_t i = 0; i < n; i += 4096)
		sum += p[i];
	uintptr_t base = (uintptr_t)arena_base(a);
	(void)sum;
	(void)!write(ready_fd, &base, sizeof base);
	char c;
	(void)!read(go_fd, &c, 1);
	arena_close(a);
	_exit(0);
}

/* Rss and Pss in kB of the mapping of pid that starts at base. */
static void vma_usage(pid_t pid, uintptr_t base, long *rss, long *pss)
{
	char fn[64], line[512];
	snprintf(fn, sizeof fn, "/proc/%d/smaps", (int)pid);
	FILE *f = fopen(fn, "r");
	T_ASSERT(f != NULL);
	int in = 0;
	*rss = *pss = -1;
	while (fgets(line, sizeof line, f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			in = lo == base;
			continue;
		}
		if (in && strncmp(line, "Rss:", 4) == 0)
			*rss = atol(line + 4);
		if (in && strncmp(line, "Pss:", 4) == 0)
			*pss = atol(line + 4);
	}
	fclose(f);
	T_ASSERT_MSG(*rss >= 0 && *pss >= 0, "no mapping at %lx in pid %d", (unsigned long)base, (int)pid);
}

static long rollup_pss(pid_t pid)
{
	char fn[64], line[256];
	snprintf(fn, sizeof fn, "/proc/%d/smaps_rollup", (int)pid);
	FILE *f = fopen(fn, "r");
	long v = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "Pss:", 4) == 0)
			v = atol(line + 4);
	fclose(f);
	return v;
}

static long shmem_kb(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[256];
	long v = -1;
	T_ASSERT(f != NULL);
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "Shmem:", 6) == 0)
			v = atol(line + 6);
	fclose(f);
	return v;
}

static void run(int n)
{
	struct child kids[4];
	int ready[2];
	T_ASSERT(n <= 4 && pipe(ready) == 0);
	long shmem0 = shmem_kb();
	for (int i = 0; i < n; i++) {
		T_ASSERT(pipe(kids[i].go) == 0);
		kids[i].pid = fork();
		if (kids[i].pid == 0) {
			close(ready[0]);
			child_main(ready[1], kids[i].go[0]);
		}
	}
	for (int i = 0; i < n; i++) {
		uintptr_t b;
		T_ASSERT(read(ready[0], &b, sizeof b) == sizeof b);
	}
	/* Which base belongs to whom does not matter: read each child's own. */
	struct baton_arena *a;
	char msg[256];
	T_OK(arena_open(path, &a, msg, sizeof msg));
	long size_kb = (long)(arena_size(a) / 1024);
	arena_close(a);
	for (int i = 0; i < n; i++) {
		/* find the child's mapping of the arena through its maps */
		char fn[64], line[PATH_MAX + 128];
		snprintf(fn, sizeof fn, "/proc/%d/maps", (int)kids[i].pid);
		FILE *f = fopen(fn, "r");
		T_ASSERT(f != NULL);
		kids[i].base = 0;
		while (fgets(line, sizeof line, f))
			if (strstr(line, path)) {
				unsigned long lo;
				sscanf(line, "%lx-", &lo);
				kids[i].base = lo;
				break;
			}
		fclose(f);
		T_ASSERT(kids[i].base != 0);
		long rss, pss;
		vma_usage(kids[i].pid, kids[i].base, &rss, &pss);
		printf("  %d processes: pid %d arena %ld kB: Rss %ld kB, Pss %ld kB (%.2f of the arena), "
		       "smaps_rollup Pss %ld kB\n", n, (int)kids[i].pid, size_kb, rss, pss,
		    (double)pss / (double)size_kb, rollup_pss(kids[i].pid));
		T_ASSERT_MSG(rss >= size_kb * 98 / 100, "Rss %ld kB, the arena is %ld kB", rss, size_kb);
		T_ASSERT_MSG(labs(pss - size_kb / n) <= size_kb / n / 20 + 64,
		    "Pss %ld kB with %d processes, want about %ld kB", pss, n, size_kb / n);
	}
	long grown = shmem_kb() - shmem0;
	/* Informational: other processes on the machine move this too. */
	printf("  Shmem grew by %ld kB while %d processes mapped it\n", grown, n);
	for (int i = 0; i < n; i++) {
		(void)!write(kids[i].go[1], "x", 1);
		int st;
		T_ASSERT(waitpid(kids[i].pid, &st, 0) == kids[i].pid);
		T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		close(kids[i].go[0]);
		close(kids[i].go[1]);
	}
	close(ready[0]);
	close(ready[1]);
}

static void t_pages_shared(void)
{
	au_tmpdir(dir, sizeof dir);
	snprintf(path, sizeof path, "%s/shared.arena", dir);
	struct baton_synth_params p = {
		.layers = 4, .experts = 8, .top_k = 2, .d_model = 512, .d_ff = 1024,
		.dtype = BATON_DT_F16, .seed = 5,
	};
	au_create(path, &p); /* 4*8 experts of 3 MiB: 96 MiB */
	run(1);
	run(2);
	run(3);
	au_rmdir(dir);
}

T_MAIN(T_CASE_TIMEOUT(t_pages_shared, 60))
