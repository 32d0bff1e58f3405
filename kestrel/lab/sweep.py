"""Where speculation starts to pay: the same round at every model size and k, and a roofline.

    from kestrel.lab import sweep
    d = sweep.size_sweep(["tiny", "qwen3.5-27b"], device="cuda")   # plain dicts, JSON-ready
    d["sizes"][0]["runs"]          # one row per k: median ms/token, speedup, bit_exact, ...
    d["sizes"][0]["roofline"]      # floor, launch cost, measured step and verify(M)
    s = sweep.size_section()       # live on a GPU that holds the sizes, else results/
    b = sweep.large_section()      # the 27B runs of scripts/bench_spec.py (b), live or recorded

Each size runs the replay drafter driven by one acceptance profile (default: the article's E16
profile on the trained pairing, checkpoint policy), so every size sees the same n_ok pattern
and only the costs differ. Greedy is timed in the same call, as everywhere in kestrel.speculative.

Why size decides. A verify of k rows pays off when it costs about one step, and a draft step
when it costs a small part of one. A decode step pays two things: it reads every weight once
(the bandwidth floor: weight bytes / memory bandwidth) and it launches a fixed number of kernels,
each with a fixed cost however little it moves (the launch cost: kernels per step x cost per
kernel). A large model is bandwidth-bound: reading 50 GB dwarfs 500 launches, and a verify of k
rows reads the same weights once, so it costs about one step; k rows are checked for the price
of one. A tiny model is launch-bound: its weights stream in microseconds, the step is mostly
launches plus each row's own arithmetic (the recurrence and attention run row by row), and
nothing large is shared between the rows, so a verify of M rows costs the launches plus about M
times a row's work; and the MTP head, a layer with its own launches, costs nearly as much as the
whole step. Then drafting eats what the batched verify saves. The roofline below puts numbers on
both terms per size: `floor_ms` and `launch_ms`, and the larger one names the regime.
"""
from __future__ import annotations

import datetime as _dt
import gc
import math
import statistics
import sys
import time

import numpy as np

from . import results
from kestrel.config import PRESETS
from kestrel.engine import Engine
from kestrel.inputs import is_int
from kestrel.program import expected_shapes, main_program, param_count
from kestrel.speculative.baseline import greedy_timed
from kestrel.speculative.cost import compare, predict
from kestrel.speculative.pairing import Pairing
from kestrel.speculative.policy import POLICIES, Policy
from kestrel.speculative.records import aggregate
from kestrel.speculative.schedule import ARTICLE_HIST, E16_PROFILE, Schedule
from kestrel.speculative.units import measure_unit_costs

SIZE_PRESETS = ("tiny", "qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b")
QUICK_PRESETS = ("test-a", "test-b")          # CPU stand-ins: the same code path in seconds
LARGE = "qwen3.5-27b"
KS = (1, 2, 3, 4)
ALPHA_2P8 = 0.7655      # flat per-depth acceptance with 1 + a + a^2 + a^3 = 2.8 (trained pairing, k = 4)
# n_ok round by round, cycled: 2.8 tokens a round over each 5-round cycle (a 64-token run, whose
# last round is shrunk, advances 2.78); the profile above gives 2.8 only in expectation (its
# seeded draw over a 64-token run advanced 2.46 a round on 2026-12-02)
SEQ_2P8 = (4, 2, 4, 1, 3)
CPU_WEIGHT_LIMIT = 64 * 2 ** 20     # the largest weights a CPU sweep loads (tiny and the test shapes)
HEADROOM = 1.25                     # GPU memory for states, caches and plans beyond the weights

# (name, k, what the replay drafter replays, pairing): scripts/bench_spec.py part (b)
LARGE_SCHEDULES = (
    *[("article histogram", k, {"hist": ARTICLE_HIST}, Pairing.ARTICLE) for k in (3, 4)],
    *[("E16 profile", k, {"profile": E16_PROFILE}, pr) for pr in Pairing for k in (2, 3, 4)],
    ("2.8 tokens/round", 4, {"profile": (ALPHA_2P8,) * 4}, Pairing.TRAINED),
    ("2.8 tokens/round, cycled", 4, {"seq": SEQ_2P8}, Pairing.TRAINED),
)


