/*
 * requests.c: the control requests the broker serves (register,
 * heartbeat, report, status, pin, and the engine operations acquire,
 * refill, release, vram, handoff), from a receiver or a face alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker_int.h"

static void on_register(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	if (!proto_name_valid(m->name, strlen(m->name))) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "register: bad engine name '%s'", m->name);
		return;
	}
	if (!*m->gpu || !*m->ctl) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "register %s: gpu and ctl must not be empty", m->name);
		return;
	}
	int pid = (int)m->pid;
	int pipe_pid = proto_pipe_pid(m->pipe);
	if (pipe_pid > 0 && pipe_pid != pid) {
		br_blog("register %s: says pid %d, the socket says %d; using %d", m->name, pid, pipe_pid, pipe_pid);
		pid = pipe_pid;
	}
	/* The broker sends its commands to the ctl registered: a socket in a
	 * directory another user can write could be theirs by the time it
	 * dials (the engines check their own: engine/serve/serve.c). */
	if (strncmp(m->ctl, "ipc://", 6) == 0) {
		char why[512];
		if (baton_trust_dir_of(m->ctl + 6, "its control socket's directory", why, sizeof why) == BATON_EPERM) {
			br_reply_error(w, m->op, m->id, BATON_EPERM, "register %s: %s", m->name, why);
			return;
		}
	}
	struct eng *e = br_eng_by_name(b, m->name);
	bool again = false;
	if (e && e->st == ES_LIVE && e->kind != EK_ENGINE) {
		br_reply_error(w, m->op, m->id, BATON_EEXIST, "register: '%s' is the name of a %s", m->name,
		    br_kind_name(e));
		return;
	}
	if (e && e->st == ES_LIVE) {
		if (e->pid != pid) {
			if (br_pid_alive(e->pid)) {
				br_reply_error(w, m->op, m->id, BATON_EEXIST,
				    "register: an engine named '%s' is already registered (pid %d)", m->name, e->pid);
				return;
			}
			br_eng_dead(b, e, "replaced by a new process of the same name", false);
		} else {
			again = true;
		}
	}
	if (!e) {
		for (size_t i = 0; i < BROKER_MAX_ENGINES && !e; i++)
			if (b->eng[i].st == ES_FREE)
				e = &b->eng[i];
		if (!e) {
			br_reply_error(w, m->op, m->id, BATON_ENOMEM, "register: the broker holds %d engines already",
			    BROKER_MAX_ENGINES);
			return;
		}
	}
	size_t gi = br_gpu_find_or_add(b, m->gpu);
	if (gi == (size_t)-1) {
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "register: too many devices");
		return;
	}
	if (b->gpus[gi].index < 0) /* not known to NVML: the engine's own index */
		b->gpus[gi].index = (int)m->device;
	if (!again) {
		uint32_t gen = e->gen + 1;
		br_eng_forget_conn(e);
		memset(e, 0, sizeof *e);
		e->gen = gen ? gen : 1;
		e->registered_at = baton_now_s();
	}
	e->st = ES_LIVE;
	snprintf(e->name, sizeof e->name, "%s", m->name);
	snprintf(e->model, sizeof e->model, "%s", m->model);
	/* The front door forwards to this URL: only plain http:// is spoken. */
	const char *http = proto_has(m, PF_HTTP) ? m->http : "";
	if (*http && strncmp(http, "http://", 7) != 0) {
		br_blog("register %s: http '%.64s' is not an http:// URL; the front door will not route to it",
		    m->name, http);
		http = "";
	}
	snprintf(e->http, sizeof e->http, "%s", http);
	/* The token only the front door sends: it goes in no status, event
	 * or log (broker_engine_http_token). */
	{
		size_t slot = (size_t)(e - b->eng);
		pthread_mutex_lock(&b->tmu);
		/* a slot freed and this name registered in another: one entry a name */
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
			if (i != slot && strcmp(b->http_tokens[i].name, m->name) == 0)
				memset(&b->http_tokens[i], 0, sizeof b->http_tokens[i]);
		snprintf(b->http_tokens[slot].name, sizeof b->http_tokens[slot].name, "%s", m->name);
		snprintf(b->http_tokens[slot].token, sizeof b->http_tokens[slot].token, "%s",
		    *http && proto_has(m, PF_HTTP_TOKEN) ? m->http_token : "");
		pthread_mutex_unlock(&b->tmu);
	}
	if (strcmp(e->ctl, m->ctl) != 0 || !e->conn) {
		br_eng_forget_conn(e);
		snprintf(e->ctl, sizeof e->ctl, "%s", m->ctl);
		e->conn = br_conn_open(m->ctl);
		if (!e->conn)
			br_blog("register %s: cannot open a client for %s", m->name, m->ctl);
	}
	e->pid = pid;
	e->pipe = m->pipe;
	e->gpu = gi;
	e->floor = m->floor;
	e->ceiling = m->ceiling;
	e->capacity = m->capacity;
	e->reg_priority = m->priority;
	e->last_seen = baton_now_s();
	e->lost = false;
	struct gpu *g = &b->gpus[gi];
	if (!g->nvml && m->capacity > g->dev_total)
		g->dev_total = m->capacity;
	if (m->epoch > b->epoch)
		b->epoch = m->epoch; /* epochs only grow, across broker restarts too */
	e->has_peer = false;
	if (proto_has(m, PF_PEER_GPU) && *m->peer_gpu) {
		size_t pg = br_gpu_find_or_add(b, m->peer_gpu);
		if (pg == (size_t)-1 || pg == gi) {
			br_blog("register %s: peer device %s %s; no peer tier for it", m->name, m->peer_gpu,
			    pg == gi ? "is its own device" : "is one device too many");
		} else {
			e->has_peer = true;
			e->peer_gpu = pg;
			e->peer_want = proto_has(m, PF_PEER_WANT) ? m->peer_want : 0;
		}
	}
	e->acct_epoch = 0;
	br_apply_state(b, e, m, true, m->epoch);
	if (!again) {
		e->idle_since = baton_now_s();
		br_watch_add(b, pid, br_eref_of(b, e));
	}
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.epoch = ++b->epoch;
	br_blog("engine %s %s: pid %d, %s, model %s, %s, holds %.1f of %.1f MiB, priority %d%s",
	    e->name, again ? "registered again" : "registered", pid, g->uuid, e->model, e->state,
	    (double)e->mapped / BATON_MIB, (double)e->ceiling / BATON_MIB, br_eng_priority(b, e),
	    br_eng_pinned(b, e) ? ", pinned" : "");
	br_publish(b, again ? "reconnect" : "register", e, m->model, -1, e->mapped);
	br_waiter_done(w);
}

