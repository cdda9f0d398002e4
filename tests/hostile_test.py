#!/usr/bin/python3
"""hostile_test.py: garbage on every socket of a broker and two engines.

  - the broker's control socket and each engine's socket get raw frames
    (baton-proto-tool call sends stdin as it is): empty, random bytes,
    truncated and wrongly typed msgpack, an array that claims 4 G items,
    deep nesting, a reply, an event, an unknown op, a 1 MiB string, and a
    frame past BATON_PROTO_MAX_MSG (nngcat --file);
  - every nng socket, the events socket included, gets raw connections that
    send bytes that are not an SP handshake, or nothing, and hang up;
  - the HTTP port gets malformed requests on raw sockets.
Then every process is alive, answers, computes the right GEN, and the
broker's and engines' status are what they were before.
Last line "N passed, N failed".
"""
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MAX_MSG = (64 << 20) + (1 << 20)
sent = {"frames": 0, "raw_conns": 0, "http": 0}


def mp_payloads(rng):
    import msgpack
    p = [b"", b"\xc1", b"\xff" * 7, bytes(rng.randrange(256) for _ in range(64)),
         bytes(rng.randrange(256) for _ in range(4096)),
         msgpack.packb({"v": 1, "op": "gen", "id": 1})[:-3],             # truncated
         msgpack.packb({"v": "x", "op": 5, "id": "y"}),                   # wrong types
         msgpack.packb({"v": 1, "op": "gen", "id": 2, "steps": -1, "batch": 1 << 40, "seed": "s"}),
         b"\xdd\xff\xff\xff\xff",                                         # array of 4 G items
         b"\xdf\xff\xff\xff\xff",                                         # map of 4 G pairs
         b"\x91" * 100000,                                                # deep nesting
         msgpack.packb({"v": 1, "op": "status", "id": 3, "ok": True}),    # a reply
         msgpack.packb({"v": 1, "op": "event", "id": 4}),
         msgpack.packb({"v": 1, "op": "nope", "id": 5}),
         msgpack.packb({"v": 99, "op": "status", "id": 6}),
         msgpack.packb({"v": 1, "op": "release", "id": 7, "name": "x" * (1 << 20)}),
         msgpack.packb({"v": 1, "op": "gen", "id": 8, "steps": 1, "batch": 1, "seed": 1,
                        "input": b"\0" * 12}),                            # wrong input size
         msgpack.packb([1, 2, 3]), msgpack.packb("status")]
    for _ in range(20):
        p.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))))
    return p


def frames(url, rng, tmp):
    for data in mp_payloads(rng):
        r = subprocess.run([h.TOOL, "call", url, "--timeout", "2000"], input=data, capture_output=True,
                           timeout=20)
        assert r.returncode in (0, 1, 2, 3), (url, r.returncode, r.stderr[-300:])
        sent["frames"] += 1
    big = os.path.join(tmp, "big")
    with open(big, "wb") as f:
        f.write(b"\x92" + b"\xc6" + (MAX_MSG + 16).to_bytes(4, "big"))
        f.truncate(MAX_MSG + 4096)
    subprocess.run(["nngcat", "--req0", "--dial", url, "--file", big, "--recv-timeout", "2", "--quiet"],
                   capture_output=True, timeout=30)
    sent["frames"] += 1


def raw_conns(url, rng):
    path = url[len("ipc://"):]
    for i in range(12):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(path)
            if i % 3 == 1:
                s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
            elif i % 3 == 2:
                s.sendall(b"\x00SP\x00\x00\x99\x00\x00")  # an SP header of an unknown protocol
            time.sleep(0.01)
        except OSError:
            pass
        finally:
            s.close()
        sent["raw_conns"] += 1


def http_garbage(port, rng):
    reqs = [b"\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"b" * 200000 + b"\r\n\r\n",
            b"POST /v1/handoff HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"from\":",
            b"POST /v1/handoff HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
            b"POST /v1/release HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n\xff\xfe\x00{[[[[",
            b"GET /v1/status HTTP/1.1\r\n" + b"H: v\r\n" * 5000 + b"\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(64),          # a TLS hello
            b"GET /%00%ff%c0 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"DELETE /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"]
    reqs += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000))) for _ in range(10)]
    for data in reqs:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        try:
            s.sendall(data)
            s.settimeout(2)
            try:
                s.recv(4096)
            except OSError:
                pass
        except OSError:
            pass
        finally:
            s.close()
        sent["http"] += 1


def picture(c, engines):
    br = sorted((e["name"], e["state"], e["resident"]) for e in c.status()["engines"])
    en = [(p.name, h.ok(h.call_retry(p.url, "status"))["state"], h.ok(h.call_retry(p.url, "status"))["mapped"])
          for p in engines]
    return br, en


def t_hostile(c):
    rng = random.Random(int(os.environ.get("HOSTILE_SEED", "5")))
    path = os.path.join(c.dir, "broker.ini")
    h.reference(c, 1)
    p = c.broker("http = 127.0.0.1:0\n", wait=False)
    line = p.stdout.readline().split()
    assert line[0] == "ready" and line[3].startswith("http://"), line
    c.events = h.Events(c.events_url)
    port = int(line[3].rsplit(":", 1)[1].strip("/"))
    del path
    a = c.engine("a", host_mib=64)
    b = c.engine("b", host_mib=64)
    # settled first: an engine's startup refill may still run after its
    # "ready" line, and a picture taken then never comes back
    c.want_holds({"a": h.CEIL, "b": h.CEIL})
    h.wait_for("both engines ready", lambda: all(
        h.ok(h.call_retry(p.url, "status"))["state"] == "ready" for p in (a, b)))
    before = picture(c, [a, b])
    tmp = tempfile.mkdtemp(dir=c.dir)
    for url in (c.control, a.url, b.url):
        frames(url, rng, tmp)
    for url in (c.control, c.events_url, a.url, b.url):
        raw_conns(url, rng)
    http_garbage(port, rng)
    for proc in (c.bp, a, b):
        assert proc.poll() is None, "%s died" % getattr(proc, "name", "broker")
    h.wait_for("status as before", lambda: picture(c, [a, b]) == before, timeout=3)
    for e in (a, b):
        r = h.call_retry(e.url, "gen", timeout_ms=10000, steps=2, batch=1, seed=1)
        assert r.get("ok") and (r["checksum"], r["output"]) == h.reference(c, 1), r
    import urllib.request
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/status" % port, timeout=5) as r:
        assert r.status == 200
    print("  sent %d frames, %d raw connections, %d HTTP requests; refused once and retried: %d, connects timed out and retried: %d" %
          (sent["frames"], sent["raw_conns"], sent["http"], h.retried["refused"], h.retried["connect_timeouts"]))


def main():
    return h.run_cases([t_hostile], sys.argv[1:], make=lambda: h.BrokerCase(call=h.call_retry), logs=("broker", "a", "b"))

if __name__ == "__main__":
    sys.exit(main())
