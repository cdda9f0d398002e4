/*
 * cache_test.c: the expert cache on the host backend, each case on a host
 * device of its own (BATON_HOSTDEV_DIR in a fresh temporary directory).
 * Sizes are small: 64 KiB slots, 2 MiB segments (32 slots each).
 */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/backend.h"
#include "engine/cache.h"
#include "proto/proto.h"
#include "tests/hostdev_fixture.h"
#include "tests/t.h"

#define MiB (1ull << 20)
#define SLOT (64u << 10)
#define SEG (2 * MiB)
#define SPS (SEG / SLOT)

/* ---- fixture ------------------------------------------------------------ */

/* A host device of our own (tests/hostdev_fixture.h). */
static void dir_setup(void)
{
	hostdev_setup("cache");
}

static void dir_cleanup(void)
{
	hostdev_cleanup();
}

struct fx {
	const struct baton_backend *be;
	struct baton_dev *dev;
	uint8_t *src;
	struct baton_cache_item *items;
	uint32_t n;
	struct baton_cache *c;
	int64_t *table; /* item -> slot snapshots */
};

/* n items of item_bytes each, placed `stride` apart in one buffer. */
static void fx_items(struct fx *f, uint32_t n, uint64_t item_bytes, uint64_t stride,
    uint64_t seed)
{
	f->n = n;
	f->src = malloc((size_t)n * stride);
	f->items = calloc(n, sizeof *f->items);
	f->table = calloc(n, sizeof *f->table);
	T_ASSERT(f->src && f->items && f->table);
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < (size_t)n * stride; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		f->src[i] = (uint8_t)x;
	}
	for (uint32_t i = 0; i < n; i++) {
		f->items[i].src = f->src + (size_t)i * stride;
		f->items[i].bytes = item_bytes;
		f->items[i].checksum = XXH3_64bits(f->items[i].src, item_bytes);
	}
}

static void fx_open(struct fx *f, uint64_t capacity)
{
	f->be = &baton_backend_host;
	char err[256] = "";
	int rc = f->be->open(0, capacity, &f->dev, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "open: %s", err);
}

/* The host backend, counting what the cache asks of it. */
static struct {
	uint64_t maps, unmaps, copy_calls, copies, copy_bytes;
} g_cnt;
static struct baton_backend g_counting;

static int cnt_map(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	g_cnt.maps++;
	return baton_backend_host.map(dev, addr, bytes);
}

static int cnt_unmap(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	g_cnt.unmaps++;
	return baton_backend_host.unmap(dev, addr, bytes);
}

static int cnt_copy_h2d(struct baton_dev *dev, const struct baton_copy *copies, size_t n)
{
	g_cnt.copy_calls++;
	g_cnt.copies += n;
	for (size_t i = 0; i < n; i++)
		g_cnt.copy_bytes += copies[i].bytes;
	return baton_backend_host.copy_h2d(dev, copies, n);
}

static void fx_open_counting(struct fx *f, uint64_t capacity)
{
	fx_open(f, capacity);
	g_counting = baton_backend_host;
	g_counting.name = "host-counting";
	g_counting.map = cnt_map;
	g_counting.unmap = cnt_unmap;
	g_counting.copy_h2d = cnt_copy_h2d;
	f->be = &g_counting;
	memset(&g_cnt, 0, sizeof g_cnt);
}

static struct baton_cache_stats stats_of(struct fx *f)
{
	struct baton_cache_stats st;
	cache_stats(f->c, &st);
	return st;
}

static struct baton_cache_config cfg_of(uint64_t ceiling, int verify)
{
	struct baton_cache_config cfg = { SLOT, SEG, ceiling, 0, verify };
	return cfg;
}

static void fx_cache(struct fx *f, uint64_t ceiling, int verify)
{
	struct baton_cache_config cfg = cfg_of(ceiling, verify);
	char err[256] = "";
	int rc = cache_create(f->be, f->dev, &cfg, f->items, f->n, &f->c, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "cache_create: %s", err);
}

static void fx_close(struct fx *f)
{
	cache_destroy(f->c);
	f->be->close(f->dev);
	free(f->src);
	free(f->items);
	free(f->table);
	memset(f, 0, sizeof *f);
}

static uint64_t dev_free(struct fx *f)
{
	uint64_t fr = 0, tot = 0;
	T_OK(f->be->mem_info(f->dev, &fr, &tot));
	return fr;
}

static void snap(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		f->table[i] = cache_slot_of(f->c, i);
}

static void same_table(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		T_ASSERT_MSG(cache_slot_of(f->c, i) == f->table[i],
		    "item %u: slot %lld, was %lld", i, (long long)cache_slot_of(f->c, i),
		    (long long)f->table[i]);
}

/* 1 when device address a is mapped (host backend: d2h checks it). */
static int mapped_at(struct fx *f, baton_dptr a)
{
	uint8_t b;
	return f->be->copy_d2h(f->dev, &b, a, 1) == 0;
}

/* Every item in items[0..n): its blob holds its bytes. */
static void check_bytes(struct fx *f, const uint32_t *ids, size_t n, const baton_dptr *blobs)
{
	uint8_t *buf = malloc(SLOT);
	T_ASSERT(buf);
	for (size_t j = 0; j < n; j++) {
		const struct baton_cache_item *it = &f->items[ids[j]];
		T_OK(f->be->copy_d2h(f->dev, buf, blobs[j], it->bytes));
		T_ASSERT_MSG(memcmp(buf, it->src, it->bytes) == 0, "item %u: wrong bytes", ids[j]);
	}
	free(buf);
}

static void lookup_ok(struct fx *f, const uint32_t *ids, size_t n)
{
	baton_dptr *blobs = calloc(n, sizeof *blobs);
	T_ASSERT(blobs);
	T_OK(cache_lookup(f->c, ids, n, blobs));
	check_bytes(f, ids, n, blobs);
	free(blobs);
}

/* Reads each resident item back through a lookup-free path: the table's
 * slot, found with a lookup of that one item (a hit adds one count). */
static void all_resident_bytes(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++) {
		if (cache_slot_of(f->c, i) < 0)
			continue;
		baton_dptr b;
		T_OK(cache_lookup(f->c, &i, 1, &b));
		check_bytes(f, &i, 1, &b);
	}
}

/* ---- cases -------------------------------------------------------------- */

