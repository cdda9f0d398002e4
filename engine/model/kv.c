/*
 * kv.c: the paged KV pool (see model_int.h): n_blocks blocks of
 * BATON_KV_BLOCK positions, laid out per layer as K [n_blocks * BLOCK]
 * [kv_heads * head_dim] then V the same, so a block id indexes every
 * layer; free ids on a stack. A sequence holds a block table and its
 * position; blocks are reference counted. What outlives a sequence (the
 * prefix cache, the copy in host memory across a release) is prefix.c's.
 */
#include <stdlib.h>
#include <string.h>

#include "engine/model/model_int.h"

uint64_t kv_row(const struct baton_model *m)
{
	return (uint64_t)m->cfg.kv_heads * m->cfg.head_dim * sizeof(float);
}

/* Rows of the pool per layer and per K or V. */
uint64_t kv_pool_rows(const struct baton_model *m)
{
	return (uint64_t)m->n_blocks * BATON_KV_BLOCK;
}

baton_dptr kv_k(const struct baton_model *m, uint32_t l)
{
	return m->kv + (uint64_t)l * 2 * kv_pool_rows(m) * kv_row(m);
}

baton_dptr kv_v(const struct baton_model *m, uint32_t l)
{
	return kv_k(m, l) + kv_pool_rows(m) * kv_row(m);
}

uint64_t model_kv_block_bytes(const struct baton_model *m)
{
	return (uint64_t)m->cfg.layers * 2 * BATON_KV_BLOCK * kv_row(m);
}

uint32_t kv_avail(const struct baton_model *m)
{
	return m->n_free + m->n_lru;
}

uint32_t kv_take(struct baton_model *m)
{
	/* no free one: kv_avail() said there is an evictable one */
	uint32_t id = m->n_free ? m->free_ids[--m->n_free] : kv_evict(m);
	m->blk[id].ref = 1;
	return id;
}

void kv_put(struct baton_model *m, uint32_t id)
{
	struct kv_blk *b = &m->blk[id];
	if (--b->ref)
		return;
	if (b->cached)
		kv_lru_push(m, id);
	else
		m->free_ids[m->n_free++] = id;
}

int kv_ensure(struct baton_model *m)
{
	if (m->kv)
		return 0;
	uint64_t bytes = (uint64_t)m->n_blocks * model_kv_block_bytes(m);
	int rc = m->be->alloc(m->dev, bytes, &m->kv);
	if (rc) {
		m->kv = 0;
		return rc;
	}
	m->kv_bytes = bytes;
	if (!m->n_saved || (rc = kv_restore(m)) == 0)
		return 0;
	m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
	return rc;
}

/* Gives blocks [keep, n_blocks) of s back to the pool, last first (so a
 * step undone leaves the stack as it found it). */
void kv_seq_shrink(struct baton_model *m, struct baton_seq *s, uint32_t keep)
{
	while (s->n_blocks > keep)
		kv_put(m, s->blocks[--s->n_blocks]);
	if (s->n_blocks == 0)
		s->chain_id = KV_NONE;
}

static void seq_empty(struct baton_model *m, struct baton_seq *s)
{
	kv_seq_shrink(m, s, 0);
	s->pos = 0;
	s->chain_id = KV_NONE;
}

void model_kv_release(struct baton_model *m)
{
	if (!m)
		return;
	for (struct baton_seq *s = m->seqs; s; s = s->next)
		seq_empty(m, s);
	if (m->kv && kv_save(m) != 0)
		kv_cache_drop(m); /* no host memory for them */
	if (m->kv)
		m->be->free(m->dev, m->kv);
	m->kv = 0;
	m->kv_bytes = 0;
}

uint64_t model_kv_bytes(const struct baton_model *m)
{
	return m->kv_bytes;
}

void model_reset(struct baton_model *m)
{
	if (!m || !m->def)
		return;
	seq_empty(m, m->def);
}

int model_seq_open(struct baton_model *m, struct baton_seq **out)
{
	if (!m || !out)
		return BATON_EINVAL;
	*out = NULL;
	struct baton_seq *s = calloc(1, sizeof *s);
	if (!s)
		return BATON_ENOMEM;
	if (!(s->blocks = malloc((size_t)m->seq_blocks * sizeof *s->blocks))) {
		free(s);
		return BATON_ENOMEM;
	}
	s->chain_id = KV_NONE;
	s->next = m->seqs;
	if (m->seqs)
		m->seqs->prev = s;
	m->seqs = s;
	*out = s;
	return 0;
}

void model_seq_close(struct baton_model *m, struct baton_seq *s)
{
	if (!m || !s)
		return;
	kv_seq_shrink(m, s, 0);
	if (s->prev)
		s->prev->next = s->next;
	else
		m->seqs = s->next;
	if (s->next)
		s->next->prev = s->prev;
	if (m->def == s)
		m->def = NULL;
	free(s->blocks);
	free(s);
}

uint32_t model_seq_pos(const struct baton_seq *s)
{
	return s ? s->pos : 0;
}

uint32_t model_kv_free_blocks(const struct baton_model *m)
{
	return kv_avail(m);
}

uint32_t model_kv_blocks_total(const struct baton_model *m)
{
	return m->n_blocks;
}

uint32_t model_seq_blocks_needed(const struct baton_model *m, const struct baton_seq *s,
    uint32_t n_more)
{
	(void)m;
	uint64_t end = (uint64_t)(s ? s->pos : 0) + n_more;
	uint64_t need = (end + BATON_KV_BLOCK - 1) / BATON_KV_BLOCK;
	uint32_t have = s ? s->n_blocks : 0;
	return need > have ? (uint32_t)(need - have) : 0;
}

int model_kv_alloc(struct baton_model *m)
{
	if (!m)
		return BATON_EINVAL;
	return kv_ensure(m);
}
