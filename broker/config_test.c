/*
 * config_test.c: the broker's INI file: every key read, defaults kept,
 * and each bad file rejected with the exact line named.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker/broker.h"
#include "tests/t.h"

#define M (1024ull * 1024ull)

static void t_good(void)
{
	static struct broker_config c;
	char err[512] = "";
	broker_config_defaults(&c);
	const char *text =
	    "; a comment\n"
	    "[broker]\n"
	    "control = ipc:///tmp/x/broker.sock\n"
	    "events = tcp://127.0.0.1:0\n"
	    "heartbeat_timeout_ms = 1500\n"
	    "idle_release_s = 2.5\n"
	    "acquire_wait_ms = 0\n"
	    "command_timeout_ms = 1000\n"
	    "nvml = off\n"
	    "state_file = /var/lib/baton/broker.state\n"
	    "\n"
	    "[gpu \"host-0\"]\n"
	    "reserve_mib = 16\n"
	    "total_mib = 64\n"
	    "lend = false\n"
	    "[gpu *]\n"
	    "reserve_mib = 1024 ; inline comment\n"
	    "[engine \"qwen-7b.q8\"]\n"
	    "priority = -3\n"
	    "pinned = yes\n"
	    "idle_release_s = 0\n"
	    "[engine b]\n"
	    "pinned = false\n";
	T_OK(broker_config_parse(&c, text, "t.ini", err, sizeof err));
	T_EQ_STR(c.control, "ipc:///tmp/x/broker.sock");
	T_EQ_STR(c.events, "tcp://127.0.0.1:0");
	T_EQ_INT(c.heartbeat_timeout_ms, 1500);
	T_ASSERT(c.idle_release_s == 2.5);
	T_EQ_INT(c.acquire_wait_ms, 0);
	T_EQ_INT(c.command_timeout_ms, 1000);
	T_ASSERT(!c.nvml);
	T_EQ_STR(c.state_file, "/var/lib/baton/broker.state");
	T_ASSERT(c.state_file_set);
	T_EQ_INT(c.n_gpus, 2);
	const struct broker_gpu_conf *g = broker_config_gpu(&c, "host-0");
	T_ASSERT(g && g->reserve_bytes == 16 * M && g->total_bytes == 64 * M && g->no_lend);
	g = broker_config_gpu(&c, "GPU-1234");
	T_ASSERT(g && strcmp(g->uuid, "*") == 0 && g->reserve_bytes == 1024 * M && !g->no_lend);
	const struct broker_engine_conf *e = broker_config_engine(&c, "qwen-7b.q8");
	T_ASSERT(e && e->has_priority && e->priority == -3 && e->pinned && e->idle_release_s == 0);
	e = broker_config_engine(&c, "b");
	T_ASSERT(e && !e->has_priority && !e->pinned && e->idle_release_s < 0);
	T_ASSERT(broker_config_engine(&c, "nobody") == NULL);
}

static void t_defaults(void)
{
	static struct broker_config c;
	char err[256];
	broker_config_defaults(&c);
	T_EQ_STR(c.control, BROKER_DEFAULT_CONTROL);
	T_EQ_STR(c.events, BROKER_DEFAULT_EVENTS);
	T_EQ_INT(c.heartbeat_timeout_ms, 2000);
	T_EQ_INT(c.acquire_wait_ms, 5000);
	T_OK(broker_config_parse(&c, "", "empty.ini", err, sizeof err));
	T_EQ_STR(c.control, BROKER_DEFAULT_CONTROL);
	T_ASSERT(broker_config_gpu(&c, "host-0") == NULL);
	T_ASSERT(c.door_quantum_s == 5 && c.door_keep_alive_s == 300 && c.door_queue_max == 64);
}

/* The front door's keys: seconds, "forever", a per-engine keep-alive. */
static void t_door(void)
{
	static struct broker_config c;
	char err[256];
	broker_config_defaults(&c);
	T_OK(broker_config_parse(&c, "[broker]\ndoor_quantum_s = 0.5\ndoor_keep_alive_s = forever\n"
	    "door_queue_max = 3\n[engine \"a\"]\nkeep_alive_s = 12\n[engine \"b\"]\npinned = true\n",
	    "d.ini", err, sizeof err));
	T_ASSERT(c.door_quantum_s == 0.5 && c.door_keep_alive_s < 0 && c.door_queue_max == 3);
	const struct broker_engine_conf *a = broker_config_engine(&c, "a"), *b = broker_config_engine(&c, "b");
	T_ASSERT(a && a->has_keep_alive && a->keep_alive_s == 12);
	T_ASSERT(b && !b->has_keep_alive);
}

