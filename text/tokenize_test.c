/*
 * tokenize_test.c: the text component against Hugging Face's references.
 *
 * text/fixtures/<family>/ holds a tokenizer trained with `tokenizers`
 * (tokenizer.json, tokenizer_config.json), the same tokenizer's GGUF keys
 * (gguf.json, by hf_to_gguf_json.py), 2,000 strings (strings.jsonl) and,
 * line for line, what `tokenizers` made of them (cases.jsonl: ids without
 * and with special tokens, decoded text with and without
 * skip_special_tokens); make_fixtures.py made them. Every id and every
 * byte must match, through both loaders, and the streaming decoder must
 * give the same bytes as the whole decode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "arena/arena.h"
#include "proto/proto.h"
#include "tests/t.h"
#include "text/text.h"

static const char *fixtures(void)
{
	const char *d = getenv("TEXT_FIXTURES");
	return d ? d : "text/fixtures";
}

static text_tok *load(const char *family, const char *file)
{
	char path[512], err[256] = "";
	snprintf(path, sizeof(path), "%s/%s/%s", fixtures(), family, file);
	text_tok *t = NULL;
	int rc = text_tok_load_file(&t, path, err, sizeof(err));
	T_ASSERT_MSG(rc == 0, "%s: %s (%s)", path, err, baton_strerror(rc));
	return t;
}

static json_t *read_jsonl(const char *family, const char *file)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s/%s", fixtures(), family, file);
	FILE *f = fopen(path, "r");
	T_ASSERT_MSG(f, "%s: cannot open", path);
	json_t *arr = json_array();
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	while ((n = getline(&line, &cap, f)) > 0) {
		json_error_t je;
		json_t *v = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
		T_ASSERT_MSG(v, "%s: %s", path, je.text);
		json_array_append_new(arr, v);
	}
	free(line);
	fclose(f);
	return arr;
}

static bool ids_equal(json_t *want, const int32_t *got, size_t n)
{
	if (json_array_size(want) != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (json_integer_value(json_array_get(want, i)) != got[i])
			return false;
	return true;
}

static void print_ids(const char *what, const int32_t *ids, size_t n)
{
	fprintf(stderr, "    %s:", what);
	for (size_t i = 0; i < n && i < 40; i++)
		fprintf(stderr, " %d", ids[i]);
	fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static int32_t *ids_of(json_t *a, size_t *n)
{
	*n = json_array_size(a);
	int32_t *p = malloc((*n + 1) * sizeof(*p));
	for (size_t i = 0; i < *n; i++)
		p[i] = (int32_t)json_integer_value(json_array_get(a, i));
	return p;
}

/* Whole UTF-8 characters only (the stream's promise). */
static bool valid_utf8(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	for (size_t i = 0; i < n;) {
		unsigned c = p[i];
		size_t l = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3
		         : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
		if (!l || i + l > n)
			return false;
		for (size_t k = 1; k < l; k++)
			if ((p[i + k] & 0xC0) != 0x80)
				return false;
		i += l;
	}
	return true;
}

static bool stream_equal(const text_tok *t, const int32_t *ids, size_t n, unsigned flags,
                         const char *want, size_t wn)
{
	text_stream *s;
	T_OK(text_stream_open(&s, t, flags));
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (size_t i = 0; i < n; i++) {
		size_t before = len;
		T_OK(text_stream_push(s, ids[i], &buf, &len, &cap));
		/* what came out is always whole characters */
		T_ASSERT(valid_utf8(buf + before, len - before));
	}
	T_OK(text_stream_finish(s, &buf, &len, &cap));
	text_stream_close(s);
	bool ok = len == wn && (wn == 0 || memcmp(buf, want, wn) == 0);
	free(buf);
	return ok;
}

