/*
 * codec.c: struct baton_msg to msgpack and back, driven by the tables of
 * msg.c. Decoding: scan (scan.c) -> msgpack_unpack_next -> check every key
 * and value against the op's table -> copy into the message's own zone.
 * Encoding: check the message against the same table -> msgpack_pack_*.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "proto/proto_int.h"

/* ---- decoding --------------------------------------------------------------- */

struct dctx {
	struct baton_msg *m;
	struct proto_diag *diag;
	const char *what; /* "release request", "gen reply", ... */
};

static const char *objtype(const msgpack_object *o)
{
	switch (o->type) {
	case MSGPACK_OBJECT_NIL: return "nil";
	case MSGPACK_OBJECT_BOOLEAN: return "bool";
	case MSGPACK_OBJECT_POSITIVE_INTEGER: return "uint";
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative int";
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: return "float";
	case MSGPACK_OBJECT_STR: return "str";
	case MSGPACK_OBJECT_ARRAY: return "array";
	case MSGPACK_OBJECT_MAP: return "map";
	case MSGPACK_OBJECT_BIN: return "bin";
	case MSGPACK_OBJECT_EXT: return "ext";
	}
	return "?";
}

/* A key fit to print: at most 40 bytes, anything unprintable as '?'. */
static const char *keytext(char *out, size_t cap, const char *k, size_t len)
{
	size_t n = len < cap - 1 ? len : cap - 1;
	if (n > 40)
		n = 40;
	for (size_t i = 0; i < n; i++)
		out[i] = (k[i] >= 0x20 && k[i] < 0x7f) ? k[i] : '?';
	out[n] = '\0';
	return out;
}

static bool key_is(const msgpack_object *k, const char *s)
{
	size_t n = strlen(s);
	/* n == 0: msgpack-c gives an empty string a NULL ptr, and memcmp
	 * must not see NULL even for 0 bytes */
	return k->via.str.size == n && (n == 0 || memcmp(k->via.str.ptr, s, n) == 0);
}

static void *zalloc(struct dctx *c, size_t n)
{
	if (!c->m->own_) {
		c->m->own_ = msgpack_zone_new(MSGPACK_ZONE_CHUNK_SIZE);
		if (!c->m->own_)
			return NULL;
	}
	return msgpack_zone_malloc(c->m->own_, n ? n : 1);
}

/* Keys are strings and unique. */
static int check_keys(struct dctx *c, const msgpack_object_map *map, const char *where)
{
	char kt[48];
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key;
		if (k->type != MSGPACK_OBJECT_STR)
			return proto__fail(c->diag, BATON_EMSG,
			    "key %u of %s is a %s, not a string", i, where, objtype(k));
		for (uint32_t j = 0; j < i; j++) {
			const msgpack_object *o = &map->ptr[j].key;
			if (o->via.str.size == k->via.str.size && (k->via.str.size == 0 ||
			    memcmp(o->via.str.ptr, k->via.str.ptr, k->via.str.size) == 0))
				return proto__fail(c->diag, BATON_EDUP,
				    "key '%s' appears twice in %s",
				    keytext(kt, sizeof kt, k->via.str.ptr, k->via.str.size), where);
		}
	}
	return 0;
}

static const msgpack_object *lookup(const msgpack_object_map *map, const char *key)
{
	for (uint32_t i = 0; i < map->size; i++)
		if (key_is(&map->ptr[i].key, key))
			return &map->ptr[i].val;
	return NULL;
}

static int dec_item(struct dctx *c, const msgpack_object *o, const struct proto__item *it,
    void *dst, const char *path);

