/*
 * cache.h: the engine's device expert cache.
 *
 * A reserved address range cut into segments (default 256 MiB, each a
 * physical allocation of the backend) and each segment into fixed slots of
 * `slot_bytes` (a slot never spans segments, so unmapping a segment evicts
 * whole slots). Items are the arena's expert blobs, numbered
 * layer * n_experts + expert. The residency table maps slot <-> item and
 * counts hits per slot.
 *
 *   release  remember the resident set, unmap every segment; the range
 *            stays reserved, so slot addresses stay valid.
 *   refill   map the segments again and copy the remembered items back into
 *            the same slots, hottest segment first, neighbouring slots with
 *            neighbouring sources in one copy. On a fresh cache the
 *            remembered set is items 0, 1, 2... in order (the warm-up).
 *   resize   keep `reserve` bytes of the device free: shrink unmaps the
 *            coldest segments; grow maps segments while free - reserve
 *            allows, then fills them.
 * Out of device memory during refill or grow is not a failure: the cache
 * stops at what fit, in state PARTIAL, and a later refill completes it.
 *
 * A refill can run in steps (refill_begin, then refill_step until done) so
 * that the serve loop can answer a request between steps; cache_lookup()
 * during a refill loads what it needs first.
 *
 * A lookup while released, partial or refilling maps the segments of the
 * remembered items it needs but copies only those items, into their
 * remembered slots; the other slots of such a segment are *pending* (mapped,
 * not yet filled: not resident) until a refill, or a lookup of them, fills
 * them. The state is READY only once nothing is pending.
 *
 * The peer tier (cache_peer_set) is a second set of slots of the same
 * geometry on another device, mapped into this device's address space
 * (backend map_peer: its kernels read them over NVLink or PCIe). An item is
 * in at most one tier. A lookup takes an item from the own tier when it is
 * resident there, else from the peer tier, else loads it into own slots as
 * above: misses never go to the peer tier and never evict from it, so a
 * peer tier only ever saves copies. Experts move between the tiers by heat
 * (lookups per item, decayed with the slot counts): every `every` lookups
 * (cache_peer_tune; default 64) a rebalance, before that lookup hands out
 * addresses, swaps the hottest peer items with colder own ones
 * (promotion), then puts the hottest items of neither tier into empty peer
 * slots and in place of colder peer items (intake), at most `moves`
 * (default 8) of each kind. "Colder" means by at least 2 lookups, so that
 * near-equal items do not swap back and forth. A promoted item is copied
 * from its peer slot when the backend has copy_d2d (else from the host
 * arena), and before anything is copied into that slot; every other move
 * is a copy from the host arena. The peer tier is lent and revoked by the broker:
 *   peer_set(bytes > 0)  map whole segments on the peer up to `bytes`,
 *            and no more than the items outside the own tier's target need
 *            (fewer when the peer has no room: partial is not an error),
 *            unmap segments above it, fill the empty slots hottest first
 *   peer_set(0)          unmap it all, confirmed on the peer's mem_info
 *   release  also drops the peer tier (a released cache holds no borrowed
 *            memory); refill and resize touch the own tier only
 * Nothing of the own tier changes when the peer tier comes or goes, except
 * that an item taken into the peer tier stops being remembered by the own
 * tier (a refill would not copy it twice).
 *
 * Not thread-safe: one thread (the engine's serve loop) drives a cache.
 */
#ifndef BATON_ENGINE_CACHE_H
#define BATON_ENGINE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"

enum baton_cache_state {
	BATON_CACHE_READY = 0,    /* every segment up to the target is mapped and filled */
	BATON_CACHE_RELEASED = 1, /* nothing mapped; resident set remembered */
	BATON_CACHE_PARTIAL = 2,  /* some segments could not be mapped (device full) */
	BATON_CACHE_REFILLING = 3 /* between refill_begin and the last refill_step */
};

const char *cache_state_name(int state);

struct baton_cache_item {
	const void *src;   /* host bytes (the arena mapping) */
	uint64_t bytes;    /* <= slot_bytes */
	uint64_t checksum; /* XXH3-64 of the bytes, for verify mode */
};

struct baton_cache_config {
	uint64_t slot_bytes;    /* >= every item's bytes */
	uint64_t segment_bytes; /* rounded up to the backend's granularity and to >= one slot */
	uint64_t ceiling_bytes; /* the configured size; rounded down to whole segments, >= 1 segment */
	uint64_t reserve_bytes; /* device memory to leave free when growing or refilling */
	int verify;             /* read back every refilled slot and compare checksums */
};

/* What one operation did. */
struct baton_cache_report {
	int state;               /* enum baton_cache_state after the operation */
	uint64_t bytes_copied;   /* host to device */
	uint64_t copies;         /* copy operations after coalescing */
	uint64_t segments_mapped, segments_unmapped;
	uint64_t bytes_freed;    /* device free after - before (release, shrink) */
	uint64_t peer_bytes_freed; /* the same on the peer (release, peer_set) */
	uint64_t mismatches;     /* verify mode: slots whose bytes differ */
	double map_s;            /* inside the backend's map and unmap calls */
	double copy_s, total_s;
};

/* Adds r's counts and times to sum and takes r's state: the totals of a
 * sequence of operations (a refill's steps; release, resize and refill). */
void cache_report_add(struct baton_cache_report *sum, const struct baton_cache_report *r);

