#!/usr/bin/env python3
"""The book's two live widgets in a real browser: JupyterLab with a live kernel, driven from
headless Chromium through the DevTools protocol.

    python scripts/browser_widgets.py --out _build/widget_screenshots
    python scripts/browser_widgets.py --drop-widget-views book/*.ipynb   (after executing them)

What it does, in a fresh JupyterLab server on a free local port, writing only inside a temporary
folder (its settings, data, runtime files, IPython profile, npm cache, home: lab_env):

1. executes a notebook of the two widgets as the book's build does (no front-end) and opens it
   trusted and untrusted, and opens the committed chapter 7 untrusted (trusted too once its
   widget outputs are text): every widget cell must say to run it, never show an error;
2. opens a notebook that builds ``kestrel.lab.widgets.spec_replay()`` and
   ``kestrel.lab.widgets.cost_explorer("bench_spec")`` and runs it in a live kernel; spec_replay
   must show one "Press Run" line and no figures;
3. spec_replay: presses *Run* with the mouse and waits for the run to finish; the status line's
   rounds, tokens and ms/token must be the figures' (histogram, phase totals and greedy mark,
   per-round bars and greedy line);
4. cost_explorer: drags the α₁ slider with the mouse and moves k with the keyboard; the
   figures must show the controls' k, pairing and policy and the table's ms/token;
5. changes spec_replay's drafter: the status must say "changed — press Run"; saves the notebook;
6. opens it in a second tab, presses Run there, and reloads the first tab: each rendering must
   show the current state whole (3 and 4 again), in both tabs;
7. checks that every figure fills the width of its box and that the pages logged no error.

Screenshots of each widget before, during and after a run and after the reload, at 1280 x 900
with JupyterLab's file browser open and at 1700 x 1400, go to --out (PNG); a JSON report is
printed and written beside them. Exits 0 when every check passed, 1 otherwise, and 77 when
JupyterLab or Chromium is missing (tests/test_browser.py turns that into a skip). The browser
runs with the network off (no name resolves; only the local server on 127.0.0.1 answers).

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
        # its home and caches inside its profile folder, so that it writes nothing outside it
        env = {**os.environ, "HOME": self.profile, "XDG_CACHE_HOME": os.path.join(self.profile, ".cache"),
               "XDG_CONFIG_HOME": os.path.join(self.profile, ".config")}
        self.proc = subprocess.Popen(["bash", "-c", shell, "chromium", *args], env=env,
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

    def front(self):
        """Make this the tab in front: a tab behind another is throttled (late redraws, no
        screenshot)."""
        self.b.send("Page.bringToFront", session=self.s)

    def goto(self, url: str, timeout: float = 60.0):
        self.front()
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


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def drop_widget_views(path: Path) -> int:
    """Keep only the text form of each widget output of an executed notebook. Its widget models
    died with the kernel that executed it (no widget state is stored), so a view of one, opened
    trusted, shows "Error displaying widget: model not found"; the text says to run the cell.
    Returns how many outputs were changed. scripts/build_book.sh --execute runs this."""
    nb = json.loads(path.read_text())
    n = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if WIDGET_VIEW in data and "text/plain" in data:
                del data[WIDGET_VIEW]
                n += 1
    if n:
        path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n")   # as nbformat writes
    return n


def lab_env(tmp: Path) -> dict:
    """Everything JupyterLab, its kernels and npm would write outside `tmp` (settings, data such
    as the notebook-signing secret, runtime files, IPython's profile, npm's cache and logs, a
    home directory), pointed inside it; kestrel imported from this checkout."""
    env = {"JUPYTER_CONFIG_DIR": "config", "JUPYTER_DATA_DIR": "data", "JUPYTER_RUNTIME_DIR": "runtime",
           "JUPYTERLAB_WORKSPACES_DIR": "workspaces", "IPYTHONDIR": "ipython", "npm_config_cache": "npm",
           "HOME": "home", "XDG_CACHE_HOME": "home/.cache", "XDG_CONFIG_HOME": "home/.config",
           "XDG_DATA_HOME": "home/.local/share"}
    env = {k: str(tmp / v) for k, v in env.items()}
    for v in env.values():
        Path(v).mkdir(parents=True, exist_ok=True)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                        else []))
    return env


class Lab:
    """A JupyterLab server in a temporary folder, on 127.0.0.1, with a random token; it and its
    kernels write only inside that folder (lab_env)."""

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
        env = {**os.environ, **lab_env(self.dir)}
        self.env = env
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

    def execute(self, name: str):
        """Execute a notebook of the folder as the book's build does (nbclient: no front-end,
        widget state not stored, then drop_widget_views), in this server's environment."""
        code = ("import sys, nbformat; from nbclient import NotebookClient; p = sys.argv[1]; "
                "nb = nbformat.read(p, as_version=4); "
                "NotebookClient(nb, timeout=600, kernel_name='python3', store_widget_state=False).execute(); "
                "nbformat.write(nb, p)")
        subprocess.run([sys.executable, "-c", code, str(self.nbdir / name)], env=self.env, check=True,
                       cwd=self.nbdir, capture_output=True, timeout=900)
        drop_widget_views(self.nbdir / name)

    def trust(self, name: str):
        """Sign a notebook with this server's secret: JupyterLab then opens it trusted."""
        subprocess.run([sys.executable, "-m", "jupyter", "trust", str(self.nbdir / name)], env=self.env,
                       check=True, capture_output=True, timeout=120)

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


