/*
 * safetensors.c: Hugging Face safetensors as an arena source: one file, or
 * a folder with model.safetensors.index.json (its weight_map names each
 * tensor's shard) or a lone model.safetensors.
 *
 *   u64 little-endian N, N bytes of JSON header, then the data.
 *   header: { "name": { "dtype": "BF16", "shape": [rows, cols],
 *             "data_offsets": [begin, end] }, ..., "__metadata__": {...} }
 *   offsets are relative to the byte after the header.
 *
 * MoE names (Qwen-MoE, OLMoE, DeepSeek style, and Mixtral's):
 *   model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight
 *   model.layers.N.block_sparse_moe.experts.E.{w1,w3,w2}.weight
 *   model.layers.N.mlp.gate.weight | model.layers.N.block_sparse_moe.gate.weight
 *   model.layers.N.post_attention_layernorm.weight       (optional)
 * torch's (out, in) shape is the arena's (rows, cols): gate and up are
 * (d_ff, d_model), down (d_model, d_ff), the router (n_experts, d_model).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena/arena_int.h"

#define ST_MAX_SHARDS 4096u
#define ST_MAX_INDEX (64u << 20)

static const struct {
	const char *name;
	int dtype;
	uint32_t size;
} st_dtypes[] = {
	{ "F64", BATON_DT_F64, 8 }, { "F32", BATON_DT_F32, 4 }, { "F16", BATON_DT_F16, 2 },
	{ "BF16", BATON_DT_BF16, 2 }, { "I64", BATON_DT_I64, 8 }, { "I32", BATON_DT_I32, 4 },
	{ "I16", BATON_DT_I16, 2 }, { "I8", BATON_DT_I8, 1 },
	/* no ggml type: accepted in a file, refused if we need the tensor */
	{ "U64", -1, 8 }, { "U32", -1, 4 }, { "U16", -1, 2 }, { "U8", -1, 1 },
	{ "BOOL", -1, 1 }, { "F8_E4M3", -1, 1 }, { "F8_E5M2", -1, 1 },
};

void arena_st_free(struct arena_st_header *h)
{
	for (uint64_t i = 0; i < h->n_tensors; i++)
		free(h->tensors[i].name);
	free(h->tensors);
	memset(h, 0, sizeof *h);
}

/* A whole number >= 0 (the reader policy of base.h: integral reals too). */
static int json_u64(const json_t *v, uint64_t *out)
{
	int64_t x;
	if (baton_json_whole(v, 0, INT64_MAX, &x) != 0)
		return -1;
	*out = (uint64_t)x;
	return 0;
}

static int by_offset(const void *a, const void *b)
{
	const struct arena_st_tensor *x = *(const struct arena_st_tensor *const *)a;
	const struct arena_st_tensor *y = *(const struct arena_st_tensor *const *)b;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Two tensors over the same bytes are one tensor read two ways (the
 * safetensors library refuses the file too): BATON_ESOURCE. Empty
 * tensors take no bytes and overlap nothing. */
static int check_overlap(const struct arena_st_header *h, char *errbuf, size_t errlen)
{
	const struct arena_st_tensor **v = malloc((h->n_tensors ? h->n_tensors : 1) * sizeof *v);
	if (!v)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	uint64_t k = 0;
	for (uint64_t i = 0; i < h->n_tensors; i++)
		if (h->tensors[i].bytes)
			v[k++] = &h->tensors[i];
	qsort(v, k, sizeof *v, by_offset);
	int rc = 0;
	for (uint64_t i = 1; i < k && !rc; i++)
		if (v[i]->offset < v[i - 1]->offset + v[i - 1]->bytes)
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: the data of %.200s and %.200s overlap", v[i - 1]->name, v[i]->name);
	free(v);
	return rc;
}

int arena_st_parse(const uint8_t *buf, uint64_t size, struct arena_st_header *h,
    char *errbuf, size_t errlen)
{
	memset(h, 0, sizeof *h);
	if (size < 8)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "safetensors: %" PRIu64 " bytes, too short for the header length", size);
	memcpy(&h->header_len, buf, 8);
	if (h->header_len < 2 || h->header_len > ARENA_ST_MAX_HEADER)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "safetensors: header length %" PRIu64 " not in 2..%u", h->header_len,
		    ARENA_ST_MAX_HEADER);
	if (h->header_len > size - 8)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "safetensors: header of %" PRIu64 " bytes runs past the end of the %" PRIu64
		    "-byte file", h->header_len, size);
	h->data_offset = 8 + h->header_len;
	uint64_t data_size = size - h->data_offset;

	json_error_t jerr;
	json_t *root = baton_json_load((const char *)buf + 8, (size_t)h->header_len,
	    JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &jerr);
	if (!root)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "safetensors: header is not JSON: %s (line %d)", jerr.text, jerr.line);
	int rc = 0;
	if (!json_is_object(root)) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "safetensors: header is not a JSON object");
		goto out;
	}
	size_t n = json_object_size(root);
	h->tensors = calloc(n ? n : 1, sizeof *h->tensors);
	if (!h->tensors) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
		goto out;
	}
	const char *key;
	json_t *val;
	json_object_foreach(root, key, val) {
		if (strcmp(key, "__metadata__") == 0)
			continue;
		struct arena_st_tensor *t = &h->tensors[h->n_tensors];
		if (!json_is_object(val)) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: %.200s: not an object", key);
			goto out;
		}
		const json_t *jd = json_object_get(val, "dtype");
		const json_t *js = json_object_get(val, "shape");
		const json_t *jo = json_object_get(val, "data_offsets");
		if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
		    json_array_size(jo) != 2) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: %.200s: needs dtype, shape and data_offsets [begin, end]", key);
			goto out;
		}
		t->name = strdup(key);
		if (!t->name) {
			rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
			goto out;
		}
		h->n_tensors++;
		const char *ds = json_string_value(jd);
		uint32_t esize = 0;
		t->dtype = -1;
		for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
			if (strcmp(ds, st_dtypes[i].name) == 0) {
				t->dtype = st_dtypes[i].dtype;
				esize = st_dtypes[i].size;
			}
		snprintf(t->st_dtype, sizeof t->st_dtype, "%s", ds);
		if (json_array_size(js) > 8) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: %.200s: more than 8 dimensions", key);
			goto out;
		}
		t->n_dims = (uint32_t)json_array_size(js);
		uint64_t elems = 1;
		int bad = 0;
		for (uint32_t i = 0; i < t->n_dims && !bad; i++)
			bad = json_u64(json_array_get(js, i), &t->shape[i]) != 0 ||
			    __builtin_mul_overflow(elems, t->shape[i], &elems);
		uint64_t begin = 0, end = 0;
		bad = bad || json_u64(json_array_get(jo, 0), &begin) != 0 ||
		    json_u64(json_array_get(jo, 1), &end) != 0;
		if (bad) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: %.200s: bad shape or data_offsets", key);
			goto out;
		}
		if (begin > end || end > data_size) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: %.200s: data [%" PRIu64 ", %" PRIu64 ") outside the %" PRIu64
			    "-byte data section", key, begin, end, data_size);
			goto out;
		}
		uint64_t want;
		if (esize && (__builtin_mul_overflow(elems, (uint64_t)esize, &want) ||
				 want != end - begin)) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "safetensors: %.200s: %" PRIu64 " bytes, its %s shape needs %" PRIu64,
			    key, end - begin, ds, elems * esize);
			goto out;
		}
		t->offset = h->data_offset + begin;
		t->bytes = end - begin;
	}
	rc = check_overlap(h, errbuf, errlen);
