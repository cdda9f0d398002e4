/*
 * host_test.c: the host backend's memory side and backend_find().
 * Each case has a host device of its own (BATON_HOSTDEV_DIR in a fresh
 * temporary directory).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/backend/backend.h"
#include "engine/backend/host/device.h"
#include "proto/proto.h"
#include "tests/hostdev_fixture.h"
#include "tests/t.h"

#define MiB (1ull << 20)
#define GRAN (2 * MiB)

/* Each case on a host device of its own (tests/hostdev_fixture.h). */
static void dir_setup(void)
{
	hostdev_setup("hostdev");
}

static void dir_cleanup(void)
{
	hostdev_cleanup();
}

static const struct baton_backend *H = &baton_backend_host;

static struct baton_dev *dev_open(int index, uint64_t cap)
{
	struct baton_dev *d = NULL;
	char err[256] = "";
	int rc = H->open(index, cap, &d, err, sizeof err);
	T_ASSERT_MSG(rc == 0 && d, "open: %s (%s)", baton_errname(rc), err);
	return d;
}

static uint64_t dfree(struct baton_dev *d)
{
	uint64_t f = 0, t = 0;
	T_OK(H->mem_info(d, &f, &t));
	return f;
}

static uint64_t dtotal(struct baton_dev *d)
{
	uint64_t f = 0, t = 0;
	T_OK(H->mem_info(d, &f, &t));
	return t;
}

/* 1 when the process may read address a (a write(2) from it would fault). */
static int readable(baton_dptr a)
{
	int p[2]; /* a pipe copies the byte, so it faults on no access */
	T_ASSERT(pipe(p) == 0);
	ssize_t n = write(p[1], (const void *)(uintptr_t)a, 1);
	int e = errno;
	close(p[0]);
	close(p[1]);
	T_ASSERT(n == 1 || e == EFAULT);
	return n == 1;
}

