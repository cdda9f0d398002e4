/*
 * gguf_model.c: a whole model from a GGUF file, stored as Hugging Face
 * would have it, so an engine reads one layout whatever the source:
 *
 *   - tensors under their Hugging Face names (token_embd -> model.embed_tokens,
 *     blk.N.attn_q -> model.layers.N.self_attn.q_proj, ...), byte-exact in
 *     any ggml type;
 *   - llama.cpp's Q/K row permutation undone for the llama family (Mixtral):
 *     convert_hf_to_gguf.py interleaves the two rotary halves of each head
 *     (rows h*hd + i*hd/2 + j go to h*hd + 2j + i) for ggml's "normal" RoPE;
 *     moving whole rows back is valid for quantized rows too;
 *   - config.json made from the <arch>.* keys with Hugging Face's field
 *     names, then read back through the same checks as an HF folder's, so
 *     both sources refuse the same options;
 *   - gguf_tokenizer.json: every tokenizer.ggml.* key and the chat
 *     template(s), as one JSON object keyed by the GGUF names.
 *
 * Architectures: qwen3moe, qwen2moe, olmoe, and llama with experts
 * (Mixtral). Any tensor that is not part of the model is refused by name,
 * never dropped.
 */
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_int.h"

static const struct {
	const char *gguf, *hf;
} arch_names[] = {
	{ "qwen3moe", "qwen3_moe" }, { "qwen2moe", "qwen2_moe" }, { "olmoe", "olmoe" },
	{ "llama", "mixtral" },
};

enum { P_NONE, P_Q, P_K };

/* blk.N.<gguf> -> model.layers.N.<hf>; hf NULL: the router. */
static const struct {
	const char *gguf, *hf;
	int perm;
} layer_names[] = {
	{ "attn_norm.weight", "input_layernorm.weight", P_NONE },
	{ "attn_q.weight", "self_attn.q_proj.weight", P_Q },
	{ "attn_k.weight", "self_attn.k_proj.weight", P_K },
	{ "attn_v.weight", "self_attn.v_proj.weight", P_NONE },
	{ "attn_output.weight", "self_attn.o_proj.weight", P_NONE },
	{ "attn_q.bias", "self_attn.q_proj.bias", P_NONE },
	{ "attn_k.bias", "self_attn.k_proj.bias", P_NONE },
	{ "attn_v.bias", "self_attn.v_proj.bias", P_NONE },
	{ "attn_q_norm.weight", "self_attn.q_norm.weight", P_NONE },
	{ "attn_k_norm.weight", "self_attn.k_norm.weight", P_NONE },
	{ "ffn_norm.weight", "post_attention_layernorm.weight", P_NONE },
	{ "ffn_gate_inp.weight", NULL, P_NONE },
	{ "ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", P_NONE },
	{ "ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", P_NONE },
	{ "ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", P_NONE },
	{ "ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", P_NONE },
};

static const struct {
	const char *gguf, *hf;
} global_names[] = {
	{ "token_embd.weight", "model.embed_tokens.weight" },
	{ "output_norm.weight", "model.norm.weight" },
	{ "output.weight", "lm_head.weight" },
};

/* The Hugging Face name of a GGUF tensor; 1 an expert stack (the parser's),
 * 0 mapped, -1 unknown. */
static int hf_name(const char *arch, const char *s, uint64_t len, char *out, size_t outlen,
    int *perm)
{
	*perm = P_NONE;
	for (size_t i = 0; i < sizeof global_names / sizeof global_names[0]; i++)
		if (len == strlen(global_names[i].gguf) && memcmp(s, global_names[i].gguf, len) == 0) {
			snprintf(out, outlen, "%s", global_names[i].hf);
			return 0;
		}
	if (len < 6 || memcmp(s, "blk.", 4) != 0 || s[4] < '0' || s[4] > '9')
		return -1;
	uint64_t i = 4, n = 0;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
		if ((n = n * 10 + (uint64_t)(s[i] - '0')) > UINT32_MAX)
			return -1;
	if (i >= len || s[i] != '.' || (s[4] == '0' && i > 5))
		return -1;
	const char *rest = s + i + 1;
	uint64_t rl = len - i - 1;
	static const char *const exps[] = { "ffn_gate_exps.weight", "ffn_up_exps.weight",
		"ffn_down_exps.weight" };
	for (int k = 0; k < 3; k++)
		if (rl == strlen(exps[k]) && memcmp(rest, exps[k], rl) == 0)
			return 1;
	for (size_t k = 0; k < sizeof layer_names / sizeof layer_names[0]; k++)
		if (rl == strlen(layer_names[k].gguf) && memcmp(rest, layer_names[k].gguf, rl) == 0) {
			if (!layer_names[k].hf)
				arena_model_router_name(arch, (uint32_t)n, out, outlen);
			else
				snprintf(out, outlen, "model.layers.%" PRIu64 ".%s", n, layer_names[k].hf);
			*perm = layer_names[k].perm;
			return 0;
		}
	return -1;
}

