/*
 * jinja_parse.c: tokens to a tree, with jinja2's grammar and precedence
 * (parser.py): `a if b else c`, or, and, not, comparisons (chained, `in`,
 * `not in`), + -, ~, * / // %, **, unary - +, then postfix `.name`, `[...]`,
 * `(...)`, `|filter` and `is test`. What the engine does not implement (a
 * statement, a filter, a test, a method) is refused here with its name and
 * line, so a template never renders half-understood.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_int.h"

struct ps {
	struct jj_arena *a;
	const struct jj_tokens *tk;
	size_t i;
	int loop_depth, macro_depth, depth;
	char *err;
	size_t errlen;
	int rc;
};

static const struct jj_token *cur(struct ps *p) { return &p->tk->t[p->i]; }

static int fail(struct ps *p, const char *fmt, const char *arg, size_t n)
{
	if (!p->rc) {
		char what[200];
		snprintf(what, sizeof(what), fmt, (int)n, arg ? arg : "");
		p->rc = text_errf(p->err, p->errlen, BATON_EINVAL, "template line %d: %s", cur(p)->line, what);
	}
	return p->rc;
}

static bool is_name(struct ps *p, const char *w)
{
	const struct jj_token *t = cur(p);
	return t->type == JT_NAME && t->n == strlen(w) && !memcmp(t->s, w, t->n);
}

static bool is_op(struct ps *p, int op)
{
	return cur(p)->type == JT_OP && cur(p)->op == op;
}

static bool skip_name(struct ps *p, const char *w)
{
	if (!is_name(p, w))
		return false;
	p->i++;
	return true;
}

static bool skip_op(struct ps *p, int op)
{
	if (!is_op(p, op))
		return false;
	p->i++;
	return true;
}

static const char *tok_desc(const struct jj_token *t)
{
	switch (t->type) {
	case JT_EOF: return "the end of the template";
	case JT_DATA: return "text";
	case JT_VAR_END: return "}}";
	case JT_BLOCK_END: return "%}";
	case JT_NAME: return "a name";
	case JT_STRING: return "a string";
	case JT_INT:
	case JT_FLOAT: return "a number";
	default: return "an operator";
	}
}

static int expect_op(struct ps *p, int op, const char *what)
{
	if (skip_op(p, op))
		return 0;
	char m[120];
	snprintf(m, sizeof(m), "expected '%s', found %s", what, tok_desc(cur(p)));
	return fail(p, "%.*s", m, strlen(m));
}

static struct jj_node *node(struct ps *p, int kind)
{
	struct jj_node *n = jj_alloc(p->a, sizeof(*n));
	if (!n) {
		if (!p->rc)
			p->rc = text_errf(p->err, p->errlen, BATON_ENOMEM, "out of memory");
		return NULL;
	}
	n->kind = kind;
	n->line = cur(p)->line;
	return n;
}

/* Growing node lists, carved from the arena. */
struct nl {
	struct jj_node **v;
	size_t n, cap;
};

static int nl_push(struct ps *p, struct nl *l, struct jj_node *x)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4;
		struct jj_node **v = jj_alloc(p->a, cap * sizeof(*v));
		if (!v)
			return fail(p, "out of memory%.*s", "", 0);
		if (l->n)
			memcpy(v, l->v, l->n * sizeof(*v));
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = x;
	return 0;
}

static struct jj_node *parse_expr(struct ps *p, bool condexpr);
static struct jj_node *parse_or(struct ps *p);
static struct jj_node *parse_unary(struct ps *p, bool with_filter);
static struct jj_node *parse_primary(struct ps *p);
static struct jj_node *parse_postfix(struct ps *p, struct jj_node *n);

/* Call arguments after '(': positional into v, name=value into w. */
static int parse_args(struct ps *p, struct nl *args, struct nl *kw)
{
	while (!skip_op(p, JO_RPAREN)) {
		if (args->n + kw->n && expect_op(p, JO_COMMA, ","))
			return p->rc;
		if (skip_op(p, JO_RPAREN))
			break;
		if (is_op(p, JO_MUL) || is_op(p, JO_POW))
			return fail(p, "*args and **kwargs in calls are not supported%.*s", "", 0);
		if (cur(p)->type == JT_NAME && p->tk->t[p->i + 1].type == JT_OP &&
		    p->tk->t[p->i + 1].op == JO_ASSIGN) {
			struct jj_node *k = node(p, E_KW);
			if (!k)
				return p->rc;
			k->c = jv_str(cur(p)->s, cur(p)->n);
			p->i += 2;
			if (!(k->a = parse_expr(p, true)) || nl_push(p, kw, k))
				return p->rc;
		} else {
			if (kw->n)
				return fail(p, "a positional argument after a keyword argument%.*s", "", 0);
			struct jj_node *x = parse_expr(p, true);
			if (!x || nl_push(p, args, x))
				return p->rc;
		}
	}
	return 0;
}