/* Shared memory this process has resident (kB): memfd pages count here. */
static long rss_shmem_kb(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kb = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "RssShmem: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

/* ---- cases -------------------------------------------------------------- */

static void t_find(void)
{
	const struct baton_backend *be = NULL;
	char err[256] = "";
	T_OK(backend_find("host", &be, err, sizeof err));
	T_ASSERT(be == &baton_backend_host);
	T_EQ_STR(be->name, "host");
	be = NULL;
	T_OK(backend_find("auto", &be, err, sizeof err));
	T_ASSERT(be != NULL);
	int rc = backend_find("cuda", &be, err, sizeof err);
#ifndef BATON_HAVE_CUDA
	T_EQ_ERR(rc, BATON_ENODEV);
	T_EQ_STR(err, "this build has no CUDA backend (built with CUDA=0)");
	T_ASSERT(be == NULL);
	T_ASSERT(backend_find("auto", &be, NULL, 0) == 0 && be == &baton_backend_host);
#else
	T_ASSERT(rc == 0 || rc == BATON_ENODEV);
#endif
	T_EQ_ERR(backend_find("metal", &be, err, sizeof err), BATON_EINVAL);
	T_EQ_STR(err, "unknown backend \"metal\" (host, cuda or auto)");
	T_EQ_ERR(backend_find(NULL, &be, err, sizeof err), BATON_EINVAL);
	T_EQ_ERR(backend_find("host", NULL, NULL, 0), BATON_EINVAL);
	/* The table is complete where it must be. */
	T_ASSERT(H->open && H->close && H->mem_info && H->uuid && H->granularity &&
	    H->reserve && H->unreserve && H->map && H->unmap && H->alloc && H->free &&
	    H->copy_h2d && H->copy_d2h && H->sync && H->moe_route && H->moe_experts &&
	    H->can_compute);
	T_ASSERT(H->can_compute(0) && !H->can_compute(37)); /* f32 yes, not a type (37) no */

	/* What an engine's refusal of a weight type tells the user to do:
	 * another backend that lacks a host type is sent to the host; a type
	 * no backend computes (iq2_xxs), to llama-quantize. */
	struct baton_backend other = { .name = "other" };
	T_ASSERT(strstr(backend_dtype_advice(&other, BATON_DT_Q3_K), "--backend host") != NULL);
	T_ASSERT(strstr(backend_dtype_advice(&other, BATON_DT_IQ2_XXS), "--backend host") == NULL);
	T_ASSERT(strstr(backend_dtype_advice(H, BATON_DT_IQ2_XXS), "no backend of this build") != NULL);
	T_ASSERT(strstr(backend_dtype_advice(H, BATON_DT_IQ3_S), "Q4_K_M") != NULL);
}

static void t_open_info(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(3, 64 * MiB);
	char uuid[32];
	T_OK(H->uuid(d, uuid, sizeof uuid));
	T_EQ_STR(uuid, "host-3");
	T_EQ_ERR(H->uuid(d, uuid, 4), BATON_EINVAL);
	T_EQ_INT(H->granularity(d), GRAN);
	T_EQ_INT(dtotal(d), 64 * MiB);
	T_EQ_INT(dfree(d), 64 * MiB);
	H->close(d);
	H->close(NULL);

	struct baton_dev *bad = NULL;
	char err[256] = "";
	T_EQ_ERR(H->open(-1, 0, &bad, err, sizeof err), BATON_ENODEV);
	T_ASSERT(bad == NULL && strstr(err, "does not exist"));
	T_EQ_ERR(H->open(HOSTDEV_MAX_INDEX, 0, &bad, NULL, 0), BATON_ENODEV);
	T_EQ_ERR(H->open(0, 0, NULL, NULL, 0), BATON_EINVAL);

	/* The environment's capacity, and a bad one. */
	setenv("BATON_HOSTDEV_MIB", "48", 1);
	d = dev_open(4, 0);
	T_EQ_INT(dtotal(d), 48 * MiB);
	H->close(d);
	setenv("BATON_HOSTDEV_MIB", "lots", 1);
	T_EQ_ERR(H->open(5, 0, &bad, err, sizeof err), BATON_ECONFIG);
	T_ASSERT(strstr(err, "BATON_HOSTDEV_MIB"));
	unsetenv("BATON_HOSTDEV_MIB");
	/* And the default. */
	d = dev_open(6, 0);
	T_EQ_INT(dtotal(d), (uint64_t)HOSTDEV_DEFAULT_MIB * MiB);
	H->close(d);

	/* A directory that cannot be made. */
	setenv("BATON_HOSTDEV_DIR", "/proc/no/such/dir", 1);
	T_ASSERT(H->open(0, 0, &bad, err, sizeof err) != 0 && bad == NULL);
	dir_cleanup();
}

/* Segments: mapped memory is there, unmapped memory is really gone. */
static void t_map_unmap(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 64 * MiB);
	baton_dptr base = 0;
	T_OK(H->reserve(d, 8 * MiB, &base));
	T_ASSERT(base && base % GRAN == 0);
	T_EQ_INT(dfree(d), 64 * MiB); /* a reservation costs nothing */
	T_ASSERT(!readable(base));

	long shm0 = rss_shmem_kb();
	T_OK(H->map(d, base + GRAN, 2 * GRAN));
	T_EQ_INT(dfree(d), 64 * MiB - 2 * GRAN);
	memset((void *)(uintptr_t)(base + GRAN), 0xab, 2 * GRAN);
	T_ASSERT(readable(base + GRAN) && readable(base + 3 * GRAN - 1));
	T_ASSERT(!readable(base) && !readable(base + 3 * GRAN));
	long shm1 = rss_shmem_kb();
	if (shm0 >= 0)
		T_ASSERT_MSG(shm1 - shm0 >= 4096, "RssShmem %ld -> %ld kB", shm0, shm1);

	T_OK(H->unmap(d, base + GRAN, 2 * GRAN));
	T_EQ_INT(dfree(d), 64 * MiB);
	T_ASSERT(!readable(base + GRAN));
	long shm2 = rss_shmem_kb();
	if (shm0 >= 0)
		T_ASSERT_MSG(shm1 - shm2 >= 4096, "RssShmem %ld -> %ld kB after unmap", shm1, shm2);
	/* Mapped again: fresh memory (zeros), not the old pages. */
	T_OK(H->map(d, base + GRAN, GRAN));
	const uint8_t *p = (const uint8_t *)(uintptr_t)(base + GRAN);
	for (size_t i = 0; i < GRAN; i += 4096)
		T_EQ_INT(p[i], 0);
	T_OK(H->unmap(d, base + GRAN, GRAN));
	T_OK(H->unreserve(d, base, 8 * MiB));
	H->close(d);
	dir_cleanup();
}

static long minor_faults(void)
{
	struct rusage ru;
	T_ASSERT(getrusage(RUSAGE_SELF, &ru) == 0);
	return ru.ru_minflt;
}

/* Map makes the memory present, page tables included (as cuMemCreate +
 * cuMemMap do): RssShmem counts it before anything touches it, and the
 * first copy into it takes (almost) no page faults. */
