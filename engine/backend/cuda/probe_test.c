/*
 * probe_test.c: what the driver allows for releasing VMM memory fast.
 * Prints figures (not asserted) for unmapping and releasing 59 segments of
 * 256 MiB (14.75 GiB, the GPU test's cache): all on one thread, and with
 * cuMemRelease spread over 2 and 4 threads. Skips without a GPU.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "engine/backend/cuda/cuda_fixture.h"
#include "tests/t.h"

#define NSEG 59
#define SEG (256ull << 20)

struct job {
	const struct cuda_driver *d;
	CUcontext ctx;
	CUmemGenericAllocationHandle *h;
	int from, to;
};

static void *release_range(void *arg)
{
	struct job *j = arg;
	j->d->CtxSetCurrent(j->ctx);
	for (int i = j->from; i < j->to; i++)
		j->d->MemRelease(j->h[i]);
	return NULL;
}

static void t_release_threads(void)
{
	const struct cuda_driver *d;
	CUdevice dev;
	CUcontext ctx = cuda_fixture_driver(&d, &dev);
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	cuda_fixture_vmm_prop(dev, &prop, &acc);
	CUdeviceptr base;
	T_ASSERT(d->MemAddressReserve(&base, NSEG * SEG, 0, 0, 0) == CUDA_SUCCESS);
	const int threads[] = { 1, 2, 4, 8 };
	for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
		for (int rep = 0; rep < 2; rep++) {
			CUmemGenericAllocationHandle h[NSEG];
			double t0 = t_now();
			for (int i = 0; i < NSEG; i++) {
				T_ASSERT(d->MemCreate(&h[i], SEG, &prop, 0) == CUDA_SUCCESS);
				T_ASSERT(d->MemMap(base + i * SEG, SEG, 0, h[i], 0) == CUDA_SUCCESS);
				T_ASSERT(d->MemSetAccess(base + i * SEG, SEG, &acc, 1) == CUDA_SUCCESS);
			}
			double map_s = t_now() - t0;
			t0 = t_now();
			for (int i = 0; i < NSEG; i++)
				T_ASSERT(d->MemUnmap(base + i * SEG, SEG) == CUDA_SUCCESS);
			double unmap_s = t_now() - t0;
			t0 = t_now();
			pthread_t th[8];
			struct job jobs[8];
			int n = threads[t];
			for (int k = 0; k < n; k++) {
				jobs[k] = (struct job){ d, ctx, h, NSEG * k / n, NSEG * (k + 1) / n };
				pthread_create(&th[k], NULL, release_range, &jobs[k]);
			}
			for (int k = 0; k < n; k++)
				pthread_join(th[k], NULL);
			double rel_s = t_now() - t0;
			printf("  fig release_threads_%d  map %.2f ms, unmap %.2f ms, release %.2f ms, total %.2f ms\n",
			    n, map_s * 1e3, unmap_s * 1e3, rel_s * 1e3, (unmap_s + rel_s) * 1e3);
		}
	}
	d->MemAddressFree(base, NSEG * SEG);
	d->DevicePrimaryCtxRelease(dev);
}

T_MAIN(T_CASE_TIMEOUT(t_release_threads, 120))
