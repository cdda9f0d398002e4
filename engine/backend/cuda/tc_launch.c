/*
 * tc_launch.c: the tensor-core path of the `cuda` backend, for passes of
 * many rows (prefill, large batches; cuda_tc_on decides): matmul, the MoE
 * experts and attention as cuBLAS GEMMs in bf16 with f32 sums (blas.c),
 * around the small kernels of gemm.cu and attn.cu (argument blocks in
 * tc.h). Not the host's order, so not its bits: docs/internals/cuda-ops.md
 * ("Prefill on the tensor cores") gives the tolerances and what stays
 * batch invariant.
 *
 *   matmul     x to bf16; weights decoded to bf16 in slabs of output rows
 *              (bf16 weights at 16-byte alignment used in place); one GEMM
 *              per slab into y (beta 1 to accumulate); the bias after.
 *   experts    the pairs grouped by expert, each expert's tokens gathered
 *              into bf16 rows padded to its bucket's largest count (struct
 *              plan); per group of experts that fits the scratch,
 *              gate and up (one matrix of 2 d_ff rows) and down decoded to
 *              bf16 (bf16 experts used in place), then by default
 *              egemm.cu's two launches (gate/up with SwiGLU, down) over
 *              every expert's tiles, else cuBLAS's GEMMs per bucket with
 *              SwiGLU between; each token's outputs, weighted, added into
 *              its row of x in rank order.
 *   attention  per group of queries: the sequence's keys and values out
 *              of the (paged) cache into bf16 per KV head, the queries
 *              grouped by KV head, S = scale Q K^T (one strided-batched
 *              GEMM over KV heads), the causal softmax to bf16, O = P V,
 *              then O back into the slot's layout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/cuda/tc.h"
#include "engine/backend/host/host.h"

#define BF16 14 /* cudaDataType CUDA_R_16BF */

enum { B_W, B_X, B_A, B_B, B_C, B_MAP };

#define ATTN_GROUP 256 /* queries per attention group, at most (below) */

/* A scratch buffer of at least `bytes`, or the fallback (said once per
 * device on stderr: the pass then runs on the CUDA cores). */
static int need(struct baton_dev *dev, int i, uint64_t bytes)
{
	if (!cuda_dbuf_need(dev, &dev->tc_buf[i], bytes))
		return 0;
	if (!dev->tc_warned)
		fprintf(stderr, "baton cuda: no device memory for %llu MiB of tensor-core scratch: "
		    "such passes run on the CUDA cores (%s)\n", (unsigned long long)(bytes >> 20), dev->err);
	dev->tc_warned = 1;
	return CUDA_TC_FALLBACK;
}

static uint32_t grid_for(uint64_t units)
{
	uint64_t b = (units + BATON_TC_THREADS - 1) / BATON_TC_THREADS;
	return (uint32_t)(b < 8192 ? (b ? b : 1) : 8192);
}

static int launch(struct baton_dev *dev, CUfunction f, uint64_t units, uint32_t gy, void *args,
    const char *what)
{
	return cuda_launch_k(dev, f, grid_for(units), gy, 1, BATON_TC_THREADS, 0, args, 0, what);
}

/* 1 when rows of dt at `base`, row_bytes apart, suit the vector decoders. */
static int vec_ok(uint64_t base, uint32_t dt, uint64_t rb)
{
	if (dt == BATON_DT_Q4_K || dt == BATON_DT_Q5_K)
		return base % 8 == 0 && rb % 8 == 0;
	return base % 2 == 0 && rb % 2 == 0;
}

static int bias(struct baton_dev *dev, baton_dptr y, baton_dptr b, uint32_t b_dtype,
    uint32_t rows, uint32_t n_out)
{
	struct baton_tc_bias_args ba = { .y = y, .b = b, .rows = rows, .n_out = n_out, .b_dtype = b_dtype };
	return launch(dev, dev->k_tc_bias, (uint64_t)rows * n_out, 1, &ba, "cuLaunchKernel baton_tc_bias");
}

