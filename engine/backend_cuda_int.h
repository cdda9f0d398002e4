/*
 * backend_cuda_int.h: internal to the `cuda` backend, shared by its
 * files, bottom to top: cuda_ctx.c (error recording, the context, the
 * stream), moe_cuda_launch.c (the MoE kernels: loading them, their
 * scratch, and the launches) and backend_cuda.c (the device: open, close,
 * VMM segments, the peer tier, buffers, pinning, copies, and the backend
 * table). Each calls only those below it. Built only with CUDA=1.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_INT_H
#define BATON_ENGINE_BACKEND_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend_cuda.h"
#include "engine/cuda_driver.h"

#define N_VARIANTS 4 /* row kernels for 1, 2, 4, 8 tokens per warp */

/* One entry of a table: a segment (handle set), a reservation, a plain
 * allocation or a host registration (handle = piece size). */
struct ent {
	uint64_t addr, bytes, handle;
};

struct tab {
	struct ent *v;
	size_t n, cap;
};

struct bp;

/* A device buffer that grows on demand (scratch of the MoE kernels). */
struct dbuf {
	CUdeviceptr p;
	uint64_t cap;
};

struct baton_dev {
	const struct cuda_driver *d;
	int index;
	CUdevice cudev;
	CUcontext ctx;
	CUstream stream;
	CUevent staged; /* recorded after the copy out of `stage` */
	CUmodule mod;
	CUfunction k_norm, k_reduce;
	CUfunction k_gemv[N_VARIANTS], k_gate_up[N_VARIANTS], k_down[N_VARIANTS];
	CUmemAllocationProp prop;
	uint64_t gran, gran_min;
	int ro_register;
	uint64_t register_piece;
	char name[128];

	struct tab segs, ress, allocs, hregs;
	struct tab psegs; /* peer-tier segments: memory on another device, mapped here */

	/* MoE scratch: device buffers, one pinned host staging buffer, and
	 * the router logits in pinned host memory mapped into the device
	 * (the kernel writes them there: no copy to queue and wait for). */
	struct dbuf desc, h, part;
	float *lg_host;
	CUdeviceptr lg_dev;
	uint64_t lg_cap;
	void *stage;
	uint64_t stage_cap;
	int stage_busy; /* `staged` was recorded since the stage was last free */
	/* moe_experts' pairs sorted by blob */
	struct bp *sort;
	size_t sort_cap;

	char err[256];
};

/* ---- cuda_ctx.c: the helpers under both files ----------------------------- */

/* The context's error sentence (cuda_backend_last_error). */
void cuda_set_err(struct baton_dev *dev, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Records a failed driver call and maps it to a Baton code. */
int cuda_fail(struct baton_dev *dev, CUresult r, const char *what);
/* Makes dev's context current on this thread. */
int cuda_cur(struct baton_dev *dev);
/* Waits for the stream (and so frees the staging buffer). */
int cuda_stream_sync(struct baton_dev *dev);

/* A failed driver call returns its Baton code from the calling function. */
#define CU(dev, call, what)                                                    \
	do {                                                                   \
		CUresult cu_r_ = (call);                                       \
		if (cu_r_ != CUDA_SUCCESS)                                     \
			return cuda_fail((dev), cu_r_, (what));                \
	} while (0)

static inline uint64_t cuda_round_up(uint64_t v, uint64_t g)
{
	return (v + g - 1) / g * g;
}

/* ---- moe_cuda_launch.c ---------------------------------------------------- */

/* Loads the kernels from the embedded fatbin and launches each once (at
 * open); cuda_moe_free gives back the module and every scratch buffer
 * (at close, with the context current). */
int cuda_moe_load(struct baton_dev *dev);
void cuda_moe_free(struct baton_dev *dev);
/* The backend slots moe_route, moe_experts and can_compute. */
int cuda_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l,
    uint32_t *ids, float *weights);
int cuda_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *weights);
int cuda_can_compute(int dtype);

#endif
