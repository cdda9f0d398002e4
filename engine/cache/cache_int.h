/*
 * cache_int.h: internal to the expert cache (the own tier's cache.c, map.c,
 * plan.c, ops.c, lookup.c; the peer tier's peer.c; their tests); not a
 * public door.
 *
 * Layering. cache.c (with map.c, plan.c, ops.c, lookup.c) is the own
 * tier and the public cache; peer.c is the peer tier. The peer tier uses the own tier's helpers below; the own
 * tier never calls a function of peer.c by name: cache_peer_set plugs
 * the peer tier in by setting c->peer_ops, and the own tier calls through
 * that table (release, destroy, lookup, stats). So the calls go one way.
 */
#ifndef BATON_ENGINE_CACHE_INT_H
#define BATON_ENGINE_CACHE_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "engine/cache/cache.h"

/* The peer tier as the own tier sees it (set by peer.c). */
struct cache_peer_ops {
	/* The peer slot holding `item`, or -1. */
	int64_t (*slot_of)(const struct baton_cache *c, uint32_t item);
	/* The device address of peer slot p. */
	baton_dptr (*slot_addr)(const struct baton_cache *c, uint32_t p);
	/* At the start of a lookup, before it hands out addresses: a
	 * rebalance when one is due. */
	int (*before_lookup)(struct baton_cache *c, struct baton_cache_report *rep);
	/* Unmaps every peer segment, confirmed on the peer (release);
	 * *freed = what the peer's free count rose by. */
	int (*drop)(struct baton_cache *c, struct baton_cache_report *rep, uint64_t *freed);
	/* The peer_* fields of the stats. */
	void (*stats)(const struct baton_cache *c, struct baton_cache_stats *st);
	/* Unmaps, unreserves and frees what the peer tier holds (destroy). */
	void (*destroy)(struct baton_cache *c);
};

/* The peer tier's state, owned by peer.c (see cache.c's top): n_segs
 * segments of the own seg_bytes at base (a second reservation on dev, made
 * at the first cache_peer_set, kept until destroy), the first `mapped` of
 * them mapped on `dev`; slot_item / item_slot its residency table. */
struct cache_peer {
	struct baton_dev *dev;
	baton_dptr base;
	uint64_t range;
	uint32_t n_segs, mapped;
	int64_t *slot_item, *item_slot;
	uint32_t *a, *b;       /* rebalance scratch: max(items, slots, peer slots) each */
	uint32_t *fillv;       /* peer slots to copy into */
	uint32_t *prom;        /* the peer slot each promotion copies from */
	uint8_t *queued;       /* peer slots refilled by this rebalance */
	int tuned;             /* cache_peer_tune was called: every, moves hold */
	uint32_t every, moves, calls;
	uint64_t moves_done;
};

struct baton_cache {
	const struct baton_backend *be;
	int (*src_check)(void *ctx); /* cache_set_src_check */
	void *src_ctx;
	void (*prog_step)(void *ctx, uint64_t done, uint64_t total); /* cache_set_progress */
	void *prog_ctx;
	_Atomic uint64_t prog_done, prog_total; /* the plan's copy progress (any thread reads) */
	struct baton_dev *dev;
	const struct baton_cache_item *items;
	uint32_t n_items;

	uint64_t slot_bytes, seg_bytes;
	uint32_t sps, n_segs, n_slots;
	baton_dptr base;
	uint64_t range_bytes;
	uint64_t cfg_reserve, reserve;
	int verify;

	int released, refilling;
	int plan_nomap; /* this plan met a full device: only fill mapped segments */
	int fault_map; /* countdown to an injected BATON_EDEVMEM (maps of both tiers); 0 = off */

	int64_t *slot_item;
	int64_t *item_slot;
	uint64_t *slot_hits;
	uint8_t *slot_pending;
	uint8_t *seg_active, *seg_mapped;
	uint32_t *seg_pending; /* pending slots per segment */
	uint32_t n_active, n_mapped, n_pending;

	uint32_t *plan;
	uint32_t plan_len, plan_pos;

	/* lookup scratch */
	uint32_t call;
	uint32_t *item_mark, *slot_mark, *seg_mark;
	uint32_t *need;     /* distinct items of a call */
	uint32_t *cand;     /* candidate slots */
	uint32_t *fill;     /* slots a lookup copies into */
	uint32_t need_cap;
	struct baton_copy *copies;
	uint32_t copies_cap;
	uint8_t *vbuf;
	void *xxh;          /* XXH3_state_t, used by cache.c and map.c only */

	uint64_t *item_heat; /* per item: lookups whatever tier serves it, decayed like slot_hits */
	uint64_t accesses, decay_period;
	uint64_t hits, misses, evictions, peer_hits;
	uint64_t bytes_loaded; /* host to device, every operation, ever */
	/* A blocking refill queues every segment's copies and waits once at
	 * the end, so mapping segment k+1 overlaps copying segment k; the
	 * slots filled meanwhile wait here for that sync (undone if it fails). */
	int defer_sync;
	uint32_t *inflight;
	uint32_t n_inflight, cap_inflight;

