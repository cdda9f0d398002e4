/*
 * model_test.c: the forward pass against Hugging Face transformers.
 *
 * engine/model/fixtures/<arch>/ holds a tiny random model of each architecture as
 * transformers 5.17 saved it, and reference.json: what transformers
 * computed with it in f32 (engine/model/fixtures/make_reference.py). Each case
 * makes an arena from the folder (as `baton-arena create` does), opens an
 * engine and a model on the host backend, and checks:
 *   - the last-token logits of 3 prompts (1, 7 and 19 tokens) within
 *     max |got - ref| <= LOGIT_TOL * max(1, max |ref|)
 *   - 32 greedy tokens after each prompt identical to transformers'
 *   - prompt 0's logits at each of those 32 decode steps, same tolerance
 * LOGIT_TOL = 1e-5. Why: both sides compute in f32 with different
 * summation orders (transformers' BLAS, ours the fixed 32-lane order), so
 * they differ by rounding alone: each dot of <= 128 terms carries a
 * relative error of a few 1e-7, and 3 layers of normalisation, attention,
 * routing and experts compound it; the host backend's worst over every
 * prompt and step is 4e-7 to 7e-7 of the logit scale (printed per case),
 * so 1e-5 leaves a margin of 15 for other backends' rounding (GPU expf,
 * other orders). A wrong formula is far outside: the attention scale off by
 * 1% moves mixtral's logits by 1e-3 of their scale, a norm or rope error
 * by 1e-2 and more.
 *
 * Also: the config parser refuses what the forward pass does not compute;
 * a prompt in small batches gives the same bits as one batch; release and
 * refill of the expert cache and of the KV cache change no bit.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/model_fixture.h"
#include "tests/t.h"

#define LOGIT_TOL 1e-5
#define N_NEW 32

/* ---- config.json ---------------------------------------------------------- */

static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	T_ASSERT_MSG(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	T_ASSERT(b && fread(b, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	b[n] = 0;
	*len = (size_t)n;
	return b;
}

static void t_config_fixtures(void)
{
	static const char *const archs[] = { "qwen3_moe", "mixtral", "olmoe", "qwen2_moe" };
	for (int i = 0; i < 4; i++) {
		char path[512], err[256] = "";
		size_t len;
		snprintf(path, sizeof path, "%s/%s/config.json", rig_fixtures(), archs[i]);
		char *j = slurp(path, &len);
		struct baton_model_config c;
		int rc = model_config_parse(j, len, &c, err, sizeof err);
		T_ASSERT_MSG(rc == 0, "%s: %s", archs[i], err);
		T_EQ_STR(c.arch->name, archs[i]);
		T_EQ_INT(c.vocab, 256);
		T_EQ_INT(c.hidden, 64);
		T_EQ_INT(c.layers, 3);
		T_EQ_INT(c.kv_heads, 2);
		free(j);
		if (i == 0) { /* qwen3_moe: head_dim apart from hidden/heads, num_local_experts */
			T_EQ_INT(c.head_dim, 32);
			T_EQ_INT(c.n_experts, 8);
			T_EQ_INT(c.moe_ff, 32);
			T_EQ_INT(c.route_rule, BATON_ROUTE_SOFTMAX_TOPK_NORM);
			T_ASSERT(c.rope_theta == 1e6 && c.eps == 1e-6f && !c.qkv_bias);
		} else if (i == 1) { /* mixtral: head_dim null, always renormalised */
			T_EQ_INT(c.head_dim, 16);
			T_EQ_INT(c.moe_ff, 48);
			T_EQ_INT(c.route_rule, BATON_ROUTE_SOFTMAX_TOPK_NORM);
			T_EQ_INT(c.window, 0);
		} else if (i == 2) { /* olmoe: tied, not renormalised, q/k norm whole */
			T_ASSERT(c.tie_embeddings);
			T_EQ_INT(c.route_rule, BATON_ROUTE_SOFTMAX_TOPK);
			T_EQ_INT(c.arch->qk_norm, BATON_QK_NORM_WHOLE);
			T_EQ_INT(c.top_k, 3);
		} else { /* qwen2_moe: biases and the shared expert */
			T_ASSERT(c.qkv_bias && !c.o_bias && c.arch->shared_expert);
			T_EQ_INT(c.shared_ff, 80);
			T_EQ_INT(c.route_rule, BATON_ROUTE_SOFTMAX_TOPK);
		}
	}
}

#define BASE "\"vocab_size\":100,\"hidden_size\":64,\"num_hidden_layers\":2," \
	"\"num_attention_heads\":4,\"num_key_value_heads\":2,\"num_experts\":4," \
	"\"num_experts_per_tok\":2,\"rms_norm_eps\":1e-6,\"rope_theta\":10000"

static void refused(const char *json, int want, const char *needle)
{
	struct baton_model_config c;
	char err[256] = "";
	T_EQ_ERR(model_config_parse(json, strlen(json), &c, err, sizeof err), want);
	T_ASSERT_MSG(strstr(err, needle), "message \"%s\" does not name \"%s\"", err, needle);
}

static void t_config_refusals(void)
{
	struct baton_model_config c;
	char err[256];
	const char *ok = "{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32}";
	T_OK(model_config_parse(ok, strlen(ok), &c, err, sizeof err));
	T_ASSERT(c.rope_factor == 1.0 && c.head_dim == 16 && c.max_pos == 4096);

	refused("{\"model_type\":\"llama\"," BASE "}", BATON_EUNSUPPORTED, "\"llama\"");
	refused("{\"model_type\":\"deepseek_v3\"," BASE "}", BATON_EUNSUPPORTED, "deepseek_v3");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32,"
	    "\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":4}}", BATON_EUNSUPPORTED, "dynamic");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32,"
	    "\"hidden_act\":\"gelu\"}", BATON_EUNSUPPORTED, "gelu");
	refused("{\"model_type\":\"olmoe\"," BASE ",\"intermediate_size\":32,\"clip_qkv\":8}",
	    BATON_EUNSUPPORTED, "clip_qkv");
	refused("{\"model_type\":\"qwen3_moe\"," BASE ",\"moe_intermediate_size\":32,"
	    "\"use_sliding_window\":true}", BATON_EUNSUPPORTED, "use_sliding_window");
	refused("{\"model_type\":\"qwen2_moe\"," BASE ",\"moe_intermediate_size\":32,"
	    "\"shared_expert_intermediate_size\":64,\"mlp_only_layers\":[1]}", BATON_EUNSUPPORTED,
	    "mlp_only_layers");
	refused("{\"model_type\":\"qwen2_moe\"," BASE ",\"moe_intermediate_size\":32,"
	    "\"shared_expert_intermediate_size\":64,\"layer_types\":[\"sliding_attention\"]}",
	    BATON_EUNSUPPORTED, "sliding_attention");
	refused("{\"model_type\":\"qwen2_moe\"," BASE ",\"moe_intermediate_size\":32}",
	    BATON_EINVAL, "shared_expert_intermediate_size");
	refused("{\"model_type\":\"mixtral\"," BASE "}", BATON_EINVAL, "intermediate_size");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32,"
	    "\"num_key_value_heads\":3}", BATON_EINVAL, "num_key_value_heads");
	refused("{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":64,"
	    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_experts\":4,"
	    "\"num_experts_per_tok\":2,\"rms_norm_eps\":1e-50,\"rope_theta\":10000,"
	    "\"intermediate_size\":32}", BATON_EINVAL, "rms_norm_eps"); /* 0 as an f32 (fuzzer) */
	refused("[1,2]", BATON_EINVAL, "object");
	refused("{\"model_type\":", BATON_EINVAL, "not JSON");

	/* rope: transformers 5's rope_parameters, linear scaling */
	const char *lin = "{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":64,"
	    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_local_experts\":4,"
	    "\"num_experts_per_tok\":2,\"rms_norm_eps\":1e-5,\"intermediate_size\":32,"
	    "\"sliding_window\":128,"
	    "\"rope_parameters\":{\"rope_type\":\"linear\",\"rope_theta\":500000.0,\"factor\":4.0}}";
	T_OK(model_config_parse(lin, strlen(lin), &c, err, sizeof err));
	T_ASSERT(c.rope_theta == 500000.0 && c.rope_factor == 4.0 && c.window == 128);
	T_EQ_INT(c.kv_heads, 4); /* defaults to the heads */
	float inv[8];
	model_rope_inv_freq(&c, inv);
	T_ASSERT(inv[0] == 0.25f);
	T_ASSERT(fabs(inv[1] - 0.25 / pow(500000.0, 2.0 / 16)) < 1e-9);
}

