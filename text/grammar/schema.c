/*
 * schema.c: a JSON schema (the subset grammar.h lists) compiled into a
 * grammar, and "any JSON object" (Qwen3-Coder's XML calls, which reuse its
 * value rules, are xml_calls.c's). Every keyword is either enforced,
 * an annotation, or refused with its JSON pointer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"
#include "text/grammar/schema_int.h"


int sc_fail(struct sc *c, int rc, const char *path, const char *fmt, const char *a)
{
	char msg[300];
	snprintf(msg, sizeof msg, fmt, a ? a : "");
	baton_errf(c->err, c->errlen, "%s: %s", path[0] ? path : "#", msg);
	return rc;
}

/* path + "/" + key, the key escaped as a JSON pointer wants (~0, ~1). */
void sc_sub_path(char *out, size_t cap, const char *path, const char *key)
{
	size_t n = (size_t)snprintf(out, cap, "%s/", path);
	for (const char *k = key; *k && n + 3 < cap; k++) {
		if (*k == '~')
			out[n++] = '~', out[n++] = '0';
		else if (*k == '/')
			out[n++] = '~', out[n++] = '1';
		else
			out[n++] = *k;
	}
	out[n < cap ? n : cap - 1] = '\0';
}

uint32_t sc_rule1(struct sc *c, struct gseq *s)
{
	uint32_t r = gb_rule(&c->b);
	gb_alt(&c->b, r, s);
	return r;
}

void sc_ws(struct sc *c, struct gseq *s)
{
	gs_rep(s, c->ws, 0, GB_WS_MAX);
}

/* ---- scalars ---- */
static uint32_t int_rule(struct sc *c)
{
	if (c->r_int != UINT32_MAX)
		return c->r_int;
	struct gseq s = {0};
	uint32_t u = gb_rule(&c->b);
	gs_byte(&s, '0');
	gb_alt(&c->b, u, &s);
	gs_set(&s, c->d19);
	gs_rep(&s, c->d09, 0, 18);
	gb_alt(&c->b, u, &s);
	uint32_t r = gb_rule(&c->b);
	gs_byte(&s, '-');
	gs_ref(&s, u);
	gb_alt(&c->b, r, &s);
	gs_ref(&s, u);
	gb_alt(&c->b, r, &s);
	gs_free(&s);
	return c->r_int = r;
}

static uint32_t num_rule(struct sc *c)
{
	if (c->r_num != UINT32_MAX)
		return c->r_num;
	struct gseq s = {0};
	uint32_t frac = gb_rule(&c->b), ex = gb_rule(&c->b), sign = gb_rule(&c->b);
	gs_byte(&s, '.');
	gs_rep(&s, c->d09, 1, 17);
	gb_alt(&c->b, frac, &s);
	gb_alt(&c->b, frac, &s); /* empty */
	gs_byte(&s, '+');
	gb_alt(&c->b, sign, &s);
	gs_byte(&s, '-');
	gb_alt(&c->b, sign, &s);
	gb_alt(&c->b, sign, &s);
	gs_set(&s, c->ee);
	gs_ref(&s, sign);
	gs_rep(&s, c->d09, 1, 2);
	gb_alt(&c->b, ex, &s);
	gb_alt(&c->b, ex, &s);
	gs_ref(&s, int_rule(c));
	gs_ref(&s, frac);
	gs_ref(&s, ex);
	c->r_num = sc_rule1(c, &s);
	gs_free(&s);
	return c->r_num;
}

static uint32_t str_rule(struct sc *c, uint32_t lo, uint32_t hi)
{
	if (lo == 0 && hi == UINT32_MAX && c->r_str != UINT32_MAX)
		return c->r_str;
	struct gseq s = {0};
	gs_byte(&s, '"');
	gs_str(&s, lo, hi);
	gs_byte(&s, '"');
	uint32_t r = sc_rule1(c, &s);
	gs_free(&s);
	if (lo == 0 && hi == UINT32_MAX)
		c->r_str = r;
	return r;
}

static uint32_t lit_rule(struct sc *c, const char *p)
{
	struct gseq s = {0};
	gs_lit(&s, p, strlen(p));
	uint32_t r = sc_rule1(c, &s);
	gs_free(&s);
	return r;
}

/* ---- free JSON, nested at most d deep ---- */
static uint32_t any_rule(struct sc *c, uint32_t d);

/* '{' ws ( '}' | KV TAIL '}' ), KV = key ws ':' ws VAL ws, TAIL = ',' ws KV TAIL | () */
static uint32_t map_rule(struct sc *c, uint32_t val)
{
	struct gseq s = {0};
	uint32_t kv = gb_rule(&c->b), tail = gb_rule(&c->b), obj = gb_rule(&c->b);
	gs_ref(&s, str_rule(c, 0, UINT32_MAX));
	sc_ws(c, &s);
	gs_byte(&s, ':');
	sc_ws(c, &s);
	gs_ref(&s, val);
	sc_ws(c, &s);
	gb_alt(&c->b, kv, &s);
	gs_byte(&s, ',');
	sc_ws(c, &s);
	gs_ref(&s, kv);
	gs_ref(&s, tail);
	gb_alt(&c->b, tail, &s);
	gb_alt(&c->b, tail, &s);
	gs_byte(&s, '{');
	sc_ws(c, &s);
	gs_byte(&s, '}');
	gb_alt(&c->b, obj, &s);
	gs_byte(&s, '{');
	sc_ws(c, &s);
	gs_ref(&s, kv);
	gs_ref(&s, tail);
	gs_byte(&s, '}');
	gb_alt(&c->b, obj, &s);
	gs_free(&s);
	return obj;
}