static void t_bad_args(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 8, SLOT, SLOT, 1);
	struct baton_cache *c = NULL;
	char err[256];
	struct baton_cache_config cfg = cfg_of(8 * MiB, 0);

	cfg.slot_bytes = 0;
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	T_ASSERT(c == NULL && strstr(err, "nonzero"));
	cfg = cfg_of(8 * MiB, 0);
	cfg.segment_bytes = 0;
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	cfg = cfg_of(0, 0);
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	cfg = cfg_of(8 * MiB, 0);
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, f.items, f.n, NULL, err, sizeof err), BATON_EINVAL);
	T_EQ_ERR(cache_create(NULL, f.dev, &cfg, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	T_EQ_ERR(cache_create(f.be, f.dev, NULL, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, NULL, f.n, &c, err, sizeof err), BATON_EINVAL);
	f.items[3].bytes = SLOT + 1;
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	T_ASSERT(strstr(err, "item 3"));
	f.items[3].bytes = SLOT;
	f.items[2].src = NULL;
	T_EQ_ERR(cache_create(f.be, f.dev, &cfg, f.items, f.n, &c, err, sizeof err), BATON_EINVAL);
	f.items[2].src = f.src + 2 * SLOT;

	/* A backend without memory functions cannot hold a cache. */
	struct baton_backend nomap = baton_backend_host;
	nomap.map = NULL;
	T_EQ_ERR(cache_create(&nomap, f.dev, &cfg, f.items, f.n, &c, err, sizeof err),
	    BATON_EUNSUPPORTED);

	/* Unknown backends. */
	const struct baton_backend *be = NULL;
	T_EQ_ERR(backend_find("vulkan", &be, err, sizeof err), BATON_EINVAL);
	T_ASSERT(be == NULL && strstr(err, "vulkan"));

	/* Lookups: out of range items, missing arrays. */
	fx_cache(&f, 8 * MiB, 0);
	baton_dptr b[2];
	uint32_t ids[2] = { 0, 8 };
	T_EQ_ERR(cache_lookup(f.c, ids, 2, b), BATON_EINVAL);
	T_EQ_ERR(cache_lookup(f.c, NULL, 2, b), BATON_EINVAL);
	T_EQ_ERR(cache_lookup(f.c, ids, 1, NULL), BATON_EINVAL);
	T_OK(cache_lookup(f.c, ids, 0, b));
	T_EQ_ERR(cache_release(NULL, NULL), BATON_EINVAL);
	T_EQ_ERR(cache_refill(NULL, NULL), BATON_EINVAL);
	T_EQ_ERR(cache_resize(NULL, 0, NULL), BATON_EINVAL);
	int done;
	T_EQ_ERR(cache_refill_step(f.c, NULL, NULL), BATON_EINVAL);
	T_OK(cache_refill_step(f.c, &done, NULL)); /* no refill running: done */
	T_EQ_INT(done, 1);
	T_EQ_INT(cache_slot_of(f.c, 99), -1);
	T_EQ_STR(cache_state_name(BATON_CACHE_PARTIAL), "partial");
	T_EQ_STR(cache_state_name(42), "unknown");
	cache_destroy(NULL);
	fx_close(&f);
	dir_cleanup();
}

static void t_geometry(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 4, 1000, 1000, 2);
	/* Odd sizes: slot rounded up to 256, segment up to the granularity
	 * (2 MiB) and to a slot, ceiling down to whole segments (>= 1). */
	struct baton_cache_config cfg = { 1000, 1, 1, 0, 0 };
	char err[256];
	T_OK(cache_create(f.be, f.dev, &cfg, f.items, f.n, &f.c, err, sizeof err));
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.slot_bytes, 1024);
	T_EQ_INT(st.segment_bytes, SEG);
	T_EQ_INT(st.target_bytes, SEG);
	T_EQ_INT(st.slots_total, SEG / 1024);
	T_EQ_INT(st.state, BATON_CACHE_RELEASED); /* fresh: nothing mapped */
	T_EQ_INT(st.mapped_bytes, 0);
	cache_destroy(f.c);
	f.c = NULL;

	/* A slot larger than the granularity: the segment holds one or more. */
	cfg = (struct baton_cache_config){ 3 * MiB, SEG, 20 * MiB, 0, 0 };
	T_OK(cache_create(f.be, f.dev, &cfg, f.items, f.n, &f.c, err, sizeof err));
	cache_stats(f.c, &st);
	T_EQ_INT(st.segment_bytes, 4 * MiB);
	T_EQ_INT(st.target_bytes, 20 * MiB);
	T_EQ_INT(st.slots_total, 5);
	fx_close(&f);
	dir_cleanup();
}

/* Release gives exactly the mapped bytes back; refill takes them again. */
static void t_release_frees(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 3);
	fx_cache(&f, 16 * MiB, 0);
	T_EQ_INT(dev_free(&f), 64 * MiB);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 8);
	T_EQ_INT(rep.bytes_copied, 256 * SLOT);
	T_EQ_INT(rep.copies, 8); /* one coalesced copy per segment */
	T_ASSERT(rep.total_s >= rep.copy_s && rep.total_s > 0);
	T_EQ_INT(dev_free(&f), 48 * MiB);
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.mapped_bytes, 16 * MiB);
	T_EQ_INT(st.items_resident, 256);
	T_EQ_INT(st.slots_mapped, 256);
	snap(&f);
	for (uint32_t i = 0; i < 256; i++)
		T_EQ_INT(f.table[i], i); /* the warm-up: slot i holds item i */
	T_EQ_INT(f.table[256], -1);

	T_OK(cache_release(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_RELEASED);
	T_EQ_INT(rep.segments_unmapped, 8);
	T_EQ_INT(rep.bytes_freed, 16 * MiB);
	T_EQ_INT(dev_free(&f), 64 * MiB);
	cache_stats(f.c, &st);
	T_EQ_INT(st.mapped_bytes, 0);
	T_EQ_INT(st.items_resident, 0);
	T_EQ_INT(st.target_bytes, 16 * MiB);
	same_table(&f); /* remembered */

	/* Idempotent. */
	T_OK(cache_release(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_RELEASED);
	T_EQ_INT(rep.segments_unmapped, 0);
	T_EQ_INT(rep.bytes_freed, 0);

	/* Destroy gives everything back too. */
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(dev_free(&f), 48 * MiB);
	cache_destroy(f.c);
	f.c = NULL;
	T_EQ_INT(dev_free(&f), 64 * MiB);
	fx_close(&f);
	dir_cleanup();
}

/* 100 release/refill cycles in verify mode: 0 mismatches, same table. */
static void t_cycles_verify(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 200, SLOT, SLOT, 4);
	fx_cache(&f, 8 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.mismatches, 0);
	/* Some traffic first, so the table is not just the warm-up. */
	uint32_t ids[16];
	for (uint32_t r = 0; r < 10; r++) {
		for (uint32_t j = 0; j < 16; j++)
			ids[j] = (r * 37 + j * 11) % 200;
		lookup_ok(&f, ids, 16);
	}
	snap(&f);
	uint64_t mism = 0;
	for (int cyc = 0; cyc < 100; cyc++) {
		T_OK(cache_release(f.c, &rep));
		T_EQ_INT(rep.bytes_freed, 8 * MiB);
		T_EQ_INT(dev_free(&f), 64 * MiB);
		T_OK(cache_refill(f.c, &rep));
		T_EQ_INT(rep.state, BATON_CACHE_READY);
		T_EQ_INT(rep.segments_mapped, 4);
		mism += rep.mismatches;
		same_table(&f);
	}
	T_EQ_INT(mism, 0);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* Verify mode catches a slot that is not what the arena says; the item
 * leaves the cache rather than be served wrong. Also: the environment
 * switch. */
static void t_verify_mismatch(void)
{
	dir_setup();
	setenv("BATON_VERIFY_REFILL", "1", 1);
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 64, SLOT, SLOT, 5);
	f.items[7].checksum ^= 1;
	fx_cache(&f, 4 * MiB, 0);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.mismatches, 1);
	T_EQ_INT(cache_slot_of(f.c, 7), -1);
	T_EQ_INT(cache_slot_of(f.c, 8), 8);
	unsetenv("BATON_VERIFY_REFILL");
	fx_close(&f);
	dir_cleanup();
}

/* Items smaller than a slot, or not adjacent: one copy each, right bytes. */
static void t_coalescing(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 64, SLOT - 512, SLOT, 6);
	fx_cache(&f, 4 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.copies, 64);
	T_EQ_INT(rep.bytes_copied, 64ull * (SLOT - 512));
	T_EQ_INT(rep.mismatches, 0);
	all_resident_bytes(&f);
	fx_close(&f);

	/* Full slots but a gap between sources: not coalesced either. */
	fx_open(&f, 64 * MiB);
	fx_items(&f, 64, SLOT, SLOT + 4096, 7);
	fx_cache(&f, 4 * MiB, 1);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.copies, 64);
	T_EQ_INT(rep.mismatches, 0);
	fx_close(&f);
	dir_cleanup();
}

/* Lookups change the table (misses, evictions); a release/refill keeps
 * the changed table. */
static void t_lookup_then_refill(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 200, SLOT, SLOT, 8);
	fx_cache(&f, 4 * MiB, 1); /* 64 slots: items 0..63 */
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	/* Make items 0..31 hot, then ask for 150..159: they must evict from
	 * the cold half (32..63). */
	uint32_t hot[32];
	for (uint32_t i = 0; i < 32; i++)
		hot[i] = i;
	for (int r = 0; r < 3; r++)
		lookup_ok(&f, hot, 32);
	uint32_t ids[12] = { 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 150, 5 };
	lookup_ok(&f, ids, 12);
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.misses, 10);
	T_EQ_INT(st.evictions, 10);
	T_EQ_INT(st.hits, 96 + 1);
	for (uint32_t i = 0; i < 32; i++)
		T_ASSERT(cache_slot_of(f.c, i) == i);
	for (uint32_t i = 150; i < 160; i++) {
		int64_t s = cache_slot_of(f.c, i);
		T_ASSERT(s >= 32 && s < 64);
	}
	/* Neighbours went to neighbouring slots (ascending pairing). */
	for (uint32_t i = 151; i < 160; i++)
		T_EQ_INT(cache_slot_of(f.c, i), cache_slot_of(f.c, i - 1) + 1);
	snap(&f);
	T_OK(cache_release(f.c, &rep));
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.mismatches, 0);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* Misses and evictions in one segment; asking for more distinct items
 * than slots fails with BATON_EDEVMEM and changes nothing. */