out:
	json_decref(root);
	if (rc)
		arena_st_free(h);
	return rc;
}

/* ---- names ------------------------------------------------------------------ */

enum { K_GATE, K_UP, K_DOWN, K_ROUTER, K_NORM, K_GATE_UP, K_DOWN_ALL };

static int eat(const char **s, const char *lit)
{
	size_t n = strlen(lit);
	if (strncmp(*s, lit, n) != 0)
		return 0;
	*s += n;
	return 1;
}

static int eat_num(const char **s, uint32_t *v)
{
	const char *p = *s;
	uint64_t n = 0;
	if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
		return 0;
	for (; *p >= '0' && *p <= '9'; p++)
		if ((n = n * 10 + (uint64_t)(*p - '0')) > UINT32_MAX)
			return 0;
	*v = (uint32_t)n;
	*s = p;
	return 1;
}

/* Returns K_* or -1; fills layer and expert. Experts come one tensor per
 * expert and part (what save_pretrained writes, transformers 4 and 5), or
 * fused per layer as transformers 5 holds them in memory:
 * mlp.experts.gate_up_proj [E, 2 I, H] (gate rows first) and
 * mlp.experts.down_proj [E, H, I], with or without ".weight". */
static int st_name(const char *s, uint32_t *layer, uint32_t *expert)
{
	*expert = 0;
	if (!eat(&s, "model.layers.") || !eat_num(&s, layer) || !eat(&s, "."))
		return -1;
	if (strcmp(s, "post_attention_layernorm.weight") == 0)
		return K_NORM;
	if (strcmp(s, "mlp.gate.weight") == 0 || strcmp(s, "block_sparse_moe.gate.weight") == 0)
		return K_ROUTER;
	if (strcmp(s, "mlp.experts.gate_up_proj") == 0 || strcmp(s, "mlp.experts.gate_up_proj.weight") == 0)
		return K_GATE_UP;
	if (strcmp(s, "mlp.experts.down_proj") == 0 || strcmp(s, "mlp.experts.down_proj.weight") == 0)
		return K_DOWN_ALL;
	int mixtral;
	if (eat(&s, "mlp.experts."))
		mixtral = 0;
	else if (eat(&s, "block_sparse_moe.experts."))
		mixtral = 1;
	else
		return -1;
	if (!eat_num(&s, expert) || !eat(&s, "."))
		return -1;
	static const char *const hf[3] = { "gate_proj.weight", "up_proj.weight", "down_proj.weight" };
	static const char *const mx[3] = { "w1.weight", "w3.weight", "w2.weight" };
	for (int k = 0; k < 3; k++)
		if (strcmp(s, mixtral ? mx[k] : hf[k]) == 0)
			return k;
	return -1;
}

/* ---- as a plan --------------------------------------------------------------- */

struct shard {
	char *path;
	uint8_t *map;
	uint64_t size;
	struct arena_st_header h;
};

struct ref {
	uint32_t shard;
	uint32_t tensor;
};

/* One expert part: a tensor and where in it (fused tensors hold many). */
struct xref {
	struct ref r;
	uint64_t off;
};

struct st_src {
	struct shard *shards;
	uint32_t n_shards;
	uint32_t layers, experts;
	struct xref *experts_t; /* [(layer * experts + expert) * 3 + part] */
};

static const struct arena_st_tensor *ref_t(const struct st_src *s, struct ref r)
{
	return &s->shards[r.shard].h.tensors[r.tensor];
}

