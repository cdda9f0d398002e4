#!/usr/bin/python3
"""door_test.py: the broker's OpenAI front door (docs/reference/front-door.md), end
to end on the host backend with the two trained models of models/.

  - engines register their model and OpenAI HTTP URL; status shows them;
    a URL that is not http:// is refused, an engine without one still
    registers;
  - unknown model: 404 in OpenAI's shape; bad bodies: 400; no token: 401;
    GET /v1/models lists every model with its state and engines;
  - two models on one device that holds one: interleaved chat requests
    from four clients through the door; every answer equals what that
    engine gives alone for the same seed; none lost; the device switched
    far fewer times than requests (batches, not thrash); the switches are
    in /metrics and in door.switch events with their timings;
  - a stream passes through piece by piece; a client that leaves
    mid-stream frees the engine's sequence; an engine killed mid-stream
    ends it with an error event and without the chunked end;
  - the body limit is the engines' (1 MiB), and an engine's 413 is passed
    on;
  - a full queue answers 503 with Retry-After;
  - every answer is counted by the engine's usage report: a batch (n > 1,
    a prompt list) and a Responses answer, whole and streamed.
  - GET and DELETE /v1/responses/ID and previous_response_id reach the
    engine that keeps the response (of two engines of one model, scripted;
    and a real engine's), an id the door does not know is 404 there;
  - the npm clients (openai, the AI SDK, LangChain, ollama,
    @anthropic-ai/sdk) on the tiny test model, against its engine and
    through the door.
The last line is "N passed, N failed".
"""
import http.client as http_client
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

MODELS = os.path.join(ROOT, "models")
QWEN, MIXTRAL = "kjv-qwen3-moe", "kjv-mixtral"
QUESTIONS = ["Who was Noah?", "What did Moses see on the mountain?", "Tell of the flood.",
             "Who built the ark?", "What is the law?", "Who was Abraham's son?"]


def model_arena(c, model):
    return h.model_arena(model)


def two_engines(c, config="", host_mib=18):
    """A broker with HTTP, and the two models' engines with --http on one
    device that holds the experts of one of them."""
    http = c.http_broker(config)
    flags = ("--ctx", "512", "--vram-elastic", "--http", "127.0.0.1:0", "--http-token-file",
             h.engine_token_file(c.dir))
    c.engine("qwen", *flags, arena=model_arena(c, QWEN), host_mib=host_mib, segment_mib=2)
    c.engine("mixtral", *flags, arena=model_arena(c, MIXTRAL), host_mib=host_mib, segment_mib=2)
    h.wait_for("both engines routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    return http


def engine_http(c, name):
    """The engine's own OpenAI HTTP, as its owner (two_engines' token)."""
    return h.Http(c.eng(name)["http"], h.ENGINE_TOKEN)


def chat_body(model, question, seed, max_tokens=12, stream=False, no_eos=False):
    """no_eos: the EOS (2 in both demo models) banned, so the answer runs
    max_tokens: one that must still run while a case looks (their answers
    end in some 40 tokens, 50 ms)."""
    body = {"model": model, "messages": [{"role": "user", "content": question}], "seed": seed,
            "temperature": 0.8, "max_tokens": max_tokens, "stream": stream}
    if no_eos:
        body["logit_bias"] = {"2": -100}
    return body


def text_of(status_body):
    st, body, _ = status_body
    assert st == 200, (st, body)
    return body["choices"][0]["message"]["content"]


def bare(usage):
    """The usage without prompt_tokens_details (a prompt sent again finds its blocks cached)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def metric(http, name, labels=""):
    st, text, _ = http.get("/metrics")
    assert st == 200, st
    m = re.search(r"^%s%s (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(m.group(1)) if m else None


def door_idle(http):
    """Waits until the door has no request forwarded: a request is counted
    just after its last byte reached its client, in the same step that ends
    its in-flight count."""
    def idle():
        st, text, _ = http.get("/metrics")
        return st == 200 and all(float(v) == 0 for v in re.findall(r"^baton_door_in_flight\{.*\} (\S+)$", text, re.M))
    h.wait_for("the door's requests all counted", idle)


# ---- registration ------------------------------------------------------------

def t_register_fields(c):
    c.broker()
    base = dict(pid=os.getpid(), gpu="host-7", device=7, ctl="ipc://%s/x.sock" % c.dir, floor=1 << 20,
                ceiling=8 << 20, priority=0, state="released", resident=0, capacity=64 << 20, epoch=1)
    h.ok(h.call(c.control, "register", name="fresh", model="m1", http="http://127.0.0.1:9", **base))
    h.ok(h.call(c.control, "register", name="ftp", model="m2", http="ftp://x", **base))
    h.ok(h.call(c.control, "register", name="old", model="m3", **base))  # an engine without the field
    got = {e["name"]: (e["model"], e["http"]) for e in c.status()["engines"]}
    assert got == {"fresh": ("m1", "http://127.0.0.1:9"), "ftp": ("m2", ""), "old": ("m3", "")}, got
    assert "http 'ftp://x' is not an http:// URL" in open(c.log("broker")).read()
    # and `baton status` says who serves what (the dead fakes aside)
    p = subprocess.run([h.CLI, "status"], capture_output=True, text=True, env=dict(c.env, BATON_BROKER=c.control))
    assert p.returncode == 0, p.stderr


# ---- a scripted engine: the door alone, with replies it controls --------------

FAKE_BODY_MAX = 900 << 10  # a fake engine refuses larger bodies on their headers


class Fake:
    """An OpenAI HTTP server that stands for an engine: streamed replies in
    pieces the test lets go one by one (`go`), whole replies with a length;
    it records what it was sent and sees a client that leaves."""

    def __init__(self, name):
        self.name, self.got, self.closed_early = name, [], 0
        self.kept = {}  # /v1/responses: the responses it stores, by id
        self.go = threading.Semaphore(0)
        self.inflight = 0
        self.lock = threading.Lock()
        fake = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def reply(self, status, obj):
                out = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def stored(self, delete):
                # GET and DELETE /v1/responses/ID: what it keeps, as an engine does
                rid = self.path[len("/v1/responses/"):]
                with fake.lock:
                    fake.got.append((("DELETE " if delete else "GET ") + self.path, None, dict(self.headers)))
                    kept = fake.kept.pop(rid, None) if delete else fake.kept.get(rid)
                if kept is None:
                    self.reply(404, {"error": {"message": "response '%s' is not kept" % rid, "code": "not_found",
                                               "type": "invalid_request_error", "param": None}})
                elif delete:
                    self.reply(200, {"id": rid, "object": "response", "deleted": True})
                else:
                    self.reply(200, kept)

            def do_GET(self):
                self.stored(False)

            def do_DELETE(self):
                self.stored(True)

            def do_POST(self):
                if int(self.headers["Content-Length"]) > FAKE_BODY_MAX:
                    # refused on its headers, before the body is read, and
                    # the connection closed: as the engine's server does
                    out = json.dumps({"error": {"message": "too large", "type": "invalid_request_error",
                                                "param": None, "code": "too_big"}}).encode()
                    self.send_response(413)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(out)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.got.append((self.path, body, dict(self.headers)))
                    fake.inflight += 1
                try:
                    if self.path == "/v1/responses":
                        # a response, kept unless store is false; streamed:
                        # response.created first, as an engine's
                        if body.get("hold"):
                            fake.go.acquire(timeout=30)
                        with fake.lock:
                            rid = "resp_%s_%d" % (fake.name, len(fake.got))
                            resp = {"id": rid, "object": "response", "engine": fake.name,
                                    "store": body.get("store", True), "status": "completed",
                                    "previous_response_id": body.get("previous_response_id")}
                            if resp["store"]:
                                fake.kept[rid] = resp
                        if not body.get("stream"):
                            self.reply(200, resp)
                            return
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for k, t in enumerate(("response.created", "response.in_progress", "response.completed")):
                            ev = {"type": t, "sequence_number": k, "response": resp}
                            piece = ("event: %s\ndata: %s\n\n" % (t, json.dumps(ev))).encode()
                            # the first event cut in two writes: the door holds it until whole
                            for part in ((piece[:20], piece[20:]) if k == 0 else (piece,)):
                                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                                self.wfile.flush()
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                    elif body.get("stream"):
                        self.send_response(200)
                        self.send_header("Content-Type", "text/event-stream")
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        for i in range(body.get("pieces", 3)):
                            if i:
                                fake.go.acquire(timeout=30)
                            piece = ("data: %s\n\n" % json.dumps({"engine": fake.name, "i": i})).encode()
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                            self.wfile.flush()
                        if body.get("die"):
                            # the engine dies mid-stream: its connection
                            # ends without the chunked end
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        self.wfile.write(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")
                        self.wfile.flush()
                    else:
                        if body.get("hold"):
                            fake.go.acquire(timeout=30)
                        out = json.dumps({"engine": fake.name, "echo": body}).encode()
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(out)))
                        self.end_headers()
                        self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    with fake.lock:
                        fake.closed_early += 1
                finally:
                    with fake.lock:
                        fake.inflight -= 1

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


def fake_broker(c, config=""):
    """A broker whose control socket is tcp:// (the fakes register from
    this process, by its pid) with a token set, and HTTP."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c.control = "tcp://127.0.0.1:%d" % port
    return c.http_broker("heartbeat_timeout_ms = 3600000\nhttp_token = door-test-token\n" + config,
                         token="door-test-token")


