/*
 * base.h: the small rules every component uses, once, at the bottom of the
 * tree (proto/base needs only libc and pthreads; every component may use
 * it, proto/proto.h includes it):
 *
 *   errors        the one error enum, its names, the error-text helper
 *   clocks        monotonic seconds, wall-clock time, deadlines for
 *                 pthread_cond_timedwait
 *   numbers       the one parser of whole numbers (flags, configuration,
 *                 environment, headers) and the size constants
 *   states        the engine states: an enum with a name table (the wire
 *                 carries the names)
 *   metrics       the Prometheus text writer (families, labels, histograms)
 *                 and the serving metrics' table (vLLM's, per engine and model)
 *   trust         which directories and files a process may take as its own
 *
 * ---- errors -------------------------------------------------------------------
 *
 * 0 is success. Codes are stable: they travel on the wire (`err` in a
 * reply), in HTTP bodies and in exit paths, so a code is never renumbered
 * or reused; new ones are added at the end of their group.
 *
 *   X(ENUM, number, "name", "message")
 */
#ifndef BATON_PROTO_BASE_H
#define BATON_PROTO_BASE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define BATON_ERRORS(X)                                                          \
	X(BATON_OK,            0, "ok",            "success")                      \
	/* generic */                                                            \
	X(BATON_EINVAL,        1, "invalid",       "invalid argument")             \
	X(BATON_ENOMEM,        2, "nomem",         "out of host memory")           \
	X(BATON_EIO,           3, "io",            "input/output error")           \
	X(BATON_ENOTFOUND,     4, "not_found",     "not found")                    \
	X(BATON_EEXIST,        5, "exists",        "already exists")               \
	X(BATON_EBUSY,         6, "busy",          "busy: a request is running")   \
	X(BATON_ETIMEDOUT,     7, "timeout",       "timed out")                    \
	X(BATON_ECLOSED,       8, "closed",        "connection or object closed")  \
	X(BATON_ESTATE,        9, "bad_state",     "not possible in the current state") \
	X(BATON_EPERM,        10, "permission",    "permission denied")            \
	X(BATON_EINTERNAL,    11, "internal",      "internal error")               \
	X(BATON_EUNSUPPORTED, 12, "unsupported",   "operation or type not supported") \
	X(BATON_ECONFIG,      13, "config",        "bad configuration")            \
	X(BATON_ECONN,        14, "connect",       "cannot connect to peer")       \
	/* protocol: a message that is not what it claims */                     \
	X(BATON_EMSG,         20, "bad_message",   "malformed message")            \
	X(BATON_ETOOBIG,      21, "too_big",       "message or count too large")   \
	X(BATON_EVERSION,     22, "bad_version",   "unsupported protocol version") \
	X(BATON_EUNKNOWNOP,   23, "unknown_op",    "unknown operation")            \
	X(BATON_EMISSING,     24, "missing_field", "required field missing")       \
	X(BATON_EEXTRA,       25, "extra_field",   "unexpected field")             \
	X(BATON_ETYPE,        26, "bad_type",      "field has the wrong type")     \
	X(BATON_ERANGE,       27, "out_of_range",  "value out of range")           \
	X(BATON_ESTALE,       28, "stale_epoch",   "command carries a stale epoch") \
	X(BATON_EDUP,         29, "duplicate",     "duplicate field")              \
	/* arena files */                                                        \
	X(BATON_EMAGIC,       40, "bad_magic",     "not a Baton arena (bad magic)") \
	X(BATON_EFORMAT,      41, "bad_format_version", "unsupported arena format version") \
	X(BATON_EUNSEALED,    42, "unsealed",      "arena is not sealed")          \
	X(BATON_ETRUNCATED,   43, "truncated",     "file is truncated")            \
	X(BATON_EBOUNDS,      44, "out_of_bounds", "offset or size past the end")  \
	X(BATON_EOVERLAP,     45, "overlap",       "blobs overlap")                \
	X(BATON_ECOUNT,       46, "bad_count",     "absurd count")                 \
	X(BATON_ECHECKSUM,    47, "checksum",      "checksum mismatch")            \
	X(BATON_ESOURCE,      48, "bad_source",    "malformed model source file")  \
	/* devices */                                                            \
	X(BATON_ENODEV,       60, "no_device",     "no such device or driver")     \
	X(BATON_EDEVMEM,      61, "device_oom",    "out of device memory")         \
	X(BATON_EDRIVER,      62, "driver",        "device driver error")         \
	X(BATON_ENOSPC,       63, "kv_full",       "no free KV cache blocks")

