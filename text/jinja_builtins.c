/*
 * jinja_builtins.c: the engine's built-in library: the filters, tests,
 * methods and globals chat templates call (their names and ids, run_filter,
 * run_test, call_method, call_global), with the string helpers they use
 * (case mapping, strip, split, replace) and the sorting and select helpers.
 * Evaluation, statements and the public door are in jinja_eval.c.
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

uint32_t jj_cp_at(const char *s, size_t n, size_t *adv)
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
		uint32_t c = jj_cp_at(s.s.p + i, s.s.n - i, &adv);
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
		jj_oom(r, line);
		return jv_undef(NULL, 0);
	}
	return jj_tbuf_str(r, line, &b);
}

static bool in_chars(uint32_t c, const jv *chars)
{
	if (!chars)
		return jj_is_space(c);
	for (size_t i = 0; i < chars->s.n;) {
		size_t adv;
		if (jj_cp_at(chars->s.p + i, chars->s.n - i, &adv) == c)
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
		uint32_t c = jj_cp_at(s.s.p + a, b - a, &adv);
		if (!in_chars(c, chars))
			break;
		a += adv;
	}
	while (right && b > a) {
		size_t k = b - 1;
		while (k > a && ((unsigned char)s.s.p[k] & 0xC0) == 0x80)
			k--;
		size_t adv;
		uint32_t c = jj_cp_at(s.s.p + k, b - k, &adv);
		if (!in_chars(c, chars))
			break;
		b = k;
	}
	return jv_str(s.s.p + a, b - a);
}

const char *jj_find(const char *h, size_t hn, const char *nd, size_t nn)
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
			jj_cp_at(s.s.p + i, s.s.n - i, &adv);
			rc |= tx_tbuf_put(&b, s.s.p + i, adv);
			i += adv;
			if (b.n > MAX_OUT)
				break;
		}
	} else {
		size_t i = 0;
		int64_t k = 0;
		while (!rc && (count < 0 || k < count)) {
			const char *h = jj_find(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
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
		jj_oom(r, line);
		return jv_undef(NULL, 0);
	}
	return jj_tbuf_str(r, line, &b);
}

static int split(struct rs *r, int line, jv s, const jv *sep, int64_t maxsplit, bool from_right,
                 jv *out)
{
	*out = jv_list_new(r->a, 0, JK_LIST);
	if (out->t != JV_LIST)
		return jj_oom(r, line);
	jv parts[1];
	(void)parts;
	if (sep && sep->s.n == 0)
		return jj_rfail(r, line, BATON_EINVAL, "empty separator");
	if (!sep) {
		/* runs of whitespace; leading and trailing ignored */
		size_t i = 0, n = s.s.n;
		int64_t k = 0;
		if (from_right)
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "rsplit() without a separator is not supported");
		for (;;) {
			while (i < n) {
				size_t adv;
				if (!jj_is_space(jj_cp_at(s.s.p + i, n - i, &adv)))
					break;
				i += adv;
			}
			if (i >= n)
				break;
			size_t j = i;
			if (maxsplit >= 0 && k >= maxsplit) {
				/* the rest as it is (Python keeps its trailing whitespace) */
				if (jv_list_push(r->a, out, jv_str(s.s.p + i, n - i)))
					return jj_oom(r, line);
				break;
			}
			while (j < n) {
				size_t adv;
				if (jj_is_space(jj_cp_at(s.s.p + j, n - j, &adv)))
					break;
				j += adv;
			}
			if (jv_list_push(r->a, out, jv_str(s.s.p + i, j - i)))
				return jj_oom(r, line);
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
			                    : jj_find(s.s.p + i, s.s.n - i, sep->s.p, sep->s.n);
			if (!h) {
				if (jv_list_push(r->a, out, jv_str(s.s.p + i, s.s.n - i)))
					return jj_oom(r, line);
				return 0;
			}
			size_t at = (size_t)(h - s.s.p);
			if (jv_list_push(r->a, out, jv_str(s.s.p + i, at - i)))
				return jj_oom(r, line);
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
				return jj_oom(r, line);
			break;
		}
		size_t at = (size_t)(h - s.s.p);
		if (jv_list_push(r->a, out, jv_str(h + sep->s.n, end - at - sep->s.n)))
			return jj_oom(r, line);
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

