/*
 * jinja_eval.c: renders a parsed template as jinja2's
 * ImmutableSandboxedEnvironment does for transformers: default Undefined
 * (prints as "", fails on use), Python's operators, the filters, tests and
 * methods chat templates call, macros, namespaces, loops with loop.* and
 * loopcontrols, raise_exception and strftime_now, and tojson as
 * transformers defines it. Work is bounded: steps, output and string size,
 * memory and macro depth each stop the render with an error.
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

#define MAX_OUT    (16u << 20) /* bytes of output, and of any one string */
#define MAX_MEM    (512u << 20)
#define MAX_STEPS  20000000ull
#define MAX_DEPTH  64
#define MAX_RANGE  1000000

struct text_jinja {
	struct jj_arena a;
	struct jj_node *root;
};

struct frame {
	struct frame *up;
	size_t n, cap;
	jv *k, *v;
};

struct jj_closure {
	const struct jj_node *n;
	struct frame *f;
};

struct rs {
	struct jj_arena *a;
	struct tbuf *out;
	size_t produced;
	uint64_t steps;
	int depth;
	struct frame *root;
	jv caller; /* a call block's body, for the next macro call; JV_UNDEF none */
	char *err;
	size_t errlen;
	int rc;
};

enum { ST_OK, ST_BREAK, ST_CONTINUE, ST_ERR };

static int rfail(struct rs *r, int line, int code, const char *fmt, ...)
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

static int oom(struct rs *r, int line)
{
	return rfail(r, line, BATON_ENOMEM, "out of memory (the render's limit is %u MiB)", MAX_MEM >> 20);
}

static int undef_fail(struct rs *r, int line, jv u)
{
	if (u.s.p)
		return rfail(r, line, BATON_EINVAL, "'%.*s' is undefined", (int)u.s.n, u.s.p);
	return rfail(r, line, BATON_EINVAL, "a value is undefined");
}

/* ---- strings ------------------------------------------------------------- */

static jv mkstr(struct rs *r, int line, const char *p, size_t n)
{
	if (n > MAX_OUT) {
		rfail(r, line, BATON_ETOOBIG, "a string over %u MiB", MAX_OUT >> 20);
		return jv_undef(NULL, 0);
	}
	char *s = jj_alloc(r->a, n + 1);
	if (!s) {
		oom(r, line);
		return jv_undef(NULL, 0);
	}
	if (n)
		memcpy(s, p, n);
	return jv_str(s, n);
}

static jv tbuf_str(struct rs *r, int line, struct tbuf *b)
{
	jv v = mkstr(r, line, b->p ? b->p : "", b->n);
	tx_tbuf_free(b);
	return v;
}

/* str(v) as a string value. */
static int to_str(struct rs *r, int line, jv v, jv *out)
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
		return rfail(r, line, rc, "%s", e);
	}
	*out = tbuf_str(r, line, &b);
	return r->rc;
}

static uint32_t cp_at(const char *s, size_t n, size_t *adv)
{
	size_t l = tx_utf8_len((const unsigned char *)s, n);
	if (!l) {
		*adv = 1;
		return (unsigned char)s[0];
	}
	return tx_utf8_decode((const unsigned char *)s, adv);
}

/* Case mapping of each code point (Python's simple case maps). */
static jv case_map(struct rs *r, int line, jv s, int mode /* 0 lower 1 upper 2 capitalize 3 title */)
{
	struct tbuf b = {0};
	bool start = true;
	int rc = 0;
	for (size_t i = 0; i < s.s.n && !rc;) {
		size_t adv;
		uint32_t c = cp_at(s.s.p + i, s.s.n - i, &adv);
		int32_t m;
		if (mode == 0)
			m = utf8proc_tolower((int32_t)c);
		else if (mode == 1)
			m = utf8proc_toupper((int32_t)c);
		else if (mode == 2)
			m = i == 0 ? utf8proc_toupper((int32_t)c) : utf8proc_tolower((int32_t)c);
		else {
			m = start ? utf8proc_toupper((int32_t)c) : utf8proc_tolower((int32_t)c);
			/* jinja2's title: words begin after -, whitespace, ( { [ < */
			start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jj_is_space(c);
		}
		/* Python's full case mappings where the simple ones differ:
		 * upper (and jinja2's title, which upper-cases word starts), and
		 * capitalize's title case of the first character */
		bool up = mode == 1 || (mode == 3 && m == utf8proc_toupper((int32_t)c) && c != (uint32_t)m);
		bool ti = mode == 2 && i == 0;
		const char *special = NULL;
		if (up || ti)
			special = c == 0xDF ? (up ? "SS" : "Ss") : c == 0xFB00 ? (up ? "FF" : "Ff")
			          : c == 0xFB01 ? (up ? "FI" : "Fi") : c == 0xFB02 ? (up ? "FL" : "Fl")
			          : c == 0xFB03 ? (up ? "FFI" : "Ffi") : c == 0xFB04 ? (up ? "FFL" : "Ffl")
			          : (c == 0xFB05 || c == 0xFB06) ? (up ? "ST" : "St") : NULL;
		if (mode == 3 && c == 0xDF && m == (int32_t)c)
			special = NULL;
		if (c == 0x130 && m == utf8proc_tolower((int32_t)c))
			special = "i\xcc\x87";
		char o[4];
		if (special)
			rc = tx_tbuf_put(&b, special, strlen(special));
		else
			rc = tx_tbuf_put(&b, o, tx_utf8_encode((uint32_t)m, o));
		i += adv;
	}
	if (rc) {
		tx_tbuf_free(&b);
		oom(r, line);
		return jv_undef(NULL, 0);
	}
	return tbuf_str(r, line, &b);
}

static bool in_chars(uint32_t c, const jv *chars)
{
	if (!chars)
		return jj_is_space(c);
	for (size_t i = 0; i < chars->s.n;) {
		size_t adv;
		if (cp_at(chars->s.p + i, chars->s.n - i, &adv) == c)
			return true;
		i += adv;
	}
	return false;
}

static jv strip(jv s, const jv *chars, bool left, bool right)
{
	size_t a = 0, b = s.s.n;
	while (left && a < b) {
		size_t adv;
		uint32_t c = cp_at(s.s.p + a, b - a, &adv);
		if (!in_chars(c, chars))
			break;
		a += adv;
	}
	while (right && b > a) {
		size_t k = b - 1;
		while (k > a && ((unsigned char)s.s.p[k] & 0xC0) == 0x80)
			k--;
		size_t adv;
		uint32_t c = cp_at(s.s.p + k, b - k, &adv);
		if (!in_chars(c, chars))
			break;
		b = k;
	}
	return jv_str(s.s.p + a, b - a);
}

static const char *find(const char *h, size_t hn, const char *nd, size_t nn)
{
	if (nn == 0)
		return h;
	for (size_t i = 0; i + nn <= hn; i++)
		if (h[i] == nd[0] && !memcmp(h + i, nd, nn))
			return h + i;
	return NULL;
}

static const char *rfind(const char *h, size_t hn, const char *nd, size_t nn)
{
	if (nn > hn)
		return NULL;
	for (size_t i = hn - nn + 1; i-- > 0;)
		if (!memcmp(h + i, nd, nn))
			return h + i;
	return NULL;
}

