/*
 * config.c: the broker's INI file (see broker.h), read with libinih.
 *
 * inih calls the handler once per key; a handler returning 0 makes the
 * parse return the line number of the first error. Debian's inih is built
 * without INI_HANDLER_LINENO, so the handler does not get its line: the
 * file is fed through our own reader, which counts lines (a line longer
 * than inih's buffer comes in several pieces and counts once). inih keeps
 * going after an error; the first message is kept, and an inih syntax
 * error on an earlier line wins over a handler's message. Section headers
 * alone reach the handler only with their first key, so "[bogus]" with no
 * keys is not reported; every key below it is.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/stat.h>

#include <ini.h>

#include "broker/broker.h"
#include "http/http.h"


void broker_config_defaults(struct broker_config *c)
{
	memset(c, 0, sizeof *c);
	snprintf(c->control, sizeof c->control, "%s", BROKER_DEFAULT_CONTROL);
	snprintf(c->events, sizeof c->events, "%s", BROKER_DEFAULT_EVENTS);
	c->heartbeat_timeout_ms = 2000;
	c->idle_release_s = 0;
	c->door_quantum_s = 5;
	c->door_keep_alive_s = 300;
	c->door_queue_max = 64;
	c->acquire_wait_ms = 5000;
	c->command_timeout_ms = 30000;
	c->nvml = true;
	snprintf(c->http, sizeof c->http, "%s", BROKER_DEFAULT_HTTP);
}

int broker_config_set_http(struct broker_config *c, const char *v, char *err, size_t errlen)
{
	if (strncmp(v, "http://", 7) == 0)
		v += 7;
	c->http_set = true;
	if (!*v || strcmp(v, "off") == 0) {
		c->http[0] = 0;
		return 0;
	}
	const char *colon = strrchr(v, ':');
	uint64_t port = 0;
	bool ok = colon && colon > v && strlen(v) < BROKER_URL_MAX - 8 && colon[1];
	for (const char *q = colon ? colon + 1 : v; ok && *q; q++) {
		ok = *q >= '0' && *q <= '9' && port <= 65535;
		port = port * 10 + (uint64_t)(*q - '0');
	}
	for (const char *q = v; ok && q < colon; q++)
		ok = *q > ' ' && *q < 127 && *q != '/' && *q != '?' && *q != '#' && *q != '@';
	if (!ok || port > 65535) {
		snprintf(err, errlen, "http = '%s': want HOST:PORT (port 0: any free one), or off", v);
		return BATON_EINVAL;
	}
	snprintf(c->http, sizeof c->http, "%s", v);
	return 0;
}

/* One reader for every token file, the broker's and the engine's
 * (http/token.c): O_NOFOLLOW, a regular file others cannot read, one
 * line of visible ASCII. */
int broker_config_token_file(struct broker_config *c, const char *path, char *err, size_t errlen)
{
	return http_token_read(path, c->http_token, sizeof c->http_token, err, errlen);
}

struct parse {
	struct broker_config *c;
	const char *name;
	char *err;
	size_t errlen;
	int failed;
	int lineno;        /* the line the reader gave last */
	int fail_line;     /* the line of the first handler error */
	int at_start;      /* the next piece starts a line */
	/* the text being read */
	FILE *f;
	const char *text;
	/* inih counts a line per reader call; a long line takes several: the
	 * real line of each call, and which lines were too long */
	int *call_line;
	size_t calls, cap;
	int long_line;
	/* the section being read */
	char section[256];
	int kind; /* 0 none, 1 broker, 2 gpu, 3 engine */
	size_t idx;
};

static int fail(struct parse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct parse *p, const char *fmt, ...)
{
	if (!p->failed) {
		char what[512];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(what, sizeof what, fmt, ap);
		va_end(ap);
		if (p->err && p->errlen)
			snprintf(p->err, p->errlen, "%s:%d: %s", p->name, p->lineno, what);
		p->failed = 1;
		p->fail_line = p->lineno;
	}
	return 0;
}

static int parse_u64(const char *v, uint64_t max, uint64_t *out)
{
	return baton_parse_u64(v, 0, max, out) ? -1 : 0;
}

