/*
 * grammar.h: structured output by constrained decoding: a JSON schema (or
 * "any JSON object") compiled into a grammar, and a matcher that follows
 * the output byte by byte and says, before each sampled token, which
 * tokens of the model's vocabulary may come next (a bitset), so the
 * output is valid by construction. docs/internals/grammar.md has the
 * details: the grammar (rules of bytes, byte classes, counted repeats and
 * JSON string bodies, run by a pushdown automaton over a set of stacks),
 * the token trie and the fast path inside strings.
 *
 * What a schema may use: type (a name or a list), properties, required,
 * additionalProperties, items (false or a schema), prefixItems, minItems, maxItems,
 * minLength, maxLength, enum, const, anyOf, oneOf (branches of disjoint
 * types or values), allOf of one schema, $ref to "#", "#/$defs/..." and
 * "#/definitions/...", boolean schemas, and the annotations (title,
 * description, default, examples, $comment, $schema, $id at the root,
 * deprecated, readOnly, writeOnly). Anything else (pattern, format,
 * minimum, uniqueItems: true, ...) is refused with BATON_EUNSUPPORTED and
 * the keyword's JSON pointer ("#/properties/a/pattern") in the message:
 * never ignored.
 *
 * What comes out is a subset of the valid documents, always valid:
 * properties in the schema's order (optional ones may be left out), no
 * properties beyond the declared ones when an object declares some,
 * numbers of at most 19 integer digits, 17 fraction digits and a
 * two-digit exponent, whitespace runs of at most 20 bytes, free JSON
 * (json_object, {}) nested at most 12 deep, no \u escapes of surrogates.
 *
 * A gram and a gram_vocab are immutable once built: any number of
 * matchers and threads may share them. A gram_match is one output's
 * state, used by one thread.
 */
#ifndef BATON_TEXT_GRAMMAR_H
#define BATON_TEXT_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "text/text.h"

typedef struct gram gram;
typedef struct gram_vocab gram_vocab;
typedef struct gram_match gram_match;

/* Compiles a JSON schema (an object or a boolean). BATON_EUNSUPPORTED for
 * a keyword or a combination it cannot enforce, BATON_EINVAL for a
 * malformed schema: both with the pointer of the culprit and a sentence in
 * err. */
int gram_compile_schema(gram **out, json_t *schema, char *err, size_t errlen);
/* Any JSON object (response_format {"type": "json_object"}). */
int gram_compile_json_object(gram **out, char *err, size_t errlen);
/* Qwen3-Coder's XML-style tool calls, as its template writes them after
 * "<tool_call>": <function=NAME> and its parameters,
 * <parameter=P>\nVALUE\n</parameter>, up to </function>. tools: the
 * request's OpenAI tools ([{"function": {"name", "parameters",
 * "strict"}}]); a strict tool's parameters are its properties in their
 * order (the optional ones may be left out, the required ones are there),
 * a string's value its raw text (no '<'; enum, const, minLength (ASCII
 * then), maxLength), any other type's the JSON of its schema; a tool not
 * strict takes any parameters of any text. A parameter without one type,
 * or a keyword the text cannot be held to, is BATON_EUNSUPPORTED with
 * its path ("tools[0].function.parameters#/properties/p/type"). */
int gram_compile_xml_calls(gram **out, json_t *tools, char *err, size_t errlen);
/* NULL allowed. */
void gram_free(gram *g);

/* The vocabulary: n tokens, token i spelled by bytes[i] (lens[i] bytes);
 * a token with usable[i] == 0 (or length 0) is never allowed (special
 * tokens; end-of-sequence ids are the caller's, see gram_match_mask).
 * Builds the token trie and the tables of the fast paths (tens of ms for
 * 151,936 tokens). */
int gram_vocab_new(gram_vocab **out, uint32_t n, const char *const *bytes, const size_t *lens,
    const uint8_t *usable);
/* From a tokenizer (text_token_bytes), n_vocab ids; unusable: ids past
 * the tokenizer's, its special tokens and the n_except ids of except
 * (the end-of-sequence ones, which the caller allows itself). */
int gram_vocab_from_tok(gram_vocab **out, const text_tok *t, uint32_t n_vocab,
    const uint32_t *except, size_t n_except, char *err, size_t errlen);
uint32_t gram_vocab_size(const gram_vocab *v);
void gram_vocab_free(gram_vocab *v);

/* A matcher at the start of a document. g and v must outlive its use;
 * gram_match_free reads neither, so it may come after they are freed
 * (the scheduler answers a request, which frees its grammar, before it
 * frees the sequence). */
int gram_match_new(gram_match **out, const gram *g, const gram_vocab *v);
void gram_match_free(gram_match *m);

/* The tokens that may come next: allow[(n + 63) / 64] is overwritten, bit
 * i of word i / 64 set when token i keeps the output a prefix of a valid
 * document. *can_end: the output is a whole document now (the caller
 * then allows its end-of-sequence tokens). Nothing allowed and !can_end
 * does not happen for a grammar this compiler makes. */
int gram_match_mask(gram_match *m, uint64_t *allow, bool *can_end);
/* Feeds the sampled token. BATON_EINVAL when the token is not allowed
 * (the state is unchanged). */
int gram_match_accept(gram_match *m, uint32_t token);
/* Feeds bytes (tests); BATON_EINVAL, state unchanged, when they leave
 * the grammar. */
int gram_match_accept_bytes(gram_match *m, const char *s, size_t n);
/* Whether bytes would keep the output a prefix of a document (and
 * *whole: make it a whole one); changes nothing. */
bool gram_match_check_bytes(gram_match *m, const char *s, size_t n, bool *whole);
/* The output so far is a whole document. */
bool gram_match_can_end(const gram_match *m);

/* Counters of the last gram_match_mask, for the benchmark: trie nodes
 * visited. */
uint64_t gram_match_last_visits(const gram_match *m);

#endif
