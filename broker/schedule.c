/*
 * schedule.c: serving each device's queue of operations (grant, reclaim by
 * the policy, deny at the deadline), sending commands whose turn has come,
 * and the timers (heartbeat timeouts, probes, stale grants, idle release).
 */
#include <stdio.h>
#include <string.h>

#include "broker/broker_int.h"

/* A refill granted less than the engine lacks (a capped device): the
 * engine is told to grow by the grant alone (leave the device's free
 * memory less the grant), since a plain refill makes it whole. */
static bool partial_room_mib(struct broker *b, const struct eng *e, const struct op *o, uint64_t *keep_mib)
{
	if (e->kind != EK_ENGINE || e->no_shrink || (o->kind != OP_REFILL && o->kind != OP_HANDOFF) ||
	    o->granted >= br_want_bytes(e))
		return false;
	return br_grow_reserve_mib(b, e, o->granted, keep_mib);
}

void br_run_commands(struct broker *b, struct op *o, double now)
{
	if (o->phase == P_VICTIM) {
		struct eng *v = br_eng_live(b, o->victim);
		if (!v || (v->mapped == 0 && v->grant == 0)) {
			o->t_victim_done = now;
			o->phase = P_WAIT;
			return;
		}
		if (now >= o->deadline) {
			char what[160];
			br_op_fail(b, o, BATON_EBUSY, "handoff: %s %s (waited %d ms); nothing was changed", v->name,
			    br_busy_what(b, v, what, sizeof what), b->cfg.acquire_wait_ms);
			return;
		}
		if (v->in_flight || now < v->retry_after) {
			wake_at(b, v->retry_after);
			return;
		}
		struct eng *to = br_eng_get(b, o->target);
		char why[200];
		snprintf(why, sizeof why, "handoff to %s", to ? to->name : "?");
		int rc = o->victim_kind == POLICY_SHRINK ?
		    br_command(b, v, PROTO_OP_VRAM, br_shrink_reserve_mib(b, v, o->victim_bytes), o, 1, o->victim_bytes, why) :
		    br_command(b, v, PROTO_OP_RELEASE, 0, o, 1, 0, why);
		if (rc)
			br_op_fail(b, o, rc, "handoff: cannot command %s", v->name);
		else
			o->phase = P_VICTIM_WAIT;
		return;
	}
	if (o->phase != P_CMD)
		return;
	struct eng *e = br_eng_live(b, o->target);
	if (!e) {
		br_op_fail(b, o, BATON_ENOTFOUND, "the engine went away");
		return;
	}
	if (e->in_flight || now < e->retry_after) {
		wake_at(b, e->retry_after);
		if ((o->kind == OP_RELEASE || o->kind == OP_VRAM) && now >= o->deadline) {
			char what[160];
			br_op_fail(b, o, BATON_EBUSY, "%s: %s %s (waited %d ms)", proto_op_name(o->req_op), e->name,
			    br_busy_what(b, e, what, sizeof what), b->cfg.acquire_wait_ms);
		}
		return;
	}
	int rc;
	uint64_t lease_keep = 0;
	const char *reason = o->kind == OP_HANDOFF ? "handoff" : o->reason[0] ? o->reason : "operator";
	if (o->kind == OP_RELEASE)
		rc = br_command(b, e, PROTO_OP_RELEASE, 0, o, 0, 0, reason);
	else if (o->kind == OP_VRAM)
		rc = br_command(b, e, PROTO_OP_VRAM, o->reserve_mib, o, 0, 0, reason);
	else if (br_lease_room_mib(b, e, o->granted, &lease_keep) || partial_room_mib(b, e, o, &lease_keep))
		/* a lease on the device whose job may not have taken its memory
		 * yet, or a grant of less than the engine lacks (a cap): the
		 * engine grows by its grant only (a plain refill makes it
		 * whole). A released one has nothing mapped that a VRAM reserve
		 * could grow (it would only remember it): it is told to refill
		 * to that reserve instead. */
		rc = br_command(b, e, e->mapped == 0 ? PROTO_OP_REFILL : PROTO_OP_VRAM, lease_keep, o, 0, 0, reason);
	else
		rc = br_command(b, e, PROTO_OP_REFILL, 0, o, 0, 0, reason);
	if (rc) {
		br_op_fail(b, o, rc, "cannot command %s", e->name);
		return;
	}
	if (o->t_cmd0 == 0)
		o->t_cmd0 = now;
	o->phase = P_CMD_WAIT;
}

