"""One speculative round as a timeline per policy: draft, (mark), verify, accept, finalise, MTP sync."""
from __future__ import annotations

from .common import (DiagramError, _int, K_MAX, legend_below, _n_ok, _pairing,
                     _phase_colors, _policy, POLICY_NAMES, _units)
from ..plots import ms_label, figure
from kestrel.speculative.schedule import advance
from kestrel.speculative.cost import round_cost
from kestrel.speculative import SpecArgumentError


PHASE_LABELS = {
    "draft": "draft (MTP steps, with the rows to rewrite)",
    "mark": "mark (copy the state)",
    "verify": "verify (k rows at once)",
    "bookkeeping": "accept (argmax, compare, emit)",
    "undo": "undo: rollback / select / fold",
    "replay": "replay (or the n_ok = 0 step)",
    "sync": "MTP sync (truncate)",
    "greedy": "greedy decoding, same tokens",
}


def _segments(policy, pairing, k: int, n: int, u) -> list:
    """[(phase, label, ms)] of one round in time order; the ms add up to spec.round_cost."""
    c = policy.cost(u, k, n)
    total = round_cost(u, policy, pairing, k, n)
    seg = []
    first = 1 + pairing.offset
    steps = pairing.mtp_steps(k)
    for j in range(steps):        # one chain: its measured time shared by its steps
        seg.append(("draft", f"draft d{first + j}", u.draft_ms(steps) / steps))
    if "mark" in c:
        seg.append(("mark", "mark: copy S, hist", c["mark"]))
    what = {"replay": "step_m", "flex-replay": "step_m", "checkpoint": "verify_checkpointed",
            "input-cache": "verify_cached"}[policy.name]
    seg.append(("verify", f"verify {k} row{'s' * (k > 1)} ({what})", c["verify"]))
    seg.append(("bookkeeping", f"accept: n_ok = {n}", u.bookkeeping))
    if total["bookkeeping"] > u.bookkeeping:       # a_p' is not a verify row: one more argmax
        seg.append(("bookkeeping", "argmax(logits_p')", total["bookkeeping"] - u.bookkeeping))
    if policy.name in ("replay", "flex-replay"):
        if n < k:
            seg.append(("undo", "rollback: copy S, hist back", c["undo"]))
            if policy.name == "replay":
                for j in range(advance(n)):
                    seg.append(("replay", f"replay row {j + 1} (M=1)" if n else "step a_p (M=1)", u.step))
            else:
                label = f"replay {n} row{'s' * (n > 1)} (one step_m)" if n else "step a_p (M=1)"
                seg.append(("replay", label, c["replay"]))
    elif policy.name == "checkpoint":
        seg.append(("undo", f"select slot live+{n}", c["undo"]))
        if n == 0:
            seg.append(("replay", "step a_p (M=1)", c["replay"]))
    else:
        seg.append(("undo", f"fold {n} cached row{'s' * (n != 1)}", c["undo"]))
        if n == 0:
            seg.append(("replay", "step a_p (M=1)", c["replay"]))
    r = pairing.rewrite_rows(k, n)
    rows = f"{r} row{'s' * (r > 1)}"
    if total["sync"] > u.truncate:           # unit costs from before the rewrite rode in the chain
        seg.append(("sync", f"MTP sync: truncate + rewrite {rows}", total["sync"]))
        return seg
    seg.append(("sync", "MTP sync: truncate", total["sync"]))
    rewrite = total["draft"] - u.draft_ms(steps)
    if r > 0:     # paid at the next draft, in its chain's first pass (or an mtp_fill where k = 1)
        seg.append(("draft", f"next draft: rewrite {rows}", rewrite))
    return seg


def _check_priced(policy, u, k: int, measured: bool):
    if not policy.priced_by(u):
        raise DiagramError(f"these unit costs did not measure the {policy.name} policy's calls (verify_cached, "
                           f"fold_cached): measure them again with spec.measure_unit_costs")
    try:
        for m in range(1, k + 1):
            u.get("step_m", m)
        policy.cost(u, k, 0)
        u.get("mtp", max(k - 1, 1))
        if u.chain_fill and k >= 2:        # the trained pairing's rewrite of up to k - 1 rows, in the chain
            u.get("chain_fill", k - 1)
    except SpecArgumentError as e:
        raise DiagramError(f"unit costs cannot price k={k}{'' if measured else ' (schematic)'}: {e}") from None


LEGEND_LINE_PX = 19     # one legend entry's line at the figures' 12 px font