static const struct {
	const char *text, *want; /* want: the start of the message */
} bad[] = {
	{ "[broker]\nbogus = 1\n", "b.ini:2: unknown key 'bogus' in [broker]" },
	{ "\n\n[nope]\nx = 1\n", "b.ini:4: unknown section [nope]" },
	{ "key = 1\n", "b.ini:1: 'key' is outside any section" },
	{ "[broker]\nheartbeat_timeout_ms = 12abc\n", "b.ini:2: heartbeat_timeout_ms = '12abc'" },
	{ "[broker]\nheartbeat_timeout_ms = 5\n", "b.ini:2: heartbeat_timeout_ms = '5'" },
	{ "[broker]\nacquire_wait_ms = -1\n", "b.ini:2: acquire_wait_ms = '-1'" },
	{ "[broker]\nidle_release_s = soon\n", "b.ini:2: idle_release_s = 'soon'" },
	{ "[broker]\nidle_release_s = nan\n", "b.ini:2: idle_release_s = 'nan'" },
	{ "[broker]\nnvml = maybe\n", "b.ini:2: nvml = 'maybe'" },
	{ "[broker]\ncontrol = /run/x.sock\n", "b.ini:2: control = '/run/x.sock'" },
	{ "[gpu \"host-0\"]\nreserve_mib = 1.5\n", "b.ini:2: reserve_mib = '1.5'" },
	{ "[gpu \"host-0\"]\ntotal_mib = 10\nreserve_mib = 10\n", "b.ini:3: reserve_mib must be less" },
	{ "[gpu \"a b\"]\nreserve_mib = 1\n", "b.ini:2: [gpu \"a b\"]" },
	{ "[gpu \"host-1\"]\nlend = maybe\n", "b.ini:2: lend = 'maybe': want true or false" },
	{ "[broker]\nstate_file = broker.state\n", "b.ini:2: state_file = 'broker.state': want an absolute path" },
	{ "[gpu host-0]\nreserve_mib = 1\n[gpu \"host-0\"]\nreserve_mib = 2\n",
	  "b.ini:4: [gpu \"host-0\"] appears twice (first on line 2)" },
	{ "[engine \"a\"]\npriority = high\n", "b.ini:2: priority = 'high'" },
	{ "[engine \"a\"]\npriority = 99999999999\n", "b.ini:2: priority = '99999999999'" },
	{ "[engine \"a\"]\npinned = 2\n", "b.ini:2: pinned = '2'" },
	{ "[engine \"a\"]\ncolour = red\n", "b.ini:2: unknown key 'colour' in [engine \"a\"]" },
	{ "[engine \"*\"]\npinned = true\n", "b.ini:2: [engine \"*\"]" },
	/* the rule of engine names (proto_name_valid): no ':' */
	{ "[engine \"a:b\"]\npinned = true\n", "b.ini:2: [engine \"a:b\"]" },
	{ "[broker]\ndoor_quantum_s = -1\n", "b.ini:2: door_quantum_s = '-1'" },
	{ "[broker]\ndoor_keep_alive_s = always\n", "b.ini:2: door_keep_alive_s = 'always'" },
	{ "[broker]\ndoor_queue_max = 0\n", "b.ini:2: door_queue_max = '0'" },
	{ "[engine \"a\"]\nkeep_alive_s = -5\n", "b.ini:2: keep_alive_s = '-5'" },
	{ "[broker]\nthis line has no equals sign\n", "b.ini:2: syntax error" },
	{ "[broker\nx = 1\n", "b.ini:1: syntax error" },
	{ "[broker]\nnvml = true\n\n\n[broker]\nbad\n", "b.ini:6: syntax error" },
	{ "[broker]\nbogus = 1\nworse\n", "b.ini:2: unknown key" },
	{ "[broker]\ncontrol = ipc:///a\nevents = ipc:///a\n", "b.ini: control and events must be different" },
};

