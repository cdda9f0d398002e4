"""harness.py: what every Python test of Baton shares.

A test module imports this (and only this) from the tree:

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import harness as h

and gets
  - the programs' paths, from BUILD (default "build"): h.ENGINE, h.BROKER...
  - h.ERR: the error codes by name, read from proto/base/base.h, the C header that
    owns them (no number is written twice);
  - h.call (one request through `baton-proto-tool call`, reply as a dict),
    h.call_retry (the same, again when the connection was refused or not
    accepted in time: the request never arrived), h.ok, h.err, h.wait_for;
  - h.Events: the broker's events, collected in the background;
  - the fixtures: h.EngineCase (engines alone, each case its own directory
    and host device), h.BrokerCase (a broker and engines), h.Http (a client
    of the broker's HTTP API);
  - h.run_cases(): each case with a fresh fixture, a sanitizer report in any
    log fails it, the logs' tails on failure, the last line
    "N passed, N failed".

No test module imports another or replaces another's functions: what two
of them need lives here.
"""
import atexit
import fcntl
import http.client
import json
import os
import pty
import re
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import traceback

import msgpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "bin")
ENGINE = os.path.join(BIN, "baton-engine")
BROKER = os.path.join(BIN, "baton-broker")
ARENA = os.path.join(BIN, "baton-arena")
TOOL = os.path.join(BIN, "baton-proto-tool")
CLI = os.path.join(BIN, "baton")

MIB = 1 << 20
# The sanitizer build (BUILD ends in "san") and the ThreadSanitizer one.
SAN = os.path.basename(BUILD.rstrip("/")) == "san"
# ThreadSanitizer runs the programs 5-15 times slower: its run looks for
# races, so the time bounds and windows of the cases stretch by SLOW there
# (never in the normal or the ASan run).
SLOW = float(os.environ.get("BATON_TEST_SLOW", "4" if "tsan" in BUILD else "1"))


def _read_errors(path):
    """{name: code} from the X-macro table of proto/base/base.h."""
    with open(path) as f:
        text = f.read()
    table = {name: int(num) for num, name in
             re.findall(r'X\(\s*BATON_\w+\s*,\s*(\d+)\s*,\s*"(\w+)"', text)}
    if len(table) < 10 or table.get("ok") != 0:
        raise RuntimeError("%s: the error table was not found (%d entries)" % (path, len(table)))
    return table


ERR = _read_errors(os.path.join(ROOT, "proto", "base", "base.h"))

# ---- requests ---------------------------------------------------------------

_id = [1000]
_id_lock = threading.Lock()


