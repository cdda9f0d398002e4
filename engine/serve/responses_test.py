#!/usr/bin/python3
"""responses_test.py: OpenAI's Responses API (POST /v1/responses) on the
engine, end to end on a trained model of models/ (host backend).

  - a string input and an items input give the text the same chat
    completion gives, with the same token counts (instructions are the
    system message);
  - streamed: the typed events in the order the openai client's
    accumulator checks (created, in_progress, output_item.added,
    content_part.added, output_text.delta..., the done events,
    completed), sequence numbers in order, the deltas adding up to the
    whole reply's text;
  - store and previous_response_id: the conversation goes on from a stored
    response; store false keeps nothing; GET /v1/responses/{id};
  - tools: a function_call output item (whole and streamed as
    function_call_arguments.delta), a round trip with function_call and
    function_call_output items in the input, item_reference;
  - text.format json_schema: every output parses and validates;
  - errors: 400 naming the field (hosted tools, background, a bad input
    item), 404 for an unknown previous_response_id; a field outside the
    reference is ignored and counted.
The last line is "N passed, N failed".
"""
import json
import os
import subprocess
import sys
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = HERE
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODEL = "kjv-qwen3-moe"
MIXTRAL = "kjv-mixtral"
FORCED_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city", "strict": False,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def engine(c, name, env=None):
    p = c.engine(name, "--ctx", "1024", "--kv-blocks", "256", "--http", "127.0.0.1:0",
                 arena=h.model_arena(MODEL), broker=False, host_mib=64, segment_mib=2, env=env)
    line = p.stdout.readline()
    assert line.startswith("http: http://127.0.0.1:"), line
    p.http = h.Http(line.split()[1])
    return p


def events(http_, body, path="/v1/responses"):
    """A streamed response: [(event name, data)] as the server sent them."""
    c = http.client.HTTPConnection(http_.host, http_.port, timeout=60)
    hdr = {"Content-Type": "application/json"}
    if http_.token:
        hdr["Authorization"] = "Bearer " + http_.token
    try:
        c.request("POST", path, body=json.dumps(body), headers=hdr)
        r = c.getresponse()
        assert r.status == 200, (r.status, r.read())
        assert r.getheader("Content-Type").startswith("text/event-stream"), r.getheaders()
        out, name = [], None
        for raw in r.read().decode().split("\n"):
            if raw.startswith("event: "):
                name = raw[7:]
            elif raw.startswith("data: "):
                d = json.loads(raw[6:])
                assert d["type"] == name, (name, d)
                out.append((name, d))
                name = None
        return out
    finally:
        c.close()


def message_text(resp):
    return "".join(p["text"] for it in resp["output"] if it["type"] == "message" for p in it["content"])


def check_sequence(evs):
    """The order the openai client's accumulator needs; the final response."""
    names = [n for n, _ in evs]
    assert names[:2] == ["response.created", "response.in_progress"], names[:4]
    assert names[-1] in ("response.completed", "response.incomplete"), names[-3:]
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs))), evs[:3]
    open_items, built = {}, []
    for n, d in evs[2:-1]:
        if n == "response.output_item.added":
            assert d["output_index"] == len(built) + len(open_items) and not open_items, (d, open_items)
            open_items[d["output_index"]] = dict(d["item"], _text="")
        elif n.endswith(".delta"):
            it = open_items[d["output_index"]]
            assert it["id"] == d["item_id"], (it, d)
            it["_text"] += d["delta"]
        elif n == "response.output_item.done":
            it = open_items.pop(d["output_index"])
            done = d["item"]
            text = done.get("arguments") if done["type"] == "function_call" else \
                "".join(p["text"] for p in done.get("content", []))
            assert text == it["_text"], (text, it)
            built.append(done)
    final = evs[-1][1]["response"]
    assert final["output"] == built, (final["output"], built)
    return final


