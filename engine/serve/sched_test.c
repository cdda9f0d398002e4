/*
 * sched_test.c: continuous batching (sched.h) on a trained demo model
 * (models/kjv-qwen3-moe) and the host backend. Requests submitted together
 * share steps and each gets exactly the answer generator_run gives it
 * alone (greedy, and sampled with seeds); a full queue answers EBUSY; a
 * cancelled request frees its KV blocks at once; a pool that holds one
 * request at a time serves them in turn; a request larger than the pool
 * is refused; while may_admit says no, nothing new starts and the engine
 * is handed back (end) between bursts.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/model_fixture.h"
#include "engine/serve/sched.h"
#include "text/text.h"
#include "tests/t.h"

/* models/kjv-qwen3-moe with its generator. */
static void rig_open(struct rig *r, uint32_t ctx, uint32_t kv_blocks)
{
	rig_engine(r, rig_models(), "kjv-qwen3-moe", "t");
	struct baton_model_opts mo = { .max_ctx = ctx, .kv_blocks = kv_blocks };
	rig_generator(r, &mo);
}

/* One request's side: what it heard. */
struct call {
	struct baton_gen_request q;
	struct text_msg msg;
	char text[4096];
	size_t len;
	int pieces, cancel_at;           /* on_text returns 1 at this piece */
	struct baton_sched *s;
	uint64_t id;
	int cancel_id_at;                /* sched_cancel at this piece */
	atomic_int done;
	int rc;
	char err[400];
	struct baton_gen_result res;
};

static int c_text(void *arg, const char *t, size_t n)
{
	struct call *c = arg;
	T_ASSERT(c->len + n < sizeof c->text);
	memcpy(c->text + c->len, t, n);
	c->len += n;
	c->pieces++;
	if (c->cancel_id_at && c->pieces == c->cancel_id_at)
		sched_cancel(c->s, c->id);
	return c->cancel_at && c->pieces >= c->cancel_at;
}

static void c_done(void *arg, int rc, const char *err, struct baton_gen_result *res)
{
	struct call *c = arg;
	c->rc = rc;
	snprintf(c->err, sizeof c->err, "%s", err ? err : "");
	if (res)
		c->res = *res;
	atomic_store(&c->done, 1);
}

static const char *const questions[] = {
	"Tell me of light.", "Who was Moses?", "What is love?", "Speak of the sea.",
	"Who built the ark?", "What did David sing?",
};

static void make_call(struct call *c, int i, float temperature, uint32_t max_tokens)
{
	memset(c, 0, sizeof *c);
	c->msg = (struct text_msg){ .role = "user", .content = questions[i % 6] };
	c->q = (struct baton_gen_request){ .msgs = &c->msg, .n_msgs = 1, .enable_thinking = -1 };
	c->q.sp = baton_sample_defaults();
	c->q.sp.temperature = temperature;
	c->q.sp.top_p = 0.95f;
	c->q.sp.seed = 1000 + (uint64_t)i;
	c->q.sp.max_tokens = max_tokens;
	c->q.on_text = c_text;
	c->q.arg = c;
}

static void wait_done(struct call *c)
{
	for (int i = 0; i < 20000 && !atomic_load(&c->done); i++)
		usleep(1000);
	T_ASSERT_MSG(atomic_load(&c->done), "no answer in 20 s");
}

static void submit(struct baton_sched *s, struct call *c)
{
	struct sched_cb cb = { .on_text = c_text, .on_done = c_done, .arg = c };
	c->s = s;
	T_EQ_INT(sched_submit(s, &c->q, &cb, &c->id), 0);
}

/* The hooks count their calls; begin can be held shut. */
static struct {
	atomic_int begins, ends, gate_shut, may;
} hk;

static int h_begin(void *arg, char *err, size_t n)
{
	(void)arg, (void)err, (void)n;
	while (atomic_load(&hk.gate_shut))
		usleep(1000);
	atomic_fetch_add(&hk.begins, 1);
	return 0;
}

static void h_end(void *arg)
{
	(void)arg;
	atomic_fetch_add(&hk.ends, 1);
}

static int h_may(void *arg)
{
	(void)arg;
	return atomic_load(&hk.may);
}

static const struct sched_hooks hooks = { .begin = h_begin, .end = h_end, .may_admit = h_may };

#define N 6

