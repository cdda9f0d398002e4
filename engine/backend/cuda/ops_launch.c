/*
 * ops_launch.c: the forward pass's row ops on the `cuda` backend (the
 * slots embed, rmsnorm, matmul, matmuls, rmsnorm_matmuls, rope,
 * qk_norm_rope, kv_store, swiglu and add of engine/backend/backend.h):
 * argument checks, the kernels of ops.cu (embedded as a fatbin) and their
 * launches on the context's stream; the checks and the staging ring that
 * the launchers of attention (attn_split_launch.c) and routing
 * (route_launch.c) share.
 *
 * Checks are the host backend's (engine/backend/host/ops.c), so both refuse the
 * same calls with the same codes, before anything is queued. Small host
 * arrays (token ids, positions, frequencies) are copied into a pinned
 * ring and queued to the device; a call waits only when it reuses a half
 * of the ring whose copies have not run yet.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/host/host.h"
#include "engine/backend/cuda/ops.h"

extern const unsigned char baton_engine_backend_cuda_ops_fatbin[];
extern const size_t baton_engine_backend_cuda_ops_fatbin_len;

/* rmsnorm's rows from this wide (to BATON_OPS_NORM_ROW_MAX) take a block
 * each: a warp alone waits on 8 round trips to memory for a 2,048-wide
 * row's sum and 8 more for its output (a decode step's norms: 23 us a
 * launch in the H200's profile); narrower rows (the per-head q/k norms)
 * keep a warp each. */
#define NORM_ROW_MIN 512

/* ---- loading -------------------------------------------------------------- */

/* Where a kernel lives, for loading and the first launch. */
struct kfn {
	CUfunction *f;
	char name[40];
};

