/*
 * openai.c: OpenAI-compatible requests parsed and replies shaped (see
 * openai.h). Every field is checked before a request waits for the model,
 * so a bad one costs nothing and is named in the 400.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai.h"
#include "http/http.h"
#include "proto/base/base.h"

#define INVALID "invalid_request_error"

int oai_errorf(struct oai_error *e, int status, const char *type, const char *code,
    const char *param, const char *fmt, ...)
{
	e->status = status;
	e->type = type;
	e->code = code;
	snprintf(e->param, sizeof e->param, "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
	return status;
}

json_t *oai_error_json(const struct oai_error *e)
{
	return http_openai_error(e->status, e->message, e->type ? e->type : INVALID, e->param[0] ? e->param : NULL,
	    e->code);
}

/* The fields a request may carry, and what each kind accepts. */
enum { K_CHAT = 1, K_COMPL = 2, K_BOTH = 3 };
static const struct { const char *name; int kinds; } known[] = {
	{ "model", K_BOTH }, { "messages", K_CHAT }, { "prompt", K_COMPL },
	{ "max_tokens", K_BOTH }, { "max_completion_tokens", K_CHAT },
	{ "temperature", K_BOTH }, { "top_p", K_BOTH }, { "top_k", K_BOTH }, { "min_p", K_BOTH },
	{ "repetition_penalty", K_BOTH }, { "presence_penalty", K_BOTH },
	{ "frequency_penalty", K_BOTH }, { "seed", K_BOTH }, { "stop", K_BOTH },
	{ "stream", K_BOTH }, { "stream_options", K_BOTH }, { "n", K_BOTH }, { "user", K_BOTH },
	{ "chat_template_kwargs", K_CHAT }, { "response_format", K_BOTH },
};

/* Fields people send that this engine knowingly does not do: said so. */
static const char *const unsupported_why[][2] = {
	{ "tools", "tools (function calling) are not supported by this engine" },
	{ "tool_choice", "tools (function calling) are not supported by this engine" },
	{ "functions", "functions (function calling) are not supported by this engine" },
	{ "function_call", "functions (function calling) are not supported by this engine" },
	{ "logprobs", "logprobs are not supported by this engine" },
	{ "top_logprobs", "logprobs are not supported by this engine" },
	{ "logit_bias", "logit_bias is not supported by this engine" },
	{ "best_of", "best_of is not supported by this engine" },
	{ "echo", "echo is not supported by this engine" },
	{ "suffix", "suffix is not supported by this engine" },
};

static int check_keys(enum oai_kind kind, json_t *root, struct oai_error *e)
{
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		int ok = 0;
		for (size_t i = 0; i < sizeof known / sizeof known[0] && !ok; i++)
			ok = strcmp(key, known[i].name) == 0 &&
			    (known[i].kinds & (kind == OAI_CHAT ? K_CHAT : K_COMPL));
		if (ok)
			continue;
		for (size_t i = 0; i < sizeof unsupported_why / sizeof unsupported_why[0]; i++)
			if (strcmp(key, unsupported_why[i][0]) == 0)
				return oai_errorf(e, 400, INVALID, "unsupported_parameter", key,
				    "%s: %s", key, unsupported_why[i][1]);
		return oai_errorf(e, 400, INVALID, "unsupported_parameter", key,
		    "%.60s: unknown or unsupported field for %s", key,
		    kind == OAI_CHAT ? "/v1/chat/completions" : "/v1/completions");
	}
	return 0;
}

/* A field's value, NULL when absent or null (OpenAI's "not given"). */
static json_t *field(json_t *root, const char *key)
{
	json_t *v = json_object_get(root, key);
	return json_is_null(v) ? NULL : v;
}