static int st_fill(void *ctx, const struct arena_file_entry *e, const struct arena_named *n,
    uint8_t *dst, char *errbuf, size_t errlen)
{
	(void)errbuf;
	(void)errlen;
	const struct st_src *s = ctx;
	if (e->role == BATON_ROLE_EXPERT) {
		for (int i = 0; i < 3; i++) {
			struct xref x = s->experts_t[((size_t)e->layer * s->experts + e->expert) * 3 + (size_t)i];
			memcpy(dst + e->part[i].offset,
			    s->shards[x.r.shard].map + ref_t(s, x.r)->offset + x.off, e->part[i].bytes);
		}
	} else {
		struct ref r = { (uint32_t)(n->src >> 32), (uint32_t)n->src };
		memcpy(dst, s->shards[r.shard].map + ref_t(s, r)->offset, e->part[0].bytes);
	}
	return 0;
}

static void st_src_free(struct st_src *s)
{
	if (!s)
		return;
	for (uint32_t i = 0; i < s->n_shards; i++) {
		arena_st_free(&s->shards[i].h);
		if (s->shards[i].map && s->shards[i].map != MAP_FAILED)
			munmap(s->shards[i].map, s->shards[i].size);
		free(s->shards[i].path);
	}
	free(s->shards);
	free(s->experts_t);
	free(s);
}

/* The folder a file beside the weights must be in: dir itself, or for a
 * Hugging Face cache snapshot (.../models--X/snapshots/REV, whose files
 * are links to ../../blobs/HASH) the repository's cache folder. */
static int inside_root(const char *dir, char *root, size_t len)
{
	char real[PATH_MAX];
	if (!realpath(dir, real) || strlen(real) >= len)
		return -1;
	snprintf(root, len, "%s", real);
	char *sl = strrchr(root, '/');
	if (sl && sl > root) {
		*sl = '\0';
		char *up = strrchr(root, '/');
		if (up && strcmp(up + 1, "snapshots") == 0 && up > root) {
			*up = '\0';
			return 0;
		}
	}
	snprintf(root, len, "%s", real);
	return 0;
}

/* Maps a source file read-only. With `dir`, the file is one of the model
 * folder's, so it must be a regular file inside that folder (issue 28: a
 * chat_template.jinja linked to /etc/passwd was embedded in the arena,
 * which the service group reads): a link is followed only to a file still
 * inside it (inside_root), and what it names is opened O_NOFOLLOW. dir
 * NULL: the file the user named, followed as given. */
static int map_file(const char *dir, const char *path, uint64_t max, uint8_t **map,
    uint64_t *size, char *errbuf, size_t errlen)
{
	char real[PATH_MAX], root[PATH_MAX];
	const char *open_as = path;
	if (dir) {
		if (!realpath(path, real))
			return arena_errf(errbuf, errlen, errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO,
			    "%s: %s", path, strerror(errno));
		size_t rl;
		if (inside_root(dir, root, sizeof root) != 0 || (rl = strlen(root),
		    strncmp(real, root, rl) != 0 || (real[rl] != '/' && rl != 1)))
			return arena_errf(errbuf, errlen, BATON_EPERM,
			    "%s: a link to %s, outside the model folder: refusing to read it", path, real);
		open_as = real;
	}
	int fd = open(open_as, O_RDONLY | O_CLOEXEC | (dir ? O_NOFOLLOW : 0));
	if (fd < 0)
		return arena_errf(errbuf, errlen, errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO,
		    "%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0 ||
	    (uint64_t)st.st_size > max) {
		close(fd);
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "%s: not a regular file of 1..%" PRIu64 " bytes", path, max);
	}
	*size = (uint64_t)st.st_size;
	*map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (*map == MAP_FAILED)
		return arena_errf(errbuf, errlen, BATON_EIO, "%s: mmap: %s", path, strerror(errno));
	return 0;
}

/* dir: the model folder the shard must be in (map_file); NULL for the
 * file the user named. */
static int add_shard(struct st_src *s, const char *dir, const char *path, uint32_t *idx,
    char *errbuf, size_t errlen)
{
	for (uint32_t i = 0; i < s->n_shards; i++)
		if (strcmp(s->shards[i].path, path) == 0) {
			*idx = i;
			return 0;
		}
	if (s->n_shards >= ST_MAX_SHARDS)
		return arena_errf(errbuf, errlen, BATON_ECOUNT, "more than %u shards", ST_MAX_SHARDS);
	if ((s->n_shards & (s->n_shards - 1)) == 0) { /* grow at powers of two */
		struct shard *n = realloc(s->shards, (s->n_shards ? 2 * s->n_shards : 1) * sizeof *n);
		if (!n)
			return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
		s->shards = n;
	}
	struct shard *sh = &s->shards[s->n_shards];
	memset(sh, 0, sizeof *sh);
	sh->path = strdup(path);
	if (!sh->path)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	s->n_shards++;
	int rc = map_file(dir, path, UINT64_MAX, &sh->map, &sh->size, errbuf, errlen);
	if (rc) {
		sh->map = NULL;
		return rc;
	}
	char msg[512];
	if ((rc = arena_st_parse(sh->map, sh->size, &sh->h, msg, sizeof msg)))
		return arena_errf(errbuf, errlen, rc, "%s: %s", path, msg);
	madvise(sh->map, sh->size, MADV_WILLNEED);
	*idx = s->n_shards - 1;
	return 0;
}

struct found {
	int kind;             /* K_*, or -1 for any other tensor */
	uint32_t layer, expert;
	struct ref r;
};

