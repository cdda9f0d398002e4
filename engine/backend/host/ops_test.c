/*
 * ops_test.c: the host backend's forward-pass ops (engine/backend/host/ops.c)
 * against naive double-precision references on random data, through the
 * backend table as the model calls them; and their refusals.
 *
 * Tolerance: the ops accumulate in f32 and the references in double, so a
 * result may differ by a few ulps of the terms summed: |got - want| <=
 * 1e-5 * (1 + sum of |terms|) is what f32 rounding over these sizes
 * (<= 512 terms, u = 6e-8) allows with a wide margin; a wrong formula
 * (a missing scale, a wrong head, an off-by-one position) is off by O(1).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/backend.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

static const struct baton_backend *H = &baton_backend_host;

static uint64_t g_rng = 88172645463325252ull;

static float frand(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return (float)((double)(g_rng >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *rvec(size_t n)
{
	float *v = malloc(n * sizeof *v);
	T_ASSERT(v);
	for (size_t i = 0; i < n; i++)
		v[i] = frand();
	return v;
}

static baton_dptr D(const void *p)
{
	return (baton_dptr)(uintptr_t)p;
}

static void near(float got, double want, double scale, const char *what, size_t i)
{
	if (!(fabs((double)got - want) <= 1e-5 * (1.0 + scale)))
		T_FAIL("%s[%zu] = %.9g, want %.9g", what, i, got, want);
}

/* Encodes rows x cols floats in dtype; *dec gets the exact decoded values. */
static void *encode(int dtype, const float *src, uint32_t rows, uint32_t cols, float *dec)
{
	uint64_t rb = baton_compute_row_bytes(dtype, cols);
	uint8_t *out = calloc(rows, rb);
	T_ASSERT(out && rb);
	for (uint32_t r = 0; r < rows; r++) {
		uint8_t *row = out + r * rb;
		const float *s = src + (size_t)r * cols;
		for (uint32_t i = 0; i < cols; i++) {
			if (dtype == BATON_DT_F32) {
				memcpy(row + 4 * i, &s[i], 4);
			} else if (dtype == BATON_DT_F16) {
				uint16_t h = baton_f32_to_f16(s[i]);
				memcpy(row + 2 * i, &h, 2);
			} else if (dtype == BATON_DT_BF16) {
				uint16_t h = baton_f32_to_bf16(s[i]);
				memcpy(row + 2 * i, &h, 2);
			}
		}
		if (dtype == BATON_DT_Q8_0) {
			for (uint32_t b = 0; b < cols / 32; b++) {
				float amax = 0;
				for (int j = 0; j < 32; j++)
					amax = fmaxf(amax, fabsf(s[b * 32 + j]));
				float d = amax / 127.0f;
				uint16_t h = baton_f32_to_f16(d);
				uint8_t *blk = row + b * 34;
				memcpy(blk, &h, 2);
				float id = d ? 1.0f / d : 0;
				for (int j = 0; j < 32; j++)
					blk[2 + j] = (uint8_t)(int8_t)lrintf(s[b * 32 + j] * id);
			}
		}
		T_OK(baton_dequant_row(dtype, row, dec + (size_t)r * cols, cols));
	}
	return out;
}

static void t_matmul_dtypes(void)
{
	const int dts[] = { BATON_DT_F32, BATON_DT_F16, BATON_DT_BF16, BATON_DT_Q8_0 };
	const uint32_t N = 40, K = 96, R = 11; /* R > one group of 8 rows */
	for (size_t di = 0; di < 4; di++) {
		float *w = rvec((size_t)N * K), *wd = malloc((size_t)N * K * 4);
		float *b = rvec(N), *bd = malloc(N * 4), *x = rvec((size_t)R * K);
		float *y = rvec((size_t)R * N), *y0 = malloc((size_t)R * N * 4);
		T_ASSERT(wd && bd && y0);
		memcpy(y0, y, (size_t)R * N * 4);
		void *we = encode(dts[di], w, N, K, wd);
		void *be = encode(BATON_DT_BF16, b, 1, N, bd);
		for (int acc = 0; acc < 2; acc++) {
			memcpy(y, y0, (size_t)R * N * 4);
			T_OK(H->matmul(NULL, D(we), (uint32_t)dts[di], N, K, D(be), BATON_DT_BF16, D(x), R,
			    D(y), acc));
			for (uint32_t r = 0; r < R; r++)
				for (uint32_t o = 0; o < N; o++) {
					double s = 0, mag = 0;
					for (uint32_t k = 0; k < K; k++) {
						s += (double)wd[o * K + k] * x[r * K + k];
						mag += fabs((double)wd[o * K + k] * x[r * K + k]);
					}
					s += bd[o] + (acc ? y0[r * N + o] : 0);
					near(y[r * N + o], s, mag + 2, "matmul", r * N + o);
				}
		}
		/* no bias, and bitwise the dot of dtype.c */
		T_OK(H->matmul(NULL, D(we), (uint32_t)dts[di], N, K, 0, 0, D(x), R, D(y), 0));
		float d0;
		T_OK(baton_dot_row(dts[di], we, x + 3 * K, K, &d0));
		T_ASSERT(memcmp(&d0, &y[3 * N], 4) == 0);
		free(w), free(wd), free(b), free(bd), free(x), free(y), free(y0), free(we), free(be);
	}
}

