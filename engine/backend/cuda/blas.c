/*
 * blas.c: cuBLAS, loaded at run time with dlopen (as driver.c loads the
 * driver), for the tensor-core path of tc_launch.c. No binary links
 * libcublas: without it (or with BATON_CUDA_GEMM=0) every op keeps its
 * CUDA-core kernels, and one line on stderr and cuda_backend_describe say
 * which path is on.
 *
 * The library is looked for, in order, at $BATON_CUBLAS (a file), as
 * libcublas.so.13 and libcublas.so.12 on the loader's path, and in
 * /usr/local/cuda/lib64 and /usr/local/cuda/targets/x86_64-linux/lib
 * (its libcublasLt sits beside it: libcublas's RUNPATH is $ORIGIN). Only
 * the handful of entry points below are used, declared here with the
 * values of cublas_api.h and library_types.h (CUDA 12 and 13 agree on
 * them), so no cuBLAS header is included.
 *
 * A device asks once, on the first pass large enough (cuda_tc_on): the
 * library, a handle bound to the context's stream with a workspace of
 * ours (so cuBLAS allocates nothing later), and the modules of gemm.cu
 * and attn.cu. Any failure turns the path off for that device, with the
 * reason kept for describe.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/cuda/cuda_int.h"

extern const unsigned char baton_engine_backend_cuda_gemm_fatbin[];
extern const unsigned char baton_engine_backend_cuda_attn_fatbin[];
extern const unsigned char baton_engine_backend_cuda_egemm_fatbin[];

#define WORKSPACE_BYTES (32ull << 20)
#define DEFAULT_ROWS 64u

/* cublas_api.h's values */
enum { OP_N = 0, OP_T = 1, COMPUTE_32F = 68, GEMM_DEFAULT = -1, DT_R_32F = 0 };

typedef int (*create_fn)(void **);
typedef int (*destroy_fn)(void *);
typedef int (*version_fn)(void *, int *);
typedef int (*stream_fn)(void *, CUstream);
typedef int (*workspace_fn)(void *, void *, size_t);
typedef const char *(*status_fn)(int);
typedef int (*gemm_fn)(void *, int, int, int, int, int, const void *, const void *, int, int,
    const void *, int, int, const void *, void *, int, int, int, int);
typedef int (*gemm_b_fn)(void *, int, int, int, int, int, const void *, const void *, int, int,
    const void *, int, int, const void *, void *, int, int, int, int, int);
typedef int (*gemm_g_fn)(void *, const int *, const int *, const int *, const int *, const int *,
    const void *, const void *, int, const int *, const void *, int, const int *, const void *,
    void *, int, const int *, int, const int *, int);
typedef int (*gemm_sb_fn)(void *, int, int, int, int, int, const void *, const void *, int, int,
    long long, const void *, int, int, long long, const void *, void *, int, int, long long, int,
    int, int);

static struct {
	void *lib;
	char path[200];
	create_fn create;
	destroy_fn destroy;
	version_fn version;
	stream_fn set_stream;
	workspace_fn set_workspace;
	status_fn status;
	gemm_fn gemm;
	gemm_sb_fn gemm_sb;
	gemm_b_fn gemm_b;   /* cublasGemmBatchedEx: device arrays of pointers */
	gemm_g_fn gemm_g;   /* cublasGemmGroupedBatchedEx (cuBLAS 12.5 on), or NULL */
} g_blas;
static char g_blas_err[200] = "not loaded";
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;

static void *try_open(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h)
		snprintf(g_blas.path, sizeof g_blas.path, "%s", path);
	return h;
}

