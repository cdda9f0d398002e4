#!/usr/bin/python3
"""deploy_test.py: the deployment files in deploy/ and the systemd
notifications of the broker and the engine.

- make install (DESTDIR, PREFIX) puts programs, units, the sysusers.d file
  and the example configuration in place, rewrites ExecStart= to PREFIX,
  and never overwrites an edited /etc/baton file;
- `systemd-analyze verify` passes on the installed units (ExecStart= paths
  pointed at the DESTDIR copy), and fails on a deliberately broken one;
- `systemd-sysusers --root` makes baton a system user (RemoveIPC spares it);
- the units say what the design needs (Type=notify, watchdog,
  RuntimeDirectory=baton, User=baton, the per-instance files), and the
  example configuration is accepted by the programs;
- baton-broker sends READY=1, WATCHDOG=1 at half of $WATCHDOG_USEC (none
  without it, or for another $WATCHDOG_PID, and none while the broker's own
  threads are stopped with ptrace), RELOADING=1 and READY=1 around a
  SIGHUP reload (a bad file refused, the broker going on) and STOPPING=1;
  baton-engine
  READY=1 and STOPPING=1 (a fake $NOTIFY_SOCKET);
- every Kubernetes and Prometheus YAML document loads (python3-yaml), and
  their structure holds: the kinds, the GPU limit, /run/baton and /dev/shm
  shared by every container, the scrape port = the broker's HTTP port in
  the ConfigMap, the ConfigMap's broker.ini accepted by baton-broker --check;
  promtool checks the scrape configuration;
- deploy/k8s/fleet: a DaemonSet per node pool with its fleet file (one the
  broker takes), a label per model it serves, a Service and an
  InferencePool per model selecting exactly its pools, endpoint pickers
  reading gauges a broker serves, the route by model to its pool;
- install-deps gets promtool without installing the prometheus package
  (which starts a server): download, dpkg -x into .deps/bin.

Needs the programs in $BUILD/bin (make builds them first), systemd-analyze
and systemd-sysusers (Debian package systemd) and python3-yaml, both in
scripts/install-deps.sh. The last line is "N passed, N failed".
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = h.BUILD
BIN = os.path.join(ROOT, BUILD, "bin") if not os.path.isabs(BUILD) else os.path.join(BUILD, "bin")
PROGS = ["baton", "baton-arena", "baton-broker", "baton-engine", "baton-proto-tool"]
UNITS = ["baton-broker.service", "baton-engine@.service", "baton-arena@.service"]


def run(cmd, **kw):
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.STDOUT)
    kw.setdefault("timeout", 60)
    return subprocess.run(cmd, text=True, **kw)


def install_progs():
    """What make install installs from $BUILD (the Makefile's INSTALL_PROGS)."""
    r = run(["make", "-s", "--no-print-directory", "--eval",
             "print-install-progs: ; @echo $(INSTALL_PROGS)", "print-install-progs", "BUILD=" + BUILD], cwd=ROOT)
    assert r.returncode == 0, r.stdout
    return r.stdout.split()


def make_install(destdir, prefix="/usr/local", confdir=None):
    """make install with the programs already built in $BUILD (-o: never
    remade here, whatever flags the build had)."""
    progs = install_progs()
    for p in progs:
        assert os.access(os.path.join(ROOT, p), os.X_OK), "%s is not built" % p
    cmd = ["make", "-s", "--no-print-directory", "install", "BUILD=" + BUILD, "DESTDIR=" + destdir,
           "PREFIX=" + prefix]
    if confdir:
        cmd.append("CONFDIR=" + confdir)
    for p in progs:
        cmd += ["-o", p]
    r = run(cmd, cwd=ROOT)
    assert r.returncode == 0, "make install: %d\n%s" % (r.returncode, r.stdout)
    return r


def unit_keys(path):
    """{(section, key): [values]} of a unit file (keys may repeat)."""
    out, sec = {}, None
    for line in open(path):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            sec = line.strip("[]")
            continue
        k, _, v = line.partition("=")
        out.setdefault((sec, k.strip()), []).append(v.strip())
    return out


def one(keys, sec, k):
    v = keys.get((sec, k))
    assert v and len(v) == 1, "[%s] %s: %r" % (sec, k, v)
    return v[0]


# ---- make install ---------------------------------------------------------------

def t_install_layout():
    names = sorted(os.path.basename(p) for p in install_progs())
    assert set(PROGS) <= set(names), names
    assert not [n for n in names if n.endswith("-bench")], names
    with tempfile.TemporaryDirectory() as d:
        make_install(d)
        assert sorted(os.listdir(os.path.join(d, "usr/local/bin"))) == names
        for p in names:
            f = os.path.join(d, "usr/local/bin", p)
            assert os.access(f, os.X_OK), f
        for u in UNITS:
            f = os.path.join(d, "usr/local/lib/systemd/system", u)
            assert oct(os.stat(f).st_mode & 0o777) == "0o644", f
        assert os.path.exists(os.path.join(d, "usr/local/lib/sysusers.d/baton.conf"))
        for c in ["broker.ini", "arenas/example.conf", "engines/example.conf"]:
            for base in ["etc/baton", "usr/local/share/baton/etc"]:
                f = os.path.join(d, base, c)
                assert open(f).read() == open(os.path.join(HERE, "etc", c)).read(), f
        for m in ["man1/baton.1", "man1/baton-arena.1", "man5/baton-broker.ini.5", "man8/baton-broker.8",
                  "man8/baton-engine.8"]:  # docs/man/*.scd, made by scdoc
            f = os.path.join(d, "usr/local/share/man", m)
            assert '.TH "%s"' % os.path.basename(m).rsplit(".", 1)[0] in open(f).read(), f
            assert oct(os.stat(f).st_mode & 0o777) == "0o644", f
        # broker.ini may hold the HTTP token: not readable by others
        assert oct(os.stat(os.path.join(d, "etc/baton/broker.ini")).st_mode & 0o777) == "0o640"
        # an edited configuration is kept on a second install
        ini = os.path.join(d, "etc/baton/broker.ini")
        with open(ini, "w") as f:
            f.write("[broker]\nidle_release_s = 7\n")
        make_install(d)
        assert open(ini).read() == "[broker]\nidle_release_s = 7\n"
    # another PREFIX: ExecStart= follows it
    with tempfile.TemporaryDirectory() as d:
        make_install(d, prefix="/opt/baton")
        k = unit_keys(os.path.join(d, "opt/baton/lib/systemd/system/baton-broker.service"))
        assert one(k, "Service", "ExecStart").startswith("/opt/baton/bin/baton-broker "), k
        k = unit_keys(os.path.join(d, "opt/baton/lib/systemd/system/baton-engine@.service"))
        assert one(k, "Service", "ExecStart").startswith("/opt/baton/bin/baton-engine "), k


# ---- systemd-analyze verify -------------------------------------------------------

def verify_units(d, units):
    """systemd-analyze verify: (ok, output). Warnings count as failures:
    an unknown key or a bad value is only a warning to systemd."""
    r = run(["systemd-analyze", "verify", "--man=no"] + units, timeout=30)
    return r.returncode == 0 and not r.stdout.strip(), r.stdout


def staged_units(d):
    """The installed units, their paths pointed into DESTDIR d, templates
    given an instance name, in d/verify; returns their paths."""
    unitdir = os.path.join(d, "usr/local/lib/systemd/system")
    vd = os.path.join(d, "verify")
    os.makedirs(vd)
    out = []
    for u in UNITS:
        text = open(os.path.join(unitdir, u)).read()
        assert "/usr/local/bin/" in text, u
        text = text.replace("/usr/local/bin/", d + "/usr/local/bin/").replace("/etc/baton/", d + "/etc/baton/")
        name = u.replace("@.service", "@example.service")
        with open(os.path.join(vd, name), "w") as f:
            f.write(text)
        out.append(os.path.join(vd, name))
    return out


def t_systemd_verify():
    assert shutil.which("systemd-analyze"), "systemd-analyze missing (Debian package systemd)"
    with tempfile.TemporaryDirectory() as d:
        make_install(d)
        units = staged_units(d)
        ok, out = verify_units(d, units)
        assert ok, "systemd-analyze verify:\n" + out
        # The check catches a broken unit: a bad value, an unknown key, a
        # missing binary, each alone.
        src = open(units[0]).read()
        breakages = [
            ("Type=notify", "Type=notifyy"),
            ("WatchdogSec=30s", "WatchdogSecs=30s"),
            (d + "/usr/local/bin/baton-broker", d + "/usr/local/bin/baton-brokerr"),
        ]
        for old, new in breakages:
            assert old in src, old
            bad = os.path.join(d, "verify", "baton-broker.service")
            with open(bad, "w") as f:
                f.write(src.replace(old, new))
            ok, out = verify_units(d, [bad])
            assert not ok, "verify passed a unit with %r:\n%s" % (new, out)
        with open(units[0], "w") as f:
            f.write(src)


def t_sysusers_system_user():
    assert shutil.which("systemd-sysusers"), "systemd-sysusers missing (Debian package systemd)"
    with tempfile.TemporaryDirectory() as d:
        make_install(d)
        os.makedirs(os.path.join(d, "root/etc"))
        r = run(["systemd-sysusers", "--root=" + os.path.join(d, "root"),
                 os.path.join(d, "usr/local/lib/sysusers.d/baton.conf")])
        assert r.returncode == 0, r.stdout
        ent = [l.split(":") for l in open(os.path.join(d, "root/etc/passwd")) if l.startswith("baton:")]
        assert len(ent) == 1, ent
        uid = int(ent[0][2])
        # a system user: logind's RemoveIPC leaves its /dev/shm files alone
        assert 0 < uid < 1000, uid
        assert any(l.startswith("baton:") for l in open(os.path.join(d, "root/etc/group")))


# ---- what the units say -----------------------------------------------------------

def t_units_content():
    sd = os.path.join(HERE, "systemd")
    b = unit_keys(os.path.join(sd, "baton-broker.service"))
    assert one(b, "Service", "Type") == "notify"
    assert one(b, "Service", "RuntimeDirectory") == "baton"
    assert one(b, "Service", "RuntimeDirectoryPreserve") == "yes"
    assert re.fullmatch(r"\d+s?", one(b, "Service", "WatchdogSec"))
    assert one(b, "Service", "ExecStart") == "/usr/local/bin/baton-broker --config /etc/baton/broker.ini"
    assert one(b, "Service", "ExecReload") == "/bin/kill -HUP $MAINPID"
    for k in (b, unit_keys(os.path.join(sd, "baton-engine@.service")),
              unit_keys(os.path.join(sd, "baton-arena@.service"))):
        assert one(k, "Service", "User") == "baton" and one(k, "Service", "Group") == "baton"
        assert one(k, "Service", "DynamicUser") == "no"
        assert ("Service", "PrivateDevices") not in k  # GPUs stay visible
        assert int(one(k, "Service", "LimitNOFILE")) >= 65536  # not the soft 1024
    e = unit_keys(os.path.join(sd, "baton-engine@.service"))
    assert one(e, "Service", "Type") == "notify"
    assert one(e, "Service", "EnvironmentFile") == "/etc/baton/engines/%i.conf"
    assert "baton-broker.service" in one(e, "Unit", "After")
    assert "baton-arena@${BATON_ARENA}.service" in one(e, "Service", "ExecStartPre")
    assert one(e, "Service", "RuntimeDirectory") == "baton"
    assert one(e, "Service", "RuntimeDirectoryPreserve") == "yes"
    for k in (b, e):  # the socket directory: writable by the user baton only
        assert one(k, "Service", "RuntimeDirectoryMode") == "0750"
    a = unit_keys(os.path.join(sd, "baton-arena@.service"))
    assert one(a, "Service", "Type") == "oneshot" and one(a, "Service", "RemainAfterExit") == "yes"
    assert one(a, "Service", "EnvironmentFile") == "/etc/baton/arenas/%i.conf"
    assert one(a, "Service", "ExecStart") == "/usr/local/bin/baton-arena create $ARENA_SOURCE %i"
    # every flag the units and the example pass is one the program knows
    eng_help = run([os.path.join(BIN, "baton-engine"), "--help"]).stdout
    flags = re.findall(r"--[a-z-]+", one(e, "Service", "ExecStart"))
    ex = dict(l.strip().split("=", 1) for l in open(os.path.join(HERE, "etc/engines/example.conf"))
              if l.strip() and not l.startswith("#"))
    flags += re.findall(r"--[a-z-]+", ex["BATON_ENGINE_ARGS"])
    for f in flags:
        assert f in eng_help, "baton-engine has no %s" % f
    arena_help = run([os.path.join(BIN, "baton-arena"), "--help"]).stdout
    for l in open(os.path.join(HERE, "etc/arenas/example.conf")):
        if "ARENA_SOURCE=" in l:
            for f in re.findall(r"--[a-z-]+", l):
                assert f in arena_help, "baton-arena has no %s" % f
    r = run([os.path.join(BIN, "baton-broker"), "--config", os.path.join(HERE, "etc/broker.ini"), "--check"])
    assert r.returncode == 0, r.stdout
    assert "http = 127.0.0.1:8420" in r.stdout, r.stdout


# ---- sd_notify ---------------------------------------------------------------------

class Notify:
    """A fake $NOTIFY_SOCKET: collects the datagrams with their times."""

    def __init__(self, d):
        self.path = os.path.join(d, "notify.sock")
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(self.path)
        self.msgs = []
        self.t0 = time.monotonic()

    def collect(self, seconds, until=None):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.s.settimeout(max(0.01, end - time.monotonic()))
            try:
                m = self.s.recv(4096).decode()
            except socket.timeout:
                break
            self.msgs.append((time.monotonic() - self.t0, m))
            if until and until in m:
                break
        return self.msgs

    def has(self, word):
        return [t for t, m in self.msgs if word in m.split("\n")]

    def close(self):
        self.s.close()


def start(cmd, env, d, name):
    log = open(os.path.join(d, name + ".log"), "w")
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True), log


