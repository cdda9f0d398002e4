/*
 * registry.c: the decision thread's books: engines (by slot +
 * generation), GPUs, the accounting of each device, what the
 * configuration says of an engine, and the operator's pins with their
 * file.
 *
 * Accounting, per device: held = sum over live engines of (mapped + grant),
 * where grant is what was granted and not yet seen used. An engine's
 * mapped bytes come from its messages, each carrying the epoch of the
 * state it describes; older news than what was applied is dropped, so a
 * heartbeat built before a command never overwrites the command's result.
 * free = total - other - kv - held, where kv is what the engines' KV
 * pools hold (each engine says, in register, heartbeat and report: a line
 * of its own in the books, issue 28) and `other` is the device memory used
 * outside the caches and KV pools (dense tensors, contexts, other programs), measured
 * from engines' reports (or NVML) whenever nothing is in flight on the
 * device; with NVML, free is also at most NVML's free minus the grants not
 * yet used. A configured total_mib caps what the caches hold together:
 * free is then also at most total_mib - held. available = free - reserve.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "broker/broker_int.h"

/* Whether pid is a live (not zombie) process. */
int br_pid_alive(int pid)
{
	if (pid <= 0)
		return 0;
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return kill(pid, 0) == 0 || errno == EPERM;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	if (!p || p[1] != ' ')
		return 1;
	return p[2] != 'Z' && p[2] != 'X';
}

struct eng *br_eng_get(struct broker *b, struct eref r)
{
	if (r.slot >= BROKER_MAX_ENGINES)
		return NULL;
	struct eng *e = &b->eng[r.slot];
	return e->st != ES_FREE && e->gen == r.gen ? e : NULL;
}

struct eng *br_eng_live(struct broker *b, struct eref r)
{
	struct eng *e = br_eng_get(b, r);
	return e && e->st == ES_LIVE ? e : NULL;
}

struct eref br_eref_of(struct broker *b, const struct eng *e)
{
	return (struct eref){ (uint32_t)(e - b->eng), e->gen };
}

struct eng *br_eng_by_name(struct broker *b, const char *name)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++)
		if (b->eng[i].st != ES_FREE && strcmp(b->eng[i].name, name) == 0)
			return &b->eng[i];
	return NULL;
}

/* Names a device as nvidia-smi does (index, product name), through NVML;
 * the host backend's "host-N" is "host device N". Others wait for their
 * first engine's device index (on_register). */
static void gpu_name(struct broker *b, struct gpu *g)
{
	unsigned idx = 0;
	g->index = -1;
	g->name[0] = 0;
	if (b->cfg.nvml && broker_nvml_name(g->uuid, g->name, sizeof g->name, &idx) == 0) {
		g->index = (int)idx;
	} else if (strncmp(g->uuid, "host-", 5) == 0 && g->uuid[5] >= '0' && g->uuid[5] <= '9') {
		g->index = atoi(g->uuid + 5);
		snprintf(g->name, sizeof g->name, "host device %d", g->index);
	}
}

size_t br_gpu_find_or_add(struct broker *b, const char *uuid)
{
	for (size_t i = 0; i < b->n_gpus; i++)
		if (strcmp(b->gpus[i].uuid, uuid) == 0)
			return i;
	if (b->n_gpus == BROKER_MAX_GPUS)
		return (size_t)-1;
	struct gpu *g = &b->gpus[b->n_gpus];
	memset(g, 0, sizeof *g);
	snprintf(g->uuid, sizeof g->uuid, "%s", uuid);
	const struct broker_gpu_conf *gc = broker_config_gpu(&b->cfg, uuid);
	if (gc) {
		g->reserve = gc->reserve_bytes;
		g->cap = gc->total_bytes;
		g->no_lend = gc->no_lend;
	}
	uint64_t fr, tot;
	if (b->cfg.nvml && broker_nvml_mem(uuid, &fr, &tot) == 0) {
		g->nvml = 1;
		g->dev_total = tot;
	}
	gpu_name(b, g);
	br_blog("device %s: %s, reserve %.0f MiB%s", uuid, g->nvml ? "NVML" : "sizes from its engines",
	    (double)g->reserve / BATON_MIB, g->cap ? ", managed size from the configuration" : "");
	return b->n_gpus++;
}