def _quiet(msg):
    pass


def device_of(model) -> str:
    be = model.be
    return getattr(be, "device_name", be.name)


def now() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


# ---- shapes: what a step reads and launches ---------------------------------------------------------
def config_of(preset: str):
    """The Config of a preset name ('tiny': the embedded model's config.json)."""
    if preset == "tiny":
        from kestrel import ASSETS
        from kestrel.config import load_config
        return load_config(ASSETS / "tiny")
    return PRESETS[preset]


def native_dtype(preset: str, dtype: str = "bf16") -> str:
    """The projection dtype a size runs in: the real shapes in `dtype`, the embedded and test
    models in fp32 (their own weights; bench_engine measures them the same way)."""
    return "fp32" if preset == "tiny" or preset.startswith("test-") else dtype


def weight_bytes(cfg, dtype: str) -> int:
    """Bytes one decode step must read: every main-model weight once (matrices in `dtype`,
    vectors fp32), the embedding only for its one looked-up row unless it is tied to the head."""
    total = 0
    for name, shape in expected_shapes(cfg).items():
        if name.startswith("mtp."):
            continue
        size = 2 if dtype == "bf16" and len(shape) == 2 else 4
        if name == "embed_tokens.weight" and not cfg.tie_word_embeddings:
            total += shape[1] * size
        else:
            total += math.prod(shape) * size
    return int(total)


def kernels_per_step(cfg) -> int:
    """Kernel launches of one decode step: one per op of the main program, two for a GDN layer
    (convolution, recurrence) and two for attention (append to the cache, decode), as the CUDA
    backend lowers it with stacked projections. On the CPU: the ops the NumPy twins run."""
    return sum(2 if op.kind in ("gdn", "attention") else 1 for op in main_program(cfg).ops)


