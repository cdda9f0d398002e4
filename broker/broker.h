/*
 * broker.h: the one public door of Baton's broker component: the
 * configuration file, the reclaim policy (a pure function, so it can be
 * tested from a table), and the daemon itself (baton-broker).
 *
 * The broker decides who holds device memory. Engines register with it
 * (proto op register), send heartbeats, ask before they grow or refill
 * (acquire) and report every state change (report). The broker reaches each
 * engine through the engine's own control socket (release, refill, vram),
 * every command carrying an epoch that only grows (a fencing token).
 * Operators and scripts use the broker's control socket (status, release,
 * refill, vram, handoff, pin) or its faces (broker/api/api.h: the same
 * requests as JSON, Prometheus metrics, a dashboard page; broker/door/door.h:
 * the OpenAI front door); every change is published as an event. This
 * header is the core alone: the faces sit above it and use only it.
 *
 * Threads inside the daemon (broker_int.h): receivers (one nng context each)
 * take requests and hand them to the decision thread, which alone owns the
 * registry; commands to engines run on a small worker pool and come back
 * to the decision thread as results; a watcher thread polls the engines'
 * pidfds. Engines and GPUs are referred to by index + generation, never by
 * a pointer kept across a callback.
 */
#ifndef BATON_BROKER_H
#define BATON_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto.h"

#define BROKER_MAX_GPUS     64
#define BROKER_MAX_ENGINES  256
#define BROKER_NAME_MAX     128  /* bytes of a GPU uuid or engine name, with NUL */
#define BROKER_URL_MAX      256

#define BROKER_DEFAULT_CONTROL "ipc:///run/baton/broker.sock"
#define BROKER_DEFAULT_EVENTS  "ipc:///run/baton/events.sock"
#define BROKER_DEFAULT_HTTP    "127.0.0.1:8420"
#define BROKER_TOKEN_MAX       256  /* bytes of the HTTP bearer token, with NUL */

