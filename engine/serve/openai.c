/*
 * openai.c: OpenAI-compatible requests parsed and checked (see openai.h;
 * the replies' shapes are openai_reply.c's, the tools' grammars
 * tool_grammar.c's). Every field is checked before a request waits for
 * the model, so a bad one costs nothing and is named in the 400.
 */
#include <math.h>
#include <pthread.h>
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

/* The fields of OpenAI's reference for /v1/chat/completions and
 * /v1/completions, with vLLM's extensions, and what this engine does with
 * each (docs/reference/openai.md has the table):
 *   IMPL    implemented (parsed below);
 *   DEF     accepted when it carries its default (def, JSON) or null,
 *           else 400 naming it with `why`;
 *   IGNORE  accepted with any value and ignored (it changes nothing here);
 * anything else is outside the reference: ignored, counted, logged once. */
enum { K_CHAT = 1, K_COMPL = 2, K_BOTH = 3 };
enum { IMPL, DEF, IGNORE };
static const struct field_rule {
	const char *name;
	int kinds, how;
	const char *def;   /* DEF: the accepted values, JSON, separated by '|' */
	const char *why;
} rules[] = {
	{ "model", K_BOTH, IMPL, NULL, NULL },
	{ "messages", K_CHAT, IMPL, NULL, NULL },
	{ "prompt", K_COMPL, IMPL, NULL, NULL },
	{ "max_tokens", K_BOTH, IMPL, NULL, NULL },
	{ "max_completion_tokens", K_CHAT, IMPL, NULL, NULL },
	{ "temperature", K_BOTH, IMPL, NULL, NULL },
	{ "top_p", K_BOTH, IMPL, NULL, NULL },
	{ "presence_penalty", K_BOTH, IMPL, NULL, NULL },
	{ "frequency_penalty", K_BOTH, IMPL, NULL, NULL },
	{ "seed", K_BOTH, IMPL, NULL, NULL },
	{ "stop", K_BOTH, IMPL, NULL, NULL },
	{ "stream", K_BOTH, IMPL, NULL, NULL },
	{ "stream_options", K_BOTH, IMPL, NULL, NULL },
	{ "n", K_BOTH, IMPL, NULL, NULL },
	{ "logit_bias", K_BOTH, IMPL, NULL, NULL },
	{ "tools", K_CHAT, IMPL, NULL, NULL },
	{ "tool_choice", K_CHAT, IMPL, NULL, NULL },
	{ "parallel_tool_calls", K_CHAT, IMPL, NULL, NULL },
	{ "reasoning_effort", K_CHAT, IMPL, NULL, NULL },
	{ "logprobs", K_BOTH, IMPL, NULL, NULL },
	{ "top_logprobs", K_CHAT, IMPL, NULL, NULL },
	{ "echo", K_COMPL, IMPL, NULL, NULL },
	{ "response_format", K_BOTH, IMPL, NULL, NULL },
	{ "best_of", K_COMPL, DEF, "1", "only 1 is supported" },
	{ "suffix", K_COMPL, DEF, "\"\"", "suffix (insertion) is not supported by this engine" },
	{ "audio", K_CHAT, DEF, "", "audio output is not supported by this engine" },
	{ "modalities", K_CHAT, DEF, "[\"text\"]", "only [\"text\"]: audio output is not supported" },
	{ "store", K_CHAT, DEF, "false", "this engine stores no completions" },
	{ "verbosity", K_CHAT, DEF, "\"medium\"", "only \"medium\" is supported" },
	{ "web_search_options", K_CHAT, DEF, "", "web search is not supported by this engine" },
	{ "functions", K_CHAT, DEF, "[]", "the deprecated functions are not supported: send tools" },
	{ "function_call", K_CHAT, DEF, "\"none\"|\"auto\"",
	  "the deprecated function_call is not supported: send tool_choice" },
	{ "metadata", K_CHAT, IGNORE, NULL, NULL },
	{ "user", K_BOTH, IGNORE, NULL, NULL },
	{ "service_tier", K_CHAT, IGNORE, NULL, NULL },
	{ "prompt_cache_key", K_CHAT, IGNORE, NULL, NULL },
	{ "safety_identifier", K_CHAT, IGNORE, NULL, NULL },
	{ "prediction", K_CHAT, IGNORE, NULL, NULL },
	/* vLLM's extensions */
	{ "top_k", K_BOTH, IMPL, NULL, NULL },
	{ "min_p", K_BOTH, IMPL, NULL, NULL },
	{ "repetition_penalty", K_BOTH, IMPL, NULL, NULL },
	{ "chat_template_kwargs", K_CHAT, IMPL, NULL, NULL },
};

