/*
 * backend.h: the device interface of the engine. A backend is a const table
 * of function pointers plus a context (struct baton_dev), as ggml and SQLite
 * do. Two backends: `host` (CPU; always built, runs everywhere, same VMM
 * semantics) and `cuda` (driver VMM API, loaded with dlopen at run time).
 *
 * Device addresses are plain integers (baton_dptr): a CUdeviceptr on cuda, a
 * host virtual address on host. Slots marked optional may be NULL; callers
 * reach them through the backend_* wrappers below, which check once. Functions return 0 or a baton_err code and never abort.
 *
 * Threading: a context is used by one thread at a time (the engine's serve
 * loop), except mem_info, which any thread may call.
 */
#ifndef BATON_ENGINE_BACKEND_H
#define BATON_ENGINE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "proto/err.h"

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
	/* 1 when moe_* can compute weights of this dtype. */
	int (*can_compute)(int dtype);
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
int backend_copy_d2d(const struct baton_backend *be, struct baton_dev *dev, baton_dptr dst,
    baton_dptr src, uint64_t bytes);

/* Finds a backend by name: "host", "cuda", or "auto" (cuda when a GPU and
 * its driver are present, else host). BATON_ENODEV with a message naming
 * why when "cuda" is asked for and cannot be used; BATON_EINVAL for an
 * unknown name. */
int backend_find(const char *name, const struct baton_backend **out, char *errbuf, size_t errlen);

#endif