	/* The peer tier: NULL ops until the first cache_peer_set. */
	const struct cache_peer_ops *peer_ops;
	struct cache_peer pt;
};

/* A tier's slot table, as the one fill routine sees it: slot s of either
 * tier lives at base + (s / sps) * seg_bytes + (s % sps) * slot_bytes. */
struct cache_slots {
	baton_dptr base;
	int64_t *slot_item;
	int pending;  /* the tier has a pending state (the own tier) */
	void (*drop)(struct baton_cache *c, uint32_t s); /* empties slot s */
};

/* ---- the own tier's helpers, for the peer tier (map.c; cmp_u32: lookup.c) */

int cache_state_of(const struct baton_cache *c);
int cache_cmp_u32(const void *a, const void *b);
/* The own tier's slot table. */
struct cache_slots cache_own_slots(struct baton_cache *c);
baton_dptr cache_slot_addr(const struct baton_cache *c, const struct cache_slots *t, uint32_t s);
/* Assigned to a slot of a mapped own segment (resident or pending), and
 * the same but filled. */
int cache_own_present(const struct baton_cache *c, uint32_t item);
int cache_own_resident(const struct baton_cache *c, uint32_t item);
/* Own slot s gets `item` (pending until copied when its segment is
 * mapped); unassign empties it. */
void cache_assign(struct baton_cache *c, uint32_t s, uint32_t item);
void cache_unassign(struct baton_cache *c, uint32_t s);
void cache_clear_pending(struct baton_cache *c, uint32_t s);
/* Copies the assigned items of slots[0..n) (ascending) of tier t in one
 * batch, coalescing runs, then syncs (the own tier's blocking refill
 * defers that sync); with verify reads each one back. A failed copy
 * empties the slots; a slot whose bytes differ is emptied. */
int cache_fill(struct baton_cache *c, const struct cache_slots *t, const uint32_t *slots,
    uint32_t n, int verify, struct baton_cache_report *rep);
/* Reads `item` back from addr and compares it with its checksum. */
int cache_verify_at(struct baton_cache *c, uint32_t item, baton_dptr addr, int *ok);
/* Polls mem_info of `dev` until free >= free_before + bytes, or a short
 * wait passed; *freed = what free rose by. */
int cache_confirm_freed(struct baton_cache *c, struct baton_dev *dev, uint64_t free_before,
    uint64_t bytes, uint64_t *freed);
/* Counts down c->fault_map: 1 when this map is to fail. */
int cache_fault_due(struct baton_cache *c);

/* ---- between the own tier's files (map.c, plan.c, ops.c, lookup.c, cache.c) */

/* map.c */
int cache_confirm_own_freed(struct baton_cache *c, uint64_t free_before, uint64_t bytes,
    struct baton_cache_report *rep);
int cache_fill_own(struct baton_cache *c, const uint32_t *slots, uint32_t n, int verify,
    struct baton_cache_report *rep);
/* Maps segment k unless it is, and fills its pending slots. */
int cache_load_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep);
/* Maps segment k unless the reserve forbids it or the device is full
 * (BATON_EDEVMEM either way). Its assigned slots become pending. */
int cache_map_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep);
/* The peer slot of item, or -1 (no peer tier yet: -1). */
int64_t cache_peer_slot_via_ops(const struct baton_cache *c, uint32_t i);
uint64_t cache_seg_heat(const struct baton_cache *c, uint32_t k);
baton_dptr cache_own_slot_addr(const struct baton_cache *c, uint32_t s);
int cache_unmap_seg(struct baton_cache *c, uint32_t k, struct baton_cache_report *rep);

/* plan.c */
/* plan = the active segments that are unmapped or have pending slots,
 * hottest first. */
int cache_make_plan(struct baton_cache *c);
/* Loads the next segment of the plan that can be loaded: 0 when one was
 * (or none is left), else an error. A segment that does not fit leaves
 * the rest of the plan to the mapped ones (partial: stop at what fit). */
int cache_plan_next(struct baton_cache *c, struct baton_cache_report *rep);
/* Skips plan entries that need nothing (filled early by lookups), and
 * unmapped ones once the device was full. */
void cache_plan_skip(struct baton_cache *c);
/* No plan runs: nothing to report. */
void cache_progress_end(struct baton_cache *c);
/* Runs the plan to its end. */
int cache_run_plan(struct baton_cache *c, struct baton_cache_report *rep);

/* Test hook: fail the n-th future backend map call (own or peer) with
 * BATON_EDEVMEM (0 disables). Used to drive the partial paths. */
void cache_fault_map_after(struct baton_cache *c, int n);

#endif
