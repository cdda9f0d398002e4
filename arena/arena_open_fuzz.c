/*
 * arena_open_fuzz.c: libFuzzer target for the arena reader: the validation
 * arena_open runs on a mapped file (arena_index_build), on any bytes. When
 * the header's first reserved byte (offset 464) is odd, the header and table
 * checksums are first recomputed, so the fuzzer gets past them to the entry
 * and name checks; a successful index is then used as open would: every
 * blob's bytes are read, every name and metadata blob too.
 */
#include <stdlib.h>
#include <string.h>

#include "arena/arena_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *b = malloc(size ? size : 1); /* exact size: ASan sees overreads */
	if (!b)
		return 0;
	memcpy(b, data, size);
	if (size >= ARENA_HEADER_BYTES && (b[464] & 1)) {
		struct arena_file_header h;
		memcpy(&h, b, sizeof h);
		if (h.table_offset <= size && h.n_entries <= size / ARENA_ENTRY_BYTES &&
		    h.n_entries * ARENA_ENTRY_BYTES <= size - h.table_offset &&
		    h.names_offset <= size && h.names_bytes <= size - h.names_offset)
			h.table_checksum = arena_table_checksum(b + h.table_offset,
			    (size_t)(h.n_entries * ARENA_ENTRY_BYTES), b + h.names_offset,
			    (size_t)h.names_bytes);
		h.header_checksum = arena_header_checksum(&h);
		memcpy(b, &h, sizeof h);
	}
	struct arena_index ix;
	char msg[512];
	if (arena_index_build(b, size, &ix, msg, sizeof msg) == 0) {
		uint64_t sum = 0;
		for (uint64_t i = 0; i < ix.n_entries; i++) {
			const struct arena_file_entry *e = &ix.entries[i];
			sum += arena_hash(b + e->offset, (size_t)e->bytes);
			for (uint32_t p = 0; p < e->n_parts; p++)
				sum += b[e->offset + e->part[p].offset + e->part[p].bytes - 1];
		}
		for (uint64_t i = 0; i < ix.n_dense_ix; i++)
			sum += strlen(ix.name_str[ix.dense_ix[i]]);
		for (uint64_t i = 0; i < ix.n_blob_ix; i++) {
			const struct arena_file_entry *e = &ix.entries[ix.blob_ix[i]];
			sum += strlen(ix.name_str[ix.blob_ix[i]]) + b[e->offset + e->bytes - 1];
		}
		for (uint32_t l = 0; l < ix.shape.layers; l++)
			for (uint32_t x = 0; x < ix.shape.experts; x++)
				sum += ix.entries[ix.expert_ix[(uint64_t)l * ix.shape.experts + x]].bytes;
		if (sum == 42)
			msg[0] = 0;
		arena_index_free(&ix);
	}
	free(b);
	return 0;
}
