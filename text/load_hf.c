/*
 * load_hf.c: a tokenizer from Hugging Face's tokenizer.json and
 * tokenizer_config.json. Every component the file names is either
 * understood exactly or refused with its name: a tokenizer that loads
 * tokenizes as `tokenizers` does.
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

static const char *jstr(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(json_t *o, const char *k, bool dflt)
{
	json_t *v = json_object_get(o, k);
	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static char *dupstr(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* A pattern given as {"String": s} or {"Regex": r}. */
static int pattern_of(json_t *p, const char **s, bool *regex)
{
	const char *v;
	if ((v = jstr(p, "String"))) {
		*s = v;
		*regex = false;
		return 0;
	}
	if ((v = jstr(p, "Regex"))) {
		*s = v;
		*regex = true;
		return 0;
	}
	return -1;
}

static int add_norm(text_tok *t, json_t *n, char *err, size_t errlen)
{
	int rc = 0;
	if (json_is_null(n) || !n)
		return 0;
	const char *type = jstr(n, "type");
	if (!type)
		return text_errf(err, errlen, BATON_EINVAL, "normalizer without a type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(n, "normalizers"), *x;
		size_t i;
		json_array_foreach(list, i, x) if ((rc = add_norm(t, x, err, errlen))) return rc;
		return 0;
	}
	struct norm_step st = {0};
	if (!strcmp(type, "NFC"))
		st.kind = N_NFC;
	else if (!strcmp(type, "NFD"))
		st.kind = N_NFD;
	else if (!strcmp(type, "NFKC"))
		st.kind = N_NFKC;
	else if (!strcmp(type, "NFKD"))
		st.kind = N_NFKD;
	else if (!strcmp(type, "Prepend")) {
		st.kind = N_PREPEND;
		if (!(st.a = dupstr(jstr(n, "prepend"))))
			return text_errf(err, errlen, BATON_EINVAL, "Prepend normalizer without text");
	} else if (!strcmp(type, "Replace")) {
		const char *pat;
		bool regex;
		if (pattern_of(json_object_get(n, "pattern"), &pat, &regex) || !jstr(n, "content"))
			return text_errf(err, errlen, BATON_EINVAL, "Replace normalizer without pattern/content");
		if (regex || !*pat)
			return text_errf(err, errlen, BATON_EUNSUPPORTED,
			                 "Replace normalizer with a regex pattern is not supported");
		st.kind = N_REPLACE;
		st.a = strdup(pat);
		st.b = strdup(jstr(n, "content"));
	} else
		return text_errf(err, errlen, BATON_EUNSUPPORTED, "normalizer %s is not supported", type);
	struct norm_step *ns = realloc(t->norm, (t->n_norm + 1) * sizeof(*ns));
	if (!ns) {
		free(st.a);
		free(st.b);
		return BATON_ENOMEM;
	}
	t->norm = ns;
	t->norm[t->n_norm++] = st;
	return rc;
}

static int prepend_scheme_of(json_t *o, enum prepend_scheme *ps)
{
	const char *s = jstr(o, "prepend_scheme");
	if (s) {
		if (!strcmp(s, "always"))
			*ps = PS_ALWAYS;
		else if (!strcmp(s, "first"))
			*ps = PS_FIRST;
		else if (!strcmp(s, "never"))
			*ps = PS_NEVER;
		else
			return -1;
		return 0;
	}
	/* tokenizers before 0.14: add_prefix_space */
	*ps = jbool(o, "add_prefix_space", true) ? PS_ALWAYS : PS_NEVER;
	return 0;
}

static int push_pre(text_tok *t, struct pre_step *st)
{
	struct pre_step *p = realloc(t->pre, (t->n_pre + 1) * sizeof(*p));
	if (!p)
		return BATON_ENOMEM;
	t->pre = p;
	t->pre[t->n_pre++] = *st;
	return 0;
}