/* A number in [lo, hi] into *dst. */
static int num(json_t *root, const char *key, double lo, double hi, float *dst, struct oai_error *e)
{
	json_t *v = field(root, key);
	if (!v)
		return 0;
	if (!json_is_number(v))
		return oai_errorf(e, 400, INVALID, NULL, key, "%s: want a number", key);
	double x = json_number_value(v);
	if (!isfinite(x) || x < lo || x > hi)
		return oai_errorf(e, 400, INVALID, NULL, key, "%s: %g is out of range [%g, %g]", key, x, lo, hi);
	*dst = (float)x;
	return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text"}
 * parts, joined (the joined string replaces the array in the tree, which
 * owns it). */
static int content_of(json_t *m, size_t i, const char **out, struct oai_error *e)
{
	char param[64];
	snprintf(param, sizeof param, "messages[%zu].content", i);
	json_t *c = json_object_get(m, "content");
	if (json_is_string(c)) {
		*out = json_string_value(c);
		return 0;
	}
	if (json_is_null(c) || !c) {
		*out = "";
		return 0;
	}
	if (!json_is_array(c))
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: want a string or an array of text parts", param);
	size_t total = 0, k;
	json_t *p;
	json_array_foreach(c, k, p) {
		json_t *type = json_object_get(p, "type"), *text = json_object_get(p, "text");
		if (!json_is_object(p) || !json_is_string(type) || strcmp(json_string_value(type), "text") ||
		    !json_is_string(text))
			return oai_errorf(e, 400, INVALID, NULL, param, "%s[%zu]: only {\"type\": \"text\", "
			    "\"text\": ...} parts are supported (no images or audio)", param, k);
		total += json_string_length(text);
	}
	char *buf = malloc(total + 1);
	if (!buf)
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	size_t at = 0;
	json_array_foreach(c, k, p) {
		json_t *text = json_object_get(p, "text");
		memcpy(buf + at, json_string_value(text), json_string_length(text));
		at += json_string_length(text);
	}
	buf[at] = '\0';
	json_t *s = json_stringn(buf, at);
	free(buf);
	if (!s || json_object_set_new(m, "content", s) != 0)
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: not valid UTF-8 text", param);
	*out = json_string_value(json_object_get(m, "content"));
	return 0;
}

static int parse_messages(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *a = field(root, "messages");
	if (!a)
		return oai_errorf(e, 400, INVALID, NULL, "messages", "messages: required");
	if (!json_is_array(a) || json_array_size(a) == 0)
		return oai_errorf(e, 400, INVALID, NULL, "messages", "messages: want a non-empty array");
	size_t n = json_array_size(a);
	if (n > OAI_MAX_MESSAGES)
		return oai_errorf(e, 400, INVALID, NULL, "messages", "messages: %zu of them; at most %u", n,
		    OAI_MAX_MESSAGES);
	if (!(r->msgs = calloc(n, sizeof *r->msgs)))
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	size_t i;
	json_t *m;
	json_array_foreach(a, i, m) {
		char param[64];
		snprintf(param, sizeof param, "messages[%zu]", i);
		if (!json_is_object(m))
			return oai_errorf(e, 400, INVALID, NULL, param, "%s: want an object", param);
		const char *key;
		json_t *v;
		json_object_foreach(m, key, v) {
			if (strcmp(key, "role") && strcmp(key, "content") && strcmp(key, "name") &&
			    strcmp(key, "reasoning_content")) {
				snprintf(param, sizeof param, "messages[%zu].%.30s", i, key);
				return oai_errorf(e, 400, INVALID, "unsupported_parameter", param,
				    "%s: not supported by this engine%s", param,
				    strstr(key, "tool") || strstr(key, "function") ?
				    " (tools and function calling are not)" : "");
			}
		}
		json_t *role = json_object_get(m, "role");
		const char *ro = json_is_string(role) ? json_string_value(role) : "";
		if (strcmp(ro, "developer") == 0)
			ro = "system"; /* OpenAI's newer name for it */
		if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "tool")) {
			snprintf(param, sizeof param, "messages[%zu].role", i);
			return oai_errorf(e, 400, INVALID, NULL, param, "%s: want system, developer, user, "
			    "assistant or tool", param);
		}
		json_t *rc_ = json_object_get(m, "reasoning_content");
		if (rc_ && !json_is_null(rc_) && !json_is_string(rc_)) {
			snprintf(param, sizeof param, "messages[%zu].reasoning_content", i);
			return oai_errorf(e, 400, INVALID, NULL, param, "%s: want a string", param);
		}
		r->msgs[i].role = ro;
		r->msgs[i].reasoning_content = json_is_string(rc_) ? json_string_value(rc_) : NULL;
		if (content_of(m, i, &r->msgs[i].content, e))
			return e->status;
	}
	r->q.msgs = r->msgs;
	r->q.n_msgs = n;
	return 0;
}

static int parse_prompt(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *p = field(root, "prompt");
	if (!p)
		return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: required");
	if (json_is_array(p)) {
		if (json_array_size(p) != 1 || !json_is_string(json_array_get(p, 0)))
			return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: a string, or an array of "
			    "exactly one string (batches and token arrays are not supported)");
		p = json_array_get(p, 0);
	}
	if (!json_is_string(p))
		return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: want a string");
	if (json_string_length(p) == 0)
		return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: empty");
	r->q.prompt = json_string_value(p);
	r->q.prompt_len = json_string_length(p);
	return 0;
}

