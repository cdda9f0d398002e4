/*
 * ops.c: the host backend's dense ops of the forward pass (embedding
 * rows, RMSNorm, matmul, RoPE, attention, SwiGLU, add, routing). Plain C,
 * f32 accumulation; every weight row goes through dtype.c's per-dtype row
 * routines (decode, dot), so a dtype the host learns is computed here too.
 * The formulas are the slots' in engine/backend/backend.h, followed literally: this
 * is the reference other backends are compared with.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arena/arena.h"
#include "engine/backend/host/host.h"

#define NX_GROUP 8u /* activation rows per baton_dot_rows call */

static inline float *fp(baton_dptr p)
{
	return (float *)(uintptr_t)p;
}

/* An f32 buffer of `n` floats at p: non-null, aligned, not wrapping. */
static int f32_buf(baton_dptr p, uint64_t n)
{
	if (!p || (p & 3) || !n || n > UINT64_MAX / 4 || p > UINTPTR_MAX - n * 4)
		return 0;
	return 1;
}

static int overlap(baton_dptr a, uint64_t an, baton_dptr b, uint64_t bn)
{
	return a < b + bn * 4 && b < a + an * 4;
}

/* A weight of rows x cols in dtype: computable, cols a whole number of
 * blocks; *rb gets the row's bytes. */
static int weight_ok(uint32_t dtype, uint32_t cols, uint64_t *rb)
{
	if (!host_can_compute((int)dtype))
		return BATON_EUNSUPPORTED;
	*rb = baton_compute_row_bytes((int)dtype, cols);
	return *rb ? 0 : BATON_EINVAL;
}

int host_op_embed(struct baton_dev *dev, baton_dptr table, uint32_t dtype, uint32_t vocab,
    uint32_t cols, const uint32_t *tokens, uint32_t n, baton_dptr out)
{
	uint64_t rb;
	int rc;

	(void)dev;
	if (!table || !tokens || !vocab || !n || !f32_buf(out, (uint64_t)n * cols))
		return BATON_EINVAL;
	if ((rc = weight_ok(dtype, cols, &rb)) != 0)
		return rc;
	for (uint32_t t = 0; t < n; t++)
		if (tokens[t] >= vocab)
			return BATON_ERANGE;
	for (uint32_t t = 0; t < n; t++)
		baton_dequant_row((int)dtype, (const uint8_t *)(uintptr_t)table + tokens[t] * rb,
		    fp(out) + (size_t)t * cols, cols);
	return 0;
}

int host_op_rmsnorm(struct baton_dev *dev, baton_dptr x, baton_dptr out, uint32_t rows,
    uint32_t cols, baton_dptr w, uint32_t w_dtype, float eps)
{
	uint64_t n = (uint64_t)rows * cols, rb;
	float *wf = NULL;
	int rc;

	(void)dev;
	if (!rows || !f32_buf(x, n) || !f32_buf(out, n) || !(eps >= 0))
		return BATON_EINVAL;
	if (out != x && overlap(x, n, out, n))
		return BATON_EINVAL;
	if (w) {
		if ((rc = weight_ok(w_dtype, cols, &rb)) != 0)
			return rc;
		if (!(wf = malloc((size_t)cols * sizeof *wf)))
			return BATON_ENOMEM;
		baton_dequant_row((int)w_dtype, (const void *)(uintptr_t)w, wf, cols);
	}
	for (uint32_t r = 0; r < rows; r++) {
		const float *xr = fp(x) + (size_t)r * cols;
		float *yr = fp(out) + (size_t)r * cols;
		float ss;
		baton_dot_row(BATON_DT_F32, xr, xr, cols, &ss);
		float s = 1.0f / sqrtf(ss / (float)cols + eps);
		if (wf)
			for (uint32_t i = 0; i < cols; i++)
				yr[i] = (xr[i] * s) * wf[i];
		else
			for (uint32_t i = 0; i < cols; i++)
				yr[i] = xr[i] * s;
	}
	free(wf);
	return 0;
}

struct matmul_job {
	const uint8_t *w;
	uint64_t rb;
	int dtype, accumulate;
	uint32_t n_out, k, rows;
	const float *bias, *x;
	float *y;
};

