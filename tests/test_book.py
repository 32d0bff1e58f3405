"""The book pipeline: committed notebooks are executed and stamped, the book builds with
warnings as errors, and the built HTML loads nothing from the network.

The build test runs ``scripts/build_book.sh --all`` (the build step of the README's book
command ``scripts/book.sh``, every page re-rendered) into ``_build/html``; the page tests below
read that build (and skip when there is none), and tests/test_browser.py opens the pages.
"""
from __future__ import annotations

import datetime as _dt
import importlib.util
import json
import re
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import toc_docnames

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


# --------------------------------------------------------------------------- kestrel.lab.plots

def test_plots_bundle_is_deterministic_and_offline():
    pytest.importorskip("plotly")
    from kestrel.lab import plots

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
    from kestrel.lab import plots

    line = plots.stamp(device="NVIDIA H200 (GPU)", quiet=True)
    assert re.fullmatch(r"measured on NVIDIA H200 \(GPU\) at \d{4}-\d\d-\d\d \d\d:\d\d UTC", line)
    when = _dt.datetime(2026, 1, 2, 3, 4, tzinfo=_dt.timezone.utc)
    assert plots.stamp(device="X", when=when, quiet=True) == "measured on X at 2026-01-02 03:04 UTC"


def test_plots_measured_here_names_the_device(monkeypatch):
    """The device name a figure is stamped with: the override, else a detected GPU or the CPU
    with its core count; never an empty or placeholder string."""
    from kestrel.lab import plots

    monkeypatch.setenv("KESTREL_DEVICE_NAME", "Example GPU 9000")
    assert plots.measured_here()["device"] == "Example GPU 9000"
    monkeypatch.delenv("KESTREL_DEVICE_NAME")
    dev = plots.measured_here()["device"]
    assert re.fullmatch(r"\S.* \((GPU|CPU, \d+ cores)\)", dev), f"unexpected device name {dev!r}"
    assert plots.measured_here(device="given")["device"] == "given"


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
    assert n >= 1, "no chapter contains a plotly figure written by kestrel.lab.plots.show"


# --------------------------------------------------------------------------- the pages of the build

def _toc_docnames() -> list[str]:
    return toc_docnames(ROOT)


APPENDIX_PAGES = {  # docname -> its title
    "book/appendix_design": "Appendix A. The design in one place",
    "book/glossary": "Glossary",
    "book/references": "References",
}


@pytest.fixture(scope="module")
def html():
    """The existing build in _build/html (made by the build test above or by scripts/book.sh);
    skip when there is none, or when a source is newer than it."""
    index = HTML / "index.html"
    if not index.is_file():
        pytest.skip("the book is not built (bash scripts/book.sh)")
    # index.html is a redirect written once; the pages themselves say when the build ran
    pages = [HTML / f"{d}.html" for d in _toc_docnames()]
    if not all(p.is_file() for p in pages):
        pytest.skip("the book is not fully built (bash scripts/book.sh)")
    built_at = min(p.stat().st_mtime for p in pages)
    sources = [ROOT / "_toc.yml", ROOT / "_config.yml", *BOOK.glob("*.md"), *NOTEBOOKS]
    stale = [p.name for p in sources if p.stat().st_mtime > built_at]
    if stale:
        pytest.skip(f"the build in _build/html is older than {stale[:3]}: rebuild (bash scripts/book.sh)")
    return HTML


