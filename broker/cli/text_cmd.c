/*
 * text_cmd.c: `baton complete` and `baton chat`, the CLI's way to talk to
 * a model: one COMPLETE request per turn to the engine (proto.h), found by
 * its name in the broker's status (or given as a URL).
 *
 *   baton complete NAME PROMPT [flags]   raw text in, its continuation out
 *   baton chat NAME [MESSAGE...] [flags] a conversation through the model's
 *                                        chat template: one turn per
 *                                        MESSAGE, else per line of stdin
 *
 * Flags come after the command. Exit status as for every baton command:
 * 0 done, 1 failed, 2 usage, 3 busy, 4 no such engine.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker.h"
#include "broker/cli/cli.h"
#include "broker/cli/door_cmd.h"
#include "broker/cli/engine.h"
#include "broker/cli/text_cmd.h"

/* OpenAI's cap on stop strings, which the engine's parser keeps
 * (engine/serve/openai.h). */
#define MAX_STOP 4
/* --max-tokens when not given (the engine's default is the context's room). */
#define DEFAULT_MAX_TOKENS 256

static const char usage_text[] =
    "usage: baton complete NAME PROMPT [flags]\n"
    "       baton chat NAME [MESSAGE...] [flags]\n"
    "\n"
    "  complete   continue PROMPT as raw text (the tokenizer's BOS first)\n"
    "  chat       a conversation in the model's chat template: one turn per MESSAGE,\n"
    "             else one per line of standard input (\"> \" on a terminal; /exit ends)\n"
    "  NAME       a model the broker's front door serves (GET /v1/models: its name or an\n"
    "             alias; a [model] whose engine is not running is started), else an engine\n"
    "             the broker knows, or an engine's control socket URL (ipc://, tcp://)\n"
    "\n"
    "  --max-tokens N          tokens to generate at most (default 256)\n"
    "  --temperature T         0: greedy (default 1)\n"
    "  --top-p P, --top-k K, --min-p P\n"
    "  --repetition-penalty R, --presence-penalty P, --frequency-penalty F\n"
    "  --seed N                the same seed and request: the same answer\n"
    "  --stop TEXT             end the answer before TEXT (up to 4 times)\n"
    "  --system TEXT           chat: a system message first\n"
    "  --no-thinking           chat: enable_thinking=false for templates that read it (Qwen3)\n"
    "  --json                  the reply as JSON: text, finish_reason, usage, token ids, timings\n"
    "  --broker URL            the broker that knows NAME (else $BATON_BROKER, else " BROKER_DEFAULT_CONTROL ")\n"
    "  --http ADDR             its front door (else $BATON_HTTP, else " BROKER_DEFAULT_HTTP ")\n"
    "  --token-file FILE       the door's token (else http.token beside an ipc:// --broker)\n"
    "  --timeout T             per request (default 300s)\n";

struct text_opts {
	const char *cmd, *name, *broker, *system, *http, *token_file;
	char door[300], token[300];  /* door[0]: NAME goes through the front door */
	const char *pos[64];
	int npos;
	const char *stop[MAX_STOP];
	int nstop;
	json_t *fields;          /* the sampling fields of the request body */
	int json, no_thinking;
	int timeout_ms;
};