static void t_lookup_misses(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 100, SLOT, SLOT, 9);
	fx_cache(&f, SEG, 0); /* one segment, 32 slots */
	/* A lookup on a fresh (released) cache maps what it needs; the
	 * victims are the pending warm-up slots 0..19 (nothing copied yet),
	 * the other 12 stay pending: partial until a refill fills them. */
	uint32_t ids[40];
	for (uint32_t j = 0; j < 40; j++)
		ids[j] = 50 + j;
	lookup_ok(&f, ids, 20);
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(st.misses, 20);
	T_EQ_INT(st.evictions, 20);
	T_EQ_INT(st.slots_pending, 12);
	T_EQ_INT(st.items_resident, 20);
	T_EQ_INT(st.bytes_loaded, 20ull * SLOT);
	for (uint32_t j = 0; j < 20; j++)
		T_EQ_INT(cache_slot_of(f.c, 50 + j), j);
	snap(&f);
	baton_dptr blobs[40];
	T_EQ_ERR(cache_lookup(f.c, ids, 40, blobs), BATON_EDEVMEM);
	same_table(&f);
	/* Exactly 32 distinct (with duplicates) fit. */
	uint32_t many[64];
	for (uint32_t j = 0; j < 64; j++)
		many[j] = 60 + (j % 32);
	lookup_ok(&f, many, 64);
	cache_stats(f.c, &st); /* the pending 20..31 were victims too */
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.slots_pending, 0);
	T_EQ_INT(st.items_resident, 32);
	/* Duplicates count once as a miss, each as a hit on the slot. */
	uint32_t dup[3] = { 99, 99, 99 };
	cache_stats(f.c, &st);
	uint64_t m0 = st.misses;
	lookup_ok(&f, dup, 3);
	cache_stats(f.c, &st);
	T_EQ_INT(st.misses, m0 + 1);
	fx_close(&f);
	dir_cleanup();
}

/* A request while released maps only what it needs; a refill then brings
 * the rest back, table intact. */
static void t_lookup_released(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 10);
	fx_cache(&f, 16 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	snap(&f);
	T_OK(cache_release(f.c, &rep));
	uint32_t ids[3] = { 5, 6, 200 }; /* segments 0 and 6 */
	lookup_ok(&f, ids, 3);
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(st.mapped_bytes, 2 * SEG);
	T_EQ_INT(dev_free(&f), 64 * MiB - 2 * SEG);
	T_EQ_INT(st.misses, 3); /* loaded, though into their own slots */
	same_table(&f);
	/* A miss while partial, with no room among the mapped slots' cold
	 * ones... there is room: it evicts within the mapped segments. */
	uint32_t newcomer = 290;
	lookup_ok(&f, &newcomer, 1);
	int64_t s = cache_slot_of(f.c, 290);
	T_ASSERT(s >= 0 && (s / SPS == 0 || s / SPS == 6));
	snap(&f);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 6);
	T_EQ_INT(rep.mismatches, 0);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* Hot segments come back first; a lookup during a stepwise refill gets
 * what it needs at once. */
static void t_hot_first(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 256, SLOT, SLOT, 11);
	fx_cache(&f, 16 * MiB, 1); /* 8 segments, items 0..255 */
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	/* The address of every item, and heat: segment 5 hottest, 2 next. */
	baton_dptr addr[256];
	uint32_t all[256];
	for (uint32_t i = 0; i < 256; i++)
		all[i] = i;
	T_OK(cache_lookup(f.c, all, 256, addr));
	uint32_t ids[32];
	for (int r = 0; r < 6; r++) {
		for (uint32_t j = 0; j < 32; j++)
			ids[j] = 5 * SPS + j;
		lookup_ok(&f, ids, 32);
		if (r < 3) {
			for (uint32_t j = 0; j < 32; j++)
				ids[j] = 2 * SPS + j;
			lookup_ok(&f, ids, 32);
		}
	}
	snap(&f);
	T_OK(cache_release(f.c, &rep));
	T_OK(cache_refill_begin(f.c));
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.state, BATON_CACHE_REFILLING);
	int done = 0;
	T_OK(cache_refill_step(f.c, &done, &rep));
	T_EQ_INT(done, 0);
	T_EQ_INT(rep.state, BATON_CACHE_REFILLING);
	T_EQ_INT(rep.segments_mapped, 1);
	T_ASSERT(mapped_at(&f, addr[5 * SPS]) && !mapped_at(&f, addr[2 * SPS]));
	T_OK(cache_refill_step(f.c, &done, &rep));
	T_ASSERT(mapped_at(&f, addr[2 * SPS]) && !mapped_at(&f, addr[0]));
	/* A request for segment 7 before its turn: served now, by mapping
	 * segment 7 and copying that one item. */
	cache_stats(f.c, &st);
	uint64_t loaded0 = st.bytes_loaded;
	uint32_t want[2] = { 7 * SPS + 3, 2 * SPS + 1 };
	lookup_ok(&f, want, 2);
	T_ASSERT(mapped_at(&f, addr[7 * SPS]));
	cache_stats(f.c, &st);
	T_EQ_INT(st.state, BATON_CACHE_REFILLING);
	T_EQ_INT(st.bytes_loaded - loaded0, SLOT);
	T_EQ_INT(st.slots_pending, SPS - 1);
	/* The rest in index order (equal heat): 0, 1, 3, 4, 6; then 7's
	 * pending slots, in the place the plan gave it (last). */
	const uint32_t order[] = { 0, 1, 3, 4, 6 };
	for (size_t k = 0; k < sizeof order / sizeof order[0]; k++) {
		T_ASSERT(!done);
		T_OK(cache_refill_step(f.c, &done, &rep));
		T_EQ_INT(rep.segments_mapped, 1);
		T_ASSERT_MSG(mapped_at(&f, addr[order[k] * SPS]), "segment %u not next", order[k]);
	}
	T_ASSERT(!done);
	T_OK(cache_refill_step(f.c, &done, &rep));
	T_EQ_INT(rep.segments_mapped, 0);
	T_EQ_INT(rep.bytes_copied, (SPS - 1) * SLOT);
	T_EQ_INT(rep.copies, 2); /* 7*SPS+0..2 and +4..31 */
	T_EQ_INT(rep.mismatches, 0);
	T_EQ_INT(done, 1);
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* A refill that runs out of device memory stops at what fit (PARTIAL),
 * and completes later: injected, and with a real second user. */
static void t_partial(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 20 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 12);
	fx_cache(&f, 16 * MiB, 1);
	struct baton_cache_report rep;
	snap(&f);
	cache_fault_map_after(f.c, 3);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(rep.segments_mapped, 2);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 6);
	same_table(&f);
	T_OK(cache_release(f.c, &rep));

	/* A second context (another engine) takes 10 MiB of the 20. */
	struct baton_dev *other;
	T_OK(f.be->open(0, 0, &other, NULL, 0));
	baton_dptr base;
	T_OK(f.be->reserve(other, 10 * MiB, &base));
	for (int k = 0; k < 5; k++)
		T_OK(f.be->map(other, base + k * SEG, SEG));
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(rep.segments_mapped, 5);
	T_EQ_INT(dev_free(&f), 0);
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(st.target_bytes, 16 * MiB);
	T_EQ_INT(st.mapped_bytes, 10 * MiB);
	same_table(&f); /* what did not fit is remembered */
	/* A lookup of a remembered item that cannot come back: loaded into a
	 * mapped slot instead. */
	int64_t s0 = cache_slot_of(f.c, 255);
	uint32_t it = 255;
	T_ASSERT(s0 >= 0);
	lookup_ok(&f, &it, 1);
	/* The other engine goes away: the refill completes. */
	f.be->close(other);
	snap(&f);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 3);
	T_EQ_INT(rep.mismatches, 0);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* resize keeps reserve bytes free: shrink drops the coldest segments,
 * grow maps while free - reserve allows, null grows back to the ceiling. */
