/*
 * proto_int.h: internals of the protocol component shared by its files and
 * its own programs (baton-proto-tool, tests, fuzz target). Not for other
 * components: they use proto.h.
 */
#ifndef BATON_PROTO_INT_H
#define BATON_PROTO_INT_H

#include <stdarg.h>

#include "proto/proto.h"

enum proto__type {
	PT_BOOL,
	PT_U32,
	PT_U64,
	PT_I32,
	PT_F64,
	PT_STR,
	PT_BIN,
	PT_RESERVE,
	PT_GPUS,
	PT_ENGINES,
};

/* How one field travels and where it lives in its C struct. */
struct proto__fdef {
	const char *key;
	enum proto__type type;
	int bit;           /* presence bit (enum proto_field); -1 in array items */
	size_t off;        /* offset in struct baton_msg or the item struct */
	uint64_t limit;    /* STR/BIN: max bytes; arrays: max items; 0 for numbers */
};

/* One row of an op's table. */
struct proto__row {
	const struct proto__fdef *f;
	bool req;
};

struct proto__table {
	const struct proto__row *rows;
	size_t n;
};

/* Items of an array field: every field required. */
struct proto__item {
	const struct proto__fdef *fields;
	size_t n;
	size_t size;       /* sizeof the item struct */
	const char *what;  /* "gpu", "engine" */
};

extern const struct proto__fdef proto__fields[PF_COUNT];

/* The table of op's requests (reply false; events too) or successful
 * replies; NULL for an op without one (event replies). */
const struct proto__table *proto__table(enum proto_op op, bool reply);
const struct proto__item *proto__item_of(enum proto__type t);
const char *proto__type_name(enum proto__type t);

/* Whether s[0..len) is UTF-8 without NUL bytes (no overlongs, no
 * surrogates, nothing above U+10FFFF). */
bool proto__utf8_ok(const char *s, size_t len);

/* Formats into diag->text (diag may be NULL); returns err. */
int proto__fail(struct proto_diag *diag, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The pre-pass scanner: checks buf[0..len) is one msgpack map within every
 * limit of proto.h, without allocating. 0 or BATON_EMSG/BATON_ETOOBIG with
 * diag->text set. */
int proto__scan(const void *buf, size_t len, struct proto_diag *diag);

/* Encodes through a writer (msgpack_packer_write); total size capped at
 * BATON_PROTO_MAX_MSG. */
typedef int (*proto__write_fn)(void *data, const char *buf, size_t len);
int proto__encode_to(const struct baton_msg *m, proto__write_fn w, void *data,
    struct proto_diag *diag);

/* Test and tool support: fills *m with a deterministic message of op that
 * has every field of its table (optional ones included). kind: 0 request
 * (or event), 1 successful reply, 2 error reply. The message points to
 * static storage: nothing to free. */
void proto__sample(struct baton_msg *m, enum proto_op op, int kind);

/* Test and tool support: sends len raw bytes as a request (whatever they
 * are) and decodes the reply into *rep; no id or op matching. Same
 * errors as proto_client_call, except that an error reply returns 0. */
int proto__client_call_raw(struct proto_client *cli, const void *buf, size_t len,
    struct baton_msg *rep, int timeout_ms, struct proto_diag *diag);

/* Test support: whether two messages carry the same envelope, presence
 * bits and field values (strings and bins by content, floats bitwise).
 * On a difference, names it in why (may be NULL). */
bool proto__msg_equal(const struct baton_msg *a, const struct baton_msg *b,
    char *why, size_t whylen);

#endif