int cuda_tc_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint64_t rb,
    uint32_t n_out, uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate)
{
	int rc;
	/* f32 weights (the MoE routers, whose logits pick the experts) keep
	 * the exact order: cuBLAS's f32 GEMM took 183 us for a 512-row
	 * router pass against the exact kernel's ~44 us (128 outputs are too
	 * few tiles), and TF32 gained nothing measurable (H200, 2026-12-02).
	 * Without a bias, at k % 32 == 0, baton_tc_mm_f32 gives the exact
	 * kernel's bits with each x row read once for 32 outputs. */
	if (w_dtype == BATON_DT_F32) {
		if (b || k % 32 || w % 4 || rb != 4ull * k || !dev->tc_mmf)
			return CUDA_TC_FALLBACK;
		const uint32_t per = BATON_TC_MMF_WARPS * BATON_TC_MMF_O;
		const uint64_t gy = (rows + BATON_TC_MMF_R - 1) / BATON_TC_MMF_R;
		if (gy > 65535)
			return CUDA_TC_FALLBACK;
		struct baton_tc_mm_f32_args ma = {
			.w = w, .x = x, .y = y, .n_out = n_out, .k = k, .rows = rows,
			.accumulate = accumulate ? 1u : 0u,
		};
		const uint64_t before = dev->n_launch;
		if ((rc = cuda_launch_k(dev, dev->k_tc_mm_f32, (n_out + per - 1) / per, (uint32_t)gy, 1,
		         32 * BATON_TC_MMF_WARPS, 0, &ma, sizeof ma, "cuLaunchKernel baton_tc_mm_f32")))
			return rc;
		cuda_mmvq_keep(dev, before, y, (uint64_t)rows * n_out * 4, 0, 0); /* writes y alone */
		return 0;
	}
	if ((uint64_t)rows * k > 0x7fffffffull)
		return CUDA_TC_FALLBACK;
	if (k % 8)
		return CUDA_TC_FALLBACK;
	const int direct = w_dtype == BATON_DT_BF16 && w % 16 == 0;
	uint64_t slab = direct ? n_out : dev->tc_scratch / ((uint64_t)k * 2);
	if (slab > n_out)
		slab = n_out;
	if (!slab)
		slab = 1;
	if ((rc = need(dev, B_X, (uint64_t)rows * k * 2)) ||
	    (!direct && (rc = need(dev, B_W, slab * k * 2))))
		return rc;
	/* x to bf16, unless the last matmul left it there and nothing has
	 * written device memory since (the need above kept the buffer) */
	if (!(dev->tc_x_src == x && dev->tc_x_rows == rows && dev->tc_x_k == k &&
	        dev->tc_x_mark == dev->n_launch)) {
		struct baton_tc_rows_args ra = {
			.src = x, .dst = dev->tc_buf[B_X].p, .map = 0, .rows = rows, .cols = k,
			.src_ld = k, .div = 1,
		};
		if ((rc = launch(dev, dev->k_tc_rows, (uint64_t)rows * k / 8, 1, &ra,
		         "cuLaunchKernel baton_tc_rows")))
			return rc;
	}
	/* BATON_TC_MM_EG=1: egemm.cu's kernel on the whole matrix, one launch
	 * and no cuBLAS call on the host */
	const int eg = direct && dev->tc_mm_eg && n_out % BATON_TC_EG_COLS_DOWN == 0 && k % 32 == 0;
	if (eg) {
		struct baton_tc_egemm_args ea = {
			.w = w, .x = dev->tc_buf[B_X].p, .out = y, .k = k, .n = n_out,
			.swiglu = accumulate ? 2u : 0u, .rows = rows,
		};
		const uint32_t tr = dev->tc_eg_rows;
		if ((rc = cuda_launch(dev, tr == 128 ? dev->k_tc_egemm_m128 : dev->k_tc_egemm,
		         (rows + tr - 1) / tr, n_out / BATON_TC_EG_COLS_DOWN, 2 * tr, &ea,
		         "cuLaunchKernel baton_tc_egemm matmul")))
			return rc;
	}
	for (uint64_t o0 = 0; !eg && o0 < n_out; o0 += slab) {
		const uint32_t s = (uint32_t)(n_out - o0 < slab ? n_out - o0 : slab);
		CUdeviceptr wa = w + o0 * rb;
		if (!direct) {
			struct baton_tc_dequant_args da = {
				.table = 0, .src = w + o0 * rb, .src_off = 0, .row_bytes = rb,
				.dst = dev->tc_buf[B_W].p, .dst_stride = 0, .dst_row0 = 0,
				.rows = s, .cols = k, .dtype = w_dtype,
				.vec = (uint32_t)vec_ok(w + o0 * rb, w_dtype, rb),
			};
			if ((rc = launch(dev, dev->k_tc_dequant, (uint64_t)s * k / 8, 1, &da,
			         "cuLaunchKernel baton_tc_dequant")))
				return rc;
			wa = dev->tc_buf[B_W].p;
		}
		struct cuda_gemm g = {
			.ta = 1, .tb = 0, .m = (int)s, .n = (int)rows, .k = (int)k,
			.alpha = 1.0f, .beta = accumulate ? 1.0f : 0.0f,
			.a = wa, .b = dev->tc_buf[B_X].p, .c = y + o0 * 4,
			.a_type = BF16, .b_type = BF16, .lda = (int)k, .ldb = (int)k, .ldc = (int)n_out,
			.batch = 1, .what = "cublas matmul",
		};
		if ((rc = cuda_blas_gemm(dev, &g)))
			return rc;
	}
	if (b && (rc = bias(dev, y, b, b_dtype, rows, n_out)))
		return rc;
	dev->tc_x_src = x, dev->tc_x_rows = rows, dev->tc_x_k = k, dev->tc_x_mark = dev->n_launch;
	return 0;
}

/* The pinned stage, at least `bytes` of it, once its last copy has run:
 * the caller writes what to send there (no copy through malloc'd memory),
 * then stage_send queues it. */
static void *stage_get(struct baton_dev *dev, uint64_t bytes)
{
	const struct cuda_driver *d = dev->d;
	if (dev->tc_stage_busy) {
		if (d->EventSynchronize(dev->tc_staged) != CUDA_SUCCESS) {
			cuda_set_err(dev, "cuEventSynchronize (tc staging) failed");
			return NULL;
		}
		dev->tc_stage_busy = 0;
	}
	if (dev->tc_stage_cap < bytes) {
		if (dev->tc_stage)
			d->MemFreeHost(dev->tc_stage);
		dev->tc_stage = NULL;
		dev->tc_stage_cap = 0;
		const uint64_t cap = cuda_round_up(bytes, 1u << 16);
		void *p = NULL;
		if (d->MemHostAlloc(&p, cap, 0) != CUDA_SUCCESS) {
			cuda_set_err(dev, "cuMemHostAlloc (tc staging) of %llu bytes failed",
			    (unsigned long long)cap);
			return NULL;
		}
		dev->tc_stage = p;
		dev->tc_stage_cap = cap;
	}
	return dev->tc_stage;
}

static int stage_send(struct baton_dev *dev, uint64_t bytes, CUdeviceptr dst)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->MemcpyHtoDAsync(dst, dev->tc_stage, bytes, dev->stream),
	    "cuMemcpyHtoDAsync (tc maps)");
	CU(dev, d->EventRecord(dev->tc_staged, dev->stream), "cuEventRecord (tc staging)");
	dev->tc_stage_busy = 1;
	return 0;
}

