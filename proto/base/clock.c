/* clock.c: monotonic seconds, the wall clock, and deadlines for timed waits. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <time.h>

#include "proto/base/base.h"

static double seconds_of(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double baton_now_s(void)
{
	return seconds_of(CLOCK_MONOTONIC);
}

double baton_wall_s(void)
{
	return seconds_of(CLOCK_REALTIME);
}

uint64_t baton_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void baton_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
}

struct timespec baton_deadline(double t)
{
	struct timespec ts = { 0, 0 };
	if (!(t > 0))
		return ts;
	double sec = floor(t);
	ts.tv_sec = (time_t)sec;
	ts.tv_nsec = (long)((t - sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L) { /* rounding at the top of a second */
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (ts.tv_nsec < 0)
		ts.tv_nsec = 0;
	return ts;
}

int baton_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, double t)
{
	struct timespec ts = baton_deadline(t);
	return pthread_cond_timedwait(cv, mu, &ts);
}

int baton_cond_wait_for(pthread_cond_t *cv, pthread_mutex_t *mu, double s)
{
	if (!(s > 0))
		return ETIMEDOUT;
	return baton_cond_wait_until(cv, mu, baton_now_s() + s);
}
