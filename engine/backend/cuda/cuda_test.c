/*
 * cuda_test.c: conformance of the `cuda` backend on a real GPU (built only
 * with CUDA=1). Without a driver or a device every case prints "skip: why"
 * and passes, so CI (no GPU) stays green.
 *
 * Cases: device facts; VMM reserve/map/unmap with the memory given back
 * (cuMemGetInfo); out of device memory leaving nothing mapped; a 16 GiB
 * reservation; pinning a read-only MAP_SHARED file (as the arena is) in
 * pieces; batched copies round trip; and the MoE route and experts for
 * f32, f16 and bf16 against a double-precision reference
 * (cuda_moe_fixture.h) and against the host backend (host/host.h), on
 * aligned (vector loads) and misaligned (scalar path) layouts; exact
 * ties; timings. The quantized dtypes' cases are quant_test.c's.
 *
 * Figures are printed as "  fig <name> <value> <unit>" lines.
 *
 * Tolerances (max |gpu - ref| / max |ref| over a layer's output delta,
 * x_out - x_in; weights decode exactly in every dtype, so only the f32
 * accumulation order differs): f32, f16, bf16, q8_0: 1e-4 each (measured
 * on an H200: 1.5e-7 to 3.7e-7 against the double reference and against
 * the host backend, for every dtype); the K-quants the same 1e-4. The
 * decode step's experts at batch 1 on aligned q4_K / q6_K (mmvq.cu, the
 * activations rounded to int8 blocks; off with BATON_CUDA_EXACT=1): 3e-2
 * against the double reference, and the same bits twice. Route weights: 1e-5 absolute.
 * Route ids: equal, except where the two logits at a rank are within
 * 1e-5 of each other (a near tie that f32 rounding may order either way).
 */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/cuda/cuda_moe_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static uint64_t mem_free(struct baton_dev *dev)
{
	uint64_t f = 0, t = 0;
	T_CU(dev, be->mem_info(dev, &f, &t));
	return f;
}

static double mib(int64_t b)
{
	return (double)b / (double)MiB;
}

/* ---- device facts ------------------------------------------------------- */

static void t_device(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	char line[512], uuid[64];
	cuda_backend_describe(dev, line, sizeof line);
	printf("  %s\n", line);
	T_CU(dev, be->uuid(dev, uuid, sizeof uuid));
	printf("  uuid %s\n", uuid);
	T_EQ_INT(strlen(uuid), 40);
	T_ASSERT(strncmp(uuid, "GPU-", 4) == 0);
	T_ASSERT(uuid[12] == '-' && uuid[17] == '-' && uuid[22] == '-' && uuid[27] == '-');
	char small[8];
	T_EQ_ERR(be->uuid(dev, small, sizeof small), BATON_EINVAL);
	uint64_t g = be->granularity(dev);
	T_ASSERT(g >= 4096 && (g & (g - 1)) == 0);
	fig("vmm_granularity", mib((int64_t)g), "MiB");
	uint64_t f = 0, t = 0;
	T_CU(dev, be->mem_info(dev, &f, &t));
	T_ASSERT(t > 0 && f <= t);
	fig("mem_total", mib((int64_t)t), "MiB");
	fig("mem_free", mib((int64_t)f), "MiB");
	for (int dt = 0; dt < BATON_DT_COUNT; dt++)
		T_EQ_INT(be->can_compute(dt), dt == BATON_DT_F32 || dt == BATON_DT_F16 ||
		    dt == BATON_DT_BF16 || dt == BATON_DT_Q8_0 || baton_quant_decodes(dt));
	struct baton_dev *none = NULL;
	char err[256] = "";
	T_EQ_ERR(be->open(999, 0, &none, err, sizeof err), BATON_ENODEV);
	T_ASSERT(none == NULL && strstr(err, "999"));
	be->close(dev);
	be->close(NULL);
}

/* ---- VMM ------------------------------------------------------------------ */

