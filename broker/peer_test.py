#!/usr/bin/python3
"""peer_test.py: the broker lends a device's free memory to an engine of
another device as its peer tier, and takes it back when the device's own
engines need it; real processes on two host devices (the host backend).

Engine a lives on host-0 with --peer-device 1 and a cache ceiling of 12 MiB,
less than the model's 24 MiB of experts, so a peer tier on host-1 is worth
something to it. Engine b lives on host-1 and holds 28 MiB there when
refilled. Both devices have 40 MiB. Checked in every case: what the broker
says a holds on host-1, what a says, and what host-1's state file charges to
a's process are the same, and a's outputs equal a lone engine's.

The last line is "N passed, N failed".
"""
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MIB = h.MIB
OWN = 12  # a's cache ceiling, MiB: 3 segments of 4 MiB


def charged(c, index, pid):
    """Bytes host device `index` charges to process `pid`."""
    return h.hostdev_charged(c.dir, index, pid)


def start(c, config=""):
    c.broker("http = 127.0.0.1:0\n" + config)
    b = c.engine("b", "--device", "1")
    h.wait_for("b holds its cache", lambda: (c.eng("b") or {}).get("resident") == h.CEIL)
    a = c.engine("a", "--device", "0", "--peer-device", "1", "--cache-mib", str(OWN))
    h.wait_for("a registered with its peer device",
                lambda: (c.eng("a") or {}).get("peer_gpu") == "host-1")
    return a, b


def loan(c):
    e = c.eng("a")
    return e["peer"] if e else None


def agree(c, a):
    """The broker's figure for a's peer tier, a's own and host-1's charge
    agree (within the wait: a heartbeat may be on its way)."""
    last = []

    def check():
        broker = loan(c)
        own = h.ok(h.call(a.url, "status")).get("peer_mapped", 0)
        dev = charged(c, 1, a.pid)
        last[:] = [broker, own, dev]
        return broker == own == dev
    try:
        h.wait_for("broker, engine and device agree on a's peer tier", check, timeout=5)
    except AssertionError:
        raise AssertionError("peer tier of a: broker %s, engine %s, host-1 charges %s" % tuple(last))
    return last[0]


def same_output(c, a, seed):
    r = h.ok(h.gen(a, seed=seed))
    assert (r["checksum"], r["output"]) == h.reference(c, seed), ("a's output differs", seed)


def gpu(c, uuid):
    for g in c.status()["gpus"]:
        if g["uuid"] == uuid:
            return g
    raise AssertionError("no gpu " + uuid)


def t_lend_use_revoke_relend(c):
    a, b = start(c)
    # host-1: 40 MiB less b's 28 MiB cache and its dense tensors: about 11
    # MiB lent, of which a maps whole 4 MiB segments.
    h.wait_for("a lent memory on host-1", lambda: (loan(c) or 0) >= 4 * MIB)
    first = agree(c, a)
    assert first <= 12 * MIB, first
    h.wait_for("host-1 shows the loan", lambda: gpu(c, "host-1")["lent"] >= first)
    for s in range(3):
        same_output(c, a, s)
    st = h.ok(h.call(a.url, "status"))
    assert st["peer_gpu"] == "host-1", st
    # b released: host-1 is free, a may have all it wants (24 - 12 MiB)
    h.ok(h.call(c.control, "release", name="b"))
    h.wait_for("more lent once b released", lambda: (loan(c) or 0) >= 12 * MIB)
    more = agree(c, a)
    assert more > first
    same_output(c, a, 3)
    # b wants its memory back: a's loan is taken back first, then b refills
    n_revoke = len(c.events.all("revoke", "a"))
    r = h.ok(h.call(c.control, "refill", name="b"))
    assert c.eng("b")["resident"] == h.CEIL, c.eng("b")
    assert len(c.events.all("revoke", "a")) > n_revoke, "no revoke event"
    revoke = c.events.all("revoke", "a")[-1]
    refill = [e for e in c.events.all(engine="b") if e["kind"] in ("refill", "grant")][-1]
    assert revoke["seq"] < refill["seq"], (revoke, refill)
    after = agree(c, a)
    assert after < more, (after, more)
    cap, used = c.hostdev_used(1)
    assert used <= cap, (used, cap)
    same_output(c, a, 4)
    r = h.ok(h.gen(b, seed=4))
    assert (r["checksum"], r["output"]) == h.reference(c, 4)
    # and lent again when b lets go once more
    h.ok(h.call(c.control, "release", name="b"))
    h.wait_for("lent again", lambda: (loan(c) or 0) >= more)
    agree(c, a)
    same_output(c, a, 5)
    events = [e["kind"] for e in c.events.all(engine="a")]
    assert "lend" in events and "revoke" in events, events


