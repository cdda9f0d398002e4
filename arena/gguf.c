/*
 * gguf.c: llama.cpp's GGUF (v3, and v2 which has the same layout) as an
 * arena source. The file is mapped read-only and treated as untrusted:
 * every count is capped by the bytes left, every read is bounds-checked.
 *
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv
 *   n_kv x (string key, u32 type, value)
 *   n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset)
 *   padding to general.alignment (default 32), then the tensor data
 *
 * MoE experts are stacked: blk.N.ffn_{gate,up,down}_exps.weight with
 * ne = (cols, rows, n_expert); expert e's slice is rows * row_bytes bytes at
 * e times that from the tensor's start. The router is blk.N.ffn_gate_inp.weight
 * (d_model, n_expert), the optional norm blk.N.ffn_norm.weight (d_model).
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

enum gguf_type {
	GT_U8, GT_I8, GT_U16, GT_I16, GT_U32, GT_I32, GT_F32, GT_BOOL,
	GT_STRING, GT_ARRAY, GT_U64, GT_I64, GT_F64, GT_COUNT
};

#define GGUF_MAX_DEPTH 4
#define GGUF_MAX_NAME 4096

struct rd {
	const uint8_t *b;
	uint64_t size, pos;
	char *errbuf;
	size_t errlen;
};

static int rd_fail(struct rd *r, const char *what)
{
	return arena_errf(r->errbuf, r->errlen, BATON_ESOURCE,
	    "gguf: truncated or corrupt at byte %" PRIu64 " (%s)", r->pos, what);
}

static uint64_t rd_left(const struct rd *r)
{
	return r->size - r->pos;
}

static int rd_bytes(struct rd *r, uint64_t n, const uint8_t **p, const char *what)
{
	if (n > rd_left(r)) {
		rd_fail(r, what);
		return BATON_ESOURCE;
	}
	if (p)
		*p = r->b + r->pos;
	r->pos += n;
	return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what)
{
	const uint8_t *p = NULL;
	if (rd_bytes(r, 4, &p, what))
		return BATON_ESOURCE;
	memcpy(v, p, 4);
	return 0;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what)
{
	const uint8_t *p = NULL;
	if (rd_bytes(r, 8, &p, what))
		return BATON_ESOURCE;
	memcpy(v, p, 8);
	return 0;
}

static int rd_str(struct rd *r, const char **s, uint64_t *len, const char *what)
{
	const uint8_t *p = NULL;
	if (rd_u64(r, len, what) || rd_bytes(r, *len, &p, what))
		return BATON_ESOURCE;
	*s = (const char *)p;
	return 0;
}

static uint64_t scalar_size(uint32_t t)
{
	switch (t) {
	case GT_U8: case GT_I8: case GT_BOOL: return 1;
	case GT_U16: case GT_I16: return 2;
	case GT_U32: case GT_I32: case GT_F32: return 4;
	case GT_U64: case GT_I64: case GT_F64: return 8;
	default: return 0;
	}
}

static int skip_value(struct rd *r, uint32_t type, int depth)
{
	uint64_t sz = scalar_size(type);
	if (sz)
		return rd_bytes(r, sz, NULL, "value");
	if (type == GT_STRING) {
		const char *s;
		uint64_t n;
		return rd_str(r, &s, &n, "string value");
	}
	if (type != GT_ARRAY)
		return arena_errf(r->errbuf, r->errlen, BATON_ESOURCE,
		    "gguf: unknown metadata type %" PRIu32 " at byte %" PRIu64, type, r->pos);
	if (depth >= GGUF_MAX_DEPTH)
		return arena_errf(r->errbuf, r->errlen, BATON_ESOURCE,
		    "gguf: arrays nested deeper than %d", GGUF_MAX_DEPTH);
	uint32_t et;
	uint64_t n;
	if (rd_u32(r, &et, "array type") || rd_u64(r, &n, "array length"))
		return BATON_ESOURCE;
	sz = scalar_size(et);
	if (sz) {
		if (n > rd_left(r) / sz)
			return rd_fail(r, "array");
		return rd_bytes(r, n * sz, NULL, "array");
	}
	/* Strings take at least 8 bytes, arrays 12: cap n before looping. */
	if (et != GT_STRING && et != GT_ARRAY)
		return arena_errf(r->errbuf, r->errlen, BATON_ESOURCE,
		    "gguf: unknown array element type %" PRIu32, et);
	if (n > rd_left(r) / (et == GT_STRING ? 8 : 12))
		return rd_fail(r, "array");
	for (uint64_t i = 0; i < n; i++)
		if (skip_value(r, et, depth + 1))
			return BATON_ESOURCE;
	return 0;
}

