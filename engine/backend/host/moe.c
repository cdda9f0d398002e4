/*
 * moe.c: the MoE math of the `host` backend (router, top-k, softmax,
 * SwiGLU experts, weighted sum), the reference the other backends are
 * checked against. The formulas and the accumulation order are written in
 * host.h.
 *
 * Parallelism: large layers are split by output rows into parts, run by a
 * small pool of worker threads and the caller. Every output element is
 * computed by exactly one part with the same sequence of operations
 * whatever the partition, so the thread count never changes a bit. One
 * process-wide lock serializes callers and guards the pool and the scratch
 * memory.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena/arena.h"
#include "engine/backend/host/host.h"

#define MAX_THREADS 64u
#define NX_GROUP 8u               /* vectors per baton_dot_rows call */
#define PART_MIN_MACS (1u << 17)  /* below this much work per part, fewer parts */
#define RMS_EPS 1e-6f

/* ---- worker pool ----------------------------------------------------------
 * A job is fn(arg, part, nparts) for parts 0..nparts-1. The caller posts it
 * by publishing one atomic word, `job` = generation << 16 | nparts << 8 |
 * next part, and then claims parts like every worker does: a part is taken
 * by a compare-and-swap of that word, so a worker that wakes late can only
 * take a part of the job it sees, never run a part twice, and reads fn and
 * arg only while its part (so the job) is unfinished. Which thread runs a
 * part changes nothing in the results.
 *
 * Idle workers spin a little on the word (a decode step posts its jobs back
 * to back: a condition variable's wake-up would cost more than the work of
 * a small layer) and then sleep on `go`; the caller likewise spins, then
 * sleeps on `done`, until every part has finished. */

typedef void (*part_fn)(void *arg, unsigned part, unsigned nparts);

#define SPIN_ROUNDS 4000u /* about 50-200 us of pause instructions */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static pthread_mutex_t g_call = PTHREAD_MUTEX_INITIALIZER; /* one call at a time */

static struct {
	atomic_ullong job;       /* gen << 16 | nparts << 8 | next part */
	atomic_uint pending;     /* parts of the current job not yet finished */
	part_fn fn;              /* written before job is published */
	void *arg;
	pthread_mutex_t mu;      /* guards the sleeping counts and the condvars */
	pthread_cond_t go, done;
	unsigned sleeping;       /* workers waiting on go */
	int caller_sleeping;     /* the caller waits on done */
	pid_t pid;               /* process the workers belong to (fork leaves none) */
	unsigned nworkers;       /* started, besides the caller (under g_call) */
} g_pool = {
	.mu = PTHREAD_MUTEX_INITIALIZER,
	.go = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
};

static int g_threads;        /* 0: not decided yet (under g_call) */
static unsigned char *g_ws;  /* scratch, grown as needed, under g_call */
static size_t g_ws_cap;

static inline unsigned long long job_gen(unsigned long long j)
{
	return j >> 16;
}

/* Runs unclaimed parts of job generation `gen` until none is left. */
static void claim_parts(unsigned long long gen)
{
	unsigned long long j = atomic_load_explicit(&g_pool.job, memory_order_acquire);

	while (job_gen(j) == gen) {
		unsigned next = j & 0xffu, n = (j >> 8) & 0xffu;
		if (next >= n)
			return;
		if (!atomic_compare_exchange_weak_explicit(&g_pool.job, &j, j + 1,
		    memory_order_acq_rel, memory_order_acquire))
			continue; /* j now holds the word as it is */
		g_pool.fn(g_pool.arg, next, n);
		if (atomic_fetch_sub_explicit(&g_pool.pending, 1, memory_order_acq_rel) == 1) {
			pthread_mutex_lock(&g_pool.mu);
			if (g_pool.caller_sleeping)
				pthread_cond_signal(&g_pool.done);
			pthread_mutex_unlock(&g_pool.mu);
		}
		j = atomic_load_explicit(&g_pool.job, memory_order_acquire);
	}
}

static void *worker_main(void *p)
{
	unsigned long long seen = (unsigned long long)(uintptr_t)p, gen;

	for (;;) {
		unsigned i = 0;
		while ((gen = job_gen(atomic_load_explicit(&g_pool.job, memory_order_acquire))) == seen &&
		    i++ < SPIN_ROUNDS)
			cpu_relax();
		if (gen == seen) {
			pthread_mutex_lock(&g_pool.mu);
			g_pool.sleeping++;
			while ((gen = job_gen(atomic_load_explicit(&g_pool.job,
			    memory_order_acquire))) == seen)
				pthread_cond_wait(&g_pool.go, &g_pool.mu);
			g_pool.sleeping--;
			pthread_mutex_unlock(&g_pool.mu);
		}
		seen = gen;
		claim_parts(gen);
	}
	return NULL;
}