/* config.json as real files hold it (base.h's reader policy): integral
 * reals and exponent forms where integers are expected, an integer past
 * 64 bits under a key the engine does not read, null where a value is
 * optional, unknown keys; a fraction or an out-of-range number where an
 * integer is expected is refused by name. */
static void t_config_tolerant(void)
{
	const char *js = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100.0,\"hidden_size\":6.4e1,"
	    "\"num_hidden_layers\":2,\"num_attention_heads\":4.0,\"num_key_value_heads\":2,"
	    "\"num_experts\":4,\"num_experts_per_tok\":2.0,\"rms_norm_eps\":1e-06,"
	    "\"moe_intermediate_size\":32,\"head_dim\":16.0,\"rope_theta\":1e6,"
	    "\"max_position_embeddings\":40960.0,\"bos_token_id\":1.0,\"eos_token_id\":[2.0,3],"
	    "\"decoder_sparse_step\":1.0,\"sliding_window\":null,\"rope_scaling\":null,"
	    "\"use_sliding_window\":false,\"max_window_layers\":48,\"tie_word_embeddings\":false,"
	    "\"model_max_length\":1000000000000000019884624838656,\"initializer_range\":0.02,"
	    "\"transformers_version\":\"4.51.0\",\"torch_dtype\":\"bfloat16\","
	    "\"an_unknown\":{\"deep\":[1,2.5,null,18446744073709551616]}}";
	struct baton_model_config c;
	char err[256] = "";
	int rc = model_config_parse(js, strlen(js), &c, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "%s", err);
	T_EQ_INT(c.vocab, 100);
	T_EQ_INT(c.hidden, 64);
	T_EQ_INT(c.heads, 4);
	T_EQ_INT(c.top_k, 2);
	T_EQ_INT(c.head_dim, 16);
	T_EQ_INT(c.max_pos, 40960);
	T_EQ_INT(c.bos, 1);
	T_EQ_INT(c.eos, 2);
	T_ASSERT(c.rope_theta == 1e6);
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32.5}", BATON_EINVAL,
	    "intermediate_size");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":1e30}", BATON_EINVAL,
	    "intermediate_size");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":"
	    "1000000000000000019884624838656}", BATON_EINVAL, "intermediate_size");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":\"32\"}", BATON_EINVAL,
	    "intermediate_size");
}

/* RoPE against transformers' formulas, written out in Python
 * (fixtures/rope_ref.py: f32 tensor arithmetic as torch does it): the
 * inverse frequencies within 2 ulp (powf against a correctly rounded pow)
 * and the attention factor, for the rope settings real configs hold:
 * Qwen3's model-card YaRN (factor 4 over 32,768, rope_scaling as 4.x
 * writes it), transformers 5's rope_parameters with betas and no
 * truncation, DeepSeek's mscale / mscale_all_dim, an explicit
 * attention_factor under the older "type" key, a factor left to
 * max_position_embeddings / original_max_position_embeddings, and
 * linear and default for comparison. */
