"""Plot helpers for the book's notebooks (plotly only, imported lazily).

``show(fig)`` displays a plotly figure so that it renders

* live, in JupyterLab / Notebook 7 / VS Code, through the plotly mime type
  ``application/vnd.plotly.v1+json`` (plotly >= 6 ships the JupyterLab renderer), and
* in the static book, offline, through a ``text/html`` fallback: a ``<div>`` plus an
  inline ``Plotly.newPlot(...)`` call, without the 4.6 MB plotly.js (the book loads one
  local copy of ``plotly.min.js`` on every page; see ``book/_ext/kestrel_book.py``).
  Jupyter Book picks ``text/html`` (it does not know the plotly mime type).

The div id is derived from the figure's content plus a per-kernel counter, so
re-running a notebook with the same data gives byte-identical output. nbval
(``--nbval-lax``) only compares cells marked ``# NBVAL_CHECK_OUTPUT``: never mark a
figure cell or a ``stamp()`` cell (their content depends on the machine and the date);
put backend-independent numbers in their own checked cells instead.

``stamp()`` / ``measured_here()`` say where and when a result was measured:
"measured on <device> at <date>".
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import sys
from typing import Any

from kestrel import settings
from kestrel.nvrtc import device_props

__all__ = ["show", "figure", "stamp", "measured_here", "device_name", "table", "Spread", "spread", "repeat",
           "print_wrapped"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
# one colour per round phase and per undo policy, in every figure, diagram and widget
PHASE_COLORS = {"draft": "#9467bd", "mark": "#d62728", "verify": "#1f77b4", "undo": "#ff7f0e",
                "replay": "#e377c2", "sync": "#8c564b", "bookkeeping": "#7f7f7f", "tail": "#bcbd22"}
POLICY_COLORS = {"replay": "#d62728", "flex-replay": "#ff7f0e", "checkpoint": "#2ca02c", "input-cache": "#17becf"}
DEFAULT_HEIGHT = 420
# No mode bar (it sat over the titles); figures follow the width of their box.
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "displayModeBar": False}
_CONFIG = PLOT_CONFIG
_counter = 0


# --------------------------------------------------------------------------- figures

def figure(title: str | None = None, *, height: int = DEFAULT_HEIGHT, **layout: Any):
    """A ``plotly.graph_objects.Figure`` with the book's look (white template, fixed height)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(template="plotly_white", height=height,
                      margin=dict(l=60, r=20, t=60 if title else 30, b=50), **layout)
    if title:
        # pinned to the top edge: a legend row above the plot then sits between title and plot
        fig.update_layout(title=dict(text=title, yref="container", y=1.0, yanchor="top",
                                     pad=dict(t=14)))
    return fig


def _figure_dict(fig) -> dict:
    """The figure as plain JSON (numpy arrays become plotly's base64 typed arrays)."""
    return json.loads(fig.to_json())


def _summary(fig, fig_json: dict) -> str:
    title = fig_json.get("layout", {}).get("title", {})
    title = title.get("text") if isinstance(title, dict) else title
    kinds = [t.get("type", "scatter") for t in fig_json.get("data", [])]
    return f"<plotly figure{': ' + repr(title) if title else ''}, traces: {', '.join(kinds) or 'none'}>"


def bundle(fig, *, include_json: bool = True) -> dict:
    """The display mime bundle ``show`` emits (useful for tests)."""
    global _counter
    fig_json = _figure_dict(fig)
    digest = hashlib.sha1(json.dumps(fig_json, sort_keys=True).encode()).hexdigest()[:10]
    _counter += 1
    div_id = f"kfig-{_counter}-{digest}"
    height = fig_json.get("layout", {}).get("height") or DEFAULT_HEIGHT
    # auto_play=False: a figure with frames opens on its own data instead of animating on load
    html = fig.to_html(include_plotlyjs=False, full_html=False, div_id=div_id, auto_play=False,
                       config=_CONFIG, default_width="100%", default_height=f"{height}px",
                       validate=False)
    out = {"text/html": html, "text/plain": _summary(fig, fig_json)}
    if include_json:
        out[PLOTLY_MIME] = {"data": fig_json.get("data", []), "layout": fig_json.get("layout", {}),
                            "config": _CONFIG}
        if fig_json.get("frames"):
            out[PLOTLY_MIME]["frames"] = fig_json["frames"]
    return out


