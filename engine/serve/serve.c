/*
 * serve.c: the engine's serve loop (see serve.h): one model on one
 * device, serving GEN, COMPLETE and the control commands on its own nng
 * REP socket; here are open and close and the receivers that dispatch.
 *
 * Threads:
 *   receivers (RECEIVERS of them, one nng context each) take requests.
 *     STATUS is answered at once from a snapshot (status.c). GEN waits its
 *     turn for the engine; COMPLETE waits for the scheduler's answer
 *     (request.c). RELEASE, REFILL, VRAM and PEER take the engine only if
 *     nobody holds it, and answer busy otherwise (control.c).
 *   the scheduler's thread (sched.c) runs COMPLETE and the OpenAI API's
 *     requests, holding the engine between its begin and end hooks (work.c).
 *   the program's main thread waits for signals and calls serve_tick
 *     (idle.c).
 * The engine itself (arena, backend, cache) is used by one thread at a
 * time, under run_mu. Every handler gets the struct serve (serve_int.h).
 *
 * With a broker (broker_link.h) the engine registers, sends heartbeats and
 * reports, and asks the broker before it maps memory on its own
 * initiative (work.c). The broker's commands come on the control socket
 * like anyone's, fenced by their epoch.
 *
 * A new op is one serve_on_* function in the file of its kind and one
 * case in receiver().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/random.h>

#include "arena/arena.h"
#include "engine/serve/serve_int.h"
#include "http/http.h"

static void *receiver(void *arg)
{
	struct serve_receiver *x = arg;
	struct serve *s = x->s;
	struct proto_ctx *ctx = x->ctx;
	while (!s->stopping) {
		struct baton_msg req;
		struct proto_diag d;
		int rc = proto_ctx_recv(ctx, &req, 500, &d);
		if (rc == BATON_ECLOSED)
			break;
		if (rc == BATON_ETIMEDOUT)
			continue;
		if (rc) {
			/* the transport already answered with the error */
			serve_log(s, "bad request: %s: %s", baton_strerror(rc), d.text);
			continue;
		}
		if (s->stopping) {
			serve_reply_err(s, ctx, &req, BATON_ECLOSED, "the engine is shutting down");
			proto_msg_free(&req);
			break;
		}
		switch (req.op) {
		case PROTO_OP_STATUS: serve_on_status(s, ctx, &req); break;
		case PROTO_OP_GEN: serve_on_gen(s, ctx, &req); break;
		case PROTO_OP_COMPLETE: serve_on_complete(s, ctx, &req); break;
		case PROTO_OP_RELEASE:
		case PROTO_OP_REFILL:
		case PROTO_OP_VRAM:
		case PROTO_OP_PEER: serve_on_control(s, ctx, &req); break;
		default:
			serve_reply_err(s, ctx, &req, BATON_EUNKNOWNOP, "an engine does not serve '%s'",
			    proto_op_name(req.op));
		}
		proto_msg_free(&req);
	}
	return NULL;
}

/* The text side, in its order (openai.h): no request comes in, the
 * scheduler ends those in flight, then memory goes. */
static void close_text(struct serve *s)
{
	oai_server_stop(s->oai);
	sched_close(s->sched);
	s->sched = NULL;
	oai_server_close(s->oai);
	s->oai = NULL;
	generator_close(s->gen);
	s->gen = NULL;
}

/* Everything serve_open opened, in the order it must go (any prefix of
 * it may be open: serve_open's failures come here too). Requests in
 * flight end first (a receiver waiting on one hears ECLOSED), then the
 * receivers stop; nobody uses the engine then: the device memory goes
 * back, then the broker hears (it counts the memory free from then on). */
