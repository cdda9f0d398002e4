#!/usr/bin/python3
"""serve_test.py: baton-engine as a real process on the host backend.

Requests are msgpack maps made here with python3-msgpack and sent with
`baton-proto-tool call`, which prints the reply as JSON. Each case starts
its own engines in a fresh directory (its own host device and sockets) and
kills them at the end. The last line is "N passed, N failed".
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
from harness import ENGINE, ERR, EngineCase, call, calls, err, ok, run_cases  # noqa: E402


# ---- cases -------------------------------------------------------------------

def t_bad_flags(c):
    a = c.arena()
    bad = [
        [],
        ["--name", "x"],
        ["--name", "bad name!", "--shared-expert-arena", a],
        ["--name", "x", "--shared-expert-arena", a, "--backend", "tpu"],
        ["--name", "x", "--shared-expert-arena", a, "--cache-mib", "-5"],
        ["--name", "x", "--shared-expert-arena", a, "--cache-mib", "12abc"],
        ["--name", "x", "--shared-expert-arena", a, "--cache-release-idle", "0"],
        ["--name", "x", "--shared-expert-arena", a, "--vram-segment-mib", "0"],
        ["--name", "x", "--shared-expert-arena", a, "--bogus"],
        ["--name", "x", "--shared-expert-arena", a, "extra"],
        ["--name", "x", "--shared-expert-arena", a, "--device"],
    ]
    for args in bad:
        r = subprocess.run([ENGINE] + args, capture_output=True, text=True, env=c.env, timeout=10)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert "baton-engine:" in r.stderr, (args, r.stderr)
    # A missing or corrupt arena is a clear error, not a crash.
    junk = os.path.join(c.dir, "junk.arena")
    open(junk, "wb").write(b"not an arena" * 100)
    for path in ["/nonexistent.arena", junk]:
        r = subprocess.run([ENGINE, "--name", "x", "--shared-expert-arena", path, "--backend", "host",
                            "--listen", "ipc://%s/x.sock" % c.dir], capture_output=True, text=True,
                           env=c.env, timeout=10)
        assert r.returncode == 1 and path in r.stderr, (r.returncode, r.stderr)
    r = subprocess.run([ENGINE, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--shared-expert-arena" in r.stdout


def t_host_fallback_warns(c):
    """--backend auto on the host backend beside a GPU says so loudly: a
    WARNING on stderr, a warning line after ready, "warning" in /health
    (here without --http: the first two). The GPU is faked: the probed
    path is BATON_TEST_GPU_NODE, a file that exists."""
    a = c.arena()
    c.env["BATON_TEST_GPU_NODE"] = a
    try:
        e = c.engine("w", a, "--backend", "auto")
    finally:
        del c.env["BATON_TEST_GPU_NODE"]
    line = e.stdout.readline()
    log = open(c.log("w")).read()
    if " on cuda " in log:
        return "a GPU here: cuda, no fallback"
    assert line.startswith("warning: a GPU is present (%s)" % a) and "HOST backend" in line, line
    assert "WARNING: a GPU is present" in log, log
    ok(call(e.url, "gen", steps=1, batch=1, seed=1))
    return line.split(": ", 2)[-1].strip()[:60]


def t_gen_same_after_release_refill(c):
    e = c.engine("a", c.arena(), "--expert-cache-release", "--verify-refill")
    g1 = ok(call(e.url, "gen", steps=3, batch=2, seed=11))
    assert len(bytes.fromhex(g1["output"])) == 2 * 256 * 4
    st = ok(call(e.url, "status"))
    assert st["state"] == "ready" and st["mapped"] > 0
    r = ok(call(e.url, "release"))
    assert r["state"] == "released" and r["bytes"] == st["mapped"], (r, st)
    st2 = ok(call(e.url, "status"))
    assert st2["free"] - st["free"] == st["mapped"], (st, st2)
    ok(call(e.url, "refill"))
    g2 = ok(call(e.url, "gen", steps=3, batch=2, seed=11))
    assert g1["checksum"] == g2["checksum"] and g1["output"] == g2["output"]
    # GEN while released loads what it needs first, same answer.
    ok(call(e.url, "release"))
    g3 = ok(call(e.url, "gen", steps=3, batch=2, seed=11))
    assert g3["checksum"] == g1["checksum"]
    # Explicit input vectors.
    vec = bytes(2 * 256 * 4)
    g4 = ok(call(e.url, "gen", steps=1, batch=2, seed=0, input=vec))
    assert g4["checksum"] != g1["checksum"]


def t_back_to_back_never_busy(c):
    """A reply means the engine is ready for the next operation: release,
    then refill, each sent after the previous reply, 40 times: none is
    refused as busy (5 in 40 were, issue 28)."""
    e = c.engine("a", c.arena(), "--expert-cache-release")
    gen = ("gen", dict(steps=1, batch=1, seed=3))
    reqs = [gen, ("release", {}), gen, ("refill", {})] * 40
    reps = calls(e.url, reqs)
    busy = [(i, reqs[i][0]) for i, r in enumerate(reps) if r.get("ok") is False and r.get("err") == ERR["busy"]]
    assert not busy, "%d of %d refused as busy: %s" % (len(busy), len(reqs), busy[:5])
    for r in reps:
        ok(r)
    # the same after a COMPLETE (its answer comes from the scheduler's thread)
    e.kill()
    e.wait()
    t = c.engine("b", h.model_arena("kjv-qwen3-moe"), "--expert-cache-release", "--ctx", "256", host_mib=512)
    done = ("complete", dict(body=json.dumps({"prompt": "In the beginning", "max_tokens": 2, "temperature": 0})))
    reqs = [done, ("release", {}), done, ("refill", {})] * 100
    reps = calls(t.url, reqs)
    busy = [(i, reqs[i][0]) for i, r in enumerate(reps) if r.get("ok") is False and r.get("err") == ERR["busy"]]
    assert not busy, "%d of %d refused as busy after COMPLETE: %s" % (len(busy), len(reqs), busy[:5])
    for r in reps:
        ok(r)


def t_bad_requests_change_nothing(c):
    e = c.engine("a", c.arena(), "--expert-cache-release")
    before = ok(call(e.url, "status"))
    err(call(e.url, "gen", steps=0, batch=1, seed=1), "out_of_range")
    err(call(e.url, "gen", steps=1, batch=100000, seed=1), "out_of_range")
    err(call(e.url, "gen", steps=1, batch=1, seed=1, input=b"\0" * 12), "out_of_range")
    nan = b"\x00\x00\xc0\x7f" * 256
    err(call(e.url, "gen", steps=1, batch=1, seed=1, input=nan), "out_of_range")
    err(call(e.url, "register", name="x", pid=1, gpu="g", device=0, model="m", ctl="c", floor=0,
             ceiling=0, priority=0, state="ready", resident=0, capacity=0, epoch=0), "unknown_op")
    err(call(e.url, "release", name="other"), "not_found")
    err(call(e.url, "vram", reserve_mib=10), "unsupported")
    after = ok(call(e.url, "status"))
    for k in ("state", "mapped", "resident", "requests"):
        assert before[k] == after[k], (k, before, after)


def t_release_needs_flag(c):
    e = c.engine("a", c.arena())
    err(call(e.url, "release"), "unsupported")
    err(call(e.url, "refill"), "unsupported")
    assert ok(call(e.url, "status"))["state"] == "ready"


def t_stale_epoch(c):
    e = c.engine("a", c.arena(), "--expert-cache-release")
    ok(call(e.url, "release", epoch=5))
    err(call(e.url, "refill", epoch=3), "stale_epoch")
    assert ok(call(e.url, "status"))["state"] == "released"
    r = ok(call(e.url, "refill", epoch=5))
    assert r["state"] == "ready" and r["epoch"] == 5


def t_refill_to_reserve(c):
    """A refill with reserve_mib (the broker's partial grant to a released
    engine) fills until the device has that much free; one out of range is
    refused and changes nothing; without --vram-elastic the reserve is
    ignored and the refill makes the engine whole."""
    seg = 4 * h.MIB
    e = c.engine("a", c.arena(), "--expert-cache-release", "--vram-elastic", "--vram-segment-mib", "4")
    whole = ok(call(e.url, "status"))["mapped"]
    assert whole > seg, whole
    ok(call(e.url, "release"))
    err(call(e.url, "refill", reserve_mib=(1 << 24) + 1), "out_of_range")
    st = ok(call(e.url, "status"))
    assert st["state"] == "released" and st["mapped"] == 0, st
    # room for one segment: the device keeps all of its free memory but 4 MiB and a fraction
    r = ok(call(e.url, "refill", reserve_mib=st["free"] // h.MIB - 4))
    assert r["mapped"] == seg and ok(call(e.url, "status"))["mapped"] == seg, r
    ok(call(e.url, "gen", steps=1, batch=1, seed=1))  # serves from part of its cache
    ok(call(e.url, "refill"))  # a plain refill: whole
    assert ok(call(e.url, "status"))["mapped"] == whole
    b = c.engine("b", c.arena(), "--expert-cache-release", "--vram-segment-mib", "4")
    ok(call(b.url, "release"))
    free = ok(call(b.url, "status"))["free"]
    ok(call(b.url, "refill", reserve_mib=free // h.MIB - 4))
    st = ok(call(b.url, "status"))
    assert st["state"] == "ready" and st["mapped"] == whole, st


def t_busy_during_gen(c):
    e = c.engine("a", c.arena(d_model=512, d_ff=1024), "--expert-cache-release")
    # A GEN of about 2 s on this host and build; releases meanwhile must
    # answer busy.
    steps = h.long_steps(e, 2, batch=8)
    n0 = ok(call(e.url, "status"))["requests"]
    res = {}
    t = threading.Thread(target=lambda: res.update(g=call(e.url, "gen", steps=steps, batch=8, seed=1,
                                                          timeout_ms=60000)))
    t.start()
    deadline = time.time() + 10
    while time.time() < deadline and ok(call(e.url, "status"))["requests"] == n0:
        r = call(e.url, "release")
        if r.get("ok") is False:
            err(r, "busy")
            break
        # The GEN had not started yet: refill and try again. A GEN that
        # lands between the release and this refill refills the engine
        # itself and runs: then the refill rightly answers busy too.
        r = call(e.url, "refill")
        if r.get("ok") is False:
            err(r, "busy")
    else:
        raise AssertionError("never saw busy while a GEN ran")
    t.join()
    ok(res["g"])
    # A GEN that started right after one of the releases above mapped only
    # what it needed (no broker to ask): the engine is not whole until a
    # refill, which must now be let in.
    if ok(call(e.url, "status"))["state"] != "ready":
        ok(call(e.url, "refill"))
    assert ok(call(e.url, "status"))["state"] == "ready"


def t_idle_release(c):
    e = c.engine("a", c.arena(), "--cache-release-idle", "0.5")
    g1 = ok(call(e.url, "gen", steps=2, batch=1, seed=3))
    deadline = time.time() + 10
    while ok(call(e.url, "status"))["state"] != "released":
        assert time.time() < deadline, "idle release never fired"
        time.sleep(0.1)
    g2 = ok(call(e.url, "gen", steps=2, batch=1, seed=3))
    assert g1["checksum"] == g2["checksum"]
    # After serving, the rest comes back (right after the reply): the idle
    # release is invisible.
    deadline = time.time() + 10
    while ok(call(e.url, "status"))["state"] != "ready":
        assert time.time() < deadline, "the rest never came back after the idle release"
        time.sleep(0.05)


def t_two_engines_compete(c):
    # 64 MiB device; each model is about 24 MiB of experts.
    a = c.arena(layers=4, experts=24, d_model=256, d_ff=512)
    ea = c.engine("a", a, "--expert-cache-release", "--vram-segment-mib", "4", host_mib=64)
    sa = ok(call(ea.url, "status"))
    eb = c.engine("b", a, "--expert-cache-release", "--vram-segment-mib", "4", host_mib=64)
    sb = ok(call(eb.url, "status"))
    assert sa["mapped"] + sb["mapped"] <= 64 << 20, (sa, sb)
    ok(call(ea.url, "release"))
    r = ok(call(eb.url, "refill"))
    assert r["state"] in ("ready", "partial")


def t_sigterm_gives_memory_back(c):
    a = c.arena()
    ea = c.engine("a", a, host_mib=256)
    eb = c.engine("b", a, host_mib=256)
    before = ok(call(eb.url, "status"))["free"]
    held = ok(call(ea.url, "status"))["mapped"]
    ea.send_signal(signal.SIGTERM)
    assert ea.wait(10) == 0
    after = ok(call(eb.url, "status"))["free"]
    assert after - before >= held, (before, after, held)
    # its log lines carry the UTC time, as the broker's do
    lines = [ln for ln in open(c.log("a")).read().splitlines() if "baton-engine[a]: " in ln]
    assert lines and all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z baton-engine\[a\]: ", ln)
                         for ln in lines), lines


def t_kill9_gives_memory_back(c):
    a = c.arena()
    ea = c.engine("a", a, host_mib=256)
    eb = c.engine("b", a, host_mib=256)
    before = ok(call(eb.url, "status"))["free"]
    held = ok(call(ea.url, "status"))["mapped"]
    ea.kill()
    ea.wait()
    after = ok(call(eb.url, "status"))["free"]
    assert after - before >= held, (before, after, held)


CASES = [t_bad_flags, t_gen_same_after_release_refill, t_back_to_back_never_busy, t_bad_requests_change_nothing,
         t_release_needs_flag, t_stale_epoch, t_refill_to_reserve, t_busy_during_gen, t_idle_release,
         t_two_engines_compete, t_sigterm_gives_memory_back, t_kill9_gives_memory_back, t_host_fallback_warns]


def main():
    return run_cases(CASES, sys.argv[1:], make=EngineCase, logs=("a", "b", "x", "w"))

if __name__ == "__main__":
    sys.exit(main())
