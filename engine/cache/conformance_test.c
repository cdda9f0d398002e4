/*
 * conformance_test.c: the same cache and memory cases on every backend
 * present, as ggml's test-backend-ops runs each op on each backend.
 *
 * BACKENDS lists the candidates; one that backend_find() refuses (a build
 * without CUDA, a machine without a GPU) prints "skip NAME: why" and its
 * cases do not run. Each case runs as "<backend>/<case>" in its own
 * process (tests/t.h); one argument runs that one in the foreground.
 *
 * The cases use only the backend interface and measure against the
 * device's free memory when they start, so they hold on a real GPU that
 * others use too (host devices here get a directory and capacity of their
 * own; a cuda device is BATON_CONFORMANCE_DEVICE, default 0).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/backend/backend.h"
#include "engine/cache/cache.h"
#include "engine/cache/cache_int.h" /* cache_fault_map_after */
#include "proto/proto.h"
#include "tests/hostdev_fixture.h"
#include "tests/t.h"

#define MiB (1ull << 20)
#define SLOT (64u << 10)
#define SEG (2 * MiB)
#define SPS (SEG / SLOT)
#define HOST_CAPACITY (64 * MiB)

static const char *const BACKENDS[] = { "host", "cuda" };

/* The backend of the case running now: its name is set before the case's
 * process forks, the table is found inside it (a GPU driver must not be
 * initialised in a parent that forks children which use it). */
static const char *g_be_name;
static const struct baton_backend *g_be;

/* ---- fixture ------------------------------------------------------------ */

struct fx {
	struct baton_dev *dev;
	uint8_t *src;
	struct baton_cache_item *items;
	uint32_t n;
	struct baton_cache *c;
	int64_t *table;
	uint64_t free0; /* free when the case began */
};

static uint64_t dev_free(struct fx *f)
{
	uint64_t fr = 0, tot = 0;
	T_OK(g_be->mem_info(f->dev, &fr, &tot));
	return fr;
}

/* Opens the device, n items of one slot each in one buffer, a cache of
 * `ceiling` bytes. */
static void fx_open(struct fx *f, uint32_t n, uint64_t ceiling, int verify)
{
	int index = 0;
	char err[256] = "";
	T_ASSERT_MSG(backend_find(g_be_name, &g_be, err, sizeof err) == 0, "%s: %s",
	    g_be_name, err);
	if (strcmp(g_be->name, "host") == 0) {
		hostdev_setup("conf"); /* a device of its own */
	} else if (getenv("BATON_CONFORMANCE_DEVICE")) {
		index = atoi(getenv("BATON_CONFORMANCE_DEVICE"));
	}
	unsetenv("BATON_VERIFY_REFILL");
	int rc = g_be->open(index, HOST_CAPACITY, &f->dev, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "open %s %d: %s", g_be->name, index, err);
	f->n = n;
	f->src = malloc((size_t)n * SLOT);
	f->items = calloc(n, sizeof *f->items);
	f->table = calloc(n, sizeof *f->table);
	T_ASSERT(f->src && f->items && f->table);
	uint64_t x = 0x243F6A8885A308D3ull;
	for (size_t i = 0; i < (size_t)n * SLOT; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		f->src[i] = (uint8_t)x;
	}
	for (uint32_t i = 0; i < n; i++) {
		f->items[i].src = f->src + (size_t)i * SLOT;
		f->items[i].bytes = SLOT;
		f->items[i].checksum = XXH3_64bits(f->items[i].src, SLOT);
	}
	if (g_be->host_register)
		T_OK(g_be->host_register(f->dev, f->src, (uint64_t)n * SLOT));
	f->free0 = dev_free(f);
	struct baton_cache_config cfg = { SLOT, SEG, ceiling, 0, verify };
	rc = cache_create(g_be, f->dev, &cfg, f->items, n, &f->c, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "cache_create: %s", err);
}

static void fx_close(struct fx *f)
{
	cache_destroy(f->c);
	if (g_be->host_unregister)
		g_be->host_unregister(f->dev, f->src, (uint64_t)f->n * SLOT);
	g_be->close(f->dev);
	free(f->src);
	free(f->items);
	free(f->table);
	memset(f, 0, sizeof *f);
	hostdev_cleanup();
}

static void snap(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		f->table[i] = cache_slot_of(f->c, i);
}

static void same_table(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		T_ASSERT_MSG(cache_slot_of(f->c, i) == f->table[i], "item %u moved", i);
}

/* Looks the items up and reads every blob back. */
static void lookup_ok(struct fx *f, const uint32_t *ids, size_t n)
{
	baton_dptr *blobs = calloc(n, sizeof *blobs);
	uint8_t *buf = malloc(SLOT);
	T_ASSERT(blobs && buf);
	T_OK(cache_lookup(f->c, ids, n, blobs));
	for (size_t j = 0; j < n; j++) {
		T_OK(g_be->copy_d2h(f->dev, buf, blobs[j], SLOT));
		T_ASSERT_MSG(memcmp(buf, f->items[ids[j]].src, SLOT) == 0, "item %u: wrong bytes",
		    ids[j]);
	}
	free(blobs);
	free(buf);
}

