/*
 * anthropic.c: Anthropic's Messages API on the engine's --http address
 * (face.h; docs/reference/ollama-anthropic.md): POST /v1/messages, whole
 * or streamed as its events (message_start, content_block_start / delta
 * / stop, message_delta, message_stop), with system, text, tool_use,
 * tool_result and thinking blocks, tools and tool_choice; and POST
 * /v1/messages/count_tokens. The request becomes an OpenAI chat body
 * (face.c runs it); errors are Anthropic's {"type": "error", "error":
 * {"type", "message"}}.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/face.h"
#include "proto/base/base.h"

struct astate {
	char id[40];
	int block;               /* the open block's index, -1: none */
	enum oai_piece_kind open; /* its kind (CONTENT, REASONING, TOOL_START) */
	int n_blocks, called;
	int opened;              /* message_start sent */
};

static const char *err_type(int status)
{
	switch (status) {
	case 400: return "invalid_request_error";
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 413: return "request_too_large";
	case 429: return "rate_limit_error";
	case 503: case 529: return "overloaded_error";
	default: return status < 500 ? "invalid_request_error" : "api_error";
	}
}

static json_t *err_json(int status, const char *msg)
{
	return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", err_type(status), "message", msg);
}

static void reply_err(struct baton_http_req *r, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reply_err(struct baton_http_req *r, int status, const char *fmt, ...)
{
	char m[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	static const char *const retry[] = { "Retry-After: 1", NULL };
	json_t *j = err_json(status, m);
	char *body = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (body)
		http_reply(r, status, "application/json", body, strlen(body), http_retry_after(status) ? retry : NULL);
	else
		http_reply(r, 500, "text/plain", "out of memory\n", 14, NULL);
	free(body);
}

/* A content that is a string or a list of text blocks, as one text;
 * NULL (having answered 400) when it is not. */
static int text_of(struct baton_http_req *r, json_t *c, const char *where, struct oai_buf *out)
{
	if (json_is_string(c))
		return oai_buf_put(out, json_string_value(c), json_string_length(c));
	size_t i;
	json_t *b;
	if (!json_is_array(c)) {
		reply_err(r, 400, "%s: want a string or a list of text blocks", where);
		return -1;
	}
	json_array_foreach(c, i, b) {
		const char *t = json_string_value(json_object_get(b, "type"));
		json_t *tx = json_object_get(b, "text");
		if (!t || strcmp(t, "text") != 0 || !json_is_string(tx)) {
			reply_err(r, 400, "%s[%zu]: want {\"type\": \"text\", \"text\": ...}%s", where, i,
			    t && (strcmp(t, "image") == 0 || strcmp(t, "document") == 0) ? " (this model takes no images "
			    "or documents)" : "");
			return -1;
		}
		if (oai_buf_put(out, json_string_value(tx), json_string_length(tx)))
			return -1;
	}
	if (!out->p)
		oai_buf_put(out, "", 0);
	return 0;
}

/* Anthropic's messages (and system) into OpenAI's. NULL having answered. */
static json_t *messages_of(struct baton_http_req *r, json_t *root)
{
	json_t *out = json_array(), *sys = json_object_get(root, "system"), *msgs = json_object_get(root, "messages");
	json_t *m;
	size_t i;
	char where[96];
	if (sys && !json_is_null(sys)) {
		struct oai_buf t = { 0 };
		if (text_of(r, sys, "system", &t)) {
			free(t.p);
			goto fail;
		}
		json_array_append_new(out, json_pack("{s:s, s:s%}", "role", "system", "content", t.p ? t.p : "", t.n));
		free(t.p);
	}
	if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
		reply_err(r, 400, "messages: Field required (a non-empty list)");
		goto fail;
	}
	json_array_foreach(msgs, i, m) {
		const char *ro = json_string_value(json_object_get(m, "role"));
		json_t *c = json_object_get(m, "content");
		if (!json_is_object(m) || !ro || (strcmp(ro, "user") && strcmp(ro, "assistant"))) {
			reply_err(r, 400, "messages.%zu.role: want \"user\" or \"assistant\"", i);
			goto fail;
		}
		if (json_is_string(c)) {
			json_array_append_new(out, json_pack("{s:s, s:O}", "role", ro, "content", c));
			continue;
		}
		if (!json_is_array(c)) {
			reply_err(r, 400, "messages.%zu.content: want a string or a list of content blocks", i);
			goto fail;
		}
		struct oai_buf text = { 0 }, think = { 0 };
		json_t *calls = json_array(), *b;
		size_t k;
		int bad = 0;
		json_array_foreach(c, k, b) {
			const char *t = json_string_value(json_object_get(b, "type"));
			snprintf(where, sizeof where, "messages.%zu.content.%zu", i, k);
			if (!t) {
				reply_err(r, 400, "%s.type: Field required", where);
				bad = 1;
			} else if (strcmp(t, "text") == 0) {
				json_t *tx = json_object_get(b, "text");
				if (!json_is_string(tx)) {
					reply_err(r, 400, "%s.text: want a string", where);
					bad = 1;
				} else {
					oai_buf_put(&text, json_string_value(tx), json_string_length(tx));
				}
			} else if (strcmp(t, "tool_use") == 0 && strcmp(ro, "assistant") == 0) {
				json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
				json_t *input = json_object_get(b, "input");
				char *a = json_is_object(input) ? json_dumps(input, JSON_COMPACT) : NULL;
				if (!json_is_string(id) || !json_is_string(name) || !a) {
					reply_err(r, 400, "%s: a tool_use block wants id, name and input (an object)", where);
					bad = 1;
				} else {
					json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type",
					    "function", "function", "name", name, "arguments", a));
				}
				free(a);
			} else if (strcmp(t, "tool_result") == 0 && strcmp(ro, "user") == 0) {
				json_t *id = json_object_get(b, "tool_use_id"), *rc = json_object_get(b, "content");
				struct oai_buf res = { 0 };
				if (!json_is_string(id)) {
					reply_err(r, 400, "%s.tool_use_id: Field required", where);
					bad = 1;
				} else if (rc && !json_is_null(rc) && text_of(r, rc, where, &res)) {
					bad = 1;
				} else {
					/* is_error: the template has no such field; the text says it */
					int ie = json_is_true(json_object_get(b, "is_error"));
					json_t *x = json_pack("{s:s, s:O, s:s%}", "role", "tool", "tool_call_id", id, "content",
					    res.p ? res.p : "", res.n);
					if (ie) {
						struct oai_buf eb = { 0 };
						oai_buf_put(&eb, "Error: ", 7);
						oai_buf_put(&eb, res.p ? res.p : "", res.n);
						json_object_set_new(x, "content", json_stringn(eb.p ? eb.p : "", eb.n));
						free(eb.p);
					}
					json_array_append_new(out, x);
				}
				free(res.p);
			} else if (strcmp(t, "thinking") == 0 && strcmp(ro, "assistant") == 0) {
				json_t *th = json_object_get(b, "thinking");
				if (json_is_string(th))
					oai_buf_put(&think, json_string_value(th), json_string_length(th));
			} else if (strcmp(t, "redacted_thinking") == 0 && strcmp(ro, "assistant") == 0) {
				/* nothing this model can read */
			} else {
				reply_err(r, 400, "%s: a %.40s block is not supported in a%s %s message%s", where, t,
				    ro[0] == 'a' ? "n" : "", ro, strcmp(t, "image") == 0 || strcmp(t, "document") == 0 ?
				    " (this model takes no images or documents)" : "");
				bad = 1;
			}
			if (bad)
				break;
		}
		if (!bad && (text.n || json_array_size(calls) || think.n || (strcmp(ro, "assistant") == 0) ||
		    !json_array_size(c))) {
			json_t *x = json_pack("{s:s, s:s%}", "role", ro, "content", text.p ? text.p : "", text.n);
			if (json_array_size(calls))
				json_object_set(x, "tool_calls", calls);
			if (think.n)
				json_object_set_new(x, "reasoning_content", json_stringn(think.p, think.n));
			json_array_append_new(out, x);
		}
		free(text.p);
		free(think.p);
		json_decref(calls);
		if (bad)
			goto fail;
	}
	return out;
