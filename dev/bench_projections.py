#!/usr/bin/env python3
"""Projections alone at the Qwen3.5-27B shapes: results/bench_projections.json + .md.

    python3 dev/bench_projections.py --out results      # on a GPU machine

In one run, on bf16 weights drawn at random (cuRAND normal, scaled by K^-1/2, rounded to bf16):
  * the read floor: kernels/stream_read.cu (16-byte loads that skip L1), the best of its
    grid shapes over a 2 GiB buffer, and over each projection's own weight buffers; beside it the
    device-to-device copy (bytes read + written), the figure the engine's floor used so far;
  * correctness of the bf16 GEMVs of kernels/linear.cu (CUDA-core "fma", tensor-core "tensor" and
    "tmb", the last on sm_90 and later) at
    every shape with its epilogue: relative error vs float64 (all rows) and vs the NumPy twin (a
    slice of rows), every output written (outputs poisoned with NaN first), and row m of an
    M-row launch bit-identical to that row launched alone for every M = 1..8;
  * time and bandwidth (weight bytes / time) of fma, tensor, tmb and cuBLAS (torch.matmul: bf16 x,
    bf16 W, bf16 out; no epilogue) for M = 1, 2, 3, 4, 8, and whether cuBLAS's rows are bit-identical
    across M; sweeps of the CUDA-core shapes (M = 1..8), the tensor-core variants (tiles a warp, load
    step, K-split; M = 1, 8), the gemv_tmb shapes (tiles a block, stages, K-split; M = 1, 4, 8) and
    the gemv_tmr shapes (tiles a block, KB in flight a warp; M = 1, 4, 8). "tmb" in the tables is the
    engine's pick between gemv_tmb and gemv_tmr for each matrix (linear.tmb_kernel).

Timing: each launch reads its own weight buffer, rotating over buffers that together hold at
least four times the L2 (so the weights come from HBM, not the cache); a CUDA graph of such
back-to-back launches is replayed, each replay timed with CUDA events; the median over replays,
divided by the launches in the graph. No programmatic dependent launch (cuBLAS has none either).
Nothing here is a test: the checks are recorded, and tests/ops/test_linear.py asserts them.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemv_variants as dev  # noqa: E402  (this folder: the variants no engine option selects)
from kestrel.lab import results  # noqa: E402
from kestrel import settings  # noqa: E402
sys.path.insert(0, str(ROOT / "scripts"))
from timing import med, time_cupy_graph  # noqa: E402

SHAPES = [  # label, output rows N, K, epilogue (as the 27B program uses it)
    ("gdn in_proj [qkv|z|b|a]", 16480, 5120, "store"),
    ("attn [q|k|v]", 14336, 5120, "store"),
    ("mlp [gate|up] + SwiGLU", 17408, 5120, "swiglu"),
    ("mlp down", 5120, 17408, "add"),
    ("out_proj / o_proj", 5120, 6144, "add"),
    ("lm_head", 248320, 5120, "store"),
]
MS = (1, 2, 3, 4, 8)
F32 = 2e-5            # the tests' bound for one fp32 projection vs float64 / the twin



def log(*a):
    print(*a, flush=True)


# ---- timing -------------------------------------------------------------------------------------
def time_torch_graph(torch, issue, per_graph: int, reps: int) -> dict:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            issue()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        issue()
    for _ in range(2):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / per_graph)
    del g
    return {"us": med(ts), "us_min": min(ts), "us_max": max(ts)}


# ---- the read floor ------------------------------------------------------------------------------
def read_variants(be, cp, bufs, per_graph, reps, sink):
    """kernels/stream_read.cu over `bufs` (rotating), in each of its shapes: {variant: timing}.
    sink: stream_read.out_buffer(sm_count)."""
    from kestrel.ops import stream_read
    sms = be.device_props["sm_count"]
    out = {}
    for shape in stream_read.SHAPES:
        launches = [stream_read.stream_read_launch(bufs[i % len(bufs)], sink, sms, shape) for i in range(per_graph)]

        def issue(launches=launches):
            for fn, g, b, a, _ in launches:
                fn(g, b, a)
        out[stream_read.shape_name(shape)] = time_cupy_graph(cp, be.stream, issue, per_graph, reps)
    return out


# ---- checks ---------------------------------------------------------------------------------------
KERNELS = ("fma", "tensor", "tmb")   # the engine's bf16 GEMVs (linear.GEMVS) and dev's gemv_tc ("tensor")


def check_gemv(be, cp, W, N, K, epi, kernel, x, y0, tiled=None, twin_rows=1024):
    """rel vs float64 (all rows), rel vs the NumPy twin (rows [0, twin_rows)), all written,
    rows bit-identical for M = 1..8. W: [rows, K] bf16 bits; x [8, K]; y0 [8, N] (add);
    tiled: W's tmb_tiled copy (kernel "tmb")."""
    from kestrel import nvrtc as L
    from kestrel.ops import linear, mlp
    half = N if epi == "swiglu" else 0

    def run(j0, m):
        y = y0[j0:j0 + m].copy() if epi == "add" else cp.full((m, N), np.nan, np.float32)
        launch = (dev.gemv_tc_launch(W, x[j0:j0 + m], y, m, K, K, N, epi, half) if kernel == "tensor" else
                  linear.gemv_launch(W, x[j0:j0 + m], y, m, K, K, N, epi, half, gemv=kernel, tiled=tiled))
        L.go(launch, be.stream)
        return y
    alone = [run(j, 1)[0] for j in range(8)]
    invariant, written = True, True
    full = None
    for m in range(1, 9):
        y = run(0, m)
        written &= bool(cp.all(cp.isfinite(y)))
        invariant &= all(bool(cp.array_equal(y[j], alone[j])) for j in range(m))
        full = y
    # float64 reference on the device, in row chunks
    x64 = x.astype(cp.float64)
    num = den = 0.0
    step = 16384
    for a in range(0, N, step):
        b = min(N, a + step)

        def wide(r0, r1):
            return (W[r0:r1].astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
        s = x64 @ wide(a, b).T
        if epi == "swiglu":
            u = x64 @ wide(N + a, N + b).T
            ref = s / (1.0 + cp.exp(-s)) * u
        elif epi == "add":
            ref = y0.astype(cp.float64)[:, a:b] + s
        else:
            ref = s
        d = full[:, a:b].astype(cp.float64) - ref
        num += float(cp.sum(d * d))
        den += float(cp.sum(ref * ref))
    rel64 = math.sqrt(num / max(den, 1e-300))
    # the NumPy twin on a slice of rows (the CPU backend's arithmetic)
    n = min(twin_rows, N)
    xh = x.get()
    wh = be.weight_f32(W[:n]).get()
    if epi == "swiglu":
        want = mlp.swiglu(linear.linear(xh, wh), linear.linear(xh, be.weight_f32(W[N:N + n]).get()))
    elif epi == "add":
        want = y0[:, :n].get() + linear.linear(xh, wh)
    else:
        want = linear.linear(xh, wh)
    got = full[:, :n].get().astype(np.float64)
    twin = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))
    return {"rel_vs_float64": rel64, "rel_vs_twin": twin, "all_written": bool(written),
            "rows_bit_identical_M1_8": bool(invariant),
            "ok": bool(written and invariant and rel64 < F32 and twin < F32)}