static void t_matmul_refuses(void)
{
	float w[64], x[64], y[64];
	memset(w, 0, sizeof w);
	memset(x, 0, sizeof x);
	T_EQ_ERR(H->matmul(NULL, D(w), BATON_DT_IQ2_XXS, 2, 32, 0, 0, D(x), 1, D(y), 0),
	    BATON_EUNSUPPORTED);
	T_EQ_ERR(H->matmul(NULL, D(w), BATON_DT_Q8_0, 1, 33, 0, 0, D(x), 1, D(y), 0), BATON_EINVAL);
	T_EQ_ERR(H->matmul(NULL, D(w), BATON_DT_F32, 2, 8, 0, 0, D(x), 1, D(x + 4), 0), BATON_EINVAL);
	T_EQ_ERR(H->matmul(NULL, 0, BATON_DT_F32, 2, 8, 0, 0, D(x), 1, D(y), 0), BATON_EINVAL);
	T_EQ_ERR(H->matmul(NULL, D(w), BATON_DT_F32, 0, 8, 0, 0, D(x), 1, D(y), 0), BATON_EINVAL);
}

/* matmuls: q, k and v over one x, each the bits of its own matmul
 * (a bias on one); the second matrix refused (an unsupported type, or
 * its y over the first's) writes nothing, not even the first's y. */
static void t_matmuls(void)
{
	const uint32_t K = 64, R = 3, N[3] = { 24, 8, 8 };
	float *x = rvec((size_t)R * K), *b = rvec(8), *w[3], *y[3], *z[3];
	struct baton_matmuls mm = { .x = D(x), .rows = R, .k = K, .n = 3 };
	for (int i = 0; i < 3; i++) {
		w[i] = rvec((size_t)N[i] * K);
		y[i] = calloc((size_t)R * N[i], 4);
		z[i] = calloc((size_t)R * N[i], 4);
		T_ASSERT(y[i] && z[i]);
		mm.m[i] = (struct baton_matmul_out){ .w = D(w[i]), .b = i == 1 ? D(b) : 0, .y = D(y[i]),
			.w_dtype = BATON_DT_F32, .b_dtype = BATON_DT_F32, .n_out = N[i] };
		T_OK(H->matmul(NULL, D(w[i]), BATON_DT_F32, N[i], K, mm.m[i].b, BATON_DT_F32, D(x), R,
		    D(z[i]), 0));
	}
	T_OK(H->matmuls(NULL, &mm));
	for (int i = 0; i < 3; i++)
		T_ASSERT(memcmp(y[i], z[i], (size_t)R * N[i] * 4) == 0);
	memset(y[0], 0, (size_t)R * N[0] * 4);
	mm.m[1].w_dtype = BATON_DT_IQ2_XXS;
	T_EQ_ERR(H->matmuls(NULL, &mm), BATON_EUNSUPPORTED);
	mm.m[1].w_dtype = BATON_DT_F32;
	mm.m[1].y = D(y[0] + 4);
	T_EQ_ERR(H->matmuls(NULL, &mm), BATON_EINVAL);
	mm.m[1].y = D(y[1]);
	mm.n = 4;
	T_EQ_ERR(H->matmuls(NULL, &mm), BATON_EINVAL);
	for (uint32_t i = 0; i < R * N[0]; i++)
		T_ASSERT(y[0][i] == 0);
	for (int i = 0; i < 3; i++)
		free(w[i]), free(y[i]), free(z[i]);
	free(x), free(b);
}