static void blas_load_once(void)
{
	static const char *const names[] = {
		"libcublas.so.13", "libcublas.so.12",
		"/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.12",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.13",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so.12",
	};
	const char *env = getenv("BATON_CUBLAS");
	void *h = env && *env ? try_open(env) : NULL;
	for (size_t i = 0; !h && i < sizeof names / sizeof names[0]; i++)
		h = try_open(names[i]);
	if (!h) {
		snprintf(g_blas_err, sizeof g_blas_err,
		    "libcublas.so.13 or .12 not found (set BATON_CUBLAS to its path)");
		return;
	}
	struct {
		void **p;
		const char *name;
	} syms[] = {
		{ (void **)&g_blas.create, "cublasCreate_v2" },
		{ (void **)&g_blas.destroy, "cublasDestroy_v2" },
		{ (void **)&g_blas.version, "cublasGetVersion_v2" },
		{ (void **)&g_blas.set_stream, "cublasSetStream_v2" },
		{ (void **)&g_blas.set_workspace, "cublasSetWorkspace_v2" },
		{ (void **)&g_blas.status, "cublasGetStatusString" },
		{ (void **)&g_blas.gemm, "cublasGemmEx" },
		{ (void **)&g_blas.gemm_sb, "cublasGemmStridedBatchedEx" },
		{ (void **)&g_blas.gemm_b, "cublasGemmBatchedEx" },
	};
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		void *p = dlsym(h, syms[i].name);
		if (!p) {
			snprintf(g_blas_err, sizeof g_blas_err, "%.150s has no %.40s", g_blas.path, syms[i].name);
			dlclose(h);
			return;
		}
		memcpy(syms[i].p, &p, sizeof p);
	}
	void *gp = dlsym(h, "cublasGemmGroupedBatchedEx"); /* optional */
	memcpy(&g_blas.gemm_g, &gp, sizeof gp);
	g_blas.lib = h; /* stays loaded: the handles point into it */
	g_blas_err[0] = '\0';
}

const char *cuda_blas_path(void)
{
	return g_blas.lib ? g_blas.path : NULL;
}

uint64_t cuda_blas_workspace_bytes(void)
{
	return WORKSPACE_BYTES;
}

static const char *status_str(int st)
{
	const char *s = g_blas.status ? g_blas.status(st) : NULL;
	return s ? s : "unknown cuBLAS status";
}

static int fail_off(struct baton_dev *dev, const char *what)
{
	snprintf(dev->tc_why, sizeof dev->tc_why, "%.190s", what);
	dev->tc_state = -1;
	return 0;
}

static int load_fns(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	struct {
		CUfunction *f;
		CUmodule m;
		const char *name;
	} k[] = {
		{ &dev->k_tc_dequant, dev->tc_mod, "baton_tc_dequant" },
		{ &dev->k_tc_rows, dev->tc_mod, "baton_tc_rows" },
		{ &dev->k_tc_bias, dev->tc_mod, "baton_tc_bias" },
		{ &dev->k_tc_swiglu, dev->tc_mod, "baton_tc_swiglu" },
		{ &dev->k_tc_combine, dev->tc_mod, "baton_tc_combine" },
		{ &dev->k_tc_attn_kv, dev->tc_attn_mod, "baton_tc_attn_kv" },
		{ &dev->k_tc_attn_q, dev->tc_attn_mod, "baton_tc_attn_q" },
		{ &dev->k_tc_attn_out, dev->tc_attn_mod, "baton_tc_attn_out" },
		{ &dev->k_tc_attn_softmax, dev->tc_attn_mod, "baton_tc_attn_softmax" },
		{ &dev->k_tc_mm_f32, dev->tc_mod, "baton_tc_mm_f32" },
		{ &dev->k_tc_egemm, dev->tc_eg_mod, "baton_tc_egemm" },
		{ &dev->k_tc_egemm_m128, dev->tc_eg_mod, "baton_tc_egemm_m128" },
		{ &dev->k_tc_plan, dev->tc_mod, "baton_tc_plan" },
	};
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
		if (d->ModuleGetFunction(k[i].f, k[i].m, k[i].name) != CUDA_SUCCESS)
			return -1;
	return 0;
}

