/*
 * ops_attn_test.c: the cuda backend's attention (engine/backend/cuda/
 * attn_split.cu, attn_split_launch.c) against the host backend's
 * (engine/backend/host/ops.c, the reference), on random data, through the
 * backend table as the model calls it (the helpers: cuda_ops_fixture.h).
 * Built only with CUDA=1; without a driver or a device every case prints
 * "skip: why" and passes.
 *
 * What must agree how:
 *   - attention and attention_segs: within 2e-6 of the magnitude of the
 *     host's (the device's expf is not glibc's: CUDA's guide gives 2 ulp
 *     at most), contiguous and paged, up to 5,001 keys; a query's row
 *     bitwise that of the same query in a call of its own (its chunks
 *     depend on its position alone), and the same bits twice; a segment of
 *     70 rows on the tensor cores within their 2e-2;
 *   - qk_attention_segs: bit for bit qk_norm_rope then attention_segs, out
 *     and both caches, at every BATON_CUDA_ATTN_NH;
 *   - a one-row attention's output quantized for the o projection: the o
 *     matmul's bits those of the same matmul quantizing it itself.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/cuda/cuda_fixture.h"
#include "engine/backend/cuda/cuda_ops_fixture.h"
#include "engine/backend/host/host.h"
#include "tests/t.h"

/* Attention of n_q queries from pos0, contiguous or (paged) through a
 * shuffled block table of 16-position blocks in a larger pool: the cuda
 * result within the tolerance of the host's, and its last query's row
 * bitwise that of the query computed in a call of its own (a query's
 * chunks depend on its position alone). */
static void attention_case(struct baton_dev *dev, uint32_t n_q, uint32_t pos0, uint32_t Hh,
    uint32_t KH, uint32_t hd, int paged)
{
	const uint32_t BS = 16;
	const uint64_t n_ctx = (uint64_t)pos0 + n_q, qn = (uint64_t)n_q * Hh * hd;
	const uint32_t nb = (uint32_t)((n_ctx + BS - 1) / BS), pool = nb + 3;
	const uint64_t rows = paged ? (uint64_t)pool * BS : n_ctx, row = (uint64_t)KH * hd;
	const uint64_t kn = rows * row;
	float *q = rvec(qn), *k = rvec(kn), *v = rvec(kn);
	uint32_t *table = malloc(pool * sizeof *table);
	T_ASSERT(table);
	for (uint32_t i = 0; i < pool; i++)
		table[i] = i;
	for (uint32_t i = pool - 1; i > 0; i--) { /* a shuffled table */
		uint32_t j = (uint32_t)(rnd() % (i + 1)), t = table[i];
		table[i] = table[j];
		table[j] = t;
	}
	for (uint64_t i = 0; i < qn; i++)
		q[i] *= 2.0f;
	float *got = malloc(qn * 4), *want = malloc(qn * 4), *one = malloc((size_t)Hh * hd * 4);
	T_ASSERT(got && want && one);
	baton_dptr dq = up(dev, q, qn * 4), dk = up(dev, k, kn * 4), dv = up(dev, v, kn * 4), dout;
	T_CU(dev, be->alloc(dev, qn * 4, &dout));
	const float scale = 1.0f / sqrtf((float)hd);
	struct baton_attn a = { .q = dq, .k = dk, .v = dv, .out = dout, .n_q = n_q, .n_heads = Hh,
		.n_kv_heads = KH, .head_dim = hd, .pos0 = pos0, .scale = scale,
		.blocks = paged ? table : NULL, .block_size = paged ? BS : 0 };
	T_CU(dev, be->attention(dev, &a));
	down(dev, got, dout, qn * 4);
	struct baton_attn ha = a;
	ha.q = H(q), ha.k = H(k), ha.v = H(v), ha.out = H(want);
	T_OK(host_op_attention(NULL, &ha));
	char what[80];
	snprintf(what, sizeof what, "attention n_q=%u pos0=%u%s", n_q, pos0, paged ? " paged" : "");
	close_to(got, want, qn, 2e-6, what);
	/* the last query alone */
	struct baton_attn a1 = a;
	a1.n_q = 1;
	a1.pos0 = pos0 + n_q - 1;
	a1.q = dq + (qn - (uint64_t)Hh * hd) * 4;
	T_CU(dev, be->attention(dev, &a1));
	down(dev, one, dout, (uint64_t)Hh * hd * 4);
	T_ASSERT_MSG(memcmp(one, got + qn - (uint64_t)Hh * hd, (size_t)Hh * hd * 4) == 0,
	    "%s: the last query alone differs from it among %u", what, n_q);
	be->free(dev, dq), be->free(dev, dk), be->free(dev, dv), be->free(dev, dout);
	free(q), free(k), free(v), free(got), free(want), free(one), free(table);
}