static void t_rope_yarn(void)
{
#define RB "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64," \
	"\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_experts\":4," \
	"\"num_experts_per_tok\":2,\"rms_norm_eps\":1e-6,\"moe_intermediate_size\":32,"
	static const char *const cfgs[] = {
		RB "\"head_dim\":128,\"rope_theta\":1000000,\"max_position_embeddings\":40960,"
		"\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0,"
		"\"original_max_position_embeddings\":32768}}",
		RB "\"head_dim\":64,\"max_position_embeddings\":8192,\"rope_parameters\":{"
		"\"rope_type\":\"yarn\",\"rope_theta\":500000.0,\"factor\":2.0,\"beta_fast\":16,"
		"\"beta_slow\":2,\"truncate\":false}}",
		RB "\"head_dim\":64,\"rope_theta\":10000,\"max_position_embeddings\":163840,"
		"\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,\"mscale\":0.707,"
		"\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,"
		"\"beta_fast\":32,\"beta_slow\":1}}",
		RB "\"head_dim\":32,\"rope_theta\":10000,\"max_position_embeddings\":4096,"
		"\"rope_scaling\":{\"type\":\"yarn\",\"factor\":8,\"attention_factor\":0.8}}",
		RB "\"head_dim\":128,\"rope_theta\":1000000,\"max_position_embeddings\":131072,"
		"\"rope_scaling\":{\"rope_type\":\"yarn\",\"original_max_position_embeddings\":32768}}",
		RB "\"rope_theta\":10000,\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.5}}",
		RB "\"head_dim\":128,\"rope_theta\":1000000}",
	};
#undef RB
	char dir[] = "/tmp/baton-rope-XXXXXX", path[64], cmd[512], err[256];
	T_ASSERT(mkdtemp(dir) != NULL);
	snprintf(path, sizeof path, "%s/config.json", dir);
	for (size_t k = 0; k < sizeof cfgs / sizeof cfgs[0]; k++) {
		FILE *f = fopen(path, "w");
		T_ASSERT(f && fputs(cfgs[k], f) >= 0 && fclose(f) == 0);
		snprintf(cmd, sizeof cmd, "python3 %s/rope_ref.py %s", rig_fixtures(), path);
		FILE *p = popen(cmd, "r");
		T_ASSERT(p);
		json_error_t je;
		json_t *ref = json_loadf(p, 0, &je);
		T_ASSERT_MSG(pclose(p) == 0 && ref, "%s: %s", cmd, je.text);
		struct baton_model_config c;
		int prc = model_config_parse(cfgs[k], strlen(cfgs[k]), &c, err, sizeof err);
		T_ASSERT_MSG(prc == 0, "config %zu: %s", k, err);
		json_t *inv = json_object_get(ref, "inv_freq");
		T_EQ_INT(json_array_size(inv), c.head_dim / 2);
		float got[512];
		model_rope_inv_freq(&c, got);
		double worst = 0;
		for (uint32_t i = 0; i < c.head_dim / 2; i++) {
			float want = (float)json_real_value(json_array_get(inv, i));
			double ulp = nextafterf(want, INFINITY) - want;
			double d = fabs((double)got[i] - want) / ulp;
			worst = fmax(worst, d);
			T_ASSERT_MSG(d <= 2, "config %zu inv_freq[%u]: %a, transformers %a (%.1f ulp)", k, i,
			    got[i], want, d);
		}
		float af = (float)json_number_value(json_object_get(ref, "attention_factor"));
		T_ASSERT_MSG(c.rope_mscale == af, "config %zu: attention factor %.9g, transformers %.9g", k,
		    c.rope_mscale, af);
		printf("  config %zu: %u frequencies within %.0f ulp, attention factor %.7g\n", k,
		    c.head_dim / 2, worst, c.rope_mscale);
		json_decref(ref);
	}
	unlink(path);
	rmdir(dir);
	/* What transformers' YaRN would not take is refused. */
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32,"
	    "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":0.5}}", BATON_EINVAL, "factor");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32,"
	    "\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4,\"beta_fast\":\"x\"}}",
	    BATON_EINVAL, "beta_fast");
	refused("{\"model_type\":\"mixtral\"," BASE ",\"intermediate_size\":32,"
	    "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", BATON_EUNSUPPORTED, "llama3");
}

/* ---- against transformers -------------------------------------------------- */

/* The fixture `arch` as an arena: from its folder, or (gguf) from the GGUF
 * file engine/model/fixtures/hf_to_gguf.py makes of it as llama.cpp would;
 * its reference.json as r->ref. */
static void rig_open_from(struct rig *r, const char *arch, uint32_t max_batch, int gguf)
{
	char src[512];
	rig_dir(r);
	snprintf(src, sizeof src, "%s/%s", rig_fixtures(), arch);
	struct baton_arena_source s = { .kind = BATON_ARENA_SRC_SAFETENSORS, .file = src };
	char gpath[128], cmd[1024];
	if (gguf) {
		snprintf(gpath, sizeof gpath, "%s/m.gguf", r->dir);
		snprintf(cmd, sizeof cmd, "python3 %s/hf_to_gguf.py %s %s", rig_fixtures(), src, gpath);
		T_ASSERT_MSG(system(cmd) == 0, "%s failed", cmd);
		s = (struct baton_arena_source){ .kind = BATON_ARENA_SRC_GGUF, .file = gpath };
	}
	rig_engine_from(r, &s, arch);
	struct baton_model_opts mo = { .max_batch = max_batch };
	rig_model(r, &mo);
	rig_ref(r, src, "reference.json");
	if (gguf)
		unlink(gpath);
}

static void rig_open(struct rig *r, const char *arch, uint32_t max_batch)
{
	rig_open_from(r, arch, max_batch, 0);
}

static uint32_t *ids_of(json_t *a, size_t *n)
{
	*n = json_array_size(a);
	uint32_t *v = malloc(*n * sizeof *v);
	T_ASSERT(v);
	for (size_t i = 0; i < *n; i++)
		v[i] = (uint32_t)json_integer_value(json_array_get(a, i));
	return v;
}

