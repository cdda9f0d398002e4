/*
 * mmvq_rows_launch.c: the dense matmuls of passes of 2 to 64 rows
 * (mmvq_rows.cu): q4_K / q6_K weights against the rows quantized to int8
 * blocks (baton_mmvq_quant over all rows at once, into vr_x), and the
 * exact f32 kernel of a few rows for small f32 matrices (the routers),
 * opt-in with BATON_CUDA_VR_F32=1 (measured slower than ops.cu's).
 * BATON_CUDA_EXACT=1 (dev->vq_off) keeps the q4_K / q6_K ones on ops.cu's
 * exact kernels; the f32 one gives those kernels' bits, so it stays as
 * asked. BATON_CUDA_VR=0 turns both off (to compare).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/cuda/mmvq.h"
#include "engine/backend/cuda/mmvq_rows.h"
#include "engine/backend/host/host.h"

extern const unsigned char baton_engine_backend_cuda_mmvq_rows_fatbin[];
extern const size_t baton_engine_backend_cuda_mmvq_rows_fatbin_len;

#define VR_ROWS_MAX 64 /* passes of more rows: the tensor cores or ops.cu */

int cuda_vr_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	const char *s = getenv("BATON_CUDA_VR");
	dev->vr_off = s && strcmp(s, "0") == 0;
	/* the f32 kernel: opt-in (BATON_CUDA_VR_F32=1); on the H200 it was
	 * slower than ops.cu's 8-row kernel on the 128 x 2,048 router (20.4
	 * against 16.9 us at 16 rows, 16.1 against 12.2 at 2: 2026-12-02) */
	s = getenv("BATON_CUDA_VR_F32");
	dev->vr_f32 = s && strcmp(s, "1") == 0;
	CU(dev, d->ModuleLoadData(&dev->vr_mod, baton_engine_backend_cuda_mmvq_rows_fatbin),
	    "cuModuleLoadData of the multi-row GEMV kernels (sm_90 SASS, compute_90 PTX)");
	struct {
		CUfunction *f;
		const char *name;
	} k[] = {
		{ &dev->k_vr[0], "baton_mmvq_rows_2" },
		{ &dev->k_vr[1], "baton_mmvq_rows_4" },
		{ &dev->k_vr[2], "baton_mmvq_rows_8" },
		{ &dev->k_vr[3], "baton_mmvq_rows_16" },
		{ &dev->k_vr_f32[0], "baton_vr_f32_4" },
		{ &dev->k_vr_f32[1], "baton_vr_f32_8" },
	};
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
		CU(dev, d->ModuleGetFunction(k[i].f, dev->vr_mod, k[i].name), k[i].name);
	/* one launch of each on empty sizes (each returns at once): modules
	 * load lazily */
	struct baton_vr_args zr = { .tpr = 32 };
	struct baton_vr_f32_args zf = { 0 };
	void *zero[] = { &zr, &zr, &zr, &zr, &zf, &zf };
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
		void *params[] = { zero[i] };
		CU(dev, d->LaunchKernel(*k[i].f, 1, 1, 1, 32, 1, 1, 0, dev->stream, params, NULL),
		    "first launch of the multi-row GEMV kernels");
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

void cuda_vr_free(struct baton_dev *dev)
{
	cuda_dbuf_free(dev, &dev->vr_x);
	if (dev->vr_mod)
		dev->d->ModuleUnload(dev->vr_mod);
	dev->vr_mod = NULL;
}

/* The tile of rows a block takes, and its kernel. */
static uint32_t vr_tile(uint32_t rows, int *ki)
{
	if (rows <= 2)
		return *ki = 0, 2;
	if (rows <= 4)
		return *ki = 1, 4;
	if (rows <= 8)
		return *ki = 2, 8;
	return *ki = 3, 16;
}

/* 2 to 64 rows, short of the tensor cores' passes (tc_rows, 64, while
 * that path is not off for good) */
int cuda_vr_on(const struct baton_dev *dev, uint32_t rows)
{
	return !dev->vr_off && rows >= 2 && rows <= VR_ROWS_MAX &&
	    (dev->tc_state < 0 || rows < dev->tc_rows);
}

int cuda_vr_norm_out(struct baton_dev *dev, uint32_t rows, uint32_t cols, uint64_t *q,
    uint64_t *d)
{
	*q = *d = 0;
	if (dev->vq_off || !cuda_vr_on(dev, rows) || cols % 256)
		return 0;
	const uint64_t n = (uint64_t)rows * cols, qoff = cuda_round_up(n, 16); /* vr_quant's */
	int rc = cuda_dbuf_need(dev, &dev->vr_x, qoff + n / 32 * 4);
	if (rc)
		return rc;
	dev->vr_src = 0; /* vr_x is being written */
	*q = dev->vr_x.p;
	*d = dev->vr_x.p + qoff;
	return 0;
}

void cuda_vr_norm_done(struct baton_dev *dev, baton_dptr out, uint32_t rows, uint32_t cols)
{
	dev->vr_src = out;
	dev->vr_rows = rows;
	dev->vr_k = cols;
	dev->vr_mark = dev->n_launch; /* valid until another kernel is launched */
}

/* x (rows x k floats) quantized into vr_x: q at p, d at p + round_up(n, 16);
 * the last quantization where it still holds (the same x, nothing else
 * launched since: a multi-row rmsnorm's, or the last matmul's). */
