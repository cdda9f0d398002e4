/*
 * proto.h: the public door of Baton's protocol component: the error enum
 * every component shares, the messages, their msgpack codec, and the nng
 * transport.
 *
 * ---- Wire format ------------------------------------------------------------
 *
 * Every message is one msgpack map with string keys. The envelope:
 *   v    uint     protocol version, must be BATON_PROTO_VERSION (1)
 *   op   str      "gen", "status", "release", ... (enum proto_op)
 *   id   uint64   nonzero on requests and events; a reply carries the id
 *                 and op of its request. REQ may resend a request, so every
 *                 request is idempotent and the receiver may see an id twice.
 *   ok   bool     replies only: present means "this is a reply"
 *   err  int      replies with ok == false: a code of err.h (1..65535)
 *   msg  str      replies with ok == false: a sentence for humans
 * An error reply carries nothing else. When a server could not read the
 * request's op it leaves `op` out of the error reply, and when it could not
 * read the id it sends id 0.
 *
 * The body fields of each op (request and reply) are listed in a table in
 * proto/msg.c: name, type, required or optional, and bounds. Fields that two
 * sockets share an op for (release, refill, vram, status on the engine's
 * control socket and on the broker's) are optional in the codec; the
 * receiver checks what it needs with proto_has(). Summary (R: required,
 * others optional):
 *
 *   request   fields
 *   gen       R steps u32, R batch u32, R seed u64, input bin (f32 LE)
 *   status    -
 *   release   name str, epoch u64, all bool (the engine's: dense weights and
 *             KV cache too)
 *   refill    name str, epoch u64, reserve_mib uint (the broker's partial
 *             grant to a released engine: fill until that many MiB of the
 *             device are free; absent or 0: whole)
 *   vram      R reserve_mib uint|nil (nil: grow back to full), name, epoch
 *   register  R name, pid, gpu, device u32, model, ctl, floor, ceiling,
 *             priority i32, state, resident, capacity, epoch; mapped, free,
 *             http (the engine's OpenAI HTTP URL; absent: it serves none),
 *             kv (its KV pool's device bytes, apart from the cache),
 *             http_token (the bearer token that URL needs: the front door
 *             sends it; the broker never shows it)
 *   heartbeat R name, state, resident, busy bool, idle_ms; mapped, free, epoch,
 *             requests, copied, to_copy, kv, prefix_prompt_tokens,
 *             prefix_cached_tokens, prefix_evictions, kv_host_bytes,
 *             keep_alive_s f64 (the last Ollama request's keep_alive)
 *   acquire   R name, bytes
 *   report    R name, state, resident, reason; duration_ms f64, bytes,
 *             mapped, free, epoch
 *   handoff   R from str, to str
 *   pin       R name, pinned bool
 *   event     R seq, time_ms, kind, engine, gpu, state, reason; ms f64, bytes
 *             (published on PUB; never has a reply)
 *
 *   reply     fields (ok == true)
 *   gen       R steps, batch, checksum u64, output bin; route_ms, load_ms,
 *             compute_ms, total_ms f64
 *   status    all optional: the engine's (name, state, resident, mapped,
 *             target, ceiling, epoch, requests, hits, misses,
 *             last_refill_bytes, last_refill_s f64, device str, gpu, free,
 *             total, level, kv) or the broker's (gpus: array of {uuid, total,
 *             free, reserve, held, kv}, engines: array of {name, pid, gpu, model,
 *             state, resident, floor, ceiling, priority, pinned, idle_ms,
 *             last_refill_gbps f64, peer_gpu, peer, requests, ctl, copied, to_copy,
 *             idle_release_ms, http, kv, prefix_prompt_tokens, prefix_cached_tokens,
 *             prefix_evictions, kv_host_bytes}; every item field required)
 *   release, refill, vram   R state, resident, ms f64, bytes, epoch;
 *             mapped, free, level (the engine's: "none", "experts", "all")
 *   register  R epoch
 *   heartbeat epoch
 *   acquire   R epoch, granted u64
 *   report    epoch
 *   handoff   R release_ms, refill_ms, total_ms f64; decide_ms f64
 *   pin       pinned
 *
 * Integers travel in msgpack's smallest encoding; an f64 field accepts any
 * msgpack number (an integer is converted), but not NaN or infinity.
 * Strings are UTF-8 without NUL bytes: names, states, kinds and URLs at most
 * BATON_PROTO_MAX_NAME bytes, msg and reason at most BATON_PROTO_MAX_TEXT.
 *
 * ---- Decoding hostile bytes -----------------------------------------------
 *
 * proto_decode() first walks the raw bytes with its own scanner: total size,
 * every container count against its cap and against the bytes left (each
 * element needs at least one byte), nesting depth, total object count, str
 * and bin lengths, no ext types, no trailing bytes. Only bytes that pass are
 * given to msgpack-c, so msgpack-c never allocates more than a small
 * multiple of the message. Then every field is checked against the op's
 * table. Error codes (proto/base/base.h):
 *   BATON_ETOOBIG    message, string, bin, array or map larger than its cap
 *   BATON_EMSG       truncated, not a map, trailing bytes, nested too deep,
 *                    non-string key, ext type, reserved byte 0xc1
 *   BATON_EVERSION   v is not 1
 *   BATON_EUNKNOWNOP op is no known op
 *   BATON_EMISSING   a required field (or v, op, id) is absent
 *   BATON_EEXTRA     a key the op's table does not allow (also `ok` in an
 *                    event, body fields in an error reply)
 *   BATON_EDUP       a key appears twice in one map
 *   BATON_ETYPE      a value of the wrong msgpack type
 *   BATON_ERANGE     a number out of its range, id 0 on a request, a string
 *                    with a NUL byte or invalid UTF-8, NaN or infinity
 *
 * ---- Transport ----------------------------------------------------------------
 *
 * nng REQ/REP for commands and PUB/SUB for events, on ipc:// (socket file
 * mode 0660) or tcp://. Every socket sets NNG_OPT_RECVMAXSZ, so nng drops
 * (and disconnects) a peer that sends more than BATON_PROTO_MAX_MSG bytes
 * plus nng's own header; the decoder refuses anything in between.
 * Servers and publishers listen; clients and subscribers dial (and redial
 * when the peer restarts). A peer's death shows only as a pipe event: see
 * proto_opts.on_pipe.
 *
 * A peer that connects and hangs up before the handshake costs nothing
 * (libnng 1.5.2 stopped the listener for good: docs/internals/transport.md says why
 * and how the transport prevents it).
 *
 * Never fork and keep using nng in the child: start other processes with
 * posix_spawn or fork+exec.
 */