def show(fig, *, include_json: bool = True) -> None:
    """Display ``fig`` live (plotly mime) and in the static offline book (text/html)."""
    from IPython.display import display

    display(bundle(fig, include_json=include_json), raw=True)


# --------------------------------------------------------------------------- text

TEXT_WIDTH = 88           # the longest line a chapter prints (it fits the book's page)


def ms_label(t: float, unit: str = "ms") -> str:
    """A time for a value label: two decimals under 10, one above (one rule for every figure, so
    labels side by side read alike: 26.4 and 26.0, not 26.4 and 26)."""
    return f"{t:.2f} {unit}" if abs(t) < 10 else f"{t:.1f} {unit}"


def print_wrapped(text: str, width: int = TEXT_WIDTH) -> None:
    """Print a long line (a provenance line, a command) wrapped to the page's width."""
    import textwrap
    print(textwrap.fill(str(text), width, subsequent_indent="    ", break_on_hyphens=False))


# --------------------------------------------------------------------------- tables

WRAP_AT = 28


def table_html(rows, head, *, align=None, caption: str | None = None) -> str:
    """An HTML table in a box that scrolls sideways when it is wider than the page (class
    kestrel-table, book/_static/kestrel.css), so no column is ever cut off."""
    from html import escape
    align = align or ["left"] + ["right"] * (len(head) - 1)
    th = "".join(f'<th style="text-align:{a}">{escape(str(h))}</th>' for h, a in zip(head, align))
    # a cell of prose (longer than WRAP_AT characters, with spaces) wraps in a bounded width, so a
    # table of words and numbers fits the page instead of hiding its numbers behind a scroll
    wrap = lambda c: ' class="kt-wrap"' if len(c) > WRAP_AT and " " in c else ""  # noqa: E731
    body = "".join("<tr>" + "".join(f'<td style="text-align:{a}"{wrap(str(c))}>{escape(str(c))}</td>'
                                    for c, a in zip(r, align)) + "</tr>" for r in rows)
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return (f'<div class="kestrel-table"><table>{cap}<thead><tr>{th}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


def table_text(rows, head) -> str:
    """The same table as aligned plain text (what a terminal or a test sees)."""
    cells = [[str(h) for h in head]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[j]) for r in cells) for j in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if j == 0 else c.rjust(w)  # noqa: E731
                              for j, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(cells[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in cells[1:]])


def table(rows, head, *, align=None, caption: str | None = None) -> None:
    """Display rows as a table: HTML in the book and in Jupyter, aligned text elsewhere."""
    from IPython.display import display
    display({"text/html": table_html(rows, head, align=align, caption=caption),
             "text/plain": table_text(rows, head)}, raw=True)


# --------------------------------------------------------------------------- repeats

class Spread:
    """Repeated measurements of one quantity: the median, the range (min..max) and the count."""

    def __init__(self, values):
        import statistics
        self.values = [float(v) for v in values]
        if not self.values:
            raise ValueError("Spread needs at least one value")
        self.median = statistics.median(self.values)
        self.lo, self.hi, self.n = min(self.values), max(self.values), len(self.values)

    @property
    def rel_range(self) -> float:
        """(max - min) / median: how far apart the repeats were, relative to their median."""
        return (self.hi - self.lo) / self.median if self.median else float("inf")

    def fmt(self, spec: str = ".3f", unit: str = "") -> str:
        """'0.240 ms (0.231..0.262, 5 runs)'."""
        u = f" {unit}" if unit and not unit.startswith("×") else unit
        return (f"{self.median:{spec}}{u} ({self.lo:{spec}}..{self.hi:{spec}}, "
                f"{self.n} run{'s' * (self.n != 1)})")

    def short(self, spec: str = ".3f") -> str:
        """'0.240 (0.231..0.262)': for a table whose header names the unit and the count."""
        return f"{self.median:{spec}} ({self.lo:{spec}}..{self.hi:{spec}})"

    def __repr__(self):
        return f"Spread({self.fmt()})"


