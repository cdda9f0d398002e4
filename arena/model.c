/*
 * model.c: what a whole model of each supported architecture is, in
 * Hugging Face's terms (transformers' modeling files are the reference):
 * the config fields that matter, the options the forward pass does not do
 * (refused by name at create, never imported wrong), and the dense tensors
 * every layer has. The safetensors and GGUF importers and the synthetic
 * model all take their list from here, so the three agree.
 *
 *   qwen3_moe  q_norm/k_norm per head (head_dim), mlp.gate router
 *   qwen2_moe  q/k/v biases, mlp.shared_expert.{gate,up,down}_proj and
 *              mlp.shared_expert_gate (1 x hidden)
 *   mixtral    block_sparse_moe.gate router
 *   olmoe      q_norm/k_norm over the whole projection, mlp.gate router
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena_int.h"

/* The most positions a config may name: engine/model/config.c's bound on
 * max_position_embeddings. */
#define MAX_POSITIONS (1u << 24)

static int get_u32(const json_t *o, const char *key, uint32_t *v, int required,
    char *errbuf, size_t errlen)
{
	const json_t *j = json_object_get(o, key);
	if (!j || json_is_null(j)) {
		if (required)
			return arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "config.json: no %s", key);
		return 1;
	}
	int64_t x;
	if (baton_json_whole(j, 0, UINT32_MAX, &x) != 0)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: %s is not an unsigned 32-bit integer", key);
	*v = (uint32_t)x;
	return 0;
}

static int get_num(const json_t *o, const char *key, double *v)
{
	const json_t *j = json_object_get(o, key);
	if (!json_is_number(j))
		return 1;
	*v = json_number_value(j);
	return 0;
}

/* A token id: an integer, or the first of a list (eos_token_id may be one). */
static int64_t get_id(const json_t *o, const char *key)
{
	const json_t *j = json_object_get(o, key);
	if (json_is_array(j))
		j = json_array_get(j, 0);
	int64_t x;
	return baton_json_whole(j, 0, INT32_MAX, &x) == 0 ? x : -1;
}

/* Present and not null, false, 0, "" or []. */
static int truthy(const json_t *j)
{
	if (!j || json_is_null(j) || json_is_false(j))
		return 0;
	if (json_is_integer(j))
		return json_integer_value(j) != 0;
	if (json_is_real(j))
		return json_real_value(j) != 0.0;
	if (json_is_string(j))
		return json_string_length(j) != 0;
	if (json_is_array(j))
		return json_array_size(j) != 0;
	return 1;
}

static int check_rope(const json_t *o, char *errbuf, size_t errlen)
{
	static const char *const keys[] = { "rope_scaling", "rope_parameters" };
	for (int i = 0; i < 2; i++) {
		const json_t *r = json_object_get(o, keys[i]);
		if (!r || json_is_null(r))
			continue;
		if (!json_is_object(r))
			return arena_errf(errbuf, errlen, BATON_ESOURCE,
			    "config.json: %s is not an object", keys[i]);
		const json_t *t = json_object_get(r, "rope_type");
		if (!t)
			t = json_object_get(r, "type");
		const char *ts = json_is_string(t) ? json_string_value(t) : "?";
		if (t && !json_is_null(t) && strcmp(ts, "default") != 0 && strcmp(ts, "linear") != 0 &&
		    strcmp(ts, "yarn") != 0)
			return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "config.json: %s type \"%s\" is not supported (default, linear, yarn)",
			    keys[i], ts);
		if (!t && i == 0)
			return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "config.json: rope_scaling without a type is not supported");
	}
	return 0;
}

