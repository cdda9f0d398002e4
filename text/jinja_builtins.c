/*
 * jinja_builtins.c: the built-in library's names and ids (filters, tests,
 * methods, globals: the name -> id tables the parser and renderer look up),
 * method binding, and the argument helpers the built-ins share (jj_arg,
 * jj_need_str, jj_pair). The built-ins themselves are in jinja_filters.c,
 * jinja_tests.c, jinja_methods.c and jinja_globals.c; the string helpers in
 * jinja_strings.c. Evaluation, statements and the public door are in
 * jinja_eval.c.
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

/* ---- names of filters, tests, methods, globals ------------------------- */

const char *const jj_filter_names[] = {
    "abs", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
    "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount", NULL,
};

const char *const jj_test_names[] = {
    "defined", "undefined", "none", "string", "mapping", "iterable", "sequence", "number",
    "integer", "float", "boolean", "true", "false", "even", "odd", "divisibleby", "eq",
    "equalto", "ne", "lt", "le", "gt", "ge", "greaterthan", "lessthan", "in", "lower", "upper",
    "callable", "sameas", NULL,
};

const char *const jj_method_names[] = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "lower", "upper",
    "replace", "title", "capitalize", "find", "rfind", "count", "join", "splitlines", "isdigit",
    "isalpha", "isalnum", "isspace", "isupper", "islower", "removeprefix", "removesuffix",
    "index", "items", "keys", "values", "get", "cycle", "append", "pop", "insert", "extend",
    "remove", "clear", "sort", "reverse", "update", "setdefault", NULL,
};

const char *const jj_global_names[] = {"range", "namespace", "dict", "raise_exception",
                                      "strftime_now", NULL};
static const char *const globals_missing[] = {"joiner", "cycler", "lipsum", NULL};

static int lookup(const char *const *t, const char *s, size_t n)
{
	for (int i = 0; t[i]; i++)
		if (strlen(t[i]) == n && !memcmp(t[i], s, n))
			return i;
	return -1;
}

int jj_filter_id(const char *s, size_t n) { return lookup(jj_filter_names, s, n); }
int jj_test_id(const char *s, size_t n) { return lookup(jj_test_names, s, n); }
int jj_method_id(const char *s, size_t n) { return lookup(jj_method_names, s, n); }

int jj_global_id(const char *s, size_t n)
{
	int g = lookup(jj_global_names, s, n);
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
jv jj_pair(struct rs *r, jv a, jv b)
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
bool jj_arg(const struct argv_ *a, size_t pos, const char *name, jv *out)
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

int jj_need_str(struct rs *r, int line, jv v, const char *what)
{
	if (v.t == JV_STR)
		return 0;
	if (v.t == JV_UNDEF)
		return jj_undef_fail(r, line, v);
	return jj_rfail(r, line, BATON_EINVAL, "%s must be str, not %s", what, jv_type_name(v));
}