static struct baton_cache_stats stats(struct fx *f)
{
	struct baton_cache_stats st;
	cache_stats(f->c, &st);
	return st;
}

/* ---- cases -------------------------------------------------------------- */

/* The raw interface: a segment in a reservation, copies both ways. */
static void c_backend_memory(void)
{
	struct fx f = { 0 };
	fx_open(&f, 4, SEG, 0);
	uint64_t g = g_be->granularity(f.dev);
	T_ASSERT(g > 0 && SEG % g == 0);
	char uuid[64];
	T_OK(g_be->uuid(f.dev, uuid, sizeof uuid));
	T_ASSERT(strlen(uuid) > 0);
	baton_dptr base;
	T_OK(g_be->reserve(f.dev, 2 * SEG, &base));
	T_ASSERT(base % g == 0);
	T_OK(g_be->map(f.dev, base + SEG, SEG));
	T_ASSERT(dev_free(&f) <= f.free0 - SEG);
	struct baton_copy cp[2] = { { base + SEG, f.src, SLOT }, { base + 2 * SEG - SLOT, f.src + SLOT, SLOT } };
	T_OK(g_be->copy_h2d(f.dev, cp, 2));
	T_OK(g_be->sync(f.dev));
	uint8_t *buf = malloc(SLOT);
	T_ASSERT(buf);
	T_OK(g_be->copy_d2h(f.dev, buf, base + 2 * SEG - SLOT, SLOT));
	T_ASSERT(memcmp(buf, f.src + SLOT, SLOT) == 0);
	T_OK(g_be->unmap(f.dev, base + SEG, SEG));
	T_OK(g_be->unreserve(f.dev, base, 2 * SEG));
	/* Plain device memory works the same way. */
	baton_dptr a;
	T_OK(g_be->alloc(f.dev, 4096, &a));
	struct baton_copy ca = { a, f.src + 5, 4096 };
	T_OK(g_be->copy_h2d(f.dev, &ca, 1));
	T_OK(g_be->sync(f.dev));
	T_OK(g_be->copy_d2h(f.dev, buf, a, 4096));
	T_ASSERT(memcmp(buf, f.src + 5, 4096) == 0);
	g_be->free(f.dev, a);
	free(buf);
	fx_close(&f);
}

static void c_release_frees(void)
{
	struct fx f = { 0 };
	fx_open(&f, 300, 16 * MiB, 0);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 8);
	T_EQ_INT(rep.bytes_copied, 256ull * SLOT);
	T_ASSERT(dev_free(&f) <= f.free0 - 16 * MiB);
	T_OK(cache_release(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_RELEASED);
	T_EQ_INT(rep.segments_unmapped, 8);
	T_ASSERT_MSG(rep.bytes_freed >= 16 * MiB, "freed %llu", (unsigned long long)rep.bytes_freed);
	T_EQ_INT(stats(&f).mapped_bytes, 0);
	fx_close(&f);
}

static void c_cycles_verify(void)
{
	struct fx f = { 0 };
	fx_open(&f, 200, 8 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	uint32_t ids[8];
	for (uint32_t r = 0; r < 8; r++) {
		for (uint32_t j = 0; j < 8; j++)
			ids[j] = (r * 29 + j * 13) % 200;
		lookup_ok(&f, ids, 8);
	}
	snap(&f);
	uint64_t mism = 0;
	for (int cyc = 0; cyc < 25; cyc++) {
		T_OK(cache_release(f.c, &rep));
		T_OK(cache_refill(f.c, &rep));
		T_EQ_INT(rep.state, BATON_CACHE_READY);
		mism += rep.mismatches;
		same_table(&f);
	}
	T_EQ_INT(mism, 0);
	fx_close(&f);
}

static void c_partial_then_complete(void)
{
	struct fx f = { 0 };
	fx_open(&f, 300, 16 * MiB, 1);
	struct baton_cache_report rep;
	snap(&f);
	cache_fault_map_after(f.c, 4);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(rep.segments_mapped, 3);
	T_EQ_INT(stats(&f).state, BATON_CACHE_PARTIAL);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 5);
	T_EQ_INT(rep.mismatches, 0);
	same_table(&f);
	fx_close(&f);
}

static void c_lookup(void)
{
	struct fx f = { 0 };
	fx_open(&f, 100, SEG, 0);
	uint32_t ids[40];
	for (uint32_t j = 0; j < 40; j++)
		ids[j] = 50 + j;
	lookup_ok(&f, ids, 20); /* on a fresh cache: maps what it needs */
	struct baton_cache_stats st = stats(&f);
	T_EQ_INT(st.misses, 20);
	T_EQ_INT(st.evictions, 20);
	lookup_ok(&f, ids, 20);
	T_EQ_INT(stats(&f).hits, 20);
	baton_dptr blobs[40];
	T_EQ_ERR(cache_lookup(f.c, ids, 40, blobs), BATON_EDEVMEM);
	fx_close(&f);
}

