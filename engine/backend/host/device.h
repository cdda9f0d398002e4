/*
 * device.h (internal to engine/backend/host/: device.c, backend.c and the
 * tests here; other folders use host.h): the capacity of a host "device",
 * shared by every process that opens it, the way a GPU's memory is.
 *
 * Device <index> is a small state file, $BATON_HOSTDEV_DIR/hostdev-<index>
 * (default directory /dev/shm/baton), holding a header (magic, version,
 * capacity) and a table of owner records {pid, process start time, opens,
 * bytes}. Every read-modify-write happens under flock(LOCK_EX) on that
 * file. free = capacity - sum(bytes of live owners).
 *
 * Owners that died are reaped (their record zeroed) during any locked
 * operation, so their usage comes back as a GPU driver returns a dead
 * process's memory. An owner is live when its pid exists, is not a zombie,
 * and its start time (/proc/<pid>/stat field 22) is the one recorded, so a
 * reused pid is not mistaken for the old owner.
 *
 * Capacity: the `capacity` argument if nonzero, else $BATON_HOSTDEV_MIB,
 * else HOSTDEV_DEFAULT_MIB. The first opener creates the file with its
 * capacity. A later opener that asks for a capacity explicitly (argument
 * or environment) and differs from the file replaces it only when the file
 * has no live owner; otherwise the file's capacity wins. The default never
 * replaces an existing file's capacity. A file whose header is not valid
 * (wrong magic, version or size) is rewritten under the lock.
 *
 * A handle is per process: after fork() the child cannot use the parent's
 * handle (BATON_ESTATE); hostdev_close() in the child only frees memory.
 * One handle may be used by several threads (a mutex serialises them).
 */
#ifndef BATON_ENGINE_BACKEND_HOST_DEVICE_H
#define BATON_ENGINE_BACKEND_HOST_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#define HOSTDEV_DEFAULT_MIB 4096u
#define HOSTDEV_MAX_INDEX 1024
#define HOSTDEV_MAX_OWNERS 256
#define HOSTDEV_VERSION 1u
#define HOSTDEV_MAGIC "BATONHD"  /* 8 bytes with its NUL */

/* The file layout (native endian: the file never leaves the machine). */
struct hostdev_file_header {
	char magic[8];
	uint32_t version;
	uint32_t n_owners;   /* HOSTDEV_MAX_OWNERS */
	uint64_t capacity;   /* bytes */
	uint64_t pad[5];
};

struct hostdev_file_owner {
	int32_t pid;         /* 0: free record */
	uint32_t opens;      /* handles open in that process */
	uint64_t start_time; /* /proc/<pid>/stat field 22, 0 if unknown */
	uint64_t bytes;      /* charged */
	uint64_t pad;
};

struct hostdev;

/* Opens (creating when needed) host device `index`. errbuf may be NULL. */
int hostdev_open(int index, uint64_t capacity, struct hostdev **out,
    char *errbuf, size_t errlen);
/* Returns this handle's charge and unregisters it; NULL allowed. */
void hostdev_close(struct hostdev *h);

/* Charges `bytes` to this process: BATON_EDEVMEM, with nothing changed,
 * when the device has less free. */
int hostdev_charge(struct hostdev *h, uint64_t bytes);
/* Gives back bytes charged through this handle (clamped to its charge). */
int hostdev_uncharge(struct hostdev *h, uint64_t bytes);
/* Free for everyone and total, after reaping dead owners. */
int hostdev_mem_info(struct hostdev *h, uint64_t *free_bytes, uint64_t *total_bytes);
/* What this handle has charged now. */
uint64_t hostdev_charged(const struct hostdev *h);
/* The state file's path, for tests and messages. */
const char *hostdev_path(const struct hostdev *h);

/* Start time of a process (field 22 of /proc/<pid>/stat); 0 when unknown.
 * *zombie (may be NULL) is set when the process has exited but is not
 * reaped yet. Returns -1 when the process does not exist. */
int hostdev_proc_start(int pid, uint64_t *start, int *zombie);

#endif
