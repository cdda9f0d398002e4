/*
 * backend_cuda.c: the `cuda` backend of engine/backend.h, on the CUDA
 * driver API loaded at run time (cuda_driver.h); no libcudart.
 *
 * - Context: the device's primary context, retained at open and released
 *   at close; every entry point makes it current first (a cheap TLS write
 *   in the driver), so any thread may call in.
 * - One stream per context (CU_STREAM_NON_BLOCKING): copies and kernels
 *   queue there in order, so a later copy into a cache slot never overtakes
 *   a kernel still reading that slot. sync() waits for it.
 * - Expert cache memory: the VMM API. reserve = cuMemAddressReserve;
 *   map = cuMemCreate (pinned, on the device) + cuMemMap + cuMemSetAccess;
 *   unmap = cuMemUnmap + cuMemRelease, which gives the memory back at once.
 *   A small table keeps addr -> allocation handle.
 * - Host arena: cuMemHostRegister (portable, read-only when the device
 *   supports it: the arena is a read-only MAP_SHARED mapping) in pieces of
 *   at most 4 GiB.
 * - MoE: kernels of moe_cuda.cu from the embedded fatbin. route() is
 *   synchronous (ids go back to the host, top-k and softmax run there, on
 *   batch * n_experts logits); experts() queues its kernels and returns.
 *
 * Every table and scratch buffer lives in struct baton_dev; close() frees
 * what the caller left (segments, reservations, buffers, registrations).
 *
 * Seen on an H200 (driver 580, engine/cuda_test.c): granularity 2 MiB;
 * cuMemCreate+cuMemMap of 8 GiB 0.5 ms, unmap+release 7 ms; 139 GiB mapped
 * in 8 GiB segments in 10 ms; pinned copies 53 GB/s (one 1 GiB copy or 4 MiB
 * pieces alike), pageable 5-7 GB/s; a Qwen3-30B-A3B-shaped bf16 layer
 * (d_model 2048, d_ff 768, 128 experts, top 8): experts 33 us at batch 1
 * (2.3 TB/s of weights), 307 us at batch 16 (3.9 TB/s); route 17 us.
 */
#include "engine/backend_cuda.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/cuda_driver.h"

extern const unsigned char baton_engine_moe_cuda_fatbin[];
extern const size_t baton_engine_moe_cuda_fatbin_len;

#define REGISTER_PIECE_DEFAULT (4ull << 30)
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

/* ---- small helpers -------------------------------------------------------- */

static int tab_push(struct tab *t, uint64_t addr, uint64_t bytes, uint64_t handle)
{
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct ent *v = realloc(t->v, cap * sizeof *v);
		if (!v)
			return BATON_ENOMEM;
		t->v = v;
		t->cap = cap;
	}
	t->v[t->n++] = (struct ent){ addr, bytes, handle };
	return 0;
}

static struct ent *tab_find(struct tab *t, uint64_t addr)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].addr == addr)
			return &t->v[i];
	return NULL;
}

static void tab_remove(struct tab *t, struct ent *e)
{
	*e = t->v[--t->n];
}

static void tab_free(struct tab *t)
{
	free(t->v);
	t->v = NULL;
	t->n = t->cap = 0;
}