fail:
	json_decref(out);
	return NULL;
}

/* tools, tool_choice, thinking into the OpenAI body. */
static int tools_of(struct baton_http_req *r, json_t *root, json_t *b)
{
	json_t *tools = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice"), *t;
	json_t *th = json_object_get(root, "thinking");
	size_t i;
	if (tools && !json_is_null(tools)) {
		if (!json_is_array(tools)) {
			reply_err(r, 400, "tools: want a list");
			return -1;
		}
		json_t *list = json_array();
		json_array_foreach(tools, i, t) {
			json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
			json_t *desc = json_object_get(t, "description");
			const char *type = json_string_value(json_object_get(t, "type"));
			if (type && strcmp(type, "custom") != 0) {
				json_decref(list);
				reply_err(r, 400, "tools.%zu: the server tool %.60s is not supported (only your own tools, "
				    "with input_schema)", i, type);
				return -1;
			}
			if (!json_is_string(name) || !json_is_object(schema) || (desc && !json_is_string(desc))) {
				json_decref(list);
				reply_err(r, 400, "tools.%zu: want {\"name\", \"description\", \"input_schema\": an object}", i);
				return -1;
			}
			json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
			if (desc)
				json_object_set(fn, "description", desc);
			json_array_append_new(list, json_pack("{s:s, s:o}", "type", "function", "function", fn));
		}
		json_object_set_new(b, "tools", list);
	}
	if (tc && !json_is_null(tc)) {
		const char *type = json_string_value(json_object_get(tc, "type"));
		json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
		if (!json_is_object(tc) || !type) {
			reply_err(r, 400, "tool_choice: want {\"type\": \"auto\", \"any\", \"tool\" or \"none\"}");
			return -1;
		}
		if (strcmp(type, "auto") == 0)
			json_object_set_new(b, "tool_choice", json_string("auto"));
		else if (strcmp(type, "any") == 0)
			json_object_set_new(b, "tool_choice", json_string("required"));
		else if (strcmp(type, "none") == 0)
			json_object_set_new(b, "tool_choice", json_string("none"));
		else if (strcmp(type, "tool") == 0 && json_is_string(json_object_get(tc, "name")))
			json_object_set_new(b, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function",
			    "name", json_object_get(tc, "name")));
		else {
			reply_err(r, 400, "tool_choice.type: want auto, any, tool (with name) or none");
			return -1;
		}
		if (json_is_true(dp))
			json_object_set_new(b, "parallel_tool_calls", json_false());
	}
	if (th && !json_is_null(th)) {
		const char *type = json_string_value(json_object_get(th, "type"));
		if (!json_is_object(th) || !type || (strcmp(type, "enabled") && strcmp(type, "disabled"))) {
			reply_err(r, 400, "thinking: want {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": "
			    "\"disabled\"}");
			return -1;
		}
		json_object_set_new(b, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", type[0] == 'e'));
	}
	return 0;
}

