/*
 * grammar_test.c: the schema compiler and the matcher.
 *
 * Random schemas (of the keywords the compiler takes), random documents
 * valid for them (written as the grammar writes them: properties in order,
 * short whitespace), and single-byte mutants of those: the matcher must
 * accept exactly the documents an independent check accepts (jansson's
 * parser and a small validator below, of the same subset). The token
 * mask must equal a brute-force check of every token, and sampling with
 * random logits under the mask must give documents that parse and
 * validate. Refusals name the keyword's JSON pointer. text_token_bytes
 * agrees with the decoder on the fixture tokenizers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "proto/base/base.h"
#include "tests/t.h"
#include "text/grammar/grammar.h"

/* ---- a PRNG ---- */
static uint64_t rs = 88172645463325252ull;
static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}
static unsigned rn(unsigned n)
{
	return (unsigned)(rnd() % n);
}

/* ---- a growing buffer ---- */
struct buf {
	char *p;
	size_t n, cap;
};
static void put(struct buf *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->cap = (b->n + n + 1) * 2;
		b->p = realloc(b->p, b->cap);
		T_ASSERT(b->p);
	}
	memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}
static void puts_(struct buf *b, const char *s)
{
	put(b, s, strlen(s));
}

/* ---- random schemas ---- */
static json_t *defs; /* the root's $defs while generating */
static unsigned n_defs;

static json_t *gen_schema(int depth);

static json_t *gen_scalar_enum(void)
{
	json_t *a = json_array();
	unsigned n = 1 + rn(4);
	for (unsigned i = 0; i < n; i++) {
		json_t *v;
		switch (rn(4)) {
		case 0: { char s[16]; snprintf(s, sizeof s, "v%u", rn(50)); v = json_string(s); break; }
		case 1: v = json_integer((json_int_t)rn(2000) - 1000); break;
		case 2: v = json_boolean(rn(2)); break;
		default: v = json_null(); break;
		}
		int dup = 0;
		for (size_t j = 0; j < json_array_size(a); j++)
			dup |= json_equal(json_array_get(a, j), v);
		if (dup)
			json_decref(v);
		else
			json_array_append_new(a, v);
	}
	return a;
}

static json_t *gen_schema(int depth)
{
	unsigned k = rn(depth > 0 ? 14 : 7);
	json_t *s = json_object();
	switch (k) {
	case 0:
		json_object_set_new(s, "type", json_string("string"));
		if (rn(2)) {
			unsigned lo = rn(4);
			json_object_set_new(s, "minLength", json_integer(lo));
			if (rn(2))
				json_object_set_new(s, "maxLength", json_integer(lo + rn(8)));
		} else if (rn(2))
			json_object_set_new(s, "maxLength", json_integer(rn(3) ? rn(12) : 28 + rn(20)));
		break;
	case 1: json_object_set_new(s, "type", json_string("integer")); break;
	case 2: json_object_set_new(s, "type", json_string("number")); break;
	case 3: json_object_set_new(s, "type", json_string("boolean")); break;
	case 4: json_object_set_new(s, "type", json_string("null")); break;
	case 5:
		if (rn(3))
			json_object_set_new(s, "enum", gen_scalar_enum());
		else {
			json_t *e = gen_scalar_enum();
			json_object_set(s, "const", json_array_get(e, 0));
			json_decref(e);
		}
		break;
	case 6:
		json_object_set_new(s, "type", json_pack("[ss]", "string", "null"));
		if (rn(2))
			json_object_set_new(s, "maxLength", json_integer(rn(6)));
		break;
	case 7: case 8: {
		json_object_set_new(s, "type", json_string("array"));
		unsigned lo = rn(3);
		if (rn(3) == 0) { /* a tuple */
			json_t *pre = json_array();
			unsigned np = 1 + rn(3);
			for (unsigned i = 0; i < np; i++)
				json_array_append_new(pre, gen_schema(depth - 1));
			json_object_set_new(s, "prefixItems", pre);
			unsigned w = rn(3);
			if (w == 0)
				json_object_set_new(s, "items", json_false());
			else if (w == 1)
				json_object_set_new(s, "items", gen_schema(depth - 1));
			if (w == 0 && lo > np)
				lo = np;
		} else
			json_object_set_new(s, "items", gen_schema(depth - 1));
		if (rn(2))
			json_object_set_new(s, "minItems", json_integer(lo));
		if (rn(2))
			json_object_set_new(s, "maxItems", json_integer(lo + rn(4)));
		break;
	}
	case 9: case 10: case 11: {
		json_object_set_new(s, "type", json_string("object"));
		json_t *p = json_object(), *req = json_array();
		unsigned n = rn(5);
		for (unsigned i = 0; i < n; i++) {
			char key[16];
			snprintf(key, sizeof key, rn(4) ? "k%u" : "K\\\"\u00e9%u", i);
			json_object_set_new(p, key, gen_schema(depth - 1));
			if (rn(2))
				json_array_append_new(req, json_string(key));
		}
		if (n || rn(2))
			json_object_set_new(s, "properties", p);
		else
			json_decref(p);
		json_object_set_new(s, "required", req);
		if (rn(2))
			json_object_set_new(s, "additionalProperties", json_false());
		else if (!n && rn(2))
			json_object_set_new(s, "additionalProperties", gen_schema(depth - 1));
		break;
	}
	case 12: {
		json_t *a = json_array();
		unsigned n = 2 + rn(2);
		for (unsigned i = 0; i < n; i++)
			json_array_append_new(a, gen_schema(depth - 1));
		json_object_set_new(s, "anyOf", a);
		break;
	}
	default: {
		/* a $ref to a definition, or oneOf of distinct types, or any */
		unsigned w = rn(3);
		if (w == 0) {
			char name[16];
			snprintf(name, sizeof name, "d%u", n_defs++);
			json_object_set_new(defs, name, gen_schema(depth - 1));
			char ref[32];
			snprintf(ref, sizeof ref, "#/$defs/%s", name);
			json_object_set_new(s, "$ref", json_string(ref));
		} else if (w == 1) {
			json_object_set_new(s, "oneOf", json_pack("[{s:s}, {s:s, s:i}]", "type", "integer", "type",
			    "string", "maxLength", 5));
		} else if (rn(2)) {
			json_decref(s);
			return json_true();
		}
		break;
	}
	}
	if (rn(5) == 0)
		json_object_set_new(s, "description", json_string("a field"));
	return s;
}

