/*
 * arena_gguf_fuzz.c: libFuzzer target for the GGUF reader: parse any bytes
 * as a GGUF file; when it parses, read every byte of every expert slice,
 * router and norm as the copy into an arena would; then import the whole
 * model (names, config, tokenizer JSON) and copy every named tensor as the
 * builder would, Q/K row permutation included.
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
		struct arena_plan plan;
		memset(&plan, 0, sizeof plan);
		if (arena_gguf_plan_model(b, &g, &plan, msg, sizeof msg) == 0) {
			for (uint64_t i = 0; i < plan.n_named; i++) {
				const struct arena_named *n = &plan.named[i];
				if (n->role == BATON_ROLE_BLOB) {
					sum += arena_hash(n->data, (size_t)n->bytes);
					continue;
				}
				uint64_t bytes = baton_dtype_row_bytes((int)n->dtype, n->cols) * n->rows;
				uint8_t *dst = malloc(bytes ? bytes : 1);
				if (!dst)
					continue;
				arena_gguf_fill_named(b, &g, n, dst);
				sum += arena_hash(dst, (size_t)bytes);
				free(dst);
			}
		}
		arena_plan_free_named(&plan);
		if (sum == 42)
			msg[0] = 0;
		arena_gguf_free(&g);
	}
	free(b);
	return 0;
}
