/*
 * xml_calls.c: Qwen3-Coder's XML-style tool calls compiled into a grammar
 * (grammar.h's gram_compile_xml_calls), on schema.c's value rules.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar/schema_int.h"

/* ---- Qwen3-Coder's XML-style calls ---- */

/* Bytes but those of `but` (a set); ascii: printable ASCII and whitespace only. */
static uint16_t set_but(struct sc *c, const char *but, int ascii)
{
	uint8_t bits[32];
	memset(bits, 0, sizeof bits);
	for (unsigned x = 0; x < 256; x++)
		if (!strchr(but, (int)x) && (!ascii || (x >= 0x20 && x < 0x7f) || x == '\t' || x == '\n' || x == '\r'))
			bits[x / 8] |= (uint8_t)(1u << (x % 8));
	return gb_set(&c->b, bits);
}

/* A parameter's value between "<parameter=P>\n" and "\n</parameter>", as
 * the split reads it back (engine/serve/toolcall.c): a string parameter's
 * raw text (no '<', so nothing in it can close it), any other the JSON of
 * its schema. A parameter without one type is refused: the reader takes
 * it as text, which its schema may not allow. */
static int xml_value(struct sc *c, json_t *s, const char *path, uint32_t *out)
{
	json_t *ty = json_object_get(s, "type");
	char p[512];
	if (!json_is_string(ty)) {
		sc_sub_path(p, sizeof p, path, "type");
		return sc_fail(c, BATON_EUNSUPPORTED, p, "Qwen3-Coder's calls write a parameter as text, or as JSON when "
		    "its schema gives one type other than string: give the parameter a type%s", NULL);
	}
	if (strcmp(json_string_value(ty), "string"))
		return sc_compile(c, s, path, out);
	const char *k;
	json_t *v;
	json_object_foreach(s, k, v) {
		if (sc_is_annotation(k) || !strcmp(k, "type") || !strcmp(k, "enum") || !strcmp(k, "const") ||
		    !strcmp(k, "minLength") || !strcmp(k, "maxLength"))
			continue;
		sc_sub_path(p, sizeof p, path, k);
		return sc_fail(c, BATON_EUNSUPPORTED, p, "not enforced on a Qwen3-Coder call's text parameter%s", NULL);
	}
	json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
	if (en || cn) {
		json_t *vals = en ? json_incref(en) : json_pack("[O]", cn);
		uint32_t r = gb_rule(&c->b);
		size_t i;
		json_array_foreach(vals, i, v) {
			if (!json_is_string(v) || strchr(json_string_value(v), '<') ||
			    strlen(json_string_value(v)) != json_string_length(v)) {
				json_decref(vals);
				sc_sub_path(p, sizeof p, path, en ? "enum" : "const");
				return sc_fail(c, BATON_EUNSUPPORTED, p, "a Qwen3-Coder text parameter's values must be strings "
				    "without '<'%s", NULL);
			}
			struct gseq q = {0};
			gs_lit(&q, json_string_value(v), json_string_length(v));
			gb_alt(&c->b, r, &q);
			gs_free(&q);
		}
		json_decref(vals);
		if (!json_array_size(en) && en) {
			sc_sub_path(p, sizeof p, path, "enum");
			return sc_fail(c, BATON_EINVAL, p, "an empty enum admits no value%s", NULL);
		}
		*out = r;
		return 0;
	}
	uint32_t lo = 0, hi = UINT32_MAX;
	if (sc_count_kw(c, s, "minLength", path, &lo) || sc_count_kw(c, s, "maxLength", path, &hi))
		return BATON_EINVAL;
	if (lo > hi) {
		sc_sub_path(p, sizeof p, path, "minLength");
		return sc_fail(c, BATON_EINVAL, p, "more than maxLength%s", NULL);
	}
	/* lengths count characters: with a minimum, ASCII only (a byte each) */
	struct gseq q = {0};
	gs_rep(&q, set_but(c, "<", lo > 0), lo, hi);
	*out = sc_rule1(c, &q);
	gs_free(&q);
	return 0;
}