static jv replace(struct rs *r, int line, jv s, jv old, jv new, int64_t count)
{
	struct tbuf b = {0};
	int rc = 0;
	if (old.s.n == 0) {
		/* Python: new between every code point and at both ends */
		int64_t k = 0;
		for (size_t i = 0; i <= s.s.n && !rc;) {
			if (count < 0 || k < count) {
				rc = tx_tbuf_put(&b, new.s.p, new.s.n);
				k++;
			}
			if (i == s.s.n)
				break;
			size_t adv;
			cp_at(s.s.p + i, s.s.n - i, &adv);
			rc |= tx_tbuf_put(&b, s.s.p + i, adv);
			i += adv;
			if (b.n > MAX_OUT)
				break;
		}
	} else {
		size_t i = 0;
		int64_t k = 0;
		while (!rc && (count < 0 || k < count)) {
			const char *h = find(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
			if (!h)
				break;
			size_t at = (size_t)(h - s.s.p);
			rc = tx_tbuf_put(&b, s.s.p + i, at - i) | tx_tbuf_put(&b, new.s.p, new.s.n);
			i = at + old.s.n;
			k++;
			if (b.n > MAX_OUT)
				break;
		}
		rc |= tx_tbuf_put(&b, s.s.p + i, s.s.n - i);
	}
	if (rc) {
		tx_tbuf_free(&b);
		oom(r, line);
		return jv_undef(NULL, 0);
	}
	return tbuf_str(r, line, &b);
}

static int split(struct rs *r, int line, jv s, const jv *sep, int64_t maxsplit, bool from_right,
                 jv *out)
{
	*out = jv_list_new(r->a, 0, JK_LIST);
	if (out->t != JV_LIST)
		return oom(r, line);
	jv parts[1];
	(void)parts;
	if (sep && sep->s.n == 0)
		return rfail(r, line, BATON_EINVAL, "empty separator");
	if (!sep) {
		/* runs of whitespace; leading and trailing ignored */
		size_t i = 0, n = s.s.n;
		int64_t k = 0;
		if (from_right)
			return rfail(r, line, BATON_EUNSUPPORTED, "rsplit() without a separator is not supported");
		for (;;) {
			while (i < n) {
				size_t adv;
				if (!jj_is_space(cp_at(s.s.p + i, n - i, &adv)))
					break;
				i += adv;
			}
			if (i >= n)
				break;
			size_t j = i;
			if (maxsplit >= 0 && k >= maxsplit) {
				/* the rest as it is (Python keeps its trailing whitespace) */
				if (jv_list_push(r->a, out, jv_str(s.s.p + i, n - i)))
					return oom(r, line);
				break;
			}
			while (j < n) {
				size_t adv;
				if (jj_is_space(cp_at(s.s.p + j, n - j, &adv)))
					break;
				j += adv;
			}
			if (jv_list_push(r->a, out, jv_str(s.s.p + i, j - i)))
				return oom(r, line);
			k++;
			i = j;
		}
		return 0;
	}
	if (!from_right) {
		size_t i = 0;
		int64_t k = 0;
		for (;;) {
			const char *h = maxsplit >= 0 && k >= maxsplit
			                    ? NULL
			                    : find(s.s.p + i, s.s.n - i, sep->s.p, sep->s.n);
			if (!h) {
				if (jv_list_push(r->a, out, jv_str(s.s.p + i, s.s.n - i)))
					return oom(r, line);
				return 0;
			}
			size_t at = (size_t)(h - s.s.p);
			if (jv_list_push(r->a, out, jv_str(s.s.p + i, at - i)))
				return oom(r, line);
			i = at + sep->s.n;
			k++;
		}
	}
	/* rsplit: collect from the right, then reverse */
	size_t end = s.s.n;
	int64_t k = 0;
	for (;;) {
		const char *h = maxsplit >= 0 && k >= maxsplit ? NULL : rfind(s.s.p, end, sep->s.p, sep->s.n);
		if (!h) {
			if (jv_list_push(r->a, out, jv_str(s.s.p, end)))
				return oom(r, line);
			break;
		}
		size_t at = (size_t)(h - s.s.p);
		if (jv_list_push(r->a, out, jv_str(h + sep->s.n, end - at - sep->s.n)))
			return oom(r, line);
		end = at;
		k++;
	}
	for (size_t i = 0, j = out->l->n - 1; i < j; i++, j--) {
		jv t = out->l->v[i];
		out->l->v[i] = out->l->v[j];
		out->l->v[j] = t;
	}
	return 0;
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

/* ---- names of filters, tests, methods, globals ------------------------- */

enum {
	F_ABS, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE, F_FIRST, F_FLOAT,
	F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN,
	F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR,
	F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT,
};
static const char *const filters[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
    "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL,
};

enum {
	T_DEFINED, T_UNDEFINED, T_NONE, T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_NUMBER,
	T_INTEGER, T_FLOAT, T_BOOLEAN, T_TRUE, T_FALSE, T_EVEN, T_ODD, T_DIVISIBLEBY, T_EQ,
	T_EQUALTO, T_NE, T_LT, T_LE, T_GT, T_GE, T_GREATERTHAN, T_LESSTHAN, T_IN, T_LOWER, T_UPPER,
	T_CALLABLE, T_SAMEAS,
};
static const char *const tests[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
    "integer", "float", "boolean", "true", "false", "even", "odd", "divisibleby", "eq",
    "equalto", "ne", "lt", "le", "gt", "ge", "greaterthan", "lessthan", "in", "lower", "upper",
    "callable", "sameas", NULL,
};

enum {
	M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_LOWER, M_UPPER,
	M_REPLACE, M_TITLE, M_CAPITALIZE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_SPLITLINES,
	M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISUPPER, M_ISLOWER, M_REMOVEPREFIX,
	M_REMOVESUFFIX, M_INDEX, M_ITEMS, M_KEYS, M_VALUES, M_GET, M_CYCLE,
	M_APPEND, M_POP, M_INSERT, M_EXTEND, M_REMOVE, M_CLEAR, M_SORT, M_REVERSE, M_UPDATE,
	M_SETDEFAULT,
};
static const char *const methods[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "lower", "upper",
    "replace", "title", "capitalize", "find", "rfind", "count", "join", "splitlines", "isdigit",
    "isalpha", "isalnum", "isspace", "isupper", "islower", "removeprefix", "removesuffix",
    "index", "items", "keys", "values", "get", "cycle", "append", "pop", "insert", "extend",
    "remove", "clear", "sort", "reverse", "update", "setdefault", NULL,
};

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };
static const char *const globals[] = {"range", "namespace", "dict", "raise_exception",
                                      "strftime_now", NULL};
static const char *const globals_missing[] = {"joiner", "cycler", "lipsum", NULL};

static int lookup(const char *const *t, const char *s, size_t n)
{
	for (int i = 0; t[i]; i++)
		if (strlen(t[i]) == n && !memcmp(t[i], s, n))
			return i;
	return -1;
}

int jj_filter_id(const char *s, size_t n) { return lookup(filters, s, n); }
int jj_test_id(const char *s, size_t n) { return lookup(tests, s, n); }
int jj_method_id(const char *s, size_t n) { return lookup(methods, s, n); }

int jj_global_id(const char *s, size_t n)
{
	int g = lookup(globals, s, n);
	if (g < 0 && lookup(globals_missing, s, n) >= 0)
		return -2;
	return g;
}

static bool is_str_method(int m) { return m <= M_INDEX; }
static bool is_list_method(int m)
{
	return m == M_INDEX || m == M_COUNT || (m >= M_APPEND && m <= M_REVERSE);
}
static bool is_dict_method(int m)
{
	return m == M_ITEMS || m == M_KEYS || m == M_VALUES || m == M_GET || m == M_POP ||
	       m == M_CLEAR || m == M_UPDATE || m == M_SETDEFAULT;
}

/* ---- attribute and item access ---------------------------------------- */

static jv method(struct rs *r, jv self, int m)
{
	jv *s = jj_alloc(r->a, sizeof(*s));
	if (!s)
		return jv_undef(NULL, 0);
	*s = self;
	jv v = {.t = JV_METHOD, .aux = (uint16_t)m};
	v.self = s;
	return v;
}

/* jinja2's getattr: the attribute (a method), else the item. */
static int getattr_(struct rs *r, int line, jv obj, const char *name, size_t n, jv *out)
{
	int m = jj_method_id(name, n);
	*out = jv_undef(name, n);
	switch (obj.t) {
	case JV_UNDEF: return undef_fail(r, line, obj);
	case JV_DICT:
		if (obj.kind) { /* the loop object */
			if (m == M_CYCLE) {
				*out = method(r, obj, m);
				return 0;
			}
		} else if (m >= 0 && is_dict_method(m)) {
			*out = method(r, obj, m);
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
		if (m >= 0 && is_str_method(m))
			*out = method(r, obj, m);
		return 0;
	case JV_LIST:
		if (m >= 0 && is_list_method(m) && (obj.kind == JK_LIST || (obj.kind == JK_TUPLE && m <= M_INDEX)))
			*out = method(r, obj, m);
		return 0;
	default: return 0;
	}
}

static bool as_index(jv k, int64_t *i)
{
	if (k.t == JV_INT || k.t == JV_BOOL) {
		*i = k.t == JV_BOOL ? k.b : k.i;
		return true;
	}
	return false;
}

/* jinja2's getitem: the item, else (a string key) the attribute. */
static int getitem(struct rs *r, int line, jv obj, jv key, jv *out)
{
	*out = jv_undef(NULL, 0);
	int64_t i;
	switch (obj.t) {
	case JV_UNDEF: return undef_fail(r, line, obj);
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
		if (obj.kind != JK_GEN && as_index(key, &i)) {
			int64_t n = (int64_t)obj.l->n;
			if (i < 0)
				i += n;
			if (i >= 0 && i < n)
				*out = obj.l->v[i];
			return 0;
		}
		break;
	case JV_STR:
		if (as_index(key, &i)) {
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
static int items_of(struct rs *r, int line, jv v, jv *out)
{
	switch (v.t) {
	case JV_UNDEF: *out = jv_list_new(r->a, 0, JK_LIST); return out->t == JV_LIST ? 0 : oom(r, line);
	case JV_LIST:
		if (v.kind == JK_GEN) {
			/* a generator runs once: what is left of it, then nothing */
			*out = jv_list_new(r->a, 0, JK_LIST);
			if (out->t != JV_LIST)
				return oom(r, line);
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
			return oom(r, line);
		if (v.d->n)
			memcpy(out->l->v, v.d->k, v.d->n * sizeof(jv));
		out->l->n = v.d->n;
		return 0;
	}
	case JV_STR: {
		*out = jv_list_new(r->a, v.s.n, JK_LIST);
		if (out->t != JV_LIST)
			return oom(r, line);
		for (size_t i = 0; i < v.s.n;) {
			size_t adv;
			cp_at(v.s.p + i, v.s.n - i, &adv);
			out->l->v[out->l->n++] = jv_str(v.s.p + i, adv);
			i += adv;
		}
		return 0;
	}
	default: break;
	}
	return rfail(r, line, BATON_EINVAL, "'%s' object is not iterable", jv_type_name(v));
}

static int len_of(struct rs *r, int line, jv v, int64_t *n)
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
	return rfail(r, line, BATON_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
}

static int contains(struct rs *r, int line, jv needle, jv hay, bool *out)
{
	*out = false;
	switch (hay.t) {
	case JV_UNDEF: return 0;
	case JV_STR:
		if (needle.t != JV_STR)
			return rfail(r, line, BATON_EINVAL, "'in <string>' requires string as left operand, not %s",
			             jv_type_name(needle));
		*out = find(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
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
	return rfail(r, line, BATON_EINVAL, "argument of type '%s' is not iterable", jv_type_name(hay));
}

/* ---- evaluation ------------------------------------------------------------ */

static int eval(struct rs *r, const struct jj_node *n, struct frame *f, jv *out);
static int exec_body(struct rs *r, struct jj_node *const *v, size_t nv, struct frame *f);
static int call_value(struct rs *r, int line, jv fn, jv *args, size_t nargs, jv *kwn, jv *kwv,
                      size_t nkw, jv *out);

static int step(struct rs *r, int line)
{
	if (++r->steps > MAX_STEPS)
		return rfail(r, line, BATON_ETOOBIG, "the template ran over %llu steps",
		             (unsigned long long)MAX_STEPS);
	return 0;
}

static int arith(struct rs *r, int line, int op, jv a, jv b, jv *out)
{
	if (a.t == JV_UNDEF)
		return undef_fail(r, line, a);
	if (b.t == JV_UNDEF)
		return undef_fail(r, line, b);
	if (op == JO_ADD && a.t == JV_STR && b.t == JV_STR) {
		if (a.s.n + b.s.n > MAX_OUT)
			return rfail(r, line, BATON_ETOOBIG, "a string over %u MiB", MAX_OUT >> 20);
		char *s = jj_alloc(r->a, a.s.n + b.s.n + 1);
		if (!s)
			return oom(r, line);
		memcpy(s, a.s.p, a.s.n);
		memcpy(s + a.s.n, b.s.p, b.s.n);
		*out = jv_str(s, a.s.n + b.s.n);
		return 0;
	}
	if (op == JO_ADD && a.t == JV_LIST && b.t == JV_LIST && a.kind == b.kind &&
	    (a.kind == JK_LIST || a.kind == JK_TUPLE)) {
		*out = jv_list_new(r->a, a.l->n + b.l->n, a.kind);
		if (out->t != JV_LIST)
			return oom(r, line);
		memcpy(out->l->v, a.l->v, a.l->n * sizeof(jv));
		memcpy(out->l->v + a.l->n, b.l->v, b.l->n * sizeof(jv));
		out->l->n = a.l->n + b.l->n;
		return 0;
	}
	if (op == JO_MUL && ((a.t == JV_STR || a.t == JV_LIST) != (b.t == JV_STR || b.t == JV_LIST))) {
		jv seq = a.t == JV_STR || a.t == JV_LIST ? a : b, k = seq.t == a.t ? b : a;
		int64_t times;
		if (!as_index(k, &times) || (seq.t == JV_LIST && seq.kind != JK_LIST && seq.kind != JK_TUPLE))
			goto bad;
		if (times < 0)
			times = 0;
		size_t each = seq.t == JV_STR ? seq.s.n : seq.l->n * sizeof(jv);
		if (each && (uint64_t)times > MAX_OUT / each)
			return rfail(r, line, BATON_ETOOBIG, "a repetition over %u MiB", MAX_OUT >> 20);
		if (seq.t == JV_STR) {
			char *s = jj_alloc(r->a, seq.s.n * (size_t)times + 1);
			if (!s)
				return oom(r, line);
			for (int64_t i = 0; i < times; i++)
				memcpy(s + seq.s.n * (size_t)i, seq.s.p, seq.s.n);
			*out = jv_str(s, seq.s.n * (size_t)times);
		} else {
			*out = jv_list_new(r->a, seq.l->n * (size_t)times, seq.kind);
			if (out->t != JV_LIST)
				return oom(r, line);
			for (int64_t i = 0; i < times; i++)
				memcpy(out->l->v + seq.l->n * (size_t)i, seq.l->v, seq.l->n * sizeof(jv));
			out->l->n = seq.l->n * (size_t)times;
		}
		return 0;
	}
	if (op == JO_MOD && a.t == JV_STR)
		return rfail(r, line, BATON_EUNSUPPORTED, "string formatting with %% is not supported");
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
				return rfail(r, line, BATON_EINVAL, "integer division or modulo by zero");
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
			return rfail(r, line, BATON_ERANGE, "an integer outside 64 bits");
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
			return rfail(r, line, BATON_EINVAL, "float division by zero");
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
	return rfail(r, line, BATON_EINVAL, "unsupported operand type(s): '%s' and '%s'", jv_type_name(a),
	             jv_type_name(b));
}

static int compare(struct rs *r, int line, int op, jv a, jv b, bool *res)
{
	int rc;
	switch (op) {
	case JO_EQ: *res = jv_equal(a, b); return 0;
	case JO_NE: *res = !jv_equal(a, b); return 0;
	case JO_IN: return contains(r, line, a, b, res);
	case JO_NOTIN:
		rc = contains(r, line, a, b, res);
		*res = !*res;
		return rc;
	default: break;
	}
	if (a.t == JV_UNDEF)
		return undef_fail(r, line, a);
	if (b.t == JV_UNDEF)
		return undef_fail(r, line, b);
	int c = jv_cmp(a, b, &rc);
	if (rc)
		return rfail(r, line, BATON_EINVAL, "comparison not supported between instances of '%s' and '%s'",
		             jv_type_name(a), jv_type_name(b));
	*res = op == JO_LT ? c < 0 : op == JO_LE ? c <= 0 : op == JO_GT ? c > 0 : c >= 0;
	return 0;
}

/* Python's slice of a sequence of `len` items: the indices taken. */
static int slice_idx(struct rs *r, int line, jv *parts, int64_t len, int64_t *start, int64_t *stop,
                     int64_t *stepv)
{
	int64_t st = 1;
	if (parts[2].t != JV_NONE && parts[2].t != JV_UNDEF && !as_index(parts[2], &st))
		return rfail(r, line, BATON_EINVAL, "slice indices must be integers or None");
	if (st == 0)
		return rfail(r, line, BATON_EINVAL, "slice step cannot be zero");
	int64_t lo, hi;
	for (int k = 0; k < 2; k++) {
		int64_t v;
		bool given = parts[k].t != JV_NONE && parts[k].t != JV_UNDEF;
		if (given && !as_index(parts[k], &v))
			return rfail(r, line, BATON_EINVAL, "slice indices must be integers or None");
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
		return undef_fail(r, line, obj);
	int64_t a, b, s;
	if (obj.t == JV_LIST && obj.kind != JK_GEN) {
		if (slice_idx(r, line, parts, (int64_t)obj.l->n, &a, &b, &s))
			return r->rc;
		*out = jv_list_new(r->a, 0, obj.kind == JK_TUPLE ? JK_TUPLE : JK_LIST);
		if (out->t != JV_LIST)
			return oom(r, line);
		for (int64_t i = a; s > 0 ? i < b : i > b; i += s)
			if (jv_list_push(r->a, out, obj.l->v[i]))
				return oom(r, line);
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
			return oom(r, line);
		}
		*out = tbuf_str(r, line, &t);
		return r->rc;
	}
	*out = jv_undef(NULL, 0);
	return 0;
}

/* Binds a for loop's or a with's target (a name or a tuple of names). */
static int assign(struct rs *r, const struct jj_node *t, jv val, struct frame *f)
{
	if (t->kind == E_NAME)
		return frame_set(r, f, t->c, val) ? oom(r, t->line) : 0;
	if (t->kind == E_TUPLE) {
		if (val.t != JV_LIST || val.kind == JK_GEN)
			return rfail(r, t->line, BATON_EINVAL, "cannot unpack a '%s'", jv_type_name(val));
		if (val.l->n != t->nv)
			return rfail(r, t->line, BATON_EINVAL, "cannot unpack %zu values into %zu names", val.l->n,
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
			return rfail(r, t->line, BATON_EINVAL, "cannot assign attribute on non-namespace object");
		return jv_dict_set(r->a, &ns, t->c, val) ? oom(r, t->line) : 0;
	}
	return rfail(r, t->line, BATON_EINVAL, "cannot assign to this expression");
}

static int eval_args(struct rs *r, const struct jj_node *n, struct frame *f, jv **args, jv **kwn,
                     jv **kwv)
{
	*args = jj_alloc(r->a, (n->nv + 1) * sizeof(jv));
	*kwn = jj_alloc(r->a, (n->nw + 1) * sizeof(jv));
	*kwv = jj_alloc(r->a, (n->nw + 1) * sizeof(jv));
	if (!*args || !*kwn || !*kwv)
		return oom(r, n->line);
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

/* Arguments by position or name (Python's binding for filters and methods). */
struct argv_ {
	jv *args, *kwn, *kwv;
	size_t nargs, nkw;
};

static bool arg(const struct argv_ *a, size_t pos, const char *name, jv *out)
{
	if (pos < a->nargs) {
		*out = a->args[pos];
		return true;
	}
	for (size_t i = 0; i < a->nkw; i++)
		if (name && a->kwn[i].s.n == strlen(name) && !memcmp(a->kwn[i].s.p, name, a->kwn[i].s.n)) {
			*out = a->kwv[i];
			return true;
		}
	return false;
}

static int run_test(struct rs *r, int line, int id, jv v, const struct argv_ *a, bool *res);
static int run_filter(struct rs *r, int line, int id, jv v, const struct argv_ *a, jv *out);

static int need_str(struct rs *r, int line, jv v, const char *what)
{
	if (v.t == JV_STR)
		return 0;
	if (v.t == JV_UNDEF)
		return undef_fail(r, line, v);
	return rfail(r, line, BATON_EINVAL, "%s must be str, not %s", what, jv_type_name(v));
}

static int macro_call(struct rs *r, int line, struct jj_closure *c, jv *args, size_t nargs, jv *kwn,
                      jv *kwv, size_t nkw, jv *out)
{
	const struct jj_node *m = c->n;
	jv caller = r->caller; /* a call block's body is for this call only */
	r->caller = jv_undef(NULL, 0);
	if (r->depth >= MAX_DEPTH)
		return rfail(r, line, BATON_ETOOBIG, "macros nested deeper than %d", MAX_DEPTH);
	struct frame *f = frame_new(r, c->f);
	if (!f)
		return oom(r, line);
	jv varargs = jv_list_new(r->a, 0, JK_TUPLE), kwargs = jv_dict_new(r->a, JV_DICT);
	if (varargs.t != JV_LIST || kwargs.t != JV_DICT)
		return oom(r, line);
	bool *set = jj_alloc(r->a, m->nv + 1);
	if (!set)
		return oom(r, line);
	for (size_t i = 0; i < nargs; i++) {
		if (i < m->nv) {
			if (frame_set(r, f, m->v[i]->c, args[i]))
				return oom(r, line);
			set[i] = true;
		} else if (jv_list_push(r->a, &varargs, args[i]))
			return oom(r, line);
	}
	for (size_t k = 0; k < nkw; k++) {
		size_t i;
		for (i = 0; i < m->nv; i++)
			if (m->v[i]->c.s.n == kwn[k].s.n && !memcmp(m->v[i]->c.s.p, kwn[k].s.p, kwn[k].s.n))
				break;
		if (i < m->nv) {
			if (set[i])
				return rfail(r, line, BATON_EINVAL, "macro '%.*s' got multiple values for argument '%.*s'",
				             (int)m->c.s.n, m->c.s.p, (int)kwn[k].s.n, kwn[k].s.p);
			if (frame_set(r, f, m->v[i]->c, kwv[k]))
				return oom(r, line);
			set[i] = true;
		} else if (jv_dict_set(r->a, &kwargs, kwn[k], kwv[k]))
			return oom(r, line);
	}
	for (size_t i = 0; i < m->nv; i++) {
		if (set[i])
			continue;
		jv d = jv_undef(m->v[i]->c.s.p, m->v[i]->c.s.n);
		if (m->v[i]->b && eval(r, m->v[i]->b, f, &d))
			return r->rc;
		if (frame_set(r, f, m->v[i]->c, d))
			return oom(r, line);
	}
	if (frame_set(r, f, jv_str("varargs", 7), varargs) || frame_set(r, f, jv_str("kwargs", 6), kwargs))
		return oom(r, line);
	if (caller.t == JV_MACRO && frame_set(r, f, jv_str("caller", 6), caller))
		return oom(r, line);
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
	*out = tbuf_str(r, line, &b);
	return r->rc;
}

static int call_global(struct rs *r, int line, int g, const struct argv_ *a, jv *out)
{
	jv x;
	switch (g) {
	case G_RANGE: {
		int64_t v[3] = {0, 0, 1};
		if (a->nargs < 1 || a->nargs > 3 || a->nkw)
			return rfail(r, line, BATON_EINVAL, "range() takes 1 to 3 integer arguments");
		for (size_t i = 0; i < a->nargs; i++)
			if (!as_index(a->args[i], &v[a->nargs == 1 ? 1 : i]))
				return rfail(r, line, BATON_EINVAL, "range() arguments must be integers");
		if (v[2] == 0)
			return rfail(r, line, BATON_EINVAL, "range() arg 3 must not be zero");
		int64_t cnt = v[2] > 0 ? (v[1] > v[0] ? (v[1] - v[0] + v[2] - 1) / v[2] : 0)
		                       : (v[0] > v[1] ? (v[0] - v[1] - v[2] - 1) / -v[2] : 0);
		if (cnt > MAX_RANGE)
			return rfail(r, line, BATON_ETOOBIG, "range() of more than %d items", MAX_RANGE);
		*out = jv_list_new(r->a, (size_t)cnt, JK_VIEW);
		if (out->t != JV_LIST)
			return oom(r, line);
		for (int64_t i = 0; i < cnt; i++)
			out->l->v[i] = jv_int(v[0] + i * v[2]);
		out->l->n = (size_t)cnt;
		return 0;
	}
	case G_NAMESPACE:
	case G_DICT: {
		*out = jv_dict_new(r->a, g == G_NAMESPACE ? JV_NS : JV_DICT);
		if (out->t == JV_UNDEF)
			return oom(r, line);
		if (a->nargs > 1 || (a->nargs == 1 && a->args[0].t != JV_DICT))
			return rfail(r, line, BATON_EINVAL, "%s() takes a mapping or keyword arguments",
			             globals[g]);
		if (a->nargs)
			for (size_t i = 0; i < a->args[0].d->n; i++)
				if (jv_dict_set(r->a, out, a->args[0].d->k[i], a->args[0].d->v[i]))
					return oom(r, line);
		for (size_t i = 0; i < a->nkw; i++)
			if (jv_dict_set(r->a, out, a->kwn[i], a->kwv[i]))
				return oom(r, line);
		return 0;
	}
	case G_RAISE: {
		jv msg = jv_str("", 0);
		if (arg(a, 0, "message", &x) && to_str(r, line, x, &msg))
			return r->rc;
		/* the template's own words; an empty one (or one that starts with
		 * a NUL) would leave no reason at all */
		if (!r->rc && (!msg.s.n || !msg.s.p[0]))
			r->rc = text_errf(r->err, r->errlen, BATON_EINVAL, "template line %d: raise_exception() "
			                  "with an empty message", line);
		if (!r->rc)
			r->rc = text_errf(r->err, r->errlen, BATON_EINVAL, "%.*s", (int)msg.s.n, msg.s.p);
		return r->rc;
	}
	case G_STRFTIME: {
		if (!arg(a, 0, "format", &x) || need_str(r, line, x, "strftime_now's format"))
			return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "strftime_now() takes a format");
		char fmt[256], buf[512];
		if (x.s.n >= sizeof(fmt))
			return rfail(r, line, BATON_EINVAL, "strftime_now(): the format is too long");
		memcpy(fmt, x.s.p, x.s.n);
		fmt[x.s.n] = 0;
		time_t now = time(NULL);
		struct tm tm;
		localtime_r(&now, &tm);
		size_t n = strftime(buf, sizeof(buf), fmt, &tm);
		*out = mkstr(r, line, buf, n);
		return r->rc;
	}
	}
	return rfail(r, line, BATON_EINVAL, "unknown function");
}

static int call_method(struct rs *r, int line, jv self, int m, const struct argv_ *a, jv *out)
{
	jv x, y;
	int64_t k;
	if (m >= M_APPEND && m <= M_SETDEFAULT && !(m == M_POP && self.t != JV_LIST && self.t != JV_DICT))
		return rfail(r, line, BATON_EINVAL, "access to attribute '%s' of '%s' object is unsafe.",
		             methods[m], jv_type_name(self));
	if (self.t == JV_STR) {
		jv s = self;
		switch (m) {
		case M_STRIP:
		case M_LSTRIP:
		case M_RSTRIP: {
			bool have = arg(a, 0, "chars", &x) && x.t != JV_NONE;
			if (have && need_str(r, line, x, "strip's argument"))
				return r->rc;
			*out = strip(s, have ? &x : NULL, m != M_RSTRIP, m != M_LSTRIP);
			return 0;
		}
		case M_SPLIT:
		case M_RSPLIT: {
			bool have = arg(a, 0, "sep", &x) && x.t != JV_NONE;
			if (have && need_str(r, line, x, "split's separator"))
				return r->rc;
			k = -1;
			if (arg(a, 1, "maxsplit", &y) && !as_index(y, &k))
				return rfail(r, line, BATON_EINVAL, "maxsplit must be an integer");
			return split(r, line, s, have ? &x : NULL, k, m == M_RSPLIT, out);
		}
		case M_STARTSWITH:
		case M_ENDSWITH: {
			if (!arg(a, 0, "prefix", &x))
				return rfail(r, line, BATON_EINVAL, "%s() takes an argument", methods[m]);
			jv one[1] = {x};
			jv *cands = one;
			size_t nc = 1;
			if (x.t == JV_LIST && x.kind == JK_TUPLE) {
				cands = x.l->v;
				nc = x.l->n;
			}
			*out = jv_bool(false);
			for (size_t i = 0; i < nc; i++) {
				if (need_str(r, line, cands[i], "the prefix"))
					return r->rc;
				jv c = cands[i];
				if (c.s.n <= s.s.n && !memcmp(m == M_STARTSWITH ? s.s.p : s.s.p + s.s.n - c.s.n, c.s.p, c.s.n))
					*out = jv_bool(true);
			}
			return 0;
		}
		case M_LOWER: *out = case_map(r, line, s, 0); return r->rc;
		case M_UPPER: *out = case_map(r, line, s, 1); return r->rc;
		case M_CAPITALIZE: *out = case_map(r, line, s, 2); return r->rc;
		case M_TITLE: *out = case_map(r, line, s, 3); return r->rc;
		case M_REPLACE:
			if (!arg(a, 0, "old", &x) || !arg(a, 1, "new", &y) || need_str(r, line, x, "replace's old") ||
			    need_str(r, line, y, "replace's new"))
				return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "replace() takes two strings");
			k = -1;
			if (a->nargs > 2 && !as_index(a->args[2], &k))
				return rfail(r, line, BATON_EINVAL, "replace's count must be an integer");
			*out = replace(r, line, s, x, y, k);
			return r->rc;
		case M_FIND:
		case M_RFIND:
		case M_INDEX:
		case M_COUNT: {
			if (!arg(a, 0, "sub", &x) || need_str(r, line, x, "the substring"))
				return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "%s() takes a string", methods[m]);
			if (a->nargs > 1)
				return rfail(r, line, BATON_EUNSUPPORTED, "%s() with start/end is not supported", methods[m]);
			if (m == M_COUNT) {
				int64_t c = 0;
				if (x.s.n == 0)
					c = (int64_t)jj_utf8_count(s.s.p, s.s.n) + 1;
				else
					for (const char *p = s.s.p, *h; (h = find(p, s.s.n - (size_t)(p - s.s.p), x.s.p, x.s.n));
					     p = h + x.s.n)
						c++;
				*out = jv_int(c);
				return 0;
			}
			const char *h = m == M_RFIND ? rfind(s.s.p, s.s.n, x.s.p, x.s.n) : find(s.s.p, s.s.n, x.s.p, x.s.n);
			if (!h && m == M_INDEX)
				return rfail(r, line, BATON_EINVAL, "substring not found");
			*out = jv_int(h ? (int64_t)jj_utf8_count(s.s.p, (size_t)(h - s.s.p)) : -1);
			return 0;
		}
		case M_JOIN: {
			jv items;
			if (!arg(a, 0, "iterable", &x) || items_of(r, line, x, &items))
				return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "join() takes an iterable");
			struct tbuf b = {0};
			int rc = 0;
			for (size_t i = 0; i < items.l->n && !rc; i++) {
				if (items.l->v[i].t != JV_STR) {
					tx_tbuf_free(&b);
					return rfail(r, line, BATON_EINVAL, "sequence item %zu: expected str instance, %s found", i,
					             jv_type_name(items.l->v[i]));
				}
				if (i)
					rc = tx_tbuf_put(&b, s.s.p, s.s.n);
				rc |= tx_tbuf_put(&b, items.l->v[i].s.p, items.l->v[i].s.n);
				if (b.n > MAX_OUT)
					break;
			}
			if (rc) {
				tx_tbuf_free(&b);
				return oom(r, line);
			}
			*out = tbuf_str(r, line, &b);
			return r->rc;
		}
		case M_SPLITLINES: {
			*out = jv_list_new(r->a, 0, JK_LIST);
			if (out->t != JV_LIST)
				return oom(r, line);
			size_t i = 0, st = 0, n = s.s.n;
			while (i < n) {
				char c = s.s.p[i];
				if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
					if (jv_list_push(r->a, out, jv_str(s.s.p + st, i - st)))
						return oom(r, line);
					i += c == '\r' && i + 1 < n && s.s.p[i + 1] == '\n' ? 2 : 1;
					st = i;
				} else
					i++;
			}
			if (st < n && jv_list_push(r->a, out, jv_str(s.s.p + st, n - st)))
				return oom(r, line);
			return 0;
		}
		case M_ISDIGIT:
		case M_ISALPHA:
		case M_ISALNUM:
		case M_ISSPACE:
		case M_ISUPPER:
		case M_ISLOWER: {
			bool ok = s.s.n > 0, cased = false;
			for (size_t i = 0; i < s.s.n && ok;) {
				size_t adv;
				uint32_t c = cp_at(s.s.p + i, s.s.n - i, &adv);
				if (c >= 0x80 && m != M_ISSPACE)
					return rfail(r, line, BATON_EUNSUPPORTED, "%s() on non-ASCII text is not supported",
					             methods[m]);
				bool up = c >= 'A' && c <= 'Z', lo = c >= 'a' && c <= 'z', dg = c >= '0' && c <= '9';
				if (m == M_ISDIGIT)
					ok = dg;
				else if (m == M_ISALPHA)
					ok = up || lo;
				else if (m == M_ISALNUM)
					ok = up || lo || dg;
				else if (m == M_ISSPACE)
					ok = jj_is_space(c);
				else if (m == M_ISUPPER) {
					ok = !lo;
					cased |= up;
				} else {
					ok = !up;
					cased |= lo;
				}
				i += adv;
			}
			if (m == M_ISUPPER || m == M_ISLOWER)
				ok = ok && cased;
			*out = jv_bool(ok);
			return 0;
		}
		case M_REMOVEPREFIX:
		case M_REMOVESUFFIX:
			if (!arg(a, 0, "prefix", &x) || need_str(r, line, x, "the affix"))
				return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "%s() takes a string", methods[m]);
			*out = s;
			if (x.s.n <= s.s.n && m == M_REMOVEPREFIX && !memcmp(s.s.p, x.s.p, x.s.n))
				*out = jv_str(s.s.p + x.s.n, s.s.n - x.s.n);
			if (x.s.n <= s.s.n && m == M_REMOVESUFFIX && !memcmp(s.s.p + s.s.n - x.s.n, x.s.p, x.s.n))
				*out = jv_str(s.s.p, s.s.n - x.s.n);
			return 0;
		}
	}
	if (self.t == JV_LIST && (m == M_INDEX || m == M_COUNT)) {
		if (!arg(a, 0, "value", &x))
			return rfail(r, line, BATON_EINVAL, "%s() takes an argument", methods[m]);
		int64_t c = 0, at = -1;
		for (size_t i = 0; i < self.l->n; i++)
			if (jv_equal(self.l->v[i], x)) {
				c++;
				if (at < 0)
					at = (int64_t)i;
			}
		if (m == M_INDEX && at < 0)
			return rfail(r, line, BATON_EINVAL, "value is not in list");
		*out = jv_int(m == M_INDEX ? at : c);
		return 0;
	}
	if (self.t == JV_DICT && self.kind && m == M_CYCLE) {
		jv *i0 = jv_dict_gets(&self, "index0", 6);
		if (!a->nargs)
			return rfail(r, line, BATON_EINVAL, "no items for cycling given");
		*out = a->args[i0->i % (int64_t)a->nargs];
		return 0;
	}
	if (self.t == JV_DICT) {
		switch (m) {
		case M_ITEMS:
		case M_KEYS:
		case M_VALUES:
			*out = jv_list_new(r->a, self.d->n, JK_VIEW);
			if (out->t != JV_LIST)
				return oom(r, line);
			for (size_t i = 0; i < self.d->n; i++) {
				if (m == M_ITEMS) {
					jv t = jv_list_new(r->a, 2, JK_TUPLE);
					if (t.t != JV_LIST)
						return oom(r, line);
					t.l->v[0] = self.d->k[i];
					t.l->v[1] = self.d->v[i];
					t.l->n = 2;
					out->l->v[i] = t;
				} else
					out->l->v[i] = m == M_KEYS ? self.d->k[i] : self.d->v[i];
			}
			out->l->n = self.d->n;
			return 0;
		case M_GET: {
			if (!arg(a, 0, "key", &x))
				return rfail(r, line, BATON_EINVAL, "get() takes a key");
			jv *v = jv_dict_get(&self, x);
			*out = v ? *v : arg(a, 1, "default", &y) ? y : jv_none();
			return 0;
		}
		}
	}
	return rfail(r, line, BATON_EINVAL, "'%s' object has no method '%s'", jv_type_name(self), methods[m]);
}

static int call_value(struct rs *r, int line, jv fn, jv *args, size_t nargs, jv *kwn, jv *kwv,
                      size_t nkw, jv *out)
{
	struct argv_ a = {args, kwn, kwv, nargs, nkw};
	switch (fn.t) {
	case JV_MACRO: return macro_call(r, line, fn.mac, args, nargs, kwn, kwv, nkw, out);
	case JV_FUNC: return call_global(r, line, fn.aux, &a, out);
	case JV_METHOD: return call_method(r, line, *fn.self, fn.aux, &a, out);
	case JV_UNDEF: return undef_fail(r, line, fn);
	default: return rfail(r, line, BATON_EINVAL, "'%s' object is not callable", jv_type_name(fn));
	}
}

/* An attribute path ("a.b.0") of an item, as jinja2's make_attrgetter. */
static int attr_path(struct rs *r, int line, jv item, jv path, jv *out)
{
	if (path.t == JV_INT)
		return getitem(r, line, item, path, out);
	if (need_str(r, line, path, "the attribute"))
		return r->rc;
	*out = item;
	size_t i = 0;
	while (i <= path.s.n) {
		size_t j = i;
		while (j < path.s.n && path.s.p[j] != '.')
			j++;
		jv key = jv_str(path.s.p + i, j - i);
		bool digits = j > i;
		int64_t num = 0;
		for (size_t k = i; k < j && digits; k++) {
			digits = path.s.p[k] >= '0' && path.s.p[k] <= '9';
			num = num * 10 + (path.s.p[k] - '0');
		}
		if (getitem(r, line, *out, digits ? jv_int(num) : key, out))
			return r->rc;
		i = j + 1;
	}
	return 0;
}

/* Sort key for sort/dictsort/unique/min/max: lower-cased strings unless
 * case_sensitive. */
static jv sort_key(struct rs *r, int line, jv v, bool cs)
{
	if (!cs && v.t == JV_STR)
		return case_map(r, line, v, 0);
	return v;
}

struct sortctx {
	struct rs *r;
	int line;
	jv *keys;
	bool reverse;
};

static int merge_sort(struct sortctx *c, size_t *idx, size_t *tmp, size_t n)
{
	if (n < 2)
		return 0;
	size_t h = n / 2;
	if (merge_sort(c, idx, tmp, h) || merge_sort(c, idx + h, tmp, n - h))
		return c->r->rc;
	size_t i = 0, j = h, k = 0;
	while (i < h && j < n) {
		int rc, cm = jv_cmp(c->keys[idx[j]], c->keys[idx[i]], &rc);
		if (rc)
			return rfail(c->r, c->line, BATON_EINVAL, "'<' not supported between instances of '%s' and '%s'",
			             jv_type_name(c->keys[idx[j]]), jv_type_name(c->keys[idx[i]]));
		/* stable: take the right one only when strictly before */
		bool right = c->reverse ? cm > 0 : cm < 0;
		tmp[k++] = right ? idx[j++] : idx[i++];
	}
	while (i < h)
		tmp[k++] = idx[i++];
	while (j < n)
		tmp[k++] = idx[j++];
	memcpy(idx, tmp, n * sizeof(*idx));
	return 0;
}

/* Sorts items by keys (stable, Python's sorted with reverse). */
static int sort_items(struct rs *r, int line, jv items, jv *keys, bool reverse, jv *out)
{
	size_t n = items.l->n;
	size_t *idx = jj_alloc(r->a, (n + 1) * sizeof(size_t)), *tmp = jj_alloc(r->a, (n + 1) * sizeof(size_t));
	if (!idx || !tmp)
		return oom(r, line);
	for (size_t i = 0; i < n; i++)
		idx[i] = i;
	struct sortctx c = {r, line, keys, reverse};
	if (merge_sort(&c, idx, tmp, n))
		return r->rc;
	*out = jv_list_new(r->a, n, JK_LIST);
	if (out->t != JV_LIST)
		return oom(r, line);
	for (size_t i = 0; i < n; i++)
		out->l->v[i] = items.l->v[idx[i]];
	out->l->n = n;
	return 0;
}

static int select_items(struct rs *r, int line, int id, jv v, const struct argv_ *a, jv *out)
{
	bool attr = id == F_SELECTATTR || id == F_REJECTATTR;
	bool want = id == F_SELECT || id == F_SELECTATTR;
	jv items, path = jv_none();
	if (items_of(r, line, v, &items))
		return r->rc;
	size_t first = 0;
	if (attr) {
		if (!a->nargs)
			return rfail(r, line, BATON_EINVAL, "%s needs an attribute", filters[id]);
		path = a->args[0];
		first = 1;
	}
	int test = -1;
	struct argv_ rest = {0};
	if (a->nargs > first) {
		if (need_str(r, line, a->args[first], "the test name"))
			return r->rc;
		test = jj_test_id(a->args[first].s.p, a->args[first].s.n);
		if (test < 0)
			return rfail(r, line, BATON_EUNSUPPORTED, "the test '%.*s' is not supported",
			             (int)a->args[first].s.n, a->args[first].s.p);
		rest.args = a->args + first + 1;
		rest.nargs = a->nargs - first - 1;
	}
	*out = jv_list_new(r->a, 0, JK_GEN);
	if (out->t != JV_LIST)
		return oom(r, line);
	for (size_t i = 0; i < items.l->n; i++) {
		jv x = items.l->v[i], y = x;
		if (attr && attr_path(r, line, x, path, &y))
			return r->rc;
		bool ok;
		if (test < 0)
			ok = jv_truthy(y);
		else if (run_test(r, line, test, y, &rest, &ok))
			return r->rc;
		if (ok == want && jv_list_push(r->a, out, x))
			return oom(r, line);
	}
	return 0;
}

static int run_filter(struct rs *r, int line, int id, jv v, const struct argv_ *a, jv *out)
{
	jv x, y, items;
	int64_t n = 0;
	switch (id) {
	case F_DEFAULT:
	case F_D: {
		jv d = jv_str("", 0), b = jv_bool(false);
		arg(a, 0, "default_value", &d);
		arg(a, 1, "boolean", &b);
		*out = v.t == JV_UNDEF || (jv_truthy(b) && !jv_truthy(v)) ? d : v;
		return 0;
	}
	case F_LENGTH:
	case F_COUNT:
		if (len_of(r, line, v, &n))
			return r->rc;
		*out = jv_int(n);
		return 0;
	case F_STRING:
		return to_str(r, line, v, out);
	case F_SAFE:
		if (v.t == JV_STR) {
			*out = v;
			return 0;
		}
		return to_str(r, line, v, out);
	case F_UPPER:
	case F_LOWER:
	case F_CAPITALIZE:
	case F_TITLE:
		if (to_str(r, line, v, &x))
			return r->rc;
		*out = case_map(r, line, x, id == F_LOWER ? 0 : id == F_UPPER ? 1 : id == F_CAPITALIZE ? 2 : 3);
		return r->rc;
	case F_TRIM: {
		if (to_str(r, line, v, &x))
			return r->rc;
		bool have = arg(a, 0, "chars", &y) && y.t != JV_NONE;
		if (have && need_str(r, line, y, "trim's chars"))
			return r->rc;
		*out = strip(x, have ? &y : NULL, true, true);
		return 0;
	}
	case F_REPLACE: {
		if (to_str(r, line, v, &x))
			return r->rc;
		jv o, nw;
		if (!arg(a, 0, "old", &o) || !arg(a, 1, "new", &nw) || to_str(r, line, o, &o) || to_str(r, line, nw, &nw))
			return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "replace takes old and new");
		int64_t cnt = -1;
		if (arg(a, 2, "count", &y) && y.t != JV_NONE && !as_index(y, &cnt))
			return rfail(r, line, BATON_EINVAL, "replace's count must be an integer");
		*out = replace(r, line, x, o, nw, cnt);
		return r->rc;
	}
	case F_ESCAPE:
	case F_E: {
		if (to_str(r, line, v, &x))
			return r->rc;
		struct tbuf b = {0};
		int rc = 0;
		for (size_t i = 0; i < x.s.n && !rc; i++) {
			char c = x.s.p[i];
			const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
			rc = e ? tx_tbuf_put(&b, e, strlen(e)) : tx_tbuf_putc(&b, c);
		}
		if (rc) {
			tx_tbuf_free(&b);
			return oom(r, line);
		}
		*out = tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_TOJSON: {
		int indent = -1;
		const char *seps[2] = {NULL, NULL};
		char sepbuf[2][16];
		if (arg(a, 0, "ensure_ascii", &x) && jv_truthy(x))
			return rfail(r, line, BATON_EUNSUPPORTED, "tojson(ensure_ascii=True) is not supported");
		if (arg(a, 1, "indent", &x) && x.t != JV_NONE) {
			int64_t k;
			if (!as_index(x, &k) || k < 0 || k > 64)
				return rfail(r, line, BATON_EUNSUPPORTED, "tojson's indent must be a small integer");
			indent = (int)k;
		}
		if (arg(a, 2, "separators", &x) && x.t != JV_NONE) {
			if (x.t != JV_LIST || x.l->n != 2 || x.l->v[0].t != JV_STR || x.l->v[1].t != JV_STR ||
			    x.l->v[0].s.n >= 16 || x.l->v[1].s.n >= 16)
				return rfail(r, line, BATON_EINVAL, "tojson's separators must be two short strings");
			for (int k = 0; k < 2; k++) {
				memcpy(sepbuf[k], x.l->v[k].s.p, x.l->v[k].s.n);
				sepbuf[k][x.l->v[k].s.n] = 0;
				seps[k] = sepbuf[k];
			}
		}
		if (arg(a, 3, "sort_keys", &x) && jv_truthy(x))
			return rfail(r, line, BATON_EUNSUPPORTED, "tojson(sort_keys=True) is not supported");
		struct tbuf b = {0};
		char e[300];
		int rc = jv_json_into(&b, v, indent, seps[0], seps[1], 0, e, sizeof(e));
		if (rc) {
			tx_tbuf_free(&b);
			return rfail(r, line, rc, "%s", e);
		}
		*out = tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_JOIN: {
		jv sep = jv_str("", 0), path;
		bool have_attr = arg(a, 1, "attribute", &path);
		if (arg(a, 0, "d", &x) && to_str(r, line, x, &sep))
			return r->rc;
		if (items_of(r, line, v, &items))
			return r->rc;
		struct tbuf b = {0};
		int rc = 0;
		for (size_t i = 0; i < items.l->n && !rc; i++) {
			jv it = items.l->v[i];
			if (have_attr && attr_path(r, line, it, path, &it))
				break;
			if (i)
				rc = tx_tbuf_put(&b, sep.s.p, sep.s.n);
			char e[300];
			if (!rc && (rc = jv_str_into(&b, it, e, sizeof(e))) != 0 && rc != BATON_ENOMEM) {
				tx_tbuf_free(&b);
				return rfail(r, line, rc, "%s", e);
			}
			if (b.n > MAX_OUT)
				break;
		}
		if (r->rc || rc) {
			tx_tbuf_free(&b);
			return r->rc ? r->rc : oom(r, line);
		}
		*out = tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_FIRST:
	case F_LAST:
		if (id == F_LAST && v.t == JV_LIST && v.kind == JK_GEN)
			return rfail(r, line, BATON_EINVAL, "'generator' object is not reversible");
		if (v.t == JV_LIST && v.kind == JK_GEN) { /* next(): one item */
			*out = v.l->pos < v.l->n ? v.l->v[v.l->pos++] : jv_undef(NULL, 0);
			return 0;
		}
		if (items_of(r, line, v, &items))
			return r->rc;
		*out = items.l->n ? items.l->v[id == F_FIRST ? 0 : items.l->n - 1] : jv_undef(NULL, 0);
		return 0;
	case F_LIST:
		if (items_of(r, line, v, &items))
			return r->rc;
		*out = jv_list_new(r->a, items.l->n, JK_LIST);
		if (out->t != JV_LIST)
			return oom(r, line);
		memcpy(out->l->v, items.l->v, items.l->n * sizeof(jv));
		out->l->n = items.l->n;
		return 0;
	case F_ITEMS:
		*out = jv_list_new(r->a, 0, JK_GEN);
		if (out->t != JV_LIST)
			return oom(r, line);
		if (v.t == JV_UNDEF)
			return 0;
		if (v.t != JV_DICT || v.kind)
			return rfail(r, line, BATON_EINVAL, "can only get item pairs from a mapping.");
		for (size_t i = 0; i < v.d->n; i++) {
			jv t = jv_list_new(r->a, 2, JK_TUPLE);
			if (t.t != JV_LIST)
				return oom(r, line);
			t.l->v[0] = v.d->k[i];
			t.l->v[1] = v.d->v[i];
			t.l->n = 2;
			if (jv_list_push(r->a, out, t))
				return oom(r, line);
		}
		return 0;
	case F_DICTSORT: {
		if (v.t != JV_DICT || v.kind)
			return rfail(r, line, BATON_EINVAL, "dictsort needs a mapping");
		jv cs = jv_bool(false), by = jv_str("key", 3), rev = jv_bool(false);
		arg(a, 0, "case_sensitive", &cs);
		arg(a, 1, "by", &by);
		arg(a, 2, "reverse", &rev);
		bool by_value = by.t == JV_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5);
		items = jv_list_new(r->a, v.d->n, JK_LIST);
		jv *keys = jj_alloc(r->a, (v.d->n + 1) * sizeof(jv));
		if (items.t != JV_LIST || !keys)
			return oom(r, line);
		for (size_t i = 0; i < v.d->n; i++) {
			jv t = jv_list_new(r->a, 2, JK_TUPLE);
			if (t.t != JV_LIST)
				return oom(r, line);
			t.l->v[0] = v.d->k[i];
			t.l->v[1] = v.d->v[i];
			t.l->n = 2;
			items.l->v[i] = t;
			keys[i] = sort_key(r, line, by_value ? v.d->v[i] : v.d->k[i], jv_truthy(cs));
		}
		items.l->n = v.d->n;
		return sort_items(r, line, items, keys, jv_truthy(rev), out);
	}
	case F_SORT:
	case F_UNIQUE:
	case F_MIN:
	case F_MAX: {
		jv cs = jv_bool(false), rev = jv_bool(false), path = jv_none();
		if (id == F_SORT) {
			arg(a, 0, "reverse", &rev);
			arg(a, 1, "case_sensitive", &cs);
			arg(a, 2, "attribute", &path);
		} else {
			arg(a, 0, "case_sensitive", &cs);
			arg(a, 1, "attribute", &path);
		}
		if (items_of(r, line, v, &items))
			return r->rc;
		jv *keys = jj_alloc(r->a, (items.l->n + 1) * sizeof(jv));
		if (!keys)
			return oom(r, line);
		for (size_t i = 0; i < items.l->n; i++) {
			jv k = items.l->v[i];
			if (path.t != JV_NONE && attr_path(r, line, k, path, &k))
				return r->rc;
			keys[i] = sort_key(r, line, k, jv_truthy(cs));
		}
		if (id == F_SORT)
			return sort_items(r, line, items, keys, jv_truthy(rev), out);
		if (id == F_UNIQUE) {
			*out = jv_list_new(r->a, 0, JK_GEN);
			if (out->t != JV_LIST)
				return oom(r, line);
			for (size_t i = 0; i < items.l->n; i++) {
				bool seen = false;
				for (size_t j = 0; j < i && !seen; j++)
					seen = jv_equal(keys[i], keys[j]);
				if (!seen && jv_list_push(r->a, out, items.l->v[i]))
					return oom(r, line);
			}
			return 0;
		}
		if (!items.l->n) {
			*out = jv_undef(NULL, 0);
			return 0;
		}
		size_t best = 0;
		for (size_t i = 1; i < items.l->n; i++) {
			int rc, c = jv_cmp(keys[i], keys[best], &rc);
			if (rc)
				return rfail(r, line, BATON_EINVAL, "values of these types cannot be ordered");
			if (id == F_MIN ? c < 0 : c > 0)
				best = i;
		}
		*out = items.l->v[best];
		return 0;
	}
	case F_REVERSE:
		if (v.t == JV_STR) {
			struct tbuf b = {0};
			int rc = 0;
			for (size_t i = v.s.n; i > 0 && !rc;) {
				size_t k = i - 1;
				while (k > 0 && ((unsigned char)v.s.p[k] & 0xC0) == 0x80)
					k--;
				rc = tx_tbuf_put(&b, v.s.p + k, i - k);
				i = k;
			}
			if (rc) {
				tx_tbuf_free(&b);
				return oom(r, line);
			}
			*out = tbuf_str(r, line, &b);
			return r->rc;
		}
		if (items_of(r, line, v, &items))
			return r->rc;
		*out = jv_list_new(r->a, items.l->n, v.t == JV_LIST && v.kind == JK_GEN ? JK_LIST : JK_GEN);
		if (out->t != JV_LIST)
			return oom(r, line);
		for (size_t i = 0; i < items.l->n; i++)
			out->l->v[i] = items.l->v[items.l->n - 1 - i];
		out->l->n = items.l->n;
		return 0;
	case F_MAP: {
		if (items_of(r, line, v, &items))
			return r->rc;
		*out = jv_list_new(r->a, 0, JK_GEN);
		if (out->t != JV_LIST)
			return oom(r, line);
		jv path, dflt;
		bool by_attr = arg(a, 99, "attribute", &path);
		bool have_dflt = arg(a, 99, "default", &dflt);
		int f = -1;
		struct argv_ rest = {0};
		if (!by_attr) {
			if (!a->nargs || need_str(r, line, a->args[0], "map's filter name"))
				return r->rc ? r->rc : rfail(r, line, BATON_EINVAL, "map needs a filter name or attribute=");
			f = jj_filter_id(a->args[0].s.p, a->args[0].s.n);
			if (f < 0)
				return rfail(r, line, BATON_EUNSUPPORTED, "the filter '%.*s' is not supported",
				             (int)a->args[0].s.n, a->args[0].s.p);
			rest.args = a->args + 1;
			rest.nargs = a->nargs - 1;
			rest.kwn = a->kwn;
			rest.kwv = a->kwv;
			rest.nkw = a->nkw;
		}
		for (size_t i = 0; i < items.l->n; i++) {
			jv y2;
			if (by_attr) {
				if (attr_path(r, line, items.l->v[i], path, &y2))
					return r->rc;
				if (y2.t == JV_UNDEF && have_dflt)
					y2 = dflt;
			} else if (run_filter(r, line, f, items.l->v[i], &rest, &y2))
				return r->rc;
			if (jv_list_push(r->a, out, y2))
				return oom(r, line);
		}
		return 0;
	}
	case F_SELECT:
	case F_REJECT:
	case F_SELECTATTR:
	case F_REJECTATTR:
		return select_items(r, line, id, v, a, out);
	case F_SUM: {
		jv path = jv_none(), acc = jv_int(0);
		arg(a, 0, "attribute", &path);
		arg(a, 1, "start", &acc);
		if (items_of(r, line, v, &items))
			return r->rc;
		for (size_t i = 0; i < items.l->n; i++) {
			jv k = items.l->v[i];
			if (path.t != JV_NONE && attr_path(r, line, k, path, &k))
				return r->rc;
			if (arith(r, line, JO_ADD, acc, k, &acc))
				return r->rc;
		}
		*out = acc;
		return 0;
	}
	case F_ABS:
		if (v.t == JV_INT || v.t == JV_BOOL) {
			int64_t k = v.t == JV_BOOL ? v.b : v.i;
			if (k == INT64_MIN)
				return rfail(r, line, BATON_ERANGE, "an integer outside 64 bits");
			*out = jv_int(k < 0 ? -k : k);
			return 0;
		}
		if (v.t == JV_FLOAT) {
			*out = jv_float(fabs(v.f));
			return 0;
		}
		return rfail(r, line, BATON_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
	case F_INT:
	case F_FLOAT: {
		jv d = id == F_INT ? jv_int(0) : jv_float(0);
		arg(a, 0, "default", &d);
		if (v.t == JV_BOOL || v.t == JV_INT) {
			int64_t k = v.t == JV_BOOL ? v.b : v.i;
			*out = id == F_INT ? jv_int(k) : jv_float((double)k);
			return 0;
		}
		if (v.t == JV_FLOAT) {
			if (id == F_FLOAT) {
				*out = v;
				return 0;
			}
			if (!isfinite(v.f) || fabs(v.f) >= 9.2e18)
				return rfail(r, line, BATON_ERANGE, "an integer outside 64 bits");
			*out = jv_int((int64_t)v.f);
			return 0;
		}
		if (v.t == JV_STR) {
			char buf[64];
			jv t = strip(v, NULL, true, true);
			if (t.s.n && t.s.n < sizeof(buf) && !memchr(t.s.p, '_', t.s.n)) {
				memcpy(buf, t.s.p, t.s.n);
				buf[t.s.n] = 0;
				char *end;
				if (id == F_INT) {
					errno = 0;
					long long k = strtoll(buf, &end, 10);
					if (!*end && !errno) {
						*out = jv_int(k);
						return 0;
					}
				}
				double fv = strtod(buf, &end);
				bool hex = strchr(buf, 'x') || strchr(buf, 'X');
				if (!*end && !hex) {
					if (id == F_FLOAT) {
						*out = jv_float(fv);
						return 0;
					}
					if (isfinite(fv) && fabs(fv) < 9.2e18) {
						*out = jv_int((int64_t)fv);
						return 0;
					}
				}
			}
		}
		*out = d;
		return 0;
	}
	case F_ROUND: {
		jv prec = jv_int(0), meth = jv_str("common", 6);
		arg(a, 0, "precision", &prec);
		arg(a, 1, "method", &meth);
		int64_t p;
		if (!jv_is_num(v) || !as_index(prec, &p) || meth.t != JV_STR || p < 0 || p > 15)
			return rfail(r, line, BATON_EUNSUPPORTED, "round() of these arguments is not supported");
		double x0 = jv_num(v), sc = pow(10, (double)p), z;
		if (meth.s.n == 5 && !memcmp(meth.s.p, "floor", 5))
			z = floor(x0 * sc) / sc;
		else if (meth.s.n == 4 && !memcmp(meth.s.p, "ceil", 4))
			z = ceil(x0 * sc) / sc;
		else if (p == 0)
			z = nearbyint(x0);
		else
			return rfail(r, line, BATON_EUNSUPPORTED, "round(precision > 0) is not supported");
		*out = jv_float(z);
		return 0;
	}
	case F_INDENT: {
		jv w = jv_int(4), fst = jv_bool(false), blank = jv_bool(false);
		arg(a, 0, "width", &w);
		arg(a, 1, "first", &fst);
		arg(a, 2, "blank", &blank);
		jv ind;
		if (w.t == JV_STR)
			ind = w;
		else {
			int64_t k;
			if (!as_index(w, &k) || k < 0 || k > 256)
				return rfail(r, line, BATON_EINVAL, "indent's width must be a small integer");
			char *sp = jj_alloc(r->a, (size_t)k + 1);
			if (!sp)
				return oom(r, line);
			memset(sp, ' ', (size_t)k);
			ind = jv_str(sp, (size_t)k);
		}
		if (to_str(r, line, v, &x))
			return r->rc;
		/* jinja2: (s + "\n").splitlines(); the first line as it is, the
		 * others indented when not empty (all of them when blank), joined
		 * with "\n"; the indent in front too when first */
		jv t0 = jv_str("\n", 1), lines;
		struct argv_ none = {0};
		if (arith(r, line, JO_ADD, x, t0, &x) || call_method(r, line, x, M_SPLITLINES, &none, &lines))
			return r->rc;
		struct tbuf b = {0};
		int rc = 0;
		if (jv_truthy(fst))
			rc |= tx_tbuf_put(&b, ind.s.p, ind.s.n);
		for (size_t i = 0; i < lines.l->n && !rc; i++) {
			jv ln = lines.l->v[i];
			if (i) {
				rc |= tx_tbuf_putc(&b, '\n');
				if (ln.s.n || jv_truthy(blank))
					rc |= tx_tbuf_put(&b, ind.s.p, ind.s.n);
			}
			rc |= tx_tbuf_put(&b, ln.s.p, ln.s.n);
		}
		if (rc) {
			tx_tbuf_free(&b);
			return oom(r, line);
		}
		*out = tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_WORDCOUNT: {
		if (to_str(r, line, v, &x))
			return r->rc;
		int64_t c = 0;
		bool in = false;
		for (size_t i = 0; i < x.s.n; i++) {
			unsigned char ch = (unsigned char)x.s.p[i];
			bool w = ch >= 0x80 || (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') ||
			         (ch >= 'A' && ch <= 'Z') || ch == '_';
			if (w && !in)
				c++;
			in = w;
		}
		*out = jv_int(c);
		return 0;
	}
	}
	return rfail(r, line, BATON_EINVAL, "unknown filter");
}

static int run_test(struct rs *r, int line, int id, jv v, const struct argv_ *a, bool *res)
{
	jv x = jv_undef(NULL, 0);
	bool have = arg(a, 0, NULL, &x);
	int64_t k, m;
	switch (id) {
	case T_DEFINED: *res = v.t != JV_UNDEF; return 0;
	case T_UNDEFINED: *res = v.t == JV_UNDEF; return 0;
	case T_NONE: *res = v.t == JV_NONE; return 0;
	case T_STRING: *res = v.t == JV_STR; return 0;
	case T_MAPPING: *res = v.t == JV_DICT && !v.kind; return 0;
	case T_ITERABLE: *res = v.t == JV_UNDEF || v.t == JV_STR || v.t == JV_LIST || (v.t == JV_DICT && !v.kind); return 0;
	case T_SEQUENCE:
		*res = v.t == JV_UNDEF || v.t == JV_STR || (v.t == JV_LIST && v.kind != JK_GEN) || (v.t == JV_DICT && !v.kind);
		return 0;
	case T_NUMBER: *res = jv_is_num(v); return 0;
	case T_INTEGER: *res = v.t == JV_INT; return 0;
	case T_FLOAT: *res = v.t == JV_FLOAT; return 0;
	case T_BOOLEAN: *res = v.t == JV_BOOL; return 0;
	case T_TRUE: *res = v.t == JV_BOOL && v.b; return 0;
	case T_FALSE: *res = v.t == JV_BOOL && !v.b; return 0;
	case T_CALLABLE: *res = v.t == JV_MACRO || v.t == JV_FUNC || v.t == JV_METHOD; return 0;
	case T_EVEN:
	case T_ODD:
		if (!as_index(v, &k))
			return rfail(r, line, BATON_EINVAL, "even/odd need an integer");
		*res = (k % 2 == 0) == (id == T_EVEN);
		return 0;
	case T_DIVISIBLEBY:
		if (!as_index(v, &k) || !have || !as_index(x, &m) || m == 0)
			return rfail(r, line, BATON_EINVAL, "divisibleby needs integers (not zero)");
		*res = k % m == 0;
		return 0;
	case T_LOWER:
	case T_UPPER: {
		jv s;
		if (to_str(r, line, v, &s))
			return r->rc;
		struct argv_ none = {0};
		jv out;
		if (call_method(r, line, s, id == T_LOWER ? M_ISLOWER : M_ISUPPER, &none, &out))
			return r->rc;
		*res = out.b;
		return 0;
	}
	case T_SAMEAS:
		if (!have)
			return rfail(r, line, BATON_EINVAL, "sameas needs an argument");
		if (v.t != x.t)
			*res = false;
		else if (v.t == JV_NONE || v.t == JV_UNDEF)
			*res = true;
		else if (v.t == JV_BOOL)
			*res = v.b == x.b;
		else if (v.t == JV_INT)
			*res = v.i == x.i && v.i >= -5 && v.i <= 256;
		else
			*res = v.l == x.l && v.t != JV_FLOAT && v.t != JV_STR;
		return 0;
	case T_IN: return contains(r, line, v, x, res);
	default: {
		static const int ops[] = {[T_EQ] = JO_EQ, [T_EQUALTO] = JO_EQ, [T_NE] = JO_NE, [T_LT] = JO_LT,
		                          [T_LE] = JO_LE, [T_GT] = JO_GT, [T_GE] = JO_GE, [T_GREATERTHAN] = JO_GT,
		                          [T_LESSTHAN] = JO_LT};
		if (!have)
			return rfail(r, line, BATON_EINVAL, "the test '%s' needs an argument", tests[id]);
		return compare(r, line, ops[id], v, x, res);
	}
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
			return oom(r, n->line);
		return 0;
	case E_ITEM:
		if (eval(r, n->a, f, &a) || eval(r, n->b, f, &b))
			return r->rc;
		return getitem(r, n->line, a, b, out);
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
		return run_filter(r, n->line, n->op, a, &av, out);
	}
	case E_TEST: {
		jv *args, *kwn, *kwv;
		if (eval(r, n->a, f, &a) || eval_args(r, n, f, &args, &kwn, &kwv))
			return r->rc;
		struct argv_ av = {args, kwn, kwv, n->nv, 0};
		bool res;
		if (run_test(r, n->line, n->op, a, &av, &res))
			return r->rc;
		*out = jv_bool(res != n->neg);
		return 0;
	}
	case E_BIN:
		if (eval(r, n->a, f, &a) || eval(r, n->b, f, &b))
			return r->rc;
		if (n->op == JO_TILDE) {
			jv x, y;
			if (to_str(r, n->line, a, &x) || to_str(r, n->line, b, &y))
				return r->rc;
			return arith(r, n->line, JO_ADD, x, y, out);
		}
		return arith(r, n->line, n->op, a, b, out);
	case E_NEG:
	case E_POS:
		if (eval(r, n->a, f, &a))
			return r->rc;
		if (a.t == JV_UNDEF)
			return undef_fail(r, n->line, a);
		if (!jv_is_num(a))
			return rfail(r, n->line, BATON_EINVAL, "bad operand type for unary %c: '%s'",
			             n->kind == E_NEG ? '-' : '+', jv_type_name(a));
		if (n->kind == E_POS)
			*out = a.t == JV_BOOL ? jv_int(a.b) : a;
		else if (a.t == JV_FLOAT)
			*out = jv_float(-a.f);
		else {
			int64_t k = a.t == JV_BOOL ? a.b : a.i;
			if (k == INT64_MIN)
				return rfail(r, n->line, BATON_ERANGE, "an integer outside 64 bits");
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
			if (eval(r, n->v[i], f, &b) || compare(r, n->line, n->ops[i], a, b, &res))
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
			return oom(r, n->line);
		for (size_t i = 0; i < n->nv; i++)
			if (eval(r, n->v[i], f, &out->l->v[i]))
				return r->rc;
		out->l->n = n->nv;
		return 0;
	case E_DICT:
		*out = jv_dict_new(r->a, JV_DICT);
		if (out->t != JV_DICT)
			return oom(r, n->line);
		for (size_t i = 0; i < n->nv; i++) {
			if (eval(r, n->v[i], f, &a) || eval(r, n->w[i], f, &b))
				return r->rc;
			if (a.t == JV_LIST && a.kind != JK_TUPLE)
				return rfail(r, n->line, BATON_EINVAL, "unhashable type: 'list'");
			if (a.t == JV_DICT || a.t == JV_UNDEF)
				return rfail(r, n->line, BATON_EINVAL, "unhashable type: '%s'", jv_type_name(a));
			if (jv_dict_set(r->a, out, a, b))
				return oom(r, n->line);
		}
		return 0;
	default: return rfail(r, n->line, BATON_EINVAL, "not an expression");
	}
}

static int emit(struct rs *r, int line, const char *p, size_t n)
{
	r->produced += n;
	if (r->produced > MAX_OUT * 4 || r->out->n + n > MAX_OUT)
		return rfail(r, line, BATON_ETOOBIG, "the output ran over %u MiB", MAX_OUT >> 20);
	return tx_tbuf_put(r->out, p, n) ? oom(r, line) : 0;
}

static int exec_for(struct rs *r, const struct jj_node *n, struct frame *f)
{
	jv it, items;
	if (eval(r, n->b, f, &it) || items_of(r, n->line, it, &items))
		return ST_ERR;
	if (n->x) {
		jv kept = jv_list_new(r->a, 0, JK_LIST);
		if (kept.t != JV_LIST)
			return oom(r, n->line), ST_ERR;
		for (size_t i = 0; i < items.l->n; i++) {
			struct frame *lf = frame_new(r, f);
			jv c;
			if (!lf)
				return oom(r, n->line), ST_ERR;
			if (assign(r, n->a, items.l->v[i], lf) || eval(r, n->x, lf, &c))
				return ST_ERR;
			if (jv_truthy(c) && jv_list_push(r->a, &kept, items.l->v[i]))
				return oom(r, n->line), ST_ERR;
		}
		items = kept;
	}
	size_t len = items.l->n;
	for (size_t i = 0; i < len; i++) {
		struct frame *lf = frame_new(r, f);
		jv loop = jv_dict_new(r->a, JV_DICT);
		if (!lf || loop.t != JV_DICT)
			return oom(r, n->line), ST_ERR;
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
				return oom(r, n->line), ST_ERR;
		if (frame_set(r, lf, jv_str("loop", 4), loop))
			return oom(r, n->line), ST_ERR;
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
	*out = tbuf_str(r, line, &b);
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
		if (to_str(r, n->line, v, &x))
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
			return oom(r, n->line), ST_ERR;
		c->n = n;
		c->f = f;
		jv m = {.t = JV_MACRO};
		m.mac = c;
		return frame_set(r, f, n->c, m) ? (oom(r, n->line), ST_ERR) : ST_OK;
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
			if (run_filter(r, fl->line, fl->op, v, &av, &v))
				return ST_ERR;
		}
		if (to_str(r, n->line, v, &x))
			return ST_ERR;
		return emit(r, n->line, x.s.p, x.s.n) ? ST_ERR : ST_OK;
	}
	case N_WITH: {
		struct frame *wf = frame_new(r, f);
		if (!wf)
			return oom(r, n->line), ST_ERR;
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
			return oom(r, n->line), ST_ERR;
		cl->n = n->b;
		cl->f = f;
		if (eval(r, c->a, f, &fn) || eval_args(r, c, f, &args, &kwn, &kwv))
			return ST_ERR;
		if (fn.t != JV_MACRO)
			return rfail(r, n->line, BATON_EINVAL, "a call block calls a macro, not a %s",
			             jv_type_name(fn)), ST_ERR;
		r->caller = (jv){.t = JV_MACRO};
		r->caller.mac = cl;
		if (call_value(r, n->line, fn, args, c->nv, kwn, kwv, c->nw, &v))
			return ST_ERR;
		if (to_str(r, n->line, v, &x))
			return ST_ERR;
		return emit(r, n->line, x.s.p, x.s.n) ? ST_ERR : ST_OK;
	}
	default: return rfail(r, n->line, BATON_EINVAL, "not a statement"), ST_ERR;
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
		return rfail(r, 0, BATON_EINVAL, "the context nests too deep");
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
			return oom(r, 0);
		for (size_t i = 0; i < n; i++)
			if (from_json(r, json_array_get(x, i), &out->l->v[i], depth + 1))
				return r->rc;
		out->l->n = n;
		return 0;
	}
	case JSON_OBJECT: {
		*out = jv_dict_new(r->a, JV_DICT);
		if (out->t != JV_DICT)
			return oom(r, 0);
		const char *k;
		size_t kn;
		json_t *v;
		json_object_keylen_foreach(x, k, kn, v) {
			jv y;
			if (from_json(r, v, &y, depth + 1) || jv_dict_set(r->a, out, jv_str(k, kn), y))
				return r->rc ? r->rc : oom(r, 0);
		}
		return 0;
	}
	}
	return rfail(r, 0, BATON_EINVAL, "bad JSON value");
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
		rc = r.rc ? r.rc : oom(&r, 0);
	for (size_t i = 0; !rc && i < root.d->n; i++)
		if (frame_set(&r, r.root, root.d->k[i], root.d->v[i]))
			rc = oom(&r, 0);
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
