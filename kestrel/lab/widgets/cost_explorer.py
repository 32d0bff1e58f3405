"""cost_explorer: the cost model, live (ipywidgets; imported when built)."""
from __future__ import annotations

from kestrel import speculative as spec
from . import cache
from .cost_figures import cost_surface_figure
from .figures import phase_figure
from .runs import as_units, pad_profile
from .view import AppBox, FigView, esc, html_table, side_by_side
from kestrel.model import Model
from ..results import load_bench

# What the widget shows where it cannot be drawn (ipywidgets cuts a text form at 110 characters).
TEXT_FORM = "cost_explorer: a live widget; run this cell in a live kernel to move its sliders."


def cost_explorer(unit_costs=None, measured=None, *, profile=None, k: int = 3, policy="replay",
                  pairing=None, device: str = "auto"):
    """Explore the cost model live (ipywidgets VBox): sliders for the per-depth acceptance
    profile alpha_1..alpha_4 (default: the article's E16; or `profile`, e.g. a spec.Acceptance
    from spec.teacher_forced), k, pairing, policy, and the main unit costs (M=1 step, MTP draft
    step, mark and rollback copies; editing step/draft rescales the batch tables, see
    spec.edit_units). Shows the predicted speedup (spec.predict) over (k, flat alpha) with the
    profile and the measured runs on it, the predicted ms/token by phase for the three
    policies, and a table. pairing: 'article' or 'trained' (default: the profile's own, for a
    spec.Acceptance, else 'article').

    unit_costs: a spec.UnitCosts, its dict, a kestrel Model (measured now), a results name or
    JSON path (kestrel.lab.results.load_bench: its units, its runs as `measured` unless given, and
    for the end-to-end section its teacher-forced alpha as the profile unless given), or None:
    measured now on the tiny model. measured: SpecResults, RunSummaries or results rows to overlay.
    The returned box has `.app`: app.update(), app.controls, app.units(), app.views.
    """
    return CostExplorer(unit_costs, measured, profile, k, policy, pairing, device).widget


