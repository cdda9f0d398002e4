/*
 * registry.c: the top of engine/backend/, the one file that knows every
 * backend: finding one by name (backend_find, backend.h).
 */
#include <string.h>

#include "engine/backend/backend.h"
#ifdef BATON_HAVE_CUDA
#include "engine/backend/cuda/cuda.h"
#endif

/* The cuda backend, when this build has one. 0 when it can be used now,
 * else BATON_ENODEV with the reason in errbuf. */
static int find_cuda(const struct baton_backend **out, char *errbuf, size_t errlen)
{
#ifdef BATON_HAVE_CUDA
	/* Loads libcuda.so.1 and looks for a device; says why not. */
	int rc = cuda_backend_probe(errbuf, errlen);
	if (rc)
		return rc;
	*out = &baton_backend_cuda;
	return 0;
#else
	(void)out;
	baton_errf(errbuf, errlen, "this build has no CUDA backend (built with CUDA=0)");
	return BATON_ENODEV;
#endif
}

int backend_find(const char *name, const struct baton_backend **out, char *errbuf, size_t errlen)
{
	if (!out) {
		baton_errf(errbuf, errlen, "backend_find: no place for the result");
		return BATON_EINVAL;
	}
	*out = NULL;
	if (!name) {
		baton_errf(errbuf, errlen, "no backend name given (host, cuda or auto)");
		return BATON_EINVAL;
	}
	if (strcmp(name, "host") == 0) {
		*out = &baton_backend_host;
		return 0;
	}
	if (strcmp(name, "cuda") == 0)
		return find_cuda(out, errbuf, errlen);
	if (strcmp(name, "auto") == 0) {
		/* cuda when a GPU and its driver answer, else host. */
		if (find_cuda(out, NULL, 0) == 0)
			return 0;
		*out = &baton_backend_host;
		return 0;
	}
	baton_errf(errbuf, errlen, "unknown backend \"%.64s\" (host, cuda or auto)", name);
	return BATON_EINVAL;
}

const char *backend_dtype_advice(const struct baton_backend *be, int dtype)
{
	if (be != &baton_backend_host && baton_backend_host.can_compute(dtype))
		return "the host backend computes it (--backend host); or requantize the GGUF with "
		       "llama-quantize to Q4_K_M, Q5_K_M, Q6_K or Q8_0";
	return "no backend of this build computes it; requantize the GGUF with llama-quantize to "
	       "Q4_K_M, Q5_K_M, Q6_K or Q8_0";
}
