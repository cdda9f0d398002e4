/*
 * work.c: the device memory a request needs and the bracket around the
 * work (see serve_int.h). With a broker the engine asks before it maps
 * memory on its own initiative: at start (it opens cold) and when a
 * request finds the cache released, partial or shrunk. One thread at a
 * time asks (acq_mu); the others then find the cache whole. A broker
 * command refused as busy makes the next GENs wait up to YIELD_S before
 * starting (and the scheduler admit nothing for up to DRAIN_S), so the
 * broker's retry gets in between two requests. When the broker is away,
 * the engine maps what it needs on its own.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/serve/serve_int.h"

/* Test hook: BATON_TEST_REFILL_DELAY_MS makes every refill this engine
 * starts on a grant or command wait first, so tests can kill it mid-way. */
static void test_refill_delay(void)
{
	const char *v = getenv("BATON_TEST_REFILL_DELAY_MS");
	uint64_t ms = 0;
	if (v && baton_parse_u64(v, 1, 59999, &ms) == 0) {
		struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* Test hook: BATON_TEST_REFILL_STEP_MS makes each segment of a refill
 * take this much longer (a slow link), so that a refill outlasts the
 * broker's command timeout while its progress moves. */
void serve_refill_step(void *ctx, uint64_t done, uint64_t total)
{
	(void)ctx, (void)done, (void)total;
	const char *v = getenv("BATON_TEST_REFILL_STEP_MS");
	uint64_t ms = 0;
	if (v && baton_parse_u64(v, 1, 59999, &ms) == 0) {
		struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* After a release --all: the dense weights and the KV pool back on the
 * device (caller holds run_mu). BATON_EDEVMEM leaves them released, to be
 * tried again. */
int serve_refill_model(struct serve *s)
{
	if (!s->gen || !s->released_all)
		return 0;
	double t0 = baton_now_s();
	int rc = model_refill(generator_model(s->gen));
	if (s->sched)
		sched_note_model(s->sched);
	if (rc) {
		serve_log(s, "refill of the model's dense weights and KV cache failed: %s", baton_strerror(rc));
		return rc;
	}
	pthread_mutex_lock(&s->st_mu);
	s->released_all = 0;
	pthread_mutex_unlock(&s->st_mu);
	serve_log(s, "model refilled: %.1f MiB of dense weights and KV cache in %.3f ms",
	    (double)s->model_bytes / BATON_MIB, (baton_now_s() - t0) * 1e3);
	return 0;
}

/* Makes the cache whole again (caller holds run_mu): back to the full
 * target and the configured reserve, then filled. With `limit` below what
 * is missing (a partial grant), it maps only that much: the reserve is set
 * so that the device keeps all but `limit` of its free memory. */
int serve_make_full(struct serve *s, uint64_t limit, struct baton_cache_report *sum)
{
	struct baton_cache_stats st;
	cache_stats(engine_cache(s->e), &st);
	uint64_t missing = s->ceiling > st.mapped_bytes ? s->ceiling - st.mapped_bytes : 0;
	int64_t reserve = -1;
	if (limit < missing) {
		uint64_t fr = 0, tot = 0;
		engine_mem_info(s->e, &fr, &tot);
		reserve = fr > limit ? (int64_t)(fr - limit) : 0;
	}
	return serve_fill_to(s, reserve, sum);
}

/* The cache at `reserve` (bytes the device keeps free; -1: the configured
 * reserve and the full target), then filled: a released cache maps from
 * nothing until the device has `reserve` free (caller holds run_mu). */
int serve_fill_to(struct serve *s, int64_t reserve, struct baton_cache_report *sum)
{
	struct baton_cache_report r;
	struct baton_cache_stats st;
	memset(sum, 0, sizeof *sum);
	test_refill_delay();
	int rc = engine_vram(s->e, reserve, &r);
	if (rc)
		return rc;
	cache_report_add(sum, &r);
	cache_stats(engine_cache(s->e), &st);
	if (st.state != BATON_CACHE_READY) {
		rc = engine_refill(s->e, &r);
		if (rc)
			return rc;
		cache_report_add(sum, &r);
	}
	s->idle_released = 0;
	if (sum->bytes_copied) {
		pthread_mutex_lock(&s->st_mu);
		s->last_refill_bytes = sum->bytes_copied;
		s->last_refill_s = sum->total_s;
		pthread_mutex_unlock(&s->st_mu);
	}
	return 0;
}

/* Whole: ready, at the full target, nothing missing. */
static int cache_whole(struct serve *s)
{
	struct baton_cache_stats st;
	cache_stats(engine_cache(s->e), &st);
	return st.state == BATON_CACHE_READY && st.target_bytes >= s->ceiling;
}

/* With a broker: asks before making the cache whole. Called with run_mu
 * held; returns with it held. 0 to go on; else the GEN fails with the
 * broker's refusal in err. */
int serve_ensure_memory(struct serve *s, const char *why, char *err, size_t errlen)
{
	if (!s->link || (cache_whole(s) && !s->released_all))
		return 0;
	pthread_mutex_unlock(&s->run_mu);
	pthread_mutex_lock(&s->acq_mu);
	pthread_mutex_lock(&s->run_mu);
	if (cache_whole(s) && !s->released_all) {
		pthread_mutex_unlock(&s->acq_mu);
		return 0;
	}
	struct baton_cache_stats st;
	cache_stats(engine_cache(s->e), &st);
	uint64_t need = s->ceiling > st.mapped_bytes ? s->ceiling - st.mapped_bytes : 0;
	uint64_t model_need = s->released_all ? s->model_bytes : 0; /* after a release --all */
	need += model_need;
	pthread_mutex_unlock(&s->run_mu);
	uint64_t granted = 0, epoch = 0;
	double t0 = baton_now_s();
	int rc = broker_link_acquire(s->link, need, &granted, &epoch, err, errlen);
	double wait_s = baton_now_s() - t0;
	pthread_mutex_lock(&s->run_mu);
	if (rc && rc != BATON_ECONN) {
		pthread_mutex_unlock(&s->acq_mu);
		return rc;
	}
	char reason[160];
	if (rc == BATON_ECONN) {
		serve_log(s, "%s: the broker is away (%s): mapping on my own", why, err);
		granted = UINT64_MAX;
		snprintf(reason, sizeof reason, "refill (%s, broker away)", why);
	} else {
		pthread_mutex_lock(&s->st_mu);
		if (epoch > s->epoch)
			s->epoch = epoch; /* the grant's epoch: its state is news after it */
		pthread_mutex_unlock(&s->st_mu);
		snprintf(reason, sizeof reason, "refill (%s, granted %.1f MiB after %.3f ms)", why,
		    (double)granted / BATON_MIB, wait_s * 1e3);
	}
	serve_set_state(s, BATON_STATE_REFILLING);
	struct baton_cache_report r;
	memset(&r, 0, sizeof r);
	/* the model first: the cache's share is what the grant leaves */
	int mrc = serve_refill_model(s);
	if (mrc == 0)
		mrc = serve_make_full(s, granted > model_need ? granted - model_need : 0, &r);
	serve_snapshot(s, NULL);
	pthread_mutex_unlock(&s->acq_mu);
	if (mrc) {
		serve_log(s, "%s: refill failed: %s", why, baton_strerror(mrc));
		serve_report(s, "refill failed", r.total_s * 1e3, 0);
	} else {
		serve_report(s, reason, r.total_s * 1e3, r.bytes_copied);
	}
	return 0; /* the GEN maps what it needs even when that failed */
}

/* A broker command was refused as busy: let it in before the next GEN. */
static void gen_yield(struct serve *s)
{
	pthread_mutex_lock(&s->st_mu);
	for (;;) {
		double until = s->yield_at + YIELD_S, now = baton_now_s();
		if (s->yield_at == 0 || now >= until || s->stopping)
			break;
		baton_cond_wait_until(&s->yield_cv, &s->st_mu, until);
	}
	pthread_mutex_unlock(&s->st_mu);
}

/* The bracket of a request that computes (GEN, COMPLETE). serve_work_begin
 * counts it busy (the broker asks idle engines first), lets a refused
 * broker command in first, takes the engine and makes its memory whole; 0
 * when the caller holds the engine, else it has replied with the error.
 * serve_work_done counts the request done (before the reply, so a STATUS after
 * the reply sees it); serve_work_end, before the reply (a reply means the
 * engine takes the next operation), refills the rest after an idle
 * release and gives the engine back. */
int serve_work_begin(struct serve *s, struct proto_ctx *ctx, const struct baton_msg *req)
{
	pthread_mutex_lock(&s->st_mu);
	int first = s->active++ == 0;
	pthread_mutex_unlock(&s->st_mu);
	if (first && s->link)
		broker_link_poke(s->link); /* busy now: the broker asks idle engines first */
	gen_yield(s);
	pthread_mutex_lock(&s->run_mu);
	char aerr[512] = "";
	int arc = serve_ensure_memory(s, proto_op_name(req->op), aerr, sizeof aerr);
	if (arc) {
		pthread_mutex_unlock(&s->run_mu);
		pthread_mutex_lock(&s->st_mu);
		int none = --s->active == 0;
		s->last_active = baton_now_s();
		pthread_mutex_unlock(&s->st_mu);
		if (none)
			broker_link_poke(s->link);
		serve_reply_err(s, ctx, req, arc, "%s: no device memory from the broker: %s", proto_op_name(req->op), aerr);
		return arc;
	}
	return 0;
}

int serve_work_done(struct serve *s, int ok)
{
	pthread_mutex_lock(&s->st_mu);
	if (ok)
		s->requests++;
	s->last_active = baton_now_s();
	int last = --s->active == 0;
	pthread_mutex_unlock(&s->st_mu);
	serve_snapshot(s, NULL);
	if (last && s->link)
		broker_link_poke(s->link);
	return ok && !s->link && s->idle_released && s->info.cache.state != BATON_CACHE_READY;
}

void serve_work_end(struct serve *s, int refill_rest)
{
	/* After an idle release the first request loaded what it needed; the
	 * rest comes back now, before its answer, so the engine is whole when
	 * the client hears from it. */
	if (refill_rest) {
		struct baton_cache_report r;
		serve_set_state(s, BATON_STATE_REFILLING);
		int rc = engine_refill(s->e, &r);
		pthread_mutex_lock(&s->st_mu);
		if (rc == 0) {
			s->idle_released = 0;
			s->last_refill_bytes = r.bytes_copied;
			s->last_refill_s = r.total_s;
		}
		/* the idle time counts from the end of this work: a refill
		 * slower than the idle timeout must not be released at once */
		s->last_active = baton_now_s();
		pthread_mutex_unlock(&s->st_mu);
		serve_snapshot(s, NULL);
	}
	pthread_mutex_unlock(&s->run_mu);
}

/* Before the scheduler's first step after idle: busy now, a refused
 * broker command first, the engine taken, its memory made whole (the
 * broker asked), the model back after a release --all. 0 with run_mu
 * held by the scheduler's thread until sched_end. */
static int sched_begin(void *arg, char *err, size_t errlen)
{
	struct serve *s = arg;
	if (s->link)
		broker_link_poke(s->link); /* busy now: the broker asks idle engines first */
	gen_yield(s);
	pthread_mutex_lock(&s->run_mu);
	char aerr[512] = "";
	int rc = serve_ensure_memory(s, "complete", aerr, sizeof aerr);
	if (rc) {
		baton_errf(err, errlen, "no device memory from the broker: %s", aerr);
	} else if ((rc = serve_refill_model(s)) != 0) {
		baton_errf(err, errlen, "no device memory for the model's dense weights and KV cache "
		    "(%s)", baton_strerror(rc));
	}
	if (rc) {
		serve_snapshot(s, NULL);
		pthread_mutex_unlock(&s->run_mu);
		pthread_mutex_lock(&s->st_mu);
		s->last_active = baton_now_s();
		pthread_mutex_unlock(&s->st_mu);
		if (s->link)
			broker_link_poke(s->link);
		return rc;
	}
	return 0;
}

/* The last sequence ended and nothing is admitted: the engine goes back
 * (after an idle release without a broker, the rest is refilled first). */
static void sched_end(void *arg)
{
	struct serve *s = arg;
	pthread_mutex_lock(&s->st_mu);
	s->last_active = baton_now_s();
	pthread_mutex_unlock(&s->st_mu);
	serve_snapshot(s, NULL);
	int rest = !s->link && s->idle_released && s->info.cache.state != BATON_CACHE_READY;
	serve_work_end(s, rest);
	if (s->link)
		broker_link_poke(s->link);
}

/* No new sequence while a refused broker command waits to get in. */
static int sched_may_admit(void *arg)
{
	struct serve *s = arg;
	pthread_mutex_lock(&s->st_mu);
	int ok = s->yield_at == 0 || baton_now_s() >= s->yield_at + DRAIN_S || s->stopping;
	pthread_mutex_unlock(&s->st_mu);
	return ok;
}

void serve_sched_hooks(struct serve *s, struct sched_hooks *h)
{
	*h = (struct sched_hooks){ .begin = sched_begin, .end = sched_end, .may_admit = sched_may_admit,
		.arg = s };
}
