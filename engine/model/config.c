/*
 * config.c: Hugging Face config.json -> struct baton_model_config,
 * and the per-architecture switch table. Whatever the forward pass does
 * not implement is refused here, by name, so that no model runs wrong.
 */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/model.h"

static const struct baton_model_arch g_archs[] = {
	{ .name = "qwen3_moe", .qk_norm = BATON_QK_NORM_HEAD, .moe_prefix = "mlp" },
	{ .name = "mixtral", .always_renorm = 1, .moe_prefix = "block_sparse_moe" },
	{ .name = "olmoe", .qk_norm = BATON_QK_NORM_WHOLE, .moe_prefix = "mlp" },
	{ .name = "qwen2_moe", .shared_expert = 1, .moe_prefix = "mlp" },
};

const struct baton_model_arch *model_arch_find(const char *model_type)
{
	if (!model_type)
		return NULL;
	for (size_t i = 0; i < sizeof g_archs / sizeof g_archs[0]; i++)
		if (strcmp(g_archs[i].name, model_type) == 0)
			return &g_archs[i];
	return NULL;
}

static void cerr(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void cerr(char *buf, size_t len, const char *fmt, ...)
{
	if (!buf || !len)
		return;
	int n = snprintf(buf, len, "config.json: ");
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < len)
		vsnprintf(buf + n, len - (size_t)n, fmt, ap);
	va_end(ap);
}

/* A positive integer field no larger than max; `def` when absent or null
 * (0: required). */
static int get_uint(json_t *o, const char *key, uint32_t def, uint32_t max, uint32_t *out,
    char *eb, size_t el)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v)) {
		if (!def) {
			cerr(eb, el, "%s is missing", key);
			return BATON_EINVAL;
		}
		*out = def;
		return 0;
	}
	int64_t x;
	if (baton_json_whole(v, 1, max, &x) != 0) {
		cerr(eb, el, "%s must be an integer in 1..%u", key, max);
		return BATON_EINVAL;
	}
	*out = (uint32_t)x;
	return 0;
}

static int get_bool(json_t *o, const char *key, int def, int *out, char *eb, size_t el)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_boolean(v)) {
		cerr(eb, el, "%s must be true or false", key);
		return BATON_EINVAL;
	}
	*out = json_is_true(v);
	return 0;
}

/* A token id: an integer, or the first of a list; -1 when absent. */
static int64_t get_token(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (json_is_array(v))
		v = json_array_get(v, 0);
	int64_t x;
	return baton_json_whole(v, 0, INT32_MAX, &x) == 0 ? x : -1;
}

/* A number of the rope settings: absent or null gives def; *out set. */
static int rope_num(json_t *sc, const char *key, double def, double *out, char *eb, size_t el)
{
	json_t *v = json_object_get(sc, key);
	if (!v || json_is_null(v)) {
		*out = def;
		return 0;
	}
	if (!json_is_number(v) || !isfinite(json_number_value(v))) {
		cerr(eb, el, "rope %s is not a number", key);
		return BATON_EINVAL;
	}
	*out = json_number_value(v);
	return 0;
}

/* transformers' get_mscale of _compute_yarn_parameters. */
static double yarn_get_mscale(double scale, double mscale)
{
	return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* YaRN's settings as transformers 5 reads them (_compute_yarn_parameters of
 * modeling_rope_utils.py): factor (absent: max_position_embeddings /
 * original_max_position_embeddings), original_max_position_embeddings (in
 * the rope settings, else at the top, else max_position_embeddings),
 * beta_fast / beta_slow (32 and 1 when absent, null or 0), truncate (true),
 * and the attention factor: attention_factor when given, else
 * get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both
 * are given and not 0, else get_mscale(factor) = 0.1 ln(factor) + 1. */