/* Output columns [lo, hi) of every row: each y element is one part's. */
static void matmul_part(void *arg, unsigned part, unsigned nparts)
{
	const struct matmul_job *j = arg;
	uint32_t lo = (uint32_t)((uint64_t)j->n_out * part / nparts);
	uint32_t hi = (uint32_t)((uint64_t)j->n_out * (part + 1) / nparts);
	for (uint32_t o = lo; o < hi; o++) {
		const uint8_t *row = j->w + (uint64_t)o * j->rb;
		for (uint32_t r0 = 0; r0 < j->rows; r0 += NX_GROUP) {
			uint32_t nv = j->rows - r0 < NX_GROUP ? j->rows - r0 : NX_GROUP;
			const float *v[NX_GROUP];
			float d[NX_GROUP];
			for (uint32_t i = 0; i < nv; i++)
				v[i] = j->x + (size_t)(r0 + i) * j->k;
			baton_dot_rows(j->dtype, row, j->k, v, nv, d);
			for (uint32_t i = 0; i < nv; i++) {
				float *yo = j->y + (size_t)(r0 + i) * j->n_out + o;
				float val = j->bias ? d[i] + j->bias[o] : d[i];
				*yo = j->accumulate ? *yo + val : val;
			}
		}
	}
}

/* The matmul slot's checks: 0 or its code; *rb: a weight row's bytes. */
static int matmul_check(baton_dptr w, uint32_t w_dtype, uint32_t n_out, uint32_t k,
    baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows, baton_dptr y, uint64_t *rb)
{
	uint64_t brb;
	int rc;
	if (!w || !n_out || !rows || !f32_buf(x, (uint64_t)rows * k) ||
	    !f32_buf(y, (uint64_t)rows * n_out))
		return BATON_EINVAL;
	if (overlap(x, (uint64_t)rows * k, y, (uint64_t)rows * n_out))
		return BATON_EINVAL;
	if ((rc = weight_ok(w_dtype, k, rb)) != 0)
		return rc;
	if (b && (rc = weight_ok(b_dtype, n_out, &brb)) != 0)
		return rc;
	return 0;
}

int matmuls_overlap(const struct baton_matmuls *mm)
{
	if (!mm || !mm->n || mm->n > BATON_MATMULS_MAX)
		return 1;
	for (uint32_t i = 0; i < mm->n; i++)
		for (uint32_t j = 0; j < i; j++)
			if (overlap(mm->m[i].y, (uint64_t)mm->rows * mm->m[i].n_out, mm->m[j].y,
			        (uint64_t)mm->rows * mm->m[j].n_out))
				return 1;
	return 0;
}

int host_op_matmuls(struct baton_dev *dev, const struct baton_matmuls *mm)
{
	uint64_t rb;
	int rc;
	if (matmuls_overlap(mm))
		return BATON_EINVAL;
	for (uint32_t i = 0; i < mm->n; i++) {
		const struct baton_matmul_out *o = &mm->m[i];
		if ((rc = matmul_check(o->w, o->w_dtype, o->n_out, mm->k, o->b, o->b_dtype, mm->x,
		         mm->rows, o->y, &rb)))
			return rc;
	}
	for (uint32_t i = 0; i < mm->n; i++) {
		const struct baton_matmul_out *o = &mm->m[i];
		if ((rc = host_op_matmul(dev, o->w, o->w_dtype, o->n_out, mm->k, o->b, o->b_dtype,
		         mm->x, mm->rows, o->y, 0)))
			return rc;
	}
	return 0;
}

int host_op_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate)
{
	uint64_t rb;
	float *bias = NULL;
	int rc;

	(void)dev;
	if ((rc = matmul_check(w, w_dtype, n_out, k, b, b_dtype, x, rows, y, &rb)))
		return rc;
	if (b) {
		if (!(bias = malloc((size_t)n_out * sizeof *bias)))
			return BATON_ENOMEM;
		baton_dequant_row((int)b_dtype, (const void *)(uintptr_t)b, bias, n_out);
	}
	struct matmul_job j = {
		.w = (const uint8_t *)(uintptr_t)w, .rb = rb, .dtype = (int)w_dtype,
		.accumulate = accumulate, .n_out = n_out, .k = k, .rows = rows,
		.bias = bias, .x = fp(x), .y = fp(y),
	};
	host_parallel(matmul_part, &j, (uint64_t)n_out * k * rows, n_out);
	free(bias);
	return 0;
}

