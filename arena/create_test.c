/*
 * create_test.c: creating arenas: the layout contract, the synthetic
 * values and their determinism (the dtype table, codec and encoders are
 * dtype_test.c's), the lock
 * (a second creator waits, then reuses), stale temporary files, reuse and
 * replacement rules, and bad parameters.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <sys/file.h>
#include <sys/wait.h>

#include "arena/arena_int.h"
#include "tests/arena_util.h"

static char dir[PATH_MAX - 64];

static void mkpath(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

/* ---- layout and values ---------------------------------------------------------- */

static void check_layout(const struct baton_arena *a)
{
	const struct baton_arena_shape *s = arena_shape(a);
	uint64_t next = 0, maxb = 0;
	for (uint32_t l = 0; l < s->layers; l++)
		for (uint32_t x = 0; x < s->experts; x++) {
			struct baton_arena_expert e;
			struct baton_arena_tensor p[3];
			T_OK(arena_expert(a, l, x, &e));
			T_OK(arena_expert_parts(a, l, x, p));
			T_EQ_INT(e.offset % BATON_ARENA_ALIGN, 0);
			T_ASSERT(e.blob == (const uint8_t *)arena_base(a) + e.offset);
			/* neighbours in (layer, expert) are neighbours in the file */
			if (next)
				T_EQ_INT(e.offset, next);
			next = arena_align_up(e.offset + e.bytes, BATON_ARENA_ALIGN);
			T_EQ_INT(e.gate_off, 0);
			T_EQ_INT(e.up_off % 256, 0);
			T_EQ_INT(e.down_off % 256, 0);
			T_ASSERT(e.up_off >= p[0].bytes && e.down_off >= e.up_off + p[1].bytes);
			T_EQ_INT(e.bytes, e.down_off + p[2].bytes);
			T_EQ_INT(p[0].rows, s->d_ff);
			T_EQ_INT(p[0].cols, s->d_model);
			T_EQ_INT(p[2].rows, s->d_model);
			T_EQ_INT(p[2].cols, s->d_ff);
			T_EQ_INT(p[0].bytes, baton_dtype_row_bytes((int)p[0].dtype, s->d_model) * s->d_ff);
			T_ASSERT(p[1].data == e.blob + e.up_off);
			if (e.bytes > maxb)
				maxb = e.bytes;
		}
	T_EQ_INT(arena_max_expert_bytes(a), arena_align_up(maxb, BATON_ARENA_ALIGN));
	T_EQ_INT(arena_expert(a, s->layers, 0, &(struct baton_arena_expert){ 0 }), BATON_ENOTFOUND);
	T_EQ_INT(arena_expert(a, 0, s->experts, &(struct baton_arena_expert){ 0 }), BATON_ENOTFOUND);
	struct baton_arena_tensor t;
	T_EQ_ERR(arena_tensor(a, s->layers, BATON_ROLE_ROUTER, &t), BATON_ENOTFOUND);
	T_EQ_ERR(arena_tensor(a, 0, BATON_ROLE_EXPERT, &t), BATON_EINVAL);
	T_OK(arena_tensor(a, 0, BATON_ROLE_ROUTER, &t));
	T_EQ_INT(t.rows, s->experts);
	T_EQ_INT(t.cols, s->d_model);
	T_EQ_INT(t.dtype, BATON_DT_F32);
	T_OK(arena_tensor(a, s->layers - 1, BATON_ROLE_NORM, &t));
	T_EQ_INT(t.rows, 1);
	T_EQ_INT(t.cols, s->d_model);
}

static float value_at(const struct baton_arena_tensor *t, uint64_t i)
{
	const uint8_t *p = t->data;
	uint16_t h;
	switch (t->dtype) {
	case BATON_DT_F32: { float f; memcpy(&f, p + 4 * i, 4); return f; }
	case BATON_DT_F16: memcpy(&h, p + 2 * i, 2); return baton_f16_to_f32(h);
	case BATON_DT_BF16: memcpy(&h, p + 2 * i, 2); return baton_bf16_to_f32(h);
	case BATON_DT_Q8_0:
		memcpy(&h, p + 34 * (i / 32), 2);
		return baton_f16_to_f32(h) * (float)(int8_t)p[34 * (i / 32) + 2 + i % 32];
	default: T_FAIL("dtype %u", t->dtype);
	}
}

