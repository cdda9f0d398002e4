/*
 * jinja_int.h: the Jinja template engine's insides, shared by its five
 * files: jinja_lex.c (source to tokens, with jinja2's whitespace rules),
 * jinja_parse.c (tokens to a tree, refusing what the engine lacks),
 * jinja_value.c (values with Python's semantics: printing, JSON,
 * comparison), jinja_eval.c (rendering the tree), jinja_builtins.c (the
 * built-ins' names and shared helpers), jinja_strings.c (Python's str
 * helpers), jinja_filters.c, jinja_tests.c, jinja_methods.c and
 * jinja_globals.c (the built-ins).
 *
 * Memory: everything a template or a render makes is carved from a jj_arena
 * and freed with it at once; values never own anything.
 */
#ifndef BATON_TEXT_JINJA_INT_H
#define BATON_TEXT_JINJA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/text_int.h"

/* ---- arena --------------------------------------------------------------- */
struct jj_chunk;
struct jj_arena {
	struct jj_chunk *head;
	size_t used, total, limit; /* limit: total bytes allowed, 0 none */
};
void *jj_alloc(struct jj_arena *a, size_t n); /* zeroed; NULL when over limit */
void jj_arena_free(struct jj_arena *a);

/* ---- values -------------------------------------------------------------- */
enum jj_type {
	JV_UNDEF, /* s: the name, for messages */
	JV_NONE,
	JV_BOOL,
	JV_INT,
	JV_FLOAT,
	JV_STR,
	JV_LIST,   /* l; kind: JK_LIST, JK_TUPLE, JK_GEN, JK_VIEW */
	JV_DICT,   /* d: keys in insertion order */
	JV_NS,     /* d: a namespace() */
	JV_MACRO,  /* mac: the macro and the scope it was defined in */
	JV_FUNC,   /* aux: a global function */
	JV_METHOD, /* self.. receiver, aux: the method */
};

/* A list's kind changes only how it prints and a few tests: a generator
 * (what map/select/... give in jinja2) is always true and has no length; a
 * view (range, dict.items()) prints as Python would, which the engine
 * refuses rather than imitate. */
enum { JK_LIST, JK_TUPLE, JK_GEN, JK_VIEW };

struct jj_list;
struct jj_dict;
struct jj_node;
struct jj_closure;

typedef struct jv {
	uint8_t t, kind;
	uint16_t aux;
	union {
		bool b;
		int64_t i;
		double f;
		struct {
			const char *p;
			size_t n;
		} s;
		struct jj_list *l;
		struct jj_dict *d;
		struct jj_closure *mac;
		struct jv *self;
	};
} jv;

struct jj_list {
	size_t n, cap;
	jv *v;
	size_t pos; /* a generator: the items before pos were consumed */
};

struct jj_dict {
	size_t n, cap;
	jv *k, *v;
};

/* Constructors and helpers (jinja_value.c). */
static inline jv jv_undef(const char *name, size_t n)
{
	jv v = {.t = JV_UNDEF};
	v.s.p = name;
	v.s.n = n;
	return v;
}
static inline jv jv_none(void) { return (jv){.t = JV_NONE}; }
static inline jv jv_bool(bool b) { return (jv){.t = JV_BOOL, .b = b}; }
static inline jv jv_int(int64_t i) { return (jv){.t = JV_INT, .i = i}; }
static inline jv jv_float(double f) { return (jv){.t = JV_FLOAT, .f = f}; }
static inline jv jv_str(const char *p, size_t n)
{
	jv v = {.t = JV_STR};
	v.s.p = p;
	v.s.n = n;
	return v;
}

jv jv_list_new(struct jj_arena *a, size_t cap, int kind); /* t JV_UNDEF on no memory */
int jv_list_push(struct jj_arena *a, jv *list, jv x);
jv jv_dict_new(struct jj_arena *a, int type);
int jv_dict_set(struct jj_arena *a, jv *dict, jv key, jv val);
/* The value of key, or NULL. */
jv *jv_dict_get(const jv *dict, jv key);
jv *jv_dict_gets(const jv *dict, const char *key, size_t n);

bool jv_truthy(jv v);
bool jv_is_num(jv v); /* bool, int, float as Python's numbers.Number */
double jv_num(jv v);
bool jv_equal(jv a, jv b);
/* <0, 0, >0; 2 when not orderable (Python's TypeError). */
int jv_cmp(jv a, jv b, int *rc);
const char *jv_type_name(jv v); /* Python's: "str", "int", "dict", ... */

/* Python's str() (what {{ }} prints) and repr() into b; BATON_EUNSUPPORTED
 * (with err) for what the engine does not print as Python would. */
int jv_str_into(struct tbuf *b, jv v, char *err, size_t errlen);
int jv_repr_into(struct tbuf *b, jv v, char *err, size_t errlen);
/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators
 * as given or Python's defaults, sort_keys=False) into b. */
