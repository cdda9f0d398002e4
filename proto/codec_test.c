/*
 * codec_test.c: every message round-trips; every malformed input gets its
 * exact error code; hostile counts never make anything allocate much.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>

#include <msgpack.h>

#include "proto/proto_int.h"
#include "tests/t.h"

/* ---- allocation watch ------------------------------------------------------------
 * Plain builds replace malloc (glibc allows it) to record the largest single
 * request, so a test can assert that hostile bytes never made msgpack-c or
 * the codec ask for much. Under ASan, ASan's own allocator enforces
 * max_allocation_size_mb instead (an allocation above it aborts the case). */
#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif

static _Atomic size_t largest_alloc;

#ifdef T_ASAN
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "max_allocation_size_mb=512:allocator_may_return_null=0";
}
#else
void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void __libc_free(void *);

static void note(size_t n)
{
	size_t cur = atomic_load(&largest_alloc);
	while (n > cur && !atomic_compare_exchange_weak(&largest_alloc, &cur, n))
		;
}
void *malloc(size_t n)
{
	note(n);
	return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
	note(a * b);
	return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
	note(n);
	return __libc_realloc(p, n);
}
void free(void *p)
{
	__libc_free(p);
}
#endif

static void alloc_watch_reset(void)
{
	atomic_store(&largest_alloc, 0);
}

static void alloc_watch_check(size_t limit)
{
	size_t got = atomic_load(&largest_alloc);
	T_ASSERT_MSG(got <= limit, "largest allocation %zu bytes, limit %zu", got, limit);
}

/* ---- helpers ---------------------------------------------------------------------- */

static const char *kind_name(int kind)
{
	return kind == 0 ? "request" : kind == 1 ? "reply" : "error";
}

/* Kinds an op has: event has no replies. */
static int n_kinds(enum proto_op op)
{
	return op == PROTO_OP_EVENT ? 1 : 3;
}

static void encode_ok(const struct baton_msg *m, void **buf, size_t *len)
{
	struct proto_diag d;
	int err = proto_encode(m, buf, len, &d);
	T_ASSERT_MSG(err == 0, "encode %s: %s: %s", proto_op_name(m->op), baton_errname(err), d.text);
}

/* Decodes and expects err; the message must come back empty. */
static void expect_decode(const void *buf, size_t len, int want, const char *what)
{
	struct baton_msg m;
	struct proto_diag d;
	memset(&m, 0xa5, sizeof m);
	int err = proto_decode(buf, len, &m, &d);
	if (err != want)
		T_FAIL("%s: decode gave %s (%s), want %s", what, baton_errname(err), d.text,
		    baton_errname(want));
	if (err) {
		struct baton_msg zero;
		memset(&zero, 0, sizeof zero);
		T_ASSERT_MSG(memcmp(&m, &zero, sizeof m) == 0, "%s: message not empty after failure", what);
		T_ASSERT_MSG(d.text[0] != '\0', "%s: no diagnostic text", what);
	}
	proto_msg_free(&m);
}

/* Rewrites a (trusted) encoded message through msgpack-c: drop a key, set
 * a key's value (added at the end when absent), or repeat a key. */
enum mut { DEL, SET, DUP };

static void mutate(const void *in, size_t inlen, enum mut op, const char *key,
    const msgpack_object *val, msgpack_sbuffer *out)
{
	msgpack_unpacked up;
	msgpack_packer pk;
	size_t off = 0;
	msgpack_unpacked_init(&up);
	T_ASSERT(msgpack_unpack_next(&up, in, inlen, &off) == MSGPACK_UNPACK_SUCCESS);
	T_ASSERT(up.data.type == MSGPACK_OBJECT_MAP);
	msgpack_sbuffer_init(out);
	msgpack_packer_init(&pk, out, msgpack_sbuffer_write);
	const msgpack_object_map *map = &up.data.via.map;
	size_t klen = strlen(key);
	bool found = false;
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key;
		if (k->via.str.size == klen && memcmp(k->via.str.ptr, key, klen) == 0)
			found = true;
	}
	size_t n = map->size;
	if (op == DEL)
		n -= found;
	else if (op == DUP || (op == SET && !found))
		n++;
	msgpack_pack_map(&pk, n);
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key;
		bool hit = k->via.str.size == klen && memcmp(k->via.str.ptr, key, klen) == 0;
		if (hit && op == DEL)
			continue;
		msgpack_pack_object(&pk, *k);
		msgpack_pack_object(&pk, hit && op == SET ? *val : map->ptr[i].val);
		if (hit && op == DUP) {
			msgpack_pack_object(&pk, *k);
			msgpack_pack_object(&pk, map->ptr[i].val);
		}
	}
	if (op == SET && !found) {
		msgpack_pack_str(&pk, klen);
		msgpack_pack_str_body(&pk, key, klen);
		msgpack_pack_object(&pk, *val);
	} else if (op == DUP && !found) {
		T_FAIL("DUP of absent key %s", key);
	}
	msgpack_unpacked_destroy(&up);
}

static void expect_mutation(const struct baton_msg *m, enum mut op, const char *key,
    const msgpack_object *val, int want, const char *what)
{
	void *buf;
	size_t len;
	msgpack_sbuffer sb;
	char label[160];
	encode_ok(m, &buf, &len);
	mutate(buf, len, op, key, val, &sb);
	snprintf(label, sizeof label, "%s %s %s: %s '%s'", proto_op_name(m->op),
	    m->reply ? (m->ok ? "reply" : "error") : "request", what,
	    op == DEL ? "without" : op == SET ? "set" : "twice", key);
	expect_decode(sb.data, sb.size, want, label);
	msgpack_sbuffer_destroy(&sb);
	free(buf);
}

static msgpack_object o_uint(uint64_t v)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_POSITIVE_INTEGER, .via.u64 = v };
	return o;
}
static msgpack_object o_neg(int64_t v)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_NEGATIVE_INTEGER, .via.i64 = v };
	return o;
}
static msgpack_object o_f64(double v)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_FLOAT64, .via.f64 = v };
	return o;
}
static msgpack_object o_str(const char *s, uint32_t n)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_STR, .via.str = { n, s } };
	return o;
}
static msgpack_object o_bool(bool b)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_BOOLEAN, .via.boolean = b };
	return o;
}
static msgpack_object o_nil(void)
{
	msgpack_object o = { .type = MSGPACK_OBJECT_NIL };
	return o;
}

/* A value of the wrong type for each field type. */
static msgpack_object wrong_value(enum proto__type t)
{
	switch (t) {
	case PT_BOOL: return o_uint(1);
	case PT_STR: return o_uint(5);
	case PT_BIN: return o_str("abc", 3);
	case PT_F64: return o_str("1.5", 3);
	case PT_GPUS:
	case PT_ENGINES: return o_str("[]", 2);
	case PT_RESERVE: return o_bool(true);
	default: return o_str("1", 1);
	}
}