/* Checks one family through one loader. */
static void check_family(const char *family, const char *file)
{
	text_tok *t = load(family, file);
	json_t *strings = read_jsonl(family, "strings.jsonl");
	json_t *cases = read_jsonl(family, "cases.jsonl");
	T_EQ_INT(json_array_size(strings), json_array_size(cases));
	T_ASSERT(json_array_size(strings) >= 2000);
	size_t bad = 0, checks = 0;
	char err[256];
	for (size_t i = 0; i < json_array_size(strings); i++) {
		json_t *sj = json_array_get(strings, i), *c = json_array_get(cases, i);
		const char *s = json_string_value(sj);
		size_t sn = json_string_length(sj);
		json_t *want_plain = json_object_get(c, "ids");
		json_t *want_spec = json_object_get(c, "ids_special");
		if (!want_spec)
			want_spec = want_plain;
		json_t *dec = json_object_get(c, "dec"), *dec_skip = json_object_get(c, "dec_skip");
		json_t *dec_plain = json_object_get(c, "dec_plain");
		if (!dec_skip)
			dec_skip = dec;
		if (!dec_plain)
			dec_plain = sj;
		int32_t *ids;
		size_t n;

		T_OK(text_encode(t, s, sn, 0, &ids, &n, err, sizeof(err)));
		checks++;
		if (!ids_equal(want_plain, ids, n)) {
			if (bad++ < 5) {
				fprintf(stderr, "  %s %s: string %zu \"%s\": ids differ\n", family, file, i, s);
				print_ids("got ", ids, n);
				size_t wn;
				int32_t *w = ids_of(want_plain, &wn);
				print_ids("want", w, wn);
				free(w);
			}
		}
		free(ids);
		T_OK(text_encode(t, s, sn, TEXT_ADD_SPECIAL, &ids, &n, err, sizeof(err)));
		checks++;
		if (!ids_equal(want_spec, ids, n) && bad++ < 5)
			fprintf(stderr, "  %s %s: string %zu: ids with special tokens differ\n", family, file, i);
		free(ids);

		/* decoding the reference ids */
		size_t wn;
		int32_t *w = ids_of(want_spec, &wn);
		struct {
			unsigned flags;
			json_t *want;
		} d[2] = {{0, dec}, {TEXT_SKIP_SPECIAL, dec_skip}};
		for (int k = 0; k < 2; k++) {
			char *out;
			size_t on;
			T_OK(text_decode(t, w, wn, d[k].flags, &out, &on, err, sizeof(err)));
			checks++;
			const char *ws = json_string_value(d[k].want);
			size_t wl = json_string_length(d[k].want);
			if ((on != wl || memcmp(out, ws, wl)) && bad++ < 5)
				fprintf(stderr, "  %s %s: string %zu: decode(flags %u) = \"%s\", want \"%s\"\n",
				        family, file, i, d[k].flags, out, ws);
			free(out);
			checks++;
			if (!stream_equal(t, w, wn, d[k].flags, ws, wl) && bad++ < 5)
				fprintf(stderr, "  %s %s: string %zu: streamed decode (flags %u) differs\n", family,
				        file, i, d[k].flags);
		}
		free(w);
		w = ids_of(want_plain, &wn);
		char *out;
		size_t on;
		T_OK(text_decode(t, w, wn, 0, &out, &on, err, sizeof(err)));
		checks++;
		if ((on != json_string_length(dec_plain) || memcmp(out, json_string_value(dec_plain), on)) &&
		    bad++ < 5)
			fprintf(stderr, "  %s %s: string %zu: decode of the plain ids differs\n", family, file, i);
		free(out);
		free(w);
	}
	printf("  %s via %s: %zu strings, %zu checks, %zu mismatches\n", family, file,
	       json_array_size(strings), checks, bad);
	T_ASSERT_MSG(bad == 0, "%zu mismatches", bad);
	json_decref(strings);
	json_decref(cases);
	text_tok_free(t);
}

static void t_qwen3_hf(void) { check_family("qwen3", "tokenizer.json"); }
static void t_qwen3_gguf(void) { check_family("qwen3", "gguf.json"); }
static void t_qwen2_hf(void) { check_family("qwen2", "tokenizer.json"); }
static void t_qwen2_gguf(void) { check_family("qwen2", "gguf.json"); }
static void t_gpt2_hf(void) { check_family("gpt2", "tokenizer.json"); }
static void t_gpt2_gguf(void) { check_family("gpt2", "gguf.json"); }
static void t_olmoe_hf(void) { check_family("olmoe", "tokenizer.json"); }
static void t_olmoe_gguf(void) { check_family("olmoe", "gguf.json"); }
static void t_mixtral_hf(void) { check_family("mixtral", "tokenizer.json"); }
static void t_mixtral_gguf(void) { check_family("mixtral", "gguf.json"); }

