/*
 * open.c: opening an arena. The file is untrusted input: the header and
 * the table are copied out of the mapping first, then every count, offset
 * and size is checked before anything is used, and lookups read only the
 * private copies. A file changed under the mapping afterwards can give
 * wrong bytes, never an out-of-bounds read.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena/arena_int.h"

struct baton_arena {
	const uint8_t *base;
	uint64_t size;
	struct arena_index ix;
	char path[256];
	int fd;     /* kept open: arena_intact fstats it */
	int guard;  /* guard.c's slot, or -1 */
	uint64_t shrank_to; /* the size arena_intact saw below a->size; latched */
	int shrank;
};

const char *arena_role_name(uint32_t role)
{
	switch (role) {
	case BATON_ROLE_EXPERT: return "expert";
	case BATON_ROLE_ROUTER: return "router";
	case BATON_ROLE_NORM: return "norm";
	case BATON_ROLE_DENSE: return "dense";
	case BATON_ROLE_BLOB: return "metadata";
	default: return "unknown";
	}
}

void arena_entry_name(const struct arena_file_entry *e, const char *name, char *buf, size_t len)
{
	if (e->role == BATON_ROLE_EXPERT)
		snprintf(buf, len, "layer %" PRIu32 " expert %" PRIu32, e->layer, e->expert);
	else if (name && e->role == BATON_ROLE_BLOB)
		snprintf(buf, len, "metadata %s", name);
	else if (name)
		snprintf(buf, len, "%s", name);
	else if (e->role == BATON_ROLE_ROUTER || e->role == BATON_ROLE_NORM)
		snprintf(buf, len, "layer %" PRIu32 " %s", e->layer, arena_role_name(e->role));
	else
		snprintf(buf, len, "a %s entry", arena_role_name(e->role));
}

uint64_t arena_header_checksum(const struct arena_file_header *h)
{
	return arena_hash(h, offsetof(struct arena_file_header, header_checksum));
}

uint64_t arena_table_checksum(const void *table, size_t tbytes, const void *names, size_t nbytes)
{
	uint64_t two[2] = { arena_hash(table, tbytes), arena_hash(names, nbytes) };
	return arena_hash(two, sizeof two);
}

void arena_index_free(struct arena_index *ix)
{
	free(ix->entries);
	free(ix->expert_ix);
	free(ix->router_ix);
	free(ix->norm_ix);
	free(ix->strs);
	free(ix->dense_ix);
	free(ix->blob_ix);
	free(ix->name_str);
	memset(ix, 0, sizeof *ix);
}

/* A version 1 file: say how to make it again, from what its header says
 * (the v1 header has the source kind, shape and description at the same
 * offsets; it is only words in a message, so a forged one harms nothing). */
static int refuse_v1(const struct arena_file_header *h, char *errbuf, size_t errlen)
{
	char src[ARENA_SOURCE_LEN];
	size_t n = 0;
	for (; n < ARENA_SOURCE_LEN - 1 && h->source[n]; n++)
		src[n] = h->source[n] >= 0x20 && h->source[n] < 0x7f ? h->source[n] : '?';
	src[n] = '\0';
	char cmd[512];
	if (h->source_kind == ARENA_SRC_SYNTHETIC) {
		unsigned long long seed = 0;
		char dt[16] = "f16";
		const char *sp = strstr(src, "seed="), *dp = strstr(src, "dtype=");
		if (sp)
			seed = strtoull(sp + 5, NULL, 10);
		if (dp)
			snprintf(dt, sizeof dt, "%.*s", (int)strcspn(dp + 6, " "), dp + 6);
		snprintf(cmd, sizeof cmd,
		    "baton-arena create --synthetic --layers %" PRIu32 " --experts %" PRIu32
		    " --top-k %" PRIu32 " --d-model %" PRIu32 " --d-ff %" PRIu32 " --dtype %s --seed %llu"
		    " --force PATH", h->layers, h->experts, h->top_k, h->d_model, h->d_ff, dt, seed);
	} else if (h->source_kind == ARENA_SRC_GGUF) {
		snprintf(cmd, sizeof cmd, "baton-arena create --gguf FILE --force PATH (it was made "
		    "from %s)", src);
	} else {
		snprintf(cmd, sizeof cmd, "baton-arena create --safetensors DIR --force PATH (it was "
		    "made from %s)", src);
	}
	return arena_errf(errbuf, errlen, BATON_EFORMAT,
	    "arena format version 1 (experts only); this build reads version %u, which holds the "
	    "whole model. Recreate it: %s", ARENA_VERSION, cmd);
}

