/*
 * policy.c: which engines of one device the front door sends
 * requests to now, and when it switches the device to another model
 * (see door_int.h). A pure function of its inputs, so the rule is tested
 * from a table (door_policy_test.c).
 *
 * Why batch: a switch costs a refill (the model's experts copied back
 * into device memory) plus a drain of the model switched out. Serving
 * first come first served when two models alternate pays that on every
 * request (the thrashing llama-swap-like proxies are known for); serving
 * the model that holds the device while it has work, up to a quantum,
 * pays it once per batch, and the quantum bounds how long the other
 * model's requests wait.
 */
#include "broker/door/door_int.h"

static bool wants(const struct door_pe *e)
{
	return e->queued > 0;
}

void door_policy(const struct door_pe *e, size_t n, const struct door_pdev *d, bool *flow, int *switch_to)
{
	*switch_to = -1;
	int holder = d->holder >= 0 && (size_t)d->holder < n ? d->holder : -1;
	for (size_t i = 0; i < n; i++)
		flow[i] = false;
	/* A switch under way: the model switched out takes no new requests
	 * (its in-flight ones finish), the one switched in waits for its
	 * refill; others that hold their memory go on. */
	if (d->switching) {
		for (size_t i = 0; i < n; i++)
			flow[i] = e[i].ready && (int)i != d->from && (int)i != d->target;
		return;
	}
	/* Who holds its memory flows; so does one whose refill takes nothing
	 * from anybody (the device has room for it). */
	int waiting = -1;
	for (size_t i = 0; i < n; i++) {
		if (e[i].ready) {
			flow[i] = true;
			continue;
		}
		if (!wants(&e[i]))
			continue;
		if (e[i].fits) {
			*switch_to = (int)i; /* a refill without a victim: not counted as a switch */
			return;
		}
		if (waiting < 0 || e[i].oldest_s > e[waiting].oldest_s)
			waiting = (int)i;
	}
	if (waiting < 0)
		return;
	/* Someone needs the device. The holder keeps it while it has work
	 * and its quantum is not spent; an idle holder gives way at once (its
	 * keep-alive holds only while nobody else needs the memory). */
	if (holder >= 0 && e[holder].ready) {
		bool busy = wants(&e[holder]) || e[holder].inflight > 0;
		if (busy && d->held_s < d->quantum_s)
			return;
	}
	*switch_to = waiting;
}