#ifndef BATON_PROTO_H
#define BATON_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/base/base.h"

/* ---- limits ----------------------------------------------------------------- */

#define BATON_PROTO_VERSION     1
#define BATON_PROTO_MAX_NAME    256u        /* bytes of a name, state, kind, URL */
#define BATON_PROTO_MAX_TEXT    4096u       /* bytes of msg and reason */
#define BATON_PROTO_MAX_PROMPT  (1u << 20)  /* bytes of a request body or completion text */
#define BATON_PROTO_MAX_BIN     (64u << 20) /* bytes of one bin (gen input/output) */
#define BATON_PROTO_MAX_MSG     (BATON_PROTO_MAX_BIN + (1u << 20)) /* whole message */
#define BATON_PROTO_MAX_ARRAY   1024u       /* items of an array */
#define BATON_PROTO_MAX_KEYS    64u         /* entries of one map */
#define BATON_PROTO_MAX_DEPTH   8u          /* nesting, the top-level map is 1 */
#define BATON_PROTO_MAX_OBJECTS 65536u      /* msgpack objects in one message */
#define BATON_PROTO_MAX_ERR     65535       /* largest `err` code on the wire */

/* reserve_mib: nil on the wire ("no reserve: grow back to full"). */
#define PROTO_RESERVE_FULL      UINT64_MAX
#define PROTO_RESERVE_MIB_MAX   (UINT64_C(1) << 40)

/* ---- ops ---------------------------------------------------------------------- */

#define PROTO_OPS(X)                                                            \
	X(GEN,       "gen")                                                     \
	X(STATUS,    "status")                                                  \
	X(RELEASE,   "release")                                                 \
	X(REFILL,    "refill")                                                  \
	X(VRAM,      "vram")                                                    \
	X(REGISTER,  "register")                                                \
	X(HEARTBEAT, "heartbeat")                                               \
	X(ACQUIRE,   "acquire")                                                 \
	X(REPORT,    "report")                                                  \
	X(HANDOFF,   "handoff")                                                 \
	X(PIN,       "pin")                                                     \
	X(EVENT,     "event")                                                   \
	X(PEER,      "peer")                                                    \
	X(COMPLETE,  "complete")                                                \
	X(LEASE,     "lease")                                                   \
	X(EXTERNAL,  "external")

enum proto_op {
	PROTO_OP_NONE = 0, /* no op: a zeroed message, or an unreadable one */
#define PROTO_OP_ENUM(e, s) PROTO_OP_##e,
	PROTO_OPS(PROTO_OP_ENUM)
#undef PROTO_OP_ENUM
	PROTO_OP_COUNT
};

/* "gen", ...; "none" for PROTO_OP_NONE and for numbers out of range. */
const char *proto_op_name(enum proto_op op);
/* The op of a wire name; PROTO_OP_NONE when unknown or NULL. */
enum proto_op proto_op_parse(const char *name);

