/*
 * jinja_lex.c: a template's text to tokens, as jinja2's lexer does with
 * trim_blocks and lstrip_blocks on: newlines normalised to \n and one
 * trailing newline dropped; `{%-`/`-%}` (and `{{-`, `-}}`, `{#-`, `-#}`)
 * strip all whitespace on their side; a block or comment tag alone on its
 * line after spaces and tabs loses them (unless `{%+`); the newline right
 * after `%}` or `#}` goes (unless `+%}`). Comments vanish; `{% raw %}`
 * bodies become data.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

static bool ws(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Python's \s on text (str.isspace: also \x1c-\x1f, NBSP, U+3000...): the
 * bytes of the whitespace character at p, 0 when there is none. What the
 * strip signs, trim and lstrip remove. */
static size_t uws_at(const char *p, size_t n)
{
	if (!n)
		return 0;
	unsigned char c = (unsigned char)p[0];
	if (c < 0x80)
		return ws((char)c) || (c >= 0x1c && c <= 0x1f) ? 1 : 0;
	size_t l = tx_utf8_len((const unsigned char *)p, n), adv;
	return l && jj_is_space(tx_utf8_decode((const unsigned char *)p, &adv)) ? l : 0;
}

/* The same for the character that ends at p + n. */
static size_t uws_before(const char *p, size_t n)
{
	for (size_t k = 1; k <= 4 && k <= n; k++)
		if (((unsigned char)p[n - k] & 0xC0) != 0x80)
			return uws_at(p + n - k, k) == k ? k : 0;
	return 0;
}

/* Past the whitespace from e, counting newlines into *line. */
static size_t skip_uws(const char *p, size_t n, size_t e, int *line)
{
	size_t k;
	while (e < n && (k = uws_at(p + e, n - e)) != 0) {
		if (p[e] == '\n' && line)
			(*line)++;
		e += k;
	}
	return e;
}

struct lx {
	struct jj_arena *a;
	const char *s;
	size_t n, pos;
	int line;
	struct jj_tokens *out;
	char *err;
	size_t errlen;
};

static int push(struct lx *l, struct jj_token t)
{
	struct jj_tokens *o = l->out;
	if (o->n == o->cap) {
		size_t cap = o->cap ? o->cap * 2 : 256;
		struct jj_token *p = realloc(o->t, cap * sizeof(*p));
		if (!p)
			return BATON_ENOMEM;
		o->t = p;
		o->cap = cap;
	}
	o->t[o->n++] = t;
	return 0;
}

static int lines_in(const char *s, size_t n)
{
	int k = 0;
	for (size_t i = 0; i < n; i++)
		k += s[i] == '\n';
	return k;
}

static int data(struct lx *l, const char *p, size_t n)
{
	if (n == 0)
		return 0;
	return push(l, (struct jj_token){.type = JT_DATA, .s = p, .n = n, .line = l->line});
}

/* The text before a tag, with the tag's strip sign ('-', '+' or 0) applied
 * and lstrip_blocks for block and comment tags. */
static size_t trim_before(const char *p, size_t n, char sign, bool lstrip, bool line_starting)
{
	if (sign == '-') {
		size_t k;
		while (n && (k = uws_before(p, n)) != 0)
			n -= k;
		return n;
	}
	if (sign == '+' || !lstrip)
		return n;
	size_t l = n;
	while (l && p[l - 1] != '\n')
		l--;
	if (l == 0 && !line_starting)
		return n;
	if (l == n)
		return n;
	for (size_t i = l, k; i < n; i += k)
		if ((k = uws_at(p + i, n - i)) == 0)
			return n;
	return l;
}

static int fail(struct lx *l, const char *what)
{
	return text_errf(l->err, l->errlen, BATON_EINVAL, "template line %d: %s", l->line, what);
}