static void check_values(const struct baton_arena *a)
{
	const struct baton_arena_shape *s = arena_shape(a);
	float lim_in = 1.0f / sqrtf((float)s->d_model), lim_down = 1.0f / sqrtf((float)s->d_ff);
	for (uint32_t l = 0; l < s->layers; l++)
		for (uint32_t x = 0; x < s->experts; x++) {
			struct baton_arena_tensor p[3];
			T_OK(arena_expert_parts(a, l, x, p));
			for (int k = 0; k < 3; k++) {
				float lim = (k == 2 ? lim_down : lim_in) * 1.01f;
				uint64_t n = (uint64_t)p[k].rows * p[k].cols;
				double sum = 0, sq = 0, amax = 0;
				for (uint64_t i = 0; i < n; i++) {
					float v = value_at(&p[k], i);
					T_ASSERT_MSG(fabsf(v) <= lim, "layer %u expert %u part %d: %g past %g",
					    l, x, k, v, lim);
					sum += v;
					sq += (double)v * v;
					amax = fmax(amax, fabs(v));
				}
				/* uniform in [-s, s): mean ~0, rms ~s/sqrt(3) */
				double rms = sqrt(sq / (double)n), want = (k == 2 ? lim_down : lim_in) / sqrt(3.0);
				T_ASSERT_MSG(fabs(rms / want - 1) < 0.1, "rms %g, want %g", rms, want);
				T_ASSERT(fabs(sum / (double)n) < want * 0.1);
			}
		}
	struct baton_arena_tensor t;
	T_OK(arena_tensor(a, 0, BATON_ROLE_NORM, &t));
	for (uint32_t i = 0; i < t.cols; i++) {
		float v = value_at(&t, i);
		T_ASSERT(v >= 0.9f && v <= 1.1f);
	}
	T_OK(arena_tensor(a, 1, BATON_ROLE_ROUTER, &t));
	for (uint64_t i = 0; i < (uint64_t)t.rows * t.cols; i++)
		T_ASSERT(fabsf(value_at(&t, i)) <= lim_in);
}

static void t_synthetic_layout_and_values(void)
{
	au_tmpdir(dir, sizeof dir);
	static const uint32_t dts[] = { BATON_DT_F32, BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0 };
	for (size_t i = 0; i < 4; i++) {
		char path[PATH_MAX];
		mkpath(path, sizeof path, baton_dtype_name((int)dts[i]));
		struct baton_synth_params p = {
			.layers = 3, .experts = 5, .top_k = 2, .d_model = 96, .d_ff = 160,
			.dtype = dts[i], .seed = 11,
		};
		au_create(path, &p);
		struct baton_arena *a;
		char msg[256];
		T_OK(arena_open(path, &a, msg, sizeof msg));
		const struct baton_arena_shape *s = arena_shape(a);
		T_EQ_INT(s->layers, 3);
		T_EQ_INT(s->experts, 5);
		T_EQ_INT(s->top_k, 2);
		T_EQ_INT(s->d_model, 96);
		T_EQ_INT(s->d_ff, 160);
		T_EQ_INT(s->gate_dtype, dts[i]);
		T_EQ_INT(s->down_dtype, dts[i]);
		T_EQ_INT(s->router_dtype, BATON_DT_F32);
		T_EQ_INT(s->norm_dtype, BATON_DT_F32);
		T_ASSERT(arena_generation(a) != 0);
		T_ASSERT(strstr(arena_source(a), "synthetic seed=11") != NULL);
		uint32_t d[3];
		T_OK(arena_layer_dtypes(a, 2, d));
		T_EQ_INT(d[1], dts[i]);
		T_EQ_ERR(arena_layer_dtypes(a, 3, d), BATON_ENOTFOUND);
		check_layout(a);
		check_values(a);
		uint64_t nbad = 1;
		T_OK(arena_verify(a, &nbad, msg, sizeof msg));
		T_EQ_INT(nbad, 0);
		arena_close(a);
	}
	au_rmdir(dir);
}

/* Every entry's checksum, in table order. */
static void sums(const char *path, uint64_t *out, size_t n)
{
	struct baton_arena *a;
	char msg[256];
	T_OK(arena_open(path, &a, msg, sizeof msg));
	const struct baton_arena_shape *s = arena_shape(a);
	size_t k = 0;
	for (uint32_t l = 0; l < s->layers; l++)
		for (uint32_t x = 0; x < s->experts; x++) {
			struct baton_arena_expert e;
			T_OK(arena_expert(a, l, x, &e));
			T_ASSERT(k < n);
			out[k++] = e.checksum;
		}
	struct baton_arena_tensor t;
	T_OK(arena_tensor(a, 1, BATON_ROLE_ROUTER, &t));
	T_ASSERT(k < n);
	out[k++] = t.checksum;
	arena_close(a);
}