def stop(p, n, what):
    p.send_signal(signal.SIGTERM)
    n.collect(10, until="STOPPING=1")
    assert p.wait(timeout=20) == 0, what + " exit %s" % p.returncode
    assert n.has("STOPPING=1"), n.msgs


def broker_cmd(d):
    return [os.path.join(BIN, "baton-broker"), "--control", "ipc://%s/c.sock" % d,
            "--events", "ipc://%s/e.sock" % d, "--http", "off"]


def t_notify_broker():
    with tempfile.TemporaryDirectory() as d:
        n = Notify(d)
        env = dict(os.environ, NOTIFY_SOCKET=n.path, WATCHDOG_USEC="400000")
        env.pop("WATCHDOG_PID", None)
        p, log = start(broker_cmd(d), env, d, "broker")
        try:
            n.collect(10, until="READY=1")
            ready = n.has("READY=1")
            assert ready, n.msgs
            assert p.stdout.readline().startswith("ready "), "no ready line"
            n.collect(1.5)
            pings = n.has("WATCHDOG=1")
            # every 200 ms: about 7 in 1.5 s; never a gap near 400 ms
            assert len(pings) >= 5, n.msgs
            gaps = [b - a for a, b in zip(pings, pings[1:])]
            assert max(gaps) < 0.35, gaps
            assert min(pings) >= ready[0]
            stop(p, n, "broker")
        finally:
            if p.poll() is None:
                p.kill()
            log.close()
            n.close()
    # no WATCHDOG_USEC, or a WATCHDOG_PID not ours: READY but no pings
    for extra in ({}, {"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"}):
        with tempfile.TemporaryDirectory() as d:
            n = Notify(d)
            env = dict(os.environ, NOTIFY_SOCKET=n.path, **extra)
            if not extra:
                env.pop("WATCHDOG_USEC", None)
            p, log = start(broker_cmd(d), env, d, "broker")
            try:
                n.collect(10, until="READY=1")
                n.collect(0.6)
                assert n.has("READY=1") and not n.has("WATCHDOG=1"), (extra, n.msgs)
                stop(p, n, "broker")
            finally:
                if p.poll() is None:
                    p.kill()
                log.close()
                n.close()


