"""The cost model's views: predicted speedup over (k, flat alpha), and per policy against k.

The acceptance axis is a *flat* per-depth acceptance alpha (alpha_j = alpha at every depth the
verify judges, Pairing.judged_depths). A measured run or a per-depth profile is placed on it at
its *equivalent* alpha: the flat alpha with the same expected n_ok at that k
(spec.equivalent_alpha).
"""
from __future__ import annotations

from kestrel import speculative as spec
from kestrel.errors import KestrelError
from ..diagrams.common import legend_below
from .figures import POLICY_COLORS, compact, layout_fig
from .frames import add_player
from .runs import as_runs, as_units, pad_profile

PAIRING_DASH = {spec.Pairing.ARTICLE: "solid", spec.Pairing.TRAINED: "dash"}
PAIRING_SYMBOL = {spec.Pairing.ARTICLE: "diamond", spec.Pairing.TRAINED: "square"}


def _flat(a: float, k: int, pairing) -> tuple:
    return (a,) * max(spec.Pairing.parse(pairing).judged_depths(k), 1)


def _speedup(u, policy, pairing, k, profile, greedy=None) -> float:
    return spec.predict(u, policy, pairing, k, profile=profile, greedy_ms_per_token=greedy).speedup


def measured_points(measured, policy=None, pairing=None) -> list:
    """Measured runs as {k, alpha (equivalent), speedup, label, pairing, policy} for a policy/pairing."""
    if measured is None:
        return []
    policy = None if policy is None else spec.Policy.parse(policy)
    pairing = None if pairing is None else spec.Pairing.parse(pairing)
    out = []
    for v in as_runs(measured):
        r = v.run
        if v.predicted or r.speedup is None:
            continue
        if (policy and r.policy is not policy) or (pairing and r.pairing is not pairing):
            continue
        a = spec.equivalent_alpha(v.mean_nok, r.k, r.pairing)
        if a is not None:
            out.append({"k": r.k, "alpha": a, "speedup": r.speedup, "label": v.label, "pairing": r.pairing,
                        "policy": r.policy})
    return out


def _speedup_scale(cmax: float) -> list:
    """Red below 1x, white at 1x, blue above, on [0, cmax]."""
    w = 1.0 / cmax
    return [[0.0, "#b2182b"], [0.5 * w, "#ef8a62"], [w, "#f7f7f7"], [w + 0.5 * (1 - w), "#67a9cf"], [1.0, "#2166ac"]]


def cost_surface_figure(unit_costs, policy="replay", pairing="article", measured=None, *, ks=spec.K_VALUES,
                        alphas=None, profile=None, k: int | None = None, greedy_ms_per_token: float | None = None,
                        title: str | None = None, height: int = 440):
    """The cost model's predicted speedup (spec.predict) as a heatmap over (k, flat alpha), with
    the break-even alpha per k (speedup = 1), measured runs of this policy and pairing at their
    equivalent alpha (coloured by their measured speedup on the same scale), and optionally a
    per-depth `profile` (alpha_1..alpha_4 or a spec.Acceptance) marked at its equivalent alpha
    for each k (star at `k`)."""
    import numpy as np
    u = as_units(unit_costs)
    policy, pairing = spec.Policy.parse(policy), spec.Pairing.parse(pairing)
    ks = u.covered_ks(ks)
    if not ks:
        raise KestrelError(f"the unit costs cover no k in {spec.K_VALUES} (measured M: {sorted(u.step_m)})")
    alphas = [round(float(a), 4) for a in (np.linspace(0.0, 1.0, 51) if alphas is None else alphas)]
    z = [[compact(_speedup(u, policy, pairing, kk, _flat(a, kk, pairing), greedy_ms_per_token)) for kk in ks]
         for a in alphas]
    cmax = max(2.0, max(max(row) for row in z))
    title = title or f"Predicted speedup: policy {policy}, pairing {pairing}"
    fig = layout_fig(title, height, xaxis=dict(title="k (drafts per round)", tickvals=ks, range=[ks[0] - .5, ks[-1] + .5]),
                     yaxis=dict(title="flat acceptance α (per depth)", range=[-0.01, 1.01]),
                     coloraxis=dict(colorscale=_speedup_scale(cmax), cmin=0.0, cmax=cmax, colorbar=dict(title="speedup")),
                     legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    fig.add_heatmap(x=ks, y=alphas, z=z, coloraxis="coloraxis", name="predicted",
                    hovertemplate="k=%{x}, α=%{y:.2f}: %{z:.3f}×<extra>predicted</extra>")
    bx, by = [], []                 # break-even alpha per k (first crossing of 1 on the grid, interpolated)
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
                    line=dict(color="black", dash="dot", width=2),
                    marker=dict(symbol="line-ew", size=30, line=dict(width=3, color="black")),
                    hovertemplate="k=%{x}: needs α ≥ %{y:.2f}<extra>break-even</extra>")
    if profile is not None:
        prof = pad_profile(profile)
        eq = {kk: spec.equivalent_alpha(spec.mean_nok(prof, kk, pairing), kk, pairing) for kk in ks}
        px = [kk for kk in ks if eq[kk] is not None]
        sp = [_speedup(u, policy, pairing, kk, prof, greedy_ms_per_token) for kk in px]
        fig.add_scatter(x=px, y=[eq[kk] for kk in px], mode="lines+markers", name="profile α₁..α₄",
                        line=dict(color="#444", width=1), text=[f"{s:.2f}×" for s in sp],
                        marker=dict(symbol=["star" if kk == k else "circle-open" for kk in px],
                                    size=[20 if kk == k else 10 for kk in px], color="gold",
                                    line=dict(width=1.5, color="black")),
                        hovertemplate="k=%{x}: profile ≡ α %{y:.2f}, predicted %{text}<extra></extra>")
    pts = measured_points(measured, policy, pairing)
    fig.add_scatter(x=[p["k"] for p in pts], y=[p["alpha"] for p in pts], mode="markers+text", name="measured",
                    text=[f"{p['speedup']:.2f}×" for p in pts], cliponaxis=False,
                    # left of the marker in the last column, where the right side is the figure's edge
                    textposition=["middle left" if p["k"] == ks[-1] else "middle right" for p in pts],
                    # the marker's own colour scale (the surface's, same range): a marker coloured
                    # through the shared coloraxis was drawn black in the legend and on hover
                    marker=dict(size=15, color=[p["speedup"] for p in pts], colorscale=_speedup_scale(cmax),
                                cmin=0.0, cmax=cmax, showscale=False, line=dict(width=2, color="black")),
                    customdata=[p["label"] for p in pts],
                    hovertemplate="%{customdata}<br>α_eq=%{y:.2f}: measured %{text}<extra></extra>")
    return fig