static void grant(struct broker *b, struct op *o, struct eng *e, uint64_t bytes, double now)
{
	e->grant += bytes;
	e->grant_epoch = ++b->epoch;
	e->grant_at = now;
	o->t_granted = now;
	if (o->kind != OP_ACQUIRE)
		o->granted = bytes;
	char why[200];
	snprintf(why, sizeof why, "%s%s, waited %.3f ms", o->kind == OP_ACQUIRE ? "acquire" :
	    o->kind == OP_HANDOFF ? "handoff" : "refill", o->reclaimed ? " after a reclaim" : "",
	    (now - o->t0) * 1e3);
	br_publish(b, "grant", e, why, (now - o->t0) * 1e3, bytes);
	if (o->reclaimed && o->kind != OP_HANDOFF) {
		e->ho_pending = true;
		e->ho_epoch = e->grant_epoch;
		e->ho_t0 = o->t0;
		e->ho_decide_ms = (o->t_decided - o->t0) * 1e3;
		e->ho_release_ms = (o->t_reclaimed - o->t_decided) * 1e3;
		snprintf(e->ho_from, sizeof e->ho_from, "%s", o->victims);
	}
	if (e->kind == EK_LEASE) { /* held as the job's from now on (jobs.c) */
		br_lease_granted(b, e, o);
		return;
	}
	if (o->kind == OP_ACQUIRE) {
		e->acq_id = o->req_id;
		e->acq_granted = bytes;
		e->acq_epoch = e->grant_epoch;
		struct rbuf *rb = &o->w->rb;
		struct baton_msg req = { .op = o->req_op, .id = o->req_id };
		proto_reply_init(&rb->m, &req);
		rb->m.epoch = e->grant_epoch;
		rb->m.granted = bytes;
		br_op_done(o);
	} else {
		o->phase = P_CMD;
		br_run_commands(b, o, now);
	}
}

/* Builds the policy's view of the engines of one device. */
static size_t policy_view(struct broker *b, size_t gi, const struct eng *requester, double now,
    struct policy_engine *pe, size_t *map, size_t *req_idx)
{
	size_t n = 0;
	*req_idx = (size_t)-1;
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		struct eng *e = &b->eng[i];
		if (e->st != ES_LIVE || e->gpu != gi)
			continue;
		if (e == requester)
			*req_idx = n;
		pe[n] = (struct policy_engine){
			.name = e->name,
			.held = e->mapped,
			.floor = e->floor,
			.priority = br_eng_priority(b, e),
			.idle_s = e->busy ? 0 : now - e->idle_since,
			.busy = e->busy,
			.pinned = br_eng_pinned(b, e) || e->no_release || e->lost,
			.in_flight = e->in_flight || now < e->retry_after,
			.granted = e->grant > 0,
			.refilling = baton_state_parse(e->state) == BATON_STATE_REFILLING || e->to_copy > 0,
			.no_shrink = e->no_shrink,
		};
		if (requester && requester->kind == EK_LEASE && e != requester &&
		    pe[n].priority > br_eng_priority(b, requester))
			pe[n].pinned = true; /* a job never takes from an engine above it */
		if (now < e->retry_after)
			wake_at(b, e->retry_after);
		map[n++] = i;
	}
	return n;
}

