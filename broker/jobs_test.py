#!/usr/bin/python3
"""jobs_test.py: programs that are not Baton engines under the broker, as
real processes on the host backend: `baton run` and `baton lease` (memory
lent to a job: normal exit, crash, kill -9 of the job and of the CLI, a TTL
that passes), external engines with real hook commands and a fake HTTP
engine (python http.server), a hook that times out, one that frees
nothing, a process that exits, and the policy's choice among them.

The device: the broker tests' model (CEIL = 28 MiB of cache) on a host
device of 40 or 64 MiB. The last line is "N passed, N failed".
"""
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import CEIL, CLI, ENGINE, MIB, SLOW, BrokerCase, check_gen, run_cases, wait_for  # noqa: E402


def cli(c, *args, timeout=30, wait=True):
    env = dict(c.env)
    env["BATON_BROKER"] = c.control
    if not wait:
        return subprocess.Popen([CLI] + list(args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    return subprocess.run([CLI] + list(args), env=env, capture_output=True, text=True, timeout=timeout)


def entry(c, name):
    return c.eng(name)


def lease_names(c):
    return [e["name"] for e in c.status()["engines"] if e["ctl"] == "lease"]


def wait_leased(c):
    """The name of the one lease, once granted (before that, its job is held)."""
    wait_for("a granted lease", lambda: [e for e in c.status()["engines"]
                                         if e["ctl"] == "lease" and e["state"] == "leased"], timeout=10 * SLOW)
    return lease_names(c)[0]


# ---- baton run ----------------------------------------------------------------------

def t_run_makes_room_and_gives_back(c):
    c.broker()
    a = c.engine("a")
    c.want_holds({"a": CEIL})
    flag = os.path.join(c.dir, "go")
    job = "while [ ! -e %s ]; do sleep 0.05; done; exit 3" % flag
    p = cli(c, "run", "--mib", "20", "--", "sh", "-c", job, wait=False)
    name = wait_leased(c)
    e = entry(c, name)
    assert e["state"] == "leased" and e["resident"] == 20 * MIB and e["pinned"], e
    assert entry(c, "a")["resident"] == 0, entry(c, "a")  # released for the job
    g = c.status()["gpus"][0]
    assert g["held"] == 20 * MIB, g  # the device's books: the job's
    open(flag, "w").close()
    out, errs = p.communicate(timeout=20)
    assert p.returncode == 3, (p.returncode, errs)  # the job's own status
    assert "gave way: a (" in errs and "returned (the job exited 3)" in errs, errs
    wait_for("the lease gone", lambda: not lease_names(c), timeout=5 * SLOW)
    c.want_holds({"a": CEIL}, timeout=10)  # refilled after it
    check_gen(c, a, 1)
    ev = c.events.all("lease-end", name)
    assert ev and ev[0]["bytes"] == 20 * MIB, ev


def t_run_fits_without_reclaim(c):
    c.broker()
    c.engine("a", host_mib=64)
    r = cli(c, "run", "--mib", "8", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "gave way" not in r.stderr, r.stderr
    c.want_holds({"a": CEIL})


def t_run_kill9_job(c):
    c.broker()
    c.engine("a")
    p = cli(c, "run", "--mib", "20", "--", "sleep", "60", wait=False)
    e = entry(c, wait_leased(c))
    os.kill(e["pid"], signal.SIGKILL)
    p.communicate(timeout=20)
    assert p.returncode == 128 + 9, p.returncode
    wait_for("the lease gone", lambda: not lease_names(c), timeout=5 * SLOW)
    c.want_holds({"a": CEIL}, timeout=10)


def t_run_kill9_cli(c):
    # The CLI dies: its job dies with it (PR_SET_PDEATHSIG) and the broker
    # sees the job's pidfd: the lease ends, nothing is left lent.
    c.broker()
    c.engine("a")
    p = cli(c, "run", "--mib", "20", "--", "sleep", "60", wait=False)
    job = entry(c, wait_leased(c))["pid"]
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=10)
    wait_for("the lease gone", lambda: not lease_names(c), timeout=5 * SLOW)
    wait_for("the job gone", lambda: not os.path.exists("/proc/%d/stat" % job) or
             open("/proc/%d/stat" % job).read().split(")")[1].split()[0] in "ZX", timeout=5)
    c.want_holds({"a": CEIL}, timeout=10)
    assert c.status()["gpus"][0]["held"] == CEIL


def t_run_never_takes_from_higher_priority(c):
    c.broker('acquire_wait_ms = 500\n[engine "a"]\npriority = 10\n')
    c.engine("a")
    r = cli(c, "run", "--mib", "20", "--priority", "5", "--", "sh", "-c", "echo started")
    assert r.returncode == 1 and "started" not in r.stdout, (r.returncode, r.stdout)
    assert "no memory for" in r.stderr and "the job was not started" in r.stderr, r.stderr
    assert entry(c, "a")["resident"] == CEIL
    wait_for("the lease gone", lambda: not lease_names(c), timeout=5 * SLOW)
    r = cli(c, "run", "--mib", "20", "--priority", "10", "--", "true")  # the same priority may
    assert r.returncode == 0, r.stderr


def t_run_bad_input(c):
    c.broker()
    c.engine("a")
    for args, want in ((["run", "--", "true"], "--mib"), (["run", "--mib", "8"], "a command after --"),
                       (["run", "--mib", "x", "--", "true"], "--mib wants"),
                       (["lease", "acquire", "--mib", "8"], "--ttl T"),
                       (["lease", "renew"], "the lease's name")):
        r = cli(c, *args)
        assert r.returncode == 2 and want in r.stderr, (args, r.returncode, r.stderr)
    r = cli(c, "run", "--mib", "8", "--gpu", "7", "--", "true")
    assert r.returncode == 2 and "no device with index 7" in r.stderr, r.stderr
    assert not lease_names(c) and entry(c, "a")["resident"] == CEIL


def t_refill_respects_a_lease(c):
    c.broker()
    c.engine("a", "--vram-elastic")
    p = cli(c, "run", "--mib", "20", "--", "sleep", "60", wait=False)
    wait_leased(c)
    n = len(c.events.all("grant", "a"))
    before = entry(c, "a")["resident"]  # shrunk for the job (elastic), or released
    assert before + 20 * MIB <= 40 * MIB, before
    r = cli(c, "refill", "a")  # an operator's refill: granted only what is left beside the job
    assert r.returncode == 0, r.stderr
    g = wait_for("a's grant", lambda: c.events.all("grant", "a")[n:], timeout=5 * SLOW)
    assert g[0]["bytes"] <= 40 * MIB - 20 * MIB, g
    # and the engine maps only that, though the job has not taken its memory
    # (it holds nothing on the host device: a GPU job that starts slowly)
    held = entry(c, "a")["resident"]
    assert held - before <= g[0]["bytes"] and held + 20 * MIB <= 40 * MIB, (before, held, g)
    c.want_holds({"a": held, lease_names(c)[0]: 20 * MIB})
    assert entry(c, lease_names(c)[0])["resident"] == 20 * MIB
    p.send_signal(signal.SIGTERM)  # forwarded to the job
    p.communicate(timeout=10)
    assert p.returncode == 128 + 15, p.returncode
    c.want_holds({"a": CEIL}, timeout=10)


def t_run_over_grant(c):
    # A job that takes more than its lease (a Baton engine without a broker,
    # its whole cache on the host device) is seen in the host device's books
    # (on a GPU: NVML per process): reported, counted at what it holds.
    c.broker()
    c.engine("a", host_mib=64)
    job = [ENGINE, "--name", "job", "--shared-expert-arena", c.arena(), "--listen", "ipc://%s/job.sock" % c.dir,
           "--backend", "host", "--host-device-mib", "64", "--vram-segment-mib", "4"]
    p = cli(c, "run", "--mib", "4", "--name", "big", "--", *job, wait=False)
    try:
        ev = wait_for("lease-over", lambda: c.events.all("lease-over", "big"), timeout=10 * SLOW)
        assert ev[0]["bytes"] > 4 * MIB and "granted 4.0 MiB" in ev[0]["reason"], ev
        held = wait_for("counted", lambda: entry(c, "big")["resident"] >= CEIL, timeout=5 * SLOW)
        assert held
        st = c.status()["gpus"][0]
        assert st["held"] >= 2 * CEIL, st
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=10)
    wait_for("the lease gone", lambda: entry(c, "big") is None, timeout=5 * SLOW)


# ---- baton lease ----------------------------------------------------------------------

def t_lease_ttl_renew_release(c):
    c.broker()
    c.engine("a", host_mib=64)
    r = cli(c, "lease", "acquire", "--mib", "8", "--ttl", "2s", "--name", "train", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["name"] == "train" and j["granted"] == 8 * MIB and j["ttl_s"] == 2.0, j
    for _ in range(4):  # renewed, it outlives its TTL
        time.sleep(0.6)
        r = cli(c, "lease", "renew", "train")
        assert r.returncode == 0, r.stderr
    assert entry(c, "train")["resident"] == 8 * MIB
    r = cli(c, "--json", "--timeout", "5s", "lease", "renew", "train")  # global flags before the command
    assert r.returncode == 0 and json.loads(r.stdout)["name"] == "train", (r.stdout, r.stderr)
    wait_for("TTL passed", lambda: entry(c, "train") is None, timeout=5 * SLOW)
    ev = c.events.all("lease-end", "train")
    assert ev and "TTL of 2 s passed" in ev[0]["reason"], ev
    r = cli(c, "lease", "renew", "train")
    assert r.returncode == 4, r.stderr  # not found
    r = cli(c, "lease", "acquire", "--mib", "8", "--ttl", "60s", "--name", "t2")
    assert r.returncode == 0, r.stderr
    r = cli(c, "lease", "release", "t2")
    assert r.returncode == 0 and "released t2" in r.stdout, r.stdout
    assert entry(c, "t2") is None
    r = cli(c, "release", "a")  # an engine's op on a lease's name is refused
    r2 = cli(c, "lease", "acquire", "--mib", "8", "--ttl", "60s", "--name", "a")
    assert r2.returncode == 1 and "is taken" in r2.stderr, r2.stderr


def t_lease_pid(c):
    c.broker()
    c.engine("a", host_mib=64)
    s = subprocess.Popen(["sleep", "60"])
    try:
        r = cli(c, "lease", "acquire", "--mib", "8", "--pid", str(s.pid))
        assert r.returncode == 0 and "lease job-%d" % s.pid in r.stdout, r.stdout
        assert entry(c, "job-%d" % s.pid)["resident"] == 8 * MIB
        s.kill()
        s.wait()
        wait_for("lease gone", lambda: entry(c, "job-%d" % s.pid) is None, timeout=3 * SLOW)
    finally:
        s.kill()


# ---- external engines --------------------------------------------------------------------

class FakeEngine:
    """A vLLM-like server: POST /sleep?level=1 and /wake_up; answers with
    the memory it holds after ("mib=N") unless told to lie."""

    def __init__(self, held_mib=20):
        self.calls = []
        self.held = held_mib
        self.full = held_mib
        self.lie = False
        me = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n).decode()
                me.calls.append((self.path, body))
                if self.path.startswith("/sleep") and not me.lie:
                    me.held = 0
                elif self.path.startswith("/wake_up"):
                    me.held = me.full
                out = ("mib=%d\n" % me.held).encode()
                if self.path.startswith("/v1/"):  # its OpenAI API: answers while awake only
                    out = json.dumps({"served_by": "fake", "awake": me.held > 0, "echo": json.loads(body)}).encode()
                code = 500 if self.path.startswith("/broken") else 200
                self.send_response(code)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()


def t_external_http_hooks(c):
    c.broker()
    c.engine("a", host_mib=64)
    cli(c, "release", "a")
    f = FakeEngine(40)
    proc = subprocess.Popen(["sleep", "120"])
    try:
        url = "http://127.0.0.1:%d" % f.port
        r = cli(c, "external", "add", "vllm", "--pid", str(proc.pid), "--mib", "40",
                "--release", url + "/sleep?level=1", "--refill", url + "/wake_up", "--priority", "1")
        assert r.returncode == 0 and "ready" in r.stdout, (r.stdout, r.stderr)
        e = entry(c, "vllm")
        assert e["resident"] == 40 * MIB and e["ctl"] == "external:hook" and e["pid"] == proc.pid, e
        r = cli(c, "release", "vllm")
        assert r.returncode == 0, r.stderr
        assert f.calls[-1] == ("/sleep?level=1", "{}"), f.calls
        e = entry(c, "vllm")
        assert e["state"] == "released" and e["resident"] == 0, e
        r = cli(c, "refill", "vllm")
        assert r.returncode == 0, r.stderr
        assert f.calls[-1][0] == "/wake_up" and entry(c, "vllm")["resident"] == 40 * MIB, f.calls
        # a hook that says it succeeded but freed nothing fails as such; still counted
        f.lie = True
        r = cli(c, "release", "vllm")
        assert r.returncode == 1 and "freed nothing" in r.stderr, r.stderr
        assert entry(c, "vllm")["resident"] == 40 * MIB
        assert c.events.all("hook-failed", "vllm")
        f.lie = False
        # a policy victim like an engine: a's refill takes it (idle, lowest priority)
        r = cli(c, "refill", "a")
        assert r.returncode == 0, r.stderr
        assert entry(c, "a")["resident"] == CEIL and entry(c, "vllm")["resident"] == 0, c.holds()
        r = cli(c, "external", "remove", "vllm")
        assert r.returncode == 0 and entry(c, "vllm") is None
    finally:
        proc.kill()
        f.close()


def t_external_command_hooks_timeout_and_exit(c):
    c.broker()
    c.engine("a", host_mib=64)
    proc = subprocess.Popen(["sleep", "120"])
    mark = os.path.join(c.dir, "released")
    try:
        r = cli(c, "external", "add", "job", "--pid", str(proc.pid), "--mib", "12",
                "--release", "echo $BATON_ACTION $BATON_PID > %s; echo mib=0" % mark,
                "--refill", "sleep 5", "--hook-timeout", "0.5s")
        assert r.returncode == 0, r.stderr
        r = cli(c, "release", "job")
        assert r.returncode == 0, r.stderr
        assert open(mark).read().split() == ["release", str(proc.pid)]
        t0 = time.time()
        r = cli(c, "refill", "job")
        assert r.returncode == 1 and "timed out after 0.5 s" in r.stderr, r.stderr
        assert time.time() - t0 < 4, time.time() - t0
        proc.kill()
        proc.wait()
        wait_for("gone", lambda: entry(c, "job")["state"] == "gone", timeout=3 * SLOW)
        assert entry(c, "job")["resident"] == 0
        assert c.events.all("dead", "job")
    finally:
        proc.kill()


def t_external_configured_policy(c):
    # Two external engines from the configuration, priorities 1 and 5; an
    # engine's refill takes the lowest priority idle one, not the other.
    p1 = subprocess.Popen(["sleep", "120"])
    p5 = subprocess.Popen(["sleep", "120"])
    pidf = os.path.join(c.dir, "x5.pid")
    with open(pidf, "w") as f:
        f.write("%d\n" % p5.pid)
    log = os.path.join(c.dir, "hooks.log")
    try:
        c.broker('[external "x1"]\npid = %d\ngpu = host-0\nmib = 20\npriority = 1\n'
                 'release = echo x1 release >> %s\nrefill = echo x1 refill >> %s\n'
                 '[external "x5"]\npid_file = %s\ngpu = host-0\nmib = 20\npriority = 5\n'
                 'release = echo x5 release >> %s\nrefill = echo x5 refill >> %s\n'
                 % (p1.pid, log, log, pidf, log, log))
        c.engine("a", host_mib=64)
        wait_for("a holds", lambda: entry(c, "a")["resident"] == CEIL, timeout=10 * SLOW)
        assert open(log).read().split("\n")[0] == "x1 release", open(log).read()
        assert entry(c, "x1")["state"] == "released" and entry(c, "x5")["resident"] == 20 * MIB
        # taken for a: once a gives its memory back, x1 comes back by itself
        r = cli(c, "release", "a")
        assert r.returncode == 0, r.stderr
        wait_for("x1 back", lambda: entry(c, "x1")["resident"] == 20 * MIB, timeout=5 * SLOW)
        assert open(log).read().split("\n")[:2] == ["x1 release", "x1 refill"], open(log).read()
        # an operator's release stays released
        r = cli(c, "release", "x5")
        time.sleep(0.5)
        assert entry(c, "x5")["resident"] == 0 and "x5 refill" not in open(log).read()
        r = cli(c, "refill", "x5")
        assert r.returncode == 0 and entry(c, "x5")["resident"] == 20 * MIB, r.stderr
        r = cli(c, "park", "x1")  # no CUDA driver here: refused with the reason, left running
        assert r.returncode == 1 and ("CUDA" in r.stderr or "libcuda" in r.stderr), r.stderr
        assert entry(c, "x1")["state"] == "ready" and entry(c, "x1")["resident"] == 20 * MIB
    finally:
        p1.kill()
        p5.kill()


def t_parked_across_restart(c):
    # A broker that restarts finds a process its predecessor parked (the
    # state file beside the pins'), counts it parked (nothing on the device),
    # resumes it only after a grant, and sees it die while parked.
    proc = subprocess.Popen(["sleep", "120"])
    big = subprocess.Popen(["sleep", "120"])
    try:
        with open(os.path.join(c.dir, "broker.state.parked"), "w") as f:
            json.dump({"version": 1, "parked": {"train": {"pid": proc.pid, "bytes": 60 * MIB, "gpu": "host-0"},
                                                "big": {"pid": big.pid, "bytes": 100 * MIB, "gpu": "host-0"}}}, f)
        c.broker('acquire_wait_ms = 500\n[external "train"]\npid = %d\ngpu = host-0\nmib = 60\nrelease = park\n'
                 '[external "big"]\npid = %d\ngpu = host-0\nrelease = park\n' % (proc.pid, big.pid))
        c.engine("a", host_mib=64)
        e = entry(c, "train")
        assert e["state"] == "parked" and e["resident"] == 0 and e["ctl"] == "external:park", e
        # more than the device could ever give: never granted, so never restored
        r = cli(c, "resume", "big")
        assert r.returncode == 1 and "no memory for big" in r.stderr, r.stderr
        assert "cannot resume" not in open(c.log("broker")).read()
        # a resume is a refill: granted first (a gives way), only then the
        # driver is called (none here: refused with its reason, still parked)
        r = cli(c, "resume", "train")
        assert r.returncode == 1 and "cannot resume: no CUDA driver" in r.stderr, r.stderr
        assert entry(c, "train")["state"] == "parked" and entry(c, "a")["resident"] == 0
        log = open(c.log("broker")).read()
        assert log.index("release (for train)") < log.index("cannot resume"), log
        assert c.status()["gpus"][0]["held"] == 0  # the grant went back with the failure
        proc.kill()
        proc.wait()
        wait_for("gone", lambda: entry(c, "train")["state"] == "gone", timeout=3 * SLOW)
        ev = c.events.all("dead", "train")
        assert ev and ev[0]["reason"] == "died while parked", ev
        assert "60.0 MiB checkpoint in host memory" in open(c.log("broker")).read()
        kept = json.load(open(os.path.join(c.dir, "broker.state.parked")))
        assert list(kept["parked"]) == ["big"], kept  # the dead one is gone from the file
    finally:
        proc.kill()
        big.kill()


def proc_state(pid):
    return open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0]