/* Starts workers until `want` exist (or creation fails); returns how many
 * there are. Caller holds g_call. */
static unsigned pool_grow(unsigned want)
{
	if (g_pool.pid != getpid()) {
		/* First use, or a forked child: no worker of ours runs here. */
		pthread_mutex_init(&g_pool.mu, NULL);
		pthread_cond_init(&g_pool.go, NULL);
		pthread_cond_init(&g_pool.done, NULL);
		g_pool.sleeping = 0;
		g_pool.caller_sleeping = 0;
		g_pool.nworkers = 0;
		g_pool.pid = getpid();
	}
	while (g_pool.nworkers < want) {
		unsigned long long gen = job_gen(atomic_load_explicit(&g_pool.job, memory_order_relaxed));
		pthread_attr_t attr;
		pthread_t th;
		int rc;

		if (pthread_attr_init(&attr) != 0)
			break;
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = pthread_create(&th, &attr, worker_main, (void *)(uintptr_t)gen);
		pthread_attr_destroy(&attr);
		if (rc != 0)
			break;
		g_pool.nworkers++;
	}
	return g_pool.nworkers;
}

/* Runs fn(arg, part, nparts) for every part and returns when all are done.
 * Fewer workers than parts (or none: creation failed) only means that the
 * caller runs more parts itself. Caller holds g_call. */
static void pool_run(part_fn fn, void *arg, unsigned nparts)
{
	if (nparts > 1)
		pool_grow(nparts - 1);
	if (nparts <= 1 || g_pool.nworkers == 0) {
		for (unsigned p = 0; p < nparts; p++)
			fn(arg, p, nparts);
		return;
	}
	unsigned long long gen = job_gen(atomic_load_explicit(&g_pool.job, memory_order_relaxed)) + 1;
	g_pool.fn = fn;
	g_pool.arg = arg;
	atomic_store_explicit(&g_pool.pending, nparts, memory_order_relaxed);
	atomic_store_explicit(&g_pool.job, gen << 16 | (unsigned long long)nparts << 8,
	    memory_order_release);
	pthread_mutex_lock(&g_pool.mu);
	if (g_pool.sleeping)
		pthread_cond_broadcast(&g_pool.go);
	pthread_mutex_unlock(&g_pool.mu);

	claim_parts(gen);

	for (unsigned i = 0; i < SPIN_ROUNDS; i++) {
		if (atomic_load_explicit(&g_pool.pending, memory_order_acquire) == 0)
			return;
		cpu_relax();
	}
	pthread_mutex_lock(&g_pool.mu);
	g_pool.caller_sleeping = 1;
	while (atomic_load_explicit(&g_pool.pending, memory_order_acquire) != 0)
		pthread_cond_wait(&g_pool.done, &g_pool.mu);
	g_pool.caller_sleeping = 0;
	pthread_mutex_unlock(&g_pool.mu);
}

static int default_threads(void)
{
	const char *env = getenv("BATON_HOST_THREADS");
	long n = 0;

	if (env && *env) {
		uint64_t v;
		n = baton_parse_u64(env, 1, 4096, &v) ? 0 : (long)v;
	}
	if (n == 0) {
		cpu_set_t set;
		if (sched_getaffinity(0, sizeof set, &set) == 0)
			n = CPU_COUNT(&set);
	}
	if (n < 1)
		n = sysconf(_SC_NPROCESSORS_ONLN);
	if (n < 1)
		n = 1;
	return n > (long)MAX_THREADS ? (int)MAX_THREADS : (int)n;
}

int host_moe_set_threads(int n)
{
	pthread_mutex_lock(&g_call);
	if (n <= 0)
		g_threads = default_threads();
	else
		g_threads = n > (int)MAX_THREADS ? (int)MAX_THREADS : n;
	n = g_threads;
	pthread_mutex_unlock(&g_call);
	return n;
}

