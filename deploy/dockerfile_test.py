#!/usr/bin/python3
"""dockerfile_test.py: deploy/k8s/Dockerfile's package lists, checked
without Docker against what the tree builds with.

- the build stage installs every package of scripts/install-deps.sh's
  build set that `make install` needs (the compiler, each library's -dev
  package, scdoc for the man pages; the demo's python3, man-db, groff-base
  and curl are not needed to build);
- the runtime stage installs, for every shared library the Makefile links
  (EXT_LIBS and -lsystemd), the Debian package that holds its .so
  (found with dpkg -S on this Debian machine from the -dev package's
  libX.so link), and nothing names a -dev package there;
- a Dockerfile missing one of them fails the check (the check can fail).
When the machine has Docker and BATON_DOCKER_BUILD=1, the image is built too.
The last line is "N passed, N failed".
"""
# test: pure (it reads the Dockerfile, the Makefile and dpkg's database, and
# runs no compiled program): make test's sanitizer pass skips it.
import glob
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)
DOCKERFILE = os.path.join(ROOT, "deploy", "k8s", "Dockerfile")
NOT_FOR_BUILD = {"python3", "groff-base", "man-db", "curl"}  # the demo's and the quick start's


def stages(text):
    """{stage index: set of packages its apt-get install lines name}."""
    text = text.replace("\\\n", " ")
    out, n = {}, -1
    for line in text.splitlines():
        if line.startswith("FROM "):
            n += 1
            out[n] = set()
        m = re.search(r"apt-get install ([^&;]*)", line)
        if m and n >= 0:
            out[n] |= {w for w in m.group(1).split() if not w.startswith("-")}
    return out


def build_set():
    """scripts/install-deps.sh's build set (--plan prints it)."""
    p = subprocess.run([os.path.join(ROOT, "scripts", "install-deps.sh"), "--plan", "build"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    line = [l for l in p.stdout.splitlines() if l.startswith("apt-get install:")][0]
    return set(line.split(":", 1)[1].split())


def linked_libs():
    """The -l names of the Makefile's dynamic link (EXT_LIBS, then -lsystemd)."""
    mk = open(os.path.join(ROOT, "Makefile")).read()
    ext = re.search(r"^EXT_LIBS\s*:=(.*)$", mk, re.M).group(1)
    libs = re.findall(r"-l(\S+)", ext)
    assert "-lsystemd" in mk
    return libs + ["systemd"]


def runtime_package(lib):
    """The Debian package with the shared object that libLIB.so (the -dev
    package's link) points at."""
    links = glob.glob("/usr/lib/*/lib%s.so" % lib) + glob.glob("/usr/lib/lib%s.so" % lib)
    assert links, "lib%s.so not found (is its -dev package installed?)" % lib
    real = os.path.realpath(links[0])
    p = subprocess.run(["dpkg", "-S", real], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, (real, p.stderr)
    return p.stdout.split(":")[0].strip()


def check(text):
    """The problems of a Dockerfile's text (an empty list: none)."""
    st = stages(text)
    problems = []
    if len(st) < 2:
        return ["want a build stage and a runtime stage, got %d FROM lines" % len(st)]
    build, runtime = st[0], st[len(st) - 1]
    for pkg in sorted(build_set() - NOT_FOR_BUILD):
        if pkg not in build:
            problems.append("build stage lacks %s (scripts/install-deps.sh build)" % pkg)
    for lib in linked_libs():
        pkg = runtime_package(lib)
        if pkg not in runtime:
            problems.append("runtime stage lacks %s (the Makefile links -l%s)" % (pkg, lib))
    for pkg in sorted(runtime):
        if pkg.endswith("-dev"):
            problems.append("runtime stage installs a -dev package: %s" % pkg)
    return problems


def t_dockerfile_has_every_package():
    problems = check(open(DOCKERFILE).read())
    assert not problems, problems


def t_a_missing_package_is_seen():
    text = open(DOCKERFILE).read()
    for pkg in ("libmicrohttpd-dev", "libutf8proc2"):
        broken = re.sub(r"\b%s\b" % re.escape(pkg), "", text)
        got = check(broken)
        assert any(pkg in p for p in got), (pkg, got)


def t_docker_build():
    if not (shutil.which("docker") and os.environ.get("BATON_DOCKER_BUILD") == "1"):
        print("  (skipped the image build: no docker, or BATON_DOCKER_BUILD is not 1)")
        return
    p = subprocess.run(["docker", "build", "-f", DOCKERFILE, "-t", "baton:test", ROOT],
                       capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def main():
    tests = [v for k, v in sorted(globals().items()) if k.startswith("t_")]
    passed = failed = 0
    for t in tests:
        try:
            t()
            passed += 1
            print("ok   %s" % t.__name__)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print("FAIL %s: %r" % (t.__name__, e))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
