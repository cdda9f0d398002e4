#!/usr/bin/python3
"""bench-kv.py: issue 28's KV case, measured on one engine (the host
backend by default): does one client's long chat keep the others from
the KV pool?

  bench-kv.py --build DIR [--out DIR] [--backend host|cuda] [--device-mib N]
              [--ctx N] [--model kjv-qwen3-moe] [--seed N]

Two pools, each a fresh engine (no broker, OpenAI HTTP on loopback):

  one-context  --kv-blocks ctx/16: the old default, one context
  default      no --kv-blocks: sized from the device (engine/model/kv_size.c)

and three scenes on each:

  four         four chats without max_tokens at once (each may run to the
               end of its context): wall time, the most running at once,
               the fewest free blocks seen, preemptions
  behind-1     one such chat, then (once it decodes) a request with
               max_tokens 5: that request's latency
  behind-6     the same behind six

Prints a table; --out DIR writes DIR/bench-kv.json with every figure.
"""
import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["Tell of the generations of Adam.", "Who was Noah?", "What did Moses see on the mountain?",
           "Tell of the flood.", "Who were the sons of Jacob?", "Tell of the kings of Israel.",
           "What did the prophet say?"]


NO_EOS = {}


def post(port, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return r.status, json.loads(data) if data else None
    finally:
        c.close()


def health(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/health")
        return json.loads(c.getresponse().read())
    finally:
        c.close()


class Engine:
    def __init__(self, a, arena, work, kv_blocks):
        self.log = os.path.join(work, "engine-%s.log" % ("one" if kv_blocks else "default"))
        args = [os.path.join(a.build, "bin", "baton-engine"), "--name", "kv", "--shared-expert-arena", arena,
                "--listen", "ipc://%s/kv.sock" % work, "--backend", a.backend, "--ctx", str(a.ctx),
                "--http", "127.0.0.1:0"]
        if a.backend == "host":
            args += ["--host-device-mib", str(a.device_mib)]
        if kv_blocks:
            args += ["--kv-blocks", str(kv_blocks)]
        env = dict(os.environ, BATON_HOSTDEV_DIR=work)
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=open(self.log, "w"), env=env, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            self.p.kill()
            raise SystemExit("the engine did not start: %s" % open(self.log).read())
        text = open(self.log).read()
        self.port = int(re.search(r"OpenAI API on http://127\.0\.0\.1:(\d+)", text).group(1))
        self.pool = re.search(r"KV pool (\d+) blocks of 16 positions \(([\d.]+) MiB", text)
        self.blocks, self.mib = int(self.pool.group(1)), float(self.pool.group(2))

    def close(self):
        self.p.terminate()
        self.p.wait(30)


def long_chat(port, i, seed, out):
    t0 = time.monotonic()
    # no max_tokens, and the end-of-sequence tokens barred: each answer runs
    # to the end of its context, the client the issue describes
    st, r = post(port, {"model": "kv", "seed": seed + i, "temperature": 1.0, "logit_bias": NO_EOS,
                        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]})
    out[i] = (st, r["usage"]["completion_tokens"] if st == 200 else None, time.monotonic() - t0)


def watch(port, stop, seen):
    while not stop.is_set():
        try:
            hb = health(port)
        except OSError:
            break
        seen["running"] = max(seen.get("running", 0), hb["running"])
        seen["free_min"] = min(seen.get("free_min", hb["kv_blocks_total"]), hb["kv_blocks_free"])
        seen["waiting_max"] = max(seen.get("waiting_max", 0), hb["waiting"])
        time.sleep(0.02)


def scene_four(e, a):
    pre = health(e.port)["preempted"]
    out, seen, stop = {}, {}, threading.Event()
    w = threading.Thread(target=watch, args=(e.port, stop, seen))
    w.start()
    t0 = time.monotonic()
    ts = [threading.Thread(target=long_chat, args=(e.port, i, a.seed, out)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.monotonic() - t0
    stop.set()
    w.join()
    return {"wall_s": round(wall, 3), "max_running": seen.get("running"), "free_min": seen.get("free_min"),
            "waiting_max": seen.get("waiting_max"), "preempted": health(e.port)["preempted"] - pre,
            "tokens": [out[i][1] for i in range(4)], "status": [out[i][0] for i in range(4)]}


def scene_behind(e, a, n):
    pre = health(e.port)["preempted"]
    out = {}
    ts = [threading.Thread(target=long_chat, args=(e.port, i, a.seed, out)) for i in range(n)]
    for t in ts:
        t.start()
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:  # the long ones decode
        hb = health(e.port)
        if hb["running"] + hb["waiting"] >= n and hb["steps"] > 0:
            break
        time.sleep(0.01)
    time.sleep(0.2)
    t0 = time.monotonic()
    st, r = post(e.port, {"model": "kv", "max_tokens": 5, "temperature": 0,
                          "messages": [{"role": "user", "content": "Amen."}]})
    short = time.monotonic() - t0
    busy = sum(1 for t in ts if t.is_alive())
    for t in ts:
        t.join()
    return {"short_s": round(short, 3), "short_status": st, "long_still_running": busy,
            "preempted": health(e.port)["preempted"] - pre, "long_tokens": [out[i][1] for i in range(n)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out")
    ap.add_argument("--backend", default="host")
    ap.add_argument("--device-mib", type=int, default=4096)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--model", default="kjv-qwen3-moe")
    ap.add_argument("--seed", type=int, default=28)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-kv-")
    gc = json.load(open(os.path.join(ROOT, "models", a.model, "generation_config.json")))
    eos = gc.get("eos_token_id", [])
    for t in eos if isinstance(eos, list) else [eos]:
        NO_EOS[str(t)] = -100
    arena = os.path.join(work, "kv.arena")
    subprocess.run([os.path.join(a.build, "bin", "baton-arena"), "create", "--safetensors",
                    os.path.join(ROOT, "models", a.model), arena], check=True, stdout=subprocess.DEVNULL)
    res = {"backend": a.backend, "device_mib": a.device_mib, "ctx": a.ctx, "model": a.model, "pools": {}}
    for name, kvb in (("one-context", a.ctx // 16), ("default", 0)):
        e = Engine(a, arena, work, kvb)
        try:
            r = {"blocks": e.blocks, "mib": e.mib, "contexts": round(e.blocks * 16 / a.ctx, 2)}
            r["four"] = scene_four(e, a)
            r["behind-1"] = scene_behind(e, a, 1)
            r["behind-6"] = scene_behind(e, a, 6)
            res["pools"][name] = r
        finally:
            e.close()
    print("%-12s %7s %8s | four: %7s %4s %5s %5s | behind-1 %7s | behind-6 %7s %5s" % (
        "pool", "blocks", "MiB", "wall s", "run", "free", "pre", "short s", "short s", "pre"))
    for name, r in res["pools"].items():
        f, b1, b6 = r["four"], r["behind-1"], r["behind-6"]
        print("%-12s %7d %8.1f | four: %7.2f %4s %5s %5s | behind-1 %7.3f | behind-6 %7.3f %5s" % (
            name, r["blocks"], r["mib"], f["wall_s"], f["max_running"], f["free_min"], f["preempted"],
            b1["short_s"], b6["short_s"], b6["preempted"]))
    shutil.rmtree(work, ignore_errors=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench-kv.json"), "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