static void t_map_populated(void)
{
	dir_setup();
	const uint64_t bytes = 8 * GRAN; /* populated by two threads */
	struct baton_dev *d = dev_open(0, 64 * MiB);
	baton_dptr base = 0;
	T_OK(H->reserve(d, bytes, &base));
	uint8_t *src = malloc(bytes);
	T_ASSERT(src);
	for (uint64_t i = 0; i < bytes; i++)
		src[i] = (uint8_t)(i * 7 + 1);
	long shm0 = rss_shmem_kb();
	T_OK(H->map(d, base, bytes));
	long shm1 = rss_shmem_kb();
	if (shm0 >= 0)
		T_ASSERT_MSG(shm1 - shm0 >= (long)(bytes >> 10), "RssShmem %ld -> %ld kB at map",
		    shm0, shm1);
	struct baton_copy c = { base, src, bytes };
	long f0 = minor_faults();
	T_OK(H->copy_h2d(d, &c, 1));
	long f1 = minor_faults();
	/* Unpopulated, that is one fault per 4 KiB page written (2048);
	 * sanitizers' shadow memory may take some. */
	T_ASSERT_MSG(f1 - f0 < (long)(bytes / 4096 / 4), "%ld page faults in the first copy",
	    f1 - f0);
	T_OK(H->sync(d));
	T_ASSERT(memcmp((const void *)(uintptr_t)base, src, bytes) == 0);
	T_OK(H->unmap(d, base, bytes));
	long shm2 = rss_shmem_kb();
	if (shm0 >= 0)
		T_ASSERT_MSG(shm1 - shm2 >= (long)(bytes >> 10), "RssShmem %ld -> %ld kB at unmap",
		    shm1, shm2);
	T_OK(H->unreserve(d, base, bytes));
	free(src);
	H->close(d);
	dir_cleanup();
}

static void t_map_errors(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 8 * MiB);
	baton_dptr base = 0, other = 0;
	T_OK(H->reserve(d, 16 * MiB, &base));
	T_EQ_ERR(H->reserve(d, 0, &other), BATON_EINVAL);
	T_EQ_ERR(H->reserve(d, GRAN, NULL), BATON_EINVAL);
	T_EQ_ERR(H->map(d, base, 0), BATON_EINVAL);
	T_EQ_ERR(H->map(d, base + 4096, GRAN), BATON_EINVAL);       /* misaligned */
	T_EQ_ERR(H->map(d, base, GRAN + 4096), BATON_EINVAL);       /* not whole */
	T_EQ_ERR(H->map(d, base + 16 * MiB, GRAN), BATON_EINVAL);   /* outside */
	T_EQ_ERR(H->map(d, base + 15 * MiB - MiB, 2 * GRAN), BATON_EINVAL); /* past the end */
	T_EQ_INT(dfree(d), 8 * MiB);
	T_OK(H->map(d, base, 2 * GRAN));
	T_EQ_ERR(H->map(d, base + GRAN, GRAN), BATON_EINVAL);       /* overlaps */
	/* Beyond the capacity: BATON_EDEVMEM, nothing mapped, nothing charged. */
	T_EQ_ERR(H->map(d, base + 2 * GRAN, 3 * GRAN), BATON_EDEVMEM);
	T_EQ_INT(dfree(d), 4 * MiB);
	T_ASSERT(!readable(base + 2 * GRAN));
	T_OK(H->map(d, base + 2 * GRAN, 2 * GRAN));
	T_EQ_INT(dfree(d), 0);
	T_EQ_ERR(H->map(d, base + 4 * GRAN, GRAN), BATON_EDEVMEM);
	/* Unmap must name a segment exactly. */
	T_EQ_ERR(H->unmap(d, base, GRAN), BATON_EINVAL);
	T_EQ_ERR(H->unmap(d, base + 4 * GRAN, GRAN), BATON_EINVAL);
	/* The range cannot go while something is mapped in it. */
	T_EQ_ERR(H->unreserve(d, base, 16 * MiB), BATON_EBUSY);
	T_EQ_ERR(H->unreserve(d, base + GRAN, GRAN), BATON_EINVAL);
	T_OK(H->unmap(d, base, 2 * GRAN));
	T_EQ_ERR(H->unreserve(d, base, 16 * MiB), BATON_EBUSY);
	T_OK(H->unmap(d, base + 2 * GRAN, 2 * GRAN));
	T_OK(H->unreserve(d, base, 16 * MiB));
	T_EQ_ERR(H->unreserve(d, base, 16 * MiB), BATON_EINVAL);
	T_EQ_INT(dfree(d), 8 * MiB);
	H->close(d);
	dir_cleanup();
}

