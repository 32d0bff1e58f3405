"""The MTP wiring mistakes of chapter 4 (kestrel/lab/wiring.py): each is the mistake it names,
and each leaves the stream bit-exact."""
import numpy as np
import pytest

import kestrel
from kestrel import speculative as spec
from kestrel.lab import wiring


@pytest.fixture(scope="module")
def tiny():
    return kestrel.load("tiny", device="cpu")


def _mtp_logits(model, tokens, hidden):
    eng = kestrel.Engine(model, max_seq=32, mmax=4)
    return eng.mtp_step(0, tokens, hidden).logits


def _prenorm(model, prompt):
    """The main model's residual stream before the final norm, and the normed hidden, by
    running the main program's ops without its last two (the final norm and the head)."""
    eng = kestrel.Engine(model, max_seq=32, mmax=4)
    prog = model.main_prog
    env = {"tokens": np.asarray(prompt, np.int64)}
    model.be.execute(model, prog, prog.ops[:-2], env, eng.state, 0)
    return env["x"], kestrel.Engine(model, max_seq=32, mmax=4).prefill(prompt).hidden


def test_pre_norm_hidden_is_the_pre_norm_input(tiny, rng):
    """Feeding h / (1 + w_norm) gives the head's outputs of feeding the real pre-norm x, up to
    float32 rounding and the norm's epsilon; the correct h gives other outputs."""
    prompt = [int(t) for t in rng.integers(0, 256, 10)]
    x, h = _prenorm(tiny, prompt)
    toks = [int(t) for t in rng.integers(0, 256, 10)]
    real = _mtp_logits(tiny, toks, x)
    emulated = _mtp_logits(tiny, toks, h / (1.0 + tiny.w["norm.weight"]))
    right = _mtp_logits(tiny, toks, h)
    assert np.abs(real - emulated).max() < 1e-3 * np.abs(real).max()
    assert np.abs(real - right).max() > 100 * np.abs(real - emulated).max()


def test_cat_order_and_norm_shift_are_those_mistakes(tiny, rng):
    """cat-order: the mistaken model's fc over [e | h] is the right fc over [h | e]; the shift:
    every MTP norm weight + 1. The main model's tensors are the right model's own objects."""
    m = wiring.mistaken_model(tiny, "cat-order")
    H = tiny.cfg.hidden_size
    e, h = rng.standard_normal(H).astype(np.float32), rng.standard_normal(H).astype(np.float32)
    fc, fc2 = tiny.w["mtp.fc.weight"], m.w["mtp.fc.weight"]
    np.testing.assert_allclose(fc2 @ np.concatenate([e, h]), fc @ np.concatenate([h, e]), rtol=1e-5, atol=1e-5)
    s = wiring.mistaken_model(tiny, "norm-shift-twice")
    norms = [n for n in tiny.w if n.startswith("mtp.") and n.endswith("norm.weight")]
    assert len(norms) >= 5
    for n in norms:
        assert np.array_equal(s.w[n], tiny.w[n] + np.float32(1))
    for n in tiny.w:
        if not n.startswith("mtp."):
            assert m.w[n] is tiny.w[n] and s.w[n] is tiny.w[n]


@pytest.mark.parametrize("policy", ["replay", "checkpoint", "input-cache"])
def test_every_wiring_is_bit_exact(tiny, policy, rng):
    """Each wiring, on two of the six starts, at a random k: the stream is the right model's
    greedy stream (the mistakes are invisible to memcmp)."""
    starts = [p for _, p in spec.default_starts(tiny)]
    k = int(rng.integers(2, 5))
    for p in starts[:2]:
        ref = kestrel.generate(tiny, p, 24)
        for w in wiring.WIRINGS:
            r = wiring.run(tiny, w, p, 24, k, policy=policy, reference=ref)
            assert r.bit_exact, (w, k)


def test_chain_main_hidden_reads_h_p_at_every_row(tiny, rng):
    """The chained drafter's rows after the first are the head fed h_p, not h': recomputed
    here row by row with mtp_step."""
    p = [p for _, p in spec.default_starts(tiny)][2]
    eng = kestrel.Engine(tiny, max_seq=128, mmax=4)
    s = eng.prefill(p)
    d = wiring.WiringDrafter("chain-main-hidden")
    d.bind(tiny, None)
    d.start(eng, p, s.hidden)
    P = len(p)
    ctx = spec.drafters.RoundCtx(P - 1, p[-1], s.hidden[-1], s.hidden[-2], int(np.argmax(s.logits[-1])), 0, P)
    got = d.draft(eng, ctx, 4, eng.mtp_cursor)
    ref = kestrel.Engine(tiny, max_seq=128, mmax=4)
    ref.prefill(p)
    ref.mtp_fill(0, list(p[1:]), s.hidden[:P - 1])
    x, want = got[0], [got[0]]
    for _ in range(3):
        x = int(np.argmax(ref.mtp_step(ref.mtp_cursor, x, s.hidden[-1]).logits))
        want.append(x)
    assert got == want