/* Parts for `rows` output rows costing `macs` in all. Caller holds g_call. */
static unsigned choose_parts(uint64_t macs, uint32_t rows)
{
	uint64_t n;

	if (g_threads == 0)
		g_threads = default_threads();
	n = (uint64_t)g_threads;
	if (n > macs / PART_MIN_MACS)
		n = macs / PART_MIN_MACS;
	if (n > rows)
		n = rows;
	return n < 1 ? 1 : (unsigned)n;
}

static void part_range(uint32_t rows, unsigned part, unsigned nparts,
    uint32_t *lo, uint32_t *hi)
{
	*lo = (uint32_t)((uint64_t)rows * part / nparts);
	*hi = (uint32_t)((uint64_t)rows * (part + 1) / nparts);
}

/* Scratch of at least `bytes`, 64-byte aligned. Caller holds g_call. */
static void *scratch(size_t bytes)
{
	if (bytes > g_ws_cap) {
		size_t cap = bytes + bytes / 4;
		void *p = NULL;
		if (posix_memalign(&p, 64, cap) != 0)
			return NULL;
		free(g_ws);
		g_ws = p;
		g_ws_cap = cap;
	}
	return g_ws;
}

/* Scratch layout with overflow checks: place(&end, n, m, elem) reserves
 * n * m * elem bytes at the 64-aligned end of what is placed so far and
 * returns their offset; SIZE_MAX in *end once anything overflowed. */
static size_t place(size_t *end, size_t n, size_t m, size_t elem)
{
	size_t off = *end, bytes;

	if (off > SIZE_MAX - 63 || (n && m > SIZE_MAX / n) ||
	    (n && m && elem > SIZE_MAX / (n * m))) {
		*end = SIZE_MAX;
		return 0;
	}
	off = (off + 63) & ~(size_t)63;
	bytes = n * m * elem;
	*end = bytes > SIZE_MAX - off ? SIZE_MAX : off + bytes;
	return off;
}

/* ---- argument checks ------------------------------------------------------ */

static inline const void *hptr(baton_dptr p)
{
	return (const void *)(uintptr_t)p;
}

/* A weight tensor the call reads: computable dtype, rows of cols fit it. */
static int check_weights(uint32_t dtype, uint32_t cols)
{
	if (!host_can_compute((int)dtype))
		return BATON_EUNSUPPORTED;
	return baton_compute_row_bytes((int)dtype, cols) ? 0 : BATON_EINVAL;
}

static int check_layer(const struct baton_moe_layer *l)
{
	if (!l || !l->batch || !l->d_model || !l->d_ff || !l->n_experts || !l->top_k)
		return BATON_EINVAL;
	if (l->top_k > l->n_experts)
		return BATON_EINVAL;
	if (!l->x || !l->xn || (l->x & 3) || (l->xn & 3))
		return BATON_EINVAL;
	uint64_t bytes = (uint64_t)l->batch * l->d_model * sizeof(float);
	if (bytes / l->batch / sizeof(float) != l->d_model ||
	    l->x > UINTPTR_MAX - bytes || l->xn > UINTPTR_MAX - bytes)
		return BATON_EINVAL;
	if (l->x < l->xn + bytes && l->xn < l->x + bytes)
		return BATON_EINVAL; /* x and xn overlap */
	return 0;
}

/* ---- route ---------------------------------------------------------------- */

struct route_job {
	const struct baton_moe_layer *l;
	const float *xn;
	float *logits; /* [batch][n_experts] */
	uint64_t row_bytes;
};

/* logits for router rows [lo, hi) of every token. */
static void route_part(void *arg, unsigned part, unsigned nparts)
{
	const struct route_job *j = arg;
	const struct baton_moe_layer *l = j->l;
	const uint8_t *router = hptr(l->router);
	uint32_t lo, hi;

	part_range(l->n_experts, part, nparts, &lo, &hi);
	for (uint32_t e = lo; e < hi; e++) {
		const uint8_t *row = router + (uint64_t)e * j->row_bytes;
		for (uint32_t t0 = 0; t0 < l->batch; t0 += NX_GROUP) {
			uint32_t nv = l->batch - t0 < NX_GROUP ? l->batch - t0 : NX_GROUP;
			const float *xs[NX_GROUP];
			float out[NX_GROUP];
			for (uint32_t v = 0; v < nv; v++)
				xs[v] = j->xn + (size_t)(t0 + v) * l->d_model;
			baton_dot_rows((int)l->router_dtype, row, l->d_model, xs, nv, out);
			for (uint32_t v = 0; v < nv; v++)
				j->logits[(size_t)(t0 + v) * l->n_experts + e] = out[v];
		}
	}
}

