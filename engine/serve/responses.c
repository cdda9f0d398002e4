/*
 * responses.c: OpenAI's Responses API (POST /v1/responses) over the chat
 * machinery (see openai.h, docs/reference/openai.md). A request is turned
 * into a chat completion's body (its input items into messages, its
 * instructions into the system message, text.format into response_format,
 * function tools into chat tools), which the one chat parser checks; the
 * answer's split pieces (reasoning, content, tool calls) become output
 * items: a reasoning item, a message with its output_text, function_call
 * items, streamed as the Responses API's typed events.
 *
 * Responses are kept in memory (store, default true) so that
 * previous_response_id, item_reference and GET /v1/responses/{id} find
 * them: the last RESP_STORE_MAX, at most RESP_STORE_BYTES of JSON in all
 * (one larger than an eighth of it is not kept), in this process only.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai_http.h"
#include "proto/base/base.h"

#define INVALID "invalid_request_error"
#define RESP_STORE_MAX 256u
/* What the kept responses may hold in all (their JSON's size); the oldest
 * go first. */
#define RESP_STORE_BYTES (64u << 20)

static const char *str_or(json_t *v);

/* ---- the store: the last responses, their conversations ---- */

struct stored {
	char id[48];
	json_t *response;      /* the response object */
	json_t *conversation;  /* chat messages: the input's (no instructions), then the output's */
	size_t bytes;
};
static pthread_mutex_t store_mu = PTHREAD_MUTEX_INITIALIZER;
static struct stored store[RESP_STORE_MAX];
static size_t store_next, store_bytes;

static size_t json_size(json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	size_t n = s ? strlen(s) : 0;
	free(s);
	return n;
}

static void store_drop(struct stored *s)
{
	json_decref(s->response);
	json_decref(s->conversation);
	store_bytes -= s->bytes;
	memset(s, 0, sizeof *s);
}

static void store_put(const char *id, json_t *response, json_t *conversation)
{
	size_t bytes = json_size(response) + json_size(conversation);
	if (bytes > RESP_STORE_BYTES / 8)
		return; /* too large to keep: previous_response_id will not find it */
	pthread_mutex_lock(&store_mu);
	/* the oldest go first: the slot taken, then others while over the budget */
	store_drop(&store[store_next % RESP_STORE_MAX]);
	for (size_t k = 1; k < RESP_STORE_MAX && store_bytes + bytes > RESP_STORE_BYTES; k++)
		store_drop(&store[(store_next + k) % RESP_STORE_MAX]);
	struct stored *s = &store[store_next++ % RESP_STORE_MAX];
	snprintf(s->id, sizeof s->id, "%s", id);
	s->response = json_incref(response);
	s->conversation = json_incref(conversation);
	s->bytes = bytes;
	store_bytes += bytes;
	pthread_mutex_unlock(&store_mu);
}

/* A copy of the stored response's conversation (NULL: not kept). */
static json_t *store_conversation(const char *id)
{
	json_t *c = NULL;
	pthread_mutex_lock(&store_mu);
	for (size_t i = 0; i < RESP_STORE_MAX && !c; i++)
		if (store[i].response && strcmp(store[i].id, id) == 0)
			c = json_deep_copy(store[i].conversation);
	pthread_mutex_unlock(&store_mu);
	return c;
}

/* A copy of an output item of a stored response (NULL: not kept). */
static json_t *store_item(const char *id)
{
	json_t *c = NULL, *it;
	size_t k;
	pthread_mutex_lock(&store_mu);
	for (size_t i = 0; i < RESP_STORE_MAX && !c; i++)
		if (store[i].response)
			json_array_foreach(json_object_get(store[i].response, "output"), k, it)
				if (!c && strcmp(str_or(json_object_get(it, "id")), id) == 0)
					c = json_deep_copy(it);
	pthread_mutex_unlock(&store_mu);
	return c;
}

int oai_resp_delete(const char *id)
{
	int found = 0;
	pthread_mutex_lock(&store_mu);
	for (size_t i = 0; i < RESP_STORE_MAX && !found; i++)
		if (store[i].response && strcmp(store[i].id, id) == 0) {
			store_drop(&store[i]);
			found = 1;
		}
	pthread_mutex_unlock(&store_mu);
	return found ? 0 : -1;
}

json_t *oai_resp_stored(const char *id)
{
	json_t *c = NULL;
	pthread_mutex_lock(&store_mu);
	for (size_t i = 0; i < RESP_STORE_MAX && !c; i++)
		if (store[i].response && strcmp(store[i].id, id) == 0)
			c = json_deep_copy(store[i].response);
	pthread_mutex_unlock(&store_mu);
	return c;
}

/* ---- the request: Responses fields into a chat body ---- */

/* The fields of the Responses API's reference: IMPL are translated below;
 * DEF accepted at their default (or null), else 400 with `why`; IGNORE
 * accepted and ignored; a field outside the table is ignored and counted
 * (openai.c's rule). EXT: vLLM's sampling extensions, passed on as they
 * are to the chat parser. */
