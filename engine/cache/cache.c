/*
 * cache.c: the device expert cache (see cache.h for the contract): create,
 * destroy and status. The design below is the whole own tier's; its other
 * jobs live in map.c (tables, mapping, the one fill routine cache_fill),
 * plan.c (refill plans), ops.c (release, refill, resize) and lookup.c.
 *
 * Layout. The range is n_segs segments (the ceiling) of seg_bytes, each cut
 * into sps slots of slot_bytes (slot_bytes is rounded up to 256 bytes so
 * every blob is aligned as cudaMalloc's are; a segment's tail past its last
 * slot is unused). Slot s lives in segment s / sps.
 *
 * Tables. slot_item[s] / item_slot[i] is the residency table: the item each
 * slot is assigned to, mapped or not. A segment is *active* when it is part
 * of the target, and *mapped* when its memory is there. An assigned slot of
 * a mapped segment either holds its item's bytes or is *pending*
 * (slot_pending[s]: the memory is there, the bytes not yet); only assigned
 * slots of mapped segments are ever pending. So:
 *   resident     = assigned to a slot of a mapped segment, not pending
 *   pending      = assigned to a slot of a mapped segment, bytes not copied
 *   remembered   = assigned to a slot of an unmapped active segment (after a
 *                  release, or where a refill stopped for lack of memory)
 * Mapping a segment makes its assigned slots pending; copying an item in
 * makes its slot resident; unmapping turns pending slots back into
 * remembered ones (release keeps every assignment). Refill maps the active
 * segments back and copies their remembered and pending items in; so the
 * table after a release/refill cycle is the table before it.
 *
 * A lookup while released, partial or refilling copies only what it needs:
 * the segment of a needed remembered item is mapped, that item alone is
 * copied into its remembered slot, and the segment's other slots stay
 * pending until the refill (or a lookup of them) fills them. A lookup of a
 * pending item copies it into its slot (a miss in the counts, but no
 * eviction). A victim may be a pending slot: its item then is no longer
 * remembered. The state is READY only when every active segment is mapped
 * and nothing is pending.
 *
 * Hotness. Each slot counts hits (one per occurrence in a lookup). Every
 * 16 * slots accesses (at least 1024) all counts halve: LFU with an
 * exponential decay, so yesterday's hot experts cool off. A segment's heat
 * is the sum of its slots' counts: refills go hottest first (ties: lower
 * index first); shrinking drops the coldest (ties: higher index first).
 * Lookup victims: empty slots first, then fewest hits, then pending before
 * filled (a pending slot holds nothing that would be thrown away), then
 * lower index. A refill plan is every active segment that is unmapped or
 * has pending slots; where a segment cannot be mapped for lack of memory,
 * the plan goes on filling the pending slots of mapped ones.
 *
 * Memory. Before mapping, the device's free memory less the reserve must
 * hold a whole segment, else the cache stops there (PARTIAL); so does a map
 * that fails with BATON_EDEVMEM. The reserve is cfg.reserve_bytes until a
 * resize sets another (a resize with reserve < 0 goes back to the config's).
 *
 * Release confirmation. A release (and a shrink) reads mem_info before the
 * first unmap and polls it afterwards until free has risen by at least the
 * bytes unmapped. If it has not after CONFIRM_WAIT_S, while every unmap
 * succeeded, the release still succeeds: the backend's unmap contract says
 * the memory was returned, so the shortfall is memory another process took
 * in the meantime; rep->bytes_freed says what was actually seen.
 *
 * Verify mode reads back what refills (and resize's fills) copy; a lookup's
 * copies are not read back, as they never were for misses.
 *
 * Peer tier (peer.c, plugged in through c->peer_ops: see
 * cache_int.h). A second reservation (pt.base, reserved at the first
 * cache_peer_set, kept until destroy) of pt.n_segs = ceil(items / sps)
 * segments; the first pt.mapped are mapped with the backend's map_peer and
 * unmapped from the top down, so a shrink keeps the low ones. pt.slot_item /
 * pt.item_slot is its residency table; a peer slot is either empty or holds
 * its item's bytes (no pending state: a peer segment is filled when it is
 * mapped, and a failed copy empties its slots). item_heat counts lookups
 * per item whatever tier serves it, halved with the slot counts, so an
 * item keeps its heat when it changes tier or leaves both. Rebalances run
 * at the start of a lookup, never after it, because a rebalance reuses
 * slots whose addresses a previous lookup may have handed out.
 *
 * Coalescing. Neighbouring slots of one segment are copied in one copy
 * when their sources follow each other in host memory without a gap (each
 * item but the run's last fills its slot exactly): the run is then one
 * readable, contiguous range on both sides. Arena blobs are like that when
 * the blob size is a multiple of the slot size. Items with gaps between
 * them are copied one by one (still in one batch): the bytes between items
 * are not promised to be readable.
 */
#include "engine/cache/cache_int.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define SLOT_ALIGN 256u

/* ---- create / destroy ---------------------------------------------------- */

