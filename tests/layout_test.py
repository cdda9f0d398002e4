#!/usr/bin/env python3
# test: pure (reads the tree only): make test's sanitizer pass skips it
"""layout_test.py: the layout rule of docs/internals/layout.md, checked on
the tree (no program runs; the sanitizer pass skips it).

- Every component (the Makefile's COMPONENTS, bottom to top) is one folder
  with one door header, named as the folder: engine/model/model.h.
- A file outside a component includes only that component's door.
- A file of a component includes only its own headers and the doors of
  components below it. Two allowances, both one level deep: a folder
  inside another may include its parent's door (a backend implements the
  interface of engine/backend/, whose registry sits above the backends);
  tests may also include tests/*.h and a lower component's test fixtures
  (*_fixture.h, testdata/).
- A program's main (<component>/main_<program>.c) may include the door of
  any component: it is linked with every library (baton-arena checks the
  tokenizer it imports with text/).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.dont_write_bytecode = True


def components():
    mk = open(os.path.join(ROOT, "Makefile")).read()
    m = re.search(r"^COMPONENTS\s*:=\s*((?:.*\\\n)*.*)$", mk, re.M)
    return m.group(1).replace("\\\n", " ").split()


COMPS = components()
RANK = {c: i for i, c in enumerate(COMPS)}
INC = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def owner(path):
    """The innermost component a file or header belongs to, or None."""
    d = os.path.dirname(path)
    while d:
        if d in RANK:
            return d
        d = os.path.dirname(d)
    return None


def door(c):
    return "%s/%s.h" % (c, os.path.basename(c))


def sources():
    for c in COMPS:
        top = os.path.join(ROOT, c)
        for f in sorted(os.listdir(top)):
            if f.endswith((".c", ".h", ".cu", ".cuh")):
                yield c, "%s/%s" % (c, f)


def t_every_component_has_its_door():
    missing = [c for c in COMPS if not os.path.exists(os.path.join(ROOT, door(c)))]
    assert not missing, "components without a door header: %s" % missing


def t_includes_follow_the_layout():
    bad = []
    for c, f in sources():
        is_test = re.search(r"_(test|fuzz)\.c$|_fixture\.h$", f) is not None
        # a program's main sits above every library it links: any door
        is_main = re.match(r"main_[^/]*\.c$", os.path.basename(f)) is not None
        for inc in INC.findall(open(os.path.join(ROOT, f), encoding="utf-8").read()):
            o = owner(inc)
            if o is None:
                if inc.startswith("tests/") and is_test:
                    continue
                if inc.startswith(("tests/", "build/")):
                    bad.append("%s: %s (test support outside a test)" % (f, inc))
                continue
            if o == c:
                continue
            fixture = re.search(r"_fixture\.h$|/testdata/", inc) is not None
            if is_test and fixture and RANK[o] < RANK[c]:
                continue
            if inc != door(o):
                bad.append("%s: %s (not %s's door %s)" % (f, inc, o, door(o)))
            elif RANK[o] > RANK[c] and o != os.path.dirname(c) and not is_main:
                bad.append("%s: %s (%s is above %s)" % (f, inc, o, c))
    assert not bad, "%d includes break the layout:\n  %s" % (len(bad), "\n  ".join(bad))


CASES = [t_every_component_has_its_door, t_includes_follow_the_layout]

if __name__ == "__main__":
    import harness as h  # noqa: E402
    sys.exit(h.run_cases(CASES, sys.argv[1:], make=None))
