/*
 * openai.h: the OpenAI-compatible API's requests and replies, as JSON
 * (jansson): a POST /v1/chat/completions or /v1/completions body checked
 * field by field and turned into a generator request (engine/model/model.h), and the
 * replies shaped as OpenAI sends them: a whole chat.completion or
 * text_completion, the chunks of a stream (server-sent events), the usage
 * chunk, /v1/models, and the error object
 * {"error": {"message", "type", "param", "code"}}.
 *
 * No I/O here: openai_http.c serves these on the engine's --http address
 * (docs/reference/openai.md lists the fields, the defaults and the errors).
 *
 * Internal to engine/serve/ (its door is serve.h).
 */
#ifndef BATON_ENGINE_OPENAI_H
#define BATON_ENGINE_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/model/model.h"

/* OAI_AUTO (oai_parse only): a chat completion when the body has
 * "messages", else a completion (the COMPLETE op's body). */
enum oai_kind { OAI_CHAT = 0, OAI_COMPLETION = 1, OAI_AUTO = 2 };

/* Messages of one chat request. */
#define OAI_MAX_MESSAGES 1024u
/* Prompts of one /v1/completions batch ("prompt": [...]). */
#define OAI_MAX_BATCH 64u
/* "n" (choices of one request) at most, unless --max-n says otherwise,
 * and the most --max-n may allow. */
#define OAI_DEFAULT_MAX_N 8u
#define OAI_MAX_N 128u
/* Stop strings OpenAI allows in one request. */
#define OAI_MAX_STOP 4u
/* max_tokens of /v1/completions when the request gives none (OpenAI's). */
#define OAI_COMPLETION_DEFAULT_MAX_TOKENS 16u

/* An error to answer: HTTP status and OpenAI's error object fields. */
struct oai_error {
	int status;            /* 400, 404, 503, ... */
	const char *type;      /* "invalid_request_error", "server_error", ... */
	const char *code;      /* "model_not_found", ...; NULL: null */
	char param[64];        /* the field, "" for null */
	char message[512];
};

/* tool_choice: what the model may do with the request's tools. */
enum oai_tool_choice { OAI_TC_AUTO = 0, OAI_TC_NONE = 1, OAI_TC_REQUIRED = 2, OAI_TC_NAMED = 3 };

/* logit_bias entries of one request (OpenAI allows any number; a bound). */
#define OAI_MAX_LOGIT_BIAS 1024u
/* top_logprobs: OpenAI's bound. */
#define OAI_MAX_TOP_LOGPROBS 20

/* A parsed request. q points into root (which it owns) and the arrays. */
struct oai_request {
	enum oai_kind kind;
	json_t *root;
	struct text_msg *msgs;
	const char **stop;
	struct baton_gen_request q;
	const char *model;     /* as the client sent it; NULL when absent */
	int stream;            /* "stream": true */
	int include_usage;     /* "stream_options": {"include_usage": true} */
	int seeded;            /* "seed" was given */
	uint32_t n;            /* choices asked for ("n", default 1); one request makes one */
	/* tools: the request's array (in root), NULL when absent or empty */
	json_t *tools;
	enum oai_tool_choice tool_choice;
	const char *tool_name;   /* OAI_TC_NAMED: the function */
	int parallel_tool_calls; /* default 1 */
	const char *reasoning_effort; /* NULL when not given */
	int logprobs;          /* chat logprobs: true; completions logprobs given */
	int top_logprobs;      /* alternatives per token (0..OAI_MAX_TOP_LOGPROBS) */
	int echo;              /* completions: the prompt before the text */
	struct baton_logit_bias *bias;
	uint32_t *ids;         /* a token-id prompt */
	char **owned;          /* strings q points at (tool_calls, tools, kwargs JSON) */
	size_t n_owned;
	gram *grammar;         /* response_format json_object / json_schema, compiled; NULL: text */
	int strict_auto;       /* tool_choice auto with a strict tool: the first's index (its calls' grammar); -1: none */
};

