/*
 * backend.h: the device interface of the engine. A backend is a const table
 * of function pointers plus a context (struct baton_dev), as ggml and SQLite
 * do. Two backends: `host` (CPU; always built, runs everywhere, same VMM
 * semantics) and `cuda` (driver VMM API, loaded with dlopen at run time).
 *
 * Device addresses are plain integers (baton_dptr): a CUdeviceptr on cuda, a
 * host virtual address on host. Slots marked optional may be NULL; callers
 * reach them through the backend_* wrappers below, which check once.
 * Functions return 0 or a baton_err code and never abort.
 *
 * Threading: a context is used by one thread at a time (the engine's serve
 * loop), except mem_info, which any thread may call.
 *
 * The door of engine/backend/, bottom to top: this interface and the
 * optional-slot wrappers (backend.c), the fault-injecting decorator
 * (fault.c), and the registry that knows every backend (registry.c:
 * backend_find). The backends themselves are engine/backend/host/ (host.h)
 * and engine/backend/cuda/ (cuda.h).
 */
#ifndef BATON_ENGINE_BACKEND_H
#define BATON_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "proto/base/base.h"

typedef uint64_t baton_dptr;

struct baton_dev;

/* One host-to-device copy of a batch. */
struct baton_copy {
	baton_dptr dst;
	const void *src;
	uint64_t bytes;
};

/* One MoE layer's dense inputs, all in device memory. Weights follow the
 * arena's layout (arena/arena.h): rows of `cols` elements in `dtype`. */
struct baton_moe_layer {
	uint32_t batch, d_model, d_ff, n_experts, top_k;
	baton_dptr x;        /* [batch][d_model] f32 hidden state, updated in place */
	baton_dptr xn;       /* [batch][d_model] f32 scratch: the normed input */
	baton_dptr norm;     /* [d_model] in norm_dtype, or 0 for none */
	uint32_t norm_dtype;
	baton_dptr router;   /* [n_experts][d_model] in router_dtype */
	uint32_t router_dtype;
	uint32_t gate_dtype, up_dtype, down_dtype;
	uint64_t gate_off, up_off, down_off; /* parts inside an expert blob */
};

/* The router's rule (the `route` slot), as transformers computes it:
 * p = softmax(logits) over every expert (f32: max, expf(l - max), sum,
 * divide); the top_k experts by p (ids in rank order, ties to the lower
 * id, a NaN ranks lowest); weights = p of those. With _NORM the weights
 * are then divided by their sum (added in rank order). Mixtral's "top-k of
 * the logits, softmax over the k" is the _NORM rule (the same numbers up
 * to rounding; transformers computes it this way). */
enum baton_route_rule {
	BATON_ROUTE_SOFTMAX_TOPK = 0,      /* olmoe, qwen2_moe, qwen3_moe without norm_topk_prob */
	BATON_ROUTE_SOFTMAX_TOPK_NORM = 1, /* mixtral; qwen3_moe with norm_topk_prob */
};

/* Causal grouped-query attention of `n_q` query tokens over one sequence's
 * KV cache (the `attention` slot). Rows are f32 and contiguous:
 *   q    [n_q][n_heads * head_dim]       the queries, RoPE already applied
 *   k, v [n_ctx][n_kv_heads * head_dim]  the cache, positions 0 .. pos0+n_q-1
 *                                        written (RoPE applied to k)
 *   out  [n_q][n_heads * head_dim]       may not overlap q, k or v
 * Query t sits at position pos0 + t and sees keys 0 .. pos0 + t. Query head
 * h reads KV head h / (n_heads / n_kv_heads). Per query and head:
 *   s[j] = dot(q, k[j]) * scale   (dot in the fixed order of dtype.c)
 *   p[j] = expf(s[j] - max) / sum over j of expf(s[j] - max)   (sum in j order)
 *   out  = sum over j in order of p[j] * v[j]
 * n_heads must be a multiple of n_kv_heads.
 *
 * Paged (blocks != NULL): the cache is a pool of blocks of block_size
 * positions, and blocks (a host array of ceil((pos0 + n_q) / block_size)
 * ids) is the sequence's block table: key j's row is row
 * blocks[j / block_size] * block_size + j % block_size of k and v (the
 * layer's K and V of the whole pool). blocks == NULL: row j of k and v.
 * The order above is the host's, the reference; the cuda backend splits
 * the keys into chunks (docs/internals/model.md) in an order that depends on the
 * query's position alone, never on n_q or on other sequences. */
