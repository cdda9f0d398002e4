/*
 * load_arena.c: the tokenizer an arena (format v2) stores: tokenizer.json
 * (+ tokenizer_config.json) from a Hugging Face folder, or the GGUF's
 * tokenizer keys (gguf_tokenizer.json); the chat template from
 * chat_template.jinja when the folder had one (transformers 5 saves it
 * there), else from those files. The one place that knows these names, for
 * the engine and the CLI alike.
 */
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "text/text_int.h"

int text_tok_load_arena(text_tok **out, const struct baton_arena *a, char *err, size_t errlen)
{
	const void *tj, *tc = NULL, *ct;
	uint64_t tj_len, tc_len = 0, ct_len;
	int rc;
	*out = NULL;
	if (arena_blob(a, "tokenizer.json", &tj, &tj_len) == 0) {
		if (arena_blob(a, "tokenizer_config.json", &tc, &tc_len) != 0)
			tc = NULL, tc_len = 0;
		rc = text_tok_load_hf(out, tj, (size_t)tj_len, tc, (size_t)tc_len, err, errlen);
	} else if (arena_blob(a, "gguf_tokenizer.json", &tj, &tj_len) == 0) {
		rc = text_tok_load_gguf(out, tj, (size_t)tj_len, err, errlen);
	} else {
		baton_errf(err, errlen, "the arena has no tokenizer (tokenizer.json or a GGUF's "
		    "tokenizer.ggml.* keys): it holds experts only, or was made from a source without one");
		return BATON_EUNSUPPORTED;
	}
	if (rc)
		return rc;
	if (arena_blob(a, "chat_template.jinja", &ct, &ct_len) == 0) {
		char *t = malloc((size_t)ct_len + 1);
		if (!t) {
			text_tok_free(*out);
			*out = NULL;
			return BATON_ENOMEM;
		}
		memcpy(t, ct, (size_t)ct_len);
		t[ct_len] = '\0';
		free((*out)->chat_template);
		(*out)->chat_template = t;
	}
	return 0;
}