/* How a pass's pairs become GEMM rows. The experts used (U) are sorted
 * by their pair counts, largest first, and cut into buckets whose counts
 * are within 3/4 of the bucket's first (all counts of 8 or fewer in one):
 * a bucket's experts are padded to its largest count (a multiple of 8),
 * not the pass's, so a few popular experts do not pad all the others.
 * Expert i (sorted order) owns rows base[i] .. base[i + 1]; bucket b is
 * experts b0[b] .. b0[b + 1], each of pad[b] rows. */
struct plan {
	uint64_t U, R, nb;
	uint64_t *blob;           /* [U] sorted */
	uint64_t *base;           /* [U + 1] */
	uint64_t *b0, *pad;       /* [nb + 1], [nb] */
	uint32_t *prow;           /* [n] the row of pair p */
	uint32_t *cnt;            /* [U] sorted: each expert's pairs */
};

static void plan_free(struct plan *pl)
{
	free(pl->blob), free(pl->base), free(pl->b0), free(pl->pad), free(pl->prow), free(pl->cnt);
}

static int by_count(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b; /* (count << 32 | first use), descending count */
	const uint64_t cx = x[0] >> 32, cy = y[0] >> 32;
	if (cx != cy)
		return cx > cy ? -1 : 1;
	return (x[0] & 0xffffffffu) < (y[0] & 0xffffffffu) ? -1 : 1;
}

#define PLAN_MORE (-2) /* more experts than umax: ask again with umax = n */

/* umax: the most distinct blobs expected (a layer's experts), so the
 * per-expert arrays and the hash are that small, not n pairs large. */
static int plan_make(struct plan *pl, const baton_dptr *blobs, uint64_t n, uint64_t umax,
    uint32_t q)
{
	memset(pl, 0, sizeof *pl);
	const uint64_t um = umax && umax < n ? umax : n;
	/* the experts, in order of first use (a hash of the blob addresses):
	 * group[p], their blobs and counts */
	uint64_t cap = 16;
	int bits = 4;
	while (cap < 2 * um)
		cap <<= 1, bits++;
	uint64_t *keys = calloc(cap, sizeof *keys), *gblob = malloc(um * sizeof *gblob);
	uint64_t *key = malloc(um * sizeof *key);
	uint32_t *gid = malloc(cap * sizeof *gid), *group = malloc(n * sizeof *group);
	uint32_t *count = calloc(um, sizeof *count), *rank = malloc(um * sizeof *rank);
	pl->prow = malloc(n * sizeof *pl->prow);
	int rc = keys && gblob && key && gid && group && count && rank && pl->prow ? 0 : BATON_ENOMEM;
	uint64_t U = 0;
	for (uint64_t p = 0; !rc && p < n; p++) {
		const uint64_t b = blobs[p];
		uint64_t h = ((b >> 6) * 0x9E3779B97F4A7C15ull) >> (64 - bits);
		while (keys[h] && keys[h] != b)
			h = (h + 1) & (cap - 1);
		if (!keys[h]) {
			if (U == um) {
				rc = PLAN_MORE;
				break;
			}
			keys[h] = b;
			gid[h] = (uint32_t)U;
			gblob[U++] = b;
		}
		group[p] = gid[h];
		count[gid[h]]++;
	}
	free(keys), free(gid);
	pl->U = U;
	pl->blob = malloc((U ? U : 1) * sizeof *pl->blob);
	pl->base = malloc((U + 1) * sizeof *pl->base);
	pl->b0 = malloc((U + 1) * sizeof *pl->b0);
	pl->pad = malloc((U ? U : 1) * sizeof *pl->pad);
	pl->cnt = malloc((U ? U : 1) * sizeof *pl->cnt);
	if (!rc && (!pl->blob || !pl->base || !pl->b0 || !pl->pad || !pl->cnt))
		rc = BATON_ENOMEM;
	if (!rc) {
		for (uint64_t e = 0; e < U; e++)
			key[e] = (uint64_t)count[e] << 32 | e;
		qsort(key, U, sizeof *key, by_count);
		uint64_t r = 0;
		for (uint64_t i = 0; i < U;) {
			const uint64_t pad = cuda_round_up(key[i] >> 32, q);
			uint64_t j = i;
			while (j < U && cuda_round_up(key[j] >> 32, q) * 4 >= pad * 3)
				j++; /* at pad 8: all the rest */
			pl->b0[pl->nb] = i;
			pl->pad[pl->nb++] = pad;
			for (; i < j; i++) {
				const uint32_t e = (uint32_t)(key[i] & 0xffffffffu);
				rank[e] = (uint32_t)i;
				pl->blob[i] = gblob[e];
				pl->cnt[i] = (uint32_t)(key[i] >> 32);
				pl->base[i] = r;
				r += pad;
			}
		}
		pl->b0[pl->nb] = U;
		pl->base[U] = pl->R = r;
		for (uint64_t e = 0; e < U; e++)
			count[e] = 0; /* now each expert's next row */
		for (uint64_t p = 0; p < n; p++) /* an expert's pairs in p order */
			pl->prow[p] = (uint32_t)(pl->base[rank[group[p]]] + count[group[p]]++);
	}
	free(gblob), free(key), free(group), free(count), free(rank);
	if (rc)
		plan_free(pl);
	return rc;
}

/* One step of the experts' GEMMs (0 gate/up, 1 down) over the sorted
 * experts lo .. hi - 1 of one chunk (first g0), by dev->tc_egemm's way.
 * pa/pb/pc: the device pointer arrays (na entries an expert: gate/up of
 * experts whose gate and up are apart take two, m = F each). */
struct eg {
	const struct plan *pl;
	uint32_t D, F, na, mode, q;
	CUdeviceptr W, Wd, X, GU, Hb, O; /* scratch (W, Wd: the decoded chunk) */
	CUdeviceptr pa[2], pb[2], pc[2];   /* pointer arrays of each step */
};