struct baton_attn {
	baton_dptr q, k, v, out;
	uint32_t n_q, n_heads, n_kv_heads, head_dim;
	uint32_t pos0;
	float scale;          /* 1/sqrt(head_dim) for every architecture here */
	const uint32_t *blocks; /* the block table, or NULL: contiguous rows */
	uint32_t block_size;    /* positions per block (paged only) */
};

/* Attention of several sequences' segments in one call (the optional
 * `attention_segs` slot): segment i is the struct baton_attn of its n_q
 * rows (q and out advanced past the rows of the segments before it, the
 * other fields from here), so each segment's results are defined as
 * `attention`'s. The cache is paged: every segment has its block table
 * (a host array of ceil((pos0 + n_q) / block_size) ids into the pool
 * that k and v hold). q, out: [sum of n_q][n_heads * head_dim] rows in
 * segment order. Nothing is written on error (BATON_EINVAL: no segments,
 * a segment `attention` would refuse, no block table or block size).
 * A backend without it gets one `attention` call per segment
 * (forward.c); the cuda backend computes every segment's rows below its
 * tensor-core threshold in one launch (docs/internals/cuda-ops.md). */
struct baton_attn_seg {
	uint32_t n_q, pos0;
	const uint32_t *blocks;
};
struct baton_attn_segs {
	baton_dptr q, k, v, out;
	uint32_t n_seg, n_heads, n_kv_heads, head_dim, block_size;
	float scale;
	const struct baton_attn_seg *segs;
};

/* Up to BATON_MATMULS_MAX matmuls over the same x in one call (the
 * optional `matmuls` slot: attention's q, k and v projections): for
 * i < n, matmul(m[i].w, m[i].w_dtype, m[i].n_out, k, m[i].b, m[i].b_dtype,
 * x, rows, m[i].y, 0) exactly as the matmul slot defines it, so its bits.
 * No y may overlap x or another y. Nothing is written on error (the
 * matmul slot's codes; BATON_EINVAL for n outside 1 .. MAX). Without it
 * forward.c calls matmul n times; the cuda backend runs the batch-1
 * quantized GEMVs of all n as one launch. */
#define BATON_MATMULS_MAX 3
struct baton_matmul_out {
	baton_dptr w, b, y;
	uint32_t w_dtype, b_dtype, n_out, pad;
};
struct baton_matmuls {
	baton_dptr x;
	uint32_t rows, k, n, pad;
	struct baton_matmul_out m[BATON_MATMULS_MAX];
};

/* Writes n new K and V rows into their places in a paged cache (the
 * `kv_store` slot, vLLM's reshape_and_cache): for r < n,
 *   k_cache row slots[r] = k row r;  v_cache row slots[r] = v row r
 * rows of `cols` f32; k, v: [n][cols] contiguous; slots: host array of n
 * row indices into the caches (distinct), each below cache_rows. Nothing
 * is written on error (BATON_EINVAL: zero sizes, NULL or misaligned
 * buffers, overlap; BATON_ERANGE: a slot at or past cache_rows). */
struct baton_kv_store {
	baton_dptr k, v, k_cache, v_cache;
	const uint32_t *slots;
	uint32_t n, cols;
	uint64_t cache_rows;
};

/* Attention's per-head q/k norms and their rotary embedding in one call
 * (the optional `qk_norm_rope` slot), in place: for each token r < rows,
 * each of q's `heads` head rows and k's `kv_heads` (head_dim f32 each,
 * q [rows][heads * head_dim], k [rows][kv_heads * head_dim], apart)
 *   rmsnorm(cols head_dim, weight wq or wk in its dtype, eps), then
 *   rope at pos[r] (host array of rows; inv_freq host, head_dim / 2)
 * exactly as those slots define them, so their bits. With k_cache != 0
 * it is also the kv_store of the result: k (normed and rotated) and v
 * ([rows][kv_heads * head_dim]) rows to rows slots[r] of k_cache and
 * v_cache (struct baton_kv_store, n = rows, cols = kv_heads * head_dim),
 * so one launch where there were two. Nothing is written on error
 * (BATON_EINVAL: zero sizes, an odd head_dim, a NULL or misaligned
 * buffer, q and k overlapping, kv_store's refusals; BATON_ERANGE: a slot
 * at or past cache_rows). */
