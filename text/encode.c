/*
 * encode.c: text to ids, in Hugging Face's order: added tokens matched on
 * the raw text (leftmost, longest); each stretch between them normalised,
 * then the normalised added tokens matched; the pre-tokenizer splits what
 * is left into words; the model turns each word into ids; the
 * post-processor adds BOS/EOS.
 */
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#include <utf8proc.h>

#include "text/text_int.h"

/* ---- normalisers ------------------------------------------------------------ */

static int replace_all(struct tbuf *out, const char *s, size_t n, const char *pat,
                       const char *with)
{
	size_t pn = strlen(pat), wn = strlen(with), run = 0;
	for (size_t i = 0; i + pn <= n;) {
		if (memcmp(s + i, pat, pn) == 0) {
			if (tx_tbuf_put(out, s + run, i - run) || tx_tbuf_put(out, with, wn))
				return BATON_ENOMEM;
			i += pn;
			run = i;
		} else
			i++;
	}
	return tx_tbuf_put(out, s + run, n - run);
}

int text_normalize(const text_tok *t, const char *s, size_t n, struct tbuf *out)
{
	struct tbuf a = {0}, b = {0};
	if (tx_tbuf_put(&a, s, n))
		return BATON_ENOMEM;
	for (size_t i = 0; i < t->n_norm; i++) {
		const struct norm_step *st = &t->norm[i];
		b.n = 0;
		int rc = 0;
		switch (st->kind) {
		case N_NFC:
		case N_NFD:
		case N_NFKC:
		case N_NFKD: {
			utf8proc_option_t o = UTF8PROC_STABLE;
			o |= (st->kind == N_NFC || st->kind == N_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
			if (st->kind == N_NFKC || st->kind == N_NFKD)
				o |= UTF8PROC_COMPAT;
			utf8proc_uint8_t *d = NULL;
			utf8proc_ssize_t dn = a.n ? utf8proc_map((const utf8proc_uint8_t *)a.p,
			                                        (utf8proc_ssize_t)a.n, &d, o)
			                          : 0;
			if (dn < 0) {
				rc = dn == UTF8PROC_ERROR_NOMEM ? BATON_ENOMEM : BATON_EINVAL;
			} else
				rc = tx_tbuf_put(&b, d, (size_t)dn);
			free(d);
			break;
		}
		case N_PREPEND:
			if (a.n)
				rc = tx_tbuf_put(&b, st->a, strlen(st->a));
			rc |= tx_tbuf_put(&b, a.p, a.n);
			break;
		case N_REPLACE:
			rc = replace_all(&b, a.p, a.n, st->a, st->b);
			break;
		}
		if (rc) {
			tx_tbuf_free(&a);
			tx_tbuf_free(&b);
			return rc;
		}
		struct tbuf tmp = a;
		a = b;
		b = tmp;
	}
	tx_tbuf_free(&b);
	if (!a.p && tx_tbuf_put(&a, "", 0))
		return BATON_ENOMEM;
	*out = a;
	return 0;
}

/* ---- pieces ----------------------------------------------------------------- */

struct plist {
	struct tbuf data;
	size_t *off, *len;
	bool *origin; /* starts at offset 0 of the input (Metaspace "first") */
	size_t n, cap;
};

static int plist_add(struct plist *p, const char *s, size_t n, bool origin)
{
	if (n == 0)
		return 0;
	if (p->n == p->cap) {
		size_t c = p->cap ? p->cap * 2 : 16;
		size_t *o = realloc(p->off, c * sizeof(*o));
		if (!o)
			return BATON_ENOMEM;
		p->off = o;
		size_t *l = realloc(p->len, c * sizeof(*l));
		if (!l)
			return BATON_ENOMEM;
		p->len = l;
		bool *g = realloc(p->origin, c * sizeof(*g));
		if (!g)
			return BATON_ENOMEM;
		p->origin = g;
		p->cap = c;
	}
	p->off[p->n] = p->data.n;
	p->len[p->n] = n;
	p->origin[p->n] = origin;
	p->n++;
	return tx_tbuf_put(&p->data, s, n);
}

static void plist_free(struct plist *p)
{
	tx_tbuf_free(&p->data);
	free(p->off);
	free(p->len);
	free(p->origin);
	memset(p, 0, sizeof(*p));
}

/* Isolated split: every match and every gap between matches a piece. */
static int split_regex(struct plist *out, const pcre2_code *re, pcre2_match_data *md,
                       const char *s, size_t n, bool origin)
{
	size_t pos = 0, last = 0;
	int rc = 0;
	while (pos < n) {
		int m = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
		if (m == PCRE2_ERROR_NOMATCH)
			break;
		if (m < 0)
			return BATON_EINTERNAL;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t b = ov[0], e = ov[1];
		if (e == b) { /* empty match: step one character */
			size_t l = tx_utf8_len((const unsigned char *)s + pos, n - pos);
			pos += l ? l : 1;
			continue;
		}
		rc |= plist_add(out, s + last, b - last, origin && last == 0);
		rc |= plist_add(out, s + b, e - b, origin && b == 0);
		last = pos = e;
	}
	rc |= plist_add(out, s + last, n - last, origin && last == 0);
	return rc ? BATON_ENOMEM : 0;
}

static int bytelevel_map(struct plist *out, const char *s, size_t n, bool origin)
{
	struct tbuf b = {0};
	for (size_t i = 0; i < n; i++) {
		char u[4];
		size_t l = tx_utf8_encode(text_byte_char[(unsigned char)s[i]], u);
		if (tx_tbuf_put(&b, u, l)) {
			tx_tbuf_free(&b);
			return BATON_ENOMEM;
		}
	}
	int rc = plist_add(out, b.p, b.n, origin);
	tx_tbuf_free(&b);
	return rc;
}

static int pre_step(const struct pre_step *st, pcre2_match_data *md, struct plist *out,
                    const char *s, size_t n, bool origin)
{
	int rc = 0;
	switch (st->kind) {
	case P_SPLIT:
		return split_regex(out, st->re, md, s, n, origin);
	case P_BYTELEVEL: {
		struct tbuf pre = {0};
		if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
			if (tx_tbuf_putc(&pre, ' ') || tx_tbuf_put(&pre, s, n)) {
				tx_tbuf_free(&pre);
				return BATON_ENOMEM;
			}
			s = pre.p;
			n = pre.n;
		}
		if (st->re) {
			struct plist parts = {0};
			rc = split_regex(&parts, st->re, md, s, n, origin);
			for (size_t i = 0; !rc && i < parts.n; i++)
				rc = bytelevel_map(out, parts.data.p + parts.off[i], parts.len[i], parts.origin[i]);
			plist_free(&parts);
		} else
			rc = bytelevel_map(out, s, n, origin);
		tx_tbuf_free(&pre);
		return rc;
	}
	case P_METASPACE: {
		struct tbuf b = {0};
		size_t rl = strlen(st->repl);
		bool starts = n >= rl && memcmp(s, st->repl, rl) == 0;
		/* the replacement of a leading space counts as "starts with" too */
		if (n && s[0] == ' ')
			starts = true;
		bool prepend = !starts && (st->ps == PS_ALWAYS || (st->ps == PS_FIRST && origin));
		if (prepend)
			rc |= tx_tbuf_put(&b, st->repl, rl);
		rc |= replace_all(&b, s, n, " ", st->repl);
		if (rc) {
			tx_tbuf_free(&b);
			return BATON_ENOMEM;
		}
		if (!st->split) {
			rc = plist_add(out, b.p, b.n, origin);
		} else { /* MergedWithNext: a piece begins at each replacement */
			size_t last = 0;
			for (size_t i = 0; i + rl <= b.n; i++)
				if (i > last && memcmp(b.p + i, st->repl, rl) == 0) {
					rc |= plist_add(out, b.p + last, i - last, origin && last == 0);
					last = i;
				}
			rc |= plist_add(out, b.p + last, b.n - last, origin && last == 0);
		}
		tx_tbuf_free(&b);
		return rc ? BATON_ENOMEM : 0;
	}
	case P_DIGITS: {
		size_t last = 0;
		for (size_t i = 0; i < n;) {
			bool d = s[i] >= '0' && s[i] <= '9';
			if (!d) {
				i++;
				continue;
			}
			size_t e = i + 1;
			if (!st->individual)
				while (e < n && s[e] >= '0' && s[e] <= '9')
					e++;
			rc |= plist_add(out, s + last, i - last, origin && last == 0);
			rc |= plist_add(out, s + i, e - i, origin && i == 0);
			last = i = e;
		}
		rc |= plist_add(out, s + last, n - last, origin && last == 0);
		return rc ? BATON_ENOMEM : 0;
	}
	}
	return BATON_EINTERNAL;
}

