/*
 * idle.c: the engine's idle-release timer (--cache-release-idle), called
 * by the program every 100 ms or so (serve_tick). It is for an engine
 * without a broker: under a broker idle release is the broker's one rule
 * (idle_release_s and the front door's keep-alive, broker/schedule.c),
 * and this timer does nothing.
 */
#include <inttypes.h>

#include "engine/serve/serve_int.h"

/* Releases the cache when nobody asked for anything for idle_s seconds. */
void serve_tick(struct serve *s)
{
	if (s->o.broker)
		return;
	pthread_mutex_lock(&s->st_mu);
	double idle = baton_now_s() - s->last_active, limit = s->has_keep_alive ? s->keep_alive_s : s->o.idle_s;
	int asked = s->has_keep_alive;
	pthread_mutex_unlock(&s->st_mu);
	/* --cache-release-idle, or the last Ollama request's keep_alive (0:
	 * at once once idle; < 0: never) */
	if ((asked ? limit < 0 : limit <= 0) || idle < limit || pthread_mutex_trylock(&s->run_mu) != 0)
		return;
	if (s->info.cache.state == BATON_CACHE_READY || s->info.cache.state == BATON_CACHE_PARTIAL) {
		struct baton_cache_report r;
		serve_set_state(s, BATON_STATE_RELEASING);
		int rc = engine_release(s->e, &r);
		if (rc == 0) {
			s->idle_released = 1;
			serve_log(s, "idle for %.1f s: released %" PRIu64 " bytes in %.3f ms", idle,
			    r.bytes_freed, r.total_s * 1e3);
		} else {
			serve_log(s, "idle release failed: %s", baton_strerror(rc));
		}
		serve_snapshot(s, NULL);
		if (rc == 0)
			serve_report(s, "idle release (engine)", r.total_s * 1e3, r.bytes_freed);
	}
	pthread_mutex_unlock(&s->run_mu);
}

/* An Ollama request's keep_alive (openai.h's keep_alive hook): the idle
 * time before the next release, until another request says otherwise. */
void serve_keep_alive(void *arg, double seconds)
{
	struct serve *s = arg;
	pthread_mutex_lock(&s->st_mu);
	s->has_keep_alive = 1;
	s->keep_alive_s = seconds;
	pthread_mutex_unlock(&s->st_mu);
}