/* Parses a request body: the one parser of the HTTP API's requests and
 * of the COMPLETE op's body (engine/serve/complete.c), so both take the
 * same fields, defaults, caps and ranges and refuse with the same words. `served` is the model id this engine serves: a
 * different "model" is 404 model_not_found. A field this engine does not
 * know or support is 400 naming it (tools, functions, logprobs, n > 1...).
 * Without "seed", seed_default is the sampler's seed. 0 on success (free
 * *r with oai_request_free); else e is filled and *r owns nothing. */
int oai_parse(enum oai_kind kind, const char *served, const char *body, size_t len,
    uint64_t seed_default, struct oai_request *r, struct oai_error *e);
/* Idempotent. */
void oai_request_free(struct oai_request *r);

/* What the served model's chat template can do, for oai_bind. */
enum oai_tool_format {
	OAI_TOOLS_NONE = 0,     /* the template takes no tools */
	OAI_TOOLS_HERMES,       /* <tool_call>{"name", "arguments"}</tool_call>: Qwen2.5/3, Hermes */
	OAI_TOOLS_QWEN3_CODER,  /* <tool_call><function=N><parameter=P>v</parameter></function></tool_call> */
	OAI_TOOLS_MISTRAL,      /* [TOOL_CALLS][{...}] or [TOOL_CALLS]name[ARGS]{...} */
	/* tool_choice forced (the grammar makes the output the call): */
	OAI_TOOLS_FORCED_NAMED, /* the output is the named function's arguments */
	OAI_TOOLS_FORCED_ARRAY, /* the output is [{"name", "arguments"}, ...] */
};
struct oai_caps {
	enum oai_tool_format tools;
	int mistral_args;       /* Mistral's v11 calls, NAME[ARGS]{...} (no JSON array) */
	int think;              /* the template writes <think>: reasoning is split out */
	int has_enable_thinking;   /* the template reads enable_thinking */
	int has_reasoning_effort;  /* the template reads reasoning_effort */
};
/* The caps of a chat template's source (NULL: none). */
void oai_caps_of(const char *tmpl, struct oai_caps *c);
/* The format's name ("hermes", ...; "none"). */
const char *oai_tool_format_name(enum oai_tool_format f);
/* Checks a parsed chat request against the model's template (tools it
 * cannot take are 400) and maps reasoning_effort onto the template's
 * variables. 0, or e filled. */
int oai_bind(struct oai_request *r, const struct oai_caps *c, struct oai_error *e);

/* ---- the tools' grammars (tool_grammar.c) ----
 * Each compiles into r->grammar and sets r->q.grammar; 0, or e filled (a
 * schema the compiler cannot enforce is 400). */
/* tool_choice "required" (name NULL: an array of one or more calls, one
 * without parallel_tool_calls) or a named function (its arguments). */
int oai_forced_tool_grammar(struct oai_request *r, const char *name, struct oai_error *e);
/* strict: true with tool_choice auto: a call the model opens, in the
 * format fmt (oai_parse compiles Hermes', oai_bind the template's). */
int oai_strict_auto_grammar(struct oai_request *r, enum oai_tool_format fmt, struct oai_error *e);

/* ---- the answer split (toolcall.c) ----
 * A chat answer's text, fed as it comes, split into reasoning (between
 * <think> and </think> at its start, when the template thinks), content,
 * and tool calls in the template's format. A piece goes out as soon as it
 * can no longer be part of a marker. A Hermes call of the usual shape
 * ({"name": "N", "arguments": {...}}) goes out as it comes: its start
 * (id, name), then its arguments' text in fragments (the model's own
 * text); other calls whole, when they close (or at the end). A call that
 * does not parse stays in the content. */
enum oai_piece_kind {
	OAI_P_CONTENT, OAI_P_REASONING,
	OAI_P_TOOL,        /* a whole call: id, name, args */
	OAI_P_TOOL_START,  /* a call begins (Hermes' usual shape): id, name; args NULL */
	OAI_P_TOOL_ARGS,   /* more of the last begun call's arguments: text/len, call->index */
};
struct oai_tool_call {
	int index;
	char id[40];           /* call_ + 24 alphanumerics; Mistral: 9 alphanumerics */
	const char *name;
	const char *args;      /* the arguments as a JSON text */
};
/* text/len for CONTENT and REASONING; call for TOOL. */
typedef void (*oai_piece_fn)(void *arg, enum oai_piece_kind k, const char *text, size_t len,
    const struct oai_tool_call *call);