#define kv arena_gguf_kv

const struct kv *arena_gguf_kv_find(const struct arena_gguf *g, const char *key)
{
	size_t kl = strlen(key);
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (g->kvs[i].key_len == kl && memcmp(g->kvs[i].key, key, kl) == 0)
			return &g->kvs[i];
	return NULL;
}

static const struct kv *kv_find(const struct kv *kvs, uint64_t n, const char *key)
{
	size_t kl = strlen(key);
	for (uint64_t i = 0; i < n; i++)
		if (kvs[i].key_len == kl && memcmp(kvs[i].key, key, kl) == 0)
			return &kvs[i];
	return NULL;
}

/* An integer of any GGUF integer type, when non-negative. */
int arena_gguf_kv_uint(const uint8_t *b, const struct kv *kv, uint64_t *v)
{
	const uint8_t *p = b + kv->pos;
	switch (kv->type) {
	case GT_U8: *v = p[0]; return 0;
	case GT_I8: if ((int8_t)p[0] < 0) return -1; *v = p[0]; return 0;
	case GT_U16: { uint16_t x; memcpy(&x, p, 2); *v = x; return 0; }
	case GT_I16: { int16_t x; memcpy(&x, p, 2); if (x < 0) return -1; *v = (uint64_t)x; return 0; }
	case GT_U32: { uint32_t x; memcpy(&x, p, 4); *v = x; return 0; }
	case GT_I32: { int32_t x; memcpy(&x, p, 4); if (x < 0) return -1; *v = (uint64_t)x; return 0; }
	case GT_U64: { uint64_t x; memcpy(&x, p, 8); *v = x; return 0; }
	case GT_I64: { int64_t x; memcpy(&x, p, 8); if (x < 0) return -1; *v = (uint64_t)x; return 0; }
	default: return -1;
	}
}

/* Looks up "<arch>.<name>" as a u32; 0 found, 1 missing, else error. */
static int kv_arch_u32(const uint8_t *b, const struct kv *kvs, uint64_t n, const char *arch,
    const char *name, uint32_t *v, char *errbuf, size_t errlen)
{
	char key[160];
	snprintf(key, sizeof key, "%s.%s", arch, name);
	const struct kv *kv = kv_find(kvs, n, key);
	if (!kv)
		return 1;
	uint64_t x;
	if (arena_gguf_kv_uint(b, kv, &x) != 0 || x > UINT32_MAX)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: %s is not an unsigned 32-bit integer", key);
	*v = (uint32_t)x;
	return 0;
}

static const char *const gg_suffix[ARENA_GG_N] = {
	[ARENA_GG_GATE] = "ffn_gate_exps.weight",
	[ARENA_GG_UP] = "ffn_up_exps.weight",
	[ARENA_GG_DOWN] = "ffn_down_exps.weight",
	[ARENA_GG_ROUTER] = "ffn_gate_inp.weight",
	[ARENA_GG_NORM] = "ffn_norm.weight",
};

/* "blk.<N>.<suffix>" -> (N, kind); -1 when the name is none of ours. */
static int gg_name(const char *s, uint64_t len, uint32_t *layer)
{
	if (len < 6 || memcmp(s, "blk.", 4) != 0)
		return -1;
	uint64_t i = 4, n = 0;
	if (s[i] < '0' || s[i] > '9')
		return -1;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
		n = n * 10 + (uint64_t)(s[i] - '0');
		if (n > UINT32_MAX)
			return -1;
	}
	if (i >= len || s[i] != '.')
		return -1;
	i++;
	for (int k = 0; k < ARENA_GG_N; k++) {
		size_t sl = strlen(gg_suffix[k]);
		if (len - i == sl && memcmp(s + i, gg_suffix[k], sl) == 0) {
			*layer = (uint32_t)n;
			return k;
		}
	}
	return -1;
}

