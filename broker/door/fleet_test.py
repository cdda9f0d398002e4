#!/usr/bin/python3
"""fleet_test.py: a fleet of models from one file (docs/guides/fleet.md), end
to end on the host backend with the two trained models of models/.

  - a bad [model] is refused at start with its line named, and nothing is
    started or written; --check prints each model's resolved source;
  - the broker starts from one file naming five models: qwen (a Hugging
    Face folder, with an alias), mixtral (hf:ORG/NAME in a local Hugging
    Face cache), tiny (an arena already made), broken (a folder that is no
    model: its arena cannot be made) and crashy (an engine that exits at
    once); /v1/models lists them all as stopped, and no engine runs;
  - interleaved requests from three clients through the door start each
    engine on its first request (queued meanwhile) and are all served;
    tiny (the same weights as qwen) answers as qwen does for a seed;
  - an arena_dir too small (a 2 MiB tmpfs in the broker's own mount
    namespace): the model fails with "not enough room", nothing is left
    there, no engine starts;
  - broken fails at once with baton-arena's reason, crashy after
    restart_max crashes with its last log lines: 503 model_failed, state
    failed in /v1/models and /metrics;
  - mixtral's engine killed with a stream and a whole request in flight:
    the stream ends with an error event and no chunked end, the whole one
    gets 503 with Retry-After; the engine is back by itself (starts 2,
    crashes 1) and the next request is served; the others' engines are
    untouched (same pids);
  - SIGHUP with tiny removed, mixtral-b added and crashy changed: tiny's
    engine stops and its name is 404, qwen's and mixtral's engines keep
    their pids, mixtral-b starts on demand, is stopped after stop_after_s
    idle (drop_arena: its arena deleted), starts again on the next request
    (the arena made again), crashy
    serves; a second SIGHUP changes crashy while its engine runs: that
    engine stops, the next request starts the new section's (its arena
    reused);
  - every count in /metrics and /v1/models is the one the test made.
The last line is "N passed, N failed".
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODELS = os.path.join(ROOT, "models")
QWEN_DIR = os.path.join(MODELS, "kjv-qwen3-moe")
MIXTRAL_DIR = os.path.join(MODELS, "kjv-mixtral")
FLAGS = "--host-device-mib 96 --vram-segment-mib 2"
T = 20 * h.SLOW  # the longest any condition is waited for


def hf_cache(c):
    """A Hugging Face cache as `huggingface-cli download baton/kjv-mixtral`
    leaves it: refs/main names a snapshot of links into blobs/."""
    base = os.path.join(c.dir, "hf", "hub", "models--baton--kjv-mixtral")
    snap = os.path.join(base, "snapshots", "0123abcd")
    os.makedirs(snap)
    os.makedirs(os.path.join(base, "refs"))
    os.makedirs(os.path.join(base, "blobs"))
    with open(os.path.join(base, "refs", "main"), "w") as f:
        f.write("0123abcd")
    for i, name in enumerate(sorted(os.listdir(MIXTRAL_DIR))):
        shutil.copy(os.path.join(MIXTRAL_DIR, name), os.path.join(base, "blobs", "b%02d" % i))
        os.symlink(os.path.join("..", "..", "blobs", "b%02d" % i), os.path.join(snap, name))
    return os.path.join(c.dir, "hf", "hub")


def not_a_model(c):
    d = os.path.join(c.dir, "not-a-model")
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write("{}")
    open(os.path.join(d, "model.safetensors"), "w").close()
    return d


def model(name, source, extra=""):
    return '[model "%s"]\nsource = %s\nbackend = host\nctx = 512\nengine_flags = %s\n%s' % (
        name, source, FLAGS, extra)


def fleet_text(c, tiny_arena, second=False, third=False):
    text = ("arena_dir = %s/arenas\nrestart_max = 3\nrestart_window_s = 60\ndoor_quantum_s = 0.2\n" % c.dir +
            model("qwen", QWEN_DIR, "aliases = bible-qwen\n") + model("mixtral", "hf:baton/kjv-mixtral"))
    if not second:
        text += model("tiny", tiny_arena)
    else:
        text += model("mixtral-b", MIXTRAL_DIR, "stop_after_s = 1\ndrop_arena = true\n")
    text += model("broken", not_a_model(c) if not second else os.path.join(c.dir, "not-a-model"))
    if not second:
        text += '[model "crashy"]\nsource = %s\nbackend = host\nengine_flags = %s --ctx 8\n' % (QWEN_DIR, FLAGS)
    else:
        text += model("crashy", QWEN_DIR, "max_seqs = 2\n" if third else "")
    return text


def chat(model_name, question, seed, max_tokens=16, stream=False, no_eos=False):
    """no_eos: the EOS (2 in the demo models) banned, so the answer runs
    max_tokens (theirs end in some 40 tokens, 50 ms)."""
    body = {"model": model_name, "messages": [{"role": "user", "content": question}], "seed": seed,
            "temperature": 0.8, "max_tokens": max_tokens, "stream": stream}
    if no_eos:
        body["logit_bias"] = {"2": -100}
    return body


def models(http):
    st, body, _ = http.get("/v1/models", token=False)
    assert st == 200, (st, body)
    return {m["id"]: m for m in body["data"]}


def metric(http, name, labels=""):
    st, text, _ = http.get("/metrics")
    assert st == 200, st
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def want_metric(http, name, labels, value):
    """Waits for a metric to read value: a request's outcome is counted
    just after its answer went out."""
    return h.wait_value("%s%s" % (name, labels), lambda: metric(http, name, labels), value, timeout=T)


def engine_procs(c):
    """pid -> name of the baton-engine processes whose arena is under this case."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            argv = open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"baton-engine") and any(c.dir.encode() in a for a in argv):
            out[int(pid)] = argv[argv.index(b"--name") + 1].decode()
    return out


