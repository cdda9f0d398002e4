#!/usr/bin/python3
"""faces_test.py: the engine's Ollama API (/api/...) and Anthropic Messages
API (/v1/messages) beside its OpenAI one (engine/serve/face.h,
docs/reference/ollama-anthropic.md), end to end on a trained model of
models/ (host backend).

  - Ollama over raw HTTP: version, tags, ps, show; chat and generate whole
    and as NDJSON lines (stream defaults to true), the text equal to what
    the OpenAI API gives for the same seed; options (seed, temperature,
    num_predict, stop); format "json" and a schema parse; keep_alive 0
    releases the cache once the request is done, a duration leaves it;
  - Anthropic over raw HTTP: a message whole and streamed as its events,
    the text equal to the OpenAI API's; stop_sequences and stop_reason;
    max_tokens required; count_tokens; x-api-key as the token;
  - the `ollama` and `@anthropic-ai/sdk` npm clients, unchanged
    (tests/node/faces.mjs): chat, generate, list, ps, show, streaming,
    messages, streaming, tools with a round trip (BATON_TEST_FORCE makes
    the model's sampler draw a known tool call), thinking, and errors that
    read as sentences;
  - hostile bodies on every new endpoint: a clear 400 in the face's error
    shape, and nothing changed (the engine answers as before);
  - a full queue is 503 with Retry-After in each face's shape; a client
    that leaves a stream frees its sequence.
The last line is "N passed, N failed".
"""
import json
import os
import calendar
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODEL = "kjv-qwen3-moe"
FORCED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
FORCED_THINK = "<think>\nI ponder the light.\n</think>\n\nLet there be light."
FORCE = "weather in Paris\t" + FORCED_CALL + "\x1eponder\t" + FORCED_THINK


def engine(c, name, *flags, token=None, env=None):
    """An engine of the model with --http on a free port; p.http: its client."""
    more = ()
    if token:
        path = os.path.join(c.dir, "tok")
        with open(path, "w") as f:
            f.write(token + "\n")
        os.chmod(path, 0o600)
        more = ("--http-token-file", path)
    p = c.engine(name, "--ctx", "1024", "--kv-blocks", "256", "--http", "127.0.0.1:0", *more, *flags,
                 arena=h.model_arena(MODEL), broker=False, host_mib=64, segment_mib=2, env=env)
    line = p.stdout.readline()
    assert line.startswith("http: http://127.0.0.1:"), line
    p.http = h.Http(line.split()[1], token)
    return p


def ndjson(http, path, body, timeout=60):
    """POSTs body; (status, content type, [parsed lines])."""
    import http.client as hc
    c = hc.HTTPConnection(http.host, http.port, timeout=timeout)
    hdr = {"Content-Type": "application/json"}
    if http.token:
        hdr["Authorization"] = "Bearer " + http.token
    try:
        c.request("POST", path, body=json.dumps(body), headers=hdr)
        r = c.getresponse()
        data = r.read().decode()
        return r.status, r.getheader("Content-Type"), [json.loads(x) for x in data.split("\n") if x]
    finally:
        c.close()


def events(http, path, body, headers=None, timeout=60):
    """POSTs a streamed Anthropic request; [(event name, data)]."""
    import http.client as hc
    c = hc.HTTPConnection(http.host, http.port, timeout=timeout)
    hdr = {"Content-Type": "application/json", **(headers or {})}
    try:
        c.request("POST", path, body=json.dumps(body), headers=hdr)
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type").startswith("text/event-stream")
        out, name = [], None
        for line in r.read().decode().split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
        return out
    finally:
        c.close()


def openai_text(e, question, seed=5, max_tokens=16, model=MODEL, **more):
    b = {"model": model, "messages": [{"role": "user", "content": question}], "seed": seed, "temperature": 0.8,
         "max_tokens": max_tokens}
    b.update(more)
    st, j, _ = e.http.post("/v1/chat/completions", b)
    assert st == 200, j
    return j


