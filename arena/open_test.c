/*
 * open_test.c: arena_open on corrupt files. Each case takes a valid arena,
 * breaks one thing (re-sealing the checksums where the case is about
 * something else, so that the check under test is the one that fires) and
 * wants the exact error, a message naming the problem, no crash, nothing
 * left mapped and no descriptor left open. Then verify on flipped bytes.
 */
#include <inttypes.h>
#include <string.h>

#include "arena/arena_int.h"
#include "tests/arena_util.h"

static char dir[PATH_MAX - 64], good[PATH_MAX], bad[PATH_MAX];
static uint8_t *img;
static size_t img_len;

static void setup(void)
{
	au_tmpdir(dir, sizeof dir);
	snprintf(good, sizeof good, "%s/good.arena", dir);
	snprintf(bad, sizeof bad, "%s/bad.arena", dir);
	struct baton_synth_params p = au_small();
	au_create(good, &p);
	img = au_read(good, &img_len);
}

static void teardown(void)
{
	free(img);
	au_rmdir(dir);
}

static struct arena_file_header *hdr(uint8_t *b)
{
	return (struct arena_file_header *)(void *)b;
}

static struct arena_file_entry *ent(uint8_t *b, uint64_t i)
{
	return (struct arena_file_entry *)(void *)(b + hdr(b)->table_offset + i * ARENA_ENTRY_BYTES);
}

/* Recomputes the table checksum (when the table is inside the image) and
 * the header checksum, as a careful forger would. */
static void reseal(uint8_t *b, size_t len, int table)
{
	struct arena_file_header *h = hdr(b);
	if (table && h->table_offset <= len && h->n_entries < len / ARENA_ENTRY_BYTES &&
	    h->table_offset + h->n_entries * ARENA_ENTRY_BYTES <= len &&
	    h->names_offset <= len && h->names_bytes <= len - h->names_offset)
		h->table_checksum = arena_table_checksum(b + h->table_offset,
		    (size_t)(h->n_entries * ARENA_ENTRY_BYTES), b + h->names_offset,
		    (size_t)h->names_bytes);
	h->header_checksum = arena_header_checksum(h);
}

/* Opens `bad` with `len` bytes of b and wants err with `word` in the message. */
static void want(const uint8_t *b, size_t len, int err, const char *word, const char *what)
{
	au_write(bad, b, len);
	int fds = au_open_fds();
	struct baton_arena *a = (struct baton_arena *)(uintptr_t)1;
	char msg[512] = "";
	int rc = arena_open(bad, &a, msg, sizeof msg);
	T_ASSERT_MSG(rc == err, "%s: got %s (%s), want %s", what, baton_errname(rc), msg,
	    baton_errname(err));
	T_ASSERT_MSG(a == NULL, "%s: *out not NULL on failure", what);
	T_ASSERT_MSG(strstr(msg, word) != NULL, "%s: message \"%s\" does not say \"%s\"", what,
	    msg, word);
	T_ASSERT_MSG(strstr(msg, bad) != NULL || err == BATON_ENOTFOUND,
	    "%s: message \"%s\" does not name the file", what, msg);
	T_ASSERT_MSG(au_mapped(bad) == 0, "%s: still mapped after a failed open", what);
	T_ASSERT_MSG(au_open_fds() == fds, "%s: a descriptor leaked", what);
	printf("  %-34s %-18s %s\n", what, baton_errname(rc), msg + strlen(bad) + 2);
}

typedef void (*mutate_fn)(uint8_t *b, size_t *len);

struct ccase {
	const char *what;
	mutate_fn fn;
	int reseal_table, reseal_header;
	int err;
	const char *word;
};

