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
	c->access_log = true;
	c->acquire_wait_ms = 5000;
	c->command_timeout_ms = 30000;
	c->nvml = true;
	snprintf(c->http, sizeof c->http, "%s", BROKER_DEFAULT_HTTP);
	snprintf(c->arena_dir, sizeof c->arena_dir, "/dev/shm/baton");
	c->restart_max = 5;
	c->restart_window_s = 60;
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
	char dir[BROKER_PATH_MAX]; /* the file's folder: relative sources start there */
	/* the section being read */
	char section[256];
	int kind; /* 0 none, 1 broker, 2 gpu, 3 engine, 4 model, 5 external */
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
	if (section_arg(section, "model", arg, sizeof arg) == 0) {
		if (!proto_name_valid(arg, strlen(arg)))
			return fail(p, "[%s]: a model name is letters, digits, '-', '_' or '.'", section);
		for (size_t i = 0; i < c->n_models; i++)
			if (strcmp(c->models[i].name, arg) == 0)
				return fail(p, "[%s] appears twice (first on line %d)", section, c->models[i].line);
		if (c->n_models == BROKER_MAX_MODELS)
			return fail(p, "more than %d [model] sections", BROKER_MAX_MODELS);
		struct broker_model_conf *m = &c->models[c->n_models];
		memset(m, 0, sizeof *m);
		snprintf(m->name, sizeof m->name, "%s", arg);
		snprintf(m->backend, sizeof m->backend, "auto");
		m->line = p->lineno;
		p->kind = 4;
		p->idx = c->n_models++;
		return 1;
	}
	if (section_arg(section, "external", arg, sizeof arg) == 0) {
		if (!proto_name_valid(arg, strlen(arg)))
			return fail(p, "[%s]: an external engine's name is letters, digits, '-', '_' or '.'", section);
		for (size_t i = 0; i < c->n_externals; i++)
			if (strcmp(c->externals[i].name, arg) == 0)
				return fail(p, "[%s] appears twice (first on line %d)", section, c->externals[i].line);
		if (c->n_externals == BROKER_MAX_EXTERNALS)
			return fail(p, "more than %d [external] sections", BROKER_MAX_EXTERNALS);
		broker_external_init(&c->externals[c->n_externals], arg);
		c->externals[c->n_externals].line = p->lineno;
		p->kind = 5;
		p->idx = c->n_externals++;
		return 1;
	}
	p->kind = 0;
	return fail(p, "unknown section [%s] (known: [broker], [gpu \"UUID\"], [engine \"NAME\"], "
	    "[model \"NAME\"], [external \"NAME\"])", section);
}

/* A comma-separated list of names (aliases); 0 when every one is valid. */
static int valid_names(const char *v)
{
	char buf[256];
	if (strlen(v) >= sizeof buf)
		return -1;
	snprintf(buf, sizeof buf, "%s", v);
	char *save = NULL;
	int n = 0;
	for (char *t = strtok_r(buf, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save), n++)
		if (!proto_name_valid(t, strlen(t)))
			return -1;
	return n > 0 ? 0 : -1;
}

