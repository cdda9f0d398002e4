#!/usr/bin/python3
"""cli_test.py: the `baton` command against a real broker and two engines on
the host backend (tests/harness.py's BrokerCase: a fresh directory, host
device and sockets per case; every process killed at the end), and the
Grafana dashboard in deploy/grafana/ against the broker's metric names.

Every subcommand is run as a script would run it (stdout and stderr piped)
and its effect checked in `baton status --json`; the exit codes 0/1/2/3/4;
`baton watch`; the progress line on a terminal (a pty) and its absence when
piped.

The last line is "N passed, N failed".
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

CLI = h.CLI
CEIL = h.CEIL
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "baton.json")

# Written to a terminal only: carriage return, escape sequences, the spinner.
PROGRESS_MARKS = ("\r", "\x1b")


def baton(c, *args, timeout=30, env=None, check=None):
    """Runs baton with stdout and stderr piped; returns the CompletedProcess."""
    e = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url)
    e.update(env or {})
    r = subprocess.run([CLI] + list(args), capture_output=True, text=True, env=e, timeout=timeout)
    for stream in (r.stdout, r.stderr):
        for mark in PROGRESS_MARKS:
            assert mark not in stream, ("progress written to a pipe", args, stream)
    if check is not None:
        assert r.returncode == check, ("baton %s: exit %d, want %d" % (" ".join(args), r.returncode, check),
                                       r.stdout, r.stderr)
    return r


def status_json(c):
    r = baton(c, "status", "--json", check=0)
    st = json.loads(r.stdout)
    return st, {e["name"]: e for e in st["engines"]}


def two_engines(c, config="", elastic=False):
    """a and b on a device that holds one; b's start took it from a. With
    elastic, a may be shrunk (--vram-elastic)."""
    c.broker(config)
    a = c.engine("a", *(["--vram-elastic"] if elastic else []))
    b = c.engine("b")
    return a, b


# ---- cases -----------------------------------------------------------------------

def t_usage_and_exit_codes(c):
    c.broker()
    version = open(os.path.join(ROOT, "VERSION")).read().strip()
    for prog in ("baton", "baton-broker", "baton-engine", "baton-arena"):
        r = subprocess.run([os.path.join(h.BIN, prog), "--version"], capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and r.stdout == "%s %s\n" % (prog, version), (prog, r.stdout, r.stderr)
    # 2: usage, whatever the broker would say
    for args in ([], ["frobnicate"], ["status", "--bogus"], ["release"], ["release", "a", "b"],
                 ["vram", "a"], ["vram", "a", "--reserve-mib", "x"], ["vram", "a", "--reserve-mib", "4", "--full"],
                 ["--timeout", "soon", "status"], ["status", "--count", "3"], ["handoff", "a"],
                 ["watch", "--count"], ["refill", "a", "--full"], ["status", "--json=yes"],
                 ["--broker", "http://127.0.0.1:8420", "status"], ["--broker", "/run/baton/broker.sock", "status"]):
        r = baton(c, *args, check=2)
        assert r.stderr.startswith("baton: ") and r.stdout == "", (args, r.stderr)
    r = baton(c, "--help", check=0)
    assert "Exit status: 0 done, 1 failed" in r.stdout and "4 not found" in r.stdout
    # 4: not found, from the broker
    for args in (["release", "ghost"], ["refill", "ghost"], ["vram", "ghost", "--full"], ["pin", "ghost"],
                 ["unpin", "ghost"], ["handoff", "ghost", "phantom"]):
        r = baton(c, *args, check=4)
        assert "ghost" in r.stderr and "(not_found)" in r.stderr and r.stdout == "", (args, r.stderr)
    # 1: no broker there (nothing listens), with the reason
    none = "ipc://%s/none.sock" % c.dir
    r = baton(c, "--broker", none, "status", check=1)
    assert r.stderr.startswith("baton: status: nothing listens at " + none), r.stderr
    r = baton(c, "--events", "ipc://%s/none-events.sock" % c.dir, "watch", check=1)
    assert "cannot subscribe" in r.stderr, r.stderr
    # watch: --count not reached within --timeout is a failure; no --count is not
    r = baton(c, "watch", "--count", "3", "--timeout", "300ms", check=1)
    assert "0 of 3 events" in r.stderr, r.stderr
    t0 = time.time()
    baton(c, "watch", "--timeout", "0.3s", check=0)
    assert time.time() - t0 < 5


def t_status_tables_and_json(c):
    a, b = two_engines(c, '[engine "b"]\npriority = 7\n')
    r = baton(c, "status", check=0)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["GPU", "NAME", "UUID", "TOTAL", "FREE", "RESERVE", "HELD", "LENT", "ENGINES"], lines[0]
    # as nvidia-smi names a device: index, product name, uuid
    assert lines[1].split()[:5] == ["0", "host", "device", "0", "host-0"] and lines[1].split()[-1] == "2", lines[1]
    hdr = [ln for ln in lines if ln.startswith("ENGINE")]
    assert hdr and hdr[0].split() == ["ENGINE", "PID", "GPU", "MODEL", "STATE", "RESIDENT", "PEER", "CEILING",
                                      "PRIO", "PINNED", "IDLE", "LAST", "REFILL"], hdr
    rows = {ln.split()[0]: ln.split() for ln in lines[lines.index(hdr[0]) + 1:]}
    assert set(rows) == {"a", "b"}, rows
    assert rows["b"][4] == "ready" and rows["b"][5:7] == ["28.0", "MiB"], rows["b"]
    assert rows["a"][4] == "released" and rows["a"][5:7] == ["0", "B"], rows["a"]
    assert rows["b"][7] == "-", rows["b"]  # no peer device
    assert rows["b"][10] == "7" and rows["b"][11] == "no", rows["b"]
    assert rows["b"][-1] == "GB/s", rows["b"]  # b refilled at start: its rate is shown
    st, eng = status_json(c)
    assert st["epoch"] > 0 and len(st["gpus"]) == 1
    g = st["gpus"][0]
    assert g["uuid"] == "host-0" and g["total"] == 40 * h.MIB and g["held"] >= CEIL, g
    assert g["index"] == 0 and g["name"] == "host device 0", g
    assert g["used"] == g["total"] - g["free"] and g["reserve"] == 0 and g["lent"] == 0, g
    assert eng["b"]["resident"] == CEIL and eng["b"]["ceiling"] == CEIL and eng["b"]["priority"] == 7
    assert eng["b"]["pinned"] is False and eng["b"]["last_refill_gbps"] > 0 and eng["b"]["pid"] == b.pid
    assert eng["a"]["state"] == "released" and eng["a"]["resident"] == 0
    for k in ("name", "pid", "gpu", "model", "state", "resident", "floor", "ceiling", "priority", "pinned",
              "idle_ms", "last_refill_gbps", "peer_gpu", "peer"):
        assert k in eng["a"], k
    assert eng["a"]["peer_gpu"] == "" and eng["a"]["peer"] == 0
    r = baton(c, "engines", "--json", check=0)
    assert sorted(e["name"] for e in json.loads(r.stdout)) == ["a", "b"]
    r = baton(c, "gpus", "--json", check=0)
    assert [x["uuid"] for x in json.loads(r.stdout)] == ["host-0"]
    r = baton(c, "engines", check=0)
    assert r.stdout.startswith("ENGINE ") and "host-0 " not in r.stdout.splitlines()[0]
    r = baton(c, "gpus", check=0)
    assert r.stdout.startswith("GPU ") and len(r.stdout.splitlines()) == 2
    # idle time grows while nothing happens
    time.sleep(0.3)
    assert status_json(c)[1]["b"]["idle_ms"] >= 300


def t_operations(c):
    a, b = two_engines(c, elastic=True)
    # handoff b -> a, text and JSON
    r = baton(c, "handoff", "b", "a", check=0)
    assert re.match(r"handoff b -> a: decide [0-9.]+ ms, release [0-9.]+ ms, refill [0-9.]+ ms, total [0-9.]+ ms\n$",
                    r.stdout), r.stdout
    eng = status_json(c)[1]
    assert eng["a"]["resident"] == CEIL and eng["b"]["resident"] == 0, eng
    r = baton(c, "--json", "handoff", "a", "b", check=0)
    h = json.loads(r.stdout)
    assert h["from"] == "a" and h["to"] == "b" and h["refill_ms"] > 0 and h["total_ms"] >= h["refill_ms"], h
    eng = status_json(c)[1]
    assert eng["a"]["resident"] < CEIL and eng["b"]["resident"] == CEIL, eng  # a (elastic) shrank
    # release / refill
    r = baton(c, "release", "b", check=0)
    assert r.stdout.startswith("release b: released, holds 0 B, freed 28.0 MiB"), r.stdout
    assert status_json(c)[1]["b"]["state"] == "released"
    r = baton(c, "refill", "a", "--json", check=0)
    j = json.loads(r.stdout)
    assert j["op"] == "refill" and j["name"] == "a" and j["state"] == "ready" and j["resident"] == CEIL, j
    assert 0 < j["bytes"] <= CEIL and 0 < j["experts_bytes"] <= CEIL, j
    assert j["gbps"] > 0 and j["ms"] > 0, j
    eng = status_json(c)[1]
    assert eng["a"]["resident"] == CEIL and eng["a"]["last_refill_gbps"] > 0, eng
    # vram: shrink to leave room, then grow back; the older positional form too
    r = baton(c, "vram", "a", "--reserve-mib", "20", check=0)
    assert r.stdout.startswith("vram a: "), r.stdout
    shrunk = status_json(c)[1]["a"]["resident"]
    assert 0 < shrunk < CEIL, shrunk
    r = baton(c, "--json", "vram", "a", "--full", check=0)
    assert json.loads(r.stdout)["resident"] == CEIL
    assert status_json(c)[1]["a"]["resident"] == CEIL
    baton(c, "vram", "a", "20", check=0)
    assert status_json(c)[1]["a"]["resident"] < CEIL
    baton(c, "vram", "a", "full", check=0)
    assert status_json(c)[1]["a"]["resident"] == CEIL
    # pin / unpin; a pinned engine's release is refused (1, with the reason)
    r = baton(c, "pin", "a", check=0)
    assert r.stdout == "a pinned\n"
    assert status_json(c)[1]["a"]["pinned"] is True
    r = baton(c, "release", "a", check=1)
    assert "pinned" in r.stderr and "(permission)" in r.stderr and r.stdout == "", r.stderr
    r = baton(c, "handoff", "a", "b", check=1)
    assert "pinned" in r.stderr
    assert status_json(c)[1]["a"]["resident"] == CEIL
    r = baton(c, "unpin", "a", "--json", check=0)
    assert json.loads(r.stdout) == {"name": "a", "pinned": False}
    assert status_json(c)[1]["a"]["pinned"] is False
    baton(c, "release", "a", check=0)
    assert status_json(c)[1]["a"]["resident"] == 0
    # the broker's "invalid" is a usage error
    r = baton(c, "handoff", "a", "a", check=2)
    assert "both 'a'" in r.stderr, r.stderr


def t_pins_survive_a_broker_restart(c):
    """Pins are the operator's: a broker killed and started again keeps
    them (broker.state beside the control socket); a damaged state file is
    named in the log and ignored, and the next pin writes a good one."""
    a, b = two_engines(c)
    baton(c, "pin", "a", check=0)
    state = os.path.join(c.dir, "broker.state")
    assert json.load(open(state)) == {"version": 1, "pins": {"a": True}}
    c.bp.kill()
    c.bp.wait()
    c.broker()
    h.wait_for("a registered again", lambda: "a" in status_json(c)[1], timeout=10)
    assert status_json(c)[1]["a"]["pinned"] is True
    r = baton(c, "release", "a", check=1)
    assert "pinned" in r.stderr, r.stderr
    baton(c, "unpin", "a", check=0)
    assert json.load(open(state)) == {"version": 1, "pins": {"a": False}}
    c.bp.kill()
    c.bp.wait()
    with open(state, "w") as f:
        f.write('{"version": 1, "pins": {"a": tru')
    c.broker()
    h.wait_for("a and b registered again", lambda: {"a", "b"} <= set(status_json(c)[1]), timeout=10)
    assert status_json(c)[1]["a"]["pinned"] is False
    assert "broker.state:1: " in open(c.log("broker")).read()
    baton(c, "pin", "b", check=0)
    assert json.load(open(state)) == {"version": 1, "pins": {"b": True}}


def t_busy(c):
    """An engine in the middle of a request: release and handoff answer busy (3)."""
    a, b = two_engines(c, "acquire_wait_ms = 300\n")
    steps = h.long_steps(b, 2.5)  # a GEN of about 2.5 s on this machine and build
    res = {}

    def long_request():
        res["r"] = h.gen(b, seed=1, steps=steps, batch=16, timeout_ms=60000)
    t = threading.Thread(target=long_request)
    t.start()
    try:
        h.wait_for("the broker sees b busy", lambda: c.eng("b")["idle_ms"] == 0, timeout=5)
        r = baton(c, "release", "b", check=3)
        assert "busy" in r.stderr and "(busy)" in r.stderr and r.stdout == "", r.stderr
        assert t.is_alive(), "the request ended too soon to test busy"
        r = baton(c, "handoff", "b", "a", check=3)
        assert "b is busy serving requests" in r.stderr, r.stderr
        assert t.is_alive(), "the request ended too soon to test busy"
    finally:
        t.join(60)
    assert res["r"].get("ok") is True, res
    assert status_json(c)[1]["b"]["resident"] == CEIL  # nothing was taken in the middle


def t_broker_dies_under_a_call(c):
    """A broker that dies in the middle of a handoff: baton fails at once
    with the reason, not after its whole --timeout (it waited 30 s)."""
    a, b = two_engines(c)
    os.kill(a.pid, signal.SIGSTOP)  # the handoff's refill of a waits
    try:
        env = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url)
        p = subprocess.Popen([CLI, "handoff", "b", "a", "--timeout", "30s"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        h.wait_for("the handoff under way", lambda: c.eng("b")["state"] == "released", timeout=10)
        time.sleep(0.2)
        assert p.poll() is None, p.communicate()
        t0 = time.time()
        c.bp.kill()
        c.bp.wait(10)
        out, errs = p.communicate(timeout=25)
        took = time.time() - t0
    finally:
        os.kill(a.pid, signal.SIGCONT)
    assert p.returncode == 1 and took < 5, (p.returncode, took, errs)
    assert "the connection to the broker at %s dropped (did it stop?)" % c.control in errs, errs
    assert out == "", out
    return "failed %.0f ms after the broker died" % (took * 1e3)


class Lines:
    """A child's stdout lines, read in the background."""

    def __init__(self, p):
        self.p, self.items = p, []
        self.t = threading.Thread(target=lambda: [self.items.append(ln) for ln in p.stdout], daemon=True)
        self.t.start()


