/*
 * load.c: the top of text/'s loading, picking the loader for a source.
 *
 * text_tok_load_file: a tokenizer.json (with tokenizer_config.json beside
 * it when there is one) for load_hf.c, or a JSON object of a GGUF's
 * tokenizer keys (it has "tokenizer.ggml.model") for load_gguf.c.
 *
 * text_tok_load_arena: the tokenizer an arena (format v2) stores:
 * tokenizer.json (+ tokenizer_config.json) from a Hugging Face folder, or
 * the GGUF's tokenizer keys (gguf_tokenizer.json); the chat template from
 * chat_template.jinja when the folder had one (transformers 5 saves it
 * there), else from those files, and the "tool_use" template from
 * additional_chat_templates/tool_use.jinja. The one place that knows these
 * names, for the engine and the CLI alike.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "text/text_int.h"

static int read_all(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return text_errf(err, errlen, BATON_ENOTFOUND, "%s: cannot open", path);
	struct tbuf b = {0};
	char chunk[65536];
	size_t n;
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		if (tx_tbuf_put(&b, chunk, n)) {
			fclose(f);
			tx_tbuf_free(&b);
			return BATON_ENOMEM;
		}
	bool bad = ferror(f);
	fclose(f);
	if (bad) {
		tx_tbuf_free(&b);
		return text_errf(err, errlen, BATON_EIO, "%s: read error", path);
	}
	if (!b.p && tx_tbuf_put(&b, "", 0))
		return BATON_ENOMEM;
	*out = b.p;
	*len = b.n;
	return 0;
}

int text_tok_load_file(text_tok **out, const char *path, char *err, size_t errlen)
{
	char *json, *cfg = NULL;
	size_t len, clen = 0;
	int rc = read_all(path, &json, &len, err, errlen);
	if (rc)
		return rc;
	if (strstr(json, "\"tokenizer.ggml.model\"")) {
		rc = text_tok_load_gguf(out, json, len, err, errlen);
		free(json);
		return rc;
	}
	/* tokenizer_config.json beside a tokenizer.json */
	const char *slash = strrchr(path, '/');
	size_t dir = slash ? (size_t)(slash - path + 1) : 0;
	char *cpath = malloc(dir + 32);
	if (!cpath) {
		free(json);
		return BATON_ENOMEM;
	}
	memcpy(cpath, path, dir);
	strcpy(cpath + dir, "tokenizer_config.json");
	char e2[8];
	if (read_all(cpath, &cfg, &clen, e2, sizeof(e2)))
		cfg = NULL;
	free(cpath);
	rc = text_tok_load_hf(out, json, len, cfg, clen, err, errlen);
	free(json);
	free(cfg);
	return rc;
}

int text_tok_load_blobs(text_tok **out, text_blob_fn blob, void *a, char *err, size_t errlen)
{
	const void *tj, *tc = NULL, *ct;
	uint64_t tj_len, tc_len = 0, ct_len;
	int rc;
	*out = NULL;
	if (blob(a, "tokenizer.json", &tj, &tj_len) == 0) {
		if (blob(a, "tokenizer_config.json", &tc, &tc_len) != 0)
			tc = NULL, tc_len = 0;
		rc = text_tok_load_hf(out, tj, (size_t)tj_len, tc, (size_t)tc_len, err, errlen);
	} else if (blob(a, "gguf_tokenizer.json", &tj, &tj_len) == 0) {
		rc = text_tok_load_gguf(out, tj, (size_t)tj_len, err, errlen);
	} else {
		baton_errf(err, errlen, "the arena has no tokenizer (tokenizer.json or a GGUF's "
		    "tokenizer.ggml.* keys): it holds experts only, or was made from a source without one");
		return BATON_EUNSUPPORTED;
	}
	if (rc)
		return rc;
	/* transformers' tokenizer: chat_template.jinja over
	 * tokenizer_config.json's (already loaded), and the named templates of
	 * additional_chat_templates/ beside it (chat_template.json is a
	 * processor's file, which a tokenizer does not read) */
	char *t = NULL;
	if (blob(a, "chat_template.jinja", &ct, &ct_len) == 0) {
		if (!(t = strndup(ct, (size_t)ct_len)))
			goto nomem;
		free((*out)->chat_template);
		(*out)->chat_template = t;
	}
	if (blob(a, "additional_chat_templates/tool_use.jinja", &ct, &ct_len) == 0) {
		if (!(t = strndup(ct, (size_t)ct_len)))
			goto nomem;
		free((*out)->tool_template);
		(*out)->tool_template = t;
	}
	return 0;
nomem:
	text_tok_free(*out);
	*out = NULL;
	return BATON_ENOMEM;
}

static int arena_blob_fn(void *a, const char *key, const void **data, uint64_t *len)
{
	return arena_blob(a, key, data, len);
}

int text_tok_load_arena(text_tok **out, const struct baton_arena *a, char *err, size_t errlen)
{
	return text_tok_load_blobs(out, arena_blob_fn, (void *)a, err, errlen);
}
