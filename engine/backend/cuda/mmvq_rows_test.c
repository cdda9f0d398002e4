/*
 * mmvq_rows_test.c: the matmuls of passes of 2 to 64 rows
 * (mmvq_rows.cu) through the backend table as the model calls them.
 * Built only with CUDA=1; without a driver or a device every case prints
 * "skip: why" and passes.
 *
 * What must agree how:
 *   - q4_K / q6_K (int8 x): each row of a pass the bits of the same row
 *     alone (the batch-1 GEMV, mmvq.cu), whatever the pass's rows (2 to
 *     63: tiles of 2, 4, 8 and 16 and their remainders), with bias and
 *     accumulate, widths of 1 to 16 blocks and more than 65,536 outputs
 *     (the head's 32 threads a row); within 2e-5 of the host on x
 *     quantized as mmvq.cu does; the same bits twice.
 *   - matmuls (q, k and v in one launch): each matrix the bits of its own
 *     matmul call.
 *   - f32 (the routers; the kernel is opt-in, BATON_CUDA_VR_F32=1): bit for
 *     bit the host's, at 2 to 64 rows.
 *   - after a multi-row rmsnorm, which writes its rows' int8 blocks itself:
 *     the bits of the same matmuls quantizing xn themselves.
 *   - BATON_CUDA_EXACT=1: q4_K / q6_K bit for bit the host's (ops.cu).
 * t_perf_rows prints timings at Qwen3-30B-A3B's shapes; it asserts nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

static const struct baton_backend *be = &baton_backend_cuda;
static size_t g_not_alone; /* outputs of a pass not the bits of their row alone */

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

