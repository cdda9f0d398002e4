#!/usr/bin/env python3
# test: pure (reads the docs only): make test's sanitizer pass skips it
"""links_test.py: every relative link in the Markdown pages (README.md,
docs/, deploy/, models/, text/fixtures/) reaches a file, and every page of
docs/ is listed in docs/README.md (the index). No program runs."""
import os
import re
import sys

sys.dont_write_bytecode = True
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages():
    for top in ("README.md", "docs", "deploy", "models", os.path.join("text", "fixtures")):
        p = os.path.join(ROOT, top)
        if os.path.isfile(p):
            yield p
            continue
        for d, _, fs in os.walk(p):
            for f in sorted(fs):
                if f.endswith(".md"):
                    yield os.path.join(d, f)


def t_links_resolve():
    bad = []
    for p in pages():
        text = re.sub(r"```.*?```", "", open(p, encoding="utf-8").read(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if not os.path.exists(os.path.join(os.path.dirname(p), path)):
                bad.append("%s: %s" % (os.path.relpath(p, ROOT), target))
    assert not bad, "%d links lead nowhere:\n  %s" % (len(bad), "\n  ".join(bad))


def t_every_page_indexed():
    index = open(os.path.join(ROOT, "docs", "README.md"), encoding="utf-8").read()
    listed = {os.path.normpath(os.path.join(ROOT, "docs", t.split("#")[0])) for t in LINK.findall(index)}
    missing = []
    for d, _, fs in os.walk(os.path.join(ROOT, "docs")):
        for f in fs:
            p = os.path.normpath(os.path.join(d, f))
            if f.endswith(".md") and f != "README.md" and p not in listed:
                missing.append(os.path.relpath(p, ROOT))
    assert not missing, "pages docs/README.md does not list: %s" % sorted(missing)


CASES = [t_links_resolve, t_every_page_indexed]

if __name__ == "__main__":
    import harness as h  # noqa: E402
    sys.exit(h.run_cases(CASES, sys.argv[1:], make=None))