static struct jj_node *parse_filter(struct ps *p, struct jj_node *base)
{
	/* after '|' */
	if (cur(p)->type != JT_NAME)
		return fail(p, "expected a filter name%.*s", "", 0), NULL;
	const struct jj_token *t = cur(p);
	int id = jj_filter_id(t->s, t->n);
	if (id < 0)
		return fail(p, "the filter '%.*s' is not supported", t->s, t->n), NULL;
	struct jj_node *f = node(p, E_FILTER);
	if (!f)
		return NULL;
	f->a = base;
	f->op = id;
	f->c = jv_str(t->s, t->n);
	p->i++;
	if (skip_op(p, JO_LPAREN)) {
		struct nl a = {0}, k = {0};
		if (parse_args(p, &a, &k))
			return NULL;
		f->v = a.v, f->nv = a.n, f->w = k.v, f->nw = k.n;
	}
	return f;
}

static struct jj_node *parse_test(struct ps *p, struct jj_node *base)
{
	/* after 'is' */
	struct jj_node *t = node(p, E_TEST);
	if (!t)
		return NULL;
	t->a = base;
	if (skip_name(p, "not"))
		t->neg = true;
	const struct jj_token *k = cur(p);
	if (k->type != JT_NAME)
		return fail(p, "expected a test name%.*s", "", 0), NULL;
	int id = jj_test_id(k->s, k->n);
	if (id < 0)
		return fail(p, "the test '%.*s' is not supported", k->s, k->n), NULL;
	t->op = id;
	t->c = jv_str(k->s, k->n);
	p->i++;
	struct nl a = {0}, kw = {0};
	if (skip_op(p, JO_LPAREN)) {
		if (parse_args(p, &a, &kw))
			return NULL;
		if (kw.n)
			return fail(p, "keyword arguments to tests are not supported%.*s", "", 0), NULL;
	} else {
		const struct jj_token *n = cur(p);
		bool arg = n->type == JT_NAME || n->type == JT_STRING || n->type == JT_INT ||
		           n->type == JT_FLOAT ||
		           (n->type == JT_OP &&
		            (n->op == JO_LPAREN || n->op == JO_LBRACKET || n->op == JO_LBRACE));
		if (arg && (is_name(p, "else") || is_name(p, "or") || is_name(p, "and")))
			arg = false;
		if (arg && is_name(p, "is"))
			return fail(p, "you cannot chain multiple tests with is%.*s", "", 0), NULL;
		if (arg) {
			struct jj_node *x = parse_primary(p);
			if (!x || !(x = parse_postfix(p, x)) || nl_push(p, &a, x))
				return NULL;
		}
	}
	t->v = a.v, t->nv = a.n;
	return t;
}

static struct jj_node *parse_subscript(struct ps *p, struct jj_node *obj)
{
	/* after '[' */
	struct jj_node *parts[3] = {0};
	int k = 0;
	bool slice = false;
	for (;;) {
		if (is_op(p, JO_COLON)) {
			p->i++;
			slice = true;
			if (++k > 2)
				return fail(p, "a slice with more than three parts%.*s", "", 0), NULL;
			continue;
		}
		if (is_op(p, JO_RBRACKET))
			break;
		if (parts[k])
			return fail(p, "expected ']'%.*s", "", 0), NULL;
		if (!(parts[k] = parse_expr(p, true)))
			return NULL;
		if (is_op(p, JO_COMMA))
			return fail(p, "tuple subscripts are not supported%.*s", "", 0), NULL;
	}
	p->i++;
	struct jj_node *n;
	if (!slice) {
		if (!parts[0])
			return fail(p, "an empty subscript%.*s", "", 0), NULL;
		if (!(n = node(p, E_ITEM)))
			return NULL;
		n->a = obj;
		n->b = parts[0];
		return n;
	}
	if (!(n = node(p, E_SLICE)) || !(n->v = jj_alloc(p->a, 3 * sizeof(*n->v))))
		return fail(p, "out of memory%.*s", "", 0), NULL;
	n->a = obj;
	n->nv = 3;
	memcpy(n->v, parts, sizeof(parts));
	return n;
}