static uint32_t argmax(const float *l, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* max |got - ref| / max(1, max |ref|); fails beyond LOGIT_TOL. */
static double compare(const float *got, json_t *ref, uint32_t vocab, const char *what)
{
	T_EQ_INT(json_array_size(ref), vocab);
	double md = 0, mr = 1;
	for (uint32_t i = 0; i < vocab; i++) {
		double r = json_number_value(json_array_get(ref, i));
		md = fmax(md, fabs(got[i] - r));
		mr = fmax(mr, fabs(r));
	}
	double rel = md / mr;
	T_ASSERT_MSG(rel <= LOGIT_TOL, "%s: max |diff| %.3g is %.3g of the logit scale %.3g (> %g)",
	    what, md, rel, mr, LOGIT_TOL);
	return rel;
}

static void against_reference(const char *arch)
{
	struct rig r;
	rig_open(&r, arch, 0);
	uint32_t V = model_config(r.m)->vocab;
	float *lg = malloc(V * sizeof *lg);
	T_ASSERT(lg);
	json_t *prompts = json_object_get(r.ref, "prompts");
	double worst = 0;
	for (size_t p = 0; p < json_array_size(prompts); p++) {
		size_t n;
		uint32_t *toks = ids_of(json_array_get(prompts, p), &n);
		char what[64];
		T_OK(model_prefill(r.m, toks, (uint32_t)n, lg));
		snprintf(what, sizeof what, "%s prompt %zu last logits", arch, p);
		worst = fmax(worst, compare(lg, json_array_get(json_object_get(r.ref, "last_logits"), p),
		    V, what));
		size_t ng;
		uint32_t *greedy = ids_of(json_array_get(json_object_get(r.ref, "greedy"), p), &ng);
		T_EQ_INT(ng, N_NEW);
		for (uint32_t s = 0; s < N_NEW; s++) {
			if (s > 0) {
				T_OK(model_decode(r.m, greedy[s - 1], lg));
				if (p == 0) {
					snprintf(what, sizeof what, "%s prompt 0 step %u logits", arch, s);
					worst = fmax(worst, compare(lg,
					    json_array_get(json_object_get(r.ref, "step_logits"), s), V, what));
				}
			}
			uint32_t tok = argmax(lg, V);
			T_ASSERT_MSG(tok == greedy[s], "%s prompt %zu greedy token %u: %u, transformers %u",
			    arch, p, s, tok, greedy[s]);
		}
		T_EQ_INT(model_pos(r.m), n + N_NEW - 1);
		free(toks);
		free(greedy);
	}
	printf("  %s: worst logit difference %.3g of the logit scale\n", arch, worst);
	free(lg);
	rig_close(&r);
}

static void t_qwen3_moe(void)
{
	against_reference("qwen3_moe");
}

static void t_mixtral(void)
{
	against_reference("mixtral");
}

/* weights stored in f16, the reference computed on the same values */
static void t_mixtral_f16(void)
{
	against_reference("mixtral_f16");
}

static void t_olmoe(void)
{
	against_reference("olmoe");
}

static void t_qwen2_moe(void)
{
	against_reference("qwen2_moe");
}

/* A 19-token prompt in batches of 4 gives the bits of one batch; the
 * expert cache released mid-sequence and the KV cache released and rebuilt
 * change no bit either. */
static void t_batches_and_release(void)
{
	struct rig a, b;
	rig_open(&a, "qwen2_moe", 0);
	rig_open(&b, "qwen2_moe", 4);
	uint32_t V = model_config(a.m)->vocab;
	float *la = malloc(V * 4), *lb = malloc(V * 4);
	T_ASSERT(la && lb);
	size_t n;
	uint32_t *toks = ids_of(json_array_get(json_object_get(a.ref, "prompts"), 2), &n);
	T_OK(model_prefill(a.m, toks, (uint32_t)n, la));
	T_OK(model_prefill(b.m, toks, (uint32_t)n, lb));
	T_ASSERT(memcmp(la, lb, V * 4) == 0);

	struct baton_cache_report rep;
	T_OK(engine_release(b.e, &rep));
	T_EQ_INT(rep.state, BATON_CACHE_RELEASED);
	for (int s = 0; s < 5; s++) {
		uint32_t t = argmax(la, V);
		T_OK(model_decode(a.m, t, la));
		T_OK(model_decode(b.m, t, lb)); /* loads what it needs while released */
		T_ASSERT(memcmp(la, lb, V * 4) == 0);
	}
	T_OK(engine_refill(b.e, &rep));

	/* the model's own device memory: released mid-sequence, every byte
	 * back in the device's free count; the next decode refills it and the
	 * KV rows come back, bit for bit */
	uint64_t fr0, fr1, tot, held = model_device_bytes(b.m);
	T_ASSERT(held >= model_dense_bytes(b.m) + model_kv_bytes(b.m) && model_kv_bytes(b.m) > 0);
	T_OK(engine_mem_info(b.e, &fr0, &tot));
	T_OK(model_release(b.m));
	T_OK(model_release(b.m)); /* idempotent */
	T_ASSERT(model_released(b.m) && model_device_bytes(b.m) == 0);
	T_OK(engine_mem_info(b.e, &fr1, &tot));
	/* The host backend counts every byte. The CUDA driver keeps buffers
	 * this small (under 1 MiB here) in its own pool after cuMemFree, so
	 * cuMemGetInfo need not rise by them (seen on the H200: unchanged);
	 * there the free count must at least not fall. */
	uint64_t want = strcmp(rig_backend(), "host") == 0 || held >= (64u << 20) ? fr0 + held : fr0;
	T_ASSERT_MSG(fr1 >= want, "free %llu -> %llu, held %llu", (unsigned long long)fr0,
	    (unsigned long long)fr1, (unsigned long long)held);
	for (int s = 0; s < 3; s++) {
		uint32_t t = argmax(la, V);
		T_OK(model_decode(a.m, t, la));
		T_OK(model_decode(b.m, t, lb));
		T_ASSERT(memcmp(la, lb, V * 4) == 0);
	}
	T_ASSERT(!model_released(b.m) && model_device_bytes(b.m) == held);
	/* a prefill while released starts afresh */
	T_OK(model_release(b.m));
	T_OK(model_prefill(a.m, toks, (uint32_t)n, la));
	T_OK(model_prefill(b.m, toks, (uint32_t)n, lb));
	T_ASSERT(memcmp(la, lb, V * 4) == 0);

	/* the KV cache: released, the sequence is gone; a new prefill rebuilds it */
	model_kv_release(b.m);
	T_EQ_INT(model_kv_bytes(b.m), 0);
	T_EQ_ERR(model_decode(b.m, 1, lb), BATON_ESTATE);
	T_OK(model_prefill(a.m, toks, (uint32_t)n, la));
	T_OK(model_prefill(b.m, toks, (uint32_t)n, lb));
	T_ASSERT(model_kv_bytes(b.m) > 0);
	T_ASSERT(memcmp(la, lb, V * 4) == 0);

	/* bad input changes nothing */
	uint32_t bad[2] = { 3, 256 };
	T_EQ_ERR(model_decode(a.m, 256, la), BATON_ERANGE);
	T_EQ_INT(model_pos(a.m), n);
	T_EQ_ERR(model_prefill(a.m, bad, 2, la), BATON_ERANGE);
	T_EQ_ERR(model_prefill(a.m, bad, 0, la), BATON_EINVAL);
	free(toks), free(la), free(lb);
	rig_close(&a);
	rig_close(&b);
}

/* The same weights through GGUF (converted as llama.cpp does, Mixtral's
 * Q/K rows permuted for ggml's RoPE and permuted back at import) give the
 * bits of the safetensors arena: logits of every prompt, and so the same
 * greedy tokens. */
static void t_gguf_same_logits(void)
{
	static const char *const archs[] = { "qwen3_moe", "mixtral", "mixtral_f16", "olmoe",
		"qwen2_moe" };
	for (int i = 0; i < 5; i++) {
		struct rig a, b;
		rig_open(&a, archs[i], 0);
		rig_open_from(&b, archs[i], 0, 1);
		uint32_t V = model_config(a.m)->vocab;
		float *la = malloc(V * 4), *lb = malloc(V * 4);
		T_ASSERT(la && lb);
		json_t *prompts = json_object_get(a.ref, "prompts");
		for (size_t p = 0; p < json_array_size(prompts); p++) {
			size_t n;
			uint32_t *toks = ids_of(json_array_get(prompts, p), &n);
			T_OK(model_prefill(a.m, toks, (uint32_t)n, la));
			T_OK(model_prefill(b.m, toks, (uint32_t)n, lb));
			T_ASSERT_MSG(memcmp(la, lb, V * 4) == 0, "%s prompt %zu: GGUF logits differ", archs[i], p);
			for (int s = 0; s < 8; s++) {
				uint32_t t = argmax(la, V);
				T_OK(model_decode(a.m, t, la));
				T_OK(model_decode(b.m, t, lb));
				T_ASSERT_MSG(memcmp(la, lb, V * 4) == 0, "%s prompt %zu step %d: GGUF logits differ",
				    archs[i], p, s);
			}
			free(toks);
		}
		free(la), free(lb);
		rig_close(&a);
		rig_close(&b);
	}
}

/* YaRN through the whole forward pass: the attention factor multiplies the
 * cos and sin of both q and k. qwen3_moe's q and k pass their per-head
 * RMSNorm weights just before RoPE, and RoPE is linear, so a model with
 * attention_factor 2 and the same model with attention_factor 1 and those
 * weights doubled compute the same numbers, bit for bit (times 2 is exact):
 * their logits must be equal. A third with attention_factor 1 and the
 * weights as they are must differ (the factor is not a no-op), and so must
 * the fixture with the default rope (the frequencies changed). */
static void t_rope_yarn_forward(void)
{
	static const char *const variants[][2] = {
		{ "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":128,"
		  "\"attention_factor\":2.0}", NULL },
		{ "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":128,"
		  "\"attention_factor\":1.0}", "2" },
		{ "{\"rope_type\":\"yarn\",\"factor\":4.0,\"original_max_position_embeddings\":128,"
		  "\"attention_factor\":1.0}", NULL },
		{ "{}", NULL },
	};
	float *lg[4];
	uint32_t V = 0;
	char dir[] = "/tmp/baton-yarnfw-XXXXXX", cmd[2048];
	T_ASSERT(mkdtemp(dir) != NULL);
	for (int k = 0; k < 4; k++) {
		snprintf(cmd, sizeof cmd, "python3 %s/rope_variant.py %s/qwen3_moe %s/v%d '%s' %s",
		    rig_fixtures(), rig_fixtures(), dir, k, variants[k][0],
		    variants[k][1] ? variants[k][1] : "");
		T_ASSERT_MSG(system(cmd) == 0, "%s failed", cmd);
		struct rig r;
		char name[16];
		snprintf(name, sizeof name, "v%d", k);
		rig_engine(&r, dir, name, "qwen3_moe");
		rig_model(&r, NULL);
		const struct baton_model_config *c = model_config(r.m);
		T_EQ_INT(c->rope_type, k < 3 ? BATON_ROPE_YARN : BATON_ROPE_DEFAULT);
		V = r.V;
		lg[k] = malloc((size_t)V * 5 * sizeof(float));
		T_ASSERT(lg[k]);
		const uint32_t toks[] = { 5, 17, 42, 99, 3, 250, 7, 64, 128, 11, 200, 33 };
		T_OK(model_prefill(r.m, toks, 12, lg[k]));
		for (uint32_t s = 1; s < 5; s++)
			T_OK(model_decode(r.m, argmax(lg[k] + (size_t)(s - 1) * V, V), lg[k] + (size_t)s * V));
		rig_close(&r);
		snprintf(cmd, sizeof cmd, "rm -rf %s/v%d", dir, k);
		T_ASSERT(system(cmd) == 0);
	}
	rmdir(dir);
	const size_t bytes = (size_t)V * 5 * sizeof(float);
	T_ASSERT_MSG(memcmp(lg[0], lg[1], bytes) == 0,
	    "attention_factor 2 and q/k norm weights doubled give different logits");
	T_ASSERT(memcmp(lg[0], lg[2], bytes) != 0);
	T_ASSERT(memcmp(lg[2], lg[3], bytes) != 0);
	for (int k = 0; k < 4; k++)
		free(lg[k]);
}

/* The logits of a quantized file (a) and of its f32 values (b): the same
 * bits, or (exact 0) within 1e-4 of b's largest magnitude. */
static void same_logits(const float *a, const float *b, uint32_t V, int exact, const char *arch,
    const char *type, size_t p, int step)
{
	if (exact) {
		T_ASSERT_MSG(memcmp(a, b, V * 4) == 0, "%s %s prompt %zu step %d: logits differ", arch,
		    type, p, step);
		return;
	}
	double md = 0, mb = 0;
	for (uint32_t i = 0; i < V; i++) {
		md = fmax(md, fabs((double)a[i] - b[i]));
		mb = fmax(mb, fabs((double)b[i]));
	}
	T_ASSERT_MSG(isfinite(md) && md <= 1e-4 * mb, "%s %s prompt %zu step %d: logits %.3g apart of %.3g",
	    arch, type, p, step, md, mb);
}

/* The block types of real quantized GGUFs, end to end: each fixture's
 * matrices quantized to a type of 32-element blocks (hf_to_gguf.py
 * --quant; rows of 32 and 64), and the same model
 * with those weights as the f32 values tests/blockq.py decodes them to
 * from the format's definition: the engine gives both the same logits,
 * bit for bit on the host (it decodes a block type to f32 and then
 * computes as for f32), within 1e-4 on cuda (its kernels for these types
 * sum the experts in another order than for f32), so every tensor of the
 * quantized file was decoded as the spec says. The quantized arena holds the type (checked), and its logits
 * stay near transformers' (a loose bound: the weights were rounded). The
 * super-block types (q2_K, q3_K, iq4_xs) run on random models with rows of
 * 256 (fixtures/random_model.py), which have no transformers reference. */
static int quant_pair(const char *arch, const char *type, int random_model)
{
	struct rig q, f;
	char src[512], gq[128], gf[128], cmd[1400];
	rig_dir(&q);
	rig_dir(&f);
	if (random_model) {
		/* rows of 256 for the super-block types: a random model (no
		 * transformers reference) made in the rig's directory */
		snprintf(src, sizeof src, "%s/src", q.dir);
		snprintf(cmd, sizeof cmd, "python3 %s/random_model.py %s %s 256 256", rig_fixtures(), src,
		    arch);
		T_ASSERT_MSG(system(cmd) == 0, "%s failed", cmd);
	} else {
		snprintf(src, sizeof src, "%s/%s", rig_fixtures(), arch);
	}
	snprintf(gq, sizeof gq, "%s/q.gguf", q.dir);
	snprintf(gf, sizeof gf, "%s/f.gguf", f.dir);
	snprintf(cmd, sizeof cmd, "python3 %s/hf_to_gguf.py %s %s --quant %s %s", rig_fixtures(), src,
	    gq, type, gf);
	T_ASSERT_MSG(system(cmd) == 0, "%s failed", cmd);
	struct baton_arena_source sq = { .kind = BATON_ARENA_SRC_GGUF, .file = gq };
	struct baton_arena_source sf = { .kind = BATON_ARENA_SRC_GGUF, .file = gf };
	rig_engine_from(&q, &sq, arch);
	rig_engine_from(&f, &sf, arch);
	unlink(gq);
	unlink(gf);
	if (random_model) {
		snprintf(cmd, sizeof cmd, "rm -rf %s", src);
		T_ASSERT(system(cmd) == 0);
	}
	/* the host: the quantized file's logits are its f32 values' bit for
	 * bit; cuda: within 1e-4 of their scale (its expert kernels take
	 * the scalar path for these types and the vector path for f32, two
	 * summation orders) */
	const int exact = strcmp(rig_backend(), "cuda") != 0;
	rig_model(&q, NULL);
	rig_model(&f, NULL);
	uint32_t dts[3] = { 0 };
	T_OK(arena_layer_dtypes(engine_arena(q.e), 0, dts));
	T_EQ_INT(dts[0], baton_dtype_parse(type));
	T_OK(arena_layer_dtypes(engine_arena(f.e), 0, dts));
	T_EQ_INT(dts[0], BATON_DT_F32);
	if (random_model)
		q.ref = json_pack("{s:[[i,i,i,i,i,i,i,i,i],[i,i,i]]}", "prompts", 1, 5, 9, 33, 2, 60, 7,
		    7, 12, 40, 3, 0);
	else
		rig_ref(&q, src, "reference.json");
	uint32_t V = q.V;
	float *lq = malloc(V * 4), *lf = malloc(V * 4);
	T_ASSERT(lq && lf);
	json_t *prompts = json_object_get(q.ref, "prompts");
	for (size_t p = 0; p < json_array_size(prompts); p++) {
		size_t n;
		uint32_t *toks = ids_of(json_array_get(prompts, p), &n);
		T_OK(model_prefill(q.m, toks, (uint32_t)n, lq));
		T_OK(model_prefill(f.m, toks, (uint32_t)n, lf));
		same_logits(lq, lf, V, exact, arch, type, p, -1);
		double md = 0, mr = 1;
		json_t *ref = json_array_get(json_object_get(q.ref, "last_logits"), p);
		for (uint32_t i = 0; i < V; i++) {
			T_ASSERT(isfinite(lq[i]));
			if (!ref)
				continue;
			double r = json_number_value(json_array_get(ref, i));
			md = fmax(md, fabs(lq[i] - r));
			mr = fmax(mr, fabs(r));
		}
		T_ASSERT_MSG(md / mr < 0.5, "%s %s prompt %zu: %.3g of the logit scale from transformers",
		    arch, type, p, md / mr);
		for (int st = 0; st < 4; st++) {
			uint32_t t = argmax(lq, V);
			T_OK(model_decode(q.m, t, lq));
			T_OK(model_decode(f.m, t, lf));
			same_logits(lq, lf, V, exact, arch, type, p, st);
		}
		free(toks);
	}
	free(lq);
	free(lf);
	rig_close(&q);
	rig_close(&f);
	return 1;
}

static void t_gguf_block_types(void)
{
	static const char *const types[] = { "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4" };
	static const char *const archs[] = { "mixtral", "qwen3_moe" };
	for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
		T_ASSERT(quant_pair(archs[t % 2], types[t], 0));
		printf("  %s (%s): the logits of its f32 values on %s\n", types[t], archs[t % 2],
		    rig_backend());
	}
	/* the super-block types of Q2_K, Q3_K_M and IQ4_XS files, on random
	 * models with rows of 256 (the fixtures' are 32 and 64) */
	static const char *const ktypes[] = { "q2_K", "q3_K", "iq4_xs" };
	static const char *const karchs[] = { "mixtral", "qwen3_moe", "olmoe" };
	for (size_t t = 0; t < 3; t++) {
		T_ASSERT(quant_pair(karchs[t], ktypes[t], 1));
		printf("  %s (random %s, rows of 256): the logits of its f32 values on %s\n", ktypes[t],
		    karchs[t], rig_backend());
	}
}

