/*
 * tokenize_cmd.c: `baton tokenize` and `baton detokenize`, for people who
 * debug prompts and for tests (like llama.cpp's llama-tokenize). They need
 * no broker: the tokenizer comes from the arena or from --tokenizer PATH.
 *
 *   baton tokenize   [--json] [--no-add-special] [--no-parse-special] (ARENA | --tokenizer PATH) TEXT
 *   baton detokenize [--json] [--skip-special] (ARENA | --tokenizer PATH) IDS...
 *
 * TEXT "-" reads standard input. IDS: numbers separated by spaces or
 * commas, in one argument or several ("[1, 2]" too). PATH: a Hugging Face
 * tokenizer.json (tokenizer_config.json beside it is read) or a JSON
 * object of GGUF tokenizer.ggml.* keys. Exit status as baton's: 0 done,
 * 1 failed, 2 usage.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "arena/arena.h"
#include "broker/cli/tokenize_cmd.h"
#include "text/text.h"

static const char usage[] =
    "usage: baton tokenize   [--json] [--no-add-special] [--no-parse-special] (ARENA | --tokenizer PATH) TEXT\n"
    "       baton detokenize [--json] [--skip-special] (ARENA | --tokenizer PATH) IDS...\n"
    "\n"
    "  TEXT                 the text; - reads standard input\n"
    "  IDS                  token ids, separated by spaces or commas\n"
    "  --tokenizer PATH     a tokenizer.json (tokenizer_config.json beside it is read)\n"
    "                       or a JSON object of GGUF tokenizer.ggml.* keys\n"
    "  --json               tokenize: {\"ids\", \"tokens\", \"pieces\"}; detokenize: {\"text\"}\n"
    "  --no-add-special     do not add BOS/EOS (added as the tokenizer's config says by default)\n"
    "  --no-parse-special   special tokens written in TEXT are plain text\n"
    "  --skip-special       leave special tokens out of the text\n";

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "baton: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n%s", usage);
	return 2;
}

static char *read_stdin(size_t *len)
{
	size_t cap = 65536, n = 0;
	char *b = malloc(cap);
	while (b) {
		size_t r = fread(b + n, 1, cap - n, stdin);
		n += r;
		if (r == 0)
			break;
		if (n == cap) {
			char *nb = realloc(b, cap *= 2);
			if (!nb)
				free(b);
			b = nb;
		}
	}
	*len = n;
	return b;
}

static int load(const char *tokpath, const char *arena, text_tok **t)
{
	char err[512];
	if (!tokpath) {
		struct baton_arena *a;
		char path[4096];
		/* a bare NAME is /dev/shm/baton/NAME.arena, as for baton-arena */
		if (!strchr(arena, '/') && arena_default_path(arena, path, sizeof path) == 0)
			arena = path;
		if (arena_open(arena, &a, err, sizeof err) != 0) {
			fprintf(stderr, "baton: %s\n", err);
			return 1;
		}
		int rc = text_tok_load_arena(t, a, err, sizeof err);
		arena_close(a);
		if (rc) {
			fprintf(stderr, "baton: %s: %s (or give one with --tokenizer PATH)\n", arena, err);
			return 1;
		}
		return 0;
	}
	if (text_tok_load_file(t, tokpath, err, sizeof(err))) {
		fprintf(stderr, "baton: %s\n", err);
		return 1;
	}
	return 0;
}

static int cmd_tokenize(text_tok *t, const char *text, size_t len, unsigned flags, bool json)
{
	int32_t *ids;
	size_t n;
	char err[512];
	if (text_encode(t, text, len, flags, &ids, &n, err, sizeof(err))) {
		fprintf(stderr, "baton: %s\n", err);
		return 1;
	}
	if (!json) {
		for (size_t i = 0; i < n; i++)
			printf("%s%d", i ? " " : "", ids[i]);
		printf("\n");
		free(ids);
		return 0;
	}
	json_t *o = json_object(), *a = json_array(), *tk = json_array(), *pc = json_array();
	for (size_t i = 0; i < n; i++) {
		char *s;
		size_t sl;
		json_array_append_new(a, json_integer(ids[i]));
		json_array_append_new(tk, json_string(text_piece(t, ids[i])));
		if (text_decode(t, &ids[i], 1, 0, &s, &sl, err, sizeof(err)) == 0) {
			json_array_append_new(pc, json_stringn(s, sl));
			free(s);
		}
	}
	json_object_set_new(o, "ids", a);
	json_object_set_new(o, "tokens", tk); /* as stored in the vocabulary */
	json_object_set_new(o, "pieces", pc); /* each token decoded alone */
	char *out = json_dumps(o, JSON_COMPACT);
	printf("%s\n", out ? out : "{}");
	free(out);
	json_decref(o);
	free(ids);
	return 0;
}

