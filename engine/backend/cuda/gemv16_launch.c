/*
 * gemv16_launch.c: the 16-bit batch-1 path of matmul and of the decode
 * step's experts (gemv16.cu): when it applies (bf16 or f16 rows, 16-byte
 * aligned, widths a multiple of 8; off with BATON_CUDA_EXACT=1, as
 * mmvq_launch.c's path), and its launches. The callers have checked the
 * arguments; CUDA_TC_FALLBACK sends them on to the exact kernels.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/cuda/gemv16.h"

extern const unsigned char baton_engine_backend_cuda_gemv16_fatbin[];
extern const size_t baton_engine_backend_cuda_gemv16_fatbin_len;

#define G16_THREADS (32 * BATON_G16_WARPS)
#define G16_TOP_K_MAX 32 /* gemv16.cu's MAX_TOP_K */
/* cuda_launch_kx's pdl: 2 (a programmatic dependent launch) where
 * BATON_G16_PDL asks it (gemv16.cu's kernels wait before they read) */
#define PDL_MM(dev) ((dev)->pdl_on && (dev)->g16_pdl_mm ? 2 : 0)
#define PDL_EX(dev) ((dev)->pdl_on ? 2 : 0)

int cuda_g16_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	/* BATON_G16_PDL: 0 off, 1 (default) every 16-bit GEMV, 2 the
	 * experts' kernels alone (round 1 of 2026-12-02 measured 1 against 0;
	 * 2 is not measured) */
	const char *pdl = getenv("BATON_G16_PDL");
	dev->pdl_on = !(pdl && *pdl && strcmp(pdl, "0") == 0);
	dev->g16_pdl_mm = !(pdl && *pdl && strcmp(pdl, "2") == 0);
	CU(dev, d->ModuleLoadData(&dev->g16_mod, baton_engine_backend_cuda_gemv16_fatbin),
	    "cuModuleLoadData of the 16-bit GEMV kernels (sm_90 SASS, compute_90 PTX)");
	struct {
		CUfunction *f;
		const char *name;
	} k[] = {
		{ &dev->k_g16_matmul, "baton_g16_matmul" },
		{ &dev->k_g16_gate_up, "baton_g16_gate_up" },
		{ &dev->k_g16_down, "baton_g16_down" },
		{ &dev->k_g16_matmuls, "baton_g16_matmuls" },
	};
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
		CU(dev, d->ModuleGetFunction(k[i].f, dev->g16_mod, k[i].name), k[i].name);
	/* one launch of each on empty sizes (each returns at once), as
	 * cuda_ops_load does: modules load lazily */
	struct baton_g16_args zm = { 0 };
	struct baton_g16_moe_args ze = { 0 };
	struct baton_g16_n_args zn = { 0 };
	void *zero[] = { &zm, &ze, &ze, &zn };
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
		void *params[] = { zero[i] };
		CU(dev, d->LaunchKernel(*k[i].f, 1, 1, 1, 32, 1, 1, 0, dev->stream, params, NULL),
		    "first launch of the 16-bit GEMV kernels");
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

void cuda_g16_free(struct baton_dev *dev)
{
	if (dev->g16_mod)
		dev->d->ModuleUnload(dev->g16_mod);
	dev->g16_mod = NULL;
}

/* bf16 / f16 rows of `cols` at addr: 16-byte loads need both aligned. */
static int g16_dtype(uint32_t dt, uint64_t addr, uint32_t cols)
{
	return (dt == BATON_DT_BF16 || dt == BATON_DT_F16) && addr % 16 == 0 && cols % 8 == 0;
}

/* A bias of f32, f16 or bf16 at its type's alignment (typed loads), or none. */
static int g16_bias(baton_dptr b, uint32_t b_dtype)
{
	return !b || (b_dtype == BATON_DT_F32 && b % 4 == 0) ||
	    ((b_dtype == BATON_DT_F16 || b_dtype == BATON_DT_BF16) && b % 2 == 0);
}