enum { IMPL, DEF, IGNORE, EXT };
static const struct rule {
	const char *name;
	int how;
	const char *def;
	const char *why;
} rules[] = {
	{ "model", IMPL, NULL, NULL },
	{ "input", IMPL, NULL, NULL },
	{ "instructions", IMPL, NULL, NULL },
	{ "max_output_tokens", IMPL, NULL, NULL },
	{ "temperature", IMPL, NULL, NULL },
	{ "top_p", IMPL, NULL, NULL },
	{ "stream", IMPL, NULL, NULL },
	{ "stream_options", IMPL, NULL, NULL },
	{ "tools", IMPL, NULL, NULL },
	{ "tool_choice", IMPL, NULL, NULL },
	{ "parallel_tool_calls", IMPL, NULL, NULL },
	{ "reasoning", IMPL, NULL, NULL },
	{ "text", IMPL, NULL, NULL },
	{ "store", IMPL, NULL, NULL },
	{ "previous_response_id", IMPL, NULL, NULL },
	{ "include", IMPL, NULL, NULL },
	{ "background", DEF, "false", "background responses are not supported by this engine" },
	{ "conversation", DEF, "", "conversations are not kept by this engine: send previous_response_id or the "
	  "whole input" },
	{ "prompt", DEF, "", "stored prompt templates are not supported by this engine" },
	{ "truncation", DEF, "\"disabled\"", "only \"disabled\": an input longer than the context is refused" },
	{ "top_logprobs", IMPL, NULL, NULL },
	{ "max_tool_calls", IGNORE, NULL, NULL },
	{ "metadata", IGNORE, NULL, NULL },
	{ "user", IGNORE, NULL, NULL },
	{ "service_tier", IGNORE, NULL, NULL },
	{ "prompt_cache_key", IGNORE, NULL, NULL },
	{ "prompt_cache_retention", IGNORE, NULL, NULL },
	{ "safety_identifier", IGNORE, NULL, NULL },
	{ "seed", EXT, NULL, NULL },
	{ "top_k", EXT, NULL, NULL },
	{ "min_p", EXT, NULL, NULL },
	{ "repetition_penalty", EXT, NULL, NULL },
	{ "presence_penalty", EXT, NULL, NULL },
	{ "frequency_penalty", EXT, NULL, NULL },
	{ "logit_bias", EXT, NULL, NULL },
	{ "stop", EXT, NULL, NULL },
	{ "chat_template_kwargs", EXT, NULL, NULL },
};

struct oai_resp {
	json_t *req;           /* the request (echoed in the response) */
	json_t *conv;          /* the conversation's chat messages, without instructions */
	int stream, store;
	char id[48];
	long long created;
	char *model;
	uint64_t rng;
	/* the output */
	json_t *output;        /* items, closed ones */
	json_t *cur;           /* the item open (NULL: none) */
	int cur_kind;          /* OAI_P_REASONING, OAI_P_CONTENT, OAI_P_TOOL_START */
	struct oai_buf text;   /* the open item's text (or arguments) */
	json_t *calls;         /* chat tool_calls of the output (the stored conversation) */
	struct oai_buf content, reasoning;
	unsigned long long seq;
	oai_resp_write_fn w;
	void *warg;
	int failed, cut;
	/* include "message.output_text.logprobs": the entries of the tokens
	 * not yet in a delta, and those of the open message's output_text */
	json_t *lp_next, *lp_item;
};

static const char *str_or(json_t *v)
{
	return json_is_string(v) ? json_string_value(v) : "";
}

/* v (a new reference), or the default d (already one). */
static json_t *dflt(json_t *v, json_t *d)
{
	if (!v)
		return d;
	json_decref(d);
	return json_incref(v);
}

static const char *type_of(json_t *v)
{
	return json_string_value(json_object_get(v, "type"));
}

static char *rand_id(struct oai_resp *r, const char *prefix, char *buf, size_t n)
{
	static const char al[] = "abcdef0123456789";
	size_t p = (size_t)snprintf(buf, n, "%s", prefix);
	for (int i = 0; i < 32 && p + 1 < n; i++) {
		r->rng = r->rng * 6364136223846793005ull + 1442695040888963407ull;
		buf[p++] = al[(r->rng >> 33) % 16];
	}
	buf[p] = 0;
	return buf;
}

static int bad(struct oai_error *e, const char *param, const char *fmt, const char *a)
{
	return oai_errorf(e, 400, INVALID, NULL, param, fmt, param, a ? a : "");
}

/* A content (string or parts) as one text. */
static int content_text(json_t *c, const char *param, struct oai_buf *out, struct oai_error *e)
{
	if (json_is_string(c))
		return oai_buf_put(out, json_string_value(c), json_string_length(c)) ?
		    oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
	if (!json_is_array(c))
		return bad(e, param, "%s: want a string or an array of content parts%s", NULL);
	size_t i;
	json_t *p;
	json_array_foreach(c, i, p) {
		char pp[96];
		snprintf(pp, sizeof pp, "%s[%zu]", param, i);
		const char *t = type_of(p);
		json_t *tx = json_object_get(p, "text");
		if (!t)
			return bad(e, pp, "%s: want a content part {\"type\", ...}%s", NULL);
		if (strcmp(t, "input_text") && strcmp(t, "output_text") && strcmp(t, "text") && strcmp(t, "summary_text") &&
		    strcmp(t, "reasoning_text"))
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", pp, "%s: content of type '%.40s' is not "
			    "supported by this engine (text only: input_text, output_text)", pp, t);
		if (!json_is_string(tx))
			return bad(e, pp, "%s.text: want a string%s", NULL);
		if (oai_buf_put(out, json_string_value(tx), json_string_length(tx)))
			return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	}
	if (!out->p && oai_buf_put(out, "", 0))
		return oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
	return 0;
}