static void t_resize(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 32 * MiB);
	fx_items(&f, 400, SLOT, SLOT, 13);
	fx_cache(&f, 16 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(dev_free(&f), 16 * MiB);
	/* Heat segments 1, 3, 5, 7. */
	uint32_t ids[32];
	for (uint32_t k = 1; k < 8; k += 2) {
		for (uint32_t j = 0; j < 32; j++)
			ids[j] = k * SPS + j;
		lookup_ok(&f, ids, 32);
	}
	/* Keep 24 MiB free: 4 segments (the cold 0, 2, 4, 6) go. */
	T_OK(cache_resize(f.c, 24 * MiB, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_unmapped, 4);
	T_EQ_INT(rep.bytes_freed, 8 * MiB);
	T_EQ_INT(dev_free(&f), 24 * MiB);
	struct baton_cache_stats st;
	cache_stats(f.c, &st);
	T_EQ_INT(st.target_bytes, 8 * MiB);
	T_EQ_INT(st.mapped_bytes, 8 * MiB);
	for (uint32_t k = 0; k < 8; k++)
		for (uint32_t j = 0; j < SPS; j++)
			T_EQ_INT(cache_slot_of(f.c, k * SPS + j), (k % 2) ? (int64_t)(k * SPS + j) : -1);
	/* A release and refill keep the smaller target. */
	T_OK(cache_release(f.c, &rep));
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.segments_mapped, 4);
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	/* Keep 19 MiB free: grows by 2 segments (free 24 -> 20), filled with
	 * the lowest-numbered items not in the cache. */
	T_OK(cache_resize(f.c, 19 * MiB, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 2);
	T_EQ_INT(rep.bytes_copied, 64ull * SLOT);
	T_EQ_INT(rep.mismatches, 0);
	T_EQ_INT(dev_free(&f), 20 * MiB);
	cache_stats(f.c, &st);
	T_EQ_INT(st.target_bytes, 12 * MiB);
	/* Segments 0 and 2 came back (lowest index first) with items 0..31
	 * and 64..95, the lowest missing; 128.. stay out. */
	T_EQ_INT(cache_slot_of(f.c, 0), 0);
	T_EQ_INT(cache_slot_of(f.c, 63), 63);
	T_EQ_INT(cache_slot_of(f.c, 95), 95);
	T_EQ_INT(cache_slot_of(f.c, 128), -1);
	/* null: back to the ceiling (reserve: the config's 0). */
	T_OK(cache_resize(f.c, -1, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 2);
	T_EQ_INT(dev_free(&f), 16 * MiB);
	cache_stats(f.c, &st);
	T_EQ_INT(st.target_bytes, 16 * MiB);
	T_EQ_INT(st.items_resident, 256);
	all_resident_bytes(&f);
	/* A reserve above everything: down to zero segments. */
	T_OK(cache_resize(f.c, 64 * MiB, &rep));
	cache_stats(f.c, &st);
	T_EQ_INT(st.mapped_bytes, 0);
	T_EQ_INT(st.target_bytes, 0);
	T_EQ_INT(dev_free(&f), 32 * MiB);
	uint32_t one = 3;
	baton_dptr b;
	T_EQ_ERR(cache_lookup(f.c, &one, 1, &b), BATON_EDEVMEM);
	/* Resize while released only remembers; the refill obeys it. */
	T_OK(cache_resize(f.c, -1, &rep));
	T_OK(cache_release(f.c, &rep));
	T_OK(cache_resize(f.c, 28 * MiB, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_RELEASED);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(rep.segments_mapped, 2);
	T_EQ_INT(dev_free(&f), 28 * MiB);
	T_OK(cache_resize(f.c, -1, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(dev_free(&f), 16 * MiB);
	fx_close(&f);
	dir_cleanup();
}

/* ---- lookups while released: only what is needed is copied ------------- */

/* After a release, a lookup of k items maps only their segments and copies
 * only their bytes; the rest of those segments is pending. The refill then
 * fills the pending slots and maps the rest: the same table as before the
 * release, 0 mismatches. */
static void t_lookup_copies_only_needed(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open_counting(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 17);
	fx_cache(&f, 16 * MiB, 1); /* 8 segments, 256 slots: the warm-up */
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(g_cnt.maps, 8);
	T_EQ_INT(g_cnt.copy_bytes, 256ull * SLOT);
	T_EQ_INT(stats_of(&f).bytes_loaded, 256ull * SLOT);
	snap(&f);
	T_OK(cache_release(f.c, &rep));

	memset(&g_cnt, 0, sizeof g_cnt);
	uint64_t loaded0 = stats_of(&f).bytes_loaded;
	uint32_t ids[4] = { 5, 6, 200, 5 }; /* segments 0 and 6 */
	lookup_ok(&f, ids, 4);
	T_EQ_INT(g_cnt.maps, 2);
	T_EQ_INT(g_cnt.copy_calls, 1); /* one batch */
	T_EQ_INT(g_cnt.copies, 2);     /* 5 and 6 coalesced, 200 */
	T_EQ_INT(g_cnt.copy_bytes, 3ull * SLOT);
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.bytes_loaded - loaded0, 3ull * SLOT);
	T_EQ_INT(st.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(st.mapped_bytes, 2 * SEG);
	T_EQ_INT(st.slots_mapped, 2 * SPS);
	T_EQ_INT(st.items_resident, 3);
	T_EQ_INT(st.slots_pending, 2 * SPS - 3);
	T_EQ_INT(st.misses, 3);
	T_EQ_INT(st.evictions, 0);
	T_EQ_INT(dev_free(&f), 64 * MiB - 2 * SEG);
	same_table(&f); /* pending slots keep their items */

	/* Again: hits now, nothing mapped or copied. */
	memset(&g_cnt, 0, sizeof g_cnt);
	lookup_ok(&f, ids, 4);
	T_EQ_INT(g_cnt.maps + g_cnt.copy_calls, 0);
	T_EQ_INT(stats_of(&f).hits, 3);

	/* The refill: 6 segments mapped, the 2 * 32 - 3 pending filled. */
	memset(&g_cnt, 0, sizeof g_cnt);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 6);
	T_EQ_INT(rep.bytes_copied, 253ull * SLOT);
	T_EQ_INT(g_cnt.copy_bytes, 253ull * SLOT);
	T_EQ_INT(rep.copies, 6 + 2 + 2); /* 0..4|7..31, 192..199|201..223 */
	T_EQ_INT(rep.mismatches, 0);
	T_EQ_INT(g_cnt.maps, 6);
	st = stats_of(&f);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.slots_pending, 0);
	T_EQ_INT(st.items_resident, 256);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* One lookup mixing a resident item, a pending one, one whose segment is
 * not mapped and one never cached: one new segment, three copies; the
 * miss takes a pending slot (no bytes lost), whose item is no longer
 * remembered. */
static void t_lookup_mixed(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open_counting(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 18);
	fx_cache(&f, 16 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	snap(&f);
	T_OK(cache_release(f.c, &rep));
	uint32_t first = 5;
	lookup_ok(&f, &first, 1); /* segment 0 mapped, 5 resident, rest pending */
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.slots_pending, SPS - 1);

	memset(&g_cnt, 0, sizeof g_cnt);
	uint64_t loaded0 = st.bytes_loaded;
	/* 5 resident, 10 pending, 40 in unmapped segment 1, 299 not cached. */
	uint32_t ids[5] = { 299, 40, 10, 5, 10 };
	lookup_ok(&f, ids, 5);
	T_EQ_INT(g_cnt.maps, 1);
	T_EQ_INT(g_cnt.copy_calls, 1);
	T_EQ_INT(g_cnt.copy_bytes, 3ull * SLOT);
	st = stats_of(&f);
	T_EQ_INT(st.bytes_loaded - loaded0, 3ull * SLOT);
	T_EQ_INT(st.hits, 1);
	T_EQ_INT(st.misses, 1 + 3); /* 5 before; 10, 40 loaded, 299 */
	T_EQ_INT(st.evictions, 1);
	T_EQ_INT(st.items_resident, 4);
	T_EQ_INT(st.slots_pending, 2 * SPS - 4);
	T_EQ_INT(st.mapped_bytes, 2 * SEG);
	/* Remembered slots kept; the victim: pending slot 0 (0 hits, lowest). */
	T_EQ_INT(cache_slot_of(f.c, 5), 5);
	T_EQ_INT(cache_slot_of(f.c, 10), 10);
	T_EQ_INT(cache_slot_of(f.c, 40), 40);
	T_EQ_INT(cache_slot_of(f.c, 299), 0);
	T_EQ_INT(cache_slot_of(f.c, 0), -1);
	f.table[299] = 0;
	f.table[0] = -1;
	same_table(&f);

	/* The refill fills around what is there; item 0 stays out. */
	memset(&g_cnt, 0, sizeof g_cnt);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 6);
	T_EQ_INT(rep.bytes_copied, 252ull * SLOT);
	T_EQ_INT(rep.mismatches, 0);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* Victims at equal hits: a pending slot before a filled one, whatever the
 * index; with fewer hits, a filled slot still goes first. */
static void t_evict_pending_first(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 19);
	fx_cache(&f, 8 * MiB, 0); /* 4 segments */
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_OK(cache_release(f.c, &rep));
	/* Step 1 of the refill maps and fills segment 0 (equal heat: lowest
	 * index); a lookup then maps segment 1 for item 40. */
	int done = 0;
	T_OK(cache_refill_begin(f.c));
	T_OK(cache_refill_step(f.c, &done, &rep));
	T_EQ_INT(rep.segments_mapped, 1);
	uint32_t forty = 40;
	lookup_ok(&f, &forty, 1);
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.slots_pending, SPS - 1);
	/* A miss: segment 0's slots are filled with 0 hits, segment 1's
	 * pending with 0 hits: slot 32 goes. */
	uint32_t newcomer = 299;
	lookup_ok(&f, &newcomer, 1);
	T_EQ_INT(cache_slot_of(f.c, 299), SPS);
	T_EQ_INT(cache_slot_of(f.c, SPS), -1);
	T_EQ_INT(cache_slot_of(f.c, 0), 0);
	st = stats_of(&f);
	T_EQ_INT(st.evictions, 1);
	T_EQ_INT(st.slots_pending, SPS - 2);
	/* Segment 1's pending slots but 33 are looked up (filled, 1 hit
	 * each). Two misses then take 33 (pending, 0 hits) and slot 0
	 * (filled, 0 hits, lowest index) before any slot with hits. */
	uint32_t ids[SPS];
	baton_dptr blobs[SPS];
	uint32_t n = 0;
	for (uint32_t i = SPS + 2; i < 2 * SPS; i++)
		ids[n++] = i;
	T_OK(cache_lookup(f.c, ids, n, blobs));
	check_bytes(&f, ids, n, blobs);
	T_EQ_INT(stats_of(&f).slots_pending, 1);
	uint32_t two[2] = { 298, 297 };
	lookup_ok(&f, two, 2);
	T_EQ_INT(cache_slot_of(f.c, 297), 0); /* pairing: lower item, lower slot */
	T_EQ_INT(cache_slot_of(f.c, 298), SPS + 1);
	T_EQ_INT(cache_slot_of(f.c, SPS + 1), -1);
	T_EQ_INT(cache_slot_of(f.c, 0), -1);
	snap(&f);
	while (!done)
		T_OK(cache_refill_step(f.c, &done, &rep));
	st = stats_of(&f);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.slots_pending, 0);
	same_table(&f);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* Verify mode reads back the pending slots a refill fills. */
static void t_verify_pending(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 64, SLOT, SLOT, 20);
	fx_cache(&f, 4 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.mismatches, 0);
	T_OK(cache_release(f.c, &rep));
	uint32_t five = 5;
	lookup_ok(&f, &five, 1);
	T_EQ_INT(stats_of(&f).slots_pending, SPS - 1);
	f.items[20].checksum ^= 1; /* pending in segment 0 */
	f.items[40].checksum ^= 1; /* remembered in segment 1 */
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(rep.mismatches, 2);
	T_EQ_INT(cache_slot_of(f.c, 20), -1);
	T_EQ_INT(cache_slot_of(f.c, 40), -1);
	T_EQ_INT(cache_slot_of(f.c, 21), 21);
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.slots_pending, 0);
	T_EQ_INT(st.items_resident, 62);
	fx_close(&f);
	dir_cleanup();
}

