/*
 * cache.c: the device expert cache (see cache.h for the contract).
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
 * Peer tier (cache_peer.c, plugged in through c->peer_ops: see
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

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define SLOT_ALIGN 256u
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

static baton_dptr slot_addr(const struct baton_cache *c, uint32_t s)
{
	return c->base + (uint64_t)(s / c->sps) * c->seg_bytes +
	    (uint64_t)(s % c->sps) * c->slot_bytes;
}

static baton_dptr seg_addr(const struct baton_cache *c, uint32_t k)
{
	return c->base + (uint64_t)k * c->seg_bytes;
}

static uint64_t seg_heat(const struct baton_cache *c, uint32_t k)
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
static int64_t peer_slot_of(const struct baton_cache *c, uint32_t i)
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
static int map_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
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

static int unmap_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
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

static int confirm_freed(struct baton_cache *c, uint64_t free_before, uint64_t bytes,
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

static int fill_own(struct baton_cache *c, const uint32_t *slots, uint32_t n, int verify,
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
	return n ? fill_own(c, c->cand, n, c->verify, rep) : 0;
}

/* Maps segment k unless it is, and fills its pending slots. */
static int load_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep)
{
	if (!c->seg_mapped[k]) {
		int rc = map_seg(c, k, rep);
		if (rc)
			return rc;
	}
	return fill_seg(c, k, rep);
}

/* ---- plans ---------------------------------------------------------------- */

struct seg_heat {
	uint64_t heat;
	uint32_t k;
};

static int cmp_hot_first(const void *a, const void *b)
{
	const struct seg_heat *x = a, *y = b;
	if (x->heat != y->heat)
		return x->heat > y->heat ? -1 : 1;
	return x->k < y->k ? -1 : x->k > y->k;
}

/* Whether a plan still has work in active segment k. */
static int seg_needs_refill(const struct baton_cache *c, uint32_t k)
{
	return c->seg_active[k] && (c->seg_mapped[k] ? c->seg_pending[k] > 0 : !c->plan_nomap);
}

/* The bytes loading segment k copies: its pending slots' items, or all
 * its assigned ones when it is not mapped (mapping makes them pending). */
static uint64_t seg_copy_bytes(const struct baton_cache *c, uint32_t k)
{
	uint64_t n = 0;
	for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++) {
		int64_t it = c->slot_item[s];
		if (it >= 0 && (c->seg_mapped[k] ? c->slot_pending[s] : 1))
			n += c->items[it].bytes;
	}
	return n;
}

/* plan = the active segments that are unmapped or have pending slots,
 * hottest first. */
static int make_plan(struct baton_cache *c)
{
	struct seg_heat *h = malloc((size_t)c->n_segs * sizeof *h);
	if (!h)
		return BATON_ENOMEM;
	uint32_t n = 0;
	uint64_t to_copy = 0;
	c->plan_nomap = 0;
	for (uint32_t k = 0; k < c->n_segs; k++) {
		if (!seg_needs_refill(c, k))
			continue;
		h[n++] = (struct seg_heat){ seg_heat(c, k), k };
		to_copy += seg_copy_bytes(c, k);
	}
	atomic_store(&c->prog_done, 0);
	atomic_store(&c->prog_total, to_copy);
	qsort(h, n, sizeof *h, cmp_hot_first);
	for (uint32_t i = 0; i < n; i++)
		c->plan[i] = h[i].k;
	c->plan_len = n;
	c->plan_pos = 0;
	free(h);
	return 0;
}

/* Skips plan entries that need nothing (filled early by lookups), and
 * unmapped ones once the device was full. */
static void plan_skip(struct baton_cache *c)
{
	while (c->plan_pos < c->plan_len && !seg_needs_refill(c, c->plan[c->plan_pos]))
		c->plan_pos++;
}

/* A segment of the plan copied `bytes` more. */
static void progress_step(struct baton_cache *c, uint64_t bytes)
{
	uint64_t total = atomic_load(&c->prog_total);
	uint64_t done = atomic_load(&c->prog_done) + bytes;
	if (done > total) /* lookups between steps may add work: never past 100% */
		done = total;
	atomic_store(&c->prog_done, done);
	if (c->prog_step)
		c->prog_step(c->prog_ctx, done, total);
}

/* No plan runs: nothing to report. */
static void progress_end(struct baton_cache *c)
{
	atomic_store(&c->prog_done, 0);
	atomic_store(&c->prog_total, 0);
}

/* Loads the next segment of the plan that can be loaded: 0 when one was
 * (or none is left), else an error. A segment that does not fit leaves
 * the rest of the plan to the mapped ones (partial: stop at what fit). */
static int plan_next(struct baton_cache *c, struct baton_cache_report *rep)
{
	for (plan_skip(c); c->plan_pos < c->plan_len; plan_skip(c)) {
		uint64_t before = rep->bytes_copied;
		int rc = load_seg(c, c->plan[c->plan_pos++], rep);
		if (rc == BATON_EDEVMEM) {
			c->plan_nomap = 1;
			continue;
		}
		progress_step(c, rep->bytes_copied - before);
		return rc;
	}
	return 0;
}

