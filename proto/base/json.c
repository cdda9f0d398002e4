/* json.c: the reader policy of the JSON files models ship (base.h). */
#include <jansson.h>
#include <math.h>

#include "proto/base/base.h"

json_t *baton_json_load(const char *data, size_t len, size_t flags, json_error_t *err)
{
	return json_loadb(data, len, flags | JSON_DECODE_INT_AS_REAL, err);
}

int baton_json_whole(const json_t *v, int64_t min, int64_t max, int64_t *out)
{
	if (json_is_integer(v)) {
		json_int_t x = json_integer_value(v);
		if (x < min || x > max)
			return BATON_ERANGE;
		*out = (int64_t)x;
		return 0;
	}
	if (!json_is_real(v))
		return BATON_EINVAL;
	double d = json_real_value(v);
	if (!isfinite(d) || d != floor(d))
		return BATON_EINVAL;
	/* [min, max] as doubles: the ends of int64 are not exact in a double,
	 * so compare with a margin that keeps the cast defined. */
	if (d < (double)min || d > (double)max || d >= 9223372036854775808.0 ||
	    d < -9223372036854775808.0)
		return BATON_ERANGE;
	int64_t x = (int64_t)d;
	if (x < min || x > max)
		return BATON_ERANGE;
	*out = x;
	return 0;
}
