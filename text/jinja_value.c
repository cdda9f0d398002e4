/*
 * jinja_value.c: the template engine's values with Python's semantics:
 * truth, equality and order, str() and repr(), json.dumps as transformers'
 * tojson calls it, and the arena they live in.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

struct jj_chunk {
	struct jj_chunk *next;
	size_t cap, used;
	max_align_t data[];
};

void *jj_alloc(struct jj_arena *a, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	if (!n)
		n = 16;
	struct jj_chunk *c = a->head;
	if (!c || c->cap - c->used < n) {
		size_t cap = n > 65536 ? n : 65536;
		if (a->limit && a->total + cap > a->limit)
			return NULL;
		c = malloc(sizeof(*c) + cap);
		if (!c)
			return NULL;
		c->cap = cap;
		c->used = 0;
		c->next = a->head;
		a->head = c;
		a->total += cap;
	}
	void *p = (char *)c->data + c->used;
	c->used += n;
	a->used += n;
	memset(p, 0, n);
	return p;
}

void jj_arena_free(struct jj_arena *a)
{
	for (struct jj_chunk *c = a->head, *next; c; c = next) {
		next = c->next;
		free(c);
	}
	a->head = NULL;
	a->used = a->total = 0;
}

jv jv_list_new(struct jj_arena *a, size_t cap, int kind)
{
	jv v = {.t = JV_LIST, .kind = (uint8_t)kind};
	if (!(v.l = jj_alloc(a, sizeof(*v.l))))
		return jv_undef(NULL, 0);
	if (!(v.l->v = jj_alloc(a, (cap ? cap : 1) * sizeof(jv))))
		return jv_undef(NULL, 0);
	v.l->cap = cap;
	return v;
}

int jv_list_push(struct jj_arena *a, jv *list, jv x)
{
	struct jj_list *l = list->l;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		jv *v = jj_alloc(a, cap * sizeof(jv));
		if (!v)
			return BATON_ENOMEM;
		if (l->n)
			memcpy(v, l->v, l->n * sizeof(jv));
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = x;
	return 0;
}

jv jv_dict_new(struct jj_arena *a, int type)
{
	jv v = {.t = (uint8_t)type};
	if (!(v.d = jj_alloc(a, sizeof(*v.d))))
		return jv_undef(NULL, 0);
	return v;
}

jv *jv_dict_get(const jv *dict, jv key)
{
	struct jj_dict *d = dict->d;
	for (size_t i = 0; i < d->n; i++)
		if (jv_equal(d->k[i], key))
			return &d->v[i];
	return NULL;
}

jv *jv_dict_gets(const jv *dict, const char *key, size_t n)
{
	struct jj_dict *d = dict->d;
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].t == JV_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, key, n))
			return &d->v[i];
	return NULL;
}

int jv_dict_set(struct jj_arena *a, jv *dict, jv key, jv val)
{
	jv *old = jv_dict_get(dict, key);
	if (old) {
		*old = val;
		return 0;
	}
	struct jj_dict *d = dict->d;
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 8;
		jv *k = jj_alloc(a, cap * sizeof(jv)), *v = jj_alloc(a, cap * sizeof(jv));
		if (!k || !v)
			return BATON_ENOMEM;
		if (d->n) {
			memcpy(k, d->k, d->n * sizeof(jv));
			memcpy(v, d->v, d->n * sizeof(jv));
		}
		d->k = k;
		d->v = v;
		d->cap = cap;
	}
	d->k[d->n] = key;
	d->v[d->n++] = val;
	return 0;
}

bool jv_truthy(jv v)
{
	switch (v.t) {
	case JV_UNDEF:
	case JV_NONE: return false;
	case JV_BOOL: return v.b;
	case JV_INT: return v.i != 0;
	case JV_FLOAT: return v.f != 0;
	case JV_STR: return v.s.n != 0;
	case JV_LIST: return v.kind == JK_GEN || v.l->n != 0;
	case JV_DICT: return v.kind || v.d->n != 0;
	default: return true;
	}
}

bool jv_is_num(jv v)
{
	return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}

double jv_num(jv v)
{
	return v.t == JV_FLOAT ? v.f : v.t == JV_INT ? (double)v.i : v.t == JV_BOOL ? v.b : 0;
}

static int64_t as_int(jv v) { return v.t == JV_BOOL ? v.b : v.i; }

bool jv_equal(jv a, jv b)
{
	if (jv_is_num(a) && jv_is_num(b)) {
		if (a.t == JV_FLOAT || b.t == JV_FLOAT)
			return jv_num(a) == jv_num(b);
		return as_int(a) == as_int(b);
	}
	if (a.t != b.t)
		return false;
	switch (a.t) {
	case JV_UNDEF:
	case JV_NONE: return true;
	case JV_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
	case JV_LIST:
		if ((a.kind == JK_TUPLE) != (b.kind == JK_TUPLE) || a.kind == JK_GEN || b.kind == JK_GEN)
			return a.l == b.l;
		if (a.l->n != b.l->n)
			return false;
		for (size_t i = 0; i < a.l->n; i++)
			if (!jv_equal(a.l->v[i], b.l->v[i]))
				return false;
		return true;
	case JV_DICT:
		if (a.d->n != b.d->n)
			return false;
		for (size_t i = 0; i < a.d->n; i++) {
			jv *o = jv_dict_get(&b, a.d->k[i]);
			if (!o || !jv_equal(a.d->v[i], *o))
				return false;
		}
		return true;
	case JV_NS: return a.d == b.d;
	case JV_MACRO: return a.mac == b.mac;
	default: return false;
	}
}

int jv_cmp(jv a, jv b, int *rc)
{
	*rc = 0;
	if (jv_is_num(a) && jv_is_num(b)) {
		if (a.t != JV_FLOAT && b.t != JV_FLOAT)
			return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
		double x = jv_num(a), y = jv_num(b);
		return x < y ? -1 : x > y;
	}
	if (a.t == JV_STR && b.t == JV_STR) {
		size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
		int c = memcmp(a.s.p, b.s.p, n);
		if (c)
			return c < 0 ? -1 : 1;
		return a.s.n < b.s.n ? -1 : a.s.n > b.s.n;
	}
	if (a.t == JV_LIST && b.t == JV_LIST && (a.kind == JK_TUPLE) == (b.kind == JK_TUPLE) &&
	    a.kind != JK_GEN && b.kind != JK_GEN) {
		size_t n = a.l->n < b.l->n ? a.l->n : b.l->n;
		for (size_t i = 0; i < n; i++) {
			if (jv_equal(a.l->v[i], b.l->v[i]))
				continue;
			return jv_cmp(a.l->v[i], b.l->v[i], rc);
		}
		return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
	}
	*rc = BATON_EINVAL;
	return 2;
}

const char *jv_type_name(jv v)
{
	switch (v.t) {
	case JV_UNDEF: return "Undefined";
	case JV_NONE: return "NoneType";
	case JV_BOOL: return "bool";
	case JV_INT: return "int";
	case JV_FLOAT: return "float";
	case JV_STR: return "str";
	case JV_LIST:
		return v.kind == JK_TUPLE ? "tuple" : v.kind == JK_GEN ? "generator" : v.kind == JK_VIEW ? "view" : "list";
	case JV_DICT: return "dict";
	case JV_NS: return "Namespace";
	case JV_MACRO: return "Macro";
	default: return "function";
	}
}

void jv_float_repr(double f, char *out, size_t cap)
{
	if (isnan(f)) {
		snprintf(out, cap, "nan");
		return;
	}
	if (isinf(f)) {
		snprintf(out, cap, f < 0 ? "-inf" : "inf");
		return;
	}
	char buf[64];
	int p;
	for (p = 0; p < 17; p++) {
		snprintf(buf, sizeof(buf), "%.*e", p, f);
		if (strtod(buf, NULL) == f)
			break;
	}
	/* buf: [-]d[.ddd]e[+-]XX */
	const char *s = buf;
	bool neg = *s == '-';
	if (neg)
		s++;
	char dig[32];
	size_t nd = 0;
	const char *e = strchr(s, 'e');
	for (const char *q = s; q < e; q++)
		if (*q != '.')
			dig[nd++] = *q;
	dig[nd] = 0;
	int exp = atoi(e + 1);
	char *o = out;
	size_t left = cap;
