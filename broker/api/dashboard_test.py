#!/usr/bin/python3
"""dashboard_test.py: the page the broker serves on GET /, in headless
Chromium driven by chromedriver through the W3C WebDriver HTTP API (urllib;
no selenium).

A broker with two engines on one host device that holds one of them; the
page is loaded while b holds the device; a handoff b -> a goes through the
HTTP API; the page (without a reload: its own polling) must then show a as
the holder and a ready. A screenshot is saved as $BUILD/artifacts/dashboard.png.
Then back to b, whose refill waits 2 s (BATON_TEST_REFILL_DELAY_MS): while
it fills, the memory granted to it is drawn as b's, filling, in b's colour
and not as grey "other"; a screenshot of that is
$BUILD/artifacts/dashboard-handoff.png (docs/img/dashboard-handoff.png is a
copy). Engine colours are the same after a reload (from the names). A fill's
label says how far its copy is (copied / to_copy), and the grey "other"
says what it is.
A fleet of two models from one file (t_dashboard_fleet): requests through
the door, and the Models panel's served and token counts are the
answers'; in every poll it says what the Engines panel says (released
after the keep-alive, never "resident" beside a released engine); the
timeline has its time axis; door.queue's bytes column is empty and the
keep-alive's releases say so, never "operator".
Also: the page served is broker/api/dashboard.html byte for byte (the embedded
copy, broker/api/dashboard_page.c, is not stale) and it loads nothing from
elsewhere.

Chromium and chromedriver (Debian packages chromium, chromium-driver, about
130 MB) are installed here when missing; without apt the case is skipped
with the reason printed.

    python3 broker/api/dashboard_test.py --write-page   regenerates dashboard_page.c

The last line is "N passed, N failed".
"""
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isfile(os.path.join(ROOT, "tests", "harness.py")) and ROOT != "/":
    ROOT = os.path.dirname(ROOT)  # the tree's root, from a test at any depth
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness as h  # noqa: E402

BUILD = h.BUILD
TOKEN = "s3cret-token"


def page_c(html):
    """dashboard_page.c for this HTML: one C string literal."""
    out = ["/* generated from broker/api/dashboard.html by `python3 broker/api/dashboard_test.py --write-page`;",
           " * do not edit (broker/api/dashboard_test.py checks that the two agree) */",
           '#include "broker/api/dashboard.h"', "", "const char broker_dashboard_html[] ="]
    for line in html.splitlines(True):
        s = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        out.append('    "%s"' % s)
    out[-1] += ";"
    out.append("const unsigned long broker_dashboard_html_len = sizeof broker_dashboard_html - 1;")
    return "\n".join(out) + "\n"


def read_html():
    with open(os.path.join(HERE, "dashboard.html"), encoding="utf-8") as f:
        return f.read()


