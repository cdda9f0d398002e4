/*
 * prefix.c: the prefix cache over kv.c's pool (docs/internals/prefix-cache.md):
 * full blocks keyed by a hash chain of their tokens, in a hash table, an
 * LRU list of those nobody holds, kept after their sequences let go of
 * them; and their copy in host memory while the pool is away (kv_save
 * for a release, kv_restore at the refill).
 */
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "engine/model/model_int.h"

/* ---- the cache's tables ---- */

static uint64_t now_ns(void)
{
	return (uint64_t)(baton_now_s() * 1e9);
}

int kv_cache_init(struct baton_model *m, const void *identity, size_t len)
{
	const char *cv = getenv("BATON_TEST_KV_HASH_COLLIDE");
	m->pc_collide = cv && strcmp(cv, "1") == 0;
	m->salt = XXH3_64bits_withSeed(identity, len, 0x6261746f6e6b76ull); /* "batonkv" */
	m->n_buckets = 16;
	while (m->n_buckets < m->n_blocks && m->n_buckets < (1u << 30))
		m->n_buckets <<= 1;
	m->blk = calloc(m->n_blocks, sizeof *m->blk);
	m->buckets = malloc((size_t)m->n_buckets * sizeof *m->buckets);
	if (!m->blk || !m->buckets)
		return BATON_ENOMEM;
	for (uint32_t i = 0; i < m->n_buckets; i++)
		m->buckets[i] = KV_NONE;
	for (uint32_t i = 0; i < m->n_blocks; i++)
		m->blk[i].prev = m->blk[i].next = m->blk[i].hnext = m->blk[i].parent = KV_NONE;
	m->lru_head = m->lru_tail = KV_NONE;
	return 0;
}

void kv_cache_free(struct baton_model *m)
{
	free(m->blk);
	m->blk = NULL;
	free(m->buckets);
	m->buckets = NULL;
}

static uint64_t block_hash(const struct baton_model *m, uint64_t seed, const uint32_t *toks)
{
	if (m->pc_collide)
		return 0;
	return XXH3_64bits_withSeed(toks, BATON_KV_BLOCK * sizeof *toks, seed);
}

static void lru_remove(struct baton_model *m, uint32_t id)
{
	struct kv_blk *b = &m->blk[id];
	if (b->prev != KV_NONE)
		m->blk[b->prev].next = b->next;
	else
		m->lru_head = b->next;
	if (b->next != KV_NONE)
		m->blk[b->next].prev = b->prev;
	else
		m->lru_tail = b->prev;
	b->prev = b->next = KV_NONE;
	m->n_lru--;
}

void kv_lru_push(struct baton_model *m, uint32_t id)
{
	struct kv_blk *b = &m->blk[id];
	b->next = KV_NONE;
	b->prev = m->lru_tail;
	if (m->lru_tail != KV_NONE)
		m->blk[m->lru_tail].next = id;
	else
		m->lru_head = id;
	m->lru_tail = id;
	m->n_lru++;
}

/* Out of the hash table (it leaves the cache: gen grows). */
static void unregister(struct baton_model *m, uint32_t id)
{
	struct kv_blk *b = &m->blk[id];
	uint32_t *pp = &m->buckets[b->hash & (m->n_buckets - 1)];
	while (*pp != KV_NONE && *pp != id)
		pp = &m->blk[*pp].hnext;
	if (*pp == id)
		*pp = b->hnext;
	b->hnext = KV_NONE;
	b->cached = 0;
	b->gen++;
	m->n_cached--;
}

/* The cached block of hash h, these tokens, after block parent (KV_NONE:
 * a sequence's first; else a cached block, its gen pgen now). */
static uint32_t find(const struct baton_model *m, uint64_t h, uint32_t parent, uint32_t pgen,
    const uint32_t *toks)
{
	for (uint32_t c = m->buckets[h & (m->n_buckets - 1)]; c != KV_NONE; c = m->blk[c].hnext) {
		const struct kv_blk *b = &m->blk[c];
		if (b->hash == h && b->parent == parent && (parent == KV_NONE || b->parent_gen == pgen) &&
		    memcmp(b->toks, toks, sizeof b->toks) == 0)
			return c;
	}
	return KV_NONE;
}