int cuda_ops_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->ModuleLoadData(&dev->ops_mod, baton_engine_backend_cuda_ops_fatbin),
	    "cuModuleLoadData of the forward-pass kernels (sm_90 SASS, compute_90 PTX)");
	static const char *const kinds[BATON_OPS_KINDS] = BATON_OPS_KIND_NAMES;
	/* the named kernels first (OPS_NAMED of them), then the matmuls */
	enum { OPS_NAMED = 8 };
	struct kfn k[OPS_NAMED + 2 * BATON_OPS_KINDS] = {
		{ &dev->k_embed, "baton_ops_embed" },
		{ &dev->k_rmsnorm, "baton_ops_rmsnorm" },
		{ &dev->k_rmsnorm_row, "baton_ops_rmsnorm_row" },
		{ &dev->k_qk_norm_rope, "baton_ops_qk_norm_rope" },
		{ &dev->k_rope, "baton_ops_rope" },
		{ &dev->k_kv_store, "baton_ops_kv_store" },
		{ &dev->k_swiglu, "baton_ops_swiglu" },
		{ &dev->k_add, "baton_ops_add" },
	};
	size_t n = OPS_NAMED;
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < BATON_OPS_KINDS; i++, n++) {
			k[n].f = &dev->k_matmul[r][i];
			snprintf(k[n].name, sizeof k[n].name, "baton_ops_matmul_%d_%s", r ? BATON_OPS_NT : 1,
			    kinds[i]);
		}
	for (size_t i = 0; i < n; i++) {
		CUresult r = d->ModuleGetFunction(k[i].f, dev->ops_mod, k[i].name);
		if (r != CUDA_SUCCESS) {
			char what[96];
			snprintf(what, sizeof what, "cuModuleGetFunction %s", k[i].name);
			return cuda_fail(dev, r, what);
		}
	}
	for (int h = 0; h < 2; h++)
		CU(dev, d->EventCreate(&dev->ops_staged[h], CU_EVENT_DISABLE_TIMING),
		    "cuEventCreate (ops)");
	/* One launch of each on empty sizes (each returns at once): modules
	 * load lazily, and the first launch must not be where the device is
	 * found full (the expert cache fills it). */
	union {
		struct baton_ops_embed_args e;
		struct baton_ops_rmsnorm_args n;
		struct baton_ops_rmsnorm_row_args nr;
		struct baton_ops_matmul_args m;
		struct baton_ops_rope_args r;
		struct baton_ops_qk_norm_rope_args qr;
		struct baton_ops_kv_store_args kv;
		struct baton_ops_swiglu_args s;
		struct baton_ops_add_args d;
	} zero;
	memset(&zero, 0, sizeof zero);
	for (size_t i = 0; i < n; i++) {
		void *params[] = { &zero };
		CUresult r = d->LaunchKernel(*k[i].f, 1, 1, 1, 32, 1, 1, 0, dev->stream, params, NULL);
		if (r != CUDA_SUCCESS) {
			char what[96];
			snprintf(what, sizeof what, "first launch of %s", k[i].name);
			return cuda_fail(dev, r, what);
		}
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

void cuda_ops_free(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	cuda_mmvq_free(dev);
	for (int h = 0; h < 2; h++) {
		if (dev->ops_stage_busy[h] && dev->ops_staged[h])
			d->EventSynchronize(dev->ops_staged[h]);
		if (dev->ops_staged[h])
			d->EventDestroy(dev->ops_staged[h]);
		dev->ops_staged[h] = NULL;
		dev->ops_stage_busy[h] = 0;
	}
	cuda_dbuf_free(dev, &dev->ops_arg);
	if (dev->ops_stage)
		d->MemFreeHost(dev->ops_stage);
	dev->ops_stage = NULL;
	dev->ops_stage_cap = 0;
	if (dev->ops_mod)
		d->ModuleUnload(dev->ops_mod);
	dev->ops_mod = NULL;
}

/* ---- checks (host/ops.c's) ------------------------------------------------- */

/* An f32 buffer of n floats at p: non-null, aligned, not wrapping. */
int cuda_f32_buf(baton_dptr p, uint64_t n)
{
	return p && !(p & 3) && n && n <= UINT64_MAX / 4 && p <= UINT64_MAX - n * 4;
}

int cuda_overlap(baton_dptr a, uint64_t an, baton_dptr b, uint64_t bn)
{
	return a < b + bn * 4 && b < a + an * 4;
}

int cuda_refuse(struct baton_dev *dev, int rc, const char *op, const char *why)
{
	cuda_set_err(dev, "%s: %s", op, why);
	return rc;
}

/* A weight of rows of `cols` in dtype: computable here, whole blocks;
 * *rb gets a row's bytes. */
int cuda_weight_ok(struct baton_dev *dev, const char *op, uint32_t dtype, uint32_t cols,
    uint64_t *rb)
{
	if (!cuda_can_compute((int)dtype)) {
		const char *n = baton_dtype_name((int)dtype);
		cuda_set_err(dev, "%s: the cuda backend cannot compute weights of type %s", op,
		    n ? n : "unknown");
		return BATON_EUNSUPPORTED;
	}
	*rb = baton_compute_row_bytes((int)dtype, cols);
	if (!*rb) {
		cuda_set_err(dev, "%s: rows of %u %s values are not whole blocks", op, cols,
		    baton_dtype_name((int)dtype));
		return BATON_EINVAL;
	}
	return 0;
}

/* ---- launching ------------------------------------------------------------- */

/* Queues host bytes (two arrays, the second 16-byte aligned after the
 * first) to the device: *da, *db get their device addresses. They go
 * through the staging ring (cuda_int.h): the next free bytes of
 * the current half, or the other half once its copies have run. */
int cuda_stage_args(struct baton_dev *dev, const void *a, uint64_t an, const void *b,
    uint64_t bn, CUdeviceptr *da, CUdeviceptr *db)
{
	const struct cuda_driver *d = dev->d;
	if (dev->gmode) /* a pass recorded or checked as a graph: its own staging */
		return cuda_graph_stage(dev, a, an, b, bn, da, db);
	const uint64_t boff = cuda_round_up(an, 16), total = cuda_round_up(boff + bn, 16);
	uint64_t half = dev->ops_stage_cap / 2;
	if (total > half) { /* a new ring, twice this call at least */
		int rc = cuda_stream_sync(dev);
		if (rc)
			return rc;
		dev->ops_stage_busy[0] = dev->ops_stage_busy[1] = 0;
		if (dev->ops_stage)
			d->MemFreeHost(dev->ops_stage);
		dev->ops_stage = NULL;
		dev->ops_stage_cap = 0;
		cuda_dbuf_free(dev, &dev->ops_arg);
		/* at least 1 MiB: a decode step's arrays (under 100 KiB at 48
		 * layers) fill at most one half, so a step captured as a graph
		 * (graph.c) never waits for copies it recorded itself */
		const uint64_t cap = cuda_round_up(2 * total, 1u << 20);
		void *p = NULL;
		CU(dev, d->MemHostAlloc(&p, cap, 0), "cuMemHostAlloc (ops staging)");
		dev->ops_stage = p;
		dev->ops_stage_cap = cap;
		if ((rc = cuda_dbuf_need(dev, &dev->ops_arg, cap)))
			return rc;
		half = cap / 2;
		dev->ops_half = 0;
		dev->ops_off = 0;
	}
	if (dev->ops_off + total > half) {
		dev->ops_half ^= 1;
		dev->ops_off = 0;
	}
	const int h = dev->ops_half;
	if (dev->ops_off == 0 && dev->ops_rec_pending[h])
		return cuda_refuse(dev, BATON_EBUSY, "staging",
		    "a graph being recorded would overwrite its own arrays");
	if (dev->ops_off == 0 && dev->ops_stage_busy[h]) {
		CU(dev, d->EventSynchronize(dev->ops_staged[h]), "cuEventSynchronize (ops staging)");
		dev->ops_stage_busy[h] = 0;
	}
	const uint64_t at = (uint64_t)h * half + dev->ops_off;
	char *host = (char *)dev->ops_stage + at;
	memcpy(host, a, an);
	if (bn)
		memcpy(host + boff, b, bn);
	CU(dev, d->MemcpyHtoDAsync(dev->ops_arg.p + at, host, boff + bn, dev->stream),
	    "cuMemcpyHtoDAsync (op arguments)");
	/* While a graph is recorded (graph.c) an event recorded on the stream
	 * would become part of the capture, not a mark the host can wait
	 * for: graph_end records it after the graph instead. */
	if (dev->capturing)
		dev->ops_rec_pending[h] = 1;
	else
		CU(dev, d->EventRecord(dev->ops_staged[h], dev->stream), "cuEventRecord (ops staging)");
	dev->ops_stage_busy[h] = 1;
	dev->ops_off += total;
	*da = dev->ops_arg.p + at;
	if (db)
		*db = dev->ops_arg.p + at + boff;
	return 0;
}

static uint32_t blocks_for(uint64_t n)
{
	uint64_t b = (n + 255) / 256;
	return (uint32_t)(b < 4096 ? (b ? b : 1) : 4096);
}

/* ---- the slots -------------------------------------------------------------- */

int cuda_op_embed(struct baton_dev *dev, baton_dptr table, uint32_t dtype, uint32_t vocab,
    uint32_t cols, const uint32_t *tokens, uint32_t n, baton_dptr out)
{
	uint64_t rb;
	int rc;
	if (!table || !tokens || !vocab || !n || !cuda_f32_buf(out, (uint64_t)n * cols))
		return cuda_refuse(dev, BATON_EINVAL, "embed", "empty table or tokens, or a bad output");
	if ((rc = cuda_weight_ok(dev, "embed", dtype, cols, &rb)))
		return rc;
	if (n > 0x7fffffffu)
		return cuda_refuse(dev, BATON_ERANGE, "embed", "2^31 tokens or more in one call");
	for (uint32_t t = 0; t < n; t++)
		if (tokens[t] >= vocab) {
			cuda_set_err(dev, "embed: token %u is outside the vocabulary of %u", tokens[t],
			    vocab);
			return BATON_ERANGE;
		}
	CUdeviceptr dt;
	if ((rc = cuda_cur(dev)) || (rc = cuda_stage_args(dev, tokens, (uint64_t)n * 4, NULL, 0, &dt, NULL)))
		return rc;
	struct baton_ops_embed_args a = {
		.table = table, .tokens = dt, .out = out, .row_bytes = rb,
		.dtype = dtype, .cols = cols, .n = n,
	};
	return cuda_launch(dev, dev->k_embed, n, 1, 256, &a, "cuLaunchKernel baton_ops_embed");
}

int cuda_op_rmsnorm(struct baton_dev *dev, baton_dptr x, baton_dptr out, uint32_t rows,
    uint32_t cols, baton_dptr w, uint32_t w_dtype, float eps)
{
	const uint64_t n = (uint64_t)rows * cols;
	uint64_t rb;
	int rc;
	if (!rows || !cuda_f32_buf(x, n) || !cuda_f32_buf(out, n) || !(eps >= 0))
		return cuda_refuse(dev, BATON_EINVAL, "rmsnorm", "empty or misaligned rows, or eps < 0");
	if (out != x && cuda_overlap(x, n, out, n))
		return cuda_refuse(dev, BATON_EINVAL, "rmsnorm", "out overlaps x without being x");
	if (w && (rc = cuda_weight_ok(dev, "rmsnorm", w_dtype, cols, &rb)))
		return rc;
	if ((rc = cuda_cur(dev)))
		return rc;
	if (cols >= NORM_ROW_MIN && cols <= BATON_OPS_NORM_ROW_MAX) {
		/* a block per row: the same bits, one round trip to memory */
		struct baton_ops_rmsnorm_row_args a = {
			.x = x, .out = out, .w = w, .w_dtype = w_dtype, .rows = rows, .cols = cols,
			.eps = eps,
		};
		if (rows > 0x7fffffffu)
			return cuda_refuse(dev, BATON_ERANGE, "rmsnorm", "too many rows");
		/* one row: also as the int8 blocks of the quantized matmuls after
		 * it; 2 to 63 rows: those of mmvq_rows.cu's */
		const int vr = rows > 1;
		if ((rc = vr ? cuda_vr_norm_out(dev, rows, cols, &a.q, &a.d)
		             : cuda_mmvq_norm_out(dev, rows, cols, &a.q, &a.d)) ||
		    (rc = cuda_launch(dev, dev->k_rmsnorm_row, rows, 1, OPS_THREADS, &a,
		         "cuLaunchKernel baton_ops_rmsnorm_row")))
			return rc;
		if (a.q && vr)
			cuda_vr_norm_done(dev, out, rows, cols);
		else if (a.q)
			cuda_mmvq_norm_done(dev, out, cols);
		return 0;
	}
	struct baton_ops_rmsnorm_args a = {
		.x = x, .out = out, .w = w, .w_dtype = w_dtype, .rows = rows, .cols = cols, .eps = eps,
	};
	const uint32_t blocks = (rows + BATON_OPS_WARPS - 1) / BATON_OPS_WARPS;
	if (blocks > 0x7fffffffu)
		return cuda_refuse(dev, BATON_ERANGE, "rmsnorm", "too many rows");
	return cuda_launch(dev, dev->k_rmsnorm, blocks, 1, OPS_THREADS, &a,
	    "cuLaunchKernel baton_ops_rmsnorm");
}

/* matmul's checks (the host's): 0 or the code; *rb a weight row's bytes. */
static int matmul_check(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows, baton_dptr y,
    uint64_t *rb)
{
	uint64_t brb;
	int rc;
	if (!w || !n_out || !rows || !cuda_f32_buf(x, (uint64_t)rows * k) ||
	    !cuda_f32_buf(y, (uint64_t)rows * n_out))
		return cuda_refuse(dev, BATON_EINVAL, "matmul", "empty or misaligned operands");
	if (cuda_overlap(x, (uint64_t)rows * k, y, (uint64_t)rows * n_out))
		return cuda_refuse(dev, BATON_EINVAL, "matmul", "y overlaps x");
	if ((rc = cuda_weight_ok(dev, "matmul", w_dtype, k, rb)))
		return rc;
	if (b && (rc = cuda_weight_ok(dev, "matmul bias", b_dtype, n_out, &brb)))
		return rc;
	return 0;
}

int cuda_op_matmuls(struct baton_dev *dev, const struct baton_matmuls *mm)
{
	uint64_t rb;
	int rc;
	if (matmuls_overlap(mm))
		return cuda_refuse(dev, BATON_EINVAL, "matmuls", "n not 1 to 3, or overlapping outputs");
	for (uint32_t i = 0; i < mm->n; i++) {
		const struct baton_matmul_out *o = &mm->m[i];
		if ((rc = matmul_check(dev, o->w, o->w_dtype, o->n_out, mm->k, o->b, o->b_dtype, mm->x,
		         mm->rows, o->y, &rb)))
			return rc;
	}
	if ((rc = cuda_cur(dev)))
		return rc;
	/* one launch where every matrix takes the quantized batch-1 GEMV
	 * (not on the tensor cores' passes: those start at 64 rows) */
	if ((rc = cuda_mmvq_matmuls(dev, mm)) != CUDA_TC_FALLBACK)
		return rc;
	/* or every matrix on the 16-bit one (bf16 / f16 rows): one launch too */
	if (mm->rows == 1) {
		struct cuda_g16_out g[BATON_MATMULS_MAX];
		for (uint32_t i = 0; i < mm->n; i++)
			g[i] = (struct cuda_g16_out){ .w = mm->m[i].w, .b = mm->m[i].b, .y = mm->m[i].y,
				.w_dtype = mm->m[i].w_dtype, .b_dtype = mm->m[i].b_dtype,
				.n_out = mm->m[i].n_out };
		if ((rc = cuda_g16_matmuls(dev, mm->x, mm->k, mm->rows, g, mm->n, 0)) !=
		    CUDA_TC_FALLBACK)
			return rc;
	}
	/* 2 to 63 rows: the multi-row quantized GEMV, one launch for all */
	if ((rc = cuda_vr_matmuls(dev, mm->x, mm->k, mm->rows, mm->m, mm->n, 0)) != CUDA_TC_FALLBACK)
		return rc;
	for (uint32_t i = 0; i < mm->n; i++) {
		const struct baton_matmul_out *o = &mm->m[i];
		if ((rc = cuda_op_matmul(dev, o->w, o->w_dtype, o->n_out, mm->k, o->b, o->b_dtype, mm->x,
		         mm->rows, o->y, 0)))
			return rc;
	}
	return 0;
}

int cuda_op_rmsnorm_matmuls(struct baton_dev *dev, baton_dptr x, baton_dptr w, uint32_t w_dtype,
    float eps, const struct baton_matmuls *mm)
{
	uint64_t rb;
	int rc;
	if (!mm)
		return cuda_refuse(dev, BATON_EINVAL, "rmsnorm_matmuls", "no matmuls");
	/* rmsnorm's checks, then matmuls' (on the normed rows' buffer) */
	if (!mm->rows || !mm->k || !cuda_f32_buf(x, (uint64_t)mm->rows * mm->k) ||
	    !cuda_f32_buf(mm->x, (uint64_t)mm->rows * mm->k) || !(eps >= 0))
		return cuda_refuse(dev, BATON_EINVAL, "rmsnorm", "empty or misaligned rows, or eps < 0");
	if (x != mm->x && cuda_overlap(x, (uint64_t)mm->rows * mm->k, mm->x, (uint64_t)mm->rows * mm->k))
		return cuda_refuse(dev, BATON_EINVAL, "rmsnorm", "out overlaps x without being x");
	if (w && (rc = cuda_weight_ok(dev, "rmsnorm", w_dtype, mm->k, &rb)))
		return rc;
	if (matmuls_overlap(mm))
		return cuda_refuse(dev, BATON_EINVAL, "matmuls", "n not 1 to 3, or overlapping outputs");
	for (uint32_t i = 0; i < mm->n; i++) {
		const struct baton_matmul_out *o = &mm->m[i];
		if ((rc = matmul_check(dev, o->w, o->w_dtype, o->n_out, mm->k, o->b, o->b_dtype, mm->x,
		         mm->rows, o->y, &rb)))
			return rc;
		if (cuda_overlap(x, (uint64_t)mm->rows * mm->k, o->y, (uint64_t)mm->rows * o->n_out))
			return cuda_refuse(dev, BATON_EINVAL, "matmuls", "an output overlaps x");
	}
	if ((rc = cuda_cur(dev)))
		return rc;
	if ((rc = cuda_op_rmsnorm(dev, x, mm->x, mm->rows, mm->k, w, w_dtype, eps)))
		return rc;
	return cuda_op_matmuls(dev, mm);
}

int cuda_op_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate)
{
	uint64_t rb;
	int rc;
	if ((rc = matmul_check(dev, w, w_dtype, n_out, k, b, b_dtype, x, rows, y, &rb)))
		return rc;
	const uint32_t gx = (n_out + BATON_OPS_WARPS - 1) / BATON_OPS_WARPS;
	const int one = rows == 1;
	const uint32_t gy = one ? 1 : (rows + BATON_OPS_NT - 1) / BATON_OPS_NT;
	if (gy > 65535)
		return cuda_refuse(dev, BATON_ERANGE, "matmul", "too many rows for one launch");
	if ((rc = cuda_cur(dev)))
		return rc;
	if (cuda_tc_on(dev, rows) &&
	    (rc = cuda_tc_matmul(dev, w, w_dtype, rb, n_out, k, b, b_dtype, x, rows, y, accumulate)) !=
	        CUDA_TC_FALLBACK)
		return rc;
	if ((rc = cuda_mmvq_matmul(dev, w, w_dtype, rb, n_out, k, b, b_dtype, x, rows, y,
	         accumulate)) != CUDA_TC_FALLBACK)
		return rc;
	/* 2 to 63 rows on q4_K / q6_K (int8 x) or small f32 matrices (exact) */
	if ((rc = cuda_vr_matmul(dev, w, w_dtype, n_out, k, b, b_dtype, x, rows, y, accumulate)) !=
	    CUDA_TC_FALLBACK)
		return rc;
	/* one row on bf16 / f16 weights: gemv16.cu at the memory's rate */
	if ((rc = cuda_g16_matmul(dev, w, w_dtype, rb, n_out, k, b, b_dtype, x, rows, y,
	         accumulate)) != CUDA_TC_FALLBACK)
		return rc;
	struct baton_ops_matmul_args a = {
		.w = w, .b = b, .x = x, .y = y, .row_bytes = rb,
		.w_dtype = w_dtype, .b_dtype = b_dtype, .n_out = n_out, .k = k, .rows = rows,
		.accumulate = accumulate ? 1u : 0u,
	};
	/* the kernel of this dtype; typed loads need rows at their alignment */
	int kind = 0;
	switch (w_dtype) {
	case BATON_DT_F32: kind = w % 4 ? 0 : 1; break;
	case BATON_DT_F16: kind = w % 2 ? 0 : 2; break;
	case BATON_DT_BF16: kind = w % 2 ? 0 : 3; break;
	case BATON_DT_Q8_0: kind = 4; break;
	case BATON_DT_Q4_K: kind = 5; break;
	case BATON_DT_Q5_K: kind = 6; break;
	case BATON_DT_Q6_K: kind = 7; break;
	/* arena/quant.c's types: elem() with the type known at compile time */
	case BATON_DT_Q4_0: kind = 8; break;
	case BATON_DT_Q4_1: kind = 9; break;
	case BATON_DT_Q5_0: kind = 10; break;
	case BATON_DT_Q5_1: kind = 11; break;
	case BATON_DT_IQ4_NL: kind = 12; break;
	case BATON_DT_MXFP4: kind = 13; break;
	case BATON_DT_Q2_K: kind = 14; break;
	case BATON_DT_Q3_K: kind = 15; break;
	case BATON_DT_IQ4_XS: kind = 16; break;
	}
	if (kind >= 1 && kind <= 3)
		a.vec = w % 16 == 0 && rb % 16 == 0 && k % (kind == 1 ? 128 : 256) == 0;
	const uint64_t before = dev->n_launch;
	if ((rc = cuda_launch(dev, dev->k_matmul[!one][kind], gx, gy, OPS_THREADS, &a,
	         "cuLaunchKernel baton_ops_matmul")))
		return rc;
	cuda_mmvq_keep(dev, before, y, (uint64_t)rows * n_out * 4, 0, 0); /* writes y alone */
	return 0;
}

