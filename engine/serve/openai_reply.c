/*
 * openai_reply.c: the shapes of OpenAI-compatible replies (openai.h): whole
 * answers, stream chunks and their usage, the model list, one SSE event.
 * Only JSON is built here; what is sent and when is openai_http.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai.h"

const char *oai_finish_reason(const char *finish)
{
	return finish && strcmp(finish, "length") == 0 ? "length" : "stop";
}

/* OpenAI's usage; prompt_tokens_details.cached_tokens: the prompt's
 * tokens the prefix cache held (not read again). */
json_t *oai_usage(uint32_t prompt, uint32_t completion, uint32_t cached)
{
	return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", (json_int_t)prompt, "completion_tokens",
	    (json_int_t)completion, "total_tokens", (json_int_t)prompt + completion, "prompt_tokens_details",
	    "cached_tokens", (json_int_t)cached);
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
	    "model", model, "choices", choice, "usage", oai_usage(res->n_prompt, res->n_tokens, res->n_cached));
}

json_t *oai_tool_call_json(const struct oai_tool_call *c)
{
	return json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", c->id, "type", "function", "function", "name", c->name,
	    "arguments", c->args);
}

json_t *oai_reply_parts(const char *id, long long created, const char *model,
    const struct baton_gen_result *res, const struct oai_parts *p)
{
	json_t *j = oai_reply(OAI_CHAT, id, created, model, res);
	json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
	if (!msg)
		return j;
	int calls = p->tool_calls && json_array_size(p->tool_calls) > 0;
	json_t *c = json_stringn(p->content ? p->content : "", p->content ? p->content_len : 0);
	json_object_set_new(msg, "content", calls && p->content_len == 0 ? json_null() : c ? c : json_string(""));
	if (calls && p->content_len == 0)
		json_decref(c);
	if (p->reasoning_len)
		json_object_set_new(msg, "reasoning_content", json_stringn(p->reasoning, p->reasoning_len));
	if (calls) {
		json_object_set(msg, "tool_calls", p->tool_calls);
		if (strcmp(oai_finish_reason(res->finish), "stop") == 0)
			json_object_set_new(json_array_get(json_object_get(j, "choices"), 0), "finish_reason",
			    json_string("tool_calls"));
	}
	return j;
}

json_t *oai_chunk_delta(const char *id, long long created, const char *model, json_t *delta,
    const char *finish, int usage_null)
{
	json_t *choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0, "delta", delta ? delta : json_object(),
	    "logprobs", "finish_reason", finish ? json_string(finish) : json_null());
	json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object", "chat.completion.chunk", "created",
	    (json_int_t)created, "model", model, "choices", choice);
	if (j && usage_null)
		json_object_set_new(j, "usage", json_null());
	return j;
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
    uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens)
{
	return json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
	    kind == OAI_CHAT ? "chat.completion.chunk" : "text_completion", "created",
	    (json_int_t)created, "model", model, "choices", "usage",
	    oai_usage(prompt_tokens, completion_tokens, cached_tokens));
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
