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
both terms per size (kestrel/lab/roofline.py): `floor_ms` and `launch_ms`, and the larger one names the
regime.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, replace
import time

import numpy as np

from . import results
from .roofline import (config_of, copy_ms, device_of, free_device_memory, gpu_fits, kernels_per_step, launch_cost,
                       native_dtype, now, read_bandwidth, read_ms, resident_bytes, roofline, runnable, weight_bytes)
from kestrel.engine import Engine
from kestrel.inputs import is_int
from kestrel.program import param_count
from kestrel.speculative.baseline import greedy_timed
from kestrel.speculative.cost import compare, predict
from kestrel.speculative.pairing import Pairing
from kestrel.speculative.policy import POLICIES, Policy
from kestrel.speculative.records import aggregate
from kestrel.speculative.schedule import ARTICLE_HIST, E16_PROFILE, Schedule
from kestrel.speculative.units import measure_unit_costs, UnitCosts
from kestrel.speculative.driver import run_spec
import kestrel
from kestrel.backend import get_backend

SIZE_PRESETS = ("tiny", "qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b")
QUICK_PRESETS = ("test-a", "test-b")          # CPU stand-ins: the same code path in seconds
LARGE = "qwen3.5-27b"
KS = (1, 2, 3, 4)
ALPHA_2P8 = 0.7655      # flat per-depth acceptance with 1 + a + a^2 + a^3 = 2.8 (trained pairing, k = 4)
# n_ok round by round, cycled: 2.8 tokens a round over each 5-round cycle (a 64-token run, whose
# last round is shrunk, advances 2.78); the profile above gives 2.8 only in expectation (its
# seeded draw over a 64-token run advanced 2.46 a round on 2026-12-02)
SEQ_2P8 = (4, 2, 4, 1, 3)
ALPHA_3P39 = 0.8903      # flat per-depth acceptance with 1 + a + a^2 + a^3 = 3.39 (trained pairing, k = 4)

# (name, k, what the replay drafter replays, pairing): scripts/bench_spec.py part (b)
LARGE_SCHEDULES = (
    *[("article histogram", k, {"hist": ARTICLE_HIST}, Pairing.ARTICLE) for k in (3, 4)],
    *[("E16 profile", k, {"profile": E16_PROFILE}, pr) for pr in Pairing for k in (2, 3, 4)],
    ("2.8 tokens/round", 4, {"profile": (ALPHA_2P8,) * 4}, Pairing.TRAINED),
    ("2.8 tokens/round, cycled", 4, {"seq": SEQ_2P8}, Pairing.TRAINED),
)