static void set_err(struct baton_dev *dev, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_err(struct baton_dev *dev, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(dev->err, sizeof dev->err, fmt, ap);
	va_end(ap);
}

/* Records a failed driver call and maps it to a Baton code. */
static int cu_fail(struct baton_dev *dev, CUresult r, const char *what)
{
	char s[160];
	cuda_driver_errstr(dev->d, r, s, sizeof s);
	set_err(dev, "%s: %s", what, s);
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

#define CU(dev, call, what)                                                    \
	do {                                                                   \
		CUresult cu_r_ = (call);                                       \
		if (cu_r_ != CUDA_SUCCESS)                                     \
			return cu_fail((dev), cu_r_, (what));                  \
	} while (0)

static int cur(struct baton_dev *dev)
{
	CU(dev, dev->d->CtxSetCurrent(dev->ctx), "cuCtxSetCurrent");
	return 0;
}

static int stream_sync(struct baton_dev *dev)
{
	CU(dev, dev->d->StreamSynchronize(dev->stream), "cuStreamSynchronize");
	dev->stage_busy = 0;
	return 0;
}

static void errput(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void errput(char *errbuf, size_t errlen, const char *fmt, ...)
{
	if (!errbuf || !errlen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
}

/* ---- probe, open, close --------------------------------------------------- */

int cuda_backend_probe(char *errbuf, size_t len)
{
	const struct cuda_driver *d;
	int rc = cuda_driver_load(&d, errbuf, len);
	if (rc)
		return rc;
	int n = 0;
	CUresult r = d->DeviceGetCount(&n);
	if (r != CUDA_SUCCESS) {
		char s[160];
		cuda_driver_errstr(d, r, s, sizeof s);
		errput(errbuf, len, "cuDeviceGetCount failed: %s", s);
		return BATON_ENODEV;
	}
	if (n < 1) {
		errput(errbuf, len, "no CUDA device");
		return BATON_ENODEV;
	}
	return 0;
}

static void cuda_close(struct baton_dev *dev);

static const char *const k_variant_names[N_VARIANTS] = { "1", "2", "4", "8" };

static int load_kernels(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->ModuleLoadData(&dev->mod, baton_engine_moe_cuda_fatbin),
	    "cuModuleLoadData of the MoE kernels (sm_90 SASS, compute_90 PTX)");
	CU(dev, d->ModuleGetFunction(&dev->k_norm, dev->mod, "baton_moe_rmsnorm"),
	    "cuModuleGetFunction baton_moe_rmsnorm");
	CU(dev, d->ModuleGetFunction(&dev->k_reduce, dev->mod, "baton_moe_reduce"),
	    "cuModuleGetFunction baton_moe_reduce");
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
	void *pn[] = { &na }, *pg[] = { &ga }, *pf[] = { &fa }, *pr[] = { &ra };
	CU(dev, d->LaunchKernel(dev->k_norm, 1, 1, 1, 256, 1, 1, 0, dev->stream, pn, NULL),
	    "first launch of baton_moe_rmsnorm");
	CU(dev, d->LaunchKernel(dev->k_reduce, 1, 1, 1, 256, 1, 1, 0, dev->stream, pr, NULL),
	    "first launch of baton_moe_reduce");
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

static int cuda_open(int index, uint64_t capacity_bytes, struct baton_dev **out,
    char *errbuf, size_t errlen)
{
	(void)capacity_bytes; /* the device's size is what it is */
	*out = NULL;
	const struct cuda_driver *d;
	int rc = cuda_driver_load(&d, errbuf, errlen);
	if (rc)
		return rc;
	int n = 0;
	if (d->DeviceGetCount(&n) != CUDA_SUCCESS || n < 1) {
		errput(errbuf, errlen, "no CUDA device");
		return BATON_ENODEV;
	}
	if (index < 0 || index >= n) {
		errput(errbuf, errlen, "no CUDA device %d (this machine has %d)", index, n);
		return BATON_ENODEV;
	}
	struct baton_dev *dev = calloc(1, sizeof *dev);
	if (!dev) {
		errput(errbuf, errlen, "out of host memory");
		return BATON_ENOMEM;
	}
	dev->d = d;
	dev->index = index;
	dev->register_piece = REGISTER_PIECE_DEFAULT;

	int vmm = 0;
	CUresult r = d->DeviceGet(&dev->cudev, index);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuDeviceGet");
		goto fail;
	}
	if (d->DeviceGetName(dev->name, (int)sizeof dev->name, dev->cudev) != CUDA_SUCCESS)
		snprintf(dev->name, sizeof dev->name, "CUDA device %d", index);
	r = d->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	    dev->cudev);
	if (r != CUDA_SUCCESS || !vmm) {
		set_err(dev, "%s (device %d) does not support the virtual memory management API",
		    dev->name, index);
		rc = BATON_EUNSUPPORTED;
		goto fail;
	}
	if (d->DeviceGetAttribute(&dev->ro_register,
	        CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, dev->cudev) != CUDA_SUCCESS)
		dev->ro_register = 0;

	r = d->DevicePrimaryCtxRetain(&dev->ctx, dev->cudev);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuDevicePrimaryCtxRetain");
		dev->ctx = NULL;
		goto fail;
	}
	if ((rc = cur(dev)))
		goto fail;

	dev->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	dev->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	dev->prop.location.id = dev->cudev;
	size_t g = 0, gmin = 0;
	r = d->MemGetAllocationGranularity(&gmin, &dev->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || gmin == 0) {
		rc = r != CUDA_SUCCESS ? cu_fail(dev, r, "cuMemGetAllocationGranularity") : BATON_EDRIVER;
		goto fail;
	}
	if (d->MemGetAllocationGranularity(&g, &dev->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
	        CUDA_SUCCESS || g < gmin || g % gmin != 0)
		g = gmin;
	dev->gran = g;
	dev->gran_min = gmin;

	r = d->StreamCreate(&dev->stream, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuStreamCreate");
		dev->stream = NULL;
		goto fail;
	}
	r = d->EventCreate(&dev->staged, CU_EVENT_DISABLE_TIMING);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuEventCreate");
		dev->staged = NULL;
		goto fail;
	}
	if ((rc = load_kernels(dev)) || (rc = warm_kernels(dev)))
		goto fail;
	*out = dev;
	return 0;

fail:
	errput(errbuf, errlen, "cuda device %d: %s", index, dev->err[0] ? dev->err : baton_strerror(rc));
	cuda_close(dev);
	return rc;
}

static void dbuf_free(struct baton_dev *dev, struct dbuf *b)
{
	if (b->p)
		dev->d->MemFree(b->p);
	b->p = 0;
	b->cap = 0;
}

static void unregister_pieces(struct baton_dev *dev, const struct ent *e)
{
	for (uint64_t off = 0; off < e->bytes; off += e->handle)
		dev->d->MemHostUnregister((void *)(uintptr_t)(e->addr + off));
}

static void cuda_close(struct baton_dev *dev)
{
	if (!dev)
		return;
	const struct cuda_driver *d = dev->d;
	if (dev->ctx) {
		d->CtxSetCurrent(dev->ctx);
		if (dev->stream)
			d->StreamSynchronize(dev->stream);
		for (size_t i = 0; i < dev->segs.n; i++) {
			d->MemUnmap(dev->segs.v[i].addr, dev->segs.v[i].bytes);
			d->MemRelease(dev->segs.v[i].handle);
		}
		for (size_t i = 0; i < dev->psegs.n; i++) {
			d->MemUnmap(dev->psegs.v[i].addr, dev->psegs.v[i].bytes);
			d->MemRelease(dev->psegs.v[i].handle);
		}
		for (size_t i = 0; i < dev->ress.n; i++)
			d->MemAddressFree(dev->ress.v[i].addr, dev->ress.v[i].bytes);
		for (size_t i = 0; i < dev->allocs.n; i++)
			d->MemFree(dev->allocs.v[i].addr);
		for (size_t i = 0; i < dev->hregs.n; i++)
			unregister_pieces(dev, &dev->hregs.v[i]);
		if (dev->lg_host)
			d->MemFreeHost(dev->lg_host);
		dbuf_free(dev, &dev->desc);
		dbuf_free(dev, &dev->h);
		dbuf_free(dev, &dev->part);
		if (dev->stage)
			d->MemFreeHost(dev->stage);
		if (dev->mod)
			d->ModuleUnload(dev->mod);
		if (dev->staged)
			d->EventDestroy(dev->staged);
		if (dev->stream)
			d->StreamDestroy(dev->stream);
		d->DevicePrimaryCtxRelease(dev->cudev);
		d->CtxSetCurrent(NULL);
	}
	tab_free(&dev->segs);
	tab_free(&dev->psegs);
	tab_free(&dev->ress);
	tab_free(&dev->allocs);
	tab_free(&dev->hregs);
	free(dev->sort);
	free(dev);
}

const char *cuda_backend_last_error(struct baton_dev *dev)
{
	return dev ? dev->err : "";
}

void cuda_backend_describe(struct baton_dev *dev, char *buf, size_t len)
{
	int v = dev->d->version;
	snprintf(buf, len,
	    "%s (device %d), driver API %d.%d, VMM granularity %llu KiB (minimum %llu KiB), "
	    "read-only host registration %s",
	    dev->name, dev->index, v / 1000, (v % 1000) / 10,
	    (unsigned long long)(dev->gran >> 10), (unsigned long long)(dev->gran_min >> 10),
	    dev->ro_register ? "supported" : "not supported");
}

void cuda_backend_set_register_piece(struct baton_dev *dev, uint64_t bytes)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	bytes -= bytes % page;
	dev->register_piece = bytes ? bytes : REGISTER_PIECE_DEFAULT;
}