/* The last message when it is the assistant's (function calls join it). */
static json_t *last_assistant(json_t *msgs)
{
	json_t *m = json_array_get(msgs, json_array_size(msgs) - 1);
	const char *role = json_string_value(json_object_get(m, "role"));
	return role && strcmp(role, "assistant") == 0 ? m : NULL;
}

static int add_item(json_t *msgs, json_t *it, const char *param, struct oai_error *e);

/* One input item (or a stored item it references) onto the messages. */
static int add_item(json_t *msgs, json_t *it, const char *param, struct oai_error *e)
{
	char pp[96];
	if (!json_is_object(it))
		return bad(e, param, "%s: want an input item (an object)%s", NULL);
	const char *t = type_of(it);
	json_t *role = json_object_get(it, "role");
	if (!t || strcmp(t, "message") == 0) {
		const char *ro = json_string_value(role);
		if (!ro || (strcmp(ro, "user") && strcmp(ro, "system") && strcmp(ro, "developer") &&
		    strcmp(ro, "assistant")))
			return bad(e, param, "%s.role: want user, assistant, system or developer%s", NULL);
		struct oai_buf b = { 0 };
		snprintf(pp, sizeof pp, "%s.content", param);
		if (content_text(json_object_get(it, "content"), pp, &b, e)) {
			free(b.p);
			return e->status;
		}
		json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", strcmp(ro, "developer") ? ro : "system",
		    "content", b.p, b.n));
		free(b.p);
		return 0;
	}
	if (strcmp(t, "function_call") == 0) {
		json_t *cid = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
		json_t *args = json_object_get(it, "arguments");
		if (!json_is_string(cid) || !json_is_string(name) || !json_is_string(args))
			return bad(e, param, "%s: a function_call wants call_id, name and arguments (strings)%s", NULL);
		json_t *a = last_assistant(msgs);
		if (!a) {
			a = json_pack("{s:s, s:n}", "role", "assistant", "content");
			json_array_append_new(msgs, a);
		}
		json_t *tc = json_object_get(a, "tool_calls");
		if (!tc) {
			tc = json_array();
			json_object_set_new(a, "tool_calls", tc);
		}
		json_array_append_new(tc, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", cid, "type", "function", "function",
		    "name", name, "arguments", args));
		return 0;
	}
	if (strcmp(t, "function_call_output") == 0) {
		json_t *cid = json_object_get(it, "call_id");
		if (!json_is_string(cid))
			return bad(e, param, "%s.call_id: want a string%s", NULL);
		struct oai_buf b = { 0 };
		snprintf(pp, sizeof pp, "%s.output", param);
		if (content_text(json_object_get(it, "output"), pp, &b, e)) {
			free(b.p);
			return e->status;
		}
		json_array_append_new(msgs, json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", cid, "content",
		    b.p, b.n));
		free(b.p);
		return 0;
	}
	if (strcmp(t, "reasoning") == 0) {
		/* the model's earlier thinking: templates drop it from the history */
		return 0;
	}
	if (strcmp(t, "item_reference") == 0) {
		const char *id = json_string_value(json_object_get(it, "id"));
		if (!id)
			return bad(e, param, "%s.id: want a string%s", NULL);
		json_t *st = store_item(id);
		if (!st)
			return oai_errorf(e, 404, INVALID, "not_found", param, "%s: item '%.60s' is not kept by this engine "
			    "(it keeps the items of its last %u stored responses): send the item itself", param, id,
			    RESP_STORE_MAX);
		if (strcmp(str_or(json_object_get(st, "type")), "item_reference") == 0) {
			json_decref(st);
			return bad(e, param, "%s: a reference to a reference%s", NULL);
		}
		int rc = add_item(msgs, st, param, e);
		json_decref(st);
		return rc;
	}
	return oai_errorf(e, 400, INVALID, "unsupported_parameter", param, "%s: input items of type '%.40s' are not "
	    "supported by this engine (message, function_call, function_call_output, reasoning, item_reference)",
	    param, t);
}

static int check_keys(json_t *root, struct oai_error *e)
{
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		const struct rule *f = NULL;
		for (size_t i = 0; i < sizeof rules / sizeof rules[0] && !f; i++)
			if (strcmp(key, rules[i].name) == 0)
				f = &rules[i];
		if (!f) {
			oai_note_ignored("responses.", key);
			continue;
		}
		if (f->how == DEF && !json_is_null(v)) {
			json_t *d = f->def[0] ? json_loads(f->def, JSON_DECODE_ANY, NULL) : NULL;
			int ok = d && json_equal(d, v);
			json_decref(d);
			if (!ok)
				return oai_errorf(e, 400, INVALID, "unsupported_parameter", key, "%s: %s", key, f->why);
		}
	}
	return 0;
}

static json_t *given(json_t *root, const char *key)
{
	json_t *v = json_object_get(root, key);
	return json_is_null(v) ? NULL : v;
}