void arena_gguf_free(struct arena_gguf *g)
{
	free(g->kvs);
	free(g->tensors);
	free(g->layer_t);
	memset(g, 0, sizeof *g);
}

static void fmt_dims(char *buf, size_t len, const uint64_t *ne, uint32_t n)
{
	size_t k = 0;
	buf[0] = '\0';
	for (uint32_t i = 0; i < n && k + 24 < len; i++) {
		int w = snprintf(buf + k, len - k, "%s%" PRIu64, i ? ", " : "", ne[i]);
		if (w < 0)
			break;
		k += (size_t)w;
	}
}

/* Checks one needed tensor's dims and type. */
static int check_tensor(const struct arena_gguf_tensor *t, uint32_t n_dims, uint64_t ne0,
    uint64_t ne1, uint64_t ne2, char *errbuf, size_t errlen)
{
	const uint64_t want[3] = { ne0, ne1, ne2 };
	int ok = t->n_dims == n_dims;
	for (uint32_t i = 0; ok && i < n_dims; i++)
		ok = t->ne[i] == want[i];
	if (!ok) {
		char got[128], exp[128];
		fmt_dims(got, sizeof got, t->ne, t->n_dims);
		fmt_dims(exp, sizeof exp, want, n_dims);
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: %.*s has ne (%s), the model's shape needs (%s)",
		    (int)t->name_len, t->name, got, exp);
	}
	if (!baton_dtype_name((int)t->type))
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "gguf: %.*s has ggml type %" PRIu32 ", which this build does not know",
		    (int)t->name_len, t->name, t->type);
	return 0;
}

/* ---- duplicates and overlaps (llama.cpp refuses both) ------------------------- */

struct span {
	const char *name;
	uint64_t len;      /* of name */
	uint64_t lo, hi;   /* data bytes [lo, hi) */
};

static int span_by_name(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	uint64_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(x->name, y->name, n);
	return c ? c : (x->len > y->len) - (x->len < y->len);
}

static int span_by_offset(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The first name that appears twice among n (sorted in place), or NULL. */
static const struct span *first_twice(struct span *v, uint64_t n)
{
	qsort(v, n, sizeof *v, span_by_name);
	for (uint64_t i = 1; i < n; i++)
		if (span_by_name(&v[i - 1], &v[i]) == 0)
			return &v[i];
	return NULL;
}

/* Two metadata keys of one name, or two tensors: which one a reader takes
 * is its own choice (this parser took the first, another the last), so the
 * file means two things; two tensors whose data overlap are one tensor
 * read two ways. BATON_ESOURCE for either. */
static int check_unique(const struct kv *kvs, const struct arena_gguf *g, char *errbuf,
    size_t errlen)
{
	uint64_t n = g->n_kv > g->n_tensors ? g->n_kv : g->n_tensors;
	struct span *v = malloc((n ? n : 1) * sizeof *v);
	if (!v)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	int rc = 0;
	for (uint64_t i = 0; i < g->n_kv; i++)
		v[i] = (struct span){ kvs[i].key, kvs[i].key_len, 0, 0 };
	const struct span *d = first_twice(v, g->n_kv);
	if (d) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: metadata key %.*s appears twice", (int)(d->len < 200 ? d->len : 200), d->name);
		goto out;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct arena_gguf_tensor *t = &g->tensors[i];
		v[i] = (struct span){ t->name, t->name_len, t->offset, t->offset + t->bytes };
	}
	if ((d = first_twice(v, g->n_tensors))) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: tensor %.*s appears twice", (int)(d->len < 200 ? d->len : 200), d->name);
		goto out;
	}
	/* Overlaps: among the tensors whose size is known (bytes set; an
	 * unknown type is never read) and not empty. */
	uint64_t k = 0;
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (v[i].hi > v[i].lo)
			v[k++] = v[i];
	qsort(v, k, sizeof *v, span_by_offset);
	for (uint64_t i = 1; i < k; i++)
		if (v[i].lo < v[i - 1].hi) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: the data of tensors %.*s and %.*s overlap",
			    (int)(v[i - 1].len < 200 ? v[i - 1].len : 200), v[i - 1].name,
			    (int)(v[i].len < 200 ? v[i].len : 200), v[i].name);
			goto out;
		}
out:
	free(v);
	return rc;
}

