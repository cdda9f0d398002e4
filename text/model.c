/*
 * model.c: the two ways a word becomes ids.
 *
 * tx_bpe_word is Hugging Face's BPE (tokenizers/src/models/bpe): symbols are
 * the word's characters (byte fallback or unk for those outside the
 * vocabulary), then the pair of lowest merge rank is merged first, the
 * leftmost on a tie, until no pair merges.
 *
 * tx_spm_word is SentencePiece's BPE as llama.cpp runs it from a GGUF's
 * scores (llm_tokenizer_spm): the adjacent pair whose concatenation is a
 * piece of highest score is merged first, the leftmost on a tie; a
 * character that is no piece becomes its bytes' <0xXX> tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "text/text_int.h"

struct sym {
	int32_t id;
	int32_t prev, next;
	uint32_t off, len; /* SPM: the bytes this symbol covers */
};

struct heap_item {
	float score; /* SPM */
	int32_t rank, pos, id;
	uint32_t size;
};

struct heap {
	struct heap_item *a;
	size_t n, cap;
	bool spm;
};

/* BPE: lowest rank first, then leftmost. SPM: highest score, then leftmost. */
static bool before(const struct heap *h, const struct heap_item *x, const struct heap_item *y)
{
	if (h->spm) {
		if (x->score != y->score)
			return x->score > y->score;
		return x->pos < y->pos;
	}
	if (x->rank != y->rank)
		return x->rank < y->rank;
	return x->pos < y->pos;
}

static int heap_push(struct heap *h, struct heap_item it)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 64;
		struct heap_item *a = realloc(h->a, cap * sizeof(*a));
		if (!a)
			return BATON_ENOMEM;
		h->a = a;
		h->cap = cap;
	}
	size_t i = h->n++;
	h->a[i] = it;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!before(h, &h->a[i], &h->a[p]))
			break;
		struct heap_item tmp = h->a[i];
		h->a[i] = h->a[p];
		h->a[p] = tmp;
		i = p;
	}
	return 0;
}

static struct heap_item heap_pop(struct heap *h)
{
	struct heap_item top = h->a[0];
	h->a[0] = h->a[--h->n];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->n && before(h, &h->a[l], &h->a[m]))
			m = l;
		if (r < h->n && before(h, &h->a[r], &h->a[m]))
			m = r;
		if (m == i)
			break;
		struct heap_item tmp = h->a[i];
		h->a[i] = h->a[m];
		h->a[m] = tmp;
		i = m;
	}
	return top;
}

static int out_push(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;
		int32_t *p = realloc(*ids, c * sizeof(*p));
		if (!p)
			return BATON_ENOMEM;
		*ids = p;
		*cap = c;
	}
	(*ids)[(*n)++] = id;
	return 0;
}

static int sym_push(struct sym **s, size_t *n, size_t *cap, int32_t id, uint32_t off, uint32_t len)
{
	if (*n == *cap) {
		size_t c = *cap ? *cap * 2 : 64;
		struct sym *p = realloc(*s, c * sizeof(*p));
		if (!p)
			return BATON_ENOMEM;
		*s = p;
		*cap = c;
	}
	(*s)[*n] = (struct sym){id, (int32_t)*n - 1, (int32_t)*n + 1, off, len};
	(*n)++;
	return 0;
}