/* ---- device info ---------------------------------------------------------- */

static int cuda_mem_info(struct baton_dev *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	int rc = cur(dev);
	if (rc)
		return rc;
	size_t f = 0, t = 0;
	CU(dev, dev->d->MemGetInfo(&f, &t), "cuMemGetInfo");
	if (free_bytes)
		*free_bytes = f;
	if (total_bytes)
		*total_bytes = t;
	return 0;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi and NVML print it. */
static int cuda_uuid(struct baton_dev *dev, char *buf, size_t len)
{
	CUuuid u;
	CU(dev, dev->d->DeviceGetUuid(&u, dev->cudev), "cuDeviceGetUuid");
	const unsigned char *b = (const unsigned char *)u.bytes;
	char s[48];
	snprintf(s, sizeof s,
	    "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
	    b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
	    b[13], b[14], b[15]);
	if (!buf || len <= strlen(s))
		return BATON_EINVAL;
	memcpy(buf, s, strlen(s) + 1);
	return 0;
}

static uint64_t cuda_granularity(struct baton_dev *dev)
{
	return dev->gran;
}

/* ---- VMM: reservations and segments ------------------------------------- */

static uint64_t round_up(uint64_t v, uint64_t g)
{
	return (v + g - 1) / g * g;
}

static int cuda_reserve(struct baton_dev *dev, uint64_t bytes, baton_dptr *base)
{
	if (!bytes || !base || bytes > UINT64_MAX / 2)
		return BATON_EINVAL;
	int rc = cur(dev);
	if (rc)
		return rc;
	uint64_t sz = round_up(bytes, dev->gran);
	CUdeviceptr p = 0;
	CU(dev, dev->d->MemAddressReserve(&p, sz, dev->gran, 0, 0), "cuMemAddressReserve");
	if ((rc = tab_push(&dev->ress, p, sz, 0))) {
		dev->d->MemAddressFree(p, sz);
		return rc;
	}
	*base = p;
	return 0;
}

static int cuda_unreserve(struct baton_dev *dev, baton_dptr base, uint64_t bytes)
{
	struct ent *e = tab_find(&dev->ress, base);
	if (!e || round_up(bytes, dev->gran) != e->bytes) {
		set_err(dev, "unreserve: no reservation of %llu bytes at 0x%llx",
		    (unsigned long long)bytes, (unsigned long long)base);
		return BATON_EINVAL;
	}
	for (int t = 0; t < 2; t++) {
		const struct tab *sg = t ? &dev->psegs : &dev->segs;
		for (size_t i = 0; i < sg->n; i++)
			if (sg->v[i].addr >= e->addr && sg->v[i].addr < e->addr + e->bytes) {
				set_err(dev, "unreserve: segment at 0x%llx is still mapped",
				    (unsigned long long)sg->v[i].addr);
				return BATON_ESTATE;
			}
	}
	int rc = cur(dev);
	if (rc)
		return rc;
	CU(dev, dev->d->MemAddressFree(e->addr, e->bytes), "cuMemAddressFree");
	tab_remove(&dev->ress, e);
	return 0;
}

/* 1 when [addr, addr+bytes) lies in a reservation and overlaps no segment
 * (own or peer). */
static int range_free(const struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	int inside = 0;
	for (size_t i = 0; i < dev->ress.n; i++) {
		const struct ent *e = &dev->ress.v[i];
		if (addr >= e->addr && addr - e->addr <= e->bytes && bytes <= e->addr + e->bytes - addr)
			inside = 1;
	}
	for (int t = 0; t < 2; t++) {
		const struct tab *sg = t ? &dev->psegs : &dev->segs;
		for (size_t i = 0; i < sg->n; i++) {
			const struct ent *e = &sg->v[i];
			if (addr < e->addr + e->bytes && e->addr < addr + bytes)
				inside = 0;
		}
	}
	return inside;
}

static int cuda_map(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	if (!bytes || addr % dev->gran || bytes % dev->gran) {
		set_err(dev, "map: 0x%llx + %llu is not a multiple of the granularity %llu",
		    (unsigned long long)addr, (unsigned long long)bytes,
		    (unsigned long long)dev->gran);
		return BATON_EINVAL;
	}
	if (!range_free(dev, addr, bytes)) {
		set_err(dev, "map: 0x%llx + %llu is outside every reservation or overlaps a segment",
		    (unsigned long long)addr, (unsigned long long)bytes);
		return BATON_EINVAL;
	}
	int rc = cur(dev);
	if (rc)
		return rc;
	if ((rc = tab_push(&dev->segs, 0, 0, 0))) /* room first: nothing to undo later */
		return rc;
	dev->segs.n--;

	const struct cuda_driver *d = dev->d;
	char what[96];
	CUmemGenericAllocationHandle h = 0;
	CUresult r = d->MemCreate(&h, bytes, &dev->prop, 0);
	if (r != CUDA_SUCCESS) {
		snprintf(what, sizeof what, "cuMemCreate of %llu bytes", (unsigned long long)bytes);
		rc = cu_fail(dev, r, what);
		size_t f = 0, t = 0;
		if (rc != BATON_EDEVMEM && d->MemGetInfo(&f, &t) == CUDA_SUCCESS && bytes > f)
			rc = BATON_EDEVMEM; /* whatever the driver calls it: it does not fit */
		return rc;
	}
	r = d->MemMap(addr, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuMemMap");
		d->MemRelease(h);
		return rc;
	}
	CUmemAccessDesc acc;
	memset(&acc, 0, sizeof acc);
	acc.location = dev->prop.location;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = d->MemSetAccess(addr, bytes, &acc, 1);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuMemSetAccess");
		d->MemUnmap(addr, bytes);
		d->MemRelease(h);
		return rc;
	}
	tab_push(&dev->segs, addr, bytes, (uint64_t)h); /* cannot fail: room made above */
	return 0;
}