struct baton_qk_norm_rope {
	baton_dptr q, k, wq, wk;
	uint32_t wq_dtype, wk_dtype, rows, heads, kv_heads, head_dim;
	float eps, mscale;
	const uint32_t *pos;
	const float *inv_freq;
	baton_dptr v, k_cache, v_cache; /* k_cache 0: no store */
	const uint32_t *slots;
	uint64_t cache_rows;
};

/* The MoE block's front in one call (the optional `router_route_dev`
 * slot): for each row r < rows,
 *   norm_on: xn[r] = rmsnorm(x[r]) (cols k, weight norm in norm_dtype or
 *            0 for none, eps), the rmsnorm slot's; else xn is the input
 *   logits[r] = matmul(w, xn[r]) (n_experts rows of k in w_dtype, no
 *            bias, not accumulated), the matmul slot's
 *   ids[r], weights[r] = route_dev(logits[r], top_k, rule)
 * so the bits of those calls one after the other. x, xn [rows][k] f32,
 * apart; logits [rows][n_experts]; ids (u32) and weights (f32)
 * [rows][top_k]. Nothing is written on error (BATON_EINVAL: zero sizes,
 * top_k above n_experts, an unknown rule, a NULL, misaligned or
 * overlapping buffer). */
struct baton_router_route {
	baton_dptr x, xn, norm, w, logits, ids, weights;
	uint32_t norm_on, norm_dtype, w_dtype, n_experts, k, rows, top_k;
	int rule;
	float eps;
};

struct baton_backend {
	const char *name;

	/* Opens device `index`. `capacity_bytes` matters only to backends whose
	 * device size is a setting (host); 0 means the backend's default.
	 * errbuf (may be NULL) gets a sentence naming the problem. */
	int (*open)(int index, uint64_t capacity_bytes, struct baton_dev **out,
	    char *errbuf, size_t errlen);
	/* Frees everything the context still holds; NULL allowed. */
	void (*close)(struct baton_dev *dev);

	/* Device memory: total, and free for everyone (what all processes on
	 * the device left), in bytes. */
	int (*mem_info)(struct baton_dev *dev, uint64_t *free_bytes, uint64_t *total_bytes);
	/* A stable identifier of the device ("GPU-<uuid>" or "host-<index>"). */
	int (*uuid)(struct baton_dev *dev, char *buf, size_t len);
	/* Mapping granularity: segment sizes and offsets are multiples of it. */
	uint64_t (*granularity)(struct baton_dev *dev);

	/* Reserves an address range; no memory is committed. */
	int (*reserve)(struct baton_dev *dev, uint64_t bytes, baton_dptr *base);
	/* Gives the range back; every segment in it must be unmapped first. */
	int (*unreserve)(struct baton_dev *dev, baton_dptr base, uint64_t bytes);
	/* Creates a physical segment of `bytes` and maps it at `addr` inside a
	 * reservation. BATON_EDEVMEM when the device has not enough free
	 * memory; nothing is left mapped on failure. */
	int (*map)(struct baton_dev *dev, baton_dptr addr, uint64_t bytes);
	/* Unmaps the segment at `addr` and frees its memory: when this
	 * returns 0 the memory is back in the device's free count. */
	int (*unmap)(struct baton_dev *dev, baton_dptr addr, uint64_t bytes);

	/* Optional, the peer tier: memory of another device of this backend.
	 * peer_access says whether dev's kernels can read memory made on
	 * `peer` (0), or why not (BATON_EUNSUPPORTED: no peer access between
	 * the two; BATON_EINVAL: peer is dev itself). map_peer creates a
	 * physical segment of `bytes` on `peer` (counted in the peer's
	 * mem_info, not dev's) and maps it at `addr` inside one of dev's
	 * reservations, readable and writable by dev's copies and kernels;
	 * errors as map (BATON_EDEVMEM: the peer is full). unmap_peer undoes
	 * it: when it returns 0 the memory is back in the peer's free count.
	 * A segment made by map_peer is unmapped only by unmap_peer. `peer`
	 * must stay open while such segments exist. */
	int (*peer_access)(struct baton_dev *dev, struct baton_dev *peer);
	int (*map_peer)(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
	    uint64_t bytes);
	int (*unmap_peer)(struct baton_dev *dev, struct baton_dev *peer, baton_dptr addr,
	    uint64_t bytes);

