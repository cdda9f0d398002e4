#!/usr/bin/python3
"""structured_test.py: structured output (response_format) end to end on
an engine with a trained demo model of models/ (host backend), whose
answers to JSON requests are as good as random: only the token mask makes
them valid.

  - 240 random JSON schemas (60 in the sanitizer pass; the keywords
    text/grammar/ takes),
    each sent as response_format json_schema, four requests at a time:
    every answer ends ("stop"), parses, and validates against its schema
    with the `jsonschema` package (Debian's python3-jsonschema, Draft
    2020-12), and the same seed gives the same answer streamed;
  - on the Mixtral demo model (SentencePiece pieces), whose vocabulary
    cannot spell '"', '{' or digits: what it can spell is valid, the rest
    a 400 that says so;
  - through the broker's front door, the same;
  - json_object: what ends is a JSON object;
  - a schema the compiler cannot enforce is a 400 naming the keyword's
    JSON pointer; text is plain text; unknown types are refused.
The last line is "N passed, N failed".
"""
import json
import os
import random
import sys
import threading

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODEL = "kjv-qwen3-moe"
# under ASan the host forward pass is about ten times slower: fewer there
SCHEMAS = 60 if h.SAN else 240


def engine(c, name, model=MODEL):
    p = c.engine(name, "--ctx", "2048", "--http", "127.0.0.1:0", arena=h.model_arena(model),
                 broker=False, host_mib=64, segment_mib=2)
    line = p.stdout.readline()
    assert line.startswith("http: http://127.0.0.1:"), line
    p.http = h.Http(line.split()[1])
    return p


def ask(e, schema=None, rf=None, seed=1, stream=False, max_tokens=1500, model=MODEL):
    if rf is None:
        rf = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}
    body = {"model": model, "messages": [{"role": "user", "content": "Answer in JSON."}], "seed": seed,
            "temperature": 1.0, "max_tokens": max_tokens, "response_format": rf, "stream": stream}
    if stream:
        ev, _ = e.http.sse("/v1/chat/completions", body)
        assert ev[-1] == "[DONE]", ev[-3:]
        text = "".join(x["choices"][0]["delta"].get("content", "") for x in ev[:-1] if x["choices"])
        fin = [x["choices"][0]["finish_reason"] for x in ev[:-1] if x["choices"]][-1]
        return 200, text, fin
    st, b, _ = e.http.post("/v1/chat/completions", body, timeout=120)
    if st != 200:
        return st, b, None
    return st, b["choices"][0]["message"]["content"], b["choices"][0]["finish_reason"]


# ---- random schemas whose documents are bounded (every string has a
# maxLength, every array a maxItems): a random model ends them all ----
def gen(r, depth, defs):
    k = r.randrange(13 if depth > 0 else 7)
    s = {}
    if k == 0:
        s = {"type": "string", "maxLength": r.randrange(12)}
        if r.random() < 0.4:
            s["minLength"] = r.randrange(s["maxLength"] + 1)
    elif k == 1:
        s = {"type": "integer"}
    elif k == 2:
        s = {"type": "number"}
    elif k == 3:
        s = {"type": "boolean"}
    elif k == 4:
        s = {"type": "null"}
    elif k == 5:
        vals = list({json.dumps(v): v for v in
                     [r.choice(["red", "green", "blue", "a\"b", "\u00e9t\u00e9", 7, -3, 2.5, True, None])
                      for _ in range(1 + r.randrange(4))]}.values())
        s = {"enum": vals} if r.random() < 0.7 else {"const": vals[0]}
    elif k == 6:
        s = {"type": ["string", "null"], "maxLength": r.randrange(8)}
    elif k in (7, 8):
        s = {"type": "array", "items": gen(r, depth - 1, defs), "maxItems": r.randrange(4)}
        if r.random() < 0.3:  # a tuple
            s["prefixItems"] = [gen(r, depth - 1, defs) for _ in range(1 + r.randrange(3))]
            if r.random() < 0.5:
                s["items"] = False
        if r.random() < 0.5:
            s["minItems"] = r.randrange(s["maxItems"] + 1)
            if s.get("items") is False:
                s["minItems"] = min(s["minItems"], len(s["prefixItems"]))
    elif k in (9, 10):
        props = {}
        for i in range(r.randrange(1, 5)):
            props[r.choice(["name", "age", "tags", "x", "long key", "\u00fcber", "q\"uote"]) + str(i)] = \
                gen(r, depth - 1, defs)
        keys = list(props)
        s = {"type": "object", "properties": props,
             "required": [x for x in keys if r.random() < 0.6], "additionalProperties": False}
        if r.random() < 0.3:
            del s["additionalProperties"]
    elif k == 11:
        s = {"anyOf": [gen(r, depth - 1, defs) for _ in range(2)]}
    else:
        name = "d%d" % len(defs)
        defs[name] = None
        defs[name] = gen(r, depth - 1, defs)
        s = {"$ref": "#/$defs/" + name}
    if r.random() < 0.15:
        s["description"] = "a field"
    return s