struct ids {
	int32_t *p;
	size_t n, cap;
};

static int ids_push(struct ids *v, int32_t id)
{
	if (v->n == v->cap) {
		size_t c = v->cap ? v->cap * 2 : 64;
		int32_t *p = realloc(v->p, c * sizeof(*p));
		if (!p)
			return BATON_ENOMEM;
		v->p = p;
		v->cap = c;
	}
	v->p[v->n++] = id;
	return 0;
}

/* Words repeat: a long text keeps the ids of each short word it has seen
 * in a direct-mapped cache (per call, so a text_tok stays read-only). */
#define WC_SLOTS 8192
#define WC_WORD 48
struct wcache {
	uint64_t hash[WC_SLOTS];
	uint32_t len[WC_SLOTS], off[WC_SLOTS], cnt[WC_SLOTS];
	char word[WC_SLOTS][WC_WORD];
	struct ids store;
};

static int model_word(const text_tok *t, struct wcache *wc, const char *w, size_t n,
                      struct ids *out)
{
	if (!wc || n > WC_WORD || n == 0)
		return t->model == M_SPM ? tx_spm_word(t, w, n, &out->p, &out->n, &out->cap)
		                         : tx_bpe_word(t, w, n, &out->p, &out->n, &out->cap);
	uint64_t h = XXH3_64bits(w, n) | 1;
	size_t k = h & (WC_SLOTS - 1);
	if (wc->hash[k] == h && wc->len[k] == n && !memcmp(wc->word[k], w, n)) {
		for (uint32_t i = 0; i < wc->cnt[k]; i++)
			if (ids_push(out, wc->store.p[wc->off[k] + i]))
				return BATON_ENOMEM;
		return 0;
	}
	size_t before = out->n;
	int rc = t->model == M_SPM ? tx_spm_word(t, w, n, &out->p, &out->n, &out->cap)
	                           : tx_bpe_word(t, w, n, &out->p, &out->n, &out->cap);
	if (rc || wc->store.n + (out->n - before) > UINT32_MAX)
		return rc;
	wc->hash[k] = h;
	wc->len[k] = (uint32_t)n;
	memcpy(wc->word[k], w, n);
	wc->off[k] = (uint32_t)wc->store.n;
	wc->cnt[k] = (uint32_t)(out->n - before);
	for (size_t i = before; i < out->n; i++)
		if (ids_push(&wc->store, out->p[i])) {
			wc->hash[k] = 0;
			return BATON_ENOMEM;
		}
	return 0;
}

