#!/usr/bin/python3
"""interop_test.py: Baton's protocol against implementations nobody here
wrote: Debian's python3-msgpack encodes and decodes against our C codec
(through baton-proto-tool), field by field, for every op; Debian's nngcat
sends requests to a REP server run by our transport.

Run with /usr/bin/python3 (python3-msgpack). Finds the tool at
$BUILD/bin/baton-proto-tool. Last line: "N passed, N failed".
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

import msgpack

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

TOOL = h.TOOL
NNGCAT = shutil.which("nngcat") or "/usr/bin/nngcat"
RNG = random.Random(int(os.environ.get("SEED", "20261129")))
TMP = tempfile.mkdtemp(prefix="baton-interop-")
SCHEMA = None

ERR = h.ERR


def tool(*args, data=None, check=True):
    p = subprocess.run([TOOL, *args], input=data, capture_output=True, timeout=60)
    if check and p.returncode not in (0, 2):
        raise AssertionError("%s %s: exit %d: %s" % (TOOL, " ".join(args), p.returncode,
                                                     p.stderr.decode(errors="replace")))
    return p


def c_decode(data):
    """Our decoder's view of the bytes: (dict, None) or (None, error dict)."""
    p = tool("decode", data=data)
    out = json.loads(p.stdout.decode())
    if p.returncode == 2:
        return None, out
    return out, None


# ---- random values -----------------------------------------------------------

ALPHABET = "abcXYZ019 _-./:é€ßΩ\u4e2d\U0001f680\""


def rand_str(limit):
    if RNG.random() < 0.1:
        return ""
    n = RNG.randint(1, 40)
    if limit > 1000 and RNG.random() < 0.3:
        n = RNG.randint(100, 900)
    s = "".join(RNG.choice(ALPHABET) for _ in range(n))
    while len(s.encode()) > limit:
        s = s[:-1]
    return s


def rand_value(ftype, limit):
    if ftype == "bool":
        return RNG.random() < 0.5
    if ftype == "u32":
        return RNG.choice([0, 1, 2**32 - 1, RNG.randrange(2**32)])
    if ftype == "u64":
        return RNG.choice([0, 1, 2**32, 2**64 - 1, RNG.randrange(2**64)])
    if ftype == "i32":
        return RNG.choice([-2**31, 2**31 - 1, 0, RNG.randrange(-2**31, 2**31)])
    if ftype == "f64":
        return RNG.choice([0.0, -1.5, 1e-300, 1.7976931348623157e308,
                           RNG.uniform(-1e6, 1e6), RNG.random()])
    if ftype == "str":
        return rand_str(limit)
    if ftype == "bin":
        return bytes(RNG.randrange(256) for _ in range(RNG.choice([0, 4, 32, 1000])))
    if ftype == "reserve":
        return RNG.choice([None, 0, 512, 2**40])
    if ftype in ("gpus", "engines"):
        items = SCHEMA["items"][ftype]
        return [{f["key"]: rand_value(f["type"], f["limit"]) for f in items}
                for _ in range(RNG.randint(0, 3))]
    raise AssertionError("type " + ftype)


def fields_of(op, reply):
    t = SCHEMA["ops"][op]["reply" if reply else "request"]
    return t or []


def rand_msg(op, kind, optional=True):
    """kind: request (events too), reply, error."""
    m = {"v": 1, "op": op, "id": RNG.randrange(1, 2**64)}
    if kind == "error":
        m.update(ok=False, err=RNG.choice([1, 6, 20, 999]), msg=rand_str(4096))
        return m
    if kind == "reply":
        m["ok"] = True
    for f in fields_of(op, kind == "reply"):
        if f["required"] or (optional and RNG.random() < 0.8):
            m[f["key"]] = rand_value(f["type"], f["limit"])
    return m


def shuffled(m):
    items = list(m.items())
    RNG.shuffle(items)
    return dict(items)


def kinds_of(op):
    return ["request"] if op == "event" else ["request", "reply", "error"]


def to_json_view(m):
    """The python message as our decoder prints it: bins as hex."""
    out = {}
    for k, v in m.items():
        if isinstance(v, bytes):
            v = v.hex()
        elif isinstance(v, list):
            v = [{ik: (iv.hex() if isinstance(iv, bytes) else iv) for ik, iv in it.items()}
                 for it in v]
        out[k] = v
    return out


