/*
 * backend.c: the `host` backend (the top of engine/backend/host/). A full
 * backend, not a mock: the
 * device's memory is host memory with the same VMM semantics as CUDA's.
 *
 *   reserve    mmap(PROT_NONE, MAP_NORESERVE) aligned to the granularity
 *   map        charge the shared capacity (device.h) first, then
 *              memfd_create + fallocate (the pages exist) +
 *              mmap(MAP_FIXED|MAP_SHARED) at the address + populate (the
 *              page tables too: MADV_POPULATE_WRITE, or MAP_POPULATE on
 *              kernels before 5.14), so the first copy takes no page fault;
 *              the fd is closed then, the mapping keeps the pages
 *   unmap      mmap(PROT_NONE, MAP_FIXED) over the segment, which drops the
 *              memfd's last reference (the pages really go back), then
 *              uncharge
 *   alloc/free plain anonymous mappings, charged the same way
 *   copies     memcpy; copy_h2d is complete on return, sync is a no-op
 *
 * Work of HOST_SPLIT_MIN bytes or more (a copy_h2d batch, populating a
 * segment) is cut by bytes into two halves done at once, the second on a
 * short-lived helper thread with every signal blocked, where the machine
 * has 2 CPUs or more (BATON_HOST_THREADS=1 turns that off). A batch whose
 * destinations overlap is copied in order on one thread, so the bytes are
 * the same either way.
 *   pinning    host_register/host_unregister succeed and do nothing: host
 *              memory needs no pinning to be copied from
 *   MoE        the CPU reference (engine/backend/host/moe.c, engine/backend/host/dtype.c)
 *
 * Granularity is 2 MiB (as CUDA VMM's usual one), or the page size where
 * that is larger. Every device mapping is MADV_DONTFORK, so a forked child
 * neither sees nor keeps alive the parent's device memory (as with CUDA, a
 * context is not usable after fork(); calls there give BATON_ESTATE).
 *
 * Addresses handed to map/unmap/copy are checked against the context's own
 * reservations and mappings, so a bad address is BATON_EINVAL, not a crash.
 * A copy may span neighbouring segments mapped back to back (as one copy
 * into a CUDA VMM range may), but every byte of it must be mapped; a batch
 * with a bad copy copies nothing.
 *
 * The device's capacity, its sharing between processes, and what happens
 * when an owner dies: see device.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/backend/host/host.h"
#include "engine/backend/host/device.h"

#define HOST_GRANULARITY (2u << 20)
#define HOST_SPLIT_MIN (8u << 20) /* work at least this large runs on 2 threads */
#define HOST_SPLIT_ALIGN 4096u

enum { MAP_SEG = 1, MAP_ALLOC = 2, MAP_PEER = 3 };

struct host_map {
	uint64_t addr, bytes;
	int kind;
	struct baton_dev *peer; /* MAP_PEER: the device charged for it */
};

struct host_resv {
	uint64_t base, bytes;
};

struct baton_dev {
	struct hostdev *hd;
	int index;
	pid_t pid;
	uint64_t gran;
	uint64_t page;
	int threads; /* 1 or 2: threads for large copies and populating */
	uint32_t moe_dev_lo; /* BATON_HOST_MOE_DEV_ROWS: large passes routed "on the device", or 0 */
	struct host_map *maps; /* sorted by addr, never overlapping */
	size_t n_maps, cap_maps;
	struct host_resv *resv;
	size_t n_resv, cap_resv;
};

static int host_usable(const struct baton_dev *dev)
{
	return dev && dev->pid == getpid();
}