/* '[' ws ( ']' | ITEM ws (',' ws ITEM ws){lo-1, hi-1} ']' ) */
static uint32_t list_rule(struct sc *c, uint32_t item, uint32_t lo, uint32_t hi)
{
	struct gseq s = {0};
	uint32_t arr = gb_rule(&c->b);
	if (lo == 0) {
		gs_byte(&s, '[');
		sc_ws(c, &s);
		gs_byte(&s, ']');
		gb_alt(&c->b, arr, &s);
		if (hi == 0) {
			gs_free(&s);
			return arr;
		}
	}
	uint32_t first = lo ? lo : 1;
	uint32_t tail = gb_rule(&c->b);
	if (hi == UINT32_MAX) {
		gs_byte(&s, ',');
		sc_ws(c, &s);
		gs_ref(&s, item);
		sc_ws(c, &s);
		gs_ref(&s, tail);
		gb_alt(&c->b, tail, &s);
		gb_alt(&c->b, tail, &s);
	} else {
		/* hi - first optional items, each a rule of its own: opt_k = ',' ws ITEM ws opt_{k+1} | () */
		uint32_t next = gb_rule(&c->b);
		gb_alt(&c->b, next, &s); /* the last: empty */
		for (uint32_t k = first; k < hi && !c->b.oom; k++) {
			uint32_t o = gb_rule(&c->b);
			gs_byte(&s, ',');
			sc_ws(c, &s);
			gs_ref(&s, item);
			sc_ws(c, &s);
			gs_ref(&s, next);
			gb_alt(&c->b, o, &s);
			gb_alt(&c->b, o, &s);
			next = o;
		}
		gs_ref(&s, next);
		gb_alt(&c->b, tail, &s);
	}
	gs_byte(&s, '[');
	sc_ws(c, &s);
	for (uint32_t k = 0; k < first; k++) {
		if (k) {
			gs_byte(&s, ',');
			sc_ws(c, &s);
		}
		gs_ref(&s, item);
		sc_ws(c, &s);
	}
	gs_ref(&s, tail);
	gs_byte(&s, ']');
	gb_alt(&c->b, arr, &s);
	gs_free(&s);
	return arr;
}

static uint32_t any_rule(struct sc *c, uint32_t d)
{
	if (c->any[d] != UINT32_MAX)
		return c->any[d];
	uint32_t r = gb_rule(&c->b);
	c->any[d] = r;
	struct gseq s = {0};
	const char *lits[] = { "null", "true", "false" };
	for (int i = 0; i < 3; i++) {
		gs_lit(&s, lits[i], strlen(lits[i]));
		gb_alt(&c->b, r, &s);
	}
	gs_ref(&s, num_rule(c));
	gb_alt(&c->b, r, &s);
	gs_ref(&s, str_rule(c, 0, UINT32_MAX));
	gb_alt(&c->b, r, &s);
	if (d > 0) {
		uint32_t inner = any_rule(c, d - 1);
		gs_ref(&s, list_rule(c, inner, 0, UINT32_MAX));
		gb_alt(&c->b, r, &s);
		gs_ref(&s, map_rule(c, inner));
		gb_alt(&c->b, r, &s);
	}
	gs_free(&s);
	return r;
}

/* ---- schemas ---- */

static const char *const annotations[] = {
	"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
	"writeOnly", "$schema", "$defs", "definitions", NULL
};

int sc_is_annotation(const char *k)
{
	for (int i = 0; annotations[i]; i++)
		if (strcmp(k, annotations[i]) == 0)
			return 1;
	return 0;
}

static const char *const handled[] = {
	"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
	"minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "uniqueItems",
	"$id", "prefixItems", NULL
};

static int is_handled(const char *k)
{
	for (int i = 0; handled[i]; i++)
		if (strcmp(k, handled[i]) == 0)
			return 1;
	return 0;
}

/* The schema at a local reference, or NULL. */
static json_t *resolve(struct sc *c, const char *ref)
{
	if (strcmp(ref, "#") == 0)
		return c->root;
	if (strncmp(ref, "#/", 2) != 0)
		return NULL;
	json_t *at = c->root;
	const char *p = ref + 2;
	char key[256];
	while (at) {
		size_t n = 0;
		while (*p && *p != '/' && n + 1 < sizeof key) {
			if (p[0] == '~' && p[1] == '0')
				key[n++] = '~', p += 2;
			else if (p[0] == '~' && p[1] == '1')
				key[n++] = '/', p += 2;
			else
				key[n++] = *p++;
		}
		key[n] = '\0';
		if (*p && *p != '/')
			return NULL;
		if (json_is_object(at))
			at = json_object_get(at, key);
		else if (json_is_array(at)) {
			char *end;
			unsigned long i = strtoul(key, &end, 10);
			at = *end || !n ? NULL : json_array_get(at, i);
		} else
			return NULL;
		if (!*p)
			return at;
		p++;
	}
	return NULL;
}

