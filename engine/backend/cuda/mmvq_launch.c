/*
 * mmvq_launch.c: the quantized batch-1 path of matmul and of the decode
 * step's experts (mmvq.cu): when it applies, its scratch (the activation
 * as int8 blocks), its launches. BATON_CUDA_EXACT=1 at open turns it off,
 * leaving ops.cu's and moe.cu's kernels, which give the host's bits.
 *
 * The activation is quantized once for the matmuls that read it back to
 * back (attention's q, k and v): a matmul reuses the last quantization
 * when its x is the same buffer and nothing but these matmuls has been
 * launched since (dev->n_launch counts every launch, cuBLAS call, copy
 * to the device and free). A one-row rmsnorm
 * writes that quantization of its output itself (cuda_mmvq_norm_out), so
 * the input norm's q, k and v and the head launch no quantize kernel; the
 * exact matmul and route_dev keep it valid when they write elsewhere
 * (cuda_mmvq_keep), so the experts after the router take the
 * post-attention norm's too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/cuda/mmvq.h"
#include "engine/backend/host/host.h"

extern const unsigned char baton_engine_backend_cuda_mmvq_fatbin[];
extern const size_t baton_engine_backend_cuda_mmvq_fatbin_len;

void cuda_mmvq_config(struct baton_dev *dev)
{
	const char *s = getenv("BATON_CUDA_EXACT");
	dev->vq_off = s && *s && strcmp(s, "0") != 0;
	/* BATON_CUDA_MMVQ_NARROW=1: the decode step's experts on the 16-thread
	 * block kernels even where the wide q4_K ones apply (to compare) */
	s = getenv("BATON_CUDA_MMVQ_NARROW");
	dev->vq_narrow = s && strcmp(s, "1") == 0;
	/* BATON_CUDA_PDL=1: the GEMVs of q/k/v and of matmul launched as
	 * programmatic dependents (cuda_launch_kx) */
	s = getenv("BATON_CUDA_PDL");
	dev->pdl = s && strcmp(s, "1") == 0;
}

int cuda_mmvq_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->ModuleLoadData(&dev->vq_mod, baton_engine_backend_cuda_mmvq_fatbin),
	    "cuModuleLoadData of the quantized GEMV kernels (sm_90 SASS, compute_90 PTX)");
	struct {
		CUfunction *f;
		const char *name;
	} k[] = {
		{ &dev->k_vq_quant, "baton_mmvq_quant" },
		{ &dev->k_vq_matmul, "baton_mmvq_matmul" },
		{ &dev->k_vq_gate_up, "baton_mmvq_gate_up" },
		{ &dev->k_vq_down, "baton_mmvq_down" },
		{ &dev->k_vq_gate_up4, "baton_mmvq_gate_up_q4k" },
		{ &dev->k_vq_down4, "baton_mmvq_down_q4k" },
		{ &dev->k_vq_matmuls, "baton_mmvq_matmuls" },
	};
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
		CU(dev, d->ModuleGetFunction(k[i].f, dev->vq_mod, k[i].name), k[i].name);
	/* one launch of each on empty sizes (each returns at once), as
	 * cuda_ops_load does: modules load lazily */
	struct baton_mmvq_quant_args zq = { 0 };
	struct baton_mmvq_args zm = { .tpr = 32 }; /* the GEMVs divide by it; no rows */
	struct baton_mmvq_moe_args ze = { .tpr = 32 };
	struct baton_mmvq_n_args zn = { .tpr = 32 };
	void *zero[] = { &zq, &zm, &ze, &ze, &ze, &ze, &zn };
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
		void *params[] = { zero[i] };
		CU(dev, d->LaunchKernel(*k[i].f, 1, 1, 1, 32, 1, 1, 0, dev->stream, params, NULL),
		    "first launch of the quantized GEMV kernels");
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

void cuda_mmvq_free(struct baton_dev *dev)
{
	cuda_dbuf_free(dev, &dev->vq_x);
	cuda_dbuf_free(dev, &dev->vq_h);
}

