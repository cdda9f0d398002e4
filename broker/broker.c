/*
 * broker.c: the broker daemon (see broker.h).
 *
 * Threads and who owns what:
 *
 *   receivers  RECEIVERS threads, one nng context each. A receiver takes a
 *              request, posts it to the decision thread with its own
 *              `waiter`, and sleeps until the decision thread has filled
 *              the waiter's reply; then it sends it. A request that waits
 *              for memory (acquire, refill, handoff) keeps its receiver,
 *              so there are enough of them that heartbeats never queue
 *              behind those.
 *   decision   one thread, the only one that reads or writes the registry
 *              (GPUs, engines, operations in progress). It sleeps on its
 *              inbox (requests, command results, deaths, pipe events) with
 *              a timeout for the next timer (deadlines, retries, idle
 *              release, heartbeat timeouts).
 *   workers    WORKERS threads running commands to engines (release,
 *              refill, vram) with proto_client_call on the engine's
 *              control socket; each result comes back through the inbox.
 *              Nothing waits for an engine's acknowledgement anywhere else,
 *              so a slow engine never delays another engine's heartbeat.
 *   watcher    polls a pidfd per engine (pidfd_open), so a dead engine is
 *              seen at once, not at its heartbeat timeout.
 *   http       the HTTP server's threads (http.c) post requests like the
 *              receivers do (broker_call) and wait for the reply; the
 *              decision thread hands every event to broker_http_event().
 *
 * Engines are referred to by slot + generation (struct eref); a result
 * for a slot whose generation moved on is applied to nothing. The only
 * things shared with workers are refcounted connections (struct conn).
 *
 * Accounting, per device: held = sum over live engines of (mapped + grant),
 * where grant is what was granted and not yet seen used. An engine's
 * mapped bytes come from its messages, each carrying the epoch of the
 * state it describes; older news than what was applied is dropped, so a
 * heartbeat built before a command never overwrites the command's result.
 * free = total - other - held, where `other` is the device memory used
 * outside the caches (dense tensors, contexts, other programs), measured
 * from engines' reports (or NVML) whenever nothing is in flight on the
 * device; with NVML, free is also at most NVML's free minus the grants not
 * yet used. A configured total_mib caps what the caches hold together:
 * free is then also at most total_mib - held. available = free - reserve.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker_int.h"

#define RECEIVERS 64
#define WORKERS 8
#define MAX_OPS 512
#define MIB (1024ull * 1024ull)
#define BUSY_RETRY_S 0.005     /* ask a busy engine again after this */
#define ERROR_RETRY_S 0.1      /* after a failed command */
#define GRANT_TTL_S 30.0       /* a grant never reported used is dropped */
#define PROBE_S 1.0            /* a command unanswered this long: ask the engine's status */
#define LOST_RESENDS 3         /* an operation whose command is lost more often fails */
#define DEATH_SETTLE_S 1.0     /* after a death, device figures may predate it */
#define TICK_S 0.1
#define LEND_PAUSE_S 0.5       /* between two lends to one engine */
#define LEND_BACKOFF_S 5.0     /* after a lend it could not fully use, or a failed one */
#define MAX_TAGS 1024

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void blog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void blog(const char *fmt, ...)
{
	va_list ap;
	char line[1024];
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "baton-broker: %s\n", line);
}

/* ---- replies owned by the request's waiter ------------------------------------ */

struct rbuf {
	struct baton_msg m;
	char text[512];
	char s1[BROKER_NAME_MAX];
	void *block;                  /* status arrays and their strings */
};

static void rbuf_reset(struct rbuf *rb)
{
	free(rb->block);
	memset(rb, 0, sizeof *rb);
}

struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	struct rbuf rb;
};

/* ---- connections to engines (shared with workers, refcounted) ------------------ */

struct conn {
	struct proto_client *cli;
	atomic_int refs;
};

static struct conn *conn_open(const char *url)
{
	struct conn *c = calloc(1, sizeof *c);
	if (!c)
		return NULL;
	struct proto_opts o = { .resend_ms = -1 };
	if (proto_client_open(&c->cli, url, &o) != 0) {
		free(c);
		return NULL;
	}
	atomic_init(&c->refs, 1);
	return c;
}

static struct conn *conn_get(struct conn *c)
{
	if (c)
		atomic_fetch_add(&c->refs, 1);
	return c;
}

static void conn_put(struct conn *c)
{
	if (c && atomic_fetch_sub(&c->refs, 1) == 1) {
		proto_client_close(c->cli);
		free(c);
	}
}

/* ---- registry (decision thread only) ----------------------------------------- */

struct eref {
	uint32_t slot, gen;
};

struct gpu {
	char uuid[BROKER_NAME_MAX];
	uint64_t dev_total;   /* the device's size: NVML or engines' capacity */
	uint64_t cap;         /* configured total_mib, 0: none */
	uint64_t reserve;
	uint64_t other;       /* device memory used outside the caches */
	int nvml;             /* NVML knows this uuid */
	bool no_lend;         /* lend = false */
	double death_at;      /* an engine on it was last found dead */
};

enum { ES_FREE = 0, ES_LIVE, ES_DEAD };

struct eng {
	uint32_t gen;
	int st;               /* ES_* */
	char name[BROKER_NAME_MAX], model[BROKER_NAME_MAX], ctl[BROKER_URL_MAX];
	char state[32];
	int pid, pidfd_watched;
	uint32_t pipe;
	size_t gpu;
	uint64_t floor, ceiling, capacity;
	int32_t reg_priority;
	uint64_t resident, mapped, dev_free;
	bool busy, lost, no_shrink, no_release;
	double idle_since, last_seen, registered_at;
	uint64_t acct_epoch;  /* epoch of the newest state applied */
	uint64_t grant, grant_epoch;
	double grant_at;
	/* the one command in flight to it */
	bool in_flight;
	uint64_t job_id;
	double job_t0;
	double retry_after;
	/* a STATUS probe in flight (a command went unanswered) */
	bool probing;
	double probe_at;
	/* the last acquire granted: a resend of it (same id) gets the same */
	uint64_t acq_id, acq_granted, acq_epoch;
	double last_refill_gbps;
	uint64_t requests;    /* GEN requests it answered (its heartbeats say) */
	struct conn *conn;
	/* an on-demand handoff to it, published once its refill is reported */
	bool ho_pending;
	uint64_t ho_epoch;
	double ho_t0, ho_decide_ms, ho_release_ms;
	char ho_from[192];
	/* its peer tier: memory of another device lent to it (engine
	 * --peer-device). peer_mapped + peer_grant count as used there. */
	bool has_peer, no_peer;
	size_t peer_gpu;
	uint64_t peer_want;   /* bytes a peer tier could use (registered) */
	uint64_t peer_mapped; /* what it holds there now (its own word) */
	uint64_t peer_grant;  /* a lend in flight: asked, not acknowledged yet */
	double peer_retry_after;
};

enum op_kind { OP_ACQUIRE = 1, OP_REFILL, OP_RELEASE, OP_VRAM, OP_HANDOFF };
enum op_phase {
	P_VICTIM = 1,    /* handoff: command the `from` engine */
	P_VICTIM_WAIT,
	P_WAIT,          /* queued on the device for memory */
	P_CMD,           /* command the target (refill, release, vram) */
	P_CMD_WAIT,
};

struct op {
	bool used;
	uint64_t seq;         /* FIFO order */
	enum op_kind kind;
	enum op_phase phase;
	struct waiter *w;
	enum proto_op req_op;
	uint64_t req_id;
	struct eref target, victim;
	size_t gpu;
	uint64_t bytes;       /* wanted beyond what the target maps */
	uint64_t reserve_mib; /* vram */
	enum policy_kind victim_kind;
	uint64_t victim_bytes;
	double t0, deadline, t_decided, t_victim_done, t_granted, t_cmd0;
	int outstanding;      /* reclaim commands in flight for it */
	int resends;          /* its command was lost and sent again */
	uint64_t granted;     /* refill, handoff: granted to the target, for its command */
	bool reclaimed;       /* something was taken for it */
	double t_reclaimed;   /* the last acknowledgement came */
	char victims[192];    /* "b (release), c (shrink)" */
	char why[256];        /* last reason it could not be served */
};

enum item_kind { IT_REQ = 1, IT_DONE, IT_PIPE_REM, IT_DEATH };

struct item {
	struct item *next;
	enum item_kind kind;
	/* IT_REQ */
	struct baton_msg req;
	struct waiter *w;
	/* IT_DONE */
	uint64_t job_id;
	int rc;
	bool lost;            /* no reply will come (a probe says), made by on_probe */
	struct baton_msg rep;
	char err[256];
	double ms;
	/* IT_PIPE_REM, IT_DEATH */
	uint32_t pipe;
	int pid;
	struct eref ref;
};

struct job {
	struct job *next;
	uint64_t id;
	struct conn *conn;
	enum proto_op op;
	char name[BROKER_NAME_MAX];
	uint64_t epoch, reserve_mib;
	uint64_t peer_mib;                /* peer: the loan's new size */
	char peer_gpu[BROKER_NAME_MAX];   /* peer: the lending device */
	int timeout_ms;
};

struct watch {
	int fd;               /* pidfd, -1: free */
	int pid;
	struct eref ref;
	bool remove;
};

struct jobtag {
	uint64_t job;
	uint64_t op_seq;        /* the op it serves, 0: none (idle release) */
	enum proto_op cmd;
	struct eref eng;
	char reason[160];
	uint64_t bytes;         /* shrink: bytes asked */
	int victim;             /* a reclaim or a handoff's `from` */
	uint64_t probed;        /* STATUS: the command it asks about */
};

struct broker {
	struct broker_config cfg;
	struct proto_server *srv;
	struct proto_pub *pub;
	struct broker_http *http;     /* NULL: no HTTP server */
	atomic_bool stopping;

	/* inbox of the decision thread */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct item *head, *tail;
	bool loop_done;

	/* jobs for workers */
	pthread_mutex_t jmu;
	pthread_cond_t jcv;
	struct job *jhead, *jtail;
	bool jstop;

