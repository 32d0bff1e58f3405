#!/usr/bin/env python3
"""Every tiled GEMV shape and K split at every projection of the Qwen3.5 presets, beside the
CUDA-core GEMV: dev/results/sweep_tiled.json (and a summary printed).

    python3 dev/sweep_tiled.py --out OUTDIR [--presets qwen3.5-0.8b,qwen3.5-4b] [--reps 9]

The file written on an H100 on 2026-12-05 is dev/results/sweep_tiled_h100.json (results/cuda_notes.md
reads it). Why: the tensor-core order ("tmb") is flat in M but, with the engine's rule for the K split and the
shape, slower than the CUDA-core order ("fma") at M = 1 on the small presets (results/cuda_notes.md).
A K split is part of a matrix's order (it changes bits), so it may be chosen per matrix, never per M;
the kernel (gemv_tmb or gemv_tmr) and its shape change only speed, so they may be chosen per M too.
This sweep measures both choices at each matrix so the engine's rule can be set from data.

For each (preset, projection): rotating weight buffers holding at least 4x the L2 (weights come
from HBM), a CUDA graph of back-to-back launches, CUDA events around each replay, the median.
Checked on the way: for each K split, every shape's rows equal the first shape's bit for bit.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "scripts"))

import gemv_variants as dev  # noqa: E402
from bench_projections import rotating_weights  # noqa: E402
from timing import time_cupy_graph  # noqa: E402

MS = (1, 2, 4, 8)
PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b")


def shapes_of(cfg) -> list:
    """(label, N output rows, K, epilogue, uses a step) of every projection of a preset."""
    from kestrel.lab.sizes import projection_uses
    H, I = cfg.hidden_size, cfg.intermediate_size
    nv, dv = cfg.lin_num_value_heads, cfg.lin_value_head_dim
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    uses = list(projection_uses(cfg).values())
    rows = [("in_proj", cfg.conv_dim + nv * dv + 2 * nv, H, "store"),
            ("qkv", nh * hd * 2 + 2 * nkv * hd, H, "store"),
            ("gate_up", I, H, "swiglu"),
            ("down", H, I, "add"),
            ("out_proj", H, nv * dv, "add"),
            ("lm_head", cfg.vocab_size, H, "store")]
    out = [(*r, u) for r, u in zip(rows, uses)]
    if nh * hd != nv * dv:       # the attention o_proj's K differs from the GDN out_proj's
        out.append(("o_proj", H, nh * hd, "add", len(cfg.attn_layers)))
        out[4] = (*out[4][:4], len(cfg.gdn_layers))
    return out


def sweep_shape(be, cp, linear, N, K, epi, reps, l2, kinds=("tmb", "tmr"), engine_ks_only=False) -> dict:
    rows, half, nbytes, nbuf, per_graph, rs, Ws = rotating_weights(be, cp, N, K, epi, 4 * l2, 16, 7 + K + N)
    Wts = [linear.tmb_tiled(w, K, epi, half) for w in Ws]
    x = rs.standard_normal((8, K), dtype=cp.float32)
    Y = cp.empty((8, N), cp.float32)
    tiles = linear.tmb_tiles(rows, epi, half)
    eng_ks = linear.tmb_ksplit(K, tiles)
    eng_kind, eng_shape = linear.tmb_kernel(tiles, eng_ks, epi)
    R = {"N": N, "K": K, "epilogue": epi, "bytes": nbytes, "tiles": tiles, "engine_ks": eng_ks,
         "engine_tiled": [eng_kind, list(eng_shape)], "fma": {}, "tiled": []}

    def timed(make, M):
        launches = [make(i, M) for i in range(per_graph)]

        def issue():
            for fn, grid, block, args, sm in launches:
                fn(grid, block, args, shared_mem=sm)
        return time_cupy_graph(cp, be.stream, issue, per_graph, reps)["us"]

    for M in MS:
        R["fma"][str(M)] = timed(lambda i, M: linear.gemv_launch(Ws[i % nbuf], x, Y, M, K, K, N, epi, half,
                                                                 gemv="fma"), M)
    every = {"tmb": dev.TMB_ALL, "tmr": linear.TMR_SHAPES, "tcg": dev.TCG_SWEEP}
    cands = [(eng_kind, tuple(eng_shape))]      # the engine's pick first: the others' bits are held to it
    cands += [(k, s) for k in kinds for s in every[k] if (k, s) != cands[0]]
    for ks in linear.TMB_KSPLITS:
        if ks > K // 32 or (engine_ks_only and ks != eng_ks):
            continue
        ref = None
        for kind, shape in cands:
            try:
                one = dev.gemv_tiled_launch(kind, Ws[0], Wts[0], x, Y, 4, K, K, N, epi, half, shape=shape, ks=ks)
            except Exception as e:      # a shape the GPU cannot hold (shared memory): recorded, skipped
                R["tiled"].append({"kind": kind, "shape": list(shape), "ks": ks, "error": repr(e)[:120]})
                continue
            Y.fill(0.5)
            fn, grid, block, args, sm = one
            fn(grid, block, args, shared_mem=sm)
            be.sync()
            got = cp.asnumpy(Y[:4]).tobytes()
            ref = ref or got
            r = {"kind": kind, "shape": list(shape), "ks": ks, "same_bits": got == ref}
            if got != ref:
                print(f"  BITS DIFFER: {kind} {shape} ks {ks} N {N} K {K} {epi}", flush=True)
            for M in MS:
                r[f"M{M}"] = timed(lambda i, M, kind=kind, shape=shape: dev.gemv_tiled_launch(
                    kind, Ws[i % nbuf], Wts[i % nbuf], x, Y, M, K, K, N, epi, half, shape=shape, ks=ks), M)
            R["tiled"].append(r)
    del Ws, Wts
    cp.get_default_memory_pool().free_all_blocks()
    return R


def summary(R) -> list:
    """Per shape: fma, the engine's tiled pick, and each kind's best at the engine's K split (its
    order), at M = 1 / 2 / 4 / 8 (µs); per preset: those summed over one step's projections (ms)."""
    lines = []
    for p in R["presets"]:
        tot, seen = {}, {}          # a kind absent at some shape (not swept there) has a partial sum
        for s in p["shapes"]:
            u = s["uses"]
            ok = [t for t in s["tiled"] if "error" not in t and t["ks"] == s["engine_ks"]]
            rows = {"fma": [s["fma"][str(M)] for M in MS]}
            eng = [t for t in ok if [t["kind"], t["shape"]] == s["engine_tiled"]]
            if eng:
                rows["engine"] = [eng[0][f"M{M}"] for M in MS]
            summed = {"fma": rows["fma"], "engine": rows.get("engine", [float("nan")] * len(MS)),
                      "best any tiled, per M": ([min(t[f"M{M}"] for t in ok) for M in MS] if ok
                                                else [float("nan")] * len(MS))}
            for kind in sorted({t["kind"] for t in ok}):
                best = min((t for t in ok if t["kind"] == kind), key=lambda t: t["M1"] + t["M4"])
                rows[f"{kind}{tuple(best['shape'])}"] = summed[f"best {kind}"] = [best[f"M{M}"] for M in MS]
            for key, v in summed.items():
                tot[key] = [a + u * b for a, b in zip(tot.get(key, [0.0] * len(MS)), v)]
                seen[key] = seen.get(key, 0) + 1
            bad = [t for t in s["tiled"] if t.get("same_bits") is False]
            lines.append(f"{p['preset']:14s} {s['label']:9s} N={s['N']:6d} K={s['K']:5d} x{u:2d} ks{s['engine_ks']}"
                         + ("  BITS DIFFER" if bad else "") + "  "
                         + "  ".join(f"{k} " + "/".join(f"{x:.1f}" for x in v) for k, v in rows.items()))
        for k, v in tot.items():
            part = "" if seen[k] == len(p["shapes"]) else f" (partial: {seen[k]} of {len(p['shapes'])} shapes)"
            lines.append(f"{p['preset']} step projections ms, M = {MS}: {k} " + "/".join(f"{x / 1e3:.3f}" for x in v)
                         + part)
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "dev" / "results"))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--kinds", default="tmb,tmr", help="tiled kernels to sweep besides the engine's pick (tmb,tmr,tcg)")
    ap.add_argument("--engine-ks-only", action="store_true", help="only the engine's K split (its order)")
    a = ap.parse_args()
    import cupy as cp
    from kestrel.config import PRESETS as CFG
    from kestrel.cuda import CUDABackend
    from kestrel.nvrtc import device_props
    from kestrel.ops import linear
    be = CUDABackend()
    l2 = int(device_props().get("l2CacheSize", 60 << 20))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from kestrel.lab import results
    R = {"device": be.device_name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "command": results.recorded_command("dev/sweep_tiled.py", sys.argv[1:]),
         "commit": results.measured_commit(), "presets": []}
    t0 = time.time()
    for name in a.presets.split(","):
        P = {"preset": name, "shapes": []}
        R["presets"].append(P)
        for label, N, K, epi, uses in shapes_of(CFG[name]):
            s = sweep_shape(be, cp, linear, N, K, epi, a.reps, l2, tuple(a.kinds.split(",")), a.engine_ks_only)
            s.update(label=label, uses=uses)
            P["shapes"].append(s)
            print(f"{name} {label} done ({time.time() - t0:.0f} s)", flush=True)
            (out / "sweep_tiled.json").write_text(json.dumps(R, indent=1))
    print("\n".join(summary(R)), flush=True)


if __name__ == "__main__":
    main()