/* ---- configuration ------------------------------------------------------------
 *
 * An INI file (libinih):
 *
 *   [broker]
 *   control = ipc:///run/baton/broker.sock
 *   events = ipc:///run/baton/events.sock
 *   heartbeat_timeout_ms = 2000   ; an engine silent this long is checked, then dead
 *   idle_release_s = 0            ; release engines idle this long (0: never)
 *   acquire_wait_ms = 5000        ; how long an acquire may wait for memory
 *   command_timeout_ms = 30000    ; a command to an engine (a refill may be long)
 *   nvml = true                   ; read GPU memory through NVML when present
 *   http = 127.0.0.1:8420         ; HTTP API, /metrics and the dashboard (HOST:PORT,
 *                                 ; port 0: any free one; empty or "off": none)
 *   http_hosts = NAME, ...        ; names besides the bound address that a POST's
 *                                 ; Host may carry (DNS rebinding: others are refused)
 *   cors_origins = ORIGIN, ...    ; web pages of these origins (https://ui.example)
 *                                 ; may call the API from a browser (CORS; the token
 *                                 ; is still needed); default none
 *   http_token = SECRET           ; bearer token that POSTs need (default: one made
 *                                 ; at start into http.token beside an ipc:// control
 *                                 ; socket, mode 0640; broker/api/api.h: broker_http_token_prepare)
 *   http_token_file = PATH        ; the same, the first line of a file (not readable
 *                                 ; by others, or the broker refuses it)
 *   state_file = PATH             ; pins survive a broker restart here (default:
 *                                 ; broker.state beside an ipc:// control socket;
 *                                 ; empty or "off": not kept)
 *   door_quantum_s = 5            ; front door: the longest a model keeps a device
 *                                 ; while another model's requests wait
 *   door_keep_alive_s = 300       ; release an engine with OpenAI HTTP this long after
 *                                 ; its last request ("forever": never); with
 *                                 ; idle_release_s one rule, the shorter wins
 *   door_queue_max = 64           ; front door: requests waiting per model; more: 503
 *   access_log = true             ; a log line per request (model, status, tokens,
 *                                 ; time to first token, duration); false: none
 *                                 ; (the fleet's engines get --no-access-log)
 *
 *   [gpu "GPU-8f1c..."]           ; or "host-0", or "*" for every device
 *   reserve_mib = 1024            ; the reserve: never granted
 *   total_mib = 8192              ; manage this much of the device (default: all)
 *   lend = true                   ; lend its free memory (beyond reserve_mib) to
 *                                 ; engines of other devices as their peer tier
 *
 *   [engine "qwen"]
 *   priority = 10                 ; higher is kept longer (default: what it registers)
 *   pinned = true                 ; never reclaimed
 *   idle_release_s = 300          ; overrides [broker] idle_release_s
 *   keep_alive_s = 600            ; overrides [broker] door_keep_alive_s ("forever")
 *
 *   [model "qwen"]                ; a model the broker serves itself (the fleet,
 *                                 ; docs/guides/fleet.md): it makes the arena and
 *                                 ; starts, watches and stops the engine
 *   source = ./Qwen3-30B-A3B/     ; a Hugging Face folder, a .gguf file, an .arena,
 *                                 ; or hf:ORG/NAME[@REV] in the local Hugging Face
 *                                 ; cache (HF_HUB_CACHE, HF_HOME/hub, ~/.cache/
 *                                 ; huggingface/hub; never the network)
 *   aliases = qwen3, qwen-latest  ; more names clients may send
 *   backend = auto                ; host, cuda or auto;  device = 0
 *   dtype = bf16                  ; the weight type the arena must hold (checked)
 *   ctx = 4096  kv_blocks = N  max_seqs = 16   ; the engine's --ctx, --kv-blocks, --max-seqs
 *   prefix_cache = true  kv_host_mib = 4096    ; --no-prefix-cache when false, --kv-host-mib
 *   keep_alive_s = 300            ; release its device memory this long idle
 *   stop_after_s = 0              ; stop its engine this long idle (0: never)
 *   drop_arena = false            ; and then delete the arena it made (frees /dev/shm)
 *   priority = 0  pinned = false  ; as [engine]: a [model] is an engine of its name
 *   preload = false               ; start it with the broker, not at its first request
 *   arena = PATH                  ; default arena_dir/NAME.arena
 *   engine_flags = --vram-reserve-mib 512   ; more baton-engine flags
 *
 * [broker] keys of the fleet: engine = PATH (baton-engine; default: beside
 * baton-broker), arena_tool = PATH (baton-arena; the same), arena_dir = DIR
 * (/dev/shm/baton), run_dir = DIR (engines' sockets; default: the ipc://
 * control socket's folder, else /run/baton), restart_max = 5 crashes within
 * restart_window_s = 60 mark a model failed.
 *
 * Unknown sections or keys, bad numbers or booleans, duplicate sections:
 * broker_config_load() fails with BATON_ECONFIG and a message
 * "PATH:LINE: ..." naming the line. So does a [model] whose source is not
 * there or not a model, a name or alias given twice, or a [model] and an
 * [engine] of one name.
 */

#define BROKER_MAX_MODELS 64
#define BROKER_PATH_MAX 512

enum broker_source_kind {
	BROKER_SRC_HF = 1,     /* a Hugging Face folder (config.json, *.safetensors) */
	BROKER_SRC_GGUF,       /* a llama.cpp file */
	BROKER_SRC_ARENA,      /* an arena already made */
};

struct broker_model_conf {
	char name[BROKER_NAME_MAX];
	char source[BROKER_PATH_MAX];   /* as written */
	char path[BROKER_PATH_MAX];     /* resolved: the folder or file */
	enum broker_source_kind kind;
	char aliases[256];              /* comma separated, checked */
	char backend[8];                /* host, cuda, auto */
	int device;
	char dtype[16];                 /* "": any */
	uint32_t ctx, kv_blocks, max_seqs; /* 0: the engine's default */
	bool no_prefix_cache;           /* prefix_cache = false: --no-prefix-cache */
	bool has_kv_host;               /* kv_host_mib = N set: --kv-host-mib N */
	uint64_t kv_host_mib;
	double keep_alive_s;            /* has_keep_alive: set (< 0: forever) */
	bool has_keep_alive;
	double stop_after_s;            /* 0: never */
	int32_t priority;
	bool has_priority, pinned, preload;
	bool drop_arena;                /* stopped after stop_after_s: its arena deleted too */
	char arena[BROKER_PATH_MAX];    /* "": arena_dir/NAME.arena */
	char flags[512];                /* more engine flags, split at spaces */
	int line;
};

struct broker_gpu_conf {
	char uuid[BROKER_NAME_MAX];   /* "*" matches every device */
	uint64_t reserve_bytes;
	uint64_t total_bytes;         /* 0: the device's own total */
	bool no_lend;                 /* lend = false: no peer tiers on it */
	int line;                     /* where it was defined (messages) */
};

