/*
 * lend_http.c: the HTTP twins of `baton lease` and `baton external`
 * (docs/reference/http-api.md). POSTs, behind the token and the checks
 * http.c makes of every POST (Host, Content-Type: application/json):
 *
 *   POST /v1/leases                  {"mib": N, "ttl_s"?, "pid"?, "gpu"?, "priority"?, "name"?, "what"?}
 *   POST /v1/leases/NAME/renew       {"ttl_s"?}
 *   POST /v1/leases/NAME/release     {}
 *   POST /v1/externals               {"name": ..., the keys of [external] (docs/reference/external.md)}
 *   POST /v1/externals/NAME/remove | park | resume   {}
 *   POST /v1/externals/NAME/report   {"mib": N}
 *
 * Over HTTP there is no peer process to watch: a lease needs a ttl_s (and
 * renewals) or the pid of the process that uses the memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "broker/api/api_int.h"
#include "http/http.h"

int broker_http_lend_path(const char *path)
{
	return strcmp(path, "/v1/leases") == 0 || strncmp(path, "/v1/leases/", 11) == 0 ||
	    strcmp(path, "/v1/externals") == 0 || strncmp(path, "/v1/externals/", 14) == 0;
}

struct lend_ctx {
	int status, err;
	char *msg;
	size_t msglen;
	json_t *out;
	bool lease;
};

static void on_reply(void *arg, const struct baton_msg *rep)
{
	struct lend_ctx *c = arg;
	if (!rep->ok) {
		c->status = http_status_of(rep->err);
		c->err = rep->err;
		snprintf(c->msg, c->msglen, "%s", rep->msg ? rep->msg : baton_strerror(rep->err));
		return;
	}
	c->status = 200;
	if (c->lease)
		c->out = json_pack("{s:b, s:s, s:s, s:I, s:f, s:s}", "ok", 1, "name", rep->name ? rep->name : "", "gpu",
		    rep->gpu ? rep->gpu : "", "granted", (json_int_t)rep->granted, "ttl_s", rep->ms / 1e3, "gave_way",
		    rep->reason ? rep->reason : "");
	else
		c->out = json_pack("{s:b, s:s, s:s, s:I, s:f}", "ok", 1, "name", rep->name ? rep->name : "", "state",
		    rep->state ? rep->state : "", "resident", (json_int_t)rep->mapped, "ms", rep->ms);
}

static int fail(struct lend_ctx *c, int status, int err, const char *fmt, const char *a)
{
	c->status = status;
	c->err = err;
	snprintf(c->msg, c->msglen, fmt, a);
	return -1;
}

/* Only these keys (NULL ends); numbers as JSON numbers. */
static int only_keys(struct lend_ctx *c, json_t *j, const char *const *keys)
{
	const char *k;
	json_t *v;
	json_object_foreach(j, k, v) {
		bool known = false;
		for (size_t i = 0; keys[i]; i++)
			known = known || strcmp(keys[i], k) == 0;
		if (!known)
			return fail(c, 400, BATON_EEXTRA, "unexpected key '%.64s' in the body", k);
	}
	return 0;
}

static int num(struct lend_ctx *c, json_t *j, const char *key, double lo, double hi, double *out)
{
	json_t *v = json_object_get(j, key);
	if (!v)
		return 0;
	if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
		return fail(c, 400, BATON_ERANGE, "%s: want a number in range", key);
	*out = json_number_value(v);
	return 1;
}

static int str(struct lend_ctx *c, json_t *j, const char *key, const char **out)
{
	json_t *v = json_object_get(j, key);
	if (!v)
		return 0;
	if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
		return fail(c, 400, BATON_ETYPE, "%s: want a string", key);
	*out = json_string_value(v);
	return 1;
}