/* The OpenAI body of a messages request; NULL having answered. count: a
 * count_tokens body (max_tokens not required). */
static json_t *body_of(struct oai_server *s, struct baton_http_req *r, json_t *root, int count)
{
	json_t *model = json_object_get(root, "model"), *mt = json_object_get(root, "max_tokens"), *v;
	if (!json_is_string(model)) {
		reply_err(r, 400, "model: Field required");
		return NULL;
	}
	if (strcmp(json_string_value(model), oai_server_model(s)) != 0) {
		reply_err(r, 404, "model: %.200s (this engine serves '%s')", json_string_value(model), oai_server_model(s));
		return NULL;
	}
	if (!count && (!json_is_integer(mt) || json_integer_value(mt) < 1)) {
		reply_err(r, 400, "max_tokens: %s", mt ? "want an integer >= 1" : "Field required");
		return NULL;
	}
	json_t *msgs = messages_of(r, root);
	if (!msgs)
		return NULL;
	json_t *b = json_pack("{s:O, s:o}", "model", model, "messages", msgs);
	if (!count)
		json_object_set(b, "max_tokens", mt);
	static const char *const num[] = { "temperature", "top_p", "top_k", NULL };
	for (size_t i = 0; !count && num[i]; i++) {
		if (!(v = json_object_get(root, num[i])) || json_is_null(v))
			continue;
		if (!json_is_number(v) || (num[i][4] == 'k' && !json_is_integer(v))) {
			reply_err(r, 400, "%s: want a number", num[i]);
			json_decref(b);
			return NULL;
		}
		json_object_set(b, num[i], v);
	}
	if (!count && (v = json_object_get(root, "stop_sequences")) && !json_is_null(v)) {
		size_t i;
		json_t *x;
		int ok = json_is_array(v);
		json_array_foreach(v, i, x) ok &= json_is_string(x) && json_string_length(x) > 0;
		if (!ok) {
			reply_err(r, 400, "stop_sequences: want a list of non-empty strings");
			json_decref(b);
			return NULL;
		}
		if (json_array_size(v))
			json_object_set(b, "stop", v);
	}
	if (tools_of(r, root, b)) {
		json_decref(b);
		return NULL;
	}
	return b;
}

