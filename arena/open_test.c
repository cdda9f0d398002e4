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
	    h->table_offset + h->n_entries * ARENA_ENTRY_BYTES <= len)
		h->table_checksum = arena_hash(b + h->table_offset,
		    (size_t)(h->n_entries * ARENA_ENTRY_BYTES));
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
static void m_version(uint8_t *b, size_t *len) { (void)len; hdr(b)->version = 2; }
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
	{ "format version 2", m_version, 0, 1, BATON_EFORMAT, "version 2" },
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
	flip_and_verify(t.offset + 5, "layer 1 router");
	T_OK(arena_tensor(a, 0, BATON_ROLE_NORM, &t));
	flip_and_verify(t.offset + t.bytes - 1, "layer 0 norm");
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

T_MAIN(T_CASE(t_good_opens), T_CASE(t_not_files), T_CASE(t_corrupt_cases),
    T_CASE(t_verify_flips), T_CASE_TIMEOUT(t_random_damage, 120))
