#!/usr/bin/python3
"""broker_start_test.py: how baton-engine --broker starts (issue 15).

- A second engine of a name the broker has registered already exits 3
  with a message naming the other engine, without printing `ready`.
- A --broker URL where nothing answers: the engine waits --broker-wait
  seconds and exits 4 naming the URL; with --broker-optional it serves
  alone as before, and registers when the broker comes.
- An engine that registered keeps serving when the broker goes away.

The last line is "N passed, N failed".
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import CEIL, BrokerCase, call, check_gen, ok, run_cases, wait_for  # noqa: E402


def finish(c, p, timeout):
    """(exit status, stdout, the engine's log) of an engine that must exit."""
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError("%s did not exit within %s s: %s" % (p.name, timeout, open(c.log(p.name)).read()))
    return p.returncode, out, open(c.log(p.name)).read()


def t_name_taken(c):
    c.broker()
    a = c.engine("a")
    # The second "a" must not take device memory under the broker's nose.
    b = c.engine("a", "--listen", "ipc://%s/a2.sock" % c.dir, wait=False)
    rc, out, log = finish(c, b, 15)  # both write a.log
    assert rc == 3, (rc, out, log)
    assert "ready" not in out, out
    assert "already registered (pid %d)" % a.pid in log, log
    assert "refused to register" in log, log
    # The first one is untouched: still registered, still serving.
    assert c.eng("a")["pid"] == a.pid, c.eng("a")
    check_gen(c, a, 1)


def t_no_broker_exits(c):
    # Nothing listens at --broker (a typo): a clear error after --broker-wait.
    c.control = "ipc://%s/typo.sock" % c.dir
    a = c.engine("a", "--broker-wait", "1.5", wait=False)
    t0 = time.time()
    rc, out, log = finish(c, a, 15)
    took = time.time() - t0
    assert rc == 4, (rc, out, log)
    assert "ready" not in out, out
    assert "no broker answered at %s" % c.control in log and "--broker-optional" in log, log
    assert took >= 1.4, took
    # Nothing stays charged to it on the device.
    assert c.hostdev_used()[1] == 0, c.per_pid()


def t_broker_wait_flags(c):
    a = c.arena()
    for args in (["--broker-wait", "0"], ["--broker-wait", "x"], ["--broker-wait", "-1"],
                 ["--broker-optional"], ["--broker-wait", "3"]):
        r = subprocess.run([os.path.join(os.environ.get("BUILD", "build"), "bin", "baton-engine"),
                            "--name", "x", "--shared-expert-arena", a] + args,
                           capture_output=True, text=True, env=c.env, timeout=10)
        assert r.returncode == 2 and "baton-engine:" in r.stderr, (args, r.returncode, r.stderr)


def t_broker_optional(c):
    # As before, when asked: no broker yet, the engine warms alone and serves.
    a = c.engine("a", "--broker-optional")
    assert ok(call(a.url, "status"))["mapped"] == CEIL
    check_gen(c, a, 1)
    c.broker()
    wait_for("a registered", lambda: c.eng("a") is not None, timeout=2.5)
    c.want_holds({"a": CEIL})


def t_broker_away_later(c):
    # Registered once: the broker's going away later does not stop it.
    c.broker()
    a = c.engine("a")
    c.bp.kill()
    c.bp.wait()
    time.sleep(0.5)
    check_gen(c, a, 2)
    assert a.poll() is None


CASES = [t_name_taken, t_no_broker_exits, t_broker_wait_flags, t_broker_optional, t_broker_away_later]

if __name__ == "__main__":
    sys.exit(run_cases(CASES, sys.argv[1:], make=BrokerCase))
