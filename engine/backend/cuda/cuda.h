/*
 * cuda.h: the door of engine/backend/cuda/, the `cuda` backend (built only
 * with CUDA=1, where BATON_HAVE_CUDA is defined). Other folders include
 * this header only; driver.h, moe.h, ops.h and cuda_int.h are internal to
 * cuda/ (cuda_int.h lists its files bottom to top).
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_H
#define BATON_ENGINE_BACKEND_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "engine/backend/backend.h"

/* The `cuda` backend: NVIDIA GPUs through the driver API (VMM for the
 * expert cache), libcuda.so.1 loaded with dlopen at run time.
 *
 * Threading: as backend.h says, one thread drives a context; every entry
 * point makes the device's primary context current on the calling thread
 * first (cuCtxSetCurrent is cheap), so that thread may change over time
 * and mem_info may be called from any thread. */
extern const struct baton_backend baton_backend_cuda;

/* 0 when libcuda.so.1 loads, cuInit succeeds and there is at least one
 * device; else BATON_ENODEV with a sentence in errbuf (may be NULL):
 * "libcuda.so.1 not found: no NVIDIA driver on this machine",
 * "cuInit failed: <reason>", "no CUDA device". Thread-safe. A process that
 * forks children which use CUDA should not call it before forking. */
int cuda_backend_probe(char *errbuf, size_t len);

/* The last driver error of this context as a sentence ("cuMemCreate of
 * 268435456 bytes: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"), or "". */
const char *cuda_backend_last_error(struct baton_dev *dev);

/* One line about the device: name, driver version, granularity, whether
 * read-only host registration is supported. */
void cuda_backend_describe(struct baton_dev *dev, char *buf, size_t len);

/* Test hook: host_register pins in pieces of at most this many bytes
 * (default 4 GiB; rounded down to the page size; 0 restores the default). */
void cuda_backend_set_register_piece(struct baton_dev *dev, uint64_t bytes);

#endif