/* ---- round trips ------------------------------------------------------------------ */

static void roundtrip(const struct baton_msg *in, const char *what)
{
	/* a decoded message has the presence bit of every field it carries,
	 * required ones included */
	struct baton_msg copy = *in, *m = &copy;
	const struct proto__table *t = proto__table(in->op, in->reply);
	for (size_t j = 0; t && !(in->reply && !in->ok) && j < t->n; j++)
		if (t->rows[j].req)
			proto_set(m, (enum proto_field)t->rows[j].f->bit);
	void *b1, *b2;
	size_t l1, l2;
	struct baton_msg d;
	struct proto_diag dg;
	char why[160];
	encode_ok(m, &b1, &l1);
	int err = proto_decode(b1, l1, &d, &dg);
	T_ASSERT_MSG(err == 0, "%s: decode: %s: %s", what, baton_errname(err), dg.text);
	T_ASSERT_MSG(proto__msg_equal(m, &d, why, sizeof why), "%s: %s", what, why);
	encode_ok(&d, &b2, &l2);
	T_ASSERT_MSG(l1 == l2 && memcmp(b1, b2, l1) == 0, "%s: re-encoding differs", what);
	proto_msg_free(&d);
	proto_msg_free(&d); /* idempotent */
	free(b1);
	free(b2);
}

static void t_roundtrip_every_op(void)
{
	int n = 0;
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < n_kinds((enum proto_op)op); kind++) {
			struct baton_msg m;
			char what[64];
			proto__sample(&m, (enum proto_op)op, kind);
			snprintf(what, sizeof what, "%s %s", proto_op_name((enum proto_op)op), kind_name(kind));
			roundtrip(&m, what);
			n++;
		}
	T_EQ_INT(n, 15 * 3 + 1); /* 15 ops with a reply, and event */
}

/* Only required fields: optional ones must not appear. */
static void t_roundtrip_required_only(void)
{
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < 2 && kind < n_kinds((enum proto_op)op); kind++) {
			struct baton_msg m, d;
			void *buf;
			size_t len;
			proto__sample(&m, (enum proto_op)op, kind);
			memset(m.has, 0, sizeof m.has);
			encode_ok(&m, &buf, &len);
			T_OK(proto_decode(buf, len, &d, NULL));
			for (int f = 0; f < PF_COUNT; f++)
				T_ASSERT_MSG(proto_has(&d, (enum proto_field)f) ==
				    proto_field_required((enum proto_op)op, kind == 1, (enum proto_field)f),
				    "%s %s: field %s", proto_op_name((enum proto_op)op), kind_name(kind),
				    proto_field_key((enum proto_field)f));
			proto_msg_free(&d);
			free(buf);
		}
}

static void t_roundtrip_values(void)
{
	struct baton_msg m;
	/* extremes of each integer type, nil reserve, empty strings and bins */
	proto_msg_init(&m, PROTO_OP_REGISTER);
	m.id = UINT64_MAX;
	m.name = "";
	m.pid = UINT32_MAX;
	m.gpu = "GPU-\xf0\x9f\x9a\x80";
	m.device = 0;
	m.model = "m";
	m.ctl = "ipc:///run/baton/a.sock";
	m.floor = 0;
	m.ceiling = UINT64_MAX;
	m.priority = INT32_MIN;
	m.state = "ready";
	m.resident = UINT64_C(1) << 63;
	m.capacity = 1;
	m.epoch = UINT64_MAX - 1;
	roundtrip(&m, "register extremes");
	m.priority = INT32_MAX;
	roundtrip(&m, "register priority max");

	proto_msg_init(&m, PROTO_OP_VRAM);
	m.reserve_mib = PROTO_RESERVE_FULL;
	roundtrip(&m, "vram nil");
	m.reserve_mib = 0;
	roundtrip(&m, "vram 0");
	m.reserve_mib = PROTO_RESERVE_MIB_MAX;
	proto_set(&m, PF_NAME);
	m.name = "qwen";
	roundtrip(&m, "vram max with name");

	proto_msg_init(&m, PROTO_OP_GEN);
	m.steps = 1;
	m.batch = 0;
	proto_set(&m, PF_INPUT);
	roundtrip(&m, "gen empty input");

	struct baton_msg req, rep;
	proto__sample(&req, PROTO_OP_REPORT, 0);
	proto_reply_init(&rep, &req);
	roundtrip(&rep, "report reply without epoch");
	proto_set(&rep, PF_EPOCH);
	rep.epoch = 7;
	roundtrip(&rep, "report reply with epoch");

	/* error reply whose request's op and id were unreadable */
	proto_reply_error(&rep, PROTO_OP_NONE, 0, BATON_EMSG, "truncated");
	roundtrip(&rep, "error reply without op");
	proto_reply_error(&rep, PROTO_OP_GEN, 99, BATON_ESTALE, NULL);
	void *buf;
	size_t len;
	struct baton_msg d;
	encode_ok(&rep, &buf, &len);
	T_OK(proto_decode(buf, len, &d, NULL));
	T_EQ_STR(d.msg, baton_strerror(BATON_ESTALE));
	T_EQ_INT(d.err, BATON_ESTALE);
	T_ASSERT(d.reply && !d.ok && d.op == PROTO_OP_GEN && d.id == 99);
	proto_msg_free(&d);
	free(buf);

	/* broker status with no engines and no gpus */
	proto_msg_init(&req, PROTO_OP_STATUS);
	proto_reply_init(&rep, &req);
	proto_set(&rep, PF_GPUS);
	proto_set(&rep, PF_ENGINES);
	roundtrip(&rep, "empty broker status");
}

/* A long error text is cut at a UTF-8 boundary, not refused. */
static void t_error_text_cut(void)
{
	static char text[BATON_PROTO_MAX_TEXT + 100];
	size_t i = 0;
	while (i + 3 < sizeof text) {
		memcpy(text + i, "\xe2\x82\xac", 3); /* euro sign, 3 bytes */
		i += 3;
	}
	text[i] = '\0';
	struct baton_msg rep, d;
	void *buf;
	size_t len;
	proto_reply_error(&rep, PROTO_OP_STATUS, 5, BATON_EINTERNAL, text);
	encode_ok(&rep, &buf, &len);
	T_OK(proto_decode(buf, len, &d, NULL));
	size_t n = strlen(d.msg);
	T_ASSERT(n <= BATON_PROTO_MAX_TEXT && n > BATON_PROTO_MAX_TEXT - 3);
	T_EQ_INT(n % 3, 0);
	proto_msg_free(&d);
	free(buf);
}

