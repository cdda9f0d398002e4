/*
 * err.h: the one error enum of Baton (included by proto/proto.h).
 *
 * 0 is success. Codes are stable: they travel on the wire (`err` in a
 * reply), in HTTP bodies and in exit paths, so a code is never renumbered
 * or reused; new ones are added at the end of their group.
 *
 *   X(ENUM, number, "name", "message")
 */
#ifndef BATON_PROTO_ERR_H
#define BATON_PROTO_ERR_H

#include <stdarg.h>
#include <stddef.h>

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

#endif