static void m_magic(uint8_t *b, size_t *len) { (void)len; b[0] = 'X'; }
static void m_version(uint8_t *b, size_t *len) { (void)len; hdr(b)->version = 3; }
static void m_version1(uint8_t *b, size_t *len) { (void)len; hdr(b)->version = 1; }
static void m_header_size(uint8_t *b, size_t *len) { (void)len; hdr(b)->entry_bytes = 128; }
static void m_unsealed(uint8_t *b, size_t *len) { (void)len; hdr(b)->sealed = 0; }
static void m_gen0(uint8_t *b, size_t *len) { (void)len; hdr(b)->generation = 0; }
static void m_hdr_flip(uint8_t *b, size_t *len) { (void)len; hdr(b)->reserved[17] ^= 1; }
static void m_table_flip(uint8_t *b, size_t *len) { (void)len; ent(b, 3)->name_off ^= 0x100; }
static void m_trunc1(uint8_t *b, size_t *len) { (void)b; *len -= 1; }
static void m_trunc_half(uint8_t *b, size_t *len) { (void)b; *len /= 2; }
static void m_trunc_hdr(uint8_t *b, size_t *len) { (void)b; *len = 100; }
static void m_trunc_4(uint8_t *b, size_t *len) { (void)b; *len = 4; }
static void m_trailing(uint8_t *b, size_t *len) { (void)b; *len += 4096; }
static void m_layers0(uint8_t *b, size_t *len) { (void)len; hdr(b)->layers = 0; }
static void m_layers_big(uint8_t *b, size_t *len) { (void)len; hdr(b)->layers = 1u << 30; }
static void m_experts0(uint8_t *b, size_t *len) { (void)len; hdr(b)->experts = 0; }
static void m_experts_big(uint8_t *b, size_t *len) { (void)len; hdr(b)->experts = 5000; }
static void m_topk0(uint8_t *b, size_t *len) { (void)len; hdr(b)->top_k = 0; }
static void m_topk_big(uint8_t *b, size_t *len) { (void)len; hdr(b)->top_k = 5; }
static void m_dmodel0(uint8_t *b, size_t *len) { (void)len; hdr(b)->d_model = 0; }
static void m_dff_big(uint8_t *b, size_t *len) { (void)len; hdr(b)->d_ff = 1u << 20; }
static void m_nentries(uint8_t *b, size_t *len) { (void)len; hdr(b)->n_entries += 1; }
static void m_nentries_huge(uint8_t *b, size_t *len) { (void)len; hdr(b)->n_entries = UINT64_MAX / 2; }
static void m_flags(uint8_t *b, size_t *len) { (void)len; hdr(b)->flags |= 0x80; }
static void m_hdr_dtype(uint8_t *b, size_t *len) { (void)len; hdr(b)->down_dtype = 4; }
static void m_table_off(uint8_t *b, size_t *len) { (void)len; hdr(b)->table_offset = UINT64_MAX - 64; }
static void m_table_past(uint8_t *b, size_t *len) { hdr(b)->table_offset = *len - 8; }
static void m_data_off(uint8_t *b, size_t *len) { (void)len; hdr(b)->data_offset += 8; }
static void m_data_in_table(uint8_t *b, size_t *len) { (void)len; hdr(b)->data_offset = 0; }
static void m_off_past(uint8_t *b, size_t *len) { ent(b, 2)->offset = *len; }
static void m_off_wrap(uint8_t *b, size_t *len) { (void)len; ent(b, 2)->offset = UINT64_MAX - 4095; }
static void m_bytes_big(uint8_t *b, size_t *len) { (void)len; ent(b, 5)->bytes = UINT64_MAX; }
static void m_off_in_table(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->offset = 0; }
static void m_misaligned(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->offset += 256; }
static void m_overlap(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->offset = ent(b, 0)->offset; }
static void m_overlap_dense(uint8_t *b, size_t *len)
{
	(void)len; /* the last router on the first expert */
	ent(b, hdr(b)->n_entries - 1)->offset = ent(b, 0)->offset;
}
static void m_dup(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->expert = 0; }
static void m_layer_oob(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->layer = 9; }
static void m_role(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->role = 7; }
static void m_part_dtype(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->part[2].dtype = 99; }
static void m_part_bytes(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->part[1].bytes -= 2; }
static void m_part_shape(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->part[0].rows = 64; }
static void m_part_off(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->part[1].offset = 0; }
static void m_part_past(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->part[2].offset += 1u << 20; }
static void m_blob_bytes(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->bytes += 4; }
static void m_nparts(uint8_t *b, size_t *len) { (void)len; ent(b, 1)->n_parts = 2; }
static void m_mixed_layer(uint8_t *b, size_t *len)
{
	(void)len; /* expert 1 of layer 0 in bf16 while expert 0 is f16: same size */
	ent(b, 1)->part[0].dtype = BATON_DT_BF16;
}