class _Page(HTMLParser):
    """Title, h1 text, links (href) and the text inside elements marked lang="zh..."."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title, self.h1, self.links, self.zh, self.dt = "", "", [], [], []
        self._stack: list[str] = []
        self._zh_depth = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self._stack.append(tag)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "dt":
            self.dt.append("")
        if (a.get("lang") or "").startswith("zh"):
            self._zh_depth += 1
            self.zh.append("")
        elif self._zh_depth:
            self._zh_depth += 1

    def handle_endtag(self, tag):
        if self._zh_depth:
            self._zh_depth -= 1
        while self._stack and self._stack.pop() != tag:
            pass

    def handle_data(self, data):
        if "title" in self._stack[-1:]:
            self.title += data
        if "h1" in self._stack:
            self.h1 += data
        if "dt" in self._stack:
            self.dt[-1] += data
        if self._zh_depth:
            self.zh[-1] += data


def _read(page: Path) -> _Page:
    p = _Page()
    p.feed(page.read_text(errors="replace"))
    return p


def test_every_toc_page_is_built(html):
    missing = [d for d in _toc_docnames() if not (html / f"{d}.html").is_file()]
    assert not missing, f"pages in _toc.yml without a built page: {missing}"


@pytest.mark.parametrize("docname", sorted(APPENDIX_PAGES))
def test_appendix_pages_are_built_and_in_the_navigation(html, docname):
    page = html / f"{docname}.html"
    assert page.is_file(), f"{page.relative_to(ROOT)} was not built"
    p = _read(page)
    assert APPENDIX_PAGES[docname] in p.h1, f"{docname}: h1 is {p.h1.strip()!r}"
    root = html / f"{_toc_docnames()[0]}.html"          # the root page (index.html redirects to it)
    linked = {(root.parent / urlsplit(h).path).resolve() for h in _read(root).links if not urlsplit(h).scheme}
    assert page.resolve() in linked, \
        f"{docname} is not linked from the book's navigation"


def test_local_links_resolve(html):
    """Every relative link on every page (chapters, appendix, glossary, references) names a
    file of the build."""
    bad = []
    for page in _pages():
        for href in _read(page).links:
            parts = urlsplit(href)
            if parts.scheme or href.startswith(("#", "//")) or not parts.path:
                continue
            if not (page.parent / parts.path).resolve().exists():
                bad.append(f"{page.relative_to(html)} -> {href}")
    assert not bad, "links to pages that were not built:\n" + "\n".join(bad[:20])


def test_references_name_and_link_the_sources(html):
    p = _read(html / "book" / "references.html")
    assert any("投机轮的锚定口径" in z for z in p.zh), "the article's title (in Chinese, lang=zh) is missing"
    want = ["gitee.com/pei-xiaoguang/kestrel-llm-cuda", "vllm-project/vllm", "sgl-project/sglang",
            "ggml-org/llama.cpp/pull/22673", "dao-lab.ai", "arxiv.org/abs/2505.14969",
            "arxiv.org/abs/2408.15237", "thinkingmachines.ai", "fla-org/flash-linear-attention"]
    missing = [w for w in want if not any(w in h for h in p.links)]
    assert not missing, f"references without their link: {missing}"


def test_glossary_defines_the_terms(html):
    terms = " | ".join(_read(html / "book" / "glossary.html").dt)
    want = ["anchor", "n_{ok}", "self token", "ghost token", "mark", "rollback", "truncate", "cursor",
            "MTP slot", "pairing", "E16", "0:24 1:6 2:11 3:4", "batch invariance", "strict, flex",
            "policy", "floor"]
    missing = [w for w in want if w not in terms]
    assert not missing, f"glossary terms missing: {missing} (defined: {terms[:500]})"


def test_article_quotes_are_marked_for_cjk_fonts(html):
    """The Chinese quotes sit in lang="zh-Hans" elements and the book's CSS names CJK fonts for
    them (scripts/setup.sh installs fonts-noto-cjk), so they do not render as boxes."""
    ch5 = _read(html / "book" / "ch05_wall.html")
    assert any("一轮" in z for z in ch5.zh), "chapter 5's quote is not marked lang=zh-Hans"
    css = (html / "_static" / "kestrel.css").read_text()
    assert re.search(r":lang\(zh[^)]*\)[^{]*\{[^}]*Noto Sans CJK", css), "no CJK font stack for lang=zh"


# --------------------------------------------------------------------------- the sources

# The repository stands on its own: it cites only documents it contains, names the source
# article as "the article" (the book's retired names for it and its drafter are kept out), and
# records no path of the machine a file was made on: a path is relative to the repository, or
# a standard system location.
_RETIRED = re.compile(r"§|\bthe seed\b|\bseed's\b|\bmtp-seed\b")
_SYSTEM_DIRS = ("usr", "dev", "bin", "sbin", "etc", "opt", "lib", "lib64", "proc", "sys", "var")
_ABS_PATH = re.compile(r"(?<![\w:/.~`$})-])/([A-Za-z_][\w.-]*)/")
_DOC = re.compile(r"(?<![\w/.-])([\w-]+(?:/[\w.-]+)*\.md)\b")
_SHELL_VAR = re.compile(r"\$[A-Za-z_]\w*\b")     # a recorded command names its values (OUTDIR, ...)


_TRACKED = None


def _tracked_names() -> set:
    """Base names of the files git tracks (build folders do not count as holding a document)."""
    global _TRACKED
    if _TRACKED is None:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        _TRACKED = {Path(x).name for x in out.splitlines()}
    return _TRACKED


def _foreign(path: Path, text: str) -> list:
    """What in `text` points outside the repository: a path into a non-system directory, or a
    document (a .md file) the repository does not hold."""
    out = [m.group(0) for m in _ABS_PATH.finditer(text) if m.group(1) not in _SYSTEM_DIRS]
    for m in _DOC.finditer(text):
        name = m.group(1)
        if Path(name).name not in _tracked_names():
            out.append(name)
    return out


def test_book_prose_speaks_only_of_itself():
    """The book's prose and the README cite only documents the repository holds, name no path of
    a build machine, and call the source article "the article"."""
    texts = {p.relative_to(ROOT): p.read_text() for p in [*BOOK.glob("*.md"), ROOT / "README.md"]}
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        texts[nb.relative_to(ROOT)] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    hits = [f"{path}: {m.group(0)!r} in ...{text[max(0, m.start() - 40):m.end() + 40]!r}..."
            for path, text in texts.items() for m in _RETIRED.finditer(text)]
    hits += [f"{path}: {x!r}" for path, text in texts.items() for x in _foreign(ROOT / path, text)]
    assert not hits, "\n".join(hits)


def test_results_and_records_name_no_build_machine():
    """Results files, the training record and the scripts' notes carry device, date and command,
    but no path of the machines they were made on, no document the repository lacks, and (outside
    the shell scripts themselves) no shell variable where a recorded command should name a value."""
    files = [*(ROOT / "results").glob("*.json"), *(ROOT / "results").glob("*.md"),
             *(ROOT / "kestrel" / "assets" / "tiny").glob("*.json"), *(ROOT / "kestrel" / "assets" / "tiny").glob("*.md"),
             *(ROOT / "scripts").glob("*.sh"), *(ROOT / "scripts").glob("*.md"), ROOT / "README.md"]
    hits = []
    for p in files:
        text = p.read_text()
        hits += [f"{p.relative_to(ROOT)}: {x!r}" for x in _foreign(p, text)]
        if p.suffix != ".sh":
            hits += [f"{p.relative_to(ROOT)}: {m.group(0)!r}" for m in _SHELL_VAR.finditer(text)]
    assert not hits, "\n".join(hits[:20])


# --------------------------------------------------------------------------- the chapters' form

CHAPTERS_1_7 = sorted(p for p in NOTEBOOKS if re.match(r"ch0[1-7]_", p.name))
CHAPTERS_1_10 = sorted(p for p in NOTEBOOKS if re.match(r"ch(0[1-9]|10)_", p.name))   # the page-style checks (1..10)
LINE = 88          # the longest code or printed line that fits the page (book/_static/kestrel.css)


def _cells(path, kind=None):
    cells = json.loads(path.read_text())["cells"]
    return [c for c in cells if kind is None or c["cell_type"] == kind]


def _text_outputs(cell):
    """The plain-text outputs the book shows (a stream, or text/plain without an HTML twin)."""
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            yield "".join(o.get("text", ""))
        elif "text/html" not in o.get("data", {}) and "text/plain" in o.get("data", {}):
            yield "".join(o["data"]["text/plain"])


def test_chapters_1_to_7_are_present():
    assert [p.name[:4] for p in CHAPTERS_1_7] == [f"ch0{i}" for i in range(1, 8)]


@pytest.mark.parametrize("path", CHAPTERS_1_10, ids=[p.name for p in CHAPTERS_1_10])
def test_code_and_printed_lines_fit_the_page(path):
    long = []
    for i, c in enumerate(_cells(path, "code")):
        long += [f"cell {i} source: {ln!r}" for ln in "".join(c["source"]).splitlines() if len(ln) > LINE]
        long += [f"cell {i} output: {ln!r}" for t in _text_outputs(c) for ln in t.splitlines()
                 if len(ln) > LINE]
    assert not long, f"{path.name}: lines longer than {LINE} characters:\n" + "\n".join(long[:10])


_INCLUDE = re.compile(r"```\{literalinclude\} (\S+)\n((?::\w+:.*\n)*)```")


def _included_lines(path):
    """(target, lines) of each literalinclude of a chapter: the object :pyobject: names (found
    with ast), or the whole file, after :dedent:."""
    import ast
    for c in _cells(path, "markdown"):
        for m in _INCLUDE.finditer("".join(c["source"])):
            target = (path.parent / m.group(1)).resolve()
            opts = dict(re.findall(r":(\w+): *(.*)", m.group(2)))
            lines = target.read_text().splitlines()
            if "pyobject" in opts:
                node = ast.parse(target.read_text())
                for part in opts["pyobject"].split("."):
                    node = next(n for n in ast.iter_child_nodes(node) if getattr(n, "name", None) == part)
                first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                lines = lines[first - 1:node.end_lineno]
            cut = int(opts.get("dedent", 0) or 0)
            yield f"{m.group(1)}:{opts.get('pyobject', '')}", [ln[cut:] for ln in lines]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_included_source_fits_the_page(path):
    """The package's own source shown on a page (literalinclude) fits it, as a code cell must."""
    long = [f"{t}: {ln.strip()!r}" for t, lines in _included_lines(path) for ln in lines if len(ln) > LINE]
    assert not long, f"{path.name}: included lines longer than {LINE} characters:\n" + "\n".join(long[:10])


