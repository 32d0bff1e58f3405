"""Sphinx extension: make the built book work offline (no CDN).

Loaded by ``_config.yml`` (``sphinx: local_extensions: kestrel_book: book/_ext``).

* plotly.js: copies ``plotly/package_data/plotly.min.js`` from the installed
  ``plotly`` package into ``_build/html/_static/`` and loads it (in ``<head>``,
  blocking) on every page, so the inline ``Plotly.newPlot(...)`` scripts that
  ``kestrel.lab.plots.show`` writes into notebook outputs find ``window.Plotly``.
  The plotly.js copy therefore always matches the Python package that made the
  figure JSON.
* MathJax: the book uses MathJax 2.7 from a local copy (Debian ``libjs-mathjax``
  in /usr/share/javascript/mathjax, or a MathJax 2.7 tree named by
  ``KESTREL_MATHJAX_DIR``), copied (pruned to TeX input + SVG output, ~3 MB) into
  ``_static/mathjax/``. ``_config.yml`` points ``mathjax_path`` at it. Sphinx
  only loads MathJax on pages that contain math; if a page has math and no
  local MathJax is found, this extension emits a warning (an error under -W).
* the colour mode: a fresh browser profile has none stored, and the theme logs an error for
  that; a one-line script sets it to "auto" first.
* thebe: Jupyter Book always loads sphinx-thebe, whose inline config script names a
  CDN URL (unpkg) and is emitted twice per page by sphinx-thebe 0.3.1 on Sphinx 7
  ("Identifier 'THEBE_JS_URL' has already been declared"). The book has no live-code
  button, so its scripts/CSS are dropped from every page.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)

PLOTLY_JS = "plotly.min.js"
MATHJAX_DIR = "mathjax"

# Where a MathJax 2.7 tree (the folder holding MathJax.js) may be found.
_MATHJAX_CANDIDATES = [
    os.environ.get("KESTREL_MATHJAX_DIR", ""),
    "/usr/share/javascript/mathjax",       # Debian/Ubuntu: apt-get install libjs-mathjax
    "/usr/share/mathjax",
]


def plotly_js_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("kestrel_book: the 'plotly' package is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "package_data" / PLOTLY_JS
    if not path.is_file():
        raise RuntimeError(f"kestrel_book: {path} not found in the plotly package")
    return path


def mathjax_source() -> Path | None:
    # (PyPI's jupyter-server-mathjax is no substitute: its copy lacks the SVG output.)
    for c in _MATHJAX_CANDIDATES:
        if c and (Path(c) / "MathJax.js").is_file() and (Path(c) / "config/TeX-AMS_SVG.js").is_file():
            return Path(c)
    return None


# Only what the TeX -> SVG configuration needs (the full tree is ~50 MB).
_MATHJAX_KEEP = [
    "MathJax.js",
    "config/TeX-AMS_SVG.js",
    "extensions",
    "jax/element",
    "jax/input/TeX",
    "jax/output/SVG/jax.js",
    "jax/output/SVG/config.js",
    "jax/output/SVG/autoload",
    "jax/output/SVG/fonts/TeX",
    "localization/en",
]


def _copy_mathjax(src: Path, dst: Path) -> None:
    for rel in _MATHJAX_KEEP:
        s, d = src / rel, dst / rel
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        elif s.is_file():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)


def _on_builder_inited(app) -> None:
    if app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    shutil.copy2(plotly_js_path(), static / PLOTLY_JS)
    src = mathjax_source()
    app.env.kestrel_has_mathjax = src is not None  # type: ignore[attr-defined]
    if src is not None and not (static / MATHJAX_DIR / "MathJax.js").is_file():
        _copy_mathjax(src, static / MATHJAX_DIR)


def _on_check_consistency(app, env) -> None:
    if app.builder.format != "html" or getattr(env, "kestrel_has_mathjax", True):
        return
    math = env.get_domain("math")
    for docname in sorted(env.found_docs):
        if math.has_equations(docname):
            logger.warning(
                "kestrel_book: page %r contains math but no local MathJax 2.7 was found "
                "(install it: apt-get install -y libjs-mathjax, or point KESTREL_MATHJAX_DIR "
                "at a MathJax 2.7 tree); "
                "the book must not load MathJax from a CDN", docname)
            return


def _is_thebe(asset) -> bool:
    name = getattr(asset, "filename", "") or ""
    body = (getattr(asset, "attributes", {}) or {}).get("body", "") or ""
    return "sphinx-thebe" in name or "THEBE_JS_URL" in body or "thebe" in name.rsplit("/", 1)[-1]


def _on_page_context(app, pagename, templatename, context, doctree) -> None:
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = [a for a in context[key] if not _is_thebe(a)]


# The theme's head script sets the colour mode from localStorage or to "" (this theme passes no
# default), and its main script then logs "Got invalid theme mode" as a console error on every
# page of a fresh browser profile. Running after the former and before the latter (deferred):
_THEME_MODE = 'if (!document.documentElement.dataset.mode) document.documentElement.dataset.mode = "auto";'


def setup(app):
    # Loaded before any page content; priority < 500 puts it before the theme's scripts.
    app.add_js_file(PLOTLY_JS, priority=200)
    app.add_js_file(None, body=_THEME_MODE, priority=201)
    app.connect("builder-inited", _on_builder_inited)
    app.connect("env-check-consistency", _on_check_consistency)
    app.connect("html-page-context", _on_page_context, priority=900)  # after everyone else
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True}
