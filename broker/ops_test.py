#!/usr/bin/python3
"""ops_test.py: what an operator sees is true (issue 15, part A), against a
real broker and engines on the host backend (tests/harness.py's
BrokerCase):

- a refill longer than the command timeout whose copy progresses is not
  timed out (the engine reports bytes copied of bytes to copy with its
  heartbeats; the broker publishes them as "progress" events); one that
  stalls still is, and says so;
- the CLI's refill and handoff draw a bar with the percentage copied on a
  terminal, and nothing when piped;
- messages: a release during a refill says it is refilling, a diagnosis
  counts a refilling engine, the pin error suggests a command the CLI
  accepts, an engine shrunk to 0 B does not read "ready";
- releasing a lost engine (SIGSTOP) answers at once that it is lost;
- the broker logs every handoff, release and refill with its timings, with
  timestamps when not under journald.

The last line is "N passed, N failed".
"""
import os
import re
import signal
import subprocess
import sys
import termios
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402
from harness import call, ok, err, wait_for, MIB, CEIL  # noqa: E402

CLI = h.CLI


def baton(c, *args, timeout=60, env=None):
    e = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url)
    e.update(env or {})
    return subprocess.run([CLI] + list(args), capture_output=True, text=True, timeout=timeout, env=e)


def on_pty(c, args, env=None, timeout=60):
    """baton with stderr on a terminal: (exit, stdout, what the terminal got)."""
    e = dict(c.env, BATON_BROKER=c.control, BATON_EVENTS=c.events_url, TERM="xterm")
    e.update(env or {})
    return h.run_on_pty([CLI] + list(args), e, timeout=timeout)


def t_long_refill_progresses(c):
    # command timeout 2 s; each of a's 7 segments takes 0.45 s: 3.2 s in all
    # (the margin: heartbeats every 0.25 s may come late on a loaded machine)
    c.broker("command_timeout_ms = 2000\n")
    c._subscribe()
    a = c.engine("a", env={"BATON_TEST_REFILL_STEP_MS": "450"})
    ok(call(c.control, "release", name="a"))
    t0 = time.time()
    r = baton(c, "refill", "a")
    took = time.time() - t0
    assert r.returncode == 0 and r.stdout.startswith("refill a: ready, holds 28.0 MiB"), (r, took)
    assert took > 2.5, took
    rel = [e["seq"] for e in c.events.all("release", "a")][-1]
    prog = [e for e in c.events.all("progress", "a") if e["seq"] > rel]  # this refill's
    assert len(prog) >= 2, prog  # at most one a second, and the last
    t = [e["time_ms"] for e in prog]
    assert all(t[i + 1] - t[i] >= 950 for i in range(len(t) - 2)), t
    done = [e["bytes"] for e in prog]
    assert done == sorted(done) and done[-1] == 24 * MIB, done  # 32 experts of 0.75 MiB
    assert all(e["to_copy"] == 24 * MIB for e in prog), prog
    assert c.eng("a")["state"] == "ready"
    # no refill in progress now (the result ends it; a heartbeat sent
    # before it may say otherwise for a moment)
    wait_for("no copy", lambda: [x for x in call(c.control, "status")["engines"] if x["name"] == "a"][0]["to_copy"] == 0,
             timeout=2)