def t_watch(c):
    a, b = two_engines(c)
    env = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url)
    # --count N: exactly N lines, then exit 0 (pins and unpins until it has
    # seen enough: it may have subscribed after the first, or before the
    # last events of b's start were sent: those may come first)
    w = subprocess.Popen([CLI, "watch", "--count", "4", "--timeout", "20s"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    for _ in range(100):
        baton(c, "pin", "a", check=0)
        baton(c, "unpin", "a", check=0)
        if w.poll() is not None:
            break
        time.sleep(0.1)
    out, errs = w.communicate(timeout=20)
    assert w.returncode == 0, (out, errs)
    lines = out.splitlines()
    pins = [bool(re.search(r" (pin|unpin) +a ", ln)) for ln in lines]
    assert len(lines) == 4 and pins[-2:] == [True, True], lines
    assert all(p or re.search(r" (state|handoff|refill) +b ", ln) for p, ln in zip(pins, lines)), lines
    assert errs == "" and "\r" not in out
    # --json, until SIGINT: sees every event of a handoff; the events URL
    # is found beside the --broker socket when not given
    env2 = dict(c.env)
    env2.pop("BATON_EVENTS", None)
    env2.pop("BATON_BROKER", None)
    w = subprocess.Popen([CLI, "--broker", c.control, "watch", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env2)
    got = Lines(w)
    h.wait_for("watch subscribed", lambda: baton(c, "pin", "b", check=0) and got.items, timeout=10, every=0.1)
    baton(c, "unpin", "b", check=0)
    baton(c, "handoff", "b", "a", check=0)
    h.wait_for("the handoff event", lambda: any('"kind":"handoff"' in ln for ln in got.items), timeout=5)
    w.send_signal(signal.SIGINT)
    assert w.wait(10) == 0, (w.returncode, w.stderr.read())
    got.t.join(5)
    evs = [json.loads(ln) for ln in got.items]
    kinds = [(e["kind"], e["engine"]) for e in evs]
    assert ("unpin", "b") in kinds and ("release", "b") in kinds and ("handoff", "a") in kinds, kinds
    ho = [e for e in evs if e["kind"] == "handoff"][0]
    assert ho["reason"].startswith("from b (release): decide ") and ho["ms"] > 0 and ho["bytes"] > 0, ho
    seqs = [e["seq"] for e in evs]
    assert seqs == sorted(seqs) and all(isinstance(e["time_ms"], int) for e in evs)
    # SIGTERM ends it with 0 too
    w = subprocess.Popen([CLI, "watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    got = Lines(w)
    h.wait_for("watch subscribed", lambda: baton(c, "pin", "b", check=0) and got.items, timeout=10, every=0.1)
    w.send_signal(signal.SIGTERM)
    assert w.wait(10) == 0


def run_on_pty(c, args, env):
    """Runs baton with stderr on a terminal; returns (exit, stdout, what the terminal got)."""
    return h.run_on_pty([CLI] + args, env, timeout=30)


def t_progress_on_terminal_only(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b", env={"BATON_TEST_REFILL_DELAY_MS": "900"})  # each refill of b takes 0.9 s more
    env = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url, TERM="xterm")
    rc, out, tty = run_on_pty(c, ["handoff", "b", "a"], env)  # quick: a has no delay
    assert rc == 0
    # a slow refill: a progress line on the terminal, erased before the result
    rc, out, tty = run_on_pty(c, ["refill", "b"], env)
    assert rc == 0 and out.startswith("refill b: ready"), (rc, out, tty)
    assert "\rrefill b  " in tty and "s  b refilling, holds " in tty and " of 28.0 MiB" in tty, repr(tty)
    assert tty.endswith("\r\x1b[K"), repr(tty[-40:])
    assert "\r" not in out
    # --quiet: nothing on the terminal either
    baton(c, "handoff", "b", "a", check=0)
    rc, out, tty = run_on_pty(c, ["--quiet", "refill", "b"], env)
    assert rc == 0 and tty == "" and out.startswith("refill b: ready"), (out, repr(tty))
    # piped (the baton() helper checks): nothing but the result
    baton(c, "handoff", "b", "a", check=0)
    t0 = time.time()
    r = baton(c, "refill", "b", check=0)
    assert time.time() - t0 >= 0.9 and r.stderr == "" and len(r.stdout.splitlines()) == 1, r


# ---- the Grafana dashboard -----------------------------------------------------------

# The metric names agreed for /metrics (issue 7): what the dashboard is
# checked against only when the tree has no broker/api/http.c (no /metrics).
AGREED_METRICS = {
    "baton_gpu_memory_total_bytes", "baton_gpu_memory_free_bytes", "baton_gpu_memory_used_bytes",
    "baton_gpu_memory_held_bytes", "baton_engine_resident_bytes", "baton_engine_state",
    "baton_engine_requests_total", "baton_engine_refill_duration_seconds",
    "baton_engine_release_duration_seconds", "baton_engine_last_refill_bytes_per_second",
    "baton_handoffs_total", "baton_errors_total", "baton_engines", "baton_build_info",
}

# Families a Baton dashboard must show, whatever else it does.
CORE_METRICS = {"baton_gpu_memory_total_bytes", "baton_gpu_memory_free_bytes", "baton_gpu_memory_held_bytes",
                "baton_engine_resident_bytes", "baton_engine_state", "baton_engine_refill_duration_seconds",
                "baton_engine_last_refill_bytes_per_second", "baton_handoffs_total", "baton_errors_total",
                "baton_handoff_duration_seconds"}

PROM_FUNCS = {"sum", "rate", "irate", "increase", "histogram_quantile", "max", "min", "avg", "count", "by",
              "without", "on", "ignoring", "group_left", "group_right", "clamp_min", "clamp_max", "time",
              "timestamp", "label_replace", "topk", "bottomk", "le", "or", "and", "unless", "delta",
              "changes", "resets", "abs", "vector", "scalar", "sort", "sort_desc", "count_values",
              "max_over_time", "min_over_time", "avg_over_time", "last_over_time", "offset", "bool"}


def dashboard_metrics(dash):
    """Every metric name in the dashboard's panel expressions."""
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                exprs.append(t["expr"])
            walk(p.get("panels", []))
    walk(dash["panels"])
    names = set()
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        if v.get("type") == "query" and q:
            m = re.match(r"\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{[^}]*\})?\s*,", q)
            if m:
                names.add(m.group(1))
            else:
                exprs.append(q)
    for e in exprs:
        e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', e)           # label values
        e = re.sub(r"\{[^}]*\}", "", e)                      # matchers
        e = re.sub(r"\[[^\]]*\]", "", e)                     # ranges
        e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e)
        for tok in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
            if tok in PROM_FUNCS:
                continue
            names.add(tok)
    return exprs, names


def served_labels(text):
    """{metric name: label names its samples carry} in Prometheus text."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if m and not line.startswith("#"):
            out.setdefault(m.group(1), set()).update(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(2) or ""))
    return out


def selectors(expr):
    """(metric, {label names matched}) of every selector in a PromQL expression."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for m in re.finditer(r"\b(baton_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?", e):
        yield m.group(1), set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2) or ""))


def families(text):
    """Metric names in Prometheus text: every family of a # TYPE line (a
    histogram's _bucket, _sum and _count too) and every sample's name."""
    names = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (\w+)", line)
        if m:
            names.add(m.group(1))
            if m.group(2) in ("histogram", "summary"):
                names.update(m.group(1) + suf for suf in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def served_metrics(c):
    """The names a real broker serves on /metrics (with an engine registered,
    after a release and a refill), or None when the tree has no broker/api/http.c.
    A broker built before http.c took the `http` key (it refuses the
    configuration) is read from http.c's source instead."""
    if not os.path.exists(os.path.join(ROOT, "broker", "api", "http.c")):
        return None
    import socket
    import urllib.request
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    try:
        c.broker("http = 127.0.0.1:%d\n" % port)
    except AssertionError:
        if "unknown key 'http'" not in open(c.log("broker")).read():
            raise
        print("  (this broker has no HTTP server yet: names from broker/api/http.c)")
        src = open(os.path.join(ROOT, "broker", "api", "http.c")).read()
        return families("\n".join("# TYPE %s histogram" % n for n in re.findall(r"\b(baton_[a-z0-9_]+)", src)))
    a = c.engine("a")
    b = c.engine("b")
    h.ok(h.call(c.control, "release", name="a"))
    h.ok(h.call(c.control, "refill", name="a"))
    h.ok(h.call(c.control, "handoff", **{"from": "a", "to": "b"}))
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    assert "baton_engine_resident_bytes{" in text and 'engine="a"' in text, text[:2000]
    del a, b
    return families(text), served_labels(text)


def check_promql(exprs):
    """Every expression parses as PromQL: `promtool check rules` on a rule
    file of them, Grafana's variables replaced by values (skipped, saying
    so, without promtool)."""
    import tempfile
    promtool = h.promtool()
    if not promtool:
        print("  (no promtool: PromQL syntax not checked; scripts/install-deps.sh extracts it)")
        return
    subst = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h", "$engine": ".*", "$gpu": ".*",
             "$model": ".*",
             "$instance": ".*"}
    rules = []
    for i, e in enumerate(exprs):
        for k in sorted(subst, key=len, reverse=True):
            e = e.replace(k, subst[k])
        assert "$" not in e, "an unknown variable in " + e
        rules.append({"record": "baton:dashboard:%d" % i, "expr": e})
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)  # JSON is YAML
    try:
        r = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, "PromQL: " + r.stdout + r.stderr
    finally:
        os.unlink(f.name)


def t_gen_by_name(c):
    # baton gen takes the engine's name (its ctl from the broker's status)
    # as well as its socket URL, and both give the same answer.
    c.broker()
    a = c.engine("a")
    by_url = json.loads(baton(c, "gen", a.url, "--steps", "2", "--seed", "3", "--json", check=0).stdout)
    by_name = json.loads(baton(c, "gen", "a", "--steps", "2", "--seed", "3", "--json", check=0).stdout)
    assert by_name["checksum"] == by_url["checksum"], (by_name, by_url)
    r = baton(c, "gen", "nosuch", check=4)
    assert "knows no engine 'nosuch'" in r.stderr, r.stderr
    r = baton(c, "--broker", "ipc://%s/none.sock" % c.dir, "gen", "a", check=1)
    assert "cannot ask the broker" in r.stderr and "give its URL" in r.stderr, r.stderr
    # a URL needs no broker
    baton(c, "--broker", "ipc://%s/none.sock" % c.dir, "gen", a.url, check=0)


def t_untrusted_socket_dir(c):
    """Issue 28: root's baton talked to any socket it was pointed at, so a
    user who owned the directory of an engine's (or the broker's) socket
    could put their own there and be sent root's commands and prompts.
    A socket in a directory of another user (or writable by others, bar
    root's sticky /tmp) is refused with the reason, before connecting."""
    import socket as so
    d = os.path.join(c.dir, "user")
    os.mkdir(d)
    os.chown(d, h.OTHER_UID, h.OTHER_UID)
    os.chmod(d, 0o755)
    path = os.path.join(d, "e.sock")
    s = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    s.bind(path)
    s.listen(8)  # the impostor
    try:
        for args in (["gen", "ipc://" + path], ["--broker", "ipc://" + path, "status"],
                     ["--broker", "ipc://" + path, "gen", "a"]):
            r = baton(c, "--timeout", "2s", *args, check=1)
            assert "belongs to uid %d" % h.OTHER_UID in r.stderr and "refusing to talk" in r.stderr, \
                (args, r.stderr)
        s.settimeout(0.2)
        try:
            s.accept()
            raise AssertionError("baton connected to the impostor")
        except so.timeout:
            pass
    finally:
        s.close()
    # a directory of this user's that others cannot write is used as ever
    c.broker()
    a = c.engine("a")
    baton(c, "gen", a.url, "--steps", "1", check=0)


def t_grafana_dashboard(c):
    dash = json.load(open(DASHBOARD))
    assert dash.get("title") and dash.get("uid") and dash.get("panels"), "not a dashboard"
    assert isinstance(dash.get("schemaVersion"), int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    exprs, names = dashboard_metrics(dash)
    assert len(exprs) >= 8 and names, exprs
    for p in dash["panels"]:
        if p.get("type") != "row":
            assert p.get("targets") and p.get("datasource"), p.get("title")
            assert set(p.get("gridPos", {})) >= {"h", "w", "x", "y"}, p.get("title")
    check_promql(exprs)
    # Two brokers (instances) may have engines of the same name: every
    # query selects $instance and keeps instance (and engine, for an
    # engine's metric) in what it groups by.
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"instance", "engine", "gpu"} <= variables, variables
    for e in exprs:
        for metric, labels in selectors(e):
            assert "instance" in labels, "no $instance in " + e
        for agg, by in re.findall(r"\b(\w+) by\s*\(([^)]*)\)", e):
            by = {x.strip() for x in by.split(",")}
            assert "instance" in by, "grouped without instance: " + e
            if "baton_engine_" in e and agg != "count":  # a count of engines is per broker
                assert "engine" in by, "grouped without engine: " + e
    # the state timeline: one lane per engine (grouped by instance and
    # engine only), every state the broker reports mapped to its name
    st = [p for p in dash["panels"] if p.get("type") == "state-timeline"]
    assert len(st) == 1 and len(st[0]["targets"]) == 1, st
    st = st[0]
    by = re.findall(r"^max by \(([^)]*)\)", st["targets"][0]["expr"])
    assert by and {x.strip() for x in by[0].split(",")} == {"instance", "engine"}, st["targets"][0]["expr"]
    assert "{{state}}" not in st["targets"][0]["legendFormat"]
    mapped = {o["text"] for m in st["fieldConfig"]["defaults"]["mappings"] for o in m["options"].values()}
    for state in ("loading", "ready", "partial", "refilling", "releasing", "released", "lost", "dead", "stopped"):
        assert state in mapped and '"%s"' % state in st["targets"][0]["expr"], state
    assert "one lane per engine" in st["description"].lower()
    # a handoff-latency panel from the histogram, by phase
    ho = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])
          if "baton_handoff_duration_seconds_bucket" in t["expr"]]
    assert ho and all("phase" in x for x in ho), ho
    # the serving row: vLLM's metrics per model, at the door
    rows = [p["title"] for p in dash["panels"] if p.get("type") == "row"]
    assert any(r.startswith("Serving") for r in rows), rows
    for fam in ("baton_door_time_to_first_token_seconds_bucket", "baton_door_e2e_request_latency_seconds_bucket",
                "baton_door_requests_running", "baton_door_requests_waiting", "baton_door_generation_tokens_total",
                "baton_door_request_success_total", "baton_door_requests_rejected_total"):
        assert fam in names, fam
    served = served_metrics(c)
    known = served[0] if served is not None else families(
        "\n".join("# TYPE %s histogram" % n for n in AGREED_METRICS))
    missing = sorted(n for n in names if n not in known)
    assert not missing, "the dashboard uses metrics the broker does not serve: %s" % missing
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}
    assert CORE_METRICS <= used, sorted(CORE_METRICS - used)
    if served is not None:
        # every label a query matches on or groups by is one the broker's
        # series carry (instance and job: Prometheus adds them)
        labels = served[1]
        for e in exprs:
            for metric, matched in selectors(e):
                if metric not in labels:
                    continue  # no series here (a peer tier's: peer_test checks those)
                extra = matched - labels[metric] - {"instance", "job", "__name__"}
                assert not extra, "%s has no label %s on /metrics (%s)" % (metric, sorted(extra), e)


