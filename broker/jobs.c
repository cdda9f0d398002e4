/*
 * jobs.c: leases: device memory lent to a job that is not a Baton engine
 * (`baton run`, `baton lease`, POST /v1/leases). A lease is an entry of
 * the registry (kind EK_LEASE) that asks for memory like an engine does
 * (an acquire, served by the device's queue and the policy), then holds
 * it as its own: the device's books count it as the job's, refills of
 * other engines see it as held, the policy never takes it. It ends when
 * its holder releases it, when the job's process exits (pidfd; `baton
 * run`'s job dies with the CLI), or when its TTL passes unrenewed; then the engines that
 * gave way for it are refilled.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker_int.h"

const char *br_kind_name(const struct eng *e)
{
	return e->kind == EK_LEASE ? "lease" : e->kind == EK_EXTERNAL ? "external" : "engine";
}

/* The device a request names: "" (the only one), an index ("0", as
 * nvidia-smi numbers it) or a uuid. (size_t)-1 with a message. */
static size_t gpu_of(struct broker *b, const char *g, char *err, size_t len)
{
	if (!g || !*g) {
		if (b->n_gpus == 1)
			return 0;
		snprintf(err, len, b->n_gpus ? "the broker knows %zu devices: name one (--gpu)" :
		    "the broker knows no device yet (no engine registered one): name it (--gpu UUID)", b->n_gpus);
		return (size_t)-1;
	}
	bool digits = true;
	for (const char *p = g; *p; p++)
		digits &= isdigit((unsigned char)*p) != 0;
	for (size_t i = 0; i < b->n_gpus; i++)
		if (digits ? b->gpus[i].index == atoi(g) : strcmp(b->gpus[i].uuid, g) == 0)
			return i;
	if (digits) {
		snprintf(err, len, "no device with index %s is known", g);
		return (size_t)-1;
	}
	if (!proto_name_valid(g, strlen(g))) {
		snprintf(err, len, "bad device name '%.64s'", g);
		return (size_t)-1;
	}
	size_t gi = br_gpu_find_or_add(b, g);
	if (gi == (size_t)-1)
		snprintf(err, len, "too many devices");
	return gi;
}

static struct eng *lease_by_name(struct broker *b, const char *name)
{
	struct eng *e = name ? br_eng_by_name(b, name) : NULL;
	return e && e->st == ES_LIVE && e->kind == EK_LEASE ? e : NULL;
}

static struct eng *free_slot(struct broker *b)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->eng[i].st == ES_FREE)
			return &b->eng[i];
	return NULL;
}

/* A new entry in a free slot (a lease or an external engine). */
struct eng *br_entry_new(struct broker *b, const char *name, int kind, size_t gi);
struct eng *br_entry_new(struct broker *b, const char *name, int kind, size_t gi)
{
	struct eng *e = free_slot(b);
	if (!e)
		return NULL;
	uint32_t gen = e->gen + 1;
	br_eng_forget_conn(e);
	memset(e, 0, sizeof *e);
	e->gen = gen ? gen : 1;
	e->st = ES_LIVE;
	e->kind = kind;
	e->gpu = gi;
	snprintf(e->name, sizeof e->name, "%s", name);
	e->registered_at = e->last_seen = e->idle_since = baton_now_s();
	return e;
}

static void reply_lease(struct waiter *w, const struct baton_msg *req, struct broker *b, const struct eng *e)
{
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, req);
	snprintf(rb->s1, sizeof rb->s1, "%s", e->name);
	rb->m.name = rb->s1;
	proto_set(&rb->m, PF_NAME);
	rb->m.gpu = b->gpus[e->gpu].uuid; /* the registry outlives the reply's encoding */
	proto_set(&rb->m, PF_GPU);
	rb->m.granted = e->mapped;
	proto_set(&rb->m, PF_GRANTED);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	rb->m.ms = e->ls.ttl_s * 1e3;
	proto_set(&rb->m, PF_MS);
	snprintf(rb->text, sizeof rb->text, "%s", e->ls.gave_way);
	rb->m.reason = rb->text;
	proto_set(&rb->m, PF_REASON);
}

