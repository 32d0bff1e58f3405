"""The book pipeline: committed notebooks are executed and stamped, the book builds with
warnings as errors, and the built HTML loads nothing from the network.

The build test runs ``scripts/build_book.sh --all`` (the README command, every page
re-rendered) into ``_build/html``; tests/test_browser.py then opens those pages.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
HTML = ROOT / "_build" / "html"
NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))

HAVE_JB = importlib.util.find_spec("jupyter_book") is not None


# --------------------------------------------------------------------------- notebooks

@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_committed_executed_and_stamped(path):
    """The book builds from committed outputs: every code cell ran, none failed, and the
    notebook says where and when (scripts/execute_notebooks.py writes metadata.kestrel)."""
    nb = json.loads(path.read_text())
    stamp = nb.get("metadata", {}).get("kestrel", {})
    for key in ("device", "executed_at", "command"):
        assert stamp.get(key), f"{path.name}: metadata.kestrel.{key} missing: run scripts/execute_notebooks.py {path.relative_to(ROOT)}"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or not "".join(cell["source"]).strip():
            continue
        assert cell.get("execution_count") is not None, f"{path.name}: code cell {i} was not executed"
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        assert not errors, f"{path.name}: code cell {i} has an error output: {errors[0].get('ename')}"


# --------------------------------------------------------------------------- kestrel.plots

def test_plots_bundle_is_deterministic_and_offline():
    pytest.importorskip("plotly")
    from kestrel import plots

    def make():
        fig = plots.figure("t", height=300)
        fig.add_bar(x=[0, 1, 2], y=[3, 1, 2])
        return fig

    plots._counter = 0
    a = plots.bundle(make())
    plots._counter = 0
    b = plots.bundle(make())
    assert a == b, "show() output must not change between identical runs (nbval, git diffs)"
    assert set(a) == {"text/html", "text/plain", plots.PLOTLY_MIME}
    assert "Plotly.newPlot" in a["text/html"] and "<script src" not in a["text/html"]
    assert "cdn" not in a["text/html"].lower()
    assert a[plots.PLOTLY_MIME]["data"][0]["type"] == "bar"
    assert a["text/plain"] == "<plotly figure: 't', traces: bar>"
    assert "height:300px" in a["text/html"]
    c = plots.bundle(make())
    assert re.search(r'id="(kfig-[^"]+)"', c["text/html"]).group(1) != \
        re.search(r'id="(kfig-[^"]+)"', a["text/html"]).group(1), "two figures on one page need distinct ids"


def test_plots_stamp():
    from kestrel import plots

    line = plots.stamp(device="NVIDIA H200 (GPU)", quiet=True)
    assert re.fullmatch(r"measured on NVIDIA H200 \(GPU\) at \d{4}-\d\d-\d\d \d\d:\d\d UTC", line)
    assert plots.provenance()["device"]  # autodetected: CPU model here


# --------------------------------------------------------------------------- the build

@pytest.fixture(scope="module")
def built():
    """Run the README's build command once (all pages) and return (seconds, log)."""
    if not HAVE_JB:
        pytest.skip("jupyter-book is not installed (pip install jupyter-book==1.0.4.post1)")
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "build_book.sh"), "--all"], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"jupyter-book build . -W failed (rc={proc.returncode}):\n{log[-6000:]}"
    return dt, log


def test_book_builds_with_warnings_as_errors(built):
    dt, log = built
    assert (HTML / "index.html").is_file()
    assert "build succeeded" in log, log[-3000:]
    print(f"book built in {dt:.1f} s")


def _pages() -> list[Path]:
    return sorted(p for p in HTML.rglob("*.html") if "_static" not in p.parts)


class _Refs(HTMLParser):
    """Collect every resource a page would load: script src, link href (stylesheets,
    preloads, icons, ...), iframe/img/source/embed src, and the text of inline <style>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.refs: list[tuple[str, str]] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.refs.append(("script", a["src"]))
        elif tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower()
            if rel not in ("index", "search", "prev", "next", "canonical", "alternate", "author", "license", "help"):
                self.refs.append((f"link[{rel}]", a["href"]))
        elif tag in ("iframe", "img", "source", "embed", "audio", "video") and a.get("src"):
            self.refs.append((tag, a["src"]))
        elif tag == "style":
            self._in_style = True

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


_CSS_REMOTE = re.compile(r"""(@import\s+(url\()?\s*['"]?|url\(\s*['"]?)(https?:)?//""", re.I)


def _parse(page: Path) -> _Refs:
    p = _Refs()
    p.feed(page.read_text(errors="replace"))
    return p


def test_no_page_loads_anything_external(built):
    """No script, stylesheet, font, image or frame from http(s):// or protocol-relative //."""
    bad = []
    for page in _pages():
        p = _parse(page)
        for kind, url in p.refs:
            if urlsplit(url).scheme in ("http", "https") or url.startswith("//"):
                bad.append(f"{page.relative_to(HTML)}: {kind} {url}")
        for css in p.styles:
            if _CSS_REMOTE.search(css):
                bad.append(f"{page.relative_to(HTML)}: inline <style> imports a remote resource")
    for css in (HTML / "_static").rglob("*.css"):
        if _CSS_REMOTE.search(css.read_text(errors="replace")):
            bad.append(f"{css.relative_to(HTML)}: url()/@import of a remote resource")
    assert not bad, "the built book must work offline (no CDN):\n" + "\n".join(bad)


def test_local_assets_exist_and_plotly_is_on_every_page(built):
    """Every local script/stylesheet a page names exists; plotly.js and (where math is
    used) MathJax come from _static."""
    missing, no_plotly = [], []
    for page in _pages():
        p = _parse(page)
        srcs = [u for _, u in p.refs]
        is_redirect = not srcs and "http-equiv" in page.read_text(errors="replace").lower()
        if not is_redirect and not any(u.split("?")[0].endswith("_static/plotly.min.js") for u in srcs):
            no_plotly.append(str(page.relative_to(HTML)))
        for kind, url in p.refs:
            parts = urlsplit(url)
            if parts.scheme or url.startswith(("//", "data:", "#")) or not parts.path:
                continue
            if not (page.parent / parts.path).resolve().exists():
                missing.append(f"{page.relative_to(HTML)}: {kind} {url}")
    assert not missing, "dangling local asset references:\n" + "\n".join(missing)
    assert not no_plotly, f"pages without plotly.min.js: {no_plotly}"
    assert (HTML / "_static" / "plotly.min.js").stat().st_size > 1_000_000


def test_book_has_plotly_figures(built):
    n = sum(page.read_text(errors="replace").count('class="plotly-graph-div"')
            for page in (HTML / "book").glob("*.html"))
    assert n >= 1, "no chapter contains a plotly figure written by kestrel.plots.show"
