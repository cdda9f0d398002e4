/*
 * external_conf_test.c: [external "NAME"] sections and the keys they share
 * with `baton external add` (external_conf.c): every key read, and each
 * bad one rejected with its line named.
 */
#include <string.h>

#include "broker/broker.h"
#include "tests/t.h"

#define M (1024ull * 1024ull)

static void t_sections(void)
{
	static struct broker_config c;
	char err[512] = "";
	broker_config_defaults(&c);
	const char *text =
	    "[external \"vllm\"]\n"
	    "pid_file = /run/vllm.pid\n"
	    "gpu = GPU-1234\n"
	    "priority = -2\n"
	    "url = http://127.0.0.1:8000/\n"
	    "model = qwen\n"
	    "mib = 30000\n"
	    "release = http://127.0.0.1:8000/sleep?level=1\n"
	    "refill = http://127.0.0.1:8000/wake_up\n"
	    "hook_timeout_s = 90\n"
	    "[external comfy]\n"
	    "unit = comfyui.service\n"
	    "release = park\n"
	    "pinned = true\n"
	    "[external \"job\"]\n"
	    "pid = 4242\n";
	T_OK(broker_config_parse(&c, text, "t.ini", err, sizeof err));
	T_EQ_INT(c.n_externals, 3);
	const struct broker_external_conf *v = &c.externals[0];
	T_EQ_STR(v->name, "vllm");
	T_EQ_STR(v->pid_file, "/run/vllm.pid");
	T_EQ_STR(v->gpu, "GPU-1234");
	T_EQ_INT(v->priority, -2);
	T_EQ_STR(v->url, "http://127.0.0.1:8000"); /* the trailing slash dropped */
	T_EQ_STR(v->model, "qwen");
	T_EQ_INT(v->mib, 30000);
	T_EQ_INT(v->mode, BROKER_EXT_HOOK);
	T_EQ_STR(v->release, "http://127.0.0.1:8000/sleep?level=1");
	T_ASSERT(v->hook_timeout_s == 90);
	T_EQ_INT(c.externals[1].mode, BROKER_EXT_PARK);
	T_ASSERT(c.externals[1].pinned);
	T_EQ_STR(c.externals[1].unit, "comfyui.service");
	T_EQ_INT(c.externals[2].pid, 4242);
	T_EQ_INT(c.externals[2].mode, BROKER_EXT_NONE);
	T_ASSERT(c.externals[2].hook_timeout_s == 30);
}

static void t_bad(void)
{
	static const struct { const char *text, *want; } rows[] = {
		{ "[external \"x\"]\npid = 1\npid = x\n", "t.ini:3: [external \"x\"]: pid = 'x': want a process id" },
		{ "[external \"x\"]\nport = 1\n", "t.ini:2: [external \"x\"]: unknown key 'port'" },
		{ "[external \"x\"]\npid_file = run/x.pid\n", "want an absolute path" },
		{ "[external \"x\"]\nurl = https://x\n", "want http://HOST:PORT" },
		{ "[external \"x\"]\nrelease = https://x/sleep\n", "only plain http://" },
		{ "[external \"x\"]\nrelease = resume\n", "park is a release, resume its refill" },
		{ "[external \"x\"]\nhook_timeout_s = 0\n", "more than 0" },
		{ "[external \"x y\"]\npid = 1\n", "letters, digits" },
		{ "[external \"x\"]\npid = 1\n[broker]\nidle_release_s = 0\n[external \"x\"]\npid = 2\n", "t.ini:6: [external \"x\"] appears twice (first on line 2)" },
		/* the checks of the whole section, at the end, naming its line */
		{ "[broker]\n[external \"x\"]\nmib = 4\n", "t.ini:3: [external \"x\"]: name its process by one of pid, pid_file or unit (none given)" },
		{ "[external \"x\"]\npid = 1\nunit = a.service\n", "several given" },
		{ "[external \"x\"]\npid = 1\nrelease = true\n", "a release hook wants a refill hook too" },
		{ "[external \"x\"]\npid = 1\nrelease = park\nrefill = echo\n", "comes back by resume" },
		{ "[external \"x\"]\npid = 1\nrefill = echo\n", "a refill hook without a release hook" },
		{ "[external \"x\"]\npid = 1\nmodel = m\n", "wants url" },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		static struct broker_config c;
		char err[512] = "";
		broker_config_defaults(&c);
		int rc = broker_config_parse(&c, rows[i].text, "t.ini", err, sizeof err);
		T_ASSERT_MSG(rc == BATON_ECONFIG, "row %zu: rc %d", i, rc);
		T_ASSERT_MSG(strstr(err, rows[i].want) != NULL, "row %zu: %s", i, err);
	}
}

T_MAIN(T_CASE(t_sections), T_CASE(t_bad))
