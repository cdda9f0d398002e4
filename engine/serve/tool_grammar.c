/*
 * tool_grammar.c: the grammars a request's tools make (openai.h): a forced
 * tool_choice's (the output is the call) and strict tools' with
 * tool_choice auto (a call the model opens must fit). oai_parse and
 * oai_bind (openai.c) choose which.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai.h"
#include "proto/base/base.h"

#define INVALID "invalid_request_error"

/* "#"-pointers of a tool's parameters, rewritten to start at base (where
 * the wrapper of the calls' schema keeps them). */
static void rebase_refs(json_t *v, const char *base)
{
	const char *k;
	json_t *x;
	size_t i;
	if (json_is_object(v)) {
		json_object_foreach(v, k, x) {
			if (strcmp(k, "$ref") == 0 && json_is_string(x) && json_string_value(x)[0] == '#') {
				char *n = NULL;
				if (asprintf(&n, "%s%s", base, json_string_value(x) + 1) > 0)
					json_object_set_new(v, k, json_string(n));
				free(n);
			} else {
				rebase_refs(x, base);
			}
		}
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, x)
			rebase_refs(x, base);
	}
}

/* Tool i's arguments inside a schema of the calls (root: its $defs get
 * the parameters whole, as "baton_tool_I", their $ref, $defs and
 * definitions pointing where they did at their own root); any object
 * without parameters. A new reference. */
static json_t *tool_args(json_t *root, json_t *fn, size_t i)
{
	json_t *pa = json_object_get(fn, "parameters");
	if (!pa || json_is_null(pa))
		return json_pack("{s:s}", "type", "object");
	char name[40], base[56];
	snprintf(name, sizeof name, "baton_tool_%zu", i);
	snprintf(base, sizeof base, "#/$defs/%s", name);
	json_t *copy = json_deep_copy(pa), *defs = json_object_get(root, "$defs");
	if (!defs)
		json_object_set_new(root, "$defs", defs = json_object());
	rebase_refs(copy, base);
	json_object_set_new(defs, name, copy);
	return json_pack("{s:s}", "$ref", base);
}

/* tool_choice "required" or a named function: the output is made a tool
 * call by the grammar (vLLM's way): for a named one its arguments, a
 * document of its parameters' schema; for "required" an array of one or
 * more {"name", "arguments"} of the tools (one with parallel_tool_calls
 * false). */
int oai_forced_tool_grammar(struct oai_request *r, const char *name, struct oai_error *e)
{
	json_t *schema = NULL;
	size_t i;
	json_t *t;
	if (name) {
		json_array_foreach(r->tools, i, t) {
			json_t *fn = json_object_get(t, "function");
			if (strcmp(json_string_value(json_object_get(fn, "name")), name) == 0) {
				json_t *pa = json_object_get(fn, "parameters");
				schema = pa && !json_is_null(pa) ? json_incref(pa) : json_pack("{s:s}", "type", "object");
			}
		}
		if (!schema)
			return oai_errorf(e, 400, INVALID, NULL, "tool_choice", "tool_choice: no tool is named '%.60s'",
			    name);
	} else {
		json_t *any = json_array();
		schema = json_object();
		json_array_foreach(r->tools, i, t) {
			json_t *fn = json_object_get(t, "function");
			json_array_append_new(any, json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type", "object",
			    "properties", "name", "const", json_object_get(fn, "name"), "arguments", tool_args(schema, fn, i),
			    "required", "name", "arguments", "additionalProperties", 0));
		}
		json_object_update_new(schema, json_pack("{s:s, s:i, s:{s:o}}", "type", "array", "minItems", 1, "items",
		    "anyOf", any));
		if (schema && !r->parallel_tool_calls)
			json_object_set_new(schema, "maxItems", json_integer(1));
	}
	char err[400] = "";
	int rc = schema ? gram_compile_schema(&r->grammar, schema, err, sizeof err) : BATON_ENOMEM;
	json_decref(schema);
	if (rc == BATON_EUNSUPPORTED || rc == BATON_EINVAL)
		return oai_errorf(e, 400, INVALID, rc == BATON_EUNSUPPORTED ? "unsupported_parameter" : NULL, "tools",
		    "tools: a forced tool_choice enforces the parameters' schema, and %s", err);
	if (rc)
		return oai_errorf(e, 500, "server_error", NULL, NULL, "tool_choice: %s", baton_strerror(rc));
	r->q.grammar = r->grammar;
	return 0;
}

/* strict: true with tool_choice auto: the text is free, and a call the
 * model opens is a document of {"name", "arguments"} of one of the tools
 * (a strict tool's arguments valid for its parameters, another's any
 * object), the grammar holding from the call's opening tag (oai_bind sets
 * the template's) until its object closes. */
int oai_strict_auto_grammar(struct oai_request *r, enum oai_tool_format fmt, struct oai_error *e)
{
	char err[400] = "";
	gram_free(r->grammar);
	r->grammar = NULL;
	r->q.grammar = NULL;
	if (fmt == OAI_TOOLS_QWEN3_CODER) { /* XML-style: not JSON, its own compiler */
		int rc = gram_compile_xml_calls(&r->grammar, r->tools, err, sizeof err);
		if (rc == BATON_EUNSUPPORTED || rc == BATON_EINVAL)
			return oai_errorf(e, 400, INVALID, rc == BATON_EUNSUPPORTED ? "unsupported_parameter" : NULL, "tools",
			    "tools[%d].function.strict: true enforces the calls of this model's format (qwen3_coder), and %s",
			    r->strict_auto, err);
		if (rc)
			return oai_errorf(e, 500, "server_error", NULL, NULL, "tools: %s", baton_strerror(rc));
		r->q.grammar = r->grammar;
		return 0;
	}
	json_t *any = json_array(), *t, *root = json_object();
	size_t i;
	json_array_foreach(r->tools, i, t) {
		json_t *fn = json_object_get(t, "function");
		json_t *args = json_is_true(json_object_get(fn, "strict")) ? tool_args(root, fn, i) :
		    json_pack("{s:s}", "type", "object");
		json_array_append_new(any, json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type", "object",
		    "properties", "name", "const", json_object_get(fn, "name"), "arguments", args, "required", "name",
		    "arguments", "additionalProperties", 0));
	}
	/* Hermes: one {"name", "arguments"} after <tool_call>; Mistral v3: an
	 * array of them after [TOOL_CALLS] (one unless parallel) */
	json_t *schema = root;
	json_object_update_new(schema, fmt == OAI_TOOLS_MISTRAL ? json_pack("{s:s, s:{s:o}, s:i}", "type", "array",
	    "items", "anyOf", any, "minItems", 1) : json_pack("{s:o}", "anyOf", any));
	if (fmt == OAI_TOOLS_MISTRAL && !r->parallel_tool_calls)
		json_object_set_new(schema, "maxItems", json_integer(1));
	int rc = schema ? gram_compile_schema(&r->grammar, schema, err, sizeof err) : BATON_ENOMEM;
	json_decref(schema);
	if (rc == BATON_EUNSUPPORTED || rc == BATON_EINVAL) {
		char param[48];
		snprintf(param, sizeof param, "tools[%d]", r->strict_auto);
		return oai_errorf(e, 400, INVALID, rc == BATON_EUNSUPPORTED ? "unsupported_parameter" : NULL, param,
		    "%s.function.strict: true enforces the parameters' schema, and %s", param, err);
	}
	if (rc)
		return oai_errorf(e, 500, "server_error", NULL, NULL, "tools: %s", baton_strerror(rc));
	r->q.grammar = r->grammar;
	return 0;
}
