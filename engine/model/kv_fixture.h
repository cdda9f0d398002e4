/*
 * kv_fixture.h: what the KV pool's tests (engine/model/kv_test.c and
 * prefix_test.c) share beside model_fixture.h's rig, included by each
 * once: the greedy token of a row of logits, and pseudo-random prompts.
 */
#ifndef BATON_ENGINE_MODEL_KV_FIXTURE_H
#define BATON_ENGINE_MODEL_KV_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>

#include "tests/t.h"

__attribute__((unused)) static uint32_t kv_argmax(const float *l, uint32_t n)
{
	uint32_t b = 0;
	for (uint32_t i = 1; i < n; i++)
		if (l[i] > l[b])
			b = i;
	return b;
}

/* n pseudo-random ids below vocab, different per seed (the caller frees). */
__attribute__((unused)) static uint32_t *kv_ids(uint32_t n, uint32_t seed, uint32_t vocab)
{
	uint32_t *t = malloc((n ? n : 1) * sizeof *t), x = seed * 2654435761u + 12345u;
	T_ASSERT(t);
	for (uint32_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		t[i] = (x >> 8) % vocab;
	}
	return t;
}

#endif