static int cuda_unmap(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	struct ent *e = tab_find(&dev->segs, addr);
	if (!e || e->bytes != bytes) {
		set_err(dev, "unmap: no segment of %llu bytes at 0x%llx",
		    (unsigned long long)bytes, (unsigned long long)addr);
		return BATON_EINVAL;
	}
	int rc = cur(dev);
	if (!rc)
		rc = stream_sync(dev); /* no queued kernel or copy may still touch it */
	if (rc)
		return rc;
	CU(dev, dev->d->MemUnmap(e->addr, e->bytes), "cuMemUnmap");
	CUresult r = dev->d->MemRelease((CUmemGenericAllocationHandle)e->handle);
	tab_remove(&dev->segs, e);
	if (r != CUDA_SUCCESS)
		return cu_fail(dev, r, "cuMemRelease");
	return 0;
}

/* ---- peer tier ------------------------------------------------------------ */

/* VMM memory of another GPU mapped into this context's range: cuMemCreate
 * with the peer's ordinal as location, cuMemMap here, cuMemSetAccess for
 * both devices. Kernels of `dev` then read it over NVLink or PCIe; no
 * cuCtxEnablePeerAccess is involved (that is for cuMemAlloc memory). */
static int cuda_peer_access(struct baton_dev *dev, struct baton_dev *peer)
{
	if (!dev || !peer)
		return BATON_EINVAL;
	if (peer == dev || peer->cudev == dev->cudev) {
		set_err(dev, "peer: device %d is this engine's own device", peer->index);
		return BATON_EINVAL;
	}
	int can = 0;
	CU(dev, dev->d->DeviceCanAccessPeer(&can, dev->cudev, peer->cudev), "cuDeviceCanAccessPeer");
	if (!can) {
		set_err(dev, "peer: %s (device %d) cannot access the memory of %s (device %d): "
		    "no peer access between them (cuDeviceCanAccessPeer)",
		    dev->name, dev->index, peer->name, peer->index);
		return BATON_EUNSUPPORTED;
	}
	return 0;
}