/* Index of the first map with addr > a (upper bound). */
static size_t map_upper(const struct baton_dev *dev, uint64_t a)
{
	size_t lo = 0, hi = dev->n_maps;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (dev->maps[mid].addr <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The map that holds [a, a+bytes) entirely, or NULL. */
static const struct host_map *map_holding(const struct baton_dev *dev, uint64_t a,
    uint64_t bytes)
{
	size_t i = map_upper(dev, a);
	if (i == 0)
		return NULL;
	const struct host_map *m = &dev->maps[i - 1];
	if (a - m->addr > m->bytes || bytes > m->bytes - (a - m->addr))
		return NULL;
	return m;
}

/* Whether every byte of [a, a + bytes) lies in mappings of this context. */
static int range_mapped(const struct baton_dev *dev, uint64_t a, uint64_t bytes)
{
	if (a + bytes < a)
		return 0;
	while (bytes) {
		const struct host_map *m = map_holding(dev, a, 1);
		if (!m)
			return 0;
		uint64_t chunk = m->addr + m->bytes - a;
		if (chunk > bytes)
			chunk = bytes;
		a += chunk;
		bytes -= chunk;
	}
	return 1;
}

static int map_insert(struct baton_dev *dev, uint64_t addr, uint64_t bytes, int kind,
    struct baton_dev *peer)
{
	if (dev->n_maps == dev->cap_maps) {
		size_t cap = dev->cap_maps ? dev->cap_maps * 2 : 16;
		struct host_map *m = realloc(dev->maps, cap * sizeof *m);
		if (!m)
			return BATON_ENOMEM;
		dev->maps = m;
		dev->cap_maps = cap;
	}
	size_t i = map_upper(dev, addr);
	memmove(&dev->maps[i + 1], &dev->maps[i], (dev->n_maps - i) * sizeof dev->maps[0]);
	dev->maps[i] = (struct host_map){ addr, bytes, kind, peer };
	dev->n_maps++;
	return 0;
}

static void map_remove(struct baton_dev *dev, const struct host_map *m)
{
	size_t i = (size_t)(m - dev->maps);
	memmove(&dev->maps[i], &dev->maps[i + 1], (dev->n_maps - i - 1) * sizeof dev->maps[0]);
	dev->n_maps--;
}

/* 1 when [a, a+bytes) overlaps no existing map. */
static int map_free_range(const struct baton_dev *dev, uint64_t a, uint64_t bytes)
{
	size_t i = map_upper(dev, a);
	if (i > 0) {
		const struct host_map *p = &dev->maps[i - 1];
		if (a - p->addr < p->bytes)
			return 0;
	}
	if (i < dev->n_maps && dev->maps[i].addr - a < bytes)
		return 0;
	return 1;
}

static const struct host_resv *resv_holding(const struct baton_dev *dev, uint64_t a,
    uint64_t bytes)
{
	for (size_t i = 0; i < dev->n_resv; i++) {
		const struct host_resv *r = &dev->resv[i];
		if (a >= r->base && a - r->base <= r->bytes && bytes <= r->bytes - (a - r->base))
			return r;
	}
	return NULL;
}

/* Puts the reservation's placeholder back over [addr, addr+bytes). */
static int placeholder(uint64_t addr, uint64_t bytes)
{
	void *p = mmap((void *)(uintptr_t)addr, bytes, PROT_NONE,
	    MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return BATON_EDRIVER;
	madvise(p, bytes, MADV_DONTFORK);
	return 0;
}

/* ---- two halves at once ---------------------------------------------------- */

struct half {
	void (*fn)(void *arg, int part, uint64_t from, uint64_t to);
	void *arg;
	uint64_t from, to;
};

static void *half_main(void *p)
{
	struct half *h = p;
	h->fn(h->arg, 1, h->from, h->to);
	return NULL;
}

/* Runs fn over [0, total): [0, mid) here as part 0 and [mid, total) as
 * part 1 on a helper thread, or all of it here (part 0) when no thread can
 * be had. */
static void split2(void (*fn)(void *, int, uint64_t, uint64_t), void *arg, uint64_t total)
{
	uint64_t mid = total / 2 / HOST_SPLIT_ALIGN * HOST_SPLIT_ALIGN;
	struct half h = { fn, arg, mid, total };
	pthread_t t;
	sigset_t all, old;
	sigfillset(&all);
	int made = 0;
	if (mid > 0 && pthread_sigmask(SIG_SETMASK, &all, &old) == 0) {
		made = pthread_create(&t, NULL, half_main, &h) == 0;
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	if (!made) {
		fn(arg, 0, 0, total);
		return;
	}
	fn(arg, 0, 0, mid);
	pthread_join(t, NULL);
}

/* Builds the page tables of a fresh segment mapping now, so that the
 * memory is really there when map returns (as after cuMemMap) and a
 * refill's copy measures copying, not page faults. MADV_POPULATE_WRITE
 * (Linux 5.14) is about a quarter faster on shmem than MAP_POPULATE, which
 * populates with read faults; older kernels get the mapping again with
 * MAP_POPULATE. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

struct pop_job {
	char *p;
	int err[2]; /* errno of each part, 0 when it went well */
};

static void pop_part(void *arg, int part, uint64_t from, uint64_t to)
{
	struct pop_job *j = arg;
	int r;
	while ((r = madvise(j->p + from, to - from, MADV_POPULATE_WRITE)) < 0 && errno == EINTR)
		;
	j->err[part] = r < 0 ? errno : 0;
}

static int populate(const struct baton_dev *dev, int fd, void *p, uint64_t bytes)
{
	struct pop_job j = { p, { 0, 0 } };
	if (dev->threads > 1 && bytes >= HOST_SPLIT_MIN)
		split2(pop_part, &j, bytes);
	else
		pop_part(&j, 0, 0, bytes);
	int e = j.err[0] ? j.err[0] : j.err[1];
	if (e == 0)
		return 0;
	if (e == ENOMEM || e == EFAULT)
		return BATON_EDEVMEM; /* EFAULT: the pages could not be had */
	if (e != EINVAL)
		return BATON_EDRIVER;
	void *q = mmap(p, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
	    fd, 0);
	if (q == MAP_FAILED)
		return errno == ENOMEM ? BATON_EDEVMEM : BATON_EDRIVER;
	return 0;
}

static int host_open(int index, uint64_t capacity_bytes, struct baton_dev **out,
    char *errbuf, size_t errlen)
{
	if (!out)
		return BATON_EINVAL;
	*out = NULL;
	struct baton_dev *dev = calloc(1, sizeof *dev);
	if (!dev) {
		baton_errf(errbuf, errlen, "out of host memory");
		return BATON_ENOMEM;
	}
	int rc = hostdev_open(index, capacity_bytes, &dev->hd, errbuf, errlen);
	if (rc) {
		free(dev);
		return rc;
	}
	long page = sysconf(_SC_PAGESIZE);
	dev->page = page > 0 ? (uint64_t)page : 4096;
	dev->gran = dev->page > HOST_GRANULARITY ? dev->page : HOST_GRANULARITY;
	dev->index = index;
	dev->pid = getpid();
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	const char *th = getenv("BATON_HOST_THREADS");
	dev->threads = cpus >= 2 && !(th && strcmp(th, "1") == 0) ? 2 : 1;
	/* the model's large-pass device route (the cuda backend's bf16
	 * prefill) on any machine, for tests: off unless asked, since the
	 * larger routing buffers take device memory an exactly sized device
	 * may not have */
	const char *dr = getenv("BATON_HOST_MOE_DEV_ROWS");
	if (dr && *dr) {
		char *end;
		unsigned long v = strtoul(dr, &end, 10);
		dev->moe_dev_lo = !*end && v >= 2 && v <= 65535 ? (uint32_t)v : 0;
	}
	*out = dev;
	return 0;
}

/* moe_experts_dev is moe_experts with a table lookup here, as fast at any
 * size: passes from BATON_HOST_MOE_DEV_ROWS rows when it is set. */
static int host_moe_dev_rows(struct baton_dev *dev, const struct baton_moe_layer *l, uint32_t *lo,
    uint32_t *hi)
{
	if (!dev || !dev->moe_dev_lo || !l || !l->top_k || !lo || !hi)
		return 0;
	*lo = dev->moe_dev_lo;
	*hi = UINT32_MAX / l->top_k;
	return 1;
}

static void host_close(struct baton_dev *dev)
{
	if (!dev)
		return;
	if (host_usable(dev)) {
		for (size_t i = 0; i < dev->n_maps; i++)
			munmap((void *)(uintptr_t)dev->maps[i].addr, dev->maps[i].bytes);
		for (size_t i = 0; i < dev->n_resv; i++)
			munmap((void *)(uintptr_t)dev->resv[i].base, dev->resv[i].bytes);
	}
	/* hostdev_close gives back everything charged through this context. */
	hostdev_close(dev->hd);
	free(dev->maps);
	free(dev->resv);
	free(dev);
}

static int host_mem_info(struct baton_dev *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
	if (!dev)
		return BATON_EINVAL;
	return hostdev_mem_info(dev->hd, free_bytes, total_bytes);
}

static int host_uuid(struct baton_dev *dev, char *buf, size_t len)
{
	if (!dev || !buf)
		return BATON_EINVAL;
	int n = snprintf(buf, len, "host-%d", dev->index);
	return n < 0 || (size_t)n >= len ? BATON_EINVAL : 0;
}

static uint64_t host_granularity(struct baton_dev *dev)
{
	return dev ? dev->gran : HOST_GRANULARITY;
}

static int host_reserve(struct baton_dev *dev, uint64_t bytes, baton_dptr *base)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	if (!base || bytes == 0 || bytes > (UINT64_MAX >> 2))
		return BATON_EINVAL;
	bytes = (bytes + dev->gran - 1) / dev->gran * dev->gran;
	if (dev->n_resv == dev->cap_resv) {
		size_t cap = dev->cap_resv ? dev->cap_resv * 2 : 4;
		struct host_resv *r = realloc(dev->resv, cap * sizeof *r);
		if (!r)
			return BATON_ENOMEM;
		dev->resv = r;
		dev->cap_resv = cap;
	}
	/* Over-reserve by one granule and trim, for the alignment. */
	uint64_t span = bytes + dev->gran;
	void *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return BATON_EDEVMEM; /* no address space left */
	uint64_t a = (uint64_t)(uintptr_t)p;
	uint64_t aligned = (a + dev->gran - 1) / dev->gran * dev->gran;
	if (aligned > a)
		munmap(p, aligned - a);
	if (a + span > aligned + bytes)
		munmap((void *)(uintptr_t)(aligned + bytes), a + span - (aligned + bytes));
	madvise((void *)(uintptr_t)aligned, bytes, MADV_DONTFORK);
	dev->resv[dev->n_resv++] = (struct host_resv){ aligned, bytes };
	*base = aligned;
	return 0;
}

static int host_unreserve(struct baton_dev *dev, baton_dptr base, uint64_t bytes)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	bytes = (bytes + dev->gran - 1) / dev->gran * dev->gran;
	for (size_t i = 0; i < dev->n_resv; i++) {
		struct host_resv *r = &dev->resv[i];
		if (r->base != base || r->bytes != bytes)
			continue;
		/* A segment still mapped inside? Only the last map that
		 * starts before the end can reach into the range. */
		size_t j = map_upper(dev, base + bytes - 1);
		if (j > 0 && dev->maps[j - 1].addr + dev->maps[j - 1].bytes > base)
			return BATON_EBUSY;
		if (munmap((void *)(uintptr_t)base, bytes) < 0)
			return BATON_EDRIVER;
		dev->resv[i] = dev->resv[--dev->n_resv];
		return 0;
	}
	return BATON_EINVAL;
}

/* A segment at addr in dev's reservation, its memory charged to `owner`
 * (dev itself, or the peer device of map_peer). */
static int map_seg(struct baton_dev *dev, struct baton_dev *owner, baton_dptr addr,
    uint64_t bytes)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	if (bytes == 0 || addr % dev->gran || bytes % dev->gran ||
	    !resv_holding(dev, addr, bytes) || !map_free_range(dev, addr, bytes))
		return BATON_EINVAL;
	int rc = hostdev_charge(owner->hd, bytes);
	if (rc)
		return rc;
	int fd = memfd_create("baton-hostdev", MFD_CLOEXEC);
	if (fd < 0) {
		rc = errno == ENOMEM || errno == EMFILE || errno == ENFILE ? BATON_EDEVMEM
		                                                           : BATON_EDRIVER;
		goto fail;
	}
	if (ftruncate(fd, (off_t)bytes) < 0) {
		rc = BATON_EDEVMEM;
		goto fail;
	}
	/* Commit the pages now, as cuMemCreate does: a full host fails here
	 * with BATON_EDEVMEM instead of with SIGBUS at the first copy. */
	int frc;
	while ((frc = fallocate(fd, 0, 0, (off_t)bytes)) < 0 && errno == EINTR)
		;
	if (frc < 0) {
		rc = errno == ENOSPC || errno == ENOMEM || errno == EFBIG ? BATON_EDEVMEM
		                                                          : BATON_EDRIVER;
		goto fail;
	}
	void *p = mmap((void *)(uintptr_t)addr, bytes, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_FIXED, fd, 0);
	if (p == MAP_FAILED) {
		rc = errno == ENOMEM ? BATON_EDEVMEM : BATON_EDRIVER;
		placeholder(addr, bytes); /* a failed MAP_FIXED may leave a hole */
		goto fail;
	}
	rc = populate(dev, fd, p, bytes);
	if (rc) {
		placeholder(addr, bytes);
		goto fail;
	}
	close(fd);
	fd = -1;
	madvise(p, bytes, MADV_DONTFORK);
	rc = owner == dev ? map_insert(dev, addr, bytes, MAP_SEG, NULL) :
	                   map_insert(dev, addr, bytes, MAP_PEER, owner);
	if (rc) {
		placeholder(addr, bytes);
		goto fail;
	}
	return 0;

fail:
	if (fd >= 0)
		close(fd);
	hostdev_uncharge(owner->hd, bytes);
	return rc;
}

