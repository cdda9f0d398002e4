/*
 * baton-proto-tool: the protocol from the command line, for interop tests
 * and for poking at a live broker or engine.
 *
 *   baton-proto-tool schema                    every op's fields as JSON
 *   baton-proto-tool sample OP [KIND]          a message with every field
 *   baton-proto-tool encode OP [KIND] [KEY=VALUE...]   msgpack to stdout
 *   baton-proto-tool decode                    msgpack on stdin -> JSON
 *   baton-proto-tool serve URL [--count N]     answer requests (REP)
 *   baton-proto-tool call URL [--timeout MS] [--repeat N]
 *                                              msgpack request on stdin -> reply JSON;
 *                                              --repeat: N calls (id + 1 each), each on
 *                                              a new connection, as N CLI calls would be
 *   baton-proto-tool calls URL [--timeout MS]  requests on stdin, each a 4-byte big-endian
 *                                              length then msgpack, sent in turn on one
 *                                              client, each after the previous reply ->
 *                                              one reply JSON line each (back-to-back tests)
 *   baton-proto-tool dial URL                  connect a REQ client and wait
 *   baton-proto-tool sub URL [--count N] [--timeout MS]   print events
 *
 * KIND is request (events too), reply or error. encode takes envelope keys
 * id=, err=, msg= and body keys of the op's table: numbers in C syntax,
 * true/false, nil for reserve_mib, bins as hex. JSON output shows bins as
 * hex strings and nil as null. decode exits 2 and prints
 * {"error": NAME, "code": N, "text": ..., "id": N, "op": ...} for a message
 * that does not decode.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/proto_int.h"

static const char usage_text[] =
    "usage: baton-proto-tool schema | sample OP [request|reply|error] |\n"
    "       encode OP [request|reply|error] [KEY=VALUE...] | decode |\n"
    "       serve URL [--count N] | call URL [--timeout MS] [--repeat N] | calls URL [--timeout MS] | dial URL |\n"
    "       sub URL [--count N] [--timeout MS] | --help | --version\n";

static void usage(void)
{
	fputs(usage_text, stderr);
	exit(64);
}

/* ---- JSON output ----------------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

static void json_value(FILE *f, const struct proto__fdef *fd, const void *base);

static void json_items(FILE *f, const struct proto__item *it, const char *v, uint32_t n)
{
	fputc('[', f);
	for (uint32_t i = 0; i < n; i++) {
		fputs(i ? ", {" : "{", f);
		for (size_t j = 0; j < it->n; j++) {
			fprintf(f, "%s\"%s\": ", j ? ", " : "", it->fields[j].key);
			json_value(f, &it->fields[j], v + (size_t)i * it->size);
		}
		fputc('}', f);
	}
	fputc(']', f);
}

static void json_value(FILE *f, const struct proto__fdef *fd, const void *base)
{
	const char *p = (const char *)base + fd->off;
	switch (fd->type) {
	case PT_BOOL: fputs(*(const bool *)p ? "true" : "false", f); break;
	case PT_U32: fprintf(f, "%" PRIu32, *(const uint32_t *)p); break;
	case PT_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)p); break;
	case PT_RESERVE:
		if (*(const uint64_t *)p == PROTO_RESERVE_FULL)
			fputs("null", f);
		else
			fprintf(f, "%" PRIu64, *(const uint64_t *)p);
		break;
	case PT_I32: fprintf(f, "%" PRId32, *(const int32_t *)p); break;
	case PT_F64: fprintf(f, "%.17g", *(const double *)p); break;
	case PT_STR: json_str(f, *(const char *const *)p); break;
	case PT_BIN: {
		const struct proto_bin *b = (const void *)p;
		fputc('"', f);
		for (size_t i = 0; i < b->len; i++)
			fprintf(f, "%02x", ((const unsigned char *)b->data)[i]);
		fputc('"', f);
		break;
	}
	case PT_GPUS:
	case PT_ENGINES: {
		const struct proto_gpus *a = (const void *)p;
		json_items(f, proto__item_of(fd->type), (const char *)a->v, a->n);
		break;
	}
	}
}

/* The message as the JSON object of its wire keys. */
static void json_msg(FILE *f, const struct baton_msg *m)
{
	fprintf(f, "{\"v\": %d", BATON_PROTO_VERSION);
	if (m->op != PROTO_OP_NONE)
		fprintf(f, ", \"op\": \"%s\"", proto_op_name(m->op));
	fprintf(f, ", \"id\": %" PRIu64, m->id);
	if (m->reply)
		fprintf(f, ", \"ok\": %s", m->ok ? "true" : "false");
	if (m->reply && !m->ok) {
		fprintf(f, ", \"err\": %d, \"msg\": ", (int)m->err);
		json_str(f, m->msg ? m->msg : "");
	}
	for (int i = 0; i < PF_COUNT; i++) {
		if (!proto_has(m, (enum proto_field)i))
			continue;
		fprintf(f, ", \"%s\": ", proto__fields[i].key);
		json_value(f, &proto__fields[i], m);
	}
	fputs("}\n", f);
}