/* The order key of a logit: NaN ranks as -inf. */
static inline float rank_key(float v)
{
	return isnan(v) ? -INFINITY : v;
}

static void top_k_softmax(const float *logit, uint32_t n, uint32_t k,
    unsigned char *taken, uint32_t *ids, float *weights)
{
	memset(taken, 0, n);
	for (uint32_t r = 0; r < k; r++) {
		uint32_t best = UINT32_MAX;
		float best_key = 0;
		for (uint32_t e = 0; e < n; e++) {
			if (taken[e])
				continue;
			float key = rank_key(logit[e]);
			if (best == UINT32_MAX || key > best_key) {
				best = e;
				best_key = key;
			}
		}
		taken[best] = 1;
		ids[r] = best;
	}
	float max = logit[ids[0]], sum = 0;
	for (uint32_t r = 0; r < k; r++) {
		weights[r] = expf(logit[ids[r]] - max);
		sum += weights[r];
	}
	for (uint32_t r = 0; r < k; r++)
		weights[r] /= sum;
}

int host_moe_route(struct baton_dev *dev, const struct baton_moe_layer *l,
    uint32_t *ids, float *weights)
{
	int err;

	(void)dev;
	if ((err = check_layer(l)) != 0)
		return err;
	if (!ids || !weights || !l->router)
		return BATON_EINVAL;
	if ((err = check_weights(l->router_dtype, l->d_model)) != 0)
		return err;
	if (l->norm && (err = check_weights(l->norm_dtype, l->d_model)) != 0)
		return err;

	const uint32_t B = l->batch, D = l->d_model, E = l->n_experts, K = l->top_k;
	size_t total = 0;
	size_t off_norm = place(&total, D, 1, sizeof(float));
	size_t off_logits = place(&total, B, E, sizeof(float));
	size_t off_taken = place(&total, E, 1, 1);
	if (total == SIZE_MAX)
		return BATON_EINVAL; /* too large to be a layer */

	pthread_mutex_lock(&g_call);
	unsigned char *ws = scratch(total);
	if (!ws) {
		pthread_mutex_unlock(&g_call);
		return BATON_ENOMEM;
	}
	float *nw = (float *)(void *)(ws + off_norm);
	float *logits = (float *)(void *)(ws + off_logits);
	unsigned char *taken = ws + off_taken;
	const float *x = hptr(l->x);
	float *xn = (float *)(uintptr_t)l->xn;

	if (l->norm)
		baton_dequant_row((int)l->norm_dtype, hptr(l->norm), nw, D);
	for (uint32_t t = 0; t < B; t++) {
		const float *xt = x + (size_t)t * D;
		float *xnt = xn + (size_t)t * D;
		float ss;
		baton_dot_row(BATON_DT_F32, xt, xt, D, &ss);
		float s = 1.0f / sqrtf(ss / (float)D + RMS_EPS);
		if (l->norm)
			for (uint32_t i = 0; i < D; i++)
				xnt[i] = xt[i] * s * nw[i];
		else
			for (uint32_t i = 0; i < D; i++)
				xnt[i] = xt[i] * s;
	}

	struct route_job job = {
		.l = l,
		.xn = xn,
		.logits = logits,
		.row_bytes = baton_compute_row_bytes((int)l->router_dtype, D),
	};
	pool_run(route_part, &job, choose_parts((uint64_t)B * E * D, E));

	for (uint32_t t = 0; t < B; t++)
		top_k_softmax(logits + (size_t)t * E, E, K, taken,
		    ids + (size_t)t * K, weights + (size_t)t * K);
	pthread_mutex_unlock(&g_call);
	return 0;
}

/* ---- experts -------------------------------------------------------------- */

struct pair_ref {
	baton_dptr blob;
	uint32_t pair; /* t * top_k + k */
};

static int pair_cmp(const void *a, const void *b)
{
	const struct pair_ref *x = a, *y = b;
	if (x->blob != y->blob)
		return x->blob < y->blob ? -1 : 1;
	return x->pair < y->pair ? -1 : x->pair > y->pair;
}

