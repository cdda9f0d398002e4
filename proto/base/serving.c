/*
 * serving.c: the serving metrics' one table (base.h): each family's
 * name (after the writer's prefix), type, help, vLLM's name and who
 * writes it, and the writer that walks it. A new metric is a row here
 * and an index in base.h's enums.
 */
#include <string.h>

#include "proto/base/base.h"

#define NB BATON_HIST_MAX

static const double le_ttft[NB] = { 0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
	10, 30 };
static const double le_itl[NB] = { 0.001, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
	0.2, 0.3, 0.5, 1 };
static const double le_long[NB] = { 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120, 300 };
static const double le_tok[NB] = { 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000,
	100000 };

enum kind { HIST, CTR, GAUGE, RATIO, ENDS };

#define E BATON_SV_ENGINE
#define D BATON_SV_DOOR

static const struct row {
	const char *name, *type, *help, *vllm;
	unsigned scope;
	enum kind kind;
	int k;                /* the index in its enum (RATIO: the numerator; ENDS: the first end) */
	const double *le;     /* HIST */
	const char *label;    /* ENDS: the label's name */
	int n_ends;           /* ENDS: how many ends from k */
} rows[] = {
	{ "requests_running", "gauge", "Requests running now (engine: in the batch; door: forwarded to an engine, "
	  "not yet answered).", "vllm:num_requests_running", E | D, GAUGE, BATON_SV_RUNNING, NULL, NULL, 0 },
	{ "requests_waiting", "gauge", "Requests waiting (engine: for admission into the batch; door: for an "
	  "engine of their model).", "vllm:num_requests_waiting", E | D, GAUGE, BATON_SV_WAITING, NULL, NULL, 0 },
	{ "kv_blocks_used", "gauge", "KV cache blocks in use.", "(vllm:kv_cache_usage_perc x blocks)", E, GAUGE,
	  BATON_SV_KV_USED, NULL, NULL, 0 },
	{ "kv_blocks", "gauge", "KV cache blocks in the pool.", "vllm:cache_config_info num_gpu_blocks", E, GAUGE,
	  BATON_SV_KV_TOTAL, NULL, NULL, 0 },
	{ "kv_cache_usage_ratio", "gauge", "KV cache blocks in use over the pool's, 0 to 1.",
	  "vllm:kv_cache_usage_perc", E, RATIO, BATON_SV_KV_USED, NULL, NULL, 0 },
	{ "time_to_first_token_seconds", "histogram", "Time to first token: from the request's arrival to its first "
	  "generated token (door: arrival at the door, so an engine's start, refill and queue are in it).",
	  "vllm:time_to_first_token_seconds", E | D, HIST, BATON_SV_TTFT, le_ttft, NULL, 0 },
	{ "inter_token_latency_seconds", "histogram", "Time between two generated tokens of a request.",
	  "vllm:inter_token_latency_seconds", E, HIST, BATON_SV_ITL, le_itl, NULL, 0 },
	{ "e2e_request_latency_seconds", "histogram", "From the request's arrival to its answer's end.",
	  "vllm:e2e_request_latency_seconds", E | D, HIST, BATON_SV_E2E, le_long, NULL, 0 },
	{ "request_queue_time_seconds", "histogram", "From the request's arrival until its prefill starts (engine) "
	  "or it is forwarded to an engine (door).", "vllm:request_queue_time_seconds", E | D, HIST, BATON_SV_QUEUE,
	  le_long, NULL, 0 },
	{ "request_prompt_tokens", "histogram", "Prompt tokens of each request served.", "vllm:request_prompt_tokens",
	  E | D, HIST, BATON_SV_PROMPT, le_tok, NULL, 0 },
	{ "request_generation_tokens", "histogram", "Tokens generated for each request served.",
	  "vllm:request_generation_tokens", E | D, HIST, BATON_SV_GEN, le_tok, NULL, 0 },
	{ "prompt_tokens_total", "counter", "Prompt tokens of the requests served.", "vllm:prompt_tokens_total",
	  E | D, CTR, BATON_SV_PROMPT_TOKENS, NULL, NULL, 0 },
	{ "generation_tokens_total", "counter", "Tokens generated.", "vllm:generation_tokens_total", E | D, CTR,
	  BATON_SV_GEN_TOKENS, NULL, NULL, 0 },
	{ "preemptions_total", "counter", "Running sequences put back to be read again because the KV pool ran out.",
	  "vllm:num_preemptions_total", E, CTR, BATON_SV_PREEMPTIONS, NULL, NULL, 0 },
	{ "request_success_total", "counter", "Requests served, by why they ended (stop, length, cancelled: the "
	  "client left mid-answer).", "vllm:request_success_total", E | D, ENDS, BATON_SV_STOP, NULL,
	  "finished_reason", 3 },
	{ "requests_rejected_total", "counter", "Requests refused before they ran: the client's bad request (a 4xx, "
	  "never counted failed) or a full queue (503 with Retry-After).", "(none)", E | D, ENDS,
	  BATON_SV_BAD_REQUEST, NULL, "reason", 2 },
	{ "requests_failed_total", "counter", "Requests the server's side failed (an engine that died, a forward "
	  "pass that failed).", "(none)", E | D, ENDS, BATON_SV_FAILED, NULL, NULL, 1 },
};

