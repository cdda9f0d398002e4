/* reply.c: whole answers (http_reply*, error bodies, CORS headers) parked for
   libmicrohttpd's thread. */

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "http/http_int.h"

/* ---- responses ------------------------------------------------------------------- */

int hs_add_headers(struct MHD_Response *resp, const char *ctype, const char *const *headers)
{
	if (ctype && MHD_add_response_header(resp, "Content-Type", ctype) != MHD_YES)
		return -1;
	if (MHD_add_response_header(resp, "Cache-Control", "no-store") != MHD_YES ||
	    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff") != MHD_YES)
		return -1;
	for (size_t i = 0; headers && headers[i]; i++) {
		const char *colon = strchr(headers[i], ':');
		char name[128];
		if (!colon || colon == headers[i] || (size_t)(colon - headers[i]) >= sizeof name)
			return -1;
		memcpy(name, headers[i], (size_t)(colon - headers[i]));
		name[colon - headers[i]] = 0;
		const char *v = colon + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		if (MHD_add_response_header(resp, name, v) != MHD_YES)
			return -1;
	}
	return 0;
}

static struct MHD_Response *make_resp(const char *ctype, const void *body, size_t len, const char *const *headers)
{
	struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)(len ? body : ""),
	    MHD_RESPMEM_MUST_COPY);
	if (resp && hs_add_headers(resp, ctype, headers) != 0) {
		MHD_destroy_response(resp);
		resp = NULL;
	}
	return resp;
}

json_t *http_error_json(int status, int err, const char *msg)
{
	char clean[1024];
	snprintf(clean, sizeof clean, "%s", msg ? msg : "");
	for (char *q = clean; *q; q++) /* a path echoed back may be any bytes: ASCII only */
		if ((unsigned char)*q >= 0x80 || (unsigned char)*q < 0x20)
			*q = '?';
	json_t *oe = http_openai_error(status, clean, NULL, NULL, baton_errname(err));
	json_t *j = oe ? json_pack("{s:b, s:s, s:i, s:s, s:O}", "ok", 0, "code", baton_errname(err), "err", err,
	    "message", clean, "error", json_object_get(oe, "error")) : NULL;
	json_decref(oe);
	return j;
}

struct MHD_Response *hs_error_resp(int status, int err, const char *msg)
{
	return hs_error_resp_for(NULL, status, err, msg);
}

struct MHD_Response *hs_error_resp_for(const char *path, int status, int err, const char *msg)
{
	json_t *j = http_face_error(path, status, msg);
	if (!j)
		j = http_error_json(status, err, msg);
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	const char *const auth[] = { "WWW-Authenticate: Bearer realm=\"baton\"", NULL };
	const char *const retry[] = { "Retry-After: 1", NULL };
	struct MHD_Response *resp = make_resp("application/json", s ? s : "{}", s ? strlen(s) : 2,
	    status == 401 ? auth : http_retry_after(status) ? retry : NULL);
	free(s);
	return resp;
}

/* An answer to a page of a CORS origin says it may read it. */
void hs_cors_headers(const struct baton_http_req *r, struct MHD_Response *resp)
{
	if (!r->cors[0])
		return;
	MHD_add_response_header(resp, "Access-Control-Allow-Origin", r->cors);
	MHD_add_response_header(resp, "Vary", "Origin");
	MHD_add_response_header(resp, "Access-Control-Expose-Headers", "Retry-After");
}

/* Parks resp as r's answer and wakes its connection (under h->mu). */
void hs_park(struct baton_http_req *r, struct MHD_Response *resp, int status)
{
	hs_cors_headers(r, resp);
	r->resp = resp;
	r->status = (unsigned)status;
	r->st = RQ_ANSWER;
	MHD_resume_connection(r->conn);
}

int http_reply(struct baton_http_req *r, int status, const char *ctype, const void *body, size_t len,
    const char *const *headers)
{
	struct baton_http *h = r->h;
	struct MHD_Response *resp = make_resp(ctype, body, len, headers);
	pthread_mutex_lock(&h->mu);
	int rc = 0;
	if (r->answered) {
		/* http_close answered it already (or a caller's bug): drop */
		rc = BATON_ECLOSED;
	} else {
		r->answered = true;
		if (r->mhd_done || r->st != RQ_HANDLING) {
			rc = BATON_ECLOSED;
		} else if (!resp) {
			resp = hs_error_resp(500, BATON_ENOMEM, "out of memory");
			rc = BATON_ENOMEM;
			if (resp) {
				hs_park(r, resp, 500);
				resp = NULL;
			}
		} else {
			hs_park(r, resp, status);
			resp = NULL;
		}
	}
	if (resp)
		MHD_destroy_response(resp);
	hs_unref_unlock(r);
	return rc;
}

int http_reply_json(struct baton_http_req *r, int status, json_t *j)
{
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	if (!s) {
		json_t *e = http_error_json(500, BATON_ENOMEM, "out of memory");
		s = e ? json_dumps(e, JSON_COMPACT) : NULL;
		json_decref(e);
		status = 500;
	}
	int rc = http_reply(r, status, "application/json", s ? s : "{}", s ? strlen(s) : 2, NULL);
	free(s);
	return rc;
}

int http_reply_error(struct baton_http_req *r, int status, int err, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	const char *const auth[] = { "WWW-Authenticate: Bearer realm=\"baton\"", NULL };
	const char *const retry[] = { "Retry-After: 1", NULL };
	json_t *j = http_face_error(http_req_path(r), status, msg);
	if (!j)
		j = http_error_json(status, err, msg);
	char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	int rc = http_reply(r, status, "application/json", s ? s : "{}", s ? strlen(s) : 2,
	    status == 401 ? auth : http_retry_after(status) ? retry : NULL);
	free(s);
	return rc;
}