static int kv_u32(const uint8_t *b, const struct arena_gguf *g, const char *key, uint32_t *v,
    char *errbuf, size_t errlen)
{
	const struct arena_gguf_kv *kv = arena_gguf_kv_find(g, key);
	if (!kv)
		return 1;
	uint64_t x;
	if (arena_gguf_kv_uint(b, kv, &x) != 0 || x > UINT32_MAX)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "%s is not an unsigned 32-bit integer (one value for every layer is supported)",
		    key);
	*v = (uint32_t)x;
	return 0;
}

static int kv_real(const uint8_t *b, const struct arena_gguf *g, const char *key, double *v)
{
	const struct arena_gguf_kv *kv = arena_gguf_kv_find(g, key);
	if (!kv)
		return 1;
	if (kv->type == ARENA_GT_F32) {
		float f;
		memcpy(&f, b + kv->pos, 4);
		*v = f;
	} else if (kv->type == ARENA_GT_F64) {
		memcpy(v, b + kv->pos, 8);
	} else {
		return -1;
	}
	return isfinite(*v) ? 0 : -1;
}

/* A string value as a NUL-terminated copy in buf; -1 when not a string. */
static int kv_str(const uint8_t *b, const struct arena_gguf *g, const char *key, char *buf,
    size_t len)
{
	const struct arena_gguf_kv *kv = arena_gguf_kv_find(g, key);
	if (!kv)
		return 1;
	if (kv->type != ARENA_GT_STRING)
		return -1;
	uint64_t n;
	memcpy(&n, b + kv->pos, 8);
	snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), (const char *)b + kv->pos + 8);
	return 0;
}

/* <arch>.rope.scaling.*, as llama.cpp writes and reads them, into the
 * rope_parameters transformers reads (arena/model.c writes them):
 *   type "none" (or absent), "linear" or "yarn"; factor (linear: also the
 *   older rope.scale_linear); original_context_length (yarn's
 *   original_max_position_embeddings); yarn_beta_fast / yarn_beta_slow.
 * llama.cpp's YaRN scales cos and sin by attn_factor * (1 + 0.1 ln factor)
 * (ggml's rope_yarn), so an attn_factor other than 1 becomes transformers'
 * attention_factor of that value. What changes the math beyond that
 * (yarn_log_multiplier, an ext_factor other than 1, a rope type other than
 * these) is refused by name. */
