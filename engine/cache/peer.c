/*
 * peer.c: the peer tier of the expert cache (see cache.h for the
 * contract and cache.c's top for the tables): a second set of slots on
 * another device, lent by the broker, and the rebalance that moves
 * experts between the tiers by heat.
 *
 * It sits above the own tier (cache.c): it uses the own tier's helpers
 * from cache_int.h, and plugs itself in at the first cache_peer_set by
 * setting c->peer_ops, through which alone the own tier reaches it.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/cache/cache_int.h"

#define PEER_EVERY 64 /* lookups between two rebalances of the peer tier */
#define PEER_MOVES 8  /* moves of each kind per rebalance */
#define PEER_MARGIN 1 /* a move needs this many more lookups than what it displaces */

static baton_dptr own_addr(const struct baton_cache *c, uint32_t s)
{
	return c->base + (uint64_t)(s / c->sps) * c->seg_bytes +
	    (uint64_t)(s % c->sps) * c->slot_bytes;
}


static baton_dptr p_slot_addr(const struct baton_cache *c, uint32_t p)
{
	return c->pt.base + (uint64_t)(p / c->sps) * c->seg_bytes +
	    (uint64_t)(p % c->sps) * c->slot_bytes;
}

static void p_unassign(struct baton_cache *c, uint32_t p)
{
	if (c->pt.slot_item[p] >= 0)
		c->pt.item_slot[c->pt.slot_item[p]] = -1;
	c->pt.slot_item[p] = -1;
}

/* Peer slot p gets `item`; a remembered (unmapped) own assignment of it is
 * dropped, so a refill does not bring back a second copy. */
static void p_assign(struct baton_cache *c, uint32_t p, uint32_t item)
{
	p_unassign(c, p);
	if (c->pt.item_slot[item] >= 0)
		p_unassign(c, (uint32_t)c->pt.item_slot[item]);
	if (c->item_slot[item] >= 0 && !cache_own_present(c, item))
		cache_unassign(c, (uint32_t)c->item_slot[item]);
	c->pt.slot_item[p] = item;
	c->pt.item_slot[item] = p;
}

static struct cache_slots peer_slots(struct baton_cache *c)
{
	return (struct cache_slots){ c->pt.base, c->pt.slot_item, 0, p_unassign };
}

/* Copies the assigned items of peer slots[0..n) in one batch and syncs;
 * with verify, reads them back (the own tier's fill routine). */
static int p_fill(struct baton_cache *c, uint32_t *slots, uint32_t n,
    struct baton_cache_report *rep)
{
	struct cache_slots t = peer_slots(c);
	qsort(slots, n, sizeof *slots, cache_cmp_u32); /* neighbours coalesce */
	return cache_fill(c, &t, slots, n, c->verify, rep);
}

/* Copies each promoted item from peer slot from[j] (its bytes are still
 * there: nothing was copied into it yet) to own slot slots[j], then syncs;
 * verify reads them back. A slot whose copy failed or differs is emptied. */
static int promote_d2d(struct baton_cache *c, const uint32_t *slots, const uint32_t *from,
    uint32_t n, struct baton_cache_report *rep)
{
	double t0 = baton_now_s();
	int rc = 0;
	uint32_t j = 0;
	for (; j < n && !rc; j++) {
		const struct baton_cache_item *it = &c->items[c->slot_item[slots[j]]];
		rc = backend_copy_d2d(c->be, c->dev, own_addr(c, slots[j]), p_slot_addr(c, from[j]), it->bytes);
	}
	if (!rc)
		rc = c->be->sync(c->dev);
	if (rc) {
		for (uint32_t k = 0; k < n; k++)
			cache_unassign(c, slots[k]);
		rep->copy_s += baton_now_s() - t0;
		return rc;
	}
	rep->copies += n;
	for (j = 0; j < n; j++)
		cache_clear_pending(c, slots[j]);
	for (j = 0; c->verify && j < n; j++) {
		int ok = 0;
		if (c->slot_item[slots[j]] < 0)
			continue;
		if ((rc = cache_verify_at(c, (uint32_t)c->slot_item[slots[j]], own_addr(c, slots[j]), &ok)) != 0)
			break;
		if (!ok) {
			rep->mismatches++;
			cache_unassign(c, slots[j]);
		}
	}
	rep->copy_s += baton_now_s() - t0;
	return rc;
}

