/* num.c: the one parser of whole numbers (the rule is in base.h). */
#include "proto/base/base.h"

/* The digits of s as a number; BATON_ERANGE past UINT64_MAX. */
static int digits(const char *s, uint64_t *out)
{
	if (!s || *s < '0' || *s > '9')
		return BATON_EINVAL;
	uint64_t v = 0;
	bool over = false;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return BATON_EINVAL;
		unsigned d = (unsigned)(*s - '0');
		if (v > (UINT64_MAX - d) / 10)
			over = true;
		else
			v = v * 10 + d;
	}
	if (over)
		return BATON_ERANGE;
	*out = v;
	return 0;
}

int baton_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t v;
	int rc = digits(s, &v);
	if (rc)
		return rc;
	if (v < min || v > max)
		return BATON_ERANGE;
	*out = v;
	return 0;
}

int baton_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
	bool neg = s && *s == '-';
	uint64_t m;
	int rc = digits(neg ? s + 1 : s, &m);
	if (rc)
		return rc;
	int64_t v;
	if (neg) {
		if (m > (uint64_t)INT64_MAX + 1)
			return BATON_ERANGE;
		v = m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m;
	} else {
		if (m > (uint64_t)INT64_MAX)
			return BATON_ERANGE;
		v = (int64_t)m;
	}
	if (v < min || v > max)
		return BATON_ERANGE;
	*out = v;
	return 0;
}
