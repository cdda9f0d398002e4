#!/usr/bin/python3
"""faces_test.py: Ollama's API and Anthropic's Messages API through the
broker's front door (docs/reference/ollama-anthropic.md), end to end on the
host backend with the two trained models of models/ on one device.

  - /api/version, /api/tags (both models), /api/ps (those held), /api/show
    routed to the model's engine;
  - /api/chat, /api/generate and /v1/messages routed by model, whole and
    streamed (NDJSON, Anthropic's events), each answer equal to what that
    model's engine gives alone, across a device switch;
  - the door's own refusals in each face's shape: no token (401), no or
    an unknown model (400, 404), a body that is not JSON; the engines'
    400s for hostile bodies passed on; nothing changed after;
  - keep_alive reaches the broker (the engine's heartbeat) and is its idle
    release of that engine: 0 at once, a duration or -1 longer than the
    configured keep_alive_s;
  - the `ollama` and `@anthropic-ai/sdk` npm clients, unchanged
    (tests/node/faces.mjs), against the door: list, ps, chat, generate,
    streaming, messages, streaming, tools with a round trip, thinking.
The last line is "N passed, N failed".
"""
import importlib.util
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

# the engine's test: its bodies, its readers and its check of faces.mjs
_spec = importlib.util.spec_from_file_location("engine_faces", os.path.join(ROOT, "engine", "serve", "faces_test.py"))
ef = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ef)

QWEN, MIXTRAL = "kjv-qwen3-moe", "kjv-mixtral"


