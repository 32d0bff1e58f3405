#!/usr/bin/env python3
"""The book's two live widgets in a real browser: JupyterLab with a live kernel, driven from
headless Chromium through the DevTools protocol.

    python scripts/browser_widgets.py --out _build/widget_screenshots

What it does, in a fresh JupyterLab server on a free local port (its own settings, workspace
and notebook folder, in a temporary directory):

1. opens a notebook that builds ``kestrel.lab.widgets.spec_replay()`` and
   ``kestrel.lab.widgets.cost_explorer("bench_spec")`` and runs it in a live kernel;
   (with --fallback, their figures go through ipywidgets.Output instead of FigureWidget);
2. spec_replay: presses *Run* with the mouse and waits for the run to finish; the n_ok
   histogram must then hold the run's rounds and every figure must have changed;
3. cost_explorer: drags the α₁ slider with the mouse; the slider's value, the table and both
   figures must change;
4. checks that every figure fills the width of its box (not plotly's default 700 px) and that the
   page logged no error (for example plotly's "Invalid color specifier");
5. opens chapter 7 without running it: its widget cells must not show the raw
   ``VBox(children=...`` text.

Screenshots of each state go to --out (PNG); a JSON report is printed and written beside them.
Exits 0 when every check passed, 1 otherwise, and 77 when JupyterLab or Chromium is missing
(tests/test_browser.py turns that into a skip). The browser runs with the network off (no name
resolves; only the local server on 127.0.0.1 answers).

Chromium is driven over ``--remote-debugging-pipe`` (JSON messages separated by NUL on fds 3
and 4), so no extra Python package is needed; tests/test_browser.py uses the same client.
"""
from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = 77                      # exit status: the tools are missing (not a failure)


# --------------------------------------------------------------------------- Chromium over a pipe

