/*
 * driver.h: the CUDA driver API, loaded at run time (internal to
 * engine/backend/cuda/; built only with CUDA=1).
 *
 * No Baton binary links libcuda.so.1 or libcudart: cuda_driver_load()
 * dlopens libcuda.so.1, takes cuGetProcAddress_v2 with dlsym and every other
 * entry point through it, asking for the ABI of CUDA 12.0 (so a 12.x or 13.x
 * driver gives the same signatures as the pointer types below). A driver
 * older than 12.0 has no cuGetProcAddress_v2; then each entry point is taken
 * with dlsym by its versioned export name (cuMemAlloc_v2, ...).
 *
 * Only cuda.h's types are used, never its functions (its macros rename
 * cuMemAlloc to cuMemAlloc_v2 and so on, which is why the members below
 * carry no "cu" prefix).
 */
#ifndef BATON_ENGINE_CUDA_DRIVER_H
#define BATON_ENGINE_CUDA_DRIVER_H

#include <stddef.h>

#include <cuda.h>

/* The driver ABI asked for through cuGetProcAddress. */
#define BATON_CUDA_ABI_VERSION 12000

/* X(return, member, export name for the dlsym fallback, (parameters)) */
#define BATON_CUDA_DRIVER_FUNCS(X)                                              \
	X(CUresult, GetErrorName, "cuGetErrorName", (CUresult, const char **))      \
	X(CUresult, GetErrorString, "cuGetErrorString", (CUresult, const char **))  \
	X(CUresult, Init, "cuInit", (unsigned int))                                 \
	X(CUresult, DriverGetVersion, "cuDriverGetVersion", (int *))                \
	X(CUresult, DeviceGetCount, "cuDeviceGetCount", (int *))                    \
	X(CUresult, DeviceGet, "cuDeviceGet", (CUdevice *, int))                    \
	X(CUresult, DeviceGetName, "cuDeviceGetName", (char *, int, CUdevice))      \
	X(CUresult, DeviceGetAttribute, "cuDeviceGetAttribute",                     \
	    (int *, CUdevice_attribute, CUdevice))                                  \
	X(CUresult, DeviceGetUuid, "cuDeviceGetUuid_v2", (CUuuid *, CUdevice))      \
	X(CUresult, DeviceCanAccessPeer, "cuDeviceCanAccessPeer",                   \
	    (int *, CUdevice, CUdevice))                                            \
	X(CUresult, DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain",             \
	    (CUcontext *, CUdevice))                                                \
	X(CUresult, DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2",        \
	    (CUdevice))                                                             \
	X(CUresult, CtxSetCurrent, "cuCtxSetCurrent", (CUcontext))                  \
	X(CUresult, StreamCreate, "cuStreamCreate", (CUstream *, unsigned int))     \
	X(CUresult, StreamDestroy, "cuStreamDestroy_v2", (CUstream))                \
	X(CUresult, StreamSynchronize, "cuStreamSynchronize", (CUstream))           \
	X(CUresult, EventCreate, "cuEventCreate", (CUevent *, unsigned int))        \
	X(CUresult, EventDestroy, "cuEventDestroy_v2", (CUevent))                   \
	X(CUresult, EventRecord, "cuEventRecord", (CUevent, CUstream))              \
	X(CUresult, EventSynchronize, "cuEventSynchronize", (CUevent))              \
	X(CUresult, EventElapsedTime, "cuEventElapsedTime", (float *, CUevent, CUevent)) \
	X(CUresult, MemGetInfo, "cuMemGetInfo_v2", (size_t *, size_t *))            \
	X(CUresult, MemAlloc, "cuMemAlloc_v2", (CUdeviceptr *, size_t))             \
	X(CUresult, MemFree, "cuMemFree_v2", (CUdeviceptr))                         \
	X(CUresult, MemHostAlloc, "cuMemHostAlloc", (void **, size_t, unsigned int)) \
	X(CUresult, MemFreeHost, "cuMemFreeHost", (void *))                         \
	X(CUresult, MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2",        \
	    (CUdeviceptr *, void *, unsigned int))                                  \
	X(CUresult, MemHostRegister, "cuMemHostRegister_v2",                        \
	    (void *, size_t, unsigned int))                                         \
	X(CUresult, MemHostUnregister, "cuMemHostUnregister", (void *))             \
	X(CUresult, MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                        \
	    (CUdeviceptr, const void *, size_t, CUstream))                          \
	X(CUresult, MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                        \
	    (void *, CUdeviceptr, size_t, CUstream))                                \
	X(CUresult, MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                        \
	    (CUdeviceptr, CUdeviceptr, size_t, CUstream))                           \
	X(CUresult, MemsetD32Async, "cuMemsetD32Async",                              \
	    (CUdeviceptr, unsigned int, size_t, CUstream))                          \
	X(CUresult, MemAddressReserve, "cuMemAddressReserve",                       \
	    (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))       \
	X(CUresult, MemAddressFree, "cuMemAddressFree", (CUdeviceptr, size_t))      \
	X(CUresult, MemCreate, "cuMemCreate",                                       \
	    (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,   \
	        unsigned long long))                                                \
	X(CUresult, MemRelease, "cuMemRelease", (CUmemGenericAllocationHandle))     \
	X(CUresult, MemMap, "cuMemMap",                                             \
	    (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,             \
	        unsigned long long))                                                \
	X(CUresult, MemUnmap, "cuMemUnmap", (CUdeviceptr, size_t))                  \
	X(CUresult, MemSetAccess, "cuMemSetAccess",                                 \
	    (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))                 \
	X(CUresult, MemGetAllocationGranularity, "cuMemGetAllocationGranularity",   \
	    (size_t *, const CUmemAllocationProp *,                                 \
	        CUmemAllocationGranularity_flags))                                  \
	X(CUresult, ModuleLoadData, "cuModuleLoadData", (CUmodule *, const void *)) \
	X(CUresult, ModuleUnload, "cuModuleUnload", (CUmodule))                     \
	X(CUresult, ModuleGetFunction, "cuModuleGetFunction",                       \
	    (CUfunction *, CUmodule, const char *))                                 \
	X(CUresult, StreamBeginCapture, "cuStreamBeginCapture_v2",                  \
	    (CUstream, CUstreamCaptureMode))                                        \
	X(CUresult, StreamEndCapture, "cuStreamEndCapture", (CUstream, CUgraph *))  \
	X(CUresult, GraphInstantiate, "cuGraphInstantiateWithFlags",                \
	    (CUgraphExec *, CUgraph, unsigned long long))                           \
	X(CUresult, GraphExecUpdate, "cuGraphExecUpdate_v2",                        \
	    (CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *))                  \
	X(CUresult, GraphLaunch, "cuGraphLaunch", (CUgraphExec, CUstream))          \
	X(CUresult, GraphDestroy, "cuGraphDestroy", (CUgraph))                      \
	X(CUresult, GraphExecDestroy, "cuGraphExecDestroy", (CUgraphExec))          \
	X(CUresult, LaunchKernel, "cuLaunchKernel",                                 \
	    (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,    \
	        unsigned int, unsigned int, unsigned int, CUstream, void **,        \
	        void **))                                                                 \
	X(CUresult, LaunchKernelEx, "cuLaunchKernelEx",                             \
	    (const CUlaunchConfig *, CUfunction, void **, void **))

struct cuda_driver {
	int version; /* cuDriverGetVersion: 12080, 13000, ... */
#define BATON_CUDA_MEMBER(ret, name, export, params) ret (*name) params;
	BATON_CUDA_DRIVER_FUNCS(BATON_CUDA_MEMBER)
#undef BATON_CUDA_MEMBER
};

/* Loads libcuda.so.1 and calls cuInit(0), once per process (thread-safe;
 * later calls return the first call's result). 0 with *out set, or
 * BATON_ENODEV with one of these sentences in errbuf (may be NULL):
 *   "libcuda.so.1 not found: no NVIDIA driver on this machine"
 *   "libcuda.so.1 has no cuXxx: driver too old (CUDA 12.0 or newer needed)"
 *   "cuInit failed: <cuGetErrorString>"
 * The library stays loaded until the process exits. Do not call it in a
 * process that will fork and use CUDA in the child. */
int cuda_driver_load(const struct cuda_driver **out, char *errbuf, size_t errlen);

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for r, into buf. */
void cuda_driver_errstr(const struct cuda_driver *d, CUresult r, char *buf, size_t len);

#endif