def random_schema(r):
    defs = {}
    s = gen(r, 3, defs)
    if defs:
        s = {"allOf": [s], "$defs": defs} if "$ref" in s or "anyOf" in s or "enum" in s or "const" in s \
            else dict(s, **{"$defs": defs})
    return s


def t_random_schemas_validate(c):
    import jsonschema
    e = engine(c, "q")
    r = random.Random(2511)
    schemas = [random_schema(r) for _ in range(SCHEMAS)]
    for s in schemas:
        jsonschema.Draft202012Validator.check_schema(s)
    results = [None] * len(schemas)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(schemas):
                return
            results[i] = ask(e, schemas[i], seed=i)

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    tokens = 0
    for s, (st, text, fin) in zip(schemas, results):
        assert st == 200, (st, text, s)
        assert fin == "stop", (fin, text[-200:], s)
        doc = json.loads(text)
        jsonschema.validate(doc, s, cls=jsonschema.Draft202012Validator)
        tokens += len(text)
    # streamed, the same answer
    for i in range(3):
        st, text, fin = ask(e, schemas[i], seed=i, stream=True)
        assert (text, fin) == results[i][1:], (text, results[i])
    return "%d schemas, %d answers valid (%d bytes)" % (len(schemas), len(schemas), tokens)


def t_sentencepiece_model(c):
    """The Mixtral demo model: SentencePiece pieces (a leading space as
    U+2581) whose vocabulary, trained on the KJV, has no piece for '"',
    '{', '[' or a digit (its byte pieces are special tokens, never text):
    the values it can spell are constrained and valid, and a schema that
    needs more is refused with a sentence, not a broken answer."""
    import jsonschema
    model = "kjv-mixtral"
    e = engine(c, "q", model=model)
    schemas = [{"type": "boolean"}, {"type": "null"}, {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
               {"type": ["null", "boolean"], "description": "x"}, {"enum": [True, None]}]
    for i in range(20):
        s = schemas[i % len(schemas)]
        st, text, fin = ask(e, s, seed=i, model=model, max_tokens=100)
        assert st == 200 and fin == "stop", (st, fin, text, s)
        jsonschema.validate(json.loads(text), s, cls=jsonschema.Draft202012Validator)
    for s in ({"type": "object"}, {"type": "integer"}):
        st, b, _ = ask(e, s, model=model)
        assert st == 400 and "cannot spell" in b["error"]["message"], (st, b)
    return "20 answers valid; objects and integers refused: the vocabulary cannot spell them"


def t_front_door(c):
    """Through the broker's front door: response_format rides in the body
    to the engine; answers validate, a refusal keeps its param."""
    import jsonschema
    http = c.http_broker()
    c.engine("q", "--ctx", "2048", "--http", "127.0.0.1:0", arena=h.model_arena(MODEL), host_mib=64,
             segment_mib=2)
    h.wait_for("the engine routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    r = random.Random(9)
    for i in range(10):
        s = random_schema(r)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "JSON, please."}], "seed": i,
                "max_tokens": 1500, "response_format": {"type": "json_schema", "json_schema": {
                    "name": "x", "schema": s}}}
        st, b, _ = http.post("/v1/chat/completions", body, timeout=120)
        assert st == 200 and b["choices"][0]["finish_reason"] == "stop", (st, b, s)
        jsonschema.validate(json.loads(b["choices"][0]["message"]["content"]), s,
                            cls=jsonschema.Draft202012Validator)
    body["response_format"]["json_schema"]["schema"] = {"type": "string", "format": "email"}
    st, b, _ = http.post("/v1/chat/completions", body)
    assert st == 400 and b["error"]["param"] == "response_format.json_schema.schema", (st, b)
    assert "#/format:" in b["error"]["message"], b
    return "10 answers valid through the door"