def cost_explorer_static(unit_costs, *, pairings=tuple(spec.Pairing), policies=None, measured=None,
                         ks=spec.K_VALUES, alphas=None, alpha0: float = 0.7, greedy_ms_per_token: float | None = None,
                         title: str | None = None, height: int = 540):
    """Kernel-free twin of cost_explorer: predicted speedup vs k, one line per policy (colour)
    and pairing (dash), with a slider (frames) over the flat acceptance alpha; measured runs as
    markers (hover: their equivalent alpha). Display with kestrel.lab.plots.show_animated."""
    import numpy as np
    u = as_units(unit_costs)
    ks = u.covered_ks(ks)
    policies = [p for p in (spec.Policy.parse(p) for p in (policies or spec.POLICIES)) if p.priced_by(u)]
    pairings = [spec.Pairing.parse(pairings)] if isinstance(pairings, (str, spec.Pairing)) else \
        [spec.Pairing.parse(p) for p in pairings]
    alphas = [round(float(a), 3) for a in (np.linspace(0.0, 1.0, 21) if alphas is None else alphas)]
    a0 = min(range(len(alphas)), key=lambda i: abs(alphas[i] - alpha0))
    curves = {(pol, pr): [[compact(_speedup(u, pol, pr, kk, _flat(a, kk, pr), greedy_ms_per_token)) for kk in ks]
                          for a in alphas]
              for pol in policies for pr in pairings}
    ymax = max(max(max(c) for c in v) for v in curves.values())
    pts = [p for p in measured_points(measured) if p["policy"] in policies and p["pairing"] in pairings]
    if pts:
        ymax = max(ymax, max(p["speedup"] for p in pts))
    title = title or "Predicted speedup vs k, per policy (slider: flat acceptance α)"
    fig = layout_fig(None, height, xaxis=dict(title="k (drafts per round)", tickvals=ks),
                     yaxis=dict(title="speedup vs greedy (×)", range=[0, ymax * 1.08 + 0.05]),
                     margin=dict(l=60, r=20, t=90))
    # the legend under the slider (beside the plot it squeezed the plot to half the page; above
    # it, it covered the title): ~3 rows of entries over the slider's ~120 px
    legend_below(fig, 70, 130, left=60)

    def traces(i):
        return [dict(type="scatter", x=ks, y=curves[(pol, pr)][i], mode="lines+markers", name=f"{pol} · {pr}",
                     line=dict(color=POLICY_COLORS.get(pol.name, "#888"), dash=PAIRING_DASH[pr]),
                     hovertemplate=f"{pol}, pairing {pr}, k=%{{x}}: %{{y:.3f}}×<extra>α={alphas[i]:.2f}</extra>")
                for pol in policies for pr in pairings]
    for t in traces(a0):
        fig.add_trace(t)
    off = {pol: 0.1 * (i - (len(policies) - 1) / 2) for i, pol in enumerate(policies)}
    fig.add_scatter(x=[p["k"] + off[p["policy"]] for p in pts], y=[p["speedup"] for p in pts], mode="markers",
                    name="measured (◆ article, ■ trained pairing)",
                    marker=dict(symbol=[PAIRING_SYMBOL[p["pairing"]] for p in pts], size=11,
                                color=[POLICY_COLORS.get(p["policy"].name, "#888") for p in pts],
                                line=dict(width=1.5, color="black")),
                    customdata=[[p["label"], p["alpha"]] for p in pts],
                    hovertemplate="%{customdata[0]}: %{y:.3f}× (α_eq %{customdata[1]:.2f})<extra>measured</extra>")
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="greedy (1×)",
                  annotation_position="top left")   # k = 4 ends of the curves sit at the right

    def ttl(i):
        return f"{title}<br><sup>α = {alphas[i]:.2f} at every depth</sup>"
    fig.update_layout(title=ttl(a0))
    n = len(policies) * len(pairings)
    fig.frames = [dict(name=f"{a:.2f}", data=traces(i), traces=list(range(n)), layout=dict(title=dict(text=ttl(i))))
                  for i, a in enumerate(alphas)]
    add_player(fig, [f"{a:.2f}" for a in alphas], active=a0, prefix="α = ", duration=250)
    return fig


__all__ = ["cost_surface_figure", "cost_explorer_static", "measured_points"]
