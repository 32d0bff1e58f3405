#!/usr/bin/env python3
"""Benchmark the CUDA engine: results/bench_engine_tmb.json + .md under the default tensor-core GEMV
(a file is named by the GEMV it ran, results.stem: KESTREL_BF16_GEMV=fma writes results/bench_engine.*).

    python3 scripts/bench_engine.py --out results            # on a GPU machine
    python3 scripts/bench_engine.py --presets test-a,qwen3.5-0.8b --no-peer

Everything is timed with CUDA events after warm-up, as the median of many runs; nothing here
is a test. In one run it measures:
  * the device-to-device copy bandwidth (a large buffer, bytes read + bytes written);
  * per preset (random weights, bf16 projections for the Qwen3.5 shapes, fp32 for test shapes):
      - greedy ms/token, end to end (engine.step + argmax + the host reading the token), and
        the device time of one decode step (its CUDA graph replayed back to back), each against
        the floor = bytes that must be read per token / copy bandwidth, where the bytes are every
        main-model weight once (the lm_head included; a tied embedding counted once, as the
        head; an untied embedding as the one row looked up; the MTP head excluded);
      - the same step without CUDA graphs (eager launches), to show the launch overhead;
      - step_m(M) / step for M = 1..4 and verify_checkpointed(M) / step;
      - one MTP step; mark and rollback against 2 × (S + hist bytes) / copy bandwidth;
  * the peer: transformers' Qwen3_5ForCausalLM on the same shapes (bf16, random weights, greedy
    with its cache), in a child process once this one has released the GPU memory.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kestrel.lab import results  # noqa: E402
from kestrel import settings  # noqa: E402
from kestrel.lab.results import repo_relative  # noqa: E402
from kestrel.lab.roofline import timed_ms as timed  # noqa: E402
from kestrel.program import param_count  # noqa: E402

QWEN = ["qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b"]
DEFAULT_PRESETS = ["test-a", "test-b", "tiny"] + QWEN


def med(xs):
    return float(statistics.median(xs)) if xs else float("nan")


def log(*a):
    print(*a, flush=True)


# ---- bytes ------------------------------------------------------------------------------------
def floor_bytes(cfg, dtype: str) -> dict:
    """Bytes one decode step must read: every main-model weight once (see the module doc)."""
    from kestrel.lab.sweep import weight_bytes
    return {"weights": weight_bytes(cfg, dtype)}


def state_bytes(cfg, ctx: int) -> int:
    """State traffic of one step at context ctx: S and hist read + written, K/V read (fp32)."""
    g = len(cfg.gdn_layers) * cfg.lin_num_value_heads * cfg.lin_key_head_dim * cfg.lin_value_head_dim * 4
    h = cfg.conv_state_bytes
    kv = len(cfg.attn_layers) * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * (ctx + 1)
    return int(2 * g + 2 * h + kv)


# ---- our engine ---------------------------------------------------------------------------------
def copy_bandwidth(be, nbytes=2 << 30, reps=20):
    from kestrel.lab.sweep import copy_ms
    times = copy_ms(be, nbytes, reps, warm=3)
    t = med(times)
    return {"bytes_copied": nbytes, "ms_median": t, "GBps_read_plus_write": 2 * nbytes / (t * 1e-3) / 1e9,
            "ms_all": times}


def read_bandwidth(be, nbytes=2 << 30, reps=15):
    """kernels/stream_read.cu (16-byte loads that skip L1) over one large buffer, the best of
    its shapes (kestrel.lab.sweep.read_bandwidth): the honest floor."""
    from kestrel.lab.sweep import read_bandwidth as stream_read_bandwidth
    rd = stream_read_bandwidth(be, nbytes, reps, warm=3)
    return {"bytes": nbytes, "variant": rd["shape"], "GBps": rd["Bps"] / 1e9}


def gemv_sweep(be, reps=15, shapes=None):
    """linear.cu's CUDA-core GEMV alone on the 27B projection shapes (bf16): M = 1 and 4, K-split
    ks = 1, 2, 4."""
    import cupy as cp
    from kestrel import nvrtc as L
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
    from gemv_variants import gemv_fma_launch   # the K split is fixed by K in the engine
    shapes = shapes or [("gdn in_proj [qkv|z|b|a]", 16480, 5120, 0), ("attn [q|k|v]", 14336, 5120, 0),
              ("mlp [gate|up] + SwiGLU", 17408, 5120, 2), ("mlp down", 5120, 17408, 0),
              ("out_proj / o_proj", 5120, 6144, 0), ("lm_head", 248320, 5120, 0)]
    rs = cp.random.RandomState(7)
    out = []
    for label, N, K, epi in shapes:
        rows = 2 * N if epi == 2 else N
        W = cp.empty((rows, K), cp.uint16)
        be._fill_normal(rs, W, K ** -0.5)
        X = rs.standard_normal((4, K), dtype=cp.float32)
        Y = cp.empty((4, N), cp.float32)
        for m in (1, 4):
            for ks in (1, 2, 4):
                launch = gemv_fma_launch(W, X, Y, m, K, K, N, epilogue="swiglu" if epi == 2 else "store",
                                         half=N if epi == 2 else 0, ks=ks)
                t = med(timed(be, lambda: L.go(launch, be.stream), reps))
                out.append({"shape": label, "N": N, "K": K, "M": m, "ksplit": ks, "ms": t,
                            "GBps": rows * K * 2 / (t * 1e-3) / 1e9})
        del W, X, Y
    cp.get_default_memory_pool().free_all_blocks()
    return out


def kernel_breakdown(be, plan, reps=3, R=8):
    """Where a step's time goes: each launch of a plan captured R times in a row as a graph
    (no PDL) and replayed; its time is the replay time / R (the kernel plus its share of the
    gap between dependent kernels). Summed per kernel; GEMV bandwidth over its weight bytes."""
    agg = {}
    total = 0.0
    st = be.stream
    for fn, grid, block, args, smem in plan.launches:
        with st:
            st.begin_capture()
            try:
                for _ in range(R):
                    fn(grid, block, args, shared_mem=smem)
            finally:
                g = st.end_capture()
        t = med(timed(be, lambda: g.launch(st), reps, warm=1)) / R
        name = getattr(fn, "name", "?")
        k = name.split("_v")[0] + name[-3:] if name.startswith("gemv") and "_v" in name else name
        a = agg.setdefault(k, {"launches": 0, "ms": 0.0, "weight_bytes": 0})
        a["launches"] += 1
        a["ms"] += t
        if name.startswith("gemv"):   # (N, K) in the argument list of kestrel/ops/linear.py's launchers
            N, K = (int(args[5]), int(args[6])) if name.startswith(("gemv_tmb", "gemv_tmr")) else (int(args[6]), int(args[7]))
            rows = 2 * N if name.endswith("e2") else N
            a["weight_bytes"] += rows * K * (4 if "f32" in name else 2)
        total += t
    for a in agg.values():
        if a["weight_bytes"]:
            a["GBps"] = a["weight_bytes"] / (a["ms"] * 1e-3) / 1e9
    return {"kernels": agg, "sum_ms": total, "launches": len(plan.launches), "repeat": R}


def bench_preset(be, name: str, dtype: str, bw_gbps: float, ntok: int, reps: int, rng) -> dict:
    import cupy as cp
    import numpy as np
    import kestrel
    t0 = time.time()
    model = kestrel.load(name, device="cuda", dtype=dtype, seed=0)
    be = model.be
    be.sync()
    load_s = time.time() - t0
    cfg = model.cfg
    V = cfg.vocab_size
    P = 16
    ctx = P + 3 + ntok + 8 * (reps + 3) + 16
    fb = floor_bytes(cfg, dtype)
    floor_ms = fb["weights"] / (bw_gbps * 1e9) * 1e3
    r = {"preset": name, "dtype": dtype, "params": param_count(cfg), "params_no_mtp": param_count(cfg, mtp=False),
         "load_s": load_s, "floor_bytes": fb["weights"], "floor_ms": floor_ms, "source": repo_relative(model.source)}
    log(f"[{name} {dtype}] loaded in {load_s:.1f}s; floor {fb['weights'] / 1e9:.3f} GB -> {floor_ms:.3f} ms")

    eng = kestrel.Engine(model, max_seq=ctx, mmax=4, batch="flex")
    prompt = rng.integers(0, V, P).tolist()
    s = eng.prefill(prompt)
    t = int(be.argmax(s.logits[-1]))
    for _ in range(3):
        s = eng.step(eng.cursor, t)
        t = int(be.argmax(s.logits))
    evs, stream = [], []
    for _ in range(ntok):
        evs.append(be.now())
        s = eng.step(eng.cursor, t)
        t = int(be.argmax(s.logits))
        stream.append(t)
    evs.append(be.now())
    per = [be.elapsed_ms(evs[i], evs[i + 1]) for i in range(ntok)]
    r["greedy_ms"] = med(per)
    r["greedy_ms_all"] = per
    r["greedy_x_floor"] = r["greedy_ms"] / floor_ms
    r["ctx_at_greedy"] = eng.cursor
    r["state_bytes_per_step"] = state_bytes(cfg, eng.cursor)
    r["floor_with_state_ms"] = (fb["weights"] + r["state_bytes_per_step"]) / (bw_gbps * 1e9) * 1e3
    log(f"  greedy {r['greedy_ms']:.3f} ms/token ({r['greedy_x_floor']:.2f}x floor)")

    # step_m(M) and verify_checkpointed(M), at one position (mark/rollback around each call)
    p = eng.cursor
    toks = rng.integers(0, V, 4).tolist()
    r["step_m_ms"], r["verify_ckpt_ms"] = {}, {}
    for m in range(1, 5):
        if m == 1:
            f = (lambda: eng.step(p, toks[0]))
        else:
            f = (lambda m=m: eng.step_m(p, toks[:m]))
        r["step_m_ms"][m] = med(timed(be, f, reps, before=eng.mark, after=eng.rollback))
        r["verify_ckpt_ms"][m] = med(timed(be, lambda m=m: eng.verify_checkpointed(p, toks[:m]), reps,
                                           after=lambda: eng.select_checkpoint(0)))
    # the input cache: verify_cached(M), and folding n of 4 cached rows into the live state
    r["verify_cached_ms"], r["fold_ms"] = {}, {}
    for m in range(1, 5):
        r["verify_cached_ms"][m] = med(timed(be, lambda m=m: eng.verify_cached(p, toks[:m]), reps,
                                             after=lambda: eng.fold_cached(0)))
        r["fold_ms"][m] = med(timed(be, lambda m=m: eng.fold_cached(m), reps,
                                    before=lambda: (eng.mark(), eng.verify_cached(p, toks)), after=eng.rollback))
    st = r["step_m_ms"][1]
    r["verify_cached_over_step"] = {m: v / st for m, v in r["verify_cached_ms"].items()}
    r["step_m_over_step"] = {m: v / st for m, v in r["step_m_ms"].items()}
    r["verify_ckpt_over_step"] = {m: v / st for m, v in r["verify_ckpt_ms"].items()}
    log("  step_m/step " + " ".join(f"M={m}:{v:.3f}" for m, v in r["step_m_over_step"].items())
        + " | verify_ckpt/step " + " ".join(f"M={m}:{v:.3f}" for m, v in r["verify_ckpt_over_step"].items()))

    # MTP step (one row), at MTP position 0, truncating back each time
    if model.has_mtp:
        h = s.hidden

        def mtp():
            eng.mtp_step(0, t, h)
        r["mtp_step_ms"] = med(timed(be, mtp, reps, after=lambda: eng.mtp_truncate(0)))
        r["mtp_over_step"] = r["mtp_step_ms"] / st
        log(f"  mtp_step {r['mtp_step_ms']:.3f} ms ({r['mtp_over_step']:.3f} of a step)")

    # mark / rollback vs the bytes they copy
    sb = eng.state_bytes()
    nb = sb["gdn_S"] + sb["gdn_hist"]
    marks, rolls = [], []
    for i in range(reps + 3):
        be.sync()
        a = be.now()
        eng.mark()
        b = be.now()
        eng.rollback()
        c = be.now()
        if i >= 3:
            marks.append(be.elapsed_ms(a, b))
            rolls.append(be.elapsed_ms(b, c))
    S_live, _ = eng.live_state()
    raw = timed(be, lambda: cp.cuda.runtime.memcpyAsync(eng.state.S_snap.data.ptr, S_live.data.ptr, sb["gdn_S"],
                                                        cp.cuda.runtime.memcpyDeviceToDevice, be.stream.ptr), reps)
    r["mark"] = {"ms": med(marks), "rollback_ms": med(rolls), "bytes_S": sb["gdn_S"], "bytes_hist": sb["gdn_hist"],
                 "floor_ms": 2 * nb / (bw_gbps * 1e9) * 1e3, "memcpy_S_ms": med(raw)}
    log(f"  mark {r['mark']['ms']:.3f} ms, rollback {r['mark']['rollback_ms']:.3f} ms "
        f"(floor {r['mark']['floor_ms']:.3f} ms for {nb / 1e6:.1f} MB)")

    # device time of one step: the captured graphs replayed back to back (no host work),
    # as captured (programmatic dependent launch if on) and re-captured the other way
    plans = be.plans(model)
    r["replay_ms"], r["replay_ms_other_pdl"], r["graph_pdl"] = {}, {}, {}
    for key, plan in list(plans.items()):
        if key[0] == "main" and plan.graph is not None and key[1] in (1, 4):
            n = 2 * reps
            tag = f"{'step' if key[2] == 'in_place' else key[2]}{key[1]}"

            def rep(g, n=n):
                for _ in range(n):
                    g.launch(be.stream)
            r["replay_ms"][tag] = med(timed(be, lambda: rep(plan.graph), 5, warm=1)) / n
            r["graph_pdl"][tag] = plan.pdl
            try:
                g2 = plan.capture(not plan.pdl)
                r["replay_ms_other_pdl"][tag] = med(timed(be, lambda: rep(g2), 5, warm=1)) / n
                del g2
            except Exception as e:
                r["replay_ms_other_pdl"][tag] = repr(e)
    if "step1" in r["replay_ms"]:
        r["replay_step_x_floor"] = r["replay_ms"]["step1"] / floor_ms
        log(f"  graph replay step {r['replay_ms']['step1']:.3f} ms ({r['replay_step_x_floor']:.2f}x floor); "
            + " ".join(f"{k}:{v:.3f}" for k, v in r["replay_ms"].items()) + f" (pdl {r['graph_pdl']}); other pdl: "
            + " ".join(f"{k}:{v:.3f}" if isinstance(v, float) else f"{k}:{v}" for k, v in r["replay_ms_other_pdl"].items()))

    # where a step's time goes: every launch of the step plans timed alone
    if name in QWEN or name == "tiny":
        r["breakdown"] = {}
        for key, plan in list(plans.items()):
            big = name.endswith("27b")
            if key[0] == "main" and ((key[2] == "in_place" and key[1] in ((1, 4) if big else (1,)))
                                     or (big and key[2] == "checkpoint" and key[1] == 4)):
                tag = f"step{key[1]}" if key[2] == "in_place" else f"verify_ckpt{key[1]}"
                try:
                    b = kernel_breakdown(be, plan)
                except Exception as e:
                    r["breakdown"][tag] = {"error": repr(e)}
                    log(f"  breakdown {tag} failed: {e!r}")
                    continue
                r["breakdown"][tag] = b
                log(f"  breakdown {tag}: {b['launches']} launches, sum {b['sum_ms']:.3f} ms; "
                    + ", ".join(f"{k} {v['ms']:.3f}" + (f" ({v['GBps']:.0f} GB/s)" if "GBps" in v else "")
                                for k, v in sorted(b['kernels'].items(), key=lambda kv: -kv[1]['ms'])))

    # the same decode step without graphs (eager launches), on a fresh engine
    be.use_graphs = False
    try:
        e2 = kestrel.Engine(model, max_seq=64, mmax=1)
        s2 = e2.prefill(prompt[:4])
        t2 = int(be.argmax(s2.logits[-1]))
        ev = []
        for _ in range(min(ntok, 16) + 3):
            ev.append(be.now())
            s2 = e2.step(e2.cursor, t2)
            t2 = int(be.argmax(s2.logits))
        ev.append(be.now())
        per = [be.elapsed_ms(ev[i], ev[i + 1]) for i in range(3, len(ev) - 1)]
        r["eager_greedy_ms"] = med(per)
        del e2
    except Exception as e:
        r["eager_error"] = repr(e)
        r["eager_greedy_ms"] = float("nan")
    finally:
        be.use_graphs = True
    log(f"  eager (no graph) greedy {r['eager_greedy_ms']:.3f} ms/token")
    r["graph_stats"] = dict(be.stats, graph_errors=list(be.stats["graph_errors"]))
    del eng, model, plans
    return r


# ---- transformers (child process) -----------------------------------------------------------
def peer(presets, ntok: int, deadline: float, out_path: str):
    import numpy as np
    import torch
    import transformers
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    import kestrel
    dev = os.environ.get("KESTREL_PEER_DEVICE", "cuda")     # "cpu" only to smoke-test this code
    cuda = dev == "cuda"

    def stamp():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(a, b):
        return a.elapsed_time(b) if cuda else (b - a) * 1e3

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "presets": {}}
    from transformers.utils import import_utils as iu
    res["flash_linear_attention"] = bool(iu.is_flash_linear_attention_available())
    res["causal_conv1d"] = bool(iu.is_causal_conv1d_available())
    res["fallbacks"] = ([] if res["flash_linear_attention"] else ["gated delta rule: torch reference (no flash-linear-attention)"]) + \
                       ([] if res["causal_conv1d"] else ["causal conv1d: torch reference (no causal-conv1d)"])
    torch.set_default_dtype(torch.bfloat16)
    rng = np.random.default_rng(1)
    for name in presets:
        left = deadline - time.time()
        cfg = kestrel.PRESETS[name]
        full = cfg.num_layers
        layer_sets = [full]
        if left < 60 and full > 16:
            layer_sets = [8, 16]       # two short stacks, extrapolated linearly to the full depth
        if left < 20:
            res["presets"][name] = {"skipped": f"time budget ({left:.0f}s left)"}
            continue
        entry = {"layers_run": layer_sets, "full_layers": full}
        times = {}
        for L in layer_sets:
            hf = cfg.to_hf()
            hf.pop("architectures", None)
            hf["num_hidden_layers"] = L
            hf["layer_types"] = list(cfg.layer_types[:L])
            tcfg = Qwen3_5TextConfig(**hf)
            t0 = time.time()
            with torch.device(dev):
                model = Qwen3_5ForCausalLM(tcfg)
            model.eval()
            sync()
            entry.setdefault("build_s", []).append(time.time() - t0)
            ids = torch.as_tensor(rng.integers(0, cfg.vocab_size, (1, 16)), device=dev)
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                evs = []
                for i in range(3 + ntok):
                    evs.append(stamp())
                    out = model(input_ids=tok, past_key_values=pkv, use_cache=True)
                    pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                evs.append(stamp())
                sync()
            per = [ms(evs[i], evs[i + 1]) for i in range(3, len(evs) - 1)]
            times[L] = med(per)
            del model, out, pkv
            if cuda:
                torch.cuda.empty_cache()
        if len(layer_sets) == 1:
            entry["ms_per_token"] = times[full]
        else:
            a, b = layer_sets
            slope = (times[b] - times[a]) / (b - a)
            entry["ms_per_token"] = times[b] + slope * (full - b)
            entry["extrapolated_from"] = {str(k): v for k, v in times.items()}
        res["presets"][name] = entry
        print(f"[peer {name}] {entry['ms_per_token']:.2f} ms/token ({'measured' if len(layer_sets) == 1 else 'extrapolated'})",
              flush=True)
        Path(out_path).write_text(json.dumps(res, indent=1))
    Path(out_path).write_text(json.dumps(res, indent=1))


# ---- report ------------------------------------------------------------------------------------
def render_md(R: dict) -> str:
    L = [f"# Engine benchmark (CUDA)", "",
         f"Device: **{R['device']}**, measured {R['date']} with `{R['command']}`.", "",
         f"Copy bandwidth (device to device, {R['copy']['bytes_copied'] / 2**30:.0f} GiB, bytes read + written): "
         f"**{R['copy']['GBps_read_plus_write']:.0f} GB/s**. Floor = bytes one decode step must read "
         f"(every main-model weight once, lm_head included, a tied embedding once as the head, MTP excluded) "
         f"÷ that bandwidth.", "",
         "| preset | weights | floor bytes | floor ms | greedy ms/token | ×floor | graph replay ms (PDL) | ×floor "
         "| replay, no PDL | eager ms/token | step_m/step M=2,3,4 | verify_ckpt/step M=1..4 | MTP step ms "
         "| mark / rollback ms (floor) | transformers ms/token | speedup |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    peer = R.get("peer", {}).get("presets", {})
    for r in R["presets"]:
        if "error" in r:
            L.append(f"| {r['preset']} | {r.get('dtype', '')} | error: {r['error'][:80]} |" + " |" * 14)
            continue
        sm = r["step_m_over_step"]
        vc = r["verify_ckpt_over_step"]
        rp = r.get("replay_ms", {}).get("step1", float("nan"))
        ro = r.get("replay_ms_other_pdl", {}).get("step1", float("nan"))
        if not r.get("graph_pdl", {}).get("step1", False):      # the default graph had no PDL
            rp, ro = (ro, rp) if isinstance(ro, float) else (float("nan"), rp)
        ro = ro if isinstance(ro, float) else float("nan")
        pe = peer.get(r["preset"], {})
        pms = pe.get("ms_per_token")
        ptxt = "—" if pms is None else (f"{pms:.2f}" + (" (extrap.)" if "extrapolated_from" in pe else ""))
        sp = "—" if pms is None else f"{pms / r['greedy_ms']:.1f}×"
        mk = r["mark"]
        L.append(f"| {r['preset']} | {r['dtype']} | {r['floor_bytes'] / 1e9:.3f} GB | {r['floor_ms']:.3f} | "
                 f"{r['greedy_ms']:.3f} | {r['greedy_x_floor']:.2f} | {rp:.3f} | {rp / r['floor_ms']:.2f} | {ro:.3f} | "
                 f"{r.get('eager_greedy_ms', float('nan')):.3f} | "
                 f"{sm[2]:.3f}, {sm[3]:.3f}, {sm[4]:.3f} | {vc[1]:.3f}, {vc[2]:.3f}, {vc[3]:.3f}, {vc[4]:.3f} | "
                 f"{r.get('mtp_step_ms', float('nan')):.3f} | {mk['ms']:.3f} / {mk['rollback_ms']:.3f} ({mk['floor_ms']:.3f}) | "
                 f"{ptxt} | {sp} |")
    L += ["", "Input cache (policy input-cache): verify_cached(M) / step, and the fold of n cached rows into the "
          "live state (ms), beside the checkpointed verify:", "",
          "| preset | verify_cached/step M=1..4 | verify_ckpt/step M=1..4 | fold n=1..4 ms |", "|---|---|---|---|"]
    for r in R["presets"]:
        if "error" in r or "verify_cached_over_step" not in r:
            continue
        vq, vc, fo = r["verify_cached_over_step"], r["verify_ckpt_over_step"], r["fold_ms"]
        L.append(f"| {r['preset']} | " + ", ".join(f"{vq[m]:.3f}" for m in sorted(vq)) + " | "
                 + ", ".join(f"{vc[m]:.3f}" for m in sorted(vc)) + " | " + ", ".join(f"{fo[m]:.3f}" for m in sorted(fo)) + " |")
    rd = R.get("read")
    if rd:
        L += ["", f"Against the streaming-read floor: a pure read kernel streams **{rd['GBps']:.0f} GB/s** "
              f"({rd['bytes'] / 2**30:.0f} GiB, {rd['variant']}); read floor = the same bytes ÷ that bandwidth.", "",
              "| preset | read floor ms | greedy ×read floor | graph replay ×read floor | verify_ckpt M=4 ×read floor |",
              "|---|---|---|---|---|"]
        for r in R["presets"]:
            if "error" in r:
                continue
            fr = r["read_floor_ms"]
            rp = r.get("replay_ms", {}).get("step1", float("nan"))
            L.append(f"| {r['preset']} | {fr:.3f} | {r['greedy_ms'] / fr:.2f} | {rp / fr:.2f} | "
                     f"{r['verify_ckpt_ms'][4] / fr:.2f} |")
    for r in R["presets"]:
        bd = {k: v for k, v in r.get("breakdown", {}).items() if "kernels" in v}
        if len(bd) < 2:
            continue
        tags = sorted(bd)
        names = sorted({k for v in bd.values() for k in v["kernels"]},
                       key=lambda k: -max(v["kernels"].get(k, {}).get("ms", 0.0) for v in bd.values()))
        L += ["", f"Where the time goes at {r['preset']}: each launch of the plan timed alone (captured 8 times in a "
              "row and replayed: the kernel plus its share of the gaps), summed per kernel, ms; GB/s over the "
              "weight bytes for the projections.", "",
              "| kernel | " + " | ".join(f"{t} ms (launches)" for t in tags) + " |", "|---|" + "---|" * len(tags)]
        for k in names:
            cells = []
            for t in tags:
                v = bd[t]["kernels"].get(k)
                cells.append("—" if v is None else f"{v['ms']:.3f} ({v['launches']})"
                             + (f", {v['GBps']:.0f} GB/s" if "GBps" in v else ""))
            L.append(f"| {k} | " + " | ".join(cells) + " |")
        L.append("| sum | " + " | ".join(f"{bd[t]['sum_ms']:.3f} ({bd[t]['launches']})" for t in tags) + " |")
    for e in R.get("errata", []):      # added to a results file after its run, each saying what is wrong and why
        L += ["", f"Erratum: {e}"]
    L += ["", "Goals (reported, not asserted): 27B greedy ≤ 1.12× the read floor; verify_ckpt ≤ 1.05× step at "
          "M = 2, 3, 4; ahead of transformers.", ""]
    if R.get("peer"):
        p = R["peer"]
        L.append(f"Peer: transformers {p.get('transformers')} / torch {p.get('torch')} `Qwen3_5ForCausalLM`, bf16, random "
                 f"weights, greedy with its cache; flash-linear-attention installed: {p.get('flash_linear_attention')} "
                 f"({'; '.join(p.get('fallbacks', [])) or 'no torch fallbacks'}).")
        for n, e in peer.items():
            if "extrapolated_from" in e:
                L.append(f"{n}: transformers ran {', '.join(e['extrapolated_from'])} layers of {e['full_layers']}; "
                         f"ms/token extrapolated linearly to the full depth.")
            if "skipped" in e:
                L.append(f"{n}: transformers skipped ({e['skipped']}).")
    L += ["", f"Programmatic dependent launch in the captured graphs: {'on' if R.get('pdl') else 'off'} "
          f"(self-test: {R.get('pdl_selftest', 'not run')}). greedy, step_m, verify and MTP use the default graphs.", ""]
    L += ["", "greedy = engine.step + argmax + the host reading the token, per token (events, median); graph replay = "
          "the captured decode-step graph replayed back to back (device time only); eager = the same step with "
          "CUDA graphs off. step_m and verify timed at one position with mark/rollback (or select_checkpoint(0)) "
          "around each call, outside the timed region."]
    return "\n".join(L) + "\n"


def from_json(d):
    """A results dict as the script held it before writing: JSON turned its integer keys (rows M)
    into strings."""
    if isinstance(d, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: from_json(v) for k, v in d.items()}
    return [from_json(v) for v in d] if isinstance(d, list) else d


def save_results(out: Path, R: dict, prov, kernels: dict | None) -> Path:
    """Write R and its table as out/<stem>.json and .md (results.stem: bench_engine, or
    bench_engine_<gemv> under another bf16 GEMV); the JSON's path."""
    return results.write(out, results.stem("bench_engine", kernels), R, render_md, prov)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--presets", default=",".join(DEFAULT_PRESETS))
    ap.add_argument("--ntok", type=int, default=48)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run (peer included)")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--peer-only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--peer-out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer_only is not None:
        peer(a.peer_only.split(","), a.ntok, a.deadline, a.peer_out)
        return
    t_start = time.time()
    deadline = t_start + a.budget
    import numpy as np
    import cupy as cp
    import kestrel
    from kestrel.cuda import CUDABackend
    be = CUDABackend()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels = results.backend_kernels(be)
    prov = results.Provenance(be.device_name, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              results.recorded_command("scripts/bench_engine.py", sys.argv[1:],
                                                       settings.kernel_switches()),
                              results.measured_commit(), kernels)
    R = {"device": prov.device, "device_props": be.device_props, "date": prov.date, "command": prov.command,
         "commit": prov.commit,
         "cupy": cp.__version__, "numpy": np.__version__,
         "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "driver": cp.cuda.runtime.driverGetVersion(),
         "presets": []}
    R["pdl"] = be.pdl
    R["pdl_selftest"] = os.environ.get("KESTREL_PDL_SELFTEST", "not run")
    R["copy"] = copy_bandwidth(be)
    bw = R["copy"]["GBps_read_plus_write"]
    sys.path.insert(0, str(ROOT / "scripts"))
    R["read"] = read_bandwidth(be)
    log(f"device {be.device_name}; copy bandwidth {bw:.0f} GB/s (read + write); streaming read "
        f"{R['read']['GBps']:.0f} GB/s ({R['read']['variant']})")
    if not a.no_sweep:
        try:
            R["gemv_sweep"] = gemv_sweep(be)
            for g in R["gemv_sweep"]:
                log(f"  gemv {g['shape']:26s} M={g['M']} ksplit={g['ksplit']}: {g['ms']:.4f} ms {g['GBps']:.0f} GB/s")
        except Exception as e:
            import traceback
            traceback.print_exc()
            R["gemv_sweep_error"] = repr(e)

    def save():
        save_results(out, R, prov, kernels)

    rng = np.random.default_rng(0)
    presets = [p for p in a.presets.split(",") if p]
    peer_presets = [p for p in presets if p in QWEN]
    peer_reserve = 100.0 if (peer_presets and not a.no_peer) else 0.0
    for name in presets:
        if name == "tiny" and not (ROOT / "kestrel" / "assets" / "tiny" / "config.json").exists():
            continue
        dtypes = ["bf16"] if name in QWEN else ["fp32"]
        for dt in dtypes:
            if time.time() > deadline - peer_reserve - 20:
                R["presets"].append({"preset": name, "dtype": dt, "error": "skipped: time budget"})
                continue
            try:
                r = bench_preset(be, name, dt, bw, a.ntok if name != "qwen3.5-27b" else max(16, a.ntok // 2),
                                 a.reps, rng)
            except Exception as e:  # record and keep going
                import traceback
                traceback.print_exc()
                r = {"preset": name, "dtype": dt, "error": f"{type(e).__name__}: {e}"}
            if "floor_bytes" in r:   # the same bytes at the streaming-read bandwidth (chapter 7 reads it)
                r["read_floor_ms"] = r["floor_bytes"] / (R["read"]["GBps"] * 1e9) * 1e3
            R["presets"].append(r)
            cp.get_default_memory_pool().free_all_blocks()
            save()
    if peer_presets and not a.no_peer:
        import gc
        gc.collect()
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
        pj = out / "peer.json"
        cmd = [sys.executable, __file__, "--peer-only", ",".join(peer_presets), "--peer-out", str(pj),
               "--ntok", "12", "--deadline", str(deadline)]
        log("peer: " + " ".join(cmd))
        try:
            subprocess.run(cmd, timeout=max(30.0, deadline - time.time() + 30), check=False)
        except subprocess.TimeoutExpired:
            log("peer: timed out")
        if pj.exists():
            R["peer"] = json.loads(pj.read_text())
    R["wall_s"] = time.time() - t_start
    save()
    print(render_md(R))


if __name__ == "__main__":
    main()
