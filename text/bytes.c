/*
 * bytes.c: the bytes one token adds to the text (text_token_bytes, text.h),
 * for the token masks of constrained decoding (text/grammar/).
 */
#include <string.h>

#include "text/text_int.h"

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

/* pat replaced by with in buf[0..*n) (cap bytes); BATON_ENOSPC when it grows past cap. */
static int replace_all(char *buf, size_t cap, size_t *n, const char *pat, const char *with)
{
	size_t pn = strlen(pat), wn = strlen(with);
	if (!pn || *n < pn)
		return 0;
	char tmp[1024];
	size_t o = 0;
	for (size_t i = 0; i < *n;) {
		if (i + pn <= *n && memcmp(buf + i, pat, pn) == 0) {
			if (o + wn > sizeof tmp)
				return BATON_ENOSPC;
			memcpy(tmp + o, with, wn);
			o += wn;
			i += pn;
		} else {
			if (o + 1 > sizeof tmp)
				return BATON_ENOSPC;
			tmp[o++] = buf[i++];
		}
	}
	if (o > cap)
		return BATON_ENOSPC;
	memcpy(buf, tmp, o);
	*n = o;
	return 0;
}

int text_token_bytes(const text_tok *t, int32_t id, char *buf, size_t cap, size_t *len)
{
	*len = 0;
	if (id < 0 || (size_t)id >= t->n_vocab)
		return BATON_ERANGE;
	if (t->no_decoder)
		return BATON_EUNSUPPORTED;
	const char *p = t->piece[id];
	size_t n = t->piece_len[id];
	bool bytelevel = false, fallback = false;
	for (size_t k = 0; k < t->n_dec; k++) {
		bytelevel |= t->dec[k].kind == D_BYTELEVEL;
		fallback |= t->dec[k].kind == D_BYTEFALLBACK;
	}
	if (fallback && n == 6 && memcmp(p, "<0x", 3) == 0 && p[5] == '>' && hexval(p[3]) >= 0 &&
	    hexval(p[4]) >= 0) {
		if (cap < 1)
			return BATON_ENOSPC;
		buf[0] = (char)(hexval(p[3]) * 16 + hexval(p[4]));
		*len = 1;
		return 0;
	}
	if (bytelevel) {
		const unsigned char *u = (const unsigned char *)p;
		size_t j = 0, o = 0;
		while (j < n) {
			size_t adv, l = tx_utf8_len(u + j, n - j);
			int b = l ? text_char_byte(tx_utf8_decode(u + j, &adv)) : -1;
			if (b < 0)
				break;
			if (o >= cap)
				return BATON_ENOSPC;
			buf[o++] = (char)b;
			j += adv;
		}
		if (j == n) {
			*len = o;
			return 0;
		}
		/* not every character byte-level (an added token): as it is */
	}
	if (n > cap)
		return BATON_ENOSPC;
	memcpy(buf, p, n);
	*len = n;
	if (bytelevel)
		return 0;
	bool fused = false;
	for (size_t k = 0; k < t->n_dec; k++) {
		const struct dec_step *st = &t->dec[k];
		int rc = 0;
		if (st->kind == D_REPLACE)
			rc = replace_all(buf, cap, len, st->a, st->b);
		else if (st->kind == D_METASPACE)
			rc = replace_all(buf, cap, len, st->repl, " ");
		else if (st->kind == D_FUSE)
			fused = true;
		else if (st->kind == D_STRIP && !fused) {
			size_t cn = strlen(st->a), b = 0, e = *len;
			for (int i = 0; i < st->start && b + cn <= e && !memcmp(buf + b, st->a, cn); i++)
				b += cn;
			for (int i = 0; i < st->stop && e >= b + cn && !memcmp(buf + e - cn, st->a, cn); i++)
				e -= cn;
			memmove(buf, buf + b, e - b);
			*len = e - b;
		}
		if (rc)
			return rc;
	}
	return 0;
}
