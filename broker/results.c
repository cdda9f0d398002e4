/*
 * results.c: what the engines answer to commands: applied to the books,
 * published, and moved on to the operation the command was for (done,
 * again, or failed). A probe's answer may find a command lost.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "broker/broker_int.h"

static void on_probe(struct broker *b, struct item *it, const struct jobtag *tag);

/* The engine is in the middle of a change (its STATUS says so). */
static bool state_moving(const char *state)
{
	return baton_state_moving(baton_state_parse(state));
}

void br_on_done(struct broker *b, struct item *it)
{
	struct jobtag *t = br_tag_find(b, it->job_id);
	if (!t) {
		/* a late reply to a command a probe already ended as lost
		 * (on_probe): nothing waits for it, but it owns its decoding */
		proto_msg_free(&it->rep);
		return;
	}
	struct jobtag tag = *t;
	t->job = 0;
	if (tag.cmd == PROTO_OP_STATUS) {
		on_probe(b, it, &tag);
		proto_msg_free(&it->rep);
		return;
	}
	struct eng *e = br_eng_live(b, tag.eng);
	struct op *o = br_op_by_seq(b, tag.op_seq);
	double now = baton_now_s();
	if (e && e->job_id == it->job_id) {
		e->in_flight = false;
		e->copied = e->to_copy = 0; /* its copy, if any, is over */
	}
	bool ext_parked = e && e->kind == EK_EXTERNAL && strcmp(e->state, "parked") == 0;
	if (e && e->kind == EK_EXTERNAL)
		br_ext_result(b, e, &tag, it); /* external.c: what only an external engine has */
	int rc = it->rc;
	const char *word = tag.cmd == PROTO_OP_VRAM ? (tag.bytes ? "shrink" : "vram") :
	    tag.cmd == PROTO_OP_PEER ? (tag.victim ? "revoke" : "lend") : proto_op_name(tag.cmd);
	if (e && tag.cmd == PROTO_OP_PEER)
		e->peer_grant = 0;
	/* events say how much device memory moved (br_moved), never bytes copied */
	uint64_t mapped_before = e ? tag.mapped0 : 0, peer_before = e ? e->peer_mapped : 0;
	if (e && rc == 0) {
		const struct baton_msg *r = &it->rep;
		br_apply_state(b, e, r, true, r->epoch);
		if (tag.cmd == PROTO_OP_VRAM && tag.bytes && e->mapped >= mapped_before) {
			/* A shrink that freed nothing (the engine sees more free
			 * memory than we do): release it next time, never loop. */
			e->no_shrink = true;
			br_blog("engine %s: a shrink freed nothing; it is released instead from now on", e->name);
		}
		if (!proto_has(r, PF_MAPPED) && tag.cmd == PROTO_OP_RELEASE)
			e->mapped = 0;
		e->retry_after = 0;
		if (tag.cmd == PROTO_OP_REFILL && r->ms > 0 && r->bytes > 0)
			e->last_refill_gbps = (double)r->bytes / (r->ms / 1e3) / 1e9;
		if (tag.cmd == PROTO_OP_PEER) {
			/* what it took may be less than lent (whole segments, the
			 * device's real free memory): wait before asking again */
			e->peer_retry_after = now + (!tag.victim && e->peer_mapped < tag.bytes ? LEND_BACKOFF_S :
			    LEND_PAUSE_S);
			br_blog("engine %s: %s on %s: holds %.1f MiB there (%s)", e->name, word,
			    b->gpus[e->peer_gpu].uuid, (double)e->peer_mapped / BATON_MIB, tag.reason);
			br_publish(b, word, e, tag.reason, r->ms, br_moved(peer_before, e->peer_mapped));
		} else {
			br_log_move(e->name, word, tag.reason, r->ms, r->bytes, e->mapped);
			br_publish(b, word, e, tag.reason, r->ms, br_moved(mapped_before, e->mapped));
		}
	} else if (e) {
		e->retry_after = now + (rc == BATON_EBUSY ? BUSY_RETRY_S : ERROR_RETRY_S);
		if (rc == BATON_EBUSY) {
			e->busy = true;
		} else if (rc == BATON_EUNSUPPORTED && tag.cmd == PROTO_OP_VRAM) {
			e->no_shrink = true; /* not elastic: release it instead */
			e->retry_after = 0;
		} else if (tag.cmd == PROTO_OP_PEER && !tag.victim) {
			/* a lend it could not take: no harm, try later (never again
			 * when it has no peer tier after all) */
			e->retry_after = 0;
			e->peer_retry_after = now + LEND_BACKOFF_S;
			if (rc == BATON_EUNSUPPORTED)
				e->no_peer = true;
			br_blog("engine %s: lend failed: %s", e->name, it->err[0] ? it->err : baton_strerror(rc));
		} else if (rc == BATON_EUNSUPPORTED) {
			e->no_release = true;
			br_blog("engine %s refuses %s (%s); it is never asked again", e->name, word, it->err);
		} else if (rc == BATON_ESTALE) {
			/* it saw a newer epoch than ours (another broker?): jump past */
			uint64_t mx = b->epoch;
			for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
				if (b->eng[i].st == ES_LIVE && b->eng[i].acct_epoch > mx)
					mx = b->eng[i].acct_epoch;
			b->epoch = mx + 1000;
			e->retry_after = 0;
			br_blog("engine %s: %s: %s; epoch moved to %" PRIu64, e->name, word, it->err, b->epoch);
		} else if (it->lost) {
			e->retry_after = 0; /* it is settled: a command may go at once */
			br_blog("engine %s: %s: %s", e->name, word, it->err);
		} else {
			br_blog("engine %s: %s failed: %s", e->name, word, it->err[0] ? it->err : baton_strerror(rc));
			if (!br_pid_alive(e->pid))
				br_eng_dead(b, e, "its process is gone", false);
			else if (!it->rep.reply)
				br_probe(b, e); /* no word from it: learn what it did */
		}
	}
	if (e && e->kind == EK_EXTERNAL && e->st == ES_LIVE)
		br_ext_after(b, e, ext_parked);
	if (o && !o->used)
		o = NULL; /* eng_dead above ended it (and answered its waiter) */
	/* Lost (a probe says), or not sent at all (no reply, at once): the
	 * command again. A timeout the probes did not explain is not: the
	 * engine stayed at work or silent for the whole command timeout. */
	bool again = it->lost || (rc && !it->rep.reply && rc != BATON_ETIMEDOUT);
	if (o) {
		if (tag.victim) {
			if (o->phase == P_VICTIM_WAIT) {
				if (rc == 0) {
					o->t_victim_done = now;
					o->phase = P_WAIT;
				} else if (rc == BATON_EBUSY || rc == BATON_ESTALE ||
				    (again && ++o->resends <= LOST_RESENDS) ||
				    (rc == BATON_EUNSUPPORTED && tag.cmd == PROTO_OP_VRAM)) {
					if (rc == BATON_EUNSUPPORTED)
						o->victim_kind = POLICY_RELEASE;
					o->phase = P_VICTIM;
				} else {
					br_op_fail(b, o, rc, "handoff: %s of the `from` engine failed: %s", word,
					    it->err[0] ? it->err : baton_strerror(rc));
				}
			} else if (o->outstanding > 0) {
				o->outstanding--;
				if (rc == 0) {
					o->reclaimed = true;
					o->t_reclaimed = now;
				}
			}
		} else if (o->phase == P_CMD_WAIT) {
			if (rc == 0) {
				if (o->kind == OP_HANDOFF) {
					struct rbuf *rb = &o->w->rb;
					struct baton_msg req = { .op = o->req_op, .id = o->req_id };
					proto_reply_init(&rb->m, &req);
					rb->m.decide_ms = (o->t_decided - o->t0) * 1e3;
					rb->m.release_ms = (o->t_victim_done - o->t_decided) * 1e3;
					rb->m.refill_ms = (now - o->t_cmd0) * 1e3;
					rb->m.total_ms = (now - o->t0) * 1e3;
					proto_set(&rb->m, PF_DECIDE_MS);
					struct eng *from = br_eng_get(b, o->victim);
					char why[300], rate[48];
					snprintf(why, sizeof why, "from %s (%s): decide %.3f ms, release %.3f ms, refill %.3f ms",
					    from ? from->name : "?", o->victim_kind == POLICY_SHRINK ? "shrink" :
					    o->victim_bytes ? "release" : "nothing taken",
					    rb->m.decide_ms, rb->m.release_ms, rb->m.refill_ms);
					br_blog("handoff %s -> %s (%s): decide %.3f ms, release %.3f ms, refill %.3f ms, total %.3f ms, "
					    "%.1f MiB copied%s", from ? from->name : "?", e ? e->name : "?",
					    o->victim_kind == POLICY_SHRINK ? "shrink" : "release", rb->m.decide_ms,
					    rb->m.release_ms, rb->m.refill_ms, rb->m.total_ms, (double)it->rep.bytes / BATON_MIB,
					    br_rate(it->rep.bytes, it->rep.ms, rate, sizeof rate));
					if (e)
						br_publish_handoff(b, e, why, rb->m.total_ms, br_moved(mapped_before, e->mapped),
						    rb->m.decide_ms, rb->m.release_ms, rb->m.refill_ms);
				} else {
					br_reply_from_cmd(o, &it->rep);
					if (e && e->ho_pending && o->kind == OP_REFILL) {
						char why[400];
						snprintf(why, sizeof why,
						    "from %s: decide %.3f ms, release %.3f ms, refill %.3f ms", e->ho_from,
						    e->ho_decide_ms, e->ho_release_ms, it->rep.ms);
						char rate[48];
						br_blog("handoff to %s %s, total %.3f ms, %.1f MiB copied%s", e->name, why,
						    (now - o->t0) * 1e3, (double)it->rep.bytes / BATON_MIB,
						    br_rate(it->rep.bytes, it->rep.ms, rate, sizeof rate));
						br_publish_handoff(b, e, why, (now - o->t0) * 1e3,
						    br_moved(mapped_before, e->mapped), e->ho_decide_ms, e->ho_release_ms,
						    it->rep.ms);
						e->ho_pending = false;
					}
				}
				br_op_done(o);
			} else if (rc == BATON_EBUSY || rc == BATON_ESTALE) {
				o->phase = P_CMD; /* again, until the deadline */
				if (now >= o->deadline && o->kind != OP_REFILL && o->kind != OP_HANDOFF) {
					char what[160] = "was busy";
					if (e)
						br_busy_what(b, e, what, sizeof what);
					br_op_fail(b, o, BATON_EBUSY, "%s: %s %s for %d ms", word,
					    e ? e->name : "the engine", what, b->cfg.acquire_wait_ms);
				}
			} else if (rc == BATON_EUNSUPPORTED && tag.cmd == PROTO_OP_VRAM &&
			    (o->kind == OP_REFILL || o->kind == OP_HANDOFF)) {
				/* not elastic (no_shrink now): a plain refill (jobs.c,
				 * schedule.c's partial grant), which makes it whole */
				o->phase = P_CMD;
			} else if (again && ++o->resends <= LOST_RESENDS) {
				o->phase = P_CMD; /* it is settled: the command again (idempotent) */
			} else {
				br_op_fail(b, o, rc, "%s failed: %s", word, it->err[0] ? it->err : baton_strerror(rc));
			}
		}
	}
	proto_msg_free(&it->rep);
}

