"""Widget plumbing: a figure shown live, and small HTML helpers."""
from __future__ import annotations
from ..plots import bundle


class FigView:
    """A figure shown live, as the display bundle of an ipywidgets.Output (kestrel.lab.plots.bundle).

    The bundle is the Output model's own state, kept by the kernel: a page reloaded, a second
    tab or a notebook reopened while the kernel runs draws the figure as it is now. (A plotly
    FigureWidget keeps its later changes in the page that made them, so a second rendering came
    back in its first state.) Before there is a figure to show, the Output holds one line of
    text (`note`)."""

    def __init__(self, fig=None, note: str = ""):
        import ipywidgets as W
        self.widget = W.Output(layout=W.Layout(width="100%"))
        self.fig = None
        self.updates = 0
        if fig is not None:
            self.update(fig, count=False)
        else:
            self.note(note)

    @property
    def figure(self):
        """The figure shown (None while a note is shown)."""
        return self.fig

    def note(self, text: str):
        """One line of text in place of the figure (what to do to get one); none for ''."""
        self.fig = None
        self.widget.outputs = ({"output_type": "display_data", "metadata": {},
                                "data": {"text/html": f"<p style='margin:8px 0;color:#555'>{text}</p>",
                                         "text/plain": text}},) if text else ()

    def update(self, fig, count: bool = True):
        # The bundle is set as the Output's outputs, not printed into it under `with output:`:
        # that capture protocol is what notebook runners intercept (nbclient, without saved
        # widget state, fails on it), and this way needs no kernel at all.
        self.updates += count
        self.fig = fig
        self.widget.outputs = ({"output_type": "display_data", "data": bundle(fig, include_json=True),
                                "metadata": {}},)


# A live plotly figure draws itself once, at the width its box has at that moment (plotly's 700 px
# default when the box is not laid out yet), and afterwards follows only window resizes. This
# invisible widget watches the box it sits in and, whenever that box is laid out or changes
# width, tells the page its size changed, so every figure in the box takes the box's width.
_FIT_ESM = r"""
export default {
  render({ el }) {
    el.style.cssText = "width:100%;height:0;overflow:hidden";
    let last = -1, timer = null;
    const nudge = () => {
      clearTimeout(timer);
      timer = setTimeout(() => window.dispatchEvent(new Event("resize")), 60);
    };
    const ro = new ResizeObserver((entries) => {
      const w = Math.round(entries[0].contentRect.width);
      if (w !== last) { last = w; nudge(); }
    });
    ro.observe(el);
    const late = [300, 1000, 2500].map((ms) => setTimeout(nudge, ms));
    return () => { ro.disconnect(); late.forEach(clearTimeout); clearTimeout(timer); };
  },
};
"""


def fit_figures():
    """An invisible widget that makes the live figures of the box it is put in fill their boxes
    (None when anywidget is missing: the figures then keep the width they were drawn at)."""
    try:
        import anywidget
    except ImportError:
        return None

    class FitFigures(anywidget.AnyWidget):
        _esm = _FIT_ESM

    return FitFigures()


class AppBox:
    """Builds the top VBox of a widget app: its children, an invisible figure fitter, a short
    text for where no widget can be drawn, and `.app` pointing back at the app."""

    @staticmethod
    def build(children, app, text: str):
        import ipywidgets as W
        fit = fit_figures()
        box = _labelled_vbox(text)(children + ([fit] if fit is not None else []),
                                   layout=W.Layout(width="100%"))
        box.app = app
        return box


_VBOX_CLASSES: dict = {}


def _labelled_vbox(text: str):
    """A VBox whose text form (shown where widgets cannot be drawn: a notebook opened without a
    kernel and without saved widget state, a terminal) says what it is, instead of
    `VBox(children=(...`."""
    if text not in _VBOX_CLASSES:
        import ipywidgets as W

        class VBox(W.VBox):          # an ipywidgets VBox in every other respect
            def __repr__(self):
                return text

        _VBOX_CLASSES[text] = VBox
    return _VBOX_CLASSES[text]


def side_by_side(a: FigView, b: FigView, widths=(50, 50)):
    """Two figures in one row, each in a box of its share of the width, or one under the other
    where the row is narrower than about 900 px (the boxes wrap). The boxes are blocks, not flex
    rows: a figure in a flex row keeps the width it was first drawn at, in a block it takes the
    box's width when it is resized (see fit_figures)."""
    import ipywidgets as W
    return W.HBox([W.Box([v.widget], layout=W.Layout(flex=f"{w} 1 {9 * w}px", min_width="0", display="block",
                                                     overflow="hidden"))
                   for v, w in zip((a, b), widths)], layout=W.Layout(width="100%", flex_flow="row wrap"))


def html_table(rows, head) -> str:
    th = "".join(f"<th style='padding:2px 8px;text-align:left'>{h}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table style='border-collapse:collapse;font-size:90%'><tr>{th}</tr>{tr}</table>"


def esc(s) -> str:
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