static void die(int code, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
static void die(int code, const char *fmt, ...)
{
	va_list ap;
	fputs("baton: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(code == EXIT_USAGE ? " (baton complete --help)\n" : "\n", stderr);
	exit(code);
}

static double num(const char *flag, const char *v, double lo, double hi)
{
	char *end;
	errno = 0;
	double d = strtod(v, &end);
	if (errno || end == v || *end || !(d >= lo && d <= hi))
		die(EXIT_USAGE, "%s '%s': want a number from %g to %g", flag, v, lo, hi);
	return d;
}

static void parse(int argc, char **argv, struct text_opts *o)
{
	o->cmd = argv[0];
	o->timeout_ms = 300000;
	o->fields = json_object();
	if (!o->fields)
		die(EXIT_FAILED, "out of memory");
	json_t *m = o->fields;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (a[0] != '-' || a[1] == 0) {
			if (o->npos == (int)(sizeof o->pos / sizeof o->pos[0]))
				die(EXIT_USAGE, "too many arguments");
			o->pos[o->npos++] = a;
			continue;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage_text, stdout);
			exit(EXIT_DONE);
		}
		if (!strcmp(a, "--json")) {
			o->json = 1;
			continue;
		}
		if (!strcmp(a, "--no-thinking")) {
			o->no_thinking = 1;
			continue;
		}
		if (i + 1 >= argc)
			die(EXIT_USAGE, "%s wants a value, or is no flag of baton %s", a, o->cmd);
		const char *v = argv[++i];
		if (!strcmp(a, "--max-tokens")) {
			json_object_set_new(m, "max_tokens", json_integer((json_int_t)num(a, v, 1, 1 << 20)));
		} else if (!strcmp(a, "--temperature")) {
			json_object_set_new(m, "temperature", json_real(num(a, v, 0, 100)));
		} else if (!strcmp(a, "--top-p")) {
			json_object_set_new(m, "top_p", json_real(num(a, v, 0, 1)));
		} else if (!strcmp(a, "--top-k")) {
			json_object_set_new(m, "top_k", json_integer((json_int_t)num(a, v, 0, 1 << 24)));
		} else if (!strcmp(a, "--min-p")) {
			json_object_set_new(m, "min_p", json_real(num(a, v, 0, 1)));
		} else if (!strcmp(a, "--repetition-penalty")) {
			json_object_set_new(m, "repetition_penalty", json_real(num(a, v, 0, 100)));
		} else if (!strcmp(a, "--presence-penalty")) {
			json_object_set_new(m, "presence_penalty", json_real(num(a, v, -2, 2)));
		} else if (!strcmp(a, "--frequency-penalty")) {
			json_object_set_new(m, "frequency_penalty", json_real(num(a, v, -2, 2)));
		} else if (!strcmp(a, "--seed")) {
			json_object_set_new(m, "seed", json_integer((json_int_t)num(a, v, 0, 9007199254740992.0)));
		} else if (!strcmp(a, "--stop")) {
			if (o->nstop == MAX_STOP)
				die(EXIT_USAGE, "--stop: at most %d", MAX_STOP);
			if (!v[0])
				die(EXIT_USAGE, "--stop: an empty string never matches");
			o->stop[o->nstop++] = v;
		} else if (!strcmp(a, "--system")) {
			o->system = v;
		} else if (!strcmp(a, "--broker")) {
			o->broker = v;
		} else if (!strcmp(a, "--http")) {
			o->http = v;
		} else if (!strcmp(a, "--token-file")) {
			o->token_file = v;
		} else if (!strcmp(a, "--timeout")) {
			char *end;
			double s = strtod(v, &end);
			double mul = !strcmp(end, "ms") ? 1e-3 : (!*end || !strcmp(end, "s")) ? 1 : -1;
			if (mul < 0 || !(s > 0) || s * mul > 86400)
				die(EXIT_USAGE, "--timeout '%s': want seconds (e.g. 60 or 60s, 500ms)", v);
			o->timeout_ms = (int)(s * mul * 1000 + 0.5);
		} else {
			die(EXIT_USAGE, "unknown flag '%s'", a);
		}
	}
	if (o->npos < 1)
		die(EXIT_USAGE, "%s: which engine? (NAME)", o->cmd);
	o->name = o->pos[0];
	if (!strcmp(o->cmd, "complete") && o->npos != 2)
		die(EXIT_USAGE, "complete wants NAME and one PROMPT (quote it)");
	if (!o->broker) {
		const char *env = getenv("BATON_BROKER");
		o->broker = env && env[0] ? env : BROKER_DEFAULT_CONTROL;
	}
}

/* NAME as the URL of its control socket: a URL as it is, else the ctl the
 * engine registered with the broker. */
static char *engine_url(const struct text_opts *o)
{
	char *url, err[512];
	int rc = cli_engine_url(o->broker, o->name, o->timeout_ms, &url, err, sizeof err);
	if (rc)
		die(rc == BATON_ENOTFOUND ? EXIT_NOTFOUND : EXIT_FAILED, "%s: %s", o->cmd, err);
	return url;
}

static void door_turn(const struct text_opts *o, json_t *body_j, bool chat_turn, char **answer);

static json_t *stop_json(const struct text_opts *o)
{
	json_t *a = json_array();
	for (int i = 0; i < o->nstop; i++)
		json_array_append_new(a, json_string(o->stop[i]));
	return a;
}

/* One COMPLETE: its body is the OpenAI request's (engine/serve/openai.h
 * parses it); the reply's text is appended to *answer (for the chat's
 * history) and printed. Exits on error. */