static int collect(struct found **list, size_t *n, size_t *cap, const char *name, struct ref r)
{
	uint32_t layer = 0, expert = 0;
	int k = st_name(name, &layer, &expert);
	if (*n == *cap) {
		size_t nc = *cap ? 2 * *cap : 256;
		struct found *nl = realloc(*list, nc * sizeof *nl);
		if (!nl)
			return -1;
		*list = nl;
		*cap = nc;
	}
	(*list)[(*n)++] = (struct found){ k, layer, expert, r };
	return 0;
}

/* Reads a small file beside the weights (config, tokenizer); 1 when it is
 * not there. */
static int read_small(const char *dir, const char *name, char **data, uint64_t *len,
    char *errbuf, size_t errlen)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "path too long");
	if (access(path, F_OK) != 0)
		return 1;
	uint8_t *m;
	uint64_t n;
	int rc = map_file(dir, path, ARENA_MAX_BLOB, &m, &n, errbuf, errlen);
	if (rc)
		return rc;
	*data = malloc(n);
	if (!*data) {
		munmap(m, n);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	memcpy(*data, m, n);
	munmap(m, n);
	*len = n;
	return 0;
}

/* config.json beside the weights (experts-only imports): num_experts_per_tok,
 * and the expert count to check against. */
static void read_config(const char *dir, uint32_t *top_k, uint32_t *n_experts)
{
	char *data = NULL;
	uint64_t len = 0;
	if (read_small(dir, "config.json", &data, &len, NULL, 0) != 0)
		return;
	json_error_t jerr;
	json_t *c = baton_json_load(data, (size_t)len, 0, &jerr);
	free(data);
	if (!c)
		return;
	uint64_t v;
	if (json_u64(json_object_get(c, "num_experts_per_tok"), &v) == 0 && v <= UINT32_MAX)
		*top_k = (uint32_t)v;
	static const char *const keys[] = { "num_experts", "num_local_experts", "n_routed_experts" };
	for (size_t i = 0; i < 3; i++)
		if (json_u64(json_object_get(c, keys[i]), &v) == 0 && v <= UINT32_MAX) {
			*n_experts = (uint32_t)v;
			break;
		}
	json_decref(c);
}

static const char *part_name(int k)
{
	static const char *const n[] = { "gate", "up", "down", "router", "norm" };
	return n[k];
}

/* The metadata files of a Hugging Face folder that go into the arena. */
static const struct {
	const char *name;
	int json, required;
} hf_blobs[] = {
	{ "config.json", 1, 1 }, { "generation_config.json", 1, 0 }, { "tokenizer.json", 1, 0 },
	{ "tokenizer_config.json", 1, 0 }, { "special_tokens_map.json", 1, 0 },
	{ "chat_template.jinja", 0, 0 }, { "chat_template.json", 1, 0 },
	/* transformers 5 saves the named templates beside the default there */
	{ "additional_chat_templates/tool_use.jinja", 0, 0 },
};

/* Adds hf_blobs[i] from dir to the plan (checked as JSON where it is;
 * config.json also parsed into *cfg) and folds it into *hsum. 1 when the
 * file is absent (nothing added), else 0 or an error. */
static int add_hf_blob(size_t i, const char *src, const char *dir, struct arena_model_cfg *cfg,
    struct arena_plan *plan, uint64_t *hsum, char *errbuf, size_t errlen)
{
	char *data = NULL;
	uint64_t len = 0;
	int rc = read_small(dir, hf_blobs[i].name, &data, &len, errbuf, errlen);
	if (rc)
		return rc;
	json_t *j = NULL;
	if (hf_blobs[i].json) {
		json_error_t jerr;
		/* the reader policy of base.h: tokenizer_config.json's
		 * model_max_length is often 1e30 written as an integer */
		j = baton_json_load(data, (size_t)len, JSON_REJECT_DUPLICATES, &jerr);
		if (!j) {
			free(data);
			return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s/%s: not JSON: %s (line %d)",
			    dir, hf_blobs[i].name, jerr.text, jerr.line);
		}
	}
	if (i == 0) {
		char msg[512];
		rc = arena_model_from_config(j, cfg, msg, sizeof msg);
		if (rc) {
			json_decref(j);
			free(data);
			return arena_errf(errbuf, errlen, rc, "%s: %s", src, msg);
		}
	}
	json_decref(j);
	uint64_t id[2] = { *hsum, arena_hash(data, (size_t)len) };
	*hsum = arena_hash(id, sizeof id);
	return arena_plan_add_blob(plan, hf_blobs[i].name, data, len, errbuf, errlen);
}

int arena_plan_add_tokenizer(struct arena_plan *plan, const char *dir, uint64_t *hsum,
    char *errbuf, size_t errlen)
{
	int rc, have_tok = 0;
	/* every file but config.json: the synthetic model has its own */
	for (size_t i = 1; i < sizeof hf_blobs / sizeof hf_blobs[0]; i++) {
		if ((rc = add_hf_blob(i, dir, dir, NULL, plan, hsum, errbuf, errlen)) < 0 || rc > 1)
			return rc;
		if (rc == 0 && strcmp(hf_blobs[i].name, "tokenizer.json") == 0)
			have_tok = 1;
	}
	if (!have_tok)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s: no tokenizer.json", dir);
	return 0;
}