struct baton_cache_stats {
	int state;
	uint64_t slot_bytes, segment_bytes;
	uint64_t target_bytes;   /* what the cache tries to hold now (ceiling or resized) */
	uint64_t mapped_bytes;   /* segments mapped now */
	uint32_t slots_total, slots_mapped, items_resident;
	uint64_t hits, misses, evictions;
	uint32_t slots_pending;  /* assigned slots of mapped segments not filled yet */
	uint64_t bytes_loaded;   /* host to device by every operation since create */
	/* peer tier */
	uint64_t peer_mapped_bytes;     /* segments mapped on the peer now */
	uint32_t peer_slots_mapped, peer_items_resident;
	uint64_t peer_hits;             /* lookups served from the peer (in hits too) */
	uint64_t peer_moves;            /* items moved between the tiers by heat */
};

struct baton_cache;

/* Reserves ceiling_bytes of address space; maps nothing (call
 * cache_refill to warm it). items must outlive the cache. */
int cache_create(const struct baton_backend *be, struct baton_dev *dev,
    const struct baton_cache_config *cfg, const struct baton_cache_item *items,
    uint32_t n_items, struct baton_cache **out, char *errbuf, size_t errlen);
/* Unmaps every segment and gives the reservation back; NULL allowed. */
void cache_destroy(struct baton_cache *c);

/* Optional: `check` runs after every copy from the items' host bytes; a
 * nonzero return fails that copy with its code and drops its slots. The
 * engine checks its arena is still whole: one that shrank under it reads
 * zeros (arena/guard.c), which must never become resident. */
void cache_set_src_check(struct baton_cache *c, int (*check)(void *ctx), void *ctx);

/* Copy progress of the refill (or grow) in progress: *done of *total bytes
 * to copy, both 0 when none runs.
 * Readable from any thread while the cache's own thread refills (the
 * engine's heartbeats report it, so the broker sees a long refill move).
 * Optional: `step` runs on the cache's thread after each segment of a
 * refill or grow, with the same figures (NULL: none). */
void cache_progress(const struct baton_cache *c, uint64_t *done, uint64_t *total);
void cache_set_progress(struct baton_cache *c, void (*step)(void *ctx, uint64_t done, uint64_t total),
    void *ctx);

/* Unmaps every segment, and the peer tier's. Returns 0 only once the
 * device's free memory rose by what was unmapped (confirmed with mem_info;
 * the peer's likewise); idempotent. */
int cache_release(struct baton_cache *c, struct baton_cache_report *rep);
/* Maps and fills up to the target; 0 with rep->state READY or PARTIAL. */
int cache_refill(struct baton_cache *c, struct baton_cache_report *rep);
/* Stepwise refill: begin, then step until *done; each step maps and fills
 * at most one segment. cache_refill is begin + steps. */
int cache_refill_begin(struct baton_cache *c);
int cache_refill_step(struct baton_cache *c, int *done, struct baton_cache_report *rep);

/* Keep reserve_bytes of the device free; reserve_bytes < 0 means "grow back
 * to the ceiling" (the protocol's reserve_mib: null). */
int cache_resize(struct baton_cache *c, int64_t reserve_bytes, struct baton_cache_report *rep);

/* Makes items[0..n) resident (duplicates allowed) and writes each one's
 * blob address. Misses are loaded in one batch into the least valuable
 * slots not needed by this call; while released or partial this maps what
 * it needs first. BATON_EDEVMEM when fewer slots can be mapped than
 * distinct items are needed. Counts hits. */
int cache_lookup(struct baton_cache *c, const uint32_t *items, size_t n, baton_dptr *blobs);

/* Every item's blob address, when every item is resident in the own tier
 * (mapped, filled, none on the peer): writes n_items addresses to addrs and
 * returns 1; else 0 and addrs is undefined. The model keeps this table on
 * the device so a decode step finds its experts there (no host round
 * trip); it checks again before every step, as any operation may move
 * items. Changes nothing, counts nothing. */
int cache_all_resident(const struct baton_cache *c, baton_dptr *addrs);

/* The peer tier on `peer` (another device of the cache's backend):
 * bytes > 0 holds up to floor(bytes / segment) segments there (see the
 * top), stopping cleanly where the peer is full; rep->segments_mapped and
 * cache_stats say what is mapped. bytes == 0 drops it (peer may be NULL);
 * rep->peer_bytes_freed is what the peer's free count rose by. Errors, with
 * nothing changed: BATON_EINVAL (no peer, the own device, or another peer
 * while one is mapped), BATON_EUNSUPPORTED (the backend has no map_peer, or
 * its peer_access says no), BATON_ESTATE (the cache is released). */
int cache_peer_set(struct baton_cache *c, struct baton_dev *peer, uint64_t bytes,
    struct baton_cache_report *rep);
/* One rebalance now (tests, benchmarks). */
int cache_peer_rebalance(struct baton_cache *c, struct baton_cache_report *rep);
/* Rebalance every `every` lookups (0: never), `moves` moves of each kind. */
void cache_peer_tune(struct baton_cache *c, uint32_t every, uint32_t moves);
/* The bytes a peer tier could usefully hold: the segments for the items
 * that do not fit the own tier's ceiling; 0 when all fit. */
uint64_t cache_peer_want(const struct baton_cache *c);
/* The peer slot holding `item`, or -1. */
int64_t cache_peer_slot_of(const struct baton_cache *c, uint32_t item);

void cache_stats(const struct baton_cache *c, struct baton_cache_stats *st);
/* The slot holding `item`, or -1; for tests and status. */
int64_t cache_slot_of(const struct baton_cache *c, uint32_t item);

#endif
