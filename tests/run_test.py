#!/usr/bin/python3
"""run_test.py: tests/run.sh's serial phase runs every case of its scripts
exactly once, and tests/harness.py's run_cases selects what it is told.

- `tests/run.sh --list-serial` (the plan: step, script, arguments): each
  script of the plan, run with each item's arguments and BATON_LIST_CASES=1
  (run_cases names the cases it would run, and runs none), runs every case
  of the script (those it runs with no arguments) once across its items:
  none lost when cases are split or added (SCRIPT::rest), none twice; the
  cases that load every core (broker_test's t_stress) are a step alone;
- run_cases: names select, -NAME leaves out, an unknown name fails the run
  (a typo would otherwise run nothing, or everything, and pass).

The last line is "N passed, N failed".
"""
# test: pure (it runs no compiled program: the scripts only list their cases):
# make test's sanitizer pass skips it (tests/run.sh --skip-pure).
import contextlib
import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402


def listed(script, args):
    """The cases the script runs with args, and the exit status."""
    env = dict(os.environ, BATON_LIST_CASES="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, script)] + list(args), capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=60)
    return [line.split()[1] for line in r.stdout.splitlines() if line.startswith("case ")], r.returncode, r.stdout


def plan():
    r = subprocess.run(["bash", os.path.join(ROOT, "tests", "run.sh"), "--list-serial"], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split("\t") for line in r.stdout.splitlines()]


def t_serial_plan_runs_every_case_once():
    items = plan()
    scripts = sorted({i[1] for i in items if i[1].endswith(".py")})
    assert "broker/broker_test.py" in scripts and "broker/ops_test.py" in scripts, scripts
    for s in scripts:
        every, rc, out = listed(s, [])
        assert rc == 0 and len(every) > 0, (s, rc, out)
        seen = []
        for i in items:
            if i[1] == s:
                got, rc, out = listed(s, i[2:])
                assert rc == 0 and got, (i, rc, out)  # an item that runs nothing is a mistake too
                seen += got
        assert sorted(seen) == sorted(every), (s, sorted(set(every) - set(seen)),
                                               sorted(x for x in set(seen) if seen.count(x) > 1))
    steps = {}
    for i in items:
        steps.setdefault(i[0], []).append(i)
    alone = [v for v in steps.values() if any(x[1:] == ["broker/broker_test.py", "t_stress"] for x in v)]
    assert len(alone) == 1 and len(alone[0]) == 1, alone
    return "%d items in %d steps, %d scripts" % (len(items), len(steps), len(scripts))


def t_run_cases_selects():
    ran = []

    def t_a():
        ran.append("a")

    def t_b():
        ran.append("b")

    def t_c():
        ran.append("c")
    cases = [t_a, t_b, t_c]
    env = os.environ.pop("BATON_LIST_CASES", None)

    def run(only):  # its lines kept from this script's own output
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = h.run_cases(cases, only, make=None)
        return rc, out.getvalue()
    try:
        assert run(["t_b"])[0] == 0 and ran == ["b"], ran
        del ran[:]
        assert run(["-t_b"])[0] == 0 and ran == ["a", "c"], ran
        del ran[:]
        assert run([])[0] == 0 and ran == ["a", "b", "c"], ran
        del ran[:]
        rc, out = run(["t_x"])
        assert rc == 1 and ran == [] and "no such case: t_x" in out, (ran, out)
        assert run(["-t_x"])[0] == 1 and ran == [], ran
    finally:
        if env is not None:
            os.environ["BATON_LIST_CASES"] = env


def main():
    return h.run_cases([t_serial_plan_runs_every_case_once, t_run_cases_selects], sys.argv[1:], make=None)


if __name__ == "__main__":
    sys.exit(main())
