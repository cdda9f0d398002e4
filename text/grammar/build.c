/*
 * build.c: the grammar builder: rules, their alternatives as sequences of
 * elements, byte sets; gb_finish flattens them into a struct gram.
 */
#include <stdlib.h>
#include <string.h>

#include "text/grammar/grammar_int.h"

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : 16;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, c * elem);
	if (!q)
		return -1;
	*p = q;
	*cap = c;
	return 0;
}

void gb_init(struct gb *b)
{
	memset(b, 0, sizeof *b);
}

void gb_free(struct gb *b)
{
	for (size_t i = 0; i < b->n_rules; i++)
		free(b->rules[i].alts);
	free(b->rules);
	free(b->el);
	free(b->sets);
	memset(b, 0, sizeof *b);
}

uint32_t gb_rule(struct gb *b)
{
	if (grow((void **)&b->rules, &b->cap_rules, b->n_rules + 1, sizeof *b->rules)) {
		b->oom = 1;
		return 0;
	}
	memset(&b->rules[b->n_rules], 0, sizeof b->rules[0]);
	return (uint32_t)b->n_rules++;
}

void gb_alt(struct gb *b, uint32_t r, struct gseq *s)
{
	if (gs_oom(s) || b->oom || r >= b->n_rules || b->n_el + s->n + 1 > GB_MAX_ELEMENTS ||
	    grow((void **)&b->el, &b->cap_el, b->n_el + s->n + 1, sizeof *b->el)) {
		b->oom = 1;
		s->n = 0;
		return;
	}
	struct grule *g = &b->rules[r];
	if (grow((void **)&g->alts, &g->cap, g->n + 1, sizeof *g->alts)) {
		b->oom = 1;
		s->n = 0;
		return;
	}
	g->alts[g->n++] = (uint32_t)b->n_el;
	if (s->n)
		memcpy(b->el + b->n_el, s->e, s->n * sizeof *s->e);
	b->n_el += s->n;
	b->el[b->n_el++] = (struct gel){ .kind = E_END };
	s->n = 0;
}

uint16_t gb_set(struct gb *b, const uint8_t bits[32])
{
	for (size_t i = 0; i < b->n_sets; i++)
		if (memcmp(b->sets[i], bits, 32) == 0)
			return (uint16_t)i;
	if (b->n_sets >= 65535 || grow((void **)&b->sets, &b->cap_sets, b->n_sets + 1, 32)) {
		b->oom = 1;
		return 0;
	}
	memcpy(b->sets[b->n_sets], bits, 32);
	return (uint16_t)b->n_sets++;
}

uint16_t gb_set_range(struct gb *b, const char *r)
{
	uint8_t bits[32] = {0};
	for (; r[0] && r[1]; r += 2)
		for (unsigned c = (uint8_t)r[0]; c <= (uint8_t)r[1]; c++)
			bits[c >> 3] |= (uint8_t)(1u << (c & 7));
	return gb_set(b, bits);
}

int gb_finish(struct gb *b, uint32_t root, gram **out)
{
	*out = NULL;
	if (b->oom)
		return BATON_ENOMEM;
	gram *g = calloc(1, sizeof *g);
	size_t nalt = 0;
	for (size_t i = 0; i < b->n_rules; i++)
		nalt += b->rules[i].n;
	if (!g || !(g->alt = malloc((nalt + 1) * sizeof *g->alt)) ||
	    !(g->rule_alt0 = malloc((b->n_rules + 1) * sizeof *g->rule_alt0)) ||
	    !(g->rule_nalt = malloc((b->n_rules + 1) * sizeof *g->rule_nalt))) {
		gram_free(g);
		return BATON_ENOMEM;
	}
	size_t k = 0;
	for (size_t i = 0; i < b->n_rules; i++) {
		g->rule_alt0[i] = (uint32_t)k;
		g->rule_nalt[i] = (uint32_t)b->rules[i].n;
		for (size_t j = 0; j < b->rules[i].n; j++)
			g->alt[k++] = b->rules[i].alts[j];
		free(b->rules[i].alts);
	}
	free(b->rules);
	g->n_rules = (uint32_t)b->n_rules;
	g->el = b->el;
	g->n_el = (uint32_t)b->n_el;
	g->sets = b->sets;
	g->n_sets = (uint32_t)b->n_sets;
	g->root = root;
	memset(b, 0, sizeof *b);
	*out = g;
	return 0;
}

void gram_free(gram *g)
{
	if (!g)
		return;
	free(g->el);
	free(g->alt);
	free(g->rule_alt0);
	free(g->rule_nalt);
	free(g->sets);
	free(g);
}

/* ---- sequences ---- */
static void gs_put(struct gseq *s, struct gel e)
{
	if (s->cap == SIZE_MAX)
		return;
	if (grow((void **)&s->e, &s->cap, s->n + 1, sizeof *s->e)) {
		s->cap = SIZE_MAX; /* out of memory: remembered */
		return;
	}
	s->e[s->n++] = e;
}

int gs_oom(const struct gseq *s)
{
	return s->cap == SIZE_MAX;
}

void gs_byte(struct gseq *s, uint8_t c)
{
	gs_put(s, (struct gel){ .kind = E_BYTE, .byte = c });
}

void gs_lit(struct gseq *s, const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		gs_byte(s, (uint8_t)p[i]);
}

void gs_set(struct gseq *s, uint16_t set)
{
	gs_put(s, (struct gel){ .kind = E_SET, .set = set });
}

void gs_rep(struct gseq *s, uint16_t set, uint32_t lo, uint32_t hi)
{
	gs_put(s, (struct gel){ .kind = E_REP, .set = set, .a = lo, .b = hi });
}

void gs_str(struct gseq *s, uint32_t lo, uint32_t hi)
{
	gs_put(s, (struct gel){ .kind = E_STR, .a = lo, .b = hi });
}

void gs_ref(struct gseq *s, uint32_t rule)
{
	gs_put(s, (struct gel){ .kind = E_REF, .a = rule });
}

void gs_free(struct gseq *s)
{
	if (s->cap != SIZE_MAX)
		free(s->e);
	else
		free(s->e);
	memset(s, 0, sizeof *s);
}