bool jj_is_str_method(int m) { return m <= M_INDEX; }
bool jj_is_list_method(int m)
{
	return m == M_INDEX || m == M_COUNT || (m >= M_APPEND && m <= M_REVERSE);
}
bool jj_is_dict_method(int m)
{
	return m == M_ITEMS || m == M_KEYS || m == M_VALUES || m == M_GET || m == M_POP ||
	       m == M_CLEAR || m == M_UPDATE || m == M_SETDEFAULT;
}

/* ---- a bound method, as getattr gives it -------------------------------- */

jv jj_method(struct rs *r, jv self, int m)
{
	jv *s = jj_alloc(r->a, sizeof(*s));
	if (!s)
		return jv_undef(NULL, 0);
	*s = self;
	jv v = {.t = JV_METHOD, .aux = (uint16_t)m};
	v.self = s;
	return v;
}

/* The tuple (a, b): an item of a mapping's items(). Invalid without memory. */
static jv pair(struct rs *r, jv a, jv b)
{
	jv t = jv_list_new(r->a, 2, JK_TUPLE);
	if (t.t == JV_LIST) {
		t.l->v[0] = a;
		t.l->v[1] = b;
		t.l->n = 2;
	}
	return t;
}

/* Arguments by position or name (Python's binding for filters and methods). */
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

static int need_str(struct rs *r, int line, jv v, const char *what)
{
	if (v.t == JV_STR)
		return 0;
	if (v.t == JV_UNDEF)
		return jj_undef_fail(r, line, v);
	return jj_rfail(r, line, BATON_EINVAL, "%s must be str, not %s", what, jv_type_name(v));
}

int jj_call_global(struct rs *r, int line, int g, const struct argv_ *a, jv *out)
{
	jv x;
	switch (g) {
	case G_RANGE: {
		int64_t v[3] = {0, 0, 1};
		if (a->nargs < 1 || a->nargs > 3 || a->nkw)
			return jj_rfail(r, line, BATON_EINVAL, "range() takes 1 to 3 integer arguments");
		for (size_t i = 0; i < a->nargs; i++)
			if (!jj_as_index(a->args[i], &v[a->nargs == 1 ? 1 : i]))
				return jj_rfail(r, line, BATON_EINVAL, "range() arguments must be integers");
		if (v[2] == 0)
			return jj_rfail(r, line, BATON_EINVAL, "range() arg 3 must not be zero");
		int64_t cnt = v[2] > 0 ? (v[1] > v[0] ? (v[1] - v[0] + v[2] - 1) / v[2] : 0)
		                       : (v[0] > v[1] ? (v[0] - v[1] - v[2] - 1) / -v[2] : 0);
		if (cnt > MAX_RANGE)
			return jj_rfail(r, line, BATON_ETOOBIG, "range() of more than %d items", MAX_RANGE);
		*out = jv_list_new(r->a, (size_t)cnt, JK_VIEW);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		for (int64_t i = 0; i < cnt; i++)
			out->l->v[i] = jv_int(v[0] + i * v[2]);
		out->l->n = (size_t)cnt;
		return 0;
	}
	case G_NAMESPACE:
	case G_DICT: {
		*out = jv_dict_new(r->a, g == G_NAMESPACE ? JV_NS : JV_DICT);
		if (out->t == JV_UNDEF)
			return jj_oom(r, line);
		if (a->nargs > 1 || (a->nargs == 1 && a->args[0].t != JV_DICT))
			return jj_rfail(r, line, BATON_EINVAL, "%s() takes a mapping or keyword arguments",
			             globals[g]);
		if (a->nargs)
			for (size_t i = 0; i < a->args[0].d->n; i++)
				if (jv_dict_set(r->a, out, a->args[0].d->k[i], a->args[0].d->v[i]))
					return jj_oom(r, line);
		for (size_t i = 0; i < a->nkw; i++)
			if (jv_dict_set(r->a, out, a->kwn[i], a->kwv[i]))
				return jj_oom(r, line);
		return 0;
	}
	case G_RAISE: {
		jv msg = jv_str("", 0);
		if (arg(a, 0, "message", &x) && jj_to_str(r, line, x, &msg))
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
			return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "strftime_now() takes a format");
		char fmt[256], buf[512];
		if (x.s.n >= sizeof(fmt))
			return jj_rfail(r, line, BATON_EINVAL, "strftime_now(): the format is too long");
		memcpy(fmt, x.s.p, x.s.n);
		fmt[x.s.n] = 0;
		time_t now = time(NULL);
		struct tm tm;
		localtime_r(&now, &tm);
		size_t n = strftime(buf, sizeof(buf), fmt, &tm);
		*out = jj_mkstr(r, line, buf, n);
		return r->rc;
	}
	}
	return jj_rfail(r, line, BATON_EINVAL, "unknown function");
}