class CostExplorer:
    def __init__(self, unit_costs, measured, profile, k, policy, pairing, device):
        import ipywidgets as W
        source = ""
        pairing = None if pairing is None else spec.Pairing.parse(pairing)
        if unit_costs is None:
            m = cache.get_model("tiny", device)
            unit_costs = spec.measure_unit_costs(m, k_max=4, reps=3)
            source = f"measured now on {m.cfg.name} ({getattr(m.be, 'device_name', m.be.name)})"
        elif isinstance(unit_costs, Model):
            source = f"measured now on {unit_costs.cfg.name}"
            unit_costs = spec.measure_unit_costs(unit_costs, k_max=4, reps=3)
        elif isinstance(unit_costs, str) or hasattr(unit_costs, "__fspath__"):
            b = load_bench(unit_costs)
            source = f"{b.path} [{b.name}]: {b.model}, {b.provenance.line()}"
            unit_costs, measured = b.units, (b.runs if measured is None else measured)
            own = b.acceptance.get(pairing or spec.Pairing.ARTICLE)
            if profile is None and own:
                profile = own                           # the model's own teacher-forced alpha
        self.base = as_units(unit_costs)
        meta = self.base.meta or {}
        source = source or f"{meta.get('model', '?')} on {meta.get('device', '?')}"
        self.measured = measured
        self.ks = self.base.covered_ks()
        prof = pad_profile(profile)
        pairing = pairing or getattr(profile, "pairing", None) or spec.Pairing.ARTICLE
        st = {"description_width": "90px"}
        sl = dict(min=0.0, max=1.0, step=0.01, continuous_update=False, style=st, readout_format=".2f")
        c = self.controls = {f"a{j + 1}": W.FloatSlider(value=prof[j], description=f"α{j + 1}", **sl) for j in range(4)}
        c["k"] = W.IntSlider(value=k if k in self.ks else self.ks[-1], min=self.ks[0], max=self.ks[-1],
                             description="k", style=st, continuous_update=False)
        c["pairing"] = W.ToggleButtons(options=list(spec.PAIRINGS), value=pairing.value, description="pairing",
                                       style=st, tooltips=[spec.PAIRING_DOC[p] for p in spec.Pairing])
        priced = [p for p in spec.POLICIES.values() if p.priced_by(self.base)]
        c["policy"] = W.ToggleButtons(options=[p.name for p in priced], value=spec.Policy.parse(policy).name,
                                      description="policy", style=st, tooltips=[p.doc for p in priced])
        ft = dict(style=st, layout=W.Layout(width="210px"))
        b = self.base
        c["step"] = W.BoundedFloatText(value=round(b.step, 6), min=1e-6, max=1e6, description="step ms", **ft)
        c["draft"] = W.BoundedFloatText(value=round(b.draft, 6), min=0.0, max=1e6, description="draft ms", **ft)
        c["mark"] = W.BoundedFloatText(value=round(b.mark, 6), min=0.0, max=1e6, description="mark ms", **ft)
        c["rollback"] = W.BoundedFloatText(value=round(b.rollback, 6), min=0.0, max=1e6, description="rollback ms",
                                           **ft)
        self.reset = W.Button(description="reset costs", tooltip="back to the loaded unit costs")
        self.reset.on_click(lambda _: self._reset())
        for w in c.values():
            w.observe(lambda ch: self.update(), names="value")
        self.note = W.HTML(f"<small>unit costs: {esc(source)}. The surface's α is flat (the same at every depth); "
                           "the profile and measured runs sit at their equivalent α (same expected n_ok).</small>")
        self.table = W.HTML()
        self.views = {"surface": FigView(self._surface()), "phase": FigView(self._phases())}
        self._busy = False
        controls = W.VBox([W.HBox([W.VBox([c["a1"], c["a2"], c["a3"], c["a4"]]),
                                   W.VBox([c["k"], c["step"], c["draft"], c["mark"], c["rollback"], self.reset])]),
                           c["pairing"], c["policy"], self.note])
        self.widget = AppBox.build([controls, side_by_side(self.views["surface"], self.views["phase"], (55, 45)),
                                    self.table], self, TEXT_FORM)
        self.update()

    def units(self):
        c = self.controls
        return spec.edit_units(self.base, step=c["step"].value, draft=c["draft"].value, mark=c["mark"].value,
                               rollback=c["rollback"].value)

    def profile(self) -> tuple:
        return tuple(self.controls[f"a{j + 1}"].value for j in range(4))

    def _reset(self):
        self._busy = True
        try:
            for name in ("step", "draft", "mark", "rollback"):
                self.controls[name].value = round(getattr(self.base, name), 6)
        finally:
            self._busy = False
        self.update()

    def _surface(self):
        c = self.controls
        # two short title lines: one long line was cut at the figure's edge in a narrow column
        return cost_surface_figure(self.units(), c["policy"].value, c["pairing"].value, self.measured,
                                   ks=self.ks, profile=self.profile(), k=c["k"].value, height=460,
                                   title=f"Predicted speedup<br><sup>policy {c['policy'].value}, "
                                         f"pairing {c['pairing'].value}</sup>")

    def _predictions(self):
        c = self.controls
        u, k, pr = self.units(), c["k"].value, c["pairing"].value
        return [spec.predict(u, pol, pr, k, profile=self.profile()) for pol in self._priced()]

    def _priced(self):
        """The policies whose every cost these unit costs measured (older results lack some)."""
        u = self.units()
        return [p for p in spec.POLICIES.values() if p.priced_by(u)]

    def _phases(self):
        c = self.controls
        # names broken at their hyphen: side by side they stay level instead of turning upright
        fig = phase_figure(self._predictions(), names=[p.name.replace("-", "-<br>") for p in self._priced()],
                           height=460, legend_above=True,
                           title=f"Predicted ms/token by phase<br><sup>k = {c['k'].value}, "
                                 f"pairing {c['pairing'].value}</sup>")
        fig.update_xaxes(tickangle=0)
        return fig

    def update(self):
        if self._busy:
            return
        c = self.controls
        self.views["surface"].update(self._surface())
        self.views["phase"].update(self._phases())
        k, pr = c["k"].value, c["pairing"].value
        dist = spec.nok_distribution(self.profile(), k, pr)
        rows = []
        for p in self._predictions():
            name = p.policy.name
            rows.append([f"<b>{name}</b>" if name == c["policy"].value else name,
                         f"{p.advance_per_round:.3f}", f"{p.round_ms:.4g}", f"{p.ms_per_token:.4g}",
                         f"{p.greedy_ms_per_token:.4g}", f"<b>{p.speedup:.3f}×</b>"])
        self.table.value = (html_table(rows, ["policy", "tokens/round", "ms/round", "ms/token", "greedy ms/token",
                                              "speedup"])
                            + "<small>P(n_ok = 0.." + str(k) + "): " + ", ".join(f"{x:.3f}" for x in dist)
                            + "</small>")