/* Runs the plan to its end. */
static int run_plan(struct baton_cache *c, struct baton_cache_report *rep)
{
	int rc = 0;
	plan_skip(c);
	while (!rc && c->plan_pos < c->plan_len) {
		rc = plan_next(c, rep);
		plan_skip(c);
	}
	c->plan_len = c->plan_pos = 0;
	return rc;
}

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
				unmap_seg(c, k, &rep);
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

/* ---- release / refill ---------------------------------------------------- */

static void rep_begin(struct baton_cache_report *rep)
{
	memset(rep, 0, sizeof *rep);
}

void cache_report_add(struct baton_cache_report *sum, const struct baton_cache_report *r)
{
	if (!sum || !r)
		return;
	sum->state = r->state;
	sum->bytes_copied += r->bytes_copied;
	sum->copies += r->copies;
	sum->segments_mapped += r->segments_mapped;
	sum->segments_unmapped += r->segments_unmapped;
	sum->bytes_freed += r->bytes_freed;
	sum->peer_bytes_freed += r->peer_bytes_freed;
	sum->mismatches += r->mismatches;
	sum->map_s += r->map_s;
	sum->copy_s += r->copy_s;
	sum->total_s += r->total_s;
}

int cache_release(struct baton_cache *c, struct baton_cache_report *rep)
{
	struct baton_cache_report local;
	if (!rep)
		rep = &local;
	rep_begin(rep);
	if (!c)
		return BATON_EINVAL;
	double t0 = baton_now_s();
	c->refilling = 0;
	c->plan_len = c->plan_pos = 0;
	int rc = 0;
	if (c->n_mapped) {
		uint64_t free_before = 0, total = 0, unmapped = 0;
		rc = c->be->mem_info(c->dev, &free_before, &total);
		for (uint32_t k = 0; !rc && k < c->n_segs; k++) {
			if (!c->seg_mapped[k])
				continue;
			rc = unmap_seg(c, k, rep);
			if (!rc)
				unmapped += c->seg_bytes;
		}
		if (!rc)
			rc = confirm_freed(c, free_before, unmapped, rep);
	}
	/* A released cache holds no borrowed memory either. */
	if (!rc && c->peer_ops)
		rc = c->peer_ops->drop(c, rep, &rep->peer_bytes_freed);
	if (!rc)
		c->released = 1;
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}

int cache_refill_begin(struct baton_cache *c)
{
	if (!c)
		return BATON_EINVAL;
	int rc = make_plan(c);
	if (rc)
		return rc;
	c->released = 0;
	c->refilling = c->plan_len > 0;
	return 0;
}

int cache_refill_step(struct baton_cache *c, int *done, struct baton_cache_report *rep)
{
	struct baton_cache_report local;
	if (!rep)
		rep = &local;
	rep_begin(rep);
	if (!c || !done)
		return BATON_EINVAL;
	double t0 = baton_now_s();
	int rc = 0;
	*done = 1;
	if (c->refilling) {
		rc = plan_next(c, rep);
		if (rc)
			c->plan_pos = c->plan_len;
		plan_skip(c);
		if (c->plan_pos < c->plan_len) {
			*done = 0;
		} else {
			c->refilling = 0;
			c->plan_len = c->plan_pos = 0;
			progress_end(c);
		}
	}
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}

int cache_refill(struct baton_cache *c, struct baton_cache_report *rep)
{
	struct baton_cache_report local, step;
	if (!rep)
		rep = &local;
	rep_begin(rep);
	if (!c)
		return BATON_EINVAL;
	double t0 = baton_now_s();
	int rc = cache_refill_begin(c), done = 0;
	c->defer_sync = !c->verify;
	c->n_inflight = 0;
	while (!rc && !done) {
		rc = cache_refill_step(c, &done, &step);
		cache_report_add(rep, &step);
	}
	if (c->defer_sync) {
		double t1 = baton_now_s();
		int rs = c->be->sync(c->dev);
		rep->copy_s += baton_now_s() - t1;
		if (rs) {
			/* Those copies may not have landed: their items leave. */
			for (uint32_t j = 0; j < c->n_inflight; j++)
				cache_unassign(c, c->inflight[j]);
			if (!rc)
				rc = rs;
		}
		c->defer_sync = 0;
		c->n_inflight = 0;
	}
	if (rc) {
		c->refilling = 0;
		c->plan_len = c->plan_pos = 0;
	}
	progress_end(c);
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}

/* ---- resize --------------------------------------------------------------- */

/* Takes segment k out of the target: unmapped, its items leave. */
static int deactivate(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep,
    uint64_t *unmapped)
{
	if (c->seg_mapped[k]) {
		int rc = unmap_seg(c, k, rep);
		if (rc)
			return rc;
		*unmapped += c->seg_bytes;
	}
	for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++)
		cache_unassign(c, s);
	c->seg_active[k] = 0;
	c->n_active--;
	return 0;
}