def widgets_notebook(T: int = 128) -> dict:
    """The two widgets, each in its own cell."""
    return notebook(["import kestrel\nfrom kestrel.lab import widgets\n"
                     f"replay = widgets.spec_replay(T={T})\nreplay",
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
  fig(i, title) {                    // the figure of cell i whose title starts with `title`
    return this.figs(i).find(g => (((g.layout || {}).title || {}).text || '').startsWith(title)) || null;
  },
  select(i, label, value) {          // choose `value` in the dropdown labelled `label`, as a user does
    const o = this.outputs(i);
    const d = o && Array.from(o.querySelectorAll('.widget-dropdown')).find(
      d => (d.querySelector('.widget-label') || {}).textContent === label);
    const s = d && d.querySelector('select');
    const opt = s && Array.from(s.options).find(x => x.textContent === value);
    if (!opt) return false;
    s.value = opt.value;
    s.dispatchEvent(new Event('change', {bubbles: true}));
    return true;
  },
  replayState() {                    // spec_replay: the status line's numbers and the figures' own
    const t = this.text(0);
    const m = t.match(/(done|running): (\d+) rounds?, (\d+) tokens?, ([\d.]+) ms\/token vs greedy ([\d.]+) ms\/token/);
    const hist = this.fig(0, 'n_ok histogram'), phase = this.fig(0, 'ms per token'),
          rounds = this.fig(0, 'each round');
    const trace = (g, name) => g && (g.data || []).find(d => d.name === name);
    const total = trace(phase, 'total'), greedyMark = trace(phase, 'greedy ms/token');
    const line = trace(rounds, 'greedy, same tokens');
    const fmt = v => Math.abs(v) < 10 ? v.toFixed(2) : v.toFixed(1);   // kestrel.lab.plots.ms_label
    return {status: m ? {state: m[1], rounds: +m[2], tokens: +m[3], ms: m[4], greedy: m[5]} : null,
            changed: t.includes('changed — press Run'), pressRun: t.includes('Press Run'),
            figures: this.figs(0).length,
            histRounds: hist ? Array.from(hist.data[0].y || []).reduce((a, b) => a + b, 0) : null,
            histTitle: hist ? hist.layout.title.text : null,
            total: total ? String(total.text[0]).replace(' ms', '') : null,
            greedy: greedyMark ? fmt(greedyMark.y[0]) : null,
            roundBars: rounds ? (rounds.data[0].x || []).length : null,
            greedyLine: line ? (line.x || []).length : 0};
  },
  explorerState() {                  // cost_explorer: the controls, the table and the figures
    const o = this.outputs(1);
    if (!o) return null;
    const k = this.slider(1, 'k');
    const active = lab => {
      const g = Array.from(o.querySelectorAll('.widget-toggle-buttons')).find(
        g => (g.querySelector('.widget-label') || {}).textContent === lab);
      const b = g && g.querySelector('button.mod-active');
      return b ? b.textContent.trim() : null;
    };
    const table = {};
    const tbl = o.querySelector('table');
    Array.from(tbl ? tbl.querySelectorAll('tr') : []).slice(1).forEach(r => {
      const c = Array.from(r.querySelectorAll('td')).map(td => td.textContent.trim());
      table[c[0]] = String(parseFloat(c[3]));
    });
    const phase = this.fig(1, 'Predicted ms/token'), surface = this.fig(1, 'Predicted speedup');
    const total = phase && phase.data.find(d => d.name === 'total');
    const shown = {};
    if (total && total.customdata) Array.from(total.x).forEach((x, j) => {
      shown[String(x).replace('<br>', '')] = String(parseFloat(Number(total.customdata[j]).toPrecision(4)));
    });
    return {k: k ? k.value : null, pairing: active('pairing'), policy: active('policy'), table, shown,
            phaseTitle: phase ? phase.layout.title.text : null,
            surfaceTitle: surface ? surface.layout.title.text : null};
  },
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


SETTLE = 15.0         # seconds of quiet before a notebook with live widgets is rendered again
RETRY_AFTER = 120.0   # seconds before a page whose widgets have not rendered is reloaded once
SIZES = {"1280x900": (1280, 900, True), "1700x1400": (1700, 1400, False)}   # (width, height, file browser)

RENDERED = ("window.__k.figs(1).length >= 2 && window.__k.outputs(0) && "
            "!!window.__k.outputs(0).querySelector('.widget-vbox') && "
            "window.__k.figs(0).concat(window.__k.figs(1)).every(g => g.querySelector('svg.main-svg'))")


class Run:
    """One scenario's findings: named checks, screenshots, notes."""

    def __init__(self, shots: Path):
        self.shots, self.checks, self.screenshots, self.notes = shots, {}, [], {}

    def check(self, name: str, ok) -> bool:
        self.checks[name] = bool(ok)
        return bool(ok)

    def shoot(self, page: Page, state: str, cells=(0, 1)):
        """Screenshots of each widget at every size of SIZES (the 1280 px ones with JupyterLab's
        file browser open), each widget from its top and from its bottom."""
        w0, h0 = page.width, page.height
        page.front()
        for size, (w, h, browser) in SIZES.items():
            page.resize(w, h)
            page.js("window.jupyterapp.shell." + ("activateById('filebrowser')" if browser else "collapseLeft()"))
            time.sleep(1.5)                         # the figures follow their boxes' new width
            for i in cells:
                for end in ("start", "end"):
                    page.js(f"window.__k.outputs({i}).scrollIntoView({{block: '{end}'}})")
                    time.sleep(0.2)
                    p = self.shots / f"{('spec_replay', 'cost_explorer')[i]}_{state}_{size}_{end}.png"
                    page.screenshot(p)
                    self.screenshots.append(str(p))
        page.resize(w0, h0)
        page.js("window.jupyterapp.shell.collapseLeft()")
        time.sleep(1.0)


def replay_agrees(run: Run, page: Page, when: str, state: str = "done") -> dict:
    """spec_replay's status line and its figures show the same run."""
    st = page.js("window.__k.replayState()")
    s = st["status"] or {}
    run.notes[f"spec_replay {when}"] = st
    run.check(f"spec_replay {when}: status reads '{state}: N rounds, ...'", s.get("state") == state)
    run.check(f"spec_replay {when}: histogram holds the status's rounds",
              s and st["histRounds"] == s["rounds"] and f"({s['rounds']} round" in (st["histTitle"] or ""))
    run.check(f"spec_replay {when}: per-round chart has the status's rounds and its greedy line",
              s and st["roundBars"] == s["rounds"] and st["greedyLine"] == s["rounds"])
    run.check(f"spec_replay {when}: phase chart's total and greedy are the status's ms/token",
              s and st["total"] == s["ms"] and st["greedy"] == s["greedy"])
    return st


def explorer_agrees(run: Run, page: Page, when: str) -> dict:
    """cost_explorer's figures show the controls' k, pairing and policy and the table's ms/token."""
    st = page.js("window.__k.explorerState()")
    run.notes[f"cost_explorer {when}"] = st
    run.check(f"cost_explorer {when}: phase chart shows the slider's k and the pairing",
              st and f"k = {st['k']}," in (st["phaseTitle"] or "") and f"pairing {st['pairing']}" in st["phaseTitle"])
    run.check(f"cost_explorer {when}: surface shows the policy and pairing",
              st and f"policy {st['policy']}, pairing {st['pairing']}" in (st["surfaceTitle"] or ""))
    run.check(f"cost_explorer {when}: phase chart's totals are the table's ms/token",
              st and st["table"] and st["shown"] == st["table"])
    return st


def _wait_rendered(page: Page, timeout: float, what: str):
    page.wait(RENDERED, timeout, what)
    time.sleep(1.5)


def check_widgets(page: Page, lab: Lab, run: Run, timeout: float):
    """Run the widget notebook, press Run, drag a slider, change a control; save the notebook."""
    _open(page, lab, "widgets.ipynb", timeout)
    page.wait("window.__k.idle()", timeout, "the kernel to start")
    time.sleep(3.0)                                 # the widget manager opens its control channel
    page.js("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    _wait_rendered(page, timeout, "both widgets to render")
    page.wait("window.__k.idle()", timeout, "the cells to finish")
    st = page.js("window.__k.replayState()")
    run.check("spec_replay before Run: one 'Press Run' line, no figures", st["pressRun"] and st["figures"] == 0)
    run.shoot(page, "before")

    b = page.js("window.__k.button(0, 'Run')")
    if not run.check("spec_replay has a Run button", b is not None):
        return
    page.click(b["x"], b["y"])
    try:
        page.wait("window.__k.text(0).includes('running:')", timeout, "the first rounds")
        run.shoot(page, "during", cells=(0,))
    except TimeoutError:
        run.notes["during"] = "the run finished before its first redraw could be photographed"
    page.wait("window.__k.text(0).includes('done:') && window.__k.idle()", timeout, "the run to finish")
    time.sleep(1.0)
    replay_agrees(run, page, "after Run")
    run.check("spec_replay run bit-exact", "bit-exact: True" in page.js("window.__k.text(0)"))
    widths = page.js("window.__k.widths(0)") + page.js("window.__k.widths(1)")
    run.notes["figure_widths"] = widths
    run.check("every figure fills its box (within 4 px)", widths and all(abs(w["fig"] - w["box"]) <= 4
                                                                           for w in widths))

    explorer_agrees(run, page, "at first")
    s = page.js("window.__k.slider(1, 'α1')")
    if run.check("cost_explorer has an α1 slider", s is not None):
        before = page.js("JSON.stringify(window.__k.explorerState())")
        h = s["handle"]
        page.drag(h["x"], h["y"], h["x"] - 0.3 * s["track"], h["y"])
        try:
            page.wait(f"JSON.stringify(window.__k.explorerState()) !== {json.dumps(before)}", timeout,
                      "the cost explorer to redraw")
        except TimeoutError:
            pass
        time.sleep(1.0)
        run.check("α1 slider moved", page.js("window.__k.slider(1, 'α1').value") != s["value"])
        explorer_agrees(run, page, "after dragging α1")
    k = page.js("window.__k.slider(1, 'k')")
    if k:                                           # k one step down, with the keyboard
        page.js("window.__k.outputs(1).querySelector('.widget-slider .noUi-handle') && "
                "Array.from(window.__k.outputs(1).querySelectorAll('.widget-slider')).find("
                "s => s.querySelector('.widget-label').textContent === 'k').querySelector('.noUi-handle').focus()")
        for kind in ("keyDown", "keyUp"):
            page.b.send("Input.dispatchKeyEvent", {"type": kind, "key": "ArrowLeft", "code": "ArrowLeft",
                                                   "windowsVirtualKeyCode": 37}, session=page.s)
        time.sleep(2.0)
        run.check("cost_explorer k moved with the keyboard", page.js("window.__k.slider(1, 'k').value") != k["value"])
        explorer_agrees(run, page, "after moving k")

    # a control changed after the run: the status says the figures are the earlier run's
    run.check("spec_replay drafter menu answers", page.js("window.__k.select(0, 'drafter', 'mtp')"))
    time.sleep(1.0)
    st = replay_agrees(run, page, "after changing the drafter")
    run.check("spec_replay says 'changed — press Run' after a control changed", st["changed"])
    run.shoot(page, "after_run")
    page.js("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait("!document.querySelector('.jp-mod-current .jp-mod-dirty')", timeout, "the notebook to be saved")
    time.sleep(1.0)


def check_rerendered(page: Page, lab: Lab, run: Run, timeout: float, when: str, changed: bool,
                     shoot: bool = False):
    """The widget notebook rendered again while its kernel runs (a reload, a second tab): the
    same state, figures included; `changed`: whether the controls differ from the run shown."""
    # A page that opens gives the kernel 4 s to send it every widget's state, else ipywidgets
    # falls back to asking model by model, which can miss some ("model not found"); on a
    # 2-core machine still busy drawing the last run that deadline can pass. Let it settle.
    time.sleep(SETTLE)
    _open(page, lab, "widgets.ipynb", timeout)
    try:
        _wait_rendered(page, min(timeout, RETRY_AFTER), f"both widgets to render {when}")
    except TimeoutError:
        # What the page showed goes into the report; then one reload, as a reader would do. A
        # page that still does not render fails the run.
        slug = "".join(c if c.isalnum() else "_" for c in when)[:40]
        shot = run.shots / f"not_rendered_{slug}.png"
        page.screenshot(shot)
        run.screenshots.append(str(shot))
        seen = page.js("(document.querySelector('.jp-Notebook') || document.body).innerText.slice(0, 1500)")
        # what the page logged before the reload goes with it into the report; of it, only the
        # fallback's "model not found" (above) is dropped from the error check at the end
        before = list(page.collect())
        page.log[:] = [x for x in before if "widget model not found" not in x]
        run.notes.setdefault("reloaded once", []).append(
            {"when": when, "after_s": min(timeout, RETRY_AFTER), "page_text": seen, "log": before[:10]})
        time.sleep(SETTLE)
        _open(page, lab, "widgets.ipynb", timeout)
        _wait_rendered(page, timeout, f"both widgets to render {when} (after one reload)")
    st = replay_agrees(run, page, when)
    run.check(f"spec_replay {when}: " + ("says" if changed else "does not say") + " 'changed — press Run'",
              st["changed"] == changed)
    explorer_agrees(run, page, when)
    if shoot:
        run.shoot(page, "reloaded")


def check_second_run(page: Page, first: Page, run: Run, timeout: float):
    """Run pressed in the second tab: both tabs draw the new run whole."""
    b = page.js("window.__k.button(0, 'Run')")
    if not run.check("second tab: Run button", b is not None):
        return
    old = page.js("window.__k.text(0)")
    page.click(b["x"], b["y"])
    page.wait(f"window.__k.text(0) !== {json.dumps(old)} && window.__k.text(0).includes('done:') && "
              "!window.__k.text(0).includes('changed')", timeout, "the second run to finish")
    time.sleep(2.0)
    st = replay_agrees(run, page, "after a second Run in the second tab")
    first.front()
    s = st["status"] or {}
    try:                                            # the first tab catches up once it is in front
        first.wait(f"window.__k.text(0).includes('done: {s.get('rounds')} round')", timeout,
                   "the first tab to show the second tab's run")
    except TimeoutError:
        pass
    time.sleep(1.0)
    replay_agrees(run, first, "in the first tab after the second tab's Run")


def check_saved_opening(page: Page, lab: Lab, run: Run, name: str, trusted: bool, timeout: float, what: str):
    """A notebook opened without running it: its widget cells show text saying to run them, or
    the widget, never an error or a raw VBox(...)."""
    _open(page, lab, name, timeout)
    time.sleep(4.0)
    text = page.js("document.querySelector('.jp-Notebook').innerText")
    mode = "trusted" if trusted else "untrusted"
    run.check(f"{what} opened {mode}: no widget error", "Error displaying widget" not in text
              and "Error creating widget" not in text)
    run.check(f"{what} opened {mode}: no raw widget repr", "VBox(children=" not in text)
    run.check(f"{what} opened {mode}: widget cells say to run them", text.count("run this cell in a live kernel") >= 2)
    p = run.shots / f"{Path(name).stem}_{mode}.png"
    page.screenshot(p)
    run.screenshots.append(str(p))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "_build" / "widget_screenshots")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per wait")
    ap.add_argument("--chapter", default="book/ch07_breaking_the_wall.ipynb",
                    help="a committed notebook with widget cells, opened without running it")
    ap.add_argument("--drop-widget-views", nargs="+", type=Path, metavar="NOTEBOOK",
                    help="only drop the widget views of these executed notebooks (drop_widget_views)")
    args = ap.parse_args(argv)
    if args.drop_widget_views:
        for path in args.drop_widget_views:
            n = drop_widget_views(path)
            if n:
                print(f"{path}: {n} widget output(s) kept as text")
        return 0

    binary = chromium_binary()
    if binary is None or importlib.util.find_spec("jupyterlab") is None:
        print("browser_widgets: needs chromium (apt-get install -y chromium) and jupyterlab "
              "(pip install jupyterlab)", file=sys.stderr)
        return SKIP
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.png"):
        old.unlink()
    chapter = ROOT / args.chapter
    nb = widgets_notebook()
    nbs = {"widgets.ipynb": nb, "executed.ipynb": nb, "executed_untrusted.ipynb": nb}
    if chapter.is_file():
        nbs[chapter.name] = json.loads(chapter.read_text())
    run = Run(args.out)
    lab = Lab(nbs)
    browser = Browser(binary, *SIZES["1700x1400"][:2])
    page = second = None
    try:
        # executed as the book's build executes a chapter, then opened: trusted and untrusted
        lab.execute("executed.ipynb")
        lab.execute("executed_untrusted.ipynb")
        lab.trust("executed.ipynb")
        page = Page(browser, *SIZES["1700x1400"][:2])
        check_saved_opening(page, lab, run, "executed.ipynb", True, args.timeout, "executed notebook")
        check_saved_opening(page, lab, run, "executed_untrusted.ipynb", False, args.timeout, "executed notebook")
        if chapter.is_file():
            check_saved_opening(page, lab, run, chapter.name, False, args.timeout, chapter.name)
            if not any(WIDGET_VIEW in o.get("data", {}) for c in nbs[chapter.name]["cells"]
                       for o in c.get("outputs", [])):
                lab.trust(chapter.name)
                check_saved_opening(page, lab, run, chapter.name, True, args.timeout, chapter.name)
            else:
                run.notes["chapter trusted"] = (f"{args.chapter} still holds widget views from an execution "
                                                "before drop_widget_views: opened trusted, its widget cells "
                                                "show 'model not found' until it is re-executed")

        check_widgets(page, lab, run, args.timeout)
        second = Page(browser, *SIZES["1700x1400"][:2])
        check_rerendered(second, lab, run, args.timeout, "in a second tab", changed=True)
        check_second_run(second, page, run, args.timeout)
        check_rerendered(page, lab, run, args.timeout, "after a reload (a trusted reopening)", changed=False,
                         shoot=True)
        run.notes["log"] = page.collect() + second.collect()
        # a page left with an unsaved notebook asks "leave?"; headless Chromium blocks that and logs it
        errors = [x for x in run.notes["log"] if not x.startswith("console.warning")
                  and "'beforeunload' confirmation panel" not in x]
        run.check("no error logged by the pages", not errors)
        run.check("no invalid colour", not any("Invalid color" in x for x in run.notes["log"]))
    except Exception as e:                       # reported, with what was seen so far
        run.check("the run completed", False)
        run.notes["error"] = f"{type(e).__name__}: {e}"
        for i, p in enumerate(x for x in (page, second) if x is not None):   # every tab, as it was
            try:
                shot = args.out / f"error_tab{i + 1}.png"
                p.screenshot(shot)
                run.screenshots.append(str(shot))
                run.notes[f"tab {i + 1} text"] = p.js(
                    "(document.querySelector('.jp-Notebook') || document.body).innerText.slice(0, 1500)")
                run.notes.setdefault("log", []).extend(p.collect())
            except Exception:
                pass
    finally:
        browser.close()
        lab.close()
    report = {"checks": run.checks, "screenshots": run.screenshots, **run.notes,
              "passed": bool(run.checks) and all(run.checks.values())}
    (args.out / "report.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    print(json.dumps(report, indent=1, ensure_ascii=False))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
