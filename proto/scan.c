/*
 * scan.c: the pre-pass over untrusted msgpack bytes.
 *
 * msgpack-c allocates an array's or map's items as soon as it reads the
 * count, so a 5-byte message declaring 2^32 items would make it allocate
 * about 100 GiB. This walker reads the format itself, allocates nothing,
 * and lets msgpack-c see only bytes where every count is real: each
 * container's count is within its cap and, together with every element
 * still owed by the containers above it, within the bytes left (an element
 * takes at least one byte); nesting stays within BATON_PROTO_MAX_DEPTH; the
 * whole message holds at most BATON_PROTO_MAX_OBJECTS objects (so
 * msgpack-c's zone stays under about 1.5 MiB); strings and bins fit their
 * caps and the bytes left; no ext type, no reserved byte, no trailing
 * bytes. Iterative: hostile nesting cannot exhaust the C stack.
 */
#include <string.h>

#include "proto/proto_int.h"

static uint64_t be(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < n; i++)
		v = (v << 8) | p[i];
	return v;
}

enum { K_SCALAR, K_STR, K_BIN, K_ARRAY, K_MAP };

int proto__scan(const void *buf, size_t len, struct proto_diag *diag)
{
	const uint8_t *base = buf, *p = buf, *end = base + len;
	uint64_t left[BATON_PROTO_MAX_DEPTH]; /* elements still owed per open container */
	uint64_t owed = 0;                    /* their sum */
	unsigned depth = 0;
	uint64_t objects = 0;
	bool top_done = false;

	if (len > BATON_PROTO_MAX_MSG)
		return proto__fail(diag, BATON_ETOOBIG,
		    "message of %zu bytes is larger than the limit of %u", len,
		    (unsigned)BATON_PROTO_MAX_MSG);
	if (len == 0)
		return proto__fail(diag, BATON_EMSG, "empty message");

	while (!top_done || depth > 0) {
		size_t at = (size_t)(p - base);
		if (p >= end)
			return proto__fail(diag, BATON_EMSG,
			    "truncated: message ends at byte %zu inside a container", at);
		uint8_t b = *p++;
		int kind = K_SCALAR;
		unsigned hdr = 0;      /* bytes of length/count after the type byte */
		uint64_t n = 0;        /* count or payload bytes */
		bool have_n = false;

		if (b <= 0x7f || b >= 0xe0) {
			/* fixint */
		} else if (b <= 0x8f) {
			kind = K_MAP, n = b & 0x0f, have_n = true;
		} else if (b <= 0x9f) {
			kind = K_ARRAY, n = b & 0x0f, have_n = true;
		} else if (b <= 0xbf) {
			kind = K_STR, n = b & 0x1f, have_n = true;
		} else {
			switch (b) {
			case 0xc0: case 0xc2: case 0xc3: break;
			case 0xc4: kind = K_BIN, hdr = 1; break;
			case 0xc5: kind = K_BIN, hdr = 2; break;
			case 0xc6: kind = K_BIN, hdr = 4; break;
			case 0xca: n = 4, have_n = true; break;
			case 0xcb: n = 8, have_n = true; break;
			case 0xcc: case 0xd0: n = 1, have_n = true; break;
			case 0xcd: case 0xd1: n = 2, have_n = true; break;
			case 0xce: case 0xd2: n = 4, have_n = true; break;
			case 0xcf: case 0xd3: n = 8, have_n = true; break;
			case 0xd9: kind = K_STR, hdr = 1; break;
			case 0xda: kind = K_STR, hdr = 2; break;
			case 0xdb: kind = K_STR, hdr = 4; break;
			case 0xdc: kind = K_ARRAY, hdr = 2; break;
			case 0xdd: kind = K_ARRAY, hdr = 4; break;
			case 0xde: kind = K_MAP, hdr = 2; break;
			case 0xdf: kind = K_MAP, hdr = 4; break;
			case 0xc1:
				return proto__fail(diag, BATON_EMSG,
				    "byte %zu: 0xc1 is not a msgpack type", at);
			default: /* 0xc7-0xc9, 0xd4-0xd8 */
				return proto__fail(diag, BATON_EMSG,
				    "byte %zu: ext types (0x%02x) are not allowed", at, b);
			}
		}
		if (hdr) {
			if ((size_t)(end - p) < hdr)
				return proto__fail(diag, BATON_EMSG,
				    "truncated: the length at byte %zu is cut off", at);
			n = be(p, hdr);
			p += hdr;
		}
		if (++objects > BATON_PROTO_MAX_OBJECTS)
			return proto__fail(diag, BATON_ETOOBIG,
			    "more than %u objects in one message", BATON_PROTO_MAX_OBJECTS);

		/* caps first: a huge count is "too big" even when it is also
		 * far past the end */
		switch (kind) {
		case K_STR:
			/* the longest string any field allows (a prompt); each
			 * field's own, usually smaller, limit is checked when
			 * the field is decoded */
			if (n > BATON_PROTO_MAX_PROMPT)
				return proto__fail(diag, BATON_ETOOBIG,
				    "byte %zu: string of %llu bytes is longer than the limit of %u",
				    at, (unsigned long long)n, BATON_PROTO_MAX_PROMPT);
			break;
		case K_BIN:
			if (n > BATON_PROTO_MAX_BIN)
				return proto__fail(diag, BATON_ETOOBIG,
				    "byte %zu: bin of %llu bytes is longer than the limit of %u",
				    at, (unsigned long long)n, BATON_PROTO_MAX_BIN);
			break;
		case K_ARRAY:
			if (n > BATON_PROTO_MAX_ARRAY)
				return proto__fail(diag, BATON_ETOOBIG,
				    "byte %zu: array of %llu items is more than the limit of %u",
				    at, (unsigned long long)n, BATON_PROTO_MAX_ARRAY);
			break;
		case K_MAP:
			if (n > BATON_PROTO_MAX_KEYS)
				return proto__fail(diag, BATON_ETOOBIG,
				    "byte %zu: map of %llu entries is more than the limit of %u",
				    at, (unsigned long long)n, BATON_PROTO_MAX_KEYS);
			break;
		}
		if (!top_done && kind != K_MAP)
			return proto__fail(diag, BATON_EMSG, "the message is not a map");

		/* this object is one of the elements its parent owes */
		if (depth > 0) {
			left[depth - 1]--;
			owed--;
		} else {
			top_done = true;
		}

		if (kind == K_ARRAY || kind == K_MAP) {
			uint64_t elems = kind == K_MAP ? 2 * n : n;
			if (depth >= BATON_PROTO_MAX_DEPTH)
				return proto__fail(diag, BATON_EMSG,
				    "byte %zu: nested deeper than %u levels", at,
				    BATON_PROTO_MAX_DEPTH);
			if (owed + elems > (uint64_t)(end - p))
				return proto__fail(diag, BATON_EMSG,
				    "truncated: byte %zu declares %llu %s but only %zu bytes are left",
				    at, (unsigned long long)n,
				    kind == K_MAP ? "entries" : "items", (size_t)(end - p));
			if (elems > 0) {
				left[depth++] = elems;
				owed += elems;
			}
		} else if (have_n || kind != K_SCALAR) {
			if (n > (uint64_t)(end - p))
				return proto__fail(diag, BATON_EMSG,
				    "truncated: the value at byte %zu needs %llu bytes, %zu are left",
				    at, (unsigned long long)n, (size_t)(end - p));
			p += n;
		}
		while (depth > 0 && left[depth - 1] == 0)
			depth--;
	}
	if (p != end)
		return proto__fail(diag, BATON_EMSG,
		    "%zu trailing bytes after the message", (size_t)(end - p));
	return 0;
}