/* tools: [{"type": "function", "name", "description", "parameters", "strict"}] -> chat's. */
static int tools_of(json_t *tools, json_t *chat, struct oai_error *e)
{
	if (!json_is_array(tools))
		return bad(e, "tools", "%s: want an array of tools%s", NULL);
	json_t *out = json_array(), *t;
	size_t i;
	json_object_set_new(chat, "tools", out);
	json_array_foreach(tools, i, t) {
		char pp[48];
		snprintf(pp, sizeof pp, "tools[%zu]", i);
		const char *ty = type_of(t);
		if (!ty)
			return bad(e, pp, "%s: want {\"type\": \"function\", \"name\", ...}%s", NULL);
		if (strcmp(ty, "function"))
			return oai_errorf(e, 400, INVALID, "unsupported_parameter", pp, "%s: tools of type '%.40s' are not "
			    "supported by this engine (function tools only)", pp, ty);
		json_t *fn = json_object(), *v;
		static const char *const keep[] = { "name", "description", "parameters", "strict", NULL };
		for (size_t k = 0; keep[k]; k++)
			if ((v = json_object_get(t, keep[k])))
				json_object_set(fn, keep[k], v);
		if (!json_is_string(json_object_get(fn, "name"))) {
			json_decref(fn);
			return bad(e, pp, "%s.name: required%s", NULL);
		}
		json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
	}
	return 0;
}

static int tool_choice_of(json_t *tc, json_t *chat, struct oai_error *e)
{
	if (json_is_string(tc)) {
		json_object_set(chat, "tool_choice", tc);
		return 0;
	}
	const char *ty = type_of(tc);
	if (ty && strcmp(ty, "function") == 0 && json_is_string(json_object_get(tc, "name"))) {
		json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function",
		    "name", json_object_get(tc, "name")));
		return 0;
	}
	return oai_errorf(e, 400, INVALID, NULL, "tool_choice", "tool_choice: want \"auto\", \"none\", \"required\" or "
	    "{\"type\": \"function\", \"name\"}%s", ty && strcmp(ty, "function") ? " (hosted tools are not supported)" :
	    "");
}

/* text: {"format": {"type": "text" | "json_object" | "json_schema", ...}, "verbosity"} */
static int text_of(json_t *text, json_t *chat, struct oai_error *e)
{
	if (!json_is_object(text))
		return bad(e, "text", "%s: want an object {\"format\": ...}%s", NULL);
	json_t *vb = given(text, "verbosity");
	if (vb && !(json_is_string(vb) && strcmp(json_string_value(vb), "medium") == 0))
		return oai_errorf(e, 400, INVALID, "unsupported_parameter", "text.verbosity", "text.verbosity: only "
		    "\"medium\" is supported");
	json_t *f = given(text, "format");
	if (!f)
		return 0;
	const char *ty = type_of(f);
	if (!ty)
		return bad(e, "text.format", "%s: want {\"type\": \"text\", \"json_object\" or \"json_schema\"}%s", NULL);
	if (strcmp(ty, "text") == 0)
		return 0;
	if (strcmp(ty, "json_object") == 0) {
		json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
		return 0;
	}
	if (strcmp(ty, "json_schema") == 0) {
		json_t *js = json_object(), *v;
		static const char *const keep[] = { "name", "description", "schema", "strict", NULL };
		for (size_t k = 0; keep[k]; k++)
			if ((v = json_object_get(f, keep[k])))
				json_object_set(js, keep[k], v);
		json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
		return 0;
	}
	return oai_errorf(e, 400, INVALID, "unsupported_parameter", "text.format", "text.format: type '%.40s' is not "
	    "supported (text, json_object, json_schema)", ty);
}

/* The chat parser's words name chat's fields: the Responses' names, in
 * param and where the message starts with it. */
static void rename_prefix(char *s, size_t cap, const char *from, const char *to)
{
	size_t n = strlen(from);
	if (strncmp(s, from, n) != 0)
		return;
	char t[512];
	snprintf(t, sizeof t, "%s%s", to, s + n);
	snprintf(s, cap, "%s", t);
}

void oai_resp_param(struct oai_error *e)
{
	static const char *const map[][2] = {
		{ "response_format.json_schema", "text.format" }, { "response_format", "text.format" },
		{ "max_tokens", "max_output_tokens" }, { "messages", "input" }, { "reasoning_effort", "reasoning.effort" },
		{ "tools[", "tools[" },
	};
	for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
		if (strncmp(e->param, map[i][0], strlen(map[i][0])) == 0) {
			rename_prefix(e->message, sizeof e->message, map[i][0], map[i][1]);
			rename_prefix(e->param, sizeof e->param, map[i][0], map[i][1]);
			return;
		}
}

