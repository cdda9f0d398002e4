/*
 * launch.c: the bottom of the `cuda` backend's two launchers (moe_launch.c
 * and ops_launch.c), what both use and neither owns: the dtypes their
 * kernels compute (the can_compute slot), the growing device buffers of
 * their scratch, and one kernel launch on the context's stream.
 */
#include "arena/arena.h"
#include "engine/backend/cuda/cuda_int.h"

int cuda_can_compute(int dtype)
{
	switch (dtype) {
	case BATON_DT_F32:
	case BATON_DT_F16:
	case BATON_DT_BF16:
	case BATON_DT_Q8_0:
	case BATON_DT_Q4_K:
	case BATON_DT_Q5_K:
	case BATON_DT_Q6_K:
	/* the block types of arena/quant.c (dtype.cuh: bq_elem) */
	case BATON_DT_Q4_0:
	case BATON_DT_Q4_1:
	case BATON_DT_Q5_0:
	case BATON_DT_Q5_1:
	case BATON_DT_Q2_K:
	case BATON_DT_Q3_K:
	case BATON_DT_IQ4_NL:
	case BATON_DT_IQ4_XS:
	case BATON_DT_MXFP4:
		return 1;
	default: /* the IQ1/IQ2/IQ3 and TQ families are refused at import */
		return 0;
	}
}

void cuda_dbuf_free(struct baton_dev *dev, struct dbuf *b)
{
	if (b->p)
		dev->d->MemFree(b->p);
	b->p = 0;
	b->cap = 0;
}

int cuda_dbuf_need(struct baton_dev *dev, struct dbuf *b, uint64_t bytes)
{
	if (b->cap >= bytes)
		return 0;
	int rc = cuda_stream_sync(dev); /* the old buffer may be in use */
	if (rc)
		return rc;
	cuda_dbuf_free(dev, b);
	uint64_t cap = cuda_round_up(bytes, 1u << 20);
	CUdeviceptr p = 0;
	CU(dev, dev->d->MemAlloc(&p, cap), "cuMemAlloc (scratch)");
	b->p = p;
	b->cap = cap;
	return 0;
}

int cuda_launch(struct baton_dev *dev, CUfunction f, uint32_t gx, uint32_t gy,
    uint32_t threads, void *args, const char *what)
{
	void *params[] = { args };
	CU(dev, dev->d->LaunchKernel(f, gx, gy, 1, threads, 1, 1, 0, dev->stream, params, NULL),
	    what);
	return 0;
}