/* The segment to drop first: unmapped ones (they free nothing, and hold
 * only memories), then the coldest; ties to the higher index. */
static uint32_t coldest_active(const struct baton_cache *c)
{
	uint32_t best = UINT32_MAX;
	uint64_t best_heat = 0;
	int best_mapped = 1;
	for (uint32_t k = c->n_segs; k-- > 0;) {
		if (!c->seg_active[k])
			continue;
		uint64_t h = seg_heat(c, k);
		int m = c->seg_mapped[k];
		if (best == UINT32_MAX || m < best_mapped || (m == best_mapped && h < best_heat)) {
			best = k;
			best_heat = h;
			best_mapped = m;
		}
	}
	return best;
}

/* Puts segments into the target (lowest index first) until n_active ==
 * goal, assigning their slots the lowest-numbered items not assigned. */
static void activate(struct baton_cache *c, uint32_t goal)
{
	uint32_t next = 0;
	for (uint32_t k = 0; k < c->n_segs && c->n_active < goal; k++) {
		if (c->seg_active[k])
			continue;
		c->seg_active[k] = 1;
		c->n_active++;
		for (uint32_t s = k * c->sps; s < (k + 1) * c->sps; s++) {
			while (next < c->n_items && (c->item_slot[next] >= 0 || peer_slot_of(c, next) >= 0))
				next++;
			if (next >= c->n_items)
				break;
			cache_assign(c, s, next);
		}
	}
}

int cache_resize(struct baton_cache *c, int64_t reserve_bytes, struct baton_cache_report *rep)
{
	struct baton_cache_report local;
	if (!rep)
		rep = &local;
	rep_begin(rep);
	if (!c)
		return BATON_EINVAL;
	double t0 = baton_now_s();
	int rc = 0;
	c->refilling = 0;
	c->plan_len = c->plan_pos = 0;
	c->reserve = reserve_bytes < 0 ? c->cfg_reserve : (uint64_t)reserve_bytes;

	uint32_t goal = c->n_segs;
	uint64_t free_b = 0, total = 0, unmapped = 0;
	if (c->released) {
		/* Nothing is mapped to measure against: remember the reserve
		 * (and the ceiling) for the next refill. */
		if (reserve_bytes < 0)
			activate(c, goal);
		goto out;
	}
	rc = c->be->mem_info(c->dev, &free_b, &total);
	if (rc)
		goto out;
	if (reserve_bytes >= 0) {
		if (free_b >= c->reserve) {
			uint64_t extra = (free_b - c->reserve) / c->seg_bytes;
			if (extra < (uint64_t)c->n_segs - c->n_mapped)
				goal = c->n_mapped + (uint32_t)extra;
		} else {
			uint64_t deficit = c->reserve - free_b;
			uint64_t drop = (deficit + c->seg_bytes - 1) / c->seg_bytes;
			goal = drop < c->n_mapped ? c->n_mapped - (uint32_t)drop : 0;
		}
	}
	while (c->n_active > goal) {
		rc = deactivate(c, coldest_active(c), rep, &unmapped);
		if (rc)
			goto out;
	}
	if (unmapped) {
		rc = confirm_freed(c, free_b, unmapped, rep);
		if (rc)
			goto out;
	}
	activate(c, goal);
	rc = make_plan(c);
	if (!rc)
		rc = run_plan(c, rep);
	progress_end(c);
out:
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}

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
		uint64_t h = seg_heat(c, k);
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
		if (peer_slot_of(c, i) >= 0 && !cache_own_resident(c, i)) {
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
		rc = map_seg(c, k, &rep);
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
				rc = map_seg(c, k, &rep);
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
		rc = fill_own(c, c->fill, n_fill, 0, &rep);
		if (rc)
			goto out;
	}
	for (size_t j = 0; j < n; j++) {
		uint32_t i = items[j];
		c->item_heat[i]++;
		if (cache_own_resident(c, i)) {
			int64_t s = c->item_slot[i];
			blobs[j] = slot_addr(c, (uint32_t)s);
			c->slot_hits[s]++;
		} else {
			blobs[j] = c->peer_ops->slot_addr(c, (uint32_t)peer_slot_of(c, i));
		}
	}
	c->hits += hits + peer_hits;
	c->peer_hits += peer_hits;
	c->misses += loaded + n_miss;
	decay(c, n);
out:
	return rc;
}

/* ---- status --------------------------------------------------------------- */

int cache_all_resident(const struct baton_cache *c, baton_dptr *addrs)
{
	if (!c || !addrs || c->released)
		return 0;
	for (uint32_t i = 0; i < c->n_items; i++) {
		if (!cache_own_resident(c, i) || peer_slot_of(c, i) >= 0)
			return 0;
		addrs[i] = slot_addr(c, (uint32_t)c->item_slot[i]);
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