int arena_model_from_config(const void *json_obj, struct arena_model_cfg *c,
    char *errbuf, size_t errlen)
{
	const json_t *o = json_obj;
	int rc;
	memset(c, 0, sizeof *c);
	if (!json_is_object(o))
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "config.json is not a JSON object");
	const char *mt = json_string_value(json_object_get(o, "model_type"));
	if (!mt)
		return arena_errf(errbuf, errlen, BATON_ESOURCE, "config.json: no model_type");
	if (!arena_arch_known(mt))
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "config.json: model_type \"%.64s\" is not supported (qwen3_moe, qwen2_moe, "
		    "mixtral, olmoe); --experts-only imports the experts of any MoE alone", mt);
	snprintf(c->arch, sizeof c->arch, "%s", mt);
	int qwen = strcmp(mt, "qwen3_moe") == 0 || strcmp(mt, "qwen2_moe") == 0;

	if ((rc = get_u32(o, "hidden_size", &c->hidden, 1, errbuf, errlen)) ||
	    (rc = get_u32(o, "num_hidden_layers", &c->layers, 1, errbuf, errlen)) ||
	    (rc = get_u32(o, "num_attention_heads", &c->heads, 1, errbuf, errlen)) ||
	    (rc = get_u32(o, "vocab_size", &c->vocab, 1, errbuf, errlen)) ||
	    (rc = get_u32(o, "num_experts_per_tok", &c->top_k, 1, errbuf, errlen)))
		return rc;
	if ((rc = get_u32(o, "num_key_value_heads", &c->kv_heads, 0, errbuf, errlen)) > 1)
		return rc;
	if (rc == 1)
		c->kv_heads = c->heads;
	if (c->heads == 0 || c->kv_heads == 0 || c->heads % c->kv_heads)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: %" PRIu32 " attention heads, %" PRIu32 " key/value heads",
		    c->heads, c->kv_heads);
	if ((rc = get_u32(o, "head_dim", &c->head_dim, 0, errbuf, errlen)) > 1)
		return rc;
	if (rc == 1)
		c->head_dim = c->hidden / c->heads;
	if (c->head_dim == 0 || c->head_dim % 2)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: head_dim %" PRIu32 " (must be even and nonzero)", c->head_dim);
	/* transformers 5 writes num_local_experts for qwen3_moe too */
	if ((rc = get_u32(o, "num_experts", &c->experts, 0, errbuf, errlen)) > 1)
		return rc;
	if (rc == 1 && (rc = get_u32(o, "num_local_experts", &c->experts, 1, errbuf, errlen)))
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: no num_experts or num_local_experts");
	if ((rc = get_u32(o, qwen ? "moe_intermediate_size" : "intermediate_size", &c->moe_ff, 1,
		 errbuf, errlen)))
		return rc;
	if (qwen && (rc = get_u32(o, "intermediate_size", &c->dense_ff, 0, errbuf, errlen)) > 1)
		return rc;
	if (strcmp(mt, "qwen2_moe") == 0 &&
	    (rc = get_u32(o, "shared_expert_intermediate_size", &c->shared_ff, 1, errbuf, errlen)))
		return rc;
	if ((rc = get_u32(o, "max_position_embeddings", &c->max_pos, 0, errbuf, errlen)) > 1)
		return rc;
	if (c->experts == 0 || c->top_k == 0 || c->top_k > c->experts)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: %" PRIu32 " experts, %" PRIu32 " per token", c->experts, c->top_k);

	const json_t *j = json_object_get(o, "tie_word_embeddings");
	c->tie = json_is_true(j);
	j = json_object_get(o, "norm_topk_prob");
	c->norm_topk = json_is_boolean(j) ? json_is_true(j) : -1;
	/* What the engine refuses when it loads the arena (engine/model/
	 * config.c), refused here at import, with its bounds: where the two
	 * disagreed (a context of 2^32-1, a theta of 1, an eps of 0 were
	 * imported, then refused by every engine), the engine's won, as it is
	 * the one that computes with them. The positions' bound is its
	 * max_position_embeddings limit; eps is checked as the f32 it
	 * becomes; theta is rope_parameters' when that has one. */
	const json_t *mp = json_object_get(o, "max_position_embeddings");
	if (c->max_pos > MAX_POSITIONS || (mp && !json_is_null(mp) && c->max_pos == 0))
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: max_position_embeddings %" PRIu32 " is not in 1..%u", c->max_pos,
		    MAX_POSITIONS);
	if (get_num(o, "rms_norm_eps", &c->rms_eps) != 0 || !((float)c->rms_eps > 0) ||
	    (float)c->rms_eps > 1)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: rms_norm_eps is missing or not in (0, 1] as an f32");
	const json_t *rp = json_object_get(o, "rope_parameters");
	if (get_num(rp, "rope_theta", &c->rope_theta) != 0 &&
	    get_num(o, "rope_theta", &c->rope_theta) != 0)
		c->rope_theta = 0;
	double prf;
	if (get_num(o, "partial_rotary_factor", &prf) == 0 && prf != 1.0)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "config.json: partial_rotary_factor %g is not supported (only 1)", prf);
	c->bos = get_id(o, "bos_token_id");
	c->eos = get_id(o, "eos_token_id");
	c->qkv_bias = strcmp(mt, "qwen2_moe") == 0 && !json_is_false(json_object_get(o, "qkv_bias"));

	/* What the forward pass does not do: refused by name. */
	const char *act = json_string_value(json_object_get(o, "hidden_act"));
	if (act && strcmp(act, "silu") != 0)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "config.json: hidden_act \"%.32s\" is not supported (silu)", act);
	if ((rc = check_rope(o, errbuf, errlen)))
		return rc;
	/* after the rope type: an unsupported one is named first */
	if (!(c->rope_theta > 1.0) || c->rope_theta > 1e30)
		return arena_errf(errbuf, errlen, BATON_ESOURCE,
		    "config.json: rope_theta is missing or not a number above 1");
	static const char *const must_be_off[] = {
		"quantization_config", "mlp_only_layers", "use_sliding_window", "attention_bias",
		"clip_qkv",
	};
	for (size_t i = 0; i < sizeof must_be_off / sizeof must_be_off[0]; i++)
		if (truthy(json_object_get(o, must_be_off[i])))
			return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "config.json: %s is set; it is not supported", must_be_off[i]);
	uint32_t step;
	if (get_u32(o, "decoder_sparse_step", &step, 0, errbuf, errlen) == 0 && step != 1)
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "config.json: decoder_sparse_step %" PRIu32 " (dense layers between MoE layers) is "
		    "not supported", step);
	if (strcmp(mt, "mixtral") == 0 && truthy(json_object_get(o, "sliding_window")))
		return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
		    "config.json: sliding_window is set; sliding-window attention is not supported");
	const json_t *lt = json_object_get(o, "layer_types");
	for (size_t i = 0; json_is_array(lt) && i < json_array_size(lt); i++) {
		const char *t = json_string_value(json_array_get(lt, i));
		if (!t || strcmp(t, "full_attention") != 0)
			return arena_errf(errbuf, errlen, BATON_EUNSUPPORTED,
			    "config.json: layer_types[%zu] is \"%.32s\"; only full_attention is supported",
			    i, t ? t : "?");
	}
	if (c->layers == 0 || c->layers > BATON_ARENA_MAX_LAYERS || c->experts > BATON_ARENA_MAX_EXPERTS ||
	    c->hidden == 0 || c->hidden >= ARENA_MAX_DIM || c->moe_ff == 0 || c->moe_ff >= ARENA_MAX_DIM ||
	    c->vocab == 0 || c->vocab > ARENA_MAX_DENSE_ROWS ||
	    (uint64_t)c->heads * c->head_dim >= ARENA_MAX_DIM || c->shared_ff >= ARENA_MAX_DIM)
		return arena_errf(errbuf, errlen, BATON_ECOUNT,
		    "config.json: sizes out of range (layers %" PRIu32 ", experts %" PRIu32
		    ", hidden %" PRIu32 ", expert width %" PRIu32 ", vocabulary %" PRIu32 ")",
		    c->layers, c->experts, c->hidden, c->moe_ff, c->vocab);
	return 0;
}