static void t_embed(void)
{
	const uint32_t V = 50, C = 64;
	float *t = rvec((size_t)V * C), *td = malloc((size_t)V * C * 4), out[3 * 64];
	T_ASSERT(td);
	void *te = encode(BATON_DT_Q8_0, t, V, C, td);
	uint32_t tok[3] = { 49, 0, 7 };
	T_OK(H->embed(NULL, D(te), BATON_DT_Q8_0, V, C, tok, 3, D(out)));
	for (int i = 0; i < 3; i++)
		T_ASSERT(memcmp(out + i * C, td + tok[i] * C, C * 4) == 0);
	memset(out, 0x55, sizeof out);
	uint32_t bad[2] = { 1, 50 };
	T_EQ_ERR(H->embed(NULL, D(te), BATON_DT_Q8_0, V, C, bad, 2, D(out)), BATON_ERANGE);
	T_ASSERT(((uint8_t *)out)[0] == 0x55); /* nothing written */
	free(t), free(td), free(te);
}

static void t_rmsnorm(void)
{
	const uint32_t R = 5, C = 48;
	float *x = rvec((size_t)R * C), *w = rvec(C), *out = malloc((size_t)R * C * 4);
	float *x2 = malloc((size_t)R * C * 4);
	T_ASSERT(out && x2);
	memcpy(x2, x, (size_t)R * C * 4);
	const float eps = 1e-5f;
	T_OK(H->rmsnorm(NULL, D(x), D(out), R, C, D(w), BATON_DT_F32, eps));
	for (uint32_t r = 0; r < R; r++) {
		double ss = 0;
		for (uint32_t i = 0; i < C; i++)
			ss += (double)x[r * C + i] * x[r * C + i];
		double s = 1.0 / sqrt(ss / C + eps);
		for (uint32_t i = 0; i < C; i++)
			near(out[r * C + i], x[r * C + i] * s * w[i], 4, "rmsnorm", r * C + i);
	}
	/* in place gives the same bits; no weight means weight 1 */
	T_OK(H->rmsnorm(NULL, D(x2), D(x2), R, C, D(w), BATON_DT_F32, eps));
	T_ASSERT(memcmp(x2, out, (size_t)R * C * 4) == 0);
	T_OK(H->rmsnorm(NULL, D(x), D(out), R, C, 0, 0, eps));
	near(out[7] * w[7], x2[7], 4, "rmsnorm w=1", 7);
	T_EQ_ERR(H->rmsnorm(NULL, D(x), D(x + 1), R, C, 0, 0, eps), BATON_EINVAL);
	free(x), free(w), free(out), free(x2);
}

static void t_rope(void)
{
	const uint32_t R = 3, NH = 2, HD = 8;
	float *x = rvec((size_t)R * NH * HD), *x0 = malloc((size_t)R * NH * HD * 4);
	T_ASSERT(x0);
	memcpy(x0, x, (size_t)R * NH * HD * 4);
	uint32_t pos[3] = { 0, 5, 1000 };
	float inv[4];
	for (int i = 0; i < 4; i++)
		inv[i] = (float)(1.0 / pow(10000.0, 2.0 * i / HD));
	T_OK(H->rope(NULL, D(x), R, NH, HD, pos, inv, 1.0f));
	for (uint32_t r = 0; r < R; r++)
		for (uint32_t h = 0; h < NH; h++)
			for (uint32_t i = 0; i < HD / 2; i++) {
				size_t b = (r * NH + h) * HD;
				double a = (double)(float)((float)pos[r] * inv[i]);
				double x1 = x0[b + i], x2 = x0[b + i + HD / 2];
				near(x[b + i], x1 * cos(a) - x2 * sin(a), 2, "rope lo", b + i);
				near(x[b + i + HD / 2], x2 * cos(a) + x1 * sin(a), 2, "rope hi", b + i);
			}
	/* position 0 is the identity */
	for (uint32_t i = 0; i < NH * HD; i++)
		T_ASSERT(x[i] == x0[i]);
	T_EQ_ERR(H->rope(NULL, D(x), R, NH, 7, pos, inv, 1.0f), BATON_EINVAL);
	free(x), free(x0);
}

