/*
 * completion.c: a COMPLETE request's fields, checked, as a generator
 * request (see completion.h).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "engine/serve/completion.h"

static int parse_messages(const char *text, struct completion *c, char *errbuf, size_t errlen)
{
	json_error_t je;
	json_t *a = json_loads(text, JSON_REJECT_DUPLICATES, &je);
	c->msgs_json = a;
	if (!a || !json_is_array(a)) {
		baton_errf(errbuf, errlen, "messages: not a JSON array of {\"role\", \"content\"}%s%s",
		    a ? "" : ": ", a ? "" : je.text);
		return BATON_EINVAL;
	}
	size_t n = json_array_size(a);
	if (n == 0 || n > BATON_COMPLETE_MAX_MESSAGES) {
		baton_errf(errbuf, errlen, "messages: %zu of them; 1 to %u", n, BATON_COMPLETE_MAX_MESSAGES);
		return n ? BATON_ERANGE : BATON_EINVAL;
	}
	if (!(c->msgs = calloc(n, sizeof *c->msgs)))
		return BATON_ENOMEM;
	size_t i;
	json_t *m;
	json_array_foreach(a, i, m) {
		json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
		json_t *reasoning = json_object_get(m, "reasoning_content");
		if (!json_is_object(m) || !json_is_string(role) || !json_is_string(content) ||
		    (reasoning && !json_is_string(reasoning))) {
			baton_errf(errbuf, errlen, "messages[%zu]: want {\"role\": string, \"content\": string}", i);
			return BATON_EINVAL;
		}
		const char *r = json_string_value(role);
		if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
			baton_errf(errbuf, errlen, "messages[%zu]: role '%.40s' is none of system, user, "
			    "assistant, tool", i, r);
			return BATON_EINVAL;
		}
		c->msgs[i].role = r;
		c->msgs[i].content = json_string_value(content);
		c->msgs[i].reasoning_content = reasoning ? json_string_value(reasoning) : NULL;
	}
	c->q.msgs = c->msgs;
	c->q.n_msgs = n;
	return 0;
}

static int parse_stop(const char *text, struct completion *c, char *errbuf, size_t errlen)
{
	json_t *a = json_loads(text, 0, NULL);
	c->stop_json = a;
	if (!a || !json_is_array(a)) {
		baton_errf(errbuf, errlen, "stop: not a JSON array of strings");
		return BATON_EINVAL;
	}
	size_t n = json_array_size(a);
	if (n > BATON_GEN_MAX_STOP) {
		baton_errf(errbuf, errlen, "stop: %zu strings; at most %u", n, BATON_GEN_MAX_STOP);
		return BATON_ERANGE;
	}
	if (n && !(c->stop = calloc(n, sizeof *c->stop)))
		return BATON_ENOMEM;
	size_t i;
	json_t *s;
	json_array_foreach(a, i, s) {
		if (!json_is_string(s) || json_string_length(s) == 0) {
			baton_errf(errbuf, errlen, "stop[%zu]: want a non-empty string", i);
			return BATON_EINVAL;
		}
		c->stop[i] = json_string_value(s);
	}
	c->q.stop = c->stop;
	c->q.n_stop = n;
	return 0;
}

int completion_parse(const struct baton_msg *req, struct completion *c, char *errbuf, size_t errlen)
{
	memset(c, 0, sizeof *c);
	struct baton_gen_request *q = &c->q;
	q->enable_thinking = -1;
	q->sp = baton_sample_defaults();
	q->sp.max_tokens = BATON_GEN_DEFAULT_MAX_TOKENS;
	int has_p = proto_has(req, PF_PROMPT), has_m = proto_has(req, PF_MESSAGES);
	int rc = 0;
	if (has_p == has_m) {
		baton_errf(errbuf, errlen, "give exactly one of prompt and messages");
		return BATON_EINVAL;
	}
	if (has_p) {
		q->prompt = req->prompt;
		q->prompt_len = strlen(req->prompt);
	} else if ((rc = parse_messages(req->messages, c, errbuf, errlen)) != 0) {
		goto fail;
	}
	if (proto_has(req, PF_STOP) && (rc = parse_stop(req->stop, c, errbuf, errlen)) != 0)
		goto fail;
	if (proto_has(req, PF_ENABLE_THINKING))
		q->enable_thinking = req->enable_thinking ? 1 : 0;
	if (proto_has(req, PF_MAX_TOKENS)) {
		if (req->max_tokens == 0) {
			baton_errf(errbuf, errlen, "max_tokens: at least 1");
			rc = BATON_ERANGE;
			goto fail;
		}
		q->sp.max_tokens = req->max_tokens;
	}
	/* The sampler checks ranges (baton_sampler_new); here only what a
	 * float cannot hold. */
	struct { enum proto_field f; double v; float *dst; const char *name; } fl[] = {
		{ PF_TEMPERATURE, req->temperature, &q->sp.temperature, "temperature" },
		{ PF_TOP_P, req->top_p, &q->sp.top_p, "top_p" },
		{ PF_MIN_P, req->min_p, &q->sp.min_p, "min_p" },
		{ PF_REPETITION_PENALTY, req->repetition_penalty, &q->sp.repetition_penalty, "repetition_penalty" },
		{ PF_PRESENCE_PENALTY, req->presence_penalty, &q->sp.presence_penalty, "presence_penalty" },
		{ PF_FREQUENCY_PENALTY, req->frequency_penalty, &q->sp.frequency_penalty, "frequency_penalty" },
	};
	for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
		if (!proto_has(req, fl[i].f))
			continue;
		if (!isfinite(fl[i].v) || fabs(fl[i].v) > 1e6) {
			baton_errf(errbuf, errlen, "%s: %g is out of range", fl[i].name, fl[i].v);
			rc = BATON_ERANGE;
			goto fail;
		}
		*fl[i].dst = (float)fl[i].v;
	}
	if (proto_has(req, PF_TOP_K))
		q->sp.top_k = req->top_k;
	if (proto_has(req, PF_SEED))
		q->sp.seed = req->seed;
	return 0;
fail:
	completion_free(c);
	return rc;
}

void completion_free(struct completion *c)
{
	json_decref(c->msgs_json);
	json_decref(c->stop_json);
	free(c->msgs);
	free(c->stop);
	memset(c, 0, sizeof *c);
	c->q.enable_thinking = -1;
}