def t_ollama_http(c):
    e = engine(c, "q")
    st, v, _ = e.http.get("/api/version")
    assert st == 200 and v["version"].count(".") == 2, v
    st, tags, _ = e.http.get("/api/tags")
    assert st == 200 and [m["name"] for m in tags["models"]] == [MODEL], tags
    m = tags["models"][0]
    assert m["size"] > 0 and len(m["digest"]) == 64 and m["details"]["family"] and m["modified_at"].endswith("Z"), m
    st, ps, _ = e.http.get("/api/ps")
    assert st == 200 and ps["models"][0]["name"] == MODEL and ps["models"][0]["size_vram"] > 0, ps
    st, show, _ = e.http.post("/api/show", {"model": MODEL})
    assert st == 200 and "completion" in show["capabilities"] and "thinking" in show["capabilities"], show
    assert "tools" in show["capabilities"] and "{%" in show["template"], show["capabilities"]
    st, _, _ = e.http.post("/api/show", {"model": MODEL + ":latest"})
    assert st == 200
    # chat, whole: the OpenAI API's text for the same seed
    want = openai_text(e, "Tell me of light.", max_tokens=16)
    msgs = [{"role": "user", "content": "Tell me of light."}]
    opts = {"seed": 5, "temperature": 0.8, "num_predict": 16}
    st, j, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "options": opts})
    assert st == 200 and j["done"] is True and j["message"]["role"] == "assistant", j
    content = want["choices"][0]["message"]["content"]
    assert j["message"]["content"] == content, (j, want)
    assert j["message"].get("thinking", "") == want["choices"][0]["message"].get("reasoning_content", ""), j
    assert j["eval_count"] == want["usage"]["completion_tokens"] == 16 and j["done_reason"] == "length", j
    assert j["prompt_eval_count"] == want["usage"]["prompt_tokens"] and j["total_duration"] > 0, j
    # streamed by default: NDJSON lines, the same text
    st, ct, lines = ndjson(e.http, "/api/chat", {"model": MODEL, "messages": msgs, "options": opts})
    assert st == 200 and ct.startswith("application/x-ndjson") and len(lines) >= 3, (st, ct, lines)
    assert all(not x["done"] for x in lines[:-1]) and lines[-1]["done"] and lines[-1]["eval_count"] == 16, lines
    assert "".join(x["message"]["content"] for x in lines) == content, lines
    assert "".join(x["message"].get("thinking", "") for x in lines) == j["message"].get("thinking", ""), lines
    # generate (the template's), raw (the prompt as given), and their stream
    st, g, _ = e.http.post("/api/generate", {"model": MODEL, "prompt": "Tell me of light.", "stream": False,
                                             "options": opts})
    assert st == 200 and g["response"] == content and g["done"], (g, content)
    st, raw, _ = e.http.post("/api/generate", {"model": MODEL, "prompt": "In the beginning", "raw": True,
                                               "stream": False, "options": {"temperature": 0, "num_predict": 12}})
    st2, cw, _ = e.http.post("/v1/completions", {"model": MODEL, "prompt": "In the beginning", "max_tokens": 12,
                                                  "temperature": 0})
    assert st == 200 and raw["response"] == cw["choices"][0]["text"], (raw, cw)
    st, _, lines = ndjson(e.http, "/api/generate", {"model": MODEL, "prompt": "In the beginning", "raw": True,
                                                     "options": {"temperature": 0, "num_predict": 12}})
    assert "".join(x["response"] for x in lines) == raw["response"] and lines[-1]["done"], lines
    # stop: the text ends before it
    cut = content[len(content) // 2:][:3]
    if cut.strip():
        st, s, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False,
                                             "options": dict(opts, stop=[cut]), "think": False})
        assert st == 200 and cut not in s["message"]["content"], s
    # format: "json" and a schema: the answer parses (and fits)
    for seed in range(4):
        st, fj, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "format": "json",
                                              "think": False, "options": {"seed": seed, "num_predict": 300}})
        assert st == 200 and fj["message"]["content"].lstrip().startswith("{"), fj
        if fj["done_reason"] == "stop":
            assert isinstance(json.loads(fj["message"]["content"]), dict), fj
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    st, fs, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "format": schema,
                                          "think": False, "options": {"seed": 3, "num_predict": 200}})
    assert st == 200 and list(json.loads(fs["message"]["content"]).keys()) == ["n"], fs
    # an empty request loads the model
    st, ld, _ = e.http.post("/api/generate", {"model": MODEL, "stream": False})
    assert st == 200 and ld["done_reason"] == "load" and ld["response"] == "", ld
    return "%d NDJSON lines" % len(lines)