def t_notify_reload():
    """systemctl reload (SIGHUP): RELOADING=1, then READY=1 once the file is
    read again; a bad file is refused the same way and the broker stays."""
    with tempfile.TemporaryDirectory() as d:
        ini = os.path.join(d, "broker.ini")
        with open(ini, "w") as f:
            f.write("[broker]\nidle_release_s = 0\n")
        n = Notify(d)
        env = dict(os.environ, NOTIFY_SOCKET=n.path)
        env.pop("WATCHDOG_USEC", None)
        p, log = start(broker_cmd(d) + ["--config", ini], env, d, "broker")
        try:
            n.collect(10, until="READY=1")
            assert p.stdout.readline().startswith("ready "), "no ready line"
            for text, said in (("[broker]\nidle_release_s = 30\n", "configuration reloaded"),
                               ("[broker]\nidle_release_s = soon\n", "reload refused")):
                with open(ini, "w") as f:
                    f.write(text)
                before = len(n.msgs)
                p.send_signal(signal.SIGHUP)
                n.collect(10, until="READY=1")
                got = [m for _, m in n.msgs[before:]]
                assert got and "RELOADING=1" in got[0].split("\n") and "READY=1" in got[-1].split("\n"), got
                assert any(l.startswith("MONOTONIC_USEC=") for l in got[0].split("\n")), got
                h.wait_for(said, lambda: said in open(os.path.join(d, "broker.log")).read(), timeout=5)
            assert p.poll() is None
            assert "%s:2: idle_release_s" % ini in open(os.path.join(d, "broker.log")).read()
            stop(p, n, "broker")
        finally:
            if p.poll() is None:
                p.kill()
            log.close()
            n.close()