/* The special-token facts each loader reports agree. */
static void t_specials(void)
{
	const char *fams[] = {"qwen3", "qwen2", "gpt2", "olmoe", "mixtral"};
	for (size_t i = 0; i < 5; i++) {
		text_tok *a = load(fams[i], "tokenizer.json"), *b = load(fams[i], "gguf.json");
		T_EQ_INT(text_vocab_size(a), text_vocab_size(b));
		T_EQ_INT(text_bos(a), text_bos(b));
		T_EQ_INT(text_eos(a), text_eos(b));
		T_EQ_INT(text_pad(a), text_pad(b));
		for (int32_t id = 0; id < (int32_t)text_vocab_size(a); id++) {
			T_EQ_INT(text_is_special(a, id), text_is_special(b, id));
			T_EQ_STR(text_piece(a, id), text_piece(b, id));
		}
		T_ASSERT((text_chat_template(a) == NULL) == (text_chat_template(b) == NULL));
		text_tok_free(a);
		text_tok_free(b);
	}
	text_tok *m = load("mixtral", "tokenizer.json");
	T_EQ_STR(text_token_text(m, text_bos(m)), "<s>");
	T_EQ_STR(text_token_text(m, text_eos(m)), "</s>");
	text_tok_free(m);
}

/* Bad input: a clear error, nothing half-made. */
/* What real tokenizer_config.json files hold is read, not refused: an
 * integer past 64 bits (transformers' unset model_max_length), exponents,
 * null for optional keys, unknown keys. */