/* The first large pass: everything the path needs, or the path off. */
static int tc_start(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	char what[256];
	pthread_once(&g_blas_once, blas_load_once);
	if (!g_blas.lib)
		return fail_off(dev, g_blas_err);
	if (d->ModuleLoadData(&dev->tc_mod, baton_engine_backend_cuda_gemm_fatbin) != CUDA_SUCCESS ||
	    d->ModuleLoadData(&dev->tc_attn_mod, baton_engine_backend_cuda_attn_fatbin) !=
	        CUDA_SUCCESS ||
	    d->ModuleLoadData(&dev->tc_eg_mod, baton_engine_backend_cuda_egemm_fatbin) != CUDA_SUCCESS ||
	    load_fns(dev))
		return fail_off(dev, "the tensor-core helper kernels did not load");
	if (d->MemAlloc(&dev->tc_ws, WORKSPACE_BYTES) != CUDA_SUCCESS) {
		dev->tc_ws = 0;
		return fail_off(dev, "no device memory for cuBLAS's workspace");
	}
	void *h = NULL;
	int st = g_blas.create(&h);
	if (st) {
		snprintf(what, sizeof what, "cublasCreate: %.150s", status_str(st));
		return fail_off(dev, what);
	}
	dev->blas = h;
	if ((st = g_blas.set_stream(h, dev->stream)) ||
	    (st = g_blas.set_workspace(h, (void *)(uintptr_t)dev->tc_ws, WORKSPACE_BYTES))) {
		snprintf(what, sizeof what, "cublasSetStream/SetWorkspace: %.150s", status_str(st));
		return fail_off(dev, what);
	}
	if (g_blas.version(h, &dev->blas_version))
		dev->blas_version = 0;
	d->EventCreate(&dev->tc_staged, CU_EVENT_DISABLE_TIMING);
	dev->tc_state = 1;
	return 0;
}

static uint32_t env_u32(const char *name, uint32_t def)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return def;
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	return *end || v > 0xffffffffu ? def : (uint32_t)v;
}

void cuda_tc_config(struct baton_dev *dev)
{
	dev->tc_rows = env_u32("BATON_CUDA_GEMM_ROWS", DEFAULT_ROWS);
	if (!dev->tc_rows)
		dev->tc_rows = 1;
	dev->tc_scratch = (uint64_t)env_u32("BATON_CUDA_GEMM_SCRATCH_MB", 512) << 20;
	/* the experts' GEMMs (tc_launch.c): 0 strided batched per bucket on
	 * decoded copies, 1 pointer arrays per bucket, 2 grouped (one call a
	 * step, buckets as groups), 3 grouped with an expert a group (its
	 * count rounded up to 8, no bucket padding), 4 egemm.cu's kernel (one
	 * launch a step, every expert's tiles, SwiGLU in the gate/up step);
	 * unset: 4 where its shapes hold, else 1 for experts read in place
	 * (bf16 at 16-byte alignment, unless BATON_TC_INPLACE=0), 0 for
	 * decoded ones */
	dev->tc_egemm = env_u32("BATON_TC_EXPERT_GEMM", TC_EGEMM_DEFAULT);
	if (dev->tc_egemm > 4)
		dev->tc_egemm = TC_EGEMM_DEFAULT;
	dev->tc_inplace = env_u32("BATON_TC_INPLACE", 1) != 0;
	/* f32 matmuls of large passes on baton_tc_mm_f32 (the exact bits);
	 * BATON_TC_MM_F32=0: the exact kernels of ops.cu */
	dev->tc_mmf = env_u32("BATON_TC_MM_F32", 1) != 0;
	/* 16-bit matmuls of large passes on egemm.cu's kernel, not cuBLAS */
	dev->tc_mm_eg = env_u32("BATON_TC_MM_EG", 0) != 0;
	/* egemm.cu's block: 64 rows (4 warps), or 128 (8 warps) */
	dev->tc_eg_rows = env_u32("BATON_TC_EG_ROWS", 64) == 128 ? 128 : 64;
	/* experts' rows rounded up to a multiple of this (8 to 256, a power
	 * of two): fewer distinct GEMM shapes for cuBLAS to choose kernels for */
	dev->tc_pad = env_u32("BATON_TC_PAD", 8);
	if (dev->tc_pad < 8 || dev->tc_pad > 256 || (dev->tc_pad & (dev->tc_pad - 1)))
		dev->tc_pad = 8;
	if (env_u32("BATON_CUDA_GEMM", 1) == 0) {
		fail_off(dev, "off (BATON_CUDA_GEMM=0)");
		fprintf(stderr, "baton cuda: tensor-core path off (BATON_CUDA_GEMM=0): "
		    "every op on the CUDA cores in the host's order\n");
	}
}