/* Normalised text of one stretch without added tokens: pre-tokenize, model. */
static int encode_plain(const text_tok *t, pcre2_match_data *md, struct wcache *wc, const char *s,
                        size_t n, bool origin, struct ids *out)
{
	struct plist cur = {0}, nxt = {0};
	int rc = plist_add(&cur, s, n, origin);
	for (size_t k = 0; !rc && k < t->n_pre; k++) {
		for (size_t i = 0; !rc && i < cur.n; i++)
			rc = pre_step(&t->pre[k], md, &nxt, cur.data.p + cur.off[i], cur.len[i], cur.origin[i]);
		plist_free(&cur);
		cur = nxt;
		memset(&nxt, 0, sizeof(nxt));
	}
	for (size_t i = 0; !rc && i < cur.n; i++)
		rc = model_word(t, wc, cur.data.p + cur.off[i], cur.len[i], out);
	plist_free(&cur);
	plist_free(&nxt);
	return rc;
}

/* ---- added tokens ------------------------------------------------------------ */

static bool is_ws(uint32_t c)
{
	return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
	       c == 0x205F || c == 0x3000;
}

static bool is_word(uint32_t c)
{
	if (c == '_')
		return true;
	utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
	return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NO) || k == UTF8PROC_CATEGORY_PC;
}