int jj_call_method(struct rs *r, int line, jv self, int m, const struct argv_ *a, jv *out)
{
	jv x, y;
	int64_t k;
	if (m >= M_APPEND && m <= M_SETDEFAULT && !(m == M_POP && self.t != JV_LIST && self.t != JV_DICT))
		return jj_rfail(r, line, BATON_EINVAL, "access to attribute '%s' of '%s' object is unsafe.",
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
			if (arg(a, 1, "maxsplit", &y) && !jj_as_index(y, &k))
				return jj_rfail(r, line, BATON_EINVAL, "maxsplit must be an integer");
			return split(r, line, s, have ? &x : NULL, k, m == M_RSPLIT, out);
		}
		case M_STARTSWITH:
		case M_ENDSWITH: {
			if (!arg(a, 0, "prefix", &x))
				return jj_rfail(r, line, BATON_EINVAL, "%s() takes an argument", methods[m]);
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
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "replace() takes two strings");
			k = -1;
			if (a->nargs > 2 && !jj_as_index(a->args[2], &k))
				return jj_rfail(r, line, BATON_EINVAL, "replace's count must be an integer");
			*out = replace(r, line, s, x, y, k);
			return r->rc;
		case M_FIND:
		case M_RFIND:
		case M_INDEX:
		case M_COUNT: {
			if (!arg(a, 0, "sub", &x) || need_str(r, line, x, "the substring"))
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "%s() takes a string", methods[m]);
			if (a->nargs > 1)
				return jj_rfail(r, line, BATON_EUNSUPPORTED, "%s() with start/end is not supported", methods[m]);
			if (m == M_COUNT) {
				int64_t c = 0;
				if (x.s.n == 0)
					c = (int64_t)jj_utf8_count(s.s.p, s.s.n) + 1;
				else
					for (const char *p = s.s.p, *h; (h = jj_find(p, s.s.n - (size_t)(p - s.s.p), x.s.p, x.s.n));
					     p = h + x.s.n)
						c++;
				*out = jv_int(c);
				return 0;
			}
			const char *h = m == M_RFIND ? rfind(s.s.p, s.s.n, x.s.p, x.s.n) : jj_find(s.s.p, s.s.n, x.s.p, x.s.n);
			if (!h && m == M_INDEX)
				return jj_rfail(r, line, BATON_EINVAL, "substring not found");
			*out = jv_int(h ? (int64_t)jj_utf8_count(s.s.p, (size_t)(h - s.s.p)) : -1);
			return 0;
		}
		case M_JOIN: {
			jv items;
			if (!arg(a, 0, "iterable", &x) || jj_items_of(r, line, x, &items))
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "join() takes an iterable");
			struct tbuf b = {0};
			int rc = 0;
			for (size_t i = 0; i < items.l->n && !rc; i++) {
				if (items.l->v[i].t != JV_STR) {
					tx_tbuf_free(&b);
					return jj_rfail(r, line, BATON_EINVAL, "sequence item %zu: expected str instance, %s found", i,
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
				return jj_oom(r, line);
			}
			*out = jj_tbuf_str(r, line, &b);
			return r->rc;
		}
		case M_SPLITLINES: {
			*out = jv_list_new(r->a, 0, JK_LIST);
			if (out->t != JV_LIST)
				return jj_oom(r, line);
			size_t i = 0, st = 0, n = s.s.n;
			while (i < n) {
				char c = s.s.p[i];
				if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
					if (jv_list_push(r->a, out, jv_str(s.s.p + st, i - st)))
						return jj_oom(r, line);
					i += c == '\r' && i + 1 < n && s.s.p[i + 1] == '\n' ? 2 : 1;
					st = i;
				} else
					i++;
			}
			if (st < n && jv_list_push(r->a, out, jv_str(s.s.p + st, n - st)))
				return jj_oom(r, line);
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
				uint32_t c = jj_cp_at(s.s.p + i, s.s.n - i, &adv);
				if (c >= 0x80 && m != M_ISSPACE)
					return jj_rfail(r, line, BATON_EUNSUPPORTED, "%s() on non-ASCII text is not supported",
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
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "%s() takes a string", methods[m]);
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
			return jj_rfail(r, line, BATON_EINVAL, "%s() takes an argument", methods[m]);
		int64_t c = 0, at = -1;
		for (size_t i = 0; i < self.l->n; i++)
			if (jv_equal(self.l->v[i], x)) {
				c++;
				if (at < 0)
					at = (int64_t)i;
			}
		if (m == M_INDEX && at < 0)
			return jj_rfail(r, line, BATON_EINVAL, "value is not in list");
		*out = jv_int(m == M_INDEX ? at : c);
		return 0;
	}
	if (self.t == JV_DICT && self.kind && m == M_CYCLE) {
		jv *i0 = jv_dict_gets(&self, "index0", 6);
		if (!a->nargs)
			return jj_rfail(r, line, BATON_EINVAL, "no items for cycling given");
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
				return jj_oom(r, line);
			for (size_t i = 0; i < self.d->n; i++) {
				if (m == M_ITEMS) {
					jv t = pair(r, self.d->k[i], self.d->v[i]);
					if (t.t != JV_LIST)
						return jj_oom(r, line);
					out->l->v[i] = t;
				} else
					out->l->v[i] = m == M_KEYS ? self.d->k[i] : self.d->v[i];
			}
			out->l->n = self.d->n;
			return 0;
		case M_GET: {
			if (!arg(a, 0, "key", &x))
				return jj_rfail(r, line, BATON_EINVAL, "get() takes a key");
			jv *v = jv_dict_get(&self, x);
			*out = v ? *v : arg(a, 1, "default", &y) ? y : jv_none();
			return 0;
		}
		}
	}
	return jj_rfail(r, line, BATON_EINVAL, "'%s' object has no method '%s'", jv_type_name(self), methods[m]);
}

