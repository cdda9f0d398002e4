/*
 * device.c: the shared capacity of a host "device" (see device.h).
 */
#include "engine/backend/host/device.h"
#include "engine/backend/host/host.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/proto.h"

#define HOSTDEV_DEFAULT_DIR "/dev/shm/baton"

struct hostdev {
	pthread_mutex_t mu;
	int fd;
	int index;
	pid_t pid;          /* the process that opened it */
	uint64_t start;     /* its start time */
	uint64_t capacity;  /* the file's, as last seen */
	uint64_t charged;   /* through this handle */
	char path[PATH_MAX];
};

/* The whole file, read and written in one piece under the lock. */
struct hd_state {
	struct hostdev_file_header hdr;
	struct hostdev_file_owner own[HOSTDEV_MAX_OWNERS];
};

int hostdev_proc_start(int pid, uint64_t *start, int *zombie)
{
	char path[64], buf[1024];
	*start = 0;
	if (zombie)
		*zombie = 0;
	if (pid <= 0)
		return -1;
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		/* No /proc (or not ours to read): fall back to kill(0). */
		if (kill(pid, 0) == 0 || errno == EPERM)
			return 0;
		return -1;
	}
	ssize_t n;
	do
		n = read(fd, buf, sizeof buf - 1);
	while (n < 0 && errno == EINTR);
	close(fd);
	if (n <= 0)
		return -1; /* it went away between open and read */
	buf[n] = '\0';
	/* "pid (comm) S ppid ...": comm may hold spaces and ')'. */
	char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ')
		return 0;
	p += 2;
	if (zombie && (*p == 'Z' || *p == 'X' || *p == 'x'))
		*zombie = 1;
	/* The state is field 3; the start time is field 22. */
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p)
			return 0;
		p++;
	}
	*start = strtoull(p, NULL, 10);
	return 0;
}

static int hd_owner_live(const struct hostdev *h, const struct hostdev_file_owner *o)
{
	if (o->pid <= 0 || o->opens == 0)
		return 0;
	if (o->pid == h->pid && o->start_time == h->start)
		return 1;
	uint64_t start;
	int zombie;
	if (hostdev_proc_start(o->pid, &start, &zombie) < 0 || zombie)
		return 0;
	if (start && o->start_time && start != o->start_time)
		return 0; /* the pid was reused */
	return 1;
}

static void hd_init_state(struct hd_state *st, uint64_t capacity)
{
	memset(st, 0, sizeof *st);
	memcpy(st->hdr.magic, HOSTDEV_MAGIC, sizeof st->hdr.magic);
	st->hdr.version = HOSTDEV_VERSION;
	st->hdr.n_owners = HOSTDEV_MAX_OWNERS;
	st->hdr.capacity = capacity;
}