/* Orders items by heat, hottest first; ties to the lower index. */
static int cmp_item_hot(const void *a, const void *b, void *arg)
{
	const struct baton_cache *c = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	if (c->item_heat[x] != c->item_heat[y])
		return c->item_heat[x] > c->item_heat[y] ? -1 : 1;
	return x < y ? -1 : x > y;
}

/* Heat of what peer slot / own slot p holds; empty slots are the coldest. */
static int64_t p_heat(const struct baton_cache *c, uint32_t p)
{
	return c->pt.slot_item[p] < 0 ? -1 : (int64_t)c->item_heat[c->pt.slot_item[p]];
}

static int64_t own_heat(const struct baton_cache *c, uint32_t s)
{
	return c->slot_item[s] < 0 ? -1 : (int64_t)c->item_heat[c->slot_item[s]];
}

/* Coldest first; ties to the lower slot. */
static int cmp_cold(uint32_t x, uint32_t y, int64_t hx, int64_t hy)
{
	if (hx != hy)
		return hx < hy ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int cmp_peer_cold(const void *a, const void *b, void *arg)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return cmp_cold(x, y, p_heat(arg, x), p_heat(arg, y));
}

static int cmp_own_cold(const void *a, const void *b, void *arg)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return cmp_cold(x, y, own_heat(arg, x), own_heat(arg, y));
}

/* Experts move between the tiers by heat (see the top); at most `limit`
 * moves of each kind. */
static int peer_rebalance(struct baton_cache *c, uint32_t limit, struct baton_cache_report *rep)
{
	const uint32_t np = c->pt.mapped * c->sps;
	if (!np)
		return 0;
	uint32_t *a = c->pt.a, *b = c->pt.b, na = 0, nb = 0, n_own = 0, n_peer = 0;
	int rc = 0;
	memset(c->pt.queued, 0, np);

	/* 1. Promotion: the hottest peer items against the coldest filled
	 * (or empty) slots of mapped own segments, while hotter by more than PEER_MARGIN. */
	for (uint32_t p = 0; p < np; p++)
		if (c->pt.slot_item[p] >= 0)
			a[na++] = (uint32_t)c->pt.slot_item[p];
	for (uint32_t s = 0; s < c->n_slots; s++)
		if (c->seg_mapped[s / c->sps] && !c->slot_pending[s])
			b[nb++] = s;
	qsort_r(a, na, sizeof *a, cmp_item_hot, c);
	qsort_r(b, nb, sizeof *b, cmp_own_cold, c);
	uint32_t *own_fill = c->fill, *peer_fill = c->pt.fillv;
	for (uint32_t j = 0; j < na && j < nb && j < limit; j++) {
		uint32_t item = a[j], s = b[j];
		if ((int64_t)c->item_heat[item] <= own_heat(c, s) + PEER_MARGIN)
			break;
		uint32_t p = (uint32_t)c->pt.item_slot[item];
		int64_t old = c->slot_item[s];
		p_unassign(c, p);
		cache_assign(c, s, item); /* pending until copied */
		c->slot_hits[s] = c->item_heat[item];
		c->pt.prom[n_own] = p;
		own_fill[n_own++] = s;
		if (old >= 0) {
			c->pt.slot_item[p] = old;
			c->pt.item_slot[old] = p;
			peer_fill[n_peer++] = p;
			c->pt.queued[p] = 1;
		}
		c->pt.moves_done += 1 + (old >= 0);
	}

	/* 2. Intake: the hottest items in neither tier into empty peer slots,
	 * then in place of peer items colder by more than PEER_MARGIN. */
	na = nb = 0;
	for (uint32_t p = 0; p < np; p++)
		if (!c->pt.queued[p]) /* a fresh demotion stays */
			a[na++] = p;
	for (uint32_t i = 0; i < c->n_items; i++)
		if (c->pt.item_slot[i] < 0 && !cache_own_present(c, i))
			b[nb++] = i;
	qsort_r(a, na, sizeof *a, cmp_peer_cold, c);
	qsort_r(b, nb, sizeof *b, cmp_item_hot, c);
	for (uint32_t j = 0, moved = 0; j < na && j < nb; j++) {
		uint32_t p = a[j], item = b[j];
		int empty = c->pt.slot_item[p] < 0;
		if (!empty && ((int64_t)c->item_heat[item] <= p_heat(c, p) + PEER_MARGIN ||
		    moved >= limit))
			break;
		p_assign(c, p, item);
		peer_fill[n_peer++] = p;
		if (!empty) {
			moved++;
			c->pt.moves_done++;
		}
	}

	if (n_own && backend_has_copy_d2d(c->be)) {
		/* Promotions device to device, queued before the copies that
		 * refill those peer slots (stream order keeps them apart). */
		rc = promote_d2d(c, own_fill, c->pt.prom, n_own, rep);
	} else if (n_own) {
		qsort(own_fill, n_own, sizeof *own_fill, cache_cmp_u32);
		struct cache_slots own = cache_own_slots(c);
		rc = cache_fill(c, &own, own_fill, n_own, c->verify, rep);
	}
	if (!rc && n_peer)
		rc = p_fill(c, peer_fill, n_peer, rep);
	return rc;
}