def spread(values) -> Spread:
    return Spread(values)


def repeat(fn, n: int = 5):
    """Call fn() n times and return the results as a list (each call one repeat of a measurement)."""
    if n < 1:
        raise ValueError(f"repeat needs n >= 1, got {n}")
    return [fn() for _ in range(n)]


# --------------------------------------------------------------------------- provenance

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: Any = None) -> str:
    """A human name for the device results come from.

    ``device`` may be a string (returned as is), a kestrel backend (``.device_name``), or
    a model/engine holding one (``.be``). Without one: the current CuPy
    device if CuPy is already imported and sees a GPU, else the CPU model.
    ``KESTREL_DEVICE_NAME`` overrides the autodetection.
    """
    if isinstance(device, str):
        return device
    # an object: a backend (.device_name), or a model/engine holding one (.be / .backend)
    for obj in (device, getattr(device, "be", None), getattr(device, "backend", None)):
        name = getattr(obj, "device_name", None) if obj is not None else None
        if isinstance(name, str) and name:
            return name
    if settings.get("KESTREL_DEVICE_NAME"):
        return settings.get("KESTREL_DEVICE_NAME")
    if sys.modules.get("cupy") is not None:     # only where CuPy is already in use
        try:
            return device_props()["name"] + " (GPU)"
        except Exception:
            pass
    return f"{_cpu_name()} (CPU, {os.cpu_count()} cores)"


def measured_here(device: Any = None, when: _dt.datetime | None = None) -> dict:
    """``{"device", "date", "python", "host"}`` for the measurement at hand."""
    when = when or _dt.datetime.now(_dt.timezone.utc)
    return {
        "device": device_name(device),
        "date": when.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "host": platform.node(),
    }


PROVENANCE_PX = 14        # the height of one line of a provenance strip, px
PROVENANCE_CHARS = 110    # a longer provenance line is broken in two (at " by ", else at a space)


def _provenance_lines(line: str) -> list:
    if len(line) <= PROVENANCE_CHARS:
        return [line]
    cut = line.find(" by ")
    if cut < 0 or cut > PROVENANCE_CHARS:
        cut = line.rfind(" ", 0, PROVENANCE_CHARS)
    if cut <= 0:
        return [line]
    return [line[:cut], line[cut:].strip()]


def annotate_provenance(fig, line: str) -> None:
    """Write a provenance line into a figure: small grey text along its bottom-left edge, in a
    strip added below everything else (above the plot it sat on titles and subplot titles), and
    broken in two when it is long, so that it never runs off the figure."""
    lines = _provenance_lines(line)
    m = fig.layout.margin
    left = m.l if m is not None and m.l is not None else 80
    strip = PROVENANCE_PX * len(lines) + 8
    bottom = (m.b if m is not None and m.b is not None else 80) + strip
    fig.update_layout(margin=dict(b=bottom))
    fig.add_annotation(text="<br>".join(lines), xref="paper", yref="paper", x=0.0, y=0.0,
                       xanchor="left", yanchor="bottom", xshift=-left + 4, yshift=-bottom + 3,
                       align="left", showarrow=False, font=dict(size=10, color="#777"))


def stamp(fig=None, *, device: Any = None, when: _dt.datetime | None = None,
          quiet: bool = False) -> str:
    """Print (and return) "measured on <device> at <date>".

    With ``fig``, also write the line into the figure (annotate_provenance: small grey text
    along its bottom-left edge) so the static book shows it with the figure; returns the line.
    """
    p = measured_here(device, when)
    line = f"measured on {p['device']} at {p['date']}"
    if fig is not None:
        annotate_provenance(fig, line)
    if not quiet:
        print(line)
    return line


# --------------------------------------------------------------------------- animations
# Figures with frames (kestrel.lab.widgets.replay_frames_figure, cost_explorer_static): `bundle`
# keeps their frames and does not auto-play, so `show` serves them too.
animated_bundle = bundle
show_animated = show