int cuda_op_rope(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t n_heads,
    uint32_t head_dim, const uint32_t *pos, const float *inv_freq, float mscale)
{
	int rc;
	if (!rows || !n_heads || !head_dim || (head_dim & 1) || !pos || !inv_freq ||
	    !cuda_f32_buf(x, (uint64_t)rows * n_heads * head_dim))
		return cuda_refuse(dev, BATON_EINVAL, "rope",
		    "empty or misaligned rows, an odd head_dim, or no positions or frequencies");
	if (n_heads > 65535 || rows > 0x7fffffffu)
		return cuda_refuse(dev, BATON_ERANGE, "rope", "more than 65535 heads or 2^31 rows");
	const uint32_t half = head_dim / 2;
	CUdeviceptr dp, df;
	if ((rc = cuda_cur(dev)) ||
	    (rc = cuda_stage_args(dev, pos, (uint64_t)rows * 4, inv_freq, (uint64_t)half * 4, &dp, &df)))
		return rc;
	struct baton_ops_rope_args a = {
		.x = x, .pos = dp, .inv_freq = df, .n_heads = n_heads, .head_dim = head_dim,
		.mscale = mscale,
	};
	return cuda_launch(dev, dev->k_rope, rows, n_heads, half < 256 ? half : 256, &a,
	    "cuLaunchKernel baton_ops_rope");
}