static void t_real_config_values(void)
{
	text_tok *t = NULL;
	char err[256];
	const char *tok = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
	                  "\"merges\":[\"a b\"]}}";
	const char *cfg = "{\"model_max_length\": 1000000000000000019884624838656, \"x\": 1e30,"
	                  " \"pad_token\": null, \"unknown_key\": {\"deep\": [1, 2.5, null]},"
	                  " \"clean_up_tokenization_spaces\": false}";
	int rc = text_tok_load_hf(&t, tok, strlen(tok), cfg, strlen(cfg), err, sizeof(err));
	T_ASSERT_MSG(rc == 0, "%s", err);
	text_tok_free(t);

	/* tokenizer.json by the same policy (base.h): ids as integral reals,
	 * an integer past 64 bits under a key the loader does not read, null
	 * where a value is optional; a fractional id is refused. */
	const char *tok2 = "{\"version\":\"1.0\",\"truncation\":{\"max_length\":"
	                   "1000000000000000019884624838656},\"padding\":null,"
	                   "\"added_tokens\":[{\"id\":3.0,\"content\":\"<s>\",\"special\":true}],"
	                   "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"vocab\":{\"a\":0,\"b\":1.0,"
	                   "\"ab\":2e0},\"merges\":[\"a b\"]},\"x\":[18446744073709551616, 1e400]}";
	const char *cfg2 = "{\"bos_token\":{\"content\":\"<s>\",\"lstrip\":false},\"model_max_length\":1e30}";
	rc = text_tok_load_hf(&t, tok2, strlen(tok2), cfg2, strlen(cfg2), err, sizeof(err));
	T_ASSERT_MSG(rc != 0 && strstr(err, "tokenizer.json"), "1e400 overflows a double: %s", err);
	char *tok3 = strdup(tok2);
	memcpy(strstr(tok3, "1e400"), "1e300", 5);
	rc = text_tok_load_hf(&t, tok3, strlen(tok3), cfg2, strlen(cfg2), err, sizeof(err));
	T_ASSERT_MSG(rc == 0, "%s", err);
	T_EQ_INT(text_vocab_size(t), 4);
	T_EQ_INT(text_bos(t), 3);
	T_ASSERT(text_is_special(t, 3) && strcmp(text_piece(t, 2), "ab") == 0);
	text_tok_free(t);
	memcpy(strstr(tok3, "\"b\":1.0"), "\"b\":1.5", 7);
	T_EQ_ERR(text_tok_load_hf(&t, tok3, strlen(tok3), NULL, 0, err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(strstr(err, "vocab entry b"));
	free(tok3);

	/* The JSON the arena makes of GGUF tokenizer keys: a u64 past 2^63
	 * comes as a real (arena/gguf_model.c), ids and token types as reals. */
	const char *gg = "{\"tokenizer.ggml.model\":\"gpt2\",\"tokenizer.ggml.pre\":\"qwen2\","
	                 "\"tokenizer.ggml.tokens\":[\"a\",\"b\",\"ab\",\"<s>\"],"
	                 "\"tokenizer.ggml.token_type\":[1,1.0,1,3.0],\"tokenizer.ggml.merges\":[\"a b\"],"
	                 "\"tokenizer.ggml.bos_token_id\":3.0,\"tokenizer.ggml.x\":1.8446744073709552e19,"
	                 "\"tokenizer.ggml.y\":18446744073709551615}";
	rc = text_tok_load_gguf(&t, gg, strlen(gg), err, sizeof(err));
	T_ASSERT_MSG(rc == 0, "%s", err);
	T_EQ_INT(text_bos(t), 3);
	T_ASSERT(text_is_special(t, 3));
	text_tok_free(t);
}

/* Models that ship several templates: tokenizer_config.json's list of
 * {name, template} (Mixtral-8x22B-Instruct's default and tool_use), a
 * GGUF's tokenizer.chat_template.tool_use, and an HF folder's
 * additional_chat_templates/tool_use.jinja through an arena. */
static void t_named_templates(void)
{
	text_tok *t = NULL;
	char err[512];
	const char *tok = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
	                  "\"merges\":[\"a b\"]}}";
	const char *cfg = "{\"chat_template\":[{\"name\":\"default\",\"template\":\"D{{ 1 }}\"},"
	                  "{\"name\":\"rag\",\"template\":\"R\"},{\"name\":\"tool_use\",\"template\":\"T\"}]}";
	T_OK(text_tok_load_hf(&t, tok, strlen(tok), cfg, strlen(cfg), err, sizeof(err)));
	T_EQ_STR(text_chat_template(t), "D{{ 1 }}");
	T_EQ_STR(text_chat_template_named(t, "default"), "D{{ 1 }}");
	T_EQ_STR(text_chat_template_named(t, "tool_use"), "T");
	T_ASSERT(text_chat_template_named(t, "rag") == NULL && text_chat_template_named(t, NULL) == NULL);
	text_tok_free(t);
	const char *one = "{\"chat_template\":\"X\"}";
	T_OK(text_tok_load_hf(&t, tok, strlen(tok), one, strlen(one), err, sizeof(err)));
	T_EQ_STR(text_chat_template(t), "X");
	T_ASSERT(text_chat_template_named(t, "tool_use") == NULL);
	text_tok_free(t);

	const char *gg = "{\"tokenizer.ggml.model\":\"gpt2\",\"tokenizer.ggml.pre\":\"qwen2\","
	                 "\"tokenizer.ggml.tokens\":[\"a\",\"b\",\"ab\"],\"tokenizer.ggml.merges\":[\"a b\"],"
	                 "\"tokenizer.chat_template\":\"G\",\"tokenizer.chat_template.tool_use\":\"GT\"}";
	T_OK(text_tok_load_gguf(&t, gg, strlen(gg), err, sizeof(err)));
	T_EQ_STR(text_chat_template(t), "G");
	T_EQ_STR(text_chat_template_named(t, "tool_use"), "GT");
	text_tok_free(t);

	char dir[] = "/tmp/baton-named-XXXXXX", cmd[512], path[600];
	T_ASSERT(mkdtemp(dir) != NULL);
	snprintf(cmd, sizeof cmd, "cp -r tests/fixtures/arena/hf/olmoe %s/m && mkdir %s/m/additional_chat_templates && "
	         "printf 'TOOLS{{ tools | length }}' > %s/m/additional_chat_templates/tool_use.jinja",
	         dir, dir, dir);
	T_ASSERT(system(cmd) == 0);
	snprintf(path, sizeof path, "%s/m.arena", dir);
	snprintf(cmd, sizeof cmd, "%s/m", dir);
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SAFETENSORS, .file = cmd };
	int rc = arena_create(path, &src, NULL, NULL, err, sizeof(err));
	T_ASSERT_MSG(rc == 0, "%s", err);
	struct baton_arena *a = NULL;
	T_OK(arena_open(path, &a, err, sizeof(err)));
	T_OK(text_tok_load_arena(&t, a, err, sizeof(err)));
	T_EQ_STR(text_chat_template_named(t, "tool_use"), "TOOLS{{ tools | length }}");
	T_ASSERT(text_chat_template(t) && strstr(text_chat_template(t), "TOOLS") == NULL);
	text_tok_free(t);
	arena_close(a);
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	T_ASSERT(system(cmd) == 0);
}

static void t_refusals(void)
{
	text_tok *t = NULL;
	char err[256];
	const char *bad_model = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}";
	T_EQ_ERR(text_tok_load_hf(&t, bad_model, strlen(bad_model), NULL, 0, err, sizeof(err)),
	         BATON_EUNSUPPORTED);
	T_ASSERT(t == NULL && strstr(err, "WordPiece"));
	const char *bad_pre = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
	                      "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"}}";
	T_EQ_ERR(text_tok_load_hf(&t, bad_pre, strlen(bad_pre), NULL, 0, err, sizeof(err)),
	         BATON_EUNSUPPORTED);
	T_ASSERT(strstr(err, "BertPreTokenizer"));
	const char *bad_merge = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}";
	T_EQ_ERR(text_tok_load_hf(&t, bad_merge, strlen(bad_merge), NULL, 0, err, sizeof(err)),
	         BATON_EINVAL);
	T_EQ_ERR(text_tok_load_hf(&t, "{", 1, NULL, 0, err, sizeof(err)), BATON_EINVAL);
	const char *bad_gguf = "{\"tokenizer.ggml.model\":\"gpt2\",\"tokenizer.ggml.pre\":\"deepseek-llm\","
	                       "\"tokenizer.ggml.tokens\":[\"a\"],\"tokenizer.ggml.merges\":[]}";
	T_EQ_ERR(text_tok_load_gguf(&t, bad_gguf, strlen(bad_gguf), err, sizeof(err)), BATON_EUNSUPPORTED);
	T_ASSERT(strstr(err, "deepseek-llm"));
	const char *bad_type = "{\"tokenizer.ggml.model\":\"bert\",\"tokenizer.ggml.tokens\":[\"a\"]}";
	T_EQ_ERR(text_tok_load_gguf(&t, bad_type, strlen(bad_type), err, sizeof(err)), BATON_EUNSUPPORTED);
	T_ASSERT(t == NULL);

	t = load("qwen3", "tokenizer.json");
	int32_t *ids;
	size_t n;
	T_EQ_ERR(text_encode(t, "a\xff", 2, 0, &ids, &n, err, sizeof(err)), BATON_EINVAL);
	T_ASSERT(ids == NULL && strstr(err, "UTF-8"));
	int32_t out_of_range = (int32_t)text_vocab_size(t);
	char *s;
	size_t sn;
	T_EQ_ERR(text_decode(t, &out_of_range, 1, 0, &s, &sn, err, sizeof(err)), BATON_ERANGE);
	int32_t neg = -1;
	T_EQ_ERR(text_decode(t, &neg, 1, 0, &s, &sn, err, sizeof(err)), BATON_ERANGE);
	text_tok_free(t);
}