/* One tool's "NAME>" and parameters up to "</function>". */
static int xml_call(struct sc *c, json_t *fn, size_t i, uint32_t r)
{
	const char *name = json_string_value(json_object_get(fn, "name"));
	json_t *pa = json_object_get(fn, "parameters");
	char path[512], p[512];
	snprintf(path, sizeof path, "tools[%zu].function.parameters#", i);
	struct gseq q = {0};
	gs_lit(&q, name, strlen(name));
	gs_byte(&q, '>');
	sc_ws(c, &q);
	if (!json_is_true(json_object_get(fn, "strict")) || !pa || json_is_null(pa)) {
		/* not strict: any parameters, each any text */
		struct gseq one = {0};
		gs_lit(&one, "<parameter=", 11);
		gs_rep(&one, set_but(c, "<>", 1), 1, 128);
		gs_lit(&one, ">", 1);
		gs_rep(&one, set_but(c, "<", 0), 0, UINT32_MAX);
		gs_lit(&one, "</parameter>", 12);
		sc_ws(c, &one);
		uint32_t r1 = sc_rule1(c, &one), many = gb_rule(&c->b);
		struct gseq a = {0};
		gb_alt(&c->b, many, &a);
		gs_ref(&a, r1);
		gs_ref(&a, many);
		gb_alt(&c->b, many, &a);
		gs_free(&one);
		gs_free(&a);
		gs_ref(&q, many);
	} else {
		json_t *props = json_object_get(pa, "properties"), *req = json_object_get(pa, "required"), *v;
		const char *k;
		if (!json_is_object(pa) || (props && !json_is_object(props)) || (req && !json_is_array(req))) {
			gs_free(&q);
			return sc_fail(c, BATON_EINVAL, path, "want an object schema with properties and required%s", NULL);
		}
		const char *kk;
		json_object_foreach(pa, kk, v)
			if (!sc_is_annotation(kk) && strcmp(kk, "type") && strcmp(kk, "properties") && strcmp(kk, "required") &&
			    strcmp(kk, "additionalProperties")) {
				gs_free(&q);
				sc_sub_path(p, sizeof p, path, kk);
				return sc_fail(c, BATON_EUNSUPPORTED, p, "not enforced on a Qwen3-Coder call's parameters%s", NULL);
			}
		for (size_t j = 0; j < json_array_size(req); j++)
			if (!json_is_string(json_array_get(req, j)) || !json_object_get(props, json_string_value(json_array_get(req, j)))) {
				gs_free(&q);
				sc_sub_path(p, sizeof p, path, "required");
				return sc_fail(c, BATON_EUNSUPPORTED, p, "a required parameter without its schema in properties%s", NULL);
			}
		/* the properties in their order, the optional ones may be left out */
		json_object_foreach(props, k, v) {
			uint32_t val;
			sc_sub_path(p, sizeof p, path, "properties");
			char pp[512];
			sc_sub_path(pp, sizeof pp, p, k);
			if (strchr(k, '>') || strchr(k, '<') || !k[0]) {
				gs_free(&q);
				return sc_fail(c, BATON_EUNSUPPORTED, pp, "a Qwen3-Coder parameter's name cannot hold '<' or '>'%s",
				    NULL);
			}
			int rc = xml_value(c, v, pp, &val);
			if (rc) {
				gs_free(&q);
				return rc;
			}
			struct gseq one = {0};
			gs_lit(&one, "<parameter=", 11);
			gs_lit(&one, k, strlen(k));
			gs_lit(&one, ">\n", 2);
			gs_ref(&one, val);
			gs_lit(&one, "\n</parameter>", 13);
			sc_ws(c, &one);
			uint32_t r1 = sc_rule1(c, &one);
			gs_free(&one);
			int required = 0;
			for (size_t j = 0; j < json_array_size(req); j++)
				required |= !strcmp(json_string_value(json_array_get(req, j)), k);
			if (!required) { /* r1 or nothing */
				uint32_t opt = gb_rule(&c->b);
				struct gseq a = {0};
				gb_alt(&c->b, opt, &a);
				gs_ref(&a, r1);
				gb_alt(&c->b, opt, &a);
				gs_free(&a);
				r1 = opt;
			}
			gs_ref(&q, r1);
		}
	}
	gs_lit(&q, "</function>", 11);
	gb_alt(&c->b, r, &q);
	gs_free(&q);
	return 0;
}

int gram_compile_xml_calls(gram **out, json_t *tools, char *err, size_t errlen)
{
	*out = NULL;
	struct sc c;
	sc_init(&c, err, errlen);
	uint32_t calls = gb_rule(&c.b);
	size_t i;
	json_t *t;
	int rc = 0;
	json_array_foreach(tools, i, t) {
		json_t *fn = json_object_get(t, "function");
		if (!json_is_string(json_object_get(fn, "name"))) {
			baton_errf(err, errlen, "tools[%zu].function.name: want a string", i);
			rc = BATON_EINVAL;
			break;
		}
		c.root = json_object_get(fn, "parameters"); /* its own "#" for $ref */
		for (size_t m = 0; m < c.n_memo; m++)
			free(c.memo[m].ref);
		c.n_memo = 0;
		if ((rc = xml_call(&c, fn, i, calls)) != 0)
			break;
	}
	uint32_t v = 0;
	if (!rc) {
		struct gseq q = {0};
		gs_lit(&q, "<function=", 10);
		gs_ref(&q, calls);
		v = sc_rule1(&c, &q);
		gs_free(&q);
	}
	if (!rc && c.b.oom)
		rc = c.b.n_el + 64 > GB_MAX_ELEMENTS ? BATON_EUNSUPPORTED : BATON_ENOMEM;
	if (rc == BATON_EUNSUPPORTED && c.b.oom)
		baton_errf(err, errlen, "tools: their calls make a grammar too large");
	return sc_finish(&c, rc, v, out);
}
