/*
 * graph.c: the graph_begin / graph_end slots of the `cuda` backend
 * (engine/backend/backend.h): a pass recorded by stream capture and
 * queued as one CUDA graph, for the decode step, whose ~20 small kernels
 * a layer cost more in launches than in work.
 *
 * Each pass is captured anew (the kernels' arguments change from step to
 * step: positions, the number of keys); the executable graph of the last
 * pass is updated in place with cuGraphExecUpdate when the new graph has
 * its shape (the usual case), and instantiated afresh when not (a pass of
 * another shape, attention crossing a chunk of keys). Capture is relaxed,
 * so the staging ring may wait for copies of earlier passes while
 * recording, and its events are recorded after the graph (events
 * recorded on a capturing stream belong to the capture). Off unless
 * BATON_CUDA_GRAPH=1 at open: on the H200 it did not make decode faster
 * (docs/internals/cuda-ops.md: capturing a step costs the host what
 * launching it did).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/cuda/cuda_int.h"

void cuda_graph_config(struct baton_dev *dev)
{
	const char *s = getenv("BATON_CUDA_GRAPH");
	dev->graph_off = !(s && strcmp(s, "1") == 0);
}

/* The staging events the recording left to record (ops_launch.c): after
 * the graph (or in place of the dropped recording) on the stream. */
static int record_pending(struct baton_dev *dev)
{
	for (int h = 0; h < 2; h++)
		if (dev->ops_rec_pending[h]) {
			dev->ops_rec_pending[h] = 0;
			CU(dev, dev->d->EventRecord(dev->ops_staged[h], dev->stream),
			    "cuEventRecord (ops staging, after a graph)");
		}
	return 0;
}

int cuda_graph_begin(struct baton_dev *dev)
{
	int rc;
	if (dev->graph_off)
		return BATON_EUNSUPPORTED;
	if (dev->capturing)
		return BATON_ESTATE;
	if ((rc = cuda_cur(dev)))
		return rc;
	CU(dev, dev->d->StreamBeginCapture(dev->stream, CU_STREAM_CAPTURE_MODE_RELAXED),
	    "cuStreamBeginCapture");
	dev->capturing = 1;
	return 0;
}

int cuda_graph_end(struct baton_dev *dev, int ok)
{
	const struct cuda_driver *d = dev->d;
	CUgraph g = NULL;
	int rc;
	if (!dev->capturing)
		return BATON_ESTATE;
	dev->capturing = 0;
	if ((rc = cuda_cur(dev)))
		return rc;
	CUresult r = d->StreamEndCapture(dev->stream, &g);
	if (r != CUDA_SUCCESS || !ok || !g) {
		if (g)
			d->GraphDestroy(g);
		if ((rc = record_pending(dev)))
			return rc;
		return ok ? cuda_fail(dev, r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN,
		    "cuStreamEndCapture") : 0;
	}
	if (dev->gexec) {
		CUgraphExecUpdateResultInfo info;
		memset(&info, 0, sizeof info);
		if (d->GraphExecUpdate(dev->gexec, g, &info) == CUDA_SUCCESS) {
			dev->graph_updates++;
		} else {
			d->GraphExecDestroy(dev->gexec);
			dev->gexec = NULL;
		}
	}
	if (!dev->gexec) {
		r = d->GraphInstantiate(&dev->gexec, g, 0);
		if (r != CUDA_SUCCESS) {
			dev->gexec = NULL;
			d->GraphDestroy(g);
			record_pending(dev);
			return cuda_fail(dev, r, "cuGraphInstantiate");
		}
		dev->graph_builds++;
	}
	d->GraphDestroy(g);
	r = d->GraphLaunch(dev->gexec, dev->stream);
	if ((rc = record_pending(dev)))
		return rc;
	CU(dev, r, "cuGraphLaunch");
	return 0;
}

void cuda_graph_free(struct baton_dev *dev)
{
	if (dev->capturing) {
		CUgraph g = NULL;
		if (dev->d->StreamEndCapture(dev->stream, &g) == CUDA_SUCCESS && g)
			dev->d->GraphDestroy(g);
		dev->capturing = 0;
	}
	if (dev->gexec)
		dev->d->GraphExecDestroy(dev->gexec);
	dev->gexec = NULL;
}