int host_op_rope(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t n_heads,
    uint32_t head_dim, const uint32_t *pos, const float *inv_freq, float mscale)
{
	(void)dev;
	if (!rows || !n_heads || !head_dim || (head_dim & 1) || !pos || !inv_freq ||
	    !f32_buf(x, (uint64_t)rows * n_heads * head_dim))
		return BATON_EINVAL;
	uint32_t half = head_dim / 2;
	float *c = malloc((size_t)half * 2 * sizeof *c);
	if (!c)
		return BATON_ENOMEM;
	float *s = c + half;
	for (uint32_t r = 0; r < rows; r++) {
		for (uint32_t i = 0; i < half; i++) {
			float a = (float)pos[r] * inv_freq[i];
			c[i] = cosf(a) * mscale;
			s[i] = sinf(a) * mscale;
		}
		for (uint32_t h = 0; h < n_heads; h++) {
			float *v = fp(x) + ((size_t)r * n_heads + h) * head_dim;
			for (uint32_t i = 0; i < half; i++) {
				float x1 = v[i], x2 = v[i + half];
				v[i] = x1 * c[i] - x2 * s[i];
				v[i + half] = x2 * c[i] + x1 * s[i];
			}
		}
	}
	free(c);
	return 0;
}

struct attn_job {
	const struct baton_attn *a;
	float *scratch; /* per part: n_ctx floats */
	uint64_t n_ctx;
};

/* Key j's row (of n_kv_heads * head_dim floats) in the cache: paged
 * through the block table, or row j. */
static inline uint64_t key_row(const struct baton_attn *a, uint64_t j)
{
	if (!a->blocks)
		return j;
	return (uint64_t)a->blocks[j / a->block_size] * a->block_size + j % a->block_size;
}

/* (query, head) pairs [lo, hi) of n_q * n_heads: each output row is one
 * part's, computed in the slot's order. */
static void attention_part(void *arg, unsigned part, unsigned nparts)
{
	const struct attn_job *j = arg;
	const struct baton_attn *a = j->a;
	const uint32_t H = a->n_heads, KH = a->n_kv_heads, hd = a->head_dim, group = H / KH;
	const uint64_t pairs = (uint64_t)a->n_q * H;
	const uint64_t lo = pairs * part / nparts, hi = pairs * (part + 1) / nparts;
	const float *q = fp(a->q), *k = fp(a->k), *v = fp(a->v);
	float *out = fp(a->out), *p = j->scratch + (size_t)part * j->n_ctx;

	for (uint64_t th = lo; th < hi; th++) {
		uint32_t t = (uint32_t)(th / H), h = (uint32_t)(th % H);
		uint64_t nk = (uint64_t)a->pos0 + t + 1;
		const float *qh = q + ((size_t)t * H + h) * hd;
		uint32_t kvh = h / group;
		float max = -INFINITY, sum = 0;
		for (uint64_t jj = 0; jj < nk; jj++) {
			float d;
			baton_dot_row(BATON_DT_F32, k + ((size_t)key_row(a, jj) * KH + kvh) * hd, qh, hd, &d);
			p[jj] = d * a->scale;
			if (p[jj] > max)
				max = p[jj];
		}
		for (uint64_t jj = 0; jj < nk; jj++) {
			p[jj] = expf(p[jj] - max);
			sum += p[jj];
		}
		float *oh = out + ((size_t)t * H + h) * hd;
		for (uint32_t d = 0; d < hd; d++)
			oh[d] = 0;
		for (uint64_t jj = 0; jj < nk; jj++) {
			float pj = p[jj] / sum;
			const float *vj = v + ((size_t)key_row(a, jj) * KH + kvh) * hd;
			for (uint32_t d = 0; d < hd; d++)
				oh[d] += pj * vj[d];
		}
	}
}

#define ATTN_MAX_PARTS 64u /* the pool's thread limit */