static uint32_t last_char(const char *s, size_t n)
{
	if (n == 0)
		return 0;
	size_t i = n - 1, adv;
	while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
		i--;
	return tx_utf8_decode((const unsigned char *)s + i, &adv);
}

struct match {
	size_t b, e;
	int32_t id;
};

/* Offsets of s where a special token is plain text (message content:
 * tx_encode_plain_at), ascending. */
struct prot {
	const size_t *at;
	size_t n;
};

static bool prot_has(const struct prot *p, size_t off)
{
	size_t lo = 0, hi = p ? p->n : 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->at[mid] == off)
			return true;
		if (p->at[mid] < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

static bool prot_within(const struct prot *p, size_t b, size_t e)
{
	for (size_t i = 0; p && i < p->n; i++)
		if (p->at[i] >= b && p->at[i] < e)
			return true;
	return false;
}

/* Leftmost-longest matches of the added tokens of one kind (normalized or
 * not), with HF's single_word, lstrip and rstrip rules; a special one that
 * starts at a protected offset is text. */
static int find_added(const text_tok *t, const char *s, size_t n, bool normalized, unsigned flags,
                      const struct prot *prot, struct match **out, size_t *nout)
{
	struct match *m = NULL;
	size_t nm = 0, cap = 0, start_off = 0;
	bool any = false, first[256] = {false}; /* first bytes of the tokens of this kind */
	for (size_t k = 0; k < t->n_added; k++)
		if (t->added[k].normalized == normalized) {
			any = true;
			first[(unsigned char)t->added[k].s[0]] = true;
		}
	for (size_t i = 0; any && i < n;) {
		if (!first[(unsigned char)s[i]]) {
			i++;
			continue;
		}
		const struct added_tok *best = NULL;
		for (size_t k = 0; k < t->n_added; k++) {
			const struct added_tok *a = &t->added[k];
			if (a->normalized != normalized || a->n > n - i || (best && a->n <= best->n))
				continue;
			if (memcmp(s + i, a->s, a->n) == 0)
				best = a;
		}
		if (!best) {
			i++;
			continue;
		}
		size_t b = i, e = i + best->n;
		i = e;
		if (best->special && ((flags & TEXT_NO_SPECIAL) || prot_has(prot, b)))
			continue;
		if (best->single_word) {
			size_t adv;
			bool sw = b == 0 || !is_word(last_char(s, b));
			bool ew = e == n || !is_word(tx_utf8_decode((const unsigned char *)s + e, &adv));
			if (!sw || !ew)
				continue;
		}
		if (best->lstrip) {
			size_t nb = b;
			while (nb > 0) {
				size_t p = nb - 1;
				while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
					p--;
				size_t adv;
				if (!is_ws(tx_utf8_decode((const unsigned char *)s + p, &adv)))
					break;
				nb = p;
			}
			b = nb > start_off ? nb : start_off;
		}
		if (best->rstrip) {
			while (e < n) {
				size_t adv;
				if (!is_ws(tx_utf8_decode((const unsigned char *)s + e, &adv)))
					break;
				e += adv;
			}
		}
		if (nm == cap) {
			cap = cap ? cap * 2 : 8;
			struct match *p = realloc(m, cap * sizeof(*p));
			if (!p) {
				free(m);
				return BATON_ENOMEM;
			}
			m = p;
		}
		m[nm++] = (struct match){b, e, best->id};
		start_off = e;
	}
	*out = m;
	*nout = nm;
	return 0;
}

static int encode_segment(const text_tok *t, pcre2_match_data *md, struct wcache *wc,
                          const char *s, size_t n, bool origin, unsigned flags, struct ids *out)
{
	struct tbuf norm = {0};
	int rc = text_normalize(t, s, n, &norm);
	if (rc)
		return rc;
	struct match *m = NULL;
	size_t nm = 0, last = 0;
	if ((rc = find_added(t, norm.p, norm.n, true, flags, NULL, &m, &nm)))
		goto out;
	for (size_t i = 0; !rc && i < nm; i++) {
		if (m[i].b > last)
			rc = encode_plain(t, md, wc, norm.p + last, m[i].b - last, origin && last == 0, out);
		if (!rc)
			rc = ids_push(out, m[i].id);
		last = m[i].e;
	}
	if (!rc && last < norm.n)
		rc = encode_plain(t, md, wc, norm.p + last, norm.n - last, origin && last == 0, out);
out:
	free(m);
	tx_tbuf_free(&norm);
	return rc;
}

static int encode_prot(const text_tok *t, const char *s, size_t n, unsigned flags, const struct prot *prot,
                       int32_t **ids, size_t *nids, char *err, size_t errlen)
{
	*ids = NULL;
	*nids = 0;
	if (!tx_utf8_valid(s, n))
		return text_errf(err, errlen, BATON_EINVAL, "text is not valid UTF-8");
	struct ids out = {0};
	struct match *m = NULL;
	size_t nm = 0, last = 0;
	pcre2_match_data *md = pcre2_match_data_create(4, NULL);
	int rc = md ? 0 : BATON_ENOMEM;
	/* the cache pays for itself only on longer texts */
	struct wcache *wc = n >= 4096 ? calloc(1, sizeof(*wc)) : NULL;
	if (flags & TEXT_ADD_SPECIAL)
		for (size_t i = 0; !rc && i < t->n_prefix; i++)
			rc = ids_push(&out, t->post_prefix[i]);
	if (!rc)
		rc = find_added(t, s, n, false, flags, prot, &m, &nm);
	/* normalized added tokens are matched after normalization, where the
	 * offsets are not the text's: a stretch with a protected offset in it
	 * takes none of them as special */
	for (size_t i = 0; !rc && i < nm; i++) {
		if (m[i].b > last)
			rc = encode_segment(t, md, wc, s + last, m[i].b - last, last == 0,
			                    flags | (prot_within(prot, last, m[i].b) ? TEXT_NO_SPECIAL : 0), &out);
		if (!rc)
			rc = ids_push(&out, m[i].id);
		last = m[i].e;
	}
	if (!rc && last < n)
		rc = encode_segment(t, md, wc, s + last, n - last, last == 0,
		                    flags | (prot_within(prot, last, n) ? TEXT_NO_SPECIAL : 0), &out);
	if (flags & TEXT_ADD_SPECIAL)
		for (size_t i = 0; !rc && i < t->n_suffix; i++)
			rc = ids_push(&out, t->post_suffix[i]);
	free(m);
	pcre2_match_data_free(md);
	if (wc)
		free(wc->store.p);
	free(wc);
	if (rc) {
		free(out.p);
		return text_errf(err, errlen, rc, "encode failed: %s", baton_strerror(rc));
	}
	if (!out.p && !(out.p = malloc(sizeof(int32_t)))) /* never NULL on success */
		return BATON_ENOMEM;
	*ids = out.p;
	*nids = out.n;
	return 0;
}

int text_encode(const text_tok *t, const char *s, size_t n, unsigned flags, int32_t **ids,
                size_t *nids, char *err, size_t errlen)
{
	return encode_prot(t, s, n, flags, NULL, ids, nids, err, errlen);
}

int tx_encode_plain_at(const text_tok *t, const char *s, size_t n, unsigned flags, const size_t *at,
                       size_t n_at, int32_t **ids, size_t *nids, char *err, size_t errlen)
{
	struct prot p = { at, n_at };
	return encode_prot(t, s, n, flags, &p, ids, nids, err, errlen);
}
