/*
 * launch.c: the bottom of the `cuda` backend's two launchers (moe_launch.c
 * and ops_launch.c), what both use and neither owns: the dtypes their
 * kernels compute (the can_compute slot), the growing device buffers of
 * their scratch, and one kernel launch on the context's stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
	/* up to an eighth of the next power of two (1 MiB at least): a need
	 * that creeps up layer by layer (the experts' rows) regrows a few
	 * times, not at every layer, each time a stream sync */
	uint64_t step = 1u << 20;
	while (step * 16 <= bytes)
		step <<= 1;
	uint64_t cap = cuda_round_up(bytes, step);
	CUdeviceptr p = 0;
	CU(dev, dev->d->MemAlloc(&p, cap), "cuMemAlloc (scratch)");
	b->p = p;
	b->cap = cap;
	return 0;
}

static void prof_add(struct baton_dev *dev, const char *what);

/* The pass being checked went another way than the recording: nothing
 * of it is queued; graph_end refuses it and the caller records anew. */
static int differs(struct baton_dev *dev, const char *what)
{
	if (!dev->gfail)
		cuda_set_err(dev, "graph replay: %s differs from the recorded pass", what);
	dev->gfail = 1;
	return BATON_ESTATE;
}

/* One entry more in the recording's log (a failure to grow it only
 * marks the recording as one not to replay). */
static struct cuda_glog *log_next(struct baton_dev *dev)
{
	if (dev->gl_n == dev->gl_cap) {
		uint32_t cap = dev->gl_cap ? 2 * dev->gl_cap : 1024;
		struct cuda_glog *v = realloc(dev->gl, cap * sizeof *v);
		if (!v) {
			dev->gfail = 1;
			return NULL;
		}
		dev->gl = v;
		dev->gl_cap = cap;
	}
	return &dev->gl[dev->gl_n++];
}

static int log_args(struct baton_dev *dev, const void *args, uint32_t size, uint64_t *off)
{
	if (dev->gl_args_n + size > dev->gl_args_cap) {
		uint64_t cap = dev->gl_args_cap ? 2 * dev->gl_args_cap : 1u << 16;
		while (cap < dev->gl_args_n + size)
			cap *= 2;
		uint8_t *v = realloc(dev->gl_args, cap);
		if (!v)
			return -1;
		dev->gl_args = v;
		dev->gl_args_cap = cap;
	}
	*off = dev->gl_args_n;
	memcpy(dev->gl_args + dev->gl_args_n, args, size);
	dev->gl_args_n += (size + 7) & ~7u;
	return 0;
}

int cuda_launch_k(struct baton_dev *dev, CUfunction f, uint32_t gx, uint32_t gy, uint32_t gz,
    uint32_t threads, uint32_t shmem, const void *args, uint32_t size, const char *what)
{
	return cuda_launch_kx(dev, f, gx, gy, gz, threads, shmem, args, size, what, 0);
}

