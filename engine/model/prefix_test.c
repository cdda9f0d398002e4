/*
 * prefix_test.c: the prefix cache of the paged KV pool (engine/model/prefix.c,
 * model.h's "the prefix cache"), on the tiny models of engine/model/fixtures,
 * on the host backend or BATON_MODEL_BACKEND (cuda on the GPU machine, with
 * BATON_CUDA_GEMM=0 and BATON_CUDA_EXACT=1: the exact kernels, so bits compare).
 *
 *   - sharing: two sequences with one prefix hold the same blocks (refs 2),
 *     the last token is never taken, closing lets go (refs 0, still cached)
 *   - one prompt read by two sequences in one step (n > 1): one copy kept
 *   - the same outputs: a turn whose prefix was cached (blocks made by a
 *     prefill and by decode steps) gives bitwise the logits of a model
 *     without the cache reading the whole prompt
 *   - eviction: free blocks first, then the least recently used cached
 *     ones; a block in use never (the pool then refuses the step)
 *   - forced hash collisions: every block hashes alike, and still no
 *     block is taken for another prefix (tokens and the block before
 *     compared), hits stay hits
 *   - release to host memory and back (model_release and
 *     model_kv_release): the cached blocks come back, outputs bitwise the
 *     same; the bound (kv_host_bytes) keeps the most recently used and
 *     drops the rest; 0 keeps none
 *   - --no-prefix-cache: nothing found, nothing kept
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/kv_fixture.h"
#include "engine/model/model_fixture.h"
#include "tests/t.h"

#define B BATON_KV_BLOCK

static void open_rig(struct rig *r, uint32_t kv_blocks, uint64_t host_bytes, int off)
{
	/* on cuda, passes of 64 rows or more run on the tensor cores, whose sums
	 * depend on the pass's shape (model.md, "The exception"): the exact
	 * kernels everywhere, so that bits can be compared; a one-row pass on
	 * q4_K / q6_K weights would take the quantized GEMVs (mmvq.cu) */
	setenv("BATON_CUDA_GEMM", "0", 0);
	setenv("BATON_CUDA_EXACT", "1", 0);
	rig_engine(r, rig_fixtures(), "qwen3_moe", "qwen3_moe");
	struct baton_model_opts mo = { .max_ctx = 256, .kv_blocks = kv_blocks, .kv_host_bytes = host_bytes,
		.no_prefix_cache = off };
	rig_model(r, &mo);
}

/* Reads tokens[from .. n) into s (already at position from) in one
 * step, then decodes `steps` greedy tokens; logits of the prompt's last
 * token and of each decode go to lg[(steps + 1) * V]; the decoded ids
 * to out (may be NULL). */
static void run_seq(struct rig *r, struct baton_seq *s, const uint32_t *tokens, uint32_t from, uint32_t n,
    uint32_t steps, float *lg, uint32_t *out)
{
	T_EQ_INT(model_seq_pos(s), from);
	struct baton_step_item it = { s, tokens + from, n - from };
	T_OK(model_step(r->m, &it, 1, lg));
	for (uint32_t k = 0; k < steps; k++) {
		uint32_t t = kv_argmax(lg + (size_t)k * r->V, r->V);
		if (out)
			out[k] = t;
		struct baton_step_item d = { s, &t, 1 };
		T_OK(model_step(r->m, &d, 1, lg + (size_t)(k + 1) * r->V));
	}
}

/* What a model without the cache gives for the whole prompt. */
static void reference(const uint32_t *tokens, uint32_t n, uint32_t steps, float *lg)
{
	struct rig f;
	open_rig(&f, 0, 0, 1);
	struct baton_seq *s;
	T_OK(model_seq_open(f.m, &s));
	run_seq(&f, s, tokens, 0, n, steps, lg, NULL);
	struct baton_prefix_stats st;
	model_prefix_stats(f.m, &st);
	T_EQ_INT(st.enabled, 0);
	T_EQ_INT(st.cached_blocks, 0);
	model_seq_close(f.m, s);
	rig_close(&f);
}