/* ---- the interface the own tier calls (cache_int.h) ---------------------- */

static uint32_t moves_of(const struct baton_cache *c)
{
	return c->pt.tuned ? c->pt.moves : PEER_MOVES;
}

static int64_t p_slot_of(const struct baton_cache *c, uint32_t item)
{
	return c->pt.item_slot ? c->pt.item_slot[item] : -1;
}

static int p_before_lookup(struct baton_cache *c, struct baton_cache_report *rep)
{
	uint32_t every = c->pt.tuned ? c->pt.every : PEER_EVERY;
	if (c->pt.mapped && every && ++c->pt.calls >= every) {
		c->pt.calls = 0;
		return peer_rebalance(c, moves_of(c), rep);
	}
	return 0;
}

static void p_stats(const struct baton_cache *c, struct baton_cache_stats *st)
{
	st->peer_mapped_bytes = (uint64_t)c->pt.mapped * c->seg_bytes;
	st->peer_slots_mapped = c->pt.mapped * c->sps;
	for (uint32_t p = 0; p < st->peer_slots_mapped; p++)
		st->peer_items_resident += c->pt.slot_item[p] >= 0;
	st->peer_moves = c->pt.moves_done;
}

static int peer_unmap_to(struct baton_cache *c, uint32_t keep, uint64_t *unmapped,
    struct baton_cache_report *rep);
static int peer_drop(struct baton_cache *c, struct baton_cache_report *rep, uint64_t *freed);

static void p_destroy(struct baton_cache *c)
{
	if (c->pt.base) {
		struct baton_cache_report rep;
		uint64_t unmapped = 0;
		memset(&rep, 0, sizeof rep);
		peer_unmap_to(c, 0, &unmapped, &rep);
		c->be->unreserve(c->dev, c->pt.base, c->pt.range);
	}
	free(c->pt.slot_item);
	free(c->pt.a);
	free(c->pt.b);
	free(c->pt.fillv);
	free(c->pt.queued);
	free(c->pt.prom);
	free(c->pt.item_slot);
	memset(&c->pt, 0, sizeof c->pt);
}

