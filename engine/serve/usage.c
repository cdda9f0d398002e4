/*
 * usage.c: the usage report the front door counts a request by
 * (X-Baton-Usage asked for it): a header of a whole answer, a comment
 * line of a stream before its [DONE] (see openai_http.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/serve/openai_http.h"
#include "proto/base/base.h"

/* "prompt_tokens=P completion_tokens=C ttft_s=T finish=F": what the
 * front door counts a request by (a header of a whole reply, a comment
 * line of a stream before its [DONE]). A batch's: its choices' counts
 * summed (batch.c), its first token. */
static void usage_report(const struct oreq *q, const struct baton_gen_result *res, char *out, size_t n)
{
	const struct obatch *b = q->b;
	double t_in = b ? b->t_in : q->h.tm.t_in, t_first = b ? b->t_first : q->h.tm.t_first;
	const char *fin = b ? b->finish : res->finish;
	snprintf(out, n, "prompt_tokens=%u completion_tokens=%u ttft_s=%.6f finish=%s", b ? b->n_prompt : res->n_prompt,
	    b ? b->n_tokens : res->n_tokens, t_first > 0 ? t_first - t_in : 0.0, fin && fin[0] ? fin : "stop");
}

/* A whole answer (takes j), with the usage report the front door asked for. */
void oreq_reply_whole(struct oreq *q, const struct baton_gen_result *res, json_t *j)
{
	struct baton_http_req *r = q->b ? q->b->r : q->h.r;
	if (!q->door) {
		http_reply_json(r, 200, j);
		return;
	}
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!body) {
		http_reply_error(r, 500, BATON_ENOMEM, "out of memory");
		return;
	}
	char rep[200], hdr[240];
	usage_report(q, res, rep, sizeof rep);
	snprintf(hdr, sizeof hdr, "X-Baton-Usage: %s", rep);
	const char *const headers[] = { hdr, NULL };
	http_reply(r, 200, "application/json", body, strlen(body), headers);
	free(body);
}

void oreq_usage_comment(struct oreq *q, const struct baton_gen_result *res)
{
	if (!q->door)
		return;
	/* a comment line (SSE clients skip it) */
	char rep[200], line[240];
	usage_report(q, res, rep, sizeof rep);
	int n = snprintf(line, sizeof line, ": baton-usage %s\n", rep);
	http_stream_write(q->b ? q->b->st : q->h.st, line, (size_t)n);
}
