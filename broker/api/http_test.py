#!/usr/bin/python3
"""http_test.py: the broker's HTTP API, /metrics and the page on /, against
a real baton-broker and engines on the host backend (tests/harness.py's BrokerCase:
its own directory, device, sockets and logs per case).

Every broker here listens on 127.0.0.1:0 (a free port; the ready line says
which), never on the default 8420. /metrics is checked with `promtool check
metrics` (Debian package prometheus; scripts/install-deps.sh installs it).

The last line is "N passed, N failed".
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

TOKEN = "s3cret-token"
CEIL = h.CEIL


Http = h.Http
expect = h.expect


def start(c, config="", args=()):
    """A broker on a free HTTP port; returns its Http."""
    return c.http_broker(config, args, TOKEN if "http_token" in config or args else None)


def snapshot(api):
    st = expect(api.get("/v1/status"), 200)
    return (st["last_event"], sorted((e["name"], e["state"], e["resident"]) for e in st["engines"]),
            [(g["uuid"], g["held"]) for g in st["gpus"]])


# ---- cases -------------------------------------------------------------------------

def t_api(c):
    """Every endpoint's happy path, then hostile requests that change nothing."""
    api = start(c, "http_token = %s\n" % TOKEN)
    c.engine("a", "--vram-elastic")
    c.engine("b")  # takes the device from a; not elastic
    # b says "ready" once its cache is full; its report reaches the broker
    # a moment later (until then its grant is what the broker counts)
    h.wait_for("the broker sees b ready", lambda: expect(api.get("/v1/engines/b"), 200)["state"] == "ready",
                timeout=5)
    st = expect(api.get("/v1/status"), 200)
    assert st["ok"] is True and {e["name"] for e in st["engines"]} == {"a", "b"}, st
    assert [g["uuid"] for g in st["gpus"]] == ["host-0"], st
    assert st["gpus"][0]["held"] == sum(e["resident"] for e in st["engines"]), st
    g = st["gpus"][0]
    assert g["total"] >= g["held"] and g["used"] == g["total"] - g["free"], g
    eb = expect(api.get("/v1/engines/b"), 200)
    assert eb["name"] == "b" and eb["state"] == "ready" and eb["resident"] == CEIL and eb["gpu"] == "host-0"
    assert expect(api.get("/v1/engines/a"), 200)["resident"] < CEIL  # shrunk or released for b

    # mutating calls, with the token
    r = expect(api.post("/v1/engines/b/release"), 200)
    assert r["ok"] and r["name"] == "b" and r["state"] == "released" and r["resident"] == 0, r
    r = expect(api.post("/v1/engines/a/refill", {}), 200)
    assert r["state"] == "ready" and r["resident"] == CEIL and r["bytes"] > 0, r
    r = expect(api.post("/v1/engines/a/vram", {"reserve_mib": 1 << 20}), 200)  # more than the device: all goes
    assert r["resident"] < CEIL, r
    r = expect(api.post("/v1/engines/a/vram", {"reserve_mib": None}), 200)
    assert r["resident"] == CEIL and r["state"] == "ready", r
    r = expect(api.post("/v1/handoff", {"from": "a", "to": "b"}), 200)
    assert r["ok"] and r["total_ms"] >= r["refill_ms"] > 0 and r["release_ms"] >= 0, r
    held = c.holds()
    assert held["b"] == CEIL and held["a"] < CEIL, held

    # events: since=N gives only newer ones, in order
    ev = expect(api.get("/v1/events"), 200)
    seqs = [e["seq"] for e in ev["events"]]
    assert seqs == sorted(seqs) and seqs[-1] == ev["last"] and len(seqs) >= 8, ev
    assert any(e["kind"] == "handoff" and e["engine"] == "b" for e in ev["events"]), ev
    mid = seqs[len(seqs) // 2]
    later = expect(api.get("/v1/events?since=%d" % mid), 200)
    assert [e["seq"] for e in later["events"]] == [s for s in seqs if s > mid], (mid, later)
    assert expect(api.get("/v1/events?since=%d" % ev["last"]), 200)["events"] == []
    for e in ev["events"]:
        assert set(e) >= {"seq", "time_ms", "kind", "engine", "gpu", "state", "reason", "bytes"}, e

    # hostile requests: the right error, and nothing changes
    before = snapshot(api)
    post = "/v1/engines/a/release"
    cases = [
        (api.post(post, token=False), 401, "permission"),
        (api.post(post, token="wrong"), 401, "permission"),
        (api.post(post, token=TOKEN + "x"), 401, "permission"),
        (api.post("/v1/handoff", {"from": "b", "to": "a"}, token=False), 401, "permission"),
        (api.post("/v1/engines/ghost/release"), 404, "not_found"),
        (api.post("/v1/handoff", {"from": "ghost", "to": "a"}), 404, "not_found"),
        (api.get("/v1/engines/ghost"), 404, "not_found"),
        (api.get("/v1/engines/a%2f..%2fb"), 404, "not_found"),
        (api.get("/nope"), 404, "not_found"),
        (api.get("/v1/engines/a/explode"), 404, "not_found"),
        (api.get("/v1/engines/a/release/x"), 404, "not_found"),
        (api.get("/../../etc/passwd"), 404, "not_found"),
        (api.post("/v1/engines/a/vram", "{not json"), 400, "bad_message"),
        (api.post("/v1/engines/a/vram", "[1, 2]"), 400, "bad_type"),
        (api.post("/v1/engines/a/vram", "{}"), 400, "missing_field"),
        (api.post("/v1/engines/a/vram", {"reserve_mib": 1, "x": 2}), 400, "extra_field"),
        (api.post("/v1/engines/a/vram", {"reserve_mib": "12"}), 400, "bad_type"),
        (api.post("/v1/engines/a/vram", {"reserve_mib": 1.5}), 400, "bad_type"),
        (api.post("/v1/engines/a/vram", {"reserve_mib": -1}), 400, "out_of_range"),
        (api.post("/v1/engines/a/vram", {"reserve_mib": 1 << 50}), 400, "out_of_range"),
        (api.post("/v1/engines/a/vram", '{"reserve_mib": 1, "reserve_mib": 2}'), 400, "bad_message"),
        (api.post("/v1/engines/a/release", {"force": True}), 400, "extra_field"),
        (api.post("/v1/handoff", {"from": "b"}), 400, "missing_field"),
        (api.post("/v1/handoff", {"from": "b", "to": 7}), 400, "bad_type"),
        (api.post("/v1/handoff", {"from": "b", "to": "b"}), 400, "invalid"),
        (api.post("/v1/handoff", "\xff\xfe"), 400, "bad_message"),
        (api.get("/v1/engines/a/release"), 405, "unsupported"),
        (api.post("/v1/status"), 405, "unsupported"),
        (api.req("DELETE", "/v1/engines/a"), 405, "unsupported"),
        (api.req("PUT", "/v1/handoff", {"from": "b", "to": "a"}), 405, "unsupported"),
        (api.get("/v1/status?x=1"), 400, "extra_field"),
        (api.get("/v1/events?since=abc"), 400, "bad_type"),
        (api.get("/v1/events?since=-1"), 400, "bad_type"),
        (api.get("/v1/events?limit=3"), 400, "extra_field"),
        (api.post("/v1/engines/a/release?force=1"), 400, "extra_field"),
        (api.post(post, "x" * (100 * 1024)), 413, "too_big"),
        (api.post("/v1/engines/b/vram", {"reserve_mib": 8}), 400, "unsupported"),  # the engine can't
    ]
    for i, (got, status, code) in enumerate(cases):
        try:
            expect(got, status, code)
        except AssertionError as e:
            raise AssertionError("hostile case %d: %s" % (i, e))
    assert cases[26][0][2].get("Allow") == "POST" and cases[27][0][2].get("Allow") == "GET, HEAD"
    assert "Bearer" in cases[0][0][2].get("WWW-Authenticate", "")
    # below the socket: a body too big to read (refused on its length,
    # whatever else is wrong), garbage, a chunked body
    assert api.raw(b"POST /v1/engines/a/release HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                   TOKEN.encode() + b"\r\nContent-Length: 50000000\r\n\r\n") == 413
    api.raw(b"\x00\x01garbage\r\n\r\n", timeout=1)  # read as blank lines: no answer until the header timeout
    assert api.raw(b"GET /v1/\xff\xfe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") in (0, 400, 404)  # 0: hung up
    assert api.raw(b"POST /v1/engines/a/release HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                   TOKEN.encode() + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"2\r\n{}\r\n0\r\n\r\n") == 400
    api.raw(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 100000 + b"\r\n\r\n")
    assert snapshot(api) == before, (before, snapshot(api))
    c.want_holds(held)

    # reads stay open without the token; the page and metrics are there
    st, page, hdr = api.get("/", token=False)
    assert st == 200 and hdr["Content-Type"].startswith("text/html") and "<title>Baton broker</title>" in page
    assert expect(api.get("/v1/status", token=False), 200)["ok"]
    st, _, hdr = api.req("HEAD", "/v1/status", token=False)
    assert st == 200
    # pinned: the engine can't (403), and it is not the token's fault
    h.ok(h.call(c.control, "pin", name="b", pinned=True))
    expect(api.post("/v1/engines/b/release"), 403, "permission")
    h.ok(h.call(c.control, "pin", name="b", pinned=False))
    # a clean stop after all that: exit 0 (under the sanitizers: nothing leaked)
    c.bp.send_signal(signal.SIGTERM)
    assert c.bp.wait(10) == 0


def t_busy_503(c):
    """A release of an engine in the middle of a long request: 503 busy
    with Retry-After once acquire_wait_ms is up (the status table of
    http/http.h: busy passes, so the client tries again), and the request
    finishes untouched."""
    api = start(c, "acquire_wait_ms = 300\n")
    a = c.engine("a")
    h.ok(h.gen(a, seed=2))  # holds the device; counts one request
    # a GEN long enough to be caught in the middle: the release's 0.3 s
    # wait, then the five POSTs' (at least 0.35 s in all)
    steps = h.long_steps(a, 2.5)
    res = {}
    t = threading.Thread(target=lambda: res.update(a=h.gen(a, seed=1, steps=steps, batch=16, timeout_ms=60000)))
    t.start()
    h.wait_for("a busy", lambda: h.ok(h.call(a.url, "status"))["requests"] >= 1 and
                c.eng("a")["idle_ms"] == 0, timeout=10)
    t0 = time.time()
    got = api.post("/v1/engines/a/release")
    body = expect(got, 503, "busy")
    assert 0.25 < time.time() - t0 < 10 and "a" in body["message"], body
    assert got[2].get("Retry-After") == "1" and body["error"]["type"] == "server_error", got
    assert c.holds()["a"] == CEIL
    # Five POSTs that each wait 300 ms (more than the write threads) never
    # hold up a read: it is answered while they still wait.
    posts = [threading.Thread(target=lambda: api.post("/v1/engines/a/release")) for _ in range(5)]
    for p in posts:
        p.start()
    time.sleep(0.05)
    expect(api.get("/v1/status"), 200)
    assert sum(p.is_alive() for p in posts) > 0, "a read waited behind POSTs"
    for p in posts:
        p.join(30)
    t.join(60)
    assert not t.is_alive() and res["a"].get("ok") is True, res
    r = expect(api.post("/v1/engines/a/release"), 200)  # idle now: it goes
    assert r["state"] == "released"
    # SIGTERM while a POST waits on the busy engine: the broker stops at
    # once (exit 0, nothing leaked), the POST gets 503 or a closed connection.
    t = threading.Thread(target=lambda: res.update(a=h.gen(a, seed=3, steps=steps, batch=16, timeout_ms=60000)))
    t.start()
    h.wait_for("a busy", lambda: c.eng("a")["idle_ms"] == 0 and c.eng("a")["resident"] > 0, timeout=10)
    box = {}

    def waiting_post():
        try:
            box["r"] = api.post("/v1/engines/a/release")
        except (OSError, http.client.HTTPException) as e:
            box["r"] = (0, str(e), {})
    p = threading.Thread(target=waiting_post)
    p.start()
    time.sleep(0.1)
    t0 = time.time()
    c.bp.send_signal(signal.SIGTERM)
    assert c.bp.wait(10) == 0
    p.join(10)
    assert not p.is_alive() and box["r"][0] in (0, 503), box
    assert time.time() - t0 < 5
    t.join(60)


def t_metrics(c):
    """/metrics after some traffic: promtool passes it and the series are there."""
    if not h.promtool():
        subprocess.run(["scripts/install-deps.sh"], check=False, timeout=600)
    promtool = h.promtool()
    assert promtool, "promtool is missing (scripts/install-deps.sh extracts it into .deps/bin)"
    t_start = time.time()
    api = start(c, 'heartbeat_timeout_ms = 600\n[gpu "host-0"]\nreserve_mib = 4\n')
    a = c.engine("a")
    b = c.engine("b")
    for seed in range(3):  # three requests, counted by b and sent with its heartbeats
        h.ok(h.gen(b, seed=seed))
    h.wait_for("b's heartbeat counts its requests", lambda: c.eng("b")["requests"] == 3, timeout=5)
    expect(api.post("/v1/handoff", {"from": "b", "to": "a"}), 200)
    expect(api.post("/v1/engines/a/release"), 200)
    expect(api.post("/v1/engines/ghost/refill"), 404, "not_found")

    def scrape():
        st, text, hdr = api.get("/metrics")
        assert st == 200 and hdr["Content-Type"].startswith("text/plain; version=0.0.4"), hdr
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr, text)
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                values[k] = float(v)
        # one label for a device (gpu) and one for an engine (engine) on every series
        assert 'uuid="' not in text and 'name="' not in text, text
        return text, values
    text, values = scrape()
    want = {
        'baton_gpu_memory_total_bytes{gpu="host-0"}': lambda v: v >= CEIL,
        'baton_gpu_memory_held_bytes{gpu="host-0"}': lambda v: v == 0,
        'baton_gpu_memory_reserve_bytes{gpu="host-0"}': lambda v: v == 4 << 20,
        'baton_gpu_memory_free_bytes{gpu="host-0"}': lambda v: v > 0,
        'baton_gpu_memory_used_bytes{gpu="host-0"}': lambda v: v >= 0,
        'baton_engine_resident_bytes{engine="a",gpu="host-0"}': lambda v: v == 0,
        'baton_engine_resident_bytes{engine="b",gpu="host-0"}': lambda v: v == 0,
        'baton_engine_state{engine="a",state="released"}': lambda v: v == 1,
        'baton_engine_state{engine="a",state="ready"}': lambda v: v == 0,
        'baton_engine_releases_total{engine="a"}': lambda v: v >= 1,
        'baton_engine_releases_total{engine="b"}': lambda v: v >= 1,
        'baton_engine_refills_total{engine="a"}': lambda v: v >= 1,
        'baton_engine_refill_duration_seconds_count{engine="a"}': lambda v: v >= 1,
        'baton_engine_refill_duration_seconds_bucket{engine="a",le="+Inf"}': lambda v: v >= 1,
        'baton_engine_release_duration_seconds_count{engine="b"}': lambda v: v >= 1,
        'baton_engine_last_refill_bytes_per_second{engine="a"}': lambda v: v > 0,
        'baton_engine_requests_total{engine="a"}': lambda v: v == 0,
        'baton_engine_requests_total{engine="b"}': lambda v: v == 3,
        'baton_handoffs_total': lambda v: v >= 1,
        'baton_errors_total': lambda v: v >= 0,
        'baton_engines{status="live"}': lambda v: v == 2,
        'baton_engines{status="lost"}': lambda v: v == 0,
        'baton_engines{status="dead"}': lambda v: v == 0,
        'baton_build_info{version="%s"}' % open(os.path.join(h.ROOT, "VERSION")).read().strip(): lambda v: v == 1,
        'baton_start_time_seconds': lambda v: t_start - 5 <= v <= time.time(),
    }
    # the handoff b -> a, in phases: a histogram, not only a counter
    for phase in ("decide", "release", "refill", "total"):
        want['baton_handoff_duration_seconds_count{engine="a",phase="%s"}' % phase] = lambda v: v == 1
        want['baton_handoff_duration_seconds_bucket{engine="a",phase="%s",le="+Inf"}' % phase] = lambda v: v == 1
    want['baton_handoff_duration_seconds_sum{engine="a",phase="total"}'] = lambda v: v > 0
    want['baton_handoff_duration_seconds_sum{engine="a",phase="refill"}'] = lambda v: v > 0
    for k, ok in want.items():
        assert k in values and ok(values[k]), (k, values.get(k), text)
    # a silent engine (SIGSTOP) is lost, not live
    a.send_signal(signal.SIGSTOP)
    try:
        h.wait_for("a lost", lambda: c.eng("a")["state"] == "lost", timeout=10)
        text, values = scrape()
        assert (values['baton_engines{status="live"}'], values['baton_engines{status="lost"}']) == (1, 0 + 1), text
        assert values['baton_engine_state{engine="a",state="lost"}'] == 1
    finally:
        a.send_signal(signal.SIGCONT)
    # a dead engine's idle time goes on (its last request ended before it died)
    b.kill()
    b.wait()
    h.wait_for("b dead", lambda: c.eng("b")["state"] == "dead", timeout=10)
    time.sleep(0.3)
    text, values = scrape()
    assert values['baton_engines{status="dead"}'] == 1, text
    assert values['baton_engine_idle_seconds{engine="b"}'] >= 0.3, text


def t_config(c):
    """--http off, a taken port, a token file, bad values."""
    path = os.path.join(c.dir, "b.ini")
    with open(path, "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\n" % (c.control, c.events_url))
    p = subprocess.Popen([h.BROKER, "--config", path, "--http", "off"], stdout=subprocess.PIPE,
                         stderr=open(c.log("broker"), "a"), env=c.env, text=True)
    c.procs.append(p)
    assert len(p.stdout.readline().split()) == 3  # ready CONTROL EVENTS: no HTTP
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    r = subprocess.run([h.BROKER, "--config", path, "--http", "127.0.0.1:%d" % port], capture_output=True,
                       text=True, env=c.env, timeout=10)
    s.close()
    assert r.returncode == 1 and "cannot listen on http://127.0.0.1:%d" % port in r.stderr, r.stderr
    for bad in ("nowhere", "127.0.0.1:99999", "host:x", "/path:1"):
        r = subprocess.run([h.BROKER, "--config", path, "--http", bad, "--check"], capture_output=True,
                           text=True, timeout=10)
        assert r.returncode == 2 and "--http" in r.stderr, (bad, r.stderr)
    with open(path, "a") as f:
        f.write("http = 1.2.3.4\n")
    r = subprocess.run([h.BROKER, "--config", path, "--check"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "b.ini:4: http = '1.2.3.4'" in r.stderr, r.stderr
    tok = os.path.join(c.dir, "token")
    with open(tok, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(tok, 0o640)  # a token others can read is refused
    with open(path, "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\n" % (c.control, c.events_url))
    r = subprocess.run([h.BROKER, "--config", path, "--http-token-file", tok, "--check"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0 and "http = 127.0.0.1:8420" in r.stdout and TOKEN not in r.stdout, r.stdout
    for conf, want in (("http =\n", "http = off"), ("http = off\nhttp_token = abc\n", "http_token is set"),
                       ("http_token_file = %s\n" % tok, "http_token is set"),
                       ("http = http://[::1]:0\n", "http = [::1]:0")):
        with open(path, "w") as f:
            f.write("[broker]\n" + conf)
        r = subprocess.run([h.BROKER, "--config", path, "--check"], capture_output=True, text=True, timeout=10)
        assert r.returncode == 0 and want in r.stdout and "abc" not in r.stdout, (conf, r.stdout, r.stderr)
    bad_tok = os.path.join(c.dir, "bad-token")
    with open(bad_tok, "w") as f:
        f.write("two words\n")
    os.chmod(bad_tok, 0o600)
    for conf, want in (("http_token = a b\n", "http_token: want 1 to 255 visible"),
                       ("http_token_file = %s/none\n" % c.dir, "cannot open the token file"),
                       ("http_token_file = %s\n" % bad_tok, "the token must be one line")):
        with open(path, "w") as f:
            f.write("[broker]\n" + conf)
        r = subprocess.run([h.BROKER, "--config", path, "--check"], capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and want in r.stderr, (conf, r.stderr)
    with open(path, "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\n" % (c.control, c.events_url))
    api = start(c, "", args=("--http-token-file", tok))
    expect(api.post("/v1/engines/x/release", token=False), 401, "permission")
    expect(api.post("/v1/engines/x/release"), 404, "not_found")
    c.bp.send_signal(signal.SIGTERM)
    assert c.bp.wait(10) == 0


def t_twins(c):
    """The HTTP twins of CLI commands (docs/reference/http-api.md's table): the
    engines list, pin and unpin, release of every engine (or a device's),
    /healthz and /readyz; and `baton release --every` beside them."""
    api = start(c, "http_token = %s\n" % TOKEN)
    c.engine("a", "--vram-elastic")
    c.engine("b")
    h.wait_for("the broker sees b ready", lambda: expect(api.get("/v1/engines/b"), 200)["state"] == "ready",
               timeout=5)
    assert expect(api.get("/healthz", token=False), 200)["ok"] is True
    assert expect(api.get("/readyz", token=False), 200)["ok"] is True
    expect(api.post("/healthz"), 405, "unsupported")
    lst = expect(api.get("/v1/engines", token=False), 200)
    assert lst["ok"] is True and set(lst) == {"ok", "engines"} and \
        sorted(e["name"] for e in lst["engines"]) == ["a", "b"], lst
    st = expect(api.get("/v1/status"), 200)
    assert lst["engines"] == st["engines"] or [e["name"] for e in lst["engines"]] == \
        [e["name"] for e in st["engines"]], (lst, st)

    # pin and unpin: the token, then the state
    expect(api.post("/v1/engines/b/pin", token=False), 401, "permission")
    r = expect(api.post("/v1/engines/b/pin"), 200)
    assert r == {"ok": True, "name": "b", "pinned": True}, r
    assert expect(api.get("/v1/engines/b"), 200)["pinned"] is True
    expect(api.post("/v1/engines/ghost/pin"), 404, "not_found")
    expect(api.post("/v1/engines/b/pin", {"pinned": False}), 400, "extra_field")

    # release of every engine: the pinned one refuses (403, listed), the others go
    holds_b = c.holds()["b"]
    body = expect(api.post("/v1/release", {"all": True}), 403, "permission")
    assert [f["name"] for f in body["failed"]] == ["b"] and body["failed"][0]["code"] == "permission", body
    assert all(x["name"] == "a" for x in body["released"]), body
    assert c.holds()["b"] == holds_b and c.holds()["a"] == 0, c.holds()
    r = expect(api.post("/v1/engines/b/unpin"), 200)
    assert r == {"ok": True, "name": "b", "pinned": False}, r
    r = expect(api.post("/v1/release", {"gpu": "host-0"}), 200)
    assert [x["name"] for x in r["released"]] == ["b"] and r["released"][0]["ms"] >= 0, r
    c.want_holds({"a": 0, "b": 0})
    assert expect(api.post("/v1/release", {"all": True}), 200)["released"] == []  # nothing held: nothing to do
    for body, status, code in (({"gpu": "nope"}, 404, "not_found"), ({}, 400, "missing_field"),
                               (None, 400, "missing_field"), ({"all": False}, 400, "invalid"),
                               ({"all": 1}, 400, "bad_type"), ({"gpu": 7}, 400, "bad_type"),
                               ({"gpu": ""}, 400, "bad_type"),
                               ({"all": True, "gpu": "host-0"}, 400, "extra_field"),
                               ({"every": True}, 400, "extra_field")):
        expect(api.post("/v1/release", body), status, code)
    expect(api.post("/v1/release", {"all": True}, token=False), 401, "permission")
    expect(api.get("/v1/release"), 405, "unsupported")

    # the CLI twin
    env = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url)

    def baton(*args):
        return subprocess.run([h.CLI] + list(args), capture_output=True, text=True, env=env, timeout=30)
    expect(api.post("/v1/engines/a/refill"), 200)
    r = baton("release", "--every", "--gpu", "host-0")
    assert r.returncode == 0 and r.stdout.startswith("a released, "), (r.stdout, r.stderr)
    assert c.holds()["a"] == 0
    expect(api.post("/v1/engines/b/refill"), 200)
    h.ok(h.call(c.control, "pin", name="b", pinned=True))
    r = baton("--json", "release", "--every")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["released"] == [] and out["failed"][0]["name"] == "b" and \
        "pinned" in r.stderr, (r.returncode, r.stdout, r.stderr)
    r = baton("release", "--every", "--gpu", "nope")
    assert r.returncode == 4 and "no device 'nope'" in r.stderr, (r.returncode, r.stderr)
    for args in (("release", "a", "--every"), ("release", "--gpu", "host-0", "a"), ("refill", "--every"),
                 ("release", "--every", "--full")):
        r = baton(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
    c.bp.send_signal(signal.SIGTERM)
    assert c.bp.wait(10) == 0


CASES = [t_api, t_busy_503, t_metrics, t_config, t_twins]


def main():
    return h.run_cases(CASES, sys.argv[1:], logs=("broker", "a", "b"))


if __name__ == "__main__":
    sys.exit(main())
