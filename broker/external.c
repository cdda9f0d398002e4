/*
 * external.c: external engines: programs that are not Baton engines (a
 * vLLM, SGLang or llama.cpp server, ComfyUI, a training job) put under
 * the broker from the configuration ([external "NAME"]) or at run time
 * (`baton external add`, POST /v1/externals). Each is an entry of the
 * registry (kind EK_EXTERNAL): its process found by pid, pid file or
 * systemd unit and watched; its memory counted as its own (NVML per
 * process where NVML knows the device, else its own report, else the
 * configured mib); released and refilled through its hooks or parked and
 * resumed through the CUDA driver (hooks.c, park.c), by the same policy
 * and queue as engines. With url and model, the front door routes to it
 * (and wakes it: a refill) like one of Baton's engines.
 *
 * Parked processes survive a broker restart: their names, pids and sizes
 * are kept in PARKED_FILE beside the state file, and a new broker that
 * finds the same process alive counts it parked again.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker_int.h"

struct eng *br_entry_new(struct broker *b, const char *name, int kind, size_t gi);
void br_refill_behind(struct broker *b, struct eng *x, const char *why);
int64_t br_proc_device_bytes(const char *uuid, int pid);

/* ---- finding its process --------------------------------------------------------- */

static int pid_from_file(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	long v = 0;
	int ok = fscanf(f, "%ld", &v);
	fclose(f);
	return ok == 1 && v > 1 && v < 4194304 ? (int)v : 0;
}

/* MainPID of a systemd unit (systemctl show): 0 when not running. */
static int pid_from_unit(const char *unit)
{
	char cmd[BROKER_NAME_MAX + 64];
	snprintf(cmd, sizeof cmd, "systemctl show -p MainPID --value -- '%s' 2>/dev/null", unit);
	FILE *p = popen(cmd, "re");
	if (!p)
		return 0;
	long v = 0;
	int ok = fscanf(p, "%ld", &v);
	pclose(p);
	return ok == 1 && v > 1 ? (int)v : 0;
}

struct ext_src {
	int pid;
	char pid_file[BROKER_URL_MAX], unit[BROKER_NAME_MAX];
};

static int resolve_pid(const struct eng *e)
{
	if (e->ext.pid_file[0])
		return pid_from_file(e->ext.pid_file);
	if (e->ext.unit[0])
		return pid_from_unit(e->ext.unit);
	return 0;
}

/* An external engine is given back whole or not at all: its floor is all
 * it wants (a partial grant would be a restore into too little memory). */
static void ext_whole(struct eng *e)
{
	e->floor = e->ceiling;
}

/* ---- parked processes across restarts ----------------------------------------------- */

static void parked_path(struct broker *b, char *out, size_t len)
{
	if (!b->cfg.state_file[0])
		out[0] = 0;
	else
		snprintf(out, len, "%s.parked", b->cfg.state_file);
}

static void parked_save(struct broker *b)
{
	char path[BROKER_URL_MAX + 16];
	parked_path(b, path, sizeof path);
	if (!path[0])
		return;
	json_t *all = json_object();
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st == ES_LIVE && e->kind == EK_EXTERNAL && strcmp(e->state, "parked") == 0)
			json_object_set_new(all, e->name, json_pack("{s:i, s:I, s:s}", "pid", e->pid,
			    "bytes", (json_int_t)e->ext.parked_bytes, "gpu", b->gpus[e->gpu].uuid));
	}
	json_t *j = json_pack("{s:i, s:o}", "version", 1, "parked", all);
	if (br_json_replace(path, j) != 0)
		br_blog("cannot write the parked processes to %s: %s", path, strerror(errno));
	json_decref(j);
}

/* A process this broker's predecessor parked: counted parked again when
 * the same pid lives. */