/* Python's "unicode-escape" decoding of a string literal's body. */
static int unescape(struct lx *l, const char *p, size_t n, struct jj_token *t)
{
	char *o = jj_alloc(l->a, n + 1), *q = o;
	if (!o)
		return BATON_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (p[i] != '\\' || i + 1 == n) {
			*q++ = p[i];
			continue;
		}
		char c = p[++i];
		int hex = 0;
		switch (c) {
		case '\n': break;
		case '\\': *q++ = '\\'; break;
		case '\'': *q++ = '\''; break;
		case '"': *q++ = '"'; break;
		case 'a': *q++ = '\a'; break;
		case 'b': *q++ = '\b'; break;
		case 'f': *q++ = '\f'; break;
		case 'n': *q++ = '\n'; break;
		case 'r': *q++ = '\r'; break;
		case 't': *q++ = '\t'; break;
		case 'v': *q++ = '\v'; break;
		case 'x': hex = 2; break;
		case 'u': hex = 4; break;
		case 'U': hex = 8; break;
		case 'N': return fail(l, "\\N{...} escapes are not supported");
		default:
			if (c >= '0' && c <= '7') {
				uint32_t v = 0;
				int k = 0;
				while (k < 3 && i < n && p[i] >= '0' && p[i] <= '7') {
					v = v * 8 + (uint32_t)(p[i] - '0');
					i++;
					k++;
				}
				i--;
				q += tx_utf8_encode(v, q);
			} else {
				*q++ = '\\';
				*q++ = c;
			}
		}
		if (hex) {
			uint32_t v = 0;
			for (int k = 0; k < hex; k++) {
				char h = i + 1 < n ? p[++i] : 0;
				int d = h >= '0' && h <= '9' ? h - '0'
				        : h >= 'a' && h <= 'f' ? h - 'a' + 10
				        : h >= 'A' && h <= 'F' ? h - 'A' + 10
				                               : -1;
				if (d < 0)
					return fail(l, "a truncated \\x, \\u or \\U escape");
				v = v * 16 + (uint32_t)d;
			}
			if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
				return fail(l, "an escape outside Unicode scalar values");
			q += tx_utf8_encode(v, q);
		}
	}
	t->s = o;
	t->n = (size_t)(q - o);
	return 0;
}

