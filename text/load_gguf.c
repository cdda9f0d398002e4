/*
 * load_gguf.c: a tokenizer from a GGUF file's tokenizer.ggml.* keys, given
 * as a JSON object keyed by the GGUF key names (the arena stores them so).
 *
 * llama.cpp's conventions (src/llama-vocab.cpp): tokenizer.ggml.model
 * "gpt2" is byte-level BPE ranked by tokenizer.ggml.merges ("a b"), with
 * the split regex that tokenizer.ggml.pre names; "llama" is SentencePiece
 * BPE by tokenizer.ggml.scores with <0xXX> byte tokens and ▁ for spaces.
 * token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
 * 6 byte. Control, unknown and user-defined tokens are matched in the
 * text before pre-tokenization (llama.cpp's special-token cache); control
 * and unknown ones are special (skipped when decoding with
 * TEXT_SKIP_SPECIAL, as Hugging Face skips its special added tokens).
 *
 * Where llama.cpp departs from the Hugging Face tokenizer the GGUF was
 * converted from, this follows Hugging Face: the NFC normaliser of the
 * Qwen2 and OLMo/GPT-NeoX tokenizers is applied (llama.cpp skips it).
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/text_int.h"

#define FAIL(code, ...)                                           \
	do {                                                      \
		rc = text_errf(err, errlen, (code), __VA_ARGS__); \
		goto out;                                         \
	} while (0)

struct pre_kind_row {
	const char *name;
	const char *regex; /* Split before ByteLevel; NULL: ByteLevel's own GPT-2 regex */
	bool nfc;
};

/* tokenizer.ggml.pre names this loader knows (llama.cpp's names). */
static const struct pre_kind_row PRE_KINDS[] = {
    {"qwen2", TEXT_RE_QWEN2, true},
    {"gpt-2", NULL, false},
    {"olmo", NULL, true},
};

static int32_t id_key(json_t *root, const char *k)
{
	int64_t x;
	return baton_json_whole(json_object_get(root, k), 0, INT32_MAX, &x) == 0 ? (int32_t)x : -1;
}

static int push_norm(text_tok *t, enum norm_kind k, const char *a, const char *b)
{
	struct norm_step *n = realloc(t->norm, (t->n_norm + 1) * sizeof(*n));
	if (!n)
		return BATON_ENOMEM;
	t->norm = n;
	t->norm[t->n_norm] = (struct norm_step){k, a ? strdup(a) : NULL, b ? strdup(b) : NULL};
	t->n_norm++;
	return 0;
}

static int push_dec(text_tok *t, struct dec_step st)
{
	struct dec_step *d = realloc(t->dec, (t->n_dec + 1) * sizeof(*d));
	if (!d)
		return BATON_ENOMEM;
	t->dec = d;
	t->dec[t->n_dec++] = st;
	return 0;
}

static int push_pre(text_tok *t, struct pre_step st)
{
	struct pre_step *p = realloc(t->pre, (t->n_pre + 1) * sizeof(*p));
	if (!p)
		return BATON_ENOMEM;
	t->pre = p;
	t->pre[t->n_pre++] = st;
	return 0;
}

