"""What every diagram shares: argument checks that name the problem, colours, byte labels, legends."""
from __future__ import annotations


from kestrel.errors import KestrelError
from kestrel.inputs import is_int
from kestrel.ops.linear import ROWS
from kestrel.speculative.policy import POLICIES
from kestrel.speculative import Policy, Pairing, UnitCosts
from ..plots import PHASE_COLORS, POLICY_COLORS, figure

POLICY_NAMES = tuple(POLICIES)     # every policy the driver knows, in its order
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
    name = getattr(policy, "name", policy)
    if name not in POLICY_NAMES:
        raise DiagramError(f"unknown policy {policy!r}; known: {POLICY_NAMES}")
    return Policy.parse(name)


def _pairing(pairing):
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
    ms = range(1, K_MAX + 1)
    batch = {m: 1.0 + 0.12 * (m - 1) for m in ms}
    return UnitCosts(step=1.0, step_m=batch, ckpt={m: 1.03 * v for m, v in batch.items()},
                     cached={m: 1.01 * v for m, v in batch.items()},
                     fold={n: (0.0 if n == 0 else 0.06 + 0.05 * n) for n in range(0, K_MAX + 1)},
                     draft=0.3, mtp={m: 0.3 + 0.03 * (m - 1) for m in ms}, mark=0.18, rollback=0.18,
                     select=0.01, truncate=0.01, argmax=0.02, bookkeeping=0.05, meta={"schematic": True})


# ---- colours ---------------------------------------------------------------------------------------
def _phase_colors() -> dict:
    return dict(PHASE_COLORS)


def _policy_color(name: str) -> str:
    return POLICY_COLORS.get(name, "#17becf")       # input-cache: teal


def _fmt_bytes(n: float) -> str:
    for unit, f in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{int(n)} B"


def legend_below(fig, legend_px: int, axis_px: int = 50, *, left: int | None = None, right: int = 20):
    """Put the legend (horizontal) under the plot, anchored to the figure's bottom edge rather than
    to the plot area, leaving room below it for a provenance strip (kestrel.lab.plots adds one there
    later, which shrinks the plot but cannot move the legend onto it)."""
    h = fig.layout.height or 420
    reserve = 44                                     # the provenance strip, one or two lines
    fig.update_layout(legend=dict(orientation="h", yref="container", yanchor="bottom", y=reserve / h, x=0,
                                  xanchor="left", traceorder="normal"),
                      margin=dict(b=reserve + legend_px + axis_px, r=right, **({} if left is None else {"l": left})))
    return fig


# ---- a round as segments ---------------------------------------------------------------------------


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
