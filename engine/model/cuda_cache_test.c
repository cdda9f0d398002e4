/*
 * cuda_cache_test.c: the expert cache on a real GPU, at full size.
 *
 *   t_big_cache_cycles   a cache of >= 14 GiB: 20 release/refill cycles in
 *                        verify mode with 0 mismatched slots; after each
 *                        release cuMemGetInfo shows the cache's bytes free;
 *                        GEN identical before and after.
 *   t_partial_refill     another allocation takes part of the memory before
 *                        a refill: the refill stops at what fits (partial),
 *                        then completes once that memory is freed.
 *
 * The model is a synthetic arena shaped like one of Qwen3-30B-A3B's layer
 * stacks (d_model 2048, d_ff 768, 128 experts, top-8, bf16), 13 layers:
 * 14.6 GiB of experts. It is made once under /dev/shm/baton (or
 * $BATON_GPU_TEST_ARENA) and reused. Without a GPU every case says skip.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda.h"
#include "engine/model/model.h"
#include "tests/t.h"

#define XXH_INLINE_ALL
#include <xxhash.h>


static int gpu_or_skip(void)
{
	char err[256];
	if (cuda_backend_probe(err, sizeof err) != 0) {
		printf("  skip: %s\n", err);
		return 0;
	}
	return 1;
}

static const char *test_arena(void)
{
	const char *path = getenv("BATON_GPU_TEST_ARENA");
	if (!path)
		path = "/dev/shm/baton/gpu-test.arena";
	struct baton_synth_params p = {
		.layers = 13, .experts = 128, .top_k = 8, .d_model = 2048, .d_ff = 768,
		.dtype = BATON_DT_BF16, .seed = 2026,
	};
	char err[512] = "";
	double t0 = t_now();
	int rc = arena_create_synthetic(path, &p, 0, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "creating %s: %s", path, err);
	printf("  arena %s ready in %.1f s\n", path, t_now() - t0);
	return path;
}

static struct baton_engine *open_cuda(const char *arena, int verify)
{
	struct baton_engine_config cfg = {
		.name = "gpu-test", .arena_path = arena, .backend = "cuda",
		.verify = verify, .warm = 1,
	};
	struct baton_engine *e = NULL;
	char err[512] = "";
	int rc = engine_open(&cfg, &e, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "engine_open: %s: %s", baton_strerror(rc), err);
	return e;
}

static void t_big_cache_cycles(void)
{
	if (!gpu_or_skip())
		return;
	struct baton_engine *e = open_cuda(test_arena(), 1);
	struct baton_engine_info info;
	engine_info(e, &info);
	uint64_t cache = info.cache.mapped_bytes;
	printf("  cache %.2f GiB (%s), %u slots, device %s\n", cache / (double)BATON_GIB,
	    cache_state_name(info.cache.state), info.cache.slots_total, info.gpu);
	T_ASSERT_MSG(cache >= (uint64_t)(14 * (double)BATON_GIB), "cache of %.2f GiB, want >= 14", cache / (double)BATON_GIB);
	T_EQ_INT(info.cache.state, BATON_CACHE_READY);

	uint64_t sum0, sum1;
	T_OK(engine_gen(e, 2, 4, 1234, NULL, NULL, &sum0, NULL));
	uint64_t mismatches = 0;
	double rel_max = 0, ref_max = 0;
	for (int i = 0; i < 20; i++) {
		uint64_t f0, f1, f2, tot;
		struct baton_cache_report r;
		T_OK(engine_mem_info(e, &f0, &tot));
		T_OK(engine_release(e, &r));
		T_OK(engine_mem_info(e, &f1, &tot));
		/* What the driver says is free rose by the cache's bytes (other
		 * processes on the GPU could blur this; the test runs alone). */
		T_ASSERT_MSG(f1 >= f0 + cache, "cycle %d: free rose by %" PRIu64 " bytes, cache is %" PRIu64,
		    i, f1 - f0, cache);
		T_ASSERT(r.bytes_freed >= cache);
		if (r.total_s > rel_max)
			rel_max = r.total_s;
		T_OK(engine_refill(e, &r));
		T_EQ_INT(r.state, BATON_CACHE_READY);
		T_OK(engine_mem_info(e, &f2, &tot));
		T_ASSERT(f2 + cache <= f1);
		mismatches += r.mismatches;
		if (r.total_s > ref_max)
			ref_max = r.total_s;
	}
	T_OK(engine_gen(e, 2, 4, 1234, NULL, NULL, &sum1, NULL));
	printf("  20 cycles: %" PRIu64 " mismatched slots, slowest release %.2f ms, slowest verified refill %.1f ms\n",
	    mismatches, rel_max * 1e3, ref_max * 1e3);
	T_EQ_INT(mismatches, 0);
	T_ASSERT(sum0 == sum1);
	engine_close(e);
}