struct oai_buf { char *p; size_t n, cap; };
/* Appends (kept NUL-terminated); 0, or -1 without memory. */
int oai_buf_put(struct oai_buf *b, const char *s, size_t n);
struct oai_split {
	enum oai_tool_format fmt;  /* NONE: no tool calls are looked for */
	int think, parallel;
	const json_t *tools;       /* the request's tools (parameter types); may be NULL */
	const char *forced_name;   /* OAI_TOOLS_FORCED_NAMED: the function */
	uint64_t rng;
	oai_piece_fn fn;
	void *arg;
	int rstate, tstate, think_lead, n_calls, pstate;
	size_t pemitted;
	struct oai_buf rhold, thold, ws, callws;
	char nl[64];
	size_t n_nl;
	char cname[128];           /* the call streaming now (Qwen3-Coder: its parameters' types) */
};
void oai_split_init(struct oai_split *s, enum oai_tool_format fmt, int think, int parallel,
    const json_t *tools, uint64_t id_seed, oai_piece_fn fn, void *arg);
/* The prompt opened the think (its template wrote "<think>" last): the
 * answer starts as reasoning, up to its "</think>". Before the first push. */
void oai_split_thinking(struct oai_split *s);
/* 0, or -1 without memory. */
int oai_split_push(struct oai_split *s, const char *text, size_t len);
int oai_split_finish(struct oai_split *s);
void oai_split_free(struct oai_split *s);

/* Fields outside OpenAI's reference are ignored (vLLM's rule), counted
 * here (all threads) and logged once each on stderr. Adds
 * "ignored_fields": {NAME: COUNT} to obj when any was seen. */
void oai_ignored_fields(json_t *obj);
/* The error's code on the control socket (proto.h): 400 BATON_EINVAL
 * (BATON_EUNSUPPORTED for an unsupported parameter), 404
 * BATON_ENOTFOUND, 503 BATON_EBUSY, else BATON_ENOMEM. */
int oai_error_code(const struct oai_error *e);

/* Fills e (message printf-style); returns e->status. */
int oai_errorf(struct oai_error *e, int status, const char *type, const char *code,
    const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {...}}: a new reference. */
json_t *oai_error_json(const struct oai_error *e);

/* OpenAI's finish_reason for a generator's finish ("stop", "length"). */
const char *oai_finish_reason(const char *finish);

/* The whole reply: chat.completion or text_completion. New reference. */
json_t *oai_reply(enum oai_kind kind, const char *id, long long created, const char *model,
    const struct baton_gen_result *res);
/* One chunk of a stream. role: the first chat chunk's "assistant" (its
 * delta carries the role and empty content), else NULL. text: the delta
 * (NULL with a finish). finish: NULL while it runs. usage_null: the
 * stream includes usage, so every chunk carries "usage": null. */
json_t *oai_chunk(enum oai_kind kind, const char *id, long long created, const char *model,
    const char *role, const char *text, size_t len, const char *finish, int usage_null);
/* A chat answer split (oai_split): its content, reasoning and tool calls
 * (a JSON array of oai_tool_call_json objects; NULL or empty: none). */
struct oai_parts {
	const char *content;
	size_t content_len;
	const char *reasoning;
	size_t reasoning_len;
	json_t *tool_calls;
};
/* The chat.completion of the parts: content null with calls and no text,
 * reasoning_content when there is some, tool_calls and finish_reason
 * "tool_calls" when the model called. New reference. */
json_t *oai_reply_parts(const char *id, long long created, const char *model,
    const struct baton_gen_result *res, const struct oai_parts *p);
/* {"id", "type": "function", "function": {"name", "arguments"}}. */
json_t *oai_tool_call_json(const struct oai_tool_call *c);
/* A chat chunk with this delta (taken; NULL: {}) and finish_reason (as
 * given, NULL: null). */
json_t *oai_chunk_delta(const char *id, long long created, const char *model, json_t *delta,
    const char *finish, int usage_null);
/* The last chunk of a stream with include_usage: no choices, the usage. */
json_t *oai_usage_chunk(enum oai_kind kind, const char *id, long long created, const char *model,
    uint32_t prompt_tokens, uint32_t completion_tokens, uint32_t cached_tokens);