/* Six requests at once (greedy and sampled) equal each alone. */
static void t_batched_equals_alone(void)
{
	struct rig r;
	rig_open(&r, 256, 0 /* one sequence's worth: 16 blocks */);
	static struct call alone[N], batch[N];
	char err[512];
	for (int i = 0; i < N; i++) {
		make_call(&alone[i], i, i % 2 ? 0.9f : 0.0f, 24);
		alone[i].q.on_text = NULL;
		T_ASSERT_MSG(generator_run(r.g, &alone[i].q, &alone[i].res, err, sizeof err) == 0, "%s", err);
	}
	rig_close(&r);
	/* a pool for all six at once */
	rig_open(&r, 256, 6 * 16);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 8, .chunk = 7 /* prompts split over steps */ };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	atomic_store(&hk.gate_shut, 1); /* all six wait, then start together */
	for (int i = 0; i < N; i++) {
		make_call(&batch[i], i, i % 2 ? 0.9f : 0.0f, 24);
		submit(s, &batch[i]);
	}
	atomic_store(&hk.gate_shut, 0);
	for (int i = 0; i < N; i++) {
		wait_done(&batch[i]);
		T_ASSERT_MSG(batch[i].rc == 0, "request %d: %s", i, batch[i].err);
		struct baton_gen_result *a = &alone[i].res, *b = &batch[i].res;
		T_ASSERT_MSG(a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * 4) == 0,
		    "request %d: %u tokens batched, %u alone", i, b->n_tokens, a->n_tokens);
		T_ASSERT(strcmp(a->text, b->text) == 0 && strcmp(a->finish, b->finish) == 0);
		T_ASSERT(b->n_prompt == a->n_prompt);
		/* the stream carried exactly the text */
		T_ASSERT(batch[i].len == b->text_len && memcmp(batch[i].text, b->text, b->text_len) == 0);
		printf("  %d: %s\n", i, b->text);
	}
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.admitted, N);
	T_EQ_INT(st.finished, N);
	/* shared steps: far fewer than six requests' steps one after another */
	uint64_t alone_steps = 0;
	for (int i = 0; i < N; i++)
		alone_steps += alone[i].res.n_tokens + 2;
	T_ASSERT_MSG(st.steps < alone_steps / 2, "%llu steps for %llu alone", (unsigned long long)st.steps,
	    (unsigned long long)alone_steps);
	for (int i = 0; i < 200; i++) {
		sched_stats(s, &st);
		if (!st.held)
			break;
		usleep(1000);
	}
	T_EQ_INT(st.kv_free, st.kv_total);
	T_EQ_INT(st.held, 0);
	T_ASSERT(atomic_load(&hk.begins) >= 1 && atomic_load(&hk.ends) == atomic_load(&hk.begins));
	sched_close(s);
	for (int i = 0; i < N; i++) {
		generator_result_free(&alone[i].res);
		generator_result_free(&batch[i].res);
	}
	rig_close(&r);
}

/* The same six with BATON_SCHED_SAMPLERS=4: the tokens picked on the
 * pool's threads, taken in order on the scheduler's: each equals it alone
 * again, text and stream too. */
static void t_batched_samplers(void)
{
	T_ASSERT(setenv("BATON_SCHED_SAMPLERS", "4", 1) == 0);
	t_batched_equals_alone();
	unsetenv("BATON_SCHED_SAMPLERS");
}

/* The queue holds max_queue; one more is EBUSY; all are served later. */
static void t_queue_full(void)
{
	struct rig r;
	rig_open(&r, 128, 0);
	atomic_store(&hk.may, 1);
	atomic_store(&hk.gate_shut, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 2, .max_queue = 3 };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	static struct call c[4];
	for (int i = 0; i < 3; i++) {
		make_call(&c[i], i, 0, 4);
		submit(s, &c[i]);
	}
	make_call(&c[3], 3, 0, 4);
	struct sched_cb cb = { .on_text = c_text, .on_done = c_done, .arg = &c[3] };
	T_EQ_INT(sched_submit(s, &c[3].q, &cb, NULL), BATON_EBUSY);
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.waiting, 3);
	T_EQ_INT(st.refused_busy, 1);
	atomic_store(&hk.gate_shut, 0);
	for (int i = 0; i < 3; i++) {
		wait_done(&c[i]);
		T_ASSERT_MSG(c[i].rc == 0, "%s", c[i].err);
		generator_result_free(&c[i].res);
	}
	T_ASSERT(!atomic_load(&c[3].done));
	sched_close(s);
	rig_close(&r);
}

/* sched_submit_many: all or none. With room for one, two at once are
 * refused whole (none queued, no on_done); then one at once is taken. */