static void t_sharing(void)
{
	struct rig r;
	open_rig(&r, 32, 0, 0);
	uint32_t *p = kv_ids(60, 1, r.V), *q = kv_ids(60, 1, r.V);
	for (uint32_t i = 50; i < 60; i++)
		q[i] = (q[i] + 1) % r.V; /* q: p's first 50 tokens, then others */
	float *lg = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(lg);
	struct baton_seq *a, *b, *c;
	T_OK(model_seq_open(r.m, &a));
	T_OK(model_seq_open(r.m, &b));
	T_OK(model_seq_open(r.m, &c));
	T_EQ_INT(model_seq_prefix(r.m, a, p, 60), 0); /* nothing cached yet */
	struct baton_step_item it = { a, p, 60 };
	T_OK(model_step(r.m, &it, 1, lg));
	struct baton_prefix_stats st;
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.cached_blocks, 3); /* 60 positions: 3 full blocks, one partial */
	T_EQ_INT(st.evictable_blocks, 0);
	T_EQ_INT(model_kv_free_blocks(r.m), 28);

	/* b starts as a did: the 3 full blocks of the 50 shared tokens */
	T_EQ_INT(model_prefix_peek(r.m, q, 60, NULL), 48);
	T_EQ_INT(model_seq_prefix(r.m, b, q, 60), 48);
	T_EQ_INT(model_seq_pos(b), 48);
	for (uint32_t k = 0; k < 3; k++) {
		T_EQ_INT(model_seq_block_id(b, k), model_seq_block_id(a, k));
		T_EQ_INT(model_seq_block_refs(r.m, b, k), 2);
	}
	T_EQ_INT(model_kv_free_blocks(r.m), 28); /* taking cached blocks takes none from the pool */
	/* a prompt of exactly those 48 tokens: its last token is read */
	T_EQ_INT(model_seq_prefix(r.m, c, p, 48), 32);
	T_EQ_INT(model_seq_block_refs(r.m, c, 1), 3);
	/* a sequence not empty takes nothing */
	T_EQ_INT(model_seq_prefix(r.m, a, p, 60), 0);
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.lookups, 3);
	T_EQ_INT(st.lookup_tokens, 168);
	T_EQ_INT(st.hit_tokens, 80);

	/* b reads the rest: the logits a model without the cache gives */
	float *want = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(want);
	run_seq(&r, b, q, 48, 60, 0, lg, NULL);
	reference(q, 60, 0, want);
	T_ASSERT_MSG(memcmp(lg, want, r.V * sizeof(float)) == 0, "the shared prefix changed b's logits");

	/* letting go: refs fall, the blocks stay cached */
	model_seq_close(r.m, c);
	model_seq_close(r.m, a);
	T_EQ_INT(model_seq_block_refs(r.m, b, 0), 1);
	model_seq_close(r.m, b);
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.cached_blocks, 3); /* b's 4th block (60 tokens) is partial */
	T_EQ_INT(st.evictable_blocks, 3);
	T_EQ_INT(model_kv_free_blocks(r.m), 32);
	T_EQ_INT(model_prefix_peek(r.m, p, 60, NULL), 48);
	free(p), free(q), free(lg), free(want);
	rig_close(&r);
}

/* Two sequences read one prompt in the same step (n > 1): the second
 * to file a block takes the first one's and gives its copy back, so the
 * pool holds the prompt once; the logits are a model's without the cache. */
static void t_same_prompt_in_one_step(void)
{
	struct rig r;
	open_rig(&r, 16, 0, 0);
	uint32_t *p = kv_ids(40, 5, r.V);
	float *lg = malloc(2 * (size_t)r.V * sizeof(float)), *want = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(lg && want);
	struct baton_seq *a, *b;
	T_OK(model_seq_open(r.m, &a));
	T_OK(model_seq_open(r.m, &b));
	struct baton_step_item two[2] = { { a, p, 40 }, { b, p, 40 } };
	T_OK(model_step(r.m, two, 2, lg));
	for (uint32_t k = 0; k < 2; k++) {
		T_EQ_INT(model_seq_block_id(a, k), model_seq_block_id(b, k));
		T_EQ_INT(model_seq_block_refs(r.m, a, k), 2);
	}
	T_ASSERT(model_seq_block_id(a, 2) != model_seq_block_id(b, 2)); /* the partial ones stay apart */
	T_EQ_INT(model_kv_free_blocks(r.m), 16 - 4);
	reference(p, 40, 0, want);
	T_ASSERT(memcmp(lg, want, r.V * sizeof(float)) == 0 && memcmp(lg + r.V, want, r.V * sizeof(float)) == 0);
	/* and both go on from the shared blocks as a model without the cache */
	uint32_t t = kv_argmax(want, r.V);
	struct baton_step_item d[2] = { { a, &t, 1 }, { b, &t, 1 } };
	T_OK(model_step(r.m, d, 2, lg));
	T_ASSERT(memcmp(lg, lg + r.V, r.V * sizeof(float)) == 0);
	model_seq_close(r.m, a);
	model_seq_close(r.m, b);
	T_EQ_INT(model_kv_free_blocks(r.m), 16);
	free(p), free(lg), free(want);
	rig_close(&r);
}