/* A non-negative integer keyword into *v (absent: unchanged). */
int sc_count_kw(struct sc *c, json_t *s, const char *key, const char *path, uint32_t *v)
{
	json_t *x = json_object_get(s, key);
	if (!x)
		return 0;
	char p[512];
	sc_sub_path(p, sizeof p, path, key);
	if (!json_is_integer(x) || json_integer_value(x) < 0)
		return sc_fail(c, BATON_EINVAL, p, "want a non-negative integer%s", NULL);
	json_int_t n = json_integer_value(x);
	*v = n >= (json_int_t)UINT32_MAX ? UINT32_MAX - 1 : (uint32_t)n;
	return 0;
}

/* The JSON types a schema's values may have (T_*), for oneOf. */
static int types_of(struct sc *c, json_t *s, int depth)
{
	if (depth > MAX_REF_DEPTH || !json_is_object(s))
		return json_is_false(s) ? 0 : T_ALL;
	json_t *ref = json_object_get(s, "$ref");
	if (json_is_string(ref)) {
		json_t *t = resolve(c, json_string_value(ref));
		return t ? types_of(c, t, depth + 1) : T_ALL;
	}
	json_t *vals = json_object_get(s, "enum"), *cst = json_object_get(s, "const");
	if (cst || json_is_array(vals)) {
		int m = 0;
		size_t i;
		json_t *v;
		if (cst)
			vals = NULL;
		for (i = 0; cst ? i < 1 : i < json_array_size(vals); i++) {
			v = cst ? cst : json_array_get(vals, i);
			switch (json_typeof(v)) {
			case JSON_NULL: m |= T_NULL; break;
			case JSON_TRUE: case JSON_FALSE: m |= T_BOOL; break;
			case JSON_INTEGER: m |= T_INT; break;
			case JSON_REAL: m |= T_FRAC | T_INT; break;
			case JSON_STRING: m |= T_STR; break;
			case JSON_ARRAY: m |= T_ARR; break;
			case JSON_OBJECT: m |= T_OBJ; break;
			}
		}
		return m;
	}
	json_t *any = json_object_get(s, "anyOf");
	if (!any)
		any = json_object_get(s, "oneOf");
	if (json_is_array(any)) {
		int m = 0;
		for (size_t i = 0; i < json_array_size(any); i++)
			m |= types_of(c, json_array_get(any, i), depth + 1);
		return m;
	}
	json_t *all = json_object_get(s, "allOf");
	if (json_is_array(all) && json_array_size(all) == 1)
		return types_of(c, json_array_get(all, 0), depth + 1);
	json_t *t = json_object_get(s, "type");
	if (!t)
		return T_ALL;
	int m = 0;
	for (size_t i = 0; i < (json_is_array(t) ? json_array_size(t) : 1); i++) {
		json_t *x = json_is_array(t) ? json_array_get(t, i) : t;
		const char *n = json_is_string(x) ? json_string_value(x) : "";
		m |= !strcmp(n, "null") ? T_NULL : !strcmp(n, "boolean") ? T_BOOL :
		     !strcmp(n, "integer") ? T_INT : !strcmp(n, "number") ? T_INT | T_FRAC :
		     !strcmp(n, "string") ? T_STR : !strcmp(n, "array") ? T_ARR :
		     !strcmp(n, "object") ? T_OBJ : T_ALL;
	}
	return m;
}

static int only_values(json_t *s)
{
	if (!json_is_object(s))
		return 0;
	const char *k;
	json_t *v;
	int any = 0;
	json_object_foreach(s, k, v) {
		if (!strcmp(k, "enum") || !strcmp(k, "const"))
			any = 1;
		else if (!sc_is_annotation(k) && strcmp(k, "type"))
			return 0;
	}
	return any;
}

static int values_disjoint(json_t *a, json_t *b)
{
	json_t *ea = json_object_get(a, "enum"), *eb = json_object_get(b, "enum");
	json_t *ca = json_object_get(a, "const"), *cb = json_object_get(b, "const");
	size_t na = ca ? 1 : json_array_size(ea), nb = cb ? 1 : json_array_size(eb);
	for (size_t i = 0; i < na; i++)
		for (size_t j = 0; j < nb; j++)
			if (json_equal(ca ? ca : json_array_get(ea, i), cb ? cb : json_array_get(eb, j)))
				return 0;
	return 1;
}

/* The JSON type a value has, as a type name checks it. */
static int value_is(json_t *v, const char *type)
{
	if (!strcmp(type, "null")) return json_is_null(v);
	if (!strcmp(type, "boolean")) return json_is_boolean(v);
	if (!strcmp(type, "integer"))
		return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v));
	if (!strcmp(type, "number")) return json_is_number(v);
	if (!strcmp(type, "string")) return json_is_string(v);
	if (!strcmp(type, "array")) return json_is_array(v);
	if (!strcmp(type, "object")) return json_is_object(v);
	return 0;
}