static int host_map(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	return map_seg(dev, dev, addr, bytes);
}

static int unmap_seg(struct baton_dev *dev, struct baton_dev *owner, baton_dptr addr,
    uint64_t bytes)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	const struct host_map *m = map_holding(dev, addr, bytes);
	if (!m || m->addr != addr || m->bytes != bytes)
		return BATON_EINVAL;
	if (owner == dev ? m->kind != MAP_SEG : (m->kind != MAP_PEER || m->peer != owner))
		return BATON_EINVAL;
	int rc = placeholder(addr, bytes);
	if (rc)
		return rc;
	map_remove(dev, m);
	/* The pages are gone with the mapping; now the count follows. */
	return hostdev_uncharge(owner->hd, bytes);
}

static int host_unmap(struct baton_dev *dev, baton_dptr addr, uint64_t bytes)
{
	return unmap_seg(dev, dev, addr, bytes);
}

/* The peer tier: the same segments, charged to another host device (its
 * capacity file), so the peer's mem_info and its dead-owner reclaim count
 * them. Any two distinct host devices can "reach" each other. */
static int host_peer_access(struct baton_dev *dev, struct baton_dev *peer)
{
	if (!host_usable(dev) || !host_usable(peer))
		return dev && peer ? BATON_ESTATE : BATON_EINVAL;
	return dev == peer || dev->index == peer->index ? BATON_EINVAL : 0;
}