static void t_bad(void)
{
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		static struct broker_config c;
		char err[512] = "";
		broker_config_defaults(&c);
		int rc = broker_config_parse(&c, bad[i].text, "b.ini", err, sizeof err);
		T_ASSERT_MSG(rc == BATON_ECONFIG, "case %zu: rc %d (%s)", i, rc, err);
		T_ASSERT_MSG(strncmp(err, bad[i].want, strlen(bad[i].want)) == 0, "case %zu: \"%s\", want \"%s...\"",
		    i, err, bad[i].want);
	}
}

static void t_file(void)
{
	static struct broker_config c;
	char err[512] = "", path[] = "/tmp/baton-config-test.XXXXXX";
	broker_config_defaults(&c);
	T_EQ_ERR(broker_config_load(&c, "/nonexistent/broker.ini", err, sizeof err), BATON_ENOTFOUND);
	T_ASSERT(strstr(err, "/nonexistent/broker.ini: cannot open") != NULL);
	int fd = mkstemp(path);
	T_ASSERT(fd >= 0);
	/* a line longer than inih's buffer is named as such, by its own number */
	char text[1024];
	int n = snprintf(text, sizeof text, "[broker]\nnvml = false\n; %0300d\nbad key = 1\n", 7);
	T_ASSERT(write(fd, text, (size_t)n) == n);
	close(fd);
	int rc = broker_config_load(&c, path, err, sizeof err);
	unlink(path);
	T_EQ_ERR(rc, BATON_ECONFIG);
	char want[128];
	snprintf(want, sizeof want, "%s:3: line too long", path);
	T_ASSERT_MSG(strncmp(err, want, strlen(want)) == 0, "\"%s\", want \"%s\"", err, want);
}


/* ---- [model]: the fleet's sections ---------------------------------------- */

static char tmp[64];

static void touch(const char *rel, const char *content)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", tmp, rel);
	FILE *f = fopen(p, "w");
	T_ASSERT_MSG(f != NULL, "%s", p);
	fputs(content, f);
	fclose(f);
}

static void mkd(const char *rel)
{
	char p[512];
	snprintf(p, sizeof p, "%s/%s", tmp, rel);
	T_ASSERT_MSG(mkdir(p, 0700) == 0, "%s", p);
}

/* A Hugging Face folder, a GGUF file, and a Hugging Face cache with one
 * repo at two revisions (main and a tag). */
static void make_sources(void)
{
	snprintf(tmp, sizeof tmp, "/tmp/baton-models-test.XXXXXX");
	T_ASSERT(mkdtemp(tmp) != NULL);
	mkd("hf");
	touch("hf/config.json", "{}");
	touch("hf/model.safetensors", "");
	touch("m.gguf", "GGUF....");
	touch("notgguf.bin", "XXXX");
	mkd("empty");
	mkd("hub");
	mkd("hub/models--acme--tiny");
	mkd("hub/models--acme--tiny/refs");
	mkd("hub/models--acme--tiny/snapshots");
	mkd("hub/models--acme--tiny/snapshots/c0ffee");
	mkd("hub/models--acme--tiny/snapshots/beef01");
	touch("hub/models--acme--tiny/refs/main", "c0ffee\n");
	touch("hub/models--acme--tiny/refs/v1", "beef01\n");
	touch("hub/models--acme--tiny/snapshots/c0ffee/config.json", "{}");
	touch("hub/models--acme--tiny/snapshots/c0ffee/model.safetensors", "");
	touch("hub/models--acme--tiny/snapshots/beef01/tiny-q8_0.gguf", "GGUF");
}

