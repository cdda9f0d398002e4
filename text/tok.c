/*
 * tok.c: the tokenizer object, the bottom the loaders (load_hf.c,
 * load_gguf.c) build on: its vocabulary, added tokens, split regexes,
 * freeing and the accessors. Picking a loader for a file or an arena is
 * load.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/text_int.h"

/* Hugging Face's patterns (onig syntax); tx_tok_compile_regex makes them
 * PCRE2's with the same meaning. */
const char TEXT_RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char TEXT_RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Rust/onig's \s is Unicode White_Space; PCRE2's (with UCP) adds U+180E.
 * Spell White_Space out so both agree. */
#define WS_SET "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}" \
               "\\x{202f}\\x{205f}\\x{3000}"

int tx_tok_compile_regex(pcre2_code **re, const char *pat, char *err, size_t errlen)
{
	struct tbuf b = {0};
	bool in_class = false;
	int rc = 0;
	for (size_t i = 0; pat[i]; i++) {
		char c = pat[i];
		if (c == '\\' && pat[i + 1]) {
			char d = pat[i + 1];
			i++;
			if (d == 's') {
				rc |= in_class ? tx_tbuf_put(&b, WS_SET, strlen(WS_SET))
				               : tx_tbuf_put(&b, "[" WS_SET "]", strlen(WS_SET) + 2);
			} else if (d == 'S') {
				if (in_class) {
					tx_tbuf_free(&b);
					return text_errf(err, errlen, BATON_EUNSUPPORTED,
					    "split pattern: \\S inside a character class is not supported");
				}
				rc |= tx_tbuf_put(&b, "[^" WS_SET "]", strlen(WS_SET) + 3);
			} else {
				char e[2] = {'\\', d};
				rc |= tx_tbuf_put(&b, e, 2);
			}
			continue;
		}
		if (c == '[' && !in_class) {
			in_class = true;
			rc |= tx_tbuf_putc(&b, c);
			if (pat[i + 1] == '^') {
				rc |= tx_tbuf_putc(&b, '^');
				i++;
			}
			if (pat[i + 1] == ']') { /* a literal ] first in a class */
				rc |= tx_tbuf_put(&b, "\\]", 2);
				i++;
			}
			continue;
		}
		if (c == ']' && in_class)
			in_class = false;
		rc |= tx_tbuf_putc(&b, c);
	}
	if (rc) {
		tx_tbuf_free(&b);
		return BATON_ENOMEM;
	}
	int ec;
	PCRE2_SIZE off;
	*re = pcre2_compile((PCRE2_SPTR)b.p, b.n, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &ec,
	                    &off, NULL);
	tx_tbuf_free(&b);
	if (!*re) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(ec, msg, sizeof(msg));
		return text_errf(err, errlen, BATON_EUNSUPPORTED, "split pattern %s: %s at %zu", pat,
		                 (char *)msg, (size_t)off);
	}
	pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
	return 0;
}

int tx_tok_alloc_vocab(text_tok *t, size_t n)
{
	t->n_vocab = n;
	t->piece = calloc(n ? n : 1, sizeof(*t->piece));
	t->piece_len = calloc(n ? n : 1, sizeof(*t->piece_len));
	t->score = calloc(n ? n : 1, sizeof(*t->score));
	t->type = calloc(n ? n : 1, 1);
	t->special = calloc(n ? n : 1, 1);
	if (!t->piece || !t->piece_len || !t->score || !t->type || !t->special)
		return BATON_ENOMEM;
	for (size_t i = 0; i < n; i++)
		t->type[i] = TT_NORMAL;
	return 0;
}

int tx_tok_set_piece(text_tok *t, int32_t id, const char *s, size_t n)
{
	char *p = malloc(n + 1);
	if (!p)
		return BATON_ENOMEM;
	memcpy(p, s, n);
	p[n] = 0;
	free(t->piece[id]);
	t->piece[id] = p;
	t->piece_len[id] = (uint32_t)n;
	return 0;
}