char *arena_model_config_json(const struct arena_model_cfg *c, uint64_t *len)
{
	static const struct { const char *arch, *cls; } cls[] = {
		{ "qwen3_moe", "Qwen3MoeForCausalLM" }, { "qwen2_moe", "Qwen2MoeForCausalLM" },
		{ "mixtral", "MixtralForCausalLM" }, { "olmoe", "OlmoeForCausalLM" },
	};
	const char *cn = "";
	for (size_t i = 0; i < 4; i++)
		if (strcmp(c->arch, cls[i].arch) == 0)
			cn = cls[i].cls;
	int qwen = strncmp(c->arch, "qwen", 4) == 0;
	json_t *o = json_object();
	json_object_set_new(o, "architectures", json_pack("[s]", cn));
	json_object_set_new(o, "model_type", json_string(c->arch));
	json_object_set_new(o, "hidden_size", json_integer(c->hidden));
	json_object_set_new(o, "num_hidden_layers", json_integer(c->layers));
	json_object_set_new(o, "num_attention_heads", json_integer(c->heads));
	json_object_set_new(o, "num_key_value_heads", json_integer(c->kv_heads));
	json_object_set_new(o, "head_dim", json_integer(c->head_dim));
	if (qwen) {
		json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_ff));
		json_object_set_new(o, "intermediate_size",
		    json_integer(c->dense_ff ? c->dense_ff : c->moe_ff));
	} else {
		json_object_set_new(o, "intermediate_size", json_integer(c->moe_ff));
	}
	/* both names: transformers 5 writes num_local_experts where 4 wrote
	 * num_experts */
	json_object_set_new(o, "num_experts", json_integer(c->experts));
	json_object_set_new(o, "num_local_experts", json_integer(c->experts));
	json_object_set_new(o, "num_experts_per_tok", json_integer(c->top_k));
	if (strcmp(c->arch, "mixtral") != 0)
		json_object_set_new(o, "norm_topk_prob",
		    json_boolean(c->norm_topk >= 0 ? c->norm_topk : strcmp(c->arch, "qwen3_moe") == 0));
	if (strcmp(c->arch, "qwen2_moe") == 0) {
		json_object_set_new(o, "shared_expert_intermediate_size", json_integer(c->shared_ff));
		json_object_set_new(o, "qkv_bias", json_boolean(c->qkv_bias));
	}
	json_object_set_new(o, "hidden_act", json_string("silu"));
	json_object_set_new(o, "rms_norm_eps", json_real(c->rms_eps));
	json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
	json_t *rp = json_pack("{s:f, s:s}", "rope_theta", c->rope_theta, "rope_type",
	    c->rope_type[0] ? c->rope_type : "default");
	if (rp && c->rope_type[0]) {
		json_object_set_new(rp, "factor", json_real(c->rope_factor));
		if (c->rope_orig)
			json_object_set_new(rp, "original_max_position_embeddings",
			    json_integer(c->rope_orig));
		if (c->rope_attn > 0)
			json_object_set_new(rp, "attention_factor", json_real(c->rope_attn));
		if (c->rope_beta_fast > 0)
			json_object_set_new(rp, "beta_fast", json_real(c->rope_beta_fast));
		if (c->rope_beta_slow > 0)
			json_object_set_new(rp, "beta_slow", json_real(c->rope_beta_slow));
	}
	json_object_set_new(o, "rope_parameters", rp);
	json_object_set_new(o, "rope_scaling", json_null());
	json_object_set_new(o, "vocab_size", json_integer(c->vocab));
	json_object_set_new(o, "max_position_embeddings", json_integer(c->max_pos ? c->max_pos : 4096));
	json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie));
	json_object_set_new(o, "bos_token_id", c->bos >= 0 ? json_integer(c->bos) : json_null());
	json_object_set_new(o, "eos_token_id", c->eos >= 0 ? json_integer(c->eos) : json_null());
	char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (s)
		*len = strlen(s);
	return s;
}