static void parked_recall(struct broker *b, struct eng *e)
{
	char path[BROKER_URL_MAX + 16];
	parked_path(b, path, sizeof path);
	if (!path[0])
		return;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		if (fd >= 0)
			close(fd);
		return;
	}
	json_error_t je;
	json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	close(fd);
	json_t *x = j ? json_object_get(json_object_get(j, "parked"), e->name) : NULL;
	json_int_t pid = json_integer_value(json_object_get(x, "pid"));
	json_int_t bytes = json_integer_value(json_object_get(x, "bytes"));
	if (x && pid == e->pid && e->pid > 0 && br_pid_alive(e->pid) && bytes >= 0) {
		snprintf(e->state, sizeof e->state, "parked");
		e->mapped = e->resident = 0;
		e->ext.parked_bytes = (uint64_t)bytes;
		if (e->ceiling < (uint64_t)bytes)
			e->ceiling = (uint64_t)bytes;
		ext_whole(e);
		e->ext.parked_at = baton_now_s();
		br_blog("external %s: process %d is still parked (from %s), %.1f MiB to restore", e->name, e->pid, path,
		    (double)bytes / BATON_MIB);
	}
	json_decref(j);
}

/* ---- entries ----------------------------------------------------------------------- */


static void ext_measure(struct broker *b, struct eng *e)
{
	int64_t seen = br_proc_device_bytes(b->gpus[e->gpu].uuid, e->pid);
	if (seen >= 0) {
		e->mapped = e->resident = (uint64_t)seen;
		snprintf(e->ext.mem_src, sizeof e->ext.mem_src, "%s", strncmp(b->gpus[e->gpu].uuid, "host-", 5) == 0 ?
		    "hostdev" : "nvml");
		if ((uint64_t)seen > e->ceiling && strcmp(e->state, "ready") == 0)
			e->ceiling = (uint64_t)seen;
		ext_whole(e);
	}
}