static void t_attention_gqa(void)
{
	const uint32_t NQ = 3, POS0 = 4, NH = 4, KH = 2, HD = 16, CTX = POS0 + NQ;
	float *q = rvec((size_t)NQ * NH * HD), *k = rvec((size_t)CTX * KH * HD);
	float *v = rvec((size_t)CTX * KH * HD), *out = malloc((size_t)NQ * NH * HD * 4);
	T_ASSERT(out);
	struct baton_attn a = { .q = D(q), .k = D(k), .v = D(v), .out = D(out), .n_q = NQ,
		.n_heads = NH, .n_kv_heads = KH, .head_dim = HD, .pos0 = POS0, .scale = 0.25f };
	T_OK(H->attention(NULL, &a));
	for (uint32_t t = 0; t < NQ; t++)
		for (uint32_t h = 0; h < NH; h++) {
			uint32_t g = h / (NH / KH), nk = POS0 + t + 1;
			double s[16], mx = -1e300, sum = 0;
			for (uint32_t j = 0; j < nk; j++) {
				double d = 0;
				for (uint32_t i = 0; i < HD; i++)
					d += (double)q[(t * NH + h) * HD + i] * k[(j * KH + g) * HD + i];
				s[j] = d * 0.25;
				mx = fmax(mx, s[j]);
			}
			for (uint32_t j = 0; j < nk; j++)
				sum += (s[j] = exp(s[j] - mx));
			for (uint32_t i = 0; i < HD; i++) {
				double o = 0;
				for (uint32_t j = 0; j < nk; j++)
					o += s[j] / sum * v[(j * KH + g) * HD + i];
				near(out[(t * NH + h) * HD + i], o, 2, "attention", (t * NH + h) * HD + i);
			}
		}
	/* a key past the query's position changes nothing (causal) */
	float *o1 = malloc((size_t)NQ * NH * HD * 4);
	T_ASSERT(o1);
	memcpy(o1, out, (size_t)NQ * NH * HD * 4);
	k[(CTX - 1) * KH * HD] += 100.0f;
	T_OK(H->attention(NULL, &a));
	T_ASSERT(memcmp(o1, out, (size_t)(NQ - 1) * NH * HD * 4) == 0);
	a.n_kv_heads = 3;
	T_EQ_ERR(H->attention(NULL, &a), BATON_EINVAL);
	a.n_kv_heads = KH;
	a.out = a.q;
	T_EQ_ERR(H->attention(NULL, &a), BATON_EINVAL);
	free(q), free(k), free(v), free(out), free(o1);
}

/* Paged: the keys scattered over blocks of a pool through a block table
 * give bitwise the contiguous result; kv_store puts rows where the table
 * says; bad tables and slots are refused. */
static void t_attention_paged(void)
{
	const uint32_t NQ = 5, POS0 = 30, NH = 4, KH = 2, HD = 16, CTX = POS0 + NQ, BS = 8;
	const uint32_t NB = (CTX + BS - 1) / BS, POOL = 9, ROW = KH * HD;
	const uint32_t table[5] = { 7, 2, 8, 0, 5 }; /* NB = 5 of the pool's 9 */
	float *q = rvec((size_t)NQ * NH * HD), *k = rvec((size_t)CTX * ROW);
	float *v = rvec((size_t)CTX * ROW);
	float *kp = calloc((size_t)POOL * BS * ROW, 4), *vp = calloc((size_t)POOL * BS * ROW, 4);
	float *o1 = malloc((size_t)NQ * NH * HD * 4), *o2 = malloc((size_t)NQ * NH * HD * 4);
	uint32_t *slots = malloc(CTX * sizeof *slots);
	T_ASSERT(kp && vp && o1 && o2 && slots && NB == 5);
	for (uint32_t j = 0; j < CTX; j++)
		slots[j] = table[j / BS] * BS + j % BS;
	struct baton_kv_store st = { .k = D(k), .v = D(v), .k_cache = D(kp), .v_cache = D(vp),
		.slots = slots, .n = CTX, .cols = ROW, .cache_rows = POOL * BS };
	T_OK(H->kv_store(NULL, &st));
	for (uint32_t j = 0; j < CTX; j++)
		T_ASSERT(memcmp(kp + (size_t)slots[j] * ROW, k + (size_t)j * ROW, ROW * 4) == 0 &&
		    memcmp(vp + (size_t)slots[j] * ROW, v + (size_t)j * ROW, ROW * 4) == 0);
	struct baton_attn a = { .q = D(q), .k = D(k), .v = D(v), .out = D(o1), .n_q = NQ,
		.n_heads = NH, .n_kv_heads = KH, .head_dim = HD, .pos0 = POS0, .scale = 0.25f };
	T_OK(H->attention(NULL, &a));
	a.k = D(kp), a.v = D(vp), a.out = D(o2), a.blocks = table, a.block_size = BS;
	T_OK(H->attention(NULL, &a));
	T_ASSERT(memcmp(o1, o2, (size_t)NQ * NH * HD * 4) == 0);
	a.block_size = 0;
	T_EQ_ERR(H->attention(NULL, &a), BATON_EINVAL);
	slots[2] = POOL * BS;
	T_EQ_ERR(H->kv_store(NULL, &st), BATON_ERANGE);
	st.v_cache = st.k_cache;
	T_EQ_ERR(H->kv_store(NULL, &st), BATON_EINVAL);
	free(q), free(k), free(v), free(kp), free(vp), free(o1), free(o2), free(slots);
}