int oai_resp_parse(const char *body, size_t len, const char *served, uint64_t seed, char **chat_body,
    struct oai_resp **out, struct oai_error *e)
{
	*out = NULL;
	*chat_body = NULL;
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je), *v;
	if (!root || !json_is_object(root)) {
		json_decref(root);
		return root ? oai_errorf(e, 400, INVALID, NULL, NULL, "the body must be a JSON object") :
		    oai_errorf(e, 400, INVALID, NULL, NULL, "the body is not JSON: %s", je.text);
	}
	struct oai_resp *r = calloc(1, sizeof *r);
	json_t *chat = json_object(), *msgs = json_array(), *conv = NULL;
	if (!r || !chat || !msgs) {
		oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
		goto fail;
	}
	r->rng = seed | 1;
	if (check_keys(root, e))
		goto fail;
	json_t *st = given(root, "stream"), *sto = given(root, "store");
	if (st && !json_is_boolean(st)) {
		bad(e, "stream", "%s: want true or false%s", NULL);
		goto fail;
	}
	if (sto && !json_is_boolean(sto)) {
		bad(e, "store", "%s: want true or false%s", NULL);
		goto fail;
	}
	r->stream = json_is_true(st);
	r->store = !sto || json_is_true(sto);
	json_t *inc = given(root, "include");
	if (inc) {
		size_t i;
		json_t *x;
		if (!json_is_array(inc)) {
			bad(e, "include", "%s: want an array of strings%s", NULL);
			goto fail;
		}
		json_array_foreach(inc, i, x) {
			/* no encrypted reasoning is made here: asking for it gets none */
			if (json_is_string(x) && strcmp(json_string_value(x), "message.output_text.logprobs") == 0) {
				json_object_set_new(chat, "logprobs", json_true());
				continue;
			}
			if (!json_is_string(x) || strcmp(json_string_value(x), "reasoning.encrypted_content")) {
				oai_errorf(e, 400, INVALID, "unsupported_parameter", "include", "include[%zu]: '%.60s' is not "
				    "offered by this engine", i, json_is_string(x) ? json_string_value(x) : "?");
				goto fail;
			}
		}
	}
	/* the conversation: the previous response's, then this input */
	json_t *prev = given(root, "previous_response_id");
	if (prev) {
		if (!json_is_string(prev)) {
			bad(e, "previous_response_id", "%s: want a response's id%s", NULL);
			goto fail;
		}
		if (!(conv = store_conversation(json_string_value(prev)))) {
			oai_errorf(e, 404, INVALID, "not_found", "previous_response_id", "previous_response_id: response "
			    "'%.60s' is not kept by this engine (it keeps its last %u responses stored with store: true, in "
			    "memory, while it runs): send the whole conversation in input", json_string_value(prev),
			    RESP_STORE_MAX);
			goto fail;
		}
	} else {
		conv = json_array();
	}
	json_t *in = json_object_get(root, "input");
	if (json_is_string(in)) {
		json_array_append_new(conv, json_pack("{s:s, s:O}", "role", "user", "content", in));
	} else if (json_is_array(in)) {
		size_t i;
		json_t *it;
		json_array_foreach(in, i, it) {
			char pp[48];
			snprintf(pp, sizeof pp, "input[%zu]", i);
			if (add_item(conv, it, pp, e))
				goto fail;
		}
	} else {
		bad(e, "input", "%s: want a string or an array of input items%s", NULL);
		goto fail;
	}
	json_t *ins = given(root, "instructions");
	if (ins && !json_is_string(ins)) {
		bad(e, "instructions", "%s: want a string%s", NULL);
		goto fail;
	}
	if (ins)
		json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
	json_array_extend(msgs, conv);
	json_object_set(chat, "messages", msgs);
	if ((v = json_object_get(root, "model")))
		json_object_set(chat, "model", v);
	if ((v = given(root, "max_output_tokens")))
		json_object_set(chat, "max_tokens", v);
	static const char *const same[] = { "temperature", "top_p", "parallel_tool_calls", NULL };
	for (size_t i = 0; same[i]; i++)
		if ((v = json_object_get(root, same[i])))
			json_object_set(chat, same[i], v);
	for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
		if (rules[i].how == EXT && (v = json_object_get(root, rules[i].name)))
			json_object_set(chat, rules[i].name, v);
	/* top_logprobs: the alternatives of each token (the chat parser checks
	 * the range); more than 0 asks for the logprobs too */
	if ((v = given(root, "top_logprobs"))) {
		json_object_set(chat, "top_logprobs", v);
		if (!json_is_integer(v) || json_integer_value(v) > 0)
			json_object_set_new(chat, "logprobs", json_true());
	}
	if (r->stream)
		json_object_set_new(chat, "stream", json_true());
	if ((v = given(root, "tools")) && tools_of(v, chat, e))
		goto fail;
	if ((v = given(root, "tool_choice")) && tool_choice_of(v, chat, e))
		goto fail;
	if ((v = given(root, "text")) && text_of(v, chat, e))
		goto fail;
	if ((v = given(root, "reasoning"))) {
		json_t *ef = given(v, "effort");
		if (!json_is_object(v)) {
			bad(e, "reasoning", "%s: want an object {\"effort\", \"summary\"}%s", NULL);
			goto fail;
		}
		if (ef)
			json_object_set(chat, "reasoning_effort", ef);
	}
	(void)served;
	if (!(*chat_body = json_dumps(chat, JSON_COMPACT))) {
		oai_errorf(e, 500, "server_error", NULL, NULL, "out of memory");
		goto fail;
	}
	r->req = root;
	r->conv = conv;
	r->output = json_array();
	rand_id(r, "resp_", r->id, sizeof r->id);
	json_decref(chat);
	json_decref(msgs);
	*out = r;
	return 0;
fail:
	json_decref(root);
	json_decref(chat);
	json_decref(msgs);
	json_decref(conv);
	free(r);
	return e->status;
}

