/*
 * attn_split_launch.c: attention on the `cuda` backend (the slots
 * attention, attention_segs and qk_attention_segs of
 * engine/backend/backend.h): the kernels of attn_split.cu (embedded as a
 * fatbin), their argument checks (the host's, host/ops.c's codes), their
 * scratch (the per-chunk partial results, the rows kernel's counters and
 * its host array of rows and block tables) and their launches on the
 * context's stream; passes of many rows go to the tensor cores
 * (cuda_tc_attention, tc_launch.c), and qk_attention_segs falls back on
 * ops_launch.c's qk_norm_rope where it does not fuse. Small host arrays
 * go through ops_launch.c's staging ring (cuda_stage_args).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend/cuda/cuda_int.h"
#include "engine/backend/host/host.h"
#include "engine/backend/cuda/ops.h"

extern const unsigned char baton_engine_backend_cuda_attn_split_fatbin[];
extern const size_t baton_engine_backend_cuda_attn_split_fatbin_len;

/* Attention's per-chunk partial results are staged in device memory: at
 * most this many bytes at once (queries are launched in groups that fit). */
#define SCORES_MAX (64ull << 20)

/* ---- loading -------------------------------------------------------------- */

int cuda_attn_load(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	CU(dev, d->ModuleLoadData(&dev->attn_mod, baton_engine_backend_cuda_attn_split_fatbin),
	    "cuModuleLoadData of the attention kernels (sm_90 SASS, compute_90 PTX)");
	const struct {
		CUfunction *f;
		const char *name;
	} k[] = {
		{ &dev->k_attn_part, "baton_ops_attn_part" },
		{ &dev->k_attn_comb, "baton_ops_attn_combine" },
		{ &dev->k_attn_rows, "baton_ops_attn_rows" },
		{ &dev->k_attn_nr[0], "baton_ops_attn_nr1" },
		{ &dev->k_attn_nr[1], "baton_ops_attn_nr2" },
		{ &dev->k_attn_nr[2], "baton_ops_attn_nr4" },
		{ &dev->k_attn_nr[3], "baton_ops_attn_nr8" },
	};
	const size_t n = sizeof k / sizeof k[0];
	{
		const char *e = getenv("BATON_CUDA_ATTN_NH");
		const long nh = e ? strtol(e, NULL, 10) : 0;
		dev->ar_nh = nh == 1 || nh == 2 || nh == 4 || nh == 8 ? (uint32_t)nh : 0; /* 0: ar_nh_of */
		e = getenv("BATON_CUDA_ATTN_FUSE");
		dev->ar_fuse_off = e && strcmp(e, "0") == 0;
	}
	for (size_t i = 0; i < n; i++) {
		CUresult r = d->ModuleGetFunction(k[i].f, dev->attn_mod, k[i].name);
		if (r != CUDA_SUCCESS) {
			char what[96];
			snprintf(what, sizeof what, "cuModuleGetFunction %s", k[i].name);
			return cuda_fail(dev, r, what);
		}
	}
	/* one launch of each on empty sizes (each returns at once), as
	 * cuda_ops_load does: modules load lazily */
	union {
		struct baton_ops_attention_args a;
		struct baton_ops_attn_rows_args ar;
		struct baton_ops_attn_nr_args anr;
	} zero;
	memset(&zero, 0, sizeof zero);
	for (size_t i = 0; i < n; i++) {
		void *params[] = { &zero };
		CUresult r = d->LaunchKernel(*k[i].f, 1, 1, 1, 32, 1, 1, 0, dev->stream, params, NULL);
		if (r != CUDA_SUCCESS) {
			char what[96];
			snprintf(what, sizeof what, "first launch of %s", k[i].name);
			return cuda_fail(dev, r, what);
		}
	}
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the first launches");
	/* attention's counters (zeroed) and partial results, here rather
	 * than at the first decode step: a buffer made while a graph is
	 * recorded fails the recording (the allocation syncs) */
	int rc;
	if ((rc = cuda_dbuf_need(dev, &dev->ar_cnt, 1u << 20)) ||
	    (rc = cuda_dbuf_need(dev, &dev->ops_scores, 1u << 20)))
		return rc;
	CU(dev, d->MemsetD32Async(dev->ar_cnt.p, 0, dev->ar_cnt.cap / 4, dev->stream),
	    "cuMemsetD32Async (attention counters)");
	CU(dev, d->StreamSynchronize(dev->stream), "cuStreamSynchronize after the counters");
	return 0;
}