static int parse_stop(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *s = field(root, "stop");
	if (!s)
		return 0;
	size_t n = json_is_array(s) ? json_array_size(s) : 1;
	if (!json_is_string(s) && !json_is_array(s))
		return oai_errorf(e, 400, INVALID, NULL, "stop", "stop: want a string or an array of strings");
	if (n > OAI_MAX_STOP)
		return oai_errorf(e, 400, INVALID, NULL, "stop", "stop: %zu strings; at most %u", n, OAI_MAX_STOP);
	if (n == 0)
		return 0;
	if (!(r->stop = calloc(n, sizeof *r->stop)))
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *x = json_is_array(s) ? json_array_get(s, i) : s;
		if (!json_is_string(x) || json_string_length(x) == 0)
			return oai_errorf(e, 400, INVALID, NULL, "stop", "stop: want non-empty strings");
		r->stop[i] = json_string_value(x);
	}
	r->q.stop = r->stop;
	r->q.n_stop = n;
	return 0;
}

static int parse_int(json_t *root, const char *key, long long lo, long long hi, long long *out,
    int *given, struct oai_error *e)
{
	json_t *v = field(root, key);
	if (!v)
		return 0;
	if (!json_is_integer(v))
		return oai_errorf(e, 400, INVALID, NULL, key, "%s: want an integer", key);
	long long x = json_integer_value(v);
	if (x < lo || x > hi)
		return oai_errorf(e, 400, INVALID, NULL, key, "%s: %lld is out of range [%lld, %lld]", key, x, lo, hi);
	*out = x;
	*given = 1;
	return 0;
}

/* response_format: text (nothing), json_object (any JSON object) or
 * json_schema (its schema compiled; strict or not, it is enforced). A
 * schema the compiler cannot enforce is 400 with the keyword's pointer. */
static int parse_response_format(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *rf = field(root, "response_format");
	if (!rf)
		return 0;
	const char *P = "response_format";
	json_t *type = json_object_get(rf, "type");
	if (!json_is_object(rf) || !json_is_string(type))
		return oai_errorf(e, 400, INVALID, NULL, P, "response_format: want {\"type\": \"text\"}, "
		    "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {...}}");
	const char *t = json_string_value(type);
	char err[400] = "";
	int rc;
	if (strcmp(t, "text") == 0)
		return 0;
	if (strcmp(t, "json_object") == 0) {
		rc = gram_compile_json_object(&r->grammar, err, sizeof err);
	} else if (strcmp(t, "json_schema") == 0) {
		json_t *js = json_object_get(rf, "json_schema");
		if (!json_is_object(js))
			return oai_errorf(e, 400, INVALID, NULL, "response_format.json_schema",
			    "response_format.json_schema: want an object with a schema");
		json_t *strict = json_object_get(js, "strict"), *name = json_object_get(js, "name");
		if (strict && !json_is_boolean(strict) && !json_is_null(strict))
			return oai_errorf(e, 400, INVALID, NULL, "response_format.json_schema.strict",
			    "response_format.json_schema.strict: want true or false");
		if (name && !json_is_string(name))
			return oai_errorf(e, 400, INVALID, NULL, "response_format.json_schema.name",
			    "response_format.json_schema.name: want a string");
		json_t *schema = json_object_get(js, "schema");
		json_t *any = json_true();
		rc = gram_compile_schema(&r->grammar, schema && !json_is_null(schema) ? schema : any, err,
		    sizeof err);
		json_decref(any);
		if (rc == BATON_EUNSUPPORTED || rc == BATON_EINVAL)
			return oai_errorf(e, 400, INVALID, rc == BATON_EUNSUPPORTED ? "unsupported_parameter" : NULL,
			    "response_format.json_schema.schema", "response_format.json_schema.schema: %s", err);
	} else {
		return oai_errorf(e, 400, INVALID, NULL, "response_format.type", "response_format.type: "
		    "\"%.40s\" is not one of text, json_object, json_schema", t);
	}
	if (rc)
		return oai_errorf(e, 500, "server_error", NULL, NULL, "response_format: %s", err[0] ? err :
		    baton_strerror(rc));
	r->q.grammar = r->grammar;
	return 0;
}