@pytest.mark.parametrize("path", CHAPTERS_1_7 + CHAPTERS_1_10[8:], ids=[p.name for p in CHAPTERS_1_7 + CHAPTERS_1_10[8:]])
def test_plotting_code_is_collapsed(path):
    """A cell that draws a figure shows the figure and hides its code behind a toggle."""
    hidden = {"hide-input", "hide-cell", "remove-input"}
    bare = [i for i, c in enumerate(_cells(path, "code"))
            if re.search(r"\bshow(_animated)?\(", "".join(c["source"]))
            and not hidden & set(c.get("metadata", {}).get("tags", []))]
    assert not bare, f"{path.name}: figure cells with their code shown: {bare}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_toggle_says_what_it_hides(path):
    """A hidden cell's toggle names what it opens ("Answer 2: show", "Show the code behind
    this"), never the generic "Show code cell content"."""
    bare = [i for i, c in enumerate(_cells(path, "code"))
            if {"hide-input", "hide-cell", "hide-output"} & set(c.get("metadata", {}).get("tags", []))
            and not c["metadata"].get("mystnb", {}).get("code_prompt_show")]
    assert not bare, f"{path.name}: hidden cells without a toggle label: {bare}"


@pytest.mark.parametrize("path", CHAPTERS_1_10, ids=[p.name for p in CHAPTERS_1_10])
def test_chapter_ends_with_summary_and_exercises_with_answers(path):
    cells = _cells(path)
    md = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
    at = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
               and "## Summary" in "".join(c["source"])), None)
    assert at is not None, f"{path.name}: no '## Summary' section"
    text = "".join(cells[at]["source"])
    assert "Exercises" in text and re.search(r"^\s*2\. ", text, re.M), \
        f"{path.name}: the summary has no exercises (two or more)"
    answers = [c for c in cells[at + 1:] if c["cell_type"] == "code"
               and "hide-cell" in c.get("metadata", {}).get("tags", [])
               and "".join(c["source"]).startswith("# Answer")]
    n = len(re.findall(r"^\s*\d\. ", text, re.M))
    assert len(answers) >= min(n, 2), f"{path.name}: {n} exercises, {len(answers)} answer cells"
    for c in answers:
        assert c.get("execution_count") is not None and not any(
            o.get("output_type") == "error" for o in c.get("outputs", [])), \
            f"{path.name}: an answer cell did not run cleanly"
        assert c.get("outputs"), f"{path.name}: an answer cell shows nothing to check against"
    assert any("glossary.md" in t for t in md), f"{path.name}: never links the glossary"