/* ---- the answer ---- */

static int write_event(struct face_req *f, const char *name, json_t *j)
{
	char *d = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	int rc = BATON_ENOMEM;
	if (d) {
		size_t n = strlen(name) + strlen(d) + 20;
		char *ev = malloc(n);
		if (ev) {
			int k = snprintf(ev, n, "event: %s\ndata: %s\n\n", name, d);
			rc = http_stream_write(f->h.st, ev, (size_t)k);
		}
		free(ev);
	}
	free(d);
	if (rc)
		f->h.write_failed = 1;
	return rc;
}

static void tool_id(const char *call_id, char *out, size_t n)
{
	snprintf(out, n, "toolu_%s", strncmp(call_id, "call_", 5) == 0 ? call_id + 5 : call_id);
}

static json_t *usage(uint32_t in, uint32_t out)
{
	return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", (json_int_t)in, "output_tokens", (json_int_t)out,
	    "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0);
}

static void a_admit(struct face_req *f)
{
	struct astate *a = f->arg;
	if (!f->stream || a->opened)
		return;
	a->opened = 1;
	static const char *const hdr[] = { "Cache-Control: no-cache", "X-Accel-Buffering: no", NULL };
	f->h.st = http_stream_open(f->h.r, 200, "text/event-stream", hdr);
	if (!f->h.st) {
		f->h.write_failed = 1;
		return;
	}
	write_event(f, "message_start", json_pack("{s:s, s:{s:s, s:s, s:s, s:s, s:[], s:n, s:n, s:o}}", "type",
	    "message_start", "message", "id", a->id, "type", "message", "role", "assistant", "model",
	    oai_server_model(f->h.srv), "content", "stop_reason", "stop_sequence", "usage", usage(0, 0)));
}

static void close_block(struct face_req *f)
{
	struct astate *a = f->arg;
	if (a->block < 0)
		return;
	if (a->open == OAI_P_REASONING)
		write_event(f, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
		    "index", a->block, "delta", "type", "signature_delta", "signature", ""));
	write_event(f, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", a->block));
	a->block = -1;
}

static void open_block(struct face_req *f, enum oai_piece_kind k, json_t *block)
{
	struct astate *a = f->arg;
	close_block(f);
	a->block = a->n_blocks++;
	a->open = k;
	write_event(f, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
	    a->block, "content_block", block));
}