int cuda_launch_kx(struct baton_dev *dev, CUfunction f, uint32_t gx, uint32_t gy, uint32_t gz,
    uint32_t threads, uint32_t shmem, const void *args, uint32_t size, const char *what, int pdl)
{
	dev->n_launch++; /* mmvq_launch.c: the last quantization still holds? */
	if (dev->gmode == CUDA_G_CHECK) {
		const struct cuda_glog *e = dev->gk < dev->gl_n ? &dev->gl[dev->gk] : NULL;
		if (dev->gfail || !e || e->f != f || e->g[0] != gx || e->g[1] != gy || e->g[2] != gz ||
		    e->threads != threads || e->shmem != shmem || !size || e->size != size ||
		    memcmp(dev->gl_args + e->off, args, size) != 0)
			return differs(dev, what);
		dev->gk++;
		return 0;
	}
	if (dev->gmode == CUDA_G_RECORD && !dev->gfail) {
		struct cuda_glog *e = size ? log_next(dev) : NULL;
		uint64_t off = 0;
		if (!e || log_args(dev, args, size, &off)) {
			dev->gfail = 1; /* recorded and run, never replayed */
		} else {
			*e = (struct cuda_glog){ .f = f, .g = { gx, gy, gz }, .threads = threads,
				.shmem = shmem, .size = size, .off = off };
		}
	}
	void *params[] = { (void *)args };
	const int prof = cuda_prof_begin(dev);
	if (pdl > 1 || (pdl && dev->pdl)) { /* 1: if BATON_CUDA_PDL=1; 2: the caller's switch */
		CUlaunchAttribute at;
		memset(&at, 0, sizeof at);
		at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
		at.value.programmaticStreamSerializationAllowed = 1;
		const CUlaunchConfig cfg = { .gridDimX = gx, .gridDimY = gy, .gridDimZ = gz,
			.blockDimX = threads, .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = shmem,
			.hStream = dev->stream, .attrs = &at, .numAttrs = 1 };
		CU(dev, dev->d->LaunchKernelEx(&cfg, f, params, NULL), what);
	} else {
		CU(dev, dev->d->LaunchKernel(f, gx, gy, gz, threads, 1, 1, shmem, dev->stream, params,
		    NULL), what);
	}
	if (prof)
		prof_add(dev, what);
	return 0;
}

int cuda_prof_begin(struct baton_dev *dev)
{
	if (!dev->prof || dev->gmode != CUDA_G_NONE || dev->capturing)
		return 0;
	return dev->d->EventRecord(dev->prof_ev[0], dev->stream) == CUDA_SUCCESS;
}

void cuda_prof_end(struct baton_dev *dev, const char *what)
{
	prof_add(dev, what);
}

/* An entry of host time (ms), not the device's: what a call spent on the
 * host before it returned (cuBLAS's heuristics, say). */
void cuda_prof_host(struct baton_dev *dev, const char *what, double ms)
{
	if (!dev->prof)
		return;
	int i = 0;
	while (i < dev->prof_n && dev->prof_v[i].what != what && strcmp(dev->prof_v[i].what, what))
		i++;
	if (i == dev->prof_n) {
		if (i == (int)(sizeof dev->prof_v / sizeof dev->prof_v[0]))
			return;
		dev->prof_v[dev->prof_n++] = (struct cuda_prof){ .what = what };
	}
	dev->prof_v[i].n++;
	dev->prof_v[i].ms += ms;
}

static void prof_add(struct baton_dev *dev, const char *what)
{
	const struct cuda_driver *d = dev->d;
	float ms = 0;
	if (d->EventRecord(dev->prof_ev[1], dev->stream) != CUDA_SUCCESS ||
	    d->EventSynchronize(dev->prof_ev[1]) != CUDA_SUCCESS ||
	    d->EventElapsedTime(&ms, dev->prof_ev[0], dev->prof_ev[1]) != CUDA_SUCCESS)
		return;
	int i = 0;
	while (i < dev->prof_n && dev->prof_v[i].what != what && strcmp(dev->prof_v[i].what, what))
		i++;
	if (i == dev->prof_n) {
		if (i == (int)(sizeof dev->prof_v / sizeof dev->prof_v[0]))
			return;
		dev->prof_v[dev->prof_n++] = (struct cuda_prof){ .what = what };
	}
	dev->prof_v[i].n++;
	dev->prof_v[i].ms += ms;
}

void cuda_prof_config(struct baton_dev *dev)
{
	const char *s = getenv("BATON_CUDA_PROFILE");
	dev->prof = 0;
	if (!s || strcmp(s, "1") != 0)
		return;
	if (dev->d->EventCreate(&dev->prof_ev[0], 0) != CUDA_SUCCESS)
		return;
	if (dev->d->EventCreate(&dev->prof_ev[1], 0) != CUDA_SUCCESS) {
		dev->d->EventDestroy(dev->prof_ev[0]);
		return;
	}
	dev->prof = 1;
}

static int prof_cmp(const void *a, const void *b)
{
	const struct cuda_prof *x = a, *y = b;
	return (x->ms < y->ms) - (x->ms > y->ms);
}