	/* Plain device memory for small, long-lived buffers (dense tensors,
	 * activations). Counted in the device's usage like segments. */
	int (*alloc)(struct baton_dev *dev, uint64_t bytes, baton_dptr *out);
	void (*free)(struct baton_dev *dev, baton_dptr p);

	/* Optional: pins host memory for fast copies (once per process). */
	int (*host_register)(struct baton_dev *dev, const void *p, uint64_t bytes);
	int (*host_unregister)(struct baton_dev *dev, const void *p, uint64_t bytes);

	/* Queues copies host to device; they are complete after sync(). */
	int (*copy_h2d)(struct baton_dev *dev, const struct baton_copy *copies, size_t n);
	/* Optional: queues a copy between two device addresses of this
	 * context (own or peer segments, not overlapping); complete after
	 * sync(), and ordered with the other copies and kernels. */
	int (*copy_d2d)(struct baton_dev *dev, baton_dptr dst, baton_dptr src, uint64_t bytes);
	/* Device to host, synchronous (verify mode, results). */
	int (*copy_d2h)(struct baton_dev *dev, void *dst, baton_dptr src, uint64_t bytes);
	/* Waits for every queued copy and kernel. */
	int (*sync)(struct baton_dev *dev);

	/* Routing for one layer: xn = rmsnorm(x) * norm; logits = router xn;
	 * per token the top_k experts (ids ascending by rank, ties to the
	 * lower id) and their softmax weights over the chosen logits. ids and
	 * weights are host arrays of batch*top_k; returns after they are set. */
	int (*moe_route)(struct baton_dev *dev, const struct baton_moe_layer *l,
	    uint32_t *ids, float *weights);
	/* Experts for one layer: x += sum_k w[t][k] * down(silu(gate xn) * up xn)
	 * where blobs[t*top_k + k] is the device address of token t's k-th
	 * expert blob. Synchronous with respect to later copies into slots. */
	int (*moe_experts)(struct baton_dev *dev, const struct baton_moe_layer *l,
	    const baton_dptr *blobs, const float *weights);
	/* 1 when moe_* (and the forward ops below) can compute weights of
	 * this dtype. */
	int (*can_compute)(int dtype);

	/* ---- the forward pass's dense ops (engine/model/model.c) ----------------
	 * Optional as a group: a backend that has them all can run a whole
	 * model (model_open names the first one missing). Activations are f32
	 * rows in device memory; weights are the arena's rows in any dtype
	 * can_compute accepts, decoded exactly and accumulated in f32 (the
	 * fixed order of host/host.h: every backend must agree with the host
	 * within the tolerances of docs/internals/model.md). Small integer and float
	 * vectors (token ids, positions, frequencies, routing results) travel
	 * as host arrays. The ops are queued on the device like copies: their
	 * results are complete after sync(), or after a call that returns host
	 * results (route). Errors: BATON_EINVAL for a zero dimension, a NULL
	 * address or overlapping buffers where the slot forbids it,
	 * BATON_EUNSUPPORTED for a dtype the backend cannot compute,
	 * BATON_ERANGE for a token id outside the table; nothing is written
	 * on error. */

