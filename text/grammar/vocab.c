/*
 * vocab.c: the vocabulary of a matcher: a trie of the tokens' bytes
 * (children contiguous, in byte order) and, for the fast path inside
 * strings, the "plain" tokens (a string body's bytes only, no escape) by
 * their character count.
 */
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"

/* Sorting the tokens by their bytes (then length, then id) builds the
 * trie in one pass, depth first, children in byte order. */
static const char *const *sort_p;
static const size_t *sort_l;

static int cmp_tok(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
	size_t la = sort_l[a], lb = sort_l[b], m = la < lb ? la : lb;
	int c = memcmp(sort_p[a], sort_p[b], m);
	if (c)
		return c;
	if (la != lb)
		return la < lb ? -1 : 1;
	return a < b ? -1 : a > b;
}

/* A trie of the tokens t with inc[t], spelled by p[t] (l[t] bytes):
 * nodes depth first (a subtree is one range of nodes and of tokens), each
 * node's children listed together, those with spec first. */
static int build_trie(uint32_t n, const char *const *p, const size_t *l, const uint8_t *inc,
    struct tnode **node_out, struct tkid **kids_out, uint32_t *n_node_out, uint32_t **toks_out)
{
	size_t total = 1;
	uint32_t nt = 0;
	for (uint32_t i = 0; i < n; i++)
		if (inc[i]) {
			total += l[i];
			nt++;
		}
	uint32_t *ord = malloc(((size_t)nt + 1) * sizeof *ord);
	uint32_t *toks = malloc(((size_t)nt + 1) * sizeof *toks);
	struct tnode *node = calloc(total, sizeof *node);
	uint32_t *parent = malloc(total * sizeof *parent), *path = NULL, *fill = NULL;
	struct tkid *kv = NULL;
	int rc = BATON_ENOMEM;
	if (!ord || !toks || !node || !parent)
		goto out;
	nt = 0;
	for (uint32_t i = 0; i < n; i++)
		if (inc[i])
			ord[nt++] = i;
	sort_p = p;
	sort_l = l;
	qsort(ord, nt, sizeof *ord, cmp_tok);
	size_t maxl = 0;
	for (uint32_t i = 0; i < nt; i++)
		maxl = l[ord[i]] > maxl ? l[ord[i]] : maxl;
	if (!(path = malloc((maxl + 1) * sizeof *path)))
		goto out;
	/* path[d]: the node at depth d of the previous token's spelling */
	uint32_t nb = 1, depth = 0;
	path[0] = 0;
	parent[0] = UINT32_MAX;
	for (uint32_t i = 0; i < nt; i++) {
		uint32_t t = ord[i];
		size_t lcp = 0;
		if (i) {
			uint32_t q = ord[i - 1];
			size_t m = l[q] < l[t] ? l[q] : l[t];
			while (lcp < m && p[q][lcp] == p[t][lcp])
				lcp++;
		}
		if (lcp > depth)
			lcp = depth;
		depth = (uint32_t)lcp;
		for (size_t j = lcp; j < l[t]; j++) {
			uint32_t me = nb++;
			node[me].byte = (uint8_t)p[t][j];
			node[me].tok0 = i;
			parent[me] = path[depth];
			node[path[depth]].nchild++;
			path[++depth] = me;
		}
		node[path[depth]].ntok++; /* the node's own tokens come first in its range */
		toks[i] = t;
	}
	node[0].tok0 = 0;
	/* children together, in creation (byte) order; spec first below */
	uint32_t *kids = malloc((size_t)nb * sizeof *kids);
	fill = calloc(nb, sizeof *fill);
	kv = malloc((size_t)nb * sizeof *kv);
	if (!kids || !fill || !kv) {
		free(kids);
		goto out;
	}
	uint32_t at = 0;
	for (uint32_t i = 0; i < nb; i++) {
		node[i].first = at;
		at += node[i].nchild;
	}
	for (uint32_t i = 1; i < nb; i++)
		kids[node[parent[i]].first + fill[parent[i]]++] = i;
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
	for (uint32_t i = 0; i < nb; i++) {
		uint32_t w = node[i].first, ns = 0;
		for (int pass = 0; pass < 2; pass++) /* spec children first */
			for (uint32_t k = 0; k < node[i].nchild; k++) {
				uint32_t c = kids[node[i].first + k];
				if (node[c].spec != (pass == 0))
					continue;
				kv[w++] = (struct tkid){ c, node[c].byte, node[c].spec, { 0, 0 } };
				ns += pass == 0;
			}
		node[i].nspec = (uint16_t)ns;
	}
	free(kids);
	struct tnode *shrunk = realloc(node, (size_t)nb * sizeof *node);
	*node_out = shrunk ? shrunk : node;
	*kids_out = kv;
	*n_node_out = nb;
	*toks_out = toks;
	node = NULL;
	toks = NULL;
	kv = NULL;
	rc = 0;
out:
	free(ord);
	free(toks);
	free(node);
	free(parent);
	free(path);
	free(fill);
	free(kv);
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
				if (lens[t] > v->bmax)
					v->bmax = (uint32_t)lens[t];
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