/* What the broker hands out on this device: the configured total_mib
 * (a cap on the caches together), else the device's size. */
static uint64_t gpu_total(const struct gpu *g)
{
	if (g->cap && (g->cap < g->dev_total || g->dev_total == 0))
		return g->cap;
	return g->dev_total;
}

static const struct broker_engine_conf *conf_of(struct broker *b, const struct eng *e)
{
	return broker_config_engine(&b->cfg, e->name);
}

int32_t br_eng_priority(struct broker *b, const struct eng *e)
{
	const struct broker_engine_conf *c = conf_of(b, e);
	return c && c->has_priority ? c->priority : e->reg_priority;
}

bool br_eng_pinned(struct broker *b, const struct eng *e)
{
	if (e->kind == EK_LEASE)
		return true; /* a lease is never reclaimed: it ends with its job */
	if (e->kind == EK_EXTERNAL && e->ext.pinned)
		return true;
	for (size_t i = 0; i < b->n_pins; i++)
		if (strcmp(b->pins[i].name, e->name) == 0)
			return b->pins[i].pinned;
	const struct broker_engine_conf *c = conf_of(b, e);
	return c && c->pinned;
}

/* The one idle-release rule (docs/policies.md): the shortest of the
 * timeouts that apply. idle_release_s ([engine], else [broker]; 0: none)
 * applies to every engine; the keep-alive ([engine] keep_alive_s, else
 * [broker] door_keep_alive_s; forever: none) to an engine the front door
 * routes to (one with OpenAI HTTP). A keep-alive of 0 releases as soon as
 * the engine is idle. */
double br_eng_idle_timeout(struct broker *b, const struct eng *e, bool *keep_alive)
{
	const struct broker_engine_conf *c = conf_of(b, e);
	double t = c && c->idle_release_s >= 0 ? c->idle_release_s : b->cfg.idle_release_s;
	double ka = -1;
	if (e->http[0])
		ka = c && c->has_keep_alive ? c->keep_alive_s : b->cfg.door_keep_alive_s;
	if (e->has_req_keep_alive) { /* a request asked (Ollama's keep_alive): it decides */
		if (e->req_keep_alive_s < 0) {
			if (keep_alive)
				*keep_alive = true;
			return 0;
		}
		ka = e->req_keep_alive_s;
		t = 0;
	}
	if (ka >= 0 && ka < 1e-3)
		ka = 1e-3; /* at once (t > 0 means a timeout) */
	bool by_ka = ka > 0 && (t <= 0 || ka < t);
	if (keep_alive)
		*keep_alive = by_ka;
	return by_ka ? ka : t;
}

void br_gpu_view(struct broker *b, size_t gi, struct gpu_view *v)
{
	struct gpu *g = &b->gpus[gi];
	memset(v, 0, sizeof *v);
	v->total = gpu_total(g);
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st != ES_LIVE || e->gpu != gi)
			continue;
		v->held += e->mapped + e->grant;
		v->grants += e->grant;
		v->kv += e->kv;
	}
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st == ES_LIVE && e->has_peer && e->peer_gpu == gi) {
			v->lent += e->peer_mapped + e->peer_grant;
			v->grants += e->peer_grant; /* not in NVML's free yet either */
		}
	}
	v->held += v->lent;
	uint64_t used = v->held + g->other + v->kv;
	v->free_b = g->dev_total > used ? g->dev_total - used : 0;
	v->dev_free = v->free_b;
	if (v->total < g->dev_total) { /* capped: the caches' own budget */
		uint64_t left = v->total > v->held ? v->total - v->held : 0;
		if (left < v->free_b)
			v->free_b = left;
	}
	uint64_t fr, tot;
	if (g->nvml && broker_nvml_mem(g->uuid, &fr, &tot) == 0) {
		uint64_t nf = fr > v->grants ? fr - v->grants : 0;
		v->dev_free = nf;
		if (nf < v->free_b)
			v->free_b = nf;
	}
	v->avail = v->free_b > g->reserve ? v->free_b - g->reserve : 0;
}