int cuda_mmvq_dtype_ok(uint32_t dt, uint64_t addr, uint32_t k)
{
	if (k % 256)
		return 0;
	return (dt == BATON_DT_Q4_K && addr % 4 == 0) || (dt == BATON_DT_Q6_K && addr % 2 == 0);
}

/* Threads per row: a warp for rows of up to eight 256-value blocks (16
 * threads a block; longer rows loop, each thread's blocks loaded
 * together), else two. Not the block's four: on the H200 at batch 1 the
 * q/k/v GEMVs of Qwen3-30B-A3B's shape (k 2,048) took 7.5 us at a warp a
 * row, 7.9 at two, 9.4 at four, and the o projection (k 4,096) 7.1 us at
 * two, 8.1 at one or four (ncu, each alone, 2026-12-04).
 * A matmul of so many rows (65,536 or more: the output head) that a warp
 * a row still fills the device takes a warp a row at any k: each
 * thread's blocks loaded together (row_part) and no barrier in the row's
 * sum. On the H200, the 151,936 x 2,048 q6_K head 171 us at 128 threads a
 * row, 120 us at 32 (q4_K 179 / 109). */
uint32_t cuda_mmvq_tpr(uint32_t k, uint32_t n_out)
{
	const uint32_t items = k / 256 * BATON_MMVQ_SUB;
	return n_out >= 65536u || items <= 128 ? 32 : 64;
}

/* x (n floats, n % 32 == 0) into b as int8 quants, then the f32 scales
 * at a 16-byte offset; *q and *d where they are. */
static int vq_quant(struct baton_dev *dev, struct dbuf *b, baton_dptr x, uint32_t n,
    CUdeviceptr *q, CUdeviceptr *d)
{
	const uint64_t qoff = cuda_round_up(n, 16);
	int rc = cuda_dbuf_need(dev, b, qoff + (uint64_t)n / 32 * 4);
	if (rc)
		return rc;
	*q = b->p;
	*d = b->p + qoff;
	struct baton_mmvq_quant_args a = { .x = x, .q = *q, .d = *d, .n = n };
	return cuda_launch(dev, dev->k_vq_quant, (n + 255) / 256, 1, 256, &a,
	    "cuLaunchKernel baton_mmvq_quant");
}

int cuda_mmvq_norm_out(struct baton_dev *dev, uint32_t rows, uint32_t cols, uint64_t *q,
    uint64_t *d)
{
	*q = *d = 0;
	if (dev->vq_off || rows != 1 || cols % 256)
		return 0;
	const uint64_t qoff = cuda_round_up(cols, 16); /* vq_quant's layout */
	int rc = cuda_dbuf_need(dev, &dev->vq_x, qoff + (uint64_t)cols / 32 * 4);
	if (rc)
		return rc;
	dev->vq_src = 0; /* vq_x is being written */
	*q = dev->vq_x.p;
	*d = dev->vq_x.p + qoff;
	return 0;
}

void cuda_mmvq_norm_done(struct baton_dev *dev, baton_dptr out, uint32_t cols)
{
	dev->vq_src = out;
	dev->vq_k = cols;
	dev->vq_mark = dev->n_launch; /* valid until another kernel is launched */
}

void cuda_mmvq_keep(struct baton_dev *dev, uint64_t before, baton_dptr a, uint64_t an,
    baton_dptr b, uint64_t bn)
{
	const uint64_t s = dev->vq_src, e = s + (uint64_t)dev->vq_k * 4;
	if (s && dev->vq_mark == before && dev->n_launch == before + 1 &&
	    (a + an <= s || e <= a) && (!bn || b + bn <= s || e <= b))
		dev->vq_mark = dev->n_launch;
}

/* x (k floats) as int8 blocks in vq_x: the last quantization where it
 * still holds (the same x, nothing else launched since), else anew. */
static int vq_x_of(struct baton_dev *dev, baton_dptr x, uint32_t k)
{
	if (dev->vq_src == x && dev->vq_k == k && dev->vq_mark == dev->n_launch)
		return 0;
	CUdeviceptr q, d;
	int rc = vq_quant(dev, &dev->vq_x, x, k, &q, &d);
	if (rc)
		return rc;
	dev->vq_src = x;
	dev->vq_k = k;
	return 0;
}

