/*
 * broker_int.h: what the files of the broker's core share, and nobody
 * else uses (faces such as http.c and the programs use broker.h only).
 *
 * The core, bottom to top (a file calls only files below it):
 *
 *   broker_int.h  these types, the clocks and wake_at()
 *   events.c      the log and the events (publish to subscribers, broker_observe)
 *   inbox.c       the decision thread's inbox: receivers, waiters, broker_call
 *   workers.c     commands to engines on a worker pool; refcounted connections
 *   watch.c       the pidfd watcher and nng pipe events (deaths into the inbox)
 *   registry.c    engines, GPUs, accounting, pins and their persistence
 *   ops.c         operations in progress, the commands they send, a death
 *   results.c     what engines answer to commands (and to probes)
 *   requests.c    the control requests (register ... handoff)
 *   lend.c        peer tiers: lending a device's free memory, taking it back
 *   schedule.c    serving each device's queue, commands' turns, timers
 *   broker.c      open, start, stop, close; the decision loop
 *
 * Threads, and who owns what (each field group of struct broker says it):
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
 *   faces      threads of a face (the HTTP server) post requests like the
 *              receivers do (broker_call) and wait for the reply; the
 *              decision thread hands every event to the subscribers
 *              (broker_observe), never to a face by name.
 *
 * Engines are referred to by slot + generation (struct eref); a result
 * for a slot whose generation moved on is applied to nothing. The only
 * things shared with workers are refcounted connections (struct conn).
 */
#ifndef BATON_BROKER_INT_H
#define BATON_BROKER_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>
#include <sys/types.h>

#include "broker/broker.h"

#define RECEIVERS 64
#define WORKERS 8
#define MAX_OPS 512
#define BUSY_RETRY_S 0.005     /* ask a busy engine again after this */
#define ERROR_RETRY_S 0.1      /* after a failed command */
#define GRANT_TTL_S 30.0       /* a grant never reported used is dropped */
#define PROBE_S 1.0            /* a command unanswered this long: ask the engine's status */
#define LONG_CMD_S 3600.0     /* a refill's own ceiling: the stall rule ends it first */
#define LOST_RESENDS 3         /* an operation whose command is lost more often fails */
#define DEATH_SETTLE_S 1.0     /* after a death, device figures may predate it */
#define TICK_S 0.1
#define LEND_PAUSE_S 0.5       /* between two lends to one engine */
#define LEND_BACKOFF_S 5.0     /* after a lend it could not fully use, or a failed one */
#define MAX_TAGS 1024

/* ---- types: who owns each is said above it ----------------------------------- */

/* Held, free and available bytes of a device, as br_gpu_view counts them. */
struct gpu_view {
	uint64_t total, held, grants, free_b, avail;
	uint64_t lent;        /* peer tiers of other devices' engines on it (in held) */
	uint64_t dev_free;    /* the device's own free memory (not capped), best known */
	uint64_t kv;          /* the engines' KV pools on it: not in held, not in other */
};

/* A reply, owned by the request's waiter: the decision thread fills it,
 * then the waiting thread reads it (after br_waiter_done). */
struct rbuf {
	struct baton_msg m;
	char text[512];
	char s1[BROKER_NAME_MAX];
	void *block;                  /* status arrays and their strings */
};

/* On the stack of the thread that waits (a receiver, a broker_call). */
struct waiter {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	struct rbuf rb;
};

/* Shared by the registry (decision thread) and workers: refcounted. */
struct conn {
	struct proto_client *cli;
	atomic_int refs;
};

/* ---- the registry: the decision thread only ---------------------------------- */

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
	char name[96];        /* product name (NVML), "host device N", or "" until known */
	int index;            /* nvidia-smi's index (NVML), else the engines' device; -1: unknown */
	bool no_lend;         /* lend = false */
	double death_at;      /* an engine on it was last found dead */
};

/* The largest request frame the control socket reads (broker.c). */
#define BROKER_RECV_MAX (1u << 20)

enum { ES_FREE = 0, ES_LIVE, ES_DEAD };

/* What an entry of the registry is (struct eng.kind): a Baton engine, a
 * lease (memory lent to a job: jobs.c), or an external engine (a program
 * that is not Baton's, driven by hooks or parked: external.c, hooks.c,
 * park.c). Leases and external engines live in the same table as engines,
 * so the books (br_gpu_view), the policy and the status count them alike. */
enum { EK_ENGINE = 0, EK_LEASE, EK_EXTERNAL };

