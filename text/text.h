/*
 * text.h: tokenizers, streaming detokenization and chat templates that
 * match Hugging Face's `tokenizers` and `transformers` byte for byte.
 *
 * A tokenizer loads from a Hugging Face tokenizer.json (+ its
 * tokenizer_config.json) or from a GGUF file's tokenizer.ggml.* key-values
 * given as a JSON object whose keys are the GGUF key names (the arena stores
 * them so). Supported: byte-level BPE with the pre-tokenizers of Qwen2/Qwen3
 * (Split regex + ByteLevel), GPT-2, GPT-NeoX and OLMo (ByteLevel with its
 * regex), SentencePiece-style BPE with byte fallback and ▁ spaces
 * (Llama/Mistral/Mixtral), the normalisers those use (NFC/NFD/NFKC/NFKD via
 * utf8proc, Prepend, Replace, Sequence), special and added tokens. Anything
 * else is refused at load with a message naming it. docs/internals/text.md has the
 * details and the conformance figures.
 *
 * Errors: 0 or a baton_err (proto/base/base.h); the functions that take `err`
 * write a one-line reason there (always NUL-terminated when errlen > 0).
 * A text_tok is immutable after load: encode and decode may run on it from
 * any number of threads at once.
 */
#ifndef BATON_TEXT_H
#define BATON_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct text_tok text_tok;

/* From tokenizer.json text (`json`, `len` bytes) and, optionally, the
 * tokenizer_config.json text (`config` may be NULL): special tokens, BOS/EOS/
 * pad, add_bos_token/add_eos_token and chat_template come from there. */
int text_tok_load_hf(text_tok **out, const char *json, size_t len, const char *config,
                     size_t config_len, char *err, size_t errlen);

/* From a JSON object of GGUF tokenizer keys ("tokenizer.ggml.model",
 * "tokenizer.ggml.tokens", ...; arrays as JSON arrays), following
 * llama.cpp's conventions; "tokenizer.chat_template" is kept too. */
int text_tok_load_gguf(text_tok **out, const char *json, size_t len, char *err, size_t errlen);

/* The tokenizer and chat template an arena (format v2) stores; an arena
 * without one (experts only) is BATON_EUNSUPPORTED with a sentence. */
struct baton_arena;
int text_tok_load_arena(text_tok **out, const struct baton_arena *a, char *err, size_t errlen);
/* The same from any store of an arena's blobs by key (`blob` gives a
 * blob's bytes and 0, or nonzero when there is none): what baton-arena
 * create checks on the blobs it is about to write, so that an import
 * refuses what an engine would refuse at load, with the same message. */
typedef int (*text_blob_fn)(void *ctx, const char *key, const void **data, uint64_t *len);
int text_tok_load_blobs(text_tok **out, text_blob_fn blob, void *ctx, char *err, size_t errlen);
/* A file: a GGUF-key JSON (it has "tokenizer.ggml.model") or a
 * tokenizer.json, in which case tokenizer_config.json beside it is read
 * when present. */
int text_tok_load_file(text_tok **out, const char *path, char *err, size_t errlen);

/* NULL is allowed. */
void text_tok_free(text_tok *t);

/* Encode flags. */
#define TEXT_ADD_SPECIAL 1u /* add BOS/EOS as the tokenizer's post-processor says */
#define TEXT_NO_SPECIAL  2u /* special tokens in the text are plain text (llama.cpp's
                             * parse_special=false); default: matched, as HF does */

/* Encodes `len` bytes of UTF-8 (invalid UTF-8 is refused with BATON_EINVAL).
 * *ids is malloc'ed (free it); *n its count. */
int text_encode(const text_tok *t, const char *s, size_t len, unsigned flags, int32_t **ids,
                size_t *n, char *err, size_t errlen);

/* Decode flags. */
#define TEXT_SKIP_SPECIAL 1u /* leave special tokens out, as skip_special_tokens=True */
#define TEXT_CLEANUP      2u /* transformers' clean_up_tokenization_spaces: " ." -> "."
                              * and the like; whole decodes only (not streams) */

/* Whether the tokenizer_config.json asks for clean_up_tokenization_spaces
 * (transformers' decode then applies it: pass TEXT_CLEANUP to match). */
bool text_wants_cleanup(const text_tok *t);