static void lease_acquire(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	char err[200];
	if (!proto_has(m, PF_BYTES) || m->bytes == 0) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease acquire: how much memory (bytes > 0)?");
		return;
	}
	double ttl = proto_has(m, PF_MS) ? m->ms / 1e3 : 0;
	if (!(ttl >= 0 && ttl <= 30 * 86400.0)) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease acquire: a TTL from 0 (none) to 30 days");
		return;
	}
	int holder = proto_pipe_pid(m->pipe);
	int pid = proto_has(m, PF_PID) ? (int)m->pid : 0;
	if (pid > 0 && !br_pid_alive(pid)) {
		br_reply_error(w, m->op, m->id, BATON_ENOTFOUND, "lease acquire: no process %d", pid);
		return;
	}
	if (pid <= 0 && ttl == 0) {
		/* nothing would ever end it but a release */
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease acquire: give a pid to watch or a TTL");
		return;
	}
	char name[BROKER_NAME_MAX];
	if (proto_has(m, PF_NAME) && *m->name) {
		if (!proto_name_valid(m->name, strlen(m->name))) {
			br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease acquire: bad name '%.64s'", m->name);
			return;
		}
		snprintf(name, sizeof name, "%s", m->name);
	} else {
		snprintf(name, sizeof name, "job-%d", pid > 0 ? pid : holder > 0 ? holder : (int)(b->epoch + 1));
	}
	if (br_eng_by_name(b, name) && br_eng_by_name(b, name)->st == ES_LIVE) {
		br_reply_error(w, m->op, m->id, BATON_EEXIST, "lease acquire: '%s' is taken (an engine or a lease)", name);
		return;
	}
	size_t gi = gpu_of(b, proto_has(m, PF_GPU) ? m->gpu : "", err, sizeof err);
	if (gi == (size_t)-1) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease acquire: %s", err);
		return;
	}
	struct eng *old = br_eng_by_name(b, name);
	if (old) /* a dead entry of that name: the lease takes its place */
		old->st = ES_FREE;
	struct eng *e = br_entry_new(b, name, EK_LEASE, gi);
	if (!e) {
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "lease acquire: the broker holds %d entries already",
		    BROKER_MAX_ENGINES);
		return;
	}
	struct op *o = br_op_new(b, OP_ACQUIRE, w, m);
	if (!o) {
		e->st = ES_FREE;
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "lease acquire: too many operations in progress");
		return;
	}
	snprintf(e->state, sizeof e->state, "waiting");
	snprintf(e->ctl, sizeof e->ctl, "lease");
	snprintf(e->model, sizeof e->model, "%.120s", proto_has(m, PF_REASON) && *m->reason ? m->reason : "(job)");
	snprintf(e->ls.what, sizeof e->ls.what, "%s", proto_has(m, PF_REASON) ? m->reason : "");
	e->pid = pid > 0 ? pid : 0; /* the holder (the socket's peer) may be a CLI that exits at once */
	e->reg_priority = proto_has(m, PF_PRIORITY) ? m->priority : 0;
	e->floor = e->ceiling = e->capacity = m->bytes;
	e->ls.want = m->bytes;
	e->ls.ttl_s = ttl;
	e->ls.holder = holder;
	e->acq_id = 0;
	struct eref ref = br_eref_of(b, e);
	if (e->pid > 0)
		br_watch_add(b, e->pid, ref);
	o->target = ref;
	o->gpu = gi;
	o->bytes = m->bytes;
	o->phase = P_WAIT;
	if (proto_has(m, PF_DURATION_MS) && m->duration_ms >= 0) /* its own wait (hooks may take long) */
		o->deadline = o->t0 + (m->duration_ms < 3600e3 ? m->duration_ms : 3600e3) / 1e3;
	br_blog("lease %s: %.1f MiB of %s asked, priority %d, pid %d%s%s", e->name, (double)m->bytes / BATON_MIB,
	    b->gpus[gi].uuid, e->reg_priority, e->pid, *e->ls.what ? ": " : "", e->ls.what);
	br_publish(b, "lease-ask", e, e->ls.what, -1, m->bytes);
}

void br_lease_granted(struct broker *b, struct eng *e, struct op *o)
{
	double now = baton_now_s();
	uint64_t bytes = e->grant;
	e->grant = 0;
	e->grant_epoch = 0;
	e->mapped = bytes;
	e->resident = bytes;
	e->ls.granted_at = now;
	e->last_seen = now - 1.0; /* measured at the next tick */
	e->ls.expires_at = e->ls.ttl_s > 0 ? now + e->ls.ttl_s : 0;
	snprintf(e->state, sizeof e->state, "leased");
	snprintf(e->ls.gave_way, sizeof e->ls.gave_way, "%s", o->victims);
	br_blog("lease %s: granted %.1f MiB of %s after %.3f ms%s%s", e->name, (double)bytes / BATON_MIB,
	    b->gpus[e->gpu].uuid, (now - o->t0) * 1e3, o->victims[0] ? "; gave way: " : "", o->victims);
	br_publish(b, "lease", e, o->victims[0] ? o->victims : "no engine had to give way", (now - o->t0) * 1e3, bytes);
	struct baton_msg req = { .op = o->req_op, .id = o->req_id };
	reply_lease(o->w, &req, b, e);
	br_op_done(o);
}

