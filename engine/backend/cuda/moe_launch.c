/*
 * moe_launch.c: the MoE compute of the `cuda` backend: the kernels of
 * moe.cu (embedded as a fatbin), their scratch buffers, and the
 * launches behind moe_route and moe_experts (see backend.c's top for
 * the design and the figures). The device itself is backend.c's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/host/host.h"

extern const unsigned char baton_engine_backend_cuda_moe_fatbin[];
extern const size_t baton_engine_backend_cuda_moe_fatbin_len;

/* ---- the kernels ---------------------------------------------------------- */

static const char *const k_variant_names[N_VARIANTS] = { "1", "2", "4", "8" };

static int load_kernels(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->ModuleLoadData(&dev->mod, baton_engine_backend_cuda_moe_fatbin),
	    "cuModuleLoadData of the MoE kernels (sm_90 SASS, compute_90 PTX)");
	CU(dev, d->ModuleGetFunction(&dev->k_norm, dev->mod, "baton_moe_rmsnorm"),
	    "cuModuleGetFunction baton_moe_rmsnorm");
	CU(dev, d->ModuleGetFunction(&dev->k_reduce, dev->mod, "baton_moe_reduce"),
	    "cuModuleGetFunction baton_moe_reduce");
	CU(dev, d->ModuleGetFunction(&dev->k_chunks, dev->mod, "baton_moe_chunks"),
	    "cuModuleGetFunction baton_moe_chunks");
	for (int i = 0; i < N_VARIANTS; i++) {
		char n[64];
		snprintf(n, sizeof n, "baton_moe_gemv_%s", k_variant_names[i]);
		CU(dev, d->ModuleGetFunction(&dev->k_gemv[i], dev->mod, n), "cuModuleGetFunction gemv");
		snprintf(n, sizeof n, "baton_moe_gate_up_%s", k_variant_names[i]);
		CU(dev, d->ModuleGetFunction(&dev->k_gate_up[i], dev->mod, n), "cuModuleGetFunction gate_up");
		snprintf(n, sizeof n, "baton_moe_down_%s", k_variant_names[i]);
		CU(dev, d->ModuleGetFunction(&dev->k_down[i], dev->mod, n), "cuModuleGetFunction down");
	}
	return 0;
}

/* Runs every kernel once on empty sizes (they return at once): the driver
 * loads modules lazily, and a kernel's first launch must not be the moment
 * it finds the device full (the cache fills it up to the headroom). It also
 * proves at open that the fatbin runs on this device. */