/* ---- fields outside the reference: counted, logged once ---- */
#define MAX_IGNORED 64
static pthread_mutex_t ign_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { char name[48]; unsigned long long count; } ign[MAX_IGNORED];
static unsigned long long ign_others;

void oai_note_ignored(const char *where, const char *key)
{
	char name[48];
	snprintf(name, sizeof name, "%s%s", where, key);
	int first = 0;
	pthread_mutex_lock(&ign_mu);
	size_t i = 0;
	while (i < MAX_IGNORED && ign[i].name[0] && strcmp(ign[i].name, name))
		i++;
	if (i == MAX_IGNORED) {
		ign_others++;
	} else {
		first = !ign[i].name[0];
		if (first)
			memcpy(ign[i].name, name, sizeof name);
		ign[i].count++;
	}
	pthread_mutex_unlock(&ign_mu);
	if (first)
		fprintf(stderr, "baton-engine: openai: ignoring the field '%s', which OpenAI's reference does not "
		    "define (said once; counted in GET /health's ignored_fields)\n", name);
}

void oai_ignored_fields(json_t *obj)
{
	json_t *o = json_object();
	pthread_mutex_lock(&ign_mu);
	for (size_t i = 0; i < MAX_IGNORED && ign[i].name[0]; i++)
		json_object_set_new(o, ign[i].name, json_integer((json_int_t)ign[i].count));
	if (ign_others)
		json_object_set_new(o, "(others)", json_integer((json_int_t)ign_others));
	pthread_mutex_unlock(&ign_mu);
	if (json_object_size(o))
		json_object_set_new(obj, "ignored_fields", o);
	else
		json_decref(o);
}

/* v equals one of the '|'-separated JSON values of def. */
static int is_default(json_t *v, const char *def)
{
	char buf[128];
	while (*def) {
		const char *bar = strchr(def, '|');
		size_t n = bar ? (size_t)(bar - def) : strlen(def);
		snprintf(buf, sizeof buf, "%.*s", (int)n, def);
		json_t *d = json_loads(buf, JSON_DECODE_ANY, NULL);
		int eq = d && json_equal(v, d);
		json_decref(d);
		if (eq)
			return 1;
		def += n + (bar ? 1 : 0);
	}
	return 0;
}