int arena_gguf_parse(const uint8_t *buf, uint64_t size, struct arena_gguf *g,
    char *errbuf, size_t errlen)
{
	struct rd r = { buf, size, 0, errbuf, errlen };
	struct kv *kvs = NULL;
	int rc;
	memset(g, 0, sizeof *g);

	const uint8_t *magic = NULL;
	if (rd_bytes(&r, 4, &magic, "magic") || memcmp(magic, "GGUF", 4) != 0)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "gguf: not a GGUF file (bad magic)");
	if (rd_u32(&r, &g->version, "version"))
		return BATON_ESOURCE;
	if (g->version != 2 && g->version != 3)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: version %" PRIu32 " not supported (2 or 3)", g->version);
	if (rd_u64(&r, &g->n_tensors, "tensor count") || rd_u64(&r, &g->n_kv, "metadata count"))
		return BATON_ESOURCE;
	/* A key-value takes at least 13 bytes, a tensor info at least 24. */
	if (g->n_kv > rd_left(&r) / 13)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: %" PRIu64 " metadata entries cannot fit in the file", g->n_kv);
	if (g->n_tensors > rd_left(&r) / 24 || g->n_tensors > ARENA_MAX_SOURCE_TENSORS)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "gguf: %" PRIu64 " tensors cannot fit in the file", g->n_tensors);

	kvs = calloc(g->n_kv ? g->n_kv : 1, sizeof *kvs);
	if (!kvs)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	for (uint64_t i = 0; i < g->n_kv; i++) {
		struct kv *kv = &kvs[i];
		if (rd_str(&r, &kv->key, &kv->key_len, "metadata key") ||
		    rd_u32(&r, &kv->type, "metadata type")) {
			rc = BATON_ESOURCE;
			goto fail;
		}
		kv->pos = r.pos;
		if ((rc = skip_value(&r, kv->type, 0)))
			goto fail;
	}

	const struct kv *kv = kv_find(kvs, g->n_kv, "general.architecture");
	if (!kv || kv->type != GT_STRING) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "gguf: no general.architecture string");
		goto fail;
	}
	uint64_t alen;
	memcpy(&alen, buf + kv->pos, 8);
	if (alen == 0 || alen >= sizeof g->arch) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "gguf: bad general.architecture");
		goto fail;
	}
	memcpy(g->arch, buf + kv->pos + 8, alen);
	g->arch[alen] = '\0';
	for (uint64_t i = 0; i < alen; i++)
		if (g->arch[i] < 0x21 || g->arch[i] > 0x7e) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: general.architecture has odd characters");
			goto fail;
		}

	g->alignment = 32;
	kv = kv_find(kvs, g->n_kv, "general.alignment");
	if (kv) {
		uint64_t a;
		if (arena_gguf_kv_uint(buf, kv, &a) != 0 || a == 0 || (a & (a - 1)) || a > (1u << 20)) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: general.alignment must be a power of two up to 1 MiB");
			goto fail;
		}
		g->alignment = a;
	}

	static const struct { const char *name; int required; } need[] = {
		{ "block_count", 1 }, { "expert_count", 1 }, { "expert_used_count", 1 },
		{ "embedding_length", 0 }, { "expert_feed_forward_length", 0 },
	};
	uint32_t val[5] = { 0 };
	int have[5] = { 0 };
	for (int i = 0; i < 5; i++) {
		rc = kv_arch_u32(buf, kvs, g->n_kv, g->arch, need[i].name, &val[i], errbuf, errlen);
		if (rc == 1 && need[i].required) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: no %s.%s (is it a mixture-of-experts model?)", g->arch, need[i].name);
			goto fail;
		}
		if (rc > 1)
			goto fail;
		have[i] = rc == 0;
	}
	g->layers = val[0];
	g->experts = val[1];
	g->top_k = val[2];
	if (g->layers == 0 || g->layers > BATON_ARENA_MAX_LAYERS) {
		rc = arena_errf(errbuf, errlen, BATON_ECOUNT, "gguf: %s.block_count %" PRIu32 " not in 1..%u",
		    g->arch, g->layers, BATON_ARENA_MAX_LAYERS);
		goto fail;
	}
	if (g->experts == 0 || g->experts > BATON_ARENA_MAX_EXPERTS) {
		rc = arena_errf(errbuf, errlen, BATON_ECOUNT, "gguf: %s.expert_count %" PRIu32 " not in 1..%u",
		    g->arch, g->experts, BATON_ARENA_MAX_EXPERTS);
		goto fail;
	}
	if (g->top_k == 0 || g->top_k > g->experts) {
		rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "gguf: %s.expert_used_count %" PRIu32 " not in 1..%" PRIu32,
		    g->arch, g->top_k, g->experts);
		goto fail;
	}

	/* Tensor infos. */
	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
	g->layer_t = malloc((size_t)g->layers * ARENA_GG_N * sizeof *g->layer_t);
	if (!g->tensors || !g->layer_t) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
		goto fail;
	}
	memset(g->layer_t, 0xff, (size_t)g->layers * ARENA_GG_N * sizeof *g->layer_t);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct arena_gguf_tensor *t = &g->tensors[i];
		if (rd_str(&r, &t->name, &t->name_len, "tensor name") ||
		    rd_u32(&r, &t->n_dims, "tensor dims")) {
			rc = BATON_ESOURCE;
			goto fail;
		}
		if (t->name_len > GGUF_MAX_NAME || t->n_dims == 0 || t->n_dims > 4) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: tensor %" PRIu64 " has a %" PRIu64 "-byte name and %" PRIu32 " dims",
			    i, t->name_len, t->n_dims);
			goto fail;
		}
		for (uint32_t d = 0; d < 4; d++)
			t->ne[d] = 1;
		for (uint32_t d = 0; d < t->n_dims; d++)
			if (rd_u64(&r, &t->ne[d], "tensor shape")) {
				rc = BATON_ESOURCE;
				goto fail;
			}
		if (rd_u32(&r, &t->type, "tensor type") || rd_u64(&r, &t->offset, "tensor offset")) {
			rc = BATON_ESOURCE;
			goto fail;
		}
		uint32_t layer;
		int k = gg_name(t->name, t->name_len, &layer);
		if (k >= 0) {
			if (layer >= g->layers) {
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
				    "gguf: %.*s is past %s.block_count %" PRIu32,
				    (int)t->name_len, t->name, g->arch, g->layers);
				goto fail;
			}
			uint32_t *slot = &g->layer_t[(size_t)layer * ARENA_GG_N + (uint32_t)k];
			if (*slot != UINT32_MAX) {
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
				    "gguf: tensor %.*s appears twice", (int)t->name_len, t->name);
				goto fail;
			}
			*slot = (uint32_t)i;
		}
	}
	g->data_offset = arena_align_up(r.pos, g->alignment);
	if (g->data_offset > size) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "gguf: no room for tensor data");
		goto fail;
	}

	/* Every tensor's data within the file (those of known type). */
	uint64_t data_size = size - g->data_offset;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct arena_gguf_tensor *t = &g->tensors[i];
		if (t->offset % g->alignment) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: tensor %.*s offset %" PRIu64 " not aligned to %" PRIu64,
			    (int)t->name_len, t->name, t->offset, g->alignment);
			goto fail;
		}
		if (!baton_dtype_name((int)t->type))
			continue; /* checked only if we need it */
		uint64_t rows = 1, rb = baton_dtype_row_bytes((int)t->type, t->ne[0]), bytes = 0;
		int bad = rb == 0 && t->ne[0] != 0;
		for (uint32_t d = 1; d < 4 && !bad; d++)
			bad = __builtin_mul_overflow(rows, t->ne[d], &rows);
		if (!bad)
			bad = __builtin_mul_overflow(rows, rb, &bytes);
		if (bad || t->offset > data_size || bytes > data_size - t->offset) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "gguf: tensor %.*s (%s) runs past the end of the file",
			    (int)t->name_len, t->name, baton_dtype_name((int)t->type));
			goto fail;
		}
		t->bytes = bytes;
		t->offset += g->data_offset;
	}

	if ((rc = check_unique(kvs, g, errbuf, errlen)))
		goto fail;

	/* The MoE tensors of every layer. */
	const struct arena_gguf_tensor *g0 = NULL;
	for (uint32_t l = 0; l < g->layers; l++)
		for (int k = 0; k <= ARENA_GG_ROUTER; k++)
			if (g->layer_t[(size_t)l * ARENA_GG_N + (uint32_t)k] == UINT32_MAX) {
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
				    "gguf: no blk.%" PRIu32 ".%s (every layer must be a MoE layer with "
				    "stacked experts)", l, gg_suffix[k]);
				goto fail;
			}
	g0 = &g->tensors[g->layer_t[ARENA_GG_GATE]];
	g->d_model = have[3] ? val[3] : (uint32_t)(g0->ne[0] <= UINT32_MAX ? g0->ne[0] : 0);
	g->d_ff = have[4] ? val[4] : (uint32_t)(g0->ne[1] <= UINT32_MAX ? g0->ne[1] : 0);
	if (g->d_model == 0 || g->d_model >= ARENA_MAX_DIM || g->d_ff == 0 || g->d_ff >= ARENA_MAX_DIM) {
		rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "gguf: d_model %" PRIu32 " / d_ff %" PRIu32 " not in 1..%u",
		    g->d_model, g->d_ff, ARENA_MAX_DIM - 1);
		goto fail;
	}
	g->has_norm = 1;
	for (uint32_t l = 0; l < g->layers; l++) {
		const uint32_t *lt = &g->layer_t[(size_t)l * ARENA_GG_N];
		if ((rc = check_tensor(&g->tensors[lt[ARENA_GG_GATE]], 3, g->d_model, g->d_ff,
			 g->experts, errbuf, errlen)) ||
		    (rc = check_tensor(&g->tensors[lt[ARENA_GG_UP]], 3, g->d_model, g->d_ff,
			 g->experts, errbuf, errlen)) ||
		    (rc = check_tensor(&g->tensors[lt[ARENA_GG_DOWN]], 3, g->d_ff, g->d_model,
			 g->experts, errbuf, errlen)) ||
		    (rc = check_tensor(&g->tensors[lt[ARENA_GG_ROUTER]], 2, g->d_model, g->experts,
			 1, errbuf, errlen)))
			goto fail;
		if (lt[ARENA_GG_NORM] == UINT32_MAX)
			g->has_norm = 0;
		else if ((rc = check_tensor(&g->tensors[lt[ARENA_GG_NORM]], 1, g->d_model, 1, 1,
			      errbuf, errlen)))
			goto fail;
	}
	/* Identity for reuse: the header and tensor infos, and the size. */
	uint64_t id[2] = { arena_hash(buf, (size_t)g->data_offset), size };
	g->header_hash = arena_hash(id, sizeof id);
	g->kvs = kvs;
	return 0;
