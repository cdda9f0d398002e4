/*
 * vocab.c: the vocabulary of a matcher: a trie of the tokens' bytes
 * (children contiguous, in byte order) and, for the fast path inside
 * strings, the "plain" tokens (a string body's bytes only, no escape) by
 * their character count.
 */
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"

struct bnode { /* build-time node: first child, next sibling */
	uint32_t child, next, tok_head;
	uint8_t byte;
};

int gram_vocab_new(gram_vocab **out, uint32_t n, const char *const *bytes, const size_t *lens,
    const uint8_t *usable)
{
	*out = NULL;
	gram_vocab *v = calloc(1, sizeof *v);
	if (!v)
		return BATON_ENOMEM;
	v->n = n;
	v->words = (n + 63) / 64;
	size_t total = 1;
	for (uint32_t i = 0; i < n; i++)
		if (!usable || usable[i])
			total += lens[i];
	struct bnode *b = malloc(total * sizeof *b);
	uint32_t *tok_next = malloc(((size_t)n + 1) * sizeof *tok_next);
	uint32_t root_child[256];
	int rc = BATON_ENOMEM;
	v->pool = malloc(total);
	v->off = calloc((size_t)n + 1, sizeof *v->off);
	v->len = calloc((size_t)n + 1, sizeof *v->len);
	if (!v->pool || !v->off || !v->len)
		goto out;
	size_t pool_at = 0;
	if (!b || !tok_next)
		goto out;
	for (int i = 0; i < 256; i++)
		root_child[i] = UINT32_MAX;
	b[0] = (struct bnode){ UINT32_MAX, UINT32_MAX, UINT32_MAX, 0 };
	uint32_t nb = 1;
	for (uint32_t t = 0; t < n; t++) {
		if ((usable && !usable[t]) || lens[t] == 0)
			continue;
		if (lens[t] > v->max_len)
			v->max_len = (uint32_t)lens[t];
		memcpy(v->pool + pool_at, bytes[t], lens[t]);
		v->off[t] = pool_at;
		v->len[t] = (uint32_t)lens[t];
		pool_at += lens[t];
		uint32_t at = 0;
		for (size_t j = 0; j < lens[t]; j++) {
			uint8_t c = (uint8_t)bytes[t][j];
			uint32_t ch;
			if (at == 0) {
				ch = root_child[c];
			} else {
				ch = b[at].child;
				while (ch != UINT32_MAX && b[ch].byte != c)
					ch = b[ch].next;
			}
			if (ch == UINT32_MAX) {
				ch = nb++;
				b[ch] = (struct bnode){ UINT32_MAX, UINT32_MAX, UINT32_MAX, c };
				if (at == 0)
					root_child[c] = ch;
				else {
					b[ch].next = b[at].child;
					b[at].child = ch;
				}
			}
			at = ch;
		}
		tok_next[t] = b[at].tok_head;
		b[at].tok_head = t;
	}
	/* Flatten breadth first, children by byte. */
	v->node = malloc((size_t)nb * sizeof *v->node);
	v->toks = malloc(((size_t)n + 1) * sizeof *v->toks);
	uint32_t *order = malloc((size_t)nb * sizeof *order);
	if (!v->node || !v->toks || !order) {
		free(order);
		goto out;
	}
	/* the root's children from root_child[]; others from their lists */
	order[0] = 0;
	uint32_t head = 0, tail = 1, ntok = 0;
	while (head < tail) {
		uint32_t src = order[head];
		struct tnode *d = &v->node[head];
		head++;
		uint32_t kids[256], nk = 0;
		if (src == 0) {
			for (int c = 0; c < 256; c++)
				if (root_child[c] != UINT32_MAX)
					kids[nk++] = root_child[c];
		} else {
			for (uint32_t ch = b[src].child; ch != UINT32_MAX; ch = b[ch].next)
				kids[nk++] = ch;
			/* sibling lists are newest first: sort by byte (insertion) */
			for (uint32_t i = 1; i < nk; i++)
				for (uint32_t j = i; j > 0 && b[kids[j - 1]].byte > b[kids[j]].byte; j--) {
					uint32_t x = kids[j];
					kids[j] = kids[j - 1];
					kids[j - 1] = x;
				}
		}
		d->byte = b[src].byte;
		d->first = tail;
		d->nchild = (uint16_t)nk;
		d->spec = 0;
		for (uint32_t i = 0; i < nk; i++)
			order[tail++] = kids[i];
		d->tok0 = ntok;
		d->ntok = 0;
		for (uint32_t t = b[src].tok_head; t != UINT32_MAX; t = tok_next[t]) {
			v->toks[ntok++] = t;
			d->ntok++;
		}
	}
	v->n_node = nb;
	free(order);
	/* spec: a '"' or '\\' edge at or below (children come after parents) */
	for (uint32_t i = nb; i-- > 0;) {
		struct tnode *d = &v->node[i];
		uint8_t s = i > 0 && (d->byte == '"' || d->byte == '\\');
		for (uint32_t k = 0; k < d->nchild && !s; k++)
			s = v->node[d->first + k].spec;
		d->spec = s;
	}
	/* plain tokens by character count */
	v->cum = calloc((size_t)(GV_CUM + 1) * v->words, sizeof *v->cum);
	uint32_t *cnt = malloc(((size_t)n + 1) * sizeof *cnt);
	if (!v->cum || !cnt) {
		free(cnt);
		goto out;
	}
	uint32_t n_long = 0;
	for (uint32_t t = 0; t < n; t++) {
		cnt[t] = UINT32_MAX;
		if ((usable && !usable[t]) || lens[t] == 0)
			continue;
		uint32_t sub = 0, c = 0;
		size_t j = 0;
		for (; j < lens[t]; j++) {
			uint8_t x = (uint8_t)bytes[t][j];
			if (x == '\\' || !gram_str_step(&sub, &c, UINT32_MAX - 1, x))
				break;
		}
		if (j < lens[t])
			continue;
		cnt[t] = c;
		if (c > GV_CUM)
			n_long++;
		else
			v->cum[(size_t)c * v->words + t / 64] |= 1ull << (t % 64);
	}
	for (uint32_t k = 1; k <= GV_CUM; k++)
		for (uint32_t w = 0; w < v->words; w++)
			v->cum[(size_t)k * v->words + w] |= v->cum[(size_t)(k - 1) * v->words + w];
	v->long_tok = malloc(((size_t)n_long + 1) * sizeof *v->long_tok);
	v->long_cnt = malloc(((size_t)n_long + 1) * sizeof *v->long_cnt);
	if (!v->long_tok || !v->long_cnt) {
		free(cnt);
		goto out;
	}
	for (uint32_t t = 0; t < n; t++)
		if (cnt[t] != UINT32_MAX && cnt[t] > GV_CUM) {
			uint32_t j = v->n_long++;
			while (j > 0 && v->long_cnt[j - 1] > cnt[t]) {
				v->long_cnt[j] = v->long_cnt[j - 1];
				v->long_tok[j] = v->long_tok[j - 1];
				j--;
			}
			v->long_cnt[j] = cnt[t];
			v->long_tok[j] = t;
		}
	free(cnt);
	rc = 0;
	*out = v;
out:
	free(b);
	free(tok_next);
	if (rc)
		gram_vocab_free(v);
	return rc;
}