static void t_gen_64mib(void)
{
	size_t n = BATON_PROTO_MAX_BIN;
	float *in = malloc(n);
	T_ASSERT(in);
	for (size_t i = 0; i < n / 4; i++)
		in[i] = (float)i;
	struct baton_msg m, d;
	void *buf;
	size_t len;
	proto_msg_init(&m, PROTO_OP_GEN);
	m.steps = 4;
	m.batch = 1024;
	m.seed = 1;
	m.input.data = in;
	m.input.len = n;
	proto_set(&m, PF_INPUT);
	encode_ok(&m, &buf, &len);
	T_ASSERT(len <= BATON_PROTO_MAX_MSG);
	T_OK(proto_decode(buf, len, &d, NULL));
	T_EQ_INT(d.input.len, n);
	T_ASSERT(((uintptr_t)d.input.data & 7) == 0);
	T_ASSERT(memcmp(d.input.data, in, n) == 0);
	proto_msg_free(&d);
	free(buf);

	/* one byte more is refused by both sides */
	m.input.len = n + 1;
	float *big = realloc(in, n + 1);
	T_ASSERT(big);
	m.input.data = big;
	T_EQ_ERR(proto_encode(&m, &buf, &len, NULL), BATON_ETOOBIG);
	T_ASSERT(buf == NULL);
	/* hand-made: bin32 of 64 MiB + 1 inside a gen request */
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	msgpack_pack_str_with_body(&pk, "input", 5);
	msgpack_pack_bin_with_body(&pk, big, n + 1);
	expect_decode(sb.data, sb.size, BATON_ETOOBIG, "bin of 64 MiB + 1");
	msgpack_sbuffer_destroy(&sb);
	free(big);

	/* and a message over the total cap, whatever it holds */
	size_t huge = (size_t)BATON_PROTO_MAX_MSG + 1;
	char *h = calloc(1, huge);
	T_ASSERT(h);
	h[0] = (char)0x80;
	expect_decode(h, huge, BATON_ETOOBIG, "message over the cap");
	free(h);
}

/* ---- malformed input: structure ------------------------------------------------ */

static void t_truncated_every_byte(void)
{
	int cases = 0;
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < n_kinds((enum proto_op)op); kind++) {
			struct baton_msg m;
			void *buf;
			size_t len;
			proto__sample(&m, (enum proto_op)op, kind);
			encode_ok(&m, &buf, &len);
			for (size_t cut = 0; cut < len; cut++) {
				char what[80];
				snprintf(what, sizeof what, "%s %s cut at %zu of %zu",
				    proto_op_name((enum proto_op)op), kind_name(kind), cut, len);
				/* a copy of exactly cut bytes, so ASan sees any over-read */
				void *p = malloc(cut ? cut : 1);
				memcpy(p, buf, cut);
				expect_decode(p, cut, BATON_EMSG, what);
				free(p);
				cases++;
			}
			free(buf);
		}
	T_ASSERT(cases > 1000);
}

static void t_not_a_map(void)
{
	expect_decode("", 0, BATON_EMSG, "empty");
	expect_decode("\x91\x01", 2, BATON_EMSG, "array");
	expect_decode("\xa3" "abc", 4, BATON_EMSG, "string");
	expect_decode("\x05", 1, BATON_EMSG, "fixint");
	expect_decode("\xc0", 1, BATON_EMSG, "nil");
	expect_decode("\x80\x80", 2, BATON_EMSG, "trailing map");
	expect_decode("\x80\x00", 2, BATON_EMSG, "trailing byte");
	expect_decode("\x81\x01\x01", 3, BATON_EMSG, "integer key");
	expect_decode("\x81\xc0\x01", 3, BATON_EMSG, "nil key");
	expect_decode("\x81\xa1v\xc1", 4, BATON_EMSG, "reserved byte 0xc1");
	expect_decode("\x81\xa1v\xd4\x01\x02", 6, BATON_EMSG, "fixext1");
	expect_decode("\x81\xa1v\xc7\x01\x01\x02", 7, BATON_EMSG, "ext8");
	expect_decode("\x81\xa1v\xd6\xff\x00\x00\x00\x00", 9, BATON_EMSG, "timestamp ext");
	expect_decode("\x81\xa1v", 3, BATON_EMSG, "value missing");
	expect_decode("\x82\xa1v\x01", 4, BATON_EMSG, "entry missing");
	/* a map whose only problem is being empty */
	expect_decode("\x80", 1, BATON_EMISSING, "empty map");
}

/* Huge counts in tiny messages: too big, and nothing big is allocated. */
static void t_huge_counts(void)
{
	static const struct {
		const char *bytes;
		size_t len;
		int want;
		const char *what;
	} cases[] = {
		{ "\xdd\xff\xff\xff\xff", 5, BATON_ETOOBIG, "array32 of 2^32-1" },
		{ "\xdf\xff\xff\xff\xff", 5, BATON_ETOOBIG, "map32 of 2^32-1" },
		{ "\xdb\xff\xff\xff\xff", 5, BATON_ETOOBIG, "str32 of 4 GiB" },
		{ "\xc6\xff\xff\xff\xff", 5, BATON_ETOOBIG, "bin32 of 4 GiB" },
		{ "\xdc\xff\xff", 3, BATON_ETOOBIG, "array16 of 65535" },
		{ "\xde\xff\xff", 3, BATON_ETOOBIG, "map16 of 65535" },
		{ "\x81\xa1v\xdd\xff\xff\xff\xff", 8, BATON_ETOOBIG, "array32 as a value" },
		{ "\x81\xa1v\xdf\x7f\xff\xff\xff", 8, BATON_ETOOBIG, "map32 as a value" },
		{ "\x81\xa1v\xc6\x04\x00\x00\x01", 8, BATON_ETOOBIG, "bin of 64 MiB + 1 as a value" },
		{ "\x81\xa1v\xdb\x00\x10\x00\x01", 8, BATON_ETOOBIG, "str of 1 MiB + 1 as a value" },
		/* within the caps but past the end: truncated */
		{ "\xde\x00\x40", 3, BATON_EMSG, "map16 of 64 in 3 bytes" },
		{ "\x81\xa1v\xdc\x04\x00", 6, BATON_EMSG, "array16 of 1024 in 6 bytes" },
		{ "\x81\xa1v\xc6\x04\x00\x00\x00", 8, BATON_EMSG, "bin of 64 MiB in 8 bytes" },
		{ "\x81\xa1v\xdb\x00\x00\x10\x00", 8, BATON_EMSG, "str of 4096 in 8 bytes" },
		/* the count fits the bytes left, but not with what the outer map owes */
		{ "\x82\xa1v\x95\x01\x01\x01\x01\xa1x", 10, BATON_EMSG, "inner count eats the outer's bytes" },
	};
#ifndef T_ASAN
	/* the watch itself works */
	alloc_watch_reset();
	void *volatile probe = malloc(100000);
	free(probe);
	T_ASSERT(atomic_load(&largest_alloc) >= 100000);
#endif
	alloc_watch_reset();
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		expect_decode(cases[i].bytes, cases[i].len, cases[i].want, cases[i].what);
	/* the struct and a diag are on the stack: nothing beyond small
	 * bookkeeping may have been asked for */
	alloc_watch_check(64 * 1024);

	struct baton_msg m;
	struct proto_diag d;
	T_EQ_ERR(proto_decode("\x82\xa1v\x95\x01\x01\x01\x01\xa1x", 10, &m, &d), BATON_EMSG);
	T_ASSERT_MSG(strstr(d.text, "declares 5 items") != NULL, "%s", d.text);
}

