/*
 * openai_http.h: internal to the OpenAI face's files (openai_http.c: the
 * server, a request's parsing, submission and stream; batch.c: the n > 1
 * and prompt-list batch; usage.c: the usage report the front door counts
 * by; responses.c: a /v1/responses request's end). The calls go one way:
 * openai_http.c's on_done hands a batch's choice to batch.c, a response's
 * end to responses.c, a whole answer to usage.c.
 *
 * Internal to engine/serve/ (its door is serve.h).
 */
#ifndef BATON_ENGINE_OPENAI_HTTP_H
#define BATON_ENGINE_OPENAI_HTTP_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/serve/openai.h"
#include "engine/serve/sched.h"
#include "http/http.h"

struct oai_server {
	struct baton_http *http;
	struct oai_server_opts o;
	char *model;
	struct oai_caps caps;      /* of the chat template */
	atomic_ullong next;
	pthread_mutex_t mmu;       /* guards sv */
	struct baton_serving sv;   /* the serving metrics (GET /metrics) */
	char *engine;
};

/* A batch: prompts (/v1/completions' "prompt": [...]) times n (a chat's
 * or completion's "n"), one scheduler request each, one answer: a choice
 * each (index: prompt * n + copy), the usage summed (a prompt and its
 * cached tokens once, as OpenAI counts it: the copies after the first
 * take its blocks from the cache, sched.c); a stream interleaves their chunks. Its counters are taken under mu (the
 * handler submits while the scheduler's thread finishes). */
struct obatch {
	pthread_mutex_t mu;
	struct baton_http_req *r;
	struct baton_http_stream *st;
	int opened, n, left, include_usage, rc;
	enum oai_kind kind;
	char err[512];
	json_t *choices;
	uint32_t n_prompt, n_tokens, n_cached;
	/* the usage report's (usage.c): the arrival, the first choice's first
	 * token, the finish ("length" when any choice was cut) */
	double t_in, t_first;
	char finish[16];
};

/* One request in flight, from the handler to on_done. */
struct oreq {
	struct oai_live h;           /* srv, r, st, q, the split, tm (openai.h) */
	char id[48];
	long long created;
	int streaming;              /* stream opened (the stream's status line is sent) */
	/* logprobs: entries not yet sent (a stream) or all (whole); chat:
	 * [{token, logprob, bytes, top_logprobs}]; completions: OpenAI's
	 * legacy arrays {tokens, token_logprobs, top_logprobs, text_offset} */
	json_t *lp;
	int32_t lp_prev;            /* the last token: the next one's text is decoded after it */
	size_t lp_offset;           /* completions: text_offset of the next token */
	struct obatch *b;           /* one choice of a batch (prompts x n), its choice's index */
	int index, copy;            /* copy: which of the prompt's n (its prompt counts once, at 0) */
	char *echo;                 /* completions' echo: the prompt's text, first */
	size_t echo_len;
	struct oai_resp *resp;      /* /v1/responses: its output items and events (responses.c) */
	int split_live;             /* a whole response split as it came (its logprobs: on_text) */
	int door;                   /* the front door asked for the usage report (X-Baton-Usage) */
};

/* ---- openai_http.c ---- */
/* The error's body with its status (headers: extra lines, NULL-ended; may be NULL). */
void oreq_reply_error(struct baton_http_req *r, const struct oai_error *e, const char *const *headers);
/* The HTTP status of a scheduler's or generator's error and its OpenAI type. */
int oreq_status_of(int rc, const char **type);
/* A request parsed and bound, ready to submit; NULL with e filled. */
struct oreq *oreq_prepare(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind, const char *body,
    size_t len, struct oai_error *e);
void oreq_free(struct oreq *q);
/* The scheduler's callbacks of q. */
struct sched_cb oreq_callbacks(struct oreq *q);
/* A stream's finish chunk. */
void oreq_finish_chunk(struct oreq *q, struct baton_gen_result *res);
/* A whole chat reply (split when the split is on); NULL without memory. */
json_t *oreq_chat_whole(struct oreq *q, struct baton_gen_result *res);
/* A whole completion's echo and a reply's logprobs, added to j (returned). */
json_t *oreq_with_echo(struct oreq *q, json_t *j);
json_t *oreq_with_lp(struct oreq *q, json_t *j);

/* ---- batch.c ---- */
/* A batch of prompts (a JSON array, NULL: root's one prompt) times
 * n_copies, submitted; its one answer comes when the last choice ends. */
void obatch_submit(struct oai_server *s, struct baton_http_req *r, enum oai_kind kind, json_t *root,
    json_t *prompts, size_t n_copies);
/* One choice of q->b ended (the scheduler's on_done); frees res and q. */
void obatch_done(struct oreq *q, int rc, const char *err, struct baton_gen_result *res);

/* ---- usage.c ---- */
/* A whole answer (takes j; NULL: 500), with the usage report the front
 * door asked for: every whole answer of the OpenAI face goes out here. */
void oreq_reply_whole(struct oreq *q, const struct baton_gen_result *res, json_t *j);
/* A stream's usage report (the front door asked): a comment line, before
 * its [DONE] (a Responses stream: after its last event). A choice of a
 * batch reports the batch's (its counts summed, res unused: may be NULL),
 * as a whole answer does. */
void oreq_usage_comment(struct oreq *q, const struct baton_gen_result *res);

/* ---- responses.c ---- */
/* A /v1/responses request ended: its response, whole or as its last
 * events; frees res and q. */
void oreq_resp_done(struct oreq *q, int rc, const char *err, struct baton_gen_result *res);

#endif