void arena_model_router_name(const char *arch, uint32_t l, char *buf, size_t len)
{
	snprintf(buf, len, "model.layers.%" PRIu32 ".%s.gate.weight", l,
	    strcmp(arch, "mixtral") == 0 ? "block_sparse_moe" : "mlp");
}

static int mt_cmp(const void *a, const void *b)
{
	return strcmp(((const struct arena_model_tensor *)a)->name,
	    ((const struct arena_model_tensor *)b)->name);
}

struct arena_model_tensor *arena_model_find(struct arena_model_tensor *v, uint64_t n,
    const char *name)
{
	struct arena_model_tensor key;
	snprintf(key.name, sizeof key.name, "%s", name);
	return bsearch(&key, v, n, sizeof *v, mt_cmp);
}

int arena_model_tensors(const struct arena_model_cfg *c, struct arena_model_tensor **out,
    uint64_t *n, char *errbuf, size_t errlen)
{
	uint64_t cap = 3 + (uint64_t)c->layers * 16, k = 0;
	struct arena_model_tensor *v = calloc(cap, sizeof *v);
	if (!v)
		return arena_errf(errbuf, errlen, BATON_ENOMEM, "out of memory");
	uint32_t H = c->hidden, q = c->heads * c->head_dim, kv = c->kv_heads * c->head_dim;
#define ADD(role_, layer_, rows_, cols_, req_, kind_, ...)                              \
	do {                                                                            \
		struct arena_model_tensor *t_ = &v[k++];                                \
		snprintf(t_->name, sizeof t_->name, __VA_ARGS__);                       \
		t_->role = (role_);                                                     \
		t_->layer = (layer_);                                                   \
		t_->rows = (rows_);                                                     \
		t_->cols = (cols_);                                                     \
		t_->required = (req_);                                                  \
		t_->kind = (kind_);                                                     \
	} while (0)
	ADD(BATON_ROLE_DENSE, 0, c->vocab, H, 1, ARENA_MT_WEIGHT, "model.embed_tokens.weight");
	ADD(BATON_ROLE_DENSE, 0, 1, H, 1, ARENA_MT_NORM, "model.norm.weight");
	ADD(BATON_ROLE_DENSE, 0, c->vocab, H, !c->tie, ARENA_MT_WEIGHT, "lm_head.weight");
	int qwen3 = strcmp(c->arch, "qwen3_moe") == 0, qwen2 = strcmp(c->arch, "qwen2_moe") == 0;
	int olmoe = strcmp(c->arch, "olmoe") == 0;
	for (uint32_t l = 0; l < c->layers; l++) {
		const char *p = "model.layers.";
		ADD(BATON_ROLE_DENSE, 0, 1, H, 1, ARENA_MT_NORM, "%s%u.input_layernorm.weight", p, l);
		ADD(BATON_ROLE_NORM, l, 1, H, 1, ARENA_MT_NORM, "%s%u.post_attention_layernorm.weight", p, l);
		ADD(BATON_ROLE_DENSE, 0, q, H, 1, ARENA_MT_Q, "%s%u.self_attn.q_proj.weight", p, l);
		ADD(BATON_ROLE_DENSE, 0, kv, H, 1, ARENA_MT_K, "%s%u.self_attn.k_proj.weight", p, l);
		ADD(BATON_ROLE_DENSE, 0, kv, H, 1, ARENA_MT_WEIGHT, "%s%u.self_attn.v_proj.weight", p, l);
		ADD(BATON_ROLE_DENSE, 0, H, q, 1, ARENA_MT_WEIGHT, "%s%u.self_attn.o_proj.weight", p, l);
		if (c->qkv_bias) {
			ADD(BATON_ROLE_DENSE, 0, 1, q, 1, ARENA_MT_BIAS, "%s%u.self_attn.q_proj.bias", p, l);
			ADD(BATON_ROLE_DENSE, 0, 1, kv, 1, ARENA_MT_BIAS, "%s%u.self_attn.k_proj.bias", p, l);
			ADD(BATON_ROLE_DENSE, 0, 1, kv, 1, ARENA_MT_BIAS, "%s%u.self_attn.v_proj.bias", p, l);
		}
		if (qwen3 || olmoe) {
			ADD(BATON_ROLE_DENSE, 0, 1, olmoe ? q : c->head_dim, 1, ARENA_MT_NORM,
			    "%s%u.self_attn.q_norm.weight", p, l);
			ADD(BATON_ROLE_DENSE, 0, 1, olmoe ? kv : c->head_dim, 1, ARENA_MT_NORM,
			    "%s%u.self_attn.k_norm.weight", p, l);
		}
		struct arena_model_tensor *r = &v[k++];
		arena_model_router_name(c->arch, l, r->name, sizeof r->name);
		*r = (struct arena_model_tensor){ .role = BATON_ROLE_ROUTER, .layer = l,
			.rows = c->experts, .cols = H, .required = 1, .kind = ARENA_MT_WEIGHT };
		arena_model_router_name(c->arch, l, r->name, sizeof r->name);
		if (qwen2) {
			uint32_t S = c->shared_ff;
			ADD(BATON_ROLE_DENSE, 0, S, H, 1, ARENA_MT_WEIGHT,
			    "%s%u.mlp.shared_expert.gate_proj.weight", p, l);
			ADD(BATON_ROLE_DENSE, 0, S, H, 1, ARENA_MT_WEIGHT,
			    "%s%u.mlp.shared_expert.up_proj.weight", p, l);
			ADD(BATON_ROLE_DENSE, 0, H, S, 1, ARENA_MT_WEIGHT,
			    "%s%u.mlp.shared_expert.down_proj.weight", p, l);
			ADD(BATON_ROLE_DENSE, 0, 1, H, 1, ARENA_MT_WEIGHT,
			    "%s%u.mlp.shared_expert_gate.weight", p, l);
		}
	}
#undef ADD
	qsort(v, k, sizeof *v, mt_cmp);
	*out = v;
	*n = k;
	return 0;
}

int arena_arch_known(const char *arch)
{
	static const char *const known[] = { "qwen3_moe", "qwen2_moe", "mixtral", "olmoe" };
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		if (strcmp(arch, known[i]) == 0)
			return 1;
	return 0;
}