def fake_register(c, fake, model, state="ready", gpu="host-5"):
    h.ok(h.call(c.control, "register", name=fake.name, pid=os.getpid(), gpu=gpu, device=5,
                model=model, ctl="tcp://127.0.0.1:1", floor=1 << 20, ceiling=8 << 20, priority=0,
                state=state, resident=(8 << 20) if state == "ready" else 0, capacity=64 << 20, epoch=1,
                mapped=(8 << 20) if state == "ready" else 0, http=fake.url))


def t_fake_stream_passes_through(c):
    http = fake_broker(c)
    f = Fake("f1")
    try:
        fake_register(c, f, "m")
        h.wait_for("routable", lambda: http.get("/v1/models", token=False)[1]["data"])
        s = open_stream(http, {"model": "m", "stream": True, "pieces": 3, "extra": [1, 2]})
        got = b""
        # each piece arrives before the engine sends the next
        for i in range(3):
            while ('"i": %d' % i).encode() not in got:
                chunk = s.recv(4096)
                assert chunk, got
                got += chunk
            if i < 2:
                f.go.release()
        while b"[DONE]" not in got:
            chunk = s.recv(4096)
            assert chunk, got
            got += chunk
        s.close()
        # the body went to the engine as it was sent, without the broker's token
        path, body, hdrs = f.got[0]
        assert path == "/v1/chat/completions" and body == {"model": "m", "stream": True, "pieces": 3,
                                                           "extra": [1, 2]}, f.got[0]
        assert "Authorization" not in hdrs, hdrs
        # a whole reply: as the engine sent it, its length and type
        st, body, hdrs = http.post("/v1/completions", {"model": "m", "prompt": "x"})
        assert st == 200 and body["engine"] == "f1" and body["echo"]["prompt"] == "x", (st, body)
        assert f.got[1][0] == "/v1/completions"
        # chats are larger than the broker's own calls (64 KiB): up to 1 MiB
        st, body, _ = http.post("/v1/completions", {"model": "m", "prompt": "x" * (300 << 10)})
        assert st == 200 and len(body["echo"]["prompt"]) == 300 << 10, st
        # and above it 413 on the headers, before a byte of the body is read:
        # the engines' limit, so that the door never forwards what they refuse
        # (it took 2 MiB, and turned the engine's 413 into 502)
        for size, want in ((1 << 20, 0), ((1 << 20) + 1, 413)):
            got = http.raw(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                           b"door-test-token\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                           % size, timeout=2)
            assert got == want, (size, got)
        st, body, _ = http.get("/v1/models", token=False)
        m = body["data"][0]
        assert m["id"] == "m" and m["state"] == "resident" and m["engines"][0]["name"] == "f1", m
        h.wait_for("in flight back to 0", lambda: metric(http, "baton_door_in_flight",
                                                          '{engine="f1",model="m"}') == 0)
        assert metric(http, "baton_door_requests_total", '{model="m",outcome="served"}') == 3
        assert metric(http, "baton_door_ttft_prefill_seconds_count", '{model="m"}') == 1  # the stream
    finally:
        f.close()


def t_fake_cut_and_refused(c):
    """An engine that dies mid-stream: through the door the client gets an
    error event and a body without its end (it raises), never a stream that
    looks complete. An engine's 413, sent before it read the body: passed on
    as it is, not as 502 engine_unreachable (which SDKs retry)."""
    http = fake_broker(c)
    f = Fake("f1")
    try:
        fake_register(c, f, "m")
        h.wait_for("routable", lambda: http.get("/v1/models", token=False)[1]["data"])
        f.go.release()
        f.go.release()
        s = open_stream(http, {"model": "m", "stream": True, "pieces": 3, "die": True})
        raw = h.read_to_eof(s)
        s.close()
        data, ended = h.chunks_of(raw)
        assert not ended and not raw.endswith(b"0\r\n\r\n"), raw[-200:]
        ev = h.sse_events(data)
        assert [e["i"] for e in ev[:3]] == [0, 1, 2], ev
        assert len(ev) == 4 and ev[3]["error"]["code"] == "engine_unreachable", ev
        assert ev[3]["error"]["type"] == "server_error", ev
        # as an HTTP client reads it: an incomplete body
        for _ in range(2):
            f.go.release()
        conn = http_client_conn(http)
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "m", "stream": True, "die": True}),
                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + http.token})
        r = conn.getresponse()
        assert r.status == 200, r.status
        try:
            r.read()
            raise AssertionError("the cut stream read as complete")
        except http_client.IncompleteRead:
            pass
        conn.close()
        h.wait_for("in flight back to 0", lambda: metric(http, "baton_door_in_flight",
                                                          '{engine="f1",model="m"}') == 0)
        # counted by the proxy after the body is cut: waited for, not read at once
        h.wait_for("both cuts counted failed", lambda: metric(
            http, "baton_door_requests_total", '{model="m",outcome="failed"}') == 2)
        # the engine's 413, on a body the door takes and the engine does not
        st, body, _ = http.post("/v1/completions", {"model": "m", "prompt": "x" * (FAKE_BODY_MAX + 10)})
        assert st == 413 and body["error"]["code"] == "too_big", (st, body)
    finally:
        f.close()