static void t_attention(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	for (int paged = 0; paged < 2; paged++) {
		attention_case(dev, 1, 0, 4, 2, 32, paged);     /* the first token */
		attention_case(dev, 19, 0, 4, 2, 16, paged);    /* a prefill */
		attention_case(dev, 1, 700, 8, 2, 128, paged);  /* a decode step deep in the cache */
		attention_case(dev, 5, 3, 6, 3, 70, paged);     /* a head_dim with a tail */
		attention_case(dev, 40, 230, 4, 2, 64, paged);  /* a chunk prefill across 256 keys */
		attention_case(dev, 1, 5000, 8, 4, 128, paged); /* 20 chunks */
		attention_case(dev, 3, 255, 4, 4, 32, paged);   /* 256, 257, 258 keys */
	}
	be->close(dev);
}

/* attention_segs: the segments of several sequences over one shuffled
 * pool of 16-position blocks (decode rows at 1, 64, 65, 701 and 5,001
 * keys, a prefill chunk across a chunk's end, a 70-row segment that the
 * tensor cores take where they are on), in one call: each segment
 * within attention's tolerance of the host's, each row bitwise the same
 * row alone (attention's own call takes the same kernel), the same bits
 * when called again (the merge's counters left zeroed); and a refusal
 * that writes nothing. Head groups of 8 (Qwen3-30B-A3B's), 12 (two
 * tiles, the second partial) and 1. */
