#!/usr/bin/python3
"""hangup_test.py: peers that connect to a control socket and hang up
before the SP handshake, against a real broker and a real engine (issue 14,
item 1; the cause and the fix are in docs/internals/transport.md).

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
import socket
import subprocess
import sys
import threading
import time

import msgpack

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

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
    r = subprocess.run([h.TOOL, "call", url, "--timeout", "3000", "--repeat", str(n)], input=req,
                       capture_output=True, timeout=120 * h.SLOW)
    out[key] = (r.returncode, r.stdout.decode(errors="replace").strip(),
                r.stderr.decode(errors="replace").strip())


def cli(c, *args):
    return subprocess.run([h.CLI, "--broker", c.control, "--timeout", "2s"] + list(args),
                          capture_output=True, text=True, timeout=30 * h.SLOW)


def t_hangups_then_calls(c):
    b = c.broker("http = off\n")  # and its event subscriber, c.events
    e = c.engine("a")
    # Both sides warm: the engine registered, one call each way.
    h.ok(c.call(c.control, "status"))
    h.ok(c.call(e.url, "status"))
    time.sleep(0.3)
    start = {"broker": fds(b.pid), "engine": fds(e.pid)}
    registered = open(c.log("broker")).read().count("engine a registered")

    t0 = time.time()
    for url in (c.control, c.events_url, e.url):
        hang_up(url[len("ipc://"):], HANGUPS)
    t_hang = time.time() - t0

    t0 = time.time()
    out = {}
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
        r = cli(c, "gpus")
        assert r.returncode == 0, "baton gpus, call %d: exit %d: %s" % (i + 1, r.returncode, r.stderr)
    t_calls = time.time() - t0

    # events still reach the subscriber connected before the hang-ups
    r = cli(c, "release", "a")
    assert r.returncode == 0, (r.returncode, r.stderr)
    h.wait_for("a release event", lambda: c.events.all("release", "a"), timeout=10 * h.SLOW)
    # The engine's own connection to the broker was never dropped (the old
    # workaround's listener restarts dropped it: it registered again).
    log = open(c.log("broker")).read()
    again = log.count("engine a registered") - registered
    assert again == 0, "the engine registered again %d times:\n%s" % (again, log[-2000:])
    end = {"broker": settle(b.pid, start["broker"]), "engine": settle(e.pid, start["engine"])}
    assert end == start, "descriptors: at start %s, at the end %s" % (start, end)
    return "%d hang-ups x 3 sockets %.1f s, %d + %d calls and 10 CLI calls %.1f s, fds %s" % (
        HANGUPS, t_hang, CALLS, CALLS, t_calls, end)


CASES = [t_hangups_then_calls]

if __name__ == "__main__":
    sys.exit(h.run_cases(CASES, sys.argv[1:], logs=("broker", "a")))