static struct jj_node *parse_postfix(struct ps *p, struct jj_node *n)
{
	while (n) {
		if (skip_op(p, JO_DOT)) {
			const struct jj_token *t = cur(p);
			struct jj_node *a;
			if (t->type == JT_NAME) {
				if (!(a = node(p, E_ATTR)))
					return NULL;
				a->c = jv_str(t->s, t->n);
			} else if (t->type == JT_INT) {
				if (!(a = node(p, E_ITEM)) || !(a->b = node(p, E_CONST)))
					return NULL;
				a->b->c = jv_int(t->i);
			} else
				return fail(p, "expected a name after '.'%.*s", "", 0), NULL;
			a->a = n;
			p->i++;
			n = a;
		} else if (skip_op(p, JO_LBRACKET)) {
			n = parse_subscript(p, n);
		} else if (is_op(p, JO_LPAREN)) {
			p->i++;
			struct jj_node *c = node(p, E_CALL);
			if (!c)
				return NULL;
			if (n->kind == E_ATTR && jj_method_id(n->c.s.p, n->c.s.n) < 0)
				return fail(p, "the method '%.*s' is not supported", n->c.s.p, n->c.s.n), NULL;
			if (n->kind == E_NAME && jj_global_id(n->c.s.p, n->c.s.n) == -2)
				return fail(p, "the function '%.*s' is not supported", n->c.s.p, n->c.s.n), NULL;
			c->a = n;
			struct nl a = {0}, k = {0};
			if (parse_args(p, &a, &k))
				return NULL;
			c->v = a.v, c->nv = a.n, c->w = k.v, c->nw = k.n;
			n = c;
		} else
			break;
	}
	return n;
}

static struct jj_node *parse_filter_expr(struct ps *p, struct jj_node *n)
{
	while (n) {
		if (skip_op(p, JO_PIPE))
			n = parse_filter(p, n);
		else if (skip_name(p, "is"))
			n = parse_test(p, n);
		else if (is_op(p, JO_LPAREN) || is_op(p, JO_DOT) || is_op(p, JO_LBRACKET))
			n = parse_postfix(p, n);
		else
			break;
	}
	return n;
}

static struct jj_node *parse_seq(struct ps *p, int kind, int close)
{
	struct jj_node *n = node(p, kind);
	struct nl v = {0}, w = {0};
	if (!n)
		return NULL;
	while (!skip_op(p, close)) {
		if (v.n && expect_op(p, JO_COMMA, ","))
			return NULL;
		if (skip_op(p, close))
			break;
		struct jj_node *x = parse_expr(p, true);
		if (!x || nl_push(p, &v, x))
			return NULL;
		if (kind == E_DICT) {
			if (expect_op(p, JO_COLON, ":"))
				return NULL;
			if (!(x = parse_expr(p, true)) || nl_push(p, &w, x))
				return NULL;
		}
	}
	n->v = v.v, n->nv = v.n, n->w = w.v, n->nw = w.n;
	return n;
}

