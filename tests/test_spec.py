"""kestrel.speculative: the speculative round, policies, drafters, variants, instrumentation, cost model, CLI.

The model: the embedded tiny model when kestrel/assets/tiny/model.safetensors exists (its six
starts.json prompts), else the random preset 'test-b' with six seeded random prompts (MTP
acceptance near zero, but every bit-exactness claim must hold all the same).
KESTREL_DRIVER_TEST_MODEL=<preset|dir> overrides the choice; KESTREL_TEST_DEVICE=cuda runs the
same checks on the GPU backend (the default is the CPU).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kestrel
from kestrel import speculative as spec
from kestrel.errors import BatchWidthError, CursorError, KestrelError
from kestrel.speculative.accept import Acceptance
from kestrel.speculative.cost import UnitCosts
from conftest import draft_by_steps

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(kestrel.__file__).resolve().parent / "assets" / "tiny" / "model.safetensors"
MODEL_NAME = os.environ.get("KESTREL_DRIVER_TEST_MODEL") or ("tiny" if TINY.exists() else "test-b")
TRAINED = MODEL_NAME not in kestrel.PRESETS
T = 64
POLICIES = ("replay", "flex-replay", "checkpoint", "input-cache")
DRAFTERS = ("mtp-article", "mtp", "replay")


@pytest.fixture(scope="module")
def model():
    return kestrel.load(MODEL_NAME, device=os.environ.get("KESTREL_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="module")
def starts(model):
    st = [toks for _, toks in spec.default_starts(model)]
    assert len(st) == 6
    return st


@pytest.fixture(scope="module")
def refs(model, starts):
    return [kestrel.generate(model, s, T) for s in starts]


def replay_kw(i):
    """The replay drafter in the matrix: the article's E16 profile, both pairings (alternating by start)."""
    return dict(schedule=spec.Schedule(profile=spec.E16_PROFILE, pairing="article" if i % 2 == 0 else "trained", seed=i))


# ---- 1. the construction guarantee: bit-exact for every policy x drafter x k x start ---------------
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.parametrize("policy", POLICIES)
def test_bit_exact_matrix(model, starts, refs, policy, drafter, k):
    for i, (prompt, ref) in enumerate(zip(starts, refs)):
        kw = replay_kw(i) if drafter == "replay" else {}
        # check=True (default): consumed == emitted and the cursors are verified after every round;
        # check_rows=True: every replayed row is bit-identical to its verify row
        r = spec.run_spec(model, prompt, T, k, policy, drafter, reference=ref, greedy=False, check_rows=True, **kw)
        assert r.stream == ref, f"start {i}: first difference at token {r.first_diff}"
        assert r.bit_exact
        assert sum(len(x.emitted) for x in r.rounds) + r.tail_tokens == T
        assert all(1 <= x.k <= k and 0 <= x.n_ok <= x.k for x in r.rounds)
        if drafter == "replay":       # the oracle forced exactly what its schedule asked for
            assert [x.n_ok for x in r.rounds] == [min(x.requested, x.k) for x in r.rounds]
        if r.pairing is spec.Pairing.TRAINED:
            assert all(x.n_ok >= 1 for x in r.rounds), "d_1 = argmax(logits_p) is free under the trained pairing"
        assert r.pairing is (spec.Pairing.TRAINED if drafter == "mtp" or (drafter == "replay" and i % 2 == 1)
                             else spec.Pairing.ARTICLE)
        if r.batch == "strict" and k > 1:
            assert r.tail_tokens < k


# ---- 2. the replay drafter forces the requested n_ok sequence ----------------------------------------
def test_replay_drafter_reproduces_article_histogram(model, starts, refs):
    seq = spec.hist_to_sequence(spec.ARTICLE_HIST, seed=3, fit_k=3)
    r = spec.run_spec(model, starts[0], 64, 3, "replay", "replay", schedule=spec.Schedule(seq=seq, pairing="article"),
                      reference=refs[0], greedy=False)
    assert r.noks == seq
    assert r.tail_tokens == 0
    s = r.summary()
    assert s.hist == {0: 24, 1: 6, 2: 11, 3: 4}
    lines = r.log_lines()
    assert "[spec] rounds=45 accepted=40 mean/round=0.889 => advance/round=1.422 (n_ok=0 rounds=24)" in lines
    assert "[spec] n_ok histogram: n_ok=0:24 n_ok=1:6 n_ok=2:11 n_ok=3:4" in lines
    assert "[spec] token stream memcmp=0 => PASS (byte-identical to greedy)" in lines
    # the same histogram string drives it directly
    r2 = spec.run_spec(model, starts[0], 64, 3, "checkpoint", "replay",
                       schedule=spec.Schedule(hist="0:24 1:6 2:11 3:4", pairing="article"), reference=refs[0], greedy=False)
    assert r2.summary().hist == spec.ARTICLE_HIST and r2.bit_exact


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_drafter_exact_sequence_trained_pairing(model, starts, refs, policy):
    seq = [1, 3, 2, 4, 1, 1, 4, 2, 3, 3, 1, 2, 4, 4, 1, 2]
    r = spec.run_spec(model, starts[1], T, 4, policy, "replay", schedule=spec.Schedule(seq=seq, pairing="trained"),
                      reference=refs[1], greedy=False)
    want = [seq[i % len(seq)] for i in range(len(r.rounds))]
    assert [min(n, x.k) for n, x in zip(want, r.rounds)] == r.noks
    assert r.noks[:len(seq)] == seq
    assert r.bit_exact