void cuda_attn_free(struct baton_dev *dev)
{
	cuda_dbuf_free(dev, &dev->ops_scores);
	cuda_dbuf_free(dev, &dev->ar_cnt);
	free(dev->ar_host);
	dev->ar_host = NULL;
	dev->ar_cap = 0;
	if (dev->attn_mod)
		dev->d->ModuleUnload(dev->attn_mod);
	dev->attn_mod = NULL;
}

/* ---- attention over rows of any sequences (baton_ops_attn_rows) ------------ */

/* The rows kernel's grid height (KV heads times tiles of their query
 * heads), 0 where it does not take these shapes or buffers (the old
 * kernels do). */
static uint32_t ar_gy(uint32_t H, uint32_t KH, uint32_t hd, baton_dptr q, baton_dptr k,
    baton_dptr v, baton_dptr out)
{
	if (hd % 32 || hd > BATON_OPS_AR_HD_MAX || ((q | k | v | out) & 15))
		return 0;
	const uint64_t gy = (uint64_t)KH * ((H / KH + BATON_OPS_AR_HEADS - 1) / BATON_OPS_AR_HEADS);
	return gy <= 65535 ? (uint32_t)gy : 0;
}

/* Chunks of the rows kernel's grid for rows of up to nk keys: in a graph
 * a power of two (a bucket: the recording replays until a row outgrows
 * it), so that the launch does not change as the keys grow. */
static uint64_t ar_chunks(const struct baton_dev *dev, uint64_t nk)
{
	uint64_t c = (nk + BATON_OPS_AR_CHUNK - 1) / BATON_OPS_AR_CHUNK, b = 1;
	if (dev->gmode == CUDA_G_NONE)
		return c;
	while (b < c)
		b <<= 1;
	return b;
}

/* Block-table entries a segment of n_ctx positions gets in the staged
 * tables: its own, or in a graph the bucket's capacity (fixed bytes
 * while the recording replays; entries past its own are 0). */
static uint64_t ar_tab_cap(const struct baton_dev *dev, uint64_t n_ctx, uint32_t bs,
    uint64_t chunks)
{
	const uint64_t nb = (n_ctx + bs - 1) / bs;
	if (dev->gmode == CUDA_G_NONE)
		return nb;
	const uint64_t cap = (chunks * BATON_OPS_AR_CHUNK + bs - 1) / bs;
	return cap > nb ? cap : nb;
}

/* The host array of n rows (u32 [4] each) and tab_n table entries after
 * them, grown as needed. */
static uint32_t *ar_buf(struct baton_dev *dev, uint64_t n, uint64_t tab_n)
{
	const uint64_t need = 4 * n + tab_n;
	if (need > dev->ar_cap) {
		uint32_t *p = realloc(dev->ar_host, need * 4);
		if (!p)
			return NULL;
		dev->ar_host = p;
		dev->ar_cap = need;
	}
	return dev->ar_host;
}

/* The fused decode attention's query heads a block for a pass of n rows:
 * BATON_CUDA_ATTN_NH, else 1 up to 4 rows (at batch 1 on the H200, 32
 * blocks rather than 16: the decode step 3.28 ms rather than 3.37,
 * 2026-12-04), 2 above (serving's 16 rows, as measured before). Any NH
 * gives the same bits. */
static uint32_t ar_nh_of(const struct baton_dev *dev, uint64_t n)
{
	return dev->ar_nh ? dev->ar_nh : n <= 4 ? 1 : 2;
}

/* Stages dev->ar_host's n rows and tab_n table entries (paged 0: keys
 * are rows of k and v) and launches the rows kernel over them, in groups
 * of rows whose partial results fit SCORES_MAX. */