struct experts_job {
	const struct baton_moe_layer *l;
	const baton_dptr *blobs;
	const float *weights;
	const uint32_t *order;  /* pairs, grouped by blob */
	const uint32_t *gstart; /* group g is order[gstart[g] .. gstart[g+1]) */
	uint32_t ngroups;
	const float *xn;
	float *x;
	float *h;   /* [pairs][d_ff] */
	float *out; /* [pairs][d_model] */
	uint64_t gate_rb, up_rb, down_rb;
};

static inline float silu(float g)
{
	return g / (1.0f + expf(-g));
}

/* h for rows [lo, hi) of d_ff, every pair. */
static void gate_up_part(void *arg, unsigned part, unsigned nparts)
{
	const struct experts_job *j = arg;
	const struct baton_moe_layer *l = j->l;
	uint32_t lo, hi;

	part_range(l->d_ff, part, nparts, &lo, &hi);
	for (uint32_t g = 0; g < j->ngroups; g++) {
		const uint32_t *pairs = j->order + j->gstart[g];
		uint32_t np = j->gstart[g + 1] - j->gstart[g];
		const uint8_t *blob = hptr(j->blobs[pairs[0]]);
		const uint8_t *gate = blob + l->gate_off, *up = blob + l->up_off;

		for (uint32_t r = lo; r < hi; r++) {
			const uint8_t *grow = gate + (uint64_t)r * j->gate_rb;
			const uint8_t *urow = up + (uint64_t)r * j->up_rb;
			for (uint32_t p0 = 0; p0 < np; p0 += NX_GROUP) {
				uint32_t nv = np - p0 < NX_GROUP ? np - p0 : NX_GROUP;
				const float *xs[NX_GROUP];
				float gv[NX_GROUP], uv[NX_GROUP];
				for (uint32_t v = 0; v < nv; v++)
					xs[v] = j->xn + (size_t)(pairs[p0 + v] / l->top_k) * l->d_model;
				baton_dot_rows((int)l->gate_dtype, grow, l->d_model, xs, nv, gv);
				baton_dot_rows((int)l->up_dtype, urow, l->d_model, xs, nv, uv);
				for (uint32_t v = 0; v < nv; v++)
					j->h[(size_t)pairs[p0 + v] * l->d_ff + r] = silu(gv[v]) * uv[v];
			}
		}
	}
}

/* out for rows [lo, hi) of d_model, every pair; then x for those rows. */
static void down_part(void *arg, unsigned part, unsigned nparts)
{
	const struct experts_job *j = arg;
	const struct baton_moe_layer *l = j->l;
	const uint32_t D = l->d_model, F = l->d_ff, K = l->top_k;
	uint32_t lo, hi;

	part_range(D, part, nparts, &lo, &hi);
	for (uint32_t g = 0; g < j->ngroups; g++) {
		const uint32_t *pairs = j->order + j->gstart[g];
		uint32_t np = j->gstart[g + 1] - j->gstart[g];
		const uint8_t *down = (const uint8_t *)hptr(j->blobs[pairs[0]]) + l->down_off;

		for (uint32_t r = lo; r < hi; r++) {
			const uint8_t *row = down + (uint64_t)r * j->down_rb;
			for (uint32_t p0 = 0; p0 < np; p0 += NX_GROUP) {
				uint32_t nv = np - p0 < NX_GROUP ? np - p0 : NX_GROUP;
				const float *xs[NX_GROUP];
				float ov[NX_GROUP];
				for (uint32_t v = 0; v < nv; v++)
					xs[v] = j->h + (size_t)pairs[p0 + v] * F;
				baton_dot_rows((int)l->down_dtype, row, F, xs, nv, ov);
				for (uint32_t v = 0; v < nv; v++)
					j->out[(size_t)pairs[p0 + v] * D + r] = ov[v];
			}
		}
	}
	for (uint32_t t = 0; t < l->batch; t++) {
		float *xt = j->x + (size_t)t * D;
		for (uint32_t k = 0; k < K; k++) {
			float w = j->weights[(size_t)t * K + k];
			const float *o = j->out + ((size_t)t * K + k) * D;
			for (uint32_t r = lo; r < hi; r++)
				xt[r] += w * o[r];
		}
	}
}