def test_replay_drafter_rejects_impossible_requests(model, starts, refs):
    with pytest.raises(spec.ScheduleError, match="free"):
        spec.run_spec(model, starts[0], 16, 3, "checkpoint", "replay",
                      schedule=spec.Schedule(seq=[1, 0, 2], pairing="trained"), reference=refs[0][:16], greedy=False)
    with pytest.raises(KestrelError, match="reference"):
        spec.run_spec(model, starts[0], 16, 3, "checkpoint", "replay", schedule=spec.Schedule(seq=[1]), greedy=False)


def test_profile_schedule_statistics():
    # many rounds of the profile-driven schedule approach the profile's n_ok distribution
    for pairing in ("article", "trained"):
        sch = spec.Schedule(profile=spec.E16_PROFILE, pairing=pairing, seed=1)
        n = 20000
        draws = [sch.next(3) for _ in range(n)]
        dist = spec.nok_distribution(spec.E16_PROFILE, 3, pairing)
        for v in range(4):
            assert abs(draws.count(v) / n - dist[v]) < 0.015, (pairing, v)
    assert spec.nok_distribution((0.5, 0.5), 2, "article") == [0.5, 0.25, 0.25]
    assert spec.nok_distribution((0.5,), 2, "trained") == [0.0, 0.5, 0.5]
    with pytest.raises(spec.ScheduleError):
        spec.nok_distribution((0.5,), 3, "trained")


# ---- 3. the strict tail -----------------------------------------------------------------------------------
def test_strict_tail_plain_steps(model, starts, refs):
    # every round accepts nothing: one token per round; at 2 left < k=3 the strict batch
    # cannot verify, so the article's driver stops speculating and finishes with 2 plain M=1 steps
    zeros = spec.Schedule(seq=[0], pairing="article")
    r = spec.run_spec(model, starts[2], T, 3, "replay", "replay", schedule=zeros, reference=refs[2], greedy=False)
    assert r.batch == "strict" and r.tail_mode == "plain"
    assert len(r.rounds) == T - 2 and r.tail_tokens == 2
    assert all(x.k == 3 for x in r.rounds)
    assert r.bit_exact
    assert any(line.startswith("[spec] tail: 2 token(s) by plain M=1 steps") for line in r.log_lines())
    # tail='shrink' on the strict engine: the short batch is rejected (the article's bug)
    with pytest.raises(BatchWidthError, match="strict"):
        spec.run_spec(model, starts[2], T, 3, "replay", "replay", schedule=zeros, reference=refs[2], greedy=False,
                      tail="shrink")
    # a flex engine shrinks the last rounds instead: no tail
    f = spec.run_spec(model, starts[2], T, 3, "flex-replay", "replay", schedule=zeros, reference=refs[2], greedy=False)
    assert f.tail_tokens == 0 and [x.k for x in f.rounds[-3:]] == [3, 2, 1] and f.bit_exact


# ---- 4. deliberately wrong variants -----------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICIES)
def test_ghost_tokens_when_the_self_token_is_emitted(model, starts, refs, policy):
    ref = refs[3]
    r = spec.run_spec(model, starts[3], 40, 2, policy, "mtp", reference=ref[:40], greedy=False,
                      mistakes=spec.Mistakes(emit_self=True), check=False)
    assert r.stream != ref[:40]
    ghosts, pos = [], 0
    for x in r.rounds:              # n_ok >= 1 every round (d_1 is free): each round ends on a ghost
        pos += len(x.emitted)
        assert x.emitted[-1] == x.self_token
        ghosts.append(pos - 1)
    ghosts = [g for g in ghosts if g < len(r.stream)]
    for g in ghosts[:-1]:           # the next round emits the same token again: a duplicate
        assert r.stream[g + 1] == r.stream[g]
    clean = [t for i, t in enumerate(r.stream) if i not in set(ghosts)]
    assert clean == ref[:len(clean)]
    # with the per-round check on, the first ghost round is caught
    with pytest.raises(spec.InvariantError, match="consumed .* != emitted"):
        spec.run_spec(model, starts[3], 40, 2, policy, "mtp", reference=ref[:40], greedy=False,
                      mistakes=spec.Mistakes(emit_self=True))


@pytest.mark.parametrize("policy", POLICIES)
def test_double_consumption_raises(model, starts, refs, policy):
    with pytest.raises(CursorError, match="double consumption"):
        spec.run_spec(model, starts[0], 16, 3, policy, "mtp-article", reference=refs[0][:16], greedy=False,
                      mistakes=spec.Mistakes(double_consume=True))


def test_draft_feed_after_shifts_by_one_place(model, rng):
    """DraftFeed.after(t), the double-consumption verify's tokens: [t] + the feed without its
    last token, with a host head (the trained pairing's d1) or without, down to a feed of heads."""
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    e = kestrel.Engine(model, max_seq=16, mmax=4)
    e.prefill([int(t) for t in rng.integers(0, V, 3)])
    d = e.mtp_draft(0, int(rng.integers(0, V)), rng.standard_normal(D).astype(np.float32), 3)
    t, d1 = (int(x) for x in rng.integers(0, V, 2))
    for feed in (d.feed(), d.feed([d1], n=2), d.feed([d1], n=0)):
        moved = feed.after(t)
        assert len(moved) == len(feed) and moved.host() == ([t] + feed.host())[:len(feed)]
    with pytest.raises(CursorError, match="double consumption"):
        spec.run_spec(model, [int(x) for x in rng.integers(0, V, 6)], 8, 3, "checkpoint", "mtp", greedy=False,
                      mistakes=spec.Mistakes(double_consume=True))