int cache_create(const struct baton_backend *be, struct baton_dev *dev,
    const struct baton_cache_config *cfg, const struct baton_cache_item *items,
    uint32_t n_items, struct baton_cache **out, char *errbuf, size_t errlen)
{
	struct baton_cache *c = NULL;
	int rc;

	if (!out) {
		baton_errf(errbuf, errlen, "cache_create: no place for the result");
		return BATON_EINVAL;
	}
	*out = NULL;
	if (!be || !dev || !cfg || (n_items && !items)) {
		baton_errf(errbuf, errlen, "cache_create: missing backend, device, config or items");
		return BATON_EINVAL;
	}
	if (!be->mem_info || !be->granularity || !be->reserve || !be->unreserve ||
	    !be->map || !be->unmap || !be->copy_h2d || !be->copy_d2h || !be->sync) {
		baton_errf(errbuf, errlen, "backend %s lacks the memory functions the cache needs",
		    be->name ? be->name : "?");
		return BATON_EUNSUPPORTED;
	}
	if (!cfg->slot_bytes || !cfg->segment_bytes || !cfg->ceiling_bytes) {
		baton_errf(errbuf, errlen, "cache: slot (%llu), segment (%llu) and ceiling (%llu) "
		    "sizes must be nonzero", (unsigned long long)cfg->slot_bytes,
		    (unsigned long long)cfg->segment_bytes,
		    (unsigned long long)cfg->ceiling_bytes);
		return BATON_EINVAL;
	}
	const uint64_t big = UINT64_C(1) << 56;
	if (cfg->slot_bytes > big || cfg->segment_bytes > big || cfg->ceiling_bytes > big) {
		baton_errf(errbuf, errlen, "cache: sizes above 2^56 bytes");
		return BATON_EINVAL;
	}
	uint64_t slot = (cfg->slot_bytes + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;
	for (uint32_t i = 0; i < n_items; i++) {
		if (items[i].bytes > cfg->slot_bytes) {
			baton_errf(errbuf, errlen, "cache: item %u has %llu bytes, more than a slot (%llu)",
			    i, (unsigned long long)items[i].bytes,
			    (unsigned long long)cfg->slot_bytes);
			return BATON_EINVAL;
		}
		if (items[i].bytes && !items[i].src) {
			baton_errf(errbuf, errlen, "cache: item %u has no source", i);
			return BATON_EINVAL;
		}
	}
	uint64_t gran = be->granularity(dev);
	if (!gran)
		gran = 1;
	uint64_t seg = cfg->segment_bytes < slot ? slot : cfg->segment_bytes;
	seg = (seg + gran - 1) / gran * gran;
	uint64_t n_segs = cfg->ceiling_bytes / seg;
	if (n_segs == 0)
		n_segs = 1;
	uint64_t sps = seg / slot;
	if (n_segs > UINT32_MAX / 2 || sps > UINT32_MAX / 2 || n_segs * sps > INT32_MAX) {
		baton_errf(errbuf, errlen, "cache: %llu segments of %llu slots is too many",
		    (unsigned long long)n_segs, (unsigned long long)sps);
		return BATON_EINVAL;
	}

	c = calloc(1, sizeof *c);
	if (!c)
		goto nomem;
	c->be = be;
	c->dev = dev;
	c->items = items;
	c->n_items = n_items;
	c->slot_bytes = slot;
	c->seg_bytes = seg;
	c->sps = (uint32_t)sps;
	c->n_segs = (uint32_t)n_segs;
	c->n_slots = (uint32_t)(n_segs * sps);
	c->range_bytes = n_segs * seg;
	c->cfg_reserve = c->reserve = cfg->reserve_bytes;
	const char *v = getenv("BATON_VERIFY_REFILL");
	c->verify = cfg->verify || (v && *v && strcmp(v, "0") != 0);
	c->released = 1;
	c->decay_period = 16ull * c->n_slots < 1024 ? 1024 : 16ull * c->n_slots;

	c->slot_item = malloc((size_t)c->n_slots * sizeof *c->slot_item);
	c->item_slot = malloc(((size_t)n_items + 1) * sizeof *c->item_slot);
	c->slot_hits = calloc(c->n_slots, sizeof *c->slot_hits);
	c->slot_pending = calloc(c->n_slots, 1);
	c->seg_active = calloc(c->n_segs, 1);
	c->seg_mapped = calloc(c->n_segs, 1);
	c->seg_pending = calloc(c->n_segs, sizeof *c->seg_pending);
	c->plan = malloc((size_t)c->n_segs * sizeof *c->plan);
	c->item_mark = calloc((size_t)n_items + 1, sizeof *c->item_mark);
	c->slot_mark = calloc(c->n_slots, sizeof *c->slot_mark);
	c->seg_mark = calloc(c->n_segs, sizeof *c->seg_mark);
	c->cand = malloc((size_t)c->n_slots * sizeof *c->cand);
	c->fill = malloc((size_t)c->n_slots * sizeof *c->fill);
	c->xxh = XXH3_createState();
	c->item_heat = calloc((size_t)n_items + 1, sizeof *c->item_heat);
	if (!c->slot_item || !c->item_slot || !c->slot_hits || !c->slot_pending ||
	    !c->seg_active || !c->seg_mapped || !c->seg_pending || !c->plan || !c->item_mark ||
	    !c->slot_mark || !c->seg_mark || !c->cand || !c->fill || !c->xxh ||
	    !c->item_heat)
		goto nomem;
	for (uint32_t s = 0; s < c->n_slots; s++)
		c->slot_item[s] = -1;
	for (uint32_t i = 0; i < n_items; i++)
		c->item_slot[i] = -1;

	rc = be->reserve(dev, c->range_bytes, &c->base);
	if (rc) {
		baton_errf(errbuf, errlen, "cache: cannot reserve %llu bytes of device address space: %s",
		    (unsigned long long)c->range_bytes, baton_strerror(rc));
		c->base = 0;
		goto fail;
	}
	/* The warm-up: every segment is in the target, slot i remembers item i. */
	for (uint32_t k = 0; k < c->n_segs; k++)
		c->seg_active[k] = 1;
	c->n_active = c->n_segs;
	for (uint32_t i = 0; i < n_items && i < c->n_slots; i++)
		cache_assign(c, i, i);
	*out = c;
	return 0;

nomem:
	baton_errf(errbuf, errlen, "cache: out of host memory");
	rc = BATON_ENOMEM;
fail:
	cache_destroy(c);
	return rc;
}

void cache_set_src_check(struct baton_cache *c, int (*check)(void *ctx), void *ctx)
{
	c->src_check = check;
	c->src_ctx = ctx;
}

void cache_progress(const struct baton_cache *c, uint64_t *done, uint64_t *total)
{
	*done = c ? atomic_load(&c->prog_done) : 0;
	*total = c ? atomic_load(&c->prog_total) : 0;
}

void cache_set_progress(struct baton_cache *c, void (*step)(void *ctx, uint64_t done, uint64_t total),
    void *ctx)
{
	c->prog_step = step;
	c->prog_ctx = ctx;
}

void cache_destroy(struct baton_cache *c)
{
	if (!c)
		return;
	if (c->base) {
		struct baton_cache_report rep;
		memset(&rep, 0, sizeof rep);
		for (uint32_t k = 0; k < c->n_segs; k++)
			if (c->seg_mapped && c->seg_mapped[k])
				cache_unmap_seg(c, k, &rep);
		c->be->unreserve(c->dev, c->base, c->range_bytes);
	}
	if (c->peer_ops)
		c->peer_ops->destroy(c);
	free(c->item_heat);
	free(c->inflight);
	free(c->slot_item);
	free(c->item_slot);
	free(c->slot_hits);
	free(c->slot_pending);
	free(c->seg_active);
	free(c->seg_mapped);
	free(c->seg_pending);
	free(c->plan);
	free(c->item_mark);
	free(c->slot_mark);
	free(c->seg_mark);
	free(c->need);
	free(c->cand);
	free(c->fill);
	free(c->copies);
	free(c->vbuf);
	if (c->xxh)
		XXH3_freeState(c->xxh);
	free(c);
}

/* ---- status --------------------------------------------------------------- */

int cache_all_resident(const struct baton_cache *c, baton_dptr *addrs)
{
	if (!c || !addrs || c->released)
		return 0;
	for (uint32_t i = 0; i < c->n_items; i++) {
		if (!cache_own_resident(c, i) || cache_peer_slot_via_ops(c, i) >= 0)
			return 0;
		addrs[i] = cache_own_slot_addr(c, (uint32_t)c->item_slot[i]);
	}
	return 1;
}

void cache_stats(const struct baton_cache *c, struct baton_cache_stats *st)
{
	if (!st)
		return;
	memset(st, 0, sizeof *st);
	if (!c)
		return;
	st->state = cache_state_of(c);
	st->slot_bytes = c->slot_bytes;
	st->segment_bytes = c->seg_bytes;
	st->target_bytes = (uint64_t)c->n_active * c->seg_bytes;
	st->mapped_bytes = (uint64_t)c->n_mapped * c->seg_bytes;
	st->slots_total = c->n_slots;
	st->slots_mapped = c->n_mapped * c->sps;
	for (uint32_t k = 0; k < c->n_segs; k++) {
		if (!c->seg_mapped[k])
			continue;
		for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
			st->items_resident += c->slot_item[s] >= 0 && !c->slot_pending[s];
	}
	st->hits = c->hits;
	st->misses = c->misses;
	st->evictions = c->evictions;
	st->slots_pending = c->n_pending;
	st->bytes_loaded = c->bytes_loaded;
	st->peer_hits = c->peer_hits;
	if (c->peer_ops)
		c->peer_ops->stats(c, st);
}

int64_t cache_slot_of(const struct baton_cache *c, uint32_t item)
{
	if (!c || item >= c->n_items)
		return -1;
	return c->item_slot[item];
}

void cache_fault_map_after(struct baton_cache *c, int n)
{
	if (c)
		c->fault_map = n > 0 ? n : 0;
}
