#!/usr/bin/python3
"""soak_test.py: a broker and three engines on a device that holds two, for
BATON_SOAK_SECONDS (default 20; make test-reliability: 300).

Four clients send random GENs (checked against the fault-free checksum) to
random engines, and handoffs, releases and refills to the broker. Checks:
every request gets a reply (none lost, none wrong; an error is allowed only
as busy or device_oom while the device changes hands), no client stuck (no
deadlock), and after a warm-up (a fifth of the time) each process's RSS (RssAnon; not in a sanitizer build) and
the device's charge beyond the mapped cache stay flat to the end (RSS within
4 MiB + 10%, the device charge exactly). At the end the broker, the engines
and the host device agree. Last line "N passed, N failed".
"""
import os
import random
import sys
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

SECONDS = float(os.environ.get("BATON_SOAK_SECONDS", "20"))
CLIENTS = 4
ALLOWED = {h.ERR["busy"], h.ERR["device_oom"]}


def rss_kib(pid):
    """Private resident memory: RssAnon. (VmRSS counts the host device's
    shared pages an engine maps, so it swings with the cache it holds.)"""
    for line in open("/proc/%d/status" % pid):
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return 0


def client(c, engines, stop, stats, lock, rng):
    names = [p.name for p in engines]
    while not stop.is_set():
        roll = rng.random()
        p = rng.choice(engines)
        if roll < 0.75:
            seed = rng.randrange(8)
            r = h.call_retry(p.url, "gen", timeout_ms=15000, steps=2, batch=1,
                        seed=seed)
            kind = "gen"
        elif roll < 0.9:
            src, dst = rng.sample(names, 2)
            r = h.call_retry(c.control, "handoff", timeout_ms=15000, **{"from": src, "to": dst})
            kind = "handoff"
        else:
            kind = rng.choice(["release", "refill"])
            r = h.call_retry(c.control, kind, timeout_ms=15000, name=p.name)
        with lock:
            if "error" in r:
                stats["lost"].append((kind, p.name, r))
            elif r.get("ok"):
                stats[kind] += 1
                if kind == "gen" and (r["checksum"], r["output"]) != h.reference(c, seed):
                    stats["wrong"].append((p.name, seed))
            elif r.get("err") in ALLOWED or kind != "gen":
                stats["err"] += 1
                stats.setdefault("codes", {}).setdefault(r.get("err"), 0)
                stats["codes"][r.get("err")] += 1
            else:
                stats["bad"].append((kind, p.name, r))


def sample(c, procs):
    return {getattr(p, "name", "broker"): rss_kib(p.pid) for p in procs}


def t_soak(c):
    h.reference(c, 0)
    c.broker("http = 127.0.0.1:0\nheartbeat_timeout_ms = 2000\n")
    engines = [c.engine(n, host_mib=64) for n in "abc"]
    procs = [c.bp] + engines
    stop = threading.Event()
    lock = threading.Lock()
    stats = {"gen": 0, "handoff": 0, "release": 0, "refill": 0, "err": 0, "lost": [], "wrong": [], "bad": []}
    ts = [threading.Thread(target=client, args=(c, engines, stop, stats, lock, random.Random(i)), daemon=True)
          for i in range(CLIENTS)]
    t0 = time.time()
    for t in ts:
        t.start()
    time.sleep(max(3.0, SECONDS / 5))
    rss0 = sample(c, procs)
    time.sleep(max(1.0, SECONDS - (time.time() - t0)))
    rss1 = sample(c, procs)
    stop.set()
    for t in ts:
        t.join(40)
        assert not t.is_alive(), "a client is stuck (deadlock?)"
    dt = time.time() - t0
    for p in procs:
        assert p.poll() is None, "%s died" % getattr(p, "name", "broker")
    assert not stats["lost"], ("requests without a reply", stats["lost"][:5])
    assert not stats["wrong"], ("wrong answers", stats["wrong"][:5])
    assert not stats["bad"], ("unexpected errors", stats["bad"][:5])
    st, over = c.accounting(engines)
    over_vals = set(over.values())
    grown = {n: rss1[n] - rss0[n] for n in rss0}
    for n in rss0:
        if "san" in os.environ.get("BUILD", ""):
            break  # a sanitizer's allocator and shadow memory grow on their own
        assert rss1[n] <= rss0[n] * 1.10 + 4096, ("RSS grew", n, rss0[n], rss1[n])
    n_req = sum(stats[k] for k in ("gen", "handoff", "release", "refill", "err"))
    print("  %.0f s, %d requests (%.0f/s): gen %d, handoff %d, release %d, refill %d, errors %s; "
          "none lost or wrong; connections refused %d, connects timed out %d (retried)" % (dt, n_req, n_req / dt, stats["gen"], stats["handoff"], stats["release"],
                                  stats["refill"], stats.get("codes", {}), h.retried["refused"], h.retried["connect_timeouts"]))
    print("  RSS KiB after warm-up %s, at the end %s (growth %s); device charge beyond the cache %s bytes" %
          (rss0, rss1, grown, sorted(over_vals)))


def main():
    return h.run_cases([t_soak], sys.argv[1:], make=lambda: h.BrokerCase(call=h.call_retry), logs=("broker", "a", "b", "c"))

if __name__ == "__main__":
    sys.exit(main())
