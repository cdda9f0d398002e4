#!/usr/bin/python3
"""fault_test.py: injected device and transport faults (BATON_FAULT, see
engine/backend/backend.h, fault_wrap) on every path of release, refill, resize (vram), GEN and
handoff, through a broker with two engines on the host backend.

Each run: a broker, engine a started with BATON_FAULT="<op>:<N>" and a
fault-free engine b on a device that holds one of them. The script drives a
(gen: a handoff b -> a; release; refill; vram shrink and grow; handoff a ->
b and back; gen) and checks that
  - every request gets a reply (ok, or a clean error), no process crashes
    (an engine that fails at start exits with a message and status 1);
  - afterwards a serves a GEN with the fault-free checksum;
  - the broker's resident per engine equals the engine's own mapped, and
    the host device's charge per engine is its mapped plus the same dense
    overhead as the fault-free engine (nothing leaked), and the device's
    used bytes equal total - free in the engines' status.

op: map, alloc, copy, d2h (engine/backend/fault.c) and send (proto/transport.c) in
engine a; bsend: send in the broker (its replies and commands to engines).
N sweeps the calls a fault-free run makes: all of them with
BATON_RELIABILITY=1, a spread of a few per op otherwise (under a minute).
BATON_FAULT_OPS=send,bsend runs only those ops; BATON_FAULT_RUNS=send:4,bsend:10
only those runs (to go after one failure).
Prints how many faults were injected. Last line "N passed, N failed".
"""
import os
import re
import signal
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

FULL = os.environ.get("BATON_RELIABILITY") == "1"
OPS = ["map", "alloc", "copy", "d2h", "send", "bsend"]
injected_total = [0]


def reply_or_clean_error(rep, what, allow_timeout=False):
    """A reply (ok or an error code); no answer at all is a failure unless
    the fault dropped it (send)."""
    if "error" in rep:  # baton-proto-tool: no reply
        assert allow_timeout, "%s: no reply: %s" % (what, rep)
        return "noreply"
    assert rep.get("ok") in (True, False), (what, rep)
    if rep["ok"] is False:
        assert isinstance(rep.get("err"), int) and rep["err"] > 0 and rep.get("msg"), (what, rep)
    return "ok" if rep["ok"] else "err"


def counts(log):
    text = open(log, errors="replace").read()
    m = re.findall(r"baton-fault: calls map=(\d+) alloc=(\d+) copy=(\d+) d2h=(\d+) injected=(\d+)", text)
    return dict(zip(["map", "alloc", "copy", "d2h", "injected"], map(int, m[-1]))) if m else None


def faults_in(log):
    return len(re.findall(r"^baton-fault: \w+ call \d+ fails", open(log, errors="replace").read(), re.M))


def scenario(c, spec, timeout_ms=8000):
    """One run with engine a under BATON_FAULT=spec. Returns (a's log, outcome)."""
    broker_side = spec.startswith("bsend")
    if broker_side:  # the broker's sends: its replies and its commands to engines
        spec = spec[1:]
        env0 = c.env
        c.env = dict(env0, BATON_FAULT=spec)
        c.broker("http = 127.0.0.1:0\nheartbeat_timeout_ms = 2000\n")
        c.env = env0
    else:
        c.broker("http = 127.0.0.1:0\nheartbeat_timeout_ms = 2000\n")
    a = c.engine("a", "--vram-elastic", wait=False, env={} if broker_side else {"BATON_FAULT": spec})
    try:
        c.wait_ready(a, timeout=15)
    except AssertionError:
        rc = a.wait(10)
        text = open(c.log("a")).read()
        assert rc == 1 and "baton-fault:" in text, ("a did not start, exit %s" % rc, text[-2000:])
        return c.log("a"), "start-refused"
    send = "send" in spec
    b = c.engine("b", "--vram-elastic", wait=False)
    c.wait_ready(b, timeout=15)  # a lost acquire reply costs ACQUIRE_RESEND_MS, not 30 s
    steps = [
        ("gen a", lambda: h.call_retry(a.url, "gen", timeout_ms=timeout_ms, steps=2, batch=1, seed=3)),
        ("release a", lambda: h.call_retry(c.control, "release", timeout_ms=timeout_ms, name="a")),
        ("refill a", lambda: h.call_retry(c.control, "refill", timeout_ms=timeout_ms, name="a")),
        ("vram a 10", lambda: h.call_retry(a.url, "vram", timeout_ms=timeout_ms, reserve_mib=10)),
        ("vram a full", lambda: h.call_retry(a.url, "vram", timeout_ms=timeout_ms, reserve_mib=0)),
        ("handoff a b", lambda: h.call_retry(c.control, "handoff", timeout_ms=timeout_ms, **{"from": "a", "to": "b"})),
        ("handoff b a", lambda: h.call_retry(c.control, "handoff", timeout_ms=timeout_ms, **{"from": "b", "to": "a"})),
        ("gen a 2", lambda: h.call_retry(a.url, "gen", timeout_ms=timeout_ms, steps=2, batch=1, seed=4)),
    ]
    outcome = []
    for what, fn in steps:
        outcome.append(reply_or_clean_error(fn(), what, allow_timeout=send))
        for p in (a, b, c.bp):
            assert p.poll() is None, "%s died (exit %s) after %s" % (getattr(p, "name", "broker"), p.returncode, what)
    # a serves, right: the fault was one call; a second try must work
    # (the checks wait longer than a send run's steps: a loaded machine).
    want = h.reference(c, 5)
    for attempt in range(3):
        r = h.call_retry(a.url, "gen", timeout_ms=20000, steps=2, batch=1, seed=5)
        if r.get("ok"):
            break
    assert r.get("ok") and (r["checksum"], r["output"]) == want, ("gen after the fault", r)
    r = h.ok(h.call_retry(b.url, "gen", timeout_ms=20000, steps=2, batch=1, seed=5))
    assert (r["checksum"], r["output"]) == want
    st, over = c.accounting([a, b])
    assert over["a"] == over["b"], ("device charge beyond mapped differs (leak?)", over, st)
    a.send_signal(signal.SIGTERM)
    assert a.wait(15) == 0, "a exit %s" % a.returncode
    return c.log("broker" if broker_side else "a"), outcome


