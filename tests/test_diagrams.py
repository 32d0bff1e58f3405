"""kestrel.lab.diagrams: each diagram draws what the engine does. The timelines add up to the cost
model's round; the ring's written and kept slots, the cursors and the MTP cursor are checked
against a running engine (test-a, CPU) with fresh random tokens; bad arguments raise
DiagramError naming the problem."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

import kestrel
from kestrel.lab import diagrams
from kestrel import speculative as spec
from kestrel.lab.diagrams import DiagramError

pytest.importorskip("plotly")

POLICIES = diagrams.POLICY_NAMES


def random_units(rng, with_cache: bool = True) -> spec.UnitCosts:
    """UnitCosts with fresh random positive values (ms) for M = 1..8."""
    ms = range(1, 9)

    def r():
        return float(rng.uniform(0.01, 2.0))
    u = dict(step=r(), step_m={m: r() for m in ms}, ckpt={m: r() for m in ms}, draft=r(),
             mtp={m: r() for m in ms}, mark=r(), rollback=r(), select=r(), truncate=r(), argmax=r(),
             bookkeeping=r(), meta={"device": "Example device"})
    if with_cache:
        u.update(cached={m: r() for m in ms}, fold={n: r() for n in range(0, 9)})
    return spec.UnitCosts(**u)


def bars(fig, row: str):
    """(phase, label, base, length) of one timeline row, in time order."""
    out = []
    for t in fig.data:
        if t.type != "bar":
            continue
        for x, base, y, text in zip(t.x, t.base, t.y, t.text):
            if y == row:
                out.append((t.meta["phase"], text, base, x))
    return sorted(out, key=lambda s: s[2])


# ---- timelines ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("pairing", ["article", "trained"])
def test_timeline_adds_up_to_the_cost_model(rng, policy, pairing):
    u0 = random_units(rng)
    k = int(rng.integers(1, 5))
    pr = spec.Pairing.parse(pairing)
    # unit costs as measured now: a chain table, the rewrite in the chain (chain_fill), a_p' priced apart
    u1 = dataclasses.replace(u0, chain={n: float(rng.uniform(0.5, 2.0)) * n for n in range(1, 9)},
                             chain_fill={m: float(rng.uniform(0.5, 3.0)) for m in range(1, 8)},
                             meta=dict(u0.meta, bookkeeping_unit="verify rows"))
    for u, n in [(u, n) for u in (u0, u1) for n in range(pr.min_nok, k + 1)]:
        fig = diagrams.round_timeline(policy, k=k, n_ok=n, unit_costs=u, pairing=pairing)
        segs = bars(fig, policy)
        want = spec.round_cost(u, policy, pairing, k, n)
        assert sum(s[3] for s in segs) == pytest.approx(sum(want.values()), rel=1e-12)
        for ph in ("draft", "mark", "verify", "undo", "replay", "sync", "bookkeeping"):
            assert sum(s[3] for s in segs if s[0] == ph) == pytest.approx(want[ph], rel=1e-12, abs=1e-15), ph
        # segments follow one another, without gaps
        for a, b in zip(segs, segs[1:]):
            assert b[2] == pytest.approx(a[2] + a[3])
        phases = [s[0] for s in segs]
        assert sum(1 for s in segs if s[1].startswith("draft d")) == pr.mtp_steps(k)
        assert ("mark" in phases) == (policy in ("replay", "flex-replay"))
        replays = phases.count("replay")
        if policy == "replay":
            assert replays == (0 if n == k else max(n, 1))           # row by row, M=1
        elif policy == "flex-replay":
            assert replays == (0 if n == k else 1)                   # one batch
        else:
            assert replays == (1 if n == 0 else 0)                   # only the n_ok = 0 step
        if policy == "input-cache":
            fold = [s for s in segs if s[0] == "undo"]
            assert len(fold) == 1 and fold[0][3] == u.fold[n] and f"fold {n} cached row" in fold[0][1]
        if policy == "checkpoint":
            sel = [s for s in segs if s[0] == "undo"]
            assert len(sel) == 1 and sel[0][3] == u.select and f"select slot live+{n}" in sel[0][1]
        order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
        rewrite = [s for s in segs if "rewrite" in s[1]]       # paid at the next draft (chain_fill), else in the sync
        assert len(rewrite) == (pr.rewrite_rows(k, n) > 0)
        last = "draft" if rewrite and u.chain_fill else "sync"
        assert order[0] == ("draft" if pr.mtp_steps(k) else order[0]) and order[-1] == last
        assert order.index("verify") < order.index("bookkeeping")
        greedy = bars(fig, "greedy")
        assert len(greedy) == max(n, 1) and all(s[3] == u.greedy_ms_per_token for s in greedy)
        assert "schematic" not in fig.layout.title.text and "Example device" in fig.layout.xaxis.title.text


def test_timeline_without_unit_costs_says_schematic():
    fig = diagrams.round_timeline("replay", k=3, n_ok=2)
    assert "schematic" in fig.layout.title.text
    assert "schematic" in fig.layout.xaxis.title.text
    assert any("schematic" in (a.text or "") for a in fig.layout.annotations)
    # schematic lengths still follow the round: a replay of 2 rows is 2 M=1 steps of length 1
    assert [s[3] for s in bars(fig, "replay") if s[0] == "replay"] == [1.0, 1.0]


def test_timelines_stack_all_four_policies(rng):
    u = random_units(rng)
    fig = diagrams.round_timelines(k=4, n_ok=2, unit_costs=u.to_dict())      # a dict works too
    rows = {y for t in fig.data if t.type == "bar" for y in t.y}
    assert rows == set(POLICIES) | {"greedy"}
    for p in POLICIES:
        tot = sum(s[3] for s in bars(fig, p))
        assert tot == pytest.approx(sum(spec.round_cost(u, p, "article", 4, 2).values()))
    totals = next(t for t in fig.data if t.name == "round total")
    assert list(totals.y[:4]) == list(POLICIES)


def test_timelines_mark_a_policy_the_unit_costs_did_not_measure(rng):
    old = random_units(rng, with_cache=False)          # results files from before input-cache
    fig = diagrams.round_timelines(k=3, n_ok=1, unit_costs=old)
    assert bars(fig, "input-cache") == [] and bars(fig, "checkpoint")
    assert any(a.text == "not measured in these unit costs" and a.y == "input-cache" for a in fig.layout.annotations)
    with pytest.raises(DiagramError, match="input-cache.*verify_cached"):
        diagrams.round_timeline("input-cache", unit_costs=old)


@pytest.mark.parametrize("call, match", [
    (lambda: diagrams.round_timeline("rewind"), r"unknown policy 'rewind'"),
    (lambda: diagrams.round_timeline("replay", k=0), r"k=0 outside \[1, 8\]"),
    (lambda: diagrams.round_timeline("replay", k=9), r"k=9 outside"),
    (lambda: diagrams.round_timeline("replay", k=True), r"k must be an int"),
    (lambda: diagrams.round_timeline("replay", k=3, n_ok=4), r"n_ok=4 outside \[0, k=3\]"),
    (lambda: diagrams.round_timeline("replay", k=3, n_ok=-1), r"n_ok=-1 outside"),
    (lambda: diagrams.round_timeline("checkpoint", n_ok=0, pairing="trained"), r"trained pairing accepts d_1"),
    (lambda: diagrams.round_timeline("checkpoint", pairing="sideways"), r"unknown pairing"),
    (lambda: diagrams.round_timeline("checkpoint", unit_costs=[1, 2]), r"unit_costs must be"),
    (lambda: diagrams.round_timeline("checkpoint", unit_costs={"step": 1}), r"not a UnitCosts"),
    (lambda: diagrams.round_timelines(k=2, n_ok=2.0), r"n_ok must be an int"),
])
def test_timeline_bad_arguments(call, match):
    with pytest.raises(DiagramError, match=match):
        call()


def test_timeline_unit_costs_that_cannot_price_k(rng):
    u = random_units(rng).to_dict()
    u["step_m"] = {1: 1.0, 2: 1.1}                     # measured up to M = 2 only
    with pytest.raises(DiagramError, match=r"cannot price k=3.*step_m\[M=3\]"):
        diagrams.round_timeline("replay", k=3, unit_costs=u)


# ---- the state ring against the engine ---------------------------------------------------------------
def _engine_at_slot(model, rng, nslots: int, live: int):
    """An engine with mmax = nslots - 1 whose live slot is `live` (moved there by checkpointed
    verifies and selections), a prompt consumed."""
    eng = kestrel.Engine(model, max_seq=128, mmax=nslots - 1, batch="flex")
    V = model.cfg.vocab_size
    eng.prefill([int(t) for t in rng.integers(0, V, 5)])
    while eng.slot != live:
        eng.verify_checkpointed(eng.cursor, [int(rng.integers(0, V))])
        eng.select_checkpoint(1)
    return eng


def _shape_roles(fig, stage: str) -> dict:
    out = {}
    for s in fig.layout.shapes:
        m = re.fullmatch(rf"{stage}: slot (\d+) \((\w+)\)", s.name or "")
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def test_state_ring_checkpoint_matches_the_engine(model_a, rng):
    V = model_a.cfg.vocab_size
    cases = {(int(ns), int(rng.integers(0, ns))) for ns in rng.integers(2, 6, 6)} | {(4, 0), (4, 3)}
    for nslots, live in sorted(cases):
        k = int(rng.integers(1, nslots))
        n_ok = int(rng.integers(0, k + 1))
        eng = _engine_at_slot(model_a, rng, nslots, live)
        before = eng.snapshot_state()["S"].copy()
        eng.verify_checkpointed(eng.cursor, [int(t) for t in rng.integers(0, V, k)])
        after = eng.snapshot_state()["S"]
        changed = {i for i in range(nslots) if not np.array_equal(before[i], after[i])}
        eng.select_checkpoint(n_ok)
        fig = diagrams.state_ring(nslots=nslots, live=live, k=k, n_ok=n_ok, policy="checkpoint")
        verify = _shape_roles(fig, "after the verify")
        assert {i for i, r in verify.items() if r == "written"} == changed, (nslots, live, k)
        assert verify[live] == "live" and live not in changed
        accept = _shape_roles(fig, "after accept")
        assert [i for i, r in accept.items() if r == "selected"] == [eng.slot]
        assert fig.layout.meta["selected"] == eng.slot == (live + n_ok) % nslots


def test_state_ring_before_accept_has_no_selection(rng):
    fig = diagrams.state_ring(nslots=5, live=3, k=4)
    assert _shape_roles(fig, "after accept") == {} and fig.layout.meta["selected"] is None
    assert {i for i, r in _shape_roles(fig, "after the verify").items() if r == "written"} == {4, 0, 1, 2}


@pytest.mark.parametrize("cfg_name", ["tiny", "qwen3.5-27b"])
def test_state_ring_input_cache_draws_bytes_to_scale(model_a, cfg_name):
    from kestrel.config import load_config
    cfg = load_config(kestrel.ASSETS / "tiny") if cfg_name == "tiny" else kestrel.PRESETS[cfg_name]
    k, n_ok = 3, 2
    fig = diagrams.state_ring(nslots=4, live=1, k=k, n_ok=n_ok, policy="input-cache", cfg=cfg)
    shapes = {s.name: s for s in fig.layout.shapes}
    state = shapes["bytes: the live state"]
    rows = [s for name, s in shapes.items() if name.startswith("bytes: row ")]
    assert len(rows) == k
    ratio = spec.cached_row_bytes(cfg) / spec.recurrent_bytes(cfg)
    for r in rows:
        assert (r.x1 - r.x0) / (state.x1 - state.x0) == pytest.approx(ratio, rel=1e-12)
    assert [n.endswith("(folded)") for n in shapes if n.startswith("bytes: row ")] == [True] * n_ok + [False]
    # only the live slot is used, and it stays live
    accept = _shape_roles(fig, "after accept")
    assert accept[1] == "selected" and set(accept.values()) == {"selected", "unused"}
    assert f"{spec.recurrent_bytes(cfg) / 2**20:.1f} MiB" in json.dumps(fig.to_plotly_json()["data"]) \
        or cfg_name == "tiny"


def test_state_ring_checkpoint_bytes_are_whole_states():
    cfg = kestrel.PRESETS["qwen3.5-27b"]
    fig = diagrams.state_ring(nslots=5, live=0, k=4, n_ok=3, cfg=cfg)
    shapes = {s.name: s for s in fig.layout.shapes}
    state = shapes["bytes: the live state"]
    rows = [s for name, s in shapes.items() if name.startswith("bytes: row ")]
    assert len(rows) == 4 and all(r.x1 - r.x0 == pytest.approx(state.x1 - state.x0) for r in rows)
    assert [n for n in shapes if n.startswith("bytes: row ") and n.endswith("(selected)")] == \
        ["bytes: row 2: a whole state (selected)"]            # row n_ok - 1 is slot live + n_ok


def test_state_ring_replay_keeps_one_copy():
    fig = diagrams.state_ring(nslots=4, live=2, k=3, n_ok=1, policy="replay")
    names = [s.name for s in fig.layout.shapes]
    assert "after the verify: the snapshot (snapshot)" in names
    assert "after accept: the snapshot (discarded)" in names           # copied back by rollback
    assert len([n for n in names if n.startswith("bytes: mark()")]) == 1
    full = diagrams.state_ring(nslots=4, live=2, k=3, n_ok=3, policy="flex-replay")
    assert "after accept: the snapshot (snapshot)" in [s.name for s in full.layout.shapes]


@pytest.mark.parametrize("kw, match", [
    (dict(nslots=1), r"nslots=1 outside \[2, 9\]"),
    (dict(nslots=4, live=4), r"live=4 outside \[0, 3\]"),
    (dict(nslots=4, k=4), r"k=4 outside \[1, 3\]"),
    (dict(k=2, n_ok=3), r"n_ok=3 outside \[0, k=2\]"),
    (dict(policy="snapshot"), r"unknown policy 'snapshot'"),
    (dict(policy="input-cache", cfg="qwen3.5-27b"), r"cfg must be a kestrel Config"),
    (dict(live=1.0), r"live must be an int"),
])
def test_state_ring_bad_arguments(kw, match):
    with pytest.raises(DiagramError, match=match):
        diagrams.state_ring(**kw)


# ---- the cursors against the engine ------------------------------------------------------------------
def _marker(fig, name) -> int:
    t = next(t for t in fig.data if t.name == name)
    assert t.x[0] == t.x[1]
    return t.x[0]


@pytest.mark.parametrize("pairing", ["article", "trained"])
@pytest.mark.parametrize("policy", ["checkpoint", "input-cache", "replay"])
def test_cursors_match_the_engine_round_by_round(model_a, rng, pairing, policy):
    """Every round of a real run (the replay drafter forcing a random n_ok sequence): the cursor
    after the verify, after the round, and the MTP cursor at the start, after the draft and after
    the sync are where the diagram draws them."""
    pr = spec.Pairing.parse(pairing)
    k = int(rng.integers(1, 5)) if policy != "replay" else 3
    seq = [int(n) for n in rng.integers(pr.min_nok, k + 1, 12)]
    prompt = [int(t) for t in rng.integers(0, model_a.cfg.vocab_size, int(rng.integers(3, 9)))]
    ref = kestrel.generate(model_a, prompt, 24)
    pol = spec.Policy.parse(policy)
    a = spec.validate_run(model_a, prompt, 24, k, pol, "replay", reference=ref,
                          schedule=spec.Schedule(seq=seq, pairing=pairing))
    eng = kestrel.Engine(model_a, max_seq=a.need, mmax=k, batch=pol.batch)
    seen = []                                  # (cursor, mtp cursor) when each verify starts / ends
    verify_name = {"checkpoint": "verify_checkpointed", "input-cache": "verify_cached", "replay": "step_m"}[policy]
    real = getattr(eng, verify_name)

    def recording(pos, tokens):
        before = (eng.cursor, eng.mtp_cursor)
        out = real(pos, tokens)
        seen.append((before, eng.cursor, len(tokens)))
        return out
    setattr(eng, verify_name, recording)
    res = spec.run_spec(model_a, prompt, 24, k, pol, "replay", schedule=spec.Schedule(seq=seq, pairing=pairing),
                        reference=ref, greedy=False, engine=eng)
    rounds = res.rounds
    assert len(rounds) >= 3 and res.stream == ref
    verifies = [s for s in seen if s[2] == rounds[0].k or policy != "replay"]
    for i, (r, nxt) in enumerate(zip(rounds, rounds[1:])):
        if r.k != k:
            continue
        fig = diagrams.cursors(pos=r.p + 1, k=r.k, n_ok=r.n_ok, pairing=pairing, mtp_cursor=r.mtp_cursor)
        (cur_before, mtp_after_draft), cur_after_verify, _ = verifies[i]
        assert _marker(fig, "cursor, round start") == r.p + 1 == cur_before
        assert _marker(fig, "cursor, after the verify") == cur_after_verify
        assert _marker(fig, "cursor, after accept") == nxt.p + 1 == r.p + 1 + max(r.n_ok, 1)
        assert _marker(fig, "MTP cursor, round start") == r.mtp_cursor
        assert _marker(fig, "MTP cursor, after the draft") == mtp_after_draft
        assert _marker(fig, "MTP cursor, after the sync") == nxt.mtp_cursor


def test_cursors_draw_the_rows(rng):
    pos, k = int(rng.integers(1, 40)), int(rng.integers(1, 5))
    n_ok = int(rng.integers(0, k + 1))
    fig = diagrams.cursors(pos=pos, k=k, n_ok=n_ok)
    names = {s.name: s for s in fig.layout.shapes}
    for j in range(k):                          # the verify's rows hold the drafts
        assert f"row {pos + j} (main KV: after the verify)" in names
    labels = [t for t in fig.data if t.mode == "text"]
    texts = [x for t in labels for x in t.text]
    assert texts.count("a_p") == (1 if n_ok == 0 else 0)
    after = fig.layout.meta["cursor_after"]
    assert after == pos + max(n_ok, 1) and fig.layout.meta["mtp_after"] == pos - 1 + max(n_ok, 1)
    ticks = list(fig.layout.xaxis.ticktext)
    assert str(pos + k - 1) in ticks and str(max(0, pos - 1)) in ticks


def test_cursors_off_invariant_mtp_cursor_is_noted():
    fig = diagrams.cursors(pos=12, k=3, n_ok=1, mtp_cursor=9)
    assert _marker(fig, "MTP cursor, round start") == 9 and _marker(fig, "MTP cursor, after the sync") == 10
    assert any("invariant wants the MTP cursor at p = 11" in (a.text or "") for a in fig.layout.annotations)


@pytest.mark.parametrize("n_ok, pairing", [(1, "article"), (0, "article"), (3, "article"), (2, "trained")])
def test_cursor_labels_clear_every_cell(n_ok, pairing):
    """Each cursor label sits above its own row's cells and below the row above, with its text
    height (font size over the plot's pixels per data unit) counted: it never covers a cell or
    a cell's label (the first edition drew 'cursor 13' over the 'd2' of the row above)."""
    import importlib
    C = importlib.import_module("kestrel.lab.diagrams.cursors")     # the module, not the function
    fig = diagrams.cursors(pos=12, k=3, n_ok=n_ok, pairing=pairing)
    m = fig.layout.margin
    y0, y1 = fig.layout.yaxis.range
    px_per_unit = (fig.layout.height - m.t - m.b) / (y1 - y0)
    text_h = 1.3 * C.LABEL_PT / px_per_unit           # one line of label text, in data units
    boxes = {}                                         # row centre -> (bottom, top) of its cells
    for sh in fig.layout.shapes:
        boxes.setdefault(round((sh.y0 + sh.y1) / 2, 6), set()).add((sh.y0, sh.y1))
    assert len(boxes) == 6 and all(len(b) == 1 for b in boxes.values())
    rows = sorted((c, *b.pop()) for c, b in boxes.items())     # bottom row first
    cell_texts = [y for t in fig.data if t.mode == "text" and (t.name or "").startswith("labels")
                  for y, s in zip(t.y, t.text) if s]
    labels = [a for a in fig.layout.annotations if (a.name or "").startswith("label: ")]
    assert len(labels) == 6
    for a in labels:
        assert a.yanchor == "bottom"
        below = [r for r in rows if r[2] <= a.y]
        own = max(below, key=lambda r: r[2])           # the row the label stands on
        above = [r for r in rows if r[0] > own[0]]
        lo, hi = a.y, a.y + text_h
        assert lo > own[2], f"{a.text}: bottom {lo:.2f} inside its row (top {own[2]:.2f})"
        if above:
            assert hi < min(r[1] for r in above), f"{a.text}: top {hi:.2f} reaches the row above"
        clash = [y for y in cell_texts if lo - text_h / 2 < y < hi + text_h / 2]
        assert not clash, f"{a.text}: overlaps cell text at y={clash}"


@pytest.mark.parametrize("kw, match", [
    (dict(pos=0), r"pos=0 outside"),
    (dict(pos="12"), r"pos must be an int"),
    (dict(k=0), r"k=0 outside"),
    (dict(k=3, n_ok=5), r"n_ok=5 outside \[0, k=3\]"),
    (dict(n_ok=0, pairing="trained"), r"trained pairing"),
    (dict(mtp_cursor=-1), r"mtp_cursor=-1 outside"),
])
def test_cursors_bad_arguments(kw, match):
    with pytest.raises(DiagramError, match=match):
        diagrams.cursors(**kw)


# ---- every figure goes through the book's offline bundle ---------------------------------------------
def test_every_diagram_bundles_offline(rng):
    from kestrel.lab import plots
    figs = [diagrams.round_timeline("input-cache", k=2, n_ok=2, unit_costs=random_units(rng)),
            diagrams.round_timelines(), diagrams.state_ring(n_ok=0), diagrams.cursors()]
    for fig in figs:
        b = plots.bundle(fig)
        assert "Plotly.newPlot" in b["text/html"] and "<script src" not in b["text/html"]
        assert b["text/plain"].startswith("<plotly figure: ")
        legend = [t.name for t in fig.data if t.showlegend is not False and t.name]
        assert legend, "every diagram has a colour key"


# ---- kestrel.lab.undo: the chapter's numbers --------------------------------------------------------------
def test_undo_storage_follows_the_formulas():
    from kestrel.lab import undo
    from kestrel.config import load_config
    cfgs = {"tiny": load_config(kestrel.ASSETS / "tiny"), "27b": kestrel.PRESETS["qwen3.5-27b"]}
    for k in (1, 3, 4):
        for row, cfg in zip(undo.storage_rows(cfgs, k=k), cfgs.values()):
            b = row["_bytes"]
            assert b["state"] == cfg.gdn_state_bytes + cfg.conv_state_bytes
            assert (b["replay"], b["checkpoint"], b["input-cache"]) == (b["state"], k * b["state"], k * b["row"])
    text = undo.storage_table(cfgs, k=3)
    assert "per-row checkpoints: 3 copies" in text and "149.6 MiB" in text and "448.9 MiB" in text


def test_undo_fits_is_the_largest_batch_that_fits():
    from kestrel.lab import serving
    from kestrel.speculative.cost import serving_projection
    cfg = kestrel.PRESETS["qwen3.5-27b"]
    mem = 141e9
    for row in serving.fits_rows(cfg, mem, k=3, contexts=(4096, 65536)):
        for L in (4096, 65536):
            B = row[f"L = {L // 1024}K"]
            fit = [r for r in serving_projection(cfg, 3, spec.mean_nok(spec.E16_PROFILE, 3, "trained"),
                                                 batches=(B, B + 1), contexts=(L,)) if r["policy"] == row["policy"]]
            assert fit[0]["memory_bytes"] <= mem < fit[1]["memory_bytes"], (row, L)


def test_undo_memcmp():
    from kestrel.lab.undo import _memcmp
    assert _memcmp([1, 2, 3], [1, 2, 3]) == 0
    assert _memcmp([1, 2, 3], [1, 2, 4]) == -1 and _memcmp([1, 5, 3], [1, 2, 3]) == 1
    assert _memcmp([1, 2], [1, 2, 3]) == -1


def test_undo_fold_and_matrix_on_a_random_model(model_a, rng):
    from kestrel.lab import undo
    V = model_a.cfg.vocab_size
    prompt = [int(t) for t in rng.integers(0, V, 6)]
    drafts = [int(t) for t in rng.integers(0, V, 3)]
    for n in range(4):
        assert undo.fold_matches_steps(model_a, prompt, drafts, n) == {"S": True, "conv": True, "kv": True,
                                                                      "cursor": True}
    m = undo.bit_exact_matrix(model_a, [prompt], T=8, ks=(1, 2))
    assert sorted(m) == [(d, k, 0) for d in ("mtp", "mtp-article", "replay") for k in (1, 2)]
    assert set(m.values()) == {0}


def test_undo_time_policies_and_figures(model_a, rng):
    from kestrel.lab import plots, undo
    V = model_a.cfg.vocab_size
    starts = [[int(t) for t in rng.integers(0, V, 5)] for _ in range(2)]
    u = spec.measure_unit_costs(model_a, k_max=3, ctx=8, reps=2)
    ts = undo.time_policies(model_a, starts, T=8, k=2, repeats=2, units=u)
    assert [t.policy for t in ts] == list(diagrams.POLICY_NAMES)
    for t in ts:
        assert len(t.summaries) == 2 and len(t.predicted_ms_per_token) == 2 and t.bit_exact
        assert all(s.T == 16 and s.runs == 2 for s in t.summaries)
        med, lo, hi = t.spread(t.ms)
        assert lo <= med <= hi and t.row()["exact"] is True
    assert "Plotly.newPlot" in plots.bundle(undo.timing_figure(ts))["text/html"]
    with pytest.raises(spec.SpecArgumentError, match="repeats"):
        undo.time_policies(model_a, starts, T=8, k=2, repeats=0)


def test_undo_large_comparison_from_the_results_file():
    from kestrel.lab import results, serving, undo
    name = results.of_default_engine("bench_spec")
    try:
        results.load(name)
    except results.ResultsFileError:
        pytest.skip(f"results/{name}.json is not there")
    big = undo.large_comparison(live=False)
    # the default engine's runs, the file named in the source line and the figures' provenance
    assert not big["live"] and f"results/{name}.json" in big["source"] and big["file"] == name
    assert f"results/{name}.json" in undo.short_source(big)
    assert big["rows"] and {r["policy"] for r in big["rows"]} <= set(diagrams.POLICY_NAMES)
    assert {(r["schedule"], r["pairing"]) for r in big["rows"]} == {(s, pr.value) for s, _, pr in undo.LARGE_PICKS}
    for r in big["rows"]:
        assert r["ms"] > 0 and abs(r["speedup"] - r["greedy"] / r["ms"]) < 1e-9 * r["speedup"] + 0.01
        assert r["state_per_token"]["read+written"] > 0
    assert "k = 3" in undo.large_table(big)
    with pytest.raises(spec.SpecArgumentError, match="'memory' or 'bytes'"):
        serving.projection_figure(kestrel.PRESETS["qwen3.5-27b"], "time")


def test_undo_miss_is_measured_over_predicted_speedup(rng):
    """One sign convention for the cost model's miss: measured speedup / predicted - 1, negative
    when the run was slower than predicted."""
    from types import SimpleNamespace
    from kestrel.lab import undo
    g, m = float(rng.uniform(5, 10)), float(rng.uniform(5, 10))
    slower, faster = m * 0.8, m * 1.25            # the model predicted less time / more time
    s = SimpleNamespace(greedy_ms_per_token=g, ms_per_token=m, speedup=g / m, bit_exact=True)
    t = undo.PolicyTiming("checkpoint", [s, s, s], [slower] * 3)
    assert t.misses[0] == pytest.approx(slower / m - 1) and t.misses[0] < 0
    assert t.row()["miss"].startswith("-") and t.row()["cost model"] == f"{g / slower:.3f}×"
    t = undo.PolicyTiming("checkpoint", [s], [faster])
    assert t.misses[0] > 0 and t.row()["miss"].startswith("+")
    assert undo.PolicyTiming("replay", [s], []).row()["miss"] == ""


def test_undo_decision_table_follows_the_numbers(rng):
    from kestrel.lab import serving
    cfg = kestrel.PRESETS["qwen3.5-27b"]
    fits = serving.fits_rows(cfg, 141e9, k=3)

    def big(sp):
        return {"rows": [{"schedule": s, "policy": p, "speedup": v} for (s, p), v in sp.items()]}
    pols = ("replay", "flex-replay", "checkpoint", "input-cache")
    e16 = dict(zip(pols, sorted(rng.uniform(0.5, 1.8, 4))))          # the best one last
    art = dict(zip(pols, rng.uniform(0.3, 0.9, 4)))
    sp = {**{("E16 profile", p): v for p, v in e16.items()}, **{("article histogram", p): v for p, v in art.items()}}
    rows = {r["when"].split(" (")[0]: r for r in serving.decision_rows(big(sp), cfg, fits)}
    one = next(r for w, r in rows.items() if w.startswith("one sequence"))
    assert one["choose"].startswith("input-cache")
    assert rows["the verify keeps no state per row"]["choose"] == "flex-replay"
    low = next(r for w, r in rows.items() if w.startswith("acceptance as low"))
    assert low["choose"].startswith("greedy")
    sp["article histogram", "replay"] = 1.2                            # now one way pays
    low = next(r for r in serving.decision_rows(big(sp), cfg, fits) if r["when"].startswith("acceptance as low"))
    assert low["choose"] == "replay"
    many = next(r for r in serving.decision_rows(big(sp), cfg, fits) if r["when"].startswith("many sequences, short"))
    assert many["choose"] == "input-cache"                              # it keeps kilobytes, not states


def test_serving_projection_sets_rounds_against_the_bytes_a_step_reads():
    """Memory counts the weights held (the untied embedding table whole); a round's bytes count
    what a step reads of them (one row of it)."""
    from kestrel.lab import serving
    from kestrel.program import param_count
    cfg = kestrel.PRESETS["qwen3.5-27b"]
    held, reads = 2 * param_count(cfg, mtp=False), serving.step_read_bytes(cfg)
    assert not cfg.tie_word_embeddings and reads < held
    r = [x for x in serving.projection_rows(cfg, batches=(1,), contexts=(4096,)) if x["policy"] == "checkpoint"][0]
    kv = 4096 * cfg.kv_bytes_per_token(2)
    assert r["round_bytes"] == pytest.approx(reads + r["state_bytes"] + 3 * kv)
    assert r["memory_bytes"] > held