def ensure_chromium():
    """'' when chromium and chromedriver are there (installed if need be),
    else why not."""
    if shutil.which("chromium") and shutil.which("chromedriver"):
        return ""
    if not shutil.which("apt-get"):
        return "chromium/chromedriver missing and no apt-get to install them"
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    t0 = time.time()
    r = subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium",
                               "chromium-driver"], capture_output=True, text=True, env=env, timeout=900)
    if r.returncode != 0:
        subprocess.run(sudo + ["apt-get", "update", "-q"], capture_output=True, env=env, timeout=600)
        r = subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium",
                                   "chromium-driver"], capture_output=True, text=True, env=env, timeout=900)
    print("  installed chromium and chromium-driver in %.1f s (exit %d)" % (time.time() - t0, r.returncode))
    if r.returncode != 0 or not shutil.which("chromedriver"):
        return "cannot install chromium: " + r.stderr[-500:]
    return ""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class WebDriver:
    """The few W3C WebDriver calls this test needs."""

    def __init__(self, tmp):
        self.port = free_port()
        self.log = open(os.path.join(tmp, "chromedriver.log"), "w")
        self.p = subprocess.Popen(["chromedriver", "--port=%d" % self.port], stdout=self.log,
                                  stderr=subprocess.STDOUT)
        self.base = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 20
        while True:
            try:
                if self._req("GET", "/status")["value"]["ready"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            if time.time() > deadline:
                raise AssertionError("chromedriver did not start")
            time.sleep(0.1)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1200,1000",
                "--user-data-dir=" + os.path.join(tmp, "chromium-profile")]
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": shutil.which("chromium"), "args": args}}}}
        self.sid = self._req("POST", "/session", caps, timeout=60)["value"]["sessionId"]

    def _req(self, method, path, body=None, timeout=30):
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(self.base + path, data=data, method=method,
                                   headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(r, timeout=timeout) as f:
                return json.load(f)
        except urllib.error.HTTPError as e:
            raise AssertionError("webdriver %s %s: %s" % (method, path, e.read()[:500]))

    def cmd(self, method, path, body=None):
        return self._req(method, "/session/%s%s" % (self.sid, path), body)["value"]

    def js(self, script):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": []})

    def close(self):
        try:
            self._req("DELETE", "/session/" + self.sid, timeout=10)
        except Exception:  # noqa: BLE001 - closing anyway
            pass
        self.p.terminate()
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


def t_page_is_current(_c):
    """The embedded page is dashboard.html, and it needs no network."""
    html = read_html()
    with open(os.path.join(HERE, "dashboard_page.c"), encoding="utf-8") as f:
        assert f.read() == page_c(html), "broker/api/dashboard_page.c is stale: run " \
            "python3 broker/api/dashboard_test.py --write-page"
    low = html.lower()
    for bad in ("http://", "https://", "//cdn", "<link", "src=", "@import", "url("):
        assert bad not in low, "the page must load nothing from elsewhere: %r" % bad


def t_dashboard_handoff(c):
    why = ensure_chromium()
    if why:
        print("  skip t_dashboard_handoff: " + why)
        return
    api = c.http_broker("http_token = %s\n" % TOKEN, token=TOKEN)
    c.engine("a")
    # b's refills wait 2 s first (a test hook), so the page can be seen
    # while b fills what the broker granted it
    c.engine("b", env=dict(c.env, BATON_TEST_REFILL_DELAY_MS="2000"))  # takes the device from a
    c.want_holds({"a": 0, "b": h.CEIL})
    st, page, _ = api.get("/", token=False)
    assert st == 200 and page == read_html()
    url = "http://%s:%d/" % (api.host, api.port)
    wd = WebDriver(c.dir)
    art = os.path.join(BUILD, "artifacts")
    os.makedirs(art, exist_ok=True)

    def screenshot(name):
        png = base64.b64decode(wd.cmd("GET", "/screenshot"))
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        with open(os.path.join(art, name), "wb") as f:
            f.write(png)
        return os.path.join(art, name), len(png)
    try:
        wd.cmd("POST", "/url", {"url": url})

        def holders():
            return wd.js("const g = document.getElementById('gpu-0');"
                         "return g ? g.getAttribute('data-holders') : null;")

        def state(name):
            return wd.js("const e = document.getElementById('engine-%s');"
                         "return e ? e.getAttribute('data-state') : null;" % name)

        def colours():
            return wd.js("const o = {}; document.querySelectorAll('#engines tbody tr').forEach(r => "
                         "{ o[r.id] = getComputedStyle(r.querySelector('.dot')).backgroundColor; }); return o;")
        h.wait_for("the page shows b holding the device", lambda: holders() == "b", timeout=15)
        assert state("b") == "ready" and state("a") == "released", (state("a"), state("b"))
        first = colours()
        assert len(first) == 2 and first["engine-a"] != first["engine-b"], first
        t0 = time.time()
        r = h.expect(api.post("/v1/handoff", {"from": "b", "to": "a"}), 200)
        assert r["ok"]
        h.wait_for("the page shows a holding the device", lambda: holders() == "a" and
                    state("a") == "ready" and state("b") == "released", timeout=10)
        shown = time.time() - t0
        assert shown < 5, shown  # polls twice a second
        text = wd.js("return document.body.innerText;")
        assert "held by: a" in text and "handoff" in text, text[:2000]
        # the front door's models (none here: these engines serve no HTTP)
        assert "Models (the OpenAI front door)" in text and "the front door routes nothing" in text, \
            text[:2000]
        assert wd.js("return document.getElementById('conn').className;") == ""  # no error shown
        path, size = screenshot("dashboard.png")
        print("  screenshot: %s (%d bytes); the page showed the handoff after %.2f s" % (path, size, shown))
        # Back to b, whose refill waits: while it fills, the memory granted
        # to it is drawn as b's (filling), in b's colour, never as "other".
        res = {}
        th = threading.Thread(target=lambda: res.update(r=api.post("/v1/handoff", {"from": "a", "to": "b"})))
        th.start()
        try:
            h.wait_for("the page shows b filling", lambda: wd.js(
                "const g = document.getElementById('gpu-0');"
                "return g ? g.getAttribute('data-filling') : null;") == "b", timeout=10)
            seg = wd.js("const s = document.querySelector('#gpu-0 .seg.filling');"
                        "return s ? [s.getAttribute('data-engine'), parseFloat(s.style.width),"
                        " getComputedStyle(s).backgroundColor, s.textContent] : null;")
            assert seg and seg[0] == "b" and seg[1] > 50 and "filling" in seg[3], seg
            assert seg[2] == colours()["engine-b"], (seg, colours())
            other = wd.js("const s = document.querySelector('#gpu-0 .seg.other');"
                          "return s ? parseFloat(s.style.width) : 0;")
            assert other < 5, "granted memory drawn as other: %s%%" % other
            assert state("b") == "refilling", state("b")
            # how far a fill is: the page's label from the core's copied / to_copy
            # (drawn here from a status the test gives it; the next poll redraws)
            lab = wd.js("const st = {gpus: [{uuid: 'G', total: 100 * 1048576, used: 60 * 1048576, held: 50 * 1048576,"
                        " free: 40 * 1048576, reserve: 0, lent: 0}], engines: [{name: 'x', gpu: 'G', state: "
                        "'refilling', resident: 10 * 1048576, ceiling: 50 * 1048576, copied: 30, to_copy: 120}]};"
                        "drawGpus(st); const s = document.querySelector('#gpu-0 .seg.filling');"
                        "const o = document.querySelector('#gpu-0 .other-legend');"
                        "return [s.textContent, s.getAttribute('data-pct'), o ? o.textContent : ''];")
            assert lab[0] == "x (filling 25%)" and lab[1] == "25", lab
            assert "10 MiB" in lab[2] and "dense weights and KV caches" in lab[2], lab  # the grey explained
            path, size = screenshot("dashboard-handoff.png")
            print("  screenshot during the handoff: %s (%d bytes); docs/img/dashboard-handoff.png is a copy"
                  % (path, size))
        finally:
            th.join(30)
        h.expect(res["r"], 200)
        h.wait_for("b holds the device", lambda: holders() == "b" and state("b") == "ready", timeout=10)
        # colours come from the names: the same after a reload, whoever
        # holds the device now and whichever engine the page saw first
        wd.cmd("POST", "/url", {"url": url})
        h.wait_for("the page again", lambda: len(colours()) == 2, timeout=10)
        assert colours() == first, (colours(), first)
        # the broker stops cleanly while the page polls it, and the page says so
        c.bp.send_signal(signal.SIGTERM)
        assert c.bp.wait(10) == 0
        h.wait_for("the page to see the broker gone",
                    lambda: wd.js("return document.getElementById('conn').className;") == "bad", timeout=5)
    finally:
        wd.close()


QWEN_DIR = os.path.join(ROOT, "models", "kjv-qwen3-moe")
MIXTRAL_DIR = os.path.join(ROOT, "models", "kjv-mixtral")


def t_dashboard_fleet(c):
    """A fleet of two models from one file, requests through the door: the
    Models panel's numbers are what happened (state, engines, served,
    tokens), it says what the Engines panel says in the same poll (both
    released after the keep-alive: never "resident" beside "released"),
    and the events' timeline has its time axis."""
    why = ensure_chromium()
    if why:
        print("  skip t_dashboard_fleet: " + why)
        return
    model = ('[model "%s"]\nsource = %s\nbackend = host\nctx = 512\n'
             'engine_flags = --host-device-mib 96 --vram-segment-mib 2\n')
    api = c.http_broker("http_token = %s\narena_dir = %s/arenas\ndoor_keep_alive_s = 3\n" % (TOKEN, c.dir) +
                        model % ("qwen", QWEN_DIR) + model % ("mixtral", MIXTRAL_DIR), token=TOKEN)
    wd = WebDriver(c.dir)
    try:
        wd.cmd("POST", "/url", {"url": "http://%s:%d/" % (api.host, api.port)})

        def row(name):
            return wd.js("const r = document.getElementById('model-%s'); return r ? [r.getAttribute('data-state'),"
                         " r.getAttribute('data-served'), r.getAttribute('data-tokens'), r.children[2].textContent]"
                         " : null;" % name)
        try:
            h.wait_for("both models listed, stopped", lambda: row("qwen") and row("mixtral") and
                       row("qwen")[0] == "stopped" and row("mixtral")[0] == "stopped", timeout=15)
        except AssertionError:
            raise AssertionError("%s %s %s" % (row("qwen"), wd.js("return document.getElementById('conn').textContent;"),
                                               wd.js("return document.body.innerText;")[:1500]))
        assert "no engine (stopped)" in row("qwen")[3], row("qwen")
        tokens = {"qwen": 0, "mixtral": 0}
        for name, n in (("qwen", 3), ("mixtral", 2)):
            for i in range(n):
                st, b, _ = api.post("/v1/chat/completions", {"model": name, "messages": [
                    {"role": "user", "content": "Who was Noah?"}], "max_tokens": 8, "seed": i}, timeout=60)
                assert st == 200, b
                tokens[name] += b["usage"]["completion_tokens"]
        for name, n in (("qwen", 3), ("mixtral", 2)):
            h.wait_for("%s's row says %d served" % (name, n), lambda: row(name) and row(name)[1] == str(n) and
                       row(name)[2] == str(tokens[name]), timeout=10)
            assert name + " (" in row(name)[3], row(name)  # its engine, named
        # after the keep-alive both engines are released: in every poll the
        # Models panel says what the Engines panel says
        both = ("const e = document.getElementById('engine-%s'), m = document.getElementById('model-%s');"
                "return e && m ? [e.getAttribute('data-state'), m.getAttribute('data-state')] : null;")
        seen = set()
        deadline = time.time() + 20
        while time.time() < deadline:
            pair = wd.js(both % ("qwen", "qwen"))
            if pair:
                seen.add(tuple(pair))
                assert not (pair[0] == "released" and pair[1] == "resident"), pair
            if pair == ["released", "released"]:
                break
            time.sleep(0.1)
        assert ("released", "released") in seen, seen
        labels = wd.js("return Array.from(document.querySelectorAll('#strip .lbl')).map(x => x.textContent);")
        assert labels[0] == "\u2212120 s" and labels[-1] == "now" and len(labels) == 5, labels
        ev = wd.js("return Array.from(document.querySelectorAll('#events tbody tr')).map(r => "
                   "[r.getAttribute('data-kind'), r.children[6].textContent, r.children[7].textContent]);")
        # door.queue's count is in its reason, never in the bytes column; a
        # release the keep-alive made says so, never "operator"
        assert all(b == "" for k, b, r in ev if k == "door.queue"), ev
        rel = [r for k, b, r in ev if k == "release"]
        assert rel and all("keep-alive" in r for r in rel), ev
        assert all("operator" not in r for k, b, r in ev), ev
    finally:
        wd.close()


CASES = [t_page_is_current, t_dashboard_handoff, t_dashboard_fleet]


def main():
    if sys.argv[1:] == ["--write-page"]:
        with open(os.path.join(HERE, "dashboard_page.c"), "w", encoding="utf-8") as f:
            f.write(page_c(read_html()))
        print("wrote broker/api/dashboard_page.c")
        return 0
    return h.run_cases(CASES, sys.argv[1:], logs=("broker", "a", "b"))


if __name__ == "__main__":
    sys.exit(main())