/* The one rule for an engine's name (register, the CLI, the HTTP API, the
 * configuration): 1 to PROTO_NAME_LEN_MAX bytes of ASCII letters, digits,
 * '-', '_' or '.'. len bytes of s are checked (s need not end there); 1
 * when valid, else 0. */
#define PROTO_NAME_LEN_MAX 64
int proto_name_valid(const char *s, size_t len);

/* ---- body fields --------------------------------------------------------------
 *
 * One row per body field: X(ENUM, "key", TYPE, member, limit). TYPE is
 * BOOL, U32, U64, I32, F64, STR, BIN, RESERVE (u64, or nil on the wire as
 * PROTO_RESERVE_FULL), GPUS or ENGINES (arrays of maps). limit is the max
 * bytes of a STR/BIN, the max items of an array, 0 for numbers (the C
 * type's range). Two rows may share a key with different types ("device" is
 * a u32 index in register, the device name in the engine's status reply):
 * the op's table picks one. Adding a field is one row here (the member of
 * struct baton_msg and the enum are made from it) and one row in the op's
 * table in proto/msg.c.
 */
#define PROTO_FIELDS(X)                                                                  \
	/* gen */                                                                         \
	X(STEPS,             "steps",             U32,     steps,             0)           \
	X(BATCH,             "batch",             U32,     batch,             0)           \
	X(SEED,              "seed",              U64,     seed,              0)           \
	X(INPUT,             "input",             BIN,     input,             BATON_PROTO_MAX_BIN) \
	X(OUTPUT,            "output",            BIN,     output,            BATON_PROTO_MAX_BIN) \
	X(CHECKSUM,          "checksum",          U64,     checksum,          0)           \
	X(ROUTE_MS,          "route_ms",          F64,     route_ms,          0)           \
	X(LOAD_MS,           "load_ms",           F64,     load_ms,           0)           \
	X(COMPUTE_MS,        "compute_ms",        F64,     compute_ms,        0)           \
	X(TOTAL_MS,          "total_ms",          F64,     total_ms,          0)           \
	/* control */                                                                     \
	X(EPOCH,             "epoch",             U64,     epoch,             0)           \
	X(RESERVE_MIB,       "reserve_mib",       RESERVE, reserve_mib,       0)           \
	X(NAME,              "name",              STR,     name,              BATON_PROTO_MAX_NAME) \
	X(PID,               "pid",               U32,     pid,               0)           \
	X(GPU,               "gpu",               STR,     gpu,               BATON_PROTO_MAX_NAME) \
	X(DEVICE,            "device",            U32,     device,            0)           \
	X(MODEL,             "model",             STR,     model,             BATON_PROTO_MAX_NAME) \
	X(CTL,               "ctl",               STR,     ctl,               BATON_PROTO_MAX_NAME) \
	X(HTTP,              "http",              STR,     http,              BATON_PROTO_MAX_NAME) \
	X(HTTP_TOKEN,        "http_token",        STR,     http_token,        BATON_PROTO_MAX_NAME) \
	X(FLOOR,             "floor",             U64,     floor,             0)           \
	X(CEILING,           "ceiling",           U64,     ceiling,           0)           \
	X(PRIORITY,          "priority",          I32,     priority,          0)           \
	X(STATE,             "state",             STR,     state,             BATON_PROTO_MAX_NAME) \
	X(RESIDENT,          "resident",          U64,     resident,          0)           \
	X(CAPACITY,          "capacity",          U64,     capacity,          0)           \
	X(BUSY,              "busy",              BOOL,    busy,              0)           \
	X(IDLE_MS,           "idle_ms",           U64,     idle_ms,           0)           \
	X(BYTES,             "bytes",             U64,     bytes,             0)           \
	X(REASON,            "reason",            STR,     reason,            BATON_PROTO_MAX_TEXT) \
	X(DURATION_MS,       "duration_ms",       F64,     duration_ms,       0)           \
	X(FROM,              "from",              STR,     from,              BATON_PROTO_MAX_NAME) \
	X(TO,                "to",                STR,     to,                BATON_PROTO_MAX_NAME) \
	X(PINNED,            "pinned",            BOOL,    pinned,            0)           \
	X(GRANTED,           "granted",           U64,     granted,           0)           \
	X(MS,                "ms",                F64,     ms,                0)           \
	X(RELEASE_MS,        "release_ms",        F64,     release_ms,        0)           \
	X(REFILL_MS,         "refill_ms",         F64,     refill_ms,         0)           \
	X(DECIDE_MS,         "decide_ms",         F64,     decide_ms,         0)           \
	/* copy progress of a refill in progress: bytes copied of bytes to copy */      \
	X(COPIED,            "copied",            U64,     copied,            0)           \
	X(TO_COPY,           "to_copy",           U64,     to_copy,           0)           \
	/* the prefix cache of a text engine (heartbeats): prompt tokens admitted,  \
	 * of them taken from the cache, cached blocks evicted, KV bytes kept in host \
	 * memory while released (engine/model/model.h) */                              \
	X(PREFIX_PROMPT,     "prefix_prompt_tokens", U64,  prefix_prompt,     0)           \
	X(PREFIX_CACHED,     "prefix_cached_tokens", U64,  prefix_cached,     0)           \
	X(PREFIX_EVICTIONS,  "prefix_evictions",  U64,     prefix_evictions,  0)           \
	X(KV_HOST_BYTES,     "kv_host_bytes",     U64,     kv_host_bytes,     0)           \
	/* an Ollama request's keep_alive: seconds idle before the release (< 0 never) */ \
	X(KEEP_ALIVE_S,      "keep_alive_s",      F64,     keep_alive_s,      0)           \
	/* events */                                                                      \
	X(SEQ,               "seq",               U64,     seq,               0)           \
	X(TIME_MS,           "time_ms",           U64,     time_ms,           0)           \
	X(KIND,              "kind",              STR,     kind,              BATON_PROTO_MAX_NAME) \
	X(ENGINE,            "engine",            STR,     engine,            BATON_PROTO_MAX_NAME) \
	/* status replies */                                                              \
	X(MAPPED,            "mapped",            U64,     mapped,            0)           \
	X(TARGET,            "target",            U64,     target,            0)           \
	X(REQUESTS,          "requests",          U64,     requests,          0)           \
	X(HITS,              "hits",              U64,     hits,              0)           \
	X(MISSES,            "misses",            U64,     misses,            0)           \
	X(LAST_REFILL_BYTES, "last_refill_bytes", U64,     last_refill_bytes, 0)           \
	X(LAST_REFILL_S,     "last_refill_s",     F64,     last_refill_s,     0)           \
	X(DEVICE_NAME,       "device",            STR,     device_name,       BATON_PROTO_MAX_NAME) \
	X(FREE,              "free",              U64,     free_bytes,        0)           \
	X(TOTAL,             "total",             U64,     total,             0)           \
	/* the engine's KV pool on its device, its own line in the books */              \
	X(KV,                "kv",                U64,     kv,                0)           \
	/* peer tier (a second cache tier on another GPU, lent by the broker) */      \
	X(PEER_GPU,          "peer_gpu",          STR,     peer_gpu,          BATON_PROTO_MAX_NAME) \
	X(PEER_MIB,          "peer_mib",          U64,     peer_mib,          0)           \
	X(PEER_MAPPED,       "peer_mapped",       U64,     peer_mapped,       0)           \
	X(PEER_WANT,         "peer_want",         U64,     peer_want,         0)           \
	X(PEER_FREE,         "peer_free",         U64,     peer_free,         0)           \
	/* release levels: release with all also gives back the dense weights and KV */ \
	X(ALL,               "all",               BOOL,    all,               0)           \
	X(LEVEL,             "level",             STR,     level,             BATON_PROTO_MAX_NAME) \
	/* complete: text in, sampled tokens and text out (engine/serve) */              \
	X(BODY,              "body",              STR,     body,              BATON_PROTO_MAX_PROMPT) \
	X(TEXT,              "text",              STR,     text,              BATON_PROTO_MAX_PROMPT) \
	X(TOKENS,            "tokens",            BIN,     tokens,            BATON_PROTO_MAX_BIN) \
	X(PROMPT_TOKENS,     "prompt_tokens",     U32,     prompt_tokens,     0)           \
	X(COMPLETION_TOKENS, "completion_tokens", U32,     completion_tokens, 0)           \
	X(FINISH_REASON,     "finish_reason",     STR,     finish_reason,     BATON_PROTO_MAX_NAME) \
	X(PREFILL_MS,        "prefill_ms",        F64,     prefill_ms,        0)           \
	X(DECODE_MS,         "decode_ms",         F64,     decode_ms,         0)           \
	/* heartbeats, status: the KV pool (the broker's serving gauges) */              \
	X(KV_USED,           "kv_blocks_used",    U64,     kv_used,           0)           \
	X(KV_TOTAL,          "kv_blocks",         U64,     kv_total,          0)           \
	X(GPUS,              "gpus",              GPUS,    gpus,              BATON_PROTO_MAX_ARRAY) \
	X(ENGINES,           "engines",           ENGINES, engines,           BATON_PROTO_MAX_ARRAY)