static int check_header(const struct arena_file_header *h, uint64_t size,
    char *errbuf, size_t errlen)
{
	if (h->version == 1)
		return refuse_v1(h, errbuf, errlen);
	if (h->version != ARENA_VERSION)
		return arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "arena format version %" PRIu32 ", this build reads version %u",
		    h->version, ARENA_VERSION);
	if (h->header_bytes != ARENA_HEADER_BYTES || h->entry_bytes != ARENA_ENTRY_BYTES)
		return arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "header/entry sizes %" PRIu32 "/%" PRIu32 ", want %u/%u",
		    h->header_bytes, h->entry_bytes, ARENA_HEADER_BYTES, ARENA_ENTRY_BYTES);
	if (h->sealed != ARENA_SEALED || h->generation == 0)
		return arena_errf(errbuf, errlen, BATON_EUNSEALED,
		    "arena is not sealed (its creator did not finish)");
	if (arena_header_checksum(h) != h->header_checksum)
		return arena_errf(errbuf, errlen, BATON_ECHECKSUM,
		    "header checksum mismatch");
	if (size < h->file_bytes)
		return arena_errf(errbuf, errlen, BATON_ETRUNCATED,
		    "file is truncated: %" PRIu64 " bytes, header says %" PRIu64,
		    size, h->file_bytes);
	if (size > h->file_bytes)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "file is %" PRIu64 " bytes, header says %" PRIu64 " (trailing data)",
		    size, h->file_bytes);

	/* Counts. */
	if (h->layers == 0 || h->layers > BATON_ARENA_MAX_LAYERS)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "absurd layer count %" PRIu32 " (1..%u)", h->layers, BATON_ARENA_MAX_LAYERS);
	if (h->experts == 0 || h->experts > BATON_ARENA_MAX_EXPERTS)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "absurd expert count %" PRIu32 " (1..%u)", h->experts, BATON_ARENA_MAX_EXPERTS);
	if (h->top_k == 0 || h->top_k > h->experts)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "absurd top-k %" PRIu32 " for %" PRIu32 " experts", h->top_k, h->experts);
	if (h->d_model == 0 || h->d_model >= ARENA_MAX_DIM)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "absurd d_model %" PRIu32 " (1..%u)", h->d_model, ARENA_MAX_DIM - 1);
	if (h->d_ff == 0 || h->d_ff >= ARENA_MAX_DIM)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "absurd d_ff %" PRIu32 " (1..%u)", h->d_ff, ARENA_MAX_DIM - 1);
	if (h->flags & ~(uint32_t)ARENA_F_ALL)
		return arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "unknown header flags 0x%" PRIx32, h->flags);
	if (h->n_dense > ARENA_MAX_NAMED || h->n_blobs > ARENA_MAX_BLOBS)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "absurd counts: %" PRIu64 " dense tensors (at most %u), %" PRIu64
		    " metadata blobs (at most %u)", h->n_dense, ARENA_MAX_NAMED, h->n_blobs,
		    ARENA_MAX_BLOBS);
	uint64_t want = (uint64_t)h->layers * h->experts + h->n_dense + h->n_blobs;
	if (h->flags & ARENA_F_ROUTER)
		want += h->layers;
	if (h->flags & ARENA_F_NORM)
		want += h->layers;
	if (h->n_entries != want)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "table has %" PRIu64 " entries, the shape needs %" PRIu64,
		    h->n_entries, want);
	const uint32_t dts[5] = { h->gate_dtype, h->up_dtype, h->down_dtype,
		h->router_dtype, h->norm_dtype };
	for (int i = 0; i < 5; i++)
		if (!baton_dtype_name((int)dts[i]))
			return arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "unknown dtype %" PRIu32 " in the header", dts[i]);
	/* The architecture: NUL-terminated, known, and there iff a model. */
	if (memchr(h->arch, '\0', sizeof h->arch) == NULL)
		return arena_errf(errbuf, errlen, BATON_EFORMAT, "architecture name not terminated");
	if (h->arch[0] && !arena_arch_known(h->arch)) {
		char a[ARENA_ARCH_LEN];
		size_t i = 0;
		for (; h->arch[i]; i++)
			a[i] = h->arch[i] >= 0x20 && h->arch[i] < 0x7f ? h->arch[i] : '?';
		a[i] = '\0';
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "architecture \"%s\" is not one this build knows (qwen3_moe, qwen2_moe, mixtral, "
		    "olmoe)", a);
	}
	if (!h->arch[0] != !(h->flags & ARENA_F_MODEL))
		return arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "the model flag and the architecture name disagree");

	/* The table, the names and the data region. */
	if (h->table_offset < ARENA_HEADER_BYTES || h->table_offset % 8)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "table offset %" PRIu64 " inside the header or misaligned", h->table_offset);
	uint64_t table_end = h->table_offset + h->n_entries * ARENA_ENTRY_BYTES;
	if (h->table_offset > size || table_end > size || table_end < h->table_offset)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "table [%" PRIu64 ", +%" PRIu64 " entries) past the end of the %" PRIu64 "-byte file",
		    h->table_offset, h->n_entries, size);
	if (h->names_bytes > ARENA_MAX_NAMES || h->names_offset < table_end ||
	    h->names_offset > size || h->names_bytes > size - h->names_offset)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "names [%" PRIu64 ", +%" PRIu64 ") overlap the table, are past the end or larger "
		    "than %u bytes", h->names_offset, h->names_bytes, ARENA_MAX_NAMES);
	if (h->data_offset < h->names_offset + h->names_bytes || h->data_offset > size ||
	    h->data_offset % BATON_ARENA_ALIGN)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "data offset %" PRIu64 " overlaps the table or names, is past the end or is misaligned",
		    h->data_offset);
	return 0;
}