static void a_piece(struct face_req *f, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c)
{
	struct astate *a = f->arg;
	if (!f->h.st)
		return;
	char tid[64];
	switch (k) {
	case OAI_P_CONTENT:
	case OAI_P_REASONING:
		if (!n)
			return;
		if (a->block < 0 || a->open != k)
			open_block(f, k, k == OAI_P_CONTENT ? json_pack("{s:s, s:s}", "type", "text", "text", "") :
			    json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", ""));
		write_event(f, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta",
		    "index", a->block, "delta", "type", k == OAI_P_CONTENT ? "text_delta" : "thinking_delta",
		    k == OAI_P_CONTENT ? "text" : "thinking", t, n));
		break;
	case OAI_P_TOOL:
	case OAI_P_TOOL_START:
		a->called = 1;
		tool_id(c->id, tid, sizeof tid);
		open_block(f, OAI_P_TOOL_START, json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id", tid, "name",
		    c->name, "input"));
		if (k == OAI_P_TOOL && c->args)
			write_event(f, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type",
			    "content_block_delta", "index", a->block, "delta", "type", "input_json_delta", "partial_json",
			    c->args));
		break;
	case OAI_P_TOOL_ARGS:
		if (a->block >= 0 && a->open == OAI_P_TOOL_START)
			write_event(f, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type",
			    "content_block_delta", "index", a->block, "delta", "type", "input_json_delta", "partial_json",
			    t, n));
		break;
	}
}

static const char *stop_reason(struct face_req *f, const struct baton_gen_result *res, int called, const char **seq)
{
	*seq = NULL;
	if (strcmp(res->finish, "length") == 0)
		return "max_tokens";
	if (called)
		return "tool_use";
	if ((*seq = face_stop_string(f, res)))
		return "stop_sequence";
	return "end_turn";
}

static void a_done(struct face_req *f, int rc, const char *err, const struct baton_gen_result *res)
{
	struct astate *a = f->arg;
	const char *seq;
	if (f->stream && a->opened) {
		if (!f->h.st)
			return;
		if (rc == 0 && strcmp(res->finish, "cancelled") != 0) {
			close_block(f);
			const char *why = stop_reason(f, res, a->called, &seq);
			json_t *d = json_pack("{s:s, s:{s:s, s:s?}, s:o}", "type", "message_delta", "delta", "stop_reason", why,
			    "stop_sequence", seq, "usage", usage(res->n_prompt, res->n_tokens));
			write_event(f, "message_delta", d);
			write_event(f, "message_stop", json_pack("{s:s}", "type", "message_stop"));
			face_usage_comment(f, res);
		} else if (rc) {
			write_event(f, "error", err_json(http_status_of(rc), err ? err : "failed"));
		}
		http_stream_close(f->h.st);
		return;
	}
	if (rc) {
		int status = http_status_of(rc);
		reply_err(f->h.r, status, "%s", err ? err : "failed");
		return;
	}
	json_t *content = json_array(), *c;
	size_t i;
	if (f->h.reasoning.n)
		json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", f->h.reasoning.p,
		    f->h.reasoning.n, "signature", ""));
	if (f->h.content.n || !json_array_size(f->h.calls))
		json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", f->h.content.p ?
		    f->h.content.p : "", f->h.content.n));
	json_array_foreach(f->h.calls, i, c) {
		char tid[64];
		tool_id(json_string_value(json_object_get(c, "id")), tid, sizeof tid);
		const char *args = json_string_value(json_object_get(c, "arguments"));
		json_t *in = json_loads(args && args[0] ? args : "{}", 0, NULL);
		if (!json_is_object(in)) {
			json_decref(in);
			in = json_pack("{s:s}", "_raw", args ? args : "");
		}
		json_array_append_new(content, json_pack("{s:s, s:s, s:O, s:o}", "type", "tool_use", "id", tid, "name",
		    json_object_get(c, "name"), "input", in));
	}
	const char *why = stop_reason(f, res, json_array_size(f->h.calls) > 0, &seq);
	face_reply_whole(f, res, json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:s?, s:o}", "id", a->id, "type", "message",
	    "role", "assistant", "model", oai_server_model(f->h.srv), "content", content, "stop_reason", why,
	    "stop_sequence", seq, "usage", usage(res->n_prompt, res->n_tokens)));
}

static const struct face_ops anthropic_ops = { .admit = a_admit, .piece = a_piece, .done = a_done };