/* An attribute path ("a.b.0") of an item, as jinja2's make_attrgetter. */
static int attr_path(struct rs *r, int line, jv item, jv path, jv *out)
{
	if (path.t == JV_INT)
		return jj_getitem(r, line, item, path, out);
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
		if (jj_getitem(r, line, *out, digits ? jv_int(num) : key, out))
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
			return jj_rfail(c->r, c->line, BATON_EINVAL, "'<' not supported between instances of '%s' and '%s'",
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
		return jj_oom(r, line);
	for (size_t i = 0; i < n; i++)
		idx[i] = i;
	struct sortctx c = {r, line, keys, reverse};
	if (merge_sort(&c, idx, tmp, n))
		return r->rc;
	*out = jv_list_new(r->a, n, JK_LIST);
	if (out->t != JV_LIST)
		return jj_oom(r, line);
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
	if (jj_items_of(r, line, v, &items))
		return r->rc;
	size_t first = 0;
	if (attr) {
		if (!a->nargs)
			return jj_rfail(r, line, BATON_EINVAL, "%s needs an attribute", filters[id]);
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
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "the test '%.*s' is not supported",
			             (int)a->args[first].s.n, a->args[first].s.p);
		rest.args = a->args + first + 1;
		rest.nargs = a->nargs - first - 1;
	}
	*out = jv_list_new(r->a, 0, JK_GEN);
	if (out->t != JV_LIST)
		return jj_oom(r, line);
	for (size_t i = 0; i < items.l->n; i++) {
		jv x = items.l->v[i], y = x;
		if (attr && attr_path(r, line, x, path, &y))
			return r->rc;
		bool ok;
		if (test < 0)
			ok = jv_truthy(y);
		else if (jj_run_test(r, line, test, y, &rest, &ok))
			return r->rc;
		if (ok == want && jv_list_push(r->a, out, x))
			return jj_oom(r, line);
	}
	return 0;
}