static const struct ccase cases[] = {
	{ "bad magic", m_magic, 0, 0, BATON_EMAGIC, "magic" },
	{ "format version 3", m_version, 0, 1, BATON_EFORMAT, "version 3" },
	{ "format version 1", m_version1, 0, 1, BATON_EFORMAT,
	  "Recreate it: baton-arena create --synthetic --layers 2 --experts 4 --top-k 2 --d-model 64 "
	  "--d-ff 128 --dtype f16 --seed 7 --force PATH" },
	{ "entry size of another build", m_header_size, 0, 1, BATON_EFORMAT, "sizes" },
	{ "not sealed", m_unsealed, 0, 1, BATON_EUNSEALED, "not sealed" },
	{ "sealed with generation 0", m_gen0, 0, 1, BATON_EUNSEALED, "not sealed" },
	{ "header byte flipped", m_hdr_flip, 0, 0, BATON_ECHECKSUM, "header checksum" },
	{ "table byte flipped", m_table_flip, 0, 1, BATON_ECHECKSUM, "table checksum" },
	{ "truncated by one byte", m_trunc1, 0, 0, BATON_ETRUNCATED, "truncated" },
	{ "truncated to half", m_trunc_half, 0, 0, BATON_ETRUNCATED, "truncated" },
	{ "shorter than the header", m_trunc_hdr, 0, 0, BATON_ETRUNCATED, "header" },
	{ "4 bytes of the magic", m_trunc_4, 0, 0, BATON_ETRUNCATED, "truncated" },
	{ "trailing bytes", m_trailing, 0, 0, BATON_EBOUNDS, "trailing" },
	{ "0 layers", m_layers0, 1, 1, BATON_ECOUNT, "layer count 0" },
	{ "2^30 layers", m_layers_big, 1, 1, BATON_ECOUNT, "layer count" },
	{ "0 experts", m_experts0, 1, 1, BATON_ECOUNT, "expert count 0" },
	{ "5000 experts", m_experts_big, 1, 1, BATON_ECOUNT, "expert count 5000" },
	{ "top-k 0", m_topk0, 1, 1, BATON_ECOUNT, "top-k 0" },
	{ "top-k past the experts", m_topk_big, 1, 1, BATON_ECOUNT, "top-k 5" },
	{ "d_model 0", m_dmodel0, 1, 1, BATON_ECOUNT, "d_model 0" },
	{ "d_ff 2^20", m_dff_big, 1, 1, BATON_ECOUNT, "d_ff" },
	{ "one entry too many", m_nentries, 0, 1, BATON_ECOUNT, "entries" },
	{ "2^63 entries", m_nentries_huge, 0, 1, BATON_ECOUNT, "entries" },
	{ "unknown header flag", m_flags, 1, 1, BATON_EFORMAT, "flags" },
	{ "unknown header dtype", m_hdr_dtype, 1, 1, BATON_EFORMAT, "dtype 4" },
	{ "table offset wraps", m_table_off, 0, 1, BATON_EBOUNDS, "table" },
	{ "table past the end", m_table_past, 0, 1, BATON_EBOUNDS, "table" },
	{ "data offset misaligned", m_data_off, 1, 1, BATON_EBOUNDS, "data offset" },
	{ "data offset in the table", m_data_in_table, 1, 1, BATON_EBOUNDS, "data offset" },
	{ "blob offset past the end", m_off_past, 1, 1, BATON_EBOUNDS, "outside the data" },
	{ "blob offset+bytes wraps", m_off_wrap, 1, 1, BATON_EBOUNDS, "outside the data" },
	{ "blob of 2^64-1 bytes", m_bytes_big, 1, 1, BATON_EBOUNDS, "outside the data" },
	{ "blob over the header", m_off_in_table, 1, 1, BATON_EBOUNDS, "outside the data" },
	{ "blob misaligned", m_misaligned, 1, 1, BATON_EBOUNDS, "not aligned" },
	{ "two experts overlap", m_overlap, 1, 1, BATON_EOVERLAP, "overlap" },
	{ "a router over an expert", m_overlap_dense, 1, 1, BATON_EOVERLAP, "overlap" },
	{ "an expert twice", m_dup, 1, 1, BATON_ECOUNT, "twice" },
	{ "layer past the shape", m_layer_oob, 1, 1, BATON_ECOUNT, "out of the shape" },
	{ "unknown role", m_role, 1, 1, BATON_EFORMAT, "role 7" },
	{ "unknown part dtype", m_part_dtype, 1, 1, BATON_EFORMAT, "dtype 99" },
	{ "part bytes off by 2", m_part_bytes, 1, 1, BATON_EBOUNDS, "takes" },
	{ "part shape wrong", m_part_shape, 1, 1, BATON_EBOUNDS, "shape 64x64" },
	{ "parts overlap in the blob", m_part_off, 1, 1, BATON_EBOUNDS, "overlapping" },
	{ "part past its blob", m_part_past, 1, 1, BATON_EBOUNDS, "past the end of its" },
	{ "blob longer than its parts", m_blob_bytes, 1, 1, BATON_EBOUNDS, "parts end at" },
	{ "expert with 2 parts", m_nparts, 1, 1, BATON_EFORMAT, "2 parts" },
	{ "experts of a layer differ", m_mixed_layer, 1, 1, BATON_EFORMAT, "differ" },
};

