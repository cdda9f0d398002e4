/*
 * generate_test.c: text in, text out, against transformers.
 *
 * models/ holds the two trained demo models (kjv-qwen3-moe, kjv-mixtral)
 * and samples.json: what transformers answered with each (greedy, 48 new
 * tokens, f32 arithmetic on the bf16 weights) to five chat questions
 * rendered by the model's own template, with the prompt's token ids. Each
 * case makes an arena from the folder, opens an engine and a generator on
 * the host backend and checks, per question: the prompt's ids (template +
 * tokenizer), the answer's ids (model + greedy sampling), and the answer's
 * text (streaming decode) equal to transformers'. Also: stop strings cut
 * the text and never leak through the stream; a callback can cancel; bad
 * requests are refused; an experts-only arena has no generator.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/model_fixture.h"
#include "tests/t.h"

/* The trained model `model` of models/ with its generator; r->ref holds
 * models/samples.json. */
static void rig_open(struct rig *r, const char *model)
{
	rig_engine(r, rig_models(), model, model);
	rig_generator(r, NULL);
	rig_ref(r, rig_models(), "samples.json");
}

struct stream {
	char buf[8192];
	size_t len;
	int pieces, cancel_after;
};

static int on_text(void *arg, const char *s, size_t n)
{
	struct stream *st = arg;
	T_ASSERT(st->len + n < sizeof st->buf);
	memcpy(st->buf + st->len, s, n);
	st->len += n;
	st->buf[st->len] = 0;
	return st->cancel_after && ++st->pieces >= st->cancel_after;
}

static struct baton_gen_request greedy(const struct text_msg *m, size_t n, uint32_t max_tokens)
{
	struct baton_gen_request q = { .msgs = m, .n_msgs = n, .enable_thinking = -1 };
	q.sp = baton_sample_defaults();
	q.sp.temperature = 0;
	q.sp.max_tokens = max_tokens;
	return q;
}

/* Each reference answer of `key` in samples.json, token for token. */
static void check_samples(const char *model, const char *key)
{
	struct rig r;
	rig_open(&r, model);
	json_t *list = json_object_get(json_object_get(r.ref, "samples"), key);
	T_ASSERT_MSG(json_array_size(list) == 5, "samples.json: no %s", key);
	size_t i;
	json_t *s;
	int same_text = 0;
	json_array_foreach(list, i, s) {
		json_t *msg = json_array_get(json_object_get(s, "messages"), 0);
		struct text_msg m = { .role = json_string_value(json_object_get(msg, "role")),
			.content = json_string_value(json_object_get(msg, "content")) };
		struct baton_gen_request q = greedy(&m, 1, 48);
		json_t *th = json_object_get(json_object_get(s, "template_kwargs"), "enable_thinking");
		if (json_is_boolean(th))
			q.enable_thinking = json_is_true(th);
		struct stream st = { .len = 0 };
		q.on_text = on_text;
		q.arg = &st;
		struct baton_gen_result res;
		char err[512] = "";
		int rc = generator_run(r.g, &q, &res, err, sizeof err);
		T_ASSERT_MSG(rc == 0, "%s: %s", m.content, err);
		json_t *pids = json_object_get(s, "prompt_ids"), *gids = json_object_get(s, "greedy_ids");
		T_ASSERT_MSG(res.n_prompt == json_array_size(pids), "%s %s: prompt has %u tokens, transformers %zu",
		    model, m.content, res.n_prompt, json_array_size(pids));
		size_t want_n = json_array_size(gids);
		for (size_t k = 0; k < want_n && k < res.n_tokens; k++)
			T_ASSERT_MSG(res.tokens[k] == (uint32_t)json_integer_value(json_array_get(gids, k)),
			    "%s '%s': token %zu is %u, transformers %lld (text so far: %s)", model, m.content, k,
			    res.tokens[k], (long long)json_integer_value(json_array_get(gids, k)), res.text);
		T_ASSERT_MSG(res.n_tokens == want_n, "%s '%s': %u tokens, transformers %zu", model, m.content,
		    res.n_tokens, want_n);
		const char *want = json_string_value(json_object_get(s, "text"));
		/* transformers' text skips special tokens; so does ours */
		T_ASSERT_MSG(strcmp(res.text, want) == 0, "%s: text\n  got  '%s'\n  want '%s'", model, res.text, want);
		T_ASSERT_MSG(st.len == res.text_len && memcmp(st.buf, res.text, st.len) == 0,
		    "the streamed text differs from the answer's");
		same_text++;
		printf("  %s: %s -> %s [%s, %u+%u tokens, prefill %.1f ms, %.0f tok/s]\n", model, m.content,
		    res.text, res.finish, res.n_prompt, res.n_tokens, res.prefill_s * 1e3,
		    res.decode_s > 0 ? res.n_tokens / res.decode_s : 0.0);
		generator_result_free(&res);
	}
	T_EQ_INT(same_text, 5);
	rig_close(&r);
}