	/* pidfds */
	pthread_mutex_t wmu;
	struct watch watches[BROKER_MAX_ENGINES];
	int wake_fd;

	pthread_t loop_th, watch_th, recv_th[RECEIVERS], work_th[WORKERS];
	struct proto_ctx *ctx[RECEIVERS];
	int n_recv, n_work, have_loop, have_watch;

	/* registry: decision thread only */
	struct gpu gpus[BROKER_MAX_GPUS];
	size_t n_gpus;
	struct eng eng[BROKER_MAX_ENGINES];
	struct op ops[MAX_OPS];
	uint64_t op_seq, job_seq, epoch, seq;
	struct {
		char name[BROKER_NAME_MAX];
		bool pinned;
	} pins[BROKER_MAX_ENGINES];
	size_t n_pins;
	double next_tick;
	double next_wake;     /* the earliest timer of this round */
	struct jobtag *tags;  /* commands in flight: what each one is for */
};

/* ---- events ------------------------------------------------------------------------ */

static void publish(struct broker *b, const char *kind, const struct eng *e, const char *reason,
    double ms, uint64_t bytes)
{
	struct baton_msg ev;
	proto_msg_init(&ev, PROTO_OP_EVENT);
	ev.seq = ++b->seq;
	ev.time_ms = wall_ms();
	ev.kind = kind;
	ev.engine = e ? e->name : "";
	ev.gpu = e ? b->gpus[e->gpu].uuid : "";
	ev.state = e ? e->state : "";
	ev.reason = reason ? reason : "";
	if (ms >= 0) {
		ev.ms = ms;
		proto_set(&ev, PF_MS);
	}
	ev.bytes = bytes;
	proto_set(&ev, PF_BYTES);
	if (b->http)
		broker_http_event(b->http, &ev);
	int rc = proto_publish(b->pub, &ev);
	if (rc)
		blog("event %s not published: %s", kind, baton_strerror(rc));
}

/* ---- inbox --------------------------------------------------------------------- */

static void post(struct broker *b, struct item *it)
{
	pthread_mutex_lock(&b->mu);
	it->next = NULL;
	if (b->tail)
		b->tail->next = it;
	else
		b->head = it;
	b->tail = it;
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

static void waiter_done(struct waiter *w)
{
	pthread_mutex_lock(&w->mu);
	w->done = 1;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* An error reply into the waiter; the receiver sends it. */
static void reply_error(struct waiter *w, enum proto_op op, uint64_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void reply_error(struct waiter *w, enum proto_op op, uint64_t id, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(w->rb.text, sizeof w->rb.text, fmt, ap);
	va_end(ap);
	proto_reply_error(&w->rb.m, op, id, err, w->rb.text);
	waiter_done(w);
}

/* ---- receivers ------------------------------------------------------------------ */

struct recv_arg {
	struct broker *b;
	struct proto_ctx *ctx;
};

static void *receiver(void *arg)
{
	struct broker *b = ((struct recv_arg *)arg)->b;
	struct proto_ctx *ctx = ((struct recv_arg *)arg)->ctx;
	free(arg);
	struct waiter w;
	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	memset(&w.rb, 0, sizeof w.rb);
	while (!atomic_load(&b->stopping)) {
		struct item *it = calloc(1, sizeof *it);
		if (!it) {
			sleep(1);
			continue;
		}
		struct proto_diag d;
		int rc = proto_ctx_recv(ctx, &it->req, 500, &d);
		if (rc) {
			free(it);
			if (rc == BATON_ECLOSED)
				break;
			if (rc != BATON_ETIMEDOUT)
				blog("bad request: %s: %s", baton_strerror(rc), d.text);
			continue;
		}
		w.done = 0;
		rbuf_reset(&w.rb);
		it->kind = IT_REQ;
		it->w = &w;
		struct baton_msg *req = &it->req;
		enum proto_op op = req->op;
		uint64_t id = req->id;
		post(b, it); /* the decision thread frees it (and the request) */
		pthread_mutex_lock(&w.mu);
		while (!w.done)
			pthread_cond_wait(&w.cv, &w.mu);
		pthread_mutex_unlock(&w.mu);
		if (!w.rb.m.reply)
			proto_reply_error(&w.rb.m, op, id, BATON_EINTERNAL, "no reply was made");
		rc = proto_ctx_reply(ctx, &w.rb.m);
		if (rc && rc != BATON_ECLOSED)
			blog("reply to %s failed: %s", proto_op_name(op), baton_strerror(rc));
		rbuf_reset(&w.rb);
	}
	rbuf_reset(&w.rb);
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
	return NULL;
}

/* The HTTP server's way in (broker_int.h): one request, as a receiver
 * would post it, answered ECLOSED once the decision thread is gone. */
void broker_call(struct broker *b, const struct baton_msg *req,
    void (*fn)(void *arg, const struct baton_msg *rep), void *arg)
{
	struct waiter w;
	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	memset(&w.rb, 0, sizeof w.rb);
	w.done = 0;
	struct item *it = calloc(1, sizeof *it);
	bool posted = false;
	if (it) {
		it->kind = IT_REQ;
		it->w = &w;
		it->req = *req; /* owns nothing: proto_msg_free() leaves it alone */
		pthread_mutex_lock(&b->mu);
		if (!b->loop_done) {
			it->next = NULL;
			if (b->tail)
				b->tail->next = it;
			else
				b->head = it;
			b->tail = it;
			pthread_cond_signal(&b->cv);
			posted = true;
		}
		pthread_mutex_unlock(&b->mu);
	}
	if (posted) {
		pthread_mutex_lock(&w.mu);
		while (!w.done)
			pthread_cond_wait(&w.cv, &w.mu);
		pthread_mutex_unlock(&w.mu);
	} else {
		int code = it ? BATON_ECLOSED : BATON_ENOMEM;
		free(it);
		proto_reply_error(&w.rb.m, req->op, req->id, code,
		    code == BATON_ECLOSED ? "the broker is shutting down" : "out of memory");
	}
	if (!w.rb.m.reply)
		proto_reply_error(&w.rb.m, req->op, req->id, BATON_EINTERNAL, "no reply was made");
	fn(arg, &w.rb.m);
	rbuf_reset(&w.rb);
	pthread_cond_destroy(&w.cv);
	pthread_mutex_destroy(&w.mu);
}

/* ---- workers ---------------------------------------------------------------------- */

static void *worker(void *arg)
{
	struct broker *b = arg;
	for (;;) {
		pthread_mutex_lock(&b->jmu);
		while (!b->jhead && !b->jstop)
			pthread_cond_wait(&b->jcv, &b->jmu);
		struct job *j = b->jhead;
		if (!j) {
			pthread_mutex_unlock(&b->jmu);
			break;
		}
		b->jhead = j->next;
		if (!b->jhead)
			b->jtail = NULL;
		pthread_mutex_unlock(&b->jmu);

		struct item *it = calloc(1, sizeof *it);
		struct baton_msg req;
		struct proto_diag d;
		proto_msg_init(&req, j->op);
		if (j->op != PROTO_OP_STATUS) { /* an engine's STATUS takes no fields */
			req.name = j->name;
			proto_set(&req, PF_NAME);
			req.epoch = j->epoch;
			proto_set(&req, PF_EPOCH);
		}
		if (j->op == PROTO_OP_VRAM)
			req.reserve_mib = j->reserve_mib;
		if (j->op == PROTO_OP_PEER) {
			req.peer_mib = j->peer_mib;
			req.peer_gpu = j->peer_gpu;
			proto_set(&req, PF_PEER_GPU);
		}
		double t0 = now_s();
		struct baton_msg rep;
		int rc = proto_client_call(j->conn->cli, &req, &rep, j->timeout_ms, &d);
		if (!it) {
			proto_msg_free(&rep);
			conn_put(j->conn);
			free(j);
			continue;
		}
		it->kind = IT_DONE;
		it->job_id = j->id;
		it->rc = rc;
		it->rep = rep;
		it->ms = (now_s() - t0) * 1e3;
		snprintf(it->err, sizeof it->err, "%s", rc ? d.text : "");
		conn_put(j->conn);
		free(j);
		post(b, it);
	}
	return NULL;
}

static int queue_job(struct broker *b, struct eng *e, enum proto_op op, uint64_t reserve_mib,
    uint64_t *job_id)
{
	struct job *j = calloc(1, sizeof *j);
	if (!j || !e->conn) {
		free(j);
		return BATON_ENOMEM;
	}
	j->id = ++b->job_seq;
	j->conn = conn_get(e->conn);
	j->op = op;
	snprintf(j->name, sizeof j->name, "%s", e->name);
	j->reserve_mib = reserve_mib;
	if (op == PROTO_OP_PEER) {
		j->peer_mib = reserve_mib;
		snprintf(j->peer_gpu, sizeof j->peer_gpu, "%s", b->gpus[e->peer_gpu].uuid);
	}
	j->timeout_ms = b->cfg.command_timeout_ms;
	if (op == PROTO_OP_STATUS) {
		/* a probe: beside the command in flight, not one itself */
		j->timeout_ms = (int)(PROBE_S * 1e3);
		e->probing = true;
		e->probe_at = now_s();
	} else {
		j->epoch = ++b->epoch;
		e->in_flight = true;
		e->job_id = j->id;
		e->job_t0 = now_s();
	}
	*job_id = j->id;
	pthread_mutex_lock(&b->jmu);
	if (b->jtail)
		b->jtail->next = j;
	else
		b->jhead = j;
	b->jtail = j;
	pthread_cond_signal(&b->jcv);
	pthread_mutex_unlock(&b->jmu);
	return 0;
}

/* ---- pidfd watcher --------------------------------------------------------------- */

static int pidfd_open_(int pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	(void)pid;
	errno = ENOSYS;
	return -1;
#endif
}

static void watch_add(struct broker *b, int pid, struct eref ref)
{
	int fd = pid > 0 ? pidfd_open_(pid) : -1;
	if (fd < 0)
		return; /* the heartbeat timeout and pipe events remain */
	pthread_mutex_lock(&b->wmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		if (b->watches[i].fd < 0) {
			b->watches[i] = (struct watch){ .fd = fd, .pid = pid, .ref = ref };
			fd = -1;
			break;
		}
	}
	pthread_mutex_unlock(&b->wmu);
	if (fd >= 0)
		close(fd);
	uint64_t one = 1;
	if (write(b->wake_fd, &one, sizeof one) < 0) {
		/* the watcher wakes at its next timeout anyway */
	}
}

static void watch_remove(struct broker *b, struct eref ref)
{
	pthread_mutex_lock(&b->wmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->watches[i].fd >= 0 && b->watches[i].ref.slot == ref.slot &&
		    b->watches[i].ref.gen == ref.gen)
			b->watches[i].remove = true;
	pthread_mutex_unlock(&b->wmu);
	uint64_t one = 1;
	if (write(b->wake_fd, &one, sizeof one) < 0) {
		/* see watch_add */
	}
}

static void *watcher(void *arg)
{
	struct broker *b = arg;
	struct pollfd pf[BROKER_MAX_ENGINES + 1];
	struct watch cp[BROKER_MAX_ENGINES + 1];
	while (!atomic_load(&b->stopping)) {
		size_t n = 0;
		pf[n++] = (struct pollfd){ .fd = b->wake_fd, .events = POLLIN };
		pthread_mutex_lock(&b->wmu);
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
			struct watch *w = &b->watches[i];
			if (w->fd < 0)
				continue;
			if (w->remove) {
				close(w->fd); /* only this thread closes, so poll never sees a reused fd */
				w->fd = -1;
				w->remove = false;
				continue;
			}
			cp[n] = *w;
			pf[n++] = (struct pollfd){ .fd = w->fd, .events = POLLIN };
		}
		pthread_mutex_unlock(&b->wmu);
		int r = poll(pf, n, 500);
		if (r <= 0)
			continue;
		if (pf[0].revents) {
			uint64_t v;
			if (read(b->wake_fd, &v, sizeof v) < 0) {
				/* nonblocking: nothing to read */
			}
		}
		for (size_t i = 1; i < n; i++) {
			if (!pf[i].revents)
				continue;
			pthread_mutex_lock(&b->wmu);
			for (size_t k = 0; k < BROKER_MAX_ENGINES; k++)
				if (b->watches[k].fd == cp[i].fd)
					b->watches[k].remove = true;
			pthread_mutex_unlock(&b->wmu);
			struct item *it = calloc(1, sizeof *it);
			if (it) {
				it->kind = IT_DEATH;
				it->ref = cp[i].ref;
				it->pid = cp[i].pid;
				post(b, it);
			}
		}
	}
	pthread_mutex_lock(&b->wmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->watches[i].fd >= 0) {
			close(b->watches[i].fd);
			b->watches[i].fd = -1;
		}
	pthread_mutex_unlock(&b->wmu);
	return NULL;
}

/* Runs on an nng thread: record and hand over. */
static void on_pipe(void *arg, const struct proto_pipe_event *ev)
{
	struct broker *b = arg;
	if (ev->ev != PROTO_PIPE_REM)
		return;
	struct item *it = calloc(1, sizeof *it);
	if (!it)
		return;
	it->kind = IT_PIPE_REM;
	it->pipe = ev->pipe;
	it->pid = ev->pid;
	post(b, it);
}

/* ---- registry helpers ------------------------------------------------------------ */

/* Whether pid is a live (not zombie) process. */
static int pid_alive(int pid)
{
	if (pid <= 0)
		return 0;
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return kill(pid, 0) == 0 || errno == EPERM;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ')
		return 1;
	return p[2] != 'Z' && p[2] != 'X';
}

static struct eng *eng_get(struct broker *b, struct eref r)
{
	if (r.slot >= BROKER_MAX_ENGINES)
		return NULL;
	struct eng *e = &b->eng[r.slot];
	return e->st != ES_FREE && e->gen == r.gen ? e : NULL;
}

static struct eng *eng_live(struct broker *b, struct eref r)
{
	struct eng *e = eng_get(b, r);
	return e && e->st == ES_LIVE ? e : NULL;
}

static struct eref eref_of(struct broker *b, const struct eng *e)
{
	return (struct eref){ (uint32_t)(e - b->eng), e->gen };
}

static struct eng *eng_by_name(struct broker *b, const char *name)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->eng[i].st != ES_FREE && strcmp(b->eng[i].name, name) == 0)
			return &b->eng[i];
	return NULL;
}

