"""gpu_proof.py: what the device proofs (gpu-fleet-proof.py, gpu-lend-proof.py)
share: their failure rule, the step lines, a broker of their own started and
waited for, its HTTP face with the token, nvidia-smi, and the run's frame
(the first failed check ends it with "FAIL: why" and exit 1; the clean-up
always runs).

Imported from the scripts' own folder (Python puts a script's folder first
on sys.path), not a program of its own.
"""
import http.client
import json
import os
import shutil
import subprocess
import time
import traceback

T0 = time.time()


class ProofError(Exception):
    pass


def fail(msg):
    raise ProofError(msg)


def step(msg):
    print("[%6.1f s] %s" % (time.time() - T0, msg), flush=True)


def wait_for(what, fn, timeout, every=0.1):
    """fn()'s first true value, tried every `every` s; a failure after timeout s."""
    end = time.time() + timeout
    while True:
        try:
            last, err = fn(), None
        except (OSError, ValueError, KeyError) as e:
            last, err = None, e
        if last:
            return last
        if time.time() > end:
            fail("timed out after %.0f s waiting for %s%s" % (timeout, what, " (%r)" % err if err else ""))
        time.sleep(every)


def program(build, name):
    """BUILD/bin/NAME, or a failure that says it is missing."""
    p = os.path.join(build, "bin", name)
    if not os.access(p, os.X_OK):
        fail("%s is missing (BUILD is %s; the device run wants make CUDA=1)" % (p, build))
    return p


def tail(path, n=3000):
    try:
        with open(path) as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


def broker_ini(d, token, cap_mib, broker_extra=""):
    """A broker file of the proofs: sockets in d, HTTP on a free port with
    the token, no idle release, long waits (a 16 GiB refill), and one device
    budget ([gpu "*"] total_mib) without a reserve. broker_extra: more keys
    of [broker]; sections may follow the text."""
    return ("[broker]\ncontrol = ipc://%s/broker.sock\nevents = ipc://%s/events.sock\nhttp = 127.0.0.1:0\n"
            "http_token = %s\ndoor_keep_alive_s = forever\nidle_release_s = 0\nacquire_wait_ms = 120000\n"
            "command_timeout_ms = 120000\n%s[gpu \"*\"]\ntotal_mib = %d\nreserve_mib = 0\n"
            % (d, d, token, broker_extra, cap_mib))


def start_broker(exe, cfg, log, env):
    """baton-broker --config cfg, its stderr appended to the file log; waits
    for its ready line. Returns the process and its HTTP (host, port)."""
    p = subprocess.Popen([exe, "--config", cfg], stdout=subprocess.PIPE, stderr=open(log, "a"), env=env,
                         text=True)
    line = p.stdout.readline().split()
    if len(line) != 4 or line[0] != "ready":
        fail("the broker did not start: %r (broker log: %s)" % (line, tail(log)))
    host, port = line[3].replace("http://", "").rsplit(":", 1)
    return p, (host, int(port))


def request(door, token, method, path, body=None, timeout=300):
    """One request to the broker's HTTP face with the token: (status, text)."""
    c = http.client.HTTPConnection(door[0], door[1], timeout=timeout)
    hdr = {"Authorization": "Bearer " + token}
    data = None
    if body is not None:
        data = json.dumps(body)
        hdr["Content-Type"] = "application/json"
    c.request(method, path, body=data, headers=hdr)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    return r.status, text


def smi(query):
    """nvidia-smi --query-QUERY's rows, each a list of its cells (no units)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-" + query, "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        fail("nvidia-smi: %s" % e)
    if r.returncode != 0:
        fail("nvidia-smi --query-%s failed: %s" % (query, r.stderr.strip()))
    return [[x.strip() for x in line.split(",")] for line in r.stdout.strip().splitlines() if line.strip()]


def keep(d, out, logs, summary):
    """What a run leaves in OUT: the logs of d that were written, and
    summary.json."""
    for log in logs:
        src = os.path.join(d, log)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(out, log))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def run(script, summary, body, cleanup):
    """body() as a proof: 0 when it returns; 1 with "FAIL: why" (also in
    summary["failed"]) on a failed check, or on a bug of the script, said as
    loudly with its traceback. cleanup() runs either way."""
    try:
        body()
        return 0
    except ProofError as e:
        print("FAIL: %s" % e, flush=True)
        summary["failed"] = str(e)
        return 1
    except Exception as e:  # noqa: BLE001 (a bug of the script)
        traceback.print_exc()
        print("FAIL: %r (a bug of %s)" % (e, script), flush=True)
        summary["failed"] = repr(e)
        return 1
    finally:
        cleanup()