def t_park_policy_end_to_end(c):
    # With a stand-in for the CUDA driver (BATON_TEST_PARK_DRIVER=fake: a
    # checkpoint stops the process, a restore continues it), the whole
    # parking path: an engine that needs memory gets the lowest-priority idle
    # external parked, the state file says so, and once the engine gives its
    # memory back the process is resumed (after its grant) and runs again.
    c.env["BATON_TEST_PARK_DRIVER"] = "fake"
    p1 = subprocess.Popen(["sleep", "120"])
    p5 = subprocess.Popen(["sleep", "120"])
    try:
        c.broker('[external "x1"]\npid = %d\ngpu = host-0\nmib = 20\npriority = 1\nrelease = park\n'
                 '[external "x5"]\npid = %d\ngpu = host-0\nmib = 20\npriority = 5\nrelease = park\n'
                 % (p1.pid, p5.pid))
        c.engine("a", host_mib=64)
        wait_for("a holds", lambda: entry(c, "a")["resident"] == CEIL, timeout=10 * SLOW)
        x1, x5 = entry(c, "x1"), entry(c, "x5")
        assert x1["state"] == "parked" and x1["resident"] == 0 and x5["state"] == "ready", (x1, x5)
        # SIGSTOP is delivered after kill() returns: the stop is waited for
        wait_for("x1 stopped", lambda: proc_state(p1.pid) == "T", timeout=2 * SLOW)
        assert proc_state(p5.pid) != "T"
        kept = json.load(open(os.path.join(c.dir, "broker.state.parked")))
        assert kept["parked"]["x1"]["pid"] == p1.pid and kept["parked"]["x1"]["bytes"] == 20 * MIB, kept
        st = json.loads(cli(c, "status", "--json").stdout)
        assert [e for e in st["engines"] if e["name"] == "x1"][0]["parked"] is True
        r = cli(c, "release", "a")
        assert r.returncode == 0, r.stderr
        wait_for("x1 resumed", lambda: entry(c, "x1")["state"] == "ready", timeout=5 * SLOW)
        assert entry(c, "x1")["resident"] == 20 * MIB and proc_state(p1.pid) != "T"
        assert json.load(open(os.path.join(c.dir, "broker.state.parked")))["parked"] == {}
        ev = [e for e in c.events.all(engine="x1") if e["kind"] in ("grant", "refill")]
        assert [e["kind"] for e in ev] == ["grant", "refill"], ev  # restored only after its grant
        assert ev[0]["bytes"] == 20 * MIB, ev
        # by hand: park, then resume
        r = cli(c, "park", "x5")
        assert r.returncode == 0 and "parked" in r.stdout, (r.stdout, r.stderr)
        wait_for("x5 stopped", lambda: proc_state(p5.pid) == "T", timeout=2 * SLOW)
        r = cli(c, "park", "x5")
        assert r.returncode == 1 and "parked already" in r.stderr, r.stderr
        r = cli(c, "resume", "x5")
        assert r.returncode == 0 and entry(c, "x5")["state"] == "ready" and proc_state(p5.pid) != "T", r.stderr
    finally:
        p1.kill()
        p5.kill()