static int vr_quant(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t k,
    CUdeviceptr *q, CUdeviceptr *d)
{
	const uint64_t n = (uint64_t)rows * k, qoff = cuda_round_up(n, 16);
	if (dev->vr_src == x && dev->vr_rows == rows && dev->vr_k == k &&
	    dev->vr_mark == dev->n_launch) {
		*q = dev->vr_x.p;
		*d = dev->vr_x.p + qoff;
		return 0;
	}
	dev->vr_src = 0;
	int rc = cuda_dbuf_need(dev, &dev->vr_x, qoff + n / 32 * 4);
	if (rc)
		return rc;
	*q = dev->vr_x.p;
	*d = dev->vr_x.p + qoff;
	struct baton_mmvq_quant_args a = { .x = x, .q = *q, .d = *d, .n = (uint32_t)n };
	if ((rc = cuda_launch(dev, dev->k_vq_quant, (uint32_t)((n + 255) / 256), 1, 256, &a,
	         "cuLaunchKernel baton_mmvq_quant (rows)")))
		return rc;
	dev->vr_src = x;
	dev->vr_rows = rows;
	dev->vr_k = k;
	return 0;
}

int cuda_vr_matmuls(struct baton_dev *dev, baton_dptr x, uint32_t k, uint32_t rows,
    const struct baton_matmul_out *m, uint32_t n, int accumulate)
{
	if (dev->vq_off || !cuda_vr_on(dev, rows) || n < 1 || n > 3 || k % 256)
		return CUDA_TC_FALLBACK;
	int ki;
	const uint32_t tile = vr_tile(rows, &ki);
	struct baton_vr_args a = { .k = k, .rows = rows, .accumulate = accumulate ? 1u : 0u,
		.start = { UINT32_MAX, UINT32_MAX, UINT32_MAX } };
	uint64_t gx = 0;
	/* one tpr for the launch: the matrices' own (a 65,536-row head is
	 * never with others) */
	a.tpr = cuda_mmvq_tpr(k, m[0].n_out);
	for (uint32_t i = 0; i < n; i++) {
		const struct baton_matmul_out *o = &m[i];
		const uint64_t rb = baton_compute_row_bytes((int)o->w_dtype, k);
		if (!cuda_mmvq_dtype_ok(o->w_dtype, o->w, k) || !rb || rb % 2 ||
		    cuda_mmvq_tpr(k, o->n_out) != a.tpr)
			return CUDA_TC_FALLBACK;
		const uint32_t rpb = BATON_VR_THREADS / a.tpr;
		a.w[i] = o->w, a.b[i] = o->b, a.y[i] = o->y, a.row_bytes[i] = rb;
		a.w_dtype[i] = o->w_dtype, a.b_dtype[i] = o->b_dtype, a.n_out[i] = o->n_out;
		a.start[i] = (uint32_t)gx;
		gx += ((uint64_t)o->n_out + rpb - 1) / rpb;
		if (gx > 0x7fffffffu)
			return CUDA_TC_FALLBACK;
	}
	CUdeviceptr q, d;
	int rc;
	if ((rc = vr_quant(dev, x, rows, k, &q, &d)))
		return rc;
	a.q = q;
	a.d = d;
	if ((rc = cuda_launch_k(dev, dev->k_vr[ki], (uint32_t)gx, (rows + tile - 1) / tile, 1,
	         BATON_VR_THREADS, 0, &a, sizeof a, "cuLaunchKernel baton_mmvq_rows")))
		return rc;
	/* y never overlaps x (matmul's checks): the quantization still holds */
	dev->vr_mark = dev->n_launch;
	return 0;
}

int cuda_vr_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows, baton_dptr y,
    int accumulate)
{
	if (!cuda_vr_on(dev, rows))
		return CUDA_TC_FALLBACK;
	if (w_dtype == BATON_DT_F32) {
		/* the exact f32 kernel's bits with more warps: small matrices
		 * only (the routers), where ops.cu's 8-row kernel has few
		 * (opt-in: it was not faster) */
		if (!dev->vr_f32 || k % 32 || w % 4 || n_out > 4096)
			return CUDA_TC_FALLBACK;
		const int ki = rows <= 16 ? 0 : 1;
		const uint32_t tile = ki ? 8 : 4;
		struct baton_vr_f32_args a = { .w = w, .x = x, .y = y, .b = b, .n_out = n_out, .k = k,
			.rows = rows, .accumulate = accumulate ? 1u : 0u, .b_dtype = b_dtype };
		const uint64_t before = dev->n_launch;
		int rc = cuda_launch(dev, dev->k_vr_f32[ki],
		    (n_out + BATON_VR_F32_WARPS - 1) / BATON_VR_F32_WARPS, (rows + tile - 1) / tile,
		    32 * BATON_VR_F32_WARPS, &a, "cuLaunchKernel baton_vr_f32");
		if (!rc) /* writes y alone: a kept quantization still holds */
			cuda_mmvq_keep(dev, before, y, (uint64_t)rows * n_out * 4, 0, 0);
		return rc;
	}
	const struct baton_matmul_out o = { .w = w, .b = b, .y = y, .w_dtype = w_dtype,
		.b_dtype = b_dtype, .n_out = n_out };
	return cuda_vr_matmuls(dev, x, k, rows, &o, 1, accumulate);
}
