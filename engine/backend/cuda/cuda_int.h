/*
 * cuda_int.h: internal to the `cuda` backend, shared by its files, bottom
 * to top: driver.c (the driver API loaded with dlopen, driver.h), ctx.c
 * (error recording, the context, the stream), launch.c (what both
 * launchers use: the dtypes the kernels compute, growing device buffers,
 * one launch), blas.c (cuBLAS loaded with dlopen), tc_launch.c (the
 * tensor-core path of matmul, the experts and attention for large
 * passes: the kernels of gemm.cu and attn.cu, argument blocks in tc.h,
 * around cuBLAS GEMMs), graph.c (a pass recorded and queued as one CUDA
 * graph), moe_launch.c (the MoE kernels of moe.cu, argument blocks in
 * moe.h: loading them, their scratch, and the launches), ops_launch.c (the
 * forward pass's row ops of ops.cu, argument blocks in ops.h),
 * attn_split_launch.c and route_launch.c (attention and routing: the
 * kernels of attn_split.cu and route.cu, over ops_launch.c's checks,
 * staging and ops) and backend.c (the device: open, close, VMM segments,
 * the peer tier, buffers, pinning, copies, and the backend table). Each calls only those below it; the MoE and the dense
 * ops' launchers do not call each other. Built only with CUDA=1.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_INT_H
#define BATON_ENGINE_BACKEND_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/cuda/cuda.h"
#include "engine/backend/cuda/driver.h"
#include "engine/backend/cuda/moe.h"
#include "engine/backend/cuda/ops.h"

#define N_VARIANTS 4 /* row kernels for 1, 2, 4, 8 tokens per warp */
#define TC_BUFS 6    /* scratch buffers of the tensor-core path */

/* One entry of a table: a segment (handle set), a reservation, a plain
 * allocation or a host registration (handle = piece size). */
struct ent {
	uint64_t addr, bytes, handle;
};

struct tab {
	struct ent *v;
	size_t n, cap;
};

struct bp;

/* A device buffer that grows on demand (scratch of the MoE kernels). */
struct dbuf {
	CUdeviceptr p;
	uint64_t cap;
};

struct baton_dev {
	const struct cuda_driver *d;
	int index;
	CUdevice cudev;
	CUcontext ctx;
	CUstream stream;
	CUevent staged; /* recorded after the copy out of `stage` */
	CUmodule mod;
	CUfunction k_norm, k_reduce, k_chunks;
	CUfunction k_gemv[N_VARIANTS], k_gate_up[N_VARIANTS], k_down[N_VARIANTS];
	CUmemAllocationProp prop;
	uint64_t gran, gran_min;
	int ro_register;
	uint64_t register_piece;
	char name[128];

	struct tab segs, ress, allocs, hregs;
	struct tab psegs; /* peer-tier segments: memory on another device, mapped here */

	/* MoE scratch: device buffers, one pinned host staging buffer, and
	 * the router logits in pinned host memory mapped into the device
	 * (the kernel writes them there: no copy to queue and wait for). */
	struct dbuf desc, h, part;
	float *lg_host;
	CUdeviceptr lg_dev;
	uint64_t lg_cap;
	void *stage;
	uint64_t stage_cap;
	int stage_busy; /* `staged` was recorded since the stage was last free */
	/* moe_experts' pairs sorted by blob */
	struct bp *sort;
	size_t sort_cap;

	/* The forward pass's dense ops (ops_launch.c; attention's and
	 * routing's in attn_split_launch.c, route_launch.c): their module, a
	 * device copy of each call's small host arrays (token ids,
	 * positions, frequencies) staged through pinned memory, the
	 * attention scores, and route's logits back on the host. The
	 * staging is a ring of two halves (host and device alike): a half is
	 * written again only after the copies out of it have run. */
	CUmodule ops_mod;
	/* attention's and routing's kernels (attn_split.cu, route.cu): a
	 * module each, loaded by attn_split_launch.c and route_launch.c */
	CUmodule attn_mod, route_mod;
	CUfunction k_embed, k_rmsnorm, k_rmsnorm_row, k_qk_norm_rope, k_rope, k_attn_part, k_attn_comb, k_kv_store, k_swiglu, k_add,
	    k_route, k_router_route, k_attn_rows;
	/* baton_ops_attn_nr1, 2, 4, 8 (ops.h): the decode rows' attention
	 * fused with qk_norm_rope; ar_nh: the heads a block it is launched
	 * with (BATON_CUDA_ATTN_NH; 0: by the pass's rows), ar_fuse_off:
	 * BATON_CUDA_ATTN_FUSE=0 (qk_norm_rope and attn_rows apart) */
	CUfunction k_attn_nr[4];
	uint32_t ar_nh;
	int ar_fuse_off;
	int pdl; /* BATON_CUDA_PDL=1: cuda_launch_kx's programmatic dependent launches */
	/* baton_ops_attn_rows: its per-(row, head tile) counters (left
	 * zeroed by the kernel), and the host array of its rows and block
	 * tables, staged each call */
	struct dbuf ar_cnt;
	uint32_t *ar_host;
	uint64_t ar_cap; /* u32s */
	CUfunction k_matmul[2][BATON_OPS_KINDS]; /* [1 row, 8 rows][kind] */
	struct dbuf ops_arg, ops_scores, ops_count; /* ops_count: the fused router's counters */
	void *ops_stage;
	uint64_t ops_stage_cap, ops_off; /* ops_off: next free byte in half ops_half */
	CUevent ops_staged[2];           /* recorded after each copy out of a half */
	int ops_stage_busy[2], ops_half;
	float *ops_logits;
	uint64_t ops_logits_cap;