/* msgpack-c's zone is bounded by the object cap, whatever the layout. */
static void t_object_cap(void)
{
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	msgpack_pack_str_with_body(&pk, "x", 1);
	msgpack_pack_array(&pk, 1024);
	for (int i = 0; i < 1024; i++) {
		msgpack_pack_array(&pk, 64);
		for (int j = 0; j < 64; j++)
			msgpack_pack_nil(&pk);
	}
	alloc_watch_reset();
	expect_decode(sb.data, sb.size, BATON_ETOOBIG, "66k objects");
	alloc_watch_check(64 * 1024);
	msgpack_sbuffer_destroy(&sb);

	/* just under the cap: decodes as far as the table (unknown key x) */
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	msgpack_pack_str_with_body(&pk, "x", 1);
	msgpack_pack_array(&pk, 1000);
	for (int i = 0; i < 1000; i++) {
		msgpack_pack_array(&pk, 64);
		for (int j = 0; j < 64; j++)
			msgpack_pack_nil(&pk);
	}
	alloc_watch_reset();
	expect_decode(sb.data, sb.size, BATON_EMISSING, "65k objects");
	/* msgpack-c's zone for 65001 objects of 24 bytes, in chunks */
	alloc_watch_check(4u << 20);
	msgpack_sbuffer_destroy(&sb);
}

static void t_deep_nesting(void)
{
	unsigned char buf[256];
	size_t n;
	/* map -> "x" -> arrays nested `levels` deep, innermost holds 1 */
	for (unsigned levels = 1; levels <= 100; levels++) {
		n = 0;
		buf[n++] = 0x84;
		buf[n++] = 0xa1; buf[n++] = 'v'; buf[n++] = 0x01;
		buf[n++] = 0xa2; buf[n++] = 'o'; buf[n++] = 'p'; buf[n++] = 0xa6;
		memcpy(buf + n, "status", 6); n += 6;
		buf[n++] = 0xa2; buf[n++] = 'i'; buf[n++] = 'd'; buf[n++] = 0x07;
		buf[n++] = 0xa1; buf[n++] = 'x';
		for (unsigned i = 0; i < levels; i++)
			buf[n++] = 0x91;
		buf[n++] = 0x01;
		char what[48];
		snprintf(what, sizeof what, "%u nested arrays", levels);
		/* the map is level 1: 7 arrays fit, the 8th is too deep */
		expect_decode(buf, n, levels + 1 <= BATON_PROTO_MAX_DEPTH ? BATON_EEXTRA : BATON_EMSG, what);
	}
	/* empty containers count too */
	n = 0;
	buf[n++] = 0x81; buf[n++] = 0xa1; buf[n++] = 'x';
	for (int i = 0; i < 7; i++)
		buf[n++] = 0x91;
	buf[n++] = 0x80;
	expect_decode(buf, n, BATON_EMSG, "empty map at level 9");
	/* a long chain of maps */
	n = 0;
	for (int i = 0; i < 60; i++) {
		buf[n++] = 0x81; buf[n++] = 0xa1; buf[n++] = 'k';
	}
	buf[n++] = 0x01;
	expect_decode(buf, n, BATON_EMSG, "60 nested maps");
}

/* ---- malformed input: envelope ----------------------------------------------------- */