/* A probe's answer (see br_probe()). Applied when the engine is settled, not
 * in the middle of a change: then its figures are what it holds. When the
 * command it asked about is still unanswered, that command is over for the
 * engine (it ran and its reply was lost, or it never arrived), so no reply
 * will come: it ends here as lost, and its operation sends it again
 * (commands are idempotent; a late copy of the old one is fenced by its
 * older epoch). The worker that waits for the old reply gives up at its
 * timeout; its result then finds no tag. */
static void on_probe(struct broker *b, struct item *it, const struct jobtag *tag)
{
	struct eng *e = br_eng_live(b, tag->eng);
	if (!e)
		return;
	e->probing = false;
	const struct baton_msg *r = &it->rep;
	if (it->rc || !r->state || state_moving(r->state) || !proto_has(r, PF_EPOCH))
		return; /* no answer, or at work still: the command may yet answer */
	br_apply_state(b, e, r, true, r->epoch);
	if (!tag->probed || !e->in_flight || e->job_id != tag->probed)
		return;
	struct item lost = { .kind = IT_DONE, .job_id = tag->probed, .rc = BATON_ETIMEDOUT, .lost = true };
	snprintf(lost.err, sizeof lost.err, "no reply after %.1f s, and the engine is %s at epoch %" PRIu64
	    ": the reply or the command was lost", baton_now_s() - e->job_t0, r->state, r->epoch);
	br_on_done(b, &lost);
}