static int hd_write(struct hostdev *h, const struct hd_state *st)
{
	const char *p = (const char *)st;
	size_t left = sizeof *st;
	off_t off = 0;
	while (left) {
		ssize_t n = pwrite(h->fd, p, left, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return BATON_EIO;
		p += n;
		off += n;
		left -= (size_t)n;
	}
	return 0;
}

/* Takes the handle's mutex and the file lock and reads the state; a file
 * that is not a valid state is rewritten with h->capacity (our own record
 * is added back by hd_self). *dirty tells whether it must be written. */
static int hd_lock_load(struct hostdev *h, struct hd_state *st, int *dirty)
{
	*dirty = 0;
	if (getpid() != h->pid)
		return BATON_ESTATE; /* a handle does not survive fork() */
	pthread_mutex_lock(&h->mu);
	while (flock(h->fd, LOCK_EX) < 0) {
		if (errno != EINTR) {
			pthread_mutex_unlock(&h->mu);
			return BATON_EIO;
		}
	}
	struct stat sb;
	ssize_t n;
	do
		n = pread(h->fd, st, sizeof *st, 0);
	while (n < 0 && errno == EINTR);
	int valid = n == (ssize_t)sizeof *st && fstat(h->fd, &sb) == 0 &&
	    sb.st_size == (off_t)sizeof *st &&
	    memcmp(st->hdr.magic, HOSTDEV_MAGIC, sizeof st->hdr.magic) == 0 &&
	    st->hdr.version == HOSTDEV_VERSION &&
	    st->hdr.n_owners == HOSTDEV_MAX_OWNERS && st->hdr.capacity > 0;
	if (!valid) {
		hd_init_state(st, h->capacity);
		if (ftruncate(h->fd, (off_t)sizeof *st) < 0) {
			flock(h->fd, LOCK_UN);
			pthread_mutex_unlock(&h->mu);
			return BATON_EIO;
		}
		*dirty = 1;
	}
	/* Reap the dead (and clear records that are garbage). */
	for (int i = 0; i < HOSTDEV_MAX_OWNERS; i++) {
		struct hostdev_file_owner *o = &st->own[i];
		if (o->pid == 0 && o->opens == 0 && o->bytes == 0 && o->start_time == 0)
			continue;
		if (!hd_owner_live(h, o)) {
			memset(o, 0, sizeof *o);
			*dirty = 1;
		}
	}
	h->capacity = st->hdr.capacity;
	return 0;
}

static int hd_unlock(struct hostdev *h, const struct hd_state *st, int dirty)
{
	int rc = dirty ? hd_write(h, st) : 0;
	flock(h->fd, LOCK_UN);
	pthread_mutex_unlock(&h->mu);
	return rc;
}

/* Our process's record, created when missing (-1 when the table is full). */
static int hd_self(struct hostdev *h, struct hd_state *st, int create, int *dirty)
{
	int free_i = -1;
	for (int i = 0; i < HOSTDEV_MAX_OWNERS; i++) {
		const struct hostdev_file_owner *o = &st->own[i];
		if (o->pid == h->pid && o->start_time == h->start)
			return i;
		if (o->pid == 0 && free_i < 0)
			free_i = i;
	}
	if (!create || free_i < 0)
		return -1;
	struct hostdev_file_owner *o = &st->own[free_i];
	memset(o, 0, sizeof *o);
	o->pid = h->pid;
	o->start_time = h->start;
	o->opens = 1;
	o->bytes = h->charged; /* a rewritten file gets our charge back */
	*dirty = 1;
	return free_i;
}

static uint64_t hd_used(const struct hd_state *st)
{
	uint64_t used = 0;
	for (int i = 0; i < HOSTDEV_MAX_OWNERS; i++) {
		uint64_t b = st->own[i].pid ? st->own[i].bytes : 0;
		used = used + b < used ? UINT64_MAX : used + b;
	}
	return used;
}

static int hd_live_owners(const struct hd_state *st)
{
	int n = 0;
	for (int i = 0; i < HOSTDEV_MAX_OWNERS; i++)
		n += st->own[i].pid != 0;
	return n;
}

static int parse_mib(const char *s, uint64_t *out)
{
	uint64_t v;
	if (baton_parse_u64(s, 1, UINT64_MAX / BATON_MIB, &v))
		return -1;
	*out = v * BATON_MIB;
	return 0;
}

int hostdev_open(int index, uint64_t capacity, struct hostdev **out,
    char *errbuf, size_t errlen)
{
	struct hostdev *h = NULL;
	struct hd_state *st = NULL;
	int rc, dirty = 0, locked = 0;

	if (!out)
		return BATON_EINVAL;
	*out = NULL;
	if (index < 0 || index >= HOSTDEV_MAX_INDEX) {
		baton_errf(errbuf, errlen, "host device %d does not exist (0..%d)",
		    index, HOSTDEV_MAX_INDEX - 1);
		return BATON_ENODEV;
	}
	int explicit_cap = capacity != 0;
	if (!capacity) {
		const char *env = getenv("BATON_HOSTDEV_MIB");
		if (env && *env) {
			if (parse_mib(env, &capacity) < 0) {
				baton_errf(errbuf, errlen,
				    "BATON_HOSTDEV_MIB=\"%s\" is not a positive number of MiB", env);
				return BATON_ECONFIG;
			}
			explicit_cap = 1;
		} else {
			capacity = (uint64_t)HOSTDEV_DEFAULT_MIB << 20;
		}
	}
	const char *dir = getenv("BATON_HOSTDEV_DIR");
	if (!dir || !*dir)
		dir = HOSTDEV_DEFAULT_DIR;

	h = calloc(1, sizeof *h);
	st = malloc(sizeof *st);
	if (!h || !st) {
		rc = BATON_ENOMEM;
		goto fail;
	}
	h->fd = -1;
	pthread_mutex_init(&h->mu, NULL);
	h->index = index;
	h->pid = getpid();
	h->capacity = capacity;
	hostdev_proc_start(h->pid, &h->start, NULL);
	if ((size_t)snprintf(h->path, sizeof h->path, "%s/hostdev-%d", dir, index) >=
	    sizeof h->path) {
		baton_errf(errbuf, errlen, "BATON_HOSTDEV_DIR is too long");
		rc = BATON_ECONFIG;
		goto fail;
	}
	/* What the device holds is accounted in this file: whoever could
	 * write it, or its directory, could give the device's memory away or
	 * take it. So the arena's rules (base.h, trust): a directory of ours
	 * or root's that no one else can write, a file that is not a link,
	 * ours or root's, not writable by others. The directory is made 0750,
	 * as arena create makes it (they share /dev/shm/baton). */
	if (mkdir(dir, 0750) < 0 && errno != EEXIST) {
		baton_errf(errbuf, errlen, "cannot create host device directory %s: %s",
		    dir, strerror(errno));
		rc = BATON_EIO;
		goto fail;
	}
	if ((rc = baton_trust_dir(dir, "host device directory", errbuf, errlen)))
		goto fail;
	h->fd = open(h->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0660);
	if (h->fd < 0) {
		int e = errno;
		baton_errf(errbuf, errlen, "cannot open host device state %s: %s", h->path,
		    e == ELOOP ? "a symbolic link: refusing it" : strerror(e));
		rc = e == EACCES || e == EPERM || e == ELOOP ? BATON_EPERM : BATON_EIO;
		goto fail;
	}
	if ((rc = baton_trust_file(h->fd, h->path, errbuf, errlen)))
		goto fail;
	rc = hd_lock_load(h, st, &dirty);
	if (rc) {
		baton_errf(errbuf, errlen, "cannot lock host device state %s", h->path);
		goto fail;
	}
	locked = 1;
	if (explicit_cap && st->hdr.capacity != capacity && hd_live_owners(st) == 0) {
		st->hdr.capacity = capacity;
		dirty = 1;
	}
	int self = hd_self(h, st, 0, &dirty);
	if (self >= 0) {
		st->own[self].opens++;
		dirty = 1;
	} else if (hd_self(h, st, 1, &dirty) < 0) {
		baton_errf(errbuf, errlen, "host device %d already has %d processes",
		    index, HOSTDEV_MAX_OWNERS);
		rc = BATON_EBUSY;
		goto fail;
	}
	h->capacity = st->hdr.capacity;
	locked = 0;
	rc = hd_unlock(h, st, dirty);
	if (rc) {
		baton_errf(errbuf, errlen, "cannot write host device state %s", h->path);
		goto fail;
	}
	free(st);
	*out = h;
	return 0;

fail:
	if (locked)
		hd_unlock(h, st, 0);
	if (h) {
		if (h->fd >= 0)
			close(h->fd);
		pthread_mutex_destroy(&h->mu);
	}
	free(st);
	free(h);
	return rc;
}

void hostdev_close(struct hostdev *h)
{
	if (!h)
		return;
	struct hd_state *st = malloc(sizeof *st);
	int dirty;
	if (st && hd_lock_load(h, st, &dirty) == 0) {
		int self = hd_self(h, st, 0, &dirty);
		if (self >= 0) {
			struct hostdev_file_owner *o = &st->own[self];
			o->bytes -= o->bytes < h->charged ? o->bytes : h->charged;
			if (o->opens)
				o->opens--;
			if (o->opens == 0)
				memset(o, 0, sizeof *o);
			dirty = 1;
		}
		h->charged = 0;
		hd_unlock(h, st, dirty);
	}
	/* In a forked child (or when the lock failed) only memory is freed:
	 * the record belongs to the parent or is reaped when we die. */
	free(st);
	close(h->fd);
	pthread_mutex_destroy(&h->mu);
	free(h);
}

int hostdev_charge(struct hostdev *h, uint64_t bytes)
{
	struct hd_state *st = malloc(sizeof *st);
	int dirty, rc;
	if (!st)
		return BATON_ENOMEM;
	rc = hd_lock_load(h, st, &dirty);
	if (rc) {
		free(st);
		return rc;
	}
	int self = hd_self(h, st, 1, &dirty);
	uint64_t used = hd_used(st);
	uint64_t avail = st->hdr.capacity > used ? st->hdr.capacity - used : 0;
	if (self < 0) {
		rc = BATON_EBUSY;
	} else if (bytes > avail) {
		rc = BATON_EDEVMEM;
	} else {
		st->own[self].bytes += bytes;
		h->charged += bytes;
		dirty = 1;
	}
	int wrc = hd_unlock(h, st, dirty);
	if (!rc && wrc) {
		/* Not written: the charge did not happen. */
		h->charged -= bytes;
		rc = wrc;
	}
	free(st);
	return rc;
}

int hostdev_uncharge(struct hostdev *h, uint64_t bytes)
{
	struct hd_state *st = malloc(sizeof *st);
	int dirty, rc;
	if (!st)
		return BATON_ENOMEM;
	rc = hd_lock_load(h, st, &dirty);
	if (rc) {
		free(st);
		return rc;
	}
	if (bytes > h->charged)
		bytes = h->charged;
	int self = hd_self(h, st, 1, &dirty);
	if (self >= 0) {
		struct hostdev_file_owner *o = &st->own[self];
		o->bytes -= o->bytes < bytes ? o->bytes : bytes;
		dirty = 1;
	}
	h->charged -= bytes;
	rc = hd_unlock(h, st, dirty);
	free(st);
	return rc;
}

int hostdev_mem_info(struct hostdev *h, uint64_t *free_bytes, uint64_t *total_bytes)
{
	struct hd_state *st = malloc(sizeof *st);
	int dirty, rc;
	if (!st)
		return BATON_ENOMEM;
	rc = hd_lock_load(h, st, &dirty);
	if (rc) {
		free(st);
		return rc;
	}
	/* A rewritten file needs our record back before it counts. */
	if (dirty)
		hd_self(h, st, 1, &dirty);
	uint64_t used = hd_used(st);
	if (free_bytes)
		*free_bytes = st->hdr.capacity > used ? st->hdr.capacity - used : 0;
	if (total_bytes)
		*total_bytes = st->hdr.capacity;
	rc = hd_unlock(h, st, dirty);
	free(st);
	return rc;
}

uint64_t hostdev_charged(const struct hostdev *h)
{
	return h->charged;
}

const char *hostdev_path(const struct hostdev *h)
{
	return h->path;
}

/* host.h: what the device charges each live process, read under a shared
 * lock without becoming an owner (the broker's measure, as NVML's per
 * process on a GPU). */
int host_device_owners(int index, struct host_device_owner *out, size_t cap, size_t *n_out)
{
	*n_out = 0;
	if (index < 0 || index > HOSTDEV_MAX_INDEX)
		return BATON_EINVAL;
	const char *dir = getenv("BATON_HOSTDEV_DIR");
	if (!dir || !*dir)
		dir = HOSTDEV_DEFAULT_DIR;
	char path[PATH_MAX];
	if ((size_t)snprintf(path, sizeof path, "%s/hostdev-%d", dir, index) >= sizeof path)
		return BATON_ECONFIG;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? BATON_ENODEV : BATON_EIO;
	struct hd_state *st = malloc(sizeof *st);
	int rc = st ? 0 : BATON_ENOMEM;
	if (rc == 0 && flock(fd, LOCK_SH) != 0)
		rc = BATON_EIO;
	ssize_t got = 0;
	while (rc == 0 && (size_t)got < sizeof *st) {
		ssize_t k = read(fd, (char *)st + got, sizeof *st - (size_t)got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += k;
	}
	close(fd); /* the lock goes with it */
	if (rc == 0 && ((size_t)got != sizeof *st || memcmp(st->hdr.magic, HOSTDEV_MAGIC, 8) != 0 ||
	    st->hdr.version != HOSTDEV_VERSION || st->hdr.n_owners != HOSTDEV_MAX_OWNERS))
		rc = BATON_EIO;
	for (size_t i = 0; rc == 0 && i < HOSTDEV_MAX_OWNERS && *n_out < cap; i++) {
		const struct hostdev_file_owner *o = &st->own[i];
		uint64_t start;
		int zombie;
		if (o->pid <= 0 || hostdev_proc_start(o->pid, &start, &zombie) != 0 || zombie ||
		    (o->start_time && start && start != o->start_time))
			continue;
		out[*n_out].pid = o->pid;
		out[*n_out].bytes = o->bytes;
		(*n_out)++;
	}
	free(st);
	return rc;
}
