#!/usr/bin/python3
"""broker_test.py: baton-broker and baton-engine --broker as real processes
on the host backend.

Each case gets a fresh directory: its own host device (BATON_HOSTDEV_DIR),
sockets, config and logs; every process it starts is killed at the end.
Requests are msgpack maps sent with `baton-proto-tool call` (reply as JSON);
events come from `baton-proto-tool sub`. Every wait has a deadline.

The model: 4 layers x 8 experts, d_model 256, d_ff 512, f16: 32 experts of
0.75 MiB; with 4 MiB segments the whole cache is 7 segments = 28 MiB, plus
about 0.6 MiB of dense tensors per engine on the device. So a 40 MiB device
holds one engine, a 64 MiB device two.

The last line is "N passed, N failed". BROKER_STRESS_S sets the length of
the stress case (default 30 s).
"""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import msgpack

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import (BROKER, CEIL, CLI, ENGINE, ERR, MIB, SLOW, TOOL, BrokerCase, call,  # noqa: E402
                     check_gen, err, gen, long_steps, next_id, ok, reference, run_cases, wait_for)


# ---- cases -----------------------------------------------------------------------

def t_config_and_flags(c):
    bad = os.path.join(c.dir, "bad.ini")
    with open(bad, "w") as f:
        f.write("[broker]\nheartbeat_timeout_ms = 2000\n\n[engine \"a\"]\npriority = high\n")
    r = subprocess.run([BROKER, "--config", bad], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "%s:5: priority = 'high'" % bad in r.stderr, (r.returncode, r.stderr)
    with open(bad, "w") as f:
        f.write("[broker]\nwhatever = 1\n")
    r = subprocess.run([BROKER, "--config", bad], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "%s:2: unknown key 'whatever'" % bad in r.stderr, r.stderr
    r = subprocess.run([BROKER, "--config", "/nonexistent.ini"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "/nonexistent.ini: cannot open" in r.stderr, r.stderr
    for args in (["--bogus"], ["--control"], ["--control", "/x.sock"], ["extra"]):
        r = subprocess.run([BROKER] + args, capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "baton-broker:" in r.stderr, (args, r.stderr)
    good = os.path.join(c.dir, "good.ini")
    with open(good, "w") as f:
        f.write("[gpu \"host-0\"]\nreserve_mib = 8\n[engine \"a\"]\npinned = true\n")
    r = subprocess.run([BROKER, "--config", good, "--control", "ipc:///tmp/x.sock", "--check"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0 and "control = ipc:///tmp/x.sock" in r.stdout and "reserve_mib = 8" in r.stdout
    r = subprocess.run([ENGINE, "--name", "x", "--shared-expert-arena", c.arena(), "--broker", "nope"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "--broker" in r.stderr
    # An unknown op and a missing engine name are clear errors.
    c.broker()
    err(call(c.control, "release", name="ghost"), "not_found")
    r = call(c.control, "gen", steps=1, batch=1, seed=1)
    assert r["ok"] is False and "does not serve" in r["msg"], r


def t_two_engines_alternate(c):
    """A device that holds one engine: requests alternate, the device is
    handed over each time, every answer is right."""
    c.broker()
    a = c.engine("a")
    b = c.engine("b")  # its start took the device from a (idle)
    c.want_holds({"a": 0, "b": CEIL})
    order = [a, b, a, b, a, b, b, a]
    for i, p in enumerate(order):
        other = b if p is a else a
        check_gen(c, p, seed=i % 8)
        # the refill's report reaches the broker after the engine's reply
        # to the GEN (want_holds; failed once with both at 0 in make test)
        c.want_holds({p.name: CEIL, other.name: 0})
        st = ok(call(p.url, "status"))
        assert st["state"] == "ready" and st["mapped"] == CEIL
        cap, used = c.hostdev_used()
        assert used <= cap
    # each change of hands: a grant to the one that asked after a release of the other
    rel = c.events.all("release")
    assert len(rel) >= 6, [e["reason"] for e in rel]
    assert all(e["reason"].startswith("for ") for e in rel), rel
    grants = [e for e in c.events.all("grant") if "after a reclaim" in e["reason"]]
    assert len(grants) >= 6, grants
    # and one handoff event each, in parts, once the refill is reported
    ho = c.events.all("handoff")
    assert len(ho) >= 6 and all(": decide " in e["reason"] and ", refill " in e["reason"] for e in ho), ho


def t_priority_and_idle_order(c):
    c.broker('[engine "a"]\npriority = 1\n[engine "b"]\npriority = 5\n')
    a = c.engine("a", host_mib=64)
    b = c.engine("b", host_mib=64)
    c.want_holds({"a": CEIL, "b": CEIL})
    cc = c.engine("c", "--priority", "0", host_mib=64)  # lowest priority: a goes, b stays
    c.want_holds({"a": 0, "b": CEIL, "c": CEIL})
    assert c.eng("c")["priority"] == 0 and c.eng("b")["priority"] == 5
    # c's heartbeat after its refill says it is idle (until then the broker
    # takes an idle engine before a busy one, whatever their priorities)
    wait_for("c seen idle", lambda: c.eng("c")["idle_ms"] > 0, timeout=5)
    check_gen(c, a, 3)  # c has the lowest priority now
    c.want_holds({"a": CEIL, "b": CEIL, "c": 0})
    # Same priority: the longest idle goes. a and c at priority 1 ...
    ok(call(c.control, "pin", name="b", pinned=True))
    check_gen(c, cc, 4)          # takes a (the only one that may go)
    assert c.holds()["a"] == 0
    time.sleep(0.3)
    check_gen(c, a, 5)           # a takes c
    c.want_holds({"a": CEIL, "b": CEIL, "c": 0})
    ok(call(c.control, "pin", name="b", pinned=False))
    ok(call(b.url, "gen", steps=1, batch=1, seed=1))  # b busy last: a is idle longer
    time.sleep(0.3)
    # a: priority 1, idle ~0.6 s; b: priority 5. c (0) takes a: lowest priority first.
    check_gen(c, cc, 6)
    c.want_holds({"a": 0, "b": CEIL, "c": CEIL})


def t_longest_idle(c):
    c.broker()
    a = c.engine("a", host_mib=64)
    b = c.engine("b", host_mib=64)
    time.sleep(0.2)
    check_gen(c, a, 1)     # a used last: b has been idle longer
    time.sleep(0.3)
    cc = c.engine("c", host_mib=64)
    c.want_holds({"a": CEIL, "b": 0, "c": CEIL})
    time.sleep(0.3)
    check_gen(c, b, 2)     # a idle since its request, c since its start: a goes
    c.want_holds({"a": 0, "b": CEIL, "c": CEIL})
    del cc


def t_pinned_and_bounded_wait(c):
    # 32 MiB: a (pinned) leaves 2.8 MiB, less than a segment: nothing for b.
    c.broker('acquire_wait_ms = 800\n[engine "a"]\npinned = true\n')
    a = c.engine("a", host_mib=32)
    t0 = time.time()
    b = c.engine("b", host_mib=32)  # cannot take a: waits 0.8 s at start, then stays cold
    assert time.time() - t0 >= 0.7
    c.want_holds({"a": CEIL, "b": 0})
    assert c.eng("a")["pinned"] is True
    t0 = time.time()
    r = err(gen(b, seed=1), "device_oom")
    dt = time.time() - t0
    assert 0.7 <= dt < 5 * SLOW, dt
    assert "no memory for b" in r["msg"] and "pinned" in r["msg"], r["msg"]
    c.want_holds({"a": CEIL, "b": 0})
    err(call(c.control, "release", name="a"), "permission")
    err(call(c.control, "handoff", **{"from": "a", "to": "b"}), "permission")
    deny = c.events.all("deny", "b")
    assert deny, c.events.all()
    # Unpinned, a can go.
    ok(call(c.control, "pin", name="a", pinned=False))
    check_gen(c, b, 2)
    c.want_holds({"a": 0, "b": CEIL})
    assert c.eng("a")["pinned"] is False


def t_pinned_leaves_part(c):
    # 40 MiB: a (pinned) leaves 10.8 MiB: b gets two segments at once (a
    # partial grant, no waiting) and serves from them, right.
    c.broker('acquire_wait_ms = 3000\n[engine "a"]\npinned = true\n')
    a = c.engine("a")
    t0 = time.time()
    b = c.engine("b")
    assert time.time() - t0 < 2 * SLOW
    c.want_holds({"a": CEIL, "b": 8 * MIB})
    reference(c, 0)  # every seed's checksum first: the bound is b's serving
    t0 = time.time()
    for s in range(4):
        check_gen(c, b, s)
    assert time.time() - t0 < 2.5 * SLOW
    c.want_holds({"a": CEIL, "b": 8 * MIB})
    assert ok(call(b.url, "status"))["state"] in ("ready", "partial")  # at a smaller target
    check_gen(c, a, 5)


def t_headroom(c):
    # 64 MiB hold two engines, unless 20 MiB stay free for something else.
    c.broker('[gpu "host-0"]\nreserve_mib = 20\n')
    a = c.engine("a", host_mib=64)
    b = c.engine("b", host_mib=64)
    c.want_holds({"a": 0, "b": CEIL})
    g = c.status()["gpus"][0]
    assert g["uuid"] == "host-0" and g["reserve"] == 20 * MIB and g["total"] == 64 * MIB, g
    assert g["free"] >= 20 * MIB, g
    check_gen(c, a, 1)
    c.want_holds({"a": CEIL, "b": 0})
    cap, used = c.hostdev_used()
    assert cap - used >= 20 * MIB, (cap, used)


def t_total_mib(c):
    # A big device of which the broker hands out 40 MiB: room for one.
    c.broker('[gpu "*"]\ntotal_mib = 40\n')
    a = c.engine("a", host_mib=256)
    b = c.engine("b", host_mib=256)
    c.want_holds({"a": 0, "b": CEIL})
    g = c.status()["gpus"][0]
    assert g["total"] == 40 * MIB and g["held"] == CEIL and g["free"] == 40 * MIB - CEIL, g
    check_gen(c, a, 1)
    c.want_holds({"a": CEIL, "b": 0})


def t_shrink_rather_than_release(c):
    # 56 MiB: a whole engine, the other's dense tensors, and 26.8 MiB: one
    # segment short of a second engine. An elastic victim shrinks by it.
    c.broker()
    a = c.engine("a", "--vram-elastic", host_mib=56)
    b = c.engine("b", "--vram-elastic", host_mib=56)
    h = c.holds()
    assert h["b"] == CEIL and h["a"] == CEIL - 4 * MIB, h
    sh = c.events.all("shrink", "a")
    assert sh and sh[0]["reason"] == "for b", c.events.all()
    assert not c.events.all("release", "a")
    assert ok(call(a.url, "status"))["state"] == "ready"
    check_gen(c, a, 3)  # a wants its segment back: b shrinks
    h = c.holds()
    assert h["a"] == CEIL and h["b"] == CEIL - 4 * MIB, h
    check_gen(c, b, 4)
    # A non-elastic victim is released instead.
    cc = c.engine("c", host_mib=56)   # not elastic
    check_gen(c, cc, 5)
    check_gen(c, b, 6)  # takes from a or c; c must be released, not shrunk
    assert not c.events.all("shrink", "c")


def t_sighup_reload(c):
    """SIGHUP reads the configuration again: pins, priorities and timers
    change, engines stay registered; a bad file is refused and the running
    configuration stays."""
    c.broker('[engine "a"]\npriority = 3\n')
    path = os.path.join(c.dir, "broker.ini")
    a = c.engine("a", host_mib=128)
    b = c.engine("b", host_mib=128)
    eng = lambda n: c.eng(n)  # noqa: E731
    assert (eng("a")["priority"], eng("a")["pinned"], eng("b")["pinned"]) == (3, False, False)

    def hup(text, log_line):
        with open(path, "w") as f:
            f.write("[broker]\ncontrol = %s\nevents = %s\n" % (c.control, c.events_url) + text)
        n = open(c.log("broker")).read().count(log_line)
        c.bp.send_signal(signal.SIGHUP)
        wait_for(log_line, lambda: open(c.log("broker")).read().count(log_line) > n, timeout=5)

    assert c.status()["gpus"][0]["reserve"] == 0
    hup('idle_release_s = %g\n[gpu "host-0"]\nreserve_mib = 4\n[engine "b"]\npinned = true\npriority = 7\n'
        % (0.5 * SLOW), "configuration reloaded")
    assert (eng("a")["priority"], eng("b")["priority"], eng("b")["pinned"]) == (0, 7, True), c.status()
    assert c.status()["gpus"][0]["reserve"] == 4 * MIB, c.status()["gpus"]
    assert c.events.all("reload"), c.events.all()
    # the new idle timer releases a; pinned b keeps its cache
    wait_for("a idle-released", lambda: c.holds()["a"] == 0, timeout=5 * SLOW)
    assert c.holds()["b"] == CEIL
    err(call(c.control, "release", name="b"), "permission")
    # a bad file: refused with its line named; pins and timers stay
    hup('[engine "b"]\npinned = maybe\n', "reload refused")
    log = open(c.log("broker")).read()
    assert "reload refused, the running configuration stays: %s:5:" % path in log, log[-600:]
    assert eng("b")["pinned"] and eng("b")["priority"] == 7, c.status()
    assert c.status()["gpus"][0]["reserve"] == 4 * MIB
    # nobody was dropped or registered again
    assert {e["name"]: e["pid"] for e in c.status()["engines"]} == {"a": a.pid, "b": b.pid}
    assert c.bp.poll() is None
    assert not c.events.all("register")[2:] and not c.events.all("reconnect") and not c.events.all("dead")
    check_gen(c, a, 2)


def t_event_bytes_are_device_memory(c):
    """An event's bytes are device memory, the same unit for every kind:
    what was granted, freed or mapped, never the bytes a refill copied
    (the experts are 24 MiB, the cache they fill 28 MiB)."""
    c.broker()
    a = c.engine("a")
    b = c.engine("b")
    ok(call(c.control, "release", name="b"))
    ok(call(c.control, "handoff", **{"from": "a", "to": "b"}))
    ok(call(a.url, "status"))
    check_gen(c, a, 1)  # a refills itself (after a grant and a reclaim of b)
    wait_for("the handoff events", lambda: len(c.events.all("handoff")) >= 2)
    evs = c.events.all()
    seen = set()
    for ev in evs:
        k = ev["kind"]
        if k in ("grant", "release", "refill", "handoff") or (k == "state" and ev["reason"].startswith("refill")):
            assert ev["bytes"] == CEIL, ev
            seen.add(k)
        elif k in ("register",):
            assert ev["bytes"] == 0, ev   # what it held then
    assert {"grant", "release", "refill", "handoff", "state"} <= seen, [e["kind"] for e in evs]


def t_handoff_takes_only_what_b_lacks(c):
    # 128 MiB holds both engines: a handoff with room to spare leaves a its
    # cache (the docs' promise; a was released whole before).
    c.broker()
    a = c.engine("a", host_mib=128)
    b = c.engine("b", host_mib=128)
    ok(call(c.control, "release", name="b"))
    c.want_holds({"a": CEIL, "b": 0})
    rep = ok(call(c.control, "handoff", **{"from": "a", "to": "b"}))
    c.want_holds({"a": CEIL, "b": CEIL})
    assert rep["release_ms"] == 0, rep
    assert not c.events.all("release", "a") and not c.events.all("shrink", "a"), c.events.all()
    ho = c.events.all("handoff", "b")
    assert ho and "nothing taken" in ho[-1]["reason"], ho
    assert ok(call(a.url, "status"))["mapped"] == CEIL
    check_gen(c, a, 1)   # a serves at once from what it kept
    a.kill()
    b.kill()


def t_handoff_partial(c):
    # 56 MiB has room for part of b: an elastic a gives the shortfall (one
    # segment) and keeps the rest resident.
    c.broker()
    a = c.engine("a", "--vram-elastic", host_mib=56)
    b = c.engine("b", "--vram-elastic", host_mib=56)
    ok(call(c.control, "release", name="b"))
    ok(call(c.control, "refill", name="a"))
    c.want_holds({"a": CEIL, "b": 0})
    ok(call(c.control, "handoff", **{"from": "a", "to": "b"}))
    c.want_holds({"a": CEIL - 4 * MIB, "b": CEIL})
    ho = c.events.all("handoff", "b")
    assert ho and "(shrink)" in ho[-1]["reason"], ho
    assert ok(call(a.url, "status"))["state"] in ("ready", "partial")


def t_idle_release(c):
    # the timers stretch with SLOW too: under TSan a's release alone took
    # 0.26 s and r's 1.5 s had passed before r was checked
    c.broker('idle_release_s = %g\n[engine "p"]\npinned = true\n[engine "q"]\nidle_release_s = 0\n'
             '[engine "r"]\nidle_release_s = %g\n' % (0.6 * SLOW, 1.5 * SLOW))
    for n in ("a", "p", "r"):
        c.engine(n, host_mib=128)
    # q also asks for the engine's own timer: under a broker it is off (one
    # rule: the broker's idle_release_s = 0 keeps q), and q says so
    c.engine("q", "--cache-release-idle", "0.2", host_mib=128)
    t0 = time.time()
    wait_for("a idle-released", lambda: c.holds()["a"] == 0, timeout=5 * SLOW)
    dt = time.time() - t0
    assert dt < 2 * SLOW, dt
    assert c.holds()["r"] == CEIL
    wait_for("r idle-released", lambda: c.holds()["r"] == 0, timeout=5 * SLOW)
    time.sleep(0.5)
    h = c.holds()
    assert h["p"] == CEIL and h["q"] == CEIL, h
    assert "--cache-release-idle is ignored under a broker" in open(c.log("q")).read()
    rel = [e for e in c.events.all("release") if e["reason"].startswith("idle")]
    assert sorted(e["engine"] for e in rel) == ["a", "r"], rel


def t_cli_and_handoff(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b")
    env = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url)
    r = subprocess.run([CLI, "handoff", "b", "a"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("handoff b -> a: decide "), (r.stdout, r.stderr)
    c.want_holds({"a": CEIL, "b": 0})
    rep = ok(call(c.control, "handoff", **{"from": "a", "to": "b"}))
    for k in ("decide_ms", "release_ms", "refill_ms", "total_ms"):
        assert rep[k] >= 0, rep
    assert rep["release_ms"] > 0 and rep["refill_ms"] > 0 and rep["total_ms"] >= rep["refill_ms"]
    c.want_holds({"a": 0, "b": CEIL})
    assert c.events.all("handoff", "b")
    r = subprocess.run([CLI, "status"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "host-0" in r.stdout and "released" in r.stdout, r.stdout
    r = subprocess.run([CLI, "status", "--json"], capture_output=True, text=True, env=env, timeout=30)
    st = json.loads(r.stdout)
    assert {e["name"] for e in st["engines"]} == {"a", "b"}
    r = subprocess.run([CLI, "release", "b"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "release b: released" in r.stdout, r.stdout
    r = subprocess.run([CLI, "refill", "a"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "refill a: ready" in r.stdout, r.stdout
    r = subprocess.run([CLI, "release", "nobody"], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 4 and "no engine named 'nobody'" in r.stderr, r.stderr  # 4: not found
    r = subprocess.run([CLI, "gen", a.url, "--seed", "3", "--steps", "2"], capture_output=True, text=True,
                       env=env, timeout=30)
    assert r.returncode == 0 and ("checksum %016x" % reference(c, 3)[0]) in r.stdout, r.stdout
    r = subprocess.run([CLI, "--broker", "ipc://%s/none.sock" % c.dir, "status"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "nothing listens" in r.stderr, r  # 1: failed, with the reason
    # A refill through the broker of an engine whose memory a holds: a goes.
    rep = ok(call(c.control, "refill", name="b"))
    assert rep["state"] == "ready" and c.holds() == {"a": 0, "b": CEIL}
    # Clean stops: an engine says goodbye and leaves the table; the broker
    # exits 0 (under the sanitizers: nothing leaked).
    b.send_signal(signal.SIGTERM)
    assert b.wait(10) == 0
    wait_for("b gone", lambda: c.eng("b") is None, timeout=3)
    assert c.events.all("stopped", "b")
    c.bp.send_signal(signal.SIGTERM)
    assert c.bp.wait(10) == 0
    a.send_signal(signal.SIGTERM)
    assert a.wait(10) == 0


def t_stress(c):
    """8 clients, 3 engines, a device for two, BROKER_STRESS_S seconds:
    every request answered right, and the grants always fit the device."""
    secs = float(os.environ.get("BROKER_STRESS_S", "30"))
    c.broker()
    engines = [c.engine(n, host_mib=64) for n in ("a", "b", "c")]
    for s in range(8):
        reference(c, s)
    stop = time.time() + secs
    done = []
    failures = []
    lock = threading.Lock()

    def client(k):
        rnd = random.Random(k)
        while time.time() < stop:
            p = rnd.choice(engines)
            seed = rnd.randrange(8)
            try:
                r = gen(p, seed=seed, timeout_ms=60000)
                good = r.get("ok") and (r["checksum"], r["output"]) == reference(c, seed)
            except Exception as e:  # noqa: BLE001 - reported below
                r, good = {"exception": str(e)}, False
            with lock:
                done.append(p.name)
                if not good:
                    failures.append((p.name, seed, {k2: v for k2, v in r.items() if k2 != "output"}))

    over = []

    def monitor():
        while time.time() < stop + 1:
            st = c.status()
            for g in st["gpus"]:
                held = sum(e["resident"] for e in st["engines"] if e["gpu"] == g["uuid"])
                if held > g["total"] or g["held"] > g["total"]:
                    over.append(("broker", g, held))
            cap, used = c.hostdev_used()
            if used > cap:
                over.append(("device", cap, used))
            time.sleep(0.1)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    mon = threading.Thread(target=monitor)
    for t in threads + [mon]:
        t.start()
    for t in threads + [mon]:
        t.join(secs + 120)
        assert not t.is_alive(), "a client hangs (deadlock?)"
    assert not failures, "%d of %d failed, first: %s" % (len(failures), len(done), failures[:3])
    assert not over, over[:3]
    # at least 5 requests and one reclaim every 2 s, whatever the length
    # (the sanitizer build answers about half as many)
    assert len(done) > 5 * secs, (len(done), secs)
    n_rel = len(c.events.all("release")) + len(c.events.all("shrink"))
    print("  %d requests in %.0f s, %d reclaims, per engine %s" % (
        len(done), secs, n_rel, {n: done.count(n) for n in "abc"}))
    assert n_rel > secs / 2, (n_rel, secs)
    for p in engines:
        assert p.poll() is None, "%s died" % p.name


def t_engine_kill_during_refill(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b", wait=False, env={"BATON_TEST_REFILL_DELAY_MS": "3000"})
    wait_for("b refilling", lambda: (c.eng("b") or {}).get("state") == "refilling", timeout=10)
    assert c.holds()["a"] == 0  # taken for b
    t0 = time.time()
    b.send_signal(signal.SIGKILL)
    b.wait()
    wait_for("b dead", lambda: c.eng("b")["state"] == "dead", timeout=2.5 * SLOW)
    assert time.time() - t0 < 2.0 * SLOW
    # The event reaches the subscriber after the broker's status says dead.
    ev = wait_for("b's dead event", lambda: c.events.all("dead", "b"), timeout=5 * SLOW)
    # Seen through its pidfd or its pipe closing, whichever comes first.
    assert ev and ev[0]["reason"] in ("its process exited",
                                      "its connection closed and its process is gone"), ev
    g = c.status()["gpus"][0]
    assert g["held"] == 0, g  # the grant to b is gone
    check_gen(c, a, 1)        # a gets the device back without waiting
    c.want_holds({"a": CEIL, "b": 0})


def t_engine_silent(c):
    # Stopped, not dead: after the heartbeat timeout it is "lost", its memory
    # still counted (it still holds it) and not taken; back when it answers.
    c.broker("heartbeat_timeout_ms = 500\nacquire_wait_ms = 600\n")
    a = c.engine("a")
    b = c.engine("b")
    c.want_holds({"a": 0, "b": CEIL})
    b.send_signal(signal.SIGSTOP)
    try:
        t0 = time.time()
        wait_for("b lost", lambda: c.eng("b")["state"] == "lost", timeout=3 * SLOW)
        assert time.time() - t0 < 1.5 * SLOW
        assert c.events.all("lost", "b")
        assert c.status()["gpus"][0]["held"] == CEIL
        r = err(gen(a, seed=1), "device_oom")
        assert "no memory for a" in r["msg"], r
    finally:
        b.send_signal(signal.SIGCONT)
    wait_for("b back", lambda: c.eng("b")["state"] == "ready", timeout=3)
    check_gen(c, a, 2)
    c.want_holds({"a": CEIL, "b": 0})


def t_engine_kill_during_gen(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b")
    check_gen(c, a, 1)
    steps = long_steps(a, 10)  # killed after about 0.5 s: it only has to outlast the checks before
    res = {}

    def long_request():
        # its client waits out its timeout (no answer comes from the killed
        # engine): 3 s, not the 10 s that kept the case 11 s long
        try:
            res["a"] = gen(a, seed=1, steps=steps, batch=16, timeout_ms=int(3000 * SLOW))
        except Exception as e:  # noqa: BLE001 - no answer at all is what we expect
            res["a"] = {"exception": str(e)}
    long_gen = threading.Thread(target=long_request)
    long_gen.start()
    wait_for("a busy", lambda: ok(call(a.url, "status"))["requests"] >= 1 and
             c.status() and c.eng("a")["idle_ms"] == 0, timeout=5)
    time.sleep(0.2)
    res_b = {}
    tb = threading.Thread(target=lambda: res_b.update(b=gen(b, seed=2)))
    tb.start()
    time.sleep(0.3)       # b waits: a is in the middle of a request
    assert tb.is_alive()
    a.send_signal(signal.SIGKILL)
    a.wait()
    tb.join(10)
    assert not tb.is_alive()
    r = ok(res_b["b"])
    assert (r["checksum"], r["output"]) == reference(c, 2)
    long_gen.join(30)
    assert not long_gen.is_alive() and res["a"].get("ok") is not True  # its client got no answer
    assert c.eng("a")["state"] == "dead"
    assert c.holds()["b"] == CEIL


def t_engine_kill_during_handoff(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b", env={"BATON_TEST_REFILL_DELAY_MS": str(int(1500 * SLOW))})
    ok(call(c.control, "handoff", **{"from": "b", "to": "a"}))
    res = {}
    t = threading.Thread(target=lambda: res.update(r=call(c.control, "handoff", **{"from": "a", "to": "b"})))
    t.start()
    wait_for("b refilling", lambda: c.eng("b")["state"] == "refilling", timeout=5)
    b.send_signal(signal.SIGKILL)
    b.wait()
    t.join(10)
    assert not t.is_alive()
    r = res["r"]
    # The broker's command to b either loses its connection (closed: "went
    # away") or, when b died first, cannot connect at all (connect).
    assert r["ok"] is False and (
        (r["err"] == ERR["closed"] and "went away" in r["msg"]) or r["err"] == ERR["connect"]), r
    assert c.eng("b")["state"] == "dead"
    assert c.status()["gpus"][0]["held"] == 0
    check_gen(c, a, 3)


def t_broker_restart_under_load(c):
    c.broker()
    a = c.engine("a", host_mib=64)
    b = c.engine("b", host_mib=64)
    cc = c.engine("c", host_mib=64)   # took a's memory
    before = {p.name: ok(call(p.url, "status")) for p in (a, b, cc)}
    epoch0 = c.status()["epoch"]
    stop = threading.Event()
    results = []

    def load():
        k = 0
        while not stop.is_set():
            for p in (b, cc):
                r = gen(p, seed=k % 8, timeout_ms=10000)
                results.append(r.get("ok") is True and r["checksum"] == reference(c, k % 8)[0])
                k += 1

    t = threading.Thread(target=load)
    t.start()
    try:
        wait_for("the load running", lambda: len(results) >= 2, timeout=10 * SLOW)
        c.bp.send_signal(signal.SIGKILL)
        c.bp.wait()
        # engines serve on alone: once each has seen the broker go, answers
        # go on coming
        wait_for("b and c lost the broker", lambda: all(
            "lost the broker; serving on alone" in open(c.log(n)).read() for n in ("b", "c")), timeout=10 * SLOW)
        n_alone = len(results)
        wait_for("requests served while the broker is away", lambda: len(results) >= n_alone + 2,
                 timeout=5 * SLOW, every=0.02)
        t0 = time.time()
        c.broker()
        wait_for("all registered again", lambda: {e["name"] for e in c.status()["engines"]} == {"a", "b", "c"},
                 timeout=2.5 * SLOW)
        dt = time.time() - t0
        assert dt < 2.0 * SLOW, dt
        st = c.status()
        assert st["epoch"] > epoch0, (st["epoch"], epoch0)
        h = c.holds()
        assert h == {"a": 0, "b": CEIL, "c": CEIL}, h
    finally:
        stop.set()
        t.join(30)
    assert results and all(results), results.count(False)
    for p in (a, b, cc):
        now = ok(call(p.url, "status"))
        assert now["mapped"] == before[p.name]["mapped"], (p.name, now, before[p.name])
        assert now["last_refill_bytes"] == before[p.name]["last_refill_bytes"], p.name  # nothing refilled
    # The new broker's commands carry newer epochs: they are obeyed.
    ok(call(c.control, "handoff", **{"from": "c", "to": "a"}))
    c.want_holds({"a": CEIL, "b": CEIL, "c": 0})
    rec = c.events.all("reconnect") + c.events.all("register")
    assert len(rec) >= 3


def t_stale_epoch(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b")
    ok(call(c.control, "handoff", **{"from": "b", "to": "a"}))
    ea = ok(call(a.url, "status"))["epoch"]
    assert ea > 0
    # A command from the past (a broker that was replaced, a resent request).
    before = ok(call(a.url, "status"))
    err(call(a.url, "release", name="a", epoch=ea - 1), "stale_epoch")
    err(call(b.url, "refill", name="b", epoch=1), "stale_epoch")
    after = ok(call(a.url, "status"))
    assert (before["state"], before["mapped"]) == (after["state"], after["mapped"]) == ("ready", CEIL)
    c.want_holds({"a": CEIL, "b": 0})
    # The broker's own go through.
    ok(call(c.control, "handoff", **{"from": "a", "to": "b"}))
    assert ok(call(b.url, "status"))["epoch"] > ea


def t_acquire_resent(c):
    """An engine resends an acquire whose reply was lost (same id): the
    broker answers it with the grant it made, never a second one."""
    c.broker()
    a = c.engine("a")
    ok(call(c.control, "release", name="a"))
    wait_for("a released", lambda: c.holds() == {"a": 0})

    def acquire(rid):
        m = {"v": 1, "op": "acquire", "id": rid, "name": "a", "bytes": CEIL}
        r = subprocess.run([TOOL, "call", c.control, "--timeout", "5000"], input=msgpack.packb(m),
                           capture_output=True, timeout=15)
        rep = json.loads(r.stdout.decode().strip().splitlines()[-1])
        assert rep.get("id") == rid, rep
        return ok(rep)
    rid = next_id()
    first = acquire(rid)
    assert first["granted"] == CEIL, first
    held = c.status()["gpus"][0]["held"]
    assert held == CEIL, held
    again = acquire(rid)
    assert (again["granted"], again["epoch"]) == (first["granted"], first["epoch"]), (first, again)
    assert c.status()["gpus"][0]["held"] == held, c.status()["gpus"]
    wait_for("the grant event", lambda: len(c.events.all("grant", engine="a")) >= 2)
    time.sleep(0.2)
    grants = c.events.all("grant", engine="a")
    assert len(grants) == 2, grants  # its start's and this one, once
    a.kill()


def t_engine_without_broker(c):
    # No broker yet: asked to (--broker-optional), the engine starts
    # (warms alone) and serves.
    a = c.engine("a", "--broker-optional")
    assert ok(call(a.url, "status"))["mapped"] == CEIL
    check_gen(c, a, 1)
    ok(call(a.url, "release"))
    check_gen(c, a, 2)   # refills by itself: the broker is away
    assert ok(call(a.url, "status"))["state"] == "ready"
    # The broker comes: the engine registers with what it holds.
    c.broker()
    wait_for("a registered", lambda: c.eng("a") is not None, timeout=2.5)
    c.want_holds({"a": CEIL})


# ---- grants under a cap that holds less than one cache (9be903d, 19d3f02) ---------------
#
# total_mib 24 is under one whole cache (CEIL, 28 MiB): every grant is
# partial. Each engine's device (256 MiB) has room to spare, so only the
# broker's books can hold an engine to its grant.

CAP_MIB = 24


def t_partial_grant_grows_by_it(c):
    """An elastic engine that holds part of its cache, granted less than
    it lacks, grows by the grant at most (a VRAM reserve), so the caches
    stay under total_mib (9be903d; before it, a plain refill made the
    engine whole, 4 MiB past the cap)."""
    c.broker('[gpu "*"]\ntotal_mib = %d\n' % CAP_MIB)
    a = c.engine("a", "--vram-elastic", host_mib=256)
    c.want_holds({"a": CAP_MIB * MIB})
    # shrink it by 3 segments: keep what the device has free now and 12 MiB more
    free = ok(call(a.url, "status"))["free"]
    ok(call(c.control, "vram", name="a", reserve_mib=free // MIB + 12))
    c.want_holds({"a": (CAP_MIB - 12) * MIB})
    # it lacks 16 MiB; 12 are under the cap: it grows, never past them
    # (the reserve is rounded up to a MiB: a segment of the grant may stay
    # unused where the device's free bytes are not whole MiB)
    ok(call(c.control, "refill", name="a"))
    assert [e["bytes"] for e in c.events.all("grant", "a")][-1] == 12 * MIB, c.events.all("grant", "a")
    held = wait_for("a grows", lambda: c.holds()["a"] > (CAP_MIB - 12) * MIB and c.holds()["a"])
    assert held <= CAP_MIB * MIB and c.status()["gpus"][0]["held"] <= CAP_MIB * MIB, (held, c.status()["gpus"])
    check_gen(c, a, 1)  # serves right from part of its cache
    assert c.status()["gpus"][0]["held"] <= CAP_MIB * MIB, c.status()["gpus"]


def t_partial_handoff_to_rigid_engine(c):
    """The same handoff to an engine started without --vram-elastic: it
    refuses the VRAM reserve, and the handoff falls back to a plain refill
    (19d3f02; before it, the handoff failed with 'start the engine with
    --vram-elastic'). The refill makes it whole, past the cap by what it
    lacked beyond its grant (docs/reference/configuration.md)."""
    c.broker('[gpu "*"]\ntotal_mib = %d\n' % CAP_MIB)
    a = c.engine("a", host_mib=256)
    b = c.engine("b", host_mib=256)
    c.want_holds({"a": 0, "b": CAP_MIB * MIB})  # b, started last, holds the cap
    # a few of a's heartbeats (every 250 ms): a's own last word of the
    # device's free memory then counts b's 24 MiB, which the handoff frees
    # (a grow reserve measured against that word let a map all 28 MiB:
    # make test-tsan's run, where the heartbeats came in time by chance)
    time.sleep(0.6)
    ok(call(c.control, "handoff", **{"from": "b", "to": "a"}))
    c.want_holds({"a": CEIL, "b": 0})
    assert [e["bytes"] for e in c.events.all("grant", "a")][-1] == CAP_MIB * MIB, c.events.all("grant", "a")
    wait_for("the handoff event", lambda: c.events.all("handoff", "a"))
    ho = c.events.all("handoff", "a")[-1]
    assert ho["bytes"] == CEIL, ho  # what it mapped, as every event says
    check_gen(c, a, 2)


def t_partial_grant_to_released_engine(c):
    """A handoff, then a refill, to an elastic engine that holds nothing
    (released), granted less than it lacks: it maps the grant and serves
    from it. Before the fix the engine only remembered the VRAM reserve
    (a released cache has nothing to measure against): the handoff and the
    refill said OK, the target stayed at 0 MiB, and b was released for
    nothing."""
    c.broker('[gpu "*"]\ntotal_mib = %d\n' % CAP_MIB)
    a = c.engine("a", "--vram-elastic", host_mib=256)
    b = c.engine("b", "--vram-elastic", host_mib=256)
    c.want_holds({"a": 0, "b": CAP_MIB * MIB})  # b, started last, holds the cap
    # a few of a's heartbeats (every 250 ms): a's own last word of the
    # device's free memory then counts b's 24 MiB, which the handoff frees
    # (a grow reserve measured against that word let a map all 28 MiB:
    # make test-tsan's run, where the heartbeats came in time by chance)
    time.sleep(0.6)
    ok(call(c.control, "handoff", **{"from": "b", "to": "a"}))
    assert [e["bytes"] for e in c.events.all("grant", "a")][-1] == CAP_MIB * MIB, c.events.all("grant", "a")
    held = wait_for("a maps its grant", lambda: c.holds()["a"] > 0 and c.holds()["a"], timeout=5 * SLOW)
    # all of the grant but a segment at most (the reserve is rounded up to a MiB)
    assert (CAP_MIB - 4) * MIB <= held <= CAP_MIB * MIB and c.holds()["b"] == 0, c.holds()
    assert c.status()["gpus"][0]["held"] <= CAP_MIB * MIB, c.status()["gpus"]
    check_gen(c, a, 1)
    assert c.status()["gpus"][0]["held"] <= CAP_MIB * MIB, c.status()["gpus"]
    # the same by a refill: a released, then refilled (b holds nothing)
    ok(call(c.control, "release", name="a"))
    c.want_holds({"a": 0, "b": 0})
    err(call(c.control, "refill", name="a", reserve_mib=4), "invalid")  # the broker's word to engines only
    assert c.holds()["a"] == 0
    ok(call(c.control, "refill", name="a"))
    held = wait_for("a maps its grant again", lambda: c.holds()["a"] > 0 and c.holds()["a"], timeout=5 * SLOW)
    assert (CAP_MIB - 4) * MIB <= held <= CAP_MIB * MIB and c.status()["gpus"][0]["held"] <= CAP_MIB * MIB, \
        (held, c.status()["gpus"])
    check_gen(c, a, 2)


def t_queued_ops_ask_what_is_lacking(c):
    """A refill and the engine's own acquire queued together (the front
    door's refill beside an engine's refill before a request): the one
    served second asks for what the engine lacks then, nothing, not what it
    lacked when asked (9be903d; before it, 10.9 MiB more were granted to an
    engine already whole). Both orders: refill then acquire, acquire then
    refill. a's long request holds both in the queue."""
    ms = int(30000 * SLOW)
    c.broker("acquire_wait_ms = %d\n" % ms)
    a = c.engine("a")
    b = c.engine("b")
    for first in ("refill", "acquire"):
        check_gen(c, a, 1)
        c.want_holds({"a": CEIL, "b": 0})
        n0 = len(c.events.all("grant", "b"))
        res = {}
        ops = {"refill": lambda: res.update(refill=call(c.control, "refill", name="b", timeout_ms=ms)),
               "acquire": lambda: res.update(acquire=gen(b, seed=2, timeout_ms=ms))}  # b asks itself
        steps = long_steps(a, 2)  # a's request outlasts the two ops' 0.4 s of queueing
        ta = threading.Thread(target=lambda: res.update(a=gen(a, seed=1, steps=steps, batch=16, timeout_ms=ms)))
        ta.start()
        wait_for("a busy", lambda: ok(call(a.url, "status"))["requests"] >= 1 and c.eng("a")["idle_ms"] == 0,
                 timeout=5)
        threads = []
        for k in (first, "acquire" if first == "refill" else "refill"):
            t = threading.Thread(target=ops[k])
            t.start()
            threads.append(t)
            time.sleep(0.2)  # in this order
        assert ta.is_alive() and all(t.is_alive() for t in threads), res  # both wait behind a's request
        for t in [ta] + threads:
            t.join(ms / 1e3 + 10)
        assert ok(res["refill"]) and ok(res["acquire"]) and ok(res["a"]), res
        # both grant events, which may reach the subscriber after the replies
        grants = wait_for("b's two grants", lambda: (lambda g: g if len(g) >= 2 else None)(
            [e["bytes"] for e in c.events.all("grant", "b")[n0:]]), timeout=5 * SLOW)
        assert sorted(grants) == [0, CEIL], (first, grants)
        c.want_holds({"a": 0, "b": CEIL})
        assert c.status()["gpus"][0]["held"] == CEIL, (first, c.status()["gpus"])


CASES = [t_config_and_flags, t_two_engines_alternate, t_priority_and_idle_order, t_longest_idle,
         t_pinned_and_bounded_wait, t_pinned_leaves_part, t_headroom, t_total_mib, t_shrink_rather_than_release,
         t_event_bytes_are_device_memory, t_handoff_takes_only_what_b_lacks, t_handoff_partial, t_idle_release, t_sighup_reload,
         t_cli_and_handoff, t_engine_silent, t_engine_kill_during_refill, t_engine_kill_during_gen,
         t_engine_kill_during_handoff, t_broker_restart_under_load, t_stale_epoch,
         t_engine_without_broker, t_acquire_resent, t_partial_grant_grows_by_it,
         t_partial_handoff_to_rigid_engine, t_partial_grant_to_released_engine, t_queued_ops_ask_what_is_lacking, t_stress]


def main():
    return run_cases(CASES, sys.argv[1:], make=BrokerCase)


if __name__ == "__main__":
    sys.exit(main())
