/*
 * broker.c: the broker daemon's life (open, start, stop, close) and its
 * decision loop: take what the inbox holds, then serve the devices and
 * run the timers, then sleep until the next item or timer. What each
 * file of the core does, and which thread owns what: broker_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/broker_int.h"

static void pump(struct broker *b)
{
	double now = baton_now_s();
	b->next_wake = now + TICK_S;
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (o->used && (o->phase == P_VICTIM || o->phase == P_CMD))
			br_run_commands(b, o, now);
		if (o->used && (o->phase == P_WAIT || o->phase == P_VICTIM || o->phase == P_CMD))
			wake_at(b, o->deadline);
	}
	for (size_t g = 0; g < b->n_gpus; g++)
		br_serve_gpu(b, g, now);
	br_lend_free_memory(b, now);
	if (now >= b->next_tick) {
		br_housekeeping(b, now);
		b->next_tick = now + TICK_S;
	}
	wake_at(b, b->next_tick);
}

static void handle(struct broker *b, struct item *it)
{
	switch (it->kind) {
	case IT_REQ:
		br_on_request(b, it->w, &it->req);
		proto_msg_free(&it->req);
		break;
	case IT_DONE:
		br_on_done(b, it);
		break;
	case IT_PIPE_REM:
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
			struct eng *e = &b->eng[i];
			if (e->st == ES_LIVE && e->pipe == it->pipe && !br_pid_alive(e->pid))
				br_eng_dead(b, e, "its connection closed and its process is gone", false);
		}
		break;
	case IT_RELOAD:
		br_apply_config(b, it->cfg, it->w->rb.text, sizeof it->w->rb.text);
		br_waiter_done(it->w);
		break;
	case IT_DEATH: {
		struct eng *e = br_eng_live(b, it->ref);
		if (e)
			br_eng_dead(b, e, "its process exited", false);
		break;
	}
	case IT_EVENT:
		br_publish_named(b, it->ev_kind, it->ev_engine, it->err, it->ms, it->job_id);
		break;
	}
	free(it);
}

static void *loop(void *arg)
{
	struct broker *b = arg;
	pthread_mutex_lock(&b->mu);
	for (;;) {
		while (b->head) {
			struct item *it = b->head;
			b->head = it->next;
			if (!b->head)
				b->tail = NULL;
			pthread_mutex_unlock(&b->mu);
			handle(b, it);
			pthread_mutex_lock(&b->mu);
		}
		if (atomic_load(&b->stopping))
			break;
		pthread_mutex_unlock(&b->mu);
		pump(b);
		pthread_mutex_lock(&b->mu);
		if (b->head)
			continue;
		if (b->next_wake <= baton_now_s())
			continue;
		baton_cond_wait_until(&b->cv, &b->mu, b->next_wake);
	}
	/* Stopping: every waiting request gets its answer. From here on
	 * broker_call() answers at once. */
	b->loop_done = true;
	pthread_mutex_unlock(&b->mu);
	for (size_t i = 0; i < MAX_OPS; i++)
		if (b->ops[i].used)
			br_op_fail(b, &b->ops[i], BATON_ECLOSED, "the broker is shutting down");
	br_inbox_close(b);
	return NULL;
}

/* ---- the socket directory and the sockets in it -------------------------------------
 *
 * Whoever can write the directory can put a socket of their own in place
 * of ours (engines and the CLI would then talk to them), or a link where
 * the broker writes its state. So the directory must be ours (or root's
 * with the sticky bit, like /tmp) and writable by no one else; one of ours
 * that is group- or world-writable is fixed, anything else refused. And
 * the sockets are checked now and then to still be the ones we bound. */

/* The directory of an ipc:// socket: whoever can write it could put
 * their socket where the broker's is. proto/base's trust rule, as for
 * arenas: a real directory, ours or root's, writable by no one else but
 * root's sticky /tmp and /dev/shm. It never chmods: the directory may be
 * /tmp, which everyone needs as it is (nginx, Redis and PostgreSQL set
 * only their socket's mode). */
