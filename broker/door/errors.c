/*
 * errors.c: the front door's answers in OpenAI's error shape
 * ({"error": {"message", "type", "param", "code"}}), as OpenAI's clients
 * read them (door_int.h); the body is http/'s one writer.
 */
#include <stdarg.h>
#include "broker/door/door_int.h"
#include "http/http.h"

void door_reply_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	http_vreply_openai_error(r, status, type, param, code, retry_after, fmt, ap);
	va_end(ap);
}
