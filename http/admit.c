/* admit.c: connection admission: the connection list, max_conns, and evicting
   the oldest idle connection under a flood; the same per client address
   (max_conns_per_addr), where authenticated connections do not count. */

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

static void uncount(struct conn *k)
{
	if (k->counted) {
		k->counted = false;
		k->addr->n--;
	}
}

/* Shuts v down to make room (h->mu held). */
static void evict(struct baton_http *h, struct conn *v, struct conn *fresh, const char *why)
{
	uncount(v);
	v->evicted = true;
	h->n_going++;
	v->deadline = 0;
	h->evicted++;
	if (v->fd >= 0)
		shutdown(v->fd, SHUT_RDWR); /* libmicrohttpd sees the end and closes it */
	if (getenv("BATON_HTTP_DEBUG"))
		fprintf(stderr, "baton http: %u connections: fd %d %s (%s)\n", h->n_conns, v->fd,
		    v == fresh ? "refused (none idle to make room)" : "closed to make room (oldest idle)", why);
}

/* Whether k may be closed to make room: it waits for a request, never
 * carried the token and is not going already. */
static bool evictable(const struct conn *k, const struct conn *fresh)
{
	return k != fresh && !k->evicted && k->deadline > 0 && !k->authed && k->fd >= 0;
}

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
		if (evictable(k, fresh)) {
			v = k;
			break;
		}
	evict(h, v, fresh, "max_conns");
}

/* One address past max_conns_per_addr (issue 28): its oldest connection
 * that waits for a request goes, or the new one when it has none. So an
 * address cycles its own connections and never takes the room of other
 * addresses, nor of connections that carried the token (they do not
 * count). On loopback every local user is one address: there it bounds
 * what the unauthenticated local clients hold together, leaving the rest
 * of max_conns to those with the token. */
static void evict_of_addr(struct baton_http *h, struct conn *fresh)
{
	struct addr_rec *a = fresh->addr;
	if (!a || a->n <= h->max_per_addr)
		return;
	struct conn *v = fresh;
	for (struct conn *k = h->conns_tail; k; k = k->prev)
		if (k->addr == a && k->counted && evictable(k, fresh)) {
			v = k;
			break;
		}
	evict(h, v, fresh, "max_conns_per_addr");
}

static unsigned addr_hash(const unsigned char *a)
{
	uint32_t x = 2166136261u; /* FNV-1a */
	for (int i = 0; i < 16; i++)
		x = (x ^ a[i]) * 16777619u;
	return x % HTTP_ADDR_BUCKETS;
}

/* The record of the client's address, made at its first connection (h->mu
 * held); NULL for an address of another family or without memory. */
static struct addr_rec *addr_of(struct baton_http *h, struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (!ci || !ci->client_addr)
		return NULL;
	unsigned char a[16] = { 0 };
	const struct sockaddr *sa = ci->client_addr;
	if (sa->sa_family == AF_INET) {
		a[10] = a[11] = 0xff; /* v4-mapped: ::ffff:a.b.c.d, one key for both */
		memcpy(a + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		memcpy(a, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
	} else {
		return NULL;
	}
	unsigned b = addr_hash(a);
	for (struct addr_rec *r = h->addrs[b]; r; r = r->next)
		if (memcmp(r->a, a, 16) == 0)
			return r;
	struct addr_rec *r = calloc(1, sizeof *r);
	if (!r)
		return NULL;
	memcpy(r->a, a, 16);
	r->next = h->addrs[b];
	h->addrs[b] = r;
	return r;
}

static void addr_drop(struct baton_http *h, struct addr_rec *a)
{
	if (!a || --a->conns > 0)
		return;
	struct addr_rec **p = &h->addrs[addr_hash(a->a)];
	while (*p != a)
		p = &(*p)->next;
	*p = a->next;
	free(a);
}

void hs_conn_authed(struct baton_http *h, struct conn *k)
{
	(void)h;
	k->authed = true;
	uncount(k);
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
		if ((k->addr = addr_of(h, c)) != NULL) {
			k->addr->conns++;
			k->addr->n++;
			k->counted = true;
		}
		k->deadline = baton_now_s() + h->header_timeout_s;
		k->next = h->conns;
		if (h->conns)
			h->conns->prev = k;
		else
			h->conns_tail = k;
		h->conns = k;
		h->n_conns++;
		evict_of_addr(h, k);
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
	uncount(k);
	addr_drop(h, k->addr);
	pthread_mutex_unlock(&h->mu);
	free(k);
}