struct broker_engine_conf {
	char name[BROKER_NAME_MAX];
	int32_t priority;
	bool has_priority;
	bool pinned;
	double idle_release_s;        /* < 0: the global one */
	double keep_alive_s;          /* front door; has_keep_alive: set (< 0: forever) */
	bool has_keep_alive;
	int line;
};

/* [external "NAME"]: a program that is not a Baton engine but holds device
 * memory (a vLLM, SGLang or llama.cpp server, ComfyUI, a training job),
 * put under the broker (docs/reference/external.md). Also the body of
 * `baton external add` and POST /v1/externals, key for key. */
#define BROKER_MAX_EXTERNALS 32
#define BROKER_HOOK_MAX 512
enum { BROKER_EXT_HOOK = 0, BROKER_EXT_PARK = 1, BROKER_EXT_NONE = 2 };
struct broker_external_conf {
	char name[BROKER_NAME_MAX];
	int pid;                      /* pid = N */
	char pid_file[BROKER_URL_MAX];/* pid_file = PATH (read again when the process is gone) */
	char unit[BROKER_NAME_MAX];   /* unit = NAME.service (its MainPID, by systemctl) */
	char gpu[BROKER_NAME_MAX];    /* gpu = UUID | host-N | index ("": the only device) */
	int32_t priority;             /* priority = N (default 0) */
	bool pinned;                  /* pinned = true: never released nor parked */
	char url[BROKER_URL_MAX];     /* url = http://HOST:PORT: its OpenAI API (the front door routes) */
	char model[BROKER_NAME_MAX];  /* model = NAME it serves there */
	uint64_t mib;                 /* mib = N: what it holds when serving, when nothing measures it */
	int mode;                     /* BROKER_EXT_*: release = park, or a hook, or none */
	char release[BROKER_HOOK_MAX];/* release = COMMAND | http://URL (POSTed) | park */
	char refill[BROKER_HOOK_MAX]; /* refill = COMMAND | http://URL */
	double hook_timeout_s;        /* hook_timeout_s = 30 */
	int line;
};
/* Sets one key of an external engine from its text (the INI's and the
 * JSON body's); BATON_EINVAL with a message naming the key. */
int broker_external_set(struct broker_external_conf *x, const char *key, const char *value, char *err,
    size_t len);
/* The defaults of a new one (timeout 30 s, mode none until a release is set). */
void broker_external_init(struct broker_external_conf *x, const char *name);
/* Whether it names its process (pid, pid_file or unit) and its hooks make
 * sense together; BATON_EINVAL with a message. */
int broker_external_check(const struct broker_external_conf *x, char *err, size_t len);

struct broker_config {
	char control[BROKER_URL_MAX];
	char events[BROKER_URL_MAX];
	int heartbeat_timeout_ms;
	double idle_release_s;        /* 0: never */
	int acquire_wait_ms;
	int command_timeout_ms;
	bool nvml;
	char http[BROKER_URL_MAX];    /* HOST:PORT, "": no HTTP server */
	bool http_set;                /* chosen (file or flag): failing to bind is an error;
	                               * the default address only warns when taken */
	char http_hosts[BROKER_URL_MAX]; /* more names a POST's Host may carry, comma separated */
	char cors_origins[BROKER_URL_MAX]; /* CORS origins, comma separated; "": none */
	char http_token[BROKER_TOKEN_MAX]; /* "": mutating calls are refused */
	char http_token_path[BROKER_URL_MAX]; /* the file a made token is in ("": configured) */
	char state_file[BROKER_URL_MAX]; /* "": pins are not kept across restarts */
	bool state_file_set;          /* chosen in the file; else derived from control */
	double door_quantum_s;        /* front door (docs/reference/front-door.md) */
	double door_keep_alive_s;     /* < 0: forever */
	unsigned door_queue_max;
	bool access_log;              /* a log line per request, door and fleet engines (default true) */
	/* the fleet ([model] sections) */
	char engine_path[BROKER_PATH_MAX];   /* "": baton-engine beside the program */
	char arena_tool[BROKER_PATH_MAX];    /* "": baton-arena beside the program */
	char arena_dir[BROKER_PATH_MAX];     /* "/dev/shm/baton" */
	char run_dir[BROKER_PATH_MAX];       /* "": the control socket's folder, else /run/baton */
	unsigned restart_max;
	double restart_window_s;
	size_t n_gpus, n_engines, n_models;
	struct broker_gpu_conf gpus[BROKER_MAX_GPUS];
	struct broker_engine_conf engines[BROKER_MAX_ENGINES];
	struct broker_model_conf models[BROKER_MAX_MODELS];
	size_t n_externals;
	struct broker_external_conf externals[BROKER_MAX_EXTERNALS];
};