def http_client_conn(http):
    return http_client.HTTPConnection(http.host, http.port, timeout=30)


def t_fake_least_loaded_and_disconnect(c):
    http = fake_broker(c)
    fa, fb = Fake("fa"), Fake("fb")
    try:
        fake_register(c, fa, "m")
        fake_register(c, fb, "m")
        h.wait_for("routable", lambda: len(http.get("/v1/models", token=False)[1]["data"][0]["engines"]) == 2
                   if http.get("/v1/models", token=False)[1]["data"] else False)
        results = []
        ts = [threading.Thread(target=lambda: results.append(http.post(
            "/v1/chat/completions", {"model": "m", "hold": True}, timeout=60))) for _ in range(4)]
        for t in ts:
            t.start()
        h.wait_for("four held", lambda: fa.inflight + fb.inflight == 4)
        assert fa.inflight == 2 and fb.inflight == 2, (fa.inflight, fb.inflight)
        for _ in range(2):
            fa.go.release()
            fb.go.release()
        for t in ts:
            t.join(30)
        assert [r[0] for r in results] == [200] * 4, results
        # a client that leaves mid-stream: the engine's connection closes at once
        s = open_stream(http, {"model": "m", "stream": True, "pieces": 50})
        assert s.recv(4096)
        s.close()
        h.wait_for("the door's in-flight ended", lambda: metric(
            http, "baton_door_in_flight", '{engine="fa",model="m"}') == 0 and metric(
            http, "baton_door_in_flight", '{engine="fb",model="m"}') == 0, timeout=10)
        for _ in range(60):
            fa.go.release()
            fb.go.release()
        h.wait_for("the engine saw its client leave", lambda: fa.closed_early + fb.closed_early == 1, timeout=10)
    finally:
        fa.close()
        fb.close()


def t_fake_refill_fails(c):
    """A released engine whose refill cannot happen (its control socket
    answers nothing): the waiting requests get 503 with the reason, and
    door.refill_failed is published; the queue bound answers 503 too."""
    http = fake_broker(c, "command_timeout_ms = 2000\nacquire_wait_ms = 2000\ndoor_queue_max = 2\n")
    f = Fake("cold")
    try:
        fake_register(c, f, "m", state="released")
        h.wait_for("routable", lambda: http.get("/v1/models", token=False)[1]["data"])
        st, body, _ = http.get("/v1/models", token=False)
        assert body["data"][0]["state"] == "released", body
        out = []
        ts = [threading.Thread(target=lambda: out.append(http.post(
            "/v1/chat/completions", {"model": "m"}, timeout=60))) for _ in range(2)]
        for t in ts:
            t.start()
        h.wait_for("two waiting", lambda: metric(http, "baton_door_queue_depth", '{model="m"}') == 2)
        full = http.post("/v1/chat/completions", {"model": "m"})
        assert full[0] == 503 and full[1]["error"]["code"] == "queue_full", full
        assert full[2].get("Retry-After") == "1", full
        for t in ts:
            t.join(60)
        assert [r[0] for r in out] == [503, 503], out
        assert all(r[1]["error"]["code"] == "device_busy" and r[2].get("Retry-After") for r in out), out
        assert not f.got, "nothing reaches an engine that is not back"
        h.wait_for("door.refill_failed", lambda: c.events.all("door.refill_failed"))
    finally:
        f.close()


# ---- the door's own answers --------------------------------------------------

def t_errors_and_models(c):
    http = two_engines(c)
    # unknown model: 404, OpenAI's shape
    st, body, _ = http.post("/v1/chat/completions", chat_body("nobody", "hi", 1))
    assert st == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model", body
    # not JSON, no model, stream not a boolean: 400
    for bad in ("{", {"messages": []}, {"model": QWEN, "stream": "yes"}, [1, 2]):
        st, body, _ = http.post("/v1/chat/completions", bad)
        assert st == 400 and "message" in body["error"], (bad, st, body)
    # the broker's token is the API key
    st, body, _ = http.post("/v1/chat/completions", chat_body(QWEN, "hi", 1), token=False)
    assert st == 401, (st, body)
    st, body, _ = http.post("/v1/completions", {"model": QWEN, "prompt": "In the beginning", "max_tokens": 4,
                                                 "temperature": 0}, token="wrong")
    assert st == 401, (st, body)
    # a route of the door on the HTTP face (broker_http_route): the API answers a wrong method
    st, body, hd = http.get("/v1/chat/completions")
    assert st == 405 and hd.get("Allow") == "POST" and "message" in body["error"], (st, body, hd)
    st, body, hd = http.post("/v1/models", {})
    assert st == 405 and "GET" in hd.get("Allow", ""), (st, body, hd)
    # the models, like `ollama ps`
    st, body, _ = http.get("/v1/models", token=False)
    assert st == 200 and body["object"] == "list", body
    ms = {m["id"]: m for m in body["data"]}
    assert set(ms) == {QWEN, MIXTRAL}, ms
    for m in ms.values():
        assert m["object"] == "model" and m["state"] in ("resident", "released", "partial"), m
        assert len(m["engines"]) == 1 and m["engines"][0]["name"] in ("qwen", "mixtral"), m
    # one answer each way, the same as the engine alone
    want = text_of(engine_http(c, "qwen").post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 3)))
    got = text_of(http.post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 3)))
    assert got == want, (got, want)
    st, body, _ = http.post("/v1/completions", {"model": MIXTRAL, "prompt": "In the beginning", "max_tokens": 6,
                                                "temperature": 0})
    assert st == 200 and body["choices"][0]["text"], (st, body)