	/* The quantized batch-1 path (mmvq_launch.c): off with
	 * BATON_CUDA_EXACT=1; the activation's int8 blocks for the matmuls
	 * (vq_x, holding the quantization of vq_src, k vq_k, valid while
	 * n_launch is still vq_mark) and for the experts' h (vq_h). */
	CUmodule vq_mod;
	CUfunction k_vq_quant, k_vq_matmul, k_vq_gate_up, k_vq_down, k_vq_gate_up4, k_vq_down4,
	    k_vq_matmuls;
	int vq_off, vq_narrow; /* vq_narrow: BATON_CUDA_MMVQ_NARROW=1, no wide q4_K experts */
	struct dbuf vq_x, vq_h;
	baton_dptr vq_src;
	uint32_t vq_k;
	/* n_launch: every cuda_launch_k, cuBLAS call, copy to the device and
	 * free so far: a copy of an activation made at n_launch still holds
	 * while n_launch is unchanged */
	uint64_t vq_mark, n_launch;

	/* The grouped experts of passes of 2 to 64 rows (moe_rows_launch.c),
	 * off with vq_off too or BATON_CUDA_MOE_ROWS=0: their module, their
	 * scratch (the rows' int8 x, the slots and pairs, h as int8), sized
	 * for the most rows at the first use. */
	CUmodule mr_mod;
	CUfunction k_mr_quant, k_mr_group, k_mr_gate_up, k_mr_down;
	int mr_off;
	struct dbuf mr_buf;

	/* The 16-bit batch-1 path (gemv16_launch.c), off with vq_off too. */
	/* gemv16_launch.c's programmatic dependent launches (cuda_launch_kx
	 * with pdl 2): BATON_G16_PDL, 0 none, 1 (default) every 16-bit GEMV,
	 * 2 the experts' kernels alone (g16_pdl_mm 0) */
	int pdl_on, g16_pdl_mm;
	CUmodule g16_mod;
	CUfunction k_g16_matmul, k_g16_gate_up, k_g16_down, k_g16_matmuls;

	/* The tensor-core path (blas.c, tc_launch.c): off until the first
	 * pass of tc_rows rows or more asks for it (tc_state 0), then on (1)
	 * or off for good (-1, tc_why says why). Its scratch: bf16 weights,
	 * activations and the GEMMs' outputs (tc_buf), a pinned staging
	 * buffer for the MoE block's maps. */
	int tc_state, blas_version;
	uint32_t tc_rows;
	uint64_t tc_scratch; /* most bytes of bf16 weights decoded at once */
	void *blas;          /* cublasHandle_t */
	CUdeviceptr tc_ws;   /* cuBLAS's workspace */
	CUmodule tc_mod, tc_attn_mod, tc_eg_mod;
	CUfunction k_tc_dequant, k_tc_rows, k_tc_bias, k_tc_swiglu, k_tc_combine, k_tc_attn_kv,
	    k_tc_attn_q, k_tc_attn_out, k_tc_attn_softmax, k_tc_mm_f32, k_tc_egemm, k_tc_egemm_m128, k_tc_plan;
	struct dbuf tc_buf[TC_BUFS];
	/* tc_buf[B_X] holds x (tc_x_rows x tc_x_k) as bf16 while n_launch is
	 * tc_x_mark: q, k and v convert one xn */
	baton_dptr tc_x_src;
	uint64_t tc_x_mark;
	uint32_t tc_x_rows, tc_x_k;
	void *tc_stage;
	uint64_t tc_stage_cap;
	CUevent tc_staged;
	int tc_stage_busy, tc_warned;
	/* the experts' GEMMs (blas.c's cuda_tc_config): BATON_TC_EXPERT_GEMM,
	 * BATON_TC_INPLACE; tc_grouped_said once the grouped call refused */
	uint32_t tc_egemm; /* TC_EGEMM_DEFAULT: unset */
#define TC_EGEMM_DEFAULT 0xffffffffu
	int tc_inplace, tc_grouped_said, tc_mmf, tc_mm_eg;
	uint32_t tc_eg_rows; /* egemm.cu's block rows: 64 or 128 (BATON_TC_EG_ROWS) */
	uint32_t tc_pad; /* BATON_TC_PAD */
	char tc_why[200];
	/* lt.c: cuBLASLt's handle (lt_state 0 untried, 1 on, -1 off:
	 * BATON_CUBLASLT=0 or no library) and the kernel of each shape class */
	int lt_state;
	void *lt;
	struct cuda_lt_algo *lt_tab;
	uint32_t lt_n, lt_cap, lt_classes;
	uint64_t lt_calls, lt_refused;