static size_t gpu_find_or_add(struct broker *b, const char *uuid)
{
	for (size_t i = 0; i < b->n_gpus; i++)
		if (strcmp(b->gpus[i].uuid, uuid) == 0)
			return i;
	if (b->n_gpus == BROKER_MAX_GPUS)
		return (size_t)-1;
	struct gpu *g = &b->gpus[b->n_gpus];
	memset(g, 0, sizeof *g);
	snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
	const struct broker_gpu_conf *gc = broker_config_gpu(&b->cfg, uuid);
	if (gc) {
		g->reserve = gc->reserve_bytes;
		g->cap = gc->total_bytes;
		g->no_lend = gc->no_lend;
	}
	uint64_t fr, tot;
	if (b->cfg.nvml && broker_nvml_mem(uuid, &fr, &tot) == 0) {
		g->nvml = 1;
		g->dev_total = tot;
	}
	blog("device %s: %s, reserve %.0f MiB%s", uuid, g->nvml ? "NVML" : "sizes from its engines",
	    (double)g->reserve / MIB, g->cap ? ", managed size from the configuration" : "");
	return b->n_gpus++;
}

/* What the broker hands out on this device: the configured total_mib
 * (a cap on the caches together), else the device's size. */
static uint64_t gpu_total(const struct gpu *g)
{
	if (g->cap && (g->cap < g->dev_total || g->dev_total == 0))
		return g->cap;
	return g->dev_total;
}

static const struct broker_engine_conf *conf_of(struct broker *b, const struct eng *e)
{
	return broker_config_engine(&b->cfg, e->name);
}

static int32_t eng_priority(struct broker *b, const struct eng *e)
{
	const struct broker_engine_conf *c = conf_of(b, e);
	return c && c->has_priority ? c->priority : e->reg_priority;
}

static bool eng_pinned(struct broker *b, const struct eng *e)
{
	for (size_t i = 0; i < b->n_pins; i++)
		if (strcmp(b->pins[i].name, e->name) == 0)
			return b->pins[i].pinned;
	const struct broker_engine_conf *c = conf_of(b, e);
	return c && c->pinned;
}

static double eng_idle_timeout(struct broker *b, const struct eng *e)
{
	const struct broker_engine_conf *c = conf_of(b, e);
	return c && c->idle_release_s >= 0 ? c->idle_release_s : b->cfg.idle_release_s;
}

/* held, free and available of a device, in bytes. */
struct gpu_view {
	uint64_t total, held, grants, free_b, avail;
	uint64_t lent;        /* peer tiers of other devices' engines on it (in held) */
	uint64_t dev_free;    /* the device's own free memory (not capped), best known */
};

static void gpu_view(struct broker *b, size_t gi, struct gpu_view *v)
{
	struct gpu *g = &b->gpus[gi];
	memset(v, 0, sizeof *v);
	v->total = gpu_total(g);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st != ES_LIVE || e->gpu != gi)
			continue;
		v->held += e->mapped + e->grant;
		v->grants += e->grant;
	}
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st == ES_LIVE && e->has_peer && e->peer_gpu == gi) {
			v->lent += e->peer_mapped + e->peer_grant;
			v->grants += e->peer_grant; /* not in NVML's free yet either */
		}
	}
	v->held += v->lent;
	uint64_t used = v->held + g->other;
	v->free_b = g->dev_total > used ? g->dev_total - used : 0;
	v->dev_free = v->free_b;
	if (v->total < g->dev_total) { /* capped: the caches' own budget */
		uint64_t left = v->total > v->held ? v->total - v->held : 0;
		if (left < v->free_b)
			v->free_b = left;
	}
	uint64_t fr, tot;
	if (g->nvml && broker_nvml_mem(g->uuid, &fr, &tot) == 0) {
		uint64_t nf = fr > v->grants ? fr - v->grants : 0;
		v->dev_free = nf;
		if (nf < v->free_b)
			v->free_b = nf;
	}
	v->avail = v->free_b > g->reserve ? v->free_b - g->reserve : 0;
}

/* Nothing in flight on the device: the engines' figures add up. */
static bool gpu_quiet(struct broker *b, size_t gi)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st == ES_LIVE && e->gpu == gi && (e->in_flight || e->grant))
			return false;
		if (e->st == ES_LIVE && e->has_peer && e->peer_gpu == gi && (e->in_flight || e->peer_grant))
			return false;
	}
	return true;
}

/* Learns `other` from one engine's view of its device. */
static void learn_other(struct broker *b, struct eng *e, uint64_t dev_free)
{
	struct gpu *g = &b->gpus[e->gpu];
	if (!gpu_quiet(b, e->gpu))
		return;
	uint64_t fr = dev_free, tot = g->dev_total;
	if (g->nvml && broker_nvml_mem(g->uuid, &fr, &tot) != 0)
		return;
	if (tot == 0)
		return;
	uint64_t mapped = 0;
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *x = &b->eng[i];
		if (x->st == ES_LIVE && x->gpu == e->gpu)
			mapped += x->mapped;
		if (x->st == ES_LIVE && x->has_peer && x->peer_gpu == e->gpu)
			mapped += x->peer_mapped;
	}
	uint64_t used = tot > fr ? tot - fr : 0;
	uint64_t other = used > mapped ? used - mapped : 0;
	/* Right after a death, a figure measured before it (a heartbeat on its
	 * way, a driver not done freeing) still holds the dead engine's memory,
	 * which no longer counts in `mapped`: it would pass for `other` and
	 * stay until the next quiet report. A death only frees memory, so
	 * `other` may fall then, not rise. */
	if (other > g->other && now_s() - g->death_at < DEATH_SETTLE_S)
		return;
	g->other = other;
}

/* Memory came free on device gi: engines that borrow there may ask for
 * more at once (a lend they could not fully use waits LEND_BACKOFF_S
 * otherwise). */
