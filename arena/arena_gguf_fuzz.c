/*
 * arena_gguf_fuzz.c: libFuzzer target for the GGUF reader: parse any bytes
 * as a GGUF file; when it parses, read every byte of every expert slice,
 * router and norm as the copy into an arena would.
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
	struct arena_gguf g;
	char msg[512];
	if (arena_gguf_parse(b, size, &g, msg, sizeof msg) == 0) {
		uint64_t sum = 0;
		for (uint32_t l = 0; l < g.layers; l++)
			for (int k = 0; k < ARENA_GG_N; k++) {
				uint32_t t = g.layer_t[(size_t)l * ARENA_GG_N + (uint32_t)k];
				if (t == UINT32_MAX)
					continue;
				const struct arena_gguf_tensor *ti = &g.tensors[t];
				if (ti->bytes)
					sum += arena_hash(b + ti->offset, (size_t)ti->bytes);
			}
		if (sum == 42)
			msg[0] = 0;
		arena_gguf_free(&g);
	}
	free(b);
	return 0;
}