static int parse_ids(const char *const *args, int nargs, int32_t **ids, size_t *n)
{
	size_t cap = 16;
	*n = 0;
	*ids = malloc(cap * sizeof(**ids));
	for (int k = 0; k < nargs; k++) {
		const char *p = args[k];
		while (*p) {
			if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '[' || *p == ']') {
				p++;
				continue;
			}
			char *end;
			errno = 0;
			long v = strtol(p, &end, 10);
			if (end == p || errno || v < 0 || v > INT32_MAX)
				return usage_error("'%s' is not a list of token ids", args[k]);
			if (*n == cap)
				*ids = realloc(*ids, (cap *= 2) * sizeof(**ids));
			(*ids)[(*n)++] = (int32_t)v;
			p = end;
		}
	}
	return 0;
}

static int cmd_detokenize(text_tok *t, const int32_t *ids, size_t n, unsigned flags, bool json)
{
	char *s, err[512];
	size_t len;
	if (text_decode(t, ids, n, flags, &s, &len, err, sizeof(err))) {
		fprintf(stderr, "baton: %s\n", err);
		return 1;
	}
	if (json) {
		json_t *o = json_pack("{s:s%}", "text", s, len);
		char *out = json_dumps(o, JSON_COMPACT);
		printf("%s\n", out ? out : "{}");
		free(out);
		json_decref(o);
	} else {
		fwrite(s, 1, len, stdout);
		printf("\n");
	}
	free(s);
	return 0;
}

int tokenize_cmd_main(int argc, char **argv)
{
	/* Find the command after baton's own leading flags. */
	int i = 1;
	bool json = false;
	while (i < argc && argv[i][0] == '-' && argv[i][1]) {
		const char *a = argv[i];
		if (!strcmp(a, "--json"))
			json = true;
		if ((!strcmp(a, "--broker") || !strcmp(a, "--events") || !strcmp(a, "--timeout")) &&
		    i + 1 < argc)
			i++;
		i++;
	}
	if (i >= argc)
		return -1;
	bool detok = !strcmp(argv[i], "detokenize");
	if (!detok && strcmp(argv[i], "tokenize"))
		return -1;
	const char *tokpath = NULL;
	const char *pos[64];
	int npos = 0;
	unsigned eflags = TEXT_ADD_SPECIAL, dflags = 0;
	bool only_pos = false;
	for (i++; i < argc; i++) {
		const char *a = argv[i];
		if (only_pos || a[0] != '-' || !a[1]) {
			if (npos == (int)(sizeof(pos) / sizeof(pos[0])))
				return usage_error("too many arguments ('%s')", a);
			pos[npos++] = a;
		} else if (!strcmp(a, "--"))
			only_pos = true;
		else if (!strcmp(a, "--json"))
			json = true;
		else if (!strcmp(a, "--tokenizer") && i + 1 < argc)
			tokpath = argv[++i];
		else if (!strncmp(a, "--tokenizer=", 12))
			tokpath = a + 12;
		else if (!detok && !strcmp(a, "--no-add-special"))
			eflags &= ~TEXT_ADD_SPECIAL;
		else if (!detok && !strcmp(a, "--no-parse-special"))
			eflags |= TEXT_NO_SPECIAL;
		else if (detok && !strcmp(a, "--skip-special"))
			dflags |= TEXT_SKIP_SPECIAL;
		else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage, stdout);
			return 0;
		} else
			return usage_error("unknown flag '%s'", a);
	}
	int need = tokpath ? 0 : 1; /* ARENA first unless --tokenizer */
	if (npos < need + 1)
		return usage_error("%s", detok ? "detokenize wants (ARENA | --tokenizer PATH) and token ids"
		                               : "tokenize wants (ARENA | --tokenizer PATH) and a text");
	if (!detok && npos != need + 1)
		return usage_error("tokenize takes one TEXT (quote it), not '%s' too", pos[need + 1]);
	text_tok *t = NULL;
	int rc = load(tokpath, need ? pos[0] : NULL, &t);
	if (rc)
		return rc;
	if (detok) {
		int32_t *ids;
		size_t n;
		if (text_wants_cleanup(t)) /* as transformers' decode */
			dflags |= TEXT_CLEANUP;
		rc = parse_ids(pos + need, npos - need, &ids, &n);
		if (!rc)
			rc = cmd_detokenize(t, ids, n, dflags, json);
		free(ids);
	} else if (!strcmp(pos[need], "-")) {
		size_t len;
		char *text = read_stdin(&len);
		rc = text ? cmd_tokenize(t, text, len, eflags, json) : 1;
		free(text);
	} else
		rc = cmd_tokenize(t, pos[need], strlen(pos[need]), eflags, json);
	text_tok_free(t);
	return rc;
}