static const struct cache_peer_ops peer_ops = {
	.slot_of = p_slot_of,
	.slot_addr = p_slot_addr,
	.before_lookup = p_before_lookup,
	.drop = peer_drop,
	.stats = p_stats,
	.destroy = p_destroy,
};

/* Tables and the reservation, at the first cache_peer_set. */
static int peer_prepare(struct baton_cache *c)
{
	if (c->pt.base)
		return 0;
	c->peer_ops = &peer_ops; /* from now on destroy frees what is below */
	if (!c->pt.item_slot) {
		c->pt.item_slot = malloc(((size_t)c->n_items + 1) * sizeof *c->pt.item_slot);
		if (!c->pt.item_slot)
			return BATON_ENOMEM;
		for (uint32_t i = 0; i < c->n_items; i++)
			c->pt.item_slot[i] = -1;
	}
	free(c->pt.slot_item);
	free(c->pt.a);
	free(c->pt.b);
	free(c->pt.fillv);
	free(c->pt.queued);
	free(c->pt.prom);
	uint32_t n = c->n_items ? (c->n_items + c->sps - 1) / c->sps : 1;
	size_t np = (size_t)n * c->sps;
	size_t big = np > c->n_items ? np : c->n_items;
	if (big < c->n_slots)
		big = c->n_slots;
	c->pt.slot_item = malloc(np * sizeof *c->pt.slot_item);
	c->pt.a = malloc(big * sizeof *c->pt.a);
	c->pt.b = malloc(big * sizeof *c->pt.b);
	c->pt.fillv = malloc(np * sizeof *c->pt.fillv);
	c->pt.queued = malloc(np);
	c->pt.prom = malloc(big * sizeof *c->pt.prom);
	if (!c->pt.slot_item || !c->pt.a || !c->pt.b || !c->pt.fillv || !c->pt.queued || !c->pt.prom)
		return BATON_ENOMEM; /* freed by cache_destroy */
	for (uint64_t p = 0; p < (uint64_t)n * c->sps; p++)
		c->pt.slot_item[p] = -1;
	uint64_t range = (uint64_t)n * c->seg_bytes;
	int rc = c->be->reserve(c->dev, range, &c->pt.base);
	if (rc) {
		c->pt.base = 0;
		return rc;
	}
	c->pt.n_segs = n;
	c->pt.range = range;
	return 0;
}

/* Unmaps peer segments from the last down to `keep`; their items leave the
 * peer tier. *unmapped adds what went. */
static int peer_unmap_to(struct baton_cache *c, uint32_t keep, uint64_t *unmapped,
    struct baton_cache_report *rep)
{
	while (c->pt.mapped > keep) {
		uint32_t k = c->pt.mapped - 1;
		double t0 = baton_now_s();
		int rc = backend_unmap_peer(c->be, c->dev, c->pt.dev, c->pt.base + (uint64_t)k * c->seg_bytes,
		    c->seg_bytes);
		rep->map_s += baton_now_s() - t0;
		if (rc)
			return rc;
		for (uint32_t p = k * c->sps; p < (k + 1) * c->sps; p++)
			p_unassign(c, p);
		c->pt.mapped--;
		rep->segments_unmapped++;
		*unmapped += c->seg_bytes;
	}
	return 0;
}

/* Drops the peer tier; confirmed on the peer's mem_info like a release. */
static int peer_drop(struct baton_cache *c, struct baton_cache_report *rep, uint64_t *freed)
{
	*freed = 0;
	if (!c->pt.mapped)
		return 0;
	uint64_t free_before = 0, total = 0, unmapped = 0;
	int rc = c->be->mem_info(c->pt.dev, &free_before, &total);
	if (!rc)
		rc = peer_unmap_to(c, 0, &unmapped, rep);
	if (!rc)
		rc = cache_confirm_freed(c, c->pt.dev, free_before, unmapped, freed);
	return rc;
}