static int values_rule(struct sc *c, json_t *s, const char *path, uint32_t *out)
{
	json_t *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
	json_t *type = json_object_get(s, "type");
	char p[512];
	const char *k;
	json_t *v;
	json_object_foreach(s, k, v)
		if (strcmp(k, "enum") && strcmp(k, "const") && strcmp(k, "type") && !sc_is_annotation(k)) {
			sc_sub_path(p, sizeof p, path, k);
			return sc_fail(c, BATON_EUNSUPPORTED, p, "\"%s\" beside enum or const is not supported", k);
		}
	if (en && !json_is_array(en)) {
		sc_sub_path(p, sizeof p, path, "enum");
		return sc_fail(c, BATON_EINVAL, p, "want an array%s", NULL);
	}
	uint32_t r = gb_rule(&c->b);
	struct gseq q = {0};
	size_t n = cst ? 1 : json_array_size(en), kept = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *x = cst ? cst : json_array_get(en, i);
		int ok = !type;
		for (size_t t = 0; type && t < (json_is_array(type) ? json_array_size(type) : 1); t++) {
			json_t *tn = json_is_array(type) ? json_array_get(type, t) : type;
			ok |= json_is_string(tn) && value_is(x, json_string_value(tn));
		}
		if (cst && en) { /* both: the const, if the enum holds it */
			int in = 0;
			for (size_t j = 0; j < json_array_size(en); j++)
				in |= json_equal(cst, json_array_get(en, j));
			ok &= in;
		}
		if (!ok)
			continue;
		char *lit = json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY);
		if (!lit) {
			gs_free(&q);
			return BATON_ENOMEM;
		}
		gs_lit(&q, lit, strlen(lit));
		free(lit);
		gb_alt(&c->b, r, &q);
		kept++;
	}
	gs_free(&q);
	if (!kept)
		return sc_fail(c, BATON_EINVAL, path, "no value of enum or const satisfies the schema%s", NULL);
	*out = r;
	return 0;
}

static int object_rule(struct sc *c, json_t *s, const char *path, uint32_t *out)
{
	json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
	json_t *addl = json_object_get(s, "additionalProperties");
	char p[512], q[512];
	if (props && !json_is_object(props)) {
		sc_sub_path(p, sizeof p, path, "properties");
		return sc_fail(c, BATON_EINVAL, p, "want an object%s", NULL);
	}
	if (req && !json_is_array(req)) {
		sc_sub_path(p, sizeof p, path, "required");
		return sc_fail(c, BATON_EINVAL, p, "want an array of strings%s", NULL);
	}
	for (size_t i = 0; i < json_array_size(req); i++) {
		json_t *x = json_array_get(req, i);
		sc_sub_path(p, sizeof p, path, "required");
		if (!json_is_string(x))
			return sc_fail(c, BATON_EINVAL, p, "want an array of strings%s", NULL);
		if (!json_object_get(props, json_string_value(x)))
			return sc_fail(c, BATON_EUNSUPPORTED, p, "\"%s\" is required but not in properties "
			    "(give it a schema there)", json_string_value(x));
	}
	if (addl && !json_is_boolean(addl) && !json_is_object(addl)) {
		sc_sub_path(p, sizeof p, path, "additionalProperties");
		return sc_fail(c, BATON_EINVAL, p, "want a boolean or a schema%s", NULL);
	}
	size_t n = json_object_size(props);
	if (n == 0) {
		if (json_is_false(addl)) {
			struct gseq s2 = {0};
			uint32_t r = gb_rule(&c->b);
			gs_byte(&s2, '{');
			sc_ws(c, &s2);
			gs_byte(&s2, '}');
			gb_alt(&c->b, r, &s2);
			gs_free(&s2);
			*out = r;
			return 0;
		}
		uint32_t val;
		if (json_is_object(addl)) {
			sc_sub_path(p, sizeof p, path, "additionalProperties");
			int rc = sc_compile(c, addl, p, &val);
			if (rc)
				return rc;
		} else
			val = any_rule(c, ANY_DEPTH - 1);
		*out = map_rule(c, val);
		return 0;
	}
	/* Declared properties, in order; only they (see grammar.h). first_i:
	 * none written yet; more_i: some written, so a comma first. */
	const char **keys = calloc(n, sizeof *keys);
	uint32_t *kv = calloc(n, sizeof *kv);
	int *need = calloc(n, sizeof *need);
	if (!keys || !kv || !need) {
		free(keys), free(kv), free(need);
		return BATON_ENOMEM;
	}
	const char *k;
	json_t *v;
	size_t i = 0;
	int rc = 0;
	sc_sub_path(q, sizeof q, path, "properties");
	json_object_foreach(props, k, v) {
		keys[i] = k;
		for (size_t j = 0; j < json_array_size(req); j++)
			need[i] |= strcmp(json_string_value(json_array_get(req, j)), k) == 0;
		uint32_t val;
		sc_sub_path(p, sizeof p, q, k);
		if ((rc = sc_compile(c, v, p, &val)) != 0)
			break;
		json_t *ks = json_string(k);
		char *lit = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
		json_decref(ks);
		if (!lit) {
			rc = BATON_ENOMEM;
			break;
		}
		struct gseq e = {0};
		gs_lit(&e, lit, strlen(lit));
		free(lit);
		sc_ws(c, &e);
		gs_byte(&e, ':');
		sc_ws(c, &e);
		gs_ref(&e, val);
		sc_ws(c, &e);
		kv[i] = sc_rule1(c, &e);
		gs_free(&e);
		i++;
	}
	if (!rc) {
		struct gseq e = {0};
		uint32_t first = gb_rule(&c->b), more = gb_rule(&c->b); /* index n: empty */
		gb_alt(&c->b, first, &e);
		gb_alt(&c->b, more, &e);
		for (size_t j = n; j-- > 0;) {
			uint32_t f = gb_rule(&c->b), m = gb_rule(&c->b);
			gs_ref(&e, kv[j]);
			gs_ref(&e, more);
			gb_alt(&c->b, f, &e);
			if (!need[j]) {
				gs_ref(&e, first);
				gb_alt(&c->b, f, &e);
			}
			gs_byte(&e, ',');
			sc_ws(c, &e);
			gs_ref(&e, kv[j]);
			gs_ref(&e, more);
			gb_alt(&c->b, m, &e);
			if (!need[j]) {
				gs_ref(&e, more);
				gb_alt(&c->b, m, &e);
			}
			first = f;
			more = m;
		}
		gs_byte(&e, '{');
		sc_ws(c, &e);
		gs_ref(&e, first);
		gs_byte(&e, '}');
		*out = sc_rule1(c, &e);
		gs_free(&e);
	}
	free(keys), free(kv), free(need);
	return rc;
}

