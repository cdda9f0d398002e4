/*
 * arena_int.h: what the arena's own files share (internal; not for other
 * components). Prefix arena_ for functions, with a module word after it
 * (arena_gguf_, arena_st_, arena_build) where it helps.
 */
#ifndef BATON_ARENA_INT_H
#define BATON_ARENA_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "arena/arena.h"
#include "arena/arena_format.h"

#define ARENA_MAX_SOURCE_TENSORS (1u << 24)

/* ---- small helpers (util.c) ---------------------------------------------- */

/* XXH3-64 of n bytes. */
uint64_t arena_hash(const void *p, size_t n);
/* Identity of a source file's data for the reuse check: its size and 16
 * chunks of 4 KiB spread evenly over [from, size). */
uint64_t arena_sample_hash(const uint8_t *b, uint64_t size, uint64_t from);
/* Writes a message to errbuf (when not NULL) and returns err. */
int arena_errf(char *errbuf, size_t errlen, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Number of worker threads for `want` (0: online CPUs), at most `work`. */
unsigned arena_threads(unsigned want, uint64_t work);
double arena_now(void);
/* Runs fn(ctx, i) for i in [0, n) on `threads` threads, items taken in
 * order from a shared counter; stops handing out items once one returns
 * nonzero and returns the first error (by item order). */
int arena_parallel(unsigned threads, uint64_t n, int (*fn)(void *ctx, uint64_t i), void *ctx);

static inline uint64_t arena_align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

/* ---- dtypes (dtype.c) ----------------------------------------------------- */

uint32_t arena_dtype_block(int dtype);       /* elements per block; 0 if unknown */
uint32_t arena_dtype_block_bytes(int dtype); /* bytes per block; 0 if unknown */
/* Encodes n floats into dtype f32, f16, bf16, q8_0 (n a multiple of 32),
 * q4_K, q5_K or q6_K (n a multiple of 256, values finite). Returns 0,
 * BATON_EINVAL for a bad n or value, or BATON_EUNSUPPORTED for another
 * dtype. */
int arena_encode_row(int dtype, const float *x, uint64_t n, uint8_t *dst);
/* The K-quant part of it (kquant.c): ggml's reference quantizers,
 * quantize_row_q{4,5,6}_K_ref, byte for byte. */
int arena_encode_kquant(int dtype, const float *x, uint64_t n, uint8_t *dst);

/* ---- the validated index of an arena image (open.c) ---------------------- */

struct arena_index {
	struct arena_file_header hdr;    /* private copy, validated */
	struct baton_arena_shape shape;
	struct arena_file_entry *entries; /* private copy of the table */
	uint64_t n_entries;
	uint32_t *expert_ix;             /* [layer * experts + expert] -> entry */
	uint32_t *router_ix;             /* [layer] -> entry, or UINT32_MAX */
	uint32_t *norm_ix;
	uint64_t max_expert_bytes;
	char source[ARENA_SOURCE_LEN];
};

/* Validates a whole arena image of `size` bytes (header, table, every
 * entry's bounds, alignment, sizes, overlaps, coverage) and builds the
 * index. Reads `base` only within [0, size). On failure the index holds
 * nothing to free. */
int arena_index_build(const uint8_t *base, uint64_t size, struct arena_index *ix,
    char *errbuf, size_t errlen);
void arena_index_free(struct arena_index *ix);
/* Names an entry for messages: "layer 3 expert 7", "layer 3 router". */
void arena_entry_name(const struct arena_file_entry *e, char *buf, size_t len);
const char *arena_role_name(uint32_t role);
/* Header checksum of a header image (over its first 1016 bytes). */
uint64_t arena_header_checksum(const struct arena_file_header *h);

/* ---- the builder (build.c) ----------------------------------------------- */

enum { ARENA_DT_GATE, ARENA_DT_UP, ARENA_DT_DOWN, ARENA_DT_ROUTER, ARENA_DT_NORM, ARENA_DT_N };

struct arena_plan {
	struct baton_arena_shape shape;  /* dtypes: layer 0's */
	uint32_t flags;                  /* ARENA_F_* */
	uint32_t *layer_dt;              /* [layer * ARENA_DT_N + ARENA_DT_*] */
	uint32_t source_kind;
	uint64_t source_hash;
	char source[ARENA_SOURCE_LEN];
	/* Fills one blob (all its parts, at e->part[i].offset from dst);
	 * called from several threads at once. */
	int (*fill)(void *ctx, const struct arena_file_entry *e, uint8_t *dst,
	    char *errbuf, size_t errlen);
	void *ctx;
};

int arena_build(const char *path, const struct arena_plan *plan,
    const struct baton_create_opts *opts, struct baton_create_result *res,
    char *errbuf, size_t errlen);

/* ---- sources -------------------------------------------------------------- */

int arena_plan_synthetic(const struct baton_synth_params *p, struct arena_plan *plan,
    char *errbuf, size_t errlen);
void arena_synthetic_free(struct arena_plan *plan);

/* GGUF (gguf.c). Parses a whole file image; tensors point into it. */
struct arena_gguf_tensor {
	const char *name;    /* not NUL-terminated, name_len bytes */
	uint64_t name_len;
	uint32_t n_dims;
	uint32_t type;
	uint64_t ne[4];
	uint64_t offset;     /* absolute, in the image */
	uint64_t bytes;
};

enum { ARENA_GG_GATE, ARENA_GG_UP, ARENA_GG_DOWN, ARENA_GG_ROUTER, ARENA_GG_NORM, ARENA_GG_N };

struct arena_gguf {
	uint32_t version;
	uint64_t n_tensors, n_kv, alignment, data_offset;
	char arch[64];
	uint32_t layers, experts, top_k, d_model, d_ff;
	struct arena_gguf_tensor *tensors;
	uint32_t *layer_t;   /* [layer * ARENA_GG_N + kind] -> tensor, UINT32_MAX if none */
	int has_norm;
	uint64_t header_hash; /* of [0, data_offset) and the size */
};

int arena_gguf_parse(const uint8_t *buf, uint64_t size, struct arena_gguf *g,
    char *errbuf, size_t errlen);
void arena_gguf_free(struct arena_gguf *g);
int arena_plan_gguf(const char *file, struct arena_plan *plan, char *errbuf, size_t errlen);
void arena_gguf_plan_free(struct arena_plan *plan);

/* safetensors (safetensors.c). */
struct arena_st_tensor {
	char *name;
	int dtype;           /* enum baton_dtype, -1 when it has none */
	char st_dtype[16];   /* as the file names it */
	uint32_t n_dims;
	uint64_t shape[8];
	uint64_t offset;     /* absolute, in the shard's image */
	uint64_t bytes;
};

struct arena_st_header {
	uint64_t header_len;
	uint64_t data_offset; /* 8 + header_len */
	struct arena_st_tensor *tensors;
	uint64_t n_tensors;
};

#define ARENA_ST_MAX_HEADER (256u << 20)

/* Parses a safetensors image's header and checks every tensor's range
 * against `size`. */
int arena_st_parse(const uint8_t *buf, uint64_t size, struct arena_st_header *h,
    char *errbuf, size_t errlen);
void arena_st_free(struct arena_st_header *h);
int arena_plan_safetensors(const char *src, uint32_t top_k, struct arena_plan *plan,
    char *errbuf, size_t errlen);
void arena_st_plan_free(struct arena_plan *plan);

#endif
