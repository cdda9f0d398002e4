/*
 * ops.c: operations in progress (acquire, refill, release, vram, handoff:
 * a waiter to answer and the phases it goes through), the commands they
 * send to engines (each tagged with what it is for), status probes, and
 * what a death ends.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "broker/broker_int.h"

struct op *br_op_new(struct broker *b, enum op_kind kind, struct waiter *w,
    const struct baton_msg *req)
{
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (o->used)
			continue;
		memset(o, 0, sizeof *o);
		o->used = true;
		o->seq = ++b->op_seq;
		o->kind = kind;
		o->w = w;
		o->req_op = req->op;
		o->req_id = req->id;
		o->t0 = baton_now_s();
		o->deadline = o->t0 + b->cfg.acquire_wait_ms / 1e3;
		return o;
	}
	return NULL;
}

void br_op_fail(struct broker *b, struct op *o, int err, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	struct eng *e = br_eng_get(b, o->target);
	if (o->kind == OP_ACQUIRE || o->kind == OP_REFILL || o->kind == OP_HANDOFF)
		br_publish(b, "deny", e, text, (baton_now_s() - o->t0) * 1e3, o->bytes);
	if (o->granted && e && e->st == ES_LIVE) {
		/* Its command failed: the grant goes back now, not after
		 * GRANT_TTL_S; what the engine did map, its status says. */
		e->grant -= o->granted < e->grant ? o->granted : e->grant;
		if (!e->grant)
			e->grant_epoch = 0;
		br_probe(b, e);
	}
	br_reply_error(o->w, o->req_op, o->req_id, err, "%s", text);
	o->used = false;
}

void br_op_done(struct op *o)
{
	br_waiter_done(o->w);
	o->used = false;
}

/* The command's reply fields into the op's reply (release, refill, vram). */
void br_reply_from_cmd(struct op *o, const struct baton_msg *rep)
{
	struct rbuf *rb = &o->w->rb;
	struct baton_msg req = { .op = o->req_op, .id = o->req_id };
	proto_reply_init(&rb->m, &req);
	snprintf(rb->s1, sizeof rb->s1, "%s", rep->state ? rep->state : "");
	rb->m.state = rb->s1;
	rb->m.resident = rep->resident;
	rb->m.ms = rep->ms;
	rb->m.bytes = rep->bytes;
	rb->m.epoch = rep->epoch;
	if (proto_has(rep, PF_MAPPED)) {
		rb->m.mapped = rep->mapped;
		proto_set(&rb->m, PF_MAPPED);
	}
	if (proto_has(rep, PF_FREE)) {
		rb->m.free_bytes = rep->free_bytes;
		proto_set(&rb->m, PF_FREE);
	}
}

/* What the target engine wants to be whole again. */
uint64_t br_want_bytes(const struct eng *e)
{
	return e->ceiling > e->mapped ? e->ceiling - e->mapped : 0;
}

/* The engine is gone: its memory counts free at once. */
void br_eng_dead(struct broker *b, struct eng *e, const char *why, bool clean)
{
	if (e->st != ES_LIVE)
		return;
	if (e->kind == EK_LEASE) { /* its job (or holder) is gone: the lease ends */
		br_lease_end(b, e, why);
		return;
	}
	if (e->kind == EK_EXTERNAL) { /* kept: its process may come back (pid file, unit) */
		br_ext_gone(b, e, why);
		return;
	}
	uint64_t freed = e->mapped + e->grant;
	uint64_t loan = e->has_peer ? e->peer_mapped + e->peer_grant : 0;
	struct eref ref = br_eref_of(b, e);
	e->st = ES_DEAD;
	b->gpus[e->gpu].death_at = baton_now_s();
	snprintf(e->state, sizeof e->state, "%s", baton_state_name(clean ? BATON_STATE_STOPPED : BATON_STATE_DEAD));
	e->mapped = e->resident = e->grant = 0;
	e->in_flight = false;
	e->probing = false;
	if (e->busy)
		e->idle_since = baton_now_s(); /* its last request ended with it */
	e->busy = false;
	br_eng_forget_conn(e);
	br_watch_remove(b, ref);
	br_blog("engine %s (pid %d) %s: %s; %.1f MiB of %s counted free", e->name, e->pid,
	    clean ? "stopped" : "is dead", why, (double)freed / BATON_MIB, b->gpus[e->gpu].uuid);
	br_publish(b, clean ? "stopped" : "dead", e, why, -1, freed);
	if (loan) { /* the driver (or the host device) frees a dead process's memory */
		br_blog("engine %s: its peer tier of %.1f MiB on %s is returned", e->name, (double)loan / BATON_MIB,
		    b->gpus[e->peer_gpu].uuid);
		br_publish(b, "loan-returned", e, why, -1, loan);
	}
	e->peer_mapped = e->peer_grant = 0;
	br_lend_wake(b, e->gpu);
	/* Its operations end; ones that wait on it as a victim go on. */
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (!o->used)
			continue;
		if (o->target.slot == ref.slot && o->target.gen == ref.gen)
			br_op_fail(b, o, BATON_ECLOSED, "engine %s went away (%s)", e->name, why);
		else if (o->kind == OP_HANDOFF && o->victim.slot == ref.slot && o->victim.gen == ref.gen &&
		    o->phase == P_VICTIM_WAIT) {
			o->phase = P_WAIT; /* its memory is free now */
			o->t_victim_done = baton_now_s();
		}
	}
	if (clean) {
		e->st = ES_FREE; /* a clean exit leaves no entry behind */
	}
}

