/*
 * graph.c: the graph_begin / graph_end slots of the `cuda` backend
 * (engine/backend/backend.h): a pass recorded by stream capture and
 * queued as one CUDA graph, for the decode step, whose ~20 small kernels
 * a layer cost more in launches than in work.
 *
 * Recorded once, replayed after: while a pass is recorded, every launch
 * and staged copy is also logged (launch.c: the function, grid, block and
 * argument bytes; the copy's size and place). The next pass is not
 * captured: graph_begin says it is checked (*replay = 1), and every op
 * of it computes its arguments as usual but queues nothing: each launch
 * must be the log's next with the same bytes, and each small host array
 * (token ids, positions, slots, block tables, attention's key count) is
 * written into the staging's host half at the offset the recording gave
 * it, which the graph's copy nodes read when it runs. A pass that went
 * the same way launches the graph (graph_end): the same kernels with the
 * same arguments on the new arrays, so the same bits. One that differs
 * (another shape, a buffer that moved, attention past its chunk bucket,
 * weights back at other addresses after a release) queued nothing, and
 * graph_end refuses it (BATON_ESTATE): the caller records it anew.
 * Relaxed capture; the staging ring's events are recorded after a graph
 * (events recorded on a capturing stream belong to the capture). On
 * unless BATON_CUDA_GRAPH=0 at open.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/backend/cuda/cuda_int.h"

void cuda_graph_config(struct baton_dev *dev)
{
	const char *s = getenv("BATON_CUDA_GRAPH");
	dev->graph_off = s && strcmp(s, "0") == 0;
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

#define GRAPH_STAGE (4u << 20) /* a decode step's arrays: under 100 KiB at 48 layers */

/* What the first graph needs: its staging and the event after a launch. */
static int graph_ready(struct baton_dev *dev)
{
	const struct cuda_driver *d = dev->d;
	int rc;
	if (!dev->graph_done)
		CU(dev, d->EventCreate(&dev->graph_done, CU_EVENT_DISABLE_TIMING),
		    "cuEventCreate (graph)");
	if (!dev->gs_host) {
		void *p = NULL;
		CU(dev, d->MemHostAlloc(&p, GRAPH_STAGE, 0), "cuMemHostAlloc (graph staging)");
		dev->gs_host = p;
		dev->gs_cap = GRAPH_STAGE;
	}
	if ((rc = cuda_dbuf_need(dev, &dev->gs_dev, GRAPH_STAGE)))
		return rc;
	/* the last graph's copies have read the staging before it is written again */
	if (dev->g_launched) {
		CU(dev, d->EventSynchronize(dev->graph_done), "cuEventSynchronize (graph)");
		dev->g_launched = 0;
	}
	return 0;
}

int cuda_graph_begin(struct baton_dev *dev, int *replay)
{
	int rc;
	if (replay)
		*replay = 0;
	if (dev->graph_off)
		return BATON_EUNSUPPORTED;
	if (dev->capturing || dev->gmode)
		return BATON_ESTATE;
	if ((rc = cuda_cur(dev)) || (rc = graph_ready(dev)))
		return rc;
	dev->gs_off = 0;
	dev->gfail = 0;
	dev->gk = 0;
	if (dev->gexec && dev->gl_ok) {
		dev->gmode = CUDA_G_CHECK;
		if (replay)
			*replay = 1;
		return 0;
	}
	dev->gl_n = 0;
	dev->gl_args_n = 0;
	dev->gl_ok = 0;
	CU(dev, dev->d->StreamBeginCapture(dev->stream, CU_STREAM_CAPTURE_MODE_RELAXED),
	    "cuStreamBeginCapture");
	dev->capturing = 1;
	dev->gmode = CUDA_G_RECORD;
	return 0;
}

/* A checked pass: launch the recorded graph, or refuse the pass. */
static int replay_end(struct baton_dev *dev, int ok)
{
	const struct cuda_driver *d = dev->d;
	if (!ok) { /* an op failed or went another way: nothing was queued */
		dev->gl_ok = 0;
		return 0;
	}
	if (dev->gfail || dev->gk != dev->gl_n) {
		if (!dev->gfail)
			cuda_set_err(dev, "graph replay: the pass has fewer calls than the recording");
		dev->gl_ok = 0; /* the next pass records */
		return BATON_ESTATE;
	}
	CU(dev, d->GraphLaunch(dev->gexec, dev->stream), "cuGraphLaunch");
	CU(dev, d->EventRecord(dev->graph_done, dev->stream), "cuEventRecord (graph)");
	dev->g_launched = 1;
	dev->graph_replays++;
	return record_pending(dev);
}

int cuda_graph_end(struct baton_dev *dev, int ok)
{
	const struct cuda_driver *d = dev->d;
	CUgraph g = NULL;
	int rc;
	const int mode = dev->gmode;
	dev->gmode = CUDA_G_NONE;
	if ((rc = cuda_cur(dev))) {
		dev->gl_ok = 0;
		return rc;
	}
	if (mode == CUDA_G_CHECK)
		return replay_end(dev, ok);
	if (!dev->capturing)
		return BATON_ESTATE;
	dev->capturing = 0;
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
	if (r == CUDA_SUCCESS && (r = d->EventRecord(dev->graph_done, dev->stream)) == CUDA_SUCCESS)
		dev->g_launched = 1;
	if ((rc = record_pending(dev)))
		return rc;
	CU(dev, r, "cuGraphLaunch");
	dev->gl_ok = !dev->gfail; /* the next pass may replay it */
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
	dev->gmode = CUDA_G_NONE;
	cuda_glog_free(dev);
}
