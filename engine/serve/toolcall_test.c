/*
 * toolcall_test.c: the answer split (openai.h, struct oai_split): each
 * family's tool-call format parsed into calls, reasoning between <think>
 * and </think> split out, text that only looks like a marker kept, and
 * the same result whether the text comes whole or one byte at a time
 * (a stream).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai.h"
#include "tests/t.h"

struct got {
	char content[1024], reasoning[1024];
	char names[4][64], args[4][256], ids[4][40];
	int n_calls, pieces, frags;
};

static void on_piece(void *arg, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c)
{
	struct got *g = arg;
	g->pieces++;
	if (k == OAI_P_TOOL_ARGS) {
		T_ASSERT(c->index == g->n_calls - 1 && n > 0);
		if (c->index < 4)
			strncat(g->args[c->index], t, n);
		g->frags++;
		return;
	}
	if (k == OAI_P_TOOL || k == OAI_P_TOOL_START) {
		if (g->n_calls < 4) {
			T_EQ_INT(c->index, g->n_calls);
			snprintf(g->names[g->n_calls], 64, "%s", c->name);
			snprintf(g->args[g->n_calls], 256, "%s", c->args ? c->args : "");
			T_ASSERT((k == OAI_P_TOOL) == (c->args != NULL));
			snprintf(g->ids[g->n_calls], 40, "%s", c->id);
		}
		g->n_calls++;
		return;
	}
	char *dst = k == OAI_P_CONTENT ? g->content : g->reasoning;
	T_ASSERT(n > 0);
	strncat(dst, t, n);
}

static const char weather[] = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}}}}}]";

/* Splits text whole and byte by byte; both must agree. */
static void split(enum oai_tool_format f, int think, int parallel, const char *text, struct got *g)
{
	json_t *tools = json_loads(weather, 0, NULL);
	struct got one;
	for (int pass = 0; pass < 2; pass++) {
		struct got *x = pass ? &one : g;
		memset(x, 0, sizeof *x);
		struct oai_split s;
		oai_split_init(&s, f, think, parallel, tools, 42, on_piece, x);
		if (pass == 0) {
			T_EQ_INT(oai_split_push(&s, text, strlen(text)), 0);
		} else {
			for (size_t i = 0; text[i]; i++)
				T_EQ_INT(oai_split_push(&s, text + i, 1), 0);
		}
		T_EQ_INT(oai_split_finish(&s), 0);
		oai_split_free(&s);
	}
	T_ASSERT_MSG(strcmp(g->content, one.content) == 0, "whole '%s', bytes '%s'", g->content, one.content);
	T_ASSERT_MSG(strcmp(g->reasoning, one.reasoning) == 0, "whole '%s', bytes '%s'", g->reasoning,
	    one.reasoning);
	T_EQ_INT(g->n_calls, one.n_calls);
	T_ASSERT(one.frags >= g->frags); /* byte by byte, the arguments come in more pieces */
	for (int i = 0; i < g->n_calls && i < 4; i++)
		T_ASSERT(strcmp(g->args[i], one.args[i]) == 0 && strcmp(g->names[i], one.names[i]) == 0);
	json_decref(tools);
}