static void t_corrupt_cases(void)
{
	setup();
	size_t n = sizeof cases / sizeof cases[0];
	uint8_t *b = malloc(img_len + 8192);
	T_ASSERT(b != NULL);
	for (size_t i = 0; i < n; i++) {
		const struct ccase *c = &cases[i];
		size_t len = img_len;
		memset(b, 0, img_len + 8192);
		memcpy(b, img, img_len);
		c->fn(b, &len);
		if (c->reseal_table || c->reseal_header)
			reseal(b, len, c->reseal_table);
		want(b, len, c->err, c->word, c->what);
	}
	printf("  %zu corrupt files refused\n", n);
	free(b);
	teardown();
}

static void t_good_opens(void)
{
	setup();
	/* The unchanged image, and the same resealed, open: the mutations
	 * above are what makes them fail. */
	struct baton_arena *a;
	char msg[256];
	T_OK(arena_open(good, &a, msg, sizeof msg));
	T_ASSERT(au_mapped(good) == 1);
	arena_close(a);
	T_ASSERT(au_mapped(good) == 0);
	reseal(img, img_len, 1);
	au_write(bad, img, img_len);
	T_OK(arena_open(bad, &a, msg, sizeof msg));
	arena_close(a);
	arena_close(NULL);
	teardown();
}

static void t_not_files(void)
{
	setup();
	struct baton_arena *a;
	char msg[256] = "", p[PATH_MAX];
	snprintf(p, sizeof p, "%s/none.arena", dir);
	T_EQ_ERR(arena_open(p, &a, msg, sizeof msg), BATON_ENOTFOUND);
	T_ASSERT(strstr(msg, "No such file") != NULL);
	T_EQ_ERR(arena_open(dir, &a, msg, sizeof msg), BATON_EIO);
	T_ASSERT(strstr(msg, "not a regular file") != NULL);
	au_write(bad, "", 0);
	T_EQ_ERR(arena_open(bad, &a, msg, sizeof msg), BATON_ETRUNCATED);
	T_ASSERT(strstr(msg, "empty") != NULL);
	au_write(bad, "XYZ", 3);
	T_EQ_ERR(arena_open(bad, &a, msg, sizeof msg), BATON_EMAGIC);
	T_EQ_ERR(arena_open("", &a, NULL, 0), BATON_EINVAL);
	teardown();
}

/* Flips one byte of a part and wants verify to name the entry. */
static void flip_and_verify(uint64_t file_off, const char *name)
{
	uint8_t *b = malloc(img_len);
	T_ASSERT(b != NULL);
	memcpy(b, img, img_len);
	b[file_off] ^= 0x40;
	au_write(bad, b, img_len);
	free(b);
	struct baton_arena *a;
	char msg[512] = "";
	T_OK(arena_open(bad, &a, msg, sizeof msg)); /* blob bytes are not read at open */
	uint64_t nbad = 99;
	T_EQ_ERR(arena_verify(a, &nbad, msg, sizeof msg), BATON_ECHECKSUM);
	T_EQ_INT(nbad, 1);
	T_ASSERT_MSG(strstr(msg, name) != NULL, "verify said \"%s\", want \"%s\"", msg, name);
	arena_close(a);
}