int text_tok_load_gguf(text_tok **out, const char *js, size_t len, char *err, size_t errlen)
{
	int rc = 0;
	json_error_t je;
	text_tok *t = calloc(1, sizeof(*t));
	json_t *root = NULL;
	*out = NULL;
	if (!t)
		return BATON_ENOMEM;
	t->bos = t->eos = t->pad = t->unk = -1;
	root = baton_json_load(js, len, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root))
		FAIL(BATON_EINVAL, "GGUF tokenizer keys: %s (line %d)", root ? "not an object" : je.text, je.line);
	json_t *jm = json_object_get(root, "tokenizer.ggml.model");
	const char *model = json_string_value(jm);
	if (!model)
		FAIL(BATON_EINVAL, "GGUF tokenizer keys: tokenizer.ggml.model is missing");
	bool spm = !strcmp(model, "llama");
	if (!spm && strcmp(model, "gpt2"))
		FAIL(BATON_EUNSUPPORTED, "tokenizer.ggml.model %s is not supported (gpt2 and llama are)", model);
	json_t *tokens = json_object_get(root, "tokenizer.ggml.tokens");
	json_t *types = json_object_get(root, "tokenizer.ggml.token_type");
	json_t *scores = json_object_get(root, "tokenizer.ggml.scores");
	json_t *merges = json_object_get(root, "tokenizer.ggml.merges");
	size_t n = json_array_size(tokens);
	if (!json_is_array(tokens) || n == 0 || n >= (1u << 24))
		FAIL(BATON_EINVAL, "tokenizer.ggml.tokens is missing or empty");
	if (types && (!json_is_array(types) || json_array_size(types) != n))
		FAIL(BATON_EINVAL, "tokenizer.ggml.token_type has %zu entries for %zu tokens",
		     json_array_size(types), n);
	if (spm && (!json_is_array(scores) || json_array_size(scores) != n))
		FAIL(BATON_EINVAL, "tokenizer.ggml.scores must have one score per token for model llama");
	if ((rc = tx_tok_alloc_vocab(t, n)))
		goto out;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(tokens, i);
		if (!json_is_string(v))
			FAIL(BATON_EINVAL, "tokenizer.ggml.tokens[%zu] is not a string", i);
		if ((rc = tx_tok_set_piece(t, (int32_t)i, json_string_value(v), json_string_length(v))))
			goto out;
		int64_t ty = TT_NORMAL;
		if (types && baton_json_whole(json_array_get(types, i), TT_NORMAL, TT_BYTE, &ty) != 0)
			FAIL(BATON_EINVAL, "tokenizer.ggml.token_type[%zu] is not a token type (%d..%d)", i,
			     TT_NORMAL, TT_BYTE);
		t->type[i] = (uint8_t)ty;
		if (scores) {
			json_t *sc = json_array_get(scores, i);
			if (!json_is_number(sc))
				FAIL(BATON_EINVAL, "tokenizer.ggml.scores[%zu] is not a number", i);
			t->score[i] = (float)json_number_value(sc);
		}
	}
	for (size_t i = 0; i < n; i++)
		if ((t->type[i] == TT_CONTROL || t->type[i] == TT_USER || t->type[i] == TT_UNKNOWN) &&
		    t->piece_len[i] &&
		    (rc = tx_tok_add_added(t, t->piece[i], t->piece_len[i], (int32_t)i, t->type[i] != TT_USER,
		                        false, false, false, false)))
			goto out;
	if ((rc = tx_tok_finish(t, err, errlen)))
		goto out;
	t->model = spm ? M_SPM : M_BPE;
	t->unk = id_key(root, "tokenizer.ggml.unknown_token_id");
	t->bos = id_key(root, "tokenizer.ggml.bos_token_id");
	t->eos = id_key(root, "tokenizer.ggml.eos_token_id");
	t->pad = id_key(root, "tokenizer.ggml.padding_token_id");
	if ((t->unk >= (int32_t)n) || t->bos >= (int32_t)n || t->eos >= (int32_t)n || t->pad >= (int32_t)n)
		FAIL(BATON_EINVAL, "a special token id is outside the %zu tokens", n);
	if (t->unk < 0)
		for (size_t i = 0; i < n && t->unk < 0; i++)
			if (t->type[i] == TT_UNKNOWN)
				t->unk = (int32_t)i;
	json_t *ab = json_object_get(root, "tokenizer.ggml.add_bos_token");
	json_t *ae = json_object_get(root, "tokenizer.ggml.add_eos_token");
	bool add_bos = ab ? json_is_true(ab) : spm; /* llama.cpp's defaults */
	bool add_eos = ae ? json_is_true(ae) : false;
	if (add_bos && t->bos >= 0)
		t->post_prefix[t->n_prefix++] = t->bos;
	if (add_eos && t->eos >= 0)
		t->post_suffix[t->n_suffix++] = t->eos;
	/* llama.cpp writes a list of named templates as
	 * tokenizer.chat_template.<name> beside the default */
	json_t *tu = json_object_get(root, "tokenizer.chat_template.tool_use");
	if (json_is_string(tu) && !(t->tool_template = strdup(json_string_value(tu))))
		FAIL(BATON_ENOMEM, "out of memory");
	json_t *ct = json_object_get(root, "tokenizer.chat_template");
	if (json_is_string(ct) && !(t->chat_template = strdup(json_string_value(ct))))
		FAIL(BATON_ENOMEM, "out of memory");

	if (spm) {
		/* SentencePiece: " " is "▁", a "▁" in front of each stretch of text
		 * (add_space_prefix, on unless the file says otherwise); back:
		 * ▁ to space, bytes joined, the first space dropped. */
		json_t *asp = json_object_get(root, "tokenizer.ggml.add_space_prefix");
		bool space_prefix = asp ? json_is_true(asp) : true;
		t->byte_fallback = true;
		if ((space_prefix && (rc = push_norm(t, N_PREPEND, "\xE2\x96\x81", NULL))) ||
		    (rc = push_norm(t, N_REPLACE, " ", "\xE2\x96\x81")) ||
		    (rc = push_dec(t, (struct dec_step){.kind = D_REPLACE, .a = strdup("\xE2\x96\x81"),
		                                        .b = strdup(" ")})) ||
		    (rc = push_dec(t, (struct dec_step){.kind = D_BYTEFALLBACK})) ||
		    (rc = push_dec(t, (struct dec_step){.kind = D_FUSE})))
			goto out;
		if (space_prefix &&
		    (rc = push_dec(t, (struct dec_step){.kind = D_STRIP, .a = strdup(" "), .start = 1})))
			goto out;
	} else {
		const char *pre = json_string_value(json_object_get(root, "tokenizer.ggml.pre"));
		const struct pre_kind_row *row = NULL;
		for (size_t i = 0; pre && i < sizeof(PRE_KINDS) / sizeof(PRE_KINDS[0]); i++)
			if (!strcmp(pre, PRE_KINDS[i].name))
				row = &PRE_KINDS[i];
		if (!row)
			FAIL(BATON_EUNSUPPORTED, "tokenizer.ggml.pre %s is not supported (qwen2, gpt-2, olmo are)",
			     pre ? pre : "(missing)");
		if (!json_is_array(merges))
			FAIL(BATON_EINVAL, "tokenizer.ggml.merges is missing for model gpt2");
		if ((rc = tx_pmap_init(&t->merges, json_array_size(merges))))
			goto out;
		size_t i;
		json_t *v;
		struct tbuf cat = {0};
		json_array_foreach(merges, i, v) {
			const char *s = json_string_value(v), *sp = s ? strchr(s, ' ') : NULL;
			if (!sp || sp == s || !sp[1]) {
				tx_tbuf_free(&cat);
				FAIL(BATON_EINVAL, "tokenizer.ggml.merges[%zu] is not \"left right\"", i);
			}
			int32_t a = tx_smap_get(&t->vocab, s, (size_t)(sp - s));
			int32_t b = tx_smap_get(&t->vocab, sp + 1, strlen(sp + 1));
			cat.n = 0;
			if (tx_tbuf_put(&cat, s, (size_t)(sp - s)) || tx_tbuf_put(&cat, sp + 1, strlen(sp + 1))) {
				tx_tbuf_free(&cat);
				FAIL(BATON_ENOMEM, "out of memory");
			}
			int32_t c = tx_smap_get(&t->vocab, cat.p, cat.n);
			if (a < 0 || b < 0 || c < 0) {
				tx_tbuf_free(&cat);
				FAIL(BATON_EINVAL, "tokenizer.ggml.merges[%zu] uses a token not in the vocabulary", i);
			}
			if ((rc = tx_pmap_put(&t->merges, a, b, (int32_t)i, c))) {
				tx_tbuf_free(&cat);
				goto out;
			}
		}
		tx_tbuf_free(&cat);
		if (row->nfc && (rc = push_norm(t, N_NFC, NULL, NULL)))
			goto out;
		struct pre_step st = {.kind = P_SPLIT};
		if (row->regex) {
			if ((rc = tx_tok_compile_regex(&st.re, row->regex, err, errlen)) || (rc = push_pre(t, st)))
				goto out;
			st = (struct pre_step){.kind = P_BYTELEVEL};
		} else {
			st = (struct pre_step){.kind = P_BYTELEVEL};
			if ((rc = tx_tok_compile_regex(&st.re, TEXT_RE_GPT2, err, errlen)))
				goto out;
		}
		if ((rc = push_pre(t, st))) {
			pcre2_code_free(st.re);
			goto out;
		}
		t->byte_level = true;
		if ((rc = push_dec(t, (struct dec_step){.kind = D_BYTELEVEL})))
			goto out;
	}
	*out = t;
	t = NULL;
out:
	json_decref(root);
	text_tok_free(t);
	return rc;
}