static int warm_kernels(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	struct baton_cuda_norm_args na = { 0 };
	struct baton_cuda_gemv_args ga = { 0 };
	struct baton_cuda_ffn_args fa = { 0 };
	struct baton_cuda_reduce_args ra = { 0 };
	struct baton_cuda_chunks_args ca = { 0 };
	void *pn[] = { &na }, *pg[] = { &ga }, *pf[] = { &fa }, *pr[] = { &ra }, *pc[] = { &ca };
	CU(dev, d->LaunchKernel(dev->k_norm, 1, 1, 1, 256, 1, 1, 0, dev->stream, pn, NULL),
	    "first launch of baton_moe_rmsnorm");
	CU(dev, d->LaunchKernel(dev->k_reduce, 1, 1, 1, 256, 1, 1, 0, dev->stream, pr, NULL),
	    "first launch of baton_moe_reduce");
	CU(dev, d->LaunchKernel(dev->k_chunks, 1, 1, 1, 256, 1, 1, 0, dev->stream, pc, NULL),
	    "first launch of baton_moe_chunks");
	for (int i = 0; i < N_VARIANTS; i++) {
		CU(dev, d->LaunchKernel(dev->k_gemv[i], 1, 1, 1, 256, 1, 1, 0, dev->stream, pg, NULL),
		    "first launch of baton_moe_gemv");
		CU(dev, d->LaunchKernel(dev->k_gate_up[i], 1, 1, 1, 256, 1, 1, 0, dev->stream, pf, NULL),
		    "first launch of baton_moe_gate_up");
		CU(dev, d->LaunchKernel(dev->k_down[i], 1, 1, 1, 256, 1, 1, 0, dev->stream, pf, NULL),
		    "first launch of baton_moe_down");
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

int cuda_moe_load(struct baton_dev *dev)
{
	int rc = load_kernels(dev);
	return rc ? rc : warm_kernels(dev);
}

void cuda_moe_free(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	if (dev->lg_host)
		d->MemFreeHost(dev->lg_host);
	cuda_dbuf_free(dev, &dev->desc);
	cuda_dbuf_free(dev, &dev->h);
	cuda_dbuf_free(dev, &dev->part);
	if (dev->stage)
		d->MemFreeHost(dev->stage);
	if (dev->mod)
		d->ModuleUnload(dev->mod);
	free(dev->sort);
	dev->sort = NULL;
}

/* ---- MoE ---------------------------------------------------------------- */

static uint64_t row_bytes(uint32_t dt, uint32_t cols)
{
	/* 0 unless cols is whole blocks (32 or 256) of a type cuda computes */
	return cuda_can_compute((int)dt) ? baton_compute_row_bytes((int)dt, cols) : 0;
}

/* 1 when rows of (dt, cols) starting at base suit the vector loads; the
 * block types of arena/quant.c always take the scalar path (byte loads). */
static int vec_ok(uint64_t base, uint32_t dt, uint32_t cols)
{
	if (dt == BATON_DT_Q8_0 || dt == BATON_DT_Q6_K)
		return base % 2 == 0;
	if (dt == BATON_DT_Q4_K || dt == BATON_DT_Q5_K)
		return base % 8 == 0;
	if (dt != BATON_DT_F32 && dt != BATON_DT_F16 && dt != BATON_DT_BF16)
		return 0;
	return base % 16 == 0 && row_bytes(dt, cols) % 16 == 0;
}

/* The pinned staging buffer, free to write (its last copy has run). */
static int stage_need(struct baton_dev *dev, uint64_t bytes)
{
	if (dev->stage_busy) {
		CU(dev, dev->d->EventSynchronize(dev->staged), "cuEventSynchronize");
		dev->stage_busy = 0;
	}
	if (dev->stage_cap >= bytes)
		return 0;
	if (dev->stage)
		dev->d->MemFreeHost(dev->stage);
	dev->stage = NULL;
	dev->stage_cap = 0;
	uint64_t cap = cuda_round_up(bytes, 1u << 16);
	void *p = NULL;
	CU(dev, dev->d->MemHostAlloc(&p, cap, 0), "cuMemHostAlloc (MoE staging)");
	dev->stage = p;
	dev->stage_cap = cap;
	return 0;
}

/* The mapped host buffer of router logits, at least `bytes`. Only route
 * uses it, and route returns after its kernels are done. */
static int logits_need(struct baton_dev *dev, uint64_t bytes)
{
	if (dev->lg_cap >= bytes)
		return 0;
	if (dev->lg_host)
		dev->d->MemFreeHost(dev->lg_host);
	dev->lg_host = NULL;
	dev->lg_dev = 0;
	dev->lg_cap = 0;
	uint64_t cap = cuda_round_up(bytes, 1u << 16);
	void *p = NULL;
	CU(dev, dev->d->MemHostAlloc(&p, cap, CU_MEMHOSTALLOC_DEVICEMAP),
	    "cuMemHostAlloc (router logits)");
	CUdeviceptr dp = 0;
	CUresult r = dev->d->MemHostGetDevicePointer(&dp, p, 0);
	if (r != CUDA_SUCCESS) {
		dev->d->MemFreeHost(p);
		return cuda_fail(dev, r, "cuMemHostGetDevicePointer (router logits)");
	}
	dev->lg_host = p;
	dev->lg_dev = dp;
	dev->lg_cap = cap;
	return 0;
}

static int variant_of(uint32_t nt)
{
	return nt <= 1 ? 0 : nt <= 2 ? 1 : nt <= 4 ? 2 : 3;
}

static int check_layer(struct baton_dev *dev, const struct baton_moe_layer *l)
{
	if (!l || !l->batch || !l->d_model || !l->x || !l->xn) {
		cuda_set_err(dev, "moe: empty layer, batch or missing x/xn");
		return BATON_EINVAL;
	}
	if ((uint64_t)l->batch * l->d_model > UINT32_MAX) {
		cuda_set_err(dev, "moe: batch * d_model too large");
		return BATON_ERANGE;
	}
	return 0;
}

static int check_dtype(struct baton_dev *dev, const char *what, uint32_t dt, uint32_t cols)
{
	if (!cuda_can_compute((int)dt)) {
		const char *n = baton_dtype_name((int)dt);
		cuda_set_err(dev, "moe: the cuda backend cannot compute %s weights of type %s", what,
		    n ? n : "unknown");
		return BATON_EUNSUPPORTED;
	}
	if (!row_bytes(dt, cols)) {
		const char *n = baton_dtype_name((int)dt);
		cuda_set_err(dev, "moe: %s rows of %u %s values are not whole blocks of %u", what, cols, n,
		    baton_dtype_row_bytes((int)dt, 32) ? 32u : 256u);
		return BATON_EINVAL;
	}
	return 0;
}

int cuda_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l,
    uint32_t *ids, float *weights)
{
	int rc = check_layer(dev, l);
	if (rc)
		return rc;
	if (!ids || !weights || !l->router || !l->n_experts || !l->top_k ||
	    l->top_k > l->n_experts) {
		cuda_set_err(dev, "moe_route: no router, or top_k %u not in 1..n_experts %u", l->top_k,
		    l->n_experts);
		return BATON_EINVAL;
	}
	if ((rc = check_dtype(dev, "router", l->router_dtype, l->d_model)))
		return rc;
	if (l->norm && (rc = check_dtype(dev, "norm", l->norm_dtype, l->d_model)))
		return rc;
	if ((uint64_t)l->n_experts > 65535ull * BATON_CUDA_WARPS)
		return BATON_ERANGE;
	if ((rc = cuda_cur(dev)))
		return rc;
	const uint64_t nlog = (uint64_t)l->batch * l->n_experts;
	if ((rc = logits_need(dev, nlog * 4)))
		return rc;

	struct baton_cuda_norm_args na = {
		.x = l->x, .xn = l->xn, .norm = l->norm, .norm_dtype = l->norm_dtype,
		.d_model = l->d_model, .batch = l->batch,
	};
	if ((rc = cuda_launch(dev, dev->k_norm, l->batch, 1, 32 * BATON_CUDA_WARPS, &na,
	         "cuLaunchKernel baton_moe_rmsnorm")))
		return rc;
	const uint32_t nt = l->batch < BATON_CUDA_NT ? l->batch : BATON_CUDA_NT;
	struct baton_cuda_gemv_args ga = {
		.w = l->router, .x = l->xn, .y = dev->lg_dev, .dtype = l->router_dtype,
		.rows = l->n_experts, .cols = l->d_model, .ldx = l->d_model, .ldy = l->n_experts,
		.batch = l->batch,
		.vec = vec_ok(l->router, l->router_dtype, l->d_model) && l->xn % 16 == 0 &&
		    l->d_model % 4 == 0,
	};
	const int v = variant_of(nt);
	const uint32_t per = 1u << v, rows = BATON_CUDA_WARPS * BATON_CUDA_ROWS(per);
	if ((rc = cuda_launch(dev, dev->k_gemv[v], (l->batch + per - 1) / per,
	         (l->n_experts + rows - 1) / rows, 32 * BATON_CUDA_WARPS, &ga,
	         "cuLaunchKernel baton_moe_gemv (router)")))
		return rc;
	if ((rc = cuda_stream_sync(dev)))
		return rc;

	/* top-k (descending, ties to the lower id, NaN as -inf) and softmax
	 * over the chosen logits, per token: the host backend's definition.
	 * One pass keeps the best K so far in rank order; an id enters only
	 * above a strictly smaller key, so equal keys keep the lower id first. */
	const float *logits = dev->lg_host;
	const uint32_t E = l->n_experts, K = l->top_k;
	for (uint32_t t = 0; t < l->batch; t++) {
		const float *lg = logits + (uint64_t)t * E;
		uint32_t *id = ids + (uint64_t)t * K;
		float *w = weights + (uint64_t)t * K; /* the keys while selecting */
		uint32_t have = 0;
		for (uint32_t e = 0; e < E; e++) {
			const float key = isnan(lg[e]) ? -INFINITY : lg[e];
			if (have == K && !(key > w[K - 1]))
				continue;
			uint32_t at = have < K ? have++ : K - 1;
			while (at > 0 && key > w[at - 1]) {
				w[at] = w[at - 1];
				id[at] = id[at - 1];
				at--;
			}
			w[at] = key;
			id[at] = e;
		}
		const float m = lg[id[0]];
		float sum = 0.0f;
		for (uint32_t k = 0; k < K; k++) {
			w[k] = expf(lg[id[k]] - m);
			sum += w[k];
		}
		for (uint32_t k = 0; k < K; k++)
			w[k] /= sum;
	}
	return 0;
}

/* A pair p = t*top_k + k and its blob, sorted by (blob, p). */
struct bp {
	uint64_t blob, p;
};

static int cmp_bp(const void *a, const void *b)
{
	const struct bp *x = a, *y = b;
	if (x->blob != y->blob)
		return x->blob < y->blob ? -1 : 1;
	return x->p < y->p ? -1 : x->p > y->p;
}

int cuda_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *weights)
{
	int rc = check_layer(dev, l);
	if (rc)
		return rc;
	if (!blobs || !weights || !l->top_k || !l->d_ff) {
		cuda_set_err(dev, "moe_experts: no blobs, weights, top_k or d_ff");
		return BATON_EINVAL;
	}
	if ((rc = check_dtype(dev, "gate", l->gate_dtype, l->d_model)) ||
	    (rc = check_dtype(dev, "up", l->up_dtype, l->d_model)) ||
	    (rc = check_dtype(dev, "down", l->down_dtype, l->d_ff)))
		return rc;
	if ((uint64_t)l->d_ff > 65535ull * BATON_CUDA_WARPS ||
	    (uint64_t)l->d_model > 65535ull * BATON_CUDA_WARPS)
		return BATON_ERANGE;
	const uint64_t n = (uint64_t)l->batch * l->top_k;
	if (n > UINT32_MAX / 2)
		return BATON_ERANGE;
	for (uint64_t p = 0; p < n; p++)
		if (!blobs[p]) {
			cuda_set_err(dev, "moe_experts: blob %llu is 0", (unsigned long long)p);
			return BATON_EINVAL;
		}
	if ((rc = cuda_cur(dev)))
		return rc;

	/* a large batch: per-expert GEMMs on the tensor cores (tc_launch.c) */
	if (cuda_tc_on(dev, l->batch) &&
	    (rc = cuda_tc_experts(dev, l, blobs, n, weights)) != CUDA_TC_FALLBACK)
		return rc;

	/* Group the pairs by blob, in (blob, p) order: tokens that chose the
	 * same expert share one read of its weights. */
	if (dev->sort_cap < n) {
		struct bp *v = realloc(dev->sort, n * sizeof *v);
		if (!v)
			return BATON_ENOMEM;
		dev->sort = v;
		dev->sort_cap = n;
	}
	struct bp *sorted = dev->sort;
	for (uint64_t p = 0; p < n; p++)
		sorted[p] = (struct bp){ blobs[p], p };
	qsort(sorted, n, sizeof *sorted, cmp_bp);

	/* chunks of at most NT pairs of one blob */
	uint64_t n_chunks = 0;
	for (uint64_t i = 0; i < n;) {
		uint64_t j = i;
		while (j < n && sorted[j].blob == sorted[i].blob)
			j++;
		n_chunks += (j - i + BATON_CUDA_NT - 1) / BATON_CUDA_NT;
		i = j;
	}
	const uint64_t off_pairs = n_chunks * sizeof(struct baton_cuda_chunk);
	const uint64_t off_w = cuda_round_up(off_pairs + n * 4, 16);
	const uint64_t desc_bytes = off_w + n * 4;
	if ((rc = stage_need(dev, desc_bytes)) || (rc = cuda_dbuf_need(dev, &dev->desc, desc_bytes)) ||
	    (rc = cuda_dbuf_need(dev, &dev->h, n * l->d_ff * 4)) ||
	    (rc = cuda_dbuf_need(dev, &dev->part, n * l->d_model * 4)))
		return rc;
	struct baton_cuda_chunk *ch = dev->stage;
	uint32_t *pairs = (uint32_t *)((char *)dev->stage + off_pairs);
	float *w = (float *)((char *)dev->stage + off_w);
	uint64_t c = 0;
	uint32_t max_nt = 1;
	int vec = 7;
	for (uint64_t i = 0; i < n;) {
		uint64_t j = i;
		while (j < n && sorted[j].blob == sorted[i].blob)
			j++;
		const uint64_t b = sorted[i].blob;
		if (!vec_ok(b + l->gate_off, l->gate_dtype, l->d_model))
			vec &= ~1;
		if (!vec_ok(b + l->up_off, l->up_dtype, l->d_model))
			vec &= ~2;
		if (!vec_ok(b + l->down_off, l->down_dtype, l->d_ff))
			vec &= ~4;
		for (uint64_t s = i; s < j; s += BATON_CUDA_NT) {
			uint32_t cnt = (uint32_t)(j - s < BATON_CUDA_NT ? j - s : BATON_CUDA_NT);
			ch[c++] = (struct baton_cuda_chunk){ b, (uint32_t)s, cnt };
			if (cnt > max_nt)
				max_nt = cnt;
		}
		i = j;
	}
	for (uint64_t i = 0; i < n; i++)
		pairs[i] = (uint32_t)sorted[i].p;
	memcpy(w, weights, n * 4);
	if (l->xn % 16 || l->d_model % 4)
		vec &= ~3;
	if (l->d_ff % 4)
		vec &= ~4;

	CU(dev, dev->d->MemcpyHtoDAsync(dev->desc.p, dev->stage, desc_bytes, dev->stream),
	    "cuMemcpyHtoDAsync (MoE descriptors)");
	CU(dev, dev->d->EventRecord(dev->staged, dev->stream), "cuEventRecord");
	dev->stage_busy = 1;

	struct baton_cuda_ffn_args fa = {
		.chunks = dev->desc.p, .pairs = dev->desc.p + off_pairs, .w = dev->desc.p + off_w,
		.xn = l->xn, .h = dev->h.p, .part = dev->part.p,
		.gate_off = l->gate_off, .up_off = l->up_off, .down_off = l->down_off,
		.d_model = l->d_model, .d_ff = l->d_ff, .top_k = l->top_k,
		.n_chunks = (uint32_t)n_chunks,
		.gate_dtype = l->gate_dtype, .up_dtype = l->up_dtype, .down_dtype = l->down_dtype,
		.vec = (uint32_t)vec,
	};
	const int v = variant_of(max_nt);
	const uint32_t T = 32 * BATON_CUDA_WARPS;
	const uint32_t rows = BATON_CUDA_WARPS * BATON_CUDA_ROWS(1u << v);
	const uint32_t grows = BATON_CUDA_WARPS * BATON_CUDA_GATE_ROWS(1u << v);
	if ((rc = cuda_launch(dev, dev->k_gate_up[v], (uint32_t)n_chunks, (l->d_ff + grows - 1) / grows,
	         T, &fa, "cuLaunchKernel baton_moe_gate_up")) ||
	    (rc = cuda_launch(dev, dev->k_down[v], (uint32_t)n_chunks, (l->d_model + rows - 1) / rows,
	         T, &fa, "cuLaunchKernel baton_moe_down")))
		return rc;
	struct baton_cuda_reduce_args ra = {
		.x = l->x, .part = dev->part.p, .d_model = l->d_model, .top_k = l->top_k,
		.batch = l->batch,
	};
	const uint64_t total = (uint64_t)l->batch * l->d_model;
	return cuda_launch(dev, dev->k_reduce, (uint32_t)((total + 255) / 256), 1, 256, &ra,
	    "cuLaunchKernel baton_moe_reduce");
}

