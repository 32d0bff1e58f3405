"""The plain figures over runs: n_ok histograms, ms per token by phase, speedups, rounds.
Each returns a plotly figure (plotly is imported when one is drawn)."""
from __future__ import annotations

from kestrel import speculative as spec
from kestrel.errors import KestrelError
from ..plots import PHASE_COLORS, POLICY_COLORS, ms_label, figure
from kestrel.inputs import is_int
from .runs import as_runs, hist_item, run_label

TAIL_DOC = "tail: plain M=1 steps after the last round (strict batch, fewer than k left)"


def layout_fig(title, height, margin=None, **layout):
    fig = figure(title, height=height, **layout)
    legend = layout.get("legend") or {}
    if title and legend.get("orientation") == "h" and (legend.get("y") or 0) >= 1:
        # a legend row above the plot: the title goes above the legend, not under it
        fig.update_layout(title=dict(yref="container", y=0.985, yanchor="top"),
                          margin=dict(t=max(fig.layout.margin.t or 0, 100)))
    if margin:
        fig.update_layout(margin=margin)
    return fig


def compact(x, nd=4):
    """Round for compact figure JSON (frames repeat every number)."""
    return None if x is None else float(f"{x:.{nd}g}")


def hist_figure(runs, *, k: int | None = None, names=None, normalize: bool = False, requested=None,
                title: str | None = None, height: int = 360):
    """n_ok histogram(s) as grouped bars. `runs`: one item or a list of: SpecResult, RunSummary,
    a histogram dict {n_ok: count}, a string '0:24 1:6 2:11 3:4', or a list of n_ok values.
    normalize=True plots each as fractions of its rounds (compare runs of different lengths,
    or a measured histogram with the article's). requested: the n_ok the replay drafter was
    asked for (an item as above), drawn as open markers."""
    if isinstance(runs, (str, dict, spec.SpecResult, spec.RunSummary)):
        items = [runs]
    else:
        runs = list(runs)
        items = [runs] if runs and all(is_int(n) for n in runs) else runs
    hs = [hist_item(x) for x in items]
    names = list(names) if names is not None else [h[2] or f"run {i + 1}" for i, h in enumerate(hs)]
    kmax = max([k or 0] + [hk or 0 for _, hk, _ in hs] + [max(h, default=0) for h, _, _ in hs])
    xs = list(range(kmax + 1))
    fig = layout_fig(title, height, xaxis=dict(title="n_ok (drafts accepted in the round)", dtick=1),
                     yaxis=dict(title="fraction of rounds" if normalize else "rounds"), barmode="group",
                     legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))

    def values(h):
        tot = sum(h.values()) or 1
        return [(h.get(n, 0) / tot if normalize else h.get(n, 0)) for n in xs]
    for (h, _, _), name in zip(hs, names):
        ys = values(h)
        fig.add_bar(x=xs, y=ys, name=name, text=[f"{v:.2f}" if normalize else f"{v:g}" for v in ys],
                    textposition="outside", cliponaxis=False)
    if requested is not None:
        rh = hist_item(requested)[0]
        fig.add_scatter(x=xs, y=values(rh), mode="markers", name="requested (replay schedule)",
                        marker=dict(symbol="line-ew-open", size=28, color="#333", line=dict(width=3, color="#333")))
    return fig


def two_lines(label: str, longest: int = 16) -> str:
    """A tick label longer than `longest` characters, broken at the space nearest its middle."""
    spaces = [i for i, ch in enumerate(label) if ch == " "]
    if len(label) <= longest or not spaces:
        return label
    cut = min(spaces, key=lambda i: abs(i - len(label) / 2))
    return label[:cut] + "<br>" + label[cut + 1:]