static json_t *random_schema(int depth)
{
	defs = json_object();
	json_t *s = gen_schema(depth);
	if (json_is_object(s) && json_object_size(defs))
		json_object_set(s, "$defs", defs);
	json_decref(defs);
	return s;
}

/* ---- the validator (the same subset) ---- */
static json_t *root_schema;

static json_t *resolve(const char *ref)
{
	if (!strcmp(ref, "#"))
		return root_schema;
	if (!strncmp(ref, "#/$defs/", 8))
		return json_object_get(json_object_get(root_schema, "$defs"), ref + 8);
	return NULL;
}

static size_t cps(const char *s, size_t n)
{
	size_t c = 0;
	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xC0) != 0x80;
	return c;
}

static int valid(json_t *s, json_t *v);

static int valid_type(json_t *s, const char *t, json_t *v)
{
	if (!strcmp(t, "null")) return json_is_null(v);
	if (!strcmp(t, "boolean")) return json_is_boolean(v);
	if (!strcmp(t, "integer")) return json_is_integer(v);
	if (!strcmp(t, "number")) return json_is_number(v);
	if (!strcmp(t, "string")) {
		if (!json_is_string(v))
			return 0;
		size_t n = cps(json_string_value(v), json_string_length(v));
		json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
		return (!lo || n >= (size_t)json_integer_value(lo)) && (!hi || n <= (size_t)json_integer_value(hi));
	}
	if (!strcmp(t, "array")) {
		if (!json_is_array(v))
			return 0;
		json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
		size_t n = json_array_size(v);
		if ((lo && n < (size_t)json_integer_value(lo)) || (hi && n > (size_t)json_integer_value(hi)))
			return 0;
		json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
		size_t k = json_array_size(pre);
		for (size_t i = 0; i < n; i++) {
			json_t *sch = i < k ? json_array_get(pre, i) : items;
			if (sch && !valid(sch, json_array_get(v, i)))
				return 0;
		}
		return 1;
	}
	if (!strcmp(t, "object")) {
		if (!json_is_object(v))
			return 0;
		json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
		json_t *addl = json_object_get(s, "additionalProperties");
		for (size_t i = 0; i < json_array_size(req); i++)
			if (!json_object_get(v, json_string_value(json_array_get(req, i))))
				return 0;
		const char *k;
		json_t *x;
		if (json_object_size(props)) {
			/* the subset: declared keys only, in their order */
			void *it = json_object_iter(props);
			json_object_foreach(v, k, x) {
				while (it && strcmp(json_object_iter_key(it), k))
					it = json_object_iter_next(props, it);
				if (!it || !valid(json_object_iter_value(it), x))
					return 0;
				it = json_object_iter_next(props, it);
			}
			return 1;
		}
		if (json_is_false(addl))
			return json_object_size(v) == 0;
		json_object_foreach(v, k, x)
			if (addl && !json_is_true(addl) && !valid(addl, x))
				return 0;
		return 1;
	}
	return 0;
}

static int valid(json_t *s, json_t *v)
{
	if (json_is_true(s))
		return 1;
	json_t *x;
	if ((x = json_object_get(s, "$ref")))
		return valid(resolve(json_string_value(x)), v);
	if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
		int m = 0;
		for (size_t i = 0; i < json_array_size(x); i++)
			m += valid(json_array_get(x, i), v);
		return json_object_get(s, "oneOf") ? m == 1 : m > 0;
	}
	if ((x = json_object_get(s, "const")))
		return json_equal(x, v);
	if ((x = json_object_get(s, "enum"))) {
		for (size_t i = 0; i < json_array_size(x); i++)
			if (json_equal(json_array_get(x, i), v))
				return 1;
		return 0;
	}
	json_t *t = json_object_get(s, "type");
	if (!t)
		return 1;
	if (json_is_string(t))
		return valid_type(s, json_string_value(t), v);
	for (size_t i = 0; i < json_array_size(t); i++)
		if (valid_type(s, json_string_value(json_array_get(t, i)), v))
			return 1;
	return 0;
}