/* A chat's second turn: the first turn's prompt and answer (KV made by
 * a prefill and by decode steps) and a new message. */
static void t_multi_turn_same_logits(void)
{
	struct rig r;
	open_rig(&r, 64, 0, 0);
	const uint32_t n1 = 21, steps = 30, n2 = n1 + steps - 1 + 17, steps2 = 8;
	uint32_t *t1 = kv_ids(n1, 7, r.V), *t2 = malloc(n2 * sizeof *t2), out[64];
	float *lg = malloc((size_t)(steps + 1) * r.V * sizeof(float)),
	      *want = malloc((size_t)(steps + 1) * r.V * sizeof(float));
	T_ASSERT(t2 && lg && want);
	struct baton_seq *a, *b;
	T_OK(model_seq_open(r.m, &a));
	run_seq(&r, a, t1, 0, n1, steps, lg, out);
	model_seq_close(r.m, a); /* positions 0 .. n1 + steps - 1: 3 full blocks */
	memcpy(t2, t1, n1 * sizeof *t2);
	memcpy(t2 + n1, out, (steps - 1) * sizeof *t2);
	uint32_t *more = kv_ids(17, 8, r.V);
	memcpy(t2 + n1 + steps - 1, more, 17 * sizeof *t2);
	T_OK(model_seq_open(r.m, &b));
	T_EQ_INT(model_seq_prefix(r.m, b, t2, n2), 48);
	run_seq(&r, b, t2, 48, n2, steps2, lg, NULL);
	reference(t2, n2, steps2, want);
	for (uint32_t k = 0; k <= steps2; k++)
		T_ASSERT_MSG(memcmp(lg + (size_t)k * r.V, want + (size_t)k * r.V, r.V * sizeof(float)) == 0,
		    "turn 2, step %u: logits differ from a model without the cache", k);
	model_seq_close(r.m, b);
	free(t1), free(t2), free(more), free(lg), free(want);
	rig_close(&r);
}