	/* graph.c: the pass being captured, the last pass's executable graph */
	int graph_off, capturing;
	int ops_rec_pending[2]; /* ops_staged[h] to record after the graph */
	CUgraphExec gexec;
	uint64_t graph_builds, graph_updates, graph_replays;
	/* The recording's log (launch.c): each launch (function, grid,
	 * block, shared bytes, its argument block in gl_args) and each
	 * staged copy (f NULL: bytes and offset in the graph's staging), in
	 * order. A later pass is checked against it (gmode CUDA_G_CHECK):
	 * the same calls with the same arguments replay the graph, whose
	 * copy nodes read the host half of the staging that the check
	 * filled anew. */
	int gmode, gfail, gl_ok, g_launched;
	struct cuda_glog *gl;
	uint32_t gl_n, gl_cap, gk;
	uint8_t *gl_args;
	uint64_t gl_args_n, gl_args_cap;
	void *gs_host; /* the graph's staging: pinned host bytes, copied to gs_dev */
	struct dbuf gs_dev;
	uint64_t gs_cap, gs_off;
	uint32_t *gtab; /* a block table padded to its capacity (attention) */
	uint64_t gtab_cap;
	CUevent graph_done; /* recorded after each graph launch */

	/* BATON_CUDA_PROFILE=1 (launch.c): every launch outside a graph timed
	 * alone between two events, summed per launch site, printed at close */
	int prof, prof_n;
	CUevent prof_ev[2];
	struct cuda_prof {
		const char *what;
		uint64_t n;
		double ms;
	} prof_v[64];
	uint64_t prof_tc_calls, prof_tc_pairs, prof_tc_experts, prof_tc_rows, prof_tc_buckets;

	/* copies to the host of up to D2H_STAGE bytes (backend.c): through
	 * this pinned buffer, allocated at the first */
	void *d2h_stage;

	/* The multi-row GEMVs of passes of 2 to 64 rows (mmvq_rows_launch.c):
	 * q4_K / q6_K (off with vq_off) and the f32 routers; vr_off:
	 * BATON_CUDA_VR=0. vr_x: the pass's rows as int8 blocks. */
	CUmodule vr_mod;
	CUfunction k_vr[4], k_vr_f32[2];
	int vr_off, vr_f32; /* vr_f32: BATON_CUDA_VR_F32=1, the f32 kernel (opt-in) */
	struct dbuf vr_x;
	/* vr_x holds the quantization of vr_src (vr_rows x vr_k) while
	 * n_launch is vr_mark (a multi-row rmsnorm wrote it, or the last
	 * multi-row matmul quantized it) */
	baton_dptr vr_src;
	uint32_t vr_rows, vr_k;
	uint64_t vr_mark;
	/* host_alloc's pinned buffers (backend.c): copy_d2h into them goes
	 * straight there */
	struct tab hallocs;
	double t_wait; /* seconds in cuda_stream_sync so far (wait_seconds) */

	char err[256];
};

/* ---- ctx.c: the helpers under every file ---------------------------------- */

