/*
 * jinja_globals.c: the global functions templates call: range, namespace,
 * dict, raise_exception, strftime_now (jj_call_global).
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
			             jj_global_names[g]);
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
		if (jj_arg(a, 0, "message", &x) && jj_to_str(r, line, x, &msg))
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
		if (!jj_arg(a, 0, "format", &x) || jj_need_str(r, line, x, "strftime_now's format"))
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