static const char *const end_names[BATON_SV_NEND] = { "stop", "length", "cancelled", "bad_request",
	"queue_full", "failed" };

void baton_sv_observe(struct baton_serving *s, enum baton_sv_hist k, double v)
{
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
		if (rows[i].kind == HIST && rows[i].k == (int)k) {
			baton_hist_add(&s->h[k], rows[i].le, NB, v < 0 ? 0 : v);
			return;
		}
}

enum baton_sv_end baton_sv_finish(const char *finish)
{
	if (finish && strcmp(finish, "length") == 0)
		return BATON_SV_LENGTH;
	if (finish && strcmp(finish, "cancelled") == 0)
		return BATON_SV_CANCELLED;
	return BATON_SV_STOP;
}

/* labels plus one pair (a copy of at most 8 pairs). */
static const char *const *with(const char *const *labels, const char *k, const char *v, const char **buf)
{
	size_t n = 0;
	for (; labels && labels[n] && labels[n + 1] && n < 14; n += 2) {
		buf[n] = labels[n];
		buf[n + 1] = labels[n + 1];
	}
	buf[n] = k;
	buf[n + 1] = v;
	buf[n + 2] = NULL;
	return buf;
}

void baton_sv_write(FILE *f, const char *prefix, unsigned scope, const struct baton_serving *const *s,
    const char *const *const *labels, size_t n)
{
	for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
		const struct row *w = &rows[r];
		if (!(w->scope & scope))
			continue;
		char name[128];
		snprintf(name, sizeof name, "%s%s", prefix, w->name);
		baton_prom_family(f, name, w->type, w->help);
		for (size_t i = 0; i < n; i++) {
			const struct baton_serving *x = s[i];
			const char *buf[20];
			switch (w->kind) {
			case HIST:
				baton_prom_hist(f, name, labels[i], w->le, NB, &x->h[w->k]);
				break;
			case CTR:
				baton_prom_u64(f, name, labels[i], x->c[w->k]);
				break;
			case GAUGE:
				baton_prom_u64(f, name, labels[i], x->g[w->k]);
				break;
			case RATIO: {
				uint64_t tot = x->g[BATON_SV_KV_TOTAL];
				baton_prom_f(f, name, labels[i], 4, tot ? (double)x->g[w->k] / (double)tot : 0.0);
				break;
			}
			case ENDS:
				for (int e = w->k; e < w->k + w->n_ends; e++)
					baton_prom_u64(f, name, w->label ? with(labels[i], w->label, end_names[e], buf) : labels[i],
					    x->end[e]);
				break;
			}
		}
	}
}

bool baton_sv_row(size_t i, const char **name, const char **vllm, unsigned *scope)
{
	if (i >= sizeof rows / sizeof rows[0])
		return false;
	*name = rows[i].name;
	*vllm = rows[i].vllm;
	*scope = rows[i].scope;
	return true;
}
