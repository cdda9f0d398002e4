/*
 * backend.c: the `cuda` backend of engine/backend/backend.h, on the CUDA
 * driver API loaded at run time (driver.h); no libcudart.
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
 * - MoE: kernels of moe.cu from the embedded fatbin. route() is
 *   synchronous (ids go back to the host, top-k and softmax run there, on
 *   batch * n_experts logits); experts() queues its kernels and returns.
 * - The forward pass's dense ops (embed, rmsnorm, matmul, rope, attention,
 *   swiglu, add, route): kernels of ops.cu, attn_split.cu and route.cu,
 *   launched by ops_launch.c, attn_split_launch.c and route_launch.c.
 *
 * Every table and scratch buffer lives in struct baton_dev; close() frees
 * what the caller left (segments, reservations, buffers, registrations).
 *
 * Seen on an H200 (driver 580, engine/backend/cuda/cuda_test.c): granularity 2 MiB;
 * cuMemCreate+cuMemMap of 8 GiB 0.5 ms, unmap+release 7 ms; 139 GiB mapped
 * in 8 GiB segments in 10 ms; pinned copies 53 GB/s (one 1 GiB copy or 4 MiB
 * pieces alike), pageable 5-7 GB/s; a Qwen3-30B-A3B-shaped bf16 layer
 * (d_model 2048, d_ff 768, 128 experts, top 8): experts 33 us at batch 1
 * (2.3 TB/s of weights), 307 us at batch 16 (3.9 TB/s); route 17 us.
 */
#include "engine/backend/cuda/cuda_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend/cuda/driver.h"

#define REGISTER_PIECE_DEFAULT (4ull << 30)

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
		baton_errf(errbuf, len, "cuDeviceGetCount failed: %s", s);
		return BATON_ENODEV;
	}
	if (n < 1) {
		baton_errf(errbuf, len, "no CUDA device");
		return BATON_ENODEV;
	}
	return 0;
}

static void cuda_close(struct baton_dev *dev);
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
		baton_errf(errbuf, errlen, "no CUDA device");
		return BATON_ENODEV;
	}
	if (index < 0 || index >= n) {
		baton_errf(errbuf, errlen, "no CUDA device %d (this machine has %d)", index, n);
		return BATON_ENODEV;
	}
	struct baton_dev *dev = calloc(1, sizeof *dev);
	if (!dev) {
		baton_errf(errbuf, errlen, "out of host memory");
		return BATON_ENOMEM;
	}
	dev->d = d;
	dev->index = index;
	dev->register_piece = REGISTER_PIECE_DEFAULT;

	int vmm = 0;
	CUresult r = d->DeviceGet(&dev->cudev, index);
	if (r != CUDA_SUCCESS) {
		rc = cuda_fail(dev, r, "cuDeviceGet");
		goto fail;
	}
	if (d->DeviceGetName(dev->name, (int)sizeof dev->name, dev->cudev) != CUDA_SUCCESS)
		snprintf(dev->name, sizeof dev->name, "CUDA device %d", index);
	r = d->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
	    dev->cudev);
	if (r != CUDA_SUCCESS || !vmm) {
		cuda_set_err(dev, "%s (device %d) does not support the virtual memory management API",
		    dev->name, index);
		rc = BATON_EUNSUPPORTED;
		goto fail;
	}
	if (d->DeviceGetAttribute(&dev->ro_register,
	        CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED, dev->cudev) != CUDA_SUCCESS)
		dev->ro_register = 0;

	r = d->DevicePrimaryCtxRetain(&dev->ctx, dev->cudev);
	if (r != CUDA_SUCCESS) {
		rc = cuda_fail(dev, r, "cuDevicePrimaryCtxRetain");
		dev->ctx = NULL;
		goto fail;
	}
	if ((rc = cuda_cur(dev)))
		goto fail;

	dev->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	dev->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	dev->prop.location.id = dev->cudev;
	size_t g = 0, gmin = 0;
	r = d->MemGetAllocationGranularity(&gmin, &dev->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	if (r != CUDA_SUCCESS || gmin == 0) {
		rc = r != CUDA_SUCCESS ? cuda_fail(dev, r, "cuMemGetAllocationGranularity") : BATON_EDRIVER;
		goto fail;
	}
	if (d->MemGetAllocationGranularity(&g, &dev->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) !=
	        CUDA_SUCCESS || g < gmin || g % gmin != 0)
		g = gmin;
	dev->gran = g;
	dev->gran_min = gmin;

	r = d->StreamCreate(&dev->stream, CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		rc = cuda_fail(dev, r, "cuStreamCreate");
		dev->stream = NULL;
		goto fail;
	}
	r = d->EventCreate(&dev->staged, CU_EVENT_DISABLE_TIMING);
	if (r != CUDA_SUCCESS) {
		rc = cuda_fail(dev, r, "cuEventCreate");
		dev->staged = NULL;
		goto fail;
	}
	if ((rc = cuda_moe_load(dev)) || (rc = cuda_ops_load(dev)) || (rc = cuda_attn_load(dev)) ||
	    (rc = cuda_route_load(dev)) || (rc = cuda_mmvq_load(dev)) || (rc = cuda_g16_load(dev)) ||
	    (rc = cuda_vr_load(dev)) || (rc = cuda_mr_load(dev)))
		goto fail;
	cuda_tc_config(dev);
	cuda_mmvq_config(dev);
	cuda_graph_config(dev);
	cuda_prof_config(dev);
	*out = dev;
	return 0;

fail:
	baton_errf(errbuf, errlen, "cuda device %d: %s", index, dev->err[0] ? dev->err : baton_strerror(rc));
	cuda_close(dev);
	return rc;
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
		cuda_prof_report(dev);
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
		for (size_t i = 0; i < dev->hallocs.n; i++)
			d->MemFreeHost((void *)(uintptr_t)dev->hallocs.v[i].addr);
		cuda_graph_free(dev);
		if (dev->d2h_stage)
			d->MemFreeHost(dev->d2h_stage);
		cuda_tc_free(dev);
		cuda_ops_free(dev);
		cuda_attn_free(dev);
		cuda_route_free(dev);
		cuda_g16_free(dev);
		cuda_vr_free(dev);
		cuda_mr_free(dev);
		cuda_moe_free(dev);
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
	tab_free(&dev->hallocs);
	free(dev);
}

