/*
 * cache_fixture.h: the fixture of the expert cache's tests (cache_test.c,
 * cache_peer_test.c), included by each of them once: a host device of
 * their own in a fresh BATON_HOSTDEV_DIR, items laid out in a buffer, a
 * counting backend, and checks of what a lookup hands out.
 * Sizes are small: 64 KiB slots, 2 MiB segments (32 slots each).
 */
#ifndef BATON_ENGINE_CACHE_FIXTURE_H
#define BATON_ENGINE_CACHE_FIXTURE_H

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/backend/backend.h"
#include "engine/cache/cache.h"
#include "engine/cache/cache_int.h" /* cache_fault_map_after */
#include "proto/proto.h"
#include "tests/hostdev_fixture.h"
#include "tests/t.h"

/* A test uses some of these helpers, not all. */
#define FX_UNUSED __attribute__((unused))

#define MiB (1ull << 20)
#define SLOT (64u << 10)
#define SEG (2 * MiB)
#define SPS (SEG / SLOT)

/* ---- fixture ------------------------------------------------------------ */

/* A host device of our own (tests/hostdev_fixture.h). */
FX_UNUSED static void dir_setup(void)
{
	hostdev_setup("cache");
}

FX_UNUSED static void dir_cleanup(void)
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
FX_UNUSED static void fx_items(struct fx *f, uint32_t n, uint64_t item_bytes, uint64_t stride,
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

FX_UNUSED static void fx_open(struct fx *f, uint64_t capacity)
{
	f->be = &baton_backend_host;
	char err[256] = "";
	int rc = f->be->open(0, capacity, &f->dev, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "open: %s", err);
}

/* The host backend, counting what the cache asks of it. */
FX_UNUSED static struct {
	uint64_t maps, unmaps, copy_calls, copies, copy_bytes;
} g_cnt;
FX_UNUSED static struct baton_backend g_counting;

FX_UNUSED static int cnt_map(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	g_cnt.maps++;
	return baton_backend_host.map(dev, addr, bytes);
}

FX_UNUSED static int cnt_unmap(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	g_cnt.unmaps++;
	return baton_backend_host.unmap(dev, addr, bytes);
}

FX_UNUSED static int cnt_copy_h2d(struct baton_dev *dev, const struct baton_copy *copies, size_t n)
{
	g_cnt.copy_calls++;
	g_cnt.copies += n;
	for (size_t i = 0; i < n; i++)
		g_cnt.copy_bytes += copies[i].bytes;
	return baton_backend_host.copy_h2d(dev, copies, n);
}

FX_UNUSED static void fx_open_counting(struct fx *f, uint64_t capacity)
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

FX_UNUSED static struct baton_cache_stats stats_of(struct fx *f)
{
	struct baton_cache_stats st;
	cache_stats(f->c, &st);
	return st;
}

FX_UNUSED static struct baton_cache_config cfg_of(uint64_t ceiling, int verify)
{
	struct baton_cache_config cfg = { SLOT, SEG, ceiling, 0, verify };
	return cfg;
}

FX_UNUSED static void fx_cache(struct fx *f, uint64_t ceiling, int verify)
{
	struct baton_cache_config cfg = cfg_of(ceiling, verify);
	char err[256] = "";
	int rc = cache_create(f->be, f->dev, &cfg, f->items, f->n, &f->c, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "cache_create: %s", err);
}

FX_UNUSED static void fx_close(struct fx *f)
{
	cache_destroy(f->c);
	f->be->close(f->dev);
	free(f->src);
	free(f->items);
	free(f->table);
	memset(f, 0, sizeof *f);
}

FX_UNUSED static uint64_t dev_free(struct fx *f)
{
	uint64_t fr = 0, tot = 0;
	T_OK(f->be->mem_info(f->dev, &fr, &tot));
	return fr;
}

FX_UNUSED static void snap(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		f->table[i] = cache_slot_of(f->c, i);
}

FX_UNUSED static void same_table(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++)
		T_ASSERT_MSG(cache_slot_of(f->c, i) == f->table[i],
		    "item %u: slot %lld, was %lld", i, (long long)cache_slot_of(f->c, i),
		    (long long)f->table[i]);
}

/* 1 when device address a is mapped (host backend: d2h checks it). */
FX_UNUSED static int mapped_at(struct fx *f, baton_dptr a)
{
	uint8_t b;
	return f->be->copy_d2h(f->dev, &b, a, 1) == 0;
}

/* Every item in items[0..n): its blob holds its bytes. */
FX_UNUSED static void check_bytes(struct fx *f, const uint32_t *ids, size_t n, const baton_dptr *blobs)
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

FX_UNUSED static void lookup_ok(struct fx *f, const uint32_t *ids, size_t n)
{
	baton_dptr *blobs = calloc(n, sizeof *blobs);
	T_ASSERT(blobs);
	T_OK(cache_lookup(f->c, ids, n, blobs));
	check_bytes(f, ids, n, blobs);
	free(blobs);
}

/* Reads each resident item back through a lookup-free path: the table's
 * slot, found with a lookup of that one item (a hit adds one count). */
FX_UNUSED static void all_resident_bytes(struct fx *f)
{
	for (uint32_t i = 0; i < f->n; i++) {
		if (cache_slot_of(f->c, i) < 0)
			continue;
		baton_dptr b;
		T_OK(cache_lookup(f->c, &i, 1, &b));
		check_bytes(f, &i, 1, &b);
	}
}

FX_UNUSED static void rd(int fd, void *p, size_t n)
{
	T_ASSERT(read(fd, p, n) == (ssize_t)n);
}

FX_UNUSED static void wr(int fd, const void *p, size_t n)
{
	T_ASSERT(write(fd, p, n) == (ssize_t)n);
}

#endif