/* The context's error sentence (cuda_backend_last_error). */
void cuda_set_err(struct baton_dev *dev, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Records a failed driver call and maps it to a Baton code. */
int cuda_fail(struct baton_dev *dev, CUresult r, const char *what);
/* Makes dev's context current on this thread. */
int cuda_cur(struct baton_dev *dev);
/* Waits for the stream (and so frees the staging buffer). */
int cuda_stream_sync(struct baton_dev *dev);

/* A failed driver call returns its Baton code from the calling function. */
#define CU(dev, call, what)                                                    \
	do {                                                                   \
		CUresult cu_r_ = (call);                                       \
		if (cu_r_ != CUDA_SUCCESS)                                     \
			return cuda_fail((dev), cu_r_, (what));                \
	} while (0)

static inline uint64_t cuda_round_up(uint64_t v, uint64_t g)
{
	return (v + g - 1) / g * g;
}

/* ---- launch.c: under both launchers ----------------------------------------- */

/* The can_compute slot: the dtypes both launchers' kernels compute (f32,
 * f16, bf16, q8_0, the K-quants q2_K..q6_K, q4_0, q4_1, q5_0, q5_1,
 * iq4_nl, iq4_xs, mxfp4). */
int cuda_can_compute(int dtype);
/* A growing device buffer: at least `bytes` (a larger one replaces it
 * after the stream is idle); freed by cuda_dbuf_free. */
int cuda_dbuf_need(struct baton_dev *dev, struct dbuf *b, uint64_t bytes);
void cuda_dbuf_free(struct baton_dev *dev, struct dbuf *b);
/* Queues kernel f on the stream: grid (gx, gy, gz), `threads` per block,
 * `shmem` dynamic shared bytes, one argument block of `size` bytes; a
 * failure is recorded with `what`. While a pass is recorded (gmode
 * CUDA_G_RECORD) the launch is also logged; while one is checked
 * (CUDA_G_CHECK) nothing is queued: the launch must be the log's next,
 * argument bytes and all, else BATON_ESTATE ("differs"). size 0: an
 * argument block the log cannot compare (the recording is not replayed). */
int cuda_launch_k(struct baton_dev *dev, CUfunction f, uint32_t gx, uint32_t gy, uint32_t gz,
    uint32_t threads, uint32_t shmem, const void *args, uint32_t size, const char *what);
/* cuda_launch_k, with pdl 1 and BATON_CUDA_PDL=1 (dev->pdl), or pdl 2
 * (the caller's own switch: gemv16_launch.c's BATON_G16_PDL), as a
 * programmatic dependent launch (Hopper): the kernel may start before the
 * one queued ahead of it ends, so it must run griddepcontrol.wait before
 * it reads what that kernel writes or writes anything (mmvq.cu's GEMVs
 * prefetch their weight rows first); the one ahead may let it start
 * early with griddepcontrol.launch_dependents. */
int cuda_launch_kx(struct baton_dev *dev, CUfunction f, uint32_t gx, uint32_t gy, uint32_t gz,
    uint32_t threads, uint32_t shmem, const void *args, uint32_t size, const char *what, int pdl);
/* The usual launch: grid (gx, gy), args a pointer to the argument struct. */
#define cuda_launch(dev, f, gx, gy, threads, args, what)                       \
	cuda_launch_k((dev), (f), (gx), (gy), 1, (threads), 0, (args), (uint32_t)sizeof *(args), (what))

/* Graph modes (gmode): none, recording a pass, checking a pass against
 * the recording (nothing queued until graph_end launches the graph). */
enum { CUDA_G_NONE = 0, CUDA_G_RECORD = 1, CUDA_G_CHECK = 2 };
struct cuda_glog {
	CUfunction f; /* NULL: a staged copy */
	uint32_t g[3], threads, shmem, size;
	uint64_t off; /* launch: into gl_args; copy: into the staging */
};
/* Host arrays (a, then b 16-byte aligned after it) to the device through
 * the graph's staging while gmode is set: fixed offsets in call order, so
 * a replayed graph finds each array where the recording put it. */
int cuda_graph_stage(struct baton_dev *dev, const void *a, uint64_t an, const void *b,
    uint64_t bn, CUdeviceptr *da, CUdeviceptr *db);
/* Frees the log and the staging (at close). */
void cuda_glog_free(struct baton_dev *dev);
/* BATON_CUDA_PROFILE=1 at open: each launch outside a graph waits for its
 * kernel and adds its time to its launch site's; the table goes to stderr
 * at close (cuda_prof_report). A measuring aid: it serializes the host. */
void cuda_prof_config(struct baton_dev *dev);
void cuda_prof_report(struct baton_dev *dev);
/* The same timing around work that is not one of our launches (a cuBLAS
 * call): 1 from begin when the profile is on (then call end, with a
 * string that lives as long as the device), else 0. */
int cuda_prof_begin(struct baton_dev *dev);
void cuda_prof_end(struct baton_dev *dev, const char *what);
void cuda_prof_host(struct baton_dev *dev, const char *what, double ms);

/* ---- blas.c: cuBLAS loaded with dlopen -------------------------------------- */

/* 1 when a pass of `rows` rows takes the tensor-core path: the path is
 * not off (BATON_CUDA_GEMM=0), rows >= BATON_CUDA_GEMM_ROWS (default 64),
 * and cuBLAS and the helper kernels loaded (tried at the first such pass;
 * a failure turns the path off for the device, said once on stderr). */
int cuda_tc_on(struct baton_dev *dev, uint64_t rows);
/* Reads those settings from the environment (at open). */
void cuda_tc_config(struct baton_dev *dev);
/* "tensor cores through cuBLAS 130100 ..." or why not, for describe. */
void cuda_tc_describe(struct baton_dev *dev, char *buf, size_t len);
/* Gives back the handle, scratch and modules (at close). */
void cuda_tc_free(struct baton_dev *dev);

/* One GEMM, column-major as cuBLAS: C (m x n, f32, ldc) = alpha op(A)
 * op(B) + beta C, A and B of cudaDataType a_type / b_type (14 bf16),
 * f32 accumulation; batch > 1: strided batched (strides in elements). */
struct cuda_gemm {
	int ta, tb, m, n, k;
	float alpha, beta;
	CUdeviceptr a, b, c;
	int a_type, b_type, lda, ldb, ldc, batch;
	long long sa, sb, sc;
	const char *what; /* the profile's name for the call (a literal) */
};
int cuda_blas_gemm(struct baton_dev *dev, const struct cuda_gemm *g);
/* The same with a, b and c device arrays of `batch` device pointers
 * (cublasGemmBatchedEx; strides unused). */
int cuda_blas_gemm_ptrs(struct baton_dev *dev, const struct cuda_gemm *g);
/* cublasGemmGroupedBatchedEx, alpha 1 and beta 0, f32 C: groups (at most
 * CUDA_GEMM_GROUPS_MAX) of size[i] problems m[i] x n[i] x k[i] each; a, b,
 * c device arrays of the problems' pointers, group after group.
 * CUDA_TC_FALLBACK when the library lacks it or refuses the call (said
 * once on stderr), before anything is queued. */
#define CUDA_GEMM_GROUPS_MAX 1024
struct cuda_gemm_groups {
	int ta, tb, groups, a_type, b_type;
	const int *m, *n, *k, *lda, *ldb, *ldc, *size; /* host arrays of groups */
	CUdeviceptr a, b, c;
	const char *what;
};
int cuda_blas_gemm_grouped(struct baton_dev *dev, const struct cuda_gemm_groups *g);

/* libcublas's path as opened, or NULL; the workspace given to it (and to
 * lt.c's calls). */
const char *cuda_blas_path(void);
uint64_t cuda_blas_workspace_bytes(void);

/* ---- lt.c: cuBLASLt, the kernel chosen once per shape class ----------------- */

/* g (cuda_blas_gemm's) through cublasLtMatmul with its class's kernel:
 * 0, or CUDA_TC_FALLBACK with nothing queued (no library, BATON_CUBLASLT=0,
 * no kernel for the class, or the kernel refused g's shape). */
int cuda_lt_gemm(struct baton_dev *dev, const struct cuda_gemm *g);
/* "cuBLASLt: N GEMMs, N shape classes ..." for the profile. */
void cuda_lt_describe(const struct baton_dev *dev, char *buf, size_t len);
/* The handle and the classes (at close, before the workspace goes). */
void cuda_lt_free(struct baton_dev *dev);

/* ---- tc_launch.c: the tensor-core path of matmul, moe_experts, attention -- */

/* Returned by the tc_* calls below when they took nothing on (no scratch
 * memory, a shape they do not do): the caller runs its own kernels. */
#define CUDA_TC_FALLBACK (-1)

/* matmul's slot for rows >= tc_rows, weights not f32, k % 8 == 0: y
 * (+)= x w^T (+ b) with w decoded to bf16, x rounded to bf16, f32
 * sums. Arguments already checked by cuda_op_matmul. */
int cuda_tc_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint64_t row_bytes,
    uint32_t n_out, uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate);