enum proto_field {
#define PROTO_FIELD_ENUM(e, key, type, member, limit) PF_##e,
	PROTO_FIELDS(PROTO_FIELD_ENUM)
#undef PROTO_FIELD_ENUM
	PF_COUNT
};

/* The wire key of a field ("steps"); "?" out of range. */
const char *proto_field_key(enum proto_field f);

/* A byte string. In a decoded message `data` points into the message's own
 * storage, aligned to 8 bytes (a gen input/output is little-endian f32s). */
struct proto_bin {
	const void *data;
	size_t len;
};

/* An item of the broker's status reply `gpus`; every field required. */
struct proto_gpu {
	const char *uuid;
	uint64_t total, free_bytes, reserve, held; /* keys total, free, reserve, held */
	uint64_t lent; /* bytes of this GPU lent to engines of other GPUs as their peer tier */
	uint32_t index;   /* as nvidia-smi numbers it (NVML), else the engines' device index */
	const char *name; /* the product name as nvidia-smi shows it; "host device N" */
	uint64_t kv;      /* bytes of this GPU its engines' KV pools hold (not in held) */
};

/* An item of the broker's status reply `engines`; every field required. */
struct proto_engine_info {
	const char *name;
	uint32_t pid;
	const char *gpu, *model, *state;
	uint64_t resident, floor, ceiling;
	int32_t priority;
	bool pinned;
	uint64_t idle_ms;
	double last_refill_gbps;
	const char *peer_gpu; /* "" when the engine has no peer device */
	uint64_t peer;        /* peer-tier bytes it holds on peer_gpu now */
	uint64_t requests;    /* GEN requests it answered since it started (heartbeats) */
	const char *ctl;      /* its control socket's URL, as it registered */
	uint64_t copied, to_copy; /* its refill in progress: bytes copied of to copy (0, 0: none) */
	uint64_t idle_release_ms; /* its idle-release timeout (0: none; pinned engines are never released) */
	const char *http;     /* its OpenAI HTTP URL, "" when it serves none */
	uint64_t kv;          /* its KV pool's device bytes (apart from resident and the cache) */
	/* its prefix cache (heartbeats; 0 for engines without text): prompt
	 * tokens, those taken from the cache, evictions, KV bytes in host memory */
	uint64_t prefix_prompt, prefix_cached, prefix_evictions, kv_host_bytes;
	uint64_t kv_used, kv_total; /* its KV pool's blocks in use, of all (heartbeats; 0, 0: none) */
};

