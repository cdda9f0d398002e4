/*
 * grammar_int.h: text/grammar/'s insides, shared by its files only.
 *
 * Files, bottom to top: build.c (the grammar and its builder), schema.c
 * (JSON schema to grammar), vocab.c (the token trie and the tables of the
 * string fast path), match.c (the pushdown matcher and the token masks).
 *
 * A grammar is rules; a rule is alternatives; an alternative is a
 * sequence of elements ending in E_END, all in one flat array. Terminals
 * (E_BYTE, E_SET, E_REP, E_STR) consume bytes; E_REF descends into a rule.
 */
#ifndef BATON_TEXT_GRAMMAR_INT_H
#define BATON_TEXT_GRAMMAR_INT_H

#include <stdint.h>

#include "proto/base/base.h"
#include "text/grammar/grammar.h"

enum gel_kind {
	E_END = 0,  /* end of an alternative: return to the caller */
	E_BYTE = 1, /* one byte: byte */
	E_SET = 2,  /* one byte of sets[set] */
	E_REP = 3,  /* a..b bytes of sets[set] (b: UINT32_MAX unbounded) */
	E_STR = 4,  /* a JSON string's body of a..b characters (UTF-8 checked,
	             * escapes, no surrogate \u), up to the closing quote */
	E_REF = 5,  /* rule a */
};

struct gel {
	uint8_t kind;
	uint8_t byte;
	uint16_t set;
	uint32_t a, b;
};

struct gram {
	struct gel *el;
	uint32_t n_el;
	uint32_t *alt;        /* alternatives' first elements, rule by rule */
	uint32_t *rule_alt0;  /* rule r's alternatives: alt[rule_alt0[r] ..] */
	uint32_t *rule_nalt;
	uint32_t n_rules;
	uint8_t (*sets)[32];
	uint32_t n_sets;
	uint32_t root;
};

/* ---- the builder (build.c) ---- */
struct gseq {
	struct gel *e;
	size_t n, cap;
};

struct gb {
	struct gel *el;
	size_t n_el, cap_el;
	struct grule {
		uint32_t *alts;
		size_t n, cap;
	} *rules;
	size_t n_rules, cap_rules;
	uint8_t (*sets)[32];
	size_t n_sets, cap_sets;
	int oom;
};

#define GB_MAX_ELEMENTS 2000000u
#define GB_WS_MAX 20u

void gb_init(struct gb *b);
void gb_free(struct gb *b);
uint32_t gb_rule(struct gb *b);
/* Appends s (then E_END) as an alternative of rule r; s is emptied. */
void gb_alt(struct gb *b, uint32_t r, struct gseq *s);
uint16_t gb_set(struct gb *b, const uint8_t bits[32]);
uint16_t gb_set_range(struct gb *b, const char *ranges); /* "azAZ09": pairs */
/* Moves the builder's content into a gram with root rule `root`. */
int gb_finish(struct gb *b, uint32_t root, gram **out);

void gs_byte(struct gseq *s, uint8_t c);
void gs_lit(struct gseq *s, const char *p, size_t n);
void gs_set(struct gseq *s, uint16_t set);
void gs_rep(struct gseq *s, uint16_t set, uint32_t lo, uint32_t hi);
void gs_str(struct gseq *s, uint32_t lo, uint32_t hi);
void gs_ref(struct gseq *s, uint32_t rule);
void gs_free(struct gseq *s);
int gs_oom(const struct gseq *s);

/* ---- the string body's byte automaton (match.c) ---- */
/* One byte of a JSON string body from substate *sub with *cnt characters
 * so far (at most max); 0 when it does not fit (sub, cnt unchanged). */
int gram_str_step(uint32_t *sub, uint32_t *cnt, uint32_t max, uint8_t c);

/* ---- the vocabulary (vocab.c) ---- */
struct tnode {
	uint32_t first;   /* its children: kids[first .. first + nchild), those with
	                   * spec first (nspec of them), then by byte */
	uint32_t tok0;    /* tokens ending here: toks[tok0 .. tok0 + ntok); */
	uint32_t tok_end; /* and below it too: toks[tok0 .. tok_end) (depth first) */
	uint16_t nchild, nspec;
	uint16_t ntok;
	uint8_t byte;     /* the edge into this node */
	uint8_t spec;     /* a '\\' edge at or below this node */
	uint8_t pure;     /* every edge below is printable ASCII but '"' and '\\' */
	uint8_t pureq;    /* the same, or a '"' that ends the path */
	uint8_t height;   /* the longest path below, bytes (255: 255 or more) */
};

/* A child, with what the walk reads before it goes down (one cache line
 * holds eight). */
struct tkid {
	uint32_t node;
	uint8_t byte, spec, pad[2];
};

#define GV_CUM 32u

struct gram_vocab {
	uint32_t n, words;        /* tokens; words of a mask */
	struct tnode *node;       /* node 0: the root; depth-first order */
	struct tkid *kids;
	uint32_t n_node;
	uint32_t *toks;
	/* the tokens that are a plain prefix and a '"' (closing a string),
	 * by what follows the prefix: a trie of those suffixes (each starts
	 * with the '"'), and the prefix's characters, qcnt[token] */
	struct tnode *qnode;
	struct tkid *qkids;
	uint32_t n_qnode;
	uint32_t *qtoks;
	uint32_t *qcnt;
	uint32_t *qtokc;          /* qcnt of qtoks[i], in its order */
	/* the same for a plain prefix and a '\\' (an escape), for strings
	 * whose length does not matter */
	struct tnode *bnode;
	struct tkid *bkids;
	uint32_t n_bnode;
	uint32_t *btoks;
	uint32_t bmax;            /* the longest of those tokens, bytes */
	/* string fast path: plain tokens (every byte a string body's, no
	 * escape, from a character boundary), by character count */
	uint64_t *cum;            /* [GV_CUM + 1][words]: plain, <= k characters */
	uint32_t *long_tok;       /* plain with more than GV_CUM characters, by count */
	uint32_t *long_cnt;
	uint32_t n_long;
	uint32_t max_len;         /* longest token, bytes */
	char *pool;               /* token t: pool[off[t] .. + len[t]) (0: unusable) */
	size_t *off;
	uint32_t *len;
};

#endif
