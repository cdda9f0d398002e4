#!/usr/bin/python3
"""man_test.py: the man pages (docs/man/*.scd) agree with the programs.

For each program, every option its --help prints is in its man page, and
every option the page names is one --help prints, so the two cannot drift
apart; baton(1) names every command of `baton --help`; baton-broker.ini(5)
names every key broker/config.c accepts, and nothing else. Each page turns
into a man page with scdoc (Debian's scdoc, in scripts/install-deps.sh)
that groff reads without a warning. The last line is "N passed, N failed".
"""
# test: pure (it reads the man pages and each program's --help, which
# tests/flags_test.py runs under the sanitizers too): make test's sanitizer
# pass skips it (tests/run.sh --skip-pure).
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

MAN = os.path.join(h.ROOT, "docs", "man")
PAGES = {"baton": "baton.1.scd", "baton-broker": "baton-broker.8.scd",
         "baton-engine": "baton-engine.8.scd", "baton-arena": "baton-arena.1.scd"}
OPT = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def page(name):
    with open(os.path.join(MAN, name), encoding="utf-8") as f:
        return f.read()


def help_text(prog):
    r = subprocess.run([os.path.join(h.BIN, prog), "--help"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, "%s --help: exit %d" % (prog, r.returncode)
    return r.stdout + r.stderr


def t_options_agree():
    for prog, name in sorted(PAGES.items()):
        in_help = set(OPT.findall(help_text(prog))) | {"--help", "--version"}
        in_page = set(OPT.findall(page(name)))
        assert in_help <= in_page, "%s: options of %s --help missing from the page: %s" % (
            name, prog, " ".join(sorted(in_help - in_page)))
        assert in_page <= in_help, "%s: options %s --help does not print: %s" % (
            name, prog, " ".join(sorted(in_page - in_help)))


def t_baton_commands():
    text = help_text("baton")
    commands = set()
    for line in text.splitlines():
        m = re.match(r"  ([a-z]+)\b", line)
        if m:
            commands.add(m.group(1))
        m = re.match(r"  [a-z]+ NAME \| ([a-z]+)\b", line)  # "pin NAME | unpin NAME"
        if m:
            commands.add(m.group(1))
    assert len(commands) >= 10, commands
    text = page("baton.1.scd")
    missing = [c for c in sorted(commands) if "*%s*" % c not in text]
    assert not missing, "baton.1.scd: commands missing: %s" % " ".join(missing)


def t_config_keys_agree():
    keys = set()
    for src in ("config.c", "external_conf.c"):  # [external] keys: external_conf.c
        with open(os.path.join(h.ROOT, "broker", src)) as f:
            keys |= set(re.findall(r'strcmp\(key, "(\w+)"\)', f.read()))
    assert len(keys) >= 10, keys
    text = page("baton-broker.ini.5.scd")
    named = set(re.findall(r"^\*(\w+)\* = ", text, re.M)) | \
        set(re.findall(r"^\*\w+\* = _[^_]*_, \*(\w+)\* = ", text, re.M))
    assert keys <= named, "baton-broker.ini.5.scd: keys missing: %s" % " ".join(sorted(keys - named))
    assert named <= keys, "baton-broker.ini.5.scd: keys the broker refuses: %s" % " ".join(sorted(named - keys))


def t_pages_render():
    scdoc = shutil.which("scdoc")
    assert scdoc, "no scdoc: run make deps"
    d = tempfile.mkdtemp(prefix="baton-man-")
    try:
        for name in sorted(os.listdir(MAN)):
            if not name.endswith(".scd"):
                continue
            out = os.path.join(d, name[:-4])
            with open(os.path.join(MAN, name), "rb") as src, open(out, "wb") as dst:
                r = subprocess.run([scdoc], stdin=src, stdout=dst, stderr=subprocess.PIPE, timeout=10)
            assert r.returncode == 0, "%s: %s" % (name, r.stderr.decode())
            title = name[:-4].rsplit(".", 1)
            with open(out) as f:
                assert '.TH "%s" "%s"' % tuple(title) in f.read(), name
            r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", out], capture_output=True, text=True,
                               timeout=10)
            assert r.returncode == 0 and not r.stderr.strip(), "%s: groff: %s" % (name, r.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


CASES = [t_options_agree, t_baton_commands, t_config_keys_agree, t_pages_render]


def main():
    for prog in PAGES:
        h.need(os.path.join(h.BIN, prog))
    return h.run_cases(CASES, sys.argv[1:], make=None)


if __name__ == "__main__":
    sys.exit(main())