void cuda_prof_report(struct baton_dev *dev)
{
	if (!dev->prof)
		return;
	qsort(dev->prof_v, (size_t)dev->prof_n, sizeof dev->prof_v[0], prof_cmp);
	double all = 0;
	for (int i = 0; i < dev->prof_n; i++)
		all += dev->prof_v[i].ms;
	fprintf(stderr, "baton cuda profile: %.3f ms in %d launch sites\n", all, dev->prof_n);
	for (int i = 0; i < dev->prof_n; i++)
		fprintf(stderr, "  %10.3f ms %5.1f%% %9llu x %8.2f us  %s\n", dev->prof_v[i].ms,
		    all > 0 ? 100 * dev->prof_v[i].ms / all : 0.0, (unsigned long long)dev->prof_v[i].n,
		    1e3 * dev->prof_v[i].ms / (double)dev->prof_v[i].n, dev->prof_v[i].what);
	if (dev->prof_tc_calls) {
		const double c = (double)dev->prof_tc_calls;
		fprintf(stderr, "  tensor-core experts: %llu calls, per call %.0f pairs, %.1f experts in "
		    "%.1f buckets, %.0f rows padded (%.2f x the pairs)\n",
		    (unsigned long long)dev->prof_tc_calls, (double)dev->prof_tc_pairs / c,
		    (double)dev->prof_tc_experts / c, (double)dev->prof_tc_buckets / c,
		    (double)dev->prof_tc_rows / c,
		    dev->prof_tc_pairs ? (double)dev->prof_tc_rows / (double)dev->prof_tc_pairs : 0.0);
	}
	char lt[160];
	cuda_lt_describe(dev, lt, sizeof lt);
	fprintf(stderr, "  %s\n", lt);
	dev->d->EventDestroy(dev->prof_ev[0]);
	dev->d->EventDestroy(dev->prof_ev[1]);
	dev->prof = 0;
}

/* A staged entry's log fields: g[0] the first array's bytes, g[1] 1 for
 * an alias, and where the arrays came from (threads, shmem: a's address;
 * g[2]: b's low bits), so that only the same call site's arrays alias
 * (token ids that happen to equal kv slots must not: the next pass would
 * differ and record anew). */
static struct cuda_glog stage_entry(const void *a, uint64_t an, const void *b, uint64_t bn,
    uint64_t boff, uint64_t off, int alias)
{
	const uint64_t pa = (uint64_t)(uintptr_t)a;
	return (struct cuda_glog){ .f = NULL,
		.g = { (uint32_t)an, (uint32_t)alias, (uint32_t)(uintptr_t)b },
		.threads = (uint32_t)pa, .shmem = (uint32_t)(pa >> 32),
		.size = (uint32_t)(boff + bn), .off = off };
}

/* The staged entries this pass logged last (at most STAGE_BACK of them,
 * aliases included: they point at their original's bytes) that hold the
 * bytes of (a, b) from the same arrays, or NULL: every layer stages the
 * same positions, slots and block table, so one copy per pass serves all
 * of them. */
#define STAGE_BACK 8
static const struct cuda_glog *stage_same(const struct baton_dev *dev, const void *a,
    uint64_t an, const void *b, uint64_t bn, uint64_t boff)
{
	const struct cuda_glog want = stage_entry(a, an, b, bn, boff, 0, 0);
	int seen = 0;
	for (uint32_t i = dev->gl_n; i-- > 0 && seen < STAGE_BACK;) {
		const struct cuda_glog *e = &dev->gl[i];
		if (e->f)
			continue;
		seen++;
		const char *h = (const char *)dev->gs_host + e->off;
		if (e->size == want.size && e->g[0] == want.g[0] && e->g[2] == want.g[2] &&
		    e->threads == want.threads && e->shmem == want.shmem && memcmp(h, a, an) == 0 &&
		    (!bn || memcmp(h + boff, b, bn) == 0))
			return e;
	}
	return NULL;
}