@pytest.mark.parametrize("drafter", ["mtp-article", "mtp"])
def test_negative_control_mtp_cursor_left_out_of_the_snapshot(model, starts, refs, drafter):
    """mark() before the draft and a driver that trusts rollback() to rewind the MTP slot: with
    the MTP cursor in the snapshot it behaves exactly like the standard round; without it the
    MTP rows drift, the drafts (and so the histogram) change, and the stream stays bit-exact."""
    differing = 0
    for prompt, ref in list(zip(starts, refs))[:3]:
        std = spec.run_spec(model, prompt, T, 3, "replay", drafter, reference=ref, greedy=False)
        good = spec.run_spec(model, prompt, T, 3, "replay", drafter, reference=ref, greedy=False,
                             mistakes=spec.Mistakes(mark_first=True))
        bad = spec.run_spec(model, prompt, T, 3, "replay", drafter, reference=ref, greedy=False,
                            mistakes=spec.Mistakes(mark_first=True, mark_mtp_cursor=False))
        assert [x.drafts for x in good.rounds] == [x.drafts for x in std.rounds]
        assert all(x.mtp_cursor == x.p for x in good.rounds)
        assert good.bit_exact and bad.bit_exact
        if any(x.n_ok < x.k for x in bad.rounds[:-1]):          # a rollback happened: the slot drifted
            assert bad.rounds[-1].mtp_cursor > bad.rounds[-1].p
        differing += sum(a.drafts != b.drafts for a, b in zip(std.rounds, bad.rounds))
    assert differing > 0


def test_negative_control_primitive(model, starts):
    a = spec.mtp_cursor_control(model, starts[4], k=3, include_mtp_cursor=True)
    assert a["cursor_after_rollback"] == a["cursor_at_mark"] and a["same"]
    b = spec.mtp_cursor_control(model, starts[4], k=3, include_mtp_cursor=False)
    assert b["cursor_after_rollback"] == b["cursor_after_draft"] == b["cursor_at_mark"] + 3


@pytest.fixture(scope="module")
def mtp_runs(model, starts, refs):
    """The correct 'mtp' drafter, checkpoint policy, k=3, on every start (shared by the feed tests)."""
    return [spec.run_spec(model, p, T, 3, "checkpoint", "mtp", reference=r, greedy=False) for p, r in zip(starts, refs)]


@pytest.mark.parametrize("feed", ["article-pairing", "stale-hidden"])
def test_wrong_mtp_inputs_stay_bit_exact(model, starts, refs, mtp_runs, feed):
    acc_good = acc_bad = rounds_good = rounds_bad = changed = 0
    for prompt, ref, good in zip(starts, refs, mtp_runs):
        bad = spec.run_spec(model, prompt, T, 3, "checkpoint", "mtp", reference=ref, greedy=False,
                            mistakes=spec.Mistakes(feed=feed))
        assert bad.bit_exact, "the construction guarantee holds whatever the drafter is fed"
        assert bad.summary().variants == {"feed": feed}
        acc_good += sum(good.noks)
        acc_bad += sum(bad.noks)
        rounds_good += len(good.rounds)
        rounds_bad += len(bad.rounds)
        changed += sum(a.drafts != b.drafts for a, b in zip(good.rounds, bad.rounds))
    assert changed > 0, "the wrong inputs reach the MTP"
    if TRAINED:     # a trained MTP: acceptance collapses with the wrong inputs
        assert acc_bad / rounds_bad < acc_good / rounds_good


@pytest.mark.parametrize("drafter", ["mtp-article", "mtp"])
def test_mtp_fill_keeps_every_draft(model, starts, refs, drafter, monkeypatch):
    """The drafters write the prompt's MTP rows with mtp_fill (no MLP, norm or head), and the
    negative control's re-appended rows after a rollback (the standard round's rewrite rides in
    the next chain: test_draft_chain_drafts_as_mtp_steps_did checks it against a separate fill);
    a run whose every fill is a whole mtp_step has the same drafts, n_ok and stream, round by
    round."""
    variants = [spec.Mistakes(), spec.Mistakes(mark_first=True)]
    lean = [spec.run_spec(model, starts[i], T, 3, "replay", drafter, reference=refs[i], greedy=False, mistakes=w)
            for i in (0, 3) for w in variants]
    calls = []

    def fill_by_step(self, pos, token, hidden):
        calls.append(pos)
        self.mtp_step(pos, token, hidden)

    monkeypatch.setattr(kestrel.Engine, "mtp_fill", fill_by_step)
    whole = [spec.run_spec(model, starts[i], T, 3, "replay", drafter, reference=refs[i], greedy=False, mistakes=w)
             for i in (0, 3) for w in variants]
    assert calls, "the drafter filled no MTP row"
    for a, b in zip(lean, whole):
        assert a.bit_exact and b.bit_exact and a.stream == b.stream
        assert [(x.p, x.drafts, x.n_ok, x.mtp_cursor) for x in a.rounds] == \
               [(x.p, x.drafts, x.n_ok, x.mtp_cursor) for x in b.rounds]


