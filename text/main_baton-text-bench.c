/*
 * baton-text-bench: encoding speed of the text component (figures, not a
 * test).
 *
 *   baton-text-bench [--repeat N] TOKENIZER TEXTFILE
 *
 * Encodes TEXTFILE (e.g. 1 MB made by `python3 text/fixtures/corpus.py
 * bench 1048576`) with TOKENIZER (a tokenizer.json or a GGUF-key JSON) two
 * ways: as one string, and line by line (what encode_batch does in
 * Hugging Face's tokenizers, here on one thread), and prints tokens per
 * second, the best of N runs (default 3), and decoding speed. Single
 * thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/base/base.h"
#include "text/text.h"

int main(int argc, char **argv)
{
	static const char usage[] = "usage: baton-text-bench [--repeat N] TOKENIZER TEXTFILE | --help | --version\n";
	int repeat = 3, a = 1;
	if (argc > 1 && !strcmp(argv[1], "--help")) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--version")) {
		printf("baton-text-bench %s\n", BATON_VERSION);
		return 0;
	}
	if (argc > 2 && !strcmp(argv[1], "--repeat")) {
		uint64_t r;
		repeat = baton_parse_u64(argv[2], 1, 1000000, &r) ? 0 : (int)r;
		a = 3;
	}
	if (a < argc && argv[a][0] == '-' && argv[a][1]) {
		fprintf(stderr, "baton-text-bench: unknown option '%s'\n%s", argv[a], usage);
		return 2;
	}
	if (argc - a != 2 || repeat < 1) {
		fputs(usage, stderr);
		return 2;
	}
	char err[256];
	text_tok *t;
	if (text_tok_load_file(&t, argv[a], err, sizeof(err))) {
		fprintf(stderr, "baton-text-bench: %s\n", err);
		return 1;
	}
	FILE *f = fopen(argv[a + 1], "rb");
	if (!f) {
		fprintf(stderr, "baton-text-bench: %s: cannot open\n", argv[a + 1]);
		return 1;
	}
	fseek(f, 0, SEEK_END);
	long sz = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *text = malloc((size_t)sz + 1);
	if (!text || fread(text, 1, (size_t)sz, f) != (size_t)sz) {
		fprintf(stderr, "baton-text-bench: cannot read %s\n", argv[a + 1]);
		return 1;
	}
	fclose(f);
	double best_one = 1e30, best_lines = 1e30, best_dec = 1e30;
	size_t n_one = 0, n_lines = 0;
	for (int r = 0; r < repeat; r++) {
		int32_t *ids;
		size_t n;
		double t0 = baton_now_s();
		if (text_encode(t, text, (size_t)sz, 0, &ids, &n, err, sizeof(err))) {
			fprintf(stderr, "baton-text-bench: %s\n", err);
			return 1;
		}
		double t1 = baton_now_s();
		char *out;
		size_t on;
		if (text_decode(t, ids, n, 0, &out, &on, err, sizeof(err))) {
			fprintf(stderr, "baton-text-bench: %s\n", err);
			return 1;
		}
		double t2 = baton_now_s();
		free(out);
		free(ids);
		n_one = n;
		if (t1 - t0 < best_one)
			best_one = t1 - t0;
		if (t2 - t1 < best_dec)
			best_dec = t2 - t1;
		/* line by line, each line with its newline */
		double t3 = baton_now_s();
		size_t total = 0;
		for (long i = 0; i < sz;) {
			const char *nl = memchr(text + i, '\n', (size_t)(sz - i));
			long e = nl ? (long)(nl - text) + 1 : sz;
			if (text_encode(t, text + i, (size_t)(e - i), 0, &ids, &n, err, sizeof(err))) {
				fprintf(stderr, "baton-text-bench: %s\n", err);
				return 1;
			}
			total += n;
			free(ids);
			i = e;
		}
		double t4 = baton_now_s();
		n_lines = total;
		if (t4 - t3 < best_lines)
			best_lines = t4 - t3;
	}
	printf("tokenizer %s, text %s: %ld bytes, best of %d, one thread\n", argv[a], argv[a + 1], sz,
	       repeat);
	printf("encode one string: %zu tokens in %.3f s = %.0f tokens/s (%.1f MB/s)\n", n_one, best_one,
	       (double)n_one / best_one, (double)sz / best_one / 1e6);
	printf("encode by line:    %zu tokens in %.3f s = %.0f tokens/s\n", n_lines, best_lines,
	       (double)n_lines / best_lines);
	printf("decode:            %zu tokens in %.3f s = %.0f tokens/s\n", n_one, best_dec,
	       (double)n_one / best_dec);
	free(text);
	text_tok_free(t);
	return 0;
}
