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
/* Writes a message to errbuf (when not NULL) and returns err: base.h's
 * baton_fail under the arena's name. */
#define arena_errf baton_fail
/* Number of worker threads for `want` (0: online CPUs), at most `work`. */
unsigned arena_threads(unsigned want, uint64_t work);
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
	char *strs;                      /* every name, NUL-terminated (private) */
	uint32_t *dense_ix;              /* ROUTER, NORM and DENSE entries by name */
	uint64_t n_dense_ix;
	uint32_t *blob_ix;               /* BLOB entries by key */
	uint64_t n_blob_ix;
	char **name_str;                 /* [entry] -> NUL-terminated name, or NULL */
	uint64_t max_expert_bytes;
	char source[ARENA_SOURCE_LEN];
	char arch[ARENA_ARCH_LEN];
};

/* Validates a whole arena image of `size` bytes (header, table, every
 * entry's bounds, alignment, sizes, overlaps, coverage) and builds the
 * index. Reads `base` only within [0, size). On failure the index holds
 * nothing to free. */
int arena_index_build(const uint8_t *base, uint64_t size, struct arena_index *ix,
    char *errbuf, size_t errlen);
void arena_index_free(struct arena_index *ix);
/* Names an entry for messages: "layer 3 expert 7", "layer 3 router",
 * "model.norm.weight", "metadata config.json". `name` is the entry's name
 * once checked, else NULL. */
void arena_entry_name(const struct arena_file_entry *e, const char *name, char *buf,
    size_t len);
const char *arena_role_name(uint32_t role);
/* The table checksum: XXH3-64 of the table, then of the names region. */
uint64_t arena_table_checksum(const void *table, size_t tbytes, const void *names,
    size_t nbytes);
/* Header checksum of a header image (over its first 1016 bytes). */
uint64_t arena_header_checksum(const struct arena_file_header *h);

/* ---- creating an arena, bottom to top: the plan (plan.c), the planners
 * (synth.c, gguf.c, safetensors.c: below), the builder (build.c), and
 * the dispatcher on top (create.c: arena_create, arena.h) ---------------- */

enum { ARENA_DT_GATE, ARENA_DT_UP, ARENA_DT_DOWN, ARENA_DT_ROUTER, ARENA_DT_NORM, ARENA_DT_N };

/* A named entry of a plan: a router, norm or other dense tensor, or a
 * metadata blob. */
struct arena_named {
	char name[ARENA_MAX_NAME + 1];
	uint32_t role;               /* BATON_ROLE_ROUTER, NORM, DENSE or BLOB */
	uint32_t layer;              /* ROUTER and NORM */
	uint32_t dtype, rows, cols;  /* tensors */
	uint64_t bytes;              /* BLOB: its length */
	void *data;                  /* BLOB: its bytes, owned by the plan (free) */
	uint64_t src;                /* the source's own reference */
	uint64_t aux;                /* the source's own (e.g. a row permutation) */
};

struct arena_plan {
	struct baton_arena_shape shape;  /* dtypes: layer 0's */
	uint32_t flags;                  /* ARENA_F_* (ROUTER and NORM: from named) */
	uint32_t *layer_dt;              /* [layer * ARENA_DT_N + ARENA_DT_*] */
	uint32_t source_kind;
	uint64_t source_hash;
	char source[ARENA_SOURCE_LEN];
	char arch[ARENA_ARCH_LEN];       /* "" for experts only */
	struct arena_named *named;       /* laid out after the experts, in order */
	uint64_t n_named, cap_named;
	/* Fills one blob: an expert (all its parts, at e->part[i].offset from
	 * dst; n NULL) or a named tensor (n its plan entry). Blobs are copied
	 * by the builder. Called from several threads at once. */
	int (*fill)(void *ctx, const struct arena_file_entry *e, const struct arena_named *n,
	    uint8_t *dst, char *errbuf, size_t errlen);
	void *ctx;
};