/* A tuple: prefixItems[i] for item i, then items (false: no more; absent:
 * any), lo..hi items in all. after_i = (i >= lo ? () : nothing) |
 * sep ITEM_i ws after_{i+1}, unrolled to the last position that differs. */
static int tuple_rule(struct sc *c, json_t *s, json_t *prefix, const char *path, uint32_t lo,
    uint32_t hi, uint32_t *out)
{
	char p[512], q[512];
	size_t k = json_array_size(prefix);
	uint32_t *pr = calloc(k + 1, sizeof *pr);
	if (!pr)
		return BATON_ENOMEM;
	int rc = 0;
	sc_sub_path(q, sizeof q, path, "prefixItems");
	for (size_t i = 0; i < k && !rc; i++) {
		char num[24];
		snprintf(num, sizeof num, "%zu", i);
		sc_sub_path(p, sizeof p, q, num);
		rc = sc_compile(c, json_array_get(prefix, i), p, &pr[i]);
	}
	json_t *items = json_object_get(s, "items");
	int more = !json_is_false(items);
	uint32_t rest = 0;
	if (!rc && more) {
		sc_sub_path(p, sizeof p, path, "items");
		if (items && !json_is_true(items) && !json_is_object(items))
			rc = sc_fail(c, BATON_EINVAL, p, "want a schema or a boolean%s", NULL);
		else if (items && !json_is_true(items))
			rc = sc_compile(c, items, p, &rest);
		else
			rest = any_rule(c, ANY_DEPTH - 1);
	}
	if (!rc && !more && lo > k)
		rc = sc_fail(c, BATON_EINVAL, path, "minItems is above the prefixItems and items is false: no "
		    "array is valid%s", NULL);
	if (rc) {
		free(pr);
		return rc;
	}
	uint32_t last = hi != UINT32_MAX ? hi : (uint32_t)(k > lo ? k : lo);
	if (!more && last > k)
		last = (uint32_t)k;
	struct gseq e = {0};
	uint32_t next = gb_rule(&c->b);
	gb_alt(&c->b, next, &e); /* after the last position: the end, or ... */
	if (hi == UINT32_MAX && more) { /* ... more items of `items`, any number */
		gs_byte(&e, ',');
		sc_ws(c, &e);
		gs_ref(&e, rest);
		sc_ws(c, &e);
		gs_ref(&e, next);
		gb_alt(&c->b, next, &e);
	}
	for (uint32_t i = last; i-- > 0 && !c->b.oom;) {
		uint32_t r = gb_rule(&c->b);
		if (i >= lo)
			gb_alt(&c->b, r, &e);
		if (i) {
			gs_byte(&e, ',');
			sc_ws(c, &e);
		}
		gs_ref(&e, i < k ? pr[i] : rest);
		sc_ws(c, &e);
		gs_ref(&e, next);
		gb_alt(&c->b, r, &e);
		next = r;
	}
	gs_byte(&e, '[');
	sc_ws(c, &e);
	gs_ref(&e, next);
	gs_byte(&e, ']');
	*out = sc_rule1(c, &e);
	gs_free(&e);
	free(pr);
	return 0;
}