static int ar_launch(struct baton_dev *dev, baton_dptr q, baton_dptr k, baton_dptr v,
    baton_dptr out, uint32_t H, uint32_t KH, uint32_t hd, uint32_t bs, float scale,
    uint32_t gy, uint64_t n, uint64_t tab_n, int paged, uint64_t chunks,
    struct baton_ops_attn_nr_args *nx)
{
	const uint64_t per_row = (uint64_t)H * chunks * (hd + 2) * 4;
	uint64_t group = SCORES_MAX / per_row;
	if (group < 1)
		group = 1;
	if (group > n)
		group = n;
	if (group > 0x7fffffffu)
		group = 0x7fffffffu;
	const uint64_t cnt_cap = dev->ar_cnt.cap;
	CUdeviceptr da;
	int rc;
	if ((rc = cuda_dbuf_need(dev, &dev->ops_scores, group * per_row)) ||
	    (rc = cuda_dbuf_need(dev, &dev->ar_cnt, group * gy * 4)))
		return rc;
	if (dev->ar_cnt.cap != cnt_cap) /* a new buffer: the counters start at 0 */
		CU(dev, dev->d->MemsetD32Async(dev->ar_cnt.p, 0, dev->ar_cnt.cap / 4, dev->stream),
		    "cuMemsetD32Async (attention counters)");
	if ((rc = cuda_stage_args(dev, dev->ar_host, (4 * n + tab_n) * 4, NULL, 0, &da, NULL)))
		return rc;
	/* one row (a decode step): its output also as the int8 blocks of the
	 * o projection's quantized GEMV right after (mmvq_launch.c) */
	uint64_t oq = 0, od = 0;
	if (n == 1 && (rc = cuda_mmvq_norm_out(dev, 1, H * hd, &oq, &od)))
		return rc;
	for (uint64_t r0 = 0; r0 < n; r0 += group) {
		const uint64_t nr = n - r0 < group ? n - r0 : group;
		struct baton_ops_attn_rows_args ka = {
			.q = q, .k = k, .v = v, .out = out, .part = dev->ops_scores.p,
			.rows = da + r0 * 16, .tab = paged ? da + n * 16 : 0, .cnt = dev->ar_cnt.p,
			.n_heads = H, .n_kv_heads = KH, .head_dim = hd, .block_size = bs,
			.chunks = (uint32_t)chunks, .tiles = gy / KH, .scale = scale, .oq = oq, .od = od,
		};
		if (nx) { /* the fused kernel of nx's heads a block */
			nx->ar = ka;
			const uint32_t NH = ar_nh_of(dev, n);
			const uint32_t ki = NH == 1 ? 0 : NH == 2 ? 1 : NH == 4 ? 2 : 3;
			if ((rc = cuda_launch_k(dev, dev->k_attn_nr[ki], (uint32_t)nr, gy, (uint32_t)chunks,
			         BATON_OPS_AR_THREADS, 0, nx, sizeof *nx, "cuLaunchKernel baton_ops_attn_nr")))
				return rc;
		} else if ((rc = cuda_launch_k(dev, dev->k_attn_rows, (uint32_t)nr, gy, (uint32_t)chunks,
		         BATON_OPS_AR_THREADS, 0, &ka, sizeof ka, "cuLaunchKernel baton_ops_attn_rows")))
			return rc;
	}
	if (oq)
		cuda_mmvq_norm_done(dev, out, H * hd);
	return 0;
}

/* attention's call on the rows kernel (its checks done): CUDA_TC_FALLBACK
 * where the kernel does not take it. */