static void lend_wake(struct broker *b, size_t gi)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		struct eng *x = &b->eng[i];
		if (x->st == ES_LIVE && x->has_peer && x->peer_gpu == gi)
			x->peer_retry_after = 0;
	}
}

/* Applies what an engine says about itself, unless older than what we
 * know (its epoch is the epoch of the state it describes). */
static void apply_state(struct broker *b, struct eng *e, const struct baton_msg *m, bool has_epoch,
    uint64_t epoch)
{
	if (has_epoch && epoch < e->acct_epoch)
		return;
	if (has_epoch)
		e->acct_epoch = epoch;
	if (m->state)
		snprintf(e->state, sizeof e->state, "%s", m->state);
	e->resident = m->resident;
	uint64_t was = e->mapped;
	if (proto_has(m, PF_MAPPED))
		e->mapped = m->mapped;
	else if (m->state && strcmp(m->state, "released") == 0)
		e->mapped = 0;
	if (e->mapped < was)
		lend_wake(b, e->gpu);
	if (e->grant && has_epoch && epoch >= e->grant_epoch &&
	    (!m->state || strcmp(m->state, "refilling") != 0)) {
		e->grant = 0; /* the state after the grant was used */
		e->grant_epoch = 0;
	}
	if (proto_has(m, PF_PEER_MAPPED))
		e->peer_mapped = e->has_peer ? m->peer_mapped : 0;
	if (proto_has(m, PF_FREE)) {
		e->dev_free = m->free_bytes;
		learn_other(b, e, m->free_bytes);
	}
}

/* ---- operations ----------------------------------------------------------------------- */

static struct op *op_new(struct broker *b, enum op_kind kind, struct waiter *w,
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
		o->t0 = now_s();
		o->deadline = o->t0 + b->cfg.acquire_wait_ms / 1e3;
		return o;
	}
	return NULL;
}

static void probe(struct broker *b, struct eng *e);

static void op_fail(struct broker *b, struct op *o, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void op_fail(struct broker *b, struct op *o, int err, const char *fmt, ...)
{
	char text[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	struct eng *e = eng_get(b, o->target);
	if (o->kind == OP_ACQUIRE || o->kind == OP_REFILL || o->kind == OP_HANDOFF)
		publish(b, "deny", e, text, (now_s() - o->t0) * 1e3, o->bytes);
	if (o->granted && e && e->st == ES_LIVE) {
		/* Its command failed: the grant goes back now, not after
		 * GRANT_TTL_S; what the engine did map, its status says. */
		e->grant -= o->granted < e->grant ? o->granted : e->grant;
		if (!e->grant)
			e->grant_epoch = 0;
		probe(b, e);
	}
	reply_error(o->w, o->req_op, o->req_id, err, "%s", text);
	o->used = false;
}

static void op_done(struct op *o)
{
	waiter_done(o->w);
	o->used = false;
}

/* The command's reply fields into the op's reply (release, refill, vram). */
static void reply_from_cmd(struct op *o, const struct baton_msg *rep)
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
static uint64_t want_bytes(const struct eng *e)
{
	return e->ceiling > e->mapped ? e->ceiling - e->mapped : 0;
}

/* ---- requests -------------------------------------------------------------------------- */

static int valid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		    c == '-' || c == '_' || c == '.'))
			return 0;
	}
	return 1;
}

static void eng_forget_conn(struct eng *e)
{
	if (e->conn) {
		proto_client_shutdown(e->conn->cli); /* commands in flight end now */
		conn_put(e->conn);
		e->conn = NULL;
	}
}

/* The engine is gone: its memory counts free at once. */
static void eng_dead(struct broker *b, struct eng *e, const char *why, bool clean)
{
	if (e->st != ES_LIVE)
		return;
	uint64_t freed = e->mapped + e->grant;
	uint64_t loan = e->has_peer ? e->peer_mapped + e->peer_grant : 0;
	struct eref ref = eref_of(b, e);
	e->st = ES_DEAD;
	b->gpus[e->gpu].death_at = now_s();
	snprintf(e->state, sizeof e->state, "%s", clean ? "stopped" : "dead");
	e->mapped = e->resident = e->grant = 0;
	e->in_flight = false;
	e->probing = false;
	e->busy = false;
	eng_forget_conn(e);
	watch_remove(b, ref);
	blog("engine %s (pid %d) %s: %s; %.1f MiB of %s counted free", e->name, e->pid,
	    clean ? "stopped" : "is dead", why, (double)freed / MIB, b->gpus[e->gpu].uuid);
	publish(b, clean ? "stopped" : "dead", e, why, -1, freed);
	if (loan) { /* the driver (or the host device) frees a dead process's memory */
		blog("engine %s: its peer tier of %.1f MiB on %s is returned", e->name, (double)loan / MIB,
		    b->gpus[e->peer_gpu].uuid);
		publish(b, "loan-returned", e, why, -1, loan);
	}
	e->peer_mapped = e->peer_grant = 0;
	lend_wake(b, e->gpu);
	/* Its operations end; ones that wait on it as a victim go on. */
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (!o->used)
			continue;
		if (o->target.slot == ref.slot && o->target.gen == ref.gen)
			op_fail(b, o, BATON_ECLOSED, "engine %s went away (%s)", e->name, why);
		else if (o->kind == OP_HANDOFF && o->victim.slot == ref.slot && o->victim.gen == ref.gen &&
		    o->phase == P_VICTIM_WAIT) {
			o->phase = P_WAIT; /* its memory is free now */
			o->t_victim_done = now_s();
		}
	}
	if (clean) {
		e->st = ES_FREE; /* a clean exit leaves no entry behind */
	}
}

static void on_register(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	if (!valid_name(m->name)) {
		reply_error(w, m->op, m->id, BATON_EINVAL, "register: bad engine name '%s'", m->name);
		return;
	}
	if (!*m->gpu || !*m->ctl) {
		reply_error(w, m->op, m->id, BATON_EINVAL, "register %s: gpu and ctl must not be empty", m->name);
		return;
	}
	int pid = (int)m->pid;
	int pipe_pid = proto_pipe_pid(m->pipe);
	if (pipe_pid > 0 && pipe_pid != pid) {
		blog("register %s: says pid %d, the socket says %d; using %d", m->name, pid, pipe_pid, pipe_pid);
		pid = pipe_pid;
	}
	struct eng *e = eng_by_name(b, m->name);
	bool again = false;
	if (e && e->st == ES_LIVE) {
		if (e->pid != pid) {
			if (pid_alive(e->pid)) {
				reply_error(w, m->op, m->id, BATON_EEXIST,
				    "register: an engine named '%s' is already registered (pid %d)", m->name, e->pid);
				return;
			}
			eng_dead(b, e, "replaced by a new process of the same name", false);
		} else {
			again = true;
		}
	}
	if (!e) {
		for (size_t i = 0; i < BROKER_MAX_ENGINES && !e; i++)
			if (b->eng[i].st == ES_FREE)
				e = &b->eng[i];
		if (!e) {
			reply_error(w, m->op, m->id, BATON_ENOMEM, "register: the broker holds %d engines already",
			    BROKER_MAX_ENGINES);
			return;
		}
	}
	size_t gi = gpu_find_or_add(b, m->gpu);
	if (gi == (size_t)-1) {
		reply_error(w, m->op, m->id, BATON_ENOMEM, "register: too many devices");
		return;
	}
	if (!again) {
		uint32_t gen = e->gen + 1;
		eng_forget_conn(e);
		memset(e, 0, sizeof *e);
		e->gen = gen ? gen : 1;
		e->registered_at = now_s();
	}
	e->st = ES_LIVE;
	snprintf(e->name, sizeof e->name, "%s", m->name);
	snprintf(e->model, sizeof e->model, "%s", m->model);
	if (strcmp(e->ctl, m->ctl) != 0 || !e->conn) {
		eng_forget_conn(e);
		snprintf(e->ctl, sizeof e->ctl, "%s", m->ctl);
		e->conn = conn_open(m->ctl);
		if (!e->conn)
			blog("register %s: cannot open a client for %s", m->name, m->ctl);
	}
	e->pid = pid;
	e->pipe = m->pipe;
	e->gpu = gi;
	e->floor = m->floor;
	e->ceiling = m->ceiling;
	e->capacity = m->capacity;
	e->reg_priority = m->priority;
	e->last_seen = now_s();
	e->lost = false;
	struct gpu *g = &b->gpus[gi];
	if (!g->nvml && m->capacity > g->dev_total)
		g->dev_total = m->capacity;
	if (m->epoch > b->epoch)
		b->epoch = m->epoch; /* epochs only grow, across broker restarts too */
	e->has_peer = false;
	if (proto_has(m, PF_PEER_GPU) && *m->peer_gpu) {
		size_t pg = gpu_find_or_add(b, m->peer_gpu);
		if (pg == (size_t)-1 || pg == gi) {
			blog("register %s: peer device %s %s; no peer tier for it", m->name, m->peer_gpu,
			    pg == gi ? "is its own device" : "is one device too many");
		} else {
			e->has_peer = true;
			e->peer_gpu = pg;
			e->peer_want = proto_has(m, PF_PEER_WANT) ? m->peer_want : 0;
		}
	}
	e->acct_epoch = 0;
	apply_state(b, e, m, true, m->epoch);
	if (!again) {
		e->idle_since = now_s();
		watch_add(b, pid, eref_of(b, e));
	}
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.epoch = ++b->epoch;
	blog("engine %s %s: pid %d, %s, model %s, %s, holds %.1f of %.1f MiB, priority %d%s",
	    e->name, again ? "registered again" : "registered", pid, g->uuid, e->model, e->state,
	    (double)e->mapped / MIB, (double)e->ceiling / MIB, eng_priority(b, e),
	    eng_pinned(b, e) ? ", pinned" : "");
	publish(b, again ? "reconnect" : "register", e, m->model, -1, e->mapped);
	waiter_done(w);
}