static void t_eviction_lru(void)
{
	struct rig r;
	open_rig(&r, 6, 0, 0); /* 6 blocks */
	float *lg = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(lg);
	uint32_t *x = kv_ids(33, 11, r.V), *y = kv_ids(33, 12, r.V), *z = kv_ids(33, 13, r.V),
	         *w = kv_ids(48, 14, r.V);
	struct baton_seq *s;
	const uint32_t *three[3] = { x, y, z };
	for (int i = 0; i < 3; i++) { /* 32 positions each: 2 full blocks, cached */
		T_OK(model_seq_open(r.m, &s));
		struct baton_step_item it = { s, three[i], 32 };
		T_OK(model_step(r.m, &it, 1, lg));
		model_seq_close(r.m, s);
	}
	struct baton_prefix_stats st;
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.cached_blocks, 6);
	T_EQ_INT(st.evictable_blocks, 6);
	T_EQ_INT(model_kv_free_blocks(r.m), 6);
	T_EQ_INT(st.evictions, 0);
	/* x used again (held by h): the most recent, and not evictable */
	struct baton_seq *h;
	T_OK(model_seq_open(r.m, &h));
	T_EQ_INT(model_seq_prefix(r.m, h, x, 33), 32);
	T_EQ_INT(model_kv_free_blocks(r.m), 4);
	/* 48 new positions: 3 blocks, none free: y's two (the least recently
	 * used, its second block first), then z's second */
	T_OK(model_seq_open(r.m, &s));
	struct baton_step_item it = { s, w, 48 };
	T_OK(model_step(r.m, &it, 1, lg));
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.evictions, 3);
	T_EQ_INT(model_prefix_peek(r.m, y, 33, NULL), 0);
	T_EQ_INT(model_prefix_peek(r.m, z, 33, NULL), 16);
	T_EQ_INT(model_prefix_peek(r.m, x, 33, NULL), 32);
	/* the pool holds z's first block (evictable) and what h and s hold:
	 * a step of 2 more blocks is refused, h's blocks never taken */
	T_EQ_INT(model_kv_free_blocks(r.m), 1);
	uint32_t more[17] = { 0 };
	struct baton_step_item big = { s, more, 17 };
	T_EQ_ERR(model_step(r.m, &big, 1, lg), BATON_ENOSPC);
	T_EQ_INT(model_seq_pos(s), 48);
	T_EQ_INT(model_prefix_peek(r.m, x, 33, NULL), 32);
	T_EQ_INT(model_prefix_peek(r.m, z, 33, NULL), 16);
	/* one block fits: z's first goes */
	big.n = 16;
	T_OK(model_step(r.m, &big, 1, lg));
	T_EQ_INT(model_prefix_peek(r.m, z, 33, NULL), 0);
	T_EQ_INT(model_prefix_peek(r.m, x, 33, NULL), 32);
	T_EQ_INT(model_kv_free_blocks(r.m), 0);
	model_seq_close(r.m, h);
	model_seq_close(r.m, s);
	T_EQ_INT(model_kv_free_blocks(r.m), 6);
	free(x), free(y), free(z), free(w), free(lg);
	rig_close(&r);
}

static void t_forced_collisions(void)
{
	struct rig r;
	open_rig(&r, 32, 0, 0);
	model_prefix_test_collide(r.m, 1);
	float *lg = malloc((size_t)r.V * sizeof(float)), *want = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(lg && want);
	uint32_t *x = kv_ids(40, 21, r.V);
	struct baton_seq *s;
	T_OK(model_seq_open(r.m, &s));
	struct baton_step_item it = { s, x, 40 };
	T_OK(model_step(r.m, &it, 1, lg));
	model_seq_close(r.m, s); /* blocks X0, X1 cached, under one hash */
	/* the same prompt: both found */
	T_EQ_INT(model_prefix_peek(r.m, x, 40, NULL), 32);
	/* X0 then another block: X0 only */
	uint32_t *y = kv_ids(40, 21, r.V);
	y[20] ^= 1;
	T_EQ_INT(model_prefix_peek(r.m, y, 40, NULL), 16);
	/* another first block, then X1's tokens: nothing (X1 follows X0) */
	uint32_t *z = kv_ids(40, 21, r.V);
	z[3] = (z[3] + 1) % r.V;
	T_EQ_INT(model_prefix_peek(r.m, z, 40, NULL), 0);
	/* z read whole with collisions forced: its blocks go in beside x's,
	 * and its logits are a model's without the cache */
	T_OK(model_seq_open(r.m, &s));
	T_EQ_INT(model_seq_prefix(r.m, s, z, 40), 0);
	run_seq(&r, s, z, 0, 40, 0, lg, NULL);
	reference(z, 40, 0, want);
	T_ASSERT(memcmp(lg, want, r.V * sizeof(float)) == 0);
	model_seq_close(r.m, s);
	struct baton_prefix_stats st;
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.cached_blocks, 4);
	/* z's second block holds X1's tokens after another first block:
	 * each prompt finds its own */
	T_EQ_INT(model_prefix_peek(r.m, z, 40, NULL), 32);
	T_EQ_INT(model_prefix_peek(r.m, x, 40, NULL), 32);
	/* y: X0, then its own second block read and cached; then found */
	T_OK(model_seq_open(r.m, &s));
	T_EQ_INT(model_seq_prefix(r.m, s, y, 40), 16);
	run_seq(&r, s, y, 16, 40, 0, lg, NULL);
	reference(y, 40, 0, want);
	T_ASSERT(memcmp(lg, want, r.V * sizeof(float)) == 0);
	model_seq_close(r.m, s);
	T_EQ_INT(model_prefix_peek(r.m, y, 40, NULL), 32);
	T_EQ_INT(model_prefix_peek(r.m, x, 40, NULL), 32);
	free(x), free(y), free(z), free(lg), free(want);
	rig_close(&r);
}

