/*
 * msg.c: the message tables (which fields each op carries, their types and
 * bounds) and the small helpers around struct baton_msg.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <msgpack.h>

#include "proto/proto_int.h"

/* ---- the field catalog (from PROTO_FIELDS in proto.h) ---------------------- */

const struct proto__fdef proto__fields[PF_COUNT] = {
#define FDEF(e, k, t, member, lim) \
	[PF_##e] = { k, PT_##t, PF_##e, offsetof(struct baton_msg, member), lim },
	PROTO_FIELDS(FDEF)
#undef FDEF
};

/* ---- array items ------------------------------------------------------------------ */

#define IDEF(S, k, t, member, lim) { k, PT_##t, -1, offsetof(S, member), lim }

static const struct proto__fdef gpu_fields[] = {
	IDEF(struct proto_gpu, "uuid",    STR, uuid,       BATON_PROTO_MAX_NAME),
	IDEF(struct proto_gpu, "total",   U64, total,      0),
	IDEF(struct proto_gpu, "free",    U64, free_bytes, 0),
	IDEF(struct proto_gpu, "reserve", U64, reserve,    0),
	IDEF(struct proto_gpu, "held",    U64, held,       0),
	IDEF(struct proto_gpu, "lent",    U64, lent,       0),
	IDEF(struct proto_gpu, "index",   U32, index,      0),
	IDEF(struct proto_gpu, "name",    STR, name,       BATON_PROTO_MAX_NAME),
	IDEF(struct proto_gpu, "kv",      U64, kv,         0),
};

static const struct proto__fdef engine_fields[] = {
	IDEF(struct proto_engine_info, "name",             STR,  name,             BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "pid",              U32,  pid,              0),
	IDEF(struct proto_engine_info, "gpu",              STR,  gpu,              BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "model",            STR,  model,            BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "state",            STR,  state,            BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "resident",         U64,  resident,         0),
	IDEF(struct proto_engine_info, "floor",            U64,  floor,            0),
	IDEF(struct proto_engine_info, "ceiling",          U64,  ceiling,          0),
	IDEF(struct proto_engine_info, "priority",         I32,  priority,         0),
	IDEF(struct proto_engine_info, "pinned",           BOOL, pinned,           0),
	IDEF(struct proto_engine_info, "idle_ms",          U64,  idle_ms,          0),
	IDEF(struct proto_engine_info, "last_refill_gbps", F64,  last_refill_gbps, 0),
	IDEF(struct proto_engine_info, "peer_gpu",         STR,  peer_gpu,         BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "peer",             U64,  peer,             0),
	IDEF(struct proto_engine_info, "requests",         U64,  requests,         0),
	IDEF(struct proto_engine_info, "ctl",              STR,  ctl,              BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "copied",           U64,  copied,           0),
	IDEF(struct proto_engine_info, "to_copy",          U64,  to_copy,          0),
	IDEF(struct proto_engine_info, "idle_release_ms",  U64,  idle_release_ms,  0),
	IDEF(struct proto_engine_info, "http",             STR,  http,             BATON_PROTO_MAX_NAME),
	IDEF(struct proto_engine_info, "kv",               U64,  kv,               0),
	IDEF(struct proto_engine_info, "prefix_prompt_tokens", U64, prefix_prompt,  0),
	IDEF(struct proto_engine_info, "prefix_cached_tokens", U64, prefix_cached,  0),
	IDEF(struct proto_engine_info, "prefix_evictions", U64,  prefix_evictions, 0),
	IDEF(struct proto_engine_info, "kv_host_bytes",    U64,  kv_host_bytes,    0),
	IDEF(struct proto_engine_info, "kv_blocks_used",   U64,  kv_used,          0),
	IDEF(struct proto_engine_info, "kv_blocks",        U64,  kv_total,         0),
};

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static const struct proto__item gpu_item = {
	gpu_fields, NELEM(gpu_fields), sizeof(struct proto_gpu), "gpu"
};
static const struct proto__item engine_item = {
	engine_fields, NELEM(engine_fields), sizeof(struct proto_engine_info), "engine"
};

const struct proto__item *proto__item_of(enum proto__type t)
{
	switch (t) {
	case PT_GPUS: return &gpu_item;
	case PT_ENGINES: return &engine_item;
	default: return NULL;
	}
}

/* ---- the per-op tables --------------------------------------------------------------
 *
 * R: required, O: optional. Requests of ops that two sockets share
 * (release, refill, vram, status) list the union, optional; the receiver
 * checks what it needs.
 */
#define R(e) { &proto__fields[PF_##e], true }
#define O(e) { &proto__fields[PF_##e], false }

static const struct proto__row gen_req[] = { R(STEPS), R(BATCH), R(SEED), O(INPUT) };
static const struct proto__row gen_rep[] = {
	R(STEPS), R(BATCH), R(CHECKSUM), R(OUTPUT),
	O(ROUTE_MS), O(LOAD_MS), O(COMPUTE_MS), O(TOTAL_MS),
};

static const struct proto__row status_rep[] = {
	/* the engine's */
	O(NAME), O(STATE), O(RESIDENT), O(MAPPED), O(TARGET), O(CEILING), O(EPOCH),
	O(REQUESTS), O(HITS), O(MISSES), O(LAST_REFILL_BYTES), O(LAST_REFILL_S),
	O(DEVICE_NAME), O(GPU), O(FREE), O(TOTAL),
	O(PEER_GPU), O(PEER_MAPPED), O(PEER_FREE),
	O(LEVEL), /* what a release gave back: "none", "experts", "all" */
	O(KV), /* the KV pool's device bytes */
	/* the broker's */
	O(GPUS), O(ENGINES),
};

/* release and refill share their tables */
static const struct proto__row cache_req[] = { O(NAME), O(EPOCH), O(ALL), O(REASON) }; /* reason: who asks (the front door) */
static const struct proto__row cache_rep[] = {
	R(STATE), R(RESIDENT), R(MS), R(BYTES), R(EPOCH), O(LEVEL),
	O(MAPPED), O(FREE), /* the device bytes the cache holds after it, the device free */
	O(PEER_MAPPED), O(PEER_FREE), /* the same for the peer tier's device */
};
static const struct proto__row vram_req[] = { R(RESERVE_MIB), O(NAME), O(EPOCH) };
/* reserve_mib: the broker's partial grant to a released engine (fill until
 * that much of the device is free); absent or 0: whole */
static const struct proto__row refill_req[] = { O(NAME), O(EPOCH), O(ALL), O(REASON), O(RESERVE_MIB) };

static const struct proto__row register_req[] = {
	R(NAME), R(PID), R(GPU), R(DEVICE), R(MODEL), R(CTL), R(FLOOR), R(CEILING),
	R(PRIORITY), R(STATE), R(RESIDENT), R(CAPACITY), R(EPOCH),
	O(MAPPED), O(FREE),
	/* peer tier: the peer device's uuid, the bytes a peer tier could use,
	 * what it holds there now (a broker restart sees a live loan) */
	O(PEER_GPU), O(PEER_WANT), O(PEER_MAPPED), O(PEER_FREE),
	O(HTTP), /* its OpenAI HTTP URL (the broker's front door forwards there) */
	O(HTTP_TOKEN), /* the bearer token that URL needs (the door sends it; never shown) */
	O(KV), /* its KV pool's device bytes (the broker's books: apart from the cache) */
};
static const struct proto__row epoch_rep[] = { R(EPOCH) };
static const struct proto__row epoch_opt_rep[] = { O(EPOCH) };

static const struct proto__row heartbeat_req[] = {
	R(NAME), R(STATE), R(RESIDENT), R(BUSY), R(IDLE_MS),
	O(MAPPED), O(FREE), O(EPOCH), /* epoch: of the state sent (accounting order) */
	O(PEER_MAPPED), O(PEER_FREE),
	O(REQUESTS), /* GEN requests answered since the engine started */
	O(COPIED), O(TO_COPY), /* while refilling: its copy progress */
	O(KV), /* its KV pool's device bytes now (0 after a release of everything) */
	O(PREFIX_PROMPT), O(PREFIX_CACHED), O(PREFIX_EVICTIONS), O(KV_HOST_BYTES), /* a text engine's prefix cache */
	O(KV_USED), O(KV_TOTAL), /* its KV pool: blocks in use, of all */
	O(KEEP_ALIVE_S), /* the last Ollama request's keep_alive (seconds; < 0: never) */
};
static const struct proto__row acquire_req[] = { R(NAME), R(BYTES) };
static const struct proto__row acquire_rep[] = { R(EPOCH), R(GRANTED) };
static const struct proto__row report_req[] = {
	R(NAME), R(STATE), R(RESIDENT), R(REASON), O(DURATION_MS), O(BYTES),
	O(MAPPED), O(FREE), O(EPOCH), O(PEER_MAPPED), O(PEER_FREE), O(KV),
};
/* peer: the broker lends (peer_mib > 0: hold up to that much on the peer
 * device peer_gpu) or revokes (peer_mib 0: drop the peer tier, then reply). */
static const struct proto__row peer_req[] = { R(PEER_MIB), O(NAME), O(EPOCH), O(PEER_GPU) };
static const struct proto__row handoff_req[] = { R(FROM), R(TO) };
static const struct proto__row handoff_rep[] = {
	R(RELEASE_MS), R(REFILL_MS), R(TOTAL_MS), O(DECIDE_MS),
};
static const struct proto__row pin_req[] = { R(NAME), R(PINNED) };
static const struct proto__row pin_rep[] = { O(PINNED) };
/* complete: body is an OpenAI request body, JSON: a chat completion's
 * (with "messages") or a completion's (with "prompt"), parsed by the
 * engine's OpenAI parser as its HTTP API parses it (engine/serve/openai.h,
 * docs/openai.md). The reply's tokens are the completion's ids,
 * little-endian u32s. */
static const struct proto__row complete_req[] = { R(BODY) };
static const struct proto__row complete_rep[] = {
	R(TEXT), R(TOKENS), R(PROMPT_TOKENS), R(COMPLETION_TOKENS), R(FINISH_REASON),
	O(PREFILL_MS), O(DECODE_MS), O(TOTAL_MS),
};
/* lease: memory lent to a job that is not a Baton engine (broker/jobs.c).
 * level is the action: "acquire" (bytes, optional gpu, priority, pid to
 * watch, ms: a TTL, 0 none; reason: what the job is, for status), "renew"
 * (name, ms: a new TTL) or "release" (name). The reply names the lease, its
 * device and what it was granted; reason lists the engines that gave way. */
static const struct proto__row lease_req[] = {
	R(LEVEL), O(NAME), O(GPU), O(BYTES), O(PRIORITY), O(PID), O(MS), O(REASON),
	O(DURATION_MS), /* acquire: how long it may wait for the memory (else acquire_wait_ms) */
};
static const struct proto__row lease_rep[] = {
	O(NAME), O(GPU), O(GRANTED), O(EPOCH), O(MS), O(REASON),
};
/* external: engines that are not Baton's (broker/external.c). level is the
 * action: "add" (body: the engine as JSON, docs/reference/external.md),
 * "remove", "park", "resume", "report" (name, mapped: what the process says
 * it holds now). */
static const struct proto__row external_req[] = {
	R(LEVEL), O(NAME), O(BODY), O(MAPPED),
};
static const struct proto__row external_rep[] = {
	R(STATE), R(MS), O(NAME), O(MAPPED), O(REASON),
};
static const struct proto__row event_msg[] = {
	R(SEQ), R(TIME_MS), R(KIND), R(ENGINE), R(GPU), R(STATE), R(REASON), O(MS), O(BYTES),
	O(TO_COPY), /* "progress": bytes is what was copied of to_copy */
};

#undef R
#undef O

#define TAB(a) { a, NELEM(a) }
#define NOFIELDS { NULL, 0 }

static const struct {
	const char *name;
	struct proto__table req, rep;
	bool has_reply;
} optab[PROTO_OP_COUNT] = {
	[PROTO_OP_GEN]       = { "gen",       TAB(gen_req),       TAB(gen_rep),       true },
	[PROTO_OP_STATUS]    = { "status",    NOFIELDS,           TAB(status_rep),    true },
	[PROTO_OP_RELEASE]   = { "release",   TAB(cache_req),     TAB(cache_rep),     true },
	[PROTO_OP_REFILL]    = { "refill",    TAB(refill_req),     TAB(cache_rep),     true },
	[PROTO_OP_VRAM]      = { "vram",      TAB(vram_req),      TAB(cache_rep),     true },
	[PROTO_OP_REGISTER]  = { "register",  TAB(register_req),  TAB(epoch_rep),     true },
	[PROTO_OP_HEARTBEAT] = { "heartbeat", TAB(heartbeat_req), TAB(epoch_opt_rep), true },
	[PROTO_OP_ACQUIRE]   = { "acquire",   TAB(acquire_req),   TAB(acquire_rep),   true },
	[PROTO_OP_REPORT]    = { "report",    TAB(report_req),    TAB(epoch_opt_rep), true },
	[PROTO_OP_HANDOFF]   = { "handoff",   TAB(handoff_req),   TAB(handoff_rep),   true },
	[PROTO_OP_PIN]       = { "pin",       TAB(pin_req),       TAB(pin_rep),       true },
	[PROTO_OP_EVENT]     = { "event",     TAB(event_msg),     NOFIELDS,           false },
	[PROTO_OP_PEER]      = { "peer",      TAB(peer_req),      TAB(cache_rep),     true },
	[PROTO_OP_COMPLETE]  = { "complete",  TAB(complete_req),  TAB(complete_rep),  true },
	[PROTO_OP_LEASE]     = { "lease",     TAB(lease_req),     TAB(lease_rep),     true },
	[PROTO_OP_EXTERNAL]  = { "external",  TAB(external_req),  TAB(external_rep),  true },
};

const struct proto__table *proto__table(enum proto_op op, bool reply)
{
	if (op <= PROTO_OP_NONE || op >= PROTO_OP_COUNT)
		return NULL;
	if (reply)
		return optab[op].has_reply ? &optab[op].rep : NULL;
	return &optab[op].req;
}

static const struct proto__row *find_row(enum proto_op op, bool reply, enum proto_field f)
{
	const struct proto__table *t = proto__table(op, reply);
	if (!t)
		return NULL;
	for (size_t i = 0; i < t->n; i++)
		if (t->rows[i].f->bit == (int)f)
			return &t->rows[i];
	return NULL;
}

bool proto_field_allowed(enum proto_op op, bool reply, enum proto_field f)
{
	return find_row(op, reply, f) != NULL;
}

bool proto_field_required(enum proto_op op, bool reply, enum proto_field f)
{
	const struct proto__row *r = find_row(op, reply, f);
	return r && r->req;
}

const char *proto_op_name(enum proto_op op)
{
	if (op <= PROTO_OP_NONE || op >= PROTO_OP_COUNT)
		return "none";
	return optab[op].name;
}

enum proto_op proto_op_parse(const char *name)
{
	if (!name)
		return PROTO_OP_NONE;
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		if (strcmp(optab[op].name, name) == 0)
			return (enum proto_op)op;
	return PROTO_OP_NONE;
}

const char *proto_field_key(enum proto_field f)
{
	if ((unsigned)f >= PF_COUNT)
		return "?";
	return proto__fields[f].key;
}

const char *proto__type_name(enum proto__type t)
{
	switch (t) {
	case PT_BOOL: return "bool";
	case PT_U32: return "u32";
	case PT_U64: return "u64";
	case PT_I32: return "i32";
	case PT_F64: return "f64";
	case PT_STR: return "str";
	case PT_BIN: return "bin";
	case PT_RESERVE: return "reserve";
	case PT_GPUS: return "gpus";
	case PT_ENGINES: return "engines";
	}
	return "?";
}

/* ---- message helpers -------------------------------------------------------------- */

void proto_msg_init(struct baton_msg *m, enum proto_op op)
{
	memset(m, 0, sizeof *m);
	m->op = op;
	m->id = proto_next_id();
}

void proto_reply_init(struct baton_msg *rep, const struct baton_msg *req)
{
	enum proto_op op = req->op;
	uint64_t id = req->id;
	memset(rep, 0, sizeof *rep);
	rep->reply = true;
	rep->ok = true;
	rep->op = op;
	rep->id = id;
}

void proto_reply_error(struct baton_msg *rep, enum proto_op op, uint64_t id,
    int err, const char *text)
{
	memset(rep, 0, sizeof *rep);
	rep->reply = true;
	rep->ok = false;
	rep->op = op;
	rep->id = id;
	rep->err = err;
	rep->msg = text;
}

/* The field's place in the message when it is a body field of type t. */
static void *field_at(const struct baton_msg *m, enum proto_field f, enum proto__type t)
{
	if ((unsigned)f >= PF_COUNT || proto__fields[f].type != t)
		return NULL;
	return (char *)m + proto__fields[f].off;
}

int proto_put_u64(struct baton_msg *m, enum proto_field f, uint64_t v)
{
	uint64_t *at = field_at(m, f, PT_U64);
	if (!at)
		return BATON_EINVAL;
	*at = v;
	proto_set(m, f);
	return 0;
}

int proto_put_f64(struct baton_msg *m, enum proto_field f, double v)
{
	double *at = field_at(m, f, PT_F64);
	if (!at)
		return BATON_EINVAL;
	*at = v;
	proto_set(m, f);
	return 0;
}

uint64_t proto_u64_or(const struct baton_msg *m, enum proto_field f, uint64_t dflt)
{
	const uint64_t *at = field_at(m, f, PT_U64);
	return at && proto_has(m, f) ? *at : dflt;
}

void proto_msg_free(struct baton_msg *m)
{
	if (!m)
		return;
	if (m->own_)
		msgpack_zone_free(m->own_);
	memset(m, 0, sizeof *m);
}

uint64_t proto_next_id(void)
{
	static _Atomic uint64_t next;
	uint64_t cur = atomic_load(&next);
	if (cur == 0) {
		uint64_t seed = 0;
		if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			seed = ((uint64_t)ts.tv_nsec << 32) ^ (uint64_t)ts.tv_sec ^
			    ((uint64_t)getpid() << 16);
		}
		/* Leave room below 2^63 so ids stay positive in every language. */
		seed = (seed >> 2) | 1;
		uint64_t zero = 0;
		atomic_compare_exchange_strong(&next, &zero, seed);
	}
	uint64_t id;
	do
		id = atomic_fetch_add(&next, 1);
	while (id == 0);
	return id;
}

/* ---- small shared helpers ------------------------------------------------------ */

bool proto__utf8_ok(const char *str, size_t len)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;
	while (i < len) {
		unsigned c = s[i];
		if (c == 0)
			return false;
		if (c < 0x80) {
			i++;
			continue;
		}
		size_t n;
		unsigned cp, min;
		if (c >= 0xc2 && c <= 0xdf) {
			n = 1; cp = c & 0x1f; min = 0x80;
		} else if (c >= 0xe0 && c <= 0xef) {
			n = 2; cp = c & 0x0f; min = 0x800;
		} else if (c >= 0xf0 && c <= 0xf4) {
			n = 3; cp = c & 0x07; min = 0x10000;
		} else {
			return false;
		}
		if (len - i - 1 < n)
			return false;
		for (size_t k = 1; k <= n; k++) {
			unsigned cc = s[i + k];
			if ((cc & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (cc & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += n + 1;
	}
	return true;
}

int proto__fail(struct proto_diag *diag, int err, const char *fmt, ...)
{
	if (diag) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(diag->text, sizeof diag->text, fmt, ap);
		va_end(ap);
	}
	return err;
}