static void t_copies(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 64 * MiB);
	baton_dptr base = 0, a = 0;
	T_OK(H->reserve(d, 4 * MiB, &base));
	T_OK(H->map(d, base, GRAN));
	T_OK(H->alloc(d, 1000, &a));
	uint8_t src[3][5000], back[5000];
	for (int i = 0; i < 3; i++)
		memset(src[i], 'a' + i, sizeof src[i]);
	struct baton_copy cp[4] = {
		{ base, src[0], 5000 },
		{ base + GRAN - 5000, src[1], 5000 },
		{ a, src[2], 1000 },
		{ base + 7, NULL, 0 }, /* empty: allowed */
	};
	T_OK(H->host_register(d, src, sizeof src));
	T_OK(H->copy_h2d(d, cp, 4));
	T_OK(H->sync(d));
	T_OK(H->copy_d2h(d, back, base + GRAN - 5000, 5000));
	T_ASSERT(memcmp(back, src[1], 5000) == 0);
	T_OK(H->copy_d2h(d, back, a, 1000));
	T_ASSERT(memcmp(back, src[2], 1000) == 0);
	T_OK(H->copy_h2d(d, cp, 0));
	/* One bad copy in a batch: nothing of it is done. */
	memset(src[0], 'z', sizeof src[0]);
	struct baton_copy bad[2] = { { base, src[0], 5000 }, { base + GRAN - 10, src[1], 11 } };
	T_EQ_ERR(H->copy_h2d(d, bad, 2), BATON_EINVAL);
	T_OK(H->copy_d2h(d, back, base, 5000));
	T_EQ_INT(back[0], 'a');
	struct baton_copy unm = { base + GRAN, src[0], 1 }; /* reserved, not mapped */
	T_EQ_ERR(H->copy_h2d(d, &unm, 1), BATON_EINVAL);
	struct baton_copy nul = { base, NULL, 1 };
	T_EQ_ERR(H->copy_h2d(d, &nul, 1), BATON_EINVAL);
	T_EQ_ERR(H->copy_h2d(d, NULL, 1), BATON_EINVAL);
	T_EQ_ERR(H->copy_d2h(d, back, base + GRAN, 1), BATON_EINVAL);
	T_EQ_ERR(H->copy_d2h(d, back, 4096, 1), BATON_EINVAL);
	T_EQ_ERR(H->copy_d2h(d, NULL, base, 1), BATON_EINVAL);
	T_OK(H->host_unregister(d, src, sizeof src));
	T_EQ_ERR(H->host_register(d, NULL, 5), BATON_EINVAL);
	H->free(d, a);
	H->close(d);
	dir_cleanup();
}

/* Large batches are copied by two threads, cut by bytes (in the middle of
 * a copy, too); the bytes are those of copying in order, with threads or
 * without (BATON_HOST_THREADS=1), and overlapping destinations still end
 * with the later copy's bytes. */
static void t_copies_split(void)
{
	dir_setup();
	const uint64_t span = 32 * MiB;
	uint8_t *src = malloc(span), *want = calloc(1, span), *back = malloc(span);
	T_ASSERT(src && want && back);
	uint64_t x = 12345;
	for (uint64_t i = 0; i < span; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		src[i] = (uint8_t)x;
	}
	/* Odd sizes, out of order, an empty one with no source. */
	struct baton_copy cp[7];
	const uint64_t off[7] = { 20 * MiB + 3, 0, 9 * MiB + 1, 5 * MiB, 30 * MiB, 14 * MiB + 77,
		4 * MiB + 200 };
	const uint64_t len[7] = { 9 * MiB + 5, 4 * MiB + 99, 3 * MiB, 0, 2 * MiB - 1, 5 * MiB, 1000 };
	for (int t = 0; t < 2; t++) {
		if (t == 1)
			setenv("BATON_HOST_THREADS", "1", 1);
		struct baton_dev *d = dev_open(0, 64 * MiB);
		baton_dptr base = 0;
		T_OK(H->reserve(d, span, &base));
		for (uint64_t o = 0; o < span; o += 8 * MiB)
			T_OK(H->map(d, base + o, 8 * MiB)); /* back to back */
		memset(want, 0, span);
		for (int i = 0; i < 7; i++) {
			cp[i] = (struct baton_copy){ base + off[i], len[i] ? src + span - off[i] - len[i] : NULL,
			    len[i] };
			if (len[i])
				memcpy(want + off[i], cp[i].src, len[i]);
		}
		T_OK(H->copy_h2d(d, cp, 7));
		T_OK(H->sync(d));
		T_OK(H->copy_d2h(d, back, base, span));
		T_ASSERT_MSG(memcmp(back, want, span) == 0, "threads %s: wrong bytes", t ? "off" : "on");

		/* Overlapping: the second copy covers the middle of the first. */
		struct baton_copy ov[2] = { { base, src, 16 * MiB }, { base + 4 * MiB, src + MiB, 8 * MiB } };
		memcpy(want, src, 16 * MiB);
		memcpy(want + 4 * MiB, src + MiB, 8 * MiB);
		T_OK(H->copy_h2d(d, ov, 2));
		T_OK(H->copy_d2h(d, back, base, 16 * MiB));
		T_ASSERT(memcmp(back, want, 16 * MiB) == 0);
		for (uint64_t o = 0; o < span; o += 8 * MiB)
			T_OK(H->unmap(d, base + o, 8 * MiB));
		T_OK(H->unreserve(d, base, span));
		H->close(d);
	}
	unsetenv("BATON_HOST_THREADS");
	free(src);
	free(want);
	free(back);
	dir_cleanup();
}

