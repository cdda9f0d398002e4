/*
 * face.h: the engine's other front doors, beside OpenAI's: Ollama's API
 * (ollama.c: /api/...) and Anthropic's Messages API (anthropic.c:
 * /v1/messages). Each translates its request into an OpenAI body, which
 * goes through the one parser (oai_parse, oai_bind) and the scheduler as
 * a chat or completion does; face.c runs it and hands the answer back in
 * pieces (content, reasoning, tool calls: the same split as
 * openai_http.c's), and the face writes them in its own shapes
 * (docs/reference/ollama-anthropic.md).
 *
 * Internal to engine/serve/ (its door is serve.h).
 */
#ifndef BATON_ENGINE_FACE_H
#define BATON_ENGINE_FACE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "engine/serve/openai.h"
#include "http/http.h"

struct face_req;

struct face_ops {
	/* the prefill starts (a stream: open it here); may be NULL */
	void (*admit)(struct face_req *f);
	/* a piece of a streamed answer, as it comes (a whole answer's are
	 * gathered into f->content, f->reasoning, f->calls) */
	void (*piece)(struct face_req *f, enum oai_piece_kind k, const char *t, size_t n, const struct oai_tool_call *c);
	/* the end: rc 0 and res (every piece given), or rc and err; the
	 * request is freed after */
	void (*done)(struct face_req *f, int rc, const char *err, const struct baton_gen_result *res);
};

struct face_req {
	/* srv, r, st (the face opens it at admit), q, the split, tm (openai.h);
	 * h.calls: [{id, name, arguments (a JSON text)}] */
	struct oai_live h;
	const struct face_ops *ops;
	void *arg;                      /* the face's, freed with free() */
	int stream;
	int door;                       /* the front door asked for the usage report (X-Baton-Usage) */
	uint32_t n_out;                 /* pieces streamed (a face's counter) */
	double t0;                      /* when it came (monotonic seconds) */
	int64_t created_ns;             /* when it came (the wall clock) */
};

/* Parses body (an OpenAI chat or completion body the face made; taken),
 * binds it to the model and submits it. 0: the answer comes through ops
 * (arg is the request's); else e says why, nothing is left (arg freed). */
int face_submit(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind, json_t *body, int stream,
    const struct face_ops *ops, void *arg, struct oai_error *e);

/* The usage report the front door asked for (usage.c's words): a whole
 * answer's header (j taken), a stream's comment line before its end. Every
 * face's answer goes out through one of these. */
void face_reply_whole(struct face_req *f, const struct baton_gen_result *res, json_t *j);
void face_usage_comment(struct face_req *f, const struct baton_gen_result *res);

/* Is the answer's finish "stop" because a stop string matched? Then the
 * string (one of the request's), else NULL (the model's end, or a cut). */
const char *face_stop_string(struct face_req *f, const struct baton_gen_result *res);

/* The faces' routes (ollama.c, anthropic.c): 1 when the path was theirs
 * (answered), 0 when not. */
int ollama_route(struct oai_server *s, struct baton_http_req *r, const char *method, const char *path);
int anthropic_route(struct oai_server *s, struct baton_http_req *r, const char *method, const char *path);

/* ---- what the faces read of the server (openai_http.c) ---- */
const char *oai_server_model(const struct oai_server *s);
struct baton_sched *oai_server_sched(const struct oai_server *s);
const text_tok *oai_server_tok(const struct oai_server *s);
const struct oai_caps *oai_server_caps(const struct oai_server *s);
const struct oai_server_opts *oai_server_opts(const struct oai_server *s);

/* An RFC 3339 UTC time with nanoseconds, as Ollama writes them. */
void face_time(int64_t ns, char *out, size_t n);
int64_t face_now_ns(void);
/* Random letters and digits into out (n - 1 of them). */
void face_random_id(char *out, size_t n);

#endif