def t_text(c):
    e = engine(c, "r")
    q = "Tell me of light."
    st, r, _ = e.http.post("/v1/responses", {"model": MODEL, "input": q, "max_output_tokens": 20, "temperature": 0,
                                             "instructions": "Answer as the scripture does."})
    assert st == 200 and r["object"] == "response" and r["id"].startswith("resp_"), r
    assert r["status"] in ("completed", "incomplete") and r["model"] == MODEL, r
    st, cb, _ = e.http.post("/v1/chat/completions", {"model": MODEL, "max_tokens": 20, "temperature": 0,
                                                     "messages": [{"role": "system", "content": "Answer as the scripture does."},
                                                                  {"role": "user", "content": q}]})
    assert st == 200
    msg = cb["choices"][0]["message"]
    assert message_text(r) == msg["content"], (r["output"], msg)
    u = r["usage"]
    assert u["input_tokens"] == cb["usage"]["prompt_tokens"] and u["output_tokens"] == cb["usage"]["completion_tokens"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"], u
    if cb["choices"][0]["finish_reason"] == "length":
        assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}, r
    if msg.get("reasoning_content"):
        assert r["output"][0]["type"] == "reasoning", r
    # items input (developer: the system's other name), the same text
    st, r2, _ = e.http.post("/v1/responses", {"model": MODEL, "max_output_tokens": 20, "temperature": 0, "input": [
        {"role": "developer", "content": "Answer as the scripture does."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": q}]}]})
    assert st == 200 and message_text(r2) == message_text(r) and r2["usage"] == r["usage"], (r2, r)
    # streamed: the events, the same text
    evs = events(e.http, {"model": MODEL, "input": q, "max_output_tokens": 20, "temperature": 0, "stream": True,
                          "instructions": "Answer as the scripture does."})
    final = check_sequence(evs)
    assert message_text(final) == message_text(r) and final["usage"] == r["usage"], (final, r)
    deltas = [d for n, d in evs if n == "response.output_text.delta"]
    assert len(deltas) >= 3, deltas
    # GET /v1/responses/{id}: a stored one; store false keeps none
    st, got, _ = e.http.get("/v1/responses/" + r["id"])
    assert st == 200 and got == r, (got, r)
    st, r3, _ = e.http.post("/v1/responses", {"input": q, "max_output_tokens": 4, "store": False})
    assert st == 200 and r3["store"] is False
    st, b, _ = e.http.get("/v1/responses/" + r3["id"])
    assert st == 404, b
    return "%d deltas" % len(deltas)


def t_previous_response(c):
    e = engine(c, "r")
    st, r1, _ = e.http.post("/v1/responses", {"input": "Who was Moses?", "max_output_tokens": 12, "temperature": 0})
    assert st == 200, r1
    st, r2, _ = e.http.post("/v1/responses", {"input": "And Aaron?", "max_output_tokens": 12, "temperature": 0,
                                              "previous_response_id": r1["id"]})
    assert st == 200 and r2["previous_response_id"] == r1["id"], r2
    # the same as the whole conversation sent as a chat
    st, cb, _ = e.http.post("/v1/chat/completions", {"max_tokens": 12, "temperature": 0, "messages": [
        {"role": "user", "content": "Who was Moses?"},
        {"role": "assistant", "content": message_text(r1)},
        {"role": "user", "content": "And Aaron?"}]})
    assert st == 200 and cb["usage"]["prompt_tokens"] == r2["usage"]["input_tokens"], (cb["usage"], r2["usage"])
    assert cb["choices"][0]["message"]["content"] == message_text(r2), (cb, r2)
    # an item of a stored response, referenced
    mid = [it for it in r1["output"] if it["type"] == "message"][0]["id"]
    st, r3, _ = e.http.post("/v1/responses", {"max_output_tokens": 12, "temperature": 0, "input": [
        {"role": "user", "content": "Who was Moses?"}, {"type": "item_reference", "id": mid},
        {"role": "user", "content": "And Aaron?"}]})
    assert st == 200 and r3["usage"]["input_tokens"] == r2["usage"]["input_tokens"], (r3, r2)
    st, b, _ = e.http.post("/v1/responses", {"input": "x", "previous_response_id": "resp_nope"})
    assert st == 404 and b["error"]["param"] == "previous_response_id" and "not kept" in b["error"]["message"], b
    st, b, _ = e.http.post("/v1/responses", {"input": [{"type": "item_reference", "id": "msg_nope"}]})
    assert st == 404 and b["error"]["param"] == "input[0]", b
    # the store keeps the last 256: after 256 more, the first is gone
    for i in range(256):
        st, b, _ = e.http.post("/v1/responses", {"input": "x", "max_output_tokens": 1})
        assert st == 200, b
    st, b, _ = e.http.get("/v1/responses/" + r1["id"])
    assert st == 404, b
    st, b, _ = e.http.post("/v1/responses", {"input": "x", "previous_response_id": r2["id"], "max_output_tokens": 1})
    assert st == 404 and b["error"]["param"] == "previous_response_id", b
    return "input %d tokens after the previous" % r2["usage"]["input_tokens"]


def t_logprobs_and_delete(c):
    """include "message.output_text.logprobs" and top_logprobs: the
    output_text's logprobs are the chat's for the same request (whole and
    streamed, each delta its own tokens'); DELETE /v1/responses/{id}
    forgets a stored response."""
    e = engine(c, "l")
    q = "Tell me of light."
    st, cb, _ = e.http.post("/v1/chat/completions", {"model": MODEL, "max_tokens": 12, "temperature": 0,
                                                     "logprobs": True, "top_logprobs": 2,
                                                     "messages": [{"role": "user", "content": q}]})
    assert st == 200, cb
    want = cb["choices"][0]["logprobs"]["content"]
    assert len(want) == 12 and all(len(x["top_logprobs"]) == 2 for x in want), want
    body = {"model": MODEL, "input": q, "max_output_tokens": 12, "temperature": 0, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    st, r, _ = e.http.post("/v1/responses", body)
    assert st == 200, r
    part = [p for it in r["output"] if it["type"] == "message" for p in it["content"]][0]
    got = part["logprobs"]
    # the text's tokens: the chat's entries after its empty think block's
    toks = [x["token"] for x in want]
    first = [i for i in range(len(toks)) if "".join(toks[i:]) == part["text"]]
    assert first, (toks, part["text"])
    want = want[first[0]:]
    assert [x["token"] for x in got] == [x["token"] for x in want], (got, want)
    assert all(abs(a["logprob"] - b["logprob"]) < 1e-4 and [t["token"] for t in a["top_logprobs"]] ==
               [t["token"] for t in b["top_logprobs"]] for a, b in zip(got, want)), (got, want)
    assert "".join(x["token"] for x in got) == part["text"], (got, part)
    evs = events(e.http, dict(body, stream=True))
    final = check_sequence(evs)
    deltas = [d for n, d in evs if n == "response.output_text.delta"]
    streamed = [x for d in deltas for x in d["logprobs"]]
    assert [x["token"] for x in streamed] == [x["token"] for x in want], (streamed, want)
    assert all("".join(x["token"] for x in d["logprobs"]) == d["delta"] for d in deltas), deltas
    fpart = [p for it in final["output"] if it["type"] == "message" for p in it["content"]][0]
    assert fpart["logprobs"] == streamed, (fpart, streamed)
    # without include: none (the part's list is empty, as OpenAI's)
    st, r0, _ = e.http.post("/v1/responses", {"input": q, "max_output_tokens": 12, "temperature": 0})
    assert st == 200 and [p for it in r0["output"] if it["type"] == "message" for p in it["content"]][0][
        "logprobs"] == [], r0
    st, b, _ = e.http.post("/v1/responses", dict(body, top_logprobs=21))
    assert st == 400 and b["error"]["param"] == "top_logprobs", b
    # DELETE: gone for GET and previous_response_id, a second time 404
    st, d, _ = e.http.req("DELETE", "/v1/responses/" + r["id"])
    assert st == 200 and d == {"id": r["id"], "object": "response", "deleted": True}, (st, d)
    st, b, _ = e.http.get("/v1/responses/" + r["id"])
    assert st == 404, b
    st, b, _ = e.http.post("/v1/responses", {"input": "x", "previous_response_id": r["id"]})
    assert st == 404 and b["error"]["param"] == "previous_response_id", b
    st, b, _ = e.http.req("DELETE", "/v1/responses/" + r["id"])
    assert st == 404 and b["error"]["code"] == "not_found", b
    return "%d tokens' logprobs, whole and in %d deltas" % (len(got), len(deltas))


def t_tools(c):
    think = "<think>\nI ponder the light.\n</think>\n\nLet there be light."
    e = engine(c, "t", env={"BATON_TEST_FORCE": "weather in Paris\t" + FORCED_CALL + "\x1eponder\t" + think})
    # a thinking model's answer: a reasoning item, then the message
    st, r, _ = e.http.post("/v1/responses", {"input": "Now ponder.", "max_output_tokens": 64})
    assert st == 200 and [it["type"] for it in r["output"]] == ["reasoning", "message"], r
    assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "I ponder the light."}], r["output"][0]
    assert message_text(r) == "Let there be light.", r
    evs = events(e.http, {"input": "Now ponder.", "max_output_tokens": 64, "stream": True})
    final = check_sequence(evs)
    assert [it["type"] for it in final["output"]] == ["reasoning", "message"] and message_text(final) == \
        message_text(r), final
    assert "response.reasoning_text.delta" in [n for n, _ in evs], evs
    body = {"model": MODEL, "input": "What is the weather in Paris?", "tools": [WEATHER], "max_output_tokens": 64}
    st, r, _ = e.http.post("/v1/responses", body)
    assert st == 200 and r["status"] == "completed", r
    calls = [it for it in r["output"] if it["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather" and calls[0]["status"] == "completed", r
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"} and calls[0]["call_id"].startswith("call_"), calls
    assert calls[0]["id"].startswith("fc_") and not message_text(r).strip(), r
    evs = events(e.http, dict(body, stream=True))
    final = check_sequence(evs)
    names = [n for n, _ in evs]
    assert "response.function_call_arguments.delta" in names and "response.function_call_arguments.done" in names
    fc = [it for it in final["output"] if it["type"] == "function_call"]
    assert len(fc) == 1 and json.loads(fc[0]["arguments"]) == {"city": "Paris"}, final
    # the round trip: the call and its output in the input, as the chat's tool_calls and tool message
    call = calls[0]
    st, r2, _ = e.http.post("/v1/responses", {"tools": [WEATHER], "max_output_tokens": 8, "seed": 3, "input": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call["call_id"], "name": call["name"], "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "Sunny, 21 C"}]})
    assert st == 200, r2
    st, cb, _ = e.http.post("/v1/chat/completions", {"max_tokens": 8, "seed": 3, "tools": [
        {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters", "strict")}}],
        "messages": [{"role": "user", "content": "What is the weather in Paris?"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": call["call_id"], "type": "function",
                          "function": {"name": call["name"], "arguments": call["arguments"]}}]},
                     {"role": "tool", "tool_call_id": call["call_id"], "content": "Sunny, 21 C"}]})
    assert st == 200 and cb["usage"]["prompt_tokens"] == r2["usage"]["input_tokens"], (cb["usage"], r2["usage"])
    # a named tool_choice: the grammar makes the output that call
    short = dict(WEATHER, strict=True, parameters={"type": "object", "properties": {"city": {
        "type": "string", "maxLength": 12}}, "required": ["city"], "additionalProperties": False})
    st, r3, _ = e.http.post("/v1/responses", {"input": "Tell me of light.", "tools": [short], "max_output_tokens": 96,
                                              "tool_choice": {"type": "function", "name": "get_weather"}})
    fc = [it for it in r3["output"] if it["type"] == "function_call"]
    assert st == 200 and len(fc) == 1 and set(json.loads(fc[0]["arguments"])) == {"city"}, r3
    return "call %s" % call["call_id"]


STRICT = dict(WEATHER, strict=True, parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                               "required": ["city"], "additionalProperties": False})


def t_strict_auto(c):
    """strict: true with tool_choice auto: free text, then a call the
    grammar holds from its <tool_call> until its object closes. The test
    hook forces the model's text: a call after free text passes (the text
    before and the tag after are not under the grammar), a call whose
    arguments break the schema cannot be sampled (the mask leaves no
    token: the request fails instead of answering an invalid call)."""
    lyon = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>'
    rome = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 5}}\n</tool_call>'
    e = engine(c, "t", env={"BATON_TEST_FORCE": "weather in Lyon\t" + lyon + "\x1eweather in Rome\t" + rome})
    for strict in (False, True):
        tool = STRICT if strict else WEATHER
        st, b, _ = e.http.post("/v1/chat/completions", {"max_tokens": 64, "tools": [{"type": "function", "function": {
            k: tool[k] for k in ("name", "parameters", "strict")}}], "messages": [
            {"role": "user", "content": "What is the weather in Lyon?"}]})
        assert st == 200 and b["choices"][0]["finish_reason"] == "tool_calls", b
        m = b["choices"][0]["message"]
        assert m["content"].strip() == "Let me look." and json.loads(m["tool_calls"][0]["function"]["arguments"]) == \
            {"city": "Lyon"}, m
        st, b, _ = e.http.post("/v1/chat/completions", {"max_tokens": 64, "tools": [{"type": "function", "function": {
            k: tool[k] for k in ("name", "parameters", "strict")}}], "messages": [
            {"role": "user", "content": "What is the weather in Rome?"}]})
        if strict:
            assert st >= 400 and "sampling failed" in b["error"]["message"], (st, b)
        else:  # not strict: the call is parsed as the model wrote it
            assert st == 200 and json.loads(b["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == \
                {"city": 5}, b
    # the Responses API, streamed
    evs = events(e.http, {"input": "What is the weather in Lyon?", "tools": [STRICT], "max_output_tokens": 64,
                          "stream": True})
    final = check_sequence(evs)
    assert [it["type"] for it in final["output"]] == ["message", "function_call"], final["output"]
    return "strict call enforced after free text"


def t_structured(c):
    import jsonschema
    e = engine(c, "s")
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "old": {"type": "boolean"},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                        "maxItems": 3}},
              "required": ["name", "old", "tags"], "additionalProperties": False}
    n = 0
    for seed in range(6):
        st, r, _ = e.http.post("/v1/responses", {"input": "Tell me of light.", "max_output_tokens": 400, "seed": seed,
                                                 "text": {"format": {"type": "json_schema", "name": "p",
                                                                     "schema": schema, "strict": True}}})
        assert st == 200, r
        if r["status"] != "completed":
            continue
        jsonschema.validate(json.loads(message_text(r)), schema)
        assert r["text"]["format"]["type"] == "json_schema", r["text"]
        n += 1
    assert n >= 3, n
    st, r, _ = e.http.post("/v1/responses", {"input": "Tell me of light.", "max_output_tokens": 48,
                                             "text": {"format": {"type": "json_object"}}})
    assert st == 200 and (r["status"] != "completed" or isinstance(json.loads(message_text(r)), dict)), r
    return "%d of 6 valid and whole" % n


def t_errors(c):
    e = engine(c, "x")
    cases = [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
        ({"input": "x", "background": True}, "background", "not supported"),
        ({"input": "x", "truncation": "auto"}, "truncation", "disabled"),
        ({"input": [{"type": "computer_call", "id": "c"}]}, "input[0]", "computer_call"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]",
         "input_image"),
        ({"input": 5}, "input", "want a string"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", ""),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format", "xml"),
        ({"input": "x", "include": ["file_search_call.results"]}, "include", "not offered"),
        ({"input": "x", "store": "yes"}, "store", "true or false"),
        ({"input": [5]}, "input[0]", "input item"),
        ({"input": [{"type": "function_call"}]}, "input[0]", "call_id, name and arguments"),
        ({"input": [{"role": "user", "content": [5]}]}, "input[0].content[0]", "content part"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0]", "role: want user"),
        ({"input": [{"type": "function_call_output", "call_id": 1, "output": "x"}]}, "input[0]", "call_id: want a string"),
        ({"input": "x", "tools": "x"}, "tools", "array"),
        ({"input": "x", "tools": [5]}, "tools[0]", "want"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0]", "name: required"),
        ({"input": "x", "tool_choice": 5}, "tool_choice", "want"),
        ({"input": "x", "text": 5}, "text", "want an object"),
        ({"input": "x", "text": {"format": 5}}, "text.format", "want"),
        ({"input": "x", "reasoning": 5}, "reasoning", "want an object"),
        ({"input": "x", "include": "x"}, "include", "array"),
        ({"input": "x", "previous_response_id": 5}, "previous_response_id", "id"),
        ({"input": "x", "instructions": 5}, "instructions", "string"),
        ({"input": "x", "stream": 1}, "stream", "true or false"),
        ({"input": "x", "temperature": 9}, "temperature", "range"),
    ]
    for body, param, words in cases:
        st, b, _ = e.http.post("/v1/responses", body)
        assert st == 400 and b["error"]["param"] == param and words in b["error"]["message"], (body, st, b)
    for raw in (b"[]", b"not json", b"{\"input\": \"x\", \"input\": \"y\"}"):
        st, b, _ = e.http.post("/v1/responses", raw)
        assert st == 400 and "body" in b["error"]["message"], (raw, st, b)
    st, b, _ = e.http.post("/v1/responses", {"input": "x", "model": "nope"})
    assert st == 404 and b["error"]["code"] == "model_not_found", b
    st, b, _ = e.http.get("/v1/responses")
    assert st == 405, (st, b)
    # defaults SDKs send pass; a field outside the reference is counted
    st, b, _ = e.http.post("/v1/responses", {"input": "x", "max_output_tokens": 2, "store": True, "metadata": {"a": "b"},
                                             "truncation": "disabled", "parallel_tool_calls": True, "top_logprobs": 0,
                                             "include": ["reasoning.encrypted_content"], "service_tier": "auto",
                                             "reasoning": {"effort": "low", "summary": "auto"}, "frobnicate": 1,
                                             "text": {"format": {"type": "text"}, "verbosity": "medium"}})
    assert st == 200, b
    st, hb, _ = e.http.get("/health")
    assert hb["ignored_fields"]["responses.frobnicate"] >= 1, hb
    # the chat parser's words, in the Responses' names
    st, b, _ = e.http.post("/v1/responses", {"input": "x", "text": {"format": {
        "type": "json_schema", "name": "n", "schema": {"type": "integer", "minimum": 0}}}})
    assert st == 400 and b["error"]["param"].startswith("text.format.schema"), b
    assert b["error"]["message"].startswith("text.format.schema"), b
    return "%d refusals" % len(cases)


# Two more tool formats' templates on the tiny test model (just enough for
# oai_caps_of to know them: the template's text names the format)
CODER_TEMPLATE = ("{% if tools %}Tools:{% for t in tools %} {{ t.function.name }}{% endfor %}. Call as <tool_call>\n"
                  "<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>{% endif %}"
                  "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
                  "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MISTRAL_TEMPLATE = ("{% if tools %}[AVAILABLE_TOOLS]{% for t in tools %} {{ t.function.name }}{% endfor %}"
                    "[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{% endif %}"
                    "<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def t_strict_auto_formats(c):
    """strict: true with tool_choice auto for Qwen3-Coder's XML calls and
    Mistral's [TOOL_CALLS] array, as t_strict_auto for Hermes: a call
    after free text passes, a call that breaks the schema cannot be
    sampled (strict), or is parsed as written (not strict)."""
    strict = {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"], "additionalProperties": False}}
    cases = {
        "coder": (CODER_TEMPLATE,
                  "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLyon\n</parameter>\n"
                  "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                  "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
                  "<parameter=days>\nmany\n</parameter>\n</function>\n</tool_call>", {"city": "Rome", "days": "many"}),
        "mistral": (MISTRAL_TEMPLATE,
                    'Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon", "days": 3}}]',
                    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": 5}}]', {"city": 5}),
    }
    for name, (tmpl, lyon, rome, rome_args) in cases.items():
        e = c.engine(name, "--ctx", "1024", "--http", "127.0.0.1:0", arena=h.tiny_model_arena(tmpl, "tiny-" + name),
                     broker=False, host_mib=16, segment_mib=2,
                     env={"BATON_TEST_FORCE": "weather in Lyon\t" + lyon + "\x1eweather in Rome\t" + rome})
        e.http = h.Http(e.stdout.readline().split()[1])
        for is_strict in (False, True):
            fn = dict(strict, strict=is_strict)
            body = {"max_tokens": 200, "tools": [{"type": "function", "function": fn}]}
            st, b, _ = e.http.post("/v1/chat/completions", dict(body, messages=[
                {"role": "user", "content": "What is the weather in Lyon?"}]))
            assert st == 200 and b["choices"][0]["finish_reason"] == "tool_calls", (name, b)
            m = b["choices"][0]["message"]
            assert m["content"].strip() == "Let me look." and json.loads(
                m["tool_calls"][0]["function"]["arguments"]) == {"city": "Lyon", "days": 3}, (name, m)
            st, b, _ = e.http.post("/v1/chat/completions", dict(body, messages=[
                {"role": "user", "content": "What is the weather in Rome?"}]))
            if is_strict:
                assert st >= 400 and "sampling failed" in b["error"]["message"], (name, st, b)
            else:
                assert st == 200 and json.loads(b["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) \
                    == rome_args, (name, b)
        e.terminate()
        e.wait(10)
    return "qwen3_coder and mistral calls held to their schema"


FORCED_JSON = '{"name": "Noah", "old": true}'
FORCE = "weather in Paris\t" + FORCED_CALL + "\x1eDescribe Noah\t" + FORCED_JSON


def node_suite(url, model, token=None, env=None):
    dest = h.npm_client()
    p = subprocess.run(["node", os.path.join(dest, "sdks.mjs"), url, model], capture_output=True, text=True,
                       timeout=180, env=dict(os.environ, BATON_TOKEN=token or "none", **(env or {})))
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads(p.stdout)


def alone(http_, model=MODEL):
    """What raw HTTP gets for sdks.mjs's plain requests: the response
    (with instructions, 16 tokens), the chat's text of 12 and of 64 tokens."""
    st, r, _ = http_.post("/v1/responses", {"model": model, "input": "Tell me of light.", "instructions": "Be brief.",
                                            "max_output_tokens": 16, "temperature": 0})
    assert st == 200, r
    texts = {"responses": message_text(r)}
    for n in (12, 64):
        st, b, _ = http_.post("/v1/chat/completions", {"model": model, "max_tokens": n, "temperature": 0,
                                                       "messages": [{"role": "user", "content": "Tell me of light."}]})
        assert st == 200, b
        texts[n] = b["choices"][0]["message"]["content"]
    return texts


def check_sdks(got, want, tools=True):
    # tools False: sdks.mjs ran with BATON_SDK_PLAIN (the text cases only)
    """What the clients got (sdks.mjs), against what raw HTTP gets alone
    (want: alone()). Returns what was skipped (a case sdks.mjs could not run
    on this Node, and why), for the test's line: "" when nothing was."""
    bad = {k: v["error"] for k, v in got.items() if isinstance(v, dict) and "error" in v}
    assert not bad, json.dumps(bad, indent=1)[:6000]
    skipped = {k: v["skipped"] for k, v in got.items() if isinstance(v, dict) and "skipped" in v}
    # only the cases sdks.mjs knows a reason for, and only on a Node that has it
    assert all(k.startswith("lc_structured_") for k in skipped), skipped
    r = got["responses"]
    assert r["object"] == "response" and r["text"] == want["responses"], (r, want)
    assert r["status"] in ("completed", "incomplete"), r
    s = got["responses_stream"]
    assert s["text"] == want["responses"] and s["helper_text"] == want["responses"] and s["final"] == r["usage"], (s, r)
    assert s["types"][:2] == ["response.created", "response.in_progress"], s["types"]
    lp = got["responses_logprobs"]  # include message.output_text.logprobs through the client
    assert lp["tokens"] and all(n == 2 for n in lp["tops"]), lp
    # a token that ends mid-character reads as U+FFFD alone (the tiny model's random bytes)
    assert not tools or "\ufffd" in "".join(lp["tokens"]) or "".join(lp["tokens"]) == lp["text"], lp
    t = got.get("responses_tools") if tools else {"name": "get_weather", "arguments": '{"city": "Paris"}',
                                                  "streamed_args": '{"city": "Paris"}', "answer_calls": 0}
    assert t["name"] == "get_weather" and json.loads(t["arguments"]) == {"city": "Paris"}, t
    assert json.loads(t["streamed_args"]) == {"city": "Paris"} and t["answer_calls"] == 0, t
    for k in ("responses_format", "chat_format") if tools else ():
        assert json.loads(got[k]["text"]) == json.loads(FORCED_JSON), (k, got[k])
    for name in ("default", "chat", "compatible"):
        g = got["ai_text_" + name]
        assert g["text"] == want[12] and g["usage"]["output"] > 0, (name, g, want)
        g = got["ai_stream_" + name]
        assert g["text"] == want[12] and g["parts"] >= 2, (name, g)
        g = got["ai_tools_" + name] if tools else {"calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
                                                   "results": ["Sunny in Paris"], "steps": 2, "finish0": "tool-calls"}
        assert g["calls"] == [{"name": "get_weather", "input": {"city": "Paris"}}], (name, g)
        assert g["results"] == ["Sunny in Paris"] and g["steps"] == 2 and g["finish0"] == "tool-calls", (name, g)
        if tools:
            g = got["ai_stream_tools_" + name]
            assert g["calls"] == [{"name": "get_weather", "input": {"city": "Paris"}}], (name, g)
            assert g["parts"] == ["tool-call", "tool-result"] and g["steps"] == 2, (name, g)
        g = got["ai_object_" + name] if tools else {"object": json.loads(FORCED_JSON)}
        assert g["object"] == json.loads(FORCED_JSON), (name, g)
    for name in ("chat", "responses"):
        assert got["lc_invoke_" + name]["text"] == want[64], (got["lc_invoke_" + name], want)
        assert not tools or got["lc_tools_" + name]["calls"] == [{"name": "get_weather", "args": {"city": "Paris"}}], got
        assert not tools or "lc_structured_" + name in skipped or \
            got["lc_structured_" + name]["object"] == json.loads(FORCED_JSON), got
    return "; SKIPPED %s: %s" % (", ".join(sorted(skipped)), sorted(set(skipped.values()))[0]) if skipped else ""


def t_sdks(c):
    """The openai client's responses.create, the AI SDK (its default
    provider calls /v1/responses) and LangChain, unchanged (tests/node)."""
    if h.SAN:
        # the sanitizers' pass: these are the npm clients (node's own code)
        # over the same endpoints the other cases drive under ASan here;
        # the plain pass runs them (make test's time, docs/internals/testing.md)
        return "skipped under the sanitizers (the plain pass runs the clients)"
    e = engine(c, "t", env={"BATON_TEST_FORCE": FORCE})
    got = node_suite(e.http.url, MODEL)
    skipped = check_sdks(got, alone(e.http))
    return "%d cases; openai %s, ai %s, @langchain/openai %s%s" % (len(got), *h.npm_versions("openai", "ai",
                                                                                           "@langchain/openai"),
                                                                   skipped)


def t_sdks_door(c):
    """The same clients through the broker's front door, which routes
    /v1/responses by model like the chat: both trained models' engines on
    one device (the door switches it), kjv-mixtral with the text cases
    only (its template takes no tools; see sdks.mjs)."""
    if h.SAN:
        # the sanitizers' pass: these are the npm clients (node's own code)
        # over the same endpoints the other cases drive under ASan here;
        # the plain pass runs them (make test's time, docs/internals/testing.md)
        return "skipped under the sanitizers (the plain pass runs the clients)"
    http = c.http_broker("")
    flags = ("--ctx", "768", "--vram-elastic", "--http", "127.0.0.1:0", "--http-token-file",
             h.engine_token_file(c.dir))
    for name, m in (("qwen", MODEL), ("mixtral", MIXTRAL)):
        c.engine(name, *flags, arena=h.model_arena(m), host_mib=24, segment_mib=2, env={"BATON_TEST_FORCE": FORCE})
    h.wait_for("both engines routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    n, skipped = 0, ""
    for name, m in (("qwen", MODEL), ("mixtral", MIXTRAL)):
        got = node_suite(http.url, m, token=http.token, env={"BATON_SDK_PLAIN": "1"} if name == "mixtral" else {})
        skipped = check_sdks(got, alone(h.Http(c.eng(name)["http"], h.ENGINE_TOKEN), m), tools=name == "qwen") or \
            skipped
        n += len(got)
    return "%d cases through the door%s" % (n, skipped)


if __name__ == "__main__":
    for p in (h.ENGINE, h.ARENA, h.CLI, h.BROKER):
        h.need(p)
    sys.exit(h.run_cases([t_text, t_previous_response, t_logprobs_and_delete, t_tools, t_strict_auto, t_strict_auto_formats, t_structured, t_errors, t_sdks, t_sdks_door], only=sys.argv[1:],
                         logs=("r", "t", "s", "x", "broker", "qwen", "mixtral")))