static void t_vmm_map_unmap(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint64_t g = be->granularity(dev), seg = 256 * MiB, nseg = 8;
	const uint64_t range = 16 * GiB; /* a 14 GiB+ range, as a big cache takes */
	baton_dptr base = 0;
	T_CU(dev, be->reserve(dev, range, &base));
	T_ASSERT(base != 0 && base % g == 0);

	/* bad requests change nothing */
	T_EQ_ERR(be->map(dev, base + g / 2, g), BATON_EINVAL);
	T_EQ_ERR(be->map(dev, base, g + 1), BATON_EINVAL);
	T_EQ_ERR(be->map(dev, base + range, g), BATON_EINVAL);
	T_EQ_ERR(be->map(dev, base + range - g, 2 * g), BATON_EINVAL);
	T_EQ_ERR(be->unmap(dev, base, g), BATON_EINVAL);

	const uint64_t f0 = mem_free(dev);
	double t0 = t_now();
	for (uint64_t i = 0; i < nseg; i++)
		T_CU(dev, be->map(dev, base + i * seg, seg));
	double map_s = t_now() - t0;
	T_EQ_ERR(be->map(dev, base + seg, g), BATON_EINVAL); /* overlaps */
	/* the last granule of the range */
	T_CU(dev, be->map(dev, base + range - g, g));
	const uint64_t f1 = mem_free(dev);
	const int64_t used = (int64_t)f0 - (int64_t)f1, want = (int64_t)(nseg * seg + g);
	printf("  mapped %.0f MiB: free fell by %.1f MiB\n", mib(want), mib(used));
	T_ASSERT_MSG(llabs(used - want) <= (int64_t)(16 * MiB), "free fell by %.1f MiB, want %.1f",
	    mib(used), mib(want));
	fig("map_256MiB_segment", map_s / nseg * 1e3, "ms");

	/* the memory works: a pattern through every segment */
	uint8_t *buf = malloc(seg), *back = malloc(seg);
	T_ASSERT(buf && back);
	for (uint64_t i = 0; i < seg; i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	for (uint64_t i = 0; i < nseg; i++) {
		struct baton_copy c = { base + i * seg, buf, seg };
		T_CU(dev, be->copy_h2d(dev, &c, 1));
	}
	T_CU(dev, be->sync(dev));
	for (uint64_t i = 0; i < nseg; i += 3) {
		memset(back, 0, seg);
		T_CU(dev, be->copy_d2h(dev, back, base + i * seg, seg));
		T_ASSERT(memcmp(buf, back, seg) == 0);
	}
	T_EQ_ERR(be->unreserve(dev, base, range), BATON_ESTATE); /* still mapped */
	T_EQ_ERR(be->unmap(dev, base, seg / 2), BATON_EINVAL);  /* not its size */

	t0 = t_now();
	for (uint64_t i = 0; i < nseg; i++)
		T_CU(dev, be->unmap(dev, base + i * seg, seg));
	double unmap_s = t_now() - t0;
	T_CU(dev, be->unmap(dev, base + range - g, g));
	const uint64_t f2 = mem_free(dev);
	printf("  after unmap: free %+.1f MiB against before mapping\n",
	    mib((int64_t)f2 - (int64_t)f0));
	T_ASSERT_MSG(llabs((int64_t)f2 - (int64_t)f0) <= (int64_t)(16 * MiB),
	    "unmap gave back %.1f MiB of %.1f", mib((int64_t)f2 - (int64_t)f1), mib(want));
	fig("unmap_256MiB_segment", unmap_s / nseg * 1e3, "ms");

	/* one big segment: map and unmap time of 8 GiB */
	t0 = t_now();
	T_CU(dev, be->map(dev, base, 8 * GiB));
	fig("map_8GiB_segment", (t_now() - t0) * 1e3, "ms");
	t0 = t_now();
	T_CU(dev, be->unmap(dev, base, 8 * GiB));
	fig("unmap_8GiB_segment", (t_now() - t0) * 1e3, "ms");

	T_CU(dev, be->unreserve(dev, base, range));
	T_EQ_ERR(be->unreserve(dev, base, range), BATON_EINVAL);
	free(buf);
	free(back);
	be->close(dev);
}

/* Out of device memory: the failing map leaves nothing mapped, and what
 * was mapped before comes back on unmap. Also close() with segments left
 * mapped frees them. */
static void t_vmm_oom(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint64_t g = be->granularity(dev);
	uint64_t f0 = 0, total = 0;
	T_CU(dev, be->mem_info(dev, &f0, &total));
	const uint64_t range = (total / g + 64) * g + 32 * GiB;
	baton_dptr base = 0;
	T_CU(dev, be->reserve(dev, range, &base));

	/* more than the whole device at once */
	uint64_t big = (total / g + 1) * g;
	int rc = be->map(dev, base, big);
	printf("  map of %.0f MiB (> total): %s: %s\n", mib((int64_t)big), baton_errname(rc),
	    cuda_backend_last_error(dev));
	T_EQ_ERR(rc, BATON_EDEVMEM);
	T_ASSERT(llabs((int64_t)mem_free(dev) - (int64_t)f0) <= (int64_t)(4 * MiB));

	/* fill with 8 GiB segments, then 1 GiB ones, until the device says no */
	uint64_t at = 0, n8 = 0, n1 = 0;
	double t0 = t_now();
	while ((rc = be->map(dev, base + at, 8 * GiB)) == 0) {
		at += 8 * GiB;
		n8++;
	}
	T_EQ_ERR(rc, BATON_EDEVMEM);
	while ((rc = be->map(dev, base + at, GiB)) == 0) {
		at += GiB;
		n1++;
	}
	const double fill_s = t_now() - t0;
	T_EQ_ERR(rc, BATON_EDEVMEM);
	printf("  filled %llu x 8 GiB + %llu x 1 GiB = %.1f GiB in %.2f s; then: %s\n",
	    (unsigned long long)n8, (unsigned long long)n1, (double)at / GiB, fill_s,
	    cuda_backend_last_error(dev));
	fig("fill_device_GiB_per_s", (double)at / GiB / fill_s, "GiB/s");
	const uint64_t f_full = mem_free(dev);
	T_EQ_ERR(be->map(dev, base + at, GiB), BATON_EDEVMEM);
	T_ASSERT(llabs((int64_t)mem_free(dev) - (int64_t)f_full) <= (int64_t)(4 * MiB));
	fig("free_when_full", mib((int64_t)f_full), "MiB");
	/* with the device full, the kernels still launch (loaded at open) */
	baton_dptr small = 0;
	rc = be->alloc(dev, 64, &small);
	printf("  cuMemAlloc(64) with the device full: %s\n", baton_errname(rc));
	if (rc == 0)
		be->free(dev, small);

	/* give half back by unmap, the rest by close */
	double tu = t_now();
	uint64_t freed = 0;
	for (uint64_t i = 0; i < n8; i += 2) {
		T_CU(dev, be->unmap(dev, base + i * 8 * GiB, 8 * GiB));
		freed += 8 * GiB;
	}
	tu = t_now() - tu;
	if (freed)
		fig("unmap_GiB_per_s", (double)freed / GiB / tu, "GiB/s");
	T_ASSERT(mem_free(dev) >= f_full + freed - 16 * MiB);
	/* A second context holder keeps the primary context alive, so what
	 * close() forgets would still show as used. */
	struct baton_dev *other = cuda_fixture_open();
	be->close(dev); /* unmaps and releases the rest, frees the reservation */
	const uint64_t f_end = mem_free(other);
	printf("  free after close (context kept by another open): %+.1f MiB against the start\n",
	    mib((int64_t)f_end - (int64_t)f0));
	T_ASSERT(llabs((int64_t)f_end - (int64_t)f0) <= (int64_t)(64 * MiB));
	be->close(other);
}

/* ---- host registration and copies ------------------------------------------ */

/* A file of `bytes` filled with a pattern, mapped read-only and shared, as
 * arena_open maps an arena. */
static const uint8_t *ro_file(uint64_t bytes, char *path, size_t len)
{
	const char *dirs[] = { "/dev/shm", getenv("TMPDIR"), "/tmp" };
	for (size_t d = 0; d < 3; d++) {
		if (!dirs[d])
			continue;
		snprintf(path, len, "%s/baton-cuda-test-%d", dirs[d], (int)getpid());
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (fd < 0)
			continue;
		uint64_t chunk = 16 * MiB;
		uint8_t *buf = malloc(chunk);
		T_ASSERT(buf);
		int ok = 1;
		for (uint64_t off = 0; off < bytes && ok; off += chunk) {
			for (uint64_t i = 0; i < chunk; i += 8) {
				uint64_t v = (off + i) * 0x9e3779b97f4a7c15ull;
				memcpy(buf + i, &v, 8);
			}
			uint64_t n = bytes - off < chunk ? bytes - off : chunk;
			ok = write(fd, buf, n) == (ssize_t)n;
		}
		free(buf);
		if (!ok) {
			close(fd);
			unlink(path);
			continue;
		}
		void *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
		close(fd);
		T_ASSERT(p != MAP_FAILED);
		return p;
	}
	T_FAIL("no room for a %llu byte test file", (unsigned long long)bytes);
}

static void t_host_register_copy(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint64_t bytes = 1 * GiB, g = be->granularity(dev);
	char path[256];
	const uint8_t *src = ro_file(bytes, path, sizeof path);

	baton_dptr base = 0;
	T_CU(dev, be->reserve(dev, bytes, &base));
	T_CU(dev, be->map(dev, base, (bytes + g - 1) / g * g));

	/* pageable first (before registration), as a baseline */
	struct baton_copy whole = { base, src, bytes };
	T_CU(dev, be->copy_h2d(dev, &whole, 1));
	T_CU(dev, be->sync(dev));
	double t0 = t_now();
	T_CU(dev, be->copy_h2d(dev, &whole, 1));
	T_CU(dev, be->sync(dev));
	fig("h2d_pageable_1GiB", (double)bytes / 1e9 / (t_now() - t0), "GB/s");

	/* pinned in 256 MiB pieces (the default is 4 GiB) */
	cuda_backend_set_register_piece(dev, 256 * MiB);
	t0 = t_now();
	T_CU(dev, be->host_register(dev, src, bytes));
	fig("host_register_1GiB", (t_now() - t0) * 1e3, "ms");
	T_EQ_ERR(be->host_register(dev, src, bytes), BATON_EEXIST);

	double best = 0;
	for (int rep = 0; rep < 3; rep++) {
		t0 = t_now();
		T_CU(dev, be->copy_h2d(dev, &whole, 1));
		T_CU(dev, be->sync(dev));
		double gbs = (double)bytes / 1e9 / (t_now() - t0);
		best = gbs > best ? gbs : best;
	}
	fig("h2d_pinned_1GiB_one_copy", best, "GB/s");

	/* a batch of 4 MiB copies, as a refill issues them */
	const size_t nb = bytes / (4 * MiB);
	struct baton_copy *batch = calloc(nb, sizeof *batch);
	T_ASSERT(batch);
	for (size_t i = 0; i < nb; i++) /* reversed, so order matters for nothing */
		batch[i] = (struct baton_copy){ base + (nb - 1 - i) * 4 * MiB,
			src + (nb - 1 - i) * 4 * MiB, 4 * MiB };
	best = 0;
	for (int rep = 0; rep < 3; rep++) {
		t0 = t_now();
		T_CU(dev, be->copy_h2d(dev, batch, nb));
		T_CU(dev, be->sync(dev));
		double gbs = (double)bytes / 1e9 / (t_now() - t0);
		best = gbs > best ? gbs : best;
	}
	fig("h2d_pinned_batch_4MiB", best, "GB/s");

	/* odd sizes and offsets, then read everything back */
	struct baton_copy odd[3] = {
		{ base + 1, src + 1, 4095 },
		{ base + 12345, src + 12345, 3 * MiB + 17 },
		{ base + bytes - 7, src + bytes - 7, 7 },
	};
	T_CU(dev, be->copy_h2d(dev, odd, 3));
	uint8_t *back = malloc(bytes);
	T_ASSERT(back);
	t0 = t_now();
	T_CU(dev, be->copy_d2h(dev, back, base, bytes));
	fig("d2h_pageable_1GiB", (double)bytes / 1e9 / (t_now() - t0), "GB/s");
	T_ASSERT(memcmp(back, src, bytes) == 0);
	/* a decode step's logits (151,936 floats), through the pinned stage
	 * to pageable memory: the best of 20, and the bytes */
	const uint64_t lb = 151936 * 4;
	double lbest = 1e9;
	for (int r = 0; r < 20; r++) {
		memset(back, 0, lb);
		t0 = t_now();
		T_CU(dev, be->copy_d2h(dev, back + 3, base + 12345, lb));
		const double t = t_now() - t0;
		lbest = t < lbest ? t : lbest;
		T_ASSERT(memcmp(back + 3, src + 12345, lb) == 0);
	}
	fig("d2h_logits_600KB", lbest * 1e6, "us");
	free(back);
	free(batch);

	T_EQ_ERR(be->host_unregister(dev, src + 4096, bytes - 4096), BATON_ENOTFOUND);
	T_CU(dev, be->host_unregister(dev, src, bytes));
	T_EQ_ERR(be->host_unregister(dev, src, bytes), BATON_ENOTFOUND);
	/* registered again with the default (one piece) and left for close() */
	cuda_backend_set_register_piece(dev, 0);
	T_CU(dev, be->host_register(dev, src, bytes));
	T_CU(dev, be->unmap(dev, base, (bytes + g - 1) / g * g));
	T_CU(dev, be->unreserve(dev, base, bytes));
	be->close(dev);
	munmap((void *)(uintptr_t)src, bytes);
	unlink(path);
}


static void t_moe_f32(void)
{
	check_layer(BATON_DT_F32, 5, 256, 96, 16, 4, 0);
	check_layer(BATON_DT_F32, 3, 96, 64, 8, 2, 1);
	check_layer(BATON_DT_F32, 20, 128, 64, 4, 2, 0); /* 10 tokens per expert: chunks of 8 */
}

static void t_moe_f16(void)
{
	check_layer(BATON_DT_F16, 5, 256, 96, 16, 4, 0);
	check_layer(BATON_DT_F16, 3, 96, 64, 8, 2, 1);
	check_layer(BATON_DT_F16, 1, 512, 128, 32, 8, 0);
}

static void t_moe_bf16(void)
{
	check_layer(BATON_DT_BF16, 5, 256, 96, 16, 4, 0);
	check_layer(BATON_DT_BF16, 3, 96, 64, 8, 2, 1);
	check_layer(BATON_DT_BF16, 20, 128, 64, 4, 2, 0);
}

/* Exact ties (duplicate router rows give bitwise equal logits): ids in
 * rank order with the lower id first, as the host backend ranks them. */
static void t_route_ties(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const int dts[] = { BATON_DT_F32, BATON_DT_BF16, BATON_DT_Q8_0, BATON_DT_Q4_K };
	for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
		struct layer L;
		layer_make(&L, 6, baton_kquant_is(dts[d]) ? 256 : 128, baton_kquant_is(dts[d]) ? 256 : 32, 12, 5,
		    dts[d], 0);
		const uint64_t rb = rowb(dts[d], L.D);
		for (uint32_t e = 4; e < L.E; e++) /* rows 4.. repeat rows 0..3 */
			memcpy(L.router + e * rb, L.router + (e % 4) * rb, rb);
		layer_upload(dev, &L);
		const size_t BK = (size_t)L.B * L.K, BD = (size_t)L.B * L.D;
		uint32_t ids[64], hids[64];
		float w[64], hw[64], *hx = malloc(BD * 4), *hxn = malloc(BD * 4);
		T_ASSERT(BK <= 64 && hx && hxn);
		struct baton_moe_layer gl = layer_desc(&L, 1, NULL, NULL);
		T_CU(dev, be->moe_route(dev, &gl, ids, w));
		memcpy(hx, L.x, BD * 4);
		struct baton_moe_layer hl = layer_desc(&L, 0, hx, hxn);
		T_OK(host_moe_route(NULL, &hl, hids, hw));
		for (size_t i = 0; i < BK; i++) {
			T_ASSERT_MSG(ids[i] == hids[i], "%s pair %zu: gpu id %u, host %u",
			    dt_name(dts[d]), i, ids[i], hids[i]);
			if (i % L.K)
				T_ASSERT(w[i] <= w[i - 1]);
		}
		for (uint32_t t = 0; t < L.B; t++) /* e and e+4 tie: lower first, adjacent */
			for (uint32_t k = 0; k + 1 < L.K; k++) {
				uint32_t a = ids[t * L.K + k], b = ids[t * L.K + k + 1];
				if (a % 4 == b % 4)
					T_ASSERT(a < b && w[t * L.K + k] == w[t * L.K + k + 1]);
			}
		free(hx), free(hxn);
		layer_free(dev, &L);
	}
	be->close(dev);
}

