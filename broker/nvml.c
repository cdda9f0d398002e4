/*
 * nvml.c: device memory through NVML, loaded with dlopen so the broker
 * needs no NVIDIA library to build or start, and holds no CUDA context
 * (NVML reads the driver's accounting; a context would cost hundreds of
 * MiB of the very memory being shared).
 *
 * Only the handful of entry points used are declared here, with the types
 * of nvml.h (stable ABI: the _v2 names exist since driver 325).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"

typedef int nvml_ret;
typedef struct nvml_device_st *nvml_device;
struct nvml_memory {
	unsigned long long total, free, used;
};

/* nvmlProcessInfo_t of nvml.h (the _v3 call's, the _v2 struct) */
struct nvml_proc {
	unsigned int pid;
	unsigned long long used;
	unsigned int gpu_instance, compute_instance;
};

static struct {
	pthread_once_t once;
	pthread_mutex_t mu;
	int ok;
	nvml_ret (*init)(void);
	nvml_ret (*count)(unsigned int *);
	nvml_ret (*by_index)(unsigned int, nvml_device *);
	nvml_ret (*uuid)(nvml_device, char *, unsigned int);
	nvml_ret (*mem)(nvml_device, struct nvml_memory *);
	nvml_ret (*name)(nvml_device, char *, unsigned int); /* optional */
	nvml_ret (*procs)(nvml_device, unsigned int *, struct nvml_proc *); /* optional (driver 510+) */
} nv = { .once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER };

static void load(void)
{
	const char *off = getenv("BATON_NVML");
	if (off && strcmp(off, "0") == 0)
		return;
	void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return;
	*(void **)&nv.init = dlsym(h, "nvmlInit_v2");
	*(void **)&nv.count = dlsym(h, "nvmlDeviceGetCount_v2");
	*(void **)&nv.by_index = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
	*(void **)&nv.uuid = dlsym(h, "nvmlDeviceGetUUID");
	*(void **)&nv.mem = dlsym(h, "nvmlDeviceGetMemoryInfo");
	*(void **)&nv.name = dlsym(h, "nvmlDeviceGetName");
	*(void **)&nv.procs = dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (!nv.init || !nv.count || !nv.by_index || !nv.uuid || !nv.mem || nv.init() != 0) {
		dlclose(h);
		return;
	}
	nv.ok = 1; /* kept loaded for the life of the process */
}

int broker_nvml_init(void)
{
	pthread_once(&nv.once, load);
	return nv.ok ? 0 : BATON_ENODEV;
}

/* The device of uuid ("GPU-..."), its index in NVML's order (nvidia-smi's,
 * PCI bus order); nv.mu held. 0 when found. */
static int by_uuid_locked(const char *uuid, nvml_device *d, unsigned *index)
{
	unsigned int n = 0;
	if (nv.count(&n) != 0)
		return -1;
	for (unsigned int i = 0; i < n; i++) {
		char u[96];
		if (nv.by_index(i, d) == 0 && nv.uuid(*d, u, sizeof u) == 0 && strcmp(u, uuid) == 0) {
			if (index)
				*index = i;
			return 0;
		}
	}
	return -1;
}

int broker_nvml_mem(const char *uuid, uint64_t *free_bytes, uint64_t *total_bytes)
{
	if (broker_nvml_init() != 0 || !uuid || strncmp(uuid, "GPU-", 4) != 0)
		return BATON_ENODEV;
	int rc = BATON_ENODEV;
	nvml_device d;
	struct nvml_memory m;
	pthread_mutex_lock(&nv.mu);
	if (by_uuid_locked(uuid, &d, NULL) == 0) {
		rc = BATON_EDRIVER;
		if (nv.mem(d, &m) == 0) {
			*free_bytes = m.free;
			*total_bytes = m.total;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&nv.mu);
	return rc;
}

int broker_nvml_name(const char *uuid, char *name, size_t len, unsigned *index)
{
	if (broker_nvml_init() != 0 || !uuid || strncmp(uuid, "GPU-", 4) != 0 || !nv.name)
		return BATON_ENODEV;
	int rc = BATON_ENODEV;
	nvml_device d;
	unsigned i;
	char nm[96];
	pthread_mutex_lock(&nv.mu);
	if (by_uuid_locked(uuid, &d, &i) == 0) {
		rc = BATON_EDRIVER;
		if (nv.name(d, nm, sizeof nm) == 0) {
			snprintf(name, len, "%s", nm);
			*index = i;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&nv.mu);
	return rc;
}

int broker_nvml_procs(const char *uuid, struct broker_nvml_proc *out, size_t cap, size_t *n_out)
{
	*n_out = 0;
	if (broker_nvml_init() != 0 || !uuid || strncmp(uuid, "GPU-", 4) != 0 || !nv.procs)
		return BATON_ENODEV;
	int rc = BATON_ENODEV;
	nvml_device d;
	pthread_mutex_lock(&nv.mu);
	if (by_uuid_locked(uuid, &d, NULL) == 0) {
		struct nvml_proc p[256];
		unsigned int k = 256;
		rc = nv.procs(d, &k, p) == 0 ? 0 : BATON_EDRIVER;
		for (unsigned int j = 0; rc == 0 && j < k && *n_out < cap; j++) {
			out[*n_out].pid = (int)p[j].pid;
			/* NVML_VALUE_NOT_AVAILABLE (all ones) without per-process accounting */
			out[*n_out].bytes = p[j].used == ~0ULL ? 0 : (uint64_t)p[j].used;
			(*n_out)++;
		}
	}
	pthread_mutex_unlock(&nv.mu);
	return rc;
}

int broker_nvml_uuid(unsigned index, unsigned *count, char *uuid, size_t len)
{
	if (broker_nvml_init() != 0)
		return BATON_ENODEV;
	unsigned int n = 0;
	int rc = BATON_ENODEV;
	pthread_mutex_lock(&nv.mu);
	if (nv.count(&n) == 0) {
		nvml_device d;
		char u[96];
		if (count)
			*count = n;
		if (index < n && nv.by_index(index, &d) == 0 && nv.uuid(d, u, sizeof u) == 0) {
			snprintf(uuid, len, "%s", u);
			rc = 0;
		}
	}
	pthread_mutex_unlock(&nv.mu);
	return rc;
}
