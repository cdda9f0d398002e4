/* stream.c: streaming answers (http_stream_*): the bounded buffer, its
   reader on libmicrohttpd's thread, and the on-gone callback. */

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

#define STREAM_MAX (64u * 1024u * 1024u) /* unsent bytes a stream may hold */

/* ---- streams --------------------------------------------------------------------- */

/* On libmicrohttpd's thread: the next bytes of a stream. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct baton_http_stream *s = cls;
	struct baton_http *h = s->r->h;
	ssize_t n;
	pthread_mutex_lock(&h->mu);
	if (s->gone || h->stopping) {
		n = MHD_CONTENT_READER_END_WITH_ERROR;
	} else if (s->len > s->off) {
		size_t k = s->len - s->off < max ? s->len - s->off : max;
		memcpy(buf, s->buf + s->off, k);
		s->off += k;
		if (s->off == s->len)
			s->off = s->len = 0;
		n = (ssize_t)k;
	} else if (s->closed) {
		n = s->aborted ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
	} else {
		/* nothing yet: sleep until a write (0 with a suspend is no busy loop) */
		s->waiting = true;
		MHD_suspend_connection(s->r->conn);
		n = 0;
	}
	pthread_mutex_unlock(&h->mu);
	return n;
}

static void stream_free(void *cls)
{
	struct baton_http_stream *s = cls;
	if (!s->r)
		return; /* http_stream_open failed before s was the request's */
	pthread_mutex_lock(&s->r->h->mu);
	hs_unref_unlock(s->r);
}

struct baton_http_stream *http_stream_open(struct baton_http_req *r, int status, const char *ctype,
    const char *const *headers)
{
	struct baton_http *h = r->h;
	struct baton_http_stream *s = calloc(1, sizeof *s);
	struct MHD_Response *resp = s ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
	    stream_read, s, stream_free) : NULL;
	if (resp && hs_add_headers(resp, ctype, headers) != 0) {
		MHD_destroy_response(resp); /* its stream_free sees s->r NULL */
		resp = NULL;
	}
	pthread_mutex_lock(&h->mu);
	if (!resp || r->answered || r->mhd_done || r->st != RQ_HANDLING) {
		if (!r->answered) {
			r->answered = true;
			if (!r->mhd_done && r->st == RQ_HANDLING) {
				struct MHD_Response *e = hs_error_resp(500, BATON_ENOMEM, "out of memory");
				if (e)
					hs_park(r, e, 500);
			}
		}
		hs_unref_unlock(r);
		if (resp)
			MHD_destroy_response(resp); /* s->r is NULL: its free callback does nothing */
		free(s);
		return NULL;
	}
	s->r = r;
	r->stream = s;
	r->answered = true;
	r->refs++;               /* the response's (dropped in stream_free) */
	hs_park(r, resp, status);   /* the application's reference goes with s */
	pthread_mutex_unlock(&h->mu);
	return s;
}

int http_stream_write(struct baton_http_stream *s, const void *p, size_t n)
{
	struct baton_http *h = s->r->h;
	int rc = 0;
	pthread_mutex_lock(&h->mu);
	if (s->gone || h->stopping || s->r->mhd_done) {
		rc = BATON_ECLOSED;
	} else if (s->len - s->off + n > STREAM_MAX) {
		rc = BATON_ETOOBIG;
	} else if (n) {
		if (s->len + n > s->cap) {
			if (s->off) { /* move the unsent bytes to the front first */
				memmove(s->buf, s->buf + s->off, s->len - s->off);
				s->len -= s->off;
				s->off = 0;
			}
			size_t cap = s->cap ? s->cap : 4096;
			while (cap < s->len + n)
				cap *= 2;
			char *b = cap > s->cap ? realloc(s->buf, cap) : s->buf;
			if (!b) {
				pthread_mutex_unlock(&h->mu);
				return BATON_ENOMEM;
			}
			s->buf = b;
			s->cap = cap > s->cap ? cap : s->cap;
		}
		memcpy(s->buf + s->len, p, n);
		s->len += n;
		if (s->waiting) {
			s->waiting = false;
			MHD_resume_connection(s->r->conn);
		}
	}
	pthread_mutex_unlock(&h->mu);
	return rc;
}

int http_stream_gone(const struct baton_http_stream *s)
{
	struct baton_http *h = s->r->h;
	pthread_mutex_lock(&h->mu);
	int g = s->gone || h->stopping || s->r->mhd_done;
	pthread_mutex_unlock(&h->mu);
	return g;
}

static void stream_end(struct baton_http_stream *s, bool aborted)
{
	struct baton_http_req *r = s->r;
	pthread_mutex_lock(&r->h->mu);
	s->closed = true;
	s->aborted = aborted;
	if (s->waiting && !r->mhd_done) {
		s->waiting = false;
		MHD_resume_connection(r->conn);
	}
	hs_unref_unlock(r); /* the application's reference */
}

void http_stream_close(struct baton_http_stream *s)
{
	stream_end(s, false);
}

void http_stream_abort(struct baton_http_stream *s)
{
	stream_end(s, true);
}

void http_req_on_gone(struct baton_http_req *r, http_gone_fn fn, void *owner, uint64_t id)
{
	pthread_mutex_lock(&r->h->mu);
	r->gone_cb = (struct gone_cb){ fn, owner, id };
	bool now = r->gone && !r->gone_fired && fn;
	if (now)
		r->gone_fired = true;
	pthread_mutex_unlock(&r->h->mu);
	if (now)
		fn(owner, id);
}