	/* out[t][i] = decode(table row tokens[t])[i] for t < n: the embedding
	 * rows of `tokens` (host array). table: [vocab][cols] in dtype. */
	int (*embed)(struct baton_dev *dev, baton_dptr table, uint32_t dtype, uint32_t vocab,
	    uint32_t cols, const uint32_t *tokens, uint32_t n, baton_dptr out);
	/* RMSNorm of `rows` rows of `cols`: per row r,
	 *   ss = dot(x[r], x[r]); s = 1 / sqrtf(ss / cols + eps)
	 *   out[r][i] = (x[r][i] * s) * w[i]      (w == 0: out = x[r][i] * s)
	 * w: [cols] in w_dtype. out may equal x (in place), else no overlap.
	 * Per-head norms are rows of head_dim (rows = tokens * heads). */
	int (*rmsnorm)(struct baton_dev *dev, baton_dptr x, baton_dptr out, uint32_t rows,
	    uint32_t cols, baton_dptr w, uint32_t w_dtype, float eps);
	/* y[r][o] = (accumulate ? y[r][o] : 0) + (dot(w row o, x[r]) + b[o])
	 * for r < rows, o < n_out: x [rows][k] f32, w [n_out][k] in w_dtype,
	 * b [n_out] in b_dtype or 0 for none, y [rows][n_out] f32, not
	 * overlapping x. The dot is f32 in the fixed order; the bias, then y,
	 * added after it. Every projection, the router and the output head. */
	int (*matmul)(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
	    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
	    baton_dptr y, int accumulate);
	/* Optional: matmuls over one x; see struct baton_matmuls. */
	int (*matmuls)(struct baton_dev *dev, const struct baton_matmuls *mm);
	/* Rotary embedding in place, Hugging Face's rotate_half layout: x is
	 * [rows][n_heads * head_dim], row r at position pos[r] (host array of
	 * rows); per head, for i < head_dim / 2:
	 *   a = (float)pos[r] * inv_freq[i]   (f32 product)
	 *   c = cosf(a) * mscale, s = sinf(a) * mscale
	 *   x1 = x[i], x2 = x[i + head_dim/2]
	 *   x[i] = x1 * c - x2 * s; x[i + head_dim/2] = x2 * c + x1 * s
	 * inv_freq: host array of head_dim / 2 (the architecture's rope type
	 * and scaling are in it, computed by the model); head_dim even. */
	int (*rope)(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t n_heads,
	    uint32_t head_dim, const uint32_t *pos, const float *inv_freq, float mscale);
	/* Causal GQA over a KV cache; see struct baton_attn. */
	int (*attention)(struct baton_dev *dev, const struct baton_attn *a);
	/* Optional: the segments of a pass in one call; see struct
	 * baton_attn_segs (without it, attention per segment). */
	int (*attention_segs)(struct baton_dev *dev, const struct baton_attn_segs *a);
	/* New K and V rows into a paged cache; see struct baton_kv_store. */
	int (*kv_store)(struct baton_dev *dev, const struct baton_kv_store *s);
	/* out[i] = silu(gate[i]) * up[i] for i < n, silu(g) = g / (1 + expf(-g)).
	 * out may equal gate or up. */
	int (*swiglu)(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
	    uint64_t n);
	/* x[r][i] += g * y[r][i] for r < rows, i < cols, where g = 1 when
	 * gate == 0, else 1 / (1 + expf(-gate[r])) (gate: [rows] f32, the
	 * shared expert's sigmoid gate logit). x and y do not overlap. */
	int (*add)(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
	    uint32_t rows, uint32_t cols);
	/* The router's choice: logits [rows][n_experts] f32 on the device;
	 * per row the top_k experts and their weights by `rule` (enum
	 * baton_route_rule), written to the host arrays ids and weights of
	 * rows * top_k; returns once they are set. */
	int (*route)(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
	    uint32_t top_k, int rule, uint32_t *ids, float *weights);
	/* The MoE block itself is moe_experts above: x = the residual stream,
	 * xn = the normed input, weights from route. */

	/* Optional, as a pair: a decode step's MoE block with nothing coming
	 * back to the host (model.c uses them for small passes while every
	 * expert is resident, else route + moe_experts).
	 * route_dev is route with its results left on the device: ids (u32)
	 * and weights (f32), rows * top_k each, bitwise route's.
	 * moe_experts_dev is moe_experts with the blob of pair p (token
	 * p / top_k) read on the device: table[ids[p]], table being this
	 * layer's u64 blob addresses by expert id, each a multiple of 256;
	 * the same bits as moe_experts given those blobs. Both are queued. */
	int (*route_dev)(struct baton_dev *dev, baton_dptr logits, uint32_t rows,
	    uint32_t n_experts, uint32_t top_k, int rule, baton_dptr ids, baton_dptr weights);
	int (*moe_experts_dev)(struct baton_dev *dev, const struct baton_moe_layer *l,
	    baton_dptr table, baton_dptr ids, baton_dptr weights);
	/* Optional: the large passes moe_experts_dev runs at least as fast as
	 * route + moe_experts would, for experts of l's shape and dtypes (l's
	 * batch, x and xn unused): 1 and *lo .. *hi rows (lo > 1), or 0 (and
	 * without it): none, the model's small passes only (model.c's
	 * RT_ROWS). The cuda backend's bf16 experts: from the tensor-core
	 * path's rows, which it plans on the device. */
	int (*moe_dev_rows)(struct baton_dev *dev, const struct baton_moe_layer *l, uint32_t *lo,
	    uint32_t *hi);
	/* Optional, with route_dev: the post-attention norm, the router and
	 * route_dev in one queued call (struct baton_router_route), their
	 * bits (the cuda backend's one launch where they were three).
	 * Without it forward.c queues rmsnorm, matmul, then route_dev. */
	int (*router_route_dev)(struct baton_dev *dev, const struct baton_router_route *a);