static struct jj_node *parse_primary(struct ps *p)
{
	const struct jj_token *t = cur(p);
	struct jj_node *n;
	switch (t->type) {
	case JT_NAME:
		if (!(n = node(p, E_CONST)))
			return NULL;
		p->i++;
#define W(lit) (t->n == strlen(lit) && !memcmp(t->s, lit, t->n))
		if (W("true") || W("True"))
			n->c = jv_bool(true);
		else if (W("false") || W("False"))
			n->c = jv_bool(false);
		else if (W("none") || W("None"))
			n->c = jv_none();
		else {
			n->kind = E_NAME;
			n->c = jv_str(t->s, t->n);
		}
#undef W
		return n;
	case JT_STRING: {
		if (!(n = node(p, E_CONST)))
			return NULL;
		size_t len = 0, k = p->i;
		while (p->tk->t[k].type == JT_STRING)
			len += p->tk->t[k++].n;
		if (k == p->i + 1) {
			n->c = jv_str(t->s, t->n);
			p->i++;
			return n;
		}
		char *s = jj_alloc(p->a, len + 1), *o = s;
		if (!s)
			return fail(p, "out of memory%.*s", "", 0), NULL;
		for (; p->i < k; p->i++) {
			memcpy(o, p->tk->t[p->i].s, p->tk->t[p->i].n);
			o += p->tk->t[p->i].n;
		}
		n->c = jv_str(s, len);
		return n;
	}
	case JT_INT:
	case JT_FLOAT:
		if (!(n = node(p, E_CONST)))
			return NULL;
		n->c = t->type == JT_INT ? jv_int(t->i) : jv_float(t->f);
		p->i++;
		return n;
	case JT_OP:
		if (skip_op(p, JO_LPAREN)) {
			if (skip_op(p, JO_RPAREN))
				return node(p, E_TUPLE);
			struct jj_node *x = parse_expr(p, true);
			if (!x)
				return NULL;
			if (skip_op(p, JO_RPAREN))
				return x;
			struct jj_node *tu = node(p, E_TUPLE);
			struct nl v = {0};
			if (!tu || nl_push(p, &v, x))
				return NULL;
			while (skip_op(p, JO_COMMA)) {
				if (is_op(p, JO_RPAREN))
					break;
				if (!(x = parse_expr(p, true)) || nl_push(p, &v, x))
					return NULL;
			}
			if (expect_op(p, JO_RPAREN, ")"))
				return NULL;
			tu->v = v.v, tu->nv = v.n;
			return tu;
		}
		if (skip_op(p, JO_LBRACKET))
			return parse_seq(p, E_LIST, JO_RBRACKET);
		if (skip_op(p, JO_LBRACE))
			return parse_seq(p, E_DICT, JO_RBRACE);
		break;
	default:
		break;
	}
	char m[120];
	snprintf(m, sizeof(m), "unexpected %s", tok_desc(t));
	return fail(p, "%.*s", m, strlen(m)), NULL;
}

static struct jj_node *parse_unary(struct ps *p, bool with_filter)
{
	struct jj_node *n;
	if (is_op(p, JO_SUB) || is_op(p, JO_ADD)) {
		n = node(p, is_op(p, JO_SUB) ? E_NEG : E_POS);
		p->i++;
		if (++p->depth > 100)
			return fail(p, "expressions nested too deep%.*s", "", 0), NULL;
		if (!n || !(n->a = parse_unary(p, false)))
			return NULL;
		p->depth--;
	} else
		n = parse_primary(p);
	n = parse_postfix(p, n);
	if (with_filter)
		n = parse_filter_expr(p, n);
	return n;
}

static struct jj_node *bin(struct ps *p, int op, struct jj_node *a, struct jj_node *b)
{
	struct jj_node *n = a && b ? node(p, E_BIN) : NULL;
	if (!n)
		return NULL;
	n->op = op;
	n->a = a;
	n->b = b;
	n->line = a->line;
	return n;
}

static struct jj_node *parse_pow(struct ps *p)
{
	struct jj_node *n = parse_unary(p, true);
	while (n && skip_op(p, JO_POW))
		n = bin(p, JO_POW, n, parse_unary(p, true));
	return n;
}

static struct jj_node *parse_math2(struct ps *p)
{
	struct jj_node *n = parse_pow(p);
	while (n && cur(p)->type == JT_OP &&
	       (cur(p)->op == JO_MUL || cur(p)->op == JO_DIV || cur(p)->op == JO_FLOORDIV ||
	        cur(p)->op == JO_MOD)) {
		int op = cur(p)->op;
		p->i++;
		n = bin(p, op, n, parse_pow(p));
	}
	return n;
}

static struct jj_node *parse_concat(struct ps *p)
{
	struct jj_node *n = parse_math2(p);
	while (n && skip_op(p, JO_TILDE))
		n = bin(p, JO_TILDE, n, parse_math2(p));
	return n;
}

static struct jj_node *parse_math1(struct ps *p)
{
	struct jj_node *n = parse_concat(p);
	while (n && (is_op(p, JO_ADD) || is_op(p, JO_SUB))) {
		int op = cur(p)->op;
		p->i++;
		n = bin(p, op, n, parse_concat(p));
	}
	return n;
}