def t_cli_waits_while_the_broker_answers(c):
    # no --timeout: the CLI waits as long as the broker answers; when the
    # broker goes away mid-refill it says so at once, not after 60 s
    c.broker()
    c.engine("a", env={"BATON_TEST_REFILL_STEP_MS": "400"}, wait=False)
    wait_for("a ready", lambda: c.eng("a") and c.eng("a")["state"] == "ready", timeout=20)
    ok(call(c.control, "release", name="a"))
    e = dict(c.env, BATON_BROKER=c.control)
    r = subprocess.Popen([CLI, "refill", "a"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    wait_for("a refilling", lambda: c.eng("a")["state"] == "refilling")
    c.bp.kill()
    t0 = time.time()
    out, errs = r.communicate(timeout=20)
    assert r.returncode == 1 and "dropped" in errs, (out, errs)
    assert time.time() - t0 < 5
    # with --timeout, a hard limit: the refill outlasts it
    c.broker()
    wait_for("a registered", lambda: c.eng("a") is not None, timeout=10)
    wait_for("a settled", lambda: c.eng("a")["state"] in ("ready", "released"), timeout=10)
    ok(call(c.control, "release", name="a"))
    r = baton(c, "--timeout", "1s", "refill", "a")
    assert r.returncode == 1 and "within 1000 ms (--timeout)" in r.stderr, r


def t_stalled_refill_times_out(c):
    c.broker("command_timeout_ms = 1000\n")
    # two segments of 14 MiB, 1.8 s each: no progress within the 1 s timeout
    c.engine("a", env={"BATON_TEST_REFILL_STEP_MS": "1800"}, segment_mib=14)
    ok(call(c.control, "release", name="a"))
    t0 = time.time()
    r = baton(c, "refill", "a")
    took = time.time() - t0
    assert r.returncode == 1 and "no progress for" in r.stderr and "timed out" not in r.stdout, (r, took)
    assert took < 4, took


BAR = re.compile(r"\[[#.]{20}\] +(\d+)% of 24\.0 MiB")


def t_progress_bar_on_terminal_only(c):
    c.broker()
    a = c.engine("a")
    b = c.engine("b", env={"BATON_TEST_REFILL_STEP_MS": "300"}, wait=False)
    c.wait_ready(b, timeout=30)
    wait_for("b registered", lambda: c.eng("b") is not None)
    ok(call(c.control, "release", name="b"))
    ok(call(c.control, "refill", name="a"))
    # handoff a -> b: b's copy drawn as a bar with its percentage
    rc, out, tty = on_pty(c, ["handoff", "a", "b"])
    assert rc == 0 and out.startswith("handoff a -> b: decide "), (rc, out, tty)
    pct = [int(m) for m in BAR.findall(tty)]
    assert len(pct) >= 2 and pct == sorted(pct) and max(pct) > 0, repr(tty)
    assert tty.endswith("\r\x1b[K"), repr(tty[-40:])  # erased before the result
    # refill: the same
    ok(call(c.control, "release", name="b"))
    rc, out, tty = on_pty(c, ["refill", "b"])
    assert rc == 0 and out.startswith("refill b: ready"), (rc, out, tty)
    assert BAR.search(tty), repr(tty)
    # piped: nothing but the result
    ok(call(c.control, "release", name="b"))
    r = baton(c, "refill", "b")
    assert r.returncode == 0 and r.stderr == "" and "%" not in r.stdout and "\r" not in r.stdout, r


def t_release_during_refill_says_refilling(c):
    c.broker("acquire_wait_ms = 500\n")
    c.engine("a", env={"BATON_TEST_REFILL_STEP_MS": "500"}, wait=False)
    wait_for("a ready", lambda: c.eng("a") and c.eng("a")["state"] == "ready", timeout=20)
    ok(call(c.control, "release", name="a"))
    e = dict(c.env, BATON_BROKER=c.control)
    r = subprocess.Popen([CLI, "refill", "a"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    wait_for("a refilling", lambda: c.eng("a")["state"] == "refilling")
    rel = baton(c, "release", "a")
    assert rel.returncode == 3, rel
    assert "a is refilling" in rel.stderr and "serving requests" not in rel.stderr, rel.stderr
    out, errs = r.communicate(timeout=30)
    assert r.returncode == 0, (out, errs)


def t_diagnosis_counts_refilling(c):
    c.broker("acquire_wait_ms = 800\n")
    c.engine("a", env={"BATON_TEST_REFILL_STEP_MS": "500"}, wait=False)
    wait_for("a ready", lambda: c.eng("a") and c.eng("a")["state"] == "ready", timeout=20)
    c.engine("b")
    ok(call(c.control, "release", name="a"))
    e = dict(c.env, BATON_BROKER=c.control)
    r = subprocess.Popen([CLI, "refill", "a"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    wait_for("a refilling", lambda: c.eng("a")["state"] == "refilling")
    rb = baton(c, "refill", "b")  # the device holds one engine: a's refill has it
    assert rb.returncode == 1 and "1 refilling" in rb.stderr, rb.stderr
    r.communicate(timeout=30)


def t_pin_error_suggests_a_real_command(c):
    c.broker()
    c.engine("a")
    ok(call(c.control, "pin", name="a", pinned=True))
    r = baton(c, "release", "a")
    assert r.returncode == 1, r
    m = re.search(r"\((baton [^)]*)\)", r.stderr)
    assert m, r.stderr
    fix = m.group(1).split()[1:]
    assert baton(c, *fix).returncode == 0, fix  # the suggestion works as typed
    assert baton(c, "release", "a").returncode == 0


def t_shrunk_to_nothing_is_not_ready(c):
    c.broker()
    c.engine("a", "--vram-elastic")  # alone on a 40 MiB device
    r = baton(c, "vram", "a", "--reserve-mib", "500")
    assert r.returncode == 0 and "holds 0 B" in r.stdout, r
    assert not r.stdout.startswith("vram a: ready"), r.stdout
    assert r.stdout.startswith("vram a: released"), r.stdout
    assert c.eng("a")["state"] == "released", c.eng("a")
    assert baton(c, "vram", "a", "--full").returncode == 0
    assert c.eng("a")["state"] == "ready"


def t_lost_engine_release_answers_at_once(c):
    c.broker("heartbeat_timeout_ms = 500\ncommand_timeout_ms = 10000\n")
    a = c.engine("a")
    os.kill(a.pid, signal.SIGSTOP)
    try:
        wait_for("a lost", lambda: c.eng("a")["state"] == "lost", timeout=5)
        t0 = time.time()
        r = baton(c, "release", "a")
        took = time.time() - t0
        assert r.returncode == 1 and "a is lost" in r.stderr, r
        assert took < 1.0, took
    finally:
        os.kill(a.pid, signal.SIGCONT)
    wait_for("a back", lambda: c.eng("a")["state"] == "ready", timeout=5)
    assert baton(c, "release", "a").returncode == 0


STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z baton-broker: ")


def t_broker_logs_moves_with_timings(c):
    c.broker()
    c.engine("a")
    c.engine("b")
    for args in (["release", "b"], ["refill", "a"], ["handoff", "a", "b"]):  # b held the device
        assert baton(c, *args).returncode == 0, args
    # the broker writes a move's line about when it answers: wait for the last
    wait_for("the handoff's line in the broker's log",
             lambda: "handoff a -> b (release): decide " in open(c.log("broker")).read(), timeout=5)
    log = open(c.log("broker")).read().splitlines()
    moves = [x for x in log if "baton-broker: engine " in x and (" freed" in x or " copied" in x)]
    assert any(re.search(r"engine b: release \(operator\) in [\d.]+ ms, 28\.\d MiB freed; holds 0\.0 MiB$", x)
               for x in moves), moves
    assert any(re.search(r"engine a: refill \(operator\) in [\d.]+ ms, 24\.0 MiB copied, [\d.]+ GB/s; "
                         r"holds 28\.0 MiB$", x) for x in moves), moves
    ho = [x for x in log if "handoff a -> b (release): decide " in x]
    assert len(ho) == 1 and re.search(r"release [\d.]+ ms, refill [\d.]+ ms, total [\d.]+ ms, 24\.0 MiB copied, "
                                      r"[\d.]+ GB/s$", ho[0]), ho
    # not under journald: every line carries its time, the program's own too
    for x in moves + ho + [ln for ln in log if "baton-broker: control " in ln]:
        assert STAMP.match(x), x
    assert any("baton-broker: control " in ln for ln in log), log


def t_broker_log_under_journald(c):
    c.env = dict(c.env, JOURNAL_STREAM="8:12345")
    c.broker()
    c.engine("a")
    assert baton(c, "release", "a").returncode == 0
    wait_for("the release's line in the broker's log",
             lambda: "engine a: release (operator)" in open(c.log("broker")).read(), timeout=5)
    log = [x for x in open(c.log("broker")).read().splitlines() if "engine a" in x or "control " in x]
    assert len(log) >= 2 and all(x.startswith("baton-broker: ") for x in log), log


def top_on_pty(c, stop, interval="200ms", frames_needed=3):
    master, slave = h.pty_open(40, 160)
    saved = termios.tcgetattr(slave)
    e = dict(c.env, BATON_BROKER=c.control, TERM="xterm")
    p = subprocess.Popen([CLI, "top", "--interval", interval], stdin=slave, stdout=slave, stderr=slave, env=e)
    got = h.pty_read_until(master, lambda g: g.count(b"\x1b[H") >= frames_needed and b"host device 0" in g)
    frames = got.decode(errors="replace")
    assert frames.startswith("\x1b[?1049h\x1b[?25l"), repr(frames[:80])  # alternate screen, no cursor
    assert frames.count("\x1b[H") >= frames_needed, repr(frames[-500:])  # redrawn
    stop(master, p)
    rc = p.wait(10)
    rest = h.pty_read_until(master, lambda g: g.endswith(b"\x1b[?1049l"), timeout=3).decode(errors="replace")
    now = termios.tcgetattr(slave)
    os.close(slave)
    os.close(master)
    return rc, frames, rest, saved, now


def t_top_live_on_terminal(c):
    c.broker("idle_release_s = 300\n")
    c.engine("a")
    c.engine("b")  # b holds the device, a is released
    for how, stop in (("q", lambda m, p: os.write(m, b"q")),
                      ("Ctrl-C", lambda m, p: os.kill(p.pid, signal.SIGINT))):
        rc, frames, rest, saved, now = top_on_pty(c, stop)
        assert rc == 0, (how, rc, rest)
        assert rest.endswith("\x1b[?25h\x1b[?1049l"), (how, repr(rest[-80:]))  # cursor and screen back
        assert now == saved, (how, now, saved)  # the terminal's modes restored
        last = frames.split("\x1b[H")[-2]  # a whole frame (the last one read may be cut)
        rows = [ln.replace("\x1b[K", "").rstrip("\r") for ln in last.split("\n")]
        gpu = [r for r in rows if "host device 0" in r]
        assert gpu and re.search(r"^\s*0\s+host device 0\s+[\d.]+ MiB / 40\.0 MiB", gpu[0]), rows
        eng = {r.split()[0]: r for r in rows if r.split() and r.split()[0] in ("a", "b")}
        assert "ready" in eng["b"] and "28.0 MiB / 28.0 MiB" in eng["b"], eng
        assert "released" in eng["a"], eng
        # UNTIL, as ollama ps: b releases itself within 5 minutes of idling; a holds nothing
        until = re.search(r"28\.0 MiB / 28\.0 MiB\s+\S+\s+(\S+)", eng["b"]).group(1)
        assert re.match(r"^4m\d\ds$|^5m00s$", until), eng["b"]
        assert "GB/s" in eng["b"], eng["b"]
        assert "every 0.2s" in frames, frames[:300]
    # a bare number is seconds (it was milliseconds: "--interval 2" redrew every 2 ms)
    rc, frames, rest, saved, now = top_on_pty(c, lambda m, p: os.write(m, b"q"), interval="2", frames_needed=1)
    assert rc == 0 and "every 2.0s" in frames, (rc, frames[:300])


def t_top_one_frame_when_piped(c):
    c.broker()
    c.engine("a")
    for args in (["top"], ["top", "--once"]):
        r = baton(c, *args, timeout=10)
        assert r.returncode == 0 and "\x1b" not in r.stdout, r
        lines = r.stdout.splitlines()
        assert lines[0].startswith("baton top - ") and any("host device 0" in x for x in lines), lines
        assert any(x.split()[:1] == ["ENGINE"] and "UNTIL" in x for x in lines), lines
    # on a terminal, --once is one frame too
    rc, out, tty = on_pty(c, ["top", "--once"])
    r = baton(c, "top", "--interval", "0")
    assert r.returncode == 2, r
    r = baton(c, "top", "--interval", "50ms")
    assert r.returncode == 2 and "at least 100ms" in r.stderr, r
    r = baton(c, "status", "--once")
    assert r.returncode == 2 and "does not take --interval/--once" in r.stderr, r
    # no broker: one frame says so, exit 1
    r = baton(c, "--broker", "ipc://%s/nobody.sock" % c.dir, "top")
    assert r.returncode == 1 and "no answer from the broker" in r.stdout, r


CASES = [t_cli_waits_while_the_broker_answers, t_top_live_on_terminal, t_top_one_frame_when_piped, t_broker_logs_moves_with_timings, t_broker_log_under_journald, t_release_during_refill_says_refilling, t_diagnosis_counts_refilling, t_pin_error_suggests_a_real_command,
         t_shrunk_to_nothing_is_not_ready, t_lost_engine_release_answers_at_once, t_progress_bar_on_terminal_only, t_long_refill_progresses, t_stalled_refill_times_out]


def main():
    return h.run_cases(CASES, sys.argv[1:], make=h.BrokerCase)


if __name__ == "__main__":
    sys.exit(main())