#define PUT(...)                                                                                     \
	do {                                                                                             \
		int k_ = snprintf(o, left, __VA_ARGS__);                                                     \
		if (k_ > 0 && (size_t)k_ < left) {                                                           \
			o += k_;                                                                                 \
			left -= (size_t)k_;                                                                      \
		}                                                                                            \
	} while (0)
	if (neg)
		PUT("-");
	if (exp >= -4 && exp < 16) {
		if (exp >= 0) {
			for (int i = 0; i <= exp; i++)
				PUT("%c", (size_t)i < nd ? dig[i] : '0');
			PUT(".");
			if ((size_t)exp + 1 < nd)
				PUT("%s", dig + exp + 1);
			else
				PUT("0");
		} else {
			PUT("0.");
			for (int i = 0; i < -exp - 1; i++)
				PUT("0");
			PUT("%s", dig);
		}
	} else {
		PUT("%c", dig[0]);
		if (nd > 1)
			PUT(".%s", dig + 1);
		PUT("e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
	}
#undef PUT
}

static int put(struct tbuf *b, const char *s)
{
	return tx_tbuf_put(b, s, strlen(s));
}

static int unprintable(struct tbuf *b, const char *err_what, char *err, size_t errlen)
{
	(void)b;
	return text_errf(err, errlen, BATON_EUNSUPPORTED, "printing %s is not supported", err_what);
}