/* ---- timings -------------------------------------------------------------- */

/* A layer of Qwen3-30B-A3B's shape (d_model 2048, d_ff 768, 128 experts,
 * top 8) with random weights; route + experts per decode step. */
static void perf_layer(struct baton_dev *dev, int dt, uint32_t B)
{
	const uint32_t D = 2048, F = 768, E = 128, K = 8;
	struct layer L;
	memset(&L, 0, sizeof L);
	L.B = B, L.D = D, L.F = F, L.E = E, L.K = K, L.dt = dt, L.norm_dt = BATON_DT_F32;
	L.gate_off = 0;
	L.up_off = up4k(rowb(dt, D) * F);
	L.down_off = L.up_off + up4k(rowb(dt, D) * F);
	L.blob_bytes = L.down_off + rowb(dt, F) * D;
	L.stride = up4k(L.blob_bytes);
	/* one expert's worth of valid random rows, copied to every expert */
	uint8_t *one = calloc(1, L.stride);
	double *v = malloc(D * sizeof *v);
	T_ASSERT(one && v);
	for (uint32_t r = 0; r < F; r++) {
		for (uint32_t i = 0; i < D; i++)
			v[i] = urand() / 20;
		encode_row(dt, v, D, one + L.gate_off + r * rowb(dt, D));
		encode_row(dt, v, D, one + L.up_off + r * rowb(dt, D));
	}
	for (uint32_t r = 0; r < D; r++) {
		for (uint32_t i = 0; i < F; i++)
			v[i] = urand() / 20;
		encode_row(dt, v, F, one + L.down_off + r * rowb(dt, F));
	}
	L.router = calloc(E, rowb(dt, D));
	L.norm = calloc(1, 4 * D);
	L.x = calloc((size_t)B * D, 4);
	T_ASSERT(L.router && L.norm && L.x);
	for (uint32_t e = 0; e < E; e++) {
		for (uint32_t i = 0; i < D; i++)
			v[i] = urand();
		encode_row(dt, v, D, L.router + e * rowb(dt, D));
	}
	for (uint32_t i = 0; i < D; i++)
		((float *)L.norm)[i] = 1;
	for (size_t i = 0; i < (size_t)B * D; i++)
		L.x[i] = (float)urand();

	const uint64_t g = be->granularity(dev);
	L.d_range = (E * L.stride + g - 1) / g * g;
	T_CU(dev, be->reserve(dev, L.d_range, &L.d_base));
	T_CU(dev, be->map(dev, L.d_base, L.d_range));
	L.d_blobs = L.d_base;
	for (uint32_t e = 0; e < E; e++) {
		struct baton_copy c = { L.d_blobs + e * L.stride, one, L.stride };
		T_CU(dev, be->copy_h2d(dev, &c, 1));
	}
	T_CU(dev, be->alloc(dev, E * rowb(dt, D), &L.d_router));
	T_CU(dev, be->alloc(dev, 4 * D, &L.d_norm));
	T_CU(dev, be->alloc(dev, (uint64_t)B * D * 4, &L.d_x));
	T_CU(dev, be->alloc(dev, (uint64_t)B * D * 4, &L.d_xn));
	struct baton_copy c[3] = {
		{ L.d_router, L.router, E * rowb(dt, D) },
		{ L.d_norm, L.norm, 4 * D },
		{ L.d_x, L.x, (uint64_t)B * D * 4 },
	};
	T_CU(dev, be->copy_h2d(dev, c, 3));
	T_CU(dev, be->sync(dev));

	struct baton_moe_layer l = layer_desc(&L, 1, NULL, NULL);
	l.norm_dtype = BATON_DT_F32;
	uint32_t *ids = calloc((size_t)B * K, 4);
	float *w = calloc((size_t)B * K, 4);
	baton_dptr *blobs = calloc((size_t)B * K, sizeof *blobs);
	T_ASSERT(ids && w && blobs);
	/* distinct experts per token where possible, the decode worst case:
	 * every pair reads its own weights */
	for (size_t i = 0; i < (size_t)B * K; i++) {
		blobs[i] = L.d_blobs + (i % E) * L.stride;
		w[i] = 1.0f / K;
	}
	uint32_t uniq = B * K < E ? B * K : E;
	const double bytes = (double)uniq * (double)L.blob_bytes;
	const int iters = 200;
	T_CU(dev, be->moe_experts(dev, &l, blobs, w)); /* warm */
	T_CU(dev, be->sync(dev));
	double t0 = t_now();
	for (int i = 0; i < iters; i++)
		T_CU(dev, be->moe_experts(dev, &l, blobs, w));
	T_CU(dev, be->sync(dev));
	double ex = (t_now() - t0) / iters;
	t0 = t_now();
	for (int i = 0; i < iters; i++)
		T_CU(dev, be->moe_route(dev, &l, ids, w));
	double ro = (t_now() - t0) / iters;
	/* a decode step's layer: route, then the experts it chose */
	t0 = t_now();
	for (int i = 0; i < iters; i++) {
		T_CU(dev, be->moe_route(dev, &l, ids, w));
		for (size_t j = 0; j < (size_t)B * K; j++)
			blobs[j] = L.d_blobs + ids[j] * L.stride;
		T_CU(dev, be->moe_experts(dev, &l, blobs, w));
	}
	T_CU(dev, be->sync(dev));
	double step = (t_now() - t0) / iters;
	char name[96];
	printf("  %s B=%u: experts %.1f us (%u distinct experts, %.1f MB, %.0f GB/s), "
	       "route %.1f us, route+experts %.1f us\n",
	    dt_name(dt), B, ex * 1e6, uniq, bytes / 1e6, bytes / ex / 1e9, ro * 1e6, step * 1e6);
	snprintf(name, sizeof name, "experts_%s_B%u", dt_name(dt), B);
	fig(name, ex * 1e6, "us");
	snprintf(name, sizeof name, "experts_%s_B%u_bandwidth", dt_name(dt), B);
	fig(name, bytes / ex / 1e9, "GB/s");
	snprintf(name, sizeof name, "layer_step_%s_B%u", dt_name(dt), B);
	fig(name, step * 1e6, "us");
	free(ids), free(w), free(blobs), free(one), free(v);
	layer_free(dev, &L);
}

static void t_moe_perf(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const int dts[] = { BATON_DT_BF16, BATON_DT_Q8_0, BATON_DT_F32, BATON_DT_Q4_K, BATON_DT_Q6_K };
	const uint32_t bs[] = { 1, 4, 16, 64 };
	for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
		for (size_t j = 0; j < 4; j++)
			perf_layer(dev, dts[i], bs[j]);
	be->close(dev);
}

T_MAIN(T_CASE(t_device), T_CASE_TIMEOUT(t_vmm_map_unmap, 60),
    T_CASE_TIMEOUT(t_host_register_copy, 90), T_CASE_TIMEOUT(t_moe_f32, 60),
    T_CASE_TIMEOUT(t_moe_f16, 60), T_CASE_TIMEOUT(t_moe_bf16, 60),
    T_CASE_TIMEOUT(t_route_ties, 60),
    T_CASE_TIMEOUT(t_moe_perf, 120),
    T_CASE_TIMEOUT(t_vmm_oom, 90))