static int sock_dir_check(const char *url, char *err, size_t errlen)
{
	if (strncmp(url, "ipc://", 6) != 0)
		return 0;
	return baton_trust_dir_of(url + 6, "the socket directory", err, errlen);
}

static void sock_id_take(struct broker *b, int i, const char *url)
{
	struct stat st;
	if (strncmp(url, "ipc://", 6) == 0 && lstat(url + 6, &st) == 0 && S_ISSOCK(st.st_mode)) {
		b->sock_id[i].dev = st.st_dev;
		b->sock_id[i].ino = st.st_ino;
		b->sock_id[i].set = true;
	}
}

int broker_sockets_check(struct broker *b, char *err, size_t errlen)
{
	const char *url[2] = { b->cfg.control, b->cfg.events };
	for (int i = 0; i < 2; i++) {
		struct stat st;
		if (!b->sock_id[i].set)
			continue;
		if (lstat(url[i] + 6, &st) != 0) {
			snprintf(err, errlen, "%s was removed: no one can reach this broker there", url[i] + 6);
			return BATON_ESTATE;
		}
		if (st.st_dev != b->sock_id[i].dev || st.st_ino != b->sock_id[i].ino) {
			snprintf(err, errlen, "%s was replaced: it is not the socket this broker listens on", url[i] + 6);
			return BATON_ESTATE;
		}
	}
	return 0;
}

int broker_open(const struct broker_config *cfg, struct broker **out, char *err, size_t errlen)
{
	int rc;
	*out = NULL;
	struct broker *b = calloc(1, sizeof *b);
	if (!b)
		return BATON_ENOMEM;
	b->cfg = *cfg;
	pthread_mutex_init(&b->mu, NULL);
	baton_cond_init(&b->cv);
	pthread_mutex_init(&b->omu, NULL);
	pthread_mutex_init(&b->jmu, NULL);
	pthread_cond_init(&b->jcv, NULL);
	pthread_mutex_init(&b->wmu, NULL);
	pthread_mutex_init(&b->tmu, NULL);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		b->watches[i].fd = -1;
	b->tags = calloc(MAX_TAGS, sizeof *b->tags);
	if (!b->tags) {
		free(b);
		return BATON_ENOMEM;
	}
	b->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (b->wake_fd < 0) {
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		rc = BATON_EIO;
		goto fail;
	}
	if (cfg->nvml && broker_nvml_init() == 0)
		br_blog("NVML loaded: GPU memory is read from the driver");
	if (!cfg->state_file_set && strncmp(cfg->control, "ipc://", 6) == 0) {
		const char *slash = strrchr(cfg->control + 6, '/');
		if (slash)
			snprintf(b->cfg.state_file, sizeof b->cfg.state_file, "%.*s/broker.state",
			    (int)(slash - (cfg->control + 6)), cfg->control + 6);
	}
	br_pins_load(b);
	if (proto_ipc_dir(cfg->control) || proto_ipc_dir(cfg->events)) {
		snprintf(err, errlen, "cannot create the socket directory for %s or %s: %s", cfg->control,
		    cfg->events, strerror(errno));
		rc = BATON_EIO;
		goto fail;
	}
	if ((rc = sock_dir_check(cfg->control, err, errlen)) != 0 ||
	    (rc = sock_dir_check(cfg->events, err, errlen)) != 0)
		goto fail;
	/* Requests to the broker are small (its largest, register, is under
	 * 2 KiB): a frame that says more is refused on its length, before
	 * nng allocates for it (issue 28: 40 half-sent 64 MiB frames made the
	 * broker hold 1,290 MiB). The engines' sockets keep the protocol's
	 * bound: GEN carries up to 64 MiB of input. */
	struct proto_opts so = { .on_pipe = br_on_pipe, .pipe_arg = b, .recvmax = BROKER_RECV_MAX };
	if ((rc = proto_server_open(&b->srv, cfg->control, &so)) != 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", cfg->control, baton_strerror(rc));
		goto fail;
	}
	if ((rc = proto_pub_open(&b->pub, cfg->events, NULL)) != 0) {
		snprintf(err, errlen, "cannot publish events on %s: %s", cfg->events, baton_strerror(rc));
		goto fail;
	}
	sock_id_take(b, 0, cfg->control);
	sock_id_take(b, 1, cfg->events);
	br_externals_from_config(b); /* after the events socket: each is published */
	*out = b;
	return 0;
fail:
	broker_close(b);
	return rc;
}