static int host_map_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	int rc = host_peer_access(dev, peer);
	return rc ? rc : map_seg(dev, peer, addr, bytes);
}

static int host_unmap_peer(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
    uint64_t bytes)
{
	int rc = host_peer_access(dev, peer);
	return rc ? rc : unmap_seg(dev, peer, addr, bytes);
}

static int host_alloc(struct baton_dev *dev, uint64_t bytes, baton_dptr *out)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	if (!out || bytes == 0 || bytes > (UINT64_MAX >> 2))
		return BATON_EINVAL;
	bytes = (bytes + dev->page - 1) / dev->page * dev->page;
	int rc = hostdev_charge(dev->hd, bytes);
	if (rc)
		return rc;
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		hostdev_uncharge(dev->hd, bytes);
		return BATON_EDEVMEM;
	}
	madvise(p, bytes, MADV_DONTFORK);
	rc = map_insert(dev, (uint64_t)(uintptr_t)p, bytes, MAP_ALLOC, NULL);
	if (rc) {
		munmap(p, bytes);
		hostdev_uncharge(dev->hd, bytes);
		return rc;
	}
	*out = (uint64_t)(uintptr_t)p;
	return 0;
}

static void host_free(struct baton_dev *dev, baton_dptr p)
{
	if (!host_usable(dev) || !p)
		return;
	const struct host_map *m = map_holding(dev, p, 1);
	if (!m || m->addr != p || m->kind != MAP_ALLOC)
		return;
	uint64_t bytes = m->bytes;
	munmap((void *)(uintptr_t)p, bytes);
	map_remove(dev, m);
	hostdev_uncharge(dev->hd, bytes);
}

