/*
 * kv_test.c: the paged KV cache and model_step, the forward pass over
 * several sequences at once (engine/model/model.h), on the tiny models of
 * engine/model/fixtures, on the host backend or BATON_MODEL_BACKEND (cuda on the
 * GPU machine).
 *
 *   - batched = alone: sequences of different lengths prefilled and decoded
 *     interleaved, joining and leaving, one step for all of them, in passes
 *     small enough to split prompts; each one's logits at every step are
 *     bitwise (memcmp) those of running it alone through model_prefill and
 *     model_decode on a model with the default batch
 *   - blocks are taken as a sequence grows and all given back on close;
 *     a step the pool cannot hold, a sequence twice, a bad token or a
 *     position past max_ctx is refused with nothing changed
 *   - model_release with live sequences (holes in the pool included) and
 *     the refill: every later output bitwise that of a twin never released
 *   - a step that fails on the device after some of its passes ran (an
 *     injected copy fault) leaves every sequence and the pool as they were
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/kv_fixture.h"
#include "engine/model/model_fixture.h"
#include "engine/backend/backend.h"
#include "tests/t.h"

static void rig_open(struct rig *r, const char *arch, uint32_t max_batch, uint32_t max_ctx,
    uint32_t kv_blocks)
{
	rig_engine(r, rig_fixtures(), arch, arch);
	struct baton_model_opts mo = { .max_batch = max_batch, .max_ctx = max_ctx,
		.kv_blocks = kv_blocks };
	rig_model(r, &mo);
}

#define NSEQ 5
#define KV_SHARE 16u /* the pool's default share of the device (kv_size.c, documented) */
#define STEPS 12 /* decode steps per sequence */

/* Sequence i: its prompt, and (from running it alone) the greedy tokens
 * and the logits after the prompt and after each decode step. */
struct script {
	uint32_t len, *toks;
	uint32_t next[STEPS + 1]; /* the token fed at each decode step */
	float *logits;            /* [STEPS + 1][V] */
};

static const uint32_t LENS[NSEQ] = { 19, 1, 40, 7, 33 };
/* the step at which sequence i joins: its prompt goes into that step */
static const uint32_t JOIN[NSEQ] = { 0, 0, 1, 3, 4 };

static void run_alone(struct rig *r, struct script *sc)
{
	for (int i = 0; i < NSEQ; i++) {
		struct script *s = &sc[i];
		s->len = LENS[i];
		s->toks = kv_ids(s->len, (uint32_t)i + 1, r->V);
		s->logits = malloc((size_t)(STEPS + 1) * r->V * sizeof(float));
		T_ASSERT(s->logits);
		T_OK(model_prefill(r->m, s->toks, s->len, s->logits));
		for (int k = 0; k < STEPS; k++) {
			s->next[k] = kv_argmax(s->logits + (size_t)k * r->V, r->V);
			T_OK(model_decode(r->m, s->next[k], s->logits + (size_t)(k + 1) * r->V));
		}
		T_EQ_INT(model_pos(r->m), s->len + STEPS);
	}
	model_reset(r->m);
}

/* Drives the script through model_step on rig r (and its twin t, when
 * given, which is released and refilled along the way): step g holds the
 * prompt of every sequence that joins at g and one decode token of every
 * other sequence still running; sequence 1 leaves early (closed), and its
 * blocks go to those that join later. Every item's logits are compared
 * with the alone run's. */