/* qk_norm_rope's checks (refused: its code) */
int cuda_qk_nr_check(struct baton_dev *dev, const struct baton_qk_norm_rope *a)
{
	int rc;
	uint64_t rb;
	if (!a || !a->rows || !a->heads || !a->kv_heads || !a->head_dim || (a->head_dim & 1) ||
	    !a->pos || !a->inv_freq || !(a->eps >= 0))
		return cuda_refuse(dev, BATON_EINVAL, "qk_norm_rope",
		    "zero sizes, an odd head_dim, no positions or frequencies, or eps < 0");
	const uint64_t qn = (uint64_t)a->rows * a->heads * a->head_dim;
	const uint64_t kn = (uint64_t)a->rows * a->kv_heads * a->head_dim;
	if (!cuda_f32_buf(a->q, qn) || !cuda_f32_buf(a->k, kn) || cuda_overlap(a->q, qn, a->k, kn))
		return cuda_refuse(dev, BATON_EINVAL, "qk_norm_rope", "a missing, misaligned or overlapping q or k");
	if ((a->wq && (rc = cuda_weight_ok(dev, "qk_norm_rope", a->wq_dtype, a->head_dim, &rb))) ||
	    (a->wk && (rc = cuda_weight_ok(dev, "qk_norm_rope", a->wk_dtype, a->head_dim, &rb))))
		return rc;
	if ((uint64_t)a->heads + a->kv_heads > 65535 || a->rows > 0x7fffffffu)
		return cuda_refuse(dev, BATON_ERANGE, "qk_norm_rope", "more than 65535 heads or 2^31 rows");
	const struct baton_kv_store ks = { .k = a->k, .v = a->v, .k_cache = a->k_cache,
		.v_cache = a->v_cache, .slots = a->slots, .n = a->rows,
		.cols = a->kv_heads * a->head_dim, .cache_rows = a->cache_rows };
	if (a->k_cache) {
		if ((uint64_t)a->kv_heads * a->head_dim > UINT32_MAX)
			return cuda_refuse(dev, BATON_EINVAL, "qk_norm_rope", "k rows too wide to store");
		if ((rc = kv_store_check(&ks)))
			return cuda_refuse(dev, rc, "qk_norm_rope", rc == BATON_ERANGE ? "a slot past the cache" :
			    "kv_store's zero sizes, or missing, misaligned or overlapping buffers");
		if (cuda_overlap(a->q, qn, a->k_cache, a->cache_rows * ks.cols) ||
		    cuda_overlap(a->q, qn, a->v_cache, a->cache_rows * ks.cols))
			return cuda_refuse(dev, BATON_EINVAL, "qk_norm_rope", "q overlaps the cache");
	}
	return 0;
}