def _quiet(msg):
    pass


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
    times with greedy timed in the same call. -> the "large" section of a bench_spec results file:
    per run the RunSummary's dict of the repeat with the median speedup (phases, log, histogram,
    the cost model beside it) with ms_per_token and greedy_ms_per_token replaced by their medians
    over the repeats, speedup by greedy / spec of those medians, and ms_per_token_range,
    speedup_range (min, max over the repeats) added."""
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
    """A results section and where it came from: `data`, the record (results.SpecSection for the
    27B runs, records.Sweep for the size sweep) whether measured just now or read from a results
    file of scripts/bench_spec.py, `live`, `why` (what decided it), `prov` (a results.Provenance,
    for results.annotate), `file` (the results file read, None when live) and `source`, one line
    that says all of it."""

    def __init__(self, data, live: bool, why: str, prov: results.Provenance, note: str = "",
                 file: str | None = None):
        self.data, self.live, self.why, self.prov, self.note, self.file = data, live, why, prov, note, file

    @property
    def source(self) -> str:
        p = self.prov
        if self.live:
            line = f"measured live here, on {p.device} at {p.date} (`{p.command}`); {self.why}"
        else:
            line = f"read from results/{self.file}.json: {p.line()}; {self.why}"
        return line + (f"; {self.note}" if self.note else "")


def recorded_files() -> tuple:
    """The results files a recorded section is read from, in order: the default engine's
    (results.of_default_engine), then the CUDA-core GEMV's (bench_spec), for a section the
    first lacks (its size sweep was not re-run under the default engine)."""
    return tuple(dict.fromkeys((results.of_default_engine("bench_spec"), "bench_spec")))


def _recorded(section: str, why: str) -> Section | None:
    """The Section of the first of recorded_files() that has `section` ('large' or 'sweep'),
    its note saying when that is not the default engine's file; None where no file has it (a
    damaged file raises results.ResultsFileError)."""
    files = recorded_files()
    for name in files:
        if not results.path_of(name).exists():
            continue
        f = results.load_spec(name)
        rec = getattr(f, section)
        if rec is None:
            continue
        prov = replace(f.provenance, device=rec.device) if section == "sweep" else rec.provenance
        note = "" if name == files[0] else (f"results/{files[0]}.json (the default engine's) has no "
                                            f"{'size sweep' if section == 'sweep' else section + ' section'}, "
                                            f"so this one is the CUDA-core GEMV's (fma)")
        return Section(rec, False, why, prov, note, name)
    return None


def _live_prov(device: str, what: str) -> results.Provenance:
    return results.Provenance(device, now(), what)


def size_section(live: bool | None = None, *, presets=SIZE_PRESETS, T: int = 64, P: int = 32,
                 repeats: int = 1, fallback_T: int = 16, log=_quiet) -> Section:
    """The size sweep: live when a CUDA GPU holds the largest preset (live=None decides), else
    the "sweep" section of the first of recorded_files() that has one; if none has, it runs here,
    on this machine's backend, for the presets it can run (T=fallback_T), and says so."""
    ok, why = gpu_fits(presets)
    if live is None:
        live = ok
    if live:
        d = size_sweep(presets, T=T, P=P, device="cuda", repeats=repeats, log=log)
        return Section(results.live_sweep(d), True, why, _live_prov(d["device"], "kestrel.lab.sweep.size_sweep"))
    rec = _recorded("sweep", why)
    if rec is not None:
        return rec
    here, skipped = runnable(presets + tuple(p for p in QUICK_PRESETS if p not in presets))
    d = size_sweep(here, T=fallback_T, P=min(P, 16), repeats=repeats, log=log)
    d["skipped"] = [{"preset": p, "why": w} for p, w in skipped]
    note = (f"no results file of {', '.join(recorded_files())} has a sweep yet, so it ran on this machine for "
            f"{', '.join(here)} (T = {fallback_T})")
    return Section(results.live_sweep(d), True, why, _live_prov(d["device"], "kestrel.lab.sweep.size_sweep"), note)


def large_section(live: bool | None = None, *, preset: str = LARGE, T: int = 64, P: int = 32, repeats: int = 3,
                  schedules=LARGE_SCHEDULES, log=_quiet) -> Section:
    """The 27B runs of scripts/bench_spec.py part (b): live (random bf16 weights, the same
    large_runs, over `schedules`, a part of LARGE_SCHEDULES) when a CUDA GPU holds the shape
    (live=None decides), else the results file (which holds every schedule)."""
    ok, why = gpu_fits([preset])
    if live is None:
        live = ok
    if live:
        model = kestrel.load(preset, device="cuda", dtype="bf16")
        d = large_runs(model, T=T, P=P, schedules=schedules, repeats=repeats, log=log)
        del model
        free_device_memory()
        prov = _live_prov(d["device"], "kestrel.lab.sweep.large_runs")
        return Section(results.live_section(d, "large", prov), True, why, prov)
    rec = _recorded("large", why)
    if rec is None:
        raise results.ResultsFileError(f"no results file of {', '.join(recorded_files())} has a 'large' section "
                                       f"and no GPU here holds {preset}: run scripts/bench_spec.py on a GPU")
    return rec


# ---- reading a sweep --------------------------------------------------------------------------------------
def rows(sweep) -> list:
    """Every run of a sweep (a records.Sweep) as one flat row: the size's preset, weight bytes and
    bound beside the run's fields (records.SweepRun)."""
    return [{"preset": s.preset, "weight_bytes": s.weight_bytes, "bound": s.roofline.bound, **asdict(r)}
            for s in sweep.sizes for r in s.runs]


def beats_greedy(sweep) -> dict:
    """preset -> the best k's run (a records.SweepRun) if any k beat greedy (speedup > 1, of the
    repeats' medians), else None."""
    return sweep.best()


__all__ = ["SIZE_PRESETS", "QUICK_PRESETS", "KS", "LARGE", "LARGE_SCHEDULES", "ALPHA_2P8", "size_sweep",
           "measure_size", "roofline", "weight_bytes", "kernels_per_step", "copy_ms", "read_ms", "read_bandwidth",
           "launch_cost",
           "over_repeats", "resident_bytes",
           "gpu_fits", "runnable", "large_runs", "summary_of", "state_bytes_per_token", "Section",
           "size_section", "large_section", "rows", "beats_greedy", "config_of", "native_dtype"]