static struct jj_node *parse_compare(struct ps *p)
{
	struct jj_node *first = parse_math1(p);
	if (!first)
		return NULL;
	struct nl v = {0};
	int ops[64], k = 0;
	for (;;) {
		int op = 0;
		if (cur(p)->type == JT_OP && cur(p)->op >= JO_EQ && cur(p)->op <= JO_GE) {
			op = cur(p)->op;
			p->i++;
		} else if (skip_name(p, "in"))
			op = JO_IN;
		else if (is_name(p, "not") && p->tk->t[p->i + 1].type == JT_NAME &&
		         p->tk->t[p->i + 1].n == 2 && !memcmp(p->tk->t[p->i + 1].s, "in", 2)) {
			p->i += 2;
			op = JO_NOTIN;
		} else
			break;
		if (k == 64)
			return fail(p, "too many chained comparisons%.*s", "", 0), NULL;
		ops[k++] = op;
		struct jj_node *x = parse_math1(p);
		if (!x || nl_push(p, &v, x))
			return NULL;
	}
	if (!k)
		return first;
	struct jj_node *n = node(p, E_CMP);
	if (!n || !(n->ops = jj_alloc(p->a, (size_t)k * sizeof(int))))
		return fail(p, "out of memory%.*s", "", 0), NULL;
	memcpy(n->ops, ops, (size_t)k * sizeof(int));
	n->a = first;
	n->v = v.v;
	n->nv = v.n;
	return n;
}

static struct jj_node *parse_not(struct ps *p)
{
	if (is_name(p, "not")) {
		struct jj_node *n = node(p, E_NOT);
		p->i++;
		if (++p->depth > 100)
			return fail(p, "expressions nested too deep%.*s", "", 0), NULL;
		if (!n || !(n->a = parse_not(p)))
			return NULL;
		p->depth--;
		return n;
	}
	return parse_compare(p);
}

static struct jj_node *parse_and(struct ps *p)
{
	struct jj_node *n = parse_not(p);
	while (n && is_name(p, "and")) {
		struct jj_node *x = node(p, E_AND);
		p->i++;
		if (!x || !(x->b = parse_not(p)))
			return NULL;
		x->a = n;
		n = x;
	}
	return n;
}

static struct jj_node *parse_or(struct ps *p)
{
	struct jj_node *n = parse_and(p);
	while (n && is_name(p, "or")) {
		struct jj_node *x = node(p, E_OR);
		p->i++;
		if (!x || !(x->b = parse_and(p)))
			return NULL;
		x->a = n;
		n = x;
	}
	return n;
}

static struct jj_node *parse_expr(struct ps *p, bool condexpr)
{
	if (++p->depth > 100)
		return fail(p, "expressions nested too deep%.*s", "", 0), NULL;
	struct jj_node *n = parse_or(p);
	while (n && condexpr && is_name(p, "if")) {
		struct jj_node *c = node(p, E_COND);
		p->i++;
		if (!c || !(c->b = parse_or(p)))
			return NULL;
		c->a = n;
		if (skip_name(p, "else") && !(c->x = parse_expr(p, true)))
			return NULL;
		n = c;
	}
	p->depth--;
	return n;
}

/* An expression, or a tuple of them without parentheses (`a, b`). */
static struct jj_node *parse_tuple(struct ps *p, bool condexpr, bool names_only)
{
	struct nl v = {0};
	bool comma = false;
	for (;;) {
		struct jj_node *x;
		if (names_only) {
			if (cur(p)->type != JT_NAME)
				return fail(p, "expected a name to assign to%.*s", "", 0), NULL;
			x = parse_primary(p);
			if (x && x->kind != E_NAME)
				return fail(p, "cannot assign to a constant%.*s", "", 0), NULL;
		} else
			x = parse_expr(p, condexpr);
		if (!x || nl_push(p, &v, x))
			return NULL;
		if (!skip_op(p, JO_COMMA))
			break;
		comma = true;
		if (cur(p)->type == JT_BLOCK_END || cur(p)->type == JT_VAR_END || is_op(p, JO_ASSIGN) ||
		    is_name(p, "in"))
			break;
	}
	if (!comma)
		return v.v[0];
	struct jj_node *t = node(p, E_TUPLE);
	if (!t)
		return NULL;
	t->v = v.v, t->nv = v.n;
	return t;
}

static int block_end(struct ps *p)
{
	if (cur(p)->type == JT_BLOCK_END) {
		p->i++;
		return 0;
	}
	char m[120];
	snprintf(m, sizeof(m), "expected '%%}', found %s", tok_desc(cur(p)));
	return fail(p, "%.*s", m, strlen(m));
}