struct proto_gpus {
	const struct proto_gpu *v;
	uint32_t n;
};

struct proto_engines {
	const struct proto_engine_info *v;
	uint32_t n;
};

#define PROTO_CT_BOOL    bool
#define PROTO_CT_U32     uint32_t
#define PROTO_CT_U64     uint64_t
#define PROTO_CT_I32     int32_t
#define PROTO_CT_F64     double
#define PROTO_CT_STR     const char *
#define PROTO_CT_BIN     struct proto_bin
#define PROTO_CT_RESERVE uint64_t
#define PROTO_CT_GPUS    struct proto_gpus
#define PROTO_CT_ENGINES struct proto_engines

#define PROTO_HAS_WORDS ((PF_COUNT + 63) / 64)

/*
 * One message: request, reply or event.
 *
 * Ownership. Pointers in a message (strings, bins, arrays) are borrowed
 * when you build a message to send: they must stay valid until the encode
 * or send call returns, and nothing frees them. A message filled by
 * proto_decode() or a receive function owns copies of everything it points
 * to, in one block that proto_msg_free() releases; strings are
 * NUL-terminated. Do not copy a decoded message by value and free both.
 *
 * Which body fields are on the wire: required fields of the op's table
 * always; optional ones when their presence bit is set (proto_set()). A
 * decoded message has the bit of every field that was present.
 */
struct baton_msg {
	/* envelope */
	enum proto_op op;
	uint64_t id;
	bool reply;        /* false: request or event; true: reply */
	bool ok;           /* replies: success */
	int32_t err;       /* replies with !ok: a code of err.h */
	const char *msg;   /* replies with !ok: text; NULL when encoding means
	                    * baton_strerror(err); longer than
	                    * BATON_PROTO_MAX_TEXT is cut at a UTF-8 boundary */
	/* transport metadata, never encoded: the nng pipe a received message
	 * came from (0 otherwise); see proto_pipe_pid(). */
	uint32_t pipe;
	/* presence bits of the body fields, see proto_has() */
	uint64_t has[PROTO_HAS_WORDS];
	/* body: one member per row of PROTO_FIELDS */
#define PROTO_FIELD_MEMBER(e, key, type, member, limit) PROTO_CT_##type member;
	PROTO_FIELDS(PROTO_FIELD_MEMBER)
#undef PROTO_FIELD_MEMBER
	/* private: storage owned by a decoded message */
	void *own_;
};

/* Zeroes *m and makes it a request (or event, for PROTO_OP_EVENT) of `op`
 * with a fresh id from proto_next_id(). Resending the same message (same
 * id) is how a caller retries an idempotent request. */