int cuda_tc_on(struct baton_dev *dev, uint64_t rows)
{
	if (dev->tc_state < 0 || rows < dev->tc_rows)
		return 0;
	if (dev->tc_state == 0) {
		tc_start(dev);
		if (dev->tc_state > 0)
			fprintf(stderr, "baton cuda: tensor-core path on for passes of %u rows or more "
			    "(cuBLAS %d from %s)\n", dev->tc_rows, dev->blas_version, g_blas.path);
		else
			fprintf(stderr, "baton cuda: tensor-core path off (%s): batched ops stay on the "
			    "CUDA cores\n", dev->tc_why);
	}
	if (dev->tc_state > 0 && dev->gmode) {
		/* cuBLAS's launches are not in the graph log: such a pass is
		 * recorded and run but never replayed, nor queued while checked */
		dev->gfail = 1;
		return dev->gmode == CUDA_G_CHECK ? 0 : 1;
	}
	return dev->tc_state > 0;
}

void cuda_tc_describe(struct baton_dev *dev, char *buf, size_t len)
{
	if (dev->tc_state > 0) {
		char lt[160];
		cuda_lt_describe(dev, lt, sizeof lt);
		snprintf(buf, len, "tensor cores through cuBLAS %d for passes of %u rows or more; %s",
		    dev->blas_version, dev->tc_rows, lt);
	}
	else if (dev->tc_state < 0)
		snprintf(buf, len, "tensor cores off: %s", dev->tc_why);
	else
		snprintf(buf, len, "tensor cores: cuBLAS not asked yet (at the first large pass)");
}

void cuda_tc_free(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	if (dev->tc_stage_busy && dev->tc_staged)
		d->EventSynchronize(dev->tc_staged);
	cuda_lt_free(dev);
	if (dev->blas)
		g_blas.destroy(dev->blas);
	dev->blas = NULL;
	if (dev->tc_staged)
		d->EventDestroy(dev->tc_staged);
	dev->tc_staged = NULL;
	if (dev->tc_stage)
		d->MemFreeHost(dev->tc_stage);
	dev->tc_stage = NULL;
	dev->tc_stage_cap = 0;
	dev->tc_stage_busy = 0;
	if (dev->tc_ws)
		d->MemFree(dev->tc_ws);
	dev->tc_ws = 0;
	for (int i = 0; i < TC_BUFS; i++)
		cuda_dbuf_free(dev, &dev->tc_buf[i]);
	if (dev->tc_mod)
		d->ModuleUnload(dev->tc_mod);
	if (dev->tc_attn_mod)
		d->ModuleUnload(dev->tc_attn_mod);
	if (dev->tc_eg_mod)
		d->ModuleUnload(dev->tc_eg_mod);
	dev->tc_mod = dev->tc_attn_mod = dev->tc_eg_mod = NULL;
	dev->tc_state = 0;
	dev->tc_rows = 0;
}