static int model_key(struct parse *p, struct broker_model_conf *m, const char *section, const char *key,
    const char *value)
{
	uint64_t u;
	if (strcmp(key, "source") == 0) {
		if (!*value || strlen(value) >= sizeof m->source)
			return fail(p, "source: want a Hugging Face folder, a .gguf file, an .arena or hf:ORG/NAME");
		snprintf(m->source, sizeof m->source, "%s", value);
		char msg[800];
		if (broker_model_source(m, p->dir, msg, sizeof msg))
			return fail(p, "[%s] source = '%s': %s", section, value, msg);
	} else if (strcmp(key, "aliases") == 0) {
		if (valid_names(value))
			return fail(p, "aliases = '%s': want names (letters, digits, '-', '_', '.') separated by commas",
			    value);
		snprintf(m->aliases, sizeof m->aliases, "%s", value);
	} else if (strcmp(key, "backend") == 0) {
		if (strcmp(value, "host") && strcmp(value, "cuda") && strcmp(value, "auto"))
			return fail(p, "backend = '%s': want host, cuda or auto", value);
		snprintf(m->backend, sizeof m->backend, "%s", value);
	} else if (strcmp(key, "device") == 0) {
		if (parse_u64(value, 255, &u))
			return fail(p, "device = '%s': want a device index from 0 to 255", value);
		m->device = (int)u;
	} else if (strcmp(key, "dtype") == 0) {
		static const char *types[] = { "f32", "f16", "bf16", "q8_0", "q4_K", "q5_K", "q6_K" };
		bool ok = false;
		for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
			ok |= strcmp(value, types[i]) == 0;
		if (!ok)
			return fail(p, "dtype = '%s': want f32, f16, bf16, q8_0, q4_K, q5_K or q6_K", value);
		snprintf(m->dtype, sizeof m->dtype, "%s", value);
	} else if (strcmp(key, "ctx") == 0) {
		if (parse_u64(value, 1u << 20, &u) || u < 16)
			return fail(p, "ctx = '%s': want positions from 16 to 1048576", value);
		m->ctx = (uint32_t)u;
	} else if (strcmp(key, "kv_blocks") == 0) {
		if (parse_u64(value, 1u << 24, &u) || u < 1)
			return fail(p, "kv_blocks = '%s': want blocks from 1 to 16777216", value);
		m->kv_blocks = (uint32_t)u;
	} else if (strcmp(key, "prefix_cache") == 0) {
		bool on;
		if (parse_bool(value, &on))
			return fail(p, "prefix_cache = '%s': want true or false", value);
		m->no_prefix_cache = !on;
	} else if (strcmp(key, "kv_host_mib") == 0) {
		if (parse_u64(value, 16u << 20, &u))
			return fail(p, "kv_host_mib = '%s': want MiB from 0 to 16777216", value);
		m->kv_host_mib = u;
		m->has_kv_host = true;
	} else if (strcmp(key, "max_seqs") == 0) {
		if (parse_u64(value, 1024, &u) || u < 1)
			return fail(p, "max_seqs = '%s': want sequences from 1 to 1024", value);
		m->max_seqs = (uint32_t)u;
	} else if (strcmp(key, "keep_alive_s") == 0) {
		if (parse_keep_alive(value, &m->keep_alive_s))
			return fail(p, "keep_alive_s = '%s': want seconds >= 0, or forever", value);
		m->has_keep_alive = true;
	} else if (strcmp(key, "stop_after_s") == 0) {
		if (parse_secs(value, &m->stop_after_s))
			return fail(p, "stop_after_s = '%s': want seconds >= 0 (0: never)", value);
	} else if (strcmp(key, "priority") == 0) {
		if (parse_i32(value, &m->priority))
			return fail(p, "priority = '%s': want a whole number (higher is kept longer)", value);
		m->has_priority = true;
	} else if (strcmp(key, "pinned") == 0 || strcmp(key, "preload") == 0 || strcmp(key, "drop_arena") == 0) {
		if (parse_bool(value, key[1] == 'i' ? &m->pinned : key[0] == 'p' ? &m->preload : &m->drop_arena))
			return fail(p, "%s = '%s': want true or false", key, value);
	} else if (strcmp(key, "arena") == 0) {
		if (value[0] != '/' || strlen(value) >= sizeof m->arena)
			return fail(p, "arena = '%s': want an absolute path", value);
		snprintf(m->arena, sizeof m->arena, "%s", value);
	} else if (strcmp(key, "engine_flags") == 0) {
		if (strlen(value) >= sizeof m->flags)
			return fail(p, "engine_flags: longer than %zu bytes", sizeof m->flags - 1);
		static const char *own[] = { "--name", "--shared-expert-arena", "--listen", "--broker",
			"--served-model-name", "--http" };
		for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) {
			const char *f = strstr(value, own[i]);
			size_t l = strlen(own[i]);
			if (f && (f == value || f[-1] == ' ') && (f[l] == 0 || f[l] == ' ' || f[l] == '='))
				return fail(p, "engine_flags: %s is the broker's to set", own[i]);
		}
		snprintf(m->flags, sizeof m->flags, "%s", value);
	} else {
		return fail(p, "unknown key '%s' in [%s] (known: source, aliases, backend, device, dtype, ctx, "
		    "kv_blocks, prefix_cache, kv_host_mib, max_seqs, keep_alive_s, stop_after_s, drop_arena, priority, "
		    "pinned, preload, arena, "
		    "engine_flags)",
		    key, section);
	}
	return 1;
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
		} else if (strcmp(key, "access_log") == 0) {
			if (parse_bool(value, &c->access_log))
				return fail(p, "access_log = '%s': want true or false", value);
		} else if (strcmp(key, "door_queue_max") == 0) {
			if (parse_u64(value, 1000000, &u) || u < 1)
				return fail(p, "door_queue_max = '%s': want requests from 1 to 1000000", value);
			c->door_queue_max = (unsigned)u;
		} else if (strcmp(key, "engine") == 0 || strcmp(key, "arena_tool") == 0 ||
		    strcmp(key, "arena_dir") == 0 || strcmp(key, "run_dir") == 0) {
			char *dst = key[0] == 'e' ? c->engine_path : key[0] == 'r' ? c->run_dir :
			    key[6] == 't' ? c->arena_tool : c->arena_dir;
			if (value[0] != '/' || strlen(value) >= BROKER_PATH_MAX - 160)
				return fail(p, "%s = '%s': want an absolute path (at most %d bytes)", key, value,
				    BROKER_PATH_MAX - 161);
			snprintf(dst, BROKER_PATH_MAX, "%s", value);
		} else if (strcmp(key, "restart_max") == 0) {
			if (parse_u64(value, 1000, &u) || u < 1)
				return fail(p, "restart_max = '%s': want crashes from 1 to 1000", value);
			c->restart_max = (unsigned)u;
		} else if (strcmp(key, "restart_window_s") == 0) {
			if (parse_secs(value, &c->restart_window_s) || c->restart_window_s <= 0)
				return fail(p, "restart_window_s = '%s': want seconds > 0", value);
		} else if (strcmp(key, "http_token_file") == 0) {
			char msg[600];
			if (broker_config_token_file(c, value, msg, sizeof msg))
				return fail(p, "http_token_file: %s", msg);
		} else {
			return fail(p, "unknown key '%s' in [broker] (known: control, events, "
			    "heartbeat_timeout_ms, idle_release_s, acquire_wait_ms, command_timeout_ms, nvml, "
			    "http, http_hosts, cors_origins, http_token, http_token_file, state_file, door_quantum_s, "
			    "door_keep_alive_s, door_queue_max, access_log, engine, arena_tool, arena_dir, run_dir, restart_max, "
			    "restart_window_s)", key);
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
	if (p->kind == 4)
		return model_key(p, &c->models[p->idx], section, key, value);
	if (p->kind == 5) { /* external.c's keys */
		char msg[300];
		if (broker_external_set(&c->externals[p->idx], key, value, msg, sizeof msg))
			return fail(p, "[%s]: %s", section, msg);
		return 1;
	}
	return 0; /* an unknown section, already reported */
}