bool br_lease_room_mib(struct broker *b, const struct eng *e, uint64_t granted, uint64_t *keep_mib)
{
	if (e->kind != EK_ENGINE || e->no_shrink)
		return false; /* not elastic (it refused vram): a plain refill */
	bool lease = false;
	for (size_t i = 0; i < BROKER_MAX_ENGINES && !lease; i++)
		lease = b->eng[i].st == ES_LIVE && b->eng[i].kind == EK_LEASE && b->eng[i].gpu == e->gpu &&
		    b->eng[i].ls.granted_at > 0;
	return lease && br_grow_reserve_mib(b, e, granted, keep_mib);
}

/* A background operation's waiter: nobody reads its replies. One per
 * process is enough (its replies are written by a decision thread and
 * never read). */
static struct waiter bg_waiter = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* Refills engine x (an operator's refill on nobody's behalf): the device's
 * queue grants it what it lacks, then it is commanded. */
void br_refill_behind(struct broker *b, struct eng *x, const char *why);
void br_refill_behind(struct broker *b, struct eng *x, const char *why)
{
	if (!x || x->st != ES_LIVE || x->kind == EK_LEASE || br_want_bytes(x) == 0 || x->lost)
		return;
	for (size_t i = 0; i < MAX_OPS; i++) /* one that waits already (its own acquire, a refill) */
		if (b->ops[i].used && b->ops[i].target.slot == (uint32_t)(x - b->eng) && b->ops[i].target.gen == x->gen)
			return;
	struct baton_msg req = { .op = PROTO_OP_REFILL, .id = 0 };
	struct op *o = br_op_new(b, OP_REFILL, &bg_waiter, &req);
	if (!o)
		return;
	o->target = br_eref_of(b, x);
	o->gpu = x->gpu;
	o->reserve_mib = PROTO_RESERVE_FULL;
	o->bytes = br_want_bytes(x);
	o->phase = P_WAIT;
	br_blog("engine %s: refilled (%s)", x->name, why);
}

void br_lease_end(struct broker *b, struct eng *e, const char *why)
{
	if (e->st != ES_LIVE || e->kind != EK_LEASE)
		return;
	double now = baton_now_s();
	uint64_t freed = e->mapped + e->grant;
	struct eref ref = br_eref_of(b, e);
	bool granted = e->ls.granted_at > 0;
	snprintf(e->state, sizeof e->state, "ended");
	br_blog("lease %s (pid %d) ends: %s; %.1f MiB of %s counted free after %.1f s", e->name, e->pid, why,
	    (double)freed / BATON_MIB, b->gpus[e->gpu].uuid, granted ? now - e->ls.granted_at : 0);
	br_publish(b, "lease-end", e, why, granted ? (now - e->ls.granted_at) * 1e3 : -1, freed);
	e->mapped = e->resident = e->grant = 0;
	br_watch_remove(b, ref);
	b->gpus[e->gpu].death_at = now;
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (o->used && o->target.slot == ref.slot && o->target.gen == ref.gen)
			br_op_fail(b, o, BATON_ECLOSED, "lease %s ended before its memory came: %s", e->name, why);
	}
	e->st = ES_FREE;
	/* the engines that gave way come back: "b (release), c (shrink)" */
	char list[sizeof e->ls.gave_way];
	snprintf(list, sizeof list, "%s", e->ls.gave_way);
	char reason[BROKER_NAME_MAX + 32];
	snprintf(reason, sizeof reason, "after lease %s", e->name);
	for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		char *sp = strchr(tok, ' ');
		if (sp)
			*sp = 0;
		struct eng *x = br_eng_by_name(b, tok);
		br_refill_behind(b, x, reason);
	}
	br_lend_wake(b, e->gpu);
}