static int check_part(const struct arena_file_entry *e, const char *ename, int i, uint32_t rows,
    uint32_t cols, const char *what, uint64_t min_off, char *errbuf, size_t errlen)
{
	const struct arena_file_part *p = &e->part[i];
	char name[ARENA_MAX_NAME + 64];
	arena_entry_name(e, ename, name, sizeof name);
	if (!baton_dtype_name((int)p->dtype))
		return arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "%s %s: unknown dtype %" PRIu32, name, what, p->dtype);
	if (p->rows != rows || p->cols != cols)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s %s: shape %" PRIu32 "x%" PRIu32 ", the model needs %" PRIu32 "x%" PRIu32,
		    name, what, p->rows, p->cols, rows, cols);
	uint64_t rb = baton_dtype_row_bytes((int)p->dtype, cols);
	if (rb == 0)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s %s: %" PRIu32 " columns do not fit %s blocks of %" PRIu32,
		    name, what, cols, baton_dtype_name((int)p->dtype),
		    arena_dtype_block((int)p->dtype));
	uint64_t bytes = rb * rows; /* < 2^24 * 2^20 * 8: no overflow */
	if (p->bytes != bytes)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s %s: %" PRIu64 " bytes, %s %" PRIu32 "x%" PRIu32 " takes %" PRIu64,
		    name, what, p->bytes, baton_dtype_name((int)p->dtype), rows, cols, bytes);
	if (p->offset % ARENA_PART_ALIGN || p->offset < min_off)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s %s: offset %" PRIu64 " in the blob misaligned or overlapping the part before",
		    name, what, p->offset);
	if (p->offset > e->bytes || p->bytes > e->bytes - p->offset)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s %s: [%" PRIu64 ", +%" PRIu64 ") past the end of its %" PRIu64 "-byte blob",
		    name, what, p->offset, p->bytes, e->bytes);
	return 0;
}

/* An entry's name: within the names region, 1..ARENA_MAX_NAME printable
 * ASCII bytes for every entry but an expert, none for an expert. */
static int check_name(const struct arena_file_header *h, const struct arena_file_entry *e,
    const char *names, uint64_t idx, char *errbuf, size_t errlen)
{
	if (e->role == BATON_ROLE_EXPERT) {
		if (e->name_len || e->name_off)
			return arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "entry %" PRIu64 " (an expert) has a name", idx);
		return 0;
	}
	if (e->name_len == 0 || e->name_len > ARENA_MAX_NAME || e->name_off > h->names_bytes ||
	    e->name_len > h->names_bytes - e->name_off)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "entry %" PRIu64 ": name [%" PRIu32 ", +%" PRIu32 ") empty, too long or outside "
		    "the %" PRIu64 "-byte names region", idx, e->name_off, e->name_len, h->names_bytes);
	for (uint32_t i = 0; i < e->name_len; i++) {
		unsigned char c = (unsigned char)names[e->name_off + i];
		if (c < 0x21 || c > 0x7e)
			return arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "entry %" PRIu64 ": name has a byte 0x%02x (printable ASCII only)", idx, c);
	}
	return 0;
}