static void t_synthetic_deterministic(void)
{
	au_tmpdir(dir, sizeof dir);
	struct baton_synth_params p = au_small();
	p.experts = 7;
	p.dtype = BATON_DT_Q8_0;
	char a1[PATH_MAX], a2[PATH_MAX], a3[PATH_MAX];
	mkpath(a1, sizeof a1, "one.arena");
	mkpath(a2, sizeof a2, "many.arena");
	mkpath(a3, sizeof a3, "seed.arena");
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = p };
	struct baton_create_opts o1 = { .threads = 1 }, o8 = { .threads = 8 };
	char msg[256];
	T_OK(arena_create(a1, &src, &o1, NULL, msg, sizeof msg));
	T_OK(arena_create(a2, &src, &o8, NULL, msg, sizeof msg));
	src.synth.seed++;
	T_OK(arena_create(a3, &src, &o8, NULL, msg, sizeof msg));
	uint64_t s1[16], s2[16], s3[16];
	sums(a1, s1, 16);
	sums(a2, s2, 16);
	sums(a3, s3, 16);
	for (int i = 0; i < 15; i++) {
		T_ASSERT_MSG(s1[i] == s2[i], "entry %d differs between 1 and 8 threads", i);
		T_ASSERT_MSG(s1[i] != s3[i], "entry %d the same for another seed", i);
		for (int j = 0; j < i; j++)
			T_ASSERT_MSG(s1[i] != s1[j], "entries %d and %d are the same", i, j);
	}
	/* The data bytes are the same; headers differ only in generation and time. */
	size_t l1, l2;
	uint8_t *b1 = au_read(a1, &l1), *b2 = au_read(a2, &l2);
	T_EQ_INT(l1, l2);
	T_ASSERT(memcmp(b1 + 4096, b2 + 4096, l1 - 4096) == 0);
	free(b1);
	free(b2);
	au_rmdir(dir);
}

/* ---- creation rules ---------------------------------------------------------------- */

static void t_reuse_and_replace(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], msg[512];
	mkpath(path, sizeof path, "m.arena");
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = au_small() };
	struct baton_create_result r;
	T_OK(arena_create(path, &src, NULL, &r, msg, sizeof msg));
	T_EQ_INT(r.reused, 0);
	uint64_t g1 = r.generation;
	T_ASSERT(g1 != 0);
	T_OK(arena_create(path, &src, NULL, &r, msg, sizeof msg));
	T_EQ_INT(r.reused, 1);
	T_EQ_INT(r.generation, g1);
	/* Forced: rebuilt, a newer generation. */
	struct baton_create_opts force = { .force = 1 };
	T_OK(arena_create(path, &src, &force, &r, msg, sizeof msg));
	T_EQ_INT(r.reused, 0);
	T_ASSERT(r.generation > g1);
	uint64_t g2 = r.generation;
	/* Another model at the path: refused without force. */
	src.synth.seed = 99;
	T_EQ_ERR(arena_create(path, &src, NULL, &r, msg, sizeof msg), BATON_EEXIST);
	T_ASSERT(strstr(msg, "another arena") != NULL && strstr(msg, "force") != NULL);
	T_EQ_ERR(arena_create_synthetic(path, &src.synth, 0, msg, sizeof msg), BATON_EEXIST);
	T_OK(arena_create_synthetic(path, &src.synth, 1, msg, sizeof msg));
	struct baton_arena *a;
	T_OK(arena_open(path, &a, msg, sizeof msg));
	T_ASSERT(arena_generation(a) > g2);
	T_ASSERT(strstr(arena_source(a), "seed=99") != NULL);
	arena_close(a);
	/* A broken file at the path is replaced without force. */
	au_write(path, "garbage", 7);
	T_OK(arena_create(path, &src, NULL, &r, msg, sizeof msg));
	T_EQ_INT(r.reused, 0);
	T_OK(arena_open(path, &a, msg, sizeof msg));
	arena_close(a);
	/* Folders are made as needed. */
	char deep[PATH_MAX];
	mkpath(deep, sizeof deep, "x");
	T_ASSERT(mkdir(deep, 0755) == 0);
	mkpath(deep, sizeof deep, "x/y.arena");
	T_OK(arena_create(deep, &src, NULL, &r, msg, sizeof msg));
	unlink(deep);
	mkpath(deep, sizeof deep, "x/y.arena.lock");
	unlink(deep);
	mkpath(deep, sizeof deep, "x");
	rmdir(deep);
	au_rmdir(dir);
}