uint32_t kv_evict(struct baton_model *m)
{
	uint32_t id = m->lru_head;
	lru_remove(m, id);
	unregister(m, id);
	m->pst.evictions++;
	return id;
}

/* Block bi of s is full (its tokens in s->part): into the cache, unless
 * s's chain broke, or the same block is there already: another sequence
 * made it first (the same prompt read by two at once, n > 1); s then
 * holds that one and gives its own copy back (the rows are the same bits:
 * a row's K and V depend on its prefix alone). */
static void seq_block_full(struct baton_model *m, struct baton_seq *s, uint32_t bi)
{
	uint32_t parent = KV_NONE, pgen = 0;
	uint64_t seed = m->salt;
	if (bi) {
		parent = s->chain_id;
		pgen = s->chain_gen;
		if (parent == KV_NONE || !m->blk[parent].cached || m->blk[parent].gen != pgen) {
			s->chain_id = KV_NONE; /* its parent left the cache: nothing after it can be found */
			return;
		}
		seed = s->chain;
	}
	uint64_t h = block_hash(m, seed, s->part);
	uint32_t e = find(m, h, parent, pgen, s->part);
	if (e != KV_NONE && e != s->blocks[bi]) {
		if (m->blk[e].ref++ == 0)
			lru_remove(m, e);
		kv_put(m, s->blocks[bi]);
		s->blocks[bi] = e;
	} else if (e == KV_NONE) {
		e = s->blocks[bi];
		struct kv_blk *b = &m->blk[e];
		b->hash = h;
		b->parent = parent;
		b->parent_gen = pgen;
		memcpy(b->toks, s->part, sizeof b->toks);
		b->cached = 1;
		uint32_t *head = &m->buckets[h & (m->n_buckets - 1)];
		b->hnext = *head;
		*head = e;
		m->n_cached++;
	}
	s->chain = h;
	s->chain_id = e;
	s->chain_gen = m->blk[e].gen;
}

void kv_seq_fed(struct baton_model *m, struct baton_seq *s, const uint32_t *tokens, uint32_t n)
{
	if (!m->pc_on)
		return;
	for (uint32_t t = 0; t < n; t++) {
		uint32_t p = s->pos + t;
		s->part[p % BATON_KV_BLOCK] = tokens[t];
		if (p % BATON_KV_BLOCK == BATON_KV_BLOCK - 1)
			seq_block_full(m, s, p / BATON_KV_BLOCK);
	}
}

uint32_t model_prefix_peek(const struct baton_model *m, const uint32_t *tokens, uint32_t n,
    uint32_t *unheld)
{
	uint32_t got = 0, uh = 0;
	if (m && tokens && m->pc_on) {
		uint32_t max = n ? (n - 1) / BATON_KV_BLOCK : 0;
		if (max > m->seq_blocks)
			max = m->seq_blocks;
		uint32_t parent = KV_NONE, pgen = 0;
		uint64_t seed = m->salt;
		for (; got < max; got++) {
			const uint32_t *tk = tokens + (size_t)got * BATON_KV_BLOCK;
			uint64_t h = block_hash(m, seed, tk);
			uint32_t e = find(m, h, parent, pgen, tk);
			if (e == KV_NONE)
				break;
			uh += m->blk[e].ref == 0;
			seed = h;
			parent = e;
			pgen = m->blk[e].gen;
		}
	}
	if (unheld)
		*unheld = uh;
	return got * BATON_KV_BLOCK;
}