static void t_envelope(void)
{
	struct baton_msg m;
	msgpack_object v;
	proto__sample(&m, PROTO_OP_RELEASE, 0);

	v = o_uint(2);
	expect_mutation(&m, SET, "v", &v, BATON_EVERSION, "version 2");
	v = o_uint(0);
	expect_mutation(&m, SET, "v", &v, BATON_EVERSION, "version 0");
	v = o_neg(-1);
	expect_mutation(&m, SET, "v", &v, BATON_EVERSION, "version -1");
	v = o_str("1", 1);
	expect_mutation(&m, SET, "v", &v, BATON_ETYPE, "version as str");
	expect_mutation(&m, DEL, "v", NULL, BATON_EMISSING, "no version");
	/* version is checked before the op: a v2 message may have new ops */
	{
		struct baton_msg m2 = m;
		void *buf;
		size_t len;
		msgpack_sbuffer a, b;
		encode_ok(&m2, &buf, &len);
		v = o_uint(2);
		mutate(buf, len, SET, "v", &v, &a);
		v = o_str("teleport", 8);
		mutate(a.data, a.size, SET, "op", &v, &b);
		expect_decode(b.data, b.size, BATON_EVERSION, "v2 with an unknown op");
		msgpack_sbuffer_destroy(&a);
		msgpack_sbuffer_destroy(&b);
		free(buf);
	}

	v = o_str("teleport", 8);
	expect_mutation(&m, SET, "op", &v, BATON_EUNKNOWNOP, "unknown op");
	v = o_str("", 0);
	expect_mutation(&m, SET, "op", &v, BATON_EUNKNOWNOP, "empty op");
	v = o_str("release\0", 8);
	expect_mutation(&m, SET, "op", &v, BATON_EUNKNOWNOP, "op with a NUL");
	v = o_uint(3);
	expect_mutation(&m, SET, "op", &v, BATON_ETYPE, "op as int");
	expect_mutation(&m, DEL, "op", NULL, BATON_EMISSING, "no op");

	expect_mutation(&m, DEL, "id", NULL, BATON_EMISSING, "no id");
	v = o_str("7", 1);
	expect_mutation(&m, SET, "id", &v, BATON_ETYPE, "id as str");
	v = o_neg(-7);
	expect_mutation(&m, SET, "id", &v, BATON_ETYPE, "negative id");
	v = o_uint(0);
	expect_mutation(&m, SET, "id", &v, BATON_ERANGE, "request id 0");

	v = o_uint(1);
	expect_mutation(&m, SET, "ok", &v, BATON_ETYPE, "ok as int");

	expect_mutation(&m, DUP, "op", NULL, BATON_EDUP, "duplicate op");
	expect_mutation(&m, DUP, "v", NULL, BATON_EDUP, "duplicate v");
	expect_mutation(&m, DUP, "epoch", NULL, BATON_EDUP, "duplicate epoch");

	/* a reply may carry any id (0 when the request's was unreadable); only
	 * error replies may leave op out */
	struct baton_msg rep;
	proto__sample(&rep, PROTO_OP_RELEASE, 1);
	v = o_uint(0);
	expect_mutation(&rep, SET, "id", &v, 0, "reply id 0");
	expect_mutation(&rep, DEL, "op", NULL, BATON_EMISSING, "ok reply without op");

	struct baton_msg er;
	proto__sample(&er, PROTO_OP_RELEASE, 2);
	expect_mutation(&er, DEL, "op", NULL, 0, "error reply without op");
	expect_mutation(&er, DEL, "err", NULL, BATON_EMISSING, "error reply without err");
	expect_mutation(&er, DEL, "msg", NULL, BATON_EMISSING, "error reply without msg");
	v = o_uint(0);
	expect_mutation(&er, SET, "err", &v, BATON_ERANGE, "err 0");
	v = o_uint(70000);
	expect_mutation(&er, SET, "err", &v, BATON_ERANGE, "err 70000");
	v = o_neg(-1);
	expect_mutation(&er, SET, "err", &v, BATON_ERANGE, "err -1");
	v = o_str("busy", 4);
	expect_mutation(&er, SET, "err", &v, BATON_ETYPE, "err as str");
	v = o_uint(6);
	expect_mutation(&er, SET, "msg", &v, BATON_ETYPE, "msg as int");
	v = o_uint(1);
	expect_mutation(&er, SET, "epoch", &v, BATON_EEXTRA, "error reply with a body field");
	v = o_uint(1);
	expect_mutation(&er, SET, "name", &v, BATON_EEXTRA, "error reply with a body field");
	/* an unknown error code from a newer peer still decodes */
	v = o_uint(999);
	expect_mutation(&er, SET, "err", &v, 0, "err 999");

	/* success replies never carry err or msg */
	v = o_uint(6);
	expect_mutation(&rep, SET, "err", &v, BATON_EEXTRA, "ok reply with err");

	/* events: no ok */
	struct baton_msg ev;
	proto__sample(&ev, PROTO_OP_EVENT, 0);
	v = o_bool(true);
	expect_mutation(&ev, SET, "ok", &v, BATON_EEXTRA, "event with ok");
	v = o_uint(0);
	expect_mutation(&ev, SET, "id", &v, BATON_ERANGE, "event id 0");
}

/* The id and op of a request that fails later are still reported. */
static void t_diag_keeps_id(void)
{
	struct baton_msg m, d;
	struct proto_diag dg;
	void *buf;
	size_t len;
	msgpack_sbuffer sb;
	msgpack_object v = o_str("lots", 4);
	proto__sample(&m, PROTO_OP_ACQUIRE, 0);
	m.id = 123456789012345ull;
	encode_ok(&m, &buf, &len);
	mutate(buf, len, SET, "bytes", &v, &sb);
	T_EQ_ERR(proto_decode(sb.data, sb.size, &d, &dg), BATON_ETYPE);
	T_EQ_INT(dg.id, 123456789012345ull);
	T_EQ_INT(dg.op, PROTO_OP_ACQUIRE);
	T_ASSERT_MSG(strstr(dg.text, "'bytes'") != NULL, "text names the field: %s", dg.text);
	msgpack_sbuffer_destroy(&sb);

	/* unknown op: the id, no op */
	v = o_str("frobnicate", 10);
	mutate(buf, len, SET, "op", &v, &sb);
	T_EQ_ERR(proto_decode(sb.data, sb.size, &d, &dg), BATON_EUNKNOWNOP);
	T_EQ_INT(dg.id, 123456789012345ull);
	T_EQ_INT(dg.op, PROTO_OP_NONE);
	T_ASSERT(strstr(dg.text, "frobnicate") != NULL);
	msgpack_sbuffer_destroy(&sb);

	/* a duplicate key: still the id and op */
	mutate(buf, len, DUP, "name", NULL, &sb);
	T_EQ_ERR(proto_decode(sb.data, sb.size, &d, &dg), BATON_EDUP);
	T_EQ_INT(dg.id, 123456789012345ull);
	T_EQ_INT(dg.op, PROTO_OP_ACQUIRE);
	msgpack_sbuffer_destroy(&sb);

	/* two empty keys (found by the fuzzer: msgpack-c's empty strings have
	 * NULL pointers, which memcmp must not get, even for 0 bytes; the
	 * sanitizer pass catches it): a duplicate like any other */
	static const uint8_t empty_keys[] = { 0x84, 0xa0, 0x01, 0xa0, 0x02, 0xa1, 'v', 0x01, 0xa2, 'o', 'p',
		0xa3, 'g', 'e', 'n' };
	T_EQ_ERR(proto_decode(empty_keys, sizeof empty_keys, &d, &dg), BATON_EDUP);
	T_ASSERT_MSG(strstr(dg.text, "twice") != NULL, "%s", dg.text);

	/* truncated: nothing */
	T_EQ_ERR(proto_decode(buf, len - 1, &d, &dg), BATON_EMSG);
	T_EQ_INT(dg.id, 0);
	free(buf);
}

/* ---- malformed input: body fields ------------------------------------------------------ */

static void t_missing_each_required(void)
{
	int n = 0;
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < 2 && kind < n_kinds((enum proto_op)op); kind++) {
			struct baton_msg m;
			const struct proto__table *t = proto__table((enum proto_op)op, kind == 1);
			proto__sample(&m, (enum proto_op)op, kind);
			for (size_t j = 0; j < t->n; j++) {
				expect_mutation(&m, DEL, t->rows[j].f->key, NULL,
				    t->rows[j].req ? BATON_EMISSING : 0, "drop");
				n += t->rows[j].req;
			}
		}
	T_ASSERT(n > 40);
}

static void t_wrong_type_each_field(void)
{
	int n = 0;
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < 2 && kind < n_kinds((enum proto_op)op); kind++) {
			struct baton_msg m;
			const struct proto__table *t = proto__table((enum proto_op)op, kind == 1);
			proto__sample(&m, (enum proto_op)op, kind);
			for (size_t j = 0; j < t->n; j++) {
				msgpack_object v = wrong_value(t->rows[j].f->type);
				expect_mutation(&m, SET, t->rows[j].f->key, &v, BATON_ETYPE, "wrong type");
				/* nil is the wrong type for everything but reserve_mib */
				v = o_nil();
				expect_mutation(&m, SET, t->rows[j].f->key, &v,
				    t->rows[j].f->type == PT_RESERVE ? 0 : BATON_ETYPE, "nil");
				n++;
			}
		}
	T_ASSERT(n > 60);
}

