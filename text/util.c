/*
 * util.c: the text component's small tools: a growing buffer, UTF-8
 * checks (with Rust's lossy rule, which HF's decoders use), two hash maps
 * and GPT-2's byte-level character map.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "text/text_int.h"

int tx_tbuf_put(struct tbuf *b, const void *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 64;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return BATON_ENOMEM;
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
	return 0;
}

int tx_tbuf_putc(struct tbuf *b, char c)
{
	return tx_tbuf_put(b, &c, 1);
}

void tx_tbuf_free(struct tbuf *b)
{
	free(b->p);
	b->p = NULL;
	b->n = b->cap = 0;
}

size_t tx_utf8_len(const unsigned char *s, size_t n)
{
	if (n == 0)
		return 0;
	unsigned c = s[0];
	if (c < 0x80)
		return 1;
	size_t len;
	unsigned lo = 0x80, hi = 0xBF;
	if (c >= 0xC2 && c <= 0xDF)
		len = 2;
	else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		if (c == 0xE0)
			lo = 0xA0;
		if (c == 0xED)
			hi = 0x9F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		if (c == 0xF0)
			lo = 0x90;
		if (c == 0xF4)
			hi = 0x8F;
	} else
		return 0;
	if (n < len)
		return 0;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xBF)
			return 0;
	return len;
}

bool tx_utf8_valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;
	while (i < n) {
		if (p[i] < 0x80) {
			i++;
			continue;
		}
		size_t l = tx_utf8_len(p + i, n - i);
		if (!l)
			return false;
		i += l;
	}
	return true;
}

size_t tx_utf8_encode(uint32_t cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xC0 | (cp >> 6));
		o[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xE0 | (cp >> 12));
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (char)(0xF0 | (cp >> 18));
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

uint32_t tx_utf8_decode(const unsigned char *s, size_t *adv)
{
	uint32_t c = s[0];
	if (c < 0x80) {
		*adv = 1;
		return c;
	}
	if (c < 0xE0) {
		*adv = 2;
		return ((c & 0x1F) << 6) | (s[1] & 0x3F);
	}
	if (c < 0xF0) {
		*adv = 3;
		return ((c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
	}
	*adv = 4;
	return ((c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
	       ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

/* The length of the longest prefix of s that could start a valid character
 * (what Rust's decoder consumes before it declares a sequence invalid). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t n)
{
	unsigned c = s[0];
	size_t len;
	unsigned lo = 0x80, hi = 0xBF;
	if (c >= 0xC2 && c <= 0xDF)
		len = 2;
	else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		lo = c == 0xE0 ? 0xA0 : 0x80;
		hi = c == 0xED ? 0x9F : 0xBF;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		lo = c == 0xF0 ? 0x90 : 0x80;
		hi = c == 0xF4 ? 0x8F : 0xBF;
	} else
		return 1;
	size_t i = 1;
	if (i < n && i < len && s[i] >= lo && s[i] <= hi) {
		i++;
		while (i < n && i < len && s[i] >= 0x80 && s[i] <= 0xBF)
			i++;
	}
	return i;
}

int tx_utf8_lossy(struct tbuf *out, const unsigned char *s, size_t n)
{
	if (n == 0)
		return tx_tbuf_put(out, "", 0);
	size_t i = 0, run = 0;
	while (i < n) {
		if (s[i] < 0x80) {
			i++;
			continue;
		}
		size_t l = tx_utf8_len(s + i, n - i);
		if (l) {
			i += l;
			continue;
		}
		if (tx_tbuf_put(out, s + run, i - run))
			return BATON_ENOMEM;
		if (tx_tbuf_put(out, "\xEF\xBF\xBD", 3))
			return BATON_ENOMEM;
		i += utf8_valid_prefix(s + i, n - i);
		run = i;
	}
	return tx_tbuf_put(out, s + run, n - run);
}

size_t tx_utf8_incomplete_tail(const unsigned char *s, size_t n)
{
	/* Walk back over at most 3 continuation bytes to a lead byte. */
	for (size_t k = 1; k <= 3 && k <= n; k++) {
		unsigned c = s[n - k];
		if (c >= 0x80 && c <= 0xBF)
			continue;
		if (c < 0xC2 || c > 0xF4)
			return 0;
		size_t need = c <= 0xDF ? 2 : c <= 0xEF ? 3 : 4;
		if (k >= need)
			return 0;
		/* Incomplete only if what is there is a valid beginning. */
		return utf8_valid_prefix(s + n - k, k) == k ? k : 0;
	}
	return 0;
}

/* ---- string map ------------------------------------------------------------ */

int tx_smap_init(struct smap *m, size_t expect)
{
	size_t cap = 16;
	while (cap < expect * 2)
		cap *= 2;
	memset(m, 0, sizeof(*m));
	m->hash = calloc(cap, sizeof(*m->hash));
	m->val = calloc(cap, sizeof(*m->val));
	m->key = calloc(cap, sizeof(*m->key));
	m->klen = calloc(cap, sizeof(*m->klen));
	if (!m->hash || !m->val || !m->key || !m->klen) {
		tx_smap_free(m);
		return BATON_ENOMEM;
	}
	m->cap = cap;
	return 0;
}