int cuda_mmvq_matmuls(struct baton_dev *dev, const struct baton_matmuls *mm)
{
	if (dev->vq_off || mm->rows != 1 || mm->n < 2)
		return CUDA_TC_FALLBACK;
	const uint32_t k = mm->k, tpr = cuda_mmvq_tpr(k, 0), rpb = BATON_MMVQ_THREADS / tpr;
	struct baton_mmvq_n_args a = { .k = k, .tpr = tpr,
		.start = { UINT32_MAX, UINT32_MAX, UINT32_MAX } };
	uint64_t gx = 0;
	for (uint32_t i = 0; i < mm->n; i++) {
		const struct baton_matmul_out *o = &mm->m[i];
		const uint64_t rb = baton_compute_row_bytes((int)o->w_dtype, k);
		if (!cuda_mmvq_dtype_ok(o->w_dtype, o->w, k) || !rb || rb % 2)
			return CUDA_TC_FALLBACK;
		a.w[i] = o->w, a.b[i] = o->b, a.y[i] = o->y, a.row_bytes[i] = rb;
		a.w_dtype[i] = o->w_dtype, a.b_dtype[i] = o->b_dtype, a.n_out[i] = o->n_out;
		a.start[i] = (uint32_t)gx;
		gx += ((uint64_t)o->n_out + rpb - 1) / rpb;
		if (gx > 0x7fffffffu)
			return CUDA_TC_FALLBACK;
	}
	int rc;
	if ((rc = vq_x_of(dev, mm->x, k)))
		return rc;
	a.q = dev->vq_x.p;
	a.d = dev->vq_x.p + cuda_round_up(k, 16);
	if ((rc = cuda_launch_kx(dev, dev->k_vq_matmuls, (uint32_t)gx, 1, 1, BATON_MMVQ_THREADS, 0, &a,
	         sizeof a, "cuLaunchKernel baton_mmvq_matmuls", 1)))
		return rc;
	dev->vq_mark = dev->n_launch;
	return 0;
}

int cuda_mmvq_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint64_t row_bytes,
    uint32_t n_out, uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate)
{
	if (dev->vq_off || rows != 1 || !cuda_mmvq_dtype_ok(w_dtype, w, k) || row_bytes % 2)
		return CUDA_TC_FALLBACK;
	const uint32_t tpr = cuda_mmvq_tpr(k, n_out), rpb = BATON_MMVQ_THREADS / tpr;
	const uint64_t gx = ((uint64_t)n_out + rpb - 1) / rpb;
	if (gx > 0x7fffffffu)
		return CUDA_TC_FALLBACK;
	int rc;
	const uint64_t qoff = cuda_round_up(k, 16);
	if ((rc = vq_x_of(dev, x, k)))
		return rc;
	struct baton_mmvq_args a = {
		.w = w, .q = dev->vq_x.p, .d = dev->vq_x.p + qoff, .b = b, .y = y,
		.row_bytes = row_bytes, .w_dtype = w_dtype, .b_dtype = b_dtype, .n_out = n_out, .k = k,
		.tpr = tpr, .accumulate = accumulate ? 1u : 0u,
	};
	if ((rc = cuda_launch_kx(dev, dev->k_vq_matmul, (uint32_t)gx, 1, 1, BATON_MMVQ_THREADS, 0, &a,
	         sizeof a, "cuLaunchKernel baton_mmvq_matmul", 1)))
		return rc;
	dev->vq_mark = dev->n_launch;
	return 0;
}