static void t_submit_many_all_or_none(void)
{
	struct rig r;
	rig_open(&r, 128, 0);
	atomic_store(&hk.may, 1);
	atomic_store(&hk.gate_shut, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 2, .max_queue = 3 };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	static struct call c[4];
	for (int i = 0; i < 2; i++) {
		make_call(&c[i], i, 0, 4);
		submit(s, &c[i]);
	}
	const struct baton_gen_request *reqs[2];
	struct sched_cb cbs[2];
	uint64_t ids[2];
	uint64_t first = sched_new_ids(s, 2);
	for (int i = 0; i < 2; i++) {
		make_call(&c[2 + i], 2 + i, 0, 4);
		reqs[i] = &c[2 + i].q;
		cbs[i] = (struct sched_cb){ .on_text = c_text, .on_done = c_done, .arg = &c[2 + i] };
		ids[i] = first + (uint64_t)i;
	}
	T_EQ_INT(sched_submit_many(s, reqs, cbs, ids, 2), BATON_EBUSY);
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.waiting, 2);
	T_EQ_INT(st.refused_busy, 2);
	T_EQ_INT(sched_submit_many(s, reqs, cbs, ids, 1), 0);
	sched_stats(s, &st);
	T_EQ_INT(st.waiting, 3);
	atomic_store(&hk.gate_shut, 0);
	for (int i = 0; i < 3; i++) {
		wait_done(&c[i]);
		T_ASSERT_MSG(c[i].rc == 0, "%s", c[i].err);
		generator_result_free(&c[i].res);
	}
	T_ASSERT(!atomic_load(&c[3].done));
	sched_close(s);
	rig_close(&r);
}

/* A client gone mid-stream: its blocks are free at once, others go on. */
static void t_cancel_frees_blocks(void)
{
	struct rig r;
	rig_open(&r, 256, 32);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	T_EQ_INT(sched_open(r.g, NULL, &hooks, &s), 0);
	static struct call a, b, w;
	make_call(&a, 0, 0, 200);
	a.cancel_id_at = 3;            /* sched_cancel, as a server's on_gone does */
	make_call(&b, 1, 0, 200);
	b.cancel_at = 2;               /* on_text says stop */
	submit(s, &a);
	submit(s, &b);
	wait_done(&a);
	wait_done(&b);
	T_ASSERT_MSG(a.rc == 0 && strcmp(a.res.finish, "cancelled") == 0, "%d %s", a.rc, a.err);
	T_ASSERT_MSG(b.rc == 0 && strcmp(b.res.finish, "cancelled") == 0, "%d %s", b.rc, b.err);
	T_ASSERT(a.res.n_tokens < 200 && b.res.n_tokens < 200);
	/* on_done comes after the blocks went back, and the stats say so */
	T_EQ_INT(model_kv_free_blocks(generator_model(r.g)), 32);
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.kv_free, 32);
	/* a waiting request cancelled: ECLOSED, never run (the engine handed
	 * back first, so that the gate holds it) */
	for (int i = 0; i < 2000; i++) {
		sched_stats(s, &st);
		if (!st.held)
			break;
		usleep(1000);
	}
	T_EQ_INT(st.held, 0);
	atomic_store(&hk.gate_shut, 1);
	make_call(&w, 2, 0, 8);
	submit(s, &w);
	sched_cancel(s, w.id);
	sched_cancel(s, 12345); /* unknown: ignored */
	atomic_store(&hk.gate_shut, 0);
	wait_done(&w);
	T_EQ_INT(w.rc, BATON_ECLOSED);
	sched_stats(s, &st);
	T_EQ_INT(st.cancelled, 3); /* a and w by sched_cancel, b through on_text */
	generator_result_free(&a.res);
	generator_result_free(&b.res);
	sched_close(s);
	rig_close(&r);
}

/* A pool that holds one request: they run in turn, each still right;
 * one that could never fit is refused. */
static void t_small_pool(void)
{
	struct rig r;
	rig_open(&r, 256, 4 /* 64 positions */);
	atomic_store(&hk.may, 1);
	static struct call c[3], alone[3], big;
	char err[512];
	for (int i = 0; i < 3; i++) {
		make_call(&alone[i], i, 0.7f, 30);
		alone[i].q.on_text = NULL;
		T_ASSERT_MSG(generator_run(r.g, &alone[i].q, &alone[i].res, err, sizeof err) == 0, "%s", err);
	}
	struct baton_sched *s;
	T_EQ_INT(sched_open(r.g, NULL, &hooks, &s), 0);
	for (int i = 0; i < 3; i++) {
		make_call(&c[i], i, 0.7f, 30);
		submit(s, &c[i]);
	}
	make_call(&big, 3, 0, 200); /* prompt + 200 > 64 positions */
	submit(s, &big);
	for (int i = 0; i < 3; i++) {
		wait_done(&c[i]);
		T_ASSERT_MSG(c[i].rc == 0, "%s", c[i].err);
		T_ASSERT(strcmp(c[i].res.text, alone[i].res.text) == 0);
		generator_result_free(&c[i].res);
		generator_result_free(&alone[i].res);
	}
	wait_done(&big);
	T_EQ_INT(big.rc, BATON_ERANGE);
	T_ASSERT_MSG(strstr(big.err, "KV blocks"), "%s", big.err);
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.admitted, 3);
	sched_close(s);
	rig_close(&r);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Issue 28: one request without max_tokens reserved the rest of the
 * context at admission, so with the default pool (one context) a short
 * request waited for the long one's whole answer (4.14 s measured, 32 s
 * behind six). Now admission holds the prompt only: the short request runs
 * beside the long one and answers before it. */