static void t_alloc_free(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 4 * MiB);
	baton_dptr a = 0, b = 0, c = 0;
	T_OK(H->alloc(d, 100, &a));
	T_EQ_INT(dfree(d), 4 * MiB - 4096); /* whole pages */
	T_OK(H->alloc(d, 3 * MiB, &b));
	T_EQ_ERR(H->alloc(d, MiB, &c), BATON_EDEVMEM);
	T_EQ_ERR(H->alloc(d, 0, &c), BATON_EINVAL);
	memset((void *)(uintptr_t)b, 1, 3 * MiB);
	H->free(d, b);
	H->free(d, b);       /* twice: ignored */
	H->free(d, 12345);   /* unknown: ignored */
	H->free(d, 0);
	T_EQ_INT(dfree(d), 4 * MiB - 4096);
	H->close(d);         /* frees a */
	d = dev_open(0, 4 * MiB);
	T_EQ_INT(dfree(d), 4 * MiB);
	H->close(d);
	dir_cleanup();
}

/* Closing a context gives back everything it holds. */
static void t_close_returns(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 32 * MiB);
	struct baton_dev *e = dev_open(0, 0);
	baton_dptr base, a;
	T_OK(H->reserve(d, 16 * MiB, &base));
	for (int k = 0; k < 4; k++)
		T_OK(H->map(d, base + k * GRAN, GRAN));
	T_OK(H->alloc(d, MiB, &a));
	T_EQ_INT(dfree(e), 23 * MiB);
	H->close(d);
	T_EQ_INT(dfree(e), 32 * MiB);
	H->close(e);
	dir_cleanup();
}

/* Two contexts of one process share the device like two processes. */
static void t_shared_capacity(void)
{
	dir_setup();
	struct baton_dev *a = dev_open(1, 8 * MiB);
	struct baton_dev *b = dev_open(1, 8 * MiB);
	baton_dptr ra, rb;
	T_OK(H->reserve(a, 8 * MiB, &ra));
	T_OK(H->reserve(b, 8 * MiB, &rb));
	T_OK(H->map(a, ra, 3 * GRAN));
	T_EQ_INT(dfree(b), 2 * MiB);
	T_EQ_ERR(H->map(b, rb, 2 * GRAN), BATON_EDEVMEM);
	T_OK(H->map(b, rb, GRAN));
	T_EQ_INT(dfree(a), 0);
	T_OK(H->unmap(a, ra, 3 * GRAN));
	T_EQ_INT(dfree(b), 6 * MiB);
	H->close(a);
	T_EQ_INT(dfree(b), 6 * MiB); /* b's 2 MiB stay charged */
	H->close(b);
	dir_cleanup();
}

/* Capacity: the first opener sets it; a different one asked for while
 * someone holds the device is ignored; once nobody does, it replaces it. */
static void t_capacity_rules(void)
{
	dir_setup();
	struct baton_dev *a = dev_open(0, 32 * MiB);
	struct baton_dev *b = dev_open(0, 16 * MiB);
	T_EQ_INT(dtotal(b), 32 * MiB);
	H->close(a);
	H->close(b);
	b = dev_open(0, 16 * MiB);
	T_EQ_INT(dtotal(b), 16 * MiB);
	H->close(b);
	/* The default never replaces a file's capacity. */
	b = dev_open(0, 0);
	T_EQ_INT(dtotal(b), 16 * MiB);
	H->close(b);
	dir_cleanup();
}

