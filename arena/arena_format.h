/*
 * arena_format.h: the on-disk structures of an arena file (internal).
 *
 * Little endian, version 2. All offsets are from the start of the file.
 *
 *   [0, 1024)                      struct arena_file_header
 *   [table_offset, +n*144)         struct arena_file_entry[n_entries]
 *   [names_offset, +names_bytes)   names of the named entries, not terminated
 *   [data_offset, file_bytes)      blobs, each aligned to BATON_ARENA_ALIGN
 *
 * Blobs: every expert (layer-major, expert-minor) first, consecutive, then
 * the named entries: routers and norms (role ROUTER, NORM, one per layer
 * when the header's flags say so), every other dense tensor (DENSE) and the
 * metadata blobs (BLOB). An expert blob holds gate, up and down, each part
 * aligned to ARENA_PART_ALIGN inside it. Every entry but an expert has a
 * name (printable ASCII, 1..ARENA_MAX_NAME bytes): ROUTER, NORM and DENSE
 * names are unique among themselves (Hugging Face tensor names), BLOB keys
 * among themselves. A DENSE or ROUTER/NORM entry is one part (a tensor); a
 * BLOB has no part and holds `bytes` bytes of metadata.
 *
 * Version 1 (no names, no DENSE/BLOB) is refused with the command that
 * recreates the file.
 *
 * Publication: the header's `sealed`, `generation` and `header_checksum` are
 * written last; a file without them is refused by arena_open().
 */
#ifndef BATON_ARENA_FORMAT_H
#define BATON_ARENA_FORMAT_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the arena format is little endian; add byte swaps for this host"
#endif

#define ARENA_MAGIC "BATONARN"
#define ARENA_MAGIC_LEN 8u
#define ARENA_VERSION 2u
#define ARENA_SEALED 0x4c414553u /* "SEAL" */
#define ARENA_HEADER_BYTES 1024u
#define ARENA_ENTRY_BYTES 144u
#define ARENA_PART_ALIGN 256u
#define ARENA_MAX_DIM (1u << 20) /* d_model, d_ff: exclusive bound */
#define ARENA_SOURCE_LEN 256u
#define ARENA_ARCH_LEN 32u
#define ARENA_MAX_NAME 255u            /* bytes of one name or key */
#define ARENA_MAX_NAMES (64u << 20)    /* bytes of the names region */
#define ARENA_MAX_NAMED (1u << 20)     /* DENSE entries */
#define ARENA_MAX_BLOBS 64u
#define ARENA_MAX_BLOB (256u << 20)    /* bytes of one metadata blob */
#define ARENA_MAX_DENSE_ROWS (1u << 24) /* rows of a dense tensor (vocabulary) */

/* header.flags */
enum {
	ARENA_F_ROUTER = 1u, /* every layer has a router entry */
	ARENA_F_NORM = 2u,   /* every layer has a norm entry */
	ARENA_F_MODEL = 4u,  /* a whole model: arch set, a config.json blob */
	ARENA_F_ALL = 7u,
};

/* header.source_kind */
enum {
	ARENA_SRC_SYNTHETIC = 1,
	ARENA_SRC_GGUF = 2,
	ARENA_SRC_SAFETENSORS = 3,
};

struct arena_file_header {
	char magic[8];             /*   0: "BATONARN" */
	uint32_t version;          /*   8: ARENA_VERSION */
	uint32_t header_bytes;     /*  12: sizeof(struct arena_file_header) */
	uint32_t entry_bytes;      /*  16: sizeof(struct arena_file_entry) */
	uint32_t sealed;           /*  20: ARENA_SEALED once complete, else 0 */
	uint64_t generation;       /*  24: nonzero once sealed */
	uint64_t file_bytes;       /*  32: size of the whole file */
	uint64_t table_offset;     /*  40 */
	uint64_t n_entries;        /*  48 */
	uint64_t data_offset;      /*  56: BATON_ARENA_ALIGN aligned */
	uint64_t table_checksum;   /*  64: XXH3-64 of the table */
	uint64_t source_hash;      /*  72: identity of the source (reuse check) */
	uint32_t source_kind;      /*  80: ARENA_SRC_* */
	uint32_t flags;            /*  84: ARENA_F_* */
	uint32_t layers;           /*  88 */
	uint32_t experts;          /*  92 */
	uint32_t top_k;            /*  96 */
	uint32_t d_model;          /* 100 */
	uint32_t d_ff;             /* 104 */
	uint32_t gate_dtype;       /* 108: of layer 0; entries carry their own */
	uint32_t up_dtype;         /* 112 */
	uint32_t down_dtype;       /* 116 */
	uint32_t router_dtype;     /* 120 */
	uint32_t norm_dtype;       /* 124 */
	uint64_t max_expert_bytes; /* 128: largest expert blob, not rounded */
	uint64_t created_ns;       /* 136: CLOCK_REALTIME at sealing */
	char source[ARENA_SOURCE_LEN]; /* 144: NUL-terminated description */
	uint64_t names_offset;     /* 400: the names region, after the table */
	uint64_t names_bytes;      /* 408: <= ARENA_MAX_NAMES, ends by data_offset */
	uint64_t n_dense;          /* 416: entries of role DENSE */
	uint64_t n_blobs;          /* 424: entries of role BLOB */
	char arch[ARENA_ARCH_LEN]; /* 432: model_type, NUL-padded; "" experts-only */
	uint8_t reserved[1016 - 464];  /* 464: zero */
	uint64_t header_checksum;  /* 1016: XXH3-64 of bytes [0, 1016) */
};

struct arena_file_part {
	uint32_t dtype;  /* enum baton_dtype */
	uint32_t rows;
	uint32_t cols;
	uint32_t reserved;
	uint64_t offset; /* inside the blob */
	uint64_t bytes;  /* rows * baton_dtype_row_bytes(dtype, cols) */
};

struct arena_file_entry {
	uint32_t layer;
	uint32_t expert;   /* 0 for router and norm */
	uint32_t role;     /* enum baton_role */
	uint32_t n_parts;  /* 3 for an expert (gate, up, down), else 1 */
	uint64_t offset;   /* of the blob in the file */
	uint64_t bytes;    /* of the blob: end of its last part */
	uint64_t checksum; /* XXH3-64 of the blob */
	uint32_t name_off; /* in the names region; 0 for an expert */
	uint32_t name_len; /* 0 for an expert, else 1..ARENA_MAX_NAME */
	struct arena_file_part part[3];
};

static_assert(sizeof(struct arena_file_header) == ARENA_HEADER_BYTES, "header size");
static_assert(offsetof(struct arena_file_header, source) == 144, "header layout");
static_assert(offsetof(struct arena_file_header, header_checksum) == 1016, "header layout");
static_assert(offsetof(struct arena_file_header, arch) == 432, "header layout");
static_assert(sizeof(struct arena_file_part) == 32, "part size");
static_assert(sizeof(struct arena_file_entry) == ARENA_ENTRY_BYTES, "entry size");

#endif