static void turn(const struct text_opts *o, const char *url, const char *prompt, json_t *messages,
    char **answer)
{
	struct baton_msg req, rep;
	proto_msg_init(&req, PROTO_OP_COMPLETE);
	req.id = proto_next_id();
	json_t *body_j = json_deep_copy(o->fields);
	if (!body_j)
		die(EXIT_FAILED, "%s: out of memory", o->cmd);
	if (!json_object_get(body_j, "max_tokens"))
		json_object_set_new(body_j, "max_tokens", json_integer(DEFAULT_MAX_TOKENS));
	if (prompt) {
		json_t *p = json_string(prompt);
		if (!p)
			die(EXIT_USAGE, "%s: the prompt is not valid UTF-8 text", o->cmd);
		json_object_set_new(body_j, "prompt", p);
	} else {
		json_object_set(body_j, "messages", messages);
		if (o->no_thinking)
			json_object_set_new(body_j, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", 0));
	}
	if (o->nstop)
		json_object_set_new(body_j, "stop", stop_json(o));
	if (o->door[0]) {
		door_turn(o, body_j, prompt == NULL, answer);
		return;
	}
	char *body = json_dumps(body_j, JSON_COMPACT);
	json_decref(body_j);
	if (!body)
		die(EXIT_FAILED, "%s: the request is not valid UTF-8 text", o->cmd);
	req.body = body;
	proto_set(&req, PF_BODY);
	struct proto_diag d = { 0 };
	int rc = proto_call(url, &req, &rep, o->timeout_ms, &d);
	free(body);
	if (rc) {
		if (rep.reply)
			fprintf(stderr, "baton: %s %s: %s (%s)\n", o->cmd, o->name,
			    rep.msg && rep.msg[0] ? rep.msg : baton_strerror(rc), baton_errname(rc));
		else if (rc == BATON_ECONN)
			fprintf(stderr, "baton: %s: nothing listens at %s (is engine '%s' running?)\n", o->cmd, url, o->name);
		else if (rc == BATON_ETIMEDOUT)
			fprintf(stderr, "baton: %s: no answer from %s within %d ms (--timeout)\n", o->cmd, url, o->timeout_ms);
		else
			fprintf(stderr, "baton: %s: %s: %s %s\n", o->cmd, url, baton_strerror(rc), d.text);
		proto_msg_free(&rep);
		exit(rc == BATON_ERANGE ? EXIT_USAGE : cli_exit_code(rc)); /* a value out of range is a usage error here */
	}
	if (o->json) {
		json_t *ids = json_array();
		const uint8_t *b = rep.tokens.data;
		for (size_t i = 0; i + 4 <= rep.tokens.len; i += 4)
			json_array_append_new(ids, json_integer((json_int_t)((uint32_t)b[i] | (uint32_t)b[i + 1] << 8 |
			    (uint32_t)b[i + 2] << 16 | (uint32_t)b[i + 3] << 24)));
		json_t *j = json_pack("{s:s, s:s, s:{s:i, s:i}, s:o, s:{s:f, s:f, s:f}}", "text", rep.text,
		    "finish_reason", rep.finish_reason, "usage", "prompt_tokens", (json_int_t)rep.prompt_tokens,
		    "completion_tokens", (json_int_t)rep.completion_tokens, "tokens", ids, "timings",
		    "prefill_ms", rep.prefill_ms, "decode_ms", rep.decode_ms, "total_ms", rep.total_ms);
		char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
		if (!s)
			die(EXIT_FAILED, "%s: cannot write the reply as JSON", o->cmd);
		puts(s);
		free(s);
	} else {
		fputs(rep.text, stdout);
		if (!rep.text[0] || rep.text[strlen(rep.text) - 1] != '\n')
			putchar('\n');
	}
	if (fflush(stdout) != 0)
		die(EXIT_FAILED, "%s: cannot write the answer: %s", o->cmd, strerror(errno));
	if (answer)
		*answer = strdup(rep.text);
	proto_msg_free(&rep);
}

/* Whether the front door serves NAME (an id or an alias in GET
 * /v1/models): then every turn goes through it. */
static bool door_serves(struct text_opts *o)
{
	if (strstr(o->name, "://"))
		return false;
	door_addr(o->http, o->door, sizeof o->door);
	int st;
	char *body, err[512];
	if (door_http(o->door, "GET", "/v1/models", NULL, NULL, o->timeout_ms < 10000 ? o->timeout_ms : 10000, &st,
	    &body, err, sizeof err) != 0) {
		if (o->http) /* asked for: say why it is not used */
			fprintf(stderr, "baton: %s: the front door: %s; asking the broker for an engine named %s\n", o->cmd,
			    err, o->name);
		o->door[0] = 0;
		return false;
	}
	json_t *j = json_loads(body, 0, NULL);
	free(body);
	bool yes = false;
	size_t i, k;
	json_t *m, *a;
	json_array_foreach(json_object_get(j, "data"), i, m) {
		yes |= json_is_string(json_object_get(m, "id")) && !strcmp(json_string_value(json_object_get(m, "id")), o->name);
		json_array_foreach(json_object_get(json_object_get(m, "fleet"), "aliases"), k, a)
			yes |= json_is_string(a) && !strcmp(json_string_value(a), o->name);
	}
	json_decref(j);
	if (!yes)
		o->door[0] = 0;
	else
		door_token(o->broker, o->token_file, o->token, sizeof o->token);
	return yes;
}

/* One turn through the door: POST /v1/chat/completions or /v1/completions. */
static void door_turn(const struct text_opts *o, json_t *body_j, bool chat_turn, char **answer)
{
	json_object_set_new(body_j, "model", json_string(o->name));
	json_object_set_new(body_j, "stream", json_false());
	char *body = json_dumps(body_j, JSON_COMPACT);
	json_decref(body_j);
	if (!body)
		die(EXIT_FAILED, "%s: the request is not valid UTF-8 text", o->cmd);
	int st;
	char *rep, err[512];
	int rc = door_http(o->door, "POST", chat_turn ? "/v1/chat/completions" : "/v1/completions", o->token, body,
	    o->timeout_ms, &st, &rep, err, sizeof err);
	free(body);
	if (rc)
		die(EXIT_FAILED, "%s %s: %s", o->cmd, o->name, err);
	json_t *j = json_loads(rep, 0, NULL);
	if (st != 200) {
		const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
		fprintf(stderr, "baton: %s %s: the front door answered %d: %s%s\n", o->cmd, o->name, st, msg ? msg : rep,
		    st == 401 ? " (--token-file FILE)" : "");
		free(rep);
		json_decref(j);
		exit(st == 404 ? EXIT_NOTFOUND : st == 400 ? EXIT_USAGE : EXIT_FAILED);
	}
	json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
	const char *text = chat_turn ? json_string_value(json_object_get(json_object_get(c0, "message"), "content")) :
	    json_string_value(json_object_get(c0, "text"));
	if (!text)
		die(EXIT_FAILED, "%s %s: the front door's reply has no text: %.200s", o->cmd, o->name, rep);
	if (o->json) {
		json_t *out = json_pack("{s:s, s:O, s:O, s:s}", "text", text, "finish_reason",
		    json_object_get(c0, "finish_reason"), "usage", json_object_get(j, "usage"), "model",
		    json_string_value(json_object_get(j, "model")) ? json_string_value(json_object_get(j, "model")) : "");
		char *s2 = out ? json_dumps(out, JSON_COMPACT) : NULL;
		json_decref(out);
		if (!s2)
			die(EXIT_FAILED, "%s: cannot write the reply as JSON", o->cmd);
		puts(s2);
		free(s2);
	} else {
		fputs(text, stdout);
		if (!text[0] || text[strlen(text) - 1] != '\n')
			putchar('\n');
	}
	if (fflush(stdout) != 0)
		die(EXIT_FAILED, "%s: cannot write the answer: %s", o->cmd, strerror(errno));
	if (answer)
		*answer = strdup(text);
	free(rep);
	json_decref(j);
}

static void add_msg(json_t *msgs, const char *role, const char *content)
{
	json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", role, "content", content));
}

static int chat(const struct text_opts *o, const char *url)
{
	json_t *msgs = json_array();
	if (o->system)
		add_msg(msgs, "system", o->system);
	int tty = isatty(STDIN_FILENO) && o->npos == 1;
	char *line = NULL;
	size_t cap = 0;
	for (int k = 1;; k++) {
		const char *user;
		if (o->npos > 1) {
			if (k >= o->npos)
				break;
			user = o->pos[k];
		} else {
			if (tty) {
				fputs("> ", stderr);
				fflush(stderr);
			}
			ssize_t n = getline(&line, &cap, stdin);
			if (n < 0)
				break;
			while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
				line[--n] = '\0';
			if (n == 0)
				continue;
			if (!strcmp(line, "/exit") || !strcmp(line, "/quit"))
				break;
			user = line;
		}
		add_msg(msgs, "user", user);
		char *answer = NULL;
		turn(o, url, NULL, msgs, &answer);
		add_msg(msgs, "assistant", answer ? answer : "");
		free(answer);
	}
	free(line);
	json_decref(msgs);
	return EXIT_DONE;
}

int text_cmd_main(int argc, char **argv)
{
	struct text_opts o = { 0 };
	parse(argc, argv, &o);
	char *url = door_serves(&o) ? strdup(o.door) : engine_url(&o);
	int rc;
	if (!strcmp(o.cmd, "complete")) {
		turn(&o, url, o.pos[1], NULL, NULL);
		rc = EXIT_DONE;
	} else {
		rc = chat(&o, url);
	}
	free(url);
	json_decref(o.fields);
	return rc;
}