/* The experts of moe_experts for a large batch: blobs[p] the expert blob
 * of pair p < n (p = t * top_k + k), w the host's weights by pair;
 * x[t] += w[p] * expert(xn[t]) over t's pairs in rank order, each
 * product rounded before its add (moe_reduce's sum). Groups the pairs by
 * blob itself. */
int cuda_tc_experts(struct baton_dev *dev, const struct baton_moe_layer *l, const baton_dptr *blobs,
    uint64_t n, const float *w);
/* A large pass's experts routed on the device (moe_experts_dev's args),
 * or CUDA_TC_FALLBACK where cuda_tc_experts_dev_ok says no. */
int cuda_tc_experts_dev(struct baton_dev *dev, const struct baton_moe_layer *l, CUdeviceptr table,
    CUdeviceptr ids, CUdeviceptr weights);
int cuda_tc_experts_dev_ok(const struct baton_dev *dev, const struct baton_moe_layer *l);
/* backend.h's moe_dev_rows */
int cuda_moe_dev_rows(struct baton_dev *dev, const struct baton_moe_layer *l, uint32_t *lo,
    uint32_t *hi);
/* The attention slot for n_q >= tc_rows (table: the staged block table
 * or 0). */
int cuda_tc_attention(struct baton_dev *dev, const struct baton_attn *a, CUdeviceptr table);