int cuda_g16_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint64_t row_bytes,
    uint32_t n_out, uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate)
{
	if (dev->vq_off || rows != 1 || !g16_dtype(w_dtype, w, k) || x % 16 || !g16_bias(b, b_dtype))
		return CUDA_TC_FALLBACK;
	const uint64_t gx = ((uint64_t)n_out + BATON_G16_WARPS - 1) / BATON_G16_WARPS;
	if (gx > 0x7fffffffu)
		return CUDA_TC_FALLBACK;
	struct baton_g16_args a = {
		.w = w, .x = x, .b = b, .y = y, .row_bytes = row_bytes, .w_dtype = w_dtype,
		.b_dtype = b_dtype, .n_out = n_out, .k = k, .accumulate = accumulate ? 1u : 0u,
	};
	const uint64_t before = dev->n_launch;
	int rc = cuda_launch_kx(dev, dev->k_g16_matmul, (uint32_t)gx, 1, 1, G16_THREADS, 0, &a,
	    sizeof a, "cuLaunchKernel baton_g16_matmul", PDL_MM(dev));
	if (!rc) /* writes y alone: the int8 blocks of x (mmvq_launch.c) still hold */
		cuda_mmvq_keep(dev, before, y, (uint64_t)n_out * 4, 0, 0);
	return rc;
}

int cuda_g16_matmuls(struct baton_dev *dev, baton_dptr x, uint32_t k, uint32_t rows,
    const struct cuda_g16_out *o, uint32_t n, int accumulate)
{
	if (dev->vq_off || rows != 1 || n < 1 || n > 3 || x % 16)
		return CUDA_TC_FALLBACK;
	struct baton_g16_n_args a = { .x = x, .k = k, .n = n, .accumulate = accumulate ? 1u : 0u };
	uint64_t gx = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (!g16_dtype(o[i].w_dtype, o[i].w, k) || !g16_bias(o[i].b, o[i].b_dtype))
			return CUDA_TC_FALLBACK;
		a.w[i] = o[i].w, a.b[i] = o[i].b, a.y[i] = o[i].y, a.row_bytes[i] = 2ull * k;
		a.w_dtype[i] = o[i].w_dtype, a.b_dtype[i] = o[i].b_dtype, a.n_out[i] = o[i].n_out;
		a.start[i] = (uint32_t)gx;
		gx += ((uint64_t)o[i].n_out + BATON_G16_WARPS - 1) / BATON_G16_WARPS;
		if (gx > 0x7fffffffu)
			return CUDA_TC_FALLBACK;
	}
	return cuda_launch_kx(dev, dev->k_g16_matmuls, (uint32_t)gx, 1, 1, G16_THREADS, 0, &a,
	    sizeof a, "cuLaunchKernel baton_g16_matmuls", PDL_MM(dev));
}

int cuda_g16_experts(struct baton_dev *dev, const struct baton_moe_layer *l, baton_dptr table,
    baton_dptr ids, baton_dptr weights)
{
	/* table entries are multiples of 256: a blob's alignment is its offsets' */
	if (dev->vq_off || l->batch != 1 || l->top_k > G16_TOP_K_MAX ||
	    l->gate_dtype != l->up_dtype || !g16_dtype(l->gate_dtype, l->gate_off, l->d_model) ||
	    !g16_dtype(l->up_dtype, l->up_off, l->d_model) ||
	    !g16_dtype(l->down_dtype, l->down_off, l->d_ff) || l->xn % 16 ||
	    l->d_ff < BATON_G16_GATE_ROWS)
		return CUDA_TC_FALLBACK;
	int rc;
	if ((rc = cuda_dbuf_need(dev, &dev->h, (uint64_t)l->top_k * l->d_ff * 4)))
		return rc;
	struct baton_g16_moe_args a = {
		.table = table, .ids = ids, .w = weights, .xn = l->xn, .h = dev->h.p, .x = l->x,
		.gate_off = l->gate_off, .up_off = l->up_off, .down_off = l->down_off,
		.gate_dtype = l->gate_dtype, .up_dtype = l->up_dtype, .down_dtype = l->down_dtype,
		.d_model = l->d_model, .d_ff = l->d_ff, .top_k = l->top_k,
	};
	const uint32_t W = BATON_G16_WARPS, GW = W * BATON_G16_GATE_ROWS;
	if ((rc = cuda_launch_kx(dev, dev->k_g16_gate_up, (l->d_ff + GW - 1) / GW, l->top_k, 1,
	         G16_THREADS, 0, &a, sizeof a, "cuLaunchKernel baton_g16_gate_up", PDL_EX(dev))))
		return rc;
	return cuda_launch_kx(dev, dev->k_g16_down, (l->d_model + W - 1) / W, 1, 1, G16_THREADS, 0,
	    &a, sizeof a, "cuLaunchKernel baton_g16_down", PDL_EX(dev));
}