void oai_resp_free(struct oai_resp *r)
{
	if (!r)
		return;
	json_decref(r->req);
	json_decref(r->conv);
	json_decref(r->output);
	json_decref(r->cur);
	json_decref(r->calls);
	json_decref(r->lp_next);
	json_decref(r->lp_item);
	free(r->text.p);
	free(r->content.p);
	free(r->reasoning.p);
	free(r->model);
	free(r);
}

/* ---- the answer: output items and events ---- */

static void emit(struct oai_resp *r, const char *type, json_t *ev)
{
	if (!r->stream || !r->w || r->failed || !ev) {
		json_decref(ev);
		return;
	}
	json_object_set_new(ev, "type", json_string(type));
	json_object_set_new(ev, "sequence_number", json_integer((json_int_t)r->seq++));
	char *s = json_dumps(ev, JSON_COMPACT);
	json_decref(ev);
	size_t tl = strlen(type), n = s ? strlen(s) : 0;
	char *buf = s ? malloc(tl + n + 20) : NULL;
	if (!buf) {
		free(s);
		r->failed = 1;
		return;
	}
	int k = sprintf(buf, "event: %s\ndata: %s\n\n", type, s);
	free(s);
	if (r->w(r->warg, buf, (size_t)k))
		r->failed = 1;
	free(buf);
}

/* The response object: status "in_progress", "completed", "incomplete", "failed". */
static json_t *response_obj(struct oai_resp *r, const char *status, json_t *output, json_t *usage, json_t *error,
    const char *incomplete)
{
	json_t *q = r->req, *v;
	json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:n, s:s, s:o, s:b, s:o}", "id", r->id, "object", "response",
	    "created_at", (json_int_t)r->created, "status", status, "error", error ? error : json_null(),
	    "incomplete_details", "model", r->model ? r->model : "", "output", output,
	    "parallel_tool_calls", !json_is_false(json_object_get(q, "parallel_tool_calls")),
	    "usage", usage ? usage : json_null());
	if (incomplete)
		json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", incomplete));
	json_object_set_new(o, "instructions", dflt(given(q, "instructions"), json_null()));
	json_object_set_new(o, "max_output_tokens", dflt(given(q, "max_output_tokens"), json_null()));
	json_object_set_new(o, "previous_response_id", dflt(given(q, "previous_response_id"), json_null()));
	json_object_set_new(o, "temperature", dflt(given(q, "temperature"), json_real(1.0)));
	json_object_set_new(o, "top_p", dflt(given(q, "top_p"), json_real(1.0)));
	json_object_set_new(o, "tool_choice", dflt(given(q, "tool_choice"), json_string("auto")));
	json_object_set_new(o, "tools", dflt(given(q, "tools"), json_array()));
	json_object_set_new(o, "metadata", dflt(given(q, "metadata"), json_object()));
	json_object_set_new(o, "store", json_boolean(r->store));
	json_object_set_new(o, "truncation", json_string("disabled"));
	json_object_set_new(o, "background", json_false());
	json_object_set_new(o, "user", dflt(given(q, "user"), json_null()));
	v = given(q, "text");
	json_object_set_new(o, "text", v ? json_deep_copy(v) : json_pack("{s:{s:s}}", "format", "type", "text"));
	if (!json_object_get(json_object_get(o, "text"), "format"))
		json_object_set_new(json_object_get(o, "text"), "format", json_pack("{s:s}", "type", "text"));
	v = given(q, "reasoning");
	json_object_set_new(o, "reasoning", json_pack("{s:o, s:o}", "effort", dflt(given(v, "effort"), json_null()),
	    "summary", dflt(given(v, "summary"), json_null())));
	return o;
}

void oai_resp_begin(struct oai_resp *r, const char *model, long long created, oai_resp_write_fn w, void *arg)
{
	r->created = created;
	free(r->model);
	r->model = strdup(model);
	r->w = w;
	r->warg = arg;
	emit(r, "response.created", json_pack("{s:o}", "response", response_obj(r, "in_progress", json_array(), NULL,
	    NULL, NULL)));
	emit(r, "response.in_progress", json_pack("{s:o}", "response", response_obj(r, "in_progress", json_array(),
	    NULL, NULL, NULL)));
}

static int out_index(struct oai_resp *r)
{
	return (int)json_array_size(r->output);
}