def cublas_invariance(torch, Wt, xb):
    """Is row 0 of torch.matmul(x[:M], W^T) bit-identical for M = 1..8? And every row j < M?"""
    alone = [torch.matmul(xb[j:j + 1], Wt)[0].clone() for j in range(8)]
    row0, rows = [], []
    for m in range(1, 9):
        y = torch.matmul(xb[:m], Wt)
        row0.append(bool(torch.equal(y[0], alone[0])))
        rows.append(all(bool(torch.equal(y[j], alone[j])) for j in range(m)))
    torch.cuda.synchronize()
    return {"row0_bit_identical_by_M": row0, "all_rows_bit_identical_by_M": rows}


# ---- one shape -------------------------------------------------------------------------------------
def rotating_weights(be, cp, N: int, K: int, epi: str, rotate_bytes: int, launches: int, seed: int):
    """Random bf16 weight buffers of one projection (N outputs, K inputs; swiglu stacks gate and up),
    enough of them to hold rotate_bytes (the weights then come from HBM, not the L2), at most
    `launches`: (rows, half, nbytes, buffers, launches per graph, the RandomState, the buffers)."""
    rows = 2 * N if epi == "swiglu" else N
    half = N if epi == "swiglu" else 0
    nbytes = rows * K * 2
    nbuf = min(launches, max(1 if nbytes > (1 << 30) else 2, math.ceil(rotate_bytes / nbytes)))
    per_graph = nbuf * max(1, launches // nbuf)
    rs = cp.random.RandomState(seed)
    Ws = []
    for _ in range(nbuf):
        w = cp.empty((rows, K), cp.uint16)
        be._fill_normal(rs, w, K ** -0.5)
        Ws.append(w)
    return rows, half, nbytes, nbuf, per_graph, rs, Ws


def bench_shape(be, cp, torch, label, N, K, epi, reps, sink, rotate_bytes, sweep):
    from kestrel.ops import linear
    rows, half, nbytes, nbuf, per_graph, rs, Ws = rotating_weights(be, cp, N, K, epi, rotate_bytes, 8, 11 + K + N)
    x = rs.standard_normal((8, K), dtype=cp.float32)
    y0 = rs.standard_normal((8, N), dtype=cp.float32)
    Y = cp.empty((8, N), cp.float32)
    be.sync()
    tiles = linear.tmb_tiles(rows, epi, half)
    tmb_ks = linear.tmb_ksplit(K, tiles)
    R = {"shape": label, "N": N, "K": K, "weight_rows": rows, "epilogue": epi, "weight_bytes": nbytes,
         "buffers": nbuf, "launches_per_graph": per_graph, "tc_ksplit": dev.tc_ksplit(K),
         "tc_variant": list(dev.TC_VARIANT), "tmb_ksplit": tmb_ks,
         "tmb_shape": list(linear.tmb_shape(tiles, tmb_ks))}
    tiled_ok = linear.tmb_eligible(Ws[0], K, x, K)
    if tiled_ok:   # which tiled kernel the engine runs here, and its shape
        kind, shape = linear.tmb_kernel(tiles, tmb_ks, epi)
        R["tmb_kernel"] = [kind, list(shape)]

    t0 = time.time()
    # tmb only where the engine would run it (elsewhere gemv_launch would fall back to fma)
    kernels = [k for k in KERNELS if k != "tmb" or tiled_ok]
    Wts = [linear.tmb_tiled(w, K, epi, half) for w in Ws] if "tmb" in kernels else []
    R["checks"] = {k: check_gemv(be, cp, Ws[0], N, K, epi, k, x, y0, tiled=Wts[0] if k == "tmb" else None)
                   for k in kernels}
    log(f"{label}: checks {json.dumps(R['checks'])} ({time.time() - t0:.1f} s)")

    def gbps(t):
        return nbytes / (t["us"] * 1e-6) / 1e9

    rd = read_variants(be, cp, Ws, per_graph, reps, sink)
    best = min(rd, key=lambda v: rd[v]["us"])
    R["read"] = dict(rd[best], variant=best, GBps=gbps(rd[best]))

    def ours(kernel, M, variant=None, ks=None, fma=None, tmb=None, tmr=None):
        launches = []
        for i in range(per_graph):
            w = Ws[i % nbuf]
            if tmb is not None:
                launches.append(dev.gemv_tiled_launch("tmb", w, Wts[i % nbuf], x, Y, M, K, K, N, epi, half,
                                                      shape=tmb, ks=ks))
            elif tmr is not None:
                launches.append(dev.gemv_tiled_launch("tmr", w, Wts[i % nbuf], x, Y, M, K, K, N, epi, half,
                                                      shape=tmr, ks=ks))
            elif variant is None:
                launches.append(dev.gemv_fma_launch(w, x, Y, M, K, K, N, epi, half, fma=fma) if kernel == "fma" else
                                linear.gemv_launch(w, x, Y, M, K, K, N, epi, half, gemv=kernel,
                                                   tiled=Wts[i % nbuf] if kernel == "tmb" else None))
            else:
                launches.append(dev.gemv_tc_launch(w, x, Y, M, K, K, N, epi, half, variant=variant, ks=ks))

        def issue():
            for fn, grid, block, args, sm in launches:
                fn(grid, block, args, shared_mem=sm)
        t = time_cupy_graph(cp, be.stream, issue, per_graph, reps)
        t["GBps"] = gbps(t)
        return t

    tw = xb = None
    if torch is not None:
        tw = [torch.from_dlpack(w.view(cp.int16)).view(torch.bfloat16).t() for w in Ws]
        xb = torch.from_dlpack(x).to(torch.bfloat16)
        R["cublas_invariance"] = cublas_invariance(torch, tw[0], xb)

    R["times"] = {}
    for M in MS:
        e = {k: ours(k, M) for k in kernels}
        if torch is not None:
            xm = xb[:M].contiguous()

            def issue_t(xm=xm):
                for i in range(per_graph):
                    torch.matmul(xm, tw[i % nbuf])
            t = time_torch_graph(torch, issue_t, per_graph, reps)
            t["GBps"] = gbps(t)
            e["cublas"] = t
        R["times"][str(M)] = e
        log(f"  M={M}: " + "  ".join(f"{k} {v['us']:.1f} us {v['GBps']:.0f} GB/s" for k, v in e.items())
            + f"  (read {R['read']['us']:.1f} us)")
    if sweep:
        R["sweep"] = []
        for variant in dev.TC_VARIANTS:
            for ks in dev.TC_KSPLITS:
                r = {"variant": list(variant), "ksplit": ks}
                for M in (1, 8):
                    r[f"M{M}_us"] = ours("tensor", M, variant, ks)["us"]
                R["sweep"].append(r)
                log(f"  sweep RT,U,ST={variant} ks={ks}: M=1 {r['M1_us']:.1f} us, M=8 {r['M8_us']:.1f} us")
        R["fma_sweep"] = fma_sweep(be, cp, linear, Ws[0], x, y0, N, K, epi, half, ours)
        R["tmb_sweep"] = []
        for shape in dev.TMB_ALL if "tmb" in kernels else ():
            for ks in linear.TMB_KSPLITS:
                if ks > K // 32:
                    continue
                r = {"shape": list(shape), "ksplit": ks}
                for M in (1, 4, 8):
                    r[f"M{M}_us"] = ours("tmb", M, ks=ks, tmb=shape)["us"]
                R["tmb_sweep"].append(r)
                log(f"  tmb NW,KC,ST={shape} ks={ks}: " + " ".join(f"M={M} {r[f'M{M}_us']:.1f} us" for M in (1, 4, 8)))
        R["tmr_sweep"] = []
        for shape in linear.TMR_SHAPES if "tmb" in kernels else ():
            r = {"shape": list(shape), "ksplit": tmb_ks}
            for M in (1, 4, 8):
                r[f"M{M}_us"] = ours("tmb", M, tmr=shape)["us"]
            R["tmr_sweep"].append(r)
            log(f"  tmr T,P={shape}: " + " ".join(f"M={M} {r[f'M{M}_us']:.1f} us" for M in (1, 4, 8)))
    del Ws, Wts, tw, xb
    cp.get_default_memory_pool().free_all_blocks()
    if torch is not None:
        torch.cuda.empty_cache()
    return R


def fma_sweep(be, cp, linear, W, x, y0, N, K, epi, half, ours):
    """The CUDA-core GEMV's shapes (MT, RR, PF) at each M: time, and whether its rows are
    bit-identical to the engine's shape (they sum in one order, so they must be)."""
    from kestrel import nvrtc as L

    def run(M, fma):
        y = y0[:M].copy()
        L.go(dev.gemv_fma_launch(W, x[:M], y, M, K, K, N, epi, half, fma=fma), be.stream)
        return y
    out = []
    for M in MS:
        ref = run(M, None)
        for fma in dev.GEMV_FMA_SWEEP:
            mt = fma[0]
            if not (mt == M or (mt == 4 and M < 4 and M > 1) or (mt == 8 and M > 4)):
                continue
            same = bool(cp.array_equal(run(M, fma), ref))
            fn, grid = dev.gemv_fma_launch(W, x[:M], y0[:M], M, K, K, N, epi, half, fma=fma)[:2]
            out.append({"M": M, "shape": list(fma), "engine": tuple(fma) == linear.fma_shape(M),
                        "us": ours("fma", M, fma=fma)["us"], "bit_identical": same,
                        "regs": int(fn.num_regs), "blocks": int(grid[0] * grid[1])})
        log(f"  fma shapes M={M}: " + "  ".join(f"{tuple(r['shape'])}{'*' if r['engine'] else ''} {r['us']:.1f}us "
                                                 f"r{r['regs']} b{r['blocks']}{'' if r['bit_identical'] else ' NOT-IDENTICAL'}"
                                                 for r in out if r["M"] == M))
    return out


def profile_once(shape, ms=(1, 4)):
    """One launch of fma, then of each tensor-core variant at its K-split, then of the engine's tiled
    kernel and shape (gemv_tmb or gemv_tmr, linear.tmb_kernel; where tmb_eligible), for each M in ms
    (for a profiler that catches the gemv kernels in this order)."""
    import cupy as cp
    from kestrel.cuda import CUDABackend
    from kestrel import nvrtc as L
    from kestrel.ops import linear
    label, N, K, epi = shape
    be = CUDABackend()
    rows, half = (2 * N, N) if epi == "swiglu" else (N, 0)
    w = cp.empty((rows, K), cp.uint16)
    be._fill_normal(cp.random.RandomState(5), w, K ** -0.5)
    x = cp.random.RandomState(6).standard_normal((8, K), dtype=cp.float32)
    y = cp.zeros((8, N), cp.float32)
    tiled = linear.tmb_tiled(w, K, epi, half) if linear.tmb_eligible(w, K, x, K) else None
    launches = []
    for M in ms:
        launches.append(("fma", M, linear.gemv_launch(w, x, y, M, K, K, N, epi, half, gemv="fma")))
        for v in dev.TC_VARIANTS:
            launches.append((f"tensor {v}", M, dev.gemv_tc_launch(w, x, y, M, K, K, N, epi, half, variant=v)))
        if tiled is not None:
            launches.append(("tmb", M, linear.gemv_launch(w, x, y, M, K, K, N, epi, half, gemv="tmb",
                                                          tiled=tiled)))
    for name, M, launch in launches:
        L.go(launch, be.stream)
        be.sync()
        log(f"profiled launch: {label} M={M} {name} ({launch[0].name if hasattr(launch[0], 'name') else ''})")


# ---- report ------------------------------------------------------------------------------------------
def step_uses(preset="qwen3.5-27b") -> dict:
    """How many times one decode step runs each projection shape of SHAPES (from the config)."""
    from kestrel.config import PRESETS
    from kestrel.lab.sizes import projection_uses
    uses = projection_uses(PRESETS[preset])
    assert list(uses) == [s[0] for s in SHAPES]
    return uses


def sweep_cell(q: dict, ms, bold: bool) -> str:
    """One cell of a sweep table: q's µs at each M of ms, "a / b / c", in bold for the engine's choice."""
    mark = "**" if bold else ""
    return mark + " / ".join(f"{q[f'M{M}_us']:.1f}" for M in ms) + mark


def render_md(R: dict) -> str:
    rb, cb = R["read_bandwidth"], R["copy"]
    fl = R.get("floor_27b", {})
    L = ["# Projections at the Qwen3.5-27B shapes (bf16 weights)", "",
         f"Device: **{R['device']}**, measured {R['date']} with `{R['command']}` "
         f"(torch {R['versions'].get('torch')}, CuPy {R['versions']['cupy']}).", "",
         f"Streaming read (2 GiB, best grid shape {rb['variant']}): **{rb['GBps']:.0f} GB/s**. "
         f"Device-to-device copy (bytes read + written): {cb['GBps_read_plus_write']:.0f} GB/s."]
    if fl:
        L.append(f"A 27B decode step reads {fl['bytes'] / 1e9:.2f} GB of weights: floor {fl['ms_read']:.2f} ms at the "
                 f"read bandwidth, {fl['ms_copy']:.2f} ms at the copy bandwidth.")
    if any("tmb_kernel" in s for s in R["shapes"]):
        tmb_words = ("*tmb*: its tensor-core GEMVs on tiled weights, as the engine runs them (per matrix gemv_tmb, "
                     "fed by bulk copies, or gemv_tmr, fed straight into registers: the same bits; the sweeps "
                     "below say which)")
    else:   # runs before gemv_tmr
        tmb_words = "*tmb*: its tensor-core GEMV fed by bulk copies from tiled weights"
    L += ["", "Time of one projection (µs, median) and weight bytes ÷ time (GB/s). *read*: the streaming-read kernel "
          "over the same weight buffers (the floor at that size). *fma*: kestrel's CUDA-core GEMV; *tensor*: its "
          "register-staged tensor-core GEMV; " + tmb_words + " (all "
          "three batch-invariant, with the epilogue the model uses); *cuBLAS*: torch.matmul, bf16 activations and "
          "output, no epilogue. A ratio < 1: kestrel faster.", "",
          "| shape | M | read | fma | tensor | tmb | cuBLAS | engine ÷ cuBLAS | tmb ÷ cuBLAS | tmb ÷ fma | cuBLAS row 0 = M=1 |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in R["shapes"]:
        if "error" in s:
            L.append(f"| {s['shape']} | error: {s['error'][:100]} |" + " |" * 9)
            continue
        inv = s.get("cublas_invariance", {}).get("row0_bit_identical_by_M")
        for M, e in s["times"].items():
            def c(k):
                return f"{e[k]['us']:.1f} ({e[k]['GBps']:.0f})" if k in e else "—"
            def ratio(a, b):
                return f"{e[a]['us'] / e[b]['us']:.2f}" if a in e and b in e else "—"
            r0 = "—" if inv is None else ("yes" if inv[int(M) - 1] else "**no**")
            L.append(f"| {s['shape']} | {M} | {s['read']['us']:.1f} ({s['read']['GBps']:.0f}) | {c('fma')} | "
                     f"{c('tensor')} | {c('tmb')} | {c('cublas')} | {ratio(R['engine_bf16_gemv'], 'cublas')} | "
                     f"{ratio('tmb', 'cublas')} | {ratio('tmb', 'fma')} | {r0} |")
    L += ["", "Correctness at each shape (x: 8 random rows; the NumPy twin on the first 1024 output rows; outputs "
          "poisoned with NaN first; invariance: every row of each M = 1..8 launch against that row launched alone, "
          "bit for bit). cuBLAS: is each row of an M-row product bit-identical to that row alone, for M = 1..8?", "",
          "| shape | kernel | rel vs float64 | rel vs twin | all written | rows bit-identical, M = 1..8 |",
          "|---|---|---|---|---|---|"]
    for s in R["shapes"]:
        for k, c in s.get("checks", {}).items():
            L.append(f"| {s['shape']} | {k} | {c['rel_vs_float64']:.2e} | {c['rel_vs_twin']:.2e} | "
                     f"{'yes' if c['all_written'] else '**no**'} | {'yes' if c['rows_bit_identical_M1_8'] else '**no**'} |")
        ci = s.get("cublas_invariance")
        if ci:
            bad = [m + 1 for m, ok in enumerate(ci["all_rows_bit_identical_by_M"]) if not ok]
            L.append(f"| {s['shape']} | cuBLAS | | | | {'yes' if not bad else 'no, at M = ' + ', '.join(map(str, bad))} |")
    sw = [s for s in R["shapes"] if s.get("sweep")]
    if sw:
        L += ["", "Tensor-core variants: RT tiles of 16 rows a warp, U k-blocks of 32 a super-chunk, ST register "
              "stages, ks warps sharing a tile's K; µs at M = 1 / M = 8; the engine's choice in bold.", "",
              "| RT,U,ST | ks | " + " | ".join(s["shape"] for s in sw) + " |", "|---|---|" + "---|" * len(sw)]
        for i, r in enumerate(sw[0]["sweep"]):
            cells = []
            for s in sw:
                q = s["sweep"][i]
                cells.append(sweep_cell(q, (1, 8), q["variant"] == s["tc_variant"] and q["ksplit"] == s["tc_ksplit"]))
            L.append(f"| {','.join(map(str, r['variant']))} | {r['ksplit']} | " + " | ".join(cells) + " |")
    ts = [s for s in R["shapes"] if s.get("tmb_sweep")]
    if ts:
        L += ["", "tmb shapes: NW tiles a block, KC k a stage, ST stages; ks blocks sharing a tile's K (ks and the "
              "256-k chain group set a row's order, NW, KC and ST do not); µs at M = 1 / 4 / 8; the engine's "
              "choice in bold.", "",
              "| NW,KC,ST | ks | " + " | ".join(s["shape"] for s in ts) + " |", "|---|---|" + "---|" * len(ts)]
        keys = sorted({(tuple(q["shape"]), q["ksplit"]) for s in ts for q in s["tmb_sweep"]})
        for shape, ks in keys:
            cells = []
            for s in ts:
                q = next((q for q in s["tmb_sweep"] if tuple(q["shape"]) == shape and q["ksplit"] == ks), None)
                if q is None:
                    cells.append("—")
                    continue
                cells.append(sweep_cell(q, (1, 4, 8), s.get("tmb_kernel", ["tmb", s["tmb_shape"]]) == ["tmb", list(shape)]
                                        and ks == s["tmb_ksplit"]))
            L.append(f"| {','.join(map(str, shape))} | {ks} | " + " | ".join(cells) + " |")
    rs = [s for s in R["shapes"] if s.get("tmr_sweep")]
    if rs:
        L += ["", "tmr shapes (gemv_tmr: T tiles a block, each a compute warp with P KB of weights in flight, "
              "plus one warp that splits the activations; ks as tmb's); µs at M = 1 / 4 / 8; the engine's "
              "choice in bold (where it picks gemv_tmr).", "",
              "| T,P | " + " | ".join(s["shape"] for s in rs) + " |", "|---|" + "---|" * len(rs)]
        for i, r in enumerate(rs[0]["tmr_sweep"]):
            cells = []
            for s in rs:
                q = s["tmr_sweep"][i]
                cells.append(sweep_cell(q, (1, 4, 8), s.get("tmb_kernel") == ["tmr", q["shape"]]))
            L.append(f"| {','.join(map(str, r['shape']))} | " + " | ".join(cells) + " |")
    fs = [s for s in R["shapes"] if s.get("fma_sweep")]
    if fs:
        L += ["", "CUDA-core shapes: MT activation rows a block, RR weight rows a warp group, PF register stages; "
              "UP 1: weights widened to fp32 once for all MT rows; "
              "µs at each M, the engine's shape in bold; every shape's rows bit-identical to the engine's: "
              + ("yes" if all(r["bit_identical"] for s in fs for r in s["fma_sweep"]) else "**no**") + ".", "",
              "| M | MT,RR,PF,UP | " + " | ".join(s["shape"] for s in fs) + " |", "|---|---|" + "---|" * len(fs)]
        for i, r in enumerate(fs[0]["fma_sweep"]):
            cells = []
            for s in fs:
                q = s["fma_sweep"][i]
                mark = "**" if q["engine"] else ""
                cells.append(f"{mark}{q['us']:.1f}{mark}")
            L.append(f"| {r['M']} | {','.join(map(str, r['shape']))} | " + " | ".join(cells) + " |")
    uses = step_uses()
    if {s["shape"] for s in R["shapes"] if "times" in s} == set(uses):   # every shape of a step was timed
        L += ["", "All projections of one 27B decode step (each shape times the layers that use it: "
              + ", ".join(f"{k} ×{v}" for k, v in uses.items()) + "), ms, and against M = 1:", "",
              "| M | kestrel (engine) | ÷ M=1 | tmb | ÷ M=1 | cuBLAS | ÷ M=1 | read floor |",
              "|---|---|---|---|---|---|---|---|"]
        from kestrel.lab.sizes import projection_step_ms
        shapes = results.record_of("bench_projections", R, "bench_projections").shapes
        steps = [projection_step_ms(shapes, k) for k in (R["engine_bf16_gemv"], "tmb", "cublas")]
        rd = sum(uses[s["shape"]] * s["read"]["us"] for s in R["shapes"]) / 1e3   # the same for every M
        for M in MS:
            L.append(f"| {M} | " + " | ".join(f"{st[M]:.2f} | {st[M] / st[1]:.3f}" for st in steps) + f" | {rd:.2f} |")
    L += ["", f"Engine default for bf16 weights at the time of the run: `{R['engine_bf16_gemv']}` "
          "(KESTREL_BF16_GEMV, kestrel/settings.py)."]
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--shapes", default="", help="comma-separated indices into SHAPES (default: all)")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds; the sweep is skipped past 70%% of it")
    ap.add_argument("--profile", action="store_true",
                    help="launch each bf16 GEMV once at one shape (for a profiler), measure nothing")
    ap.add_argument("--render", metavar="JSON",
                    help="write OUT/bench_projections.md from a results file, measure nothing")
    a = ap.parse_args()
    if a.render:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        data, _ = results.read_json(a.render)
        results.load_projections(a.render)              # a damaged file is refused, not rendered
        (out / "bench_projections.md").write_text(render_md(data))
        return
    if a.profile:
        profile_once(SHAPES[int(a.shapes or 0)])
        return
    t_start = time.time()
    import cupy as cp
    from bench_engine import copy_bandwidth, floor_bytes
    from kestrel.config import PRESETS
    from kestrel.cuda import CUDABackend
    from kestrel.ops import linear
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    be = CUDABackend()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from kestrel.nvrtc import device_props
    l2 = int(device_props().get("l2CacheSize", 60 << 20))
    prov = results.Provenance(be.device_name, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              results.recorded_command("dev/bench_projections.py", sys.argv[1:],
                                                       settings.kernel_switches()),
                              results.measured_commit(), results.backend_kernels(be))
    R = {"device": prov.device, "device_props": be.device_props, "l2_bytes": l2, "date": prov.date,
         "command": prov.command, "commit": prov.commit,
         "versions": {"cupy": cp.__version__, "numpy": np.__version__, "torch": getattr(torch, "__version__", None),
                      "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "driver": cp.cuda.runtime.driverGetVersion()},
         "engine_bf16_gemv": settings.get("KESTREL_BF16_GEMV"), "tc_variant": list(dev.TC_VARIANT),
         "tc_ksplit_by_K": {str(K): dev.tc_ksplit(K) for K in sorted({s[2] for s in SHAPES})},
         "timing": "CUDA graph of back-to-back launches over rotating weight buffers (>= 4x L2), events around "
                   "each replay, median over replays / launches per graph; no PDL",
         "shapes": []}

    def save():
        results.write(out, "bench_projections", R, render_md, prov)

    from kestrel.ops import stream_read
    sink = stream_read.out_buffer(be.device_props["sm_count"])
    big = cp.empty((2 << 30) // 2, cp.uint16)
    be._fill_normal(cp.random.RandomState(3), big, 1.0)
    rv = read_variants(be, cp, [big], 4, a.reps, sink)
    best = min(rv, key=lambda v: rv[v]["us"])
    R["read_bandwidth"] = {"bytes": big.nbytes, "variant": best, "GBps": big.nbytes / (rv[best]["us"] * 1e-6) / 1e9,
                           "variants": {k: dict(v, GBps=big.nbytes / (v["us"] * 1e-6) / 1e9) for k, v in rv.items()}}
    del big
    cp.get_default_memory_pool().free_all_blocks()
    R["copy"] = copy_bandwidth(be)
    log(f"device {be.device_name}; read {R['read_bandwidth']['GBps']:.0f} GB/s ({best}); "
        f"copy {R['copy']['GBps_read_plus_write']:.0f} GB/s (read + written)")
    fb = floor_bytes(PRESETS["qwen3.5-27b"], "bf16")["weights"]
    R["floor_27b"] = {"bytes": fb, "ms_read": fb / R["read_bandwidth"]["GBps"] / 1e6,
                      "ms_copy": fb / R["copy"]["GBps_read_plus_write"] / 1e6}
    save()
    idx = [int(i) for i in a.shapes.split(",") if i] or range(len(SHAPES))
    for i in idx:
        label, N, K, epi = SHAPES[i]
        sweep = not a.no_sweep and time.time() - t_start < 0.7 * a.budget
        try:
            R["shapes"].append(bench_shape(be, cp, torch, label, N, K, epi, a.reps, sink, 4 * l2, sweep))
        except Exception as e:  # record and keep going
            import traceback
            traceback.print_exc()
            R["shapes"].append({"shape": label, "N": N, "K": K, "epilogue": epi, "error": f"{type(e).__name__}: {e}"})
        save()
    R["wall_s"] = time.time() - t_start
    save()
    print(render_md(R))


if __name__ == "__main__":
    main()