/* attention_segs: three sequences' segments (a decode row, a prefill
 * chunk, another decode row) over one pool, each with its own table:
 * every segment's rows bitwise the attention call of that segment alone;
 * a bad segment (no table, more heads than KV heads allow) or no
 * segments refused with nothing written. */
static void t_attention_segs(void)
{
	const uint32_t NH = 4, KH = 2, HD = 16, BS = 8, POOL = 12, ROW = KH * HD, QR = NH * HD;
	const uint32_t t0[3] = { 3, 9, 1 }, t1[4] = { 0, 11, 4, 6 }, t2[2] = { 10, 2 };
	struct baton_attn_seg sg[3] = {
		{ .n_q = 1, .pos0 = 20, .blocks = t0 },  /* 21 keys over 3 blocks */
		{ .n_q = 6, .pos0 = 25, .blocks = t1 },  /* keys 26 .. 31 over 4 */
		{ .n_q = 1, .pos0 = 9, .blocks = t2 },   /* 10 keys over 2 */
	};
	const uint32_t N = 8;
	float *q = rvec((size_t)2 * N * QR), *kp = rvec((size_t)POOL * BS * ROW);
	float *vp = rvec((size_t)POOL * BS * ROW), *got = malloc((size_t)N * QR * 4);
	float *want = malloc((size_t)N * QR * 4);
	T_ASSERT(got && want);
	struct baton_attn_segs as = { .q = D(q), .k = D(kp), .v = D(vp), .out = D(got), .n_seg = 3,
		.n_heads = NH, .n_kv_heads = KH, .head_dim = HD, .block_size = BS, .scale = 0.25f,
		.segs = sg };
	T_OK(H->attention_segs(NULL, &as));
	for (uint32_t i = 0, row = 0; i < 3; row += sg[i].n_q, i++) {
		struct baton_attn a = { .q = D(q + (size_t)row * QR), .k = D(kp), .v = D(vp),
			.out = D(want + (size_t)row * QR), .n_q = sg[i].n_q, .n_heads = NH,
			.n_kv_heads = KH, .head_dim = HD, .pos0 = sg[i].pos0, .scale = 0.25f,
			.blocks = sg[i].blocks, .block_size = BS };
		T_OK(H->attention(NULL, &a));
	}
	T_ASSERT(memcmp(got, want, (size_t)N * QR * 4) == 0);
	/* refusals: nothing written */
	memset(got, 0x5a, (size_t)N * QR * 4);
	memcpy(want, got, (size_t)N * QR * 4);
	sg[2].blocks = NULL;
	T_EQ_ERR(H->attention_segs(NULL, &as), BATON_EINVAL);
	sg[2].blocks = t2;
	as.n_heads = 3;
	T_EQ_ERR(H->attention_segs(NULL, &as), BATON_EINVAL);
	as.n_heads = NH;
	as.n_seg = 0;
	T_EQ_ERR(H->attention_segs(NULL, &as), BATON_EINVAL);
	as.n_seg = 3;
	as.out = D(q + 7 * QR); /* out over another segment's q, no segment's own */
	T_EQ_ERR(H->attention_segs(NULL, &as), BATON_EINVAL);
	T_ASSERT(memcmp(got, want, (size_t)N * QR * 4) == 0);
	free(q), free(kp), free(vp), free(got), free(want);
}