static void t_hermes(void)
{
	struct got g;
	split(OAI_TOOLS_HERMES, 0, 1, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
	    "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
	    "{\"city\": \"Rome\", \"days\": 2}}\n</tool_call>", &g);
	T_ASSERT_MSG(strcmp(g.content, "Let me check.") == 0, "'%s'", g.content);
	T_EQ_INT(g.n_calls, 2);
	T_ASSERT(strcmp(g.names[0], "get_weather") == 0);
	/* the usual shape streams: the arguments as the model wrote them */
	T_ASSERT_MSG(strcmp(g.args[0], "{\"city\": \"Paris\"}") == 0, "%s", g.args[0]);
	T_ASSERT_MSG(strcmp(g.args[1], "{\"city\": \"Rome\", \"days\": 2}") == 0, "%s", g.args[1]);
	T_ASSERT(g.frags >= 2);
	T_ASSERT(strncmp(g.ids[0], "call_", 5) == 0 && strlen(g.ids[0]) == 29 && strcmp(g.ids[0], g.ids[1]) != 0);
	/* parallel_tool_calls: false keeps the first */
	split(OAI_TOOLS_HERMES, 0, 0, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call><tool_call>"
	    "{\"name\":\"b\",\"arguments\":{}}</tool_call>", &g);
	T_EQ_INT(g.n_calls, 1);
	T_ASSERT(strcmp(g.names[0], "a") == 0 && g.content[0] == '\0');
	/* a call cut by the end of the output (no closing tag) still parses */
	split(OAI_TOOLS_HERMES, 0, 1, "<tool_call>\n{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":1}\"}", &g);
	T_EQ_INT(g.n_calls, 1);
	T_ASSERT_MSG(strcmp(g.args[0], "{\"x\":1}") == 0, "%s", g.args[0]);
	/* streamed arguments: nested objects kept whole, the format's brace
	 * and closing tag left out, also when the output ends without them */
	split(OAI_TOOLS_HERMES, 0, 1, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": {\"b\": [1, {}]}}}\n</tool_call>",
	    &g);
	T_ASSERT_MSG(g.n_calls == 1 && strcmp(g.args[0], "{\"a\": {\"b\": [1, {}]}}") == 0, "%s", g.args[0]);
	split(OAI_TOOLS_HERMES, 0, 1, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}", &g);
	T_ASSERT_MSG(g.n_calls == 1 && strcmp(g.args[0], "{\"x\": 1}") == 0, "%s", g.args[0]);
	split(OAI_TOOLS_HERMES, 0, 1, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"}\"} }\n</tool_call> after", &g);
	T_ASSERT_MSG(g.n_calls == 1 && strcmp(g.args[0], "{\"x\": \"}\"}") == 0, "%s", g.args[0]);
	T_ASSERT_MSG(strcmp(g.content, " after") == 0 || strcmp(g.content, "after") == 0, "'%s'", g.content);
	/* what does not parse stays text, markers and all */
	split(OAI_TOOLS_HERMES, 0, 1, "a <tool_call>not json</tool_call> b <tool", &g);
	T_EQ_INT(g.n_calls, 0);
	T_ASSERT_MSG(strcmp(g.content, "a <tool_call>not json</tool_call> b <tool") == 0, "'%s'", g.content);
	/* no tool format: everything is content, trailing space kept */
	split(OAI_TOOLS_NONE, 0, 1, "<tool_call>{\"name\":\"a\"}</tool_call> \n", &g);
	T_EQ_INT(g.n_calls, 0);
	T_ASSERT(strcmp(g.content, "<tool_call>{\"name\":\"a\"}</tool_call> \n") == 0);
}

static void t_qwen3_coder(void)
{
	struct got g;
	split(OAI_TOOLS_QWEN3_CODER, 0, 1, "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
	    "New York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", &g);
	T_ASSERT_MSG(strcmp(g.content, "Checking.") == 0, "'%s'", g.content);
	T_EQ_INT(g.n_calls, 1);
	T_ASSERT(strcmp(g.names[0], "get_weather") == 0);
	/* the schema says days is an integer, city a string */
	T_ASSERT_MSG(strcmp(g.args[0], "{\"city\":\"New York\",\"days\":3}") == 0, "%s", g.args[0]);
	T_ASSERT(g.frags == 3); /* streamed: a piece per parameter and the close */
	/* two calls, the second without parameters; a call cut short keeps what came */
	split(OAI_TOOLS_QWEN3_CODER, 0, 1, "<tool_call>\n<function=f>\n</function>\n</tool_call>\n<tool_call>\n"
	    "<function=get_weather>\n<parameter=days>\n2\n</parameter>\n<parameter=city>\nOslo", &g);
	T_EQ_INT(g.n_calls, 2);
	T_ASSERT_MSG(strcmp(g.args[0], "{}") == 0 && strcmp(g.args[1], "{\"days\":2}") == 0, "%s | %s", g.args[0],
	    g.args[1]);
	T_ASSERT_MSG(g.content[0] == '\0', "'%s'", g.content);
	/* parallel_tool_calls: false keeps the first; text after a call is content */
	split(OAI_TOOLS_QWEN3_CODER, 0, 0, "<tool_call><function=a><parameter=x>1</parameter></function></tool_call>"
	    "<tool_call><function=b></function></tool_call> done", &g);
	T_ASSERT_MSG(g.n_calls == 1 && strcmp(g.names[0], "a") == 0 && strcmp(g.args[0], "{\"x\":\"1\"}") == 0, "%s",
	    g.args[0]);
	T_ASSERT_MSG(strcmp(g.content, " done") == 0 || strcmp(g.content, "done") == 0, "'%s'", g.content);
	split(OAI_TOOLS_QWEN3_CODER, 0, 1, "<tool_call><function=></function></tool_call>", &g);
	T_EQ_INT(g.n_calls, 0);
}

