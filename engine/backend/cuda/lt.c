/*
 * lt.c: the tensor-core path's plain and strided-batched GEMMs through
 * cuBLASLt, with the kernel chosen once per shape class and kept.
 *
 * Why: cublasGemmEx and cublasGemmStridedBatchedEx choose a kernel for
 * every new shape on the host, 0.3 to 0.7 ms a call on an H200 (measured
 * 2026-12-03, docs/measurements/performance.md), and a serving pass's
 * shapes are new all the time: the experts' buckets (rows a bucket,
 * experts in it) and the pass's rows change with every mix of prompts,
 * so a pass of 512 rows from four prompts spent 0.45 s in those choices
 * where the model bench's repeated pass (shapes seen before) took 45 ms.
 * Here the choice (cublasLtMatmulAlgoGetHeuristic) is made for a class:
 * the exact m, k, leading dimensions, types and transposes, the varying
 * n and batch rounded up to a power of two, the operands' alignment; the
 * class's representative is asked (so the choice is the same in every
 * run, whatever shape came first), and the kernel is used for every
 * shape of the class. A shape the kernel refuses (cublasLtMatmul checks
 * it before queuing anything) goes to blas.c's call, as does everything
 * when libcublasLt is missing or BATON_CUBLASLT=0.
 *
 * Like blas.c, no header of cuBLAS is included: the few entry points and
 * values of cublasLt.h (CUDA 12 and 13 agree on them) are declared here.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/cuda/cuda_int.h"

/* cublasLt.h's values */
enum {
	DESC_TRANSA = 3, DESC_TRANSB = 4,
	LAYOUT_BATCH_COUNT = 5, LAYOUT_STRIDED_BATCH_OFFSET = 6,
	PREF_MAX_WORKSPACE_BYTES = 1,
	PREF_MIN_ALIGN_A = 5, PREF_MIN_ALIGN_B = 6, PREF_MIN_ALIGN_C = 7, PREF_MIN_ALIGN_D = 8,
	LT_COMPUTE_32F = 68, LT_R_32F = 0,
};

typedef struct { uint64_t data[8]; } lt_algo;
typedef struct {
	lt_algo algo;
	size_t workspace;
	int state;
	float waves;
	int reserved[4];
} lt_heur;

static struct {
	void *lib;
	int (*create)(void **);
	int (*destroy)(void *);
	int (*desc_create)(void **, int, int);
	int (*desc_destroy)(void *);
	int (*desc_set)(void *, int, const void *, size_t);
	int (*layout_create)(void **, int, uint64_t, uint64_t, int64_t);
	int (*layout_destroy)(void *);
	int (*layout_set)(void *, int, const void *, size_t);
	int (*pref_create)(void **);
	int (*pref_destroy)(void *);
	int (*pref_set)(void *, int, const void *, size_t);
	int (*heuristic)(void *, void *, void *, void *, void *, void *, void *, int, lt_heur *, int *);
	int (*matmul)(void *, void *, const void *, const void *, void *, const void *, void *,
	    const void *, const void *, void *, void *, void *, const lt_algo *, void *, size_t,
	    CUstream);
} g_lt;
static char g_lt_err[200] = "not loaded";
static pthread_once_t g_lt_once = PTHREAD_ONCE_INIT;