/* ---- graph.c: a pass as one CUDA graph -------------------------------------- */

/* The graph_begin / graph_end slots (engine/backend/backend.h). */
int cuda_graph_begin(struct baton_dev *dev, int *replay);
int cuda_graph_end(struct baton_dev *dev, int ok);
/* Graphs are on unless BATON_CUDA_GRAPH=0 (read at open). */
void cuda_graph_config(struct baton_dev *dev);
/* Ends a capture left open and gives back the graph (at close). */
void cuda_graph_free(struct baton_dev *dev);

/* ---- moe_launch.c ----------------------------------------------------------- */

/* Loads the kernels from the embedded fatbin and launches each once (at
 * open); cuda_moe_free gives back the module and every scratch buffer
 * (at close, with the context current). */
int cuda_moe_load(struct baton_dev *dev);
void cuda_moe_free(struct baton_dev *dev);
/* The backend slots moe_route and moe_experts. */
int cuda_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l,
    uint32_t *ids, float *weights);
int cuda_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *weights);
/* moe_experts_dev (engine/backend/backend.h): moe_experts with the blobs
 * read on the device, for the decode step's MoE block (with
 * cuda_op_route_dev below). */
int cuda_moe_experts_dev(struct baton_dev *dev, const struct baton_moe_layer *l,
    baton_dptr table, baton_dptr ids, baton_dptr weights);

/* ---- mmvq_launch.c: the quantized batch-1 GEMVs ---------------------------- */

/* BATON_CUDA_EXACT=1 turns the path off (read at open); load, free as
 * cuda_ops_load / cuda_ops_free. */
void cuda_mmvq_config(struct baton_dev *dev);
int cuda_mmvq_load(struct baton_dev *dev);
void cuda_mmvq_free(struct baton_dev *dev);
/* matmul at rows == 1 on q4_K / q6_K rows (k % 256 == 0), arguments
 * checked by cuda_op_matmul; CUDA_TC_FALLBACK when it does not apply. */
int cuda_mmvq_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint64_t row_bytes,
    uint32_t n_out, uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate);
/* matmuls (checked by cuda_op_matmuls) at rows == 1 with every matrix on
 * that path: one launch for all; else CUDA_TC_FALLBACK. */
int cuda_mmvq_matmuls(struct baton_dev *dev, const struct baton_matmuls *mm);
/* The quantized GEMVs' rules, one definition for the batch-1 kernels and
 * mmvq_rows.cu's (a row's bits are the same through either only while
 * both take it so): whether rows of dtype dt at addr with k columns take
 * them (q4_K at 4-byte alignment, q6_K at 2: its blocks are 210 bytes;
 * whole 256-value blocks), and the threads a row of an n_out-row matrix. */
int cuda_mmvq_dtype_ok(uint32_t dt, uint64_t addr, uint32_t k);
uint32_t cuda_mmvq_tpr(uint32_t k, uint32_t n_out);
/* A one-row rmsnorm's output as the matmuls' int8 blocks, written by the
 * norm's own kernel (no quantize launch): *q, *d where it writes them
 * (vq_x), or 0 when the path is off or cols % 256; after the launch,
 * cuda_mmvq_norm_done(out) lets the matmuls right after it reuse them. */
int cuda_mmvq_norm_out(struct baton_dev *dev, uint32_t rows, uint32_t cols, uint64_t *q,
    uint64_t *d);
void cuda_mmvq_norm_done(struct baton_dev *dev, baton_dptr out, uint32_t cols);
/* After one launch (n_launch was `before`) that wrote only [a, a + an)
 * and [b, b + bn) (bn 0: none): the quantization stays valid if they
 * miss its x. */
void cuda_mmvq_keep(struct baton_dev *dev, uint64_t before, baton_dptr a, uint64_t an,
    baton_dptr b, uint64_t bn);
/* moe_experts_dev at batch 1 on q4_K / q6_K experts, checked by
 * cuda_moe_experts_dev: x += the experts' weighted sum in two GEMV
 * launches (and two quantizations); CUDA_TC_FALLBACK when it does not
 * apply. */
int cuda_mmvq_experts(struct baton_dev *dev, const struct baton_moe_layer *l, baton_dptr table,
    baton_dptr ids, baton_dptr weights);

/* ---- moe_rows_launch.c: the experts of passes of 2 to 64 rows --------------- */

/* Load at open (after cuda_g16_load), free at close. */
int cuda_mr_load(struct baton_dev *dev);
void cuda_mr_free(struct baton_dev *dev);
/* moe_experts_dev at batch 2 .. BATON_MR_MAX_ROWS on q4_K experts (rows at
 * 16-byte alignment), checked by cuda_moe_experts_dev: the pairs grouped
 * by expert on the device, each chosen expert's rows read once for all
 * its pairs (int8 activations, as mmvq's), then the reduce in rank order;
 * CUDA_TC_FALLBACK when it does not apply. */
