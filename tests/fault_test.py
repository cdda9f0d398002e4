#!/usr/bin/python3
"""fault_test.py: injected device and transport faults (BATON_FAULT, see
engine/fault.h) on every path of release, refill, resize (vram), GEN and
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

op: map, alloc, copy, d2h (engine/fault.c) and send (proto/transport.c) in
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "broker"))
import broker_test as bt  # noqa: E402  (Case, call, reference: the same harness)

FULL = os.environ.get("BATON_RELIABILITY") == "1"
refused = [0]
connect_timeouts = [0]
dead_urls = set()  # killed on purpose (kill_test.py): a refused connect there is final


def _call(url, op, timeout_ms=20000, **fields):
    """bt.call, again when the connection was refused (the request never
    arrived): proto/transport.c replaces a stalled listener, and that
    refuses connections in progress once (and drops its pipes)."""
    for attempt in range(20):
        rep = _call_once(url, op, timeout_ms=timeout_ms, **fields)
        if url in dead_urls:
            return rep
        if rep.get("error") == "connect":
            refused[0] += 1
        elif rep.get("error") == "timeout" and "cannot connect" in rep.get("text", ""):
            connect_timeouts[0] += 1  # the listener did not accept within the timeout
        else:
            return rep
        time.sleep(0.1)
    return rep


_call_once = bt.call
bt.call = _call
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


def accounting(c, procs):
    """Broker == engines == host device, within the heartbeat timeout."""
    last = []

    def agree():
        st = {p.name: bt.ok(bt.call(p.url, "status")) for p in procs}
        held = {e["name"]: e["resident"] for e in c.status()["engines"]}
        cap, used = c.hostdev_used()
        charged = per_pid(c)
        over = {p.name: charged.get(p.pid, 0) - st[p.name]["mapped"] for p in procs}
        s0 = next(iter(st.values()))
        last[:] = [st, held, used, over]
        if any(held.get(n) != s["mapped"] for n, s in st.items()):
            return None
        if used != s0["total"] - s0["free"] or len(set(over.values())) != 1:
            return None
        return st, over
    try:
        return bt.wait_for("broker, engines and device agree", agree, timeout=6, every=0.2)
    except AssertionError:
        raise AssertionError("no agreement: engines %s, broker %s, device used %s, charge beyond mapped %s" %
                             tuple(last))


def per_pid(c):
    import struct
    data = open(os.path.join(c.dir, "hostdev-0"), "rb").read()
    magic, version, n_owners, capacity = struct.unpack_from("<8sIIQ", data, 0)
    out = {}
    for i in range(n_owners):
        pid, opens, start, nbytes, pad = struct.unpack_from("<iIQQQ", data, 64 + 32 * i)
        if pid > 0 and os.path.exists("/proc/%d" % pid):
            out[pid] = out.get(pid, 0) + nbytes
    return out


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
        ("gen a", lambda: bt.call(a.url, "gen", timeout_ms=timeout_ms, steps=2, batch=1, seed=3)),
        ("release a", lambda: bt.call(c.control, "release", timeout_ms=timeout_ms, name="a")),
        ("refill a", lambda: bt.call(c.control, "refill", timeout_ms=timeout_ms, name="a")),
        ("vram a 10", lambda: bt.call(a.url, "vram", timeout_ms=timeout_ms, reserve_mib=10)),
        ("vram a full", lambda: bt.call(a.url, "vram", timeout_ms=timeout_ms, reserve_mib=0)),
        ("handoff a b", lambda: bt.call(c.control, "handoff", timeout_ms=timeout_ms, **{"from": "a", "to": "b"})),
        ("handoff b a", lambda: bt.call(c.control, "handoff", timeout_ms=timeout_ms, **{"from": "b", "to": "a"})),
        ("gen a 2", lambda: bt.call(a.url, "gen", timeout_ms=timeout_ms, steps=2, batch=1, seed=4)),
    ]
    outcome = []
    for what, fn in steps:
        outcome.append(reply_or_clean_error(fn(), what, allow_timeout=send))
        for p in (a, b, c.bp):
            assert p.poll() is None, "%s died (exit %s) after %s" % (getattr(p, "name", "broker"), p.returncode, what)
    # a serves, right: the fault was one call; a second try must work
    # (the checks wait longer than a send run's steps: a loaded machine).
    want = bt.reference(c, 5)
    for attempt in range(3):
        r = bt.call(a.url, "gen", timeout_ms=20000, steps=2, batch=1, seed=5)
        if r.get("ok"):
            break
    assert r.get("ok") and (r["checksum"], r["output"]) == want, ("gen after the fault", r)
    r = bt.ok(bt.call(b.url, "gen", timeout_ms=20000, steps=2, batch=1, seed=5))
    assert (r["checksum"], r["output"]) == want
    st, over = accounting(c, [a, b])
    assert over["a"] == over["b"], ("device charge beyond mapped differs (leak?)", over, st)
    a.send_signal(signal.SIGTERM)
    assert a.wait(15) == 0, "a exit %s" % a.returncode
    return c.log("broker" if broker_side else "a"), outcome


def plan():
    """(op, N) pairs: a fault-free counting run gives each op's calls."""
    c = bt.Case()
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
        c = bt.Case()
        name = "%s:%d" % (op, x)
        t1 = time.time()
        try:
            log, outcome = scenario(c, name, timeout_ms=3000 if "send" in op else 8000)
            k = faults_in(log)
            if "send" not in op:  # 0: this run made fewer calls than the counting run
                assert k <= 1, "%s: %d faults injected" % (name, k)
            injected_total[0] += k
            outcomes[name] = outcome
            bt_logs_clean(c)
            print("ok   %-10s %6.2fs injected %d: %s" % (name, time.time() - t1, k,
                  outcome if isinstance(outcome, str) else " ".join(outcome)))
            passed += 1
        except Exception:
            print("FAIL %s" % name)
            traceback.print_exc(file=sys.stdout)
            for who in ("broker", "a", "b"):
                path = c.log(who)
                if os.path.exists(path):
                    print("  --- %s.log" % who)
                    for line in open(path, errors="replace").read().splitlines()[-12:]:
                        print("  " + line)
            failed += 1
        finally:
            c.close()
        sys.stdout.flush()
    print("faults injected: %d in %d runs, %.1f s (connections refused and retried: %d, connects timed out and retried: %d)" %
          (injected_total[0], len(runs), time.time() - t0, refused[0], connect_timeouts[0]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def bt_logs_clean(c):
    for name in os.listdir(c.dir):
        if name.endswith(".log"):
            text = open(os.path.join(c.dir, name), errors="replace").read()
            assert "runtime error:" not in text and "Sanitizer" not in text, (name, text[-3000:])


if __name__ == "__main__":
    sys.exit(main())