@pytest.mark.parametrize("drafter", ["mtp-article", "mtp", "replay"])
def test_draft_chain_drafts_as_mtp_steps_did(model, starts, refs, drafter, monkeypatch):
    """The drafters draft through one Engine.mtp_draft a round; runs whose chain is k mtp_step
    calls, each fed the argmax of the one before (or the replay oracle's forced token), have the
    same drafts, n_ok, MTP cursor and stream, round by round: standard rounds, the negative
    control (mark first, which re-appends the rows the chain recorded) with and without the MTP
    cursor in the snapshot, and the replay drafter's forced tokens under either pairing."""
    runs = [(spec.Mistakes(), None), (spec.Mistakes(mark_first=True), None),
            (spec.Mistakes(mark_first=True, mark_mtp_cursor=False), None)]
    if drafter == "replay":
        runs = [(spec.Mistakes(), pr) for pr in ("article", "trained")] + \
               [(spec.Mistakes(mark_first=True), pr) for pr in ("article", "trained")]

    def go():
        out = []
        for i in (0, 3):
            for w, pr in runs:
                need = len(starts[i]) + T + 5 + (T + 1) * 4 * w.mark_first     # as run_spec sizes its own
                eng = kestrel.Engine(model, max_seq=min(need, model.cfg.max_position_embeddings), mmax=3,
                                     batch="strict")
                r = spec.run_spec(model, starts[i], T, 3, "replay", drafter, reference=refs[i], greedy=False,
                                  mistakes=w, engine=eng,
                                  schedule=None if pr is None else spec.Schedule(seq=[3, 1, 2], pairing=pr))
                out.append((r, eng.snapshot_state()))      # the MTP rows too: forced feeds leave no other trace
        return out
    chained = go()
    calls = []

    def counted(self, pos, token, hidden, k, forced=None, fill_tokens=None, fill_hidden=None):
        calls.append(k)
        return draft_by_steps(self, pos, token, hidden, k, forced, fill_tokens, fill_hidden)

    monkeypatch.setattr(kestrel.Engine, "mtp_draft", counted)
    stepped = go()
    assert calls, "no draft chain ran"
    for (a, sa), (b, sb) in zip(chained, stepped):
        assert a.bit_exact and b.bit_exact and a.stream == b.stream
        assert [(x.p, x.drafts, x.n_ok, x.mtp_cursor) for x in a.rounds] == \
               [(x.p, x.drafts, x.n_ok, x.mtp_cursor) for x in b.rounds]
        for key in ("mtp_kc", "mtp_vc"):
            assert np.array_equal(sa[key], sb[key]), key


# ---- 5. teacher-forced acceptance -------------------------------------------------------------------------
def brute_force_acceptance(model, prompt, stream, depth, pairing):
    """Independent recount: per anchor a fresh engine, its own prefill and MTP rows."""
    toks = list(prompt) + list(stream)
    P, L = len(prompt), len(toks) - 1
    off = 1 if pairing == "trained" else 0          # written out here, independently of Pairing.offset
    c, e, hits_all = [0] * depth, [0] * depth, []
    for i in range(P - 1, L - off):
        eng = kestrel.Engine(model, max_seq=i + depth + 3, mmax=1, batch="flex")
        H = eng.prefill(toks[:i + 1]).hidden
        for r in range(i):
            eng.mtp_step(r, toks[r + off], H[r])
        x, h, hits = toks[i + off], H[i], []
        for j in range(1, depth + 1):
            if i + off + j > L:
                break
            e[j - 1] += 1
            s = eng.mtp_step(i + j - 1, x, h)
            pred = int(kestrel.to_numpy(s.logits).argmax())
            hits.append(int(pred == toks[i + off + j]))
            if not hits[-1]:
                break
            c[j - 1] += 1
            x, h = pred, s.hidden
        hits_all.append(hits)
    return c, e, hits_all


@pytest.mark.parametrize("pairing", ["trained", "article"])
def test_teacher_forced_matches_brute_force(model, starts, refs, pairing):
    for idx in (0, 5):
        stream = refs[idx][:24]
        acc = spec.teacher_forced(model, starts[idx], stream, depth=4, pairing=pairing)
        c, e, hits = brute_force_acceptance(model, starts[idx], stream, 4, pairing)
        assert (acc.c, acc.e, acc.hits) == (c, e, hits)
        assert acc.N == len(hits) == e[0]


def test_teacher_forced_predicts_the_mtp_drafter_rounds(model, starts, refs):
    """Under the trained pairing the drafter's slot holds exactly the verified rows, so every real
    round's n_ok is what the teacher-forced hits at its anchor imply."""
    for idx in (1, 4):
        acc = spec.teacher_forced(model, starts[idx], refs[idx], depth=4, pairing="trained")
        for k in (2, 4):
            r = spec.run_spec(model, starts[idx], T, k, "checkpoint", "mtp", reference=refs[idx], greedy=False)
            assert r.noks == [spec.implied_nok(acc, x.p, x.k) for x in r.rounds]


def test_acceptance_formulas_reproduce_e16():
    # the article's E16 (T=63, k=4): alpha 0.714 0.364 0.500 0.750, p 0.714 0.254 0.127 0.095, E[len] 2.190
    a = Acceptance(pairing=spec.Pairing.TRAINED, depth=4, N=63, c=[45, 16, 8, 6], e=[63, 44, 16, 8])
    assert [round(x, 3) for x in a.alpha] == [0.714, 0.364, 0.5, 0.75]
    assert [round(x, 3) for x in a.p] == [0.714, 0.254, 0.127, 0.095]
    assert round(a.E_len, 3) == 2.190
    assert a.advance(1) == 1.0 and round(a.advance(3), 4) == round(1 + 45 / 63 + 16 / 63, 4)
    tot = spec.combine([a, a])
    assert tot.N == 126 and tot.alpha == a.alpha