static int host_register(struct baton_dev *dev, const void *p, uint64_t bytes)
{
	if (!dev || (!p && bytes))
		return BATON_EINVAL;
	return 0;
}

static int host_unregister(struct baton_dev *dev, const void *p, uint64_t bytes)
{
	return host_register(dev, p, bytes);
}

struct copy_job {
	const struct baton_copy *c;
	size_t n;
};

/* Copies bytes [from, to) of the batch, its copies laid end to end. */
static void copy_part(void *arg, int part, uint64_t from, uint64_t to)
{
	const struct copy_job *j = arg;
	(void)part;
	uint64_t lo = 0;
	for (size_t i = 0; i < j->n && lo < to; i++) {
		const struct baton_copy *c = &j->c[i];
		uint64_t hi = lo + c->bytes;
		if (c->bytes && hi > from) {
			uint64_t a = from > lo ? from - lo : 0;
			uint64_t b = (to < hi ? to : hi) - lo;
			memcpy((char *)(uintptr_t)c->dst + a, (const char *)c->src + a, b - a);
		}
		lo = hi;
	}
}

static int cmp_copy_dst(const void *a, const void *b)
{
	const struct baton_copy *x = a, *y = b;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

/* 1 when two copies of the batch write the same byte (or when that cannot
 * be checked): then only copying in order gives the right bytes. */
static int dst_overlap(const struct baton_copy *copies, size_t n)
{
	if (n < 2)
		return 0;
	struct baton_copy *s = malloc(n * sizeof *s);
	if (!s)
		return 1;
	size_t m = 0;
	for (size_t i = 0; i < n; i++)
		if (copies[i].bytes)
			s[m++] = copies[i];
	qsort(s, m, sizeof *s, cmp_copy_dst);
	int over = 0;
	for (size_t i = 1; i < m && !over; i++)
		over = s[i].dst < s[i - 1].dst + s[i - 1].bytes;
	free(s);
	return over;
}

static int host_copy_h2d(struct baton_dev *dev, const struct baton_copy *copies, size_t n)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	if (n && !copies)
		return BATON_EINVAL;
	/* Check the whole batch first: a bad batch copies nothing. */
	for (size_t i = 0; i < n; i++) {
		if (!copies[i].bytes)
			continue;
		if (!copies[i].src || !range_mapped(dev, copies[i].dst, copies[i].bytes))
			return BATON_EINVAL;
	}
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += copies[i].bytes;
	struct copy_job j = { copies, n };
	if (dev->threads > 1 && total >= HOST_SPLIT_MIN && !dst_overlap(copies, n))
		split2(copy_part, &j, total);
	else
		copy_part(&j, 0, 0, total);
	return 0;
}

