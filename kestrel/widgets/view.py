"""Widget plumbing: a figure shown live, and small HTML helpers."""
from __future__ import annotations


class FigView:
    """A figure shown live: a plotly FigureWidget when one can be built (plotly >= 6 needs
    anywidget), else an ipywidgets.Output redrawn through kestrel.plots.show."""

    force_output = False          # tests flip this to exercise the fallback

    def __init__(self, fig):
        import ipywidgets as W
        self.fw = None
        if not self.force_output:
            try:
                import plotly.graph_objects as go
                self.fw = go.FigureWidget(fig)
            except ImportError:
                self.fw = None
        if self.fw is not None:
            self.widget = self.fw
        else:
            self.widget = W.Output()
            self.fig = fig
            self._draw()
        self.updates = 0

    @property
    def figure(self):
        return self.fw if self.fw is not None else self.fig

    def _draw(self):
        from IPython import get_ipython
        from IPython.display import clear_output
        from ..plots import show
        if get_ipython() is None:            # no kernel, nothing to show it to
            return
        with self.widget:
            clear_output(wait=True)
            show(self.fig, include_json=True)

    def update(self, fig):
        self.updates += 1
        if self.fw is None:
            self.fig = fig
            self._draw()
            return
        fw = self.fw
        lay = fig.layout.to_plotly_json()
        lay.pop("template", None)
        with fw.batch_update():
            same = len(fw.data) == len(fig.data) and all(a.type == b.type for a, b in zip(fw.data, fig.data))
            if same:
                for a, b in zip(fw.data, fig.data):
                    d = b.to_plotly_json()
                    d.pop("type", None)
                    d.pop("uid", None)
                    a.update(d, overwrite=True)
            else:
                fw.data = []
                fw.add_traces(list(fig.data))
            fw.update_layout(lay)


def side_by_side(a: FigView, b: FigView, widths=(50, 50)):
    """Two figures in one row, each in a box of its share of the width (plotly fills its box)."""
    import ipywidgets as W
    return W.HBox([W.Box([v.widget], layout=W.Layout(width=f"{w}%")) for v, w in zip((a, b), widths)],
                  layout=W.Layout(width="100%"))


def html_table(rows, head) -> str:
    th = "".join(f"<th style='padding:2px 8px;text-align:left'>{h}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table style='border-collapse:collapse;font-size:90%'><tr>{th}</tr>{tr}</table>"


def esc(s) -> str:
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