/* TEXT_NO_SPECIAL: special tokens in the text are plain text. */
static void t_no_special(void)
{
	text_tok *t = load("qwen3", "tokenizer.json");
	int32_t *a, *b;
	size_t na, nb;
	char err[128];
	const char *s = "<|im_start|>user";
	T_OK(text_encode(t, s, strlen(s), 0, &a, &na, err, sizeof(err)));
	T_OK(text_encode(t, s, strlen(s), TEXT_NO_SPECIAL, &b, &nb, err, sizeof(err)));
	T_ASSERT(na >= 2 && text_is_special(t, a[0]));
	T_ASSERT(nb > na);
	for (size_t i = 0; i < nb; i++)
		T_ASSERT(!text_is_special(t, b[i]));
	char *out;
	size_t on;
	T_OK(text_decode(t, b, nb, 0, &out, &on, err, sizeof(err)));
	T_EQ_STR(out, s);
	free(out);
	free(a);
	free(b);
	text_tok_free(t);
}

/* A character cut across tokens comes out of the stream only when whole. */
static void t_stream_holds_partial(void)
{
	text_tok *t = load("mixtral", "tokenizer.json");
	int32_t *ids;
	size_t n;
	char err[128];
	const char *s = "\xe4\xbd\xa0\xf0\x9f\x98\x80"; /* 你😀, byte fallback */
	T_OK(text_encode(t, s, strlen(s), 0, &ids, &n, err, sizeof(err)));
	text_stream *st;
	T_OK(text_stream_open(&st, t, 0));
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (size_t i = 0; i < n; i++) {
		T_OK(text_stream_push(st, ids[i], &buf, &len, &cap));
		/* nothing but whole characters, never a replacement character */
		T_ASSERT(valid_utf8(buf, len));
		T_ASSERT(len == 0 || memmem(buf, len, "\xEF\xBF\xBD", 3) == NULL);
	}
	T_OK(text_stream_finish(st, &buf, &len, &cap));
	text_stream_close(st);
	T_ASSERT(len >= strlen(s));
	T_ASSERT(strstr(buf, s) != NULL);
	free(buf);
	free(ids);
	/* a skipped special token inside a run of byte tokens does not end
	 * the run (a fuzz finding): <0x62> <unk> <0xA0> is one invalid run */
	int32_t run[] = {101, 0, 163, 1182};
	T_EQ_STR(text_piece(t, 101), "<0x62>");
	T_EQ_STR(text_piece(t, 0), "<unk>");
	char *whole;
	size_t wl;
	T_OK(text_decode(t, run, 4, TEXT_SKIP_SPECIAL, &whole, &wl, err, sizeof(err)));
	T_EQ_STR(whole, "\xEF\xBF\xBD\xEF\xBF\xBD" "3.");
	T_ASSERT(stream_equal(t, run, 4, TEXT_SKIP_SPECIAL, whole, wl));
	free(whole);
	text_tok_free(t);
}