/* The device is full: a refill that cannot map a (hotter) segment still
 * fills the pending slots of the mapped ones, stepwise or not. */
static void t_pending_partial(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 21);
	fx_cache(&f, 16 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	uint32_t ids[SPS];
	for (uint32_t j = 0; j < SPS; j++)
		ids[j] = 3 * SPS + j; /* segment 3 hottest */
	for (int r = 0; r < 3; r++)
		lookup_ok(&f, ids, SPS);
	snap(&f);

	for (int stepwise = 0; stepwise < 2; stepwise++) {
		T_OK(cache_release(f.c, &rep));
		uint32_t five = 5;
		lookup_ok(&f, &five, 1); /* segment 0: 1 filled, 31 pending */
		cache_fault_map_after(f.c, 1); /* the next map fails */
		if (stepwise) {
			int done = 0;
			T_OK(cache_refill_begin(f.c));
			/* Segment 3 first: it does not fit; the step goes on to
			 * segment 0's pending slots; nothing else can be done. */
			T_OK(cache_refill_step(f.c, &done, &rep));
			T_EQ_INT(done, 1);
		} else {
			T_OK(cache_refill(f.c, &rep));
		}
		T_EQ_INT(rep.state, BATON_CACHE_PARTIAL);
		T_EQ_INT(rep.segments_mapped, 0);
		T_EQ_INT(rep.bytes_copied, (SPS - 1) * SLOT);
		T_EQ_INT(rep.mismatches, 0);
		struct baton_cache_stats st = stats_of(&f);
		T_EQ_INT(st.state, BATON_CACHE_PARTIAL);
		T_EQ_INT(st.slots_pending, 0);
		T_EQ_INT(st.items_resident, SPS);
		T_EQ_INT(st.mapped_bytes, SEG);
		same_table(&f);
		/* Memory again: the refill completes. */
		T_OK(cache_refill(f.c, &rep));
		T_EQ_INT(rep.state, BATON_CACHE_READY);
		T_EQ_INT(rep.segments_mapped, 7);
		T_EQ_INT(rep.mismatches, 0);
		same_table(&f);
	}

	/* A release while pending keeps the table (pending slots are
	 * remembered again); a shrink drops a pending segment like any other
	 * and fills what stays pending. */
	T_OK(cache_release(f.c, &rep));
	uint32_t two[2] = { 5, 7 * SPS };
	lookup_ok(&f, two, 2);
	T_EQ_INT(stats_of(&f).slots_pending, 2 * SPS - 2);
	T_OK(cache_release(f.c, &rep));
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.slots_pending, 0);
	T_EQ_INT(st.items_resident, 0);
	T_EQ_INT(st.state, BATON_CACHE_RELEASED);
	T_EQ_INT(rep.segments_unmapped, 2);
	same_table(&f);
	lookup_ok(&f, two, 2); /* 5 is hotter than 7 * SPS */
	T_OK(cache_resize(f.c, 62 * MiB, &rep)); /* 60 MiB free: one segment goes */
	T_EQ_INT(rep.segments_unmapped, 1);
	T_EQ_INT(rep.segments_mapped, 0);
	T_EQ_INT(rep.bytes_copied, (SPS - 1) * SLOT);
	st = stats_of(&f);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.slots_pending, 0);
	T_EQ_INT(st.target_bytes, SEG);
	T_EQ_INT(st.mapped_bytes, SEG);
	T_EQ_INT(st.items_resident, SPS);
	T_EQ_INT(cache_slot_of(f.c, 5), 5);
	T_EQ_INT(cache_slot_of(f.c, 7 * SPS), -1);
	all_resident_bytes(&f);
	T_OK(cache_resize(f.c, -1, &rep));
	st = stats_of(&f);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.items_resident, 8 * SPS);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* 100 cycles of release, a request (a few items), then the refill: the
 * table never changes, 0 mismatches. */
