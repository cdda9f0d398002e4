/*
 * arena.h: the public door of the arena component: one read-only, shared
 * host copy of a model's experts under /dev/shm, laid out so that each
 * expert (gate, up and down of one layer) is one contiguous, aligned blob.
 *
 * File format (little endian, version 1), all offsets from the file start:
 *   header   struct arena_file_header (fixed size, see arena_format.h)
 *   table    n_entries x struct arena_file_entry
 *   data     blobs, each aligned to BATON_ARENA_ALIGN
 * The header holds the table's checksum and is sealed last; creation writes
 * a temporary file and renames it into place, so an unsealed or half-written
 * file is never accepted by arena_open().
 *
 * Tensor layout follows ggml: a 2-D weight of shape (rows, cols) stores
 * `rows` rows of `cols` elements, each row encoded in the entry's dtype.
 *   gate, up: (d_ff rows, d_model cols)    y = W x
 *   down:     (d_model rows, d_ff cols)
 *   router:   (n_experts rows, d_model cols)
 *   norm:     (1 row, d_model cols)        RMSNorm weight before the router
 */
#ifndef BATON_ARENA_H
#define BATON_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"

#define BATON_ARENA_ALIGN 4096u
#define BATON_ARENA_MAX_LAYERS 4096u
#define BATON_ARENA_MAX_EXPERTS 4096u

/* Tensor types carry ggml's numbering, so GGUF tensors are copied as they
 * are and `info` names them as llama.cpp does. */
enum baton_dtype {
	BATON_DT_F32 = 0,
	BATON_DT_F16 = 1,
	BATON_DT_Q4_0 = 2,
	BATON_DT_Q4_1 = 3,
	BATON_DT_Q5_0 = 6,
	BATON_DT_Q5_1 = 7,
	BATON_DT_Q8_0 = 8,
	BATON_DT_Q8_1 = 9,
	BATON_DT_Q2_K = 10,
	BATON_DT_Q3_K = 11,
	BATON_DT_Q4_K = 12,
	BATON_DT_Q5_K = 13,
	BATON_DT_Q6_K = 14,
	BATON_DT_Q8_K = 15,
	BATON_DT_IQ2_XXS = 16,
	BATON_DT_IQ2_XS = 17,
	BATON_DT_IQ3_XXS = 18,
	BATON_DT_IQ1_S = 19,
	BATON_DT_IQ4_NL = 20,
	BATON_DT_IQ3_S = 21,
	BATON_DT_IQ2_S = 22,
	BATON_DT_IQ4_XS = 23,
	BATON_DT_I8 = 24,
	BATON_DT_I16 = 25,
	BATON_DT_I32 = 26,
	BATON_DT_I64 = 27,
	BATON_DT_F64 = 28,
	BATON_DT_IQ1_M = 29,
	BATON_DT_BF16 = 30,
	BATON_DT_TQ1_0 = 34,
	BATON_DT_TQ2_0 = 35,
	BATON_DT_MXFP4 = 39, /* block 32, 17 bytes (gpt-oss experts) */
	BATON_DT_COUNT = 40 /* upper bound of the numbering, not a type */
};

/* "f32", "q4_K", ...; NULL for a number that is no known type. */
const char *baton_dtype_name(int dtype);
/* Parses a name as printed by baton_dtype_name (case-insensitive); -1 if unknown. */
int baton_dtype_parse(const char *name);
/* Bytes of one row of `cols` elements; 0 when the type is unknown or cols
 * is not a multiple of the type's block size (or would overflow). */
uint64_t baton_dtype_row_bytes(int dtype, uint64_t cols);

enum baton_role {
	BATON_ROLE_EXPERT = 0, /* gate+up+down of one (layer, expert): one blob */
	BATON_ROLE_ROUTER = 1,
	BATON_ROLE_NORM = 2,
};

struct baton_arena_shape {
	uint32_t layers, experts, top_k;
	uint32_t d_model, d_ff;
	uint32_t gate_dtype, up_dtype, down_dtype; /* enum baton_dtype */
	uint32_t router_dtype, norm_dtype;
};

/* One expert: where its bytes are in the mapping and in the file. */
struct baton_arena_expert {
	const uint8_t *blob;   /* gate, then up, then down; in the read-only mapping */
	uint64_t offset;       /* of the blob in the file (BATON_ARENA_ALIGN aligned) */
	uint64_t bytes;        /* blob size, the three parts together */
	uint64_t gate_off, up_off, down_off; /* each part's offset inside the blob */
	uint64_t checksum;     /* XXH3-64 of the blob */
};

/* A dense tensor (router, norm) of one layer. */
struct baton_arena_tensor {
	const uint8_t *data;
	uint64_t offset, bytes;
	uint32_t dtype, rows, cols;
	uint64_t checksum;
};

struct baton_arena;

/* Opens and maps a sealed arena read-only (MAP_SHARED, so every process
 * shares the page cache copy). Every offset and size is checked before use;
 * a bad file is refused with the error code and a message naming the
 * problem written to errbuf (may be NULL). On failure nothing stays mapped.
 * The caller owns *out and frees it with arena_close(). */