static int gguf_rope(const uint8_t *b, const struct arena_gguf *g, const char *a,
    struct arena_model_cfg *c, char *errbuf, size_t errlen)
{
	char key[128], st[64];
	int rc;
	snprintf(key, sizeof key, "%s.rope.scaling.type", a);
	rc = kv_str(b, g, key, st, sizeof st);
	if (rc < 0)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s is not a string", key);
	const char *type = rc == 0 ? st : "none";
	double f = 0, v;
	snprintf(key, sizeof key, "%s.rope.scaling.factor", a);
	if ((rc = kv_real(b, g, key, &f)) < 0)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s is not a finite number", key);
	if (rc == 1) {
		f = 0;
		snprintf(key, sizeof key, "%s.rope.scale_linear", a);
		if (kv_real(b, g, key, &v) == 0) {
			f = v;
			if (strcmp(type, "none") == 0 && v != 1.0)
				type = "linear";
		}
	}
	if (strcmp(type, "none") == 0)
		return 0;
	if (strcmp(type, "linear") != 0 && strcmp(type, "yarn") != 0)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "%s.rope.scaling.type \"%s\" is not supported (none, linear, yarn)", a, type);
	if (!(f >= 1.0))
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "%s.rope.scaling.factor is missing or below 1 for rope type %s", a, type);
	memcpy(c->rope_type, type, strlen(type) + 1); /* "linear" or "yarn" */
	c->rope_factor = f;
	if (strcmp(type, "yarn") != 0)
		return 0;
	static const struct { const char *k; double ok; } refused[] = {
		{ "rope.scaling.yarn_log_multiplier", 0 }, { "rope.scaling.yarn_ext_factor", 1 },
	};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		snprintf(key, sizeof key, "%s.%s", a, refused[i].k);
		if (kv_real(b, g, key, &v) == 0 && v != refused[i].ok && !(refused[i].ok == 1 && v < 0))
			return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "%s %g is not supported (YaRN as transformers computes it)", key, v);
	}
	snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
	if ((rc = kv_u32(b, g, key, &c->rope_orig, errbuf, errlen)) > 1)
		return rc;
	snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", a);
	if (kv_real(b, g, key, &v) == 0 && v != 1.0) {
		if (!(v > 0))
			return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s %g is not above 0", key, v);
		c->rope_attn = v * (1.0 + 0.1 * log(f));
	}
	snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_fast", a);
	if (kv_real(b, g, key, &v) == 0)
		c->rope_beta_fast = v;
	snprintf(key, sizeof key, "%s.rope.scaling.yarn_beta_slow", a);
	if (kv_real(b, g, key, &v) == 0)
		c->rope_beta_slow = v;
	return 0;
}

/* ---- the tokenizer as JSON ----------------------------------------------- */

/* Reads one value at *pos (bounds were checked by the parser; checked again
 * here, as cheap as it is). NULL on a value JSON cannot hold. */
static json_t *value_json(const uint8_t *b, uint64_t size, uint64_t *pos, uint32_t type, int depth)
{
	static const uint8_t sz[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
	if (type > ARENA_GT_F64 || depth > 4)
		return NULL;
	if (type == ARENA_GT_STRING) {
		uint64_t n;
		if (size - *pos < 8)
			return NULL;
		memcpy(&n, b + *pos, 8);
		if (n > size - *pos - 8)
			return NULL;
		json_t *j = json_stringn((const char *)b + *pos + 8, (size_t)n);
		*pos += 8 + n;
		return j;
	}
	if (type == ARENA_GT_ARRAY) {
		uint32_t et;
		uint64_t n;
		if (size - *pos < 12)
			return NULL;
		memcpy(&et, b + *pos, 4);
		memcpy(&n, b + *pos + 4, 8);
		*pos += 12;
		if (n > size - *pos)
			return NULL;
		json_t *a = json_array();
		for (uint64_t i = 0; a && i < n; i++) {
			json_t *v = value_json(b, size, pos, et, depth + 1);
			if (!v || json_array_append_new(a, v) != 0) {
				json_decref(a);
				return NULL;
			}
		}
		return a;
	}
	if (size - *pos < sz[type])
		return NULL;
	const uint8_t *p = b + *pos;
	*pos += sz[type];
	switch (type) {
	case ARENA_GT_U8: return json_integer(p[0]);
	case ARENA_GT_I8: return json_integer((int8_t)p[0]);
	case ARENA_GT_BOOL: return json_boolean(p[0] != 0);
	case ARENA_GT_U16: { uint16_t x; memcpy(&x, p, 2); return json_integer(x); }
	case ARENA_GT_I16: { int16_t x; memcpy(&x, p, 2); return json_integer(x); }
	case ARENA_GT_U32: { uint32_t x; memcpy(&x, p, 4); return json_integer(x); }
	case ARENA_GT_I32: { int32_t x; memcpy(&x, p, 4); return json_integer(x); }
	case ARENA_GT_I64: { int64_t x; memcpy(&x, p, 8); return json_integer(x); }
	case ARENA_GT_U64: {
		uint64_t x;
		memcpy(&x, p, 8);
		/* past int64: a real (the JSON readers read numbers as doubles,
		 * base.h's policy) rather than a refusal */
		return x > INT64_MAX ? json_real((double)x) : json_integer((json_int_t)x);
	}
	case ARENA_GT_F32: { float x; memcpy(&x, p, 4); return json_real(x); }
	case ARENA_GT_F64: { double x; memcpy(&x, p, 8); return json_real(x); }
	default: return NULL;
	}
}

static int tokenizer_blob(const uint8_t *b, uint64_t size, const struct arena_gguf *g,
    struct arena_plan *plan, char *errbuf, size_t errlen)
{
	json_t *o = json_object();
	int n = 0;
	if (!o)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct arena_gguf_kv *kv = &g->kvs[i];
		int tok = (kv->key_len > 15 && memcmp(kv->key, "tokenizer.ggml.", 15) == 0) ||
		    (kv->key_len >= 23 && memcmp(kv->key, "tokenizer.chat_template", 23) == 0);
		if (!tok)
			continue;
		char key[256];
		if (kv->key_len >= sizeof key) {
			json_decref(o);
			return arena_errf(errbuf, errlen, BATON_ESOURCE, "a tokenizer key is too long");
		}
		memcpy(key, kv->key, kv->key_len);
		key[kv->key_len] = '\0';
		uint64_t pos = kv->pos;
		json_t *v = value_json(b, size, &pos, kv->type, 0);
		if (!v || json_object_set_new(o, key, v) != 0) {
			json_decref(o);
			return arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "%s has a value JSON cannot hold (a string that is not UTF-8, a NaN, or a "
			    "key that is not UTF-8)", key);
		}
		n++;
	}
	if (!n) {
		json_decref(o);
		return 0;
	}
	char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (!s)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	return arena_plan_add_blob(plan, "gguf_tokenizer.json", s, strlen(s), errbuf, errlen);
}