# ---- 6. summaries and the article's attribution -----------------------------------------------------------
def test_summary_reproduces_the_articles_attribution():
    # the article's corrected counts: rounds=48, accepted=32, n_ok=0 rounds=30; first-draft 18/48,
    # d2|d1 11/18, d3|d1d2 3/11
    noks = [0] * 30 + [1] * 7 + [2] * 8 + [3] * 3
    s = spec.summarize_noks(noks, k=3)
    assert (s.rounds, s.accepted, s.zero_rounds) == (48, 32, 30)
    assert [(c.hit, c.of) for c in s.cond_hits] == [(18, 48), (11, 18), (3, 11)]
    assert round(s.mean_per_round, 3) == 0.667
    assert s.first_draft_hit == 18 / 48
    assert spec.parse_hist("n_ok=0:24 n_ok=1:6 n_ok=2:11 n_ok=3:4") == spec.parse_hist("0:24,1:6,2:11,3:4")
    with pytest.raises(KestrelError):
        spec.parse_hist("0-24")


def test_aggregate_adds_runs(model, starts, refs):
    rs = [spec.run_spec(model, starts[i], 16, 2, "checkpoint", "mtp", reference=refs[i][:16], greedy=False)
          for i in (0, 1)]
    s = spec.aggregate(rs)
    assert s.rounds == len(rs[0].rounds) + len(rs[1].rounds)
    assert s.accepted == sum(rs[0].noks) + sum(rs[1].noks)
    assert s.T == 32 and s.runs == 2 and s.bit_exact is True and s.speedup is None
    assert set(s.phase_ms_per_token) == set(spec.PHASES)
    assert s.ms_per_token == pytest.approx((rs[0].spec_ms + rs[1].spec_ms) / 32, rel=1e-12)
    # the results-file round trip gives the same summary
    back = spec.RunSummary.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


def test_greedy_timed_equals_generate(model, starts, refs):
    out, ms, pre = spec.greedy_timed(model, starts[0], 20)
    assert out == refs[0][:20] and ms > 0 and pre > 0
    r = spec.run_spec(model, starts[0], 20, 2, "checkpoint", "mtp")      # greedy=True: timed in the same call
    assert r.reference == refs[0][:20] and r.bit_exact and r.summary().speedup > 0


def test_engine_reuse(model, starts, refs):
    """Benchmarks reuse engines (a GPU backend keys its captured plans on their buffers)."""
    eng = kestrel.Engine(model, max_seq=128, mmax=3, batch="strict")
    g = kestrel.Engine(model, max_seq=128, mmax=1, batch="flex")
    fresh = spec.run_spec(model, starts[0], 24, 3, "replay", "mtp-article", reference=refs[0][:24], greedy=False)
    for _ in range(2):     # a used engine is reset: the same rounds again
        r = spec.run_spec(model, starts[0], 24, 3, "replay", "mtp-article", engine=eng, greedy_engine=g)
        assert r.bit_exact and r.reference == refs[0][:24]
        assert [(x.drafts, x.n_ok) for x in r.rounds] == [(x.drafts, x.n_ok) for x in fresh.rounds]
    with pytest.raises(KestrelError, match="mmax"):
        spec.run_spec(model, starts[0], 24, 2, "replay", "mtp-article", engine=eng, greedy=False, reference=refs[0][:24])
    with pytest.raises(KestrelError, match="batch"):
        spec.run_spec(model, starts[0], 24, 3, "checkpoint", "mtp", engine=eng, greedy=False, reference=refs[0][:24])


# ---- 7. the cost model ---------------------------------------------------------------------------------------
UNITS = UnitCosts(step=10.0, step_m={1: 10.0, 2: 12.0, 3: 14.0}, ckpt={1: 11.0, 2: 13.0, 3: 15.0}, draft=1.0,
                  mtp={1: 1.0, 2: 1.5}, mark=2.0, rollback=2.0, select=0.1, truncate=0.0, argmax=0.5,
                  bookkeeping=0.5)