def same(a, b, where):
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), \
            "%s: %r vs %r" % (where, a, b)
        assert float(a) == float(b), "%s: %r != %r" % (where, a, b)
        return
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), \
            "%s: keys %s vs %s" % (where, sorted(a), sorted(b))
        for k in a:
            same(a[k], b[k], where + "." + k)
        return
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), "%s: lengths" % where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, "%s[%d]" % (where, i))
        return
    assert type(a) is type(b) and a == b, "%s: %r (%s) != %r (%s)" % (
        where, a, type(a).__name__, b, type(b).__name__)


# ---- cases ---------------------------------------------------------------------

def t_schema():
    ops = SCHEMA["ops"]
    assert sorted(ops) == sorted(["gen", "status", "release", "refill", "vram", "register",
                                  "heartbeat", "acquire", "report", "handoff", "pin", "peer", "complete",
                                  "lease", "external",
                                  "event"]), sorted(ops)
    assert ops["event"]["reply"] is None
    req = {f["key"]: f for f in ops["register"]["request"]}
    for k in ("name", "pid", "gpu", "device", "model", "ctl", "floor", "ceiling",
              "priority", "state", "resident", "capacity", "epoch"):
        assert req[k]["required"], k
    assert req["device"]["type"] == "u32" and req["priority"]["type"] == "i32"
    rep = {f["key"]: f for f in ops["status"]["reply"]}
    assert rep["device"]["type"] == "str" and not rep["device"]["required"]
    assert {f["key"] for f in ops["vram"]["request"] if f["required"]} == {"reserve_mib"}
    refill = {f["key"]: f for f in ops["refill"]["request"]}  # the broker's partial grant to a released engine
    assert "reserve_mib" in refill and not refill["reserve_mib"]["required"], refill
    assert SCHEMA["limits"]["array"] == 1024 and SCHEMA["limits"]["name"] == 256


def t_python_encodes_c_decodes():
    n = 0
    for op in SCHEMA["ops"]:
        for kind in kinds_of(op):
            for rep in range(4):
                m = shuffled(rand_msg(op, kind, optional=rep > 0))
                got, err = c_decode(msgpack.packb(m, use_bin_type=True))
                assert err is None, "%s %s: %s for %r" % (op, kind, err, m)
                same(to_json_view(m), got, "%s %s" % (op, kind))
                n += 1
    assert n > 100


def arg_of(v):
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def t_c_encodes_python_decodes():
    n = 0
    for op in SCHEMA["ops"]:
        for kind in kinds_of(op):
            for rep in range(4):
                m = rand_msg(op, kind, optional=rep > 0)
                # arrays (the broker's status reply, all optional) are not
                # encode arguments; the samples cover them
                for k in [k for k, v in m.items() if isinstance(v, list)]:
                    del m[k]
                args = ["encode", op, kind]
                for k, v in m.items():
                    if k in ("v", "op", "ok"):
                        continue
                    args.append("%s=%s" % (k, arg_of(v)))
                p = tool(*args)
                assert p.returncode == 0, "%s: %s" % (args, p.stderr.decode())
                got = msgpack.unpackb(p.stdout, raw=False, strict_map_key=True)
                same(m, got, "%s %s" % (op, kind))
                n += 1
    assert n > 100
    # the encoding is canonical: envelope first, then the table's order,
    # every integer in its smallest form
    p = tool("encode", "acquire", "bytes=5", "name=a", "id=1")
    want = (b"\x85\xa1v\x01\xa2op\xa7acquire\xa2id\x01"
            b"\xa4name\xa1a\xa5bytes\x05")
    assert p.stdout == want, p.stdout


def t_c_samples_match_python():
    """Every sample (every field of every table) read by both decoders."""
    for op in SCHEMA["ops"]:
        for kind in kinds_of(op):
            data = tool("sample", op, kind).stdout
            py = msgpack.unpackb(data, raw=False)
            allowed = {f["key"]: f for f in fields_of(op, kind == "reply")}
            assert py["v"] == 1 and py["op"] == op and isinstance(py["id"], int)
            if kind == "error":
                assert py["ok"] is False and isinstance(py["err"], int) and isinstance(py["msg"], str)
            else:
                body = {k: v for k, v in py.items() if k not in ("v", "op", "id", "ok")}
                assert set(body) == set(allowed), "%s %s: %s" % (op, kind, sorted(body))
                for k, v in body.items():
                    t = allowed[k]["type"]
                    ok = {"bool": bool, "u32": int, "u64": int, "i32": int, "f64": float,
                          "str": str, "bin": bytes, "reserve": (int, type(None)),
                          "gpus": list, "engines": list}[t]
                    assert isinstance(v, ok) and not (t != "bool" and isinstance(v, bool)), \
                        "%s %s: %s is %r" % (op, kind, k, v)
            got, err = c_decode(data)
            assert err is None, err
            same(to_json_view(py), got, "sample %s %s" % (op, kind))