static void lt_load_once(void)
{
	static const char *const names[] = {
		"libcublasLt.so.13", "libcublasLt.so.12",
		"/usr/local/cuda/lib64/libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.12",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.13",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.12",
	};
	void *h = NULL;
	/* beside the libcublas blas.c opened first (its RUNPATH finds it there) */
	char path[256];
	const char *bp = cuda_blas_path();
	const char *slash = bp ? strrchr(bp, '/') : NULL;
	if (slash && (size_t)(slash - bp) < sizeof path - 32) {
		const char *ver = strstr(slash, ".so.");
		snprintf(path, sizeof path, "%.*s/libcublasLt%s", (int)(slash - bp), bp, ver ? ver : ".so");
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	}
	for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++)
		h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(g_lt_err, sizeof g_lt_err, "libcublasLt.so.13 or .12 not found");
		return;
	}
	struct {
		void **p;
		const char *name;
	} syms[] = {
		{ (void **)&g_lt.create, "cublasLtCreate" },
		{ (void **)&g_lt.destroy, "cublasLtDestroy" },
		{ (void **)&g_lt.desc_create, "cublasLtMatmulDescCreate" },
		{ (void **)&g_lt.desc_destroy, "cublasLtMatmulDescDestroy" },
		{ (void **)&g_lt.desc_set, "cublasLtMatmulDescSetAttribute" },
		{ (void **)&g_lt.layout_create, "cublasLtMatrixLayoutCreate" },
		{ (void **)&g_lt.layout_destroy, "cublasLtMatrixLayoutDestroy" },
		{ (void **)&g_lt.layout_set, "cublasLtMatrixLayoutSetAttribute" },
		{ (void **)&g_lt.pref_create, "cublasLtMatmulPreferenceCreate" },
		{ (void **)&g_lt.pref_destroy, "cublasLtMatmulPreferenceDestroy" },
		{ (void **)&g_lt.pref_set, "cublasLtMatmulPreferenceSetAttribute" },
		{ (void **)&g_lt.heuristic, "cublasLtMatmulAlgoGetHeuristic" },
		{ (void **)&g_lt.matmul, "cublasLtMatmul" },
	};
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		void *p = dlsym(h, syms[i].name);
		if (!p) {
			snprintf(g_lt_err, sizeof g_lt_err, "libcublasLt has no %.40s", syms[i].name);
			dlclose(h);
			return;
		}
		memcpy(syms[i].p, &p, sizeof p);
	}
	g_lt.lib = h; /* stays loaded: the handles point into it */
	g_lt_err[0] = '\0';
}

/* A shape class and the kernel chosen for it (ok 0: none would do). */
struct cuda_lt_algo {
	int ta, tb, a_type, b_type, m, k, lda, ldb, ldc, n_c, batch_c, align, ok;
	lt_algo algo;
	size_t workspace;
};

static int pow2_up(int v)
{
	int p = 1;
	while (p < v && p < (1 << 30))
		p <<= 1;
	return p;
}

/* The lowest set bit of the operands' addresses and of their row and
 * batch strides in bytes, up to 16: the alignment the kernel may assume. */
static int align_of(const struct cuda_gemm *g, int ea, int eb)
{
	uint64_t v = 16 | g->a | g->b | g->c | (uint64_t)g->lda * ea | (uint64_t)g->ldb * eb |
	    (uint64_t)g->ldc * 4;
	if (g->batch > 1)
		v |= (uint64_t)g->sa * ea | (uint64_t)g->sb * eb | (uint64_t)g->sc * 4;
	return (int)(v & (~v + 1));
}

static int elem_bytes(int t)
{
	return t == LT_R_32F ? 4 : 2; /* f32, else bf16 / f16 (the path's types) */
}

static void *layout(int type, int rows, int cols, int ld, int batch, long long stride)
{
	void *l = NULL;
	if (g_lt.layout_create(&l, type, (uint64_t)rows, (uint64_t)cols, ld))
		return NULL;
	if (batch > 1) {
		const int32_t b = batch;
		const int64_t s = stride;
		if (g_lt.layout_set(l, LAYOUT_BATCH_COUNT, &b, sizeof b) ||
		    g_lt.layout_set(l, LAYOUT_STRIDED_BATCH_OFFSET, &s, sizeof s)) {
			g_lt.layout_destroy(l);
			return NULL;
		}
	}
	return l;
}

struct lt_call {
	void *op, *la, *lb, *lc;
};

static void call_free(struct lt_call *c)
{
	if (c->la)
		g_lt.layout_destroy(c->la);
	if (c->lb)
		g_lt.layout_destroy(c->lb);
	if (c->lc)
		g_lt.layout_destroy(c->lc);
	if (c->op)
		g_lt.desc_destroy(c->op);
}