/* plan.c: appends a named entry (zeroed, name set); NULL when out of
 * memory or the name is longer than ARENA_MAX_NAME. */
struct arena_named *arena_plan_add(struct arena_plan *p, uint32_t role, const char *name);
/* plan.c: a model's tensor m as an entry of the source's dtype, found in
 * the source at src; BATON_ENOMEM (said in errbuf) when it cannot be added. */
struct arena_model_tensor;
int arena_plan_add_tensor(struct arena_plan *p, const struct arena_model_tensor *m, uint32_t dtype, uint64_t src,
    char *errbuf, size_t errlen);
/* safetensors.c: the tokenizer files of the Hugging Face folder dir (all
 * but config.json; tokenizer.json required) as blobs, folded into *hsum. */
int arena_plan_add_tokenizer(struct arena_plan *plan, const char *dir, uint64_t *hsum,
    char *errbuf, size_t errlen);
/* plan.c: a blob that takes ownership of `data` (malloc'd; freed on
 * failure too). */
int arena_plan_add_blob(struct arena_plan *p, const char *key, void *data, uint64_t len,
    char *errbuf, size_t errlen);
/* Frees the named list and the blobs' data. */
void arena_plan_free_named(struct arena_plan *p);
/* build.c: 0 when `dir` may hold arenas: a real directory (not a link), owned by
 * this user or root, writable by no one else (root's sticky directories
 * excepted). BATON_EPERM, with the reason in errbuf, otherwise. */
int arena_check_dir(const char *dir, char *errbuf, size_t errlen);
/* guard.c: reads of [base, base+size) that fault because the file shrank
 * read zeros instead of killing the process, and are counted; with
 * `writable`, writes that fault (a full tmpfs) go to a scratch page and
 * are counted. add returns a slot (-1 when all are taken: unguarded). */
int arena_guard_add(const void *base, uint64_t size, int writable);
void arena_guard_remove(int slot);
unsigned arena_guard_faults(int slot);

/* build.c: writes the plan's arena at path and publishes it (build.c's
 * top comment has the steps). */
int arena_build(const char *path, const struct arena_plan *plan,
    const struct baton_create_opts *opts, struct baton_create_result *res,
    char *errbuf, size_t errlen);

/* ---- architectures (model.c) ---------------------------------------------- */

/* The architectures a whole-model arena may hold (Hugging Face model_type). */
int arena_arch_known(const char *arch);

/* What the importers and the synthetic model need to know of a model. */
struct arena_model_cfg {
	char arch[ARENA_ARCH_LEN];  /* Hugging Face model_type */
	uint32_t layers, hidden, heads, kv_heads, head_dim, experts, top_k;
	uint32_t moe_ff;            /* an expert's width */
	uint32_t shared_ff;         /* qwen2_moe's shared expert */
	uint32_t dense_ff;          /* intermediate_size of a dense MLP (informative) */
	uint32_t vocab, max_pos;
	int tie;                    /* tie_word_embeddings */
	int norm_topk;              /* -1: the architecture's own rule */
	int qkv_bias;               /* q/k/v biases (qwen2_moe) */
	double rms_eps, rope_theta;
	/* Rope scaling, from GGUF's <arch>.rope.scaling.* (config.json's
	 * rope_parameters when written): rope_type "" (the default), "linear"
	 * or "yarn"; the yarn fields 0 where the file has none. */
	char rope_type[8];
	double rope_factor, rope_attn, rope_beta_fast, rope_beta_slow;
	uint32_t rope_orig;
	int64_t bos, eos;           /* -1: none */
};

/* One dense tensor a model has, by Hugging Face name. */
struct arena_model_tensor {
	char name[ARENA_MAX_NAME + 1];
	uint32_t role;      /* ROUTER, NORM or DENSE */
	uint32_t layer;
	uint32_t rows, cols;
	int required;       /* 0: lm_head of a tied model */
	int kind;           /* ARENA_MT_*: for the synthetic values and GGUF's Q/K */
};