enum baton_err {
#define BATON_ERR_ENUM(e, n, name, msg) e = n,
	BATON_ERRORS(BATON_ERR_ENUM)
#undef BATON_ERR_ENUM
};

/* A message for any code; never NULL, also for codes it does not know. */
const char *baton_strerror(int err);

/* Baton's release ("0.1.0-dev": the VERSION file at build time). */
const char *baton_version(void);
/* The stable short name ("busy", "not_found"); "unknown" for others. */
const char *baton_errname(int err);
/* 1 when err is a code of this enum (0 included). */
int baton_err_valid(int err);

/* The one error-text helper of every component: formats a sentence into
 * buf (len bytes, always terminated, truncated when longer). buf NULL or
 * len 0 means the caller wants no text: nothing is written. */
void baton_errf(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void baton_verrf(char *buf, size_t len, const char *fmt, va_list ap);
/* The same, and err back, so a failure reads
 * `return baton_fail(errbuf, errlen, BATON_EINVAL, "...", ...);`
 * (arena_errf and text_errf are this function under their component's
 * name). */
int baton_fail(char *buf, size_t len, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- clocks and deadlines ---------------------------------------------------------
 *
 * Durations and deadlines are measured on CLOCK_MONOTONIC (a wall-clock
 * step never stretches or cuts a wait); the wall clock is only for
 * timestamps people read. */

/* Seconds on CLOCK_MONOTONIC (from an arbitrary start). */
double baton_now_s(void);
/* CLOCK_REALTIME: seconds, and milliseconds, since the Unix epoch. */
double baton_wall_s(void);
uint64_t baton_wall_ms(void);
/* A condition variable whose timed waits run on CLOCK_MONOTONIC: every
 * cond given to baton_cond_wait_until/_for (or to pthread_cond_timedwait
 * with a baton_deadline) must be made by this. */
void baton_cond_init(pthread_cond_t *cv);
/* The CLOCK_MONOTONIC timespec of t, a baton_now_s() time (normalized:
 * 0 <= tv_nsec < 1e9; a t in the past is returned as it is). */
struct timespec baton_deadline(double t);
/* pthread_cond_timedwait until baton_now_s() time t, or for s seconds
 * (s <= 0: returns at once); mu held. 0 when woken, ETIMEDOUT at the
 * deadline (spurious wake-ups are the caller's, as with pthreads). */
int baton_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double t);
int baton_cond_wait_for(pthread_cond_t *cv, pthread_mutex_t *mu, double s);

/* ---- numbers and sizes ------------------------------------------------------------
 *
 * The one rule for a whole number anywhere Baton reads one (a flag, a
 * configuration key, an environment variable, a Content-Length):
 * decimal digits only, at least one: no sign ("+5" and "-1" are refused;
 * baton_parse_i64 takes one leading '-'), no space, no base prefix ("010"
 * is ten, "0x10" is refused), no unit or other trailing text. A number past
 * [min, max] (overflow included) is BATON_ERANGE, anything else that is not
 * such a number BATON_EINVAL; *out is written only on success. */
int baton_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);
int baton_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);

/* ---- the JSON files models ship (json.c) -------------------------------------------
 *
 * One reader policy for config.json, generation_config.json,
 * tokenizer.json, tokenizer_config.json, a safetensors header and its
 * index, and the JSON Baton makes of GGUF metadata, so that every reader
 * takes what real files hold:
 *   - baton_json_load parses with jansson's JSON_DECODE_INT_AS_REAL, so a
 *     number of any size parses (transformers writes model_max_length
 *     1000000000000000019884624838656 when none is set; a GGUF u64 may
 *     pass 2^63): every number is a double, exact up to 2^53;
 *   - baton_json_whole reads a whole number: an integer or a real that is
 *     integral (256, 256.0, 2.56e2), in [min, max] (BATON_ERANGE past it),
 *     anything else (a fraction, a string, NaN) BATON_EINVAL; *out is
 *     written only on success;
 *   - keys a reader does not know are ignored, and null where a value is
 *     optional reads as absent (each reader's own rule).
 * The jansson types are named by their struct tags (jansson.h's json_t and
 * json_error_t), so this header does not need jansson.h. */
struct json_t;
struct json_error_t;
struct json_t *baton_json_load(const char *data, size_t len, size_t flags,
    struct json_error_t *err);
int baton_json_whole(const struct json_t *v, int64_t min, int64_t max, int64_t *out);

