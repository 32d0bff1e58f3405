"""Open every built page in headless Chromium, offline, from file://, at 1280 and 1920 px, and
check that each plotly figure was drawn (an ``svg.main-svg`` inside every ``.plotly-graph-div``),
that math was typeset by the local MathJax, that no script threw, that nothing tried to reach
the network, and that no code block or table is wider than the page (a block or table that is
may only scroll inside its own box). Writes a full-page PNG per page and width to
``_build/screenshots/``.

The last test drives the two live widgets in JupyterLab with a live kernel
(scripts/browser_widgets.py: press Run, drag sliders, change a control, then reload the page,
open a second tab and run again there, and open executed notebooks trusted and untrusted; each
time the figures must show what the status line and the table say) and writes its screenshots,
at 1280 x 900 with the file browser open and at 1700 x 1400, to ``_build/widget_screenshots/``.

Chromium is driven through the DevTools protocol over a pipe (the client in
scripts/browser_widgets.py), so no extra Python package is needed. scripts/setup.sh installs
Chromium and JupyterLab; without them these tests skip. Every subprocess runs on the interpreter
that runs pytest.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import toc_docnames

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"
WIDTHS = (1280, 1920)      # a laptop and a desktop window
MAX_HEIGHT = 16000          # cap on screenshot height (px)
PAGE_TIMEOUT = 60.0         # seconds for a page to load and draw


def _chromium() -> str | None:
    return browser_widgets.chromium_binary()


def _chapters() -> list[str]:
    """Docnames of the chapters, from _toc.yml (root first)."""
    try:
        import yaml  # noqa: F401
    except ImportError:  # pragma: no cover
        return []
    return toc_docnames(ROOT)


CHAPTERS = _chapters()


# --------------------------------------------------------------------------- build

def _sources() -> list[Path]:
    out = [ROOT / "_config.yml", ROOT / "_toc.yml"]
    for pat in ("*.ipynb", "*.md", "_ext/*.py", "_static/*"):
        out += (ROOT / "book").glob(pat)
    return out + list((ROOT / "kestrel").rglob("*.py"))      # pages include the package's source


def _ensure_built():
    index = HTML / "index.html"
    fresh = index.is_file() and all(
        p.stat().st_mtime <= index.stat().st_mtime for p in _sources() if p.exists())
    if fresh:
        return
    if importlib.util.find_spec("jupyter_book") is None:
        pytest.skip("no built book in _build/html and jupyter-book is not installed")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_book.sh")], cwd=ROOT,
                          env={**os.environ, "PYTHON": sys.executable},   # this interpreter, not PATH's
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, "book build failed:\n" + (proc.stdout + proc.stderr)[-6000:]


# --------------------------------------------------------------------------- DevTools over a pipe

sys.path.insert(0, str(ROOT / "scripts"))
import browser_widgets  # noqa: E402  (the DevTools client and the JupyterLab driver)

Browser = browser_widgets.Browser


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
  // a code block wider than its box, or a table wider than the page outside a scrolling box
  const wide = Array.from(document.querySelectorAll('pre'))
    .filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1)
    .map(e => e.textContent.split('\n').reduce((a, b) => a.length > b.length ? a : b).slice(0, 90));
  const article = document.querySelector('article.bd-article') || document.body;
  const tables = Array.from(document.querySelectorAll('table'))
    .filter(t => t.offsetParent && !t.closest('.kestrel-table, .plotly-graph-div') &&
                 t.getBoundingClientRect().right > article.getBoundingClientRect().right + 1)
    .map(t => (t.querySelector('th, td') || t).textContent.slice(0, 40));
  return JSON.stringify({figs: figs.length, drawn: drawn.length, wide, tables,
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


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_draws_offline(browser, docname, width):
    b, session = browser
    page = HTML / f"{docname}.html"
    assert page.is_file(), f"{page} was not built"
    b.events()  # drop anything left over from the previous page
    b.send("Emulation.setDeviceMetricsOverride",
           {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}, session=session)
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
           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=session)
    shot = b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                  session=session, timeout=120)
    out = SHOTS / f"{docname.replace('/', '__')}@{width}.png"
    out.write_bytes(base64.b64decode(shot["data"]))

    ours = [e for e in seen if e.get("sessionId") == session]
    js_errors = [e["params"]["exceptionDetails"].get("exception", {}).get("description")
                 or e["params"]["exceptionDetails"].get("text")
                 for e in ours if e["method"] == "Runtime.exceptionThrown"]
    console_errors = [e["params"]["entry"].get("text", "") + " " + e["params"]["entry"].get("url", "")
                      for e in ours if e["method"] == "Log.entryAdded"
                      and e["params"]["entry"].get("level") == "error"]
    console_errors += [" ".join(str(a.get("value", a.get("description", ""))) for a in e["params"]["args"])
                       for e in ours if e["method"] == "Runtime.consoleAPICalled"
                       and e["params"].get("type") == "error"]
    network = sorted({e["params"]["request"]["url"] for e in ours
                      if e["method"] == "Network.requestWillBeSent"
                      and not e["params"]["request"]["url"].startswith(("file:", "data:", "blob:", "about:"))})
    print(f"{docname} @ {width}: {st['figs']} figure(s), {st['maths']} math, {elapsed:.1f} s -> "
          f"{out.relative_to(ROOT)}")

    assert not network, f"{docname}: the page tried to reach the network: {network}"
    assert not js_errors, f"{docname}: JavaScript errors: {js_errors}"
    assert not console_errors, f"{docname}: console errors: {console_errors}"
    assert st["plotly"] == "object", f"{docname}: window.Plotly is {st['plotly']} (plotly.min.js not loaded)"
    assert st["drawn"] == st["figs"], f"{docname}: figures not drawn: {st['undrawn']}"
    assert not st["wide"], f"{docname} @ {width}px: code blocks wider than the page: {st['wide'][:5]}"
    assert not st["tables"], f"{docname} @ {width}px: tables cut off by the page: {st['tables'][:5]}"
    assert st["typeset"] >= st["maths"] and st["mjErrors"] == 0, \
        f"{docname}: math not typeset by the local MathJax ({st['typeset']}/{st['maths']}, errors {st['mjErrors']})"


# --------------------------------------------------------------------------- the live widgets

def test_live_widgets_in_jupyterlab():
    """Both widgets in JupyterLab with a live kernel (scripts/browser_widgets.py): spec_replay
    says "Press Run" and draws no empty figures before its first run; Run pressed with the
    mouse; the cost explorer's α1 and k moved; a control changed after the run is announced; the
    page reloaded and the notebook opened in a second tab (a page whose widgets have not drawn
    after 2 minutes is reloaded once, what it showed kept in the report), where Run is pressed again: every
    time the figures' data equal the status line's and the table's numbers, in both tabs; every
    figure as wide as its box; nothing logged as an error; a notebook executed as the book's
    build does (no front-end), opened trusted and untrusted, and the committed chapter 7
    opened untrusted, show text saying to run the widget cells, never an error. Screenshots in
    _build/widget_screenshots/."""
    if _chromium() is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    if importlib.util.find_spec("jupyterlab") is None:
        pytest.skip("jupyterlab is not installed (pip install -r requirements.txt)")
    out = ROOT / "_build" / "widget_screenshots"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "browser_widgets.py"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if proc.returncode == browser_widgets.SKIP:
        pytest.skip(proc.stderr.strip())
    report = json.loads((out / "report.json").read_text())
    failed = [name for name, ok in report["checks"].items() if not ok]
    assert proc.returncode == 0 and not failed, \
        (f"failed: {failed}; error: {report.get('error')}; log: {report.get('log', [])[:5]}; "
         f"reloaded: {report.get('reloaded once')}; tab 2 showed: {report.get('tab 2 text')!r:.600}")
    assert len(report["screenshots"]) >= 16