static struct eng *need_engine(struct broker *b, struct waiter *w, const struct baton_msg *m,
    const char *name)
{
	struct eng *e = name ? br_eng_by_name(b, name) : NULL;
	if (!e || e->st != ES_LIVE) {
		br_reply_error(w, m->op, m->id, BATON_ENOTFOUND, "%s: no engine named '%s' is registered%s",
		    proto_op_name(m->op), name ? name : "", e ? " (it is dead)" : "");
		return NULL;
	}
	return e;
}

static void on_heartbeat(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = need_engine(b, w, m, m->name);
	if (!e)
		return;
	double now = baton_now_s();
	if (e->lost) {
		br_blog("engine %s answers again", e->name);
		e->lost = false;
	}
	e->last_seen = now;
	e->busy = m->busy;
	e->idle_since = now - (double)m->idle_ms / 1e3;
	e->requests = proto_u64_or(m, PF_REQUESTS, e->requests);
	if (proto_has(m, PF_PREFIX_PROMPT)) {
		e->prefix_prompt = m->prefix_prompt;
		e->prefix_cached = proto_u64_or(m, PF_PREFIX_CACHED, 0);
		e->prefix_evictions = proto_u64_or(m, PF_PREFIX_EVICTIONS, 0);
		e->kv_host_bytes = proto_u64_or(m, PF_KV_HOST_BYTES, 0);
	}
	if (proto_has(m, PF_KV_TOTAL)) {
		e->kv_total = m->kv_total;
		e->kv_used = proto_u64_or(m, PF_KV_USED, 0);
	}
	/* an Ollama request's keep_alive, sent until the engine ends */
	e->has_req_keep_alive = proto_has(m, PF_KEEP_ALIVE_S);
	e->req_keep_alive_s = e->has_req_keep_alive ? m->keep_alive_s : 0;
	if (proto_has(m, PF_TO_COPY) && m->to_copy) {
		if (m->copied != e->copied || m->to_copy != e->to_copy) {
			e->copied = m->copied;
			e->to_copy = m->to_copy;
			e->progress_at = now;
			/* at most one event a second (and the last): a long refill
			 * must not push the rest out of the event history */
			if (now - e->progress_pub_at >= 1.0 || e->copied >= e->to_copy) {
				e->progress_pub_at = now;
				br_publish(b, "progress", e, "copy", -1, e->copied);
			}
		}
	} else {
		e->copied = e->to_copy = 0;
	}
	if (m->pipe)
		e->pipe = m->pipe;
	br_apply_state(b, e, m, proto_has(m, PF_EPOCH), m->epoch);
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	br_waiter_done(w);
}

