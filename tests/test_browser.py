"""Open every built chapter in headless Chromium, offline, from file://, and check that
each plotly figure was drawn (an ``svg.main-svg`` inside every ``.plotly-graph-div``),
that math was typeset by the local MathJax, that no script threw, and that nothing tried
to reach the network. Writes a full-page PNG per chapter to ``_build/screenshots/``.

Chromium is driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL on fds 3/4), so no extra Python package is needed.
Skips cleanly without a chromium binary (``apt-get install -y chromium``).
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
WIDTH = 1280
MAX_HEIGHT = 16000          # cap on screenshot height (px)
PAGE_TIMEOUT = 60.0         # seconds for a page to load and draw


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _chapters() -> list[str]:
    """Docnames of the chapters, from _toc.yml (root first)."""
    try:
        import yaml
    except ImportError:  # pragma: no cover
        return []
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    names = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                names.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))
            for part in e.get("parts", []) or []:
                walk(part.get("chapters"))

    walk(toc.get("chapters"))
    for part in toc.get("parts", []) or []:
        walk(part.get("chapters"))
    return [str(Path(n).with_suffix("")) for n in names]


CHAPTERS = _chapters()


# --------------------------------------------------------------------------- build

def _sources() -> list[Path]:
    out = [ROOT / "_config.yml", ROOT / "_toc.yml"]
    for pat in ("*.ipynb", "*.md", "_ext/*.py", "_static/*"):
        out += (ROOT / "book").glob(pat)
    return out


def _ensure_built():
    index = HTML / "index.html"
    fresh = index.is_file() and all(
        p.stat().st_mtime <= index.stat().st_mtime for p in _sources() if p.exists())
    if fresh:
        return
    if importlib.util.find_spec("jupyter_book") is None:
        pytest.skip("no built book in _build/html and jupyter-book is not installed")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_book.sh")], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, "book build failed:\n" + (proc.stdout + proc.stderr)[-6000:]


# --------------------------------------------------------------------------- DevTools over a pipe

class Browser:
    """Minimal Chrome DevTools Protocol client over --remote-debugging-pipe."""

    def __init__(self, binary: str):
        self.profile = tempfile.mkdtemp(prefix="kestrel-chromium-")
        to_r, self._to_w = os.pipe()        # we write commands, chromium reads fd 3
        self._from_r, from_w = os.pipe()    # chromium writes fd 4, we read
        args = [
            binary, "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--no-first-run", "--disable-quic", "--disable-extensions",
            "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
            f"--user-data-dir={self.profile}",
            # network off: no name resolves, and any proxied request goes to a dead port
            "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
            "--remote-debugging-pipe", f"--window-size={WIDTH},900", "about:blank",
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
                    raise RuntimeError(f"no reply to {method} (chromium stderr: {''.join(self._stderr)[-2000:]})")
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


# What "drawn" means, evaluated in the page.
_PROBE = r"""
(() => {
  const figs = Array.from(document.querySelectorAll('div.plotly-graph-div'));
  const drawn = figs.filter(d => d.querySelector('svg.main-svg'));
  const maths = document.querySelectorAll('span.math, div.math').length;
  const typeset = document.querySelectorAll('.MathJax_SVG').length;
  const mjErrors = document.querySelectorAll('.MathJax_SVG merror, .MathJax_Error').length;
  const mjIdle = !window.MathJax || !window.MathJax.Hub ||
                 (window.MathJax.Hub.queue.pending === 0 && window.MathJax.Hub.queue.running === 0);
  return JSON.stringify({figs: figs.length, drawn: drawn.length,
                         undrawn: figs.filter(d => !d.querySelector('svg.main-svg')).map(d => d.id),
                         maths, typeset, mjErrors, mjIdle, plotly: typeof window.Plotly,
                         height: Math.ceil(Math.max(document.documentElement.scrollHeight,
                                                    document.body.scrollHeight))});
})()
"""


@pytest.fixture(scope="module")
def browser():
    binary = _chromium()
    if binary is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    _ensure_built()
    SHOTS.mkdir(parents=True, exist_ok=True)
    b = Browser(binary)
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Network", "Log"):
            b.send(f"{domain}.enable", session=session)
        yield b, session
    finally:
        b.close()


def _probe(b, session) -> dict:
    r = b.send("Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session=session)
    return json.loads(r["result"]["value"])


@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_draws_offline(browser, docname):
    b, session = browser
    page = HTML / f"{docname}.html"
    assert page.is_file(), f"{page} was not built"
    b.events()  # drop anything left over from the previous page
    b.send("Emulation.setDeviceMetricsOverride",
           {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
    t0 = time.perf_counter()
    b.send("Page.navigate", {"url": page.as_uri()}, session=session)
    loaded, seen = b.wait_event("Page.loadEventFired", session, PAGE_TIMEOUT)
    assert loaded is not None, f"{docname}: load event never fired"

    # wait until every figure is drawn and MathJax (if any) is done
    deadline = time.monotonic() + PAGE_TIMEOUT
    while True:
        st = _probe(b, session)
        done = st["drawn"] == st["figs"] and st["mjIdle"] and st["typeset"] >= st["maths"]
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    time.sleep(0.3)                      # let plotly finish its transitions before the shot
    seen += b.events()
    elapsed = time.perf_counter() - t0

    height = min(max(st["height"], 900), MAX_HEIGHT)
    b.send("Emulation.setDeviceMetricsOverride",
           {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
    shot = b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                  session=session, timeout=120)
    out = SHOTS / (docname.replace("/", "__") + ".png")
    out.write_bytes(base64.b64decode(shot["data"]))

    ours = [e for e in seen if e.get("sessionId") == session]
    js_errors = [e["params"]["exceptionDetails"].get("exception", {}).get("description")
                 or e["params"]["exceptionDetails"].get("text")
                 for e in ours if e["method"] == "Runtime.exceptionThrown"]
    console_errors = [e["params"]["entry"].get("text", "") + " " + e["params"]["entry"].get("url", "")
                      for e in ours if e["method"] == "Log.entryAdded"
                      and e["params"]["entry"].get("level") == "error"]
    network = sorted({e["params"]["request"]["url"] for e in ours
                      if e["method"] == "Network.requestWillBeSent"
                      and not e["params"]["request"]["url"].startswith(("file:", "data:", "blob:", "about:"))})
    print(f"{docname}: {st['figs']} figure(s), {st['maths']} math, {elapsed:.1f} s -> {out.relative_to(ROOT)}")

    assert not network, f"{docname}: the page tried to reach the network: {network}"
    assert not js_errors, f"{docname}: JavaScript errors: {js_errors}"
    assert not console_errors, f"{docname}: console errors: {console_errors}"
    assert st["plotly"] == "object", f"{docname}: window.Plotly is {st['plotly']} (plotly.min.js not loaded)"
    assert st["drawn"] == st["figs"], f"{docname}: figures not drawn: {st['undrawn']}"
    assert st["typeset"] >= st["maths"] and st["mjErrors"] == 0, \
        f"{docname}: math not typeset by the local MathJax ({st['typeset']}/{st['maths']}, errors {st['mjErrors']})"
