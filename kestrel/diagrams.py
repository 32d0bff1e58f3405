"""Diagrams of the mechanism, drawn by code: one speculative round as a timeline per policy, the
GDN state ring with the slots a verify writes and the one a round keeps, and the KV cursors
beside the MTP head's own slot. Each function returns a plotly figure; show it with
``kestrel.plots.show`` (offline, like every figure of the book)::

    from kestrel import diagrams
    from kestrel.plots import show
    show(diagrams.round_timeline("replay", k=3, n_ok=1))          # schematic lengths
    show(diagrams.round_timelines(k=3, n_ok=2, unit_costs=u))     # lengths from measured UnitCosts
    show(diagrams.state_ring(nslots=4, live=0, k=3, n_ok=1))      # slot live+1+j per row, keep live+n_ok
    show(diagrams.state_ring(k=3, n_ok=1, policy="input-cache", cfg=model.cfg))   # bytes to scale
    show(diagrams.cursors(pos=12, k=3, n_ok=1))                   # cursor lands on pos+max(n_ok, 1)

The numbers drawn are the engine's own rules (kestrel/engine.py, kestrel/spec/): a checkpointed
verify writes row j's state into slot (live + 1 + j) mod nslots and accepting n_ok makes slot
(live + n_ok) mod nslots live; a verify at the cursor pos appends rows pos..pos+k-1 and the round
leaves the cursor at pos + max(n_ok, 1) (n_ok = 0 still consumes a_p); the MTP cursor starts the
round at p = pos - 1 and ends it at p + max(n_ok, 1). tests/test_diagrams.py checks each against
a running engine. The lengths of a timeline are the cost model's (spec.round_cost) for the unit
costs given, or a schematic set of costs that says so on the figure.
"""
from __future__ import annotations

import math

from .errors import KestrelError
from .inputs import is_int
from .ops.linear import ROWS

__all__ = ["round_timeline", "round_timelines", "state_ring", "cursors"]

POLICY_NAMES = ("replay", "flex-replay", "checkpoint", "input-cache")
K_MAX = ROWS                        # the widest verify the engine runs (mmax <= ROWS)


class DiagramError(KestrelError):
    """A diagram asked for with arguments the engine could not be in (k, n_ok, slots, positions)."""


