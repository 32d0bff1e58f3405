"""One projection at many activation rows (the batched engine's M = B x rows a sequence): time
per launch under each bf16 GEMV (under "tmb", M > 8 runs gemv_tmb over several row groups a block),
beside "tmb1" (the tiled kernel the engine runs at M <= 8, one row group a block, at every M) and
every compiled row-group shape ("g<NW>_<KC>_<ST>_<RG>", M > 8; engine_pick marks the engine's), and
the weight bytes over that time.

    python3 dev/bench_rows.py [--out OUTDIR] [--ms 1,8,16,32,64]

Why: a batched greedy pass of B sequences runs every projection at M = B rows. Both GEMVs visit
the rows in groups of 8 (kernels/linear.cu, "block order"), each group re-reading the weights,
meant to come from L2; this measures how far that holds. Rows are checked bit-identical to the
same rows launched alone (M = 1) under each GEMV, so a speed-up here can never buy a changed bit.
Writes OUTDIR/bench_rows.json (device, date, command)."""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from timing import time_cupy_graph  # noqa: E402
from kestrel import settings  # noqa: E402

SHAPES = [  # label, output rows N, K, epilogue: the 27B and 9B programs' largest and smallest
    ("27B gate|up + SwiGLU", 34816, 5120, "swiglu"),
    ("27B down", 5120, 17408, "add"),
    ("27B out_proj", 5120, 6144, "add"),
    ("9B gate|up + SwiGLU", 24576, 4096, "swiglu"),
    ("9B in_proj", 12352, 4096, "store"),
]


def shape_name(shape) -> str:
    """A row-group shape's variant name, "g<NW>_<KC>_<ST>_<RG>" (launch_of reads it back)."""
    return "g" + "_".join(str(v) for v in shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--ms", default="1,8,16,32,64")
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    import cupy as cp
    from kestrel import nvrtc as L
    from kestrel.cuda import CUDABackend
    from kestrel.ops import linear
    be = CUDABackend()
    ms = [int(m) for m in a.ms.split(",")]
    rng = np.random.default_rng(int(time.time()))
    rows = []
    for label, N, K, epi in SHAPES:
        half = N // 2 if epi == "swiglu" else 0
        nout = half if epi == "swiglu" else N
        w = rng.standard_normal((N, K), dtype=np.float32) * 0.02
        W = cp.asarray((w.view(np.uint32) >> 16).astype(np.uint16))
        tiled = linear.tmb_tiled(W, K, epi, half)
        X = cp.asarray(rng.standard_normal((max(ms), K), dtype=np.float32))
        Y0 = cp.asarray(rng.standard_normal((max(ms), nout), dtype=np.float32))
        tiles = linear.tmb_tiles(N, epi, half)
        ks = linear.tmb_ksplit(K, tiles)

        def launch_of(kind, y, M):
            if kind == "tmb1":   # one row group a block at every M: the engine's M = 1 kernel
                return linear._tiled_launch(*linear.tmb_kernel(tiles, ks, epi, 1), ks, W, tiled, X[:M], y, M, K, K,
                                            nout, epi, half)
            if kind.startswith("g"):   # one compiled row-group shape, "g<NW>_<KC>_<ST>_<RG>"
                shape = tuple(int(v) for v in kind[1:].split("_"))
                return linear._tiled_launch("tmb", shape, ks, W, tiled, X[:M], y, M, K, K, nout, epi, half)
            return linear.gemv_launch(W, X[:M], y, M, K, K, nout, epi, half, gemv=kind, tiled=tiled)

        shapes = [shape_name(sh) for sh in linear.TMBG_SHAPES]
        for gemv in (*linear.GEMVS, "tmb1", *shapes):
            alone = None
            for M in ms:
                if gemv.startswith("g") and M <= 8:
                    continue
                Y = Y0[:M].copy()
                launch = launch_of(gemv, Y, M)
                L.go(launch, be.stream)
                be.stream.synchronize()
                if alone is None:       # every row alone (M = 1), once per GEMV
                    alone = Y0[:max(ms)].copy()
                    for j in range(max(ms)):
                        L.go(linear.gemv_launch(W, X[j:j + 1], alone[j:j + 1], 1, K, K, nout, epi, half,
                                                gemv="fma" if gemv == "fma" else "tmb", tiled=tiled), be.stream)
                    be.stream.synchronize()
                same = bool(cp.array_equal(Y.view(cp.uint32), alone[:M].view(cp.uint32)))
                ys = [Y0[:M].copy() for _ in range(8)]
                ls = [launch_of(gemv, y, M) for y in ys]

                def issue(ls=ls):
                    for launch in ls:
                        L.go(launch, be.stream)
                t = time_cupy_graph(cp, be.stream, issue, len(ls), a.reps)
                r = {"shape": label, "N": N, "K": K, "gemv": gemv, "M": M, "us": t["us"],
                     "engine_pick": gemv in ("tmb", shape_name(linear.tmbg_shape(M, ks))),
                     "GBps": W.nbytes / (t["us"] * 1e-6) / 1e9, "rows_as_alone": same}
                rows.append(r)
                print(f"{label:22s} {gemv:12s} M={M:3d} {t['us']:9.1f} us {r['GBps']:7.0f} GB/s  "
                      f"rows as alone: {same}", flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        res = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "command": f"python3 dev/bench_rows.py --out OUTDIR --ms {a.ms} --reps {a.reps}",
               "commit": settings.get("KESTREL_COMMIT") or "unknown", "rows": rows}
        Path(a.out, "bench_rows.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