/* reserve_mib that makes `e` give back `bytes`: keep the device's free
 * memory plus those bytes free. The engine measures the reserve against the
 * device's real free memory, so this is the real one too (NVML, or the
 * broker's count of the device), not the capped total_mib budget; and not
 * the engine's own last word, which may be old: others have mapped or
 * unmapped since. Rounded up: a shrink frees whole segments anyway. */
uint64_t br_shrink_reserve_mib(struct broker *b, const struct eng *e, uint64_t bytes)
{
	struct gpu_view v;
	br_gpu_view(b, e->gpu, &v);
	return (v.dev_free + bytes + BATON_MIB - 1) / BATON_MIB;
}

/* reserve_mib that makes `e` grow by `granted` alone: keep the device's
 * free memory less the grant. The free memory as e will measure it:
 * NVML's figure; else the larger of e's own last word (heartbeats,
 * replies) and the broker's count of the device with e's grants not yet
 * mapped (br_gpu_view counts them as held). Either may be low: e's word
 * predates a handoff's victim freeing its memory (a grow measured against
 * it took the victim's memory too), the count holds a lease whose job has
 * not taken its memory yet. Too high a figure only makes e grow by less.
 * Rounded up: never past the grant. False when the device's free memory is
 * not known. */
bool br_grow_reserve_mib(struct broker *b, const struct eng *e, uint64_t granted, uint64_t *keep_mib)
{
	uint64_t fr = 0, tot = 0;
	struct gpu *g = &b->gpus[e->gpu];
	if (!(g->nvml && broker_nvml_mem(g->uuid, &fr, &tot) == 0)) {
		struct gpu_view v;
		br_gpu_view(b, e->gpu, &v);
		fr = e->dev_free;
		if (v.dev_free && v.dev_free + e->grant > fr)
			fr = v.dev_free + e->grant;
	}
	if (fr == 0)
		return false;
	uint64_t keep = fr > granted ? fr - granted : 0;
	*keep_mib = (keep + BATON_MIB - 1) / BATON_MIB;
	return true;
}

static struct jobtag *tag_new(struct broker *b)
{
	for (size_t i = 0; i < MAX_TAGS; i++)
		if (b->tags[i].job == 0)
			return &b->tags[i];
	return NULL;
}

struct jobtag *br_tag_find(struct broker *b, uint64_t job)
{
	for (size_t i = 0; i < MAX_TAGS; i++)
		if (b->tags[i].job == job)
			return &b->tags[i];
	return NULL;
}

/* Starts a command; 0 on success. */
int br_command(struct broker *b, struct eng *e, enum proto_op cmd, uint64_t reserve_mib,
    const struct op *o, int victim, uint64_t bytes, const char *reason)
{
	struct jobtag *t = tag_new(b);
	if (!t)
		return BATON_ENOMEM;
	uint64_t id;
	int rc = e->kind == EK_EXTERNAL ? br_ext_queue(b, e, cmd, &id) :
	    e->kind == EK_LEASE ? BATON_EUNSUPPORTED : br_queue_job(b, e, cmd, reserve_mib, &id);
	if (rc)
		return rc;
	t->job = id;
	t->op_seq = o ? o->seq : 0;
	t->cmd = cmd;
	t->eng = br_eref_of(b, e);
	t->victim = victim;
	t->bytes = bytes;
	t->mapped0 = e->mapped;
	t->probed = 0;
	snprintf(t->reason, sizeof t->reason, "%s", reason);
	return 0;
}

/* Asks the engine for its status (STATUS, answered from its snapshot even
 * while it works), beside a command that went unanswered or after one that
 * failed without a reply: on_probe applies what it says. */
void br_probe(struct broker *b, struct eng *e)
{
	if (e->probing || !e->conn)
		return;
	struct jobtag *t = tag_new(b);
	uint64_t id;
	if (!t || br_queue_job(b, e, PROTO_OP_STATUS, 0, &id))
		return;
	memset(t, 0, sizeof *t);
	t->job = id;
	t->cmd = PROTO_OP_STATUS;
	t->eng = br_eref_of(b, e);
	t->probed = e->in_flight ? e->job_id : 0;
}

struct op *br_op_by_seq(struct broker *b, uint64_t seq)
{
	if (!seq)
		return NULL;
	for (size_t i = 0; i < MAX_OPS; i++)
		if (b->ops[i].used && b->ops[i].seq == seq)
			return &b->ops[i];
	return NULL;
}

const char *br_busy_what(struct broker *b, const struct eng *e, char *buf, size_t len)
{
	const struct jobtag *t = e->in_flight ? br_tag_find(b, e->job_id) : NULL;
	const char *doing = t ? (t->cmd == PROTO_OP_REFILL ? "refilling" : t->cmd == PROTO_OP_RELEASE ?
	    "releasing" : t->cmd == PROTO_OP_VRAM ? "resizing" : NULL) : NULL;
	int st = baton_state_parse(e->state);
	if (!doing && (st == BATON_STATE_REFILLING || e->to_copy))
		doing = "refilling";
	if (!doing && (st == BATON_STATE_RELEASING || st == BATON_STATE_RESIZING))
		doing = e->state;
	if (!doing)
		snprintf(buf, len, "is busy serving requests");
	else if (e->to_copy)
		snprintf(buf, len, "is %s: %.0f%% of %.1f MiB copied", doing,
		    100.0 * (double)e->copied / (double)e->to_copy, (double)e->to_copy / BATON_MIB);
	else
		snprintf(buf, len, "is %s", doing);
	return buf;
}