static int ext_add(struct broker *b, const struct broker_external_conf *c, bool from_config, char *err, size_t len)
{
	if (broker_external_check(c, err, len))
		return BATON_EINVAL;
	struct eng *old = br_eng_by_name(b, c->name);
	if (old && old->st == ES_LIVE) {
		snprintf(err, len, "'%s' is taken (a %s)", c->name, br_kind_name(old));
		return BATON_EEXIST;
	}
	char gerr[160], nv_uuid[BROKER_NAME_MAX];
	unsigned nv_count = 0;
	size_t gi;
	/* a device no engine has named yet: NVML's (at start, before any registers) */
	bool nv_only = b->cfg.nvml && b->n_gpus == 0 && !c->gpu[0] &&
	    broker_nvml_uuid(0, &nv_count, nv_uuid, sizeof nv_uuid) == 0 && nv_count == 1;
	if (nv_only) {
		gi = br_gpu_find_or_add(b, nv_uuid);
	} else if (!c->gpu[0] && b->n_gpus == 1) {
		gi = 0;
	} else if (!c->gpu[0]) {
		snprintf(err, len, "name its device (gpu = UUID, host-N or an index): the broker knows %zu", b->n_gpus);
		return BATON_EINVAL;
	} else {
		bool digits = true;
		for (const char *p = c->gpu; *p; p++)
			digits &= *p >= '0' && *p <= '9';
		gi = (size_t)-1;
		for (size_t i = 0; digits && i < b->n_gpus; i++)
			if (b->gpus[i].index == atoi(c->gpu))
				gi = i;
		if (digits && gi == (size_t)-1 && b->cfg.nvml &&
		    broker_nvml_uuid((unsigned)atoi(c->gpu), NULL, nv_uuid, sizeof nv_uuid) == 0)
			gi = br_gpu_find_or_add(b, nv_uuid);
		if (digits && gi == (size_t)-1) {
			snprintf(err, len, "no device with index %s is known", c->gpu);
			return BATON_EINVAL;
		}
		if (!digits)
			gi = br_gpu_find_or_add(b, c->gpu);
		if (gi == (size_t)-1) {
			snprintf(gerr, sizeof gerr, "too many devices");
			snprintf(err, len, "%s", gerr);
			return BATON_ENOMEM;
		}
	}
	if (old)
		old->st = ES_FREE;
	struct eng *e = br_entry_new(b, c->name, EK_EXTERNAL, gi);
	if (!e) {
		snprintf(err, len, "the broker holds %d entries already", BROKER_MAX_ENGINES);
		return BATON_ENOMEM;
	}
	snprintf(e->ext.pid_file, sizeof e->ext.pid_file, "%s", c->pid_file);
	snprintf(e->ext.unit, sizeof e->ext.unit, "%s", c->unit);
	e->pid = c->pid > 0 ? c->pid : resolve_pid(e);
	e->ext.mode = c->mode == BROKER_EXT_PARK ? EXT_MODE_PARK : c->mode == BROKER_EXT_HOOK ? EXT_MODE_HOOK :
	    EXT_MODE_NONE;
	struct hook *hk[2] = { &e->ext.release, &e->ext.refill };
	const char *spec[2] = { c->release, c->refill };
	for (int k = 0; k < 2; k++) {
		hk[k]->timeout_s = c->hook_timeout_s > 0 ? c->hook_timeout_s : 30;
		if (e->ext.mode != EXT_MODE_HOOK)
			continue;
		if (strncmp(spec[k], "http://", 7) == 0)
			snprintf(hk[k]->url, sizeof hk[k]->url, "%s", spec[k]);
		else
			snprintf(hk[k]->cmd, sizeof hk[k]->cmd, "%s", spec[k]);
	}
	e->no_release = e->ext.mode == EXT_MODE_NONE; /* it cannot give anything back */
	e->no_shrink = true;                          /* all or nothing */
	e->ext.pinned = c->pinned;
	e->reg_priority = c->priority;
	e->ext.declared = c->mib * BATON_MIB;
	e->ceiling = e->capacity = e->ext.declared;
	ext_whole(e);
	snprintf(e->http, sizeof e->http, "%s", c->url);
	snprintf(e->model, sizeof e->model, "%s", c->model[0] ? c->model : "(external)");
	snprintf(e->ctl, sizeof e->ctl, "external:%s", e->ext.mode == EXT_MODE_PARK ? "park" :
	    e->ext.mode == EXT_MODE_HOOK ? "hook" : "none");
	bool alive = e->pid > 0 && br_pid_alive(e->pid);
	snprintf(e->state, sizeof e->state, "%s", alive ? "ready" : "gone");
	e->mapped = e->resident = alive ? e->ext.declared : 0;
	snprintf(e->ext.mem_src, sizeof e->ext.mem_src, "declared");
	if (alive) {
		ext_measure(b, e);
		parked_recall(b, e);
		br_watch_add(b, e->pid, br_eref_of(b, e));
	} else {
		e->pid = 0;
	}
	br_blog("external %s%s: pid %d, %s, %s, holds %.1f MiB (%s), priority %d%s%s%s", e->name,
	    from_config ? " (configured)" : "", e->pid, b->gpus[gi].uuid, e->state, (double)e->mapped / BATON_MIB,
	    e->ext.mem_src, e->reg_priority, e->ext.pinned ? ", pinned" : "", e->http[0] ? ", serves at " : "", e->http);
	br_publish(b, "external", e, from_config ? "configured" : "added", -1, e->mapped);
	return 0;
}

void br_externals_from_config(struct broker *b)
{
	for (size_t i = 0; i < b->cfg.n_externals; i++) {
		char err[300];
		if (ext_add(b, &b->cfg.externals[i], true, err, sizeof err))
			br_blog("external %s: %s; not added", b->cfg.externals[i].name, err);
	}
}