	/* Optional: the per-head q/k norms and rope of struct
	 * baton_qk_norm_rope in one queued call (one launch where rmsnorm
	 * twice and rope twice were four); without it forward.c queues the
	 * four. */
	int (*qk_norm_rope)(struct baton_dev *dev, const struct baton_qk_norm_rope *a);

	/* Optional, as a pair: a pass queued as one graph (CUDA graphs).
	 * graph_begin starts recording what is queued next instead of
	 * running it (0, or a code: then nothing changed and the caller
	 * queues as usual); *replay = 1 says the backend holds a recording
	 * it will check this pass against instead: the ops queue nothing,
	 * and graph_end(1) queues the recording on this pass's arrays (an
	 * op that goes another way than the recording fails, BATON_ESTATE).
	 * graph_end(ok = 1) ends the recording and queues the whole of it,
	 * the same work in the same order, so the same bits; ok = 0 (an op
	 * failed while recording) drops it, nothing of it runs. If
	 * graph_end(1) fails, nothing of the recording ran either: the
	 * caller queues the pass again (after a refused replay the next
	 * graph_begin records). Between the two, only queued work may be
	 * asked for: no sync, no copy to the host. */
	int (*graph_begin)(struct baton_dev *dev, int *replay);
	int (*graph_end)(struct baton_dev *dev, int ok);

	/* Optional: readies now what passes of up to `rows` rows would make
	 * on first use (cuda: the tensor-core path: cuBLAS loaded, its
	 * handle, workspace and helper kernels, about a second the first
	 * time in a process), so that a model's first long prompt does not
	 * pay for it and its memory is taken at open, where the broker
	 * counts it. 0, or a code; nothing depends on it (the first such
	 * pass starts what is missing, as without it). */
	int (*prepare)(struct baton_dev *dev, uint32_t rows);

	/* Optional: qk_norm_rope(nr) (with its store: nr->k_cache set) then
	 * attention_segs(s) in one queued call, with both slots' results
	 * for the cache and out (the cuda backend fuses them into one
	 * launch for passes of decode rows, one row a segment; else it
	 * queues the two). q and k (nr->q, nr->k) are left unspecified:
	 * the norms and rotations may be made on the fly, not in place.
	 * Refusals are the two slots'. Without it forward.c queues the two. */
	int (*qk_attention_segs)(struct baton_dev *dev, const struct baton_qk_norm_rope *nr,
	    const struct baton_attn_segs *s);
	/* Optional: rmsnorm(x, mm->x, mm->rows, mm->k, w, w_dtype, eps) then
	 * matmuls(mm) in one queued call, with their results in the outputs
	 * (the cuda backend's one launch at batch 1 on q4_K / q6_K: each
	 * block norms x itself); mm->x (the normed rows) is left
	 * unspecified. Refusals are the two slots'. Without it forward.c
	 * queues the two. */
	int (*rmsnorm_matmuls)(struct baton_dev *dev, baton_dptr x, baton_dptr w, uint32_t w_dtype,
	    float eps, const struct baton_matmuls *mm);

	/* Optional, as a pair: host memory that copy_d2h writes at the
	 * device's full rate, straight into it (pinned, writable: cuda's
	 * cuMemHostAlloc), for a step's logits; host_free after the last
	 * copy into it, before close. Without them callers use malloc. */
	int (*host_alloc)(struct baton_dev *dev, uint64_t bytes, void **p);
	void (*host_free)(struct baton_dev *dev, void *p);