def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """Minimal Chrome DevTools Protocol client over --remote-debugging-pipe."""

    def __init__(self, binary: str, width: int = 1280, height: int = 900):
        self.profile = tempfile.mkdtemp(prefix="kestrel-chromium-")
        to_r, self._to_w = os.pipe()        # we write commands, chromium reads fd 3
        self._from_r, from_w = os.pipe()    # chromium writes fd 4, we read
        # move chromium's ends above 9, so that putting them on 3 and 4 cannot clobber either
        to_r, from_w = (self._high(fd) for fd in (to_r, from_w))
        args = [
            binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-quic", "--disable-extensions",
            "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            f"--user-data-dir={self.profile}",
            # network off: no name resolves, and any proxied request goes to a dead port
            # (except 127.0.0.1, so that a local server still answers)
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            "--proxy-server=http://127.0.0.1:9",
            "--proxy-bypass-list=127.0.0.1", "--remote-debugging-pipe",
            f"--window-size={width},{height}", "about:blank",
        ]
        # chromium reads commands on fd 3 and writes replies on fd 4: a shell puts the pipe
        # ends there (no preexec_fn: not safe with threads)
        shell = f'exec "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
        self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, pass_fds=(to_r, from_w))
        os.close(to_r)
        os.close(from_w)
        self._id = 0
        self._replies: dict[int, dict] = {}
        self._events: "queue.Queue[dict]" = queue.Queue()
        self._cv = threading.Condition()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()

    @staticmethod
    def _high(fd: int) -> int:
        import fcntl
        high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
        os.close(fd)
        return high

    def _drain_stderr(self):
        for line in iter(self.proc.stderr.readline, b""):
            self._stderr.append(line.decode(errors="replace"))

    def _read(self):
        buf = b""
        while True:
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                break
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._cv:
                        self._replies[msg["id"]] = msg
                        self._cv.notify_all()
                else:
                    self._events.put(msg)
        with self._cv:
            self._cv.notify_all()

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        self._id += 1
        mid = self._id
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._cv:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise RuntimeError(f"no reply to {method} (chromium stderr: "
                                       f"{''.join(self._stderr)[-2000:]})")
                self._cv.wait(min(left, 0.5))
            reply = self._replies.pop(mid)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    def events(self) -> list[dict]:
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    def wait_event(self, method: str, session: str, timeout: float) -> tuple[dict | None, list[dict]]:
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                ev = self._events.get(timeout=0.2)
            except queue.Empty:
                continue
            seen.append(ev)
            if ev.get("method") == method and ev.get("sessionId") == session:
                return ev, seen
        return None, seen

    def new_page(self, domains=("Page", "Runtime", "Network", "Log")) -> str:
        """A new tab, attached; returns its session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in domains:
            self.send(f"{domain}.enable", session=session)
        return session

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab: evaluate JavaScript, wait for a condition, click, drag, screenshot."""

    def __init__(self, browser: Browser, width: int, height: int):
        self.b, self.width, self.height = browser, width, height
        self.s = browser.new_page()
        self.log: list[str] = []
        self.resize(width, height)

    def resize(self, width: int, height: int):
        self.width, self.height = width, height
        self.b.send("Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                    session=self.s)

    def goto(self, url: str, timeout: float = 60.0):
        self.collect()
        self.b.send("Page.navigate", {"url": url}, session=self.s)
        ev, seen = self.b.wait_event("Page.loadEventFired", self.s, timeout)
        self._keep(seen)
        if ev is None:
            raise RuntimeError(f"{url}: the load event never fired")

    def js(self, expr: str, timeout: float = 60.0):
        r = self.b.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                             "awaitPromise": True}, session=self.s, timeout=timeout)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise RuntimeError(f"JavaScript error: {d.get('exception', {}).get('description') or d.get('text')}")
        return r.get("result", {}).get("value")

    def wait(self, expr: str, timeout: float, what: str, poll: float = 0.25):
        deadline = time.monotonic() + timeout
        while True:
            v = self.js(expr)
            if v:
                return v
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(poll)

    def mouse(self, kind: str, x: float, y: float, buttons: int = 1):
        self.b.send("Input.dispatchMouseEvent",
                    {"type": kind, "x": x, "y": y, "button": "left",
                     "buttons": buttons, "clickCount": 1}, session=self.s)

    def click(self, x: float, y: float):
        self.mouse("mouseMoved", x, y, 0)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y, 0)

    def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 8):
        self.mouse("mouseMoved", x0, y0, 0)
        self.mouse("mousePressed", x0, y0)
        for i in range(1, steps + 1):
            self.mouse("mouseMoved", x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps)
            time.sleep(0.02)
        self.mouse("mouseReleased", x1, y1, 0)

    def screenshot(self, path: Path, full: bool = False):
        params = {"format": "png"}
        if full:
            params["captureBeyondViewport"] = True
        shot = self.b.send("Page.captureScreenshot", params, session=self.s, timeout=120)
        path.write_bytes(base64.b64decode(shot["data"]))

    def _keep(self, events):
        for e in events:
            if e.get("sessionId") != self.s:
                continue
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                self.log.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif m == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                if p.get("type") in ("error", "warning") or "Invalid color" in text:
                    self.log.append(f"console.{p['type']}: {text}")
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                self.log.append(f"log: {p['entry'].get('text', '')} {p['entry'].get('url', '')}")
            elif m == "Network.requestWillBeSent":
                url = p["request"]["url"]
                if not url.startswith(("file:", "data:", "blob:", "about:", "http://127.0.0.1",
                                       "ws://127.0.0.1")):
                    self.log.append(f"network: {url}")

    def collect(self) -> list[str]:
        self._keep(self.b.events())
        return self.log