void br_ext_gone(struct broker *b, struct eng *e, const char *why)
{
	if (e->kind != EK_EXTERNAL || e->st != ES_LIVE)
		return;
	struct eref ref = br_eref_of(b, e);
	uint64_t freed = e->mapped + e->grant;
	bool parked = strcmp(e->state, "parked") == 0;
	if (parked)
		br_blog("external %s (pid %d) died while parked: %s; the driver frees its %.1f MiB checkpoint in host memory",
		    e->name, e->pid, why, (double)e->ext.parked_bytes / BATON_MIB);
	else
		br_blog("external %s (pid %d) is gone: %s; %.1f MiB of %s counted free", e->name, e->pid, why,
		    (double)freed / BATON_MIB, b->gpus[e->gpu].uuid);
	snprintf(e->state, sizeof e->state, "gone");
	br_publish(b, "dead", e, parked ? "died while parked" : why, -1, freed);
	e->mapped = e->resident = e->grant = 0;
	e->in_flight = false;
	e->ext.parked_bytes = 0;
	br_watch_remove(b, ref);
	b->gpus[e->gpu].death_at = baton_now_s();
	e->pid = 0;
	e->last_seen = baton_now_s();
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (o->used && o->target.slot == ref.slot && o->target.gen == ref.gen)
			br_op_fail(b, o, BATON_ECLOSED, "external %s went away (%s)", e->name, why);
	}
	if (parked)
		parked_save(b);
	br_lend_wake(b, e->gpu);
}

/* Timers: its process (found again through its pid file or unit when
 * gone), its memory (NVML) while nothing is in flight. */
void br_ext_tick(struct broker *b, struct eng *e, double now);
void br_ext_tick(struct broker *b, struct eng *e, double now)
{
	if (e->pid > 0 && !br_pid_alive(e->pid)) {
		br_ext_gone(b, e, "its process exited");
		return;
	}
	if (e->pid <= 0) {
		if (now - e->last_seen < 2.0)
			return;
		e->last_seen = now;
		int pid = resolve_pid(e);
		if (pid > 0 && br_pid_alive(pid)) {
			e->pid = pid;
			snprintf(e->state, sizeof e->state, "ready");
			e->mapped = e->resident = e->ext.declared;
			snprintf(e->ext.mem_src, sizeof e->ext.mem_src, "declared");
			ext_measure(b, e);
			e->idle_since = now;
			br_watch_add(b, pid, br_eref_of(b, e));
			br_blog("external %s: found again, pid %d", e->name, pid);
			br_publish(b, "external", e, "found again", -1, e->mapped);
		}
		return;
	}
	if (!e->in_flight && now - e->last_seen >= 1.0) {
		/* in any state: a released server that woke by itself is counted
		 * (a parked process is listed nowhere: its figure stays) */
		e->last_seen = now;
		ext_measure(b, e);
	}
	/* given away for another, and the memory is free again (nobody waits for
	 * it on the device): it comes back, by the usual queue (a park resumes
	 * only once granted) */
	if (e->ext.come_back && !e->in_flight && !e->no_release && br_want_bytes(e) > 0) {
		for (size_t i = 0; i < MAX_OPS; i++)
			if (b->ops[i].used && b->ops[i].gpu == e->gpu)
				return;
		struct gpu_view v;
		br_gpu_view(b, e->gpu, &v);
		if (v.avail >= br_want_bytes(e)) {
			e->ext.come_back = false;
			br_refill_behind(b, e, "its memory is free again");
		}
	}
}

/* A hook's (or park's) result, before results.c applies it as an engine's
 * reply: what only an external engine has. */
