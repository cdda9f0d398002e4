/*
 * cache_test.c: the expert cache's own tier on the host backend, each case
 * on a host device of its own (BATON_HOSTDEV_DIR in a fresh temporary
 * directory; see cache_fixture.h). The peer tier: cache_peer_test.c.
 */
#include "engine/cache/cache_fixture.h"


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

/* A refill's copy progress: one step per segment, rising to exactly the
 * bytes it copied; readable at every step (the heartbeats read it). */
struct prog_seen {
	int steps;
	uint64_t last, total;
	int monotonic;
};

static void on_step(void *ctx, uint64_t done, uint64_t total)
{
	struct prog_seen *p = ctx;
	if (done < p->last)
		p->monotonic = 0;
	p->last = done;
	p->total = total;
	p->steps++;
}

static void t_refill_progress(void)
{
	dir_setup();
	struct fx f = { 0 };
	fx_open(&f, 64 * MiB);
	fx_items(&f, 300, SLOT, SLOT, 3);
	fx_cache(&f, 16 * MiB, 0);
	uint64_t done = 1, total = 1;
	cache_progress(f.c, &done, &total);
	T_EQ_INT(done, 0);
	T_EQ_INT(total, 0);
	struct prog_seen p = { .monotonic = 1 };
	cache_set_progress(f.c, on_step, &p);
	struct baton_cache_report rep;
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(p.steps, 8);
	T_EQ_INT(p.total, 256 * SLOT);
	T_EQ_INT(p.last, 256 * SLOT);
	T_ASSERT(p.monotonic);
	T_EQ_INT(rep.bytes_copied, 256 * SLOT);
	cache_progress(f.c, &done, &total);
	T_EQ_INT(done, 0); /* none runs now */
	T_EQ_INT(total, 0);
	/* the next refill starts from 0 of what it has to copy */
	T_OK(cache_release(f.c, &rep));
	p = (struct prog_seen){ .monotonic = 1 };
	T_OK(cache_refill(f.c, &rep));
	T_EQ_INT(p.steps, 8);
	T_EQ_INT(p.total, rep.bytes_copied);
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

T_MAIN(T_CASE(t_bad_args), T_CASE(t_geometry), T_CASE(t_release_frees), T_CASE(t_refill_progress),
    T_CASE_TIMEOUT(t_cycles_verify, 120), T_CASE(t_verify_mismatch), T_CASE(t_coalescing),
    T_CASE(t_lookup_then_refill), T_CASE(t_lookup_misses), T_CASE(t_lookup_released),
    T_CASE(t_hot_first), T_CASE(t_partial), T_CASE(t_resize),
    T_CASE(t_lookup_copies_only_needed), T_CASE(t_lookup_mixed),
    T_CASE(t_evict_pending_first), T_CASE(t_verify_pending), T_CASE(t_pending_partial),
    T_CASE_TIMEOUT(t_cycles_lookup, 120), T_CASE(t_two_processes), T_CASE(t_kill9_returns))