fail:
	free(kvs);
	arena_gguf_free(g);
	return rc;
}

/* ---- as a plan ---------------------------------------------------------------- */

struct gguf_src {
	uint8_t *map;
	uint64_t size;
	struct arena_gguf g;
};

static int gguf_fill(void *ctx, const struct arena_file_entry *e, const struct arena_named *n,
    uint8_t *dst, char *errbuf, size_t errlen)
{
	(void)errbuf;
	(void)errlen;
	const struct gguf_src *s = ctx;
	if (e->role == BATON_ROLE_EXPERT) {
		const uint32_t *lt = &s->g.layer_t[(size_t)e->layer * ARENA_GG_N];
		for (int i = 0; i < 3; i++) {
			const struct arena_gguf_tensor *t = &s->g.tensors[lt[ARENA_GG_GATE + i]];
			uint64_t slice = e->part[i].bytes; /* rows * row_bytes, as the tensor's */
			memcpy(dst + e->part[i].offset, s->map + t->offset + e->expert * slice, slice);
		}
	} else {
		arena_gguf_fill_named(s->map, &s->g, n, dst);
	}
	return 0;
}

static const char *base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

int arena_plan_gguf(const char *file, int experts_only, struct arena_plan *plan, char *errbuf,
    size_t errlen)
{
	memset(plan, 0, sizeof *plan);
	if (!file)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "no GGUF file");
	int fd = open(file, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return arena_errf(errbuf, errlen, errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO,
		    "%s: %s", file, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
		close(fd);
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s: not a regular, non-empty file", file);
	}
	struct gguf_src *s = calloc(1, sizeof *s);
	if (!s) {
		close(fd);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	s->size = (uint64_t)st.st_size;
	s->map = mmap(NULL, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (s->map == MAP_FAILED) {
		free(s);
		return arena_errf(errbuf, errlen, BATON_EIO, "%s: mmap: %s", file, strerror(errno));
	}
	char msg[512];
	int rc = arena_gguf_parse(s->map, s->size, &s->g, msg, sizeof msg);
	if (rc) {
		arena_errf(errbuf, errlen, rc, "%s: %s", file, msg);
		munmap(s->map, s->size);
		free(s);
		return rc;
	}
	madvise(s->map, s->size, MADV_WILLNEED);
	const struct arena_gguf *g = &s->g;
	uint32_t *dt = calloc((size_t)g->layers * ARENA_DT_N, sizeof *dt);
	if (!dt) {
		arena_gguf_free(&s->g);
		munmap(s->map, s->size);
		free(s);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	for (uint32_t l = 0; l < g->layers; l++) {
		const uint32_t *lt = &g->layer_t[(size_t)l * ARENA_GG_N];
		uint32_t *d = &dt[(size_t)l * ARENA_DT_N];
		d[ARENA_DT_GATE] = g->tensors[lt[ARENA_GG_GATE]].type;
		d[ARENA_DT_UP] = g->tensors[lt[ARENA_GG_UP]].type;
		d[ARENA_DT_DOWN] = g->tensors[lt[ARENA_GG_DOWN]].type;
		d[ARENA_DT_ROUTER] = g->tensors[lt[ARENA_GG_ROUTER]].type;
		d[ARENA_DT_NORM] = g->has_norm ? g->tensors[lt[ARENA_GG_NORM]].type : BATON_DT_F32;
	}
	plan->shape = (struct baton_arena_shape){
		.layers = g->layers, .experts = g->experts, .top_k = g->top_k,
		.d_model = g->d_model, .d_ff = g->d_ff,
	};
	plan->flags = 0; /* the builder sets ROUTER and NORM from the named list */
	plan->layer_dt = dt;
	plan->source_kind = ARENA_SRC_GGUF;
	/* Identity: the header and tensor infos, the size, and samples of the
	 * tensor data (a re-export with the same metadata is another source). */
	uint64_t id[3] = { g->header_hash, arena_sample_hash(s->map, s->size, g->data_offset),
		(uint64_t)experts_only };
	plan->source_hash = arena_hash(id, sizeof id);
	snprintf(plan->source, sizeof plan->source, "gguf %s (%s%s)", base_name(file), g->arch,
	    experts_only ? ", experts only" : "");
	plan->fill = gguf_fill;
	plan->ctx = s;
	int rc2 = 0;
	if (!experts_only) {
		char m2[512];
		if ((rc2 = arena_gguf_plan_model(s->map, g, plan, m2, sizeof m2)))
			arena_errf(errbuf, errlen, rc2, "%s: %s", file, m2);
	} else {
		/* routers and norms only, under the Hugging Face names */
		for (uint32_t l = 0; l < g->layers && !rc2; l++)
			for (int k = 0; k < 2 && !rc2; k++) {
				if (k == 1 && !g->has_norm)
					continue;
				const uint32_t t = g->layer_t[(size_t)l * ARENA_GG_N +
				    (k ? ARENA_GG_NORM : ARENA_GG_ROUTER)];
				char name[96];
				snprintf(name, sizeof name, k ? "model.layers.%" PRIu32 ".post_attention_layernorm.weight"
				    : "model.layers.%" PRIu32 ".mlp.gate.weight", l);
				struct arena_named *n = arena_plan_add(plan, k ? BATON_ROLE_NORM : BATON_ROLE_ROUTER,
				    name);
				if (!n) {
					rc2 = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
					break;
				}
				n->layer = l;
				n->dtype = g->tensors[t].type;
				n->rows = k ? 1 : g->experts;
				n->cols = g->d_model;
				n->src = t;
			}
	}
	if (rc2) {
		arena_plan_free_named(plan);
		arena_gguf_plan_free(plan);
		return rc2;
	}
	return 0;
}

void arena_gguf_plan_free(struct arena_plan *plan)
{
	struct gguf_src *s = plan->ctx;
	if (s) {
		arena_gguf_free(&s->g);
		munmap(s->map, s->size);
		free(s);
	}
	free(plan->layer_dt);
	memset(plan, 0, sizeof *plan);
}
