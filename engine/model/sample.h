/*
 * sample.h: choosing the next token from a model's logits: greedy,
 * temperature, top-k, top-p, min-p, repetition, presence and frequency
 * penalties, logit bias, stop token ids, max tokens, and a seed that makes
 * a run repeatable. The semantics and the order are Hugging Face's and
 * vLLM's (docs/reference/sampling.md):
 *
 *   1. logit bias           l[t] += bias[t]                         (OpenAI)
 *   2. repetition penalty   for each distinct t in prompt + output:
 *                           l > 0 ? l / r : l * r                   (HF)
 *   3. presence, frequency  l[t] -= count[t] * freq + (count[t] > 0) * pres,
 *                           counts over the output only             (OpenAI)
 *   4. temperature < 1e-5   greedy: the largest logit, ties to the lowest id
 *   5. temperature          l /= T
 *   6. top-k                keep the k largest (ties with the k-th kept)
 *   7. top-p                drop the least likely while their total
 *                           probability stays <= 1 - p (keep at least one)
 *   8. min-p                drop tokens with p < min_p * p_max
 *   9. draw                 from softmax of what is left, with the
 *                           sampler's own PRNG (xoshiro256**, seeded)
 *
 * NaN logits count as -inf. Stop strings belong to the text layer: it
 * decodes the tokens as they come (baton_sampler_next's tokens, one at a
 * time) and, on a match, stops the loop and trims the text; the sampler
 * reports only stop token ids and the length limit.
 *
 * Not thread-safe: one sampler per sequence, used by one thread at a time.
 */
#ifndef BATON_ENGINE_SAMPLE_H
#define BATON_ENGINE_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

struct baton_logit_bias {
	uint32_t token;
	float bias;       /* finite; OpenAI's range is [-100, 100] */
};

/* All zeros is not valid (repetition_penalty and top_p 0): start from
 * baton_sample_defaults(), which is plain sampling at temperature 1. */
struct baton_sample_params {
	float temperature;          /* >= 0; below 1e-5 (0): greedy */
	uint32_t top_k;             /* 0: off; >= vocabulary: off */
	float top_p;                /* (0, 1]; 1: off */
	float min_p;                /* [0, 1]; 0: off */
	float repetition_penalty;   /* > 0; 1: off */
	float presence_penalty;     /* [-2, 2]; 0: off */
	float frequency_penalty;    /* [-2, 2]; 0: off */
	uint64_t seed;              /* the same seed, logits and calls: the same tokens */
	uint32_t max_tokens;        /* tokens to generate; 0: no limit */
	const uint32_t *stop_ids;   /* tokens that end the output (e.g. end of turn) */
	uint32_t n_stop_ids;
	const struct baton_logit_bias *bias;
	uint32_t n_bias;
};

/* Why the output ended: not yet, a stop token (the last token is it; it is
 * not text), or max_tokens (the last token is ordinary output). */
enum baton_finish {
	BATON_FINISH_NONE = 0,
	BATON_FINISH_STOP = 1,
	BATON_FINISH_LENGTH = 2,
};

struct baton_sampler;

struct baton_sample_params baton_sample_defaults(void);

/* A sampler for one sequence over a vocabulary of n_vocab tokens. The
 * parameters are checked (BATON_EINVAL, with a sentence in errbuf naming
 * the field) and copied: the caller's arrays need not outlive the call.
 * BATON_ENOMEM. The caller frees *out with baton_sampler_free (NULL is
 * allowed there). */
int baton_sampler_new(const struct baton_sample_params *p, uint32_t n_vocab,
    struct baton_sampler **out, char *errbuf, size_t errlen);
void baton_sampler_free(struct baton_sampler *s);

/* Records the prompt's tokens (the repetition penalty covers them; the
 * presence and frequency penalties do not). May be called more than once
 * before the first token is drawn (chunks); BATON_ESTATE after it,
 * BATON_EINVAL for an id outside the vocabulary (nothing recorded then). */
int baton_sampler_prompt(struct baton_sampler *s, const uint32_t *ids, size_t n);

/* Draws the next token from logits[n_vocab] (which it modifies: the
 * caller's scratch), records it, and says whether the output ends here.
 * BATON_ESTATE once the output has ended; BATON_EINVAL when no logit is
 * finite after the penalties. */
int baton_sampler_next(struct baton_sampler *s, float *logits, uint32_t *token,
    enum baton_finish *finish);

/* The distribution step 9 would draw from, for these logits and the tokens
 * recorded so far: probs[n_vocab], zeros where a token was dropped (greedy:
 * 1 at the chosen token). Changes nothing in the sampler; logits are
 * modified as by baton_sampler_next. For tests and log-probabilities. */
int baton_sampler_probs(struct baton_sampler *s, float *logits, float *probs);

/* Tokens drawn so far, and the finish reason. */
uint32_t baton_sampler_count(const struct baton_sampler *s);
enum baton_finish baton_sampler_finish(const struct baton_sampler *s);

#endif