/* arena2's full synthetic models of each architecture, in the weight types
 * the host computes: config.json made by the arena reads back, every tensor
 * (q8_0 / f16 / bf16 dense and experts) runs, the logits are finite and
 * spread, and a second prefill gives the same bits. */
/* The MoE block routed on the device (a decode step with no host round
 * trip; on cuda also queued as one CUDA graph, BATON_CUDA_GRAPH=1 (the default), the first
 * step recorded and the others replayed) against the host path
 * (BATON_MODEL_HOST_ROUTE=1): the same bits
 * and the same cache hit counts, on every fixture architecture; the
 * prefill of 19 tokens takes the host path in both, unless large: then
 * (BATON_HOST_MOE_DEV_ROWS=16, the host backend) it routes on the device
 * as a large pass, the route of the cuda backend's bf16 prefill. */
static void device_route_same(const char *arch, int large)
{
	float *lg[2] = { NULL, NULL };
	uint64_t hits[2], passes[2], graphs[2], replays[2];
	uint32_t V = 0;
	for (int h = 0; h < 2; h++) {
		if (h)
			T_ASSERT(setenv("BATON_MODEL_HOST_ROUTE", "1", 1) == 0);
		else
			T_ASSERT(setenv("BATON_CUDA_GRAPH", "1", 1) == 0); /* cuda: graphs on */
		/* large: the host backend routes the prefill on the device too, as
		 * cuda does a bf16 prefill (moe_dev_rows) */
		if (large)
			T_ASSERT(setenv("BATON_HOST_MOE_DEV_ROWS", "16", 1) == 0);
		struct rig r;
		rig_open(&r, arch, 0);
		unsetenv("BATON_MODEL_HOST_ROUTE");
		unsetenv("BATON_CUDA_GRAPH");
		unsetenv("BATON_HOST_MOE_DEV_ROWS");
		V = model_config(r.m)->vocab;
		lg[h] = malloc((size_t)V * 9 * sizeof(float));
		T_ASSERT(lg[h]);
		size_t n;
		uint32_t *toks = ids_of(json_array_get(json_object_get(r.ref, "prompts"), 2), &n);
		T_ASSERT(n > 16); /* a prefill pass past the small device-routed passes */
		T_OK(model_prefill(r.m, toks, (uint32_t)n, lg[h]));
		for (uint32_t s = 1; s < 9; s++)
			T_OK(model_decode(r.m, argmax(lg[h] + (size_t)(s - 1) * V, V),
			    lg[h] + (size_t)s * V));
		struct baton_cache_stats st;
		cache_stats(engine_cache(r.e), &st);
		hits[h] = st.hits;
		passes[h] = model_device_route_passes(r.m);
		graphs[h] = model_graph_passes(r.m);
		replays[h] = model_graph_replays(r.m);
		free(toks);
		rig_close(&r);
	}
	/* the 8 decode steps, and the prefill where it routed there too */
	T_EQ_INT(passes[0], 8 + (large && strcmp(rig_backend(), "host") == 0));
	T_EQ_INT(passes[1], 0);
	/* on cuda with BATON_CUDA_GRAPH=1 the device-routed steps run as
	 * graphs: the same bits again */
	T_EQ_INT(graphs[0], strcmp(rig_backend(), "cuda") == 0 ? 8 : 0);
	T_EQ_INT(graphs[1], 0);
	/* the first decode step is recorded, the other 7 replay it (their
	 * keys stay within one chunk): checked on the host, not recorded */
	T_EQ_INT(replays[0], strcmp(rig_backend(), "cuda") == 0 ? 7 : 0);
	T_EQ_INT(replays[1], 0);
	T_ASSERT_MSG(memcmp(lg[0], lg[1], (size_t)V * 9 * sizeof(float)) == 0,
	    "%s: device routing changed the logits", arch);
	T_EQ_INT(hits[0], hits[1]);
	free(lg[0]);
	free(lg[1]);
}

