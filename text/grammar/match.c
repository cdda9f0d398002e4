/*
 * match.c: the matcher: a pushdown automaton over the grammar's bytes,
 * whose state is a set of stacks (the grammar may be ambiguous: anyOf
 * branches that start alike), each a linked list of frames shared with
 * its siblings, kept with every top on a terminal (closure done). The
 * token mask walks the vocabulary's trie from the state, one byte per
 * edge, dropping a subtree as soon as no stack survives; inside a free
 * string it starts from the plain tokens' table and walks only the paths
 * to a '"' or '\\' (docs/internals/grammar.md).
 */
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"

#define MAX_STACKS 256u
#define MAX_DEPTH 400u
#define MAX_EXPAND 4096u
#define CHUNK (1u << 16)

struct frame {
	uint32_t pos;           /* top: a terminal; below: where to go on */
	uint32_t cnt;           /* E_REP / E_STR: count so far */
	uint16_t sub;           /* E_STR: substate of the byte automaton */
	uint16_t depth;
	const struct frame *up;
};

/* The stack that is done (the document complete). */
static const struct frame ACCEPT_FRAME;
#define ACCEPT (&ACCEPT_FRAME)

/* A bump allocator over chunks, rewound to a mark. */
struct arena {
	char **chunk;
	size_t n, cap;     /* chunks */
	size_t at, off;    /* the current chunk and offset */
	int oom;
};

struct mark {
	size_t at, off;
};

static void *aalloc(struct arena *a, size_t sz)
{
	sz = (sz + 15) & ~(size_t)15;
	if (a->n && a->off + sz <= CHUNK) {
		void *p = a->chunk[a->at] + a->off;
		a->off += sz;
		return p;
	}
	if (a->n && a->at + 1 < a->n) {
		a->at++;
		a->off = sz;
		return a->chunk[a->at];
	}
	if (a->n == a->cap) {
		size_t c = a->cap ? 2 * a->cap : 8;
		char **q = realloc(a->chunk, c * sizeof *q);
		if (!q) {
			a->oom = 1;
			return NULL;
		}
		a->chunk = q;
		a->cap = c;
	}
	if (!(a->chunk[a->n] = malloc(CHUNK))) {
		a->oom = 1;
		return NULL;
	}
	a->at = a->n++;
	a->off = sz;
	return a->chunk[a->at];
}

static struct mark amark(const struct arena *a)
{
	return (struct mark){ a->at, a->off };
}

static void arewind(struct arena *a, struct mark m)
{
	a->at = m.at;
	a->off = m.off;
}

static void areset(struct arena *a)
{
	a->at = 0;
	a->off = 0;
}

static void afree(struct arena *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->chunk[i]);
	free(a->chunk);
	memset(a, 0, sizeof *a);
}

enum { S0 = 0, U1, U2, U3, UE0, UED, UF0, UF4, ESC, X1, XD2, X2, X3, X4 };

struct state {
	const struct frame **top;
	uint32_t n;
};

struct gram_match {
	const gram *g;
	const gram_vocab *v;
	struct arena keep[2];  /* the current state's frames, and the next's */
	int cur;
	struct arena scratch;  /* the mask walk's and accept's frames */
	struct state st;       /* in keep[cur] */
	uint64_t visits;
	uint8_t plain[256];    /* bytes a string body takes as they are */
	uint8_t strset[X4 + 1][32]; /* the bytes a string body takes in each substate */
	uint64_t *allow;       /* of the running mask */
	const struct tnode *tn; /* the trie it walks, its children and token lists */
	const struct tkid *tk;
	const uint32_t *tt;
	int qf;                /* the quote trie: filter by qlo..qhi characters */
	uint32_t qlo, qhi;
	int expands, overflow;
};

/* ---- the string body's byte automaton ---- */

