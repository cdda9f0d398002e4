/*
 * driver.c: dlopen loader of the CUDA driver API (see driver.h).
 */
#include "engine/backend/cuda/driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto.h"

/* cuGetProcAddress_v2 (CUDA 12.0+). */
typedef CUresult (*get_proc_fn)(const char *symbol, void **pfn, int cuda_version,
    cuuint64_t flags, CUdriverProcAddressQueryResult *status);

static struct cuda_driver g_drv;
static int g_err = BATON_EINTERNAL;
static char g_msg[256] = "cuda driver not loaded";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The base name ("cuMemAlloc") of an export name ("cuMemAlloc_v2"), which
 * is what cuGetProcAddress wants: it picks the version from cudaVersion. */
static void base_name(const char *export, char *buf, size_t len)
{
	snprintf(buf, len, "%s", export);
	char *v = strstr(buf, "_v");
	if (v && v[2] >= '0' && v[2] <= '9')
		*v = '\0';
}

static int load_once_inner(void)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(g_msg, sizeof g_msg,
		    "libcuda.so.1 not found: no NVIDIA driver on this machine");
		return BATON_ENODEV;
	}
	get_proc_fn gpa = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
	char name[96];
	void *p;
#define BATON_CUDA_LOAD(ret, member, export, params)                            \
	p = NULL;                                                              \
	if (gpa) {                                                             \
		CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS; \
		base_name(export, name, sizeof name);                          \
		if (gpa(name, &p, BATON_CUDA_ABI_VERSION,                      \
		        CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS ||   \
		    st != CU_GET_PROC_ADDRESS_SUCCESS)                         \
			p = NULL;                                              \
	}                                                                      \
	if (!p)                                                                \
		p = dlsym(lib, export);                                        \
	if (!p) {                                                              \
		snprintf(g_msg, sizeof g_msg, "libcuda.so.1 has no %s: driver too old " \
		    "(CUDA 12.0 or newer needed)", export);                    \
		return BATON_ENODEV;                                           \
	}                                                                      \
	memcpy(&g_drv.member, &p, sizeof p);
	BATON_CUDA_DRIVER_FUNCS(BATON_CUDA_LOAD)
#undef BATON_CUDA_LOAD
	/* The library stays loaded: function pointers into it live on. */
	CUresult r = g_drv.Init(0);
	if (r != CUDA_SUCCESS) {
		const char *s = NULL;
		if (g_drv.GetErrorString(r, &s) != CUDA_SUCCESS || !s)
			s = "unknown error";
		snprintf(g_msg, sizeof g_msg, "cuInit failed: %s", s);
		return BATON_ENODEV;
	}
	if (g_drv.DriverGetVersion(&g_drv.version) != CUDA_SUCCESS)
		g_drv.version = 0;
	g_msg[0] = '\0';
	return 0;
}

static void load_once(void)
{
	g_err = load_once_inner();
}

int cuda_driver_load(const struct cuda_driver **out, char *errbuf, size_t errlen)
{
	pthread_once(&g_once, load_once);
	if (g_err) {
		if (errbuf && errlen)
			snprintf(errbuf, errlen, "%s", g_msg);
		*out = NULL;
		return g_err;
	}
	*out = &g_drv;
	return 0;
}

void cuda_driver_errstr(const struct cuda_driver *d, CUresult r, char *buf, size_t len)
{
	const char *name = NULL, *s = NULL;
	if (d && d->GetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	if (d && d->GetErrorString(r, &s) != CUDA_SUCCESS)
		s = NULL;
	if (name && s)
		snprintf(buf, len, "%s (%s)", name, s);
	else
		snprintf(buf, len, "CUDA error %d", (int)r);
}
