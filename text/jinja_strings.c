/*
 * jinja_strings.c: the string helpers of the built-ins, as Python's str does
 * them: code points, case mapping, strip, find/rfind, replace, split.
 */

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <utf8proc.h>

#include "text/jinja_int.h"

uint32_t jj_cp_at(const char *s, size_t n, size_t *adv)
{
	size_t l = tx_utf8_len((const unsigned char *)s, n);
	if (!l) {
		*adv = 1;
		return (unsigned char)s[0];
	}
	return tx_utf8_decode((const unsigned char *)s, adv);
}

/* Case mapping of each code point (Python's simple case maps). */
jv jj_case_map(struct rs *r, int line, jv s, int mode /* 0 lower 1 upper 2 capitalize 3 title */)
{
	struct tbuf b = {0};
	bool start = true;
	int rc = 0;
	for (size_t i = 0; i < s.s.n && !rc;) {
		size_t adv;
		uint32_t c = jj_cp_at(s.s.p + i, s.s.n - i, &adv);
		int32_t m;
		if (mode == 0)
			m = utf8proc_tolower((int32_t)c);
		else if (mode == 1)
			m = utf8proc_toupper((int32_t)c);
		else if (mode == 2)
			m = i == 0 ? utf8proc_toupper((int32_t)c) : utf8proc_tolower((int32_t)c);
		else {
			m = start ? utf8proc_toupper((int32_t)c) : utf8proc_tolower((int32_t)c);
			/* jinja2's title: words begin after -, whitespace, ( { [ < */
			start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jj_is_space(c);
		}
		/* Python's full case mappings where the simple ones differ:
		 * upper (and jinja2's title, which upper-cases word starts), and
		 * capitalize's title case of the first character */
		bool up = mode == 1 || (mode == 3 && m == utf8proc_toupper((int32_t)c) && c != (uint32_t)m);
		bool ti = mode == 2 && i == 0;
		const char *special = NULL;
		if (up || ti)
			special = c == 0xDF ? (up ? "SS" : "Ss") : c == 0xFB00 ? (up ? "FF" : "Ff")
			          : c == 0xFB01 ? (up ? "FI" : "Fi") : c == 0xFB02 ? (up ? "FL" : "Fl")
			          : c == 0xFB03 ? (up ? "FFI" : "Ffi") : c == 0xFB04 ? (up ? "FFL" : "Ffl")
			          : (c == 0xFB05 || c == 0xFB06) ? (up ? "ST" : "St") : NULL;
		if (mode == 3 && c == 0xDF && m == (int32_t)c)
			special = NULL;
		if (c == 0x130 && m == utf8proc_tolower((int32_t)c))
			special = "i\xcc\x87";
		char o[4];
		if (special)
			rc = tx_tbuf_put(&b, special, strlen(special));
		else
			rc = tx_tbuf_put(&b, o, tx_utf8_encode((uint32_t)m, o));
		i += adv;
	}
	if (rc) {
		tx_tbuf_free(&b);
		jj_oom(r, line);
		return jv_undef(NULL, 0);
	}
	return jj_tbuf_str(r, line, &b);
}

static bool in_chars(uint32_t c, const jv *chars)
{
	if (!chars)
		return jj_is_space(c);
	for (size_t i = 0; i < chars->s.n;) {
		size_t adv;
		if (jj_cp_at(chars->s.p + i, chars->s.n - i, &adv) == c)
			return true;
		i += adv;
	}
	return false;
}

jv jj_strip(jv s, const jv *chars, bool left, bool right)
{
	size_t a = 0, b = s.s.n;
	while (left && a < b) {
		size_t adv;
		uint32_t c = jj_cp_at(s.s.p + a, b - a, &adv);
		if (!in_chars(c, chars))
			break;
		a += adv;
	}
	while (right && b > a) {
		size_t k = b - 1;
		while (k > a && ((unsigned char)s.s.p[k] & 0xC0) == 0x80)
			k--;
		size_t adv;
		uint32_t c = jj_cp_at(s.s.p + k, b - k, &adv);
		if (!in_chars(c, chars))
			break;
		b = k;
	}
	return jv_str(s.s.p + a, b - a);
}

const char *jj_find(const char *h, size_t hn, const char *nd, size_t nn)
{
	if (nn == 0)
		return h;
	for (size_t i = 0; i + nn <= hn; i++)
		if (h[i] == nd[0] && !memcmp(h + i, nd, nn))
			return h + i;
	return NULL;
}

const char *jj_rfind(const char *h, size_t hn, const char *nd, size_t nn)
{
	if (nn > hn)
		return NULL;
	for (size_t i = hn - nn + 1; i-- > 0;)
		if (!memcmp(h + i, nd, nn))
			return h + i;
	return NULL;
}