static int dec_value(struct dctx *c, const msgpack_object *o, const struct proto__fdef *f,
    void *base, const char *path)
{
	void *dst = (char *)base + f->off;
	int err;

	switch (f->type) {
	case PT_BOOL:
		if (o->type != MSGPACK_OBJECT_BOOLEAN)
			goto wrong_type;
		*(bool *)dst = o->via.boolean;
		return 0;
	case PT_U32:
	case PT_U64:
	case PT_RESERVE: {
		if (f->type == PT_RESERVE && o->type == MSGPACK_OBJECT_NIL) {
			*(uint64_t *)dst = PROTO_RESERVE_FULL;
			return 0;
		}
		if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
			return proto__fail(c->diag, BATON_ERANGE,
			    "field '%s' of %s is negative (%" PRId64 ")", path, c->what,
			    o->via.i64);
		if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
			goto wrong_type;
		uint64_t v = o->via.u64;
		uint64_t max = f->type == PT_U32 ? UINT32_MAX :
		    f->type == PT_RESERVE ? PROTO_RESERVE_MIB_MAX : UINT64_MAX;
		if (f->limit && f->limit < max)
			max = f->limit;
		if (v > max)
			return proto__fail(c->diag, BATON_ERANGE,
			    "field '%s' of %s is %" PRIu64 ", more than %" PRIu64, path,
			    c->what, v, max);
		if (f->type == PT_U32)
			*(uint32_t *)dst = (uint32_t)v;
		else
			*(uint64_t *)dst = v;
		return 0;
	}
	case PT_I32: {
		int64_t v;
		if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
			if (o->via.u64 > INT32_MAX)
				return proto__fail(c->diag, BATON_ERANGE,
				    "field '%s' of %s is %" PRIu64 ", more than %d", path,
				    c->what, o->via.u64, INT32_MAX);
			v = (int64_t)o->via.u64;
		} else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
			if (o->via.i64 < INT32_MIN)
				return proto__fail(c->diag, BATON_ERANGE,
				    "field '%s' of %s is %" PRId64 ", less than %d", path,
				    c->what, o->via.i64, INT32_MIN);
			v = o->via.i64;
		} else {
			goto wrong_type;
		}
		*(int32_t *)dst = (int32_t)v;
		return 0;
	}
	case PT_F64: {
		double v;
		if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64)
			v = o->via.f64;
		else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			v = (double)o->via.u64;
		else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
			v = (double)o->via.i64;
		else
			goto wrong_type;
		if (!isfinite(v))
			return proto__fail(c->diag, BATON_ERANGE,
			    "field '%s' of %s is not a finite number", path, c->what);
		*(double *)dst = v;
		return 0;
	}
	case PT_STR: {
		if (o->type != MSGPACK_OBJECT_STR)
			goto wrong_type;
		uint32_t n = o->via.str.size;
		if (n > f->limit)
			return proto__fail(c->diag, BATON_ETOOBIG,
			    "field '%s' of %s is %u bytes long, more than %" PRIu64, path,
			    c->what, n, f->limit);
		if (!proto__utf8_ok(o->via.str.ptr, n))
			return proto__fail(c->diag, BATON_ERANGE,
			    "field '%s' of %s is not UTF-8 without NUL bytes", path, c->what);
		char *s = zalloc(c, (size_t)n + 1);
		if (!s)
			return proto__fail(c->diag, BATON_ENOMEM, "out of memory");
		if (n)
			memcpy(s, o->via.str.ptr, n);
		s[n] = '\0';
		*(const char **)dst = s;
		return 0;
	}
	case PT_BIN: {
		if (o->type != MSGPACK_OBJECT_BIN)
			goto wrong_type;
		uint32_t n = o->via.bin.size;
		if (n > f->limit)
			return proto__fail(c->diag, BATON_ETOOBIG,
			    "field '%s' of %s is %u bytes long, more than %" PRIu64, path,
			    c->what, n, f->limit);
		struct proto_bin *b = dst;
		b->len = n;
		b->data = NULL;
		if (n) {
			void *d = zalloc(c, n);
			if (!d)
				return proto__fail(c->diag, BATON_ENOMEM, "out of memory");
			memcpy(d, o->via.bin.ptr, n);
			b->data = d;
		}
		return 0;
	}
	case PT_GPUS:
	case PT_ENGINES: {
		if (o->type != MSGPACK_OBJECT_ARRAY)
			goto wrong_type;
		const struct proto__item *it = proto__item_of(f->type);
		uint32_t n = o->via.array.size;
		if (n > f->limit)
			return proto__fail(c->diag, BATON_ETOOBIG,
			    "field '%s' of %s has %u items, more than %" PRIu64, path,
			    c->what, n, f->limit);
		char *items = NULL;
		if (n) {
			items = zalloc(c, (size_t)n * it->size);
			if (!items)
				return proto__fail(c->diag, BATON_ENOMEM, "out of memory");
			memset(items, 0, (size_t)n * it->size);
		}
		for (uint32_t i = 0; i < n; i++) {
			char sub[64];
			snprintf(sub, sizeof sub, "%s[%u]", path, i);
			if ((err = dec_item(c, &o->via.array.ptr[i], it, items + (size_t)i * it->size, sub)))
				return err;
		}
		/* struct proto_gpus and proto_engines share this layout */
		struct proto_gpus *arr = dst;
		arr->v = (const void *)items;
		arr->n = n;
		return 0;
	}
	}
	return proto__fail(c->diag, BATON_EINTERNAL, "field '%s': unknown type", path);