static void t_verify_flips(void)
{
	setup();
	struct baton_arena *a;
	char msg[512];
	T_OK(arena_open(good, &a, msg, sizeof msg));
	uint64_t nbad = 99;
	T_OK(arena_verify(a, &nbad, msg, sizeof msg));
	T_EQ_INT(nbad, 0);
	const struct baton_arena_shape *s = arena_shape(a);
	int checked = 0;
	for (uint32_t l = 0; l < s->layers; l++)
		for (uint32_t x = 0; x < s->experts; x++) {
			struct baton_arena_tensor p[3];
			T_OK(arena_expert_parts(a, l, x, p));
			char name[64];
			snprintf(name, sizeof name, "layer %" PRIu32 " expert %" PRIu32, l, x);
			/* first, a middle and the last byte of each part */
			for (int i = 0; i < 3; i++) {
				flip_and_verify(p[i].offset, name);
				flip_and_verify(p[i].offset + p[i].bytes / 2, name);
				flip_and_verify(p[i].offset + p[i].bytes - 1, name);
				checked += 3;
			}
		}
	struct baton_arena_tensor t;
	T_OK(arena_tensor(a, 1, BATON_ROLE_ROUTER, &t));
	flip_and_verify(t.offset + 5, "model.layers.1.mlp.gate.weight");
	T_OK(arena_tensor(a, 0, BATON_ROLE_NORM, &t));
	flip_and_verify(t.offset + t.bytes - 1, "model.layers.0.post_attention_layernorm.weight");
	printf("  %d flipped expert bytes found\n", checked);

	/* Every expert broken: all counted, the first named. */
	uint8_t *b = malloc(img_len);
	memcpy(b, img, img_len);
	for (uint32_t l = 0; l < s->layers; l++)
		for (uint32_t x = 0; x < s->experts; x++) {
			struct baton_arena_expert e;
			T_OK(arena_expert(a, l, x, &e));
			b[e.offset + e.down_off] ^= 1;
		}
	arena_close(a);
	au_write(bad, b, img_len);
	free(b);
	T_OK(arena_open(bad, &a, msg, sizeof msg));
	T_EQ_ERR(arena_verify(a, &nbad, msg, sizeof msg), BATON_ECHECKSUM);
	T_EQ_INT(nbad, 8);
	T_ASSERT(strstr(msg, "layer 0 expert 0") != NULL && strstr(msg, "and more") != NULL);
	arena_close(a);
	teardown();
}

/* Many random single-byte changes of the header and table: whatever
 * happens, no crash, and a failure leaves nothing mapped. */
static void t_random_damage(void)
{
	setup();
	uint8_t *b = malloc(img_len);
	uint64_t x = 88172645463325252u;
	int refused = 0;
	size_t span = (size_t)(hdr(img)->data_offset);
	for (int i = 0; i < 3000; i++) {
		memcpy(b, img, img_len);
		for (int k = 0; k < 1 + i % 3; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			b[x % span] ^= (uint8_t)(1u << (x >> 61));
		}
		if (i % 2)
			reseal(b, img_len, 1);
		au_write(bad, b, img_len);
		struct baton_arena *a;
		char msg[512];
		int rc = arena_open(bad, &a, msg, sizeof msg);
		if (rc == 0) {
			uint64_t nbad;
			arena_verify(a, &nbad, msg, sizeof msg);
			arena_close(a);
		} else {
			refused++;
			T_ASSERT(a == NULL);
			T_ASSERT(baton_err_valid(rc));
		}
		T_ASSERT(au_mapped(bad) == 0);
	}
	printf("  3000 damaged images: %d refused\n", refused);
	free(b);
	teardown();
}

/* ---- version 2: names, dense tensors and metadata of a whole model ---- */

static uint8_t *mimg;
static size_t mimg_len;

static void setup_model(void)
{
	au_tmpdir(dir, sizeof dir);
	snprintf(good, sizeof good, "%s/model.arena", dir);
	snprintf(bad, sizeof bad, "%s/bad.arena", dir);
	struct baton_synth_params p = {
		.arch = "qwen2_moe", .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 32,
		.heads = 4, .kv_heads = 2, .head_dim = 16, .vocab = 100, .shared_ff = 48,
		.dtype = BATON_DT_BF16, .seed = 5,
	};
	au_create(good, &p);
	mimg = au_read(good, &mimg_len);
}