static void t_stale_tmp_removed(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], t1[PATH_MAX], t2[PATH_MAX], other[PATH_MAX], msg[256];
	mkpath(path, sizeof path, "s.arena");
	mkpath(t1, sizeof t1, "s.arena.tmp.999999");
	mkpath(t2, sizeof t2, "s.arena.tmp.12");
	mkpath(other, sizeof other, "s.arena.tmp.notapid");
	/* What a killed creator leaves: an unsealed image. */
	struct baton_synth_params p = au_small();
	au_create(path, &p);
	size_t len;
	uint8_t *b = au_read(path, &len);
	((struct arena_file_header *)(void *)b)->sealed = 0;
	au_write(t1, b, len);
	au_write(t2, b, len / 3);
	au_write(other, "x", 1);
	free(b);
	struct baton_arena *a;
	T_EQ_ERR(arena_open(t1, &a, msg, sizeof msg), BATON_EUNSEALED);
	T_EQ_ERR(arena_open(t2, &a, msg, sizeof msg), BATON_EUNSEALED);
	unlink(path);
	T_OK(arena_create_synthetic(path, &p, 0, msg, sizeof msg));
	T_ASSERT(access(t1, F_OK) != 0 && errno == ENOENT);
	T_ASSERT(access(t2, F_OK) != 0);
	T_ASSERT(access(other, F_OK) == 0); /* not ours */
	au_rmdir(dir);
}

/* A creator waits while another holds the lock, then finds the arena the
 * other made and uses it. */
static void t_lock_waits(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], lock[PATH_MAX], msg[256];
	mkpath(path, sizeof path, "l.arena");
	mkpath(lock, sizeof lock, "l.arena.lock");
	int fd = open(lock, O_RDWR | O_CREAT, 0644);
	T_ASSERT(fd >= 0 && flock(fd, LOCK_EX) == 0);
	int pfd[2];
	T_ASSERT(pipe(pfd) == 0);
	pid_t pid = fork();
	if (pid == 0) {
		struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = au_small() };
		struct baton_create_result r;
		int rc = arena_create(path, &src, NULL, &r, msg, sizeof msg);
		char out = rc ? 'E' : r.reused ? 'R' : 'B';
		(void)!write(pfd[1], &out, 1);
		_exit(0);
	}
	usleep(300 * 1000);
	int st;
	T_ASSERT_MSG(waitpid(pid, &st, WNOHANG) == 0, "the second creator did not wait for the lock");
	/* Meanwhile the lock holder (us) puts a finished arena in place: built
	 * beside it by another process (its own path, its own lock) and
	 * renamed in, as a creator's last step does. */
	struct baton_synth_params p = au_small();
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = p };
	pid_t b = fork();
	if (b == 0) {
		char side[PATH_MAX];
		struct baton_create_result r;
		mkpath(side, sizeof side, "side.arena");
		_exit(arena_create(side, &src, NULL, &r, msg, sizeof msg) == 0 &&
		    rename(side, path) == 0 ? 0 : 1);
	}
	T_ASSERT(waitpid(b, &st, 0) == b && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	T_ASSERT(waitpid(pid, &st, WNOHANG) == 0);
	flock(fd, LOCK_UN);
	close(fd);
	char out = 0;
	T_ASSERT(read(pfd[0], &out, 1) == 1);
	T_ASSERT(waitpid(pid, &st, 0) == pid);
	T_ASSERT_MSG(out == 'R', "the waiting creator said %c, want R (reused)", out);
	au_rmdir(dir);
}

/* N creators of the same arena at once: exactly one builds, all succeed,
 * and the result verifies. */
static void t_concurrent_creators(void)
{
	au_tmpdir(dir, sizeof dir);
	for (int round = 0; round < 5; round++) {
		char path[PATH_MAX], name[32];
		snprintf(name, sizeof name, "c%d.arena", round);
		mkpath(path, sizeof path, name);
		enum { N = 4 };
		int pfd[2];
		T_ASSERT(pipe(pfd) == 0);
		pid_t kids[N];
		for (int i = 0; i < N; i++) {
			kids[i] = fork();
			if (kids[i] == 0) {
				struct baton_synth_params p = au_small();
				p.layers = 4;
				p.experts = 16;
				p.d_model = 256;
				p.d_ff = 512;
				struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = p };
				struct baton_create_result r;
				char msg[256];
				int rc = arena_create(path, &src, NULL, &r, msg, sizeof msg);
				char out = rc ? 'E' : r.reused ? 'R' : 'B';
				(void)!write(pfd[1], &out, 1);
				_exit(0);
			}
		}
		close(pfd[1]);
		int built = 0, reused = 0;
		char out;
		while (read(pfd[0], &out, 1) == 1) {
			built += out == 'B';
			reused += out == 'R';
		}
		close(pfd[0]);
		for (int i = 0; i < N; i++)
			waitpid(kids[i], NULL, 0);
		T_EQ_INT(built, 1);
		T_EQ_INT(reused, N - 1);
		struct baton_arena *a;
		char msg[256];
		T_OK(arena_open(path, &a, msg, sizeof msg));
		T_OK(arena_verify(a, NULL, msg, sizeof msg));
		arena_close(a);
	}
	au_rmdir(dir);
}

