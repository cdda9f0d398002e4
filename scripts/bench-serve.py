#!/usr/bin/env python3
"""bench-serve.py: serving throughput of one engine with N concurrent sequences.

  bench-serve.py --build DIR --arena A.arena [--backend cuda|host]
                 [--seqs 16] [--prompt 128] [--gen 128] [--seed 1]
                 [--host-device-mib N] [--json OUT] [--log FILE]

Starts baton-engine on the arena (no broker; --http on a free loopback
port, --max-seqs SEQS, a KV pool that holds every sequence), sends one
short warm-up completion, then SEQS clients at once, each one
/v1/completions request of PROMPT random token ids and max_tokens GEN,
greedy, with the end-of-sequence tokens biased out (logit_bias -100) so
every sequence generates GEN tokens, as llama-batched-bench's do. The
scheduler's continuous batching decodes them together. Figures (llama-
batched-bench's, over the wall time from the first request sent to the
last answer): total tokens/s ((prompt + generated) / time, its "S t/s"),
generated tokens/s, the median and slowest request time, and the tokens
each request really generated (from usage). Prints them; --json writes
them.
"""
import argparse
import http.client
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time


def post(host, port, body, timeout=600):
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, data[:300]))
    return json.loads(data)


def health(host, port):
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/health")
    j = json.loads(c.getresponse().read())
    c.close()
    return j["steps"], j["prefix_cache"]["read_tokens"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--arena", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--host-device-mib", type=int, default=0)
    ap.add_argument("--step-tokens", type=int, default=0, help="baton-engine --step-tokens (default: its own)")
    ap.add_argument("--json")
    ap.add_argument("--log", help="the engine's stderr goes here (default: a temporary file)")
    a = ap.parse_args()

    info = json.loads(subprocess.run([os.path.join(a.build, "bin", "baton-arena"), "info", "--json",
                                      a.arena], check=True, capture_output=True, text=True).stdout)
    cfg = info["config"]
    vocab = cfg["vocab_size"]
    eos = [t for t in (cfg.get("eos_token_id"), cfg.get("bos_token_id")) if isinstance(t, int)]
    per_seq = a.prompt + a.gen
    ctx = (per_seq + 15) // 16 * 16 + 16
    d = tempfile.mkdtemp(prefix="bench-serve-")
    log = open(a.log or os.path.join(d, "engine.log"), "w")
    cmd = [os.path.join(a.build, "bin", "baton-engine"), "--name", "bench",
           "--shared-expert-arena", a.arena, "--listen", "ipc://%s/e.sock" % d,
           "--backend", a.backend, "--ctx", str(ctx), "--kv-blocks", str(a.seqs * ctx // 16 + 16),
           "--max-seqs", str(a.seqs), "--max-queue", str(a.seqs + 4),
           "--served-model-name", "bench", "--http", "127.0.0.1:0"]
    if a.step_tokens:
        cmd += ["--step-tokens", str(a.step_tokens)]
    if a.host_device_mib:
        cmd += ["--host-device-mib", str(a.host_device_mib)]
    env = dict(os.environ)
    if a.backend == "host":
        env.setdefault("BATON_HOSTDEV_DIR", d)
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        url = None
        for _ in range(4):
            line = p.stdout.readline()
            if not line:
                break
            if line.startswith("http: "):
                url = line.split()[1]
                break
        if not url:
            p.wait(10)
            log.flush()
            sys.exit("bench-serve: the engine did not start (exit %s): %s" % (
                p.returncode, open(log.name).read()[-2000:]))
        start_s = time.time() - t0
        hostport = url.split("//", 1)[1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        port = int(port)
        rng = random.Random(a.seed)
        bias = {str(t): -100 for t in eos}

        def body(n_prompt, n_gen):
            return {"model": "bench", "prompt": [rng.randrange(0, vocab) for _ in range(n_prompt)],
                    "max_tokens": n_gen, "temperature": 0, "logit_bias": bias}

        post(host, port, body(16, 4))  # warm-up: first-use costs out of the timing
        bodies = [body(a.prompt, a.gen) for _ in range(a.seqs)]
        res = [None] * a.seqs
        errs = []

        def client(i):
            t = time.time()
            try:
                r = post(host, port, bodies[i])
                res[i] = (time.time() - t, r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"],
                          r["choices"][0]["finish_reason"])
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append("request %d: %s" % (i, e))

        # The phases, from the engine's /health polled meanwhile: when every
        # prompt has been read (its read_tokens), and the steps before and
        # after that moment (so the decode's time a step).
        steps0, read0 = health(host, port)
        phase = {}
        done = threading.Event()

        def poll():
            while not done.is_set():
                st, rd = health(host, port)
                if "read_s" not in phase and rd - read0 >= a.seqs * a.prompt:
                    phase["read_s"], phase["read_steps"] = time.time() - t1, st - steps0
                done.wait(0.005)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.seqs)]
        t1 = time.time()
        poller = threading.Thread(target=poll)
        poller.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t1
        done.set()
        poller.join()
        steps = health(host, port)[0] - steps0
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()
    if errs:
        print(open(log.name).read()[-2000:], file=sys.stderr)
        sys.exit("bench-serve: %d requests failed: %s" % (len(errs), "; ".join(errs[:4])))
    shutil.rmtree(d, True)
    times = sorted(r[0] for r in res)
    prompt_tok = sum(r[1] for r in res)
    gen_tok = sum(r[2] for r in res)
    out = {"seqs": a.seqs, "prompt": a.prompt, "gen": a.gen, "backend": a.backend,
           "arena": os.path.basename(a.arena), "engine_start_s": round(start_s, 2),
           "wall_s": round(wall, 3), "prompt_tokens": prompt_tok, "generated_tokens": gen_tok,
           "total_tok_s": round((prompt_tok + gen_tok) / wall, 2),
           "generated_tok_s": round(gen_tok / wall, 2),
           "request_s_median": round(times[len(times) // 2], 3), "request_s_max": round(times[-1], 3),
           "finish_reasons": sorted(set(r[3] for r in res)), "steps": steps}
    if "read_s" in phase and steps > phase["read_steps"]:
        # the prompts' steps also decode the sequences that started first
        out["prompts_read_s"] = round(phase["read_s"], 3)
        out["steps_to_read_prompts"] = phase["read_steps"]
        out["ms_per_step_after"] = round(1e3 * (wall - phase["read_s"]) / (steps - phase["read_steps"]), 3)
    print("serving, %d sequences x (%d prompt + %d generated): %.1f tok/s total, %.1f generated tok/s, "
          "%.2f s wall (%d of %d tokens generated)" % (a.seqs, a.prompt, a.gen, out["total_tok_s"],
                                                       out["generated_tok_s"], wall, gen_tok,
                                                       a.seqs * a.gen))
    if "prompts_read_s" in out:
        print("  every prompt read after %.3f s (%d steps); then %.2f ms a step over %d steps" % (
            out["prompts_read_s"], out["steps_to_read_prompts"], out["ms_per_step_after"],
            steps - out["steps_to_read_prompts"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
