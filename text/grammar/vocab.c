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

/* A trie of the tokens t with inc[t], spelled by p[t] (l[t] bytes):
 * nodes breadth first, children contiguous in byte order. */
static int build_trie(uint32_t n, const char *const *p, const size_t *l, const uint8_t *inc,
    struct tnode **node_out, struct tkid **kids_out, uint32_t *n_node_out, uint32_t **toks_out)
{
	size_t total = 1;
	for (uint32_t i = 0; i < n; i++)
		if (inc[i])
			total += l[i];
	struct bnode *b = malloc(total * sizeof *b);
	uint32_t *tok_next = malloc(((size_t)n + 1) * sizeof *tok_next);
	struct tnode *node = NULL;
	uint32_t *toks = malloc(((size_t)n + 1) * sizeof *toks), *order = NULL, *kids = NULL;
	uint32_t root_child[256];
	int rc = BATON_ENOMEM;
	if (!b || !tok_next || !toks)
		goto out;
	for (int i = 0; i < 256; i++)
		root_child[i] = UINT32_MAX;
	b[0] = (struct bnode){ UINT32_MAX, UINT32_MAX, UINT32_MAX, 0 };
	uint32_t nb = 1;
	for (uint32_t t = 0; t < n; t++) {
		if (!inc[t])
			continue;
		uint32_t at = 0;
		for (size_t j = 0; j < l[t]; j++) {
			uint8_t c = (uint8_t)p[t][j];
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
	node = malloc((size_t)nb * sizeof *node);
	order = malloc((size_t)nb * sizeof *order); /* build node -> final index */
	kids = malloc((size_t)nb * sizeof *kids);
	uint32_t *stack = malloc(((size_t)nb + 1) * sizeof *stack);
	if (!node || !order || !kids || !stack) {
		free(stack);
		goto out;
	}
	/* depth first, children by byte: a node's subtree is one range of
	 * nodes and of tokens */
	uint32_t n_out = 0, ntok = 0, sp = 0, nk_all = 0;
	stack[sp++] = 0;
	while (sp) {
		uint32_t src = stack[--sp];
		uint32_t me = n_out++;
		order[src] = me;
		struct tnode *d = &node[me];
		d->byte = b[src].byte;
		d->tok0 = ntok;
		d->ntok = 0;
		for (uint32_t t = b[src].tok_head; t != UINT32_MAX; t = tok_next[t]) {
			toks[ntok++] = t;
			d->ntok++;
		}
		uint32_t kl[256], nk = 0;
		if (src == 0) {
			for (int c = 0; c < 256; c++)
				if (root_child[c] != UINT32_MAX)
					kl[nk++] = root_child[c];
		} else {
			for (uint32_t ch = b[src].child; ch != UINT32_MAX; ch = b[ch].next)
				kl[nk++] = ch;
			for (uint32_t i = 1; i < nk; i++) /* newest first: sort by byte */
				for (uint32_t j = i; j > 0 && b[kl[j - 1]].byte > b[kl[j]].byte; j--) {
					uint32_t x = kl[j];
					kl[j] = kl[j - 1];
					kl[j - 1] = x;
				}
		}
		d->nchild = (uint16_t)nk;
		d->first = nk_all;
		for (uint32_t i = 0; i < nk; i++)
			kids[nk_all++] = kl[i]; /* build ids for now */
		for (uint32_t i = nk; i-- > 0;)
			stack[sp++] = kl[i];
	}
	free(stack);
	for (uint32_t i = 0; i < nk_all; i++)
		kids[i] = order[kids[i]];
	/* bottom up (children come after parents): the token ranges, spec, pure, height */
	for (uint32_t i = nb; i-- > 0;) {
		struct tnode *d = &node[i];
		uint8_t bs = i > 0 && d->byte == '\\', pure = 1, pureq = 1;
		uint32_t end = d->tok0 + d->ntok, h = 0;
		for (uint32_t k = 0; k < d->nchild; k++) {
			const struct tnode *c = &node[kids[d->first + k]];
			bs |= c->spec;
			int ascii = c->byte >= 0x20 && c->byte < 0x7f && c->byte != '"' && c->byte != '\\';
			pure &= c->pure && ascii;
			pureq &= (c->pureq && ascii) || (c->byte == '"' && c->nchild == 0);
			if (c->tok_end > end)
				end = c->tok_end;
			if ((uint32_t)c->height + 1 > h)
				h = (uint32_t)c->height + 1;
		}
		d->spec = bs;
		d->pure = pure;
		d->pureq = pureq;
		d->tok_end = end;
		d->height = (uint8_t)(h > 255 ? 255 : h);
	}
	struct tkid *kv = malloc((size_t)nb * sizeof *kv);
	if (!kv)
		goto out;
	for (uint32_t i = 0; i < nb; i++) {
		uint32_t at = node[i].first, ns = 0;
		for (int pass = 0; pass < 2; pass++) /* spec children first */
			for (uint32_t k = 0; k < node[i].nchild; k++) {
				uint32_t c = kids[node[i].first + k];
				if (node[c].spec != (pass == 0))
					continue;
				kv[at++] = (struct tkid){ c, node[c].byte, node[c].spec, { 0, 0 } };
				ns += pass == 0;
			}
		node[i].nspec = (uint16_t)ns;
	}
	*node_out = node;
	*kids_out = kv;
	*n_node_out = nb;
	*toks_out = toks;
	node = NULL;
	toks = NULL;
	rc = 0;
out:
	free(b);
	free(tok_next);
	free(order);
	free(node);
	free(kids);
	free(toks);
	return rc;
}

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
	uint8_t *inc = calloc((size_t)n + 1, 1), *qinc = calloc((size_t)n + 1, 1);
	uint8_t *binc = calloc((size_t)n + 1, 1);
	const char **qp = calloc((size_t)n + 1, sizeof *qp), **bp = calloc((size_t)n + 1, sizeof *bp);
	size_t *ql = calloc((size_t)n + 1, sizeof *ql), *bl = calloc((size_t)n + 1, sizeof *bl);
	uint32_t *cnt = malloc(((size_t)n + 1) * sizeof *cnt);
	int rc = BATON_ENOMEM;
	v->pool = malloc(total);
	v->off = calloc((size_t)n + 1, sizeof *v->off);
	v->len = calloc((size_t)n + 1, sizeof *v->len);
	v->qcnt = calloc((size_t)n + 1, sizeof *v->qcnt);
	v->cum = calloc((size_t)(GV_CUM + 1) * v->words, sizeof *v->cum);
	if (!inc || !qinc || !qp || !ql || !binc || !bp || !bl || !cnt || !v->pool || !v->off || !v->len || !v->qcnt || !v->cum)
		goto out;
	size_t pool_at = 0;
	uint32_t n_long = 0;
	for (uint32_t t = 0; t < n; t++) {
		cnt[t] = UINT32_MAX;
		if ((usable && !usable[t]) || lens[t] == 0)
			continue;
		inc[t] = 1;
		if (lens[t] > v->max_len)
			v->max_len = (uint32_t)lens[t];
		memcpy(v->pool + pool_at, bytes[t], lens[t]);
		v->off[t] = pool_at;
		v->len[t] = (uint32_t)lens[t];
		pool_at += lens[t];
		/* plain (a string body's bytes to the end), or a plain prefix and a '"' */
		uint32_t sub = 0, c = 0;
		size_t j = 0;
		for (; j < lens[t]; j++) {
			uint8_t x = (uint8_t)bytes[t][j];
			if (x == '\\' || !gram_str_step(&sub, &c, UINT32_MAX - 1, x))
				break;
		}
		if (j < lens[t]) {
			if (bytes[t][j] == '"' && sub == 0) {
				qinc[t] = 1;
				qp[t] = bytes[t] + j;
				ql[t] = lens[t] - j;
				v->qcnt[t] = c;
			} else if (bytes[t][j] == '\\' && sub == 0) {
				binc[t] = 1;
				bp[t] = bytes[t] + j;
				bl[t] = lens[t] - j;
			}
			continue;
		}
		cnt[t] = c;
		if (c > GV_CUM)
			n_long++;
		else
			v->cum[(size_t)c * v->words + t / 64] |= 1ull << (t % 64);
	}
	if ((rc = build_trie(n, bytes, lens, inc, &v->node, &v->kids, &v->n_node, &v->toks)) != 0 ||
	    (rc = build_trie(n, qp, ql, qinc, &v->qnode, &v->qkids, &v->n_qnode, &v->qtoks)) != 0 ||
	    (rc = build_trie(n, bp, bl, binc, &v->bnode, &v->bkids, &v->n_bnode, &v->btoks)) != 0)
		goto out;
	rc = BATON_ENOMEM;
	size_t nq = v->qnode[0].tok_end;
	if (!(v->qtokc = malloc((nq + 1) * sizeof *v->qtokc)))
		goto out;
	for (size_t i = 0; i < nq; i++)
		v->qtokc[i] = v->qcnt[v->qtoks[i]];
	for (uint32_t k = 1; k <= GV_CUM; k++)
		for (uint32_t w = 0; w < v->words; w++)
			v->cum[(size_t)k * v->words + w] |= v->cum[(size_t)(k - 1) * v->words + w];
	v->long_tok = malloc(((size_t)n_long + 1) * sizeof *v->long_tok);
	v->long_cnt = malloc(((size_t)n_long + 1) * sizeof *v->long_cnt);
	if (!v->long_tok || !v->long_cnt)
		goto out;
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
	rc = 0;
	*out = v;
out:
	free(inc);
	free(qinc);
	free(qp);
	free(ql);
	free(binc);
	free(bp);
	free(bl);
	free(cnt);
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
	free(v->qnode);
	free(v->kids);
	free(v->qkids);
	free(v->bnode);
	free(v->bkids);
	free(v->btoks);
	free(v->qtoks);
	free(v->qcnt);
	free(v->qtokc);
	free(v->cum);
	free(v->long_tok);
	free(v->long_cnt);
	free(v->pool);
	free(v->off);
	free(v->len);
	free(v);
}