static void t_device_route(void)
{
	for (int large = 0; large < 2; large++) {
		device_route_same("qwen3_moe", large);
		device_route_same("mixtral", large);
		device_route_same("olmoe", large);
		device_route_same("qwen2_moe", large);
	}
}

/* A decode that crosses a chunk of keys (256) with graphs on (cuda): the
 * steps replay the first one's recording, attention outgrowing its chunk
 * bucket makes one pass differ (refused, recorded anew), and every logit is
 * the same bit as without graphs. Elsewhere there is nothing to check. */
static void t_graph_buckets(void)
{
	if (strcmp(rig_backend(), "cuda") != 0)
		return;
	enum { P = 250, S = 20 }; /* decode positions 250 .. 269 */
	float *lg[2] = { NULL, NULL };
	uint64_t rep[2], gr[2];
	uint32_t V = 0;
	for (int h = 0; h < 2; h++) {
		/* graphs are on by default: off for the second run */
		T_ASSERT(setenv("BATON_CUDA_GRAPH", h == 0 ? "1" : "0", 1) == 0);
		struct rig r;
		rig_open(&r, "qwen3_moe", 0);
		unsetenv("BATON_CUDA_GRAPH");
		V = model_config(r.m)->vocab;
		lg[h] = malloc((size_t)V * (S + 1) * sizeof(float));
		uint32_t *toks = malloc(P * sizeof *toks);
		T_ASSERT(lg[h] && toks);
		for (uint32_t i = 0; i < P; i++)
			toks[i] = (i * 7919u + 13u) % V;
		T_OK(model_prefill(r.m, toks, P, lg[h]));
		for (uint32_t s = 1; s <= S; s++)
			T_OK(model_decode(r.m, argmax(lg[h] + (size_t)(s - 1) * V, V), lg[h] + (size_t)s * V));
		rep[h] = model_graph_replays(r.m);
		gr[h] = model_graph_passes(r.m);
		free(toks);
		rig_close(&r);
	}
	T_EQ_INT(gr[0], S);
	T_EQ_INT(rep[0], S - 2); /* recorded at 250 and again at 256 */
	T_EQ_INT(gr[1], 0);
	T_ASSERT_MSG(memcmp(lg[0], lg[1], (size_t)V * (S + 1) * sizeof(float)) == 0,
	    "graph replay changed the logits");
	free(lg[0]);
	free(lg[1]);
}

