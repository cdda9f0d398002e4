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
- The page's table names every component, with its source and test files
  counted as they are (exactly) and their lines within a tenth (they move
  with every change; the files only when one is added, split or removed).
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


TESTS = re.compile(r"(_test\.c|_fuzz\.c|_fixture\.h|_test\.py|_test\.sh)$")


def counts(c):
    """(source files, lines, test files, lines) of component c, as the page
    counts them: sources are its C and CUDA files and headers, tests its
    *_test.c, *_fuzz.c, *_fixture.h, *_test.py and *_test.sh."""
    top = os.path.join(ROOT, c)
    src, tst = [], []
    for f in sorted(os.listdir(top)):
        path = os.path.join(top, f)
        if not os.path.isfile(path):
            continue
        if TESTS.search(f):
            tst.append(path)
        elif f.endswith((".c", ".h", ".cu", ".cuh")):
            src.append(path)

    def lines(paths):
        return sum(open(x, "rb").read().count(b"\n") for x in paths)
    return len(src), lines(src), len(tst), lines(tst)


PAGE = os.path.join(ROOT, "docs", "internals", "layout.md")
ROW = re.compile(r"^(\| `([a-z/]+)/` \|.*\| )([\d,]+), ([\d,]+) \| ([\d,]+), ([\d,]+) \|$", re.M)


def write_counts():
    """--write-counts: the table's counts made true (after a merge or a split)."""
    page = open(PAGE).read()

    def row(m):
        if m.group(2) not in RANK:
            return m.group(0)
        return m.group(1) + "{:,}, {:,} | {:,}, {:,} |".format(*counts(m.group(2)))
    with open(PAGE, "w") as f:
        f.write(ROW.sub(row, page))


def t_layout_page_counts():
    """docs/internals/layout.md's table: a row per component, its counts true
    (tests/layout_test.py --write-counts makes them so)."""
    rows = {}
    for m in ROW.finditer(open(PAGE).read()):
        rows[m.group(2)] = tuple(int(m.group(k).replace(",", "")) for k in range(3, 7))
    bad = []
    for c in COMPS:
        if c not in rows:
            bad.append("%s: no row" % c)
            continue
        got, said = counts(c), rows[c]
        if got[0] != said[0] or got[2] != said[2] or any(abs(got[k] - said[k]) > said[k] / 10 for k in (1, 3)):
            bad.append("%s: %d files, %d lines; %d tests, %d lines (the page: %d, %d; %d, %d)" % (c, *got, *said))
    assert not bad, bad
    return "%d rows" % len(rows)


CASES = [t_every_component_has_its_door, t_includes_follow_the_layout, t_layout_page_counts]

if __name__ == "__main__":
    import harness as h  # noqa: E402
    if sys.argv[1:] == ["--write-counts"]:
        write_counts()
        sys.exit(0)
    sys.exit(h.run_cases(CASES, sys.argv[1:], make=None))
