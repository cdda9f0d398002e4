/*
 * ops.c: release, refill and resize of the own tier (uses map.c, plan.c).
 */
#include "engine/cache/cache_int.h"

#include <stdlib.h>
#include <string.h>

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
			rc = cache_unmap_seg(c, k, rep);
			if (!rc)
				unmapped += c->seg_bytes;
		}
		if (!rc)
			rc = cache_confirm_own_freed(c, free_before, unmapped, rep);
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
	int rc = cache_make_plan(c);
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
		rc = cache_plan_next(c, rep);
		if (rc)
			c->plan_pos = c->plan_len;
		cache_plan_skip(c);
		if (c->plan_pos < c->plan_len) {
			*done = 0;
		} else {
			c->refilling = 0;
			c->plan_len = c->plan_pos = 0;
			cache_progress_end(c);
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
	cache_progress_end(c);
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
		int rc = cache_unmap_seg(c, k, rep);
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
		uint64_t h = cache_seg_heat(c, k);
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
			while (next < c->n_items && (c->item_slot[next] >= 0 || cache_peer_slot_via_ops(c, next) >= 0))
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
		rc = cache_confirm_own_freed(c, free_b, unmapped, rep);
		if (rc)
			goto out;
	}
	activate(c, goal);
	rc = cache_make_plan(c);
	if (!rc)
		rc = cache_run_plan(c, rep);
	cache_progress_end(c);
out:
	rep->state = cache_state_of(c);
	rep->total_s = baton_now_s() - t0;
	return rc;
}