/* ---- the model ------------------------------------------------------------ */

static int make_config(const uint8_t *b, const struct arena_gguf *g, const char *hf_arch,
    struct arena_model_cfg *c, char *errbuf, size_t errlen)
{
	const char *a = g->arch;
	char key[160];
	int rc;
	memset(c, 0, sizeof *c);
	snprintf(c->arch, sizeof c->arch, "%s", hf_arch);
	c->layers = g->layers;
	c->experts = g->experts;
	c->top_k = g->top_k;
	c->hidden = g->d_model;
	c->moe_ff = g->d_ff;
#define U32(name, dst, required)                                                        \
	do {                                                                            \
		snprintf(key, sizeof key, "%s." name, a);                               \
		rc = kv_u32(b, g, key, (dst), errbuf, errlen);                          \
		if (rc > 1)                                                             \
			return rc;                                                      \
		if (rc == 1 && (required))                                              \
			return arena_errf(errbuf, errlen, BATON_ESOURCE, "no %s", key); \
	} while (0)
	U32("attention.head_count", &c->heads, 1);
	c->kv_heads = c->heads;
	U32("attention.head_count_kv", &c->kv_heads, 0);
	c->head_dim = c->heads ? c->hidden / c->heads : 0;
	U32("attention.key_length", &c->head_dim, 0);
	uint32_t vlen = c->head_dim, rot = c->head_dim;
	U32("attention.value_length", &vlen, 0);
	U32("rope.dimension_count", &rot, 0);
	if (vlen != c->head_dim)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "%s.attention.value_length %" PRIu32 " differs from key_length %" PRIu32
		    " (not supported)", a, vlen, c->head_dim);
	if (rot != c->head_dim)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "%s.rope.dimension_count %" PRIu32 " is not the head size %" PRIu32
		    " (partial rotary embeddings are not supported)", a, rot, c->head_dim);
	U32("context_length", &c->max_pos, 0);
	U32("feed_forward_length", &c->dense_ff, 0);
	U32("expert_shared_feed_forward_length", &c->shared_ff, 0);
	U32("vocab_size", &c->vocab, 0);
	uint32_t gating = 1;
	U32("expert_gating_func", &gating, 0);
	if (gating != 1)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "%s.expert_gating_func %" PRIu32 " is not softmax (1); not supported", a, gating);
	uint32_t swa = 0;
	U32("attention.sliding_window", &swa, 0);
	if (swa)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "%s.attention.sliding_window %" PRIu32 ": sliding-window attention is not supported",
		    a, swa);
