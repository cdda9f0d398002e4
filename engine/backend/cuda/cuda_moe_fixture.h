/*
 * cuda_moe_fixture.h: what the cuda backend's MoE tests share (header
 * only, tests inside engine/backend/cuda/ only): random layers in every
 * dtype the kernels read, encoded here (the block types as the host's
 * decoder reads them), a double-precision reference of the route and the
 * experts, and check_layer, which runs one layer on the GPU against it and
 * against the host backend. cuda_test.c (f32, f16, bf16, ties, timings)
 * and quant_test.c (q8_0, the K-quants, the block types) use it; the
 * tolerances are cuda_test.c's header's.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_MOE_FIXTURE_H
#define BATON_ENGINE_BACKEND_CUDA_MOE_FIXTURE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

static const struct baton_backend *be = &baton_backend_cuda;

/* A figure line: "  fig <name> <value> <unit>". */
static inline void fig(const char *name, double v, const char *unit)
{
	printf("  fig %-40s %12.6g %s\n", name, v, unit);
	fflush(stdout);
}

/* ---- MoE: data, references ---------------------------------------------- */

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static inline double urand(void) /* [-1, 1) */
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static inline uint16_t to_f16(float f)
{
	uint32_t b;
	memcpy(&b, &f, 4);
	uint32_t sign = (b >> 16) & 0x8000;
	int e = (int)((b >> 23) & 0xff) - 127 + 15;
	uint32_t m = b & 0x7fffff;
	if (e <= 0)
		return (uint16_t)sign; /* test data has no subnormals */
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00);
	uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13), rest = m & 0x1fff;
	if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
		h++;
	return (uint16_t)h;
}