/* The entry named `name` in an image (the table and names as written). */
static struct arena_file_entry *named(uint8_t *b, const char *name)
{
	struct arena_file_header *h = hdr(b);
	for (uint64_t i = 0; i < h->n_entries; i++) {
		struct arena_file_entry *e = ent(b, i);
		if (e->name_len == strlen(name) &&
		    memcmp(b + h->names_offset + e->name_off, name, e->name_len) == 0)
			return e;
	}
	T_ASSERT_MSG(0, "no entry %s", name);
	return NULL;
}

#define EMB "model.embed_tokens.weight"
#define NORM "model.norm.weight"
static void v_name_past(uint8_t *b, size_t *l) { (void)l; named(b, NORM)->name_off = (uint32_t)hdr(b)->names_bytes; }
static void v_name_len0(uint8_t *b, size_t *l) { (void)l; named(b, NORM)->name_len = 0; }
static void v_name_long(uint8_t *b, size_t *l) { (void)l; named(b, NORM)->name_len = 300; }
static void v_name_byte(uint8_t *b, size_t *l)
{
	(void)l;
	struct arena_file_entry *e = named(b, NORM);
	b[hdr(b)->names_offset + e->name_off + 2] = '\n';
}
static void v_expert_named(uint8_t *b, size_t *l) { (void)l; ent(b, 1)->name_len = 3; }
static void v_name_twice(uint8_t *b, size_t *l)
{
	(void)l;
	struct arena_file_entry *e = named(b, NORM), *f = named(b, EMB);
	/* same length? no: point the norm at the embedding's name, keep it a
	 * 1-row tensor: the duplicate is what is found */
	e->name_off = f->name_off;
	e->name_len = f->name_len;
}
static void v_ndense(uint8_t *b, size_t *l) { (void)l; hdr(b)->n_dense += 1; }
static void v_nblobs_huge(uint8_t *b, size_t *l) { (void)l; hdr(b)->n_blobs = 1000; }
static void v_names_in_table(uint8_t *b, size_t *l) { (void)l; hdr(b)->names_offset -= 8; }
static void v_names_huge(uint8_t *b, size_t *l) { (void)l; hdr(b)->names_bytes = UINT64_MAX - 8; }
static void v_names_over_data(uint8_t *b, size_t *l) { (void)l; hdr(b)->names_bytes = hdr(b)->data_offset; }
static void v_blob_parts(uint8_t *b, size_t *l) { (void)l; named(b, "config.json")->n_parts = 1; }
static void v_blob_huge(uint8_t *b, size_t *l) { (void)l; named(b, "config.json")->bytes = 1ull << 40; }
static void v_dense_rows0(uint8_t *b, size_t *l) { (void)l; named(b, EMB)->part[0].rows = 0; }
static void v_dense_rows_big(uint8_t *b, size_t *l) { (void)l; named(b, EMB)->part[0].rows = 1u << 30; }
static void v_dense_dtype(uint8_t *b, size_t *l) { (void)l; named(b, EMB)->part[0].dtype = 99; }
static void v_dense_bytes(uint8_t *b, size_t *l) { (void)l; named(b, EMB)->part[0].bytes += 2; }
static void v_dense_layer(uint8_t *b, size_t *l) { (void)l; named(b, EMB)->layer = 1; }
static void v_dense_to_blob(uint8_t *b, size_t *l) { (void)l; named(b, EMB)->role = BATON_ROLE_BLOB; }
static void v_arch_unknown(uint8_t *b, size_t *l) { (void)l; snprintf(hdr(b)->arch, ARENA_ARCH_LEN, "llama4"); }
static void v_arch_unterminated(uint8_t *b, size_t *l) { (void)l; memset(hdr(b)->arch, 'a', ARENA_ARCH_LEN); }
static void v_arch_none(uint8_t *b, size_t *l) { (void)l; memset(hdr(b)->arch, 0, ARENA_ARCH_LEN); }
static void v_no_config(uint8_t *b, size_t *l)
{
	(void)l;
	struct arena_file_entry *e = named(b, "config.json");
	b[hdr(b)->names_offset + e->name_off] = 'k';
}
static void v_overlap_blob(uint8_t *b, size_t *l) { (void)l; named(b, "config.json")->offset = named(b, EMB)->offset; }