def t_prometheus_alerts(c):
    """deploy/prometheus/baton-alerts.yml: every Baton metric and label its
    rules use is one a live broker serves, and each aggregation keeps
    instance (two nodes alert apart)."""
    import yaml
    rules = yaml.safe_load(open(os.path.join(ROOT, "deploy", "prometheus", "baton-alerts.yml")))
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) >= 5, exprs
    check_promql(exprs)
    fams, labels = served_metrics(c)
    for e in exprs:
        for metric, matched in selectors(e):
            assert metric in fams, "%s is not on /metrics (%s)" % (metric, e)
            if metric in labels:
                extra = matched - labels[metric] - {"instance", "job", "__name__"}
                assert not extra, "%s has no label %s on /metrics (%s)" % (metric, sorted(extra), e)
        for by in re.findall(r"\bby\s*\(([^)]*)\)", e):
            assert "instance" in {x.strip() for x in by.split(",")}, "grouped without instance: " + e


CASES = [t_grafana_dashboard, t_prometheus_alerts, t_gen_by_name, t_usage_and_exit_codes, t_status_tables_and_json, t_operations,
         t_pins_survive_a_broker_restart, t_busy, t_broker_dies_under_a_call, t_watch,
         t_progress_on_terminal_only, t_untrusted_socket_dir]


def main():
    return h.run_cases(CASES, sys.argv[1:], logs=("broker", "a", "b"))


if __name__ == "__main__":
    sys.exit(main())
