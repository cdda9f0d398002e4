#include "proto/proto.h"
#include "tests/t.h"

static void t_err_names_unique(void)
{
	T_EQ_STR(baton_strerror(BATON_OK), "success");
	T_EQ_STR(baton_errname(BATON_EBUSY), "busy");
	T_EQ_STR(baton_strerror(9999), "unknown error code");
	T_ASSERT(!baton_err_valid(-1));
#define CHECK_UNIQUE(e, n, name, msg) T_EQ_INT(e, n); T_ASSERT(baton_err_valid(n));
	BATON_ERRORS(CHECK_UNIQUE)
#undef CHECK_UNIQUE
}

T_MAIN(T_CASE(t_err_names_unique))
