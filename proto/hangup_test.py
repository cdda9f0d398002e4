#!/usr/bin/python3
"""hangup_test.py: peers that connect to a control socket and hang up
before the SP handshake, against a real broker and a real engine (issue 14,
item 1; the cause and the fix are in docs/transport.md).

nng 1.5.2 stopped a listener for good on such a hang-up; Baton's old
workaround restarted listeners and leaked descriptors doing it. Here: 1,000
hang-ups on each listening socket (broker control and events, engine),
some in bursts and some spaced out, then 1,000 calls to the broker and
1,000 to the engine, each on a new connection as a CLI call makes one, plus
real `baton` CLI calls. Every call is answered, the engine's connection to
the broker is never dropped, an event still reaches a subscriber connected
before, and each process ends with the descriptors it started with.

Run with /usr/bin/python3 (python3-msgpack). BUILD names the build folder.
Last line: "N passed, N failed".
"""
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import msgpack

BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(BUILD, "bin")
BROKER = os.path.join(BIN, "baton-broker")
ENGINE = os.path.join(BIN, "baton-engine")
ARENA = os.path.join(BIN, "baton-arena")
TOOL = os.path.join(BIN, "baton-proto-tool")
CLI = os.path.join(BIN, "baton")
HANGUPS = 1000
CALLS = 1000


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def settle(pid, want, timeout=5.0):
    """The process's descriptor count once it is back to want (nng reaps
    closed pipes a little later), or its count at the deadline."""
    deadline = time.time() + timeout
    n = fds(pid)
    while n != want and time.time() < deadline:
        time.sleep(0.05)
        n = fds(pid)
    return n


def hang_up(path, n, pause_every=100, pause=0.1):
    """n connect()+close() on a unix socket, with no handshake; a pause
    after every pause_every of them (spaced hang-ups stopped the old
    workaround too)."""
    for i in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.close()
        if (i + 1) % pause_every == 0:
            time.sleep(pause)


def repeat_call(url, op, n, out, key):
    """n calls of op, each on a new connection, in one tool process."""
    req = msgpack.packb({"v": 1, "op": op, "id": 1})
    r = subprocess.run([TOOL, "call", url, "--timeout", "3000", "--repeat", str(n)], input=req,
                       capture_output=True, timeout=120)
    out[key] = (r.returncode, r.stdout.decode(errors="replace").strip(),
                r.stderr.decode(errors="replace").strip())