/* After the whole file: each [model] has a source; its names are unique;
 * it becomes the [engine] of its name (priority, pinned, keep-alive). */
static int models_check(struct parse *p)
{
	struct broker_config *c = p->c;
	for (size_t i = 0; i < c->n_models; i++) {
		struct broker_model_conf *m = &c->models[i];
		p->lineno = m->line;
		if (!m->source[0])
			return fail(p, "[model \"%s\"] has no source (a Hugging Face folder, a .gguf file, an "
			    ".arena or hf:ORG/NAME)", m->name);
		const struct broker_engine_conf *e = broker_config_engine(c, m->name);
		if (e)
			return fail(p, "[model \"%s\"] and [engine \"%s\"] (line %d): a model is the engine of its "
			    "name; set priority, pinned and keep_alive_s in [model]", m->name, m->name, e->line);
		/* every name and alias once */
		char names[300];
		snprintf(names, sizeof names, "%s,%s", m->name, m->aliases);
		char *save = NULL;
		for (char *t = strtok_r(names, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save))
			for (size_t j = 0; j < c->n_models; j++) {
				const struct broker_model_conf *o = &c->models[j];
				char other[300];
				snprintf(other, sizeof other, "%s,%s", o->name, o->aliases);
				char *s2 = NULL;
				int count = 0;
				for (char *u = strtok_r(other, ", \t", &s2); u; u = strtok_r(NULL, ", \t", &s2))
					count += strcmp(u, t) == 0;
				if ((j != i && count > 0) || (j == i && count > 1))
					return fail(p, "[model \"%s\"]: the name '%s' is also [model \"%s\"] (line %d)'s",
					    m->name, t, o->name, o->line);
			}
	}
	for (size_t i = 0; i < c->n_models; i++) {
		struct broker_model_conf *m = &c->models[i];
		if (c->n_engines == BROKER_MAX_ENGINES) {
			p->lineno = m->line;
			return fail(p, "more than %d [engine] and [model] sections", BROKER_MAX_ENGINES);
		}
		struct broker_engine_conf *e = &c->engines[c->n_engines++];
		memset(e, 0, sizeof *e);
		snprintf(e->name, sizeof e->name, "%s", m->name);
		e->priority = m->priority;
		e->has_priority = m->has_priority;
		e->pinned = m->pinned;
		e->idle_release_s = -1;
		e->keep_alive_s = m->keep_alive_s;
		e->has_keep_alive = m->has_keep_alive;
		e->line = m->line;
	}
	return 1;
}