static void t_qwen3_moe_answers(void) { check_samples("kjv-qwen3-moe", "kjv-qwen3-moe"); }
static void t_qwen3_moe_no_thinking(void) { check_samples("kjv-qwen3-moe", "kjv-qwen3-moe/no-thinking"); }
static void t_mixtral_answers(void) { check_samples("kjv-mixtral", "kjv-mixtral"); }

/* A stop string ends the answer before it; the stream never shows any of
 * it, even when it arrives split across tokens. */
static void t_stop_strings(void)
{
	struct rig r;
	rig_open(&r, "kjv-mixtral");
	struct text_msg m = { .role = "user", .content = "Continue: And the LORD spake unto Moses" };
	struct baton_gen_request q = greedy(&m, 1, 48);
	struct baton_gen_result full, cut;
	char err[512] = "";
	T_ASSERT_MSG(generator_run(r.g, &q, &full, err, sizeof err) == 0, "%s", err);
	const char *at = strstr(full.text, "Aaron");
	T_ASSERT_MSG(at, "the reference answer changed: %s", full.text);
	const char *stop[] = { "zzz-never", "Aar" };
	q.stop = stop;
	q.n_stop = 2;
	struct stream st = { .len = 0 };
	q.on_text = on_text;
	q.arg = &st;
	T_ASSERT_MSG(generator_run(r.g, &q, &cut, err, sizeof err) == 0, "%s", err);
	T_EQ_INT(cut.text_len, (size_t)(at - full.text));
	T_ASSERT(memcmp(cut.text, full.text, cut.text_len) == 0);
	T_ASSERT(strcmp(cut.finish, "stop") == 0);
	T_ASSERT_MSG(st.len == cut.text_len && memcmp(st.buf, cut.text, st.len) == 0, "stream: '%s'", st.buf);
	T_ASSERT(strstr(st.buf, "Aa") == NULL);
	generator_result_free(&full);
	generator_result_free(&cut);

	/* max_tokens ends it with "length"; a callback can cancel */
	q = greedy(&m, 1, 3);
	T_ASSERT(generator_run(r.g, &q, &cut, err, sizeof err) == 0);
	T_EQ_INT(cut.n_tokens, 3);
	T_ASSERT(strcmp(cut.finish, "length") == 0);
	generator_result_free(&cut);
	q = greedy(&m, 1, 40);
	struct stream st2 = { .len = 0, .cancel_after = 2 };
	q.on_text = on_text;
	q.arg = &st2;
	T_ASSERT(generator_run(r.g, &q, &cut, err, sizeof err) == 0);
	T_ASSERT(strcmp(cut.finish, "cancelled") == 0);
	T_ASSERT(cut.n_tokens < 40);
	generator_result_free(&cut);
	rig_close(&r);
}

/* generation_config.json as published files hold it, read by base.h's
 * policy: eos_token_id a list of integral reals, an integer past 64 bits
 * beside it. The model's third greedy token made an eos id there stops the
 * answer at it: the list was read. */