static int add_pre(text_tok *t, json_t *n, char *err, size_t errlen)
{
	int rc;
	if (!n || json_is_null(n))
		return 0;
	const char *type = jstr(n, "type");
	if (!type)
		return text_errf(err, errlen, BATON_EINVAL, "pre_tokenizer without a type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(n, "pretokenizers"), *x;
		size_t i;
		json_array_foreach(list, i, x) if ((rc = add_pre(t, x, err, errlen))) return rc;
		return 0;
	}
	struct pre_step st = {0};
	if (!strcmp(type, "Split")) {
		const char *pat, *beh = jstr(n, "behavior");
		bool regex;
		if (pattern_of(json_object_get(n, "pattern"), &pat, &regex))
			return text_errf(err, errlen, BATON_EINVAL, "Split without a pattern");
		if (!beh || strcmp(beh, "Isolated") || jbool(n, "invert", false))
			return text_errf(err, errlen, BATON_EUNSUPPORTED,
			                 "Split pre-tokenizer behavior %s%s is not supported (Isolated only)",
			                 beh ? beh : "(none)", jbool(n, "invert", false) ? " inverted" : "");
		st.kind = P_SPLIT;
		if (regex) {
			if ((rc = tx_tok_compile_regex(&st.re, pat, err, errlen)))
				return rc;
		} else {
			int ec;
			PCRE2_SIZE off;
			st.re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED,
			                      PCRE2_UTF | PCRE2_LITERAL, &ec, &off, NULL);
			if (!st.re)
				return text_errf(err, errlen, BATON_EINVAL, "Split pattern %s", pat);
		}
	} else if (!strcmp(type, "ByteLevel")) {
		st.kind = P_BYTELEVEL;
		st.add_prefix_space = jbool(n, "add_prefix_space", true);
		if (jbool(n, "use_regex", true) && (rc = tx_tok_compile_regex(&st.re, TEXT_RE_GPT2, err, errlen)))
			return rc;
		t->byte_level = true;
	} else if (!strcmp(type, "Metaspace")) {
		st.kind = P_METASPACE;
		const char *r = jstr(n, "replacement");
		if (!r || strlen(r) >= sizeof(st.repl) || prepend_scheme_of(n, &st.ps))
			return text_errf(err, errlen, BATON_EINVAL, "Metaspace pre-tokenizer: bad replacement or prepend_scheme");
		strcpy(st.repl, r);
		st.split = jbool(n, "split", true);
	} else if (!strcmp(type, "Digits")) {
		st.kind = P_DIGITS;
		st.individual = jbool(n, "individual_digits", false);
	} else
		return text_errf(err, errlen, BATON_EUNSUPPORTED, "pre_tokenizer %s is not supported", type);
	if ((rc = push_pre(t, &st))) {
		pcre2_code_free(st.re);
		return rc;
	}
	return 0;
}

static int add_dec(text_tok *t, json_t *n, char *err, size_t errlen)
{
	int rc;
	const char *type = jstr(n, "type");
	if (!type)
		return text_errf(err, errlen, BATON_EINVAL, "decoder without a type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(n, "decoders"), *x;
		size_t i;
		json_array_foreach(list, i, x) if ((rc = add_dec(t, x, err, errlen))) return rc;
		return 0;
	}
	struct dec_step st = {0};
	if (!strcmp(type, "ByteLevel"))
		st.kind = D_BYTELEVEL;
	else if (!strcmp(type, "ByteFallback"))
		st.kind = D_BYTEFALLBACK;
	else if (!strcmp(type, "Fuse"))
		st.kind = D_FUSE;
	else if (!strcmp(type, "Replace")) {
		const char *pat;
		bool regex;
		if (pattern_of(json_object_get(n, "pattern"), &pat, &regex) || !jstr(n, "content"))
			return text_errf(err, errlen, BATON_EINVAL, "Replace decoder without pattern/content");
		if (regex || !*pat)
			return text_errf(err, errlen, BATON_EUNSUPPORTED, "Replace decoder with a regex is not supported");
		st.kind = D_REPLACE;
		st.a = strdup(pat);
		st.b = strdup(jstr(n, "content"));
	} else if (!strcmp(type, "Strip")) {
		const char *c = jstr(n, "content");
		json_t *s0 = json_object_get(n, "start"), *s1 = json_object_get(n, "stop");
		int64_t x0, x1;
		if (!c || tx_utf8_len((const unsigned char *)c, strlen(c)) != strlen(c) ||
		    baton_json_whole(s0, 0, INT_MAX, &x0) || baton_json_whole(s1, 0, INT_MAX, &x1))
			return text_errf(err, errlen, BATON_EINVAL, "Strip decoder: bad content/start/stop");
		st.kind = D_STRIP;
		st.a = strdup(c);
		st.start = (int)x0;
		st.stop = (int)x1;
	} else if (!strcmp(type, "Metaspace")) {
		st.kind = D_METASPACE;
		const char *r = jstr(n, "replacement");
		if (!r || strlen(r) >= sizeof(st.repl) || prepend_scheme_of(n, &st.ps))
			return text_errf(err, errlen, BATON_EINVAL, "Metaspace decoder: bad replacement");
		strcpy(st.repl, r);
	} else
		return text_errf(err, errlen, BATON_EUNSUPPORTED, "decoder %s is not supported", type);
	struct dec_step *d = realloc(t->dec, (t->n_dec + 1) * sizeof(*d));
	if (!d) {
		free(st.a);
		free(st.b);
		return BATON_ENOMEM;
	}
	t->dec = d;
	t->dec[t->n_dec++] = st;
	return 0;
}