static int check_keys(enum oai_kind kind, json_t *root, struct oai_error *e)
{
	const char *key;
	json_t *v;
	int k = kind == OAI_CHAT ? K_CHAT : K_COMPL;
	json_object_foreach(root, key, v) {
		const struct field_rule *f = NULL;
		for (size_t i = 0; i < sizeof rules / sizeof rules[0] && !f; i++)
			if (strcmp(key, rules[i].name) == 0 && (rules[i].kinds & k))
				f = &rules[i];
		if (!f) {
			oai_note_ignored("", key);
			continue;
		}
		if (f->how == DEF && !json_is_null(v) && !is_default(v, f->def))
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", key, "%s: %s", key, f->why);
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

/* A string the request owns (freed with it); NULL without memory. */
static const char *own(struct oai_request *r, char *str)
{
	char **o = str ? realloc(r->owned, (r->n_owned + 1) * sizeof *o) : NULL;
	if (!o) {
		free(str);
		return NULL;
	}
	r->owned = o;
	r->owned[r->n_owned++] = str;
	return str;
}

/* A message's tool_calls (assistant), tool_call_id (tool) and name, as
 * transformers passes them to the template: tool_calls a list with each
 * function's arguments a mapping when they are a JSON object (vLLM does
 * so: templates write `arguments | tojson`), else the string as given. */
static int message_tools(json_t *m, size_t i, const char *role, struct oai_request *r, struct text_msg *out,
    struct oai_error *e)
{
	char param[64];
	json_t *name = field(m, "name"), *id = field(m, "tool_call_id"), *tc = field(m, "tool_calls");
	if (name && !json_is_string(name)) {
		snprintf(param, sizeof param, "messages[%zu].name", i);
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: want a string", param);
	}
	out->name = name ? json_string_value(name) : NULL;
	if (id) {
		snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
		if (!json_is_string(id))
			return oai_errorf(e, 400, INVALID, NULL, param, "%s: want a string", param);
		out->tool_call_id = json_string_value(id);
	} else if (strcmp(role, "tool") == 0) {
		snprintf(param, sizeof param, "messages[%zu].tool_call_id", i);
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: required for a tool message", param);
	}
	if (!tc)
		return 0;
	snprintf(param, sizeof param, "messages[%zu].tool_calls", i);
	if (strcmp(role, "assistant") != 0)
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: only an assistant message has tool_calls", param);
	if (!json_is_array(tc))
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: want an array", param);
	if (json_array_size(tc) == 0)
		return 0;
	json_t *list = json_array();
	size_t k;
	json_t *c;
	json_array_foreach(tc, k, c) {
		json_t *type = json_object_get(c, "type"), *fn = json_object_get(c, "function");
		json_t *fname = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
		json_t *cid = json_object_get(c, "id");
		if (!json_is_object(c) || (type && !json_is_null(type) && !(json_is_string(type) &&
		    strcmp(json_string_value(type), "function") == 0)) || !json_is_object(fn) ||
		    !json_is_string(fname) || (args && !json_is_string(args) && !json_is_object(args)) ||
		    (cid && !json_is_string(cid))) {
			json_decref(list);
			return oai_errorf(e, 400, INVALID, NULL, param, "%s[%zu]: want {\"id\", \"type\": \"function\", "
			    "\"function\": {\"name\", \"arguments\": a JSON string}}", param, k);
		}
		json_t *a = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : json_incref(args);
		if (!json_is_object(a)) {
			json_decref(a);
			a = args ? json_incref(args) : json_object();
		}
		json_t *x = json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", fname,
		    "arguments", a);
		if (x && cid)
			json_object_set(x, "id", cid);
		if (!x || json_array_append_new(list, x)) {
			json_decref(list);
			return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
		}
	}
	out->tool_calls = own(r, json_dumps(list, JSON_COMPACT));
	json_decref(list);
	if (!out->tool_calls)
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
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
			static const char *const mk[] = { "role", "content", "name", "reasoning_content", "tool_calls",
				"tool_call_id", "refusal", "audio", "function_call", NULL };
			size_t j = 0;
			while (mk[j] && strcmp(key, mk[j]))
				j++;
			if (!mk[j])
				oai_note_ignored("messages[].", key);
			else if (j >= 6 && !json_is_null(v) && !(j == 6 && json_is_string(v))) {
				/* refusal: a string is kept out of the prompt, as OpenAI's own */
				snprintf(param, sizeof param, "messages[%zu].%s", i, key);
				return oai_errorf(e, 400, INVALID, "unsupported_parameter", param,
				    "%s: not supported by this engine%s", param,
				    j == 8 ? " (the deprecated function_call: send tool_calls)" : "");
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
		if (message_tools(m, i, ro, r, &r->msgs[i], e))
			return e->status;
	}
	r->q.msgs = r->msgs;
	r->q.n_msgs = n;
	return 0;
}

/* A token-id prompt: an array of integers. */
static int prompt_ids(json_t *a, struct oai_request *r, struct oai_error *e)
{
	size_t n = json_array_size(a), i;
	json_t *v;
	if (n == 0)
		return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: empty");
	if (!(r->ids = malloc(n * sizeof *r->ids)))
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	json_array_foreach(a, i, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
			return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt[%zu]: want a token id", i);
		r->ids[i] = (uint32_t)json_integer_value(v);
	}
	r->q.prompt_ids = r->ids;
	r->q.n_prompt_ids = n;
	return 0;
}

/* A string, or token ids; an array of one of those (a batch of one). A
 * batch of more is refused: one request per prompt. */
static int parse_prompt(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *p = field(root, "prompt");
	if (!p)
		return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: required");
	if (json_is_array(p) && json_array_size(p) > 0 && json_is_integer(json_array_get(p, 0)))
		return prompt_ids(p, r, e);
	if (json_is_array(p)) {
		json_t *x = json_array_get(p, 0);
		if (json_array_size(p) != 1 || !(json_is_string(x) || json_is_array(x)))
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", "prompt", "prompt: a string, token ids, "
			    "or an array of exactly one of those (batches of prompts are not supported: send one "
			    "request per prompt)");
		if (json_is_array(x))
			return prompt_ids(x, r, e);
		p = x;
	}
	if (!json_is_string(p))
		return oai_errorf(e, 400, INVALID, NULL, "prompt", "prompt: want a string or token ids");
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

/* logit_bias: {"TOKEN_ID": bias in [-100, 100]}, the sampler's step 1.
 * An id beyond the vocabulary is refused when the sampler is made. */
static int parse_bias(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *b = field(root, "logit_bias");
	if (!b)
		return 0;
	if (!json_is_object(b))
		return oai_errorf(e, 400, INVALID, NULL, "logit_bias", "logit_bias: want an object of token id: bias");
	size_t n = json_object_size(b);
	if (n == 0)
		return 0;
	if (n > OAI_MAX_LOGIT_BIAS)
		return oai_errorf(e, 400, INVALID, NULL, "logit_bias", "logit_bias: %zu entries; at most %u", n,
		    OAI_MAX_LOGIT_BIAS);
	if (!(r->bias = calloc(n, sizeof *r->bias)))
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	const char *k;
	json_t *v;
	size_t i = 0;
	json_object_foreach(b, k, v) {
		uint64_t id = 0;
		if (baton_parse_u64(k, 0, UINT32_MAX - 1, &id) != 0)
			return oai_errorf(e, 400, INVALID, NULL, "logit_bias", "logit_bias: '%.40s' is not a token id", k);
		double x = json_is_number(v) ? json_number_value(v) : NAN;
		if (!(x >= -100 && x <= 100))
			return oai_errorf(e, 400, INVALID, NULL, "logit_bias", "logit_bias[%s]: want a number in "
			    "[-100, 100]", k);
		r->bias[i].token = (uint32_t)id;
		r->bias[i].bias = (float)x;
		i++;
	}
	r->q.sp.bias = r->bias;
	r->q.sp.n_bias = (uint32_t)n;
	return 0;
}

/* Chat: logprobs (bool) and top_logprobs 0..20; completions: logprobs
 * (an integer 0..5, alternatives per token) and echo. */
static int parse_logprobs(enum oai_kind kind, json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *lp = field(root, "logprobs");
	if (kind == OAI_CHAT) {
		if (lp && !json_is_boolean(lp))
			return oai_errorf(e, 400, INVALID, NULL, "logprobs", "logprobs: want true or false");
		r->logprobs = lp && json_is_true(lp);
		long long x = 0;
		int given = 0;
		if (parse_int(root, "top_logprobs", 0, OAI_MAX_TOP_LOGPROBS, &x, &given, e))
			return e->status;
		if (given && x > 0 && !r->logprobs)
			return oai_errorf(e, 400, INVALID, NULL, "top_logprobs", "top_logprobs: only with logprobs: true");
		r->top_logprobs = (int)x;
	} else {
		long long x = 0;
		int given = 0;
		if (parse_int(root, "logprobs", 0, 5, &x, &given, e))
			return e->status;
		r->logprobs = given;
		r->top_logprobs = (int)x;
		json_t *ec = field(root, "echo");
		if (ec && !json_is_boolean(ec))
			return oai_errorf(e, 400, INVALID, NULL, "echo", "echo: want true or false");
		r->echo = ec && json_is_true(ec);
	}
	if (r->logprobs) {
		r->q.n_top = (uint32_t)r->top_logprobs;
		/* on_token is set by the server that answers (it has the tokenizer) */
	}
	if (r->echo && r->logprobs)
		return oai_errorf(e, 400, INVALID, "unsupported_parameter", "echo",
		    "echo: with logprobs it asks for the prompt's log-probabilities, which this engine does not "
		    "compute; send echo or logprobs");
	return 0;
}

/* One tool: {"type": "function", "function": {"name", "description"?,
 * "parameters"?, "strict"?}}. */
static int check_tool(json_t *t, size_t i, struct oai_error *e)
{
	char param[48];
	snprintf(param, sizeof param, "tools[%zu]", i);
	json_t *type = json_object_get(t, "type"), *fn = json_object_get(t, "function");
	if (!json_is_object(t) || !json_is_string(type))
		return oai_errorf(e, 400, INVALID, NULL, param, "%s: want {\"type\": \"function\", \"function\": {...}}",
		    param);
	if (strcmp(json_string_value(type), "function") != 0)
		return oai_errorf(e, 400, INVALID, "unsupported_parameter", param, "%s: type '%.40s': only function "
		    "tools are supported", param, json_string_value(type));
	json_t *name = json_object_get(fn, "name"), *pa = json_object_get(fn, "parameters");
	json_t *st = json_object_get(fn, "strict"), *de = json_object_get(fn, "description");
	if (!json_is_object(fn) || !json_is_string(name) || json_string_length(name) == 0)
		return oai_errorf(e, 400, INVALID, NULL, param, "%s.function.name: required", param);
	if (pa && !json_is_null(pa) && !json_is_object(pa))
		return oai_errorf(e, 400, INVALID, NULL, param, "%s.function.parameters: want a JSON schema object",
		    param);
	if (de && !json_is_null(de) && !json_is_string(de))
		return oai_errorf(e, 400, INVALID, NULL, param, "%s.function.description: want a string", param);
	if (st && !json_is_null(st) && !json_is_boolean(st))
		return oai_errorf(e, 400, INVALID, NULL, param, "%s.function.strict: want true or false", param);
	return 0;
}

/* tools, tool_choice, parallel_tool_calls, reasoning_effort and
 * chat_template_kwargs. */
static int parse_chat_extras(json_t *root, struct oai_request *r, struct oai_error *e)
{
	json_t *tools = field(root, "tools");
	if (tools) {
		if (!json_is_array(tools))
			return oai_errorf(e, 400, INVALID, NULL, "tools", "tools: want an array");
		size_t i;
		json_t *t;
		json_array_foreach(tools, i, t)
			if (check_tool(t, i, e))
				return e->status;
		if (json_array_size(tools)) {
			r->tools = tools;
			if (!(r->q.tools = own(r, json_dumps(tools, JSON_COMPACT))))
				return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
		}
	}
	json_t *tc = field(root, "tool_choice");
	r->tool_choice = OAI_TC_AUTO;
	if (tc) {
		const char *c = json_is_string(tc) ? json_string_value(tc) : NULL;
		if (c && strcmp(c, "none") == 0)
			r->tool_choice = OAI_TC_NONE;
		else if (c && strcmp(c, "auto") == 0)
			r->tool_choice = OAI_TC_AUTO;
		else if (c && strcmp(c, "required") == 0)
			r->tool_choice = OAI_TC_REQUIRED;
		else if (json_is_object(tc) && json_is_string(json_object_get(json_object_get(tc, "function"), "name")) &&
		    json_is_string(json_object_get(tc, "type")) &&
		    strcmp(json_string_value(json_object_get(tc, "type")), "function") == 0) {
			r->tool_choice = OAI_TC_NAMED;
			r->tool_name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
		} else if (json_is_object(tc))
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", "tool_choice", "tool_choice: only "
			    "\"none\", \"auto\", \"required\" and {\"type\": \"function\", \"function\": {\"name\"}}");
		else
			return oai_errorf(e, 400, INVALID, NULL, "tool_choice", "tool_choice: want \"none\", \"auto\", "
			    "\"required\" or {\"type\": \"function\", \"function\": {\"name\"}}");
	}
	json_t *ptc = field(root, "parallel_tool_calls");
	if (ptc && !json_is_boolean(ptc))
		return oai_errorf(e, 400, INVALID, NULL, "parallel_tool_calls", "parallel_tool_calls: want true or false");
	r->parallel_tool_calls = !ptc || json_is_true(ptc);
	if (r->tool_choice == OAI_TC_REQUIRED || r->tool_choice == OAI_TC_NAMED) {
		if (!r->tools)
			return oai_errorf(e, 400, INVALID, NULL, "tool_choice", "tool_choice: %s needs tools",
			    r->tool_choice == OAI_TC_NAMED ? "a named function" : "\"required\"");
		if (oai_forced_tool_grammar(r, r->tool_choice == OAI_TC_NAMED ? r->tool_name : NULL, e))
			return e->status;
	} else if (r->tools && r->tool_choice == OAI_TC_AUTO) {
		size_t i;
		json_t *t;
		json_array_foreach(r->tools, i, t)
			if (json_is_true(json_object_get(json_object_get(t, "function"), "strict")) && r->strict_auto < 0)
				r->strict_auto = (int)i;
		if (r->strict_auto >= 0 && oai_strict_auto_grammar(r, OAI_TOOLS_HERMES, e)) /* oai_bind: the template's */
			return e->status;
	}
	json_t *re = field(root, "reasoning_effort");
	if (re) {
		static const char *const ok[] = { "none", "minimal", "low", "medium", "high", NULL };
		size_t i = 0;
		while (json_is_string(re) && ok[i] && strcmp(ok[i], json_string_value(re)))
			i++;
		if (!json_is_string(re) || !ok[i])
			return oai_errorf(e, 400, INVALID, NULL, "reasoning_effort", "reasoning_effort: want none, "
			    "minimal, low, medium or high");
		r->reasoning_effort = ok[i];
	}
	json_t *kw = field(root, "chat_template_kwargs");
	if (kw) {
		if (!json_is_object(kw))
			return oai_errorf(e, 400, INVALID, NULL, "chat_template_kwargs",
			    "chat_template_kwargs: want an object of the template's variables");
		json_t *th = json_object_get(kw, "enable_thinking");
		if (th && !json_is_boolean(th) && !json_is_null(th))
			return oai_errorf(e, 400, INVALID, NULL, "chat_template_kwargs",
			    "chat_template_kwargs.enable_thinking: want true or false");
		if (json_is_boolean(th))
			r->q.enable_thinking = json_is_true(th) ? 1 : 0;
		if (json_object_size(kw) && !(r->q.template_kwargs = own(r, json_dumps(kw, JSON_COMPACT))))
			return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	}
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
	if (r->grammar)
		return oai_errorf(e, 400, INVALID, "unsupported_parameter", P, r->strict_auto >= 0 ?
		    "response_format: strict tools enforce their calls' grammar, and one request has one: send "
		    "strict: false or no response_format" : "response_format: with a forced tool_choice the output "
		    "is the tool call; send one of them");
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
	/* n > 1: the HTTP API makes the choices (a request each, openai_http.c) */
	if (parse_int(root, "n", 1, OAI_MAX_N, &x, &given, e))
		return e->status;
	r->n = given ? (uint32_t)x : 1;
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
		/* include_obfuscation (OpenAI's padding of stream events) has
		 * nothing to hide here: accepted and ignored */
		json_t *iu = json_object_get(so, "include_usage"), *ob = json_object_get(so, "include_obfuscation");
		if (!json_is_object(so) || (iu && !json_is_boolean(iu) && !json_is_null(iu)) ||
		    (ob && !json_is_boolean(ob) && !json_is_null(ob)))
			return oai_errorf(e, 400, INVALID, NULL, "stream_options",
			    "stream_options: want {\"include_usage\": true|false}");
		const char *k;
		json_t *v;
		json_object_foreach(so, k, v)
			if (strcmp(k, "include_usage") && strcmp(k, "include_obfuscation"))
				oai_note_ignored("stream_options.", k);
		if (!r->stream && iu && json_is_true(iu))
			return oai_errorf(e, 400, INVALID, NULL, "stream_options",
			    "stream_options: include_usage only when stream is true");
		r->include_usage = iu && json_is_true(iu);
	}
	static const char *const strs[] = { "user", "service_tier", "prompt_cache_key", "safety_identifier" };
	for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++) {
		json_t *u = field(root, strs[i]);
		if (u && !json_is_string(u))
			return oai_errorf(e, 400, INVALID, NULL, strs[i], "%s: want a string", strs[i]);
	}
	json_t *md = field(root, "metadata");
	if (md && !json_is_object(md))
		return oai_errorf(e, 400, INVALID, NULL, "metadata", "metadata: want an object");
	if (parse_bias(root, r, e) || parse_logprobs(kind, root, r, e))
		return e->status;
	if (kind == OAI_CHAT && parse_chat_extras(root, r, e))
		return e->status;
	return parse_response_format(root, r, e);
}