static int array_rule(struct sc *c, json_t *s, const char *path, uint32_t *out)
{
	uint32_t lo = 0, hi = UINT32_MAX;
	char p[512];
	int rc;
	if ((rc = sc_count_kw(c, s, "minItems", path, &lo)) || (rc = sc_count_kw(c, s, "maxItems", path, &hi)))
		return rc;
	json_t *maxi = json_object_get(s, "maxItems");
	if (!maxi)
		hi = UINT32_MAX;
	if (lo > hi)
		return sc_fail(c, BATON_EINVAL, path, "minItems is above maxItems: no array is valid%s", NULL);
	if (lo > MAX_UNROLL || (hi != UINT32_MAX && hi > MAX_UNROLL)) {
		sc_sub_path(p, sizeof p, path, lo > MAX_UNROLL ? "minItems" : "maxItems");
		return sc_fail(c, BATON_EUNSUPPORTED, p, "above 4096 is not supported%s", NULL);
	}
	json_t *prefix = json_object_get(s, "prefixItems");
	if (prefix) {
		sc_sub_path(p, sizeof p, path, "prefixItems");
		if (!json_is_array(prefix))
			return sc_fail(c, BATON_EINVAL, p, "want an array of schemas%s", NULL);
		if (json_array_size(prefix) > MAX_UNROLL)
			return sc_fail(c, BATON_EUNSUPPORTED, p, "more than 4096 is not supported%s", NULL);
		if (json_array_size(prefix))
			return tuple_rule(c, s, prefix, path, lo, hi, out);
	}
	json_t *items = json_object_get(s, "items");
	uint32_t item;
	if (json_is_false(items)) {
		if (lo > 0)
			return sc_fail(c, BATON_EINVAL, path, "items is false but minItems > 0: no array is valid%s", NULL);
		hi = 0;
		item = 0;
	} else if (items && !json_is_true(items)) {
		sc_sub_path(p, sizeof p, path, "items");
		if (!json_is_object(items))
			return sc_fail(c, BATON_EINVAL, p, "want a schema or a boolean (tuples: prefixItems)%s", NULL);
		if ((rc = sc_compile(c, items, p, &item)) != 0)
			return rc;
	} else
		item = any_rule(c, ANY_DEPTH - 1);
	*out = list_rule(c, item, lo, hi);
	return 0;
}

static int type_rule(struct sc *c, json_t *s, const char *type, const char *path, uint32_t *out)
{
	if (!strcmp(type, "null") || !strcmp(type, "boolean")) {
		if (type[0] == 'n') {
			*out = lit_rule(c, "null");
		} else {
			struct gseq q = {0};
			uint32_t r = gb_rule(&c->b);
			gs_lit(&q, "true", 4);
			gb_alt(&c->b, r, &q);
			gs_lit(&q, "false", 5);
			gb_alt(&c->b, r, &q);
			gs_free(&q);
			*out = r;
		}
		return 0;
	}
	if (!strcmp(type, "integer")) {
		*out = int_rule(c);
		return 0;
	}
	if (!strcmp(type, "number")) {
		*out = num_rule(c);
		return 0;
	}
	if (!strcmp(type, "string")) {
		uint32_t lo = 0, hi = UINT32_MAX;
		int rc;
		if ((rc = sc_count_kw(c, s, "minLength", path, &lo)) || (rc = sc_count_kw(c, s, "maxLength", path, &hi)))
			return rc;
		if (!json_object_get(s, "maxLength"))
			hi = UINT32_MAX;
		if (lo > hi)
			return sc_fail(c, BATON_EINVAL, path, "minLength is above maxLength: no string is valid%s", NULL);
		*out = str_rule(c, lo, hi);
		return 0;
	}
	if (!strcmp(type, "array") || !strcmp(type, "object")) {
		c->nest++;
		int rc = type[0] == 'a' ? array_rule(c, s, path, out) : object_rule(c, s, path, out);
		c->nest--;
		return rc;
	}
	char p[512];
	sc_sub_path(p, sizeof p, path, "type");
	return sc_fail(c, BATON_EINVAL, p, "unknown type \"%s\"", type);
}