static inline double from_f16(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	double m = h & 0x3ff, v;
	if (e == 0)
		v = ldexp(m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp(1024 + m, e - 25);
	return (h & 0x8000) ? -v : v;
}

static inline uint16_t to_bf16(float f)
{
	uint32_t b;
	memcpy(&b, &f, 4);
	return (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

static inline double from_bf16(uint16_t h)
{
	uint32_t b = (uint32_t)h << 16;
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static inline uint64_t rowb(int dt, uint32_t cols)
{
	switch (dt) {
	case BATON_DT_F32: return 4ull * cols;
	case BATON_DT_F16:
	case BATON_DT_BF16: return 2ull * cols;
	case BATON_DT_Q8_0: return cols / 32 * 34ull;
	case BATON_DT_Q4_K: return cols / 256 * 144ull;
	case BATON_DT_Q5_K: return cols / 256 * 176ull;
	case BATON_DT_Q6_K: return cols / 256 * 210ull;
	}
	return baton_quant_decodes(dt) ? baton_dtype_row_bytes(dt, cols) : 0;
}

/* The block types of arena/quant.c: the block's f16 scale fields (d and,
 * where the type has one, its min), by byte offset; mxfp4's is an
 * exponent byte. */
static inline int is_bquant(int dt)
{
	return baton_quant_decodes(dt) && !baton_kquant_is(dt);
}

static inline void bq_fields(int dt, int *d, int *m, uint32_t *bs)
{
	*m = -1;
	*bs = 32;
	switch (dt) {
	case BATON_DT_Q4_1:
	case BATON_DT_Q5_1: *d = 0, *m = 2; break;
	case BATON_DT_Q2_K: *d = 80, *m = 82, *bs = 256; break;
	case BATON_DT_Q3_K: *d = 108, *bs = 256; break;
	case BATON_DT_IQ4_XS: *d = 0, *bs = 256; break;
	default: *d = 0; break; /* q4_0, q5_0, iq4_nl; mxfp4's exponent */
	}
}

/* Random quants and scales, then the f16 scale (or mxfp4's exponent)
 * set so each block has the rms of v's values there and, for the types
 * with a min, is centred on zero. The values are what the host's decoder
 * says, not v's. */
static inline void encode_bquant(int dt, const double *v, uint32_t cols, uint8_t *out)
{
	int fd, fm;
	uint32_t bs;
	bq_fields(dt, &fd, &fm, &bs);
	const uint64_t bb = rowb(dt, bs);
	float vals[256];
	for (uint32_t b = 0; b < cols / bs; b++) {
		uint8_t *blk = out + b * bb;
		double ss = 0;
		for (uint32_t i = 0; i < bs; i++)
			ss += v[b * bs + i] * v[b * bs + i];
		const double rms = sqrt(ss / bs);
		for (uint64_t k = 0; k < bb; k++)
			blk[k] = (uint8_t)(urand() * 128 + 128);
		if (dt == BATON_DT_MXFP4) { /* 2^(e - 128) * (|q| about 5) */
			int e = 128 + (int)lround(log2(rms > 1e-30 ? rms / 5 : 1e-30));
			blk[0] = (uint8_t)(e < 2 ? 2 : e > 250 ? 250 : e);
			continue;
		}
		uint16_t one = baton_f32_to_f16(1.0f), zero = 0;
		memcpy(blk + fd, &one, 2);
		if (fm >= 0)
			memcpy(blk + fm, &zero, 2);
		baton_quant_decode(dt, blk, vals, bs);
		double mean = 0, s2 = 0;
		for (uint32_t i = 0; i < bs; i++)
			mean += vals[i] / bs;
		for (uint32_t i = 0; i < bs; i++)
			s2 += (vals[i] - (fm >= 0 ? mean : 0)) * (vals[i] - (fm >= 0 ? mean : 0)) / bs;
		const double k = s2 > 0 ? rms / sqrt(s2) : 0;
		uint16_t d = baton_f32_to_f16((float)k);
		memcpy(blk + fd, &d, 2);
		if (fm >= 0) { /* q4_1 / q5_1 add m; q2_K subtracts dmin * (a nibble) */
			double mv = -mean * from_f16(d);
			if (dt == BATON_DT_Q2_K) { /* the mins' nibbles: their mean */
				double mn = 0;
				for (int i = 0; i < 16; i++)
					mn += (blk[i] >> 4) / 16.0;
				mv = mn > 0 ? mean * from_f16(d) / mn : 0;
			}
			uint16_t mh = baton_f32_to_f16((float)mv);
			memcpy(blk + fm, &mh, 2);
		}
	}
}

/* K-quant test rows: random quants and 6-bit scales, and f16 super-scales
 * that give each block the rms of v's values there (so the layer has the
 * magnitudes of the other dtypes'); q4_K / q5_K sub-blocks have min =
 * scale and dmin = d * 7.5 (15.5), centring them on zero. The values are
 * what the host's decoder says (engine/backend/host/kquant_test.c checks it against
 * ggml), not v's. */
static inline void encode_kquant(int dt, const double *v, uint32_t cols, uint8_t *out)
{
	const uint64_t bb = rowb(dt, 256);
	for (uint32_t b = 0; b < cols / 256; b++) {
		uint8_t *blk = out + b * bb;
		double ss = 0;
		for (int i = 0; i < 256; i++)
			ss += v[b * 256 + i] * v[b * 256 + i];
		double rms = sqrt(ss / 256);
		for (uint64_t k = 0; k < bb; k++)
			blk[k] = (uint8_t)(urand() * 128 + 128);
		/* baton_f32_to_f16: small d may be subnormal (to_f16 here
		 * flushes those to zero). */
		if (dt == BATON_DT_Q6_K) { /* scales in -63..63: rms 36.7 */
			for (int j = 0; j < 16; j++)
				blk[192 + j] = (uint8_t)(int8_t)lround(urand() * 63);
			uint16_t d = baton_f32_to_f16((float)(rms / (36.7 * 18.5)));
			memcpy(blk + 208, &d, 2);
			continue;
		}
		double half = dt == BATON_DT_Q4_K ? 7.5 : 15.5;
		uint16_t d = baton_f32_to_f16((float)(rms / (42 * (dt == BATON_DT_Q4_K ? 4.61 : 9.23))));
		uint16_t m = baton_f32_to_f16((float)(from_f16(d) * half));
		memcpy(blk, &d, 2);
		memcpy(blk + 2, &m, 2);
		uint8_t *sc = blk + 4;
		for (int j = 0; j < 8; j++) {
			uint8_t s6 = (uint8_t)(16 + (int)((urand() + 1) * 23.9));
			if (j < 4) {
				sc[j] = s6, sc[j + 4] = s6;
			} else {
				sc[j + 4] = (uint8_t)((s6 & 0xF) | ((s6 & 0xF) << 4));
				sc[j - 4] = (uint8_t)((sc[j - 4] & 63) | ((s6 >> 4) << 6));
				sc[j] = (uint8_t)((sc[j] & 63) | ((s6 >> 4) << 6));
			}
		}
	}
}

/* Encodes v[cols] (scaled by `scale`) into a row of dtype dt. */
static inline void encode_row(int dt, const double *v, uint32_t cols, uint8_t *out)
{
	for (uint32_t i = 0; i < cols; i++) {
		float f = (float)v[i];
		uint16_t h;
		switch (dt) {
		case BATON_DT_F32: memcpy(out + 4ull * i, &f, 4); break;
		case BATON_DT_F16: h = to_f16(f); memcpy(out + 2ull * i, &h, 2); break;
		case BATON_DT_BF16: h = to_bf16(f); memcpy(out + 2ull * i, &h, 2); break;
		}
	}
	if (baton_kquant_is(dt))
		encode_kquant(dt, v, cols, out);
	else if (is_bquant(dt))
		encode_bquant(dt, v, cols, out);
	if (dt == BATON_DT_Q8_0)
		for (uint32_t b = 0; b < cols / 32; b++) {
			double amax = 0;
			for (int i = 0; i < 32; i++)
				amax = fmax(amax, fabs(v[b * 32 + i]));
			uint16_t dh = to_f16((float)(amax / 127));
			double d = from_f16(dh);
			uint8_t *blk = out + b * 34ull;
			memcpy(blk, &dh, 2);
			for (int i = 0; i < 32; i++) {
				long q = d > 0 ? lround(v[b * 32 + i] / d) : 0;
				q = q > 127 ? 127 : q < -127 ? -127 : q;
				blk[2 + i] = (uint8_t)(int8_t)q;
			}
		}
}

static inline double decode(int dt, const uint8_t *row, uint32_t i)
{
	uint16_t h;
	float f;
	switch (dt) {
	case BATON_DT_F32: memcpy(&f, row + 4ull * i, 4); return f;
	case BATON_DT_F16: memcpy(&h, row + 2ull * i, 2); return from_f16(h);
	case BATON_DT_BF16: memcpy(&h, row + 2ull * i, 2); return from_bf16(h);
	case BATON_DT_Q8_0: {
		const uint8_t *blk = row + (i / 32) * 34ull;
		memcpy(&h, blk, 2);
		return from_f16(h) * (double)(int8_t)blk[2 + i % 32];
	}
	case BATON_DT_Q4_K:
	case BATON_DT_Q5_K:
	case BATON_DT_Q6_K: { /* the host's decoder, one block remembered */
		static const uint8_t *last;
		static int last_dt = -1;
		static float vals[256];
		const uint8_t *blk = row + (i / 256) * rowb(dt, 256);
		if (blk != last || dt != last_dt) {
			baton_kquant_decode_block(dt, blk, vals);
			last = blk, last_dt = dt;
		}
		return vals[i % 256];
	}
	}
	if (is_bquant(dt)) { /* the host's decoder, one block remembered */
		static const uint8_t *last;
		static int last_dt = -1;
		static float vals[256];
		int fd, fm;
		uint32_t bs;
		bq_fields(dt, &fd, &fm, &bs);
		const uint8_t *blk = row + (i / bs) * rowb(dt, bs);
		if (blk != last || dt != last_dt) {
			baton_quant_decode(dt, blk, vals, bs);
			last = blk, last_dt = dt;
		}
		return vals[i % bs];
	}
	return NAN;
}

static inline double dotd(int dt, const uint8_t *row, const double *x, uint32_t cols)
{
	double s = 0;
	for (uint32_t i = 0; i < cols; i++)
		s += decode(dt, row, i) * x[i];
	return s;
}

/* A model layer in host memory, and the same on the device. */
struct layer {
	uint32_t B, D, F, E, K;
	int dt, norm_dt;
	uint64_t gate_off, up_off, down_off, blob_bytes, stride;
	uint8_t *blobs;   /* E * stride */
	uint8_t *router;  /* E rows of D */
	uint8_t *norm;    /* one row of D */
	float *x;         /* B * D */
	/* device */
	baton_dptr d_blobs, d_router, d_norm, d_x, d_xn;
	baton_dptr d_base; /* the VMM reservation that holds the blobs */
	uint64_t d_range;
};

static inline uint64_t up4k(uint64_t v)
{
	return (v + 4095) & ~4095ull;
}

/* misalign: offsets of the parts that defeat the vector loads. */
static inline void layer_make(struct layer *L, uint32_t B, uint32_t D, uint32_t F, uint32_t E,
    uint32_t K, int dt, int misalign)
{
	memset(L, 0, sizeof *L);
	L->B = B, L->D = D, L->F = F, L->E = E, L->K = K, L->dt = dt;
	L->norm_dt = dt == BATON_DT_Q8_0 || baton_quant_decodes(dt) ? BATON_DT_F16 : dt;
	L->gate_off = misalign ? 1 : 0;
	L->up_off = L->gate_off + rowb(dt, D) * F + (misalign ? 3 : 0);
	L->down_off = L->up_off + rowb(dt, D) * F + (misalign ? 5 : 0);
	L->blob_bytes = L->down_off + rowb(dt, F) * D;
	L->stride = up4k(L->blob_bytes);
	L->blobs = calloc(E, L->stride);
	L->router = calloc(E, rowb(dt, D));
	L->norm = calloc(1, rowb(L->norm_dt, D));
	L->x = calloc((size_t)B * D, 4);
	T_ASSERT(L->blobs && L->router && L->norm && L->x);
	uint32_t mx = D > F ? D : F;
	double *v = malloc(mx * sizeof *v);
	T_ASSERT(v);
	for (uint32_t e = 0; e < E; e++) {
		uint8_t *blob = L->blobs + e * L->stride;
		for (uint32_t r = 0; r < F; r++) {
			for (uint32_t i = 0; i < D; i++)
				v[i] = urand() / sqrt(D) * 2;
			encode_row(dt, v, D, blob + L->gate_off + r * rowb(dt, D));
			for (uint32_t i = 0; i < D; i++)
				v[i] = urand() / sqrt(D) * 2;
			encode_row(dt, v, D, blob + L->up_off + r * rowb(dt, D));
		}
		for (uint32_t r = 0; r < D; r++) {
			for (uint32_t i = 0; i < F; i++)
				v[i] = urand() / sqrt(F) * 2;
			encode_row(dt, v, F, blob + L->down_off + r * rowb(dt, F));
		}
		for (uint32_t i = 0; i < D; i++)
			v[i] = urand() / sqrt(D) * 4;
		encode_row(dt, v, D, L->router + e * rowb(dt, D));
	}
	for (uint32_t i = 0; i < D; i++)
		v[i] = 1.0 + 0.5 * urand();
	encode_row(L->norm_dt, v, D, L->norm);
	for (uint64_t i = 0; i < (uint64_t)B * D; i++)
		L->x[i] = (float)(urand() * 2);
	free(v);
}

/* Uploads the layer: blobs into VMM segments (as the cache holds them),
 * dense tensors into plain buffers. */
static inline void layer_upload(struct baton_dev *dev, struct layer *L)
{
	const uint64_t g = be->granularity(dev);
	L->d_range = (L->E * L->stride + g - 1) / g * g;
	T_CU(dev, be->reserve(dev, L->d_range, &L->d_base));
	T_CU(dev, be->map(dev, L->d_base, L->d_range));
	L->d_blobs = L->d_base;
	T_CU(dev, be->alloc(dev, L->E * rowb(L->dt, L->D), &L->d_router));
	T_CU(dev, be->alloc(dev, rowb(L->norm_dt, L->D), &L->d_norm));
	T_CU(dev, be->alloc(dev, (uint64_t)L->B * L->D * 4, &L->d_x));
	T_CU(dev, be->alloc(dev, (uint64_t)L->B * L->D * 4, &L->d_xn));
	struct baton_copy c[4] = {
		{ L->d_blobs, L->blobs, L->E * L->stride },
		{ L->d_router, L->router, L->E * rowb(L->dt, L->D) },
		{ L->d_norm, L->norm, rowb(L->norm_dt, L->D) },
		{ L->d_x, L->x, (uint64_t)L->B * L->D * 4 },
	};
	T_CU(dev, be->copy_h2d(dev, c, 4));
	T_CU(dev, be->sync(dev));
}

static inline void layer_free(struct baton_dev *dev, struct layer *L)
{
	if (dev) {
		T_CU(dev, be->unmap(dev, L->d_base, L->d_range));
		T_CU(dev, be->unreserve(dev, L->d_base, L->d_range));
		be->free(dev, L->d_router);
		be->free(dev, L->d_norm);
		be->free(dev, L->d_x);
		be->free(dev, L->d_xn);
	}
	free(L->blobs);
	free(L->router);
	free(L->norm);
	free(L->x);
}

static inline struct baton_moe_layer layer_desc(const struct layer *L, int on_device, float *hx,
    float *hxn)
{
	struct baton_moe_layer l = {
		.batch = L->B, .d_model = L->D, .d_ff = L->F, .n_experts = L->E, .top_k = L->K,
		.norm_dtype = (uint32_t)L->norm_dt, .router_dtype = (uint32_t)L->dt,
		.gate_dtype = (uint32_t)L->dt, .up_dtype = (uint32_t)L->dt,
		.down_dtype = (uint32_t)L->dt,
		.gate_off = L->gate_off, .up_off = L->up_off, .down_off = L->down_off,
	};
	if (on_device) {
		l.x = L->d_x, l.xn = L->d_xn, l.norm = L->d_norm, l.router = L->d_router;
	} else {
		l.x = (baton_dptr)(uintptr_t)hx, l.xn = (baton_dptr)(uintptr_t)hxn;
		l.norm = (baton_dptr)(uintptr_t)L->norm;
		l.router = (baton_dptr)(uintptr_t)L->router;
	}
	return l;
}

/* The double reference: route (xn, logits, ids, weights) of token t. */
static inline void ref_route(const struct layer *L, uint32_t t, double *xn, double *logit,
    uint32_t *ids, double *w)
{
	const float *x = L->x + (uint64_t)t * L->D;
	double ss = 0;
	for (uint32_t i = 0; i < L->D; i++)
		ss += (double)x[i] * x[i];
	double s = 1 / sqrt(ss / L->D + 1e-6);
	for (uint32_t i = 0; i < L->D; i++)
		xn[i] = x[i] * s * decode(L->norm_dt, L->norm, i);
	for (uint32_t e = 0; e < L->E; e++)
		logit[e] = dotd(L->dt, L->router + e * rowb(L->dt, L->D), xn, L->D);
	for (uint32_t k = 0; k < L->K; k++) {
		uint32_t best = UINT32_MAX;
		for (uint32_t e = 0; e < L->E; e++) {
			int taken = 0;
			for (uint32_t j = 0; j < k; j++)
				taken |= ids[j] == e;
			if (!taken && (best == UINT32_MAX || logit[e] > logit[best]))
				best = e;
		}
		ids[k] = best;
	}
	double sum = 0;
	for (uint32_t k = 0; k < L->K; k++)
		sum += w[k] = exp(logit[ids[k]] - logit[ids[0]]);
	for (uint32_t k = 0; k < L->K; k++)
		w[k] /= sum;
}

/* The double reference of the experts for token t: delta[D]. */
static inline void ref_experts(const struct layer *L, const double *xn, const uint32_t *ids,
    const float *w, double *delta)
{
	double *h = malloc(L->F * sizeof *h);
	T_ASSERT(h);
	memset(delta, 0, L->D * sizeof *delta);
	for (uint32_t k = 0; k < L->K; k++) {
		const uint8_t *blob = L->blobs + ids[k] * L->stride;
		for (uint32_t r = 0; r < L->F; r++) {
			double g = dotd(L->dt, blob + L->gate_off + r * rowb(L->dt, L->D), xn, L->D);
			double u = dotd(L->dt, blob + L->up_off + r * rowb(L->dt, L->D), xn, L->D);
			h[r] = g / (1 + exp(-g)) * u;
		}
		for (uint32_t r = 0; r < L->D; r++)
			delta[r] += w[k] * dotd(L->dt, blob + L->down_off + r * rowb(L->dt, L->F), h, L->F);
	}
	free(h);
}

/* max |a - b| / max |b| */
static inline double rel_err(const double *a, const double *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		num = fmax(num, fabs(a[i] - b[i]));
		den = fmax(den, fabs(b[i]));
	}
	return den > 0 ? num / den : num;
}

static inline const char *dt_name(int dt)
{
	const char *n = baton_dtype_name(dt);
	return n ? n : "?";
}

/* Route and experts of one layer on the GPU, against the double reference
 * and the host backend. */
static inline void check_layer(int dt, uint32_t B, uint32_t D, uint32_t F, uint32_t E, uint32_t K,
    int misalign)
{
	struct baton_dev *dev = cuda_fixture_open();
	const double tol = 1e-4;
	struct layer L;
	layer_make(&L, B, D, F, E, K, dt, misalign);
	layer_upload(dev, &L);
	const size_t BD = (size_t)B * D, BK = (size_t)B * K;

	/* route */
	struct baton_moe_layer gl = layer_desc(&L, 1, NULL, NULL);
	uint32_t *ids = calloc(BK, 4), *hids = calloc(BK, 4), *rids = calloc(BK, 4);
	float *w = calloc(BK, 4), *hw = calloc(BK, 4);
	double *rw = calloc(BK, 8), *rxn = calloc(BD, 8), *logit = calloc(E, 8);
	float *hx = malloc(BD * 4), *hxn = malloc(BD * 4), *gxn = malloc(BD * 4);
	float *gx = malloc(BD * 4), *gx2 = malloc(BD * 4);
	T_ASSERT(ids && hids && rids && w && hw && rw && rxn && logit && hx && hxn && gxn && gx &&
	    gx2);
	T_CU(dev, be->moe_route(dev, &gl, ids, w));
	T_CU(dev, be->copy_d2h(dev, gxn, L.d_xn, BD * 4));

	memcpy(hx, L.x, BD * 4);
	struct baton_moe_layer hl = layer_desc(&L, 0, hx, hxn);
	T_OK(host_moe_route(NULL, &hl, hids, hw));

	double max_w_err = 0, max_hw_err = 0;
	for (uint32_t t = 0; t < B; t++) {
		ref_route(&L, t, rxn + (size_t)t * D, logit, rids + (size_t)t * K, rw + (size_t)t * K);
		for (uint32_t k = 0; k < K; k++) {
			size_t i = (size_t)t * K + k;
			if (ids[i] != rids[i]) {
				double gap = fabs(logit[ids[i]] - logit[rids[i]]);
				T_ASSERT_MSG(gap <= 1e-5 * (1 + fabs(logit[rids[i]])),
				    "token %u rank %u: gpu id %u, reference %u (logit gap %g)", t, k,
				    ids[i], rids[i], gap);
				printf("  near tie at token %u rank %u (gap %g)\n", t, k, gap);
			}
			if (ids[i] != hids[i])
				printf("  host and gpu differ at token %u rank %u: %u vs %u\n", t, k,
				    hids[i], ids[i]);
			if (ids[i] == rids[i])
				max_w_err = fmax(max_w_err, fabs(w[i] - rw[i]));
			if (ids[i] == hids[i])
				max_hw_err = fmax(max_hw_err, fabs(w[i] - hw[i]));
		}
	}
	double *tmp = malloc(BD * 8), *tmp2 = malloc(BD * 8);
	T_ASSERT(tmp && tmp2);
	for (size_t i = 0; i < BD; i++)
		tmp[i] = gxn[i];
	double xn_err = rel_err(tmp, rxn, BD);
	T_ASSERT_MSG(max_w_err <= 1e-5, "route weights off by %g", max_w_err);
	T_ASSERT_MSG(xn_err <= 1e-5, "xn off by %g", xn_err);

	/* experts with the GPU's ids and weights on all three */
	baton_dptr *blobs = calloc(BK, sizeof *blobs), *hblobs = calloc(BK, sizeof *hblobs);
	T_ASSERT(blobs && hblobs);
	for (size_t i = 0; i < BK; i++) {
		blobs[i] = L.d_blobs + ids[i] * L.stride;
		hblobs[i] = (baton_dptr)(uintptr_t)(L.blobs + ids[i] * L.stride);
	}
	T_CU(dev, be->moe_experts(dev, &gl, blobs, w));
	T_CU(dev, be->copy_d2h(dev, gx, L.d_x, BD * 4));
	memcpy(hx, L.x, BD * 4);
	T_OK(host_moe_route(NULL, &hl, hids, hw)); /* host xn */
	T_OK(host_moe_experts(NULL, &hl, hblobs, w));

	double *delta = malloc(BD * 8), *rdelta = malloc(BD * 8);
	T_ASSERT(delta && rdelta);
	for (uint32_t t = 0; t < B; t++)
		ref_experts(&L, rxn + (size_t)t * D, ids + (size_t)t * K, w + (size_t)t * K,
		    rdelta + (size_t)t * D);
	for (size_t i = 0; i < BD; i++) {
		delta[i] = (double)gx[i] - L.x[i];
		tmp2[i] = (double)hx[i] - L.x[i];
	}
	double e_ref = rel_err(delta, rdelta, BD), e_host = rel_err(delta, tmp2, BD);
	double e_host_ref = rel_err(tmp2, rdelta, BD), dmax = 0;
	for (size_t i = 0; i < BD; i++)
		dmax = fmax(dmax, fabs(rdelta[i]));
	T_ASSERT_MSG(dmax > 1e-6, "%s: the layer's output is (nearly) zero: weights lost", dt_name(dt));
	printf("  %s B=%u D=%u F=%u E=%u K=%u %s: xn %.2e, route w %.2e (host %.2e), "
	       "experts vs double %.2e, vs host %.2e (host vs double %.2e)\n",
	    dt_name(dt), B, D, F, E, K, misalign ? "misaligned" : "aligned", xn_err, max_w_err,
	    max_hw_err, e_ref, e_host, e_host_ref);
	char name[64];
	snprintf(name, sizeof name, "max_rel_err_%s_%s", dt_name(dt), misalign ? "scalar" : "vector");
	fig(name, e_ref, "");
	T_ASSERT_MSG(e_ref <= tol, "%s experts: relative error %g > %g", dt_name(dt), e_ref, tol);
	T_ASSERT_MSG(e_host <= tol, "%s experts vs host: relative error %g > %g", dt_name(dt),
	    e_host, tol);

	/* deterministic: the same inputs give the same bits */
	struct baton_copy c = { L.d_x, L.x, BD * 4 };
	T_CU(dev, be->copy_h2d(dev, &c, 1));
	T_CU(dev, be->moe_route(dev, &gl, hids, hw));
	T_ASSERT(memcmp(hids, ids, BK * 4) == 0 && memcmp(hw, w, BK * 4) == 0);
	T_CU(dev, be->moe_experts(dev, &gl, blobs, w));
	T_CU(dev, be->copy_d2h(dev, gx2, L.d_x, BD * 4));
	T_ASSERT_MSG(memcmp(gx, gx2, BD * 4) == 0, "two runs differ");

	/* moe_experts_dev: the blobs from a device table by id, ids and
	 * weights on the device, one pair per chunk: moe_experts' bits (its
	 * chunks of up to 8 tokens of one expert where B = 20) */
	uint64_t *tab = malloc((size_t)E * 8);
	baton_dptr dtab = 0, dsel = 0;
	T_ASSERT(tab);
	for (uint32_t e = 0; e < E; e++)
		tab[e] = L.d_blobs + e * L.stride;
	T_CU(dev, be->alloc(dev, (uint64_t)E * 8, &dtab));
	T_CU(dev, be->alloc(dev, BK * 8, &dsel));
	struct baton_copy cs[4] = { { dtab, tab, (uint64_t)E * 8 }, { dsel, ids, BK * 4 },
		{ dsel + BK * 4, w, BK * 4 }, { L.d_x, L.x, BD * 4 } };
	T_CU(dev, be->copy_h2d(dev, cs, 4));
	T_CU(dev, be->moe_experts_dev(dev, &gl, dtab, dsel, dsel + BK * 4));
	T_CU(dev, be->copy_d2h(dev, gx2, L.d_x, BD * 4));
	/* batch 1 on aligned q4_K / q6_K: mmvq.cu's experts (the activations
	 * as int8 blocks), near the double reference (3e-2); on aligned bf16
	 * / f16: gemv16.cu's (f32 sums in another order: the tolerance of the
	 * exact kernels); the same bits twice */
	const char *ex = getenv("BATON_CUDA_EXACT");
	const int vq = dt == BATON_DT_Q4_K || dt == BATON_DT_Q6_K;
	const int g16 = (dt == BATON_DT_BF16 || dt == BATON_DT_F16) && D % 8 == 0 && F % 8 == 0 &&
	    K <= 32;
	if (B == 1 && !misalign && (vq || g16) && !(ex && *ex && strcmp(ex, "0") != 0)) {
		for (size_t i = 0; i < BD; i++)
			delta[i] = (double)gx2[i] - L.x[i];
		const double e_fast = rel_err(delta, rdelta, BD), ftol = vq ? 3e-2 : tol;
		const char *path = vq ? "mmvq" : "gemv16";
		printf("  %s B=1 %s experts vs double %.2e\n", dt_name(dt), path, e_fast);
		snprintf(name, sizeof name, "max_rel_err_%s_%s", dt_name(dt), path);
		fig(name, e_fast, "");
		T_ASSERT_MSG(e_fast <= ftol, "%s %s experts: relative error %g > %g", dt_name(dt), path,
		    e_fast, ftol);
		float *gx3 = malloc(BD * 4);
		T_ASSERT(gx3);
		T_CU(dev, be->copy_h2d(dev, &cs[3], 1));
		T_CU(dev, be->moe_experts_dev(dev, &gl, dtab, dsel, dsel + BK * 4));
		T_CU(dev, be->copy_d2h(dev, gx3, L.d_x, BD * 4));
		T_ASSERT_MSG(memcmp(gx2, gx3, BD * 4) == 0, "%s %s experts: two runs differ",
		    dt_name(dt), path);
		/* a one-row rmsnorm writes xn and its int8 blocks, an f32 matmul
		 * (the router's place) and route_dev write elsewhere and keep
		 * them: the experts on the norm's quantization give the bits of
		 * the experts that quantize xn themselves (after a launch that
		 * keeps nothing) */
		float *rw32 = malloc((size_t)E * D * 4);
		T_ASSERT(rw32);
		for (size_t i = 0; i < (size_t)E * D; i++)
			rw32[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
		baton_dptr drw = 0, drl = 0, dsel2 = 0, dsc = 0;
		T_CU(dev, be->alloc(dev, (uint64_t)E * D * 4, &drw));
		T_CU(dev, be->alloc(dev, (uint64_t)E * 4, &drl));
		T_CU(dev, be->alloc(dev, BK * 8, &dsel2));
		T_CU(dev, be->alloc(dev, 256, &dsc));
		struct baton_copy cw = { drw, rw32, (uint64_t)E * D * 4 };
		T_CU(dev, be->copy_h2d(dev, &cw, 1));
		/* and router_route_dev, the three in one launch, writes the same */
		const struct baton_router_route rr = { .x = L.d_x, .xn = L.d_xn, .w = drw,
			.logits = drl, .ids = dsel2, .weights = dsel2 + BK * 4, .norm_on = 1,
			.w_dtype = BATON_DT_F32, .n_experts = E, .k = D, .rows = 1, .top_k = K,
			.rule = BATON_ROUTE_SOFTMAX_TOPK_NORM, .eps = 1e-6f };
		/* (router_route_dev only before mmvq's experts: the cases run on
		 * the H200 with it; gemv16's take no quantization from it) */
		for (int v = 0; v < (vq ? 3 : 2); v++) {
			T_CU(dev, be->copy_h2d(dev, &cs[3], 1));
			if (v == 2) {
				T_CU(dev, be->router_route_dev(dev, &rr));
			} else {
				T_CU(dev, be->rmsnorm(dev, L.d_x, L.d_xn, 1, D, 0, 0, 1e-6f));
				T_CU(dev, be->matmul(dev, drw, BATON_DT_F32, E, D, 0, 0, L.d_xn, 1, drl, 0));
				T_CU(dev, be->route_dev(dev, drl, 1, E, K, BATON_ROUTE_SOFTMAX_TOPK_NORM, dsel2,
				    dsel2 + BK * 4));
			}
			if (v == 1) /* a 64-wide norm elsewhere: keeps no quantization */
				T_CU(dev, be->rmsnorm(dev, dsc, dsc, 1, 64, 0, 0, 1e-6f));
			T_CU(dev, be->moe_experts_dev(dev, &gl, dtab, dsel2, dsel2 + BK * 4));
			T_CU(dev, be->copy_d2h(dev, v ? gx3 : gx2, L.d_x, BD * 4));
			T_ASSERT_MSG(v == 0 || memcmp(gx2, gx3, BD * 4) == 0,
			    "%s %s experts after a norm, matmul and route differ from a fresh run (%s)",
			    dt_name(dt), path, v == 1 ? "rmsnorm" : "router_route_dev");
		}
		be->free(dev, drw), be->free(dev, drl), be->free(dev, dsel2), be->free(dev, dsc);
		free(rw32);
		free(gx3);
	} else if (dt == BATON_DT_Q4_K && B >= 2 && B <= 64 && !misalign &&
	    !(ex && *ex && strcmp(ex, "0") != 0)) {
		/* 2 .. 64 rows on aligned q4_K: moe_rows.cu's grouped experts
		 * (int8 activations as mmvq's), near the double reference; the
		 * same bits twice */
		for (size_t i = 0; i < BD; i++)
			delta[i] = (double)gx2[i] - L.x[i];
		const double e_rows = rel_err(delta, rdelta, BD);
		printf("  %s B=%u moe_rows experts vs double %.2e\n", dt_name(dt), B, e_rows);
		snprintf(name, sizeof name, "max_rel_err_%s_rows%u", dt_name(dt), B);
		fig(name, e_rows, "");
		T_ASSERT_MSG(e_rows <= 3e-2, "%s moe_rows experts (B=%u): relative error %g > 3e-2",
		    dt_name(dt), B, e_rows);
		float *gx3 = malloc(BD * 4);
		T_ASSERT(gx3);
		T_CU(dev, be->copy_h2d(dev, &cs[3], 1));
		T_CU(dev, be->moe_experts_dev(dev, &gl, dtab, dsel, dsel + BK * 4));
		T_CU(dev, be->copy_d2h(dev, gx3, L.d_x, BD * 4));
		T_ASSERT_MSG(memcmp(gx2, gx3, BD * 4) == 0, "%s moe_rows experts: two runs differ",
		    dt_name(dt));
		free(gx3);
	} else {
		T_ASSERT_MSG(memcmp(gx, gx2, BD * 4) == 0,
		    "%s: moe_experts_dev differs from moe_experts", dt_name(dt));
	}
	T_EQ_ERR(be->moe_experts_dev(dev, &gl, 0, dsel, dsel + BK * 4), BATON_EINVAL);
	T_EQ_ERR(be->moe_experts_dev(dev, &gl, dtab, dsel + 2, dsel + BK * 4), BATON_EINVAL);
	T_CU(dev, be->sync(dev));
	be->free(dev, dtab);
	be->free(dev, dsel);
	free(tab);

	/* errors: an uncomputable dtype, a zero blob */
	struct baton_moe_layer bad = gl;
	bad.gate_dtype = BATON_DT_IQ2_XXS; /* the lattice types: refused by name */
	T_EQ_ERR(be->moe_experts(dev, &bad, blobs, w), BATON_EUNSUPPORTED);
	bad = gl;
	bad.top_k = E + 1;
	T_EQ_ERR(be->moe_route(dev, &bad, ids, w), BATON_EINVAL);
	baton_dptr keep = blobs[0];
	blobs[0] = 0;
	T_EQ_ERR(be->moe_experts(dev, &gl, blobs, w), BATON_EINVAL);
	blobs[0] = keep;

	free(ids), free(hids), free(rids), free(w), free(hw), free(rw), free(rxn), free(logit);
	free(hx), free(hxn), free(gxn), free(gx), free(gx2), free(tmp), free(tmp2);
	free(blobs), free(hblobs), free(delta), free(rdelta);
	layer_free(dev, &L);
	be->close(dev);
}

#endif