static void t_short_beside_long(void)
{
	struct rig r;
	rig_open(&r, 256, 0 /* one context: 16 blocks */);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	T_EQ_INT(sched_open(r.g, NULL, &hooks, &s), 0);
	static struct call lng[3], shrt;
	/* the long ones never end early: their end-of-turn and EOS banned */
	const text_tok *tok = generator_tokenizer(r.g);
	int32_t *end = NULL;
	size_t n_end = 0;
	char err[256];
	T_OK(text_encode(tok, "<|im_end|>", 10, 0, &end, &n_end, err, sizeof err));
	T_EQ_INT(n_end, 1);
	struct baton_logit_bias ban[2] = { { (uint32_t)end[0], -100 }, { (uint32_t)text_eos(tok), -100 } };
	free(end);
	double t0 = now_s();
	for (int i = 0; i < 3; i++) {
		make_call(&lng[i], i, 0.9f, 0 /* no max_tokens: to the end of the context */);
		lng[i].q.sp.bias = ban;
		lng[i].q.sp.n_bias = 2;
		submit(s, &lng[i]);
	}
	usleep(20 * 1000);
	make_call(&shrt, 4, 0, 4);
	submit(s, &shrt);
	wait_done(&shrt);
	double t_short = now_s() - t0;
	int long_done = 0;
	for (int i = 0; i < 3; i++)
		long_done += atomic_load(&lng[i].done);
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(shrt.rc, 0);
	printf("  short answered after %.3f s, %d of 3 long ones done then, %u running\n", t_short, long_done,
	    st.running);
	T_ASSERT_MSG(long_done < 3, "the short request waited for every long one");
	for (int i = 0; i < 3; i++) {
		wait_done(&lng[i]);
		T_ASSERT_MSG(lng[i].rc == 0, "%s", lng[i].err);
		T_EQ_STR(lng[i].res.finish, "length");
	}
	sched_stats(s, &st);
	printf("  the long ones: %u, %u and %u tokens, all done after %.3f s; %llu preemptions\n",
	    lng[0].res.n_tokens, lng[1].res.n_tokens, lng[2].res.n_tokens, now_s() - t0,
	    (unsigned long long)st.preempted);
	for (int i = 0; i < 3; i++)
		generator_result_free(&lng[i].res);
	generator_result_free(&shrt.res);
	sched_close(s);
	rig_close(&r);
}

/* A pool too small for what the running sequences grow to: the youngest
 * are preempted and read again, and every answer is still the one it
 * gives alone (greedy and sampled: the sampler goes on where it was). */
static void t_preempt_recompute(void)
{
	struct rig r;
	rig_open(&r, 256, 0);
	static struct call c[4], alone[4];
	char err[512];
	for (int i = 0; i < 4; i++) {
		make_call(&alone[i], i, i % 2 ? 0.9f : 0.0f, 60);
		alone[i].q.on_text = NULL;
		T_ASSERT_MSG(generator_run(r.g, &alone[i].q, &alone[i].res, err, sizeof err) == 0, "%s", err);
	}
	rig_close(&r);
	rig_open(&r, 256, 6 /* 96 positions: any one fits, not all four */);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	T_EQ_INT(sched_open(r.g, NULL, &hooks, &s), 0);
	for (int i = 0; i < 4; i++) {
		make_call(&c[i], i, i % 2 ? 0.9f : 0.0f, 60);
		submit(s, &c[i]);
	}
	unsigned total = 0;
	for (int i = 0; i < 4; i++) {
		wait_done(&c[i]);
		T_ASSERT_MSG(c[i].rc == 0, "request %d: %s", i, c[i].err);
		struct baton_gen_result *a = &alone[i].res, *b = &c[i].res;
		T_ASSERT_MSG(a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * 4) == 0,
		    "request %d: %u tokens with preemption, %u alone", i, b->n_tokens, a->n_tokens);
		T_ASSERT(strcmp(a->text, b->text) == 0);
		/* the stream said each piece once: no text twice after a recompute */
		T_ASSERT(c[i].len == b->text_len && memcmp(c[i].text, b->text, b->text_len) == 0);
		total += b->n_prompt + b->n_tokens;
	}
	struct sched_stats st;
	sched_stats(s, &st);
	printf("  %llu preemptions; %u positions in all through a pool of 96\n", (unsigned long long)st.preempted,
	    total);
	T_ASSERT_MSG(st.preempted > 0, "nothing was preempted: the test's pool is too large");
	for (int i = 0; i < 200; i++) {
		sched_stats(s, &st);
		if (!st.held)
			break;
		usleep(1000);
	}
	T_EQ_INT(st.kv_free, st.kv_total);
	sched_close(s);
	for (int i = 0; i < 4; i++) {
		generator_result_free(&alone[i].res);
		generator_result_free(&c[i].res);
	}
	rig_close(&r);
}