def iso_s(t):
    """Seconds of an RFC 3339 UTC time (Ollama's, with nanoseconds)."""
    day, frac = t.rstrip("Z").split(".")
    return calendar.timegm(time.strptime(day, "%Y-%m-%dT%H:%M:%S")) + float("0." + frac)


def level(e):
    return h.ok(h.call(e.url, "status"))["level"]


def t_ollama_keep_alive(c):
    """keep_alive 0: released once the request is done; "5m": kept."""
    e = engine(c, "k")
    msgs = [{"role": "user", "content": "Who was Moses?"}]
    st, j, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "keep_alive": "5m",
                                         "options": {"num_predict": 4}})
    assert st == 200, j
    time.sleep(0.5)
    assert level(e) == "none", level(e)
    st, ps, _ = e.http.get("/api/ps")
    assert 290 < (iso_s(ps["models"][0]["expires_at"]) - time.time()) < 301, ps
    st, j, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "keep_alive": 0,
                                         "options": {"num_predict": 4}})
    assert st == 200, j
    h.wait_for("released after keep_alive 0", lambda: level(e) != "none", timeout=5)
    # the next request refills it and answers
    st, j, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False, "keep_alive": -1,
                                         "options": {"num_predict": 4}})
    assert st == 200 and j["eval_count"] == 4, j
    time.sleep(0.5)
    assert level(e) == "none"
    st, ps, _ = e.http.get("/api/ps")
    assert ps["models"][0]["expires_at"].startswith("2262-"), ps
    log = open(c.log("k")).read()
    assert "released" in log, log[-2000:]


