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
	T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":[[5,6,7]],\"echo\":true}", &r, &e), 0);
	T_ASSERT(r.q.prompt == NULL && r.q.n_prompt_ids == 3 && r.q.prompt_ids[2] == 7 && r.echo);
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
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"required\"}", 400,
		  "tool_choice", NULL, "needs tools" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"function\","
		  "\"function\":{\"name\":\"f\"}}}", 400, "tool_choice", NULL, "needs tools" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
		  "\"function\":{\"name\":\"g\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
		  400, "tool_choice", NULL, "no tool is named 'f'" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
		  "\"function\":{\"name\":\"g\"}}],\"tool_choice\":{\"type\":\"allowed_tools\"}}", 400, "tool_choice",
		  "unsupported_parameter", "only" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
		  "\"function\":{\"name\":\"g\"}}],\"tool_choice\":\"required\",\"response_format\":{\"type\":"
		  "\"json_object\"}}", 400, "response_format", "unsupported_parameter", "send one of them" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\"}]}",
		  400, "tools[0]", NULL, "name: required" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
		  "\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{"
		  "\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}}}]}", 400, "tools[0]", "unsupported_parameter",
		  "pattern" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\","
		  "\"function\":{\"name\":\"f\",\"strict\":true}}],\"response_format\":{\"type\":\"json_object\"}}", 400,
		  "response_format", "unsupported_parameter", "strict tools" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":"
		  "\"yaml\"}}", 400, "response_format.type", NULL, "not one of" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"store\":true}", 400, "store",
		  "unsupported_parameter", "stores" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"modalities\":[\"text\",\"audio\"]}",
		  400, "modalities", "unsupported_parameter", "audio" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"x\":1}}", 400,
		  "logit_bias", NULL, "token id" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"5\":101}}", 400,
		  "logit_bias", NULL, "[-100, 100]" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"max\"}", 400,
		  "reasoning_effort", NULL, "want" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", 400,
		  "messages[0].tool_call_id", NULL, "required" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[{\"function\":{}}]}]}", 400,
		  "messages[0].tool_calls", NULL, "only an assistant" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"tool_calls\":[{\"function\":{}}]}]}",
		  400, "messages[0].tool_calls", NULL, "want" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"x\",\"function_call\":{\"name\":\"f\"}}]}",
		  400, "messages[0].function_call", "unsupported_parameter", "deprecated" },
		{ OAI_CHAT, "{\"model\":\"gpt-4\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404,
		  "model", "model_not_found", "gpt-4" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":0}", 400, "n",
		  NULL, "out of range" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":129}", 400, "n",
		  NULL, "out of range" },
		{ OAI_CHAT, "{\"messages\":[]}", 400, "messages", NULL, "non-empty" },
		{ OAI_CHAT, "{\"prompt\":\"x\"}", 400, "messages", NULL, "required" },
		{ OAI_COMPLETION, "{\"messages\":[]}", 400, "prompt", NULL, "required" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"best_of\":2}", 400, "best_of", "unsupported_parameter", "only 1" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix", "unsupported_parameter", "suffix" },
		{ OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", 400, "prompt", "unsupported_parameter", "exactly one" },
		{ OAI_COMPLETION, "{\"prompt\":[1,\"b\"]}", 400, "prompt", NULL, "prompt[1]" },
		{ OAI_COMPLETION, "{\"prompt\":[]}", 400, "prompt", "unsupported_parameter", "exactly one" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"echo\":true,\"logprobs\":1}", 400, "echo", "unsupported_parameter",
		  "prompt's log-probabilities" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"temperature\":3}", 400, "temperature", NULL, "out of range" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":0}", 400, "max_tokens", NULL, "out of range" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", NULL, "at most 4" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"\"]}", 400, "stop", NULL, "non-empty" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", 400,
		  "stream_options", NULL, "stream is true" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":6}", 400, "logprobs", NULL, "out of range" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400,
		  "top_logprobs", NULL, "only with logprobs" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}",
		  400, "top_logprobs", NULL, "out of range" },
		{ OAI_COMPLETION, "{\"prompt\":\"a\",\"stream\":\"yes\"}", 400, "stream", NULL, "true or false" },
		{ OAI_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role", NULL, "want" },
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
		.n_prompt = 5, .n_cached = 4, .finish = "length" };
	json_t *j = oai_reply(OAI_CHAT, "chatcmpl-1", 1700000000, "kjv", &res);
	char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	T_ASSERT_MSG(strcmp(s, "{\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"logprobs\":null,"
	    "\"message\":{\"content\":\"Let there\",\"role\":\"assistant\"}}],\"created\":1700000000,"
	    "\"id\":\"chatcmpl-1\",\"model\":\"kjv\",\"object\":\"chat.completion\",\"usage\":"
	    "{\"completion_tokens\":3,\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":4},"
	    "\"total_tokens\":8}}") == 0, "%s", s);
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
	ev = oai_sse(oai_usage_chunk(OAI_CHAT, "c", 2, "kjv", 5, 3, 2), &n);
	T_ASSERT_MSG(strstr(ev, "\"choices\":[]") && strstr(ev, "\"total_tokens\":8") &&
	    strstr(ev, "\"prompt_tokens_details\":{\"cached_tokens\":2}"), "%s", ev);
	free(ev);
	ev = oai_sse(oai_chunk(OAI_COMPLETION, "c", 2, "kjv", NULL, "x", 1, NULL, 0), &n);
	T_ASSERT_MSG(strstr(ev, "\"object\":\"text_completion\"") && strstr(ev, "\"text\":\"x\""), "%s", ev);
	free(ev);
	j = oai_models("kjv", 3);
	T_ASSERT(strcmp(json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id")), "kjv") == 0);
	json_decref(j);
}

/* What SDKs send with their defaults passes; fields outside the
 * reference are ignored and counted. */
static void t_lenient(void)
{
	struct oai_request r;
	struct oai_error e;
	const char *b = "{\"model\":\"kjv\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"frob\":1}],"
	    "\"metadata\":{\"a\":\"b\"},\"store\":false,\"parallel_tool_calls\":true,\"reasoning_effort\":\"low\","
	    "\"response_format\":{\"type\":\"text\"},\"logprobs\":false,\"top_logprobs\":null,\"tools\":[],"
	    "\"tool_choice\":\"none\",\"user\":null,\"service_tier\":\"auto\",\"modalities\":[\"text\"],\"audio\":null,"
	    "\"n\":1,\"stream\":false,\"stream_options\":{\"include_usage\":false},\"prediction\":{\"type\":\"content\"},"
	    "\"prompt_cache_key\":\"k\",\"safety_identifier\":\"s\",\"verbosity\":\"medium\",\"functions\":null,"
	    "\"web_search_options\":null,\"frequency_penalty\":null,\"not_in_reference\":[1,2]}";
	T_EQ_INT(parse(OAI_CHAT, b, &r, &e), 0);
	T_ASSERT(r.tools == NULL && r.tool_choice == OAI_TC_NONE && r.parallel_tool_calls == 1);
	T_ASSERT(r.reasoning_effort && strcmp(r.reasoning_effort, "low") == 0);
	oai_request_free(&r);
	T_EQ_INT(parse(OAI_COMPLETION, "{\"prompt\":\"a\",\"echo\":false,\"best_of\":1,\"suffix\":null,"
	    "\"logprobs\":null,\"logit_bias\":{\"7\":-100,\"9\":2.5},\"not_in_reference\":1}", &r, &e), 0);
	T_EQ_INT(r.q.sp.n_bias, 2);
	T_ASSERT(r.q.sp.bias[0].token == 7 && r.q.sp.bias[0].bias == -100.0f && r.q.sp.bias[1].bias == 2.5f);
	oai_request_free(&r);
	json_t *h = json_object();
	oai_ignored_fields(h);
	json_t *ig = json_object_get(h, "ignored_fields");
	T_EQ_INT(json_integer_value(json_object_get(ig, "not_in_reference")), 2);
	T_EQ_INT(json_integer_value(json_object_get(ig, "messages[].frob")), 1);
	json_decref(h);
}

/* Tools and tool messages go to the template as transformers passes them. */
static void t_tools(void)
{
	struct oai_request r;
	struct oai_error e;
	const char *b = "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\","
	    "\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
	    "\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\","
	    "\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}],\"tools\":[{\"type\":\"function\",\"function\":"
	    "{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"},\"strict\":false}}],"
	    "\"tool_choice\":\"auto\",\"parallel_tool_calls\":false,\"chat_template_kwargs\":{\"enable_thinking\":true,"
	    "\"custom\":3}}";
	T_EQ_INT(parse(OAI_CHAT, b, &r, &e), 0);
	T_ASSERT(r.tools && json_array_size(r.tools) == 1 && r.tool_choice == OAI_TC_AUTO && !r.parallel_tool_calls);
	T_ASSERT(r.q.tools && strstr(r.q.tools, "get_weather"));
	T_ASSERT_MSG(r.q.msgs[1].tool_calls && strcmp(r.q.msgs[1].tool_calls, "[{\"type\":\"function\",\"function\":"
	    "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}},\"id\":\"call_1\"}]") == 0, "%s",
	    r.q.msgs[1].tool_calls);
	T_ASSERT(strcmp(r.q.msgs[1].content, "") == 0);
	T_ASSERT(strcmp(r.q.msgs[2].tool_call_id, "call_1") == 0 && strcmp(r.q.msgs[2].role, "tool") == 0);
	T_EQ_INT(r.q.enable_thinking, 1);
	T_ASSERT(r.q.template_kwargs && strstr(r.q.template_kwargs, "\"custom\":3"));
	/* a template without tools refuses them; a Mistral one keeps special tokens */
	struct oai_caps c;
	oai_caps_of("{{ messages }}", &c);
	T_EQ_INT(c.tools, OAI_TOOLS_NONE);
	T_EQ_INT(oai_bind(&r, &c, &e), 400);
	T_ASSERT(strcmp(e.param, "tools") == 0 && strstr(e.message, "takes no tools"));
	oai_caps_of("{% if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", &c);
	T_EQ_INT(c.tools, OAI_TOOLS_MISTRAL);
	T_EQ_INT(oai_bind(&r, &c, &e), 0);
	T_ASSERT(r.q.keep_special);
	oai_request_free(&r);
	/* a forced tool_choice: the grammar makes the output the call; strict is then enforced */
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
	    "\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
	    "\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}],\"tool_choice\":{\"type\":"
	    "\"function\",\"function\":{\"name\":\"f\"}}}", &r, &e), 0);
	T_ASSERT(r.tool_choice == OAI_TC_NAMED && strcmp(r.tool_name, "f") == 0 && r.q.grammar != NULL);
	oai_caps_of("{{ messages }}", &c); /* any template: the call is the grammar's */
	T_EQ_INT(oai_bind(&r, &c, &e), 0);
	oai_request_free(&r);
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
	    "\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
	    &r, &e), 0);
	T_ASSERT(r.tool_choice == OAI_TC_REQUIRED && r.q.grammar != NULL);
	oai_request_free(&r);
	/* strict with tool_choice auto: the calls' grammar, from the template's opening tag */
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
	    "\"function\",\"function\":{\"name\":\"g\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\","
	    "\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
	    "\"required\":[\"a\"],\"additionalProperties\":false}}}]}", &r, &e), 0);
	T_ASSERT(r.tool_choice == OAI_TC_AUTO && r.strict_auto == 1 && r.q.grammar != NULL);
	oai_caps_of("{% if tools %}<tool_call>{% endif %}", &c);
	T_EQ_INT(oai_bind(&r, &c, &e), 0);
	T_ASSERT(r.q.grammar_trigger && strcmp(r.q.grammar_trigger, "<tool_call>") == 0);
	oai_request_free(&r);
	/* the other formats: their own grammar, from their own opening tag */
	static const struct { const char *tmpl, *trigger; } fmts[] = {
		{ "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", "[TOOL_CALLS]" },
		{ "{% if tools %}<function=x><parameter=y>{% endif %}", "<tool_call>" },
		{ "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]f[ARGS]", NULL }, /* Mistral v11: refused */
	};
	for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
		T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
		    "\"function\",\"function\":{\"name\":\"g\"}},{\"type\":\"function\",\"function\":{\"name\":\"f\","
		    "\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
		    "\"required\":[\"a\"],\"additionalProperties\":false}}}]}", &r, &e), 0);
		const gram *hermes = r.q.grammar;
		oai_caps_of(fmts[i].tmpl, &c);
		if (fmts[i].trigger) {
			T_EQ_INT(oai_bind(&r, &c, &e), 0);
			T_ASSERT(r.q.grammar && r.q.grammar != hermes && r.q.grammar == r.grammar);
			T_ASSERT(r.q.grammar_trigger && strcmp(r.q.grammar_trigger, fmts[i].trigger) == 0);
		} else {
			T_EQ_INT(oai_bind(&r, &c, &e), 400);
			T_ASSERT_MSG(strcmp(e.param, "tools") == 0 && strstr(e.message, "tools[1].function.strict") &&
			    strstr(e.message, "[ARGS]"), "%s", e.message);
		}
		oai_request_free(&r);
	}
	/* parameters with $defs (Pydantic's nested models): their $ref resolve
	 * at their own root inside the calls' schema, auto and forced */
	static const char *const choices[] = { "\"auto\"", "\"required\"", "{\"type\":\"function\",\"function\":"
		"{\"name\":\"f\"}}" };
	for (size_t i = 0; i < sizeof choices / sizeof choices[0]; i++) {
		char body[1024];
		snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":%s,"
		    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"g\",\"strict\":true,\"parameters\":"
		    "{\"$defs\":{\"Q\":{\"type\":\"string\"}},\"type\":\"object\",\"properties\":{\"q\":{\"$ref\":"
		    "\"#/$defs/Q\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,"
		    "\"parameters\":{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\"}},\"required\":"
		    "[\"p\"],\"additionalProperties\":false,\"$defs\":{\"P\":{\"type\":\"object\",\"properties\":{\"a\":"
		    "{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/P\"}}},"
		    "\"required\":[\"a\"],\"additionalProperties\":false}}}}}]}", choices[i]);
		int prc = parse(OAI_CHAT, body, &r, &e);
		T_ASSERT_MSG(prc == 0, "%s: %s", choices[i], e.message);
		T_ASSERT(r.q.grammar != NULL);
		oai_request_free(&r);
	}
	/* a Qwen3-Coder parameter its text cannot hold to the schema: 400 with the path */
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
	    "\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\","
	    "\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"}]}}}}}]}", &r, &e), 0);
	oai_caps_of("{% if tools %}<function=x><parameter=y>{% endif %}", &c);
	T_EQ_INT(oai_bind(&r, &c, &e), 400);
	T_ASSERT_MSG(strcmp(e.param, "tools") == 0 && strstr(e.message, "parameters#/properties/a/type"), "%s", e.message);
	oai_request_free(&r);
	/* reasoning_effort "none" turns thinking off where the template has the switch */
	T_EQ_INT(parse(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"none\"}",
	    &r, &e), 0);
	oai_caps_of("{% if enable_thinking %}<think>{% endif %}{{ reasoning_effort }}", &c);
	T_ASSERT(c.think && c.has_enable_thinking && c.has_reasoning_effort && c.tools == OAI_TOOLS_NONE);
	T_EQ_INT(oai_bind(&r, &c, &e), 0);
	T_EQ_INT(r.q.enable_thinking, 0);
	T_ASSERT(r.q.template_kwargs && strcmp(r.q.template_kwargs, "{\"reasoning_effort\":\"none\"}") == 0);
	oai_request_free(&r);
}

T_MAIN(T_CASE(t_chat_fields), T_CASE(t_lenient), T_CASE(t_tools), T_CASE(t_defaults_and_prompt), T_CASE(t_errors), T_CASE(t_shapes))