/* Serves the device's queue: the oldest waiting operation first. */
void br_serve_gpu(struct broker *b, size_t gi, double now)
{
	for (;;) {
		struct op *head = NULL;
		for (size_t i = 0; i < MAX_OPS; i++) {
			struct op *o = &b->ops[i];
			if (o->used && o->phase == P_WAIT && o->gpu == gi && (!head || o->seq < head->seq))
				head = o;
		}
		if (!head)
			return;
		struct eng *e = br_eng_live(b, head->target);
		if (!e) {
			br_op_fail(b, head, BATON_ENOTFOUND, "the engine went away");
			continue;
		}
		if (e->kind == EK_ENGINE) {
			/* What it lacks now, not when it asked: another operation
			 * (the front door's refill beside the engine's own acquire
			 * at its start) or a release may have moved it since. A
			 * stale figure over-grants (the engine refills whole) or
			 * takes memory from others for nothing. */
			if (head->kind == OP_REFILL) {
				head->bytes = br_want_bytes(e);
			} else if (head->kind == OP_ACQUIRE && e->mapped > head->mapped0) {
				uint64_t got = e->mapped - head->mapped0;
				head->bytes = head->bytes > got ? head->bytes - got : 0;
				head->mapped0 = e->mapped;
			}
		}
		struct gpu_view v;
		br_gpu_view(b, gi, &v);
		/* Never more than the device could ever give it. */
		struct gpu *g = &b->gpus[gi];
		uint64_t fixed = g->reserve + e->mapped;
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
			const struct eng *x = &b->eng[i];
			if (x->st == ES_LIVE && x->gpu == gi && x != e && (br_eng_pinned(b, x) || x->no_release))
				fixed += x->mapped + x->grant;
		}
		uint64_t cap = v.total > fixed ? v.total - fixed : 0;
		uint64_t dev = g->dev_total > fixed + g->other ? g->dev_total - fixed - g->other : 0;
		if (dev < cap)
			cap = dev;
		if (head->bytes > cap && (cap >= e->floor || e->mapped > 0)) {
			/* A partial grant (maybe of nothing more): the engine
			 * refills what fits and serves with it. When not even one
			 * segment could ever come, the request waits like any
			 * other (a pin may be lifted) and then gets the error. */
			head->bytes = cap;
		}
		if (head->bytes <= v.avail) {
			grant(b, head, e, head->bytes, now);
			continue;
		}
		if (head->outstanding > 0)
			return; /* waiting for acknowledgements */
		if (v.lent > 0 && br_take_loans_back(b, gi, head, head->bytes - v.avail, now))
			return; /* loans first: the device's own engines come first */
		if (now >= head->deadline) {
			br_op_fail(b, head, BATON_EDEVMEM,
			    "%s: no memory for %s on %s after %d ms: wants %.1f MiB, %.1f MiB available "
			    "(%.1f free, %.1f reserved)%s%s",
			    proto_op_name(head->req_op), e->name, g->uuid, b->cfg.acquire_wait_ms,
			    (double)head->bytes / BATON_MIB, (double)v.avail / BATON_MIB, (double)v.free_b / BATON_MIB,
			    (double)g->reserve / BATON_MIB, head->why[0] ? "; " : "", head->why);
			continue;
		}
		struct policy_engine pe[BROKER_MAX_ENGINES];
		size_t map[BROKER_MAX_ENGINES], ri;
		size_t n = policy_view(b, gi, e, now, pe, map, &ri);
		struct policy_plan plan;
		policy_decide(pe, n, ri, head->bytes - v.avail, &plan);
		if (head->t_decided == 0)
			head->t_decided = now;
		if (plan.n == 0) {
			snprintf(head->why, sizeof head->why, "%s%u pinned, %u busy, %u in flight, %u refilling",
			    plan.blocked == POLICY_NOTHING ? "no engine holds memory that may be taken: " :
			    "not enough can be taken: ", plan.skipped_pinned, plan.skipped_busy,
			    plan.skipped_in_flight, plan.skipped_refilling);
			wake_at(b, head->deadline);
			wake_at(b, now + 0.05);
			return;
		}
		for (size_t k = 0; k < plan.n; k++) {
			struct eng *x = &b->eng[map[plan.act[k].engine]];
			char why[200];
			snprintf(why, sizeof why, "for %s", e->name);
			int shrink = plan.act[k].kind == POLICY_SHRINK;
			int rc = shrink ?
			    br_command(b, x, PROTO_OP_VRAM, br_shrink_reserve_mib(b, x, plan.act[k].bytes), head, 1,
			        plan.act[k].bytes, why) :
			    br_command(b, x, PROTO_OP_RELEASE, 0, head, 1, 0, why);
			if (rc == 0) {
				head->outstanding++;
				size_t l = strlen(head->victims);
				snprintf(head->victims + l, sizeof head->victims - l, "%s%s (%s)", l ? ", " : "",
				    x->name, shrink ? "shrink" : "release");
			}
		}
		if (head->outstanding == 0) {
			wake_at(b, now + ERROR_RETRY_S);
			return;
		}
		return;
	}
}