static void t_bad_params(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], msg[256];
	mkpath(path, sizeof path, "b.arena");
	static const struct {
		struct baton_synth_params p;
		int err;
		const char *word;
	} bad[] = {
		{ { .layers = 0, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "layers" },
		{ { .layers = 5000, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "layers" },
		{ { .layers = 2, .experts = 0, .top_k = 1, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "experts" },
		{ { .layers = 2, .experts = 4, .top_k = 5, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "top-k" },
		{ { .layers = 2, .experts = 4, .top_k = 0, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "top-k" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 0, .d_ff = 64, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "d_model" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 1u << 20, .dtype = BATON_DT_F16, .seed = 1 }, BATON_EINVAL, "d_ff" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_Q5_K, .seed = 1 }, BATON_EUNSUPPORTED, "q5_K" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 256, .d_ff = 64, .dtype = BATON_DT_Q4_K, .seed = 1 }, BATON_EINVAL, "multiples of 256" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = 77, .seed = 1 }, BATON_EUNSUPPORTED, "unknown" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 48, .d_ff = 64, .dtype = BATON_DT_Q8_0, .seed = 1 }, BATON_EINVAL, "multiples of 32" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		msg[0] = '\0';
		T_EQ_ERR(arena_create_synthetic(path, &bad[i].p, 0, msg, sizeof msg), bad[i].err);
		T_ASSERT_MSG(strstr(msg, bad[i].word) != NULL, "\"%s\" lacks \"%s\"", msg, bad[i].word);
		T_ASSERT(access(path, F_OK) != 0);
	}
	struct baton_synth_params ok = au_small();
	T_EQ_ERR(arena_create_synthetic("", &ok, 0, msg, sizeof msg), BATON_EINVAL);
	T_EQ_ERR(arena_create_synthetic(path, NULL, 0, msg, sizeof msg), BATON_EINVAL);
	char slash[PATH_MAX];
	mkpath(slash, sizeof slash, "d/");
	T_EQ_ERR(arena_create_synthetic(slash, &ok, 0, msg, sizeof msg), BATON_EINVAL);
	struct baton_arena_source src = { .kind = 42 };
	T_EQ_ERR(arena_create(path, &src, NULL, NULL, msg, sizeof msg), BATON_EINVAL);
	T_EQ_ERR(arena_create_gguf(path, "/nonexistent.gguf", 0, msg, sizeof msg), BATON_ENOTFOUND);
	T_EQ_ERR(arena_create_safetensors(path, "/nonexistent", 0, 0, msg, sizeof msg),
	    BATON_ENOTFOUND);
	/* Where the folder cannot be made. */
	T_EQ_ERR(arena_create_synthetic("/proc/baton/x.arena", &ok, 0, msg, sizeof msg), BATON_EIO);

	char buf[64];
	T_OK(arena_default_path("qwen", buf, sizeof buf));
	T_EQ_STR(buf, "/dev/shm/baton/qwen.arena");
	T_EQ_ERR(arena_default_path("a/b", buf, sizeof buf), BATON_EINVAL);
	T_EQ_ERR(arena_default_path("", buf, sizeof buf), BATON_EINVAL);
	T_EQ_ERR(arena_default_path("..", buf, sizeof buf), BATON_EINVAL);
	T_EQ_ERR(arena_default_path("a-very-long-name-that-does-not-fit-at-all-in-64", buf, sizeof buf),
	    BATON_ETOOBIG);
	au_rmdir(dir);
}