static void json_error(FILE *f, int err, const struct proto_diag *d)
{
	fprintf(f, "{\"error\": \"%s\", \"code\": %d, \"text\": ", baton_errname(err), err);
	json_str(f, d->text);
	fprintf(f, ", \"id\": %" PRIu64 ", \"op\": ", d->id);
	if (d->op == PROTO_OP_NONE)
		fputs("null", f);
	else
		fprintf(f, "\"%s\"", proto_op_name(d->op));
	fputs("}\n", f);
}

/* ---- commands ----------------------------------------------------------------------- */

static int cmd_schema(void)
{
	printf("{\"version\": %d, \"limits\": {\"name\": %u, \"text\": %u, \"bin\": %u, "
	    "\"msg\": %u, \"array\": %u, \"keys\": %u, \"depth\": %u, \"objects\": %u},\n",
	    BATON_PROTO_VERSION, BATON_PROTO_MAX_NAME, BATON_PROTO_MAX_TEXT, BATON_PROTO_MAX_BIN,
	    BATON_PROTO_MAX_MSG, BATON_PROTO_MAX_ARRAY, BATON_PROTO_MAX_KEYS,
	    BATON_PROTO_MAX_DEPTH, BATON_PROTO_MAX_OBJECTS);
	printf(" \"items\": {");
	for (int t = PT_GPUS; t <= PT_ENGINES; t++) {
		const struct proto__item *it = proto__item_of((enum proto__type)t);
		printf("%s\"%s\": [", t == PT_GPUS ? "" : ", ", proto__type_name((enum proto__type)t));
		for (size_t j = 0; j < it->n; j++)
			printf("%s{\"key\": \"%s\", \"type\": \"%s\", \"limit\": %" PRIu64 "}",
			    j ? ", " : "", it->fields[j].key, proto__type_name(it->fields[j].type),
			    it->fields[j].limit);
		printf("]");
	}
	printf("},\n \"ops\": {");
	for (int op = PROTO_OP_NONE + 1; op < PROTO_OP_COUNT; op++) {
		printf("%s\n  \"%s\": {", op == PROTO_OP_NONE + 1 ? "" : ",",
		    proto_op_name((enum proto_op)op));
		for (int r = 0; r < 2; r++) {
			const struct proto__table *t = proto__table((enum proto_op)op, r);
			printf("%s\"%s\": ", r ? ", " : "", r ? "reply" : "request");
			if (!t) {
				printf("null");
				continue;
			}
			printf("[");
			for (size_t j = 0; j < t->n; j++)
				printf("%s{\"key\": \"%s\", \"type\": \"%s\", \"required\": %s, "
				    "\"limit\": %" PRIu64 "}",
				    j ? ", " : "", t->rows[j].f->key, proto__type_name(t->rows[j].f->type),
				    t->rows[j].req ? "true" : "false", t->rows[j].f->limit);
			printf("]");
		}
		printf("}");
	}
	printf("\n }}\n");
	return 0;
}