int cache_peer_set(struct baton_cache *c, struct baton_dev *peer, uint64_t bytes,
    struct baton_cache_report *rep)
{
	struct baton_cache_report local;
	if (!rep)
		rep = &local;
	memset(rep, 0, sizeof *rep);
	if (!c)
		return BATON_EINVAL;
	double t0 = baton_now_s();
	int rc = 0;
	if (bytes == 0) {
		rc = peer_drop(c, rep, &rep->peer_bytes_freed);
		goto out;
	}
	if (!peer || peer == c->dev)
		return BATON_EINVAL;
	if (!backend_has_peer(c->be))
		return BATON_EUNSUPPORTED;
	if (c->pt.dev && c->pt.dev != peer && c->pt.mapped)
		return BATON_EINVAL; /* drop the old peer tier first */
	if (c->released)
		return BATON_ESTATE; /* a released cache holds no borrowed memory */
	if ((rc = backend_peer_access(c->be, c->dev, peer)) != 0)
		return rc;
	if ((rc = peer_prepare(c)) != 0)
		return rc;
	c->pt.dev = peer;
	/* No more segments than the items outside the own tier's target need. */
	uint64_t own = (uint64_t)c->n_active * c->sps;
	uint64_t useful = c->n_items > own ? (c->n_items - own + c->sps - 1) / c->sps : 0;
	uint64_t want64 = bytes / c->seg_bytes;
	if (want64 > useful)
		want64 = useful;
	uint32_t want = want64 < c->pt.n_segs ? (uint32_t)want64 : c->pt.n_segs;
	if (c->pt.mapped > want) {
		uint64_t free_before = 0, total = 0, unmapped = 0;
		rc = c->be->mem_info(peer, &free_before, &total);
		if (!rc)
			rc = peer_unmap_to(c, want, &unmapped, rep);
		if (!rc)
			rc = cache_confirm_freed(c, peer, free_before, unmapped, &rep->peer_bytes_freed);
		if (rc)
			goto out;
	}
	while (c->pt.mapped < want) {
		uint64_t free_b = 0, total = 0;
		double t1 = baton_now_s();
		rc = c->be->mem_info(peer, &free_b, &total);
		if (rc)
			goto out;
		if (free_b < c->seg_bytes)
			break; /* the peer is full: keep what fit */
		if (cache_fault_due(c))
			break;
		rc = backend_map_peer(c->be, c->dev, peer, c->pt.base + (uint64_t)c->pt.mapped * c->seg_bytes,
		    c->seg_bytes);
		rep->map_s += baton_now_s() - t1;
		if (rc == BATON_EDEVMEM) {
			rc = 0;
			break;
		}
		if (rc)
			goto out;
		c->pt.mapped++;
		rep->segments_mapped++;
	}
	/* Fill every empty slot (hottest first), no limit on moves. */
	rc = peer_rebalance(c, c->pt.mapped * c->sps, rep);
out:
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}

int cache_peer_rebalance(struct baton_cache *c, struct baton_cache_report *rep)
{
	struct baton_cache_report local;
	if (!rep)
		rep = &local;
	memset(rep, 0, sizeof *rep);
	if (!c)
		return BATON_EINVAL;
	double t0 = baton_now_s();
	int rc = peer_rebalance(c, moves_of(c), rep);
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}

void cache_peer_tune(struct baton_cache *c, uint32_t every, uint32_t moves)
{
	if (!c)
		return;
	c->pt.every = every;
	c->pt.moves = moves;
	c->pt.calls = 0;
	c->pt.tuned = 1;
}

uint64_t cache_peer_want(const struct baton_cache *c)
{
	if (!c || c->n_items <= c->n_slots)
		return 0;
	uint64_t over = c->n_items - c->n_slots;
	return (over + c->sps - 1) / c->sps * c->seg_bytes;
}

int64_t cache_peer_slot_of(const struct baton_cache *c, uint32_t item)
{
	if (!c || item >= c->n_items)
		return -1;
	return p_slot_of(c, item);
}