static bool isname0(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool isdig(char c) { return c >= '0' && c <= '9'; }

/* Number literal at p (jinja2: digits with single underscores; a float
 * needs digits after its dot or an exponent; after a dot only integers). */
static size_t digits(const char *p, size_t n, size_t i)
{
	size_t j = i;
	while (j < n && (isdig(p[j]) || (p[j] == '_' && j > i && j + 1 < n && isdig(p[j + 1]))))
		j++;
	return j;
}

static int number(struct lx *l, bool after_dot, struct jj_token *t)
{
	const char *p = l->s;
	size_t n = l->n, i = l->pos, j = digits(p, n, i), e = j;
	bool fl = false;
	if (!after_dot) {
		if (e < n && p[e] == '.' && e + 1 < n && isdig(p[e + 1])) {
			e = digits(p, n, e + 1);
			fl = true;
		}
		if (e < n && (p[e] == 'e' || p[e] == 'E')) {
			size_t k = e + 1;
			if (k < n && (p[k] == '+' || p[k] == '-'))
				k++;
			if (k < n && isdig(p[k])) {
				e = digits(p, n, k);
				fl = true;
			}
		}
	}
	char buf[128];
	size_t m = 0;
	for (size_t k = i; k < e && m + 1 < sizeof(buf); k++)
		if (p[k] != '_')
			buf[m++] = p[k];
	buf[m] = 0;
	if (fl) {
		t->type = JT_FLOAT;
		t->f = strtod(buf, NULL);
	} else {
		t->type = JT_INT;
		errno = 0;
		char *end;
		unsigned long long v = strtoull(buf, &end, 10);
		if (v > INT64_MAX || m >= sizeof(buf) - 1)
			return fail(l, "an integer literal too large");
		t->i = (int64_t)v;
	}
	l->pos = e;
	return 0;
}

/* Tokens of an expression up to its end tag: `}}` for a variable, `%}`
 * for a block (with trim_blocks' newline). *line_starting: whether the end
 * consumed a newline last. */
static int expr(struct lx *l, bool block, bool *line_starting)
{
	const char *p = l->s;
	size_t n = l->n;
	int depth = 0;
	for (;;) {
		while (l->pos < n && ws(p[l->pos])) {
			if (p[l->pos] == '\n')
				l->line++;
			l->pos++;
		}
		if (l->pos >= n)
			return fail(l, block ? "a block tag without its %}" : "an expression without its }}");
		size_t i = l->pos;
		char c = p[i];
		char close = block ? '%' : '}';
		if (depth == 0) {
			size_t e = 0;
			bool strip = false, plus = false;
			if (c == '-' && i + 2 < n && p[i + 1] == close && p[i + 2] == '}')
				e = i + 3, strip = true;
			else if (block && c == '+' && i + 2 < n && p[i + 1] == '%' && p[i + 2] == '}')
				e = i + 3, plus = true;
			else if (c == close && i + 1 < n && p[i + 1] == '}')
				e = i + 2;
			if (e) {
				int rc = push(l, (struct jj_token){.type = block ? JT_BLOCK_END : JT_VAR_END, .line = l->line});
				if (rc)
					return rc;
				if (strip)
					e = skip_uws(p, n, e, &l->line);
				else if (block && !plus && e < n && p[e] == '\n') {
					e++;
					l->line++;
				}
				*line_starting = e > 0 && p[e - 1] == '\n';
				l->pos = e;
				return 0;
			}
		}
		struct jj_token t = {.line = l->line};
		if (isname0(c) || (unsigned char)c >= 0x80) {
			size_t j = i;
			while (j < n && (isname0(p[j]) || isdig(p[j]) || (unsigned char)p[j] >= 0x80))
				j++;
			t.type = JT_NAME;
			t.s = p + i;
			t.n = j - i;
			l->pos = j;
		} else if (isdig(c)) {
			bool after_dot = l->out->n && l->out->t[l->out->n - 1].type == JT_OP &&
			                 l->out->t[l->out->n - 1].op == JO_DOT;
			int rc = number(l, after_dot, &t);
			if (rc)
				return rc;
		} else if (c == '\'' || c == '"') {
			size_t j = i + 1;
			while (j < n && p[j] != c) {
				if (p[j] == '\\' && j + 1 < n)
					j++;
				j++;
			}
			if (j >= n)
				return fail(l, "an unterminated string");
			t.type = JT_STRING;
			int rc = unescape(l, p + i + 1, j - i - 1, &t);
			if (rc)
				return rc;
			l->line += lines_in(p + i, j - i);
			l->pos = j + 1;
		} else {
			static const struct {
				const char *s;
				int op;
			} ops[] = {
			    {"//", JO_FLOORDIV}, {"**", JO_POW}, {"==", JO_EQ}, {"!=", JO_NE}, {"<=", JO_LE},
			    {">=", JO_GE},       {"+", JO_ADD},  {"-", JO_SUB}, {"*", JO_MUL}, {"/", JO_DIV},
			    {"%", JO_MOD},       {"~", JO_TILDE}, {"<", JO_LT}, {">", JO_GT}, {"=", JO_ASSIGN},
			    {"(", JO_LPAREN},    {")", JO_RPAREN}, {"[", JO_LBRACKET}, {"]", JO_RBRACKET},
			    {"{", JO_LBRACE},    {"}", JO_RBRACE}, {",", JO_COMMA}, {".", JO_DOT},
			    {":", JO_COLON},     {"|", JO_PIPE}, {";", JO_SEMI},
			};
			size_t k;
			for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
				size_t m = strlen(ops[k].s);
				if (i + m <= n && !memcmp(p + i, ops[k].s, m))
					break;
			}
			if (k == sizeof(ops) / sizeof(ops[0])) {
				char msg[64];
				snprintf(msg, sizeof(msg), "unexpected character '%c'", c);
				return fail(l, msg);
			}
			t.type = JT_OP;
			t.op = ops[k].op;
			l->pos = i + strlen(ops[k].s);
			if (t.op == JO_LPAREN || t.op == JO_LBRACKET || t.op == JO_LBRACE)
				depth++;
			else if ((t.op == JO_RPAREN || t.op == JO_RBRACKET || t.op == JO_RBRACE) && depth > 0)
				depth--;
		}
		int rc = push(l, t);
		if (rc)
			return rc;
	}
}

/* `{% raw %}` at i (the `{%` and its sign already seen at i..j): its end
 * past `%}` or 0 when this is not a raw tag. */
static size_t raw_begin(const char *p, size_t n, size_t j, bool *strip_after)
{
	while (j < n && ws(p[j]))
		j++;
	if (j + 3 > n || memcmp(p + j, "raw", 3))
		return 0;
	j += 3;
	if (j < n && (isname0(p[j]) || isdig(p[j])))
		return 0;
	while (j < n && ws(p[j]))
		j++;
	*strip_after = false;
	if (j + 3 <= n && !memcmp(p + j, "-%}", 3)) {
		*strip_after = true;
		return j + 3;
	}
	if (j + 2 <= n && !memcmp(p + j, "%}", 2))
		return j + 2;
	return 0;
}

/* The raw body from j: finds `{%[-+]? endraw [-+]?%}`; *body_end where the
 * tag starts, *sign its opening sign; returns past the tag (0: none). */