const char *cuda_backend_last_error(struct baton_dev *dev)
{
	return dev ? dev->err : "";
}

void cuda_backend_describe(struct baton_dev *dev, char *buf, size_t len)
{
	int v = dev->d->version;
	char tc[384];
	cuda_tc_describe(dev, tc, sizeof tc);
	snprintf(buf, len,
	    "%s (device %d), driver API %d.%d, VMM granularity %llu KiB (minimum %llu KiB), "
	    "read-only host registration %s, %s",
	    dev->name, dev->index, v / 1000, (v % 1000) / 10,
	    (unsigned long long)(dev->gran >> 10), (unsigned long long)(dev->gran_min >> 10),
	    dev->ro_register ? "supported" : "not supported", tc);
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
	int rc = cuda_cur(dev);
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

static int cuda_reserve(struct baton_dev *dev, uint64_t bytes, baton_dptr *base)
{
	if (!bytes || !base || bytes > UINT64_MAX / 2)
		return BATON_EINVAL;
	int rc = cuda_cur(dev);
	if (rc)
		return rc;
	uint64_t sz = cuda_round_up(bytes, dev->gran);
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
	if (!e || cuda_round_up(bytes, dev->gran) != e->bytes) {
		cuda_set_err(dev, "unreserve: no reservation of %llu bytes at 0x%llx",
		    (unsigned long long)bytes, (unsigned long long)base);
		return BATON_EINVAL;
	}
	for (int t = 0; t < 2; t++) {
		const struct tab *sg = t ? &dev->psegs : &dev->segs;
		for (size_t i = 0; i < sg->n; i++)
			if (sg->v[i].addr >= e->addr && sg->v[i].addr < e->addr + e->bytes) {
				cuda_set_err(dev, "unreserve: segment at 0x%llx is still mapped",
				    (unsigned long long)sg->v[i].addr);
				return BATON_ESTATE;
			}
	}
	int rc = cuda_cur(dev);
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

/* Creates a physical segment of `bytes` on `owner` (dev itself, or a peer
 * device), maps it at addr inside one of dev's reservations, makes it
 * readable and writable by dev (and by the owner), and records it in
 * dev->segs or dev->psegs. Undoes every step on failure: nothing is left
 * created or mapped. `op` names the caller in messages. */
static int seg_map(struct baton_dev *dev, struct baton_dev *owner, baton_dptr addr,
    uint64_t bytes, const char *op)
{
	const int peer = owner != dev;
	const char *tag = peer ? " (peer)" : "";
	struct tab *t = peer ? &dev->psegs : &dev->segs;
	if (!bytes || addr % dev->gran || bytes % dev->gran || addr % owner->gran ||
	    bytes % owner->gran) {
		cuda_set_err(dev, "%s: 0x%llx + %llu is not a multiple of the granularity %llu", op,
		    (unsigned long long)addr, (unsigned long long)bytes,
		    (unsigned long long)(owner->gran > dev->gran ? owner->gran : dev->gran));
		return BATON_EINVAL;
	}
	if (!range_free(dev, addr, bytes)) {
		cuda_set_err(dev, "%s: 0x%llx + %llu is outside every reservation or overlaps a segment",
		    op, (unsigned long long)addr, (unsigned long long)bytes);
		return BATON_EINVAL;
	}
	int rc = cuda_cur(dev);
	if (rc)
		return rc;
	if ((rc = tab_push(t, 0, 0, 0))) /* room first: nothing to undo later */
		return rc;
	t->n--;

	const struct cuda_driver *d = dev->d;
	CUmemAllocationProp prop = dev->prop;
	prop.location.id = owner->cudev; /* where the memory lives */
	CUmemGenericAllocationHandle h = 0;
	CUresult r = d->MemCreate(&h, bytes, &prop, 0);
	if (r != CUDA_SUCCESS) {
		char what[96];
		if (peer)
			snprintf(what, sizeof what, "cuMemCreate of %llu bytes on peer device %d",
			    (unsigned long long)bytes, owner->index);
		else
			snprintf(what, sizeof what, "cuMemCreate of %llu bytes", (unsigned long long)bytes);
		rc = cuda_fail(dev, r, what);
		/* Whatever the driver calls it: when it does not fit, it is
		 * BATON_EDEVMEM (the owner's free memory, read quietly here;
		 * the peer's through its own context, then dev's again). */
		uint64_t f = 0;
		size_t fs = 0, ts = 0;
		if (rc != BATON_EDEVMEM && !peer && d->MemGetInfo(&fs, &ts) == CUDA_SUCCESS && bytes > fs)
			rc = BATON_EDEVMEM;
		if (rc != BATON_EDEVMEM && peer && cuda_mem_info(owner, &f, NULL) == 0 && bytes > f)
			rc = BATON_EDEVMEM;
		if (peer)
			cuda_cur(dev);
		return rc;
	}
	char what[64];
	r = d->MemMap(addr, bytes, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		snprintf(what, sizeof what, "cuMemMap%s", tag);
		rc = cuda_fail(dev, r, what);
		d->MemRelease(h);
		return rc;
	}
	/* dev's own location first; the owner's too when it is another. */
	CUmemAccessDesc acc[2];
	memset(acc, 0, sizeof acc);
	acc[0].location = dev->prop.location;
	acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	acc[1].location = prop.location;
	acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = d->MemSetAccess(addr, bytes, acc, peer ? 2 : 1);
	if (r != CUDA_SUCCESS) {
		snprintf(what, sizeof what, "cuMemSetAccess%s", tag);
		rc = cuda_fail(dev, r, what);
		d->MemUnmap(addr, bytes);
		d->MemRelease(h);
		return rc;
	}
	tab_push(t, addr, bytes, (uint64_t)h); /* cannot fail: room made above */
	return 0;
}

/* Unmaps and releases the segment at addr of table t (dev->segs or
 * dev->psegs), after the stream is idle: no queued kernel or copy may
 * still touch it. When this returns 0 the memory is free again. */
static int seg_unmap(struct baton_dev *dev, struct tab *t, baton_dptr addr, uint64_t bytes,
    const char *op)
{
	const char *tag = t == &dev->psegs ? " (peer)" : "";
	struct ent *e = tab_find(t, addr);
	if (!e || e->bytes != bytes) {
		cuda_set_err(dev, "%s: no %ssegment of %llu bytes at 0x%llx", op,
		    t == &dev->psegs ? "peer " : "", (unsigned long long)bytes,
		    (unsigned long long)addr);
		return BATON_EINVAL;
	}
	int rc = cuda_cur(dev);
	if (!rc)
		rc = cuda_stream_sync(dev);
	if (rc)
		return rc;
	char what[64];
	CUresult r = dev->d->MemUnmap(e->addr, e->bytes);
	if (r != CUDA_SUCCESS) {
		snprintf(what, sizeof what, "cuMemUnmap%s", tag);
		return cuda_fail(dev, r, what);
	}
	r = dev->d->MemRelease((CUmemGenericAllocationHandle)e->handle);
	tab_remove(t, e);
	if (r != CUDA_SUCCESS) {
		snprintf(what, sizeof what, "cuMemRelease%s", tag);
		return cuda_fail(dev, r, what);
	}
	return 0;
}

static int cuda_map(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	return seg_map(dev, dev, addr, bytes, "map");
}

static int cuda_unmap(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	return seg_unmap(dev, &dev->segs, addr, bytes, "unmap");
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
		cuda_set_err(dev, "peer: device %d is this engine's own device", peer->index);
		return BATON_EINVAL;
	}
	int can = 0;
	CU(dev, dev->d->DeviceCanAccessPeer(&can, dev->cudev, peer->cudev), "cuDeviceCanAccessPeer");
	if (!can) {
		cuda_set_err(dev, "peer: %s (device %d) cannot access the memory of %s (device %d): "
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
	return rc ? rc : seg_map(dev, peer, addr, bytes, "map_peer");
}

static int cuda_unmap_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	(void)peer; /* the handle knows where its memory lives */
	return seg_unmap(dev, &dev->psegs, addr, bytes, "unmap_peer");
}

/* ---- plain buffers ---------------------------------------------------------- */

static int cuda_alloc(struct baton_dev *dev, uint64_t bytes, baton_dptr *out)
{
	if (!bytes || !out)
		return BATON_EINVAL;
	int rc = cuda_cur(dev);
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
	dev->n_launch++; /* the address may come back with other bytes */
	if (cuda_cur(dev) == 0) {
		cuda_stream_sync(dev);
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
	int rc = cuda_cur(dev);
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
			rc = cuda_fail(dev, r, what);
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
	int rc = cuda_cur(dev);
	if (!rc)
		rc = cuda_stream_sync(dev); /* copies out of it may be queued */
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
	int rc = cuda_cur(dev);
	if (rc)
		return rc;
	dev->n_launch++; /* device bytes change: no activation's copy holds */
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

/* Small copies to the host go through a pinned buffer: the DMA at
 * pinned speed, then a memcpy, where the driver's pageable path costs
 * about 100 us for a decode step's 600 KB of logits (5-7 GB/s); larger
 * ones (a KV save, the tests' GiB) straight to their memory. */
#define D2H_STAGE (4u << 20)

/* Whether [p, p + n) lies inside one of host_alloc's buffers (writable,
 * pinned: the registrations may be read-only to the device). */
static int dst_pinned(const struct baton_dev *dev, uint64_t p, uint64_t n)
{
	for (size_t i = 0; i < dev->hallocs.n; i++) {
		const struct ent *e = &dev->hallocs.v[i];
		if (p >= e->addr && p - e->addr <= e->bytes && n <= e->bytes - (p - e->addr))
			return 1;
	}
	return 0;
}

static double cuda_wait_seconds(struct baton_dev *dev)
{
	return dev->t_wait;
}

static int cuda_host_alloc(struct baton_dev *dev, uint64_t bytes, void **out)
{
	if (!bytes || !out)
		return BATON_EINVAL;
	int rc = cuda_cur(dev);
	if (rc)
		return rc;
	if ((rc = tab_push(&dev->hallocs, 0, 0, 0)))
		return rc;
	dev->hallocs.n--;
	void *p = NULL;
	CU(dev, dev->d->MemHostAlloc(&p, bytes, 0), "cuMemHostAlloc");
	tab_push(&dev->hallocs, (uint64_t)(uintptr_t)p, bytes, 0);
	*out = p;
	return 0;
}

static void cuda_host_free(struct baton_dev *dev, void *p)
{
	struct ent *e = p ? tab_find(&dev->hallocs, (uint64_t)(uintptr_t)p) : NULL;
	if (!e || cuda_cur(dev))
		return;
	cuda_stream_sync(dev); /* copies into it may be queued */
	dev->d->MemFreeHost(p);
	tab_remove(&dev->hallocs, e);
}

static int cuda_copy_d2h(struct baton_dev *dev, void *dst, baton_dptr src, uint64_t bytes)
{
	if (!bytes)
		return 0;
	if (!dst || !src)
		return BATON_EINVAL;
	int rc = cuda_cur(dev);
	if (rc)
		return rc;
	/* into host_alloc's memory (the scheduler's logits): straight there at
	 * the pinned rate */
	if (dst_pinned(dev, (uint64_t)(uintptr_t)dst, bytes)) {
		CU(dev, dev->d->MemcpyDtoHAsync(dst, src, bytes, dev->stream),
		    "cuMemcpyDtoHAsync (pinned)");
		return cuda_stream_sync(dev);
	}
	if (bytes <= D2H_STAGE && !dev->d2h_stage) {
		void *p = NULL;
		if (dev->d->MemHostAlloc(&p, D2H_STAGE, 0) == CUDA_SUCCESS)
			dev->d2h_stage = p; /* else every copy goes the direct way */
	}
	if (bytes <= D2H_STAGE && dev->d2h_stage) {
		CU(dev, dev->d->MemcpyDtoHAsync(dev->d2h_stage, src, bytes, dev->stream),
		    "cuMemcpyDtoHAsync (staged)");
		if ((rc = cuda_stream_sync(dev)))
			return rc;
		memcpy(dst, dev->d2h_stage, bytes);
		return 0;
	}
	CU(dev, dev->d->MemcpyDtoHAsync(dst, src, bytes, dev->stream), "cuMemcpyDtoHAsync");
	return cuda_stream_sync(dev);
}

/* Peer <-> own slot moves: over NVLink/PCIe between the GPUs, on the
 * stream, after what is queued before. */
static int cuda_copy_d2d(struct baton_dev *dev, baton_dptr dst, baton_dptr src, uint64_t bytes)
{
	if (!bytes)
		return 0;
	if (!dst || !src)
		return BATON_EINVAL;
	int rc = cuda_cur(dev);
	if (rc)
		return rc;
	dev->n_launch++;
	CU(dev, dev->d->MemcpyDtoDAsync(dst, src, bytes, dev->stream), "cuMemcpyDtoDAsync");
	return 0;
}

static int cuda_sync(struct baton_dev *dev)
{
	int rc = cuda_cur(dev);
	return rc ? rc : cuda_stream_sync(dev);
}

/* The tensor-core path, started now rather than at the first pass of
 * dev->tc_rows rows or more (blas.c): not while a pass is recorded. */
static int cuda_op_prepare(struct baton_dev *dev, uint32_t rows)
{
	int rc;
	if (dev->gmode)
		return 0;
	if ((rc = cuda_cur(dev)))
		return rc;
	cuda_tc_on(dev, rows);
	return 0;
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
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.wait_seconds = cuda_wait_seconds,
	.host_unregister = cuda_host_unregister,
	.copy_h2d = cuda_copy_h2d,
	.copy_d2h = cuda_copy_d2h,
	.copy_d2d = cuda_copy_d2d,
	.sync = cuda_sync,
	.moe_route = cuda_moe_route,
	.moe_experts = cuda_moe_experts,
	.can_compute = cuda_can_compute,
	.embed = cuda_op_embed,
	.rmsnorm = cuda_op_rmsnorm,
	.matmul = cuda_op_matmul,
	.rope = cuda_op_rope,
	.qk_norm_rope = cuda_op_qk_norm_rope,
	.matmuls = cuda_op_matmuls,
	.attention = cuda_op_attention,
	.attention_segs = cuda_op_attention_segs,
	.kv_store = cuda_op_kv_store,
	.swiglu = cuda_op_swiglu,
	.add = cuda_op_add,
	.route = cuda_op_route,
	.route_dev = cuda_op_route_dev,
	.moe_experts_dev = cuda_moe_experts_dev,
	.moe_dev_rows = cuda_moe_dev_rows,
	.router_route_dev = cuda_op_router_route_dev,
	.graph_begin = cuda_graph_begin,
	.graph_end = cuda_graph_end,
	.prepare = cuda_op_prepare,
	.qk_attention_segs = cuda_op_qk_attention_segs,
	.rmsnorm_matmuls = cuda_op_rmsnorm_matmuls,
};