static void t_extra_field(void)
{
	int n = 0;
	msgpack_object v = o_uint(1);
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < n_kinds((enum proto_op)op); kind++) {
			struct baton_msg m;
			proto__sample(&m, (enum proto_op)op, kind);
			expect_mutation(&m, SET, "bogus", &v, BATON_EEXTRA, "extra");
			expect_mutation(&m, SET, "", &v, BATON_EEXTRA, "empty key");
			n++;
		}
	/* a field of another op */
	struct baton_msg m;
	proto__sample(&m, PROTO_OP_STATUS, 0);
	v = o_str("qwen", 4);
	expect_mutation(&m, SET, "name", &v, BATON_EEXTRA, "status request with name");
	proto__sample(&m, PROTO_OP_GEN, 0);
	v = o_uint(1);
	expect_mutation(&m, SET, "epoch", &v, BATON_EEXTRA, "gen request with epoch");
	/* "device" is a u32 in register and a str in the status reply */
	proto__sample(&m, PROTO_OP_REGISTER, 0);
	v = o_str("cuda:0", 6);
	expect_mutation(&m, SET, "device", &v, BATON_ETYPE, "register device as str");
	proto__sample(&m, PROTO_OP_STATUS, 1);
	v = o_uint(0);
	expect_mutation(&m, SET, "device", &v, BATON_ETYPE, "status device as int");
	T_EQ_INT(n, 46);
}

static void t_ranges(void)
{
	struct baton_msg m;
	msgpack_object v;

	proto__sample(&m, PROTO_OP_GEN, 0);
	v = o_uint(UINT64_C(1) << 32);
	expect_mutation(&m, SET, "steps", &v, BATON_ERANGE, "u32 of 2^32");
	v = o_uint(UINT32_MAX);
	expect_mutation(&m, SET, "steps", &v, 0, "u32 max");
	v = o_neg(-1);
	expect_mutation(&m, SET, "seed", &v, BATON_ERANGE, "negative u64");
	v = o_uint(UINT64_MAX);
	expect_mutation(&m, SET, "seed", &v, 0, "u64 max");

	proto__sample(&m, PROTO_OP_REGISTER, 0);
	v = o_uint(UINT64_C(1) << 31);
	expect_mutation(&m, SET, "priority", &v, BATON_ERANGE, "i32 of 2^31");
	v = o_neg(INT64_C(-2147483649));
	expect_mutation(&m, SET, "priority", &v, BATON_ERANGE, "i32 below min");
	v = o_neg(INT32_MIN);
	expect_mutation(&m, SET, "priority", &v, 0, "i32 min");
	v = o_f64(1.0);
	expect_mutation(&m, SET, "priority", &v, BATON_ETYPE, "i32 as float");

	/* strings: NUL, invalid UTF-8, length */
	v = o_str("qw\0en", 5);
	expect_mutation(&m, SET, "name", &v, BATON_ERANGE, "name with NUL");
	v = o_str("\xff\xfe", 2);
	expect_mutation(&m, SET, "name", &v, BATON_ERANGE, "invalid UTF-8");
	v = o_str("\xc0\xaf", 2);
	expect_mutation(&m, SET, "name", &v, BATON_ERANGE, "overlong UTF-8");
	v = o_str("\xed\xa0\x80", 3);
	expect_mutation(&m, SET, "name", &v, BATON_ERANGE, "UTF-8 surrogate");
	v = o_str("\xe2\x82", 2);
	expect_mutation(&m, SET, "name", &v, BATON_ERANGE, "cut UTF-8");
	static char longname[BATON_PROTO_MAX_NAME + 1];
	memset(longname, 'a', sizeof longname);
	v = o_str(longname, BATON_PROTO_MAX_NAME);
	expect_mutation(&m, SET, "name", &v, 0, "name of 256");
	v = o_str(longname, BATON_PROTO_MAX_NAME + 1);
	expect_mutation(&m, SET, "name", &v, BATON_ETOOBIG, "name of 257");
	v = o_str("", 0);
	expect_mutation(&m, SET, "name", &v, 0, "empty name");

	proto__sample(&m, PROTO_OP_REPORT, 0);
	static char longtext[BATON_PROTO_MAX_TEXT];
	memset(longtext, 'r', sizeof longtext);
	v = o_str(longtext, BATON_PROTO_MAX_TEXT);
	expect_mutation(&m, SET, "reason", &v, 0, "reason of 4096");
	v = o_f64(NAN);
	expect_mutation(&m, SET, "duration_ms", &v, BATON_ERANGE, "NaN");
	v = o_f64(-INFINITY);
	expect_mutation(&m, SET, "duration_ms", &v, BATON_ERANGE, "-inf");
	v = o_uint(12);
	expect_mutation(&m, SET, "duration_ms", &v, 0, "f64 given as uint");
	v = o_neg(-12);
	expect_mutation(&m, SET, "duration_ms", &v, 0, "f64 given as negative int");

	proto__sample(&m, PROTO_OP_VRAM, 0);
	v = o_uint(PROTO_RESERVE_MIB_MAX + 1);
	expect_mutation(&m, SET, "reserve_mib", &v, BATON_ERANGE, "reserve_mib too big");
	v = o_neg(-1);
	expect_mutation(&m, SET, "reserve_mib", &v, BATON_ERANGE, "reserve_mib negative");
	v = o_nil();
	expect_mutation(&m, SET, "reserve_mib", &v, 0, "reserve_mib nil");
}