def t_park_refused_left_running(c):
    c.env["BATON_TEST_PARK_DRIVER"] = "fake-refuse"
    p = subprocess.Popen(["sleep", "120"])
    try:
        c.broker()
        c.engine("a", host_mib=64)
        r = cli(c, "external", "add", "x", "--pid", str(p.pid), "--mib", "8", "--release", "park")
        assert r.returncode == 0, r.stderr
        r = cli(c, "park", "x")
        assert r.returncode == 1 and "operation not supported (801)" in r.stderr and "left running" in r.stderr, \
            r.stderr
        assert entry(c, "x")["state"] == "ready" and entry(c, "x")["resident"] == 8 * MIB
        assert proc_state(p.pid) != "T"
    finally:
        p.kill()


def t_run_waits_for_a_slow_hook(c):
    # An external engine whose release takes 1.5 s (a vLLM sleep copying its
    # weights out): a reclaim under way is waited for past acquire_wait_ms.
    proc = subprocess.Popen(["sleep", "120"])
    try:
        c.broker('acquire_wait_ms = 500\n[external "slow"]\npid = %d\ngpu = host-0\nmib = 40\n'
                 'release = sleep 1.5; echo mib=0\nrefill = echo mib=40\n' % proc.pid)
        c.engine("a", host_mib=64)
        wait_for("a holds", lambda: entry(c, "a")["resident"] == CEIL, timeout=10 * SLOW)
        if entry(c, "slow")["resident"] == 0:  # a's startup refill took it: back to the external
            assert cli(c, "release", "a").returncode == 0
            assert cli(c, "refill", "slow").returncode == 0
        assert cli(c, "release", "a").returncode == 0
        t0 = time.time()
        r = cli(c, "run", "--mib", "40", "--", "true")
        assert r.returncode == 0 and "slow (release)" in r.stderr, r.stderr
        assert time.time() - t0 >= 1.4
    finally:
        proc.kill()