/* Rows of k and v the call reads: n_ctx, or (paged) up to the end of the
 * highest block in the table; 0 for a bad table. */
uint64_t attn_cache_rows(const struct baton_attn *a, uint64_t n_ctx)
{
	if (!a->blocks)
		return n_ctx;
	if (!a->block_size)
		return 0;
	uint64_t nb = (n_ctx + a->block_size - 1) / a->block_size, top = 0;
	for (uint64_t b = 0; b < nb; b++)
		if (a->blocks[b] > top)
			top = a->blocks[b];
	return (top + 1) * a->block_size;
}

/* The attention slot's checks: 0 or BATON_EINVAL. */
static int attn_check(const struct baton_attn *a)
{
	if (!a || !a->n_q || !a->n_heads || !a->n_kv_heads || !a->head_dim ||
	    a->n_heads % a->n_kv_heads || a->pos0 > UINT32_MAX - a->n_q)
		return BATON_EINVAL;
	const uint32_t H = a->n_heads, KH = a->n_kv_heads, hd = a->head_dim;
	const uint64_t n_ctx = (uint64_t)a->pos0 + a->n_q, rows = attn_cache_rows(a, n_ctx);
	const uint64_t qn = (uint64_t)a->n_q * H * hd, kn = rows * KH * hd;
	if (!rows || !f32_buf(a->q, qn) || !f32_buf(a->k, kn) || !f32_buf(a->v, kn) ||
	    !f32_buf(a->out, qn))
		return BATON_EINVAL;
	if (overlap(a->out, qn, a->q, qn) || overlap(a->out, qn, a->k, kn) ||
	    overlap(a->out, qn, a->v, kn))
		return BATON_EINVAL;
	return 0;
}

void attn_seg_view(const struct baton_attn_segs *s, uint32_t i, uint64_t row,
    struct baton_attn *a)
{
	const uint64_t rb = (uint64_t)s->n_heads * s->head_dim * sizeof(float);
	*a = (struct baton_attn){
		.q = s->q + row * rb, .k = s->k, .v = s->v, .out = s->out + row * rb,
		.n_q = s->segs[i].n_q, .n_heads = s->n_heads, .n_kv_heads = s->n_kv_heads,
		.head_dim = s->head_dim, .pos0 = s->segs[i].pos0, .scale = s->scale,
		.blocks = s->segs[i].blocks, .block_size = s->block_size,
	};
}

int attn_segs_check(const struct baton_attn_segs *s, uint64_t *rows_out)
{
	if (!s || !s->n_seg || !s->segs || !s->block_size || !s->n_heads || !s->head_dim)
		return BATON_EINVAL;
	uint64_t rows = 0;
	for (uint32_t i = 0; i < s->n_seg; i++) {
		struct baton_attn a;
		if (!s->segs[i].blocks)
			return BATON_EINVAL;
		attn_seg_view(s, i, rows, &a);
		if (attn_check(&a))
			return BATON_EINVAL;
		rows += s->segs[i].n_q;
	}
	/* out against every segment's q rows, not only its own */
	const uint64_t n = rows * s->n_heads * s->head_dim;
	if (n / s->n_heads / s->head_dim != rows || overlap(s->out, n, s->q, n))
		return BATON_EINVAL;
	if (rows_out)
		*rows_out = rows;
	return 0;
}

int host_op_attention_segs(struct baton_dev *dev, const struct baton_attn_segs *s)
{
	int rc = attn_segs_check(s, NULL);
	if (rc)
		return rc;
	uint64_t row = 0;
	for (uint32_t i = 0; i < s->n_seg; row += s->segs[i].n_q, i++) {
		struct baton_attn a;
		attn_seg_view(s, i, row, &a);
		if ((rc = host_op_attention(dev, &a)))
			return rc;
	}
	return 0;
}