/* A copy in flight whose progress has not moved for the command timeout
 * (nor started within it) fails as timed out; its worker's call is ended
 * by cutting the connection (a fresh one replaces it). One that moves is
 * left alone however long it takes. */
static void stall_check(struct broker *b, struct eng *e, double now)
{
	if (!e->in_flight || !e->job_long)
		return;
	double since = e->progress_at > e->job_t0 ? e->progress_at : e->job_t0;
	double limit = b->cfg.command_timeout_ms / 1e3;
	if (now - since < limit) {
		wake_at(b, since + limit);
		return;
	}
	struct item it = { .kind = IT_DONE, .job_id = e->job_id, .rc = BATON_ETIMEDOUT };
	if (e->to_copy)
		snprintf(it.err, sizeof it.err, "no progress for %.1f s (copied %.1f of %.1f MiB in %.1f s)",
		    now - since, (double)e->copied / BATON_MIB, (double)e->to_copy / BATON_MIB, now - e->job_t0);
	else
		snprintf(it.err, sizeof it.err, "no reply and no progress for %.1f s", now - since);
	struct conn *old = e->conn;
	e->conn = br_conn_open(e->ctl);
	if (old) {
		proto_client_shutdown(old->cli);
		br_conn_put(old);
	}
	br_on_done(b, &it);
}

/* Timers: heartbeat timeouts, idle release, stale grants. */
void br_housekeeping(struct broker *b, double now)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		struct eng *e = &b->eng[i];
		if (e->st != ES_LIVE)
			continue;
		if (e->kind != EK_ENGINE) { /* leases, external engines: their own timers */
			br_nonengine_tick(b, e, now);
			continue;
		}
		if (now - e->last_seen > b->cfg.heartbeat_timeout_ms / 1e3) {
			if (!br_pid_alive(e->pid)) {
				br_eng_dead(b, e, "no heartbeat and its process is gone", false);
				continue;
			}
			if (!e->lost) {
				e->lost = true;
				br_blog("engine %s (pid %d): no heartbeat for %d ms; its memory stays counted",
				    e->name, e->pid, b->cfg.heartbeat_timeout_ms);
				br_publish(b, "lost", e, "no heartbeat", -1, e->mapped);
			}
		}
		stall_check(b, e, now);
		if (e->st != ES_LIVE)
			continue;
		if (e->in_flight && !e->probing && now - e->job_t0 >= PROBE_S && now - e->probe_at >= PROBE_S)
			br_probe(b, e); /* unanswered for long: lost, or a long refill? */
		if (e->grant && now - e->grant_at > GRANT_TTL_S) {
			br_blog("engine %s never used a grant of %.1f MiB; dropped", e->name, (double)e->grant / BATON_MIB);
			e->grant = 0;
		}
		bool ka = false;
		double t = br_eng_idle_timeout(b, e, &ka);
		if (t > 0 && e->mapped > 0 && !e->busy && !e->in_flight && !e->grant && !e->lost &&
		    !e->no_release && !br_eng_pinned(b, e) && now >= e->retry_after && now - e->idle_since >= t) {
			bool wanted = false; /* it waits for memory itself: leave it */
			for (size_t k = 0; k < MAX_OPS; k++)
				if (b->ops[k].used && b->ops[k].target.slot == i && b->ops[k].target.gen == e->gen)
					wanted = true;
			if (!wanted) {
				char why[96];
				if (ka)
					snprintf(why, sizeof why, "keep-alive %g s passed (idle %.1f s)", t, now - e->idle_since);
				else
					snprintf(why, sizeof why, "idle %.1f s", now - e->idle_since);
				if (br_command(b, e, PROTO_OP_RELEASE, 0, NULL, 1, 0, why) == 0)
					br_blog("engine %s: idle for %.1f s, releasing", e->name, now - e->idle_since);
			}
		}
	}
}