int cuda_mr_experts(struct baton_dev *dev, const struct baton_moe_layer *l, baton_dptr table,
    baton_dptr ids, baton_dptr weights);

/* ---- gemv16_launch.c: the 16-bit batch-1 GEMVs ------------------------------ */

/* ---- mmvq_rows_launch.c: the GEMVs of passes of 2 to 64 rows -------------- */

/* Load at open (after cuda_mmvq_load: it launches baton_mmvq_quant), free
 * at close. */
int cuda_vr_load(struct baton_dev *dev);
void cuda_vr_free(struct baton_dev *dev);
/* Whether a pass of rows takes this path (2 to 64 rows, short of the
 * tensor cores', not BATON_CUDA_VR=0). */
int cuda_vr_on(const struct baton_dev *dev, uint32_t rows);
/* A multi-row rmsnorm (rows 2 to 63, cols % 256 == 0, the path on) also
 * writes its output as int8 blocks where these matmuls read them: *q and
 * *d (0 when not), then cuda_vr_norm_done after its launch. */
int cuda_vr_norm_out(struct baton_dev *dev, uint32_t rows, uint32_t cols, uint64_t *q,
    uint64_t *d);
void cuda_vr_norm_done(struct baton_dev *dev, baton_dptr out, uint32_t rows, uint32_t cols);
/* matmul of 2 to 63 rows on q4_K / q6_K (BATON_CUDA_EXACT=1: not) or,
 * with BATON_CUDA_VR_F32=1, small f32 matrices (the exact bits), arguments checked by
 * cuda_op_matmul; CUDA_TC_FALLBACK when it does not apply. */
int cuda_vr_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows, baton_dptr y,
    int accumulate);
/* Up to three matrices over one x in one launch (q, k and v), each the
 * bits of its own cuda_vr_matmul; CUDA_TC_FALLBACK when any does not
 * suit. */
int cuda_vr_matmuls(struct baton_dev *dev, baton_dptr x, uint32_t k, uint32_t rows,
    const struct baton_matmul_out *m, uint32_t n, int accumulate);

/* Load at open (after cuda_mmvq_load), free at close. */
int cuda_g16_load(struct baton_dev *dev);
void cuda_g16_free(struct baton_dev *dev);
/* matmul at rows == 1 on bf16 / f16 rows (16-byte aligned, k % 8 == 0),
 * arguments checked by cuda_op_matmul; CUDA_TC_FALLBACK when it does not
 * apply or BATON_CUDA_EXACT=1. */
int cuda_g16_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint64_t row_bytes,
    uint32_t n_out, uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate);
/* One output of cuda_g16_matmuls: y (n_out floats) = w . x + b. */
struct cuda_g16_out {
	baton_dptr w, b, y;
	uint32_t w_dtype, b_dtype, n_out;
};
/* Up to 3 one-row matmuls over one x (k floats) in one launch (attention's
 * q, k and v), each output the bits of cuda_g16_matmul's; arguments
 * checked by the caller (each as cuda_op_matmul checks one, outputs apart);
 * CUDA_TC_FALLBACK when any of them does not suit the path. */
int cuda_g16_matmuls(struct baton_dev *dev, baton_dptr x, uint32_t k, uint32_t rows,
    const struct cuda_g16_out *o, uint32_t n, int accumulate);
/* moe_experts_dev at batch 1 on bf16 / f16 experts (top_k <= 32), checked
 * by cuda_moe_experts_dev: x += the experts' weighted sum in two launches;
 * CUDA_TC_FALLBACK when it does not apply. */
int cuda_g16_experts(struct baton_dev *dev, const struct baton_moe_layer *l, baton_dptr table,
    baton_dptr ids, baton_dptr weights);

/* ---- ops_launch.c ---------------------------------------------------- */

/* Loads the forward-pass kernels and launches each once (at open, after
 * cuda_moe_load); cuda_ops_free gives back what they hold (at close). */
int cuda_ops_load(struct baton_dev *dev);
void cuda_ops_free(struct baton_dev *dev);
/* A block of the row kernels (and of attention's part and combine). */
#define OPS_THREADS (32 * BATON_OPS_WARPS)
/* The checks of host/ops.c the dense ops' launchers share: an f32 buffer
 * of n floats at p (non-null, aligned, not wrapping); two f32 buffers
 * overlapping; a refusal (the context's error "op: why", then rc); a
 * weight of rows of `cols` in dtype (computable here, whole blocks; *rb
 * a row's bytes); qk_norm_rope's checks (refused: its code). */
