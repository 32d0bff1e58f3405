"""Three ways to undo a recurrence, side by side (chapter 8): what each stores, the bytes a round
moves, the time it takes (measured, with repeats), where each wins (a projection of the byte
formulas) and the bit-exact matrix of the input cache.

    from kestrel.lab import undo
    print(undo.table(undo.storage_rows({"tiny": model.cfg, "qwen3.5-27b": preset}, k=3)))
    t = undo.time_policies(model, starts, T=32, k=3, repeats=5)      # median and range per policy
    show(undo.timing_figure(t))
    m = undo.bit_exact_matrix(model, starts, T=32)                   # memcmp against greedy
    big = undo.large_comparison()       # the 27B shape: live on a GPU that holds it, else results/

The ways: snapshot + replay ('replay', 'flex-replay': mark() keeps one copy of the state and the
accepted rows are recomputed), per-row checkpoints ('checkpoint': the verify writes k states)
and the input cache ('input-cache': the verify keeps k rows of inputs, kilobytes each, and the
accepted ones are folded into the live state).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from kestrel import speculative as spec
from kestrel.config import PRESETS

from . import sweep
from .checks import ResultsFileError
from .diagrams.common import POLICY_NAMES, _fmt_bytes, _policy_color, legend_below
from kestrel.engine import Engine, generate
from .plots import PHASE_COLORS, figure, annotate_provenance

__all__ = ["WAYS", "storage_rows", "traffic_rows", "table", "PolicyTiming", "time_policies", "timing_figure",
           "bit_exact_matrix", "large_comparison", "large_table", "fmt_bytes", "storage_table", "short_source",
           "large_figure", "fold_matches_steps", "cost_rows"]

WAYS = {"replay": "snapshot + replay (M=1)", "flex-replay": "snapshot + replay (batched)",
        "checkpoint": "per-row checkpoints", "input-cache": "input cache"}
fmt_bytes = _fmt_bytes


# ---- what each way stores, and moves ------------------------------------------------------------------
def storage_rows(cfgs: dict, k: int = 3) -> list:
    """Per shape: the recurrent state (every GDN layer's S and conv window, fp32) and what each
    way keeps beside it for a round of k drafts: one copy (mark), k copies (checkpoints) or k
    rows of inputs (input cache). From the configs alone (Policy.state_traffic)."""
    rows = []
    for name, cfg in cfgs.items():
        s, x = spec.recurrent_bytes(cfg), spec.cached_row_bytes(cfg)
        kept = {p: spec.Policy.parse(p).state_traffic(cfg, k, k)["kept"] for p in ("replay", "checkpoint",
                                                                                   "input-cache")}
        rows.append({"shape": name, "GDN layers": len(cfg.gdn_layers), "state S + conv": fmt_bytes(s),
                     "one input row": fmt_bytes(x), "snapshot: 1 copy": fmt_bytes(kept["replay"]),
                     f"checkpoints: {k} copies": fmt_bytes(kept["checkpoint"]),
                     f"input cache: {k} rows": fmt_bytes(kept["input-cache"]),
                     "checkpoints / input cache": f"{kept['checkpoint'] / kept['input-cache']:.0f}×",
                     "_bytes": {"state": s, "row": x, **kept}})
    return rows


def storage_table(cfgs: dict, k: int = 3) -> str:
    """storage_rows as a text table with one column per shape (narrow enough for a page)."""
    rows = storage_rows(cfgs, k)
    lines = [("the live state (S + conv window)", "state S + conv"),
             ("one input row (every GDN layer)", "one input row"),
             ("snapshot + replay: one copy", "snapshot: 1 copy"),
             (f"per-row checkpoints: {k} copies", f"checkpoints: {k} copies"),
             (f"input cache: {k} input rows", f"input cache: {k} rows"),
             ("checkpoints / input cache", "checkpoints / input cache")]
    out = [{f"kept beside the live state, k = {k}": label, **{r["shape"]: r[key] for r in rows}}
           for label, key in lines]
    return table(out)


def traffic_rows(cfg, k: int = 3, noks=None) -> list:
    """Per policy and n_ok: the recurrent-state bytes one round reads and writes (the GDN state,
    the conv window and the cached inputs; Policy.state_traffic), in units of the state too."""
    s = spec.recurrent_bytes(cfg)
    rows = []
    for name in POLICY_NAMES:
        pol = spec.Policy.parse(name)
        for n in (range(0, k + 1) if noks is None else noks):
            t = pol.state_traffic(cfg, k, n)
            rows.append({"policy": name, "n_ok": n, "read": fmt_bytes(t["read"]), "written": fmt_bytes(t["written"]),
                         "read + written": f"{(t['read'] + t['written']) / s:.2f} states",
                         "_bytes": t})
    return rows


def table(rows: list, columns=None) -> str:
    """Rows of dicts as an aligned text table (keys starting with '_' are left out)."""
    columns = columns or [c for c in rows[0] if not c.startswith("_")]
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    w = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(columns))
    out = [line, "  ".join("-" * x for x in w)]
    for row in cells:
        out.append("  ".join(v.ljust(w[i]) if i == 0 else v.rjust(w[i]) for i, v in enumerate(row)))
    return "\n".join(out)


# ---- time, measured with repeats -----------------------------------------------------------------------
@dataclass
class PolicyTiming:
    """One policy's runs over the starts, repeated: one RunSummary (aggregated over the starts)
    per repeat, and the cost model's prediction for each repeat's own rounds."""
    policy: str
    summaries: list
    predicted_ms_per_token: list = field(default_factory=list)
    label: str = ""

    def _vals(self, f):
        return [f(s) for s in self.summaries]

    @property
    def ms(self) -> list:
        return self._vals(lambda s: s.ms_per_token)

    @property
    def greedy_ms(self) -> list:
        return self._vals(lambda s: s.greedy_ms_per_token)

    @property
    def speedups(self) -> list:
        return self._vals(lambda s: s.speedup)

    @property
    def bit_exact(self) -> bool:
        return all(s.bit_exact for s in self.summaries)

    @property
    def median_summary(self):
        """The repeat with the median ms/token (its phases are what the figure stacks)."""
        order = sorted(range(len(self.summaries)), key=lambda i: self.summaries[i].ms_per_token)
        return self.summaries[order[len(order) // 2]]

    def spread(self, values) -> tuple:
        """(median, min, max)."""
        return statistics.median(values), min(values), max(values)

    @property
    def predicted_speedups(self) -> list:
        """The cost model's speedup for each repeat's own rounds (its greedy over its prediction)."""
        return [s.greedy_ms_per_token / p for s, p in zip(self.summaries, self.predicted_ms_per_token)]

    @property
    def misses(self) -> list:
        """The cost model's miss for each repeat, the book's one convention: measured speedup ÷
        predicted speedup − 1 (negative: the run was slower than the model said)."""
        return [s / p - 1 for s, p in zip(self.speedups, self.predicted_speedups)]

    def row(self) -> dict:
        m, lo, hi = self.spread(self.ms)
        g = self.spread(self.greedy_ms)
        sp = self.spread(self.speedups)
        priced = bool(self.predicted_ms_per_token)
        return {"policy": self.policy, "ms/token": f"{m:.3f}", "range": f"{lo:.2f}..{hi:.2f}",
                "greedy": f"{g[0]:.3f}", "speedup": f"{sp[0]:.3f}×",
                "cost model": f"{statistics.median(self.predicted_speedups):.3f}×" if priced else "",
                "miss": f"{statistics.median(self.misses):+.1%}" if priced else "", "exact": self.bit_exact}


def time_policies(model, starts, *, T: int = 32, k: int = 3, drafter="mtp", schedule=None, repeats: int = 5,
                  policies=POLICY_NAMES, units=None, reference=None) -> list:
    """Run every policy over the starts `repeats` times (policies interleaved within a repeat, so a
    drift of the machine's speed touches all of them alike), each run timing greedy decoding of
    the same tokens in the same call. starts: [(label, tokens)] or [tokens]. schedule: a callable
    (start index) -> spec.Schedule for the replay drafter. units: spec.UnitCosts to price each
    repeat's own rounds (spec.compare). reference: {start index: greedy stream} to skip the
    greedy baseline (then no speedup). Engines are reused, and each policy runs once untimed
    first, so that a GPU backend's captured plans are not timed."""
    toks = [s[1] if isinstance(s, tuple) else s for s in starts]
    if not toks:
        raise spec.SpecArgumentError("time_policies: no starts")
    repeats = spec.check_size(repeats, "repeats")
    pols = [spec.Policy.parse(p) for p in policies]
    need = max(len(t) for t in toks) + T + k + 2
    engines = {p.name: Engine(model, max_seq=need, mmax=k, batch=p.batch) for p in pols}
    g_eng = Engine(model, max_seq=need, mmax=1, batch="flex")

    def run(p, i, t):
        sch = schedule(i) if schedule is not None else None
        kw = dict(greedy=True, greedy_engine=g_eng) if reference is None else dict(greedy=False,
                                                                                  reference=reference[i])
        return spec.run_spec(model, t, T, k, p, drafter, schedule=sch, engine=engines[p.name], **kw)
    for p in pols:                                                         # warm-up, untimed
        run(p, 0, toks[0])
    out = {p.name: PolicyTiming(p.name, [], [], WAYS.get(p.name, p.name)) for p in pols}
    for _ in range(repeats):
        for p in pols:
            res = [run(p, i, t) for i, t in enumerate(toks)]
            out[p.name].summaries.append(spec.aggregate(res))
            if units is not None and p.priced_by(units):
                out[p.name].predicted_ms_per_token.append(spec.compare(units, res)["predicted_ms_per_token"])
    return list(out.values())


def timing_figure(timings: list, *, title: str | None = None, height: int = 560):
    """ms per token by phase for each policy (the median repeat's phases, stacked), the range of
    the repeats' totals as an error bar, greedy decoding's median and range beside, and the cost
    model's prediction as a marker where it was priced."""
    labels = [f"{t.policy}<br>({WAYS.get(t.policy, t.policy)})" for t in timings]
    fig = figure(title, height=height, barmode="stack", yaxis=dict(title="ms per token", rangemode="tozero"),
                 hovermode="closest")
    fig.update_layout(margin=dict(t=70))
    legend_below(fig, 80, 110, left=60)              # the rotated policy names take ~100 px
    fig.update_layout(legend=dict(entrywidth=150, entrywidthmode="pixels"))   # 4 a row: 3 rows; names fit 150 px
    meds = [t.median_summary for t in timings]
    for ph in spec.PHASES:
        fig.add_bar(x=labels, y=[m.phase_ms_per_token.get(ph, 0.0) for m in meds], name=ph,
                    marker_color=PHASE_COLORS[ph], hovertemplate="%{y:.3g} ms/token<extra>" + ph + "</extra>")
    tails = [max(m.ms_per_token - sum(m.phase_ms_per_token.values()), 0.0) for m in meds]
    if any(x > 0 for x in tails):
        fig.add_bar(x=labels, y=tails, name="tail", marker_color=PHASE_COLORS["tail"])
    sp = [t.spread(t.ms) for t in timings]
    fig.add_scatter(x=labels, y=[m.ms_per_token for m in meds], mode="markers", name="range of the repeats",
                    marker=dict(size=1, color="black"),
                    error_y=dict(type="data", symmetric=False, array=[s[2] - m.ms_per_token for s, m in zip(sp, meds)],
                                 arrayminus=[m.ms_per_token - s[1] for s, m in zip(sp, meds)], color="black",
                                 thickness=1.5, width=8))
    g = [t.spread(t.greedy_ms) for t in timings]
    fig.add_scatter(x=labels, y=[x[0] for x in g], mode="markers", name="greedy (median, range)",
                    marker=dict(symbol="line-ew-open", size=46, color="#333", line=dict(width=3, color="#333")),
                    error_y=dict(type="data", symmetric=False, array=[x[2] - x[0] for x in g],
                                 arrayminus=[x[0] - x[1] for x in g], color="#777", thickness=1, width=3))
    pred = [statistics.median(t.predicted_ms_per_token) if t.predicted_ms_per_token else None for t in timings]
    if any(p is not None for p in pred):
        fig.add_scatter(x=labels, y=pred, mode="markers", name="cost model",
                        marker=dict(symbol="diamond-open", size=13, color="black", line=dict(width=2)))
    return fig


# ---- bit-exact: memcmp of the stream against greedy -----------------------------------------------------
def _memcmp(a, b) -> int:
    """0 when the two token streams are byte-identical (as int64 arrays), else the sign of the
    first differing byte, like C's memcmp."""
    x, y = np.asarray(a, np.int64).tobytes(), np.asarray(b, np.int64).tobytes()
    if x == y:
        return 0
    for i, (p, q) in enumerate(zip(x, y)):
        if p != q:
            return -1 if p < q else 1
    return -1 if len(x) < len(y) else 1


def bit_exact_matrix(model, starts, *, T: int = 32, ks=(1, 2, 3, 4), drafters=("mtp-article", "mtp", "replay"),
                     policy="input-cache") -> dict:
    """memcmp of the speculative stream against greedy decoding (kestrel.generate, computed here
    once per start, independently of the run) for every drafter x k x start. The replay drafter
    replays the article's E16 profile on the trained pairing, one seed per start.
    -> {(drafter, k, start index): memcmp value}."""
    toks = [s[1] if isinstance(s, tuple) else s for s in starts]
    greedy = [generate(model, t, T) for t in toks]
    out = {}
    for d in drafters:
        for k in ks:
            for i, t in enumerate(toks):
                sch = spec.Schedule(profile=spec.E16_PROFILE, pairing="trained", seed=i) if d == "replay" else None
                r = spec.run_spec(model, t, T, k, policy, d, schedule=sch, reference=greedy[i], greedy=False)
                out[d, k, i] = _memcmp(r.stream, greedy[i])
    return out


# ---- the 27B shape: live on a GPU that holds it, else the results file ---------------------------------
# Chapter 8 sets the four policies side by side on two of sweep.LARGE_SCHEDULES (k = 3): the article's
# histogram on its pairing, the E16 profile on the trained one. One path (sweep.large_section), one table.
LARGE_PICKS = (("article histogram", 3, spec.Pairing.ARTICLE), ("E16 profile", 3, spec.Pairing.TRAINED))
LARGE_SCHEDULES = tuple(s for s in sweep.LARGE_SCHEDULES if (s[0], s[1], s[3]) in LARGE_PICKS)


def _state_per_token(cfg, policy, hist: dict, k: int) -> dict:
    """Recurrent-state bytes read + written per emitted token for rounds with this n_ok
    histogram (Policy.state_traffic), and what the policy keeps beside the live state."""
    pol = spec.Policy.parse(policy)
    rw = tok = 0
    for n, c in hist.items():
        t = pol.state_traffic(cfg, k, int(n))
        rw += c * (t["read"] + t["written"])
        tok += c * max(int(n), 1)
    return {"read+written": rw / max(tok, 1), "kept": pol.state_traffic(cfg, k, 0)["kept"]}


def large_comparison(*, live: bool | None = None, T: int = 64, P: int = 32, repeats: int = 3) -> dict:
    """The four policies at the Qwen3.5-27B shape (random bf16 weights; the replay drafter forces
    the article's histogram on the article pairing and the E16 profile on the trained one, k = 3):
    sweep.large_section's runs of LARGE_SCHEDULES, live when a GPU holds the shape (live=None
    decides), else the recorded runs (sweep.recorded_files: the default engine's file first).
    -> {"live", "source" (a provenance line), "why", "rows": [{schedule, pairing, policy, ms,
    speedup (each the median over the repeats), greedy, bit_exact, state_per_token}], "missing": [...]}"""
    sec = sweep.large_section(live, T=T, P=P, repeats=repeats, schedules=LARGE_SCHEDULES)
    cfg = PRESETS[sweep.LARGE]
    rows, missing = [], []
    for sname, k, pairing in LARGE_PICKS:
        for pol in POLICY_NAMES:
            try:
                s = sec.data.run(k=k, policy=pol, schedule=sname, pairing=pairing)
            except ResultsFileError:
                missing.append(f"{pol} ({sname}, {pairing.value} pairing)")
                continue
            rows.append({"schedule": sname, "pairing": pairing.value, "policy": pol, "ms": s.ms_per_token,
                         "speedup": s.speedup, "greedy": s.greedy_ms_per_token, "bit_exact": s.bit_exact,
                         "state_per_token": _state_per_token(cfg, pol, s.hist, k)})
    p = sec.prov
    return {"live": sec.live, "why": sec.why, "rows": rows, "missing": missing, "T": sec.data.T,
            "repeats": sec.data.repeats, "units": sec.data.units, "device": p.device, "date": p.date[:10],
            "file": sec.file,
            "source": sec.source}


def large_table(big: dict) -> str:
    """The 27B rows as text, one block per acceptance pattern (ms/token and greedy, each the median
    over the repeats, speedup, state bytes moved per token and kept)."""
    blocks = []
    for sched in dict.fromkeys((r["schedule"], r["pairing"]) for r in big["rows"]):
        rows = []
        for r in big["rows"]:
            if (r["schedule"], r["pairing"]) != sched:
                continue
            row = {"policy": r["policy"], "ms/token": f"{r['ms']:.2f}"}
            row.update({"greedy": f"{r['greedy']:.2f}", "speedup": f"{r['speedup']:.3f}×",
                        "state/token": fmt_bytes(r["state_per_token"]["read+written"]),
                        "kept": fmt_bytes(r["state_per_token"]["kept"]), "exact": r["bit_exact"]})
            rows.append(row)
        blocks.append(f"{sched[0]}, {sched[1]} pairing, k = 3:\n" + table(rows))
    return "\n\n".join(blocks)


def short_source(big: dict) -> str:
    """'measured on <device> at <date>' (+ the file) for a figure's provenance line."""
    where = "live" if big["live"] else f"results/{big['file']}.json"
    return f"measured on {big.get('device', '?')} at {big.get('date', '?')} ({where})"


def large_figure(big: dict, *, title: str | None = None, height: int = 460):
    """Speedup against greedy at the 27B shape, per schedule and policy (bars: the median over the
    repeats), with 1× marked."""
    fig = figure(title, height=height, barmode="group", yaxis=dict(title="speedup vs greedy (×)", rangemode="tozero"))
    fig.update_layout(margin=dict(t=80))
    legend_below(fig, 48, 30, left=60)
    scheds = list(dict.fromkeys(f"{r['schedule']}, {r['pairing']} pairing" for r in big["rows"]))
    for pol in POLICY_NAMES:
        rs = {f"{r['schedule']}, {r['pairing']} pairing": r for r in big["rows"] if r["policy"] == pol}
        if not rs:
            continue
        ys = [rs[x]["speedup"] if x in rs else None for x in scheds]
        fig.add_bar(x=scheds, y=ys, name=f"{pol} ({WAYS[pol]})", marker_color=_policy_color(pol),
                    text=[None if y is None else f"{y:.2f}×" for y in ys], textposition="auto", cliponaxis=False)
    fig.add_hline(y=1.0, line=dict(color="black", dash="dot", width=1.5), annotation_text="greedy (1×)",
                  annotation_position="top left")
    annotate_provenance(fig, short_source(big))
    return fig


def fold_matches_steps(model, prompt, drafts, n: int) -> dict:
    """verify_cached(drafts) + fold_cached(n) on one engine, n plain steps of drafts[:n] on
    another: is the live GDN state (S and conv window), every visible KV row and the cursor the
    same, bit for bit? -> {"S": bool, "conv": bool, "kv": bool, "cursor": bool}."""
    need = len(prompt) + len(drafts) + 2
    a = Engine(model, max_seq=need, mmax=len(drafts), batch="flex")
    b = Engine(model, max_seq=need, mmax=len(drafts), batch="flex")
    a.prefill(prompt)
    b.prefill(prompt)
    a.verify_cached(a.cursor, drafts)
    a.fold_cached(n)
    for t in drafts[:n]:
        b.step(b.cursor, t)
    npy = model.be.to_numpy
    (sa, ha), (sb, hb) = a.live_state(), b.live_state()
    c = a.cursor
    same = lambda x, y: np.asarray(npy(x)).tobytes() == np.asarray(npy(y)).tobytes()   # noqa: E731
    kv = all(same(a.state.kc[i][:c], b.state.kc[i][:c]) and same(a.state.vc[i][:c], b.state.vc[i][:c])
             for i in range(a.n_attn))
    return {"S": same(sa, sb), "conv": same(ha, hb), "kv": kv, "cursor": a.cursor == b.cursor == len(prompt) + n}


def cost_rows(u, k: int = 3, n: int = 1) -> list:
    """What one round of k drafts accepting n costs each policy in its own phases, from unit costs
    (Policy.cost): the verify, the copies, the undo step and the replay, in ms."""
    rows = []
    for name in POLICY_NAMES:
        pol = spec.Policy.parse(name)
        if not pol.priced_by(u):
            rows.append({"policy": name, "verify": "not measured"})
            continue
        c = pol.cost(u, k, n)
        undo = {"replay": "rollback", "flex-replay": "rollback", "checkpoint": "select", "input-cache": "fold"}[name]
        rows.append({"policy": name, f"verify {k} rows": f"{c['verify']:.3f}", "mark": f"{c.get('mark', 0):.3f}",
                     "undo step": undo, "undo": f"{c.get('undo', 0):.3f}", "replay": f"{c.get('replay', 0):.3f}",
                     "sum (ms)": f"{sum(c.values()):.3f}", "_ms": c})
    return rows
