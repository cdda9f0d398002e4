/*
 * quant_gen.c: writes arena/testdata/kquant_<type>.bin and quant_<type>.bin,
 * the reference blocks and values Baton's block codecs are checked
 * against, with ggml's own functions (dequantize_row_<type> and
 * quantize_row_<type>_ref of ggml/src/ggml-quants.c): the K-quants q4_K,
 * q5_K and q6_K (kquant_: arena/kquant_test.c, quantisation, and
 * engine/backend/host/kquant_test.c, dequantisation and dot products) and
 * q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, iq4_nl, iq4_xs and mxfp4 (quant_:
 * engine/backend/host/quant_test.c, arena/quant.c's decoders). Not part of
 * the build: quant_gen.sh compiles it with a ggml checkout you point it
 * at. ggml's code is not committed.
 *
 * File layout (little-endian; kquant_fixture.h reads it), "block" meaning
 * 256 elements: for the types of 32-element blocks, eight of them.
 *   char magic[8] "BKQFIX1\0"; u32 ggml type; u32 bytes per 256 elements;
 *   u32 n_dq;  n_dq random 256-element runs; n_dq * 256 f32: ggml's values;
 *   u32 n_q;   n_q * 256 f32 inputs; n_q runs: quantize_row_*_ref's;
 *              n_q * 256 f32: those dequantised by ggml.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

/* ggml-quants.o refers to these from paths the generator never takes. */
void ggml_abort(const char *file, int line, const char *fmt, ...)
{
	fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
	abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(enum ggml_type type) { (void)type; return "?"; }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }

static uint64_t rng;

static uint64_t rnd(void) /* splitmix64 */
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double urand(void) { return (double)(rnd() >> 11) * 0x1p-53; }