int cuda_blas_gemm(struct baton_dev *dev, const struct cuda_gemm *g)
{
	const float alpha = g->alpha, beta = g->beta;
	const int prof = cuda_prof_begin(dev);
	const double h0 = prof ? baton_now_s() : 0;
	int st;
	dev->n_launch++; /* it writes device memory too: mmvq_launch.c's quantization */
	if ((st = cuda_lt_gemm(dev, g)) != CUDA_TC_FALLBACK) {
		if (prof) {
			cuda_prof_host(dev, "host: in cuBLASLt GEMM calls", 1e3 * (baton_now_s() - h0));
			cuda_prof_end(dev, g->what ? g->what : "cublasLtMatmul");
		}
		return st;
	}
	if (g->batch <= 1)
		st = g_blas.gemm(dev->blas, g->ta ? OP_T : OP_N, g->tb ? OP_T : OP_N, g->m, g->n, g->k,
		    &alpha, (const void *)(uintptr_t)g->a, g->a_type, g->lda,
		    (const void *)(uintptr_t)g->b, g->b_type, g->ldb, &beta, (void *)(uintptr_t)g->c,
		    DT_R_32F, g->ldc, COMPUTE_32F, GEMM_DEFAULT);
	else
		st = g_blas.gemm_sb(dev->blas, g->ta ? OP_T : OP_N, g->tb ? OP_T : OP_N, g->m, g->n,
		    g->k, &alpha, (const void *)(uintptr_t)g->a, g->a_type, g->lda, g->sa,
		    (const void *)(uintptr_t)g->b, g->b_type, g->ldb, g->sb, &beta,
		    (void *)(uintptr_t)g->c, DT_R_32F, g->ldc, g->sc, g->batch, COMPUTE_32F,
		    GEMM_DEFAULT);
	if (prof) {
		cuda_prof_host(dev, "host: in cuBLAS GEMM calls", 1e3 * (baton_now_s() - h0));
		cuda_prof_end(dev, g->what ? g->what : "cublasGemmEx");
	}
	if (st) {
		cuda_set_err(dev, "cuBLAS GEMM %dx%dx%d (batch %d): %s", g->m, g->n, g->k, g->batch,
		    status_str(st));
		return BATON_EIO;
	}
	return 0;
}

int cuda_blas_gemm_ptrs(struct baton_dev *dev, const struct cuda_gemm *g)
{
	const float alpha = g->alpha, beta = g->beta;
	const int prof = cuda_prof_begin(dev);
	const double h0 = prof ? baton_now_s() : 0;
	dev->n_launch++;
	const int st = g_blas.gemm_b(dev->blas, g->ta ? OP_T : OP_N, g->tb ? OP_T : OP_N, g->m, g->n,
	    g->k, &alpha, (const void *)(uintptr_t)g->a, g->a_type, g->lda,
	    (const void *)(uintptr_t)g->b, g->b_type, g->ldb, &beta, (void *)(uintptr_t)g->c,
	    DT_R_32F, g->ldc, g->batch, COMPUTE_32F, GEMM_DEFAULT);
	if (prof) {
		cuda_prof_host(dev, "host: in cuBLAS batched GEMM calls", 1e3 * (baton_now_s() - h0));
		cuda_prof_end(dev, g->what ? g->what : "cublasGemmBatchedEx");
	}
	if (st) {
		cuda_set_err(dev, "cuBLAS batched GEMM %dx%dx%d (batch %d): %s", g->m, g->n, g->k,
		    g->batch, status_str(st));
		return BATON_EIO;
	}
	return 0;
}

int cuda_blas_gemm_grouped(struct baton_dev *dev, const struct cuda_gemm_groups *g)
{
	enum { MAXG = CUDA_GEMM_GROUPS_MAX };
	if (!g_blas.gemm_g || g->groups < 1 || g->groups > MAXG)
		return CUDA_TC_FALLBACK;
	int ta[MAXG], tb[MAXG];
	float alpha[MAXG], beta[MAXG];
	for (int i = 0; i < g->groups; i++)
		ta[i] = g->ta ? OP_T : OP_N, tb[i] = g->tb ? OP_T : OP_N, alpha[i] = 1.0f, beta[i] = 0.0f;
	const int prof = cuda_prof_begin(dev);
	dev->n_launch++;
	const int st = g_blas.gemm_g(dev->blas, ta, tb, g->m, g->n, g->k, alpha,
	    (const void *)(uintptr_t)g->a, g->a_type, g->lda, (const void *)(uintptr_t)g->b,
	    g->b_type, g->ldb, beta, (void *)(uintptr_t)g->c, DT_R_32F, g->ldc, g->groups, g->size,
	    COMPUTE_32F);
	if (prof)
		cuda_prof_end(dev, g->what ? g->what : "cublasGemmGroupedBatchedEx");
	if (st) { /* refused before it queued anything: the caller takes another way */
		if (!dev->tc_grouped_said)
			fprintf(stderr, "baton cuda: cublasGemmGroupedBatchedEx refused (%s): the experts "
			    "take pointer-array GEMMs per bucket\n", status_str(st));
		dev->tc_grouped_said = 1;
		return CUDA_TC_FALLBACK;
	}
	return 0;
}