/* A whole model: the config, the blobs and every dense tensor. */
static int plan_model(struct st_src *s, const char *src, const char *dir, struct found *list,
    size_t nlist, struct arena_model_cfg *cfg, struct arena_plan *plan, uint64_t *hsum,
    char *errbuf, size_t errlen)
{
	int rc;
	for (size_t i = 0; i < sizeof hf_blobs / sizeof hf_blobs[0]; i++)
		if ((rc = add_hf_blob(i, src, dir, cfg, plan, hsum, errbuf, errlen)) < 0 || rc > 1)
			return rc;
		else if (rc == 1 && hf_blobs[i].required)
			return arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s: no %s (a whole-model import needs it; --experts-only imports the "
			    "experts alone)", src, hf_blobs[i].name);

	struct arena_model_tensor *mt = NULL;
	uint64_t nt = 0;
	if ((rc = arena_model_tensors(cfg, &mt, &nt, errbuf, errlen)))
		return rc;
	uint8_t *seen = calloc(nt ? nt : 1, 1);
	if (!seen) {
		free(mt);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < nlist; i++) {
		const struct found *f = &list[i];
		const struct arena_st_tensor *t = ref_t(s, f->r);
		if (f->kind >= 0 && f->kind != K_ROUTER && f->kind != K_NORM)
			continue; /* an expert's */
		char name[ARENA_MAX_NAME + 1];
		if (f->kind == K_ROUTER) /* transformers 5 names mixtral's mlp.gate */
			arena_model_router_name(cfg->arch, f->layer, name, sizeof name);
		else
			snprintf(name, sizeof name, "%s", t->name);
		struct arena_model_tensor *m = arena_model_find(mt, nt, name);
		if (!m) {
			size_t nl = strlen(t->name);
			if (nl >= 20 && strcmp(t->name + nl - 20, "rotary_emb.inv_freq") == 0)
				continue; /* recomputed from the config, as transformers does */
			rc = arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "%s: tensor %.200s is not part of a %s model as this build knows it "
			    "(not imported rather than ignored)", src, t->name, cfg->arch);
			goto out;
		}
		uint64_t mi = (uint64_t)(m - mt);
		if (seen[mi]) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "%s: %s appears twice", src, m->name);
			goto out;
		}
		seen[mi] = 1;
		int ok = (t->n_dims == 2 && t->shape[0] == m->rows && t->shape[1] == m->cols) ||
		    (m->rows == 1 && t->n_dims == 1 && t->shape[0] == m->cols);
		if (!ok) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s: %s has shape %s[%" PRIu64 ", %" PRIu64 "], the config says [%" PRIu32
			    ", %" PRIu32 "]", src, t->name, t->n_dims > 2 ? "(more than 2-D) " : "",
			    t->shape[0], t->n_dims > 1 ? t->shape[1] : 0, m->rows, m->cols);
			goto out;
		}
		if (t->dtype < 0) {
			rc = arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "%s: %s has dtype %s, which has no ggml type (F32, F16, BF16, F64, I8..I64 "
			    "are supported)", src, t->name, t->st_dtype);
			goto out;
		}
		rc = arena_plan_add_tensor(plan, m, (uint32_t)t->dtype, (uint64_t)f->r.shard << 32 | f->r.tensor, errbuf,
		    errlen);
		if (rc)
			goto out;
	}
	for (uint64_t i = 0; i < nt; i++)
		if (!seen[i] && mt[i].required) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s: no tensor %s (a %s model needs it)", src, mt[i].name, cfg->arch);
			goto out;
		}
	rc = 0;
out:
	free(seen);
	free(mt);
	return rc;
}

static int set_xref(struct st_src *s, uint32_t l, uint32_t x, int k, struct xref v,
    const char *src, char *errbuf, size_t errlen)
{
	struct xref *slot = &s->experts_t[((size_t)l * s->experts + x) * 3 + (size_t)k];
	if (slot->r.shard != UINT32_MAX)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "%s: layer %" PRIu32 " expert %" PRIu32 "'s %s appears twice (%s)", src, l, x,
		    part_name(k), ref_t(s, v.r)->name);
	*slot = v;
	return 0;
}

int arena_plan_safetensors(const char *src, uint32_t top_k, int experts_only,
    struct arena_plan *plan, char *errbuf, size_t errlen)
{
	memset(plan, 0, sizeof *plan);
	if (!src)
		return arena_errf(errbuf, errlen, BATON_EINVAL, "no safetensors path");
	struct st_src *s = calloc(1, sizeof *s);
	struct found *list = NULL;
	size_t nlist = 0, cap = 0;
	uint32_t *dt = NULL;
	json_t *index = NULL;
	char dir[PATH_MAX], path[PATH_MAX];
	struct arena_model_cfg cfg;
	int rc = 0;
	if (!s)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");

	struct stat st;
	if (stat(src, &st) != 0) {
		rc = arena_errf(errbuf, errlen, errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO,
		    "%s: %s", src, strerror(errno));
		goto fail;
	}
	if (S_ISDIR(st.st_mode)) {
		snprintf(dir, sizeof dir, "%s", src);
		if (snprintf(path, sizeof path, "%s/model.safetensors.index.json", src) >= (int)sizeof path) {
			rc = arena_errf(errbuf, errlen, BATON_EINVAL, "path too long");
			goto fail;
		}
	} else {
		const char *sl = strrchr(src, '/');
		if (sl)
			snprintf(dir, sizeof dir, "%.*s", (int)(sl - src), src);
		else
			snprintf(dir, sizeof dir, ".");
		snprintf(path, sizeof path, "%s", src);
	}

