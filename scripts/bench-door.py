#!/usr/bin/python3
"""bench-door.py: the front door under two models that contend for one
device, against the two bounds, measured in one run (issue 18's benchmark).

  bench-door.py --build DIR --arena A.arena --arena B.arena --backend cuda|host
                [--clients N] [--requests N] [--max-tokens N] [--cap-mib N]
                [--device-mib N] [--engine-flag F ...] [--json OUT]

Three modes, each a fresh broker and fresh engines, the same workload:
N clients, each sending its requests alternately to model A and model B
(client k starts with A when k is even), streamed chat completions with
a fixed seed, through:

  resident  the front door, the device large enough for both (no cap):
            no switch ever; the upper bound
  door      the front door under a cap ([gpu "*"] total_mib) that holds
            the experts of one model only: the door batches per model
  restart   no broker: one engine process at a time; a request for the
            other model waits for the requests in flight, then the engine
            is stopped and the other one started (what llama-swap does)

Per mode: time to first token (the first content piece of the stream)
p50/p99 over all requests and over those served right after a switch
(the first of each batch: its model differs from the one whose first
token came before it), switches and switches per minute, output tokens
per second over the run, the wall time. Prints a table; --json writes
the figures.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

QUESTIONS = ["Who was Noah?", "What did Moses see on the mountain?", "Tell of the flood.",
             "Who built the ark?", "What is the law?", "Who was Abraham's son?"]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


class Run:
    def __init__(self, a):
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="bench-door-")
        self.procs = []
        self.env = dict(os.environ, BATON_HOSTDEV_DIR=self.dir)

    def bin(self, name):
        return os.path.join(self.a.build, "bin", name)

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []

    def broker(self, cap_mib):
        cfg = os.path.join(self.dir, "broker.ini")
        with open(cfg, "w") as f:
            f.write("[broker]\ncontrol = ipc://%s/broker.sock\nevents = ipc://%s/events.sock\n"
                    "http = 127.0.0.1:0\nhttp_token = bench\ndoor_keep_alive_s = forever\n"
                    "command_timeout_ms = 120000\nacquire_wait_ms = 120000\n" % (self.dir, self.dir))
            if cap_mib:
                f.write("[gpu \"*\"]\ntotal_mib = %d\n" % cap_mib)
        p = subprocess.Popen([self.bin("baton-broker"), "--config", cfg], stdout=subprocess.PIPE,
                             stderr=open(os.path.join(self.dir, "broker.log"), "a"), env=self.env, text=True)
        self.procs.append(p)
        line = p.stdout.readline().split()
        assert line and line[0] == "ready" and len(line) == 4, line
        return line[3]

    def engine(self, name, arena, broker=True):
        args = [self.bin("baton-engine"), "--name", name, "--shared-expert-arena", arena,
                "--listen", "ipc://%s/%s.sock" % (self.dir, name), "--backend", self.a.backend,
                "--http", "127.0.0.1:0", "--expert-cache-release"] + list(self.a.engine_flag)
        if self.a.backend == "host":
            args += ["--host-device-mib", str(self.a.device_mib)]
        if broker:
            args += ["--broker", "ipc://%s/broker.sock" % self.dir]
        log = open(os.path.join(self.dir, name + ".log"), "a")
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=self.env, text=True)
        self.procs.append(p)
        url = None
        t0 = time.time()
        while True:  # "http: URL" and "ready ..." on stdout, in some order
            line = p.stdout.readline()
            assert line, "engine %s did not start (see %s)" % (name, log.name)
            if line.startswith("http: "):
                url = line.split()[1]
            if line.startswith("ready"):
                break
        while url is None:
            line = p.stdout.readline()
            assert line, "engine %s printed no http: line" % name
            if line.startswith("http: "):
                url = line.split()[1]
        p.url, p.start_s = url, time.time() - t0
        threading.Thread(target=lambda: p.stdout.read(), daemon=True).start()
        return p


def model_name(arena):
    base = os.path.basename(arena)
    return base[:-6] if base.endswith(".arena") else base


def stream_chat(url, model, question, seed, max_tokens, token=None):
    """(t_first, tokens, t_end) of one streamed chat completion: the clock
    (time.time()) when its first content came, and when it ended."""
    host, port = url[7:].rsplit(":", 1)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": question}], "seed": seed,
                       "temperature": 0.7, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}})
    hdr = {"Content-Type": "application/json"}
    if token:
        hdr["Authorization"] = "Bearer " + token
    t0 = time.time()
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    c.request("POST", "/v1/chat/completions", body=body, headers=hdr)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("%d %s" % (r.status, r.read()[:300]))
    ttft, tokens = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: {"):
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            tokens = d["usage"]["completion_tokens"]
        for ch in d.get("choices", []):
            if ch.get("delta", {}).get("content") and ttft is None:
                ttft = time.time()
    c.close()
    return (ttft if ttft is not None else time.time()), tokens, time.time()


def workload(a, models, send):
    """Runs the clients; send(model, question, seed) -> (t_first, tokens).
    Returns the records (model, t_first, ttft, tokens), the errors and the
    wall time. TTFT counts from the client's send: waiting for a switch
    (or an engine's restart) is in it."""
    recs, errors, lock = [], [], threading.Lock()

    def client(k):
        for i in range(a.requests):
            m = models[(k + i) % 2]
            try:
                t0 = time.time()
                t_first, tokens = send(m, QUESTIONS[(k + i) % len(QUESTIONS)], 1000 + k * a.requests + i)
                with lock:
                    recs.append((m, t_first, t_first - t0, tokens))
            except Exception as e:  # noqa: BLE001 (counted)
                with lock:
                    errors.append(repr(e))

    t0 = time.time()
    ts = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return recs, errors, time.time() - t0


def figures(name, recs, errors, wall, switches):
    recs.sort(key=lambda r: r[1])
    after = [r[2] for i, r in enumerate(recs) if i > 0 and r[0] != recs[i - 1][0]]
    ttft = [r[2] for r in recs]
    toks = sum(r[3] for r in recs)
    return {"mode": name, "requests": len(recs), "errors": len(errors), "wall_s": wall,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "ttft_after_switch_p50_s": pct(after, 50), "ttft_after_switch_p99_s": pct(after, 99),
            "switches": switches, "switches_per_min": switches / wall * 60 if wall else 0,
            "tokens_per_s": toks / wall if wall else 0, "first_errors": errors[:3]}


def door_metric(url, name):
    host, port = url[7:].rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def mode_door(a, cap_mib, name):
    r = Run(a)
    try:
        url = r.broker(cap_mib)
        for i, ar in enumerate(a.arena):
            r.engine("e%d" % i, ar)
        models = [model_name(x) for x in a.arena]
        time.sleep(1)  # the door sees both
        # warm: one request each, so both modes start from the same place
        for m in models:
            stream_chat(url, m, "Hello", 1, 4, "bench")
        s0 = door_metric(url, "baton_door_switches_total")
        recs, errors, wall = workload(a, models, lambda m, q, s: stream_chat(url, m, q, s, a.max_tokens,
                                                                               "bench")[:2])
        sw = door_metric(url, "baton_door_switches_total") - s0
        return figures(name, recs, errors, wall, sw)
    finally:
        r.stop_all()


def mode_restart(a):
    """One engine at a time, no broker: a request for the other model waits
    for those in flight, then the engine is replaced (llama-swap)."""
    r = Run(a)
    models = [model_name(x) for x in a.arena]
    st = {"cur": None, "proc": None, "inflight": 0, "switches": 0}
    cv = threading.Condition()

    def send(m, q, seed):
        with cv:
            while st["cur"] != m:
                if st["inflight"] == 0:
                    if st["proc"] is not None:
                        st["proc"].send_signal(signal.SIGTERM)
                        st["proc"].wait(60)
                        st["switches"] += 1
                    st["proc"] = r.engine("solo", a.arena[models.index(m)], broker=False)
                    st["cur"] = m
                    cv.notify_all()
                else:
                    cv.wait()
            st["inflight"] += 1
            url = st["proc"].url
        try:
            return stream_chat(url, m, q, seed, a.max_tokens)[:2]
        finally:
            with cv:
                st["inflight"] -= 1
                cv.notify_all()

    try:
        send(models[0], "Hello", 1)
        st["switches"] = 0
        recs, errors, wall = workload(a, models, send)
        return figures("restart", recs, errors, wall, st["switches"])
    finally:
        r.stop_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--arena", action="append", required=True, help="twice: the two models' arenas")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8, help="per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--cap-mib", type=int, required=True,
                    help="[gpu \"*\"] total_mib for the door mode: the experts of one model fit, not two")
    ap.add_argument("--device-mib", type=int, default=0, help="host backend: the device's size")
    ap.add_argument("--engine-flag", action="append", default=[], help="more baton-engine flags")
    ap.add_argument("--modes", default="resident,door,restart")
    ap.add_argument("--json")
    a = ap.parse_args()
    assert len(a.arena) == 2, "--arena twice"
    cols = ["mode", "requests", "errors", "wall_s", "ttft_p50_s", "ttft_p99_s", "ttft_after_switch_p50_s",
            "ttft_after_switch_p99_s", "switches", "switches_per_min", "tokens_per_s"]
    print(" ".join("%-12s" % c[:12] for c in cols), flush=True)
    out = []
    for m in a.modes.split(","):
        print("bench-door: %s ..." % m, file=sys.stderr, flush=True)
        out.append(mode_door(a, 0, "resident") if m == "resident" else mode_door(a, a.cap_mib, "door")
                   if m == "door" else mode_restart(a))
        # each mode's line as soon as it is measured: a run cut short keeps what it has
        f = out[-1]
        print(" ".join(("%-12.4g" if isinstance(f[c], float) else "%-12s") % f[c] for c in cols), flush=True)
    if a.json:
        with open(a.json, "w") as fo:
            json.dump({"clients": a.clients, "requests_per_client": a.requests, "max_tokens": a.max_tokens,
                       "cap_mib": a.cap_mib, "backend": a.backend, "arenas": a.arena, "modes": out}, fo, indent=1)
    return 1 if any(f["errors"] for f in out) else 0


if __name__ == "__main__":
    sys.exit(main())
