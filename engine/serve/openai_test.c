/*
 * openai_test.c: the OpenAI-compatible requests and replies (openai.h):
 * every field parsed into the generator request, the defaults, each kind
 * of bad request answered with the status, param and code OpenAI gives,
 * and the replies' and chunks' shapes.
 */
#include <string.h>

#include "engine/serve/openai.h"
#include "tests/t.h"

static int parse(enum oai_kind k, const char *body, struct oai_request *r, struct oai_error *e)
{
	return oai_parse(k, "kjv", body, strlen(body), 99, r, e);
}

static void t_chat_fields(void)
{
	struct oai_request r;
	struct oai_error e;
	const char *b = "{\"model\":\"kjv\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
	    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"In the \"},{\"type\":\"text\","
	    "\"text\":\"beginning\"}]}],\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
	    "\"top_k\":40,\"min_p\":0.1,\"repetition_penalty\":1.1,\"presence_penalty\":0.5,"
	    "\"frequency_penalty\":-0.5,\"seed\":-1,\"stop\":\"\\n\",\"stream\":true,"
	    "\"stream_options\":{\"include_usage\":true},\"n\":1,\"user\":\"u\","
	    "\"chat_template_kwargs\":{\"enable_thinking\":false}}";
	T_EQ_INT(parse(OAI_CHAT, b, &r, &e), 0);
	T_EQ_INT(r.q.n_msgs, 2);
	T_ASSERT(strcmp(r.q.msgs[0].role, "system") == 0);
	T_ASSERT(strcmp(r.q.msgs[1].content, "In the beginning") == 0);
	T_EQ_INT(r.q.sp.max_tokens, 7);
	T_ASSERT(r.q.sp.temperature == 0.5f && r.q.sp.top_p == 0.9f && r.q.sp.top_k == 40);
	T_ASSERT(r.q.sp.min_p == 0.1f && r.q.sp.repetition_penalty == 1.1f);
	T_ASSERT(r.q.sp.presence_penalty == 0.5f && r.q.sp.frequency_penalty == -0.5f);
	T_ASSERT(r.q.sp.seed == UINT64_MAX && r.seeded);
	T_EQ_INT(r.q.n_stop, 1);
	T_ASSERT(strcmp(r.q.stop[0], "\n") == 0);
	T_ASSERT(r.stream && r.include_usage);
	T_EQ_INT(r.q.enable_thinking, 0);
	T_ASSERT(r.q.prompt == NULL);
	oai_request_free(&r);
	oai_request_free(&r); /* idempotent */
}

static void t_defaults_and_prompt(void)
{
	struct oai_request r;
	struct oai_error e;
	T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":[\"In the\"],\"stop\":null,\"seed\":null}", &r, &e), 0);
	T_ASSERT(r.q.prompt && r.q.prompt_len == 6 && r.q.msgs == NULL);
	T_EQ_INT(r.q.sp.max_tokens, OAI_COMPLETION_DEFAULT_MAX_TOKENS);
	T_ASSERT(r.q.sp.seed == 99 && !r.seeded && r.model == NULL);
	T_ASSERT(r.q.sp.temperature == 1.0f && !r.stream);
	oai_request_free(&r);
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":3}", &r, &e), 0);
	T_EQ_INT(r.q.sp.max_tokens, 3);
	T_EQ_INT(r.q.enable_thinking, -1);
	oai_request_free(&r);
	/* chat: no max_tokens means up to the context (0 here) */
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", &r, &e), 0);
	T_EQ_INT(r.q.sp.max_tokens, 0);
	oai_request_free(&r);
}

