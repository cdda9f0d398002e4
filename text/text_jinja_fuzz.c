/*
 * text_jinja_fuzz.c: libFuzzer target for the Jinja engine, on any bytes
 * as a template: chat templates come from model files Baton did not
 * write. The engine must refuse with a message, or render a conversation
 * (with tools and tool calls) to text or to an error with a message,
 * within its bounds. Seeds: the corpus of real templates.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz_util.h"
#include "text/text.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char ctx[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi \\u4e16\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>x</think>ok\",\"reasoning_content\":\"r\","
    "\"tool_calls\":[{\"id\":\"call12345\",\"type\":\"function\",\"function\":{\"name\":\"f\","
    "\"arguments\":{\"a\":1,\"b\":[true,null,2.5]}}}]},{\"role\":\"tool\",\"tool_call_id\":\"call12345\","
    "\"content\":\"3\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"}}}}}],"
    "\"documents\":null,\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\","
    "\"enable_thinking\":false}";

static void copy_seeds(const char *corpus)
{
	const char *dir = "text/fixtures/templates";
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);
		if (n < 7 || strcmp(e->d_name + n - 6, ".jinja"))
			continue;
		char from[512], to[512], buf[65536];
		snprintf(from, sizeof(from), "%s/%s", dir, e->d_name);
		snprintf(to, sizeof(to), "%s/%s", corpus, e->d_name);
		FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
		if (out) {
			size_t k = fread(buf, 1, sizeof(buf), in);
			fwrite(buf, 1, k, out);
		}
		if (out)
			fclose(out);
		if (in)
			fclose(in);
	}
	closedir(d);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	if (corpus)
		copy_seeds(corpus);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char err[256] = "";
	text_jinja *j = NULL;
	if (text_jinja_load(&j, (const char *)data, size, err, sizeof(err))) {
		if (j || !err[0])
			abort(); /* refused: nothing made, and a reason */
		return 0;
	}
	char *out = NULL;
	size_t n = 0;
	err[0] = 0;
	int rc = text_jinja_render(j, ctx, sizeof(ctx) - 1, &out, &n, err, sizeof(err));
	if (rc ? (out != NULL || !err[0]) : (out == NULL || strlen(out) > n))
		abort();
	free(out);
	text_jinja_free(j);
	return 0;
}