static int cuda_map_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	int rc = cuda_peer_access(dev, peer);
	if (rc)
		return rc;
	if (!bytes || addr % dev->gran || bytes % dev->gran || addr % peer->gran ||
	    bytes % peer->gran) {
		set_err(dev, "map_peer: 0x%llx + %llu is not a multiple of the granularity",
		    (unsigned long long)addr, (unsigned long long)bytes);
		return BATON_EINVAL;
	}
	if (!range_free(dev, addr, bytes)) {
		set_err(dev, "map_peer: 0x%llx + %llu is outside every reservation or overlaps a segment",
		    (unsigned long long)addr, (unsigned long long)bytes);
		return BATON_EINVAL;
	}
	if ((rc = cur(dev)))
		return rc;
	if ((rc = tab_push(&dev->psegs, 0, 0, 0))) /* room first: nothing to undo later */
		return rc;
	dev->psegs.n--;

	const struct cuda_driver *d = dev->d;
	CUmemAllocationProp prop = dev->prop;
	prop.location.id = peer->cudev; /* the memory lives on the peer */
	CUmemGenericAllocationHandle h = 0;
	CUresult r = d->MemCreate(&h, bytes, &prop, 0);
	if (r != CUDA_SUCCESS) {
		char what[96];
		snprintf(what, sizeof what, "cuMemCreate of %llu bytes on peer device %d",
		    (unsigned long long)bytes, peer->index);
		rc = cu_fail(dev, r, what);
		uint64_t f = 0;
		if (rc != BATON_EDEVMEM && cuda_mem_info(peer, &f, NULL) == 0 && bytes > f)
			rc = BATON_EDEVMEM;
		cur(dev);
		return rc;
	}
	r = d->MemMap(addr, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuMemMap (peer)");
		d->MemRelease(h);
		return rc;
	}
	CUmemAccessDesc acc[2];
	memset(acc, 0, sizeof acc);
	acc[0].location = dev->prop.location;
	acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	acc[1].location = prop.location;
	acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = d->MemSetAccess(addr, bytes, acc, 2);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(dev, r, "cuMemSetAccess (peer)");
		d->MemUnmap(addr, bytes);
		d->MemRelease(h);
		return rc;
	}
	tab_push(&dev->psegs, addr, bytes, (uint64_t)h); /* cannot fail: room made above */
	return 0;
}

static int cuda_unmap_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	(void)peer; /* the handle knows where its memory lives */
	struct ent *e = tab_find(&dev->psegs, addr);
	if (!e || e->bytes != bytes) {
		set_err(dev, "unmap_peer: no peer segment of %llu bytes at 0x%llx",
		    (unsigned long long)bytes, (unsigned long long)addr);
		return BATON_EINVAL;
	}
	int rc = cur(dev);
	if (!rc)
		rc = stream_sync(dev); /* no queued kernel or copy may still read it */
	if (rc)
		return rc;
	CU(dev, dev->d->MemUnmap(e->addr, e->bytes), "cuMemUnmap (peer)");
	CUresult r = dev->d->MemRelease((CUmemGenericAllocationHandle)e->handle);
	tab_remove(&dev->psegs, e);
	if (r != CUDA_SUCCESS)
		return cu_fail(dev, r, "cuMemRelease (peer)");
	return 0;
}

/* ---- plain buffers ---------------------------------------------------------- */

static int cuda_alloc(struct baton_dev *dev, uint64_t bytes, baton_dptr *out)
{
	if (!bytes || !out)
		return BATON_EINVAL;
	int rc = cur(dev);
	if (rc)
		return rc;
	CUdeviceptr p = 0;
	CU(dev, dev->d->MemAlloc(&p, bytes), "cuMemAlloc");
	if ((rc = tab_push(&dev->allocs, p, bytes, 0))) {
		dev->d->MemFree(p);
		return rc;
	}
	*out = p;
	return 0;
}