static int parse_yarn(json_t *root, json_t *sc, struct baton_model_config *c, char *eb, size_t el)
{
	double orig, f, af, ms, msa, bf, bs;
	int rc;
	json_t *top = json_object_get(root, "original_max_position_embeddings");
	double top_orig = json_is_number(top) ? json_number_value(top) : (double)c->max_pos;
	if ((rc = rope_num(sc, "original_max_position_embeddings", top_orig, &orig, eb, el)))
		return rc;
	if (!(orig >= 1 && orig <= (double)(1u << 24)) || orig != floor(orig)) {
		cerr(eb, el, "rope original_max_position_embeddings %g is not a whole number in "
		    "[1, 2^24]", orig);
		return BATON_EINVAL;
	}
	if ((rc = rope_num(sc, "factor", (double)c->max_pos / orig, &f, eb, el)) ||
	    (rc = rope_num(sc, "attention_factor", NAN, &af, eb, el)) ||
	    (rc = rope_num(sc, "mscale", 0, &ms, eb, el)) ||
	    (rc = rope_num(sc, "mscale_all_dim", 0, &msa, eb, el)) ||
	    (rc = rope_num(sc, "beta_fast", 32, &bf, eb, el)) ||
	    (rc = rope_num(sc, "beta_slow", 1, &bs, eb, el)))
		return rc;
	if (!(f >= 1 && f <= 1e6)) {
		cerr(eb, el, "rope type yarn needs a factor in [1, 1e6], got %g", f);
		return BATON_EINVAL;
	}
	if (bf == 0)
		bf = 32; /* transformers' `or 32` */
	if (bs == 0)
		bs = 1;
	if (!(bf > 0) || !(bs > 0)) {
		cerr(eb, el, "rope beta_fast and beta_slow must be above 0");
		return BATON_EINVAL;
	}
	json_t *tr = json_object_get(sc, "truncate");
	if (tr && !json_is_null(tr) && !json_is_boolean(tr)) {
		cerr(eb, el, "rope truncate is not a boolean");
		return BATON_EINVAL;
	}
	if (isnan(af))
		af = ms != 0 && msa != 0 ? yarn_get_mscale(f, ms) / yarn_get_mscale(f, msa) :
		    yarn_get_mscale(f, 1);
	if (!(af > 0 && af < 1e3)) {
		cerr(eb, el, "rope attention_factor %g is not in (0, 1000)", af);
		return BATON_EINVAL;
	}
	c->rope_type = BATON_ROPE_YARN;
	c->rope_factor = f;
	c->rope_orig_max_pos = (uint32_t)orig;
	c->rope_beta_fast = bf;
	c->rope_beta_slow = bs;
	c->rope_truncate = !json_is_false(tr);
	c->rope_mscale = (float)af;
	return 0;
}

/* rope_parameters (transformers 5) or rope_theta + rope_scaling (4.x and
 * GGUF-made configs): theta and the rope type: default, linear (the
 * factor) or yarn (parse_yarn); any other type (dynamic, longrope, llama3,
 * ...) is refused by name. */
static int parse_rope(json_t *root, struct baton_model_config *c, char *eb, size_t el)
{
	json_t *rp = json_object_get(root, "rope_parameters");
	json_t *sc = json_object_get(root, "rope_scaling");
	json_t *theta = json_object_get(root, "rope_theta");
	if (json_is_object(rp)) {
		if (json_object_get(rp, "rope_theta"))
			theta = json_object_get(rp, "rope_theta");
		if (!json_is_object(sc))
			sc = rp;
	}
	if (!json_is_number(theta) || !(json_number_value(theta) > 1.0)) {
		cerr(eb, el, "rope_theta is missing or not a number above 1");
		return BATON_EINVAL;
	}
	c->rope_theta = json_number_value(theta);
	c->rope_factor = 1.0;
	c->rope_type = BATON_ROPE_DEFAULT;
	c->rope_mscale = 1.0f;
	if (json_is_object(sc)) {
		json_t *t = json_object_get(sc, "rope_type");
		if (!t || json_is_null(t))
			t = json_object_get(sc, "type");
		const char *type = json_is_string(t) ? json_string_value(t) : "default";
		if (strcmp(type, "linear") == 0) {
			json_t *f = json_object_get(sc, "factor");
			if (!json_is_number(f) || !(json_number_value(f) >= 1.0)) {
				cerr(eb, el, "rope type linear needs a factor >= 1");
				return BATON_EINVAL;
			}
			c->rope_type = BATON_ROPE_LINEAR;
			c->rope_factor = json_number_value(f);
		} else if (strcmp(type, "yarn") == 0) {
			int rc = parse_yarn(root, sc, c, eb, el);
			if (rc)
				return rc;
		} else if (strcmp(type, "default") != 0) {
			cerr(eb, el, "rope type \"%.40s\" is not supported (default, linear, yarn)", type);
			return BATON_EUNSUPPORTED;
		}
	} else if (sc && !json_is_null(sc)) {
		cerr(eb, el, "rope_scaling must be an object or null");
		return BATON_EINVAL;
	}
	json_t *prf = json_object_get(root, "partial_rotary_factor");
	if (json_is_number(prf) && json_number_value(prf) != 1.0) {
		cerr(eb, el, "partial_rotary_factor %g is not supported (only 1)",
		    json_number_value(prf));
		return BATON_EUNSUPPORTED;
	}
	return 0;
}