static void on_report(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = need_engine(b, w, m, m->name);
	if (!e)
		return;
	e->last_seen = baton_now_s();
	if (baton_state_parse(m->state) == BATON_STATE_STOPPED) {
		struct rbuf *rb = &w->rb;
		proto_reply_init(&rb->m, m);
		br_waiter_done(w);
		br_eng_dead(b, e, m->reason, true);
		return;
	}
	uint64_t mapped_before = e->mapped;
	br_apply_state(b, e, m, proto_has(m, PF_EPOCH), m->epoch);
	if (proto_has(m, PF_DURATION_MS) && proto_has(m, PF_BYTES) && m->duration_ms > 0 &&
	    m->bytes > 0 && strstr(m->reason, "refill"))
		e->last_refill_gbps = (double)m->bytes / (m->duration_ms / 1e3) / 1e9;
	if (strncmp(m->reason, "refill", 6) == 0 || strncmp(m->reason, "release", 7) == 0)
		br_log_move(e->name, "reports", m->reason, proto_has(m, PF_DURATION_MS) ? m->duration_ms : -1,
		    proto_has(m, PF_BYTES) ? m->bytes : 0, e->mapped);
	uint64_t moved = br_moved(mapped_before, e->mapped);
	br_publish(b, "state", e, m->reason, proto_has(m, PF_DURATION_MS) ? m->duration_ms : -1, moved);
	if (e->ho_pending && proto_has(m, PF_EPOCH) && m->epoch >= e->ho_epoch &&
	    strncmp(m->reason, "refill", 6) == 0) {
		char why[400];
		double refill = proto_has(m, PF_DURATION_MS) ? m->duration_ms : 0;
		snprintf(why, sizeof why, "from %s: decide %.3f ms, release %.3f ms, refill %.3f ms",
		    e->ho_from, e->ho_decide_ms, e->ho_release_ms, refill);
		char rate[48];
		br_blog("handoff to %s %s, total %.3f ms, %.1f MiB copied%s", e->name, why, (baton_now_s() - e->ho_t0) * 1e3,
		    (double)m->bytes / BATON_MIB, br_rate(m->bytes, refill, rate, sizeof rate));
		br_publish_handoff(b, e, why, (baton_now_s() - e->ho_t0) * 1e3, moved, e->ho_decide_ms, e->ho_release_ms,
		    refill);
		e->ho_pending = false;
	}
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	br_waiter_done(w);
}

/* Copies s into the pool; returns the copy. */
static const char *pool_str(char **pool, const char *s)
{
	char *d = *pool;
	size_t n = strlen(s) + 1;
	memcpy(d, s, n);
	*pool += n;
	return d;
}