static void t_generation_config_as_published(void)
{
	struct rig r;
	rig_open(&r, "kjv-mixtral");
	struct text_msg m = { .role = "user", .content = "Continue: And the LORD spake unto Moses" };
	struct baton_gen_request q = greedy(&m, 1, 12);
	struct baton_gen_result full, cut;
	char err[512] = "", cmd[1024], path[600];
	T_ASSERT_MSG(generator_run(r.g, &q, &full, err, sizeof err) == 0, "%s", err);
	T_ASSERT_MSG(full.n_tokens >= 4, "%u tokens (%s): %s", full.n_tokens, full.finish, full.text);
	uint32_t third = full.tokens[2];
	T_ASSERT(third != 2 && full.tokens[0] != third && full.tokens[1] != third);
	rig_close(&r);

	char dir[] = "/tmp/baton-genconf-XXXXXX";
	T_ASSERT(mkdtemp(dir) != NULL);
	snprintf(cmd, sizeof cmd, "cp -r %s/kjv-mixtral %s/m", rig_models(), dir);
	T_ASSERT(system(cmd) == 0);
	snprintf(path, sizeof path, "%s/m/generation_config.json", dir);
	FILE *f = fopen(path, "w");
	T_ASSERT(f);
	fprintf(f, "{\"bos_token_id\": 1.0, \"eos_token_id\": [%u.0, 2.0], \"max_length\": "
	    "1000000000000000019884624838656, \"transformers_version\": \"5.17.0\"}", third);
	T_ASSERT(fclose(f) == 0);
	rig_engine(&r, dir, "m", "m");
	rig_generator(&r, NULL);
	T_ASSERT_MSG(generator_run(r.g, &q, &cut, err, sizeof err) == 0, "%s", err);
	T_EQ_INT(cut.n_tokens, 3);
	T_EQ_INT(cut.tokens[2], third);
	T_ASSERT(strcmp(cut.finish, "stop") == 0);
	generator_result_free(&full);
	generator_result_free(&cut);
	rig_close(&r);
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	T_ASSERT(system(cmd) == 0);
}

/* A raw prompt gets the tokenizer's BOS; sampling with a seed repeats. */
static void t_prompt_and_seed(void)
{
	struct rig r;
	rig_open(&r, "kjv-mixtral");
	struct baton_gen_request q = { .prompt = "In the beginning", .prompt_len = 16, .enable_thinking = -1 };
	q.sp = baton_sample_defaults();
	q.sp.temperature = 0.8f;
	q.sp.top_p = 0.9f;
	q.sp.seed = 42;
	q.sp.max_tokens = 24;
	struct baton_gen_result a, b;
	char err[512] = "";
	T_ASSERT_MSG(generator_run(r.g, &q, &a, err, sizeof err) == 0, "%s", err);
	T_ASSERT_MSG(generator_run(r.g, &q, &b, err, sizeof err) == 0, "%s", err);
	T_ASSERT(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, a.n_tokens * 4) == 0);
	T_ASSERT(strcmp(a.text, b.text) == 0);
	T_ASSERT(a.n_prompt >= 2); /* BOS and the words */
	printf("  seed 42: In the beginning%s\n", a.text);
	generator_result_free(&a);
	generator_result_free(&b);
	rig_close(&r);
}

static void t_bad_requests(void)
{
	struct rig r;
	rig_open(&r, "kjv-qwen3-moe");
	struct baton_gen_result res;
	char err[512] = "";
	struct text_msg m = { .role = "user", .content = "hi" };
	struct baton_gen_request q = greedy(&m, 1, 4);
	q.prompt = "both";
	q.prompt_len = 4;
	T_EQ_INT(generator_run(r.g, &q, &res, err, sizeof err), BATON_EINVAL);
	T_ASSERT(strstr(err, "exactly one"));
	q = greedy(&m, 0, 4);
	T_EQ_INT(generator_run(r.g, &q, &res, err, sizeof err), BATON_EINVAL);
	const char *empty[] = { "" };
	q = greedy(&m, 1, 4);
	q.stop = empty;
	q.n_stop = 1;
	T_EQ_INT(generator_run(r.g, &q, &res, err, sizeof err), BATON_EINVAL);
	q = greedy(&m, 1, 4);
	q.sp.temperature = -1;
	T_EQ_INT(generator_run(r.g, &q, &res, err, sizeof err), BATON_EINVAL);
	T_ASSERT_MSG(strstr(err, "temperature"), "%s", err);
	struct baton_gen_request p = { .prompt = "\xff\xfe", .prompt_len = 2, .enable_thinking = -1 };
	p.sp = baton_sample_defaults();
	T_EQ_INT(generator_run(r.g, &p, &res, err, sizeof err), BATON_EINVAL);
	/* still works after all that */
	q = greedy(&m, 1, 4);
	T_ASSERT_MSG(generator_run(r.g, &q, &res, err, sizeof err) == 0, "%s", err);
	generator_result_free(&res);
	rig_close(&r);
}

