/*
 * arena_safetensors_fuzz.c: libFuzzer target for the safetensors header
 * reader: parse any bytes as a safetensors file (length, JSON header,
 * ranges); when it parses, read every tensor's bytes.
 */
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
	free(b);
	return 0;
}