static int repr_str(struct tbuf *b, const char *p, size_t n)
{
	bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
	char q = sq && !dq ? '"' : '\'';
	int rc = tx_tbuf_putc(b, q);
	for (size_t i = 0; i < n && !rc;) {
		unsigned char c = (unsigned char)p[i];
		size_t adv = 1;
		uint32_t cp = c;
		if (c >= 0x80) {
			cp = tx_utf8_decode((const unsigned char *)p + i, &adv);
		}
		char e[16];
		if (cp == '\\')
			rc = put(b, "\\\\");
		else if (cp == (uint32_t)q)
			rc = tx_tbuf_putc(b, '\\') | tx_tbuf_putc(b, q);
		else if (cp == '\n')
			rc = put(b, "\\n");
		else if (cp == '\r')
			rc = put(b, "\\r");
		else if (cp == '\t')
			rc = put(b, "\\t");
		else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
			snprintf(e, sizeof(e), "\\x%02x", cp);
			rc = put(b, e);
		} else
			rc = tx_tbuf_put(b, p + i, adv);
		i += adv;
	}
	return rc | tx_tbuf_putc(b, q);
}

int jv_repr_into(struct tbuf *b, jv v, char *err, size_t errlen)
{
	if (v.t == JV_STR)
		return repr_str(b, v.s.p, v.s.n);
	if (v.t == JV_UNDEF)
		return put(b, "Undefined");
	return jv_str_into(b, v, err, errlen);
}

int jv_str_into(struct tbuf *b, jv v, char *err, size_t errlen)
{
	char num[64];
	int rc = 0;
	switch (v.t) {
	case JV_UNDEF: return 0;
	case JV_NONE: return put(b, "None");
	case JV_BOOL: return put(b, v.b ? "True" : "False");
	case JV_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v.i);
		return put(b, num);
	case JV_FLOAT:
		jv_float_repr(v.f, num, sizeof(num));
		return put(b, num);
	case JV_STR: return tx_tbuf_put(b, v.s.p, v.s.n);
	case JV_LIST:
		if (v.kind == JK_GEN || v.kind == JK_VIEW)
			return unprintable(b, "a generator or a view (add |list)", err, errlen);
		rc = put(b, v.kind == JK_TUPLE ? "(" : "[");
		for (size_t i = 0; i < v.l->n && !rc; i++) {
			if (i)
				rc = put(b, ", ");
			if (!rc)
				rc = jv_repr_into(b, v.l->v[i], err, errlen);
		}
		if (!rc && v.kind == JK_TUPLE && v.l->n == 1)
			rc = put(b, ",");
		return rc ? rc : put(b, v.kind == JK_TUPLE ? ")" : "]");
	case JV_DICT:
		rc = put(b, "{");
		for (size_t i = 0; i < v.d->n && !rc; i++) {
			if (i)
				rc = put(b, ", ");
			if (!rc)
				rc = jv_repr_into(b, v.d->k[i], err, errlen);
			if (!rc)
				rc = put(b, ": ");
			if (!rc)
				rc = jv_repr_into(b, v.d->v[i], err, errlen);
		}
		return rc ? rc : put(b, "}");
	default: return unprintable(b, jv_type_name(v), err, errlen);
	}
}

static int json_str(struct tbuf *b, const char *p, size_t n)
{
	int rc = tx_tbuf_putc(b, '"');
	size_t run = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		unsigned char c = (unsigned char)p[i];
		const char *e = NULL;
		char u[8];
		if (c == '"')
			e = "\\\"";
		else if (c == '\\')
			e = "\\\\";
		else if (c == '\n')
			e = "\\n";
		else if (c == '\r')
			e = "\\r";
		else if (c == '\t')
			e = "\\t";
		else if (c == '\b')
			e = "\\b";
		else if (c == '\f')
			e = "\\f";
		else if (c < 0x20) {
			snprintf(u, sizeof(u), "\\u%04x", c);
			e = u;
		}
		if (!e)
			continue;
		rc = tx_tbuf_put(b, p + run, i - run) | put(b, e);
		run = i + 1;
	}
	return rc | tx_tbuf_put(b, p + run, n - run) | tx_tbuf_putc(b, '"');
}

