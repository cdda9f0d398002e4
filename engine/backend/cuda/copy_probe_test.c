/*
 * copy_probe_test.c: where host-to-device copy bandwidth goes. Prints
 * figures (not asserted; the benchmark owns the ratios) for 4 GiB copied
 * from pinned memory (cuMemHostAlloc) or from a registered /dev/shm mapping
 * (how the arena is read) into cuMemAlloc memory or VMM segments (how the
 * cache is mapped), in pieces of 1.5 MiB (an expert), 64 MiB, 256 MiB (a
 * segment) and 4 GiB, on 1, 2 or 4 streams. Best of 3 runs each. Skips
 * without a GPU.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/backend/cuda/cuda_fixture.h"
#include "tests/t.h"

#define TOTAL (4ull << 30)
#define SEG (256ull << 20)
#define NSEG (TOTAL / SEG)

static const struct cuda_driver *d;

static double run(CUdeviceptr dst, const char *src, uint64_t piece, CUstream *st, int nst)
{
	double best = 0;
	for (int rep = 0; rep < 3; rep++) {
		double t0 = t_now();
		uint64_t k = 0;
		for (uint64_t off = 0; off < TOTAL; off += piece, k++) {
			uint64_t n = TOTAL - off < piece ? TOTAL - off : piece;
			if (d->MemcpyHtoDAsync(dst + off, src + off, n, st[k % (uint64_t)nst]) != CUDA_SUCCESS)
				return -1;
		}
		for (int i = 0; i < nst; i++)
			d->StreamSynchronize(st[i]);
		double gbs = (double)TOTAL / (t_now() - t0) / 1e9;
		if (gbs > best)
			best = gbs;
	}
	return best;
}

static void t_copy_shapes(void)
{
	CUdevice dev;
	(void)cuda_fixture_driver(&d, &dev); /* device 0 current */

	void *pinned;
	T_ASSERT(d->MemHostAlloc(&pinned, TOTAL, 0) == CUDA_SUCCESS);
	memset(pinned, 1, TOTAL);
	char path[] = "/dev/shm/baton-copy-probe-XXXXXX";
	int fd = mkstemp(path);
	T_ASSERT(fd >= 0);
	unlink(path);
	T_ASSERT(ftruncate(fd, (off_t)TOTAL) == 0);
	char *shm = mmap(NULL, TOTAL, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	T_ASSERT(shm != MAP_FAILED);
	close(fd);
	memset(shm, 2, TOTAL);
	T_ASSERT(d->MemHostRegister(shm, TOTAL, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_READ_ONLY) ==
	    CUDA_SUCCESS);

	CUdeviceptr plain;
	T_ASSERT(d->MemAlloc(&plain, TOTAL) == CUDA_SUCCESS);
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	cuda_fixture_vmm_prop(dev, &prop, &acc);
	CUdeviceptr vmm;
	CUmemGenericAllocationHandle h[NSEG];
	T_ASSERT(d->MemAddressReserve(&vmm, TOTAL, 0, 0, 0) == CUDA_SUCCESS);
	for (uint64_t i = 0; i < NSEG; i++) {
		T_ASSERT(d->MemCreate(&h[i], SEG, &prop, 0) == CUDA_SUCCESS);
		T_ASSERT(d->MemMap(vmm + i * SEG, SEG, 0, h[i], 0) == CUDA_SUCCESS);
	}
	T_ASSERT(d->MemSetAccess(vmm, TOTAL, &acc, 1) == CUDA_SUCCESS);
	CUstream st[4];
	for (int i = 0; i < 4; i++)
		T_ASSERT(d->StreamCreate(&st[i], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);

	const struct {
		const char *name;
		const char *src;
	} srcs[] = { { "pinned", pinned }, { "shm", shm } };
	const struct {
		const char *name;
		CUdeviceptr dst;
	} dsts[] = { { "alloc", plain }, { "vmm", vmm } };
	const uint64_t pieces[] = { 3ull << 19, 64ull << 20, SEG, TOTAL };
	const int streams[] = { 1, 2, 4 };
	const char *mx = getenv("BATON_PROBE_MATRIX");
	for (size_t s = 0; s < 2 && !(mx && *mx == '0'); s++)
		for (size_t t = 0; t < 2; t++)
			for (size_t p = 0; p < sizeof pieces / sizeof pieces[0]; p++)
				for (size_t n = 0; n < 3; n++) {
					if (pieces[p] == TOTAL && streams[n] > 1)
						continue;
					double gbs = run(dsts[t].dst, srcs[s].src, pieces[p], st, streams[n]);
					printf("  fig copy %-6s -> %-5s piece %8.1f MiB streams %d: %6.2f GB/s\n",
					    srcs[s].name, dsts[t].name, (double)pieces[p] / (1 << 20), streams[n], gbs);
					fflush(stdout);
				}

	/* A refill maps segment k+1 while segment k's copy runs: does mapping
	 * slow a copy in flight? Interleaved against all mapped first. */
	d->MemUnmap(vmm, TOTAL);
	for (uint64_t i = 0; i < NSEG; i++)
		d->MemRelease(h[i]);
	typedef CUresult (*memset_fn)(CUdeviceptr, unsigned int, size_t, CUstream);
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	memset_fn memset32 = lib ? (memset_fn)dlsym(lib, "cuMemsetD32Async") : NULL;
	static const char *const modes[] = { "map k+1 while copying k", "map all, then copy",
		"map, memset, copy", "map, memset, sync; copy", "map, touch pages by CE; copy",
		"map, copy, copy again", "map, one access call, copy",
		"map; touch k+1 on s1 while copy k on s0" };
	typedef CUresult (*wait_fn)(CUstream, CUevent, unsigned int);
	wait_fn wait_event = lib ? (wait_fn)dlsym(lib, "cuStreamWaitEvent") : NULL;
	CUevent ev[NSEG];
	for (uint64_t i = 0; i < NSEG; i++)
		T_ASSERT(d->EventCreate(&ev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
	for (int mode = 0; mode < 8; mode++) {
		if (mode == 7 && !wait_event)
			break;
		if (mode >= 2 && !memset32)
			break;
		double best = 0, best_map = 0;
		for (int rep = 0; rep < 3; rep++) {
			double t0 = t_now(), map_s = 0;
			for (uint64_t i = 0; i < NSEG; i++) {
				double m0 = t_now();
				T_ASSERT(d->MemCreate(&h[i], SEG, &prop, 0) == CUDA_SUCCESS);
				T_ASSERT(d->MemMap(vmm + i * SEG, SEG, 0, h[i], 0) == CUDA_SUCCESS);
				if (mode != 6)
					T_ASSERT(d->MemSetAccess(vmm + i * SEG, SEG, &acc, 1) == CUDA_SUCCESS);
				map_s += t_now() - m0;
				if (mode == 0)
					T_ASSERT(d->MemcpyHtoDAsync(vmm + i * SEG, shm + i * SEG, SEG, st[0]) == CUDA_SUCCESS);
			}
			if (mode == 6)
				T_ASSERT(d->MemSetAccess(vmm, TOTAL, &acc, 1) == CUDA_SUCCESS);
			if (mode == 2 || mode == 3)
				T_ASSERT(memset32(vmm, 0, TOTAL / 4, st[0]) == CUDA_SUCCESS);
			if (mode == 4) {
				for (uint64_t off = 0; off < TOTAL; off += 2ull << 20)
					T_ASSERT(d->MemcpyHtoDAsync(vmm + off, shm + off, 256, st[0]) == CUDA_SUCCESS);
				d->StreamSynchronize(st[0]);
				printf("  fig refill-shape touch by CE %.2f ms\n", (t_now() - t0) * 1e3);
				t0 = t_now();
			}
			if (mode == 5) {
				for (uint64_t i = 0; i < NSEG; i++)
					T_ASSERT(d->MemcpyHtoDAsync(vmm + i * SEG, shm + i * SEG, SEG, st[0]) == CUDA_SUCCESS);
				d->StreamSynchronize(st[0]);
				printf("  fig refill-shape first copy %.2f GB/s\n", (double)TOTAL / (t_now() - t0) / 1e9);
				t0 = t_now();
			}
			double t_set = t_now();
			if (mode >= 3) {
				d->StreamSynchronize(st[0]);
				t_set = t_now() - t_set;
				t0 = t_now();
			} else {
				t_set = 0;
			}
			for (uint64_t i = 0; mode == 7 && i < NSEG; i++) {
				for (uint64_t off = i * SEG; off < (i + 1) * SEG; off += 2ull << 20)
					T_ASSERT(d->MemcpyHtoDAsync(vmm + off, shm + off, 256, st[1]) == CUDA_SUCCESS);
				T_ASSERT(d->EventRecord(ev[i], st[1]) == CUDA_SUCCESS);
			}
			for (uint64_t i = 0; mode >= 1 && i < NSEG; i++) {
				if (mode == 7)
					T_ASSERT(wait_event(st[0], ev[i], 0) == CUDA_SUCCESS);
				T_ASSERT(d->MemcpyHtoDAsync(vmm + i * SEG, shm + i * SEG, SEG, st[0]) == CUDA_SUCCESS);
			}
			d->StreamSynchronize(st[0]);
			double gbs = (double)TOTAL / (t_now() - t0) / 1e9;
			if (mode == 3)
				printf("  fig refill-shape memset alone %.2f ms\n", t_set * 1e3);
			(void)t_set;
			if (gbs > best) {
				best = gbs;
				best_map = map_s;
			}
			d->MemUnmap(vmm, TOTAL);
			for (uint64_t i = 0; i < NSEG; i++)
				d->MemRelease(h[i]);
		}
		printf("  fig refill-shape %-24s: %6.2f GB/s (map calls %.2f ms)\n", modes[mode], best,
		    best_map * 1e3);
	}

	/* Fresh memory by copy size: all segments mapped first, then the 4 GiB
	 * in pieces of 64 MiB .. 4 GiB. */
	const uint64_t fresh_pieces[] = { 64ull << 20, SEG, 1ull << 30, TOTAL, SEG };
	for (size_t p = 0; p < sizeof fresh_pieces / sizeof fresh_pieces[0]; p++) {
		double best = 0;
		for (int rep = 0; rep < 3; rep++) {
			/* the last: 300 ms after the release before (does the driver
			 * still work on released memory when new copies start?) */
			if (p == sizeof fresh_pieces / sizeof fresh_pieces[0] - 1)
				usleep(300000);
			for (uint64_t i = 0; i < NSEG; i++) {
				T_ASSERT(d->MemCreate(&h[i], SEG, &prop, 0) == CUDA_SUCCESS);
				T_ASSERT(d->MemMap(vmm + i * SEG, SEG, 0, h[i], 0) == CUDA_SUCCESS);
				T_ASSERT(d->MemSetAccess(vmm + i * SEG, SEG, &acc, 1) == CUDA_SUCCESS);
			}
			double t0 = t_now();
			for (uint64_t off = 0; off < TOTAL; off += fresh_pieces[p])
				T_ASSERT(d->MemcpyHtoDAsync(vmm + off, shm + off, fresh_pieces[p], st[0]) == CUDA_SUCCESS);
			d->StreamSynchronize(st[0]);
			double gbs = (double)TOTAL / (t_now() - t0) / 1e9;
			if (gbs > best)
				best = gbs;
			d->MemUnmap(vmm, TOTAL);
			for (uint64_t i = 0; i < NSEG; i++)
				d->MemRelease(h[i]);
		}
		printf("  fig fresh memory, pieces of %6.0f MiB%s: %6.2f GB/s\n", (double)fresh_pieces[p] / (1 << 20),
		    p == sizeof fresh_pieces / sizeof fresh_pieces[0] - 1 ? ", 300 ms after the last release" : "",
		    best);
	}

	for (uint64_t i = 0; i < NSEG; i++)
		d->EventDestroy(ev[i]);
	for (int i = 0; i < 4; i++)
		d->StreamDestroy(st[i]);
	d->MemAddressFree(vmm, TOTAL);
	d->MemFree(plain);
	d->MemHostUnregister(shm);
	munmap(shm, TOTAL);
	d->MemFreeHost(pinned);
	d->DevicePrimaryCtxRelease(dev);
}

T_MAIN(T_CASE_TIMEOUT(t_copy_shapes, 300))