static const struct ccase vcases[] = {
	{ "name past the names region", v_name_past, 1, 1, BATON_EBOUNDS, "names region" },
	{ "empty name", v_name_len0, 1, 1, BATON_EBOUNDS, "empty" },
	{ "300-byte name", v_name_long, 1, 1, BATON_EBOUNDS, "too long" },
	{ "control byte in a name", v_name_byte, 1, 1, BATON_EFORMAT, "printable" },
	{ "an expert with a name", v_expert_named, 1, 1, BATON_EFORMAT, "has a name" },
	{ "a tensor name twice", v_name_twice, 1, 1, BATON_EFORMAT, "twice" },
	{ "dense count off by one", v_ndense, 1, 1, BATON_ECOUNT, "entries" },
	{ "1000 metadata blobs", v_nblobs_huge, 1, 1, BATON_ECOUNT, "metadata" },
	{ "names inside the table", v_names_in_table, 1, 1, BATON_EBOUNDS, "names" },
	{ "names of 2^64 bytes", v_names_huge, 1, 1, BATON_EBOUNDS, "names" },
	{ "names over the data", v_names_over_data, 1, 1, BATON_EBOUNDS, "names" },
	{ "metadata with a part", v_blob_parts, 1, 1, BATON_EFORMAT, "no parts" },
	{ "metadata of 1 TiB", v_blob_huge, 1, 1, BATON_EBOUNDS, "outside the data" },
	{ "dense tensor of 0 rows", v_dense_rows0, 1, 1, BATON_ECOUNT, "absurd shape" },
	{ "dense tensor of 2^30 rows", v_dense_rows_big, 1, 1, BATON_ECOUNT, "absurd shape" },
	{ "dense tensor of dtype 99", v_dense_dtype, 1, 1, BATON_EFORMAT, "dtype 99" },
	{ "dense tensor bytes off", v_dense_bytes, 1, 1, BATON_EBOUNDS, "takes" },
	{ "dense tensor with a layer", v_dense_layer, 1, 1, BATON_ECOUNT, "out of the shape" },
	{ "a tensor counted as metadata", v_dense_to_blob, 1, 1, BATON_EFORMAT, "no parts" },
	{ "unknown architecture", v_arch_unknown, 1, 1, BATON_EUNSUPPORTED, "llama4" },
	{ "architecture not terminated", v_arch_unterminated, 1, 1, BATON_EFORMAT, "terminated" },
	{ "model flag without arch", v_arch_none, 1, 1, BATON_EFORMAT, "disagree" },
	{ "a model without config.json", v_no_config, 1, 1, BATON_EFORMAT, "config.json" },
	{ "metadata over a tensor", v_overlap_blob, 1, 1, BATON_EOVERLAP, "overlap" },
};

