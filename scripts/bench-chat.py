#!/usr/bin/env python3
"""bench-chat.py: multi-turn chats against a server with a prefix cache
(issue 29's benchmark); scripts/bench-chat.sh runs its modes in one run.

  bench-chat.py chat   --build DIR --arena A.arena [--backend cuda|host]
                       [--engine-flag F ...] [workload] --json OUT
  bench-chat.py llama  --server DIR/llama-server --gguf G [workload] --json OUT
  bench-chat.py switch --build DIR --arena A.arena [--backend ...]
                       [--engine-flag F ...] [workload] --json OUT

The workload (--clients N, --turns T, --first F, --grow G, --gen K,
--seed S): N clients at once, each a conversation of T turns. Turn 0's
prompt is F random token ids; each later turn's prompt is the previous
one, K ids that stand in for the answer and G - K new ids (the next
user message), so the last prompt is F + (T - 1) G tokens (8 turns of
F 500, G 500: 4,000). Every request is a streamed /v1/completions of the
prompt as token ids, max_tokens K, greedy, the end-of-sequence ids
biased out (every answer is K tokens), and gguf-synth.py's lone high bytes
(ids 128..255) too, so every answer is valid UTF-8 (llama-server fails a
stream that is not). The answer's own ids are not fed
back (the text of a random model does not tokenize back to its ids):
its KV, made by decode, is not what the next turn reuses, only the
prompts are, on every server alike. The same seed gives the same
conversations in every mode.

Per turn: the time to first token (the first streamed event with a
choice, from the request's send), its median and max over the clients,
the prompt tokens and the cached tokens the server reports
(usage.prompt_tokens_details.cached_tokens; llama-server's timings'
cache_n where it gives them), and each answer's text and its streamed
pieces, one a token (to compare modes token for token); "gemm" is the
BATON_CUDA_GEMM the engines ran with (0: the exact kernels).

  chat    one baton-engine (no broker), --http, a KV pool that holds
          every conversation whole; --engine-flag --no-prefix-cache is
          the run without the cache
  llama   llama.cpp's llama-server on the same GGUF (-ngl 99, -np N, a
          context of N conversations, "cache_prompt": true)
  switch  a broker with its front door and two engines of the model (A
          and B: the arena hard-linked under a second name); the N clients
          are split between A and B and run turn by turn, A's then B's,
          and before each model's turn the other model is released with
          --all (its dense weights and KV pool leave the device: another
          model's burst), so each turn comes back after a switch, its
          KV restored from host memory (default) or read again
          (--engine-flag --kv-host-mib --engine-flag 0)
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


class Server:
    def __init__(self, a):
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="bench-chat-")
        self.procs = []
        self.env = dict(os.environ)
        if getattr(a, "backend", "cuda") == "host":
            self.env.setdefault("BATON_HOSTDEV_DIR", self.dir)

    def bin(self, name):
        return os.path.join(self.a.build, "bin", name)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs = []

    def logs(self):
        out = ""
        for n in sorted(os.listdir(self.dir)):
            if n.endswith(".log"):
                out += "--- %s\n%s\n" % (n, open(os.path.join(self.dir, n), errors="replace").read()[-3000:])
        return out

    def engine(self, name, arena, broker=None):
        a = self.a
        ctx = a.first + (a.turns - 1) * a.grow + a.gen + 16
        ctx = (ctx + 15) // 16 * 16
        per = ctx // 16 + 1
        args = [self.bin("baton-engine"), "--name", name, "--shared-expert-arena", arena,
                "--listen", "ipc://%s/%s.sock" % (self.dir, name), "--backend", a.backend,
                "--http", "127.0.0.1:0", "--ctx", str(ctx), "--kv-blocks", str(a.clients * per + 16),
                "--max-seqs", str(max(a.clients, 1)), "--max-queue", str(a.clients + 8)]
        args += list(a.engine_flag)
        if a.backend == "host":
            args += ["--host-device-mib", str(a.device_mib)]
        if broker:
            args += ["--broker", broker, "--expert-cache-release"]
        log = open(os.path.join(self.dir, name + ".log"), "a")
        t0 = time.time()
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, env=self.env, text=True)
        self.procs.append(p)
        url = None
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError("engine %s did not start:\n%s" % (name, self.logs()))
            if line.startswith("http: "):
                url = line.split()[1]
            if line.startswith("ready") or (url and not broker):
                break
        while url is None:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError("engine %s printed no http: line" % name)
            if line.startswith("http: "):
                url = line.split()[1]
        threading.Thread(target=lambda: p.stdout.read(), daemon=True).start()
        p.url, p.start_s = url, time.time() - t0
        return p

    def broker(self):
        cfg = os.path.join(self.dir, "broker.ini")
        with open(cfg, "w") as f:
            f.write("[broker]\ncontrol = ipc://%s/broker.sock\nevents = ipc://%s/events.sock\n"
                    "http = 127.0.0.1:0\nhttp_token = bench\ndoor_keep_alive_s = forever\n"
                    "command_timeout_ms = 120000\nacquire_wait_ms = 120000\n" % (self.dir, self.dir))
        p = subprocess.Popen([self.bin("baton-broker"), "--config", cfg], stdout=subprocess.PIPE,
                             stderr=open(os.path.join(self.dir, "broker.log"), "a"), env=self.env, text=True)
        self.procs.append(p)
        line = p.stdout.readline().split()
        if not line or line[0] != "ready" or len(line) != 4:
            raise RuntimeError("broker did not start: %r\n%s" % (line, self.logs()))
        return "ipc://%s/broker.sock" % self.dir, line[3]


def post_stream(url, body, token=None):
    """(ttft_s, text, usage, timings, pieces) of one streamed completion
    (pieces: the text of each streamed choice, a token's each)."""
    host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    hdr = {"Content-Type": "application/json"}
    if token:
        hdr["Authorization"] = "Bearer " + token
    t0 = time.time()
    c = http.client.HTTPConnection(host, int(port), timeout=1800)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers=hdr)
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:400]))
    ttft, text, usage, timings, pieces = None, "", None, None, []
    for raw in r:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data: {"):
            continue
        d = json.loads(line[6:])
        if d.get("error"):  # a server that gives up mid-stream says so in an event
            raise RuntimeError("stream error: %s" % json.dumps(d["error"])[:400])
        if d.get("usage"):
            usage = d["usage"]
        if d.get("timings"):
            timings = d["timings"]
        for ch in d.get("choices") or []:
            if ttft is None:
                ttft = time.time() - t0
            text += ch.get("text") or ""
            if ch.get("text") or not ch.get("finish_reason"):  # not the closing event alone
                pieces.append(ch.get("text") or "")
    c.close()
    return ttft, text, usage, timings, pieces


def conversation(a, k):
    """Client k's prompts, turn by turn (the same in every mode)."""
    rng = random.Random(a.seed * 1000003 + k)
    hist = [rng.randrange(a.lo, a.vocab) for _ in range(a.first)]
    out = []
    for _ in range(a.turns):
        out.append(list(hist))
        hist += [rng.randrange(a.lo, a.vocab) for _ in range(a.grow)]
    return out


# gguf-synth.py's lone high bytes (ids 128..255): every other token of its
# vocabulary is valid UTF-8, so answers without them are text, which
# llama-server's stream needs (it fails a completion whose bytes are not);
# both servers get the same bias, so the workload is the same
SINGLE_HIGH = range(0x80, 0x100)


def request(a, model, prompt, flavor):
    b = {"model": model, "prompt": prompt, "max_tokens": a.gen, "temperature": 0, "stream": True,
         "stream_options": {"include_usage": True},
         "logit_bias": {str(t): -100 for t in list(SINGLE_HIGH) + list(a.eos)}}
    if flavor == "llama":
        b.update({"cache_prompt": True, "ignore_eos": True})
    return b


def cached_of(usage, timings):
    if usage and isinstance(usage.get("prompt_tokens_details"), dict):
        return usage["prompt_tokens_details"].get("cached_tokens")
    if timings and "cache_n" in timings:
        return timings["cache_n"]
    return None


def run_clients(a, send, order=None):
    """send(k, turn, prompt) -> record; per client its turns in order. With
    order (a list of client groups), the groups take turns: every client of
    group 0 does turn t, then every client of group 1, ... then turn t + 1."""
    convs = [conversation(a, k) for k in range(a.clients)]
    recs = [[None] * a.turns for _ in range(a.clients)]
    errs = []

    def one(k, t):
        try:
            recs[k][t] = send(k, t, convs[k][t])
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append("client %d turn %d: %s" % (k, t, e))

    t0 = time.time()
    if order is None:
        def client(k):
            for t in range(a.turns):
                one(k, t)
        ts = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
        for x in ts:
            x.start()
        for x in ts:
            x.join()
    else:
        for t in range(a.turns):
            for gi, group in enumerate(order):
                if a.before_group:
                    a.before_group(gi, t)
                ts = [threading.Thread(target=one, args=(k, t)) for k in group]
                for x in ts:
                    x.start()
                for x in ts:
                    x.join()
    return recs, errs, time.time() - t0


def summary(a, recs, wall):
    turns = []
    for t in range(a.turns):
        rs = [recs[k][t] for k in range(a.clients) if recs[k][t]]
        tt = [r["ttft_s"] for r in rs if r["ttft_s"] is not None]
        cached = [r["cached"] for r in rs if r["cached"] is not None]
        turns.append({"turn": t, "prompt_tokens": rs[0]["prompt_tokens"] if rs else None,
                      "ttft_median_s": round(median(tt), 4) if tt else None,
                      "ttft_max_s": round(max(tt), 4) if tt else None,
                      "cached_tokens_median": median(cached) if cached else None})
    return {"clients": a.clients, "turns": a.turns, "first": a.first, "grow": a.grow, "gen": a.gen,
            "wall_s": round(wall, 2), "per_turn": turns,
            "texts": [[(recs[k][t] or {}).get("text") for t in range(a.turns)] for k in range(a.clients)],
            "pieces": [[(recs[k][t] or {}).get("pieces") for t in range(a.turns)] for k in range(a.clients)],
            "gemm": os.environ.get("BATON_CUDA_GEMM")}


def record(prompt, ttft, text, usage, timings, pieces):
    return {"ttft_s": ttft, "text": text, "pieces": pieces,
            "prompt_tokens": (usage or {}).get("prompt_tokens", len(prompt)), "cached": cached_of(usage, timings)}


def arena_info(a):
    info = json.loads(subprocess.run([os.path.join(a.build, "bin", "baton-arena"), "info", "--json", a.arena],
                                     check=True, capture_output=True, text=True).stdout)
    cfg = info["config"]
    a.vocab = min(cfg["vocab_size"], a.vocab or cfg["vocab_size"])
    a.eos = [t for t in (cfg.get("eos_token_id"), cfg.get("bos_token_id")) if isinstance(t, int)]


def mode_chat(a):
    arena_info(a)
    s = Server(a)
    try:
        e = s.engine("chat", a.arena)
        model = os.path.basename(a.arena)[:-6] if a.arena.endswith(".arena") else os.path.basename(a.arena)
        post_stream(e.url, request(a, model, list(range(a.lo, a.lo + 16)), "baton"))  # warm-up

        def send(k, t, prompt):
            return record(prompt, *post_stream(e.url, request(a, model, prompt, "baton")))
        recs, errs, wall = run_clients(a, send)
        health = None
        try:
            host, port = e.url.split("//", 1)[1].rsplit(":", 1)
            c = http.client.HTTPConnection(host, int(port), timeout=30)
            c.request("GET", "/health")
            health = json.loads(c.getresponse().read())
        except Exception:  # noqa: BLE001 - the figures stand without it
            pass
    finally:
        s.stop()
    if errs:
        sys.exit("bench-chat: %s\n%s" % ("; ".join(errs[:4]), s.logs()))
    out = summary(a, recs, wall)
    out["engine_flags"] = a.engine_flag
    out["prefix_cache"] = (health or {}).get("prefix_cache")
    shutil.rmtree(s.dir, True)
    return out


def mode_llama(a):
    a.eos = []
    s = Server(a)
    port = a.port
    ctx = a.clients * (a.first + (a.turns - 1) * a.grow + a.gen + 64)
    log = open(os.path.join(s.dir, "llama-server.log"), "a")
    p = subprocess.Popen([a.server, "-m", a.gguf, "-ngl", "99", "-c", str(ctx), "-np", str(a.clients),
                          "--host", "127.0.0.1", "--port", str(port)] + list(a.server_flag),
                         stdout=log, stderr=log)
    s.procs.append(p)
    url = "http://127.0.0.1:%d" % port
    try:
        t0 = time.time()
        while True:
            if p.poll() is not None:
                raise RuntimeError("llama-server exited %s:\n%s" % (p.returncode, s.logs()))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() - t0 > 900:
                raise RuntimeError("llama-server not ready in 900 s")
            time.sleep(0.5)
        post_stream(url, request(a, "m", list(range(a.lo, a.lo + 16)), "llama"))

        def send(k, t, prompt):
            return record(prompt, *post_stream(url, request(a, "m", prompt, "llama")))
        recs, errs, wall = run_clients(a, send)
    finally:
        s.stop()
    if errs:
        sys.exit("bench-chat: %s\n%s" % ("; ".join(errs[:4]), s.logs()))
    shutil.rmtree(s.dir, True)
    return summary(a, recs, wall)


def mode_switch(a):
    arena_info(a)
    s = Server(a)
    b_arena = os.path.join(os.path.dirname(os.path.abspath(a.arena)), "bench-chat-b-%d.arena" % os.getpid())
    try:
        os.link(a.arena, b_arena)
    except OSError:
        shutil.copyfile(a.arena, b_arena)
    models = {"A": os.path.basename(a.arena)[:-6], "B": os.path.basename(b_arena)[:-6]}
    try:
        control, door = s.broker()
        engines = {"A": s.engine("A", a.arena, control), "B": s.engine("B", b_arena, control)}
        cli = s.bin("baton")

        def release_all(name):
            r = subprocess.run([cli, "--broker", control, "release", name, "--all", "--json"],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise RuntimeError("release %s --all: %s" % (name, r.stderr))
            return json.loads(r.stdout)

        for n in ("A", "B"):
            post_stream(door, request(a, models[n], list(range(a.lo, a.lo + 16)), "baton"), "bench")
        groups = [[k for k in range(a.clients) if k % 2 == 0], [k for k in range(a.clients) if k % 2 == 1]]
        names = ["A", "B"]
        releases = []

        def before(gi, t):
            other = names[1 - gi]
            t0 = time.time()
            release_all(other)  # the other model's KV pool and weights leave the device
            releases.append(time.time() - t0)
        a.before_group = before

        def send(k, t, prompt):
            n = names[k % 2]
            return record(prompt, *post_stream(door, request(a, models[n], prompt, "baton"), "bench"))
        recs, errs, wall = run_clients(a, send, order=groups)
        del engines
    finally:
        s.stop()
        try:
            os.unlink(b_arena)
        except OSError:
            pass
    if errs:
        sys.exit("bench-chat: %s\n%s" % ("; ".join(errs[:4]), s.logs()))
    out = summary(a, recs, wall)
    out["engine_flags"] = a.engine_flag
    out["release_all_s_median"] = round(median(releases), 4) if releases else None
    shutil.rmtree(s.dir, True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("chat", "llama", "switch"))
    ap.add_argument("--build")
    ap.add_argument("--arena")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--device-mib", type=int, default=8192)
    ap.add_argument("--engine-flag", action="append", default=[])
    ap.add_argument("--server", help="llama-server")
    ap.add_argument("--server-flag", action="append", default=[])
    ap.add_argument("--gguf")
    ap.add_argument("--port", type=int, default=18431)
    ap.add_argument("--vocab", type=int, default=0, help="ids below this (llama: required)")
    ap.add_argument("--lo", type=int, default=300, help="ids from this one (past bytes and pairs)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--first", type=int, default=500)
    ap.add_argument("--grow", type=int, default=500)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    a.before_group = None
    if a.grow < a.gen:
        sys.exit("bench-chat: --grow must be at least --gen")
    if a.mode == "llama":
        if not (a.server and a.gguf and a.vocab):
            sys.exit("bench-chat llama: --server, --gguf and --vocab are required")
        out = mode_llama(a)
    else:
        if not (a.build and a.arena):
            sys.exit("bench-chat %s: --build and --arena are required" % a.mode)
        out = mode_chat(a) if a.mode == "chat" else mode_switch(a)
    out["mode"] = a.mode
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    for r in out["per_turn"]:
        print("  %s turn %d: prompt %s, ttft median %s s, max %s s, cached %s" % (
            a.mode, r["turn"], r["prompt_tokens"], r["ttft_median_s"], r["ttft_max_s"], r["cached_tokens_median"]))


if __name__ == "__main__":
    main()
