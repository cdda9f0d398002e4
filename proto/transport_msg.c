/*
 * transport_msg.c: Baton messages into nng messages, and the fault
 * injection on sending one.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/transport_int.h"

/* Two passes: count the bytes, then write them into a message of exactly
 * that size, so a 64 MiB bin is copied once and never reallocated. */

struct counter {
	size_t n;
};

static int count_write(void *data, const char *buf, size_t len)
{
	(void)buf;
	((struct counter *)data)->n += len;
	return 0;
}

struct filler {
	char *p;
	size_t off, cap;
};

static int fill_write(void *data, const char *buf, size_t len)
{
	struct filler *f = data;
	if (len > f->cap - f->off)
		return -1;
	memcpy(f->p + f->off, buf, len);
	f->off += len;
	return 0;
}

int proto__encode_nng(const struct baton_msg *m, nng_msg **out, struct proto_diag *diag)
{
	struct counter c = { 0 };
	nng_msg *msg;
	int err, rv;
	*out = NULL;
	if ((err = proto__encode_to(m, count_write, &c, diag)))
		return err;
	if ((rv = nng_msg_alloc(&msg, c.n)) != 0)
		return proto__fail(diag, BATON_ENOMEM, "no memory for a message of %zu bytes", c.n);
	struct filler f = { nng_msg_body(msg), 0, c.n };
	if ((err = proto__encode_to(m, fill_write, &f, diag)) || f.off != c.n) {
		nng_msg_free(msg);
		return err ? err : proto__fail(diag, BATON_EINTERNAL, "encoder is not deterministic");
	}
	*out = msg;
	return 0;
}

/* Fault injection (engine/backend/backend.h, fault_wrap, has the syntax): BATON_FAULT="send:N" or
 * "send:N/every" makes the Nth send of a reply (proto_ctx_reply) or a request
 * (proto_client_call), counted together per process, fail with
 * BATON_ECLOSED before it reaches nng: a reply is dropped (the client's REQ
 * resends), a request is not sent. One line on stderr per fault. */
static unsigned long fault_nth, fault_every;
static _Atomic unsigned long fault_sends;
static pthread_once_t fault_once = PTHREAD_ONCE_INIT;

static void fault_parse(void)
{
	const char *v = getenv("BATON_FAULT");
	const char *p = v ? strstr(v, "send:") : NULL;
	if (p && (p == v || p[-1] == ',' || p[-1] == ' ')) {
		char *end;
		fault_nth = strtoul(p + 5, &end, 10);
		if (*end == '/')
			fault_every = strtoul(end + 1, NULL, 10);
	}
}

bool proto__send_fault(const char *what)
{
	pthread_once(&fault_once, fault_parse);
	if (fault_nth == 0)
		return false;
	unsigned long n = atomic_fetch_add(&fault_sends, 1) + 1;
	if (n < fault_nth || (n != fault_nth && (fault_every == 0 || (n - fault_nth) % fault_every != 0)))
		return false;
	fprintf(stderr, "baton-fault: send call %lu fails (%s): %s\n", n, what,
	    baton_strerror(BATON_ECLOSED));
	return true;
}