/* Requests that come before this wait: in the socket (no receiver yet),
 * or in the inbox (broker_call). */
int broker_start(struct broker *b, char *err, size_t errlen)
{
	if (b->have_loop)
		return 0;
	if (pthread_create(&b->loop_th, NULL, loop, b) != 0)
		goto nothread;
	b->have_loop = 1;
	if (br_watch_start(b) || br_workers_start(b) || br_receivers_start(b))
		goto nothread;
	return 0;
nothread:
	snprintf(err, errlen, "cannot start threads");
	return BATON_ENOMEM;
}

void broker_stop(struct broker *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	atomic_store(&b->stopping, true);
	pthread_cond_signal(&b->cv);
	bool started = b->have_loop;
	pthread_mutex_unlock(&b->mu);
	if (!started)
		br_inbox_close(b); /* nobody else will answer what faces posted */
}

void broker_close(struct broker *b)
{
	if (!b)
		return;
	broker_stop(b);
	if (b->have_loop)
		pthread_join(b->loop_th, NULL);
	/* Receivers: blocked receives end with ECLOSED. One may have posted a
	 * request after the loop ended: answer those here. */
	if (b->srv)
		proto_server_shutdown(b->srv);
	bool joined[RECEIVERS] = { false };
	for (;;) {
		br_inbox_close(b);
		bool all = true;
		for (int i = 0; i < b->n_recv; i++) {
			if (!joined[i] && pthread_tryjoin_np(b->recv_th[i], NULL) == 0)
				joined[i] = true;
			all = all && joined[i];
		}
		if (all)
			break;
		usleep(1000);
	}
	for (int i = 0; i < RECEIVERS; i++)
		proto_ctx_close(b->ctx[i]);
	/* Workers: connections shut down, so calls in flight end now. */
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		br_eng_forget_conn(&b->eng[i]);
	br_workers_stop(b);
	while (atomic_load(&b->hooks_running) > 0)
		usleep(1000); /* external engines' hooks end at `stopping` (hooks.c) */
	br_inbox_close(b); /* their last results */
	br_watch_stop(b);
	proto_server_close(b->srv);
	proto_pub_close(b->pub);
	if (b->wake_fd >= 0)
		close(b->wake_fd);
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->omu);
	pthread_mutex_destroy(&b->jmu);
	pthread_cond_destroy(&b->jcv);
	pthread_mutex_destroy(&b->wmu);
	explicit_bzero(b->http_tokens, sizeof b->http_tokens);
	pthread_mutex_destroy(&b->tmu);
	free(b->tags);
	free(b);
}

const char *broker_control_url(const struct broker *b)
{
	return proto_server_url(b->srv);
}

const char *broker_events_url(const struct broker *b)
{
	return proto_pub_url(b->pub);
}

int broker_engine_http_token(struct broker *b, const char *name, char *out, size_t n)
{
	int rc = BATON_ENOTFOUND;
	out[0] = 0;
	pthread_mutex_lock(&b->tmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->http_tokens[i].name[0] && strcmp(b->http_tokens[i].name, name) == 0) {
			rc = (size_t)snprintf(out, n, "%s", b->http_tokens[i].token) < n ? 0 : BATON_ETOOBIG;
			break;
		}
	pthread_mutex_unlock(&b->tmu);
	return rc;
}