static int parse_i32(const char *v, int32_t *out)
{
	int64_t x;
	if (baton_parse_i64(v, INT32_MIN, INT32_MAX, &x))
		return -1;
	*out = (int32_t)x;
	return 0;
}

static int parse_secs(const char *v, double *out)
{
	char *end;
	if (!*v)
		return -1;
	errno = 0;
	double x = strtod(v, &end);
	if (errno || *end || !isfinite(x) || x < 0 || x > 1e7)
		return -1;
	*out = x;
	return 0;
}

/* A keep-alive: seconds, or "forever" (-1). */
static int parse_keep_alive(const char *v, double *out)
{
	if (strcmp(v, "forever") == 0) {
		*out = -1;
		return 0;
	}
	return parse_secs(v, out);
}

static int parse_bool(const char *v, bool *out)
{
	static const char *yes[] = { "true", "yes", "on", "1" }, *no[] = { "false", "no", "off", "0" };
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -1;
}

static int valid_url(const char *v)
{
	return (strncmp(v, "ipc://", 6) == 0 && v[6]) || (strncmp(v, "tcp://", 6) == 0 && v[6]) ||
	    (strncmp(v, "inproc://", 9) == 0 && v[9]);
}

/* `gpu "X"`, `gpu X` -> X. Returns 0 on success. */
static int section_arg(const char *sec, const char *word, char *out, size_t len)
{
	size_t n = strlen(word);
	if (strncmp(sec, word, n) != 0 || (sec[n] != ' ' && sec[n] != '\t'))
		return -1;
	const char *a = sec + n;
	while (*a == ' ' || *a == '\t')
		a++;
	size_t l = strlen(a);
	while (l && (a[l - 1] == ' ' || a[l - 1] == '\t'))
		l--;
	if (l >= 2 && a[0] == '"' && a[l - 1] == '"') {
		a++;
		l -= 2;
	}
	if (l == 0 || l >= len || memchr(a, '"', l))
		return -1;
	memcpy(out, a, l);
	out[l] = 0;
	return 0;
}

/* A device section names a uuid (GPU-...), host-N, or "*": every device.
 * Device names follow the rule of engine names (proto_name_valid). */
static int valid_device(const char *s)
{
	return strcmp(s, "*") == 0 || proto_name_valid(s, strlen(s));
}

/* A new section: find its kind, reject duplicates. */
static int enter_section(struct parse *p, const char *section)
{
	struct broker_config *c = p->c;
	char arg[BROKER_NAME_MAX];
	snprintf(p->section, sizeof p->section, "%s", section);
	if (strcmp(section, "broker") == 0) {
		p->kind = 1;
		return 1;
	}
	if (section_arg(section, "gpu", arg, sizeof arg) == 0) {
		if (!valid_device(arg))
			return fail(p, "[%s]: a device is named by its uuid (GPU-...), host-N or \"*\"", section);
		for (size_t i = 0; i < c->n_gpus; i++)
			if (strcmp(c->gpus[i].uuid, arg) == 0)
				return fail(p, "[%s] appears twice (first on line %d)", section, c->gpus[i].line);
		if (c->n_gpus == BROKER_MAX_GPUS)
			return fail(p, "more than %d [gpu] sections", BROKER_MAX_GPUS);
		struct broker_gpu_conf *g = &c->gpus[c->n_gpus];
		memset(g, 0, sizeof *g);
		snprintf(g->uuid, sizeof g->uuid, "%s", arg);
		g->line = p->lineno;
		p->kind = 2;
		p->idx = c->n_gpus++;
		return 1;
	}
	if (section_arg(section, "engine", arg, sizeof arg) == 0) {
		if (!proto_name_valid(arg, strlen(arg)))
			return fail(p, "[%s]: an engine name is letters, digits, '-', '_' or '.'", section);
		for (size_t i = 0; i < c->n_engines; i++)
			if (strcmp(c->engines[i].name, arg) == 0)
				return fail(p, "[%s] appears twice (first on line %d)", section, c->engines[i].line);
		if (c->n_engines == BROKER_MAX_ENGINES)
			return fail(p, "more than %d [engine] sections", BROKER_MAX_ENGINES);
		struct broker_engine_conf *e = &c->engines[c->n_engines];
		memset(e, 0, sizeof *e);
		snprintf(e->name, sizeof e->name, "%s", arg);
		e->idle_release_s = -1;
		e->line = p->lineno;
		p->kind = 3;
		p->idx = c->n_engines++;
		return 1;
	}
	p->kind = 0;
	return fail(p, "unknown section [%s] (known: [broker], [gpu \"UUID\"], [engine \"NAME\"])", section);
}