static void state_path(char *p, size_t n, int index)
{
	snprintf(p, n, "%s/hostdev-%d", hostdev_dir, index);
}

/* A state file that is garbage is rewritten; one of another size too. */
static void t_garbage_file(void)
{
	dir_setup();
	char p[256];
	state_path(p, sizeof p, 0);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	T_ASSERT(fd >= 0);
	char junk[10000];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (char)(i * 7 + 3);
	T_ASSERT(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
	close(fd);
	struct baton_dev *d = dev_open(0, 8 * MiB);
	T_EQ_INT(dtotal(d), 8 * MiB);
	T_EQ_INT(dfree(d), 8 * MiB);
	baton_dptr r;
	T_OK(H->reserve(d, 4 * MiB, &r));
	T_OK(H->map(d, r, GRAN));
	/* Clobbered while in use: rewritten, and our charge put back. */
	fd = open(p, O_WRONLY | O_TRUNC);
	T_ASSERT(fd >= 0 && write(fd, "nonsense", 8) == 8);
	close(fd);
	T_EQ_INT(dfree(d), 6 * MiB);
	T_OK(H->unmap(d, r, GRAN));
	T_EQ_INT(dfree(d), 8 * MiB);
	H->close(d);
	dir_cleanup();
}

/* Owner records: a dead pid, a reused pid (live, other start time) and a
 * live owner with the right start time. */
static void t_owner_liveness(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 64 * MiB);
	char p[256];
	state_path(p, sizeof p, 0);
	int fd = open(p, O_RDWR);
	T_ASSERT(fd >= 0);
	struct hostdev_file_owner o[3];
	memset(o, 0, sizeof o);
	/* A child that exits: its pid is dead. */
	pid_t dead = fork();
	if (dead == 0)
		_exit(0);
	T_ASSERT(waitpid(dead, NULL, 0) == dead);
	o[0] = (struct hostdev_file_owner){ .pid = dead, .opens = 1, .start_time = 1, .bytes = 8 * MiB };
	/* Our parent is alive, but this record says it started at another time. */
	uint64_t pstart = 0;
	T_EQ_INT(hostdev_proc_start(getppid(), &pstart, NULL), 0);
	o[1] = (struct hostdev_file_owner){ .pid = getppid(), .opens = 1, .start_time = pstart + 1,
		.bytes = 8 * MiB };
	/* The same parent with its real start time: a live owner. */
	o[2] = (struct hostdev_file_owner){ .pid = getppid(), .opens = 1, .start_time = pstart,
		.bytes = 16 * MiB };
	off_t at = (off_t)sizeof(struct hostdev_file_header) + 100 * (off_t)sizeof o[0];
	T_ASSERT(pwrite(fd, o, sizeof o, at) == (ssize_t)sizeof o);
	T_EQ_INT(dfree(d), 48 * MiB);
	/* The dead and the reused were reaped (zeroed) in the file. */
	struct hostdev_file_owner back[3];
	T_ASSERT(pread(fd, back, sizeof back, at) == (ssize_t)sizeof back);
	T_EQ_INT(back[0].pid, 0);
	T_EQ_INT(back[1].pid, 0);
	T_EQ_INT(back[2].pid, getppid());
	close(fd);
	H->close(d);
	T_EQ_INT(hostdev_proc_start(-5, &pstart, NULL), -1);
	dir_cleanup();
}

/* Another process's usage counts; at its exit, even without close, and
 * at kill -9, it comes back. */
static void t_processes(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 16 * MiB);
	int up[2], down[2];
	T_ASSERT(pipe(up) == 0 && pipe(down) == 0);
	for (int how = 0; how < 3; how++) {
		pid_t pid = fork();
		T_ASSERT(pid >= 0);
		if (pid == 0) {
			struct baton_dev *c = dev_open(0, 0);
			baton_dptr r;
			if (H->reserve(c, 8 * MiB, &r) || H->map(c, r, 3 * GRAN))
				_exit(3);
			memset((void *)(uintptr_t)r, 7, 3 * GRAN);
			char x = 'm';
			if (write(up[1], &x, 1) != 1 || read(down[0], &x, 1) != 1)
				_exit(4);
			if (how == 0)
				H->close(c);
			_exit(0); /* how 1: no close; how 2: killed before this */
		}
		char x;
		T_ASSERT(read(up[0], &x, 1) == 1);
		T_EQ_INT(dfree(d), 10 * MiB);
		if (how == 2) {
			T_ASSERT(kill(pid, SIGKILL) == 0);
			double t0 = t_now();
			while (dfree(d) != 16 * MiB && t_now() - t0 < 5)
				usleep(1000);
			T_EQ_INT(dfree(d), 16 * MiB); /* maybe still a zombie */
		} else {
			T_ASSERT(write(down[1], "g", 1) == 1);
		}
		int st;
		T_ASSERT(waitpid(pid, &st, 0) == pid);
		if (how < 2)
			T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		T_EQ_INT(dfree(d), 16 * MiB);
	}
	H->close(d);
	dir_cleanup();
}