def t_handoff_from_the_borrower(c):
    a, b = start(c)
    h.ok(h.call(c.control, "release", name="b"))
    h.wait_for("a borrows host-1", lambda: (loan(c) or 0) >= 12 * MIB)
    agree(c, a)
    # b lacks only what a borrowed on host-1: the loan comes back, a keeps
    # its own cache on host-0 (a handoff takes only what b lacks)
    own = c.eng("a")["resident"]
    lent = agree(c, a)
    assert own > 0
    r = h.ok(h.call(c.control, "handoff", **{"from": "a", "to": "b"}))
    assert r["total_ms"] >= 0
    assert c.eng("b")["resident"] == h.CEIL and c.eng("a")["resident"] == own
    left = agree(c, a)  # what host-1 still has room for beside b, no more
    assert left < lent and left + h.CEIL <= gpu(c, "host-1")["total"], (left, lent)
    assert gpu(c, "host-1")["lent"] == left
    r = h.ok(h.gen(b, seed=2))
    assert (r["checksum"], r["output"]) == h.reference(c, 2)
    same_output(c, a, 2)  # a serves from its own device


def t_borrower_killed(c):
    a, b = start(c)
    h.ok(h.call(c.control, "release", name="b"))
    h.wait_for("a borrows host-1", lambda: (loan(c) or 0) >= 12 * MIB)
    lent = agree(c, a)
    pid = a.pid
    a.send_signal(signal.SIGKILL)
    a.wait()
    h.wait_for("the loan returned", lambda: gpu(c, "host-1")["lent"] == 0)
    ev = c.events.all("loan-returned", "a")
    assert ev and ev[-1]["bytes"] >= lent, ev  # (plus a lend in flight, if one was)
    h.wait_for("host-1 charges nothing to the dead borrower", lambda: charged(c, 1, pid) == 0 or
                not os.path.exists("/proc/%d" % pid))
    # b gets all of host-1 again, at once
    h.ok(h.call(c.control, "refill", name="b"))
    assert c.eng("b")["resident"] == h.CEIL
    cap, used = c.hostdev_used(1)
    assert used < 30 * MIB, used  # b's cache and dense tensors, nothing of a


def t_owner_killed(c):
    a, b = start(c)
    h.wait_for("a borrows host-1", lambda: (loan(c) or 0) >= 4 * MIB)
    first = agree(c, a)
    b.send_signal(signal.SIGKILL)
    b.wait()
    # b's memory is free: a may borrow what it wants, and still serves right
    h.wait_for("a borrows more once b is gone", lambda: (loan(c) or 0) > first)
    agree(c, a)
    same_output(c, a, 6)
    assert c.eng("b")["state"] == "dead"


def t_no_lending_where_forbidden(c):
    a, b = start(c, '[gpu "host-1"]\nlend = false\n')
    h.ok(h.call(c.control, "release", name="b"))
    h.wait_for("b released", lambda: c.eng("b")["resident"] == 0)
    h.ok(h.gen(a, seed=1))
    import time
    time.sleep(1.5)  # several decision rounds: nothing may be lent
    assert loan(c) == 0 and gpu(c, "host-1")["lent"] == 0
    assert charged(c, 1, a.pid) == 0
    same_output(c, a, 1)


def t_metrics_show_loans(c):
    import urllib.request
    a, b = start(c)
    h.wait_for("a borrows host-1", lambda: (loan(c) or 0) >= 4 * MIB)
    lent = agree(c, a)
    url = None
    for line in open(c.log("broker")):
        if "http http://" in line:
            url = line.split("http http://")[1].split(",")[0].strip()
    assert url, "no HTTP address in the broker's log"
    text = urllib.request.urlopen("http://%s/metrics" % url, timeout=5).read().decode()
    want = 'baton_engine_peer_bytes{engine="a",gpu="host-1"} %d' % lent
    assert want in text, [ln for ln in text.splitlines() if "peer" in ln or "lent" in ln]
    assert 'baton_gpu_memory_lent_bytes{gpu="host-1"} %d' % lent in text
    r = subprocess.run([h.CLI, "--broker", c.control, "status"], capture_output=True, text=True,
                          timeout=10)
    row = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("a ")]
    assert row and row[0][7] != "-", r.stdout


CASES = [t_lend_use_revoke_relend, t_handoff_from_the_borrower, t_borrower_killed, t_owner_killed,
         t_no_lending_where_forbidden, t_metrics_show_loans]

if __name__ == "__main__":
    sys.exit(h.run_cases(CASES, sys.argv[1:]))