static int ar_attention(struct baton_dev *dev, const struct baton_attn *a)
{
	const uint32_t gy = ar_gy(a->n_heads, a->n_kv_heads, a->head_dim, a->q, a->k, a->v, a->out);
	const uint64_t n_ctx = (uint64_t)a->pos0 + a->n_q, chunks = ar_chunks(dev, n_ctx);
	if (!gy || chunks > 65535)
		return CUDA_TC_FALLBACK;
	const uint64_t nb = a->blocks ? (n_ctx + a->block_size - 1) / a->block_size : 0;
	const uint64_t cap = a->blocks ? ar_tab_cap(dev, n_ctx, a->block_size, chunks) : 0;
	uint32_t *h = ar_buf(dev, a->n_q, cap);
	if (!h)
		return cuda_refuse(dev, BATON_ENOMEM, "attention", "no memory for the rows");
	for (uint32_t t = 0; t < a->n_q; t++) {
		h[4 * t] = t;
		h[4 * t + 1] = a->pos0 + t;
		h[4 * t + 2] = h[4 * t + 3] = 0;
	}
	if (cap) {
		memcpy(h + 4 * (uint64_t)a->n_q, a->blocks, nb * 4);
		memset(h + 4 * (uint64_t)a->n_q + nb, 0, (cap - nb) * 4);
	}
	return ar_launch(dev, a->q, a->k, a->v, a->out, a->n_heads, a->n_kv_heads, a->head_dim,
	    a->block_size, a->scale, gy, a->n_q, cap, a->blocks != NULL, chunks, NULL);
}

int cuda_op_attention(struct baton_dev *dev, const struct baton_attn *a)
{
	int rc;
	if (!a || !a->n_q || !a->n_heads || !a->n_kv_heads || !a->head_dim ||
	    a->n_heads % a->n_kv_heads || a->pos0 > UINT32_MAX - a->n_q)
		return cuda_refuse(dev, BATON_EINVAL, "attention",
		    "zero sizes, or heads not a multiple of the KV heads");
	const uint32_t H = a->n_heads, KH = a->n_kv_heads, hd = a->head_dim;
	const uint64_t n_ctx = (uint64_t)a->pos0 + a->n_q, rows = attn_cache_rows(a, n_ctx);
	const uint64_t qn = (uint64_t)a->n_q * H * hd, kn = rows * KH * hd;
	if (!rows)
		return cuda_refuse(dev, BATON_EINVAL, "attention", "a block table without a block size");
	if (!cuda_f32_buf(a->q, qn) || !cuda_f32_buf(a->k, kn) || !cuda_f32_buf(a->v, kn) ||
	    !cuda_f32_buf(a->out, qn))
		return cuda_refuse(dev, BATON_EINVAL, "attention", "a missing or misaligned buffer");
	if (cuda_overlap(a->out, qn, a->q, qn) || cuda_overlap(a->out, qn, a->k, kn) ||
	    cuda_overlap(a->out, qn, a->v, kn))
		return cuda_refuse(dev, BATON_EINVAL, "attention", "out overlaps q, k or v");
	if (H > 65535)
		return cuda_refuse(dev, BATON_ERANGE, "attention", "more than 65535 heads");
	uint64_t chunks = (n_ctx + BATON_OPS_ATTN_CHUNK - 1) / BATON_OPS_ATTN_CHUNK;
	if (chunks > 65535)
		return cuda_refuse(dev, BATON_ERANGE, "attention", "more than 65535 chunks of keys");
	if ((rc = cuda_cur(dev)))
		return rc;
	if (!cuda_tc_on(dev, a->n_q) && (rc = ar_attention(dev, a)) != CUDA_TC_FALLBACK)
		return rc;
	/* In a graph the launches may not depend on the number of keys: the
	 * part kernel's grid is a power of two of chunks (a bucket: the
	 * recording replays until a query outgrows it), the block table is
	 * staged at that capacity, and the key count is read on the device. */
	const int graph = dev->gmode != CUDA_G_NONE;
	if (graph) {
		uint64_t c = 1;
		while (c < chunks)
			c <<= 1;
		if (c > 65535)
			c = chunks;
		chunks = c;
	}
	/* queries per launch: their partial results within SCORES_MAX */
	const uint64_t per_q = (uint64_t)H * chunks * (hd + 2) * 4;
	uint64_t group = SCORES_MAX / per_q;
	if (group < 1)
		group = 1;
	if (group > a->n_q)
		group = a->n_q;
	if (group > 0x7fffffffu)
		group = 0x7fffffffu;
	CUdeviceptr table = 0, pos0_dev = 0;
	if ((rc = cuda_cur(dev)) || (rc = cuda_dbuf_need(dev, &dev->ops_scores, group * per_q)))
		return rc;
	const uint64_t n_blocks = a->blocks ? (n_ctx + a->block_size - 1) / a->block_size : 0;
	if (graph) {
		const uint32_t pos0 = a->pos0;
		uint64_t cap = a->blocks ?
		    (chunks * BATON_OPS_ATTN_CHUNK + a->block_size - 1) / a->block_size : 0;
		if (cap < n_blocks)
			cap = n_blocks;
		if (cap > dev->gtab_cap) {
			uint32_t *t = realloc(dev->gtab, cap * 4);
			if (!t)
				return cuda_refuse(dev, BATON_ENOMEM, "attention", "no memory for the block table");
			dev->gtab = t;
			dev->gtab_cap = cap;
		}
		if (cap) {
			memcpy(dev->gtab, a->blocks, n_blocks * 4);
			memset(dev->gtab + n_blocks, 0, (cap - n_blocks) * 4);
			rc = cuda_stage_args(dev, dev->gtab, cap * 4, &pos0, 4, &table, &pos0_dev);
		} else {
			rc = cuda_stage_args(dev, &pos0, 4, NULL, 0, &pos0_dev, NULL);
		}
		if (rc)
			return rc;
	} else if (a->blocks &&
	    (rc = cuda_stage_args(dev, a->blocks, n_blocks * 4, NULL, 0, &table, NULL))) {
		return rc;
	}
	if (cuda_tc_on(dev, a->n_q) && (rc = cuda_tc_attention(dev, a, table)) != CUDA_TC_FALLBACK)
		return rc;
	for (uint32_t q0 = 0; q0 < a->n_q; q0 += (uint32_t)group) {
		const uint32_t nq = a->n_q - q0 < group ? a->n_q - q0 : (uint32_t)group;
		/* this group's last query has the most chunks */
		const uint64_t gc = graph ? chunks :
		    ((uint64_t)a->pos0 + q0 + nq + BATON_OPS_ATTN_CHUNK - 1) / BATON_OPS_ATTN_CHUNK;
		struct baton_ops_attention_args k = {
			.q = a->q, .k = a->k, .v = a->v, .out = a->out, .part = dev->ops_scores.p,
			.blocks = table, .pos0_dev = pos0_dev, .q0 = q0, .n_q = a->n_q, .n_heads = H,
			.n_kv_heads = KH, .head_dim = hd, .pos0 = graph ? 0 : a->pos0,
			.block_size = a->block_size, .chunks = (uint32_t)gc, .scale = a->scale,
		};
		if ((rc = cuda_launch_k(dev, dev->k_attn_part, nq, H, (uint32_t)gc, OPS_THREADS, 0, &k,
		         sizeof k, "cuLaunchKernel baton_ops_attn_part")))
			return rc;
		if (gc > 1 && (rc = cuda_launch(dev, dev->k_attn_comb, nq, H, OPS_THREADS, &k,
		         "cuLaunchKernel baton_ops_attn_combine")))
			return rc;
	}
	return 0;
}