/* Hottest first, probed through lookups: after one step the hot segment's
 * items hit, without a miss. */
static void c_stepwise_hot_first(void)
{
	struct fx f = { 0 };
	fx_open(&f, 256, 16 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	uint32_t ids[32];
	for (int r = 0; r < 4; r++) {
		for (uint32_t j = 0; j < 32; j++)
			ids[j] = 6 * SPS + j;
		lookup_ok(&f, ids, 32);
	}
	snap(&f);
	T_OK(cache_release(f.c, &rep));
	T_OK(cache_refill_begin(f.c));
	int done = 0;
	T_OK(cache_refill_step(f.c, &done, &rep));
	T_EQ_INT(rep.segments_mapped, 1);
	struct baton_cache_stats st = stats(&f);
	uint32_t probe = 6 * SPS + 7;
	lookup_ok(&f, &probe, 1);
	T_EQ_INT(stats(&f).hits, st.hits + 1);
	T_EQ_INT(stats(&f).misses, st.misses);
	/* A request for a segment not refilled yet is served at once. */
	probe = 1 * SPS + 2;
	lookup_ok(&f, &probe, 1);
	T_EQ_INT(stats(&f).misses, st.misses + 1);
	while (!done)
		T_OK(cache_refill_step(f.c, &done, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	same_table(&f);
	fx_close(&f);
}

static void c_resize_reserve(void)
{
	struct fx f = { 0 };
	fx_open(&f, 400, 16 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	uint64_t fr = dev_free(&f);
	/* Keep 8 MiB more free than now: 4 segments go. */
	T_OK(cache_resize(f.c, (int64_t)(fr + 8 * MiB), &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_unmapped, 4);
	T_EQ_INT(stats(&f).target_bytes, 8 * MiB);
	/* Keep 4 MiB less than that: 2 come back, filled. */
	T_OK(cache_resize(f.c, (int64_t)(fr + 4 * MiB), &rep));
	T_EQ_INT(rep.segments_mapped, 2);
	T_EQ_INT(rep.mismatches, 0);
	T_EQ_INT(stats(&f).target_bytes, 12 * MiB);
	/* null: the ceiling again. */
	T_OK(cache_resize(f.c, -1, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(stats(&f).target_bytes, 16 * MiB);
	T_EQ_INT(stats(&f).items_resident, 256);
	fx_close(&f);
}

/* ---- runner --------------------------------------------------------------- */

struct conf_case {
	const char *name;
	void (*fn)(void);
	int timeout_s;
};

static const struct conf_case CASES[] = {
	{ "backend_memory", c_backend_memory, 30 },
	{ "release_frees", c_release_frees, 30 },
	{ "cycles_verify", c_cycles_verify, 60 },
	{ "partial_then_complete", c_partial_then_complete, 30 },
	{ "lookup", c_lookup, 30 },
	{ "stepwise_hot_first", c_stepwise_hot_first, 30 },
	{ "resize_reserve", c_resize_reserve, 30 },
};

#define N_BACKENDS (sizeof BACKENDS / sizeof BACKENDS[0])
#define N_CASES (sizeof CASES / sizeof CASES[0])

/* backend_find() in a child process: 0 when the backend can be used. */
static int probe(const char *name, char *err, size_t len)
{
	int p[2];
	if (pipe(p) < 0)
		return -1;
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		const struct baton_backend *be;
		char msg[256] = "";
		int rc = backend_find(name, &be, msg, sizeof msg);
		if (write(p[1], &rc, sizeof rc) != sizeof rc || write(p[1], msg, sizeof msg) < 0)
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	int rc = -1;
	char msg[256] = "(probe died)";
	if (pid < 0 || read(p[0], &rc, sizeof rc) != sizeof rc || read(p[0], msg, sizeof msg) < 0)
		rc = -1;
	close(p[0]);
	if (pid > 0)
		waitpid(pid, NULL, 0);
	msg[sizeof msg - 1] = '\0';
	snprintf(err, len, "%s", msg);
	return rc;
}

int main(int argc, char **argv)
{
	int failed = 0, passed = 0;
	for (size_t b = 0; b < N_BACKENDS; b++) {
		char err[256] = "";
		if (probe(BACKENDS[b], err, sizeof err) != 0) {
			if (argc < 2)
				printf("skip %s: %s\n", BACKENDS[b], err);
			continue;
		}
		g_be_name = BACKENDS[b];
		for (size_t i = 0; i < N_CASES; i++) {
			char name[128];
			snprintf(name, sizeof name, "%s/%s", BACKENDS[b], CASES[i].name);
			struct t_case tc = { name, CASES[i].fn, CASES[i].timeout_s };
			if (argc == 2) {
				if (strcmp(argv[1], name) != 0)
					continue;
				tc.fn();
				printf("ok   %s\n", name);
				return 0;
			}
			if (t_run_one(&tc))
				failed++;
			else
				passed++;
		}
	}
	if (argc == 2) {
		fprintf(stderr, "no test case named %s\n", argv[1]);
		return 2;
	}
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
