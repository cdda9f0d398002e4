/*
 * transport_hangup.c: a peer that hangs up during the SP handshake must not
 * stop a listener (or a dialer) of nng 1.5.2.
 *
 * nng writes its 8-byte SP header first on every new connection. When the
 * peer is already gone, sendmsg fails with EPIPE, which nng 1.5.2 maps to
 * NNG_ECLOSED (posix_debug.c), and ipc_pipe_neg_cb / tcptran_pipe_nego_cb
 * hand that error to the endpoint's pending accept (or dial). The core's
 * listener_accept_cb reads NNG_ECLOSED as "the listener is closing" and
 * never accepts again; dialer_connect_cb likewise stops redialing. One
 * connect() and close() by any local process could stop a control socket
 * for good. nng 1.6.0 fixed it (commit 9248ed74, nng issue #1518) by
 * reporting a negotiation's NNG_ECLOSED as NNG_ECONNSHUT, which both
 * callbacks treat as the peer's doing: accept (or dial) again.
 *
 * Debian 12 ships 1.5.2, and nng has no hook between the system call and
 * that mapping, so this file defines sendmsg for the program: the one
 * system call nng's ipc and tcp streams write with. On a version of nng
 * older than 1.6.0 an EPIPE reads as ECONNRESET, which nng maps to
 * NNG_ECONNRESET, which the listener and the dialer both retry on; on an
 * established pipe either error closes the pipe, so nothing else changes.
 * On nng 1.6.0 and later, and for every other result, this sendmsg is
 * the next one (libc's, or a sanitizer's interceptor in front of it).
 * Being in the program, this definition is the one libnng.so resolves too
 * (ELF interposition), whether nng is linked statically or not. It serves
 * every caller in the process: Baton's own code calls no sendmsg, and to
 * the libraries' callers (libsystemd's sd_notify) EPIPE and ECONNRESET
 * both mean the peer is gone.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "proto/transport_int.h"

typedef ssize_t sendmsg_fn(int, const struct msghdr *, int);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static bool remap;
static sendmsg_fn *next_sendmsg;

/* Once per process, before the first write (nng's or anyone's): whether
 * the nng it runs with is older than 1.6.0, and which sendmsg is next. */
static void init(void)
{
	int major = 0, minor = 0;
	if (sscanf(nng_version(), "%d.%d", &major, &minor) == 2)
		remap = major < 1 || (major == 1 && minor < 6);
	/* POSIX lets a function pointer travel through dlsym's void * */
	*(void **)&next_sendmsg = dlsym(RTLD_NEXT, "sendmsg");
	if (next_sendmsg == sendmsg)
		next_sendmsg = NULL;
}

bool proto__hangup_remap(void)
{
	pthread_once(&once, init);
	return remap;
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	pthread_once(&once, init);
	ssize_t n = next_sendmsg ? next_sendmsg(fd, msg, flags) :
	    (ssize_t)syscall(SYS_sendmsg, fd, msg, flags);
	if (n < 0 && errno == EPIPE && remap)
		errno = ECONNRESET;
	return n;
}