struct lease_x {
	int holder;           /* the process that asked (the socket's peer), for the log */
	double ttl_s;         /* 0: none; else it ends unless renewed within ttl_s */
	double expires_at;
	double granted_at;
	uint64_t want;        /* bytes asked */
	char what[160];       /* what the job is (its command line) */
	char gave_way[192];   /* engines released or shrunk for it: refilled after it */
	uint64_t seen;        /* bytes its process holds as last measured (NVML), 0: unknown */
	bool over;            /* reported over its grant (once) */
};

/* A hook: a shell command or an HTTP POST, with a timeout. */
struct hook {
	char cmd[512];
	char url[BROKER_URL_MAX];
	double timeout_s;
};

enum { EXT_MODE_HOOK = 0, EXT_MODE_PARK, EXT_MODE_NONE };

struct ext_x {
	char pid_file[BROKER_URL_MAX], unit[BROKER_NAME_MAX];
	struct hook release, refill;
	int mode;             /* EXT_MODE_*: how it gives memory back */
	uint64_t declared;    /* mib = N: what it holds when ready (no better measure) */
	bool pinned;
	char mem_src[16];     /* where `mapped` comes from: nvml, report, declared */
	bool parked;          /* checkpointed by the CUDA driver (park.c) */
	double parked_at;
	uint64_t parked_bytes;/* device bytes it held when parked */
	bool park_next;       /* the release in flight is a park (baton park) */
	bool come_back;       /* released or parked for someone else: refilled once its memory is free again */
	char last[256];       /* the last hook's or park's outcome */
};

struct eng {
	uint32_t gen;
	int st;               /* ES_* */
	char name[BROKER_NAME_MAX], model[BROKER_NAME_MAX], ctl[BROKER_URL_MAX];
	char http[BROKER_URL_MAX];  /* its OpenAI HTTP URL ("": none), for the front door */
	char state[32];
	int pid, pidfd_watched;
	uint32_t pipe;
	size_t gpu;
	uint64_t floor, ceiling, capacity;
	int32_t reg_priority;
	uint64_t resident, mapped, dev_free;
	uint64_t kv;                  /* its KV pool's device bytes (its messages' kv) */
	bool busy, lost, no_shrink, no_release;
	bool has_req_keep_alive;    /* its last Ollama request's keep_alive (heartbeats) */
	double req_keep_alive_s;    /* in place of the configured one; < 0: never */
	double idle_since, last_seen, registered_at;
	uint64_t acct_epoch;  /* epoch of the newest state applied */
	uint64_t grant, grant_epoch;
	double grant_at;
	/* the one command in flight to it */
	bool in_flight;
	uint64_t job_id;
	double job_t0;
	bool job_long;        /* a copy: timed out when its progress stalls */
	double retry_after;
	/* a STATUS probe in flight (a command went unanswered) */
	bool probing;
	double probe_at;
	/* the last acquire granted: a resend of it (same id) gets the same */
	uint64_t acq_id, acq_granted, acq_epoch;
	double last_refill_gbps;
	/* its refill's copy progress (heartbeats): a command whose copy moves
	 * is not timed out; progress_at: when `copied` last moved */
	uint64_t copied, to_copy;
	double progress_at, progress_pub_at; /* moved; last published */
	uint64_t requests;    /* GEN requests it answered (its heartbeats say) */
	uint64_t prefix_prompt, prefix_cached, prefix_evictions, kv_host_bytes; /* its prefix cache (heartbeats) */
	uint64_t kv_used, kv_total; /* its KV pool's blocks (its heartbeats say; 0, 0: none) */
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
	/* what the entry is (EK_*); leases and external engines (jobs.c, external.c) */
	int kind;
	struct lease_x ls;
	struct ext_x ext;
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
	uint64_t mapped0;     /* acquire: what the target mapped when it asked */
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
	char reason[96];      /* who asked, for its events ("" : an operator) */
};

/* Inbox items: made by any thread, handed over under b->mu, then the
 * decision thread's, which frees them. */
enum item_kind { IT_REQ = 1, IT_DONE, IT_PIPE_REM, IT_DEATH, IT_RELOAD, IT_EVENT };

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
	/* IT_EVENT: a face's event (broker_emit); reason in err, ms, bytes in job_id */
	char ev_kind[32], ev_engine[BROKER_NAME_MAX];
	/* IT_PIPE_REM, IT_DEATH */
	uint32_t pipe;
	int pid;
	struct eref ref;
	/* IT_RELOAD (with w): borrowed until the waiter is done */
	const struct broker_config *cfg;
};

/* Worker jobs: made by the decision thread, handed over under b->jmu, then
 * the worker's. */
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