def t_run_wait(c):
    # --wait: a job waits longer than acquire_wait_ms for memory that is not
    # free yet (here a pinned engine, unpinned after a second).
    c.broker('acquire_wait_ms = 300\n')
    c.engine("a")
    assert cli(c, "pin", "a").returncode == 0
    t0 = time.time()
    r = cli(c, "run", "--mib", "20", "--", "true")
    assert r.returncode == 1 and time.time() - t0 < 3, r.stderr
    p = cli(c, "run", "--mib", "20", "--wait", "10s", "--", "true", wait=False)
    time.sleep(1.0)
    assert p.poll() is None  # still waiting
    assert cli(c, "unpin", "a").returncode == 0
    out, errs = p.communicate(timeout=20)
    assert p.returncode == 0 and "gave way: a (" in errs, errs


def t_external_bad_input(c):
    c.broker()
    c.engine("a", host_mib=64)
    for args, want in ((["external", "add", "x", "--mib", "4"], "pid, pid_file or unit"),
                       (["external", "add", "x", "--pid", "1", "--release", "true"], "refill hook too"),
                       (["external", "add", "x", "--pid", "1", "--url", "ftp://x"], "url ="),
                       (["external", "add", "a", "--pid", "1"], "is taken")):
        r = cli(c, *args)
        assert r.returncode in (1, 2) and want in r.stderr, (args, r.stderr)
    r = cli(c, "park", "nobody")
    assert r.returncode == 4, r.stderr
    names = [e["name"] for e in c.status()["engines"]]
    assert names == ["a"], names