int jj_run_filter(struct rs *r, int line, int id, jv v, const struct argv_ *a, jv *out)
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
		if (jj_len_of(r, line, v, &n))
			return r->rc;
		*out = jv_int(n);
		return 0;
	case F_STRING:
		return jj_to_str(r, line, v, out);
	case F_SAFE:
		if (v.t == JV_STR) {
			*out = v;
			return 0;
		}
		return jj_to_str(r, line, v, out);
	case F_UPPER:
	case F_LOWER:
	case F_CAPITALIZE:
	case F_TITLE:
		if (jj_to_str(r, line, v, &x))
			return r->rc;
		*out = case_map(r, line, x, id == F_LOWER ? 0 : id == F_UPPER ? 1 : id == F_CAPITALIZE ? 2 : 3);
		return r->rc;
	case F_TRIM: {
		if (jj_to_str(r, line, v, &x))
			return r->rc;
		bool have = arg(a, 0, "chars", &y) && y.t != JV_NONE;
		if (have && need_str(r, line, y, "trim's chars"))
			return r->rc;
		*out = strip(x, have ? &y : NULL, true, true);
		return 0;
	}
	case F_REPLACE: {
		if (jj_to_str(r, line, v, &x))
			return r->rc;
		jv o, nw;
		if (!arg(a, 0, "old", &o) || !arg(a, 1, "new", &nw) || jj_to_str(r, line, o, &o) || jj_to_str(r, line, nw, &nw))
			return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "replace takes old and new");
		int64_t cnt = -1;
		if (arg(a, 2, "count", &y) && y.t != JV_NONE && !jj_as_index(y, &cnt))
			return jj_rfail(r, line, BATON_EINVAL, "replace's count must be an integer");
		*out = replace(r, line, x, o, nw, cnt);
		return r->rc;
	}
	case F_ESCAPE:
	case F_E: {
		if (jj_to_str(r, line, v, &x))
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
			return jj_oom(r, line);
		}
		*out = jj_tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_TOJSON: {
		int indent = -1;
		const char *seps[2] = {NULL, NULL};
		char sepbuf[2][16];
		if (arg(a, 0, "ensure_ascii", &x) && jv_truthy(x))
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "tojson(ensure_ascii=True) is not supported");
		if (arg(a, 1, "indent", &x) && x.t != JV_NONE) {
			int64_t k;
			if (!jj_as_index(x, &k) || k < 0 || k > 64)
				return jj_rfail(r, line, BATON_EUNSUPPORTED, "tojson's indent must be a small integer");
			indent = (int)k;
		}
		if (arg(a, 2, "separators", &x) && x.t != JV_NONE) {
			if (x.t != JV_LIST || x.l->n != 2 || x.l->v[0].t != JV_STR || x.l->v[1].t != JV_STR ||
			    x.l->v[0].s.n >= 16 || x.l->v[1].s.n >= 16)
				return jj_rfail(r, line, BATON_EINVAL, "tojson's separators must be two short strings");
			for (int k = 0; k < 2; k++) {
				memcpy(sepbuf[k], x.l->v[k].s.p, x.l->v[k].s.n);
				sepbuf[k][x.l->v[k].s.n] = 0;
				seps[k] = sepbuf[k];
			}
		}
		if (arg(a, 3, "sort_keys", &x) && jv_truthy(x))
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "tojson(sort_keys=True) is not supported");
		struct tbuf b = {0};
		char e[300];
		int rc = jv_json_into(&b, v, indent, seps[0], seps[1], 0, e, sizeof(e));
		if (rc) {
			tx_tbuf_free(&b);
			return jj_rfail(r, line, rc, "%s", e);
		}
		*out = jj_tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_JOIN: {
		jv sep = jv_str("", 0), path;
		bool have_attr = arg(a, 1, "attribute", &path);
		if (arg(a, 0, "d", &x) && jj_to_str(r, line, x, &sep))
			return r->rc;
		if (jj_items_of(r, line, v, &items))
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
				return jj_rfail(r, line, rc, "%s", e);
			}
			if (b.n > MAX_OUT)
				break;
		}
		if (r->rc || rc) {
			tx_tbuf_free(&b);
			return r->rc ? r->rc : jj_oom(r, line);
		}
		*out = jj_tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_FIRST:
	case F_LAST:
		if (id == F_LAST && v.t == JV_LIST && v.kind == JK_GEN)
			return jj_rfail(r, line, BATON_EINVAL, "'generator' object is not reversible");
		if (v.t == JV_LIST && v.kind == JK_GEN) { /* next(): one item */
			*out = v.l->pos < v.l->n ? v.l->v[v.l->pos++] : jv_undef(NULL, 0);
			return 0;
		}
		if (jj_items_of(r, line, v, &items))
			return r->rc;
		*out = items.l->n ? items.l->v[id == F_FIRST ? 0 : items.l->n - 1] : jv_undef(NULL, 0);
		return 0;
	case F_LIST:
		if (jj_items_of(r, line, v, &items))
			return r->rc;
		*out = jv_list_new(r->a, items.l->n, JK_LIST);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		memcpy(out->l->v, items.l->v, items.l->n * sizeof(jv));
		out->l->n = items.l->n;
		return 0;
	case F_ITEMS:
		*out = jv_list_new(r->a, 0, JK_GEN);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		if (v.t == JV_UNDEF)
			return 0;
		if (v.t != JV_DICT || v.kind)
			return jj_rfail(r, line, BATON_EINVAL, "can only get item pairs from a mapping.");
		for (size_t i = 0; i < v.d->n; i++) {
			jv t = pair(r, v.d->k[i], v.d->v[i]);
			if (t.t != JV_LIST)
				return jj_oom(r, line);
			if (jv_list_push(r->a, out, t))
				return jj_oom(r, line);
		}
		return 0;
	case F_DICTSORT: {
		if (v.t != JV_DICT || v.kind)
			return jj_rfail(r, line, BATON_EINVAL, "dictsort needs a mapping");
		jv cs = jv_bool(false), by = jv_str("key", 3), rev = jv_bool(false);
		arg(a, 0, "case_sensitive", &cs);
		arg(a, 1, "by", &by);
		arg(a, 2, "reverse", &rev);
		bool by_value = by.t == JV_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5);
		items = jv_list_new(r->a, v.d->n, JK_LIST);
		jv *keys = jj_alloc(r->a, (v.d->n + 1) * sizeof(jv));
		if (items.t != JV_LIST || !keys)
			return jj_oom(r, line);
		for (size_t i = 0; i < v.d->n; i++) {
			jv t = pair(r, v.d->k[i], v.d->v[i]);
			if (t.t != JV_LIST)
				return jj_oom(r, line);
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
		if (jj_items_of(r, line, v, &items))
			return r->rc;
		jv *keys = jj_alloc(r->a, (items.l->n + 1) * sizeof(jv));
		if (!keys)
			return jj_oom(r, line);
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
				return jj_oom(r, line);
			for (size_t i = 0; i < items.l->n; i++) {
				bool seen = false;
				for (size_t j = 0; j < i && !seen; j++)
					seen = jv_equal(keys[i], keys[j]);
				if (!seen && jv_list_push(r->a, out, items.l->v[i]))
					return jj_oom(r, line);
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
				return jj_rfail(r, line, BATON_EINVAL, "values of these types cannot be ordered");
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
				return jj_oom(r, line);
			}
			*out = jj_tbuf_str(r, line, &b);
			return r->rc;
		}
		if (jj_items_of(r, line, v, &items))
			return r->rc;
		*out = jv_list_new(r->a, items.l->n, v.t == JV_LIST && v.kind == JK_GEN ? JK_LIST : JK_GEN);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		for (size_t i = 0; i < items.l->n; i++)
			out->l->v[i] = items.l->v[items.l->n - 1 - i];
		out->l->n = items.l->n;
		return 0;
	case F_MAP: {
		if (jj_items_of(r, line, v, &items))
			return r->rc;
		*out = jv_list_new(r->a, 0, JK_GEN);
		if (out->t != JV_LIST)
			return jj_oom(r, line);
		jv path, dflt;
		bool by_attr = arg(a, 99, "attribute", &path);
		bool have_dflt = arg(a, 99, "default", &dflt);
		int f = -1;
		struct argv_ rest = {0};
		if (!by_attr) {
			if (!a->nargs || need_str(r, line, a->args[0], "map's filter name"))
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "map needs a filter name or attribute=");
			f = jj_filter_id(a->args[0].s.p, a->args[0].s.n);
			if (f < 0)
				return jj_rfail(r, line, BATON_EUNSUPPORTED, "the filter '%.*s' is not supported",
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
			} else if (jj_run_filter(r, line, f, items.l->v[i], &rest, &y2))
				return r->rc;
			if (jv_list_push(r->a, out, y2))
				return jj_oom(r, line);
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
		if (jj_items_of(r, line, v, &items))
			return r->rc;
		for (size_t i = 0; i < items.l->n; i++) {
			jv k = items.l->v[i];
			if (path.t != JV_NONE && attr_path(r, line, k, path, &k))
				return r->rc;
			if (jj_arith(r, line, JO_ADD, acc, k, &acc))
				return r->rc;
		}
		*out = acc;
		return 0;
	}
	case F_ABS:
		if (v.t == JV_INT || v.t == JV_BOOL) {
			int64_t k = v.t == JV_BOOL ? v.b : v.i;
			if (k == INT64_MIN)
				return jj_rfail(r, line, BATON_ERANGE, "an integer outside 64 bits");
			*out = jv_int(k < 0 ? -k : k);
			return 0;
		}
		if (v.t == JV_FLOAT) {
			*out = jv_float(fabs(v.f));
			return 0;
		}
		return jj_rfail(r, line, BATON_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
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
				return jj_rfail(r, line, BATON_ERANGE, "an integer outside 64 bits");
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
		if (!jv_is_num(v) || !jj_as_index(prec, &p) || meth.t != JV_STR || p < 0 || p > 15)
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "round() of these arguments is not supported");
		double x0 = jv_num(v), sc = pow(10, (double)p), z;
		if (meth.s.n == 5 && !memcmp(meth.s.p, "floor", 5))
			z = floor(x0 * sc) / sc;
		else if (meth.s.n == 4 && !memcmp(meth.s.p, "ceil", 4))
			z = ceil(x0 * sc) / sc;
		else if (p == 0)
			z = nearbyint(x0);
		else
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "round(precision > 0) is not supported");
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
			if (!jj_as_index(w, &k) || k < 0 || k > 256)
				return jj_rfail(r, line, BATON_EINVAL, "indent's width must be a small integer");
			char *sp = jj_alloc(r->a, (size_t)k + 1);
			if (!sp)
				return jj_oom(r, line);
			memset(sp, ' ', (size_t)k);
			ind = jv_str(sp, (size_t)k);
		}
		if (jj_to_str(r, line, v, &x))
			return r->rc;
		/* jinja2: (s + "\n").splitlines(); the first line as it is, the
		 * others indented when not empty (all of them when blank), joined
		 * with "\n"; the indent in front too when first */
		jv t0 = jv_str("\n", 1), lines;
		struct argv_ none = {0};
		if (jj_arith(r, line, JO_ADD, x, t0, &x) || jj_call_method(r, line, x, M_SPLITLINES, &none, &lines))
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
			return jj_oom(r, line);
		}
		*out = jj_tbuf_str(r, line, &b);
		return r->rc;
	}
	case F_WORDCOUNT: {
		if (jj_to_str(r, line, v, &x))
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
	return jj_rfail(r, line, BATON_EINVAL, "unknown filter");
}