static void t_errors(void)
{
	static const struct { int kind; const char *body; int status; const char *param, *code, *text; } c[] = {
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}", 400, "tools",
		  "unsupported_parameter", "not supported" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"frobnicate\":1}", 400,
		  "frobnicate", "unsupported_parameter", "frobnicate" },
		{ OAI_CHAT, "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
		  "model", "model_not_found", "gpt-4" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", 400, "n",
		  "unsupported_parameter", "only 1" },
		{ OAI_CHAT, "{\"messages\":[]}", 400, "messages", NULL, "non-empty" },
		{ OAI_CHAT, "{\"prompt\":\"x\"}", 400, "prompt", "unsupported_parameter", "prompt" },
		{ OAI_COMPLETION, "{\"messages\":[]}", 400, "messages", "unsupported_parameter", "messages" },
		{ OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", NULL, "exactly one" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"temperature\":3}", 400, "temperature", NULL, "out of range" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", NULL, "out of range" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", NULL, "at most 4" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"\"]}", 400, "stop", NULL, "non-empty" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400,
		  "stream_options", NULL, "stream is true" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":2}", 400, "logprobs", "unsupported_parameter", "logprobs" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", NULL, "true or false" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role", NULL, "want" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}", 400,
		  "messages[0].tool_calls", "unsupported_parameter", "tools" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
		  "messages[0].content", NULL, "no images" },
		{ OAI_CHAT, "[1]", 400, "", NULL, "JSON object" },
		{ OAI_CHAT, "{\"messages\":", 400, "", NULL, "not JSON" },
		{ OAI_CHAT, "{\"a\":1,\"a\":2}", 400, "", NULL, "not JSON" },
	};
	for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
		struct oai_request r;
		struct oai_error e;
		int st = parse(c[i].kind, c[i].body, &r, &e);
		T_ASSERT_MSG(st == c[i].status, "case %zu: status %d, want %d (%s)", i, st, c[i].status, e.message);
		T_ASSERT_MSG(strcmp(e.param, c[i].param) == 0, "case %zu: param '%s', want '%s'", i, e.param, c[i].param);
		T_ASSERT_MSG((e.code == NULL) == (c[i].code == NULL) && (!e.code || strcmp(e.code, c[i].code) == 0),
		    "case %zu: code %s", i, e.code ? e.code : "null");
		T_ASSERT_MSG(strstr(e.message, c[i].text), "case %zu: '%s' lacks '%s'", i, e.message, c[i].text);
		T_ASSERT(r.root == NULL && r.msgs == NULL && r.stop == NULL);
		json_t *j = oai_error_json(&e);
		json_t *o = json_object_get(j, "error");
		T_ASSERT(json_is_string(json_object_get(o, "message")));
		T_ASSERT(strcmp(json_string_value(json_object_get(o, "type")), "invalid_request_error") == 0);
		T_ASSERT(c[i].param[0] ? json_is_string(json_object_get(o, "param")) : json_is_null(json_object_get(o, "param")));
		T_ASSERT(json_object_get(o, "code") != NULL);
		json_decref(j);
	}
}

static void t_shapes(void)
{
	uint32_t toks[3] = { 1, 2, 3 };
	struct baton_gen_result res = { .text = "Let there", .text_len = 9, .tokens = toks, .n_tokens = 3,
		.n_prompt = 5, .finish = "length" };
	json_t *j = oai_reply(OAI_CHAT, "chatcmpl-1", 1700000000, "kjv", &res);
	char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	T_ASSERT_MSG(strcmp(s, "{\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"logprobs\":null,"
	    "\"message\":{\"content\":\"Let there\",\"role\":\"assistant\"}}],\"created\":1700000000,"
	    "\"id\":\"chatcmpl-1\",\"model\":\"kjv\",\"object\":\"chat.completion\",\"usage\":"
	    "{\"completion_tokens\":3,\"prompt_tokens\":5,\"total_tokens\":8}}") == 0, "%s", s);
	free(s);
	json_decref(j);
	res.finish = "stop";
	j = oai_reply(OAI_COMPLETION, "cmpl-1", 1, "kjv", &res);
	T_ASSERT(strcmp(json_string_value(json_object_get(j, "object")), "text_completion") == 0);
	json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
	T_ASSERT(strcmp(json_string_value(json_object_get(c0, "text")), "Let there") == 0);
	T_ASSERT(strcmp(json_string_value(json_object_get(c0, "finish_reason")), "stop") == 0);
	json_decref(j);

	size_t n;
	char *ev = oai_sse(oai_chunk(OAI_CHAT, "c", 2, "kjv", "assistant", NULL, 0, NULL, 0), &n);
	T_ASSERT_MSG(strcmp(ev, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":2,"
	    "\"model\":\"kjv\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
	    "\"logprobs\":null,\"finish_reason\":null}]}\n\n") == 0 && n == strlen(ev), "%s", ev);
	free(ev);
	ev = oai_sse(oai_chunk(OAI_CHAT, "c", 2, "kjv", NULL, "Let", 3, NULL, 1), &n);
	T_ASSERT_MSG(strstr(ev, "\"delta\":{\"content\":\"Let\"}") && strstr(ev, "\"usage\":null"), "%s", ev);
	free(ev);
	ev = oai_sse(oai_chunk(OAI_CHAT, "c", 2, "kjv", NULL, NULL, 0, "length", 0), &n);
	T_ASSERT_MSG(strstr(ev, "\"delta\":{}") && strstr(ev, "\"finish_reason\":\"length\""), "%s", ev);
	free(ev);
	ev = oai_sse(oai_usage_chunk(OAI_CHAT, "c", 2, "kjv", 5, 3), &n);
	T_ASSERT_MSG(strstr(ev, "\"choices\":[]") && strstr(ev, "\"total_tokens\":8"), "%s", ev);
	free(ev);
	ev = oai_sse(oai_chunk(OAI_COMPLETION, "c", 2, "kjv", NULL, "x", 1, NULL, 0), &n);
	T_ASSERT_MSG(strstr(ev, "\"object\":\"text_completion\"") && strstr(ev, "\"text\":\"x\""), "%s", ev);
	free(ev);
	j = oai_models("kjv", 3);
	T_ASSERT(strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "kjv") == 0);
	json_decref(j);
}

T_MAIN(T_CASE(t_chat_fields), T_CASE(t_defaults_and_prompt), T_CASE(t_errors), T_CASE(t_shapes))
