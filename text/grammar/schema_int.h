/*
 * schema_int.h: the schema compiler's state (schema.c), shared with
 * xml_calls.c; internal to text/grammar.
 */
#ifndef BATON_TEXT_GRAMMAR_SCHEMA_INT_H
#define BATON_TEXT_GRAMMAR_SCHEMA_INT_H

#include "text/grammar/grammar_int.h"

#define ANY_DEPTH 12u
#define MAX_UNROLL 4096u
#define MAX_REF_DEPTH 64

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_FRAC = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64,
	T_ALL = 127 };

struct memo {
	char *ref;
	uint32_t rule;
	int open;          /* being compiled */
	unsigned nest;     /* the object and array nesting when it was opened */
};

struct sc {
	struct gb b;
	json_t *root;
	struct memo *memo;
	size_t n_memo, cap_memo;
	uint32_t any[ANY_DEPTH + 1];
	uint32_t r_num, r_int, r_str, r_ws_dummy;
	uint16_t ws, d09, d19, ee, hex;
	int ref_depth;
	unsigned nest;     /* objects and arrays being compiled */
	char *err;
	size_t errlen;
};

/* schema.c's pieces that xml_calls.c builds on */
int sc_fail(struct sc *c, int rc, const char *path, const char *fmt, const char *a);
void sc_sub_path(char *out, size_t cap, const char *path, const char *key);
uint32_t sc_rule1(struct sc *c, struct gseq *s);
void sc_ws(struct sc *c, struct gseq *s);
int sc_compile(struct sc *c, json_t *s, const char *path, uint32_t *out);
int sc_count_kw(struct sc *c, json_t *s, const char *key, const char *path, uint32_t *v);
int sc_is_annotation(const char *k);
void sc_init(struct sc *c, char *err, size_t errlen);
int sc_finish(struct sc *c, int rc, uint32_t value, gram **out);

#endif