# ---- argument checks -----------------------------------------------------------------------------
def _int(x, name: str, lo: int, hi: int | None = None) -> int:
    if not is_int(x):
        raise DiagramError(f"{name} must be an int, got {x!r}")
    if x < lo or (hi is not None and x > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise DiagramError(f"{name}={x} outside {rng}")
    return int(x)


def _policy(policy):
    from .spec import Policy
    name = getattr(policy, "name", policy)
    if name not in POLICY_NAMES:
        raise DiagramError(f"unknown policy {policy!r}; known: {POLICY_NAMES}")
    return Policy.parse(name)


def _pairing(pairing):
    from .spec import Pairing
    try:
        return Pairing.parse(pairing)
    except KestrelError as e:
        raise DiagramError(str(e)) from None


def _n_ok(n_ok, k: int, pairing, allow_none: bool = False):
    if n_ok is None and allow_none:
        return None
    lo = pairing.min_nok if pairing is not None else 0
    why = f" (the {pairing.value} pairing accepts d_1 always)" if lo else ""
    if not is_int(n_ok):
        raise DiagramError(f"n_ok must be an int in [{lo}, k={k}], got {n_ok!r}")
    if not lo <= n_ok <= k:
        raise DiagramError(f"n_ok={n_ok} outside [{lo}, k={k}]{why}")
    return int(n_ok)


def _units(unit_costs):
    """-> (UnitCosts, measured?)"""
    from .spec import UnitCosts
    if unit_costs is None:
        return _schematic_units(), False
    if isinstance(unit_costs, UnitCosts):
        return unit_costs, True
    if isinstance(unit_costs, dict):
        try:
            return UnitCosts.from_dict(unit_costs), True
        except TypeError as e:
            raise DiagramError(f"unit_costs dict is not a UnitCosts (spec.UnitCosts.to_dict()): {e}") from None
    raise DiagramError(f"unit_costs must be None, a spec.UnitCosts or its dict, got {type(unit_costs).__name__}")


def _schematic_units():
    """Unit costs in units of one M=1 step, shaped like a bandwidth-bound device (a batch of M rows
    costs a little more than one row, a draft step a third of a step). For pictures only."""
    from .spec import UnitCosts
    ms = range(1, K_MAX + 1)
    batch = {m: 1.0 + 0.12 * (m - 1) for m in ms}
    return UnitCosts(step=1.0, step_m=batch, ckpt={m: 1.03 * v for m, v in batch.items()},
                     cached={m: 1.01 * v for m, v in batch.items()},
                     fold={n: (0.0 if n == 0 else 0.06 + 0.05 * n) for n in range(0, K_MAX + 1)},
                     draft=0.3, mtp={m: 0.3 + 0.03 * (m - 1) for m in ms}, mark=0.18, rollback=0.18,
                     select=0.01, truncate=0.01, argmax=0.02, bookkeeping=0.05, meta={"schematic": True})


# ---- colours ---------------------------------------------------------------------------------------
def _phase_colors() -> dict:
    from .widgets.figures import PHASE_COLORS
    return dict(PHASE_COLORS)


def _policy_color(name: str) -> str:
    from .widgets.figures import POLICY_COLORS
    return POLICY_COLORS.get(name, "#17becf")       # input-cache: teal


def _fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{int(n)} B"


def legend_below(fig, legend_px: int, axis_px: int = 50, *, left: int | None = None, right: int = 20):
    """Put the legend (horizontal) under the plot, anchored to the figure's bottom edge rather than
    to the plot area, leaving room below it for a provenance strip (kestrel.plots adds one there
    later, which shrinks the plot but cannot move the legend onto it)."""
    h = fig.layout.height or 420
    reserve = 44                                     # the provenance strip, one or two lines
    fig.update_layout(legend=dict(orientation="h", yref="container", yanchor="bottom", y=reserve / h, x=0,
                                  xanchor="left", traceorder="normal"),
                      margin=dict(b=reserve + legend_px + axis_px, r=right, **({} if left is None else {"l": left})))
    return fig


# ---- a round as segments ---------------------------------------------------------------------------
PHASE_LABELS = {
    "draft": "draft (MTP steps)",
    "mark": "mark (copy the state)",
    "verify": "verify (k rows at once)",
    "bookkeeping": "accept (argmax, compare, emit)",
    "rollback": "undo: rollback / select / fold",
    "replay": "replay (or the n_ok = 0 step)",
    "sync": "MTP sync (truncate, rewrite)",
    "greedy": "greedy decoding, same tokens",
}


def _segments(policy, pairing, k: int, n: int, u) -> list:
    """[(phase, label, ms)] of one round in time order; the ms add up to spec.round_cost."""
    from .spec.schedule import advance
    c = policy.cost(u, k, n)
    seg = []
    first = 1 + pairing.offset
    for j in range(pairing.mtp_steps(k)):
        seg.append(("draft", f"draft d{first + j}", u.draft))
    if "mark" in c:
        seg.append(("mark", "mark: copy S, hist", c["mark"]))
    what = {"replay": "step_m", "flex-replay": "step_m", "checkpoint": "verify_checkpointed",
            "input-cache": "verify_cached"}[policy.name]
    seg.append(("verify", f"verify {k} row{'s' * (k > 1)} ({what})", c["verify"]))
    seg.append(("bookkeeping", f"accept: n_ok = {n}", u.bookkeeping))
    if policy.name in ("replay", "flex-replay"):
        if n < k:
            seg.append(("rollback", "rollback: copy S, hist back", c["rollback"]))
            if policy.name == "replay":
                for j in range(advance(n)):
                    seg.append(("replay", f"replay row {j + 1} (M=1)" if n else "step a_p (M=1)", u.step))
            else:
                label = f"replay {n} row{'s' * (n > 1)} (one step_m)" if n else "step a_p (M=1)"
                seg.append(("replay", label, c["replay"]))
    elif policy.name == "checkpoint":
        seg.append(("rollback", f"select slot live+{n}", c["rollback"]))
        if n == 0:
            seg.append(("replay", "step a_p (M=1)", c["replay"]))
    else:
        seg.append(("rollback", f"fold {n} cached row{'s' * (n != 1)}", c["rollback"]))
        if n == 0:
            seg.append(("replay", "step a_p (M=1)", c["replay"]))
    r = pairing.rewrite_rows(k, n)
    sync = u.truncate + (u.get("mtp", r) if r > 0 else 0.0)
    seg.append(("sync", "MTP sync: truncate" + (f" + rewrite {r} row{'s' * (r > 1)}" if r > 0 else ""), sync))
    return seg


def _check_priced(policy, u, k: int, measured: bool):
    from .spec import SpecArgumentError
    if not policy.priced_by(u):
        raise DiagramError(f"these unit costs did not measure the {policy.name} policy's calls (verify_cached, "
                           f"fold_cached): measure them again with spec.measure_unit_costs")
    try:
        for m in range(1, k + 1):
            u.get("step_m", m)
        policy.cost(u, k, 0)
        u.get("mtp", max(k - 1, 1))
    except SpecArgumentError as e:
        raise DiagramError(f"unit costs cannot price k={k}{'' if measured else ' (schematic)'}: {e}") from None


def _timeline_figure(rows, measured: bool, u, title: str, height: int | None):
    """rows: [(row label, [(phase, label, ms)])], drawn top to bottom as horizontal bars."""
    from .plots import figure
    colors = _phase_colors()
    colors["greedy"] = "#444444"
    ylabels = [r[0] for r in rows]
    height = height or (250 + 72 * len(rows))
    unit = "ms" if measured else "× one step"
    xtitle = (f"ms (unit costs measured on {u.meta.get('device', 'the device')})" if measured
              else "time in M=1 steps: schematic, not measured")
    fig = figure(title, height=height, barmode="overlay", bargap=0.5,
                 xaxis=dict(title=xtitle, rangemode="tozero", zeroline=False),
                 yaxis=dict(range=[len(rows) - 0.5, -0.9], categoryorder="array", categoryarray=ylabels,
                            title=None),                # headroom above the first row for short labels
                 uniformtext=dict(minsize=9, mode="hide"), hovermode="closest")
    fig.update_layout(margin=dict(t=70))
    legend_below(fig, 90, 50, left=110, right=100)
    by_phase: dict = {}
    totals, small = [], []
    longest = max([sum(m for _, _, m in segs) for _, segs in rows] + [1e-12])
    for ylab, segs in rows:
        t = 0.0
        for ph, label, ms in segs:
            if ph == "rollback" and ms < 0.04 * longest:   # too short to read: say it above the bar
                small.append((t + ms / 2, ylab, f"{label}: {ms:.2g} {'ms' if measured else 'steps'}"))
            d = by_phase.setdefault(ph, {"x": [], "base": [], "y": [], "text": []})
            d["x"].append(ms)
            d["base"].append(t)
            d["y"].append(ylab)
            d["text"].append(label)
            t += ms
        totals.append((ylab, t))
    for ph in ("draft", "mark", "verify", "bookkeeping", "rollback", "replay", "sync", "greedy"):
        if ph not in by_phase:
            continue
        d = by_phase[ph]
        fig.add_bar(x=d["x"], base=d["base"], y=d["y"], orientation="h", name=PHASE_LABELS[ph], legendgroup=ph,
                    marker=dict(color=colors[ph], line=dict(color="white", width=1.5)), text=d["text"],
                    textposition="inside", insidetextanchor="middle", textangle=0,
                    hovertemplate="%{text}: %{x:.3g} " + unit + "<extra></extra>", meta={"phase": ph})
    fig.add_scatter(x=[t for _, t in totals], y=[y for y, _ in totals], mode="text", name="round total",
                    text=[f"  {t:.3g} {unit}" for _, t in totals], textposition="middle right",
                    showlegend=False, hoverinfo="skip", cliponaxis=False)
    for x, ylab, text in small:                    # just above its bar: the bar is half of a row
        fig.add_annotation(x=x, y=ylab, text="▼ " + text, showarrow=False, yanchor="bottom", xanchor="left",
                           xshift=-5, yshift=0.25 * (height - 254) / (len(rows) + 0.4) + 1,
                           font=dict(size=10, color="#a05000"))
    if not measured:
        fig.add_annotation(text="schematic lengths (not measured): pass unit_costs= for measured ones",
                           xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom",
                           showarrow=False, font=dict(size=11, color="#777"))
    return fig


def _greedy_row(n: int, u) -> tuple:
    from .spec.schedule import advance
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
ROLE_STYLE = {           # role -> (fill, line colour, line width, dash)
    "live": ("#9ecae1", "#08519c", 2, "solid"),
    "written": ("#c7e9c0", "#238b45", 2, "solid"),
    "selected": ("#fdd0a2", "#d94801", 4, "solid"),
    "discarded": ("#f0f0f0", "#999999", 1.5, "dash"),
    "unused": ("#ffffff", "#bbbbbb", 1, "dot"),
    "snapshot": ("#fcbba1", "#cb181d", 2, "solid"),
    "cached": ("#dadaeb", "#6a51a3", 2, "solid"),
    "folded": ("#bcbddc", "#3f007d", 4, "solid"),
    "dropped": ("#f0f0f0", "#999999", 1.5, "dash"),
}
ROLE_DOC = {
    "live": "live slot (the state at p)",
    "written": "written by the verify (state after row j)",
    "selected": "kept: the live slot of the next round",
    "discarded": "not kept (rewritten by a later verify)",
    "unused": "not used by this policy",
    "snapshot": "mark()'s copy of the live state",
    "cached": "cached inputs of a draft row",
    "folded": "folded into the live state",
    "dropped": "dropped (not accepted)",
}


class _Canvas:
    def __init__(self):
        self.rects, self.texts = [], []

    def rect(self, x0, y0, x1, y1, role, name, **extra):
        self.rects.append(dict(x0=x0, y0=y0, x1=x1, y1=y1, role=role, name=name, **extra))

    def text(self, x, y, s, size=12, color="#222", anchor="middle center"):
        self.texts.append((x, y, s, size, color, anchor))

    def figure(self, title, height, xr, yr, legend_roles, equal=True, **layout):
        from .plots import figure
        fig = figure(title, height=height, showlegend=bool(legend_roles), **layout)
        fig.update_layout(margin=dict(l=20, r=20, t=70), plot_bgcolor="white")
        legend_below(fig, 24 * ((len(legend_roles) + 2) // 3), 6, left=20)
        fig.update_xaxes(visible=False, range=list(xr))
        fig.update_yaxes(visible=False, range=list(yr))
        if equal:
            fig.update_yaxes(scaleanchor="x", scaleratio=1)
        shapes = []
        for r in self.rects:
            fill, line, width, dash = ROLE_STYLE[r["role"]]
            width = min(width, 1) if r.get("thin") else width
            shapes.append(dict(type="rect", x0=r["x0"], y0=r["y0"], x1=r["x1"], y1=r["y1"], name=r["name"],
                               fillcolor=fill, line=dict(color=line, width=width, dash=dash), layer="below"))
        fig.update_layout(shapes=shapes)               # in one go: add_shape per rectangle is slow
        for anchor in sorted({t[5] for t in self.texts}):
            ts = [t for t in self.texts if t[5] == anchor]
            fig.add_scatter(x=[t[0] for t in ts], y=[t[1] for t in ts], text=[t[2] for t in ts], mode="text",
                            textposition=anchor, textfont=dict(size=[t[3] for t in ts], color=[t[4] for t in ts]),
                            hoverinfo="skip", showlegend=False, name=f"labels ({anchor})", cliponaxis=False)
        for role in legend_roles:            # the colour key
            fill, line, width, dash = ROLE_STYLE[role]
            fig.add_scatter(x=[None], y=[None], mode="markers", name=ROLE_DOC[role], legendgroup=role,
                            marker=dict(symbol="square", size=14, color=fill, line=dict(color=line, width=2)))
        return fig


# ---- the GDN state ring ------------------------------------------------------------------------------
def _ring_stage(policy: str, nslots: int, live: int, k: int, n_ok):
    """One picture of the ring: (role per slot, label per slot). n_ok None: after the verify;
    else after the policy's finalise step."""
    roles, labels = ["unused"] * nslots, [""] * nslots
    if n_ok is None:
        roles[live] = "live"
        labels[live] = {"checkpoint": "live<br>(untouched)", "input-cache": "live<br>(only read)"}.get(
            policy, "live<br>(in place)")
        if policy == "checkpoint":
            for j in range(k):
                s = (live + 1 + j) % nslots
                roles[s], labels[s] = "written", f"row {j}<br>(after d{j + 1})"
        return roles, labels
    if policy == "checkpoint":
        sel = (live + n_ok) % nslots
        for j in range(k):
            s = (live + 1 + j) % nslots
            roles[s], labels[s] = "discarded", f"row {j}"
        if sel != live:
            roles[live], labels[live] = "discarded", "was live"
        roles[sel] = "selected"
        labels[sel] = "live<br>(the original)" if n_ok == 0 else f"live<br>(after d{n_ok})"
        return roles, labels
    roles[live] = "selected"
    if policy == "input-cache":
        labels[live] = f"live<br>+ {n_ok} folded" if n_ok else "live<br>(nothing folded)"
    else:
        labels[live] = "live<br>(as verified)" if n_ok == k else "live<br>(restored)"
    return roles, labels


def _finalise_text(policy: str, k: int, n_ok: int) -> str:
    adv = max(n_ok, 1)
    step = "; then one step of a_p" if n_ok == 0 else ""
    if policy == "checkpoint":
        return f"after select_checkpoint({n_ok}){step}"
    if policy == "input-cache":
        return f"after fold_cached({n_ok}){step}"
    if n_ok == k:
        return "all accepted: nothing to undo"
    replay = f"{adv} M=1 step{'s' * (adv > 1)}" if policy == "replay" or n_ok == 0 else f"one step_m of {n_ok}"
    return f"after rollback() + {replay}"


def state_ring(nslots: int = 4, live: int = 0, k: int = 3, n_ok: int | None = None, policy: str = "checkpoint",
               *, cfg=None, title: str | None = None, height: int | None = None):
    """The GDN state ring of `nslots` slots (the engine holds mmax + 1) with its live slot.

    'checkpoint': the k slots a checkpointed verify writes (row j -> slot (live + 1 + j) mod
    nslots) and, once n_ok is given, beside it the ring after select_checkpoint(n_ok): slot
    (live + n_ok) mod nslots is live (n_ok = 0: the original, untouched). 'input-cache': the live
    slot (the verify only reads it) and k cached input rows, the first n_ok of them folded into
    the live slot. 'replay' / 'flex-replay': the live slot, updated in place, and mark()'s one
    copy of it. To the right, what the policy keeps besides the live state, as bars: to scale in
    bytes when a Config is given (cfg=), schematic otherwise."""
    nslots = _int(nslots, "nslots", 2, K_MAX + 1)
    live = _int(live, "live", 0, nslots - 1)
    k = _int(k, "k", 1, nslots - 1)
    n_ok = _n_ok(n_ok, k, None, allow_none=True)
    pol = _policy(policy)
    if cfg is not None and not (hasattr(cfg, "gdn_state_bytes") and hasattr(cfg, "gdn_layers")):
        raise DiagramError(f"cfg must be a kestrel Config (model.cfg or kestrel.PRESETS[...]), got {type(cfg).__name__}")
    from .spec import cached_row_bytes, recurrent_bytes
    cv = _Canvas()
    R = max(1.35, nslots * 1.25 / (2 * math.pi))
    h = 0.46                                           # half a slot's side
    stages = [("after the verify", None)] + ([] if n_ok is None else [("after accept", n_ok)])
    heading = {None: "after the verify"}
    if n_ok is not None:
        heading[n_ok] = _finalise_text(pol.name, k, n_ok)
    centres, cx = {}, 0.0
    for stage, n in stages:
        roles, labels = _ring_stage(pol.name, nslots, live, k, n)
        for i in range(nslots):
            a = math.pi / 2 - 2 * math.pi * i / nslots     # slot 0 on top, clockwise
            x, y = cx + R * math.cos(a), R * math.sin(a)
            centres[stage, i] = (x, y)
            cv.rect(x - h, y - h, x + h, y + h, roles[i], f"{stage}: slot {i} ({roles[i]})")
            cv.text(x, y + h + 0.04, f"slot {i}", size=11, color="#333", anchor="top center")
            if labels[i]:
                cv.text(x, y, labels[i], size=10)
        if pol.name in ("replay", "flex-replay"):
            snap = "snapshot" if n is None or n == k else "discarded"
            cv.rect(cx - 0.5, -0.3, cx + 0.5, 0.3, snap, f"{stage}: the snapshot ({snap})")
            cv.text(cx, 0, "mark()'s copy" if n is None or n == k else "copied back<br>(now invalid)", size=10)
        else:
            cv.text(cx, 0, f"{nslots} slots", size=11, color="#777")
        cv.text(cx, R + h + 0.55, heading[n], size=12, color="#222", anchor="top center")
        cx += 2 * (R + h) + 1.3
    # beside the rings: the live state and what the policy keeps, to scale (cfg) or schematic
    s_bytes = recurrent_bytes(cfg) if cfg is not None else None
    below = len(stages) > 1                            # two rings: the bytes go under them
    x0, W = (-R - h, cx - 1.3 - (-R - h) - 3.0) if below else (cx - R - h - 0.2, 3.0)
    if pol.name == "checkpoint":
        unit, per = 1.0, s_bytes
        kept = [f"row {j}: a whole state" for j in range(k)]
    elif pol.name == "input-cache":
        unit = (cached_row_bytes(cfg) / s_bytes) if cfg is not None else 0.08
        per = cached_row_bytes(cfg) if cfg is not None else None
        kept = [f"row {j} (d{j + 1})" for j in range(k)]
    else:
        unit, per = 1.0, s_bytes
        kept = ["mark(): one copy of the state"]
    n_bars = 1 + len(kept)
    bar_h, gap = min(0.34, 2.2 / n_bars), 0.14
    y = -R - h - 1.25 if below else R + h - 0.35
    cv.text(x0, y + 0.45, "kept beside the live state", size=12, anchor="top right")
    cv.rect(x0, y - bar_h, x0 + W, y, "live", "bytes: the live state")
    cv.text(x0, y + 0.03, "live state S + conv window" + (f": {_fmt_bytes(s_bytes)}" if s_bytes else ""), size=10,
            anchor="top right")
    y -= 0.2
    for i, lab in enumerate(kept):
        y -= bar_h + gap
        w = W * unit                                   # to scale against the live state's bar
        role = {"checkpoint": "written", "input-cache": "cached"}.get(pol.name, "snapshot")
        if n_ok is not None:
            if pol.name == "input-cache":
                role = "folded" if i < n_ok else "dropped"
            elif pol.name == "checkpoint":
                role = "selected" if i + 1 == n_ok else "discarded"
            elif n_ok < k:
                role = "discarded"
        cv.rect(x0, y - bar_h, x0 + w, y, role, f"bytes: {lab} ({role})", thin=w < 0.1)
        cv.text(x0 + w + 0.08, y - bar_h / 2, lab + (f": {_fmt_bytes(per)}" if per else ""), size=10,
                anchor="middle right")
    y -= bar_h + 0.45
    if cfg is not None:
        kept_total = pol.state_traffic(cfg, k, k)["kept"]
        note = f"{cfg.name}, to scale: {_fmt_bytes(kept_total)} kept, {kept_total / s_bytes:.2g}× the state"
        if pol.name == "input-cache":
            note += (f"<br>a row: q|k|v, z, b, a of each GDN layer, "
                     f"{_fmt_bytes(cached_row_bytes(cfg) / max(1, len(cfg.gdn_layers)))} a layer")
    else:
        note = "lengths schematic: pass cfg= (a Config) for bytes to scale"
    cv.text(x0, y, note, size=10, color="#666", anchor="middle right")
    right = cx - 1.3 if below else x0 + W + (3.9 if pol.name == "checkpoint" else 2.9)
    xr = (-R - h - 0.3, max(right, x0 + W + 2.6))
    yr = (min(-R - h - 0.3, y - 0.5), R + h + 0.75)
    if height is None:                                 # about as tall as a ~700 px wide page needs
        height = int(150 + 700 * (yr[1] - yr[0]) / (xr[1] - xr[0]))
    used = {c["role"] for c in cv.rects}
    roles_used = [r for r in ROLE_DOC if r in used]
    if title is None:
        what = {"checkpoint": "per-row checkpoints", "input-cache": "input cache",
                "replay": "snapshot + replay", "flex-replay": "snapshot + batched replay"}[pol.name]
        sel = (live + n_ok) % nslots if (n_ok is not None and pol.name == "checkpoint") else live
        title = f"The GDN state, {what}: k = {k}, {nslots} slots" + (
            "" if n_ok is None else f", n_ok = {n_ok}: slot {sel} is live next")
    fig = cv.figure(title, height, xr, yr, roles_used)
    if pol.name == "checkpoint" and n_ok:
        (xa, ya), (xb, yb) = centres["after the verify", live], centres["after the verify", (live + n_ok) % nslots]
        fig.add_annotation(x=xb, y=yb, ax=xa, ay=ya, xref="x", yref="y", axref="x", ayref="y", text="",
                           showarrow=True, arrowhead=3, arrowsize=1.3, arrowwidth=2.5, arrowcolor="#d94801",
                           standoff=26, startstandoff=26)
    fig.update_layout(meta={"policy": pol.name, "nslots": nslots, "live": live, "k": k, "n_ok": n_ok,
                            "selected": None if n_ok is None else
                            ((live + n_ok) % nslots if pol.name == "checkpoint" else live)})
    return fig


# ---- the KV cursors and the MTP slot -----------------------------------------------------------------
def _mtp_rows(pairing, k: int, n: int, m0: int):
    """The MTP slot through a round: (rows the draft writes {row: input token}, cursor after the
    draft, cursor after the sync, rows the sync keeps or rewrites {row: (token, how)})."""
    from .spec.schedule import advance
    adv = advance(n)
    if pairing.offset == 0:                     # article: row m0+j holds (d_j or t_p, h)
        drafted = {m0 + j: ("t_p" if j == 0 else f"d{j}") for j in range(k)}
        after_draft = m0 + k
        kept = {m0 + i: (drafted[m0 + i], "kept") for i in range(adv)}
    else:                                       # trained: row m0+j holds (d_{j+1}, h)
        drafted = {m0 + j: f"d{j + 1}" for j in range(k - 1)}
        after_draft = m0 + k - 1
        c = min(after_draft, m0 + 1)
        kept = {r: (drafted[r], "kept") for r in range(m0, c)}
        for r in range(c, m0 + adv):
            kept[r] = (f"d{r - m0 + 1}", "rewritten")
    return drafted, after_draft, m0 + adv, kept


def cursors(pos: int = 12, k: int = 3, n_ok: int = 1, mtp_cursor: int | None = None, *, pairing="article",
            title: str | None = None, height: int = 470):
    """The main model's KV cache rows and its cursor (the visible length) through one round, and
    the MTP head's own KV slot and cursor beside it.

    pos is the cursor at the round start (the anchor p = pos - 1 has been consumed). The verify
    appends rows pos..pos+k-1 (the drafts); after accepting n_ok the cursor is pos + max(n_ok, 1)
    (for n_ok = 0 the row at pos is rewritten by the step of a_p); rows past it are invisible and
    overwritten by the next append. The MTP cursor starts at p (mtp_cursor=None) and, after the
    draft and the sync, ends at p + max(n_ok, 1). pairing as in round_timeline."""
    pr = _pairing(pairing)
    pos = _int(pos, "pos", 1, 100000)
    k = _int(k, "k", 1, K_MAX)
    n = _n_ok(n_ok, k, pr)
    m0 = pos - 1 if mtp_cursor is None else _int(mtp_cursor, "mtp_cursor", 0, pos + 4 * K_MAX)
    from .spec.schedule import advance
    adv = advance(n)
    after = pos + adv
    drafted, m_draft, m_after, m_kept = _mtp_rows(pr, k, n, m0)
    lo = max(0, min(pos, m0) - 5)
    hi = max(pos + k, m_draft, m_after) + 2
    cv = _Canvas()
    rows = [("main KV: round start", "main", 0), ("main KV: after the verify", "main", 1),
            ("main KV: after accept", "main", 2), ("MTP KV: round start", "mtp", 3),
            ("MTP KV: after the draft", "mtp", 4), ("MTP KV: after the sync", "mtp", 5)]
    ys = {i: -(i * 1.4 + (0.5 if i >= 3 else 0.0)) for i in range(6)}
    cell_h = 0.8

    def cell(i, x, role, text, color="#222"):
        y = ys[i]
        cv.rect(x + 0.05, y - cell_h / 2, x + 0.95, y + cell_h / 2, role, f"row {x} ({rows[i][0]})", row=x,
                stage=rows[i][0])
        if text:
            cv.text(x + 0.5, y, text, size=10, color=color)

    for x in range(lo, hi):
        # main model: consumed rows, the verify's draft rows, what accept keeps
        cell(0, x, "live" if x < pos else "unused", "")
        if x < pos:
            cell(1, x, "live", "")
            cell(2, x, "live", "")
        elif x < pos + k:
            d = f"d{x - pos + 1}"
            cell(1, x, "written", d)
            if x < pos + n:
                cell(2, x, "selected", d)
            elif n == 0 and x == pos:
                cell(2, x, "selected", "a_p")
            else:
                cell(2, x, "discarded", d, color="#999")
        else:
            cell(1, x, "unused", "")
            cell(2, x, "unused", "")
        # the MTP slot
        cell(3, x, "cached" if x < m0 else "unused", "")
        if x < m0:
            cell(4, x, "cached", "")
            cell(5, x, "cached", "")
        else:
            cell(4, x, "written" if x in drafted else "unused", drafted.get(x, ""))
            if x in m_kept:
                tok, how = m_kept[x]
                cell(5, x, "selected" if how == "kept" else "folded", tok)
            elif x in drafted:
                cell(5, x, "discarded", drafted[x], color="#999")
            else:
                cell(5, x, "unused", "")
    markers = [("cursor, round start", 0, pos), ("cursor, after the verify", 1, pos + k),
               ("cursor, after accept", 2, after), ("MTP cursor, round start", 3, m0),
               ("MTP cursor, after the draft", 4, m_draft), ("MTP cursor, after the sync", 5, m_after)]
    from .plots import figure  # noqa: F401  (the canvas builds the figure)
    legend = ["live", "written", "selected", "discarded", "cached", "folded"]
    xr, yr = (lo - 0.2, hi + 0.2), (ys[5] - 0.7, 1.1)
    pairing_note = {"article": "article pairing: k MTP steps, rows keep the draft-time hiddens",
                    "trained": "trained pairing: d1 free, k-1 MTP steps, rows past p rewritten from verified hiddens"}
    title = title or (f"Cursors through one round: verify at {pos}, k = {k}, n_ok = {n} → cursor {after}; "
                      f"MTP {m0} → {m_after}")
    fig = cv.figure(title, height, xr, yr, [], equal=False)
    legend_doc = {"live": "main KV row, visible", "written": "row a verify or draft wrote",
                  "selected": "row kept (visible after the round)", "discarded": "row past the cursor: invisible, "
                  "overwritten next", "cached": "MTP KV row, visible", "folded": "MTP row rewritten by the sync"}
    for role in legend:
        fill, line, width, dash = ROLE_STYLE[role]
        fig.add_scatter(x=[None], y=[None], mode="markers", name=legend_doc[role], legendgroup=role,
                        marker=dict(symbol="square", size=14, color=fill, line=dict(color=line, width=2)))
    fig.update_layout(showlegend=True, margin=dict(t=70))
    legend_below(fig, 70, 56, left=170)
    for name, i, c in markers:
        y = ys[i]
        fig.add_scatter(x=[c, c], y=[y - 0.55, y + 0.55], mode="lines", name=name, showlegend=False,
                        line=dict(color="#d62728" if i < 3 else "#6a51a3", width=4),
                        hovertemplate=f"{name}: {c}<extra></extra>", customdata=[c, c])
        fig.add_annotation(x=c, y=y + 0.55, text=f"{'MTP ' * (i >= 3)}cursor {c}", showarrow=False,
                           yanchor="bottom", xanchor="left",
                           font=dict(size=10, color="#d62728" if i < 3 else "#6a51a3"))
    fig.update_xaxes(visible=True, showgrid=False, zeroline=False, tickmode="array",
                     tickvals=[x + 0.5 for x in range(lo, hi)], ticktext=[str(x) for x in range(lo, hi)],
                     title="position (row of the cache)")
    fig.update_yaxes(visible=True, showgrid=False, zeroline=False, tickmode="array",
                     tickvals=[ys[i] for i in range(6)], ticktext=[r[0] for r in rows])
    fig.add_annotation(text=pairing_note[pr.value] + ("" if mtp_cursor is None or m0 == pos - 1 else
                                                       f"; note: the round invariant wants the MTP cursor at p = {pos - 1}"),
                       xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom", showarrow=False,
                       font=dict(size=11, color="#777"))
    fig.update_layout(meta={"pos": pos, "k": k, "n_ok": n, "cursor_after": after, "mtp_start": m0,
                            "mtp_after_draft": m_draft, "mtp_after": m_after, "pairing": pr.value})
    return fig
