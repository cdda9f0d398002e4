#!/usr/bin/python3
"""complete_test.py: the engine's COMPLETE op and `baton complete` / `baton
chat`, end to end on the two trained models of models/ (host backend).

  - an engine alone answers a chat request token for token as transformers
    did (models/samples.json), over the op and through the CLI;
  - bad requests are refused with the field named, and change nothing;
  - the op's body is the OpenAI API's: the same body gives the same answer
    and the same error over the op and over HTTP (one parser);
  - an engine of an experts-only arena says it has no model;
  - under a broker, two models on one device that holds one of them answer
    in turn, found by name: each question is a handoff, and every answer is
    the one the model gives alone.
The last line is "N passed, N failed".
"""
import json
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODELS = os.path.join(ROOT, "models")
SAMPLES = json.load(open(os.path.join(MODELS, "samples.json")))["samples"]


def model_arena(c, model):
    return h.model_arena(model)


def ids(rep):
    b = rep["tokens"]
    if isinstance(b, str):  # the tool writes bins as hex or base64: accept both
        b = bytes.fromhex(b) if all(ch in "0123456789abcdef" for ch in b) else __import__("base64").b64decode(b)
    return list(struct.unpack("<%dI" % (len(b) // 4), b))


def sample(key, i=0):
    s = SAMPLES[key][i]
    return s["messages"], s["greedy_ids"], s["text"]


def complete(url, raw=None, **body):
    """One COMPLETE whose body is the OpenAI request body (raw: as is)."""
    return h.call(url, "complete", body=raw if raw is not None else json.dumps(body))


def cli(*args, env=None):
    return subprocess.run([h.CLI] + list(args), capture_output=True, text=True, timeout=120, env=env)


def t_chat_alone(c):
    e = c.engine("mixtral", arena=model_arena(c, "kjv-mixtral"), broker=False)
    msgs, want_ids, want_text = sample("kjv-mixtral")
    r = h.ok(complete(e.url, messages=msgs, temperature=0.0, max_tokens=48))
    assert r["text"] == want_text, (r["text"], want_text)
    assert r["completion_tokens"] == len(want_ids) and r["finish_reason"] in ("stop", "length"), r
    # through the CLI: one turn, as JSON, with the token ids
    p = cli("chat", e.url, msgs[0]["content"], "--temperature", "0", "--max-tokens", "48", "--json")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["text"] == want_text and j["tokens"] == want_ids, j
    assert j["usage"]["prompt_tokens"] == len(SAMPLES["kjv-mixtral"][0]["prompt_ids"]), j
    # a raw prompt, a stop string and a seed
    p = cli("complete", e.url, "And God said", "--temperature", "0.9", "--seed", "7", "--max-tokens", "12")
    q = cli("complete", e.url, "And God said", "--temperature", "0.9", "--seed", "7", "--max-tokens", "12")
    assert p.returncode == 0 and p.stdout == q.stdout and p.stdout.strip(), (p.stdout, q.stdout, p.stderr)
    cut = want_text.index(",")
    r = h.ok(complete(e.url, messages=msgs, temperature=0.0, max_tokens=48, stop=[","]))
    assert r["text"] == want_text[:cut] and r["finish_reason"] == "stop", r["text"]


def t_bad_requests(c):
    e = c.engine("qwen", arena=model_arena(c, "kjv-qwen3-moe"), broker=False)
    m = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(prompt="x", messages=m), "unsupported", "prompt"),
        (dict(), "invalid", "prompt: required"),
        (dict(raw="{"), "invalid", "not JSON"),
        (dict(messages=[]), "invalid", "messages"),
        (dict(messages=[{"role": "wizard", "content": "x"}]), "invalid", "messages[0].role"),
        (dict(messages=[{"role": "user", "content": 5}]), "invalid", "messages[0].content"),
        (dict(messages=m, stop=5), "invalid", "stop"),
        (dict(messages=m, stop=[""]), "invalid", "stop"),
        (dict(messages=m, stop=["a", "b", "c", "d", "e"]), "invalid", "at most 4"),
        (dict(messages=m, temperature=-1.0), "invalid", "temperature"),
        (dict(messages=m, top_p=1.5), "invalid", "top_p"),
        (dict(messages=m, max_tokens=0), "invalid", "max_tokens"),
        (dict(messages=m, tools=[{"type": "function"}]), "invalid", "tools[0]"),
        (dict(messages=m, tool_choice="required"), "invalid", "tool_choice"),
        (dict(messages=m, stream=True), "unsupported", "stream"),
        (dict(messages=m, logprobs=True), "unsupported", "logprobs"),
        (dict(prompt="x", echo=True), "unsupported", "echo"),
        (dict(messages=m, model="nobody"), "not_found", "nobody"),
    ]
    for fields, name, words in cases:
        r = complete(e.url, **fields)
        h.err(r, name)
        assert words in r.get("msg", ""), (fields, r)
    # a prompt longer than the context
    r = complete(e.url, prompt="light " * 5000, max_tokens=4)
    h.err(r, "out_of_range")
    # still serves, and the CLI says usage errors with exit 2
    h.ok(complete(e.url, messages=m, temperature=0.0, max_tokens=4))
    p = cli("chat", e.url, "hi", "--top-p", "2")
    assert p.returncode == 2 and "--top-p" in p.stderr, (p.returncode, p.stderr)
    p = cli("chat", e.url, "hi", "--temperature", "5")  # the engine's range: [0, 2]
    assert p.returncode == 2 and "temperature" in p.stderr, (p.returncode, p.stderr)
    p = cli("complete", e.url)
    assert p.returncode == 2, p.stderr


def t_same_as_http(c):
    """One parser: each body gives the same answer (text, tokens counted,
    finish) or the same refusal (the message; 400 invalid or unsupported,
    404 not_found) over the COMPLETE op and over the OpenAI API."""
    model = "kjv-qwen3-moe"
    e = c.engine("qwen", "--http", "127.0.0.1:0", arena=model_arena(c, model), broker=False)
    line = e.stdout.readline()
    assert line.startswith("http: "), line
    web = h.Http(line.split()[1])
    m = [{"role": "user", "content": "Tell me of light."}]
    good = [
        dict(messages=m, temperature=0.0, max_tokens=12),
        dict(messages=m, temperature=0.9, seed=7, max_tokens=12, top_k=20, stop=[" the"]),
        dict(messages=m, temperature=0.0, max_tokens=8, chat_template_kwargs={"enable_thinking": False}),
        dict(prompt="And God said", temperature=0.7, seed=3, max_tokens=10, min_p=0.05),
        dict(prompt="And God said", seed=3),  # /v1/completions' default max_tokens (16)
        dict(model=model, prompt="In the beginning", temperature=0.0, max_tokens=6, repetition_penalty=1.2),
    ]
    bad = [
        dict(messages=[]), dict(messages=[{"role": "wizard", "content": "x"}]),
        dict(messages=m, temperature=3), dict(messages=m, stop=["a"] * 5),
        dict(messages=m, tools=[{"type": "function"}]), dict(messages=m, tool_choice="required"),
        dict(messages=m, model="nobody"), dict(prompt=""),
        dict(prompt="x", n=0), dict(messages=m, max_tokens=0),
    ]
    status_err = {400: ("invalid", "unsupported"), 404: ("not_found",)}
    for b in good + bad:
        path = "/v1/chat/completions" if "messages" in b else "/v1/completions"
        st, body, _ = web.post(path, b)
        r = complete(e.url, **b)
        if st == 200:
            ch = body["choices"][0]
            text = ch["message"]["content"] if "messages" in b else ch["text"]
            h.ok(r)
            raw = r["text"]  # the op's text is raw; the API splits a leading think out
            if "messages" in b and raw.startswith("<think>") and "</think>" in raw:
                raw = raw.split("</think>", 1)[1].lstrip()
            assert raw == text, (b, r["text"], text)
            assert r["completion_tokens"] == body["usage"]["completion_tokens"], (b, r, body)
            assert r["prompt_tokens"] == body["usage"]["prompt_tokens"], (b, r, body)
            assert r["finish_reason"] == ch["finish_reason"], (b, r, body)
            assert b not in bad, b
        else:
            assert b in bad, (b, st, body)
            assert r.get("err") in [h.ERR[n] for n in status_err[st]], (b, st, r)
            assert r["msg"] == "complete: " + body["error"]["message"], (b, r["msg"], body)
    return "%d bodies" % len(good + bad)


def t_experts_only(c):
    e = c.engine("s", broker=False)  # the fixture's synthetic, experts-only arena
    r = complete(e.url, prompt="hi")
    h.err(r, "unsupported")
    assert "experts only" in r["msg"], r
    h.ok(h.call(e.url, "gen", steps=1, batch=1, seed=1))


def t_two_models_one_device(c):
    """18 MiB of device: the dense weights and KV caches of both (about 10
    MiB) and the experts of one (6 MiB)."""
    c.broker()
    flags = ("--ctx", "512", "--vram-elastic")
    q = c.engine("qwen", *flags, arena=model_arena(c, "kjv-qwen3-moe"), host_mib=18, segment_mib=2)
    m = c.engine("mixtral", *flags, arena=model_arena(c, "kjv-mixtral"), host_mib=18, segment_mib=2)
    env = dict(c.env, BATON_BROKER=c.control)
    asked = [("qwen", "kjv-qwen3-moe/no-thinking", 0), ("mixtral", "kjv-mixtral", 0),
             ("qwen", "kjv-qwen3-moe/no-thinking", 4), ("mixtral", "kjv-mixtral", 3)]
    for name, key, i in asked:
        msgs, want_ids, want_text = sample(key, i)
        args = ["chat", name, msgs[0]["content"], "--temperature", "0", "--max-tokens", "48", "--json"]
        if "no-thinking" in key:
            args.append("--no-thinking")
        p = cli(*args, env=env)
        assert p.returncode == 0, (name, p.stderr)
        j = json.loads(p.stdout)
        assert j["tokens"] == want_ids and j["text"] == want_text, (name, j["text"], want_text)
        other = "mixtral" if name == "qwen" else "qwen"
        h.wait_for("%s released for %s" % (other, name), lambda: c.eng(other)["state"] == "released")
        assert c.eng(name)["resident"] > 0
    # a name the broker does not know: exit 4
    p = cli("chat", "nobody", "hi", env=env)
    assert p.returncode == 4 and "nobody" in p.stderr, (p.returncode, p.stderr)
    assert len(c.events.all("handoff")) >= 3, c.events.all("handoff")
    return "%d handoffs" % len(c.events.all("handoff"))


if __name__ == "__main__":
    sys.exit(h.run_cases([t_chat_alone, t_bad_requests, t_same_as_http, t_experts_only, t_two_models_one_device],
                         only=sys.argv[1:], logs=("broker", "qwen", "mixtral", "s")))