/* moe_experts with the blobs read on the device: one chunk per pair (made
 * by baton_moe_chunks from the table), the N = 1 kernels, whose per-pair
 * sums are those of every N (each pair's own accumulators), then the
 * reduce in rank order: moe_experts' bits, no host round trip. */
int cuda_moe_experts_dev(struct baton_dev *dev, const struct baton_moe_layer *l,
    baton_dptr table, baton_dptr ids, baton_dptr weights)
{
	int rc = check_layer(dev, l);
	if (rc)
		return rc;
	if (!table || table % 8 || !ids || ids % 4 || !weights || weights % 4 || !l->top_k ||
	    !l->d_ff || !l->n_experts) {
		cuda_set_err(dev, "moe_experts_dev: no table, ids, weights, top_k, d_ff or experts");
		return BATON_EINVAL;
	}
	if ((rc = check_dtype(dev, "gate", l->gate_dtype, l->d_model)) ||
	    (rc = check_dtype(dev, "up", l->up_dtype, l->d_model)) ||
	    (rc = check_dtype(dev, "down", l->down_dtype, l->d_ff)))
		return rc;
	if ((uint64_t)l->d_ff > 65535ull * BATON_CUDA_WARPS ||
	    (uint64_t)l->d_model > 65535ull * BATON_CUDA_WARPS)
		return BATON_ERANGE;
	const uint64_t n = (uint64_t)l->batch * l->top_k;
	if (n > 65535)
		return BATON_ERANGE;
	if ((rc = cuda_cur(dev)))
		return rc;
	/* a large pass of bf16 experts: planned and run on the tensor cores
	 * (tc_launch.c), nothing back to the host */
	if (cuda_tc_on(dev, l->batch) &&
	    (rc = cuda_tc_experts_dev(dev, l, table, ids, weights)) != CUDA_TC_FALLBACK)
		return rc;
	if ((rc = cuda_mmvq_experts(dev, l, table, ids, weights)) != CUDA_TC_FALLBACK)
		return rc;
	/* q4_K experts at 2 .. 64 rows: moe_rows.cu, each expert read once */
	if ((rc = cuda_mr_experts(dev, l, table, ids, weights)) != CUDA_TC_FALLBACK)
		return rc;
	/* bf16 / f16 experts at batch 1: gemv16.cu */
	if ((rc = cuda_g16_experts(dev, l, table, ids, weights)) != CUDA_TC_FALLBACK)
		return rc;
	const uint64_t off_pairs = n * sizeof(struct baton_cuda_chunk);
	if ((rc = cuda_dbuf_need(dev, &dev->desc, off_pairs + n * 4)) ||
	    (rc = cuda_dbuf_need(dev, &dev->h, n * l->d_ff * 4)) ||
	    (rc = cuda_dbuf_need(dev, &dev->part, n * l->d_model * 4)))
		return rc;
	/* table entries are multiples of 256: a blob's alignment is its offsets' */
	int vec = 7;
	if (!vec_ok(l->gate_off, l->gate_dtype, l->d_model) || l->xn % 16 || l->d_model % 4)
		vec &= ~1;
	if (!vec_ok(l->up_off, l->up_dtype, l->d_model) || l->xn % 16 || l->d_model % 4)
		vec &= ~2;
	if (!vec_ok(l->down_off, l->down_dtype, l->d_ff) || l->d_ff % 4)
		vec &= ~4;
	struct baton_cuda_chunks_args ca = {
		.table = table, .ids = ids, .chunks = dev->desc.p, .pairs = dev->desc.p + off_pairs,
		.n = (uint32_t)n,
	};
	if ((rc = cuda_launch(dev, dev->k_chunks, (uint32_t)((n + 255) / 256), 1, 256, &ca,
	         "cuLaunchKernel baton_moe_chunks")))
		return rc;
	struct baton_cuda_ffn_args fa = {
		.chunks = dev->desc.p, .pairs = dev->desc.p + off_pairs, .w = weights,
		.xn = l->xn, .h = dev->h.p, .part = dev->part.p,
		.gate_off = l->gate_off, .up_off = l->up_off, .down_off = l->down_off,
		.d_model = l->d_model, .d_ff = l->d_ff, .top_k = l->top_k,
		.n_chunks = (uint32_t)n,
		.gate_dtype = l->gate_dtype, .up_dtype = l->up_dtype, .down_dtype = l->down_dtype,
		.vec = (uint32_t)vec,
	};
	const uint32_t T = 32 * BATON_CUDA_WARPS;
	const uint32_t rows = BATON_CUDA_WARPS * BATON_CUDA_ROWS(1);
	const uint32_t grows = BATON_CUDA_WARPS * BATON_CUDA_GATE_ROWS(1);
	if ((rc = cuda_launch(dev, dev->k_gate_up[0], (uint32_t)n, (l->d_ff + grows - 1) / grows, T, &fa,
	         "cuLaunchKernel baton_moe_gate_up")) ||
	    (rc = cuda_launch(dev, dev->k_down[0], (uint32_t)n, (l->d_model + rows - 1) / rows, T, &fa,
	         "cuLaunchKernel baton_moe_down")))
		return rc;
	struct baton_cuda_reduce_args ra = {
		.x = l->x, .part = dev->part.p, .d_model = l->d_model, .top_k = l->top_k,
		.batch = l->batch,
	};
	const uint64_t total = (uint64_t)l->batch * l->d_model;
	return cuda_launch(dev, dev->k_reduce, (uint32_t)((total + 255) / 256), 1, 256, &ra,
	    "cuLaunchKernel baton_moe_reduce");
}

int cuda_moe_dev_rows(struct baton_dev *dev, const struct baton_moe_layer *l, uint32_t *lo,
    uint32_t *hi)
{
	/* from the tensor-core path's rows (cuda_tc_on) to moe_experts_dev's
	 * 65535 pairs; smaller passes of bf16 experts group them on the host */
	if (!dev || !l || !l->top_k || !lo || !hi || !cuda_tc_experts_dev_ok(dev, l) ||
	    dev->tc_rows < 2 || dev->tc_rows > 65535u / l->top_k)
		return 0;
	*lo = dev->tc_rows;
	*hi = 65535u / l->top_k;
	return 1;
}
