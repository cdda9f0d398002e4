/* name.c: the one validator of engine names (proto.h). */
#include "proto/proto.h"

int proto_name_valid(const char *s, size_t len)
{
	if (!s || len == 0 || len > PROTO_NAME_LEN_MAX)
		return 0;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
		    c == '_' || c == '.'))
			return 0;
	}
	return 1;
}
