/*
 * park.c: parking a CUDA process with the driver's checkpoint API
 * (cuCheckpointProcessLock / Checkpoint / Restore / Unlock / GetState,
 * r570 and later): its device memory, context included, goes to host
 * memory and comes back later. Resolved at run time from libcuda.so.1
 * like engine/backend/cuda/driver.c resolves the rest of the driver, so
 * the broker builds and starts without it. The rules that keep a process
 * safe (never resume without a grant; any failure unlocks and leaves it
 * running) sit above the table, where a fake driver tests them.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "broker/broker.h"
#include "broker/park.h"

/* ---- the real driver ----------------------------------------------------------- */

/* the args structs of cuda.h are 64 bytes, zeroed but for lock's first field */
struct args64 {
	unsigned int timeout_ms, reserved0;
	unsigned long long reserved1[7];
};

static struct {
	pthread_once_t once;
	char err[200];
	int (*init)(unsigned);
	int (*get_state)(int, int *);
	int (*lock)(int, struct args64 *);
	int (*checkpoint)(int, struct args64 *);
	int (*restore)(int, struct args64 *);
	int (*unlock)(int, struct args64 *);
	int (*errstr)(int, const char **);
	struct park_driver d;
	bool ok;
} cu = { .once = PTHREAD_ONCE_INIT };

static int c_get_state(void *ctx, int pid, int *state)
{
	(void)ctx;
	return cu.get_state(pid, state);
}

static int c_lock(void *ctx, int pid, unsigned timeout_ms)
{
	(void)ctx;
	struct args64 a = { .timeout_ms = timeout_ms };
	return cu.lock(pid, &a);
}

static int c_checkpoint(void *ctx, int pid)
{
	(void)ctx;
	struct args64 a = { 0 };
	return cu.checkpoint(pid, &a);
}

static int c_restore(void *ctx, int pid)
{
	(void)ctx;
	struct args64 a = { 0 };
	return cu.restore(pid, &a);
}

static int c_unlock(void *ctx, int pid)
{
	(void)ctx;
	struct args64 a = { 0 };
	return cu.unlock(pid, &a);
}

static const char *c_reason(void *ctx, int rc)
{
	(void)ctx;
	const char *s = NULL;
	if (!cu.errstr || cu.errstr(rc, &s) != 0 || !s)
		return "unknown CUDA error";
	return s;
}

static void load(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(cu.err, sizeof cu.err, "no CUDA driver (libcuda.so.1: %s)", dlerror());
		return;
	}
	*(void **)&cu.init = dlsym(h, "cuInit");
	*(void **)&cu.get_state = dlsym(h, "cuCheckpointProcessGetState");
	*(void **)&cu.lock = dlsym(h, "cuCheckpointProcessLock");
	*(void **)&cu.checkpoint = dlsym(h, "cuCheckpointProcessCheckpoint");
	*(void **)&cu.restore = dlsym(h, "cuCheckpointProcessRestore");
	*(void **)&cu.unlock = dlsym(h, "cuCheckpointProcessUnlock");
	*(void **)&cu.errstr = dlsym(h, "cuGetErrorString");
	if (!cu.init || !cu.get_state || !cu.lock || !cu.checkpoint || !cu.restore || !cu.unlock) {
		snprintf(cu.err, sizeof cu.err, "the CUDA driver has no checkpoint API (it came with r570)");
		dlclose(h);
		return;
	}
	/* cuInit makes no context (no device memory): the broker stays without one */
	int rc = cu.init(0);
	if (rc != 0) {
		snprintf(cu.err, sizeof cu.err, "cuInit failed: %s (%d)", c_reason(NULL, rc), rc);
		dlclose(h);
		return;
	}
	cu.d = (struct park_driver){ c_get_state, c_lock, c_checkpoint, c_restore, c_unlock, c_reason, NULL };
	cu.ok = true;
}

const struct park_driver *park_cuda(char *err, size_t len)
{
	pthread_once(&cu.once, load);
	if (!cu.ok) {
		snprintf(err, len, "%s", cu.err);
		return NULL;
	}
	return &cu.d;
}

/* ---- the rules ----------------------------------------------------------------- */

static const char *state_name(int st)
{
	switch (st) {
	case PARK_RUNNING: return "running";
	case PARK_LOCKED: return "locked";
	case PARK_CHECKPOINTED: return "checkpointed";
	case PARK_FAILED: return "failed";
	default: return "unknown";
	}
}

int park_process(const struct park_driver *d, int pid, unsigned lock_timeout_ms, char *why, size_t len)
{
	int st = -1;
	int rc = d->get_state(d->ctx, pid, &st);
	if (rc) {
		snprintf(why, len, "cannot read the CUDA state of process %d: %s (%d)", pid, d->reason(d->ctx, rc), rc);
		return BATON_EDRIVER;
	}
	if (st != PARK_RUNNING) {
		snprintf(why, len, "process %d is %s, not running: not parked", pid, state_name(st));
		return BATON_ESTATE;
	}
	rc = d->lock(d->ctx, pid, lock_timeout_ms);
	if (rc) {
		snprintf(why, len, "lock of process %d refused: %s (%d); left running", pid, d->reason(d->ctx, rc), rc);
		return BATON_EDRIVER;
	}
	rc = d->checkpoint(d->ctx, pid);
	if (rc) {
		int urc = d->unlock(d->ctx, pid);
		snprintf(why, len, "checkpoint of process %d refused: %s (%d); %s", pid, d->reason(d->ctx, rc), rc,
		    urc ? "and its unlock failed too" : "unlocked and left running");
		return BATON_EDRIVER;
	}
	snprintf(why, len, "process %d checkpointed", pid);
	return 0;
}

int park_resume(const struct park_driver *d, int pid, uint64_t granted, uint64_t need, char *why, size_t len)
{
	if (!park_may_resume(granted, need)) {
		snprintf(why, len, "process %d stays parked: it needs %.1f MiB, %.1f MiB were granted", pid,
		    (double)need / BATON_MIB, (double)granted / BATON_MIB);
		return BATON_EDEVMEM;
	}
	int st = -1;
	int rc = d->get_state(d->ctx, pid, &st);
	if (rc) {
		snprintf(why, len, "cannot read the CUDA state of process %d: %s (%d)", pid, d->reason(d->ctx, rc), rc);
		return BATON_EDRIVER;
	}
	if (st != PARK_CHECKPOINTED) {
		snprintf(why, len, "process %d is %s, not checkpointed", pid, state_name(st));
		return BATON_ESTATE;
	}
	rc = d->restore(d->ctx, pid);
	if (rc) {
		snprintf(why, len, "restore of process %d failed: %s (%d); it stays checkpointed", pid,
		    d->reason(d->ctx, rc), rc);
		return BATON_EDRIVER;
	}
	rc = d->unlock(d->ctx, pid);
	if (rc) {
		snprintf(why, len, "process %d restored, its unlock failed: %s (%d)", pid, d->reason(d->ctx, rc), rc);
		return BATON_EDRIVER;
	}
	snprintf(why, len, "process %d restored", pid);
	return 0;
}