int host_moe_experts(struct baton_dev *dev, const struct baton_moe_layer *l,
    const baton_dptr *blobs, const float *weights)
{
	int err;

	(void)dev;
	if ((err = check_layer(l)) != 0)
		return err;
	if (!blobs || !weights)
		return BATON_EINVAL;
	if ((err = check_weights(l->gate_dtype, l->d_model)) != 0 ||
	    (err = check_weights(l->up_dtype, l->d_model)) != 0 ||
	    (err = check_weights(l->down_dtype, l->d_ff)) != 0)
		return err;

	const uint32_t B = l->batch, D = l->d_model, F = l->d_ff, K = l->top_k;
	const size_t P = (size_t)B * K;
	for (size_t p = 0; p < P; p++)
		if (!blobs[p])
			return BATON_EINVAL;

	size_t total = 0;
	size_t off_h = place(&total, P, F, sizeof(float));
	size_t off_out = place(&total, P, D, sizeof(float));
	size_t off_refs = place(&total, P, 1, sizeof(struct pair_ref));
	size_t off_order = place(&total, P, 1, sizeof(uint32_t));
	size_t off_gstart = place(&total, P + 1, 1, sizeof(uint32_t));
	if (total == SIZE_MAX || P > UINT32_MAX)
		return BATON_EINVAL; /* too large to be a layer */

	pthread_mutex_lock(&g_call);
	unsigned char *ws = scratch(total);
	if (!ws) {
		pthread_mutex_unlock(&g_call);
		return BATON_ENOMEM;
	}
	struct pair_ref *refs = (struct pair_ref *)(void *)(ws + off_refs);
	uint32_t *order = (uint32_t *)(void *)(ws + off_order);
	uint32_t *gstart = (uint32_t *)(void *)(ws + off_gstart);

	/* Group the (token, rank) pairs by expert blob: each group's weights
	 * are read once for all its tokens. */
	for (size_t p = 0; p < P; p++)
		refs[p] = (struct pair_ref){ blobs[p], (uint32_t)p };
	qsort(refs, P, sizeof refs[0], pair_cmp);
	uint32_t ng = 0;
	for (size_t p = 0; p < P; p++) {
		if (p == 0 || refs[p].blob != refs[p - 1].blob)
			gstart[ng++] = (uint32_t)p;
		order[p] = refs[p].pair;
	}
	gstart[ng] = (uint32_t)P;

	struct experts_job job = {
		.l = l,
		.blobs = blobs,
		.weights = weights,
		.order = order,
		.gstart = gstart,
		.ngroups = ng,
		.xn = hptr(l->xn),
		.x = (float *)(uintptr_t)l->x,
		.h = (float *)(void *)(ws + off_h),
		.out = (float *)(void *)(ws + off_out),
		.gate_rb = baton_compute_row_bytes((int)l->gate_dtype, D),
		.up_rb = baton_compute_row_bytes((int)l->up_dtype, D),
		.down_rb = baton_compute_row_bytes((int)l->down_dtype, F),
	};
	pool_run(gate_up_part, &job, choose_parts((uint64_t)ng * 2 * F * D, F));
	pool_run(down_part, &job, choose_parts((uint64_t)ng * D * F, D));
	pthread_mutex_unlock(&g_call);
	return 0;
}

/* ---- for the dense ops of the forward pass (ops.c) ------------------ */

void host_parallel(void (*fn)(void *arg, unsigned part, unsigned nparts), void *arg,
    uint64_t macs, uint32_t rows)
{
	pthread_mutex_lock(&g_call);
	pool_run(fn, arg, choose_parts(macs, rows));
	pthread_mutex_unlock(&g_call);
}

/* The host's "device" is host memory: the table and ids are read in place
 * and the blobs handed to host_moe_experts. */
int host_moe_experts_dev(struct baton_dev *dev, const struct baton_moe_layer *l,
    baton_dptr table, baton_dptr ids, baton_dptr weights)
{
	if (!l || !table || !ids || !weights || !l->batch || !l->top_k || !l->n_experts)
		return BATON_EINVAL;
	const uint64_t n = (uint64_t)l->batch * l->top_k;
	const uint64_t *tab = (const uint64_t *)(uintptr_t)table;
	const uint32_t *id = (const uint32_t *)(uintptr_t)ids;
	baton_dptr *blobs = malloc(n * sizeof *blobs);
	if (!blobs)
		return BATON_ENOMEM;
	int err = 0;
	for (uint64_t p = 0; p < n && !err; p++) {
		if (id[p] >= l->n_experts)
			err = BATON_ERANGE;
		else
			blobs[p] = tab[id[p]];
	}
	if (!err)
		err = host_moe_experts(dev, l, blobs, (const float *)(uintptr_t)weights);
	free(blobs);
	return err;
}