static int parse_body(enum oai_kind kind, const char *served, json_t *root, uint64_t seed_default,
    struct oai_request *r, struct oai_error *e)
{
	if (check_keys(kind, root, e))
		return e->status;
	json_t *model = field(root, "model");
	if (model && !json_is_string(model))
		return oai_errorf(e, 400, INVALID, NULL, "model", "model: want a string");
	r->model = model ? json_string_value(model) : NULL;
	if (r->model && served && strcmp(r->model, served) != 0)
		return oai_errorf(e, 404, INVALID, "model_not_found", "model",
		    "The model '%.100s' does not exist: this engine serves '%s'", r->model, served);
	if (kind == OAI_CHAT ? parse_messages(root, r, e) : parse_prompt(root, r, e))
		return e->status;
	if (parse_stop(root, r, e))
		return e->status;
	struct baton_gen_request *q = &r->q;
	q->enable_thinking = -1;
	q->sp = baton_sample_defaults();
	q->sp.seed = seed_default;
	q->sp.max_tokens = kind == OAI_COMPLETION ? OAI_COMPLETION_DEFAULT_MAX_TOKENS : 0;
	long long x = 0;
	int given = 0;
	if (parse_int(root, "max_tokens", 1, UINT32_MAX, &x, &given, e) ||
	    (kind == OAI_CHAT && parse_int(root, "max_completion_tokens", 1, UINT32_MAX, &x, &given, e)))
		return e->status;
	if (given)
		q->sp.max_tokens = (uint32_t)x;
	given = 0;
	if (parse_int(root, "n", 1, 1, &x, &given, e))
		return oai_errorf(e, 400, INVALID, "unsupported_parameter", "n", "n: only 1 is supported");
	given = 0;
	if (parse_int(root, "top_k", -1, UINT32_MAX, &x, &given, e))
		return e->status;
	if (given)
		q->sp.top_k = x < 0 ? 0 : (uint32_t)x; /* -1: off, as vLLM */
	given = 0;
	if (parse_int(root, "seed", INT64_MIN, INT64_MAX, &x, &given, e))
		return e->status;
	if (given)
		q->sp.seed = (uint64_t)x;
	r->seeded = given;
	if (num(root, "temperature", 0, 2, &q->sp.temperature, e) ||
	    num(root, "top_p", 0, 1, &q->sp.top_p, e) ||
	    num(root, "min_p", 0, 1, &q->sp.min_p, e) ||
	    num(root, "repetition_penalty", 1e-3, 100, &q->sp.repetition_penalty, e) ||
	    num(root, "presence_penalty", -2, 2, &q->sp.presence_penalty, e) ||
	    num(root, "frequency_penalty", -2, 2, &q->sp.frequency_penalty, e))
		return e->status;
	if (q->sp.top_p <= 0)
		return oai_errorf(e, 400, INVALID, NULL, "top_p", "top_p: want a number in (0, 1]");
	json_t *st = field(root, "stream");
	if (st && !json_is_boolean(st))
		return oai_errorf(e, 400, INVALID, NULL, "stream", "stream: want true or false");
	r->stream = st && json_is_true(st);
	json_t *so = field(root, "stream_options");
	if (so) {
		json_t *iu = json_object_get(so, "include_usage");
		if (!json_is_object(so) || json_object_size(so) != (iu ? 1u : 0u) ||
		    (iu && !json_is_boolean(iu)))
			return oai_errorf(e, 400, INVALID, NULL, "stream_options",
			    "stream_options: want {\"include_usage\": true|false}");
		if (!r->stream)
			return oai_errorf(e, 400, INVALID, NULL, "stream_options",
			    "stream_options: only allowed when stream is true");
		r->include_usage = iu && json_is_true(iu);
	}
	json_t *user = field(root, "user");
	if (user && !json_is_string(user))
		return oai_errorf(e, 400, INVALID, NULL, "user", "user: want a string");
	json_t *kw = field(root, "chat_template_kwargs");
	if (kw) {
		json_t *th = json_object_get(kw, "enable_thinking");
		if (!json_is_object(kw) || json_object_size(kw) != (th ? 1u : 0u) || (th && !json_is_boolean(th)))
			return oai_errorf(e, 400, INVALID, NULL, "chat_template_kwargs",
			    "chat_template_kwargs: only {\"enable_thinking\": true|false} is supported");
		if (th)
			q->enable_thinking = json_is_true(th) ? 1 : 0;
	}
	return parse_response_format(root, r, e);
}

