"""kestrel.widgets: live views over kestrel.spec (ipywidgets + plotly) and the plain figures under them.

Everything a widget shows is also a plain function returning a plotly figure, so the static
book shows the same views without a kernel (display them with ``kestrel.plots.show``; the two
figures with frames, ``replay_frames_figure`` and ``cost_explorer_static``, with
``kestrel.plots.show_animated``)::

    from kestrel import widgets
    w = widgets.spec_replay()                 # live: choose shape, k, T, start, drafter, policy; Run
    w.app.run()                               # the same, from code (w.app.result: the SpecResult)
    c = widgets.cost_explorer(u)              # live: alpha_1..4, k, unit costs, policy -> predicted speedup

    widgets.hist_figure([r1, r2])             # n_ok histograms (SpecResults, summaries, bench rows, dicts)
    widgets.phase_figure([r1, r2, r3])        # stacked ms/token per phase, greedy (same run) as reference
    widgets.speedup_figure(runs, predicted=u) # measured speedup, predicted beside it
    widgets.round_figure(r)                   # ms per phase, round by round, vs greedy for the same tokens
    widgets.cost_surface_figure(u, "replay", "seed", measured=runs)   # predicted speedup over (k, alpha)
    widgets.replay_frames_figure(r)           # static twin of spec_replay: slider/play over the rounds
    widgets.cost_explorer_static(u)           # static twin of cost_explorer: slider over alpha

Nothing here imports ipywidgets or plotly at import time (``import kestrel`` never does either):
the figure functions import plotly, the two widgets ipywidgets, when called. The widgets use a
plotly ``FigureWidget`` when it can be built (plotly >= 6 needs ``anywidget``); otherwise each
figure is redrawn into an ``ipywidgets.Output`` through ``kestrel.plots.show``.

The acceptance axis of the cost views is a *flat* per-depth acceptance alpha (alpha_j = alpha at
every depth, applied from d_1 for pairing 'seed' and from d_2 for 'mtp', where d_1 is free). A
measured run or a per-depth profile is placed on it at its *equivalent* alpha: the flat alpha
with the same expected n_ok at that k (``equivalent_alpha``).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from . import spec
from .errors import KestrelError

__all__ = [
    # plain figures (static book and widgets)
    "hist_figure", "phase_figure", "speedup_figure", "round_figure", "cost_surface_figure",
    "replay_frames_figure", "cost_explorer_static",
    # widgets
    "spec_replay", "cost_explorer",
    # helpers
    "load_bench", "edit_units", "equivalent_alpha", "get_model", "model_choices", "clear_cache",
    "PHASE_COLORS", "POLICY_COLORS",
]

PHASE_COLORS = {"draft": "#9467bd", "mark": "#d62728", "verify": "#1f77b4", "rollback": "#ff7f0e",
                "replay": "#e377c2", "sync": "#8c564b", "book": "#7f7f7f", "tail": "#bcbd22"}
POLICY_COLORS = {"replay": "#d62728", "flex-replay": "#ff7f0e", "checkpoint": "#2ca02c"}
PAIRING_DASH = {"seed": "solid", "mtp": "dash"}
TAIL_DOC = "tail: plain M=1 steps after the last round (strict batch, fewer than k left)"
REAL_PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b")   # random weights, GPU only
SMALL_MODELS = ("tiny", "test-a", "test-b")
KS = (1, 2, 3, 4)


# =============================================================================== normalising inputs

def _int_keys(h: dict) -> dict:
    return {int(n): c for n, c in h.items()}


def _is_hist_dict(x) -> bool:
    if not isinstance(x, dict) or not x:
        return False
    try:
        return all(int(n) >= 0 for n in x) and all(isinstance(v, (int, float)) for v in x.values())
    except (TypeError, ValueError):
        return False


def _pairing_of(d: dict) -> str:
    if d.get("pairing") in spec.PAIRINGS:
        return d["pairing"]
    drafter = str(d.get("drafter") or "")
    if drafter.startswith("mtp-seed"):
        return "seed"
    if drafter.startswith("mtp"):
        return "mtp"
    sched = f"{d.get('schedule') or ''} {drafter}"
    return "mtp" if "pairing mtp" in sched or "pairing=mtp" in sched else "seed"


def _drafter_short(d: str) -> str:
    d = str(d or "?")
    return "replay" if d.startswith("replay") else d


def _label(d: dict) -> str:
    what = _drafter_short(d.get("drafter"))
    if what == "replay" and d.get("schedule"):          # bench rows: which histogram/profile it replayed
        what = f"{d['schedule'].split(',')[0]}/{d['pairing']}"
    base = f"{d['policy']} · {what} · k={d['k']}"
    return base + (" (predicted)" if d.get("kind") == "predicted" else "")


def _mean_from_hist(h: dict | None) -> float | None:
    if not h:
        return None
    n = sum(h.values())
    return sum(k * c for k, c in h.items()) / n if n else None


def _run(x, name: str | None = None) -> dict:
    """One run, whatever it came as, in one shape:
    {label, kind, policy, drafter, pairing, k, hist, phase (ms/token per phase + 'tail'),
     ms_per_token, greedy_ms_per_token, speedup, predicted_speedup, mean_nok, device, result}."""
    from .spec.driver import SpecResult
    result = None
    if isinstance(x, SpecResult):
        result, x = x, x.summary()
    if not isinstance(x, dict):
        raise KestrelError(f"expected a SpecResult, a summary, a bench row or a prediction, got {type(x).__name__}")
    d = {"policy": x.get("policy", "?"), "drafter": x.get("drafter"), "k": x.get("k"), "result": result,
         "device": x.get("device"), "predicted_speedup": x.get("predicted_speedup"), "schedule": x.get("schedule")}
    d["pairing"] = _pairing_of(x)
    phases = {}
    if "phase_ms_per_round" in x or ("phase_ms" in x and "total_ms" in x and "spec_ms" not in x):
        # a prediction: spec.predict (histogram/profile, or a sequence) or spec.predict_result
        d["kind"] = "predicted"
        d["drafter"] = d["drafter"] or f"pairing {d['pairing']}"
        if "phase_ms_per_round" in x:
            adv = x["advance_per_round"]
            phases = {ph: v / adv for ph, v in x["phase_ms_per_round"].items()}
        else:
            tokens = x.get("tokens") or (x["total_ms"] / x["ms_per_token"])
            phases = {ph: v / tokens for ph, v in x["phase_ms"].items()}
            if x.get("tail_ms"):
                phases["tail"] = x["tail_ms"] / tokens
        d["ms_per_token"], d["greedy_ms_per_token"] = x["ms_per_token"], x.get("greedy_ms_per_token")
        d["speedup"] = x.get("speedup")
        d["hist"] = None
    elif "phase_ms_per_token" in x:                       # a row of results/bench_spec.json
        d["kind"] = "measured"
        phases = dict(x["phase_ms_per_token"])
        tail = (x.get("ms_per_token") or 0.0) - sum(phases.values())
        if tail > 1e-9 * max(1.0, x.get("ms_per_token") or 0.0) and x.get("tail_tokens"):
            phases["tail"] = tail
        d["ms_per_token"], d["greedy_ms_per_token"] = x.get("ms_per_token"), x.get("greedy_ms_per_token")
        d["speedup"] = x.get("speedup")
        d["hist"] = _int_keys(x["hist"]) if x.get("hist") else None
    elif "phase_ms" in x and "spec_ms" in x:              # SpecResult.summary() / spec.aggregate()
        d["kind"] = "measured"
        T = x["T"]
        phases = {ph: v / T for ph, v in x["phase_ms"].items()}
        tail = x["spec_ms"] - sum(x["phase_ms"].values())
        if x.get("tail_tokens") and tail > 0:
            phases["tail"] = tail / T
        d["ms_per_token"], d["greedy_ms_per_token"] = x.get("ms_per_token"), x.get("greedy_ms_per_token")
        d["speedup"] = x.get("speedup")
        d["hist"] = _int_keys(x["hist"]) if x.get("hist") else None
    else:
        raise KestrelError("a run needs phase_ms + spec_ms (a summary), phase_ms_per_token (a bench row) "
                           f"or phase_ms_per_round (a prediction); got keys {sorted(x)[:12]}")
    d["phase"] = {ph: float(phases.get(ph, 0.0)) for ph in spec.PHASES}
    if phases.get("tail"):
        d["phase"]["tail"] = float(phases["tail"])
    d["mean_nok"] = x.get("mean_per_round") if d["kind"] == "measured" and "mean_per_round" in x \
        else _mean_from_hist(d["hist"])
    d["label"] = name or _label(d)
    return d


def _runs(runs, names=None) -> list:
    from .spec.driver import SpecResult
    if isinstance(runs, (dict, SpecResult)):
        runs = [runs]
    runs = list(runs)
    names = list(names) if names is not None else [None] * len(runs)
    if len(names) != len(runs):
        raise KestrelError(f"{len(names)} names for {len(runs)} runs")
    out = [_run(r, n) for r, n in zip(runs, names)]
    seen = {}
    for d in out:                       # plotly merges equal categories: keep labels distinct
        c = seen.get(d["label"], 0)
        seen[d["label"]] = c + 1
        if c:
            d["label"] = f"{d['label']} #{c + 1}"
    return out


def _hist_item(x) -> tuple:
    """(hist {n: count}, k or None, default name) from anything carrying an n_ok histogram."""
    from .spec.driver import SpecResult
    if isinstance(x, SpecResult):
        return spec.histogram(x.noks, x.k), x.k, f"{x.policy} · {_drafter_short(x.drafter)} · k={x.k}"
    if isinstance(x, str):
        return spec.parse_hist(x), None, x
    if _is_hist_dict(x):
        return _int_keys(x), None, None
    if isinstance(x, dict) and x.get("hist"):
        name = f"{x.get('policy', '?')} · {_drafter_short(x.get('drafter'))} · k={x.get('k')}" if "policy" in x else None
        return _int_keys(x["hist"]), x.get("k"), name
    try:
        noks = [int(n) for n in x]
    except TypeError:
        raise KestrelError(f"no n_ok histogram in a {type(x).__name__}") from None
    return spec.histogram(noks), None, None


def _layout_fig(title, height, margin=None, **layout):
    from .plots import figure
    fig = figure(title, height=height, **layout)
    if margin:
        fig.update_layout(margin=margin)
    return fig


def _r(x, nd=4):
    """Round for compact figure JSON (frames repeat every number)."""
    return None if x is None else float(f"{x:.{nd}g}")


# =============================================================================== plain figures

def hist_figure(runs, *, k: int | None = None, names=None, normalize: bool = False, requested=None,
                title: str | None = None, height: int = 360):
    """n_ok histogram(s) as grouped bars. `runs`: one item or a list of: SpecResult, summary /
    bench row (its 'hist'), a histogram dict {n_ok: count}, a string '0:24 1:6 2:11 3:4', or a
    list of n_ok values. normalize=True plots each as fractions of its rounds (compare runs of
    different lengths, or a measured histogram with the seed's). requested: the n_ok the replay
    drafter was asked for (an item as above), drawn as open markers."""
    from .spec.driver import SpecResult
    if isinstance(runs, (str, SpecResult)) or _is_hist_dict(runs) or (isinstance(runs, dict) and "hist" in runs):
        items = [runs]
    else:
        runs = list(runs)
        items = [runs] if runs and all(isinstance(n, int) for n in runs) else runs
    hs = [_hist_item(x) for x in items]
    names = list(names) if names is not None else [h[2] or f"run {i + 1}" for i, h in enumerate(hs)]
    kmax = max([k or 0] + [hk or 0 for _, hk, _ in hs] + [max(h, default=0) for h, _, _ in hs])
    xs = list(range(kmax + 1))
    fig = _layout_fig(title, height, xaxis=dict(title="n_ok (drafts accepted in the round)", dtick=1),
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
        rh = _hist_item(requested)[0]
        fig.add_scatter(x=xs, y=values(rh), mode="markers", name="requested (replay schedule)",
                        marker=dict(symbol="line-ew-open", size=28, color="#333", line=dict(width=3, color="#333")))
    return fig


def phase_figure(runs, *, names=None, title: str | None = None, height: int = 420, totals: bool = True):
    """Stacked bars of ms per emitted token by phase (spec.PHASES, plus the strict tail), one
    bar per run, with each run's greedy ms/token (timed in the same run, or predicted) as a
    reference mark. `runs`: SpecResults, summaries (SpecResult.summary(), spec.aggregate()),
    rows of results/bench_spec.json, or predictions (spec.predict / spec.predict_result)."""
    rs = _runs(runs, names)
    labels = [d["label"] for d in rs]
    fig = _layout_fig(title, height, barmode="stack", yaxis=dict(title="ms per token", rangemode="tozero"),
                      legend=dict(traceorder="normal"), hovermode="x")
    phases = list(spec.PHASES) + (["tail"] if any("tail" in d["phase"] for d in rs) else [])
    for ph in phases:
        ys = [d["phase"].get(ph, 0.0) for d in rs]
        doc = spec.PHASE_DOC.get(ph, TAIL_DOC)
        fig.add_bar(x=labels, y=ys, name=ph, marker_color=PHASE_COLORS[ph], hovertext=[doc] * len(ys),
                    hovertemplate="%{y:.4g} ms/token<br>%{hovertext}<extra>" + ph + "</extra>")
    if totals:
        tot = [sum(d["phase"].values()) for d in rs]
        fig.add_scatter(x=labels, y=tot, mode="text", text=[f"{t:.3g} ms" for t in tot], textposition="top center",
                        showlegend=False, hoverinfo="skip", name="total")
    g = [d["greedy_ms_per_token"] for d in rs]
    if any(v is not None for v in g):
        fig.add_scatter(x=labels, y=g, mode="markers", name="greedy ms/token",
                        marker=dict(symbol="line-ew-open", size=56, color="black", line=dict(width=3, color="black")),
                        hovertemplate="greedy %{y:.4g} ms/token<extra></extra>")
    return fig


def speedup_figure(runs, *, names=None, predicted=None, title: str | None = None, height: int = 400):
    """Measured speedup (greedy ms/token / spec ms/token, both timed in the same run) per run,
    with 1x (greedy) as the reference line and the cost model's prediction beside each bar.
    predicted: None (use a bench row's 'predicted_speedup' where present), a UnitCosts (priced
    for each SpecResult's own rounds with spec.predict_result, or for a summary's histogram with
    spec.predict), or a list of numbers / prediction dicts, one per run."""
    rs = _runs(runs, names)
    labels = [d["label"] for d in rs]
    pred = [d["predicted_speedup"] for d in rs]
    if isinstance(predicted, spec.UnitCosts):
        pred = [_predict_for(predicted, d) for d in rs]
    elif predicted is not None:
        predicted = list(predicted)
        if len(predicted) != len(rs):
            raise KestrelError(f"{len(predicted)} predictions for {len(rs)} runs")
        pred = [p.get("speedup", p.get("predicted_speedup")) if isinstance(p, dict) else p for p in predicted]
    sp = [d["speedup"] for d in rs]
    fig = _layout_fig(title, height, yaxis=dict(title="speedup vs greedy (×)", rangemode="tozero"),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    fig.add_bar(x=labels, y=sp, name="measured", marker_color=[POLICY_COLORS.get(d["policy"], "#888") for d in rs],
                text=[("n/a" if v is None else f"{v:.2f}×") for v in sp], textposition="outside", cliponaxis=False)
    if any(p is not None for p in pred):
        fig.add_scatter(x=labels, y=pred, mode="markers", name="predicted (cost model)",
                        marker=dict(symbol="diamond-open", size=14, line=dict(width=2.5, color="black")))
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="greedy (1×)",
                  annotation_position="top left")
    return fig


def _predict_for(u, d):
    r = d.get("result")
    try:
        if r is not None:
            return spec.predict_result(u, r)["speedup"]
        if d.get("hist"):
            return spec.predict(u, d["policy"], d["pairing"], d["k"], hist=d["hist"])["speedup"]
    except KestrelError:
        return None
    return None


def round_figure(result, *, greedy_ms_per_token: float | None = None, title: str | None = None,
                 height: int = 360):
    """ms per phase, round by round (stacked), against what greedy decoding spends on the same
    tokens (max(n_ok, 1) x greedy ms/token). `result`: a SpecResult or a list of RoundRecords."""
    rounds = getattr(result, "rounds", result)
    if greedy_ms_per_token is None and getattr(result, "greedy_ms", None) is not None:
        greedy_ms_per_token = result.greedy_ms / result.T
    xs = [r.i for r in rounds]
    fig = _layout_fig(title, height, barmode="stack", bargap=0.1, xaxis=dict(title="round"),
                      yaxis=dict(title="ms", rangemode="tozero"), hovermode="x",
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    for ph in spec.PHASES:
        fig.add_bar(x=xs, y=[_r(r.ms.get(ph, 0.0)) for r in rounds], name=ph, marker_color=PHASE_COLORS[ph])
    if greedy_ms_per_token is not None:
        fig.add_scatter(x=xs, y=[_r(max(r.n_ok, 1) * greedy_ms_per_token) for r in rounds], mode="lines+markers",
                        name="greedy, same tokens", line=dict(color="black", shape="hvh", width=1.5),
                        marker=dict(size=4), customdata=[r.n_ok for r in rounds],
                        hovertemplate="n_ok=%{customdata}: greedy %{y:.3g} ms<extra></extra>")
    return fig


# ------------------------------------------------------------------------------- the cost model views

def _ks_available(u, ks=KS) -> list:
    """The k for which the unit costs have every table entry a round needs."""
    out = []
    for k in ks:
        need_mtp = range(1, max(k - 1, 1) + 1)
        if k in u.step_m and k in u.ckpt and all(m in u.mtp for m in need_mtp) and \
                all(m in u.step_m for m in range(1, k + 1)):
            out.append(k)
    return out


def _mean_nok(profile, k: int, pairing: str) -> float:
    return sum(n * p for n, p in enumerate(spec.nok_distribution(profile, k, pairing)))


def equivalent_alpha(mean_nok: float, k: int, pairing: str = "seed") -> float | None:
    """The flat per-depth acceptance alpha whose expected n_ok at this k equals mean_nok (the
    y coordinate of a measured run on the cost surface). None where alpha changes nothing
    (pairing 'mtp' with k = 1: n_ok is always 1)."""
    if mean_nok is None:
        return None
    lo_v, hi_v = _mean_nok((0.0,) * k, k, pairing), _mean_nok((1.0,) * k, k, pairing)
    if hi_v - lo_v < 1e-12:
        return None
    if mean_nok <= lo_v:
        return 0.0
    if mean_nok >= hi_v:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _mean_nok((mid,) * k, k, pairing) < mean_nok:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _profile4(profile) -> tuple:
    """A per-depth profile (list, string, or spec.Acceptance) padded to 4 depths with its last rate."""
    if profile is None:
        profile = spec.E16_PROFILE
    if hasattr(profile, "profile") and callable(profile.profile):
        profile = profile.profile()
    if not isinstance(profile, str):
        profile = [0.0 if a is None else a for a in profile]          # a depth never reached: 0
    prof = list(spec.parse_profile(profile))
    return tuple(prof + [prof[-1]] * (4 - len(prof)))


def _speedup(u, policy, pairing, k, profile, greedy=None) -> float:
    return spec.predict(u, policy, pairing, k, profile=profile, greedy_ms_per_token=greedy)["speedup"]


def _measured_points(measured, policy=None, pairing=None) -> list:
    """Measured runs as (k, equivalent alpha, speedup, label) for a policy/pairing."""
    if measured is None:
        return []
    out = []
    for d in _runs(measured):
        if d["kind"] != "measured" or d["speedup"] is None or d["k"] is None:
            continue
        if (policy and d["policy"] != policy) or (pairing and d["pairing"] != pairing):
            continue
        a = equivalent_alpha(d["mean_nok"], d["k"], d["pairing"])
        if a is not None:
            out.append({"k": d["k"], "alpha": a, "speedup": d["speedup"], "label": d["label"],
                        "pairing": d["pairing"], "policy": d["policy"]})
    return out


def _speedup_scale(cmax: float) -> list:
    """Red below 1x, white at 1x, blue above, on [0, cmax]."""
    w = 1.0 / cmax
    return [[0.0, "#b2182b"], [0.5 * w, "#ef8a62"], [w, "#f7f7f7"], [w + 0.5 * (1 - w), "#67a9cf"], [1.0, "#2166ac"]]


def cost_surface_figure(unit_costs, policy: str = "replay", pairing: str = "seed", measured=None, *,
                        ks=KS, alphas=None, profile=None, k: int | None = None,
                        greedy_ms_per_token: float | None = None, title: str | None = None, height: int = 440):
    """The cost model's predicted speedup (spec.predict) as a heatmap over (k, flat alpha), with
    the break-even alpha per k (speedup = 1), measured runs of this policy and pairing at their
    equivalent alpha (coloured by their measured speedup on the same scale), and optionally a
    per-depth `profile` (alpha_1..alpha_4 or a spec.Acceptance) marked at its equivalent alpha
    for each k (star at `k`)."""
    import numpy as np
    u = _units(unit_costs)
    ks = [kk for kk in ks if kk in _ks_available(u, ks)]
    if not ks:
        raise KestrelError(f"the unit costs cover no k in 1..4 (measured M: {sorted(u.step_m)})")
    alphas = [round(float(a), 4) for a in (np.linspace(0.0, 1.0, 51) if alphas is None else alphas)]
    z = [[_r(_speedup(u, policy, pairing, kk, (a,) * kk, greedy_ms_per_token)) for kk in ks] for a in alphas]
    cmax = max(2.0, max(max(row) for row in z))
    title = title or f"Predicted speedup: policy {policy}, pairing {pairing}"
    fig = _layout_fig(title, height, xaxis=dict(title="k (drafts per round)", tickvals=ks, range=[ks[0] - .5, ks[-1] + .5]),
                      yaxis=dict(title="flat acceptance α (per depth)", range=[-0.01, 1.01]),
                      coloraxis=dict(colorscale=_speedup_scale(cmax), cmin=0.0, cmax=cmax,
                                     colorbar=dict(title="speedup")),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    fig.add_heatmap(x=ks, y=alphas, z=z, coloraxis="coloraxis", name="predicted",
                    hovertemplate="k=%{x}, α=%{y:.2f}: %{z:.3f}×<extra>predicted</extra>")
    # break-even alpha per k (first crossing of 1 on the grid, interpolated)
    bx, by = [], []
    for j, kk in enumerate(ks):
        col = [row[j] for row in z]
        if col[0] >= 1.0:
            bx.append(kk), by.append(alphas[0])
            continue
        for i in range(1, len(col)):
            if col[i] >= 1.0:
                f = (1.0 - col[i - 1]) / (col[i] - col[i - 1]) if col[i] != col[i - 1] else 0.0
                bx.append(kk), by.append(alphas[i - 1] + f * (alphas[i] - alphas[i - 1]))
                break
    fig.add_scatter(x=bx, y=by, mode="lines+markers", name="break-even (1×)",
                    line=dict(color="black", dash="dot", width=2), marker=dict(symbol="line-ew", size=30,
                                                                             line=dict(width=3, color="black")),
                    hovertemplate="k=%{x}: needs α ≥ %{y:.2f}<extra>break-even</extra>")
    if profile is not None:
        prof = _profile4(profile)
        px = [kk for kk in ks if equivalent_alpha(_mean_nok(prof, kk, pairing), kk, pairing) is not None]
        py = [equivalent_alpha(_mean_nok(prof, kk, pairing), kk, pairing) for kk in px]
        sp = [_speedup(u, policy, pairing, kk, prof, greedy_ms_per_token) for kk in px]
        fig.add_scatter(x=px, y=py, mode="lines+markers", name="profile α₁..α₄",
                        line=dict(color="#444", width=1), text=[f"{s:.2f}×" for s in sp],
                        marker=dict(symbol=["star" if kk == k else "circle-open" for kk in px],
                                    size=[20 if kk == k else 10 for kk in px], color="gold",
                                    line=dict(width=1.5, color="black")),
                        hovertemplate="k=%{x}: profile ≡ α %{y:.2f}, predicted %{text}<extra></extra>")
    pts = _measured_points(measured, policy, pairing)
    fig.add_scatter(x=[p["k"] for p in pts], y=[p["alpha"] for p in pts], mode="markers+text", name="measured",
                    text=[f"{p['speedup']:.2f}×" for p in pts], textposition="middle right",
                    marker=dict(size=15, color=[p["speedup"] for p in pts], coloraxis="coloraxis",
                                line=dict(width=2, color="black")),
                    customdata=[p["label"] for p in pts],
                    hovertemplate="%{customdata}<br>α_eq=%{y:.2f}: measured %{text}<extra></extra>")
    return fig


def cost_explorer_static(unit_costs, *, pairings=("seed", "mtp"), policies=None, measured=None, ks=KS,
                         alphas=None, alpha0: float = 0.7, greedy_ms_per_token: float | None = None,
                         title: str | None = None, height: int = 440):
    """Kernel-free twin of cost_explorer: predicted speedup vs k, one line per policy (colour)
    and pairing (dash), with a slider (frames) over the flat acceptance alpha; measured runs as
    markers (hover: their equivalent alpha). Display with kestrel.plots.show_animated."""
    import numpy as np
    u = _units(unit_costs)
    ks = _ks_available(u, ks)
    policies = list(policies or spec.POLICIES)
    pairings = [pairings] if isinstance(pairings, str) else list(pairings)
    alphas = [round(float(a), 3) for a in (np.linspace(0.0, 1.0, 21) if alphas is None else alphas)]
    a0 = min(range(len(alphas)), key=lambda i: abs(alphas[i] - alpha0))
    curves = {(pol, pr): [[_r(_speedup(u, pol, pr, kk, (a,) * kk, greedy_ms_per_token)) for kk in ks] for a in alphas]
              for pol in policies for pr in pairings}
    ymax = max(max(max(c) for c in v) for v in curves.values())
    pts = _measured_points(measured)
    pts = [p for p in pts if p["policy"] in policies and p["pairing"] in pairings]
    if pts:
        ymax = max(ymax, max(p["speedup"] for p in pts))
    title = title or "Predicted speedup vs k, per policy (slider: flat acceptance α)"
    fig = _layout_fig(None, height, xaxis=dict(title="k (drafts per round)", tickvals=ks),
                      yaxis=dict(title="speedup vs greedy (×)", range=[0, ymax * 1.08 + 0.05]),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
                      margin=dict(l=60, r=20, t=90, b=120))

    def traces(i):
        out = [dict(type="scatter", x=ks, y=curves[(pol, pr)][i], mode="lines+markers", name=f"{pol} · {pr}",
                    line=dict(color=POLICY_COLORS[pol], dash=PAIRING_DASH[pr]),
                    hovertemplate=f"{pol}, pairing {pr}, k=%{{x}}: %{{y:.3f}}×<extra>α={alphas[i]:.2f}</extra>")
               for pol in policies for pr in pairings]
        return out
    for t in traces(a0):
        fig.add_trace(t)
    off = {pol: 0.1 * (i - (len(policies) - 1) / 2) for i, pol in enumerate(policies)}
    fig.add_scatter(x=[p["k"] + off[p["policy"]] for p in pts], y=[p["speedup"] for p in pts], mode="markers",
                    name="measured (◆ seed, ■ mtp)",
                    marker=dict(symbol=["diamond" if p["pairing"] == "seed" else "square" for p in pts], size=11,
                                color=[POLICY_COLORS.get(p["policy"], "#888") for p in pts],
                                line=dict(width=1.5, color="black")),
                    customdata=[[p["label"], p["alpha"]] for p in pts],
                    hovertemplate="%{customdata[0]}: %{y:.3f}× (α_eq %{customdata[1]:.2f})<extra>measured</extra>")
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="greedy (1×)",
                  annotation_position="bottom right")

    def ttl(i):
        return f"{title}<br><sup>α = {alphas[i]:.2f} at every depth</sup>"
    fig.update_layout(title=ttl(a0))
    n = len(policies) * len(pairings)
    fig.frames = [dict(name=f"{a:.2f}", data=traces(i), traces=list(range(n)), layout=dict(title=dict(text=ttl(i))))
                  for i, a in enumerate(alphas)]
    _add_player(fig, [f"{a:.2f}" for a in alphas], active=a0, prefix="α = ", duration=250)
    return fig


def _add_player(fig, names, active, prefix, duration=300):
    """A slider over the frames (labels = frame names) and a play/pause button."""
    steps = [dict(method="animate", label=nm,
                  args=[[nm], dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))])
             for nm in names]
    fig.update_layout(
        sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix), pad=dict(t=45), x=0.14, len=0.86)],
        updatemenus=[dict(type="buttons", showactive=False, direction="left", x=0.0, y=0, xanchor="left",
                          yanchor="top", pad=dict(t=55, r=10),
                          buttons=[dict(label="▶", method="animate",
                                        args=[None, dict(frame=dict(duration=duration, redraw=True),
                                                         transition=dict(duration=0), fromcurrent=False,
                                                         mode="immediate")]),
                                   dict(label="❚❚", method="animate",
                                        args=[[None], dict(frame=dict(duration=0, redraw=False), mode="immediate")])])])


def replay_frames_figure(result, *, title: str | None = None, height: int = 460, max_frames: int = 160,
                         show_requested: bool = True):
    """Kernel-free twin of spec_replay: a recorded SpecResult replayed round by round with a
    slider and a play button (plotly frames, so it steps in static HTML too). Left: the n_ok
    histogram so far (with the replay drafter's requested values). Right: ms per emitted token
    so far, stacked by phase, beside greedy's (timed in the same run). The last frame adds the
    strict tail, if any. Opens on the final state. Display with kestrel.plots.show_animated."""
    from plotly.subplots import make_subplots
    rounds = list(result.rounds)
    k = result.k
    g = None if result.greedy_ms is None else result.greedy_ms / result.T
    xs = list(range(k + 1))
    req_on = show_requested and any(r.requested is not None for r in rounds)
    phases = list(spec.PHASES) + (["tail"] if result.tail_tokens else [])
    # cumulative states after rounds 1..N, then the end (+tail)
    states = []
    hist = [0] * (k + 1)
    req = [0] * (k + 1)
    ms = {ph: 0.0 for ph in phases}
    tokens = 0
    for r in rounds:
        hist[r.n_ok] += 1
        if r.requested is not None:
            req[min(r.requested, k)] += 1
        for ph, v in r.ms.items():
            ms[ph] = ms.get(ph, 0.0) + v
        tokens += len(r.emitted)
        states.append((f"{r.i + 1}", list(hist), list(req), dict(ms), tokens,
                       f"round {r.i + 1}/{len(rounds)}: n_ok={r.n_ok}, {tokens} tokens so far"))
    if result.tail_tokens or not rounds:
        ms["tail"] = result.tail_ms
        tokens += result.tail_tokens
        states.append(("+tail", list(hist), list(req), dict(ms), tokens,
                       f"end: {len(rounds)} rounds + {result.tail_tokens} tail tokens (plain M=1 steps)"))
    if len(states) > max_frames:             # keep the last state, thin the rest evenly
        idx = sorted({round(i * (len(states) - 1) / (max_frames - 1)) for i in range(max_frames)})
        states = [states[i] for i in idx]
    title = title or (f"{result.model}: policy {result.policy}, drafter {_drafter_short(result.drafter)}, "
                      f"k={k}, T={result.T}")

    def ttl(st):
        name, h, rq, m, tok, what = st
        mpt = sum(m.values()) / tok if tok else 0.0
        sp = f", speedup {'' if st is states[-1] else 'so far '}{g / mpt:.2f}×" if g and mpt else ""
        return f"{title}<br><sup>{what}; {mpt:.3g} ms/token{sp}</sup>"

    def traces(st):
        name, h, rq, m, tok, what = st
        out = [dict(type="bar", x=xs, y=h, name="n_ok", marker=dict(color="#1f77b4"), showlegend=False,
                    text=[str(v) for v in h], textposition="outside", cliponaxis=False, xaxis="x", yaxis="y")]
        if req_on:
            out.append(dict(type="scatter", x=xs, y=rq, mode="markers", name="requested", xaxis="x", yaxis="y",
                            marker=dict(symbol="line-ew-open", size=26, color="#333", line=dict(width=3, color="#333"))))
        for ph in phases:
            out.append(dict(type="bar", x=["spec"], y=[_r(m.get(ph, 0.0) / tok if tok else 0.0)], name=ph,
                            marker=dict(color=PHASE_COLORS[ph]), xaxis="x2", yaxis="y2"))
        return out

    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("n_ok histogram", "ms per token"))
    for t in traces(states[-1]):
        fig.add_trace(t)
    if g is not None:
        fig.add_bar(x=["greedy"], y=[_r(g)], name="greedy", marker=dict(color="black"), xaxis="x2", yaxis="y2")
    hmax = max(states[-1][1]) if states else 1
    mmax = max([sum(st[3].values()) / st[4] for st in states if st[4]] + [g or 0.0, 1e-9])
    fig.update_layout(template="plotly_white", height=height, barmode="stack", title=ttl(states[-1]),
                      margin=dict(l=60, r=20, t=90, b=110), legend=dict(orientation="v", x=1.02, y=1),
                      xaxis=dict(title="n_ok", dtick=1, range=[-0.5, k + 0.5]),
                      yaxis=dict(title="rounds", range=[0, hmax * 1.18 + 1]),
                      yaxis2=dict(title="ms per token", range=[0, mmax * 1.1]))
    n = len(traces(states[-1]))
    fig.frames = [dict(name=st[0], data=traces(st), traces=list(range(n)), layout=dict(title=dict(text=ttl(st))))
                  for st in states]
    _add_player(fig, [st[0] for st in states], active=len(states) - 1, prefix="round: ", duration=120)
    return fig


# =============================================================================== loading results / costs

def _units(u):
    if isinstance(u, spec.UnitCosts):
        return u
    if isinstance(u, dict):
        return load_bench(u)["units"] if ("units" in u or "tiny" in u or "large" in u) else spec.UnitCosts.from_dict(u)
    if isinstance(u, (str, Path)):
        return load_bench(u)["units"]
    raise KestrelError(f"unit costs: a spec.UnitCosts, its dict, or a results JSON path, got {type(u).__name__}")


def load_bench(source="bench_spec", section: str | None = None) -> dict:
    """Unit costs and measured runs from a benchmark results file (scripts/bench_spec.py).
    source: a results name ('bench_spec' -> results/bench_spec.json, via kestrel.results), a
    path to such a JSON, or the loaded dict. section: 'large' (the real shape, histogram
    replay) or 'tiny' (end to end); default 'large' if present, else 'tiny'. A JSON with
    'units' at its top level is one section by itself. Returns {'units': UnitCosts, 'runs':
    [rows], 'acceptance': {pairing: alpha list} (tiny only), 'model', 'device', 'date',
    'section', 'path', 'provenance'}."""
    from . import results
    path = None
    if isinstance(source, dict):
        d = source
    elif isinstance(source, str) and not source.endswith(".json") and "/" not in source:
        d, path = results.load(source), str(results.RESULTS / f"{source}.json")
    else:
        p = Path(source)
        if not p.is_absolute() and not p.exists():
            p = Path(__file__).resolve().parents[1] / p
        d, path = json.loads(p.read_text()), str(p)
    if "units" in d:
        sec, name = d, section or "top"
    else:
        name = section or ("large" if "large" in d else "tiny")
        if name not in d:
            raise KestrelError(f"{path or 'results'}: no section {name!r} (has {[s for s in ('tiny', 'large') if s in d]})")
        sec = d[name]
    acc = {pr: a.get("alpha") for pr, a in (sec.get("acceptance") or {}).items()}
    return {"units": spec.UnitCosts.from_dict(sec["units"]), "runs": list(sec.get("runs", [])), "acceptance": acc,
            "model": sec.get("model"), "device": sec.get("device", d.get("device")), "date": d.get("date"),
            "section": name, "path": path, "provenance": results.provenance({**d, "device": sec.get("device", d.get("device"))})}


def edit_units(u, *, step: float | None = None, draft: float | None = None, mark: float | None = None,
               rollback: float | None = None):
    """A copy of UnitCosts with some costs changed. step scales the batch tables too (step_m and
    verify_checkpointed, keeping their shape in M), draft scales the batched MTP table; mark and
    rollback (the whole-state copies) are set as given."""
    u = _units(u)
    d = u.to_dict()
    if step is not None and u.step > 0:
        f = step / u.step
        d["step"] = step
        d["step_m"] = {m: v * f for m, v in u.step_m.items()}
        d["ckpt"] = {m: v * f for m, v in u.ckpt.items()}
    if draft is not None and u.draft > 0:
        f = draft / u.draft
        d["draft"] = draft
        d["mtp"] = {m: v * f for m, v in u.mtp.items()}
    if mark is not None:
        d["mark"] = mark
    if rollback is not None:
        d["rollback"] = rollback
    d["meta"] = dict(u.meta, edited=True)
    return spec.UnitCosts.from_dict(d)


# =============================================================================== models (cached)

_MODELS: dict = {}
_ENGINES: dict = {}
_WARMED: set = set()          # (engine, greedy engine, policy, drafter, pairing) warmed up on a GPU


def _gpu(device: str) -> bool:
    if device == "cpu":
        return False
    from .backend import cuda_available
    return cuda_available()


def model_choices(device: str = "auto") -> list:
    """Model names spec_replay offers: the tiny model and the test shapes, plus the real-shape
    presets (random weights) where a CUDA GPU is present."""
    return list(SMALL_MODELS) + (list(REAL_PRESETS) if _gpu(device) else [])


def get_model(name: str = "tiny", device: str = "auto", dtype: str | None = None):
    """kestrel.load(name, device, dtype), cached (changing k or the policy never reloads weights).
    dtype defaults to 'bf16' for the real-shape presets and 'fp32' otherwise. Loading a
    real-shape preset first drops the other real-shape presets from the cache (GPU memory)."""
    import kestrel
    dtype = dtype or ("bf16" if name in REAL_PRESETS else "fp32")
    key = (name, device, dtype)
    if key not in _MODELS:
        if name in REAL_PRESETS:
            for kk in [kk for kk in _MODELS if kk[0] in REAL_PRESETS]:
                _drop(kk)
        _MODELS[key] = kestrel.load(name, device=device, dtype=dtype)
    return _MODELS[key]


def _drop(key):
    m = _MODELS.pop(key, None)
    for ek in [ek for ek in _ENGINES if ek[0] is m]:
        eng = _ENGINES.pop(ek)
        for w in [w for w in _WARMED if eng in w[:2]]:
            _WARMED.discard(w)
    del m
    import gc
    gc.collect()
    import sys
    cp = sys.modules.get("cupy")
    if cp is not None:
        try:
            cp.get_default_memory_pool().free_all_blocks()
        except Exception:
            pass


def clear_cache():
    """Forget every cached model and engine."""
    for key in list(_MODELS):
        _drop(key)
    _ENGINES.clear()
    _WARMED.clear()


def _engine(model, k: int, batch: str, need: int, cap: int):
    """A cached Engine (mmax=k, batch) with max_seq >= need; a GPU backend's captured plans are
    keyed on its buffers, so reusing it keeps them."""
    import kestrel
    key = (model, k, batch)
    eng = _ENGINES.get(key)
    if eng is None or eng.max_seq < need:
        _ENGINES[key] = eng = kestrel.Engine(model, max_seq=max(need, cap), mmax=k, batch=batch)
    return eng


# =============================================================================== widget plumbing

class _FigView:
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
        from .plots import show
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


def _side_by_side(a: _FigView, b: _FigView, widths=(50, 50)):
    """Two figures in one row, each in a box of its share of the width (plotly fills its box)."""
    import ipywidgets as W
    return W.HBox([W.Box([v.widget], layout=W.Layout(width=f"{w}%")) for v, w in zip((a, b), widths)],
                  layout=W.Layout(width="100%"))


def _html_table(rows, head) -> str:
    th = "".join(f"<th style='padding:2px 8px;text-align:left'>{h}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td style='padding:2px 8px'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table style='border-collapse:collapse;font-size:90%'><tr>{th}</tr>{tr}</table>"


def _esc(s: str) -> str:
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# =============================================================================== spec_replay

def spec_replay(model=None, *, device: str = "auto", k: int = 3, T: int = 64, start: int = 0,
                drafter: str = "mtp-seed", policy: str = "replay", hist=None, pairing: str = "seed",
                warmup: bool | None = None, min_interval: float = 0.25, run: bool = False):
    """Live speculative decoding, round by round, on the model's backend (ipywidgets VBox).

    Controls: model/shape ('tiny', the test shapes, and on a GPU the real-shape presets
    'qwen3.5-0.8b' ... 'qwen3.5-27b' with random weights), weights dtype, k (1-4), T, start
    (kestrel.starts()), drafter ('mtp-seed', 'mtp', 'replay' with an n_ok histogram text box,
    pre-filled with the seed's '0:24 1:6 2:11 3:4' or `hist` (a string, dict, SpecResult or
    summary), and its pairing), policy ('replay', 'flex-replay', 'checkpoint'), Run.
    Run times greedy decoding of the same T tokens (the speedup baseline and the reference
    stream), then run_spec with a per-round callback: the n_ok histogram, ms/token by phase
    against greedy, and the per-round cost update as the rounds come (at most every
    `min_interval` s). Models and engines are cached: changing k, T or the policy never reloads.

    model: a name (default 'tiny') or a loaded kestrel Model. warmup: one short untimed run
    (T <= 16) first, once per engine x policy x drafter (default: on CUDA only, where it
    compiles and captures the plans that combination uses, which must stay out of the timing).
    The returned box has `.app`: app.run(), app.controls, app.result (the last SpecResult),
    app.views (the figures), app.error (the last run's exception, if any).
    """
    return _SpecReplay(model, device, k, T, start, drafter, policy, hist, pairing, warmup, min_interval,
                       run).widget


class _SpecReplay:
    T_MAX = 256

    def __init__(self, model, device, k, T, start, drafter, policy, hist, pairing, warmup, min_interval, run):
        import ipywidgets as W
        self.device, self.min_interval = device, min_interval
        self.result, self.error, self.records = None, None, []
        self.given = None
        names = model_choices(device)
        notes = []
        if model is not None and not isinstance(model, str):
            self.given = model
            names = [f"{model.cfg.name} (given)"] + names
            initial = names[0]
        else:
            initial = model or "tiny"
            if initial not in names:
                if initial in REAL_PRESETS:
                    notes.append(f"<b>{_esc(initial)}</b> needs a CUDA GPU; using <b>tiny</b>.")
                else:
                    notes.append(f"unknown model {_esc(initial)!r}; using <b>tiny</b>.")
                initial = "tiny"
        if not _gpu(device):
            notes.append("Real-shape presets (" + ", ".join(REAL_PRESETS) + ") need a CUDA GPU: this kernel "
                         "runs the CPU backend, so only the tiny model and the test shapes are offered.")
        if hist is not None and not isinstance(hist, str):
            hist = " ".join(f"{n}:{c}" for n, c in _hist_item(hist)[0].items())
        st = {"description_width": "70px"}
        c = self.controls = {
            "model": W.Dropdown(options=names, value=initial, description="model", style=st),
            "dtype": W.Dropdown(options=["fp32", "bf16"], value="bf16" if initial in REAL_PRESETS else "fp32",
                                description="weights", style=st, layout=W.Layout(width="170px")),
            "k": W.IntSlider(value=k, min=1, max=4, description="k", style=st),
            "T": W.IntSlider(value=T, min=4, max=self.T_MAX, description="T (tokens)", style=st),
            "start": W.Dropdown(options=self._start_options(initial), value=start, description="start", style=st),
            "drafter": W.Dropdown(options=list(spec.DRAFTERS), value=drafter, description="drafter", style=st),
            "hist": W.Text(value=hist or spec.SEED_HIST_STR, description="n_ok hist", style=st,
                           placeholder=spec.SEED_HIST_STR, layout=W.Layout(width="300px")),
            "pairing": W.Dropdown(options=list(spec.PAIRINGS), value=pairing, description="pairing", style=st,
                                  layout=W.Layout(width="170px")),
            "policy": W.ToggleButtons(options=list(spec.POLICIES), value=policy, description="policy",
                                      tooltips=[spec.POLICY_DOC[p] for p in spec.POLICIES], style=st),
        }
        self.fill = W.Button(description="← last run's n_ok", tooltip="fill the histogram with the last run's")
        self.fill.on_click(lambda _: self._fill_hist())
        self.button = W.Button(description="Run", button_style="primary", icon="play")
        self.button.on_click(lambda _: self.run())
        self.replay_box = W.HBox([c["hist"], c["pairing"], self.fill])
        c["drafter"].observe(lambda ch: self._show_replay(), names="value")
        c["model"].observe(lambda ch: self._model_changed(), names="value")
        self._show_replay()
        self.note = W.HTML("<br>".join(f"<small>{n}</small>" for n in notes))
        self.status = W.HTML("Press <b>Run</b>.")
        self.log = W.HTML()
        self.views = {"hist": _FigView(hist_figure({n: 0 for n in range(k + 1)}, k=k, names=["measured"],
                                                   title="n_ok histogram", height=320)),
                      "phase": _FigView(phase_figure([self._empty_summary(k, policy, drafter)], names=["spec"],
                                                     title="ms per token, by phase", height=320)),
                      "rounds": _FigView(round_figure([], greedy_ms_per_token=None, title="each round: ms by phase",
                                                      height=320))}
        self.warmup = warmup
        controls = W.VBox([W.HBox([c["model"], c["dtype"]]), W.HBox([c["k"], c["T"]]), c["start"],
                           W.HBox([c["drafter"]]), self.replay_box, c["policy"],
                           W.HBox([self.button, self.status]), self.note])
        figs = W.VBox([_side_by_side(self.views["hist"], self.views["phase"], (45, 55)), self.views["rounds"].widget,
                       self.log])
        self.widget = W.VBox([controls, figs])
        self.widget.app = self
        if run:
            self.run()

    # ---- controls --------------------------------------------------------------------------
    def _start_options(self, name):
        import kestrel
        given = self.given if name.endswith("(given)") else None
        if name == "tiny" or getattr(given, "tokenizer", None) is not None:      # the byte-level starts
            texts = kestrel.starts()
            return [(f"{i}: {t.strip().splitlines()[0][:40]!r}" if t.strip() else f"{i}: {t!r}", i)
                    for i, t in enumerate(texts)]
        return [(f"{i}: seeded random prompt ({4 + 3 * i} tokens)", i) for i in range(6)]

    def _show_replay(self):
        self.replay_box.layout.display = "" if self.controls["drafter"].value == "replay" else "none"

    def _model_changed(self):
        c = self.controls
        name = c["model"].value
        c["dtype"].value = "bf16" if name in REAL_PRESETS else "fp32"
        v = c["start"].value
        c["start"].options = self._start_options(name)
        c["start"].value = v

    def _fill_hist(self):
        if self.result is not None:
            h = spec.histogram(self.result.noks, self.result.k)
            self.controls["hist"].value = " ".join(f"{n}:{cnt}" for n, cnt in h.items())

    def _model(self):
        name = self.controls["model"].value
        if name.endswith("(given)"):
            return self.given
        return get_model(name, self.device, self.controls["dtype"].value)

    @staticmethod
    def _empty_summary(k, policy, drafter):
        return {"policy": policy, "drafter": drafter, "k": k, "T": 1, "spec_ms": 0.0,
                "phase_ms": {ph: 0.0 for ph in spec.PHASES}, "greedy_ms_per_token": None, "speedup": None,
                "hist": {n: 0 for n in range(k + 1)}}

    # ---- the run ---------------------------------------------------------------------------
    def run(self):
        """Run with the current controls (what the Run button does). Returns the SpecResult, or
        None after an error (shown in the status line; kept in self.error)."""
        c = self.controls
        self.button.disabled = True
        self.error, self.records = None, []
        try:
            k, T, policy, drafter = c["k"].value, c["T"].value, c["policy"].value, c["drafter"].value
            kw = {}
            if drafter == "replay":
                kw = {"hist": spec.parse_hist(c["hist"].value), "pairing": c["pairing"].value}
            self.status.value = f"loading {_esc(c['model'].value)} …"
            model = self._model()
            be = model.be
            starts = spec.default_starts(model)
            label, prompt = starts[c["start"].value]
            P = len(prompt)
            cap = max(len(t) for _, t in starts) + self.T_MAX + 6
            need = P + T + k + 2
            eng = _engine(model, k, spec.POLICIES[policy], need, cap)
            geng = _engine(model, 1, "flex", P + T + 1, cap)
            warm = self.warmup if self.warmup is not None else be.name != "cpu"
            combo = (eng, geng, policy, drafter, kw.get("pairing"))
            if warm and combo not in _WARMED:       # compile + capture this combination's plans, untimed
                self.status.value = "warm-up (untimed) …"
                spec.run_spec(model, prompt, min(T, 16), k, policy, drafter, engine=eng, greedy_engine=geng, **kw)
                _WARMED.add(combo)
            self.status.value = f"greedy decoding of {T} tokens (the baseline) …"
            ref, g_ms, _ = spec.greedy_timed(model, prompt, T, engine=geng)
            self.meta = {"k": k, "T": T, "policy": policy, "drafter": drafter, "g": g_ms / T, "model": model,
                         "label": label}
            self._last_draw = 0.0
            r = spec.run_spec(model, prompt, T, k, policy, drafter, reference=ref, greedy=False,
                              on_round=self._on_round, engine=eng, **kw)
            r.greedy_ms = g_ms                     # greedy timed in the same run, as run_spec(greedy=True) does
            self.result = r
            self._draw(final=True)
            return r
        except Exception as e:                     # shown, not raised: a widget callback has nowhere to raise to
            self.error = e
            self.status.value = f"<span style='color:#b00'><b>{type(e).__name__}</b>: {_esc(e)}</span>"
            return None
        finally:
            self.button.disabled = False

    def _on_round(self, rec):
        self.records.append(rec)
        now = time.perf_counter()
        if now - self._last_draw >= self.min_interval:
            self._draw(final=False)
            self._last_draw = time.perf_counter()

    def _draw(self, final: bool):
        m = self.meta
        recs = self.result.rounds if final else self.records
        k, g = m["k"], m["g"]
        if final:
            s = self.result.summary()
            runs = [self.result]
        else:
            s = spec.summarize_noks([r.n_ok for r in recs], [r.k for r in recs], k)
            ph = {p: sum(r.ms.get(p, 0.0) for r in recs) for p in spec.PHASES}
            tok = sum(len(r.emitted) for r in recs) or 1
            spec_ms = sum(ph.values())
            s.update(policy=m["policy"], drafter=m["drafter"], k=k, T=tok, spec_ms=spec_ms, phase_ms=ph,
                     greedy_ms_per_token=g, ms_per_token=spec_ms / tok,
                     speedup=g / (spec_ms / tok) if spec_ms else None)
            runs = [s]
        req = None
        if m["drafter"] == "replay":
            req = [min(r.requested, r.k) for r in recs if r.requested is not None]
        self.views["hist"].update(hist_figure(s["hist"], k=k, names=["measured"], requested=req or None,
                                              title=f"n_ok histogram ({s['rounds']} rounds)", height=320))
        self.views["phase"].update(phase_figure(runs, names=["spec"], title="ms per token, by phase", height=320))
        self.views["rounds"].update(round_figure(recs, greedy_ms_per_token=g, title="each round: ms by phase",
                                                 height=320))
        sp = s.get("speedup")
        head = (f"{'done' if final else 'running'}: {s['rounds']} rounds, {s.get('T')} tokens, "
                f"{s['ms_per_token']:.3g} ms/token vs greedy {g:.3g} ms/token → "
                f"<b>{'n/a' if sp is None else f'{sp:.2f}×'}</b>")
        if final:
            r = self.result
            head += f"; bit-exact: <b>{r.bit_exact}</b>"
            if r.tail_tokens:
                head += f"; tail: {r.tail_tokens} plain steps"
            from .plots import stamp
            line = stamp(device=m["model"], quiet=True)
            self.log.value = ("<pre style='font-size:85%;line-height:1.25'>"
                              + _esc("\n".join([f"start {m['label']!r}"] + r.log_lines() + [line])) + "</pre>")
        self.status.value = head


# =============================================================================== cost_explorer

def cost_explorer(unit_costs=None, measured=None, *, profile=None, k: int = 3, policy: str = "replay",
                  pairing: str | None = None, device: str = "auto"):
    """Explore the cost model live (ipywidgets VBox): sliders for the per-depth acceptance
    profile alpha_1..alpha_4 (default: the seed's E16; or `profile`, e.g. a spec.Acceptance from
    spec.teacher_forced), k, pairing, policy, and the main unit costs (M=1 step, MTP draft step,
    mark and rollback copies; editing step/draft rescales the batch tables, see edit_units).
    Shows the predicted speedup (spec.predict) over (k, flat alpha) with the profile and the
    measured runs on it, the predicted ms/token by phase for the three policies, and a table.
    pairing: 'seed' or 'mtp' (default: the profile's own, for a spec.Acceptance, else 'seed').

    unit_costs: a spec.UnitCosts, its dict, a kestrel Model (measured now), a results name or
    JSON path (load_bench: its units, its runs as `measured` unless given, and for the tiny
    section its teacher-forced alpha as the profile unless given), or None: measured now on
    the tiny model. measured: SpecResults, summaries or bench rows to overlay.
    The returned box has `.app`: app.update(), app.controls, app.units(), app.views.
    """
    return _CostExplorer(unit_costs, measured, profile, k, policy, pairing, device).widget


class _CostExplorer:
    def __init__(self, unit_costs, measured, profile, k, policy, pairing, device):
        import ipywidgets as W
        from .model import Model
        source = ""
        if unit_costs is None:
            m = get_model("tiny", device)
            unit_costs = spec.measure_unit_costs(m, k_max=4, reps=3)
            source = f"measured now on {m.cfg.name} ({getattr(m.be, 'device_name', m.be.name)})"
        elif isinstance(unit_costs, Model):
            source = f"measured now on {unit_costs.cfg.name}"
            unit_costs = spec.measure_unit_costs(unit_costs, k_max=4, reps=3)
        elif isinstance(unit_costs, (str, Path)) or (isinstance(unit_costs, dict) and
                                                     any(key in unit_costs for key in ("units", "tiny", "large"))):
            b = load_bench(unit_costs)
            source = f"{b['path']} [{b['section']}]: {b['model']}, {b['provenance']}"
            unit_costs, measured = b["units"], (b["runs"] if measured is None else measured)
            if profile is None and b["acceptance"].get(pairing or "seed"):
                profile = b["acceptance"][pairing or "seed"]          # the model's own teacher-forced alpha
        self.base = _units(unit_costs)
        meta = self.base.meta or {}
        source = source or f"{meta.get('model', '?')} on {meta.get('device', '?')}"
        self.measured = measured
        self.ks = _ks_available(self.base)
        prof = _profile4(profile)
        pairing = pairing or getattr(profile, "pairing", None) or "seed"
        st = {"description_width": "90px"}
        sl = dict(min=0.0, max=1.0, step=0.01, continuous_update=False, style=st, readout_format=".2f")
        c = self.controls = {f"a{j + 1}": W.FloatSlider(value=prof[j], description=f"α{j + 1}", **sl) for j in range(4)}
        c["k"] = W.IntSlider(value=k if k in self.ks else self.ks[-1], min=self.ks[0], max=self.ks[-1],
                             description="k", style=st, continuous_update=False)
        c["pairing"] = W.ToggleButtons(options=list(spec.PAIRINGS), value=pairing, description="pairing", style=st,
                                       tooltips=["every draft from the MTP (d_1 can miss)",
                                                 "d_1 = argmax(logits_p) free; the profile applies from d_2"])
        c["policy"] = W.ToggleButtons(options=list(spec.POLICIES), value=policy, description="policy", style=st,
                                      tooltips=[spec.POLICY_DOC[p] for p in spec.POLICIES])
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
        self.note = W.HTML(f"<small>unit costs: {_esc(source)}. The surface's α is flat (the same at every depth); "
                           "the profile and measured runs sit at their equivalent α (same expected n_ok).</small>")
        self.table = W.HTML()
        self.views = {"surface": _FigView(self._surface()), "phase": _FigView(self._phases())}
        self._busy = False
        controls = W.VBox([W.HBox([W.VBox([c["a1"], c["a2"], c["a3"], c["a4"]]),
                                   W.VBox([c["k"], c["step"], c["draft"], c["mark"], c["rollback"], self.reset])]),
                           c["pairing"], c["policy"], self.note])
        self.widget = W.VBox([controls, _side_by_side(self.views["surface"], self.views["phase"], (55, 45)),
                              self.table])
        self.widget.app = self
        self.update()

    def units(self):
        c = self.controls
        return edit_units(self.base, step=c["step"].value, draft=c["draft"].value, mark=c["mark"].value,
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
        return cost_surface_figure(self.units(), c["policy"].value, c["pairing"].value, self.measured,
                                   ks=self.ks, profile=self.profile(), k=c["k"].value, height=440)

    def _predictions(self):
        c = self.controls
        u, k, pr = self.units(), c["k"].value, c["pairing"].value
        return [spec.predict(u, pol, pr, k, profile=self.profile()) for pol in spec.POLICIES]

    def _phases(self):
        c = self.controls
        return phase_figure(self._predictions(), names=list(spec.POLICIES), height=440,
                            title=f"Predicted ms/token by phase (k={c['k'].value}, pairing {c['pairing'].value})")

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
            rows.append([f"<b>{p['policy']}</b>" if p["policy"] == c["policy"].value else p["policy"],
                         f"{p['advance_per_round']:.3f}", f"{p['round_ms']:.4g}", f"{p['ms_per_token']:.4g}",
                         f"{p['greedy_ms_per_token']:.4g}", f"<b>{p['speedup']:.3f}×</b>"])
        self.table.value = (_html_table(rows, ["policy", "tokens/round", "ms/round", "ms/token", "greedy ms/token",
                                               "speedup"])
                            + "<small>P(n_ok = 0.." + str(k) + "): " + ", ".join(f"{x:.3f}" for x in dist)
                            + "</small>")
