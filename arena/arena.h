/*
 * arena.h: the public door of the arena component: one read-only, shared
 * host copy of a model's experts under /dev/shm, laid out so that each
 * expert (gate, up and down of one layer) is one contiguous, aligned blob.
 *
 * File format (little endian, version 2), all offsets from the file start:
 *   header   struct arena_file_header (fixed size, see arena_format.h)
 *   table    n_entries x struct arena_file_entry
 *   names    the names of dense tensors and metadata blobs
 *   data     blobs, each aligned to BATON_ARENA_ALIGN
 * Version 2 holds a whole model: the experts as in version 1, every dense
 * tensor by its Hugging Face name (arena_dense), and metadata blobs such as
 * config.json and the tokenizer (arena_blob). An experts-only arena (the
 * synthetic benchmark model, or --experts-only imports) has no architecture
 * and no config. Version 1 files are refused with the command that
 * recreates them.
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
#include <string.h> /* memcpy, for the codec below */

#include "proto/base/base.h"

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

/* ---- the f16 / bf16 codec -------------------------------------------------
 * IEEE binary16 and bfloat16: the one codec of the tree (the arena encodes
 * with it, the engine decodes and encodes with it; static inline because
 * the engine's kernels call it per block inside vectorized loops). Its
 * rules are the hardware's (x86 F16C VCVTPS2PH / VCVTPH2PS, AVX512-BF16
 * VCVTNEPS2BF16), which numpy and torch follow where they use them:
 *   - narrowing rounds to nearest, ties to even; overflow gives infinity,
 *     tiny values subnormals or a signed zero;
 *   - a NaN stays a NaN, quiet, with its sign and the top bits of its
 *     payload (torch's scalar c10::Half / c10::BFloat16 write the canonical
 *     0x7E00 / 0x7FC0 instead: also quiet NaNs);
 *   - f16 widening is exact, a signalling NaN coming back quiet (as from
 *     VCVTPH2PS); bf16 widening is the 16-bit shift.
 * So every 16-bit pattern but a signalling NaN survives a round trip
 * through f32. No tables, no state: thread-safe. arena/dtype_test.c checks
 * it against exact decoders, a rounding found by search and F16C itself. */