/* pidfds: under b->wmu; only the watcher closes one. */
struct watch {
	int fd;               /* pidfd, -1: free */
	int pid;
	struct eref ref;
	bool remove;
};

/* What a command in flight is for: decision thread only. */
struct jobtag {
	uint64_t job;
	uint64_t op_seq;        /* the op it serves, 0: none (idle release) */
	enum proto_op cmd;
	struct eref eng;
	char reason[160];
	uint64_t bytes;         /* shrink: bytes asked */
	int victim;             /* a reclaim or a handoff's `from` */
	uint64_t mapped0;       /* what the engine mapped when the command went: events say
	                         * what moved since (its own report may come first) */
	uint64_t probed;        /* STATUS: the command it asks about */
};

#define MAX_OBSERVERS 4

struct broker {
	/* set by broker_open, read-only after */
	struct broker_config cfg;
	struct proto_server *srv;
	struct proto_pub *pub;
	struct { dev_t dev; ino_t ino; bool set; } sock_id[2]; /* control, events (ipc://) */

	/* any thread */
	atomic_bool stopping;
	atomic_int hooks_running; /* hooks.c: threads of external engines' hooks */

	/* the inbox of the decision thread: under mu */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct item *head, *tail;
	bool loop_done;       /* broker_call answers at once */

	/* event subscribers: under omu, which publish holds while it calls them */
	pthread_mutex_t omu;
	struct {
		broker_event_fn fn;
		void *arg;
	} obs[MAX_OBSERVERS];

	/* jobs for workers: under jmu */
	pthread_mutex_t jmu;
	pthread_cond_t jcv;
	struct job *jhead, *jtail;
	bool jstop;

	/* pidfds: under wmu (only the watcher closes one) */
	pthread_mutex_t wmu;
	struct watch watches[BROKER_MAX_ENGINES];
	int wake_fd;

	/* threads: the thread that opens and closes the broker */
	pthread_t loop_th, watch_th, recv_th[RECEIVERS], work_th[WORKERS];
	struct proto_ctx *ctx[RECEIVERS];
	int n_recv, n_work, have_loop, have_watch;