static int json_nl(struct tbuf *b, int indent, int depth)
{
	int rc = tx_tbuf_putc(b, '\n');
	for (int i = 0; i < indent * depth && !rc; i++)
		rc = tx_tbuf_putc(b, ' ');
	return rc;
}

static int json_key(struct tbuf *b, jv k, char *err, size_t errlen)
{
	char num[64];
	switch (k.t) {
	case JV_STR: return json_str(b, k.s.p, k.s.n);
	case JV_NONE: return put(b, "\"null\"");
	case JV_BOOL: return put(b, k.b ? "\"true\"" : "\"false\"");
	case JV_INT: snprintf(num, sizeof(num), "\"%lld\"", (long long)k.i); return put(b, num);
	case JV_FLOAT:
		num[0] = '"';
		jv_float_repr(k.f, num + 1, sizeof(num) - 2);
		strcat(num, "\"");
		return put(b, num);
	default:
		return text_errf(err, errlen, BATON_EINVAL, "keys must be str, int, float, bool or None, not %s",
		                 jv_type_name(k));
	}
}

int jv_json_into(struct tbuf *b, jv v, int indent, const char *item_sep, const char *key_sep,
                 int depth, char *err, size_t errlen)
{
	if (depth > 200)
		return text_errf(err, errlen, BATON_EINVAL, "tojson: nesting too deep");
	if (!item_sep)
		item_sep = indent >= 0 ? "," : ", ";
	if (!key_sep)
		key_sep = ": ";
	char num[64];
	int rc = 0;
	switch (v.t) {
	case JV_NONE: return put(b, "null");
	case JV_BOOL: return put(b, v.b ? "true" : "false");
	case JV_INT:
		snprintf(num, sizeof(num), "%lld", (long long)v.i);
		return put(b, num);
	case JV_FLOAT:
		if (isnan(v.f))
			return put(b, "NaN");
		if (isinf(v.f))
			return put(b, v.f < 0 ? "-Infinity" : "Infinity");
		jv_float_repr(v.f, num, sizeof(num));
		return put(b, num);
	case JV_STR: return json_str(b, v.s.p, v.s.n);
	case JV_LIST:
		if (v.kind == JK_GEN || v.kind == JK_VIEW)
			break;
		if (!v.l->n)
			return put(b, "[]");
		rc = put(b, "[");
		for (size_t i = 0; i < v.l->n && !rc; i++) {
			if (i)
				rc = put(b, item_sep);
			if (!rc && indent >= 0)
				rc = json_nl(b, indent, depth + 1);
			if (!rc)
				rc = jv_json_into(b, v.l->v[i], indent, item_sep, key_sep, depth + 1, err, errlen);
		}
		if (!rc && indent >= 0)
			rc = json_nl(b, indent, depth);
		return rc ? rc : put(b, "]");
	case JV_DICT:
		if (!v.d->n)
			return put(b, "{}");
		rc = put(b, "{");
		for (size_t i = 0; i < v.d->n && !rc; i++) {
			if (i)
				rc = put(b, item_sep);
			if (!rc && indent >= 0)
				rc = json_nl(b, indent, depth + 1);
			if (!rc)
				rc = json_key(b, v.d->k[i], err, errlen);
			if (!rc)
				rc = put(b, key_sep);
			if (!rc)
				rc = jv_json_into(b, v.d->v[i], indent, item_sep, key_sep, depth + 1, err, errlen);
		}
		if (!rc && indent >= 0)
			rc = json_nl(b, indent, depth);
		return rc ? rc : put(b, "}");
	default: break;
	}
	return text_errf(err, errlen, BATON_EINVAL, "Object of type %s is not JSON serializable",
	                 jv_type_name(v));
}

size_t jj_utf8_count(const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xC0) != 0x80;
	return k;
}

size_t jj_utf8_offset(const char *s, size_t n, size_t cp)
{
	size_t i = 0;
	while (i < n && cp) {
		i++;
		while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
			i++;
		cp--;
	}
	return i;
}

bool jj_is_space(uint32_t c)
{
	return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}