int cuda_op_attention_segs(struct baton_dev *dev, const struct baton_attn_segs *s)
{
	uint64_t rows;
	int rc;
	if (attn_segs_check(s, &rows))
		return cuda_refuse(dev, BATON_EINVAL, "attention_segs",
		    "no segments, no block table, or a segment attention would refuse");
	const uint32_t H = s->n_heads, KH = s->n_kv_heads, hd = s->head_dim, bs = s->block_size;
	if (H > 65535)
		return cuda_refuse(dev, BATON_ERANGE, "attention_segs", "more than 65535 heads");
	if ((rc = cuda_cur(dev)))
		return rc;
	/* the segments the rows kernel takes (not the tensor cores'): their
	 * rows and most keys */
	uint64_t n = 0, nk = 0;
	for (uint32_t i = 0; i < s->n_seg; i++) {
		const uint64_t e = (uint64_t)s->segs[i].pos0 + s->segs[i].n_q;
		if ((e + BATON_OPS_ATTN_CHUNK - 1) / BATON_OPS_ATTN_CHUNK > 65535)
			return cuda_refuse(dev, BATON_ERANGE, "attention_segs", "more than 65535 chunks of keys");
		if (cuda_tc_on(dev, s->segs[i].n_q))
			continue;
		n += s->segs[i].n_q;
		if (e > nk)
			nk = e;
	}
	const uint32_t gy = ar_gy(H, KH, hd, s->q, s->k, s->v, s->out);
	const uint64_t chunks = ar_chunks(dev, nk);
	const int rows_kernel = n && gy && chunks <= 65535 && n <= 0x7fffffffu;
	if (rows_kernel) {
		uint64_t tab_n = 0;
		for (uint32_t i = 0; i < s->n_seg; i++)
			if (!cuda_tc_on(dev, s->segs[i].n_q))
				tab_n += ar_tab_cap(dev, (uint64_t)s->segs[i].pos0 + s->segs[i].n_q, bs, chunks);
		uint32_t *h = ar_buf(dev, n, tab_n);
		if (!h)
			return cuda_refuse(dev, BATON_ENOMEM, "attention_segs", "no memory for the rows");
		uint32_t *tab = h + 4 * n;
		uint64_t r = 0, toff = 0, qrow = 0;
		for (uint32_t i = 0; i < s->n_seg; qrow += s->segs[i].n_q, i++) {
			const struct baton_attn_seg *g = &s->segs[i];
			if (cuda_tc_on(dev, g->n_q))
				continue;
			const uint64_t n_ctx = (uint64_t)g->pos0 + g->n_q, nb = (n_ctx + bs - 1) / bs;
			const uint64_t cap = ar_tab_cap(dev, n_ctx, bs, chunks);
			memcpy(tab + toff, g->blocks, nb * 4);
			memset(tab + toff + nb, 0, (cap - nb) * 4);
			for (uint32_t t = 0; t < g->n_q; t++, r++) {
				h[4 * r] = (uint32_t)(qrow + t);
				h[4 * r + 1] = g->pos0 + t;
				h[4 * r + 2] = (uint32_t)toff;
				h[4 * r + 3] = 0;
			}
			toff += cap;
		}
		if ((rc = ar_launch(dev, s->q, s->k, s->v, s->out, H, KH, hd, bs, s->scale, gy, n, tab_n,
		         1, chunks, NULL)))
			return rc;
	}
	/* the tensor cores' segments (and, where the rows kernel does not
	 * apply, every segment) one call each */
	uint64_t row = 0;
	for (uint32_t i = 0; i < s->n_seg; row += s->segs[i].n_q, i++) {
		if (rows_kernel && !cuda_tc_on(dev, s->segs[i].n_q))
			continue;
		struct baton_attn a;
		attn_seg_view(s, i, row, &a);
		if ((rc = cuda_op_attention(dev, &a)))
			return rc;
	}
	return 0;
}

