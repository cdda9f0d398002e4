/*
 * lt_test.c: the tensor-core path's GEMMs through cuBLASLt (lt.c) on a
 * GPU: matmuls of many row counts (each a new shape, as a serving pass's
 * are) within the bf16 bound of the double sum, a kernel chosen once per
 * class (n rounded up to a power of two) and not per shape, the same bits
 * when a shape comes again, and with BATON_CUBLASLT=0 cuBLAS's own calls
 * within the same bound. Skips (passing) without a GPU or without cuBLAS.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "tests/t.h"

static const struct baton_backend *be = &baton_backend_cuda;

static uint64_t g_seed = 12345;

static float frand(void) /* in [-1, 1) */
{
	g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((g_seed >> 40) & 0xffffff) / (float)(1 << 23) - 1.0f;
}

enum { N_OUT = 256, K = 512, ROWS_MAX = 300 };

struct setup {
	struct baton_dev *dev;
	baton_dptr w, x, y;
	float *wf, *xf, *got;
};

/* The device with its tensor-core path on for passes of 64 rows, bf16
 * weights in place, x random; NULL (a skip said) without cuBLAS. */
static int setup_open(struct setup *s)
{
	memset(s, 0, sizeof *s);
	T_ASSERT(setenv("BATON_CUDA_GEMM_ROWS", "64", 1) == 0);
	s->dev = cuda_fixture_open();
	unsetenv("BATON_CUDA_GEMM_ROWS");
	uint16_t *wb = malloc((size_t)N_OUT * K * 2);
	s->wf = malloc((size_t)N_OUT * K * 4);
	s->xf = malloc((size_t)ROWS_MAX * K * 4);
	s->got = malloc((size_t)ROWS_MAX * N_OUT * 4);
	T_ASSERT(wb && s->wf && s->xf && s->got);
	for (size_t i = 0; i < (size_t)N_OUT * K; i++) {
		wb[i] = baton_f32_to_bf16(frand());
		s->wf[i] = baton_bf16_to_f32(wb[i]);
	}
	for (size_t i = 0; i < (size_t)ROWS_MAX * K; i++)
		s->xf[i] = frand();
	T_CU(s->dev, be->alloc(s->dev, (uint64_t)N_OUT * K * 2, &s->w));
	T_CU(s->dev, be->alloc(s->dev, (uint64_t)ROWS_MAX * K * 4, &s->x));
	T_CU(s->dev, be->alloc(s->dev, (uint64_t)ROWS_MAX * N_OUT * 4, &s->y));
	const struct baton_copy c[2] = { { s->w, wb, (uint64_t)N_OUT * K * 2 },
		{ s->x, s->xf, (uint64_t)ROWS_MAX * K * 4 } };
	T_CU(s->dev, be->copy_h2d(s->dev, c, 2));
	T_CU(s->dev, be->sync(s->dev));
	free(wb);
	/* one pass of 64 rows asks for cuBLAS */
	T_CU(s->dev, be->matmul(s->dev, s->w, BATON_DT_BF16, N_OUT, K, 0, 0, s->x, 64, s->y, 0));
	T_CU(s->dev, be->sync(s->dev));
	char line[768];
	cuda_backend_describe(s->dev, line, sizeof line);
	if (!strstr(line, "tensor cores through cuBLAS")) {
		printf("  skip: %s\n", line);
		return 0;
	}
	return 1;
}

static void setup_close(struct setup *s)
{
	be->free(s->dev, s->w), be->free(s->dev, s->x), be->free(s->dev, s->y);
	be->close(s->dev);
	free(s->wf), free(s->xf), free(s->got);
}

/* y = x w^T for `rows` rows, checked against the double sum: within 0.008
 * sum |x| |w| (bf16 rounds x by 2^-9; w is bf16 already) plus 1e-5. */