def two_engines(c, env=None, config=""):
    """A broker with HTTP, and the two models' engines with --http on one
    device that holds the experts of one of them."""
    http = c.http_broker(config)
    flags = ("--ctx", "512", "--vram-elastic", "--http", "127.0.0.1:0",
             "--http-token-file", h.engine_token_file(c.dir))
    c.engine("qwen", *flags, arena=h.model_arena(QWEN), host_mib=18, segment_mib=2, env=env)
    c.engine("mixtral", *flags, arena=h.model_arena(MIXTRAL), host_mib=18, segment_mib=2, env=env)
    h.wait_for("both engines routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    return http


class Alone:
    """An engine's own HTTP (as its owner), for what it answers alone."""
    def __init__(self, c, name):
        self.http = h.Http(c.eng(name)["http"], h.ENGINE_TOKEN)


def t_routed_by_model(c):
    http = two_engines(c)
    st, v, _ = http.get("/api/version")
    assert st == 200 and v["version"].count(".") == 2, v
    st, tags, _ = http.get("/api/tags")
    assert st == 200 and sorted(m["name"] for m in tags["models"]) == sorted([QWEN, MIXTRAL]), tags
    st, show, _ = http.post("/api/show", {"model": MIXTRAL})
    assert st == 200 and "completion" in show["capabilities"], show
    n = 0
    for model, name in ((MIXTRAL, "mixtral"), (QWEN, "qwen"), (MIXTRAL, "mixtral")):
        alone = Alone(c, name)
        msgs = [{"role": "user", "content": "Who was Noah?"}]
        opts = {"seed": 7, "temperature": 0.8, "num_predict": 12}
        st, want, _ = alone.http.post("/api/chat", {"model": model, "messages": msgs, "stream": False,
                                                     "options": opts})
        assert st == 200, want
        st, got, _ = http.post("/api/chat", {"model": model, "messages": msgs, "stream": False, "options": opts})
        assert st == 200 and got["message"] == want["message"], (got, want)
        st, ct, lines = ef.ndjson(http, "/api/chat", {"model": model + ":latest", "messages": msgs,
                                                      "options": opts})
        assert st == 200 and ct.startswith("application/x-ndjson") and lines[-1]["done"], (st, ct, lines)
        assert "".join(x["message"]["content"] for x in lines) == want["message"]["content"], lines
        st, g, _ = http.post("/api/generate", {"model": model, "prompt": "And God said", "raw": True,
                                               "stream": False, "options": {"temperature": 0, "num_predict": 8}})
        st2, g2, _ = alone.http.post("/api/generate", {"model": model, "prompt": "And God said", "raw": True,
                                                        "stream": False, "options": {"temperature": 0,
                                                                                     "num_predict": 8}})
        assert st == 200 and g["response"] == g2["response"], (g, g2)
        body = {"model": model, "max_tokens": 12, "temperature": 0, "messages": msgs}
        st, am, _ = alone.http.post("/v1/messages", body)
        st2, dm, _ = http.post("/v1/messages", body)
        assert st == st2 == 200 and dm["content"] == am["content"] and dm["stop_reason"] == am["stop_reason"], (am, dm)
        ev = ef.events(http, "/v1/messages", dict(body, stream=True), headers={"Authorization": "Bearer " + http.token})
        text = "".join(d["delta"].get("text", "") for nm, d in ev if nm == "content_block_delta")
        assert text == "".join(b.get("text", "") for b in am["content"]) and ev[-1][0] == "message_stop", ev
        st, ct, _ = http.post("/v1/messages/count_tokens", {"model": model, "messages": msgs})
        assert st == 200 and ct["input_tokens"] > 0, ct
        n += 1
    st, ps, _ = http.get("/api/ps")
    assert st == 200 and [m["name"] for m in ps["models"]] == [MIXTRAL], ps  # the device holds one
    return "%d rounds across switches" % n


def t_door_refusals(c):
    http = two_engines(c)
    msgs = [{"role": "user", "content": "Who was Noah?"}]
    # no token: 401 in each face's shape
    st, j, _ = http.post("/api/chat", {"model": QWEN, "messages": msgs}, token=False)
    assert st == 401 and isinstance(j["error"], str) and "token" in j["error"], (st, j)
    st, j, _ = http.post("/v1/messages", {"model": QWEN, "max_tokens": 4, "messages": msgs}, token=False)
    assert st == 401 and j["type"] == "error" and j["error"]["type"] == "authentication_error", (st, j)
    # x-api-key is the door's token too
    st, j, _ = http.post("/v1/messages", {"model": QWEN, "max_tokens": 4, "messages": msgs}, token=False,
                         headers={"x-api-key": http.token, "anthropic-version": "2023-06-01"})
    assert st == 200 and j["type"] == "message", (st, j)
    st, j, _ = http.post("/api/chat", {"model": "nope", "messages": msgs})
    assert st == 404 and "nope" in j["error"], j
    st, j, _ = http.post("/v1/messages", {"model": "nope", "max_tokens": 4, "messages": msgs})
    assert st == 404 and j["error"]["type"] == "not_found_error", j
    st, j, _ = http.post("/api/pull", {"model": "llama3"})
    assert st == 404 and "not served" in j["error"], j
    st, before, _ = http.post("/api/chat", {"model": QWEN, "messages": msgs, "stream": False,
                                            "options": {"seed": 9, "num_predict": 8}})
    n = ef.hostile(http)  # the door's refusals and the engine's, passed on
    st, after, _ = http.post("/api/chat", {"model": QWEN, "messages": msgs, "stream": False,
                                           "options": {"seed": 9, "num_predict": 8}})
    assert st == 200 and after["message"] == before["message"], (before, after)
    st, m, _ = http.get("/v1/models", token=False)
    assert all(x["queued"] == 0 for x in m["data"]), m
    return "%d bodies refused" % n


def t_keep_alive(c):
    """An Ollama request's keep_alive goes to the broker (the engine's
    heartbeat) and is its idle release of that engine: 0 at once, "1h" in
    place of a short door_keep_alive_s, -1 never."""
    http = two_engines(c, config="door_keep_alive_s = forever\n[engine \"mixtral\"]\nkeep_alive_s = 0.5\n")
    msgs = [{"role": "user", "content": "Who was Noah?"}]
    st, j, _ = http.post("/api/chat", {"model": QWEN, "messages": msgs, "stream": False, "keep_alive": 0,
                                       "options": {"num_predict": 4}})
    assert st == 200, j
    h.wait_for("qwen released after keep_alive 0", lambda: c.eng("qwen")["state"] == "released", timeout=10)
    ev = [e for e in c.events.all("release", engine="qwen") if "keep-alive" in e["reason"]]
    assert ev, c.events.all("release", engine="qwen")
    # a duration outlasts mixtral's configured 0.5 s; -1 keeps it too
    for ka in ("1h", -1):
        st, j, _ = http.post("/api/chat", {"model": MIXTRAL, "messages": msgs, "stream": False, "keep_alive": ka,
                                           "options": {"num_predict": 4}})
        assert st == 200, j
        time.sleep(1.5)
        assert c.eng("mixtral")["state"] == "ready", (ka, c.eng("mixtral"))
    # and a later request's 0 releases it
    st, j, _ = http.post("/api/generate", {"model": MIXTRAL, "prompt": "Hi", "stream": False, "keep_alive": "0s",
                                           "options": {"num_predict": 2}})
    assert st == 200, j
    h.wait_for("mixtral released after keep_alive 0s", lambda: c.eng("mixtral")["state"] == "released",
               timeout=10)


def t_npm_clients(c):
    if h.SAN:
        # the sanitizers' pass: these are the npm clients (node's own code)
        # over the same endpoints the other cases drive under ASan here;
        # the plain pass runs them (make test's time, docs/internals/testing.md)
        return "skipped under the sanitizers (the plain pass runs the clients)"
    http = two_engines(c, env={"BATON_TEST_FORCE": ef.FORCE})
    # mixtral first, so that the clients' first request is a switch
    st, _, _ = http.post("/api/chat", {"model": MIXTRAL, "messages": [{"role": "user", "content": "Hi"}],
                                       "stream": False, "options": {"num_predict": 2}})
    assert st == 200
    got = ef.run_node(c, http.url, env={"BATON_TOKEN": http.token})
    ef.check_node(got, Alone(c, "qwen"), listed=(QWEN, MIXTRAL))
    return "through the door"


if __name__ == "__main__":
    for p in (h.ENGINE, h.ARENA, h.BROKER):
        h.need(p)
    sys.exit(h.run_cases([t_routed_by_model, t_door_refusals, t_keep_alive, t_npm_clients], only=sys.argv[1:],
                         logs=("broker", "qwen", "mixtral")))