static int32_t id_of(const text_tok *t, const char *s)
{
	for (size_t i = 0; i < t->n_added; i++)
		if (!strcmp(t->added[i].s, s))
			return t->added[i].id;
	return tx_smap_get(&t->vocab, s, strlen(s));
}

/* TemplateProcessing's "single": special tokens before $A are a prefix,
 * after it a suffix. */
static int add_post(text_tok *t, json_t *n, bool *templ, char *err, size_t errlen)
{
	int rc;
	if (!n || json_is_null(n))
		return 0;
	const char *type = jstr(n, "type");
	if (!type)
		return text_errf(err, errlen, BATON_EINVAL, "post_processor without a type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = json_object_get(n, "processors"), *x;
		size_t i;
		json_array_foreach(list, i, x) if ((rc = add_post(t, x, templ, err, errlen))) return rc;
		return 0;
	}
	if (!strcmp(type, "ByteLevel"))
		return 0; /* offsets only */
	if (strcmp(type, "TemplateProcessing"))
		return text_errf(err, errlen, BATON_EUNSUPPORTED, "post_processor %s is not supported", type);
	*templ = true;
	json_t *single = json_object_get(n, "single"), *specials = json_object_get(n, "special_tokens");
	json_t *x;
	size_t i;
	bool after = false;
	json_array_foreach(single, i, x) {
		json_t *sp = json_object_get(x, "SpecialToken");
		if (json_object_get(x, "Sequence")) {
			after = true;
			continue;
		}
		const char *name = jstr(sp, "id");
		json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids"), *y;
		if (!name || !json_is_array(ids))
			return text_errf(err, errlen, BATON_EINVAL, "TemplateProcessing: special token %s unknown",
			                 name ? name : "(none)");
		size_t j;
		json_array_foreach(ids, j, y) {
			int64_t id;
			if (baton_json_whole(y, 0, INT32_MAX, &id) || (size_t)id >= t->n_vocab)
				return text_errf(err, errlen, BATON_EINVAL, "TemplateProcessing: bad id for %s", name);
			int32_t *arr = after ? t->post_suffix : t->post_prefix;
			size_t *cnt = after ? &t->n_suffix : &t->n_prefix;
			if (*cnt >= 4)
				return text_errf(err, errlen, BATON_EUNSUPPORTED, "TemplateProcessing: too many special tokens");
			arr[(*cnt)++] = (int32_t)id;
		}
	}
	return 0;
}

/* "<s>" or {"content": "<s>", ...} in tokenizer_config.json. */
static const char *config_token(json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	if (json_is_string(v))
		return json_string_value(v);
	if (json_is_object(v))
		return jstr(v, "content");
	return NULL;
}