static int parse_kind(const char *s)
{
	if (!s || strcmp(s, "request") == 0 || strcmp(s, "event") == 0)
		return 0;
	if (strcmp(s, "reply") == 0)
		return 1;
	if (strcmp(s, "error") == 0)
		return 2;
	fprintf(stderr, "baton-proto-tool: kind is request, reply or error, not %s\n", s);
	exit(64);
}

static enum proto_op need_op(const char *s)
{
	enum proto_op op = proto_op_parse(s);
	if (op == PROTO_OP_NONE) {
		fprintf(stderr, "baton-proto-tool: unknown op %s\n", s ? s : "(none)");
		exit(64);
	}
	return op;
}

static int write_msg(const struct baton_msg *m)
{
	void *buf;
	size_t len;
	struct proto_diag d;
	int err = proto_encode(m, &buf, &len, &d);
	if (err) {
		fprintf(stderr, "baton-proto-tool: encode: %s: %s\n", baton_errname(err), d.text);
		return 1;
	}
	size_t off = 0;
	while (off < len) {
		ssize_t n = write(1, (char *)buf + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			free(buf);
			return 1;
		}
		off += (size_t)n;
	}
	free(buf);
	return 0;
}

static int cmd_sample(int argc, char **argv)
{
	struct baton_msg m;
	if (argc < 1)
		usage();
	proto__sample(&m, need_op(argv[0]), parse_kind(argc > 1 ? argv[1] : NULL));
	return write_msg(&m);
}

static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	return baton_parse_u64(s, 0, max, out) == 0;
}

static bool parse_hex(const char *s, struct proto_bin *b, void **own)
{
	size_t n = strlen(s);
	if (n % 2)
		return false;
	unsigned char *p = malloc(n / 2 ? n / 2 : 1);
	if (!p)
		return false;
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1) {
			free(p);
			return false;
		}
		p[i] = (unsigned char)v;
	}
	b->data = p;
	b->len = n / 2;
	*own = p;
	return true;
}