def phase_figure(runs, *, names=None, title: str | None = None, height: int = 420, totals: bool = True,
                 legend_above: bool = False):
    """Stacked bars of ms per emitted token by phase (spec.PHASES, plus the strict tail), one
    bar per run, with each run's greedy ms/token (timed in the same run, or predicted) as a
    reference mark, and each run's ms/token over its bar. `runs`: SpecResults, RunSummaries
    (SpecResult.summary(), spec.aggregate(), results rows) or spec.Predictions. legend_above:
    the phases in a row above the plot (read in the same order as round_figure's), not beside
    it, where a narrow figure needs its width."""
    rs = as_runs(runs, names)
    labels = [v.label for v in rs]
    legend = dict(orientation="h", yanchor="bottom", y=1.0, x=0) if legend_above else {}
    fig = layout_fig(title, height, barmode="stack", yaxis=dict(title="ms per token", rangemode="tozero"),
                     legend=dict(traceorder="normal", **legend), hovermode="x")
    phases = list(spec.PHASES) + (["tail"] if any("tail" in v.phase for v in rs) else [])
    for ph in phases:
        ys = [v.phase.get(ph, 0.0) for v in rs]
        doc = spec.PHASE_DOC.get(ph, TAIL_DOC)
        fig.add_bar(x=labels, y=ys, name=ph, marker_color=PHASE_COLORS[ph], hovertext=[doc] * len(ys),
                    hovertemplate="%{y:.4g} ms/token<br>%{hovertext}<extra>" + ph + "</extra>")
    tot = [float(v.run.ms_per_token) for v in rs]
    g = [v.run.greedy_ms_per_token for v in rs]
    # room above the higher of bar and greedy mark for the total's label
    top = max([t for t in tot] + [x for x in g if x is not None] + [0.0])
    if top > 0:
        fig.update_yaxes(range=[0, top * 1.22])
    if totals:   # the run's own total: over repeats, the median of the totals (not the sum of the phase medians)
        # written above the greedy mark where that is higher, so the mark never crosses the label
        ys = [max(t, x or 0.0) for t, x in zip(tot, g)]
        fig.add_scatter(x=labels, y=ys, mode="text", text=[ms_label(t) for t in tot], textposition="top center",
                        showlegend=False, hoverinfo="skip", name="total", cliponaxis=False,
                        customdata=tot)
    # long names on two level lines: rotated, they ran into the provenance line under the axis
    fig.update_xaxes(tickangle=0, tickmode="array", tickvals=labels, ticktext=[two_lines(s) for s in labels])
    if any(x is not None for x in g):
        fig.add_scatter(x=labels, y=g, mode="markers", name="greedy ms/token",
                        marker=dict(symbol="line-ew-open", size=56, color="black", line=dict(width=3, color="black")),
                        hovertemplate="greedy %{y:.4g} ms/token<extra></extra>")
    return fig


def _predicted_speedup(u, v) -> float | None:
    """The cost model's speedup for a run: its own rounds (a SpecResult) or its histogram."""
    try:
        if v.result is not None:
            return spec.predict_result(u, v.result).speedup
        if not v.predicted:
            return spec.predict(u, v.run.policy, v.run.pairing, v.run.k, hist=v.run.hist).speedup
    except KestrelError:
        return None
    return None