# ---- the proof: two models, one device ----------------------------------------

def t_two_models_interleaved(c):
    http = two_engines(c, "door_quantum_s = 5\ndoor_keep_alive_s = forever\n")
    clients, per = 4, 5
    jobs = []  # (client, i, model, question, seed)
    for k in range(clients):
        for i in range(per):
            model = (QWEN, MIXTRAL)[(k + i) % 2]
            jobs.append((k, i, model, QUESTIONS[(k * per + i) % len(QUESTIONS)], 100 + k * per + i))
    # each alone, first: straight to the engine, one at a time
    want = {}
    for k, i, model, q, seed in jobs:
        eng = engine_http(c, "qwen" if model == QWEN else "mixtral")
        want[(k, i)] = text_of(eng.post("/v1/chat/completions", chat_body(model, q, seed), timeout=120))
    switches0 = metric(http, "baton_door_switches_total") or 0

    def served_now():
        return sum(metric(http, "baton_door_requests_total", '{model="%s",outcome="served"}' % m) or 0
                   for m in (QWEN, MIXTRAL))
    served0 = served_now()
    got, errors = {}, []

    def client(k):
        try:
            for kk, i, model, q, seed in jobs:
                if kk == k:
                    got[(k, i)] = text_of(http.post("/v1/chat/completions", chat_body(model, q, seed), timeout=180))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    ts = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    took = time.time() - t0
    assert not errors, errors
    assert len(got) == len(jobs), "lost: %s" % sorted(set(want) - set(got))
    bad = [(key, got[key], want[key]) for key in want if got[key] != want[key]]
    assert not bad, bad
    # a request is counted just after its last byte reached its client: wait for the last ones
    h.wait_for("every request counted", lambda: served_now() - served0 >= len(jobs))
    switches = (metric(http, "baton_door_switches_total") or 0) - switches0
    # four clients alternating: first come first served would switch on
    # almost every request; batches switch a few times
    assert 1 <= switches <= len(jobs) // 2, "%d switches for %d requests" % (switches, len(jobs))
    ev = c.events.all("door.switch")
    assert ev and all("drain" in e["reason"] and "refill" in e["reason"] for e in ev), ev
    assert all(e["engine"] in ("qwen", "mixtral") and e["ms"] >= 0 for e in ev), ev
    h.wait_for("door.queue told", lambda: c.events.all("door.queue"))
    # its waiting count is in the reason, never in the bytes (device memory) column
    assert all(e["bytes"] == 0 and re.search(r": \d+ waiting \(", e["reason"]) for e in c.events.all("door.queue")), \
        c.events.all("door.queue")
    served = metric(http, "baton_door_requests_total", '{model="%s",outcome="served"}' % QWEN)
    assert served and served >= len(jobs) // 2, served
    # every served request has its wait observed, a wait of 0 too
    assert metric(http, "baton_door_ttft_wait_seconds_count", '{model="%s"}' % MIXTRAL) >= len(jobs) // 2
    # some requests waited for a refill, and it is counted in their time to first token
    assert (metric(http, "baton_door_ttft_refill_seconds_sum", '{model="%s"}' % QWEN) +
            metric(http, "baton_door_ttft_refill_seconds_sum", '{model="%s"}' % MIXTRAL)) > 0
    assert any(e["reason"].startswith("switch ") for e in ev), ev
    # the refills the door started say so (not "operator", as they did)
    refills = c.events.all("refill")
    assert refills and all("operator" not in e["reason"] for e in refills), refills
    assert any(e["reason"].startswith("front door") for e in refills), refills
    assert metric(http, "baton_door_switch_seconds_count", '{phase="refill"}') == switches + switches0
    return "%d requests, %d switches, %.1f s" % (len(jobs), switches, took)


def t_keep_alive(c):
    """door_keep_alive_s after its last request an engine is released;
    [engine] keep_alive_s = forever keeps another."""
    http = two_engines(c, "door_keep_alive_s = 0.5\n[engine \"mixtral\"]\nkeep_alive_s = forever\n")
    text_of(http.post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 1)))
    h.wait_for("qwen released by its keep-alive", lambda: c.eng("qwen")["state"] == "released", timeout=10)
    # the core releases it (schedule.c: one idle-release rule), saying why
    ev = [e for e in c.events.all("release", engine="qwen") if "keep-alive" in e["reason"]]
    assert ev, c.events.all("release", engine="qwen")
    st, body, _ = http.get("/v1/models", token=False)
    assert {m["id"]: m["state"] for m in body["data"]}[QWEN] == "released", body
    text_of(http.post("/v1/chat/completions", chat_body(MIXTRAL, "Who was Noah?", 2)))
    time.sleep(1.5)
    assert c.eng("mixtral")["state"] == "ready", c.eng("mixtral")
    assert not [e for e in c.events.all("release", engine="mixtral") if "keep-alive" in e["reason"]]


def t_reload(c):
    """SIGHUP: the door's settings follow the file."""
    http = two_engines(c, "door_keep_alive_s = forever\n")
    text_of(http.post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 1)))
    time.sleep(1)
    assert c.eng("qwen")["state"] == "ready", c.eng("qwen")
    path = os.path.join(c.dir, "broker.ini")
    with open(path) as f:
        text = f.read().replace("door_keep_alive_s = forever", "door_keep_alive_s = 0.3")
    with open(path, "w") as f:
        f.write(text)
    c.bp.send_signal(signal.SIGHUP)
    h.wait_for("qwen released once the keep-alive is 0.3 s", lambda: c.eng("qwen")["state"] == "released",
               timeout=10)
    assert "front door: quantum 5 s, keep-alive 0.3 s" in open(c.log("broker")).read()


# ---- streams -------------------------------------------------------------------

def open_stream(http, body):
    return http.open_stream("/v1/chat/completions", body)