static void t_models(void)
{
	static struct broker_config c;
	char err[1024] = "", text[4096], hub[128];
	make_sources();
	snprintf(hub, sizeof hub, "%s/hub", tmp);
	setenv("HF_HUB_CACHE", hub, 1);
	broker_config_defaults(&c);
	T_EQ_STR(c.arena_dir, "/dev/shm/baton");
	snprintf(text, sizeof text,
	    "[broker]\nengine = /opt/baton/bin/baton-engine\narena_dir = /tmp/arenas\nrestart_max = 3\n"
	    "restart_window_s = 30\n"
	    "[model \"qwen\"]\nsource = %s/hf\naliases = qwen3, q\nbackend = host\ndevice = 2\ndtype = bf16\n"
	    "ctx = 512\nkv_blocks = 64\nmax_seqs = 4\nkeep_alive_s = 20\nstop_after_s = 60\npriority = 5\n"
	    "pinned = true\nengine_flags = --vram-reserve-mib 8\nprefix_cache = false\nkv_host_mib = 0\n"
	    "[model \"g\"]\nsource = %s/m.gguf\npreload = yes\ndrop_arena = true\n"
	    "[model \"tiny\"]\nsource = hf:acme/tiny\n"
	    "[model \"tiny-v1\"]\nsource = hf:acme/tiny@v1\narena = /tmp/t1.arena\n"
	    "[model \"sha\"]\nsource = hf:acme/tiny@c0ffee\n", tmp, tmp);
	T_ASSERT_MSG(broker_config_parse(&c, text, "m.ini", err, sizeof err) == 0, "%s", err);
	T_EQ_STR(c.engine_path, "/opt/baton/bin/baton-engine");
	T_EQ_STR(c.arena_dir, "/tmp/arenas");
	T_ASSERT(c.restart_max == 3 && c.restart_window_s == 30);
	T_EQ_INT(c.n_models, 5);
	const struct broker_model_conf *m = broker_config_model(&c, "qwen");
	T_ASSERT(m && m->kind == BROKER_SRC_HF && strcmp(m->backend, "host") == 0 && m->device == 2);
	T_ASSERT(strcmp(m->dtype, "bf16") == 0 && m->ctx == 512 && m->kv_blocks == 64 && m->max_seqs == 4);
	T_ASSERT(m->has_keep_alive && m->keep_alive_s == 20 && m->stop_after_s == 60);
	T_ASSERT(m->has_priority && m->priority == 5 && m->pinned && !m->preload);
	T_EQ_STR(m->flags, "--vram-reserve-mib 8");
	T_ASSERT(m->no_prefix_cache && m->has_kv_host && m->kv_host_mib == 0);
	T_ASSERT(broker_config_model(&c, "qwen3") == m && broker_config_model(&c, "q") == m);
	const struct broker_model_conf *g0 = broker_config_model(&c, "g");
	T_ASSERT(g0 && !g0->no_prefix_cache && !g0->has_kv_host);
	T_ASSERT(broker_config_model(&c, "nobody") == NULL);
	/* a model is the engine of its name: the core's priority, pin, keep-alive */
	const struct broker_engine_conf *e = broker_config_engine(&c, "qwen");
	T_ASSERT(e && e->has_priority && e->priority == 5 && e->pinned && e->has_keep_alive && e->keep_alive_s == 20);
	m = broker_config_model(&c, "g");
	T_ASSERT(m && m->kind == BROKER_SRC_GGUF && m->preload && m->drop_arena && strcmp(m->backend, "auto") == 0);
	T_ASSERT(!broker_config_model(&c, "qwen")->drop_arena);
	char want[512];
	m = broker_config_model(&c, "tiny");
	snprintf(want, sizeof want, "%s/hub/models--acme--tiny/snapshots/c0ffee", tmp);
	T_ASSERT(m && m->kind == BROKER_SRC_HF);
	T_EQ_STR(m->path, want);
	m = broker_config_model(&c, "tiny-v1");
	snprintf(want, sizeof want, "%s/hub/models--acme--tiny/snapshots/beef01/tiny-q8_0.gguf", tmp);
	T_ASSERT(m && m->kind == BROKER_SRC_GGUF);
	T_EQ_STR(m->path, want);
	T_EQ_STR(m->arena, "/tmp/t1.arena");
	m = broker_config_model(&c, "sha");
	T_ASSERT(m && m->kind == BROKER_SRC_HF);
	/* changes that restart an engine, and those that do not */
	struct broker_model_conf a = c.models[0], b = c.models[0];
	T_ASSERT(broker_model_conf_same(&a, &b));
	b.keep_alive_s = 99;
	b.stop_after_s = 1;
	snprintf(b.aliases, sizeof b.aliases, "other");
	T_ASSERT(broker_model_conf_same(&a, &b));
	b.ctx = 1024;
	T_ASSERT(!broker_model_conf_same(&a, &b));
	/* HF_HOME/hub when HF_HUB_CACHE is not set */
	unsetenv("HF_HUB_CACHE");
	setenv("HF_HOME", tmp, 1);
	broker_config_defaults(&c);
	T_ASSERT_MSG(broker_config_parse(&c, "[model \"t\"]\nsource = hf:acme/tiny\n", "h.ini", err, sizeof err) == 0, "%s", err);
	unsetenv("HF_HOME");
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
	T_ASSERT(system(cmd) == 0);
}