/* Release (whole, and the KV pool alone) with cached blocks: they go to
 * host memory and come back; the next turn reads only its new tokens and
 * gives a model's logits without the cache. */
static void release_and_back(int whole)
{
	struct rig r;
	open_rig(&r, 32, 64u << 20, 0);
	const uint32_t n1 = 37, steps = 12;
	uint32_t *t = kv_ids(n1 + steps + 20, 31, r.V), out[16];
	float *lg = malloc((size_t)(steps + 1) * r.V * sizeof(float)),
	      *want = malloc((size_t)(steps + 1) * r.V * sizeof(float));
	T_ASSERT(lg && want);
	struct baton_seq *a, *held;
	T_OK(model_seq_open(r.m, &a));
	T_OK(model_seq_open(r.m, &held));
	run_seq(&r, a, t, 0, n1, steps, lg, out);
	model_seq_close(r.m, a); /* 48 positions: 3 cached blocks, unheld */
	memcpy(t + n1, out, (steps - 1) * sizeof *t);
	uint32_t *h = kv_ids(20, 32, r.V); /* a sequence still open holds 20 positions */
	struct baton_step_item hi = { held, h, 20 };
	T_OK(model_step(r.m, &hi, 1, lg));
	struct baton_prefix_stats st;
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.cached_blocks, 4);
	if (whole) {
		T_OK(model_release(r.m));
		T_EQ_INT(model_device_bytes(r.m), 0);
	} else {
		model_kv_release(r.m); /* empties every sequence: held's block is cached, unheld */
		T_EQ_INT(model_kv_bytes(r.m), 0);
		T_EQ_INT(model_seq_pos(held), 0);
	}
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.host_blocks, whole ? 5 : 4); /* whole: held's 2 blocks (one partial) and 3 */
	T_EQ_INT(st.host_bytes, st.host_blocks * model_kv_block_bytes(r.m));
	T_EQ_INT(st.cached_blocks, 4);
	T_EQ_INT(st.host_dropped, 0);
	if (whole)
		T_OK(model_refill(r.m));
	/* the next turn: 3 blocks found, read from position 48 */
	const uint32_t n2 = n1 + steps - 1 + 20;
	struct baton_seq *b;
	T_OK(model_seq_open(r.m, &b));
	T_EQ_INT(model_seq_prefix(r.m, b, t, n2), 48);
	run_seq(&r, b, t, 48, n2, 4, lg, NULL);
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.host_blocks, 0);
	T_EQ_INT(st.restored_blocks, whole ? 5 : 4);
	reference(t, n2, 4, want);
	T_ASSERT_MSG(memcmp(lg, want, 5 * r.V * sizeof(float)) == 0, "after the release: logits differ");
	if (whole) {
		/* and the held sequence goes on as if never released */
		struct baton_step_item hn = { held, t, 1 };
		T_OK(model_step(r.m, &hn, 1, lg));
		struct rig f;
		open_rig(&f, 0, 0, 1);
		struct baton_seq *fs;
		T_OK(model_seq_open(f.m, &fs));
		uint32_t hh[21];
		memcpy(hh, h, 20 * sizeof *hh);
		hh[20] = t[0];
		struct baton_step_item fi = { fs, hh, 21 };
		T_OK(model_step(f.m, &fi, 1, want));
		T_ASSERT(memcmp(lg, want, r.V * sizeof(float)) == 0);
		model_seq_close(f.m, fs);
		rig_close(&f);
	}
	model_seq_close(r.m, b);
	model_seq_close(r.m, held);
	T_EQ_INT(model_kv_free_blocks(r.m), 32);
	free(t), free(h), free(lg), free(want);
	rig_close(&r);
}

static void t_release_to_host_and_back(void)
{
	release_and_back(1);
}

static void t_kv_release_to_host_and_back(void)
{
	release_and_back(0);
}

