"""Programmatic dependent launch, checked: graphs captured with it must give the same bits as
graphs without it. Exits 0 when they do, 1 when they do not (the GPU check then turns PDL off).

    python3 scripts/pdl_selftest.py

Run it in a child process of whatever uses the answer: a driver that mishandles the launch could
take the process with it."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's kestrel
from kestrel.config import PRESETS  # noqa: E402
from kestrel.cuda import CUDABackend  # noqa: E402
from kestrel.engine import Engine  # noqa: E402
from kestrel.model import Model  # noqa: E402
from kestrel.weights import random_weights  # noqa: E402


def _run(cfg, t, kernels: dict, steps: int):
    """Every output of one backend's pass over the test (fp32 and bf16 weights), and the backend."""
    be = CUDABackend(kernels=kernels)
    r = []
    for dtype in ("fp32", "bf16"):
        m = Model(cfg, t, be, weight_dtype=dtype)
        e = Engine(m, max_seq=64, mmax=3)
        s = e.prefill([1, 2, 3, 4, 5])
        r.append(s.logits)
        for i in range(steps):
            r.append(e.step(e.cursor, (7 * i) % cfg.vocab_size).logits)
        for _ in range(3):
            r.append(e.step_m(e.cursor, [3, 1, 4]).logits)
            r.append(e.verify_checkpointed(e.cursor, [1, 5, 9]).logits)
            e.select_checkpoint(2)
            r.append(e.mtp_step(e.mtp_cursor, 6, s.hidden[0]).logits)
    return [x.get() for x in r], be


def pdl_selftest(steps: int = 6) -> bool:
    """True when graphs captured with programmatic dependent launch, in either PDL order, give the
    same bits as graphs without it, under both bf16 GEMVs (test-a shape, fp32 and bf16; prefill,
    steps, step_m, a checkpointed verify, MTP). Run it in a child process first: a driver that
    mishandles the launch could take the process."""
    cfg = PRESETS["test-a"]
    t = random_weights(cfg, 21)
    for gemv in ("fma", "tmb"):
        ref, _ = _run(cfg, t, {"gemv": gemv, "pdl": False}, steps)
        for order in ("launch-first", "wait-first"):
            out, be = _run(cfg, t, {"gemv": gemv, "pdl": True, "pdl_order": order}, steps)
            if be.stats["pdl_graphs"] == 0 or be.stats["graph_errors"]:
                print(f"gemv {gemv}, {order}: no PDL graph captured {be.stats['graph_errors']}")
                return False
            if not all(np.array_equal(a, b) for a, b in zip(ref, out)):
                print(f"gemv {gemv}, {order}: the bits differ from the graphs without PDL")
                return False
    return True


if __name__ == "__main__":
    ok = pdl_selftest()
    print(f"PDL self-test: {'same bits with and without PDL' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)
