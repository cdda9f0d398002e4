/* error.c: Baton's errors as HTTP answers: the one status table and
 * OpenAI's error object (http.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

int http_status_of(int err)
{
	switch (err) {
	case BATON_OK:
		return 200;
	case BATON_EINVAL:
	case BATON_EUNSUPPORTED:
	case BATON_EMSG:
	case BATON_ETYPE:
	case BATON_ERANGE:
	case BATON_EMISSING:
	case BATON_EEXTRA:
	case BATON_EDUP:
	case BATON_EUNKNOWNOP:
		return 400;
	case BATON_EPERM:
		return 403;
	case BATON_ENOTFOUND:
		return 404;
	case BATON_ESTATE:
	case BATON_EEXIST:
		return 409;
	case BATON_ETOOBIG:
		return 413;
	/* Busy is 503, not 409: it passes (the engine finishes its requests,
	 * a queue drains) and the same call then succeeds, which is what 503
	 * with Retry-After says; OpenAI's clients retry it, and so do
	 * proxies and load balancers, which leave a 409 to the caller. */
	case BATON_EBUSY:
	case BATON_ECLOSED:
	case BATON_ECONN:
	case BATON_EDEVMEM:
		return 503;
	case BATON_ETIMEDOUT:
		return 504;
	default:
		return 500;
	}
}

const char *http_error_type(int status)
{
	switch (status) {
	case 401:
		return "authentication_error";
	case 403:
		return "permission_error";
	case 404:
		return "not_found_error";
	case 409:
		return "conflict_error";
	case 429:
		return "rate_limit_error";
	default:
		return status >= 500 ? "server_error" : "invalid_request_error";
	}
}

const char *http_retry_after(int status)
{
	return status == 503 ? "1" : NULL;
}

json_t *http_face_error(const char *path, int status, const char *msg)
{
	if (!path)
		return NULL;
	if (strncmp(path, "/api/", 5) == 0)
		return json_pack("{s:s}", "error", msg ? msg : "");
	if (strcmp(path, "/v1/messages") == 0 || strncmp(path, "/v1/messages/", 13) == 0) {
		const char *t = status == 400 || status == 405 || status == 415 ? "invalid_request_error" :
		    status == 401 ? "authentication_error" : status == 403 ? "permission_error" :
		    status == 404 ? "not_found_error" : status == 413 ? "request_too_large" :
		    status == 429 ? "rate_limit_error" : status == 503 ? "overloaded_error" :
		    status < 500 ? "invalid_request_error" : "api_error";
		return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", t, "message", msg ? msg : "");
	}
	return NULL;
}

void http_name_digest(const char *name, char out[65])
{
	uint64_t h[4] = { 0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x9e3779b97f4a7c15ull, 0x0123456789abcdefull };
	for (int k = 0; k < 4; k++)
		for (const char *p = name; *p; p++)
			h[k] = (h[k] ^ (unsigned char)*p) * 0x100000001b3ull;
	snprintf(out, 65, "%016llx%016llx%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1],
	    (unsigned long long)h[2], (unsigned long long)h[3]);
}

json_t *http_openai_error(int status, const char *message, const char *type, const char *param,
    const char *code)
{
	return json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message ? message : "", "type",
	    type ? type : http_error_type(status), "param", param ? json_string(param) : json_null(), "code",
	    code ? json_string(code) : json_null());
}

int http_vreply_openai_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	json_t *j = http_face_error(http_req_path(r), status, msg);
	if (!j)
		j = http_openai_error(status, msg, type, param, code);
	char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	char ra[64];
	const char *hdr[2] = { NULL, NULL };
	if (retry_after) {
		snprintf(ra, sizeof ra, "Retry-After: %s", retry_after);
		hdr[0] = ra;
	}
	static const char fallback[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
	    "\"param\":null,\"code\":null}}";
	int rc = http_reply(r, status, "application/json", body ? body : fallback,
	    body ? strlen(body) : strlen(fallback), hdr);
	free(body);
	return rc;
}

int http_reply_openai_error(struct baton_http_req *r, int status, const char *type, const char *param,
    const char *code, const char *retry_after, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = http_vreply_openai_error(r, status, type, param, code, retry_after, fmt, ap);
	va_end(ap);
	return rc;
}