/* A number past the grammar's limits (an exponent of three digits: a
 * mutant can make one): outside the subset, not decided here. */
static int past_limits(const char *doc, size_t n)
{
	int in_str = 0;
	for (size_t i = 1; i + 3 < n; i++) {
		if (doc[i] == '"' && (!in_str || doc[i - 1] != '\\'))
			in_str = !in_str; /* near enough: a mutant's odd escapes only skip a case */
		if (in_str)
			continue;
		if ((doc[i] == 'e' || doc[i] == 'E') && doc[i - 1] >= '0' && doc[i - 1] <= '9') {
			size_t j = i + 1, d = 0;
			if (doc[j] == '+' || doc[j] == '-')
				j++;
			while (j < n && doc[j] >= '0' && doc[j] <= '9')
				j++, d++;
			if (d > 2)
				return 1;
		}
	}
	return 0;
}

/* The oracle: 1 valid, 0 not, -1 undecidable here (duplicate keys, past
 * the grammar's number limits). */
static int oracle(json_t *schema, const char *doc, size_t n)
{
	json_error_t e;
	if (past_limits(doc, n))
		return -1;
	json_t *v = json_loadb(doc, n, JSON_DECODE_ANY | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &e);
	if (!v) {
		json_t *w = json_loadb(doc, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
		json_decref(w);
		return w ? -1 : 0;
	}
	root_schema = schema;
	int ok = valid(schema, v);
	json_decref(v);
	return ok;
}

/* ---- random valid documents ---- */
static void ws(struct buf *b)
{
	static const char *w[] = { "", "", "", " ", "\n", "  ", "\t", "\r\n" };
	puts_(b, w[rn(8)]);
}

static void gen_string(struct buf *b, unsigned lo, unsigned hi)
{
	static const char *ch[] = { "a", "b", "z", " ", "Q", "7", "\\n", "\\\"", "\\\\", "\\u00e9",
		"\\u4e2d", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80", ":", ",", "{", "]", "\\/", "\\t" };
	unsigned n = lo + (hi > lo ? rn(hi - lo + 1 > 8 ? 8 : hi - lo + 1) : 0);
	puts_(b, "\"");
	for (unsigned i = 0; i < n; i++)
		puts_(b, ch[rn(sizeof ch / sizeof ch[0])]);
	puts_(b, "\"");
}

static void gen_number(struct buf *b, int integer)
{
	char s[64];
	int n = snprintf(s, sizeof s, "%s%u", rn(3) ? "" : "-", rn(4) ? rn(1000) : rn(100000000));
	if (!integer && rn(2))
		n += snprintf(s + n, sizeof s - (size_t)n, ".%u", rn(100000));
	if (!integer && rn(3) == 0)
		snprintf(s + n, sizeof s - (size_t)n, "%s%s%u", rn(2) ? "e" : "E", rn(2) ? "" : rn(2) ? "+" : "-", rn(10));
	puts_(b, s);
}

static void gen_any(struct buf *b, int depth)
{
	unsigned k = rn(depth > 0 ? 7 : 5);
	switch (k) {
	case 0: puts_(b, "null"); break;
	case 1: puts_(b, rn(2) ? "true" : "false"); break;
	case 2: gen_number(b, 0); break;
	case 3: case 4: gen_string(b, 0, 4); break;
	case 5: {
		puts_(b, "[");
		ws(b);
		unsigned n = rn(3);
		for (unsigned i = 0; i < n; i++) {
			if (i) { puts_(b, ","); ws(b); }
			gen_any(b, depth - 1);
			ws(b);
		}
		puts_(b, "]");
		break;
	}
	default: {
		puts_(b, "{");
		ws(b);
		unsigned n = rn(3);
		for (unsigned i = 0; i < n; i++) {
			char key[16];
			if (i) { puts_(b, ","); ws(b); }
			snprintf(key, sizeof key, "\"f%u\"", i);
			puts_(b, key);
			ws(b);
			puts_(b, ":");
			ws(b);
			gen_any(b, depth - 1);
			ws(b);
		}
		puts_(b, "}");
	}
	}
}

static void gen_doc(struct buf *b, json_t *s, int depth);

static void gen_typed(struct buf *b, json_t *s, const char *t, int depth)
{
	if (!strcmp(t, "null")) puts_(b, "null");
	else if (!strcmp(t, "boolean")) puts_(b, rn(2) ? "true" : "false");
	else if (!strcmp(t, "integer")) gen_number(b, 1);
	else if (!strcmp(t, "number")) gen_number(b, 0);
	else if (!strcmp(t, "string")) {
		json_t *lo = json_object_get(s, "minLength"), *hi = json_object_get(s, "maxLength");
		unsigned l = lo ? (unsigned)json_integer_value(lo) : 0;
		gen_string(b, l, hi ? (unsigned)json_integer_value(hi) : l + 6);
	} else if (!strcmp(t, "array")) {
		json_t *lo = json_object_get(s, "minItems"), *hi = json_object_get(s, "maxItems");
		unsigned l = lo ? (unsigned)json_integer_value(lo) : 0;
		unsigned h = hi ? (unsigned)json_integer_value(hi) : l + 3;
		json_t *items = json_object_get(s, "items"), *pre = json_object_get(s, "prefixItems");
		unsigned k = (unsigned)json_array_size(pre);
		if (json_is_false(items) && h > k)
			h = k;
		unsigned n = l + (h > l ? rn(h - l + 1) : 0);
		puts_(b, "[");
		ws(b);
		for (unsigned i = 0; i < n; i++) {
			if (i) { puts_(b, ","); ws(b); }
			json_t *sch = i < k ? json_array_get(pre, i) : items;
			if (sch)
				gen_doc(b, sch, depth + 1);
			else
				gen_any(b, 2);
			ws(b);
		}
		puts_(b, "]");
	} else {
		json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
		json_t *addl = json_object_get(s, "additionalProperties");
		puts_(b, "{");
		ws(b);
		int first = 1;
		const char *k;
		json_t *x;
		if (json_object_size(props)) {
			json_object_foreach(props, k, x) {
				int need = 0;
				for (size_t i = 0; i < json_array_size(req); i++)
					need |= !strcmp(json_string_value(json_array_get(req, i)), k);
				if (!need && rn(3) == 0)
					continue;
				if (!first) { puts_(b, ","); ws(b); }
				first = 0;
				json_t *ks = json_string(k);
				char *lit = json_dumps(ks, JSON_ENCODE_ANY);
				puts_(b, lit);
				free(lit);
				json_decref(ks);
				ws(b);
				puts_(b, ":");
				ws(b);
				gen_doc(b, x, depth + 1);
				ws(b);
			}
		} else if (!json_is_false(addl)) {
			unsigned n = rn(3);
			for (unsigned i = 0; i < n; i++) {
				char key[16];
				if (i) { puts_(b, ","); ws(b); }
				snprintf(key, sizeof key, "\"m%u\"", i);
				puts_(b, key);
				ws(b);
				puts_(b, ":");
				ws(b);
				if (addl && !json_is_true(addl))
					gen_doc(b, addl, depth + 1);
				else
					gen_any(b, 2);
				ws(b);
			}
		}
		puts_(b, "}");
	}
}

static void gen_doc(struct buf *b, json_t *s, int depth)
{
	if (json_is_true(s)) {
		gen_any(b, 2);
		return;
	}
	json_t *x;
	if ((x = json_object_get(s, "$ref"))) {
		gen_doc(b, resolve(json_string_value(x)), depth + 1);
		return;
	}
	if ((x = json_object_get(s, "anyOf")) || (x = json_object_get(s, "oneOf"))) {
		gen_doc(b, json_array_get(x, rn((unsigned)json_array_size(x))), depth + 1);
		return;
	}
	if ((x = json_object_get(s, "const")) || (x = json_object_get(s, "enum"))) {
		json_t *v = json_is_array(x) ? json_array_get(x, rn((unsigned)json_array_size(x))) : x;
		char *lit = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
		puts_(b, lit);
		free(lit);
		return;
	}
	json_t *t = json_object_get(s, "type");
	if (!t) {
		gen_any(b, 2);
		return;
	}
	gen_typed(b, s, json_is_string(t) ? json_string_value(t) :
	    json_string_value(json_array_get(t, rn((unsigned)json_array_size(t)))), depth);
}

/* ---- a vocabulary ---- */
struct voc {
	uint32_t n;
	char **b;
	size_t *len;
	uint8_t *use;
	gram_vocab *v;
};

static void voc_add(struct voc *v, const char *s, size_t n)
{
	for (uint32_t i = 0; i < v->n; i++)
		if (v->len[i] == n && !memcmp(v->b[i], s, n))
			return;
	v->b = realloc(v->b, (v->n + 1) * sizeof *v->b);
	v->len = realloc(v->len, (v->n + 1) * sizeof *v->len);
	v->use = realloc(v->use, v->n + 1);
	v->b[v->n] = malloc(n + 1);
	memcpy(v->b[v->n], s, n);
	v->len[v->n] = n;
	v->use[v->n] = 1;
	v->n++;
}

/* JSON-ish tokens: every byte alone, structure, words, UTF-8 pieces. */
static void voc_make(struct voc *v, unsigned extra)
{
	memset(v, 0, sizeof *v);
	for (int c = 1; c < 256; c++) {
		char s[1] = { (char)c };
		voc_add(v, s, 1);
	}
	static const char *t[] = { "{\"", "\":", "\": ", "\",", "\", \"", "\"}", "}}", "]}", "[]", "{}",
		"null", "true", "false", "nu", "ll", "tr", "ue", " \"", "\n  ", "  ", "\\n", "\\u", "00",
		"e9", "\\\"", ", ", ",\"", "\":\"", "\"]", "[\"", "-1", "12", "0.", ".5", "e+", "k0",
		"k1", "\":{", "\":[", "\xc3\xa9", "\xe4\xb8", "\xad", "\xf0\x9f\x98\x80", "v1", "v2" };
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		voc_add(v, t[i], strlen(t[i]));
	/* plain tokens longer than the fast path's table (GV_CUM characters) */
	for (unsigned len = 30; len < 44; len += 3) {
		char s[64];
		for (unsigned j = 0; j < len; j++)
			s[j] = (char)('a' + j % 26);
		voc_add(v, s, len);
		s[len - 1] = '"';
		voc_add(v, s, len);
	}
	static const char alpha[] = "abckKvz \"\\:,{}[]0123456789.-e\n";
	for (unsigned i = 0; i < extra; i++) {
		char s[12];
		unsigned n = 2 + rn(9);
		for (unsigned j = 0; j < n; j++)
			s[j] = alpha[rn(sizeof alpha - 1)];
		voc_add(v, s, n);
	}
	T_OK(gram_vocab_new(&v->v, v->n, (const char *const *)v->b, v->len, v->use));
}

static void voc_free(struct voc *v)
{
	gram_vocab_free(v->v);
	for (uint32_t i = 0; i < v->n; i++)
		free(v->b[i]);
	free(v->b);
	free(v->len);
	free(v->use);
}

/* ---- the cases ---- */
static gram *compile_ok(json_t *s)
{
	gram *g = NULL;
	char err[300] = "";
	int rc = gram_compile_schema(&g, s, err, sizeof err);
	if (rc) {
		char *d = json_dumps(s, JSON_COMPACT);
		T_FAIL("compile: %s (%s) for %s", err, baton_strerror(rc), d);
	}
	return g;
}

static void t_documents_and_mutants(void)
{
	struct voc v;
	voc_make(&v, 0);
	unsigned docs = 0, mutants = 0, agree_valid = 0, skipped = 0;
	for (int i = 0; i < 400; i++) {
		json_t *s = random_schema(3);
		gram *g = compile_ok(s);
		for (int d = 0; d < 6; d++) {
			struct buf b = {0};
			root_schema = s;
			ws(&b);
			gen_doc(&b, s, 0);
			ws(&b);
			char *dump = json_dumps(s, JSON_COMPACT);
			T_ASSERT_MSG(oracle(s, b.p, b.n) == 1, "generated document not valid: %s for %s", b.p, dump);
			gram_match *m;
			T_OK(gram_match_new(&m, g, v.v));
			bool whole = false;
			T_ASSERT_MSG(gram_match_check_bytes(m, b.p, b.n, &whole) && whole,
			    "valid document refused: [%s] for %s", b.p, dump);
			docs++;
			for (int k = 0; k < 12; k++) {
				struct buf c = {0};
				put(&c, b.p, b.n);
				size_t at = c.n ? rn((unsigned)c.n) : 0;
				static const char pool[] = "\"{}[],:0123456789.-+eE \\nutrfalse\x01\xc3\xa9\xff";
				char x = pool[rn(sizeof pool - 1)];
				unsigned op = rn(3);
				if (op == 0 && c.n) {
					memmove(c.p + at, c.p + at + 1, c.n - at - 1);
					c.n--;
				} else if (op == 1) {
					put(&c, "x", 1);
					memmove(c.p + at + 1, c.p + at, c.n - at - 1);
					c.p[at] = x;
				} else if (c.n)
					c.p[at] = x;
				int want = oracle(s, c.p, c.n);
				if (want < 0) {
					skipped++;
					free(c.p);
					continue;
				}
				bool w2 = false;
				bool ok = gram_match_check_bytes(m, c.p, c.n, &w2) && w2;
				T_ASSERT_MSG(ok == (want == 1), "mutant [%.*s] of [%s]: matcher %d, validator %d, schema %s",
				    (int)c.n, c.p, b.p, ok, want, dump);
				mutants++;
				agree_valid += want == 1;
				free(c.p);
			}
			free(dump);
			gram_match_free(m);
			free(b.p);
		}
		gram_free(g);
		json_decref(s);
	}
	printf("  %u documents, %u mutants (%u of them valid), %u skipped (duplicate keys, limits)\n", docs,
	    mutants, agree_valid, skipped);
	voc_free(&v);
}

/* The mask against trying every token, along sampled outputs. */
static void t_mask_is_exact_and_sampling_validates(void)
{
	struct voc v;
	voc_make(&v, 600);
	uint32_t eos = v.n; /* one past the vocabulary: the caller's */
	uint64_t *allow = calloc((v.n + 63) / 64, 8);
	unsigned done = 0, steps = 0;
	for (int i = 0; i < 250; i++) {
		json_t *s = random_schema(3);
		gram *g = compile_ok(s);
		gram_match *m;
		T_OK(gram_match_new(&m, g, v.v));
		struct buf out = {0};
		put(&out, "", 0);
		int check = i < 150; /* brute force on the first ones only: it is slow */
		for (int step = 0; step < 400; step++) {
			bool can_end;
			T_OK(gram_match_mask(m, allow, &can_end));
			uint32_t n_ok = 0;
			for (uint32_t t = 0; t < v.n; t++) {
				bool bit = allow[t / 64] >> (t % 64) & 1;
				n_ok += bit;
				if (check) {
					bool want = gram_match_check_bytes(m, v.b[t], v.len[t], NULL);
					T_ASSERT_MSG(bit == want, "token %u [%.*s] after [%s]: mask %d, check %d", t,
					    (int)v.len[t], v.b[t], out.p, bit, want);
				}
			}
			T_ASSERT_MSG(n_ok || can_end, "dead end after [%s]", out.p);
			/* a random "model": mostly short tokens, the end when allowed half the time */
			uint32_t pick = eos;
			if (!(can_end && (n_ok == 0 || rn(2)))) {
				uint32_t r = rn(n_ok), seen = 0;
				for (uint32_t t = 0; t < v.n; t++)
					if (allow[t / 64] >> (t % 64) & 1 && seen++ == r) {
						pick = t;
						break;
					}
			}
			if (pick == eos)
				break;
			T_OK(gram_match_accept(m, pick));
			put(&out, v.b[pick], v.len[pick]);
			steps++;
		}
		if (gram_match_can_end(m)) {
			char *dump = json_dumps(s, JSON_COMPACT);
			T_ASSERT_MSG(oracle(s, out.p, out.n) != 0, "sampled [%s] does not validate against %s",
			    out.p, dump);
			free(dump);
			done++;
		}
		free(out.p);
		gram_match_free(m);
		gram_free(g);
		json_decref(s);
	}
	printf("  %u of 250 sampled documents complete and valid, %u steps\n", done, steps);
	T_ASSERT(done > 150);
	free(allow);
	voc_free(&v);
}

static void refused(const char *schema, int want, const char *path)
{
	json_error_t je;
	json_t *s = json_loads(schema, 0, &je);
	T_ASSERT(s);
	gram *g = NULL;
	char err[300] = "";
	int rc = gram_compile_schema(&g, s, err, sizeof err);
	T_ASSERT_MSG(rc == want, "%s: rc %d (%s), want %d", schema, rc, err, want);
	T_ASSERT_MSG(strncmp(err, path, strlen(path)) == 0 && err[strlen(path)] == ':',
	    "%s: message \"%s\" does not start with %s", schema, err, path);
	T_ASSERT(g == NULL);
	json_decref(s);
}

static void t_refusals_name_the_keyword(void)
{
	refused("{\"type\":\"string\",\"pattern\":\"^a+$\"}", BATON_EUNSUPPORTED, "#/pattern");
	refused("{\"type\":\"object\",\"properties\":{\"a/b\":{\"type\":\"string\",\"format\":\"email\"}}}",
	    BATON_EUNSUPPORTED, "#/properties/a~1b/format");
	refused("{\"type\":\"integer\",\"minimum\":3}", BATON_EUNSUPPORTED, "#/minimum");
	refused("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"multipleOf\":2}}", BATON_EUNSUPPORTED,
	    "#/items/multipleOf");
	refused("{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", BATON_EUNSUPPORTED, "#/oneOf");
	refused("{\"$ref\":\"http://example.com/s.json\"}", BATON_EUNSUPPORTED, "#/$ref");
	refused("{\"$ref\":\"#/$defs/nope\"}", BATON_EINVAL, "#/$ref");
	refused("{\"$defs\":{\"x\":{\"type\":\"string\",\"pattern\":\"a\"}},\"$ref\":\"#/$defs/x\"}",
	    BATON_EUNSUPPORTED, "#/$defs/x/pattern");
	refused("{\"type\":\"array\",\"uniqueItems\":true}", BATON_EUNSUPPORTED, "#/uniqueItems");
	refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}", BATON_EUNSUPPORTED, "#/allOf");
	refused("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", BATON_EINVAL, "#");
	refused("{\"type\":\"object\",\"required\":[\"a\"]}", BATON_EUNSUPPORTED, "#/required");
	refused("{\"type\":\"object\",\"properties\":{\"a\":false}}", BATON_EINVAL, "#/properties/a");
	refused("{\"type\":\"wat\"}", BATON_EINVAL, "#/type");
	refused("{\"type\":\"object\",\"patternProperties\":{}}", BATON_EUNSUPPORTED, "#/patternProperties");
	refused("{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", BATON_EUNSUPPORTED, "#/type");
	refused("{\"type\":\"array\",\"maxItems\":100000}", BATON_EUNSUPPORTED, "#/maxItems");
	refused("{\"enum\":[1,2],\"maxLength\":3}", BATON_EUNSUPPORTED, "#/maxLength");
	refused("{\"$ref\":\"#/$defs/a\",\"$defs\":{\"a\":{\"anyOf\":[{\"$ref\":\"#/$defs/a\"},{\"type\":\"null\"}]}}}",
	    BATON_EUNSUPPORTED, "#/$defs/a/anyOf/0/$ref");
}

static int accepts(gram *g, gram_vocab *v, const char *doc)
{
	gram_match *m;
	T_OK(gram_match_new(&m, g, v));
	bool whole = false;
	bool ok = gram_match_check_bytes(m, doc, strlen(doc), &whole) && whole;
	gram_match_free(m);
	return ok;
}

static void t_json_object_and_recursion(void)
{
	struct voc v;
	voc_make(&v, 0);
	gram *g;
	char err[200];
	T_OK(gram_compile_json_object(&g, err, sizeof err));
	T_ASSERT(accepts(g, v.v, "{}"));
	T_ASSERT(accepts(g, v.v, " {\"a\": [1, -2.5e3, {\"b\": null}], \"c\": \"\\u00e9\xc3\xa9\"}\n"));
	T_ASSERT(!accepts(g, v.v, "[1]"));
	T_ASSERT(!accepts(g, v.v, "\"x\""));
	T_ASSERT(!accepts(g, v.v, "{\"a\":1,}"));
	T_ASSERT(!accepts(g, v.v, "{\"a\":01}"));
	T_ASSERT(!accepts(g, v.v, "{\"a\":\"\\ud800\"}"));   /* no surrogate escapes */
	T_ASSERT(!accepts(g, v.v, "{\"a\":\"\xed\xa0\x80\"}")); /* nor encoded ones */
	gram_free(g);
	/* a recursive tree through $ref "#" */
	json_t *s = json_loads("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
	    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"},\"maxItems\":2}},"
	    "\"required\":[\"v\"],\"additionalProperties\":false}", 0, NULL);
	g = compile_ok(s);
	T_ASSERT(accepts(g, v.v, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[{\"v\":4,\"kids\":[]}]}]}"));
	T_ASSERT(!accepts(g, v.v, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3},{\"v\":4}]}"));
	T_ASSERT(!accepts(g, v.v, "{\"kids\":[]}"));
	T_ASSERT(!accepts(g, v.v, "{\"v\":1.5}"));
	gram_free(g);
	json_decref(s);
	/* maxLength counts characters: escapes and UTF-8 as one */
	s = json_loads("{\"type\":\"string\",\"maxLength\":2,\"minLength\":2}", 0, NULL);
	g = compile_ok(s);
	T_ASSERT(accepts(g, v.v, "\"\\u00e9\xe4\xb8\xad\""));
	T_ASSERT(accepts(g, v.v, "\"\\n\\\"\""));
	T_ASSERT(!accepts(g, v.v, "\"abc\""));
	T_ASSERT(!accepts(g, v.v, "\"a\""));
	gram_free(g);
	json_decref(s);
	voc_free(&v);
}

/* Qwen3-Coder's XML-style calls: a strict tool's parameters in their
 * order, typed; another tool's any; the refusals name the path. */
static void t_xml_calls(void)
{
	struct voc v;
	voc_make(&v, 0);
	json_t *tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,"
	    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
	    "\"days\":{\"type\":\"integer\"},\"unit\":{\"type\":\"string\",\"enum\":[\"C\",\"F\"]}},"
	    "\"required\":[\"city\",\"days\"],\"additionalProperties\":false}}},"
	    "{\"type\":\"function\",\"function\":{\"name\":\"free\"}}]", 0, NULL);
	gram *g = NULL;
	char err[300] = "";
	T_OK(gram_compile_xml_calls(&g, tools, err, sizeof err));
	T_ASSERT(accepts(g, v.v, "\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
	    "<parameter=days>\n3\n</parameter>\n</function>"));
	T_ASSERT(accepts(g, v.v, "<function=get_weather><parameter=city>\nLe Mans \xc3\xa9\n</parameter>"
	    "<parameter=days>\n-2\n</parameter><parameter=unit>\nF\n</parameter></function>"));
	T_ASSERT(!accepts(g, v.v, "<function=get_weather><parameter=city>\nParis\n</parameter></function>")); /* days */
	T_ASSERT(!accepts(g, v.v, "<function=get_weather><parameter=city>\nParis\n</parameter>"
	    "<parameter=days>\nthree\n</parameter></function>"));
	T_ASSERT(!accepts(g, v.v, "<function=get_weather><parameter=city>\nParis\n</parameter>"
	    "<parameter=days>\n3\n</parameter><parameter=unit>\nK\n</parameter></function>"));
	T_ASSERT(!accepts(g, v.v, "<function=get_weather><parameter=city>\nA very long city\n</parameter>"
	    "<parameter=days>\n3\n</parameter></function>"));
	T_ASSERT(!accepts(g, v.v, "<function=get_weather><parameter=days>\n3\n</parameter>"
	    "<parameter=city>\nParis\n</parameter></function>")); /* the schema's order */
	T_ASSERT(!accepts(g, v.v, "<function=get_weather><parameter=city>\nParis\n</parameter>"
	    "<parameter=days>\n3\n</parameter><parameter=x>\n1\n</parameter></function>"));
	T_ASSERT(!accepts(g, v.v, "<function=nope></function>"));
	T_ASSERT(accepts(g, v.v, "<function=free>\n<parameter=anything>\nat all\n</parameter>\n</function>"));
	T_ASSERT(accepts(g, v.v, "<function=free></function>"));
	gram_free(g);
	json_decref(tools);
	static const struct { const char *params, *path; } bad[] = {
		{ "{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"}]}}}",
		  "tools[0].function.parameters#/properties/a/type" },
		{ "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}",
		  "tools[0].function.parameters#/properties/a/pattern" },
		{ "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":1}}}",
		  "tools[0].function.parameters#/properties/a/minimum" },
		{ "{\"type\":\"object\",\"properties\":{\"a>\":{\"type\":\"integer\"}}}",
		  "tools[0].function.parameters#/properties/a>" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *s = NULL;
		T_ASSERT(asprintf(&s, "[{\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":%s}}]", bad[i].params) > 0);
		tools = json_loads(s, 0, NULL);
		free(s);
		T_ASSERT(tools != NULL);
		err[0] = 0;
		T_EQ_INT(gram_compile_xml_calls(&g, tools, err, sizeof err), BATON_EUNSUPPORTED);
		T_ASSERT_MSG(g == NULL && strncmp(err, bad[i].path, strlen(bad[i].path)) == 0, "%s", err);
		json_decref(tools);
	}
	voc_free(&v);
}