static void run_batched(struct rig *r, struct rig *tw, const struct script *sc)
{
	struct baton_seq *seq[NSEQ] = { 0 }, *tseq[NSEQ] = { 0 };
	uint32_t done[NSEQ] = { 0 }; /* decode steps taken */
	int live[NSEQ] = { 0 };
	float *lg = malloc((size_t)NSEQ * r->V * sizeof(float));
	float *tl = malloc((size_t)NSEQ * r->V * sizeof(float));
	T_ASSERT(lg && tl);
	const uint32_t total = model_kv_blocks_total(r->m);
	for (uint32_t g = 0;; g++) {
		struct baton_step_item it[NSEQ], tit[NSEQ];
		int who[NSEQ];
		uint32_t n = 0, need = 0;
		for (int i = 0; i < NSEQ; i++) {
			if (JOIN[i] == g) {
				T_OK(model_seq_open(r->m, &seq[i]));
				if (tw)
					T_OK(model_seq_open(tw->m, &tseq[i]));
				T_EQ_INT(model_seq_pos(seq[i]), 0);
				live[i] = 1;
				it[n] = (struct baton_step_item){ seq[i], sc[i].toks, sc[i].len };
			} else if (live[i]) {
				it[n] = (struct baton_step_item){ seq[i], &sc[i].next[done[i]], 1 };
			} else {
				continue;
			}
			tit[n] = it[n];
			tit[n].seq = tseq[i];
			need += model_seq_blocks_needed(r->m, seq[i], it[n].n);
			who[n++] = i;
		}
		if (!n)
			break;
		uint32_t free0 = model_kv_free_blocks(r->m);
		T_OK(model_step(r->m, it, n, lg));
		T_EQ_INT(model_kv_free_blocks(r->m), free0 - need);
		if (tw) {
			if (g == 3 || g == 7) {
				/* released with live sequences, refilled by the step */
				T_OK(model_release(tw->m));
				T_ASSERT(model_released(tw->m) && model_device_bytes(tw->m) == 0);
				struct baton_cache_report rep;
				T_OK(engine_release(tw->e, &rep));
				T_OK(engine_refill(tw->e, &rep));
			}
			T_OK(model_step(tw->m, tit, n, tl));
			T_ASSERT_MSG(memcmp(lg, tl, (size_t)n * r->V * sizeof(float)) == 0,
			    "step %u: the released twin's logits differ", g);
		}
		for (uint32_t k = 0; k < n; k++) {
			int i = who[k];
			const float *want = sc[i].logits + (size_t)done[i] * r->V;
			if (JOIN[i] != g)
				done[i]++, want += r->V;
			T_ASSERT_MSG(memcmp(lg + (size_t)k * r->V, want, r->V * sizeof(float)) == 0,
			    "sequence %d at step %u (decode %u, %u items): batched logits differ from alone",
			    i, g, done[i], n);
			T_EQ_INT(model_seq_pos(seq[i]), sc[i].len + done[i]);
			if (done[i] == STEPS || (i == 1 && done[i] == 2)) {
				uint32_t f = model_kv_free_blocks(r->m);
				uint32_t held = (model_seq_pos(seq[i]) + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
				model_seq_close(r->m, seq[i]);
				if (tw)
					model_seq_close(tw->m, tseq[i]);
				T_EQ_INT(model_kv_free_blocks(r->m), f + held);
				live[i] = 0;
			}
		}
	}
	T_EQ_INT(model_kv_free_blocks(r->m), total);
	free(lg);
	free(tl);
}

static void free_script(struct script *sc)
{
	for (int i = 0; i < NSEQ; i++) {
		free(sc[i].toks);
		free(sc[i].logits);
	}
}

static void batched_equals_alone(const char *arch)
{
	struct rig a, b, t;
	struct script sc[NSEQ];
	rig_open(&a, arch, 0, 0, 0);
	run_alone(&a, sc);
	/* passes of 6 rows: the 19-, 33- and 40-token prompts are split, and
	 * split differently from their alone runs */
	rig_open(&b, arch, 6, 0, 32);
	rig_open(&t, arch, 6, 0, 32);
	T_EQ_INT(model_kv_blocks_total(b.m), 32);
	T_OK(model_kv_alloc(b.m));
	T_EQ_INT(model_kv_bytes(b.m), 32 * model_kv_block_bytes(b.m));
	const struct baton_model_config *c = model_config(b.m);
	T_EQ_INT(model_kv_block_bytes(b.m),
	    (uint64_t)c->layers * 2 * BATON_KV_BLOCK * c->kv_heads * c->head_dim * 4);
	run_batched(&b, &t, sc);
	/* and again on the same pool, the free stack now shuffled */
	run_batched(&b, NULL, sc);
	free_script(sc);
	rig_close(&a);
	rig_close(&b);
	rig_close(&t);
}

static void t_batched_qwen3_moe(void)
{
	batched_equals_alone("qwen3_moe");
}

static void t_batched_qwen2_moe(void)
{
	batched_equals_alone("qwen2_moe");
}

static void t_batched_olmoe(void)
{
	batched_equals_alone("olmoe");
}

static void t_batched_mixtral(void)
{
	batched_equals_alone("mixtral");
}

/* The pool's accounting and every refusal, with nothing changed. */
static void t_blocks_and_refusals(void)
{
	struct rig r;
	/* 4 blocks: 64 positions in all; the prefix cache off, as its sequences
	 * share their first tokens (prefix_test.c counts blocks with it on) */
	rig_engine(&r, rig_fixtures(), "qwen3_moe", "qwen3_moe");
	struct baton_model_opts off = { .max_ctx = 64, .kv_blocks = 4, .no_prefix_cache = 1 };
	rig_model(&r, &off);
	const uint32_t V = r.V;
	float *lg = malloc(3 * V * sizeof(float)), *l2 = malloc(3 * V * sizeof(float));
	T_ASSERT(lg && l2);
	uint32_t *toks = kv_ids(64, 9, V);
	struct baton_seq *a, *b, *c;
	T_OK(model_seq_open(r.m, &a));
	T_OK(model_seq_open(r.m, &b));
	T_OK(model_seq_open(r.m, &c));
	T_EQ_INT(model_kv_blocks_total(r.m), 4);
	T_EQ_INT(model_kv_free_blocks(r.m), 4);
	T_EQ_INT(model_seq_blocks_needed(r.m, a, 16), 1);
	T_EQ_INT(model_seq_blocks_needed(r.m, a, 17), 2);

	struct baton_step_item it = { a, toks, 20 };
	T_OK(model_step(r.m, &it, 1, lg));
	T_EQ_INT(model_seq_pos(a), 20);
	T_EQ_INT(model_kv_free_blocks(r.m), 2);
	T_EQ_INT(model_seq_blocks_needed(r.m, a, 12), 0);
	T_EQ_INT(model_seq_blocks_needed(r.m, a, 13), 1);

	/* the pool lacks blocks: refused, whoever else is in the step */
	struct baton_step_item two[2] = { { a, toks + 20, 1 }, { b, toks, 40 } };
	T_EQ_ERR(model_step(r.m, two, 2, lg), BATON_ENOSPC);
	T_EQ_INT(model_seq_pos(a), 20);
	T_EQ_INT(model_seq_pos(b), 0);
	T_EQ_INT(model_kv_free_blocks(r.m), 2);
	/* a sequence twice */
	struct baton_step_item dup[3] = { { a, toks + 20, 1 }, { b, toks, 3 }, { a, toks + 21, 1 } };
	T_EQ_ERR(model_step(r.m, dup, 3, lg), BATON_EINVAL);
	/* a token outside the vocabulary, in the second item */
	uint32_t bad[2] = { 1, V };
	struct baton_step_item badt[2] = { { a, toks + 20, 1 }, { b, bad, 2 } };
	T_EQ_ERR(model_step(r.m, badt, 2, lg), BATON_ERANGE);
	/* past max_ctx (64) */
	struct baton_step_item far = { a, toks, 45 };
	T_EQ_ERR(model_step(r.m, &far, 1, lg), BATON_ERANGE);
	/* empty items, no items */
	struct baton_step_item none = { a, toks, 0 };
	T_EQ_ERR(model_step(r.m, &none, 1, lg), BATON_EINVAL);
	T_EQ_ERR(model_step(r.m, &it, 0, lg), BATON_EINVAL);
	struct baton_step_item nos = { NULL, toks, 1 };
	T_EQ_ERR(model_step(r.m, &nos, 1, lg), BATON_EINVAL);
	T_EQ_INT(model_seq_pos(a), 20);
	T_EQ_INT(model_seq_pos(b), 0);
	T_EQ_INT(model_kv_free_blocks(r.m), 2);

	/* nothing changed: the next steps give what they give on a fresh
	 * model (the refused steps neither moved a position nor left rows) */
	struct baton_step_item ok2[2] = { { a, toks + 20, 1 }, { b, toks, 3 } };
	T_OK(model_step(r.m, ok2, 2, lg));
	T_EQ_INT(model_kv_free_blocks(r.m), 1);
	struct rig f;
	rig_open(&f, "qwen3_moe", 0, 64, 4);
	struct baton_seq *fa, *fb;
	T_OK(model_seq_open(f.m, &fa));
	T_OK(model_seq_open(f.m, &fb));
	struct baton_step_item fi[2] = { { fa, toks, 21 }, { fb, toks, 3 } };
	T_OK(model_step(f.m, fi, 2, l2));
	T_ASSERT(memcmp(lg, l2, 2 * V * sizeof(float)) == 0);

	/* c fills the last block; then even one token of b is refused */
	struct baton_step_item ci = { c, toks, 16 };
	T_OK(model_step(r.m, &ci, 1, lg));
	T_EQ_INT(model_kv_free_blocks(r.m), 0);
	struct baton_step_item bi = { b, toks + 3, 13 };
	T_OK(model_step(r.m, &bi, 1, lg)); /* b's block has room for 13 more */
	bi.n = 1;
	T_EQ_ERR(model_step(r.m, &bi, 1, lg), BATON_ENOSPC);
	T_EQ_INT(model_seq_pos(b), 16);
	/* closing gives every block back at once */
	model_seq_close(r.m, a);
	T_EQ_INT(model_kv_free_blocks(r.m), 2);
	T_OK(model_step(r.m, &bi, 1, lg));
	model_seq_close(r.m, NULL);
	/* the default sequence shares the pool: a prompt too big for what is
	 * left is refused (model_pos stays 0) */
	T_EQ_ERR(model_prefill(r.m, toks, 40, lg), BATON_ENOSPC);
	T_EQ_INT(model_pos(r.m), 0);
	T_OK(model_prefill(r.m, toks, 16, lg));
	T_EQ_INT(model_kv_free_blocks(r.m), 0);
	/* the KV pool given back: every sequence empty, every block free */
	model_kv_release(r.m);
	T_EQ_INT(model_kv_bytes(r.m), 0);
	T_EQ_INT(model_kv_free_blocks(r.m), 4);
	T_EQ_INT(model_seq_pos(b), 0);
	T_EQ_INT(model_seq_pos(c), 0);
	T_EQ_INT(model_pos(r.m), 0);
	T_EQ_ERR(model_decode(r.m, 1, lg), BATON_ESTATE);
	struct baton_step_item again = { b, toks, 21 };
	T_OK(model_step(r.m, &again, 1, lg));
	T_ASSERT(memcmp(lg, l2, V * sizeof(float)) == 0); /* fa's 21 tokens, alone */
	model_seq_close(r.m, b);
	model_seq_close(r.m, c);
	T_EQ_INT(model_kv_free_blocks(r.m), 4);
	free(toks), free(lg), free(l2);
	rig_close(&f);
	rig_close(&r);
}

/* The device fails in the middle of a step of three passes: the first
 * pass finished (its KV rows written, one item's logits out), the third's
 * logits copy fails. Nothing changes: positions, blocks; the same step
 * again gives a fresh model's logits. Host backend (the d2h calls of the
 * step are the model's there: each pass's logits copies, then the copy of
 * its routing choices back for the cache's counts). */
static void t_device_failure_changes_nothing(void)
{
	if (strcmp(rig_backend(), "host") != 0) {
		printf("skip: the host backend's call counts\n");
		return;
	}
	setenv("BATON_FAULT", "d2h:4", 1); /* this case's own process */
	struct rig r, f;
	rig_open(&r, "olmoe", 6, 0, 8);
	const uint32_t V = r.V;
	uint32_t *toks = kv_ids(20, 3, V);
	float *lg = malloc(2 * V * sizeof(float)), *l2 = malloc(2 * V * sizeof(float));
	T_ASSERT(lg && l2);
	struct baton_seq *a, *b;
	T_OK(model_seq_open(r.m, &a));
	T_OK(model_seq_open(r.m, &b));
	/* passes: a 3 + b 3 (a's logits: d2h 1, routing: 2), b 6 (routing: 3),
	 * b 1 (b's logits: d2h 4 fails) */
	struct baton_step_item it[2] = { { a, toks, 3 }, { b, toks + 3, 10 } };
	T_EQ_ERR(model_step(r.m, it, 2, lg), BATON_EIO);
	T_EQ_INT(fault_injected(), 1);
	T_EQ_INT(model_seq_pos(a), 0);
	T_EQ_INT(model_seq_pos(b), 0);
	T_EQ_INT(model_kv_free_blocks(r.m), 8);
	T_OK(model_step(r.m, it, 2, lg));
	T_EQ_INT(model_seq_pos(b), 10);
	T_EQ_INT(model_kv_free_blocks(r.m), 6);
	unsetenv("BATON_FAULT");
	rig_open(&f, "olmoe", 0, 0, 8);
	struct baton_seq *fa, *fb;
	T_OK(model_seq_open(f.m, &fa));
	T_OK(model_seq_open(f.m, &fb));
	struct baton_step_item fi[2] = { { fa, toks, 3 }, { fb, toks + 3, 10 } };
	T_OK(model_step(f.m, fi, 2, l2));
	T_ASSERT(memcmp(lg, l2, 2 * V * sizeof(float)) == 0);
	free(toks), free(lg), free(l2);
	rig_close(&r);
	rig_close(&f);
}

/* A pool too large to address is refused at open. */
static void t_pool_limits(void)
{
	char src[512], dir[64] = "/tmp/baton-kv-XXXXXX", arena[128], err[256] = "";
	T_ASSERT(mkdtemp(dir) != NULL);
	snprintf(arena, sizeof arena, "%s/m.arena", dir);
	snprintf(src, sizeof src, "%s/qwen3_moe", rig_fixtures());
	struct baton_arena_source s = { .kind = BATON_ARENA_SRC_SAFETENSORS, .file = src };
	T_OK(arena_create(arena, &s, NULL, NULL, err, sizeof err));
	struct baton_engine_config ec = { .name = "q", .arena_path = arena, .backend = rig_backend() };
	struct baton_engine *e;
	T_OK(engine_open(&ec, &e, err, sizeof err));
	struct baton_model *m = NULL;
	struct baton_model_opts mo = { .kv_blocks = 1u << 30 };
	T_EQ_ERR(model_open(e, &mo, &m, err, sizeof err), BATON_ERANGE);
	T_ASSERT_MSG(strstr(err, "KV pool"), "message: %s", err);
	T_ASSERT(m == NULL);
	/* the default pool (issue 28): 16 whole contexts where the device has
	 * room (7 blocks each), as many as --max-seqs says */
	mo = (struct baton_model_opts){ .max_ctx = 100 };
	T_OK(model_open(e, &mo, &m, err, sizeof err));
	T_EQ_INT(model_kv_blocks_total(m), 7 * 16);
	uint64_t blk = model_kv_block_bytes(m);
	model_close(m);
	mo = (struct baton_model_opts){ .max_ctx = 100, .kv_seqs = 3 };
	T_OK(model_open(e, &mo, &m, err, sizeof err));
	T_EQ_INT(model_kv_blocks_total(m), 7 * 3);
	model_close(m);
	/* --kv-blocks still decides */
	mo = (struct baton_model_opts){ .max_ctx = 100, .kv_blocks = 9 };
	T_OK(model_open(e, &mo, &m, err, sizeof err));
	T_EQ_INT(model_kv_blocks_total(m), 9);
	model_close(m);
	engine_close(e);
	if (strcmp(rig_backend(), "host") == 0) {
		/* a device whose sixteenth holds 40 blocks: 40, between one context
		 * and sixteen; one whose sixteenth holds less than one context: one.
		 * Host devices of their own, in this test's directory: a capacity
		 * given explicitly is written into the device file, which other
		 * processes of the default directory would then see. */
		const char *was = getenv("BATON_HOSTDEV_DIR");
		char *saved = was ? strdup(was) : NULL;
		setenv("BATON_HOSTDEV_DIR", dir, 1);
		uint64_t want[2] = { 40, 7 }, cap[2] = { 40 * blk * KV_SHARE, 3 * blk * KV_SHARE };
		for (int i = 0; i < 2; i++) {
			ec.host_capacity = (cap[i] + BATON_MIB - 1) / BATON_MIB * BATON_MIB;
			T_OK(engine_open(&ec, &e, err, sizeof err));
			mo = (struct baton_model_opts){ .max_ctx = 100 };
			T_OK(model_open(e, &mo, &m, err, sizeof err));
			uint64_t got = model_kv_blocks_total(m);
			uint64_t w = i == 0 ? ec.host_capacity / KV_SHARE / blk : want[i];
			T_ASSERT_MSG(got == w && (i == 1 || (got > 7 && got < 7 * 16)),
			    "a device of %" PRIu64 " MiB: %" PRIu64 " blocks, want %" PRIu64,
			    ec.host_capacity / BATON_MIB, got, w);
			model_close(m);
			engine_close(e);
		}
		char hd[96];
		snprintf(hd, sizeof hd, "%s/hostdev-0", dir);
		unlink(hd);
		if (saved)
			setenv("BATON_HOSTDEV_DIR", saved, 1);
		else
			unsetenv("BATON_HOSTDEV_DIR");
		free(saved);
	}
	unlink(arena);
	char lock[160];
	snprintf(lock, sizeof lock, "%s.lock", arena);
	unlink(lock);
	rmdir(dir);
}

T_MAIN(T_CASE_TIMEOUT(t_batched_qwen3_moe, 120), T_CASE_TIMEOUT(t_batched_qwen2_moe, 120),
    T_CASE_TIMEOUT(t_batched_olmoe, 120), T_CASE_TIMEOUT(t_batched_mixtral, 120),
    T_CASE_TIMEOUT(t_blocks_and_refusals, 120), T_CASE_TIMEOUT(t_device_failure_changes_nothing, 120),
    T_CASE(t_pool_limits))