static int eg_step(struct baton_dev *dev, const struct eg *e, int step, uint64_t g0, uint64_t g1)
{
	const struct plan *pl = e->pl;
	const uint32_t D = e->D, F = e->F, na = step ? 1 : e->na;
	const int m = step ? (int)D : (int)(e->na == 1 ? 2 * F : F), k = step ? (int)F : (int)D;
	const int ldc = step ? (int)D : (int)(2 * F);
	const char *what = step ? "cublas experts down" : "cublas experts gate/up";
	int rc;
	if (e->mode >= 2 && !dev->tc_grouped_said &&
	    (e->mode == 3 ? g1 - g0 : pl->nb) <= CUDA_GEMM_GROUPS_MAX) {
		int gm[CUDA_GEMM_GROUPS_MAX], gn[CUDA_GEMM_GROUPS_MAX], gk[CUDA_GEMM_GROUPS_MAX];
		int lda[CUDA_GEMM_GROUPS_MAX], ldb[CUDA_GEMM_GROUPS_MAX], lc[CUDA_GEMM_GROUPS_MAX];
		int sz[CUDA_GEMM_GROUPS_MAX];
		int ng = 0;
		if (e->mode == 3) { /* an expert a group, its own count */
			for (uint64_t i = g0; i < g1; i++, ng++) {
				gn[ng] = (int)cuda_round_up(pl->cnt[i], e->q);
				sz[ng] = (int)na;
			}
		} else {
			for (uint64_t b = 0; b < pl->nb; b++) {
				const uint64_t lo = pl->b0[b] > g0 ? pl->b0[b] : g0;
				const uint64_t hi = pl->b0[b + 1] < g1 ? pl->b0[b + 1] : g1;
				if (lo >= hi)
					continue;
				gn[ng] = (int)pl->pad[b];
				sz[ng++] = (int)((hi - lo) * na);
			}
		}
		{
			for (int i = 0; i < ng; i++)
				gm[i] = m, gk[i] = k, lda[i] = k, ldb[i] = k, lc[i] = ldc;
			struct cuda_gemm_groups gg = {
				.ta = 1, .tb = 0, .groups = ng, .a_type = BF16, .b_type = BF16,
				.m = gm, .n = gn, .k = gk, .lda = lda, .ldb = ldb, .ldc = lc, .size = sz,
				.a = e->pa[step] + g0 * na * 8, .b = e->pb[step] + g0 * na * 8,
				.c = e->pc[step] + g0 * na * 8, .what = what,
			};
			if ((rc = cuda_blas_gemm_grouped(dev, &gg)) != CUDA_TC_FALLBACK)
				return rc;
		}
	}
	for (uint64_t b = 0; b < pl->nb; b++) {
		const uint64_t lo = pl->b0[b] > g0 ? pl->b0[b] : g0;
		const uint64_t hi = pl->b0[b + 1] < g1 ? pl->b0[b + 1] : g1;
		if (lo >= hi)
			continue;
		const uint64_t r0 = pl->base[lo], pad = pl->pad[b];
		struct cuda_gemm g = {
			.ta = 1, .tb = 0, .m = m, .n = (int)pad, .k = k, .alpha = 1.0f, .beta = 0.0f,
			.a_type = BF16, .b_type = BF16, .lda = k, .ldb = k, .ldc = ldc,
			.batch = (int)((hi - lo) * na), .what = what,
		};
		if (e->mode == 0) { /* the decoded chunk, evenly strided */
			g.a = (step ? e->Wd + (lo - g0) * D * F * 2 : e->W + (lo - g0) * 2 * F * D * 2);
			g.b = step ? e->Hb + r0 * F * 2 : e->X + r0 * D * 2;
			g.c = step ? e->O + r0 * D * 4 : e->GU + r0 * 2 * F * 4;
			g.sa = step ? (long long)D * F : 2ll * F * D;
			g.sb = (long long)(pad * (uint64_t)k);
			g.sc = (long long)(pad * (uint64_t)ldc);
			rc = cuda_blas_gemm(dev, &g);
		} else {
			g.a = e->pa[step] + lo * na * 8;
			g.b = e->pb[step] + lo * na * 8;
			g.c = e->pc[step] + lo * na * 8;
			rc = cuda_blas_gemm_ptrs(dev, &g);
		}
		if (rc)
			return rc;
	}
	return 0;
}

/* egemm.cu's shapes: its tiles divide the outputs (its k step, 32, then
 * divides both k). */
static int eg_shapes_ok(uint32_t D, uint32_t F)
{
	return D % BATON_TC_EG_COLS_DOWN == 0 && F % BATON_TC_EG_COLS_GU == 0;
}

/* egemm.cu's tiles for an expert of c rows (blocks of dev->tc_eg_rows). */
static uint64_t eg_tiles(const struct baton_dev *dev, uint64_t c)
{
	return (c + dev->tc_eg_rows - 1) / dev->tc_eg_rows;
}

/* Each token's experts' rows of O, weighted, added into its row of x
 * (baton_tc_combine; prow, w: each pair's row and weight). */
static int combine(struct baton_dev *dev, const struct baton_moe_layer *l, CUdeviceptr O,
    CUdeviceptr prow, CUdeviceptr w)
{
	struct baton_tc_combine_args cb = {
		.o = O, .x = l->x, .prow = prow, .w = w, .tokens = l->batch, .cols = l->d_model,
		.top_k = l->top_k,
	};
	const uint32_t gx = (l->d_model / 4 + BATON_TC_THREADS - 1) / BATON_TC_THREADS;
	return cuda_launch_k(dev, dev->k_tc_combine, gx, l->batch < 65535 ? l->batch : 65535, 1,
	    BATON_TC_THREADS, 0, &cb, 0, "cuLaunchKernel baton_tc_combine");
}