static struct eng *need_engine(struct broker *b, struct waiter *w, const struct baton_msg *m,
    const char *name)
{
	struct eng *e = name ? eng_by_name(b, name) : NULL;
	if (!e || e->st != ES_LIVE) {
		reply_error(w, m->op, m->id, BATON_ENOTFOUND, "%s: no engine named '%s' is registered%s",
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
	double now = now_s();
	if (e->lost) {
		blog("engine %s answers again", e->name);
		e->lost = false;
	}
	e->last_seen = now;
	e->busy = m->busy;
	e->idle_since = now - (double)m->idle_ms / 1e3;
	if (proto_has(m, PF_REQUESTS))
		e->requests = m->requests;
	if (m->pipe)
		e->pipe = m->pipe;
	apply_state(b, e, m, proto_has(m, PF_EPOCH), m->epoch);
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	waiter_done(w);
}

static void on_report(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = need_engine(b, w, m, m->name);
	if (!e)
		return;
	e->last_seen = now_s();
	if (strcmp(m->state, "stopped") == 0) {
		struct rbuf *rb = &w->rb;
		proto_reply_init(&rb->m, m);
		waiter_done(w);
		eng_dead(b, e, m->reason, true);
		return;
	}
	apply_state(b, e, m, proto_has(m, PF_EPOCH), m->epoch);
	if (proto_has(m, PF_DURATION_MS) && proto_has(m, PF_BYTES) && m->duration_ms > 0 &&
	    m->bytes > 0 && strstr(m->reason, "refill"))
		e->last_refill_gbps = (double)m->bytes / (m->duration_ms / 1e3) / 1e9;
	publish(b, "state", e, m->reason, proto_has(m, PF_DURATION_MS) ? m->duration_ms : -1,
	    proto_has(m, PF_BYTES) ? m->bytes : e->mapped);
	if (e->ho_pending && proto_has(m, PF_EPOCH) && m->epoch >= e->ho_epoch &&
	    strncmp(m->reason, "refill", 6) == 0) {
		char why[400];
		double refill = proto_has(m, PF_DURATION_MS) ? m->duration_ms : 0;
		snprintf(why, sizeof why, "from %s: decide %.3f ms, release %.3f ms, refill %.3f ms",
		    e->ho_from, e->ho_decide_ms, e->ho_release_ms, refill);
		publish(b, "handoff", e, why, (now_s() - e->ho_t0) * 1e3, m->bytes);
		e->ho_pending = false;
	}
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	waiter_done(w);
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
	size_t strs = (ng + 5 * ne) * BROKER_NAME_MAX + ne * BROKER_URL_MAX;
	char *blk = calloc(1, ng * sizeof(struct proto_gpu) + ne * sizeof(struct proto_engine_info) +
	    strs + 16);
	if (!blk) {
		reply_error(w, m->op, m->id, BATON_ENOMEM, "status: out of memory");
		return;
	}
	rb->block = blk;
	struct proto_gpu *gv = (void *)blk;
	struct proto_engine_info *ev = (void *)(gv + ng);
	char *pool = (char *)(ev + ne);
	for (size_t i = 0; i < ng; i++) {
		struct gpu_view v;
		gpu_view(b, i, &v);
		gv[i].uuid = pool_str(&pool, b->gpus[i].uuid);
		gv[i].total = v.total;
		gv[i].free_bytes = v.free_b;
		gv[i].reserve = b->gpus[i].reserve;
		gv[i].held = v.held;
		gv[i].lent = v.lent;
	}
	double now = now_s();
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
		x->state = pool_str(&pool, e->lost ? "lost" : e->state);
		x->resident = e->mapped;
		x->floor = e->floor;
		x->ceiling = e->ceiling;
		x->priority = eng_priority(b, e);
		x->pinned = eng_pinned(b, e);
		x->idle_ms = e->busy || e->st != ES_LIVE ? 0 : (uint64_t)((now - e->idle_since) * 1e3);
		x->last_refill_gbps = e->last_refill_gbps;
		x->peer_gpu = pool_str(&pool, e->has_peer ? b->gpus[e->peer_gpu].uuid : "");
		x->peer = e->has_peer ? e->peer_mapped : 0;
		x->requests = e->requests;
		x->ctl = pool_str(&pool, e->ctl);
	}
	proto_reply_init(&rb->m, m);
	rb->m.gpus = (struct proto_gpus){ gv, (uint32_t)ng };
	rb->m.engines = (struct proto_engines){ ev, (uint32_t)k };
	proto_set(&rb->m, PF_GPUS);
	proto_set(&rb->m, PF_ENGINES);
	rb->m.epoch = b->epoch;
	proto_set(&rb->m, PF_EPOCH);
	waiter_done(w);
}

/* ---- pins across restarts ----------------------------------------------------------
 *
 * The one piece of broker state that engines cannot tell a new broker:
 * an operator's pins. Kept in a small JSON file, {"version": 1, "pins":
 * {"NAME": true|false}}, written whole (temporary file, fsync, rename) on
 * every change, read once at start. A file that cannot be read is named in
 * the log and ignored: the broker starts without those pins rather than
 * not at all, and the next change writes a good file. */

static void pins_save(struct broker *b)
{
	const char *path = b->cfg.state_file;
	if (!*path)
		return;
	json_t *pins = json_object();
	for (size_t i = 0; i < b->n_pins; i++)
		json_object_set_new(pins, b->pins[i].name, json_boolean(b->pins[i].pinned));
	json_t *j = json_pack("{s:i, s:o}", "version", 1, "pins", pins);
	char tmp[BROKER_URL_MAX + 16];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
	int rc = fd < 0 || !j ? -1 : json_dumpfd(j, fd, JSON_SORT_KEYS);
	if (rc == 0 && (write(fd, "\n", 1) != 1 || fsync(fd) != 0))
		rc = -1;
	if (fd >= 0 && close(fd) != 0)
		rc = -1;
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -1;
	if (rc != 0) {
		blog("cannot write the pins to %s: %s; they hold until the broker restarts", path, strerror(errno));
		unlink(tmp);
	}
	json_decref(j);
}

static void pins_load(struct broker *b)
{
	const char *path = b->cfg.state_file;
	if (!*path)
		return;
	json_error_t je;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!j) {
		if (access(path, F_OK) == 0)
			blog("%s:%d: %s; its pins are ignored", path, je.line, je.text);
		return;
	}
	json_t *pins = json_object_get(j, "pins");
	json_t *ver = json_object_get(j, "version");
	if (!json_is_integer(ver) || json_integer_value(ver) != 1 || !json_is_object(pins)) {
		blog("%s: not a baton-broker state file of version 1; its pins are ignored", path);
		json_decref(j);
		return;
	}
	const char *name;
	json_t *v;
	json_object_foreach(pins, name, v) {
		if (!json_is_boolean(v) || !*name || strlen(name) >= BROKER_NAME_MAX) {
			blog("%s: pin '%.64s' is not a name with true or false; ignored", path, name);
			continue;
		}
		if (b->n_pins == BROKER_MAX_ENGINES)
			break;
		snprintf(b->pins[b->n_pins].name, sizeof b->pins[b->n_pins].name, "%s", name);
		b->pins[b->n_pins++].pinned = json_is_true(v);
		blog("engine %s %s (kept from %s)", name, json_is_true(v) ? "pinned" : "unpinned", path);
	}
	json_decref(j);
}

static void on_pin(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	struct eng *e = eng_by_name(b, m->name);
	if (!e && !broker_config_engine(&b->cfg, m->name)) {
		reply_error(w, m->op, m->id, BATON_ENOTFOUND, "pin: no engine named '%s'", m->name);
		return;
	}
	size_t i;
	for (i = 0; i < b->n_pins; i++)
		if (strcmp(b->pins[i].name, m->name) == 0)
			break;
	if (i == b->n_pins) {
		if (b->n_pins == BROKER_MAX_ENGINES) {
			reply_error(w, m->op, m->id, BATON_ENOMEM, "pin: too many pins");
			return;
		}
		snprintf(b->pins[i].name, sizeof b->pins[i].name, "%s", m->name);
		b->n_pins++;
	}
	b->pins[i].pinned = m->pinned;
	blog("engine %s %s", m->name, m->pinned ? "pinned" : "unpinned");
	pins_save(b);
	if (e)
		publish(b, m->pinned ? "pin" : "unpin", e, "operator", -1, e->mapped);
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	rb->m.pinned = m->pinned;
	proto_set(&rb->m, PF_PINNED);
	waiter_done(w);
}

/* acquire (an engine for itself), refill / vram null (an operator: acquire
 * on the engine's behalf, then command it), release / vram N (command). */
static void on_engine_op(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	const char *name = m->op == PROTO_OP_HANDOFF ? m->to : m->name;
	if (m->op != PROTO_OP_HANDOFF && !proto_has(m, PF_NAME)) {
		reply_error(w, m->op, m->id, BATON_EMISSING, "%s: the broker needs the engine's name",
		    proto_op_name(m->op));
		return;
	}
	struct eng *e = need_engine(b, w, m, name);
	if (!e)
		return;
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
			reply_error(w, m->op, m->id, BATON_EINVAL, "handoff: from and to are both '%s'", m->to);
			return;
		}
		if (eng_pinned(b, from)) {
			reply_error(w, m->op, m->id, BATON_EPERM, "handoff: %s is pinned (baton pin %s false)",
			    from->name, from->name);
			return;
		}
	}
	if (kind == OP_RELEASE && eng_pinned(b, e)) {
		reply_error(w, m->op, m->id, BATON_EPERM, "release: %s is pinned (baton pin %s false)",
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
		waiter_done(w);
		return;
	}
	for (size_t i = 0; kind == OP_ACQUIRE && i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (!o->used || o->kind != OP_ACQUIRE || o->target.slot != (uint32_t)(e - b->eng) ||
		    o->target.gen != e->gen)
			continue;
		if (o->req_id == m->id) {
			reply_error(o->w, o->req_op, o->req_id, BATON_ECLOSED, "acquire: sent again; answered there");
			o->w = w;
			return;
		}
		op_fail(b, o, BATON_ECLOSED, "acquire: replaced by a newer acquire of %s", e->name);
	}
	struct op *o = op_new(b, kind, w, m);
	if (!o) {
		reply_error(w, m->op, m->id, BATON_ENOMEM, "%s: too many operations in progress",
		    proto_op_name(m->op));
		return;
	}
	o->target = eref_of(b, e);
	o->gpu = e->gpu;
	o->reserve_mib = m->reserve_mib;
	switch (kind) {
	case OP_ACQUIRE:
		o->bytes = m->bytes;
		o->phase = P_WAIT;
		break;
	case OP_REFILL:
		o->bytes = want_bytes(e);
		o->phase = P_WAIT;
		break;
	case OP_RELEASE:
	case OP_VRAM:
		o->phase = P_CMD;
		break;
	case OP_HANDOFF: {
		o->victim = eref_of(b, from);
		o->bytes = want_bytes(e);
		/* decide: what `from` gives. All it holds, unless it shares the
		 * device and a shrink leaves B enough (then it keeps the rest). */
		struct gpu_view v;
		gpu_view(b, e->gpu, &v);
		uint64_t short_by = o->bytes > v.avail ? o->bytes - v.avail : 0;
		if (from->gpu == e->gpu && !from->no_shrink && short_by > 0 && short_by < from->mapped &&
		    from->mapped - short_by >= from->floor) {
			o->victim_kind = POLICY_SHRINK;
			o->victim_bytes = short_by;
		} else {
			o->victim_kind = POLICY_RELEASE;
			o->victim_bytes = from->mapped;
		}
		o->t_decided = now_s();
		o->phase = from->mapped == 0 && from->grant == 0 ? P_WAIT : P_VICTIM;
		if (o->phase == P_WAIT)
			o->t_victim_done = o->t_decided;
		break;
	}
	}
}

