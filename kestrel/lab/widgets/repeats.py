"""Repeated runs: a small-model timing is one sample of a noisy quantity, so the book shows each
one as the median and the range (min..max) of several repeats, never a single run.

    rep = widgets.repeat_runs(model, prompts, repeats=5, k=3, policy="checkpoint", drafter="mtp",
                              units=u)
    rep.speedup.fmt(".3f", "×")     # '0.517× (0.49..0.53, 5 runs)'
    rep.error                       # the cost model's miss per repeat: measured / predicted - 1
    widgets.spread_figure([rep1, rep2], names=[...])

Each repeat runs every prompt once (greedy timed in the same call, as run_spec does) and is
summarised with spec.aggregate; the engines are made once and reused (on a GPU the captured
plans are keyed on an engine's buffers), after one untimed warm-up run.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kestrel import speculative as spec
from ..plots import Spread
import kestrel
from .figures import POLICY_COLORS, layout_fig


@dataclass
class Repeated:
    """`repeats` repetitions of the same runs (every prompt once each)."""
    summaries: list                       # one spec.RunSummary per repeat (over all prompts)
    results: list                         # per repeat, the list of spec.SpecResult (one per prompt)
    predicted: list = field(default_factory=list)   # per repeat, the cost model's speedup (run's own rounds)

    @property
    def n(self) -> int:
        return len(self.summaries)

    @property
    def ms(self) -> Spread:
        """ms per emitted token, speculative."""
        return Spread([s.ms_per_token for s in self.summaries])

    @property
    def greedy(self) -> Spread:
        """ms per token of greedy decoding, timed in the same calls."""
        return Spread([s.greedy_ms_per_token for s in self.summaries])

    @property
    def speedup(self) -> Spread:
        return Spread([s.speedup for s in self.summaries])

    @property
    def predicted_speedup(self) -> Spread | None:
        return Spread(self.predicted) if self.predicted else None

    @property
    def error(self) -> Spread | None:
        """How far the cost model missed: measured speedup / predicted speedup - 1, per repeat."""
        if not self.predicted:
            return None
        return Spread([s.speedup / p - 1.0 for s, p in zip(self.summaries, self.predicted)])

    @property
    def all(self):
        """Every run of every repeat as one spec.RunSummary (histogram, phases: means over all)."""
        return spec.aggregate([r for rs in self.results for r in rs])

    def median_run(self):
        """The repeat whose speedup is the median one (its RunSummary)."""
        order = sorted(range(self.n), key=lambda i: self.summaries[i].speedup)
        return self.summaries[order[(self.n - 1) // 2]]


def repeat_runs(model, prompts, *, repeats: int = 5, T: int = 64, k: int = 3, policy="checkpoint",
                drafter="mtp", units=None, warmup: bool = True, **run_kw) -> Repeated:
    """Run spec.run_spec over every prompt, `repeats` times; with `units` (spec.UnitCosts) price
    each repeat's own rounds with the cost model (spec.compare). Other keywords go to run_spec."""
    if repeats < 1:
        raise spec.SpecArgumentError(f"repeats must be >= 1, got {repeats}")
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise spec.SpecArgumentError("repeat_runs needs at least one prompt")
    args = [spec.validate_run(model, p, T, k, policy, drafter, schedule=run_kw.get("schedule"),
                              tail=run_kw.get("tail"), mistakes=run_kw.get("mistakes")) for p in prompts]
    pol = args[0].policy
    need = max(a.need for a in args)
    cap = min(max(len(p) for p in prompts) + T + 2, model.cfg.max_position_embeddings)
    eng = kestrel.Engine(model, max_seq=need, mmax=k, batch=pol.batch)
    geng = kestrel.Engine(model, max_seq=cap, mmax=1, batch="flex")
    kw = dict(T=T, k=k, policy=pol, drafter=drafter, engine=eng, greedy_engine=geng, **run_kw)
    if warmup:                              # compile and capture what these runs use, untimed
        spec.run_spec(model, prompts[0], **{**kw, "T": min(T, 16)})
    out = Repeated([], [])
    for _ in range(repeats):
        res = [spec.run_spec(model, p, **kw) for p in prompts]
        out.results.append(res)
        out.summaries.append(spec.aggregate(res))
        if units is not None:
            out.predicted.append(spec.compare(units, res)["predicted_speedup"])
    return out


def spread_figure(reps, *, names, title: str | None = None, height: int = 420, predicted: bool = True):
    """Median speedup of each Repeated as a bar, its range (min..max) as an error bar, the cost
    model's median prediction as a black line across the bar, and greedy (1×) as a reference."""
    reps = list(reps)
    names = list(names)
    if len(names) != len(reps):
        raise spec.SpecArgumentError(f"{len(names)} names for {len(reps)} repeated runs")
    med = [r.speedup.median for r in reps]
    lo = [r.speedup.median - r.speedup.lo for r in reps]
    hi = [r.speedup.hi - r.speedup.median for r in reps]
    pred = [r.predicted_speedup.median if (predicted and r.predicted) else None for r in reps]
    top = max([r.speedup.hi for r in reps] + [p for p in pred if p is not None] + [1.0])
    fig = layout_fig(title, height, yaxis=dict(title="speedup vs greedy (×)", range=[0, top * 1.2]),
                     legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    colors = [POLICY_COLORS.get(r.summaries[0].policy.name, "#888") for r in reps]
    fig.add_bar(x=names, y=med, marker_color=colors, name="measured: median, range of repeats",
                error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo, color="#333",
                             thickness=1.5, width=8),
                customdata=[[r.speedup.lo, r.speedup.hi, r.n] for r in reps],
                hovertemplate="%{x}: %{y:.3f}× (%{customdata[0]:.3f}..%{customdata[1]:.3f}, "
                              "%{customdata[2]} runs)<extra></extra>")
    if any(p is not None for p in pred):
        fig.add_scatter(x=names, y=pred, mode="markers", name="cost model (median)",
                        marker=dict(symbol="line-ew-open", size=34, color="black",
                                    line=dict(width=3, color="black")),
                        hovertemplate="%{x}: predicted %{y:.3f}×<extra></extra>")
    tops = [max(r.speedup.hi, p or 0) for r, p in zip(reps, pred)]
    fig.add_scatter(x=names, y=tops, mode="text", text=[f"{m:.2f}×" for m in med], textposition="top center",
                    showlegend=False, hoverinfo="skip", cliponaxis=False)
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="greedy (1×)",
                  annotation_position="top left")
    return fig


__all__ = ["Repeated", "repeat_runs", "spread_figure"]
