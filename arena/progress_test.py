#!/usr/bin/python3
"""progress_test.py: `baton-arena create` draws a progress bar (bytes written
of the arena's blobs, rate, time left) on stderr when stderr is a terminal
(a pty here), erased before the result; piped, nothing but the result.

The last line is "N passed, N failed".
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

ARENA = os.path.join(h.BIN, "baton-arena")
SYNTH = ["create", "--synthetic", "--layers", "4", "--experts", "8", "--top-k", "2", "--d-model", "256",
         "--d-ff", "512", "--force"]
BAR = re.compile(r"\r\[[#.]{20}\] +(\d+)%  [\d.]+ [KMG]iB of ([\d.]+ [KMG]iB)")


def on_pty(args, env):
    return h.run_on_pty([ARENA] + args, env, timeout=30)


def t_bar_on_terminal_only():
    d = tempfile.mkdtemp(prefix="baton-arena-bar-")
    path = os.path.join(d, "m.arena")
    rc, out, tty = on_pty(SYNTH + [path], dict(os.environ, TERM="xterm"))
    assert rc == 0 and out.startswith("built %s: " % path), (rc, out, tty)
    bars = BAR.findall(tty)
    assert bars and bars[-1][0] == "100", repr(tty)  # it ends full
    assert all(b[1] == bars[0][1] for b in bars), bars  # one total
    assert "m.arena" in tty and tty.endswith("\r\x1b[K"), repr(tty[-60:])  # erased before the result
    assert "\r" not in out and "\x1b" not in out
    # TERM=dumb: no bar
    rc, out, tty = on_pty(SYNTH + [path], dict(os.environ, TERM="dumb"))
    assert rc == 0 and tty == "", repr(tty)
    # piped: nothing but the result
    r = subprocess.run([ARENA] + SYNTH + [path], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith("built "), r
    shutil.rmtree(d)


CASES = [t_bar_on_terminal_only]

if __name__ == "__main__":
    sys.exit(h.run_cases(CASES, sys.argv[1:], make=None))
