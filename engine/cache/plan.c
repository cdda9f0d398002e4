/*
 * plan.c: refill plans: which segments a refill maps and fills, hottest
 * first, and the progress of the plan's copies (uses map.c).
 */
#include "engine/cache/cache_int.h"

#include <stdlib.h>
#include <string.h>

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
int cache_make_plan(struct baton_cache *c)
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
		h[n++] = (struct seg_heat){ cache_seg_heat(c, k), k };
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
void cache_plan_skip(struct baton_cache *c)
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
void cache_progress_end(struct baton_cache *c)
{
	atomic_store(&c->prog_done, 0);
	atomic_store(&c->prog_total, 0);
}

/* Loads the next segment of the plan that can be loaded: 0 when one was
 * (or none is left), else an error. A segment that does not fit leaves
 * the rest of the plan to the mapped ones (partial: stop at what fit). */
int cache_plan_next(struct baton_cache *c, struct baton_cache_report *rep)
{
	for (cache_plan_skip(c); c->plan_pos < c->plan_len; cache_plan_skip(c)) {
		uint64_t before = rep->bytes_copied;
		int rc = cache_load_seg(c, c->plan[c->plan_pos++], rep);
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
int cache_run_plan(struct baton_cache *c, struct baton_cache_report *rep)
{
	int rc = 0;
	cache_plan_skip(c);
	while (!rc && c->plan_pos < c->plan_len) {
		rc = cache_plan_next(c, rep);
		cache_plan_skip(c);
	}
	c->plan_len = c->plan_pos = 0;
	return rc;
}
