/*
 * control.c: RELEASE, REFILL, VRAM and PEER (see serve_int.h): fenced by
 * epoch, and refused as busy while the engine works (a control command
 * never waits behind, or disturbs, a running request).
 */
#include <inttypes.h>
#include <string.h>

#include "engine/serve/serve_int.h"

/* RELEASE, REFILL, VRAM, PEER: fenced by epoch, refused while the engine works. */
void serve_on_control(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req)
{
	const char *op = proto_op_name(req->op);
	if (proto_has(req, PF_NAME) && strcmp(req->name, s->o.name) != 0) {
		serve_reply_err(s, ctx, req, BATON_ENOTFOUND, "%s: this engine is '%s', not '%s'", op,
		    s->o.name, req->name);
		return;
	}
	if ((req->op == PROTO_OP_RELEASE || req->op == PROTO_OP_REFILL) && !s->o.release) {
		serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED,
		    "%s: start the engine with --expert-cache-release to allow it", op);
		return;
	}
	int all = req->op == PROTO_OP_RELEASE && proto_has(req, PF_ALL) && req->all;
	if (all && !s->gen) {
		serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED, "release --all: this engine holds no whole model "
		    "(its arena has experts only): a plain release gives back all it can");
		return;
	}
	if (req->op == PROTO_OP_VRAM && !s->o.elastic) {
		serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED, "vram: start the engine with --vram-elastic to allow it");
		return;
	}
	if ((req->op == PROTO_OP_VRAM || (req->op == PROTO_OP_REFILL && proto_has(req, PF_RESERVE_MIB))) &&
	    req->reserve_mib != PROTO_RESERVE_FULL && req->reserve_mib > (UINT64_C(1) << 24)) {
		serve_reply_err(s, ctx, req, BATON_ERANGE, "%s: reserve_mib %" PRIu64 " is out of range", op,
		    req->reserve_mib);
		return;
	}
	if (req->op == PROTO_OP_PEER) {
		if (!s->o.use_peer) {
			serve_reply_err(s, ctx, req, BATON_EUNSUPPORTED,
			    "peer: this engine has no peer device (start it with --peer-device N)");
			return;
		}
		if (req->peer_mib > (UINT64_C(1) << 24)) {
			serve_reply_err(s, ctx, req, BATON_ERANGE, "peer: peer_mib %" PRIu64 " is out of range",
			    req->peer_mib);
			return;
		}
		if (proto_has(req, PF_PEER_GPU) && strcmp(req->peer_gpu, s->peer_gpu) != 0) {
			serve_reply_err(s, ctx, req, BATON_EINVAL, "peer: this engine's peer device is %s, not %s",
			    s->peer_gpu, req->peer_gpu);
			return;
		}
	}
	if (pthread_mutex_trylock(&s->run_mu) != 0) {
		if (proto_has(req, PF_EPOCH)) {
			/* the broker asks again in a moment: hold the next GEN
			 * back, admit no new sequence until it ran (DRAIN_S) */
			pthread_mutex_lock(&s->st_mu);
			s->yield_at = baton_now_s();
			pthread_mutex_unlock(&s->st_mu);
		}
		serve_reply_err(s, ctx, req, BATON_EBUSY, "%s: the engine is serving a request; try again", op);
		return;
	}
	pthread_mutex_lock(&s->st_mu);
	if (proto_has(req, PF_EPOCH)) {
		if (req->epoch < s->epoch) {
			uint64_t cur = s->epoch;
			pthread_mutex_unlock(&s->st_mu);
			pthread_mutex_unlock(&s->run_mu);
			serve_reply_err(s, ctx, req, BATON_ESTALE, "%s: epoch %" PRIu64 " is older than %" PRIu64,
			    op, req->epoch, cur);
			return;
		}
		s->epoch = req->epoch;
	}
	pthread_mutex_unlock(&s->st_mu);

	struct baton_cache_report r;
	int rc;
	if (req->op == PROTO_OP_RELEASE) {
		serve_set_state(s, BATON_STATE_RELEASING);
		rc = engine_release(s->e, &r);
		s->idle_released = 0;
		if (rc == 0 && all && !s->released_all) {
			/* the dense weights and the KV pool too: only the device
			 * context stays (queued requests wait; the next one
			 * refills, asking the broker first) */
			struct baton_model *m = generator_model(s->gen);
			uint64_t held = model_device_bytes(m);
			double t0 = baton_now_s();
			rc = model_release(m);
			if (s->sched)
				sched_note_model(s->sched); /* the KV kept in host memory, for the views */
			if (rc == 0) {
				pthread_mutex_lock(&s->st_mu);
				s->released_all = 1;
				s->model_bytes = held;
				pthread_mutex_unlock(&s->st_mu);
				/* and the synthetic GEN path's routers (GEN
				 * brings them back if it is ever asked) */
				r.bytes_freed += held + engine_release_gen(s->e);
				r.total_s += baton_now_s() - t0;
			}
		}
	} else if (req->op == PROTO_OP_REFILL) {
		/* whole again: the model (after a release --all), back to the
		 * full target, then filled. With a reserve (the broker's
		 * partial grant to a released engine, worked out before the
		 * model came back), filled only until the device has that
		 * much free; an engine not --vram-elastic is made whole. */
		serve_set_state(s, BATON_STATE_REFILLING);
		int part = proto_has(req, PF_RESERVE_MIB) && req->reserve_mib != PROTO_RESERVE_FULL &&
		    req->reserve_mib > 0 && s->o.elastic;
		rc = serve_refill_model(s);
		if (rc == 0)
			rc = part ? serve_fill_to(s, (int64_t)(req->reserve_mib * BATON_MIB), &r) :
			    serve_make_full(s, UINT64_MAX, &r);
	} else if (req->op == PROTO_OP_PEER) {
		/* "resizing" while it maps or unmaps peer segments: a broker
		 * that probes a slow lend or revoke with STATUS sees work in
		 * progress, not a lost command (the own tier does not change) */
		serve_set_state(s, BATON_STATE_RESIZING);
		rc = engine_peer(s->e, req->peer_mib * BATON_MIB, &r);
	} else {
		int64_t reserve = req->reserve_mib == PROTO_RESERVE_FULL ? -1 :
		    (int64_t)(req->reserve_mib * BATON_MIB);
		serve_set_state(s, BATON_STATE_RESIZING);
		rc = engine_vram(s->e, reserve, &r);
	}
	if (rc == 0 && r.bytes_copied) {
		pthread_mutex_lock(&s->st_mu);
		s->last_refill_bytes = r.bytes_copied;
		s->last_refill_s = r.total_s;
		pthread_mutex_unlock(&s->st_mu);
	}
	serve_snapshot(s, NULL);
	pthread_mutex_lock(&s->st_mu);
	s->yield_at = 0;
	pthread_cond_broadcast(&s->yield_cv);
	uint64_t peer_mapped = s->info.cache.peer_mapped_bytes;
	pthread_mutex_unlock(&s->st_mu);
	pthread_mutex_unlock(&s->run_mu);
	if (rc == BATON_ESTATE && req->op == PROTO_OP_PEER) {
		serve_reply_err(s, ctx, req, rc, "peer: the cache is released; a released engine borrows "
		    "no memory (refill first)");
		return;
	}
	if (rc) {
		serve_reply_err(s, ctx, req, rc, "%s failed: %s", op, baton_strerror(rc));
		return;
	}
	if (req->op == PROTO_OP_PEER)
		serve_log(s, "peer: %.1f MiB on %s asked, %.1f MiB mapped, %" PRIu64 " bytes copied, %"
		    PRIu64 " freed, %.3f ms", (double)req->peer_mib,
		    s->peer_gpu, (double)peer_mapped / BATON_MIB, r.bytes_copied,
		    r.peer_bytes_freed, r.total_s * 1e3);
	else
		serve_log(s, "%s%s: %s, %.3f ms, %" PRIu64 " bytes copied, %" PRIu64 " freed", op,
		    all ? " --all" : "", cache_state_name(r.state), r.total_s * 1e3, r.bytes_copied,
		    r.bytes_freed);
	uint64_t fr = 0, tot = 0;
	engine_mem_info(s->e, &fr, &tot);
	struct baton_msg rep;
	proto_reply_init(&rep, req);
	pthread_mutex_lock(&s->st_mu);
	rep.state = s->state;
	rep.resident = (uint64_t)s->info.cache.items_resident * s->info.cache.slot_bytes;
	rep.epoch = s->snap_epoch;
	rep.mapped = s->info.cache.mapped_bytes;
	rep.level = serve_level_name(s);
	pthread_mutex_unlock(&s->st_mu);
	proto_set(&rep, PF_LEVEL);
	rep.free_bytes = fr;
	proto_set(&rep, PF_MAPPED);
	proto_set(&rep, PF_FREE);
	if (s->o.use_peer) {
		uint64_t pf = 0, pt = 0;
		engine_peer_mem_info(s->e, &pf, &pt);
		rep.peer_mapped = peer_mapped;
		rep.peer_free = pf;
		proto_set(&rep, PF_PEER_MAPPED);
		proto_set(&rep, PF_PEER_FREE);
	}
	rep.ms = r.total_s * 1e3;
	rep.bytes = req->op == PROTO_OP_RELEASE || (req->op == PROTO_OP_VRAM && r.bytes_copied == 0) ?
	    r.bytes_freed : r.bytes_copied;
	if (req->op == PROTO_OP_PEER) /* lend: copied into the peer tier; revoke: freed there */
		rep.bytes = req->peer_mib ? r.bytes_copied : r.peer_bytes_freed;
	serve_reply(s, ctx, &rep);
	/* The broker hears the new state from the reply when it sent the
	 * command; anyone else's command is news to it. */
	if (!proto_has(req, PF_EPOCH))
		serve_report(s, op, r.total_s * 1e3, rep.bytes);
}