/* The arena is mapped read-only: a write faults. */
static void t_mapping_read_only(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], msg[256];
	mkpath(path, sizeof path, "r.arena");
	struct baton_synth_params p = au_small();
	au_create(path, &p);
	pid_t pid = fork();
	if (pid == 0) {
		struct baton_arena *a;
		if (arena_open(path, &a, msg, sizeof msg))
			_exit(3);
		struct baton_arena_expert e;
		arena_expert(a, 0, 1, &e);
		int devnull = open("/dev/null", O_WRONLY);
		if (devnull >= 0)
			dup2(devnull, 2); /* AddressSanitizer's report of the fault */
		((volatile uint8_t *)(uintptr_t)e.blob)[0] = 1;
		_exit(0);
	}
	int st;
	T_ASSERT(waitpid(pid, &st, 0) == pid);
	/* Killed by the fault, or (under AddressSanitizer, whose handler takes
	 * the SEGV) exited nonzero; 0 means the write went through, 3 no open. */
	T_ASSERT_MSG((WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS)) ||
	    (WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 3),
	    "a write into the arena did not fault (status 0x%x)", st);
	au_rmdir(dir);
}

/* ---- whole synthetic models (format v2) ------------------------------------ */

static float f32_at(const struct baton_arena_tensor *t, uint64_t i)
{
	float v;
	memcpy(&v, t->data + 4 * i, 4);
	return v;
}

static void t_synthetic_model(void)
{
	au_tmpdir(dir, sizeof dir);
	static const char *const archs[] = { "qwen3_moe", "qwen2_moe", "mixtral", "olmoe" };
	for (size_t i = 0; i < 4; i++) {
		char path[PATH_MAX], path1[PATH_MAX], name[64];
		snprintf(name, sizeof name, "%s.arena", archs[i]);
		mkpath(path, sizeof path, name);
		snprintf(name, sizeof name, "%s-1.arena", archs[i]);
		mkpath(path1, sizeof path1, name);
		struct baton_synth_params p = {
			.arch = archs[i], .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 96,
			.heads = 4, .kv_heads = 2, .head_dim = 32, .vocab = 128, .shared_ff = 64,
			.dtype = i % 2 ? BATON_DT_BF16 : BATON_DT_Q8_0, .seed = 21,
		};
		struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = p };
		struct baton_create_opts o1 = { .threads = 1 }, o4 = { .threads = 4 };
		char msg[512] = "";
		T_ASSERT_MSG((arena_create(path, &src, &o4, NULL, msg, sizeof msg)) == 0, "%s", msg);
		T_ASSERT_MSG((arena_create(path1, &src, &o1, NULL, msg, sizeof msg)) == 0, "%s", msg);
		struct baton_arena *a, *b;
		T_OK(arena_open(path, &a, msg, sizeof msg));
		T_OK(arena_open(path1, &b, msg, sizeof msg));
		T_EQ_STR(arena_arch(a), archs[i]);
		/* exactly the architecture's tensors, with its shapes */
		struct arena_model_cfg c = { 0 };
		snprintf(c.arch, sizeof c.arch, "%s", archs[i]);
		c.layers = 2, c.experts = 4, c.top_k = 2, c.hidden = 64, c.moe_ff = 96, c.heads = 4;
		c.kv_heads = 2, c.head_dim = 32, c.vocab = 128;
		c.shared_ff = strcmp(archs[i], "qwen2_moe") == 0 ? 64 : 0;
		c.qkv_bias = strcmp(archs[i], "qwen2_moe") == 0;
		struct arena_model_tensor *mt;
		uint64_t nt;
		T_OK(arena_model_tensors(&c, &mt, &nt, msg, sizeof msg));
		T_EQ_INT(arena_dense_count(a), nt);
		for (uint64_t k = 0; k < nt; k++) {
			struct baton_arena_tensor t, u;
			T_ASSERT_MSG((arena_dense(a, mt[k].name, &t)) == 0, "%s", mt[k].name);
			T_ASSERT_MSG(t.rows == mt[k].rows && t.cols == mt[k].cols, "%s: %ux%u", mt[k].name,
			    t.rows, t.cols);
			/* the same bytes whatever the thread count */
			T_OK(arena_dense(b, mt[k].name, &u));
			T_ASSERT_MSG(t.checksum == u.checksum, "%s differs with 1 thread", mt[k].name);
			if (mt[k].kind == ARENA_MT_NORM) {
				T_EQ_INT(t.dtype, BATON_DT_F32);
				for (uint32_t j = 0; j < t.cols; j++)
					T_ASSERT(f32_at(&t, j) >= 0.9f && f32_at(&t, j) <= 1.1f);
			} else if (mt[k].role == BATON_ROLE_ROUTER) {
				struct baton_arena_tensor r;
				T_OK(arena_tensor(a, mt[k].layer, BATON_ROLE_ROUTER, &r));
				T_ASSERT(r.data == t.data && r.dtype == BATON_DT_F32);
				for (uint64_t j = 0; j < (uint64_t)t.rows * t.cols; j++)
					T_ASSERT(fabsf(f32_at(&t, j)) <= 1.0f / sqrtf((float)t.cols));
			} else if (t.rows > 1) {
				T_EQ_INT(t.dtype, p.dtype);
			}
		}
		free(mt);
		for (uint32_t l = 0; l < 2; l++)
			for (uint32_t x = 0; x < 4; x++) {
				struct baton_arena_expert e, f;
				T_OK(arena_expert(a, l, x, &e));
				T_OK(arena_expert(b, l, x, &f));
				T_ASSERT(e.checksum == f.checksum);
			}
		const void *cfg;
		uint64_t len;
		T_OK(arena_blob(a, "config.json", &cfg, &len));
		json_t *j = json_loadb(cfg, (size_t)len, 0, NULL);
		T_ASSERT(j != NULL);
		struct arena_model_cfg back;
		T_ASSERT_MSG((arena_model_from_config(j, &back, msg, sizeof msg)) == 0, "%s", msg);
		T_EQ_INT(back.head_dim, 32);
		T_EQ_INT(back.kv_heads, 2);
		T_EQ_INT(back.vocab, 128);
		T_EQ_INT(back.moe_ff, 96);
		T_EQ_INT(back.shared_ff, c.shared_ff);
		json_decref(j);
		uint64_t nbad = 1;
		T_OK(arena_verify(a, &nbad, msg, sizeof msg));
		arena_close(a);
		arena_close(b);
	}
	au_rmdir(dir);
}