static void attention_segs_case(struct baton_dev *dev, uint32_t Hh, uint32_t KH, uint32_t hd)
{
	const uint32_t BS = 16, NS = 7;
	const uint32_t nq[7] = { 1, 1, 1, 1, 19, 70, 1 }, p0[7] = { 0, 63, 64, 700, 50, 10, 5000 };
	uint64_t n = 0, nb_all = 0;
	for (uint32_t i = 0; i < NS; i++) {
		n += nq[i];
		nb_all += (p0[i] + nq[i] + BS - 1) / BS;
	}
	const uint32_t pool = (uint32_t)nb_all + 5;
	const uint64_t qr = (uint64_t)Hh * hd, qn = n * qr, kn = (uint64_t)pool * BS * KH * hd;
	uint32_t *perm = malloc(pool * sizeof *perm), *tabs[7];
	T_ASSERT(perm);
	for (uint32_t i = 0; i < pool; i++)
		perm[i] = i;
	for (uint32_t i = pool - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	struct baton_attn_seg sg[7];
	uint32_t used = 0;
	for (uint32_t i = 0; i < NS; i++) { /* each sequence its own blocks of the pool */
		const uint32_t nb = (p0[i] + nq[i] + BS - 1) / BS;
		tabs[i] = perm + used;
		used += nb;
		sg[i] = (struct baton_attn_seg){ .n_q = nq[i], .pos0 = p0[i], .blocks = tabs[i] };
	}
	float *q = rvec(qn), *k = rvec(kn), *v = rvec(kn);
	for (uint64_t i = 0; i < qn; i++)
		q[i] *= 2.0f;
	float *got = malloc(qn * 4), *again = malloc(qn * 4), *want = malloc(qn * 4);
	float *one = malloc(qr * 4);
	T_ASSERT(got && again && want && one);
	baton_dptr dq = up(dev, q, qn * 4), dk = up(dev, k, kn * 4), dv = up(dev, v, kn * 4), dout;
	T_CU(dev, be->alloc(dev, qn * 4, &dout));
	const float scale = 1.0f / sqrtf((float)hd);
	struct baton_attn_segs as = { .q = dq, .k = dk, .v = dv, .out = dout, .n_seg = NS,
		.n_heads = Hh, .n_kv_heads = KH, .head_dim = hd, .block_size = BS, .scale = scale,
		.segs = sg };
	T_CU(dev, be->attention_segs(dev, &as));
	down(dev, got, dout, qn * 4);
	T_CU(dev, be->attention_segs(dev, &as));
	down(dev, again, dout, qn * 4);
	char what[96];
	snprintf(what, sizeof what, "attention_segs %u/%u heads of %u, twice", Hh, KH, hd);
	same_bits(again, got, qn, what);
	struct baton_attn_segs hs = as;
	hs.q = H(q), hs.k = H(k), hs.v = H(v), hs.out = H(want);
	T_OK(host_op_attention_segs(NULL, &hs));
	uint64_t row = 0;
	for (uint32_t i = 0; i < NS; row += nq[i], i++) {
		snprintf(what, sizeof what, "attention_segs %u/%u heads of %u, n_q=%u pos0=%u", Hh, KH,
		    hd, nq[i], p0[i]);
		/* the tensor cores' bf16 within their 2e-2 (t_tensor_cores) */
		close_to(got + row * qr, want + row * qr, nq[i] * qr, nq[i] >= 64 ? 2e-2 : 2e-6, what);
		if (nq[i] >= 64)
			continue; /* the tensor cores' rows depend on their pass */
		for (uint32_t t = 0; t < nq[i]; t += nq[i] > 1 ? nq[i] - 1 : 1) {
			struct baton_attn a1 = { .q = dq + (row + t) * qr * 4, .k = dk, .v = dv,
				.out = dout, .n_q = 1, .n_heads = Hh, .n_kv_heads = KH, .head_dim = hd,
				.pos0 = p0[i] + t, .scale = scale, .blocks = tabs[i], .block_size = BS };
			T_CU(dev, be->attention(dev, &a1));
			down(dev, one, dout, qr * 4);
			T_ASSERT_MSG(memcmp(one, got + (row + t) * qr, qr * 4) == 0,
			    "%s: row %u alone differs from it among the segments", what, t);
		}
	}
	/* refused, nothing written: a segment without its table */
	T_CU(dev, be->attention_segs(dev, &as));
	sg[3].blocks = NULL;
	T_EQ_ERR(be->attention_segs(dev, &as), BATON_EINVAL);
	sg[3].blocks = tabs[3];
	down(dev, again, dout, qn * 4);
	same_bits(again, got, qn, "attention_segs after a refusal");
	be->free(dev, dq), be->free(dev, dk), be->free(dev, dv), be->free(dev, dout);
	free(q), free(k), free(v), free(got), free(again), free(want), free(one), free(perm);
}

static void t_attention_segs(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	attention_segs_case(dev, 32, 4, 128);
	attention_segs_case(dev, 12, 1, 64);
	attention_segs_case(dev, 4, 4, 32);
	attention_segs_case(dev, 6, 3, 70); /* a head_dim the rows kernel leaves to the old one */
	be->close(dev);
}

/* qk_attention_segs (qk_norm_rope with its store, then attention_segs,
 * fused into one launch for decode rows) against the two calls apart:
 * the same bits in out and in both caches, at every heads-a-block of
 * the fused kernel (BATON_CUDA_ATTN_NH at open); rows at 1 to many
 * chunks of keys, one row alone (its output also quantized for the o
 * projection), and a pass with a row of several tokens (not fused: the
 * two calls' work). */
static void qk_attn_case(struct baton_dev *dev, uint32_t Hh, uint32_t KH, uint32_t hd,
    uint32_t NS, const uint32_t *nq, const uint32_t *p0)
{
	const uint32_t BS = 16, KD = KH * hd;
	uint64_t n = 0, nb_all = 0;
	for (uint32_t i = 0; i < NS; i++) {
		n += nq[i];
		nb_all += (p0[i] + nq[i] + BS - 1) / BS;
	}
	const uint32_t pool = (uint32_t)nb_all + 3;
	const uint64_t qr = (uint64_t)Hh * hd, qn = n * qr, cn = (uint64_t)pool * BS * KD;
	uint32_t *perm = malloc(pool * sizeof *perm), *pos = malloc(n * 4), *slots = malloc(n * 4);
	struct baton_attn_seg *sg = malloc(NS * sizeof *sg);
	T_ASSERT(perm && pos && slots && sg);
	for (uint32_t i = 0; i < pool; i++)
		perm[i] = i;
	for (uint32_t i = pool - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1)), t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	uint32_t used = 0, r = 0;
	for (uint32_t i = 0; i < NS; i++) {
		const uint32_t nb = (p0[i] + nq[i] + BS - 1) / BS;
		sg[i] = (struct baton_attn_seg){ .n_q = nq[i], .pos0 = p0[i], .blocks = perm + used };
		for (uint32_t t = 0; t < nq[i]; t++, r++) {
			const uint32_t p = p0[i] + t;
			pos[r] = p;
			slots[r] = perm[used + p / BS] * BS + p % BS;
		}
		used += nb;
	}
	float inv[128];
	for (uint32_t i = 0; i < hd / 2; i++)
		inv[i] = (float)pow(1e6, -(double)(2 * i) / hd);
	uint64_t wb;
	uint8_t *wq = weights(BATON_DT_F32, 1, hd, &wb), *wk = weights(BATON_DT_F32, 1, hd, &wb);
	float *q = rvec(qn), *k = rvec(n * KD), *v = rvec(n * KD), *kc = rvec(cn), *vc = rvec(cn);
	float *a = malloc((qn > cn ? qn : cn) * 4), *b = malloc((qn > cn ? qn : cn) * 4);
	T_ASSERT(a && b);
	baton_dptr dwq = up(dev, wq, wb), dwk = up(dev, wk, wb);
	baton_dptr dq[2], dk[2], dv[2], dkc[2], dvc[2], dout[2];
	for (int i = 0; i < 2; i++) {
		dq[i] = up(dev, q, qn * 4), dk[i] = up(dev, k, n * KD * 4), dv[i] = up(dev, v, n * KD * 4);
		dkc[i] = up(dev, kc, cn * 4), dvc[i] = up(dev, vc, cn * 4);
		T_CU(dev, be->alloc(dev, qn * 4, &dout[i]));
	}
	struct baton_qk_norm_rope nr[2];
	struct baton_attn_segs as[2];
	for (int i = 0; i < 2; i++) {
		nr[i] = (struct baton_qk_norm_rope){ .q = dq[i], .k = dk[i], .wq = dwq, .wk = dwk,
			.wq_dtype = BATON_DT_F32, .wk_dtype = BATON_DT_F32, .rows = (uint32_t)n,
			.heads = Hh, .kv_heads = KH, .head_dim = hd, .eps = 1e-6f, .mscale = 1.0f,
			.pos = pos, .inv_freq = inv, .v = dv[i], .k_cache = dkc[i], .v_cache = dvc[i],
			.slots = slots, .cache_rows = (uint64_t)pool * BS };
		as[i] = (struct baton_attn_segs){ .q = dq[i], .k = dkc[i], .v = dvc[i], .out = dout[i],
			.n_seg = NS, .n_heads = Hh, .n_kv_heads = KH, .head_dim = hd, .block_size = BS,
			.scale = 1.0f / sqrtf((float)hd), .segs = sg };
	}
	T_ASSERT(be->qk_attention_segs);
	T_CU(dev, be->qk_attention_segs(dev, &nr[0], &as[0]));
	T_CU(dev, be->qk_norm_rope(dev, &nr[1]));
	T_CU(dev, be->attention_segs(dev, &as[1]));
	char what[96];
	const baton_dptr pairs[3][2] = { { dout[0], dout[1] }, { dkc[0], dkc[1] }, { dvc[0], dvc[1] } };
	const uint64_t ns[3] = { qn, cn, cn };
	const char *names[3] = { "out", "k cache", "v cache" };
	for (int i = 0; i < 3; i++) {
		snprintf(what, sizeof what, "qk_attention_segs %u/%u heads of %u, %u segments: %s", Hh,
		    KH, hd, NS, names[i]);
		down(dev, a, pairs[i][0], ns[i] * 4);
		down(dev, b, pairs[i][1], ns[i] * 4);
		same_bits(a, b, ns[i], what);
	}
	/* again on the same inputs (the counters left zeroed, the store the
	 * same bits): q and k afresh, since a pass the backend does not fuse
	 * (the 5-row segment) norms and rotates them in place */
	struct baton_copy cq[2] = { { dq[0], q, qn * 4 }, { dk[0], k, n * KD * 4 } };
	T_CU(dev, be->copy_h2d(dev, cq, 2));
	T_CU(dev, be->qk_attention_segs(dev, &nr[0], &as[0]));
	down(dev, a, dout[0], qn * 4);
	down(dev, b, dout[1], qn * 4);
	same_bits(a, b, qn, "qk_attention_segs, twice");
	for (int i = 0; i < 2; i++)
		be->free(dev, dq[i]), be->free(dev, dk[i]), be->free(dev, dv[i]), be->free(dev, dkc[i]),
		    be->free(dev, dvc[i]), be->free(dev, dout[i]);
	be->free(dev, dwq), be->free(dev, dwk);
	free(wq), free(wk), free(q), free(k), free(v), free(kc), free(vc), free(a), free(b);
	free(perm), free(pos), free(slots), free(sg);
}