def t_http_twins(c):
    h = c.http_broker()
    c.engine("a")
    st, out, _ = h.post("/v1/leases", {"mib": 20, "ttl_s": 30, "name": "comfy", "what": "a ComfyUI render"},
                        token=False)
    assert st == 401, (st, out)  # token-protected like every mutating call
    assert entry(c, "comfy") is None
    st, out, _ = h.post("/v1/leases", {"mib": 20, "ttl_s": 30, "name": "comfy", "what": "a ComfyUI render"})
    assert st == 200 and out["granted"] == 20 * MIB and "a (" in out["gave_way"], (st, out)
    e = entry(c, "comfy")
    assert e["state"] == "leased" and e["model"] == "a ComfyUI render", e
    st, out, _ = h.get("/v1/status")
    kinds = {x["name"]: x["kind"] for x in out["engines"]}
    assert kinds == {"a": "engine", "comfy": "lease"}, kinds
    st, text, _ = h.get("/metrics")
    assert 'baton_engine_kind{engine="comfy",kind="lease"} 1' in text, text[:400]
    st, out, _ = h.post("/v1/leases/comfy/renew", {"ttl_s": 60})
    assert st == 200 and out["ttl_s"] == 60, out
    st, out, _ = h.post("/v1/leases", {"mib": 8})  # nothing would end it
    assert st == 400 and "a pid to watch or a TTL" in out["error"]["message"], out
    st, out, _ = h.post("/v1/leases", {"mib": 8, "ttl_s": 5, "bogus": 1})
    assert st == 400, out
    st, out, _ = h.post("/v1/leases/comfy/release", {})
    assert st == 200, out
    assert entry(c, "comfy") is None
    c.want_holds({"a": CEIL}, timeout=10)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        st, out, _ = h.post("/v1/externals", {"name": "llama", "pid": proc.pid, "mib": 4,
                                              "release": "echo mib=0", "refill": "echo mib=4"})
        assert st == 403 and "runs as the broker's user" in out["error"]["message"], (st, out)
        st, out, _ = h.post("/v1/externals", {"name": "llama", "pid": proc.pid, "release": "http://10.1.2.3/sleep",
                                              "refill": "http://10.1.2.3/wake_up"})
        assert st == 403 and "loopback" in out["error"]["message"], (st, out)
        f = FakeEngine(4)
        url = "http://127.0.0.1:%d" % f.port
        st, out, _ = h.post("/v1/externals", {"name": "llama", "pid": proc.pid, "mib": 4,
                                              "release": url + "/sleep", "refill": url + "/wake_up"})
        assert st == 200 and out["state"] == "ready", (st, out)
        st, out, _ = h.post("/v1/engines/llama/release", {})
        assert st == 200 and entry(c, "llama")["resident"] == 0, (st, out)
        st, out, _ = h.post("/v1/externals/llama/park", {})
        assert st in (409, 500, 503) or out.get("ok") is not True, (st, out)
        st, out, _ = h.get("/v1/status")
        x = [e for e in out["engines"] if e["name"] == "llama"][0]
        assert x["kind"] == "external" and x["release_by"] == "hook" and x["parked"] is False, x
        st, out, _ = h.post("/v1/externals/llama/remove", {})
        assert st == 200 and entry(c, "llama") is None, out
    finally:
        proc.kill()