static void cuda_free(struct baton_dev *dev, baton_dptr p)
{
	if (!dev || !p)
		return;
	struct ent *e = tab_find(&dev->allocs, p);
	if (!e)
		return;
	if (cur(dev) == 0) {
		stream_sync(dev);
		dev->d->MemFree(p);
	}
	tab_remove(&dev->allocs, e);
}

/* ---- host memory, copies ---------------------------------------------------- */

static int cuda_host_register(struct baton_dev *dev, const void *p, uint64_t bytes)
{
	if (!p || !bytes)
		return BATON_EINVAL;
	if (tab_find(&dev->hregs, (uint64_t)(uintptr_t)p))
		return BATON_EEXIST;
	int rc = cur(dev);
	if (rc)
		return rc;
	if ((rc = tab_push(&dev->hregs, 0, 0, 0)))
		return rc;
	dev->hregs.n--;
	unsigned flags = CU_MEMHOSTREGISTER_PORTABLE;
	if (dev->ro_register)
		flags |= CU_MEMHOSTREGISTER_READ_ONLY;
	const uint64_t piece = dev->register_piece;
	for (uint64_t off = 0; off < bytes; off += piece) {
		uint64_t n = bytes - off < piece ? bytes - off : piece;
		CUresult r = dev->d->MemHostRegister((char *)(uintptr_t)p + off, n, flags);
		if (r != CUDA_SUCCESS) {
			char what[128];
			snprintf(what, sizeof what, "cuMemHostRegister of %llu bytes at offset %llu%s",
			    (unsigned long long)n, (unsigned long long)off,
			    (flags & CU_MEMHOSTREGISTER_READ_ONLY) ? " (read-only)" : "");
			rc = cu_fail(dev, r, what);
			if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
				rc = BATON_EEXIST;
			else if (r == CUDA_ERROR_OUT_OF_MEMORY)
				rc = BATON_ENOMEM;
			struct ent done = { (uint64_t)(uintptr_t)p, off, piece };
			unregister_pieces(dev, &done);
			return rc;
		}
	}
	tab_push(&dev->hregs, (uint64_t)(uintptr_t)p, bytes, piece);
	return 0;
}

static int cuda_host_unregister(struct baton_dev *dev, const void *p, uint64_t bytes)
{
	struct ent *e = tab_find(&dev->hregs, (uint64_t)(uintptr_t)p);
	if (!e || e->bytes != bytes)
		return BATON_ENOTFOUND;
	int rc = cur(dev);
	if (!rc)
		rc = stream_sync(dev); /* copies out of it may be queued */
	if (rc)
		return rc;
	unregister_pieces(dev, e);
	tab_remove(&dev->hregs, e);
	return 0;
}

/* How much of a copy from src (len bytes) stays inside one registered
 * piece, or inside unregistered memory: the driver refuses a copy whose
 * source is registered memory that runs past its registration
 * (CUDA_ERROR_INVALID_VALUE, seen on driver 580), so copies are cut at
 * every registration boundary. */
static uint64_t piece_len(const struct baton_dev *dev, uint64_t src, uint64_t len)
{
	for (size_t i = 0; i < dev->hregs.n; i++) {
		const struct ent *e = &dev->hregs.v[i];
		if (src >= e->addr && src - e->addr < e->bytes) {
			const uint64_t in = src - e->addr;
			uint64_t end = (in / e->handle + 1) * e->handle; /* piece end */
			if (end > e->bytes)
				end = e->bytes;
			return end - in < len ? end - in : len;
		}
		if (e->addr > src && e->addr - src < len)
			len = e->addr - src; /* stop where a registration starts */
	}
	return len;
}

static int cuda_copy_h2d(struct baton_dev *dev, const struct baton_copy *copies, size_t n)
{
	if (n && !copies)
		return BATON_EINVAL;
	int rc = cur(dev);
	if (rc)
		return rc;
	for (size_t i = 0; i < n; i++) {
		if (!copies[i].bytes)
			continue;
		if (!copies[i].dst || !copies[i].src)
			return BATON_EINVAL;
		uint64_t dst = copies[i].dst, src = (uint64_t)(uintptr_t)copies[i].src;
		uint64_t left = copies[i].bytes;
		while (left) {
			const uint64_t len = piece_len(dev, src, left);
			CU(dev, dev->d->MemcpyHtoDAsync(dst, (const void *)(uintptr_t)src, len,
			                dev->stream), "cuMemcpyHtoDAsync");
			dst += len, src += len, left -= len;
		}
	}
	return 0;
}

