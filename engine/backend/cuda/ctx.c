/*
 * ctx.c: the small helpers under every file of the `cuda` backend
 * (launch.c, moe_launch.c, ops_launch.c, backend.c): recording a driver
 * error as the context's sentence and a Baton code, making the context current, and
 * waiting for its stream. They call nothing above them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "engine/backend/cuda/cuda_int.h"

void cuda_set_err(struct baton_dev *dev, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	baton_verrf(dev->err, sizeof dev->err, fmt, ap);
	va_end(ap);
}

/* Records a failed driver call and maps it to a Baton code. */
int cuda_fail(struct baton_dev *dev, CUresult r, const char *what)
{
	char s[160];
	cuda_driver_errstr(dev->d, r, s, sizeof s);
	cuda_set_err(dev, "%s: %s", what, s);
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return BATON_EDEVMEM;
	case CUDA_ERROR_INVALID_VALUE:
		return BATON_EINVAL;
	case CUDA_ERROR_NOT_SUPPORTED:
		return BATON_EUNSUPPORTED;
	default:
		return BATON_EDRIVER;
	}
}

int cuda_cur(struct baton_dev *dev)
{
	CU(dev, dev->d->CtxSetCurrent(dev->ctx), "cuCtxSetCurrent");
	return 0;
}

static double mono_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int cuda_stream_sync(struct baton_dev *dev)
{
	const double t0 = mono_s();
	CUresult r = dev->d->StreamSynchronize(dev->stream);
	dev->t_wait += mono_s() - t0; /* the backend's wait_seconds */
	if (r != CUDA_SUCCESS)
		return cuda_fail(dev, r, "cuStreamSynchronize");
	dev->stage_busy = 0;
	return 0;
}