int cuda_op_qk_norm_rope(struct baton_dev *dev, const struct baton_qk_norm_rope *a)
{
	int rc;
	if ((rc = cuda_qk_nr_check(dev, a)))
		return rc;
	CUdeviceptr dp, df, ds = 0;
	if ((rc = cuda_cur(dev)) || (rc = cuda_stage_args(dev, a->pos, (uint64_t)a->rows * 4, a->inv_freq,
	                                  (uint64_t)a->head_dim / 2 * 4, &dp, &df)))
		return rc;
	if (a->k_cache &&
	    (rc = cuda_stage_args(dev, a->slots, (uint64_t)a->rows * 4, NULL, 0, &ds, NULL)))
		return rc;
	struct baton_ops_qk_norm_rope_args k = {
		.q = a->q, .k = a->k, .wq = a->wq, .wk = a->wk, .pos = dp, .inv_freq = df,
		.wq_dtype = a->wq_dtype, .wk_dtype = a->wk_dtype, .heads = a->heads,
		.kv_heads = a->kv_heads, .head_dim = a->head_dim, .eps = a->eps, .mscale = a->mscale,
		.v = a->v, .k_cache = a->k_cache, .v_cache = a->v_cache, .slots = ds,
	};
	return cuda_launch(dev, dev->k_qk_norm_rope, a->rows, a->heads + a->kv_heads, 32, &k,
	    "cuLaunchKernel baton_ops_qk_norm_rope");
}