int tx_tok_add_added(text_tok *t, const char *s, size_t n, int32_t id, bool special,
                  bool normalized, bool lstrip, bool rstrip, bool single_word)
{
	struct added_tok *a = realloc(t->added, (t->n_added + 1) * sizeof(*a));
	if (!a)
		return BATON_ENOMEM;
	t->added = a;
	a = &t->added[t->n_added];
	a->s = malloc(n + 1);
	if (!a->s)
		return BATON_ENOMEM;
	memcpy(a->s, s, n);
	a->s[n] = 0;
	a->n = n;
	a->id = id;
	a->special = special;
	a->normalized = normalized;
	a->lstrip = lstrip;
	a->rstrip = rstrip;
	a->single_word = single_word;
	t->n_added++;
	return 0;
}

int tx_tok_finish(text_tok *t, char *err, size_t errlen)
{
	for (size_t i = 0; i < t->n_vocab; i++)
		if (!t->piece[i] && tx_tok_set_piece(t, (int32_t)i, "", 0))
			return BATON_ENOMEM;
	if (tx_smap_init(&t->vocab, t->n_vocab))
		return BATON_ENOMEM;
	/* Lower ids win a duplicate piece (HF's vocab is a map: one id each). */
	for (size_t i = t->n_vocab; i-- > 0;)
		if (t->piece_len[i] && tx_smap_put(&t->vocab, t->piece[i], t->piece_len[i], (int32_t)i))
			return BATON_ENOMEM;
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof(name), "<0x%02X>", b);
		t->byte_tok[b] = tx_smap_get(&t->vocab, name, 6);
	}
	for (size_t i = 0; i < t->n_added; i++) {
		int32_t id = t->added[i].id;
		if (id < 0 || (size_t)id >= t->n_vocab)
			return text_errf(err, errlen, BATON_EINVAL, "added token %s has id %d outside the vocabulary",
			                 t->added[i].s, id);
		if (t->added[i].n == 0)
			return text_errf(err, errlen, BATON_EINVAL, "added token %d is empty", id);
		if (t->added[i].special)
			t->special[id] = 1;
	}
	text_bytelevel_init();
	return 0;
}

void text_tok_free(text_tok *t)
{
	if (!t)
		return;
	text_jinja_free(atomic_load(&t->chat_jinja));
	text_jinja_free(atomic_load(&t->tool_jinja));
	for (size_t i = 0; i < t->n_vocab; i++)
		free(t->piece[i]);
	free(t->piece);
	free(t->piece_len);
	free(t->score);
	free(t->type);
	free(t->special);
	tx_smap_free(&t->vocab);
	tx_pmap_free(&t->merges);
	for (size_t i = 0; i < t->n_added; i++)
		free(t->added[i].s);
	free(t->added);
	for (size_t i = 0; i < t->n_norm; i++) {
		free(t->norm[i].a);
		free(t->norm[i].b);
	}
	free(t->norm);
	for (size_t i = 0; i < t->n_pre; i++)
		pcre2_code_free(t->pre[i].re);
	free(t->pre);
	for (size_t i = 0; i < t->n_dec; i++) {
		free(t->dec[i].a);
		free(t->dec[i].b);
	}
	free(t->dec);
	free(t->chat_template);
	free(t->tool_template);
	free(t);
}

size_t text_vocab_size(const text_tok *t)
{
	return t->n_vocab;
}

const char *text_piece(const text_tok *t, int32_t id)
{
	return id >= 0 && (size_t)id < t->n_vocab ? t->piece[id] : NULL;
}

bool text_is_special(const text_tok *t, int32_t id)
{
	return id >= 0 && (size_t)id < t->n_vocab && t->special[id];
}

int32_t text_bos(const text_tok *t)
{
	return t->bos;
}

int32_t text_eos(const text_tok *t)
{
	return t->eos;
}

int32_t text_pad(const text_tok *t)
{
	return t->pad;
}

const char *text_chat_template(const text_tok *t)
{
	return t->chat_template;
}

const char *text_chat_template_named(const text_tok *t, const char *name)
{
	if (!name)
		return NULL;
	if (!strcmp(name, "default"))
		return t->chat_template;
	return !strcmp(name, "tool_use") ? t->tool_template : NULL;
}

const char *text_token_text(const text_tok *t, int32_t id)
{
	if (id < 0 || (size_t)id >= t->n_vocab)
		return "";
	return t->piece[id];
}