def expect_error(data, name, what, want_id=None):
    got, err = c_decode(data)
    assert err is not None, "%s: decoded as %r" % (what, got)
    assert err["error"] == name and err["code"] == ERR[name], \
        "%s: got %s (%s), want %s" % (what, err["error"], err["text"], name)
    assert err["text"], what
    if want_id is not None:
        assert err["id"] == want_id, "%s: id %r" % (what, err["id"])


def pack_pairs(pairs):
    """A map with these (key, value) pairs in order, duplicates allowed."""
    p = msgpack.Packer(use_bin_type=True)
    return p.pack_map_header(len(pairs)) + b"".join(p.pack(k) + p.pack(v) for k, v in pairs)


def t_python_malformed_gets_exact_codes():
    base = {"v": 1, "op": "acquire", "id": 4242, "name": "qwen", "bytes": 1 << 30}
    pk = lambda m: msgpack.packb(m, use_bin_type=True)
    expect_error(pk(dict(base, v=2)), "bad_version", "version 2", 4242)
    expect_error(pk(dict(base, op="teleport")), "unknown_op", "unknown op", 4242)
    expect_error(pk(dict(base, extra=1)), "extra_field", "extra field", 4242)
    expect_error(pk({k: v for k, v in base.items() if k != "bytes"}), "missing_field",
                 "missing bytes", 4242)
    expect_error(pk(dict(base, bytes="lots")), "bad_type", "bytes as str", 4242)
    expect_error(pk(dict(base, bytes=-1)), "out_of_range", "negative bytes", 4242)
    expect_error(pk(dict(base, bytes=1.5)), "bad_type", "bytes as float", 4242)
    expect_error(pk(dict(base, name=b"qwen")), "bad_type", "name as bin", 4242)
    expect_error(pk(dict(base, name="a\x00b")), "out_of_range", "NUL in name", 4242)
    expect_error(pk(dict(base, name="x" * 257)), "too_big", "name of 257", 4242)
    expect_error(pk(dict(base, id=0)), "out_of_range", "request id 0")
    expect_error(pk({"v": 1, "op": "report", "id": 5, "name": "a", "state": "ready",
                     "resident": 0, "reason": "r", "duration_ms": math.nan}),
                 "out_of_range", "NaN", 5)
    expect_error(pk(dict(base, name=msgpack.ExtType(1, b"x"))), "bad_message", "ext type")
    expect_error(pack_pairs(list(base.items()) + [("name", "other")]), "duplicate",
                 "duplicate name", 4242)
    expect_error(pack_pairs([(1, 2)] + list(base.items())), "bad_message", "integer key")
    expect_error(pk([1, 2, 3]), "bad_message", "array at the top")
    expect_error(pk(base)[:-1], "bad_message", "truncated")
    expect_error(pk(base) + b"\x00", "bad_message", "trailing byte")
    expect_error(b"\xdd\xff\xff\xff\xff", "too_big", "array of 2^32-1 in 5 bytes")
    expect_error(b"\xdf\xff\xff\xff\xff", "too_big", "map of 2^32-1 in 5 bytes")
    expect_error(b"\xc6\xff\xff\xff\xff", "too_big", "bin of 4 GiB in 5 bytes")
    deep = base.copy()
    nest = 1
    for _ in range(20):
        nest = [nest]
    deep["extra"] = nest
    expect_error(pk(deep), "bad_message", "nested 21 deep")
    expect_error(pk({"v": 1, "op": "status", "id": 1, "ok": True,
                     "gpus": [{"uuid": "u"}] * 1025}), "too_big", "1025 gpus")
    # python's own view of a valid message with every width of integer
    ok = pack_pairs([("v", 1), ("op", "acquire"), ("id", 2**64 - 1), ("name", "é"),
                     ("bytes", 2**63)])
    got, err = c_decode(ok)
    assert err is None and got["id"] == 2**64 - 1 and got["bytes"] == 2**63, (got, err)


# ---- nngcat against our REP server --------------------------------------------------

class Server:
    def __init__(self, url, count=None):
        args = [TOOL, "serve", url]
        if count:
            args += ["--count", str(count)]
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.p.stdout.readline().decode()
        assert line.startswith("listening"), line

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)
        return self.p.stderr.read().decode(errors="replace")


