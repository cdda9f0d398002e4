/*
 * peer_test.c: the expert cache's peer tier on the host backend:
 * host device 1 lends its memory to a cache on host device 0 (see
 * cache_fixture.h for the fixture).
 */
#include "engine/cache/cache_fixture.h"

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

T_MAIN(T_CASE(t_peer_set_use), T_CASE(t_peer_bad), T_CASE(t_peer_release),
    T_CASE(t_peer_heat), T_CASE(t_peer_heat_no_d2d), T_CASE(t_peer_kill9),
    T_CASE(t_peer_verify_and_faults))
