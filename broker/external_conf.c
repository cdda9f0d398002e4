/*
 * external_conf.c: the keys of an external engine ([external "NAME"] in
 * the configuration, the JSON body of `baton external add` and of
 * POST /v1/externals): one setter for both, pure, so config_test.c checks
 * it from a table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker/broker.h"

void broker_external_init(struct broker_external_conf *x, const char *name)
{
	memset(x, 0, sizeof *x);
	snprintf(x->name, sizeof x->name, "%s", name);
	x->hook_timeout_s = 30;
	x->mode = BROKER_EXT_NONE;
}

static int bad(char *err, size_t len, const char *fmt, const char *key, const char *value)
{
	snprintf(err, len, fmt, key, value);
	return BATON_EINVAL;
}

static bool printable(const char *v)
{
	for (const unsigned char *p = (const unsigned char *)v; *p; p++)
		if (*p < ' ' || *p == 127)
			return false;
	return true;
}

int broker_external_set(struct broker_external_conf *x, const char *key, const char *value, char *err,
    size_t len)
{
	uint64_t u;
	int64_t i;
	if (strcmp(key, "pid") == 0) {
		if (baton_parse_u64(value, 0, 4194304, &u) || u < 1)
			return bad(err, len, "%s = '%.64s': want a process id", key, value);
		x->pid = (int)u;
	} else if (strcmp(key, "pid_file") == 0 || strcmp(key, "unit") == 0 || strcmp(key, "gpu") == 0 ||
	    strcmp(key, "model") == 0) {
		char *dst = key[0] == 'p' ? x->pid_file : key[0] == 'u' ? x->unit : key[0] == 'g' ? x->gpu : x->model;
		size_t cap = key[0] == 'p' ? sizeof x->pid_file : BROKER_NAME_MAX;
		if (!*value || strlen(value) >= cap || !printable(value))
			return bad(err, len, "%s = '%.64s': want a non-empty name or path on one line", key, value);
		if (key[0] == 'p' && value[0] != '/')
			return bad(err, len, "%s = '%.64s': want an absolute path", key, value);
		if (key[0] == 'u' && (strchr(value, '/') || value[0] == '-'))
			return bad(err, len, "%s = '%.64s': want a systemd unit's name", key, value);
		snprintf(dst, cap, "%s", value);
	} else if (strcmp(key, "priority") == 0) {
		if (baton_parse_i64(value, INT32_MIN, INT32_MAX, &i))
			return bad(err, len, "%s = '%.64s': want a whole number (higher is kept longer)", key, value);
		x->priority = (int32_t)i;
	} else if (strcmp(key, "pinned") == 0) {
		if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
			x->pinned = true;
		else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
			x->pinned = false;
		else
			return bad(err, len, "%s = '%.64s': want true or false", key, value);
	} else if (strcmp(key, "url") == 0) {
		if (strncmp(value, "http://", 7) != 0 || !value[7] || strlen(value) >= sizeof x->url || !printable(value))
			return bad(err, len, "%s = '%.64s': want http://HOST:PORT (its OpenAI API)", key, value);
		snprintf(x->url, sizeof x->url, "%s", value);
		size_t l = strlen(x->url);
		while (l > 7 && x->url[l - 1] == '/')
			x->url[--l] = 0;
	} else if (strcmp(key, "mib") == 0) {
		if (baton_parse_u64(value, 0, PROTO_RESERVE_MIB_MAX, &u))
			return bad(err, len, "%s = '%.64s': want MiB (a whole number)", key, value);
		x->mib = u;
	} else if (strcmp(key, "release") == 0 || strcmp(key, "refill") == 0) {
		char *dst = key[2] == 'l' ? x->release : x->refill;
		if (strlen(value) >= BROKER_HOOK_MAX || !printable(value))
			return bad(err, len, "%s = '%.64s': want a command, an http:// URL or park, on one line", key, value);
		if (strncmp(value, "https://", 8) == 0)
			return bad(err, len, "%s = '%.64s': only plain http:// is spoken (a local server)", key, value);
		if (strcmp(value, "park") == 0 || strcmp(value, "resume") == 0) {
			if ((key[2] == 'l') != (value[0] == 'p'))
				return bad(err, len, "%s = '%.64s': park is a release, resume its refill", key, value);
			x->mode = BROKER_EXT_PARK;
		} else if (key[2] == 'l') {
			x->mode = *value ? BROKER_EXT_HOOK : BROKER_EXT_NONE;
		}
		snprintf(dst, BROKER_HOOK_MAX, "%s", value);
	} else if (strcmp(key, "hook_timeout_s") == 0) {
		char *end;
		double d = strtod(value, &end);
		if (end == value || *end || !(d > 0 && d <= 3600))
			return bad(err, len, "%s = '%.64s': want seconds, more than 0, at most 3600", key, value);
		x->hook_timeout_s = d;
	} else {
		snprintf(err, len, "unknown key '%.64s' (known: pid, pid_file, unit, gpu, priority, pinned, url, model, "
		    "mib, release, refill, hook_timeout_s)", key);
		return BATON_EINVAL;
	}
	return 0;
}

int broker_external_check(const struct broker_external_conf *x, char *err, size_t len)
{
	int n = (x->pid > 0) + (x->pid_file[0] != 0) + (x->unit[0] != 0);
	if (n != 1) {
		snprintf(err, len, "name its process by one of pid, pid_file or unit (%s)", n ? "several given" : "none given");
		return BATON_EINVAL;
	}
	if (x->mode == BROKER_EXT_HOOK && !x->refill[0]) {
		snprintf(err, len, "a release hook wants a refill hook too (or it never comes back)");
		return BATON_EINVAL;
	}
	if (x->mode == BROKER_EXT_PARK && x->refill[0] && strcmp(x->refill, "resume") != 0) {
		snprintf(err, len, "release = park comes back by resume: leave refill out (or refill = resume)");
		return BATON_EINVAL;
	}
	if (x->mode != BROKER_EXT_PARK && strcmp(x->refill, "resume") == 0) {
		snprintf(err, len, "refill = resume wants release = park");
		return BATON_EINVAL;
	}
	if (x->mode == BROKER_EXT_NONE && x->refill[0]) {
		snprintf(err, len, "a refill hook without a release hook");
		return BATON_EINVAL;
	}
	if (x->model[0] && !x->url[0]) {
		snprintf(err, len, "model = %s wants url (where it serves it)", x->model);
		return BATON_EINVAL;
	}
	if (x->model[0] && !proto_name_valid(x->model, strlen(x->model)) && strlen(x->model) > 127) {
		snprintf(err, len, "model name too long");
		return BATON_EINVAL;
	}
	return 0;
}
