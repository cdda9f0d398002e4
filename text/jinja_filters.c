/*
 * jinja_filters.c: the filters (x | name: jj_run_filter), with the helpers
 * only they use: attribute paths, stable sorting, select/reject.
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

/* An attribute path ("a.b.0") of an item, as jinja2's make_attrgetter. */
static int attr_path(struct rs *r, int line, jv item, jv path, jv *out)
{
	if (path.t == JV_INT)
		return jj_getitem(r, line, item, path, out);
	if (jj_need_str(r, line, path, "the attribute"))
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
		return jj_case_map(r, line, v, 0);
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
			return jj_rfail(r, line, BATON_EINVAL, "%s needs an attribute", jj_filter_names[id]);
		path = a->args[0];
		first = 1;
	}
	int test = -1;
	struct argv_ rest = {0};
	if (a->nargs > first) {
		if (jj_need_str(r, line, a->args[first], "the test name"))
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
		jj_arg(a, 0, "default_value", &d);
		jj_arg(a, 1, "boolean", &b);
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
		*out = jj_case_map(r, line, x, id == F_LOWER ? 0 : id == F_UPPER ? 1 : id == F_CAPITALIZE ? 2 : 3);
		return r->rc;
	case F_TRIM: {
		if (jj_to_str(r, line, v, &x))
			return r->rc;
		bool have = jj_arg(a, 0, "chars", &y) && y.t != JV_NONE;
		if (have && jj_need_str(r, line, y, "trim's chars"))
			return r->rc;
		*out = jj_strip(x, have ? &y : NULL, true, true);
		return 0;
	}
	case F_REPLACE: {
		if (jj_to_str(r, line, v, &x))
			return r->rc;
		jv o, nw;
		if (!jj_arg(a, 0, "old", &o) || !jj_arg(a, 1, "new", &nw) || jj_to_str(r, line, o, &o) || jj_to_str(r, line, nw, &nw))
			return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "replace takes old and new");
		int64_t cnt = -1;
		if (jj_arg(a, 2, "count", &y) && y.t != JV_NONE && !jj_as_index(y, &cnt))
			return jj_rfail(r, line, BATON_EINVAL, "replace's count must be an integer");
		*out = jj_replace(r, line, x, o, nw, cnt);
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
		if (jj_arg(a, 0, "ensure_ascii", &x) && jv_truthy(x))
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "tojson(ensure_ascii=True) is not supported");
		if (jj_arg(a, 1, "indent", &x) && x.t != JV_NONE) {
			int64_t k;
			if (!jj_as_index(x, &k) || k < 0 || k > 64)
				return jj_rfail(r, line, BATON_EUNSUPPORTED, "tojson's indent must be a small integer");
			indent = (int)k;
		}
		if (jj_arg(a, 2, "separators", &x) && x.t != JV_NONE) {
			if (x.t != JV_LIST || x.l->n != 2 || x.l->v[0].t != JV_STR || x.l->v[1].t != JV_STR ||
			    x.l->v[0].s.n >= 16 || x.l->v[1].s.n >= 16)
				return jj_rfail(r, line, BATON_EINVAL, "tojson's separators must be two short strings");
			for (int k = 0; k < 2; k++) {
				memcpy(sepbuf[k], x.l->v[k].s.p, x.l->v[k].s.n);
				sepbuf[k][x.l->v[k].s.n] = 0;
				seps[k] = sepbuf[k];
			}
		}
		if (jj_arg(a, 3, "sort_keys", &x) && jv_truthy(x))
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
		bool have_attr = jj_arg(a, 1, "attribute", &path);
		if (jj_arg(a, 0, "d", &x) && jj_to_str(r, line, x, &sep))
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
			jv t = jj_pair(r, v.d->k[i], v.d->v[i]);
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
		jj_arg(a, 0, "case_sensitive", &cs);
		jj_arg(a, 1, "by", &by);
		jj_arg(a, 2, "reverse", &rev);
		bool by_value = by.t == JV_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5);
		items = jv_list_new(r->a, v.d->n, JK_LIST);
		jv *keys = jj_alloc(r->a, (v.d->n + 1) * sizeof(jv));
		if (items.t != JV_LIST || !keys)
			return jj_oom(r, line);
		for (size_t i = 0; i < v.d->n; i++) {
			jv t = jj_pair(r, v.d->k[i], v.d->v[i]);
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
			jj_arg(a, 0, "reverse", &rev);
			jj_arg(a, 1, "case_sensitive", &cs);
			jj_arg(a, 2, "attribute", &path);
		} else {
			jj_arg(a, 0, "case_sensitive", &cs);
			jj_arg(a, 1, "attribute", &path);
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
		bool by_attr = jj_arg(a, 99, "attribute", &path);
		bool have_dflt = jj_arg(a, 99, "default", &dflt);
		int f = -1;
		struct argv_ rest = {0};
		if (!by_attr) {
			if (!a->nargs || jj_need_str(r, line, a->args[0], "map's filter name"))
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
		jj_arg(a, 0, "attribute", &path);
		jj_arg(a, 1, "start", &acc);
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
		jj_arg(a, 0, "default", &d);
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
			jv t = jj_strip(v, NULL, true, true);
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
		jj_arg(a, 0, "precision", &prec);
		jj_arg(a, 1, "method", &meth);
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
		jj_arg(a, 0, "width", &w);
		jj_arg(a, 1, "first", &fst);
		jj_arg(a, 2, "blank", &blank);
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