/* One step of egemm.cu's kernel over nt tiles (mode 4). */
static int eg_kernel(struct baton_dev *dev, CUdeviceptr tiles, uint64_t nt, CUdeviceptr w,
    uint64_t w_off, CUdeviceptr w2, uint64_t w2_off, CUdeviceptr x, CUdeviceptr out, uint32_t k,
    uint32_t n, uint32_t swiglu)
{
	struct baton_tc_egemm_args ea = {
		.tiles = tiles, .w = w, .w2 = w2, .w_off = w_off, .w2_off = w2_off, .x = x, .out = out,
		.k = k, .n = n, .swiglu = swiglu,
	};
	const uint32_t gy = n / (swiglu ? BATON_TC_EG_COLS_GU : BATON_TC_EG_COLS_DOWN);
	if (!nt)
		return 0;
	const int m128 = dev->tc_eg_rows == 128;
	return cuda_launch(dev, m128 ? dev->k_tc_egemm_m128 : dev->k_tc_egemm, (uint32_t)nt, gy,
	    m128 ? 256 : BATON_TC_EG_THREADS, &ea,
	    swiglu ? "cuLaunchKernel baton_tc_egemm gate/up" : "cuLaunchKernel baton_tc_egemm down");
}

int cuda_tc_experts(struct baton_dev *dev, const struct baton_moe_layer *l, const baton_dptr *blobs,
    uint64_t n, const float *w)
{
	const uint32_t D = l->d_model, F = l->d_ff;
	int rc;
	if (D % 8 || F % 8 || l->gate_dtype == BATON_DT_F32 || l->up_dtype == BATON_DT_F32 ||
	    l->down_dtype == BATON_DT_F32 || n > 0x7fffffffull)
		return CUDA_TC_FALLBACK;
	struct plan pl;
	if ((rc = plan_make(&pl, blobs, n, l->n_experts, dev->tc_pad)) == PLAN_MORE)
		rc = plan_make(&pl, blobs, n, 0, dev->tc_pad);
	if (rc)
		return rc;
	const uint64_t U = pl.U, R = pl.R;
	if (R * (2ull * F > D ? 2ull * F : D) > 0x7fffffffull) {
		plan_free(&pl);
		return CUDA_TC_FALLBACK;
	}
	/* bf16 experts at 16-byte alignment are the GEMMs' operands as they
	 * are: nothing decoded, each expert's weights read once */
	int inplace = dev->tc_inplace && l->gate_dtype == BATON_DT_BF16 &&
	    l->up_dtype == BATON_DT_BF16 && l->down_dtype == BATON_DT_BF16;
	for (uint64_t e = 0; inplace && e < U; e++)
		if ((pl.blob[e] + l->gate_off) % 16 || (pl.blob[e] + l->up_off) % 16 ||
		    (pl.blob[e] + l->down_off) % 16)
			inplace = 0;
	const int eg_ok = eg_shapes_ok(D, F);
	uint32_t mode = dev->tc_egemm;
	if (mode == TC_EGEMM_DEFAULT || (mode == 4 && !eg_ok))
		mode = eg_ok ? 4 : inplace ? 1 : 0;
	if (inplace && mode == 0)
		mode = 1;
	/* gate and up as one matrix of 2 F rows: always in the scratch, in
	 * place where up follows gate */
	const uint32_t na = !inplace || l->up_off == l->gate_off + 2ull * F * D ? 1 : 2;
	const uint64_t gbytes = (uint64_t)F * D * 2 * 3; /* one expert's bf16 gate, up, down */
	uint64_t Gn = inplace ? U : dev->tc_scratch / gbytes;
	if (Gn > U)
		Gn = U;
	if (!Gn)
		Gn = 1;
	/* the maps: table[U] (u64, sorted order), rowmap[R] (u32), prow[n]
	 * (u32: pair p's row), w[n] (f32); then, for the pointer-array
	 * GEMMs, A, B and C of gate/up (na U each) and of down (U each) */
	const uint64_t off_map = U * 8, off_prow = off_map + R * 4;
	const uint64_t off_w = cuda_round_up(off_prow + n * 4, 16);
	const uint64_t off_ptr = cuda_round_up(off_w + n * 4, 16);
	const uint32_t tr = dev->tc_eg_rows; /* mode 4: each expert's rows in tiles of tr */
	uint64_t nt = 0;
	for (uint64_t e = 0; mode == 4 && e < U; e++)
		nt += eg_tiles(dev, pl.cnt[e]);
	const uint64_t mbytes = off_ptr + (mode == 4 ? cuda_round_up(3 * U * 8, 16) + nt * 16 :
	                                   mode     ? (3 * na * U + 3 * U) * 8 : 0);
	char *host = NULL;
	if ((rc = need(dev, B_MAP, mbytes)) || (rc = need(dev, B_X, R * D * 2)) ||
	    (mode != 4 && (rc = need(dev, B_A, R * 2 * F * 4))) || (rc = need(dev, B_B, R * F * 2)) ||
	    (rc = need(dev, B_C, R * D * 4)) || (!inplace && (rc = need(dev, B_W, Gn * gbytes))) ||
	    (rc = (host = stage_get(dev, mbytes)) ? 0 : BATON_EIO)) {
		plan_free(&pl);
		return rc;
	}
	const CUdeviceptr dtab = dev->tc_buf[B_MAP].p, dmap = dtab + off_map, dw = dtab + off_w,
	    dprow = dtab + off_prow;
	const CUdeviceptr X = dev->tc_buf[B_X].p, GU = dev->tc_buf[B_A].p, Hb = dev->tc_buf[B_B].p,
	    O = dev->tc_buf[B_C].p, W = inplace ? 0 : dev->tc_buf[B_W].p;
	const CUdeviceptr Wd = W + Gn * (uint64_t)F * D * 4; /* after Gn gate+up matrices */
	struct eg eg = {
		.pl = &pl, .D = D, .F = F, .na = na, .mode = mode, .q = dev->tc_pad, .W = W, .Wd = Wd, .X = X, .GU = GU,
		.Hb = Hb, .O = O,
	};
	uint32_t *rowmap = (uint32_t *)(host + off_map);
	memcpy(host, pl.blob, U * 8);
	memset(rowmap, 0xff, R * 4);
	for (uint64_t p = 0; p < n; p++)
		rowmap[pl.prow[p]] = (uint32_t)p;
	memcpy(host + off_prow, pl.prow, n * 4);
	memcpy(host + off_w, w, n * 4);
	if (mode == 4) { /* each expert's gate, up and down; then the tiles */
		uint64_t *wg = (uint64_t *)(host + off_ptr), *wu = wg + U, *wd = wu + U;
		uint32_t *tl = (uint32_t *)(host + off_ptr + cuda_round_up(3 * U * 8, 16)); /* uint4s */
		for (uint64_t e = 0, t = 0; e < U; e++) {
			const uint64_t slot = e % Gn;
			wg[e] = inplace ? pl.blob[e] + l->gate_off : W + slot * 2 * F * D * 2;
			wu[e] = inplace ? pl.blob[e] + l->up_off : wg[e] + (uint64_t)F * D * 2;
			wd[e] = inplace ? pl.blob[e] + l->down_off : Wd + slot * D * F * 2;
			for (uint32_t r = 0; r < pl.cnt[e]; r += tr, t++) {
				tl[4 * t] = (uint32_t)(pl.base[e] + r);
				tl[4 * t + 1] = pl.cnt[e] - r < tr ? pl.cnt[e] - r : tr;
				tl[4 * t + 2] = (uint32_t)e;
				tl[4 * t + 3] = 0;
			}
		}
	} else if (mode) {
		uint64_t *pa = (uint64_t *)(host + off_ptr), *pb = pa + na * U, *pc = pb + na * U;
		uint64_t *qa = pc + na * U, *qb = qa + U, *qc = qb + U;
		for (uint64_t e = 0; e < U; e++) {
			const uint64_t slot = e % Gn, r0 = pl.base[e];
			for (uint32_t j = 0; j < na; j++) {
				pa[e * na + j] = inplace ? pl.blob[e] + (j ? l->up_off : l->gate_off)
				                         : W + slot * 2 * F * D * 2;
				pb[e * na + j] = X + r0 * D * 2;
				pc[e * na + j] = GU + r0 * 2 * F * 4 + j * F * 4ull;
			}
			qa[e] = inplace ? pl.blob[e] + l->down_off : Wd + slot * D * F * 2;
			qb[e] = Hb + r0 * F * 2;
			qc[e] = O + r0 * D * 4;
		}
		const CUdeviceptr dp = dtab + off_ptr;
		eg.pa[0] = dp, eg.pb[0] = dp + na * U * 8, eg.pc[0] = dp + 2 * na * U * 8;
		eg.pa[1] = dp + 3 * na * U * 8, eg.pb[1] = eg.pa[1] + U * 8, eg.pc[1] = eg.pb[1] + U * 8;
	}
	int vec = 7;
	const uint64_t rb_g = baton_compute_row_bytes((int)l->gate_dtype, D);
	const uint64_t rb_u = baton_compute_row_bytes((int)l->up_dtype, D);
	const uint64_t rb_d = baton_compute_row_bytes((int)l->down_dtype, F);
	for (uint64_t e = 0; e < U; e++) {
		if (!vec_ok(pl.blob[e] + l->gate_off, l->gate_dtype, rb_g))
			vec &= ~1;
		if (!vec_ok(pl.blob[e] + l->up_off, l->up_dtype, rb_u))
			vec &= ~2;
		if (!vec_ok(pl.blob[e] + l->down_off, l->down_dtype, rb_d))
			vec &= ~4;
	}
	if (dev->prof) { /* the profile's view of the grouping */
		dev->prof_tc_calls++;
		dev->prof_tc_pairs += n;
		dev->prof_tc_experts += U;
		dev->prof_tc_rows += R;
		dev->prof_tc_buckets += pl.nb;
	}
	rc = stage_send(dev, mbytes, dev->tc_buf[B_MAP].p);

	struct baton_tc_rows_args ra = {
		.src = l->xn, .dst = X, .map = dmap, .rows = (uint32_t)R, .cols = D, .src_ld = D,
		.div = l->top_k,
	};
	if (!rc)
		rc = launch(dev, dev->k_tc_rows, R * D / 8, 1, &ra, "cuLaunchKernel baton_tc_rows");
	const CUdeviceptr dwg = dtab + off_ptr, dtiles = dwg + cuda_round_up(3 * U * 8, 16);
	uint64_t t0 = 0; /* mode 4: the chunk's first tile */
	for (uint64_t g0 = 0; !rc && g0 < U; g0 += Gn) {
		const uint64_t g1e = U - g0 < Gn ? U : g0 + Gn; /* experts g0 .. g1e - 1 */
		const uint32_t gn = (uint32_t)(g1e - g0);
		if (!inplace) {
			struct baton_tc_dequant_args da = {
				.table = dtab + g0 * 8, .src_off = l->gate_off, .row_bytes = rb_g, .dst = W,
				.dst_stride = 2ull * F * D, .dst_row0 = 0, .rows = F, .cols = D,
				.dtype = l->gate_dtype, .vec = vec & 1,
			};
			if ((rc = launch(dev, dev->k_tc_dequant, (uint64_t)F * D / 8, gn, &da,
			         "cuLaunchKernel baton_tc_dequant (gate)")))
				break;
			da.src_off = l->up_off, da.row_bytes = rb_u, da.dst_row0 = F, da.dtype = l->up_dtype;
			da.vec = (vec >> 1) & 1;
			if ((rc = launch(dev, dev->k_tc_dequant, (uint64_t)F * D / 8, gn, &da,
			         "cuLaunchKernel baton_tc_dequant (up)")))
				break;
			da.src_off = l->down_off, da.row_bytes = rb_d, da.dst = Wd,
			da.dst_stride = (uint64_t)D * F;
			da.dst_row0 = 0, da.rows = D, da.cols = F, da.dtype = l->down_dtype;
			da.vec = (vec >> 2) & 1;
			if ((rc = launch(dev, dev->k_tc_dequant, (uint64_t)F * D / 8, gn, &da,
			         "cuLaunchKernel baton_tc_dequant (down)")))
				break;
		}
		if (mode == 4) { /* the chunk's tiles: gate/up with SwiGLU, then down */
			uint64_t t1 = t0;
			for (uint64_t e = g0; e < g1e; e++)
				t1 += eg_tiles(dev, pl.cnt[e]);
			if ((rc = eg_kernel(dev, dtiles + t0 * 16, t1 - t0, dwg, 0, dwg + U * 8, 0, X, Hb, D, F,
			         1)) ||
			    (rc = eg_kernel(dev, dtiles + t0 * 16, t1 - t0, dwg + 2 * U * 8, 0, 0, 0, Hb, O, F,
			         D, 0)))
				break;
			t0 = t1;
			continue;
		}
		/* gate/up for the chunk, SwiGLU over its rows (contiguous), down */
		if ((rc = eg_step(dev, &eg, 0, g0, g1e)))
			break;
		const uint64_t r0 = pl.base[g0], rows = pl.base[g1e] - r0;
		struct baton_tc_swiglu_args sa = {
			.gu = GU + r0 * 2 * F * 4, .h = Hb + r0 * F * 2, .rows = (uint32_t)rows, .f = F,
		};
		if ((rc = launch(dev, dev->k_tc_swiglu, rows * F / 8, 1, &sa,
		         "cuLaunchKernel baton_tc_swiglu")) ||
		    (rc = eg_step(dev, &eg, 1, g0, g1e)))
			break;
	}
	plan_free(&pl);
	return rc ? rc : combine(dev, l, O, dprow, dw);
}