int tx_smap_put(struct smap *m, const char *k, size_t n, int32_t v)
{
	if ((m->n + 1) * 2 > m->cap) {
		struct smap g;
		if (tx_smap_init(&g, m->cap))
			return BATON_ENOMEM;
		for (size_t i = 0; i < m->cap; i++)
			if (m->key[i])
				tx_smap_put(&g, m->key[i], m->klen[i], m->val[i]);
		tx_smap_free(m);
		*m = g;
	}
	uint64_t h = XXH3_64bits(k, n) | 1;
	size_t i = h & (m->cap - 1);
	while (m->key[i]) {
		if (m->hash[i] == h && m->klen[i] == n && memcmp(m->key[i], k, n) == 0) {
			m->val[i] = v;
			return 0;
		}
		i = (i + 1) & (m->cap - 1);
	}
	m->hash[i] = h;
	m->key[i] = k;
	m->klen[i] = (uint32_t)n;
	m->val[i] = v;
	m->n++;
	return 0;
}

int32_t tx_smap_get(const struct smap *m, const char *k, size_t n)
{
	if (!m->cap)
		return -1;
	uint64_t h = XXH3_64bits(k, n) | 1;
	size_t i = h & (m->cap - 1);
	while (m->key[i]) {
		if (m->hash[i] == h && m->klen[i] == n && memcmp(m->key[i], k, n) == 0)
			return m->val[i];
		i = (i + 1) & (m->cap - 1);
	}
	return -1;
}

void tx_smap_free(struct smap *m)
{
	free(m->hash);
	free(m->val);
	free(m->key);
	free(m->klen);
	memset(m, 0, sizeof(*m));
}

/* ---- pair map ---------------------------------------------------------------- */

int tx_pmap_init(struct pmap *m, size_t expect)
{
	size_t cap = 16;
	while (cap < expect * 2)
		cap *= 2;
	memset(m, 0, sizeof(*m));
	m->key = malloc(cap * sizeof(*m->key));
	m->rank = malloc(cap * sizeof(*m->rank));
	m->id = malloc(cap * sizeof(*m->id));
	if (!m->key || !m->rank || !m->id) {
		tx_pmap_free(m);
		return BATON_ENOMEM;
	}
	memset(m->key, 0xff, cap * sizeof(*m->key));
	m->cap = cap;
	return 0;
}

static inline uint64_t pmix(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdULL;
	k ^= k >> 33;
	return k;
}

int tx_pmap_put(struct pmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
	if ((m->n + 1) * 2 > m->cap) {
		struct pmap g;
		if (tx_pmap_init(&g, m->cap))
			return BATON_ENOMEM;
		for (size_t i = 0; i < m->cap; i++)
			if (m->key[i] != ~0ULL)
				tx_pmap_put(&g, (int32_t)(m->key[i] >> 32), (int32_t)(uint32_t)m->key[i],
				         m->rank[i], m->id[i]);
		tx_pmap_free(m);
		*m = g;
	}
	uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
	size_t i = pmix(k) & (m->cap - 1);
	while (m->key[i] != ~0ULL) {
		if (m->key[i] == k)
			return 0; /* the first (lowest) rank wins, as in HF */
		i = (i + 1) & (m->cap - 1);
	}
	m->key[i] = k;
	m->rank[i] = rank;
	m->id[i] = id;
	m->n++;
	return 0;
}

bool tx_pmap_get(const struct pmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id)
{
	if (!m->cap)
		return false;
	uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
	size_t i = pmix(k) & (m->cap - 1);
	while (m->key[i] != ~0ULL) {
		if (m->key[i] == k) {
			*rank = m->rank[i];
			*id = m->id[i];
			return true;
		}
		i = (i + 1) & (m->cap - 1);
	}
	return false;
}

void tx_pmap_free(struct pmap *m)
{
	free(m->key);
	free(m->rank);
	free(m->id);
	memset(m, 0, sizeof(*m));
}

/* ---- byte-level map -------------------------------------------------------------- */

uint32_t text_byte_char[256];
static int16_t char_byte[324];
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

static void bl_init(void)
{
	/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
	 * others take 256, 257, ... in byte order. */
	uint32_t next = 256;
	for (int b = 0; b < 256; b++) {
		bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
		text_byte_char[b] = keep ? (uint32_t)b : next++;
	}
	for (int i = 0; i < 324; i++)
		char_byte[i] = -1;
	for (int b = 0; b < 256; b++)
		char_byte[text_byte_char[b]] = (int16_t)b;
}

void text_bytelevel_init(void)
{
	pthread_once(&bl_once, bl_init);
}

int text_char_byte(uint32_t cp)
{
	return cp < 324 ? char_byte[cp] : -1;
}