static int is_hex(uint8_t c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

int gram_str_step(uint32_t *sub, uint32_t *cnt, uint32_t max, uint8_t c)
{
	switch (*sub) {
	case S0:
		if (c == '"' || c < 0x20 || *cnt >= max)
			return 0;
		if (c == '\\')
			*sub = ESC;
		else if (c < 0x80)
			*sub = S0;
		else if (c >= 0xC2 && c <= 0xDF)
			*sub = U1;
		else if (c == 0xE0)
			*sub = UE0;
		else if (c == 0xED)
			*sub = UED;
		else if (c >= 0xE1 && c <= 0xEF)
			*sub = U2;
		else if (c == 0xF0)
			*sub = UF0;
		else if (c >= 0xF1 && c <= 0xF3)
			*sub = U3;
		else if (c == 0xF4)
			*sub = UF4;
		else
			return 0;
		(*cnt)++;
		return 1;
	case U1: case U2: case U3:
		if (c < 0x80 || c > 0xBF)
			return 0;
		*sub = *sub == U1 ? S0 : *sub == U2 ? U1 : U2;
		return 1;
	case UE0:
		if (c < 0xA0 || c > 0xBF)
			return 0;
		*sub = U1;
		return 1;
	case UED:
		if (c < 0x80 || c > 0x9F)
			return 0;
		*sub = U1;
		return 1;
	case UF0:
		if (c < 0x90 || c > 0xBF)
			return 0;
		*sub = U2;
		return 1;
	case UF4:
		if (c < 0x80 || c > 0x8F)
			return 0;
		*sub = U2;
		return 1;
	case ESC:
		if (c == 'u')
			*sub = X1;
		else if (strchr("\"\\/bfnrt", c) && c)
			*sub = S0;
		else
			return 0;
		return 1;
	case X1:
		if (!is_hex(c))
			return 0;
		*sub = c == 'd' || c == 'D' ? XD2 : X2;
		return 1;
	case XD2:
		if (c < '0' || c > '7')
			return 0;
		*sub = X3;
		return 1;
	case X2: case X3: case X4:
		if (!is_hex(c))
			return 0;
		*sub = *sub == X2 ? X3 : *sub == X3 ? X4 : S0;
		return 1;
	}
	return 0;
}

/* ---- closure and steps ---- */
static int add_top(struct gram_match *m, struct arena *a, struct state *out, uint32_t pos,
    uint32_t cnt, uint32_t sub, const struct frame *up)
{
	for (uint32_t i = 0; i < out->n; i++) {
		const struct frame *f = out->top[i];
		if (f != ACCEPT && f->pos == pos && f->cnt == cnt && f->sub == sub && f->up == up)
			return 0;
	}
	if (out->n >= MAX_STACKS) {
		m->overflow = 1;
		return 0;
	}
	struct frame *f = aalloc(a, sizeof *f);
	if (!f)
		return -1;
	*f = (struct frame){ pos, cnt, (uint16_t)sub, (uint16_t)(up ? up->depth + 1 : 0), up };
	out->top[out->n++] = f;
	return 0;
}

static void add_accept(struct state *out)
{
	for (uint32_t i = 0; i < out->n; i++)
		if (out->top[i] == ACCEPT)
			return;
	if (out->n < MAX_STACKS)
		out->top[out->n++] = ACCEPT;
}

/* Puts into out every stack with a terminal on top that element pos
 * (count cnt, substate sub) under `up` leads to without a byte. */
static int expand(struct gram_match *m, struct arena *a, struct state *out, uint32_t pos,
    uint32_t cnt, uint32_t sub, const struct frame *up)
{
	const gram *g = m->g;
	if (++m->expands > (int)MAX_EXPAND || (up && up->depth >= MAX_DEPTH)) {
		m->overflow = 1;
		return 0;
	}
	const struct gel *e = &g->el[pos];
	switch (e->kind) {
	case E_END:
		if (!up) {
			add_accept(out);
			return 0;
		}
		return expand(m, a, out, up->pos, 0, 0, up->up);
	case E_REF: {
		const struct frame *cont = up;
		if (g->el[pos + 1].kind != E_END) { /* not a tail call: remember where to go on */
			struct frame *f = aalloc(a, sizeof *f);
			if (!f)
				return -1;
			*f = (struct frame){ pos + 1, 0, 0, (uint16_t)(up ? up->depth + 1 : 0), up };
			cont = f;
		}
		uint32_t r = e->a, a0 = g->rule_alt0[r];
		for (uint32_t i = 0; i < g->rule_nalt[r]; i++)
			if (expand(m, a, out, g->alt[a0 + i], 0, 0, cont))
				return -1;
		return 0;
	}
	case E_REP:
		if (cnt < e->b && add_top(m, a, out, pos, cnt, 0, up))
			return -1;
		if (cnt >= e->a)
			return expand(m, a, out, pos + 1, 0, 0, up);
		return 0;
	case E_STR:
		if ((cnt < e->b || sub != S0) && add_top(m, a, out, pos, cnt, sub, up))
			return -1;
		if (sub == S0 && cnt >= e->a)
			return expand(m, a, out, pos + 1, 0, 0, up);
		return 0;
	default:
		return add_top(m, a, out, pos, 0, 0, up);
	}
}

static int in_set(const gram *g, uint16_t set, uint8_t c)
{
	return g->sets[set][c >> 3] >> (c & 7) & 1;
}

/* out = the stacks of `in` after byte c (out->top allocated here). */
static int advance(struct gram_match *m, struct arena *a, const struct state *in, uint8_t c,
    struct state *out)
{
	const gram *g = m->g;
	out->n = 0;
	out->top = aalloc(a, MAX_STACKS * sizeof *out->top);
	if (!out->top)
		return -1;
	m->expands = 0;
	for (uint32_t i = 0; i < in->n; i++) {
		const struct frame *f = in->top[i];
		if (f == ACCEPT)
			continue;
		const struct gel *e = &g->el[f->pos];
		int rc = 0;
		switch (e->kind) {
		case E_BYTE:
			if (c == e->byte)
				rc = expand(m, a, out, f->pos + 1, 0, 0, f->up);
			break;
		case E_SET:
			if (in_set(g, e->set, c))
				rc = expand(m, a, out, f->pos + 1, 0, 0, f->up);
			break;
		case E_REP:
			if (f->cnt < e->b && in_set(g, e->set, c))
				rc = expand(m, a, out, f->pos, f->cnt + 1, 0, f->up);
			break;
		case E_STR: {
			uint32_t sub = f->sub, cnt = f->cnt;
			if (gram_str_step(&sub, &cnt, e->b, c))
				rc = expand(m, a, out, f->pos, cnt, sub, f->up);
			break;
		}
		}
		if (rc)
			return -1;
	}
	return 0;
}

/* Copies a state's frames into arena a (the frames it shares, once). */
struct cmap {
	const struct frame *from[MAX_STACKS * 4];
	struct frame *to[MAX_STACKS * 4];
	uint32_t n;
};

static const struct frame *copy_frame(struct arena *a, struct cmap *cm, const struct frame *f)
{
	if (!f || f == ACCEPT)
		return f;
	for (uint32_t i = 0; i < cm->n; i++)
		if (cm->from[i] == f)
			return cm->to[i];
	struct frame *t = aalloc(a, sizeof *t);
	if (!t)
		return NULL;
	*t = *f;
	t->up = copy_frame(a, cm, f->up);
	if (cm->n < MAX_STACKS * 4) {
		cm->from[cm->n] = f;
		cm->to[cm->n++] = t;
	}
	return t;
}

static int commit(struct gram_match *m, const struct state *s)
{
	int nxt = !m->cur;
	struct arena *a = &m->keep[nxt];
	areset(a);
	struct cmap *cm = malloc(sizeof *cm);
	const struct frame **top = aalloc(a, MAX_STACKS * sizeof *top);
	if (!cm || !top) {
		free(cm);
		return BATON_ENOMEM;
	}
	cm->n = 0;
	for (uint32_t i = 0; i < s->n; i++)
		top[i] = copy_frame(a, cm, s->top[i]);
	free(cm);
	if (a->oom)
		return BATON_ENOMEM;
	m->st.top = top;
	m->st.n = s->n;
	m->cur = nxt;
	return 0;
}

int gram_match_new(gram_match **out, const gram *g, const gram_vocab *v)
{
	*out = NULL;
	gram_match *m = calloc(1, sizeof *m);
	if (!m)
		return BATON_ENOMEM;
	m->g = g;
	m->v = v;
	for (int c = 0; c < 256; c++)
		m->plain[c] = c >= 0x20 && c != '"' && c != '\\';
	for (uint32_t sb = 0; sb <= X4; sb++)
		for (int c = 0; c < 256; c++) {
			uint32_t x = sb, n = 0;
			if (gram_str_step(&x, &n, 1, (uint8_t)c))
				m->strset[sb][c >> 3] |= (uint8_t)(1u << (c & 7));
		}
	struct state s;
	s.n = 0;
	s.top = aalloc(&m->scratch, MAX_STACKS * sizeof *s.top);
	int rc = BATON_ENOMEM;
	if (s.top) {
		uint32_t r = g->root, a0 = g->rule_alt0[r];
		m->expands = 0;
		rc = 0;
		for (uint32_t i = 0; i < g->rule_nalt[r] && !rc; i++)
			rc = expand(m, &m->scratch, &s, g->alt[a0 + i], 0, 0, NULL) ? BATON_ENOMEM : 0;
		if (!rc)
			rc = commit(m, &s);
	}
	areset(&m->scratch);
	if (rc) {
		gram_match_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

void gram_match_free(gram_match *m)
{
	if (!m)
		return;
	afree(&m->keep[0]);
	afree(&m->keep[1]);
	afree(&m->scratch);
	free(m);
}

bool gram_match_can_end(const gram_match *m)
{
	for (uint32_t i = 0; i < m->st.n; i++)
		if (m->st.top[i] == ACCEPT)
			return true;
	return false;
}

uint64_t gram_match_last_visits(const gram_match *m)
{
	return m->visits;
}

int gram_match_accept_bytes(gram_match *m, const char *s, size_t n)
{
	struct state cur = m->st, nx;
	areset(&m->scratch);
	for (size_t i = 0; i < n; i++) {
		if (advance(m, &m->scratch, &cur, (uint8_t)s[i], &nx)) {
			areset(&m->scratch);
			return BATON_ENOMEM;
		}
		if (nx.n == 0) {
			areset(&m->scratch);
			return BATON_EINVAL;
		}
		cur = nx;
	}
	int rc = commit(m, &cur);
	areset(&m->scratch);
	return rc;
}

bool gram_match_check_bytes(gram_match *m, const char *s, size_t n, bool *whole)
{
	struct state cur = m->st, nx;
	bool ok = true;
	areset(&m->scratch);
	for (size_t i = 0; i < n && ok; i++) {
		if (advance(m, &m->scratch, &cur, (uint8_t)s[i], &nx) || nx.n == 0)
			ok = false;
		else
			cur = nx;
	}
	if (whole) {
		*whole = false;
		for (uint32_t i = 0; ok && i < cur.n; i++)
			*whole |= cur.top[i] == ACCEPT;
	}
	areset(&m->scratch);
	return ok;
}

/* The token ids ending at a node: allowed (in the quote trie, those whose
 * plain prefix fits the string: qlo <= characters <= qhi). */
static void allow_range(struct gram_match *m, uint32_t from, uint32_t to)
{
	const uint32_t *t = m->tt;
	if (!m->qf) {
		for (uint32_t i = from; i < to; i++)
			m->allow[t[i] / 64] |= 1ull << (t[i] % 64);
		return;
	}
	for (uint32_t i = from; i < to; i++) {
		uint32_t c = m->v->qtokc[i];
		if (c >= m->qlo && c <= m->qhi)
			m->allow[t[i] / 64] |= 1ull << (t[i] % 64);
	}
}

static void allow_node(struct gram_match *m, const struct tnode *d)
{
	allow_range(m, d->tok0, d->tok0 + d->ntok);
}

static const struct frame *string_state(const struct gram_match *m, const struct state *s);

/* The bytes some stack of s takes next. */
static void first_bytes(const struct gram_match *m, const struct state *s, uint64_t acc[4])
{
	const gram *g = m->g;
	acc[0] = acc[1] = acc[2] = acc[3] = 0;
	for (uint32_t i = 0; i < s->n; i++) {
		const struct frame *f = s->top[i];
		if (f == ACCEPT)
			continue;
		const struct gel *e = &g->el[f->pos];
		const uint8_t *set = NULL;
		switch (e->kind) {
		case E_BYTE:
			acc[e->byte >> 6] |= 1ull << (e->byte & 63);
			continue;
		case E_SET:
		case E_REP:
			if (e->kind == E_REP && f->cnt >= e->b)
				continue;
			set = g->sets[e->set];
			break;
		case E_STR:
			if (f->sub == S0 && f->cnt >= e->b)
				continue;
			set = m->strset[f->sub];
			break;
		default:
			continue;
		}
		uint64_t w[4];
		memcpy(w, set, 32);
		for (int k = 0; k < 4; k++)
			acc[k] |= w[k];
	}
}

/* The children of node `at` (of the trie m->tn) from state s. pruned:
 * every byte so far was plain inside a string, whose plain tokens and
 * those that close it are allowed apart: only the paths to a '\\' are
 * walked here. */
static int walk(struct gram_match *m, uint32_t at, const struct state *s, int pruned)
{
	const struct tnode *d = &m->tn[at];
	uint64_t acc[4];
	first_bytes(m, s, acc);
	uint32_t nk = pruned ? d->nspec : d->nchild;
	for (uint32_t k = 0; k < nk; k++) {
		const struct tkid *kd = &m->tk[d->first + k];
		if (!(acc[kd->byte >> 6] >> (kd->byte & 63) & 1))
			continue;
		int plain = m->plain[kd->byte];
		if (pruned && kd->byte == '"')
			continue;
		uint32_t ci = kd->node;
		__builtin_prefetch(&m->tn[ci]); /* a miss, most often: while advance runs */
		m->visits++;
		struct mark mk = amark(&m->scratch);
		struct state nx;
		if (advance(m, &m->scratch, s, kd->byte, &nx))
			return -1;
		const struct tnode *ch = &m->tn[ci];
		if (nx.n) {
			const struct frame *f;
			if (ch->nchild && ch->pureq && (f = string_state(m, &nx)) != NULL &&
			    ch->height < 255 && m->g->el[f->pos].b - f->cnt >= ch->height &&
			    (ch->pure || f->cnt >= m->g->el[f->pos].a)) {
				/* inside a string that has room, and nothing below but
				 * plain ASCII (and quotes that close it, when it is long
				 * enough already): every token below, unwalked */
				allow_range(m, ch->tok0, ch->tok_end);
			} else {
				allow_node(m, ch);
				if (ch->nchild && walk(m, ci, &nx, pruned && plain))
					return -1;
			}
		}
		arewind(&m->scratch, mk);
	}
	return 0;
}

/* The fast path's condition: the stacks are one string body at a
 * character boundary (and its way out, the closing quote); that body's
 * frame, or NULL. */
static const struct frame *string_state(const struct gram_match *m, const struct state *s)
{
	const gram *g = m->g;
	const struct frame *f = NULL;
	for (uint32_t i = 0; i < s->n; i++) {
		const struct frame *x = s->top[i];
		if (x != ACCEPT && g->el[x->pos].kind == E_STR) {
			if (f || x->sub != S0)
				return NULL;
			f = x;
		}
	}
	if (!f || g->el[f->pos + 1].kind != E_BYTE || g->el[f->pos + 1].byte != '"')
		return NULL;
	for (uint32_t i = 0; i < s->n; i++) {
		const struct frame *x = s->top[i];
		if (x != f && (x == ACCEPT || x->pos != f->pos + 1 || x->up != f->up))
			return NULL;
	}
	return f;
}

int gram_match_mask(gram_match *m, uint64_t *allow, bool *can_end)
{
	const gram_vocab *v = m->v;
	memset(allow, 0, (size_t)v->words * sizeof *allow);
	m->allow = allow;
	m->visits = 0;
	m->overflow = 0;
	m->tn = v->node;
	m->tk = v->kids;
	m->tt = v->toks;
	m->qf = 0;
	areset(&m->scratch);
	const struct frame *f = string_state(m, &m->st);
	int rc = 0;
	if (f) {
		const struct gel *e = &m->g->el[f->pos];
		uint32_t room = e->b - f->cnt;
		/* plain tokens that fit */
		uint32_t k = room < GV_CUM ? room : GV_CUM;
		memcpy(allow, v->cum + (size_t)k * v->words, (size_t)v->words * sizeof *allow);
		for (uint32_t i = 0; room > GV_CUM && i < v->n_long && v->long_cnt[i] <= room; i++)
			allow[v->long_tok[i] / 64] |= 1ull << (v->long_tok[i] % 64);
		/* those that close the string after a plain prefix: what follows
		 * the '"' does not depend on the prefix, so one walk of their
		 * suffixes from the state after the quote */
		struct state one = { (const struct frame *[]){ NULL }, 1 }, sq;
		struct frame q = { f->pos + 1, 0, 0, f->depth, f->up };
		one.top[0] = &q;
		if (advance(m, &m->scratch, &one, '"', &sq))
			rc = -1;
		else if (sq.n && v->n_qnode > 1) {
			m->tn = v->qnode;
			m->tk = v->qkids;
			m->tt = v->qtoks;
			m->qf = 1;
			m->qlo = f->cnt >= e->a ? 0 : e->a - f->cnt;
			m->qhi = room;
			uint32_t qi = v->qkids[v->qnode[0].first].node; /* the root's one child: '"' */
			const struct tnode *qd = &v->qnode[qi];
			m->visits++;
			allow_node(m, qd);
			if (qd->nchild)
				rc = walk(m, qi, &sq, 0);
			m->tn = v->node;
			m->tk = v->kids;
			m->tt = v->toks;
			m->qf = 0;
		}
		areset(&m->scratch);
		/* and the escapes: when no limit of the string's length can bind
		 * within one token (unbounded, or room for the longest such token,
		 * and minLength reached), their suffixes once too: the prefix
		 * changes nothing; else walked */
		if (!rc && (e->b == UINT32_MAX || room >= v->bmax) && f->cnt >= e->a) {
			struct state sb;
			one.top[0] = f;
			if (advance(m, &m->scratch, &one, '\\', &sb))
				rc = -1;
			else if (sb.n && v->n_bnode > 1) {
				m->tn = v->bnode;
				m->tk = v->bkids;
				m->tt = v->btoks;
				uint32_t bi = v->bkids[v->bnode[0].first].node; /* '\\' */
				const struct tnode *bd = &v->bnode[bi];
				m->visits++;
				allow_node(m, bd);
				if (bd->nchild)
					rc = walk(m, bi, &sb, 0);
				m->tn = v->node;
				m->tk = v->kids;
				m->tt = v->toks;
			}
			areset(&m->scratch);
		} else if (!rc) {
			rc = walk(m, 0, &m->st, 1);
		}
	} else {
		rc = walk(m, 0, &m->st, 0);
	}
	areset(&m->scratch);
	m->allow = NULL;
	if (rc || m->scratch.oom)
		return BATON_ENOMEM;
	*can_end = gram_match_can_end(m);
	return 0;
}

int gram_match_accept(gram_match *m, uint32_t token)
{
	const gram_vocab *v = m->v;
	if (token >= v->n || v->len[token] == 0)
		return BATON_EINVAL;
	return gram_match_accept_bytes(m, v->pool + v->off[token], v->len[token]);
}