/* Statements until one of the end words (NULL-terminated) opens a tag; that
 * word is left current (after its {%). */
static int parse_body(struct ps *p, const char *const *ends, struct nl *out);

static bool at_end_word(struct ps *p, const char *const *ends)
{
	for (size_t k = 0; ends && ends[k]; k++)
		if (is_name(p, ends[k]))
			return true;
	return false;
}

static int body_until(struct ps *p, const char *const *ends, struct jj_node ***v, size_t *n)
{
	struct nl l = {0};
	if (parse_body(p, ends, &l))
		return p->rc;
	*v = l.v;
	*n = l.n;
	return 0;
}

static struct jj_node *parse_if(struct ps *p)
{
	static const char *const ends[] = {"elif", "else", "endif", NULL};
	struct jj_node *n = node(p, N_IF);
	if (!n || !(n->a = parse_tuple(p, true, false)) || block_end(p) ||
	    body_until(p, ends, &n->v, &n->nv))
		return NULL;
	if (skip_name(p, "elif")) {
		struct jj_node *e = parse_if(p);
		if (!e || !(n->w = jj_alloc(p->a, sizeof(*n->w))))
			return NULL;
		n->w[0] = e;
		n->nw = 1;
		return n;
	}
	if (skip_name(p, "else")) {
		static const char *const endif[] = {"endif", NULL};
		if (block_end(p) || body_until(p, endif, &n->w, &n->nw))
			return NULL;
	}
	if (!skip_name(p, "endif") || block_end(p))
		return fail(p, "expected endif%.*s", "", 0), NULL;
	return n;
}

static struct jj_node *parse_for(struct ps *p)
{
	static const char *const ends[] = {"else", "endfor", NULL};
	struct jj_node *n = node(p, N_FOR);
	if (!n || !(n->a = parse_tuple(p, false, true)))
		return NULL;
	if (!skip_name(p, "in"))
		return fail(p, "expected 'in' in a for loop%.*s", "", 0), NULL;
	if (!(n->b = parse_tuple(p, false, false)))
		return NULL;
	if (skip_name(p, "if") && !(n->x = parse_expr(p, true)))
		return NULL;
	if (is_name(p, "recursive"))
		return fail(p, "recursive for loops are not supported%.*s", "", 0), NULL;
	if (block_end(p))
		return NULL;
	p->loop_depth++;
	if (body_until(p, ends, &n->v, &n->nv))
		return NULL;
	p->loop_depth--;
	if (skip_name(p, "else")) {
		static const char *const endfor[] = {"endfor", NULL};
		if (block_end(p) || body_until(p, endfor, &n->w, &n->nw))
			return NULL;
	}
	if (!skip_name(p, "endfor") || block_end(p))
		return fail(p, "expected endfor%.*s", "", 0), NULL;
	return n;
}

static struct jj_node *parse_target(struct ps *p)
{
	/* name, name.attr (a namespace), or a tuple of names */
	if (cur(p)->type == JT_NAME && p->tk->t[p->i + 1].type == JT_OP &&
	    p->tk->t[p->i + 1].op == JO_DOT) {
		struct jj_node *ns = parse_primary(p);
		p->i++;
		if (!ns || cur(p)->type != JT_NAME)
			return fail(p, "expected an attribute name%.*s", "", 0), NULL;
		struct jj_node *a = node(p, E_ATTR);
		if (!a)
			return NULL;
		a->a = ns;
		a->c = jv_str(cur(p)->s, cur(p)->n);
		p->i++;
		return a;
	}
	return parse_tuple(p, false, true);
}

static struct jj_node *parse_set(struct ps *p)
{
	struct jj_node *n = node(p, N_SET);
	if (!n || !(n->a = parse_target(p)))
		return NULL;
	if (skip_op(p, JO_ASSIGN)) {
		if (!(n->b = parse_tuple(p, true, false)) || block_end(p))
			return NULL;
		return n;
	}
	if (n->a->kind != E_NAME && n->a->kind != E_ATTR)
		return fail(p, "a block set needs one name%.*s", "", 0), NULL;
	if (is_op(p, JO_PIPE))
		return fail(p, "filters on a block set are not supported%.*s", "", 0), NULL;
	static const char *const ends[] = {"endset", NULL};
	n->kind = N_SETBLOCK;
	if (block_end(p) || body_until(p, ends, &n->v, &n->nv))
		return NULL;
	if (!skip_name(p, "endset") || block_end(p))
		return fail(p, "expected endset%.*s", "", 0), NULL;
	return n;
}