static void t_synthetic_model_bad(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], msg[256];
	mkpath(path, sizeof path, "b.arena");
	static const struct {
		struct baton_synth_params p;
		int err;
		const char *word;
	} bad[] = {
		{ { .arch = "llama", .layers = 1, .experts = 2, .top_k = 1, .d_model = 64, .d_ff = 64,
		    .dtype = BATON_DT_F16 }, BATON_EUNSUPPORTED, "\"llama\"" },
		{ { .arch = "qwen3_moe", .layers = 1, .experts = 2, .top_k = 1, .d_model = 64, .d_ff = 64,
		    .heads = 4, .kv_heads = 3, .dtype = BATON_DT_F16 }, BATON_EINVAL, "3 key/value heads" },
		{ { .arch = "qwen3_moe", .layers = 1, .experts = 2, .top_k = 1, .d_model = 64, .d_ff = 64,
		    .head_dim = 7, .dtype = BATON_DT_F16 }, BATON_EINVAL, "heads of 7" },
		{ { .arch = "mixtral", .layers = 1, .experts = 2, .top_k = 1, .d_model = 64, .d_ff = 64,
		    .vocab = 1u << 25, .dtype = BATON_DT_F16 }, BATON_EINVAL, "vocabulary" },
		{ { .arch = "olmoe", .layers = 1, .experts = 2, .top_k = 1, .d_model = 64, .d_ff = 64,
		    .heads = 2, .head_dim = 40, .dtype = BATON_DT_Q8_0 }, BATON_EINVAL, "not a multiple of 32" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		msg[0] = '\0';
		T_EQ_ERR(arena_create_synthetic(path, &bad[i].p, 0, msg, sizeof msg), bad[i].err);
		T_ASSERT_MSG(strstr(msg, bad[i].word) != NULL, "\"%s\" lacks \"%s\"", msg, bad[i].word);
		T_ASSERT(access(path, F_OK) != 0);
	}
	struct baton_synth_params p = { .dtype = BATON_DT_BF16, .seed = 4 };
	T_OK(arena_synth_preset("qwen3-30b-a3b", &p));
	T_EQ_STR(p.arch, "qwen3_moe");
	T_ASSERT(p.layers == 48 && p.experts == 128 && p.top_k == 8 && p.d_model == 2048 &&
	    p.d_ff == 768 && p.heads == 32 && p.kv_heads == 4 && p.head_dim == 128 && p.vocab == 151936);
	T_ASSERT(p.dtype == BATON_DT_BF16 && p.seed == 4);
	T_OK(arena_synth_preset("mixtral-8x7b", &p));
	T_ASSERT(p.d_ff == 14336 && p.experts == 8 && p.kv_heads == 8);
	T_EQ_ERR(arena_synth_preset("gpt-5", &p), BATON_ENOTFOUND);
	T_EQ_ERR(arena_synth_preset(NULL, &p), BATON_ENOTFOUND);
	au_rmdir(dir);
}

/* q4_K and q6_K: random valid blocks with the super-block scale that bounds
 * the values; every expert and 2-D weight of a whole model too. */