/* ---- commands and their results --------------------------------------------------- */

/* reserve_mib that makes `e` give back `bytes`: keep the device's free
 * memory plus those bytes free. The engine measures the reserve against the
 * device's real free memory, so this is the real one too (NVML, or the
 * broker's count of the device), not the capped total_mib budget; and not
 * the engine's own last word, which may be old: others have mapped or
 * unmapped since. Rounded up: a shrink frees whole segments anyway. */
static uint64_t shrink_reserve_mib(struct broker *b, const struct eng *e, uint64_t bytes)
{
	struct gpu_view v;
	gpu_view(b, e->gpu, &v);
	return (v.dev_free + bytes + MIB - 1) / MIB;
}

static struct jobtag *tag_new(struct broker *b)
{
	for (size_t i = 0; i < MAX_TAGS; i++)
		if (b->tags[i].job == 0)
			return &b->tags[i];
	return NULL;
}

static struct jobtag *tag_find(struct broker *b, uint64_t job)
{
	for (size_t i = 0; i < MAX_TAGS; i++)
		if (b->tags[i].job == job)
			return &b->tags[i];
	return NULL;
}

/* Starts a command; 0 on success. */
static int command(struct broker *b, struct eng *e, enum proto_op cmd, uint64_t reserve_mib,
    const struct op *o, int victim, uint64_t bytes, const char *reason)
{
	struct jobtag *t = tag_new(b);
	if (!t)
		return BATON_ENOMEM;
	uint64_t id;
	int rc = queue_job(b, e, cmd, reserve_mib, &id);
	if (rc)
		return rc;
	t->job = id;
	t->op_seq = o ? o->seq : 0;
	t->cmd = cmd;
	t->eng = eref_of(b, e);
	t->victim = victim;
	t->bytes = bytes;
	t->probed = 0;
	snprintf(t->reason, sizeof t->reason, "%s", reason);
	return 0;
}

/* Asks the engine for its status (STATUS, answered from its snapshot even
 * while it works), beside a command that went unanswered or after one that
 * failed without a reply: on_probe applies what it says. */
static void probe(struct broker *b, struct eng *e)
{
	if (e->probing || !e->conn)
		return;
	struct jobtag *t = tag_new(b);
	uint64_t id;
	if (!t || queue_job(b, e, PROTO_OP_STATUS, 0, &id))
		return;
	memset(t, 0, sizeof *t);
	t->job = id;
	t->cmd = PROTO_OP_STATUS;
	t->eng = eref_of(b, e);
	t->probed = e->in_flight ? e->job_id : 0;
}

/* The engine is in the middle of a change (its STATUS says so). */
static bool state_moving(const char *state)
{
	return strcmp(state, "releasing") == 0 || strcmp(state, "refilling") == 0 ||
	    strcmp(state, "resizing") == 0 || strcmp(state, "loading") == 0;
}

static struct op *op_by_seq(struct broker *b, uint64_t seq)
{
	if (!seq)
		return NULL;
	for (size_t i = 0; i < MAX_OPS; i++)
		if (b->ops[i].used && b->ops[i].seq == seq)
			return &b->ops[i];
	return NULL;
}

static void on_probe(struct broker *b, struct item *it, const struct jobtag *tag);

static void on_done(struct broker *b, struct item *it)
{
	struct jobtag *t = tag_find(b, it->job_id);
	if (!t)
		return;
	struct jobtag tag = *t;
	t->job = 0;
	if (tag.cmd == PROTO_OP_STATUS) {
		on_probe(b, it, &tag);
		proto_msg_free(&it->rep);
		return;
	}
	struct eng *e = eng_live(b, tag.eng);
	struct op *o = op_by_seq(b, tag.op_seq);
	double now = now_s();
	if (e && e->job_id == it->job_id)
		e->in_flight = false;
	int rc = it->rc;
	const char *word = tag.cmd == PROTO_OP_VRAM ? (tag.bytes ? "shrink" : "vram") :
	    tag.cmd == PROTO_OP_PEER ? (tag.victim ? "revoke" : "lend") : proto_op_name(tag.cmd);
	if (e && tag.cmd == PROTO_OP_PEER)
		e->peer_grant = 0;
	if (e && rc == 0) {
		const struct baton_msg *r = &it->rep;
		uint64_t mapped_before = e->mapped;
		apply_state(b, e, r, true, r->epoch);
		if (tag.cmd == PROTO_OP_VRAM && tag.bytes && e->mapped >= mapped_before) {
			/* A shrink that freed nothing (the engine sees more free
			 * memory than we do): release it next time, never loop. */
			e->no_shrink = true;
			blog("engine %s: a shrink freed nothing; it is released instead from now on", e->name);
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
			blog("engine %s: %s on %s: holds %.1f MiB there (%s)", e->name, word,
			    b->gpus[e->peer_gpu].uuid, (double)e->peer_mapped / MIB, tag.reason);
			publish(b, word, e, tag.reason, r->ms, e->peer_mapped);
		} else {
			publish(b, word, e, tag.reason, r->ms, r->bytes);
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
			blog("engine %s: lend failed: %s", e->name, it->err[0] ? it->err : baton_strerror(rc));
		} else if (rc == BATON_EUNSUPPORTED) {
			e->no_release = true;
			blog("engine %s refuses %s (%s); it is never asked again", e->name, word, it->err);
		} else if (rc == BATON_ESTALE) {
			/* it saw a newer epoch than ours (another broker?): jump past */
			uint64_t mx = b->epoch;
			for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
				if (b->eng[i].st == ES_LIVE && b->eng[i].acct_epoch > mx)
					mx = b->eng[i].acct_epoch;
			b->epoch = mx + 1000;
			e->retry_after = 0;
			blog("engine %s: %s: %s; epoch moved to %" PRIu64, e->name, word, it->err, b->epoch);
		} else if (it->lost) {
			e->retry_after = 0; /* it is settled: a command may go at once */
			blog("engine %s: %s: %s", e->name, word, it->err);
		} else {
			blog("engine %s: %s failed: %s", e->name, word, it->err[0] ? it->err : baton_strerror(rc));
			if (!pid_alive(e->pid))
				eng_dead(b, e, "its process is gone", false);
			else if (!it->rep.reply)
				probe(b, e); /* no word from it: learn what it did */
		}
	}
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
					op_fail(b, o, rc, "handoff: %s of the `from` engine failed: %s", word,
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
					struct eng *from = eng_get(b, o->victim);
					char why[300];
					snprintf(why, sizeof why, "from %s (%s): decide %.3f ms, release %.3f ms, refill %.3f ms",
					    from ? from->name : "?", o->victim_kind == POLICY_SHRINK ? "shrink" : "release",
					    rb->m.decide_ms, rb->m.release_ms, rb->m.refill_ms);
					if (e)
						publish(b, "handoff", e, why, rb->m.total_ms, it->rep.bytes);
				} else {
					reply_from_cmd(o, &it->rep);
					if (e && e->ho_pending && o->kind == OP_REFILL) {
						char why[400];
						snprintf(why, sizeof why,
						    "from %s: decide %.3f ms, release %.3f ms, refill %.3f ms", e->ho_from,
						    e->ho_decide_ms, e->ho_release_ms, it->rep.ms);
						publish(b, "handoff", e, why, (now - o->t0) * 1e3, it->rep.bytes);
						e->ho_pending = false;
					}
				}
				op_done(o);
			} else if (rc == BATON_EBUSY || rc == BATON_ESTALE) {
				o->phase = P_CMD; /* again, until the deadline */
				if (now >= o->deadline && o->kind != OP_REFILL && o->kind != OP_HANDOFF)
					op_fail(b, o, BATON_EBUSY, "%s: %s kept serving requests for %d ms", word,
					    e ? e->name : "the engine", b->cfg.acquire_wait_ms);
			} else if (again && ++o->resends <= LOST_RESENDS) {
				o->phase = P_CMD; /* it is settled: the command again (idempotent) */
			} else {
				op_fail(b, o, rc, "%s failed: %s", word, it->err[0] ? it->err : baton_strerror(rc));
			}
		}
	}
	proto_msg_free(&it->rep);
}

/* A probe's answer (see probe()). Applied when the engine is settled, not
 * in the middle of a change: then its figures are what it holds. When the
 * command it asked about is still unanswered, that command is over for the
 * engine (it ran and its reply was lost, or it never arrived), so no reply
 * will come: it ends here as lost, and its operation sends it again
 * (commands are idempotent; a late copy of the old one is fenced by its
 * older epoch). The worker that waits for the old reply gives up at its
 * timeout; its result then finds no tag. */