def t_stream_and_disconnect(c):
    http = two_engines(c)
    # a whole stream through the door equals the engine's own
    want = text_of(engine_http(c, "qwen").post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 5)))
    s = open_stream(http, chat_body(QWEN, "Who was Noah?", 5, stream=True))
    raw = b""
    while not raw.endswith(b"\r\n0\r\n\r\n"):  # the chunked end
        chunk = s.recv(65536)
        assert chunk, raw
        raw += chunk
    s.close()
    data = h.dechunk(raw)
    assert data.rstrip().endswith(b"data: [DONE]"), data[-200:]
    text = "".join(d["choices"][0]["delta"].get("content") or "" for d in h.sse_events(data) if d != "[DONE]")
    assert text == want, (text, want)
    # a client that leaves mid-stream: the door cuts the engine's connection
    # at once, without waiting for the engine (held stopped meanwhile), and
    # the engine frees the sequence and its KV blocks
    qwen = [p for p in c.procs if getattr(p, "name", "") == "qwen"][0]
    s = open_stream(http, chat_body(QWEN, "Tell of the flood.", 9, max_tokens=400, stream=True, no_eos=True))
    assert s.recv(4096)
    os.kill(qwen.pid, signal.SIGSTOP)
    try:
        assert metric(http, "baton_door_in_flight", '{engine="qwen",model="%s"}' % QWEN) == 1
        s.close()
        h.wait_for("the door's request ended", lambda: metric(
            http, "baton_door_in_flight", '{engine="qwen",model="%s"}' % QWEN) == 0, timeout=10)
    finally:
        os.kill(qwen.pid, signal.SIGCONT)
    h.wait_for("the engine's sequence freed", lambda: engine_idle(c, "qwen"), timeout=10)
    assert metric(http, "baton_door_requests_total", '{model="%s",outcome="gone"}' % QWEN) == 1
    # the engine killed mid-stream: an error event, and no chunked end (it
    # ended cleanly 5 ms after the kill, and clients took it as complete)
    s = open_stream(http, chat_body(QWEN, "Tell of the flood.", 9, max_tokens=400, stream=True, no_eos=True))
    assert s.recv(4096)
    os.kill(qwen.pid, signal.SIGKILL)
    raw = h.read_to_eof(s)
    s.close()
    data, ended = h.chunks_of(raw)
    assert not ended, raw[-300:]
    ev = h.sse_events(data)
    assert ev and isinstance(ev[-1], dict) and ev[-1]["error"]["code"] == "engine_unreachable", data[-300:]


def engine_idle(c, name):
    st, body, _ = engine_http(c, name).get("/health")
    assert st == 200 and isinstance(body, dict), (st, body)
    return body["running"] == 0 and body["waiting"] == 0 and body["kv_blocks_free"] == body["kv_blocks_total"]


def t_queue_full(c):
    # heartbeats stop while qwen is stopped: not "lost" within this test
    http = two_engines(c, "heartbeat_timeout_ms = 60000\ndoor_quantum_s = 60\ndoor_queue_max = 1\n"
                          "door_keep_alive_s = forever\n")
    qwen = [p for p in c.procs if getattr(p, "name", "") == "qwen"][0]
    # qwen holds the device with a stream in flight, held there (SIGSTOP):
    # mixtral's requests wait at the door, within qwen's quantum
    text_of(http.post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 1)))
    s = open_stream(http, chat_body(QWEN, "Tell of the flood.", 2, max_tokens=400, stream=True, no_eos=True))
    os.kill(qwen.pid, signal.SIGSTOP)
    try:
        box = {}
        waiter = threading.Thread(target=lambda: box.update(r=http.post(
            "/v1/chat/completions", chat_body(MIXTRAL, "Who was Noah?", 3), timeout=120)))
        waiter.start()
        h.wait_for("one mixtral request queued", lambda: metric(
            http, "baton_door_queue_depth", '{model="%s"}' % MIXTRAL) == 1, timeout=10)
        st, body, hdr = http.post("/v1/chat/completions", chat_body(MIXTRAL, "Who built the ark?", 4))
        assert st == 503 and body["error"]["code"] == "queue_full", (st, body)
        assert hdr.get("Retry-After") == "1", hdr
        st, body, _ = http.get("/v1/models", token=False)
        ms = {m["id"]: m for m in body["data"]}
        assert ms[MIXTRAL]["queued"] == 1 and ms[QWEN]["engines"][0]["in_flight"] == 1, ms
    finally:
        os.kill(qwen.pid, signal.SIGCONT)
    # the stream ends (its client leaves): the device switches, the waiter is served
    s.close()
    waiter.join(120)
    assert box["r"][0] == 200, box
    assert metric(http, "baton_door_requests_total", '{model="%s",outcome="queue_full"}' % MIXTRAL) == 1
    assert c.events.all("door.switch"), "no switch event"


# ---- the openai npm client, unchanged --------------------------------------------

def t_npm_client(c):
    dest = h.npm_client()
    http = two_engines(c)
    # mixtral first, so that the client's first request is a switch
    text_of(http.post("/v1/chat/completions", chat_body(MIXTRAL, "Who was Noah?", 1)))
    p = subprocess.run(["node", os.path.join(dest, "client.mjs"), http.url, QWEN], capture_output=True,
                       text=True, timeout=180, env=dict(os.environ, BATON_TOKEN=http.token))
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout)
    # what the engine alone answers to the same requests
    eng = engine_http(c, "qwen")
    msgs = [{"role": "user", "content": "Tell me of light."}]
    st, whole, _ = eng.post("/v1/chat/completions", {"model": QWEN, "messages": msgs, "max_tokens": 16,
                                                      "temperature": 0.8, "seed": 5})
    assert st == 200, whole
    want = whole["choices"][0]["message"]["content"]
    # the door passes the usage on, prompt_tokens_details too: the client's
    # first request found nothing cached, the engine's found what it left
    assert got["chat"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}, got["chat"]
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 16, whole["usage"]
    assert got["chat"]["text"] == want and bare(got["chat"]["usage"]) == bare(whole["usage"]), (got["chat"], want)
    s = got["stream"]
    assert s["text"] == want and s["role"] == "assistant" and bare(s["usage"]) == bare(whole["usage"]), s
    assert s["chunks"] >= 5, s
    st, cw, _ = eng.post("/v1/completions", {"model": QWEN, "prompt": "In the beginning", "max_tokens": 12,
                                             "temperature": 0})
    assert got["completion"]["text"] == cw["choices"][0]["text"] == got["completion_stream"], got
    assert sorted(got["models"]) == sorted([QWEN, MIXTRAL]), got
    assert got["wrong_model"] == {"status": 404, "code": "model_not_found", "type": "invalid_request_error",
                                  "param": "model"}, got
    assert got["lenient"]["finish"] in ("stop", "length"), got  # SDK defaults pass through the door
    assert got["required_no_tools"]["status"] == 400 and got["required_no_tools"]["param"] == "tool_choice", got
    return "openai %s, first content after %s ms" % (
        json.load(open(os.path.join(dest, "node_modules", "openai", "package.json")))["version"], s["first_ms"])