static int cuda_copy_d2h(struct baton_dev *dev, void *dst, baton_dptr src, uint64_t bytes)
{
	if (!bytes)
		return 0;
	if (!dst || !src)
		return BATON_EINVAL;
	int rc = cur(dev);
	if (rc)
		return rc;
	CU(dev, dev->d->MemcpyDtoHAsync(dst, src, bytes, dev->stream), "cuMemcpyDtoHAsync");
	return stream_sync(dev);
}

/* Peer <-> own slot moves: over NVLink/PCIe between the GPUs, on the
 * stream, after what is queued before. */
static int cuda_copy_d2d(struct baton_dev *dev, baton_dptr dst, baton_dptr src, uint64_t bytes)
{
	if (!bytes)
		return 0;
	if (!dst || !src)
		return BATON_EINVAL;
	int rc = cur(dev);
	if (rc)
		return rc;
	CU(dev, dev->d->MemcpyDtoDAsync(dst, src, bytes, dev->stream), "cuMemcpyDtoDAsync");
	return 0;
}

static int cuda_sync(struct baton_dev *dev)
{
	int rc = cur(dev);
	return rc ? rc : stream_sync(dev);
}

/* ---- MoE ---------------------------------------------------------------- */

static int cuda_can_compute(int dtype)
{
	return dtype == BATON_DT_F32 || dtype == BATON_DT_F16 || dtype == BATON_DT_BF16 ||
	    dtype == BATON_DT_Q8_0 || dtype == BATON_DT_Q4_K || dtype == BATON_DT_Q5_K ||
	    dtype == BATON_DT_Q6_K;
}

static uint64_t row_bytes(uint32_t dt, uint32_t cols)
{
	switch (dt) {
	case BATON_DT_F32: return 4ull * cols;
	case BATON_DT_F16:
	case BATON_DT_BF16: return 2ull * cols;
	case BATON_DT_Q8_0: return cols % 32 ? 0 : (uint64_t)(cols / 32) * 34;
	case BATON_DT_Q4_K:
	case BATON_DT_Q5_K:
	case BATON_DT_Q6_K: return baton_dtype_row_bytes((int)dt, cols); /* 0 unless cols % 256 == 0 */
	}
	return 0;
}

/* 1 when rows of (dt, cols) starting at base suit the vector loads. */
static int vec_ok(uint64_t base, uint32_t dt, uint32_t cols)
{
	if (dt == BATON_DT_Q8_0 || dt == BATON_DT_Q6_K)
		return base % 2 == 0;
	if (dt == BATON_DT_Q4_K || dt == BATON_DT_Q5_K)
		return base % 8 == 0;
	return base % 16 == 0 && row_bytes(dt, cols) % 16 == 0;
}

static int dbuf_need(struct baton_dev *dev, struct dbuf *b, uint64_t bytes)
{
	if (b->cap >= bytes)
		return 0;
	int rc = stream_sync(dev); /* the old buffer may be in use */
	if (rc)
		return rc;
	dbuf_free(dev, b);
	uint64_t cap = round_up(bytes, 1u << 20);
	CUdeviceptr p = 0;
	CU(dev, dev->d->MemAlloc(&p, cap), "cuMemAlloc (MoE scratch)");
	b->p = p;
	b->cap = cap;
	return 0;
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
	uint64_t cap = round_up(bytes, 1u << 16);
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
	uint64_t cap = round_up(bytes, 1u << 16);
	void *p = NULL;
	CU(dev, dev->d->MemHostAlloc(&p, cap, CU_MEMHOSTALLOC_DEVICEMAP),
	    "cuMemHostAlloc (router logits)");
	CUdeviceptr dp = 0;
	CUresult r = dev->d->MemHostGetDevicePointer(&dp, p, 0);
	if (r != CUDA_SUCCESS) {
		dev->d->MemFreeHost(p);
		return cu_fail(dev, r, "cuMemHostGetDevicePointer (router logits)");
	}
	dev->lg_host = p;
	dev->lg_dev = dp;
	dev->lg_cap = cap;
	return 0;
}

static int launch(struct baton_dev *dev, CUfunction f, uint32_t gx, uint32_t gy,
    uint32_t threads, void *args, const char *what)
{
	void *params[] = { args };
	CU(dev, dev->d->LaunchKernel(f, gx, gy, 1, threads, 1, 1, 0, dev->stream, params, NULL),
	    what);
	return 0;
}

static int variant_of(uint32_t nt)
{
	return nt <= 1 ? 0 : nt <= 2 ? 1 : nt <= 4 ? 2 : 3;
}

static int check_layer(struct baton_dev *dev, const struct baton_moe_layer *l)
{
	if (!l || !l->batch || !l->d_model || !l->x || !l->xn) {
		set_err(dev, "moe: empty layer, batch or missing x/xn");
		return BATON_EINVAL;
	}
	if ((uint64_t)l->batch * l->d_model > UINT32_MAX) {
		set_err(dev, "moe: batch * d_model too large");
		return BATON_ERANGE;
	}
	return 0;
}