def npm_client():
    """The npm clients from tests/node's lock file, installed into the
    build folder (npm ci, offline from npm's cache when it is there); the
    folder engine/serve/openai_test.py and broker/door/door_test.py share."""
    dest = os.path.join(os.path.abspath(BUILD), "node")
    src = os.path.join(ROOT, "tests", "node")
    os.makedirs(dest, exist_ok=True)
    # Scripts run in parallel: one installs while the others wait (npm ci
    # empties node_modules first, under anyone reading it).
    with open(os.path.join(os.path.abspath(BUILD), "node.lock"), "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        for f in os.listdir(src):  # package.json, its lock, the clients' .mjs files
            if f.endswith((".json", ".mjs")):
                shutil.copy(os.path.join(src, f), dest)
        mod = os.path.join(dest, "node_modules", "openai", "package.json")
        stamp = os.path.join(dest, "node_modules", ".baton-lock")
        lock = open(os.path.join(src, "package-lock.json")).read()
        if not (os.path.exists(mod) and os.path.exists(stamp) and open(stamp).read() == lock):
            assert shutil.which("npm"), "npm is not installed (apt-get install npm)"
            p = subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=dest,
                               capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, p.stderr[-2000:]
            open(stamp, "w").write(lock)
    return dest


def npm_versions(*names):
    """The installed versions of npm_client()'s packages."""
    dest = os.path.join(os.path.abspath(BUILD), "node", "node_modules")
    return [json.load(open(os.path.join(dest, n, "package.json")))["version"] for n in names]


def promtool():
    """promtool's path, or None: $PROMTOOL, then the one scripts/install-deps.sh
    extracts into .deps/bin (Debian's prometheus package is never installed:
    it would start a server), then PATH."""
    for p in (os.environ.get("PROMTOOL"), os.path.join(ROOT, ".deps", "bin", "promtool"),
              shutil.which("promtool")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def next_id():
    with _id_lock:
        _id[0] += 1
        return _id[0]


def call(url, op, timeout_ms=20000, **fields):
    """One request; the reply as a dict. The tool's own failure (no answer)
    comes back as {"error": name, "code": n, "text": ...}."""
    rid = next_id()
    m = {"v": 1, "op": op, "id": rid}
    m.update(fields)
    r = subprocess.run([TOOL, "call", url, "--timeout", str(timeout_ms)], input=msgpack.packb(m),
                       capture_output=True, timeout=timeout_ms / 1000 + 10)
    out = r.stdout.decode().strip()
    if not out:
        raise AssertionError("no reply to %s: %s" % (op, r.stderr.decode()))
    rep = json.loads(out.splitlines()[-1])
    if "error" in rep:  # the tool's own: no answer
        return rep
    assert rep["id"] == rid, {k: v for k, v in rep.items() if k != "output"}
    return rep


def calls(url, reqs, timeout_ms=20000):
    """Requests [(op, fields), ...] sent in turn on one client, each as
    soon as the previous reply came (back to back); the replies as dicts."""
    data, ids = b"", []
    for op, fields in reqs:
        rid = next_id()
        ids.append(rid)
        m = {"v": 1, "op": op, "id": rid}
        m.update(fields)
        b = msgpack.packb(m)
        data += len(b).to_bytes(4, "big") + b
    r = subprocess.run([TOOL, "calls", url, "--timeout", str(timeout_ms)], input=data, capture_output=True,
                       timeout=len(reqs) * (timeout_ms / 1000) + 10)
    reps = [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip()]
    assert len(reps) == len(reqs), (len(reps), len(reqs), r.stderr.decode()[-2000:])
    return reps


# What call_retry saw: connections refused, connects not accepted in time.
retried = {"refused": 0, "connect_timeouts": 0}
# URLs killed on purpose: a refused connect there is final, not retried.
dead_urls = set()


def call_retry(url, op, timeout_ms=20000, **fields):
    """call, again when the connection was refused (the request never
    arrived): proto/transport.c replaces a stalled listener, and that
    refuses connections in progress once (and drops its pipes)."""
    for _ in range(20):
        rep = call(url, op, timeout_ms=timeout_ms, **fields)
        if url in dead_urls:
            return rep
        if rep.get("error") == "connect":
            retried["refused"] += 1
        elif rep.get("error") == "timeout" and "cannot connect" in rep.get("text", ""):
            retried["connect_timeouts"] += 1  # the listener did not accept within the timeout
        else:
            return rep
        time.sleep(0.1)
    return rep


def retried_line():
    return "connections refused and retried: %d, connects timed out and retried: %d" % (
        retried["refused"], retried["connect_timeouts"])


def ok(rep):
    assert rep.get("ok") is True, rep
    return rep


def err(rep, name):
    assert rep.get("ok") is False and rep.get("err") == ERR[name], "want %s, got %s" % (name, rep)
    return rep


def wait_for(what, fn, timeout=10.0, every=0.05):
    """fn's first true value, polled every `every` s; fails after `timeout`."""
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(every)


def wait_value(what, fn, want, timeout=10.0, every=0.05):
    """Polls fn() until it returns `want`; fails with the last value seen."""
    deadline = time.time() + timeout
    while True:
        got = fn()
        if got == want:
            return got
        if time.time() > deadline:
            raise AssertionError("%s: %r after %.1f s, want %r" % (what, got, timeout, want))
        time.sleep(every)


def _unix_conns(url):
    """The connections the Unix socket of an ipc:// URL has accepted, as
    a set of socket inodes (from /proc/net/unix: each accepted one carries
    the listener's path, state 03); None for another transport."""
    if not url.startswith("ipc://"):
        return None
    path = url[len("ipc://"):]
    got = set()
    with open("/proc/net/unix") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 8 and fields[5] == "03" and fields[7] == path:
                got.add(fields[6])
    return got


class Events:
    """Collects the broker's events in the background (`baton-proto-tool sub`)."""

    def __init__(self, url, wait=True):
        before = _unix_conns(url)
        self.p = subprocess.Popen([TOOL, "sub", url], stdout=subprocess.PIPE, text=True)
        self.items = []
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        if wait and before is not None:
            # Connected before the first event: the publisher's socket has
            # accepted a connection it did not have (a subscriber killed
            # just before may still be counted, or go meanwhile).
            wait_for("the subscription to " + url, lambda: _unix_conns(url) - before, timeout=10 * SLOW,
                     every=0.01)

    def _run(self):
        for line in self.p.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                self.items.append(ev)

    def all(self, kind=None, engine=None):
        with self.lock:
            return [e for e in self.items if (kind is None or e.get("kind") == kind) and
                    (engine is None or e.get("engine") == engine)]

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


# ---- the host device ----------------------------------------------------------

def _hostdev_rows(d, index):
    """(capacity, [(pid, bytes)]) from host device `index`'s state file in
    directory d (the layout of engine/backend/host/device.h: a 64-byte header, then
    32-byte owner rows)."""
    with open(os.path.join(d, "hostdev-%d" % index), "rb") as f:
        data = f.read()
    magic, _version, n_owners, capacity = struct.unpack_from("<8sIIQ", data, 0)
    assert magic.rstrip(b"\0") == b"BATONHD", magic
    rows = []
    for i in range(n_owners):
        pid, _opens, _start, nbytes, _pad = struct.unpack_from("<iIQQQ", data, 64 + 32 * i)
        rows.append((pid, nbytes))
    return capacity, rows


def hostdev_owners(d, index=0):
    """(capacity, {pid: bytes charged}) of the live processes on host device
    `index` in directory d."""
    capacity, rows = _hostdev_rows(d, index)
    out = {}
    for pid, nbytes in rows:
        if pid > 0 and os.path.exists("/proc/%d" % pid):
            out[pid] = out.get(pid, 0) + nbytes
    return capacity, out


def hostdev_charged(d, index, pid):
    """Bytes host device `index` charges to process `pid`, alive or not
    (0 when the device was never opened)."""
    if not os.path.exists(os.path.join(d, "hostdev-%d" % index)):
        return 0
    return sum(n for p, n in _hostdev_rows(d, index)[1] if p == pid)


# ---- fixtures -----------------------------------------------------------------

class Case:
    """A fresh directory (its own host device, BATON_HOSTDEV_DIR), the
    processes started in it (killed at close) and their logs."""

    prefix = "baton-test-"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix=self.prefix)
        self.procs = []
        self.events = None
        self.env = dict(os.environ, BATON_HOSTDEV_DIR=self.dir, BATON_NVML="0")

    def log(self, name):
        return os.path.join(self.dir, name + ".log")

    def logs_clean(self):
        """A sanitizer's report in any log fails the case."""
        for name in os.listdir(self.dir):
            if name.endswith(".log"):
                text = open(os.path.join(self.dir, name), errors="replace").read()
                assert "runtime error:" not in text and "Sanitizer" not in text, (name, text[-3000:])

    def tails(self, names, lines=15):
        for name in names:
            path = self.log(name)
            if os.path.exists(path):
                print("  --- %s.log (last lines)" % name)
                for line in open(path, errors="replace").read().splitlines()[-lines:]:
                    print("  " + line)

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
            p.wait()
        if self.events:
            self.events.close()
        if os.environ.get("BROKER_TEST_KEEP"):
            print("  kept", self.dir)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def synthetic_args(layers=4, experts=8, d_model=256, d_ff=512, dtype="f16", top_k=2, seed=7):
    """baton-arena create's arguments for a small synthetic model."""
    return ["--synthetic", "--layers", str(layers), "--experts", str(experts), "--top-k", str(top_k),
            "--d-model", str(d_model), "--d-ff", str(d_ff), "--dtype", dtype, "--seed", str(seed)]


def synthetic_arena(path, layers=4, experts=8, d_model=256, d_ff=512, dtype="f16", top_k=2, seed=7):
    subprocess.run([ARENA, "create"] + synthetic_args(layers, experts, d_model, d_ff, dtype, top_k, seed) + [path],
                   check=True, stdout=subprocess.DEVNULL, timeout=60)
    return path


_arenas = {}
_arena_dir = []


def shared_arena(*create_args, name="m"):
    """The arena `baton-arena create ARGS... PATH` makes, made once per test
    script (process) in a directory of its own that goes at exit, as
    NAME.arena (an engine's model is named after its arena's file). Arenas
    are read-only to the engines, so the cases of a script share each one
    rather than build it again (a case that changes an arena makes its own)."""
    key = (name,) + tuple(create_args)
    if key not in _arenas:
        if not _arena_dir:
            _arena_dir.append(tempfile.mkdtemp(prefix="baton-arenas-"))
            atexit.register(shutil.rmtree, _arena_dir[0], True)
        d = os.path.join(_arena_dir[0], str(len(_arenas)))
        os.mkdir(d, 0o700)
        path = os.path.join(d, name + ".arena")
        subprocess.run([ARENA, "create"] + list(create_args) + [path], check=True, stdout=subprocess.DEVNULL,
                       timeout=120)
        _arenas[key] = path
    return _arenas[key]


def model_arena(model):
    """The arena of one of the trained models in models/ (shared_arena)."""
    return shared_arena("--safetensors", os.path.join(ROOT, "models", model), name=model)


TINY_MODEL = "tiny-qwen3-moe"


def tiny_model_arena(template=None, name=TINY_MODEL):
    """The tiny test model as an arena (shared_arena), named `name`:
    tests/fixtures/arena/hf/qwen3_moe (random weights by transformers, a
    byte-level BPE tokenizer of 300 pieces, 2 layers of 32) with Qwen3's
    chat template (models/kjv-qwen3-moe's, which takes tools and thinks;
    the fixture's own takes neither), or with `template` (its text), so
    the clients' tool and reasoning paths run on it too."""
    key = ("tiny", name, template)
    if key not in _arenas:
        src = os.path.join(ROOT, "tests", "fixtures", "arena", "hf", "qwen3_moe")
        d = tempfile.mkdtemp(prefix="baton-tiny-")
        atexit.register(shutil.rmtree, d, True)
        folder = os.path.join(d, name)
        shutil.copytree(src, folder)
        if template is None:
            shutil.copy(os.path.join(ROOT, "models", "kjv-qwen3-moe", "chat_template.jinja"),
                        os.path.join(folder, "chat_template.jinja"))
        else:
            with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
                f.write(template)
        _arenas[key] = shared_arena("--safetensors", folder, name=name)
    return _arenas[key]


class EngineCase(Case):
    """Engines alone (no broker), on the host backend."""

    prefix = "baton-serve-"

    def arena(self, layers=4, experts=16, d_model=256, d_ff=512, dtype="f16"):
        """A synthetic arena, shared by the script's cases (shared_arena)."""
        return shared_arena(*synthetic_args(layers, experts, d_model, d_ff, dtype))

    def engine(self, name, arena, *flags, host_mib=256):
        url = "ipc://%s/%s.sock" % (self.dir, name)
        p = subprocess.Popen([ENGINE, "--name", name, "--shared-expert-arena", arena,
                              "--listen", url, "--backend", "host", "--host-device-mib",
                              str(host_mib)] + list(flags),
                             stdout=subprocess.PIPE, stderr=open(self.log(name), "w"),
                             env=self.env, text=True)
        self.procs.append(p)
        line = p.stdout.readline()
        if not line.startswith("ready "):
            p.wait(5)
            raise AssertionError("engine %s did not start (exit %s): %s" %
                                 (name, p.returncode, open(self.log(name)).read()))
        p.url = url
        p.name = name
        return p


# The broker tests' model: 4 layers x 8 experts, d_model 256, d_ff 512, f16:
# 32 experts of 0.75 MiB; with 4 MiB segments the whole cache is 7 segments
# = 28 MiB, plus about 0.6 MiB of dense tensors per engine on the device.
# So a 40 MiB device holds one engine, a 64 MiB device two.
CEIL = 28 * MIB


class BrokerCase(Case):
    """A broker and engines registered with it, on the host backend.
    `call` is the request function the fixture's own requests use
    (call_retry for the reliability scripts)."""

    prefix = "baton-broker-"

    def __init__(self, call=call):
        super().__init__()
        self.call = call
        self.control = "ipc://%s/broker.sock" % self.dir
        self.events_url = "ipc://%s/events.sock" % self.dir
        self._arena = None
        self.bp = None

    def arena(self):
        """The broker tests' model (CEIL), shared by the script's cases."""
        if not self._arena:
            self._arena = shared_arena(*synthetic_args())
        return self._arena

    def _config(self, config, http):
        path = os.path.join(self.dir, "broker.ini")
        with open(path, "w") as f:
            f.write("[broker]\ncontrol = %s\nevents = %s\n" % (self.control, self.events_url))
            if http:
                f.write("http = 127.0.0.1:0\n")
            elif not re.search(r"^\s*http\s*=", config, re.M):
                # not the default 127.0.0.1:8420: one port for every broker
                # would collide between the scripts that run at once
                f.write("http = off\n")
            f.write(config)
        return path

    def _subscribe(self):
        if not self.events:
            self.events = Events(self.events_url)  # up before the first event

    def broker(self, config="", wait=True):
        p = subprocess.Popen([BROKER, "--config", self._config(config, False)], stdout=subprocess.PIPE,
                             stderr=open(self.log("broker"), "a"), env=self.env, text=True)
        self.procs.append(p)
        self.bp = p
        if wait:
            line = p.stdout.readline()
            if not line.startswith("ready "):
                p.wait(5)
                raise AssertionError("broker did not start (exit %s): %s" %
                                     (p.returncode, open(self.log("broker")).read()))
            self._subscribe()
        return p

    def http_broker(self, config="", args=(), token=None):
        """A broker on a free HTTP port (never the default 8420); returns its
        Http client (with `token` for requests)."""
        p = subprocess.Popen([BROKER, "--config", self._config(config, True)] + list(args),
                             stdout=subprocess.PIPE, stderr=open(self.log("broker"), "a"),
                             env=self.env, text=True)
        self.procs.append(p)
        self.bp = p
        line = p.stdout.readline().split()
        if len(line) != 4 or line[0] != "ready":
            p.wait(5)
            raise AssertionError("broker did not start: %r %s" % (line, open(self.log("broker")).read()))
        if self.events:
            self.events.close()
            self.events = None
        self._subscribe()
        made = os.path.join(self.dir, "http.token")  # made by the broker when none is configured
        if token is None and os.path.exists(made):
            token = open(made).read().strip()
        return Http(line[3], token)

    def engine(self, name, *flags, host_mib=40, broker=True, wait=True, env=None, arena=None, segment_mib=4):
        url = "ipc://%s/%s.sock" % (self.dir, name)
        args = [ENGINE, "--name", name, "--shared-expert-arena", arena or self.arena(), "--listen", url,
                "--backend", "host", "--host-device-mib", str(host_mib), "--vram-segment-mib",
                str(segment_mib), "--expert-cache-release"] + list(flags)
        if broker:
            args += ["--broker", self.control]
        e = dict(self.env)
        e.update(env or {})
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(self.log(name), "a"), env=e,
                             text=True)
        self.procs.append(p)
        p.url = url
        p.name = name
        if wait:
            self.wait_ready(p)
        return p

    def wait_ready(self, p, timeout=15):
        box = {}
        t = threading.Thread(target=lambda: box.update(line=p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        line = box.get("line", "")
        if not line.startswith("ready "):
            raise AssertionError("engine %s did not start: %r %s" % (p.name, line, open(self.log(p.name)).read()))

    def status(self):
        return ok(self.call(self.control, "status"))

    def eng(self, name):
        for e in self.status()["engines"]:
            if e["name"] == name:
                return e
        return None

    def holds(self):
        return {e["name"]: e["resident"] for e in self.status()["engines"]}

    def want_holds(self, want, timeout=5):
        """Waits until the broker's resident per engine is `want`: an
        engine's state reaches the broker after the engine's own reply or
        its "ready" line. Fails with what it saw last."""
        return wait_value("the broker's holdings", self.holds, want, timeout=timeout * SLOW)

    def hostdev_used(self, index=0):
        """(capacity, bytes charged by live processes) on the host device."""
        capacity, owners = hostdev_owners(self.dir, index)
        return capacity, sum(owners.values())

    def per_pid(self, index=0):
        return hostdev_owners(self.dir, index)[1]

    def accounting(self, procs):
        """Broker == engines == host device, within the heartbeat timeout:
        the broker's resident per engine is the engine's mapped, each
        engine's charge beyond its mapped is the same dense overhead, and
        the device's used bytes are total - free. Returns (statuses, over)."""
        last = []

        def agree():
            st = {p.name: ok(self.call(p.url, "status")) for p in procs}
            held = {e["name"]: e["resident"] for e in self.status()["engines"]}
            cap, used = self.hostdev_used()
            charged = self.per_pid()
            over = {p.name: charged.get(p.pid, 0) - st[p.name]["mapped"] for p in procs}
            s0 = next(iter(st.values()))
            last[:] = [st, held, used, over]
            if any(held.get(n) != s["mapped"] for n, s in st.items()):
                return None
            if used != s0["total"] - s0["free"] or len(set(over.values())) != 1:
                return None
            return st, over
        try:
            return wait_for("broker, engines and device agree", agree, timeout=6, every=0.2)
        except AssertionError:
            raise AssertionError("no agreement: engines %s, broker %s, device used %s, charge beyond mapped %s" %
                                 tuple(last))


def gen(p, seed=1, steps=2, batch=1, timeout_ms=30000, call=call):
    return call(p.url, "gen", timeout_ms=timeout_ms, steps=steps, batch=batch, seed=seed)


def long_steps(p, seconds, batch=16, call=call):
    """Steps of a GEN of batch rows that lasts about `seconds` on p, timed
    by a 40-step one now: a request that must still run while a case looks
    (busy, queued behind it) lasts as long on a fast host as on a slow one
    or under a sanitizer. Timed by the engine's own total_ms, not around the
    call: a sanitizer's slow start of the client would pass for slow steps.
    p must hold its memory already (the timed GEN would acquire it)."""
    r = ok(gen(p, seed=1, steps=40, batch=batch, timeout_ms=int(60000 * SLOW), call=call))
    return max(40, min(100000, int(40 * seconds / max(r["total_ms"] / 1e3, 1e-4))))


_refs = {}


def reference(c, seed, steps=2, batch=1):
    """The (checksum, output) a lone engine (no broker, its own device)
    computes on c's arena, for seeds 0..7."""
    key = (seed, steps, batch)  # every fixture's arena is the same model
    if key not in _refs:
        d = tempfile.mkdtemp(prefix="baton-ref-")
        try:
            url = "ipc://%s/ref.sock" % d
            p = subprocess.Popen([ENGINE, "--name", "ref", "--shared-expert-arena", c.arena(), "--listen",
                                  url, "--backend", "host", "--host-device-mib", "128"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 env=dict(os.environ, BATON_HOSTDEV_DIR=d))
            try:
                assert p.stdout.readline().startswith("ready")
                for s in range(8):
                    r = ok(c.call(url, "gen", steps=steps, batch=batch, seed=s))
                    _refs[(s, steps, batch)] = (r["checksum"], r["output"])
            finally:
                p.kill()
                p.wait()
        finally:
            shutil.rmtree(d, ignore_errors=True)
    return _refs[key]


def check_gen(c, p, seed):
    r = ok(gen(p, seed=seed, call=c.call))
    want = reference(c, seed)
    assert (r["checksum"], r["output"]) == want, "%s seed %d: wrong output" % (p.name, seed)
    return r


# ---- terminals ----------------------------------------------------------------

def pty_open(rows=30, cols=120):
    """A pseudo-terminal of rows x cols: (master, slave) descriptors."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, slave


def pty_read_until(master, pred, timeout=10):
    """What the terminal's master end reads until pred(bytes so far) holds,
    the other end closes, or `timeout` s pass."""
    got = b""
    end = time.time() + timeout
    while time.time() < end and not pred(got):
        rl, _, _ = select.select([master], [], [], 0.2)
        if rl:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end closed
                break
            if not chunk:
                break
            got += chunk
    return got


def run_on_pty(argv, env, timeout=60, rows=30, cols=120):
    """Runs argv with stderr on a pseudo-terminal (stdout a pipe): (exit
    status, stdout, what the terminal got), both decoded."""
    master, slave = pty_open(rows, cols)
    p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    got = b""
    end = time.time() + timeout
    try:
        while time.time() < end:
            rl, _, _ = select.select([master], [], [], 1)
            if not rl:
                if p.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the other end closed
                break
            if not chunk:
                break
            got += chunk
        out = p.stdout.read().decode()
        rc = p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return rc, out, got.decode(errors="replace")


# ---- the HTTP API -------------------------------------------------------------

class Http:
    def __init__(self, url, token=None):
        assert url.startswith("http://"), url
        host, port = url[7:].rsplit(":", 1)
        self.host, self.port, self.token = host, int(port), token
        self.url = url

    def req(self, method, path, body=None, token=True, headers=None, timeout=30):
        """(status, parsed JSON or text, headers)."""
        h = dict(headers or {})
        if token and self.token:
            h["Authorization"] = "Bearer " + (token if isinstance(token, str) else self.token)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if body is not None or method == "POST":
            h.setdefault("Content-Type", "application/json")  # the broker takes JSON only
        h = {k: v for k, v in h.items() if v is not None}  # None: leave the header out
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            ctype = r.getheader("Content-Type") or ""
            out = json.loads(data) if data and ctype.startswith("application/json") else data.decode()
            return r.status, out, dict(r.getheaders())
        finally:
            c.close()

    def get(self, path, **kw):
        return self.req("GET", path, **kw)

    def post(self, path, body=None, **kw):
        return self.req("POST", path, body=body, **kw)

    def sse(self, path, body, on_open=None, timeout=60):
        """POSTs a streamed request (server-sent events); returns (events,
        arrival times): each event the parsed JSON of one `data:` line
        ("[DONE]" as is). on_open(response) runs once the headers are in."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        hdr = {"Content-Type": "application/json"}
        if self.token:
            hdr["Authorization"] = "Bearer " + self.token
        try:
            c.request("POST", path, body=json.dumps(body), headers=hdr)
            r = c.getresponse()
            assert r.status == 200, (r.status, r.read())
            assert r.getheader("Content-Type").startswith("text/event-stream"), r.getheaders()
            events, times = [], []
            if on_open:
                on_open(r)
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.decode().rstrip("\n")
                if not line:
                    continue
                assert line.startswith("data: "), line
                events.append(sse_event(line[6:]))
                times.append(time.time())
            return events, times
        finally:
            c.close()

    def open_stream(self, path, body, timeout=60):
        """Sends a streamed request on a raw socket; returns the socket after
        the reply's headers (200 and text/event-stream checked): the test
        reads the chunked body itself (dechunk, sse_events)."""
        data = json.dumps(body).encode()
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        auth = "Authorization: Bearer %s\r\n" % self.token if self.token else ""
        s.sendall(("POST %s HTTP/1.1\r\nHost: %s:%d\r\n%sContent-Type: application/json\r\n"
                   "Content-Length: %d\r\n\r\n" % (path, self.host, self.port, auth, len(data))).encode() + data)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(1)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"text/event-stream" in head, head
        return s

    def raw_line(self, data, timeout=10):
        """Sends bytes as they are; returns what came back up to the end of
        the status line (b"" when nothing did)."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            s.sendall(data)
            got = b""
            while b"\r\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            return got
        except (ConnectionResetError, BrokenPipeError, socket.timeout):
            return b""
        finally:
            s.close()

    def raw(self, data, timeout=10):
        """Sends bytes as they are; returns the status line's code (0: none)."""
        parts = self.raw_line(data, timeout).split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


ENGINE_TOKEN = "engine-token-0123456789abcdef"  # engine_token_file's


def engine_token_file(d):
    """A token file (0600) for an engine's --http-token-file in d: under a
    broker an engine otherwise makes a token only the door knows (issue
    28), and a test that talks to the engine directly is its owner."""
    path = os.path.join(d, "engine.token")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, (ENGINE_TOKEN + "\n").encode())
        os.close(fd)
    return path


OTHER_UID = 65534  # nobody: the second local user of the trust tests

# Run as root by private_ns(): a mount namespace of its own (CLONE_NEWNS,
# every mount made private first, so nothing propagates back), a fresh
# tmpfs over /tmp and /dev/shm, the directories in "keep" bound back at
# their paths (a case's directory under /tmp: its sockets), then, when
# "uid" is set, that user with no supplementary groups, and exec "argv".
# It checks that its /tmp is not the machine's before it runs anything:
# nothing done inside can change the machine's /tmp or /dev/shm.
_NS_SETUP = r"""
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
def check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        sys.stderr.write("private_ns: %s: %s\n" % (what, os.strerror(e)))
        sys.exit(3)
def mount(src, dst, fs, flags, data):
    check(libc.mount(src and src.encode(), dst.encode(), fs and fs.encode(), ctypes.c_ulong(flags),
                     data and data.encode()), "mount %s" % dst)
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
check(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
mount(None, "/", None, MS_REC | MS_PRIVATE, None)
held = [(d, os.open(d, os.O_PATH | os.O_DIRECTORY)) for d in spec["keep"]]
for d in ("/tmp", "/dev/shm"):
    mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=256m")
for d, fd in held:
    os.makedirs(d, exist_ok=True)
    mount("/proc/self/fd/%d" % fd, d, None, MS_BIND | MS_REC, None)
    os.close(fd)
if os.readlink("/proc/self/ns/mnt") == spec["ns"] or os.stat("/tmp").st_dev == spec["tmp_dev"]:
    sys.stderr.write("private_ns: still in the machine's mount namespace\n")
    sys.exit(3)
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
os.execve(spec["argv"][0], spec["argv"], spec["env"])
"""


def private_ns(argv, uid=None, keep=(), env=None, **kw):
    """The argv for subprocess that runs `argv` in a private mount
    namespace made for it (a fresh tmpfs over /tmp and /dev/shm, `keep`
    bound back), as `uid` (None: as we are, root). A daemon and a second
    user started inside (as_other_user(..., ns=False)) share that /tmp and
    /dev/shm; the machine's are never changed. Needs root (CI's)."""
    # the source tree and the build (the programs, tests/ for harness) stay
    # seen where they are when they lie under /tmp or /dev/shm (a clone in
    # /tmp, as a newcomer's or CI's may be)
    keep = list(keep) + [d for d in (ROOT, os.path.join(ROOT, BUILD))
                         if os.path.isdir(d) and os.path.realpath(d).startswith(("/tmp/", "/dev/shm/"))]
    spec = dict(argv=[str(a) for a in argv], uid=uid, keep=[os.path.realpath(k) for k in keep],
                env=dict(os.environ) if env is None else env, ns=os.readlink("/proc/self/ns/mnt"),
                tmp_dev=os.stat("/tmp").st_dev)
    return [sys.executable, "-c", _NS_SETUP, json.dumps(spec)]


def as_other_user(code, *args, timeout=60, keep=(), ns=True):
    """Runs a Python snippet as a second local user (uid and gid 65534, no
    supplementary groups: not in the service group), with `args` in
    sys.argv[1:] and tests/ on its path (harness importable); returns what
    it printed as JSON on its last line. The tests run as root, so the
    child is a real other uid, as the attacker of issue 28 was. It runs in
    a private mount namespace (private_ns: its own /tmp and /dev/shm, the
    directories in `keep` seen at their paths); ns=False, from inside one,
    shares the namespace it is called in."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.path.join(ROOT, "tests")}
    argv = [sys.executable, "-c", code] + [str(a) for a in args]
    if ns:
        cmd, kw = private_ns(argv, uid=OTHER_UID, keep=keep, env=env), {}
    else:
        cmd, kw = argv, dict(user=OTHER_UID, group=OTHER_UID, extra_groups=[], env=env)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/", **kw)
    assert p.returncode == 0, "as uid %d: exit %d: %s" % (OTHER_UID, p.returncode, p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def sse_event(data):
    """One `data:` line's payload: its JSON, or "[DONE]" as is."""
    return data if data == "[DONE]" else json.loads(data)


def sse_events(text):
    """The events of a server-sent event stream's text (bytes or str)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return [sse_event(line.strip()[6:]) for line in text.split("\n") if line.strip().startswith("data: ")]


def read_to_eof(s):
    """All a socket sends until the peer closes it."""
    raw = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return raw
        raw += chunk


def chunks_of(raw):
    """The data of a chunked body's chunks, and whether its end (the 0
    chunk) came (dechunk, below, wants the end)."""
    out, i = b"", 0
    while True:
        j = raw.find(b"\r\n", i)
        if j < 0:
            return out, False
        n = int(raw[i:j].split(b";")[0], 16)
        if n == 0:
            return out, True
        out += raw[j + 2:j + 2 + n]
        i = j + 2 + n + 2


def dechunk(raw):
    """The body of an HTTP/1.1 chunked transfer, up to its last chunk."""
    out, i = b"", 0
    while True:
        j = raw.index(b"\r\n", i)
        n = int(raw[i:j].split(b";")[0], 16)
        if n == 0:
            return out
        out += raw[j + 2:j + 2 + n]
        i = j + 2 + n + 2


def expect(got, status, code=None):
    """The body of an HTTP reply with `status`; with `code`, an error body
    carrying that code, a number and a message."""
    st, body, _ = got
    assert st == status, "want %d, got %d: %s" % (status, st, body)
    if code is not None:
        assert isinstance(body, dict) and body.get("ok") is False and body.get("code") == code and \
            isinstance(body.get("err"), int) and body.get("message"), body
    return body


# ---- the runner ---------------------------------------------------------------

def need(path):
    """Exits with a counted failure when a program is not built."""
    if not os.access(path, os.X_OK):
        print("FAIL no %s (build it first)" % path)
        print("0 passed, 1 failed")
        sys.exit(1)


def run_cases(cases, only=(), make=BrokerCase, logs=("broker", "a", "b", "c"), summary=None):
    """Runs each case (all when `only` is empty; names in `only` that start
    with "-" leave that case out, as tests/run.sh's SCRIPT::-CASE does)
    with a fresh fixture from make() (make=None: the case takes no fixture). A sanitizer report in
    any log fails the case; on failure the traceback and the logs' tails
    are shown. A case may return a string: it follows its "ok" line.
    summary(), when given, prints before the last line, which is
    "N passed, N failed". Returns the exit status."""
    passed = failed = 0
    names = {c.__name__ for c in cases}
    skip = {n[1:] for n in only if n.startswith("-")}
    only = [n for n in only if not n.startswith("-")]
    unknown = sorted((set(only) | skip) - names)
    if unknown:  # a typo would run nothing, or everything, and pass
        print("FAIL no such case: %s" % ", ".join(unknown))
        print("0 passed, 1 failed")
        return 1
    listing = os.environ.get("BATON_LIST_CASES") == "1"
    for case in cases:
        if (only and case.__name__ not in only) or case.__name__ in skip:
            continue
        if listing:  # tests/run_test.py: which cases these arguments select
            print("case %s" % case.__name__)
            continue
        c = make() if make else None
        t0 = time.time()
        try:
            note = case(c) if make else case()
            if c is not None:
                c.logs_clean()
            print("ok   %-44s %7.3fs%s" % (case.__name__, time.time() - t0,
                                          "  " + note if isinstance(note, str) else ""))
            passed += 1
        except Exception:
            print("FAIL %s" % case.__name__)
            traceback.print_exc(file=sys.stdout)
            if c is not None:
                c.tails(logs)
            failed += 1
        finally:
            if c is not None:
                c.close()
        sys.stdout.flush()
    if summary:
        summary()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0
