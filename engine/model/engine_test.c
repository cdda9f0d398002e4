/* engine_test.c: one model on the host backend, end to end: arena, cache,
 * decode loop; outputs identical across release and refill. */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/model/model.h"
#include "tests/t.h"

/* This run's directory, made before main and removed with everything in
 * it when the process that made it exits; each case (a forked child, which
 * leaves by _exit) makes its own below it. */
static char top[64];
static pid_t top_owner;
static char dir[256];
static char arena_path[300];

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

__attribute__((constructor)) static void top_make(void)
{
	snprintf(top, sizeof top, "/tmp/baton-engine-test.XXXXXX");
	if (!mkdtemp(top)) {
		perror("mkdtemp");
		exit(1);
	}
	top_owner = getpid();
}

__attribute__((destructor)) static void top_remove(void)
{
	if (top[0] && getpid() == top_owner)
		nftw(top, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A small synthetic model in a fresh directory, and a fresh host device. */
static void setup(uint32_t dtype, uint64_t hostdev_mib)
{
	snprintf(dir, sizeof dir, "%s/case.XXXXXX", top);
	T_ASSERT(mkdtemp(dir) != NULL);
	snprintf(arena_path, sizeof arena_path, "%s/m.arena", dir);
	struct baton_synth_params p = {
		.layers = 3, .experts = 8, .top_k = 2, .d_model = 128, .d_ff = 256,
		.dtype = dtype, .seed = 11,
	};
	char err[256] = "";
	int rc = arena_create_synthetic(arena_path, &p, 0, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "arena: %s", err);
	setenv("BATON_HOSTDEV_DIR", dir, 1);
	char mib[32];
	snprintf(mib, sizeof mib, "%llu", (unsigned long long)hostdev_mib);
	setenv("BATON_HOSTDEV_MIB", mib, 1);
}

static struct baton_engine *open_engine(uint64_t cache_mib, int verify)
{
	struct baton_engine_config cfg = {
		.name = "t", .arena_path = arena_path, .backend = "host",
		.cache_bytes = cache_mib << 20, .segment_bytes = 2u << 20,
		.verify = verify, .warm = 1,
	};
	struct baton_engine *e = NULL;
	char err[512] = "";
	int rc = engine_open(&cfg, &e, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "engine_open: %s (%s)", baton_strerror(rc), err);
	return e;
}

static void t_gen_same_after_release_refill(void)
{
	const uint32_t dts[] = { BATON_DT_F32, BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0 };
	for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
		setup(dts[d], 256);
		struct baton_engine *e = open_engine(0, 1);
		float out1[4 * 128], out2[4 * 128], out3[4 * 128];
		uint64_t s1, s2, s3;
		T_OK(engine_gen(e, 3, 4, 99, NULL, out1, &s1, NULL));
		struct baton_cache_report r;
		T_OK(engine_release(e, &r));
		T_EQ_INT(r.state, BATON_CACHE_RELEASED);
		/* GEN while released: loads what it needs first. */
		T_OK(engine_gen(e, 3, 4, 99, NULL, out2, &s2, NULL));
		T_OK(engine_refill(e, &r));
		T_EQ_INT(r.mismatches, 0);
		T_OK(engine_gen(e, 3, 4, 99, NULL, out3, &s3, NULL));
		T_ASSERT(memcmp(out1, out2, sizeof out1) == 0);
		T_ASSERT(memcmp(out1, out3, sizeof out1) == 0);
		T_EQ_INT(s1, s3);
		/* The output moved away from the input: the layers did work. */
		uint64_t s4;
		T_OK(engine_gen(e, 4, 4, 99, NULL, NULL, &s4, NULL));
		T_ASSERT(s4 != s1);
		engine_close(e);
	}
}

static void t_release_gives_memory_back(void)
{
	setup(BATON_DT_F16, 256);
	struct baton_engine *e = open_engine(0, 0);
	struct baton_engine_info before, after;
	engine_info(e, &before);
	T_ASSERT(before.cache.mapped_bytes > 0);
	struct baton_cache_report r;
	T_OK(engine_release(e, &r));
	engine_info(e, &after);
	T_EQ_INT(after.cache.mapped_bytes, 0);
	T_EQ_INT(after.dev_free - before.dev_free, before.cache.mapped_bytes);
	engine_close(e);
}

/* The GEN path's routers, norms and activations go back too (a release
 * of everything) and come back by themselves, outputs the same. */
static void t_release_gen(void)
{
	setup(BATON_DT_F16, 256);
	struct baton_engine *e = open_engine(0, 0);
	float out1[2 * 128], out2[2 * 128];
	uint64_t s1, s2;
	T_OK(engine_gen(e, 2, 2, 7, NULL, out1, &s1, NULL));
	struct baton_cache_report r;
	T_OK(engine_release(e, &r));
	struct baton_engine_info a, b, c;
	engine_info(e, &a);
	T_ASSERT(a.dense_bytes > 0);
	uint64_t freed = engine_release_gen(e);
	engine_info(e, &b);
	T_ASSERT(freed > a.dense_bytes);
	T_EQ_INT(b.dense_bytes, 0);
	T_ASSERT(b.dev_free - a.dev_free >= freed); /* the device has it back */
	T_EQ_INT(engine_release_gen(e), 0);         /* idempotent */
	T_OK(engine_gen(e, 2, 2, 7, NULL, out2, &s2, NULL));
	engine_info(e, &c);
	T_EQ_INT(c.dense_bytes, a.dense_bytes);
	T_ASSERT(memcmp(out1, out2, sizeof out1) == 0 && s1 == s2);
	engine_close(e);
}

static void t_small_cache_evicts(void)
{
	/* A cache of one 2 MiB segment holds fewer experts than the model:
	 * GEN still runs, with misses, and gives the same answer as a cache
	 * that holds everything. */
	setup(BATON_DT_F32, 256);
	struct baton_engine *big = open_engine(0, 0);
	uint64_t s_big, s_small;
	T_OK(engine_gen(big, 2, 2, 5, NULL, NULL, &s_big, NULL));
	engine_close(big);
	struct baton_engine *small = open_engine(2, 0);
	T_OK(engine_gen(small, 2, 2, 5, NULL, NULL, &s_small, NULL));
	struct baton_engine_info info;
	engine_info(small, &info);
	T_ASSERT(info.cache.misses > 0);
	T_EQ_INT(s_big, s_small);
	engine_close(small);
}

static void t_bad_gen_arguments(void)
{
	setup(BATON_DT_F16, 256);
	struct baton_engine *e = open_engine(0, 0);
	T_EQ_ERR(engine_gen(e, 0, 1, 1, NULL, NULL, NULL, NULL), BATON_ERANGE);
	T_EQ_ERR(engine_gen(e, 1, 0, 1, NULL, NULL, NULL, NULL), BATON_ERANGE);
	T_EQ_ERR(engine_gen(e, 1, BATON_GEN_MAX_BATCH + 1, 1, NULL, NULL, NULL, NULL), BATON_ERANGE);
	float bad[128];
	for (int i = 0; i < 128; i++)
		bad[i] = 0.0f / 0.0f;
	T_EQ_ERR(engine_gen(e, 1, 1, 1, bad, NULL, NULL, NULL), BATON_ERANGE);
	engine_close(e);
}

static void t_open_errors(void)
{
	setup(BATON_DT_F16, 256);
	struct baton_engine_config cfg = { .name = "t", .arena_path = "/nonexistent/x.arena",
		.backend = "host", .warm = 1 };
	struct baton_engine *e = NULL;
	char err[512] = "";
	T_ASSERT(engine_open(&cfg, &e, err, sizeof err) != 0);
	T_ASSERT(e == NULL);
	T_ASSERT(strstr(err, "/nonexistent/x.arena") != NULL);
	cfg.arena_path = arena_path;
	cfg.backend = "tpu";
	T_EQ_ERR(engine_open(&cfg, &e, err, sizeof err), BATON_EINVAL);
}

/* "auto" on the host backend beside a GPU (faked: BATON_TEST_GPU_NODE
 * names a file that exists) says so; without one, or with "host" asked,
 * it says nothing; "cuda" in a build without it is an error. */
static void t_host_fallback_warns(void)
{
	setup(BATON_DT_F16, 256);
	struct baton_engine_config cfg = { .name = "t", .arena_path = arena_path,
		.backend = "auto", .segment_bytes = 2u << 20, .warm = 0 };
	struct baton_engine *e = NULL;
	char err[512] = "";
	struct baton_engine_info info;
	setenv("BATON_TEST_GPU_NODE", arena_path, 1);
	T_OK(engine_open(&cfg, &e, err, sizeof err));
	engine_info(e, &info);
	if (strcmp(info.backend, "host") == 0) { /* a CUDA build on a machine with a GPU: cuda */
		T_ASSERT(info.backend_warning != NULL);
		T_ASSERT_MSG(strstr(info.backend_warning, "HOST backend") &&
		    strstr(info.backend_warning, arena_path), "%s", info.backend_warning);
#ifndef BATON_HAVE_CUDA
		T_ASSERT_MSG(strstr(info.backend_warning, "no CUDA backend"), "%s", info.backend_warning);
#endif
	}
	engine_close(e);
	cfg.backend = "host";
	T_OK(engine_open(&cfg, &e, err, sizeof err));
	engine_info(e, &info);
	T_ASSERT(info.backend_warning == NULL);
	engine_close(e);
	setenv("BATON_TEST_GPU_NODE", "/nonexistent/nvidia0", 1);
	cfg.backend = "auto";
	T_OK(engine_open(&cfg, &e, err, sizeof err));
	engine_info(e, &info);
	T_ASSERT(info.backend_warning == NULL);
	engine_close(e);
	unsetenv("BATON_TEST_GPU_NODE");
#ifndef BATON_HAVE_CUDA
	cfg.backend = "cuda";
	T_EQ_ERR(engine_open(&cfg, &e, err, sizeof err), BATON_ENODEV);
	T_ASSERT_MSG(strstr(err, "no CUDA backend"), "%s", err);
#endif
}

/* whole_cache: every expert has a slot, whatever the device has free. */
static void t_whole_cache_holds_every_expert(void)
{
	setup(BATON_DT_F16, 256);
	struct baton_engine_config cfg = { .name = "t", .arena_path = arena_path,
		.backend = "host", .segment_bytes = 2u << 20, .whole_cache = 1, .warm = 1 };
	struct baton_engine *e = NULL;
	char err[512] = "";
	T_OK(engine_open(&cfg, &e, err, sizeof err));
	struct baton_engine_info info;
	engine_info(e, &info);
	T_ASSERT(info.cache.slots_total >= info.layers * info.experts);
	T_EQ_INT(info.cache.items_resident, info.layers * info.experts);
	engine_close(e);
}

T_MAIN(T_CASE_TIMEOUT(t_gen_same_after_release_refill, 60),
    T_CASE(t_host_fallback_warns),
    T_CASE(t_whole_cache_holds_every_expert),
    T_CASE(t_release_gives_memory_back),
    T_CASE(t_release_gen),
    T_CASE(t_small_cache_evicts),
    T_CASE(t_bad_gen_arguments),
    T_CASE(t_open_errors))