/* The defaults: the sockets above, heartbeat timeout 2000 ms, no idle
 * release, acquire wait 5000 ms, command timeout 30000 ms, NVML on, HTTP
 * on BROKER_DEFAULT_HTTP without a configured token (the program makes one:
 * broker_http_token_prepare). */
void broker_config_defaults(struct broker_config *c);
/* Reads an INI file over the defaults already in *c. BATON_ECONFIG with
 * "PATH:LINE: what" in err on bad content; BATON_EIO/BATON_ENOTFOUND when
 * the file cannot be read. */
int broker_config_load(struct broker_config *c, const char *path, char *err, size_t errlen);
/* The same from a string (tests); `name` stands for PATH in messages. */
int broker_config_parse(struct broker_config *c, const char *text, const char *name,
    char *err, size_t errlen);
/* Sets c->http from "HOST:PORT", "http://HOST:PORT", "" or "off" (none);
 * BATON_EINVAL with a message in err when it is none of those. */
int broker_config_set_http(struct broker_config *c, const char *v, char *err, size_t errlen);
/* Reads the token from the first line of a file into c->http_token,
 * by http_token_read's rules (http/http.h: the engine's too);
 * BATON_EIO (unreadable), BATON_EINVAL (empty, too long, or a character
 * outside the visible ASCII range), BATON_EPERM (others may read or write
 * it, or not a regular file) with a message in err. */
int broker_config_token_file(struct broker_config *c, const char *path, char *err, size_t errlen);
/* The section for a device (exact uuid first, then "*"), or NULL. */
const struct broker_gpu_conf *broker_config_gpu(const struct broker_config *c, const char *uuid);
const struct broker_engine_conf *broker_config_engine(const struct broker_config *c, const char *name);
/* The [model] of this name or alias, or NULL. */
const struct broker_model_conf *broker_config_model(const struct broker_config *c, const char *name);
/* Whether two [model] sections would start the same engine (every key
 * but the line and the aliases). */
bool broker_model_conf_same(const struct broker_model_conf *a, const struct broker_model_conf *b);
/* A model's source: a path (relative to dir when not absolute; "" dir: as
 * it is) or hf:ORG/NAME[@REV] in the local Hugging Face cache, resolved
 * into m->path and m->kind; BATON_ENOTFOUND or BATON_EINVAL with a
 * sentence in err (no network is tried). */
int broker_model_source(struct broker_model_conf *m, const char *dir, char *err, size_t errlen);

/* ---- policy: who gives memory back ------------------------------------------
 *
 * policy_decide() is a pure function of its inputs. Given one device and
 * the engines on it, and `need` bytes that one engine (the requester) wants
 * beyond what is available, it says which engines give memory back and how:
 *
 *   - never the requester, a dead engine, a pinned one, one that holds
 *     nothing (above its floor for a shrink), one with a command in flight,
 *     or one holding a grant it has not used yet;
 *   - idle engines first, lowest priority first, then the longest idle,
 *     then by name (so the order is total and the tests are exact);
 *   - then busy engines of a priority no higher than the requester's: they
 *     are asked too, and the engine gives way between two requests, never
 *     in the middle of one (it answers busy and the broker asks again);
 *   - for each engine in that order: a shrink (vram) when it is enough, that
 *     is when the engine is elastic (not known to refuse vram) and keeps at
 *     least its floor after giving the rest of the need; else a release of
 *     everything it holds; until the need is met.
 * When even all candidates together cannot meet the need, the plan is empty
 * and `blocked` says why (nothing is taken for nothing).
 */
enum policy_kind {
	POLICY_RELEASE = 1,
	POLICY_SHRINK = 2,
};

struct policy_engine {
	const char *name;
	uint64_t held;       /* bytes of the device it holds (mapped) */
	uint64_t floor;      /* the least a shrink leaves it */
	int32_t priority;
	double idle_s;       /* seconds since its last request ended */
	bool busy;           /* a request is running (as last known) */
	bool pinned;
	bool dead;
	bool in_flight;      /* a command to it is running */
	bool granted;        /* holds a grant not yet used */
	bool refilling;      /* copying its experts in (a refill or grow) */
	bool no_shrink;      /* refused vram before (not elastic) */
};