/* A context does not survive fork(): the child gets BATON_ESTATE and does
 * not keep the parent's memory alive; its close frees only its copy. */
static void t_fork_child(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 16 * MiB);
	baton_dptr r;
	T_OK(H->reserve(d, 4 * MiB, &r));
	T_OK(H->map(d, r, GRAN));
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		uint64_t f;
		int ok = H->mem_info(d, &f, NULL) == BATON_ESTATE &&
		    H->map(d, r + GRAN, GRAN) == BATON_ESTATE &&
		    H->copy_d2h(d, &f, r, 1) == BATON_ESTATE && !readable(r);
		H->close(d);
		_exit(ok ? 0 : 1);
	}
	int st;
	T_ASSERT(waitpid(pid, &st, 0) == pid);
	T_ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	T_EQ_INT(dfree(d), 14 * MiB); /* the child's close took nothing back */
	H->close(d);
	dir_cleanup();
}

/* The peer slots: memory charged to another host device, mapped in this
 * one's reservation; copy_d2d between segments. */
static void t_map_peer(void)
{
	dir_setup();
	struct baton_dev *d = dev_open(0, 16 * MiB), *p = dev_open(1, 8 * MiB);
	T_OK(H->peer_access(d, p));
	T_EQ_ERR(H->peer_access(d, d), BATON_EINVAL);
	baton_dptr base;
	T_OK(H->reserve(d, 8 * GRAN, &base));
	T_OK(H->map(d, base, GRAN));
	T_OK(H->map_peer(d, p, base + GRAN, 2 * GRAN));
	T_EQ_INT(dfree(d), 16 * MiB - GRAN);
	T_EQ_INT(dfree(p), 8 * MiB - 2 * GRAN);
	/* overlapping, outside the reservation, misaligned, too big, self */
	T_EQ_ERR(H->map_peer(d, p, base + 2 * GRAN, GRAN), BATON_EINVAL);
	T_EQ_ERR(H->map_peer(d, p, base + 8 * GRAN, GRAN), BATON_EINVAL);
	T_EQ_ERR(H->map_peer(d, p, base + 3 * GRAN + 4096, GRAN), BATON_EINVAL);
	T_EQ_ERR(H->map_peer(d, p, base + 3 * GRAN, 4 * GRAN), BATON_EDEVMEM);
	T_EQ_ERR(H->map_peer(d, d, base + 3 * GRAN, GRAN), BATON_EINVAL);
	T_EQ_INT(dfree(p), 8 * MiB - 2 * GRAN);

	/* copies: host to peer segment, peer to own, and back */
	uint8_t *src = malloc(GRAN), *back = malloc(GRAN);
	T_ASSERT(src && back);
	for (uint64_t i = 0; i < GRAN; i++)
		src[i] = (uint8_t)(i * 7 + 3);
	struct baton_copy c = { base + GRAN + 4096, src, GRAN };
	T_OK(H->copy_h2d(d, &c, 1)); /* spans the peer segment's two granules */
	T_OK(H->copy_d2d(d, base, base + GRAN + 4096, GRAN));
	T_OK(H->sync(d));
	T_OK(H->copy_d2h(d, back, base, GRAN));
	T_ASSERT(memcmp(src, back, GRAN) == 0);
	T_EQ_ERR(H->copy_d2d(d, base + 100, base, GRAN), BATON_EINVAL);         /* overlap */
	T_EQ_ERR(H->copy_d2d(d, base + 3 * GRAN, base, GRAN), BATON_EINVAL);    /* unmapped dst */
	T_EQ_ERR(H->copy_d2d(d, base, base + 2 * GRAN, 2 * GRAN), BATON_EINVAL); /* src runs past */

	/* only unmap_peer, with its peer, unmaps it */
	T_EQ_ERR(H->unmap(d, base + GRAN, 2 * GRAN), BATON_EINVAL);
	T_EQ_ERR(H->unmap_peer(d, p, base, GRAN), BATON_EINVAL);
	struct baton_dev *q = dev_open(2, 8 * MiB);
	T_EQ_ERR(H->unmap_peer(d, q, base + GRAN, 2 * GRAN), BATON_EINVAL);
	T_EQ_INT(dfree(p), 8 * MiB - 2 * GRAN);
	T_OK(H->unmap_peer(d, p, base + GRAN, 2 * GRAN));
	T_EQ_INT(dfree(p), 8 * MiB);
	T_EQ_INT(dfree(d), 16 * MiB - GRAN);
	T_EQ_ERR(H->copy_d2h(d, back, base + GRAN, 16), BATON_EINVAL); /* gone */
	T_OK(H->unmap(d, base, GRAN));
	T_OK(H->unreserve(d, base, 8 * GRAN));
	free(src);
	free(back);
	H->close(q);
	H->close(d);
	H->close(p);
	dir_cleanup();
}