static void t_cycles_lookup(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 200, SLOT, SLOT, 22);
	fx_cache(&f, 8 * MiB, 1);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	snap(&f);
	uint64_t mism = 0;
	for (uint32_t cyc = 0; cyc < 100; cyc++) {
		T_OK(cache_release(f.c, &rep));
		uint32_t ids[6];
		for (uint32_t j = 0; j < 6; j++)
			ids[j] = (cyc * 29 + j * 41) % 128; /* all cached */
		uint64_t before = stats_of(&f).bytes_loaded;
		lookup_ok(&f, ids, 6);
		struct baton_cache_stats st = stats_of(&f);
		T_ASSERT(st.bytes_loaded - before <= 6ull * SLOT);
		T_EQ_INT(st.state, BATON_CACHE_PARTIAL);
		T_OK(cache_refill(f.c, &rep));
		T_EQ_INT(rep.state, BATON_CACHE_READY);
		T_EQ_INT(rep.bytes_copied + st.bytes_loaded - before, 128ull * SLOT);
		mism += rep.mismatches;
		same_table(&f);
	}
	T_EQ_INT(mism, 0);
	all_resident_bytes(&f);
	fx_close(&f);
	dir_cleanup();
}

/* ---- two processes on one small host device ------------------------------- */

static void rd(int fd, void *p, size_t n)
{
	T_ASSERT(read(fd, p, n) == (ssize_t)n);
}

static void wr(int fd, const void *p, size_t n)
{
	T_ASSERT(write(fd, p, n) == (ssize_t)n);
}

/* The second engine grows only into what the first left. */
static void t_two_processes(void)
{
	dir_setup();
	struct fx a = { 0 };
	fx_open(&a, 16 * MiB);
	fx_items(&a, 200, SLOT, SLOT, 14);
	fx_cache(&a, 12 * MiB, 0);
	struct baton_cache_report rep;
	T_OK(cache_refill(a.c, &rep));
	T_EQ_INT(dev_free(&a), 4 * MiB);

	int up[2], down[2];
	T_ASSERT(pipe(up) == 0 && pipe(down) == 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		/* Engine B: its own context on host device 0. */
		struct fx b = { 0 };
		fx_open(&b, 16 * MiB);
		fx_items(&b, 200, SLOT, SLOT, 15);
		fx_cache(&b, 12 * MiB, 1);
		struct baton_cache_report r;
		uint64_t msg[3];
		T_OK(cache_refill(b.c, &r));
		msg[0] = (uint64_t)r.state, msg[1] = r.segments_mapped, msg[2] = dev_free(&b);
		wr(up[1], msg, sizeof msg);
		char go;
		rd(down[0], &go, 1);
		/* A released: grow, keeping 2 MiB free. */
		T_OK(cache_resize(b.c, 2 * (int64_t)MiB, &r));
		msg[0] = (uint64_t)r.state, msg[1] = r.segments_mapped, msg[2] = r.mismatches;
		wr(up[1], msg, sizeof msg);
		rd(down[0], &go, 1);
		fx_close(&b);
		_exit(0);
	}
	uint64_t msg[3];
	rd(up[0], msg, sizeof msg);
	T_EQ_INT(msg[0], BATON_CACHE_PARTIAL);
	T_EQ_INT(msg[1], 2); /* the 4 MiB A left */
	T_EQ_INT(msg[2], 0);
	T_EQ_INT(dev_free(&a), 0);

	T_OK(cache_release(a.c, &rep));
	T_EQ_INT(rep.bytes_freed, 12 * MiB);
	wr(down[1], "g", 1);
	rd(up[0], msg, sizeof msg);
	T_EQ_INT(msg[0], BATON_CACHE_READY);
	T_EQ_INT(msg[1], 4); /* up to its ceiling of 6 */
	T_EQ_INT(msg[2], 0);
	T_EQ_INT(dev_free(&a), 4 * MiB);

	/* A comes back: only 4 MiB fit, until B is gone. */
	T_OK(cache_refill(a.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_PARTIAL);
	T_EQ_INT(rep.segments_mapped, 2);
	wr(down[1], "g", 1);
	int st = 0;
	T_ASSERT(waitpid(pid, &st, 0) == pid);
	T_ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "engine B failed");
	T_OK(cache_refill(a.c, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_READY);
	T_EQ_INT(rep.segments_mapped, 4);
	T_EQ_INT(dev_free(&a), 4 * MiB);
	all_resident_bytes(&a);
	fx_close(&a);
	dir_cleanup();
}

/* kill -9 of an engine that holds host-device memory returns it. */
static void t_kill9_returns(void)
{
	dir_setup();
	struct fx a = { 0 };
	fx_open(&a, 16 * MiB);
	int up[2];
	T_ASSERT(pipe(up) == 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		struct fx b = { 0 };
		fx_open(&b, 16 * MiB);
		fx_items(&b, 200, SLOT, SLOT, 16);
		fx_cache(&b, 12 * MiB, 0);
		struct baton_cache_report r;
		T_OK(cache_refill(b.c, &r));
		wr(up[1], "r", 1);
		for (;;)
			pause();
	}
	char ready;
	rd(up[0], &ready, 1);
	T_EQ_INT(dev_free(&a), 4 * MiB);
	T_ASSERT(kill(pid, SIGKILL) == 0);
	/* Seen dead as soon as it has exited (a zombie counts as dead). */
	double t0 = t_now();
	while (dev_free(&a) != 16 * MiB && t_now() - t0 < 5)
		usleep(1000);
	T_EQ_INT(dev_free(&a), 16 * MiB);
	waitpid(pid, NULL, 0);
	T_EQ_INT(dev_free(&a), 16 * MiB);
	fx_close(&a);
	dir_cleanup();
}

/* ---- the peer tier ------------------------------------------------------ */

/* Host device 1 as the peer, of `capacity`. */
static struct baton_dev *peer_open(uint64_t capacity)
{
	struct baton_dev *p = NULL;
	char err[256] = "";
	int rc = baton_backend_host.open(1, capacity, &p, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "open peer: %s", err);
	return p;
}

static uint64_t peer_free(struct baton_dev *p)
{
	uint64_t fr = 0, tot = 0;
	T_OK(baton_backend_host.mem_info(p, &fr, &tot));
	return fr;
}

/* Looks items[0..n) up one call each; returns the misses they made. */
static uint64_t misses_of(struct fx *f, const uint32_t *ids, size_t n)
{
	uint64_t m0 = stats_of(f).misses;
	lookup_ok(f, ids, n);
	return stats_of(f).misses - m0;
}

static void range_ids(uint32_t *ids, uint32_t from, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = from + i;
}

/* Lend, use, partial when the peer is full, revoke, lend again, shrink. */
static void t_peer_set_use(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 200, SLOT, SLOT, 21);
	fx_cache(&f, 2 * SEG, 0); /* 64 slots of 200 items */
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(cache_peer_want(f.c), 5 * SEG); /* 136 items: 5 segments of 32 */
	struct baton_dev *peer = peer_open(8 * MiB);
	uint64_t own_free = dev_free(&f);

	/* Asked for 10 MiB, the peer has 8: 4 segments, the 128 items after
	 * the own tier's (no heat yet: lowest index first). */
	T_OK(cache_peer_set(f.c, peer, 10 * MiB, &rep));
	T_EQ_INT(rep.segments_mapped, 4);
	T_EQ_INT(rep.bytes_copied, 128 * SLOT);
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.peer_mapped_bytes, 8 * MiB);
	T_EQ_INT(st.peer_items_resident, 128);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(peer_free(peer), 0);
	T_EQ_INT(dev_free(&f), own_free); /* charged to the peer, not here */
	for (uint32_t i = 0; i < 200; i++)
		T_EQ_INT(cache_peer_slot_of(f.c, i) >= 0, i >= 64 && i < 192);

	/* Items on the peer are hits, read in place with the right bytes. */
	uint32_t ids[200];
	range_ids(ids, 64, 128);
	T_EQ_INT(misses_of(&f, ids, 128), 0);
	st = stats_of(&f);
	T_EQ_INT(st.peer_hits, 128);
	range_ids(ids, 0, 200);
	T_EQ_INT(misses_of(&f, ids, 64), 0);
	T_EQ_INT(misses_of(&f, ids + 192, 8), 8); /* neither tier: loaded into own */
	T_EQ_INT(stats_of(&f).peer_items_resident, 128);

	/* Revoke: the memory is back on the peer, the items were only copies. */
	T_OK(cache_peer_set(f.c, NULL, 0, &rep));
	T_EQ_INT(rep.peer_bytes_freed, 8 * MiB);
	T_EQ_INT(rep.segments_unmapped, 4);
	T_EQ_INT(peer_free(peer), 8 * MiB);
	st = stats_of(&f);
	T_EQ_INT(st.peer_mapped_bytes, 0);
	T_EQ_INT(st.peer_items_resident, 0);
	T_EQ_INT(cache_peer_slot_of(f.c, 100), -1);
	range_ids(ids, 100, 10);
	T_EQ_INT(misses_of(&f, ids, 10), 10);
	T_OK(cache_peer_set(f.c, NULL, 0, &rep)); /* idempotent */
	T_EQ_INT(rep.peer_bytes_freed, 0);

	/* Lend again, smaller; then shrink by one segment. */
	T_OK(cache_peer_set(f.c, peer, 4 * MiB + 123, &rep));
	T_EQ_INT(rep.segments_mapped, 2);
	T_EQ_INT(stats_of(&f).peer_items_resident, 64);
	T_EQ_INT(peer_free(peer), 4 * MiB);
	range_ids(ids, 0, 200);
	lookup_ok(&f, ids, 200 > 64 ? 64 : 200);
	T_OK(cache_peer_set(f.c, peer, 2 * MiB, &rep));
	T_EQ_INT(rep.segments_unmapped, 1);
	T_EQ_INT(rep.peer_bytes_freed, 2 * MiB);
	T_EQ_INT(stats_of(&f).peer_items_resident, 32);
	T_EQ_INT(peer_free(peer), 6 * MiB);
	/* Every item is served with its bytes, whichever tier holds it. */
	for (uint32_t i = 0; i < 200; i += 8)
		lookup_ok(&f, ids + i, 8);

	cache_destroy(f.c); /* unmaps the peer tier too */
	f.c = NULL;
	T_EQ_INT(peer_free(peer), 8 * MiB);
	baton_backend_host.close(peer);
	fx_close(&f);
	dir_cleanup();
}