# --------------------------------------------------------------------------- JupyterLab

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LAB_SETTINGS = {   # quiet, deterministic JupyterLab: no news toast, every cell rendered
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


class Lab:
    """A JupyterLab server in a temporary folder, on 127.0.0.1, with a random token."""

    def __init__(self, notebooks: dict[str, dict]):
        self.dir = Path(tempfile.mkdtemp(prefix="kestrel-lab-"))
        self.nbdir = self.dir / "notebooks"
        self.nbdir.mkdir()
        for name, nb in notebooks.items():
            (self.nbdir / name).write_text(json.dumps(nb))
        settings = self.dir / "settings"
        for rel, value in LAB_SETTINGS.items():
            p = settings / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(value))
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["JUPYTER_CONFIG_DIR"] = str(self.dir / "config")
        env["JUPYTER_RUNTIME_DIR"] = str(self.dir / "runtime")
        env["JUPYTERLAB_WORKSPACES_DIR"] = str(self.dir / "workspaces")
        env["KESTREL_TEST_LAB"] = "1"
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={self.port}",
               "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={self.token}",
               f"--ServerApp.root_dir={self.nbdir}", "--LabApp.expose_app_in_browser=True",
               f"--LabApp.user_settings_dir={settings}",
               f"--LabApp.workspaces_dir={self.dir / 'workspaces'}",
               "--ServerApp.open_browser=False", "--LabServerApp.news_url=",
               "--ServerApp.allow_remote_access=False"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")          # containers often run as root
        self.log_path = self.dir / "lab.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=self.nbdir, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("JupyterLab did not start:\n" + self.log_path.read_text()[-3000:])
            time.sleep(0.5)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        return f"{self.base}/lab/tree/{notebook}?token={self.token}&reset"

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def notebook(cells: list[str]) -> dict:
    return {"cells": [{"cell_type": "code", "metadata": {}, "source": c, "outputs": [],
                       "execution_count": None} for c in cells],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def widgets_notebook(fallback: bool = False) -> dict:
    """The two widgets, each in its own cell; fallback=True draws their figures through
    ipywidgets.Output instead of plotly's FigureWidget (what a kernel without anywidget does)."""
    first = "import kestrel\nfrom kestrel import widgets\n"
    if fallback:
        first += "from kestrel.lab.widgets.view import FigView\nFigView.force_output = True\n"
    return notebook([first + "replay = widgets.spec_replay(T=32)\nreplay",
                     'explorer = widgets.cost_explorer("bench_spec")\nexplorer'])

# --------------------------------------------------------------------------- in-page probes

_JS_HELPERS = r"""
window.__k = {
  outputs(i) {                       // the output area of code cell i of the open notebook
    const cells = document.querySelectorAll('.jp-Notebook .jp-CodeCell');
    return cells[i] ? cells[i].querySelector('.jp-OutputArea') : null;
  },
  figs(i) {
    const o = this.outputs(i);
    return o ? Array.from(o.querySelectorAll('.js-plotly-plot')) : [];
  },
  signature(i) {                     // what each figure of cell i shows (data + title)
    return JSON.stringify(this.figs(i).map(g => [
      (g.data || []).map(t => [t.x, t.y, t.z, t.text]),
      ((g.layout || {}).title || {}).text || null]));
  },
  widths(i) {                        // each figure's width against the box it sits in
    // the box: the nearest widget box around the figure (a column of side_by_side, or the
    // widget's own column)
    return this.figs(i).map(g => {
      const box = g.parentElement.closest('.widget-box');
      const svg = g.querySelector('svg.main-svg');
      return {fig: Math.round(svg ? svg.getBoundingClientRect().width : 0),
              box: Math.round(box ? box.getBoundingClientRect().width : 0)};
    });
  },
  rect(el) {
    el.scrollIntoView({block: 'center'});
    const r = el.getBoundingClientRect();
    return {x: r.x + r.width / 2, y: r.y + r.height / 2, w: r.width, h: r.height, left: r.left};
  },
  button(i, label) {
    const o = this.outputs(i);
    const b = o && Array.from(o.querySelectorAll('button')).find(b => b.textContent.trim() === label);
    return b ? this.rect(b) : null;
  },
  slider(i, label) {
    const o = this.outputs(i);
    const s = o && Array.from(o.querySelectorAll('.widget-slider')).find(
      s => (s.querySelector('.widget-label') || {}).textContent === label);
    if (!s) return null;
    const h = s.querySelector('.noUi-handle'), t = s.querySelector('.noUi-target, .slider-container');
    const readout = s.querySelector('.widget-readout');
    return {handle: this.rect(h), track: t.getBoundingClientRect().width,
            value: readout ? readout.textContent.trim() : null};
  },
  points(i, prefix) {                // screen positions of the points of traces named prefix*
    const out = [];
    for (const g of this.figs(i)) {
      const fl = g._fullLayout;
      if (!fl) continue;
      (g._fullData || []).forEach(t => {
        if (!(t.name || '').startsWith(prefix) || !t.x) return;
        const xa = fl[(t.xaxis || 'x').replace('x', 'xaxis')], ya = fl[(t.yaxis || 'y').replace('y', 'yaxis')];
        const r = g.getBoundingClientRect();
        t.x.forEach((x, j) => out.push({x: r.left + xa._offset + xa.l2p(xa.d2l(x)),
                                        y: r.top + ya._offset + ya.l2p(ya.d2l(t.y[j]))}));
      });
    }
    return out;
  },
  text(i) { const o = this.outputs(i); return o ? o.innerText : ''; },
  idle() {
    const app = window.jupyterapp;
    const w = app && app.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
  },
};
true
"""


def _load_helpers(page: Page):
    page.js(_JS_HELPERS)


def _open(page: Page, lab: Lab, name: str, timeout: float):
    page.goto(lab.url(name))
    page.wait("!!window.jupyterapp && document.querySelectorAll('.jp-Notebook .jp-Cell').length > 0",
              timeout, f"JupyterLab to open {name}")
    _load_helpers(page)


def check_widgets(page: Page, lab: Lab, shots: Path, timeout: float) -> dict:
    """Run the widget notebook, press Run, drag a slider; return the findings."""
    rep: dict = {"checks": {}, "screenshots": []}
    ok = rep["checks"]

    def shot(name):
        p = shots / f"{name}.png"
        page.screenshot(p)
        rep["screenshots"].append(str(p))

    _open(page, lab, "widgets.ipynb", timeout)
    page.wait("window.__k.idle()", timeout, "the kernel to start")
    page.js("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait("window.__k.figs(0).length >= 3 && window.__k.figs(1).length >= 2 && "
              "window.__k.figs(0).concat(window.__k.figs(1)).every(g => g.querySelector('svg.main-svg'))"
              " && window.__k.idle()",
              timeout, "both widgets to render their figures")
    time.sleep(1.0)
    page.js("window.__k.outputs(0).scrollIntoView()")
    shot("spec_replay_before")

    # --- spec_replay: press Run with the mouse
    before = page.js("window.__k.signature(0)")
    b = page.js("window.__k.button(0, 'Run')")
    ok["spec_replay has a Run button"] = b is not None
    if b:
        page.click(b["x"], b["y"])
        try:
            page.wait("window.__k.text(0).includes('done:') && window.__k.idle()", timeout,
                      "the spec_replay run to finish")
            ok["spec_replay run finished"] = True
        except TimeoutError:
            ok["spec_replay run finished"] = False
        time.sleep(1.0)
        after = page.js("window.__k.signature(0)")
        figs = json.loads(after)
        hist_rounds = sum(v or 0 for v in (figs[0][0][0][1] if figs and figs[0][0] else []) or [])
        ok["spec_replay figures changed after Run"] = after != before
        ok["spec_replay histogram holds the run's rounds"] = hist_rounds > 0
        rep["spec_replay_status"] = page.js(
            "(window.__k.text(0).split('\\n').find(l => l.startsWith('done:')) || '')")
        ok["spec_replay run bit-exact"] = "bit-exact: True" in (rep["spec_replay_status"] or "")
        page.js("window.__k.outputs(0).scrollIntoView()")
        shot("spec_replay_after_run")
    widths = page.js("window.__k.widths(0)") + page.js("window.__k.widths(1)")
    rep["figure_widths"] = widths
    ok["every figure fills its box (within 4 px)"] = bool(widths) and all(
        abs(w["fig"] - w["box"]) <= 4 for w in widths)

    # --- cost_explorer: drag the alpha_1 slider with the mouse
    before = page.js("window.__k.signature(1)")
    table_before = page.js("window.__k.text(1)")
    s = page.js("window.__k.slider(1, 'α1')")
    ok["cost_explorer has an α1 slider"] = s is not None
    if s:
        h = s["handle"]
        page.drag(h["x"], h["y"], h["x"] - 0.3 * s["track"], h["y"])
        try:
            page.wait(f"window.__k.slider(1, 'α1').value !== {json.dumps(s['value'])} && "
                      f"window.__k.signature(1) !== {json.dumps(before)}", timeout,
                      "the cost explorer to redraw")
        except TimeoutError:
            pass
        time.sleep(1.0)
        s2 = page.js("window.__k.slider(1, 'α1')")
        rep["alpha1"] = [s["value"], s2["value"] if s2 else None]
        ok["α1 slider moved"] = bool(s2) and s2["value"] != s["value"]
        ok["cost_explorer figures changed"] = page.js("window.__k.signature(1)") != before
        ok["cost_explorer table changed"] = page.js("window.__k.text(1)") != table_before
        page.js("window.__k.outputs(1).scrollIntoView()")
        shot("cost_explorer_after_drag")
        # hover every measured point: plotly draws a hover label in the marker's colour
        page.js("window.__k.outputs(1).scrollIntoView()")
        pts = page.js("window.__k.points(1, 'measured')") or []
        rep["hovered_points"] = len(pts)
        for pt in pts:
            page.mouse("mouseMoved", pt["x"], pt["y"], 0)
            time.sleep(0.15)
        if pts:
            shot("cost_explorer_hover")
    rep["log"] = [x for x in page.collect()]
    ok["no error logged by the page"] = not [x for x in rep["log"] if not x.startswith("console.warning")]
    ok["no invalid colour"] = not any("Invalid color" in x for x in rep["log"])
    return rep


def check_unrun_chapter(page: Page, lab: Lab, name: str, shots: Path, timeout: float) -> dict:
    """Open a committed chapter without running it: no widget cell shows raw VBox(...) text."""
    rep: dict = {"checks": {}, "screenshots": []}
    _open(page, lab, name, timeout)
    time.sleep(3.0)
    text = page.js("document.querySelector('.jp-Notebook').innerText")
    rep["checks"][f"{name} opened before running shows no raw widget repr"] = "VBox(children=" not in text
    n = page.js("document.querySelectorAll('.jp-Notebook .jp-CodeCell').length")
    for i in range(n):
        if page.js(f"!!window.__k.outputs({i}) && (window.__k.outputs({i}).innerText.includes('live kernel') "
                   f"|| !!window.__k.outputs({i}).querySelector('.widget-vbox'))"):
            page.js(f"window.__k.outputs({i}).scrollIntoView()")
            p = shots / f"{Path(name).stem}_unrun_cell{i}.png"
            page.screenshot(p)
            rep["screenshots"].append(str(p))
    return rep


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "widget_screenshots")
    ap.add_argument("--width", type=int, default=1700, help="browser window width (px)")
    ap.add_argument("--height", type=int, default=1400, help="browser window height (px)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per wait")
    ap.add_argument("--chapter", default="book/ch07_breaking_the_wall.ipynb",
                    help="a committed notebook to open without running it")
    ap.add_argument("--fallback", action="store_true",
                    help="draw the figures through ipywidgets.Output (no FigureWidget)")
    args = ap.parse_args(argv)

    binary = chromium_binary()
    if binary is None or importlib.util.find_spec("jupyterlab") is None:
        print("browser_widgets: needs chromium (apt-get install -y chromium) and jupyterlab "
              "(pip install jupyterlab)", file=sys.stderr)
        return SKIP
    args.out.mkdir(parents=True, exist_ok=True)
    chapter = ROOT / args.chapter
    nbs = {"widgets.ipynb": widgets_notebook(args.fallback)}
    if chapter.is_file():
        nbs[chapter.name] = json.loads(chapter.read_text())
    lab = Lab(nbs)
    browser = Browser(binary, args.width, args.height)
    report: dict = {"width": args.width, "height": args.height, "checks": {}, "screenshots": []}
    try:
        page = Page(browser, args.width, args.height)
        parts = [check_widgets(page, lab, args.out, args.timeout)]
        if chapter.is_file():
            page2 = Page(browser, args.width, args.height)
            parts.append(check_unrun_chapter(page2, lab, chapter.name, args.out, args.timeout))
        for p in parts:
            report["checks"].update(p.pop("checks"))
            report["screenshots"] += p.pop("screenshots")
            report.update(p)
    except Exception as e:                       # reported, with what was seen so far
        report["checks"]["the run completed"] = False
        report["error"] = f"{type(e).__name__}: {e}"
        try:
            page.screenshot(args.out / "error.png")
            report["screenshots"].append(str(args.out / "error.png"))
            report["log"] = page.collect()
        except Exception:
            pass
    finally:
        browser.close()
        lab.close()
    report["passed"] = all(report["checks"].values()) and bool(report["checks"])
    (args.out / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(json.dumps(report, indent=1, ensure_ascii=False))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