def t_tokenize_and_cors(c):
    """vLLM's /tokenize and /detokenize through the door, routed by model
    to the engine's; [broker] cors_origins answers a named origin's
    preflight and marks its answers, the token still required."""
    http = two_engines(c, "cors_origins = https://ui.example\n")
    st, t, _ = http.post("/tokenize", {"model": MIXTRAL, "prompt": "And God said"})
    assert st == 200 and t["count"] == len(t["tokens"]) > 1, (st, t)
    st, d, _ = http.post("/detokenize", {"model": MIXTRAL, "tokens": t["tokens"]})
    assert st == 200 and d["prompt"].endswith("And God said"), d
    st, q, _ = http.post("/tokenize", {"model": QWEN, "prompt": "And God said"})
    assert st == 200 and q["tokens"] != t["tokens"], q  # the other model's tokenizer
    st, b, _ = http.post("/tokenize", {"model": "nobody", "prompt": "x"})
    assert st == 404, (st, b)
    pre = {"Origin": "https://ui.example", "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    st, _, hd = http.req("OPTIONS", "/v1/chat/completions", token=False, headers=pre)
    low = {k.lower(): v for k, v in hd.items()}
    assert st == 204 and low["access-control-allow-origin"] == "https://ui.example", (st, hd)
    st, b, hd = http.post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 1, max_tokens=2),
                          headers={"Origin": "https://ui.example"})
    assert st == 200 and {k.lower() for k in hd} >= {"access-control-allow-origin"}, (st, hd)
    st, b, hd = http.post("/v1/chat/completions", chat_body(QWEN, "Who was Noah?", 1, max_tokens=2),
                          headers={"Origin": "https://evil.example"})
    assert st == 403 and "access-control-allow-origin" not in {k.lower() for k in hd}, (st, hd)
    return "%d tokens" % t["count"]


# ---- the usage report: every answer counted ---------------------------------------

def t_fake_stored_responses(c):
    """GET and DELETE /v1/responses/ID go to the engine that keeps the
    response, of two engines of one model and another model's: the door
    learnt it from the answer it passed on (a whole reply's id, a stream's
    response.created). previous_response_id pins a POST to that engine;
    naming another model is 400. An id it does not know, one not stored,
    one deleted or one its engine forgot is 404 at the door, in OpenAI's
    shape; the token is needed as for a POST."""
    http = fake_broker(c)
    fa, fb, fc = Fake("fa"), Fake("fb"), Fake("fc")
    try:
        fake_register(c, fa, "m")
        fake_register(c, fb, "m")
        fake_register(c, fc, "m2")
        h.wait_for("routable", lambda: len(http.get("/v1/models", token=False)[1]["data"]) == 2 and
                   len([m for m in http.get("/v1/models", token=False)[1]["data"] if m["id"] == "m"][0]["engines"]) == 2)
        # two held at once: one on each engine of m (least loaded)
        got = []
        ts = [threading.Thread(target=lambda: got.append(http.post("/v1/responses", {"model": "m", "hold": True})))
              for _ in range(2)]
        for t in ts:
            t.start()
        h.wait_for("both held", lambda: fa.inflight + fb.inflight == 2)
        fa.go.release()
        fb.go.release()
        for t in ts:
            t.join(30)
        assert sorted(r[1]["engine"] for r in got) == ["fa", "fb"], got
        ids = {r[1]["engine"]: r[1]["id"] for r in got}
        st, r, _ = http.post("/v1/responses", {"model": "m2"})
        assert st == 200, r
        ids["fc"] = r["id"]
        # a stream: its id from response.created, cut across reads
        data = stream_raw(http, "/v1/responses", {"model": "m2", "stream": True})
        first = json.loads(data.split(b"data: ", 1)[1].split(b"\n", 1)[0])
        assert first["type"] == "response.created", data[:300]
        sid = first["response"]["id"]
        for eng, rid in list(ids.items()) + [("fc", sid)]:
            st, r, _ = http.get("/v1/responses/" + rid)
            assert st == 200 and r["id"] == rid and r["engine"] == eng, (eng, rid, st, r)
        # previous_response_id: to the engine that keeps it, every time
        for eng in ("fa", "fb", "fa", "fb"):
            st, r, _ = http.post("/v1/responses", {"model": "m", "previous_response_id": ids[eng]})
            assert st == 200 and r["engine"] == eng and r["previous_response_id"] == ids[eng], (eng, st, r)
        st, r, _ = http.post("/v1/responses", {"model": "m2", "previous_response_id": ids["fa"]})
        assert st == 400 and r["error"]["param"] == "previous_response_id" and "'m'" in r["error"]["message"], r
        n_fc = len(fc.got)
        # the token, as for a POST
        st, r, _ = http.get("/v1/responses/" + ids["fa"], token=False)
        assert st == 401 and r["error"]["code"] == "invalid_api_key", (st, r)
        # not known at the door: 404 there, no engine asked
        asked = len(fa.got) + len(fb.got) + len(fc.got)
        for rid in ("resp_nobody", "x" * 300):
            st, r, _ = http.get("/v1/responses/" + rid)
            assert st == 404 and r["error"]["code"] == "not_found" and r["error"]["type"] == \
                "invalid_request_error", (st, r)
        st, r, _ = http.get("/v1/responses/%s/input_items" % ids["fa"])
        assert st == 404 and r["error"]["code"] == "not_found", (st, r)
        st, r, _ = http.post("/v1/responses", {"model": "m", "store": False})
        assert st == 200 and r["store"] is False, r
        asked += 1
        st, r, _ = http.get("/v1/responses/" + r["id"])
        assert st == 404 and r["error"]["code"] == "not_found", (st, r)
        assert len(fa.got) + len(fb.got) + len(fc.got) == asked
        # DELETE at its engine; then the door knows it no more
        st, r, _ = http.req("DELETE", "/v1/responses/" + ids["fb"])
        assert st == 200 and r == {"id": ids["fb"], "object": "response", "deleted": True}, (st, r)
        assert fb.got[-1][0] == "DELETE /v1/responses/" + ids["fb"], fb.got[-1]
        st, r, _ = http.get("/v1/responses/" + ids["fb"])
        assert st == 404 and fb.got[-1][0].startswith("DELETE"), (st, r, fb.got[-1])
        # an engine that forgot one (its store is bounded): its 404 passed on as it is
        fa.kept.clear()
        st, r, _ = http.get("/v1/responses/" + ids["fa"])
        assert st == 404 and r["error"]["message"] == "response '%s' is not kept" % ids["fa"] and \
            fa.got[-1][0].startswith("GET"), (st, r)
        assert len(fc.got) == n_fc
        # what it remembers (m's 6 stored, m2's 2, less fb's deleted), none evicted
        door_idle(http)
        assert metric(http, "baton_door_stored_responses") == 8 - 1, metric(http, "baton_door_stored_responses")
        assert metric(http, "baton_door_stored_evicted_total") == 0
        # a read is no completion: the served count is the POSTs'
        assert metric(http, "baton_door_requests_total", '{model="m",outcome="served"}') == 7
        return "8 stored responses routed by id, 4 by previous_response_id"
    finally:
        fa.close()
        fb.close()
        fc.close()