void proto_msg_init(struct baton_msg *m, enum proto_op op);
/* Zeroes *rep and makes it a successful reply to `req` (same op and id);
 * rep may be req. */
void proto_reply_init(struct baton_msg *rep, const struct baton_msg *req);
/* Zeroes *rep and makes it an error reply: op (PROTO_OP_NONE when the
 * request's op is unknown: `op` is then left out), id (0 when unknown),
 * err (a code of err.h, not 0) and text (borrowed; NULL: baton_strerror). */
void proto_reply_error(struct baton_msg *rep, enum proto_op op, uint64_t id,
    int err, const char *text);
/* Frees what a decoded message owns and zeroes *m. Idempotent; harmless on
 * a message you built yourself (it owns nothing) and on NULL. */
void proto_msg_free(struct baton_msg *m);

/* Presence bits of body fields. proto_set() marks an optional field to be
 * sent; required fields are sent whatever their bit says. */
static inline bool proto_has(const struct baton_msg *m, enum proto_field f)
{
	return (unsigned)f < PF_COUNT && ((m->has[f / 64] >> (f % 64)) & 1u);
}
static inline void proto_set(struct baton_msg *m, enum proto_field f)
{
	if ((unsigned)f < PF_COUNT)
		m->has[f / 64] |= UINT64_C(1) << (f % 64);
}

/* An optional number field's value and its presence bit, in one call, by
 * the field catalog (PROTO_FIELDS): the senders' one way to fill a
 * message's counts. BATON_EINVAL, and *m unchanged, when f is not a field
 * of that type (U64 for proto_put_u64, F64 for proto_put_f64). */
int proto_put_u64(struct baton_msg *m, enum proto_field f, uint64_t v);
int proto_put_f64(struct baton_msg *m, enum proto_field f, double v);
/* A U64 field's value when its presence bit is set, else dflt (also for
 * a field that is not U64): the receivers' reading of an optional count. */
uint64_t proto_u64_or(const struct baton_msg *m, enum proto_field f, uint64_t dflt);
static inline void proto_unset(struct baton_msg *m, enum proto_field f)
{
	if ((unsigned)f < PF_COUNT)
		m->has[f / 64] &= ~(UINT64_C(1) << (f % 64));
}

/* Whether `f` may appear in a request (reply = false) or successful reply
 * (reply = true) of `op`, and whether it must. Lets a receiver or a tool
 * walk the table. */
bool proto_field_allowed(enum proto_op op, bool reply, enum proto_field f);
bool proto_field_required(enum proto_op op, bool reply, enum proto_field f);

/* A fresh request id: nonzero, unique in this process, random start so two
 * processes rarely collide. Thread-safe. */
uint64_t proto_next_id(void);

/* ---- codec ---------------------------------------------------------------------- */

/* What a failed decode (or encode) could still tell. */
struct proto_diag {
	uint64_t id;        /* the message's id if it was readable before the
	                     * error, else 0 */
	enum proto_op op;   /* its op if readable and known, else PROTO_OP_NONE */
	char text[256];     /* a sentence naming the field; "" on success */
};

/*
 * Decodes one message from len bytes. Never trusts the bytes (see the top
 * of this file). On success *m owns copies of every string, bin and array
 * (free with proto_msg_free()). On failure *m is zeroed and owns nothing,
 * the return is the error code and diag (may be NULL) names the problem and
 * keeps the id and op when they were readable, so a server can still send
 * an error reply with the right id. Non-blocking; thread-safe on distinct
 * messages. Allocates at most a small multiple of len.
 */
int proto_decode(const void *buf, size_t len, struct baton_msg *m, struct proto_diag *diag);

/*
 * Encodes *m with msgpack-c into a malloc'd buffer (*buf, *len; the caller
 * frees it with free()). Checks *m against the same table and bounds as the
 * decoder, so what encodes also decodes: required fields present (a NULL
 * required string: BATON_EMISSING), no field outside the op's table
 * (BATON_EEXTRA), lengths (BATON_ETOOBIG), UTF-8, finite floats, id nonzero
 * on requests (BATON_ERANGE). BATON_ENOMEM when allocation fails. On failure
 * *buf is NULL. diag may be NULL.
 */
int proto_encode(const struct baton_msg *m, void **buf, size_t *len, struct proto_diag *diag);

/* ---- transport ------------------------------------------------------------------ */

enum proto_pipe_ev {
	PROTO_PIPE_ADD = 1, /* a peer connected (NNG_PIPE_EV_ADD_POST) */
	PROTO_PIPE_REM = 2, /* a peer went away (NNG_PIPE_EV_REM_POST): it
	                     * closed or its process died */
};