void br_ext_result(struct broker *b, struct eng *e, const struct jobtag *tag, const struct item *it);
void br_ext_result(struct broker *b, struct eng *e, const struct jobtag *tag, const struct item *it)
{
	const struct baton_msg *r = &it->rep;
	bool was_parked = strcmp(e->state, "parked") == 0;
	const char *word = tag->cmd == PROTO_OP_RELEASE ? (r->state && strcmp(r->state, "parked") == 0 ? "park" :
	    "release") : was_parked ? "resume" : "refill";
	if (it->rc == 0) {
		if (r->level)
			snprintf(e->ext.mem_src, sizeof e->ext.mem_src, "%s", r->level);
		if (tag->cmd == PROTO_OP_RELEASE && r->state && strcmp(r->state, "parked") == 0) {
			e->ext.parked_bytes = e->mapped > e->ext.declared ? e->mapped : e->ext.declared;
			if (e->ext.parked_bytes > e->ceiling)
				e->ceiling = e->ext.parked_bytes;
			e->ext.parked_at = baton_now_s();
		}
		/* taken for another (a reclaim, not an operator's): back when there is room */
		if (tag->cmd == PROTO_OP_RELEASE)
			e->ext.come_back = tag->victim != 0;
		else
			e->ext.come_back = false;
		if (tag->cmd == PROTO_OP_RELEASE && e->mapped > e->ceiling)
			e->ceiling = e->mapped; /* what it held is what it wants back */
		ext_whole(e);
		snprintf(e->ext.last, sizeof e->ext.last, "%s: done in %.1f ms (%s)", word, it->ms, r->level ? r->level : "");
		e->idle_since = baton_now_s();
	} else {
		snprintf(e->ext.last, sizeof e->ext.last, "%s failed: %.200s", word, it->err);
		br_publish(b, "hook-failed", e, it->err, it->ms, e->mapped);
	}
	if (it->rc == 0 && (word[0] == 'p' || was_parked)) {
		if (word[0] == 'r')
			e->ext.parked_bytes = 0;
		/* state after results.c applies it: saved on the next tick too */
	}
}

/* After results.c applied it: the state file follows parked changes. */
void br_ext_after(struct broker *b, struct eng *e, bool was_parked);
void br_ext_after(struct broker *b, struct eng *e, bool was_parked)
{
	if (was_parked != (strcmp(e->state, "parked") == 0))
		parked_save(b);
}

/* ---- requests ---------------------------------------------------------------------- */

static struct eng *ext_by_name(struct broker *b, const char *name)
{
	struct eng *e = name ? br_eng_by_name(b, name) : NULL;
	return e && e->st == ES_LIVE && e->kind == EK_EXTERNAL ? e : NULL;
}

static void reply_ext(struct waiter *w, const struct baton_msg *m, const struct eng *e, const char *reason)
{
	struct rbuf *rb = &w->rb;
	proto_reply_init(&rb->m, m);
	snprintf(rb->s1, sizeof rb->s1, "%s", e->name);
	rb->m.name = rb->s1;
	proto_set(&rb->m, PF_NAME);
	/* copies: the receiver encodes the reply after the decision thread moved on */
	snprintf(rb->text, 64, "%s", e->state);
	rb->m.state = rb->text;
	proto_set(&rb->m, PF_STATE);
	rb->m.mapped = e->mapped;
	proto_set(&rb->m, PF_MAPPED);
	snprintf(rb->text + 64, sizeof rb->text - 64, "%s", reason);
	rb->m.reason = rb->text + 64;
	proto_set(&rb->m, PF_REASON);
}

/* A hook that is a shell command (not a URL, not park). */
static bool is_command(const char *hook)
{
	return *hook && strncmp(hook, "http://", 7) != 0 && strcmp(hook, "park") != 0 && strcmp(hook, "resume") != 0;
}

/* Whether a hook is no URL, or one of this machine's loopback addresses. */
static bool loopback_hook(const char *hook)
{
	if (strncmp(hook, "http://", 7) != 0)
		return true;
	const char *h = hook + 7;
	size_t n = strcspn(h, "/ ");
	char host[BROKER_NAME_MAX];
	snprintf(host, sizeof host, "%.*s", (int)(n < sizeof host ? n : sizeof host - 1), h);
	char *colon = host[0] == '[' ? strchr(host, ']') : strrchr(host, ':');
	if (colon && host[0] == '[')
		colon[1] = 0;
	else if (colon)
		*colon = 0;
	return strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0 || strcmp(host, "[::1]") == 0;
}

/* Whether the request came over the control socket from a process of the
 * broker's own user (the socket's peer). */
static bool from_own_user(const struct baton_msg *m)
{
	int pid = proto_pipe_pid(m->pipe);
	char path[64];
	struct stat st;
	snprintf(path, sizeof path, "/proc/%d", pid);
	return pid > 0 && stat(path, &st) == 0 && st.st_uid == geteuid();
}

