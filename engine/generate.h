/*
 * generate.h: text in, text out. A generator joins the three parts of a
 * language model that an arena (version 2) holds: its tokenizer and chat
 * template (text/text.h), its forward pass (model.h) and a sampler
 * (sample.h). One request: render the conversation with the model's own
 * chat template (or take a raw prompt), encode it, prefill, then decode
 * and sample one token per step until a stop token, a stop string or the
 * length limit, streaming the text as it becomes final.
 *
 * The engine's `complete` op (serve.c), the CLI's `baton complete` and
 * `baton chat`, and later the OpenAI-compatible API all stand on
 * generator_run. Not thread-safe: the serve loop runs one request at a
 * time on an engine (under its run lock), as it does GEN.
 */
#ifndef BATON_ENGINE_GENERATE_H
#define BATON_ENGINE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/sample.h"
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

#endif
