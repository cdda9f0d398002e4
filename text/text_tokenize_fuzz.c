/*
 * text_tokenize_fuzz.c: libFuzzer target for the tokenizers, on any bytes.
 *
 * The first byte picks a fixture tokenizer (text/fixtures, or
 * $TEXT_FIXTURES) and a flag; the rest is the text. Checked:
 *   - encode never crashes; invalid UTF-8 is refused, valid is encoded;
 *   - byte-level tokenizers give the text back: decode(encode(x)) is x
 *     (GPT-2: no normaliser), or has x's NFC (Qwen, OLMo: NFC), with and
 *     without special-token matching;
 *   - the streaming decoder gives exactly decode's bytes, and only whole
 *     characters per push, for the encoded ids and for the input read as
 *     arbitrary ids (skip_special_tokens on and off).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tests/fuzz_util.h"
#include "text/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const struct {
	const char *dir, *file;
	int nfc;       /* decode(encode(x)) == NFC(x) */
	int roundtrip; /* byte-level: the text comes back */
} TOKS[] = {
    {"qwen3", "tokenizer.json", 1, 1}, {"gpt2", "tokenizer.json", 0, 1},
    {"olmoe", "tokenizer.json", 1, 1}, {"mixtral", "tokenizer.json", 0, 0},
    {"qwen2", "gguf.json", 1, 1},      {"mixtral", "gguf.json", 0, 0},
};
#define NTOKS (sizeof(TOKS) / sizeof(TOKS[0]))
static text_tok *tok[NTOKS];

/* An empty corpus starts from every 25th fixture string, once per
 * tokenizer. */
static void seed(const char *corpus, const char *dir)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/qwen3/strings.jsonl", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	char *line = NULL;
	size_t cap = 0, n = 0;
	ssize_t len;
	while ((len = getline(&line, &cap, f)) > 0) {
		if (n++ % 25)
			continue;
		/* the JSON string's raw bytes between the quotes are seed enough */
		for (size_t k = 0; k < NTOKS; k++) {
			snprintf(path, sizeof(path), "%s/seed-%zu-%zu", corpus, n, k);
			FILE *o = fopen(path, "wb");
			if (!o)
				continue;
			fputc((int)k, o);
			if (len > 3)
				fwrite(line + 1, 1, (size_t)len - 3, o);
			fclose(o);
		}
	}
	free(line);
	fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *dir = getenv("TEXT_FIXTURES");
	if (!dir)
		dir = "text/fixtures";
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	if (corpus)
		seed(corpus, dir);
	for (size_t i = 0; i < NTOKS; i++) {
		char path[512], err[256];
		snprintf(path, sizeof(path), "%s/%s/%s", dir, TOKS[i].dir, TOKS[i].file);
		if (text_tok_load_file(&tok[i], path, err, sizeof(err))) {
			fprintf(stderr, "text_tokenize_fuzz: %s (run from the repository root)\n", err);
			abort();
		}
	}
	return 0;
}

static int valid_utf8(const char *s, size_t n)
{
	return utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, NULL, 0, 0) >= 0;
}

/* NFC of n bytes, malloc'ed (*out), or abort. */
static size_t nfc(const char *s, size_t n, char **out)
{
	utf8proc_uint8_t *d = NULL;
	utf8proc_ssize_t dn = n ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &d,
	                                       UTF8PROC_STABLE | UTF8PROC_COMPOSE)
	                        : 0;
	if (dn < 0)
		abort();
	*out = (char *)d;
	return (size_t)dn;
}

static void check_stream(const text_tok *t, const int32_t *ids, size_t n, unsigned flags)
{
	char *whole, err[256];
	size_t wl;
	if (text_decode(t, ids, n, flags, &whole, &wl, err, sizeof(err)))
		abort();
	text_stream *s;
	if (text_stream_open(&s, t, flags))
		abort();
	char *buf = NULL;
	size_t len = 0, cap = 0;
	for (size_t i = 0; i < n; i++) {
		size_t before = len;
		if (text_stream_push(s, ids[i], &buf, &len, &cap))
			abort();
		/* whole characters only (NUL bytes may be text: check with length) */
		if (len > before &&
		    utf8proc_decompose((const utf8proc_uint8_t *)buf + before, (utf8proc_ssize_t)(len - before),
		                       NULL, 0, 0) < 0)
			abort();
	}
	if (text_stream_finish(s, &buf, &len, &cap))
		abort();
	text_stream_close(s);
	if (len != wl || (wl && memcmp(buf, whole, wl)))
		abort();
	free(buf);
	free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t k = data[0] % NTOKS;
	unsigned flags = (data[0] / NTOKS) & 1 ? 2u /* TEXT_NO_SPECIAL */ : 0u;
	const text_tok *t = tok[k];
	const char *s = (const char *)data + 1;
	size_t n = size - 1;
	int32_t *ids;
	size_t nids;
	char err[256];
	int rc = text_encode(t, s, n, flags, &ids, &nids, err, sizeof(err));
	int valid = valid_utf8(s, n);
	if (!valid != !!rc)
		abort(); /* refused exactly the invalid UTF-8 */
	if (rc == 0) {
		if (TOKS[k].roundtrip) {
			char *out;
			size_t ol;
			if (text_decode(t, ids, nids, 0, &out, &ol, err, sizeof(err)))
				abort();
			/* the normaliser runs per stretch between added tokens, so
			 * compare NFC of both sides (NFC(NFC(a) b) == NFC(a b)) */
			char *got = out, *want = NULL;
			size_t gl = ol, wl = n;
			if (TOKS[k].nfc) {
				gl = nfc(out, ol, &got);
				wl = nfc(s, n, &want);
			}
			if (gl != wl || (wl && memcmp(got, want ? want : s, wl)))
				abort();
			if (got != out)
				free(got);
			free(want);
			free(out);
		}
		check_stream(t, ids, nids, 0);
		check_stream(t, ids, nids, 1);
		free(ids);
	}
	/* the input read as ids */
	size_t m = n / 2;
	int32_t *raw = malloc((m + 1) * sizeof(*raw));
	if (!raw)
		return 0;
	for (size_t i = 0; i < m; i++)
		raw[i] = (int32_t)(((unsigned)(uint8_t)s[2 * i] | (unsigned)(uint8_t)s[2 * i + 1] << 8) %
		                   text_vocab_size(t));
	check_stream(t, raw, m, 0);
	check_stream(t, raw, m, 1);
	free(raw);
	return 0;
}