/* The descriptors of g with n and batch as given (the class's
 * representative, or g's own), strides scaled with n where they span n. */
static int call_make(const struct cuda_gemm *g, int n, int batch, struct lt_call *c)
{
	memset(c, 0, sizeof *c);
	const int32_t ta = g->ta, tb = g->tb;
	if (g_lt.desc_create(&c->op, LT_COMPUTE_32F, LT_R_32F) ||
	    g_lt.desc_set(c->op, DESC_TRANSA, &ta, sizeof ta) ||
	    g_lt.desc_set(c->op, DESC_TRANSB, &tb, sizeof tb))
		goto fail;
	/* strides of the representative: g's, or where g's problems lay
	 * packed (a stride of at least ld x n), packed for n columns */
	const long long pb = (long long)g->ldb * (g->tb ? g->k : g->n), pc = (long long)g->ldc * g->n;
	const long long sb = n != g->n && !g->tb && g->sb >= pb ? (long long)g->ldb * n : g->sb;
	const long long sc = n != g->n && g->sc >= pc ? (long long)g->ldc * n : g->sc;
	c->la = g->ta ? layout(g->a_type, g->k, g->m, g->lda, batch, g->sa) :
	                layout(g->a_type, g->m, g->k, g->lda, batch, g->sa);
	c->lb = g->tb ? layout(g->b_type, n, g->k, g->ldb, batch, sb) :
	                layout(g->b_type, g->k, n, g->ldb, batch, sb);
	c->lc = layout(LT_R_32F, g->m, n, g->ldc, batch, sc);
	if (c->la && c->lb && c->lc)
		return 0;
fail:
	call_free(c);
	return -1;
}

/* g's class's entry: found, or made now (the heuristic asked once). */
static struct cuda_lt_algo *class_of(struct baton_dev *dev, const struct cuda_gemm *g)
{
	const int n_c = pow2_up(g->n), b_c = pow2_up(g->batch > 1 ? g->batch : 1);
	const int al = align_of(g, elem_bytes(g->a_type), elem_bytes(g->b_type));
	for (uint32_t i = 0; i < dev->lt_n; i++) {
		struct cuda_lt_algo *e = &dev->lt_tab[i];
		if (e->ta == g->ta && e->tb == g->tb && e->a_type == g->a_type && e->b_type == g->b_type &&
		    e->m == g->m && e->k == g->k && e->lda == g->lda && e->ldb == g->ldb &&
		    e->ldc == g->ldc && e->n_c == n_c && e->batch_c == b_c && e->align == al)
			return e;
	}
	if (dev->lt_n == dev->lt_cap) {
		const uint32_t cap = dev->lt_cap ? 2 * dev->lt_cap : 64;
		struct cuda_lt_algo *t = realloc(dev->lt_tab, cap * sizeof *t);
		if (!t)
			return NULL;
		dev->lt_tab = t;
		dev->lt_cap = cap;
	}
	struct cuda_lt_algo *e = &dev->lt_tab[dev->lt_n++];
	*e = (struct cuda_lt_algo){ .ta = g->ta, .tb = g->tb, .a_type = g->a_type,
		.b_type = g->b_type, .m = g->m, .k = g->k, .lda = g->lda, .ldb = g->ldb, .ldc = g->ldc,
		.n_c = n_c, .batch_c = b_c, .align = al };
	/* the representative: n_c columns in a leading dimension that holds
	 * them (B's ldb >= n_c when transposed is g's own concern: kept) */
	struct lt_call c;
	void *pref = NULL;
	const uint64_t ws = cuda_blas_workspace_bytes();
	const uint32_t a32 = (uint32_t)al;
	if (call_make(g, n_c, b_c, &c))
		return e;
	if (!g_lt.pref_create(&pref) &&
	    !g_lt.pref_set(pref, PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) &&
	    !g_lt.pref_set(pref, PREF_MIN_ALIGN_A, &a32, sizeof a32) &&
	    !g_lt.pref_set(pref, PREF_MIN_ALIGN_B, &a32, sizeof a32) &&
	    !g_lt.pref_set(pref, PREF_MIN_ALIGN_C, &a32, sizeof a32) &&
	    !g_lt.pref_set(pref, PREF_MIN_ALIGN_D, &a32, sizeof a32)) {
		lt_heur h;
		int got = 0;
		memset(&h, 0, sizeof h);
		if (!g_lt.heuristic(dev->lt, c.op, c.la, c.lb, c.lc, c.lc, pref, 1, &h, &got) && got > 0 &&
		    h.state == 0 && h.workspace <= ws) {
			e->algo = h.algo;
			e->workspace = h.workspace;
			e->ok = 1;
		}
	}
	if (pref)
		g_lt.pref_destroy(pref);
	call_free(&c);
	dev->lt_classes++;
	return e;
}