static size_t raw_end(const char *p, size_t n, size_t j, size_t *body_end, char *sign,
                      bool *line_starting)
{
	for (size_t i = j; i + 1 < n; i++) {
		if (p[i] != '{' || p[i + 1] != '%')
			continue;
		size_t k = i + 2;
		char sg = 0;
		if (k < n && (p[k] == '-' || p[k] == '+'))
			sg = p[k++];
		while (k < n && ws(p[k]))
			k++;
		if (k + 6 > n || memcmp(p + k, "endraw", 6))
			continue;
		k += 6;
		while (k < n && ws(p[k]))
			k++;
		size_t e = 0;
		if (k + 3 <= n && !memcmp(p + k, "-%}", 3)) {
			e = skip_uws(p, n, k + 3, NULL);
		} else if (k + 3 <= n && !memcmp(p + k, "+%}", 3))
			e = k + 3;
		else if (k + 2 <= n && !memcmp(p + k, "%}", 2)) {
			e = k + 2;
			if (e < n && p[e] == '\n')
				e++;
		}
		if (!e)
			continue;
		*body_end = i;
		*sign = sg;
		*line_starting = p[e - 1] == '\n';
		return e;
	}
	return 0;
}

int jj_lex(struct jj_arena *a, const char *src, size_t len, struct jj_tokens *out, char *err,
           size_t errlen)
{
	/* newlines to \n, one trailing newline dropped (keep_trailing_newline off) */
	char *s = jj_alloc(a, len + 1);
	if (!s)
		return BATON_ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			s[n++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else
			s[n++] = src[i];
	}
	if (n && s[n - 1] == '\n')
		n--;
	s[n] = 0;
	struct lx l = {.a = a, .s = s, .n = n, .line = 1, .out = out, .err = err, .errlen = errlen};
	bool line_starting = true;
	int rc = 0;
	while (l.pos < n) {
		size_t i = l.pos;
		const char *hit = NULL;
		for (size_t k = i; k + 1 < n; k++)
			if (s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')) {
				hit = s + k;
				break;
			}
		if (!hit) {
			rc = data(&l, s + i, n - i);
			if (rc)
				return rc;
			break;
		}
		size_t at = (size_t)(hit - s), j = at + 2;
		char kind = s[at + 1], sign = 0;
		if (j < n && (s[j] == '-' || s[j] == '+'))
			sign = s[j++];
		if (kind == '{' && sign == '+')
			sign = 0, j--; /* {{+ is not a modifier */
		bool strip_after = false;
		size_t rawe = kind == '%' ? raw_begin(s, n, j, &strip_after) : 0;
		size_t dn = trim_before(s + i, at - i, sign, kind != '{', line_starting);
		rc = data(&l, s + i, dn);
		if (rc)
			return rc;
		l.line += lines_in(s + i, at - i);
		if (rawe) {
			size_t b = rawe, bend;
			if (strip_after)
				b = skip_uws(s, n, b, NULL);
			char esign;
			size_t e = raw_end(s, n, b, &bend, &esign, &line_starting);
			if (!e)
				return fail(&l, "{% raw %} without {% endraw %}");
			bool ls = b > 0 && s[b - 1] == '\n';
			size_t bn = trim_before(s + b, bend - b, esign, true, ls);
			rc = data(&l, s + b, bn);
			if (rc)
				return rc;
			l.line += lines_in(s + rawe, e - rawe);
			l.pos = e;
			continue;
		}
		if (kind == '#') {
			size_t k = j;
			while (k + 1 < n && !(s[k] == '#' && s[k + 1] == '}'))
				k++;
			if (k + 1 >= n)
				return fail(&l, "a comment without its #}");
			size_t e = k + 2;
			bool strip = k > j && s[k - 1] == '-', plus = k > j && s[k - 1] == '+';
			if (strip)
				e = skip_uws(s, n, e, NULL);
			else if (!plus && e < n && s[e] == '\n')
				e++;
			l.line += lines_in(s + at, e - at);
			line_starting = s[e - 1] == '\n';
			l.pos = e;
			continue;
		}
		rc = push(&l, (struct jj_token){.type = kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN,
		                                .line = l.line});
		if (rc)
			return rc;
		l.pos = j;
		rc = expr(&l, kind == '%', &line_starting);
		if (rc)
			return rc;
	}
	return push(&l, (struct jj_token){.type = JT_EOF, .line = l.line});
}