static void t_partial_refill(void)
{
	if (!gpu_or_skip())
		return;
	struct baton_engine *e = open_cuda(test_arena(), 1);
	struct baton_engine_info info;
	engine_info(e, &info);
	uint64_t cache = info.cache.mapped_bytes, seg = info.cache.segment_bytes;
	uint64_t sum0, sum1;
	T_OK(engine_gen(e, 2, 4, 77, NULL, NULL, &sum0, NULL));
	struct baton_cache_report r;
	T_OK(engine_release(e, &r));

	/* Someone else takes all but half the cache (plus a little for the
	 * driver's own needs). */
	uint64_t fr, tot;
	T_OK(engine_mem_info(e, &fr, &tot));
	const struct baton_backend *be;
	T_OK(backend_find("cuda", &be, NULL, 0));
	struct baton_dev *other;
	char err[256];
	T_OK(be->open(0, 0, &other, err, sizeof err));
	uint64_t take = fr - cache / 2;
	take -= take % (2u << 20);
	baton_dptr p;
	T_OK(be->alloc(other, take, &p));

	T_OK(engine_refill(e, &r));
	T_EQ_INT(r.state, BATON_CACHE_PARTIAL);
	engine_info(e, &info);
	printf("  with %.2f GiB taken: partial at %.2f of %.2f GiB (%" PRIu64 " segments mapped)\n",
	    take / (double)BATON_GIB, info.cache.mapped_bytes / (double)BATON_GIB, cache / (double)BATON_GIB, r.segments_mapped);
	T_ASSERT(info.cache.mapped_bytes < cache);
	T_ASSERT(info.cache.mapped_bytes + 2 * seg >= cache / 2);
	T_EQ_INT(r.mismatches, 0);
	/* GEN still runs on what fit. */
	uint64_t sum_partial;
	T_OK(engine_gen(e, 2, 4, 77, NULL, NULL, &sum_partial, NULL));
	T_ASSERT(sum_partial == sum0);

	be->free(other, p);
	be->close(other);
	T_OK(engine_refill(e, &r));
	T_EQ_INT(r.state, BATON_CACHE_READY);
	T_EQ_INT(r.mismatches, 0);
	engine_info(e, &info);
	T_EQ_INT(info.cache.mapped_bytes, cache);
	T_OK(engine_gen(e, 2, 4, 77, NULL, NULL, &sum1, NULL));
	T_ASSERT(sum1 == sum0);
	engine_close(e);
}

/* The fast path: a refill without verify mode queues every segment and
 * waits once. Read every resident slot back afterwards and compare. */
static void t_fast_refill_bytes(void)
{
	if (!gpu_or_skip())
		return;
	const char *path = test_arena();
	struct baton_engine *e = open_cuda(path, 0);
	struct baton_cache *c = engine_cache(e);
	const struct baton_arena *a = engine_arena(e);
	const struct baton_arena_shape *sh = arena_shape(a);
	struct baton_cache_report r;
	for (int i = 0; i < 3; i++) {
		T_OK(engine_release(e, &r));
		T_OK(engine_refill(e, &r));
		T_EQ_INT(r.state, BATON_CACHE_READY);
	}
	const struct baton_backend *be;
	T_OK(backend_find("cuda", &be, NULL, 0));
	uint64_t slot = arena_max_expert_bytes(a);
	uint8_t *buf = malloc(slot);
	T_ASSERT(buf != NULL);
	uint32_t checked = 0, bad = 0;
	for (uint32_t l = 0; l < sh->layers; l++)
		for (uint32_t x = 0; x < sh->experts; x++) {
			uint32_t item = l * sh->experts + x;
			if (cache_slot_of(c, item) < 0)
				continue;
			struct baton_arena_expert ex;
			baton_dptr blob;
			T_OK(arena_expert(a, l, x, &ex));
			T_OK(cache_lookup(c, &item, 1, &blob));
			T_OK(be->copy_d2h(engine_dev(e), buf, blob, ex.bytes));
			bad += XXH3_64bits(buf, ex.bytes) != ex.checksum;
			checked++;
		}
	printf("  %u resident experts read back after 3 fast refills: %u differ\n", checked, bad);
	T_ASSERT(checked > 1000);
	T_EQ_INT(bad, 0);
	free(buf);
	engine_close(e);
}

T_MAIN(T_CASE_TIMEOUT(t_big_cache_cycles, 500),
    T_CASE_TIMEOUT(t_fast_refill_bytes, 200),
    T_CASE_TIMEOUT(t_partial_refill, 300))