/* The open item ends: its done events; it joins the output. */
static void close_item(struct oai_resp *r)
{
	if (!r->cur)
		return;
	json_t *it = r->cur;
	const char *id = json_string_value(json_object_get(it, "id"));
	int oi = out_index(r);
	const char *tx = r->text.p ? r->text.p : "";
	size_t tn = r->text.n;
	if (r->cur_kind == OAI_P_CONTENT || r->cur_kind == OAI_P_REASONING) {
		int msg = r->cur_kind == OAI_P_CONTENT;
		json_t *part = msg ? json_pack("{s:s, s:s%, s:[], s:o}", "type", "output_text", "text", tx, tn,
		    "annotations", "logprobs", r->lp_item ? r->lp_item : json_array()) : json_pack("{s:s, s:s%}", "type",
		    "reasoning_text", "text", tx, tn);
		if (msg)
			r->lp_item = NULL;
		emit(r, msg ? "response.output_text.done" : "response.reasoning_text.done", json_pack("{s:s, s:i, s:i, "
		    "s:s%}", "item_id", id, "output_index", oi, "content_index", 0, "text", tx, tn));
		emit(r, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi,
		    "content_index", 0, "part", part));
		json_array_append_new(json_object_get(it, "content"), part);
		if (msg)
			json_object_set_new(it, "status", json_string(r->cut ? "incomplete" : "completed"));
	} else {
		emit(r, "response.function_call_arguments.done", json_pack("{s:s, s:i, s:s%, s:O}", "item_id", id,
		    "output_index", oi, "arguments", tx, tn, "name", json_object_get(it, "name")));
		json_object_set_new(it, "arguments", json_stringn(tx, tn));
		json_object_set_new(it, "status", json_string(r->cut ? "incomplete" : "completed"));
		if (!r->calls)
			r->calls = json_array();
		json_array_append_new(r->calls, json_pack("{s:O, s:s, s:{s:O, s:s%}}", "id", json_object_get(it, "call_id"),
		    "type", "function", "function", "name", json_object_get(it, "name"), "arguments", tx, tn));
	}
	emit(r, "response.output_item.done", json_pack("{s:i, s:O}", "output_index", oi, "item", it));
	json_array_append_new(r->output, it);
	r->cur = NULL;
	r->text.n = 0;
	if (r->text.p)
		r->text.p[0] = 0;
}

static void open_item(struct oai_resp *r, int kind, const struct oai_tool_call *c)
{
	char id[48];
	close_item(r);
	int oi = out_index(r);
	if (kind == OAI_P_CONTENT) {
		r->cur = json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", rand_id(r, "msg_", id, sizeof id), "type", "message",
		    "status", "in_progress", "role", "assistant", "content");
	} else if (kind == OAI_P_REASONING) {
		r->cur = json_pack("{s:s, s:s, s:[], s:[]}", "id", rand_id(r, "rs_", id, sizeof id), "type", "reasoning",
		    "summary", "content");
	} else {
		r->cur = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", rand_id(r, "fc_", id, sizeof id), "type",
		    "function_call", "status", "in_progress", "call_id", c->id, "name", c->name, "arguments", "");
	}
	r->cur_kind = kind;
	json_t *shown = json_deep_copy(r->cur);
	if (kind == OAI_P_REASONING)
		json_object_del(shown, "content"); /* its part comes next */
	emit(r, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", oi, "item", shown));
	if (kind != OAI_P_TOOL_START) {
		json_t *part = kind == OAI_P_CONTENT ? json_pack("{s:s, s:s, s:[], s:[]}", "type", "output_text", "text", "",
		    "annotations", "logprobs") : json_pack("{s:s, s:s}", "type", "reasoning_text", "text", "");
		emit(r, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index",
		    oi, "content_index", 0, "part", part));
	}
}

/* The entries (taken from lp_next) of the tokens that spell t: those
 * before them (a <think> block's, a marker's) are dropped, those after
 * stay for the next delta. When no run of them spells it (a token across
 * two pieces), all of them. */
static json_t *take_lp(struct oai_resp *r, const char *t, size_t n)
{
	json_t *all = r->lp_next;
	r->lp_next = NULL;
	if (!all)
		return json_array();
	size_t k = json_array_size(all);
	for (size_t i = 0; i < k; i++) {
		size_t got = 0, j = i;
		while (j < k && got < n) {
			json_t *tk = json_object_get(json_array_get(all, j), "token");
			size_t l = json_string_length(tk);
			if (!json_is_string(tk) || got + l > n || memcmp(json_string_value(tk), t + got, l))
				break;
			got += l;
			j++;
		}
		if (got == n && j > i) {
			json_t *out = json_array(), *rest = json_array();
			for (size_t x = i; x < k; x++)
				json_array_append(x < j ? out : rest, json_array_get(all, x));
			if (json_array_size(rest))
				r->lp_next = rest;
			else
				json_decref(rest);
			json_decref(all);
			return out;
		}
	}
	return all;
}

static void delta(struct oai_resp *r, const char *t, size_t n)
{
	if (oai_buf_put(&r->text, t, n))
		r->failed = 1;
	const char *id = json_string_value(json_object_get(r->cur, "id"));
	int oi = out_index(r);
	if (r->cur_kind == OAI_P_TOOL_START) {
		emit(r, "response.function_call_arguments.delta", json_pack("{s:s, s:i, s:s%}", "item_id", id,
		    "output_index", oi, "delta", t, n));
	} else if (r->cur_kind != OAI_P_CONTENT) {
		emit(r, "response.reasoning_text.delta", json_pack("{s:s, s:i, s:i, s:s%}", "item_id", id, "output_index",
		    oi, "content_index", 0, "delta", t, n));
	} else {
		/* the entries of this text's tokens go with this delta, and with the text's part */
		json_t *lp = take_lp(r, t, n);
		if (!r->lp_item)
			r->lp_item = json_array();
		json_array_extend(r->lp_item, lp);
		emit(r, "response.output_text.delta", json_pack("{s:s, s:i, s:i, s:s%, s:o}", "item_id", id,
		    "output_index", oi, "content_index", 0, "delta", t, n, "logprobs", lp));
	}
}