def nngcat_call(url, data):
    path = os.path.join(TMP, "req.bin")
    with open(path, "wb") as f:
        f.write(data)
    # no --count: nngcat 1.5.2 then computes a negative receive timeout
    # (interval -1 minus the time spent) and fails with "Cannot set recv
    # timeout" whenever the reply takes a millisecond or more
    p = subprocess.run([NNGCAT, "--req", "--dial", url, "--file", path, "--raw",
                        "--recv-timeout", "5"],
                       capture_output=True, timeout=30)
    assert p.returncode == 0, "nngcat: exit %d: %s" % (p.returncode, p.stderr.decode())
    assert p.stdout, "nngcat printed no reply"
    return msgpack.unpackb(p.stdout, raw=False)


def t_nngcat_to_our_server():
    url = "ipc://" + os.path.join(TMP, "rep.sock")
    srv = Server(url)
    try:
        st = os.stat(os.path.join(TMP, "rep.sock"))
        assert st.st_mode & 0o777 == 0o660, oct(st.st_mode)
        # a gen request: the test server echoes the input as output
        inp = bytes(RNG.randrange(256) for _ in range(4 * 64))
        req = {"v": 1, "op": "gen", "id": 987654321, "steps": 3, "batch": 16,
               "seed": 2**63 + 5, "input": inp}
        rep = nngcat_call(url, msgpack.packb(req, use_bin_type=True))
        assert rep["ok"] is True and rep["id"] == req["id"] and rep["op"] == "gen", rep
        assert rep["steps"] == 3 and rep["batch"] == 16 and rep["output"] == inp
        assert rep["checksum"] == req["seed"] ^ 0x9e3779b97f4a7c15
        assert isinstance(rep["total_ms"], float)
        # every other request gets its op's sample reply, with the request's id
        for op in SCHEMA["ops"]:
            if op in ("event", "gen"):
                continue
            m = rand_msg(op, "request")
            rep = nngcat_call(url, msgpack.packb(m, use_bin_type=True))
            assert rep["ok"] is True and rep["id"] == m["id"] and rep["op"] == op, rep
            body = {k for k in rep if k not in ("v", "op", "id", "ok")}
            assert body == {f["key"] for f in fields_of(op, True)}, (op, sorted(body))
        # bytes that are not a message: an error reply, without id or op
        rep = nngcat_call(url, b"hello, not msgpack")
        assert rep["ok"] is False and rep["err"] == ERR["bad_message"] and rep["id"] == 0
        assert "op" not in rep and rep["msg"]
        # an unknown op with a readable id: the id comes back
        rep = nngcat_call(url, msgpack.packb({"v": 1, "op": "frob", "id": 77}))
        assert rep == {"v": 1, "id": 77, "ok": False, "err": ERR["unknown_op"],
                       "msg": rep["msg"]} and "frob" in rep["msg"], rep
        # a known op with a bad field: id and op come back
        rep = nngcat_call(url, msgpack.packb({"v": 1, "op": "pin", "id": 78, "name": "a",
                                              "pinned": "yes"}))
        assert rep["err"] == ERR["bad_type"] and rep["id"] == 78 and rep["op"] == "pin", rep
        # a reply sent to a server is refused
        rep = nngcat_call(url, msgpack.packb({"v": 1, "op": "pin", "id": 79, "ok": True}))
        assert rep["err"] == ERR["invalid"] and rep["id"] == 79, rep
    finally:
        log = srv.stop()
    assert "bad request" in log, log


def t_our_client_to_our_server_over_tcp():
    port = RNG.randrange(20000, 40000)
    url = "tcp://127.0.0.1:%d" % port
    srv = Server(url)
    try:
        m = rand_msg("heartbeat", "request")
        p = tool("call", url, "--timeout", "5000", data=msgpack.packb(m, use_bin_type=True))
        got = json.loads(p.stdout.decode())
        assert p.returncode == 0 and got["ok"] is True and got["id"] == m["id"], got
        assert got["op"] == "heartbeat"
    finally:
        srv.stop()
    # nobody listening any more: the one-shot call cannot connect
    p = tool("call", url, "--timeout", "500", data=msgpack.packb(m, use_bin_type=True))
    got = json.loads(p.stdout.decode())
    assert p.returncode == 2 and got["error"] == "connect", got


CASES = [t_schema, t_python_encodes_c_decodes, t_c_encodes_python_decodes,
         t_c_samples_match_python, t_python_malformed_gets_exact_codes,
         t_nngcat_to_our_server, t_our_client_to_our_server_over_tcp]


def main():
    global SCHEMA
    h.need(TOOL)
    SCHEMA = json.loads(tool("schema").stdout.decode())
    try:
        return h.run_cases(CASES, sys.argv[1:], make=None)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)

if __name__ == "__main__":
    sys.exit(main())
