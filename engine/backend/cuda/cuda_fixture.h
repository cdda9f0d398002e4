/*
 * cuda_fixture.h: what the cuda backend's GPU tests share (header only,
 * tests inside engine/backend/cuda/ only, since it includes the internal
 * driver.h): opening device 0 through the backend, or for the probes
 * through the driver itself, each ending the case as a pass with "skip:
 * why" where there is no driver or no device; and T_CU, which fails a
 * case with the call, its error name and the context's last driver error.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_FIXTURE_H
#define BATON_ENGINE_BACKEND_CUDA_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/cuda/cuda.h"
#include "engine/backend/cuda/driver.h"
#include "tests/t.h"

/* Ends the case as a pass with "skip: why" unless a driver and a device
 * answer. */
static inline void cuda_fixture_need_gpu(void)
{
	char err[256];
	if (cuda_backend_probe(err, sizeof err) != 0) {
		printf("  skip: %s\n", err);
		fflush(stdout);
		exit(0);
	}
}

/* Opens device 0 of the cuda backend, or ends the case as a pass with
 * "skip: why" (CI has no GPU). The caller closes it. */
static inline struct baton_dev *cuda_fixture_open(void)
{
	char err[256];
	cuda_fixture_need_gpu();
	struct baton_dev *dev = NULL;
	int rc = baton_backend_cuda.open(0, 0, &dev, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "open: %s (%s)", baton_errname(rc), err);
	return dev;
}

/* For the probes that call the driver directly: the driver in *d and
 * device 0 in *dev, its primary context retained and current (or the case
 * ends as a pass with "skip: why"). */
static inline CUcontext cuda_fixture_driver(const struct cuda_driver **d, CUdevice *dev)
{
	char err[256];
	CUcontext ctx;
	cuda_fixture_need_gpu();
	T_OK(cuda_driver_load(d, err, sizeof err));
	T_ASSERT((*d)->Init(0) == CUDA_SUCCESS);
	T_ASSERT((*d)->DeviceGet(dev, 0) == CUDA_SUCCESS);
	T_ASSERT((*d)->DevicePrimaryCtxRetain(&ctx, *dev) == CUDA_SUCCESS);
	T_ASSERT((*d)->CtxSetCurrent(ctx) == CUDA_SUCCESS);
	return ctx;
}

/* A pinned VMM allocation on device dev and read-write access to it, as
 * the probes map their segments. */
static inline void cuda_fixture_vmm_prop(CUdevice dev, CUmemAllocationProp *prop,
    CUmemAccessDesc *acc)
{
	memset(prop, 0, sizeof *prop);
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = dev;
	memset(acc, 0, sizeof *acc);
	acc->location = prop->location;
	acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* A backend call that must succeed on dev. */
#define T_CU(dev, expr)                                                        \
	do {                                                                   \
		int t_rc_ = (expr);                                            \
		if (t_rc_ != 0)                                                \
			T_FAIL("%s gave %s: %s", #expr, baton_errname(t_rc_),  \
			    cuda_backend_last_error(dev));                     \
	} while (0)

#endif