/* Whether qk_attention_segs fuses nr into s's rows kernel: every
 * segment one row (no row reads another's new key) of the rows kernel's
 * shapes, nr's rows the segments' (the same q, cache and sizes; row i's
 * position and slot segment i's last), the store asked for. */
static int qk_attn_fusable(const struct baton_dev *dev, const struct baton_qk_norm_rope *nr,
    const struct baton_attn_segs *s)
{
	if (dev->ar_fuse_off || !nr->k_cache || !nr->pos || !nr->slots || !nr->inv_freq || !s->segs ||
	    nr->rows != s->n_seg || nr->q != s->q ||
	    nr->k_cache != s->k || nr->v_cache != s->v || nr->heads != s->n_heads ||
	    nr->kv_heads != s->n_kv_heads || nr->head_dim != s->head_dim || !s->block_size ||
	    !ar_gy(s->n_heads, s->n_kv_heads, s->head_dim, s->q, s->k, s->v, s->out) ||
	    cuda_tc_on((struct baton_dev *)dev, 1))
		return 0;
	for (uint32_t i = 0; i < s->n_seg; i++) {
		const struct baton_attn_seg *g = &s->segs[i];
		const uint32_t p = g->pos0, bs = s->block_size;
		if (g->n_q != 1 || !g->blocks || nr->pos[i] != p ||
		    (uint64_t)nr->slots[i] != (uint64_t)g->blocks[p / bs] * bs + p % bs)
			return 0;
	}
	return 1;
}