def stream_raw(http, path, body):
    """A whole stream through the door: its data, dechunked."""
    s = http.open_stream(path, body)
    raw = b""
    while not raw.endswith(b"\r\n0\r\n\r\n"):  # the chunked end
        chunk = s.recv(65536)
        assert chunk, raw
        raw += chunk
    s.close()
    return h.dechunk(raw)


def t_usage_of_every_answer(c):
    """The door counts the tokens and the time to first token of every
    answer by the engine's usage report: a batch (n > 1, a prompt list),
    a Responses answer, an Ollama and an Anthropic one, whole and
    streamed, as a single chat's; the report never reaches the client."""
    http = c.http_broker()
    c.engine("qwen", "--ctx", "512", "--vram-elastic", "--http", "127.0.0.1:0", "--http-token-file",
             h.engine_token_file(c.dir), arena=model_arena(c, QWEN), host_mib=18, segment_mib=2)
    h.wait_for("the engine routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    counted = []  # (prompt, completion) of each answer, as the client sees them
    body = dict(chat_body(QWEN, "Who was Noah?", 3, max_tokens=6), n=2)
    st, b, hd = http.post("/v1/chat/completions", body)
    assert st == 200 and len(b["choices"]) == 2 and "X-Baton-Usage" not in hd, (st, b, hd)
    counted.append((b["usage"]["prompt_tokens"], b["usage"]["completion_tokens"]))
    st, b, _ = http.post("/v1/completions", {"model": QWEN, "prompt": ["In the beginning", "And God said"],
                                             "max_tokens": 5, "temperature": 0})
    assert st == 200 and len(b["choices"]) == 2, (st, b)
    counted.append((b["usage"]["prompt_tokens"], b["usage"]["completion_tokens"]))
    data = stream_raw(http, "/v1/chat/completions", dict(chat_body(QWEN, "Tell of the flood.", 4, max_tokens=6,
                                                                    stream=True), n=2,
                                                          stream_options={"include_usage": True}))
    assert b"baton-usage" not in data, data[-300:]
    u = [e for e in h.sse_events(data) if isinstance(e, dict) and e.get("usage")][-1]["usage"]
    counted.append((u["prompt_tokens"], u["completion_tokens"]))
    st, r, hd = http.post("/v1/responses", {"model": QWEN, "input": "Who built the ark?", "max_output_tokens": 6,
                                            "temperature": 0})
    assert st == 200 and r["status"] in ("completed", "incomplete") and "X-Baton-Usage" not in hd, (st, r, hd)
    counted.append((r["usage"]["input_tokens"], r["usage"]["output_tokens"]))
    data = stream_raw(http, "/v1/responses", {"model": QWEN, "input": "What is the law?", "max_output_tokens": 6,
                                              "temperature": 0, "stream": True})
    assert b"baton-usage" not in data, data[-300:]
    done = [e for e in h.sse_events(data) if isinstance(e, dict) and e.get("type") in
            ("response.completed", "response.incomplete")]
    assert done, data[-300:]
    u = done[-1]["response"]["usage"]
    counted.append((u["input_tokens"], u["output_tokens"]))
    # the other faces: Ollama's (NDJSON) and Anthropic's, whole and streamed
    msgs = [{"role": "user", "content": "Who was Noah?"}]
    st, o, _ = http.post("/api/chat", {"model": QWEN, "messages": msgs, "stream": False, "options": {"num_predict": 5}})
    assert st == 200, o
    counted.append((o["prompt_eval_count"], o["eval_count"]))
    st, data, _ = http.post("/api/generate", {"model": QWEN, "prompt": "In the beginning", "options": {"num_predict": 5}})
    assert st == 200 and "baton-usage" not in data, (st, data[-300:])
    last = json.loads(data.strip().split("\n")[-1])
    assert last["done"], last
    counted.append((last["prompt_eval_count"], last["eval_count"]))
    st, a, _ = http.post("/v1/messages", {"model": QWEN, "max_tokens": 5, "messages": msgs})
    assert st == 200, a
    counted.append((a["usage"]["input_tokens"], a["usage"]["output_tokens"]))
    data = stream_raw(http, "/v1/messages", {"model": QWEN, "max_tokens": 5, "messages": msgs, "stream": True})
    assert b"baton-usage" not in data, data[-300:]
    u = [e for e in h.sse_events(data) if isinstance(e, dict) and e.get("type") == "message_delta"][-1]["usage"]
    counted.append((u["input_tokens"], u["output_tokens"]))
    lab = '{model="%s"}' % QWEN
    door_idle(http)
    got = (metric(http, "baton_door_prompt_tokens_total", lab), metric(http, "baton_door_generation_tokens_total", lab))
    want = (sum(p for p, _ in counted), sum(n for _, n in counted))
    assert got == want, (got, want, counted)
    # every answer's time to first token came with its report
    assert metric(http, "baton_door_time_to_first_token_seconds_count", lab) == len(counted)
    ends = sum(metric(http, "baton_door_request_success_total", '{model="%s",finished_reason="%s"}' % (QWEN, f)) or 0
               for f in ("stop", "length"))
    assert ends == len(counted), ends
    # the 6-token batches were cut: the door's finish is the batch's
    assert metric(http, "baton_door_request_success_total", '{model="%s",finished_reason="length"}' % QWEN) >= 3
    return "%d answers, %d prompt and %d generated tokens counted" % (len(counted), want[0], want[1])


def t_responses_by_id(c):
    """A real engine's stored responses through the door: GET of a whole
    answer's and a stream's id equals the engine's own; previous_response_id
    carries the conversation (more input tokens); DELETE at the engine,
    then 404 through the door and at the engine."""
    http = c.http_broker()
    c.engine("qwen", "--ctx", "512", "--vram-elastic", "--http", "127.0.0.1:0", "--http-token-file",
             h.engine_token_file(c.dir), arena=model_arena(c, QWEN), host_mib=18, segment_mib=2)
    h.wait_for("the engine routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    eng = engine_http(c, "qwen")
    st, r, _ = http.post("/v1/responses", {"model": QWEN, "input": "Who built the ark?", "max_output_tokens": 6,
                                           "temperature": 0})
    assert st == 200 and r["id"].startswith("resp_"), (st, r)
    data = stream_raw(http, "/v1/responses", {"model": QWEN, "input": "What is the law?", "max_output_tokens": 6,
                                              "temperature": 0, "stream": True})
    created = [e for e in h.sse_events(data) if isinstance(e, dict) and e.get("type") == "response.created"]
    assert created, data[:300]
    for rid in (r["id"], created[0]["response"]["id"]):
        st, got, _ = http.get("/v1/responses/" + rid)
        st2, own, _ = eng.get("/v1/responses/" + rid)
        assert st == 200 and st2 == 200 and got == own and got["id"] == rid, (st, got, st2, own)
    st, r2, _ = http.post("/v1/responses", {"model": QWEN, "input": "And then?", "max_output_tokens": 4,
                                            "temperature": 0, "previous_response_id": r["id"]})
    assert st == 200 and r2["previous_response_id"] == r["id"], (st, r2)
    assert r2["usage"]["input_tokens"] > r["usage"]["input_tokens"], (r2["usage"], r["usage"])
    st, d, _ = http.req("DELETE", "/v1/responses/" + r["id"])
    assert st == 200 and d == {"id": r["id"], "object": "response", "deleted": True}, (st, d)
    st, e, _ = http.get("/v1/responses/" + r["id"])
    assert st == 404 and e["error"]["code"] == "not_found", (st, e)
    assert eng.get("/v1/responses/" + r["id"])[0] == 404
    # the conversation it started is gone with it
    st, e, _ = http.post("/v1/responses", {"model": QWEN, "input": "x", "previous_response_id": r["id"]})
    assert st == 404 and e["error"]["param"] == "previous_response_id", (st, e)
    return "GET, previous_response_id, DELETE of %s" % r["id"][:12]


# ---- the npm clients on the tiny test model ----------------------------------------

def engine_checks(name):
    """An engine test script (engine/serve/NAME.py), for its checks of the
    npm clients' output (as broker/door/faces_test.py takes faces_test's)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("engine_" + name, os.path.join(ROOT, "engine", "serve", name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


class Own:
    """An engine's own HTTP, as the engine tests' checks read it (.http)."""
    def __init__(self, http):
        self.http = http


def t_npm_tiny(c):
    """Every npm client of the trained models' runs (openai's client.mjs,
    the AI SDK, LangChain and openai's Responses in sdks.mjs, ollama and
    @anthropic-ai/sdk in faces.mjs), unchanged, on the tiny test model
    (h.tiny_model_arena: random weights, a byte-level tokenizer of 300
    pieces, Qwen3's template), against its engine and through the door,
    checked as the engine's tests check them. Its random text is what
    the engine alone gives; the tool, JSON and thinking answers come from
    the engine's test hook BATON_TEST_FORCE (the template, the sampler,
    the grammar, the parsers and the streams are the real ones)."""
    if h.SAN:
        # the sanitizers' pass: these are the npm clients (node's own code)
        # over the same endpoints the other cases drive under ASan here
        return "skipped under the sanitizers (the plain pass runs the clients)"
    ef, er = engine_checks("faces_test"), engine_checks("responses_test")
    force = "\x1e".join(["weather in Paris\t" + ef.FORCED_CALL, "ponder\t" + ef.FORCED_THINK,
                         "Describe Noah\t" + er.FORCED_JSON])
    http = c.http_broker()
    c.engine("tiny", "--ctx", "2048", "--http", "127.0.0.1:0", "--http-token-file", h.engine_token_file(c.dir),
             arena=h.tiny_model_arena(), host_mib=16, segment_mib=2, env={"BATON_TEST_FORCE": force})
    h.wait_for("the engine routable", lambda: all(e.get("http") for e in c.status()["engines"]))
    m, own = h.TINY_MODEL, engine_http(c, "tiny")
    want_sdks = er.alone(own, m)
    st, want_chat, _ = own.post("/v1/chat/completions", {"model": m, "max_tokens": 16, "temperature": 0.8, "seed": 5,
                                                         "messages": [{"role": "user", "content": "Tell me of light."}]})
    assert st == 200, want_chat
    # logprobs' bytes: a character split across the tiny tokenizer's tokens
    # is whole again when the entries' bytes are joined (as OpenAI's)
    st, lp, _ = own.post("/v1/chat/completions", {"model": m, "max_tokens": 40, "temperature": 0, "logprobs": True,
                                                  "messages": [{"role": "user", "content": "Tell me of light."}]})
    assert st == 200, lp
    joined = bytes(x for e in lp["choices"][0]["logprobs"]["content"] for x in e["bytes"])
    assert joined.decode("utf-8", "replace") == lp["choices"][0]["message"]["content"], (joined, lp)
    n, skipped = 0, ""
    for url, token in ((own.url, h.ENGINE_TOKEN), (http.url, http.token)):
        dest = h.npm_client()
        p = subprocess.run(["node", os.path.join(dest, "client.mjs"), url, m], capture_output=True, text=True,
                           timeout=180, env=dict(os.environ, BATON_TOKEN=token, BATON_TOOL_TEST="1"))
        assert p.returncode == 0, (url, p.stderr[-3000:])
        got = json.loads(p.stdout)
        text = want_chat["choices"][0]["message"]["content"]
        assert got["chat"]["text"] == text and got["stream"]["text"] == text, (url, got["chat"], got["stream"], text)
        assert bare(got["stream"]["usage"]) == bare(want_chat["usage"]), (url, got["stream"])
        assert got["completion"]["text"] == got["completion_stream"] and got["models"] == [m], (url, got)
        tc = got["tool_call"]
        assert tc["finish"] == "tool_calls" and [x["function"]["name"] for x in tc["calls"]] == ["get_weather"], tc
        assert json.loads(tc["calls"][0]["function"]["arguments"]) == {"city": "Paris"}, tc
        assert got["tool_stream"]["calls"][0]["function"] == tc["calls"][0]["function"], got["tool_stream"]
        assert got["tool_answer"]["finish"] in ("stop", "length") and got["tool_answer"]["calls"] is None, got
        assert got["required"]["finish"] == "tool_calls" and got["required"]["calls"], got["required"]
        assert got["reasoning"] == {"content": "Let there be light.", "reasoning": "I ponder the light."}, got
        assert got["reasoning_stream"] == got["reasoning"], got
        sdks = er.node_suite(url, m, token=token)
        skipped = er.check_sdks(sdks, want_sdks) or skipped
        faces = ef.run_node(c, url, env={"BATON_TOKEN": token}, model=m)
        ef.check_node(faces, Own(own), listed=(m,), model=m)
        n += len(got) + len(sdks) + len(faces["ollama"]) + len(faces["anthropic"])
    return "%d cases on %s, against the engine and the door%s" % (n, m, skipped)


if __name__ == "__main__":
    h.need(h.BROKER)
    sys.exit(h.run_cases([t_tokenize_and_cors, t_register_fields, t_fake_stream_passes_through, t_fake_cut_and_refused,
                          t_fake_least_loaded_and_disconnect, t_fake_stored_responses,
                          t_fake_refill_fails, t_errors_and_models, t_two_models_interleaved,
                          t_keep_alive, t_reload, t_stream_and_disconnect, t_queue_full, t_npm_client,
                          t_usage_of_every_answer, t_responses_by_id, t_npm_tiny],
                         only=sys.argv[1:], logs=("broker", "qwen", "mixtral")))