static void t_models_bad(void)
{
	static struct broker_config c;
	char text[2048], err[1024], hub[128];
	make_sources();
	snprintf(hub, sizeof hub, "%s/hub", tmp);
	setenv("HF_HUB_CACHE", hub, 1);
	const struct {
		const char *fmt, *want;
	} cases[] = {
		{ "[model \"a\"]\nsource = %s/nope\n", "b.ini:2: [model \"a\"] source = '" },
		{ "[model \"a\"]\nsource = %s/empty\n", "b.ini:2: [model \"a\"] source = '" },
		{ "[model \"a\"]\nsource = %s/notgguf.bin\n", "b.ini:2: [model \"a\"] source = '" },
		{ "[model \"a\"]\nsource = hf:acme/absent\n;%s\n", "b.ini:2: [model \"a\"] source = 'hf:acme/absent': acme/absent is not in the local Hugging Face cache" },
		{ "[model \"a\"]\nsource = hf:acme/tiny@v9\n;%s\n", "b.ini:2: [model \"a\"] source = 'hf:acme/tiny@v9': acme/tiny: no snapshot for revision 'v9'" },
		{ "[model \"a\"]\nsource = hf:../x\n;%s\n", "b.ini:2: [model \"a\"] source = 'hf:../x': want hf:ORG/NAME" },
		{ ";%s\n[model \"a\"]\nctx = 512\n", "b.ini:3: [model \"a\"] has no source" },
		{ "[model \"a\"]\nsource = %s/hf\nctx = 8\n", "b.ini:3: ctx = '8'" },
		{ "[model \"a\"]\nsource = %s/hf\nbackend = gpu\n", "b.ini:3: backend = 'gpu'" },
		{ "[model \"a\"]\nsource = %s/hf\ndtype = q3\n", "b.ini:3: dtype = 'q3'" },
		{ "[model \"a\"]\nsource = %s/hf\nstop_after_s = -1\n", "b.ini:3: stop_after_s = '-1'" },
		{ "[model \"a\"]\nsource = %s/hf\naliases = x, y z, a:b\n", "b.ini:3: aliases = 'x, y z, a:b'" },
		{ "[model \"a\"]\nsource = %s/hf\nengine_flags = --ctx 5 --broker ipc:///x\n", "b.ini:3: engine_flags: --broker is the broker's" },
		{ "[model \"a\"]\nsource = %s/hf\ncolour = red\n", "b.ini:3: unknown key 'colour' in [model \"a\"]" },
		{ "[model \"a\"]\nsource = %s/hf\n[model \"b\"]\nsource = %s/hf\naliases = a\n", "b.ini:2: [model \"a\"]: the name 'a' is also [model \"b\"] (line 4)'s" },
		{ "[model a]\nsource = %s/hf\n[model \"a\"]\npinned = true\n", "b.ini:4: [model \"a\"] appears twice (first on line 2)" },
		{ "[engine \"a\"]\npinned = true\n[model \"a\"]\nsource = %s/hf\n", "b.ini:4: [model \"a\"] and [engine \"a\"] (line 2)" },
		{ "[model \"a b\"]\nsource = %s/hf\n", "b.ini:2: [model \"a b\"]: a model name" },
		{ "[broker]\nengine = baton-engine\n;%s\n", "b.ini:2: engine = 'baton-engine': want an absolute path" },
		{ "[broker]\nrestart_max = 0\n;%s\n", "b.ini:2: restart_max = '0'" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		snprintf(text, sizeof text, cases[i].fmt, tmp, tmp);
		broker_config_defaults(&c);
		err[0] = 0;
		int rc = broker_config_parse(&c, text, "b.ini", err, sizeof err);
		T_ASSERT_MSG(rc == BATON_ECONFIG, "case %zu: rc %d (%s)", i, rc, err);
		T_ASSERT_MSG(strncmp(err, cases[i].want, strlen(cases[i].want)) == 0, "case %zu: \"%s\", want \"%s...\"",
		    i, err, cases[i].want);
	}
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
	T_ASSERT(system(cmd) == 0);
}

T_MAIN(T_CASE(t_good), T_CASE(t_defaults), T_CASE(t_door), T_CASE(t_bad), T_CASE(t_file), T_CASE(t_models),
    T_CASE(t_models_bad))