static void t_experts_only_refused(void)
{
	char dir[] = "/tmp/baton-gen-XXXXXX", path[128], err[512] = "";
	T_ASSERT(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/s.arena", dir);
	struct baton_arena_source s = { .kind = BATON_ARENA_SRC_SYNTHETIC,
		.synth = { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_F32, .seed = 1 } };
	T_ASSERT_MSG(arena_create(path, &s, NULL, NULL, err, sizeof err) == 0, "%s", err);
	struct baton_engine *e;
	struct baton_engine_config ec = { .name = "s", .arena_path = path, .backend = "host", .warm = 1 };
	T_ASSERT_MSG(engine_open(&ec, &e, err, sizeof err) == 0, "%s", err);
	struct baton_generator *g = NULL;
	T_EQ_INT(generator_open(e, NULL, &g, err, sizeof err), BATON_EUNSUPPORTED);
	T_ASSERT(g == NULL);
	T_ASSERT_MSG(strstr(err, "experts only"), "%s", err);
	engine_close(e);
	unlink(path);
	snprintf(path, sizeof path, "%s/s.arena.lock", dir);
	unlink(path);
	rmdir(dir);
}

static void copy_file(const char *from, const char *to, const char *find, const char *repl)
{
	FILE *f = fopen(from, "rb");
	T_ASSERT_MSG(f, "%s", from);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)n + 1);
	T_ASSERT(b && fread(b, 1, (size_t)n, f) == (size_t)n);
	b[n] = 0;
	fclose(f);
	FILE *o = fopen(to, "wb");
	T_ASSERT(o);
	char *at = find ? strstr(b, find) : NULL;
	if (find)
		T_ASSERT_MSG(at, "%s lacks %s", from, find);
	if (at) {
		fwrite(b, 1, (size_t)(at - b), o);
		fputs(repl, o);
		fputs(at + strlen(find), o);
	} else {
		fwrite(b, 1, (size_t)n, o);
	}
	fclose(o);
	free(b);
}

/* think_open: the generator says when the rendered prompt ends inside a
 * <think> (as DeepSeek-R1's and Qwen3-thinking-2507's templates write
 * it), so the API splits the answer's first part out as reasoning. The
 * demo model's folder is copied with its template's generation prompt
 * made so; the demo model's own template does not. */
static void t_think_open(void)
{
	char dir[64] = "/tmp/baton-think-XXXXXX", src[512], dst[512];
	T_ASSERT(mkdtemp(dir) != NULL);
	char mdir[128];
	snprintf(mdir, sizeof mdir, "%s/m", dir);
	T_ASSERT(mkdir(mdir, 0700) == 0);
	static const char *const files[] = { "config.json", "generation_config.json", "model.safetensors",
		"tokenizer.json", "tokenizer_config.json", "chat_template.jinja" };
	for (size_t i = 0; i < 6; i++) {
		snprintf(src, sizeof src, "%s/kjv-qwen3-moe/%s", rig_models(), files[i]);
		snprintf(dst, sizeof dst, "%s/%s", mdir, files[i]);
		int tmpl = i == 5;
		copy_file(src, dst, tmpl ? "{{- '<|im_start|>assistant\\n' }}" : NULL,
		    "{{- '<|im_start|>assistant\\n<think>\\n' }}");
	}
	for (int pass = 0; pass < 2; pass++) {
		struct rig r;
		rig_engine(&r, pass ? rig_models() : dir, pass ? "kjv-qwen3-moe" : "m", "t");
		rig_generator(&r, NULL);
		struct text_msg m = { .role = "user", .content = "Who was Moses?" };
		int open = -1;
		struct baton_gen_request q = greedy(&m, 1, 2);
		q.think_open = &open;
		struct baton_gen_result res;
		char err[256];
		T_OK(generator_run(r.g, &q, &res, err, sizeof err));
		T_EQ_INT(open, pass ? 0 : 1);
		generator_result_free(&res);
		rig_close(&r);
	}
	for (size_t i = 0; i < 6; i++) {
		snprintf(dst, sizeof dst, "%s/%s", mdir, files[i]);
		unlink(dst);
	}
	rmdir(mdir);
	rmdir(dir);
}

T_MAIN(T_CASE_TIMEOUT(t_think_open, 120), T_CASE_TIMEOUT(t_qwen3_moe_answers, 120), T_CASE_TIMEOUT(t_qwen3_moe_no_thinking, 120),
    T_CASE_TIMEOUT(t_mixtral_answers, 120), T_CASE_TIMEOUT(t_stop_strings, 120),
    T_CASE_TIMEOUT(t_prompt_and_seed, 60), T_CASE_TIMEOUT(t_bad_requests, 60),
    T_CASE(t_experts_only_refused), T_CASE_TIMEOUT(t_generation_config_as_published, 120))