/* A completion continues its prompt: decode(prompt) + the stream of the
 * rest == decode(prompt + rest), split at every token, for every family
 * (the Mixtral regression: "And God said" + "unto" lost its space, since
 * SentencePiece's Strip drops the first token's space of a text). */
static void continue_family(const char *family, const char *file)
{
	text_tok *t = load(family, file);
	static const char *texts[] = { "And God said unto Moses, I AM THAT I AM.", "In the beginning 你好 \xf0\x9f\x98\x80 x" };
	char err[128];
	for (size_t k = 0; k < 2; k++) {
		int32_t *ids;
		size_t n;
		T_OK(text_encode(t, texts[k], strlen(texts[k]), TEXT_ADD_SPECIAL, &ids, &n, err, sizeof(err)));
		char *all;
		size_t al;
		T_OK(text_decode(t, ids, n, TEXT_SKIP_SPECIAL, &all, &al, err, sizeof(err)));
		for (size_t cut = 1; cut < n; cut++) {
			char *pre;
			size_t pl;
			T_OK(text_decode(t, ids, cut, TEXT_SKIP_SPECIAL, &pre, &pl, err, sizeof(err)));
			/* a cut inside a character: the prefix alone is not a prefix of the whole */
			if (pl > al || memcmp(pre, all, pl) != 0) {
				free(pre);
				continue;
			}
			text_stream *st;
			T_OK(text_stream_open_after(&st, t, TEXT_SKIP_SPECIAL, ids, cut));
			char *buf = NULL;
			size_t len = 0, cap = 0;
			for (size_t i = cut; i < n; i++)
				T_OK(text_stream_push(st, ids[i], &buf, &len, &cap));
			T_OK(text_stream_finish(st, &buf, &len, &cap));
			text_stream_close(st);
			T_ASSERT_MSG(pl + len == al && (len == 0 || memcmp(buf, all + pl, len) == 0),
			    "%s: cut %zu: '%s' + '%.*s' != '%s'", family, cut, pre, (int)len, buf ? buf : "", all);
			free(buf);
			free(pre);
		}
		free(all);
		free(ids);
	}
	/* the regression itself, in words */
	if (strcmp(family, "mixtral") == 0) {
		int32_t *p, *w;
		size_t np, nw;
		T_OK(text_encode(t, "And God said", 12, TEXT_ADD_SPECIAL, &p, &np, err, sizeof(err)));
		T_OK(text_encode(t, "And God said unto", 17, TEXT_ADD_SPECIAL, &w, &nw, err, sizeof(err)));
		T_ASSERT(nw > np && memcmp(p, w, np * sizeof(*p)) == 0);
		text_stream *st;
		char *buf = NULL;
		size_t len = 0, cap = 0;
		T_OK(text_stream_open_after(&st, t, TEXT_SKIP_SPECIAL, p, np));
		for (size_t i = np; i < nw; i++)
			T_OK(text_stream_push(st, w[i], &buf, &len, &cap));
		T_OK(text_stream_finish(st, &buf, &len, &cap));
		text_stream_close(st);
		T_EQ_STR(buf, " unto");
		free(buf);
		/* a fresh stream (a chat answer) starts as transformers' decode of it alone */
		T_OK(text_stream_open(&st, t, TEXT_SKIP_SPECIAL));
		buf = NULL;
		len = cap = 0;
		for (size_t i = np; i < nw; i++)
			T_OK(text_stream_push(st, w[i], &buf, &len, &cap));
		T_OK(text_stream_finish(st, &buf, &len, &cap));
		text_stream_close(st);
		T_EQ_STR(buf, "unto");
		free(buf);
		free(p);
		free(w);
	}
	text_tok_free(t);
}

