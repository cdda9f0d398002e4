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
    print("0 passed, 0 failed")
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

# A schema with arrays, enums, defaults, oneOf and type lists (what
# gpt-oss's and Hermes' templates turn into type signatures).
COMPLEX_TOOLS = TOOLS + [
    {"type": "function", "function": {
        "name": "search", "description": "Searches the notes",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to find"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "points": {"type": "array", "items": {"type": "object", "properties": {
                "x": {"type": "number"}, "y": {"type": "number"}}}},
            "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
            "limit": {"type": "integer", "nullable": True, "default": 10},
            "ratio": {"type": "number", "default": 0.5},
            "target": {"oneOf": [{"type": "string", "description": "a name"},
                                 {"type": "integer"}]},
            "kind": {"type": ["string", "null"]},
            "extra": {"type": "object", "additionalProperties": {"type": "string"}}},
            "required": ["query"]}}},
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
        if name in ("single", "tools", "two_calls"):
            ctx = {"messages": copy.deepcopy(msgs), "tools": COMPLEX_TOOLS, "documents": None,
                   "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
            out.append(("%s complex tools" % name, ctx))
        if name in ("single", "system_multi", "tools"):
            # documents, and other chat_template_kwargs templates read
            ctx = {"messages": copy.deepcopy(msgs), "tools": TOOLS if name == "tools" else None,
                   "documents": [{"doc_id": 1, "title": "A", "text": "Paris is in France."},
                                 {"doc_id": "b2", "text": "Zürich is in Switzerland."}],
                   "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>",
                   "thinking": True, "controls": {"citations": True, "length": "short"},
                   "builtin_tools": ["code_interpreter", "brave_search"], "date_string": "01 Dec 2026"}
            out.append(("%s documents+kwargs" % name, ctx))
    return out



# Constructs one by one: each snippet rendered by both over CONTEXT.
CONTEXT = {"messages": [{"role": "system", "content": " Be brief.\n"},
                        {"role": "user", "content": "Hi there"},
                        {"role": "assistant", "content": "<think>\nx\n</think>\n\nHello",
                         "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1, "b": [1, 2.5, None, True]}}}]}],
           "tools": None, "n": 7, "f": 2.5, "s": "Hello, World", "u": "Grüße 世界 🎉",
           "lst": [3, 1, 2], "d": {"b": 2, "a": 1, "c": {"x": [1, {"y": "z"}]}},
           "empty": [], "none": None, "t": True, "big": 12345678901234, "neg": -7,
           "fl": [0.1, 1.0, 1e20, 1e-7, 123.456, -0.0, 3.0e15, 1e16]}

SNIPPETS = [
    "{{ 1 + 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 6 / 3 }}",
    "{{ n * 'ab' }} {{ 'x' ~ n ~ f ~ none ~ t }} {{ 'a' + 'b' }} {{ [1] + [2] }}",
    "{{ fl }} {% for x in fl %}{{ x }} {% endfor %}",
    "{{ f * 2 }} {{ 1.5 + 1 }} {{ 10 / 4 }} {{ 0.1 + 0.2 }} {{ 2 ** -1 }} {{ big * 1000 }}",
    "{{ 'straße ﬁx' | upper }} {{ 'ß' | title }} {{ 'İx' | lower }}",
    "{{ s.lower() }} {{ s.upper() }} {{ s.title() }} {{ 'hello world'.capitalize() }} {{ u.upper() }} {{ u.lower() }}",
    "{{ s.split(', ') }} {{ ' a  b c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}",
    "[{{ '  x y \n'.strip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '\n\nhi\n'.lstrip('\n') }}] [{{ ' hi '.rstrip() }}]",
    "{{ s.startswith('Hell') }} {{ s.endswith('ld') }} {{ s.startswith(('a', 'H')) }} {{ s.find('o') }} {{ s.rfind('o') }} {{ s.count('l') }}",
    "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 2) }} {{ s | replace('o', '0') }} {{ 'abc'.replace('', '-') }}",
    "{{ s[0] }} {{ s[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[:-3] }} {{ u[1:4] }} {{ u[-1] }} {{ lst[1:] }} {{ lst[::2] }} {{ lst[-1] }}",
    "{{ lst | length }} {{ s | length }} {{ u | length }} {{ d | length }} {{ lst | first }} {{ lst | last }} {{ lst | join(', ') }} {{ lst | sum }}",
    "{{ lst | sort }} {{ lst | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ lst | max }} {{ lst | min }} {{ lst | reverse | list }}",
    "{{ d | tojson }} {{ d | tojson(indent=2) }} {{ messages[2].tool_calls[0].function.arguments | tojson }}",
    "{{ u | tojson }} {{ 'a\"b\\\\c\n\t\x01' | tojson }} {{ fl | tojson }} {{ none | tojson }} {{ t | tojson }} {{ empty | tojson(indent=4) }} {{ {} | tojson }}",
    "{{ d | tojson(separators=(',', ':')) }} {{ lst | tojson(indent=0) }}",
    "{{ d }} {{ lst }} {{ ('a', 1) }} {{ ('a',) }} {{ [none, true, 'it\\'s', \"q\\\"\"] }} {{ {'k': [1, 'v']} }}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %} {{ d.keys() | list }} {{ d.values() | list | length }}",
    "{% for k, v in d | items %}{{ k }}:{{ v }} {% endfor %}{% for k, v in d | dictsort %}{{ k }}{% endfor %}",
    "{% for x in lst %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}",
    "{% for x in lst %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}{{ loop.cycle('a', 'b') }} {% endfor %}",
    "{% for x in lst if x > 1 %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}",
    "{% for x in empty %}{{ x }}{% else %}nothing{% endfor %} {% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% if x == 1 %}{% break %}{% endif %}{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% set ns = namespace(total=0, items=[]) %}{% for x in lst %}{% set ns.total = ns.total + x %}{% endfor %}{{ ns.total }}",
    "{% set x = 1 %}{% for i in lst %}{% set x = i %}{% endfor %}{{ x }}",
    "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set c = (3, 4) %}{{ c[1] }}",
    "{% set block %}hello {{ n }}{% endset %}[{{ block }}] {{ block | upper }}",
    "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', greeting='Yo') }} {{ greet('C', 'Hey') }}",
    "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
    "{% macro fact(k) %}{% if k <= 1 %}1{% else %}{{ k * fact(k - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}",
    "{{ x is defined }} {{ n is defined }} {{ none is none }} {{ s is string }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ t is boolean }}",
    "{{ d is mapping }} {{ lst is iterable }} {{ s is sequence }} {{ n is even }} {{ n is odd }} {{ n is divisibleby 7 }} {{ t is true }} {{ t is false }}",
    "{{ none is not none }} {{ n is not string }} {{ 'A' is upper }} {{ 'a' is lower }} {{ 1 is in lst }} {{ n is eq 7 }} {{ n is gt 3 }} {{ x is undefined }}",
    "{{ 1 in lst }} {{ 5 not in lst }} {{ 'ell' in s }} {{ 'a' in d }} {{ 'zz' not in d }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 5 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }} {{ [1] == [1] }} {{ d == d }} {{ 'a' != 'b' }} {{ x == y }}",
    "{{ n if n > 5 else 0 }} {{ 'yes' if none else 'no' }} [{{ 'a' if false }}] {{ not n }} {{ not empty }} {{ n and s }} {{ empty or 'dflt' }} {{ none or 0 or '' }}",
    "{{ x | default('dflt') }} {{ '' | default('dflt') }} {{ '' | default('dflt', true) }} {{ none | default('z') }} {{ x | d('q') }}",
    "[{{ x }}] [{{ x | trim }}] [{{ x | length }}] [{{ x | join }}] {% for i in x %}no{% endfor %} {{ x is iterable }}",
    "{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | map(attribute='role') | join(',') }} {{ messages | rejectattr('role', 'eq', 'system') | map(attribute='role') | list }}",
    "{{ lst | map('string') | join('-') }} {{ ['a', 'b'] | map('upper') | list }} {{ lst | select('odd') | list }} {{ lst | reject('odd') | list }} {{ messages | selectattr('tool_calls') | list | length }}",
    "{{ messages | selectattr('tool_calls', 'defined') | list | length }} {{ messages | map(attribute='nope', default='D') | list }}",
    "{{ [1, 2, 1, 3] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ lst | list }} {{ s | list | length }} {{ 'abc' | list }}",
    "{{ '%s' | e }} {{ '<a href=\"x\">&\\'</a>' | escape }} {{ 'x' | safe }} {{ 3.7 | int }} {{ '42' | int }} {{ 'x' | int }} {{ '3.5' | float }} {{ 4 | float }} {{ -3 | abs }}",
    "{{ 2.5 | round }} {{ 3.5 | round }} {{ 2.7 | round(0, 'floor') }} {{ 'hi there you' | wordcount }} {{ 'a b' | title }} {{ 'aBc' | capitalize }} {{ 'x' | string }} {{ 5 | string }}",
    "{{ 'line1\nline2\n\nline4' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb\n' | indent(2, blank=true) }}|{{ 'x' | indent(first=true) }}",
    "{{ range(3) | list }} {{ range(1, 10, 3) | list }} {% for i in range(2) %}{{ i }}{% endfor %} {{ range(5) | length }} {{ range(3)[1] }}",
    "{{ dict(a=1, b=2) }} {{ {'a': 1}.get('a') }} {{ d.get('zz', 'none') }} {{ d.get('zz') }} {{ d['c']['x'][1].y }} {{ d.c.x.0 }}",
    "{{ messages[0]['content'] | trim }} {{ messages[-1].content.split('</think>')[-1].lstrip('\n') }} {{ messages[5] is defined }}",
    "{{ strftime_now('%Y') | length }} {{ 'a-b' is string }}",
    "  {% if true %}\n    x\n  {% endif %}\n  y  \n{% for i in lst %}\n  {{ i }}\n{% endfor %}\nend\n",
    "a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e {# c #} f {#- c -#} g\n  {#- c #}\n h",
    "{% raw %}{{ not rendered }}{% endraw %} {%- raw -%}  {% x %}  {%- endraw -%} z",
    "a\n  {%+ if true %}b{% endif +%}\nc\n  {% if true %}\nd{% endif %}",
    "\n\n  {% set x = 1 %}\n  {{ x }}\n  {%- set y = 2 -%}\n\n  {{ y }}\n\n",
    "{% filter upper %}shout {{ s }}{% endfilter %} {% with a = 5, b = 6 %}{{ a + b }}{% endwith %}",
    "{{ 'a' 'b' }} {{ \"it's\" }} {{ 'tab\\there' }} {{ '\\u00e9\\x41' }} {{ 'back\\\\slash' }} {{ 'unk\\q' }}",
    "{{ -n }} {{ +n }} {{ -f }} {{ - 3 | abs }} {{ (1, 2) | list }} {{ [1, [2, 3]] | tojson }} {{ 1_000 }}",
    "{{ True }} {{ False }} {{ None }} {{ true and false }} {{ n > 3 and n < 10 }}",
    "{{ lst.index(2) }} {{ lst.count(1) }} {{ ', '.join(['a', 'b']) }} {{ 'a\nb\r\nc'.splitlines() }} {{ '123'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' '.isspace() }}",
    "{{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }} {{ 'Hello'.upper().lower()[1:3] }}",
    "{{ raise_exception('custom failure') }}",
    "{{ x.y }}",
    "{{ none.x }} [{{ n.x }}] [{{ s.nope }}] [{{ lst[10] }}] [{{ d.nope }}]",
    "{{ 1 + 'a' }}",
    "{{ lst | tojson(sort_keys=false) }} {{ 1 / 0 }}",
    "{{ x + 1 }}",
    "{{ messages.append(1) }}",
    "{% for a, b in lst %}{% endfor %}",
    "{{ lst | selectattr('x') | length }}",
    "{{ lst | selectattr('x') }}",
    "{{ x | tojson }}",
    "{{ 'a' < 1 }}",
    "{{ 'abc' * -1 }}[{{ [1] * 2 }}]",
    "{{ messages[0].content is string and messages[1].content|length > 0 }} {{ (messages | last).role }}",
    "{% if messages[0].role == 'system' %}{% set sys = messages[0].content %}{% set msgs = messages[1:] %}{% endif %}{{ sys }}{{ msgs | length }}",
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% elif m.role == 'assistant' %}A{% else %}S{% endif %}{% endfor %}",
    "{% for m in messages|reverse %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %} {{ messages|length - 1 }}",
    "{%- for tool in [{'function': {'name': 'x', 'description': 'y'}}] %}\n    {{- tool | tojson(indent=4) }}\n{%- endfor %}",
    "{% macro m() %}{{ late }}{% endmacro %}{% set late = 'L' %}{{ m() }}",
    "{% set x = 'outer' %}{% macro m() %}{{ x }}{% endmacro %}{% for i in [1] %}{% set x = 'inner' %}{{ m() }}{% endfor %}",
    "{% for a in [1, 2] %}{% set outer = loop %}{% for b in [3, 4] %}{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}",
    "{% for i in [1, 2] %}{% if i == 1 %}{% set seen = 'y' %}{% endif %}[{{ seen }}]{% endfor %}",
    "{% if n == 1 %}one{% elif n == 7 %}seven{% elif n == 8 %}eight{% else %}other{% endif %}",
    "{{ 10 / 5 }} {{ 3 * 1.0 }} {{ 2 ** 0.5 }} {{ 1e300 * 1e10 }} {{ -1e300 * 1e10 }} {{ 7.0 // 2 }} {{ -7.5 % 2 }} {{ 1 / 3 }}",
    "{{ f.__class__ }}[{{ s._x }}]",
    "{{ d.items() }}",
    "{{ namespace(a=1) }}",
    "{{ {'é': ['ü', {'k': []}], 'n': none} | tojson(indent=2) }}",
    "{{ messages[2]['tool_calls'][0]['function']['arguments']['b'][1] }} {{ messages[2].tool_calls[0].function.arguments.b | length }}",
    "{{ 'b' > 'a' }} {{ 'é' > 'z' }} {{ 'abc' < 'abd' }} {{ [2] > [1, 5] }}",
    "{{ lst | sort | first }} {{ lst | sort(attribute=none) }} {{ messages | sort(attribute='role') | map(attribute='role') | list }}",
    "{{ messages | map(attribute='content') | map('length') | list }}",
    "{{ messages | selectattr('role', 'in', ['user', 'system']) | map(attribute='role') | join }}",
    "{{ messages | groupby('role') }}",
    "{{ 'x' if 'y' in s else 'z' }} {{ (n > 3) + 1 }} {{ t + t }}",
    "{{ ('a' ~ 'b') * 2 }} {{ 'ab' * 0 }}|{{ 1 ~ 2 + 3 }}",
    "{% set l = [1, 2, 3] %}{{ l[1:-1] }} {{ l[5:] }} {{ l[-10:2] }} {{ l[::-2] }} {{ 'hello'[-3:] }} {{ 'hello'[10:] }}|",
    "{%- for m in messages -%}\n  {{ m.role }}\n{% endfor -%}\nX",
    "  {%- set x = 1 %}\n  {{- x }}\n{{ x -}}\n  after",
    "{% for c in 'añb' %}{{ c }}.{% endfor %} {{ 'añb' | reverse }} {{ 'añb' | list }}",
    "{{ n | string + 'x' }} {{ n ~ '' }} {{ [n] | join('|') }} {{ [1.5, none, true] | join(',') }}",
    "{{ tools is none }} {{ tools is defined }} {{ tools | default([], true) | length }}",
    "{{ ' '.join(['a', 'b']) }} {{ 'a b c'.split(' ', 1) }} {{ '  a b  '.split(none, 1) }}",
    "{{ messages | length is divisibleby 3 }} {{ n is divisibleby(2) }} {{ 0 is false }} {{ 1 is sameas true }} {{ none is sameas none }}",
    "{{ '{\"a\": 1}' | tojson }} {{ 1.5 | tojson }} {{ 10 | tojson }} {{ -0.0 | tojson }} {{ 1e100 | tojson }}",
    "{% set s2 = s | replace('World', 'There') %}{{ s2 }} {{ s2 is string }}",
    "{% set g = lst | select('odd') %}{{ g | first }}|{{ g | list }}|{{ g | list }}|{% set h = lst | map('string') %}{{ '1' in h }}{{ h | join }}",
    "{% set g = messages | selectattr('role', 'ne', 'x') %}{% for m in g %}{{ m.role }}{% endfor %}|{% for m in g %}{{ m.role }}{% endfor %}|{{ g is iterable }}{{ g is sequence }}",
    "a \u3000\u00a0 {%- if true -%} \u00a0\u2003b\u3000 {%- endif %}\n\u3000\u00a0{% if true %}c{% endif %}\n \x1c{# x #}d {{- '\u3000' -}} \u3000e",
    "{{ 123456789.123456789 }} {{ 0.000012 }} {{ -1.5e-10 }} {{ 5 // 2.0 }} {{ 1/7 }} {{ 2.5e-5 * 4 }} {{ 1e15 + 0.3 }} {{ 9007199254740993.0 }}",
    "{{ {'b': 1, 'a': 2} | dictsort(by='value') }} {{ [{'a': 2}, {'a': 1}] | sort(attribute='a') | map(attribute='a') | list }} {{ messages | map(attribute='role') | unique | list }}",
    "{{ x | default(none) is none }} {{ '{' ~ '}' }} {{ {'a': {'b': 1}} }} {{ {'a': {'b': 1}}['a'] }}",
    "{{ [3, 'a'] | sort }}",
    "{{ 2 ** 63 }}",
    "{{ 'x' ~ (1, 2) }} {{ 'x' ~ [1.0, 'y'] }} {{ 'x' ~ {'k': none} }} {{ (1,) | tojson }}",
    "{% macro box(title) %}[{{ title }}: {{ caller() }}]{% endmacro %}{% call box('T') %}inside {{ n }}{% endcall %}",
    "{% macro each(items) %}{% for i in items %}{{ caller(i, loop.index) }}{% endfor %}{% endmacro %}{% call(x, k) each(lst) %}{{ k }}={{ x }};{% endcall %}",
    "{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}|{% call m() %}{% endcall %}",
    "{{ caller is defined }} {{ varargs is defined }} {{ loop is defined }}",
]


def oracle(env, source, ctx):
    try:
        if isinstance(source, str):
            source = env.from_string(source)
        return ("text", source.render(**ctx))
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


# What Baton refuses by design where jinja2 prints Python's repr of an
# object (an address, dict_items(...), <Namespace ...>) or uses a filter
# the engine lacks: a refusal, never a wrong render.
REFUSED_BY_DESIGN = {
    "{{ d.items() }}",
    "{{ namespace(a=1) }}",
    "{{ messages | groupby('role') }}",
    "{{ 2 ** 63 }}",  # Python's integers have no bound; the engine's are 64 bits
}


def verdict(kind, want, got, by_design=False):
    """'equal', 'refused' (both), 'design' (Baton refuses where jinja2 prints
    a Python object) or 'bad'."""
    if kind == "text" and "error" in got and (by_design or "<generator object" in want):
        return "design"
    if kind == "text":
        return "equal" if got.get("text") == want else "bad"
    # jinja2 raised: Baton must refuse, with the template's own message
    return "refused" if "error" in got and (kind == "error" or got["error"] == want) else "bad"


def snippets(env):
    """Each snippet through both engines; returns the number of mismatches."""
    import tempfile
    bad = equal = refused = by_design = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i, src in enumerate(SNIPPETS):
            path = os.path.join(tmp, "s%d.jinja" % i)
            with open(path, "w", encoding="utf-8") as f:
                f.write(src)
            kind, want = oracle(env, src, copy.deepcopy(CONTEXT))
            got = baton(path, [CONTEXT])
            if isinstance(got, str):
                got = {"error": got}
            else:
                got = got[0]
            v = verdict(kind, want, got, src in REFUSED_BY_DESIGN)
            equal += v == "equal"
            refused += v == "refused"
            by_design += v == "design"
            ok = v != "bad"
            if not ok:
                bad += 1
                print("  SNIPPET MISMATCH %r\n    jinja2 %s: %r\n    baton: %r" % (src, kind, want, got))
            elif VERBOSE:
                print("  ok %r -> %r" % (src[:60], want[:80]))
    print("jinja_test: %d constructs: %d byte-equal, %d refused by both, %d refused by Baton "
          "by design (jinja2 prints a Python object's repr, or a filter Baton lacks), %d mismatches" %
          (len(SNIPPETS), equal, refused, by_design, bad))
    return bad


def main():
    if not os.path.exists(BIN):
        raise SystemExit("jinja_test: %s is missing (make CUDA=0 all)" % BIN)
    env = environment()
    bad_snippets = snippets(env)
    convs = conversations()
    total = equal = refused_both = bad = 0
    refused_templates = []
    templates_ok = templates_bad = 0
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
        try:
            compiled = env.from_string(source)
        except Exception:  # jinja2 refuses it: oracle() reports that for each render
            compiled = source
        for (label, ctx), g in zip(convs, got):
            kind, want = oracle(env, compiled, copy.deepcopy(ctx))
            total += 1
            v = verdict(kind, want, g)
            t_eq += v == "equal"
            t_ref += v == "refused"
            if v not in ("equal", "refused"):
                t_bad += 1
                if t_bad <= 3 or VERBOSE:
                    print("  MISMATCH %s [%s]\n    jinja2 %s: %r\n    baton: %r" %
                          (fn, label, kind, want[:600], g))
        equal += t_eq
        refused_both += t_ref
        bad += t_bad
        templates_ok += t_bad == 0
        templates_bad += t_bad != 0
        print("  %-36s %3d conversations: %3d byte-equal, %3d refused by both, %d mismatches" %
              (fn, len(convs), t_eq, t_ref, t_bad))
    print("jinja_test: %d templates x %d conversations = %d renders: %d byte-equal, "
          "%d refused by both, %d mismatches; %d templates refused at load" %
          (total // max(len(convs), 1), len(convs), total, equal, refused_both, bad,
           len(refused_templates)))
    # one check per template, one for the constructs
    print("%d passed, %d failed" % (templates_ok + (bad_snippets == 0),
                                    templates_bad + len(refused_templates) + (bad_snippets != 0)))
    if bad or refused_templates or bad_snippets:
        sys.exit(1)


if __name__ == "__main__":
    main()