static json_t *parse_body(struct baton_http_req *r)
{
	size_t len = 0;
	const char *body = http_req_body(r, &len);
	json_error_t je;
	json_t *root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(root)) {
		if (root)
			reply_err(r, 400, "the body must be a JSON object");
		else
			reply_err(r, 400, "the body is not JSON: %s", je.text);
		json_decref(root);
		return NULL;
	}
	return root;
}

static void messages(struct oai_server *s, struct baton_http_req *r)
{
	json_t *root = parse_body(r);
	if (!root)
		return;
	json_t *st = json_object_get(root, "stream"), *b;
	if (st && !json_is_null(st) && !json_is_boolean(st)) {
		reply_err(r, 400, "stream: want true or false");
	} else if ((b = body_of(s, r, root, 0))) {
		struct astate *a = calloc(1, sizeof *a);
		struct oai_error e;
		if (!a) {
			json_decref(b);
			reply_err(r, 500, "out of memory");
		} else {
			a->block = -1;
			memcpy(a->id, "msg_", 4);
			face_random_id(a->id + 4, 25);
			if (face_submit(s, r, OAI_CHAT, b, json_is_true(st), &anthropic_ops, a, &e) != 0) {
				/* the OpenAI field it was checked as, named as this request named it */
				const char *as = strncmp(e.param, "stop", 4) == 0 ? "stop_sequences" :
				    strncmp(e.param, "tool_choice", 11) == 0 ? "tool_choice" :
				    strncmp(e.param, "tools", 5) == 0 ? "tools" : strncmp(e.param, "messages", 8) == 0 ?
				    "messages" : NULL;
				if (as && strncmp(e.message, as, strlen(as)) != 0)
					reply_err(r, e.status, "%s: %s", as, e.message);
				else
					reply_err(r, e.status, "%s", e.message);
			}
		}
	}
	json_decref(root);
}

/* POST /v1/messages/count_tokens: the prompt as the template renders it. */
static void count_tokens(struct oai_server *s, struct baton_http_req *r)
{
	json_t *root = parse_body(r), *b;
	const text_tok *tok = oai_server_tok(s);
	if (!root)
		return;
	if (!tok) {
		reply_err(r, 404, "count_tokens: this engine has no tokenizer");
	} else if ((b = body_of(s, r, root, 1))) {
		char *text = json_dumps(b, JSON_COMPACT), err[512] = "";
		json_decref(b);
		struct oai_request c;
		struct oai_error e;
		if (!text || oai_parse(OAI_CHAT, oai_server_model(s), text, strlen(text), 0, &c, &e) != 0) {
			reply_err(r, text ? e.status : 500, "%s", text ? e.message : "out of memory");
		} else {
			const struct oai_server_opts *o = oai_server_opts(s);
			struct text_chat_opts co = {
				.bos_token = text_token_text(tok, text_bos(tok)),
				.eos_token = text_token_text(tok, text_eos(tok)),
				.add_generation_prompt = 1,
				.enable_thinking = c.q.enable_thinking,
				.tools = c.q.tools,
				.kwargs = c.q.template_kwargs,
			};
			int32_t *ids = NULL;
			size_t n = 0;
			if (text_chat_encode_opts(tok, c.q.msgs, c.q.n_msgs, &co, o->content_special ? TEXT_CONTENT_SPECIAL : 0,
			    &ids, &n, NULL, 0, err, sizeof err) != 0)
				reply_err(r, 400, "messages: chat template: %s", err);
			else
				http_reply_json(r, 200, json_pack("{s:I}", "input_tokens", (json_int_t)n));
			free(ids);
			oai_request_free(&c);
		}
		free(text);
	}
	json_decref(root);
}

int anthropic_route(struct oai_server *s, struct baton_http_req *r, const char *method, const char *path)
{
	int count = strcmp(path, "/v1/messages/count_tokens") == 0;
	if (strcmp(path, "/v1/messages") != 0 && !count)
		return 0;
	if (strcmp(method, "POST") != 0) {
		reply_err(r, 405, "%s wants POST", path);
		return 1;
	}
	if (count)
		count_tokens(s, r);
	else
		messages(s, r);
	return 1;
}
