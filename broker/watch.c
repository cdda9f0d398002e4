/*
 * watch.c: how the broker sees an engine die: a pidfd per engine polled by
 * the watcher thread (at once, not at the heartbeat timeout), and the
 * control socket's pipe events (nng threads). Both only post to the inbox.
 */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "broker/broker_int.h"

static int pidfd_open_(int pid)
{
#ifdef SYS_pidfd_open
	return (int)syscall(SYS_pidfd_open, pid, 0);
#else
	(void)pid;
	errno = ENOSYS;
	return -1;
#endif
}

void br_watch_add(struct broker *b, int pid, struct eref ref)
{
	int fd = pid > 0 ? pidfd_open_(pid) : -1;
	if (fd < 0)
		return; /* the heartbeat timeout and pipe events remain */
	pthread_mutex_lock(&b->wmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		if (b->watches[i].fd < 0) {
			b->watches[i] = (struct watch){ .fd = fd, .pid = pid, .ref = ref };
			fd = -1;
			break;
		}
	}
	pthread_mutex_unlock(&b->wmu);
	if (fd >= 0)
		close(fd);
	uint64_t one = 1;
	if (write(b->wake_fd, &one, sizeof one) < 0) {
		/* the watcher wakes at its next timeout anyway */
	}
}

void br_watch_remove(struct broker *b, struct eref ref)
{
	pthread_mutex_lock(&b->wmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->watches[i].fd >= 0 && b->watches[i].ref.slot == ref.slot &&
		    b->watches[i].ref.gen == ref.gen)
			b->watches[i].remove = true;
	pthread_mutex_unlock(&b->wmu);
	uint64_t one = 1;
	if (write(b->wake_fd, &one, sizeof one) < 0) {
		/* see watch_add */
	}
}

static void *watcher(void *arg)
{
	struct broker *b = arg;
	struct pollfd pf[BROKER_MAX_ENGINES + 1];
	struct watch cp[BROKER_MAX_ENGINES + 1];
	while (!atomic_load(&b->stopping)) {
		size_t n = 0;
		pf[n++] = (struct pollfd){ .fd = b->wake_fd, .events = POLLIN };
		pthread_mutex_lock(&b->wmu);
		for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
			struct watch *w = &b->watches[i];
			if (w->fd < 0)
				continue;
			if (w->remove) {
				close(w->fd); /* only this thread closes, so poll never sees a reused fd */
				w->fd = -1;
				w->remove = false;
				continue;
			}
			cp[n] = *w;
			pf[n++] = (struct pollfd){ .fd = w->fd, .events = POLLIN };
		}
		pthread_mutex_unlock(&b->wmu);
		int r = poll(pf, n, 500);
		if (r <= 0)
			continue;
		if (pf[0].revents) {
			uint64_t v;
			if (read(b->wake_fd, &v, sizeof v) < 0) {
				/* nonblocking: nothing to read */
			}
		}
		for (size_t i = 1; i < n; i++) {
			if (!pf[i].revents)
				continue;
			pthread_mutex_lock(&b->wmu);
			for (size_t k = 0; k < BROKER_MAX_ENGINES; k++)
				if (b->watches[k].fd == cp[i].fd)
					b->watches[k].remove = true;
			pthread_mutex_unlock(&b->wmu);
			struct item *it = calloc(1, sizeof *it);
			if (it) {
				it->kind = IT_DEATH;
				it->ref = cp[i].ref;
				it->pid = cp[i].pid;
				br_post(b, it);
			}
		}
	}
	pthread_mutex_lock(&b->wmu);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->watches[i].fd >= 0) {
			close(b->watches[i].fd);
			b->watches[i].fd = -1;
		}
	pthread_mutex_unlock(&b->wmu);
	return NULL;
}

/* Runs on an nng thread: record and hand over. */
void br_on_pipe(void *arg, const struct proto_pipe_event *ev)
{
	struct broker *b = arg;
	if (ev->ev != PROTO_PIPE_REM)
		return;
	struct item *it = calloc(1, sizeof *it);
	if (!it)
		return;
	it->kind = IT_PIPE_REM;
	it->pipe = ev->pipe;
	it->pid = ev->pid;
	br_post(b, it);
}

int br_watch_start(struct broker *b)
{
	if (pthread_create(&b->watch_th, NULL, watcher, b) != 0)
		return BATON_ENOMEM;
	b->have_watch = 1;
	return 0;
}

void br_watch_stop(struct broker *b)
{
	if (!b->have_watch)
		return;
	uint64_t one = 1;
	if (write(b->wake_fd, &one, sizeof one) < 0) {
		/* it wakes within its poll timeout */
	}
	pthread_join(b->watch_th, NULL);
	b->have_watch = 0;
}