static void matmul_check(struct setup *s, uint32_t rows)
{
	T_CU(s->dev, be->matmul(s->dev, s->w, BATON_DT_BF16, N_OUT, K, 0, 0, s->x, rows, s->y, 0));
	T_CU(s->dev, be->copy_d2h(s->dev, s->got, s->y, (uint64_t)rows * N_OUT * 4));
	T_CU(s->dev, be->sync(s->dev));
	for (uint32_t r = 0; r < rows; r++)
		for (uint32_t o = 0; o < N_OUT; o++) {
			double want = 0, mag = 0;
			for (uint32_t i = 0; i < K; i++) {
				const double p = (double)s->xf[(size_t)r * K + i] * s->wf[(size_t)o * K + i];
				want += p;
				mag += fabs(p);
			}
			const double got = s->got[(size_t)r * N_OUT + o];
			T_ASSERT_MSG(fabs(got - want) <= 0.008 * mag + 1e-5,
			    "rows %u, y[%u][%u] = %.6f, want %.6f (bound %.6f)", rows, r, o, got, want,
			    0.008 * mag + 1e-5);
		}
}

/* "cuBLASLt: N GEMMs, M shape classes (R calls went to cuBLAS)" */
static int lt_counts(struct baton_dev *dev, unsigned long long *calls, unsigned *classes,
    unsigned long long *refused)
{
	char line[768];
	cuda_backend_describe(dev, line, sizeof line);
	const char *p = strstr(line, "cuBLASLt: ");
	return p && sscanf(p, "cuBLASLt: %llu GEMMs, %u shape classes (%llu calls", calls, classes,
	    refused) == 3;
}

static const uint32_t g_rows[] = { 64, 65, 71, 100, 127, 128, 129, 200, 255, 256, 300 };

static void t_lt_shapes(void)
{
	struct setup s;
	if (!setup_open(&s)) {
		setup_close(&s);
		return;
	}
	for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i++)
		matmul_check(&s, g_rows[i]);
	unsigned long long calls = 0, refused = 0;
	unsigned classes = 0;
	char line[768];
	cuda_backend_describe(s.dev, line, sizeof line);
	printf("  %s\n", line);
	if (strstr(line, "cuBLASLt: off")) { /* no libcublasLt beside libcublas: cuBLAS's calls */
		printf("  skip: cuBLASLt is off\n");
		setup_close(&s);
		return;
	}
	T_ASSERT_MSG(lt_counts(s.dev, &calls, &classes, &refused), "%s", line);
	/* every matmul one GEMM here (bf16 in place), each through cuBLASLt;
	 * 12 shapes in 4 classes: n of 64, 128, 256 and 512 */
	T_ASSERT_MSG(calls >= 1 + sizeof g_rows / sizeof g_rows[0] && refused == 0, "%s", line);
	T_ASSERT_MSG(classes == 4, "%s", line);
	/* a shape again: the same kernel, the same bits */
	float *first = malloc((size_t)100 * N_OUT * 4);
	T_ASSERT(first);
	matmul_check(&s, 100);
	memcpy(first, s.got, (size_t)100 * N_OUT * 4);
	matmul_check(&s, 129);
	matmul_check(&s, 100);
	T_ASSERT(memcmp(first, s.got, (size_t)100 * N_OUT * 4) == 0);
	T_ASSERT(lt_counts(s.dev, &calls, &classes, &refused) && classes == 4);
	free(first);
	setup_close(&s);
}

static void t_lt_off(void)
{
	T_ASSERT(setenv("BATON_CUBLASLT", "0", 1) == 0);
	struct setup s;
	const int on = setup_open(&s);
	unsetenv("BATON_CUBLASLT");
	if (!on) {
		setup_close(&s);
		return;
	}
	for (size_t i = 0; i < sizeof g_rows / sizeof g_rows[0]; i += 3)
		matmul_check(&s, g_rows[i]);
	char line[768];
	cuda_backend_describe(s.dev, line, sizeof line);
	T_ASSERT_MSG(strstr(line, "cuBLASLt: off"), "%s", line);
	setup_close(&s);
}

T_MAIN(T_CASE_TIMEOUT(t_lt_shapes, 120), T_CASE_TIMEOUT(t_lt_off, 120))