void oai_resp_logprobs(struct oai_resp *r, json_t *entries)
{
	if (!entries)
		return;
	if (!r->lp_next)
		r->lp_next = json_array();
	json_array_extend(r->lp_next, entries);
	json_decref(entries);
}

int oai_resp_piece(struct oai_resp *r, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c)
{
	switch (k) {
	case OAI_P_CONTENT:
	case OAI_P_REASONING:
		if (n == 0)
			break;
		if (k == OAI_P_CONTENT ? oai_buf_put(&r->content, t, n) : oai_buf_put(&r->reasoning, t, n))
			r->failed = 1;
		/* blank text between items opens none */
		if (!r->cur || r->cur_kind != (int)k) {
			size_t i = 0;
			while (i < n && (t[i] == ' ' || t[i] == '\n' || t[i] == '\t' || t[i] == '\r'))
				i++;
			if (i == n && k == OAI_P_CONTENT)
				break;
			open_item(r, (int)k, NULL);
		}
		if (k == OAI_P_REASONING) { /* its tokens' entries: not the text's */
			json_decref(r->lp_next);
			r->lp_next = NULL;
		}
		delta(r, t, n);
		break;
	case OAI_P_TOOL:
	case OAI_P_TOOL_START:
		json_decref(r->lp_next);
		r->lp_next = NULL;
		open_item(r, OAI_P_TOOL_START, c);
		if (k == OAI_P_TOOL && c->args)
			delta(r, c->args, strlen(c->args));
		break;
	case OAI_P_TOOL_ARGS:
		if (r->cur && r->cur_kind == OAI_P_TOOL_START)
			delta(r, t, n);
		break;
	}
	return r->failed ? -1 : 0; /* a stream's client gone, or no memory: the request stops */
}

static json_t *usage_obj(uint32_t in, uint32_t out)
{
	return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", (json_int_t)in, "input_tokens_details",
	    "cached_tokens", 0, "output_tokens", (json_int_t)out, "output_tokens_details", "reasoning_tokens", 0,
	    "total_tokens", (json_int_t)(in + out));
}

json_t *oai_resp_finish(struct oai_resp *r, const struct baton_gen_result *res)
{
	const char *f = oai_finish_reason(res->finish);
	int cut = strcmp(f, "length") == 0;
	r->cut = cut; /* the item open now ends incomplete */
	close_item(r);
	json_t *o = response_obj(r, cut ? "incomplete" : "completed", json_incref(r->output),
	    usage_obj(res->n_prompt, res->n_tokens), NULL, cut ? "max_output_tokens" : NULL);
	if (r->store) {
		/* the conversation goes on from here: its input, then the answer */
		json_t *a = json_pack("{s:s, s:o}", "role", "assistant", "content", r->content.p ? json_stringn(r->content.p,
		    r->content.n) : json_null());
		if (r->calls)
			json_object_set(a, "tool_calls", r->calls);
		json_array_append_new(r->conv, a);
		store_put(r->id, o, r->conv);
	}
	emit(r, cut ? "response.incomplete" : "response.completed", json_pack("{s:O}", "response", o));
	return o;
}

void oai_resp_fail(struct oai_resp *r, const struct oai_error *e)
{
	close_item(r);
	emit(r, "error", json_pack("{s:s, s:s, s:s?}", "code", e->code ? e->code : e->type ? e->type : "server_error",
	    "message", e->message, "param", e->param[0] ? e->param : NULL));
	emit(r, "response.failed", json_pack("{s:o}", "response", response_obj(r, "failed", json_incref(r->output), NULL,
	    json_pack("{s:s, s:s}", "code", "server_error", "message", e->message), NULL)));
}

int oai_resp_streaming(const struct oai_resp *r)
{
	return r->stream;
}

/* A /v1/responses request ended: its response, whole or as its last events. */
void oreq_resp_done(struct oreq *q, int rc, const char *err, struct baton_gen_result *res)
{
	const char *type;
	struct oai_error e;
	if (rc) {
		int status = oreq_status_of(rc, &type);
		oai_errorf(&e, status, type, NULL, NULL, "%s", err && err[0] ? err : baton_strerror(rc));
	}
	if (q->streaming) {
		if (q->h.st) {
			if (rc == 0 && strcmp(res->finish, "cancelled") != 0) {
				if (!q->h.split_started++ && q->h.think_open)
					oai_split_thinking(&q->h.sp);
				oai_split_finish(&q->h.sp);
				json_decref(oai_resp_finish(q->resp, res));
				oreq_usage_comment(q, res);
			} else if (rc) {
				oai_resp_fail(q->resp, &e);
			}
			http_stream_close(q->h.st);
		}
	} else if (rc == 0) {
		if (!q->h.split_started++ && q->h.think_open)
			oai_split_thinking(&q->h.sp);
		if ((!q->split_live && oai_split_push(&q->h.sp, res->text, res->text_len)) || oai_split_finish(&q->h.sp) ||
		    q->h.write_failed)
			http_reply_error(q->h.r, 500, BATON_ENOMEM, "out of memory");
		else
			oreq_reply_whole(q, res, oai_resp_finish(q->resp, res));
	} else {
		static const char *const retry[] = { "Retry-After: 1", NULL };
		oreq_reply_error(q->h.r, &e, http_retry_after(oreq_status_of(rc, &type)) ? retry : NULL);
	}
	generator_result_free(res);
	oreq_free(q);
}
