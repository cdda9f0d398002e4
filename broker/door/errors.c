/*
 * errors.c: the front door's answers in OpenAI's error shape
 * ({"error": {"message", "type", "param", "code"}}), as OpenAI's clients
 * read them (door_int.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "broker/door/door_int.h"
#include "http/http.h"

void door_reply_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	json_t *e = json_pack("{s:s, s:s, s:o, s:o}", "message", msg, "type", type, "param",
	    param ? json_string(param) : json_null(), "code", code ? json_string(code) : json_null());
	json_t *j = json_pack("{s:o}", "error", e);
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	char ra[64];
	const char *hdr[2] = { NULL, NULL };
	if (retry_after) {
		snprintf(ra, sizeof ra, "Retry-After: %s", retry_after);
		hdr[0] = ra;
	}
	const char *fallback = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
	http_reply(r, status, "application/json", body ? body : fallback, strlen(body ? body : fallback), hdr);
	free(body);
}