	/* Optional: seconds the host has spent so far waiting for the device
	 * (every sync, every copy that waits): with a step's wall time, how
	 * much of it was the host's own. */
	double (*wait_seconds)(struct baton_dev *dev);
};

extern const struct baton_backend baton_backend_host;

/* The optional slots, checked here once (as ggml-backend does), so that
 * callers never test a slot for NULL. Without a peer tier (map_peer or
 * unmap_peer missing) backend_has_peer is 0 and the peer calls return
 * BATON_EUNSUPPORTED; a backend without peer_access puts no limit beyond
 * that. Without host_register, pinning is a no-op (0). Without copy_d2d,
 * backend_copy_d2d returns BATON_EUNSUPPORTED (callers that have another
 * way ask backend_has_copy_d2d first). */
int backend_has_peer(const struct baton_backend *be);
int backend_peer_access(const struct baton_backend *be, struct baton_dev *dev,
    struct baton_dev *peer);
int backend_map_peer(const struct baton_backend *be, struct baton_dev *dev,
    struct baton_dev *peer, baton_dptr addr, uint64_t bytes);
int backend_unmap_peer(const struct baton_backend *be, struct baton_dev *dev,
    struct baton_dev *peer, baton_dptr addr, uint64_t bytes);
int backend_host_register(const struct baton_backend *be, struct baton_dev *dev,
    const void *p, uint64_t bytes);
int backend_host_unregister(const struct baton_backend *be, struct baton_dev *dev,
    const void *p, uint64_t bytes);
int backend_has_copy_d2d(const struct baton_backend *be);
/* What to do about weights of a dtype that `be` cannot compute, for the
 * error that names it: the host backend's flag where the host computes
 * the type, else the llama-quantize types to convert to (the IQ1/IQ2/IQ3
 * and ternary families, which no backend computes). Never NULL. */
const char *backend_dtype_advice(const struct baton_backend *be, int dtype);
int backend_copy_d2d(const struct baton_backend *be, struct baton_dev *dev, baton_dptr dst,
    baton_dptr src, uint64_t bytes);

/* Finds a backend by name: "host", "cuda", or "auto" (cuda when a GPU and
 * its driver are present, else host). BATON_ENODEV with a message naming
 * why when "cuda" is asked for and cannot be used; BATON_EINVAL for an
 * unknown name. */
int backend_find(const char *name, const struct baton_backend **out, char *errbuf, size_t errlen);

/* ---- fault.c: fault injection, a decorator over any backend ------------------
 *
 * The Nth call of map (map_peer counts as a map), alloc, copy_h2d (copy_d2d
 * counts as one) or copy_d2h (counted per process, 1-based, from the wrap)
 * fails with the code a real device gives (BATON_EDEVMEM for map and alloc,
 * BATON_EDRIVER for copy_h2d, BATON_EIO for copy_d2h), without calling the
 * wrapped backend, so nothing is left mapped or half copied.
 *
 * Configured by the environment, read once:
 *   BATON_FAULT="map:3,copy:5,alloc:2/4,d2h:1"
 * a comma list of op:N or op:N/every (the Nth call fails, then every
 * `every` calls after it). op is map, alloc, copy (copy_h2d), d2h
 * (copy_d2h) or send (handled by proto/transport_msg.c, ignored here). N = 0
 * counts without failing. Each injected fault is one line on stderr,
 * "baton-fault: <op> call <n> fails: <code>", and close() prints the call
 * counts: "baton-fault: calls map=.. alloc=.. copy=.. d2h=.. injected=..". */

/* When BATON_FAULT names a device op, *out is the fault table wrapping
 * `inner` for `dev` (at most 8 devices per process); otherwise *out =
 * inner. The wrap lasts until the fault table's close(dev). Returns 0, or
 * BATON_EINVAL with errbuf set for a malformed BATON_FAULT, or
 * BATON_ENOMEM when 8 devices are already wrapped. */
int fault_wrap(const struct baton_backend *inner, struct baton_dev *dev,
    const struct baton_backend **out, char *errbuf, size_t errlen);

/* Faults injected in this process so far. */
unsigned long fault_injected(void);

#endif