int oai_parse(enum oai_kind kind, const char *served, const char *body, size_t len,
    uint64_t seed_default, struct oai_request *r, struct oai_error *e)
{
	memset(r, 0, sizeof *r);
	memset(e, 0, sizeof *e);
	r->kind = kind;
	r->strict_auto = -1;
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
	if (kind == OAI_AUTO) {
		if (field(r->root, "messages") && field(r->root, "prompt")) {
			/* the op's body has no path to say which: both is a mistake */
			oai_errorf(e, 400, INVALID, "unsupported_parameter", "prompt",
			    "prompt: give messages (a chat) or prompt (a completion), not both");
			oai_request_free(r);
			return e->status;
		}
		r->kind = kind = json_object_get(r->root, "messages") ? OAI_CHAT : OAI_COMPLETION;
	}
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
	free(r->bias);
	free(r->ids);
	for (size_t i = 0; i < r->n_owned; i++)
		free(r->owned[i]);
	free(r->owned);
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

int oai_bind(struct oai_request *r, const struct oai_caps *c, struct oai_error *e)
{
	if (r->kind != OAI_CHAT)
		return 0;
	if (r->tools && c->tools == OAI_TOOLS_NONE && r->tool_choice != OAI_TC_REQUIRED &&
	    r->tool_choice != OAI_TC_NAMED) { /* a forced call is the grammar's: any template */
		if (r->tool_choice != OAI_TC_NONE)
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", "tools", "tools: this model's chat "
			    "template takes no tools in a format this engine reads (Hermes/Qwen <tool_call>, "
			    "Qwen3-Coder, Mistral [TOOL_CALLS])");
		r->tools = NULL; /* tool_choice none: the model cannot call them anyway */
		r->q.tools = NULL;
	}
	r->q.keep_special = r->tools && r->tool_choice == OAI_TC_AUTO && c->tools == OAI_TOOLS_MISTRAL;
	if (r->tools && r->strict_auto >= 0 && r->tool_choice == OAI_TC_AUTO) {
		/* the calls' grammar in the template's format, from its opening tag */
		if (c->tools == OAI_TOOLS_NONE || (c->tools == OAI_TOOLS_MISTRAL && c->mistral_args))
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", "tools", "tools[%d].function.strict: "
			    "true with tool_choice \"auto\" is enforced for Hermes/Qwen3 <tool_call>, Qwen3-Coder's XML "
			    "calls and Mistral's [TOOL_CALLS] [{...}]; this model's template writes %s calls (force the "
			    "tool with tool_choice, or send strict: false)", r->strict_auto,
			    c->tools == OAI_TOOLS_MISTRAL ? "Mistral's NAME[ARGS]{...}" : oai_tool_format_name(c->tools));
		if (c->tools != OAI_TOOLS_HERMES && oai_strict_auto_grammar(r, c->tools, e))
			return e->status;
		r->q.grammar_trigger = c->tools == OAI_TOOLS_MISTRAL ? "[TOOL_CALLS]" : "<tool_call>";
	}
	if (r->reasoning_effort) {
		/* "none" turns thinking off where the template has the switch;
		 * the effort itself goes to templates that read it (gpt-oss) */
		if (strcmp(r->reasoning_effort, "none") == 0 && c->has_enable_thinking && r->q.enable_thinking < 0)
			r->q.enable_thinking = 0;
		if (c->has_reasoning_effort) {
			json_t *kw = r->q.template_kwargs ? json_loads(r->q.template_kwargs, 0, NULL) : json_object();
			if (!json_object_get(kw, "reasoning_effort"))
				json_object_set_new(kw, "reasoning_effort", json_string(r->reasoning_effort));
			const char *s = kw ? own(r, json_dumps(kw, JSON_COMPACT)) : NULL;
			json_decref(kw);
			if (!s)
				return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
			r->q.template_kwargs = s;
		}
	}
	return 0;
}