int text_tok_load_hf(text_tok **out, const char *js, size_t len, const char *config,
                     size_t config_len, char *err, size_t errlen)
{
	int rc = 0;
	json_error_t je;
	json_t *root = NULL, *cfg = NULL;
	text_tok *t = calloc(1, sizeof(*t));
	*out = NULL;
	if (!t)
		return BATON_ENOMEM;
	t->bos = t->eos = t->pad = t->unk = -1;
	/* Both files by the reader policy of base.h (numbers as doubles, ids
	 * whole numbers): transformers writes model_max_length
	 * 1000000000000000019884624838656 when none is set (Mixtral's and
	 * OLMoE's folders), past any integer jansson reads as one. */
	root = baton_json_load(js, len, JSON_REJECT_DUPLICATES, &je);
	if (!root || !json_is_object(root))
		FAIL(BATON_EINVAL, "tokenizer.json: %s (line %d)", root ? "not an object" : je.text, je.line);
	if (config) {
		cfg = baton_json_load(config, config_len, 0, &je);
		if (!cfg || !json_is_object(cfg))
			FAIL(BATON_EINVAL, "tokenizer_config.json: %s (line %d)", cfg ? "not an object" : je.text,
			     je.line);
	}
	json_t *model = json_object_get(root, "model");
	const char *mtype = jstr(model, "type");
	if (!mtype && json_object_get(model, "merges"))
		mtype = "BPE"; /* old files leave the type out */
	if (!mtype || strcmp(mtype, "BPE"))
		FAIL(BATON_EUNSUPPORTED, "tokenizer model %s is not supported (BPE only)", mtype ? mtype : "(none)");
	json_t *dropout = json_object_get(model, "dropout");
	if (dropout && !json_is_null(dropout) && json_number_value(dropout) != 0)
		FAIL(BATON_EUNSUPPORTED, "BPE dropout is not supported");
	if ((jstr(model, "continuing_subword_prefix") && *jstr(model, "continuing_subword_prefix")) ||
	    (jstr(model, "end_of_word_suffix") && *jstr(model, "end_of_word_suffix")))
		FAIL(BATON_EUNSUPPORTED, "BPE continuing_subword_prefix/end_of_word_suffix are not supported");
	json_t *vocab = json_object_get(model, "vocab"), *added = json_object_get(root, "added_tokens");
	if (!json_is_object(vocab))
		FAIL(BATON_EINVAL, "tokenizer.json: model.vocab is not an object");
	size_t n = 0;
	const char *k;
	json_t *v;
	int64_t id;
	json_object_foreach(vocab, k, v) {
		if (baton_json_whole(v, 0, (1 << 24) - 1, &id))
			FAIL(BATON_EINVAL, "tokenizer.json: vocab entry %s has a bad id", k);
		if ((size_t)id + 1 > n)
			n = (size_t)id + 1;
	}
	size_t i;
	json_array_foreach(added, i, v) {
		if (baton_json_whole(json_object_get(v, "id"), 0, (1 << 24) - 1, &id) || !jstr(v, "content"))
			FAIL(BATON_EINVAL, "tokenizer.json: added token %zu is malformed", i);
		if ((size_t)id + 1 > n)
			n = (size_t)id + 1;
	}
	/* Ids are dense in real vocabularies; a few holes are allowed, a file
	 * that names id 16,000,000 for 3 tokens is refused, not allocated. */
	if (n > 2 * (json_object_size(vocab) + json_array_size(added)) + 1024)
		FAIL(BATON_EINVAL, "tokenizer.json: ids up to %zu for %zu tokens", n - 1,
		     json_object_size(vocab) + json_array_size(added));
	if ((rc = tx_tok_alloc_vocab(t, n)))
		goto out;
	json_object_foreach(vocab, k, v) {
		baton_json_whole(v, 0, (1 << 24) - 1, &id); /* checked above */
		if ((rc = tx_tok_set_piece(t, (int32_t)id, k, strlen(k))))
			goto out;
	}
	json_array_foreach(added, i, v) {
		const char *c = jstr(v, "content");
		baton_json_whole(json_object_get(v, "id"), 0, (1 << 24) - 1, &id); /* checked above */
		bool special = jbool(v, "special", false);
		t->type[id] = special ? TT_CONTROL : TT_USER;
		if ((rc = tx_tok_add_added(t, c, strlen(c), (int32_t)id, special, jbool(v, "normalized", !special),
		                        jbool(v, "lstrip", false), jbool(v, "rstrip", false),
		                        jbool(v, "single_word", false))))
			goto out;
	}
	t->model = M_BPE;
	t->byte_fallback = jbool(model, "byte_fallback", false);
	t->fuse_unk = jbool(model, "fuse_unk", false);
	t->ignore_merges = jbool(model, "ignore_merges", false);
	if ((rc = tx_tok_finish(t, err, errlen)))
		goto out;
	/* Added tokens outside the model's vocabulary get their text as the
	 * piece, but stay out of the model's map: BPE never produces them. */
	for (i = 0; i < t->n_added; i++)
		if (!t->piece_len[t->added[i].id] &&
		    (rc = tx_tok_set_piece(t, t->added[i].id, t->added[i].s, t->added[i].n)))
			goto out;
	const char *unk = jstr(model, "unk_token");
	if (unk && (t->unk = tx_smap_get(&t->vocab, unk, strlen(unk))) < 0)
		FAIL(BATON_EINVAL, "tokenizer.json: unk_token %s is not in the vocabulary", unk);

	json_t *merges = json_object_get(model, "merges");
	if ((rc = tx_pmap_init(&t->merges, json_array_size(merges))))
		goto out;
	json_array_foreach(merges, i, v) {
		const char *a, *b;
		size_t an, bn;
		char *tmp = NULL;
		if (json_is_string(v)) { /* "a b" */
			const char *s = json_string_value(v), *sp = strchr(s, ' ');
			if (!sp || strchr(sp + 1, ' '))
				FAIL(BATON_EINVAL, "tokenizer.json: merge %zu (%s) is not two pieces", i, s);
			a = s;
			an = (size_t)(sp - s);
			b = sp + 1;
			bn = strlen(b);
		} else if (json_is_array(v) && json_array_size(v) == 2 &&
		           json_is_string(json_array_get(v, 0)) && json_is_string(json_array_get(v, 1))) {
			a = json_string_value(json_array_get(v, 0));
			b = json_string_value(json_array_get(v, 1));
			an = strlen(a);
			bn = strlen(b);
		} else
			FAIL(BATON_EINVAL, "tokenizer.json: merge %zu is malformed", i);
		int32_t ia = tx_smap_get(&t->vocab, a, an), ib = tx_smap_get(&t->vocab, b, bn);
		if (!(tmp = malloc(an + bn + 1)))
			FAIL(BATON_ENOMEM, "out of memory");
		memcpy(tmp, a, an);
		memcpy(tmp + an, b, bn);
		int32_t ic = tx_smap_get(&t->vocab, tmp, an + bn);
		free(tmp);
		if (ia < 0 || ib < 0 || ic < 0)
			FAIL(BATON_EINVAL, "tokenizer.json: merge %zu uses a piece outside the vocabulary", i);
		if ((rc = tx_pmap_put(&t->merges, ia, ib, (int32_t)i, ic)))
			goto out;
	}

	if ((rc = add_norm(t, json_object_get(root, "normalizer"), err, errlen)))
		goto out;
	if ((rc = add_pre(t, json_object_get(root, "pre_tokenizer"), err, errlen)))
		goto out;
	json_t *dec = json_object_get(root, "decoder");
	if (!dec || json_is_null(dec))
		t->no_decoder = true;
	else if ((rc = add_dec(t, dec, err, errlen)))
		goto out;
	bool templ = false;
	if ((rc = add_post(t, json_object_get(root, "post_processor"), &templ, err, errlen)))
		goto out;

	if (cfg) {
		const char *s;
		if ((s = config_token(cfg, "bos_token")))
			t->bos = id_of(t, s);
		if ((s = config_token(cfg, "eos_token")))
			t->eos = id_of(t, s);
		if ((s = config_token(cfg, "pad_token")))
			t->pad = id_of(t, s);
		t->cleanup = jbool(cfg, "clean_up_tokenization_spaces", false);
		json_t *ct = json_object_get(cfg, "chat_template");
		if (json_is_string(ct))
			t->chat_template = strdup(json_string_value(ct));
		else if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
			json_array_foreach(ct, i, v) {
				const char *nm = jstr(v, "name"), *tp = jstr(v, "template");
				char **dst = !nm || !tp ? NULL : !strcmp(nm, "default") ? &t->chat_template :
				    !strcmp(nm, "tool_use") ? &t->tool_template : NULL;
				if (dst && !*dst && !(*dst = strdup(tp)))
					FAIL(BATON_ENOMEM, "out of memory");
			}
		}
		/* Without a template post-processor, add_bos_token/add_eos_token
		 * say what to add (transformers' slow-tokenizer convention). */
		if (!templ) {
			if (jbool(cfg, "add_bos_token", false) && t->bos >= 0)
				t->post_prefix[t->n_prefix++] = t->bos;
			if (jbool(cfg, "add_eos_token", false) && t->eos >= 0)
				t->post_suffix[t->n_suffix++] = t->eos;
		}
	}
	if (t->bos < 0 && t->n_prefix)
		t->bos = t->post_prefix[0];
	*out = t;
	t = NULL;
out:
	json_decref(root);
	json_decref(cfg);
	text_tok_free(t);
	return rc;
}