int arena_open(const char *path, struct baton_arena **out, char *errbuf, size_t errlen);
/* Unmaps and frees; NULL is allowed. */
void arena_close(struct baton_arena *a);

const struct baton_arena_shape *arena_shape(const struct baton_arena *a);
uint64_t arena_generation(const struct baton_arena *a);
/* The whole mapping, for pinning it once with the device backend. */
const void *arena_base(const struct baton_arena *a);
uint64_t arena_size(const struct baton_arena *a);
/* The largest expert blob, rounded up to BATON_ARENA_ALIGN: the cache's
 * slot size. */
uint64_t arena_max_expert_bytes(const struct baton_arena *a);

/* Looks up (layer, expert); BATON_ENOTFOUND when out of range. */
int arena_expert(const struct baton_arena *a, uint32_t layer, uint32_t expert,
    struct baton_arena_expert *out);
/* Looks up a dense tensor; BATON_ENOTFOUND when the arena has none. */
int arena_tensor(const struct baton_arena *a, uint32_t layer, enum baton_role role,
    struct baton_arena_tensor *out);

/* Recomputes every checksum. Returns BATON_ECHECKSUM on the first mismatch
 * and names the entry in errbuf; *bad_entries (may be NULL) counts them all. */
int arena_verify(const struct baton_arena *a, uint64_t *bad_entries, char *errbuf, size_t errlen);

/* ---- creation ----------------------------------------------------------- */

struct baton_synth_params {
	uint32_t layers, experts, top_k, d_model, d_ff;
	uint32_t dtype;   /* f32, f16, bf16 or q8_0, for gate, up and down */
	uint64_t seed;
};

/* Each creator writes PATH.tmp.<pid>, fills it, checksums it, seals it and
 * renames it to PATH, holding an exclusive lock on PATH.lock meanwhile.
 * A second creator of the same PATH waits for the lock and, when a valid
 * arena is then in place, uses it (returns 0) instead of building again;
 * `force` rebuilds anyway. */
int arena_create_synthetic(const char *path, const struct baton_synth_params *p,
    int force, char *errbuf, size_t errlen);
int arena_create_gguf(const char *path, const char *gguf_file, int force,
    char *errbuf, size_t errlen);
/* src: a .safetensors file, or a folder with model.safetensors.index.json
 * and its shards. top_k, when 0, comes from config.json beside the weights
 * (num_experts_per_tok) or defaults to 2. */
int arena_create_safetensors(const char *path, const char *src, uint32_t top_k,
    int force, char *errbuf, size_t errlen);

/* ---- additions ----------------------------------------------------------- */

/* The three parts of one expert as tensors: parts[0] gate, [1] up, [2] down,
 * each with its own dtype and shape. Layers may differ in dtype (llama.cpp's
 * quantization mixes give some layers' down q6_K and others' q4_K); the
 * shape's gate/up/down dtypes are layer 0's. BATON_ENOTFOUND when out of
 * range. `data` points into the read-only mapping. */
int arena_expert_parts(const struct baton_arena *a, uint32_t layer, uint32_t expert,
    struct baton_arena_tensor parts[3]);
/* The dtypes of one layer's expert parts (gate, up, down); BATON_ENOTFOUND
 * when the layer is out of range. */
int arena_layer_dtypes(const struct baton_arena *a, uint32_t layer, uint32_t dtypes[3]);
/* What the arena was made from, e.g. "gguf model.gguf (qwen2moe)"; never NULL. */
const char *arena_source(const struct baton_arena *a);

/* Where an arena named `name` lives by default: /dev/shm/baton/<name>.arena.
 * BATON_EINVAL for an empty name or one with '/', BATON_ETOOBIG when it does
 * not fit in buf. */
int arena_default_path(const char *name, char *buf, size_t len);

enum baton_arena_source_kind {
	BATON_ARENA_SRC_SYNTHETIC = 1,
	BATON_ARENA_SRC_GGUF = 2,
	BATON_ARENA_SRC_SAFETENSORS = 3,
};

struct baton_arena_source {
	int kind;                          /* enum baton_arena_source_kind */
	struct baton_synth_params synth;   /* kind SYNTHETIC */
	const char *file;                  /* GGUF file, or safetensors file/folder */
	uint32_t top_k;                    /* safetensors: 0 = config.json or 2 */
};

struct baton_create_opts {
	int force;        /* rebuild even when a valid arena of this source exists */
	unsigned threads; /* 0: every online CPU */
};

struct baton_create_result {
	int reused;          /* 1: a valid arena of the same source was already there */
	uint64_t generation; /* of the arena now at the path */
	uint64_t bytes;      /* its file size */
	double seconds;      /* spent in this call */
};

/* The general form of the three creators above: same locking, temporary
 * file and publication; `opts` and `res` may be NULL. Without force, a valid
 * arena of another source at `path` is not replaced: BATON_EEXIST. May block
 * on PATH.lock while another process creates the same arena. */
int arena_create(const char *path, const struct baton_arena_source *src,
    const struct baton_create_opts *opts, struct baton_create_result *res,
    char *errbuf, size_t errlen);

#endif