/* Preempted ones that are cancelled, running or back in the queue, end
 * as cancelled with their blocks free; the others are still answered as
 * alone, and the pool is whole at the end. */
static void t_preempt_and_cancel(void)
{
	struct rig r;
	rig_open(&r, 256, 0);
	enum { M = 6 };
	static struct call c[M], alone[M];
	char err[512];
	/* no early ends: the end-of-turn and EOS banned */
	const text_tok *tok = generator_tokenizer(r.g);
	int32_t *end = NULL;
	size_t n_end = 0;
	T_OK(text_encode(tok, "<|im_end|>", 10, 0, &end, &n_end, err, sizeof err));
	static struct baton_logit_bias ban[2];
	ban[0] = (struct baton_logit_bias){ (uint32_t)end[0], -100 };
	ban[1] = (struct baton_logit_bias){ (uint32_t)text_eos(tok), -100 };
	free(end);
	for (int i = 0; i < M; i++) {
		make_call(&alone[i], i, 0.9f, 60);
		alone[i].q.sp.bias = ban;
		alone[i].q.sp.n_bias = 2;
		alone[i].q.on_text = NULL;
		T_ASSERT_MSG(generator_run(r.g, &alone[i].q, &alone[i].res, err, sizeof err) == 0, "%s", err);
	}
	rig_close(&r);
	rig_open(&r, 256, 6);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	T_EQ_INT(sched_open(r.g, NULL, &hooks, &s), 0);
	for (int i = 0; i < M; i++) {
		make_call(&c[i], i, 0.9f, 60);
		c[i].q.sp.bias = ban;
		c[i].q.sp.n_bias = 2;
		if (i % 2)
			c[i].cancel_id_at = 10 + 6 * i; /* sched_cancel from its own stream, mid-answer */
		submit(s, &c[i]);
	}
	int cancelled = 0;
	for (int i = 0; i < M; i++) {
		wait_done(&c[i]);
		if (i % 2) {
			/* cancelled: as "cancelled" when its answer began, else ECLOSED */
			T_ASSERT_MSG(c[i].rc == 0 ? strcmp(c[i].res.finish, "cancelled") == 0 ||
			    c[i].res.n_tokens == alone[i].res.n_tokens : c[i].rc == BATON_ECLOSED,
			    "request %d: rc %d, %s", i, c[i].rc, c[i].err);
			cancelled += c[i].rc == 0 && strcmp(c[i].res.finish, "cancelled") == 0;
		} else {
			T_ASSERT_MSG(c[i].rc == 0, "request %d: %s", i, c[i].err);
			T_ASSERT(c[i].res.n_tokens == alone[i].res.n_tokens &&
			    memcmp(c[i].res.tokens, alone[i].res.tokens, alone[i].res.n_tokens * 4) == 0);
		}
	}
	struct sched_stats st;
	for (int i = 0; i < 200; i++) {
		sched_stats(s, &st);
		if (!st.held)
			break;
		usleep(1000);
	}
	printf("  %llu preemptions, %d of 3 cancelled mid-answer\n", (unsigned long long)st.preempted, cancelled);
	T_EQ_INT(st.kv_free, st.kv_total);
	T_EQ_INT(st.running, 0);
	T_EQ_INT(st.waiting, 0);
	sched_close(s);
	for (int i = 0; i < M; i++) {
		generator_result_free(&alone[i].res);
		generator_result_free(&c[i].res);
	}
	rig_close(&r);
}