struct policy_action {
	size_t engine;       /* index into the engines given */
	enum policy_kind kind;
	uint64_t bytes;      /* to free: all it holds for a release */
};

enum policy_block {
	POLICY_OK = 0,
	POLICY_NOTHING = 1,   /* no engine holds anything that may be taken */
	POLICY_SHORT = 2,     /* candidates exist but cannot free enough */
};

struct policy_plan {
	size_t n;
	struct policy_action act[BROKER_MAX_ENGINES];
	uint64_t freed;       /* what the actions free together */
	enum policy_block blocked;
	/* why engines were passed over, for the error text */
	uint32_t skipped_pinned, skipped_busy, skipped_in_flight;
	uint32_t skipped_refilling; /* holding memory it is copying into (or granted) */
};

/* requester: index of the asking engine, or (size_t)-1 for none (an
 * operator's refill). need: bytes to free; 0 gives an empty plan. */
void policy_decide(const struct policy_engine *e, size_t n, size_t requester, uint64_t need,
    struct policy_plan *plan);

/* The order in which policy_decide considers candidates, written to
 * order[] (indices); returns how many. For tests and the status page. */
size_t policy_order(const struct policy_engine *e, size_t n, size_t requester, size_t *order);

/* ---- the daemon --------------------------------------------------------------
 *
 * Lifecycle: broker_open, then faces subscribe (broker_observe) and open
 * (broker_http_open, broker_door_open), then broker_start; at the end
 * broker_stop, the faces close, broker_close. All of these from one
 * thread (the program's).
 */

struct broker;

/* Opens the sockets; no thread runs yet, so a face that subscribes now
 * sees every event. Nothing is registered yet. */
int broker_open(const struct broker_config *cfg, struct broker **out, char *err, size_t errlen);
/* Starts the decision thread, the watcher, the workers and the receivers;
 * BATON_ENOMEM with err when a thread cannot start (then broker_close).
 * Idempotent. */
int broker_start(struct broker *b, char *err, size_t errlen);
/* Asks the daemon to stop; safe from a signal-waiting thread. Idempotent.
 * Afterwards broker_call() returns soon: the decision thread ends and
 * answers BATON_ECLOSED to what it has not served, and to what comes after. */
void broker_stop(struct broker *b);
/* Stops, waits for the threads, closes the sockets, frees; NULL allowed.
 * Faces that use b must be closed before. */
void broker_close(struct broker *b);
/* The URLs it listens on (tcp ports filled in). */
const char *broker_control_url(const struct broker *b);
const char *broker_events_url(const struct broker *b);

/* Runs one request (a control op: status, release, pin...) through the
 * decision thread exactly as a control-socket receiver does, and blocks
 * the calling thread until it is answered (a refill or handoff may wait for
 * memory: up to acquire_wait_ms plus the command timeout). fn(arg, rep)
 * then sees the reply, valid only during the call. Strings in *req are
 * borrowed for the duration. Once the broker stops, the reply is an error
 * BATON_ECLOSED. Never call it from the decision thread (an event
 * subscriber) or from an nng callback. */
void broker_call(struct broker *b, const struct baton_msg *req,
    void (*fn)(void *arg, const struct baton_msg *rep), void *arg);

/* The bearer token the engine `name` registered for its OpenAI HTTP into
 * out ("" when it needs none): for the front door's requests to it, and
 * shown nowhere. Any thread. BATON_ENOTFOUND: no such engine. */
int broker_engine_http_token(struct broker *b, const char *name, char *out, size_t n);

/* An event subscriber: called on the decision thread with every event the
 * broker publishes (op event: seq, time_ms, kind, engine, gpu, state,
 * reason, ms, bytes), valid during the call. A "handoff" event also
 * carries decide_ms, release_ms, refill_ms and total_ms here (without
 * presence bits: not on the wire, where its reason says them). It must be quick and must not
 * call back into the broker. */
typedef void (*broker_event_fn)(void *arg, const struct baton_msg *ev);
/* Subscribes; BATON_ENOMEM when 4 are subscribed already. */
int broker_observe(struct broker *b, broker_event_fn fn, void *arg);
/* Unsubscribes; once it returns, fn is not running and is never called
 * again. */