int cuda_op_kv_store(struct baton_dev *dev, const struct baton_kv_store *s)
{
	int rc = kv_store_check(s);
	if (rc)
		return cuda_refuse(dev, rc, "kv_store", rc == BATON_ERANGE ? "a slot past the cache" :
		    "zero sizes, or missing, misaligned or overlapping buffers");
	if (s->n > 0x7fffffffu)
		return cuda_refuse(dev, BATON_ERANGE, "kv_store", "2^31 rows or more in one call");
	CUdeviceptr slots;
	if ((rc = cuda_cur(dev)) ||
	    (rc = cuda_stage_args(dev, s->slots, (uint64_t)s->n * 4, NULL, 0, &slots, NULL)))
		return rc;
	struct baton_ops_kv_store_args a = {
		.k = s->k, .v = s->v, .k_cache = s->k_cache, .v_cache = s->v_cache, .slots = slots,
		.n = s->n, .cols = s->cols,
	};
	return cuda_launch(dev, dev->k_kv_store, s->n, 1, 128, &a, "cuLaunchKernel baton_ops_kv_store");
}

int cuda_op_swiglu(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
    uint64_t n)
{
	int rc;
	if (!cuda_f32_buf(gate, n) || !cuda_f32_buf(up, n) || !cuda_f32_buf(out, n))
		return cuda_refuse(dev, BATON_EINVAL, "swiglu", "empty or misaligned buffers");
	if ((rc = cuda_cur(dev)))
		return rc;
	struct baton_ops_swiglu_args a = { .gate = gate, .up = up, .out = out, .n = n };
	return cuda_launch(dev, dev->k_swiglu, blocks_for(n), 1, 256, &a,
	    "cuLaunchKernel baton_ops_swiglu");
}

int cuda_op_add(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
    uint32_t rows, uint32_t cols)
{
	const uint64_t n = (uint64_t)rows * cols;
	int rc;
	if (!rows || !cuda_f32_buf(x, n) || !cuda_f32_buf(y, n) || cuda_overlap(x, n, y, n) ||
	    (gate && !cuda_f32_buf(gate, rows)))
		return cuda_refuse(dev, BATON_EINVAL, "add",
		    "empty, misaligned or overlapping buffers, or a bad gate");
	if ((rc = cuda_cur(dev)))
		return rc;
	struct baton_ops_add_args a = { .x = x, .y = y, .gate = gate, .rows = rows, .cols = cols };
	return cuda_launch(dev, dev->k_add, blocks_for(n), 1, 256, &a, "cuLaunchKernel baton_ops_add");
}