static int finish(struct parse *p, int rc)
{
	if (rc == 0 && !p->failed && !models_check(p))
		return BATON_ECONFIG;
	if (rc == 0 && !p->failed) {
		if (strcmp(p->c->control, p->c->events) == 0) {
			snprintf(p->err, p->errlen, "%s: control and events must be different sockets (%s)",
			    p->name, p->c->control);
			return BATON_ECONFIG;
		}
		for (size_t i = 0; i < p->c->n_externals; i++) {
			char msg[300];
			if (broker_external_check(&p->c->externals[i], msg, sizeof msg)) {
				snprintf(p->err, p->errlen, "%s:%d: [external \"%s\"]: %s", p->name, p->c->externals[i].line,
				    p->c->externals[i].name, msg);
				return BATON_ECONFIG;
			}
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
	snprintf(p.dir, sizeof p.dir, "%s", path);
	char *slash = strrchr(p.dir, '/');
	if (slash)
		slash[slash == p.dir ? 1 : 0] = 0;
	else
		snprintf(p.dir, sizeof p.dir, ".");
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

const struct broker_model_conf *broker_config_model(const struct broker_config *c, const char *name)
{
	for (size_t i = 0; i < c->n_models; i++)
		if (strcmp(c->models[i].name, name) == 0)
			return &c->models[i];
	for (size_t i = 0; i < c->n_models; i++) {
		char buf[256];
		snprintf(buf, sizeof buf, "%s", c->models[i].aliases);
		char *save = NULL;
		for (char *t = strtok_r(buf, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save))
			if (strcmp(t, name) == 0)
				return &c->models[i];
	}
	return NULL;
}

bool broker_model_conf_same(const struct broker_model_conf *a, const struct broker_model_conf *b)
{
	struct broker_model_conf x = *a, y = *b;
	x.line = y.line = 0;
	x.aliases[0] = y.aliases[0] = 0;
	x.keep_alive_s = y.keep_alive_s = 0; /* the core's, reloaded without a restart */
	x.has_keep_alive = y.has_keep_alive = false;
	x.priority = y.priority = 0;
	x.has_priority = y.has_priority = x.pinned = y.pinned = false;
	x.stop_after_s = y.stop_after_s = 0;
	x.preload = y.preload = false;
	x.drop_arena = y.drop_arena = false;
	return strcmp(x.name, y.name) == 0 && strcmp(x.source, y.source) == 0 && strcmp(x.path, y.path) == 0 &&
	    x.kind == y.kind && strcmp(x.backend, y.backend) == 0 && x.device == y.device &&
	    strcmp(x.dtype, y.dtype) == 0 && x.ctx == y.ctx && x.kv_blocks == y.kv_blocks &&
	    x.max_seqs == y.max_seqs && x.no_prefix_cache == y.no_prefix_cache && x.has_kv_host == y.has_kv_host &&
	    x.kv_host_mib == y.kv_host_mib && strcmp(x.arena, y.arena) == 0 && strcmp(x.flags, y.flags) == 0;
}