static int cmd_encode(int argc, char **argv)
{
	struct baton_msg m;
	void *owned[8];
	int nowned = 0, rc = 1;
	if (argc < 1)
		usage();
	enum proto_op op = need_op(argv[0]);
	int kind = 0, i = 1;
	if (argc > 1 && !strchr(argv[1], '=')) {
		kind = parse_kind(argv[1]);
		i = 2;
	}
	memset(&m, 0, sizeof m);
	m.op = op;
	m.id = 1;
	m.reply = kind != 0;
	m.ok = kind == 1;
	if (kind == 2)
		m.err = BATON_EINTERNAL;
	for (; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		if (!eq) {
			fprintf(stderr, "baton-proto-tool: expected KEY=VALUE, not %s\n", argv[i]);
			goto out;
		}
		*eq = '\0';
		const char *key = argv[i], *val = eq + 1;
		uint64_t u;
		if (strcmp(key, "id") == 0) {
			if (!parse_u64(val, UINT64_MAX, &m.id))
				goto bad;
			continue;
		}
		if (strcmp(key, "err") == 0) {
			int64_t v;
			if (baton_parse_i64(val, INT32_MIN, INT32_MAX, &v))
				goto bad;
			m.err = (int32_t)v;
			continue;
		}
		if (strcmp(key, "msg") == 0) {
			m.msg = val;
			continue;
		}
		const struct proto__table *t = proto__table(op, m.reply && m.ok);
		const struct proto__fdef *f = NULL;
		for (size_t j = 0; t && j < t->n && !f; j++)
			if (strcmp(t->rows[j].f->key, key) == 0)
				f = t->rows[j].f;
		if (!f) {
			fprintf(stderr, "baton-proto-tool: %s has no field %s\n", proto_op_name(op), key);
			goto out;
		}
		void *dst = (char *)&m + f->off;
		switch (f->type) {
		case PT_BOOL:
			if (strcmp(val, "true") && strcmp(val, "false"))
				goto bad;
			*(bool *)dst = strcmp(val, "true") == 0;
			break;
		case PT_U32:
			if (!parse_u64(val, UINT32_MAX, &u))
				goto bad;
			*(uint32_t *)dst = (uint32_t)u;
			break;
		case PT_U64:
			if (!parse_u64(val, UINT64_MAX, &u))
				goto bad;
			*(uint64_t *)dst = u;
			break;
		case PT_RESERVE:
			if (strcmp(val, "nil") == 0)
				u = PROTO_RESERVE_FULL;
			else if (!parse_u64(val, UINT64_MAX, &u))
				goto bad;
			*(uint64_t *)dst = u;
			break;
		case PT_I32: {
			int64_t v;
			if (baton_parse_i64(val, INT32_MIN, INT32_MAX, &v))
				goto bad;
			*(int32_t *)dst = (int32_t)v;
			break;
		}
		case PT_F64: {
			char *end;
			double v = strtod(val, &end);
			if (*end || !*val)
				goto bad;
			*(double *)dst = v;
			break;
		}
		case PT_STR:
			*(const char **)dst = val;
			break;
		case PT_BIN:
			if (nowned == 8 || !parse_hex(val, dst, &owned[nowned]))
				goto bad;
			nowned++;
			break;
		default:
			fprintf(stderr, "baton-proto-tool: encode cannot take %s; use sample\n", key);
			goto out;
		}
		proto_set(&m, (enum proto_field)f->bit);
		continue;
bad:
		fprintf(stderr, "baton-proto-tool: bad value for %s: %s\n", key, val);
		goto out;
	}
	rc = write_msg(&m);
out:
	while (nowned > 0)
		free(owned[--nowned]);
	return rc;
}