int jv_json_into(struct tbuf *b, jv v, int indent, const char *item_sep, const char *key_sep,
                 int depth, char *err, size_t errlen);
/* Python's repr of a float. */
void jv_float_repr(double f, char *out, size_t cap);

/* UTF-8 code points. */
size_t jj_utf8_count(const char *s, size_t n);
size_t jj_utf8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point cp */
bool jj_is_space(uint32_t cp);                               /* Python's str.isspace */

/* ---- tokens -------------------------------------------------------------- */
enum jj_tok {
	JT_EOF,
	JT_DATA,      /* s: raw template text, already whitespace-trimmed */
	JT_VAR_BEGIN, /* {{ */
	JT_VAR_END,
	JT_BLOCK_BEGIN, /* {% */
	JT_BLOCK_END,
	JT_NAME,
	JT_STRING, /* s: unescaped */
	JT_INT,
	JT_FLOAT,
	JT_OP, /* op: one of JO_* */
};

enum jj_op {
	JO_ADD = 1, JO_SUB, JO_MUL, JO_DIV, JO_FLOORDIV, JO_MOD, JO_POW, JO_TILDE,
	JO_EQ, JO_NE, JO_LT, JO_LE, JO_GT, JO_GE, JO_ASSIGN,
	JO_LPAREN, JO_RPAREN, JO_LBRACKET, JO_RBRACKET, JO_LBRACE, JO_RBRACE,
	JO_COMMA, JO_DOT, JO_COLON, JO_PIPE, JO_SEMI,
	/* comparison kinds beyond the token ops */
	JO_IN, JO_NOTIN,
};

struct jj_token {
	int type, op, line;
	const char *s;
	size_t n;
	int64_t i;
	double f;
};

struct jj_tokens {
	struct jj_token *t;
	size_t n, cap;
};

int jj_lex(struct jj_arena *a, const char *src, size_t len, struct jj_tokens *out, char *err,
           size_t errlen);

/* ---- tree ---------------------------------------------------------------- */
enum jj_kind {
	/* statements */
	N_DATA, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE,
	N_FILTERBLOCK, N_WITH, N_BODY, N_CALLBLOCK,
	/* expressions */
	E_CONST, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_BIN, E_NEG, E_POS,
	E_NOT, E_AND, E_OR, E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT, E_KW,
};

/* Nodes, by kind (v/w are lists of nv/nw nodes):
 *   N_DATA c (string)             N_OUT a
 *   N_IF a cond, v then, w else   N_FOR a target, b iter, x filter, v body, w else
 *   N_SET a target, b value       N_SETBLOCK a target, v body
 *   N_MACRO c name, v params (E_NAME, b default), w body
 *   N_FILTERBLOCK a filters (innermost a NULL), v body
 *   N_WITH v assignments (N_SET), w body        N_BODY v
 *   N_CALLBLOCK a call (E_CALL), b the caller (an N_MACRO named caller)
 *   E_CONST c   E_NAME c   E_ATTR a, c name   E_ITEM a, b   E_SLICE a, v[3] (NULL: omitted)
 *   E_CALL a, v args, w kwargs (E_KW c name, a value)
 *   E_FILTER a, op filter, v args, w kwargs     E_TEST a, op test, neg, v args
 *   E_BIN op, a, b   E_NEG/E_POS/E_NOT a   E_AND/E_OR a, b
 *   E_CMP a, v operands, ops[] (JO_EQ..JO_GE, JO_IN, JO_NOTIN)
 *   E_COND a then, b cond, x else (NULL: undefined)
 *   E_LIST/E_TUPLE v   E_DICT v keys, w values */
struct jj_node {
	int kind, line, op;
	bool neg;
	jv c;
	struct jj_node *a, *b, *x;
	struct jj_node **v, **w;
	size_t nv, nw;
	int *ops;
};

/* Filters, tests, methods and globals the engine knows: their ids. */
int jj_filter_id(const char *s, size_t n); /* -1 when unknown */
int jj_test_id(const char *s, size_t n);
int jj_method_id(const char *s, size_t n);
int jj_global_id(const char *s, size_t n); /* -2: jinja2's, not implemented */

/* Parses tokens into a body (N_BODY). */
int jj_parse(struct jj_arena *a, const struct jj_tokens *toks, struct jj_node **out, char *err,
             size_t errlen);

/* ---- the renderer's state, shared by jinja_eval.c and the built-ins ---- */

#define MAX_OUT    (16u << 20) /* bytes of output, and of any one string */
#define MAX_MEM    (512u << 20)
#define MAX_STEPS  20000000ull
#define MAX_DEPTH  64
#define MAX_RANGE  1000000

struct frame {
	struct frame *up;
	size_t n, cap;
	jv *k, *v;
};

struct jj_closure {
	const struct jj_node *n;
	struct frame *f;
};