int cuda_mmvq_experts(struct baton_dev *dev, const struct baton_moe_layer *l, baton_dptr table,
    baton_dptr ids, baton_dptr weights)
{
	/* table entries are multiples of 256: a blob's alignment is its offsets' */
	if (dev->vq_off || l->batch != 1 ||
	    !cuda_mmvq_dtype_ok(l->gate_dtype, l->gate_off, l->d_model) ||
	    !cuda_mmvq_dtype_ok(l->up_dtype, l->up_off, l->d_model) ||
	    !cuda_mmvq_dtype_ok(l->down_dtype, l->down_off, l->d_ff) || l->top_k > 65535 ||
	    l->xn % 4)
		return CUDA_TC_FALLBACK;
	int rc;
	CUdeviceptr xq, xd, hq, hd;
	if ((rc = cuda_dbuf_need(dev, &dev->h, (uint64_t)l->top_k * l->d_ff * 4)))
		return rc;
	if (dev->vq_src == l->xn && dev->vq_k == l->d_model && dev->vq_mark == dev->n_launch) {
		/* the post-attention norm's own quantization, kept over the
		 * router and route_dev, which write elsewhere */
		xq = dev->vq_x.p;
		xd = dev->vq_x.p + cuda_round_up(l->d_model, 16);
	} else if ((rc = vq_quant(dev, &dev->vq_x, l->xn, l->d_model, &xq, &xd))) {
		return rc;
	}
	dev->vq_src = 0; /* vq_x no longer holds a matmul's x */
	struct baton_mmvq_moe_args a = {
		.table = table, .ids = ids, .w = weights, .q = xq, .d = xd, .h = dev->h.p, .x = l->x,
		.gate_off = l->gate_off, .up_off = l->up_off, .down_off = l->down_off,
		.gate_dtype = l->gate_dtype, .up_dtype = l->up_dtype, .down_dtype = l->down_dtype,
		.d_model = l->d_model, .d_ff = l->d_ff, .top_k = l->top_k,
		.tpr = cuda_mmvq_tpr(l->d_model, 0),
	};
	/* q4_K gate and up at 16-byte alignment: the wide kernel, which
	 * quantizes h itself; else gate_up, then h's quantization */
	const int gu4 = l->gate_dtype == BATON_DT_Q4_K && l->up_dtype == BATON_DT_Q4_K &&
	    l->gate_off % 16 == 0 && l->up_off % 16 == 0 && l->d_ff % 32 == 0 && !dev->vq_narrow;
	const int dn4 = l->down_dtype == BATON_DT_Q4_K && l->down_off % 16 == 0 && !dev->vq_narrow;
	uint32_t rpb = BATON_MMVQ_THREADS / a.tpr;
	if (gu4) {
		const uint64_t n = (uint64_t)l->top_k * l->d_ff, qoff = cuda_round_up(n, 16);
		if ((rc = cuda_dbuf_need(dev, &dev->vq_h, qoff + n / 32 * 4)))
			return rc;
		hq = dev->vq_h.p;
		hd = dev->vq_h.p + qoff;
		a.hq = hq;
		a.hd = hd;
		if ((rc = cuda_launch(dev, dev->k_vq_gate_up4, l->d_ff / 32, l->top_k,
		         32 * BATON_MMVQ_GU_WARPS, &a, "cuLaunchKernel baton_mmvq_gate_up_q4k")))
			return rc;
	} else if ((rc = cuda_launch(dev, dev->k_vq_gate_up, (l->d_ff + rpb - 1) / rpb, l->top_k,
	                BATON_MMVQ_THREADS, &a, "cuLaunchKernel baton_mmvq_gate_up")) ||
	    (rc = vq_quant(dev, &dev->vq_h, dev->h.p, l->top_k * l->d_ff, &hq, &hd))) {
		return rc;
	}
	a.q = hq;
	a.d = hd;
	if (dn4)
		return cuda_launch(dev, dev->k_vq_down4,
		    (l->d_model + BATON_MMVQ_DOWN_WARPS - 1) / BATON_MMVQ_DOWN_WARPS, 1,
		    32 * BATON_MMVQ_DOWN_WARPS, &a, "cuLaunchKernel baton_mmvq_down_q4k");
	/* the down rows of every pair share a row's threads */
	a.tpr = cuda_mmvq_tpr(l->d_ff * l->top_k, 0);
	rpb = BATON_MMVQ_THREADS / a.tpr;
	return cuda_launch(dev, dev->k_vq_down, (l->d_model + rpb - 1) / rpb, 1, BATON_MMVQ_THREADS,
	    &a, "cuLaunchKernel baton_mmvq_down");
}