def ptrace_stop_threads(pid, keep):
    """Stops every thread of pid for which keep(tid, comm) is false, each
    alone (PTRACE_SEIZE + PTRACE_INTERRUPT: the others run on); returns a
    function that lets them go, or None when ptrace is not permitted."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    SEIZE, INTERRUPT, DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
    stopped = []
    for tid in sorted(int(x) for x in os.listdir("/proc/%d/task" % pid)):
        comm = open("/proc/%d/task/%d/comm" % (pid, tid)).read().strip()
        if keep(tid, comm):
            continue
        if libc.ptrace(SEIZE, tid, None, None) != 0:
            if not stopped:
                return None
            raise OSError(ctypes.get_errno(), "PTRACE_SEIZE %d" % tid)
        stopped.append(tid)
        assert libc.ptrace(INTERRUPT, tid, None, None) == 0
        os.waitpid(tid, WALL)

    def release():
        for t in stopped:
            libc.ptrace(DETACH, t, None, None)
    return release


def t_watchdog_follows_decision_thread():
    """The pings stop while the broker's own threads (the decision thread,
    the control receivers) are stopped and the main thread and nng's run;
    they come back when the threads go on."""
    with tempfile.TemporaryDirectory() as d:
        n = Notify(d)
        env = dict(os.environ, NOTIFY_SOCKET=n.path, WATCHDOG_USEC="400000")
        env.pop("WATCHDOG_PID", None)
        p, log = start(broker_cmd(d), env, d, "broker")
        release = None
        try:
            n.collect(10, until="READY=1")
            n.collect(0.5)
            assert n.has("WATCHDOG=1"), n.msgs
            release = ptrace_stop_threads(p.pid, lambda tid, comm: tid == p.pid or comm.startswith("nng:"))
            if release is None:
                print("  (ptrace not permitted here: skipped)")
                return
            t1 = time.monotonic() - n.t0
            n.collect(1.2)
            during = [t for t in n.has("WATCHDOG=1") if t > t1 + 0.3]
            release()
            release = None
            t2 = time.monotonic() - n.t0
            n.collect(1.0)
            after = [t for t in n.has("WATCHDOG=1") if t > t2]
            assert not during, "pings while the decision thread was stopped: %r" % during
            assert len(after) >= 2 and after[0] - t2 < 0.5, "no pings after: %r" % after
            stop(p, n, "broker")
            log.flush()
            assert "no status from the decision thread" in open(os.path.join(d, "broker.log")).read()
        finally:
            if release:
                release()
            if p.poll() is None:
                p.kill()
            log.close()
            n.close()


def t_notify_engine():
    with tempfile.TemporaryDirectory() as d:
        arena = os.path.join(d, "m.arena")
        r = run([os.path.join(BIN, "baton-arena"), "create", "--synthetic", "--layers", "2", "--experts", "4",
                 "--top-k", "2", "--d-model", "64", "--d-ff", "32", "--dtype", "f32", "--seed", "1", arena])
        assert r.returncode == 0, r.stdout
        n = Notify(d)
        env = dict(os.environ, NOTIFY_SOCKET=n.path)
        p, log = start([os.path.join(BIN, "baton-engine"), "--name", "e1", "--shared-expert-arena", arena,
                        "--backend", "host", "--host-device-mib", "64", "--expert-cache-release",
                        "--vram-elastic", "--listen", "ipc://%s/e1.sock" % d], env, d, "engine")
        try:
            n.collect(20, until="READY=1")
            assert n.has("READY=1"), n.msgs
            assert p.stdout.readline().startswith("ready "), "no ready line"
            stop(p, n, "engine")
        finally:
            if p.poll() is None:
                p.kill()
            log.close()
            n.close()


# ---- Kubernetes and Prometheus ------------------------------------------------------

def load_k8s():
    docs = []
    for f in sorted(os.listdir(os.path.join(HERE, "k8s"))):
        if f.endswith((".yaml", ".yml")):
            docs += [x for x in yaml.safe_load_all(open(os.path.join(HERE, "k8s", f))) if x]
    return docs


def http_port(ini):
    m = re.search(r"^http\s*=\s*(\S+)", ini, re.M)
    assert m, "no http in broker.ini"
    return int(m.group(1).rsplit(":", 1)[1])


def t_k8s_manifests():
    docs = load_k8s()
    for x in docs:
        assert "apiVersion" in x and "kind" in x and x.get("metadata", {}).get("name"), x
    kinds = {x["kind"]: x for x in docs}
    for k in ("Namespace", "ConfigMap", "DaemonSet"):
        assert k in kinds, "no %s: %s" % (k, list(kinds))
    ds, cm = kinds["DaemonSet"], kinds["ConfigMap"]
    assert ds["apiVersion"] == "apps/v1"
    sel = ds["spec"]["selector"]["matchLabels"]
    tmpl = ds["spec"]["template"]
    assert all(tmpl["metadata"]["labels"].get(k) == v for k, v in sel.items()), "selector"
    pod = tmpl["spec"]
    assert pod.get("nodeSelector"), "no nodeSelector"
    vols = {v["name"]: v for v in pod["volumes"]}
    shm = [v for v in vols.values() if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm or pod.get("hostIPC"), "no memory volume nor hostIPC for /dev/shm"
    containers = pod.get("initContainers", []) + pod["containers"]
    names = [c["name"] for c in pod["containers"]]
    assert "broker" in names and len(names) >= 2, names
    for c in containers:
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        for path in ("/run/baton", "/dev/shm"):
            assert path in mounts, "%s does not mount %s" % (c["name"], path)
            assert mounts[path] in vols, mounts[path]
        assert vols[mounts["/run/baton"]].get("emptyDir") is not None
        assert vols[mounts["/dev/shm"]].get("emptyDir", {}).get("medium") == "Memory" or pod.get("hostIPC")
        for m in c["volumeMounts"]:
            assert m["name"] in vols, m
    gpus = [c for c in pod["containers"]
            if int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0)) >= 1]
    assert gpus, "no container asks for nvidia.com/gpu"
    # the scrape port is the broker's HTTP port, on every address
    ini = cm["data"]["broker.ini"]
    port = http_port(ini)
    ann = tmpl["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == port, (ann, port)
    broker = [c for c in pod["containers"] if c["name"] == "broker"][0]
    assert port in [p["containerPort"] for p in broker["ports"]]
    assert re.search(r"^http\s*=\s*0\.0\.0\.0:", ini, re.M), "http must listen on the pod's address"
    # the ConfigMap's items exist; the broker.ini is one the broker takes
    for v in vols.values():
        if "configMap" in v:
            assert v["configMap"]["name"] == cm["metadata"]["name"]
            for it in v["configMap"].get("items", []):
                assert it["key"] in cm["data"], it
    with tempfile.TemporaryDirectory() as d:
        tok = os.path.join(d, "token")
        with open(tok, "w") as f:
            f.write("x" * 32 + "\n")
        os.chmod(tok, 0o440)  # as the Secret's defaultMode: others cannot read it
        path = os.path.join(d, "broker.ini")
        with open(path, "w") as f:
            f.write(re.sub(r"^http_token_file\s*=.*$", "http_token_file = " + tok, ini, flags=re.M))
        r = run([os.path.join(BIN, "baton-broker"), "--config", path, "--check"])
        assert r.returncode == 0, r.stdout
        # the scripts parse; every engine's arena is made by the init container
        for key, sh in (("make-arenas.sh", "sh"), ("run-engines.sh", "bash")):
            f = os.path.join(d, key)
            with open(f, "w") as fh:
                fh.write(cm["data"][key])
            r = run([sh, "-n", f])
            assert r.returncode == 0, (key, r.stdout)
    arenas = {k[len("arena-"):-5] for k in cm["data"] if k.startswith("arena-")}
    for k, v in cm["data"].items():
        if k.startswith("engine-"):
            m = re.search(r"^BATON_ARENA=(\S+)", v, re.M)
            assert m and m.group(1) in arenas, (k, arenas)


def t_k8s_pod_scripts():
    """The ConfigMap's scripts, run for real with its paths moved into a
    temporary directory: make-arenas.sh makes each arena; run-engines.sh
    starts one engine per file against a broker, passes SIGTERM to each
    (exit 0), and exits 1, stopping the others, when one engine dies."""
    cm = [x for x in load_k8s() if x["kind"] == "ConfigMap"][0]
    name = "deploytest-%d" % os.getpid()
    shm = "/dev/shm/baton/%s.arena" % name
    with tempfile.TemporaryDirectory() as d:
        etc = os.path.join(d, "etc")
        os.makedirs(os.path.join(etc, "arenas"))
        os.makedirs(os.path.join(etc, "engines"))
        for key in ("make-arenas.sh", "run-engines.sh"):
            with open(os.path.join(etc, key), "w") as f:
                f.write(cm["data"][key].replace("/etc/baton/", etc + "/"))
        with open(os.path.join(etc, "arenas", name + ".conf"), "w") as f:
            f.write("ARENA_SOURCE=--synthetic --layers 2 --experts 4 --top-k 2 --d-model 64 --d-ff 32 "
                    "--dtype f32 --seed 3\n")
        for e in ("e1", "e2"):
            with open(os.path.join(etc, "engines", e + ".conf"), "w") as f:
                f.write("BATON_ARENA=%s\nBATON_ENGINE_ARGS=--backend host --host-device-mib 64 "
                        "--expert-cache-release --listen ipc://%s/%s.sock\n" % (name, d, e))
        env = dict(os.environ, PATH=BIN + ":" + os.environ["PATH"], BATON_BROKER_DEFAULT="ipc://%s/c.sock" % d)
        broker = eng = None
        blog = open(os.path.join(d, "broker.log"), "w")
        try:
            r = run(["sh", os.path.join(etc, "make-arenas.sh")], env=env)
            assert r.returncode == 0 and os.path.exists(shm), r.stdout
            broker = subprocess.Popen(broker_cmd(d), stdout=subprocess.PIPE, stderr=blog, text=True)
            assert broker.stdout.readline().startswith("ready ")
            for round_ in ("sigterm", "one dies"):
                eng = subprocess.Popen(["bash", os.path.join(etc, "run-engines.sh")], env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       start_new_session=True)
                ready, out = [], []
                while len(ready) < 2:
                    line = eng.stdout.readline()
                    assert line, "run-engines.sh ended: %r\n%s" % (ready, "".join(out))
                    out.append(line)
                    if line.startswith("ready "):
                        ready.append(line)
                st = run([os.path.join(BIN, "baton"), "--broker", "ipc://%s/c.sock" % d, "status", "--json"])
                assert '"e1"' in st.stdout and '"e2"' in st.stdout, st.stdout
                kids = [int(x) for x in open("/proc/%d/task/%d/children" % (eng.pid, eng.pid)).read().split()]
                assert len(kids) == 2, kids
                if round_ == "sigterm":
                    eng.send_signal(signal.SIGTERM)
                    assert eng.wait(timeout=20) == 0, eng.returncode
                else:
                    os.kill(kids[0], signal.SIGKILL)
                    assert eng.wait(timeout=20) == 1, eng.returncode
                for k in kids:
                    assert not os.path.exists("/proc/%d" % k) or \
                        open("/proc/%d/stat" % k).read().split()[2] == "Z", "engine %d still runs" % k
        finally:
            if eng and eng.poll() is None:
                os.killpg(eng.pid, signal.SIGKILL)
            if broker and broker.poll() is None:
                broker.send_signal(signal.SIGTERM)
                broker.wait(timeout=20)
            blog.close()
            for f in (shm, shm[:-len(".arena")] + ".arena.lock"):
                if os.path.exists(f):
                    os.unlink(f)


def load_fleet():
    docs = []
    d = os.path.join(HERE, "k8s", "fleet")
    for f in sorted(os.listdir(d)):
        if f.endswith((".yaml", ".yml")):
            docs += [x for x in yaml.safe_load_all(open(os.path.join(d, f))) if x]
    return docs


def t_k8s_fleet():
    """deploy/k8s/fleet (docs/guides/kubernetes.md): a DaemonSet per node
    pool, each with its fleet file; a label per model it serves; a Service
    and an InferencePool per model selecting exactly the pools whose file
    has it; each pool's endpoint picker reading metrics the broker serves
    (a broker started here), the pods ready on /readyz; the route sends
    each model to its pool; every fleet file is one the broker takes."""
    docs = load_fleet()
    for x in docs:
        assert "apiVersion" in x and "kind" in x and x.get("metadata", {}).get("name"), x
        if x["kind"] != "Namespace":
            assert x["metadata"].get("namespace") == "baton-fleet", x["metadata"]
    by = {}
    for x in docs:
        by.setdefault(x["kind"], {})[x["metadata"]["name"]] = x
    cms, dss, svcs = by["ConfigMap"], by["DaemonSet"], by["Service"]
    served = {}   # model -> the pools' DaemonSets that serve it
    ports = set()
    with tempfile.TemporaryDirectory() as tmp:
        tok = os.path.join(tmp, "token")
        with open(tok, "w") as f:
            f.write("x" * 32 + "\n")
        os.chmod(tok, 0o440)
        for name, ds in dss.items():
            assert ds["apiVersion"] == "apps/v1"
            tmpl = ds["spec"]["template"]
            labels, pod = tmpl["metadata"]["labels"], tmpl["spec"]
            assert all(labels.get(k) == v for k, v in ds["spec"]["selector"]["matchLabels"].items()), name
            pool = labels["baton.dev/pool"]
            assert pod["nodeSelector"]["baton.dev/pool"] == pool, name
            cm = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
            assert len(cm) == 1 and cm[0] in cms, (name, cm)
            ini = cms[cm[0]]["data"]["broker.ini"]
            models = re.findall(r'^\[model "([^"]+)"\]', ini, re.M)
            assert models, name
            # a label per model it serves, and none for a model it does not
            mine = {k[len("baton.dev/model-"):] for k, v in labels.items() if k.startswith("baton.dev/model-")}
            assert mine == set(models) and all(labels["baton.dev/model-" + m] == "true" for m in mine), (name, mine)
            for m in models:
                served.setdefault(m, set()).add(name)
            (c,) = pod["containers"]  # the broker alone: the engines are its children
            assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == 1, name
            port = http_port(ini)
            ports.add(port)
            assert [p["containerPort"] for p in c["ports"] if p["name"] == "http"] == [port], name
            assert int(tmpl["metadata"]["annotations"]["prometheus.io/port"]) == port
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", name
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/run/baton", "/dev/shm", "/etc/baton", "/srv/models"} <= mounts, mounts
            # the fleet file is one the broker takes (its sources here: the trained models)
            text = re.sub(r"^http_token_file\s*=.*$", "http_token_file = " + tok, ini, flags=re.M)
            text = re.sub(r"^source\s*=.*$", "source = " + os.path.join(ROOT, "models", "kjv-qwen3-moe"), text,
                          flags=re.M)
            for key in ("arena_dir", "run_dir"):
                text = re.sub(r"^%s\s*=.*$" % key, "%s = %s" % (key, tmp), text, flags=re.M)
            path = os.path.join(tmp, name + ".ini")
            with open(path, "w") as f:
                f.write(text)
            r = run([os.path.join(BIN, "baton-broker"), "--config", path, "--check"])
            assert r.returncode == 0, (name, r.stdout)
            for m in models:
                assert re.search(r'\[model "%s"\]' % m, r.stdout), (m, r.stdout)
    assert len(ports) == 1, ports
    port = ports.pop()
    # a Service and an InferencePool per model, selecting exactly its pools
    pools = by["InferencePool"]
    for m, dsn in served.items():
        svc = svcs["baton-" + m]
        sel = svc["spec"]["selector"]
        got = {n for n, ds in dss.items()
               if all(ds["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in sel.items())}
        assert got == dsn, (m, got, dsn)
        assert svc["spec"]["ports"][0]["port"] == port and svc["spec"]["ports"][0]["targetPort"] == "http", svc
        ip = pools["baton-" + m]
        assert ip["apiVersion"] == "inference.networking.k8s.io/v1", ip["apiVersion"]
        assert ip["spec"]["selector"]["matchLabels"] == sel, (m, ip["spec"]["selector"])
        assert [t["number"] for t in ip["spec"]["targetPorts"]] == [port], ip["spec"]
        ref = ip["spec"]["endpointPickerRef"]
        esvc = svcs[ref["name"]]
        assert ref["port"]["number"] in [p["port"] for p in esvc["spec"]["ports"]], (ref, esvc)
        dep = [d for d in by["Deployment"].values()
               if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in esvc["spec"]["selector"].items())]
        assert len(dep) == 1, (m, dep)
        args = dict(a[2:].split("=", 1) for a in dep[0]["spec"]["template"]["spec"]["containers"][0]["args"])
        assert args["pool-name"] == "baton-" + m and args["pool-namespace"] == "baton-fleet", args
        assert args["grpc-port"] == str(ref["port"]["number"]), args
        want = {"total-queued-requests-metric": "baton_requests_waiting",
                "total-running-requests-metric": "baton_requests_running",
                "kv-cache-usage-percentage-metric": "baton_kv_cache_usage_ratio"}
        assert all(args.get(k) == v for k, v in want.items()), args
    assert set(svcs) >= {"baton-" + m for m in served} and set(pools) == {"baton-" + m for m in served}, pools
    # the route: each model's name (the body-based router's header) to its pool
    rules = by["HTTPRoute"]["baton"]["spec"]["rules"]
    routed = {}
    for r in rules:
        hd = [x for mt in r["matches"] for x in mt.get("headers", []) if x["name"] == "X-Gateway-Model-Name"]
        (b,) = r["backendRefs"]
        assert b["kind"] == "InferencePool" and b["group"] == "inference.networking.k8s.io", b
        routed[hd[0]["value"]] = b["name"]
    assert routed == {m: "baton-" + m for m in served}, routed
    # what the pickers read is what a broker serves: gauges, one series each, no labels
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen([os.path.join(BIN, "baton-broker"), "--control", "ipc://%s/c.sock" % d,
                              "--events", "ipc://%s/e.sock" % d, "--http", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = p.stdout.readline().split()
            assert line and line[0] == "ready", line
            import urllib.request
            text = urllib.request.urlopen(line[3] + "/metrics", timeout=10).read().decode()
            ready = urllib.request.urlopen(line[3] + "/readyz", timeout=10)
            assert ready.status == 200
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(20)
    for name in want.values():
        assert re.search(r"^# TYPE %s gauge$" % name, text, re.M), name
        assert re.search(r"^%s [\d.]+$" % name, text, re.M), name
    return "%d pools, %d models" % (len(dss), len(served))


def t_install_deps_starts_no_server():
    """promtool without a Prometheus server: install-deps never installs
    the prometheus package (its postinst starts and enables
    prometheus.service); it downloads the .deb and extracts promtool into
    .deps/bin. Read from its plan and its text; the promtool the tests use
    (when there is one) answers --version."""
    script = os.path.join(ROOT, "scripts", "install-deps.sh")
    r = run(["sh", script, "--plan"])
    assert r.returncode == 0, r.stdout
    plan = dict(l.split(":", 1) for l in r.stdout.splitlines())
    apt = plan["apt-get install"].split()
    assert "prometheus" not in apt and "build-essential" in apt, apt
    assert "apt-get download prometheus" in plan["promtool"] and "dpkg -x" in plan["promtool"], plan
    assert os.path.join(ROOT, ".deps", "bin", "promtool") in plan["promtool"], plan
    for line in open(script):
        code = line.split("#", 1)[0]
        assert not ("apt-get install" in code and "prometheus" in code), line
        assert "systemctl" not in code and "policy-rc.d" not in code, line
    # the extraction itself, when a previous install-deps made it here
    local = os.path.join(ROOT, ".deps", "bin", "promtool")
    if os.path.exists(local):
        v = run([local, "--version"])
        assert v.returncode == 0 and "promtool" in v.stdout, v.stdout
    # --check reports a missing promtool (PATH without one, no .deps copy)
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "scripts"))
        shutil.copy(script, os.path.join(d, "scripts"))
        bin_ = os.path.join(d, "bin")  # the tools --check runs, and no promtool
        os.makedirs(bin_)
        for t in ("sh", "dirname", "dpkg-query", "grep"):
            os.symlink(shutil.which(t), os.path.join(bin_, t))
        r = run([os.path.join(bin_, "sh"), os.path.join(d, "scripts", "install-deps.sh"), "--check"],
                env=dict(os.environ, PATH=bin_))
        assert r.returncode == 1 and "missing: promtool" in r.stdout, r.stdout


def t_prometheus_config():
    path = os.path.join(HERE, "prometheus/prometheus.yml")
    cfg = yaml.safe_load(open(path))
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    k8s = [j for j in jobs.values() if "kubernetes_sd_configs" in j]
    static = [j for j in jobs.values() if "static_configs" in j]
    assert k8s and static, list(jobs)
    # one machine: the broker's default HTTP port
    ini_port = http_port(open(os.path.join(HERE, "etc/broker.ini")).read())
    assert any(t.endswith(":%d" % ini_port) for j in static for s in j["static_configs"] for t in s["targets"])
    j = k8s[0]
    assert j["kubernetes_sd_configs"][0]["role"] == "pod"
    rel = j["relabel_configs"]
    keep = [r for r in rel if r.get("action") == "keep" and
            r["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]]
    assert keep and keep[0]["regex"] == "true", rel
    # the address rule turns a pod's address and the port annotation into
    # POD_IP:PORT (Prometheus anchors the regex and joins with ';')
    addr = [r for r in rel if r.get("target_label") == "__address__"][0]
    pat = re.compile("^(?:%s)$" % addr["regex"])
    for src in ("10.1.2.3;8420", "10.1.2.3:80;8420"):
        m = pat.match(src)
        assert m, src
        got = re.sub(r"\$(\d+)", lambda g: m.group(int(g.group(1))), addr["replacement"])
        assert got == "10.1.2.3:8420", (src, got)
    # the namespace it watches is the manifests'
    ns = [x for x in load_k8s() if x["kind"] == "Namespace"][0]["metadata"]["name"]
    names = j["kubernetes_sd_configs"][0].get("namespaces", {}).get("names")
    assert not names or ns in names, (names, ns)
    # the alerting rules beside it are loaded (cli_test checks their
    # metrics and labels against a live broker)
    assert cfg.get("rule_files") == ["baton-alerts.yml"], cfg.get("rule_files")
    alerts = yaml.safe_load(open(os.path.join(HERE, "prometheus", "baton-alerts.yml")))
    names = [r["alert"] for g in alerts["groups"] for r in g["rules"]]
    assert {"BatonBrokerDown", "BatonEngineLost", "BatonHandoffSlow"} <= set(names), names
    promtool = h.promtool()
    if not promtool:
        print("  (promtool missing: the structure alone is checked)")
        return
    r = run([promtool, "check", "rules", os.path.join(HERE, "prometheus", "baton-alerts.yml")])
    assert r.returncode == 0, r.stdout
    r = run([promtool, "check", "config", path])
    if r.returncode != 0 and "kubernetes_sd_configs not found" in r.stdout:
        # Debian's prometheus is built without Kubernetes discovery: check
        # the rest of the file with it, the Kubernetes job by structure above.
        print("  (this promtool has no kubernetes_sd_configs: checking the other jobs)")
        with tempfile.TemporaryDirectory() as d:
            cfg["scrape_configs"] = [x for x in cfg["scrape_configs"] if "kubernetes_sd_configs" not in x]
            cfg["rule_files"] = [os.path.join(HERE, "prometheus", f) for f in cfg.get("rule_files", [])]
            p2 = os.path.join(d, "prometheus.yml")
            with open(p2, "w") as f:
                yaml.safe_dump(cfg, f)
            r = run([promtool, "check", "config", p2])
    assert r.returncode == 0, r.stdout


CASES = [t_install_layout, t_systemd_verify, t_sysusers_system_user, t_units_content,
         t_notify_broker, t_notify_reload, t_watchdog_follows_decision_thread, t_notify_engine, t_k8s_manifests, t_k8s_pod_scripts, t_k8s_fleet, t_install_deps_starts_no_server, t_prometheus_config]


def main():
    return h.run_cases(CASES, sys.argv[1:], make=None)

if __name__ == "__main__":
    sys.exit(main())