	if (S_ISDIR(st.st_mode) && access(path, F_OK) == 0) {
		/* A sharded model: the index says which shard has what. */
		uint8_t *im;
		uint64_t isz;
		if ((rc = map_file(dir, path, ST_MAX_INDEX, &im, &isz, errbuf, errlen)))
			goto fail;
		json_error_t jerr;
		index = baton_json_load((const char *)im, (size_t)isz, JSON_REJECT_DUPLICATES, &jerr);
		munmap(im, isz);
		const json_t *wm = index ? json_object_get(index, "weight_map") : NULL;
		if (!json_is_object(wm)) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "%s: %s", path,
			    index ? "no weight_map object" : jerr.text);
			goto fail;
		}
		const char *name;
		json_t *file;
		json_object_foreach((json_t *)wm, name, file) {
			uint32_t layer, expert;
			if (experts_only && st_name(name, &layer, &expert) < 0)
				continue;
			const char *fn = json_string_value(file);
			if (!fn || !*fn || strchr(fn, '/') || strcmp(fn, "..") == 0 || strcmp(fn, ".") == 0) {
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
				    "%s: weight_map of %.200s is not a file name in the folder", path, name);
				goto fail;
			}
			char sp[PATH_MAX];
			if (snprintf(sp, sizeof sp, "%s/%s", dir, fn) >= (int)sizeof sp) {
				rc = arena_errf(errbuf, errlen, BATON_EINVAL, "path too long");
				goto fail;
			}
			uint32_t si;
			if ((rc = add_shard(s, dir, sp, &si, errbuf, errlen)))
				goto fail;
			const struct arena_st_header *h = &s->shards[si].h;
			uint64_t ti = UINT64_MAX;
			for (uint64_t i = 0; i < h->n_tensors; i++)
				if (strcmp(h->tensors[i].name, name) == 0)
					ti = i;
			if (ti == UINT64_MAX) {
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
				    "%s: the index puts %.200s in %s, which does not have it", path, name, fn);
				goto fail;
			}
			if (collect(&list, &nlist, &cap, name, (struct ref){ si, (uint32_t)ti })) {
				rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
				goto fail;
			}
		}
	} else {
		if (S_ISDIR(st.st_mode) &&
		    snprintf(path, sizeof path, "%s/model.safetensors", src) >= (int)sizeof path) {
			rc = arena_errf(errbuf, errlen, BATON_EINVAL, "path too long");
			goto fail;
		}
		if (S_ISDIR(st.st_mode) && access(path, F_OK) != 0) {
			rc = arena_errf(errbuf, errlen, BATON_ENOTFOUND,
			    "%s: no model.safetensors.index.json and no model.safetensors", src);
			goto fail;
		}
		uint32_t si;
		if ((rc = add_shard(s, S_ISDIR(st.st_mode) ? dir : NULL, path, &si, errbuf, errlen)))
			goto fail;
		const struct arena_st_header *h = &s->shards[si].h;
		for (uint64_t i = 0; i < h->n_tensors; i++)
			if (collect(&list, &nlist, &cap, h->tensors[i].name, (struct ref){ si, (uint32_t)i })) {
				rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
				goto fail;
			}
	}

	uint64_t hsum = 0;
	if (!experts_only) {
		/* the config first: it says what the tensors must be */
		char *cj = NULL;
		uint64_t cl = 0;
		rc = read_small(dir, "config.json", &cj, &cl, errbuf, errlen);
		free(cj);
		if (rc == 1) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s: no config.json beside the weights (a whole-model import needs it; "
			    "--experts-only imports the experts alone)", src);
			goto fail;
		}
		if (rc)
			goto fail;
		if ((rc = plan_model(s, src, dir, list, nlist, &cfg, plan, &hsum, errbuf, errlen)))
			goto fail;
	}

	/* The shape: from the config, or from the names. */
	uint32_t L = 0, E = 0, d_model = 0, d_ff = 0;
	if (!experts_only) {
		L = cfg.layers;
		E = cfg.experts;
		d_model = cfg.hidden;
		d_ff = cfg.moe_ff;
	}
	for (size_t i = 0; i < nlist; i++) {
		const struct found *f = &list[i];
		if (f->kind < 0 || f->kind == K_ROUTER || f->kind == K_NORM)
			continue;
		const struct arena_st_tensor *t = ref_t(s, f->r);
		if (f->layer >= BATON_ARENA_MAX_LAYERS || f->expert >= BATON_ARENA_MAX_EXPERTS ||
		    (!experts_only && f->layer >= L)) {
			rc = arena_errf(errbuf, errlen, BATON_ECOUNT,
			    "%s: %s is past the model's layers or experts", src, t->name);
			goto fail;
		}
		if (experts_only) {
			uint32_t ne = f->expert + 1;
			if (f->kind >= K_GATE_UP) {
				if (t->n_dims != 3 || t->shape[0] == 0 || t->shape[0] > BATON_ARENA_MAX_EXPERTS) {
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: %s is not a 3-D [experts, rows, cols] tensor", src, t->name);
					goto fail;
				}
				ne = (uint32_t)t->shape[0];
			}
			L = f->layer + 1 > L ? f->layer + 1 : L;
			E = ne > E ? ne : E;
		}
	}
	if (L == 0 || E == 0) {
		rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "%s: no expert tensors (model.layers.N.mlp.experts.E.gate_proj.weight); "
		    "is it a mixture-of-experts model?", src);
		goto fail;
	}
	s->layers = L;
	s->experts = E;
	s->experts_t = malloc((size_t)L * E * 3 * sizeof *s->experts_t);
	dt = calloc((size_t)L * ARENA_DT_N, sizeof *dt);
	if (!s->experts_t || !dt) {
		rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
		goto fail;
	}
	memset(s->experts_t, 0xff, (size_t)L * E * 3 * sizeof *s->experts_t);
	struct ref *dense = experts_only ? malloc((size_t)L * 2 * sizeof *dense) : NULL;
	if (experts_only) {
		if (!dense) {
			rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
			goto fail;
		}
		memset(dense, 0xff, (size_t)L * 2 * sizeof *dense);
	}
	for (size_t i = 0; i < nlist; i++) {
		struct found *f = &list[i];
		const struct arena_st_tensor *t = ref_t(s, f->r);
		if (f->kind < 0)
			continue;
		if (f->kind == K_ROUTER || f->kind == K_NORM) {
			if (!experts_only || f->layer >= L)
				continue; /* a whole model's are named; a dense layer's norm */
			struct ref *slot = &dense[(size_t)f->layer * 2 + (f->kind == K_NORM)];
			if (slot->shard != UINT32_MAX) {
				free(dense);
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "%s: %s appears twice", src,
				    t->name);
				goto fail;
			}
			*slot = f->r;
			continue;
		}
		if (f->kind <= K_DOWN) {
			if (f->expert >= E) {
				rc = arena_errf(errbuf, errlen, BATON_ECOUNT, "%s: %s is past the %" PRIu32
				    " experts", src, t->name, E);
				goto dfail;
			}
			if ((rc = set_xref(s, f->layer, f->expert, f->kind, (struct xref){ f->r, 0 }, src,
				 errbuf, errlen)))
				goto dfail;
			continue;
		}
		/* fused: [E, 2 I, H] gate then up, or [E, H, I] */
		if (experts_only && !d_ff) {
			if (t->n_dims == 3 && f->kind == K_GATE_UP && t->shape[1] % 2 == 0 &&
			    t->shape[1] / 2 < ARENA_MAX_DIM && t->shape[2] < ARENA_MAX_DIM) {
				d_ff = (uint32_t)(t->shape[1] / 2);
				d_model = (uint32_t)t->shape[2];
			} else if (t->n_dims == 3 && f->kind == K_DOWN_ALL && t->shape[1] < ARENA_MAX_DIM &&
			    t->shape[2] < ARENA_MAX_DIM) {
				d_model = (uint32_t)t->shape[1];
				d_ff = (uint32_t)t->shape[2];
			}
		}
		uint64_t r1 = f->kind == K_GATE_UP ? 2 * (uint64_t)d_ff : d_model;
		uint64_t c1 = f->kind == K_GATE_UP ? d_model : d_ff;
		uint64_t es = t->dtype >= 0 ? baton_dtype_row_bytes(t->dtype, 1) : 0;
		if (t->n_dims != 3 || t->shape[0] != E || t->shape[1] != r1 || t->shape[2] != c1 || !es) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s: %s is not [%" PRIu32 ", %" PRIu64 ", %" PRIu64 "] of a known dtype", src,
			    t->name, E, r1, c1);
			goto dfail;
		}
		uint64_t per = r1 * c1 * es;
		for (uint32_t x = 0; x < E; x++) {
			if (f->kind == K_GATE_UP) {
				if ((rc = set_xref(s, f->layer, x, K_GATE, (struct xref){ f->r, x * per }, src,
					 errbuf, errlen)) ||
				    (rc = set_xref(s, f->layer, x, K_UP,
					 (struct xref){ f->r, x * per + (uint64_t)d_ff * c1 * es }, src, errbuf,
					 errlen)))
					goto dfail;
			} else if ((rc = set_xref(s, f->layer, x, K_DOWN, (struct xref){ f->r, x * per },
					src, errbuf, errlen)))
				goto dfail;
		}
	}

	/* Every expert part present; shapes and dtypes agree. */
	int has_norm = 1;
	for (uint32_t l = 0; l < L; l++) {
		for (uint32_t x = 0; x < E; x++)
			for (int k = 0; k < 3; k++) {
				struct xref xr = s->experts_t[((size_t)l * E + x) * 3 + (size_t)k];
				if (xr.r.shard == UINT32_MAX) {
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: layer %" PRIu32 " expert %" PRIu32 " has no %s weight "
					    "(every layer must be a MoE layer with %" PRIu32 " experts)",
					    src, l, x, part_name(k), E);
					goto dfail;
				}
				const struct arena_st_tensor *t = ref_t(s, xr.r);
				if (t->dtype < 0) {
					rc = arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
					    "%s: %s has dtype %s, which has no ggml type (F32, F16, BF16, "
					    "F64, I8..I64 are supported)", src, t->name, t->st_dtype);
					goto dfail;
				}
				if (t->n_dims == 3) /* fused: checked above */
					goto dtype;
				if (!d_ff) {
					if (t->n_dims == 2 && t->shape[0] < ARENA_MAX_DIM &&
					    t->shape[1] < ARENA_MAX_DIM && t->shape[0] && t->shape[1]) {
						d_ff = (uint32_t)(k == K_DOWN ? t->shape[1] : t->shape[0]);
						d_model = (uint32_t)(k == K_DOWN ? t->shape[0] : t->shape[1]);
					} else {
						rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
						    "%s: %s is not a 2-D weight of sane size", src, t->name);
						goto dfail;
					}
				}
				uint64_t rows = k == K_DOWN ? d_model : d_ff, cols = k == K_DOWN ? d_ff : d_model;
				if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols) {
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: %s has shape %s[%" PRIu64 ", %" PRIu64 "], want [%" PRIu64 ", %" PRIu64 "]",
					    src, t->name, t->n_dims == 2 ? "" : "(not 2-D) ",
					    t->shape[0], t->n_dims > 1 ? t->shape[1] : 0, rows, cols);
					goto dfail;
				}