static struct jj_node *parse_macro(struct ps *p)
{
	struct jj_node *n = node(p, N_MACRO);
	if (!n)
		return NULL;
	if (cur(p)->type != JT_NAME)
		return fail(p, "expected a macro name%.*s", "", 0), NULL;
	n->c = jv_str(cur(p)->s, cur(p)->n);
	p->i++;
	if (expect_op(p, JO_LPAREN, "("))
		return NULL;
	struct nl params = {0};
	while (!skip_op(p, JO_RPAREN)) {
		if (params.n && expect_op(p, JO_COMMA, ","))
			return NULL;
		if (cur(p)->type != JT_NAME)
			return fail(p, "expected a parameter name%.*s", "", 0), NULL;
		struct jj_node *x = parse_primary(p);
		if (!x || x->kind != E_NAME)
			return fail(p, "expected a parameter name%.*s", "", 0), NULL;
		if (skip_op(p, JO_ASSIGN) && !(x->b = parse_expr(p, true)))
			return NULL;
		if (nl_push(p, &params, x))
			return NULL;
	}
	n->v = params.v, n->nv = params.n;
	if (block_end(p))
		return NULL;
	static const char *const ends[] = {"endmacro", NULL};
	int saved = p->loop_depth;
	p->loop_depth = 0;
	p->macro_depth++;
	if (body_until(p, ends, &n->w, &n->nw))
		return NULL;
	p->macro_depth--;
	p->loop_depth = saved;
	if (!skip_name(p, "endmacro") || block_end(p))
		return fail(p, "expected endmacro%.*s", "", 0), NULL;
	return n;
}

/* {% call [(params)] macro(args) %}body{% endcall %}: the body becomes a
 * macro named caller that the called macro may call. */
static struct jj_node *parse_call_block(struct ps *p)
{
	struct jj_node *n = node(p, N_CALLBLOCK), *c = node(p, N_MACRO);
	if (!n || !c)
		return NULL;
	c->c = jv_str("caller", 6);
	struct nl params = {0};
	if (skip_op(p, JO_LPAREN)) {
		while (!skip_op(p, JO_RPAREN)) {
			if (params.n && expect_op(p, JO_COMMA, ","))
				return NULL;
			struct jj_node *x = cur(p)->type == JT_NAME ? parse_primary(p) : NULL;
			if (!x || x->kind != E_NAME)
				return fail(p, "expected a parameter name%.*s", "", 0), NULL;
			if (skip_op(p, JO_ASSIGN) && !(x->b = parse_expr(p, true)))
				return NULL;
			if (nl_push(p, &params, x))
				return NULL;
		}
	}
	c->v = params.v, c->nv = params.n;
	if (!(n->a = parse_expr(p, true)))
		return NULL;
	if (n->a->kind != E_CALL)
		return fail(p, "a call block needs a call%.*s", "", 0), NULL;
	if (block_end(p))
		return NULL;
	static const char *const ends[] = {"endcall", NULL};
	int saved = p->loop_depth;
	p->loop_depth = 0;
	if (body_until(p, ends, &c->w, &c->nw))
		return NULL;
	p->loop_depth = saved;
	if (!skip_name(p, "endcall") || block_end(p))
		return fail(p, "expected endcall%.*s", "", 0), NULL;
	n->b = c;
	return n;
}

static struct jj_node *parse_filter_block(struct ps *p)
{
	struct jj_node *n = node(p, N_FILTERBLOCK), *f = NULL;
	if (!n)
		return NULL;
	do {
		if (!(f = parse_filter(p, f)))
			return NULL;
	} while (skip_op(p, JO_PIPE));
	n->a = f;
	static const char *const ends[] = {"endfilter", NULL};
	if (block_end(p) || body_until(p, ends, &n->v, &n->nv))
		return NULL;
	if (!skip_name(p, "endfilter") || block_end(p))
		return fail(p, "expected endfilter%.*s", "", 0), NULL;
	return n;
}