jv jj_replace(struct rs *r, int line, jv s, jv old, jv new, int64_t count)
{
	struct tbuf b = {0};
	int rc = 0;
	if (old.s.n == 0) {
		/* Python: new between every code point and at both ends */
		int64_t k = 0;
		for (size_t i = 0; i <= s.s.n && !rc;) {
			if (count < 0 || k < count) {
				rc = tx_tbuf_put(&b, new.s.p, new.s.n);
				k++;
			}
			if (i == s.s.n)
				break;
			size_t adv;
			jj_cp_at(s.s.p + i, s.s.n - i, &adv);
			rc |= tx_tbuf_put(&b, s.s.p + i, adv);
			i += adv;
			if (b.n > MAX_OUT)
				break;
		}
	} else {
		size_t i = 0;
		int64_t k = 0;
		while (!rc && (count < 0 || k < count)) {
			const char *h = jj_find(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
			if (!h)
				break;
			size_t at = (size_t)(h - s.s.p);
			rc = tx_tbuf_put(&b, s.s.p + i, at - i) | tx_tbuf_put(&b, new.s.p, new.s.n);
			i = at + old.s.n;
			k++;
			if (b.n > MAX_OUT)
				break;
		}
		rc |= tx_tbuf_put(&b, s.s.p + i, s.s.n - i);
	}
	if (rc) {
		tx_tbuf_free(&b);
		jj_oom(r, line);
		return jv_undef(NULL, 0);
	}
	return jj_tbuf_str(r, line, &b);
}

int jj_split(struct rs *r, int line, jv s, const jv *sep, int64_t maxsplit, bool from_right,
             jv *out)
{
	*out = jv_list_new(r->a, 0, JK_LIST);
	if (out->t != JV_LIST)
		return jj_oom(r, line);
	jv parts[1];
	(void)parts;
	if (sep && sep->s.n == 0)
		return jj_rfail(r, line, BATON_EINVAL, "empty separator");
	if (!sep) {
		/* runs of whitespace; leading and trailing ignored */
		size_t i = 0, n = s.s.n;
		int64_t k = 0;
		if (from_right)
			return jj_rfail(r, line, BATON_EUNSUPPORTED, "rsplit() without a separator is not supported");
		for (;;) {
			while (i < n) {
				size_t adv;
				if (!jj_is_space(jj_cp_at(s.s.p + i, n - i, &adv)))
					break;
				i += adv;
			}
			if (i >= n)
				break;
			size_t j = i;
			if (maxsplit >= 0 && k >= maxsplit) {
				/* the rest as it is (Python keeps its trailing whitespace) */
				if (jv_list_push(r->a, out, jv_str(s.s.p + i, n - i)))
					return jj_oom(r, line);
				break;
			}
			while (j < n) {
				size_t adv;
				if (jj_is_space(jj_cp_at(s.s.p + j, n - j, &adv)))
					break;
				j += adv;
			}
			if (jv_list_push(r->a, out, jv_str(s.s.p + i, j - i)))
				return jj_oom(r, line);
			k++;
			i = j;
		}
		return 0;
	}
	if (!from_right) {
		size_t i = 0;
		int64_t k = 0;
		for (;;) {
			const char *h = maxsplit >= 0 && k >= maxsplit
			                    ? NULL
			                    : jj_find(s.s.p + i, s.s.n - i, sep->s.p, sep->s.n);
			if (!h) {
				if (jv_list_push(r->a, out, jv_str(s.s.p + i, s.s.n - i)))
					return jj_oom(r, line);
				return 0;
			}
			size_t at = (size_t)(h - s.s.p);
			if (jv_list_push(r->a, out, jv_str(s.s.p + i, at - i)))
				return jj_oom(r, line);
			i = at + sep->s.n;
			k++;
		}
	}
	/* rsplit: collect from the right, then reverse */
	size_t end = s.s.n;
	int64_t k = 0;
	for (;;) {
		const char *h = maxsplit >= 0 && k >= maxsplit ? NULL : jj_rfind(s.s.p, end, sep->s.p, sep->s.n);
		if (!h) {
			if (jv_list_push(r->a, out, jv_str(s.s.p, end)))
				return jj_oom(r, line);
			break;
		}
		size_t at = (size_t)(h - s.s.p);
		if (jv_list_push(r->a, out, jv_str(h + sep->s.n, end - at - sep->s.n)))
			return jj_oom(r, line);
		end = at;
		k++;
	}
	for (size_t i = 0, j = out->l->n - 1; i < j; i++, j--) {
		jv t = out->l->v[i];
		out->l->v[i] = out->l->v[j];
		out->l->v[j] = t;
	}
	return 0;
}
