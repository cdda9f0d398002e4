/*
 * create_test.c: creating arenas: the layout contract, the synthetic
 * values and their determinism (the dtype table, codec and encoders are
 * dtype_test.c's), the lock
 * (a second creator waits, then reuses), stale temporary files, reuse and
 * replacement rules, and bad parameters.
 */
#include <errno.h>
#include <inttypes.h>
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
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_Q3_K, .seed = 1 }, BATON_EUNSUPPORTED, "q3_K" },
		{ { .layers = 2, .experts = 4, .top_k = 2, .d_model = 64, .d_ff = 64, .dtype = BATON_DT_Q4_K, .seed = 1 }, BATON_EINVAL, "multiples of 256" },
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

T_MAIN(T_CASE(t_synthetic_layout_and_values), T_CASE(t_synthetic_deterministic),
    T_CASE(t_reuse_and_replace), T_CASE(t_stale_tmp_removed), T_CASE(t_lock_waits),
    T_CASE_TIMEOUT(t_concurrent_creators, 60), T_CASE(t_bad_params),
    T_CASE(t_mapping_read_only))
