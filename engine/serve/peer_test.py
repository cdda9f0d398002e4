#!/usr/bin/python3
"""peer_test.py: the peer tier of baton-engine (--peer-device) as real
processes on the host backend, with two host devices (hostdev-0, hostdev-1).

The model (4 layers x 16 experts of 768 KiB, 48 MiB) does not fit the own
cache (--cache-mib 12: two 6 MiB segments, 16 experts), so what the peer
tier holds decides what a GEN copies; its answer must not change. Requests
go through tests/harness.py. The last line is "N passed, N failed".
"""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
from harness import ENGINE, ERR, EngineCase, call, err, hostdev_charged, ok, run_cases  # noqa: E402

MIB = 1 << 20
SEG = 6  # MiB: 8 slots of 768 KiB
OWN = ["--cache-mib", "12", "--vram-segment-mib", str(SEG)]
WANT = 36 * MIB  # the 48 experts outside the own tier: 6 segments


def model(c):
    return c.arena(layers=4, experts=16, d_model=256, d_ff=512, dtype="f16")


def charged(c, dev, pid):
    """Bytes hostdev-<dev> charges to pid."""
    return hostdev_charged(c.dir, dev, pid)


def gen(e, seed=5):
    return ok(call(e.url, "gen", steps=3, batch=4, seed=seed))


def wait_free(e, want, key="free", s=5):
    t0 = time.time()
    while True:
        v = ok(call(e.url, "status"))[key]
        if v == want or time.time() - t0 > s:
            return v
        time.sleep(0.02)


def t_lend_use_revoke_relend(c):
    a = model(c)
    ref = c.engine("ref", a)  # the whole model on its own device
    e = c.engine("b", a, "--peer-device", "1", "--expert-cache-release", *OWN)
    st = ok(call(e.url, "status"))
    assert st["peer_gpu"] == "host-1" and st["peer_mapped"] == 0, st
    assert st["peer_free"] == 256 * MIB, st
    want = ref_sum = gen(ref)["checksum"]
    g0 = gen(e)
    assert g0["checksum"] == want

    # Lend all it can use: every expert is resident in one tier or the other.
    r = ok(call(e.url, "peer", peer_mib=1000, epoch=1))
    assert r["peer_mapped"] == WANT and r["peer_free"] == 256 * MIB - WANT, r
    assert r["bytes"] == 48 * 768 * 1024, r  # the 48 experts, copied in
    assert charged(c, 1, e.pid) == WANT
    st = ok(call(e.url, "status"))
    assert st["peer_mapped"] == WANT and st["mapped"] == 12 * MIB, st
    g1 = gen(e)
    st2 = ok(call(e.url, "status"))
    assert g1["checksum"] == want and g1["output"] == gen(ref)["output"]
    assert st2["misses"] == st["misses"], (st, st2)  # nothing copied from host
    assert st2["hits"] > st["hits"]

    # Revoke: dropped, confirmed, the device's memory back; same answers.
    r = ok(call(e.url, "peer", peer_mib=0, epoch=2))
    assert r["peer_mapped"] == 0 and r["peer_free"] == 256 * MIB and r["bytes"] == WANT, r
    assert charged(c, 1, e.pid) == 0
    m0 = ok(call(e.url, "status"))["misses"]
    assert gen(e)["checksum"] == want
    assert ok(call(e.url, "status"))["misses"] > m0
    ok(call(e.url, "peer", peer_mib=0, epoch=2))  # again: nothing to do

    # A stale epoch changes nothing.
    err(call(e.url, "peer", peer_mib=12, epoch=1), "stale_epoch")
    assert ok(call(e.url, "status"))["peer_mapped"] == 0

    # Re-lend less than it wants; then release drops it, refill does not
    # bring it back, and a released engine may not borrow.
    r = ok(call(e.url, "peer", peer_mib=13, epoch=3))
    assert r["peer_mapped"] == 12 * MIB, r
    assert charged(c, 1, e.pid) == 12 * MIB
    assert gen(e)["checksum"] == want
    # A longer GEN: 160 lookups, so rebalances move experts between the
    # tiers meanwhile; the answer is still the one-device one.
    long_ref = ok(call(ref.url, "gen", steps=40, batch=4, seed=8))
    assert ok(call(e.url, "gen", steps=40, batch=4, seed=8))["checksum"] == long_ref["checksum"]
    r = ok(call(e.url, "release", epoch=4))
    assert r["state"] == "released" and r["peer_mapped"] == 0 and r["peer_free"] == 256 * MIB, r
    assert charged(c, 1, e.pid) == 0
    err(call(e.url, "peer", peer_mib=12, epoch=4), "bad_state")
    assert charged(c, 1, e.pid) == 0
    r = ok(call(e.url, "refill", epoch=5))
    assert r["state"] == "ready" and r["peer_mapped"] == 0, r
    r = ok(call(e.url, "peer", peer_mib=36, epoch=6))
    assert r["peer_mapped"] == WANT
    assert gen(e)["checksum"] == ref_sum