static void t_synthetic_kquants(void)
{
	au_tmpdir(dir, sizeof dir);
	static const uint32_t dts[] = { BATON_DT_Q4_K, BATON_DT_Q6_K };
	for (size_t i = 0; i < 2; i++) {
		char path[PATH_MAX], msg[256];
		mkpath(path, sizeof path, baton_dtype_name((int)dts[i]));
		struct baton_synth_params p = {
			.arch = "qwen3_moe", .layers = 2, .experts = 3, .top_k = 2, .d_model = 256,
			.d_ff = 512, .heads = 2, .kv_heads = 1, .head_dim = 128, .vocab = 64,
			.dtype = dts[i], .seed = 5,
		};
		au_create(path, &p);
		struct baton_arena *a;
		T_OK(arena_open(path, &a, msg, sizeof msg));
		struct baton_arena_tensor parts[3], t;
		T_OK(arena_expert_parts(a, 1, 2, parts));
		T_OK(arena_dense(a, "model.layers.0.self_attn.o_proj.weight", &t));
		T_EQ_INT(t.dtype, dts[i]);
		const struct baton_arena_tensor *ts[4] = { &parts[0], &parts[1], &parts[2], &t };
		for (int k = 0; k < 4; k++) {
			T_EQ_INT(ts[k]->dtype, dts[i]);
			float s = 1.0f / sqrtf((float)ts[k]->cols);
			uint32_t bb = dts[i] == BATON_DT_Q4_K ? 144 : 210;
			uint64_t nblk = ts[k]->bytes / bb, distinct = 0;
			for (uint64_t b = 0; b < nblk; b++) {
				const uint8_t *blk = ts[k]->data + b * bb;
				uint16_t d;
				memcpy(&d, blk + (dts[i] == BATON_DT_Q4_K ? 0 : 208), 2);
				float want = dts[i] == BATON_DT_Q4_K ? s / (63.0f * 15.0f) : s / (128.0f * 32.0f);
				T_ASSERT(baton_f16_to_f32(d) > 0 && fabsf(baton_f16_to_f32(d) - want) <= want / 512);
				if (b && memcmp(blk + 16, blk - bb + 16, 64) != 0)
					distinct++;
			}
			T_ASSERT(nblk < 2 || distinct == nblk - 1); /* the quants are draws */
		}
		T_OK(arena_dense(a, "model.layers.0.self_attn.q_norm.weight", &t));
		T_EQ_INT(t.dtype, BATON_DT_F32);
		uint64_t nbad = 1;
		T_OK(arena_verify(a, &nbad, msg, sizeof msg));
		arena_close(a);
	}
	au_rmdir(dir);
}

/* A version 1 file at the path is not reused: it does not open, so create
 * builds over it. */
static void t_v1_replaced(void)
{
	au_tmpdir(dir, sizeof dir);
	char path[PATH_MAX], msg[512] = "";
	mkpath(path, sizeof path, "old.arena");
	struct baton_synth_params p = au_small();
	au_create(path, &p);
	size_t len;
	uint8_t *img = au_read(path, &len);
	struct arena_file_header *h = (struct arena_file_header *)(void *)img;
	h->version = 1;
	h->header_checksum = arena_header_checksum(h);
	au_write(path, img, len);
	free(img);
	struct baton_arena *a;
	T_EQ_ERR(arena_open(path, &a, msg, sizeof msg), BATON_EFORMAT);
	T_ASSERT_MSG(strstr(msg, "version 1") && strstr(msg, "baton-arena create --synthetic --layers 2"),
	    "%s", msg);
	struct baton_create_result r;
	struct baton_arena_source src = { .kind = BATON_ARENA_SRC_SYNTHETIC, .synth = p };
	T_OK(arena_create(path, &src, NULL, &r, msg, sizeof msg));
	T_EQ_INT(r.reused, 0);
	T_OK(arena_open(path, &a, msg, sizeof msg));
	arena_close(a);
	au_rmdir(dir);
}

T_MAIN(T_CASE(t_synthetic_layout_and_values), T_CASE(t_synthetic_deterministic),
    T_CASE(t_reuse_and_replace), T_CASE(t_stale_tmp_removed), T_CASE(t_lock_waits),
    T_CASE_TIMEOUT(t_concurrent_creators, 60), T_CASE(t_bad_params),
    T_CASE(t_mapping_read_only), T_CASE(t_synthetic_model), T_CASE(t_synthetic_model_bad),
    T_CASE(t_v1_replaced), T_CASE(t_synthetic_kquants))
