#!/usr/bin/python3
"""choices_test.py: "n" > 1 on /v1/chat/completions and /v1/completions
(each choice its own sequence), on the engine and through the front door,
on a trained model of models/ (host backend).

  - a seeded chat with n 3: three choices with their index, choice 0 the
    n 1 answer, the others on their own seeds; the prompt counted once in
    the usage, the completion tokens summed;
  - streamed: chunks carry their choice's index, each choice's text the
    whole reply's, one usage chunk, one [DONE];
  - completions: prompts times n, index prompt * n + copy;
  - n above --max-n (default 8), 0 or not an integer: 400 naming n;
  - the door passes n on to the model's engine.
The last line is "N passed, N failed".
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = HERE
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODEL = "kjv-qwen3-moe"


def engine(c, name, *flags):
    p = c.engine(name, "--ctx", "256", "--http", "127.0.0.1:0", *flags, arena=h.model_arena(MODEL), broker=False,
                 host_mib=64, segment_mib=2)
    line = p.stdout.readline()
    assert line.startswith("http: http://127.0.0.1:"), line
    p.http = h.Http(line.split()[1])
    return p


def chat(n=None, stream=False, seed=5, q="Tell me of light."):
    b = {"model": MODEL, "messages": [{"role": "user", "content": q}], "seed": seed, "temperature": 0.9,
         "max_tokens": 16, "stream": stream}
    if n is not None:
        b["n"] = n
    return b


def t_chat_n(c):
    e = engine(c, "n")
    st, one, _ = e.http.post("/v1/chat/completions", chat())
    assert st == 200, one
    st, three, _ = e.http.post("/v1/chat/completions", chat(3))
    assert st == 200 and three["object"] == "chat.completion", three
    ch = three["choices"]
    assert [x["index"] for x in ch] == [0, 1, 2], ch
    assert ch[0]["message"] == one["choices"][0]["message"], (ch[0], one)
    texts = [x["message"]["content"] for x in ch]
    assert len(set(texts)) >= 2, texts  # their own seeds
    u = three["usage"]
    assert u["prompt_tokens"] == one["usage"]["prompt_tokens"], (u, one["usage"])
    assert u["completion_tokens"] >= 3 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], u
    # the same request again: the same three (seeded)
    st, again, _ = e.http.post("/v1/chat/completions", chat(3))
    assert [x["message"]["content"] for x in again["choices"]] == texts
    # streamed: each choice's text by its index, one usage chunk, one [DONE]
    ev, _ = e.http.sse("/v1/chat/completions", dict(chat(3, stream=True), stream_options={"include_usage": True}))
    assert ev[-1] == "[DONE]" and ev.count("[DONE]") == 1, ev[-3:]
    assert ev[-2]["choices"] == [] and ev[-2]["usage"] == u, ev[-2]
    got, finish, roles = {}, {}, set()
    for x in ev[:-2]:
        assert len(x["choices"]) == 1 and x["usage"] is None, x
        c0 = x["choices"][0]
        i = c0["index"]
        if c0["delta"].get("role"):
            roles.add(i)
        got[i] = got.get(i, "") + (c0["delta"].get("content") or "")
        if c0["finish_reason"]:
            finish[i] = c0["finish_reason"]
    assert got == dict(enumerate(texts)) and roles == {0, 1, 2}, (got, texts, roles)
    assert finish == {i: x["finish_reason"] for i, x in enumerate(ch)}, finish
    assert len({x["id"] for x in ev[:-1]}) == 1
    st, hb, _ = e.http.get("/health")
    assert hb["running"] == 0 and hb["kv_blocks_free"] == hb["kv_blocks_total"], hb
    return "%d distinct of 3" % len(set(texts))


def t_completion_n(c):
    e = engine(c, "n")
    base = {"model": MODEL, "max_tokens": 8, "temperature": 0.9, "seed": 11}
    singles = []
    for p in ("In the beginning", "And God said"):
        st, b, _ = e.http.post("/v1/completions", dict(base, prompt=p))
        assert st == 200, b
        singles.append(b)
    st, b, _ = e.http.post("/v1/completions", dict(base, prompt=["In the beginning", "And God said"], n=2))
    assert st == 200 and b["object"] == "text_completion", b
    ch = b["choices"]
    assert [x["index"] for x in ch] == [0, 1, 2, 3], ch
    assert ch[0]["text"] == singles[0]["choices"][0]["text"] and ch[2]["text"] == singles[1]["choices"][0]["text"], \
        (ch, singles)
    assert b["usage"]["prompt_tokens"] == sum(x["usage"]["prompt_tokens"] for x in singles), b["usage"]
    ev, _ = e.http.sse("/v1/completions", dict(base, prompt="In the beginning", n=2, stream=True))
    text = {}
    for x in ev[:-1]:
        text[x["choices"][0]["index"]] = text.get(x["choices"][0]["index"], "") + x["choices"][0]["text"]
    assert text[0] == singles[0]["choices"][0]["text"] and set(text) == {0, 1}, text
    return "4 choices"


def t_limits(c):
    e = engine(c, "n")
    for n, words in ((9, "--max-n (8)"), (0, "out of range"), (200, "out of range"), ("2", "integer"),
                     (2.5, "integer")):
        st, b, _ = e.http.post("/v1/chat/completions", chat(n))
        assert st == 400 and b["error"]["param"] == "n" and words in b["error"]["message"], (n, b)
    st, b, _ = e.http.post("/v1/chat/completions", chat(None) | {"n": None})
    assert st == 200 and len(b["choices"]) == 1, b
    st, b, _ = e.http.post("/v1/completions", {"prompt": ["a"] * 20, "n": 4, "max_tokens": 1})
    assert st == 400 and b["error"]["param"] == "n" and "at most 64" in b["error"]["message"], b
    e2 = engine(c, "m", "--max-n", "2")
    st, b, _ = e2.http.post("/v1/chat/completions", chat(3))
    assert st == 400 and "--max-n (2)" in b["error"]["message"], b
    st, b, _ = e2.http.post("/v1/chat/completions", chat(2))
    assert st == 200 and len(b["choices"]) == 2, b
    # a bad choice refuses the request whole, nothing started
    st, b, _ = e.http.post("/v1/chat/completions", chat(2) | {"temperature": 5})
    assert st == 400 and b["error"]["param"] == "temperature", b
    st, hb, _ = e.http.get("/health")
    assert hb["running"] == 0 and hb["waiting"] == 0, hb


def t_door_passes_n(c):
    http = c.http_broker("")
    c.engine("qwen", "--ctx", "256", "--http", "127.0.0.1:0", "--http-token-file", h.engine_token_file(c.dir),
             arena=h.model_arena(MODEL), host_mib=40, segment_mib=2)
    h.wait_for("engine routable", lambda: all(x.get("http") for x in c.status()["engines"]))
    st, b, _ = http.post("/v1/chat/completions", chat(3))
    assert st == 200 and [x["index"] for x in b["choices"]] == [0, 1, 2], b
    eng = h.Http(c.eng("qwen")["http"], h.ENGINE_TOKEN)
    st, alone, _ = eng.post("/v1/chat/completions", chat(3))
    assert [x["message"] for x in b["choices"]] == [x["message"] for x in alone["choices"]], (b, alone)
    st, b, _ = http.post("/v1/chat/completions", chat(99))
    assert st == 400 and b["error"]["param"] == "n", b


if __name__ == "__main__":
    for p in (h.ENGINE, h.ARENA, h.CLI, h.BROKER):
        h.need(p)
    sys.exit(h.run_cases([t_chat_n, t_completion_n, t_limits, t_door_passes_n], only=sys.argv[1:],
                         logs=("n", "m", "broker", "qwen")))
