#!/usr/bin/python3
"""Baton's Jinja engine against jinja2 (the oracle), byte for byte.

Every template in text/fixtures/templates is rendered over a set of
conversations (system or not, multi-turn, tools and tool calls, reasoning,
thinking on and off, generation prompt on and off, empty and unicode
content) by jinja2 in the environment transformers' apply_chat_template
builds, and by build/bin/baton-jinja --batch. Where jinja2 renders, Baton
must give the same bytes; where jinja2 raises, Baton must refuse too, and
with the same message when the template itself raised (raise_exception).

Run: BUILD=build /usr/bin/python3 text/jinja_test.py [-v]
Needs python3-jinja2 (scripts/install-deps.sh test).
"""
import copy
import json
import os
import subprocess
import sys
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", "build")
BIN = os.path.join(ROOT, BUILD, "bin", "baton-jinja")
TEMPLATES = os.path.join(ROOT, "text", "fixtures", "templates")
VERBOSE = "-v" in sys.argv

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja_test: SKIP (python3-jinja2 is not installed: scripts/install-deps.sh test)")
    sys.exit(0)


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' definition (utils/chat_template_utils.py)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two numbers",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]},
        "return": {"type": "number"}}},
]

UNICODE = "Grüße, 世界! 🎉 naïve café — «quotes» \"double\" 'single' \\ back {{ not a tag }} {% nope %}\n  indented\ttab  "


def call(name, args, cid="call12345", as_string=False):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


def conversations():
    U = lambda c: {"role": "user", "content": c}
    A = lambda c: {"role": "assistant", "content": c}
    S = lambda c: {"role": "system", "content": c}
    base = {
        "single": [U("Hello!")],
        "system": [S("You are terse."), U("Hello!")],
        "multi": [U("Hi"), A("Hello, how can I help?"), U("What is 2+2?")],
        "system_multi": [S("Be brief."), U("Hi"), A("Hello."), U("Tell me a joke"), A("No."),
                         U("Please?")],
        "assistant_last": [U("Hi"), A("Hello there.")],
        "empty": [U("")],
        "empty_system": [S(""), U("x"), A(""), U("")],
        "unicode": [S(UNICODE), U(UNICODE), A(UNICODE), U("  spaces  ")],
        "reasoning": [U("Why?"), {"role": "assistant", "content": "Because.",
                                  "reasoning_content": "Let me think about it.\n"}, U("And?")],
        "think_inline": [U("Why?"), A("<think>\nHmm, let me see.\n</think>\n\nBecause."), U("And?")],
        "think_last": [U("Why?"), A("<think>\nplanning\n</think>\n\nDone.")],
        "tools": [S("Use tools."), U("Weather in Paris?"),
                  {"role": "assistant", "content": "",
                   "tool_calls": [call("get_weather", {"location": "Paris", "unit": "celsius"})]},
                  {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                   "content": "{\"temperature\": 21}"},
                  A("It is 21 °C in Paris.")],
        "tools_none_content": [U("Add 1 and 2"),
                               {"role": "assistant", "content": None,
                                "tool_calls": [call("add", {"a": 1, "b": 2.5})]},
                               {"role": "tool", "tool_call_id": "call12345", "content": "3.5"},
                               U("thanks")],
        "tools_string_args": [U("Weather?"),
                              {"role": "assistant", "content": None,
                               "tool_calls": [call("get_weather", {"location": "Oslo"},
                                                   as_string=True)]},
                              {"role": "tool", "tool_call_id": "call12345", "content": "cold"}],
        "two_calls": [U("Both"),
                      {"role": "assistant", "content": "Calling both.",
                       "tool_calls": [call("add", {"a": 1, "b": 2}, "callAAAAA"),
                                      call("get_weather", {"location": "Rome"}, "callBBBBB")]},
                      {"role": "tool", "tool_call_id": "callAAAAA", "content": "3"},
                      {"role": "tool", "tool_call_id": "callBBBBB", "content": "warm"},
                      A("3, warm")],
        "not_alternating": [U("one"), U("two")],
        "system_only": [S("alone")],
        "no_messages": [],
        "content_parts": [{"role": "user", "content": [{"type": "text", "text": "part one"},
                                                       {"type": "text", "text": "part two"}]}],
    }
    out = []
    for name, msgs in base.items():
        with_tools = name.startswith("tools") or name == "two_calls"
        for agp in (True, False):
            for think in ((None, True, False) if name in ("single", "multi", "reasoning",
                                                          "think_inline", "tools") else (None,)):
                for tools in ((TOOLS, None) if with_tools or name == "single" else (None,)):
                    ctx = {"messages": copy.deepcopy(msgs), "tools": tools, "documents": None,
                           "add_generation_prompt": agp, "bos_token": "<s>", "eos_token": "</s>"}
                    if think is not None:
                        ctx["enable_thinking"] = think
                    label = "%s agp=%d think=%s tools=%s" % (name, agp, think, bool(tools))
                    out.append((label, ctx))
    return out


def oracle(env, source, ctx):
    try:
        return ("text", env.from_string(source).render(**ctx))
    except TemplateRaised as e:
        return ("raised", str(e))
    except Exception as e:  # what jinja2 or Python refused
        return ("error", "%s: %s" % (type(e).__name__, e))


def baton(path, ctxs):
    lines = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in ctxs)
    p = subprocess.run([BIN, "--batch", path], input=lines.encode(), capture_output=True,
                       timeout=120)
    res = [json.loads(l) for l in p.stdout.decode().splitlines()]
    if len(res) == 1 and "load_error" in res[0]:
        return res[0]["load_error"]
    if p.returncode != 0 or len(res) != len(ctxs):
        raise SystemExit("baton-jinja failed on %s (rc %d): %s" % (path, p.returncode, p.stderr))
    return res


def main():
    if not os.path.exists(BIN):
        raise SystemExit("jinja_test: %s is missing (make CUDA=0 all)" % BIN)
    env = environment()
    convs = conversations()
    total = equal = refused_both = bad = 0
    refused_templates = []
    for fn in sorted(os.listdir(TEMPLATES)):
        if not fn.endswith(".jinja"):
            continue
        path = os.path.join(TEMPLATES, fn)
        source = open(path, encoding="utf-8").read()
        got = baton(path, [c for _, c in convs])
        if isinstance(got, str):
            refused_templates.append((fn, got))
            print("  %-36s refused at load: %s" % (fn, got))
            continue
        t_eq = t_ref = t_bad = 0
        for (label, ctx), g in zip(convs, got):
            kind, want = oracle(env, source, copy.deepcopy(ctx))
            total += 1
            ok = False
            if kind == "text":
                ok = g.get("text") == want
                t_eq += ok
            else:
                ok = "error" in g and (kind == "error" or g["error"] == want)
                t_ref += ok
            if not ok:
                t_bad += 1
                if t_bad <= 3 or VERBOSE:
                    print("  MISMATCH %s [%s]\n    jinja2 %s: %r\n    baton: %r" %
                          (fn, label, kind, want[:600], g))
        equal += t_eq
        refused_both += t_ref
        bad += t_bad
        print("  %-36s %3d conversations: %3d byte-equal, %3d refused by both, %d mismatches" %
              (fn, len(convs), t_eq, t_ref, t_bad))
    print("jinja_test: %d templates x %d conversations = %d renders: %d byte-equal, "
          "%d refused by both, %d mismatches; %d templates refused at load" %
          (total // max(len(convs), 1), len(convs), total, equal, refused_both, bad,
           len(refused_templates)))
    if bad or refused_templates:
        sys.exit(1)


if __name__ == "__main__":
    main()