static void lease_renew(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = lease_by_name(b, proto_has(m, PF_NAME) ? m->name : NULL);
	if (!e) {
		br_reply_error(w, m->op, m->id, BATON_ENOTFOUND, "lease renew: no lease named '%.64s'",
		    proto_has(m, PF_NAME) ? m->name : "");
		return;
	}
	if (proto_has(m, PF_MS)) {
		double ttl = m->ms / 1e3;
		if (!(ttl >= 0 && ttl <= 30 * 86400.0)) {
			br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease renew: a TTL from 0 (none) to 30 days");
			return;
		}
		if (ttl == 0 && e->pid <= 0) {
			br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease renew: without a TTL nothing would end "
			    "lease %s (no process is watched)", e->name);
			return;
		}
		e->ls.ttl_s = ttl;
	}
	e->last_seen = baton_now_s();
	if (e->ls.granted_at > 0)
		e->ls.expires_at = e->ls.ttl_s > 0 ? e->last_seen + e->ls.ttl_s : 0;
	reply_lease(w, m, b, e);
	br_waiter_done(w);
}

static void lease_release(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = lease_by_name(b, proto_has(m, PF_NAME) ? m->name : NULL);
	if (!e) {
		br_reply_error(w, m->op, m->id, BATON_ENOTFOUND, "lease release: no lease named '%.64s'",
		    proto_has(m, PF_NAME) ? m->name : "");
		return;
	}
	reply_lease(w, m, b, e);
	br_lease_end(b, e, proto_has(m, PF_REASON) && *m->reason ? m->reason : "released by its holder");
	br_waiter_done(w);
}

void br_on_lease(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	const char *a = m->level ? m->level : "";
	if (strcmp(a, "acquire") == 0)
		lease_acquire(b, w, m);
	else if (strcmp(a, "renew") == 0)
		lease_renew(b, w, m);
	else if (strcmp(a, "release") == 0)
		lease_release(b, w, m);
	else
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "lease: '%.32s' is not acquire, renew or release", a);
}

void br_ext_tick(struct broker *b, struct eng *e, double now);
int64_t br_proc_device_bytes(const char *uuid, int pid);

void br_nonengine_tick(struct broker *b, struct eng *e, double now)
{
	if (e->kind == EK_EXTERNAL) {
		br_ext_tick(b, e, now);
		return;
	}
	if (e->ls.granted_at == 0) {
		bool waits = false;
		for (size_t i = 0; i < MAX_OPS && !waits; i++)
			waits = b->ops[i].used && b->ops[i].target.slot == (uint32_t)(e - b->eng) &&
			    b->ops[i].target.gen == e->gen;
		if (!waits) { /* its acquire was denied (or withdrawn): nothing is held */
			e->st = ES_FREE;
			br_watch_remove(b, br_eref_of(b, e));
		}
		return;
	}
	if (e->ls.expires_at > 0 && now >= e->ls.expires_at) {
		char why[96];
		snprintf(why, sizeof why, "its TTL of %g s passed without a renewal", e->ls.ttl_s);
		br_lease_end(b, e, why);
		return;
	}
	if (e->ls.expires_at > 0)
		wake_at(b, e->ls.expires_at);
	/* what the job really holds (NVML, or the host device's books): a job
	 * past its grant is reported, and counted at what it holds, so other
	 * engines refill only into what is really left; it is not stopped */
	if (now - e->last_seen >= 1.0) {
		e->last_seen = now;
		int64_t seen = br_proc_device_bytes(b->gpus[e->gpu].uuid, e->pid);
		if (seen >= 0) {
			e->ls.seen = (uint64_t)seen;
			uint64_t counted = e->ls.seen > e->ls.want ? e->ls.seen : e->ls.want;
			if (counted != e->mapped)
				e->mapped = e->resident = counted;
			if (e->ls.seen > e->ls.want && !e->ls.over) {
				e->ls.over = true;
				char why[160];
				snprintf(why, sizeof why, "holds %.1f MiB, granted %.1f MiB", (double)e->ls.seen / BATON_MIB,
				    (double)e->ls.want / BATON_MIB);
				br_blog("lease %s (pid %d) is past its grant: %s; counted at what it holds", e->name, e->pid, why);
				br_publish(b, "lease-over", e, why, -1, e->ls.seen);
			} else if (e->ls.seen <= e->ls.want) {
				e->ls.over = false;
			}
		}
	}
	/* the pidfd sees exits at once; this is for a pid it could not open */
	if (e->pid > 0 && !br_pid_alive(e->pid))
		br_lease_end(b, e, "its process exited");
}