def t_anthropic_http(c):
    e = engine(c, "a", token="s3cret-key")
    e.http.token = "s3cret-key"
    want = openai_text(e, "Tell me of light.", max_tokens=16, temperature=0)  # Anthropic's has no seed: greedy
    content = want["choices"][0]["message"]["content"]
    reasoning = want["choices"][0]["message"].get("reasoning_content")
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content":
            "Tell me of light."}]}
    hdr = {"x-api-key": "s3cret-key", "anthropic-version": "2023-06-01"}
    e.http.token = None  # x-api-key alone is the token
    st, m, _ = e.http.post("/v1/messages", body, headers=hdr)
    assert st == 200 and m["type"] == "message" and m["role"] == "assistant" and m["id"].startswith("msg_"), m
    texts = [b["text"] for b in m["content"] if b["type"] == "text"]
    thinks = [b["thinking"] for b in m["content"] if b["type"] == "thinking"]
    assert "".join(texts) == content and "".join(thinks) == (reasoning or ""), (m, want)
    assert m["stop_reason"] == "max_tokens" and m["usage"]["output_tokens"] == 16, m
    assert m["usage"]["input_tokens"] == want["usage"]["prompt_tokens"], m
    # without the key: Anthropic's error shape? the server's 401
    st, err, _ = e.http.post("/v1/messages", body, headers={"anthropic-version": "2023-06-01"})
    assert st == 401, (st, err)
    st, err, _ = e.http.post("/v1/messages", body, headers={"x-api-key": "wrong"})
    assert st == 401, (st, err)
    # streamed: its events in order, the same text
    ev = events(e.http, "/v1/messages", dict(body, stream=True), headers=hdr)
    names = [n for n, _ in ev]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1, names
    text = "".join(d["delta"]["text"] for n, d in ev if n == "content_block_delta" and d["delta"]["type"] ==
                   "text_delta")
    assert text == content, (text, content)
    md = ev[-2][1]
    assert md["delta"]["stop_reason"] == "max_tokens" and md["usage"]["output_tokens"] == 16, md
    # stop_sequences: the stop named
    cut = content[len(content) // 2:][:3]
    if cut.strip():
        st, s, _ = e.http.post("/v1/messages", dict(body, stop_sequences=[cut]), headers=hdr)
        assert st == 200 and s["stop_reason"] == "stop_sequence" and s["stop_sequence"] == cut, (cut, s)
    st, s, _ = e.http.post("/v1/messages", dict(body, max_tokens=400), headers=hdr)
    assert st == 200 and s["stop_reason"] == "end_turn" and s["stop_sequence"] is None, s
    # count_tokens: the prompt the template makes
    st, n, _ = e.http.post("/v1/messages/count_tokens", {"model": MODEL, "messages": body["messages"]},
                           headers=hdr)
    assert st == 200 and n["input_tokens"] == want["usage"]["prompt_tokens"], (n, want["usage"])
    # max_tokens is required, as Anthropic's
    st, err, _ = e.http.post("/v1/messages", {"model": MODEL, "messages": body["messages"]}, headers=hdr)
    assert st == 400 and err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
    assert "max_tokens" in err["error"]["message"], err
    st, err, _ = e.http.post("/v1/messages", dict(body, model="nope"), headers=hdr)
    assert st == 404 and err["error"]["type"] == "not_found_error", err
    return "%d events" % len(ev)


# (path, body, words the error must carry): each is a 400 (404 for a model)
OLLAMA_BAD = [
    ("/api/chat", "{not json", "JSON"),
    ("/api/chat", "[1, 2]", "JSON object"),
    ("/api/chat", {"messages": []}, "model is required"),
    ("/api/chat", {"model": MODEL, "messages": "hi"}, "messages"),
    ("/api/chat", {"model": MODEL, "messages": [{"content": "x"}]}, "role"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "content"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "assistant", "content": "",
                                                  "tool_calls": [{"function": {"name": 3}}]}]}, "tool_calls"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "options": [1]}, "options"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "options": {"temperature": "hot"}}, "temperature"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "options": {"num_predict": 1.5}}, "num_predict"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "options": {"stop": [1]}}, "stop"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "format": "yaml"}, "format"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "format": {"type": "frob"}}, "format"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "think": "very"}, "think"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "keep_alive": "soon"},
     "keep_alive"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": {"a": 1}}, "tools"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "options": {"num_predict": 10 ** 12}}, "options.num_predict"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "options": {"temperature": -3}}, "options.temperature"),
    ("/api/chat", {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                   "format": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)"}}}},
     "format"),
    ("/api/generate", {"model": MODEL, "prompt": 7}, "prompt"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "context": [1, 2, 3]}, "context"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "suffix": "y"}, "suffix"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ("/api/generate", {"model": MODEL, "prompt": "x", "raw": "no"}, "raw"),
    ("/api/show", {}, "model is required"),
    ("/api/show", {"model": "other"}, "not found"),
    ("/api/chat", {"model": "other", "messages": []}, "not found"),
]
ANTHROPIC_BAD = [
    ("{not json", "JSON"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
    ({"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 5}, "messages"),
    ({"model": MODEL, "max_tokens": 5, "messages": []}, "messages"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}, "content"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "image"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "type"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "tool_use_id"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "assistant", "content": [{"type": "tool_use",
      "id": "t", "name": "f", "input": "x"}]}]}, "input"),
    ({"model": MODEL, "max_tokens": 5, "system": 5, "messages": [{"role": "user", "content": "x"}]}, "system"),
    ({"model": MODEL, "max_tokens": 5, "stop_sequences": "x", "messages": [{"role": "user", "content": "x"}]},
     "stop_sequences"),
    ({"model": MODEL, "max_tokens": 5, "temperature": "x", "messages": [{"role": "user", "content": "x"}]},
     "temperature"),
    ({"model": MODEL, "max_tokens": 5, "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "x"}]},
     "input_schema"),
    ({"model": MODEL, "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
      "messages": [{"role": "user", "content": "x"}]}, "web_search"),
    ({"model": MODEL, "max_tokens": 5, "tool_choice": {"type": "sometimes"},
      "messages": [{"role": "user", "content": "x"}]}, "tool_choice"),
    ({"model": MODEL, "max_tokens": 5, "tool_choice": {"type": "any"},
      "messages": [{"role": "user", "content": "x"}]}, "tool"),
    ({"model": MODEL, "max_tokens": 5, "thinking": {"type": "maybe"},
      "messages": [{"role": "user", "content": "x"}]}, "thinking"),
    ({"model": MODEL, "max_tokens": 5, "stream": 1, "messages": [{"role": "user", "content": "x"}]}, "stream"),
    ({"model": MODEL, "max_tokens": 5, "stop_sequences": ["a", "b", "c", "d", "e"],
      "messages": [{"role": "user", "content": "x"}]}, "stop_sequences"),
    ({"model": MODEL, "max_tokens": 10 ** 12, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": MODEL, "max_tokens": 5, "tools": [{"name": "f", "input_schema": {"type": "object"}}],
      "tool_choice": {"type": "tool", "name": "g"}, "messages": [{"role": "user", "content": "x"}]}, "tool_choice"),
]