static void on_add(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	json_error_t je;
	json_t *j = proto_has(m, PF_BODY) ? json_loads(m->body, JSON_REJECT_DUPLICATES, &je) : NULL;
	if (!json_is_object(j)) {
		json_decref(j);
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "external add: the body is a JSON object "
		    "(name, pid | pid_file | unit, gpu, priority, pinned, url, model, mib, release, refill, hook_timeout_s)");
		return;
	}
	const char *jname = json_string_value(json_object_get(j, "name"));
	char name[BROKER_NAME_MAX];
	snprintf(name, sizeof name, "%s", jname ? jname : "");
	if (!jname || !proto_name_valid(name, strlen(name))) {
		json_decref(j);
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "external add: a name of letters, digits, '-', '_' or '.'");
		return;
	}
	struct broker_external_conf *c = calloc(1, sizeof *c);
	if (!c) {
		json_decref(j);
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "external add: out of memory");
		return;
	}
	broker_external_init(c, name);
	const char *k;
	json_t *v;
	char err[300] = "";
	int rc = 0;
	json_object_foreach(j, k, v) {
		if (strcmp(k, "name") == 0)
			continue;
		char text[BROKER_HOOK_MAX];
		if (json_is_string(v))
			snprintf(text, sizeof text, "%s", json_string_value(v));
		else if (json_is_integer(v))
			snprintf(text, sizeof text, "%lld", (long long)json_integer_value(v));
		else if (json_is_real(v))
			snprintf(text, sizeof text, "%g", json_real_value(v));
		else if (json_is_boolean(v))
			snprintf(text, sizeof text, "%s", json_is_true(v) ? "true" : "false");
		else {
			snprintf(err, sizeof err, "%s: want a string, number or boolean", k);
			rc = BATON_EINVAL;
			break;
		}
		if ((rc = broker_external_set(c, k, text, err, sizeof err)) != 0)
			break;
	}
	json_decref(j);
	if (rc == 0 && !from_own_user(m) && (!loopback_hook(c->release) || !loopback_hook(c->refill))) {
		snprintf(err, sizeof err, "an http:// hook given at run time must be a loopback address (127.0.0.1, "
		    "localhost, [::1]); another goes in the configuration");
		rc = BATON_EPERM;
	}
	if (rc == 0 && (is_command(c->release) || is_command(c->refill)) && !from_own_user(m)) {
		/* a command runs as the broker's user: whoever may add one at run
		 * time could run anything as that user otherwise */
		snprintf(err, sizeof err, "a command hook runs as the broker's user: give it in the configuration, "
		    "or from that user over the control socket (over HTTP: an http:// hook or park)");
		rc = BATON_EPERM;
	}
	if (rc == 0)
		rc = ext_add(b, c, false, err, sizeof err);
	free(c);
	if (rc) {
		br_reply_error(w, m->op, m->id, rc, "external add %s: %s", name, err);
		return;
	}
	struct eng *e = ext_by_name(b, name);
	reply_ext(w, m, e, e->ext.mem_src);
	br_waiter_done(w);
}

static void on_remove(struct broker *b, struct waiter *w, const struct baton_msg *m, struct eng *e)
{
	if (e->in_flight || strcmp(e->state, "parked") == 0) {
		br_reply_error(w, m->op, m->id, BATON_ESTATE, "external remove %s: it is %s; resume it first", e->name,
		    e->in_flight ? "in the middle of a hook" : "parked");
		return;
	}
	struct eref ref = br_eref_of(b, e);
	for (size_t i = 0; i < MAX_OPS; i++) {
		struct op *o = &b->ops[i];
		if (o->used && o->target.slot == ref.slot && o->target.gen == ref.gen)
			br_op_fail(b, o, BATON_ECLOSED, "external %s was removed", e->name);
	}
	reply_ext(w, m, e, "removed: no longer counted or driven by the broker");
	br_blog("external %s removed (pid %d keeps running, not counted)", e->name, e->pid);
	br_publish(b, "stopped", e, "removed", -1, e->mapped);
	br_watch_remove(b, ref);
	e->st = ES_FREE;
	br_lend_wake(b, e->gpu);
	br_waiter_done(w);
}