static float frand(void)
{
	return (float)((double)(rnd() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *rvec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	T_ASSERT(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

static baton_dptr H(const void *p)
{
	return (baton_dptr)(uintptr_t)p;
}

static void fig(const char *name, double v)
{
	printf("  fig %-44s %12.6g\n", name, v);
	fflush(stdout);
}

static baton_dptr up(struct baton_dev *dev, const void *p, uint64_t n)
{
	baton_dptr d = 0;
	T_CU(dev, be->alloc(dev, n, &d));
	struct baton_copy c = { d, p, n };
	T_CU(dev, be->copy_h2d(dev, &c, 1));
	T_CU(dev, be->sync(dev));
	return d;
}

static void down(struct baton_dev *dev, void *p, baton_dptr d, uint64_t n)
{
	T_CU(dev, be->sync(dev));
	T_CU(dev, be->copy_d2h(dev, p, d, n));
}

/* rows x cols random weights: f32 or bf16 (biases), or q4_K / q6_K with
 * any bytes for the quants and sane f16 scales. */
static uint8_t *weights(int dt, uint32_t rows, uint32_t cols, uint64_t *bytes)
{
	const uint64_t rb = baton_compute_row_bytes(dt, cols);
	T_ASSERT(rb);
	uint8_t *w = malloc(rows * rb);
	T_ASSERT(w);
	*bytes = rows * rb;
	for (uint64_t i = 0; i < rows * rb; i++)
		w[i] = (uint8_t)rnd();
	for (uint32_t r = 0; r < rows; r++) {
		uint8_t *row = w + r * rb;
		if (dt == BATON_DT_F32 || dt == BATON_DT_BF16) {
			for (uint32_t i = 0; i < cols; i++) {
				float f = frand();
				uint16_t h = baton_f32_to_bf16(f);
				if (dt == BATON_DT_F32)
					memcpy(row + 4 * i, &f, 4);
				else
					memcpy(row + 2 * i, &h, 2);
			}
			continue;
		}
		for (uint32_t b = 0; b < cols / 256; b++) {
			uint8_t *blk = row + b * (rb / (cols / 256));
			uint16_t d = baton_f32_to_f16(frand() / 200), m = baton_f32_to_f16(frand() / 50);
			if (dt == BATON_DT_Q6_K) {
				memcpy(blk + 208, &d, 2);
			} else {
				memcpy(blk, &d, 2);
				memcpy(blk + 2, &m, 2);
			}
		}
	}
	return w;
}

static int same_bits(const float *got, const float *want, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&got[i], &want[i], 4) != 0) {
			T_FAIL("%s[%zu]: %.9g, want %.9g (not the same bits)", what, i, got[i], want[i]);
			return 0;
		}
	return 1;
}

static void close_to(const float *got, const float *want, size_t n, double tol, const char *what)
{
	double md = 0, mw = 1;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (!(d <= md))
			md = isnan(d) ? INFINITY : d;
		if (fabs(want[i]) > mw)
			mw = fabs(want[i]);
	}
	T_ASSERT_MSG(md / mw <= tol, "%s: max |cuda - host| %.3g of scale %.3g (> %g)", what, md, mw,
	    tol);
}

/* x as mmvq.cu quantizes it, back in f32 (ops_test.c's quant_q8). */
static void quant_q8(const float *x, float *xq, size_t n)
{
	for (size_t b = 0; b < n; b += 32) {
		float m = 0;
		for (size_t i = b; i < b + 32; i++)
			m = fmaxf(m, fabsf(x[i]));
		const float d = m / 127.0f;
		for (size_t i = b; i < b + 32; i++) {
			float q = m > 0 ? nearbyintf(x[i] / d) : 0;
			q = q > 127 ? 127 : q < -127 ? -127 : q;
			xq[i] = q * d;
		}
	}
}

/* One pass of `rows` rows on dt weights (n_out x k, bias, accumulate):
 * each row the bits of the same row through a one-row call; the pass
 * twice the same bits; within 2e-5 of the host on the quantized rows. */
static void rows_case(struct baton_dev *dev, int dt, uint32_t n_out, uint32_t k, uint32_t rows,
    int bias_dt, int acc)
{
	uint64_t wb, bb = 0;
	uint8_t *w = weights(dt, n_out, k, &wb);
	uint8_t *b = bias_dt >= 0 ? weights(bias_dt, 1, n_out, &bb) : NULL;
	const size_t nx = (size_t)rows * k, ny = (size_t)rows * n_out;
	float *x = rvec(nx), *xq = malloc(nx * 4), *y = rvec(ny);
	float *got = malloc(ny * 4), *got2 = malloc(ny * 4), *one = malloc(ny * 4);
	float *want = malloc(ny * 4);
	T_ASSERT(xq && got && got2 && one && want);
	for (size_t i = 0; i < nx; i++)
		x[i] *= 1.0f + (float)(i % 7); /* blocks of unequal scale */
	quant_q8(x, xq, nx);
	baton_dptr dw = up(dev, w, wb), dx = up(dev, x, nx * 4), dy = up(dev, y, ny * 4);
	baton_dptr db = b ? up(dev, b, bb) : 0;
	const uint32_t bdt = (uint32_t)(b ? bias_dt : 0);
	for (int run = 0; run < 2; run++) {
		struct baton_copy yc = { dy, y, ny * 4 };
		T_CU(dev, be->copy_h2d(dev, &yc, 1));
		T_CU(dev, be->matmul(dev, dw, (uint32_t)dt, n_out, k, db, bdt, dx, rows, dy, acc));
		down(dev, run ? got2 : got, dy, ny * 4);
	}
	char what[96];
	snprintf(what, sizeof what, "rows %s n=%u k=%u rows=%u", baton_dtype_name(dt), n_out, k, rows);
	T_ASSERT_MSG(memcmp(got, got2, ny * 4) == 0, "%s: two runs differ", what);
	/* each row alone: the batch-1 path */
	struct baton_copy yc = { dy, y, ny * 4 };
	T_CU(dev, be->copy_h2d(dev, &yc, 1));
	for (uint32_t r = 0; r < rows; r++)
		T_CU(dev, be->matmul(dev, dw, (uint32_t)dt, n_out, k, db, bdt,
		    dx + (uint64_t)r * k * 4, 1, dy + (uint64_t)r * n_out * 4, acc));
	down(dev, one, dy, ny * 4);
	if (dt == BATON_DT_F32) {
		memcpy(want, y, ny * 4);
		T_OK(host_op_matmul(NULL, H(w), (uint32_t)dt, n_out, k, H(b), bdt, H(x), rows, H(want),
		    acc));
		same_bits(got, want, ny, what);
	} else {
		memcpy(want, y, ny * 4);
		T_OK(host_op_matmul(NULL, H(w), (uint32_t)dt, n_out, k, H(b), bdt, H(xq), rows,
		    H(want), acc));
		close_to(got, want, ny, 2e-5, what);
	}
	/* counted, not failed at once, so that every case prints its figure */
	size_t bad = 0;
	double md = 0;
	for (size_t i = 0; i < ny; i++)
		if (memcmp(&got[i], &one[i], 4) != 0) {
			bad++;
			md = fmax(md, fabs((double)got[i] - one[i]));
		}
	if (bad) {
		printf("  %s: %zu of %zu outputs not the bits of the row alone (max diff %.3g)\n", what,
		    bad, ny, md);
		g_not_alone += bad;
	}
	be->free(dev, dw), be->free(dev, dx), be->free(dev, dy);
	if (db)
		be->free(dev, db);
	free(w), free(b), free(x), free(xq), free(y), free(got), free(got2), free(one), free(want);
}

static void t_rows_quant(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const int dts[] = { BATON_DT_Q4_K, BATON_DT_Q6_K };
	for (size_t i = 0; i < 2; i++) {
		const int dt = dts[i];
		/* widths of 1, 3, 8 and 16 blocks (32, 64, 128 threads a row,
		 * and a row that loops), every tile and a remainder */
		rows_case(dev, dt, 37, 256, 2, -1, 0);
		rows_case(dev, dt, 37, 768, 3, BATON_DT_F32, 0);
		rows_case(dev, dt, 301, 2048, 5, -1, 1);
		rows_case(dev, dt, 19, 4096, 8, BATON_DT_BF16, 1);
		rows_case(dev, dt, 130, 2048, 11, -1, 0);
		rows_case(dev, dt, 64, 2048, 16, BATON_DT_F32, 0);
		rows_case(dev, dt, 33, 4096, 17, -1, 1);
		rows_case(dev, dt, 21, 512, 63, -1, 0);
	}
	/* the head's shape of more than 65,536 outputs: 32 threads a row */
	rows_case(dev, BATON_DT_Q6_K, 65600, 256, 16, -1, 0);
	rows_case(dev, BATON_DT_Q4_K, 65600, 512, 5, -1, 0);
	be->close(dev);
	T_ASSERT_MSG(g_not_alone == 0, "%zu outputs differ from their row alone", g_not_alone);
}

static void t_rows_f32(void)
{
	T_ASSERT(setenv("BATON_CUDA_VR_F32", "1", 1) == 0); /* the kernel is opt-in */
	struct baton_dev *dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_VR_F32");
	/* the router's shape; bias, accumulate, more than one tile */
	rows_case(dev, BATON_DT_F32, 128, 2048, 2, -1, 0);
	rows_case(dev, BATON_DT_F32, 128, 2048, 16, -1, 0);
	rows_case(dev, BATON_DT_F32, 60, 64, 7, BATON_DT_F32, 1);
	rows_case(dev, BATON_DT_F32, 128, 2048, 33, -1, 0);
	rows_case(dev, BATON_DT_F32, 33, 96, 64, BATON_DT_BF16, 1);
	be->close(dev);
	T_ASSERT_MSG(g_not_alone == 0, "%zu outputs differ from their row alone", g_not_alone);
}

/* q, k and v over one x in one launch: each matrix the bits of its own
 * matmul; a matrix off the path (f32) sends all three to their own calls,
 * still their bits. */
static void t_rows_matmuls(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t k = 2048, no[3] = { 300, 64, 64 };
	const int dts[2][3] = { { BATON_DT_Q4_K, BATON_DT_Q4_K, BATON_DT_Q6_K },
		{ BATON_DT_Q4_K, BATON_DT_F32, BATON_DT_Q6_K } };
	const uint32_t rs[] = { 2, 5, 16, 40 };
	uint64_t bb;
	uint8_t *bias = weights(BATON_DT_F32, 1, no[1], &bb);
	baton_dptr dbias = up(dev, bias, bb);
	float *x = rvec((size_t)40 * k);
	baton_dptr dx = up(dev, x, (uint64_t)40 * k * 4);
	for (int c = 0; c < 2; c++) {
		baton_dptr dw0[3], dw[3], dy[3], dz[3];
		uint8_t *w[3];
		struct baton_matmuls mm = { .x = dx, .k = k, .n = 3 };
		for (int i = 0; i < 3; i++) {
			uint64_t wb;
			w[i] = weights(dts[c][i], no[i], k, &wb);
			const uint32_t off = dts[c][i] == BATON_DT_Q6_K ? 2 : 0;
			T_CU(dev, be->alloc(dev, wb + 16, &dw0[i]));
			dw[i] = dw0[i] + off;
			struct baton_copy wc = { dw[i], w[i], wb };
			T_CU(dev, be->copy_h2d(dev, &wc, 1));
			T_CU(dev, be->alloc(dev, (uint64_t)40 * no[i] * 4, &dy[i]));
			T_CU(dev, be->alloc(dev, (uint64_t)40 * no[i] * 4, &dz[i]));
			mm.m[i] = (struct baton_matmul_out){ .w = dw[i], .b = i == 1 ? dbias : 0,
				.y = dy[i], .w_dtype = (uint32_t)dts[c][i], .b_dtype = BATON_DT_F32,
				.n_out = no[i] };
		}
		for (size_t ri = 0; ri < sizeof rs / sizeof rs[0]; ri++) {
			const uint32_t rows = rs[ri];
			mm.rows = rows;
			T_CU(dev, be->matmuls(dev, &mm));
			for (int i = 0; i < 3; i++)
				T_CU(dev, be->matmul(dev, dw[i], (uint32_t)dts[c][i], no[i], k, mm.m[i].b,
				    BATON_DT_F32, dx, rows, dz[i], 0));
			for (int i = 0; i < 3; i++) {
				const size_t n = (size_t)rows * no[i];
				float *a = malloc(n * 4), *b = malloc(n * 4);
				T_ASSERT(a && b);
				down(dev, a, dy[i], n * 4);
				down(dev, b, dz[i], n * 4);
				char what[64];
				snprintf(what, sizeof what, "matmuls case %d, %u rows, matrix %d", c, rows, i);
				same_bits(a, b, n, what);
				free(a), free(b);
			}
		}
		for (int i = 0; i < 3; i++) {
			be->free(dev, dw0[i]), be->free(dev, dy[i]), be->free(dev, dz[i]);
			free(w[i]);
		}
	}
	be->free(dev, dbias), be->free(dev, dx);
	free(bias), free(x);
	be->close(dev);
}

/* A multi-row rmsnorm writes its rows' int8 blocks for the matmuls after
 * it (no quantize launch): q, k and v (matmuls) and a matmul on that xn
 * give the bits of the same calls quantizing xn themselves (after a launch
 * that keeps nothing); an xn rewritten by a copy is quantized anew. */
static void t_rows_norm_quant(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t k = 2048, rows = 16, no[3] = { 256, 64, 64 };
	uint64_t nb, wb[3];
	uint8_t *nw = weights(BATON_DT_F32, 1, k, &nb), *w[3];
	float *x = rvec((size_t)rows * k);
	for (size_t i = 0; i < (size_t)rows * k; i++)
		x[i] *= 1.0f + (float)(i % 5);
	baton_dptr dnw = up(dev, nw, nb), dx = up(dev, x, (uint64_t)rows * k * 4), dn = 0;
	baton_dptr dsc = up(dev, x, 64 * 4), dw[3], dy[2][3];
	T_CU(dev, be->alloc(dev, (uint64_t)rows * k * 4, &dn));
	const int dts[3] = { BATON_DT_Q4_K, BATON_DT_Q6_K, BATON_DT_Q4_K };
	for (int i = 0; i < 3; i++) {
		w[i] = weights(dts[i], no[i], k, &wb[i]);
		dw[i] = up(dev, w[i], wb[i]);
		for (int h = 0; h < 2; h++)
			T_CU(dev, be->alloc(dev, (uint64_t)rows * no[i] * 4, &dy[h][i]));
	}
	for (int h = 0; h < 2; h++) {
		T_CU(dev, be->rmsnorm(dev, dx, dn, rows, k, dnw, BATON_DT_F32, 1e-6f));
		if (h) /* another launch, not on dn: the matmuls quantize dn themselves */
			T_CU(dev, be->rmsnorm(dev, dsc, dsc, 1, 64, 0, 0, 1e-6f));
		struct baton_matmuls mm = { .x = dn, .rows = rows, .k = k, .n = 2 };
		for (int i = 0; i < 2; i++)
			mm.m[i] = (struct baton_matmul_out){ .w = dw[i], .y = dy[h][i],
				.w_dtype = (uint32_t)dts[i], .n_out = no[i] };
		T_CU(dev, be->matmuls(dev, &mm));
		T_CU(dev, be->matmul(dev, dw[2], (uint32_t)dts[2], no[2], k, 0, 0, dn, rows, dy[h][2], 0));
	}
	for (int i = 0; i < 3; i++) {
		const size_t n = (size_t)rows * no[i];
		float *a = malloc(n * 4), *b = malloc(n * 4);
		T_ASSERT(a && b);
		down(dev, a, dy[0][i], n * 4);
		down(dev, b, dy[1][i], n * 4);
		char what[64];
		snprintf(what, sizeof what, "matrix %d on the norm's own int8 rows", i);
		same_bits(a, b, n, what);
		free(a), free(b);
	}
	/* dn rewritten by a copy: quantized anew, not the norm's blocks */
	float *x2 = rvec((size_t)rows * k), *got = malloc((size_t)rows * no[0] * 4);
	float *xq = malloc((size_t)rows * k * 4), *want = calloc((size_t)rows * no[0], 4);
	T_ASSERT(got && xq && want);
	T_CU(dev, be->rmsnorm(dev, dx, dn, rows, k, dnw, BATON_DT_F32, 1e-6f));
	struct baton_copy c = { dn, x2, (uint64_t)rows * k * 4 };
	T_CU(dev, be->copy_h2d(dev, &c, 1));
	T_CU(dev, be->matmul(dev, dw[0], (uint32_t)dts[0], no[0], k, 0, 0, dn, rows, dy[0][0], 0));
	down(dev, got, dy[0][0], (uint64_t)rows * no[0] * 4);
	quant_q8(x2, xq, (size_t)rows * k);
	T_OK(host_op_matmul(NULL, H(w[0]), (uint32_t)dts[0], no[0], k, 0, 0, H(xq), rows, H(want), 0));
	close_to(got, want, (size_t)rows * no[0], 2e-5, "matmul after dn was rewritten");
	for (int i = 0; i < 3; i++) {
		be->free(dev, dw[i]), be->free(dev, dy[0][i]), be->free(dev, dy[1][i]);
		free(w[i]);
	}
	be->free(dev, dnw), be->free(dev, dx), be->free(dev, dn), be->free(dev, dsc);
	free(nw), free(x), free(x2), free(got), free(xq), free(want);
	be->close(dev);
}

/* BATON_CUDA_EXACT=1: passes of a few rows on q4_K / q6_K are ops.cu's
 * exact kernels again, the host's bits. */
static void t_rows_exact(void)
{
	T_ASSERT(setenv("BATON_CUDA_EXACT", "1", 1) == 0);
	struct baton_dev *dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_EXACT");
	const int dts[] = { BATON_DT_Q4_K, BATON_DT_Q6_K };
	for (size_t i = 0; i < 2; i++) {
		const uint32_t n_out = 45, k = 512, rows = 16;
		uint64_t wb;
		uint8_t *w = weights(dts[i], n_out, k, &wb);
		float *x = rvec((size_t)rows * k), *got = malloc((size_t)rows * n_out * 4);
		float *want = malloc((size_t)rows * n_out * 4);
		T_ASSERT(got && want);
		baton_dptr dw = up(dev, w, wb), dx = up(dev, x, (uint64_t)rows * k * 4), dy = 0;
		T_CU(dev, be->alloc(dev, (uint64_t)rows * n_out * 4, &dy));
		T_CU(dev, be->matmul(dev, dw, (uint32_t)dts[i], n_out, k, 0, 0, dx, rows, dy, 0));
		down(dev, got, dy, (uint64_t)rows * n_out * 4);
		T_OK(host_op_matmul(NULL, H(w), (uint32_t)dts[i], n_out, k, 0, 0, H(x), rows, H(want), 0));
		same_bits(got, want, (size_t)rows * n_out, "exact rows");
		be->free(dev, dw), be->free(dev, dx), be->free(dev, dy);
		free(w), free(x), free(got), free(want);
	}
	be->close(dev);
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* us a call (50 calls back to back, one sync) of a matmul of `rows`. */
static double time_mm(struct baton_dev *dev, baton_dptr w, int dt, uint32_t n_out, uint32_t k,
    baton_dptr x, uint32_t rows, baton_dptr y)
{
	T_CU(dev, be->matmul(dev, w, (uint32_t)dt, n_out, k, 0, 0, x, rows, y, 0));
	T_CU(dev, be->sync(dev));
	const double t0 = now_s();
	for (int i = 0; i < 50; i++)
		T_CU(dev, be->matmul(dev, w, (uint32_t)dt, n_out, k, 0, 0, x, rows, y, 0));
	T_CU(dev, be->sync(dev));
	return (now_s() - t0) / 50 * 1e6;
}

/* The dense matmuls of a 16-row decode pass at Qwen3-30B-A3B's shapes
 * (q4_K q, o; the q6_K head; the f32 router), this path and (exact) the
 * kernels it replaces, each with its quantization launch. */
static void t_perf_rows(void)
{
	struct {
		const char *name;
		int dt;
		uint32_t n_out, k;
	} m[] = {
		{ "q 4096x2048 q4_K", BATON_DT_Q4_K, 4096, 2048 },
		{ "o 2048x4096 q4_K", BATON_DT_Q4_K, 2048, 4096 },
		{ "head 151936x2048 q6_K", BATON_DT_Q6_K, 151936, 2048 },
		{ "router 128x2048 f32", BATON_DT_F32, 128, 2048 },
	};
	const uint32_t rs[] = { 2, 4, 8, 16, 32 };
	for (int exact = 0; exact < 2; exact++) {
		if (exact)
			T_ASSERT(setenv("BATON_CUDA_VR", "0", 1) == 0);
		else
			T_ASSERT(setenv("BATON_CUDA_VR_F32", "1", 1) == 0); /* its figures too */
		struct baton_dev *dev = cuda_fixture_open();
		unsetenv("BATON_CUDA_VR");
		unsetenv("BATON_CUDA_VR_F32");
		for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
			uint64_t wb;
			uint8_t *w = weights(m[i].dt, m[i].n_out, m[i].k, &wb);
			float *x = rvec((size_t)32 * m[i].k);
			baton_dptr dw = up(dev, w, wb), dx = up(dev, x, (uint64_t)32 * m[i].k * 4), dy = 0;
			T_CU(dev, be->alloc(dev, (uint64_t)32 * m[i].n_out * 4, &dy));
			for (size_t r = 0; r < sizeof rs / sizeof rs[0]; r++) {
				if (exact && rs[r] > 16)
					continue;
				char name[96];
				snprintf(name, sizeof name, "%s %s rows=%u us", m[i].name, exact ? "exact" : "vr",
				    rs[r]);
				fig(name, time_mm(dev, dw, m[i].dt, m[i].n_out, m[i].k, dx, rs[r], dy));
			}
			be->free(dev, dw), be->free(dev, dx), be->free(dev, dy);
			free(w), free(x);
		}
		be->close(dev);
	}
}

T_MAIN(T_CASE(t_rows_quant), T_CASE(t_rows_f32), T_CASE(t_rows_matmuls), T_CASE(t_rows_norm_quant),
    T_CASE(t_rows_exact),
    T_CASE_TIMEOUT(t_perf_rows, 120))