static int read_all(int fd, char **out, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *p = malloc(cap);
	if (!p)
		return -1;
	for (;;) {
		if (n == cap) {
			if (cap > BATON_PROTO_MAX_MSG)
				break; /* the decoder says "too big" */
			char *q = realloc(p, cap * 2);
			if (!q) {
				free(p);
				return -1;
			}
			p = q;
			cap *= 2;
		}
		ssize_t r = read(fd, p + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			free(p);
			return -1;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*out = p;
	*len = n;
	return 0;
}

static int cmd_decode(void)
{
	char *buf;
	size_t len;
	struct baton_msg m;
	struct proto_diag d;
	if (read_all(0, &buf, &len)) {
		perror("baton-proto-tool: read");
		return 1;
	}
	int err = proto_decode(buf, len, &m, &d);
	free(buf);
	if (err) {
		json_error(stdout, err, &d);
		return 2;
	}
	json_msg(stdout, &m);
	proto_msg_free(&m);
	return 0;
}

static long opt_long(int argc, char **argv, const char *name, long def)
{
	for (int i = 0; i + 1 < argc; i++)
		if (strcmp(argv[i], name) == 0) {
			int64_t v;
			if (baton_parse_i64(argv[i + 1], INT32_MIN, INT32_MAX, &v)) {
				fprintf(stderr, "baton-proto-tool: %s wants a whole number, not '%s'\n", name, argv[i + 1]);
				exit(2);
			}
			return (long)v;
		}
	return def;
}

/* The reply serve gives: gen echoes its input, everything else a sample. */
static void make_reply(struct baton_msg *rep, const struct baton_msg *req)
{
	if (req->op == PROTO_OP_GEN) {
		proto_reply_init(rep, req);
		rep->steps = req->steps;
		rep->batch = req->batch;
		rep->checksum = req->seed ^ UINT64_C(0x9e3779b97f4a7c15);
		rep->output = req->input;
		rep->total_ms = 0.25;
		proto_set(rep, PF_TOTAL_MS);
		return;
	}
	proto__sample(rep, req->op, 1);
	rep->id = req->id;
}

static int cmd_serve(int argc, char **argv)
{
	struct proto_server *srv;
	if (argc < 1)
		usage();
	long count = opt_long(argc, argv, "--count", -1);
	int err = proto_server_open(&srv, argv[0], NULL);
	if (err) {
		fprintf(stderr, "baton-proto-tool: listen %s: %s\n", argv[0], baton_strerror(err));
		return 1;
	}
	printf("listening %s\n", proto_server_url(srv));
	fflush(stdout);
	for (long n = 0; count < 0 || n < count; n++) {
		struct baton_msg req, rep;
		struct proto_diag d;
		err = proto_server_recv(srv, &req, -1, &d);
		if (err == BATON_ECLOSED)
			break;
		if (err) {
			/* the transport has answered with the error */
			fprintf(stderr, "baton-proto-tool: bad request (id %" PRIu64 "): %s: %s\n",
			    d.id, baton_errname(err), d.text);
			continue;
		}
		make_reply(&rep, &req);
		if ((err = proto_server_reply(srv, &rep)))
			fprintf(stderr, "baton-proto-tool: reply: %s\n", baton_strerror(err));
		proto_msg_free(&req);
	}
	proto_server_close(srv);
	return 0;
}

static int cmd_call(int argc, char **argv)
{
	char *buf;
	size_t len;
	struct baton_msg req, rep;
	struct proto_diag d;
	if (argc < 1)
		usage();
	int timeout = (int)opt_long(argc, argv, "--timeout", 5000);
	long repeat = opt_long(argc, argv, "--repeat", 1);
	if (repeat < 1)
		usage();
	if (read_all(0, &buf, &len)) {
		perror("baton-proto-tool: read");
		return 1;
	}
	int err = proto_decode(buf, len, &req, &d);
	free(buf);
	if (err) {
		json_error(stdout, err, &d);
		return 2;
	}
	/* stops at the first call that is not answered with success */
	for (long i = 0; i < repeat; i++, req.id++) {
		if (i)
			proto_msg_free(&rep);
		err = proto_call(argv[0], &req, &rep, timeout, &d);
		if (!rep.reply || !rep.ok) {
			if (repeat > 1)
				fprintf(stderr, "baton-proto-tool: call %ld of %ld failed\n", i + 1, repeat);
			break;
		}
	}
	proto_msg_free(&req);
	if (rep.reply) {
		bool ok = rep.ok;
		json_msg(stdout, &rep);
		proto_msg_free(&rep);
		return ok ? 0 : 1;
	}
	json_error(stdout, err, &d);
	return 2;
}

static int cmd_calls(int argc, char **argv)
{
	char *buf;
	size_t len;
	if (argc < 1)
		usage();
	int timeout = (int)opt_long(argc, argv, "--timeout", 5000);
	if (read_all(0, &buf, &len)) {
		perror("baton-proto-tool: read");
		return 1;
	}
	struct proto_client *cli;
	struct proto_opts o = { .dial_wait = true };
	int err = proto_client_open(&cli, argv[0], &o);
	if (err) {
		fprintf(stderr, "baton-proto-tool: dial %s: %s\n", argv[0], baton_strerror(err));
		free(buf);
		return 1;
	}
	int rc = 0;
	for (size_t off = 0; off + 4 <= len;) {
		const unsigned char *p = (const unsigned char *)buf + off;
		size_t n = (size_t)p[0] << 24 | (size_t)p[1] << 16 | (size_t)p[2] << 8 | p[3];
		if (n > len - off - 4) {
			fprintf(stderr, "baton-proto-tool: calls: a frame runs past the input\n");
			rc = 2;
			break;
		}
		struct baton_msg req, rep;
		struct proto_diag d;
		err = proto_decode(p + 4, n, &req, &d);
		off += 4 + n;
		if (err) {
			json_error(stdout, err, &d);
			rc = 2;
			break;
		}
		err = proto_client_call(cli, &req, &rep, timeout, &d);
		proto_msg_free(&req);
		if (rep.reply)
			json_msg(stdout, &rep);
		else
			json_error(stdout, err, &d);
		if (!rep.reply || !rep.ok)
			rc = rep.reply ? 1 : 2;
		proto_msg_free(&rep);
		fflush(stdout);
	}
	proto_client_close(cli);
	free(buf);
	return rc;
}

static int cmd_dial(int argc, char **argv)
{
	struct proto_client *cli;
	struct proto_opts o = { .dial_wait = true };
	if (argc < 1)
		usage();
	int err = proto_client_open(&cli, argv[0], &o);
	if (err) {
		fprintf(stderr, "baton-proto-tool: dial %s: %s\n", argv[0], baton_strerror(err));
		return 1;
	}
	printf("connected %s\n", argv[0]);
	fflush(stdout);
	/* until killed, or stdin closes */
	char c;
	while (read(0, &c, 1) > 0)
		;
	proto_client_close(cli);
	return 0;
}

static int cmd_sub(int argc, char **argv)
{
	struct proto_sub *sub;
	if (argc < 1)
		usage();
	long count = opt_long(argc, argv, "--count", -1);
	int timeout = (int)opt_long(argc, argv, "--timeout", -1);
	int err = proto_sub_open(&sub, argv[0], NULL);
	if (err) {
		fprintf(stderr, "baton-proto-tool: dial %s: %s\n", argv[0], baton_strerror(err));
		return 1;
	}
	int rc = 0;
	for (long n = 0; count < 0 || n < count; n++) {
		struct baton_msg ev;
		struct proto_diag d;
		err = proto_sub_recv(sub, &ev, timeout, &d);
		if (err == BATON_ETIMEDOUT || err == BATON_ECLOSED) {
			rc = 3;
			break;
		}
		if (err) {
			json_error(stdout, err, &d);
		} else {
			json_msg(stdout, &ev);
			proto_msg_free(&ev);
		}
		fflush(stdout);
	}
	proto_sub_close(sub);
	return rc;
}

static int run(int argc, char **argv)
{
	const char *cmd = argv[1];
	argc -= 2;
	argv += 2;
	if (strcmp(cmd, "schema") == 0)
		return cmd_schema();
	if (strcmp(cmd, "sample") == 0)
		return cmd_sample(argc, argv);
	if (strcmp(cmd, "encode") == 0)
		return cmd_encode(argc, argv);
	if (strcmp(cmd, "decode") == 0)
		return cmd_decode();
	if (strcmp(cmd, "serve") == 0)
		return cmd_serve(argc, argv);
	if (strcmp(cmd, "call") == 0)
		return cmd_call(argc, argv);
	if (strcmp(cmd, "calls") == 0)
		return cmd_calls(argc, argv);
	if (strcmp(cmd, "dial") == 0)
		return cmd_dial(argc, argv);
	if (strcmp(cmd, "sub") == 0)
		return cmd_sub(argc, argv);
	usage();
	return 64;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	if (strcmp(argv[1], "--help") == 0) {
		fputs(usage_text, stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("baton-proto-tool %s\n", BATON_VERSION);
		return 0;
	}
	if (argv[1][0] == '-') { /* as every program: an unknown flag is 2 */
		fprintf(stderr, "baton-proto-tool: unknown option '%s'\n", argv[1]);
		fputs(usage_text, stderr);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	int rc = run(argc, argv);
	fflush(NULL);
	/* nng's atexit handler would hang after a close it could not finish */
	if (proto_nng_wedged())
		_exit(rc);
	return rc;
}
