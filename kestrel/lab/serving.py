"""Where each way to undo wins when many sequences decode together (chapter 8): a projection of
the byte formulas (spec.cost.serving_projection), not a measurement, the sequences that fit one
device, and the decision table ("choose X when ...") computed from chapter 8's measurements.

    from kestrel.lab import serving, undo
    rows = serving.projection_rows(cfg, k=3)                  # memory and bytes, B x context
    fits = serving.fits_rows(cfg, device_bytes, k=3)          # sequences that fit one device
    table = serving.decision_rows(undo.large_comparison(), cfg, fits)

Chapter 9 measures many sequences on a batched engine; this module only projects.
"""
from __future__ import annotations

from kestrel import speculative as spec
from kestrel.program import param_count
from kestrel.speculative.cost import serving_projection

from . import results
from .diagrams.common import POLICY_NAMES, _policy_color, legend_below
from .roofline import weight_bytes
from .undo import WAYS, fmt_bytes


# ---- choose X when ...: the decision table ------------------------------------------------------------
def decision_rows(big: dict, cfg, fits: list, k: int = 3) -> list:
    """Chapter 8's decision table: for each situation, the way the measurements (and, for many
    sequences, the projection) pick, and the numbers it rests on. The choice is computed from
    `big` (large_comparison: speedups at the 27B shape) and `fits` (fits_rows: sequences that fit
    one device, a projection, at the same k), never typed in, so a run that measures otherwise
    says otherwise. -> [{"when", "choose", "because"}]"""
    sp = {(r["schedule"], r["policy"]): r["speedup"] for r in big["rows"]}
    e16, art = "E16 profile", "article histogram"

    def best(sched, pols):
        have = [p for p in pols if (sched, p) in sp]
        return max(have, key=lambda p: sp[sched, p]) if have else None

    def x(sched, p):
        return f"{p} {sp[sched, p]:.2f}×"
    rows = []
    b = best(e16, ("replay", "flex-replay"))
    if b:
        o = "replay" if b == "flex-replay" else "flex-replay"
        rows.append({"when": "the verify keeps no state per row",
                     "choose": b, "because": f"27B, E16: {x(e16, b)} against {x(e16, o)}"})
    b = best(e16, POLICY_NAMES)
    if b:
        second = max((p for p in POLICY_NAMES if p != b and (e16, p) in sp), key=lambda p: sp[e16, p],
                     default=b)
        tie = second != b and sp[e16, second] >= 0.97 * sp[e16, b]          # a tie: within 3 %
        rows.append({"when": "one sequence, E16-like acceptance",
                     "choose": f"{b} or {second}" if tie else b,
                     "because": f"27B, E16: {x(e16, b)}, {x(e16, second)}"
                                + (" (within 3 %)" if tie else " next")})
    kept = {p: spec.Policy.parse(p).state_traffic(cfg, k, k)["kept"] for p in ("checkpoint", "input-cache")}
    fit = {r["policy"]: r for r in fits}
    contexts = [c for c in fits[0] if c.startswith("L = ")]
    short, long = contexts[0], contexts[-1]
    many = max(("checkpoint", "input-cache"), key=lambda p: (fit[p][short], -kept[p]))
    rows.append({"when": f"many sequences, short contexts ({short})", "choose": many,
                 "because": (f"keeps {fmt_bytes(kept['input-cache'])} a sequence against "
                             f"{fmt_bytes(kept['checkpoint'])}; {fit['input-cache'][short]} against "
                             f"{fit['checkpoint'][short]} sequences fit (projected; chapter 9 runs batches)")})
    same = len({fit[p][long] for p in fit}) == 1
    rows.append({"when": f"many sequences, long contexts ({long})",
                 "choose": "any: decide by speed" if same else max(fit, key=lambda p: fit[p][long]),
                 "because": "the KV cache dominates: " + ", ".join(f"{p} {fit[p][long]}" for p in fit)
                            + " sequences fit (projected)"})
    b = best(art, POLICY_NAMES)
    if b:
        rows.append({"when": "acceptance as low as the article's",
                     "choose": b if sp[art, b] >= 1 else "greedy (k = \"auto\" declines)",
                     "because": f"27B, article histogram: at best {x(art, b)}"})
    return rows


# ---- where each wins: a projection of the byte formulas -----------------------------------------------
def projection_rows(cfg, k: int = 3, n: float | None = None, batches=(1, 4, 16, 64, 256),
                    contexts=(4096, 32768, 131072)) -> list:
    """spec.cost.serving_projection for B sequences at context L (n: the mean n_ok, default the
    E16 profile's on the trained pairing). A projection of the formulas, not a measurement."""
    n = spec.mean_nok(spec.E16_PROFILE, k, "trained") if n is None else n
    return serving_projection(cfg, k, n, batches=batches, contexts=contexts, read_bytes=step_read_bytes(cfg))


def step_read_bytes(cfg) -> int:
    """Bytes of weights one decode step reads (bf16 matrices, fp32 vectors, one row of an untied
    embedding table): chapter 1's "a step reads" column, which a round's bytes are set against."""
    return weight_bytes(cfg, "bf16")