struct proto_pipe_event {
	enum proto_pipe_ev ev;
	uint32_t pipe;  /* nng pipe id; matches baton_msg.pipe of its messages */
	int pid;        /* the peer's pid on ipc://, else -1 (on REM: the pid
	                 * seen at ADD) */
};

/* Called on an nng thread, possibly concurrently with itself and with your
 * other threads. Keep it short (record, signal a condition variable); do
 * not close the socket or call blocking proto functions from it. */
typedef void (*proto_pipe_fn)(void *arg, const struct proto_pipe_event *ev);

/* Options of every open function; NULL or a zeroed struct means defaults. */
struct proto_opts {
	size_t recvmax;       /* NNG_OPT_RECVMAXSZ: 0 or more than
	                       * BATON_PROTO_MAX_MSG means BATON_PROTO_MAX_MSG */
	int ipc_mode;         /* listeners on ipc://: socket file mode, 0: 0660 */
	int send_timeout_ms;  /* replies and requests: 0: 5000; <0: forever */
	int resend_ms;        /* REQ: resend an unanswered request after this
	                       * and when its connection drops; 0: 60000
	                       * (nng's default). <0: never: a dropped
	                       * connection fails the call with BATON_ECONN. */
	bool dial_wait;       /* clients and subscribers: connect now and fail
	                       * with BATON_ECONN when nobody listens. Default:
	                       * connect in the background and keep retrying. */
	proto_pipe_fn on_pipe; /* optional, registered before the socket
	                        * listens or dials, so no pipe is missed */
	void *pipe_arg;
	int close_timeout_ms; /* how long a close waits for nng; 0: 2000.
	                       * See "Closing" below. */
};

/*
 * Closing. Every close and shutdown first stops and waits out the
 * operations of other threads on the socket, then calls nng_close with a
 * deadline. libnng 1.5.2 can lose a read when a socket is closed while a
 * message is arriving on it, and its nng_close then never returns (nor
 * does its atexit handler). When that happens the close gives up after
 * close_timeout_ms, leaks the socket, returns BATON_ETIMEDOUT, and
 * proto_nng_wedged() turns true: the process should then leave with
 * _exit() (exit() would hang in nng's handler). It needs a peer that sends
 * at the moment of the close; a client with no call in flight and no
 * timed-out call whose reply may still come, or a server whose clients
 * are quiet, closes safely.
 */
bool proto_nng_wedged(void);

/* The peer pid of an ipc:// pipe (from baton_msg.pipe or a pipe event);
 * -1 when unknown, not ipc, or the pipe is gone. */
int proto_pipe_pid(uint32_t pipe);

/*
 * REP server. proto_server_open() listens on url (ipc://PATH or
 * tcp://HOST:PORT; a stale ipc socket file is replaced) and returns at once.
 *
 * Receiving and replying go through a context (nng_ctx): one request at a
 * time per context, replied on the same context. A server answering
 * several requests concurrently opens one context per worker thread, each
 * thread looping proto_ctx_recv() / proto_ctx_reply(). The server's own
 * context (proto_server_recv/reply) is for a single-threaded server.
 *
 * proto_ctx_recv() waits up to timeout_ms (<0: forever) for a request and
 * decodes it into *req (the caller frees it with proto_msg_free()). A
 * request that does not decode is answered by the transport itself with an
 * error reply (its id and op when readable) and reported to the caller with
 * the decode error and diag; the context is then ready for the next
 * receive. Replies (ok or not) and events arriving on a server are
 * answered with BATON_EINVAL the same way. Returns 0, BATON_ETIMEDOUT,
 * BATON_ECLOSED (server shut down) or a decode error.
 *
 * proto_ctx_reply() sends the reply of the request last received on ctx
 * (its id should be that request's: proto_reply_init()). A reply that does
 * not encode is replaced by an error reply (BATON_EINTERNAL) so the client
 * is not left waiting; the encode error is returned. If the client went
 * away, the reply is dropped silently (nng REP semantics) and 0 returned.
 * Not calling reply and receiving again drops the request: the client
 * times out.
 *
 * Threads: a context is used by one thread at a time; distinct contexts
 * and the server itself are thread-safe. proto_server_shutdown() closes the
 * socket: every blocked receive returns BATON_ECLOSED; it is idempotent and
 * may be called from any thread (not from a pipe callback). Free in this
 * order: proto_server_shutdown(), join the workers, proto_ctx_close() each
 * context, proto_server_close().
 */
struct proto_server;
struct proto_ctx;

/* For an ipc:// url, creates the socket's directory when missing (its
 * parents 0755, itself 0770: the sockets are for the group); other urls
 * need nothing. 0, or -1 with errno. */
int proto_ipc_dir(const char *url);