static int ref_rule(struct sc *c, const char *ref, const char *path, uint32_t *out)
{
	char p[512];
	sc_sub_path(p, sizeof p, path, "$ref");
	for (size_t i = 0; i < c->n_memo; i++)
		if (strcmp(c->memo[i].ref, ref) == 0) {
			if (c->memo[i].open && c->memo[i].nest == c->nest)
				return sc_fail(c, BATON_EUNSUPPORTED, p, "\"%s\" refers back to itself before "
				    "any object or array: no document could end", ref);
			*out = c->memo[i].rule;
			return 0;
		}
	json_t *t = resolve(c, ref);
	if (!t)
		return sc_fail(c, strncmp(ref, "#", 1) ? BATON_EUNSUPPORTED : BATON_EINVAL, p,
		    strncmp(ref, "#", 1) ? "only local references (#, #/$defs/...) are supported, not "
		    "\"%s\"" : "\"%s\" points at nothing", ref);
	if (c->ref_depth > MAX_REF_DEPTH)
		return sc_fail(c, BATON_EUNSUPPORTED, p, "references nested too deep%s", NULL);
	if (c->n_memo == c->cap_memo) {
		size_t nc = c->cap_memo ? 2 * c->cap_memo : 16;
		struct memo *m = realloc(c->memo, nc * sizeof *m);
		if (!m)
			return BATON_ENOMEM;
		c->memo = m;
		c->cap_memo = nc;
	}
	uint32_t r = gb_rule(&c->b);
	char *dup = strdup(ref);
	if (!dup)
		return BATON_ENOMEM;
	size_t mi = c->n_memo;
	c->memo[c->n_memo++] = (struct memo){ dup, r, 1, c->nest };
	c->ref_depth++;
	uint32_t inner;
	int rc = sc_compile(c, t, ref, &inner);
	c->ref_depth--;
	c->memo[mi].open = 0;
	if (rc)
		return rc;
	struct gseq q = {0};
	gs_ref(&q, inner);
	gb_alt(&c->b, r, &q);
	gs_free(&q);
	*out = r;
	return 0;
}

/* Only annotations and $defs beside `kw`. */
static int alone(struct sc *c, json_t *s, const char *kw, const char *path)
{
	const char *k;
	json_t *v;
	char p[512];
	json_object_foreach(s, k, v)
		if (strcmp(k, kw) && !sc_is_annotation(k) && strcmp(k, "$id")) {
			sc_sub_path(p, sizeof p, path, k);
			return sc_fail(c, BATON_EUNSUPPORTED, p, "\"%s\" beside %s is not supported", k) ;
		}
	(void)kw;
	return 0;
}

int sc_compile(struct sc *c, json_t *s, const char *path, uint32_t *out)
{
	if (c->b.oom)
		return BATON_ENOMEM;
	if (json_is_true(s)) {
		*out = any_rule(c, ANY_DEPTH - 1);
		return 0;
	}
	if (json_is_false(s))
		return sc_fail(c, BATON_EINVAL, path, "the schema false admits no value%s", NULL);
	if (!json_is_object(s))
		return sc_fail(c, BATON_EINVAL, path, "a schema must be an object or a boolean%s", NULL);
	const char *k;
	json_t *v;
	char p[512];
	json_object_foreach(s, k, v) {
		if (sc_is_annotation(k))
			continue;
		sc_sub_path(p, sizeof p, path, k);
		if (!is_handled(k))
			return sc_fail(c, BATON_EUNSUPPORTED, p, "the keyword \"%s\" is not supported by "
			    "constrained decoding", k);
		if (!strcmp(k, "$id") && s != c->root)
			return sc_fail(c, BATON_EUNSUPPORTED, p, "$id below the root is not supported%s", NULL);
		if (!strcmp(k, "uniqueItems") && !json_is_false(v))
			return sc_fail(c, BATON_EUNSUPPORTED, p, "uniqueItems: true is not supported%s", NULL);
	}
	json_t *ref = json_object_get(s, "$ref");
	if (ref) {
		sc_sub_path(p, sizeof p, path, "$ref");
		if (!json_is_string(ref))
			return sc_fail(c, BATON_EINVAL, p, "want a string%s", NULL);
		int rc = alone(c, s, "$ref", path);
		return rc ? rc : ref_rule(c, json_string_value(ref), path, out);
	}
	json_t *all = json_object_get(s, "allOf");
	if (all) {
		sc_sub_path(p, sizeof p, path, "allOf");
		if (!json_is_array(all) || json_array_size(all) != 1)
			return sc_fail(c, BATON_EUNSUPPORTED, p, "allOf of more than one schema is not supported%s", NULL);
		int rc = alone(c, s, "allOf", path);
		sc_sub_path(p, sizeof p, p, "0");
		return rc ? rc : sc_compile(c, json_array_get(all, 0), p, out);
	}
	json_t *any = json_object_get(s, "anyOf");
	const char *anykw = "anyOf";
	if (!any && (any = json_object_get(s, "oneOf")) != NULL)
		anykw = "oneOf";
	if (any) {
		sc_sub_path(p, sizeof p, path, anykw);
		if (!json_is_array(any) || json_array_size(any) == 0)
			return sc_fail(c, BATON_EINVAL, p, "want a non-empty array of schemas%s", NULL);
		int rc = alone(c, s, anykw, path);
		if (rc)
			return rc;
		size_t n = json_array_size(any);
		if (anykw[0] == 'o')
			for (size_t i = 0; i < n; i++)
				for (size_t j = i + 1; j < n; j++) {
					json_t *a = json_array_get(any, i), *b = json_array_get(any, j);
					if (types_of(c, a, 0) & types_of(c, b, 0) &&
					    !(only_values(a) && only_values(b) && values_disjoint(a, b))) {
						char msg[80];
						snprintf(msg, sizeof msg, "%zu and %zu", i, j);
						return sc_fail(c, BATON_EUNSUPPORTED, p, "branches %s may match the same "
						    "value, which oneOf forbids; use anyOf, or branches of different "
						    "types", msg);
					}
				}
		uint32_t r = gb_rule(&c->b);
		struct gseq q = {0};
		for (size_t i = 0; i < n; i++) {
			char ip[512];
			char num[24];
			snprintf(num, sizeof num, "%zu", i);
			sc_sub_path(ip, sizeof ip, p, num);
			uint32_t br;
			if ((rc = sc_compile(c, json_array_get(any, i), ip, &br)) != 0) {
				gs_free(&q);
				return rc;
			}
			gs_ref(&q, br);
			gb_alt(&c->b, r, &q);
		}
		gs_free(&q);
		*out = r;
		return 0;
	}
	if (json_object_get(s, "enum") || json_object_get(s, "const"))
		return values_rule(c, s, path, out);

	json_t *type = json_object_get(s, "type");
	const char *types[8];
	size_t nt = 0;
	if (type) {
		sc_sub_path(p, sizeof p, path, "type");
		size_t n = json_is_array(type) ? json_array_size(type) : 1;
		if ((!json_is_string(type) && !json_is_array(type)) || n == 0 || n > 7)
			return sc_fail(c, BATON_EINVAL, p, "want a type name or a list of them%s", NULL);
		for (size_t i = 0; i < n; i++) {
			json_t *x = json_is_array(type) ? json_array_get(type, i) : type;
			if (!json_is_string(x))
				return sc_fail(c, BATON_EINVAL, p, "want a type name or a list of them%s", NULL);
			types[nt++] = json_string_value(x);
		}
	} else {
		/* No type: the types the keywords speak of (a subset of what is valid), else any. */
		if (json_object_get(s, "properties") || json_object_get(s, "required") ||
		    json_object_get(s, "additionalProperties"))
			types[nt++] = "object";
		if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems") ||
		    json_object_get(s, "prefixItems"))
			types[nt++] = "array";
		if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
			types[nt++] = "string";
		if (nt == 0) {
			*out = any_rule(c, ANY_DEPTH - 1);
			return 0;
		}
	}
	if (nt == 1)
		return type_rule(c, s, types[0], path, out);
	uint32_t r = gb_rule(&c->b);
	struct gseq q = {0};
	for (size_t i = 0; i < nt; i++) {
		uint32_t tr;
		int rc = type_rule(c, s, types[i], path, &tr);
		if (rc) {
			gs_free(&q);
			return rc;
		}
		gs_ref(&q, tr);
		gb_alt(&c->b, r, &q);
	}
	gs_free(&q);
	*out = r;
	return 0;
}