def projection_figure(cfg, what: str = "memory", k: int = 3, n: float | None = None,
                      batches=(1, 2, 4, 8, 16, 32, 64, 128, 256), contexts=(4096, 32768, 131072), *,
                      device_bytes: float | None = None, height: int = 460):
    """A projection of the byte formulas (spec.cost.serving_projection), not a measurement, for
    B sequences decoding together. what='memory': the memory held (weights + every sequence's
    live state, what its policy keeps and its KV cache of L tokens), one panel per context L;
    device_bytes draws one device's memory. what='bytes': the recurrent-state bytes one round
    reads and writes against the weights read once a round (these do not depend on L)."""
    from plotly.subplots import make_subplots
    if what not in ("memory", "bytes"):
        raise spec.SpecArgumentError(f"what must be 'memory' or 'bytes', got {what!r}")
    rows = projection_rows(cfg, k, n, batches, contexts)
    what_t = {"memory": "memory held", "bytes": "bytes moved per round"}[what]
    # one line above the memory panels' own titles; two for the single bytes panel, whose one
    # line did not fit a narrow page
    title = f"{cfg.name}, k = {k}: {what_t}" + (" (a projection, not a measurement)" if what == "memory"
                                                else "<br><sup>a projection, not a measurement</sup>")
    if what == "memory":
        fig = make_subplots(rows=1, cols=len(contexts), horizontal_spacing=0.07,
                            subplot_titles=[f"context L = {L // 1024}K tokens" for L in contexts])
        groups = [("snapshot + replay", "replay"), ("checkpoint", "checkpoint"), ("input-cache", "input-cache")]
        for ci, L in enumerate(contexts):
            for label, pol in groups:
                rs = [r for r in rows if r["policy"] == pol and r["context"] == L]
                fig.add_scatter(x=[r["batch"] for r in rs], y=[r["memory_bytes"] / 1e9 for r in rs],
                                mode="lines+markers", name=label, legendgroup=label, showlegend=ci == 0,
                                line=dict(color=_policy_color(pol), width=2.5), marker=dict(size=5),
                                row=1, col=ci + 1, hovertemplate="B=%{x}: %{y:.0f} GB<extra>" + label + "</extra>")
            if device_bytes:
                note = dict(annotation_text=f"one device: {device_bytes / 1e9:.0f} GB",
                            annotation_position="top left") if ci == 0 else {}
                fig.add_hline(y=device_bytes / 1e9, line=dict(color="#555", dash="dot"), row=1, col=ci + 1, **note)
        fig.update_yaxes(rangemode="tozero")
        fig.update_yaxes(title="GB held", row=1, col=1)
    else:
        fig = make_subplots(rows=1, cols=1)
        L = contexts[0]
        for pol in POLICY_NAMES:
            rs = [r for r in rows if r["policy"] == pol and r["context"] == L]
            fig.add_scatter(x=[r["batch"] for r in rs], y=[r["state_bytes"] / 1e9 for r in rs], mode="lines+markers",
                            name=f"{pol} ({WAYS[pol]})", line=dict(color=_policy_color(pol), width=2.5),
                            marker=dict(size=5), hovertemplate="B=%{x}: %{y:.2f} GB<extra>" + pol + "</extra>")
        w = step_read_bytes(cfg)                        # what a step reads of the weights
        fig.add_scatter(x=[batches[0], batches[-1]], y=[w / 1e9] * 2, mode="lines", name="the weights, read once a round",
                        line=dict(color="#555", dash="dot"))
        fig.update_yaxes(type="log", dtick=1, title="state GB moved a round")
    ticks = [b for b in batches if b in (1, 4, 16, 64, 256)] or list(batches)
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[str(b) for b in ticks], tickangle=0)
    fig.update_xaxes(title="sequences decoding together (B)", row=1, col=(len(contexts) + 1) // 2 if what == "memory"
                     else 1)
    # the title sits above the panels' own titles, with room between them
    fig.update_layout(template="plotly_white", height=height, margin=dict(t=110),
                      title=dict(text=title, y=0.97, yanchor="top"))
    legend_below(fig, 48, 56, left=70)
    return fig


def fits_rows(cfg, device_bytes: float, k: int = 3, contexts=(4096, 32768, 131072)) -> list:
    """How many sequences fit in `device_bytes` under each way, per context length: (device
    memory - the weights) // one sequence's memory (live state + what the policy keeps + its KV
    cache), from the same formulas as projection_rows. A projection, not a measurement."""
    rows = projection_rows(cfg, k, None, batches=(1,), contexts=contexts)
    w = 2 * param_count(cfg, mtp=False)
    out = []
    for pol in ("replay", "checkpoint", "input-cache"):
        row = {"way": WAYS[pol].replace(" (M=1)", ""), "policy": pol}
        for L in contexts:
            per = next(r["memory_bytes"] for r in rows if r["policy"] == pol and r["context"] == L) - w
            row[f"L = {L // 1024}K"] = int((device_bytes - w) // per)
        out.append(row)
    return out


def device_memory() -> tuple:
    """(bytes, name) of the device the default engine's engine benchmark was measured on
    (results.of_default_engine("bench_engine"))."""
    d = results.load_engine(results.of_default_engine("bench_engine"))
    if d.device_props is None:
        raise results.ResultsFileError(f"{d.path}: device_props: missing (the device's memory)")
    return float(d.device_props.memory_bytes), d.device_props.name
