/*
 * guard.c: reading a mapped arena that shrank under us must not kill the
 * process (issue 14, item 7). A file truncated while mapped turns reads
 * past its new end into SIGBUS, on whatever thread touches the page: the
 * engine's copies, a driver's staging thread, verify. A SIGBUS handler
 * that longjmps out cannot be used there (it would leave a driver's locks
 * held), so this one instead maps a private zero page over the faulting
 * page of a guarded arena and returns: the read completes (with zeros),
 * the fault is counted, and arena_intact() reports the arena truncated,
 * so its caller fails the request and drops what it copied. A creator's
 * writable mapping of a file on a full tmpfs faults the same way on
 * write: there one shared scratch page (a memfd's) is mapped instead, so
 * the writes land somewhere without costing memory, and the creator sees
 * the count and gives up with a message. Faults at other addresses go to
 * the previous handler or the default action.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "arena/arena_int.h"

#define GUARD_SLOTS 64

static struct guard_range {
	_Atomic uintptr_t lo, hi;   /* lo == 0: free */
	atomic_int writable;
	atomic_uint faults;
} g_ranges[GUARD_SLOTS];
static int g_scratch = -1;  /* a memfd of one page, for writable ranges */
static atomic_int g_installed;
static struct sigaction g_prev;
static uintptr_t g_page;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	uintptr_t addr = (uintptr_t)si->si_addr;
	for (int i = 0; i < GUARD_SLOTS; i++) {
		uintptr_t lo = atomic_load(&g_ranges[i].lo), hi = atomic_load(&g_ranges[i].hi);
		if (!lo || addr < lo || addr >= hi)
			continue;
		void *page = (void *)(addr & ~(g_page - 1));
		/* mmap is a plain system call on Linux: safe here in practice. */
		void *m = atomic_load(&g_ranges[i].writable) ?
		    (g_scratch >= 0 ? mmap(page, g_page, PROT_READ | PROT_WRITE,
		        MAP_SHARED | MAP_FIXED, g_scratch, 0) : MAP_FAILED) :
		    mmap(page, g_page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		if (m != MAP_FAILED) {
			atomic_fetch_add(&g_ranges[i].faults, 1);
			return;
		}
		break;
	}
	if ((g_prev.sa_flags & SA_SIGINFO) && g_prev.sa_sigaction) {
		g_prev.sa_sigaction(sig, si, uc);
		return;
	}
	if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
		g_prev.sa_handler(sig);
		return;
	}
	/* Not ours: the default action, when the access runs again. */
	signal(SIGBUS, SIG_DFL);
}

static void install(void)
{
	int expect = 0;
	if (!atomic_compare_exchange_strong(&g_installed, &expect, 1))
		return;
	g_page = (uintptr_t)sysconf(_SC_PAGESIZE);
	g_scratch = memfd_create("baton-arena-guard", MFD_CLOEXEC);
	if (g_scratch >= 0 && ftruncate(g_scratch, (off_t)g_page) != 0) {
		close(g_scratch);
		g_scratch = -1;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, &g_prev);
}

int arena_guard_add(const void *base, uint64_t size, int writable)
{
	install();
	for (int i = 0; i < GUARD_SLOTS; i++) {
		uintptr_t expect = 0;
		if (atomic_compare_exchange_strong(&g_ranges[i].lo, &expect, (uintptr_t)base)) {
			atomic_store(&g_ranges[i].faults, 0);
			atomic_store(&g_ranges[i].writable, writable);
			atomic_store(&g_ranges[i].hi, (uintptr_t)base + size);
			return i;
		}
	}
	return -1; /* more arenas open than slots: this one is unguarded */
}

void arena_guard_remove(int slot)
{
	if (slot < 0 || slot >= GUARD_SLOTS)
		return;
	atomic_store(&g_ranges[slot].hi, 0);
	atomic_store(&g_ranges[slot].lo, 0);
}

unsigned arena_guard_faults(int slot)
{
	if (slot < 0 || slot >= GUARD_SLOTS)
		return 0;
	return atomic_load(&g_ranges[slot].faults);
}
