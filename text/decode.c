/*
 * decode.c: ids to text through the tokenizer's decoder chain, as
 * `tokenizers` does (each step maps a list of strings to a list of
 * strings), and the streaming decoder on top of it.
 */
#include <stdlib.h>
#include <string.h>

#include "text/text_int.h"

struct slist {
	struct tbuf *s;
	size_t n;
};

static void slist_free(struct slist *l)
{
	for (size_t i = 0; i < l->n; i++)
		tx_tbuf_free(&l->s[i]);
	free(l->s);
	l->s = NULL;
	l->n = 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* "<0xHH>" as ByteFallback reads it; the byte, or -1. */
static int byte_piece(const char *p, size_t n)
{
	if (n != 6 || memcmp(p, "<0x", 3) || p[5] != '>')
		return -1;
	int h = hexval(p[3]), l = hexval(p[4]);
	return h < 0 || l < 0 ? -1 : h * 16 + l;
}

static int replace_in(struct tbuf *t, const char *pat, const char *with)
{
	size_t pn = strlen(pat), wn = strlen(with);
	if (!pn || t->n < pn)
		return 0;
	struct tbuf o = {0};
	size_t run = 0;
	for (size_t i = 0; i + pn <= t->n;) {
		if (memcmp(t->p + i, pat, pn) == 0) {
			if (tx_tbuf_put(&o, t->p + run, i - run) || tx_tbuf_put(&o, with, wn))
				goto nomem;
			i += pn;
			run = i;
		} else
			i++;
	}
	if (tx_tbuf_put(&o, t->p + run, t->n - run))
		goto nomem;
	tx_tbuf_free(t);
	*t = o;
	return 0;
nomem:
	tx_tbuf_free(&o);
	return BATON_ENOMEM;
}

static int step_bytelevel(struct slist *l, bool partial, bool *held)
{
	struct tbuf bytes = {0}, out = {0};
	int rc = 0;
	for (size_t i = 0; !rc && i < l->n; i++) {
		/* A token whose every character is a byte-level one becomes those
		 * bytes; any other (an added token such as "  ") stays as it is. */
		const unsigned char *p = (const unsigned char *)l->s[i].p;
		size_t n = l->s[i].n, j = 0, mark = bytes.n;
		bool all = true;
		while (j < n) {
			size_t adv;
			size_t len = tx_utf8_len(p + j, n - j);
			if (!len) {
				all = false;
				break;
			}
			int b = text_char_byte(tx_utf8_decode(p + j, &adv));
			if (b < 0) {
				all = false;
				break;
			}
			rc |= tx_tbuf_putc(&bytes, (char)b);
			j += adv;
		}
		if (!all) {
			bytes.n = mark;
			rc |= tx_tbuf_put(&bytes, p, n);
		}
	}
	size_t keep = bytes.n;
	if (partial) {
		size_t h = tx_utf8_incomplete_tail((const unsigned char *)bytes.p, bytes.n);
		keep -= h;
		*held = *held || h > 0;
	}
	if (!rc)
		rc = tx_utf8_lossy(&out, (const unsigned char *)bytes.p, keep);
	if (!rc && !out.p)
		rc = tx_tbuf_put(&out, "", 0);
	tx_tbuf_free(&bytes);
	if (rc) {
		tx_tbuf_free(&out);
		return BATON_ENOMEM;
	}
	slist_free(l);
	l->s = malloc(sizeof(*l->s));
	if (!l->s) {
		tx_tbuf_free(&out);
		return BATON_ENOMEM;
	}
	l->s[0] = out;
	l->n = 1;
	return 0;
}

static int step_bytefallback(struct slist *l)
{
	struct slist o = {calloc(l->n * 3 + 1, sizeof(struct tbuf)), 0};
	struct tbuf pend = {0};
	size_t npend = 0;
	int rc = o.s ? 0 : BATON_ENOMEM;
	for (size_t i = 0; !rc && i <= l->n; i++) {
		int b = i < l->n ? byte_piece(l->s[i].p, l->s[i].n) : -1;
		if (b >= 0) {
			rc = tx_tbuf_putc(&pend, (char)b);
			npend++;
			continue;
		}
		if (npend) { /* valid UTF-8, or one U+FFFD per byte */
			struct tbuf *d = &o.s[o.n++];
			if (tx_utf8_valid(pend.p, pend.n))
				rc = tx_tbuf_put(d, pend.p, pend.n);
			else
				for (size_t k = 0; !rc && k < npend; k++)
					rc = tx_tbuf_put(d, "\xEF\xBF\xBD", 3);
			pend.n = 0;
			npend = 0;
		}
		if (!rc && i < l->n) {
			o.s[o.n++] = l->s[i];
			memset(&l->s[i], 0, sizeof(l->s[i]));
		}
	}
	tx_tbuf_free(&pend);
	slist_free(l);
	*l = o;
	return rc;
}

static int step_fuse(struct slist *l)
{
	struct tbuf all = {0};
	int rc = tx_tbuf_put(&all, "", 0);
	for (size_t i = 0; !rc && i < l->n; i++)
		rc = tx_tbuf_put(&all, l->s[i].p, l->s[i].n);
	slist_free(l);
	l->s = malloc(sizeof(*l->s));
	if (rc || !l->s) {
		tx_tbuf_free(&all);
		return BATON_ENOMEM;
	}
	l->s[0] = all;
	l->n = 1;
	return 0;
}

/* Strip: up to `start` leading and `stop` trailing copies of one character. */
static void step_strip(struct slist *l, const struct dec_step *st)
{
	size_t cn = strlen(st->a);
	for (size_t i = 0; i < l->n; i++) {
		struct tbuf *t = &l->s[i];
		size_t b = 0, e = t->n;
		for (int k = 0; k < st->start && b + cn <= e && !memcmp(t->p + b, st->a, cn); k++)
			b += cn;
		for (int k = 0; k < st->stop && e >= b + cn && !memcmp(t->p + e - cn, st->a, cn); k++)
			e -= cn;
		memmove(t->p, t->p + b, e - b);
		t->n = e - b;
		if (t->p)
			t->p[t->n] = 0;
	}
}

static int decode_into(const text_tok *t, const int32_t *ids, size_t n, unsigned flags,
                       bool partial, struct tbuf *out, bool *held, char *err, size_t errlen)
{
	struct slist l = {calloc(n + 1, sizeof(struct tbuf)), 0};
	int rc = l.s ? 0 : BATON_ENOMEM;
	for (size_t i = 0; !rc && i < n; i++) {
		if (ids[i] < 0 || (size_t)ids[i] >= t->n_vocab) {
			slist_free(&l);
			return text_errf(err, errlen, BATON_ERANGE, "token id %d is outside the vocabulary (%zu)",
			                 ids[i], t->n_vocab);
		}
		if ((flags & TEXT_SKIP_SPECIAL) && t->special[ids[i]])
			continue;
		rc = tx_tbuf_put(&l.s[l.n++], t->piece[ids[i]], t->piece_len[ids[i]]);
	}
	if (t->no_decoder) {
		for (size_t i = 0; !rc && i < l.n; i++)
			rc = (i ? tx_tbuf_putc(out, ' ') : 0) || tx_tbuf_put(out, l.s[i].p, l.s[i].n);
		slist_free(&l);
		return rc ? BATON_ENOMEM : 0;
	}
	for (size_t k = 0; !rc && k < t->n_dec; k++) {
		const struct dec_step *st = &t->dec[k];
		switch (st->kind) {
		case D_BYTELEVEL:
			rc = step_bytelevel(&l, partial, held);
			break;
		case D_REPLACE:
			for (size_t i = 0; !rc && i < l.n; i++)
				rc = replace_in(&l.s[i], st->a, st->b);
			break;
		case D_BYTEFALLBACK:
			rc = step_bytefallback(&l);
			break;
		case D_FUSE:
			rc = step_fuse(&l);
			break;
		case D_STRIP:
			step_strip(&l, st);
			break;
		case D_METASPACE:
			for (size_t i = 0; !rc && i < l.n; i++) {
				rc = replace_in(&l.s[i], st->repl, " ");
				if (!rc && i == 0 && st->ps != PS_NEVER && l.s[0].n && l.s[0].p[0] == ' ') {
					memmove(l.s[0].p, l.s[0].p + 1, l.s[0].n);
					l.s[0].n--;
				}
			}
			break;
		}
	}
	for (size_t i = 0; !rc && i < l.n; i++)
		rc = tx_tbuf_put(out, l.s[i].p, l.s[i].n);
	if (!rc && !out->p)
		rc = tx_tbuf_put(out, "", 0);
	slist_free(&l);
	return rc;
}

/* transformers' clean_up_tokenization: these replacements, in this order,
 * each over the whole text. */
static int cleanup(struct tbuf *o)
{
	static const char *const rep[][2] = {
	    {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
	    {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
	};
	for (size_t i = 0; i < sizeof(rep) / sizeof(rep[0]); i++)
		if (replace_in(o, rep[i][0], rep[i][1]))
			return BATON_ENOMEM;
	return 0;
}

bool text_wants_cleanup(const text_tok *t)
{
	return t->cleanup;
}

int text_decode(const text_tok *t, const int32_t *ids, size_t n, unsigned flags, char **out,
                size_t *len, char *err, size_t errlen)
{
	struct tbuf o = {0};
	bool held = false;
	int rc = decode_into(t, ids, n, flags, false, &o, &held, err, errlen);
	if (!rc && (flags & TEXT_CLEANUP))
		rc = cleanup(&o);
	if (rc) {
		tx_tbuf_free(&o);
		return rc;
	}
	*out = o.p;
	*len = o.n;
	return 0;
}

/* ---- streaming ------------------------------------------------------------------
 * The window W holds context tokens (whose text, P, was emitted already)
 * and the tokens since. Each push decodes W, holding back a trailing run
 * of byte-fallback tokens and an incomplete character, and emits what goes
 * past P and past what this window emitted before. Once everything is
 * final, W shrinks to a context that decodes on its own (the last token
 * with text that is not a byte token), so each push costs a few tokens,
 * and the decoders' start-of-text rules (Strip, Metaspace) see the same
 * first token in P and in the whole window. */
struct text_stream {
	const text_tok *t;
	unsigned flags;
	int32_t *w;
	size_t n, cap;
	struct tbuf prefix;
	size_t emitted;  /* bytes of this window's text emitted past prefix */
	bool any;        /* emitted anything at all */
	bool fallback;   /* the chain has ByteFallback */
};

int text_stream_open(text_stream **out, const text_tok *t, unsigned flags)
{
	*out = NULL;
	if (flags & TEXT_CLEANUP)
		return BATON_EUNSUPPORTED; /* its replacements are not prefix-stable */
	text_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return BATON_ENOMEM;
	s->t = t;
	s->flags = flags;
	for (size_t k = 0; k < t->n_dec; k++)
		s->fallback = s->fallback || t->dec[k].kind == D_BYTEFALLBACK;
	if (tx_tbuf_put(&s->prefix, "", 0)) {
		free(s);
		return BATON_ENOMEM;
	}
	*out = s;
	return 0;
}

static int emit(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
	if (*len + n + 1 > *cap) {
		size_t c = *cap ? *cap : 64;
		while (c < *len + n + 1)
			c *= 2;
		char *q = realloc(*buf, c);
		if (!q)
			return BATON_ENOMEM;
		*buf = q;
		*cap = c;
	}
	memcpy(*buf + *len, p, n);
	*len += n;
	(*buf)[*len] = 0;
	return 0;
}

static bool is_byte_tok(const text_tok *t, int32_t id)
{
	return byte_piece(t->piece[id], t->piece_len[id]) >= 0;
}

/* The decoder chain has a start-of-text rule (Strip, Metaspace's
 * prepended space): the first token of a decode loses its leading space. */
static bool start_rule(const text_tok *t)
{
	for (size_t k = 0; k < t->n_dec; k++)
		if (t->dec[k].kind == D_STRIP || (t->dec[k].kind == D_METASPACE && t->dec[k].ps != PS_NEVER))
			return true;
	return false;
}

int text_stream_open_after(text_stream **out, const text_tok *t, unsigned flags, const int32_t *ctx,
                           size_t n_ctx)
{
	int rc = text_stream_open(out, t, flags);
	if (rc || !ctx || n_ctx == 0 || !start_rule(t))
		return rc;
	text_stream *s = *out;
	/* the last token with text of its own (not a byte token, not a
	 * skipped special one): its text is the context, emitted already (a
	 * run of byte tokens after it is left out: decoded alone it may be
	 * half a character) */
	size_t j = n_ctx;
	while (j-- > 0) {
		int32_t id = ctx[j];
		if (id < 0 || (size_t)id >= t->n_vocab) {
			text_stream_close(s);
			*out = NULL;
			return BATON_ERANGE;
		}
		if (!((flags & TEXT_SKIP_SPECIAL) && t->special[id]) && !is_byte_tok(t, id) && t->piece_len[id])
			break;
	}
	if (j == (size_t)-1)
		return 0; /* nothing with text: a fresh start */
	size_t n = 1;
	if (!(s->w = malloc((n + 16) * sizeof(*s->w)))) {
		text_stream_close(s);
		*out = NULL;
		return BATON_ENOMEM;
	}
	memcpy(s->w, ctx + j, n * sizeof(*s->w));
	s->n = n;
	s->cap = n + 16;
	s->prefix.n = 0;
	bool held = false;
	if ((rc = decode_into(t, s->w, s->n, s->flags, false, &s->prefix, &held, NULL, 0)) != 0) {
		text_stream_close(s);
		*out = NULL;
		return rc;
	}
	s->any = true;
	return 0;
}

static int stream_step(text_stream *s, bool final, char **buf, size_t *len, size_t *cap)
{
	const text_tok *t = s->t;
	size_t k = s->n;
	/* Hold back a trailing run of byte tokens: the run may go on. A
	 * skipped special token does not end it (it decodes to nothing). */
	if (!final && s->fallback) {
		size_t j = k;
		while (j > 0 && (is_byte_tok(t, s->w[j - 1]) ||
		                 ((s->flags & TEXT_SKIP_SPECIAL) && t->special[s->w[j - 1]]))) {
			j--;
			if (is_byte_tok(t, s->w[j]))
				k = j;
		}
	}
	struct tbuf d = {0};
	bool held = false;
	int rc = decode_into(t, s->w, k, s->flags, !final, &d, &held, NULL, 0);
	if (rc) {
		tx_tbuf_free(&d);
		return rc;
	}
	size_t from = s->prefix.n + s->emitted;
	if (d.n < s->prefix.n || memcmp(d.p, s->prefix.p, s->prefix.n) != 0) {
		tx_tbuf_free(&d);
		return BATON_EINTERNAL; /* the decoder chain is not prefix-stable */
	}
	if (d.n > from) {
		if ((rc = emit(buf, len, cap, d.p + from, d.n - from))) {
			tx_tbuf_free(&d);
			return rc;
		}
		s->emitted = d.n - s->prefix.n;
		s->any = true;
	}
	tx_tbuf_free(&d);
	if (final || k != s->n || held || !s->any)
		return 0;
	/* Slide: keep from the last token with text of its own. */
	for (size_t j = s->n; j-- > 0;) {
		int32_t id = s->w[j];
		if (((s->flags & TEXT_SKIP_SPECIAL) && t->special[id]) || is_byte_tok(t, id) ||
		    t->piece_len[id] == 0)
			continue;
		if (j == 0)
			break; /* already the shortest window */
		memmove(s->w, s->w + j, (s->n - j) * sizeof(*s->w));
		s->n -= j;
		s->prefix.n = 0;
		if ((rc = decode_into(t, s->w, s->n, s->flags, false, &s->prefix, &held, NULL, 0)))
			return rc;
		s->emitted = 0;
		break;
	}
	return 0;
}

int text_stream_push(text_stream *s, int32_t id, char **buf, size_t *len, size_t *cap)
{
	if (id < 0 || (size_t)id >= s->t->n_vocab)
		return BATON_ERANGE;
	if (s->n == s->cap) {
		size_t c = s->cap ? s->cap * 2 : 16;
		int32_t *w = realloc(s->w, c * sizeof(*w));
		if (!w)
			return BATON_ENOMEM;
		s->w = w;
		s->cap = c;
	}
	s->w[s->n++] = id;
	return stream_step(s, false, buf, len, cap);
}

int text_stream_finish(text_stream *s, char **buf, size_t *len, size_t *cap)
{
	return stream_step(s, true, buf, len, cap);
}

void text_stream_close(text_stream *s)
{
	if (!s)
		return;
	free(s->w);
	tx_tbuf_free(&s->prefix);
	free(s);
}