int oai_parse(enum oai_kind kind, const char *served, const char *body, size_t len,
    uint64_t seed_default, struct oai_request *r, struct oai_error *e)
{
	memset(r, 0, sizeof *r);
	memset(e, 0, sizeof *e);
	r->kind = kind;
	json_error_t je;
	r->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!r->root) {
		oai_errorf(e, 400, INVALID, NULL, NULL, "the body is not JSON: %s (at byte %d)", je.text,
		    je.position);
		return e->status;
	}
	if (!json_is_object(r->root)) {
		oai_errorf(e, 400, INVALID, NULL, NULL, "the body must be a JSON object");
		oai_request_free(r);
		return e->status;
	}
	if (kind == OAI_AUTO)
		r->kind = kind = json_object_get(r->root, "messages") ? OAI_CHAT : OAI_COMPLETION;
	if (parse_body(kind, served, r->root, seed_default, r, e)) {
		oai_request_free(r);
		return e->status;
	}
	return 0;
}

void oai_request_free(struct oai_request *r)
{
	json_decref(r->root);
	gram_free(r->grammar);
	free(r->msgs);
	free(r->stop);
	memset(r, 0, sizeof *r);
}

int oai_error_code(const struct oai_error *e)
{
	switch (e->status) {
	case 400:
		return e->code && strcmp(e->code, "unsupported_parameter") == 0 ? BATON_EUNSUPPORTED :
		    BATON_EINVAL;
	case 404: return BATON_ENOTFOUND;
	case 503: return BATON_EBUSY;
	default: return BATON_ENOMEM;
	}
}

const char *oai_finish_reason(const char *finish)
{
	return finish && strcmp(finish, "length") == 0 ? "length" : "stop";
}

static json_t *usage(uint32_t prompt, uint32_t completion)
{
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
	    (json_int_t)completion, "total_tokens", (json_int_t)prompt + completion);
}

json_t *oai_reply(enum oai_kind kind, const char *id, long long created, const char *model,
    const struct baton_gen_result *res)
{
	json_t *text = json_stringn(res->text ? res->text : "", res->text ? res->text_len : 0);
	if (!text)
		text = json_string(""); /* never: the stream decoder gives UTF-8 */
	json_t *choice = kind == OAI_CHAT ?
	    json_pack("{s:i, s:{s:s, s:o}, s:n, s:s}", "index", 0, "message", "role", "assistant",
		"content", text, "logprobs", "finish_reason", oai_finish_reason(res->finish)) :
	    json_pack("{s:o, s:i, s:n, s:s}", "text", text, "index", 0, "logprobs", "finish_reason",
		oai_finish_reason(res->finish));
	return json_pack("{s:s, s:s, s:I, s:s, s:[o], s:o}", "id", id, "object",
	    kind == OAI_CHAT ? "chat.completion" : "text_completion", "created", (json_int_t)created,
	    "model", model, "choices", choice, "usage", usage(res->n_prompt, res->n_tokens));
}

json_t *oai_chunk(enum oai_kind kind, const char *id, long long created, const char *model,
    const char *role, const char *text, size_t len, const char *finish, int usage_null)
{
	json_t *t = text ? json_stringn(text, len) : NULL;
	json_t *choice;
	if (kind == OAI_CHAT) {
		json_t *delta = json_object();
		if (role) {
			json_object_set_new(delta, "role", json_string(role));
			json_object_set_new(delta, "content", t ? t : json_string(""));
		} else if (t) {
			json_object_set_new(delta, "content", t);
		}
		choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", delta, "logprobs",
		    "finish_reason", finish ? json_string(oai_finish_reason(finish)) : json_null());
	} else {
		choice = json_pack("{s:o, s:i, s:n, s:o}", "text", t ? t : json_string(""), "index", 0,
		    "logprobs", "finish_reason", finish ? json_string(oai_finish_reason(finish)) : json_null());
	}
	json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
	    kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
	    (json_int_t)created, "model", model, "choices", choice);
	if (j && usage_null)
		json_object_set_new(j, "usage", json_null());
	return j;
}

json_t *oai_usage_chunk(enum oai_kind kind, const char *id, long long created, const char *model,
    uint32_t prompt_tokens, uint32_t completion_tokens)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
	    kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
	    (json_int_t)created, "model", model, "choices", "usage", usage(prompt_tokens, completion_tokens));
}

json_t *oai_models(const char *model, long long created)
{
	return json_pack("{s:s, s:[{s:s, s:s, s:I, s:s}]}", "object", "list", "data", "id", model,
	    "object", "model", "created", (json_int_t)created, "owned_by", "baton");
}

char *oai_sse(json_t *j, size_t *len)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!s)
		return NULL;
	size_t n = strlen(s);
	char *out = malloc(n + 9);
	if (out) {
		memcpy(out, "data: ", 6);
		memcpy(out + 6, s, n);
		memcpy(out + 6 + n, "\n\n", 3);
		*len = n + 8;
	}
	free(s);
	return out;
}