static int check_entry(const struct arena_file_header *h, const struct arena_file_entry *e,
    const char *ename, uint64_t idx, char *errbuf, size_t errlen)
{
	char name[ARENA_MAX_NAME + 64];
	if (e->role > BATON_ROLE_BLOB)
		return arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "entry %" PRIu64 ": unknown role %" PRIu32, idx, e->role);
	arena_entry_name(e, ename, name, sizeof name);
	int per_layer = e->role == BATON_ROLE_ROUTER || e->role == BATON_ROLE_NORM;
	if (e->role == BATON_ROLE_EXPERT
		? e->layer >= h->layers || e->expert >= h->experts
		: e->expert != 0 || (per_layer ? e->layer >= h->layers : e->layer != 0))
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "entry %" PRIu64 " (%s) out of the shape %" PRIu32 "x%" PRIu32,
		    idx, name, h->layers, h->experts);
	if (e->offset < h->data_offset || e->offset > h->file_bytes ||
	    e->bytes > h->file_bytes - e->offset || e->bytes == 0)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s: blob [%" PRIu64 ", +%" PRIu64 ") outside the data region [%" PRIu64 ", %" PRIu64 ")",
		    name, e->offset, e->bytes, h->data_offset, h->file_bytes);
	if (e->offset % BATON_ARENA_ALIGN)
		return arena_errf(errbuf, errlen, BATON_EBOUNDS,
		    "%s: blob offset %" PRIu64 " not aligned to %u", name, e->offset, BATON_ARENA_ALIGN);
	int rc;
	switch (e->role) {
	case BATON_ROLE_EXPERT:
		if (e->n_parts != 3)
			return arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "%s: %" PRIu32 " parts, an expert has 3", name, e->n_parts);
		if (e->part[0].offset != 0)
			return arena_errf(errbuf, errlen, BATON_EBOUNDS,
			    "%s: gate does not start the blob", name);
		if ((rc = check_part(e, ename, 0, h->d_ff, h->d_model, "gate", 0, errbuf, errlen)) ||
		    (rc = check_part(e, ename, 1, h->d_ff, h->d_model, "up",
			e->part[0].offset + e->part[0].bytes, errbuf, errlen)) ||
		    (rc = check_part(e, ename, 2, h->d_model, h->d_ff, "down",
			e->part[1].offset + e->part[1].bytes, errbuf, errlen)))
			return rc;
		if (e->bytes != e->part[2].offset + e->part[2].bytes)
			return arena_errf(errbuf, errlen, BATON_EBOUNDS,
			    "%s: blob is %" PRIu64 " bytes, its parts end at %" PRIu64,
			    name, e->bytes, e->part[2].offset + e->part[2].bytes);
		break;
	case BATON_ROLE_ROUTER:
	case BATON_ROLE_NORM:
	case BATON_ROLE_DENSE: {
		int router = e->role == BATON_ROLE_ROUTER;
		if (per_layer && !(h->flags & (router ? ARENA_F_ROUTER : ARENA_F_NORM)))
			return arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "%s: the header says the arena has none", name);
		if (e->n_parts != 1 || e->part[0].offset != 0)
			return arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "%s: a dense tensor is one part at offset 0", name);
		uint32_t rows = e->part[0].rows, cols = e->part[0].cols;
		if (per_layer) {
			rows = router ? h->experts : 1;
			cols = h->d_model;
		} else if (rows == 0 || rows > ARENA_MAX_DENSE_ROWS || cols == 0 || cols >= ARENA_MAX_DIM)
			return arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "%s: absurd shape %" PRIu32 "x%" PRIu32, name, rows, cols);
		if ((rc = check_part(e, ename, 0, rows, cols, per_layer ? arena_role_name(e->role) :
			 "tensor", 0, errbuf, errlen)))
			return rc;
		if (e->bytes != e->part[0].bytes)
			return arena_errf(errbuf, errlen, BATON_EBOUNDS,
			    "%s: blob is %" PRIu64 " bytes, its tensor %" PRIu64,
			    name, e->bytes, e->part[0].bytes);
		break;
	}
	case BATON_ROLE_BLOB:
		if (e->n_parts != 0)
			return arena_errf(errbuf, errlen, BATON_EFORMAT, "%s: metadata has no parts", name);
		if (e->bytes > ARENA_MAX_BLOB)
			return arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "%s: %" PRIu64 " bytes, more than %u", name, e->bytes, ARENA_MAX_BLOB);
		break;
	}
	return 0;
}

struct span {
	uint64_t off, end;
	uint32_t idx;
};