int jj_run_test(struct rs *r, int line, int id, jv v, const struct argv_ *a, bool *res)
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
		if (!jj_as_index(v, &k))
			return jj_rfail(r, line, BATON_EINVAL, "even/odd need an integer");
		*res = (k % 2 == 0) == (id == T_EVEN);
		return 0;
	case T_DIVISIBLEBY:
		if (!jj_as_index(v, &k) || !have || !jj_as_index(x, &m) || m == 0)
			return jj_rfail(r, line, BATON_EINVAL, "divisibleby needs integers (not zero)");
		*res = k % m == 0;
		return 0;
	case T_LOWER:
	case T_UPPER: {
		jv s;
		if (jj_to_str(r, line, v, &s))
			return r->rc;
		struct argv_ none = {0};
		jv out;
		if (jj_call_method(r, line, s, id == T_LOWER ? M_ISLOWER : M_ISUPPER, &none, &out))
			return r->rc;
		*res = out.b;
		return 0;
	}
	case T_SAMEAS:
		if (!have)
			return jj_rfail(r, line, BATON_EINVAL, "sameas needs an argument");
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
	case T_IN: return jj_contains(r, line, v, x, res);
	default: {
		static const int ops[] = {[T_EQ] = JO_EQ, [T_EQUALTO] = JO_EQ, [T_NE] = JO_NE, [T_LT] = JO_LT,
		                          [T_LE] = JO_LE, [T_GT] = JO_GT, [T_GE] = JO_GE, [T_GREATERTHAN] = JO_GT,
		                          [T_LESSTHAN] = JO_LT};
		if (!have)
			return jj_rfail(r, line, BATON_EINVAL, "the test '%s' needs an argument", tests[id]);
		return jj_compare(r, line, ops[id], v, x, res);
	}
	}
}