void sc_init(struct sc *c, char *err, size_t errlen)
{
	memset(c, 0, sizeof *c);
	gb_init(&c->b);
	c->err = err;
	c->errlen = errlen;
	for (uint32_t i = 0; i <= ANY_DEPTH; i++)
		c->any[i] = UINT32_MAX;
	c->r_num = c->r_int = c->r_str = UINT32_MAX;
	c->ws = gb_set_range(&c->b, "  \t\t\n\n\r\r");
	c->d09 = gb_set_range(&c->b, "09");
	c->d19 = gb_set_range(&c->b, "19");
	c->ee = gb_set_range(&c->b, "eeEE");
}

int sc_finish(struct sc *c, int rc, uint32_t value, gram **out)
{
	if (!rc) {
		/* root = ws VALUE ws */
		struct gseq q = {0};
		sc_ws(c, &q);
		gs_ref(&q, value);
		sc_ws(c, &q);
		uint32_t root = sc_rule1(c, &q);
		gs_free(&q);
		rc = c->b.oom ? (c->b.n_el + 64 > GB_MAX_ELEMENTS ? BATON_EUNSUPPORTED : BATON_ENOMEM) : 0;
		if (rc == BATON_EUNSUPPORTED)
			baton_errf(c->err, c->errlen, "#: the schema makes a grammar too large");
		if (!rc)
			rc = gb_finish(&c->b, root, out);
	}
	for (size_t i = 0; i < c->n_memo; i++)
		free(c->memo[i].ref);
	free(c->memo);
	gb_free(&c->b);
	return rc;
}

int gram_compile_schema(gram **out, json_t *schema, char *err, size_t errlen)
{
	*out = NULL;
	struct sc c;
	sc_init(&c, err, errlen);
	c.root = schema;
	uint32_t v = 0;
	int rc = sc_compile(&c, schema, "#", &v);
	if (!rc && c.b.oom)
		rc = c.b.n_el + 64 > GB_MAX_ELEMENTS ? BATON_EUNSUPPORTED : BATON_ENOMEM;
	if (rc == BATON_EUNSUPPORTED && c.b.oom)
		baton_errf(err, errlen, "#: the schema makes a grammar too large");
	return sc_finish(&c, rc, v, out);
}

int gram_compile_json_object(gram **out, char *err, size_t errlen)
{
	*out = NULL;
	struct sc c;
	sc_init(&c, err, errlen);
	uint32_t v = map_rule(&c, any_rule(&c, ANY_DEPTH - 1));
	return sc_finish(&c, 0, v, out);
}
