#!/usr/bin/python3
"""gpu-fleet-proof.py: issue 26's device run: a fleet of two ~16 GiB models
from GGUF under a device cap that holds one, served from one file.

  gpu-fleet-proof.py --build DIR --out DIR [--backend cuda|host] [--layers N]
                     [--gguf-synth PATH] [--shm DIR] [--keep-files]

Two random Qwen3-30B-A3B-shaped q4_K GGUF files (scripts/gguf-synth.py,
seeds 1 and 2, 48 layers: 16.1 GiB each) become two [model] sections of one
broker configuration (source = the .gguf), under [gpu "*"] total_mib of
1.25 times one model's experts. Nothing else is made by hand. Then, through
the front door, streamed greedy completions:

  1. fa, cold: its arena is made from the GGUF, its engine started, refilled
  2. fb, cold, and a switch: fa gives way (the cap holds one)
  3. fa again: a switch to a running engine (its refill only)
  4. fb again: the same the other way

For each: the time to first token the client saw, and its parts as the
broker reports them (/metrics, the change of each histogram's _sum over the
request: baton_door_ttft_start_seconds split into
baton_fleet_start_seconds{phase="arena"} and {phase="engine"}, then
baton_door_ttft_refill_seconds, baton_door_ttft_prefill_seconds, and
baton_door_ttft_wait_seconds, which holds the start and the refill). Checks:
every request 200 with text; only one model holds device memory after each
switch; fa's and fb's answers the same each time (greedy); each model
started once. OUT gets summary.json, /v1/models and /metrics after each
request, the broker's log. --backend host is the dry run (small --layers,
the host device). The first failed check ends the run: "FAIL: why", exit 1.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from gpu_proof import T0, fail, step  # scripts/gpu_proof.py, beside this one
import gpu_proof as proof

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
GIB = 1 << 30
PROMPT = "In the beginning God created the heaven and the earth. And the"
SLOT_BYTES = 3 * (2048 * 768 // 256 * 144)  # one expert's gate, up and down in q4_K
EXPERTS = 128


class Fleet:
    def __init__(self, a):
        self.a = a
        self.cuda = a.backend == "cuda"
        self.dir = tempfile.mkdtemp(prefix="fleet-proof-", dir="/tmp")
        self.files = os.path.join(a.shm, "baton-fleet-proof")
        self.out = a.out
        os.makedirs(self.out, exist_ok=True)
        self.env = dict(os.environ, BATON_HOSTDEV_DIR=self.dir)
        self.proc = None
        self.summary = {"backend": a.backend, "layers": a.layers, "requests": []}
        self.token = "fleet-proof-token"

    # -- the files
    def make_ggufs(self):
        synth = self.a.gguf_synth
        if not os.path.isfile(synth):
            fail("%s is missing: it comes with branch s4-kspeed (or give --gguf-synth PATH)" % synth)
        os.makedirs(self.files, exist_ok=True)
        one = self.a.layers * EXPERTS * SLOT_BYTES + 460 * MIB  # experts + embedding, head, attention
        st = os.statvfs(self.files)
        free = st.f_bavail * st.f_frsize
        have = sum(os.path.getsize(os.path.join(self.files, f)) for f in os.listdir(self.files))
        if free + have < 4.1 * one:
            fail("%s has %.1f GiB free: two GGUF files and their two arenas want about %.1f GiB"
                 % (self.a.shm, (free + have) / GIB, 4.1 * one / GIB))
        self.gguf = {}
        jobs = {}
        t = time.time()
        for name, seed in (("fa", 1), ("fb", 2)):  # both at once (one core each)
            path = os.path.join(self.files, name + ".gguf")
            self.gguf[name] = path
            if self.a.keep_files and os.path.exists(path):
                step("gguf: reusing %s" % path)
                continue
            if not self.a.keep_files:  # a fresh arena each run: its part of the first TTFT is the proof's
                for f in (os.path.join(self.files, name + ".arena"), os.path.join(self.files, name + ".arena.lock")):
                    try:
                        os.unlink(f)
                    except OSError:
                        pass
            jobs[name] = (seed, path, subprocess.Popen(
                [sys.executable, synth, "--layers", str(self.a.layers), "--seed", str(seed), "--out", path,
                 "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for name, (seed, path, p) in jobs.items():
            out, err = p.communicate()
            if p.returncode != 0:
                fail("gguf-synth.py --seed %d failed (%d): %s" % (seed, p.returncode, err.strip()[-800:]))
            step("gguf: %s (seed %d): %.2f GiB" % (path, seed, os.path.getsize(path) / GIB))
        if jobs:
            self.summary["gguf_s"] = time.time() - t
            step("gguf: both written in %.1f s" % self.summary["gguf_s"])

    def plan(self):
        seg = (256 if self.cuda else 16) * MIB
        per_seg = seg // SLOT_BYTES
        self.experts = (self.a.layers * EXPERTS + per_seg - 1) // per_seg * seg
        self.cap_mib = int(self.experts * 1.25 / MIB)
        self.seg_mib = seg // MIB
        self.summary.update(experts_bytes=self.experts, cap_mib=self.cap_mib)
        step("budget: total_mib %d holds one model's %.0f MiB of experts, not two" % (self.cap_mib,
                                                                                    self.experts / MIB))

    # -- the broker
    def start(self):
        flags = "--ctx 1024 --vram-segment-mib %d" % self.seg_mib
        if not self.cuda:
            flags += " --host-device-mib %d" % (self.cap_mib * 2 + 2048)
        cfg = os.path.join(self.dir, "broker.ini")
        with open(cfg, "w") as f:
            f.write(proof.broker_ini(self.dir, self.token, self.cap_mib,
                                     "arena_dir = %s\nrun_dir = %s\n" % (self.files, self.dir)))
            for name in ("fa", "fb"):
                f.write("[model \"%s\"]\nsource = %s\nbackend = %s\ndevice = 0\nengine_flags = %s\n"
                        % (name, self.gguf[name], self.a.backend, flags))
        shutil.copy(cfg, os.path.join(self.out, "broker.ini"))
        self.proc, self.door = proof.start_broker(proof.program(self.a.build, "baton-broker"), cfg,
                                                  os.path.join(self.dir, "broker.log"), self.env)
        ms = self.models()
        if sorted(ms) != ["fa", "fb"] or any(m["state"] != "stopped" for m in ms.values()):
            fail("/v1/models at start: %s" % json.dumps(ms)[:600])
        step("broker: ready at %s:%d; /v1/models: fa and fb stopped, no engine running" % self.door)

    def tail(self, n=3000):
        return proof.tail(os.path.join(self.dir, "broker.log"), n)

    def get(self, path):
        status, body = proof.request(self.door, self.token, "GET", path, timeout=60)
        if status != 200:
            fail("GET %s: %d %s" % (path, status, body[:300]))
        return body

    def models(self):
        return {m["id"]: m for m in json.loads(self.get("/v1/models"))["data"]}

    def status(self):
        return {e["name"]: e for e in json.loads(self.get("/v1/status"))["engines"]}

    def metrics(self):
        """{(name, labels): value} of every histogram _sum and _count and gauge line."""
        out = {}
        for line in self.get("/metrics").splitlines():
            m = re.match(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$", line)
            if m:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
        return out

    # -- a request
    def stream(self, model):
        body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True})
        t0 = time.time()
        c = http.client.HTTPConnection(self.door[0], self.door[1], timeout=280)
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json",
                                                                  "Authorization": "Bearer " + self.token})
        r = c.getresponse()
        if r.status != 200:
            fail("the completion for %s answered %d: %s (broker log: %s)" % (model, r.status, r.read()[:400],
                                                                          self.tail(1500)))
        ttft, text = None, ""
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            d = json.loads(line[6:])
            if "error" in d:
                fail("the stream for %s carried an error: %s" % (model, d["error"]))
            for ch in d.get("choices", []):
                if ch.get("text"):
                    if ttft is None:
                        ttft = time.time() - t0
                    text += ch["text"]
        c.close()
        if ttft is None:
            fail("the stream for %s had no text" % model)
        return ttft, time.time() - t0, text

    def request(self, n, model, what):
        before = self.metrics()
        ttft, total, text = self.stream(model)
        # the door counts a request's parts as its answer goes out: read until they moved
        lab = '{model="%s"}' % model

        def delta(name, labels=lab):
            return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)
        end = time.time() + 10
        while True:
            after = self.metrics()
            if delta("baton_door_ttft_prefill_seconds_count") >= 1 or time.time() > end:
                break
            time.sleep(0.1)
        if delta("baton_door_ttft_prefill_seconds_count") < 1:
            fail("request %d: /metrics counted no time to first token for %s" % (n, model))
        parts = {"start": delta("baton_door_ttft_start_seconds_sum"),
                 "arena": delta("baton_fleet_start_seconds_sum", '{model="%s",phase="arena"}' % model),
                 "engine": delta("baton_fleet_start_seconds_sum", '{model="%s",phase="engine"}' % model),
                 "refill": delta("baton_door_ttft_refill_seconds_sum"),
                 "prefill": delta("baton_door_ttft_prefill_seconds_sum"),
                 "wait": delta("baton_door_ttft_wait_seconds_sum")}
        st = self.status()
        holds = {k: e["resident"] for k, e in st.items()}
        rec = {"n": n, "model": model, "what": what, "ttft_s": ttft, "total_s": total, "text": text,
               "parts_s": parts, "resident": holds}
        self.summary["requests"].append(rec)
        with open(os.path.join(self.out, "metrics-%d-%s.txt" % (n, model)), "w") as f:
            f.write(self.get("/metrics"))
        with open(os.path.join(self.out, "models-%d-%s.json" % (n, model)), "w") as f:
            f.write(json.dumps(json.loads(self.get("/v1/models")), indent=1))
        parts["rest"] = ttft - parts["start"] - parts["refill"] - parts["prefill"]  # the client's and the door's own
        step("%d. %-3s %-34s TTFT %7.2f s = start %6.2f (arena %6.2f + engine %5.2f) + refill %5.2f + "
             "prefill %5.2f + rest %5.2f; resident %s" % (
                 n, model, what, ttft, parts["start"], parts["arena"], parts["engine"], parts["refill"],
                 parts["prefill"], parts["rest"],
                 ", ".join("%s %.0f MiB" % (k, v / MIB) for k, v in sorted(holds.items()))))
        other = [k for k in holds if k != model]
        if holds.get(model, 0) < self.experts * 0.99:
            fail("request %d: %s holds %.0f MiB after it served, not its %.0f MiB of experts"
                 % (n, model, holds.get(model, 0) / MIB, self.experts / MIB))
        if any(holds[k] + holds[model] > self.cap_mib * MIB for k in other):
            fail("request %d: more than the cap is held: %s" % (n, holds))
        return rec

    def proofs(self):
        if self.cuda:
            step("device: %s" % ", ".join(proof.smi("gpu=name,driver_version,memory.total")[0]))
        self.make_ggufs()
        self.plan()
        self.start()
        r1 = self.request(1, "fa", "cold (arena, engine, refill)")
        if r1["parts_s"]["arena"] <= 0 or r1["parts_s"]["engine"] <= 0:
            fail("request 1: the start's parts are missing from /metrics: %s" % r1["parts_s"])
        r2 = self.request(2, "fb", "cold, and a switch from fa")
        r3 = self.request(3, "fa", "a switch back (fa's engine runs)")
        r4 = self.request(4, "fb", "a switch back (fb's engine runs)")
        if r3["text"] != r1["text"] or r4["text"] != r2["text"]:
            fail("greedy answers differ: fa %r then %r, fb %r then %r" % (r1["text"], r3["text"], r2["text"],
                                                                          r4["text"]))
        if r3["parts_s"]["start"] > 0 or r4["parts_s"]["start"] > 0:
            fail("an engine was started again for a switch: %s %s" % (r3["parts_s"], r4["parts_s"]))
        ms = self.models()
        for name in ("fa", "fb"):
            fl = ms[name].get("fleet", {})
            if fl.get("starts") != 1 or fl.get("crashes") != 0:
                fail("%s: starts %s, crashes %s (want 1 and 0)" % (name, fl.get("starts"), fl.get("crashes")))
        m = self.metrics()
        sw = m.get(("baton_door_switches_total", ""), 0)
        self.summary["switches"] = sw
        self.summary["total_s"] = time.time() - T0
        step("answers: fa %r, fb %r (the same both times)" % (r1["text"], r2["text"]))
        step("fleet proof PASSED in %.1f s (%d switches)%s" % (self.summary["total_s"], sw,
                                                              " (over the 300 s budget)"
                                                              if self.summary["total_s"] > 300 else ""))

    def cleanup(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        proof.keep(self.dir, self.out, ("broker.log",), self.summary)
        if not self.a.keep_files:
            shutil.rmtree(self.files, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self):
        return proof.run("gpu-fleet-proof.py", self.summary, self.proofs, self.cleanup)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--layers", type=int, default=0, help="of 48 (default 48 on cuda, 1 on host)")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--gguf-synth", default=os.path.join(HERE, "gguf-synth.py"))
    ap.add_argument("--keep-files", action="store_true", help="reuse the GGUF files and arenas, keep them after")
    a = ap.parse_args()
    a.build, a.out = os.path.abspath(a.build), os.path.abspath(a.out)
    if not a.layers:
        a.layers = 48 if a.backend == "cuda" else 1
    return Fleet(a).run()


if __name__ == "__main__":
    sys.exit(main())