static void on_probe(struct broker *b, struct item *it, const struct jobtag *tag)
{
	struct eng *e = eng_live(b, tag->eng);
	if (!e)
		return;
	e->probing = false;
	const struct baton_msg *r = &it->rep;
	if (it->rc || !r->state || state_moving(r->state) || !proto_has(r, PF_EPOCH))
		return; /* no answer, or at work still: the command may yet answer */
	apply_state(b, e, r, true, r->epoch);
	if (!tag->probed || !e->in_flight || e->job_id != tag->probed)
		return;
	struct item lost = { .kind = IT_DONE, .job_id = tag->probed, .rc = BATON_ETIMEDOUT, .lost = true };
	snprintf(lost.err, sizeof lost.err, "no reply after %.1f s, and the engine is %s at epoch %" PRIu64
	    ": the reply or the command was lost", now_s() - e->job_t0, r->state, r->epoch);
	on_done(b, &lost);
}

/* ---- scheduling ------------------------------------------------------------------------ */

static void wake_at(struct broker *b, double t)
{
	if (t < b->next_wake)
		b->next_wake = t;
}

/* Commands whose turn has come (release, vram N, the handoff's `from`,
 * refills after a grant). */
static void run_commands(struct broker *b, struct op *o, double now)
{
	if (o->phase == P_VICTIM) {
		struct eng *v = eng_live(b, o->victim);
		if (!v || (v->mapped == 0 && v->grant == 0)) {
			o->t_victim_done = now;
			o->phase = P_WAIT;
			return;
		}
		if (now >= o->deadline) {
			op_fail(b, o, BATON_EBUSY, "handoff: %s kept serving requests for %d ms; nothing was changed",
			    v->name, b->cfg.acquire_wait_ms);
			return;
		}
		if (v->in_flight || now < v->retry_after) {
			wake_at(b, v->retry_after);
			return;
		}
		struct eng *to = eng_get(b, o->target);
		char why[200];
		snprintf(why, sizeof why, "handoff to %s", to ? to->name : "?");
		int rc = o->victim_kind == POLICY_SHRINK ?
		    command(b, v, PROTO_OP_VRAM, shrink_reserve_mib(b, v, o->victim_bytes), o, 1, o->victim_bytes, why) :
		    command(b, v, PROTO_OP_RELEASE, 0, o, 1, 0, why);
		if (rc)
			op_fail(b, o, rc, "handoff: cannot command %s", v->name);
		else
			o->phase = P_VICTIM_WAIT;
		return;
	}
	if (o->phase != P_CMD)
		return;
	struct eng *e = eng_live(b, o->target);
	if (!e) {
		op_fail(b, o, BATON_ENOTFOUND, "the engine went away");
		return;
	}
	if (e->in_flight || now < e->retry_after) {
		wake_at(b, e->retry_after);
		if ((o->kind == OP_RELEASE || o->kind == OP_VRAM) && now >= o->deadline)
			op_fail(b, o, BATON_EBUSY, "%s: %s is busy serving requests (waited %d ms)",
			    proto_op_name(o->req_op), e->name, b->cfg.acquire_wait_ms);
		return;
	}
	int rc;
	const char *reason = o->kind == OP_HANDOFF ? "handoff" : "operator";
	if (o->kind == OP_RELEASE)
		rc = command(b, e, PROTO_OP_RELEASE, 0, o, 0, 0, reason);
	else if (o->kind == OP_VRAM)
		rc = command(b, e, PROTO_OP_VRAM, o->reserve_mib, o, 0, 0, reason);
	else
		rc = command(b, e, PROTO_OP_REFILL, 0, o, 0, 0, reason);
	if (rc) {
		op_fail(b, o, rc, "cannot command %s", e->name);
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
	publish(b, "grant", e, why, (now - o->t0) * 1e3, bytes);
	if (o->reclaimed && o->kind != OP_HANDOFF) {
		e->ho_pending = true;
		e->ho_epoch = e->grant_epoch;
		e->ho_t0 = o->t0;
		e->ho_decide_ms = (o->t_decided - o->t0) * 1e3;
		e->ho_release_ms = (o->t_reclaimed - o->t_decided) * 1e3;
		snprintf(e->ho_from, sizeof e->ho_from, "%s", o->victims);
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
		op_done(o);
	} else {
		o->phase = P_CMD;
		run_commands(b, o, now);
	}
}

/* ---- peer tiers: lending a device's free memory to engines of others ------------- */

/* Takes loans on device gi back for `head`, which lacks `short_by` bytes:
 * each borrower drops (part of) its peer tier and acknowledges; the caller
 * waits for that like for a reclaim. Returns true while loans are being
 * (or wait to be) taken back, false when there are none to take. */
static bool take_loans_back(struct broker *b, size_t gi, struct op *head, uint64_t short_by, double now)
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
		uint64_t keep = x->peer_mapped > short_by ? (x->peer_mapped - short_by) / MIB : 0;
		char why[200];
		snprintf(why, sizeof why, "for %s", b->eng[head->target.slot].name);
		if (command(b, x, PROTO_OP_PEER, keep, head, 1, keep * MIB, why) == 0) {
			head->outstanding++;
			size_t l = strlen(head->victims);
			snprintf(head->victims + l, sizeof head->victims - l, "%s%s (revoke)", l ? ", " : "",
			    x->name);
			if (head->t_decided == 0)
				head->t_decided = now;
			uint64_t freed = x->peer_mapped - keep * MIB;
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
static void lend_free_memory(struct broker *b, double now)
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
		if (strcmp(e->state, "ready") != 0 && strcmp(e->state, "partial") != 0)
			continue;
		size_t pg = e->peer_gpu;
		if (b->gpus[pg].no_lend || gpu_has_waiters(b, pg))
			continue;
		struct gpu_view v;
		gpu_view(b, pg, &v);
		uint64_t more = e->peer_want - e->peer_mapped;
		if (more > v.avail)
			more = v.avail;
		uint64_t target_mib = (e->peer_mapped + more) / MIB;
		/* its floor is one segment: less than that more would map nothing */
		if (target_mib * MIB <= e->peer_mapped || target_mib * MIB < e->peer_mapped + e->floor)
			continue;
		char why[200];
		snprintf(why, sizeof why, "%.1f MiB of %s free beyond its reserve", (double)v.avail / MIB,
		    b->gpus[pg].uuid);
		if (command(b, e, PROTO_OP_PEER, target_mib, NULL, 0, target_mib * MIB, why) == 0)
			e->peer_grant = target_mib * MIB - e->peer_mapped;
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
			.priority = eng_priority(b, e),
			.idle_s = e->busy ? 0 : now - e->idle_since,
			.busy = e->busy,
			.pinned = eng_pinned(b, e) || e->no_release || e->lost,
			.in_flight = e->in_flight || now < e->retry_after,
			.granted = e->grant > 0,
			.no_shrink = e->no_shrink,
		};
		if (now < e->retry_after)
			wake_at(b, e->retry_after);
		map[n++] = i;
	}
	return n;
}

/* Serves the device's queue: the oldest waiting operation first. */
static void serve_gpu(struct broker *b, size_t gi, double now)
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
		struct eng *e = eng_live(b, head->target);
		if (!e) {
			op_fail(b, head, BATON_ENOTFOUND, "the engine went away");
			continue;
		}
		struct gpu_view v;
		gpu_view(b, gi, &v);
		/* Never more than the device could ever give it. */
		struct gpu *g = &b->gpus[gi];
		uint64_t fixed = g->reserve + e->mapped;
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
			const struct eng *x = &b->eng[i];
			if (x->st == ES_LIVE && x->gpu == gi && x != e && (eng_pinned(b, x) || x->no_release))
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
		if (v.lent > 0 && take_loans_back(b, gi, head, head->bytes - v.avail, now))
			return; /* loans first: the device's own engines come first */
		if (now >= head->deadline) {
			op_fail(b, head, BATON_EDEVMEM,
			    "%s: no memory for %s on %s after %d ms: wants %.1f MiB, %.1f MiB available "
			    "(%.1f free, %.1f reserved)%s%s",
			    proto_op_name(head->req_op), e->name, g->uuid, b->cfg.acquire_wait_ms,
			    (double)head->bytes / MIB, (double)v.avail / MIB, (double)v.free_b / MIB,
			    (double)g->reserve / MIB, head->why[0] ? "; " : "", head->why);
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
			snprintf(head->why, sizeof head->why, "%s%u pinned, %u busy, %u in flight",
			    plan.blocked == POLICY_NOTHING ? "no engine holds memory that may be taken: " :
			    "not enough can be taken: ", plan.skipped_pinned, plan.skipped_busy,
			    plan.skipped_in_flight);
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
			    command(b, x, PROTO_OP_VRAM, shrink_reserve_mib(b, x, plan.act[k].bytes), head, 1,
			        plan.act[k].bytes, why) :
			    command(b, x, PROTO_OP_RELEASE, 0, head, 1, 0, why);
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

/* Timers: heartbeat timeouts, idle release, stale grants. */
static void housekeeping(struct broker *b, double now)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		struct eng *e = &b->eng[i];
		if (e->st != ES_LIVE)
			continue;
		if (now - e->last_seen > b->cfg.heartbeat_timeout_ms / 1e3) {
			if (!pid_alive(e->pid)) {
				eng_dead(b, e, "no heartbeat and its process is gone", false);
				continue;
			}
			if (!e->lost) {
				e->lost = true;
				blog("engine %s (pid %d): no heartbeat for %d ms; its memory stays counted",
				    e->name, e->pid, b->cfg.heartbeat_timeout_ms);
				publish(b, "lost", e, "no heartbeat", -1, e->mapped);
			}
		}
		if (e->in_flight && !e->probing && now - e->job_t0 >= PROBE_S && now - e->probe_at >= PROBE_S)
			probe(b, e); /* unanswered for long: lost, or a long refill? */
		if (e->grant && now - e->grant_at > GRANT_TTL_S) {
			blog("engine %s never used a grant of %.1f MiB; dropped", e->name, (double)e->grant / MIB);
			e->grant = 0;
		}
		double t = eng_idle_timeout(b, e);
		if (t > 0 && e->mapped > 0 && !e->busy && !e->in_flight && !e->grant && !e->lost &&
		    !e->no_release && !eng_pinned(b, e) && now >= e->retry_after && now - e->idle_since >= t) {
			bool wanted = false; /* it waits for memory itself: leave it */
			for (size_t k = 0; k < MAX_OPS; k++)
				if (b->ops[k].used && b->ops[k].target.slot == i && b->ops[k].target.gen == e->gen)
					wanted = true;
			if (!wanted) {
				char why[64];
				snprintf(why, sizeof why, "idle %.1f s", now - e->idle_since);
				if (command(b, e, PROTO_OP_RELEASE, 0, NULL, 1, 0, why) == 0)
					blog("engine %s: idle for %.1f s, releasing", e->name, now - e->idle_since);
			}
		}
	}
}