/* Options of the reference implementation this engine does not compute. */
static int refuse_options(json_t *root, const struct baton_model_arch *a,
    struct baton_model_config *c, char *eb, size_t el)
{
	json_t *v = json_object_get(root, "hidden_act");
	if (v && !json_is_null(v) &&
	    (!json_is_string(v) || strcmp(json_string_value(v), "silu") != 0)) {
		cerr(eb, el, "hidden_act \"%.40s\" is not supported (silu)",
		    json_is_string(v) ? json_string_value(v) : "?");
		return BATON_EUNSUPPORTED;
	}
	int b;
	if (get_bool(root, "use_sliding_window", 0, &b, eb, el))
		return BATON_EINVAL;
	if (b) {
		cerr(eb, el, "use_sliding_window (sliding-window attention) is not supported");
		return BATON_EUNSUPPORTED;
	}
	v = json_object_get(root, "layer_types");
	if (v && !json_is_null(v)) {
		size_t i;
		json_t *t;
		if (!json_is_array(v)) {
			cerr(eb, el, "layer_types must be a list");
			return BATON_EINVAL;
		}
		json_array_foreach(v, i, t) {
			if (!json_is_string(t) || strcmp(json_string_value(t), "full_attention") != 0) {
				cerr(eb, el, "layer_types[%zu] \"%.40s\" is not supported (full_attention)",
				    i, json_is_string(t) ? json_string_value(t) : "?");
				return BATON_EUNSUPPORTED;
			}
		}
	}
	v = json_object_get(root, "clip_qkv");
	if (v && !json_is_null(v)) {
		cerr(eb, el, "clip_qkv is not supported");
		return BATON_EUNSUPPORTED;
	}
	v = json_object_get(root, "mlp_only_layers");
	if (json_is_array(v) && json_array_size(v) > 0) {
		cerr(eb, el, "mlp_only_layers (dense MLP layers) is not supported");
		return BATON_EUNSUPPORTED;
	}
	v = json_object_get(root, "decoder_sparse_step");
	int64_t step;
	if (v && !json_is_null(v) && !(baton_json_whole(v, 1, 1, &step) == 0)) {
		cerr(eb, el, "decoder_sparse_step other than 1 (dense MLP layers) is not supported");
		return BATON_EUNSUPPORTED;
	}
	c->window = 0;
	if (strcmp(a->name, "mixtral") == 0) {
		/* Mixtral applies its window whenever one is set: the model keeps
		 * its context within it, where windowed and full attention agree. */
		v = json_object_get(root, "sliding_window");
		if (v && !json_is_null(v)) {
			int64_t w;
			if (baton_json_whole(v, 1, UINT32_MAX, &w) != 0) {
				cerr(eb, el, "sliding_window must be a positive integer or null");
				return BATON_EINVAL;
			}
			c->window = (uint32_t)w;
		}
	}
	return 0;
}

