/*
 * cuda_fixture.h: what the cuda backend's GPU tests share (header only,
 * tests only; includes the door cuda.h alone): opening device 0 or ending
 * the case as a pass with "skip: why" where there is no driver or no
 * device, and T_CU, which fails a case with the call, its error name and
 * the context's last driver error.
 */
#ifndef BATON_ENGINE_BACKEND_CUDA_FIXTURE_H
#define BATON_ENGINE_BACKEND_CUDA_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "engine/backend/cuda/cuda.h"
#include "tests/t.h"

/* Opens device 0 of the cuda backend, or ends the case as a pass with
 * "skip: why" (CI has no GPU). The caller closes it. */
static inline struct baton_dev *cuda_fixture_open(void)
{
	char err[256];
	if (cuda_backend_probe(err, sizeof err) != 0) {
		printf("  skip: %s\n", err);
		fflush(stdout);
		exit(0);
	}
	struct baton_dev *dev = NULL;
	int rc = baton_backend_cuda.open(0, 0, &dev, err, sizeof err);
	T_ASSERT_MSG(rc == 0, "open: %s (%s)", baton_errname(rc), err);
	return dev;
}

/* A backend call that must succeed on dev. */
#define T_CU(dev, expr)                                                        \
	do {                                                                   \
		int t_rc_ = (expr);                                            \
		if (t_rc_ != 0)                                                \
			T_FAIL("%s gave %s: %s", #expr, baton_errname(t_rc_),  \
			    cuda_backend_last_error(dev));                     \
	} while (0)

#endif
