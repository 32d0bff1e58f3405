"""batch_explorer: many sequences at once, live (chapter 9; ipywidgets, imported when built)."""
from __future__ import annotations

from kestrel import speculative as spec
from . import cache
from .view import AppBox, FigView, esc, html_table
from .. import batching
from ..plots import stamp

# What the widget shows where it cannot be drawn (ipywidgets cuts a text form at 110 characters).
TEXT_FORM = "batch_explorer: a live widget; run this cell in a live kernel to pick B, k and a policy."

BATCHES = (1, 2, 4, 8, 16, 32)
POLICIES = ("replay", "flex-replay", "checkpoint", "input-cache")


def batch_explorer(model=None, *, device: str = "auto", B: int = 4, k: int = 3, policy: str = "checkpoint",
                   T: int = 24, run: bool = False):
    """Pick a batch size B, k and an undo strategy; Run decodes B sequences with greedy and with
    that strategy on the model's backend (batching.sweep: the replay drafter forcing the E16
    profile, each sequence its own draws) and shows tokens/s, ms per token and the speedup over
    greedy at that B, beside every earlier run of this widget. The returned box has `.app`:
    app.run(), app.controls, app.rows (every run's rows), app.views."""
    return BatchExplorer(model, device, B, k, policy, T, run).widget


def batch_figure(rows, title: str = "tokens/s of the whole batch, by B"):
    """Static twin: tokens/s against B for greedy and each policy in `rows` (batching.sweep's),
    each policy in its colour of every figure (plots.POLICY_COLORS), a tick at each B run."""
    from ..plots import POLICY_COLORS, figure
    fig = figure(title, height=380, xaxis_title="sequences B", yaxis_title="tokens/s", xaxis_type="log",
                 legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    modes = sorted({(r["mode"], r["k"]) for r in rows}, key=lambda m: (m[0] != "greedy", m))
    for mode, k in modes:
        pts = sorted((r for r in rows if (r["mode"], r["k"]) == (mode, k)), key=lambda r: r["B"])
        fig.add_scatter(x=[r["B"] for r in pts], y=[r["tokens_per_s"] for r in pts], mode="lines+markers",
                        name=mode if mode == "greedy" else f"{mode}, k = {k}",
                        line=dict(color=POLICY_COLORS.get(mode, "black")))
    Bs = sorted({r["B"] for r in rows})
    fig.update_xaxes(tickvals=Bs, ticktext=[str(b) for b in Bs])
    fig.update_layout(margin=dict(t=90))          # the legend's row under the title
    return fig


class BatchExplorer:
    def __init__(self, model, device, B, k, policy, T, run):
        import ipywidgets as W
        self.model = model if model is not None and not isinstance(model, str) else \
            cache.get_model(model or "tiny", device)
        st = {"description_width": "70px"}
        c = self.controls = {
            "B": W.Dropdown(options=list(BATCHES), value=B if B in BATCHES else 4, description="B", style=st),
            "k": W.IntSlider(value=k, min=1, max=4, description="k", style=st),
            "T": W.IntSlider(value=T, min=4, max=64, description="T (tokens)", style=st),
            "policy": W.ToggleButtons(options=list(POLICIES), value=spec.Policy.parse(policy).name,
                                      description="policy", style=st,
                                      tooltips=[spec.POLICIES[p].doc for p in POLICIES]),
        }
        self.button = W.Button(description="Run", button_style="primary", icon="play")
        self.button.on_click(lambda _: self.run())
        self.status = W.HTML(layout=W.Layout(width="100%", min_height="3.5em"))
        self.table = W.HTML(layout=W.Layout(width="100%"))
        self.views = {"batch": FigView(note="Press <b>Run</b>: greedy and the chosen policy at this B appear "
                                            "here, beside every earlier run.")}
        self.rows, self.shown, self.head, self.error = [], None, "", None
        for w in c.values():
            w.observe(lambda ch: self._show_status(), names="value")
        self._show_status()
        controls = W.VBox([W.HBox([c["B"], c["k"]]), c["T"], c["policy"], self.button, self.status])
        self.widget = AppBox.build([controls, self.views["batch"].widget, self.table], self, TEXT_FORM)
        if run:
            self.run()

    def _values(self) -> dict:
        return {n: w.value for n, w in self.controls.items()}

    def _show_status(self):
        if self.shown is None:
            self.status.value = "<small>Nothing run yet: pick B, k and a policy, then press <b>Run</b>.</small>"
            return
        changed = self._values() != self.shown
        self.status.value = self.head + ("<br><b>changed — press Run</b> (the figure shows the run above)"
                                         if changed else "")

    def run(self):
        v = self._values()
        self.error = None
        self.status.value = f"<small>running: B = {v['B']}, {esc(v['policy'])}, k = {v['k']}, T = {v['T']} …</small>"
        try:
            new = batching.sweep(self.model, Bs=(v["B"],), policies=(v["policy"],), ks=(v["k"],), T=v["T"])
        except Exception as e:                  # shown, not raised into the page
            self.error = e
            self.status.value = f"<b>error</b>: {esc(type(e).__name__)}: {esc(e)}"
            return
        key = lambda r: (r["B"], r["mode"], r["k"])             # noqa: E731 (the latest run of each point)
        self.rows = [r for r in self.rows if key(r) not in {key(n) for n in new}] + new
        g, s = new
        self.shown = v
        self.head = (f"done: B = {v['B']}, {esc(v['policy'])}, k = {v['k']}, T = {v['T']}: "
                     f"greedy {g['tokens_per_s']:.0f} tokens/s, {esc(v['policy'])} {s['tokens_per_s']:.0f} "
                     f"tokens/s, {s['speedup']:.2f}x; every stream bit-exact: {g['bit_exact'] and s['bit_exact']}"
                     f"<br><small>{esc(stamp(device=self.model, quiet=True))}</small>")
        fig = batch_figure(self.rows)
        stamp(fig, device=self.model, quiet=True)
        self.views["batch"].update(fig)
        self.table.value = html_table(
            [[r["B"], r["mode"], r["k"] or "", f"{r['tokens_per_s']:.0f}", f"{r['ms_per_token']:.2f}",
              f"{r['speedup']:.2f}x", r["bit_exact"]] for r in sorted(self.rows, key=key)],
            ["B", "mode", "k", "tokens/s", "ms/token (a sequence)", "vs greedy at B", "bit-exact"])
        self._show_status()
