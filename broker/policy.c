/*
 * policy.c: who gives memory back, and how (see broker.h). Pure: no
 * clock, no registry, no I/O, so broker/policy_test.c checks it from a
 * table and the daemon calls it with a snapshot.
 */
#include <string.h>

#include "broker/broker.h"

/* May this engine be asked at all? Counts why not. */
static int candidate(const struct policy_engine *e, size_t i, size_t requester,
    struct policy_plan *plan)
{
	const struct policy_engine *x = &e[i];
	if (i == requester || x->dead)
		return 0;
	if (x->granted || x->refilling) { /* what it holds (or was granted) is being filled */
		if (plan)
			plan->skipped_refilling++;
		return 0;
	}
	if (x->held == 0)
		return 0;
	if (x->pinned) {
		if (plan)
			plan->skipped_pinned++;
		return 0;
	}
	if (x->in_flight) {
		if (plan)
			plan->skipped_in_flight++;
		return 0;
	}
	/* A busy engine gives way between two requests, and only to a
	 * requester of at least its priority. */
	if (x->busy && requester != (size_t)-1 && x->priority > e[requester].priority) {
		if (plan)
			plan->skipped_busy++;
		return 0;
	}
	return 1;
}

/* <0 when a is asked before b. */
static int cmp(const struct policy_engine *a, const struct policy_engine *b)
{
	if (a->busy != b->busy)
		return a->busy ? 1 : -1;                   /* idle first */
	if (a->priority != b->priority)
		return a->priority < b->priority ? -1 : 1; /* lowest priority first */
	if (a->idle_s != b->idle_s)
		return a->idle_s > b->idle_s ? -1 : 1;     /* longest idle first */
	return strcmp(a->name ? a->name : "", b->name ? b->name : "");
}

/* Insertion sort: n is small (the engines of one device), it is stable,
 * and it needs no global for the comparator's context. */
static void sort_idx(const struct policy_engine *e, size_t *idx, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		size_t v = idx[i], j = i;
		while (j > 0 && cmp(&e[idx[j - 1]], &e[v]) > 0) {
			idx[j] = idx[j - 1];
			j--;
		}
		idx[j] = v;
	}
}

static size_t order(const struct policy_engine *e, size_t n, size_t requester, size_t *out,
    struct policy_plan *plan)
{
	size_t k = 0;
	for (size_t i = 0; i < n && k < BROKER_MAX_ENGINES; i++)
		if (candidate(e, i, requester, plan))
			out[k++] = i;
	sort_idx(e, out, k);
	return k;
}

size_t policy_order(const struct policy_engine *e, size_t n, size_t requester, size_t *out)
{
	return order(e, n, requester, out, NULL);
}

void policy_decide(const struct policy_engine *e, size_t n, size_t requester, uint64_t need,
    struct policy_plan *plan)
{
	size_t idx[BROKER_MAX_ENGINES];
	memset(plan, 0, sizeof *plan);
	if (need == 0)
		return;
	size_t k = order(e, n, requester, idx, plan);
	uint64_t left = need;
	for (size_t j = 0; j < k && left > 0; j++) {
		const struct policy_engine *x = &e[idx[j]];
		struct policy_action *a = &plan->act[plan->n++];
		a->engine = idx[j];
		if (!x->no_shrink && left < x->held && x->held - left >= x->floor) {
			a->kind = POLICY_SHRINK;
			a->bytes = left;
		} else {
			a->kind = POLICY_RELEASE;
			a->bytes = x->held;
		}
		plan->freed += a->bytes;
		left = a->bytes >= left ? 0 : left - a->bytes;
	}
	if (left > 0) {
		/* Not enough even with everything: take nothing. */
		plan->blocked = k == 0 ? POLICY_NOTHING : POLICY_SHORT;
		plan->n = 0;
		plan->freed = 0;
	}
}