int model_config_parse(const char *json, size_t len, struct baton_model_config *c,
    char *eb, size_t el)
{
	json_error_t jerr;
	int rc = BATON_EINVAL;

	if (!json || !c) {
		cerr(eb, el, "nothing to parse");
		return BATON_EINVAL;
	}
	memset(c, 0, sizeof *c);
	json_t *root = baton_json_load(json, len, 0, &jerr);
	if (!root) {
		cerr(eb, el, "not JSON: %.120s (line %d)", jerr.text, jerr.line);
		return BATON_EINVAL;
	}
	if (!json_is_object(root)) {
		cerr(eb, el, "not a JSON object");
		goto out;
	}
	json_t *mt = json_object_get(root, "model_type");
	if (!json_is_string(mt)) {
		cerr(eb, el, "model_type is missing");
		goto out;
	}
	const struct baton_model_arch *a = model_arch_find(json_string_value(mt));
	if (!a) {
		cerr(eb, el, "architecture \"%.60s\" is not supported (qwen3_moe, mixtral, olmoe, qwen2_moe)",
		    json_string_value(mt));
		rc = BATON_EUNSUPPORTED;
		goto out;
	}
	c->arch = a;
	const uint32_t DIM = 1u << 20;
	if ((rc = get_uint(root, "vocab_size", 0, 1u << 24, &c->vocab, eb, el)) ||
	    (rc = get_uint(root, "hidden_size", 0, DIM, &c->hidden, eb, el)) ||
	    (rc = get_uint(root, "num_hidden_layers", 0, BATON_MODEL_MAX_LAYERS, &c->layers, eb, el)) ||
	    (rc = get_uint(root, "num_attention_heads", 0, 4096, &c->heads, eb, el)) ||
	    (rc = get_uint(root, "num_key_value_heads", c->heads, 4096, &c->kv_heads, eb, el)) ||
	    (rc = get_uint(root, "num_experts_per_tok", 0, 4096, &c->top_k, eb, el)) ||
	    (rc = get_uint(root, "max_position_embeddings", 4096, 1u << 24, &c->max_pos, eb, el)))
		goto out;
	/* qwen3_moe of transformers 5 writes num_local_experts, older ones
	 * num_experts: either names the count */
	const char *ne = json_object_get(root, "num_experts") &&
	    !json_is_null(json_object_get(root, "num_experts")) ? "num_experts" : "num_local_experts";
	if ((rc = get_uint(root, ne, 0, 4096, &c->n_experts, eb, el)))
		goto out;
	const char *ff = strcmp(a->name, "qwen3_moe") == 0 || strcmp(a->name, "qwen2_moe") == 0 ?
	    "moe_intermediate_size" : "intermediate_size";
	if ((rc = get_uint(root, ff, 0, DIM, &c->moe_ff, eb, el)))
		goto out;
	if (a->shared_expert &&
	    (rc = get_uint(root, "shared_expert_intermediate_size", 0, DIM, &c->shared_ff, eb, el)))
		goto out;
	if (c->hidden % c->heads && (!json_object_get(root, "head_dim") ||
	    json_is_null(json_object_get(root, "head_dim")))) {
		cerr(eb, el, "hidden_size %u is not a multiple of num_attention_heads %u", c->hidden,
		    c->heads);
		rc = BATON_EINVAL;
		goto out;
	}
	if ((rc = get_uint(root, "head_dim", c->hidden / c->heads ? c->hidden / c->heads : 1, 1u << 16,
	        &c->head_dim, eb, el)))
		goto out;
	rc = BATON_EINVAL;
	if (c->head_dim & 1) {
		cerr(eb, el, "head_dim %u is odd (RoPE needs pairs)", c->head_dim);
		goto out;
	}
	if (c->heads % c->kv_heads) {
		cerr(eb, el, "num_attention_heads %u is not a multiple of num_key_value_heads %u",
		    c->heads, c->kv_heads);
		goto out;
	}
	if (c->top_k > c->n_experts) {
		cerr(eb, el, "num_experts_per_tok %u is above the %u experts", c->top_k, c->n_experts);
		goto out;
	}
	json_t *eps = json_object_get(root, "rms_norm_eps");
	/* checked as the f32 it becomes: 1e-50 would round to 0 */
	c->eps = json_is_number(eps) ? (float)json_number_value(eps) : 0;
	if (!(c->eps > 0) || c->eps > 1) {
		cerr(eb, el, "rms_norm_eps is missing or not in (0, 1] as an f32");
		goto out;
	}
	if ((rc = parse_rope(root, c, eb, el)) || (rc = refuse_options(root, a, c, eb, el)))
		goto out;
	int norm_topk, attn_bias;
	if ((rc = get_bool(root, "norm_topk_prob", 0, &norm_topk, eb, el)) ||
	    (rc = get_bool(root, "tie_word_embeddings", 0, &c->tie_embeddings, eb, el)) ||
	    (rc = get_bool(root, "attention_bias", 0, &attn_bias, eb, el)) ||
	    /* Qwen2-MoE always had q/k/v biases; transformers 5 names it */
	    (rc = get_bool(root, "qkv_bias", a->shared_expert, &c->qkv_bias, eb, el)))
		goto out;
	if (strcmp(a->name, "mixtral") == 0)
		attn_bias = 0; /* Mixtral's projections have no bias */
	c->qkv_bias |= attn_bias;
	c->o_bias = attn_bias;
	c->route_rule = a->always_renorm || norm_topk ? BATON_ROUTE_SOFTMAX_TOPK_NORM :
	    BATON_ROUTE_SOFTMAX_TOPK;
	c->bos = get_token(root, "bos_token_id");
	c->eos = get_token(root, "eos_token_id");
	rc = 0;
out:
	json_decref(root);
	return rc;
}