static void t_continue(void)
{
	static const char *fam[] = { "qwen3", "qwen2", "gpt2", "olmoe", "mixtral" };
	for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
		continue_family(fam[i], "tokenizer.json");
		continue_family(fam[i], "gguf.json");
	}
}

static void expect_ids(const text_tok *t, const char *s, unsigned flags, const int32_t *want, size_t n)
{
	int32_t *ids;
	size_t got;
	char err[256];
	T_OK(text_encode(t, s, strlen(s), flags, &ids, &got, err, sizeof(err)));
	T_ASSERT_MSG(got == n, "\"%s\": %zu ids, want %zu", s, got, n);
	for (size_t i = 0; i < n; i++)
		T_ASSERT_MSG(ids[i] == want[i], "\"%s\": id %zu is %d, want %d", s, i, ids[i], want[i]);
	free(ids);
}

static void expect_text(const text_tok *t, const int32_t *ids, size_t n, unsigned flags, const char *want)
{
	char *out, err[256];
	size_t len;
	T_OK(text_decode(t, ids, n, flags, &out, &len, err, sizeof(err)));
	T_EQ_STR(out, want);
	free(out);
}

/* The newer Llama form: no normaliser, Metaspace pre-tokenizer and decoder;
 * add_bos_token from tokenizer_config.json when there is no template. */
static void t_metaspace(void)
{
	const char *js =
	    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"<s>\":0,\"\u2581\":1,\"a\":2,\"b\":3,"
	    "\"\u2581a\":4,\"\u2581b\":5},\"merges\":[\"\u2581 a\",\"\u2581 b\"]},"
	    "\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true}],"
	    "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\u2581\","
	    "\"prepend_scheme\":\"first\",\"split\":true},"
	    "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\u2581\",\"prepend_scheme\":\"first\"}}";
	const char *cfg = "{\"bos_token\":\"<s>\",\"add_bos_token\":true}";
	text_tok *t;
	char err[256];
	T_ASSERT_MSG(text_tok_load_hf(&t, js, strlen(js), cfg, strlen(cfg), err, sizeof(err)) == 0, "%s", err);
	expect_ids(t, "a b", 0, (int32_t[]){4, 5}, 2);
	expect_ids(t, "a b", TEXT_ADD_SPECIAL, (int32_t[]){0, 4, 5}, 3);
	/* "first": no ▁ in front of the text after a special token */
	expect_ids(t, "<s>a", 0, (int32_t[]){0, 2}, 2);
	expect_text(t, (int32_t[]){4, 5}, 2, 0, "a b");
	expect_text(t, (int32_t[]){0, 4, 5}, 3, TEXT_SKIP_SPECIAL, "a b");
	text_tok_free(t);
}