def test_cost_model_by_hand():
    u = UNITS
    # replay (the article's wall), article pairing, k=3, rounds {0: 2, 1: 1, 3: 1}
    #   n=0: draft 3 + mark 2 + verify 14 + rollback 2 + 1 step 10 + bookkeeping 0.5 = 31.5
    #   n=1: same = 31.5;  n=3: 3 + 2 + 14 + 0.5 = 19.5  -> 114 ms / 6 tokens = 19 ms/token
    p = spec.predict(u, "replay", "article", 3, hist="0:2 1:1 3:1")
    assert p.ms_per_token == pytest.approx(19.0)
    assert p.speedup == pytest.approx(10.5 / 19.0)
    assert p.advance_per_round == pytest.approx(1.5)
    # n=2: replay pays 2 M=1 steps, flex-replay one step_m(2)
    assert spec.predict(u, "replay", "article", 3, hist={2: 1}).ms_per_token == pytest.approx(41.5 / 2)
    assert spec.predict(u, "flex-replay", "article", 3, hist={2: 1}).ms_per_token == pytest.approx(33.5 / 2)
    # checkpoint, article pairing, n=0: draft 3 + ckpt 15 + select 0.1 + step 10 + bookkeeping 0.5
    assert spec.predict(u, "checkpoint", "article", 3, hist={0: 1}).ms_per_token == pytest.approx(28.6)
    # checkpoint, trained pairing, profile (0.5, 0.5): P(n=1,2,3) = .5, .25, .25
    #   n=1: 2 drafts + 15 + 0.1 + 0.5 = 17.6; n=2: + rewrite mtp[1] = 18.6; n=3: + mtp[2] = 19.1
    p = spec.predict(u, "checkpoint", "trained", 3, profile=(0.5, 0.5))
    assert p.round_ms == pytest.approx(0.5 * 17.6 + 0.25 * 18.6 + 0.25 * 19.1)
    assert p.advance_per_round == pytest.approx(1.75)
    assert p.ms_per_token == pytest.approx(18.225 / 1.75)
    # trained pairing, k=1: no draft step, one rewrite row per round
    assert spec.round_cost(u, "checkpoint", "trained", 1, 1)["sync"] == pytest.approx(1.0)
    assert spec.round_cost(u, "checkpoint", "trained", 1, 1)["draft"] == 0.0
    # a measured chain table prices a round's draft steps as one chain (its fixed cost paid once)
    uc = dataclasses.replace(u, chain={1: 1.7, 2: 2.4, 3: 3.1})
    assert [spec.round_cost(uc, "checkpoint", "trained", k, 1)["draft"] for k in (1, 2, 3)] == [0.0, 1.7, 2.4]
    assert spec.round_cost(uc, "checkpoint", "article", 3, 1)["draft"] == 3.1
    assert spec.edit_units(uc, draft=2.0).chain == {1: 3.4, 2: 4.8, 3: 6.2}
    # a sequence with T: the tokens the rounds leave are the strict tail, step + argmax each
    p = spec.predict(u, "replay", "article", 3, seq=[0, 3], T=6)
    assert p.tail_tokens == 2 and p.total_ms == pytest.approx(31.5 + 19.5 + 2 * 10.5)
    assert p.ms_per_token == pytest.approx(72.0 / 6)
    with pytest.raises(spec.ScheduleError, match="n_ok=0"):
        spec.predict(u, "replay", "trained", 3, hist="0:1")
    with pytest.raises(spec.ScheduleError, match="> k=3"):
        spec.predict(u, "replay", "article", 3, hist="4:1")


def test_policy_and_pairing_dispatch():
    """Names are parsed once into types; the round and the cost model dispatch through them."""
    assert spec.Policy.parse("checkpoint") is spec.CHECKPOINT is spec.POLICIES["checkpoint"]
    named = [spec.POLICIES[n] for n in ("replay", "flex-replay", "checkpoint")]
    assert [p.batch for p in named] == ["strict", "flex", "flex"]
    assert [p.uses_mark for p in named] == [True, True, False]
    with pytest.raises(spec.SpecArgumentError, match=r"known: \('replay', 'flex-replay', 'checkpoint'"):
        spec.Policy.parse("fast")
    with pytest.raises(spec.SpecArgumentError, match=r"known: \('article', 'trained'\)"):
        spec.Pairing.parse("mtp")
    assert [(p.offset, p.min_nok, p.mtp_steps(3), p.judged_depths(3)) for p in spec.Pairing] == \
        [(0, 0, 3, 3), (1, 1, 2, 2)]
    # each policy's cost formula is its own: the checkpoint policy prices no mark and no replay of accepted rows
    assert spec.CHECKPOINT.cost(UNITS, 3, 2) == {"verify": 15.0, "undo": 0.1}
    assert spec.FLEX_REPLAY.cost(UNITS, 3, 2) == {"mark": 2.0, "verify": 14.0, "undo": 2.0, "replay": 12.0}
    assert spec.REPLAY.cost(UNITS, 3, 3) == {"mark": 2.0, "verify": 14.0}


class SelectAndReplay(spec.Policy):
    """A fourth policy, written here as a user would: the verify's slot 0 restores the state, then
    the accepted rows are replayed in one batch. Nothing else in kestrel knows about it."""
    name, batch, doc = "select-and-replay", "flex", "verify_checkpointed; select slot 0; one batched replay"

    def verify(self, eng, pos, drafts):
        return eng.verify_checkpointed(pos, drafts)

    def finalise(self, eng, s, p, consumed, n_ok, k, lap):
        eng.select_checkpoint(0)
        lap("undo")
        s2 = eng.step_m(p + 1, consumed)
        lap("replay")
        return spec.Finalised(s2.hidden, s2.logits[len(consumed) - 1],
                              replayed_logits=[s2.logits[j] for j in range(len(consumed))])

    def cost(self, u, k, n):
        return {"verify": u.get("ckpt", k), "undo": u.select, "replay": u.get("step_m", max(n, 1))}


def test_a_new_policy_is_one_object(model, starts, refs):
    pol = SelectAndReplay()
    for drafter in ("mtp-article", "mtp"):
        r = spec.run_spec(model, starts[5], T, 3, pol, drafter, reference=refs[5], greedy=False, check_rows=True)
        assert r.bit_exact and r.policy is pol and r.summary().phase_ms_per_token["mark"] == 0.0
        ref = spec.run_spec(model, starts[5], T, 3, "checkpoint", drafter, reference=refs[5], greedy=False)
        assert r.noks == ref.noks            # the same drafts and verdicts; only the undo differs
    # n=2 of k=3, article pairing: 3 drafts + ckpt 15 + select 0.1 + step_m(2) 12 + sync 0 + bookkeeping 0.5
    assert spec.predict(UNITS, pol, "article", 3, hist={2: 1}).round_ms == pytest.approx(30.6)