/* park / resume: a release that parks / a refill, through the usual ops
 * (a resume waits for its grant like any refill: never restored into
 * memory the broker has not granted). */
static void on_park(struct broker *b, struct waiter *w, const struct baton_msg *m, struct eng *e, bool park)
{
	if (br_eng_pinned(b, e) && park) {
		br_reply_error(w, m->op, m->id, BATON_EPERM, "park: %s is pinned", e->name);
		return;
	}
	bool parked = strcmp(e->state, "parked") == 0;
	if (park == parked) {
		br_reply_error(w, m->op, m->id, BATON_ESTATE, "%s: %s is %s", park ? "park" : "resume", e->name,
		    parked ? "parked already" : "not parked");
		return;
	}
	if (park && (e->pid <= 0 || strcmp(e->state, "ready") != 0)) {
		br_reply_error(w, m->op, m->id, BATON_ESTATE, "park: %s is %s", e->name, e->state);
		return;
	}
	struct baton_msg req = { .op = park ? PROTO_OP_RELEASE : PROTO_OP_REFILL, .id = m->id };
	struct op *o = br_op_new(b, park ? OP_RELEASE : OP_REFILL, w, &req);
	if (!o) {
		br_reply_error(w, m->op, m->id, BATON_ENOMEM, "park: too many operations in progress");
		return;
	}
	o->req_op = PROTO_OP_EXTERNAL;
	o->target = br_eref_of(b, e);
	o->gpu = e->gpu;
	o->reserve_mib = PROTO_RESERVE_FULL;
	if (park) {
		e->ext.park_next = true;
		o->phase = P_CMD;
	} else {
		o->bytes = e->ext.parked_bytes > e->mapped ? e->ext.parked_bytes - e->mapped : br_want_bytes(e);
		o->phase = P_WAIT;
	}
}

static void on_report(struct broker *b, struct waiter *w, const struct baton_msg *m, struct eng *e)
{
	if (!proto_has(m, PF_MAPPED)) {
		br_reply_error(w, m->op, m->id, BATON_EMISSING, "external report: mapped (bytes it holds now)");
		return;
	}
	if (strcmp(e->ext.mem_src, "nvml") == 0 || strcmp(e->ext.mem_src, "hostdev") == 0) {
		br_reply_error(w, m->op, m->id, BATON_ESTATE, "external report %s: NVML measures it; its report is not used",
		    e->name);
		return;
	}
	uint64_t before = e->mapped;
	e->mapped = e->resident = m->mapped;
	if (m->mapped > e->ceiling && strcmp(e->state, "ready") == 0)
		e->ceiling = m->mapped;
	ext_whole(e);
	snprintf(e->ext.mem_src, sizeof e->ext.mem_src, "report");
	br_publish(b, "state", e, "its own report", -1, br_moved(before, e->mapped));
	reply_ext(w, m, e, "report");
	br_waiter_done(w);
}

void br_on_external(struct broker *b, struct waiter *w, const struct baton_msg *m)
{
	const char *a = m->level ? m->level : "";
	if (strcmp(a, "add") == 0) {
		on_add(b, w, m);
		return;
	}
	bool known = strcmp(a, "remove") == 0 || strcmp(a, "park") == 0 || strcmp(a, "resume") == 0 ||
	    strcmp(a, "report") == 0;
	if (!known) {
		br_reply_error(w, m->op, m->id, BATON_EINVAL, "external: '%.32s' is not add, remove, park, resume or report", a);
		return;
	}
	struct eng *e = ext_by_name(b, proto_has(m, PF_NAME) ? m->name : NULL);
	if (!e) {
		br_reply_error(w, m->op, m->id, BATON_ENOTFOUND, "%s: no external engine named '%.64s'", a,
		    proto_has(m, PF_NAME) ? m->name : "");
		return;
	}
	if (strcmp(a, "remove") == 0)
		on_remove(b, w, m, e);
	else if (strcmp(a, "report") == 0)
		on_report(b, w, m, e);
	else
		on_park(b, w, m, e, a[0] == 'p');
}