/* may_admit no: nothing starts and the engine goes back (end); yes: on. */
static void t_drain(void)
{
	struct rig r;
	rig_open(&r, 128, 0);
	atomic_store(&hk.may, 0);
	atomic_store(&hk.begins, 0);
	atomic_store(&hk.ends, 0);
	struct baton_sched *s;
	T_EQ_INT(sched_open(r.g, NULL, &hooks, &s), 0);
	static struct call c;
	make_call(&c, 0, 0, 4);
	submit(s, &c);
	usleep(100 * 1000);
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.admitted, 0);
	T_EQ_INT(st.waiting, 1);
	T_ASSERT(!atomic_load(&c.done));
	/* each try took the engine and gave it back */
	T_ASSERT(atomic_load(&hk.begins) >= 1 && atomic_load(&hk.begins) - atomic_load(&hk.ends) <= 1);
	atomic_store(&hk.may, 1);
	sched_kick(s);
	wait_done(&c);
	T_EQ_INT(c.rc, 0);
	generator_result_free(&c.res);
	/* closing with a request waiting: it hears ECLOSED */
	atomic_store(&hk.may, 0);
	static struct call d;
	make_call(&d, 1, 0, 4);
	submit(s, &d);
	sched_close(s);
	T_ASSERT(atomic_load(&d.done));
	T_EQ_INT(d.rc, BATON_ECLOSED);
	rig_close(&r);
}

/* A chat of three turns through the scheduler, two conversations
 * interleaved: each turn takes its history from the prefix cache
 * (cached_tokens), and every answer is the one a generator without the
 * cache gives (greedy, and sampled with a seed). */
static void t_prefix_turns(void)
{
	struct rig r, f;
	rig_engine(&f, rig_models(), "kjv-qwen3-moe", "f");
	struct baton_model_opts off = { .max_ctx = 512, .no_prefix_cache = 1 };
	rig_generator(&f, &off);
	rig_open(&r, 512, 64);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 4, .chunk = 32 };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	static const char *const asks[2][3] = {
		{ "Tell me of light.", "And of darkness?", "Which came first?" },
		{ "Who was Moses?", "Where did he go?", "Who went with him?" },
	};
	static char answers[2][3][4096];
	struct text_msg hist[2][6];
	char err[512];
	uint64_t cached_sum = 0;
	uint32_t prev[2] = { 0, 0 };
	for (int turn = 0; turn < 3; turn++) {
		static struct call c[2];
		struct baton_gen_result ref[2];
		for (int k = 0; k < 2; k++) {
			hist[k][2 * turn] = (struct text_msg){ .role = "user", .content = asks[k][turn] };
			make_call(&c[k], k, k ? 0.8f : 0.0f, 20);
			c[k].q.msgs = hist[k];
			c[k].q.n_msgs = (size_t)(2 * turn + 1);
			struct baton_gen_request q = c[k].q;
			q.on_text = NULL;
			T_ASSERT_MSG(generator_run(f.g, &q, &ref[k], err, sizeof err) == 0, "%s", err);
			submit(s, &c[k]);
		}
		for (int k = 0; k < 2; k++) {
			wait_done(&c[k]);
			T_ASSERT_MSG(c[k].rc == 0, "turn %d, chat %d: %s", turn, k, c[k].err);
			struct baton_gen_result *a = &ref[k], *b = &c[k].res;
			T_ASSERT_MSG(a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * 4) == 0 &&
			    strcmp(a->text, b->text) == 0, "turn %d, chat %d: the answer differs with the cache:\n%s\n%s",
			    turn, k, b->text, a->text);
			T_EQ_INT(b->n_prompt, a->n_prompt);
			T_EQ_INT(a->n_cached, 0);
			/* the last turn's prompt starts this one (the template
			 * renders the history alike; the answer may not be, as
			 * Qwen3's drops its <think> part): its full blocks are found */
			T_ASSERT_MSG(b->n_cached % 16 == 0 && b->n_cached < b->n_prompt &&
			    b->n_cached >= prev[k] / 16 * 16, "turn %d, chat %d: %u of %u cached, the last prompt %u",
			    turn, k, b->n_cached, b->n_prompt, prev[k]);
			if (turn == 2)
				T_ASSERT(b->n_cached >= 32);
			prev[k] = b->n_prompt;
			cached_sum += b->n_cached;
			printf("  turn %d chat %d: %u/%u cached: %s\n", turn, k, b->n_cached, b->n_prompt, b->text);
			snprintf(answers[k][turn], sizeof answers[k][turn], "%s", b->text);
			hist[k][2 * turn + 1] = (struct text_msg){ .role = "assistant", .content = answers[k][turn] };
			generator_result_free(&ref[k]);
			generator_result_free(&c[k].res);
		}
	}
	struct sched_stats st;
	for (int i = 0; i < 200; i++) {
		sched_stats(s, &st);
		if (!st.held)
			break;
		usleep(1000);
	}
	T_EQ_INT(st.cached_tokens, cached_sum);
	T_ASSERT(st.prompt_tokens > st.cached_tokens);
	T_EQ_INT(st.prefix.hit_tokens, cached_sum);
	T_EQ_INT(st.kv_free, st.kv_total);
	T_EQ_INT(st.prefix.cached_blocks, st.prefix.evictable_blocks); /* nobody holds one */
	sched_close(s);
	rig_close(&r);
	rig_close(&f);
}