int gram_vocab_from_tok(gram_vocab **out, const text_tok *t, uint32_t n_vocab,
    const uint32_t *except, size_t n_except, char *err, size_t errlen)
{
	*out = NULL;
	uint32_t tn = (uint32_t)text_vocab_size(t);
	char **bytes = calloc(n_vocab + 1, sizeof *bytes);
	size_t *lens = calloc(n_vocab + 1, sizeof *lens);
	uint8_t *usable = calloc(n_vocab + 1, 1);
	int rc = BATON_ENOMEM;
	if (!bytes || !lens || !usable)
		goto out;
	for (uint32_t i = 0; i < n_vocab && i < tn; i++) {
		int skip = text_is_special(t, (int32_t)i);
		for (size_t k = 0; k < n_except && !skip; k++)
			skip = except[k] == i;
		if (skip)
			continue;
		char buf[1024];
		size_t len;
		rc = text_token_bytes(t, (int32_t)i, buf, sizeof buf, &len);
		if (rc == BATON_ENOSPC)
			continue; /* a token over 1 KiB: never allowed */
		if (rc) {
			baton_errf(err, errlen, "the tokenizer cannot spell token %u as bytes (%s)", i,
			    baton_strerror(rc));
			goto out;
		}
		if (!(bytes[i] = malloc(len + 1))) {
			rc = BATON_ENOMEM;
			goto out;
		}
		memcpy(bytes[i], buf, len);
		lens[i] = len;
		usable[i] = len > 0;
	}
	rc = gram_vocab_new(out, n_vocab, (const char *const *)bytes, lens, usable);
out:
	if (bytes)
		for (uint32_t i = 0; i < n_vocab; i++)
			free(bytes[i]);
	free(bytes);
	free(lens);
	free(usable);
	return rc;
}

uint32_t gram_vocab_size(const gram_vocab *v)
{
	return v->n;
}

void gram_vocab_free(gram_vocab *v)
{
	if (!v)
		return;
	free(v->node);
	free(v->toks);
	free(v->cum);
	free(v->long_tok);
	free(v->long_cnt);
	free(v->pool);
	free(v->off);
	free(v->len);
	free(v);
}