void broker_unobserve(struct broker *b, broker_event_fn fn, void *arg);

/* A new configuration for the running broker (SIGHUP), read and checked
 * by the caller: the decision thread takes its policies, pins, device and
 * engine sections and timers between two decisions, and this returns
 * once it has (0, a summary in msg, logged and published as a "reload"
 * event). Engines, what they hold and operations in progress stay. The
 * sockets, HTTP server, NVML and state file stay as opened (msg names
 * those that differ). BATON_ECLOSED once the broker stops. Not from the
 * decision thread. */
int broker_reload(struct broker *b, const struct broker_config *next, char *msg, size_t n);
/* Whether the ipc:// sockets are still the ones broker_open bound (same
 * inode): BATON_ESTATE with what happened in err when one was removed or
 * replaced (the program says so and exits: a restart binds afresh). */
int broker_sockets_check(struct broker *b, char *err, size_t errlen);

/* Whether a release of every engine (`baton release --every`, POST
 * /v1/release) asks an engine in this state: not when it holds nothing
 * already or no one answers for it. */
static inline bool broker_every_releases(const char *state)
{
	return baton_state_may_hold(baton_state_parse(state));
}

/* The largest reserve_mib an engine takes (its vram check): the bound the
 * HTTP API checks and states. */
#define BROKER_RESERVE_MIB_MAX (UINT64_C(1) << 24)

/* A face's event (the door's door.queue, door.switch), published like the
 * broker's own (events socket, subscribers) from the decision thread;
 * engine may be NULL or a name. Any thread but the decision thread; never
 * blocks. */
void broker_emit(struct broker *b, const char *kind, const char *engine, const char *reason, double ms,
    uint64_t bytes);

/* ---- status as JSON (the CLI's --json and GET /v1/status) ----------------------- */

struct json_t;
/* {"epoch", "gpus": [{uuid, total, free, used, held, reserve, lent}],
 * "engines": [...]} of a status reply; NULL without memory. */
struct json_t *broker_status_json(const struct baton_msg *rep);
/* One engine's object: {name, pid, gpu, model, state, resident, floor,
 * ceiling, priority, pinned, idle_ms, last_refill_gbps, peer_gpu, peer,
 * requests, http}. */
struct json_t *broker_engine_json(const struct proto_engine_info *e);
/* What an entry of the status' engines is: "engine" (Baton's), "lease"
 * (memory lent to a job: ctl "lease") or "external" (a program that is not
 * Baton's: ctl "external:hook|park|none"); the JSON's "kind". */
const char *broker_entry_kind(const struct proto_engine_info *e);
struct json_t *broker_gpu_json(const struct proto_gpu *g);

/* One line of the broker's log on stderr, "baton-broker: ...", stamped
 * with the UTC time unless under journald (JOURNAL_STREAM set: the journal
 * stamps it). Any thread. */
void broker_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- NVML (dlopen'ed; absent on machines without an NVIDIA driver) ------------ */

/* Loads libnvidia-ml.so.1 once; 0 when present. Thread-safe. */
int broker_nvml_init(void);
/* Free and total bytes of the GPU with this uuid ("GPU-..."); BATON_ENODEV
 * without NVML or when no GPU has that uuid. */
int broker_nvml_mem(const char *uuid, uint64_t *free_bytes, uint64_t *total_bytes);
/* The product name ("NVIDIA H200") and NVML index (nvidia-smi's) of the
 * GPU with this uuid; BATON_ENODEV as broker_nvml_mem. */
int broker_nvml_name(const char *uuid, char *name, size_t len, unsigned *index);
/* The processes that hold memory of that GPU (compute contexts) and how
 * much each, up to cap; BATON_ENODEV as broker_nvml_mem (or a driver
 * without the call), BATON_EDRIVER when NVML fails. */
/* The uuid of the GPU NVML numbers index (nvidia-smi's), and how many it
 * knows (count may be NULL); BATON_ENODEV without NVML or such a GPU. */
int broker_nvml_uuid(unsigned index, unsigned *count, char *uuid, size_t len);
struct broker_nvml_proc {
	int pid;              /* as the host's pid namespace numbers it */
	uint64_t bytes;       /* 0: NVML does not say (no per-process accounting) */
};
int broker_nvml_procs(const char *uuid, struct broker_nvml_proc *out, size_t cap, size_t *n_out);

#endif
