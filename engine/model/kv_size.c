/*
 * kv_size.c: how large the KV pool is when --kv-blocks does not say
 * (issue 28). One context, the old default, let one chat without
 * max_tokens hold the whole pool while others waited. vLLM gives the KV
 * cache what its memory budget leaves after the weights; here the expert
 * cache wants that memory too (it is elastic, the broker grows and
 * shrinks it), so the pool takes a bounded share instead:
 *
 *   pool = min(max_seqs whole contexts,            every running sequence
 *                                                  can reach its context's end
 *              device total / KV_DEFAULT_SHARE,    a sixteenth of the device
 *              device free - the cache's floor)    what is left now, after the
 *                                                  dense weights, and after one
 *                                                  segment of the expert cache
 *                                                  when it is not mapped yet
 *   and at least one context (a device without room for that fails at the
 *   first allocation, as before).
 *
 * The pool is then its own line in the books: the engine reports its bytes
 * (kv) to the broker, which accounts them apart from the cache and from
 * the rest of the device's use (broker/registry.c).
 */
#include "engine/model/model_int.h"

uint32_t kv_default_blocks(const struct baton_model *m, uint32_t max_seqs)
{
	uint64_t blk = model_kv_block_bytes(m);
	uint64_t one = m->seq_blocks;
	if (!max_seqs)
		max_seqs = 16;
	uint64_t fr = 0, tot = 0;
	if (blk == 0 || !m->be->mem_info || m->be->mem_info(m->dev, &fr, &tot) != 0 || tot == 0)
		return m->seq_blocks;
	uint64_t want = one * max_seqs;
	uint64_t share = tot / KV_DEFAULT_SHARE / blk;
	struct baton_cache_stats cs = { 0 };
	if (m->cache)
		cache_stats(m->cache, &cs);
	uint64_t floor = cs.mapped_bytes < cs.segment_bytes ? cs.segment_bytes - cs.mapped_bytes : 0;
	uint64_t left = fr > floor ? (fr - floor) / blk : 0;
	uint64_t n = want;
	if (n > share)
		n = share;
	if (n > left)
		n = left;
	if (n < one)
		n = one;
	if (n > MAX_BLOCKS)
		n = MAX_BLOCKS;
	return (uint32_t)n;
}