static void pump(struct broker *b)
{
	double now = now_s();
	b->next_wake = now + TICK_S;
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (o->used && (o->phase == P_VICTIM || o->phase == P_CMD))
			run_commands(b, o, now);
		if (o->used && (o->phase == P_WAIT || o->phase == P_VICTIM || o->phase == P_CMD))
			wake_at(b, o->deadline);
	}
	for (size_t g = 0; g < b->n_gpus; g++)
		serve_gpu(b, g, now);
	lend_free_memory(b, now);
	if (now >= b->next_tick) {
		housekeeping(b, now);
		b->next_tick = now + TICK_S;
	}
	wake_at(b, b->next_tick);
}

static void handle(struct broker *b, struct item *it)
{
	switch (it->kind) {
	case IT_REQ: {
		const struct baton_msg *m = &it->req;
		struct waiter *w = it->w;
		switch (m->op) {
		case PROTO_OP_REGISTER: on_register(b, w, m); break;
		case PROTO_OP_HEARTBEAT: on_heartbeat(b, w, m); break;
		case PROTO_OP_REPORT: on_report(b, w, m); break;
		case PROTO_OP_STATUS: on_status(b, w, m); break;
		case PROTO_OP_PIN: on_pin(b, w, m); break;
		case PROTO_OP_ACQUIRE:
		case PROTO_OP_REFILL:
		case PROTO_OP_RELEASE:
		case PROTO_OP_VRAM:
		case PROTO_OP_HANDOFF: on_engine_op(b, w, m); break;
		default:
			reply_error(w, m->op, m->id, BATON_EUNKNOWNOP, "the broker does not serve '%s'",
			    proto_op_name(m->op));
		}
		proto_msg_free(&it->req);
		break;
	}
	case IT_DONE:
		on_done(b, it);
		break;
	case IT_PIPE_REM:
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
			struct eng *e = &b->eng[i];
			if (e->st == ES_LIVE && e->pipe == it->pipe && !pid_alive(e->pid))
				eng_dead(b, e, "its connection closed and its process is gone", false);
		}
		break;
	case IT_DEATH: {
		struct eng *e = eng_live(b, it->ref);
		if (e)
			eng_dead(b, e, "its process exited", false);
		break;
	}
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
		double wait = b->next_wake - now_s();
		if (wait <= 0)
			continue;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		double t = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9 + wait;
		ts.tv_sec = (time_t)t;
		ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
		pthread_cond_timedwait(&b->cv, &b->mu, &ts);
	}
	/* Stopping: every waiting request gets its answer. */
	b->loop_done = true;
	struct item *rest = b->head;
	b->head = b->tail = NULL;
	pthread_mutex_unlock(&b->mu);
	for (size_t i = 0; i < MAX_OPS; i++)
		if (b->ops[i].used)
			op_fail(b, &b->ops[i], BATON_ECLOSED, "the broker is shutting down");
	while (rest) {
		struct item *it = rest;
		rest = it->next;
		if (it->kind == IT_REQ) {
			reply_error(it->w, it->req.op, it->req.id, BATON_ECLOSED, "the broker is shutting down");
			proto_msg_free(&it->req);
		} else if (it->kind == IT_DONE) {
			proto_msg_free(&it->rep);
		}
		free(it);
	}
	return NULL;
}

/* ---- open / close ------------------------------------------------------------------ */

int broker_open(const struct broker_config *cfg, struct broker **out, char *err, size_t errlen)
{
	int rc;
	*out = NULL;
	struct broker *b = calloc(1, sizeof *b);
	if (!b)
		return BATON_ENOMEM;
	b->cfg = *cfg;
	pthread_mutex_init(&b->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&b->jmu, NULL);
	pthread_cond_init(&b->jcv, NULL);
	pthread_mutex_init(&b->wmu, NULL);
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
		blog("NVML loaded: GPU memory is read from the driver");
	if (!cfg->state_file_set && strncmp(cfg->control, "ipc://", 6) == 0) {
		const char *slash = strrchr(cfg->control + 6, '/');
		if (slash)
			snprintf(b->cfg.state_file, sizeof b->cfg.state_file, "%.*s/broker.state",
			    (int)(slash - (cfg->control + 6)), cfg->control + 6);
	}
	pins_load(b);
	if (proto_ipc_dir(cfg->control) || proto_ipc_dir(cfg->events)) {
		snprintf(err, errlen, "cannot create the socket directory for %s or %s: %s", cfg->control,
		    cfg->events, strerror(errno));
		rc = BATON_EIO;
		goto fail;
	}
	struct proto_opts so = { .on_pipe = on_pipe, .pipe_arg = b };
	if ((rc = proto_server_open(&b->srv, cfg->control, &so)) != 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", cfg->control, baton_strerror(rc));
		goto fail;
	}
	if ((rc = proto_pub_open(&b->pub, cfg->events, NULL)) != 0) {
		snprintf(err, errlen, "cannot publish events on %s: %s", cfg->events, baton_strerror(rc));
		goto fail;
	}
	/* Before the decision thread: it reads b->http when it publishes. A
	 * request that comes before the thread runs waits in the inbox. */
	if (cfg->http[0]) {
		char herr[512];
		rc = broker_http_open(b, cfg, &b->http, herr, sizeof herr);
		if (rc && cfg->http_set) {
			snprintf(err, errlen, "%s", herr);
			goto fail;
		}
		if (rc)
			blog("no HTTP server: %s (set [broker] http to choose another address, or off)", herr);
	}
	if (pthread_create(&b->loop_th, NULL, loop, b) != 0)
		goto nothread;
	b->have_loop = 1;
	if (pthread_create(&b->watch_th, NULL, watcher, b) != 0)
		goto nothread;
	b->have_watch = 1;
	for (int i = 0; i < WORKERS; i++) {
		if (pthread_create(&b->work_th[i], NULL, worker, b) != 0)
			goto nothread;
		b->n_work++;
	}
	for (int i = 0; i < RECEIVERS; i++) {
		struct recv_arg *ra = malloc(sizeof *ra);
		if (!ra || proto_ctx_open(b->srv, &b->ctx[i]) != 0) {
			free(ra);
			goto nothread;
		}
		ra->b = b;
		ra->ctx = b->ctx[i];
		if (pthread_create(&b->recv_th[i], NULL, receiver, ra) != 0) {
			free(ra);
			proto_ctx_close(b->ctx[i]);
			b->ctx[i] = NULL;
			goto nothread;
		}
		b->n_recv++;
	}
	*out = b;
	return 0;
nothread:
	snprintf(err, errlen, "cannot start threads");
	rc = BATON_ENOMEM;
fail:
	broker_close(b);
	return rc;
}

void broker_stop(struct broker *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->mu);
	atomic_store(&b->stopping, true);
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
}

void broker_close(struct broker *b)
{
	if (!b)
		return;
	broker_stop(b);
	if (b->have_loop)
		pthread_join(b->loop_th, NULL);
	/* From here on broker_call() answers at once; what the HTTP server
	 * posted before is answered below or was by the loop. */
	pthread_mutex_lock(&b->mu);
	b->loop_done = true;
	pthread_mutex_unlock(&b->mu);
	/* Receivers: blocked receives end with ECLOSED. One may have posted a
	 * request after the loop ended: answer those here. */
	if (b->srv)
		proto_server_shutdown(b->srv);
	bool joined[RECEIVERS] = { false };
	for (;;) {
		pthread_mutex_lock(&b->mu);
		struct item *rest = b->head;
		b->head = b->tail = NULL;
		pthread_mutex_unlock(&b->mu);
		for (struct item *it = rest, *nx; it; it = nx) {
			nx = it->next;
			if (it->kind == IT_REQ) {
				reply_error(it->w, it->req.op, it->req.id, BATON_ECLOSED, "the broker is shutting down");
				proto_msg_free(&it->req);
			} else if (it->kind == IT_DONE) {
				proto_msg_free(&it->rep);
			}
			free(it);
		}
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
	broker_http_close(b->http);
	b->http = NULL;
	for (int i = 0; i < RECEIVERS; i++)
		proto_ctx_close(b->ctx[i]);
	/* Workers: connections shut down, so calls in flight end now. */
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		eng_forget_conn(&b->eng[i]);
	pthread_mutex_lock(&b->jmu);
	b->jstop = true;
	pthread_cond_broadcast(&b->jcv);
	pthread_mutex_unlock(&b->jmu);
	for (int i = 0; i < b->n_work; i++)
		pthread_join(b->work_th[i], NULL);
	for (struct job *j = b->jhead, *nx; j; j = nx) {
		nx = j->next;
		conn_put(j->conn);
		free(j);
	}
	for (struct item *it = b->head, *nx; it; it = nx) {
		nx = it->next;
		if (it->kind == IT_DONE)
			proto_msg_free(&it->rep);
		free(it);
	}
	if (b->have_watch) {
		uint64_t one = 1;
		if (write(b->wake_fd, &one, sizeof one) < 0) {
			/* it wakes within its poll timeout */
		}
		pthread_join(b->watch_th, NULL);
	}
	proto_server_close(b->srv);
	proto_pub_close(b->pub);
	if (b->wake_fd >= 0)
		close(b->wake_fd);
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->jmu);
	pthread_cond_destroy(&b->jcv);
	pthread_mutex_destroy(&b->wmu);
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

const char *broker_http_url(const struct broker *b)
{
	return b->http ? broker_http_server_url(b->http) : NULL;
}