int cuda_lt_gemm(struct baton_dev *dev, const struct cuda_gemm *g)
{
	if (dev->lt_state < 0 || (g->a_type != 14 && g->a_type != LT_R_32F))
		return CUDA_TC_FALLBACK;
	if (dev->lt_state == 0) {
		const char *env = getenv("BATON_CUBLASLT");
		if (env && strcmp(env, "0") == 0) {
			dev->lt_state = -1;
			return CUDA_TC_FALLBACK;
		}
		pthread_once(&g_lt_once, lt_load_once);
		if (!g_lt.lib || g_lt.create(&dev->lt)) {
			dev->lt = NULL;
			dev->lt_state = -1;
			fprintf(stderr, "baton cuda: cuBLASLt off (%s): every GEMM through cuBLAS, which "
			    "chooses its kernel for each new shape\n", g_lt.lib ? "cublasLtCreate failed" : g_lt_err);
			return CUDA_TC_FALLBACK;
		}
		dev->lt_state = 1;
	}
	const struct cuda_lt_algo *e = class_of(dev, g);
	if (!e || !e->ok) {
		dev->lt_refused++;
		return CUDA_TC_FALLBACK;
	}
	struct lt_call c;
	if (call_make(g, g->n, g->batch > 1 ? g->batch : 1, &c)) {
		dev->lt_refused++;
		return CUDA_TC_FALLBACK;
	}
	const float alpha = g->alpha, beta = g->beta;
	/* checked before anything is queued: a refusal leaves the stream as it was */
	const int st = g_lt.matmul(dev->lt, c.op, &alpha, (const void *)(uintptr_t)g->a, c.la,
	    (const void *)(uintptr_t)g->b, c.lb, &beta, (const void *)(uintptr_t)g->c, c.lc,
	    (void *)(uintptr_t)g->c, c.lc, &e->algo, (void *)(uintptr_t)dev->tc_ws, e->workspace,
	    dev->stream);
	call_free(&c);
	if (st) {
		dev->lt_refused++;
		return CUDA_TC_FALLBACK;
	}
	dev->lt_calls++;
	return 0;
}

void cuda_lt_describe(const struct baton_dev *dev, char *buf, size_t len)
{
	if (dev->lt_state > 0)
		snprintf(buf, len, "cuBLASLt: %llu GEMMs, %u shape classes (%llu calls went to cuBLAS)",
		    (unsigned long long)dev->lt_calls, dev->lt_classes,
		    (unsigned long long)dev->lt_refused);
	else
		snprintf(buf, len, "cuBLASLt: %s", dev->lt_state < 0 ? "off" : "not asked yet");
}

void cuda_lt_free(struct baton_dev *dev)
{
	if (dev->lt)
		g_lt.destroy(dev->lt);
	dev->lt = NULL;
	free(dev->lt_tab);
	dev->lt_tab = NULL;
	dev->lt_n = dev->lt_cap = dev->lt_classes = 0;
	dev->lt_state = 0;
}