/* n > 1: three choices of one prompt admitted together (one greedy, two
 * sampled with their own seeds). The first reads the prompt; the others
 * wait for it and take its whole blocks from the cache, reading only the
 * partial last block each: the prompt's start is computed once
 * (read_tokens), cached_tokens says so, and every answer is the one a
 * generator without the cache gives. */
static void t_prefix_n_choices(void)
{
	struct rig r, f;
	rig_engine(&f, rig_models(), "kjv-qwen3-moe", "f");
	struct baton_model_opts off = { .max_ctx = 256, .no_prefix_cache = 1 };
	rig_generator(&f, &off);
	rig_open(&r, 256, 64);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 4, .chunk = 8 /* the prompt over several steps */ };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	enum { K = 3 };
	static struct call c[K];
	struct baton_gen_result ref[K];
	char err[512];
	atomic_store(&hk.gate_shut, 1); /* all three wait, then start together */
	for (int k = 0; k < K; k++) {
		make_call(&c[k], 4, k ? 0.8f : 0.0f, 12);
		c[k].msg.content = "Tell me of the light and of the darkness, of the waters above the firmament and "
		    "the waters under it, and of the six days.";
		c[k].q.sp.seed = 77 + (uint64_t)k;
		struct baton_gen_request q = c[k].q;
		q.on_text = NULL;
		T_ASSERT_MSG(generator_run(f.g, &q, &ref[k], err, sizeof err) == 0, "%s", err);
		submit(s, &c[k]);
	}
	atomic_store(&hk.gate_shut, 0);
	uint32_t n = 0, whole = 0;
	for (int k = 0; k < K; k++) {
		wait_done(&c[k]);
		T_ASSERT_MSG(c[k].rc == 0, "choice %d: %s", k, c[k].err);
		struct baton_gen_result *a = &ref[k], *b = &c[k].res;
		T_ASSERT_MSG(a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * 4) == 0 &&
		    strcmp(a->text, b->text) == 0, "choice %d differs from a generator without the cache:\n%s\n%s",
		    k, b->text, a->text);
		n = b->n_prompt;
		whole = (n - 1) / 16 * 16;
		T_ASSERT_MSG(n > 16, "a prompt of %u tokens: not a whole block to share", n);
		T_EQ_INT(b->n_cached, k == 0 ? 0 : whole);
		printf("  choice %d: %u/%u cached: %s\n", k, b->n_cached, n, b->text);
	}
	struct sched_stats st;
	sched_stats(s, &st);
	T_EQ_INT(st.followed, K - 1);
	T_EQ_INT(st.prompt_tokens, K * n);
	T_EQ_INT(st.cached_tokens, (K - 1) * whole);
	T_EQ_INT(st.read_tokens, n + (K - 1) * (n - whole)); /* the start read once */
	/* two prompts that share a short start before longer messages are
	 * read side by side: waiting would cost more than it saves */
	static struct call d[2];
	static const char *const tails[2] = {
		"and then tell me who built the ark, how long it was and how broad, of what wood, and how many came into "
		"it two by two, and how long the rain fell upon the earth, and where it rested at the last.",
		"and then speak of the sea, of the fishes in it and the great whales, and of the ships that go down to "
		"it in storms, and of the men who cry unto the Lord in their trouble, and of the haven where they would be.",
	};
	static char msg[2][512];
	atomic_store(&hk.gate_shut, 1);
	for (int k = 0; k < 2; k++) {
		make_call(&d[k], 0, 0.0f, 4);
		snprintf(msg[k], sizeof msg[k], "Speak to me of Moses and of Aaron his brother, of Pharaoh king of "
		    "Egypt and of all his host, %s", tails[k]);
		d[k].msg.content = msg[k];
		submit(s, &d[k]);
	}
	atomic_store(&hk.gate_shut, 0);
	for (int k = 0; k < 2; k++) {
		wait_done(&d[k]);
		T_ASSERT_MSG(d[k].rc == 0, "%s", d[k].err);
		T_ASSERT_MSG(d[k].res.n_prompt > 80, "%u prompt tokens", d[k].res.n_prompt);
		generator_result_free(&d[k].res);
	}
	sched_stats(s, &st);
	T_EQ_INT(st.followed, K - 1);
	sched_close(s);
	for (int k = 0; k < K; k++) {
		generator_result_free(&ref[k]);
		generator_result_free(&c[k].res);
	}
	rig_close(&r);
	rig_close(&f);
}