/* Decodes ids as HF's decode: *out is malloc'ed, NUL-terminated, *len its
 * length. An id outside the vocabulary is BATON_ERANGE. */
int text_decode(const text_tok *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                size_t *len, char *err, size_t errlen);

/* Vocabulary facts. text_piece returns the stored piece (byte-level or ▁
 * form) of an id, NULL when out of range. Special ids are -1 when absent. */
size_t text_vocab_size(const text_tok *t);
const char *text_piece(const text_tok *t, int32_t id);
bool text_is_special(const text_tok *t, int32_t id);
int32_t text_bos(const text_tok *t);
int32_t text_eos(const text_tok *t);
int32_t text_pad(const text_tok *t);
/* The bytes token `id` adds to the text in the middle of an output, as
 * the decoder chain gives them (byte-level characters as their bytes,
 * "<0xHH>" byte-fallback pieces as that byte, SentencePiece's ▁ as a
 * space; a strip of the whole text's first space left out), written to
 * buf (cap bytes, not NUL-terminated) with their count in *len. For
 * text/grammar/'s token masks. BATON_ERANGE for an id out of range,
 * BATON_EUNSUPPORTED for a tokenizer without a decoder (pieces joined by
 * spaces), BATON_ENOSPC when cap is too small. */
int text_token_bytes(const text_tok *t, int32_t id, char *buf, size_t cap, size_t *len);
/* The stored chat template, or NULL. */
const char *text_chat_template(const text_tok *t);
/* A named template of a model that ships several, as transformers keeps
 * them: "default" (text_chat_template) and "tool_use" (the one
 * apply_chat_template picks when tools are given: Mixtral-8x22B-Instruct,
 * Command R), or NULL. From tokenizer_config.json's list of
 * {name, template}, a folder's additional_chat_templates/tool_use.jinja,
 * or a GGUF's tokenizer.chat_template.tool_use. */
const char *text_chat_template_named(const text_tok *t, const char *name);
/* The text of a token as chat templates use it (bos_token, eos_token), or "". */
const char *text_token_text(const text_tok *t, int32_t id);

/* ---- streaming detokenization ----------------------------------------------
 * Tokens one at a time; text comes out only when it is valid UTF-8 (a
 * partial character, or a run of byte-fallback tokens that may continue, is
 * held back). The concatenation of everything pushed out, then finished, is
 * byte-identical to text_decode of the whole sequence. */
typedef struct text_stream text_stream;

/* flags: TEXT_SKIP_SPECIAL; TEXT_CLEANUP is BATON_EUNSUPPORTED here. */
int text_stream_open(text_stream **out, const text_tok *t, unsigned flags);
/* A stream of tokens that continue a text ending in ctx (a prompt's ids):
 * the decoders' start-of-text rules (SentencePiece's Strip and
 * Metaspace, which drop the first token's leading space) apply to the
 * context, not to the first pushed token, so "And God said" + "▁unto"
 * streams " unto" (vLLM's incremental detokenizer does the same). A
 * tokenizer without such a rule ignores ctx. */
int text_stream_open_after(text_stream **out, const text_tok *t, unsigned flags, const int32_t *ctx,
                           size_t n_ctx);
/* Appends the text that became final to *buf (realloc'ed; *len, *cap kept by
 * the caller, start them at NULL/0/0). */
int text_stream_push(text_stream *s, int32_t id, char **buf, size_t *len, size_t *cap);
/* Flushes what was held back (as decode would render it). */
int text_stream_finish(text_stream *s, char **buf, size_t *len, size_t *cap);
void text_stream_close(text_stream *s);

/* ---- Jinja templates ---------------------------------------------------------
 * A Jinja template engine that renders chat templates as transformers'
 * apply_chat_template does (jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks, lstrip_blocks and loopcontrols; raise_exception,
 * strftime_now and transformers' tojson). A template that uses what the
 * engine does not implement is refused at load (BATON_EINVAL, naming the
 * construct and its line). A text_jinja is immutable after load: any number
 * of threads may render it at once. docs/internals/text.md lists what is in. */
typedef struct text_jinja text_jinja;

