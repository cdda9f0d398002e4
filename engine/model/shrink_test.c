/* shrink_test.c: the arena truncated under a running engine (issue 14,
 * item 7). What is resident keeps serving; a refill or a load from the
 * shrunk file fails with BATON_ETRUNCATED instead of killing the process
 * with SIGBUS, and nothing read from it becomes resident. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "tests/t.h"

static char dir[256];
static char arena_path[300];

static struct baton_engine *setup_and_open(void)
{
	snprintf(dir, sizeof dir, "/tmp/baton-shrink-test.XXXXXX");
	T_ASSERT(mkdtemp(dir) != NULL);
	snprintf(arena_path, sizeof arena_path, "%s/m.arena", dir);
	struct baton_synth_params p = {
		.layers = 3, .experts = 8, .top_k = 2, .d_model = 128, .d_ff = 256,
		.dtype = BATON_DT_F16, .seed = 11,
	};
	char err[512] = "";
	int rc = arena_create_synthetic(arena_path, &p, 0, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "arena: %s", err);
	setenv("BATON_HOSTDEV_DIR", dir, 1);
	setenv("BATON_HOSTDEV_MIB", "256", 1);
	struct baton_engine_config cfg = {
		.name = "t", .arena_path = arena_path, .backend = "host",
		.cache_bytes = 0, .segment_bytes = 2u << 20, .verify = 0, .warm = 1,
	};
	struct baton_engine *e = NULL;
	rc = engine_open(&cfg, &e, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "engine_open: %s (%s)", baton_strerror(rc), err);
	return e;
}

static void cleanup(void)
{
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	T_ASSERT(system(cmd) == 0);
}

static void t_truncated_then_release_refill(void)
{
	struct baton_engine *e = setup_and_open();
	uint64_t s1, s2, s3;
	T_OK(engine_gen(e, 3, 4, 99, NULL, NULL, &s1, NULL));
	struct baton_arena *a;
	char err[512];
	T_OK(arena_open(arena_path, &a, err, sizeof err));
	uint64_t size = arena_size(a);
	arena_close(a);
	T_ASSERT(truncate(arena_path, (off_t)(size / 2)) == 0);
	/* Everything is resident: it keeps serving, the same answers. */
	T_OK(engine_gen(e, 3, 4, 99, NULL, NULL, &s2, NULL));
	T_EQ_INT(s2, s1);
	/* The way to die: release, then refill from the shrunk file. */
	struct baton_cache_report r;
	T_OK(engine_release(e, &r));
	T_EQ_ERR(engine_refill(e, &r), BATON_ETRUNCATED);
	/* A load from it fails the request, again and again, never SIGBUS;
	 * and zeros never became resident to be served later. */
	T_EQ_ERR(engine_gen(e, 3, 4, 99, NULL, NULL, &s3, NULL), BATON_ETRUNCATED);
	T_EQ_ERR(engine_gen(e, 3, 4, 99, NULL, NULL, &s3, NULL), BATON_ETRUNCATED);
	struct baton_engine_info info;
	engine_info(e, &info);
	T_EQ_INT(info.cache.items_resident, 0);
	/* Put back whole (same generation: a creator's rebuild is a new file,
	 * this is the old inode grown back): still refused, its pages were lost. */
	T_ASSERT(truncate(arena_path, (off_t)size) == 0);
	T_EQ_ERR(engine_refill(e, &r), BATON_ETRUNCATED);
	engine_close(e);
	cleanup();
}

T_MAIN(T_CASE(t_truncated_then_release_refill))