/* Whether cuda_tc_experts_dev takes layer l: bf16 experts read in place
 * (offsets at 16 bytes; the table's blobs are at 256), egemm.cu's shapes,
 * experts for baton_tc_plan, egemm.cu not turned off. */
int cuda_tc_experts_dev_ok(const struct baton_dev *dev, const struct baton_moe_layer *l)
{
	return (dev->tc_egemm == TC_EGEMM_DEFAULT || dev->tc_egemm == 4) && dev->tc_inplace &&
	    dev->tc_state >= 0 && l->gate_dtype == BATON_DT_BF16 && l->up_dtype == BATON_DT_BF16 &&
	    l->down_dtype == BATON_DT_BF16 && l->gate_off % 16 == 0 && l->up_off % 16 == 0 &&
	    l->down_off % 16 == 0 && eg_shapes_ok(l->d_model, l->d_ff) && l->n_experts &&
	    l->n_experts <= BATON_TC_PLAN_E_MAX;
}

/* A large pass's experts routed on the device (moe_experts_dev): the
 * rows planned there (baton_tc_plan), gathered, egemm.cu's two steps over
 * a bound on the tiles, the weighted sum: nothing comes back to the host
 * and nothing waits for it. */
int cuda_tc_experts_dev(struct baton_dev *dev, const struct baton_moe_layer *l, CUdeviceptr table,
    CUdeviceptr ids, CUdeviceptr weights)
{
	const uint32_t D = l->d_model, F = l->d_ff, E = l->n_experts;
	const uint64_t n = (uint64_t)l->batch * l->top_k;
	int rc;
	if (!cuda_tc_experts_dev_ok(dev, l) || n > 0x7fffffffull / (2ull * F > D ? 2ull * F : D))
		return CUDA_TC_FALLBACK;
	const uint64_t max_t = eg_tiles(dev, n) + (E < n ? E : n); /* each used expert's last tile */
	const uint64_t off_map = cuda_round_up(n * 4, 16), off_t = cuda_round_up(off_map + n * 4, 16);
	if ((rc = need(dev, B_MAP, off_t + max_t * 16)) || (rc = need(dev, B_X, n * D * 2)) ||
	    (rc = need(dev, B_B, n * F * 2)) || (rc = need(dev, B_C, n * D * 4)))
		return rc;
	const CUdeviceptr prow = dev->tc_buf[B_MAP].p, rowmap = prow + off_map, tiles = prow + off_t;
	const CUdeviceptr X = dev->tc_buf[B_X].p, Hb = dev->tc_buf[B_B].p, O = dev->tc_buf[B_C].p;
	struct baton_tc_plan_args pa = {
		.ids = ids, .prow = prow, .rowmap = rowmap, .tiles = tiles, .n = (uint32_t)n,
		.n_experts = E, .max_tiles = (uint32_t)max_t, .tile_rows = dev->tc_eg_rows,
	};
	struct baton_tc_rows_args ra = {
		.src = l->xn, .dst = X, .map = rowmap, .rows = (uint32_t)n, .cols = D, .src_ld = D,
		.div = l->top_k,
	};
	if ((rc = cuda_launch(dev, dev->k_tc_plan, 1, 1, 1024, &pa, "cuLaunchKernel baton_tc_plan")) ||
	    (rc = launch(dev, dev->k_tc_rows, n * D / 8, 1, &ra, "cuLaunchKernel baton_tc_rows")) ||
	    (rc = eg_kernel(dev, tiles, max_t, table, l->gate_off, table, l->up_off, X, Hb, D, F, 1)) ||
	    (rc = eg_kernel(dev, tiles, max_t, table, l->down_off, 0, 0, Hb, O, F, D, 0)))
		return rc;
	return combine(dev, l, O, prow, weights);
}

