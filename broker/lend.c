/*
 * lend.c: peer tiers: lending a device's free memory to engines of other
 * devices, and taking it back when the device's own engines need it.
 */
#include <stdio.h>
#include <string.h>

#include "broker/broker_int.h"

/* Takes loans on device gi back for `head`, which lacks `short_by` bytes:
 * each borrower drops (part of) its peer tier and acknowledges; the caller
 * waits for that like for a reclaim. Returns true while loans are being
 * (or wait to be) taken back, false when there are none to take. */
bool br_take_loans_back(struct broker *b, size_t gi, struct op *head, uint64_t short_by, double now)
{
	bool waiting = false;
	for (size_t i = 0; i < BROKER_MAX_ENGINES && short_by > 0; i++) {
		struct eng *x = &b->eng[i];
		if (x->st != ES_LIVE || !x->has_peer || x->peer_gpu != gi || x->peer_mapped + x->peer_grant == 0)
			continue;
		waiting = true;
		if (x->in_flight || now < x->retry_after) { /* its lend or another command first */
			wake_at(b, now < x->retry_after ? x->retry_after : now + 0.01);
			continue;
		}
		/* keep what is not needed: whole MiB below what it holds */
		uint64_t keep = x->peer_mapped > short_by ? (x->peer_mapped - short_by) / BATON_MIB : 0;
		char why[200];
		snprintf(why, sizeof why, "for %s", b->eng[head->target.slot].name);
		if (br_command(b, x, PROTO_OP_PEER, keep, head, 1, keep * BATON_MIB, why) == 0) {
			head->outstanding++;
			size_t l = strlen(head->victims);
			snprintf(head->victims + l, sizeof head->victims - l, "%s%s (revoke)", l ? ", " : "",
			    x->name);
			if (head->t_decided == 0)
				head->t_decided = now;
			uint64_t freed = x->peer_mapped - keep * BATON_MIB;
			short_by = freed >= short_by ? 0 : short_by - freed;
		}
	}
	return waiting;
}

static bool gpu_has_waiters(struct broker *b, size_t gi)
{
	for (size_t i = 0; i < MAX_OPS; i++)
		if (b->ops[i].used && b->ops[i].gpu == gi && b->ops[i].phase == P_WAIT)
			return true;
	return false;
}

/* Lends free memory (beyond the device's reserve) to engines whose peer
 * device it is and who could use more there. Never while anything waits
 * for memory on that device, and only to engines that serve from their own
 * device now (a released engine holds no peer tier). */
void br_lend_free_memory(struct broker *b, double now)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		struct eng *e = &b->eng[i];
		if (e->st != ES_LIVE || !e->has_peer || e->no_peer || e->lost || e->in_flight ||
		    now < e->retry_after || e->peer_want <= e->peer_mapped)
			continue;
		if (now < e->peer_retry_after) {
			wake_at(b, e->peer_retry_after);
			continue;
		}
		int st = baton_state_parse(e->state);
		if (st != BATON_STATE_READY && st != BATON_STATE_PARTIAL)
			continue;
		size_t pg = e->peer_gpu;
		if (b->gpus[pg].no_lend || gpu_has_waiters(b, pg))
			continue;
		struct gpu_view v;
		br_gpu_view(b, pg, &v);
		uint64_t more = e->peer_want - e->peer_mapped;
		if (more > v.avail)
			more = v.avail;
		uint64_t target_mib = (e->peer_mapped + more) / BATON_MIB;
		/* its floor is one segment: less than that more would map nothing */
		if (target_mib * BATON_MIB <= e->peer_mapped || target_mib * BATON_MIB < e->peer_mapped + e->floor)
			continue;
		char why[200];
		snprintf(why, sizeof why, "%.1f MiB of %s free beyond its reserve", (double)v.avail / BATON_MIB,
		    b->gpus[pg].uuid);
		if (br_command(b, e, PROTO_OP_PEER, target_mib, NULL, 0, target_mib * BATON_MIB, why) == 0)
			e->peer_grant = target_mib * BATON_MIB - e->peer_mapped;
	}
}