static void on_status(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	size_t ng = b->n_gpus, ne = 0;
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		ne += b->eng[i].st != ES_FREE;
	struct rbuf *rb = &w->rb;
	size_t strs = (2 * ng + 5 * ne) * BROKER_NAME_MAX + 2 * ne * BROKER_URL_MAX;
	char *blk = calloc(1, ng * sizeof(struct proto_gpu) + ne * sizeof(struct proto_engine_info) +
	    strs + 16);
	if (!blk) {
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "status: out of memory");
		return;
	}
	rb->block = blk;
	struct proto_gpu *gv = (void *)blk;
	struct proto_engine_info *ev = (void *)(gv + ng);
	char *pool = (char *)(ev + ne);
	for (size_t i = 0; i < ng; i++) {
		struct gpu_view v;
		br_gpu_view(b, i, &v);
		gv[i].uuid = pool_str(&pool, b->gpus[i].uuid);
		gv[i].total = v.total;
		gv[i].free_bytes = v.free_b;
		gv[i].reserve = b->gpus[i].reserve;
		gv[i].held = v.held;
		gv[i].lent = v.lent;
		gv[i].kv = v.kv;
		gv[i].index = b->gpus[i].index < 0 ? 0 : (uint32_t)b->gpus[i].index;
		gv[i].name = pool_str(&pool, b->gpus[i].name);
	}
	double now = baton_now_s();
	size_t k = 0;
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st == ES_FREE)
			continue;
		struct proto_engine_info *x = &ev[k++];
		x->name = pool_str(&pool, e->name);
		x->pid = (uint32_t)e->pid;
		x->gpu = pool_str(&pool, b->gpus[e->gpu].uuid);
		x->model = pool_str(&pool, e->model);
		x->state = pool_str(&pool, e->lost ? baton_state_name(BATON_STATE_LOST) : e->state);
		x->resident = e->mapped;
		x->floor = e->floor;
		x->ceiling = e->ceiling;
		x->priority = br_eng_priority(b, e);
		x->pinned = br_eng_pinned(b, e);
		/* a dead engine is idle since its last request ended (or since it
		 * died in one: br_eng_dead), not busy: never 0 */
		x->idle_ms = e->busy && e->st == ES_LIVE ? 0 : (uint64_t)((now - e->idle_since) * 1e3);
		x->last_refill_gbps = e->last_refill_gbps;
		x->peer_gpu = pool_str(&pool, e->has_peer ? b->gpus[e->peer_gpu].uuid : "");
		x->peer = e->has_peer ? e->peer_mapped : 0;
		x->requests = e->requests;
		x->kv_used = e->kv_used;
		x->kv_total = e->kv_total;
		x->ctl = pool_str(&pool, e->ctl);
		x->copied = e->copied;
		x->to_copy = e->to_copy;
		double idle_t = br_eng_idle_timeout(b, e, NULL);
		x->idle_release_ms = idle_t > 0 && !e->no_release ? (uint64_t)(idle_t * 1e3) : 0;
		x->http = pool_str(&pool, e->http);
		x->kv = e->kv;
		x->prefix_prompt = e->prefix_prompt;
		x->prefix_cached = e->prefix_cached;
		x->prefix_evictions = e->prefix_evictions;
		x->kv_host_bytes = e->kv_host_bytes;
	}
	proto_reply_init(&rb->m, m);
	rb->m.gpus = (struct proto_gpus){ gv, (uint32_t)ng };
	rb->m.engines = (struct proto_engines){ ev, (uint32_t)k };
	proto_set(&rb->m, PF_GPUS);
	proto_set(&rb->m, PF_ENGINES);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	br_waiter_done(w);
}

static void on_pin(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = br_eng_by_name(b, m->name);
	if (!e && !broker_config_engine(&b->cfg, m->name)) {
		br_reply_error(w, m->op, m->id, BATON_ENOTFOUND, "pin: no engine named '%s'", m->name);
		return;
	}
	size_t i;
	for (i = 0; i < b->n_pins; i++)
		if (strcmp(b->pins[i].name, m->name) == 0)
			break;
	if (i == b->n_pins) {
		if (b->n_pins == BROKER_MAX_ENGINES) {
			br_reply_error(w, m->op, m->id, BATON_ENOMEM, "pin: too many pins");
			return;
		}
		snprintf(b->pins[i].name, sizeof b->pins[i].name, "%s", m->name);
		b->n_pins++;
	}
	b->pins[i].pinned = m->pinned;
	br_blog("engine %s %s", m->name, m->pinned ? "pinned" : "unpinned");
	br_pins_save(b);
	if (e)
		br_publish(b, m->pinned ? "pin" : "unpin", e, "operator", -1, e->mapped);
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.pinned = m->pinned;
	proto_set(&rb->m, PF_PINNED);
	br_waiter_done(w);
}