/* Requests that share a prefix, cancelled while they wait, while they
 * read their prompt and while they decode, and the scheduler closed with
 * some still running: every one ends once, and no block stays held. */
static void t_prefix_kills(void)
{
	struct rig r;
	rig_open(&r, 256, 24);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 3, .chunk = 8 };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	static struct call warm, c[6];
	make_call(&warm, 0, 0.0f, 8);
	submit(s, &warm);
	wait_done(&warm);
	T_EQ_INT(warm.rc, 0);
	generator_result_free(&warm.res);
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < 6; i++) {
			make_call(&c[i], 0, 0.0f, 40); /* all the same question: one prefix */
			if (i % 3 == 0)
				c[i].cancel_at = 2 + i; /* the client leaves mid-answer */
			else if (i % 3 == 1)
				c[i].cancel_id_at = 1;
			submit(s, &c[i]);
		}
		if (round == 0) {
			sched_cancel(s, c[5].id); /* maybe still waiting */
			for (int i = 0; i < 6; i++)
				wait_done(&c[i]);
		} else {
			usleep(20000);
			sched_close(s); /* some still run: they end with ECLOSED */
			s = NULL;
			for (int i = 0; i < 6; i++)
				T_ASSERT(atomic_load(&c[i].done));
		}
		for (int i = 0; i < 6; i++)
			generator_result_free(&c[i].res);
	}
	struct baton_model *m = generator_model(r.g);
	struct baton_prefix_stats ps;
	model_prefix_stats(m, &ps);
	T_EQ_INT(model_kv_free_blocks(m), model_kv_blocks_total(m));
	T_EQ_INT(ps.cached_blocks, ps.evictable_blocks);
	T_ASSERT(ps.cached_blocks > 0);
	rig_close(&r);
}

/* A step is one pass: the prompts' chunks fill what the decoding rows
 * leave of the model's rows a pass, so no step is split into a full pass
 * and a small one (the scheduler's chunk is the model's max_batch). */
static void t_step_one_pass(void)
{
	struct rig r;
	rig_engine(&r, rig_models(), "kjv-qwen3-moe", "t");
	struct baton_model_opts mo = { .max_ctx = 256, .kv_blocks = 6 * 16, .max_batch = 8 };
	rig_generator(&r, &mo);
	atomic_store(&hk.may, 1);
	struct baton_sched *s;
	struct sched_opts o = { .max_seqs = 4, .chunk = 64 /* more than a pass: the model's 8 */ };
	T_EQ_INT(sched_open(r.g, &o, &hooks, &s), 0);
	static struct call c[N];
	for (int i = 0; i < N; i++) {
		make_call(&c[i], i, 0.0f, 12);
		submit(s, &c[i]);
	}
	for (int i = 0; i < N; i++) {
		wait_done(&c[i]);
		T_ASSERT_MSG(c[i].rc == 0, "request %d: %s", i, c[i].err);
		T_ASSERT(c[i].res.n_prompt > 8); /* every prompt over several steps */
	}
	struct sched_stats st;
	sched_stats(s, &st);
	printf("  %llu steps, %llu passes\n", (unsigned long long)st.steps, (unsigned long long)st.passes);
	T_ASSERT(st.steps > 0);
	T_EQ_INT(st.passes, st.steps);
	for (int i = 0; i < N; i++)
		generator_result_free(&c[i].res);
	sched_close(s);
	rig_close(&r);
}

T_MAIN(T_CASE_TIMEOUT(t_batched_equals_alone, 120), T_CASE_TIMEOUT(t_batched_samplers, 120), T_CASE_TIMEOUT(t_step_one_pass, 60), T_CASE_TIMEOUT(t_queue_full, 60), T_CASE_TIMEOUT(t_submit_many_all_or_none, 60),
    T_CASE_TIMEOUT(t_cancel_frees_blocks, 60), T_CASE_TIMEOUT(t_small_pool, 120),
    T_CASE_TIMEOUT(t_drain, 60), T_CASE_TIMEOUT(t_short_beside_long, 120),
    T_CASE_TIMEOUT(t_preempt_recompute, 120), T_CASE_TIMEOUT(t_preempt_and_cancel, 120),
    T_CASE_TIMEOUT(t_prefix_turns, 180), T_CASE_TIMEOUT(t_prefix_n_choices, 120),
    T_CASE_TIMEOUT(t_prefix_kills, 120))