/* Integers in any msgpack width, floats as f32, are accepted. */
static void t_liberal_encodings(void)
{
	/* {"v": uint64 1, "op": str8 "acquire", "id": uint32 9,
	 *  "name": "a", "bytes": uint16 300} */
	static const unsigned char b[] = {
		0x85,
		0xa1, 'v', 0xcf, 0, 0, 0, 0, 0, 0, 0, 1,
		0xa2, 'o', 'p', 0xd9, 7, 'a', 'c', 'q', 'u', 'i', 'r', 'e',
		0xa2, 'i', 'd', 0xce, 0, 0, 0, 9,
		0xa4, 'n', 'a', 'm', 'e', 0xa1, 'a',
		0xa5, 'b', 'y', 't', 'e', 's', 0xd1, 0x01, 0x2c, /* int16 300 */
	};
	struct baton_msg m;
	T_OK(proto_decode(b, sizeof b, &m, NULL));
	T_EQ_INT(m.op, PROTO_OP_ACQUIRE);
	T_EQ_INT(m.id, 9);
	T_EQ_INT(m.bytes, 300);
	T_EQ_STR(m.name, "a");
	T_ASSERT(!m.reply);
	proto_msg_free(&m);

	/* an f32 for an f64 field */
	static const unsigned char h[] = {
		0x86,
		0xa1, 'v', 0x01,
		0xa2, 'o', 'p', 0xa7, 'h', 'a', 'n', 'd', 'o', 'f', 'f',
		0xa2, 'i', 'd', 0x02,
		0xa2, 'o', 'k', 0xc3,
		0xaa, 'r', 'e', 'l', 'e', 'a', 's', 'e', '_', 'm', 's', 0xca, 0x3f, 0xc0, 0, 0, /* 1.5f */
		0xa9, 'r', 'e', 'f', 'i', 'l', 'l', '_', 'm', 's', 0x05,
	};
	T_EQ_ERR(proto_decode(h, sizeof h, &m, NULL), BATON_EMISSING); /* total_ms */
	struct proto_diag d;
	T_EQ_ERR(proto_decode(h, sizeof h, &m, &d), BATON_EMISSING);
	T_ASSERT(strstr(d.text, "total_ms"));
	T_EQ_INT(d.id, 2);
	T_EQ_INT(d.op, PROTO_OP_HANDOFF);
}

static void t_array_items(void)
{
	struct baton_msg m, st;
	proto__sample(&st, PROTO_OP_STATUS, 1);
	msgpack_object v;

	/* an item without a field, with an extra one, twice the same key, not a map */
	struct proto_gpu g[1] = { { "GPU-x", 1, 2, 3, 4, 5, 0, "x", 0 } };
	m = st;
	m.gpus.v = g;
	m.gpus.n = 1;
	void *buf;
	size_t len;
	encode_ok(&m, &buf, &len);
	msgpack_unpacked up;
	size_t off = 0;
	msgpack_unpacked_init(&up);
	T_ASSERT(msgpack_unpack_next(&up, buf, len, &off) == MSGPACK_UNPACK_SUCCESS);
	msgpack_object_map *map = &up.data.via.map;
	msgpack_object *gpus = NULL;
	for (uint32_t i = 0; i < map->size; i++)
		if (map->ptr[i].key.via.str.size == 4 && memcmp(map->ptr[i].key.via.str.ptr, "gpus", 4) == 0)
			gpus = &map->ptr[i].val;
	T_ASSERT(gpus && gpus->type == MSGPACK_OBJECT_ARRAY && gpus->via.array.size == 1);
	msgpack_object item = gpus->via.array.ptr[0];
	msgpack_object_kv kv[6];
	memcpy(kv, item.via.map.ptr, 5 * sizeof kv[0]);
	msgpack_object arr = { .type = MSGPACK_OBJECT_ARRAY };
	msgpack_object it2 = { .type = MSGPACK_OBJECT_MAP };
	arr.via.array.size = 1;
	arr.via.array.ptr = &it2;

	it2.via.map.ptr = kv;
	it2.via.map.size = 4; /* no "held" */
	expect_mutation(&m, SET, "gpus", &arr, BATON_EMISSING, "gpu without held");
	kv[5] = kv[0];
	kv[5].key = o_str("watts", 5);
	memcpy(&kv[4], &kv[5], sizeof kv[0]);
	it2.via.map.size = 5;
	expect_mutation(&m, SET, "gpus", &arr, BATON_EEXTRA, "gpu with watts");
	memcpy(kv, item.via.map.ptr, 5 * sizeof kv[0]);
	kv[4].key = kv[0].key;
	expect_mutation(&m, SET, "gpus", &arr, BATON_EDUP, "gpu with two uuids");
	memcpy(kv, item.via.map.ptr, 5 * sizeof kv[0]);
	kv[1].val = o_str("big", 3);
	expect_mutation(&m, SET, "gpus", &arr, BATON_ETYPE, "gpu total as str");
	kv[1].val = o_neg(-5);
	expect_mutation(&m, SET, "gpus", &arr, BATON_ERANGE, "gpu total negative");
	it2 = o_uint(3);
	expect_mutation(&m, SET, "gpus", &arr, BATON_ETYPE, "gpu item not a map");
	v = o_uint(3);
	expect_mutation(&m, SET, "engines", &v, BATON_ETYPE, "engines not an array");
	msgpack_unpacked_destroy(&up);
	free(buf);

	/* more items than the cap: refused by the encoder and the scanner */
	static struct proto_gpu many[BATON_PROTO_MAX_ARRAY + 1];
	for (size_t i = 0; i < BATON_PROTO_MAX_ARRAY + 1; i++)
		many[i] = g[0];
	m = st;
	m.gpus.v = many;
	m.gpus.n = BATON_PROTO_MAX_ARRAY;
	roundtrip(&m, "1024 gpus");
	m.gpus.n = BATON_PROTO_MAX_ARRAY + 1;
	T_EQ_ERR(proto_encode(&m, &buf, &len, NULL), BATON_ETOOBIG);
	msgpack_sbuffer sb;
	msgpack_packer pk;
	msgpack_sbuffer_init(&sb);
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	msgpack_pack_map(&pk, 1);
	msgpack_pack_str_with_body(&pk, "gpus", 4);
	msgpack_pack_array(&pk, BATON_PROTO_MAX_ARRAY + 1);
	for (size_t i = 0; i < BATON_PROTO_MAX_ARRAY + 1; i++)
		msgpack_pack_nil(&pk);
	expect_decode(sb.data, sb.size, BATON_ETOOBIG, "1025 items");
	msgpack_sbuffer_destroy(&sb);
}

/* ---- the encoder's checks --------------------------------------------------------- */

