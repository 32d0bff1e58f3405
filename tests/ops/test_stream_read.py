"""kernels/stream_read.cu vs its twin: every word read exactly once, for every timed shape."""
import numpy as np
import pytest

from gpu import cp, go, host, needs_gpu
from kestrel.ops import stream_read


def test_twin_xor(rng):
    w = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(np.uint32)
    ref = 0
    for x in w.tolist():
        ref ^= x
    assert stream_read.xor_words(w) == ref


@pytest.mark.parametrize("shape", stream_read.SHAPES)
@needs_gpu
def test_stream_read_reads_every_word_once(be, rng, shape):
    sms = be.device_props["sm_count"]
    # a size that leaves a ragged tail after the unrolled loop
    n16 = sms * 256 * 8 * 3 + 12345
    words = rng.integers(0, 2**32, 4 * n16, dtype=np.uint64).astype(np.uint32)
    buf = cp.asarray(words)
    out = cp.full(sms * stream_read.MAX_BLOCKS_PER_SM, 0xDEADBEEF, cp.uint32)
    go(be, stream_read.stream_read_launch(buf, out, sms, shape))
    grid = sms * shape[1]
    got = 0
    for x in host(out[:grid]).tolist():
        got ^= x
    assert got == stream_read.xor_words(words)


def test_stream_read_refuses_bad_buffers():
    class Arr:
        def __init__(self, nbytes, ptr, dtype=np.uint32, size=10**6):
            self.nbytes, self.dtype, self.size = nbytes, np.dtype(dtype), size
            self.data = type("D", (), {"ptr": ptr})()
    with pytest.raises(ValueError, match="multiple of 16 bytes"):
        stream_read.stream_read_launch(Arr(100, 0), Arr(4, 0), 4)
    with pytest.raises(ValueError, match="not one of"):
        stream_read.stream_read_launch(Arr(160, 0), Arr(4, 0), 4, shape=(3, 4, 512))
    with pytest.raises(ValueError, match="uint32"):
        stream_read.stream_read_launch(Arr(160, 0), Arr(4, 0, np.float32), 4)
