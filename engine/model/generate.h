/*
 * generate.h: text in, text out. A generator joins the three parts of a
 * language model that an arena (version 2) holds: its tokenizer and chat
 * template (text/text.h), its forward pass (model.h) and a sampler
 * (sample.h). One request: render the conversation with the model's own
 * chat template (or take a raw prompt), encode it, prefill, then decode
 * and sample one token per step until a stop token, a stop string or the
 * length limit, streaming the text as it becomes final.
 *
 * A request in flight is a struct baton_gen_seq: generator_start renders
 * and encodes its prompt and seeds its own sampler; generator_seq_next
 * takes the logits of its last position, samples, and passes on the text
 * that became final; generator_seq_result hands over the answer. Who runs
 * the forward passes is the caller's: generator_run (one request alone,
 * on the model's own sequence) or the scheduler (sched.h: many requests
 * sharing each step). The same request and seed give the same answer
 * either way, since each sequence's logits do not depend on the others.
 *
 * Not thread-safe: one thread drives a generator and its requests (the
 * serve loop's scheduler thread).
 */
#ifndef BATON_ENGINE_GENERATE_H
#define BATON_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model/engine.h"
#include "engine/model/model.h"
#include "engine/model/sample.h"
#include "text/text.h"

#define BATON_GEN_MAX_STOP 16u          /* stop strings of one request */
#define BATON_GEN_DEFAULT_MAX_TOKENS 256u

struct baton_generator;

/* Builds a generator on engine `e`: the tokenizer from the arena's
 * tokenizer.json (+ tokenizer_config.json) or gguf_tokenizer.json, the
 * chat template from chat_template.jinja or the tokenizer's config, the
 * end-of-sequence ids from the tokenizer, config.json and
 * generation_config.json, and the model (model_open with `opts`, NULL for
 * the defaults) with its KV cache allocated now: the dense weights and the
 * KV cache are held for as long as the generator lives (a release gives
 * back the experts only). An arena without a
 * whole model (the synthetic experts-only kind) is BATON_EUNSUPPORTED
 * with a sentence saying so. The engine must outlive the generator. */
int generator_open(struct baton_engine *e, const struct baton_model_opts *opts,
    struct baton_generator **out, char *errbuf, size_t errlen);
void generator_close(struct baton_generator *g);

/* The tokenizer, for tests and for `baton tokenize`-like uses. */
const text_tok *generator_tokenizer(const struct baton_generator *g);
/* The architecture's name (Hugging Face model_type: "qwen3_moe", ...). */
const char *generator_arch(const struct baton_generator *g);
/* The chat template's family ("qwen3", "mixtral", ...), or NULL when the
 * model has no template this engine renders. */
const char *generator_chat_family(const struct baton_generator *g);

/* Called with each piece of text as it becomes final (never a partial
 * UTF-8 character, never a piece of a stop string). Returning nonzero
 * cancels the request: it ends with finish "cancelled". */
typedef int (*baton_gen_text_fn)(void *arg, const char *text, size_t len);

struct baton_gen_request {
	/* exactly one of prompt and msgs */
	const char *prompt;             /* raw text; BOS added as the tokenizer says */
	size_t prompt_len;
	const struct text_msg *msgs;    /* rendered with the model's chat template */
	size_t n_msgs;
	int enable_thinking;            /* -1: the template's default (Qwen3) */
	struct baton_sample_params sp;  /* stop_ids: extra to the model's own */
	const char *const *stop;        /* stop strings, not part of the text */
	size_t n_stop;
	baton_gen_text_fn on_text;      /* may be NULL */
	void *arg;
};

struct baton_gen_result {
	char *text;                     /* the completion, NUL-terminated (malloc) */
	size_t text_len;
	uint32_t *tokens;               /* its ids, a stop token included (malloc) */
	uint32_t n_tokens;
	uint32_t n_prompt;              /* prompt tokens */
	const char *finish;             /* "stop", "length" or "cancelled" */
	double prefill_s, decode_s;
};

/* Runs one request. Errors (a bad request: BATON_EINVAL, BATON_ERANGE for
 * a prompt longer than the context; the model's or the template's) come
 * with a sentence in errbuf and leave *res empty. On success the caller
 * frees *res with generator_result_free. */
int generator_run(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_result *res, char *errbuf, size_t errlen);
void generator_result_free(struct baton_gen_result *res);

/* The model the generator drives (its forward passes are the caller's
 * when it runs requests with generator_start). */
struct baton_model *generator_model(const struct baton_generator *g);

/* ---- one request in flight ---- */
struct baton_gen_seq;

/* Checks req, encodes its prompt, makes its sampler. The request's
 * strings (stop) and on_text's arg must outlive the sequence. Errors as
 * generator_run's, nothing left then. */
int generator_start(struct baton_generator *g, const struct baton_gen_request *req,
    struct baton_gen_seq **out, char *errbuf, size_t errlen);
/* The prompt's token ids (owned by s) and how many. */
const uint32_t *generator_seq_prompt(const struct baton_gen_seq *s, uint32_t *n);
/* Tokens it may still sample: max_tokens capped by the context's room. */
uint32_t generator_seq_max_tokens(const struct baton_gen_seq *s);
/* Its prefill starts now (the time counted as prefill_s starts here, not
 * at generator_start: a scheduler's queue wait is not prefill). */
void generator_seq_begin(struct baton_gen_seq *s);
/* Takes the logits of the sequence's last position (modified: scratch),
 * samples the next token into *token and passes on the text that became
 * final (on_text). Then generator_seq_finished says whether it ended; if
 * not, *token is what the model must take next. BATON_ESTATE after the
 * end; the sampler's errors. */
int generator_seq_next(struct baton_gen_seq *s, float *logits, uint32_t *token,
    char *errbuf, size_t errlen);
/* NULL while it runs; "stop", "length" or "cancelled" once it ended. */
const char *generator_seq_finished(const struct baton_gen_seq *s);
/* Ends it now as "cancelled" (the client went away); idempotent. */
void generator_seq_cancel(struct baton_gen_seq *s);
/* After the end: the answer, as generator_run gives it (the stream's last
 * text is passed on first). The caller frees *res. BATON_ESTATE before. */
int generator_seq_result(struct baton_gen_seq *s, struct baton_gen_result *res,
    char *errbuf, size_t errlen);
void generator_seq_free(struct baton_gen_seq *s);

#endif
