#!/usr/bin/python3
"""flags_test.py: every program in $BUILD/bin answers --help and --version
with exit 0 (usage or "NAME VERSION" on stdout) and an unknown flag with
exit 2 and a message on stderr, without doing anything else (issue 15).

The last line is "N passed, N failed".
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import BIN, ROOT, run_cases  # noqa: E402

VERSION = open(os.path.join(ROOT, "VERSION")).read().strip()


def programs():
    names = sorted(n for n in os.listdir(BIN) if os.access(os.path.join(BIN, n), os.X_OK))
    assert "baton-engine" in names and "baton" in names, names
    return names


def runs(name, *args):
    return subprocess.run([os.path.join(BIN, name)] + list(args), capture_output=True, text=True,
                          timeout=20, stdin=subprocess.DEVNULL)


def t_help(c):
    bad = []
    for n in programs():
        r = runs(n, "--help")
        if r.returncode != 0 or "usage" not in r.stdout.lower():
            bad.append((n, r.returncode, r.stdout[:200], r.stderr[:200]))
    assert not bad, bad
    return "%d programs" % len(programs())


def t_version(c):
    bad = []
    for n in programs():
        r = runs(n, "--version")
        if r.returncode != 0 or VERSION not in r.stdout:
            bad.append((n, r.returncode, r.stdout[:200], r.stderr[:200]))
    assert not bad, bad


def t_unknown_flag(c):
    bad = []
    for n in programs():
        r = runs(n, "--no-such-flag")
        if r.returncode != 2 or "no-such-flag" not in r.stderr:
            bad.append((n, r.returncode, r.stdout[:200], r.stderr[:200]))
    assert not bad, bad


if __name__ == "__main__":
    sys.exit(run_cases([t_help, t_version, t_unknown_flag], sys.argv[1:], make=lambda: None))
