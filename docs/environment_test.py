#!/usr/bin/python3
"""environment_test.py: docs/reference/environment.md names every environment
variable the tree reads: getenv("NAME") in C and CUDA sources,
os.environ.get("NAME") / os.environ["NAME"] in Python, ${NAME:-...} and
${NAME:=...} in shell scripts. A variable read but not in the page's
tables fails, with where it is read.

The last line is "N passed, N failed".
"""
# test: pure (it reads the tree's sources and docs only): make test's
# sanitizer pass skips it (tests/run.sh --skip-pure).
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

SKIP_DIRS = {".git", ".deps", "devq", "node_modules"}
PATTERNS = {
    (".c", ".h", ".cu", ".cuh"): re.compile(r'\bgetenv\(\s*"([A-Za-z_][A-Za-z0-9_]*)"'),
    (".py",): re.compile(r'\benviron(?:\.get)?\s*[\(\[]\s*["\']([A-Za-z_][A-Za-z0-9_]*)["\']'),
    (".sh",): re.compile(r"\$\{([A-Z][A-Z0-9_]*):[-=]"),
}
# Set for a child process, never read by our code: not ours to document.
NOT_READ = {"PATH", "UBSAN_OPTIONS", "ASAN_OPTIONS", "DEBIAN_FRONTEND"}


def tree_files():
    """The tree's own files (git's tracked and not-ignored ones), so that
    scratch files a .git/info/exclude hides are not counted; None outside
    a git checkout (then every file is walked)."""
    try:
        r = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return {os.path.normpath(os.path.join(ROOT, x)) for x in r.stdout.splitlines()}


def reads():
    """{name: [file, ...]} of the variables the tree reads."""
    out = {}
    own = tree_files()
    for d, dirs, files in os.walk(ROOT):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
        for f in files:
            if f == "environment_test.py":
                continue  # its own samples
            for exts, pat in PATTERNS.items():
                if f.endswith(exts):
                    path = os.path.join(d, f)
                    if own is not None and os.path.normpath(path) not in own:
                        continue
                    try:
                        text = open(path, encoding="utf-8", errors="replace").read()
                    except OSError:
                        continue
                    for name in pat.findall(text):
                        out.setdefault(name, []).append(os.path.relpath(path, ROOT))
    return out


def documented():
    """Names in the first column of docs/reference/environment.md's tables."""
    names = set()
    for line in open(os.path.join(HERE, "reference", "environment.md"), encoding="utf-8"):
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", line.split("|")[1]))
    return names


def t_every_variable_documented():
    got, doc = reads(), documented()
    assert "BATON_HOSTDEV_DIR" in got and "BATON_HOSTDEV_DIR" in doc  # the scan works
    missing = {n: sorted(set(w)) for n, w in got.items() if n not in doc and n not in NOT_READ}
    assert not missing, "read but not in docs/reference/environment.md: " + "; ".join(
        "%s (%s)" % (n, ", ".join(w[:3])) for n, w in sorted(missing.items()))


def t_scan_finds_each_kind():
    """The patterns see each way of reading (a pattern that matched nothing
    would pass the other case vacuously)."""
    samples = {
        ".c": ('const char *v = getenv("BATON_X");', "BATON_X"),
        ".py": ('os.environ.get("KILL_Y", "1")', "KILL_Y"),
        ".sh": ('b=${DEMO_Z:-host}', "DEMO_Z"),
    }
    for ext, (text, name) in samples.items():
        pat = [p for exts, p in PATTERNS.items() if ext in exts][0]
        assert pat.findall(text) == [name], (ext, pat.findall(text))
    assert PATTERNS[(".py",)].findall('os.environ["BUILD"]') == ["BUILD"]


def main():
    return h.run_cases([t_every_variable_documented, t_scan_finds_each_kind], sys.argv[1:], make=None)


if __name__ == "__main__":
    sys.exit(main())
