/*
 * text_int.h: the text component's insides, shared by its files only.
 *
 * Files, bottom to top: util.c (buffers, maps), tok.c (the tokenizer
 * object), the loaders load_hf.c and load_gguf.c, and load.c (which picks
 * the loader for a file or an arena); encode.c, decode.c and the chat
 * templates (chat.c, chat_known.c) use the loaded tokenizer.
 *
 * Loading (load_hf.c, load_gguf.c) fills one struct text_tok describing a
 * pipeline like Hugging Face's: added tokens -> normaliser -> pre-tokenizer
 * -> model (BPE by merge ranks, or SentencePiece by scores) -> post-processor;
 * and back: pieces -> decoder chain.
 */
#ifndef BATON_TEXT_INT_H
#define BATON_TEXT_INT_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "proto/base/base.h"
#include "text/text.h"

/* ---- small helpers (util.c) ------------------------------------------------- */

struct tbuf {
	char *p;
	size_t n, cap;
};
int tx_tbuf_put(struct tbuf *b, const void *s, size_t n);
int tx_tbuf_putc(struct tbuf *b, char c);
void tx_tbuf_free(struct tbuf *b);

/* The message into err and code back, so failures read
 * `return text_errf(err, errlen, BATON_EINVAL, ...)`: base.h's baton_fail. */
#define text_errf baton_fail
/* Length of the UTF-8 character at s (1..4), 0 when invalid or cut short. */
size_t tx_utf8_len(const unsigned char *s, size_t n);
bool tx_utf8_valid(const char *s, size_t n);
size_t tx_utf8_encode(uint32_t cp, char *out);
uint32_t tx_utf8_decode(const unsigned char *s, size_t *adv); /* s valid */
/* Rust's String::from_utf8_lossy: each maximal invalid subpart -> U+FFFD. */
int tx_utf8_lossy(struct tbuf *out, const unsigned char *s, size_t n);
/* Bytes at the end of s that begin a character not yet complete (0..3). */
size_t tx_utf8_incomplete_tail(const unsigned char *s, size_t n);

/* String -> id map (open addressing, XXH3). */
struct smap {
	uint64_t *hash;
	int32_t *val;
	const char **key; /* not owned */
	uint32_t *klen;
	size_t cap, n;
};
int tx_smap_init(struct smap *m, size_t expect);
int tx_smap_put(struct smap *m, const char *k, size_t n, int32_t v); /* replaces */
int32_t tx_smap_get(const struct smap *m, const char *k, size_t n);   /* -1 absent */
void tx_smap_free(struct smap *m);

/* (left id, right id) -> (rank, new id). */
struct pmap {
	uint64_t *key; /* ~0 empty */
	int32_t *rank, *id;
	size_t cap, n;
};
int tx_pmap_init(struct pmap *m, size_t expect);
int tx_pmap_put(struct pmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
bool tx_pmap_get(const struct pmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id);
void tx_pmap_free(struct pmap *m);

/* GPT-2's byte <-> printable character map. */
extern uint32_t text_byte_char[256];
int text_char_byte(uint32_t cp); /* -1 when not a byte-level character */
void text_bytelevel_init(void);

/* ---- the tokenizer ------------------------------------------------------------ */

enum tok_type { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5,
	        TT_BYTE = 6 };

struct added_tok {
	char *s;
	size_t n;
	int32_t id;
	bool special, normalized, lstrip, rstrip, single_word;
};

enum norm_kind { N_NFC, N_NFD, N_NFKC, N_NFKD, N_PREPEND, N_REPLACE };
struct norm_step {
	enum norm_kind kind;
	char *a, *b; /* prepend text; replace pattern and content */
};

enum pre_kind { P_SPLIT, P_BYTELEVEL, P_METASPACE, P_DIGITS };
enum prepend_scheme { PS_ALWAYS, PS_FIRST, PS_NEVER };
struct pre_step {
	enum pre_kind kind;
	pcre2_code *re;         /* split, and ByteLevel with use_regex */
	bool add_prefix_space;  /* ByteLevel */
	char repl[8];           /* Metaspace replacement (UTF-8) */
	enum prepend_scheme ps; /* Metaspace */
	bool split;             /* Metaspace */
	bool individual;        /* Digits */
};

enum dec_kind { D_BYTELEVEL, D_REPLACE, D_BYTEFALLBACK, D_FUSE, D_STRIP, D_METASPACE };
struct dec_step {
	enum dec_kind kind;
	char *a, *b;           /* replace pattern/content; strip content char (UTF-8) */
	int start, stop;       /* strip */
	char repl[8];          /* metaspace */
	enum prepend_scheme ps;
};

enum model_kind { M_BPE, M_SPM };

struct text_tok {
	enum model_kind model;
	size_t n_vocab;
	char **piece;
	uint32_t *piece_len;
	float *score;     /* M_SPM */
	uint8_t *type;    /* enum tok_type */
	uint8_t *special; /* 1: skipped by TEXT_SKIP_SPECIAL, matched unless TEXT_NO_SPECIAL */
	struct smap vocab;
	struct pmap merges;
	bool byte_fallback, fuse_unk, ignore_merges;
	int32_t unk;
	int32_t byte_tok[256];

	struct added_tok *added;
	size_t n_added;

	struct norm_step *norm;
	size_t n_norm;
	struct pre_step *pre;
	size_t n_pre;
	bool byte_level; /* the model sees byte-level characters */
	struct dec_step *dec;
	size_t n_dec;
	bool no_decoder; /* pieces joined with " " (tokenizers without a decoder) */

	int32_t post_prefix[4], post_suffix[4];
	size_t n_prefix, n_suffix;

	int32_t bos, eos, pad;
	bool cleanup; /* tokenizer_config.json's clean_up_tokenization_spaces */
	char *chat_template;
	char *tool_template; /* the template named "tool_use" where there is a list, or NULL */
	/* chat_template parsed, once, on the first render (chat.c); any
	 * thread may render with it (text_jinja_render reads it only) */
	_Atomic(text_jinja *) chat_jinja;
	_Atomic(text_jinja *) tool_jinja; /* tool_template parsed, as chat_jinja */
};

/* Allocation of the vocabulary arrays; pieces are copied. */
int tx_tok_alloc_vocab(text_tok *t, size_t n);
int tx_tok_set_piece(text_tok *t, int32_t id, const char *s, size_t n);
int tx_tok_finish(text_tok *t, char *err, size_t errlen); /* maps, byte tokens */
int tx_tok_add_added(text_tok *t, const char *s, size_t n, int32_t id, bool special,
                  bool normalized, bool lstrip, bool rstrip, bool single_word);
int tx_tok_compile_regex(pcre2_code **re, const char *hf_pattern, char *err, size_t errlen);
extern const char TEXT_RE_GPT2[], TEXT_RE_QWEN2[];

/* BPE over one word (byte-level chars or ▁ text): ids appended. */
int tx_bpe_word(const text_tok *t, const char *w, size_t n, int32_t **ids, size_t *nids,
             size_t *cap);
int tx_spm_word(const text_tok *t, const char *w, size_t n, int32_t **ids, size_t *nids,
             size_t *cap);

int text_normalize(const text_tok *t, const char *s, size_t n, struct tbuf *out);
/* text_encode, but a special token whose text starts at one of the n_at
 * offsets `at` (ascending) is plain text: message content inside a
 * rendered chat (text_chat_encode). */
int tx_encode_plain_at(const text_tok *t, const char *s, size_t n, unsigned flags, const size_t *at,
                       size_t n_at, int32_t **ids, size_t *nids, char *err, size_t errlen);

#endif
