/*
 * text_load_fuzz.c: libFuzzer target for the tokenizer loaders, on any
 * bytes: the arena stores a GGUF's tokenizer keys as JSON, so that JSON
 * comes from files Baton did not write. The first byte picks the loader
 * (tokenizer.json, or GGUF keys); the rest is the JSON. A loader must
 * refuse with a message or give a tokenizer that encodes and decodes
 * without crashing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz_util.h"
#include "text/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static void put(const char *dir, const char *name, int kind, const char *s)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		return;
	fputc(kind, f);
	fputs(s, f);
	fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	if (!corpus)
		return 0;
	put(corpus, "seed-bpe", 0,
	    "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\","
	    "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"ab\":3,\"<0x41>\":4},\"merges\":[\"a b\"]},"
	    "\"added_tokens\":[{\"id\":5,\"content\":\"<s>\",\"special\":true,\"lstrip\":true}],"
	    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},"
	    "{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"}]},"
	    "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\","
	    "\"pattern\":{\"Regex\":\"\\\\s+|\\\\p{L}+\"},\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\","
	    "\"add_prefix_space\":false,\"use_regex\":false}]},"
	    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
	    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
	    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
	    "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{\"<s>\":{\"ids\":[5]}}}}");
	put(corpus, "seed-gguf-gpt2", 1,
	    "{\"tokenizer.ggml.model\":\"gpt2\",\"tokenizer.ggml.pre\":\"qwen2\","
	    "\"tokenizer.ggml.tokens\":[\"a\",\"b\",\"ab\",\"<|x|>\"],\"tokenizer.ggml.token_type\":[1,1,1,3],"
	    "\"tokenizer.ggml.merges\":[\"a b\"],\"tokenizer.ggml.eos_token_id\":3}");
	put(corpus, "seed-gguf-llama", 1,
	    "{\"tokenizer.ggml.model\":\"llama\",\"tokenizer.ggml.tokens\":[\"<unk>\",\"<s>\",\"\\u2581\",\"a\","
	    "\"\\u2581a\",\"<0x62>\"],\"tokenizer.ggml.scores\":[0,0,-1,-2,-3,0],"
	    "\"tokenizer.ggml.token_type\":[2,3,1,1,1,6],\"tokenizer.ggml.bos_token_id\":1}");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	char err[256] = "";
	text_tok *t = NULL;
	const char *js = (const char *)data + 1;
	int rc = data[0] & 1 ? text_tok_load_gguf(&t, js, size - 1, err, sizeof(err))
	                     : text_tok_load_hf(&t, js, size - 1, NULL, 0, err, sizeof(err));
	if (rc) {
		if (t || !err[0])
			abort(); /* refused: nothing made, and a reason */
		return 0;
	}
	static const char *texts[] = {"ab a b", "<s>a\xe2\x96\x81 b  \n", "\xe4\xbd\xa0 A1", ""};
	for (size_t k = 0; k < 4; k++) {
		int32_t *ids;
		size_t n;
		if (text_encode(t, texts[k], strlen(texts[k]), TEXT_ADD_SPECIAL, &ids, &n, err, sizeof(err)))
			continue;
		char *out;
		size_t len;
		for (unsigned f = 0; f < 2; f++)
			if (text_decode(t, ids, n, f, &out, &len, err, sizeof(err)) == 0)
				free(out);
		free(ids);
	}
	text_tok_free(t);
	return 0;
}