static int span_cmp(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* qsort has no context argument: the names being sorted. */
static _Thread_local char *const *sort_names;

static int name_ix_cmp(const void *a, const void *b)
{
	return strcmp(sort_names[*(const uint32_t *)a], sort_names[*(const uint32_t *)b]);
}

int arena_index_build(const uint8_t *base, uint64_t size, struct arena_index *ix,
    char *errbuf, size_t errlen)
{
	memset(ix, 0, sizeof *ix);
	struct arena_file_header *h = &ix->hdr;
	struct span *spans = NULL;
	char *names = NULL;
	int rc;

	uint64_t cmp = size < ARENA_MAGIC_LEN ? size : ARENA_MAGIC_LEN;
	if (memcmp(base, ARENA_MAGIC, cmp) != 0)
		return arena_errf(errbuf, errlen, BATON_EMAGIC,
		    "not a Baton arena (bad magic)");
	if (size < ARENA_HEADER_BYTES)
		return arena_errf(errbuf, errlen, BATON_ETRUNCATED,
		    "file is truncated: %" PRIu64 " bytes, shorter than the %u-byte header",
		    size, ARENA_HEADER_BYTES);
	memcpy(h, base, sizeof *h);
	if ((rc = check_header(h, size, errbuf, errlen)))
		goto fail;

	uint64_t n = h->n_entries;
	size_t tbytes = (size_t)(n * ARENA_ENTRY_BYTES);
	ix->entries = malloc(tbytes ? tbytes : 1);
	names = malloc(h->names_bytes ? h->names_bytes : 1);
	if (!ix->entries || !names) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "no memory for %" PRIu64 " entries", n);
		goto fail;
	}
	memcpy(ix->entries, base + h->table_offset, tbytes);
	memcpy(names, base + h->names_offset, (size_t)h->names_bytes);
	if (arena_table_checksum(ix->entries, tbytes, names, (size_t)h->names_bytes) !=
	    h->table_checksum) {
		rc = arena_errf(errbuf, errlen, BATON_ECHECKSUM, "table checksum mismatch");
		goto fail;
	}

	uint64_t nexp = (uint64_t)h->layers * h->experts;
	uint64_t n_named = n - nexp; /* >= 0: the header's count checks */
	ix->expert_ix = malloc(nexp * sizeof *ix->expert_ix);
	ix->router_ix = malloc(h->layers * sizeof *ix->router_ix);
	ix->norm_ix = malloc(h->layers * sizeof *ix->norm_ix);
	ix->name_str = calloc(n ? n : 1, sizeof *ix->name_str);
	ix->dense_ix = malloc((n_named ? n_named : 1) * sizeof *ix->dense_ix);
	ix->blob_ix = malloc((h->n_blobs ? h->n_blobs : 1) * sizeof *ix->blob_ix);
	spans = malloc(n * sizeof *spans);
	if (!ix->expert_ix || !ix->router_ix || !ix->norm_ix || !spans || !ix->name_str ||
	    !ix->dense_ix || !ix->blob_ix) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "no memory for the index");
		goto fail;
	}
	memset(ix->expert_ix, 0xff, nexp * sizeof *ix->expert_ix);
	memset(ix->router_ix, 0xff, h->layers * sizeof *ix->router_ix);
	memset(ix->norm_ix, 0xff, h->layers * sizeof *ix->norm_ix);

	/* Names first: every message after this can use them. */
	uint64_t spos = 0, n_dense = 0, n_blobs = 0, sbytes = 1;
	for (uint64_t i = 0; i < n; i++) {
		const struct arena_file_entry *e = &ix->entries[i];
		if (e->role > BATON_ROLE_BLOB) {
			rc = arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "entry %" PRIu64 ": unknown role %" PRIu32, i, e->role);
			goto fail;
		}
		if ((rc = check_name(h, e, names, i, errbuf, errlen)))
			goto fail;
		sbytes += e->role == BATON_ROLE_EXPERT ? 0 : e->name_len + 1u;
	}
	if (!(ix->strs = malloc(sbytes))) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "no memory for the names");
		goto fail;
	}
	for (uint64_t i = 0; i < n; i++) {
		const struct arena_file_entry *e = &ix->entries[i];
		if (e->role != BATON_ROLE_EXPERT) {
			ix->name_str[i] = ix->strs + spos;
			memcpy(ix->strs + spos, names + e->name_off, e->name_len);
			ix->strs[spos + e->name_len] = '\0';
			spos += e->name_len + 1;
		}
		if ((rc = check_entry(h, e, ix->name_str[i], i, errbuf, errlen)))
			goto fail;
		uint32_t *slot = NULL;
		if (e->role == BATON_ROLE_EXPERT)
			slot = &ix->expert_ix[(uint64_t)e->layer * h->experts + e->expert];
		else if (e->role == BATON_ROLE_ROUTER)
			slot = &ix->router_ix[e->layer];
		else if (e->role == BATON_ROLE_NORM)
			slot = &ix->norm_ix[e->layer];
		if (slot && *slot != UINT32_MAX) {
			char name[ARENA_MAX_NAME + 64];
			arena_entry_name(e, ix->name_str[i], name, sizeof name);
			rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "%s appears twice in the table (entries %" PRIu32 " and %" PRIu64 ")",
			    name, *slot, i);
			goto fail;
		}
		if (slot)
			*slot = (uint32_t)i;
		if (e->role != BATON_ROLE_EXPERT && ix->n_dense_ix + n_blobs >= n_named) {
			rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "more named entries than the header counts");
			goto fail;
		}
		if (e->role == BATON_ROLE_DENSE && ++n_dense > h->n_dense) {
			rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "more dense tensors than the header's %" PRIu64, h->n_dense);
			goto fail;
		}
		if (e->role == BATON_ROLE_BLOB) {
			if (n_blobs >= h->n_blobs) {
				rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
				    "more metadata blobs than the header's %" PRIu64, h->n_blobs);
				goto fail;
			}
			ix->blob_ix[n_blobs++] = (uint32_t)i;
		} else if (e->role != BATON_ROLE_EXPERT)
			ix->dense_ix[ix->n_dense_ix++] = (uint32_t)i;
		if (e->role == BATON_ROLE_EXPERT && e->bytes > ix->max_expert_bytes)
			ix->max_expert_bytes = e->bytes;
		spans[i] = (struct span){ e->offset, e->offset + e->bytes, (uint32_t)i };
	}
	/* The counts match and nothing is there twice, so every (layer,
	 * expert), every flagged router and norm, and exactly the header's
	 * dense tensors and blobs are present. */
	ix->n_blob_ix = n_blobs;
	if (n_dense != h->n_dense || n_blobs != h->n_blobs) {
		rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "%" PRIu64 " dense tensors and %" PRIu64 " metadata blobs, the header says %"
		    PRIu64 " and %" PRIu64, n_dense, n_blobs, h->n_dense, h->n_blobs);
		goto fail;
	}
	/* Names are unique in each namespace. */
	sort_names = ix->name_str;
	qsort(ix->dense_ix, ix->n_dense_ix, sizeof *ix->dense_ix, name_ix_cmp);
	qsort(ix->blob_ix, ix->n_blob_ix, sizeof *ix->blob_ix, name_ix_cmp);
	sort_names = NULL;
	for (int pass = 0; pass < 2; pass++) {
		const uint32_t *v = pass ? ix->blob_ix : ix->dense_ix;
		uint64_t m = pass ? ix->n_blob_ix : ix->n_dense_ix;
		for (uint64_t i = 1; i < m; i++)
			if (strcmp(ix->name_str[v[i - 1]], ix->name_str[v[i]]) == 0) {
				rc = arena_errf(errbuf, errlen, BATON_EFORMAT,
				    "%s \"%s\" appears twice", pass ? "metadata" : "tensor",
				    ix->name_str[v[i]]);
				goto fail;
			}
	}

	/* Experts of one layer share their dtypes (compute reads them per layer). */
	for (uint32_t l = 0; l < h->layers; l++) {
		const struct arena_file_entry *first = &ix->entries[ix->expert_ix[(uint64_t)l * h->experts]];
		for (uint32_t x = 1; x < h->experts; x++) {
			const struct arena_file_entry *e = &ix->entries[ix->expert_ix[(uint64_t)l * h->experts + x]];
			for (int p = 0; p < 3; p++)
				if (e->part[p].dtype != first->part[p].dtype) {
					rc = arena_errf(errbuf, errlen, BATON_EFORMAT,
					    "layer %" PRIu32 ": expert %" PRIu32 " and expert 0 differ in dtype",
					    l, x);
					goto fail;
				}
		}
	}
	const struct arena_file_entry *e0 = &ix->entries[ix->expert_ix[0]];
	if (e0->part[0].dtype != h->gate_dtype || e0->part[1].dtype != h->up_dtype ||
	    e0->part[2].dtype != h->down_dtype) {
		rc = arena_errf(errbuf, errlen, BATON_EFORMAT,
		    "header dtypes differ from layer 0's experts");
		goto fail;
	}

	qsort(spans, n, sizeof *spans, span_cmp);
	for (uint64_t i = 1; i < n; i++)
		if (spans[i].off < spans[i - 1].end) {
			char a[ARENA_MAX_NAME + 64], b[ARENA_MAX_NAME + 64];
			arena_entry_name(&ix->entries[spans[i - 1].idx], ix->name_str[spans[i - 1].idx],
			    a, sizeof a);
			arena_entry_name(&ix->entries[spans[i].idx], ix->name_str[spans[i].idx], b, sizeof b);
			rc = arena_errf(errbuf, errlen, BATON_EOVERLAP,
			    "blobs overlap: %s [%" PRIu64 ", %" PRIu64 ") and %s at %" PRIu64,
			    a, spans[i - 1].off, spans[i - 1].end, b, spans[i].off);
			goto fail;
		}
	free(spans);
	free(names);

	/* A model has its config. */
	if (h->flags & ARENA_F_MODEL) {
		int cfg = 0;
		for (uint64_t i = 0; i < ix->n_blob_ix; i++)
			cfg |= strcmp(ix->name_str[ix->blob_ix[i]], "config.json") == 0;
		if (!cfg) {
			rc = arena_errf(errbuf, errlen, BATON_EFORMAT,
			    "a %s model without config.json", h->arch);
			names = NULL;
			spans = NULL;
			goto fail;
		}
	}

	ix->n_entries = n;
	memcpy(ix->source, h->source, ARENA_SOURCE_LEN);
	ix->source[ARENA_SOURCE_LEN - 1] = '\0';
	memcpy(ix->arch, h->arch, ARENA_ARCH_LEN);
	ix->shape = (struct baton_arena_shape){
		.layers = h->layers, .experts = h->experts, .top_k = h->top_k,
		.d_model = h->d_model, .d_ff = h->d_ff,
		.gate_dtype = h->gate_dtype, .up_dtype = h->up_dtype,
		.down_dtype = h->down_dtype, .router_dtype = h->router_dtype,
		.norm_dtype = h->norm_dtype,
	};
	return 0;