static void t_swiglu_add(void)
{
	const uint32_t R = 3, C = 10;
	float *g = rvec(R * C), *u = rvec(R * C), *o = malloc(R * C * 4);
	float *x = rvec(R * C), *x0 = malloc(R * C * 4), gate[3] = { -2.0f, 0.0f, 3.0f };
	T_ASSERT(o && x0);
	T_OK(H->swiglu(NULL, D(g), D(u), D(o), R * C));
	for (uint32_t i = 0; i < R * C; i++)
		near(o[i], g[i] / (1 + exp(-(double)g[i])) * u[i], 1, "swiglu", i);
	memcpy(x0, x, R * C * 4);
	T_OK(H->add(NULL, D(x), D(o), D(gate), R, C));
	for (uint32_t i = 0; i < R * C; i++)
		near(x[i], x0[i] + o[i] / (1 + exp(-(double)gate[i / C])), 2, "add gated", i);
	memcpy(x, x0, R * C * 4);
	T_OK(H->add(NULL, D(x), D(o), 0, R, C));
	for (uint32_t i = 0; i < R * C; i++)
		T_ASSERT(x[i] == x0[i] + o[i]);
	T_EQ_ERR(H->add(NULL, D(x), D(x + 1), 0, R, C), BATON_EINVAL);
	free(g), free(u), free(o), free(x), free(x0);
}

static void t_route_rules(void)
{
	/* one row: logits with a clear order 3 > 0 > 2 > 1 */
	float l[4] = { 1.0f, -1.0f, 0.5f, 2.0f };
	uint32_t ids[2];
	float w[2];
	double e[4], sum = 0;
	for (int i = 0; i < 4; i++)
		sum += (e[i] = exp(l[i]));
	T_OK(H->route(NULL, D(l), 1, 4, 2, BATON_ROUTE_SOFTMAX_TOPK, ids, w));
	T_EQ_INT(ids[0], 3);
	T_EQ_INT(ids[1], 0);
	near(w[0], e[3] / sum, 1, "route p", 0);
	near(w[1], e[0] / sum, 1, "route p", 1);
	T_OK(H->route(NULL, D(l), 1, 4, 2, BATON_ROUTE_SOFTMAX_TOPK_NORM, ids, w));
	/* renormalised = a softmax over the two chosen logits (mixtral) */
	near(w[0], e[3] / (e[3] + e[0]), 1, "route norm", 0);
	near(w[1], e[0] / (e[3] + e[0]), 1, "route norm", 1);
	/* ties go to the lower id */
	float t[3] = { 0.5f, 0.5f, 0.5f };
	T_OK(H->route(NULL, D(t), 1, 3, 2, BATON_ROUTE_SOFTMAX_TOPK, ids, w));
	T_EQ_INT(ids[0], 0);
	T_EQ_INT(ids[1], 1);
	T_EQ_ERR(H->route(NULL, D(l), 1, 4, 5, BATON_ROUTE_SOFTMAX_TOPK, ids, w), BATON_EINVAL);
	T_EQ_ERR(H->route(NULL, D(l), 1, 4, 2, 7, ids, w), BATON_EINVAL);
}

/* router_route_dev: the rmsnorm, matmul and route_dev it stands for, bit
 * for bit, with the norm and without; a refused call writes nothing. */