static int host_copy_d2h(struct baton_dev *dev, void *dst, baton_dptr src, uint64_t bytes)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	if (!bytes)
		return 0;
	if (!dst || !range_mapped(dev, src, bytes))
		return BATON_EINVAL;
	memcpy(dst, (const void *)(uintptr_t)src, bytes);
	return 0;
}

static int host_copy_d2d(struct baton_dev *dev, baton_dptr dst, baton_dptr src, uint64_t bytes)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	if (!bytes)
		return 0;
	if (!range_mapped(dev, dst, bytes) || !range_mapped(dev, src, bytes) ||
	    (dst < src + bytes && src < dst + bytes))
		return BATON_EINVAL;
	memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
	return 0;
}

static int host_sync(struct baton_dev *dev)
{
	if (!host_usable(dev))
		return dev ? BATON_ESTATE : BATON_EINVAL;
	return 0;
}

const struct baton_backend baton_backend_host = {
	.name = "host",
	.open = host_open,
	.close = host_close,
	.mem_info = host_mem_info,
	.uuid = host_uuid,
	.granularity = host_granularity,
	.reserve = host_reserve,
	.unreserve = host_unreserve,
	.map = host_map,
	.unmap = host_unmap,
	.peer_access = host_peer_access,
	.map_peer = host_map_peer,
	.unmap_peer = host_unmap_peer,
	.alloc = host_alloc,
	.free = host_free,
	.host_register = host_register,
	.host_unregister = host_unregister,
	.copy_h2d = host_copy_h2d,
	.copy_d2h = host_copy_d2h,
	.copy_d2d = host_copy_d2d,
	.sync = host_sync,
	/* The CPU reference math: engine/backend/host/moe.c and engine/backend/host/dtype.c. */
	.moe_route = host_moe_route,
	.moe_experts = host_moe_experts,
	.can_compute = host_can_compute,
	/* The forward pass's dense ops: engine/backend/host/ops.c. */
	.embed = host_op_embed,
	.rmsnorm = host_op_rmsnorm,
	.matmul = host_op_matmul,
	.matmuls = host_op_matmuls,
	.rope = host_op_rope,
	.attention = host_op_attention,
	.attention_segs = host_op_attention_segs,
	.kv_store = host_op_kv_store,
	.swiglu = host_op_swiglu,
	.add = host_op_add,
	.route = host_op_route,
	.route_dev = host_op_route_dev,
	.moe_experts_dev = host_moe_experts_dev,
	.moe_dev_rows = host_moe_dev_rows,
	.router_route_dev = host_op_router_route_dev,
};