/* lstrip/rstrip added tokens take the spaces around them; no decoder joins
 * pieces with spaces; Digits splits digits off. */
static void t_added_strip_digits(void)
{
	const char *js =
	    "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\" \":2,\"1\":3,\"2\":4,\"12\":5},"
	    "\"merges\":[[\"1\",\"2\"]]},"
	    "\"added_tokens\":[{\"id\":6,\"content\":\"<x>\",\"special\":true,\"lstrip\":true,"
	    "\"rstrip\":true,\"normalized\":false}],"
	    "\"pre_tokenizer\":{\"type\":\"Digits\",\"individual_digits\":true}}";
	text_tok *t;
	char err[256];
	T_ASSERT_MSG(text_tok_load_hf(&t, js, strlen(js), NULL, 0, err, sizeof(err)) == 0, "%s", err);
	expect_ids(t, "a <x>  b", 0, (int32_t[]){0, 6, 1}, 3);
	expect_ids(t, "a12", 0, (int32_t[]){0, 3, 4}, 3); /* individual digits: no 12 */
	expect_text(t, (int32_t[]){0, 6, 1}, 3, 0, "a <x> b");
	expect_text(t, (int32_t[]){0, 6, 1}, 3, TEXT_SKIP_SPECIAL, "a b");
	text_tok_free(t);
}

/* transformers' clean_up_tokenization_spaces, from the config. */
static void t_cleanup(void)
{
	const char *js = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"x\":0},\"merges\":[]},"
	                 "\"added_tokens\":[{\"id\":1,\"content\":\"a , b . c ? d ! e ' f don n't I 'm "
	                 "it 's we 've they 're x ' s\",\"special\":false}],\"decoder\":{\"type\":\"Fuse\"}}";
	const char *cfg = "{\"clean_up_tokenization_spaces\":true}";
	text_tok *t;
	char err[256];
	T_ASSERT_MSG(text_tok_load_hf(&t, js, strlen(js), cfg, strlen(cfg), err, sizeof(err)) == 0, "%s", err);
	T_ASSERT(text_wants_cleanup(t));
	int32_t id = 1;
	/* what Python's chain of str.replace gives */
	expect_text(t, &id, 1, TEXT_CLEANUP, "a, b. c? d! e'f donn't I'm it's we've they're x's");
	expect_text(t, &id, 1, 0, "a , b . c ? d ! e ' f don n't I 'm it 's we 've they 're x ' s");
	text_stream *s = (text_stream *)1;
	T_EQ_ERR(text_stream_open(&s, t, TEXT_CLEANUP), BATON_EUNSUPPORTED);
	T_ASSERT(s == NULL);
	text_tok_free(t);
	t = load("qwen3", "tokenizer.json");
	T_ASSERT(!text_wants_cleanup(t));
	text_tok_free(t);
}

T_MAIN(T_CASE(t_continue), T_CASE_TIMEOUT(t_qwen3_hf, 120), T_CASE_TIMEOUT(t_qwen3_gguf, 120),
       T_CASE_TIMEOUT(t_qwen2_hf, 120), T_CASE_TIMEOUT(t_qwen2_gguf, 120),
       T_CASE_TIMEOUT(t_gpt2_hf, 120), T_CASE_TIMEOUT(t_gpt2_gguf, 120),
       T_CASE_TIMEOUT(t_olmoe_hf, 120), T_CASE_TIMEOUT(t_olmoe_gguf, 120),
       T_CASE_TIMEOUT(t_mixtral_hf, 120), T_CASE_TIMEOUT(t_mixtral_gguf, 120),
       T_CASE_TIMEOUT(t_specials, 60), T_CASE(t_refusals), T_CASE(t_real_config_values), T_CASE(t_named_templates), T_CASE(t_no_special),
       T_CASE(t_stream_holds_partial), T_CASE(t_metaspace), T_CASE(t_added_strip_digits),
       T_CASE(t_cleanup))
