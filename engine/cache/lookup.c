/*
 * lookup.c: cache_lookup: hits, misses, victims and the hotness decay
 * (uses map.c).
 */
#include "engine/cache/cache_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- lookup --------------------------------------------------------------- */

static int cmp_victim(const void *a, const void *b, void *arg)
{
	const struct baton_cache *c = arg;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	int ex = c->slot_item[x] >= 0, ey = c->slot_item[y] >= 0;
	if (ex != ey)
		return ex - ey; /* empty slots first */
	if (c->slot_hits[x] != c->slot_hits[y])
		return c->slot_hits[x] < c->slot_hits[y] ? -1 : 1;
	if (c->slot_pending[x] != c->slot_pending[y])
		return c->slot_pending[x] ? -1 : 1; /* nothing copied is thrown away */
	return x < y ? -1 : x > y;
}

int cache_cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static void next_call(struct baton_cache *c)
{
	if (++c->call == 0) {
		memset(c->item_mark, 0, ((size_t)c->n_items + 1) * sizeof *c->item_mark);
		memset(c->slot_mark, 0, (size_t)c->n_slots * sizeof *c->slot_mark);
		memset(c->seg_mark, 0, (size_t)c->n_segs * sizeof *c->seg_mark);
		c->call = 1;
	}
}

static void decay(struct baton_cache *c, size_t n)
{
	c->accesses += n;
	if (c->accesses < c->decay_period)
		return;
	c->accesses = 0;
	for (uint32_t s = 0; s < c->n_slots; s++)
		c->slot_hits[s] >>= 1;
	for (uint32_t i = 0; i < c->n_items; i++)
		c->item_heat[i] >>= 1;
}

/* The hottest active, unmapped segment this call has not tried yet. */
static uint32_t hottest_unmapped(const struct baton_cache *c, uint32_t call)
{
	uint32_t best = UINT32_MAX;
	uint64_t best_heat = 0;
	for (uint32_t k = 0; k < c->n_segs; k++) {
		if (!c->seg_active[k] || c->seg_mapped[k] || c->seg_mark[k] == call)
			continue;
		uint64_t h = cache_seg_heat(c, k);
		if (best == UINT32_MAX || h > best_heat) {
			best = k;
			best_heat = h;
		}
	}
	return best;
}

int cache_lookup(struct baton_cache *c, const uint32_t *items, size_t n, baton_dptr *blobs)
{
	if (!c || (n && (!items || !blobs)))
		return BATON_EINVAL;
	if (n == 0)
		return 0;
	if (n > UINT32_MAX / 2)
		return BATON_EINVAL;
	for (size_t j = 0; j < n; j++)
		if (items[j] >= c->n_items)
			return BATON_EINVAL;
	if (n > c->need_cap) {
		uint32_t *p = realloc(c->need, n * sizeof *p);
		if (!p)
			return BATON_ENOMEM;
		c->need = p;
		c->need_cap = (uint32_t)n;
	}
	struct baton_cache_report rep;
	memset(&rep, 0, sizeof rep);
	int rc = 0;
	/* Before this call's addresses are handed out: a rebalance moves items. */
	if (c->peer_ops && (rc = c->peer_ops->before_lookup(c, &rep)) != 0)
		return rc;
	next_call(c);
	const uint32_t call = c->call;
	uint64_t peer_hits = 0;

	/* The distinct items; remembered ones get their segment mapped (not
	 * filled) when memory allows, so they come back where they were. */
	uint32_t n_need = 0;
	for (size_t j = 0; j < n; j++) {
		uint32_t i = items[j];
		if (c->item_mark[i] == call)
			continue;
		c->item_mark[i] = call;
		if (cache_peer_slot_via_ops(c, i) >= 0 && !cache_own_resident(c, i)) {
			peer_hits++; /* read where it is, on the peer */
			continue;
		}
		c->need[n_need++] = i;
		int64_t s = c->item_slot[i];
		if (s < 0)
			continue;
		uint32_t k = (uint32_t)s / c->sps;
		if (c->seg_mapped[k] || c->seg_mark[k] == call)
			continue;
		c->seg_mark[k] = call; /* try each segment once */
		rc = cache_map_seg(c, k, &rep);
		if (rc && rc != BATON_EDEVMEM)
			goto out;
		rc = 0;
	}
	/* Filled ones are hits; pending ones are copied into their own slots;
	 * the rest are misses. */
	uint32_t n_miss = 0, n_fill = 0;
	uint64_t hits = 0;
	for (uint32_t j = 0; j < n_need; j++) {
		uint32_t i = c->need[j];
		int64_t s = c->item_slot[i];
		if (s >= 0 && c->seg_mapped[s / c->sps]) {
			c->slot_mark[s] = call;
			if (c->slot_pending[s])
				c->fill[n_fill++] = (uint32_t)s;
			else
				hits++;
		} else {
			c->need[n_miss++] = i; /* compacted in place: misses first */
		}
	}
	const uint64_t loaded = n_fill;
	/* Enough free mapped slots for the misses? Map remembered segments,
	 * hottest first, until there are. */
	uint32_t n_cand = 0;
	if (n_miss) {
		for (;;) {
			n_cand = 0;
			for (uint32_t k = 0; k < c->n_segs; k++) {
				if (!c->seg_mapped[k])
					continue;
				for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
					if (c->slot_mark[s] != call)
						c->cand[n_cand++] = s;
			}
			if (n_cand >= n_miss)
				break;
			/* The refill's plan is left alone: it skips what needs
			 * nothing more. */
			int mapped = 0;
			while (!mapped) {
				uint32_t k = hottest_unmapped(c, call);
				if (k == UINT32_MAX)
					break;
				c->seg_mark[k] = call; /* try each once */
				rc = cache_map_seg(c, k, &rep);
				if (rc && rc != BATON_EDEVMEM)
					goto out;
				mapped = rc == 0;
				rc = 0;
			}
			if (!mapped) {
				rc = BATON_EDEVMEM;
				goto out;
			}
		}
		/* The least valuable slots, then pair the misses (by item) with
		 * them (by slot) so neighbours stay neighbours. */
		qsort_r(c->cand, n_cand, sizeof *c->cand, cmp_victim, c);
		qsort(c->cand, n_miss, sizeof *c->cand, cache_cmp_u32);
		qsort(c->need, n_miss, sizeof *c->need, cache_cmp_u32);
		for (uint32_t j = 0; j < n_miss; j++) {
			uint32_t s = c->cand[j];
			if (c->slot_item[s] >= 0)
				c->evictions++;
			cache_assign(c, s, c->need[j]);
			c->slot_mark[s] = call;
			c->fill[n_fill++] = s;
		}
	}
	/* One batch for both, in slot order so neighbours coalesce. */
	if (n_fill) {
		qsort(c->fill, n_fill, sizeof *c->fill, cache_cmp_u32);
		rc = cache_fill_own(c, c->fill, n_fill, 0, &rep);
		if (rc)
			goto out;
	}
	for (size_t j = 0; j < n; j++) {
		uint32_t i = items[j];
		c->item_heat[i]++;
		if (cache_own_resident(c, i)) {
			int64_t s = c->item_slot[i];
			blobs[j] = cache_own_slot_addr(c, (uint32_t)s);
			c->slot_hits[s]++;
		} else {
			blobs[j] = c->peer_ops->slot_addr(c, (uint32_t)cache_peer_slot_via_ops(c, i));
		}
	}
	c->hits += hits + peer_hits;
	c->peer_hits += peer_hits;
	c->misses += loaded + n_miss;
	decay(c, n);
out:
	return rc;
}
