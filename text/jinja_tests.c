/*
 * jinja_tests.c: the tests (x is name: jj_run_test).
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

int jj_run_test(struct rs *r, int line, int id, jv v, const struct argv_ *a, bool *res)
{
	jv x = jv_undef(NULL, 0);
	bool have = jj_arg(a, 0, NULL, &x);
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
			return jj_rfail(r, line, BATON_EINVAL, "the test '%s' needs an argument", jj_test_names[id]);
		return jj_compare(r, line, ops[id], v, x, res);
	}
	}
}