static struct jj_node *parse_with(struct ps *p)
{
	struct jj_node *n = node(p, N_WITH);
	struct nl sets = {0};
	if (!n)
		return NULL;
	while (cur(p)->type != JT_BLOCK_END) {
		if (sets.n && expect_op(p, JO_COMMA, ","))
			return NULL;
		struct jj_node *s = node(p, N_SET);
		if (!s || !(s->a = parse_tuple(p, false, true)) || expect_op(p, JO_ASSIGN, "=") ||
		    !(s->b = parse_expr(p, true)) || nl_push(p, &sets, s))
			return NULL;
	}
	n->v = sets.v, n->nv = sets.n;
	static const char *const ends[] = {"endwith", NULL};
	if (block_end(p) || body_until(p, ends, &n->w, &n->nw))
		return NULL;
	if (!skip_name(p, "endwith") || block_end(p))
		return fail(p, "expected endwith%.*s", "", 0), NULL;
	return n;
}

/* The statement after {% (the keyword current). */
static struct jj_node *parse_statement(struct ps *p)
{
	const struct jj_token *t = cur(p);
	if (t->type != JT_NAME)
		return fail(p, "expected a statement after {%%%.*s", "", 0), NULL;
	p->i++;
#define W(lit) (t->n == strlen(lit) && !memcmp(t->s, lit, t->n))
	if (W("if"))
		return parse_if(p);
	if (W("for"))
		return parse_for(p);
	if (W("set"))
		return parse_set(p);
	if (W("macro"))
		return parse_macro(p);
	if (W("filter"))
		return parse_filter_block(p);
	if (W("call"))
		return parse_call_block(p);
	if (W("with"))
		return parse_with(p);
	if (W("break") || W("continue")) {
		if (!p->loop_depth)
			return fail(p, "'%.*s' outside a for loop", t->s, t->n), NULL;
		struct jj_node *n = node(p, W("break") ? N_BREAK : N_CONTINUE);
		if (!n || block_end(p))
			return NULL;
		return n;
	}
	if (W("generation")) {
		/* transformers' AssistantTracker: the body renders as it is */
		static const char *const ends[] = {"endgeneration", NULL};
		struct jj_node *n = node(p, N_BODY);
		if (!n || block_end(p) || body_until(p, ends, &n->v, &n->nv))
			return NULL;
		if (!skip_name(p, "endgeneration") || block_end(p))
			return fail(p, "expected endgeneration%.*s", "", 0), NULL;
		return n;
	}
#undef W
	p->i--;
	return fail(p, "the '%.*s' statement is not supported", t->s, t->n), NULL;
}

static int parse_body(struct ps *p, const char *const *ends, struct nl *out)
{
	for (;;) {
		const struct jj_token *t = cur(p);
		struct jj_node *n = NULL;
		if (t->type == JT_EOF) {
			if (ends)
				return fail(p, "the template ends inside a block (expected %.*s)", ends[0],
				            strlen(ends[0]));
			return 0;
		}
		if (t->type == JT_DATA) {
			if (!(n = node(p, N_DATA)))
				return p->rc;
			n->c = jv_str(t->s, t->n);
			p->i++;
		} else if (t->type == JT_VAR_BEGIN) {
			p->i++;
			if (!(n = node(p, N_OUT)) || !(n->a = parse_tuple(p, true, false)))
				return p->rc;
			if (cur(p)->type != JT_VAR_END) {
				char m[120];
				snprintf(m, sizeof(m), "expected '}}', found %s", tok_desc(cur(p)));
				return fail(p, "%.*s", m, strlen(m));
			}
			p->i++;
		} else if (t->type == JT_BLOCK_BEGIN) {
			p->i++;
			if (at_end_word(p, ends))
				return 0;
			if (!(n = parse_statement(p)))
				return p->rc;
		} else
			return fail(p, "unexpected %.*s", tok_desc(t), strlen(tok_desc(t)));
		if (nl_push(p, out, n))
			return p->rc;
	}
}

int jj_parse(struct jj_arena *a, const struct jj_tokens *toks, struct jj_node **out, char *err,
             size_t errlen)
{
	struct ps p = {.a = a, .tk = toks, .err = err, .errlen = errlen};
	struct jj_node *body = node(&p, N_BODY);
	struct nl l = {0};
	if (!body || parse_body(&p, NULL, &l))
		return p.rc ? p.rc : BATON_ENOMEM;
	body->v = l.v;
	body->nv = l.n;
	*out = body;
	return 0;
}
