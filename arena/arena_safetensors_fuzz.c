/*
 * arena_safetensors_fuzz.c: libFuzzer target for the safetensors header
 * reader: parse any bytes as a safetensors file (length, JSON header,
 * ranges); when it parses, read every tensor's bytes. The header's JSON
 * also goes through the config.json checks of a whole-model import (a
 * header that is an HF config object reaches every field's check).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *b = malloc(size ? size : 1);
	if (!b)
		return 0;
	memcpy(b, data, size);
	struct arena_st_header h;
	char msg[512];
	if (arena_st_parse(b, size, &h, msg, sizeof msg) == 0) {
		uint64_t sum = 0;
		for (uint64_t i = 0; i < h.n_tensors; i++)
			sum += arena_hash(b + h.tensors[i].offset, (size_t)h.tensors[i].bytes) +
			    strlen(h.tensors[i].name);
		if (sum == 42)
			msg[0] = 0;
		arena_st_free(&h);
	}
	/* The header's JSON as a config.json, whether or not it is a valid
	 * safetensors header. */
	uint64_t hl = 0;
	if (size >= 8)
		memcpy(&hl, b, 8);
	if (size >= 8 && hl <= size - 8) {
		json_t *j = json_loadb((const char *)b + 8, (size_t)hl, JSON_DISABLE_EOF_CHECK, NULL);
		struct arena_model_cfg c;
		if (j && arena_model_from_config(j, &c, msg, sizeof msg) == 0) {
			struct arena_model_tensor *mt;
			uint64_t nt;
			if (arena_model_tensors(&c, &mt, &nt, msg, sizeof msg) == 0)
				free(mt);
			uint64_t len;
			free(arena_model_config_json(&c, &len));
		}
		json_decref(j);
	}
	free(b);
	return 0;
}