static void t_router_route(void)
{
	enum { R = 3, K = 256, E = 16, TK = 4 };
	float *x = rvec((size_t)R * K), *nw = rvec(K), *w = rvec((size_t)E * K);
	float xn[R * K], xn2[R * K], lg[R * E], lg2[R * E], wt[R * TK], wt2[R * TK];
	uint32_t ids[R * TK], ids2[R * TK];
	for (int norm_on = 0; norm_on < 2; norm_on++) {
		if (norm_on)
			T_OK(H->rmsnorm(NULL, D(x), D(xn), R, K, D(nw), BATON_DT_F32, 1e-6f));
		else
			memcpy(xn, x, sizeof xn);
		memcpy(xn2, norm_on ? x : xn, sizeof xn2); /* xn2: the input, or garbage to overwrite */
		T_OK(H->matmul(NULL, D(w), BATON_DT_F32, E, K, 0, 0, D(xn), R, D(lg), 0));
		T_OK(H->route_dev(NULL, D(lg), R, E, TK, BATON_ROUTE_SOFTMAX_TOPK_NORM, D(ids), D(wt)));
		struct baton_router_route rr = { .x = D(x), .xn = D(xn2), .norm = D(nw), .w = D(w),
			.logits = D(lg2), .ids = D(ids2), .weights = D(wt2), .norm_on = (uint32_t)norm_on,
			.norm_dtype = BATON_DT_F32, .w_dtype = BATON_DT_F32, .n_experts = E, .k = K,
			.rows = R, .top_k = TK, .rule = BATON_ROUTE_SOFTMAX_TOPK_NORM, .eps = 1e-6f };
		T_OK(H->router_route_dev(NULL, &rr));
		T_ASSERT(memcmp(xn, xn2, sizeof xn) == 0 && memcmp(lg, lg2, sizeof lg) == 0);
		T_ASSERT(memcmp(ids, ids2, sizeof ids) == 0 && memcmp(wt, wt2, sizeof wt) == 0);
		memset(lg2, 0, sizeof lg2);
		struct baton_router_route bad = rr;
		bad.rule = 7;
		T_EQ_ERR(H->router_route_dev(NULL, &bad), BATON_EINVAL);
		bad = rr;
		bad.top_k = E + 1;
		T_EQ_ERR(H->router_route_dev(NULL, &bad), BATON_EINVAL);
		bad = rr;
		bad.logits = D(xn2 + 4);
		T_EQ_ERR(H->router_route_dev(NULL, &bad), BATON_EINVAL);
		const float zero[R * E] = { 0 };
		T_ASSERT(memcmp(lg2, zero, sizeof lg2) == 0); /* refused: nothing written */
	}
	free(x), free(nw), free(w);
}

/* matmul and attention split their outputs over threads: the bits do not
 * depend on how many (sizes large enough for several parts). */
static void t_threads_same_bits(void)
{
	const uint32_t N = 512, K = 256, R = 5;
	float *w = rvec((size_t)N * K), *x = rvec((size_t)R * K);
	float *y1 = malloc((size_t)R * N * 4), *y4 = malloc((size_t)R * N * 4);
	const uint32_t NQ = 48, NH = 8, KH = 2, HD = 64;
	float *q = rvec((size_t)NQ * NH * HD), *k = rvec((size_t)NQ * KH * HD);
	float *v = rvec((size_t)NQ * KH * HD);
	float *o1 = malloc((size_t)NQ * NH * HD * 4), *o4 = malloc((size_t)NQ * NH * HD * 4);
	T_ASSERT(y1 && y4 && o1 && o4);
	struct baton_attn a = { .q = D(q), .k = D(k), .v = D(v), .n_q = NQ, .n_heads = NH,
		.n_kv_heads = KH, .head_dim = HD, .pos0 = 0, .scale = 0.125f };
	T_EQ_INT(host_moe_set_threads(1), 1);
	T_OK(H->matmul(NULL, D(w), BATON_DT_F32, N, K, 0, 0, D(x), R, D(y1), 0));
	a.out = D(o1);
	T_OK(H->attention(NULL, &a));
	T_EQ_INT(host_moe_set_threads(4), 4);
	T_OK(H->matmul(NULL, D(w), BATON_DT_F32, N, K, 0, 0, D(x), R, D(y4), 0));
	a.out = D(o4);
	T_OK(H->attention(NULL, &a));
	T_ASSERT(memcmp(y1, y4, (size_t)R * N * 4) == 0);
	T_ASSERT(memcmp(o1, o4, (size_t)NQ * NH * HD * 4) == 0);
	free(w), free(x), free(y1), free(y4), free(q), free(k), free(v), free(o1), free(o4);
}

T_MAIN(T_CASE(t_matmul_dtypes), T_CASE(t_matmul_refuses), T_CASE(t_matmuls), T_CASE(t_embed), T_CASE(t_rmsnorm),
    T_CASE(t_rope), T_CASE(t_attention_gqa), T_CASE(t_attention_paged),
    T_CASE(t_attention_segs),
    T_CASE(t_swiglu_add), T_CASE(t_route_rules), T_CASE(t_router_route),
    T_CASE(t_threads_same_bits))