def t_json_object(c):
    e = engine(c, "q")
    ended = 0
    for seed in range(8):
        st, text, fin = ask(e, rf={"type": "json_object"}, seed=seed, max_tokens=400)
        assert st == 200, text
        if fin == "stop":
            assert isinstance(json.loads(text), dict), text
            ended += 1
        else:
            assert fin == "length" and text.lstrip().startswith("{"), (fin, text)
    return "%d of 8 ended within 400 tokens, each an object" % ended


def t_refusals(c):
    e = engine(c, "q")
    cases = [
        ({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}},
         "#/properties/id/pattern", "unsupported_parameter"),
        ({"type": "integer", "minimum": 0}, "#/minimum", "unsupported_parameter"),
        ({"type": "array", "items": {"$ref": "#/$defs/none"}}, "#/items/$ref", None),
        ({"oneOf": [{"type": "number"}, {"type": "integer"}]}, "#/oneOf", "unsupported_parameter"),
    ]
    for schema, ptr, code in cases:
        st, b, _ = ask(e, schema)
        assert st == 400, (st, b)
        err = b["error"]
        assert err["param"] == "response_format.json_schema.schema" and ptr + ":" in err["message"], err
        assert err["code"] == code, err
    st, b, _ = ask(e, rf={"type": "xml"})
    assert st == 400 and b["error"]["param"] == "response_format.type", b
    st, b, _ = ask(e, rf={"type": "json_schema"})
    assert st == 400 and b["error"]["param"] == "response_format.json_schema", b
    # text is free text, as without the field
    st, text, fin = ask(e, rf={"type": "text"}, max_tokens=20)
    st2, b, _ = e.http.post("/v1/chat/completions", {"model": MODEL, "seed": 1, "temperature": 1.0,
                                                      "max_tokens": 20, "messages": [
                                                          {"role": "user", "content": "Answer in JSON."}]})
    assert st == st2 == 200 and text == b["choices"][0]["message"]["content"], (text, b)
    # /v1/completions takes it too
    st, b, _ = e.http.post("/v1/completions", {"model": MODEL, "prompt": "In the beginning", "seed": 3,
                                                "max_tokens": 600, "response_format": {
                                                    "type": "json_schema", "json_schema": {"name": "n", "schema": {
                                                        "type": "object", "properties": {"n": {"type": "integer"}},
                                                        "required": ["n"], "additionalProperties": False}}}})
    assert st == 200 and b["choices"][0]["finish_reason"] == "stop", b
    assert isinstance(json.loads(b["choices"][0]["text"])["n"], int), b


if __name__ == "__main__":
    for p in (h.ENGINE, h.ARENA, h.BROKER):
        h.need(p)
    sys.exit(h.run_cases([t_random_schemas_validate, t_sentencepiece_model, t_front_door, t_json_object,
                          t_refusals], only=sys.argv[1:],
                         logs=("q", "broker")))