int text_jinja_load(text_jinja **out, const char *src, size_t len, char *err, size_t errlen);
/* NULL is allowed. */
void text_jinja_free(text_jinja *j);
/* Renders with the variables of `ctx` (a JSON object, `ctx_len` bytes):
 * *out is malloc'ed and NUL-terminated, *out_len (may be NULL) its length.
 * A template's raise_exception is BATON_EINVAL with its message as err;
 * other failures (an undefined value used, a type error, the bounds on
 * steps, output and memory) are errors naming the template line. */
int text_jinja_render(const text_jinja *j, const char *ctx, size_t ctx_len, char **out,
                      size_t *out_len, char *err, size_t errlen);

/* ---- chat templates ----------------------------------------------------------
 * Every template renders through the Jinja engine above, with the variables
 * transformers passes (messages, tools or None, documents as None,
 * add_generation_prompt, bos_token, eos_token, enable_thinking when given,
 * and the caller's extra variables).
 * A template the engine refuses at load is BATON_EUNSUPPORTED, never
 * guessed. */
struct text_msg {
	const char *role;              /* "system", "user", "assistant", "tool" */
	const char *content;
	const char *reasoning_content; /* NULL: absent (Qwen3 reads it) */
	/* Tool calling, as transformers passes them (NULL: absent): */
	const char *tool_calls;        /* assistant: a JSON array of {id, type, function: {name,
	                                * arguments}}, passed as a list (arguments as the
	                                * caller gives them: a mapping or a string) */
	const char *tool_call_id;      /* tool: the call it answers */
	const char *name;              /* tool: the function's name; user/system: a name */
};

struct text_chat_opts {
	const char *bos_token; /* NULL as "" */
	const char *eos_token;
	bool add_generation_prompt;
	int enable_thinking;   /* -1: not given; 0 false; 1 true (Qwen3) */
	const char *tools;     /* a JSON array passed as `tools`; NULL: None */
	const char *kwargs;    /* a JSON object of more variables (chat_template_kwargs);
	                        * a key the renderer sets itself is not replaced */
};

/* "jinja" when the engine can render the template, NULL when it refuses it
 * (or tmpl is NULL): a name for logs. */
const char *text_chat_family(const char *tmpl);

/* Renders into *out (malloc'ed, NUL-terminated). A conversation the
 * template itself rejects (raise_exception) is BATON_EINVAL with the
 * template's own message in err. */
int text_chat_render(const char *tmpl, const struct text_msg *msgs, size_t n,
                     const struct text_chat_opts *opts, char **out, char *err, size_t errlen);

/* The tokenizer's own template, with its BOS and EOS text: what the engine
 * calls. BATON_EUNSUPPORTED when the tokenizer has no template or one the
 * engine refuses. */
int text_chat_apply(const text_tok *t, const struct text_msg *msgs, size_t n,
                    bool add_generation_prompt, int enable_thinking, char **out, char *err,
                    size_t errlen);

/* The conversation rendered by the tokenizer's template and encoded, as
 * the engine sends it to the model (no BOS added: the template writes
 * it). The text of messages is text: a special token's text in a content
 * (<|im_start|>, </s>) is encoded as the characters it is, never as the
 * control token; only the template makes those (OpenAI's rule; issue 28).
 * A U+FDD0 in a content is encoded as U+FFFD (the mark used inside). With
 * TEXT_CONTENT_SPECIAL, content's special texts are tokens, as HF's
 * apply_chat_template(tokenize=True) and llama.cpp make them. */
#define TEXT_CONTENT_SPECIAL 4u
int text_chat_encode(const text_tok *t, const struct text_msg *msgs, size_t n, bool add_generation_prompt,
                     int enable_thinking, unsigned flags, int32_t **ids, size_t *nids, char *err,
                     size_t errlen);
/* The same with all the renderer's variables (opts: add_generation_prompt,
 * enable_thinking, tools, kwargs; its bos and eos tokens are the
 * tokenizer's whatever opts says) and, when tail is not NULL, the rendered
 * prompt's last tail_len - 1 bytes in tail (the API reads whether it opened
 * a <think>). */
int text_chat_encode_opts(const text_tok *t, const struct text_msg *msgs, size_t n,
                          const struct text_chat_opts *opts, unsigned flags, int32_t **ids, size_t *nids,
                          char *tail, size_t tail_len, char *err, size_t errlen);

#endif