fail:
	free(spans);
	free(names);
	arena_index_free(ix);
	return rc;
}

int arena_open(const char *path, struct baton_arena **out, char *errbuf, size_t errlen)
{
	struct baton_arena *a = NULL;
	void *map = MAP_FAILED;
	uint64_t size = 0;
	int rc, fd = -1;

	*out = NULL;
	if (!path || !*path)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "no arena path");
	/* An arena someone else could have written, or chosen, is not
	 * loaded: its weights would be theirs, and verify cannot tell (the
	 * checksums are in the same file). So create's rules hold here too:
	 * the directory is one only we (or root) can write, the name is not
	 * a link (to a root-owned arena of another model, say), and the file
	 * is ours or root's and not writable by others. */
	if ((rc = baton_trust_dir_of(path, "arena directory", errbuf, errlen)))
		return rc;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		int e = errno;
		if (e == ELOOP)
			return arena_errf(errbuf, errlen, BATON_EPERM,
			    "%s: a symbolic link: refusing it (open the arena by its real path)", path);
		return arena_errf(errbuf, errlen,
		    e == ENOENT ? BATON_ENOTFOUND : e == EACCES ? BATON_EPERM : BATON_EIO,
		    "%s: %s", path, strerror(e));
	}
	struct stat st;
	if ((rc = baton_trust_file(fd, path, errbuf, errlen)))
		goto fail;
	if (fstat(fd, &st) != 0) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: %s", path, strerror(errno));
		goto fail;
	}
	size = (uint64_t)st.st_size;
	if (size == 0) {
		rc = arena_errf(errbuf, errlen, BATON_ETRUNCATED, "%s: empty file", path);
		goto fail;
	}
	map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = arena_errf(errbuf, errlen, BATON_EIO, "%s: mmap: %s", path, strerror(errno));
		goto fail;
	}
	a = calloc(1, sizeof *a);
	if (!a) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
		goto fail;
	}
	/* Guarded from the first read on: the index build reads it all. */
	a->guard = arena_guard_add(map, size, 0);
	char msg[256];
	if ((rc = arena_index_build(map, size, &a->ix, msg, sizeof msg))) {
		arena_errf(errbuf, errlen, rc, "%s: %s", path, msg);
		goto fail;
	}
	if (arena_guard_faults(a->guard)) {
		rc = arena_errf(errbuf, errlen, BATON_ETRUNCATED,
		    "%s: the file shrank while it was being opened", path);
		goto fail;
	}
	a->base = map;
	a->size = size;
	a->fd = fd;
	snprintf(a->path, sizeof a->path, "%s", path);
	*out = a;
	return 0;