int cuda_f32_buf(baton_dptr p, uint64_t n);
int cuda_overlap(baton_dptr a, uint64_t an, baton_dptr b, uint64_t bn);
int cuda_refuse(struct baton_dev *dev, int rc, const char *op, const char *why);
int cuda_weight_ok(struct baton_dev *dev, const char *op, uint32_t dtype, uint32_t cols,
    uint64_t *rb);
int cuda_qk_nr_check(struct baton_dev *dev, const struct baton_qk_norm_rope *a);
/* Queues host bytes (a, then b 16-byte aligned after it) to the device
 * through the staging ring: *da, *db get their device addresses. */
int cuda_stage_args(struct baton_dev *dev, const void *a, uint64_t an, const void *b,
    uint64_t bn, CUdeviceptr *da, CUdeviceptr *db);
/* The backend slots embed, rmsnorm, matmul, rope, swiglu and add
 * (engine/backend/backend.h). */
int cuda_op_embed(struct baton_dev *dev, baton_dptr table, uint32_t dtype, uint32_t vocab,
    uint32_t cols, const uint32_t *tokens, uint32_t n, baton_dptr out);
int cuda_op_rmsnorm(struct baton_dev *dev, baton_dptr x, baton_dptr out, uint32_t rows,
    uint32_t cols, baton_dptr w, uint32_t w_dtype, float eps);
int cuda_op_matmul(struct baton_dev *dev, baton_dptr w, uint32_t w_dtype, uint32_t n_out,
    uint32_t k, baton_dptr b, uint32_t b_dtype, baton_dptr x, uint32_t rows,
    baton_dptr y, int accumulate);
int cuda_op_matmuls(struct baton_dev *dev, const struct baton_matmuls *mm);
int cuda_op_qk_norm_rope(struct baton_dev *dev, const struct baton_qk_norm_rope *a);
int cuda_op_rope(struct baton_dev *dev, baton_dptr x, uint32_t rows, uint32_t n_heads,
    uint32_t head_dim, const uint32_t *pos, const float *inv_freq, float mscale);
int cuda_op_rmsnorm_matmuls(struct baton_dev *dev, baton_dptr x, baton_dptr w, uint32_t w_dtype,
    float eps, const struct baton_matmuls *mm);
int cuda_op_kv_store(struct baton_dev *dev, const struct baton_kv_store *s);
int cuda_op_swiglu(struct baton_dev *dev, baton_dptr gate, baton_dptr up, baton_dptr out,
    uint64_t n);
int cuda_op_add(struct baton_dev *dev, baton_dptr x, baton_dptr y, baton_dptr gate,
    uint32_t rows, uint32_t cols);

/* ---- attn_split_launch.c: attention ---------------------------------------- */

/* Loads attn_split.cu's kernels and launches each once, makes the rows
 * kernel's counters and the first MiB of the partial results (at open,
 * after cuda_ops_load); cuda_attn_free gives them back (at close). */
int cuda_attn_load(struct baton_dev *dev);
void cuda_attn_free(struct baton_dev *dev);
/* The backend slots attention, attention_segs and qk_attention_segs
 * (engine/backend/backend.h). */
int cuda_op_attention(struct baton_dev *dev, const struct baton_attn *a);
int cuda_op_attention_segs(struct baton_dev *dev, const struct baton_attn_segs *s);
int cuda_op_qk_attention_segs(struct baton_dev *dev, const struct baton_qk_norm_rope *nr,
    const struct baton_attn_segs *s);

/* ---- route_launch.c: routing ------------------------------------------------ */

/* Loads route.cu's kernels and launches each once, makes the fused
 * router's counters (at open, after cuda_ops_load); cuda_route_free gives
 * them and route's pinned logits back (at close). */
int cuda_route_load(struct baton_dev *dev);
void cuda_route_free(struct baton_dev *dev);
/* The backend slot route (engine/backend/backend.h). */
int cuda_op_route(struct baton_dev *dev, baton_dptr logits, uint32_t rows, uint32_t n_experts,
    uint32_t top_k, int rule, uint32_t *ids, float *weights);
/* route_dev (engine/backend/backend.h): route with its results left on the
 * device, for the decode step's MoE block (with cuda_moe_experts_dev). */
int cuda_op_route_dev(struct baton_dev *dev, baton_dptr logits, uint32_t rows,
    uint32_t n_experts, uint32_t top_k, int rule, baton_dptr ids, baton_dptr weights);
/* router_route_dev: the post-attention norm, the router's matmul and
 * route_dev in one launch (baton_ops_router_route) where it applies, else
 * the calls in turn. */
int cuda_op_router_route_dev(struct baton_dev *dev, const struct baton_router_route *a);

#endif
