/*
 * map.c: the bottom of the own tier: its tables (assign, pending, state),
 * mapping and unmapping segments, release confirmation, and the one fill
 * routine cache_fill (see cache.c's top for the design).
 */
#include "engine/cache/cache_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define CONFIRM_WAIT_S 0.25
#define VERIFY_CHUNK (16u << 20)

static void sleep_s(double s)
{
	struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

const char *cache_state_name(int state)
{
	switch (state) {
	case BATON_CACHE_READY: return baton_state_name(BATON_STATE_READY);
	case BATON_CACHE_RELEASED: return baton_state_name(BATON_STATE_RELEASED);
	case BATON_CACHE_PARTIAL: return baton_state_name(BATON_STATE_PARTIAL);
	case BATON_CACHE_REFILLING: return baton_state_name(BATON_STATE_REFILLING);
	default: return "unknown";
	}
}

int cache_state_of(const struct baton_cache *c)
{
	if (c->refilling)
		return BATON_CACHE_REFILLING;
	if (c->released)
		return BATON_CACHE_RELEASED;
	return c->n_mapped == c->n_active && c->n_pending == 0 ? BATON_CACHE_READY
	                                                      : BATON_CACHE_PARTIAL;
}

baton_dptr cache_own_slot_addr(const struct baton_cache *c, uint32_t s)
{
	return c->base + (uint64_t)(s / c->sps) * c->seg_bytes +
	    (uint64_t)(s % c->sps) * c->slot_bytes;
}

static baton_dptr seg_addr(const struct baton_cache *c, uint32_t k)
{
	return c->base + (uint64_t)k * c->seg_bytes;
}

uint64_t cache_seg_heat(const struct baton_cache *c, uint32_t k)
{
	uint64_t h = 0;
	for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
		h += c->slot_hits[s];
	return h;
}

static void set_pending(struct baton_cache *c, uint32_t s)
{
	if (c->slot_pending[s])
		return;
	c->slot_pending[s] = 1;
	c->seg_pending[s / c->sps]++;
	c->n_pending++;
}

void cache_clear_pending(struct baton_cache *c, uint32_t s)
{
	if (!c->slot_pending[s])
		return;
	c->slot_pending[s] = 0;
	c->seg_pending[s / c->sps]--;
	c->n_pending--;
}

void cache_unassign(struct baton_cache *c, uint32_t s)
{
	if (c->slot_item[s] >= 0)
		c->item_slot[c->slot_item[s]] = -1;
	c->slot_item[s] = -1;
	c->slot_hits[s] = 0;
	cache_clear_pending(c, s);
}

/* In a mapped segment the new assignment is pending until copied. */
void cache_assign(struct baton_cache *c, uint32_t s, uint32_t item)
{
	cache_unassign(c, s);
	if (c->item_slot[item] >= 0)
		cache_unassign(c, (uint32_t)c->item_slot[item]);
	c->slot_item[s] = item;
	c->item_slot[item] = s;
	if (c->seg_mapped[s / c->sps])
		set_pending(c, s);
}

int cache_own_resident(const struct baton_cache *c, uint32_t i)
{
	int64_t s = c->item_slot[i];
	return s >= 0 && c->seg_mapped[s / c->sps] && !c->slot_pending[s];
}

int cache_own_present(const struct baton_cache *c, uint32_t i)
{
	int64_t s = c->item_slot[i];
	return s >= 0 && c->seg_mapped[s / c->sps];
}

/* The peer slot of item, or -1 (no peer tier yet: -1). */
int64_t cache_peer_slot_via_ops(const struct baton_cache *c, uint32_t i)
{
	return c->peer_ops ? c->peer_ops->slot_of(c, i) : -1;
}

int cache_fault_due(struct baton_cache *c)
{
	return c->fault_map > 0 && --c->fault_map == 0;
}

/* ---- mapping -------------------------------------------------------------- */

/* Maps segment k unless the reserve forbids it or the device is full
 * (BATON_EDEVMEM either way). Its assigned slots become pending. */
int cache_map_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
{
	uint64_t free_b = 0, total = 0;
	double t0 = baton_now_s();
	int rc = c->be->mem_info(c->dev, &free_b, &total);
	if (rc)
		return rc;
	if (free_b < c->reserve || free_b - c->reserve < c->seg_bytes)
		return BATON_EDEVMEM;
	if (cache_fault_due(c))
		return BATON_EDEVMEM;
	rc = c->be->map(c->dev, seg_addr(c, k), c->seg_bytes);
	rep->map_s += baton_now_s() - t0;
	if (rc)
		return rc;
	c->seg_mapped[k] = 1;
	c->n_mapped++;
	c->released = 0;
	rep->segments_mapped++;
	for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
		if (c->slot_item[s] >= 0)
			set_pending(c, s);
	return 0;
}

int cache_unmap_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
{
	double t0 = baton_now_s();
	int rc = c->be->unmap(c->dev, seg_addr(c, k), c->seg_bytes);
	rep->map_s += baton_now_s() - t0;
	if (rc)
		return rc;
	c->seg_mapped[k] = 0;
	c->n_mapped--;
	rep->segments_unmapped++;
	for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
		cache_clear_pending(c, s); /* pending again means remembered */
	return 0;
}

/* Polls mem_info of `dev` until free >= free_before + bytes (see the top). */
int cache_confirm_freed(struct baton_cache *c, struct baton_dev *dev, uint64_t free_before,
    uint64_t bytes, uint64_t *freed)
{
	double deadline = baton_now_s() + CONFIRM_WAIT_S;
	uint64_t free_b = 0, total = 0;
	for (;;) {
		int rc = c->be->mem_info(dev, &free_b, &total);
		if (rc)
			return rc;
		if (free_b >= free_before + bytes || baton_now_s() >= deadline)
			break;
		sleep_s(0.001);
	}
	*freed = free_b > free_before ? free_b - free_before : 0;
	return 0;
}

int cache_confirm_own_freed(struct baton_cache *c, uint64_t free_before, uint64_t bytes,
    struct baton_cache_report *rep)
{
	return cache_confirm_freed(c, c->dev, free_before, bytes, &rep->bytes_freed);
}

/* ---- copies --------------------------------------------------------------- */

static int grow_copies(struct baton_cache *c, uint32_t n)
{
	if (n <= c->copies_cap)
		return 0;
	struct baton_copy *p = realloc(c->copies, (size_t)n * sizeof *p);
	if (!p)
		return BATON_ENOMEM;
	c->copies = p;
	c->copies_cap = n;
	return 0;
}

/* Reads item `item` back from addr and compares it with its checksum. */
int cache_verify_at(struct baton_cache *c, uint32_t item, baton_dptr addr, int *ok)
{
	const struct baton_cache_item *it = &c->items[item];
	if (!c->vbuf) {
		uint64_t n = c->slot_bytes < VERIFY_CHUNK ? c->slot_bytes : VERIFY_CHUNK;
		c->vbuf = malloc(n);
		if (!c->vbuf)
			return BATON_ENOMEM;
	}
	XXH3_state_t *xxh = c->xxh;
	XXH3_64bits_reset(xxh);
	for (uint64_t off = 0; off < it->bytes;) {
		uint64_t n = it->bytes - off < VERIFY_CHUNK ? it->bytes - off : VERIFY_CHUNK;
		int rc = c->be->copy_d2h(c->dev, c->vbuf, addr + off, n);
		if (rc)
			return rc;
		XXH3_64bits_update(xxh, c->vbuf, n);
		off += n;
	}
	*ok = XXH3_64bits_digest(xxh) == it->checksum;
	return 0;
}

struct cache_slots cache_own_slots(struct baton_cache *c)
{
	return (struct cache_slots){ c->base, c->slot_item, 1, cache_unassign };
}

baton_dptr cache_slot_addr(const struct baton_cache *c, const struct cache_slots *t, uint32_t s)
{
	return t->base + (uint64_t)(s / c->sps) * c->seg_bytes + (uint64_t)(s % c->sps) * c->slot_bytes;
}

/* One routine fills both tiers' slots (see cache_int.h). A run of
 * neighbouring slots of one segment whose sources follow each other
 * without a gap is one copy. Only the own tier's blocking refill defers
 * the sync (defer_sync); the peer tier never runs inside one. */
int cache_fill(struct baton_cache *c, const struct cache_slots *t, const uint32_t *slots,
    uint32_t n, int verify, struct baton_cache_report *rep)
{
	int rc = grow_copies(c, n);
	if (rc)
		return rc;
	const int defer = t->pending && c->defer_sync;
	uint32_t nc = 0;
	uint64_t bytes = 0;
	uint32_t prev = UINT32_MAX;
	for (uint32_t j = 0; j < n; j++) {
		uint32_t s = slots[j];
		if (t->slot_item[s] < 0)
			continue;
		const struct baton_cache_item *it = &c->items[t->slot_item[s]];
		if (!it->bytes)
			continue;
		baton_dptr dst = cache_slot_addr(c, t, s);
		struct baton_copy *last = nc ? &c->copies[nc - 1] : NULL;
		if (last && prev + 1 == s && prev / c->sps == s / c->sps &&
		    last->dst + last->bytes == dst &&
		    (const char *)last->src + last->bytes == (const char *)it->src) {
			last->bytes += it->bytes;
		} else {
			c->copies[nc++] = (struct baton_copy){ dst, it->src, it->bytes };
		}
		bytes += it->bytes;
		prev = s;
	}
	double t0 = baton_now_s();
	rc = nc ? c->be->copy_h2d(c->dev, c->copies, nc) : 0;
	if (!rc && nc && !defer)
		rc = c->be->sync(c->dev);
	if (!rc && nc && c->src_check)
		rc = c->src_check(c->src_ctx);
	if (!rc && defer && c->n_inflight + n > c->cap_inflight) {
		uint32_t cap = c->n_inflight + n > 2 * c->cap_inflight ? c->n_inflight + n : 2 * c->cap_inflight;
		uint32_t *p = realloc(c->inflight, (size_t)cap * sizeof *p);
		if (p) {
			c->inflight = p;
			c->cap_inflight = cap;
		} else {
			rc = c->be->sync(c->dev); /* no room to remember: settle now */
			if (!rc)
				rc = BATON_ENOMEM;
		}
	}
	if (rc) {
		for (uint32_t j = 0; j < n; j++)
			t->drop(c, slots[j]);
		rep->copy_s += baton_now_s() - t0;
		return rc;
	}
	rep->copies += nc;
	rep->bytes_copied += bytes;
	c->bytes_loaded += bytes;
	for (uint32_t j = 0; t->pending && j < n; j++)
		cache_clear_pending(c, slots[j]);
	if (defer) {
		memcpy(c->inflight + c->n_inflight, slots, (size_t)n * sizeof *slots);
		c->n_inflight += n;
	}
	for (uint32_t j = 0; verify && j < n; j++) {
		uint32_t s = slots[j];
		if (t->slot_item[s] < 0)
			continue;
		int ok = 0;
		rc = cache_verify_at(c, (uint32_t)t->slot_item[s], cache_slot_addr(c, t, s), &ok);
		if (rc)
			break;
		if (!ok) {
			/* Never serve wrong bytes: the item leaves and
			 * is loaded again by the next lookup. */
			rep->mismatches++;
			t->drop(c, s);
		}
	}
	rep->copy_s += baton_now_s() - t0;
	return rc;
}

int cache_fill_own(struct baton_cache *c, const uint32_t *slots, uint32_t n, int verify,
    struct baton_cache_report *rep)
{
	struct cache_slots own = cache_own_slots(c);
	return cache_fill(c, &own, slots, n, verify, rep);
}

/* Copies segment k's pending items in (k is mapped). */
static int fill_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
{
	uint32_t n = 0;
	for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
		if (c->slot_pending[s])
			c->cand[n++] = s;
	return n ? cache_fill_own(c, c->cand, n, c->verify, rep) : 0;
}

/* Maps segment k unless it is, and fills its pending slots. */
int cache_load_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
{
	if (!c->seg_mapped[k]) {
		int rc = cache_map_seg(c, k, rep);
		if (rc)
			return rc;
	}
	return fill_seg(c, k, rep);
}
