#!/usr/bin/python3
"""gpu-lend-proof.py: issue 27's two proofs on one device, in one run.

  gpu-lend-proof.py --build DIR --out DIR [--backend cuda|host] [--layers N]
                    [--keep-arena] [--python PY]

(1) lend: a Baton engine serves a Qwen3-30B-A3B-shaped q4_K model (about
16 GiB of experts on cuda) under a broker whose device budget
([gpu "*"] total_mib) holds the engine or a 30,000 MiB grant, not both.
`baton run --mib 30000 -- python3 THIS job` runs a job that allocates,
fills and checks 28 GiB with torch: the job finds the engine released when
it starts (it asks the broker itself), completes, and the engine is refilled
after it and answers the same greedy completion as before.

(2) park: a foreign PyTorch process (THIS holder) holds 24 GiB of known
contents and a compute state, registered as an external engine with
`release = park`. A request for the Baton engine's model (released first)
makes the broker park it: its device memory goes (nvidia-smi), the engine
refills and answers the same; then the engine is released, the broker
resumes the process by itself, its contents check out and it computes on
(the same results as before the park). Park and resume times and GB/s
against the host-to-device and device-to-host ceilings measured in the
same run (pinned torch copies), and the host memory the parked process
holds (its VmRSS, and the machine's MemAvailable).

While the job runs and while the process is parked, `baton status`,
`baton engines --json`, `baton top --once`, `/metrics` and the dashboard's
JSON (`/v1/status`) are written into OUT and checked for the lease, the
external engine and its parked state. OUT also gets the events
(events.jsonl), the logs, and summary.json.

--backend host is the dry run: a small model (--layers 1), the host device,
the stand-in CUDA driver of broker/jobs_test.py (BATON_TEST_PARK_DRIVER=fake:
a checkpoint stops the process, a restore continues it), and a job and a
holder without torch (bytearrays); no nvidia-smi checks. Every step prints
its time; the first failed check ends the run with "FAIL: why" and exit 1.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from gpu_proof import T0, fail, step, wait_for  # scripts/gpu_proof.py, beside this one
import gpu_proof as proof

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 1 << 20
GIB = 1 << 30
PROMPT = "In the beginning God created the heaven and the earth. And the"


# ---- the job and the holder: run as `THIS job ...` / `THIS holder ...` -----------------
#
# Known contents: element i of an int32 buffer is (i * 2654435761 + seed) mod 2^31,
# made and checked in pieces (a small temporary beside the big buffer).

PIECE = 8 << 20  # elements per piece (32 MiB of int32)


def torch_pattern(torch, start, n, seed, dev):
    i = torch.arange(start, start + n, dtype=torch.int64, device=dev)
    return ((i * 2654435761 + seed) & 0x7FFFFFFF).to(torch.int32)


def torch_fill(torch, buf, seed, dev):
    for s in range(0, buf.numel(), PIECE):
        n = min(PIECE, buf.numel() - s)
        buf[s:s + n] = torch_pattern(torch, s, n, seed, dev)


def torch_check(torch, buf, seed, dev):
    for s in range(0, buf.numel(), PIECE):
        n = min(PIECE, buf.numel() - s)
        if not torch.equal(buf[s:s + n], torch_pattern(torch, s, n, seed, dev)):
            return "element %d.. differs" % s
    return None


def host_pattern(nbytes, seed):
    unit = bytes((i * 131 + seed) & 0xFF for i in range(4096))
    return (unit * (nbytes // 4096 + 1))[:nbytes]


def copy_ceiling(torch, dev, nbytes=2 * GIB):
    """Best of 3 pinned copies each way, in GB/s (10^9 bytes)."""
    h = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    best = {"h2d": 0.0, "d2h": 0.0}
    for _ in range(4):
        for way in ("h2d", "d2h"):
            torch.cuda.synchronize()
            t = time.time()
            if way == "h2d":
                d.copy_(h, non_blocking=True)
            else:
                h.copy_(d, non_blocking=True)
            torch.cuda.synchronize()
            best[way] = max(best[way], nbytes / (time.time() - t) / 1e9)
    del h, d
    torch.cuda.empty_cache()
    return best


def main_job(a):
    """Run by `baton run`: checks that the engine gave way, then fills and
    checks a.gib GiB; waits for the go file (the driver reads the views)."""
    st = json.loads(subprocess.run([a.baton, "--json", "status"], capture_output=True, text=True,
                                   check=True).stdout)
    eng = [e for e in st["engines"] if e["name"] == a.engine]
    if not eng:
        print("job: the engine %s is not in the broker's list" % a.engine, flush=True)
        return 5
    e = eng[0]
    print("job: at start the engine %s is %s, %.1f MiB resident" % (a.engine, e["state"], e["resident"] / MIB),
          flush=True)
    if e["resident"] != 0 or e["state"] not in ("released",):
        print("job: FAIL: the engine did not give way before the job started", flush=True)
        return 6
    t = time.time()
    if a.fake:
        buf = bytearray(host_pattern(int(a.gib * GIB), 27))
        filled = time.time() - t
        bad = None if bytes(buf[:4096]) == host_pattern(4096, 27) and len(buf) == int(a.gib * GIB) else "differs"
    else:
        import torch
        dev = torch.device("cuda")
        free0, total = torch.cuda.mem_get_info()
        buf = torch.empty(int(a.gib * GIB) // 4, dtype=torch.int32, device=dev)
        torch_fill(torch, buf, 27, dev)
        torch.cuda.synchronize()
        filled = time.time() - t
        bad = torch_check(torch, buf, 27, dev)
        print("job: device free before %.1f GiB of %.1f GiB" % (free0 / GIB, total / GIB), flush=True)
    checked = time.time() - t - filled
    if bad:
        print("job: FAIL: contents: %s" % bad, flush=True)
        return 7
    print("job: ok: filled %.1f GiB in %.2f s, checked in %.2f s" % (a.gib, filled, checked), flush=True)
    end = time.time() + 60
    while not os.path.exists(a.go) and time.time() < end:
        time.sleep(0.05)
    del buf
    # the copy ceilings of this run, within the lease (its 28 GiB given
    # back first); here rather than in the holder, which is to hold no
    # pinned host memory when it is checkpointed
    ceil = {"h2d": 0.0, "d2h": 0.0}
    if not a.fake:
        torch.cuda.empty_cache()
        ceil = copy_ceiling(torch, dev)
    print("job: ceiling " + json.dumps(ceil), flush=True)
    return 0


def main_holder(a):
    """A foreign process with a.gib GiB of known contents and a compute
    state. Commands on stdin, one answer line each on stdout:
    check -> "ok ..." or "bad ..."; compute N -> "sum X"; quit."""
    out = {"pid": os.getpid()}
    if a.fake:
        n = int(a.gib * GIB)
        bufs = [bytearray(host_pattern(n, 5))]
        state = [1]

        def check():
            return None if bytes(bufs[0]) == host_pattern(n, 5) else "differs"

        def compute(k):
            x = state[0]
            for _ in range(k * 1000):
                x = (x * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
            return float(x % 1000003)
    else:
        import torch
        dev = torch.device("cuda")
        chunk = GIB // 4  # int32 elements per 1 GiB
        nch = int(round(a.gib))
        bufs = []
        for k in range(nch):
            b = torch.empty(chunk, dtype=torch.int32, device=dev)
            torch_fill(torch, b, 1000 + k, dev)
            bufs.append(b)
        g = torch.Generator(device=dev)
        g.manual_seed(27)
        x0 = torch.randn(2048, 2048, device=dev, generator=g)
        w = torch.randn(2048, 2048, device=dev, generator=g) / 45.0
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

        def check():
            for k, b in enumerate(bufs):
                why = torch_check(torch, b, 1000 + k, dev)
                if why:
                    return "chunk %d: %s" % (k, why)
            return None

        def compute(k):
            x = x0
            for _ in range(k):
                x = torch.tanh(x @ w)
            return float(x.double().sum().item())
    out["gib"] = a.gib
    out["sum10"] = compute(10)
    print("ready " + json.dumps(out), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "check":
            t = time.time()
            why = check()
            print(("bad " + why) if why else "ok %.2f s" % (time.time() - t), flush=True)
        elif cmd[0] == "compute":
            t = time.time()
            s = compute(int(cmd[1]))
            print("sum %r %.3f s" % (s, time.time() - t), flush=True)
        elif cmd[0] == "quit":
            break
    return 0


# ---- the driver --------------------------------------------------------------------------

class Proof:
    def __init__(self, a):
        self.a = a
        self.cuda = a.backend == "cuda"
        self.seg_mib = 256 if self.cuda else 16
        self.dir = tempfile.mkdtemp(prefix="lend-proof-", dir="/tmp")
        self.out = a.out
        os.makedirs(self.out, exist_ok=True)
        self.procs = []
        self.env = dict(os.environ, BATON_HOSTDEV_DIR=self.dir)
        self.env.pop("BATON_BROKER", None)
        if not self.cuda:
            self.env["BATON_TEST_PARK_DRIVER"] = "fake"
        self.control = "ipc://%s/broker.sock" % self.dir
        self.env["BATON_BROKER"] = self.control
        self.summary = {"backend": a.backend}
        self.events = []
        self.watch = None

    def bin(self, name):
        return proof.program(self.a.build, name)

    # -- processes
    def spawn(self, args, log, **kw):
        p = subprocess.Popen(args, stderr=open(os.path.join(self.dir, log), "a"), env=self.env, **kw)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()

    def baton(self, *args, timeout=60, check=True):
        r = subprocess.run([self.bin("baton")] + list(args), capture_output=True, text=True, env=self.env,
                           timeout=timeout)
        if check and r.returncode != 0:
            fail("baton %s exited %d: %s" % (" ".join(args), r.returncode, r.stderr.strip() or r.stdout.strip()))
        return r

    def engines(self):
        return {e["name"]: e for e in json.loads(self.baton("--json", "status").stdout)["engines"]}

    def eng(self, name):
        return self.engines().get(name)

    def http(self, method, path, body=None, timeout=300):
        return proof.request(self.door, self.token, method, path, body, timeout)

    # -- device
    def smi(self, query):
        return proof.smi(query) if self.cuda else None

    def dev_used_mib(self):
        rows = self.smi("gpu=memory.used")
        return int(rows[0][0]) if rows else None

    def proc_mib(self, pid):
        """What nvidia-smi lists for pid (MiB): 0 when it lists other
        processes but not this one; None on the host backend, or when it
        lists none at all (a container without the host's pid namespace)."""
        rows = self.smi("compute-apps=pid,used_memory")
        if not rows:
            return None
        for r in rows:
            if r[0] == str(pid):
                return int(r[1])
        return 0

    # -- steps
    def make_arena(self):
        a = self.a
        self.arena = os.path.join(a.shm, "lend-proof.arena")
        if a.keep_arena and os.path.exists(self.arena):
            step("arena: reusing %s" % self.arena)
        else:
            step("arena: creating %s (qwen3-30b-a3b shape, %d layers, q4_K)" % (self.arena, a.layers))
            t = time.time()
            r = subprocess.run([self.bin("baton-arena"), "create", "--synthetic-arch", "qwen3_moe", "--preset",
                                "qwen3-30b-a3b", "--layers", str(a.layers), "--dtype", "q4_K", "--seed", "27",
                                "--tokenizer", os.path.join(ROOT, "models", "kjv-qwen3-moe"), "--force",
                                self.arena], capture_output=True, text=True, env=self.env)
            if r.returncode != 0:
                fail("baton-arena create failed (%d): %s" % (r.returncode, r.stderr.strip()[-800:]))
            self.summary["arena_create_s"] = time.time() - t
            step("arena: %s" % r.stdout.strip().splitlines()[-1])
        info = json.loads(subprocess.run([self.bin("baton-arena"), "info", "--json", self.arena],
                                         capture_output=True, text=True, check=True).stdout)
        # the cache maps whole segments of whole slots: what the engine holds when whole
        seg = self.seg_mib * MIB
        per_seg = seg // info["slot_bytes"]
        slots = info["layers"] * info["experts"]
        self.expert_bytes = (slots + per_seg - 1) // per_seg * seg
        self.summary["arena_bytes"] = info["size"]
        self.summary["expert_bytes"] = self.expert_bytes

    def plan(self):
        """The budget: E (the engine's experts) + the lease > cap, E + the
        holder > cap, each alone <= cap."""
        e_mib = self.expert_bytes / MIB
        if self.cuda:
            self.lease_mib, self.job_gib, self.hold_gib = 30000, 28.0, 24.0
        else:
            self.lease_mib = int(e_mib * 0.9) + 1
            self.job_gib = self.lease_mib * 0.5 / 1024
            self.hold_gib = self.lease_mib * 0.9 / 1024
        self.cap_mib = int(self.lease_mib + e_mib / 2)
        hold_mib = self.hold_gib * 1024 + (600 if self.cuda else 0)  # a CUDA context beside it
        if not (e_mib + self.lease_mib > self.cap_mib >= max(self.lease_mib, hold_mib) and
                e_mib + hold_mib > self.cap_mib):
            fail("no budget fits: experts %.0f MiB, lease %d MiB, holder %.0f MiB, cap %d MiB"
                 % (e_mib, self.lease_mib, hold_mib, self.cap_mib))
        self.summary.update(cap_mib=self.cap_mib, lease_mib=self.lease_mib, job_gib=self.job_gib,
                            holder_gib=self.hold_gib)
        step("budget: total_mib %d: the engine's experts %.0f MiB + the lease %d MiB do not fit, "
             "nor the experts + the holder's %.0f MiB" % (self.cap_mib, e_mib, self.lease_mib, hold_mib))

    def start_broker(self):
        self.token = "lend-proof-token"
        cfg = os.path.join(self.dir, "broker.ini")
        with open(cfg, "w") as f:
            f.write(proof.broker_ini(self.dir, self.token, self.cap_mib))
        p, self.door = proof.start_broker(self.bin("baton-broker"), cfg, os.path.join(self.dir, "broker.log"),
                                          self.env)
        self.procs.append(p)
        self.watch = subprocess.Popen([self.bin("baton"), "--events", "ipc://%s/events.sock" % self.dir, "--json",
                                       "watch"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      env=self.env)
        self.procs.append(self.watch)
        threading.Thread(target=self._read_events, daemon=True).start()
        step("broker: ready, HTTP at %s:%d" % self.door)

    def _read_events(self):
        with open(os.path.join(self.out, "events.jsonl"), "w") as f:
            for line in self.watch.stdout:
                f.write(line)
                f.flush()
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    pass

    def ev(self, kind=None, engine=None):
        return [e for e in list(self.events) if (kind is None or e.get("kind") == kind) and
                (engine is None or e.get("engine") == engine)]

    def start_engine(self):
        self.model = "lend-proof"
        args = [self.bin("baton-engine"), "--name", "eng", "--shared-expert-arena", self.arena,
                "--listen", "ipc://%s/eng.sock" % self.dir, "--backend", self.a.backend, "--http", "127.0.0.1:0",
                "--expert-cache-release", "--broker", self.control, "--ctx", "1024", "--served-model-name",
                self.model, "--vram-segment-mib", str(self.seg_mib)]
        if not self.cuda:
            args += ["--host-device-mib", str(int(self.expert_bytes / MIB) + 1024)]
        t = time.time()
        p = self.spawn(args, "eng.log", stdout=subprocess.PIPE, text=True)
        box = {}

        def read():
            for line in p.stdout:
                if line.startswith("ready"):
                    box["ready"] = True
                if line.startswith("http: "):
                    box["http"] = line.split()[1]
        threading.Thread(target=read, daemon=True).start()
        wait_for("the engine's ready and http: lines (eng.log: see OUT)", lambda: p.poll() is None and
                 "ready" in box and "http" in box or (p.poll() is not None and fail(
                     "the engine exited %s: %s" % (p.returncode, self.tail("eng.log")))), timeout=120)
        self.summary["engine_start_s"] = time.time() - t
        step("engine: started in %.1f s, %s" % (self.summary["engine_start_s"], box["http"]))
        t = time.time()
        # registered cold; a refill of its own at start may be under way: wait for it to settle
        e = wait_for("the engine registered and settled", lambda: (lambda x: x if x and x["state"] in (
            "ready", "released", "partial") else None)(self.eng("eng")), timeout=120)
        if e["resident"] < self.expert_bytes:
            self.baton("refill", "eng", timeout=120)
        e = wait_for("the engine whole", lambda: (lambda x: x if x["state"] == "ready" and x["resident"] >=
                                                  self.expert_bytes else None)(self.eng("eng")), timeout=60)
        if e["resident"] != self.expert_bytes:
            fail("the engine holds %d bytes, not the %d the budget was made for" % (e["resident"], self.expert_bytes))
        self.full = e["resident"]
        self.summary["first_refill_s"] = time.time() - t
        step("engine: refilled %.0f MiB in %.2f s" % (self.full / MIB, time.time() - t))

    def complete(self):
        st, text = self.http("POST", "/v1/completions", {"model": self.model, "prompt": PROMPT,
                                                         "max_tokens": 24 if self.cuda else 6,
                                                         "temperature": 0})
        if st != 200:
            fail("the completion through the front door answered %d: %s" % (st, text[:400]))
        return json.loads(text)["choices"][0]["text"]

    def views(self, tag, want):
        """Writes the views into OUT/TAG-*; `want`: (view, text that must be in it)."""
        got = {}
        got["status"] = self.baton("status").stdout
        got["engines.json"] = self.baton("--json", "engines").stdout
        got["top"] = self.baton("top", "--once").stdout
        got["metrics"] = self.http("GET", "/metrics")[1]
        got["dashboard.json"] = json.dumps(json.loads(self.http("GET", "/v1/status")[1]), indent=1)
        for k, v in got.items():
            with open(os.path.join(self.out, "%s-%s" % (tag, k + ("" if "." in k else ".txt"))), "w") as f:
                f.write(v)
        for view, text in want:
            if text not in got[view]:
                fail("%s: the %s view lacks %r (written to %s/%s-%s*)" % (tag, view, text, self.out, tag, view))
        step("views (%s): status, top, /metrics, /v1/status show %s" % (tag, ", ".join(t for _, t in want[:3])))

    def log_lines(self, log, word, n=12):
        try:
            return "".join([x for x in open(os.path.join(self.dir, log)) if word in x][-n:])
        except OSError:
            return "(no %s)" % log

    def tail(self, log, n=2000):
        try:
            return open(os.path.join(self.dir, log)).read()[-n:]
        except OSError:
            return "(no %s)" % log

    # -- proof 1
    def proof_lend(self):
        step("proof 1: baton run --mib %d -- job (fills %.1f GiB)" % (self.lease_mib, self.job_gib))
        before = self.complete()
        step("engine: greedy answer before: %r" % before)
        go = os.path.join(self.dir, "go")
        job = [self.a.python, os.path.abspath(__file__), "job", "--baton", self.bin("baton"), "--engine", "eng",
               "--gib", str(self.job_gib), "--go", go] + (["--fake"] if not self.cuda else [])
        t = time.time()
        p = subprocess.Popen([self.bin("baton"), "run", "--mib", str(self.lease_mib), "--name", "job", "--wait",
                              "120s", "--"] + job, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=self.env)
        self.procs.append(p)
        self.job_lines = []
        reader = threading.Thread(target=lambda: self.job_lines.extend(iter(p.stdout.readline, "")), daemon=True)
        reader.start()
        lease = wait_for("the lease granted", lambda: (lambda x: x if x and x["state"] == "leased" else None)(
            self.eng("job")) or (p.poll() is not None and fail("baton run exited %d before its lease: %s"
                                                               % (p.returncode, p.stderr.read()))), timeout=120)
        granted_s = time.time() - t
        if lease["resident"] != self.lease_mib * MIB:
            fail("the lease holds %d bytes, not %d MiB" % (lease["resident"], self.lease_mib))
        e = self.eng("eng")
        if e["resident"] != 0:
            fail("the engine still holds %d bytes beside the lease" % e["resident"])
        wait_for("the job's fill (its output)", lambda: os.path.exists(go) or self._job_filled(p), timeout=120)
        self.views("job", [("status", "job"), ("status", "leased"), ("top", "job"),
                           ("metrics", 'baton_engine_kind{engine="job",kind="lease"} 1'),
                           ("dashboard.json", '"kind": "lease"')])
        open(go, "w").close()
        try:
            p.wait(120)
        except subprocess.TimeoutExpired:
            fail("the job did not end within 120 s of its go")
        reader.join(10)
        err = p.stderr.read()
        out = "".join(self.job_lines)
        with open(os.path.join(self.out, "job.txt"), "w") as f:
            f.write(out + "\n--- stderr\n" + err)
        if p.returncode != 0:
            fail("baton run: the job exited %d:\n%s%s" % (p.returncode, out, err))
        if "gave way: eng (" not in err:
            fail("baton run did not say the engine gave way: %s" % err)
        if "job: ok:" not in out or "is released, 0.0 MiB resident" not in out:
            fail("the job did not see the engine released, or did not check out:\n%s" % out)
        job_s = time.time() - t
        step("job: %s" % " / ".join(x for x in out.splitlines() if x.startswith("job: ")))
        ceil = [x for x in out.splitlines() if x.startswith("job: ceiling ")]
        if not ceil:
            fail("the job printed no copy ceilings:\n%s" % out)
        self.ceiling = json.loads(ceil[0][len("job: ceiling "):])
        t = time.time()
        e = wait_for("the engine refilled after the job", lambda: (lambda x: x if x["state"] == "ready" and
                     x["resident"] == self.full else None)(self.eng("eng")), timeout=60)
        refill_s = time.time() - t
        rel = [x for x in self.ev("release", "eng")]
        after = self.complete()
        step("engine: refilled %.2f s after the job's end; greedy answer after: %r" % (refill_s, after))
        if after != before:
            fail("the engine answers differently after the job: %r, before %r" % (after, before))
        over = self.ev("lease-over", "job")
        self.summary["lend"] = {"granted_s": granted_s, "job_s": job_s, "refill_after_s": refill_s,
                                "same_answer": True, "answer": after, "lease_over": bool(over),
                                "engine_releases": len(rel), "engine_resident": e["resident"]}
        step("proof 1: PASSED (lease granted in %.2f s, the job ran %.1f s%s)" % (
            granted_s, job_s, "; over its grant: %s" % over[0].get("reason") if over else ""))

    def _job_filled(self, p):
        """Whether the job said it filled and checked its memory (its
        stdout is read by a thread into self.job_lines)."""
        for line in list(self.job_lines):
            if "job: FAIL" in line:
                fail(line.strip())
            if "job: ok:" in line:
                return True
        if p.poll() is not None:
            time.sleep(0.2)
            fail("the job ended early (%s): %s%s" % (p.returncode, "".join(self.job_lines), p.stderr.read()))
        return False

    # -- proof 2
    def holder_cmd(self, cmd, timeout=120):
        self.holder.stdin.write(cmd + "\n")
        self.holder.stdin.flush()
        box = {}
        t = threading.Thread(target=lambda: box.update(line=self.holder.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if "line" not in box:
            fail("the holder did not answer %r within %d s" % (cmd, timeout))
        if not box["line"]:
            fail("the holder exited (%s) on %r: %s" % (self.holder.poll(), cmd, self.tail("holder.log")))
        return box["line"].strip()

    def proof_park(self):
        step("proof 2: a foreign process of %.2f GiB, parked for the engine, resumed after" % self.hold_gib)
        before = self.complete()
        self.baton("release", "eng")
        wait_for("the engine released", lambda: self.eng("eng")["resident"] == 0, timeout=30)
        t = time.time()
        self.holder = self.spawn([self.a.python, os.path.abspath(__file__), "holder", "--gib", str(self.hold_gib)] +
                                 (["--fake"] if not self.cuda else []), "holder.log", stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline()
        if not line.startswith("ready "):
            fail("the holder did not start (%s): %s" % (self.holder.poll(), self.tail("holder.log")))
        info = json.loads(line[6:])
        pid = info["pid"]
        ceil = self.ceiling
        step("holder: pid %d holds %.2f GiB (made in %.1f s); the copy ceilings (measured by the job): "
             "host-to-device %.1f GB/s, device-to-host %.1f GB/s" % (pid, self.hold_gib, time.time() - t, ceil["h2d"],
                                                                    ceil["d2h"]))
        smi_before = self.proc_mib(pid)
        used_before = self.dev_used_mib()
        if self.cuda and smi_before is not None and smi_before < self.hold_gib * 1024:
            step("nvidia-smi lists the holder (pid %d) with %d MiB: not this pid namespace's? Only the device's "
                 "used memory is checked below" % (pid, smi_before))
            smi_before = None
        r = self.baton("external", "add", "holder", "--pid", str(pid), "--mib", str(int(self.hold_gib * 1024)),
                       "--release", "park", "--hook-timeout", "120s")
        x = wait_for("the holder registered", lambda: (lambda y: y if y and y["state"] == "ready" else None)(
            self.eng("holder")), timeout=20)
        step("holder: registered as an external engine (%s); the broker counts %.0f MiB"
             % (r.stdout.strip(), x["resident"] / MIB))
        rss0, avail0 = self.rss(pid), self.mem_available()
        # a request for the engine's model: the engine needs the holder's memory
        t = time.time()
        answer = self.complete()
        serve_s = time.time() - t
        x = self.eng("holder")
        if x["state"] != "parked" or x["resident"] != 0:
            fail("the holder is %s with %d bytes after the engine's refill, not parked; the broker's log says:\n%s"
                 % (x["state"], x["resident"], self.log_lines("broker.log", "holder")))
        if answer != before:
            fail("the engine answers differently after the park: %r, before %r" % (answer, before))
        smi_parked = self.proc_mib(pid)
        used_parked = self.dev_used_mib()
        rss1, avail1 = self.rss(pid), self.mem_available()
        park, park_bytes = self._move_ms("holder", "park")
        step("holder: parked in %.2f s; the engine refilled and answered the same in %.2f s (request to answer)"
             % (park / 1e3, serve_s))
        if self.cuda:
            if smi_before is not None and smi_parked not in (None, 0):
                fail("nvidia-smi still lists the parked holder with %d MiB" % smi_parked)
            drop = used_before - used_parked + self.full / MIB  # the engine's refill took some of it back
            if drop < self.hold_gib * 1024 * 0.9:
                fail("the device's used memory fell by %.0f MiB only (%d -> %d MiB, the engine's %.0f MiB in)"
                     % (drop, used_before, used_parked, self.full / MIB))
            step("nvidia-smi: the holder %s MiB before, %s after; device used %d -> %d MiB (the engine's %.0f MiB "
                 "refilled in between)" % (smi_before, smi_parked, used_before, used_parked, self.full / MIB))
        self.views("parked", [("status", "holder"), ("status", "parked"), ("top", "parked"),
                              ("metrics", 'baton_external_parked{engine="holder"} 1'),
                              ("metrics", 'baton_engine_kind{engine="holder",kind="external"} 1'),
                              ("dashboard.json", '"parked": true')])
        # the engine gives its memory back: the holder comes back by itself
        t = time.time()
        self.baton("release", "eng")
        wait_for("the holder resumed", lambda: self.eng("holder")["state"] == "ready", timeout=120)
        back_s = time.time() - t
        resume, resume_bytes = self._move_ms("holder", "resume")
        smi_back = self.proc_mib(pid)
        rss2 = self.rss(pid)
        chk = self.holder_cmd("check")
        if not chk.startswith("ok"):
            fail("the holder's contents after the resume: %s" % chk)
        s = self.holder_cmd("compute 10")
        if abs(float(s.split()[1]) - info["sum10"]) > 1e-9 * max(1.0, abs(info["sum10"])):
            fail("the holder computes %s after the resume, %r before" % (s, info["sum10"]))
        s2 = self.holder_cmd("compute 200")
        step("holder: resumed in %.2f s (%.2f s after the engine's release); contents check out (%s); "
             "computes the same (%s) and on (200 steps: %s)" % (resume / 1e3, back_s, chk, s.split()[1],
                                                               s2.split()[2] + " s"))
        if self.cuda and smi_before is not None and smi_back is not None and smi_back < self.hold_gib * 1024:
            fail("nvidia-smi lists the resumed holder with %s MiB" % smi_back)
        # the bytes moved: what the broker counted the process at when it
        # parked it (NVML's figure: its tensors and its context)
        nbytes = park_bytes or self.hold_gib * GIB
        p = {"park_s": park / 1e3, "resume_s": resume / 1e3, "parked_bytes": nbytes,
             "resume_event_bytes": resume_bytes,
             "park_gbps": nbytes / (park / 1e3) / 1e9 if park else None,
             "resume_gbps": nbytes / (resume / 1e3) / 1e9 if resume else None,
             "h2d_ceiling_gbps": ceil["h2d"], "d2h_ceiling_gbps": ceil["d2h"],
             "holder_gib": self.hold_gib, "smi_mib": [smi_before, smi_parked, smi_back],
             "device_used_mib": [used_before, used_parked],
             "holder_rss_mib": [rss0, rss1, rss2], "mem_available_mib": [avail0, avail1],
             "serve_after_park_s": serve_s}
        self.summary["park"] = p
        step("park of %.2f GiB: %.2f s = %.1f GB/s (device-to-host ceiling %.1f); resume %.2f s = %.1f GB/s "
             "(host-to-device ceiling %.1f)" % (nbytes / GIB, p["park_s"], p["park_gbps"] or 0, ceil["d2h"],
                                                p["resume_s"], p["resume_gbps"] or 0, ceil["h2d"]))
        step("host memory of the parked process: VmRSS %s -> %s -> %s MiB (before, parked, resumed); "
             "MemAvailable %s -> %s MiB" % (rss0, rss1, rss2, avail0, avail1))
        self.holder_cmd("compute 1")
        self.holder.stdin.write("quit\n")
        self.holder.stdin.flush()
        self.holder.wait(30)
        step("proof 2: PASSED")

    def _move_ms(self, engine, word):
        """The ms of the engine's last park (a release event whose state is
        parked) or resume (the refill event after it), from its events."""
        def find():
            evs = self.ev(engine=engine)
            parks = [i for i, e in enumerate(evs) if e.get("kind") == "release" and e.get("state") == "parked"]
            if not parks:
                return None
            if word == "park":
                return evs[parks[-1]]
            back = [e for e in evs[parks[-1] + 1:] if e.get("kind") == "refill" and e.get("state") == "ready"]
            return back[0] if back else None
        e = wait_for("the %s event of %s (events.jsonl)" % (word, engine), find, timeout=10)
        return e["ms"], e.get("bytes", 0)

    def rss(self, pid):
        try:
            for line in open("/proc/%d/status" % pid):
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
        except OSError:
            return None
        return None

    def mem_available(self):
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
        return None

    def proofs(self):
        if self.cuda:
            rows = self.smi("gpu=name,driver_version,memory.total,memory.used")
            step("device: %s" % ", ".join(rows[0]))
        self.make_arena()
        self.plan()
        self.start_broker()
        self.start_engine()
        self.proof_lend()
        self.proof_park()
        self.summary["total_s"] = time.time() - T0
        step("both proofs PASSED in %.1f s%s" % (self.summary["total_s"], " (over the 300 s budget)"
                                                  if self.summary["total_s"] > 300 else ""))

    def cleanup(self):
        self.stop_all()
        proof.keep(self.dir, self.out, ("broker.log", "eng.log", "holder.log"), self.summary)
        if not self.a.keep_arena and getattr(self, "arena", None):
            for f in (self.arena, self.arena + ".lock"):  # the lock baton-arena leaves beside it
                try:
                    os.unlink(f)
                except OSError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self):
        return proof.run("gpu-lend-proof.py", self.summary, self.proofs, self.cleanup)


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("job", "holder"):
        ap = argparse.ArgumentParser()
        ap.add_argument("role")
        ap.add_argument("--gib", type=float, required=True)
        ap.add_argument("--fake", action="store_true")
        ap.add_argument("--baton")
        ap.add_argument("--engine")
        ap.add_argument("--go")
        a = ap.parse_args()
        return main_job(a) if a.role == "job" else main_holder(a)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--layers", type=int, default=0, help="of the preset's 48 (default 48 on cuda, 1 on host)")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--keep-arena", action="store_true", help="reuse OUT's arena if there, keep it after")
    ap.add_argument("--python", default=None, help="the job's and the holder's python (default: python3, "
                    "this one on host)")
    a = ap.parse_args()
    a.build, a.out = os.path.abspath(a.build), os.path.abspath(a.out)
    if not a.layers:
        a.layers = 48 if a.backend == "cuda" else 1
    if not a.python:
        a.python = shutil.which("python3") if a.backend == "cuda" else sys.executable
    return Proof(a).run()


if __name__ == "__main__":
    sys.exit(main())