static int check_dtype(struct baton_dev *dev, const char *what, uint32_t dt, uint32_t cols)
{
	if (!cuda_can_compute((int)dt)) {
		const char *n = baton_dtype_name((int)dt);
		set_err(dev, "moe: the cuda backend cannot compute %s weights of type %s", what,
		    n ? n : "unknown");
		return BATON_EUNSUPPORTED;
	}
	if (!row_bytes(dt, cols)) {
		const char *n = baton_dtype_name((int)dt);
		set_err(dev, "moe: %s rows of %u %s values are not whole blocks of %u", what, cols, n,
		    dt == BATON_DT_Q8_0 ? 32u : 256u);
		return BATON_EINVAL;
	}
	return 0;
}

static int cuda_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l,
    uint32_t *ids, float *weights)
{
	int rc = check_layer(dev, l);
	if (rc)
		return rc;
	if (!ids || !weights || !l->router || !l->n_experts || !l->top_k ||
	    l->top_k > l->n_experts) {
		set_err(dev, "moe_route: no router, or top_k %u not in 1..n_experts %u", l->top_k,
		    l->n_experts);
		return BATON_EINVAL;
	}
	if ((rc = check_dtype(dev, "router", l->router_dtype, l->d_model)))
		return rc;
	if (l->norm && (rc = check_dtype(dev, "norm", l->norm_dtype, l->d_model)))
		return rc;
	if ((uint64_t)l->n_experts > 65535ull * BATON_CUDA_WARPS)
		return BATON_ERANGE;
	if ((rc = cur(dev)))
		return rc;
	const uint64_t nlog = (uint64_t)l->batch * l->n_experts;
	if ((rc = logits_need(dev, nlog * 4)))
		return rc;

	struct baton_cuda_norm_args na = {
		.x = l->x, .xn = l->xn, .norm = l->norm, .norm_dtype = l->norm_dtype,
		.d_model = l->d_model, .batch = l->batch,
	};
	if ((rc = launch(dev, dev->k_norm, l->batch, 1, 32 * BATON_CUDA_WARPS, &na,
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
	if ((rc = launch(dev, dev->k_gemv[v], (l->batch + per - 1) / per,
	         (l->n_experts + rows - 1) / rows, 32 * BATON_CUDA_WARPS, &ga,
	         "cuLaunchKernel baton_moe_gemv (router)")))
		return rc;
	if ((rc = stream_sync(dev)))
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

static int cuda_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *weights)
{
	int rc = check_layer(dev, l);
	if (rc)
		return rc;
	if (!blobs || !weights || !l->top_k || !l->d_ff) {
		set_err(dev, "moe_experts: no blobs, weights, top_k or d_ff");
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
			set_err(dev, "moe_experts: blob %llu is 0", (unsigned long long)p);
			return BATON_EINVAL;
		}
	if ((rc = cur(dev)))
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
	const uint64_t off_w = round_up(off_pairs + n * 4, 16);
	const uint64_t desc_bytes = off_w + n * 4;
	if ((rc = stage_need(dev, desc_bytes)) || (rc = dbuf_need(dev, &dev->desc, desc_bytes)) ||
	    (rc = dbuf_need(dev, &dev->h, n * l->d_ff * 4)) ||
	    (rc = dbuf_need(dev, &dev->part, n * l->d_model * 4)))
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
	if ((rc = launch(dev, dev->k_gate_up[v], (uint32_t)n_chunks, (l->d_ff + grows - 1) / grows,
	         T, &fa, "cuLaunchKernel baton_moe_gate_up")) ||
	    (rc = launch(dev, dev->k_down[v], (uint32_t)n_chunks, (l->d_model + rows - 1) / rows,
	         T, &fa, "cuLaunchKernel baton_moe_down")))
		return rc;
	struct baton_cuda_reduce_args ra = {
		.x = l->x, .part = dev->part.p, .d_model = l->d_model, .top_k = l->top_k,
		.batch = l->batch,
	};
	const uint64_t total = (uint64_t)l->batch * l->d_model;
	return launch(dev, dev->k_reduce, (uint32_t)((total + 255) / 256), 1, 256, &ra,
	    "cuLaunchKernel baton_moe_reduce");
}

const struct baton_backend baton_backend_cuda = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
	.mem_info = cuda_mem_info,
	.uuid = cuda_uuid,
	.granularity = cuda_granularity,
	.reserve = cuda_reserve,
	.unreserve = cuda_unreserve,
	.map = cuda_map,
	.unmap = cuda_unmap,
	.peer_access = cuda_peer_access,
	.map_peer = cuda_map_peer,
	.unmap_peer = cuda_unmap_peer,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.copy_h2d = cuda_copy_h2d,
	.copy_d2h = cuda_copy_d2h,
	.copy_d2d = cuda_copy_d2d,
	.sync = cuda_sync,
	.moe_route = cuda_moe_route,
	.moe_experts = cuda_moe_experts,
	.can_compute = cuda_can_compute,
};