/* Nothing in flight on the device: the engines' figures add up. */
static bool gpu_quiet(struct broker *b, size_t gi)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *e = &b->eng[i];
		if (e->st == ES_LIVE && e->gpu == gi && (e->in_flight || e->grant))
			return false;
		if (e->st == ES_LIVE && e->has_peer && e->peer_gpu == gi && (e->in_flight || e->peer_grant))
			return false;
	}
	return true;
}

/* Learns `other` from one engine's view of its device. */
static void learn_other(struct broker *b, struct eng *e, uint64_t dev_free)
{
	struct gpu *g = &b->gpus[e->gpu];
	if (!gpu_quiet(b, e->gpu))
		return;
	uint64_t fr = dev_free, tot = g->dev_total;
	if (g->nvml && broker_nvml_mem(g->uuid, &fr, &tot) != 0)
		return;
	if (tot == 0)
		return;
	uint64_t mapped = 0;
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		const struct eng *x = &b->eng[i];
		if (x->st == ES_LIVE && x->gpu == e->gpu)
			mapped += x->mapped + x->kv; /* KV pools: a line of their own */
		if (x->st == ES_LIVE && x->has_peer && x->peer_gpu == e->gpu)
			mapped += x->peer_mapped;
	}
	uint64_t used = tot > fr ? tot - fr : 0;
	uint64_t other = used > mapped ? used - mapped : 0;
	/* Right after a death, a figure measured before it (a heartbeat on its
	 * way, a driver not done freeing) still holds the dead engine's memory,
	 * which no longer counts in `mapped`: it would pass for `other` and
	 * stay until the next quiet report. A death only frees memory, so
	 * `other` may fall then, not rise. */
	if (other > g->other && baton_now_s() - g->death_at < DEATH_SETTLE_S)
		return;
	g->other = other;
}

/* Memory came free on device gi: engines that borrow there may ask for
 * more at once (a lend they could not fully use waits LEND_BACKOFF_S
 * otherwise). */
void br_lend_wake(struct broker *b, size_t gi)
{
	for (size_t i = 0; i < BROKER_MAX_ENGINES; i++) {
		struct eng *x = &b->eng[i];
		if (x->st == ES_LIVE && x->has_peer && x->peer_gpu == gi)
			x->peer_retry_after = 0;
	}
}

/* Applies what an engine says about itself, unless older than what we
 * know (its epoch is the epoch of the state it describes). */
void br_apply_state(struct broker *b, struct eng *e, const struct baton_msg *m, bool has_epoch,
    uint64_t epoch)
{
	if (has_epoch && epoch < e->acct_epoch)
		return;
	if (has_epoch)
		e->acct_epoch = epoch;
	if (m->state)
		snprintf(e->state, sizeof e->state, "%s", m->state);
	e->resident = m->resident;
	uint64_t was = e->mapped;
	if (proto_has(m, PF_MAPPED))
		e->mapped = m->mapped;
	else if (baton_state_parse(m->state) == BATON_STATE_RELEASED)
		e->mapped = 0;
	if (e->mapped < was)
		br_lend_wake(b, e->gpu);
	if (e->grant && has_epoch && epoch >= e->grant_epoch &&
	    baton_state_parse(m->state) != BATON_STATE_REFILLING) {
		e->grant = 0; /* the state after the grant was used */
		e->grant_epoch = 0;
	}
	if (proto_has(m, PF_PEER_MAPPED))
		e->peer_mapped = e->has_peer ? m->peer_mapped : 0;
	if (proto_has(m, PF_KV))
		e->kv = m->kv;
	if (proto_has(m, PF_FREE)) {
		e->dev_free = m->free_bytes;
		learn_other(b, e, m->free_bytes);
	}
}