wrong_type:
	return proto__fail(c->diag, BATON_ETYPE, "field '%s' of %s should be %s, not %s",
	    path, c->what, proto__type_name(f->type), objtype(o));
}

static int dec_item(struct dctx *c, const msgpack_object *o, const struct proto__item *it,
    void *dst, const char *path)
{
	char kt[48], sub[128];
	int err;
	if (o->type != MSGPACK_OBJECT_MAP)
		return proto__fail(c->diag, BATON_ETYPE, "'%s' of %s should be a map, not %s",
		    path, c->what, objtype(o));
	const msgpack_object_map *map = &o->via.map;
	if ((err = check_keys(c, map, path)))
		return err;
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key;
		const struct proto__fdef *f = NULL;
		for (size_t j = 0; j < it->n && !f; j++)
			if (key_is(k, it->fields[j].key))
				f = &it->fields[j];
		if (!f)
			return proto__fail(c->diag, BATON_EEXTRA, "unexpected field '%s' in %s of %s",
			    keytext(kt, sizeof kt, k->via.str.ptr, k->via.str.size), path, c->what);
		snprintf(sub, sizeof sub, "%s.%s", path, f->key);
		if ((err = dec_value(c, &map->ptr[i].val, f, dst, sub)))
			return err;
	}
	for (size_t j = 0; j < it->n; j++)
		if (!lookup(map, it->fields[j].key))
			return proto__fail(c->diag, BATON_EMISSING, "field '%s.%s' of %s is missing",
			    path, it->fields[j].key, c->what);
	return 0;
}