def t_bad_model_refused(c):
    """A [model] whose source is not there: exit 2, its line named, nothing
    started, no arena folder made; --check shows a good file's sources."""
    path = os.path.join(c.dir, "bad.ini")
    with open(path, "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\nhttp = off\narena_dir = %s/arenas\n" %
                (c.control, c.events_url, c.dir) + model("qwen", QWEN_DIR) + model("gone", c.dir + "/nothing"))
    p = subprocess.run([h.BROKER, "--config", path], capture_output=True, text=True, env=c.env, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert '%s:12: [model "gone"] source = \'%s/nothing\'' % (path, c.dir) in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(c.dir, "arenas")) and not engine_procs(c)
    env = dict(c.env, HF_HUB_CACHE=hf_cache(c))
    with open(path, "w") as f:
        f.write("[broker]\nhttp = off\n" + model("mixtral", "hf:baton/kjv-mixtral", "aliases = mx\n"))
    p = subprocess.run([h.BROKER, "--config", path, "--check"], capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "; resolved: %s/hf/hub/models--baton--kjv-mixtral/snapshots/0123abcd (huggingface)" % c.dir in p.stdout, \
        p.stdout
    assert "aliases = mx" in p.stdout, p.stdout


def t_arena_full_refused(c):
    """An arena_dir too small for the model (a 2 MiB tmpfs, mounted in a
    mount namespace of the broker's own: unshare -rm): the model fails with
    baton-arena's "not enough room", its request gets 503, no engine
    starts, and nothing is left half-written there."""
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True, timeout=10).returncode != 0:
        return "skipped: unshare -rm does not work here"
    small = os.path.join(c.dir, "small")
    os.mkdir(small)
    cfg = os.path.join(c.dir, "full.ini")
    with open(cfg, "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\nhttp = 127.0.0.1:0\narena_dir = %s\n" %
                (c.control, c.events_url, small) + model("qwen", QWEN_DIR))
    p = subprocess.Popen(["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=2m tmpfs "$1" && exec "$2" --config "$3"',
                          "sh", small, h.BROKER, cfg], stdout=subprocess.PIPE, stderr=open(c.log("broker"), "a"),
                         env=c.env, text=True)
    c.procs.append(p)
    line = p.stdout.readline().split()
    assert len(line) == 4 and line[0] == "ready", (line, open(c.log("broker")).read())
    http = h.Http(line[3], open(os.path.join(c.dir, "http.token")).read().strip())
    st, body, hd = http.post("/v1/chat/completions", chat("qwen", "Who?", 1), timeout=60)
    assert st == 503 and body["error"]["code"] == "model_failed" and hd.get("Retry-After"), (st, body)
    assert "not enough room" in body["error"]["message"], body
    m = models(http)["qwen"]
    assert m["state"] == "failed" and m["fleet"]["starts"] == 0 and not engine_procs(c), m
    # the broker's view of the tmpfs (its mount namespace): no arena, no temporary file
    seen = "/proc/%d/root%s" % (p.pid, small)
    vfs = os.statvfs(seen)
    assert vfs.f_blocks * vfs.f_frsize == 2 * h.MIB, "not the broker's tmpfs"
    left = os.listdir(seen)
    assert not [n for n in left if n.endswith(".arena") or ".tmp." in n], left
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == 0
    return re.search(r"not enough room[^;|]*", body["error"]["message"]).group(0)