uint32_t model_seq_prefix(struct baton_model *m, struct baton_seq *s, const uint32_t *tokens,
    uint32_t n)
{
	if (!m || !s || !tokens || !m->pc_on || s->pos || s->n_blocks)
		return 0;
	m->pst.lookups++;
	m->pst.lookup_tokens += n;
	uint32_t max = n ? (n - 1) / BATON_KV_BLOCK : 0;
	if (max > m->seq_blocks)
		max = m->seq_blocks;
	uint32_t parent = KV_NONE, pgen = 0;
	uint64_t seed = m->salt;
	for (uint32_t bi = 0; bi < max; bi++) {
		const uint32_t *tk = tokens + (size_t)bi * BATON_KV_BLOCK;
		uint64_t h = block_hash(m, seed, tk);
		uint32_t e = find(m, h, parent, pgen, tk);
		if (e == KV_NONE)
			break;
		struct kv_blk *b = &m->blk[e];
		if (b->ref++ == 0)
			lru_remove(m, e);
		s->blocks[s->n_blocks++] = e;
		s->chain = seed = h;
		s->chain_id = parent = e;
		s->chain_gen = pgen = b->gen;
	}
	s->pos = s->n_blocks * BATON_KV_BLOCK;
	m->pst.hit_tokens += s->pos;
	return s->pos;
}

void kv_cache_drop(struct baton_model *m)
{
	while (m->lru_head != KV_NONE) {
		uint32_t id = m->lru_head;
		lru_remove(m, id);
		unregister(m, id);
		m->free_ids[m->n_free++] = id;
	}
}

/* ---- host memory while the pool is away ---- */

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

/* The copies between the pool and the host image of n blocks (ids
 * ascending; the image holds per layer its K rows of the n, then its V
 * rows): per layer, run of consecutive ids and half, K before V, with the
 * device side as dst and the image's as src. Into cp (NULL: only
 * counted); their count. */
static size_t kv_copies(const struct baton_model *m, const uint32_t *ids, uint32_t n, const uint8_t *image,
    struct baton_copy *cp)
{
	const uint64_t half = BATON_KV_BLOCK * kv_row(m);
	size_t c = 0;
	for (uint32_t l = 0; l < m->cfg.layers; l++)
		for (uint32_t k = 0; k < n;) {
			uint32_t r = 1;
			while (k + r < n && ids[k + r] == ids[k] + r)
				r++;
			uint64_t at = (uint64_t)ids[k] * half;
			const uint8_t *src = image + ((uint64_t)l * 2 * n + k) * half;
			if (cp) {
				cp[c] = (struct baton_copy){ .dst = kv_k(m, l) + at, .src = src, .bytes = r * half };
				cp[c + 1] = (struct baton_copy){ .dst = kv_v(m, l) + at, .src = src + n * half,
					.bytes = r * half };
			}
			c += 2;
			k += r;
		}
	return c;
}

int kv_restore(struct baton_model *m)
{
	/* the saved blocks back where they were, all queued in one batch */
	uint64_t t0 = now_ns();
	size_t nc = kv_copies(m, m->saved_ids, m->n_saved, m->kv_saved, NULL);
	struct baton_copy *cp = malloc(nc * sizeof *cp);
	if (!cp)
		return BATON_ENOMEM;
	kv_copies(m, m->saved_ids, m->n_saved, m->kv_saved, cp);
	int rc = m->be->copy_h2d(m->dev, cp, nc);
	if (!rc)
		rc = m->be->sync(m->dev);
	free(cp);
	if (rc)
		return rc;
	m->pst.restored_blocks += m->n_saved;
	m->pst.last_restore_s = (double)(now_ns() - t0) / 1e9;
	kv_drop_saved(m);
	return 0;
}

void kv_drop_saved(struct baton_model *m)
{
	if (m->kv_saved && m->saved_pinned)
		backend_host_unregister(m->be, m->dev, m->kv_saved, m->saved_bytes);
	free(m->kv_saved);
	m->kv_saved = NULL;
	free(m->saved_ids);
	m->saved_ids = NULL;
	m->n_saved = 0;
	m->saved_bytes = 0;
	m->saved_pinned = 0;
}