/* acquire (an engine for itself), refill / vram null (an operator: acquire
 * on the engine's behalf, then command it), release / vram N (command). */
static void on_engine_op(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	const char *name = m->op == PROTO_OP_HANDOFF ? m->to : m->name;
	if (m->op != PROTO_OP_HANDOFF && !proto_has(m, PF_NAME)) {
		br_reply_error(w, m->op, m->id, BATON_EMISSING, "%s: the broker needs the engine's name",
		    proto_op_name(m->op));
		return;
	}
	if (m->op == PROTO_OP_RELEASE && proto_has(m, PF_ALL) && m->all) {
		br_reply_error(w, m->op, m->id, BATON_EUNSUPPORTED, "release with all: send it to the "
		    "engine itself (baton release NAME --all finds it)");
		return;
	}
	if (m->op == PROTO_OP_REFILL && proto_has(m, PF_RESERVE_MIB)) {
		/* the broker's own word to a released engine (schedule.c) */
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "refill: reserve_mib is not for the broker; "
		    "use vram NAME --reserve-mib N");
		return;
	}
	struct eng *e = need_engine(b, w, m, name);
	if (!e)
		return;
	if (e->kind == EK_LEASE || (m->op == PROTO_OP_ACQUIRE && e->kind != EK_ENGINE)) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "%s: '%s' is a lease (baton lease release %s)",
		    proto_op_name(m->op), e->name, e->name);
		return;
	}
	enum op_kind kind;
	switch (m->op) {
	case PROTO_OP_ACQUIRE: kind = OP_ACQUIRE; break;
	case PROTO_OP_REFILL: kind = OP_REFILL; break;
	case PROTO_OP_RELEASE: kind = OP_RELEASE; break;
	case PROTO_OP_VRAM: kind = m->reserve_mib == PROTO_RESERVE_FULL ? OP_REFILL : OP_VRAM; break;
	default: kind = OP_HANDOFF; break;
	}
	struct eng *from = NULL;
	if (kind == OP_HANDOFF) {
		from = need_engine(b, w, m, m->from);
		if (!from)
			return;
		if (from == e) {
			br_reply_error(w, m->op, m->id, BATON_EINVAL, "handoff: from and to are both '%s'", m->to);
			return;
		}
		if (br_eng_pinned(b, from)) {
			br_reply_error(w, m->op, m->id, BATON_EPERM, "handoff: %s is pinned (baton unpin %s)",
			    from->name, from->name);
			return;
		}
	}
	/* A lost engine (alive, silent: stopped?) would not answer a command
	 * before the command timeout: say so at once. */
	struct eng *silent = e->lost ? e : from && from->lost ? from : NULL;
	if (kind != OP_ACQUIRE && silent) {
		br_reply_error(w, m->op, m->id, BATON_ESTATE,
		    "%s: %s is lost: no heartbeat for %.1f s, its process %d is alive (stopped?); its "
		    "memory stays counted until it answers again or exits", proto_op_name(m->op), silent->name,
		    baton_now_s() - silent->last_seen, silent->pid);
		return;
	}
	if (kind == OP_RELEASE && br_eng_pinned(b, e)) {
		br_reply_error(w, m->op, m->id, BATON_EPERM, "release: %s is pinned (baton unpin %s)",
		    e->name, e->name);
		return;
	}
	/* The engine resends an acquire whose reply is late or lost (same id):
	 * one already waiting is the same request, answered on the newest copy
	 * and keeping its place; one granted already, whose grant is not used
	 * yet, gets the same grant again, never a second one. A new acquire
	 * replaces an older one. */
	if (kind == OP_ACQUIRE && m->id == e->acq_id && e->grant > 0 && e->grant_epoch == e->acq_epoch) {
		struct rbuf *rb = &w->rb;
		proto_reply_init(&rb->m, m);
		rb->m.epoch = e->acq_epoch;
		rb->m.granted = e->acq_granted;
		br_waiter_done(w);
		return;
	}
	for (size_t i = 0; kind == OP_ACQUIRE && i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (!o->used || o->kind != OP_ACQUIRE || o->target.slot != (uint32_t)(e - b->eng) ||
		    o->target.gen != e->gen)
			continue;
		if (o->req_id == m->id) {
			br_reply_error(o->w, o->req_op, o->req_id, BATON_ECLOSED, "acquire: sent again; answered there");
			o->w = w;
			return;
		}
		br_op_fail(b, o, BATON_ECLOSED, "acquire: replaced by a newer acquire of %s", e->name);
	}
	struct op *o = br_op_new(b, kind, w, m);
	if (!o) {
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "%s: too many operations in progress",
		    proto_op_name(m->op));
		return;
	}
	o->target = br_eref_of(b, e);
	o->gpu = e->gpu;
	o->reserve_mib = m->reserve_mib;
	if (proto_has(m, PF_REASON) && m->reason) /* the front door names itself */
		snprintf(o->reason, sizeof o->reason, "%s", m->reason);
	switch (kind) {
	case OP_ACQUIRE:
		o->bytes = m->bytes;
		o->mapped0 = e->mapped;
		o->phase = P_WAIT;
		break;
	case OP_REFILL:
		o->bytes = br_want_bytes(e);
		o->phase = P_WAIT;
		break;
	case OP_RELEASE:
	case OP_VRAM:
		o->phase = P_CMD;
		break;
	case OP_HANDOFF: {
		o->victim = br_eref_of(b, from);
		o->bytes = br_want_bytes(e);
		/* decide: what `from` gives is only what B lacks. Nothing when
		 * the device has room for B, or when A sits on another device
		 * (its cache there frees nothing for B; a loan of A's on B's
		 * device comes back the usual way, loans first). A shrink by
		 * the shortfall when A is elastic and keeps its floor; all it
		 * holds otherwise. */
		struct gpu_view v;
		br_gpu_view(b, e->gpu, &v);
		uint64_t short_by = o->bytes > v.avail ? o->bytes - v.avail : 0;
		bool takes = from->gpu == e->gpu && short_by > 0;
		if (takes && !from->no_shrink && short_by < from->mapped && from->mapped - short_by >= from->floor) {
			o->victim_kind = POLICY_SHRINK;
			o->victim_bytes = short_by;
		} else {
			o->victim_kind = POLICY_RELEASE;
			o->victim_bytes = takes ? from->mapped : 0;
		}
		o->t_decided = baton_now_s();
		o->phase = !takes || (from->mapped == 0 && from->grant == 0) ? P_WAIT : P_VICTIM;
		if (o->phase == P_WAIT)
			o->t_victim_done = o->t_decided;
		break;
	}
	}
}

void br_on_request(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	switch (m->op) {
	case PROTO_OP_REGISTER: on_register(b, w, m); break;
	case PROTO_OP_HEARTBEAT: on_heartbeat(b, w, m); break;
	case PROTO_OP_REPORT: on_report(b, w, m); break;
	case PROTO_OP_STATUS: on_status(b, w, m); break;
	case PROTO_OP_PIN: on_pin(b, w, m); break;
	case PROTO_OP_LEASE: br_on_lease(b, w, m); break;
	case PROTO_OP_EXTERNAL: br_on_external(b, w, m); break;
	case PROTO_OP_ACQUIRE:
	case PROTO_OP_REFILL:
	case PROTO_OP_RELEASE:
	case PROTO_OP_VRAM:
	case PROTO_OP_HANDOFF: on_engine_op(b, w, m); break;
	default:
		br_reply_error(w, m->op, m->id, BATON_EUNKNOWNOP, "the broker does not serve '%s'",
		    proto_op_name(m->op));
	}
}