/* Bad requests change nothing. */
static void t_peer_bad(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 100, SLOT, SLOT, 22);
	fx_cache(&f, SEG, 0);
	struct baton_dev *peer = peer_open(8 * MiB);
	struct baton_cache_report rep;

	/* A fresh cache is released: it may not borrow. */
	T_EQ_ERR(cache_peer_set(f.c, peer, 4 * MiB, &rep), BATON_ESTATE);
	T_EQ_INT(peer_free(peer), 8 * MiB);
	T_OK(cache_refill(f.c, &rep));
	T_EQ_ERR(cache_peer_set(f.c, NULL, 4 * MiB, &rep), BATON_EINVAL);
	T_EQ_ERR(cache_peer_set(f.c, f.dev, 4 * MiB, &rep), BATON_EINVAL);
	T_EQ_ERR(cache_peer_set(NULL, peer, 4 * MiB, &rep), BATON_EINVAL);
	/* Less than a segment: nothing mapped, not an error. */
	T_OK(cache_peer_set(f.c, peer, MiB, &rep));
	T_EQ_INT(stats_of(&f).peer_mapped_bytes, 0);

	T_OK(cache_peer_set(f.c, peer, 4 * MiB, &rep));
	T_EQ_INT(peer_free(peer), 4 * MiB);
	/* Another peer while one is mapped. */
	struct baton_dev *other = NULL;
	char err[256] = "";
	T_ASSERT_MSG(baton_backend_host.open(2, 8 * MiB, &other, err, sizeof err) == 0, "%s", err);
	T_EQ_ERR(cache_peer_set(f.c, other, 4 * MiB, &rep), BATON_EINVAL);
	T_EQ_INT(peer_free(peer), 4 * MiB);
	T_EQ_INT(peer_free(other), 8 * MiB);
	T_EQ_INT(stats_of(&f).peer_items_resident, 64);

	/* A backend without the peer slots. */
	struct baton_backend nopeer = baton_backend_host;
	nopeer.map_peer = NULL;
	nopeer.unmap_peer = NULL;
	struct fx g = { 0 };
	fx_open(&g, 0);
	g.be = &nopeer;
	fx_items(&g, 100, SLOT, SLOT, 23);
	fx_cache(&g, SEG, 0);
	T_OK(cache_refill(g.c, &rep));
	T_EQ_ERR(cache_peer_set(g.c, other, 4 * MiB, &rep), BATON_EUNSUPPORTED);
	T_EQ_INT(peer_free(other), 8 * MiB);

	fx_close(&g);
	cache_destroy(f.c);
	f.c = NULL;
	baton_backend_host.close(other);
	baton_backend_host.close(peer);
	fx_close(&f);
	dir_cleanup();
}

/* Release drops the peer tier; refill brings back the own tier only. */
static void t_peer_release(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 100, SLOT, SLOT, 24);
	fx_cache(&f, SEG, 0);
	struct baton_dev *peer = peer_open(8 * MiB);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_OK(cache_peer_set(f.c, peer, 8 * MiB, &rep));
	T_EQ_INT(rep.segments_mapped, 3); /* 68 items left: 3 segments is all it can use */
	T_EQ_INT(stats_of(&f).peer_items_resident, 68);
	T_EQ_INT(peer_free(peer), 2 * MiB);

	T_OK(cache_release(f.c, &rep));
	T_EQ_INT(rep.bytes_freed, SEG);
	T_EQ_INT(rep.peer_bytes_freed, 6 * MiB);
	T_EQ_INT(peer_free(peer), 8 * MiB);
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.peer_mapped_bytes, 0);
	T_EQ_INT(st.state, BATON_CACHE_RELEASED);
	T_EQ_ERR(cache_peer_set(f.c, peer, 8 * MiB, &rep), BATON_ESTATE);
	T_EQ_INT(peer_free(peer), 8 * MiB);

	T_OK(cache_refill(f.c, &rep));
	st = stats_of(&f);
	T_EQ_INT(st.state, BATON_CACHE_READY);
	T_EQ_INT(st.peer_mapped_bytes, 0);
	T_EQ_INT(st.items_resident, 32);
	T_EQ_INT(peer_free(peer), 8 * MiB);
	uint32_t ids[100];
	range_ids(ids, 0, 100);
	for (uint32_t i = 0; i < 100; i += 10)
		lookup_ok(&f, ids + i, 10);
	cache_destroy(f.c);
	f.c = NULL;
	baton_backend_host.close(peer);
	fx_close(&f);
	dir_cleanup();
}

/* Experts move between the tiers by heat: promotion and intake. With
 * copy_d2d a promotion is copied from the peer slot, else from the host. */