int cuda_tc_attention(struct baton_dev *dev, const struct baton_attn *a, CUdeviceptr table)
{
	const uint32_t H = a->n_heads, KH = a->n_kv_heads, hd = a->head_dim, G = H / KH;
	int rc;
	if (hd % 8 || (a->q | a->out) % 16) /* attn.cu's 16-byte rows */
		return CUDA_TC_FALLBACK;
	const uint64_t pad_max = cuda_round_up((uint64_t)a->pos0 + a->n_q, 8);
	uint64_t nqg = dev->tc_scratch / ((uint64_t)H * pad_max * 6);
	if (nqg > a->n_q)
		nqg = a->n_q;
	/* groups of at most ATTN_GROUP queries: each group's scores stop at
	 * its last query's key, so a long segment writes and reads about
	 * half the causal square, not all of it */
	if (nqg >= 2 * ATTN_GROUP)
		nqg = ATTN_GROUP;
	if (nqg < 16 && nqg < a->n_q)
		return CUDA_TC_FALLBACK; /* a context too long for the scratch: the chunked kernels */
	if (pad_max * H * nqg > 0x7fffffffull)
		return CUDA_TC_FALLBACK;
	const uint64_t qn = nqg * H * hd;
	if ((rc = need(dev, B_A, (uint64_t)H * nqg * pad_max * 4)) ||
	    (rc = need(dev, B_B, (uint64_t)H * nqg * pad_max * 2)) ||
	    (rc = need(dev, B_C, 2ull * KH * pad_max * hd * 2)) || (rc = need(dev, B_X, qn * 2)) ||
	    (rc = need(dev, B_W, qn * 4)))
		return rc;
	const CUdeviceptr S = dev->tc_buf[B_A].p, P = dev->tc_buf[B_B].p, Kb = dev->tc_buf[B_C].p,
	    Qb = dev->tc_buf[B_X].p, O = dev->tc_buf[B_W].p;
	for (uint64_t q0 = 0; q0 < a->n_q; q0 += nqg) {
		const uint32_t nq = (uint32_t)(a->n_q - q0 < nqg ? a->n_q - q0 : nqg);
		const uint32_t n_ctx = (uint32_t)(a->pos0 + q0 + nq);
		const uint32_t n_pad = (uint32_t)cuda_round_up(n_ctx, 8);
		const CUdeviceptr Vb = Kb + (uint64_t)KH * n_pad * hd * 2;
		struct baton_tc_attn_kv_args ka = {
			.k = a->k, .v = a->v, .kb = Kb, .vb = Vb, .blocks = table, .n_ctx = n_ctx,
			.n_pad = n_pad, .kv_heads = KH, .head_dim = hd, .block_size = a->block_size,
		};
		if ((rc = launch(dev, dev->k_tc_attn_kv, (uint64_t)KH * n_pad * hd / 8, 1, &ka,
		         "cuLaunchKernel baton_tc_attn_kv")))
			return rc;
		struct baton_tc_attn_qo_args qa = {
			.src = a->q + q0 * H * hd * 4, .dst = Qb, .nq = nq, .heads = H, .kv_heads = KH,
			.head_dim = hd,
		};
		if ((rc = launch(dev, dev->k_tc_attn_q, (uint64_t)nq * H * hd / 8, 1, &qa,
		         "cuLaunchKernel baton_tc_attn_q")))
			return rc;
		const uint64_t cols = (uint64_t)nq * G; /* query rows per KV head */
		struct cuda_gemm g1 = {
			.ta = 1, .tb = 0, .m = (int)n_pad, .n = (int)cols, .k = (int)hd,
			.alpha = a->scale, .beta = 0.0f, .a = Kb, .b = Qb, .c = S,
			.a_type = BF16, .b_type = BF16, .lda = (int)hd, .ldb = (int)hd, .ldc = (int)n_pad,
			.batch = (int)KH,
			.sa = (long long)n_pad * hd, .sb = (long long)(cols * hd),
			.sc = (long long)(cols * n_pad), .what = "cublas attention QK",
		};
		if ((rc = cuda_blas_gemm(dev, &g1)))
			return rc;
		const uint64_t rows = (uint64_t)KH * cols;
		struct baton_tc_attn_softmax_args sa = {
			.s = S, .p = P, .rows = (uint32_t)rows, .n_pad = n_pad, .nq_g = (uint32_t)cols,
			.g = G, .pos_q0 = (uint32_t)(a->pos0 + q0),
		};
		if ((rc = cuda_launch(dev, dev->k_tc_attn_softmax, (uint32_t)(rows < 32768 ? rows : 32768), 1,
		         BATON_TC_THREADS, &sa, "cuLaunchKernel baton_tc_attn_softmax")))
			return rc;
		struct cuda_gemm g2 = {
			.ta = 0, .tb = 0, .m = (int)hd, .n = (int)cols, .k = (int)n_pad,
			.alpha = 1.0f, .beta = 0.0f, .a = Vb, .b = P, .c = O,
			.a_type = BF16, .b_type = BF16, .lda = (int)hd, .ldb = (int)n_pad, .ldc = (int)hd,
			.batch = (int)KH,
			.sa = (long long)n_pad * hd, .sb = (long long)(cols * n_pad),
			.sc = (long long)(cols * hd), .what = "cublas attention PV",
		};
		if ((rc = cuda_blas_gemm(dev, &g2)))
			return rc;
		struct baton_tc_attn_qo_args oa = {
			.src = O, .dst = a->out + q0 * H * hd * 4, .nq = nq, .heads = H, .kv_heads = KH,
			.head_dim = hd,
		};
		if ((rc = launch(dev, dev->k_tc_attn_out, (uint64_t)nq * H * hd / 8, 1, &oa,
		         "cuLaunchKernel baton_tc_attn_out")))
			return rc;
	}
	return 0;
}
