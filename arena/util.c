/* util.c: the arena's small shared helpers: hashing, messages, threads. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* xxHash as inline code: no link-time dependency on libxxhash. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "arena/arena_int.h"

uint64_t arena_hash(const void *p, size_t n)
{
	return (uint64_t)XXH3_64bits(p, n);
}

uint64_t arena_sample_hash(const uint8_t *b, uint64_t size, uint64_t from)
{
	enum { CHUNKS = 16, CHUNK = 4096 };
	uint64_t h[CHUNKS + 1] = { size };
	if (from > size)
		from = size;
	uint64_t span = size - from;
	for (uint64_t i = 0; i < CHUNKS; i++) {
		uint64_t off = from + (span > CHUNK ? (span - CHUNK) / (CHUNKS - 1) * i : 0);
		uint64_t n = span < CHUNK ? span : CHUNK;
		h[i + 1] = arena_hash(b + off, (size_t)n);
	}
	return arena_hash(h, sizeof h);
}

unsigned arena_threads(unsigned want, uint64_t work)
{
	if (want == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		want = n > 0 ? (unsigned)n : 1;
	}
	if (want > 256)
		want = 256;
	if (work < want)
		want = work ? (unsigned)work : 1;
	return want;
}

struct par {
	int (*fn)(void *ctx, uint64_t i);
	void *ctx;
	uint64_t n;
	atomic_uint_fast64_t next;
	atomic_int stop;
	pthread_mutex_t mu;
	int err;
	uint64_t err_item;
};

static void *par_worker(void *arg)
{
	struct par *p = arg;
	while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
		uint64_t i = atomic_fetch_add(&p->next, 1);
		if (i >= p->n)
			break;
		int rc = p->fn(p->ctx, i);
		if (rc) {
			pthread_mutex_lock(&p->mu);
			if (!p->err || i < p->err_item) {
				p->err = rc;
				p->err_item = i;
			}
			pthread_mutex_unlock(&p->mu);
			atomic_store(&p->stop, 1);
		}
	}
	return NULL;
}

int arena_parallel(unsigned threads, uint64_t n, int (*fn)(void *ctx, uint64_t i), void *ctx)
{
	struct par p = { .fn = fn, .ctx = ctx, .n = n };
	atomic_init(&p.next, 0);
	atomic_init(&p.stop, 0);
	pthread_mutex_init(&p.mu, NULL);
	threads = arena_threads(threads, n);
	pthread_t *tid = calloc(threads, sizeof *tid);
	unsigned started = 0;
	if (tid)
		for (; started + 1 < threads; started++)
			if (pthread_create(&tid[started], NULL, par_worker, &p) != 0)
				break;
	par_worker(&p); /* the caller works too */
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	free(tid);
	pthread_mutex_destroy(&p.mu);
	return p.err;
}
