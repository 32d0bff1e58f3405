"""The speculative driver's arguments: histograms, sequences, profiles, prompts, T and k.

Each bad argument is a named error (ScheduleError, SpecArgumentError, TokenError), raised before
any engine state changes: every case passes in an engine that has decoded a random prompt, and
checks it is bit-identical afterwards. Nothing is clamped, merged or truncated.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import kestrel
from kestrel import speculative as spec
from kestrel.errors import KestrelError, TokenError

K = 3


@pytest.fixture(scope="module")
def model():
    return kestrel.load("tiny", device="cpu")


@pytest.fixture
def prompt(model, rng):
    return [int(t) for t in rng.integers(0, model.cfg.vocab_size, 9)]


@pytest.fixture
def engines(model, rng):
    """A spec engine (mmax=K, flex) and a greedy engine, each holding a random decoded state."""
    eng = kestrel.Engine(model, max_seq=96, mmax=K, batch="flex")
    g = kestrel.Engine(model, max_seq=96, mmax=1, batch="flex")
    toks = [int(t) for t in rng.integers(0, model.cfg.vocab_size, 12)]
    for e in (eng, g):
        s = e.prefill(toks)
        e.step(e.cursor, int(model.be.argmax(s.logits[-1])))
    eng.mtp_step(0, toks[1:], s.hidden[:-1])
    eng.mark()
    return eng, g


def same_state(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    return all(np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


def refused(model, engines, error, match, prompt, T=8, k=K, policy="checkpoint", drafter="mtp", **kw):
    """run_spec raises `error` (matching `match`) and both engines stay bit-identical."""
    eng, g = engines
    before = eng.snapshot_state(), g.snapshot_state()
    with pytest.raises(error, match=match):
        spec.run_spec(model, prompt, T, k, policy, drafter, engine=eng, greedy_engine=g, **kw)
    assert same_state(eng.snapshot_state(), before[0]) and same_state(g.snapshot_state(), before[1])


def replay(**schedule):
    return dict(drafter="replay", schedule=spec.Schedule(**schedule))


# ---- histograms ----------------------------------------------------------------------------------
@pytest.mark.parametrize("hist, match", [
    ("0:3 4:1", r"n_ok=4 > k=3"),                   # n_ok > k: refused, not clamped
    ({0: 2, 5: 1}, r"n_ok=5 > k=3"),
])
def test_histogram_beyond_k(model, engines, prompt, hist, match):
    refused(model, engines, spec.ScheduleError, match, prompt, **replay(hist=hist))


@pytest.mark.parametrize("hist, match", [
    ("0:3 0:2", "twice"),                           # duplicate entries: refused, not merged
    ("n_ok=1:3 1:2", "twice"),
    ({0: 1, "0": 2}, "twice"),
    ({0: 1.5, 1: 2}, "non-negative int"),           # fractional counts: refused, not truncated
    ({0: 2.0}, "non-negative int"),
    ({0: -1, 1: 2}, "non-negative int"),            # negative counts
    ({0: True}, "non-negative int"),
    ("0:-1 1:2", "not 'n_ok:count'"),
    ("0:1.5", "not 'n_ok:count'"),
    ("0:0 1:0", "no rounds"),                       # all-zero
    ({-1: 2}, "not an n_ok"),
    ({1.0: 2}, "not an n_ok"),
    ([1, 2], "a histogram is"),
])
def test_histogram_refused_when_built(hist, match):
    with pytest.raises(spec.ScheduleError, match=match):
        spec.Schedule(hist=hist)


def test_histogram_entries_must_fit_the_pairing(model, engines, prompt):
    with pytest.raises(spec.ScheduleError, match="n_ok=0"):
        spec.Schedule(hist="0:2 1:3", pairing="trained")
    # n_ok = 0 with count 0 is what a trained-pairing run's own histogram holds: accepted
    assert spec.Schedule(hist={0: 0, 1: 3, 2: 1}, pairing="trained").hist == {0: 0, 1: 3, 2: 1}


# ---- sequences and profiles -----------------------------------------------------------------------
def test_sequence_beyond_k(model, engines, prompt):
    refused(model, engines, spec.ScheduleError, r"n_ok=4 > k=3", prompt, **replay(seq=[1, 4, 2]))


@pytest.mark.parametrize("seq, match", [
    ([1, 2.0], "non-negative ints"),
    ([1, True], "non-negative ints"),
    ([1, -1], "non-negative ints"),
    ([], "empty"),
    ("012", "list of ints"),
])
def test_sequence_refused_when_built(seq, match):
    with pytest.raises(spec.ScheduleError, match=match):
        spec.Schedule(seq=seq)


@pytest.mark.parametrize("profile, match", [
    ((0.5, 1.5, 0.5), "rates in"),
    ((0.5, math.nan, 0.5), "rates in"),
    ((0.5, True, 0.5), "rates in"),
    ((), "empty"),
    ("0.5,abc", "comma-separated rates"),
])
def test_profile_refused(profile, match):
    with pytest.raises(spec.ScheduleError, match=match):
        spec.Schedule(profile=profile)


def test_profile_too_short_for_k(model, engines, prompt):
    # k=3 judges 3 depths under the article's pairing, 2 under the trained one
    refused(model, engines, spec.ScheduleError, "judges 3", prompt, **replay(profile=(0.5, 0.5), pairing="article"))
    refused(model, engines, spec.ScheduleError, "judges 2", prompt, **replay(profile=(0.5,), pairing="trained"))


# ---- prompts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad, match", [
    (lambda p: [float(t) for t in p], "not an int token id"),          # floats: refused, not truncated
    (lambda p: [str(t) for t in p], "not an int token id"),            # strings: refused
    (lambda p: "".join(chr(65 + t % 26) for t in p), "list of int token ids"),
    (lambda p: [True] + p[1:], "not an int token id"),                 # a bool inside a token list
    (lambda p: p[:-1] + [256], "outside the vocabulary"),
    (lambda p: p[:-1] + [2 ** 70], "outside the vocabulary"),
    (lambda p: p[:-1] + [-1], "outside the vocabulary"),
    (lambda p: np.array(p, dtype=np.float64), "not an int token id"),
    (lambda p: np.array([p, p]), "1-D"),
    (lambda p: [], "at least one token"),
])
def test_prompt_refused(model, engines, prompt, bad, match):
    refused(model, engines, TokenError, match, bad(prompt))


def test_numpy_ints_accepted(model, prompt):
    """numpy integers are ints: for the prompt, T and k (refused before)."""
    want = spec.run_spec(model, prompt, 8, 2, "checkpoint", "mtp")
    got = spec.run_spec(model, np.array(prompt, dtype=np.int32), np.int64(8), np.int32(2), "checkpoint", "mtp")
    assert got.stream == want.stream and got.bit_exact and got.k == 2 and type(got.k) is int
    sch = spec.Schedule(seq=np.array([0, 2, 1]), seed=np.int64(3))
    r = spec.run_spec(model, prompt, np.int16(8), 2, "replay", "replay", schedule=sch)
    assert r.noks[:3] == [0, 2, 1] and r.bit_exact


# ---- T, k and names ----------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [0, -1, 8.0, True, "8", None])
def test_T_refused(model, engines, prompt, T):
    refused(model, engines, spec.SpecArgumentError, "T must be an int >= 1", prompt, T=T)


def test_T_bounded_by_max_position_embeddings(model, engines, prompt):
    limit = model.cfg.max_position_embeddings
    refused(model, engines, spec.SpecArgumentError, f"max_position_embeddings={limit}", prompt,
            T=limit - len(prompt) + 1)


@pytest.mark.parametrize("k", [0, -2, 2.0, True, "3"])
def test_k_refused(model, engines, prompt, k):
    refused(model, engines, spec.SpecArgumentError, "k must be an int >= 1", prompt, k=k)


@pytest.mark.parametrize("kw, match", [
    (dict(policy="fast"), r"unknown policy 'fast'; known: \('replay', 'flex-replay', 'checkpoint'"),
    (dict(drafter="mtp-seed"), r"unknown drafter 'mtp-seed'; known: \('mtp-article', 'mtp', 'replay'\)"),
    (dict(drafter="replay"), "needs schedule="),
    (dict(drafter="mtp", schedule=spec.Schedule(seq=[1])), "belongs to the replay drafter"),
    (dict(tail="short"), "tail must be one of"),
    (dict(policy="checkpoint", mistakes=spec.Mistakes(mark_first=True)), "takes no mark"),
    (dict(drafter="mtp-article", mistakes=spec.Mistakes(feed="stale-hidden")), "belong to the 'mtp' drafter"),
    (dict(mistakes={"emit_self": True}), "spec.Mistakes"),
])
def test_names_and_options_refused(model, engines, prompt, kw, match):
    refused(model, engines, spec.SpecArgumentError, match, prompt, **kw)


def test_pairing_name_refused():
    with pytest.raises(spec.SpecArgumentError, match=r"unknown pairing 'seed'; known: \('article', 'trained'\)"):
        spec.Schedule(seq=[1], pairing="seed")


def test_reference_and_engines_checked_first(model, engines, prompt):
    refused(model, engines, spec.SpecArgumentError, "reference has 7 tokens, T=8", prompt,
            reference=[1] * 7, greedy=False)
    refused(model, engines, TokenError, "not an int token id", prompt, reference=[1.0] * 8, greedy=False)
    refused(model, engines, spec.SpecArgumentError, "mmax", prompt, k=2)           # the spec engine has mmax=3
    refused(model, engines, spec.SpecArgumentError, "batch", prompt, policy="replay")   # ... and is flex
    small = kestrel.Engine(model, max_seq=8, mmax=1, batch="flex")
    eng, g = engines
    before = eng.snapshot_state()
    with pytest.raises(spec.SpecArgumentError, match="greedy_timed: engine= has max_seq=8"):
        spec.run_spec(model, prompt, 8, K, engine=eng, greedy_engine=small)
    assert same_state(eng.snapshot_state(), before)


def test_every_driver_error_is_a_kestrel_error():
    for cls in (spec.SpecArgumentError, spec.ScheduleError, spec.InvariantError, TokenError):
        assert issubclass(cls, KestrelError)