fail:
	if (a)
		arena_guard_remove(a->guard);
	free(a);
	if (map != MAP_FAILED)
		munmap(map, size);
	if (fd >= 0)
		close(fd);
	return rc;
}

void arena_close(struct baton_arena *a)
{
	if (!a)
		return;
	arena_guard_remove(a->guard);
	munmap((void *)(uintptr_t)a->base, a->size);
	close(a->fd);
	arena_index_free(&a->ix);
	free(a);
}

int arena_intact(struct baton_arena *a, char *errbuf, size_t errlen)
{
	struct stat st;
	if (fstat(a->fd, &st) != 0)
		return arena_errf(errbuf, errlen, BATON_EIO, "%s: %s", a->path, strerror(errno));
	/* Latched: grown back in place, the lost part reads zeros. */
	if (!a->shrank && (uint64_t)st.st_size < a->size) {
		a->shrank = 1;
		a->shrank_to = (uint64_t)st.st_size;
	}
	if (a->shrank)
		return arena_errf(errbuf, errlen, BATON_ETRUNCATED,
		    "%s: the arena shrank from %" PRIu64 " to %" PRIu64 " bytes while in use "
		    "(truncated in place): what it held is gone; recreate it and restart "
		    "the engine", a->path, a->size, a->shrank_to);
	if (arena_guard_faults(a->guard))
		return arena_errf(errbuf, errlen, BATON_ETRUNCATED,
		    "%s: the arena shrank while in use (%u reads past its end); recreate it "
		    "and restart the engine", a->path, arena_guard_faults(a->guard));
	return 0;
}

const struct baton_arena_shape *arena_shape(const struct baton_arena *a)
{
	return &a->ix.shape;
}

uint64_t arena_generation(const struct baton_arena *a)
{
	return a->ix.hdr.generation;
}

const void *arena_base(const struct baton_arena *a)
{
	return a->base;
}

uint64_t arena_size(const struct baton_arena *a)
{
	return a->size;
}

uint64_t arena_max_expert_bytes(const struct baton_arena *a)
{
	return arena_align_up(a->ix.max_expert_bytes, BATON_ARENA_ALIGN);
}

const char *arena_source(const struct baton_arena *a)
{
	return a->ix.source;
}

const char *arena_arch(const struct baton_arena *a)
{
	return a->ix.arch;
}

static const struct arena_file_entry *find_expert(const struct baton_arena *a,
    uint32_t layer, uint32_t expert)
{
	const struct baton_arena_shape *s = &a->ix.shape;
	if (layer >= s->layers || expert >= s->experts)
		return NULL;
	return &a->ix.entries[a->ix.expert_ix[(uint64_t)layer * s->experts + expert]];
}

int arena_expert(const struct baton_arena *a, uint32_t layer, uint32_t expert,
    struct baton_arena_expert *out)
{
	const struct arena_file_entry *e = find_expert(a, layer, expert);
	if (!e)
		return BATON_ENOTFOUND;
	*out = (struct baton_arena_expert){
		.blob = a->base + e->offset,
		.offset = e->offset,
		.bytes = e->bytes,
		.gate_off = e->part[0].offset,
		.up_off = e->part[1].offset,
		.down_off = e->part[2].offset,
		.checksum = e->checksum,
	};
	return 0;
}

static void part_tensor(const struct baton_arena *a, const struct arena_file_entry *e, int i,
    struct baton_arena_tensor *t)
{
	const struct arena_file_part *p = &e->part[i];
	*t = (struct baton_arena_tensor){
		.data = a->base + e->offset + p->offset,
		.offset = e->offset + p->offset,
		.bytes = p->bytes,
		.dtype = p->dtype,
		.rows = p->rows,
		.cols = p->cols,
		.checksum = e->checksum,
	};
}

int arena_expert_parts(const struct baton_arena *a, uint32_t layer, uint32_t expert,
    struct baton_arena_tensor parts[3])
{
	const struct arena_file_entry *e = find_expert(a, layer, expert);
	if (!e)
		return BATON_ENOTFOUND;
	for (int i = 0; i < 3; i++)
		part_tensor(a, e, i, &parts[i]);
	return 0;
}

