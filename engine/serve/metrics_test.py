#!/usr/bin/python3
"""metrics_test.py: the engine's serving metrics (GET /metrics, vLLM's
families under baton_engine_, docs/reference/http-api.md) and its access
log, end to end on a trained model of models/ (host backend).

  - after whole and streamed requests, a client's bad request and a
    prompt longer than the context, every number is the one the test
    made: requests by finished_reason, rejected bad_request (a 400 is
    never failed), prompt and generation tokens as the answers' usage
    says, one time to first token per request served, an inter-token gap
    per token after the first, end-to-end and queue time per request, KV
    blocks used and total as /health says; promtool passes it;
  - with a token (an engine under a broker gets the door's), /metrics is
    401 without it;
  - the usage report the front door asks for (X-Baton-Usage): a header of
    a whole reply, a comment line of a stream before its [DONE]; a client
    that does not ask gets neither;
  - the access log: one line per request with model, status, tokens, time
    to first token and duration; --no-access-log: none.
The last line is "N passed, N failed".
"""
import http.client
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODEL = "kjv-qwen3-moe"


def engine(c, name, *flags, token=None):
    own = ("--http-token-file", token) if token else ()
    p = c.engine(name, "--ctx", "256", "--http", "127.0.0.1:0", *own, *flags, arena=h.model_arena(MODEL),
                 broker=False, host_mib=64, segment_mib=2)
    line = p.stdout.readline()
    assert line.startswith("http: http://127.0.0.1:"), line
    p.http = h.Http(line.split()[1])
    return p


def chat(q, max_tokens=12, stream=False, **more):
    b = {"model": MODEL, "messages": [{"role": "user", "content": q}], "seed": 3, "temperature": 0.7,
         "max_tokens": max_tokens, "stream": stream}
    b.update(more)
    return b