def test_cost_model_prices_a_measured_run(model, starts, refs):
    r = spec.run_spec(model, starts[0], 32, 3, "replay", "replay", schedule=spec.Schedule(seq=[0, 2, 3, 1]),
                      reference=refs[0][:32], greedy=False)
    pr = spec.predict_result(UNITS, r)
    want = sum(sum(spec.round_cost(UNITS, "replay", "article", x.k, x.n_ok).values()) for x in r.rounds)
    assert pr.total_ms == pytest.approx(want + r.tail_tokens * 10.5)
    u = spec.measure_unit_costs(model, k_max=3, ctx=16, reps=2)
    assert set(u.step_m) == set(u.ckpt) == set(u.mtp) == set(u.chain) == {1, 2, 3}
    assert all(v > 0 for v in u.chain.values()) and u.draft == u.chain[3] / 3
    c = spec.compare(u, [r])
    assert c["T"] == 32 and c["predicted_ms_per_token"] > 0 and c["measured_ms_per_token"] > 0
    assert set(c["predicted_phase_ms"]) == set(spec.PHASES)


# ---- 8. the CLI and the benchmark script ---------------------------------------------------------------------
def test_cli_spec(tmp_path, capsys):
    from kestrel.__main__ import main
    out = tmp_path / "out.json"
    rc = main(["spec", "--model", "test-b", "--device", "cpu", "--k", "2", "--T", "12", "--starts", "0,1",
               "--drafter", "mtp-article", "--policy", "replay", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    assert text.count("memcmp=0 => PASS") == 3 and "== overall: 2 start(s)" in text
    assert "[spec] rounds=" in text and "n_ok histogram: n_ok=0:" in text and "speedup" in text
    d = json.loads(out.read_text())
    assert len(d["starts"]) == 2 and d["summary"]["bit_exact"] is True
    assert spec.RunSummary.from_dict(d["summary"]).pairing is spec.Pairing.ARTICLE
    rc = main(["spec", "--model", "test-b", "--device", "cpu", "--k", "3", "--T", "64", "--starts", "0",
               "--drafter", "replay", "--hist", "0:24 1:6 2:11 3:4", "--policy", "replay"])
    assert rc == 0
    assert "[spec] rounds=45 accepted=40 mean/round=0.889 => advance/round=1.422 (n_ok=0 rounds=24)" in \
        capsys.readouterr().out


def test_bench_script_quick(tmp_path):
    # --model-a test-b keeps it fast; the tiny model itself is covered by every other test here
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_spec.py"), "--quick", "--model-a", "test-b",
           "--out", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    d = json.loads((tmp_path / "bench_spec_quick.json").read_text())
    assert {"device", "date", "command", "tiny", "large"} <= set(d)
    assert all(row["bit_exact"] for row in d["tiny"]["runs"])
    assert all(row["bit_exact"] for row in d["large"]["runs"])
    assert all("predicted_ms_per_token" in row for row in d["large"]["runs"])
    runs = [spec.RunSummary.from_dict(row) for row in d["tiny"]["runs"] + d["large"]["runs"]]
    assert all(r.predicted_speedup > 0 for r in runs)
    md = (tmp_path / "bench_spec_quick.md").read_text()
    assert "speedup" in md and "predicted" in md


@pytest.mark.parametrize("policy", list(spec.POLICIES))
def test_finalised_names_the_verify_row_its_logits_are(model, starts, policy):
    """A policy's Finalised says which verify row its logits are (the driver then reuses that
    row's argmax for a_p' instead of a second argmax and read); None where they came from another
    call: the extra step of n_ok = 0 and the replayed rows of the replay policies."""
    pol, k = spec.POLICIES[policy], 3
    drafts = [int(t) for t in np.random.default_rng(7).integers(0, model.cfg.vocab_size, k)]
    for n_ok in range(k + 1):
        eng = kestrel.Engine(model, max_seq=64, mmax=k, batch=pol.batch)       # a fresh engine each time
        s0 = eng.prefill(starts[1])
        p = eng.cursor - 1
        if pol.uses_mark:
            eng.mark()
        s = pol.verify(eng, p + 1, drafts)
        consumed = drafts[:n_ok] if n_ok else [int(model.be.argmax(s0.logits[-1]))]
        fin = pol.finalise(eng, s, p, consumed, n_ok, k, lambda name: None)
        assert pol.logits_are_a_verify_row(k, n_ok) == (fin.verify_row is not None)   # what the cost model reads
        if n_ok == 0 or (pol.uses_mark and n_ok < k):
            assert fin.verify_row is None
        else:
            assert fin.verify_row == n_ok - 1
            assert np.array_equal(model.be.to_numpy(fin.logits), model.be.to_numpy(s.logits[n_ok - 1]))


def test_cost_model_prices_a_second_argmax_only_where_the_round_takes_one():
    """Unit costs that say their bookkeeping holds only the verify rows' argmax: a round adds one
    argmax + read for a_p' where its logits are not a verify row (n_ok = 0; a replay policy's
    replayed rows; a policy that does not say). Older unit costs already hold it: unchanged."""
    u0 = dataclasses.replace(UNITS, cached={1: 10.5, 2: 12.5, 3: 14.5}, fold={0: 0.05, 1: 1.0, 2: 1.2, 3: 1.4})
    u = dataclasses.replace(u0, meta=dict(u0.meta, bookkeeping_unit="verify rows"))
    bk = UNITS.bookkeeping
    assert u.argmax > 0
    for pol in ("checkpoint", "input-cache"):
        assert spec.round_cost(u, pol, "article", 3, 2)["bookkeeping"] == bk
        assert spec.round_cost(u, pol, "article", 3, 0)["bookkeeping"] == bk + u.argmax
    for pol in ("replay", "flex-replay"):
        assert spec.round_cost(u, pol, "article", 3, 3)["bookkeeping"] == bk
        assert spec.round_cost(u, pol, "article", 3, 2)["bookkeeping"] == bk + u.argmax
    assert spec.round_cost(u, SelectAndReplay(), "article", 3, 3)["bookkeeping"] == bk + u.argmax
    for pol in spec.POLICIES:
        for n in range(4):
            assert spec.round_cost(u0, pol, "article", 3, n)["bookkeeping"] == bk


def test_cost_model_prices_the_rewrite_in_the_next_chain():
    """Unit costs with a chain_fill table: the trained pairing's n_ok - 1 rewrite rows ride in the
    next chain's first pass, so the draft phase pays chain_fill[r] - chain[1] and the sync only
    the truncate; with k = 1 (no chain) an mtp_fill of the rows, in the draft phase too. Unit
    costs without the table price the rewrite as an mtp_fill in the sync, as before."""
    uc = dataclasses.replace(UNITS, chain={1: 1.7, 2: 2.4, 3: 3.1}, chain_fill={1: 1.8, 2: 1.85})
    for n, extra in ((1, 0.0), (2, 0.1), (3, 0.15)):
        c = spec.round_cost(uc, "checkpoint", "trained", 3, n)
        assert c["draft"] == pytest.approx(2.4 + extra) and c["sync"] == uc.truncate
    c = spec.round_cost(uc, "checkpoint", "trained", 1, 1)
    assert c["draft"] == pytest.approx(uc.mtp[1]) and c["sync"] == uc.truncate
    assert spec.round_cost(uc, "checkpoint", "article", 3, 3)["draft"] == 3.1          # no rewrite
    u_old = dataclasses.replace(uc, chain_fill={})
    assert spec.round_cost(u_old, "checkpoint", "trained", 3, 3)["sync"] == pytest.approx(uc.mtp[2])
    assert spec.edit_units(uc, draft=2.0).chain_fill == {1: 3.6, 2: 3.7}


def test_trained_drafter_holds_the_rewrite_rows_for_its_next_chain(model, starts, refs, monkeypatch):
    """After every round of the 'mtp' drafter, the MTP cursor plus the rows it holds is p (the
    round checks it), the held rows are the round's n_ok - 1 past the exact first one, and the
    run makes no mtp_fill call of its own after the prompt's: the rows go in the chains."""
    calls = []
    orig = kestrel.Engine.mtp_fill

    def counted(self, pos, token, hidden):
        calls.append(pos)
        return orig(self, pos, token, hidden)

    held = []
    d = spec.make_drafter("mtp")
    monkeypatch.setattr(kestrel.Engine, "mtp_fill", counted)
    r = spec.run_spec(model, starts[0], T, 3, "checkpoint", d, reference=refs[0],
                      on_round=lambda rec: held.append((rec.k, rec.n_ok, d.pending_rows)))
    assert r.bit_exact and held
    assert [h for _, _, h in held] == [spec.Pairing.TRAINED.rewrite_rows(k, n) for k, n, _ in held]
    assert any(h for _, _, h in held), "no round left rows to rewrite"
    chainless = sum(1 for (_, _, h), (k2, _, _) in zip(held, held[1:]) if h and k2 == 1)  # no chain: an mtp_fill
    assert len(calls) == 1 + chainless and calls[0] == 0, calls


def test_drafter_keeps_its_held_rows_when_the_chain_raises(model, rng):
    """The trained-pairing drafter lets go of the rows it holds only once the engine call that
    writes them returns: a chain the engine refuses (past max_seq) leaves them held and the engine
    unchanged, and the next valid draft writes them first."""
    from kestrel.speculative.drafters import RoundCtx
    V = model.cfg.vocab_size
    prompt = [int(t) for t in rng.integers(0, V, 5)]
    eng = kestrel.Engine(model, max_seq=16, mmax=3)
    s = eng.prefill(prompt)
    d = spec.make_drafter("mtp")
    d.bind(model, None)
    d.start(eng, prompt, s.hidden)                       # MTP rows 0..3, cursor 4
    d.fill = ([int(rng.integers(0, V))], s.hidden[3:4])  # row 4 held; the chain starts at p = 5
    ctx = RoundCtx(p=5, t_p=prompt[-1], h_p=s.hidden[4], h_prev=s.hidden[3], a_p=int(rng.integers(0, V)),
                   emitted=0, P=5)
    before = eng.snapshot_state()
    with pytest.raises(kestrel.CursorError, match="exceed max_seq"):
        d.draft(eng, ctx, 40, 5)
    assert d.pending_rows == 1
    after = eng.snapshot_state()
    assert all(np.array_equal(before[k], after[k]) if isinstance(before[k], np.ndarray) else before[k] == after[k]
               for k in before)
    d.draft(eng, ctx, 3, 5)
    assert d.pending_rows == 0 and eng.mtp_cursor == 5 + 2