/* Whoever could write the state file, or its directory, would decide what
 * the device has free (issue 28): a hostdev-0 of another user, mode 0666,
 * in a directory they made first, made a root engine account its memory
 * there. Refused: the directory of another user or writable by others, a
 * link at the file's name, a file of another user or writable by others.
 * The other-user halves chown, so they need root (CI runs as root). */
static void t_untrusted_state(void)
{
	dir_setup();
	struct baton_dev *bad = NULL;
	char p[256], err[512], victim[256];
	state_path(p, sizeof p, 0);
	/* Writable by others: the directory, then the file. */
	T_ASSERT(chmod(hostdev_dir, 0777) == 0);
	T_EQ_ERR(H->open(0, 8 * MiB, &bad, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "writable by others") != NULL, "%s", err);
	T_ASSERT(bad == NULL && access(p, F_OK) != 0);
	T_ASSERT(chmod(hostdev_dir, 0700) == 0);
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
	T_ASSERT(fd >= 0 && fchmod(fd, 0666) == 0);
	close(fd);
	T_EQ_ERR(H->open(0, 8 * MiB, &bad, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "writable by others") != NULL, "%s", err);
	T_ASSERT(chmod(p, 0660) == 0);
	H->close(dev_open(0, 8 * MiB));
	/* A link at the name: not followed, the target not written. */
	snprintf(victim, sizeof victim, "%s/victim", hostdev_dir);
	fd = open(victim, O_WRONLY | O_CREAT | O_EXCL, 0600);
	T_ASSERT(fd >= 0 && write(fd, "keep", 4) == 4);
	close(fd);
	state_path(p, sizeof p, 1);
	T_ASSERT(symlink(victim, p) == 0);
	T_EQ_ERR(H->open(1, 8 * MiB, &bad, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "symbolic link") != NULL, "%s", err);
	struct stat st;
	T_ASSERT(stat(victim, &st) == 0 && st.st_size == 4);
	unlink(p);
	if (geteuid() != 0) {
		printf("     (skipped the other-user halves of t_untrusted_state: need root)\n");
		dir_cleanup();
		return;
	}
	/* Their file, in our directory. */
	state_path(p, sizeof p, 2);
	fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0640);
	T_ASSERT(fd >= 0 && fchown(fd, 65534, 65534) == 0);
	close(fd);
	T_EQ_ERR(H->open(2, 8 * MiB, &bad, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "belongs to uid 65534") != NULL, "%s", err);
	/* Their directory (made first, as /dev/shm/baton after a boot). */
	T_ASSERT(chown(p, 0, 0) == 0 && chown(hostdev_dir, 65534, 65534) == 0);
	T_EQ_ERR(H->open(2, 8 * MiB, &bad, err, sizeof err), BATON_EPERM);
	T_ASSERT_MSG(strstr(err, "belongs to uid 65534") != NULL, "%s", err);
	T_ASSERT(bad == NULL);
	T_ASSERT(chown(hostdev_dir, 0, 0) == 0);
	dir_cleanup();
}

T_MAIN(T_CASE(t_find), T_CASE(t_open_info), T_CASE(t_map_unmap), T_CASE(t_map_populated),
    T_CASE(t_map_errors),
    T_CASE(t_copies), T_CASE(t_copies_split), T_CASE(t_alloc_free), T_CASE(t_close_returns),
    T_CASE(t_shared_capacity), T_CASE(t_capacity_rules), T_CASE(t_garbage_file),
    T_CASE(t_owner_liveness), T_CASE(t_processes), T_CASE(t_fork_child), T_CASE(t_map_peer),
    T_CASE(t_untrusted_state))
