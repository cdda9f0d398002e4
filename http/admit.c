/* admit.c: connection admission: the connection list, max_conns, and evicting
   the oldest idle connection under a flood. */

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

/* Past max_conns: the oldest connection that waits for a request (idle
 * or sending one: not one whose request is in, nor one that carried the
 * server's token) is shut down to make room for the new one (issue 28:
 * 4,200 connections that reconnected as soon as they were reaped kept the
 * door and an engine unreachable, with no token). A flood thus cycles its
 * own connections, and a client that sends its request at once gets in:
 * it is the newest, the last to go. None to evict: the new one goes.
 * Under h->mu; the fd is still the connection's (as in the reaper). */
static void evict_one(struct baton_http *h, struct conn *fresh)
{
	if (h->n_conns - h->n_going <= h->max_conns)
		return; /* those already shut down make the room */
	struct conn *v = fresh;
	for (struct conn *k = h->conns_tail; k; k = k->prev)
		if (k != fresh && !k->evicted && k->deadline > 0 && !k->authed && k->fd >= 0) {
			v = k;
			break;
		}
	v->evicted = true;
	h->n_going++;
	v->deadline = 0;
	h->evicted++;
	if (v->fd >= 0)
		shutdown(v->fd, SHUT_RDWR); /* libmicrohttpd sees the end and closes it */
	if (getenv("BATON_HTTP_DEBUG"))
		fprintf(stderr, "baton http: %u connections: fd %d %s\n", h->n_conns, v->fd,
		    v == fresh ? "refused (none idle to make room)" : "closed to make room (oldest idle)");
}

void hs_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
    enum MHD_ConnectionNotificationCode toe)
{
	struct baton_http *h = cls;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		struct conn *k = calloc(1, sizeof *k);
		const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
		*socket_context = k;
		if (!k)
			return;
		k->fd = fi ? fi->connect_fd : -1;
		pthread_mutex_lock(&h->mu);
		k->deadline = baton_now_s() + h->header_timeout_s;
		k->next = h->conns;
		if (h->conns)
			h->conns->prev = k;
		else
			h->conns_tail = k;
		h->conns = k;
		h->n_conns++;
		if (h->n_conns > h->max_conns)
			evict_one(h, k);
		pthread_mutex_unlock(&h->mu);
		return;
	}
	struct conn *k = *socket_context;
	if (!k)
		return;
	*socket_context = NULL;
	pthread_mutex_lock(&h->mu);
	/* its requests are done (on_completed ran): none points here now */
	for (struct baton_http_req *r = h->open; r; r = r->next)
		if (r->c == k)
			r->c = NULL;
	if (k->prev)
		k->prev->next = k->next;
	else
		h->conns = k->next;
	if (k->next)
		k->next->prev = k->prev;
	else
		h->conns_tail = k->prev;
	h->n_conns--;
	if (k->evicted)
		h->n_going--;
	pthread_mutex_unlock(&h->mu);
	free(k);
}