	/* the registry: the decision thread only (broker_open and broker_close
	 * too, while it does not run) */
	struct gpu gpus[BROKER_MAX_GPUS];
	size_t n_gpus;
	struct eng eng[BROKER_MAX_ENGINES];
	/* The bearer token each engine's OpenAI HTTP needs, by engine slot,
	 * under tmu: written at register (decision thread), read by the front
	 * door's threads (broker_engine_http_token); in no status, event or log. */
	pthread_mutex_t tmu;
	struct { char name[BROKER_NAME_MAX], token[BROKER_URL_MAX]; } http_tokens[BROKER_MAX_ENGINES];
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

/* ---- clocks and timers ------------------------------------------------------------ */

/* Monotonic seconds and the wall clock: base.h's baton_now_s and
 * baton_wall_ms. */

/* The decision loop sleeps until t at the latest (decision thread). */
static inline void wake_at(struct broker *b, double t)
{
	if (t < b->next_wake)
		b->next_wake = t;
}

/* ---- events.c: the log and the events ---------------------------------------------- */

/* One line on stderr, "baton-broker: ...". Any thread. */
void br_blog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* j as the whole file at path (temporary, fsync, rename); -1 with errno. */
int br_json_replace(const char *path, const json_t *j);
/* ", 2.41 GB/s" for bytes moved in ms (nothing when either is 0). */
const char *br_rate(uint64_t bytes, double ms, char *buf, size_t len);
/* One log line for a release, refill or resize done: its timings, bytes
 * moved and rate, and what the engine holds after it. */
void br_log_move(const char *engine, const char *what, const char *reason, double ms, uint64_t bytes,
    uint64_t holds);
/* Publishes an event on the events socket and to every subscriber
 * (decision thread). e may be NULL; ms < 0: none. bytes is always device
 * memory, never bytes copied (docs/reference/broker.md, "Events"): what moved
 * (granted, asked for, freed, mapped: br_moved) or, for events that move
 * nothing (register, pin, lost...), what the engine holds. */
void br_publish(struct broker *b, const char *kind, const struct eng *e, const char *reason,
    double ms, uint64_t bytes);
/* The same for a face's event (broker_emit) naming an engine by name:
 * the registered engine's fields when there is one, else the name alone. */
void br_publish_named(struct broker *b, const char *kind, const char *name, const char *reason, double ms,
    uint64_t bytes);
/* A handoff event, its phases (ms) handed to subscribers too (broker.h). */
void br_publish_handoff(struct broker *b, const struct eng *e, const char *reason, double total_ms,
    uint64_t bytes, double decide_ms, double release_ms, double refill_ms);
/* An event's common fields (seq, time, engine, gpu, state, ms, bytes). */
void br_event_fill(struct broker *b, struct baton_msg *ev, const char *kind, const struct eng *e,
    const char *reason, double ms, uint64_t bytes);
/* Device memory moved between two figures of what an engine maps. */
static inline uint64_t br_moved(uint64_t before, uint64_t after)
{
	return before > after ? before - after : after - before;
}

/* ---- reload.c: a new configuration ------------------------------------------------- */

/* Decision thread: applies the reloadable parts of *next (broker.h,
 * broker_reload); a summary into msg, logged and published ("reload"). */
void br_apply_config(struct broker *b, const struct broker_config *next, char *msg, size_t n);

/* ---- inbox.c: the decision thread's inbox ----------------------------------------- */

/* Hands an item to the decision thread, which frees it. Any thread. */
void br_post(struct broker *b, struct item *it);
/* The same, unless the decision thread has stopped: then BATON_ECLOSED
 * and the item stays the caller's (an item with a waiter). */
int br_post_live(struct broker *b, struct item *it);
/* A waiter on the caller's stack: ready (nothing replied), waited on
 * until br_waiter_done, and undone (its reply's memory too). */
void br_waiter_init(struct waiter *w);
void br_waiter_wait(struct waiter *w);
void br_waiter_fini(struct waiter *w);
/* The reply in w->rb is complete: wakes the thread that waits for it. */
void br_waiter_done(struct waiter *w);
/* An error reply into the waiter, then br_waiter_done. */
void br_reply_error(struct waiter *w, enum proto_op op, uint64_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Answers every request in the inbox with ECLOSED and frees every item;
 * the decision thread does not run (stopped, or never started). */
void br_inbox_close(struct broker *b);
/* Opens a context per receiver and starts the receivers; BATON_ENOMEM
 * when one cannot start (those that did are counted in n_recv). */
int br_receivers_start(struct broker *b);

/* ---- workers.c: commands on the worker pool ---------------------------------------- */

struct conn *br_conn_open(const char *url);
void br_conn_put(struct conn *c);
/* Queues `op` to engine e (decision thread): marks it in flight (a STATUS
 * probe: probing), sets *job_id; BATON_ENOMEM without memory or a
 * connection. */
int br_queue_job(struct broker *b, struct eng *e, enum proto_op op, uint64_t reserve_mib,
    uint64_t *job_id);
int br_workers_start(struct broker *b);
/* Ends the workers (their calls end once connections are shut down) and
 * frees the jobs never run. */
void br_workers_stop(struct broker *b);

/* ---- watch.c: deaths --------------------------------------------------------------- */

void br_watch_add(struct broker *b, int pid, struct eref ref);
void br_watch_remove(struct broker *b, struct eref ref);
/* proto_opts.on_pipe of the control socket (an nng thread). */
void br_on_pipe(void *arg, const struct proto_pipe_event *ev);
int br_watch_start(struct broker *b);
/* Wakes the watcher and joins it (after `stopping` is set). */
void br_watch_stop(struct broker *b);

/* ---- registry.c: engines, GPUs, accounting, pins (decision thread) ----------------- */

int br_pid_alive(int pid);
struct eng *br_eng_get(struct broker *b, struct eref r);
struct eng *br_eng_live(struct broker *b, struct eref r);
struct eref br_eref_of(struct broker *b, const struct eng *e);
struct eng *br_eng_by_name(struct broker *b, const char *name);
/* The device's index, added when new; (size_t)-1 when full. */
size_t br_gpu_find_or_add(struct broker *b, const char *uuid);
int32_t br_eng_priority(struct broker *b, const struct eng *e);
bool br_eng_pinned(struct broker *b, const struct eng *e);
/* Seconds of idleness after which e is released (0: never); *keep_alive
 * (NULL allowed): the front door's keep-alive is the timeout that applies. */
double br_eng_idle_timeout(struct broker *b, const struct eng *e, bool *keep_alive);
void br_gpu_view(struct broker *b, size_t gi, struct gpu_view *v);
void br_lend_wake(struct broker *b, size_t gi);
void br_apply_state(struct broker *b, struct eng *e, const struct baton_msg *m, bool has_epoch,
    uint64_t epoch);
void br_eng_forget_conn(struct eng *e);
void br_pins_save(struct broker *b);
void br_pins_load(struct broker *b);

/* ---- ops.c: operations, commands, deaths (decision thread) -------------------------- */

struct op *br_op_new(struct broker *b, enum op_kind kind, struct waiter *w, const struct baton_msg *req);
struct op *br_op_by_seq(struct broker *b, uint64_t seq);
/* Answers the op's waiter with an error and ends it. */
void br_op_fail(struct broker *b, struct op *o, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The reply is in the waiter: answers and ends the op. */
void br_op_done(struct op *o);
void br_reply_from_cmd(struct op *o, const struct baton_msg *rep);
uint64_t br_want_bytes(const struct eng *e);
uint64_t br_shrink_reserve_mib(struct broker *b, const struct eng *e, uint64_t bytes);
bool br_grow_reserve_mib(struct broker *b, const struct eng *e, uint64_t granted, uint64_t *keep_mib);
struct jobtag *br_tag_find(struct broker *b, uint64_t job);
int br_command(struct broker *b, struct eng *e, enum proto_op cmd, uint64_t reserve_mib,
    const struct op *o, int victim, uint64_t bytes, const char *reason);
void br_probe(struct broker *b, struct eng *e);
void br_eng_dead(struct broker *b, struct eng *e, const char *why, bool clean);
/* Why engine e cannot take a command now, as the rest of a sentence
 * ("is refilling: 45% of 24.0 MiB copied"; "is busy serving requests"). */
const char *br_busy_what(struct broker *b, const struct eng *e, char *buf, size_t len);

/* ---- results.c, requests.c, lend.c, schedule.c (decision thread) ------------------- */

/* A command's result (an IT_DONE item); frees its reply. */
void br_on_done(struct broker *b, struct item *it);
/* One control request; every path answers w. */
void br_on_request(struct broker *b, struct waiter *w, const struct baton_msg *m);
bool br_take_loans_back(struct broker *b, size_t gi, struct op *head, uint64_t short_by, double now);
void br_lend_free_memory(struct broker *b, double now);
void br_run_commands(struct broker *b, struct op *o, double now);
void br_serve_gpu(struct broker *b, size_t gi, double now);
void br_housekeeping(struct broker *b, double now);

/* ---- jobs.c, external.c, hooks.c, park.c: programs that are not Baton engines --- */

/* lease requests (acquire, renew, release); every path answers w. */
void br_on_lease(struct broker *b, struct waiter *w, const struct baton_msg *m);
/* A lease's acquire was granted (schedule.c's grant): its memory is now
 * counted as the job's, not as a grant. */
void br_lease_granted(struct broker *b, struct eng *e, struct op *o);
/* A refill of engine e, granted `granted` bytes, on a device with a live
 * lease: true, and *keep_mib, the reserve_mib of a vram command that grows
 * e by its grant only (the device's real free memory, NVML's or e's own
 * last word, less the grant), since the job may not have taken its memory
 * yet and a refill maps all the device has room for. False (a plain
 * refill) without a lease, or for a lease, an external engine, or a grant
 * that is all e wants and the device's figures are not known. */
bool br_lease_room_mib(struct broker *b, const struct eng *e, uint64_t granted, uint64_t *keep_mib);
/* A lease ends (released, its process gone, its TTL passed): its memory
 * comes free and the engines that gave way are refilled. */
void br_lease_end(struct broker *b, struct eng *e, const char *why);
/* Timers of leases and external engines (TTL, pid files, measures). */
void br_nonengine_tick(struct broker *b, struct eng *e, double now);
/* external requests (add, remove, park, resume, report). */
void br_on_external(struct broker *b, struct waiter *w, const struct baton_msg *m);
/* Adds the external engines of the configuration (broker_open). */
void br_externals_from_config(struct broker *b);
/* A command to an external engine: its hook (or park/resume) runs on a
 * thread of its own, its result comes back as an IT_DONE like an engine's
 * reply. Same contract as br_queue_job. */
int br_ext_queue(struct broker *b, struct eng *e, enum proto_op op, uint64_t *job_id);
/* An external engine's process is gone (ops.c's br_eng_dead): its memory
 * counts free, the entry stays to find it again. */
void br_ext_gone(struct broker *b, struct eng *e, const char *why);
/* A result of an external engine's hook, before and after results.c
 * applies it as an engine's reply (external.c). */
void br_ext_result(struct broker *b, struct eng *e, const struct jobtag *tag, const struct item *it);
void br_ext_after(struct broker *b, struct eng *e, bool was_parked);
/* Status lines' words: "lease", "external", "engine". */
const char *br_kind_name(const struct eng *e);

#endif