#undef U32
	c->rms_eps = 1e-6;
	snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
	if (kv_real(b, g, key, &c->rms_eps) < 0)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s is not a finite number", key);
	c->rope_theta = 10000.0;
	snprintf(key, sizeof key, "%s.rope.freq_base", a);
	if (kv_real(b, g, key, &c->rope_theta) < 0)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "%s is not a finite number", key);
	if ((rc = gguf_rope(b, g, a, c, errbuf, errlen)))
		return rc;
	c->norm_topk = strcmp(hf_arch, "qwen3_moe") == 0 ? 1 : strcmp(hf_arch, "mixtral") == 0 ? -1 : 0;
	snprintf(key, sizeof key, "%s.expert_weights_norm", a);
	const struct arena_gguf_kv *kv = arena_gguf_kv_find(g, key);
	if (kv && kv->type == ARENA_GT_BOOL)
		c->norm_topk = b[kv->pos] != 0;
	uint64_t id;
	kv = arena_gguf_kv_find(g, "tokenizer.ggml.bos_token_id");
	c->bos = kv && arena_gguf_kv_uint(b, kv, &id) == 0 && id <= INT64_MAX ? (int64_t)id : -1;
	kv = arena_gguf_kv_find(g, "tokenizer.ggml.eos_token_id");
	c->eos = kv && arena_gguf_kv_uint(b, kv, &id) == 0 && id <= INT64_MAX ? (int64_t)id : -1;

	/* From the tensors: vocabulary, tying, biases, the shared expert. */
	c->tie = 1;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct arena_gguf_tensor *t = &g->tensors[i];
		if (t->name_len == 13 && memcmp(t->name, "output.weight", 13) == 0)
			c->tie = 0;
		if (t->name_len == 17 && memcmp(t->name, "token_embd.weight", 17) == 0 && !c->vocab)
			c->vocab = t->ne[1] <= UINT32_MAX ? (uint32_t)t->ne[1] : 0;
		if (t->name_len == 17 && memcmp(t->name, "blk.0.attn_q.bias", 17) == 0)
			c->qkv_bias = 1;
		if (t->name_len == 27 && memcmp(t->name, "blk.0.ffn_gate_shexp.weight", 27) == 0 &&
		    !c->shared_ff)
			c->shared_ff = t->ne[1] <= UINT32_MAX ? (uint32_t)t->ne[1] : 0;
	}
	if (strcmp(hf_arch, "qwen2_moe") == 0 && !c->shared_ff)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "no %s.expert_shared_feed_forward_length and no blk.0.ffn_gate_shexp.weight", a);
	if (strcmp(hf_arch, "qwen2_moe") != 0)
		c->shared_ff = 0;
	return 0;
}

