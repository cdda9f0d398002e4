/*
 * moe_rows_launch.c: the experts of passes of 2 to BATON_MR_MAX_ROWS rows
 * routed on the device (moe_rows.cu): when they apply (q4_K gate, up and
 * down at 16-byte alignment, widths multiples of 256 up to BATON_MR_MAX_D
 * and BATON_MR_MAX_F, at most 1024 experts; off with BATON_CUDA_EXACT=1 as mmvq's path, or with
 * BATON_CUDA_MOE_ROWS=0), their scratch and their five launches: the
 * rows' quantization, the grouping, gate_up, down, and moe.cu's reduce.
 * Sized for the most rows at the first call, so that a recorded pass
 * (graph.c) never grows a buffer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/cuda/moe.h"
#include "engine/backend/cuda/moe_rows.h"

extern const unsigned char baton_engine_backend_cuda_moe_rows_fatbin[];
extern const size_t baton_engine_backend_cuda_moe_rows_fatbin_len;

int cuda_mr_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	const char *s = getenv("BATON_CUDA_MOE_ROWS");
	dev->mr_off = s && strcmp(s, "0") == 0;
	CU(dev, d->ModuleLoadData(&dev->mr_mod, baton_engine_backend_cuda_moe_rows_fatbin),
	    "cuModuleLoadData of the grouped expert kernels (sm_90 SASS, compute_90 PTX)");
	struct {
		CUfunction *f;
		const char *name;
	} k[] = {
		{ &dev->k_mr_quant, "baton_mr_quant" },
		{ &dev->k_mr_group, "baton_mr_group" },
		{ &dev->k_mr_gate_up, "baton_mr_gate_up" },
		{ &dev->k_mr_down, "baton_mr_down" },
	};
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
		CU(dev, d->ModuleGetFunction(k[i].f, dev->mr_mod, k[i].name), k[i].name);
	/* one launch of each on empty sizes (each returns at once): modules
	 * load lazily */
	struct baton_mr_quant_args zq = { 0 };
	struct baton_mr_group_args zg = { .n = BATON_MR_MAX_PAIRS + 1 };
	struct baton_mr_moe_args ze = { 0 };
	void *zero[] = { &zq, &zg, &ze, &ze };
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
		void *params[] = { zero[i] };
		CU(dev, d->LaunchKernel(*k[i].f, 1, 1, 1, 32, 1, 1, 0, dev->stream, params, NULL),
		    "first launch of the grouped expert kernels");
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	return 0;
}

void cuda_mr_free(struct baton_dev *dev)
{
	cuda_dbuf_free(dev, &dev->mr_buf);
	if (dev->mr_mod)
		dev->d->ModuleUnload(dev->mr_mod);
	dev->mr_mod = NULL;
}

int cuda_mr_experts(struct baton_dev *dev, const struct baton_moe_layer *l, baton_dptr table,
    baton_dptr ids, baton_dptr weights)
{
	const uint32_t D = l->d_model, F = l->d_ff, K = l->top_k, E = l->n_experts, B = l->batch;
	if (dev->vq_off || dev->mr_off || !dev->mr_mod || B < 2 || B > BATON_MR_MAX_ROWS ||
	    l->gate_dtype != BATON_DT_Q4_K || l->up_dtype != BATON_DT_Q4_K ||
	    l->down_dtype != BATON_DT_Q4_K || l->gate_off % 16 || l->up_off % 16 ||
	    l->down_off % 16 || D % 256 || F % 256 || D > BATON_MR_MAX_D || F > BATON_MR_MAX_F ||
	    E > BATON_MR_MAX_E ||
	    (uint64_t)BATON_MR_MAX_ROWS * K > BATON_MR_MAX_PAIRS || l->xn % 16 || l->x % 4 ||
	    F / 32 > 65535 || D / 32 > 65535)
		return CUDA_TC_FALLBACK;
	/* the scratch for the most rows (the same buffers for every pass) */
	const uint64_t R = BATON_MR_MAX_ROWS, NK = R * K, NS = E < NK ? E : NK;
	const uint64_t o_xds = cuda_round_up(R * D, 16);
	const uint64_t o_slots = cuda_round_up(o_xds + R * D / 32 * 8, 16);
	const uint64_t o_pairs = o_slots + NS * 16;
	const uint64_t o_hq = cuda_round_up(o_pairs + NK * 4, 16);
	const uint64_t o_hds = cuda_round_up(o_hq + NK * F, 16);
	const uint64_t bytes = o_hds + NK * F / 32 * 8;
	int rc;
	if ((rc = cuda_dbuf_need(dev, &dev->mr_buf, bytes)) ||
	    (rc = cuda_dbuf_need(dev, &dev->part, NK * D * 4)))
		return rc;
	const CUdeviceptr base = dev->mr_buf.p;
	const uint32_t nk = B * K, ns = E < nk ? E : nk;
	struct baton_mr_quant_args qa = { .x = l->xn, .q = base, .ds = base + o_xds, .n = B * D };
	struct baton_mr_group_args ga = { .ids = ids, .table = table, .slots = base + o_slots,
		.pairs = base + o_pairs, .n = nk, .n_experts = E, .n_slots = ns };
	struct baton_mr_moe_args ma = {
		.slots = base + o_slots, .pairs = base + o_pairs, .w = weights, .xq = base,
		.xds = base + o_xds, .hq = base + o_hq, .hds = base + o_hds, .part = dev->part.p,
		.gate_off = l->gate_off, .up_off = l->up_off, .down_off = l->down_off,
		.d_model = D, .d_ff = F, .top_k = K,
	};
	struct baton_cuda_reduce_args ra = {
		.x = l->x, .part = dev->part.p, .d_model = D, .top_k = K, .batch = B,
	};
	const uint64_t total = (uint64_t)B * D;
	if ((rc = cuda_launch(dev, dev->k_mr_quant, (B * D + 255) / 256, 1, 256, &qa,
	         "cuLaunchKernel baton_mr_quant")) ||
	    (rc = cuda_launch(dev, dev->k_mr_group, 1, 1, 256, &ga, "cuLaunchKernel baton_mr_group")) ||
	    (rc = cuda_launch(dev, dev->k_mr_gate_up, F / 32, ns, 32 * BATON_MR_GU_WARPS, &ma,
	         "cuLaunchKernel baton_mr_gate_up")) ||
	    (rc = cuda_launch(dev, dev->k_mr_down, D / 32, ns, 32 * BATON_MR_DN_WARPS, &ma,
	         "cuLaunchKernel baton_mr_down")))
		return rc;
	return cuda_launch(dev, dev->k_reduce, (uint32_t)((total + 255) / 256), 1, 256, &ra,
	    "cuLaunchKernel baton_moe_reduce (rows)");
}