void broker_http_lend(struct broker *b, const char *path, const char *body, size_t len, int *status, int *err,
    char *msg, size_t msglen, json_t **out)
{
	struct lend_ctx c = { .msg = msg, .msglen = msglen };
	json_error_t je;
	json_t *j = len ? json_loadb(body, len, JSON_REJECT_DUPLICATES, &je) : json_object();
	struct baton_msg m;
	char name[BROKER_NAME_MAX] = "";
	const char *verb = NULL;
	bool lease = strncmp(path, "/v1/leases", 10) == 0;
	c.lease = lease;
	const char *rest = path + (lease ? 10 : 13);
	if (!json_is_object(j)) {
		fail(&c, 400, BATON_EMSG, "the body must be a JSON object%s", "");
		goto out;
	}
	if (*rest == '/') {
		const char *n = rest + 1, *slash = strchr(n, '/');
		if (!slash || !proto_name_valid(n, (size_t)(slash - n)) || (size_t)(slash - n) >= sizeof name) {
			fail(&c, 404, BATON_ENOTFOUND, "no such path (%s/NAME/VERB)", lease ? "/v1/leases" : "/v1/externals");
			goto out;
		}
		memcpy(name, n, (size_t)(slash - n));
		name[slash - n] = 0;
		verb = slash + 1;
	}
	if (lease) {
		proto_msg_init(&m, PROTO_OP_LEASE);
		double v;
		const char *s;
		if (!verb) {
			static const char *const keys[] = { "mib", "ttl_s", "pid", "gpu", "priority", "name", "what", NULL };
			if (only_keys(&c, j, keys))
				goto out;
			m.level = "acquire";
			int r = num(&c, j, "mib", 1, (double)PROTO_RESERVE_MIB_MAX, &v);
			if (r < 0)
				goto out;
			if (r == 0) {
				fail(&c, 400, BATON_EMISSING, "the body needs \"mib\"%s", "");
				goto out;
			}
			m.bytes = (uint64_t)v * BATON_MIB;
			proto_set(&m, PF_BYTES);
			if ((r = num(&c, j, "ttl_s", 0, 30 * 86400.0, &v)) < 0)
				goto out;
			if (r) {
				m.ms = v * 1e3;
				proto_set(&m, PF_MS);
			}
			if ((r = num(&c, j, "pid", 1, 4194304, &v)) < 0)
				goto out;
			if (r) {
				m.pid = (uint32_t)v;
				proto_set(&m, PF_PID);
			}
			if ((r = num(&c, j, "priority", INT32_MIN, INT32_MAX, &v)) < 0)
				goto out;
			if (r) {
				m.priority = (int32_t)v;
				proto_set(&m, PF_PRIORITY);
			}
			if ((r = str(&c, j, "gpu", &s)) < 0)
				goto out;
			if (r) {
				m.gpu = s;
				proto_set(&m, PF_GPU);
			}
			if ((r = str(&c, j, "name", &s)) < 0)
				goto out;
			if (r) {
				m.name = s;
				proto_set(&m, PF_NAME);
			}
			if ((r = str(&c, j, "what", &s)) < 0)
				goto out;
			m.reason = r ? s : "(over HTTP)";
			proto_set(&m, PF_REASON);
		} else if (strcmp(verb, "renew") == 0 || strcmp(verb, "release") == 0) {
			static const char *const keys[] = { "ttl_s", NULL };
			static const char *const none[] = { NULL };
			if (only_keys(&c, j, verb[2] == 'n' ? keys : none))
				goto out;
			m.level = verb[2] == 'n' ? "renew" : "release";
			m.name = name;
			proto_set(&m, PF_NAME);
			int r = num(&c, j, "ttl_s", 0, 30 * 86400.0, &v);
			if (r < 0)
				goto out;
			if (r) {
				m.ms = v * 1e3;
				proto_set(&m, PF_MS);
			}
		} else {
			fail(&c, 404, BATON_ENOTFOUND, "no such path (leases have renew and release)%s", "");
			goto out;
		}
	} else {
		proto_msg_init(&m, PROTO_OP_EXTERNAL);
		char *dump = NULL;
		if (!verb) {
			const char *s;
			if (str(&c, j, "name", &s) <= 0) {
				fail(&c, 400, BATON_EMISSING, "the body needs \"name\"%s", "");
				goto out;
			}
			snprintf(name, sizeof name, "%s", s);
			m.level = "add";
			dump = json_dumps(j, JSON_COMPACT);
			m.body = dump ? dump : "";
			proto_set(&m, PF_BODY);
		} else if (strcmp(verb, "remove") == 0 || strcmp(verb, "park") == 0 || strcmp(verb, "resume") == 0 ||
		    strcmp(verb, "report") == 0) {
			static const char *const keys[] = { "mib", NULL };
			static const char *const none[] = { NULL };
			bool report = strcmp(verb, "report") == 0;
			if (only_keys(&c, j, report ? keys : none))
				goto out;
			m.level = verb;
			if (report) {
				double v;
				int r = num(&c, j, "mib", 0, (double)PROTO_RESERVE_MIB_MAX, &v);
				if (r <= 0) {
					if (r == 0)
						fail(&c, 400, BATON_EMISSING, "the body needs \"mib\"%s", "");
					goto out;
				}
				m.mapped = (uint64_t)v * BATON_MIB;
				proto_set(&m, PF_MAPPED);
			}
		} else {
			fail(&c, 404, BATON_ENOTFOUND, "no such path (external engines have remove, park, resume, report)%s", "");
			goto out;
		}
		m.name = name;
		proto_set(&m, PF_NAME);
		broker_call(b, &m, on_reply, &c);
		free(dump);
		goto out;
	}
	broker_call(b, &m, on_reply, &c);
out:
	json_decref(j);
	*status = c.status;
	*err = c.err;
	*out = c.out;
}
