/*
 * jinja_eval.c: renders a parsed template as jinja2's
 * ImmutableSandboxedEnvironment does for transformers: default Undefined
 * (prints as "", fails on use), Python's operators, attribute and item
 * access, macros, namespaces, loops with loop.* and loopcontrols, the
 * statements, and the public door (text_jinja_load/render/free). Work is
 * bounded: steps, output and string size, memory and macro depth each stop
 * the render with an error. The filters, tests, methods and globals
 * (raise_exception, strftime_now, tojson as transformers defines it) are in
 * jinja_filters.c, jinja_tests.c, jinja_methods.c and jinja_globals.c, their
 * names in jinja_builtins.c.
 */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <utf8proc.h>

#include "text/jinja_int.h"

struct text_jinja {
	struct jj_arena a;
	struct jj_node *root;
};

enum { ST_OK, ST_BREAK, ST_CONTINUE, ST_ERR };

int jj_rfail(struct rs *r, int line, int code, const char *fmt, ...)
{
	if (r->rc)
		return r->rc;
	char msg[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	r->rc = text_errf(r->err, r->errlen, code, "template line %d: %s", line, msg);
	return r->rc;
}

int jj_oom(struct rs *r, int line)
{
	return jj_rfail(r, line, BATON_ENOMEM, "out of memory (the render's limit is %u MiB)", MAX_MEM >> 20);
}

int jj_undef_fail(struct rs *r, int line, jv u)
{
	if (u.s.p)
		return jj_rfail(r, line, BATON_EINVAL, "'%.*s' is undefined", (int)u.s.n, u.s.p);
	return jj_rfail(r, line, BATON_EINVAL, "a value is undefined");
}

/* ---- strings ------------------------------------------------------------- */

jv jj_mkstr(struct rs *r, int line, const char *p, size_t n)
{
	if (n > MAX_OUT) {
		jj_rfail(r, line, BATON_ETOOBIG, "a string over %u MiB", MAX_OUT >> 20);
		return jv_undef(NULL, 0);
	}
	char *s = jj_alloc(r->a, n + 1);
	if (!s) {
		jj_oom(r, line);
		return jv_undef(NULL, 0);
	}
	if (n)
		memcpy(s, p, n);
	return jv_str(s, n);
}

jv jj_tbuf_str(struct rs *r, int line, struct tbuf *b)
{
	jv v = jj_mkstr(r, line, b->p ? b->p : "", b->n);
	tx_tbuf_free(b);
	return v;
}

/* str(v) as a string value. */
int jj_to_str(struct rs *r, int line, jv v, jv *out)
{
	if (v.t == JV_STR) {
		*out = v;
		return 0;
	}
	struct tbuf b = {0};
	char e[300];
	int rc = jv_str_into(&b, v, e, sizeof(e));
	if (rc) {
		tx_tbuf_free(&b);
		return jj_rfail(r, line, rc, "%s", e);
	}
	*out = jj_tbuf_str(r, line, &b);
	return r->rc;
}


/* ---- frames --------------------------------------------------------------- */

static struct frame *frame_new(struct rs *r, struct frame *up)
{
	struct frame *f = jj_alloc(r->a, sizeof(*f));
	if (f)
		f->up = up;
	return f;
}

static int frame_set(struct rs *r, struct frame *f, jv name, jv val)
{
	for (size_t i = 0; i < f->n; i++)
		if (f->k[i].s.n == name.s.n && !memcmp(f->k[i].s.p, name.s.p, name.s.n)) {
			f->v[i] = val;
			return 0;
		}
	if (f->n == f->cap) {
		size_t cap = f->cap ? f->cap * 2 : 8;
		jv *k = jj_alloc(r->a, cap * sizeof(jv)), *v = jj_alloc(r->a, cap * sizeof(jv));
		if (!k || !v)
			return BATON_ENOMEM;
		if (f->n) {
			memcpy(k, f->k, f->n * sizeof(jv));
			memcpy(v, f->v, f->n * sizeof(jv));
		}
		f->k = k, f->v = v, f->cap = cap;
	}
	f->k[f->n] = name;
	f->v[f->n++] = val;
	return 0;
}

static jv *frame_get(struct frame *f, const char *p, size_t n)
{
	for (; f; f = f->up)
		for (size_t i = f->n; i-- > 0;)
			if (f->k[i].s.n == n && !memcmp(f->k[i].s.p, p, n))
				return &f->v[i];
	return NULL;
}


/* ---- attribute and item access ---------------------------------------- */

/* jinja2's getattr: the attribute (a method), else the item. */
static int getattr_(struct rs *r, int line, jv obj, const char *name, size_t n, jv *out)
{
	int m = jj_method_id(name, n);
	*out = jv_undef(name, n);
	switch (obj.t) {
	case JV_UNDEF: return jj_undef_fail(r, line, obj);
	case JV_DICT:
		if (obj.kind) { /* the loop object */
			if (m == M_CYCLE) {
				*out = jj_method(r, obj, m);
				return 0;
			}
		} else if (m >= 0 && jj_is_dict_method(m)) {
			*out = jj_method(r, obj, m);
			return 0;
		}
		/* fallthrough */
	case JV_NS: {
		jv *v = jv_dict_gets(&obj, name, n);
		if (v)
			*out = *v;
		return 0;
	}
	case JV_STR:
		if (m >= 0 && jj_is_str_method(m))
			*out = jj_method(r, obj, m);
		return 0;
	case JV_LIST:
		if (m >= 0 && jj_is_list_method(m) && (obj.kind == JK_LIST || (obj.kind == JK_TUPLE && m <= M_INDEX)))
			*out = jj_method(r, obj, m);
		return 0;
	default: return 0;
	}
}

bool jj_as_index(jv k, int64_t *i)
{
	if (k.t == JV_INT || k.t == JV_BOOL) {
		*i = k.t == JV_BOOL ? k.b : k.i;
		return true;
	}
	return false;
}

/* jinja2's getitem: the item, else (a string key) the attribute. */
int jj_getitem(struct rs *r, int line, jv obj, jv key, jv *out)
{
	*out = jv_undef(NULL, 0);
	int64_t i;
	switch (obj.t) {
	case JV_UNDEF: return jj_undef_fail(r, line, obj);
	case JV_DICT:
		if (!obj.kind) {
			jv *v = jv_dict_get(&obj, key);
			if (v) {
				*out = *v;
				return 0;
			}
		}
		break;
	case JV_LIST:
		if (obj.kind != JK_GEN && jj_as_index(key, &i)) {
			int64_t n = (int64_t)obj.l->n;
			if (i < 0)
				i += n;
			if (i >= 0 && i < n)
				*out = obj.l->v[i];
			return 0;
		}
		break;
	case JV_STR:
		if (jj_as_index(key, &i)) {
			int64_t n = (int64_t)jj_utf8_count(obj.s.p, obj.s.n);
			if (i < 0)
				i += n;
			if (i >= 0 && i < n) {
				size_t a = jj_utf8_offset(obj.s.p, obj.s.n, (size_t)i);
				size_t b = jj_utf8_offset(obj.s.p, obj.s.n, (size_t)i + 1);
				*out = jv_str(obj.s.p + a, b - a);
			}
			return 0;
		}
		break;
	default: break;
	}
	if (key.t == JV_STR)
		return getattr_(r, line, obj, key.s.p, key.s.n, out);
	return 0;
}

/* ---- iteration ------------------------------------------------------------ */

/* The items a for loop or a filter walks: a list's items, a dict's keys, a
 * string's characters; Undefined is empty. */
int jj_items_of(struct rs *r, int line, jv v, jv *out)
{
	switch (v.t) {
	case JV_UNDEF: *out = jv_list_new(r->a, 0, JK_LIST); return out->t == JV_LIST ? 0 : jj_oom(r, line);
	case JV_LIST:
		if (v.kind == JK_GEN) {
			/* a generator runs once: what is left of it, then nothing */
			*out = jv_list_new(r->a, 0, JK_LIST);
			if (out->t != JV_LIST)
				return jj_oom(r, line);
			out->l->v = v.l->v + v.l->pos;
			out->l->n = out->l->cap = v.l->n - v.l->pos;
			v.l->pos = v.l->n;
			return 0;
		}
		*out = v;
		return 0;
	case JV_DICT: {
		if (v.kind)
			break;
		*out = jv_list_new(r->a, v.d->n, JK_LIST);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		if (v.d->n)
			memcpy(out->l->v, v.d->k, v.d->n * sizeof(jv));
		out->l->n = v.d->n;
		return 0;
	}
	case JV_STR: {
		*out = jv_list_new(r->a, v.s.n, JK_LIST);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		for (size_t i = 0; i < v.s.n;) {
			size_t adv;
			jj_cp_at(v.s.p + i, v.s.n - i, &adv);
			out->l->v[out->l->n++] = jv_str(v.s.p + i, adv);
			i += adv;
		}
		return 0;
	}
	default: break;
	}
	return jj_rfail(r, line, BATON_EINVAL, "'%s' object is not iterable", jv_type_name(v));
}

int jj_len_of(struct rs *r, int line, jv v, int64_t *n)
{
	switch (v.t) {
	case JV_UNDEF: *n = 0; return 0;
	case JV_STR: *n = (int64_t)jj_utf8_count(v.s.p, v.s.n); return 0;
	case JV_LIST:
		if (v.kind == JK_GEN)
			break;
		*n = (int64_t)v.l->n;
		return 0;
	case JV_DICT:
		if (v.kind)
			break;
		*n = (int64_t)v.d->n;
		return 0;
	default: break;
	}
	return jj_rfail(r, line, BATON_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
}

int jj_contains(struct rs *r, int line, jv needle, jv hay, bool *out)
{
	*out = false;
	switch (hay.t) {
	case JV_UNDEF: return 0;
	case JV_STR:
		if (needle.t != JV_STR)
			return jj_rfail(r, line, BATON_EINVAL, "'in <string>' requires string as left operand, not %s",
			             jv_type_name(needle));
		*out = jj_find(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
		return 0;
	case JV_LIST: {
		/* a generator is consumed up to the item found */
		size_t i = hay.kind == JK_GEN ? hay.l->pos : 0;
		for (; i < hay.l->n; i++)
			if (jv_equal(needle, hay.l->v[i])) {
				*out = true;
				break;
			}
		if (hay.kind == JK_GEN)
			hay.l->pos = i < hay.l->n ? i + 1 : i;
		return 0;
	}
	case JV_DICT:
		if (hay.kind)
			break;
		*out = jv_dict_get(&hay, needle) != NULL;
		return 0;
	default: break;
	}
	return jj_rfail(r, line, BATON_EINVAL, "argument of type '%s' is not iterable", jv_type_name(hay));
}

/* ---- evaluation ------------------------------------------------------------ */

static int eval(struct rs *r, const struct jj_node *n, struct frame *f, jv *out);
static int exec_body(struct rs *r, struct jj_node *const *v, size_t nv, struct frame *f);
static int call_value(struct rs *r, int line, jv fn, jv *args, size_t nargs, jv *kwn, jv *kwv,
                      size_t nkw, jv *out);

static int step(struct rs *r, int line)
{
	if (++r->steps > MAX_STEPS)
		return jj_rfail(r, line, BATON_ETOOBIG, "the template ran over %llu steps",
		             (unsigned long long)MAX_STEPS);
	return 0;
}

int jj_arith(struct rs *r, int line, int op, jv a, jv b, jv *out)
{
	if (a.t == JV_UNDEF)
		return jj_undef_fail(r, line, a);
	if (b.t == JV_UNDEF)
		return jj_undef_fail(r, line, b);
	if (op == JO_ADD && a.t == JV_STR && b.t == JV_STR) {
		if (a.s.n + b.s.n > MAX_OUT)
			return jj_rfail(r, line, BATON_ETOOBIG, "a string over %u MiB", MAX_OUT >> 20);
		char *s = jj_alloc(r->a, a.s.n + b.s.n + 1);
		if (!s)
			return jj_oom(r, line);
		memcpy(s, a.s.p, a.s.n);
		memcpy(s + a.s.n, b.s.p, b.s.n);
		*out = jv_str(s, a.s.n + b.s.n);
		return 0;
	}
	if (op == JO_ADD && a.t == JV_LIST && b.t == JV_LIST && a.kind == b.kind &&
	    (a.kind == JK_LIST || a.kind == JK_TUPLE)) {
		*out = jv_list_new(r->a, a.l->n + b.l->n, a.kind);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		memcpy(out->l->v, a.l->v, a.l->n * sizeof(jv));
		memcpy(out->l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
		out->l->n = a.l->n + b.l->n;
		return 0;
	}
	if (op == JO_MUL && ((a.t == JV_STR || a.t == JV_LIST) != (b.t == JV_STR || b.t == JV_LIST))) {
		jv seq = a.t == JV_STR || a.t == JV_LIST ? a : b, k = seq.t == a.t ? b : a;
		int64_t times;
		if (!jj_as_index(k, &times) || (seq.t == JV_LIST && seq.kind != JK_LIST && seq.kind != JK_TUPLE))
			goto bad;
		if (times < 0)
			times = 0;
		size_t each = seq.t == JV_STR ? seq.s.n : seq.l->n * sizeof(jv);
		if (each && (uint64_t)times > MAX_OUT / each)
			return jj_rfail(r, line, BATON_ETOOBIG, "a repetition over %u MiB", MAX_OUT >> 20);
		if (seq.t == JV_STR) {
			char *s = jj_alloc(r->a, seq.s.n * (size_t)times + 1);
			if (!s)
				return jj_oom(r, line);
			for (int64_t i = 0; i < times; i++)
				memcpy(s + seq.s.n * (size_t)i, seq.s.p, seq.s.n);
			*out = jv_str(s, seq.s.n * (size_t)times);
		} else {
			*out = jv_list_new(r->a, seq.l->n * (size_t)times, seq.kind);
			if (out->t != JV_LIST)
				return jj_oom(r, line);
			for (int64_t i = 0; i < times; i++)
				memcpy(out->l->v + seq.l->n * (size_t)i, seq.l->v, seq.l->n * sizeof(jv));
			out->l->n = seq.l->n * (size_t)times;
		}
		return 0;
	}
	if (op == JO_MOD && a.t == JV_STR)
		return jj_rfail(r, line, BATON_EUNSUPPORTED, "string formatting with %% is not supported");
	if (!jv_is_num(a) || !jv_is_num(b))
		goto bad;
	bool fl = a.t == JV_FLOAT || b.t == JV_FLOAT || op == JO_DIV;
	if (!fl) {
		int64_t x = a.t == JV_BOOL ? a.b : a.i, y = b.t == JV_BOOL ? b.b : b.i, z = 0;
		bool ovf = false;
		switch (op) {
		case JO_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
		case JO_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
		case JO_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
		case JO_FLOORDIV:
		case JO_MOD:
			if (y == 0)
				return jj_rfail(r, line, BATON_EINVAL, "integer division or modulo by zero");
			if (x == INT64_MIN && y == -1) {
				ovf = true;
				break;
			}
			z = op == JO_FLOORDIV ? x / y : x % y;
			if (op == JO_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0)))
				z--;
			if (op == JO_MOD && z != 0 && ((z < 0) != (y < 0)))
				z += y;
			break;
		case JO_POW:
			if (y < 0) {
				fl = true;
				break;
			}
			z = 1;
			for (int64_t i = 0; i < y && !ovf; i++)
				ovf = __builtin_mul_overflow(z, x, &z);
			break;
		}
		if (ovf)
			return jj_rfail(r, line, BATON_ERANGE, "an integer outside 64 bits");
		if (!fl) {
			*out = jv_int(z);
			return 0;
		}
	}
	double x = jv_num(a), y = jv_num(b), z = 0;
	switch (op) {
	case JO_ADD: z = x + y; break;
	case JO_SUB: z = x - y; break;
	case JO_MUL: z = x * y; break;
	case JO_DIV:
	case JO_FLOORDIV:
	case JO_MOD:
		if (y == 0)
			return jj_rfail(r, line, BATON_EINVAL, "float division by zero");
		if (op == JO_DIV)
			z = x / y;
		else if (op == JO_FLOORDIV)
			z = floor(x / y);
		else {
			z = fmod(x, y);
			if (z != 0 && ((z < 0) != (y < 0)))
				z += y;
		}
		break;
	case JO_POW: z = pow(x, y); break;
	}
	*out = jv_float(z);
	return 0;
bad:
	return jj_rfail(r, line, BATON_EINVAL, "unsupported operand type(s): '%s' and '%s'", jv_type_name(a),
	             jv_type_name(b));
}

int jj_compare(struct rs *r, int line, int op, jv a, jv b, bool *res)
{
	int rc;
	switch (op) {
	case JO_EQ: *res = jv_equal(a, b); return 0;
	case JO_NE: *res = !jv_equal(a, b); return 0;
	case JO_IN: return jj_contains(r, line, a, b, res);
	case JO_NOTIN:
		rc = jj_contains(r, line, a, b, res);
		*res = !*res;
		return rc;
	default: break;
	}
	if (a.t == JV_UNDEF)
		return jj_undef_fail(r, line, a);
	if (b.t == JV_UNDEF)
		return jj_undef_fail(r, line, b);
	int c = jv_cmp(a, b, &rc);
	if (rc)
		return jj_rfail(r, line, BATON_EINVAL, "comparison not supported between instances of '%s' and '%s'",
		             jv_type_name(a), jv_type_name(b));
	*res = op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
	return 0;
}

/* Python's slice of a sequence of `len` items: the indices taken. */
static int slice_idx(struct rs *r, int line, jv *parts, int64_t len, int64_t *start, int64_t *stop,
                     int64_t *stepv)
{
	int64_t st = 1;
	if (parts[2].t != JV_NONE && parts[2].t != JV_UNDEF && !jj_as_index(parts[2], &st))
		return jj_rfail(r, line, BATON_EINVAL, "slice indices must be integers or None");
	if (st == 0)
		return jj_rfail(r, line, BATON_EINVAL, "slice step cannot be zero");
	int64_t lo, hi;
	for (int k = 0; k < 2; k++) {
		int64_t v;
		bool given = parts[k].t != JV_NONE && parts[k].t != JV_UNDEF;
		if (given && !jj_as_index(parts[k], &v))
			return jj_rfail(r, line, BATON_EINVAL, "slice indices must be integers or None");
		if (!given)
			v = k == 0 ? (st > 0 ? 0 : len - 1) : (st > 0 ? len : -1);
		else {
			if (v < 0) {
				v += len;
				if (v < 0)
					v = st > 0 ? 0 : -1;
			} else if (v >= len)
				v = st > 0 ? len : len - 1;
		}
		if (k == 0)
			lo = v;
		else
			hi = v;
	}
	*start = lo;
	*stop = hi;
	*stepv = st;
	return 0;
}

static int do_slice(struct rs *r, int line, jv obj, jv *parts, jv *out)
{
	if (obj.t == JV_UNDEF)
		return jj_undef_fail(r, line, obj);
	int64_t a, b, s;
	if (obj.t == JV_LIST && obj.kind != JK_GEN) {
		if (slice_idx(r, line, parts, (int64_t)obj.l->n, &a, &b, &s))
			return r->rc;
		*out = jv_list_new(r->a, 0, obj.kind == JK_TUPLE ? JK_TUPLE : JK_LIST);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
			if (jv_list_push(r->a, out, obj.l->v[i]))
				return jj_oom(r, line);
		return 0;
	}
	if (obj.t == JV_STR) {
		int64_t n = (int64_t)jj_utf8_count(obj.s.p, obj.s.n);
		if (slice_idx(r, line, parts, n, &a, &b, &s))
			return r->rc;
		if (s == 1) {
			if (b < a)
				b = a;
			size_t x = jj_utf8_offset(obj.s.p, obj.s.n, (size_t)a);
			size_t y = jj_utf8_offset(obj.s.p, obj.s.n, (size_t)b);
			*out = jv_str(obj.s.p + x, y - x);
			return 0;
		}
		struct tbuf t = {0};
		int rc = 0;
		for (int64_t i = a; (s > 0 ? i < b : i > b) && !rc; i += s) {
			size_t x = jj_utf8_offset(obj.s.p, obj.s.n, (size_t)i);
			size_t y = jj_utf8_offset(obj.s.p, obj.s.n, (size_t)i + 1);
			rc = tx_tbuf_put(&t, obj.s.p + x, y - x);
		}
		if (rc) {
			tx_tbuf_free(&t);
			return jj_oom(r, line);
		}
		*out = jj_tbuf_str(r, line, &t);
		return r->rc;
	}
	*out = jv_undef(NULL, 0);
	return 0;
}

/* Binds a for loop's or a with's target (a name or a tuple of names). */
static int assign(struct rs *r, const struct jj_node *t, jv val, struct frame *f)
{
	if (t->kind == E_NAME)
		return frame_set(r, f, t->c, val) ? jj_oom(r, t->line) : 0;
	if (t->kind == E_TUPLE) {
		if (val.t != JV_LIST || val.kind == JK_GEN)
			return jj_rfail(r, t->line, BATON_EINVAL, "cannot unpack a '%s'", jv_type_name(val));
		if (val.l->n != t->nv)
			return jj_rfail(r, t->line, BATON_EINVAL, "cannot unpack %zu values into %zu names", val.l->n,
			             t->nv);
		for (size_t i = 0; i < t->nv; i++)
			if (assign(r, t->v[i], val.l->v[i], f))
				return r->rc;
		return 0;
	}
	if (t->kind == E_ATTR) {
		jv ns;
		if (eval(r, t->a, f, &ns))
			return r->rc;
		if (ns.t != JV_NS)
			return jj_rfail(r, t->line, BATON_EINVAL, "cannot assign attribute on non-namespace object");
		return jv_dict_set(r->a, &ns, t->c, val) ? jj_oom(r, t->line) : 0;
	}
	return jj_rfail(r, t->line, BATON_EINVAL, "cannot assign to this expression");
}

static int eval_args(struct rs *r, const struct jj_node *n, struct frame *f, jv **args, jv **kwn,
                     jv **kwv)
{
	*args = jj_alloc(r->a, (n->nv + 1) * sizeof(jv));
	*kwn = jj_alloc(r->a, (n->nw + 1) * sizeof(jv));
	*kwv = jj_alloc(r->a, (n->nw + 1) * sizeof(jv));
	if (!*args || !*kwn || !*kwv)
		return jj_oom(r, n->line);
	for (size_t i = 0; i < n->nv; i++)
		if (eval(r, n->v[i], f, &(*args)[i]))
			return r->rc;
	for (size_t i = 0; i < n->nw; i++) {
		(*kwn)[i] = n->w[i]->c;
		if (eval(r, n->w[i]->a, f, &(*kwv)[i]))
			return r->rc;
	}
	return 0;
}




static int macro_call(struct rs *r, int line, struct jj_closure *c, jv *args, size_t nargs, jv *kwn,
                      jv *kwv, size_t nkw, jv *out)
{
	const struct jj_node *m = c->n;
	jv caller = r->caller; /* a call block's body is for this call only */
	r->caller = jv_undef(NULL, 0);
	if (r->depth >= MAX_DEPTH)
		return jj_rfail(r, line, BATON_ETOOBIG, "macros nested deeper than %d", MAX_DEPTH);
	struct frame *f = frame_new(r, c->f);
	if (!f)
		return jj_oom(r, line);
	jv varargs = jv_list_new(r->a, 0, JK_TUPLE), kwargs = jv_dict_new(r->a, JV_DICT);
	if (varargs.t != JV_LIST || kwargs.t != JV_DICT)
		return jj_oom(r, line);
	bool *set = jj_alloc(r->a, m->nv + 1);
	if (!set)
		return jj_oom(r, line);
	for (size_t i = 0; i < nargs; i++) {
		if (i < m->nv) {
			if (frame_set(r, f, m->v[i]->c, args[i]))
				return jj_oom(r, line);
			set[i] = true;
		} else if (jv_list_push(r->a, &varargs, args[i]))
			return jj_oom(r, line);
	}
	for (size_t k = 0; k < nkw; k++) {
		size_t i;
		for (i = 0; i < m->nv; i++)
			if (m->v[i]->c.s.n == kwn[k].s.n && !memcmp(m->v[i]->c.s.p, kwn[k].s.p, kwn[k].s.n))
				break;
		if (i < m->nv) {
			if (set[i])
				return jj_rfail(r, line, BATON_EINVAL, "macro '%.*s' got multiple values for argument '%.*s'",
				             (int)m->c.s.n, m->c.s.p, (int)kwn[k].s.n, kwn[k].s.p);
			if (frame_set(r, f, m->v[i]->c, kwv[k]))
				return jj_oom(r, line);
			set[i] = true;
		} else if (jv_dict_set(r->a, &kwargs, kwn[k], kwv[k]))
			return jj_oom(r, line);
	}
	for (size_t i = 0; i < m->nv; i++) {
		if (set[i])
			continue;
		jv d = jv_undef(m->v[i]->c.s.p, m->v[i]->c.s.n);
		if (m->v[i]->b && eval(r, m->v[i]->b, f, &d))
			return r->rc;
		if (frame_set(r, f, m->v[i]->c, d))
			return jj_oom(r, line);
	}
	if (frame_set(r, f, jv_str("varargs", 7), varargs) || frame_set(r, f, jv_str("kwargs", 6), kwargs))
		return jj_oom(r, line);
	if (caller.t == JV_MACRO && frame_set(r, f, jv_str("caller", 6), caller))
		return jj_oom(r, line);
	struct tbuf *saved = r->out, b = {0};
	r->out = &b;
	r->depth++;
	int st = exec_body(r, m->w, m->nw, f);
	r->depth--;
	r->out = saved;
	if (st == ST_ERR) {
		tx_tbuf_free(&b);
		return r->rc;
	}
	*out = jj_tbuf_str(r, line, &b);
	return r->rc;
}


static int call_value(struct rs *r, int line, jv fn, jv *args, size_t nargs, jv *kwn, jv *kwv,
                      size_t nkw, jv *out)
{
	struct argv_ a = {args, kwn, kwv, nargs, nkw};
	switch (fn.t) {
	case JV_MACRO: return macro_call(r, line, fn.mac, args, nargs, kwn, kwv, nkw, out);
	case JV_FUNC: return jj_call_global(r, line, fn.aux, &a, out);
	case JV_METHOD: return jj_call_method(r, line, *fn.self, fn.aux, &a, out);
	case JV_UNDEF: return jj_undef_fail(r, line, fn);
	default: return jj_rfail(r, line, BATON_EINVAL, "'%s' object is not callable", jv_type_name(fn));
	}
}


static int eval(struct rs *r, const struct jj_node *n, struct frame *f, jv *out)
{
	if (step(r, n->line))
		return r->rc;
	jv a, b;
	switch (n->kind) {
	case E_CONST: *out = n->c; return 0;
	case E_NAME: {
		jv *v = frame_get(f, n->c.s.p, n->c.s.n);
		if (v) {
			*out = *v;
			return 0;
		}
		int g = jj_global_id(n->c.s.p, n->c.s.n);
		if (g >= 0) {
			*out = (jv){.t = JV_FUNC, .aux = (uint16_t)g};
			return 0;
		}
		*out = jv_undef(n->c.s.p, n->c.s.n);
		return 0;
	}
	case E_ATTR:
		if (eval(r, n->a, f, &a))
			return r->rc;
		if (getattr_(r, n->line, a, n->c.s.p, n->c.s.n, out))
			return r->rc;
		if (out->t == JV_METHOD && !out->self)
			return jj_oom(r, n->line);
		return 0;
	case E_ITEM:
		if (eval(r, n->a, f, &a) || eval(r, n->b, f, &b))
			return r->rc;
		return jj_getitem(r, n->line, a, b, out);
	case E_SLICE: {
		jv parts[3];
		if (eval(r, n->a, f, &a))
			return r->rc;
		for (int k = 0; k < 3; k++) {
			parts[k] = jv_none();
			if (n->v[k] && eval(r, n->v[k], f, &parts[k]))
				return r->rc;
		}
		return do_slice(r, n->line, a, parts, out);
	}
	case E_CALL: {
		jv *args, *kwn, *kwv;
		if (eval(r, n->a, f, &a) || eval_args(r, n, f, &args, &kwn, &kwv))
			return r->rc;
		return call_value(r, n->line, a, args, n->nv, kwn, kwv, n->nw, out);
	}
	case E_FILTER: {
		jv *args, *kwn, *kwv;
		if (eval(r, n->a, f, &a) || eval_args(r, n, f, &args, &kwn, &kwv))
			return r->rc;
		struct argv_ av = {args, kwn, kwv, n->nv, n->nw};
		return jj_run_filter(r, n->line, n->op, a, &av, out);
	}
	case E_TEST: {
		jv *args, *kwn, *kwv;
		if (eval(r, n->a, f, &a) || eval_args(r, n, f, &args, &kwn, &kwv))
			return r->rc;
		struct argv_ av = {args, kwn, kwv, n->nv, 0};
		bool res;
		if (jj_run_test(r, n->line, n->op, a, &av, &res))
			return r->rc;
		*out = jv_bool(res != n->neg);
		return 0;
	}
	case E_BIN:
		if (eval(r, n->a, f, &a) || eval(r, n->b, f, &b))
			return r->rc;
		if (n->op == JO_TILDE) {
			jv x, y;
			if (jj_to_str(r, n->line, a, &x) || jj_to_str(r, n->line, b, &y))
				return r->rc;
			return jj_arith(r, n->line, JO_ADD, x, y, out);
		}
		return jj_arith(r, n->line, n->op, a, b, out);
	case E_NEG:
	case E_POS:
		if (eval(r, n->a, f, &a))
			return r->rc;
		if (a.t == JV_UNDEF)
			return jj_undef_fail(r, n->line, a);
		if (!jv_is_num(a))
			return jj_rfail(r, n->line, BATON_EINVAL, "bad operand type for unary %c: '%s'",
			             n->kind == E_NEG ? '-' : '+', jv_type_name(a));
		if (n->kind == E_POS)
			*out = a.t == JV_BOOL ? jv_int(a.b) : a;
		else if (a.t == JV_FLOAT)
			*out = jv_float(-a.f);
		else {
			int64_t k = a.t == JV_BOOL ? a.b : a.i;
			if (k == INT64_MIN)
				return jj_rfail(r, n->line, BATON_ERANGE, "an integer outside 64 bits");
			*out = jv_int(-k);
		}
		return 0;
	case E_NOT:
		if (eval(r, n->a, f, &a))
			return r->rc;
		*out = jv_bool(!jv_truthy(a));
		return 0;
	case E_AND:
	case E_OR:
		if (eval(r, n->a, f, &a))
			return r->rc;
		if (jv_truthy(a) == (n->kind == E_OR)) {
			*out = a;
			return 0;
		}
		return eval(r, n->b, f, out);
	case E_CMP: {
		if (eval(r, n->a, f, &a))
			return r->rc;
		for (size_t i = 0; i < n->nv; i++) {
			bool res;
			if (eval(r, n->v[i], f, &b) || jj_compare(r, n->line, n->ops[i], a, b, &res))
				return r->rc;
			if (!res) {
				*out = jv_bool(false);
				return 0;
			}
			a = b;
		}
		*out = jv_bool(true);
		return 0;
	}
	case E_COND:
		if (eval(r, n->b, f, &a))
			return r->rc;
		if (jv_truthy(a))
			return eval(r, n->a, f, out);
		if (n->x)
			return eval(r, n->x, f, out);
		*out = jv_undef(NULL, 0);
		return 0;
	case E_LIST:
	case E_TUPLE:
		*out = jv_list_new(r->a, n->nv, n->kind == E_LIST ? JK_LIST : JK_TUPLE);
		if (out->t != JV_LIST)
			return jj_oom(r, n->line);
		for (size_t i = 0; i < n->nv; i++)
			if (eval(r, n->v[i], f, &out->l->v[i]))
				return r->rc;
		out->l->n = n->nv;
		return 0;
	case E_DICT:
		*out = jv_dict_new(r->a, JV_DICT);
		if (out->t != JV_DICT)
			return jj_oom(r, n->line);
		for (size_t i = 0; i < n->nv; i++) {
			if (eval(r, n->v[i], f, &a) || eval(r, n->w[i], f, &b))
				return r->rc;
			if (a.t == JV_LIST && a.kind != JK_TUPLE)
				return jj_rfail(r, n->line, BATON_EINVAL, "unhashable type: 'list'");
			if (a.t == JV_DICT || a.t == JV_UNDEF)
				return jj_rfail(r, n->line, BATON_EINVAL, "unhashable type: '%s'", jv_type_name(a));
			if (jv_dict_set(r->a, out, a, b))
				return jj_oom(r, n->line);
		}
		return 0;
	default: return jj_rfail(r, n->line, BATON_EINVAL, "not an expression");
	}
}

static int emit(struct rs *r, int line, const char *p, size_t n)
{
	r->produced += n;
	if (r->produced > MAX_OUT * 4 || r->out->n + n > MAX_OUT)
		return jj_rfail(r, line, BATON_ETOOBIG, "the output ran over %u MiB", MAX_OUT >> 20);
	return tx_tbuf_put(r->out, p, n) ? jj_oom(r, line) : 0;
}

static int exec_for(struct rs *r, const struct jj_node *n, struct frame *f)
{
	jv it, items;
	if (eval(r, n->b, f, &it) || jj_items_of(r, n->line, it, &items))
		return ST_ERR;
	if (n->x) {
		jv kept = jv_list_new(r->a, 0, JK_LIST);
		if (kept.t != JV_LIST)
			return jj_oom(r, n->line), ST_ERR;
		for (size_t i = 0; i < items.l->n; i++) {
			struct frame *lf = frame_new(r, f);
			jv c;
			if (!lf)
				return jj_oom(r, n->line), ST_ERR;
			if (assign(r, n->a, items.l->v[i], lf) || eval(r, n->x, lf, &c))
				return ST_ERR;
			if (jv_truthy(c) && jv_list_push(r->a, &kept, items.l->v[i]))
				return jj_oom(r, n->line), ST_ERR;
		}
		items = kept;
	}
	size_t len = items.l->n;
	for (size_t i = 0; i < len; i++) {
		struct frame *lf = frame_new(r, f);
		jv loop = jv_dict_new(r->a, JV_DICT);
		if (!lf || loop.t != JV_DICT)
			return jj_oom(r, n->line), ST_ERR;
		loop.kind = 1;
		struct {
			const char *k;
			jv v;
		} fields[] = {
		    {"index", jv_int((int64_t)i + 1)},       {"index0", jv_int((int64_t)i)},
		    {"revindex", jv_int((int64_t)(len - i))}, {"revindex0", jv_int((int64_t)(len - i - 1))},
		    {"first", jv_bool(i == 0)},              {"last", jv_bool(i + 1 == len)},
		    {"length", jv_int((int64_t)len)},        {"depth", jv_int(1)},
		    {"depth0", jv_int(0)},                   {"previtem", i ? items.l->v[i - 1] : jv_undef(NULL, 0)},
		    {"nextitem", i + 1 < len ? items.l->v[i + 1] : jv_undef(NULL, 0)},
		};
		for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++)
			if (fields[k].v.t != JV_UNDEF &&
			    jv_dict_set(r->a, &loop, jv_str(fields[k].k, strlen(fields[k].k)), fields[k].v))
				return jj_oom(r, n->line), ST_ERR;
		if (frame_set(r, lf, jv_str("loop", 4), loop))
			return jj_oom(r, n->line), ST_ERR;
		if (assign(r, n->a, items.l->v[i], lf))
			return ST_ERR;
		int st = exec_body(r, n->v, n->nv, lf);
		if (st == ST_ERR)
			return ST_ERR;
		if (st == ST_BREAK)
			break;
	}
	if (len == 0 && n->nw)
		return exec_body(r, n->w, n->nw, f) == ST_ERR ? ST_ERR : ST_OK;
	return ST_OK;
}

/* Renders a body into a fresh string (set blocks, filter blocks). */
static int capture(struct rs *r, int line, struct jj_node *const *v, size_t nv, struct frame *f, jv *out)
{
	struct tbuf *saved = r->out, b = {0};
	r->out = &b;
	int st = exec_body(r, v, nv, f);
	r->out = saved;
	if (st == ST_ERR) {
		tx_tbuf_free(&b);
		return r->rc;
	}
	*out = jj_tbuf_str(r, line, &b);
	return r->rc;
}

static int exec_one(struct rs *r, const struct jj_node *n, struct frame *f)
{
	if (step(r, n->line))
		return ST_ERR;
	jv v, x;
	switch (n->kind) {
	case N_DATA: return emit(r, n->line, n->c.s.p, n->c.s.n) ? ST_ERR : ST_OK;
	case N_OUT: {
		if (eval(r, n->a, f, &v))
			return ST_ERR;
		if (v.t == JV_STR)
			return emit(r, n->line, v.s.p, v.s.n) ? ST_ERR : ST_OK;
		if (jj_to_str(r, n->line, v, &x))
			return ST_ERR;
		return emit(r, n->line, x.s.p, x.s.n) ? ST_ERR : ST_OK;
	}
	case N_IF:
		if (eval(r, n->a, f, &v))
			return ST_ERR;
		if (jv_truthy(v))
			return exec_body(r, n->v, n->nv, f);
		return exec_body(r, n->w, n->nw, f);
	case N_FOR: return exec_for(r, n, f);
	case N_SET:
		if (eval(r, n->b, f, &v) || assign(r, n->a, v, f))
			return ST_ERR;
		return ST_OK;
	case N_SETBLOCK:
		if (capture(r, n->line, n->v, n->nv, f, &v) || assign(r, n->a, v, f))
			return ST_ERR;
		return ST_OK;
	case N_MACRO: {
		struct jj_closure *c = jj_alloc(r->a, sizeof(*c));
		if (!c)
			return jj_oom(r, n->line), ST_ERR;
		c->n = n;
		c->f = f;
		jv m = {.t = JV_MACRO};
		m.mac = c;
		return frame_set(r, f, n->c, m) ? (jj_oom(r, n->line), ST_ERR) : ST_OK;
	}
	case N_BREAK: return ST_BREAK;
	case N_CONTINUE: return ST_CONTINUE;
	case N_FILTERBLOCK: {
		if (capture(r, n->line, n->v, n->nv, f, &v))
			return ST_ERR;
		/* the filters, innermost first, on the body's text */
		const struct jj_node *chain[32];
		size_t k = 0;
		for (const struct jj_node *p = n->a; p && k < 32; p = p->a)
			chain[k++] = p;
		while (k-- > 0) {
			const struct jj_node *fl = chain[k];
			jv *args, *kwn, *kwv;
			if (eval_args(r, fl, f, &args, &kwn, &kwv))
				return ST_ERR;
			struct argv_ av = {args, kwn, kwv, fl->nv, fl->nw};
			if (jj_run_filter(r, fl->line, fl->op, v, &av, &v))
				return ST_ERR;
		}
		if (jj_to_str(r, n->line, v, &x))
			return ST_ERR;
		return emit(r, n->line, x.s.p, x.s.n) ? ST_ERR : ST_OK;
	}
	case N_WITH: {
		struct frame *wf = frame_new(r, f);
		if (!wf)
			return jj_oom(r, n->line), ST_ERR;
		for (size_t i = 0; i < n->nv; i++)
			if (eval(r, n->v[i]->b, f, &v) || assign(r, n->v[i]->a, v, wf))
				return ST_ERR;
		return exec_body(r, n->w, n->nw, wf);
	}
	case N_BODY: return exec_body(r, n->v, n->nv, f);
	case N_CALLBLOCK: {
		const struct jj_node *c = n->a;
		jv fn, *args, *kwn, *kwv;
		struct jj_closure *cl = jj_alloc(r->a, sizeof(*cl));
		if (!cl)
			return jj_oom(r, n->line), ST_ERR;
		cl->n = n->b;
		cl->f = f;
		if (eval(r, c->a, f, &fn) || eval_args(r, c, f, &args, &kwn, &kwv))
			return ST_ERR;
		if (fn.t != JV_MACRO)
			return jj_rfail(r, n->line, BATON_EINVAL, "a call block calls a macro, not a %s",
			             jv_type_name(fn)), ST_ERR;
		r->caller = (jv){.t = JV_MACRO};
		r->caller.mac = cl;
		if (call_value(r, n->line, fn, args, c->nv, kwn, kwv, c->nw, &v))
			return ST_ERR;
		if (jj_to_str(r, n->line, v, &x))
			return ST_ERR;
		return emit(r, n->line, x.s.p, x.s.n) ? ST_ERR : ST_OK;
	}
	default: return jj_rfail(r, n->line, BATON_EINVAL, "not a statement"), ST_ERR;
	}
}

static int exec_body(struct rs *r, struct jj_node *const *v, size_t nv, struct frame *f)
{
	for (size_t i = 0; i < nv; i++) {
		int st = exec_one(r, v[i], f);
		if (st != ST_OK)
			return st;
	}
	return ST_OK;
}

/* ---- the public door ----------------------------------------------------- */

int text_jinja_load(text_jinja **out, const char *src, size_t len, char *err, size_t errlen)
{
	*out = NULL;
	text_jinja *j = calloc(1, sizeof(*j));
	if (!j)
		return text_errf(err, errlen, BATON_ENOMEM, "out of memory");
	j->a.limit = MAX_MEM;
	struct jj_tokens toks = {0};
	int rc = jj_lex(&j->a, src, len, &toks, err, errlen);
	if (!rc)
		rc = jj_parse(&j->a, &toks, &j->root, err, errlen);
	free(toks.t);
	if (rc) {
		if (rc == BATON_ENOMEM)
			text_errf(err, errlen, BATON_ENOMEM, "out of memory");
		text_jinja_free(j);
		return rc;
	}
	*out = j;
	return 0;
}

void text_jinja_free(text_jinja *j)
{
	if (!j)
		return;
	jj_arena_free(&j->a);
	free(j);
}

static int from_json(struct rs *r, json_t *x, jv *out, int depth)
{
	if (depth > 100)
		return jj_rfail(r, 0, BATON_EINVAL, "the context nests too deep");
	switch (json_typeof(x)) {
	case JSON_NULL: *out = jv_none(); return 0;
	case JSON_TRUE: *out = jv_bool(true); return 0;
	case JSON_FALSE: *out = jv_bool(false); return 0;
	case JSON_INTEGER: *out = jv_int(json_integer_value(x)); return 0;
	case JSON_REAL: *out = jv_float(json_real_value(x)); return 0;
	case JSON_STRING: *out = jv_str(json_string_value(x), json_string_length(x)); return 0;
	case JSON_ARRAY: {
		size_t n = json_array_size(x);
		*out = jv_list_new(r->a, n, JK_LIST);
		if (out->t != JV_LIST)
			return jj_oom(r, 0);
		for (size_t i = 0; i < n; i++)
			if (from_json(r, json_array_get(x, i), &out->l->v[i], depth + 1))
				return r->rc;
		out->l->n = n;
		return 0;
	}
	case JSON_OBJECT: {
		*out = jv_dict_new(r->a, JV_DICT);
		if (out->t != JV_DICT)
			return jj_oom(r, 0);
		const char *k;
		size_t kn;
		json_t *v;
		json_object_keylen_foreach(x, k, kn, v) {
			jv y;
			if (from_json(r, v, &y, depth + 1) || jv_dict_set(r->a, out, jv_str(k, kn), y))
				return r->rc ? r->rc : jj_oom(r, 0);
		}
		return 0;
	}
	}
	return jj_rfail(r, 0, BATON_EINVAL, "bad JSON value");
}

int text_jinja_render(const text_jinja *j, const char *ctx, size_t ctx_len, char **out, size_t *out_len,
                      char *err, size_t errlen)
{
	*out = NULL;
	if (out_len)
		*out_len = 0;
	json_error_t je;
	json_t *c = json_loadb(ctx ? ctx : "{}", ctx ? ctx_len : 2, JSON_ALLOW_NUL, &je);
	if (!c || !json_is_object(c)) {
		json_decref(c);
		return text_errf(err, errlen, BATON_EINVAL, "the template context is not a JSON object: %s",
		                 c ? "not an object" : je.text);
	}
	struct jj_arena a = {.limit = MAX_MEM};
	struct tbuf b = {0};
	struct rs r = {.a = &a, .out = &b, .err = err, .errlen = errlen};
	jv root;
	int rc = 0;
	if (from_json(&r, c, &root, 0) || !(r.root = frame_new(&r, NULL)))
		rc = r.rc ? r.rc : jj_oom(&r, 0);
	for (size_t i = 0; !rc && i < root.d->n; i++)
		if (frame_set(&r, r.root, root.d->k[i], root.d->v[i]))
			rc = jj_oom(&r, 0);
	if (!rc && exec_body(&r, j->root->v, j->root->nv, r.root) == ST_ERR)
		rc = r.rc ? r.rc : BATON_EINVAL;
	jj_arena_free(&a);
	json_decref(c);
	if (rc) {
		tx_tbuf_free(&b);
		return rc;
	}
	if (!b.p && tx_tbuf_put(&b, "", 0))
		return text_errf(err, errlen, BATON_ENOMEM, "out of memory");
	*out = b.p;
	if (out_len)
		*out_len = b.n;
	return 0;
}