int tx_bpe_word(const text_tok *t, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap)
{
	if (n == 0)
		return 0;
	if (t->ignore_merges) {
		int32_t id = tx_smap_get(&t->vocab, w, n);
		if (id >= 0)
			return out_push(ids, nids, cap, id);
	}
	struct sym *s = NULL;
	size_t ns = 0, scap = 0;
	struct heap h = {0};
	int rc = 0;
	int32_t unk_pending = -1;
	const unsigned char *u = (const unsigned char *)w;
	for (size_t i = 0; i < n;) {
		size_t l = tx_utf8_len(u + i, n - i);
		if (!l)
			l = 1; /* callers pass valid UTF-8; be safe anyway */
		int32_t id = tx_smap_get(&t->vocab, w + i, l);
		if (id >= 0) {
			if (unk_pending >= 0 && (rc = sym_push(&s, &ns, &scap, unk_pending, 0, 0)))
				goto out;
			unk_pending = -1;
			if ((rc = sym_push(&s, &ns, &scap, id, 0, 0)))
				goto out;
		} else {
			bool done = false;
			if (t->byte_fallback) {
				bool all = true;
				for (size_t j = 0; j < l; j++)
					all = all && t->byte_tok[u[i + j]] >= 0;
				if (all) {
					for (size_t j = 0; j < l; j++)
						if ((rc = sym_push(&s, &ns, &scap, t->byte_tok[u[i + j]], 0, 0)))
							goto out;
					done = true;
				}
			}
			if (!done && t->unk >= 0) {
				if (unk_pending >= 0 && !t->fuse_unk &&
				    (rc = sym_push(&s, &ns, &scap, unk_pending, 0, 0)))
					goto out;
				unk_pending = t->unk;
			}
		}
		i += l;
	}
	if (unk_pending >= 0 && (rc = sym_push(&s, &ns, &scap, unk_pending, 0, 0)))
		goto out;
	if (ns == 0)
		goto out;
	s[ns - 1].next = -1;
	for (size_t i = 0; i + 1 < ns; i++) {
		int32_t rank, id;
		if (tx_pmap_get(&t->merges, s[i].id, s[i + 1].id, &rank, &id) &&
		    (rc = heap_push(&h, (struct heap_item){0, rank, (int32_t)i, id, 0})))
			goto out;
	}
	while (h.n) {
		struct heap_item top = heap_pop(&h);
		struct sym *a = &s[top.pos];
		if (a->id < 0 || a->next < 0)
			continue;
		struct sym *b = &s[a->next];
		int32_t rank, id;
		if (!tx_pmap_get(&t->merges, a->id, b->id, &rank, &id) || id != top.id)
			continue; /* stale: one side has changed since */
		a->id = id;
		int32_t bn = b->next;
		b->id = -1;
		a->next = bn;
		if (bn >= 0)
			s[bn].prev = top.pos;
		if (a->prev >= 0 && tx_pmap_get(&t->merges, s[a->prev].id, a->id, &rank, &id) &&
		    (rc = heap_push(&h, (struct heap_item){0, rank, a->prev, id, 0})))
			goto out;
		if (bn >= 0 && tx_pmap_get(&t->merges, a->id, s[bn].id, &rank, &id) &&
		    (rc = heap_push(&h, (struct heap_item){0, rank, top.pos, id, 0})))
			goto out;
	}
	for (int32_t i = 0; i >= 0; i = s[i].next)
		if ((rc = out_push(ids, nids, cap, s[i].id)))
			goto out;
out:
	free(s);
	free(h.a);
	return rc;
}

static int spm_bigram(const text_tok *t, const char *w, struct sym *s, int32_t l, struct heap *h)
{
	if (l < 0 || s[l].next < 0)
		return 0;
	struct sym *a = &s[l], *b = &s[a->next];
	int32_t id = tx_smap_get(&t->vocab, w + a->off, a->len + b->len);
	if (id < 0)
		return 0;
	return heap_push(h, (struct heap_item){t->score[id], 0, l, id, a->len + b->len});
}

int tx_spm_word(const text_tok *t, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap)
{
	if (n == 0)
		return 0;
	struct sym *s = NULL;
	size_t ns = 0, scap = 0;
	struct heap h = {.spm = true};
	int rc = 0;
	const unsigned char *u = (const unsigned char *)w;
	for (size_t i = 0; i < n;) {
		size_t l = tx_utf8_len(u + i, n - i);
		if (!l)
			l = 1;
		if ((rc = sym_push(&s, &ns, &scap, 0, (uint32_t)i, (uint32_t)l)))
			goto out;
		i += l;
	}
	s[ns - 1].next = -1;
	for (size_t i = 0; i + 1 < ns; i++)
		if ((rc = spm_bigram(t, w, s, (int32_t)i, &h)))
			goto out;
	while (h.n) {
		struct heap_item top = heap_pop(&h);
		struct sym *a = &s[top.pos];
		if (a->len == 0 || a->next < 0)
			continue;
		struct sym *b = &s[a->next];
		if (a->len + b->len != top.size)
			continue; /* stale */
		a->len += b->len;
		b->len = 0;
		a->next = b->next;
		if (a->next >= 0)
			s[a->next].prev = top.pos;
		if ((rc = spm_bigram(t, w, s, a->prev, &h)) || (rc = spm_bigram(t, w, s, top.pos, &h)))
			goto out;
	}
	for (int32_t i = 0; i >= 0; i = s[i].next) {
		int32_t id = tx_smap_get(&t->vocab, w + s[i].off, s[i].len);
		if (id >= 0) {
			if ((rc = out_push(ids, nids, cap, id)))
				goto out;
			continue;
		}
		for (uint32_t j = 0; j < s[i].len; j++) {
			int32_t b = t->byte_tok[u[s[i].off + j]];
			if (b < 0)
				b = t->unk;
			if (b >= 0 && (rc = out_push(ids, nids, cap, b)))
				goto out;
		}
	}
out:
	free(s);
	free(h.a);
	return rc;
}