/* The usage object: the counts and prompt_tokens_details.cached_tokens. */
json_t *oai_usage(uint32_t prompt, uint32_t completion, uint32_t cached);
/* GET /v1/models: the one model this engine serves. */
json_t *oai_models(const char *model, long long created);
/* "data: JSON\n\n" (takes the reference; compact JSON), malloc'd; *len set. */
char *oai_sse(json_t *j, size_t *len);

/* ---- /v1/responses (responses.c) ----
 * OpenAI's Responses API over the chat machinery: a request becomes a
 * chat completion's body (input items into messages, instructions into
 * the system message, text.format into response_format, function tools
 * into chat tools); the answer's pieces (oai_split) become its output
 * items (reasoning, message, function_call), streamed as typed events
 * ("event: response.output_text.delta" ...). Responses with store (the
 * default) are kept in memory, the last 256: previous_response_id,
 * item_reference and GET /v1/responses/{id} find them. */
struct oai_resp;
/* The chat body (malloc'd JSON text, for oai_parse) and the response's
 * state; 0, or e filled (call oai_resp_param on the chat parser's errors
 * too: they name chat's fields). seed: the ids' randomness. */
int oai_resp_parse(const char *body, size_t len, const char *served, uint64_t seed, char **chat_body,
    struct oai_resp **out, struct oai_error *e);
void oai_resp_param(struct oai_error *e);
void oai_resp_free(struct oai_resp *r);
int oai_resp_streaming(const struct oai_resp *r);
/* Writes one event's text (a stream); 0, or nonzero when the client is gone. */
typedef int (*oai_resp_write_fn)(void *arg, const char *ev, size_t n);
/* Before the first piece: the model and time; a stream writes
 * response.created and response.in_progress (w NULL: a whole reply). */
void oai_resp_begin(struct oai_resp *r, const char *model, long long created, oai_resp_write_fn w, void *arg);
/* The logprobs entries (chat's shape, taken; NULL: none) of the tokens
 * sampled since the last piece: the next output_text delta carries them
 * (and its part gathers them); a reasoning or tool piece drops them. */
void oai_resp_logprobs(struct oai_resp *r, json_t *entries);
/* A piece of the split answer (oai_piece_fn's arguments); -1 without memory. */
int oai_resp_piece(struct oai_resp *r, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c);
/* The end: the open item closed, the response (a new reference; a stream
 * has written response.completed or response.incomplete), stored when
 * asked. */
json_t *oai_resp_finish(struct oai_resp *r, const struct baton_gen_result *res);
/* A stream's failure: an error event and response.failed. */
void oai_resp_fail(struct oai_resp *r, const struct oai_error *e);
/* GET /v1/responses/{id}: a copy of a stored response, NULL when not kept. */
json_t *oai_resp_stored(const char *id);
/* DELETE /v1/responses/{id}: forgets it (previous_response_id and GET
 * find it no more); 0, or -1 when not kept. */
int oai_resp_delete(const char *id);
/* Counts a field outside the reference (where: a prefix, "" for chat's). */
void oai_note_ignored(const char *where, const char *key);

/* ---- the server (openai_http.c) ---- */
struct baton_sched;
struct baton_http;

struct oai_server_opts {
	const char *addr;            /* --http ADDR */
	const char *chat_template;   /* the model's (tool-call and reasoning formats); may be NULL */
	const text_tok *tok;         /* POST /tokenize and /detokenize; NULL: 404 */
	uint32_t max_model_len;      /* the context (/tokenize's max_model_len) */
	const char *const *cors_origins; /* origins a browser may call from (http.h); NULL: none */
	int content_special;         /* --special-tokens-in-content (/tokenize encodes as the generator) */
	uint32_t max_n;              /* --max-n: "n" at most this (0: OAI_DEFAULT_MAX_N) */
	const char *token;           /* bearer token; NULL: none (then loopback only) */
	const char *model;           /* the served model id */
	struct baton_sched *sched;   /* runs the requests */
	const char *engine;          /* the engine's name (the metrics' engine label); may be NULL */
	/* one line of the engine's log (the access log: one per request,
	 * unless no_access_log); may be NULL */
	void (*log)(void *arg, const char *line);
	void *log_arg;
	int no_access_log;           /* --no-access-log */
	/* adds the engine's fields to GET /health's object (any thread); may be NULL */
	void (*health)(void *arg, json_t *obj);
	void *health_arg;
	/* the Ollama face (face.h), with health_arg; may be NULL: the model's
	 * facts for /api/show and /api/ps ({"size", "size_vram", "family",
	 * "parameter_size", "quantization_level", "context_length"}), and a
	 * request's keep_alive (seconds idle before the release; 0: at once
	 * when idle, < 0: never) */
	void (*model_facts)(void *arg, json_t *obj);
	void (*keep_alive)(void *arg, double seconds);
};
struct oai_server;