static void t_model_opens(void)
{
	setup_model();
	struct baton_arena *a;
	char msg[512];
	T_OK(arena_open(good, &a, msg, sizeof msg));
	T_EQ_STR(arena_arch(a), "qwen2_moe");
	struct baton_arena_tensor t;
	T_OK(arena_dense(a, EMB, &t));
	T_EQ_INT(t.rows, 100);
	T_EQ_INT(t.cols, 64);
	T_EQ_INT(t.dtype, BATON_DT_BF16);
	T_OK(arena_dense(a, "model.layers.1.self_attn.q_proj.bias", &t));
	T_EQ_INT(t.rows, 1);
	T_EQ_INT(t.cols, 64);
	T_OK(arena_dense(a, "model.layers.0.mlp.shared_expert_gate.weight", &t));
	T_EQ_INT(t.rows, 1);
	T_OK(arena_dense(a, "model.layers.0.mlp.shared_expert.down_proj.weight", &t));
	T_EQ_INT(t.rows, 64);
	T_EQ_INT(t.cols, 48);
	/* the router by name and as ROUTER: one tensor */
	struct baton_arena_tensor r;
	T_OK(arena_dense(a, "model.layers.1.mlp.gate.weight", &t));
	T_OK(arena_tensor(a, 1, BATON_ROLE_ROUTER, &r));
	T_ASSERT(t.data == r.data && t.rows == 4 && r.cols == 64);
	T_OK(arena_dense(a, "model.layers.1.post_attention_layernorm.weight", &t));
	T_OK(arena_tensor(a, 1, BATON_ROLE_NORM, &r));
	T_ASSERT(t.data == r.data);
	T_EQ_ERR(arena_dense(a, "model.layers.9.mlp.gate.weight", &t), BATON_ENOTFOUND);
	T_EQ_ERR(arena_dense(a, "", &t), BATON_ENOTFOUND);
	T_EQ_ERR(arena_dense(a, NULL, &t), BATON_EINVAL);
	const void *d;
	uint64_t len;
	T_OK(arena_blob(a, "config.json", &d, &len));
	T_ASSERT(len > 100 && memcmp(d, "{", 1) == 0);
	T_ASSERT(memmem(d, len, "\"shared_expert_intermediate_size\": 48", 37) != NULL);
	T_EQ_ERR(arena_blob(a, "tokenizer.json", &d, &len), BATON_ENOTFOUND);
	/* enumeration: sorted, each findable */
	const char *prev = "";
	for (uint64_t i = 0; i < arena_dense_count(a); i++) {
		const char *name;
		T_OK(arena_dense_at(a, i, &name, &t));
		T_ASSERT_MSG(strcmp(prev, name) < 0, "%s after %s", name, prev);
		T_OK(arena_dense(a, name, &r));
		T_ASSERT(r.data == t.data);
		prev = name;
	}
	/* 3 global + 2 layers x (2 norms, 4 attention, 3 biases, router, 4 shared) */
	T_EQ_INT(arena_dense_count(a), 3 + 2 * 14);
	T_EQ_ERR(arena_dense_at(a, arena_dense_count(a), NULL, &t), BATON_ENOTFOUND);
	T_EQ_INT(arena_blob_count(a), 1);
	uint64_t nbad = 9;
	T_OK(arena_verify(a, &nbad, msg, sizeof msg));
	arena_close(a);

	/* a flipped byte of a dense tensor and of the config: verify names them */
	uint8_t *b = malloc(mimg_len);
	const char *which[] = { "model.layers.1.self_attn.o_proj.weight", "config.json" };
	for (int i = 0; i < 2; i++) {
		memcpy(b, mimg, mimg_len);
		b[named(b, which[i])->offset + 7] ^= 2;
		au_write(bad, b, mimg_len);
		T_OK(arena_open(bad, &a, msg, sizeof msg));
		T_EQ_ERR(arena_verify(a, &nbad, msg, sizeof msg), BATON_ECHECKSUM);
		T_ASSERT_MSG(strstr(msg, which[i]) != NULL, "verify said %s", msg);
		T_EQ_INT(nbad, 1);
		arena_close(a);
	}
	/* a renamed tensor (resealed) opens, under its new name only */
	memcpy(b, mimg, mimg_len);
	struct arena_file_entry *e = named(b, NORM);
	b[hdr(b)->names_offset + e->name_off] = 'M';
	reseal(b, mimg_len, 1);
	au_write(bad, b, mimg_len);
	T_OK(arena_open(bad, &a, msg, sizeof msg));
	T_EQ_ERR(arena_dense(a, NORM, &t), BATON_ENOTFOUND);
	T_OK(arena_dense(a, "Model.norm.weight", &t));
	arena_close(a);
	free(b);
	free(mimg);
	au_rmdir(dir);
}

static void t_model_corrupt_cases(void)
{
	setup_model();
	size_t n = sizeof vcases / sizeof vcases[0];
	uint8_t *b = malloc(mimg_len + 8192);
	T_ASSERT(b != NULL);
	for (size_t i = 0; i < n; i++) {
		const struct ccase *c = &vcases[i];
		size_t len = mimg_len;
		memset(b, 0, mimg_len + 8192);
		memcpy(b, mimg, mimg_len);
		c->fn(b, &len);
		if (c->reseal_table || c->reseal_header)
			reseal(b, len, c->reseal_table);
		want(b, len, c->err, c->word, c->what);
	}
	printf("  %zu corrupt model files refused\n", n);
	free(b);
	free(mimg);
	au_rmdir(dir);
}

T_MAIN(T_CASE(t_good_opens), T_CASE(t_model_opens), T_CASE(t_model_corrupt_cases), T_CASE(t_not_files), T_CASE(t_corrupt_cases),
    T_CASE(t_verify_flips), T_CASE_TIMEOUT(t_random_damage, 120))