def parse(text):
    """{(name, frozenset(labels)): value} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out[(m.group(1), labels)] = float(m.group(4))
    return out


def val(series, name, **labels):
    want = {(k, v) for k, v in labels.items()}
    got = [v for (n, ls), v in series.items() if n == name and want <= set(ls)]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def raw(e, path, body, headers):
    """(status, headers, body bytes) of a POST with these headers."""
    c = http.client.HTTPConnection(e.http.host, e.http.port, timeout=60)
    hdr = {"Content-Type": "application/json"}
    hdr.update(headers)
    try:
        c.request("POST", path, body=json.dumps(body), headers=hdr)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def t_metrics_count_what_happened(c):
    e = engine(c, "m")
    prompt = completion = served = 0
    finish = {"stop": 0, "length": 0}
    for q in ("Tell me of light.", "Who was Moses?"):
        st, b, _ = e.http.post("/v1/chat/completions", chat(q))
        assert st == 200, b
        prompt += b["usage"]["prompt_tokens"]
        completion += b["usage"]["completion_tokens"]
        finish[b["choices"][0]["finish_reason"]] += 1
        served += 1
    ev, _ = e.http.sse("/v1/chat/completions", chat("What is love?", max_tokens=10, stream=True,
                                                    stream_options={"include_usage": True}))
    u = ev[-2]["usage"]
    prompt += u["prompt_tokens"]
    completion += u["completion_tokens"]
    finish[[x for x in ev[:-2] if x["choices"] and x["choices"][0].get("finish_reason")][0]["choices"][0]
           ["finish_reason"]] += 1
    served += 1
    # a client's mistakes: a bad field and a prompt past the context (400 after it was read)
    st, b, _ = e.http.post("/v1/chat/completions", chat("x", temperature=5))
    assert st == 400, b
    st, b, _ = e.http.post("/v1/completions", {"model": MODEL, "prompt": "light " * 400})
    assert st == 400, b
    st, text, hdr = e.http.get("/metrics")
    assert st == 200 and hdr["Content-Type"].startswith("text/plain"), (st, hdr)
    s = parse(text)
    lab = {"engine": "m", "model": MODEL}
    for r in ("stop", "length"):
        assert val(s, "baton_engine_request_success_total", finished_reason=r, **lab) == finish[r], (r, finish)
    assert val(s, "baton_engine_request_success_total", finished_reason="cancelled", **lab) == 0
    assert val(s, "baton_engine_requests_rejected_total", reason="bad_request", **lab) == 2
    assert val(s, "baton_engine_requests_rejected_total", reason="queue_full", **lab) == 0
    assert val(s, "baton_engine_requests_failed_total", **lab) == 0
    assert val(s, "baton_engine_prompt_tokens_total", **lab) == prompt
    assert val(s, "baton_engine_generation_tokens_total", **lab) == completion
    assert val(s, "baton_engine_time_to_first_token_seconds_count", **lab) == served
    # a gap per token after each request's first
    assert val(s, "baton_engine_inter_token_latency_seconds_count", **lab) == completion - served
    assert val(s, "baton_engine_e2e_request_latency_seconds_count", **lab) == served
    # the long prompt was refused before admission: no queue time of its own
    assert val(s, "baton_engine_request_queue_time_seconds_count", **lab) == served
    assert val(s, "baton_engine_request_generation_tokens_sum", **lab) == completion
    assert val(s, "baton_engine_request_prompt_tokens_sum", **lab) == prompt
    ttft = val(s, "baton_engine_time_to_first_token_seconds_sum", **lab)
    e2e = val(s, "baton_engine_e2e_request_latency_seconds_sum", **lab)
    assert 0 < ttft < e2e, (ttft, e2e)
    # the histogram is one: its buckets are cumulative and end at the count
    inf = val(s, "baton_engine_time_to_first_token_seconds_bucket", le="+Inf", **lab)
    assert inf == served
    hb = e.http.get("/health")[1]
    assert val(s, "baton_engine_kv_blocks", **lab) == hb["kv_blocks_total"] > 0
    assert val(s, "baton_engine_kv_blocks_used", **lab) == hb["kv_blocks_total"] - hb["kv_blocks_free"]
    assert val(s, "baton_engine_requests_running", **lab) == 0
    assert val(s, "baton_engine_requests_waiting", **lab) == 0
    assert val(s, "baton_engine_preemptions_total", **lab) == hb["preempted"]
    pt = h.promtool()
    assert pt, "promtool is missing (scripts/install-deps.sh extracts it into .deps/bin)"
    r = subprocess.run([pt, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    # the access log: a line per request, the 400s with their status
    log = open(c.log("m")).read()
    lines = [x for x in log.splitlines() if "access: " in x]
    assert len(lines) == served + 2, lines
    assert len([x for x in lines if "status=400" in x]) == 2, lines
    ok = [x for x in lines if "status=200" in x]
    assert len(ok) == served, lines
    got = sum(int(re.search(r"completion_tokens=(\d+)", x).group(1)) for x in ok)
    assert got == completion, (got, completion)
    assert all(re.search(r"model=%s status=\d+ prompt_tokens=\d+ completion_tokens=\d+ ttft_ms=[\d.]+ "
                         r"duration_ms=[\d.]+ " % MODEL, x) for x in lines), lines
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", lines[0]), lines[0]  # stamped
    # another face (Ollama's /api/generate, engine/serve/face.c) counts in the same families
    st, b, _ = e.http.post("/api/generate", {"model": MODEL, "prompt": "In the beginning", "stream": False,
                                             "options": {"num_predict": 5}})
    assert st == 200, b
    s2 = parse(e.http.get("/metrics")[1])
    assert val(s2, "baton_engine_generation_tokens_total", **lab) == completion + b["eval_count"], (val(s2, "baton_engine_generation_tokens_total", **lab), completion, b)
    assert val(s2, "baton_engine_prompt_tokens_total", **lab) == prompt + b["prompt_eval_count"]
    assert val(s2, "baton_engine_time_to_first_token_seconds_count", **lab) == served + 1
    return "%d served, %d tokens, TTFT mean %.1f ms" % (served, completion, ttft / served * 1e3)


def t_usage_report_and_token(c):
    tok = os.path.join(c.dir, "token")
    open(tok, "w").write("s3cret-token-0123456789\n")
    os.chmod(tok, 0o600)
    e = engine(c, "t", "--no-access-log", token=tok)
    st, b, _ = e.http.get("/metrics")
    assert st == 401, (st, b)
    auth = {"Authorization": "Bearer s3cret-token-0123456789"}
    st, hdr, body = raw(e, "/v1/chat/completions", chat("Who was Moses?"), dict(auth, **{"X-Baton-Usage": "1"}))
    assert st == 200, body
    u = json.loads(body)["usage"]
    rep = hdr["X-Baton-Usage"]
    m = re.match(r"prompt_tokens=(\d+) completion_tokens=(\d+) ttft_s=([\d.]+) finish=(\w+)$", rep)
    assert m and int(m.group(1)) == u["prompt_tokens"] and int(m.group(2)) == u["completion_tokens"], (rep, u)
    assert float(m.group(3)) > 0
    st, hdr, body = raw(e, "/v1/chat/completions", chat("Who was Moses?"), auth)
    assert st == 200 and "X-Baton-Usage" not in hdr, hdr
    st, hdr, body = raw(e, "/v1/chat/completions", chat("Who was Moses?", stream=True),
                        dict(auth, **{"X-Baton-Usage": "1"}))
    text = body.decode()
    assert st == 200 and re.search(r"\n: baton-usage prompt_tokens=\d+ completion_tokens=%d ttft_s=[\d.]+ "
                                   r"finish=\w+\ndata: \[DONE\]\n\n$" % u["completion_tokens"], text), text[-300:]
    st, hdr, body = raw(e, "/v1/chat/completions", chat("Who was Moses?", stream=True), auth)
    assert st == 200 and ": baton-usage" not in body.decode(), body[-200:]
    e.http.token = "s3cret-token-0123456789"
    st, text, _ = e.http.get("/metrics")
    assert st == 200 and val(parse(text), "baton_engine_request_success_total", engine="t", model=MODEL,
                             finished_reason="length") + val(parse(text), "baton_engine_request_success_total",
                                                             engine="t", model=MODEL,
                                                             finished_reason="stop") == 4, text
    assert "access: " not in open(c.log("t")).read()


if __name__ == "__main__":
    for p in (h.ENGINE, h.ARENA):
        h.need(p)
    sys.exit(h.run_cases([t_metrics_count_what_happened, t_usage_report_and_token], only=sys.argv[1:],
                         logs=("m", "t")))