static void t_mistral(void)
{
	struct got g;
	split(OAI_TOOLS_MISTRAL, 0, 1, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
	    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]", &g);
	T_EQ_INT(g.n_calls, 2);
	T_ASSERT(strcmp(g.args[1], "{\"city\":\"Oslo\"}") == 0 && g.content[0] == '\0');
	T_ASSERT_MSG(strlen(g.ids[0]) == 9, "%s", g.ids[0]); /* Mistral's templates want 9 */
	/* the v11 tokenizer's form */
	split(OAI_TOOLS_MISTRAL, 0, 1, "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\"}[TOOL_CALLS]f[ARGS]{}", &g);
	T_EQ_INT(g.n_calls, 2);
	T_ASSERT_MSG(strcmp(g.content, "Sure.") == 0, "'%s'", g.content);
	/* it streams: the arguments as the model wrote them */
	T_ASSERT_MSG(strcmp(g.names[0], "get_weather") == 0 && strcmp(g.args[0], "{\"city\": \"Lima\"}") == 0, "%s",
	    g.args[0]);
	T_ASSERT(strcmp(g.names[1], "f") == 0 && strcmp(g.args[1], "{}") == 0 && g.frags >= 2);
	split(OAI_TOOLS_MISTRAL, 0, 1, "[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{\"x\": [1, 2]} \n", &g);
	T_ASSERT_MSG(g.n_calls == 1 && strcmp(g.names[0], "f") == 0 && strcmp(g.args[0], "{\"x\": [1, 2]}") == 0, "%s",
	    g.args[0]);
	/* parallel_tool_calls: false keeps the first */
	split(OAI_TOOLS_MISTRAL, 0, 0, "[TOOL_CALLS]a[ARGS]{}[TOOL_CALLS]b[ARGS]{\"y\": 1}", &g);
	T_ASSERT(g.n_calls == 1 && strcmp(g.names[0], "a") == 0 && strcmp(g.args[0], "{}") == 0);
	split(OAI_TOOLS_MISTRAL, 0, 1, "[TOOL_CALLS] oops", &g);
	T_EQ_INT(g.n_calls, 0);
	T_ASSERT_MSG(strcmp(g.content, "[TOOL_CALLS] oops") == 0, "'%s'", g.content);
}

