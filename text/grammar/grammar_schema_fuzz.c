/*
 * grammar_schema_fuzz.c: libFuzzer target for the schema compiler and
 * the matcher, on any bytes: response_format's schema comes from the
 * client. A schema must be refused with a message naming a place ("#..."),
 * or compile into a grammar whose matcher, driven by its own masks over a
 * small vocabulary, writes only text that stays inside the grammar, and
 * whose whole documents parse as JSON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz_util.h"
#include "text/grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static gram_vocab *voc;
/* every byte alone (so a document the grammar allows can always be
 * spelled), then these */
static const char *const multi[] = { "{", "}", "[", "]", "\"", ",", ":", " ", "\n", "0", "1", "-", ".",
	"e", "a", "b", "\\", "n", "u", "t", "r", "f", "l", "s", "null", "true", "false", "\":", "\",",
	"{\"", "\"}", "ab", "\xc3\xa9", "\xe4\xb8", "\xad", "00", "9", "E", "+", "x", "\"a\"" };
#define NM (sizeof multi / sizeof multi[0])
#define NT (255 + NM)
static char bytes1[255][2];
static const char *toks[NT];

static void put(const char *dir, const char *name, const char *s)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		return;
	fputs(s, f);
	fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	size_t lens[NT];
	for (size_t i = 0; i < NT; i++) {
		if (i < 255) {
			bytes1[i][0] = (char)(i + 1);
			toks[i] = bytes1[i];
		} else
			toks[i] = multi[i - 255];
		lens[i] = strlen(toks[i]);
	}
	if (gram_vocab_new(&voc, NT, toks, lens, NULL))
		abort();
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	if (!corpus)
		return 0;
	put(corpus, "seed-object", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":3},"
	    "\"b\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"maxItems\":2}},\"required\":[\"a\"],"
	    "\"additionalProperties\":false}");
	put(corpus, "seed-ref", "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\","
	    "\"items\":{\"$ref\":\"#/$defs/n\"}}}}},\"$ref\":\"#/$defs/n\"}");
	put(corpus, "seed-any", "{\"anyOf\":[{\"enum\":[1,\"x\",null]},{\"type\":[\"number\",\"boolean\"]}]}");
	put(corpus, "seed-tuple", "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"const\":\"a\"}],"
	    "\"items\":{\"type\":\"string\",\"minLength\":1},\"minItems\":1,\"maxItems\":4}");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
	if (!s)
		return 0;
	gram *g = NULL;
	char err[300] = "";
	int rc = gram_compile_schema(&g, s, err, sizeof err);
	json_decref(s);
	if (rc) {
		if (g || err[0] != '#')
			abort(); /* refused: nothing made, and the place named */
		return 0;
	}
	gram_match *m;
	if (gram_match_new(&m, g, voc))
		abort();
	char out[4096];
	size_t n = 0;
	uint64_t allow[(NT + 63) / 64];
	for (unsigned step = 0; step < 200; step++) {
		bool can_end;
		if (gram_match_mask(m, allow, &can_end))
			abort();
		unsigned any = 0;
		for (unsigned w = 0; w < (NT + 63) / 64; w++)
			any |= allow[w] != 0;
		if (can_end && (!any || step % 7 == 6))
			break;
		if (!any)
			abort(); /* a dead end, though every byte is a token */
		/* the allowed token the input's bytes pick */
		unsigned k = (unsigned)data[step % size] % NT, t = UINT32_MAX;
		for (unsigned i = 0; i < NT && t == UINT32_MAX; i++) {
			unsigned c = (k + i) % NT;
			if (allow[c / 64] >> (c % 64) & 1)
				t = c;
		}
		size_t l = strlen(toks[t]);
		if (n + l >= sizeof out)
			break;
		bool whole;
		if (!gram_match_check_bytes(m, toks[t], l, &whole) || gram_match_accept(m, t))
			abort(); /* the mask allowed what the matcher refuses */
		memcpy(out + n, toks[t], l);
		n += l;
	}
	if (gram_match_can_end(m)) {
		json_t *doc = json_loadb(out, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
		if (!doc) {
			/* only a number past jansson's range may fail to load */
			int digits = 0;
			for (size_t i = 0; i < n; i++)
				digits += out[i] >= '0' && out[i] <= '9';
			if (digits < 15)
				abort();
		}
		json_decref(doc);
	}
	gram_match_free(m);
	gram_free(g);
	return 0;
}