int host_op_attention(struct baton_dev *dev, const struct baton_attn *a)
{
	(void)dev;
	if (attn_check(a))
		return BATON_EINVAL;
	const uint32_t H = a->n_heads, hd = a->head_dim;
	const uint64_t n_ctx = (uint64_t)a->pos0 + a->n_q;
	uint64_t pairs = (uint64_t)a->n_q * H;
	uint32_t parts = pairs > ATTN_MAX_PARTS ? ATTN_MAX_PARTS : (uint32_t)pairs;
	struct attn_job j = { .a = a, .n_ctx = n_ctx };
	if (!(j.scratch = malloc((size_t)parts * n_ctx * sizeof *j.scratch)))
		return BATON_ENOMEM;
	/* parts <= ATTN_MAX_PARTS: one scratch row each */
	host_parallel(attention_part, &j, pairs * n_ctx * hd * 2, parts);
	free(j.scratch);
	return 0;
}

/* The checks of a kv_store call, shared with the cuda backend. */
int kv_store_check(const struct baton_kv_store *s)
{
	if (!s || !s->n || !s->cols || !s->slots || !s->cache_rows)
		return BATON_EINVAL;
	const uint64_t n = (uint64_t)s->n * s->cols;
	if (s->cache_rows > UINT64_MAX / s->cols)
		return BATON_EINVAL;
	const uint64_t cn = s->cache_rows * s->cols;
	if (!f32_buf(s->k, n) || !f32_buf(s->v, n) || !f32_buf(s->k_cache, cn) ||
	    !f32_buf(s->v_cache, cn))
		return BATON_EINVAL;
	if (overlap(s->k, n, s->k_cache, cn) || overlap(s->k, n, s->v_cache, cn) ||
	    overlap(s->v, n, s->k_cache, cn) || overlap(s->v, n, s->v_cache, cn) ||
	    overlap(s->k_cache, cn, s->v_cache, cn))
		return BATON_EINVAL;
	for (uint32_t r = 0; r < s->n; r++)
		if (s->slots[r] >= s->cache_rows)
			return BATON_ERANGE;
	return 0;
}

int host_op_kv_store(struct baton_dev *dev, const struct baton_kv_store *s)
{
	(void)dev;
	int rc = kv_store_check(s);
	if (rc)
		return rc;
	const size_t row = (size_t)s->cols * sizeof(float);
	for (uint32_t r = 0; r < s->n; r++) {
		memcpy(fp(s->k_cache) + (size_t)s->slots[r] * s->cols, fp(s->k) + (size_t)r * s->cols, row);
		memcpy(fp(s->v_cache) + (size_t)s->slots[r] * s->cols, fp(s->v) + (size_t)r * s->cols, row);
	}
	return 0;
}

int host_op_swiglu(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
    uint64_t n)
{
	(void)dev;
	if (!f32_buf(gate, n) || !f32_buf(up, n) || !f32_buf(out, n))
		return BATON_EINVAL;
	const float *g = fp(gate), *u = fp(up);
	float *o = fp(out);
	for (uint64_t i = 0; i < n; i++)
		o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
	return 0;
}

int host_op_add(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
    uint32_t rows, uint32_t cols)
{
	uint64_t n = (uint64_t)rows * cols;

	(void)dev;
	if (!rows || !f32_buf(x, n) || !f32_buf(y, n) || overlap(x, n, y, n) ||
	    (gate && !f32_buf(gate, rows)))
		return BATON_EINVAL;
	for (uint32_t r = 0; r < rows; r++) {
		float g = gate ? 1.0f / (1.0f + expf(-fp(gate)[r])) : 1.0f;
		float *xr = fp(x) + (size_t)r * cols;
		const float *yr = fp(y) + (size_t)r * cols;
		if (gate)
			for (uint32_t i = 0; i < cols; i++)
				xr[i] += g * yr[i];
		else
			for (uint32_t i = 0; i < cols; i++)
				xr[i] += yr[i];
	}
	return 0;
}

/* The order key of a probability: NaN ranks lowest. */
static inline float rank_key(float v)
{
	return isnan(v) ? -INFINITY : v;
}