enum { ARENA_MT_WEIGHT, ARENA_MT_NORM, ARENA_MT_BIAS, ARENA_MT_Q, ARENA_MT_K };

/* Reads and checks a Hugging Face config.json: a supported model_type and
 * nothing the forward pass does not do (rope scaling, sliding windows,
 * dense layers between MoE layers, quantization...), each refused by name. */
int arena_model_from_config(const void *json_obj, struct arena_model_cfg *c,
    char *errbuf, size_t errlen);
/* An HF-style config.json for c (malloc'd, *len bytes). */
char *arena_model_config_json(const struct arena_model_cfg *c, uint64_t *len);
/* Every dense tensor of c, sorted by name; the caller frees *out. */
int arena_model_tensors(const struct arena_model_cfg *c, struct arena_model_tensor **out,
    uint64_t *n, char *errbuf, size_t errlen);
/* The router's Hugging Face name for layer l. */
void arena_model_router_name(const char *arch, uint32_t l, char *buf, size_t len);
/* The sorted list's entry named `name`, or NULL. */
struct arena_model_tensor *arena_model_find(struct arena_model_tensor *v, uint64_t n,
    const char *name);

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

/* GGUF metadata value types. */
enum { ARENA_GT_U8, ARENA_GT_I8, ARENA_GT_U16, ARENA_GT_I16, ARENA_GT_U32, ARENA_GT_I32,
	ARENA_GT_F32, ARENA_GT_BOOL, ARENA_GT_STRING, ARENA_GT_ARRAY, ARENA_GT_U64, ARENA_GT_I64,
	ARENA_GT_F64 };

/* One metadata key-value; its value was checked to lie within the file. */
struct arena_gguf_kv {
	const char *key;     /* not NUL-terminated, key_len bytes */
	uint64_t key_len;
	uint32_t type;
	uint64_t pos;        /* of the value, in the image */
};

struct arena_gguf {
	uint32_t version;
	uint64_t n_tensors, n_kv, alignment, data_offset;
	char arch[64];
	uint32_t layers, experts, top_k, d_model, d_ff;
	struct arena_gguf_tensor *tensors;
	struct arena_gguf_kv *kvs;
	uint32_t *layer_t;   /* [layer * ARENA_GG_N + kind] -> tensor, UINT32_MAX if none */
	int has_norm;
	uint64_t header_hash; /* of [0, data_offset) and the size */
};

int arena_gguf_parse(const uint8_t *buf, uint64_t size, struct arena_gguf *g,
    char *errbuf, size_t errlen);
void arena_gguf_free(struct arena_gguf *g);
const struct arena_gguf_kv *arena_gguf_kv_find(const struct arena_gguf *g, const char *key);
/* An integer value of any integer type, when non-negative; -1 otherwise. */
int arena_gguf_kv_uint(const uint8_t *b, const struct arena_gguf_kv *kv, uint64_t *v);
/* The whole model of a parsed GGUF (gguf_model.c): named entries under the
 * Hugging Face names, config.json and gguf_tokenizer.json blobs; the fill
 * of a named entry is arena_gguf_fill_named. */
int arena_gguf_plan_model(const uint8_t *buf, const struct arena_gguf *g, struct arena_plan *plan,
    char *errbuf, size_t errlen);
void arena_gguf_fill_named(const uint8_t *buf, const struct arena_gguf *g,
    const struct arena_named *n, uint8_t *dst);
int arena_plan_gguf(const char *file, int experts_only, struct arena_plan *plan, char *errbuf,
    size_t errlen);
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
int arena_plan_safetensors(const char *src, uint32_t top_k, int experts_only,
    struct arena_plan *plan, char *errbuf, size_t errlen);
void arena_st_plan_free(struct arena_plan *plan);

#endif
