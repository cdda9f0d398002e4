/*
 * proto_decode_fuzz.c: libFuzzer target for the message decoder.
 *
 * Any bytes: proto_decode() must return a protocol error code (and leave
 * the message empty, with a diagnostic) or succeed; what it accepts must
 * encode again, decode to an equal message, and encode to the same bytes
 * (the encoding is canonical). Sanitizers catch the rest.
 *
 * When the corpus directory given on the command line is empty, the
 * target seeds it with every op's sample (request, reply, error reply,
 * event) and a few hostile shapes, so a fresh run starts from valid
 * messages instead of from nothing.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto_int.h"
#include "tests/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static void put(const char *dir, const char *name, const void *buf, size_t len)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "wb");
	if (!f)
		return;
	fwrite(buf, 1, len, f);
	fclose(f);
}

static void seed(const char *dir)
{
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++)
		for (int kind = 0; kind < (op == PROTO_OP_EVENT ? 1 : 3); kind++) {
			struct baton_msg m;
			void *buf;
			size_t len;
			char name[64];
			proto__sample(&m, (enum proto_op)op, kind);
			if (proto_encode(&m, &buf, &len, NULL) == 0) {
				snprintf(name, sizeof name, "seed-%s-%d", proto_op_name((enum proto_op)op), kind);
				put(dir, name, buf, len);
				free(buf);
			}
			/* the same with only the required fields */
			memset(m.has, 0, sizeof m.has);
			if (kind < 2 && proto_encode(&m, &buf, &len, NULL) == 0) {
				snprintf(name, sizeof name, "seed-%s-%d-min", proto_op_name((enum proto_op)op), kind);
				put(dir, name, buf, len);
				free(buf);
			}
		}
	put(dir, "seed-huge-array", "\x81\xa1v\xdd\xff\xff\xff\xff", 8);
	put(dir, "seed-nested", "\x81\xa1x\x91\x91\x91\x91\x91\x91\x91\x80", 12);
	put(dir, "seed-dup", "\x83\xa1v\x01\xa2op\xa6status\xa2op\xa6status", 22);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *corpus = fuzz_empty_corpus(*argc, *argv);
	if (corpus)
		seed(corpus);
	return 0;
}

static bool protocol_code(int err)
{
	return (err >= BATON_EMSG && err <= BATON_EDUP && err != BATON_ESTALE) ||
	    err == BATON_ENOMEM;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct baton_msg m, m2;
	struct proto_diag d;
	char why[160];
	void *b1, *b2;
	size_t l1, l2;

	int err = proto_decode(data, size, &m, &d);
	if (err) {
		struct baton_msg zero;
		memset(&zero, 0, sizeof zero);
		if (!protocol_code(err) || memcmp(&m, &zero, sizeof m) != 0 || d.text[0] == '\0') {
			fprintf(stderr, "decode failed badly: %d (%s) %s\n", err, baton_errname(err), d.text);
			abort();
		}
		return 0;
	}
	if ((err = proto_encode(&m, &b1, &l1, &d)) != 0) {
		fprintf(stderr, "a decoded message does not encode: %s: %s\n", baton_errname(err), d.text);
		abort();
	}
	if ((err = proto_decode(b1, l1, &m2, &d)) != 0) {
		fprintf(stderr, "a re-encoded message does not decode: %s: %s\n", baton_errname(err), d.text);
		abort();
	}
	if (!proto__msg_equal(&m, &m2, why, sizeof why)) {
		fprintf(stderr, "round trip changed the message: %s\n", why);
		abort();
	}
	if ((err = proto_encode(&m2, &b2, &l2, &d)) != 0 || l1 != l2 || memcmp(b1, b2, l1) != 0) {
		fprintf(stderr, "encoding is not canonical\n");
		abort();
	}
	free(b1);
	free(b2);
	proto_msg_free(&m);
	proto_msg_free(&m2);
	return 0;
}