def speedup_figure(runs, *, names=None, predicted=None, groups=None, title: str | None = None,
                   height: int = 400):
    """Measured speedup (greedy ms/token / spec ms/token, both timed in the same run) per run,
    with 1x (greedy) as the reference line and the cost model's prediction beside each bar.
    predicted: None (a RunSummary's own predicted_speedup where present), a UnitCosts (priced
    for each SpecResult's own rounds with spec.predict_result, or for a summary's histogram with
    spec.predict), or a list of numbers / Predictions, one per run. groups: a group name per run
    (for example the acceptance schedule): the x axis then has two levels, the group written once
    under its runs, so that many bars keep readable labels."""
    rs = as_runs(runs, names)
    labels = [v.label for v in rs]
    if groups is not None:
        groups = list(groups)
        names = list(names) if names is not None else [run_label(v.run) for v in rs]
        if len(groups) != len(rs):
            raise KestrelError(f"{len(groups)} groups for {len(rs)} runs")
        if len(set(zip(groups, names))) != len(rs):
            raise KestrelError("speedup_figure: two runs share a group and a name")
        labels = [groups, names]                # plotly's multi-category axis
    if isinstance(predicted, spec.UnitCosts):
        pred = [_predicted_speedup(predicted, v) for v in rs]
    elif predicted is not None:
        predicted = list(predicted)
        if len(predicted) != len(rs):
            raise KestrelError(f"{len(predicted)} predictions for {len(rs)} runs")
        pred = [p.speedup if isinstance(p, spec.Prediction) else p for p in predicted]
    else:
        pred = [None if v.predicted else v.run.predicted_speedup for v in rs]
    sp = [v.run.speedup for v in rs]
    top = max([x for x in sp + pred if x is not None] + [1.0])
    fig = layout_fig(title, height, yaxis=dict(title="speedup vs greedy (×)", rangemode="tozero",
                                               range=[0, top * 1.18]),
                     legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    colors = [POLICY_COLORS.get(v.run.policy.name, "#888") for v in rs]
    fig.add_bar(x=labels, y=sp, name="measured", marker_color=colors, showlegend=False,
                hovertemplate="%{x}: measured %{y:.3f}×<extra></extra>")
    if any(p is not None for p in pred):
        # a short black line across the bar: it marks the prediction without hiding a label
        fig.add_scatter(x=labels, y=pred, mode="markers", name="predicted (cost model)",
                        marker=dict(symbol="line-ew-open", size=30, color="black",
                                    line=dict(width=3, color="black")),
                        hovertemplate="%{x}: predicted %{y:.3f}×<extra></extra>")
    # value labels above the higher of bar and prediction, so neither covers them
    tops = [max(x or 0, p or 0) for x, p in zip(sp, pred)]
    fig.add_scatter(x=labels, y=tops, mode="text", showlegend=False, hoverinfo="skip", cliponaxis=False,
                    text=[("n/a" if x is None else f"{x:.2f}×") for x in sp], textposition="top center",
                    name="measured value")
    if groups is not None:
        # room for the names written upwards under each bar and the group row below them; the
        # margin is fixed so that a provenance strip added later lands under both
        longest = max(len(str(n)) for n in labels[1])
        fig.update_layout(margin=dict(b=40 + 7 * longest + 30))
        fig.update_xaxes(tickangle=-90, automargin=False)
    for pol in dict.fromkeys(v.run.policy.name for v in rs):      # the colour key, one entry a policy
        fig.add_bar(x=[None], y=[None], name=f"policy {pol}", marker_color=POLICY_COLORS.get(pol, "#888"),
                    hoverinfo="skip")
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="greedy (1×)",
                  annotation_position="top left")
    return fig


def round_figure(result, *, greedy_ms_per_token: float | None = None, title: str | None = None,
                 height: int = 360):
    """ms per phase, round by round (stacked), against what greedy decoding spends on the same
    tokens (max(n_ok, 1) x greedy ms/token). `result`: a SpecResult or a list of RoundRecords."""
    rounds = result.rounds if isinstance(result, spec.SpecResult) else list(result)
    if greedy_ms_per_token is None and isinstance(result, spec.SpecResult) and result.greedy_ms is not None:
        greedy_ms_per_token = result.greedy_ms / result.T
    xs = [r.i for r in rounds]
    fig = layout_fig(title, height, barmode="stack", bargap=0.1, xaxis=dict(title="round"),
                     yaxis=dict(title="ms", rangemode="tozero"), hovermode="x",
                     legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0, traceorder="normal"))
    for ph in spec.PHASES:
        fig.add_bar(x=xs, y=[compact(r.ms.get(ph, 0.0)) for r in rounds], name=ph, marker_color=PHASE_COLORS[ph])
    if greedy_ms_per_token is not None:
        fig.add_scatter(x=xs, y=[compact(max(r.n_ok, 1) * greedy_ms_per_token) for r in rounds],
                        mode="lines+markers", name="greedy, same tokens", line=dict(color="black", shape="hvh", width=1.5),
                        marker=dict(size=4), customdata=[r.n_ok for r in rounds],
                        hovertemplate="n_ok=%{customdata}: greedy %{y:.3g} ms<extra></extra>")
    return fig


__all__ = ["hist_figure", "phase_figure", "speedup_figure", "round_figure", "PHASE_COLORS", "POLICY_COLORS"]
