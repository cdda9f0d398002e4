#!/usr/bin/python3
"""metrics_test.py: docs/reference/http-api.md has a row for every family
of the serving metrics' table (proto/base/serving.c's rows), with its
type, who writes it (engine, door) and vLLM's name, so people moving
their vLLM dashboards find each one.

The last line is "N passed, N failed".
"""
# test: pure (it reads the tree's sources and docs only): make test's
# sanitizer pass skips it (tests/run.sh --skip-pure).
import os
import re
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

ROW = re.compile(r'\{ "(\w+)", "(gauge|counter|histogram)",\s*(?:"(?:[^"\\]|\\.)*"\s*)+,\s*"([^"]*)",\s*'
                 r'([ED](?: \| [ED])?),', re.S)


def rows():
    src = open(os.path.join(ROOT, "proto", "base", "serving.c")).read()
    out = [(m.group(1), m.group(2), m.group(3), m.group(4)) for m in ROW.finditer(src)]
    assert len(out) >= 10, out  # the pattern still reads the table
    return out


def t_every_row_documented():
    doc = open(os.path.join(ROOT, "docs", "reference", "http-api.md")).read()
    missing = []
    for name, typ, vllm, scope in rows():
        line = [x for x in doc.splitlines() if re.match(r"^\| `%s(\{[a-z_]+\})?` \|" % name, x)]
        if len(line) != 1:
            missing.append("%s: no row" % name)
            continue
        cells = [c.strip() for c in line[0].strip("|").split("|")]
        where = {"E": "engine", "D": "door"}
        want_where = ", ".join(where[x] for x in ("E", "D") if x in scope)
        if cells[1] != typ or cells[2] != want_where:
            missing.append("%s: type %s and where %s, the page says %s, %s" % (name, typ, want_where, cells[1],
                                                                              cells[2]))
        v = re.match(r"\(?(vllm:\w+)", vllm)
        if v and v.group(1) not in cells[3]:
            missing.append("%s: vLLM's %s not in its row" % (name, v.group(1)))
    assert not missing, missing
    return "%d families" % len(rows())


if __name__ == "__main__":
    sys.exit(h.run_cases([t_every_row_documented], only=sys.argv[1:], make=None))
