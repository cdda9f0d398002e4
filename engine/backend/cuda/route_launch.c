/*
 * route_launch.c: routing on the `cuda` backend (the slots route,
 * route_dev and router_route_dev of engine/backend/backend.h): the
 * kernels of route.cu (embedded as a fatbin), the fused router's
 * counters, argument checks (the host's, host/ops.c's codes) and the
 * launches on the context's stream; where the fused kernel does not
 * apply, ops_launch.c's rmsnorm and matmul, then route_dev.
 *
 * route copies the logits back and chooses on the host with host/ops.c's
 * own code: one definition of the rule, and rows * n_experts floats are
 * little to move; route_dev and router_route_dev leave the ids and
 * weights on the device (route.cu: the host's bits).
 */
#include <stdio.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/host/host.h"
#include "engine/backend/cuda/ops.h"

extern const unsigned char baton_engine_backend_cuda_route_fatbin[];
extern const size_t baton_engine_backend_cuda_route_fatbin_len;

/* ---- loading -------------------------------------------------------------- */

int cuda_route_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->ModuleLoadData(&dev->route_mod, baton_engine_backend_cuda_route_fatbin),
	    "cuModuleLoadData of the routing kernels (sm_90 SASS, compute_90 PTX)");
	const struct {
		CUfunction *f;
		const char *name;
	} k[] = {
		{ &dev->k_route, "baton_ops_route" },
		{ &dev->k_router_route, "baton_ops_router_route" },
	};
	const size_t n = sizeof k / sizeof k[0];
	for (size_t i = 0; i < n; i++) {
		CUresult r = d->ModuleGetFunction(k[i].f, dev->route_mod, k[i].name);
		if (r != CUDA_SUCCESS) {
			char what[96];
			snprintf(what, sizeof what, "cuModuleGetFunction %s", k[i].name);
			return cuda_fail(dev, r, what);
		}
	}
	/* one launch of each on empty sizes (each returns at once), as
	 * cuda_ops_load does: modules load lazily */
	union {
		struct baton_ops_route_args rt;
		struct baton_ops_router_route_args rr;
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
	/* the fused router's counters, zero from here on (each launch leaves
	 * them so); allocated now, never in a recorded pass */
	static const uint32_t zeros[BATON_OPS_ROUTER_MAX_ROWS];
	int rc0;
	if ((rc0 = cuda_dbuf_need(dev, &dev->ops_count, sizeof zeros)))
		return rc0;
	CU(dev, d->MemcpyHtoDAsync(dev->ops_count.p, zeros, sizeof zeros, dev->stream),
	    "cuMemcpyHtoDAsync (router counters)");
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

void cuda_route_free(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	cuda_dbuf_free(dev, &dev->ops_count);
	if (dev->ops_logits)
		d->MemFreeHost(dev->ops_logits);
	dev->ops_logits = NULL;
	if (dev->route_mod)
		d->ModuleUnload(dev->route_mod);
	dev->route_mod = NULL;
}

/* ---- the slots -------------------------------------------------------------- */

int cuda_op_route(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
    uint32_t top_k, int rule, uint32_t *ids, float *weights)
{
	int rc;
	if (!rows || !top_k || top_k > n_experts || !ids || !weights ||
	    !cuda_f32_buf(logits, (uint64_t)rows * n_experts))
		return cuda_refuse(dev, BATON_EINVAL, "route",
		    "zero sizes, top_k above the experts, or a missing buffer");
	if (rule != BATON_ROUTE_SOFTMAX_TOPK && rule != BATON_ROUTE_SOFTMAX_TOPK_NORM)
		return cuda_refuse(dev, BATON_EINVAL, "route", "unknown rule");
	const uint64_t bytes = (uint64_t)rows * n_experts * 4;
	if ((rc = cuda_cur(dev)))
		return rc;
	if (dev->ops_logits_cap < bytes) {
		if (dev->ops_logits)
			dev->d->MemFreeHost(dev->ops_logits);
		dev->ops_logits = NULL;
		dev->ops_logits_cap = 0;
		const uint64_t cap = cuda_round_up(bytes, 1u << 16);
		void *p = NULL;
		CU(dev, dev->d->MemHostAlloc(&p, cap, 0), "cuMemHostAlloc (route logits)");
		dev->ops_logits = p;
		dev->ops_logits_cap = cap;
	}
	CU(dev, dev->d->MemcpyDtoHAsync(dev->ops_logits, logits, bytes, dev->stream),
	    "cuMemcpyDtoHAsync (route logits)");
	if ((rc = cuda_stream_sync(dev)))
		return rc;
	return host_op_route(NULL, (baton_dptr)(uintptr_t)dev->ops_logits, rows, n_experts, top_k,
	    rule, ids, weights);
}

int cuda_op_route_dev(struct baton_dev *dev, baton_dptr logits, uint32_t rows,
    uint32_t n_experts, uint32_t top_k, int rule, baton_dptr ids, baton_dptr weights)
{
	_Static_assert(BATON_ROUTE_SOFTMAX_TOPK_NORM == 1, "the route kernel's rule number");
	int rc;
	const uint64_t nk = (uint64_t)rows * top_k;
	if (!rows || !top_k || top_k > n_experts || !cuda_f32_buf(logits, (uint64_t)rows * n_experts) ||
	    !cuda_f32_buf(weights, nk) || !ids || ids % 4 || cuda_overlap(ids, nk, weights, nk) ||
	    cuda_overlap(ids, nk, logits, (uint64_t)rows * n_experts) ||
	    cuda_overlap(weights, nk, logits, (uint64_t)rows * n_experts))
		return cuda_refuse(dev, BATON_EINVAL, "route_dev",
		    "zero sizes, top_k above the experts, or missing or overlapping buffers");
	if (rule != BATON_ROUTE_SOFTMAX_TOPK && rule != BATON_ROUTE_SOFTMAX_TOPK_NORM)
		return cuda_refuse(dev, BATON_EINVAL, "route_dev", "unknown rule");
	if (n_experts > 8192)
		return cuda_refuse(dev, BATON_ERANGE, "route_dev", "more than 8192 experts");
	if ((rc = cuda_cur(dev)))
		return rc;
	struct baton_ops_route_args a = {
		.logits = logits, .ids = ids, .w = weights,
		.rows = rows, .n_experts = n_experts, .top_k = top_k, .rule = (uint32_t)rule,
	};
	const uint64_t before = dev->n_launch;
	if ((rc = cuda_launch_k(dev, dev->k_route, rows, 1, 1, 32, n_experts * 5, &a, sizeof a,
	         "cuLaunchKernel baton_ops_route")))
		return rc;
	cuda_mmvq_keep(dev, before, ids, nk * 4, weights, nk * 4); /* writes ids and weights alone */
	return 0;
}

/* The post-attention norm, the router and route_dev in one launch where
 * it applies (f32 router rows, k a multiple of 32 (16-byte loads where
 * the rows are 16-byte aligned and k a multiple of 128),
 * at most 64 rows and ROUTER_MAX_E experts, with the norm k at most
 * NORM_ROW_MAX, x 16-byte aligned and apart from xn: the code of rmsnorm_row, the one-row
 * f32 matmul and the route kernel, so their bits), else the calls one
 * after the other. All of route_dev's checks come first: a refused call
 * queues nothing. */
int cuda_op_router_route_dev(struct baton_dev *dev, const struct baton_router_route *r)
{
	int rc;
	const uint32_t rows = r->rows, k = r->k, E = r->n_experts, K = r->top_k;
	const uint64_t nx = (uint64_t)rows * k, nl = (uint64_t)rows * E, nk = (uint64_t)rows * K;
	if (!r->w || !rows || !k || !E || !K || K > E || !cuda_f32_buf(r->xn, nx) || !cuda_f32_buf(r->logits, nl) ||
	    !cuda_f32_buf(r->weights, nk) || !r->ids || r->ids % 4 || cuda_overlap(r->ids, nk, r->weights, nk) ||
	    cuda_overlap(r->ids, nk, r->logits, nl) || cuda_overlap(r->weights, nk, r->logits, nl) ||
	    cuda_overlap(r->xn, nx, r->logits, nl) || cuda_overlap(r->xn, nx, r->ids, nk) ||
	    cuda_overlap(r->xn, nx, r->weights, nk) ||
	    (r->norm_on && (!cuda_f32_buf(r->x, nx) || cuda_overlap(r->x, nx, r->xn, nx) || !(r->eps >= 0))))
		return cuda_refuse(dev, BATON_EINVAL, "router_route_dev",
		    "zero sizes, top_k above the experts, or missing or overlapping buffers");
	if (r->rule != BATON_ROUTE_SOFTMAX_TOPK && r->rule != BATON_ROUTE_SOFTMAX_TOPK_NORM)
		return cuda_refuse(dev, BATON_EINVAL, "router_route_dev", "unknown rule");
	if (E > 8192)
		return cuda_refuse(dev, BATON_ERANGE, "router_route_dev", "more than 8192 experts");
	uint64_t rb;
	if ((rc = cuda_weight_ok(dev, "router_route_dev", r->w_dtype, k, &rb)) ||
	    (r->norm_on && r->norm && (rc = cuda_weight_ok(dev, "router_route_dev norm", r->norm_dtype, k, &rb))))
		return rc;
	const int fused = r->w_dtype == BATON_DT_F32 && r->w % 4 == 0 && k % 32 == 0 &&
	    rows <= BATON_OPS_ROUTER_MAX_ROWS && E <= BATON_OPS_ROUTER_MAX_E &&
	    (!r->norm_on || (k <= BATON_OPS_NORM_ROW_MAX && r->x % 16 == 0));
	if (!fused) {
		if ((r->norm_on && (rc = cuda_op_rmsnorm(dev, r->x, r->xn, rows, k, r->norm, r->norm_dtype,
		         r->eps))) ||
		    (rc = cuda_op_matmul(dev, r->w, r->w_dtype, E, k, 0, 0, r->xn, rows, r->logits, 0)))
			return rc;
		return cuda_op_route_dev(dev, r->logits, rows, E, K, r->rule, r->ids, r->weights);
	}
	if ((rc = cuda_cur(dev)))
		return rc;
	struct baton_ops_router_route_args a = {
		.x = r->x, .xn = r->xn, .norm = r->norm_on ? r->norm : 0, .w = r->w, .logits = r->logits,
		.ids = r->ids, .w_out = r->weights, .count = dev->ops_count.p,
		.norm_on = r->norm_on ? 1u : 0u, .norm_dtype = r->norm_dtype, .k = k, .rows = rows,
		.n_experts = E, .top_k = K, .rule = (uint32_t)r->rule, .eps = r->eps,
	};
	/* one row normed here: also as the int8 blocks of the experts after it */
	if (r->norm_on && (rc = cuda_mmvq_norm_out(dev, rows, k, &a.q, &a.d)))
		return rc;
	const uint64_t before = dev->n_launch;
	if ((rc = cuda_launch(dev, dev->k_router_route,
	         (E + BATON_OPS_ROUTER_WARPS - 1) / BATON_OPS_ROUTER_WARPS, rows,
	         32 * BATON_OPS_ROUTER_WARPS, &a, "cuLaunchKernel baton_ops_router_route")))
		return rc;
	if (a.q) {
		cuda_mmvq_norm_done(dev, r->xn, k);
		return 0;
	}
	/* without the norm: writes logits, ids and weights alone, so xn's
	 * quantization stays (unless one of them is where it came from) */
	const uint64_t vs = dev->vq_src, ve = vs + (uint64_t)dev->vq_k * 4;
	if (r->weights + nk * 4 <= vs || ve <= r->weights)
		cuda_mmvq_keep(dev, before, r->logits, nl * 4, r->ids, nk * 4);
	return 0;
}