def t_front_door_routes_and_wakes(c):
    # An external engine with url and model: the front door routes its model
    # to it, and a request while it is released wakes it (its refill hook)
    # before it is forwarded.
    h = c.http_broker()
    c.engine("a", host_mib=64)
    f = FakeEngine(40)
    proc = subprocess.Popen(["sleep", "120"])
    try:
        url = "http://127.0.0.1:%d" % f.port
        st, out, _ = h.post("/v1/externals", {"name": "vllm", "pid": proc.pid, "mib": 40, "url": url,
                                              "model": "qwen-ext", "release": url + "/sleep?level=1",
                                              "refill": url + "/wake_up"})
        assert st == 200, out
        wait_for("routable", lambda: any(m["id"] == "qwen-ext" for m in h.get("/v1/models")[1]["data"]),
                 timeout=5 * SLOW)
        chat = {"model": "qwen-ext", "messages": [{"role": "user", "content": "hi"}]}
        st, out, _ = h.post("/v1/chat/completions", chat)
        assert st == 200 and out["served_by"] == "fake" and out["awake"], (st, out)
        r = cli(c, "release", "vllm")
        assert r.returncode == 0 and f.held == 0, r.stderr
        n = len(f.calls)
        st, out, _ = h.post("/v1/chat/completions", chat)
        assert st == 200 and out["awake"], (st, out)  # woken first
        paths = [p for p, _ in f.calls[n:]]
        assert paths[0] == "/wake_up" and paths[-1] == "/v1/chat/completions", paths
        assert entry(c, "vllm")["resident"] == 40 * MIB
    finally:
        proc.kill()
        f.close()


CASES = [t_run_makes_room_and_gives_back, t_run_fits_without_reclaim, t_run_kill9_job, t_run_kill9_cli,
         t_run_never_takes_from_higher_priority, t_run_bad_input, t_run_over_grant, t_refill_respects_a_lease,
         t_lease_ttl_renew_release, t_lease_pid, t_external_http_hooks,
         t_external_command_hooks_timeout_and_exit, t_external_configured_policy, t_external_bad_input,
         t_http_twins, t_front_door_routes_and_wakes, t_parked_across_restart, t_park_policy_end_to_end,
         t_park_refused_left_running, t_run_waits_for_a_slow_hook, t_run_wait]


def main():
    return run_cases(CASES, sys.argv[1:], make=BrokerCase, logs=("broker", "a"))


if __name__ == "__main__":
    sys.exit(main())