static void t_synthetic_archs(void)
{
	static const char *const archs[] = { "qwen3_moe", "mixtral", "olmoe", "qwen2_moe" };
	static const int dts[] = { BATON_DT_Q8_0, BATON_DT_F16, BATON_DT_BF16 };
	for (int i = 0; i < 4; i++)
		for (int d = 0; d < 3; d++) {
			char dir[64] = "/tmp/baton-model-XXXXXX", path[128], err[512] = "";
			T_ASSERT(mkdtemp(dir) != NULL);
			snprintf(path, sizeof path, "%s/s.arena", dir);
			struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC,
				.synth = { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 32,
					.dtype = (uint32_t)dts[d], .seed = 5, .arch = archs[i], .heads = 4,
					.kv_heads = 2, .head_dim = 16, .vocab = 96, .shared_ff = 64 } };
			int rc = arena_create(path, &src, NULL, NULL, err, sizeof err);
			T_ASSERT_MSG(rc == 0, "synthetic %s: %s", archs[i], err);
			struct baton_engine_config ec = { .name = archs[i], .arena_path = path,
				.backend = rig_backend(), .warm = 1 };
			struct baton_engine *e;
			struct baton_model *m;
			rc = engine_open(&ec, &e, err, sizeof err);
			T_ASSERT_MSG(rc == 0, "engine %s: %s", archs[i], err);
			rc = model_open(e, NULL, &m, err, sizeof err);
			T_ASSERT_MSG(rc == 0, "model %s %d: %s", archs[i], dts[d], err);
			T_EQ_STR(model_config(m)->arch->name, archs[i]);
			uint32_t toks[5] = { 1, 17, 42, 95, 3 }, V = model_config(m)->vocab;
			T_EQ_INT(V, 96);
			float a[96], b[96];
			T_OK(model_prefill(m, toks, 5, a));
			T_OK(model_decode(m, argmax(a, V), a));
			float lo = a[0], hi = a[0];
			for (uint32_t v = 0; v < V; v++) {
				T_ASSERT_MSG(isfinite(a[v]), "%s: logit %u is %g", archs[i], v, a[v]);
				lo = fminf(lo, a[v]);
				hi = fmaxf(hi, a[v]);
			}
			T_ASSERT_MSG(hi - lo > 1e-3f, "%s: flat logits", archs[i]);
			T_OK(model_prefill(m, toks, 5, b));
			T_OK(model_decode(m, argmax(b, V), b));
			T_ASSERT(memcmp(a, b, sizeof a) == 0);
			model_close(m);
			engine_close(e);
			unlink(path);
			snprintf(path, sizeof path, "%s/s.arena.lock", dir);
			unlink(path);
			rmdir(dir);
		}
}


/* The cuda backend's tensor-core path (bf16 GEMMs through cuBLAS, docs/internals/cuda-ops.md)
 * forced onto every pass (BATON_CUDA_GEMM_ROWS=1; by default it takes
 * passes of 64 rows and more, larger than these prompts): against
 * transformers within TC_TOL of the logit scale, the last token's top-1
 * transformers' wherever its margin over the second exceeds twice that, the
 * decode steps' logits (fed transformers' greedy tokens) within TC_TOL, and
 * the same bits when run again. mixtral_f16's weights are f16 (every
 * projection and expert on the tensor cores); qwen3_moe's are f32, which
 * stay on the exact kernels, so there attention alone takes the path. */