int cuda_op_qk_attention_segs(struct baton_dev *dev, const struct baton_qk_norm_rope *nr,
    const struct baton_attn_segs *s)
{
	uint64_t rows;
	int rc;
	if (!nr || !s)
		return cuda_refuse(dev, BATON_EINVAL, "qk_attention_segs", "no arguments");
	if (!qk_attn_fusable(dev, nr, s)) {
		if ((rc = cuda_op_qk_norm_rope(dev, nr)))
			return rc;
		return cuda_op_attention_segs(dev, s);
	}
	if ((rc = cuda_qk_nr_check(dev, nr)))
		return rc;
	if (attn_segs_check(s, &rows))
		return cuda_refuse(dev, BATON_EINVAL, "attention_segs",
		    "no segments, no block table, or a segment attention would refuse");
	const uint32_t H = s->n_heads, KH = s->n_kv_heads, hd = s->head_dim, bs = s->block_size;
	const uint32_t G = H / KH, NH = ar_nh_of(dev, s->n_seg), gy = KH * ((G + NH - 1) / NH);
	if (H > 65535 || (uint64_t)KH * ((G + NH - 1) / NH) > 65535)
		return cuda_refuse(dev, BATON_ERANGE, "attention_segs", "more than 65535 heads");
	uint64_t nk = 0;
	for (uint32_t i = 0; i < s->n_seg; i++) {
		const uint64_t e = (uint64_t)s->segs[i].pos0 + 1;
		if ((e + BATON_OPS_ATTN_CHUNK - 1) / BATON_OPS_ATTN_CHUNK > 65535)
			return cuda_refuse(dev, BATON_ERANGE, "attention_segs", "more than 65535 chunks of keys");
		if (e > nk)
			nk = e;
	}
	if ((rc = cuda_cur(dev)))
		return rc;
	const uint64_t chunks = ar_chunks(dev, nk), n = s->n_seg;
	if (chunks > 65535)
		return cuda_refuse(dev, BATON_ERANGE, "attention_segs", "more than 65535 chunks of keys");
	uint64_t tab_n = 0;
	for (uint32_t i = 0; i < s->n_seg; i++)
		tab_n += ar_tab_cap(dev, (uint64_t)s->segs[i].pos0 + 1, bs, chunks);
	uint32_t *h = ar_buf(dev, n, tab_n);
	if (!h)
		return cuda_refuse(dev, BATON_ENOMEM, "attention_segs", "no memory for the rows");
	uint32_t *tab = h + 4 * n;
	uint64_t toff = 0;
	for (uint32_t i = 0; i < s->n_seg; i++) {
		const struct baton_attn_seg *g = &s->segs[i];
		const uint64_t n_ctx = (uint64_t)g->pos0 + 1, nb = (n_ctx + bs - 1) / bs;
		const uint64_t cap = ar_tab_cap(dev, n_ctx, bs, chunks);
		memcpy(tab + toff, g->blocks, nb * 4);
		memset(tab + toff + nb, 0, (cap - nb) * 4);
		h[4 * i] = i;
		h[4 * i + 1] = g->pos0;
		h[4 * i + 2] = (uint32_t)toff;
		h[4 * i + 3] = 0;
		toff += cap;
	}
	CUdeviceptr df;
	if ((rc = cuda_stage_args(dev, nr->inv_freq, (uint64_t)hd / 2 * 4, NULL, 0, &df, NULL)))
		return rc;
	struct baton_ops_attn_nr_args nx = {
		.kn = nr->k, .vn = nr->v, .wq = nr->wq, .wk = nr->wk, .inv_freq = df,
		.wq_dtype = nr->wq_dtype, .wk_dtype = nr->wk_dtype, .eps = nr->eps, .mscale = nr->mscale,
	};
	return ar_launch(dev, s->q, s->k, s->v, s->out, H, KH, hd, bs, s->scale, gy, n, tab_n, 1,
	    chunks, &nx);
}