int kv_save(struct baton_model *m)
{
	if (!m->kv)
		return 0;
	const uint64_t bb = model_kv_block_bytes(m);
	uint32_t held = 0;
	for (uint32_t i = 0; i < m->n_blocks; i++)
		held += m->blk[i].ref > 0;
	/* unheld cached ones, most recently used first, while they fit */
	uint32_t keep = 0;
	for (uint32_t id = m->lru_tail; id != KV_NONE; id = m->blk[id].prev) {
		if ((uint64_t)(held + keep + 1) * bb > m->host_limit)
			break;
		keep++;
	}
	uint32_t n = held + keep, k = 0;
	if (n == 0) {
		m->pst.host_dropped += m->n_lru;
		kv_cache_drop(m);
		return 0;
	}
	uint8_t *save = aligned_alloc(4096, (n * bb + 4095) / 4096 * 4096); /* pinned whole pages */
	uint32_t *ids = malloc(n * sizeof *ids);
	int rc = BATON_ENOMEM;
	if (!save || !ids)
		goto fail;
	for (uint32_t i = 0; i < m->n_blocks; i++)
		if (m->blk[i].ref)
			ids[k++] = i;
	for (uint32_t id = m->lru_tail; k < n; id = m->blk[id].prev)
		ids[k++] = id;
	qsort(ids, n, sizeof *ids, cmp_u32);
	int pinned = 0;
	size_t nc = kv_copies(m, ids, n, save, NULL);
	struct baton_copy *cp = malloc(nc * sizeof *cp);
	rc = cp ? m->be->sync(m->dev) : BATON_ENOMEM;
	if (!rc)
		kv_copies(m, ids, n, save, cp);
	for (size_t c = 0; !rc && c < nc; c++) /* the image's side is save's own bytes */
		rc = m->be->copy_d2h(m->dev, save + ((const uint8_t *)cp[c].src - save), cp[c].dst, cp[c].bytes);
	free(cp);
	if (rc)
		goto unpin;
	/* pinned after it is written, for the copy back (the refill, on the
	 * next request's path): the device only reads it then, and the cuda
	 * backend pins read-only where the device can (for the arena) */
	pinned = backend_host_register(m->be, m->dev, save, n * bb) == 0;
	/* past the bound: out of the cache (the least recently used) */
	uint32_t skip = keep;
	for (uint32_t id = m->lru_tail; id != KV_NONE;) {
		uint32_t prev = m->blk[id].prev;
		if (skip) {
			skip--;
		} else {
			lru_remove(m, id);
			unregister(m, id);
			m->free_ids[m->n_free++] = id;
			m->pst.host_dropped++;
		}
		id = prev;
	}
	kv_drop_saved(m);
	m->kv_saved = save;
	m->saved_ids = ids;
	m->n_saved = n;
	m->saved_bytes = n * bb;
	m->saved_pinned = pinned;
	return 0;
unpin:
	if (pinned)
		backend_host_unregister(m->be, m->dev, save, n * bb);
fail:
	free(save);
	free(ids);
	return rc;
}

void model_prefix_stats(const struct baton_model *m, struct baton_prefix_stats *st)
{
	*st = m->pst;
	st->enabled = m->pc_on;
	st->cached_blocks = m->n_cached;
	st->evictable_blocks = m->n_lru;
	st->host_bytes = m->saved_bytes;
	st->host_blocks = m->n_saved;
	st->host_limit = m->host_limit;
}

void model_prefix_test_collide(struct baton_model *m, int on)
{
	m->pc_collide = on;
}

uint32_t model_seq_block_refs(const struct baton_model *m, const struct baton_seq *s, uint32_t b)
{
	return s && b < s->n_blocks ? m->blk[s->blocks[b]].ref : 0;
}

uint32_t model_seq_block_id(const struct baton_seq *s, uint32_t b)
{
	return s && b < s->n_blocks ? s->blocks[b] : KV_NONE;
}