class Case:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="baton-hangup-")
        self.procs = []
        self.env = dict(os.environ, BATON_HOSTDEV_DIR=self.dir, BATON_NVML="0")
        self.control = "ipc://%s/broker.sock" % self.dir
        self.events = "ipc://%s/events.sock" % self.dir

    def log(self, name):
        return os.path.join(self.dir, name + ".log")

    def start(self, name, args):
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(self.log(name), "a"),
                             env=self.env, text=True)
        self.procs.append(p)
        box = {}
        t = threading.Thread(target=lambda: box.update(line=p.stdout.readline()), daemon=True)
        t.start()
        t.join(20)
        if not box.get("line", "").startswith("ready "):
            raise AssertionError("%s did not start: %r %s" % (name, box.get("line"),
                                                              open(self.log(name)).read()))
        return p

    def broker(self):
        ini = os.path.join(self.dir, "broker.ini")
        with open(ini, "w") as f:
            f.write("[broker]\ncontrol = %s\nevents = %s\nhttp = off\n" % (self.control, self.events))
        return self.start("broker", [BROKER, "--config", ini])

    def engine(self, name):
        arena = os.path.join(self.dir, "m.arena")
        subprocess.run([ARENA, "create", "--synthetic", "--layers", "2", "--experts", "4", "--top-k", "2",
                        "--d-model", "128", "--d-ff", "256", "--dtype", "f16", "--seed", "3", arena],
                       check=True, stdout=subprocess.DEVNULL, timeout=60)
        url = "ipc://%s/%s.sock" % (self.dir, name)
        p = self.start(name, [ENGINE, "--name", name, "--shared-expert-arena", arena, "--listen", url,
                              "--backend", "host", "--host-device-mib", "32", "--vram-segment-mib", "4",
                              "--expert-cache-release", "--broker", self.control])
        p.url = url
        return p

    def cli(self, *args):
        return subprocess.run([CLI, "--broker", self.control, "--timeout", "2s"] + list(args),
                              capture_output=True, text=True, timeout=30)

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def t_hangups_then_calls(c):
    b = c.broker()
    e = c.engine("a")
    # Both sides warm: the engine registered, one call each way.
    r = c.cli("--json", "engines")
    assert r.returncode == 0 and '"a"' in r.stdout, (r.returncode, r.stdout, r.stderr)
    out = {}
    repeat_call(e.url, "status", 1, out, "e")
    assert out["e"][0] == 0, out
    # a subscriber connected before the hang-ups
    sub = subprocess.Popen([TOOL, "sub", c.events], stdout=subprocess.PIPE, text=True)
    c.procs.append(sub)
    time.sleep(0.3)
    start = {"broker": fds(b.pid), "engine": fds(e.pid)}
    registered = open(c.log("broker")).read().count("engine a registered")

    t0 = time.time()
    for url in (c.control, c.events, e.url):
        hang_up(url[len("ipc://"):], HANGUPS)
    t_hang = time.time() - t0

    t0 = time.time()
    threads = [threading.Thread(target=repeat_call, args=(c.control, "status", CALLS, out, "b")),
               threading.Thread(target=repeat_call, args=(e.url, "status", CALLS, out, "e"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key, who in (("b", "broker"), ("e", "engine")):
        rc, stdout, stderr = out[key]
        assert rc == 0, "calls to the %s after the hang-ups: exit %d: %s %s" % (who, rc, stderr, stdout)
    # and the CLI itself, as a user runs it
    for i in range(10):
        r = c.cli("gpus")
        assert r.returncode == 0, "baton gpus, call %d: exit %d: %s" % (i + 1, r.returncode, r.stderr)
    t_calls = time.time() - t0
    # events still reach the subscriber
    r = c.cli("release", "a")
    assert r.returncode == 0, (r.returncode, r.stderr)
    seen = []

    def read_events():
        for line in sub.stdout:
            seen.append(line)
            if '"release"' in line:
                return
    t = threading.Thread(target=read_events, daemon=True)
    t.start()
    t.join(10)
    assert any('"release"' in line for line in seen), "no release event: %r" % seen

    # The engine's own connection to the broker was never dropped (the old
    # workaround's listener restarts dropped it: it registered again).
    log = open(c.log("broker")).read()
    again = log.count("engine a registered") - registered
    assert again == 0, "the engine registered again %d times:\n%s" % (again, log[-2000:])
    end = {"broker": settle(b.pid, start["broker"]), "engine": settle(e.pid, start["engine"])}
    assert end == start, "descriptors: at start %s, at the end %s" % (start, end)
    print("  %d hang-ups on 3 sockets in %.1f s; %d + %d calls and 10 CLI calls in %.1f s; fds %s"
          % (HANGUPS, t_hang, CALLS, CALLS, t_calls, end))


CASES = [t_hangups_then_calls]


def main():
    only = sys.argv[1:]
    passed = failed = 0
    for case in CASES:
        if only and case.__name__ not in only:
            continue
        c = Case()
        t0 = time.time()
        try:
            case(c)
            for name in os.listdir(c.dir):  # a sanitizer's report fails the case
                if name.endswith(".log"):
                    text = open(os.path.join(c.dir, name), errors="replace").read()
                    assert "runtime error:" not in text and "Sanitizer" not in text, (name, text[-3000:])
            print("ok   %-44s %7.3fs" % (case.__name__, time.time() - t0))
            passed += 1
        except Exception:
            print("FAIL %s" % case.__name__)
            traceback.print_exc(file=sys.stdout)
            for name in ("broker", "a"):
                if os.path.exists(c.log(name)):
                    print("  --- %s.log (last lines)" % name)
                    for line in open(c.log(name)).read().splitlines()[-15:]:
                        print("  " + line)
            failed += 1
        finally:
            c.close()
        sys.stdout.flush()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