static double gauss(void)
{
	double u = urand() + 1e-300, v = urand();
	return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

/* A random finite f16: any exponent (subnormals and zero included), any
 * sign; a few blocks get the extremes. */
static uint16_t rand_f16(int i)
{
	static const uint16_t edge[] = { 0x0000, 0x0001, 0x03ff, 0x0400, 0x7bff, 0x8001, 0xfbff, 0x3c00 };
	if (i < 8)
		return edge[i];
	uint16_t h;
	do
		h = (uint16_t)rnd();
	while ((h & 0x7c00) == 0x7c00);
	return h;
}

static void fill_inputs(float *x, int blk)
{
	int kind = blk % 8;
	double s = pow(10.0, (double)(rnd() % 9) - 5); /* 1e-5 .. 1e3 */
	for (int i = 0; i < 256; i++) {
		double v;
		switch (kind) {
		case 0: v = 0; break;                              /* all zero */
		case 1: v = 0.25 * s; break;                       /* constant */
		case 2: v = (urand() * 2 - 1) * s; break;          /* uniform */
		case 3: v = urand() * s; break;                    /* positive only */
		case 4: v = -urand() * s; break;                   /* negative only */
		case 5: v = gauss() * s * (i % 37 == 0 ? 30 : 1); break; /* outliers */
		case 6: v = gauss() * s * (i < 128 ? 1 : 1e-3); break;   /* two scales */
		default: v = gauss() * s; break;
		}
		x[i] = (float)v;
	}
}

struct kq {
	const char *file; /* the file's prefix: kquant or quant */
	const char *name;
	int type;
	size_t bytes;    /* of one ggml block */
	size_t elems;    /* of one ggml block: 32 or 256 */
	void (*dq)(const void *, float *, int64_t);
	void (*q)(const float *, void *, int64_t);
	int d_off, dmin_off; /* f16 fields of each block to randomise; -1: none */
};

#define DQ(t) (void (*)(const void *, float *, int64_t))dequantize_row_##t
#define Q(t) (void (*)(const float *, void *, int64_t))quantize_row_##t##_ref

int main(int argc, char **argv)
{
	/* ggml's enum names are upper case (GGML_TYPE_Q4_0), the blocks' lower:
	 * spelled out. */
	const struct kq kinds[] = {
		{ "kquant", "q4_K", GGML_TYPE_Q4_K, sizeof(block_q4_K), 256, DQ(q4_K), Q(q4_K), 0, 2 },
		{ "kquant", "q5_K", GGML_TYPE_Q5_K, sizeof(block_q5_K), 256, DQ(q5_K), Q(q5_K), 0, 2 },
		{ "kquant", "q6_K", GGML_TYPE_Q6_K, sizeof(block_q6_K), 256, DQ(q6_K), Q(q6_K),
		  offsetof(block_q6_K, d), -1 },
		{ "quant", "q4_0", GGML_TYPE_Q4_0, sizeof(block_q4_0), 32, DQ(q4_0), Q(q4_0), 0, -1 },
		{ "quant", "q4_1", GGML_TYPE_Q4_1, sizeof(block_q4_1), 32, DQ(q4_1), Q(q4_1), 0, 2 },
		{ "quant", "q5_0", GGML_TYPE_Q5_0, sizeof(block_q5_0), 32, DQ(q5_0), Q(q5_0), 0, -1 },
		{ "quant", "q5_1", GGML_TYPE_Q5_1, sizeof(block_q5_1), 32, DQ(q5_1), Q(q5_1), 0, 2 },
		{ "quant", "q2_K", GGML_TYPE_Q2_K, sizeof(block_q2_K), 256, DQ(q2_K), Q(q2_K),
		  offsetof(block_q2_K, d), offsetof(block_q2_K, dmin) },
		{ "quant", "q3_K", GGML_TYPE_Q3_K, sizeof(block_q3_K), 256, DQ(q3_K), Q(q3_K),
		  offsetof(block_q3_K, d), -1 },
		{ "quant", "iq4_nl", GGML_TYPE_IQ4_NL, sizeof(block_iq4_nl), 32, DQ(iq4_nl), Q(iq4_nl), 0, -1 },
		{ "quant", "iq4_xs", GGML_TYPE_IQ4_XS, sizeof(block_iq4_xs), 256, DQ(iq4_xs), Q(iq4_xs), 0, -1 },
		{ "quant", "mxfp4", GGML_TYPE_MXFP4, sizeof(block_mxfp4), 32, DQ(mxfp4), Q(mxfp4), -1, -1 },
	};
	const uint32_t n_dq = 32, n_q = 32;
	const char *dir = argc > 1 ? argv[1] : ".";

	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		const struct kq *t = &kinds[k];
		char path[4096];
		const size_t per = 256 / t->elems;      /* ggml blocks per 256 */
		const size_t run = t->bytes * per;      /* bytes per 256 elements */
		uint8_t *blk = malloc(run * (n_dq > n_q ? n_dq : n_q));
		float *y = malloc(sizeof(float) * 256 * (n_dq > n_q ? n_dq : n_q));
		float *x = malloc(sizeof(float) * 256 * n_q);
		uint32_t u;

		rng = 0x5eed0000u + (uint64_t)t->type;
		snprintf(path, sizeof path, "%s/%s_%s.bin", dir, t->file, t->name);
		FILE *f = fopen(path, "wb");
		if (!f || !blk || !y || !x) {
			perror(path);
			return 1;
		}
		fwrite("BKQFIX1", 8, 1, f);
		u = (uint32_t)t->type, fwrite(&u, 4, 1, f);
		u = (uint32_t)run, fwrite(&u, 4, 1, f);

		/* Random blocks: random bits, then finite f16 scales. */
		for (size_t i = 0; i < run * n_dq; i++)
			blk[i] = (uint8_t)rnd();
		for (uint32_t b = 0; b < n_dq * per; b++) {
			uint16_t d = rand_f16((int)b), m = rand_f16((int)(b + 3) % 256);
			if (t->d_off >= 0)
				memcpy(blk + b * t->bytes + t->d_off, &d, 2);
			if (t->dmin_off >= 0)
				memcpy(blk + b * t->bytes + t->dmin_off, &m, 2);
		}
		if (t->type == GGML_TYPE_MXFP4) /* the exponent's edges */
			for (uint32_t b = 0; b < 6; b++)
				blk[b * t->bytes] = (uint8_t[]){ 0, 1, 2, 127, 254, 255 }[b];
		t->dq(blk, y, (int64_t)n_dq * 256);
		fwrite(&n_dq, 4, 1, f);
		fwrite(blk, run, n_dq, f);
		fwrite(y, sizeof(float) * 256, n_dq, f);

		/* Quantisation of random rows, and its dequantisation. */
		for (uint32_t b = 0; b < n_q; b++)
			fill_inputs(x + 256 * b, (int)b);
		t->q(x, blk, (int64_t)n_q * 256);
		t->dq(blk, y, (int64_t)n_q * 256);
		fwrite(&n_q, 4, 1, f);
		fwrite(x, sizeof(float) * 256, n_q, f);
		fwrite(blk, run, n_q, f);
		fwrite(y, sizeof(float) * 256, n_q, f);
		if (fclose(f)) {
			perror(path);
			return 1;
		}
		printf("%s: %u random blocks, %u quantised rows\n", path, n_dq, n_q);
		free(blk);
		free(y);
		free(x);
	}
	return 0;
}