static int handler(void *user, const char *section, const char *key, const char *value)
{
	struct parse *p = user;
	struct broker_config *c = p->c;
	if (p->failed)
		return 0;
	if (!*section)
		return fail(p, "'%s' is outside any section; put it under [broker]", key);
	if (strcmp(section, p->section) != 0 && !enter_section(p, section))
		return 0;
	uint64_t u;
	if (p->kind == 1) {
		if (strcmp(key, "control") == 0 || strcmp(key, "events") == 0) {
			char *dst = key[0] == 'c' ? c->control : c->events;
			if (!valid_url(value) || strlen(value) >= BROKER_URL_MAX)
				return fail(p, "%s = '%s': want ipc://PATH or tcp://HOST:PORT", key, value);
			snprintf(dst, BROKER_URL_MAX, "%s", value);
		} else if (strcmp(key, "heartbeat_timeout_ms") == 0) {
			if (parse_u64(value, 3600000, &u) || u < 100)
				return fail(p, "heartbeat_timeout_ms = '%s': want milliseconds from 100 to 3600000", value);
			c->heartbeat_timeout_ms = (int)u;
		} else if (strcmp(key, "acquire_wait_ms") == 0) {
			if (parse_u64(value, 3600000, &u))
				return fail(p, "acquire_wait_ms = '%s': want milliseconds from 0 to 3600000", value);
			c->acquire_wait_ms = (int)u;
		} else if (strcmp(key, "command_timeout_ms") == 0) {
			if (parse_u64(value, 3600000, &u) || u < 100)
				return fail(p, "command_timeout_ms = '%s': want milliseconds from 100 to 3600000", value);
			c->command_timeout_ms = (int)u;
		} else if (strcmp(key, "idle_release_s") == 0) {
			if (parse_secs(value, &c->idle_release_s))
				return fail(p, "idle_release_s = '%s': want seconds >= 0 (0: never)", value);
		} else if (strcmp(key, "nvml") == 0) {
			if (parse_bool(value, &c->nvml))
				return fail(p, "nvml = '%s': want true or false", value);
		} else if (strcmp(key, "http") == 0) {
			char msg[300];
			if (broker_config_set_http(c, value, msg, sizeof msg))
				return fail(p, "%s", msg);
		} else if (strcmp(key, "http_token") == 0) {
			bool ok = *value && strlen(value) < BROKER_TOKEN_MAX;
			for (const char *q = value; ok && *q; q++)
				ok = *q > ' ' && *q < 127;
			if (!ok)
				return fail(p, "http_token: want 1 to %d visible ASCII characters", BROKER_TOKEN_MAX - 1);
			snprintf(c->http_token, sizeof c->http_token, "%s", value);
		} else if (strcmp(key, "http_hosts") == 0) {
			if (strlen(value) >= sizeof c->http_hosts)
				return fail(p, "http_hosts: longer than %zu bytes", sizeof c->http_hosts - 1);
			bool ok = true;
			for (const char *q = value; ok && *q; q++)
				ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
				    strchr(".-:[], ", *q);
			if (!ok)
				return fail(p, "http_hosts = '%s': want host names or addresses, separated by commas",
				    value);
			snprintf(c->http_hosts, sizeof c->http_hosts, "%s", value);
		} else if (strcmp(key, "cors_origins") == 0) {
			if (strlen(value) >= sizeof c->cors_origins)
				return fail(p, "cors_origins: longer than %zu bytes", sizeof c->cors_origins - 1);
			bool ok = true;
			for (const char *q = value; ok && *q; q++)
				ok = (*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') ||
				    strchr(".-:/[], ", *q);
			if (!ok || (*value && !strstr(value, "://")))
				return fail(p, "cors_origins = '%s': want origins such as https://ui.example, separated by "
				    "commas", value);
			snprintf(c->cors_origins, sizeof c->cors_origins, "%s", value);
		} else if (strcmp(key, "state_file") == 0) {
			if (strlen(value) >= sizeof c->state_file)
				return fail(p, "state_file: the path is longer than %zu bytes", sizeof c->state_file - 1);
			if (*value && strcmp(value, "off") != 0 && value[0] != '/')
				return fail(p, "state_file = '%s': want an absolute path, or off", value);
			snprintf(c->state_file, sizeof c->state_file, "%s", strcmp(value, "off") == 0 ? "" : value);
			c->state_file_set = true;
		} else if (strcmp(key, "door_quantum_s") == 0) {
			if (parse_secs(value, &c->door_quantum_s))
				return fail(p, "door_quantum_s = '%s': want seconds >= 0", value);
		} else if (strcmp(key, "door_keep_alive_s") == 0) {
			if (parse_keep_alive(value, &c->door_keep_alive_s))
				return fail(p, "door_keep_alive_s = '%s': want seconds >= 0, or forever", value);
		} else if (strcmp(key, "door_queue_max") == 0) {
			if (parse_u64(value, 1000000, &u) || u < 1)
				return fail(p, "door_queue_max = '%s': want requests from 1 to 1000000", value);
			c->door_queue_max = (unsigned)u;
		} else if (strcmp(key, "http_token_file") == 0) {
			char msg[600];
			if (broker_config_token_file(c, value, msg, sizeof msg))
				return fail(p, "http_token_file: %s", msg);
		} else {
			return fail(p, "unknown key '%s' in [broker] (known: control, events, "
			    "heartbeat_timeout_ms, idle_release_s, acquire_wait_ms, command_timeout_ms, nvml, "
			    "http, http_hosts, cors_origins, http_token, http_token_file, state_file, door_quantum_s, "
			    "door_keep_alive_s, door_queue_max)", key);
		}
		return 1;
	}
	if (p->kind == 2) {
		struct broker_gpu_conf *g = &c->gpus[p->idx];
		if (strcmp(key, "reserve_mib") == 0 || strcmp(key, "total_mib") == 0) {
			if (parse_u64(value, UINT64_C(1) << 30, &u))
				return fail(p, "%s = '%s': want a whole number of MiB", key, value);
			if (key[0] == 'r')
				g->reserve_bytes = u * BATON_MIB;
			else
				g->total_bytes = u * BATON_MIB;
		} else if (strcmp(key, "lend") == 0) {
			bool lend;
			if (parse_bool(value, &lend))
				return fail(p, "lend = '%s': want true or false", value);
			g->no_lend = !lend;
		} else {
			return fail(p, "unknown key '%s' in [%s] (known: reserve_mib, total_mib, lend)", key, section);
		}
		if (g->total_bytes && g->reserve_bytes >= g->total_bytes)
			return fail(p, "reserve_mib must be less than total_mib in [%s]", section);
		return 1;
	}
	if (p->kind == 3) {
		struct broker_engine_conf *e = &c->engines[p->idx];
		if (strcmp(key, "priority") == 0) {
			if (parse_i32(value, &e->priority))
				return fail(p, "priority = '%s': want a whole number (higher is kept longer)", value);
			e->has_priority = true;
		} else if (strcmp(key, "pinned") == 0) {
			if (parse_bool(value, &e->pinned))
				return fail(p, "pinned = '%s': want true or false", value);
		} else if (strcmp(key, "idle_release_s") == 0) {
			if (parse_secs(value, &e->idle_release_s))
				return fail(p, "idle_release_s = '%s': want seconds >= 0 (0: never)", value);
		} else if (strcmp(key, "keep_alive_s") == 0) {
			if (parse_keep_alive(value, &e->keep_alive_s))
				return fail(p, "keep_alive_s = '%s': want seconds >= 0, or forever", value);
			e->has_keep_alive = true;
		} else {
			return fail(p, "unknown key '%s' in [%s] (known: priority, pinned, idle_release_s, keep_alive_s)",
			    key, section);
		}
		return 1;
	}
	return 0; /* an unknown section, already reported */
}

static int finish(struct parse *p, int rc)
{
	if (rc == 0 && !p->failed) {
		if (strcmp(p->c->control, p->c->events) == 0) {
			snprintf(p->err, p->errlen, "%s: control and events must be different sockets (%s)",
			    p->name, p->c->control);
			return BATON_ECONFIG;
		}
		return 0;
	}
	if (rc == -1) {
		snprintf(p->err, p->errlen, "%s: cannot open: %s", p->name, strerror(errno));
		return errno == ENOENT ? BATON_ENOTFOUND : BATON_EIO;
	}
	if (rc == -2) {
		snprintf(p->err, p->errlen, "%s: out of memory", p->name);
		return BATON_ENOMEM;
	}
	int line = rc >= 1 && (size_t)rc <= p->calls ? p->call_line[rc - 1] : rc;
	if (!p->failed || line < p->fail_line) {
		/* inih's own complaint: no '=' or ':', an unclosed '[', too long */
		p->failed = 0;
		p->lineno = line;
		if (line == p->long_line)
			fail(p, "line too long (at most %d bytes)", INI_MAX_LINE - 2);
		else
			fail(p, "syntax error: want [section], key = value, or a ; comment");
	}
	return BATON_ECONFIG;
}

/* fgets for inih, counting lines. */
static char *reader(char *str, int num, void *stream)
{
	struct parse *p = stream;
	char *r;
	if (p->f) {
		r = fgets(str, num, p->f);
	} else {
		if (!*p->text)
			return NULL;
		size_t n = 0;
		while (n + 1 < (size_t)num && p->text[n])
			if (p->text[n++] == '\n')
				break;
		memcpy(str, p->text, n);
		str[n] = 0;
		p->text += n;
		r = str;
	}
	if (!r)
		return NULL;
	if (p->at_start)
		p->lineno++;
	size_t l = strlen(r);
	p->at_start = l > 0 && r[l - 1] == '\n';
	if (!p->at_start && l + 1 >= (size_t)num && !p->long_line)
		p->long_line = p->lineno;
	if (p->calls == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		int *n = realloc(p->call_line, cap * sizeof *n);
		if (!n)
			return NULL; /* ends the parse; reported as the line it stopped at */
		p->call_line = n;
		p->cap = cap;
	}
	p->call_line[p->calls++] = p->lineno;
	return r;
}

int broker_config_load(struct broker_config *c, const char *path, char *err, size_t errlen)
{
	char dummy[8];
	struct parse p = { .c = c, .name = path, .err = err ? err : dummy, .errlen = err ? errlen : sizeof dummy };
	errno = 0;
	FILE *f = fopen(path, "r");
	if (!f)
		return finish(&p, -1);
	p.f = f;
	p.at_start = 1;
	int rc = ini_parse_stream(reader, &p, handler, &p);
	fclose(f);
	rc = finish(&p, rc);
	free(p.call_line);
	return rc;
}

int broker_config_parse(struct broker_config *c, const char *text, const char *name,
    char *err, size_t errlen)
{
	char dummy[8];
	struct parse p = { .c = c, .name = name, .err = err ? err : dummy, .errlen = err ? errlen : sizeof dummy };
	p.text = text;
	p.at_start = 1;
	int rc = finish(&p, ini_parse_stream(reader, &p, handler, &p));
	free(p.call_line);
	return rc;
}

const struct broker_gpu_conf *broker_config_gpu(const struct broker_config *c, const char *uuid)
{
	const struct broker_gpu_conf *any = NULL;
	for (size_t i = 0; i < c->n_gpus; i++) {
		if (strcmp(c->gpus[i].uuid, uuid) == 0)
			return &c->gpus[i];
		if (strcmp(c->gpus[i].uuid, "*") == 0)
			any = &c->gpus[i];
	}
	return any;
}

const struct broker_engine_conf *broker_config_engine(const struct broker_config *c, const char *name)
{
	for (size_t i = 0; i < c->n_engines; i++)
		if (strcmp(c->engines[i].name, name) == 0)
			return &c->engines[i];
	return NULL;
}