def copy_ms(be, nbytes: int, reps: int, warm: int = 2) -> list:
    """ms of each of `reps` copies of an nbytes buffer (after `warm` untimed ones): on the GPU a
    device-to-device copy timed with the backend's events, on the CPU np.copyto."""
    ts = []
    if getattr(be, "name", "") == "cuda":
        import cupy as cp
        a = cp.ones(nbytes // 4, cp.float32)
        b = cp.empty_like(a)
        rt = cp.cuda.runtime
        for r in range(reps + warm):
            e0 = be.now()
            rt.memcpyAsync(b.data.ptr, a.data.ptr, nbytes, rt.memcpyDeviceToDevice, be.stream.ptr)
            e1 = be.now()
            if r >= warm:
                ts.append(be.elapsed_ms(e0, e1))
        del a, b
        cp.get_default_memory_pool().free_all_blocks()
    else:
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        for r in range(reps + warm):
            t0 = time.perf_counter()
            np.copyto(b, a)
            if r >= warm:
                ts.append((time.perf_counter() - t0) * 1e3)
    return ts


def read_ms(be, nbytes: int, reps: int, warm: int = 2, per_timing: int = 8) -> dict:
    """{shape: ms of one read, for each of `reps` timings} of one nbytes buffer (after `warm`
    untimed timings). On the GPU kernels/stream_read.cu in each of its shapes (kestrel.ops.
    stream_read.SHAPES): `per_timing` reads back to back between two of the backend's events,
    divided by per_timing, so that the host's time to submit the first launch (tens of µs from
    Python, a tenth of a 1 GiB read) is not counted as reading. On the CPU one NumPy
    XOR-reduction over the buffer's 64-bit words (one core), under the shape name "numpy"."""
    out = {}
    if getattr(be, "name", "") == "cuda":
        import cupy as cp
        from kestrel import nvrtc as L
        from kestrel.ops import stream_read
        sms = be.device_props["sm_count"]
        buf = cp.ones(nbytes // 4, cp.uint32)
        sink = stream_read.out_buffer(sms)
        for shape in stream_read.SHAPES:
            launch = stream_read.stream_read_launch(buf, sink, sms, shape)
            ts = []
            for r in range(reps + warm):
                e0 = be.now()
                for _ in range(per_timing):
                    L.go(launch, be.stream)
                e1 = be.now()
                if r >= warm:
                    ts.append(be.elapsed_ms(e0, e1) / per_timing)
            out[stream_read.shape_name(shape)] = ts
        del buf, sink
        cp.get_default_memory_pool().free_all_blocks()
    else:
        a = np.ones(nbytes // 8, np.uint64)
        ts = []
        for r in range(reps + warm):
            t0 = time.perf_counter()
            np.bitwise_xor.reduce(a)
            if r >= warm:
                ts.append((time.perf_counter() - t0) * 1e3)
        out["numpy"] = ts
    return out


def read_bandwidth(be, nbytes: int | None = None, reps: int = 10, warm: int = 2) -> dict:
    """The streaming-read bandwidth: bytes read once / time, the fastest shape's median of reps
    (read_ms). -> {"Bps", "bytes", "shape", "kind"}. The floor of a decode step is its weight
    bytes over this; a copy (copy_ms) reads and writes, so it gives a lower figure."""
    nbytes = nbytes or (1 << 30 if getattr(be, "name", "") == "cuda" else 1 << 27)
    med = {k: statistics.median(v) for k, v in read_ms(be, nbytes, reps, warm).items()}
    best = min(med, key=med.get)
    kind = "streaming read, kernels/stream_read.cu" if best != "numpy" else "NumPy XOR-reduction, one core"
    return {"Bps": nbytes / (med[best] * 1e-3), "bytes": nbytes, "shape": best, "kind": kind}


def roofline(cfg, *, dtype: str, bandwidth: float, launch_ms_per_kernel: float, units=None) -> dict:
    """The back-of-envelope cost of a decode step and of a verify of M rows.

    floor_ms  = weight bytes / bandwidth           (reading the weights once; any M <= a few;
                                                    bandwidth: read_bandwidth's, bytes read once)
    launch_ms = kernels per step x cost per kernel (paid once per call, whatever M is)
    bound     = 'bandwidth' where the floor is the larger term, else 'launch'
    With measured unit costs (spec.UnitCosts) it adds the measured step, verify_checkpointed(M),
    verify(M) / step and the measured extra cost of each row beyond the first (row_ms)."""
    wb = weight_bytes(cfg, dtype)
    n = kernels_per_step(cfg)
    floor = wb / bandwidth * 1e3
    launch = n * launch_ms_per_kernel
    out = {"weight_bytes": wb, "dtype": dtype, "bandwidth_Bps": bandwidth, "floor_ms": floor,
           "kernels_per_step": n, "launch_ms_per_kernel": launch_ms_per_kernel, "launch_ms": launch,
           "roof_step_ms": floor + launch, "bound": "bandwidth" if floor >= launch else "launch"}
    if units is not None:
        ms = dict(sorted(units.ckpt.items()))
        M = max(ms)
        out.update({"step_ms": units.step, "verify_ms": ms,
                    "verify_over_step": {m: v / units.step for m, v in ms.items()},
                    "row_ms": (ms[M] - ms[1]) / (M - 1) if M > 1 else 0.0,
                    "floor_share": floor / units.step, "draft_over_step": units.draft / units.step})
    return out


def launch_cost(sizes: list) -> float:
    """The fixed cost of one kernel, from measurements: per size, what its step costs beyond
    reading its weights, per kernel; the smallest of these, an upper bound on what every kernel
    pays (each size's figure also holds its kernels' own work beyond the weight reads)."""
    per = [max(s["units"]["step"] - s["floor_ms"], 0.0) / s["kernels_per_step"] for s in sizes]
    return min(per) if per else 0.0


# ---- where a size can run -----------------------------------------------------------------------------
def resident_bytes(preset: str, dtype: str = "bf16") -> int:
    """Bytes of a preset's weights in memory, MTP included (its projection dtype: native_dtype)."""
    return param_count(config_of(preset)) * (2 if native_dtype(preset, dtype) == "bf16" else 4)


def gpu_fits(presets, dtype: str = "bf16", headroom: float = HEADROOM) -> tuple:
    """(True, why) when this machine's backend is a CUDA GPU whose free memory holds the largest
    of `presets` (weights x headroom, one at a time), else (False, why)."""
    from kestrel.backend import cuda_available, get_backend
    if not cuda_available():
        return False, f"no CUDA GPU is visible here; the backend is {get_backend('cpu').device_name}"
    be = get_backend("auto")
    import cupy
    free, total = cupy.cuda.runtime.memGetInfo()
    need = max(resident_bytes(p, dtype) for p in presets) * headroom
    dev = getattr(be, "device_name", "the GPU")
    if free < need:
        return False, (f"{dev} has {free / 2**30:.0f} GiB free; the largest of {list(presets)} needs "
                       f"about {need / 2**30:.0f} GiB")
    return True, f"{dev} has {free / 2**30:.0f} GiB free of {total / 2**30:.0f} GiB"


def runnable(presets, device: str = "auto", dtype: str = "bf16") -> tuple:
    """(the presets this machine's backend runs, [(preset, why not)]): on a GPU, those whose
    weights fit its free memory; on the CPU, those with weights under CPU_WEIGHT_LIMIT."""
    from kestrel.backend import get_backend
    be = get_backend(device)
    ok, skipped = [], []
    free = None
    if getattr(be, "name", "") == "cuda":
        import cupy
        free = cupy.cuda.runtime.memGetInfo()[0]
    for p in presets:
        wb = resident_bytes(p, dtype)
        if free is not None and wb * HEADROOM > free:
            skipped.append((p, f"needs about {wb * HEADROOM / 2**30:.0f} GiB, {free / 2**30:.0f} GiB free"))
        elif free is None and wb > CPU_WEIGHT_LIMIT:
            skipped.append((p, f"{wb / 2**20:.0f} MiB of weights: too slow on the CPU"))
        else:
            ok.append(p)
    return ok, skipped


def free_device_memory():
    """Drop what the last model left on the GPU (the 27B weights are ~52 GB) before the next."""
    gc.collect()
    cp = sys.modules.get("cupy")
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()


# ---- one size, k = 1..4 --------------------------------------------------------------------------------
def over_repeats(sums: list) -> tuple:
    """One configuration run R times (a RunSummary each) -> (the index of the repeat with the
    median speedup, {the medians of ms_per_token and greedy_ms_per_token, speedup = greedy / spec
    of those medians (RunSummary.speedup's rule; it lies within the repeats' range), the ranges
    of ms/token and of the repeats' speedups, repeats, bit_exact over all of them})."""
    sp = [s.speedup for s in sums]
    ms = [s.ms_per_token for s in sums]
    mid = sorted(range(len(sums)), key=lambda i: sp[i])[(len(sums) - 1) // 2]
    g_med, ms_med = statistics.median(x.greedy_ms_per_token for x in sums), statistics.median(ms)
    return mid, {"ms_per_token": ms_med, "ms_per_token_range": [min(ms), max(ms)], "greedy_ms_per_token": g_med,
                 "speedup": g_med / ms_med, "speedup_range": [min(sp), max(sp)], "repeats": len(sums),
                 "bit_exact": all(x.bit_exact for x in sums)}


def _median_row(results_, units, **extra) -> dict:
    """One configuration run R times: over_repeats' medians and ranges; the rest (histogram,
    advance, the cost model's speedup) from the repeat with the median speedup."""
    sums = [r.summary() for r in results_]
    mid, stats = over_repeats(sums)
    s = sums[mid]
    return {**extra, "k": s.k, "policy": s.policy.name, "pairing": s.pairing.value, **stats,
            "predicted_speedup": compare(units, results_[mid])["predicted_speedup"],
            "advance_per_round": s.advance_per_round, "hist": {int(n): int(c) for n, c in s.hist.items()}}


def measure_size(model, *, ks=KS, policy="checkpoint", pairing="trained", profile=E16_PROFILE, T: int = 64,
                 P: int = 32, repeats: int = 1, reps: int = 5, seed: int = 0, log=_quiet) -> dict:
    """Greedy ms/token, unit costs and run_spec at every k for one loaded model: the replay
    drafter forces `profile` (seeded), greedy is timed in each call and is the reference."""
    from kestrel.speculative.driver import run_spec
    pol, pr = Policy.parse(policy), Pairing.parse(pairing)
    cfg = model.cfg
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, cfg.vocab_size, P)]
    max_seq = P + T + max(ks) + 4
    g_eng = Engine(model, max_seq=max_seq, mmax=1, batch="flex")
    greedy_timed(model, prompt, min(T, 8), engine=g_eng)               # warm-up: compile, capture
    ref, g_ms, _ = greedy_timed(model, prompt, T, engine=g_eng)
    units = measure_unit_costs(model, k_max=max(ks), ctx=P + T // 2, reps=reps)
    rows = []
    for k in ks:
        eng = Engine(model, max_seq=max_seq, mmax=k, batch=pol.batch)

        def sched():
            return Schedule(profile=profile, pairing=pr, seed=seed)
        warm = T       # the timed runs' very rounds, twice: every plan they use is lowered and captured first
        for _ in range(2):
            run_spec(model, prompt, warm, k, pol, "replay", schedule=sched(), reference=ref[:warm], greedy=False,
                     engine=eng)
        res = [run_spec(model, prompt, T, k, pol, "replay", schedule=sched(), reference=ref, greedy=True,
                        engine=eng, greedy_engine=g_eng) for _ in range(repeats)]
        row = _median_row(res, units)
        rows.append(row)
        log(f"  {cfg.name:13s} k={k}: {row['ms_per_token']:.3f} ms/token (greedy {row['greedy_ms_per_token']:.3f}) "
            f"speedup {row['speedup']:.3f}x, advance/round {row['advance_per_round']:.2f}, "
            f"bit-exact {row['bit_exact']}")
        del eng
    return {"model": cfg.name, "device": device_of(model), "weights": getattr(model, "weight_dtype", "fp32"),
            "params": param_count(cfg, mtp=False), "T": T, "P": P,
            "greedy_ms_per_token": g_ms / T, "units": units.to_dict(), "runs": rows}


def size_sweep(presets=SIZE_PRESETS, *, k=KS, policy="checkpoint", pairing="trained", profile=E16_PROFILE,
               T: int = 64, P: int = 32, device: str = "auto", dtype: str = "bf16", repeats: int = 1,
               reps: int = 5, bandwidth: float | None = None, log=_quiet) -> dict:
    """Every preset in turn (loaded with kestrel.load(name, device=, dtype=): the real shapes get
    seeded random weights, drawn on the GPU there; freed before the next): measure_size at
    k = 1..4 plus its roofline. -> a JSON-ready dict: {"device", "date", "ks", "policy",
    "pairing", "profile", "bandwidth_Bps", "launch_ms_per_kernel", "sizes": [...], "skipped"}.
    Each size: {"preset", "model", "weights", "params", "weight_bytes", "floor_ms",
    "kernels_per_step", "greedy_ms_per_token", "units", "runs": [one row per k], "roofline"}."""
    import kestrel
    from kestrel.backend import get_backend
    ks = (int(k),) if is_int(k) else tuple(k)
    be = get_backend(device)
    if bandwidth:
        bw, bw_kind = bandwidth, "given"
    else:
        rd = read_bandwidth(be)
        bw, bw_kind = rd["Bps"], rd["kind"]
    log(f"(d) sweep on {getattr(be, 'device_name', device)}: {list(presets)}, k={list(ks)}, {policy}, "
        f"{pairing} pairing, profile {profile}; read bandwidth {bw / 1e9:.0f} GB/s ({bw_kind})")
    sizes = []
    for name in presets:
        wd = native_dtype(name, dtype)
        cfg = config_of(name)
        t0 = time.time()
        model = kestrel.load(name, device=device, dtype=wd)
        s = measure_size(model, ks=ks, policy=policy, pairing=pairing, profile=profile, T=T, P=P,
                         repeats=repeats, reps=reps, log=log)
        del model
        free_device_memory()
        wb = weight_bytes(cfg, wd)
        sizes.append({"preset": name, **s, "weight_bytes": wb, "floor_ms": wb / bw * 1e3,
                      "kernels_per_step": kernels_per_step(cfg), "seconds": round(time.time() - t0, 1)})
    launch = launch_cost(sizes)
    from kestrel.speculative.units import UnitCosts
    for s in sizes:
        s["roofline"] = roofline(config_of(s["preset"]), dtype=native_dtype(s["preset"], dtype), bandwidth=bw,
                                 launch_ms_per_kernel=launch, units=UnitCosts.from_dict(s["units"]))
        r = s["roofline"]
        log(f"  {s['preset']:13s} floor {r['floor_ms']:.3f} ms + launches {r['launch_ms']:.3f} ms "
            f"({r['kernels_per_step']} x {launch * 1e3:.1f} us): {r['bound']}-bound; step {r['step_ms']:.3f} ms, "
            f"verify(4)/step {r['verify_over_step'][max(r['verify_over_step'])]:.2f}")
    return {"device": getattr(be, "device_name", device), "date": now(), "ks": list(ks),
            "policy": Policy.parse(policy).name, "pairing": Pairing.parse(pairing).value,
            "profile": list(profile), "T": T, "P": P, "repeats": repeats, "bandwidth_Bps": bw, "bandwidth_kind": bw_kind,
            "launch_ms_per_kernel": launch, "sizes": sizes, "skipped": []}


# ---- the 27B shape under every policy (scripts/bench_spec.py part (b)) ------------------------------------
def state_bytes_per_token(cfg, policy, result) -> dict:
    """The recurrent-state bytes the run's own rounds moved, per emitted token (from the config:
    Policy.state_traffic), and what the policy keeps beside the live state."""
    read = written = kept = 0
    for x in result.rounds:
        t = policy.state_traffic(cfg, x.k, x.n_ok)
        read, written, kept = read + t["read"], written + t["written"], max(kept, t["kept"])
    tok = max(1, sum(len(x.emitted) for x in result.rounds))
    return {"read": read / tok, "written": written / tok, "kept": kept}


def summary_of(results_, units, schedule: str | None = None):
    """The runs' RunSummary, with the cost model priced for their own rounds."""
    import dataclasses
    c = compare(units, results_)
    s = aggregate(results_)
    return dataclasses.replace(s, schedule=schedule, predicted_ms_per_token=c["predicted_ms_per_token"],
                               predicted_speedup=c["predicted_speedup"],
                               predicted_phase_ms_per_token={ph: v / s.T for ph, v in c["predicted_phase_ms"].items()})


def plan_work(be) -> int:
    """Plans lowered plus graphs captured so far by a backend that caches plans (0 elsewhere).
    A timed run that raises it paid for an eager run and a capture, not only for decoding."""
    st = getattr(be, "stats", None) or {}
    return int(st.get("plans_lowered", 0)) + int(st.get("graphs_captured", 0))


def large_runs(model, *, T: int = 64, P: int = 32, schedules=LARGE_SCHEDULES, repeats: int = 3, reps: int = 7,
               seed: int = 0, log=_quiet) -> dict:
    """The replay drafter at one (large) shape: every schedule x every policy, each run `repeats`
    times with greedy timed in the same call. -> the "large" section of results/bench_spec.json:
    per run the RunSummary's dict of the repeat with the median speedup (phases, log, histogram,
    the cost model beside it) with ms_per_token and greedy_ms_per_token replaced by their medians
    over the repeats, speedup by greedy / spec of those medians, and ms_per_token_range,
    speedup_range (min, max over the repeats) added."""
    from kestrel.speculative.driver import run_spec
    cfg = model.cfg
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, cfg.vocab_size, P)]
    log(f"(b) {model!r} ({model.source}, weights {getattr(model, 'weight_dtype', '?')}): P={P}, T={T}, "
        f"{repeats} repeat(s); GDN state {cfg.gdn_state_bytes / 1e6:.1f} MB + conv {cfg.conv_state_bytes / 1e6:.2f} MB "
        f"per mark/rollback copy")
    t0 = time.time()
    g_eng = Engine(model, max_seq=P + T + 8, mmax=1, batch="flex")
    greedy_timed(model, prompt, min(T, 8), engine=g_eng)                          # warm-up: compile, capture
    ref, g_ms, _ = greedy_timed(model, prompt, T, engine=g_eng)
    log(f"  greedy: {g_ms / T:.3f} ms/token (reference stream; {time.time() - t0:.1f} s incl. warm-up)")
    units = measure_unit_costs(model, k_max=4, ctx=P + T // 2, reps=reps)
    engines = {(b, k): Engine(model, max_seq=P + T + 8, mmax=k, batch=b)
               for b in ("strict", "flex") for k in sorted({s[1] for s in schedules})}
    # warm-up: each run twice, in full, so that every plan the timed runs use (each width of a
    # verify, replay, fold and fill that their rounds reach) is lowered (first use) and captured
    # (second use) before any timing; a 16-token warm-up left some widths to the timed runs
    warm = T
    for policy in [*POLICIES.values()] * 2:
        for _, k, src, pairing in schedules:
            run_spec(model, prompt, warm, k, policy, "replay", schedule=Schedule(**src, pairing=pairing),
                     reference=ref[:warm], greedy=False, engine=engines[policy.batch, k])
    rows = []
    for sname, k, src, pairing in schedules:
        for policy in POLICIES.values():
            w0 = plan_work(model.be)
            res = [run_spec(model, prompt, T, k, policy, "replay", schedule=Schedule(**src, pairing=pairing),
                            reference=ref, greedy=True, engine=engines[policy.batch, k], greedy_engine=g_eng)
                   for _ in range(repeats)]
            lowered = plan_work(model.be) - w0
            sums = [summary_of([r], units, sname) for r in res]
            mid, stats = over_repeats(sums)
            s = sums[mid]
            row = {**s.to_dict(), "log": s.log_lines(),
                   "predicted_from_schedule": predict(units, policy, pairing, k, **src).to_dict(),
                   "state_bytes_per_token": state_bytes_per_token(cfg, policy, res[mid]),
                   "plans_lowered_or_captured_while_timed": lowered, **stats}
            rows.append(row)
            (m0, m1), (s0, s1) = row["ms_per_token_range"], row["speedup_range"]
            log(f"  {sname:17s} pairing={pairing.value:7s} {policy.name:11s}: {row['ms_per_token']:.3f} ms/token "
                f"({m0:.3f}..{m1:.3f}; greedy {row['greedy_ms_per_token']:.3f}) speedup "
                f"{row['speedup']:.3f}x ({s0:.3f}..{s1:.3f}) | predicted {s.predicted_speedup:.3f}x; "
                f"bit-exact {row['bit_exact']}" + (f"; {lowered} plans lowered or captured while timed" if lowered else ""))
    del engines, g_eng
    return {"model": cfg.name, "source": results.repo_relative(model.source),
            "weights": getattr(model, "weight_dtype", "?"), "device": device_of(model), "P": P, "T": T,
            "repeats": repeats, "gdn_state_bytes": cfg.gdn_state_bytes, "conv_state_bytes": cfg.conv_state_bytes,
            "greedy_ms_per_token": g_ms / T, "units": units.to_dict(), "runs": rows}


# ---- for the book: live where the GPU holds it, else the results file ------------------------------------
class Section:
    """A results section and where it came from: `data` in results/bench_spec.json's format,
    `live` (measured just now), `why` (what decided it), `prov` (device, date, command: for
    kestrel.lab.results.provenance and annotate) and `source`, one line that says all of it."""

    def __init__(self, data: dict, live: bool, why: str, prov: dict, note: str = ""):
        self.data, self.live, self.why, self.prov, self.note = data, live, why, prov, note

    @property
    def source(self) -> str:
        p = self.prov
        if self.live:
            line = f"measured live here, on {p['device']} at {p['date']} (`{p['command']}`); {self.why}"
        else:
            line = f"read from results/bench_spec.json: {results.provenance(p)}; {self.why}"
        return line + (f"; {self.note}" if self.note else "")


def _recorded(section: str):
    """(bench_spec.json's section, its provenance dict) or (None, None)."""
    try:
        d = results.load("bench_spec")
    except FileNotFoundError:
        return None, None
    sec = d.get(section)
    if not sec:
        return None, None
    return sec, {**d, "device": sec.get("device", d.get("device"))}


def _live_prov(device: str, what: str) -> dict:
    return {"device": device, "date": now(), "command": what}


def size_section(live: bool | None = None, *, presets=SIZE_PRESETS, T: int = 64, P: int = 32,
                 repeats: int = 1, fallback_T: int = 16, log=_quiet) -> Section:
    """The size sweep: live when a CUDA GPU holds the largest preset (live=None decides), else
    results/bench_spec.json's "sweep" section; if that file has none yet, the sweep runs here,
    on this machine's backend, for the presets it can run (T=fallback_T), and says so."""
    ok, why = gpu_fits(presets)
    if live is None:
        live = ok
    if live:
        d = size_sweep(presets, T=T, P=P, device="cuda", repeats=repeats, log=log)
        return Section(d, True, why, _live_prov(d["device"], "kestrel.lab.sweep.size_sweep"))
    sec, prov = _recorded("sweep")
    if sec is not None:
        return Section(sec, False, why, prov)
    here, skipped = runnable(presets + tuple(p for p in QUICK_PRESETS if p not in presets))
    d = size_sweep(here, T=fallback_T, P=min(P, 16), repeats=repeats, log=log)
    d["skipped"] = [{"preset": p, "why": w} for p, w in skipped]
    note = (f"results/bench_spec.json has no sweep yet, so it ran on this machine for "
            f"{', '.join(here)} (T = {fallback_T})")
    return Section(d, True, why, _live_prov(d["device"], "kestrel.lab.sweep.size_sweep"), note)


def large_section(live: bool | None = None, *, preset: str = LARGE, T: int = 64, P: int = 32, repeats: int = 3,
                  log=_quiet) -> Section:
    """The 27B runs of scripts/bench_spec.py part (b): live (random bf16 weights, the same
    large_runs) when a CUDA GPU holds the shape (live=None decides), else the results file."""
    ok, why = gpu_fits([preset])
    if live is None:
        live = ok
    if live:
        import kestrel
        model = kestrel.load(preset, device="cuda", dtype="bf16")
        d = large_runs(model, T=T, P=P, repeats=repeats, log=log)
        del model
        free_device_memory()
        return Section(d, True, why, _live_prov(d["device"], "kestrel.lab.sweep.large_runs"))
    sec, prov = _recorded("large")
    if sec is None:
        raise FileNotFoundError("results/bench_spec.json has no 'large' section and no GPU here holds "
                                f"{preset}: run scripts/bench_spec.py on a GPU")
    return Section(sec, False, why, prov)


# ---- reading a sweep --------------------------------------------------------------------------------------
def rows(sweep: dict) -> list:
    """Every run of a sweep as one flat row: the size's preset, weight bytes and bound beside it."""
    return [{"preset": s["preset"], "weight_bytes": s["weight_bytes"], "bound": s["roofline"]["bound"], **r}
            for s in sweep["sizes"] for r in s["runs"]]


def beats_greedy(sweep: dict) -> dict:
    """preset -> the best k's row if any k beat greedy (speedup > 1, of the repeats' medians), else None."""
    out = {}
    for s in sweep["sizes"]:
        best = max(s["runs"], key=lambda r: r["speedup"])
        out[s["preset"]] = best if best["speedup"] > 1 else None
    return out


__all__ = ["SIZE_PRESETS", "QUICK_PRESETS", "KS", "LARGE", "LARGE_SCHEDULES", "ALPHA_2P8", "size_sweep",
           "measure_size", "roofline", "weight_bytes", "kernels_per_step", "copy_ms", "read_ms", "read_bandwidth",
           "launch_cost",
           "over_repeats", "resident_bytes",
           "gpu_fits", "runnable", "large_runs", "summary_of", "state_bytes_per_token", "Section",
           "size_section", "large_section", "rows", "beats_greedy", "config_of", "native_dtype"]