struct rs {
	struct jj_arena *a;
	struct tbuf *out;
	size_t produced;
	uint64_t steps;
	int depth;
	struct frame *root;
	jv caller; /* a call block's body, for the next macro call; JV_UNDEF none */
	char *err;
	size_t errlen;
	int rc;
};

/* Arguments by position or name (Python's binding for filters and methods). */
struct argv_ {
	jv *args, *kwn, *kwv;
	size_t nargs, nkw;
};

/* Methods of str, list and dict: ids from jj_method_id. */
enum {
	M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_LOWER, M_UPPER,
	M_REPLACE, M_TITLE, M_CAPITALIZE, M_FIND, M_RFIND, M_COUNT, M_JOIN, M_SPLITLINES,
	M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISUPPER, M_ISLOWER, M_REMOVEPREFIX,
	M_REMOVESUFFIX, M_INDEX, M_ITEMS, M_KEYS, M_VALUES, M_GET, M_CYCLE,
	M_APPEND, M_POP, M_INSERT, M_EXTEND, M_REMOVE, M_CLEAR, M_SORT, M_REVERSE, M_UPDATE,
	M_SETDEFAULT,
};

/* jinja_eval.c: failing a render, strings within the bounds, values
 * (item access, iteration, length, membership, operators). */
int jj_rfail(struct rs *r, int line, int code, const char *fmt, ...);
int jj_oom(struct rs *r, int line);
int jj_undef_fail(struct rs *r, int line, jv u);
jv jj_mkstr(struct rs *r, int line, const char *p, size_t n);
jv jj_tbuf_str(struct rs *r, int line, struct tbuf *b);
int jj_to_str(struct rs *r, int line, jv v, jv *out);
bool jj_as_index(jv k, int64_t *i);
int jj_getitem(struct rs *r, int line, jv obj, jv key, jv *out);
int jj_items_of(struct rs *r, int line, jv v, jv *out);
int jj_len_of(struct rs *r, int line, jv v, int64_t *n);
int jj_contains(struct rs *r, int line, jv needle, jv hay, bool *out);
int jj_arith(struct rs *r, int line, int op, jv a, jv b, jv *out);
int jj_compare(struct rs *r, int line, int op, jv a, jv b, bool *res);

/* Ids of filters, tests and globals (names in jinja_builtins.c, same order). */
enum {
	F_ABS, F_CAPITALIZE, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE, F_FIRST, F_FLOAT,
	F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN,
	F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR,
	F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT,
};
enum {
	T_DEFINED, T_UNDEFINED, T_NONE, T_STRING, T_MAPPING, T_ITERABLE, T_SEQUENCE, T_NUMBER,
	T_INTEGER, T_FLOAT, T_BOOLEAN, T_TRUE, T_FALSE, T_EVEN, T_ODD, T_DIVISIBLEBY, T_EQ,
	T_EQUALTO, T_NE, T_LT, T_LE, T_GT, T_GE, T_GREATERTHAN, T_LESSTHAN, T_IN, T_LOWER, T_UPPER,
	T_CALLABLE, T_SAMEAS,
};
enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME };

/* jinja_strings.c: string helpers (Python's str). */
uint32_t jj_cp_at(const char *s, size_t n, size_t *adv);
const char *jj_find(const char *h, size_t hn, const char *nd, size_t nn);
const char *jj_rfind(const char *h, size_t hn, const char *nd, size_t nn);
jv jj_case_map(struct rs *r, int line, jv s, int mode /* 0 lower 1 upper 2 capitalize 3 title */);
jv jj_strip(jv s, const jv *chars, bool left, bool right);
jv jj_replace(struct rs *r, int line, jv s, jv old, jv new, int64_t count);
int jj_split(struct rs *r, int line, jv s, const jv *sep, int64_t maxsplit, bool from_right,
             jv *out);

/* jinja_builtins.c: names and ids, method binding, shared argument helpers. */
extern const char *const jj_filter_names[]; /* by id, NULL-terminated */
extern const char *const jj_test_names[];
extern const char *const jj_method_names[];
extern const char *const jj_global_names[];
bool jj_is_str_method(int m);
bool jj_is_list_method(int m);
bool jj_is_dict_method(int m);
jv jj_method(struct rs *r, jv self, int m);
jv jj_pair(struct rs *r, jv a, jv b);
bool jj_arg(const struct argv_ *a, size_t pos, const char *name, jv *out);
int jj_need_str(struct rs *r, int line, jv v, const char *what);

/* jinja_globals.c, jinja_methods.c, jinja_filters.c, jinja_tests.c. */
int jj_call_global(struct rs *r, int line, int g, const struct argv_ *a, jv *out);
int jj_call_method(struct rs *r, int line, jv self, int m, const struct argv_ *a, jv *out);
int jj_run_filter(struct rs *r, int line, int id, jv v, const struct argv_ *a, jv *out);
int jj_run_test(struct rs *r, int line, int id, jv v, const struct argv_ *a, bool *res);

#endif