static void teardown(struct serve *s)
{
	s->stopping = 1;
	oai_server_stop(s->oai);
	if (s->sched)
		sched_stop(s->sched);
	if (s->srv)
		proto_server_shutdown(s->srv);
	for (int i = 0; i < s->nth; i++)
		pthread_join(s->rx[i].th, NULL);
	for (int i = 0; i < s->nth; i++)
		proto_ctx_close(s->rx[i].ctx);
	if (s->srv)
		proto_server_close(s->srv);
	s->srv = NULL;
	close_text(s);
	if (s->e) {
		struct baton_cache_report r;
		engine_release(s->e, &r);
	}
	broker_link_close(s->link, true);
	s->link = NULL;
	engine_close(s->e);
	s->e = NULL;
	pthread_cond_destroy(&s->yield_cv);
	pthread_mutex_destroy(&s->acq_mu);
	pthread_mutex_destroy(&s->st_mu);
	pthread_mutex_destroy(&s->run_mu);
	free(s);
}

/* 32 random bytes in hex: the HTTP token an engine under a broker makes. */
static int make_token(char *out, size_t n)
{
	unsigned char r[32];
	if (n < 2 * sizeof r + 1 || getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
		return -1;
	for (size_t i = 0; i < sizeof r; i++)
		snprintf(out + 2 * i, 3, "%02x", r[i]);
	explicit_bzero(r, sizeof r);
	return 0;
}

/* The OpenAI API's access-log lines, in the engine's log. */
static void access_line(void *arg, const char *line)
{
	serve_log(arg, "%s", line);
}

int serve_open(const struct baton_serve_config *conf, struct serve **out, enum serve_broker_fail *fail)
{
	*out = NULL;
	if (fail)
		*fail = SERVE_BROKER_OK;
	struct serve *s = calloc(1, sizeof *s);
	if (!s)
		return BATON_ENOMEM;
	pthread_mutex_init(&s->run_mu, NULL);
	pthread_mutex_init(&s->st_mu, NULL);
	pthread_mutex_init(&s->acq_mu, NULL);
	baton_cond_init(&s->yield_cv); /* its timed waits run on CLOCK_MONOTONIC */
	s->state = baton_state_name(BATON_STATE_LOADING);
	s->o = *conf;
	const char *listen = s->o.listen;
	struct baton_engine_config cfg = {
		.name = s->o.name,
		.arena_path = s->o.arena,
		.backend = s->o.backend,
		.device = s->o.device,
		.cache_bytes = s->o.cache_mib * BATON_MIB,
		.whole_cache = s->o.broker != NULL,
		.segment_bytes = s->o.segment_mib * BATON_MIB,
		.reserve_bytes = s->o.reserve_mib * BATON_MIB,
		.host_capacity = s->o.host_mib * BATON_MIB,
		.verify = s->o.verify || (getenv("BATON_VERIFY_REFILL") && atoi(getenv("BATON_VERIFY_REFILL"))),
		.warm = s->o.broker ? 0 : 1,
		.use_peer = s->o.use_peer,
		.peer_device = s->o.peer_device,
	};
	char err[512] = "";
	double t0 = baton_now_s();
	int rc = engine_open(&cfg, &s->e, err, sizeof err);
	if (rc) {
		serve_log(s, "%s", err);
		goto fail;
	}
	serve_snapshot(s, NULL);
	if (getenv("BATON_TEST_REFILL_STEP_MS"))
		cache_set_progress(engine_cache(s->e), serve_refill_step, NULL);
	s->d_model = s->info.d_model;
	s->warning = s->info.backend_warning ? s->info.backend_warning : "";
	/* A whole model (arena v2 with config.json) also speaks text. */
	/* a step of the scheduler is one forward pass of up to step_tokens
	 * rows; without --step-tokens, a device too small for the default's
	 * activations takes half as many rows, down to 64 */
	uint32_t step_tokens = s->o.step_tokens ? s->o.step_tokens : BATON_SCHED_DEFAULT_CHUNK;
	struct baton_model_opts mo = { .max_ctx = s->o.ctx, .kv_blocks = s->o.kv_blocks,
		.max_batch = step_tokens,
		.kv_seqs = s->o.max_seqs, .content_special = s->o.content_special,
		.no_prefix_cache = s->o.no_prefix_cache, .kv_host_bytes = s->o.kv_host_mib * BATON_MIB };
	rc = generator_open(s->e, &mo, &s->gen, s->gen_error, sizeof s->gen_error);
	while (rc == BATON_EDEVMEM && !s->o.step_tokens && step_tokens > 64) {
		serve_log(s, "%s: a step of %u rows does not fit; trying %u", s->gen_error, step_tokens,
		    step_tokens / 2);
		step_tokens /= 2;
		mo.max_batch = step_tokens;
		rc = generator_open(s->e, &mo, &s->gen, s->gen_error, sizeof s->gen_error);
	}
	if (rc == 0) {
		serve_snapshot(s, NULL); /* the KV pool's bytes, for the broker's books */
		struct baton_model *m = generator_model(s->gen);
		/* one pass of a step's rows before the first request: what the
		 * backend makes on first use is made now (model_warm) */
		const double w0 = baton_now_s();
		const int wrc = model_warm(m, step_tokens, 0);
		if (wrc)
			serve_log(s, "warning: the warm-up pass failed (%s); the first steps make what it "
			    "would have", baton_strerror(wrc));
		else if (model_passes(m))
			serve_log(s, "warm-up pass of up to %u rows: %.0f ms", step_tokens,
			    1e3 * (baton_now_s() - w0));
		serve_log(s, "text generation: %s model, chat template %s, KV pool %u blocks of %u positions "
		    "(%.1f MiB, %.1f contexts; %s)", generator_arch(s->gen),
		    generator_chat_family(s->gen) ? generator_chat_family(s->gen) : "none",
		    model_kv_blocks_total(m), BATON_KV_BLOCK, (double)model_kv_bytes(m) / BATON_MIB,
		    (double)model_kv_blocks_total(m) * BATON_KV_BLOCK / model_max_ctx(m),
		    s->o.kv_blocks ? "--kv-blocks" : "sized from the device");
	} else if (rc != BATON_EUNSUPPORTED || !strstr(s->gen_error, "experts only")) {
		serve_log(s, "warning: no text generation: %s", s->gen_error);
	}
	/* The served model id: --served-model-name, else the arena's file
	 * name without .arena (what the broker registers as the model). */
	if (s->o.served_model) {
		snprintf(s->model_name, sizeof s->model_name, "%s", s->o.served_model);
	} else {
		const char *base = strrchr(s->o.arena, '/');
		snprintf(s->model_name, sizeof s->model_name, "%s", base ? base + 1 : s->o.arena);
		char *dot = strstr(s->model_name, ".arena");
		if (dot && dot[6] == 0)
			*dot = 0;
	}
	if (s->gen) {
		struct sched_opts so = { .max_seqs = s->o.max_seqs, .max_queue = s->o.max_queue,
			.chunk = step_tokens };
		struct sched_hooks sh;
		serve_sched_hooks(s, &sh);
		if ((rc = sched_open(s->gen, &so, &sh, &s->sched)) != 0) {
			serve_log(s, "cannot start the scheduler: %s", baton_strerror(rc));
			rc = BATON_ESERVE_START;
			goto fail;
		}
	}
	/* Under a broker the OpenAI API is the front door's way in, and only
	 * its: with no --http-token-file the engine makes a token of its own
	 * (on every request, reads too), tells it to the broker alone when it
	 * registers, and the door sends it. A local user who is refused by the
	 * door gets 401 here too (issue 28: engines were a back door around the
	 * door's token, limits and policy). */
	if (s->o.http && s->o.broker && !(s->o.http_token && s->o.http_token[0]) && http_is_loopback(s->o.http)) {
		if ((rc = make_token(s->made_token, sizeof s->made_token)) != 0) {
			serve_log(s, "cannot make the HTTP token: %s", strerror(errno));
			rc = BATON_ESERVE_START;
			goto fail;
		}
		s->o.http_token = s->made_token;
	}
	if (s->o.http) {
		char herr[512] = "";
		struct oai_server_opts oo = { .addr = s->o.http, .token = s->o.http_token, .model = s->model_name,
			.sched = s->sched, .health = serve_health_fields, .health_arg = s,
			.model_facts = serve_model_facts, .keep_alive = serve_keep_alive,
			.chat_template = s->gen ? generator_chat_template(s->gen) : NULL,
			.tok = s->gen ? generator_tokenizer(s->gen) : NULL,
			.max_model_len = s->gen ? model_max_ctx(generator_model(s->gen)) : 0,
			.cors_origins = (const char *const *)s->o.cors_origins, .content_special = s->o.content_special,
			.max_n = s->o.max_n,
			.engine = s->o.name, .log = access_line, .log_arg = s, .no_access_log = s->o.no_access_log };
		rc = s->sched ? oai_server_open(&oo, &s->oai, herr, sizeof herr) : BATON_EUNSUPPORTED;
		if (rc) {
			serve_log(s, "--http %s: %s", s->o.http, s->sched ? herr : s->gen_error);
			rc = rc == BATON_EPERM || rc == BATON_EINVAL || rc == BATON_EUNSUPPORTED ? BATON_EINVAL :
			    BATON_ESERVE_START;
			goto fail;
		}
		serve_log(s, "OpenAI API on %s, model '%s'", oai_server_url(s->oai), s->model_name);
	}
	snprintf(s->peer_gpu, sizeof s->peer_gpu, "%s", s->info.peer_gpu);
	s->ceiling = s->info.cache.target_bytes;
	serve_log(s, "%s on %s (%s): %u layers x %u experts, cache %.1f MiB %s, ready in %.3f s", s->o.arena,
	    s->info.backend, s->info.gpu, s->info.layers, s->info.experts,
	    (double)s->info.cache.mapped_bytes / BATON_MIB, cache_state_name(s->info.cache.state), baton_now_s() - t0);
	if (s->info.compute_error)
		serve_log(s, "warning: %s; GEN will be refused", s->info.compute_error);
	if (s->info.backend_warning)
		serve_log(s, "WARNING: %s", s->info.backend_warning);
	if (s->o.use_peer)
		serve_log(s, "peer tier on %s (device %d): empty until lent; it could use %.1f MiB",
		    s->peer_gpu, s->o.peer_device, (double)s->info.peer_want / BATON_MIB);

	if (proto_ipc_dir(listen) != 0)
		serve_log(s, "cannot create the directory of %s: %s", listen, strerror(errno));
	/* Whoever can write the socket's directory could put their own socket
	 * at its name (the broker and baton would send them the commands) or
	 * take ours away: the broker's rule for its own (proto/base/trust.c). */
	if (strncmp(listen, "ipc://", 6) == 0 &&
	    (rc = baton_trust_dir_of(listen + 6, "the socket directory", err, sizeof err)) != 0) {
		serve_log(s, "cannot listen on %s: %s", listen, err);
		rc = BATON_EINVAL;
		goto fail;
	}
	if ((rc = proto_server_open(&s->srv, listen, NULL)) != 0) {
		serve_log(s, "cannot listen on %s: %s", listen, baton_strerror(rc));
		s->srv = NULL;
		rc = BATON_ESERVE_START;
		goto fail;
	}
	for (int i = 0; i < RECEIVERS; i++) {
		struct serve_receiver *x = &s->rx[i];
		x->s = s;
		if (proto_ctx_open(s->srv, &x->ctx) != 0)
			break;
		if (pthread_create(&x->th, NULL, receiver, x) != 0) {
			proto_ctx_close(x->ctx);
			x->ctx = NULL;
			break;
		}
		s->nth++;
	}
	if (s->nth == 0) {
		serve_log(s, "cannot start the receivers");
		rc = BATON_ESERVE_START;
		goto fail;
	}
	pthread_mutex_lock(&s->st_mu); /* the receivers run already */
	s->last_active = baton_now_s();
	s->started_wall = (double)time(NULL);
	pthread_mutex_unlock(&s->st_mu);
	serve_log(s, "listening on %s", listen);
	if (s->o.broker && s->o.idle_s > 0)
		serve_log(s, "warning: --cache-release-idle is ignored under a broker: idle release is "
		    "the broker's rule (idle_release_s, keep_alive_s)");
	if (s->o.broker) {
		/* Register, then ask for the whole cache; a refusal leaves it
		 * cold until the first request. No broker in 2 s: warm alone. */
		struct broker_link_params lp = {
			.url = s->o.broker,
			.name = s->o.name,
			.gpu = s->info.gpu,
			.model = s->model_name,
			.http = serve_http_url(s),
			.http_token = s->o.http_token,
			.ctl = proto_server_url(s->srv),
			.pid = (uint32_t)getpid(),
			.device = (uint32_t)s->o.device,
			.floor = s->info.cache.segment_bytes,
			.ceiling = s->ceiling,
			.capacity = s->info.dev_total,
			.priority = s->o.priority,
			.peer_gpu = s->peer_gpu,
			.peer_want = s->info.peer_want,
			.state_fn = serve_link_state,
			.state_arg = s,
			.log = serve_link_log,
		};
		if ((rc = broker_link_open(&lp, &s->link)) != 0)
			serve_log(s, "cannot start the broker link to %s: %s", s->o.broker, baton_strerror(rc));
		/* A refusal (the name is taken) always ends the start: serving
		 * outside the broker's control under a name it gives to another
		 * would fight that one for the device. No answer ends it unless
		 * the user asked to go on alone (--broker-optional): a mistyped
		 * URL must not pass for a broker that is away. */
		double wait_s = s->o.broker_wait_s > 0 ? s->o.broker_wait_s : s->o.broker_optional ? 2 : 10;
		char lerr[512] = "";
		int lrc = s->link ? broker_link_wait_start(s->link, (int)(wait_s * 1e3), lerr, sizeof lerr) :
		    BATON_ECONN;
		if (lrc && s->link && (lrc != BATON_ECONN && lrc != BATON_ETIMEDOUT)) {
			serve_log(s, "error: the broker refused to register this engine: %s", lerr);
			if (fail)
				*fail = SERVE_BROKER_REFUSED;
			rc = lrc;
			goto fail;
		}
		if (lrc && !s->o.broker_optional) {
			serve_log(s, "error: %s (is --broker right? --broker-optional serves without one)",
			    s->link ? lerr : "no broker link");
			if (fail)
				*fail = SERVE_BROKER_ABSENT;
			rc = lrc == BATON_ETIMEDOUT ? BATON_ETIMEDOUT : BATON_ECONN;
			goto fail;
		}
		if (lrc)
			serve_log(s, "no broker at %s yet: warming alone (it will hear from me when it is up)",
			    s->o.broker);
		char aerr[512] = "";
		pthread_mutex_lock(&s->run_mu);
		rc = serve_ensure_memory(s, "startup", aerr, sizeof aerr);
		if (rc)
			serve_log(s, "startup: the broker gave no memory (%s): cold until the first request", aerr);
		/* The receivers already run: read the snapshot under its lock. */
		pthread_mutex_lock(&s->st_mu);
		double mapped_mib = (double)s->info.cache.mapped_bytes / BATON_MIB;
		const char *state = s->state;
		pthread_mutex_unlock(&s->st_mu);
		pthread_mutex_unlock(&s->run_mu);
		serve_log(s, "cache %.1f of %.1f MiB, %s", mapped_mib, (double)s->ceiling / BATON_MIB, state);
	}
	*out = s;
	return 0;
fail:
	teardown(s);
	return rc;
}

const char *serve_url(const struct serve *s)
{
	return s && s->srv ? proto_server_url(s->srv) : "";
}

const char *serve_warning(const struct serve *s)
{
	return s && s->warning ? s->warning : ""; /* not s->info: the receivers rewrite it under st_mu */
}

const char *serve_http_url(const struct serve *s)
{
	return s && s->oai ? oai_server_url(s->oai) : "";
}

void serve_close(struct serve *s)
{
	if (!s)
		return;
	serve_log(s, "shutting down");
	char name[BATON_PROTO_MAX_NAME];
	snprintf(name, sizeof name, "%s", s->o.name ? s->o.name : "?");
	teardown(s);
	char stamp[48];
	fprintf(stderr, "%sbaton-engine[%s]: stopped\n", serve_stamp(stamp, sizeof stamp), name);
}