int proto_server_open(struct proto_server **srv, const char *url, const struct proto_opts *opts);
int proto_server_recv(struct proto_server *srv, struct baton_msg *req, int timeout_ms,
    struct proto_diag *diag);
int proto_server_reply(struct proto_server *srv, const struct baton_msg *rep);
int proto_ctx_open(struct proto_server *srv, struct proto_ctx **ctx);
int proto_ctx_recv(struct proto_ctx *ctx, struct baton_msg *req, int timeout_ms,
    struct proto_diag *diag);
int proto_ctx_reply(struct proto_ctx *ctx, const struct baton_msg *rep);
/* Frees a context; NULL is allowed. Not while another thread uses it, and
 * before its server is closed. */
void proto_ctx_close(struct proto_ctx *ctx);
/* 0, or BATON_ETIMEDOUT (see "Closing"). */
int proto_server_shutdown(struct proto_server *srv);
/* Shuts down and frees; NULL is allowed. Blocks until nng has closed the
 * socket and its pipe callbacks have returned, or the close deadline: 0 or
 * BATON_ETIMEDOUT (see "Closing"; the server is then leaked). */
int proto_server_close(struct proto_server *srv);
/* The URL it listens on, with the port filled in for tcp://...:0. */
const char *proto_server_url(const struct proto_server *srv);

/*
 * REQ client: one connection, kept and redialed by nng (so a server sees
 * one pipe per client and its REM event when the client dies).
 *
 * proto_client_call() sends *req (a request with a nonzero id) and waits
 * up to timeout_ms in total (<0: forever) for its reply, which it decodes
 * into *rep (free with proto_msg_free()). nng resends the request when the
 * connection drops and after opts.resend_ms, so the server may see it more
 * than once: requests are idempotent. Returns 0 for a reply with ok; the
 * reply's err (rep->reply true, rep->err and rep->msg set) for an error
 * reply; BATON_ETIMEDOUT when no reply came in time (also when no server is
 * up); BATON_ECONN when the connection dropped and resend_ms < 0;
 * BATON_ECLOSED after shutdown; a decode error (rep empty, diag says why)
 * for an unreadable reply or one whose id or op is not the request's.
 * Thread-safe: each call uses its own nng context, so several threads may
 * call at once on one client.
 */
struct proto_client;

int proto_client_open(struct proto_client **cli, const char *url, const struct proto_opts *opts);
int proto_client_call(struct proto_client *cli, const struct baton_msg *req,
    struct baton_msg *rep, int timeout_ms, struct proto_diag *diag);
/* Closes the socket: calls in flight return BATON_ECLOSED, later ones too.
 * Idempotent; any thread (not a pipe callback). 0 or BATON_ETIMEDOUT. */
int proto_client_shutdown(struct proto_client *cli);
/* Closes and frees; NULL is allowed. No call may be in flight: to abort
 * them, proto_client_shutdown(), join the callers, then close. 0 or
 * BATON_ETIMEDOUT (see "Closing"). */
int proto_client_close(struct proto_client *cli);

/* One-shot: connect (BATON_ECONN when nobody listens), call, close. For the CLI and tests. A
 * caller that gave up on a reply (BATON_ETIMEDOUT) should check
 * proto_nng_wedged() before it exits (see "Closing"). */
int proto_call(const char *url, const struct baton_msg *req, struct baton_msg *rep,
    int timeout_ms, struct proto_diag *diag);

/*
 * PUB/SUB for events. Topic-less: subscribers receive everything.
 * proto_publish() encodes and sends an event (op PROTO_OP_EVENT, else
 * BATON_EINVAL) to every subscriber connected now; it never blocks: each
 * subscriber has a queue of 1024 events, and when a slow one's is full the
 * oldest is dropped (subscribers see the gap in seq). Thread-safe.
 * proto_sub_recv() waits up to timeout_ms (<0: forever) for the next event
 * and decodes it (free with proto_msg_free()); an undecodable message
 * returns its decode error and diag, and the next call goes on with the
 * next message. One thread at a time per subscriber.
 */
struct proto_pub;
struct proto_sub;

int proto_pub_open(struct proto_pub **pub, const char *url, const struct proto_opts *opts);
int proto_publish(struct proto_pub *pub, const struct baton_msg *ev);
/* NULL is allowed; 0 or BATON_ETIMEDOUT (see "Closing"). */
int proto_pub_close(struct proto_pub *pub);
const char *proto_pub_url(const struct proto_pub *pub);

int proto_sub_open(struct proto_sub **sub, const char *url, const struct proto_opts *opts);
int proto_sub_recv(struct proto_sub *sub, struct baton_msg *ev, int timeout_ms,
    struct proto_diag *diag);
/* NULL is allowed; 0 or BATON_ETIMEDOUT (see "Closing"). */
int proto_sub_close(struct proto_sub *sub);

#endif
