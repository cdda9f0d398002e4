/*
 * usage.c: the usage report the front door counts a request by
 * (X-Baton-Usage asked for it): a header of a whole answer, a comment
 * line of a stream before its [DONE] (see openai_http.h); every face's
 * (openai.h: the Ollama and Anthropic faces' through face.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai_http.h"
#include "proto/base/base.h"

void oai_usage_report(const struct oai_sv_times *tm, uint32_t prompt, uint32_t completion, const char *finish,
    char *out, size_t n)
{
	snprintf(out, n, "prompt_tokens=%u completion_tokens=%u ttft_s=%.6f finish=%s", prompt, completion,
	    tm->t_first > 0 ? tm->t_first - tm->t_in : 0.0, finish && finish[0] ? finish : "stop");
}

void oai_reply_usage(struct baton_http_req *r, const char *report, json_t *j)
{
	if (!report) {
		http_reply_json(r, 200, j);
		return;
	}
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!body) {
		http_reply_error(r, 500, BATON_ENOMEM, "out of memory");
		return;
	}
	char hdr[240];
	snprintf(hdr, sizeof hdr, "X-Baton-Usage: %s", report);
	const char *const headers[] = { hdr, NULL };
	http_reply(r, 200, "application/json", body, strlen(body), headers);
	free(body);
}

int oai_usage_comment(struct baton_http_stream *st, const char *report)
{
	/* a comment line (SSE clients skip it; the door takes it out of NDJSON too) */
	char line[240];
	int n = snprintf(line, sizeof line, ": baton-usage %s\n", report);
	return http_stream_write(st, line, (size_t)n);
}

/* The OpenAI face's: a batch's choices' counts summed (batch.c), its
 * first token. */
static void usage_report(const struct oreq *q, const struct baton_gen_result *res, char *out, size_t n)
{
	const struct obatch *b = q->b;
	struct oai_sv_times tm = q->h.tm;
	if (b) {
		tm.t_in = b->t_in;
		tm.t_first = b->t_first;
	}
	oai_usage_report(&tm, b ? b->n_prompt : res->n_prompt, b ? b->n_tokens : res->n_tokens,
	    b ? b->finish : res->finish, out, n);
}

/* A whole answer (takes j), with the usage report the front door asked for. */
void oreq_reply_whole(struct oreq *q, const struct baton_gen_result *res, json_t *j)
{
	char rep[200];
	if (q->door)
		usage_report(q, res, rep, sizeof rep);
	oai_reply_usage(q->b ? q->b->r : q->h.r, q->door ? rep : NULL, j);
}

void oreq_usage_comment(struct oreq *q, const struct baton_gen_result *res)
{
	if (!q->door)
		return;
	char rep[200];
	usage_report(q, res, rep, sizeof rep);
	oai_usage_comment(q->b ? q->b->st : q->h.st, rep);
}
