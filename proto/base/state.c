/* state.c: the engine states' name table and the rules read from them. */
#include <string.h>

#include "proto/base/base.h"

static const char *const state_names[BATON_STATE_N] = {
	[BATON_STATE_UNKNOWN] = "unknown",
#define BATON_STATE_ROW(e, name) [e] = name,
	BATON_STATES(BATON_STATE_ROW)
#undef BATON_STATE_ROW
};

const char *baton_state_name(int st)
{
	return st > 0 && st < BATON_STATE_N ? state_names[st] : "unknown";
}

int baton_state_parse(const char *name)
{
	if (!name)
		return BATON_STATE_UNKNOWN;
	for (int st = 1; st < BATON_STATE_N; st++)
		if (strcmp(state_names[st], name) == 0)
			return st;
	return BATON_STATE_UNKNOWN;
}

bool baton_state_moving(int st)
{
	return st == BATON_STATE_LOADING || st == BATON_STATE_RELEASING || st == BATON_STATE_REFILLING ||
	    st == BATON_STATE_RESIZING;
}

bool baton_state_present(int st)
{
	return st != BATON_STATE_DEAD && st != BATON_STATE_STOPPED;
}

bool baton_state_may_hold(int st)
{
	return st != BATON_STATE_RELEASED && st != BATON_STATE_LOST && st != BATON_STATE_DEAD &&
	    st != BATON_STATE_STOPPED;
}

int baton_state_holds(int st, uint64_t resident, uint64_t ceiling)
{
	if (st == BATON_STATE_READY && resident >= ceiling)
		return BATON_HOLDS_WHOLE;
	if (st == BATON_STATE_PARTIAL || st == BATON_STATE_REFILLING || (st == BATON_STATE_READY && resident > 0))
		return BATON_HOLDS_PART;
	return BATON_HOLDS_NONE;
}