#define BATON_KIB (UINT64_C(1) << 10)
#define BATON_MIB (UINT64_C(1) << 20)
#define BATON_GIB (UINT64_C(1) << 30)

/* ---- engine states ----------------------------------------------------------------
 *
 * What an engine says it is doing (its STATUS and heartbeats, the
 * broker's status, events, the CLI and HTTP): names on the wire, this enum
 * inside. lost is the broker's word for an engine that went silent while
 * its process lives; dead and stopped are its end.
 *
 *   X(ENUM, "name") */
#define BATON_STATES(X)                              \
	X(BATON_STATE_LOADING,   "loading")          \
	X(BATON_STATE_READY,     "ready")            \
	X(BATON_STATE_PARTIAL,   "partial")          \
	X(BATON_STATE_RELEASING, "releasing")        \
	X(BATON_STATE_RELEASED,  "released")         \
	X(BATON_STATE_REFILLING, "refilling")        \
	X(BATON_STATE_RESIZING,  "resizing")         \
	X(BATON_STATE_LOST,      "lost")             \
	X(BATON_STATE_DEAD,      "dead")             \
	X(BATON_STATE_STOPPED,   "stopped")

enum baton_state {
	BATON_STATE_UNKNOWN = 0, /* a name this table lacks (a newer engine's) */
#define BATON_STATE_ENUM(e, name) e,
	BATON_STATES(BATON_STATE_ENUM)
#undef BATON_STATE_ENUM
	BATON_STATE_N
};

/* The wire name; "unknown" for others. */
const char *baton_state_name(int st);
/* The state of a name; BATON_STATE_UNKNOWN for NULL or a name it lacks. */
int baton_state_parse(const char *name);
/* In the middle of a change (loading, releasing, refilling, resizing). */
bool baton_state_moving(int st);
/* Its process is there (not dead, not stopped; lost counts as there). */
bool baton_state_present(int st);
/* May hold device memory and answers for it: not released, lost, dead or
 * stopped (what `release --every` asks). */
bool baton_state_may_hold(int st);

/* How much of its cache an engine holds, from its state and its bytes:
 * whole (ready and every byte: a ready engine shrunk by a vram reserve
 * holds less), part (partial, refilling, or ready with some bytes), none. */
enum baton_holds { BATON_HOLDS_NONE, BATON_HOLDS_PART, BATON_HOLDS_WHOLE };
int baton_state_holds(int st, uint64_t resident, uint64_t ceiling);

/* ---- Prometheus text format 0.0.4 -------------------------------------------------
 *
 * labels: name/value pairs ending in NULL, e.g.
 * (const char *[]){ "engine", name, "gpu", uuid, NULL }; NULL for none.
 * Values are escaped (backslash, double quote, newline), names are the
 * caller's constants. Write errors are the FILE's (ferror). */

/* "# HELP name help\n# TYPE name type\n" (help: backslash and newline escaped). */
void baton_prom_family(FILE *f, const char *name, const char *type, const char *help);
/* A label value, escaped. */
void baton_prom_escape(FILE *f, const char *s);
/* name{labels} and no value (no braces without labels). */
void baton_prom_series(FILE *f, const char *name, const char *const *labels);
/* A sample: name{labels} v, a line. */
void baton_prom_u64(FILE *f, const char *name, const char *const *labels, uint64_t v);
/* The same with a double, prec digits after the point. */
void baton_prom_f(FILE *f, const char *name, const char *const *labels, int prec, double v);
/* A family of one unlabelled sample: its HELP and TYPE lines, then name v. */
void baton_prom_one(FILE *f, const char *name, const char *type, const char *help, uint64_t v);

/* A histogram: b[i] counts the values v <= le[i] and > le[i-1] (not
 * cumulative: summed when written); le ascending, at most BATON_HIST_MAX
 * bounds; +Inf is count. */
#define BATON_HIST_MAX 16
struct baton_hist {
	uint64_t b[BATON_HIST_MAX];
	uint64_t count;
	double sum;
};
void baton_hist_add(struct baton_hist *h, const double *le, size_t n, double v);
/* name_bucket{labels,le="B"} (cumulative, "+Inf" last), name_sum, name_count. */
void baton_prom_hist(FILE *f, const char *name, const char *const *labels, const double *le, size_t n,
    const struct baton_hist *h);