def plan():
    """(op, N) pairs: a fault-free counting run gives each op's calls."""
    c = h.BrokerCase(call=h.call_retry)
    try:
        log, _ = scenario(c, "map:0,alloc:0,copy:0,d2h:0")
        n = counts(log)
    finally:
        c.close()
    # send: replies and requests of a (heartbeats included): about one per step
    n["send"] = 16
    n["bsend"] = 24
    runs = []
    for op in OPS:
        total = n[op]
        if FULL:
            ns = range(1, total + 1)
        else:
            k = 2 if "send" not in op else 1
            ns = sorted({max(1, round(total * (i + 1) / (k + 1))) for i in range(k)})
            # and the lost replies the broker must recover from: send:4 is
            # a's reply to the broker's shrink at b's start (a STATUS probe
            # finds it lost), bsend:10 the broker's reply to b's acquire
            # (b sends it again after 1 s)
            ns = sorted(set(ns) | {{"send": 4, "bsend": 10}.get(op, ns[0])})
        runs += [(op, x) for x in ns]
    only = [o for o in os.environ.get("BATON_FAULT_OPS", "").split(",") if o]
    if only:
        assert set(only) <= set(OPS), "BATON_FAULT_OPS: ops are %s" % ",".join(OPS)
        runs = [r for r in runs if r[0] in only]
    pick = [r for r in os.environ.get("BATON_FAULT_RUNS", "").split(",") if r]
    if pick:
        runs = [(r.split(":")[0], int(r.split(":")[1])) for r in pick]
    return n, runs


def main():
    t0 = time.time()
    passed = failed = 0
    try:
        n, runs = plan()
        print("calls in a fault-free run: %s" % n)
        passed += 1
    except Exception:
        traceback.print_exc(file=sys.stdout)
        print("0 passed, 1 failed")
        return 1
    outcomes = {}
    for op, x in runs:
        c = h.BrokerCase(call=h.call_retry)
        name = "%s:%d" % (op, x)
        t1 = time.time()
        try:
            log, outcome = scenario(c, name, timeout_ms=3000 if "send" in op else 8000)
            k = faults_in(log)
            if "send" not in op:  # 0: this run made fewer calls than the counting run
                assert k <= 1, "%s: %d faults injected" % (name, k)
            injected_total[0] += k
            outcomes[name] = outcome
            c.logs_clean()
            print("ok   %-10s %6.2fs injected %d: %s" % (name, time.time() - t1, k,
                  outcome if isinstance(outcome, str) else " ".join(outcome)))
            passed += 1
        except Exception:
            print("FAIL %s" % name)
            traceback.print_exc(file=sys.stdout)
            c.tails(("broker", "a", "b"), 12)
            failed += 1
        finally:
            c.close()
        sys.stdout.flush()
    print("faults injected: %d in %d runs, %.1f s (connections refused and retried: %d, connects timed out and retried: %d)" %
          (injected_total[0], len(runs), time.time() - t0, h.retried["refused"], h.retried["connect_timeouts"]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