int arena_layer_dtypes(const struct baton_arena *a, uint32_t layer, uint32_t dtypes[3])
{
	const struct arena_file_entry *e = find_expert(a, layer, 0);
	if (!e)
		return BATON_ENOTFOUND;
	for (int i = 0; i < 3; i++)
		dtypes[i] = e->part[i].dtype;
	return 0;
}

int arena_tensor(const struct baton_arena *a, uint32_t layer, enum baton_role role,
    struct baton_arena_tensor *out)
{
	if (layer >= a->ix.shape.layers)
		return BATON_ENOTFOUND;
	uint32_t idx;
	if (role == BATON_ROLE_ROUTER)
		idx = a->ix.router_ix[layer];
	else if (role == BATON_ROLE_NORM)
		idx = a->ix.norm_ix[layer];
	else
		return BATON_EINVAL;
	if (idx == UINT32_MAX)
		return BATON_ENOTFOUND;
	part_tensor(a, &a->ix.entries[idx], 0, out);
	return 0;
}

/* ---- names ---------------------------------------------------------------- */

static const uint32_t *find_name(const struct arena_index *ix, const uint32_t *v, uint64_t n,
    const char *name)
{
	uint64_t lo = 0, hi = n;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int c = strcmp(ix->name_str[v[mid]], name);
		if (c == 0)
			return &v[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int arena_dense(const struct baton_arena *a, const char *name, struct baton_arena_tensor *out)
{
	if (!name)
		return BATON_EINVAL;
	const uint32_t *p = find_name(&a->ix, a->ix.dense_ix, a->ix.n_dense_ix, name);
	if (!p)
		return BATON_ENOTFOUND;
	part_tensor(a, &a->ix.entries[*p], 0, out);
	return 0;
}

uint64_t arena_dense_count(const struct baton_arena *a)
{
	return a->ix.n_dense_ix;
}

int arena_dense_at(const struct baton_arena *a, uint64_t i, const char **name,
    struct baton_arena_tensor *out)
{
	if (i >= a->ix.n_dense_ix)
		return BATON_ENOTFOUND;
	uint32_t k = a->ix.dense_ix[i];
	if (name)
		*name = a->ix.name_str[k];
	if (out)
		part_tensor(a, &a->ix.entries[k], 0, out);
	return 0;
}

static void blob_out(const struct baton_arena *a, uint32_t k, const void **data, uint64_t *len)
{
	const struct arena_file_entry *e = &a->ix.entries[k];
	if (data)
		*data = a->base + e->offset;
	if (len)
		*len = e->bytes;
}

int arena_blob(const struct baton_arena *a, const char *key, const void **data, uint64_t *len)
{
	if (!key)
		return BATON_EINVAL;
	const uint32_t *p = find_name(&a->ix, a->ix.blob_ix, a->ix.n_blob_ix, key);
	if (!p)
		return BATON_ENOTFOUND;
	blob_out(a, *p, data, len);
	return 0;
}

uint64_t arena_blob_count(const struct baton_arena *a)
{
	return a->ix.n_blob_ix;
}

int arena_blob_at(const struct baton_arena *a, uint64_t i, const char **key,
    const void **data, uint64_t *len)
{
	if (i >= a->ix.n_blob_ix)
		return BATON_ENOTFOUND;
	uint32_t k = a->ix.blob_ix[i];
	if (key)
		*key = a->ix.name_str[k];
	blob_out(a, k, data, len);
	return 0;
}

/* ---- verify ---------------------------------------------------------------- */

struct verify_ctx {
	const struct baton_arena *a;
	uint8_t *bad;
};

static int verify_one(void *ctx, uint64_t i)
{
	struct verify_ctx *v = ctx;
	const struct arena_file_entry *e = &v->a->ix.entries[i];
	v->bad[i] = arena_hash(v->a->base + e->offset, e->bytes) != e->checksum;
	return 0;
}

int arena_verify(const struct baton_arena *a, uint64_t *bad_entries, char *errbuf, size_t errlen)
{
	uint64_t n = a->ix.n_entries, nbad = 0, first = UINT64_MAX;
	struct verify_ctx v = { a, calloc(n ? n : 1, 1) };
	if (!v.bad)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	arena_parallel(0, n, verify_one, &v);
	for (uint64_t i = 0; i < n; i++)
		if (v.bad[i]) {
			if (first == UINT64_MAX)
				first = i;
			nbad++;
		}
	free(v.bad);
	if (bad_entries)
		*bad_entries = nbad;
	if (!nbad)
		return 0;
	char name[ARENA_MAX_NAME + 64];
	const struct arena_file_entry *e = &a->ix.entries[first];
	arena_entry_name(e, a->ix.name_str[first], name, sizeof name);
	return arena_errf(errbuf, errlen, BATON_ECHECKSUM,
	    "checksum mismatch in %s (blob at %" PRIu64 ", %" PRIu64 " bytes)%s",
	    name, e->offset, e->bytes, nbad > 1 ? " and more" : "");
}