#define TC_TOL 3e-2

static double rel_diff(const float *got, json_t *ref, uint32_t vocab, double *margin, uint32_t *top)
{
	double md = 0, mr = 1, b1 = -INFINITY, b2 = -INFINITY;
	*top = 0;
	for (uint32_t i = 0; i < vocab; i++) {
		double r = json_number_value(json_array_get(ref, i));
		md = fmax(md, fabs(got[i] - r));
		mr = fmax(mr, fabs(r));
		if (r > b1) {
			b2 = b1, b1 = r, *top = i;
		} else if (r > b2) {
			b2 = r;
		}
	}
	*margin = (b1 - b2) / mr;
	return md / mr;
}

static void t_tensor_path(void)
{
	if (strcmp(rig_backend(), "cuda") != 0) {
		printf("  skip: the tensor-core path is the cuda backend's (BATON_MODEL_BACKEND=cuda)\n");
		return;
	}
	static const char *const archs[] = { "mixtral_f16", "qwen3_moe" };
	for (int i = 0; i < 2; i++) {
		T_ASSERT(setenv("BATON_CUDA_GEMM_ROWS", "1", 1) == 0);
		struct rig r;
		rig_open(&r, archs[i], 0);
		uint32_t V = model_config(r.m)->vocab;
		float *lg = malloc(V * 4), *l2 = malloc(V * 4);
		T_ASSERT(lg && l2);
		json_t *prompts = json_object_get(r.ref, "prompts");
		double worst = 0;
		for (size_t p = 0; p < json_array_size(prompts); p++) {
			size_t n, ng;
			uint32_t *toks = ids_of(json_array_get(prompts, p), &n), top;
			uint32_t *greedy = ids_of(json_array_get(json_object_get(r.ref, "greedy"), p), &ng);
			double margin;
			T_OK(model_prefill(r.m, toks, (uint32_t)n, lg));
			double d = rel_diff(lg, json_array_get(json_object_get(r.ref, "last_logits"), p), V,
			    &margin, &top);
			T_ASSERT_MSG(d <= TC_TOL, "%s prompt %zu: %.3g of the logit scale (> %g)", archs[i], p,
			    d, TC_TOL);
			if (margin > 2 * TC_TOL)
				T_ASSERT_MSG(argmax(lg, V) == top, "%s prompt %zu: top-1 %u, transformers %u",
				    archs[i], p, argmax(lg, V), top);
			worst = fmax(worst, d);
			for (uint32_t s = 1; p == 0 && s < 9; s++) {
				T_OK(model_decode(r.m, greedy[s - 1], lg));
				d = rel_diff(lg, json_array_get(json_object_get(r.ref, "step_logits"), s), V,
				    &margin, &top);
				T_ASSERT_MSG(d <= TC_TOL, "%s step %u: %.3g of the logit scale", archs[i], s, d);
				worst = fmax(worst, d);
			}
			/* deterministic: the same prefill, the same bits */
			T_OK(model_prefill(r.m, toks, (uint32_t)n, lg));
			T_OK(model_prefill(r.m, toks, (uint32_t)n, l2));
			T_ASSERT_MSG(memcmp(lg, l2, V * 4) == 0, "%s prompt %zu: two runs differ", archs[i], p);
			free(toks);
			free(greedy);
		}
		printf("  %s on the tensor cores: worst logit difference %.3g of the logit scale\n",
		    archs[i], worst);
		unsetenv("BATON_CUDA_GEMM_ROWS");
		free(lg), free(l2);
		rig_close(&r);
	}
}

/* model_warm: one pass in a sequence of its own, and then everything as
 * it was: the pool whole, nothing cached, and a prompt's logits the bits
 * of a model that was not warmed (on the test's backend, forced). */
static void t_warm(void)
{
	struct rig a, b;
	rig_open(&a, "qwen3_moe", 0);
	rig_open(&b, "qwen3_moe", 0);
	const uint32_t V = model_config(a.m)->vocab, free0 = model_kv_free_blocks(a.m);
	const uint64_t p0 = model_passes(a.m);
	T_OK(model_warm(a.m, 1u << 20, 1)); /* at most max_batch, max_ctx and the pool */
	T_EQ_INT(model_passes(a.m), p0 + 1);
	T_EQ_INT(model_kv_free_blocks(a.m), free0);
	struct baton_prefix_stats ps;
	model_prefix_stats(a.m, &ps);
	T_EQ_INT(ps.cached_blocks, 0);
	T_OK(model_warm(b.m, 1, 1)); /* too few rows: nothing */
	T_EQ_INT(model_passes(b.m), 0);
	size_t n;
	uint32_t *toks = ids_of(json_array_get(json_object_get(a.ref, "prompts"), 0), &n);
	float *la = malloc(V * 4), *lb = malloc(V * 4);
	T_ASSERT(la && lb);
	T_OK(model_prefill(a.m, toks, (uint32_t)n, la));
	T_OK(model_prefill(b.m, toks, (uint32_t)n, lb));
	T_ASSERT_MSG(memcmp(la, lb, V * 4) == 0, "a warmed model's logits differ");
	T_OK(model_release(a.m)); /* released: no pass (it would refill) */
	const uint64_t p1 = model_passes(a.m);
	T_OK(model_warm(a.m, 64, 1));
	T_EQ_INT(model_passes(a.m), p1);
	T_ASSERT(model_released(a.m));
	free(la), free(lb), free(toks);
	rig_close(&a);
	rig_close(&b);
}

T_MAIN(T_CASE(t_warm), T_CASE(t_config_fixtures), T_CASE(t_device_route), T_CASE(t_graph_buckets), T_CASE(t_config_refusals),
    T_CASE(t_rope_yarn), T_CASE(t_config_tolerant), T_CASE_TIMEOUT(t_rope_yarn_forward, 120),
    T_CASE_TIMEOUT(t_qwen3_moe, 120), T_CASE_TIMEOUT(t_mixtral, 120),
    T_CASE_TIMEOUT(t_mixtral_f16, 120), T_CASE_TIMEOUT(t_olmoe, 120), T_CASE_TIMEOUT(t_qwen2_moe, 120),
    T_CASE_TIMEOUT(t_batches_and_release, 120), T_CASE_TIMEOUT(t_gguf_same_logits, 240),
    T_CASE_TIMEOUT(t_gguf_block_types, 240),
    T_CASE_TIMEOUT(t_synthetic_archs, 120), T_CASE_TIMEOUT(t_tensor_path, 120))