int arena_gguf_plan_model(const uint8_t *buf, const struct arena_gguf *g, struct arena_plan *plan,
    char *errbuf, size_t errlen)
{
	const char *hf_arch = NULL;
	for (size_t i = 0; i < sizeof arch_names / sizeof arch_names[0]; i++)
		if (strcmp(g->arch, arch_names[i].gguf) == 0)
			hf_arch = arch_names[i].hf;
	if (!hf_arch)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "GGUF architecture \"%s\" is not supported (qwen3moe, qwen2moe, olmoe, llama with "
		    "experts); --experts-only imports the experts of any MoE alone", g->arch);
	struct arena_model_cfg c0, c;
	int rc = make_config(buf, g, hf_arch, &c0, errbuf, errlen);
	if (rc)
		return rc;
	/* The config as JSON, then read back through the checks an HF
	 * folder's config.json goes through. */
	uint64_t clen = 0;
	char *cfg = arena_model_config_json(&c0, &clen);
	if (!cfg)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	json_error_t jerr;
	json_t *j = baton_json_load(cfg, (size_t)clen, 0, &jerr);
	rc = j ? arena_model_from_config(j, &c, errbuf, errlen)
	       : arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	json_decref(j);
	if (rc) {
		free(cfg);
		return rc;
	}
	if ((rc = arena_plan_add_blob(plan, "config.json", cfg, clen, errbuf, errlen)))
		return rc;

	struct arena_model_tensor *mt;
	uint64_t nt;
	if ((rc = arena_model_tensors(&c, &mt, &nt, errbuf, errlen)))
		return rc;
	uint8_t *seen = calloc(nt ? nt : 1, 1);
	if (!seen) {
		free(mt);
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	}
	int llama = strcmp(g->arch, "llama") == 0;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct arena_gguf_tensor *t = &g->tensors[i];
		char name[ARENA_MAX_NAME + 1];
		int perm;
		int k = hf_name(hf_arch, t->name, t->name_len, name, sizeof name, &perm);
		if (k == 1)
			continue; /* experts: the parser checked them */
		struct arena_model_tensor *m = k == 0 ? arena_model_find(mt, nt, name) : NULL;
		if (!m) {
			rc = arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "tensor %.*s is not part of a %s model as this build knows it (not imported "
			    "rather than ignored)", (int)(t->name_len < 200 ? t->name_len : 200), t->name,
			    g->arch);
			goto out;
		}
		uint64_t mi = (uint64_t)(m - mt);
		if (seen[mi]) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "%s appears twice", m->name);
			goto out;
		}
		seen[mi] = 1;
		int ok = t->ne[2] == 1 && t->ne[3] == 1 && t->ne[0] == m->cols &&
		    ((t->n_dims == 2 && t->ne[1] == m->rows) || (t->n_dims == 1 && m->rows == 1));
		if (!ok) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "tensor %.*s (%s) has ne (%" PRIu64 ", %" PRIu64 ", %" PRIu64 "), the model needs (%"
			    PRIu32 ", %" PRIu32 ")", (int)t->name_len, t->name, m->name, t->ne[0], t->ne[1],
			    t->ne[2], m->cols, m->rows);
			goto out;
		}
		if (!baton_dtype_name((int)t->type)) {
			rc = arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "tensor %.*s has ggml type %" PRIu32 ", which this build does not know",
			    (int)t->name_len, t->name, t->type);
			goto out;
		}
		if ((rc = arena_plan_add_tensor(plan, m, t->type, i, errbuf, errlen)))
			goto out;
		if (llama && perm != P_NONE) {
			uint32_t heads = perm == P_Q ? c.heads : c.kv_heads;
			if (m->rows % heads || (m->rows / heads) % 2) {
				rc = arena_errf(errbuf, errlen, BATON_ESOURCE,
				    "%s: %" PRIu32 " rows do not split into %" PRIu32 " heads of an even size",
				    m->name, m->rows, heads);
				goto out;
			}
			plan->named[plan->n_named - 1].aux = heads; /* the entry just added */
		}
	}
	for (uint64_t i = 0; i < nt; i++)
		if (!seen[i] && mt[i].required) {
			rc = arena_errf(errbuf, errlen, BATON_ESOURCE, "no tensor for %s (a %s model needs it)",
			    mt[i].name, hf_arch);
			goto out;
		}
	if ((rc = tokenizer_blob(buf, g->data_offset, g, plan, errbuf, errlen)))
		goto out;
	snprintf(plan->arch, sizeof plan->arch, "%s", hf_arch);
	rc = 0;
out:
	free(seen);
	free(mt);
	return rc;
}

void arena_gguf_fill_named(const uint8_t *buf, const struct arena_gguf *g,
    const struct arena_named *n, uint8_t *dst)
{
	const struct arena_gguf_tensor *t = &g->tensors[n->src];
	uint64_t rb = baton_dtype_row_bytes((int)n->dtype, n->cols);
	const uint8_t *src = buf + t->offset;
	if (!n->aux) {
		memcpy(dst, src, rb * n->rows);
		return;
	}
	/* Undo convert_hf_to_gguf.py's permute(): HF row h*hd + i*hd/2 + j was
	 * stored as row h*hd + 2j + i. */
	uint64_t heads = n->aux, hd = n->rows / heads, half = hd / 2;
	for (uint64_t h = 0; h < heads; h++)
		for (uint64_t i = 0; i < 2; i++)
			for (uint64_t j = 0; j < half; j++)
				memcpy(dst + (h * hd + i * half + j) * rb, src + (h * hd + 2 * j + i) * rb, rb);
}
