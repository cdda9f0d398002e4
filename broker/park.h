/*
 * park.h: parking a CUDA process (park.c): the CUDA driver's checkpoint
 * API behind a small table, so the broker's decisions are tested with a
 * fake driver on machines without a GPU. Internal to broker/.
 */
#ifndef BATON_BROKER_PARK_H
#define BATON_BROKER_PARK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CUprocessState of cuda.h */
enum { PARK_RUNNING = 0, PARK_LOCKED = 1, PARK_CHECKPOINTED = 2, PARK_FAILED = 3 };

/* Each call returns the driver's CUresult (0: CUDA_SUCCESS); reason()
 * turns one into the driver's own words. */
struct park_driver {
	int (*get_state)(void *ctx, int pid, int *state);
	int (*lock)(void *ctx, int pid, unsigned timeout_ms);
	int (*checkpoint)(void *ctx, int pid);
	int (*restore)(void *ctx, int pid);
	int (*unlock)(void *ctx, int pid);
	const char *(*reason)(void *ctx, int rc);
	void *ctx;
};

/* The CUDA driver's table (libcuda.so.1 through dlopen and dlsym, cuInit
 * once); NULL with why in err when there is no driver or it lacks the
 * checkpoint API (before r570). Thread-safe. */
const struct park_driver *park_cuda(char *err, size_t len);

/* Parks pid: its state must be running; lock (waiting at most
 * lock_timeout_ms for its CUDA calls in flight), checkpoint. On any
 * failure the process is unlocked and left running, and why holds the
 * step and the driver's reason. 0 or BATON_EDRIVER / BATON_ESTATE. */
int park_process(const struct park_driver *d, int pid, unsigned lock_timeout_ms, char *why, size_t len);

/* Resumes pid, but only when the broker granted what it needs: granted
 * bytes >= need (a restore that runs out of device memory can leave the
 * process stuck for good). Restore, unlock. BATON_EDEVMEM (no grant:
 * nothing is called), BATON_ESTATE (not checkpointed), BATON_EDRIVER. */
int park_resume(const struct park_driver *d, int pid, uint64_t granted, uint64_t need, char *why, size_t len);

/* The policy's rule for a resume, alone (tested as such). */
static inline bool park_may_resume(uint64_t granted, uint64_t need)
{
	return need > 0 && granted >= need;
}

#endif
