"""Embedding, argmax and bf16 rounding: kernels/head.cu vs the NumPy twins (bit-exact)."""
import numpy as np

from gpu import cp, dev, go, host, needs_gpu
from kestrel.ops import head
from kestrel.weights import bf16_to_f32, f32_to_bf16


def test_argmax_ties_and_nan_like_numpy(rng):
    lg = rng.standard_normal((3, 50)).astype(np.float32)
    lg[1, [3, 40]] = lg[1].max() + 1.0
    assert list(head.argmax(lg)) == list(np.argmax(lg, axis=-1)) and head.argmax(lg)[1] == 3


@needs_gpu
def test_embed_argmax_bf16_kernels(be, rng, poison):
    table = rng.standard_normal((97, 40)).astype(np.float32)
    toks = rng.integers(0, 97, 6)
    for wd in ("fp32", "bf16"):
        t = be.put_weight("e", table, wd)
        want = bf16_to_f32(f32_to_bf16(table)) if wd == "bf16" else table
        y = be.empty((6, 40))
        go(be, head.embed_launch(t, dev(toks, np.int32), y, 40, 6))
        assert np.array_equal(host(y), want[toks]) and np.array_equal(host(y), head.embed(want, toks))
    lg = rng.standard_normal((4, 5003)).astype(np.float32)
    lg[1, [17, 4000]] = lg[1].max() + 1.0          # a tie: the first index wins, as numpy.argmax
    lg[2, 4999] = np.nan                            # NaN counts as the maximum, as numpy.argmax
    assert np.array_equal(host(be.argmax(dev(lg))), np.argmax(lg, axis=-1))
    assert int(be.argmax(dev(lg[0]))) == int(np.argmax(lg[0]))
    x = (rng.standard_normal(1001) * 3).astype(np.float32)
    out = cp.empty(1001, np.uint16)
    go(be, head.to_bf16_launch(dev(x), 0.5, out, 1001))
    assert np.array_equal(host(out), f32_to_bf16(x * np.float32(0.5)))
