/* name_test.c: the one rule for engine names (proto_name_valid). */
#include <string.h>

#include "proto/proto.h"
#include "tests/t.h"

static void t_names(void)
{
	static const struct {
		const char *s;
		int ok;
	} cases[] = {
		{ "qwen", 1 }, { "a", 1 }, { "Qwen3-30B_a3b.q4", 1 }, { "0", 1 }, { "-._", 1 },
		{ "", 0 }, { "a b", 0 }, { "a/b", 0 }, { "a:b", 0 }, { "*", 0 }, { "é", 0 },
		{ "a\nb", 0 }, { "name\"", 0 },
		/* 64 bytes: the longest */
		{ "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 1 },
		{ "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 0 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		T_ASSERT_MSG(proto_name_valid(cases[i].s, strlen(cases[i].s)) == cases[i].ok, "'%s': want %d",
		    cases[i].s, cases[i].ok);
	/* only len bytes count: a NUL inside, or a longer buffer */
	T_EQ_INT(proto_name_valid("ab\0c", 4), 0);
	T_EQ_INT(proto_name_valid("ab cd", 2), 1);
	T_EQ_INT(proto_name_valid(NULL, 0), 0);
}

T_MAIN(T_CASE(t_names))