int cuda_graph_stage(struct baton_dev *dev, const void *a, uint64_t an, const void *b,
    uint64_t bn, CUdeviceptr *da, CUdeviceptr *db)
{
	const uint64_t boff = cuda_round_up(an, 16), total = cuda_round_up(boff + bn, 16);
	const uint64_t at = dev->gs_off;
	/* An alias (g[1]): the bytes of an array staged earlier in the pass,
	 * read from that copy; a checked pass must have those bytes again. */
	if (dev->gmode == CUDA_G_CHECK && !dev->gfail && dev->gk < dev->gl_n &&
	    !dev->gl[dev->gk].f && dev->gl[dev->gk].g[1]) {
		const struct cuda_glog *e = &dev->gl[dev->gk];
		const char *h = (const char *)dev->gs_host + e->off;
		if (e->size != boff + bn || e->g[0] != an || memcmp(h, a, an) != 0 ||
		    (bn && memcmp(h + boff, b, bn) != 0))
			return differs(dev, "staging");
		dev->gk++;
		*da = dev->gs_dev.p + e->off;
		if (db)
			*db = dev->gs_dev.p + e->off + boff;
		return 0;
	}
	if (dev->gmode == CUDA_G_RECORD && !dev->gfail && an <= UINT32_MAX) {
		const struct cuda_glog *same = stage_same(dev, a, an, b, bn, boff);
		if (same) {
			const uint64_t off = same->off;
			struct cuda_glog *e = log_next(dev);
			if (e)
				*e = stage_entry(a, an, b, bn, boff, off, 1);
			*da = dev->gs_dev.p + off;
			if (db)
				*db = dev->gs_dev.p + off + boff;
			return 0;
		}
	}
	if (at + total > dev->gs_cap) {
		if (dev->gmode == CUDA_G_CHECK)
			return differs(dev, "staging");
		dev->gfail = 1;
		cuda_set_err(dev, "graph staging: %llu bytes do not fit in %llu",
		    (unsigned long long)(at + total), (unsigned long long)dev->gs_cap);
		return BATON_ENOSPC;
	}
	if (dev->gmode == CUDA_G_CHECK) {
		const struct cuda_glog *e = dev->gk < dev->gl_n ? &dev->gl[dev->gk] : NULL;
		if (dev->gfail || !e || e->f || e->g[1] || e->size != boff + bn || e->off != at)
			return differs(dev, "staging");
		dev->gk++;
	}
	char *host = (char *)dev->gs_host + at;
	memcpy(host, a, an);
	if (bn)
		memcpy(host + boff, b, bn);
	if (dev->gmode == CUDA_G_RECORD) {
		CU(dev, dev->d->MemcpyHtoDAsync(dev->gs_dev.p + at, host, boff + bn, dev->stream),
		    "cuMemcpyHtoDAsync (graph staging)");
		struct cuda_glog *e = dev->gfail ? NULL : log_next(dev);
		if (e)
			*e = stage_entry(a, an, b, bn, boff, at, 0);
	}
	dev->gs_off += total;
	*da = dev->gs_dev.p + at;
	if (db)
		*db = dev->gs_dev.p + at + boff;
	return 0;
}

void cuda_glog_free(struct baton_dev *dev)
{
	free(dev->gl);
	free(dev->gl_args);
	free(dev->gtab);
	dev->gl = NULL;
	dev->gl_args = NULL;
	dev->gtab = NULL;
	dev->gl_n = dev->gl_cap = dev->gk = 0;
	dev->gl_args_n = dev->gl_args_cap = dev->gtab_cap = 0;
	dev->gl_ok = 0;
	if (dev->gs_host)
		dev->d->MemFreeHost(dev->gs_host);
	dev->gs_host = NULL;
	dev->gs_cap = dev->gs_off = 0;
	cuda_dbuf_free(dev, &dev->gs_dev);
	if (dev->graph_done)
		dev->d->EventDestroy(dev->graph_done);
	dev->graph_done = NULL;
	dev->g_launched = 0;
}