static void t_reasoning(void)
{
	struct got g;
	split(OAI_TOOLS_NONE, 1, 1, "<think>\nI ponder.\n\nStill.\n</think>\n\nLet there be light.", &g);
	T_ASSERT_MSG(strcmp(g.reasoning, "I ponder.\n\nStill.") == 0, "'%s'", g.reasoning);
	T_ASSERT_MSG(strcmp(g.content, "Let there be light.") == 0, "'%s'", g.content);
	/* Qwen3 with thinking off in its own output: an empty think */
	split(OAI_TOOLS_NONE, 1, 1, "<think>\n\n</think>\n\nAnd God said", &g);
	T_ASSERT(g.reasoning[0] == '\0' && strcmp(g.content, "And God said") == 0);
	/* no think at the start: all content, a later </think> included */
	split(OAI_TOOLS_NONE, 1, 1, "In the <thin beginning </think>", &g);
	T_ASSERT(g.reasoning[0] == '\0' && strcmp(g.content, "In the <thin beginning </think>") == 0);
	split(OAI_TOOLS_NONE, 1, 1, "<thi", &g);
	T_ASSERT(strcmp(g.content, "<thi") == 0);
	/* cut while thinking: what came is reasoning */
	split(OAI_TOOLS_NONE, 1, 1, "<think>\nhmm", &g);
	T_ASSERT(strcmp(g.reasoning, "hmm") == 0 && g.content[0] == '\0');
	/* the prompt opened the think (DeepSeek-R1's template): reasoning first */
	{
		struct got one;
		memset(&one, 0, sizeof one);
		struct oai_split sp;
		oai_split_init(&sp, OAI_TOOLS_NONE, 1, 1, NULL, 1, on_piece, &one);
		oai_split_thinking(&sp);
		const char *t = "\nFirst, light.\n</think>\n\nLet there be light.";
		for (size_t i = 0; t[i]; i++)
			T_EQ_INT(oai_split_push(&sp, t + i, 1), 0);
		T_EQ_INT(oai_split_finish(&sp), 0);
		oai_split_free(&sp);
		T_ASSERT_MSG(strcmp(one.reasoning, "First, light.") == 0, "'%s'", one.reasoning);
		T_ASSERT(strcmp(one.content, "Let there be light.") == 0);
	}
	/* thinking, then a call */
	split(OAI_TOOLS_HERMES, 1, 1, "<think>\nweather: call it\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
	    "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", &g);
	T_ASSERT(strcmp(g.reasoning, "weather: call it") == 0 && g.content[0] == '\0');
	T_EQ_INT(g.n_calls, 1);
}

/* A forced tool_choice: the output is the call (the grammar's). */
static void t_forced(void)
{
	struct got g;
	struct oai_split sp;
	for (int bytes = 0; bytes < 2; bytes++) {
		memset(&g, 0, sizeof g);
		oai_split_init(&sp, OAI_TOOLS_FORCED_NAMED, 0, 1, NULL, 5, on_piece, &g);
		sp.forced_name = "get_weather";
		const char *t = " {\"city\": \"Paris\"} \n";
		if (bytes)
			for (size_t i = 0; t[i]; i++)
				T_EQ_INT(oai_split_push(&sp, t + i, 1), 0);
		else
			T_EQ_INT(oai_split_push(&sp, t, strlen(t)), 0);
		T_EQ_INT(oai_split_finish(&sp), 0);
		oai_split_free(&sp);
		T_EQ_INT(g.n_calls, 1);
		T_ASSERT(strcmp(g.names[0], "get_weather") == 0);
		T_ASSERT_MSG(strcmp(g.args[0], "{\"city\": \"Paris\"}") == 0, "'%s'", g.args[0]);
		T_ASSERT(g.content[0] == '\0' && (bytes ? g.frags > 2 : g.frags == 1));
	}
	split(OAI_TOOLS_FORCED_ARRAY, 0, 1, "[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": "
	    "{\"x\": 1}}]", &g);
	T_EQ_INT(g.n_calls, 2);
	T_ASSERT(strcmp(g.names[1], "g") == 0 && strcmp(g.args[1], "{\"x\":1}") == 0 && g.content[0] == '\0');
	/* cut short by max_tokens: no call, the text as content */
	split(OAI_TOOLS_FORCED_ARRAY, 0, 1, "[{\"name\": \"f\", \"argu", &g);
	T_ASSERT(g.n_calls == 0 && strcmp(g.content, "[{\"name\": \"f\", \"argu") == 0);
}

/* The template's source names the formats. */
static void t_caps(void)
{
	struct oai_caps c;
	oai_caps_of(NULL, &c);
	T_EQ_INT(c.tools, OAI_TOOLS_NONE);
	oai_caps_of("{{'<tool_call>\\n<function=' + name + '>'}}<parameter=", &c);
	T_EQ_INT(c.tools, OAI_TOOLS_QWEN3_CODER);
	oai_caps_of("<tool_call>{{ x }}</tool_call><think>", &c);
	T_ASSERT(c.tools == OAI_TOOLS_HERMES && c.think);
	T_ASSERT(strcmp(oai_tool_format_name(OAI_TOOLS_MISTRAL), "mistral") == 0);
}

T_MAIN(T_CASE(t_hermes), T_CASE(t_qwen3_coder), T_CASE(t_mistral), T_CASE(t_reasoning), T_CASE(t_forced), T_CASE(t_caps))
