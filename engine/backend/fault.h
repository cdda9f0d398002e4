/*
 * fault.h: fault injection for the engine's device calls (internal).
 *
 * A decorator over any struct baton_backend: the Nth call of map (map_peer
 * counts as a map), alloc, copy_h2d (copy_d2d counts as one) or copy_d2h
 * (counted per process, 1-based, from the wrap) fails with the code a real device gives (BATON_EDEVMEM for map and alloc,
 * BATON_EDRIVER for copy_h2d, BATON_EIO for copy_d2h), without calling the
 * wrapped backend, so nothing is left mapped or half copied.
 *
 * Configured by the environment, read once:
 *   BATON_FAULT="map:3,copy:5,alloc:2/4,d2h:1"
 * a comma list of op:N or op:N/every (the Nth call fails, then every
 * `every` calls after it). op is map, alloc, copy (copy_h2d), d2h
 * (copy_d2h) or send (handled by proto/transport_msg.c, ignored here). N = 0
 * counts without failing. Each injected fault is one line on stderr,
 * "baton-fault: <op> call <n> fails: <code>", and close() prints the call
 * counts: "baton-fault: calls map=.. alloc=.. copy=.. d2h=.. injected=..".
 */
#ifndef BATON_ENGINE_FAULT_H
#define BATON_ENGINE_FAULT_H

#include "engine/backend/backend.h"

/* When BATON_FAULT names a device op, *out is the fault table wrapping
 * `inner` for `dev` (at most 8 devices per process); otherwise *out =
 * inner. The wrap lasts until the fault table's close(dev). Returns 0, or
 * BATON_EINVAL with errbuf set for a malformed BATON_FAULT, or
 * BATON_ENOMEM when 8 devices are already wrapped. */
int fault_wrap(const struct baton_backend *inner, struct baton_dev *dev,
    const struct baton_backend **out, char *errbuf, size_t errlen);

/* Faults injected in this process so far. */
unsigned long fault_injected(void);

#endif