dtype:;
				uint32_t *d = &dt[(size_t)l * ARENA_DT_N + (size_t)k];
				if (x == 0)
					*d = (uint32_t)t->dtype;
				else if (*d != (uint32_t)t->dtype) {
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: %s is %s, but expert 0 of layer %" PRIu32 " has %s",
					    src, t->name, t->st_dtype, l, baton_dtype_name((int)*d));
					goto dfail;
				}
			}
		if (!experts_only)
			continue;
		for (int k = 0; k < 2; k++) {
			struct ref r = dense[(size_t)l * 2 + (size_t)k];
			if (r.shard == UINT32_MAX) {
				if (k == 0) {
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: no router model.layers.%" PRIu32 ".mlp.gate.weight", src, l);
					goto dfail;
				}
				has_norm = 0;
				continue;
			}
			const struct arena_st_tensor *t = ref_t(s, r);
			int ok = k == 0 ? t->n_dims == 2 && t->shape[0] == E && t->shape[1] == d_model
					: t->n_dims == 1 && t->shape[0] == d_model;
			if (!ok) {
				if (k == 0)
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: %s has the wrong shape, want [%" PRIu32 ", %" PRIu32 "]",
					    src, t->name, E, d_model);
				else
					rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
					    "%s: %s has the wrong shape, want [%" PRIu32 "]",
					    src, t->name, d_model);
				goto dfail;
			}
			if (t->dtype < 0) {
				rc = arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
				    "%s: %s has dtype %s, which has no ggml type", src, t->name, t->st_dtype);
				goto dfail;
			}
		}
	}
	if (experts_only) {
		/* routers and norms as named entries, under the source's names */
		for (int k = 0; k < 2; k++)
			for (uint32_t l = 0; l < L && (k == 0 || has_norm); l++) {
				struct ref r = dense[(size_t)l * 2 + (size_t)k];
				const struct arena_st_tensor *t = ref_t(s, r);
				struct arena_named *n = arena_plan_add(plan,
				    k ? BATON_ROLE_NORM : BATON_ROLE_ROUTER, t->name);
				if (!n) {
					rc = arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
					goto dfail;
				}
				n->layer = l;
				n->dtype = (uint32_t)t->dtype;
				n->rows = k ? 1 : E;
				n->cols = d_model;
				n->src = (uint64_t)r.shard << 32 | r.tensor;
			}
		free(dense);
		dense = NULL;

		uint32_t cfg_k = 0, cfg_e = 0;
		read_config(dir, &cfg_k, &cfg_e);
		if (cfg_e && cfg_e != E) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s: config.json says %" PRIu32 " experts, the weights have %" PRIu32, src,
			    cfg_e, E);
			goto fail;
		}
		if (!top_k)
			top_k = cfg_k ? cfg_k : 2;
		if (top_k > E) {
			if (cfg_k || top_k != 2) {
				rc = arena_errf(errbuf, errlen, BATON_EINVAL,
				    "%s: top-k %" PRIu32 " but only %" PRIu32 " experts", src, top_k, E);
				goto fail;
			}
			top_k = E;
		}
	} else {
		if (top_k && top_k != cfg.top_k) {
			rc = arena_errf(errbuf, errlen, BATON_EINVAL,
			    "%s: --top-k %" PRIu32 " disagrees with config.json's num_experts_per_tok %"
			    PRIu32 " (a whole model runs as configured)", src, top_k, cfg.top_k);
			goto fail;
		}
		top_k = cfg.top_k;
		snprintf(plan->arch, sizeof plan->arch, "%s", cfg.arch);
	}

	/* Identity: every shard's header, size and data samples, top-k and the
	 * metadata files. */
	uint64_t id0[2] = { hsum, top_k };
	hsum = arena_hash(id0, sizeof id0);
	for (uint32_t i = 0; i < s->n_shards; i++) {
		const struct shard *sh = &s->shards[i];
		uint64_t id[3] = { hsum, arena_hash(sh->map, (size_t)sh->h.data_offset),
			arena_sample_hash(sh->map, sh->size, sh->h.data_offset) };
		hsum = arena_hash(id, sizeof id);
	}

	plan->shape = (struct baton_arena_shape){
		.layers = L, .experts = E, .top_k = top_k, .d_model = d_model, .d_ff = d_ff,
	};
	plan->flags = 0; /* the builder sets ROUTER and NORM from the named list */
	plan->layer_dt = dt;
	plan->source_kind = ARENA_SRC_SAFETENSORS;
	plan->source_hash = hsum;
	{
		const char *b = strrchr(src, '/');
		b = b && b[1] ? b + 1 : src;
		snprintf(plan->source, sizeof plan->source, "safetensors %s (%" PRIu32 " shard%s%s%s)", b,
		    s->n_shards, s->n_shards == 1 ? "" : "s", experts_only ? ", experts only" : ", ",
		    experts_only ? "" : cfg.arch);
	}
	plan->fill = st_fill;
	plan->ctx = s;
	free(list);
	json_decref(index);
	return 0;
dfail:
	free(dense);
fail:
	free(list);
	free(dt);
	json_decref(index);
	st_src_free(s);
	arena_plan_free_named(plan);
	memset(plan, 0, sizeof *plan);
	return rc;
}

void arena_st_plan_free(struct arena_plan *plan)
{
	st_src_free(plan->ctx);
	free(plan->layer_dt);
	memset(plan, 0, sizeof *plan);
}