def hostile(http):
    """Every bad body on both faces: its status, shape and words. Returns
    the count."""
    n = 0
    for path, body, words in OLLAMA_BAD:
        st, j, _ = http.post(path, body)
        want = 404 if words == "not found" else 400
        assert st == want and isinstance(j, dict) and isinstance(j.get("error"), str), (path, body, st, j)
        assert words in j["error"], (body, j)
        n += 1
    for body, words in ANTHROPIC_BAD:
        st, j, _ = http.post("/v1/messages", body)
        assert st == 400 and j["type"] == "error" and j["error"]["type"] == "invalid_request_error", (body, st, j)
        assert words in j["error"]["message"], (body, j)
        n += 1
    for path in ("/api/tags", "/api/version"):
        st, j, hd = http.post(path, {})
        assert st == 405 and isinstance(j["error"], str), (path, st, j)
    st, j, _ = http.get("/api/chat")
    assert st == 405 and isinstance(j["error"], str), j
    st, j, _ = http.post("/api/pull", {"model": "llama3"})
    assert st == 404 and "not served" in j["error"], j
    return n


def t_hostile_bodies(c):
    e = engine(c, "x")
    before = h.ok(h.call(e.url, "status"))
    msgs = [{"role": "user", "content": "Who was Moses?"}]
    st, first, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False,
                                             "options": {"seed": 9, "num_predict": 8}})
    n = hostile(e.http)
    st, again, _ = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False,
                                             "options": {"seed": 9, "num_predict": 8}})
    assert st == 200 and again["message"] == first["message"], (first, again)
    hb = e.http.get("/health")[1]
    assert hb["running"] == 0 and hb["waiting"] == 0 and hb["kv_blocks_free"] == hb["kv_blocks_total"], hb
    assert h.ok(h.call(e.url, "status"))["requests"] >= before["requests"]
    return "%d bodies refused" % n


def t_queue_full_and_gone(c):
    """A full queue: 503 with Retry-After in each face's shape; a client
    that leaves an NDJSON or event stream frees its sequence at once."""
    import socket
    e = engine(c, "f", "--max-seqs", "1", "--max-queue", "1")

    def raw(path, body):
        b = json.dumps(body).encode()
        s = socket.create_connection((e.http.host, e.http.port), timeout=30)
        s.sendall(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % (path.encode(), e.http.host.encode(), e.http.port, len(b)) + b)
        return s
    msgs = [{"role": "user", "content": "Who was Moses?"}]
    # the running one must outlast the checks below: its answers end in
    # 25 to 140 tokens (10 to 60 ms) on the host, and Ollama's options
    # cannot ban the EOS, so a format (a string of 4,000 characters or
    # more) holds it to its num_predict
    s1 = raw("/api/chat", {"model": MODEL, "messages": msgs, "format": {"type": "string", "minLength": 4000},
                           "options": {"num_predict": 600, "temperature": 2}})
    assert s1.recv(4096).startswith(b"HTTP/1.1 200")
    s2 = raw("/v1/messages", {"model": MODEL, "max_tokens": 600, "stream": True, "temperature": 1.0,
                               "messages": msgs})
    h.wait_for("one waiting", lambda: e.http.get("/health")[1]["waiting"] == 1, timeout=10)
    st, j, hd = e.http.post("/api/chat", {"model": MODEL, "messages": msgs, "stream": False})
    assert st == 503 and hd.get("Retry-After") == "1" and "queue" in j["error"], (st, j, hd)
    st, j, hd = e.http.post("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": msgs})
    assert st == 503 and hd.get("Retry-After") == "1" and j["error"]["type"] == "overloaded_error", (st, j, hd)
    s1.close()  # the running one leaves: the waiting one runs, then leaves too
    got = b""
    while b"content_block_delta" not in got:
        chunk = s2.recv(4096)
        assert chunk, got
        got += chunk
    s2.close()
    h.wait_for("both sequences freed", lambda: (lambda x: x["running"] == 0 and x["waiting"] == 0 and
                                                x["kv_blocks_free"] == x["kv_blocks_total"])(e.http.get("/health")[1]),
               timeout=10)
    # the Ollama stream was left mid-answer; the Anthropic one may have met
    # its end of text before its client left (this tiny model can finish
    # 30 tokens in 20 ms), so only the first is sure to count as cancelled
    assert e.http.get("/health")[1]["cancelled"] >= 1