/* The bound: room for 2 blocks keeps the 2 most recently used. */
static void t_host_bound(void)
{
	struct rig r;
	rig_engine(&r, rig_fixtures(), "qwen3_moe", "qwen3_moe");
	struct baton_model_opts probe = { .max_ctx = 256, .kv_blocks = 32 };
	rig_model(&r, &probe);
	uint64_t bb = model_kv_block_bytes(r.m);
	model_close(r.m);
	struct baton_model_opts mo = { .max_ctx = 256, .kv_blocks = 32, .kv_host_bytes = 2 * bb + bb / 2 };
	rig_model(&r, &mo);
	float *lg = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(lg);
	uint32_t *x = kv_ids(49, 41, r.V), *y = kv_ids(17, 42, r.V);
	struct baton_seq *s;
	T_OK(model_seq_open(r.m, &s));
	struct baton_step_item it = { s, x, 48 };
	T_OK(model_step(r.m, &it, 1, lg));
	model_seq_close(r.m, s); /* X0 X1 X2: X0 the most recent (let go last) */
	T_OK(model_seq_open(r.m, &s));
	struct baton_step_item yi = { s, y, 16 };
	T_OK(model_step(r.m, &yi, 1, lg));
	model_seq_close(r.m, s); /* Y0: now the most recent */
	T_OK(model_release(r.m));
	struct baton_prefix_stats st;
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.host_blocks, 2);
	T_EQ_INT(st.host_bytes, 2 * bb);
	T_EQ_INT(st.host_dropped, 2);
	T_EQ_INT(st.cached_blocks, 2);
	T_EQ_INT(model_prefix_peek(r.m, y, 17, NULL), 16);
	T_EQ_INT(model_prefix_peek(r.m, x, 49, NULL), 16);
	T_OK(model_refill(r.m));
	T_EQ_INT(model_prefix_peek(r.m, x, 49, NULL), 16);
	T_EQ_INT(model_kv_free_blocks(r.m), 32);
	model_close(r.m);
	r.m = NULL;
	/* 0: nothing kept past a release (the sequences' blocks still are) */
	struct baton_model_opts none = { .max_ctx = 256, .kv_blocks = 32 };
	rig_model(&r, &none);
	T_OK(model_seq_open(r.m, &s));
	it.seq = s;
	T_OK(model_step(r.m, &it, 1, lg));
	model_seq_close(r.m, s);
	T_OK(model_release(r.m));
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.host_blocks, 0);
	T_EQ_INT(st.cached_blocks, 0);
	T_EQ_INT(st.host_dropped, 3);
	T_OK(model_refill(r.m));
	T_EQ_INT(model_prefix_peek(r.m, x, 49, NULL), 0);
	free(x), free(y), free(lg);
	rig_close(&r);
}

static void t_off(void)
{
	struct rig r;
	open_rig(&r, 32, 64u << 20, 1);
	float *lg = malloc((size_t)r.V * sizeof(float));
	T_ASSERT(lg);
	uint32_t *x = kv_ids(40, 51, r.V);
	struct baton_seq *s;
	T_OK(model_seq_open(r.m, &s));
	struct baton_step_item it = { s, x, 40 };
	T_OK(model_step(r.m, &it, 1, lg));
	model_seq_close(r.m, s);
	T_OK(model_seq_open(r.m, &s));
	T_EQ_INT(model_prefix_peek(r.m, x, 40, NULL), 0);
	T_EQ_INT(model_seq_prefix(r.m, s, x, 40), 0);
	struct baton_prefix_stats st;
	model_prefix_stats(r.m, &st);
	T_EQ_INT(st.enabled, 0);
	T_EQ_INT(st.cached_blocks, 0);
	T_EQ_INT(st.lookups, 0);
	model_seq_close(r.m, s);
	free(x), free(lg);
	rig_close(&r);
}

T_MAIN(T_CASE_TIMEOUT(t_sharing, 120), T_CASE_TIMEOUT(t_same_prompt_in_one_step, 120),
    T_CASE_TIMEOUT(t_multi_turn_same_logits, 120),
    T_CASE_TIMEOUT(t_eviction_lru, 120), T_CASE_TIMEOUT(t_forced_collisions, 120),
    T_CASE_TIMEOUT(t_release_to_host_and_back, 120), T_CASE_TIMEOUT(t_kv_release_to_host_and_back, 120),
    T_CASE_TIMEOUT(t_host_bound, 120), T_CASE_TIMEOUT(t_off, 120))