def t_fleet(c):
    tiny_arena = h.model_arena("kjv-qwen3-moe")
    c.env["HF_HUB_CACHE"] = hf_cache(c)
    c.env["NOTIFY_SOCKET"] = os.path.join(c.dir, "no-notify.sock")  # as under systemd: the broker's alone
    http = c.http_broker(fleet_text(c, tiny_arena))
    ms = models(http)
    assert sorted(ms) == ["broken", "crashy", "mixtral", "qwen", "tiny"], ms
    assert all(m["state"] == "stopped" and m["fleet"]["starts"] == 0 for m in ms.values()), ms
    assert ms["qwen"]["fleet"]["aliases"] == ["bible-qwen"], ms["qwen"]
    assert not engine_procs(c) and not c.status()["engines"]

    # interleaved requests from three clients: each engine starts on its
    # first request, which waits for it
    plan = {0: [("bible-qwen", 1), ("mixtral", 2), ("tiny", 1)],
            1: [("mixtral", 3), ("tiny", 4), ("qwen", 4)],
            2: [("tiny", 5), ("qwen", 5), ("mixtral", 6)]}
    got, errs = {}, []

    def client(k):
        try:
            for name, seed in plan[k]:
                st, body, _ = http.post("/v1/chat/completions", chat(name, "Who was Noah?", seed), timeout=60)
                got[(k, name, seed)] = (st, body)
        except Exception as e:  # noqa: BLE001
            errs.append(e)
    th = [threading.Thread(target=client, args=(k,)) for k in plan]
    for t in th:
        t.start()
    for t in th:
        t.join(90)
    assert not errs, errs
    assert len(got) == 9 and all(st == 200 for st, _ in got.values()), got
    def said(b):  # a Qwen3 answer: its thinking (reasoning_content) and its content
        m = b["choices"][0]["message"]
        return (m.get("reasoning_content") or "") + "|" + (m.get("content") or "")
    for (k, name, seed), (st, body) in got.items():
        want = "qwen" if name == "bible-qwen" else name
        assert body["model"] == want and said(body) != "|", body
    text = {(n, s): said(b) for (k, n, s), (st, b) in got.items()}
    # tiny is qwen's weights from an arena made before: the same answer for a seed
    assert text[("tiny", 4)] == text[("qwen", 4)] and text[("tiny", 5)] == text[("qwen", 5)], text
    assert text[("tiny", 1)] == text[("bible-qwen", 1)], text
    ms = models(http)
    for name in ("qwen", "mixtral", "tiny"):
        f = ms[name]["fleet"]
        assert f["state"] == "running" and f["starts"] == 1 and f["crashes"] == 0 and f["pid"] > 0, ms[name]
        assert ms[name]["engines"] and ms[name]["engines"][0]["name"] == name, ms[name]
    procs = engine_procs(c)
    assert sorted(procs.values()) == ["mixtral", "qwen", "tiny"], procs
    pids = {n: ms[n]["fleet"]["pid"] for n in ("qwen", "mixtral", "tiny")}
    assert sorted(pids.values()) == sorted(procs), (pids, procs)
    # the core's status: each registered as the engine of its model, the pid the fleet started
    st = {e["name"]: e for e in c.status()["engines"]}
    assert sorted(st) == ["mixtral", "qwen", "tiny"], st
    for n in st:
        assert st[n]["pid"] == pids[n] and st[n]["model"] == n and st[n]["http"].startswith("http://127.0.0.1:"), st[n]
    # an engine keeps nothing of the broker's: stdin /dev/null, stdout and
    # stderr one pipe to the broker, no other pipe (the broker's own fds closed)
    fds = {int(n): os.readlink("/proc/%d/fd/%s" % (pids["qwen"], n)) for n in os.listdir("/proc/%d/fd" % pids["qwen"])}
    assert fds[0] == "/dev/null" and fds[1] == fds[2] and fds[1].startswith("pipe:"), fds
    assert not [n for n, t in fds.items() if n > 2 and t.startswith("pipe:")], fds
    env = open("/proc/%d/environ" % pids["qwen"], "rb").read().split(b"\0")
    assert not [v for v in env if v.startswith(b"NOTIFY_SOCKET=")], env
    assert ("BATON_HOSTDEV_DIR=%s" % c.dir).encode() in env, env
    assert os.path.exists(os.path.join(c.dir, "arenas", "qwen.arena"))
    assert os.path.exists(os.path.join(c.dir, "arenas", "mixtral.arena"))
    assert not os.path.exists(os.path.join(c.dir, "arenas", "tiny.arena"))  # its own arena, as it is
    for name, n in (("qwen", 3), ("mixtral", 3), ("tiny", 3)):
        want_metric(http, "baton_door_requests_total", '{model="%s",outcome="served"}' % name, n)
        want_metric(http, "baton_fleet_engine_starts_total", '{model="%s"}' % name, 1)
        want_metric(http, "baton_fleet_model_state", '{model="%s",state="running"}' % name, 1)
        # time to first token: the first request of each waited for its engine's start
        want_metric(http, "baton_door_ttft_start_seconds_count", '{model="%s"}' % name, n)
        assert metric(http, "baton_door_ttft_start_seconds_sum", '{model="%s"}' % name) > 0, name
        want_metric(http, "baton_fleet_start_seconds_count", '{model="%s",phase="engine"}' % name, 1)
        assert metric(http, "baton_fleet_start_seconds_count", '{model="%s",phase="arena"}' % name) == \
            (0 if name == "tiny" else 1), name  # tiny's arena is its source

    # the serving metrics, per model, are the answers' own numbers (the
    # client's view: arrival at the door, so the engine's start is in the
    # first request's time to first token)
    for name in ("qwen", "mixtral", "tiny"):
        mine = [b for (k, n, s_), (st_, b) in got.items() if (n == "bible-qwen" and name == "qwen") or n == name]
        lab = '{model="%s"}' % name
        assert metric(http, "baton_door_prompt_tokens_total", lab) == sum(b["usage"]["prompt_tokens"] for b in mine)
        assert metric(http, "baton_door_generation_tokens_total", lab) == \
            sum(b["usage"]["completion_tokens"] for b in mine), name
        assert metric(http, "baton_door_time_to_first_token_seconds_count", lab) == len(mine)
        assert metric(http, "baton_door_e2e_request_latency_seconds_count", lab) == len(mine)
        assert metric(http, "baton_door_time_to_first_token_seconds_sum", lab) > \
            metric(http, "baton_door_ttft_start_seconds_sum", lab) > 0  # the start is a part of it
        assert metric(http, "baton_door_time_to_first_token_seconds_sum", lab) < \
            metric(http, "baton_door_e2e_request_latency_seconds_sum", lab)
        ends = sum(metric(http, "baton_door_request_success_total", '{model="%s",finished_reason="%s"}' % (name, r))
                   for r in ("stop", "length", "cancelled"))
        assert ends == len(mine), (name, ends)
        assert metric(http, "baton_door_requests_running", lab) == 0
        assert metric(http, "baton_door_requests_waiting", lab) == 0
    # a client's bad request through the door: the engine's 400 passes on,
    # counted client_error and bad_request, never failed
    st_, body, _ = http.post("/v1/chat/completions", dict(chat("qwen", "Who?", 1), temperature=5))
    assert st_ == 400 and body["error"]["param"] == "temperature", body
    want_metric(http, "baton_door_requests_total", '{model="qwen",outcome="client_error"}', 1)
    assert metric(http, "baton_door_requests_total", '{model="qwen",outcome="failed"}') == 0
    assert metric(http, "baton_door_requests_rejected_total", '{model="qwen",reason="bad_request"}') == 1
    # the broker as one model server, as a gateway reads it: nothing waits or
    # runs now; its KV pools as the engines' heartbeats say (all free now)
    assert metric(http, "baton_requests_waiting") == 0 and metric(http, "baton_requests_running") == 0
    want_metric(http, "baton_kv_cache_usage_ratio", "", 0)  # the next heartbeats say so
    h.wait_for("the KV pools in the status", lambda: all(e["kv_blocks"] > 0 for e in c.status()["engines"]),
               timeout=T)
    assert all(e["kv_blocks_used"] == 0 for e in c.status()["engines"]), c.status()["engines"]
    # an engine's own /metrics: the same families as baton_engine_, only with the door's token
    eng = h.Http(st["qwen"]["http"])
    code, _, _ = eng.get("/metrics")
    assert code == 401, code
    # the access log: one line per request through the door, with its tokens
    def access_lines(door):
        pat = r"access: model=\S+ engine=" if door else r"engine \S+: .*access: model=\S+ status="
        return [x for x in open(c.log("broker")).read().splitlines() if re.search(pat, x)]
    # each is written as its answer ends: the last may come a moment after the client has it
    h.wait_for("10 access lines of the door's and of the engines'", lambda: len(access_lines(True)) == 10 and
               len(access_lines(False)) == 10, timeout=T)
    acc = access_lines(True)
    assert len(acc) == 10 and len([x for x in acc if "status=200" in x]) == 9, acc
    assert sum(int(re.search(r"completion_tokens=(\d+)", x).group(1)) for x in acc) == \
        sum(b["usage"]["completion_tokens"] for _, b in got.values()), acc
    # and the engines' own lines, relayed into the broker's log
    eacc = access_lines(False)
    assert len(eacc) == 10 and len([x for x in eacc if "status=400" in x]) == 1, eacc

    # broken: its arena cannot be made; crashy: its engine exits at once,
    # restart_max times; both answer 503 model_failed with the reason
    st, body, hd = http.post("/v1/chat/completions", chat("broken", "Who?", 1))
    assert st == 503 and body["error"]["code"] == "model_failed" and hd.get("Retry-After"), (st, body)
    assert "baton-arena create" in body["error"]["message"], body
    st, body, hd = http.post("/v1/chat/completions", chat("crashy", "Who?", 1), timeout=60)
    assert st == 503 and body["error"]["code"] == "model_failed", (st, body)
    assert "crashed 3 times" in body["error"]["message"], body
    assert "--ctx wants at least 16" in body["error"]["message"], body  # its last lines
    # answered without an engine: their access lines say so
    h.wait_for("the failed models' access lines", lambda: all(re.search(
        r"access: model=%s engine=- status=503 " % n, open(c.log("broker")).read()) for n in ("broken", "crashy")),
        timeout=T)
    ms = models(http)
    assert ms["crashy"]["state"] == "failed" and ms["crashy"]["fleet"]["crashes"] == 3, ms["crashy"]
    assert "--ctx wants at least 16" in ms["crashy"]["fleet"]["error"], ms["crashy"]
    assert ms["broken"]["state"] == "failed" and ms["broken"]["fleet"]["starts"] == 0, ms["broken"]
    want_metric(http, "baton_fleet_model_state", '{model="crashy",state="failed"}', 1)
    want_metric(http, "baton_fleet_engine_crashes_total", '{model="crashy"}', 3)
    want_metric(http, "baton_fleet_model_state", '{model="broken",state="failed"}', 1)

    # mixtral's engine killed with a stream and a whole request in flight
    s = http.open_stream("/v1/chat/completions", chat("mixtral", "Tell of the flood.", 7, max_tokens=400,
                                                      stream=True, no_eos=True))
    assert s.recv(4096)
    box = {}
    whole = threading.Thread(target=lambda: box.update(r=http.post(
        "/v1/chat/completions", chat("mixtral", "Who built the ark?", 8, max_tokens=400, no_eos=True),
        timeout=60)))
    whole.start()
    h.wait_for("two requests in mixtral's engine", lambda: metric(
        http, "baton_door_in_flight", '{engine="mixtral",model="mixtral"}') == 2, timeout=T, every=0.01)
    os.kill(pids["mixtral"], signal.SIGSTOP)  # neither ends before the kill
    # the broker as one model server (what a gateway reads): both running, none waiting
    assert metric(http, "baton_requests_running") == 2 and metric(http, "baton_requests_waiting") == 0
    os.kill(pids["mixtral"], signal.SIGKILL)
    raw = h.read_to_eof(s)
    s.close()
    data, ended = h.chunks_of(raw)
    assert not ended, raw[-300:]
    ev = h.sse_events(data)
    assert ev and isinstance(ev[-1], dict) and ev[-1]["error"]["code"] == "engine_unreachable", data[-300:]
    whole.join(60)
    st, body, hd = box["r"]
    assert st == 503 and hd.get("Retry-After") == "1" and body["error"]["code"] == "engine_unreachable", (st, body)
    # back by itself; meanwhile it is listed as down or starting, never gone
    seen = set()

    def back():
        m = models(http).get("mixtral")
        assert m, "mixtral left /v1/models"
        seen.add(m["fleet"]["state"])
        return m["fleet"]["starts"] == 2 and m["fleet"]["state"] == "running"
    h.wait_for("mixtral's engine restarted", back, timeout=T, every=0.02)
    assert seen & {"down", "starting", "running"}, seen
    st, body, _ = http.post("/v1/chat/completions", chat("mixtral", "Who was Noah?", 2))
    assert st == 200 and said(body) == text[("mixtral", 2)], (st, body)
    ms = models(http)
    assert ms["mixtral"]["fleet"]["crashes"] == 1 and ms["mixtral"]["fleet"]["pid"] != pids["mixtral"], ms
    st = {e["name"]: e for e in c.status()["engines"]}
    assert st["mixtral"]["pid"] == ms["mixtral"]["fleet"]["pid"] and st["mixtral"]["state"] == "ready", st["mixtral"]
    assert ms["qwen"]["fleet"]["pid"] == pids["qwen"] and ms["tiny"]["fleet"]["pid"] == pids["tiny"], ms
    want_metric(http, "baton_fleet_engine_crashes_total", '{model="mixtral"}', 1)
    want_metric(http, "baton_fleet_engine_starts_total", '{model="mixtral"}', 2)
    want_metric(http, "baton_fleet_start_seconds_count", '{model="mixtral",phase="engine"}', 2)
    assert metric(http, "baton_fleet_start_seconds_count", '{model="mixtral",phase="arena"}') == 1  # kept
    want_metric(http, "baton_door_requests_total", '{model="mixtral",outcome="served"}', 4)
    want_metric(http, "baton_door_requests_total", '{model="mixtral",outcome="failed"}', 2)
    assert metric(http, "baton_door_requests_total", '{model="mixtral",outcome="gone"}') == 0  # not the client's doing
    kinds = [e["kind"] for e in c.events.all(engine="mixtral") if e["kind"].startswith("fleet.")]
    assert kinds[:5] == ["fleet.arena", "fleet.start", "fleet.ready", "fleet.crash", "fleet.start"], kinds
    pids["mixtral"] = ms["mixtral"]["fleet"]["pid"]

    # SIGHUP: tiny removed, mixtral-b added, crashy changed; the others untouched
    with open(os.path.join(c.dir, "broker.ini"), "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\nhttp = 127.0.0.1:0\n" % (c.control, c.events_url) +
                fleet_text(c, tiny_arena, second=True))
    c.bp.send_signal(signal.SIGHUP)
    h.wait_for("the reload", lambda: c.events.all(kind="fleet.reload"), timeout=T)
    reason = c.events.all(kind="fleet.reload")[0]["reason"]
    assert reason == "added: mixtral-b; removed: tiny; changed: crashy; unchanged: 3", reason
    h.wait_for("tiny's engine gone", lambda: "tiny" not in engine_procs(c).values(), timeout=T)
    h.wait_for("tiny gone from the core's status (or stopped)",
               lambda: (c.eng("tiny") or {"state": "stopped"})["state"] == "stopped", timeout=T)
    ms = models(http)
    assert "tiny" not in ms and ms["mixtral-b"]["state"] == "stopped" and ms["crashy"]["state"] == "stopped", ms
    st, body, _ = http.post("/v1/chat/completions", chat("tiny", "Who?", 1))
    assert st == 404 and body["error"]["code"] == "model_not_found", (st, body)
    for name in ("qwen", "mixtral"):
        assert ms[name]["fleet"]["pid"] == pids[name] and ms[name]["fleet"]["starts"] == (1 if name == "qwen" else 2)
    st, body, _ = http.post("/v1/chat/completions", chat("mixtral-b", "Who was Noah?", 2))
    assert st == 200 and said(body) == text[("mixtral", 2)], (st, body)
    st, body, _ = http.post("/v1/chat/completions", chat("crashy", "Who was Noah?", 4))
    assert st == 200 and said(body) == text[("qwen", 4)], (st, body)
    # mixtral-b: stopped after 1 s idle, started again by the next request
    h.wait_for("mixtral-b stopped when idle", lambda: models(http)["mixtral-b"]["fleet"]["state"] == "stopped",
               timeout=T)
    assert "mixtral-b" not in engine_procs(c).values()
    # drop_arena: its arena is deleted with the stop (its /dev/shm back), made again at the next start
    h.wait_for("mixtral-b's arena deleted", lambda: not os.path.exists(os.path.join(c.dir, "arenas", "mixtral-b.arena")),
               timeout=T)
    want_metric(http, "baton_fleet_engine_idle_stops_total", '{model="mixtral-b"}', 1)
    st, body, _ = http.post("/v1/chat/completions", chat("mixtral-b", "Who was Noah?", 3))
    assert st == 200 and said(body) == text[("mixtral", 3)], (st, body)
    ms = models(http)
    assert ms["mixtral-b"]["fleet"]["starts"] == 2 and ms["mixtral-b"]["fleet"]["idle_stops"] == 1, ms["mixtral-b"]
    assert any("built %s/arenas/mixtral-b.arena" % c.dir in line for line in ms["mixtral-b"]["fleet"]["log"]), \
        ms["mixtral-b"]["fleet"]["log"]
    assert os.path.exists(os.path.join(c.dir, "arenas", "mixtral-b.arena"))
    assert ms["qwen"]["fleet"]["pid"] == pids["qwen"] and ms["mixtral"]["fleet"]["pid"] == pids["mixtral"]
    assert sorted(engine_procs(c).values()) == ["crashy", "mixtral", "mixtral-b", "qwen"]
    # SIGHUP again with crashy changed while its engine runs: that engine
    # stops, the next request starts it with the new section; the others stay
    crashy_pid = models(http)["crashy"]["fleet"]["pid"]
    with open(os.path.join(c.dir, "broker.ini"), "w") as f:
        f.write("[broker]\ncontrol = %s\nevents = %s\nhttp = 127.0.0.1:0\n" % (c.control, c.events_url) +
                fleet_text(c, tiny_arena, second=True, third=True))
    c.bp.send_signal(signal.SIGHUP)
    h.wait_for("the second reload", lambda: len(c.events.all(kind="fleet.reload")) == 2, timeout=T)
    reason = c.events.all(kind="fleet.reload")[1]["reason"]
    assert reason == "added: none; removed: none; changed: crashy; unchanged: 4", reason
    h.wait_for("crashy's old engine stopped", lambda: crashy_pid not in engine_procs(c), timeout=T)
    st, body, _ = http.post("/v1/chat/completions", chat("crashy", "Who was Noah?", 5))
    assert st == 200 and said(body) == text[("qwen", 5)], (st, body)
    ms = models(http)
    new_pid = ms["crashy"]["fleet"]["pid"]
    argv = open("/proc/%d/cmdline" % new_pid, "rb").read().split(b"\0")
    assert b"--max-seqs" in argv and argv[argv.index(b"--max-seqs") + 1] == b"2", argv
    # its arena, made at its first (crashing) start, reused: no copy
    assert any("reused %s/arenas/crashy.arena" % c.dir in line for line in ms["crashy"]["fleet"]["log"]), \
        ms["crashy"]["fleet"]["log"]
    assert ms["qwen"]["fleet"]["pid"] == pids["qwen"] and ms["mixtral"]["fleet"]["pid"] == pids["mixtral"], ms
    want_metric(http, "baton_door_requests_total", '{model="mixtral-b",outcome="served"}', 2)
    want_metric(http, "baton_door_requests_total", '{model="qwen",outcome="served"}', 3)
    assert metric(http, "baton_fleet_model_state", '{model="tiny",state="running"}') is None
    # promtool reads the fleet's series as the rest (when it is there)
    if h.promtool():
        st, mtext, _ = http.get("/metrics")
        r = subprocess.run([h.promtool(), "check", "metrics"], input=mtext, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout, r.stderr)
    # the CLI by model name through the door: models, chat (an alias), complete
    env = dict(c.env, BATON_BROKER=c.control, BATON_HTTP=http.url)
    p = subprocess.run([h.CLI, "models"], capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines()[1:] if not ln.startswith(" ")}
    assert sorted(rows) == ["broken", "crashy", "mixtral", "mixtral-b", "qwen"], p.stdout
    assert rows["qwen"][1] == "resident" and rows["qwen"][2] == "host-0" and rows["qwen"][5] == "3", p.stdout
    assert rows["mixtral"][5] == "4" and rows["mixtral"][6] == "2" and rows["mixtral"][-1] == "1", p.stdout
    assert rows["broken"][1] == "failed" and "  failed: baton-arena create" in p.stdout, p.stdout
    p = subprocess.run([h.CLI, "chat", "bible-qwen", "Who was Noah?", "--seed", "4", "--temperature", "0.8",
                        "--max-tokens", "16", "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    # the CLI prints the answer's content (its thinking is not part of "text")
    assert j["text"] == text[("qwen", 4)].split("|", 1)[1] and j["model"] == "qwen", j
    p = subprocess.run([h.CLI, "complete", "mixtral", "In the beginning", "--max-tokens", "4"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and p.stdout.strip(), (p.returncode, p.stdout, p.stderr)
    p = subprocess.run([h.CLI, "chat", "broken", "hi"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1 and "answered 503" in p.stderr and "model 'broken' failed" in p.stderr, p.stderr
    want_metric(http, "baton_door_requests_total", '{model="qwen",outcome="served"}', 4)
    # the engines' lines in the broker's log: the broker's stamp alone
    log = [ln for ln in open(c.log("broker")).read().splitlines() if "engine qwen: baton-engine[qwen]: " in ln]
    assert log and all(re.match(r"^\S+Z baton-broker: engine qwen: baton-engine\[qwen\]: ", ln) for ln in log), log
    odd = [ln for ln in ms["qwen"]["fleet"]["log"] if not ln.startswith(("baton-engine[qwen]: ", "baton-engine qwen: ", "ready ", "http: ",
                                                                          "built ", "reused "))]
    assert not odd, odd
    # the broker stopped: its engines go with it
    c.bp.send_signal(signal.SIGTERM)
    assert c.bp.wait(30) == 0
    h.wait_for("every engine stopped", lambda: not engine_procs(c), timeout=T)


def t_top_shows_the_door(c):
    """baton top tells what the door did: a MODELS section from
    /v1/models (state, engines, served, tokens per second since the last
    frame, mean time to first token), UNTIL counts down the door's
    keep-alive (it said "never" for an engine the keep-alive released),
    and live at --interval 2 it costs next to no CPU."""
    import termios  # noqa: F401 (the pty's modes)
    http = c.http_broker("arena_dir = %s/arenas\ndoor_keep_alive_s = 60\n" % c.dir + model("qwen", QWEN_DIR))
    served = 0
    for seed in (1, 2):
        st, body, _ = http.post("/v1/chat/completions", chat("qwen", "Who was Noah?", seed), timeout=60)
        assert st == 200, body
        served += 1
    env = dict(c.env, BATON_BROKER=c.control, BATON_HTTP=http.url)

    def top_once():
        p = subprocess.run([h.CLI, "top", "--once"], capture_output=True, text=True, env=env, timeout=30)
        assert p.returncode == 0, p.stderr
        return p
    # the engine says busy until its next heartbeat after the last answer;
    # UNTIL counts down from when it is idle
    for _ in range(50):
        p = top_once()
        if not re.search(r"^qwen .*MiB\s+\S+\s+busy\s", p.stdout, re.M):
            break
        time.sleep(0.1)
    lines = p.stdout.splitlines()
    head = [i for i, ln in enumerate(lines) if ln.split()[:2] == ["MODEL", "STATE"]]
    assert head, p.stdout
    row = lines[head[0] + 1].split()
    assert row[0] == "qwen" and row[1] == "resident" and row[2] == "qwen" and row[5] == str(served), p.stdout
    assert row[-1] == "ms" and float(row[-2]) > 0, row  # the mean time to first token, "N ms"
    eng = [ln for ln in lines if ln.split()[:1] == ["qwen"] and "MiB" in ln][0]
    until = re.search(r"MiB\s+\S+\s+(\S+)\s+\S+ GB/s", eng).group(1)  # IDLE, then UNTIL
    assert re.match(r"^[\d.]+s$|^\dm\d\ds$", until) and 50 <= float(until.rstrip("s")) <= 60, eng  # not "never"
    # live on a terminal, every 2 s: a frame is one status and one GET, then it sleeps
    master, slave = h.pty_open(40, 160)
    tp = subprocess.Popen([h.CLI, "top", "--interval", "2"], stdin=slave, stdout=slave, stderr=slave,
                          env=dict(env, TERM="xterm"))
    got = h.pty_read_until(master, lambda g: b"MODEL" in g and b"qwen" in g, timeout=10)
    assert b"every 2.0s" in got, got[:300]
    time.sleep(6)
    f = open("/proc/%d/stat" % tp.pid).read().rsplit(")", 1)[1].split()
    cpu_s = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    os.write(master, b"q")
    assert tp.wait(10) == 0
    os.close(slave)
    os.close(master)
    assert cpu_s < 0.15, "baton top --interval 2 used %.2f s of CPU in about 6 s" % cpu_s
    return "top: %.2f s CPU in 6 s at --interval 2" % cpu_s


if __name__ == "__main__":
    h.need(h.BROKER)
    sys.exit(h.run_cases([t_bad_model_refused, t_arena_full_refused, t_fleet, t_top_shows_the_door], only=sys.argv[1:],
                         logs=("broker",)))
