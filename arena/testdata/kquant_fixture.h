/*
 * kquant_fixture.h: reads arena/testdata/kquant_<type>.bin (written by
 * quant_gen.c with ggml's own code; the layout is described there) for
 * arena/kquant_test.c and engine/backend/host/kquant_test.c, and
 * quant_<type>.bin for engine/backend/host/quant_test.c. Header only, tests only.
 * Paths are relative to the repository root, where the tests run.
 */
#ifndef BATON_KQUANT_FIXTURE_H
#define BATON_KQUANT_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/t.h"

struct kq_fixture {
	uint32_t type, bytes;
	uint32_t n_dq;        /* random blocks */
	uint8_t *dq_blocks;   /* n_dq * bytes */
	float *dq_values;     /* n_dq * 256: ggml's dequantisation */
	uint32_t n_q;         /* quantised rows of 256 */
	float *q_inputs;      /* n_q * 256 */
	uint8_t *q_blocks;    /* n_q * bytes: quantize_row_*_ref's */
	float *q_values;      /* n_q * 256: those blocks dequantised */
};

static inline void kq_read(FILE *f, void *p, size_t n, const char *path)
{
	T_ASSERT_MSG(fread(p, 1, n, f) == n, "%s: short file", path);
}

static inline void *kq_take(FILE *f, size_t n, const char *path)
{
	void *p = malloc(n ? n : 1);
	T_ASSERT(p != NULL);
	kq_read(f, p, n, path);
	return p;
}

/* arena/testdata/<prefix>_<name>.bin, quant_gen.c's: prefix "kquant"
 * (name q4_K, q5_K or q6_K) or "quant" (the other block types, whose
 * "blocks" are runs of 256 elements). Fails the test when the file is
 * missing or malformed. */
static inline void kq_fixture_load_from(struct kq_fixture *fx, const char *prefix,
    const char *name)
{
	char path[256], magic[8];

	snprintf(path, sizeof path, "arena/testdata/%s_%s.bin", prefix, name);
	FILE *f = fopen(path, "rb");
	T_ASSERT_MSG(f != NULL, "%s: not found (tests run from the repository root)", path);
	kq_read(f, magic, 8, path);
	T_ASSERT_MSG(memcmp(magic, "BKQFIX1", 8) == 0, "%s: bad magic", path);
	kq_read(f, &fx->type, 4, path);
	kq_read(f, &fx->bytes, 4, path);
	kq_read(f, &fx->n_dq, 4, path);
	T_ASSERT(fx->bytes > 0 && fx->bytes <= 256 && fx->n_dq <= 4096);
	fx->dq_blocks = kq_take(f, (size_t)fx->n_dq * fx->bytes, path);
	fx->dq_values = kq_take(f, (size_t)fx->n_dq * 256 * 4, path);
	kq_read(f, &fx->n_q, 4, path);
	T_ASSERT(fx->n_q <= 4096);
	fx->q_inputs = kq_take(f, (size_t)fx->n_q * 256 * 4, path);
	fx->q_blocks = kq_take(f, (size_t)fx->n_q * fx->bytes, path);
	fx->q_values = kq_take(f, (size_t)fx->n_q * 256 * 4, path);
	T_ASSERT_MSG(fgetc(f) == EOF, "%s: trailing bytes", path);
	fclose(f);
}

/* name: "q4_K", "q5_K" or "q6_K". */
static inline void kq_fixture_load(struct kq_fixture *fx, const char *name)
{
	kq_fixture_load_from(fx, "kquant", name);
}

static inline void kq_fixture_free(struct kq_fixture *fx)
{
	free(fx->dq_blocks);
	free(fx->dq_values);
	free(fx->q_inputs);
	free(fx->q_blocks);
	free(fx->q_values);
}

#endif