/* YaRN's find_correction_dim (transformers, in double). */
static double yarn_corr_dim(double n_rot, double dim, double base, double orig)
{
	return dim * log(orig / (n_rot * 2 * M_PI)) / (2 * log(base));
}

/* YaRN as transformers computes it in f32 tensors (_compute_yarn_parameters):
 *   pos = base ^ (f32(2i) / dim)            powf, base and exponent f32
 *   extra = 1 / pos, inter = 1 / (f32(factor) * pos)
 *   low, high = floor / ceil of the correction dims of beta_fast and
 *       beta_slow (double; not rounded when truncate is false), clamped to
 *       [0, dim - 1]; high += 0.001 when equal
 *   ramp = clamp((f32(i) - f32(low)) / f32(high - low), 0, 1), ef = 1 - ramp
 *   inv = inter * (1 - ef) + extra * ef
 * each operation rounded to f32 (-std=c11 contracts nothing). */
static void yarn_inv_freq(const struct baton_model_config *cfg, float *inv_freq)
{
	const uint32_t dim = cfg->head_dim, half = dim / 2;
	const double base = cfg->rope_theta, orig = cfg->rope_orig_max_pos;
	double low = yarn_corr_dim(cfg->rope_beta_fast, dim, base, orig);
	double high = yarn_corr_dim(cfg->rope_beta_slow, dim, base, orig);
	if (cfg->rope_truncate) {
		low = floor(low);
		high = ceil(high);
	}
	low = low > 0 ? low : 0;
	high = high < dim - 1 ? high : dim - 1;
	if (low == high)
		high += 0.001;
	const float fb = (float)base, ff = (float)cfg->rope_factor;
	const float flow = (float)low, fspan = (float)(high - low);
	for (uint32_t i = 0; i < half; i++) {
		float e = (float)(2 * i) / (float)dim;
		float pos = powf(fb, e);
		float extra = 1.0f / pos, inter = 1.0f / (ff * pos);
		float ramp = ((float)i - flow) / fspan;
		ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
		float ef = 1.0f - ramp;
		float a = inter * (1.0f - ef), b = extra * ef;
		inv_freq[i] = a + b;
	}
}

void model_rope_inv_freq(const struct baton_model_config *cfg, float *inv_freq)
{
	if (cfg->rope_type == BATON_ROPE_YARN) {
		yarn_inv_freq(cfg, inv_freq);
		return;
	}
	/* transformers: 1 / base ** (arange(0, dim, 2) / dim), in f32 from
	 * float exponents; computed here in double and rounded once, which
	 * is within an ulp of it */
	uint32_t half = cfg->head_dim / 2;
	for (uint32_t i = 0; i < half; i++) {
		double e = (double)(2 * i) / (double)cfg->head_dim;
		inv_freq[i] = (float)(1.0 / pow(cfg->rope_theta, e) / cfg->rope_factor);
	}
}