static int dec_root(struct dctx *c, const msgpack_object *root)
{
	struct baton_msg *m = c->m;
	struct proto_diag *diag = c->diag;
	const msgpack_object_map *map = &root->via.map;
	const msgpack_object *v, *op, *id, *ok;
	char kt[48];
	char what[48];
	int err;

	/* The scanner guarantees a map. Whatever fails next (duplicate keys
	 * included), a server can still answer with the id and op when they
	 * read as such. */
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key, *val = &map->ptr[i].val;
		if (k->type != MSGPACK_OBJECT_STR)
			continue;
		if (key_is(k, "id") && !diag->id && val->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
			diag->id = val->via.u64;
		if (key_is(k, "op") && diag->op == PROTO_OP_NONE && val->type == MSGPACK_OBJECT_STR)
			for (int o = PROTO_OP_NONE + 1; o < PROTO_OP_COUNT; o++)
				if (key_is(val, proto_op_name((enum proto_op)o)))
					diag->op = (enum proto_op)o;
	}
	if ((err = check_keys(c, map, "the message")))
		return err;

	v = lookup(map, "v");
	op = lookup(map, "op");
	id = lookup(map, "id");
	ok = lookup(map, "ok");

	if (!v)
		return proto__fail(diag, BATON_EMISSING, "field 'v' (version) is missing");
	if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return proto__fail(diag, BATON_EVERSION, "version %" PRId64 " is not supported (this is %d)",
		    v->via.i64, BATON_PROTO_VERSION);
	if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return proto__fail(diag, BATON_ETYPE, "field 'v' should be uint, not %s", objtype(v));
	if (v->via.u64 != BATON_PROTO_VERSION)
		return proto__fail(diag, BATON_EVERSION, "version %" PRIu64 " is not supported (this is %d)",
		    v->via.u64, BATON_PROTO_VERSION);

	bool reply = false, okv = false;
	if (ok) {
		if (ok->type != MSGPACK_OBJECT_BOOLEAN)
			return proto__fail(diag, BATON_ETYPE, "field 'ok' should be bool, not %s",
			    objtype(ok));
		reply = true;
		okv = ok->via.boolean;
	}

	if (!op) {
		/* An error reply leaves op out when the request's was unreadable. */
		if (!(reply && !okv))
			return proto__fail(diag, BATON_EMISSING, "field 'op' is missing");
	} else {
		if (op->type != MSGPACK_OBJECT_STR)
			return proto__fail(diag, BATON_ETYPE, "field 'op' should be str, not %s",
			    objtype(op));
		if (diag->op == PROTO_OP_NONE)
			return proto__fail(diag, BATON_EUNKNOWNOP, "unknown op '%s'",
			    keytext(kt, sizeof kt, op->via.str.ptr, op->via.str.size));
	}
	m->op = diag->op;

	if (!id)
		return proto__fail(diag, BATON_EMISSING, "field 'id' is missing");
	if (id->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		return proto__fail(diag, BATON_ETYPE, "field 'id' should be uint, not %s",
		    objtype(id));
	m->id = id->via.u64;
	m->reply = reply;
	m->ok = okv;

	if (reply && m->op == PROTO_OP_EVENT)
		return proto__fail(diag, BATON_EEXTRA, "unexpected field 'ok' in an event");
	if (!reply && m->id == 0)
		return proto__fail(diag, BATON_ERANGE, "field 'id' of a %s is 0",
		    m->op == PROTO_OP_EVENT ? "event" : "request");

	if (m->op == PROTO_OP_EVENT)
		snprintf(what, sizeof what, "an event");
	else if (m->op == PROTO_OP_NONE)
		snprintf(what, sizeof what, "an error reply");
	else
		snprintf(what, sizeof what, "%s %s", proto_op_name(m->op),
		    reply ? (okv ? "reply" : "error reply") : "request");
	c->what = what;

	if (reply && !okv) {
		const msgpack_object *e = NULL, *t = NULL;
		for (uint32_t i = 0; i < map->size; i++) {
			const msgpack_object *k = &map->ptr[i].key;
			if (key_is(k, "v") || key_is(k, "op") || key_is(k, "id") || key_is(k, "ok"))
				continue;
			if (key_is(k, "err"))
				e = &map->ptr[i].val;
			else if (key_is(k, "msg"))
				t = &map->ptr[i].val;
			else
				return proto__fail(diag, BATON_EEXTRA, "unexpected field '%s' in %s",
				    keytext(kt, sizeof kt, k->via.str.ptr, k->via.str.size), what);
		}
		if (!e)
			return proto__fail(diag, BATON_EMISSING, "field 'err' of %s is missing", what);
		if (e->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
			if (e->via.u64 < 1 || e->via.u64 > BATON_PROTO_MAX_ERR)
				return proto__fail(diag, BATON_ERANGE,
				    "field 'err' of %s is %" PRIu64 ", not 1..%d", what, e->via.u64,
				    BATON_PROTO_MAX_ERR);
		} else if (e->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
			return proto__fail(diag, BATON_ERANGE, "field 'err' of %s is negative", what);
		} else {
			return proto__fail(diag, BATON_ETYPE, "field 'err' of %s should be int, not %s",
			    what, objtype(e));
		}
		m->err = (int32_t)e->via.u64;
		if (!t)
			return proto__fail(diag, BATON_EMISSING, "field 'msg' of %s is missing", what);
		static const struct proto__fdef msgdef = {
			"msg", PT_STR, -1, offsetof(struct baton_msg, msg), BATON_PROTO_MAX_TEXT
		};
		return dec_value(c, t, &msgdef, m, "msg");
	}

	const struct proto__table *tab = proto__table(m->op, reply);
	if (!tab)
		return proto__fail(diag, BATON_EINTERNAL, "no table for %s", what);
	for (uint32_t i = 0; i < map->size; i++) {
		const msgpack_object *k = &map->ptr[i].key;
		if (key_is(k, "v") || key_is(k, "op") || key_is(k, "id") || key_is(k, "ok"))
			continue;
		const struct proto__fdef *f = NULL;
		for (size_t j = 0; j < tab->n && !f; j++)
			if (key_is(k, tab->rows[j].f->key))
				f = tab->rows[j].f;
		if (!f)
			return proto__fail(diag, BATON_EEXTRA, "unexpected field '%s' in %s",
			    keytext(kt, sizeof kt, k->via.str.ptr, k->via.str.size), what);
		if ((err = dec_value(c, &map->ptr[i].val, f, m, f->key)))
			return err;
		proto_set(m, (enum proto_field)f->bit);
	}
	for (size_t j = 0; j < tab->n; j++)
		if (tab->rows[j].req && !proto_has(m, (enum proto_field)tab->rows[j].f->bit))
			return proto__fail(diag, BATON_EMISSING, "field '%s' of %s is missing",
			    tab->rows[j].f->key, what);
	return 0;
}

int proto_decode(const void *buf, size_t len, struct baton_msg *m, struct proto_diag *diag)
{
	struct proto_diag local;
	msgpack_unpacked up;
	size_t off = 0;
	int err;

	if (!diag)
		diag = &local;
	memset(diag, 0, sizeof *diag);
	memset(m, 0, sizeof *m);
	if (!buf && len)
		return proto__fail(diag, BATON_EINVAL, "no buffer");
	if ((err = proto__scan(buf, len, diag)))
		return err;

	msgpack_unpacked_init(&up);
	msgpack_unpack_return r = msgpack_unpack_next(&up, buf, len, &off);
	if (r == MSGPACK_UNPACK_NOMEM_ERROR) {
		err = proto__fail(diag, BATON_ENOMEM, "out of memory unpacking %zu bytes", len);
	} else if (r != MSGPACK_UNPACK_SUCCESS || off != len ||
	    up.data.type != MSGPACK_OBJECT_MAP) {
		/* The scanner should have refused whatever msgpack-c refuses. */
		err = proto__fail(diag, BATON_EMSG, "msgpack-c cannot read the message (%d)", (int)r);
	} else {
		struct dctx c = { m, diag, "the message" };
		err = dec_root(&c, &up.data);
	}
	msgpack_unpacked_destroy(&up);
	if (err)
		proto_msg_free(m);
	else
		diag->text[0] = '\0';
	return err;
}

/* ---- encoding ------------------------------------------------------------------- */

struct ectx {
	const struct baton_msg *m;
	struct proto_diag *diag;
	char what[48];
};

/* Bytes of s to send when it is cut to cap at a UTF-8 boundary. */
static size_t cut_utf8(const char *s, size_t len, size_t cap)
{
	if (len <= cap)
		return len;
	size_t n = cap;
	while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
		n--;
	return n;
}

static int check_item(struct ectx *c, const struct proto__item *it, const void *item,
    const char *path);

static int check_value(struct ectx *c, const struct proto__fdef *f, const void *base,
    const char *path)
{
	const void *src = (const char *)base + f->off;
	switch (f->type) {
	case PT_BOOL:
	case PT_U32:
	case PT_U64:
	case PT_I32:
		return 0;
	case PT_RESERVE: {
		uint64_t v = *(const uint64_t *)src;
		if (v != PROTO_RESERVE_FULL && v > PROTO_RESERVE_MIB_MAX)
			return proto__fail(c->diag, BATON_ERANGE,
			    "field '%s' of %s is %" PRIu64 ", more than %" PRIu64, path, c->what,
			    v, (uint64_t)PROTO_RESERVE_MIB_MAX);
		return 0;
	}
	case PT_F64:
		if (!isfinite(*(const double *)src))
			return proto__fail(c->diag, BATON_ERANGE,
			    "field '%s' of %s is not a finite number", path, c->what);
		return 0;
	case PT_STR: {
		const char *s = *(const char *const *)src;
		if (!s)
			return proto__fail(c->diag, BATON_EMISSING, "field '%s' of %s is NULL",
			    path, c->what);
		size_t n = strlen(s);
		if (n > f->limit)
			return proto__fail(c->diag, BATON_ETOOBIG,
			    "field '%s' of %s is %zu bytes long, more than %" PRIu64, path,
			    c->what, n, f->limit);
		if (!proto__utf8_ok(s, n))
			return proto__fail(c->diag, BATON_ERANGE, "field '%s' of %s is not UTF-8",
			    path, c->what);
		return 0;
	}
	case PT_BIN: {
		const struct proto_bin *b = src;
		if (b->len > f->limit)
			return proto__fail(c->diag, BATON_ETOOBIG,
			    "field '%s' of %s is %zu bytes long, more than %" PRIu64, path,
			    c->what, b->len, f->limit);
		if (b->len && !b->data)
			return proto__fail(c->diag, BATON_EINVAL, "field '%s' of %s has no data",
			    path, c->what);
		return 0;
	}
	case PT_GPUS:
	case PT_ENGINES: {
		const struct proto_gpus *a = src;
		const struct proto__item *it = proto__item_of(f->type);
		if (a->n > f->limit)
			return proto__fail(c->diag, BATON_ETOOBIG,
			    "field '%s' of %s has %u items, more than %" PRIu64, path, c->what,
			    a->n, f->limit);
		if (a->n && !a->v)
			return proto__fail(c->diag, BATON_EINVAL, "field '%s' of %s has no items",
			    path, c->what);
		for (uint32_t i = 0; i < a->n; i++) {
			char sub[64];
			int err;
			snprintf(sub, sizeof sub, "%s[%u]", path, i);
			if ((err = check_item(c, it, (const char *)a->v + (size_t)i * it->size, sub)))
				return err;
		}
		return 0;
	}
	}
	return proto__fail(c->diag, BATON_EINTERNAL, "field '%s': unknown type", path);
}

static int check_item(struct ectx *c, const struct proto__item *it, const void *item,
    const char *path)
{
	char sub[128];
	int err;
	for (size_t j = 0; j < it->n; j++) {
		snprintf(sub, sizeof sub, "%s.%s", path, it->fields[j].key);
		if ((err = check_value(c, &it->fields[j], item, sub)))
			return err;
	}
	return 0;
}

/* Checks *m and counts the map entries it will have. */
static int check_msg(struct ectx *c, const struct proto__table **tabp, uint32_t *entries)
{
	const struct baton_msg *m = c->m;
	struct proto_diag *diag = c->diag;
	uint32_t n = 2; /* v, id */
	int err;

	if ((int)m->op < 0 || m->op >= PROTO_OP_COUNT ||
	    (m->op == PROTO_OP_NONE && !(m->reply && !m->ok)))
		return proto__fail(diag, BATON_EUNKNOWNOP, "cannot encode op %d", (int)m->op);
	if (m->op != PROTO_OP_NONE)
		n++;
	if (m->op == PROTO_OP_EVENT && m->reply)
		return proto__fail(diag, BATON_EINVAL, "an event has no reply");
	if (!m->reply && m->id == 0)
		return proto__fail(diag, BATON_ERANGE, "field 'id' of a %s is 0",
		    m->op == PROTO_OP_EVENT ? "event" : "request");
	if (m->op == PROTO_OP_EVENT)
		snprintf(c->what, sizeof c->what, "an event");
	else
		snprintf(c->what, sizeof c->what, "%s %s", proto_op_name(m->op),
		    m->reply ? (m->ok ? "reply" : "error reply") : "request");

	if (m->reply) {
		n++;
		if (!m->ok) {
			for (unsigned w = 0; w < PROTO_HAS_WORDS; w++)
				if (m->has[w])
					return proto__fail(diag, BATON_EEXTRA,
					    "%s carries body fields", c->what);
			if (m->err < 1 || m->err > BATON_PROTO_MAX_ERR)
				return proto__fail(diag, BATON_ERANGE,
				    "field 'err' of %s is %d, not 1..%d", c->what, (int)m->err,
				    BATON_PROTO_MAX_ERR);
			const char *t = m->msg ? m->msg : baton_strerror(m->err);
			size_t len = cut_utf8(t, strlen(t), BATON_PROTO_MAX_TEXT);
			if (!proto__utf8_ok(t, len))
				return proto__fail(diag, BATON_ERANGE,
				    "field 'msg' of %s is not UTF-8", c->what);
			*tabp = NULL;
			*entries = n + 2;
			return 0;
		}
	}

	const struct proto__table *tab = proto__table(m->op, m->reply);
	if (!tab)
		return proto__fail(diag, BATON_EINTERNAL, "no table for %s", c->what);
	/* no presence bit outside the table */
	for (int f = 0; f < PF_COUNT; f++) {
		if (!proto_has(m, (enum proto_field)f))
			continue;
		bool found = false;
		for (size_t j = 0; j < tab->n && !found; j++)
			found = tab->rows[j].f->bit == f;
		if (!found)
			return proto__fail(diag, BATON_EEXTRA, "field '%s' is not part of %s",
			    proto__fields[f].key, c->what);
	}
	for (size_t j = 0; j < tab->n; j++) {
		const struct proto__row *r = &tab->rows[j];
		if (!r->req && !proto_has(m, (enum proto_field)r->f->bit))
			continue;
		if ((err = check_value(c, r->f, m, r->f->key)))
			return err;
		n++;
	}
	*tabp = tab;
	*entries = n;
	return 0;
}

static int pack_str(msgpack_packer *pk, const char *s, size_t n)
{
	return msgpack_pack_str(pk, n) || (n && msgpack_pack_str_body(pk, s, n));
}

static int pack_key(msgpack_packer *pk, const char *k)
{
	return pack_str(pk, k, strlen(k));
}

static int pack_value(msgpack_packer *pk, const struct proto__fdef *f, const void *base)
{
	const void *src = (const char *)base + f->off;
	switch (f->type) {
	case PT_BOOL:
		return *(const bool *)src ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
	case PT_U32:
		return msgpack_pack_uint32(pk, *(const uint32_t *)src);
	case PT_U64:
		return msgpack_pack_uint64(pk, *(const uint64_t *)src);
	case PT_RESERVE: {
		uint64_t v = *(const uint64_t *)src;
		return v == PROTO_RESERVE_FULL ? msgpack_pack_nil(pk) : msgpack_pack_uint64(pk, v);
	}
	case PT_I32:
		return msgpack_pack_int32(pk, *(const int32_t *)src);
	case PT_F64:
		return msgpack_pack_double(pk, *(const double *)src);
	case PT_STR: {
		const char *s = *(const char *const *)src;
		return pack_str(pk, s, strlen(s));
	}
	case PT_BIN: {
		const struct proto_bin *b = src;
		return msgpack_pack_bin(pk, b->len) ||
		    (b->len && msgpack_pack_bin_body(pk, b->data, b->len));
	}
	case PT_GPUS:
	case PT_ENGINES: {
		const struct proto_gpus *a = src;
		const struct proto__item *it = proto__item_of(f->type);
		if (msgpack_pack_array(pk, a->n))
			return -1;
		for (uint32_t i = 0; i < a->n; i++) {
			const char *item = (const char *)a->v + (size_t)i * it->size;
			if (msgpack_pack_map(pk, it->n))
				return -1;
			for (size_t j = 0; j < it->n; j++)
				if (pack_key(pk, it->fields[j].key) ||
				    pack_value(pk, &it->fields[j], item))
					return -1;
		}
		return 0;
	}
	}
	return -1;
}

struct wcap {
	proto__write_fn w;
	void *data;
	size_t total;
	bool toobig;
};

static int capped_write(void *data, const char *buf, size_t len)
{
	struct wcap *x = data;
	if (len > BATON_PROTO_MAX_MSG - x->total) {
		x->toobig = true;
		return -1;
	}
	x->total += len;
	return x->w(x->data, buf, len);
}

int proto__encode_to(const struct baton_msg *m, proto__write_fn w, void *data,
    struct proto_diag *diag)
{
	struct proto_diag local;
	struct ectx c = { m, diag ? diag : &local, "" };
	const struct proto__table *tab = NULL;
	uint32_t entries = 0;
	int err;

	memset(c.diag, 0, sizeof *c.diag);
	c.diag->id = m->id;
	c.diag->op = m->op;
	if ((err = check_msg(&c, &tab, &entries)))
		return err;

	struct wcap cap = { w, data, 0, false };
	msgpack_packer pk;
	msgpack_packer_init(&pk, &cap, capped_write);
	int bad = msgpack_pack_map(&pk, entries) ||
	    pack_key(&pk, "v") || msgpack_pack_uint32(&pk, BATON_PROTO_VERSION);
	if (!bad && m->op != PROTO_OP_NONE)
		bad = pack_key(&pk, "op") || pack_key(&pk, proto_op_name(m->op));
	bad = bad || pack_key(&pk, "id") || msgpack_pack_uint64(&pk, m->id);
	if (!bad && m->reply)
		bad = pack_key(&pk, "ok") || (m->ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk));
	if (!bad && m->reply && !m->ok) {
		const char *t = m->msg ? m->msg : baton_strerror(m->err);
		bad = pack_key(&pk, "err") || msgpack_pack_int32(&pk, m->err) ||
		    pack_key(&pk, "msg") ||
		    pack_str(&pk, t, cut_utf8(t, strlen(t), BATON_PROTO_MAX_TEXT));
	}
	for (size_t j = 0; !bad && tab && j < tab->n; j++) {
		const struct proto__row *r = &tab->rows[j];
		if (!r->req && !proto_has(m, (enum proto_field)r->f->bit))
			continue;
		bad = pack_key(&pk, r->f->key) || pack_value(&pk, r->f, m);
	}
	if (bad) {
		if (cap.toobig)
			return proto__fail(c.diag, BATON_ETOOBIG,
			    "%s would be larger than %u bytes", c.what, BATON_PROTO_MAX_MSG);
		return proto__fail(c.diag, BATON_ENOMEM, "out of memory encoding %s", c.what);
	}
	return 0;
}

struct growbuf {
	char *p;
	size_t len, cap;
};

static int grow_write(void *data, const char *buf, size_t len)
{
	struct growbuf *g = data;
	if (len > g->cap - g->len) {
		size_t cap = g->cap ? g->cap : 256;
		while (cap - g->len < len)
			cap *= 2;
		char *p = realloc(g->p, cap);
		if (!p)
			return -1;
		g->p = p;
		g->cap = cap;
	}
	memcpy(g->p + g->len, buf, len);
	g->len += len;
	return 0;
}

int proto_encode(const struct baton_msg *m, void **buf, size_t *len, struct proto_diag *diag)
{
	struct growbuf g = { NULL, 0, 0 };
	int err = proto__encode_to(m, grow_write, &g, diag);
	if (err) {
		free(g.p);
		*buf = NULL;
		*len = 0;
		return err;
	}
	*buf = g.p;
	*len = g.len;
	return 0;
}