@pytest.mark.parametrize("path", CHAPTERS_1_7, ids=[p.name for p in CHAPTERS_1_7])
def test_widget_cells_say_what_they_are(path):
    """Opened before running (no kernel, no saved widget state), a widget cell shows its text
    form: it must say what the widget is, not `VBox(children=(...`."""
    for i, c in enumerate(_cells(path, "code")):
        for o in c.get("outputs", []):
            data = o.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                text = "".join(data.get("text/plain", ""))
                assert not text.startswith(("VBox(", "HBox(")), f"{path.name} cell {i}: {text[:60]!r}"
                assert "live kernel" in text, f"{path.name} cell {i}: {text[:80]!r}"


def test_wall_is_taught_as_measured():
    """Chapters 1, 3 and 5 read the copy's cost from the engine benchmark (never typed in), and
    chapter 5 no longer calls the verify cheap; chapter 7 names the n_ok = 0 step and links the
    input-cache chapter, and tells the story from the 27B runs (decomposition, 2 x 2)."""
    src = {p.name[:4]: "\n".join("".join(c["source"]) for c in _cells(p)) for p in CHAPTERS_1_7}
    for ch in ("ch01", "ch03"):
        assert 'results.load_engine(results.of_default_engine("bench_engine"))' in src[ch], ch
    assert "verify batch is cheap" not in src["ch05"] and "is cheap:" not in src["ch05"]
    assert 'results.load_spec(results.of_default_engine("bench_spec"))' in src["ch05"]
    assert "n_{ok} = 0" in src["ch07"] and "ch08_three_ways.ipynb" in src["ch07"]
    assert "input-cache" in src["ch07"]
    # chapter 7 tells the story as one decomposition and the two fixes as a 2 x 2, from the runs
    assert "story.decomposition(" in src["ch07"] and "story.pairing_by_undo(" in src["ch07"]