/* The bytes of a token, concatenated, are what the decoder writes. */
static void check_tok_bytes(const char *family)
{
	const char *d = getenv("TEXT_FIXTURES");
	char path[512], err[300];
	snprintf(path, sizeof path, "%s/%s/tokenizer.json", d ? d : "text/fixtures", family);
	text_tok *t;
	int rc = text_tok_load_file(&t, path, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "%s: %s", path, err);
	uint32_t n = (uint32_t)text_vocab_size(t);
	/* a first token that decodes to itself ("a") so no strip touches the rest */
	int32_t *ids0;
	size_t n0;
	T_OK(text_encode(t, "a", 1, 0, &ids0, &n0, err, sizeof err));
	T_ASSERT(n0 == 1);
	int checked = 0;
	for (int r = 0; r < 300; r++) {
		int32_t ids[9];
		ids[0] = ids0[0];
		struct buf want = {0};
		char b[1024];
		size_t len;
		T_OK(text_token_bytes(t, ids[0], b, sizeof b, &len));
		put(&want, b, len);
		for (int k = 1; k < 9; k++) {
			do
				ids[k] = (int32_t)rn(n);
			while (text_is_special(t, ids[k]));
			T_OK(text_token_bytes(t, ids[k], b, sizeof b, &len));
			put(&want, b, len);
		}
		char *got;
		size_t glen;
		T_OK(text_decode(t, ids, 9, 0, &got, &glen, err, sizeof err));
		/* byte pieces that do not form UTF-8 decode to U+FFFD: compare the valid ones */
		json_t *j = json_stringn(want.p, want.n);
		if (j) {
			/* the decoder strips the whole text's first space (SentencePiece) */
			size_t skip = want.n && want.p[0] == ' ' && glen + 1 == want.n;
			T_ASSERT_MSG(glen + skip == want.n && !memcmp(got, want.p + skip, glen),
			    "%s: decode [%s] bytes [%s]", family, got, want.p);
			checked++;
		}
		json_decref(j);
		free(got);
		free(want.p);
	}
	T_ASSERT(checked > 50);
	gram_vocab *v;
	uint32_t except = (uint32_t)ids0[0];
	T_OK(gram_vocab_from_tok(&v, t, n + 10, &except, 1, err, sizeof err));
	T_ASSERT(gram_vocab_size(v) == n + 10);
	/* the excepted id is never allowed, even where its bytes fit */
	gram *g;
	T_OK(gram_compile_json_object(&g, err, sizeof err));
	gram_match *m;
	T_OK(gram_match_new(&m, g, v));
	T_OK(gram_match_accept_bytes(m, "{\"", 2));
	uint64_t *allow = calloc((n + 10 + 63) / 64, 8);
	bool can_end;
	T_OK(gram_match_mask(m, allow, &can_end));
	T_ASSERT(!can_end);
	T_ASSERT(!(allow[ids0[0] / 64] >> (ids0[0] % 64) & 1));
	uint32_t n_ok = 0;
	for (uint32_t i = 0; i < n + 10; i++)
		n_ok += allow[i / 64] >> (i % 64) & 1;
	T_ASSERT(n_ok > n / 2); /* inside a key: most tokens */
	for (uint32_t i = n; i < n + 10; i++)
		T_ASSERT(!(allow[i / 64] >> (i % 64) & 1));
	free(allow);
	gram_match_free(m);
	gram_free(g);
	free(ids0);
	gram_vocab_free(v);
	text_tok_free(t);
}

static void t_token_bytes_match_the_decoder(void)
{
	check_tok_bytes("qwen3");
	check_tok_bytes("mixtral");
}

T_MAIN(T_CASE_TIMEOUT(t_documents_and_mutants, 120), T_CASE_TIMEOUT(t_mask_is_exact_and_sampling_validates, 120),
    T_CASE(t_refusals_name_the_keyword), T_CASE(t_json_object_and_recursion), T_CASE(t_xml_calls),
    T_CASE(t_token_bytes_match_the_decoder))
