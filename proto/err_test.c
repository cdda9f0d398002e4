#include <string.h>

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

/* The one error-text helper: formats, truncates with a terminator, and
 * writes nothing where the caller gave no room. */
static void t_errf(void)
{
	char buf[16];
	baton_errf(buf, sizeof buf, "slot %d of %s", 7, "gpu");
	T_EQ_STR(buf, "slot 7 of gpu");
	baton_errf(buf, 6, "%s", "truncated text");
	T_EQ_STR(buf, "trunc");
	memcpy(buf, "unchanged", 10);
	baton_errf(buf, 0, "%s", "x");
	T_EQ_STR(buf, "unchanged");
	baton_errf(NULL, 16, "%s", "x"); /* no crash */
}

T_MAIN(T_CASE(t_err_names_unique), T_CASE(t_errf))