int host_op_route(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
    uint32_t top_k, int rule, uint32_t *ids, float *weights)
{
	(void)dev;
	if (!rows || !top_k || top_k > n_experts || !ids || !weights ||
	    !f32_buf(logits, (uint64_t)rows * n_experts))
		return BATON_EINVAL;
	if (rule != BATON_ROUTE_SOFTMAX_TOPK && rule != BATON_ROUTE_SOFTMAX_TOPK_NORM)
		return BATON_EINVAL;
	float *p = malloc((size_t)n_experts * (sizeof *p + 1));
	if (!p)
		return BATON_ENOMEM;
	unsigned char *taken = (unsigned char *)(p + n_experts);
	for (uint32_t r = 0; r < rows; r++) {
		const float *l = fp(logits) + (size_t)r * n_experts;
		uint32_t *id = ids + (size_t)r * top_k;
		float *w = weights + (size_t)r * top_k;
		float max = -INFINITY, sum = 0;
		for (uint32_t e = 0; e < n_experts; e++)
			if (l[e] > max)
				max = l[e];
		for (uint32_t e = 0; e < n_experts; e++) {
			p[e] = expf(l[e] - max);
			sum += p[e];
		}
		for (uint32_t e = 0; e < n_experts; e++)
			p[e] /= sum;
		memset(taken, 0, n_experts);
		for (uint32_t k = 0; k < top_k; k++) {
			uint32_t best = UINT32_MAX;
			for (uint32_t e = 0; e < n_experts; e++)
				if (!taken[e] && (best == UINT32_MAX || rank_key(p[e]) > rank_key(p[best])))
					best = e;
			taken[best] = 1;
			id[k] = best;
			w[k] = p[best];
		}
		if (rule == BATON_ROUTE_SOFTMAX_TOPK_NORM) {
			float s = 0;
			for (uint32_t k = 0; k < top_k; k++)
				s += w[k];
			for (uint32_t k = 0; k < top_k; k++)
				w[k] /= s;
		}
	}
	free(p);
	return 0;
}

/* route_dev: the host's device memory is host memory. */
int host_op_route_dev(struct baton_dev *dev, baton_dptr logits, uint32_t rows,
    uint32_t n_experts, uint32_t top_k, int rule, baton_dptr ids, baton_dptr weights)
{
	if (!ids || !weights || ids % 4 || weights % 4)
		return BATON_EINVAL;
	return host_op_route(dev, logits, rows, n_experts, top_k, rule,
	    (uint32_t *)(uintptr_t)ids, (float *)(uintptr_t)weights);
}

/* router_route_dev: the calls it stands for, one after the other, once
 * the arguments are known good (a refused call writes nothing). */
int host_op_router_route_dev(struct baton_dev *dev, const struct baton_router_route *a)
{
	const uint64_t nx = (uint64_t)a->rows * a->k, nl = (uint64_t)a->rows * a->n_experts;
	const uint64_t nk = (uint64_t)a->rows * a->top_k;
	if (!a->rows || !a->k || !a->n_experts || !a->top_k || a->top_k > a->n_experts || !a->w ||
	    (a->rule != BATON_ROUTE_SOFTMAX_TOPK && a->rule != BATON_ROUTE_SOFTMAX_TOPK_NORM) ||
	    !f32_buf(a->xn, nx) || !f32_buf(a->logits, nl) || !f32_buf(a->weights, nk) ||
	    !a->ids || a->ids % 4 || (a->norm_on && (!f32_buf(a->x, nx) || !(a->eps >= 0))) ||
	    overlap(a->ids, nk, a->weights, nk) ||
	    overlap(a->ids, nk, a->logits, nl) ||
	    overlap(a->weights, nk, a->logits, nl) ||
	    overlap(a->xn, nx, a->logits, nl) ||
	    overlap(a->xn, nx, a->ids, nk) ||
	    overlap(a->xn, nx, a->weights, nk) ||
	    (a->norm_on && overlap(a->x, nx, a->xn, nx)))
		return BATON_EINVAL;
	int rc = 0;
	if (a->norm_on)
		rc = host_op_rmsnorm(dev, a->x, a->xn, a->rows, a->k, a->norm, a->norm_dtype, a->eps);
	if (!rc)
		rc = host_op_matmul(dev, a->w, a->w_dtype, a->n_experts, a->k, 0, 0, a->xn, a->rows,
		    a->logits, 0);
	return rc ? rc : host_op_route_dev(dev, a->logits, a->rows, a->n_experts, a->top_k, a->rule,
	    a->ids, a->weights);
}