def t_bad_peer_requests(c):
    a = model(c)
    plain = c.engine("p", a, "--expert-cache-release", *OWN)
    err(call(plain.url, "peer", peer_mib=12), "unsupported")
    st = ok(call(plain.url, "status"))
    assert "peer_gpu" not in st and "peer_mapped" not in st, st

    e = c.engine("b", a, "--peer-device", "1", *OWN)
    ok(call(e.url, "peer", peer_mib=12))
    before = ok(call(e.url, "status"))
    err(call(e.url, "peer", peer_mib=1 << 40), "out_of_range")
    err(call(e.url, "peer", peer_mib=36, peer_gpu="host-7"), "invalid")
    r = call(e.url, "peer")  # answered by the transport
    assert r.get("code") == ERR["missing_field"] and "peer_mib" in r.get("text", ""), r
    err(call(e.url, "peer", peer_mib=36, name="other"), "not_found")
    after = ok(call(e.url, "status"))
    for k in ("state", "mapped", "resident", "peer_mapped", "peer_free", "epoch"):
        assert before[k] == after[k], (k, before, after)
    assert charged(c, 1, e.pid) == 12 * MIB
    # The right uuid is fine.
    r = ok(call(e.url, "peer", peer_mib=24, peer_gpu="host-1"))
    assert r["peer_mapped"] == 24 * MIB

    # Flags: the peer device must differ from the device.
    r = subprocess.run([ENGINE, "--name", "x", "--shared-expert-arena", a, "--backend", "host",
                        "--device", "1", "--peer-device", "1"], capture_output=True, text=True,
                       env=c.env, timeout=10)
    assert r.returncode == 2 and "--peer-device" in r.stderr, r.stderr
    r = subprocess.run([ENGINE, "--name", "x", "--shared-expert-arena", a, "--backend", "host",
                        "--peer-device", "x"], capture_output=True, text=True, env=c.env, timeout=10)
    assert r.returncode == 2, r.stderr
    r = subprocess.run([ENGINE, "--help"], capture_output=True, text=True)
    assert "--peer-device" in r.stdout


def t_partial_when_peer_full(c):
    a = model(c)
    # hostdev-1 is 64 MiB; its own engine holds the whole model there.
    owner = c.engine("o", a, "--device", "1", host_mib=64)
    held = 64 * MIB - ok(call(owner.url, "status"))["free"]
    e = c.engine("b", a, "--peer-device", "1", *OWN, host_mib=64)
    r = ok(call(e.url, "peer", peer_mib=36))
    room = (64 * MIB - held) // (SEG * MIB) * SEG * MIB
    assert 0 < room < WANT and r["peer_mapped"] == room, (r, held, room)
    assert charged(c, 1, e.pid) == room
    assert ok(call(owner.url, "status"))["free"] == 64 * MIB - held - room
    assert gen(e)["checksum"] == gen(owner)["checksum"]


def t_borrower_and_owner_kills(c):
    a = model(c)
    owner = c.engine("o", a, "--device", "1")
    e = c.engine("b", a, "--peer-device", "1", *OWN)
    owner_free = ok(call(owner.url, "status"))["free"]
    ok(call(e.url, "peer", peer_mib=36))
    assert ok(call(owner.url, "status"))["free"] == owner_free - WANT
    want = gen(owner)["checksum"]
    assert gen(e)["checksum"] == want
    # The borrower dies: the owner's device gets the loan back.
    e.kill()
    e.wait()
    assert wait_free(owner, owner_free) == owner_free
    # A new borrower; then the owner dies: the borrower's loan is its own
    # charge, its answers do not change, and it can give the loan back.
    e2 = c.engine("b2", a, "--peer-device", "1", *OWN)
    ok(call(e2.url, "peer", peer_mib=36))
    owner.kill()
    owner.wait()
    assert gen(e2)["checksum"] == want
    st = ok(call(e2.url, "status"))
    assert st["peer_mapped"] == WANT and charged(c, 1, e2.pid) == WANT, st
    r = ok(call(e2.url, "peer", peer_mib=0))
    assert r["peer_free"] == 256 * MIB, r  # the dead owner's memory was reaped too


CASES = [t_lend_use_revoke_relend, t_bad_peer_requests, t_partial_when_peer_full,
         t_borrower_and_owner_kills]


def main():
    return run_cases(CASES, sys.argv[1:], make=EngineCase, logs=("a", "b"))

if __name__ == "__main__":
    sys.exit(main())