static void t_qk_attention_segs(void)
{
	static const char *const nhs[4] = { "1", "2", "4", "8" };
	const uint32_t nq16[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	const uint32_t p16[16] = { 0, 1, 5, 31, 62, 63, 64, 65, 127, 128, 200, 255, 256, 700, 1000,
		2047 };
	const uint32_t one_n[1] = { 1 }, one_p[1] = { 90 }, one_p2[1] = { 40 };
	const uint32_t mix_n[3] = { 1, 5, 1 }, mix_p[3] = { 100, 30, 7 };
	for (int i = 0; i < 4; i++) {
		setenv("BATON_CUDA_ATTN_NH", nhs[i], 1);
		struct baton_dev *dev = cuda_fixture_open();
		qk_attn_case(dev, 32, 4, 128, 16, nq16, p16);
		qk_attn_case(dev, 32, 4, 128, 1, one_n, one_p);
		qk_attn_case(dev, 32, 4, 128, 1, one_n, one_p2);
		qk_attn_case(dev, 12, 1, 64, 16, nq16, p16);
		qk_attn_case(dev, 4, 4, 32, 16, nq16, p16);
		qk_attn_case(dev, 32, 4, 128, 3, mix_n, mix_p);
		be->close(dev);
	}
	unsetenv("BATON_CUDA_ATTN_NH");
}

/* A one-row attention leaves its output quantized for the quantized o
 * projection right after it (as a one-row rmsnorm does): the o matmul's
 * bits those of the same matmul quantizing the output itself, after
 * another launch; over one chunk of keys and over several (the merge). */
static void t_attention_quant(void)
{
	struct baton_dev *dev = cuda_fixture_open();
	const uint32_t Hh = 32, KH = 4, hd = 128, QD = Hh * hd, BS = 16, NO = 256;
	const uint32_t pos0s[2] = { 30, 700 };
	const uint64_t kn = 64ull * BS * KH * hd;
	uint64_t wb;
	uint8_t *w = weights(BATON_DT_Q4_K, NO, QD, &wb);
	float *q = rvec(QD), *k = rvec(kn), *v = rvec(kn), *ya = malloc(NO * 4), *yb = malloc(NO * 4);
	T_ASSERT(ya && yb);
	uint32_t table[64];
	for (uint32_t i = 0; i < 64; i++)
		table[i] = (i * 37) % 64;
	baton_dptr dw = up(dev, w, wb), dq = up(dev, q, QD * 4), dk = up(dev, k, kn * 4);
	baton_dptr dv = up(dev, v, kn * 4), dout, dya, dyb, dsc = up(dev, q, 64 * 4);
	T_CU(dev, be->alloc(dev, QD * 4, &dout));
	T_CU(dev, be->alloc(dev, NO * 4, &dya));
	T_CU(dev, be->alloc(dev, NO * 4, &dyb));
	for (int c = 0; c < 2; c++) {
		const struct baton_attn_seg sg = { .n_q = 1, .pos0 = pos0s[c], .blocks = table };
		const struct baton_attn_segs as = { .q = dq, .k = dk, .v = dv, .out = dout, .n_seg = 1,
			.n_heads = Hh, .n_kv_heads = KH, .head_dim = hd, .block_size = BS,
			.scale = 1.0f / sqrtf((float)hd), .segs = &sg };
		T_CU(dev, be->attention_segs(dev, &as));
		T_CU(dev, be->matmul(dev, dw, BATON_DT_Q4_K, NO, QD, 0, 0, dout, 1, dya, 0));
		T_CU(dev, be->rmsnorm(dev, dsc, dsc, 1, 64, 0, 0, 1e-6f)); /* another launch */
		T_CU(dev, be->matmul(dev, dw, BATON_DT_Q4_K, NO, QD, 0, 0, dout, 1, dyb, 0));
		down(dev, ya, dya, NO * 4);
		down(dev, yb, dyb, NO * 4);
		same_bits(ya, yb, NO, c ? "o after attention, several chunks" : "o after attention, one chunk");
	}
	be->free(dev, dw), be->free(dev, dq), be->free(dev, dk), be->free(dev, dv);
	be->free(dev, dout), be->free(dev, dya), be->free(dev, dyb), be->free(dev, dsc);
	free(w), free(q), free(k), free(v), free(ya), free(yb);
	be->close(dev);
}

T_MAIN(T_CASE(t_attention), T_CASE(t_attention_segs), T_CASE(t_qk_attention_segs),
    T_CASE(t_attention_quant))