/* Serves POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
 * GET /health and GET /metrics (the serving metrics, proto/base's table)
 * on opts->addr (http/http.h). An address beyond loopback
 * without a token is refused (BATON_EPERM). Errors with a sentence in err. */
int oai_server_open(const struct oai_server_opts *o, struct oai_server **out, char *err, size_t errlen);

/* The serving metrics of one request (GET /metrics, the access log), for
 * every face (openai_http.c's own, face.c's): t_in set at its arrival;
 * admit when its prefill starts, token per token sampled (the
 * scheduler's on_token), done once at its end (before the answer goes
 * out); refused for a request answered before it ran (status, and rc
 * BATON_EBUSY for a full queue). Any thread. */
struct oai_sv_times {
	double t_in, t_admit, t_first, t_last;
};

/* The head of a chat or completion in flight, every face's (openai_http.c's
 * struct oreq, face.c's struct face_req begin with it): the server, the
 * HTTP request and its stream (opened at admit), the parsed request, the
 * answer's split and what a whole answer gathers, the serving metrics. */
struct baton_http_req;
struct baton_http_stream;
struct oai_live {
	struct oai_server *srv;
	struct baton_http_req *r;
	struct baton_http_stream *st;
	struct oai_request q;
	int split_on, split_started, think_open, write_failed;
	struct oai_split sp;
	struct oai_buf content, reasoning;
	json_t *calls;              /* whole answers: the calls made (in the face's shape) */
	struct oai_sv_times tm;
};
/* A chat's split (a completion's: none): the tools' format for its
 * tool_choice (the template's for auto, the grammar's when forced), the
 * reasoning when the template thinks and no call is forced. */
void oai_live_split(struct oai_live *h, const struct oai_caps *c, oai_piece_fn fn, void *arg);
/* Frees what the head owns (the request, the split, the gathered parts). */
void oai_live_free(struct oai_live *h);
/* 64 random bits (getrandom, else the clock): ids and default seeds. */
uint64_t oai_random64(void);
struct baton_gen_result;
void oai_sv_admit(struct oai_server *s, struct oai_sv_times *t);
void oai_sv_token(struct oai_server *s, struct oai_sv_times *t);
void oai_sv_done(struct oai_server *s, const struct oai_sv_times *t, int rc, const struct baton_gen_result *res,
    int stream);
void oai_sv_refused(struct oai_server *s, int status, int rc);
/* The usage report the front door counts a request by (it asks with
 * X-Baton-Usage: 1; usage.c): "prompt_tokens=P completion_tokens=C
 * ttft_s=T finish=F" into out. */
void oai_usage_report(const struct oai_sv_times *tm, uint32_t prompt, uint32_t completion, const char *finish,
    char *out, size_t n);
/* A whole answer (j taken; NULL: 500), with the report as its
 * X-Baton-Usage header (report NULL: none). */
struct baton_http_req;
struct baton_http_stream;
void oai_reply_usage(struct baton_http_req *r, const char *report, json_t *j);
/* A stream's report: a comment line, before its end. */
int oai_usage_comment(struct baton_http_stream *st, const char *report);
/* "http://HOST:PORT", the real port. */
const char *oai_server_url(const struct oai_server *s);
/* Closing, in this order: oai_server_stop (no request comes in any more;
 * those open are answered 503 by the server, or later by the scheduler),
 * then sched_close (its on_done uses the server's memory), then
 * oai_server_close. One server per process (on_gone finds the scheduler
 * through it). NULL ok. */
void oai_server_stop(struct oai_server *s);
void oai_server_close(struct oai_server *s);

#endif