def _timeline_figure(rows, measured: bool, u, title: str, height: int | None):
    """rows: [(row label, [(phase, label, ms)])], drawn top to bottom as horizontal bars."""
    colors = _phase_colors()
    colors["greedy"] = "#444444"
    ylabels = [r[0] for r in rows]
    # Room for the legend as one column, one entry a line: in a page-wide figure its long labels
    # do not fit two to a line, and a legend taller than its room would lift the provenance strip
    # onto it. (A wide window leaves a gap above the legend instead.)
    legend_px = LEGEND_LINE_PX * len({ph for _, segs in rows for ph, _, _ in segs}) + 14
    height = height or (250 + 72 * len(rows) + legend_px - 90)
    unit = "ms" if measured else "× one step"
    xtitle = (f"ms (unit costs measured on {u.meta.get('device', 'the device')})" if measured
              else "time in M=1 steps: schematic, not measured")
    fig = figure(title, height=height, barmode="overlay", bargap=0.5,
                 xaxis=dict(title=xtitle, rangemode="tozero", zeroline=False),
                 yaxis=dict(range=[len(rows) - 0.5, -0.9], categoryorder="array", categoryarray=ylabels,
                            title=None),                # headroom above the first row for short labels
                 uniformtext=dict(minsize=9, mode="hide"), hovermode="closest")
    fig.update_layout(margin=dict(t=70))
    legend_below(fig, legend_px, 50, left=110, right=100)
    plot_px = height - fig.layout.margin.t - fig.layout.margin.b
    by_phase: dict = {}
    totals, small = [], []
    longest = max([sum(m for _, _, m in segs) for _, segs in rows] + [1e-12])
    for ylab, segs in rows:
        t = 0.0
        for ph, label, ms in segs:
            if ph == "undo" and ms < 0.04 * longest:   # too short to read: say it above the bar
                small.append((t + ms / 2, ylab, f"{label}: {ms:.2g} {'ms' if measured else 'steps'}"))
            d = by_phase.setdefault(ph, {"x": [], "base": [], "y": [], "text": []})
            d["x"].append(ms)
            d["base"].append(t)
            d["y"].append(ylab)
            d["text"].append(label)
            t += ms
        totals.append((ylab, t))
    for ph in ("draft", "mark", "verify", "bookkeeping", "undo", "replay", "sync", "greedy"):
        if ph not in by_phase:
            continue
        d = by_phase[ph]
        fig.add_bar(x=d["x"], base=d["base"], y=d["y"], orientation="h", name=PHASE_LABELS[ph], legendgroup=ph,
                    marker=dict(color=colors[ph], line=dict(color="white", width=1.5)), text=d["text"],
                    textposition="inside", insidetextanchor="middle", textangle=0,
                    hovertemplate="%{text}: %{x:.3g} " + unit + "<extra></extra>", meta={"phase": ph})
    fig.add_scatter(x=[t for _, t in totals], y=[y for y, _ in totals], mode="text", name="round total",
                    text=["  " + ms_label(t, unit) for _, t in totals], textposition="middle right",
                    showlegend=False, hoverinfo="skip", cliponaxis=False)
    for x, ylab, text in small:                    # just above its bar: the bar is half of a row
        fig.add_annotation(x=x, y=ylab, text="▼ " + text, showarrow=False, yanchor="bottom", xanchor="left",
                           xshift=-5, yshift=0.25 * plot_px / (len(rows) + 0.4) + 1,
                           font=dict(size=10, color="#a05000"))
    if not measured:
        fig.add_annotation(text="schematic lengths (not measured): pass unit_costs= for measured ones",
                           xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom",
                           showarrow=False, font=dict(size=11, color="#777"))
    return fig


def _greedy_row(n: int, u) -> tuple:
    adv = advance(n)
    return ("greedy", [("greedy", f"step {j + 1}", u.greedy_ms_per_token) for j in range(adv)])


def round_timeline(policy, k: int = 3, n_ok: int = 1, unit_costs=None, *, pairing="article",
                   greedy: bool = True, title: str | None = None, height: int | None = None):
    """One speculative round of `policy` ('replay', 'flex-replay', 'checkpoint', 'input-cache')
    with k drafts accepting n_ok, as a timeline: draft -> (mark) -> verify -> accept -> finalise
    (rollback + replay | select | fold) -> MTP sync, and below it greedy decoding of the same
    max(n_ok, 1) tokens. Bar lengths are the cost model's (spec.round_cost) for unit_costs (a
    spec.UnitCosts or its dict); without them a schematic set of costs, labelled as such.
    pairing: 'article' (k MTP steps, n_ok may be 0) or 'trained' (d_1 free, n_ok >= 1)."""
    pol, pr = _policy(policy), _pairing(pairing)
    k = _int(k, "k", 1, K_MAX)
    n = _n_ok(n_ok, k, pr)
    u, measured = _units(unit_costs)
    _check_priced(pol, u, k, measured)
    rows = [(pol.name, _segments(pol, pr, k, n, u))]
    if greedy:
        rows.append(_greedy_row(n, u))
    title = title or (f"One round of {pol.name}: k = {k}, n_ok = {n} ({pr.value} pairing)"
                      + ("" if measured else ", schematic"))
    return _timeline_figure(rows, measured, u, title, height)


def round_timelines(k: int = 3, n_ok: int = 1, unit_costs=None, *, pairing="article", greedy: bool = True,
                    title: str | None = None, height: int | None = None):
    """round_timeline for all four policies stacked on one time axis (and greedy decoding of the
    same tokens below them). A policy whose calls the unit costs did not measure (older results
    files have no verify_cached/fold) gets an empty row saying so."""
    pr = _pairing(pairing)
    k = _int(k, "k", 1, K_MAX)
    n = _n_ok(n_ok, k, pr)
    u, measured = _units(unit_costs)
    rows, missing = [], []
    for name in POLICY_NAMES:
        pol = _policy(name)
        try:
            _check_priced(pol, u, k, measured)
        except DiagramError:
            if pol.priced_by(u):
                raise
            missing.append(name)
            rows.append((name, []))
            continue
        rows.append((name, _segments(pol, pr, k, n, u)))
    if len(missing) == len(POLICY_NAMES):
        raise DiagramError("the unit costs price none of the policies")
    if greedy:
        rows.append(_greedy_row(n, u))
    title = title or (f"One round, four ways to finish it: k = {k}, n_ok = {n} ({pr.value} pairing)"
                      + ("" if measured else ", schematic"))
    fig = _timeline_figure(rows, measured, u, title, height)
    for name in missing:
        fig.add_annotation(text="not measured in these unit costs", x=0, y=name, xanchor="left", showarrow=False,
                           font=dict(size=11, color="#999"))
    return fig


# ---- shapes on a blank canvas ------------------------------------------------------------------------