/* ---- serving metrics: vLLM's, per engine and per model (serving.c) ---------------
 *
 * One struct of a request path's numbers, written by one table
 * (serving.c's `rows`: name, type, help, vLLM's name, who writes it), so
 * the engine (prefix "baton_engine_", labels engine and model) and the
 * front door (prefix "baton_door_", label model) write the same families.
 * A metric is added in three places: its index in the enums below, its
 * row in serving.c, and where it is counted (engine/serve/openai_http.c
 * for the engine, broker/door/proxy.c for the door); docs/reference/
 * http-api.md's table maps each to vLLM's name (docs_metrics_test checks
 * every row is there). No lock inside: the owner locks. */
enum baton_sv_hist {
	BATON_SV_TTFT,          /* arrival to the first token */
	BATON_SV_ITL,           /* between two tokens of a request */
	BATON_SV_E2E,           /* arrival to the answer's end */
	BATON_SV_QUEUE,         /* arrival until its prefill starts */
	BATON_SV_PROMPT,        /* prompt tokens of a request */
	BATON_SV_GEN,           /* tokens generated for a request */
	BATON_SV_NHIST
};
enum baton_sv_ctr {
	BATON_SV_PROMPT_TOKENS, /* prompt tokens of requests served */
	BATON_SV_GEN_TOKENS,    /* tokens generated */
	BATON_SV_PREEMPTIONS,   /* sequences put back when the KV pool ran out (engine) */
	BATON_SV_NCTR
};
enum baton_sv_gauge {
	BATON_SV_RUNNING,       /* requests running (engine) or forwarded, not answered (door) */
	BATON_SV_WAITING,       /* requests waiting for admission (engine) or an engine (door) */
	BATON_SV_KV_USED,       /* KV blocks in use (engine) */
	BATON_SV_KV_TOTAL,      /* KV blocks in the pool (engine) */
	BATON_SV_NGAUGE
};
/* How a request ended: served with a finish reason, refused before it
 * ran (a client's bad request, a full queue), or failed on the server's
 * side. A client's 4xx is never "failed". */
enum baton_sv_end {
	BATON_SV_STOP, BATON_SV_LENGTH, BATON_SV_CANCELLED,  /* served (finished_reason) */
	BATON_SV_BAD_REQUEST, BATON_SV_QUEUE_FULL,          /* rejected (reason) */
	BATON_SV_FAILED,
	BATON_SV_NEND
};
#define BATON_SV_ENGINE 1u
#define BATON_SV_DOOR   2u
struct baton_serving {
	struct baton_hist h[BATON_SV_NHIST];
	uint64_t c[BATON_SV_NCTR];
	uint64_t g[BATON_SV_NGAUGE];   /* set by the owner before writing */
	uint64_t end[BATON_SV_NEND];
};
void baton_sv_observe(struct baton_serving *s, enum baton_sv_hist k, double v);
/* The end of a served request ("stop", "length", "cancelled"; others: stop). */
enum baton_sv_end baton_sv_finish(const char *finish);
/* Writes every family whose row has a bit of scope, with one series per
 * item: s[i] under labels[i] (name/value pairs, NULL-ended). */
void baton_sv_write(FILE *f, const char *prefix, unsigned scope, const struct baton_serving *const *s,
    const char *const *const *labels, size_t n);
/* The families' names and their vLLM names, for the docs' test: row i,
 * false past the last. */
bool baton_sv_row(size_t i, const char **name, const char **vllm, unsigned *scope);

/* ---- trust: what a process may load from a directory ----------------------------
 *
 * Whoever can write a directory chooses what a process opens there (a
 * file of theirs, or a link to any file). So the directory of a file a
 * process loads or accounts in (arenas, host device files) must be a real
 * directory (not a link), owned by this user or root, writable by no one
 * else (root's sticky directories, /dev/shm and /tmp, excepted); the file
 * is opened with O_NOFOLLOW and must be a regular file of this user or
 * root that others cannot write (its group may). Each returns 0, or
 * BATON_EPERM (a link, another owner, writable by others), BATON_ENOTFOUND,
 * BATON_EINVAL (not a directory) or BATON_EIO with the reason in errbuf;
 * `what` names the directory in it ("arena directory"). */
int baton_trust_dir(const char *dir, const char *what, char *errbuf, size_t errlen);
/* The same for the directory of path ("." when it has no slash). */
int baton_trust_dir_of(const char *path, const char *what, char *errbuf, size_t errlen);
/* An open file: regular, of this user or root, not writable by others. */
int baton_trust_file(int fd, const char *path, char *errbuf, size_t errlen);

#endif