static inline uint32_t baton_f32_bits_(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float baton_f32_from_(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* After F. Giesen's float_to_half_fast3_rtne. */
static inline uint16_t baton_f32_to_f16(float f)
{
	uint32_t x = baton_f32_bits_(f);
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t ax = x & 0x7fffffffu;
	uint32_t o;

	if (ax > 0x7f800000u) {
		o = 0x7e00u | ((ax >> 13) & 0x3ffu); /* NaN: quiet, top payload */
	} else if (ax >= 0x477ff000u) {
		o = 0x7c00u; /* infinity, and >= 65520, which rounds to it */
	} else if (ax < 0x38800000u) {
		/* Below 2^-14: a subnormal or zero. Adding 0.5 (whose ulp is
		 * 2^-24) rounds to a multiple of 2^-24 in the FPU, ties to even. */
		o = baton_f32_bits_(baton_f32_from_(ax) + 0.5f) - 0x3f000000u;
	} else {
		uint32_t odd = (ax >> 13) & 1u;
		ax += 0xc8000fffu + odd; /* rebias 127 -> 15 and round */
		o = ax >> 13;
	}
	return (uint16_t)(o | sign);
}

/* Exact: normals by rebiasing the exponent, subnormals as
 * (0.5 + m * 2^-24) - 0.5 (both operands normal, the difference exact),
 * infinities and NaNs by setting the f32 exponent to all ones. */
static inline float baton_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t em = h & 0x7fffu;
	uint32_t r;

	if (em >= 0x7c00u)
		r = 0x7f800000u | (em << 13) | (em > 0x7c00u ? 0x00400000u : 0);
	else if (em < 0x0400u)
		r = baton_f32_bits_(baton_f32_from_(0x3f000000u | em) - 0.5f);
	else
		r = (em << 13) + 0x38000000u;
	return baton_f32_from_(r | sign);
}

static inline uint16_t baton_f32_to_bf16(float f)
{
	uint32_t x = baton_f32_bits_(f);

	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN, sign and top payload */
	x += 0x7fffu + ((x >> 16) & 1u);
	return (uint16_t)(x >> 16);
}

static inline float baton_bf16_to_f32(uint16_t h)
{
	return baton_f32_from_((uint32_t)h << 16);
}

/* ---- K-quant decoding (kquant.c) -------------------------------------------
 * ggml's Q4_K, Q5_K and Q6_K, decoded where they are encoded (kquant.c
 * holds both directions, as ggml does); the host backend's row kernels
 * call it per 256-element super-block. */

/* 1 for q4_K, q5_K and q6_K. */
int baton_kquant_is(int dtype);
/* Decodes one super-block (144, 176 or 210 bytes, any alignment) of a
 * K-quant dtype into out[256], bit for bit as ggml's dequantize_row_*.
 * dtype must be one of the three (baton_kquant_is). */
void baton_kquant_decode_block(int dtype, const uint8_t *blk, float *out);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BATON_KQUANT_AVX2 1
/* The same code built for AVX2 (wider vectors, the same element-wise
 * operations: the same bits), for a caller that has checked that the CPU
 * has AVX2 (the host backend's kernels, baton_kernels_avx2). */
void baton_kquant_decode_block_avx2(int dtype, const uint8_t *blk, float *out);
#else
#define BATON_KQUANT_AVX2 0
#endif

/* ---- the other block types (quant.c) ---------------------------------------
 * ggml's q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, iq4_nl, iq4_xs and mxfp4,
 * decoded bit for bit as ggml's dequantize_row_* (layouts in quant.c), and
 * one entry point for them and the three K-quants above. q8_0 and the
 * 16-bit types are decoded by the host's row kernels themselves. The IQ1,
 * IQ2, IQ3 and TQ families are not decoded (quant.c says why). */

/* 1 for the block types baton_quant_decode handles (the twelve above). */
int baton_quant_decodes(int dtype);
/* Decodes n elements (a multiple of the type's block, 32 or 256) from src,
 * which starts at a block (any alignment), into out[n]. dtype must be one
 * of baton_quant_decodes's. */
void baton_quant_decode(int dtype, const uint8_t *src, float *out, uint32_t n);
#if BATON_KQUANT_AVX2
/* The same built for AVX2 (the same bits), for a caller that has checked
 * the CPU (baton_kernels_avx2). */
void baton_quant_decode_avx2(int dtype, const uint8_t *src, float *out, uint32_t n);
#endif

enum baton_role {
	BATON_ROLE_EXPERT = 0, /* gate+up+down of one (layer, expert): one blob */
	BATON_ROLE_ROUTER = 1,
	BATON_ROLE_NORM = 2,
	BATON_ROLE_DENSE = 3,  /* any other dense tensor, by name (version 2) */
	BATON_ROLE_BLOB = 4,   /* a metadata blob, by key (version 2) */
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

/* A dense tensor: a router or norm of one layer, or any tensor by name.
 * A 1-D tensor has rows = 1. */
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
	uint32_t dtype;   /* f32, f16, bf16, q8_0 (the values quantized), or q4_K,
			   * q6_K (random valid blocks, for benchmarks), for gate,
			   * up and down (and a full model's 2-D weights) */
	uint64_t seed;
	/* A full model of a named architecture (version 2): arch is one of
	 * qwen3_moe, qwen2_moe, mixtral, olmoe, or NULL/"" for the experts-only
	 * model. With an arch, every dense tensor is made too (random, in
	 * `dtype`, norms f32) and a config.json describing it; the fields
	 * below then matter (0: a default derived from d_model). */
	const char *arch;
	uint32_t heads, kv_heads, head_dim, vocab;
	uint32_t shared_ff;   /* qwen2_moe's shared expert width */
	/* A Hugging Face folder whose tokenizer files (tokenizer.json, its
	 * config, the chat template, generation_config.json) go in too, so an
	 * engine can serve text on the random model (benchmarks of the API);
	 * NULL for none. Whole models only. */
	const char *tokenizer;
};

/* Fills p with a named preset's shape (e.g. "qwen3-30b-a3b",
 * "qwen3-235b-a22b", "mixtral-8x7b", "olmoe-1b-7b", "qwen1.5-moe-a2.7b"),
 * keeping p->dtype and p->seed. BATON_ENOTFOUND for an unknown name. */
int arena_synth_preset(const char *name, struct baton_synth_params *p);

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

/* ---- version 2: the whole model ------------------------------------------ */

/* The architecture as Hugging Face's config.json names it (model_type):
 * "qwen3_moe", "qwen2_moe", "mixtral", "olmoe"; "" for an experts-only
 * arena. Never NULL. */
const char *arena_arch(const struct baton_arena *a);

/* A dense tensor by its Hugging Face name, e.g. "model.embed_tokens.weight",
 * "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.q_proj.bias",
 * "model.layers.3.mlp.gate.weight", "model.norm.weight", "lm_head.weight".
 * rows/cols as for every tensor here (ggml's: rows of cols elements; 1-D
 * has rows = 1); any dtype, byte-exact from the source. GGUF sources are
 * stored under the Hugging Face names, with llama.cpp's Q/K row permutation
 * (llama-family: mixtral) undone, so every arena uses Hugging Face's
 * rotate_half RoPE layout. The routers and post-attention norms are found
 * here by name too (and through arena_tensor as ROUTER and NORM).
 * Mixtral's router is "model.layers.N.block_sparse_moe.gate.weight", every
 * other architecture's "model.layers.N.mlp.gate.weight".
 * BATON_ENOTFOUND when absent. `out->data` points into the mapping. */
int arena_dense(const struct baton_arena *a, const char *name, struct baton_arena_tensor *out);
/* Every dense tensor, sorted by name: count, and the i-th (name stays valid
 * until arena_close). BATON_ENOTFOUND when i >= count. */
uint64_t arena_dense_count(const struct baton_arena *a);
int arena_dense_at(const struct baton_arena *a, uint64_t i, const char **name,
    struct baton_arena_tensor *out);

/* A metadata blob by key: "config.json" (Hugging Face's, verbatim from an
 * HF folder; for a GGUF source made from its keys with HF field names),
 * "tokenizer.json", "tokenizer_config.json", "generation_config.json" (HF
 * folders, verbatim, when present), "gguf_tokenizer.json" (GGUF sources:
 * every tokenizer.ggml.* key and tokenizer.chat_template as one JSON object
 * keyed by the GGUF names). *data points into the read-only mapping; the
 * bytes are not NUL-terminated. BATON_ENOTFOUND when absent. */
int arena_blob(const struct baton_arena *a, const char *key, const void **data, uint64_t *len);
uint64_t arena_blob_count(const struct baton_arena *a);
int arena_blob_at(const struct baton_arena *a, uint64_t i, const char **key,
    const void **data, uint64_t *len);

/* 0 while the file still covers the whole mapping. BATON_ETRUNCATED, with
 * the reason in errbuf, once it shrank (truncated in place; latched, as
 * grown back the lost part reads zeros) or a read of the mapping faulted: reads of the lost part yield zeros instead of
 * SIGBUS (see guard.c), so a caller that copied from the arena checks
 * this afterwards and discards what it copied. */
int arena_intact(struct baton_arena *a, char *errbuf, size_t errlen);

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
	/* GGUF and safetensors: 0 imports the whole model (an architecture
	 * this build supports, every tensor it needs; anything else is refused
	 * by name); 1 imports only the experts, routers and norms of any MoE
	 * (version 1's behaviour, for the cache benchmarks). */
	int experts_only;
};

struct baton_create_opts {
	int force;        /* rebuild even when a valid arena of this source exists */
	unsigned threads; /* 0: every online CPU */
	/* Optional: called after each blob is written, with the bytes of the
	 * blobs written so far and of all of them (the last call has done ==
	 * total). From the writing threads, one call at a time. */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	/* Optional: called once the source is read and before anything is
	 * written (the directory, the lock, the file), with a lookup of the
	 * metadata blobs the arena will hold (`blob(blobs, key, &data, &len)`:
	 * 0 and the bytes, or nonzero when there is none); a nonzero return
	 * refuses the import with that code and the message left in errbuf.
	 * baton-arena's main sets it to load the tokenizer with text/ (a layer
	 * above this one), so an import refuses what an engine would refuse. */
	int (*check)(void *ctx, int (*blob)(void *blobs, const char *key, const void **data, uint64_t *len),
	    void *blobs, char *errbuf, size_t errlen);
	void *check_ctx;
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