static void t_encode_checks(void)
{
	struct baton_msg m;
	struct proto_diag d;
	void *buf = (void *)1;
	size_t len = 1;

	proto__sample(&m, PROTO_OP_REGISTER, 0);
	m.model = NULL;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EMISSING);
	T_ASSERT(buf == NULL && len == 0);
	T_ASSERT(strstr(d.text, "model"));

	proto__sample(&m, PROTO_OP_REGISTER, 0);
	proto_set(&m, PF_STEPS);
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EEXTRA);
	T_ASSERT(strstr(d.text, "steps"));

	proto__sample(&m, PROTO_OP_REGISTER, 0);
	static char longname[BATON_PROTO_MAX_NAME + 2];
	memset(longname, 'x', BATON_PROTO_MAX_NAME + 1);
	m.name = longname;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_ETOOBIG);
	m.name = "\xc3";
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_ERANGE);

	proto__sample(&m, PROTO_OP_REPORT, 0);
	m.duration_ms = NAN;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_ERANGE);
	proto_unset(&m, PF_DURATION_MS);
	T_OK(proto_encode(&m, &buf, &len, &d)); /* not sent: not checked */
	free(buf);

	proto__sample(&m, PROTO_OP_STATUS, 0);
	m.id = 0;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_ERANGE);
	m.op = PROTO_OP_NONE;
	m.id = 1;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EUNKNOWNOP);
	m.op = PROTO_OP_COUNT;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EUNKNOWNOP);
	m.op = (enum proto_op)-1;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EUNKNOWNOP);

	proto__sample(&m, PROTO_OP_EVENT, 0);
	m.reply = true;
	m.ok = true;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EINVAL);

	proto_reply_error(&m, PROTO_OP_GEN, 1, 0, "x");
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_ERANGE);
	proto_reply_error(&m, PROTO_OP_GEN, 1, BATON_EBUSY, "x");
	proto_set(&m, PF_EPOCH);
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EEXTRA);

	proto__sample(&m, PROTO_OP_VRAM, 0);
	m.reserve_mib = PROTO_RESERVE_MIB_MAX + 1;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_ERANGE);

	proto__sample(&m, PROTO_OP_GEN, 0);
	m.input.data = NULL;
	m.input.len = 4;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EINVAL);

	proto__sample(&m, PROTO_OP_STATUS, 1);
	struct proto_gpu g = { NULL, 1, 2, 3, 4, 5, 0, "x", 0 };
	m.gpus.v = &g;
	m.gpus.n = 1;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EMISSING);
	T_ASSERT(strstr(d.text, "gpus[0].uuid"));
	m.gpus.v = NULL;
	T_EQ_ERR(proto_encode(&m, &buf, &len, &d), BATON_EINVAL);
}

static void t_helpers(void)
{
	T_EQ_STR(proto_op_name(PROTO_OP_HEARTBEAT), "heartbeat");
	T_EQ_STR(proto_op_name(PROTO_OP_NONE), "none");
	T_EQ_STR(proto_op_name(PROTO_OP_COUNT), "none");
	T_EQ_INT(proto_op_parse("handoff"), PROTO_OP_HANDOFF);
	T_EQ_INT(proto_op_parse("Handoff"), PROTO_OP_NONE);
	T_EQ_INT(proto_op_parse(NULL), PROTO_OP_NONE);
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		T_EQ_INT(proto_op_parse(proto_op_name((enum proto_op)op)), op);
	T_EQ_STR(proto_field_key(PF_FREE), "free");
	T_EQ_STR(proto_field_key(PF_DEVICE_NAME), "device");
	T_EQ_STR(proto_field_key(PF_COUNT), "?");
	T_ASSERT(proto_field_required(PROTO_OP_VRAM, false, PF_RESERVE_MIB));
	T_ASSERT(proto_field_allowed(PROTO_OP_VRAM, false, PF_NAME));
	T_ASSERT(!proto_field_required(PROTO_OP_VRAM, false, PF_NAME));
	T_ASSERT(!proto_field_allowed(PROTO_OP_EVENT, true, PF_NAME));
	T_ASSERT(proto_field_allowed(PROTO_OP_STATUS, true, PF_ENGINES));

	uint64_t a = proto_next_id(), b = proto_next_id();
	T_ASSERT(a != 0 && b != 0 && a != b);
	T_ASSERT(a < (UINT64_C(1) << 63));

	struct baton_msg m, r;
	proto_msg_init(&m, PROTO_OP_PIN);
	T_ASSERT(m.id != 0 && m.op == PROTO_OP_PIN && !m.reply);
	proto_reply_init(&r, &m);
	T_ASSERT(r.reply && r.ok && r.id == m.id && r.op == PROTO_OP_PIN);
	proto_msg_free(&r);
	proto_msg_free(NULL);

	/* the number setters and getter go by the catalog: a field of
	 * another type is refused and changes nothing */
	proto_msg_init(&m, PROTO_OP_HEARTBEAT);
	T_EQ_INT(proto_u64_or(&m, PF_KV_USED, 7), 7);
	T_EQ_INT(proto_put_u64(&m, PF_KV_USED, 42), 0);
	T_ASSERT(m.kv_used == 42 && proto_has(&m, PF_KV_USED));
	T_EQ_INT(proto_u64_or(&m, PF_KV_USED, 7), 42);
	T_EQ_INT(proto_put_f64(&m, PF_KEEP_ALIVE_S, -1.5), 0);
	T_ASSERT(m.keep_alive_s == -1.5 && proto_has(&m, PF_KEEP_ALIVE_S));
	struct baton_msg before = m;
	T_EQ_INT(proto_put_u64(&m, PF_KEEP_ALIVE_S, 3), BATON_EINVAL);  /* F64 */
	T_EQ_INT(proto_put_u64(&m, PF_NAME, 3), BATON_EINVAL);          /* STR */
	T_EQ_INT(proto_put_f64(&m, PF_KV_USED, 3), BATON_EINVAL);       /* U64 */
	T_EQ_INT(proto_put_u64(&m, PF_COUNT, 3), BATON_EINVAL);
	T_ASSERT(memcmp(&m, &before, sizeof m) == 0);
	T_EQ_INT(proto_u64_or(&m, PF_KEEP_ALIVE_S, 9), 9);
	T_EQ_INT(proto_u64_or(&m, PF_COUNT, 9), 9);

	/* UTF-8 checker corners */
	T_ASSERT(proto__utf8_ok("", 0));
	T_ASSERT(proto__utf8_ok("\xf4\x8f\xbf\xbf", 4));   /* U+10FFFF */
	T_ASSERT(!proto__utf8_ok("\xf4\x90\x80\x80", 4));  /* above */
	T_ASSERT(!proto__utf8_ok("\xe0\x80\x80", 3));      /* overlong */
	T_ASSERT(!proto__utf8_ok("\x80", 1));
	T_ASSERT(!proto__utf8_ok("a\0b", 3));
}

T_MAIN(T_CASE(t_roundtrip_every_op), T_CASE(t_roundtrip_required_only),
    T_CASE(t_roundtrip_values), T_CASE(t_error_text_cut), T_CASE_TIMEOUT(t_gen_64mib, 120),
    T_CASE(t_truncated_every_byte), T_CASE(t_not_a_map), T_CASE(t_huge_counts),
    T_CASE(t_object_cap), T_CASE(t_deep_nesting), T_CASE(t_envelope),
    T_CASE(t_diag_keeps_id), T_CASE(t_missing_each_required),
    T_CASE(t_wrong_type_each_field), T_CASE(t_extra_field), T_CASE(t_ranges),
    T_CASE(t_liberal_encodings), T_CASE(t_array_items), T_CASE(t_encode_checks),
    T_CASE(t_helpers))
