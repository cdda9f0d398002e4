/*
 * jinja_methods.c: the methods of str, list and dict values
 * (s.split(), d.items(), l.append()...: jj_call_method).
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

int jj_call_method(struct rs *r, int line, jv self, int m, const struct argv_ *a, jv *out)
{
	jv x, y;
	int64_t k;
	if (m >= M_APPEND && m <= M_SETDEFAULT && !(m == M_POP && self.t != JV_LIST && self.t != JV_DICT))
		return jj_rfail(r, line, BATON_EINVAL, "access to attribute '%s' of '%s' object is unsafe.",
		             jj_method_names[m], jv_type_name(self));
	if (self.t == JV_STR) {
		jv s = self;
		switch (m) {
		case M_STRIP:
		case M_LSTRIP:
		case M_RSTRIP: {
			bool have = jj_arg(a, 0, "chars", &x) && x.t != JV_NONE;
			if (have && jj_need_str(r, line, x, "strip's argument"))
				return r->rc;
			*out = jj_strip(s, have ? &x : NULL, m != M_RSTRIP, m != M_LSTRIP);
			return 0;
		}
		case M_SPLIT:
		case M_RSPLIT: {
			bool have = jj_arg(a, 0, "sep", &x) && x.t != JV_NONE;
			if (have && jj_need_str(r, line, x, "split's separator"))
				return r->rc;
			k = -1;
			if (jj_arg(a, 1, "maxsplit", &y) && !jj_as_index(y, &k))
				return jj_rfail(r, line, BATON_EINVAL, "maxsplit must be an integer");
			return jj_split(r, line, s, have ? &x : NULL, k, m == M_RSPLIT, out);
		}
		case M_STARTSWITH:
		case M_ENDSWITH: {
			if (!jj_arg(a, 0, "prefix", &x))
				return jj_rfail(r, line, BATON_EINVAL, "%s() takes an argument", jj_method_names[m]);
			jv one[1] = {x};
			jv *cands = one;
			size_t nc = 1;
			if (x.t == JV_LIST && x.kind == JK_TUPLE) {
				cands = x.l->v;
				nc = x.l->n;
			}
			*out = jv_bool(false);
			for (size_t i = 0; i < nc; i++) {
				if (jj_need_str(r, line, cands[i], "the prefix"))
					return r->rc;
				jv c = cands[i];
				if (c.s.n <= s.s.n && !memcmp(m == M_STARTSWITH ? s.s.p : s.s.p + s.s.n - c.s.n, c.s.p, c.s.n))
					*out = jv_bool(true);
			}
			return 0;
		}
		case M_LOWER: *out = jj_case_map(r, line, s, 0); return r->rc;
		case M_UPPER: *out = jj_case_map(r, line, s, 1); return r->rc;
		case M_CAPITALIZE: *out = jj_case_map(r, line, s, 2); return r->rc;
		case M_TITLE: *out = jj_case_map(r, line, s, 3); return r->rc;
		case M_REPLACE:
			if (!jj_arg(a, 0, "old", &x) || !jj_arg(a, 1, "new", &y) || jj_need_str(r, line, x, "replace's old") ||
			    jj_need_str(r, line, y, "replace's new"))
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "replace() takes two strings");
			k = -1;
			if (a->nargs > 2 && !jj_as_index(a->args[2], &k))
				return jj_rfail(r, line, BATON_EINVAL, "replace's count must be an integer");
			*out = jj_replace(r, line, s, x, y, k);
			return r->rc;
		case M_FIND:
		case M_RFIND:
		case M_INDEX:
		case M_COUNT: {
			if (!jj_arg(a, 0, "sub", &x) || jj_need_str(r, line, x, "the substring"))
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "%s() takes a string", jj_method_names[m]);
			if (a->nargs > 1)
				return jj_rfail(r, line, BATON_EUNSUPPORTED, "%s() with start/end is not supported", jj_method_names[m]);
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
			const char *h = m == M_RFIND ? jj_rfind(s.s.p, s.s.n, x.s.p, x.s.n) : jj_find(s.s.p, s.s.n, x.s.p, x.s.n);
			if (!h && m == M_INDEX)
				return jj_rfail(r, line, BATON_EINVAL, "substring not found");
			*out = jv_int(h ? (int64_t)jj_utf8_count(s.s.p, (size_t)(h - s.s.p)) : -1);
			return 0;
		}
		case M_JOIN: {
			jv items;
			if (!jj_arg(a, 0, "iterable", &x) || jj_items_of(r, line, x, &items))
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
					             jj_method_names[m]);
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
			if (!jj_arg(a, 0, "prefix", &x) || jj_need_str(r, line, x, "the affix"))
				return r->rc ? r->rc : jj_rfail(r, line, BATON_EINVAL, "%s() takes a string", jj_method_names[m]);
			*out = s;
			if (x.s.n <= s.s.n && m == M_REMOVEPREFIX && !memcmp(s.s.p, x.s.p, x.s.n))
				*out = jv_str(s.s.p + x.s.n, s.s.n - x.s.n);
			if (x.s.n <= s.s.n && m == M_REMOVESUFFIX && !memcmp(s.s.p + s.s.n - x.s.n, x.s.p, x.s.n))
				*out = jv_str(s.s.p, s.s.n - x.s.n);
			return 0;
		}
	}
	if (self.t == JV_LIST && (m == M_INDEX || m == M_COUNT)) {
		if (!jj_arg(a, 0, "value", &x))
			return jj_rfail(r, line, BATON_EINVAL, "%s() takes an argument", jj_method_names[m]);
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
					jv t = jj_pair(r, self.d->k[i], self.d->v[i]);
					if (t.t != JV_LIST)
						return jj_oom(r, line);
					out->l->v[i] = t;
				} else
					out->l->v[i] = m == M_KEYS ? self.d->k[i] : self.d->v[i];
			}
			out->l->n = self.d->n;
			return 0;
		case M_GET: {
			if (!jj_arg(a, 0, "key", &x))
				return jj_rfail(r, line, BATON_EINVAL, "get() takes a key");
			jv *v = jv_dict_get(&self, x);
			*out = v ? *v : jj_arg(a, 1, "default", &y) ? y : jv_none();
			return 0;
		}
		}
	}
	return jj_rfail(r, line, BATON_EINVAL, "'%s' object has no method '%s'", jv_type_name(self), jj_method_names[m]);
}