static void peer_heat(int d2d)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	struct baton_backend no_d2d = baton_backend_host;
	no_d2d.copy_d2d = NULL;
	if (!d2d)
		f.be = &no_d2d;
	fx_items(&f, 200, SLOT, SLOT, 25);
	fx_cache(&f, SEG, 0); /* own: 32 slots */
	struct baton_dev *peer = peer_open(2 * MiB); /* peer: 32 slots */
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_OK(cache_peer_set(f.c, peer, 2 * MiB, &rep));
	cache_peer_tune(f.c, 0, 8); /* rebalance only when asked */
	T_EQ_INT(cache_peer_slot_of(f.c, 40), 8); /* items 32..63 */

	/* Promotion: peer item 40, hot, swaps with the coldest own item
	 * (0: every own item is cold, ties to the lower slot). */
	uint32_t i40 = 40, ids[64];
	for (int k = 0; k < 5; k++)
		lookup_ok(&f, &i40, 1);
	T_EQ_INT(cache_slot_of(f.c, 40), -1);
	T_OK(cache_peer_rebalance(f.c, &rep));
	T_EQ_INT(rep.bytes_copied, d2d ? SLOT : 2 * SLOT); /* from the host: the demotion (and the promotion) */
	T_EQ_INT(rep.copies, 2);
	T_ASSERT(cache_slot_of(f.c, 40) >= 0);
	T_EQ_INT(cache_peer_slot_of(f.c, 40), -1);
	T_EQ_INT(cache_peer_slot_of(f.c, 0), 8); /* item 0 took 40's peer slot */
	T_EQ_INT(stats_of(&f).peer_moves, 2);
	uint64_t m0 = stats_of(&f).misses;
	uint32_t two[2] = { 40, 0 };
	lookup_ok(&f, two, 2);
	T_EQ_INT(stats_of(&f).misses, m0);
	/* Nothing hotter left: a second rebalance moves nothing. */
	T_OK(cache_peer_rebalance(f.c, &rep));
	T_EQ_INT(rep.bytes_copied, 0);

	/* Intake: 100..131 get hot in the own tier, are pushed out by
	 * 132..163 (and so is 40), and then 40 (the hottest) and 100..106
	 * displace the 8 coldest peer items. */
	range_ids(ids, 100, 32);
	for (int k = 0; k < 3; k++)
		lookup_ok(&f, ids, 32);
	range_ids(ids, 132, 32);
	lookup_ok(&f, ids, 32);
	T_EQ_INT(cache_slot_of(f.c, 100), -1);
	T_OK(cache_peer_rebalance(f.c, &rep));
	for (uint32_t i = 100; i < 132; i++)
		T_ASSERT_MSG((cache_peer_slot_of(f.c, i) >= 0) == (i < 107), "item %u: peer slot %lld",
		    i, (long long)cache_peer_slot_of(f.c, i));
	/* the 8 coldest were 32..39 (slot 8 holds 0, looked up once) */
	for (uint32_t i = 32; i < 64; i++)
		T_ASSERT_MSG((cache_peer_slot_of(f.c, i) >= 0) == (i >= 40), "item %u: peer slot %lld",
		    i, (long long)cache_peer_slot_of(f.c, i));
	T_EQ_INT(cache_peer_slot_of(f.c, 0), 8);
	T_EQ_INT(cache_slot_of(f.c, 40), -1);
	range_ids(ids, 100, 7);
	ids[7] = 40;
	m0 = stats_of(&f).misses;
	lookup_ok(&f, ids, 8);
	T_EQ_INT(stats_of(&f).misses, m0);

	/* In the serve path: every lookup rebalances first. */
	cache_peer_tune(f.c, 1, 8);
	range_ids(ids, 108, 8);
	for (int k = 0; k < 4; k++)
		lookup_ok(&f, ids, 8); /* loaded into own, heat 4 each */
	range_ids(ids, 166, 32);
	lookup_ok(&f, ids, 32); /* pushes 108..115 out of the own tier */
	uint32_t one = 199;
	/* (meanwhile those lookups promoted 40 and 100..106, heat 7 and 4,
	 * over own items of heat 1, and the 32 misses pushed them out again) */
	lookup_ok(&f, &one, 1); /* rebalances first: 40 and 108..114 (heat 7) come to the peer */
	for (uint32_t i = 108; i < 115; i++)
		T_ASSERT_MSG(cache_peer_slot_of(f.c, i) >= 0, "item %u not on the peer", i);
	T_ASSERT(cache_peer_slot_of(f.c, 40) >= 0);
	T_EQ_INT(cache_peer_slot_of(f.c, 115), -1);
	for (uint32_t i = 0; i < 200; i += 25) {
		range_ids(ids, i, 25);
		lookup_ok(&f, ids, 25);
	}
	cache_destroy(f.c);
	f.c = NULL;
	baton_backend_host.close(peer);
	fx_close(&f);
	dir_cleanup();
}

static void t_peer_heat(void)
{
	peer_heat(1);
}

static void t_peer_heat_no_d2d(void)
{
	peer_heat(0);
}

/* kill -9 of a process holding a peer tier gives the peer's memory back. */
static void t_peer_kill9(void)
{
	dir_setup();
	struct baton_dev *peer = peer_open(8 * MiB);
	int up[2];
	T_ASSERT(pipe(up) == 0);
	pid_t pid = fork();
	T_ASSERT(pid >= 0);
	if (pid == 0) {
		struct fx b = { 0 };
		fx_open(&b, 16 * MiB);
		fx_items(&b, 200, SLOT, SLOT, 26);
		fx_cache(&b, SEG, 0);
		struct baton_dev *p = peer_open(8 * MiB);
		struct baton_cache_report r;
		T_OK(cache_refill(b.c, &r));
		T_OK(cache_peer_set(b.c, p, 6 * MiB, &r));
		wr(up[1], "r", 1);
		for (;;)
			pause();
	}
	char ready;
	rd(up[0], &ready, 1);
	T_EQ_INT(peer_free(peer), 2 * MiB);
	T_ASSERT(kill(pid, SIGKILL) == 0);
	double t0 = t_now();
	while (peer_free(peer) != 8 * MiB && t_now() - t0 < 5)
		usleep(1000);
	T_EQ_INT(peer_free(peer), 8 * MiB);
	waitpid(pid, NULL, 0);
	baton_backend_host.close(peer);
	dir_cleanup();
}

/* Verify mode checks peer slots too; a failed copy empties the slots it
 * meant to fill, and what is served stays right. */
static int g_fail_copies;
static int failing_copy_h2d(struct baton_dev *dev, const struct baton_copy *copies, size_t n)
{
	if (g_fail_copies)
		return BATON_EDRIVER;
	return baton_backend_host.copy_h2d(dev, copies, n);
}

static void t_peer_verify_and_faults(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 100, SLOT, SLOT, 27);
	f.items[40].checksum ^= 1; /* the bytes of 40 "arrive wrong" */
	fx_cache(&f, SEG, 1);
	struct baton_dev *peer = peer_open(8 * MiB);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_OK(cache_peer_set(f.c, peer, 8 * MiB, &rep));
	T_EQ_INT(rep.mismatches, 1);
	T_EQ_INT(cache_peer_slot_of(f.c, 40), -1);
	T_EQ_INT(stats_of(&f).peer_items_resident, 67);
	f.items[40].checksum ^= 1;
	cache_destroy(f.c);
	f.c = NULL;

	/* Copies fail while lending: the error comes back, the segments are
	 * mapped but hold nothing, lookups load from the host as before. */
	struct baton_backend failing = baton_backend_host;
	failing.copy_h2d = failing_copy_h2d;
	f.be = &failing;
	fx_cache(&f, SEG, 0);
	T_OK(cache_refill(f.c, &rep));
	g_fail_copies = 1;
	T_EQ_ERR(cache_peer_set(f.c, peer, 8 * MiB, &rep), BATON_EDRIVER);
	g_fail_copies = 0;
	struct baton_cache_stats st = stats_of(&f);
	T_EQ_INT(st.peer_items_resident, 0);
	T_EQ_INT(st.peer_mapped_bytes, 6 * MiB);
	uint32_t ids[100];
	range_ids(ids, 32, 10);
	T_EQ_INT(misses_of(&f, ids, 10), 10);
	/* Lending again fills the empty slots. */
	T_OK(cache_peer_set(f.c, peer, 8 * MiB, &rep));
	T_EQ_INT(stats_of(&f).peer_items_resident, 68); /* all 68 outside the own tier */
	range_ids(ids, 0, 100);
	for (uint32_t i = 0; i < 100; i += 20)
		lookup_ok(&f, ids + i, 20);
	cache_destroy(f.c);
	f.c = NULL;
	T_EQ_INT(peer_free(peer), 8 * MiB);
	baton_backend_host.close(peer);
	fx_close(&f);
	dir_cleanup();
}

T_MAIN(T_CASE(t_bad_args), T_CASE(t_geometry), T_CASE(t_release_frees),
    T_CASE_TIMEOUT(t_cycles_verify, 120), T_CASE(t_verify_mismatch), T_CASE(t_coalescing),
    T_CASE(t_lookup_then_refill), T_CASE(t_lookup_misses), T_CASE(t_lookup_released),
    T_CASE(t_hot_first), T_CASE(t_partial), T_CASE(t_resize),
    T_CASE(t_lookup_copies_only_needed), T_CASE(t_lookup_mixed),
    T_CASE(t_evict_pending_first), T_CASE(t_verify_pending), T_CASE(t_pending_partial),
    T_CASE_TIMEOUT(t_cycles_lookup, 120), T_CASE(t_two_processes), T_CASE(t_kill9_returns),
    T_CASE(t_peer_set_use), T_CASE(t_peer_bad), T_CASE(t_peer_release), T_CASE(t_peer_heat), T_CASE(t_peer_heat_no_d2d),
    T_CASE(t_peer_kill9), T_CASE(t_peer_verify_and_faults))