def run_node(c, url, env=None, extra=(), model=MODEL):
    dest = h.npm_client()
    e2 = dict(c.env, **(env or {}))
    p = subprocess.run(["node", os.path.join(dest, "faces.mjs"), url, model, *extra], capture_output=True,
                       text=True, timeout=180, env=e2)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def check_node(got, e_http, listed=(MODEL,), model=MODEL):
    """What faces.mjs printed, against raw HTTP's answers."""
    o = got["ollama"]
    assert sorted(o["list"]) == sorted(listed) and o["ps"] and set(o["ps"]) <= set(listed), o
    assert o["version"].count(".") == 2, o
    want = openai_text(e_http, "Tell me of light.", max_tokens=16, model=model)
    content = want["choices"][0]["message"]["content"]
    assert o["chat"]["content"] == content and o["chat"]["done"] and o["chat"]["eval_count"] == 16, (o, content)
    assert o["chat_stream"]["content"] == content and o["chat_stream"]["parts"] >= 3, o
    assert o["generate"]["response"] == content and o["generate_stream"] == content, o
    assert o["show"]["has_template"] and "completion" in o["show"]["capabilities"], o
    assert o["wrong_model"]["status"] == 404 and "no-such-model" in o["wrong_model"]["error"], o
    assert "object Object" not in o["wrong_model"]["error"], o
    tc = o["tool_call"]
    assert tc["calls"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}], tc
    assert o["tool_stream"] == tc["calls"] and o["think"]["thinking"].strip() == "I ponder the light.", o
    assert o["think"]["content"].strip() == "Let there be light.", o
    assert o["round_trip"]["ok"], o
    a = got["anthropic"]
    content = openai_text(e_http, "Tell me of light.", max_tokens=16, temperature=0, model=model)["choices"][0]["message"]["content"]
    assert a["message"]["text"] == content and a["message"]["stop_reason"] == "max_tokens", (a, content)
    assert a["stream"]["text"] == content and a["stream"]["final_stop"] == "max_tokens", a
    assert a["stream"]["events"][0] == "message_start" and a["stream"]["events"][-1] == "message_stop", a
    assert a["stream"]["usage"]["input_tokens"] == a["message"]["usage"]["input_tokens"] > 0, a
    assert a["stream"]["usage"]["output_tokens"] == 16 and a["stream"]["final_text"] == content, a
    assert a["tool"]["stop_reason"] == "tool_use" and a["tool"]["uses"] == [{"name": "get_weather", "input":
                                                                             {"city": "Paris"}}], a
    assert a["tool"]["id"].startswith("toolu_") and a["round_trip"]["ok"], a
    assert a["tool_stream"]["uses"] == a["tool"]["uses"], a
    assert a["thinking"]["thinking"].strip() == "I ponder the light.", a
    assert a["thinking"]["text"].strip() == "Let there be light.", a
    assert a["count"] == want["usage"]["prompt_tokens"], (a, want["usage"])
    assert a["wrong_model"]["status"] == 404 and a["wrong_model"]["type"] == "not_found_error", a
    assert a["no_max_tokens"]["status"] == 400 and "max_tokens" in a["no_max_tokens"]["message"], a


def t_npm_clients(c):
    if h.SAN:
        # the sanitizers' pass: these are the npm clients (node's own code)
        # over the same endpoints the other cases drive under ASan here;
        # the plain pass runs them (make test's time, docs/internals/testing.md)
        return "skipped under the sanitizers (the plain pass runs the clients)"
    e = engine(c, "n", token="s3cret-key", env={"BATON_TEST_FORCE": FORCE})
    got = run_node(c, e.http.url, env={"BATON_TOKEN": "s3cret-key"})
    check_node(got, e)
    dest = h.npm_client()
    vers = [json.load(open(os.path.join(dest, "node_modules", p, "package.json")))["version"]
            for p in ("ollama", "@anthropic-ai/sdk")]
    return "ollama %s, @anthropic-ai/sdk %s" % tuple(vers)


if __name__ == "__main__":
    for p in (h.ENGINE, h.ARENA):
        h.need(p)
    sys.exit(h.run_cases([t_ollama_http, t_ollama_keep_alive, t_anthropic_http, t_hostile_bodies, t_queue_full_and_gone,
                          t_npm_clients], only=sys.argv[1:], logs=("q", "k", "a", "x", "f", "n")))
