#!/usr/bin/env python3
"""The GDN recurrence kernels alone, at each Qwen3.5 preset's head shape: results/bench_gdn.json + .md.

    python3 scripts/bench_gdn.py --out results      # on a GPU machine

kernels/gdn.cu has three recurrence kernels that agree bit for bit (tests/ops/test_gdn.py):
gdn_recur (S in shared memory, a head per block), gdn_recur_regs (S in registers, a head per
block) and gdn_recur_cluster (a head's columns over a cluster of blocks). For every preset with
128 x 128 heads, M = 1..8 rows and the three state modes, each variant is timed as one step
would run it: a CUDA graph of one launch per GDN layer, each layer on its own ring of state
slots (so the state comes from memory, as in the engine), replayed and timed with events; the
median over replays / layers is the time of one launch. Beside it: the state bytes a launch
moves (read once; written once in place, once a row when checkpointing, never when cached) and
what each row past the first adds. One launch of each variant is also compared with gdn_recur,
bit for bit (recorded here; the tests assert it).
No programmatic dependent launch; the engine's graphs use it, so there each launch also hides
part of its start behind the kernel before it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from timing import time_cupy_graph  # noqa: E402
from kestrel.lab import results  # noqa: E402
from kestrel import settings  # noqa: E402

PRESETS = ("qwen3.5-0.8b", "qwen3.5-9b", "qwen3.5-27b")
MS = (1, 2, 3, 4, 5, 8)
MODES = ("in_place", "checkpoint", "cache")


def bench_preset(be, cp, name: str, reps: int, seed: int) -> dict:
    from kestrel.config import PRESETS as P
    from kestrel import nvrtc as L
    from kestrel.ops import gdn
    cfg = P[name]
    sh = gdn.GDNShape.of(cfg)
    nl, C, nv, nvdv = len(cfg.gdn_layers), sh.C, sh.nv, sh.nv * sh.dv
    width = C + nvdv + 2 * nv                 # the in-projection's stacked row [qkv | z | b | a]
    mmax, nslots = max(MS), max(MS) + 1
    rs = cp.random.RandomState(seed)
    gin = rs.standard_normal((mmax, width), dtype=np.float32)
    xc = rs.standard_normal((mmax, C), dtype=np.float32)
    A_log = cp.log(rs.uniform(1, 16, nv, dtype=np.float32))
    dt_bias = rs.uniform(-1, 1, nv, dtype=np.float32)
    norm_w = (1 + 0.1 * rs.standard_normal(sh.dv, dtype=np.float32)).astype(np.float32)
    rings = [(0.3 * rs.standard_normal((nslots, nv, sh.dk, sh.dv), dtype=np.float32)).astype(np.float32)
             for _ in range(nl)]
    ctrl = cp.zeros(L.CTRL_TOK + 1, cp.int32)     # live slot 0
    assert int(ctrl[L.CTRL_SLOT]) == 0
    y = cp.empty((mmax, nvdv), cp.float32)
    state = nv * sh.dk * sh.dv * 4
    stream = cp.cuda.Stream(non_blocking=True)

    def launch(variant, mode, m, ring):
        return gdn.gdn_recur_launch(xc, C, gin[:, C:], width, gin[:, C + nvdv:], width, gin[:, C + nvdv + nv:], width,
                                    A_log, dt_bias, norm_w, y, nvdv, ring, ring[0].size, nslots, mode, ctrl, m, sh,
                                    variant=variant)

    variants = list(gdn.gdn_recur_runnable(sh.dk, sh.dv))
    out = {"preset": name, "shape": {"nk": sh.nk, "nv": nv, "dk": sh.dk, "dv": sh.dv}, "layers": nl,
           "state_bytes": state, "variants": variants, "bit_identical": {}, "us": {}}
    # bit for bit against gdn_recur: one 5-row checkpointing launch on a copy of ring 0
    ref = None
    for v in variants[::-1]:
        r = rings[0].copy()
        L.go(launch(v, "checkpoint", 5, r), stream)
        stream.synchronize()
        got = (cp.asnumpy(y[:5]), cp.asnumpy(r))
        if v == "smem":
            ref = got
        else:
            out["bit_identical"][v] = bool(np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1]))
    for v in variants:
        for mode in MODES:
            for m in MS:
                ls = [launch(v, mode, m, rings[g]) for g in range(nl)]
                out["us"][f"{v}/{mode}/{m}"] = time_cupy_graph(cp, stream, lambda: [L.go(x, stream) for x in ls], nl,
                                                               reps)["us"]
        print(name, v, {k: round(t, 2) for k, t in out["us"].items() if k.startswith(v)}, flush=True)
    return out


def moved(state: int, mode: str, m: int) -> int:
    """State bytes one launch reads and writes."""
    return state * (1 + {"in_place": 1, "checkpoint": m, "cache": 0}[mode])


def render_md(R: dict) -> str:
    s = ["# GDN recurrence kernels alone", "",
         f"Device: **{R['device']}**, measured {R['date']} with `{R['command']}` (commit {R['commit']}).", "",
         "One launch = one GDN layer's recurrence and gated norm for M rows (gdn_conv not included), "
         "timed in a CUDA graph of one launch per layer, each on its own state (µs per launch, median "
         "over replays). GB/s = state bytes read and written ÷ time. `cluster` is the engine's default.", ""]
    for P in R["presets"]:
        sh = P["shape"]
        s += [f"## {P['preset']}: {P['layers']} GDN layers, nk = {sh['nk']}, nv = {sh['nv']}, "
              f"dk = dv = {sh['dk']} (state {P['state_bytes'] / 2**20:.2f} MiB a layer)", "",
              "Bit-identical to gdn_recur (5 rows, checkpointing): " +
              ", ".join(f"{v} {'yes' if ok else '**no**'}" for v, ok in P["bit_identical"].items()), ""]
        s += ["| variant | mode | " + " | ".join(f"M={m} µs" for m in MS) + " | µs a row past the first (M=1→4) "
              "| GB/s at M=1, 4 | per step (×layers) M=1, 4 ms |",
              "|---|---|" + "---|" * len(MS) + "---|---|---|"]
        for v in P["variants"]:
            for mode in MODES:
                t = [P["us"][f"{v}/{mode}/{m}"] for m in MS]
                t1, t4 = P["us"][f"{v}/{mode}/1"], P["us"][f"{v}/{mode}/4"]
                gb = [moved(P["state_bytes"], mode, m) / (P["us"][f"{v}/{mode}/{m}"] * 1e-6) / 1e9 for m in (1, 4)]
                s.append(f"| {v} | {mode} | " + " | ".join(f"{x:.2f}" for x in t) +
                         f" | {(t4 - t1) / 3:.2f} | {gb[0]:.0f}, {gb[1]:.0f} | "
                         f"{t1 * P['layers'] / 1e3:.3f}, {t4 * P['layers'] / 1e3:.3f} |")
        s.append("")
    return "\n".join(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--render", metavar="JSON", help="write OUT/bench_gdn.md from a results file, measure nothing")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.render:
        data, _ = results.read_json(a.render)
        results.load_gdn(a.render)                      # a damaged file is refused, not rendered
        (out / "bench_gdn.md").write_text(render_md(data))
        return
    import cupy as cp
    from kestrel.cuda import CUDABackend
    be = CUDABackend()
    prov = results.Provenance(be.device_name, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              results.recorded_command("scripts/bench_gdn.py", sys.argv[1:],
                                                       settings.kernel_switches()),
                              results.measured_commit(), results.backend_kernels(be))
    R = {**prov.as_dict(),
         "versions": {"cupy": cp.__version__, "cuda_runtime": cp.cuda.runtime.runtimeGetVersion()},
         "ms": list(MS), "modes": list(MODES), "presets": []}
    for i, name in enumerate(p for p in a.presets.split(",") if p):
        R["presets"].append(bench_preset(be, cp, name, a.reps, seed=1 + i))
        results.write(out, "bench_gdn", R, render_md, prov)
    print(render_md(R))


if __name__ == "__main__":
    main()