void br_eng_forget_conn(struct eng *e)
{
	if (e->conn) {
		proto_client_shutdown(e->conn->cli); /* commands in flight end now */
		br_conn_put(e->conn);
		e->conn = NULL;
	}
}

/* ---- pins across restarts ----------------------------------------------------------
 *
 * The one piece of broker state that engines cannot tell a new broker:
 * an operator's pins. Kept in a small JSON file, {"version": 1, "pins":
 * {"NAME": true|false}}, written whole (temporary file, fsync, rename) on
 * every change, read once at start. A file that cannot be read is named in
 * the log and ignored: the broker starts without those pins rather than
 * not at all, and the next change writes a good file. */

/* Writes j as the whole of the file at path: a new file of ours (O_EXCL:
 * never through a link or over a file someone left at a known name),
 * fsynced, then renamed over the old one. -1 with errno on failure (the
 * old file is then as it was). The pins' and parked processes' files. */
int br_json_replace(const char *path, const json_t *j)
{
	char tmp[BROKER_URL_MAX + 32];
	snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
	int fd = mkostemp(tmp, O_CLOEXEC);
	int rc = fd < 0 || !j || fchmod(fd, 0640) != 0 ? -1 : json_dumpfd(j, fd, JSON_SORT_KEYS);
	if (rc == 0 && (write(fd, "\n", 1) != 1 || fsync(fd) != 0))
		rc = -1;
	if (fd >= 0 && close(fd) != 0)
		rc = -1;
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -1;
	if (rc != 0 && fd >= 0) {
		int e = errno;
		unlink(tmp);
		errno = e;
	}
	return rc;
}

void br_pins_save(struct broker *b)
{
	const char *path = b->cfg.state_file;
	if (!*path)
		return;
	json_t *pins = json_object();
	for (size_t i = 0; i < b->n_pins; i++)
		json_object_set_new(pins, b->pins[i].name, json_boolean(b->pins[i].pinned));
	json_t *j = json_pack("{s:i, s:o}", "version", 1, "pins", pins);
	if (br_json_replace(path, j) != 0)
		br_blog("cannot write the pins to %s: %s; they hold until the broker restarts", path, strerror(errno));
	json_decref(j);
}

void br_pins_load(struct broker *b)
{
	const char *path = b->cfg.state_file;
	if (!*path)
		return;
	json_error_t je;
	/* Ours and a plain file, never read through a link. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		if (fd >= 0 || errno != ENOENT)
			br_blog("%s: not a file of this user's (a link?); its pins are ignored", path);
		if (fd >= 0)
			close(fd);
		return;
	}
	json_t *j = json_loadfd(fd, JSON_REJECT_DUPLICATES, &je);
	close(fd);
	if (!j) {
		br_blog("%s:%d: %s; its pins are ignored", path, je.line, je.text);
		return;
	}
	json_t *pins = json_object_get(j, "pins");
	json_t *ver = json_object_get(j, "version");
	if (!json_is_integer(ver) || json_integer_value(ver) != 1 || !json_is_object(pins)) {
		br_blog("%s: not a baton-broker state file of version 1; its pins are ignored", path);
		json_decref(j);
		return;
	}
	const char *name;
	json_t *v;
	json_object_foreach(pins, name, v) {
		if (!json_is_boolean(v) || !*name || strlen(name) >= BROKER_NAME_MAX) {
			br_blog("%s: pin '%.64s' is not a name with true or false; ignored", path, name);
			continue;
		}
		if (b->n_pins == BROKER_MAX_ENGINES)
			break;
		snprintf(b->pins[b->n_pins].name, sizeof b->pins[b->n_pins].name, "%s", name);
		b->pins[b->n_pins++].pinned = json_is_true(v);
		br_blog("engine %s %s (kept from %s)", name, json_is_true(v) ? "pinned" : "unpinned", path);
	}
	json_decref(j);
}
