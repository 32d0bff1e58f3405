"""The kernel and engine benchmarks' results files as typed records (scripts/bench_engine.py,
bench_projections.py, bench_gdn.py, bench_host.py, compare_bench.py); see kestrel.lab.records."""
from __future__ import annotations

from dataclasses import dataclass

from .checks import Field, ResultsFileError
from .records import Provenance, read_provenance


@dataclass(frozen=True)
class DeviceProps:
    name: str
    memory_bytes: int


def read_props(f: Field, device: str) -> DeviceProps | None:
    if not f.has("device_props"):
        return None
    g = f["device_props"]
    return DeviceProps(g.opt("name", "str") or device, g["memory_bytes"].int(1))


# ---- scripts/bench_engine.py -------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """mark() and rollback() of the whole recurrent state at one shape."""
    ms: float
    rollback_ms: float
    bytes_S: int                      # the GDN states
    bytes_hist: int                   # the convolution windows
    floor_ms: float                   # those bytes at the copy bandwidth

    @property
    def state_bytes(self) -> int:
        return self.bytes_S + self.bytes_hist


@dataclass(frozen=True)
class EnginePreset:
    """One shape's engine numbers (ms); tables are M -> value."""
    preset: str
    dtype: str
    greedy_ms: float
    floor_bytes: int
    floor_ms: float                   # the weights at the copy bandwidth
    mark: Mark
    step_m_ms: dict
    step_m_over_step: dict
    verify_ckpt_ms: dict
    verify_ckpt_over_step: dict
    mtp_step_ms: float
    read_floor_ms: float | None = None    # the weights at the streaming-read bandwidth (newer files)
    verify_cached_ms: dict | None = None
    replay_step_ms: float | None = None   # one graph-replayed step
    eager_greedy_ms: float | None = None


def read_engine_preset(f: Field) -> EnginePreset:
    m = f["mark"]
    replay = f["replay_ms"].opt("step1", "num") if f.has("replay_ms") else None
    return EnginePreset(
        f["preset"].str(), f["dtype"].str(), f["greedy_ms"].num(), f["floor_bytes"].int(), f["floor_ms"].num(),
        Mark(m["ms"].num(), m["rollback_ms"].num(), m["bytes_S"].int(), m["bytes_hist"].int(), m["floor_ms"].num()),
        f["step_m_ms"].table(), f["step_m_over_step"].table(), f["verify_ckpt_ms"].table(),
        f["verify_ckpt_over_step"].table(), f["mtp_step_ms"].num(), f.opt("read_floor_ms", "num"),
        f.opt("verify_cached_ms", "table"), replay, f.opt("eager_greedy_ms", "num"))


@dataclass(frozen=True)
class EngineFile:
    """results/bench_engine*.json: per shape, greedy, the batch tables, mark/rollback; the
    device's copy (read + write) and streaming-read bandwidths."""
    provenance: Provenance
    path: str
    device_props: DeviceProps | None
    presets: tuple                    # EnginePreset (shapes that failed are left out)
    failed: tuple                     # (preset, error) of the shapes that failed
    copy_GBps: float                  # bytes read + written per second, / 1e9
    read_GBps: float | None = None    # a pure streaming read (newer files)

    def preset(self, name: str) -> EnginePreset:
        for p in self.presets:
            if p.preset == name:
                return p
        raise ResultsFileError(f"{self.path}: presets: no preset {name!r} (has {[p.preset for p in self.presets]})")


def read_engine_file(f: Field, path: str) -> EngineFile:
    prov = read_provenance(f)
    ok, failed = [], []
    for p in f["presets"].items():
        if p.has("error"):
            failed.append((p["preset"].str(), p["error"].str()))
        else:
            ok.append(read_engine_preset(p))
    read = f["read"]["GBps"].num() if f.has("read") else None
    return EngineFile(prov, path, read_props(f, prov.device), tuple(ok), tuple(failed),
                      f["copy"]["GBps_read_plus_write"].num(), read)


# ---- dev/bench_projections.py --------------------------------------------------------------------
@dataclass(frozen=True)
class ProjectionShape:
    shape: str                        # the projection's label (kestrel.lab.sizes.PROJECTIONS)
    N: int
    K: int
    weight_bytes: int
    us: dict                          # M -> {kernel: microseconds (median)}


@dataclass(frozen=True)
class ProjectionsFile:
    """results/bench_projections*.json: each projection of a 27B step, per kernel and rows M."""
    provenance: Provenance
    path: str
    engine_gemv: str                  # the bf16 GEMV the engine ran
    shapes: tuple                     # ProjectionShape (shapes that failed are left out)
    read_GBps: float


def read_projections_file(f: Field, path: str) -> ProjectionsFile:
    shapes = []
    for s in f["shapes"].items():
        if s.has("error"):
            continue
        us = {}
        for M, kernels in s["times"].entries():
            if not M.isdigit():
                kernels.fail("timings keyed by rows M")
            us[int(M)] = {name: t["us"].num() for name, t in kernels.entries()}
        shapes.append(ProjectionShape(s["shape"].str(), s["N"].int(1), s["K"].int(1), s["weight_bytes"].int(), us))
    return ProjectionsFile(read_provenance(f), path, f["engine_bf16_gemv"].str(), tuple(shapes),
                           f["read_bandwidth"]["GBps"].num())


# ---- scripts/bench_gdn.py ----------------------------------------------------------------------------
@dataclass(frozen=True)
class GdnPreset:
    preset: str
    layers: int
    state_bytes: int
    variants: tuple
    bit_identical: dict               # variant -> matched gdn_recur bit for bit
    us: dict                          # "variant/mode/M" -> microseconds per layer call


@dataclass(frozen=True)
class GdnFile:
    """results/bench_gdn.json: the GDN recurrence kernels per mode and rows M."""
    provenance: Provenance
    path: str
    ms: tuple
    modes: tuple
    presets: tuple


def read_gdn_file(f: Field, path: str) -> GdnFile:
    presets = tuple(GdnPreset(p["preset"].str(), p["layers"].int(1), p["state_bytes"].int(),
                              tuple(v.str() for v in p["variants"].items()),
                              {k: v.bool() for k, v in p["bit_identical"].entries()},
                              {k: v.num() for k, v in p["us"].entries()}) for p in f["presets"].items())
    return GdnFile(read_provenance(f), path, tuple(m.int(1) for m in f["ms"].items()),
                   tuple(m.str() for m in f["modes"].items()), presets)


# ---- scripts/bench_host.py ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProfileRow:
    function: str
    calls_per_step: float
    own_ms_per_step: float
    cum_ms_per_step: float


@dataclass(frozen=True)
class HostFile:
    """results/bench_host*.json: a draft round's device and host times, and its profile."""
    provenance: Provenance
    path: str
    model: str
    k: int
    device_ms: dict
    host_ms: dict
    profile: tuple                    # ProfileRow


def read_host_file(f: Field, path: str) -> HostFile:
    prof = tuple(ProfileRow(r["function"].str(), r["calls_per_step"].num(), r["own_ms_per_step"].num(),
                            r["cum_ms_per_step"].num()) for r in f["profile"].items())
    return HostFile(read_provenance(f), path, f["model"].str(), f["k"].int(1),
                    {k: v.num() for k, v in f["device_ms"].entries()},
                    {k: v.num() for k, v in f["host_ms"].entries()}, prof)


# ---- scripts/compare_bench.py ------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """Two engine benchmarks of one session: per preset, quantity -> (before, after)."""
    provenance: Provenance            # date: the later run's
    path: str
    date_before: str
    labels: tuple
    presets: dict


def read_comparison_file(f: Field, path: str) -> Comparison:
    labels = tuple(x.str() for x in f["labels"].items())
    if len(labels) != 2:
        f["labels"].fail("two labels, [before, after]")
    presets = {name: {q: (v["before"].num(), v["after"].num()) for q, v in rows.entries()}
               for name, rows in f["presets"].entries()}
    return Comparison(read_provenance(f, "date_after"), path, f["date_before"].str(), labels, presets)


# ---- scripts/bench_adaptive.py -----------------------------------------------------------------------
@dataclass(frozen=True)
class AdaptiveRun:
    """One mode of one case: greedy, a fixed k, or k = "auto" (with the k it took each round)."""
    mode: str                         # "greedy" | "k=2" ... | "auto"
    ms_per_token: float               # median over the repeats
    speedup: float                    # greedy's median / this one's
    bit_exact: bool
    k_per_round: tuple = ()           # auto: the k of each round, 0 a plain step (the median repeat's)


@dataclass(frozen=True)
class AdaptiveCase:
    name: str
    model: str
    what: str                         # what drives acceptance: the schedule or the drafter
    T: int
    runs: tuple
    seeds: int = 1                    # draws of a random profile, each mode's ms/token their mean

    def run(self, mode: str) -> AdaptiveRun:
        return next(r for r in self.runs if r.mode == mode)

    def best_fixed(self) -> AdaptiveRun:
        return min((r for r in self.runs if r.mode.startswith("k=")), key=lambda r: r.ms_per_token)


@dataclass(frozen=True)
class AdaptiveFile:
    provenance: Provenance
    path: str
    repeats: int
    cases: tuple


def read_adaptive_file(f: Field, path: str) -> AdaptiveFile:
    cases = []
    for c in f["cases"].items():
        runs = tuple(AdaptiveRun(r["mode"].str(), r["ms_per_token"].num(), r["speedup"].num(), r["bit_exact"].bool(),
                                 tuple(x.int(0) for x in r["k_per_round"].items()) if r.has("k_per_round") else ())
                     for r in c["runs"].items())
        cases.append(AdaptiveCase(c["name"].str(), c["model"].str(), c["what"].str(), c["T"].int(1), runs,
                                  c["seeds"].int(1) if c.has("seeds") else 1))
    return AdaptiveFile(read_provenance(f), path, f["repeats"].int(1), tuple(cases))


@dataclass(frozen=True)
class PeerRow:
    """One decoder setting of scripts/bench_peer.py: kestrel's or the peer's, its ms per token (None
    where the setting did not run, with the reason in error)."""
    decoder: str                      # "kestrel" | "transformers"
    setting: str
    ms_per_token: float | None
    error: str = ""
    bit_exact: bool | None = None     # kestrel's speculative rows


@dataclass(frozen=True)
class PeerFile:
    provenance: Provenance
    path: str
    model: str
    T: int
    rows: tuple
    notes: tuple

    @property
    def kestrel_greedy(self) -> PeerRow:
        return self.rows[0]

    def peer_best(self) -> PeerRow | None:
        """The peer's fastest setting that ran (None if none did)."""
        ran = [r for r in self.rows if r.decoder != "kestrel" and r.ms_per_token is not None]
        return min(ran, key=lambda r: r.ms_per_token) if ran else None


def read_peer_file(f: Field, path: str) -> PeerFile:
    rows = tuple(PeerRow(r["decoder"].str(), r["setting"].str(),
                         r["ms_per_token"].num() if r.has("ms_per_token") else None,
                         r["error"].str() if r.has("error") else "",
                         r["bit_exact"].bool() if r.has("bit_exact") else None) for r in f["rows"].items())
    if (not rows or rows[0].decoder != "kestrel" or not rows[0].setting.startswith("greedy")
            or rows[0].ms_per_token is None):
        raise ResultsFileError(f"{path}: the first row must be kestrel's greedy decoding, measured")
    return PeerFile(read_provenance(f), path, f["model"].str(), f["T"].int(1), rows,
                    tuple(n.str() for n in f["notes"].items()))


# ---- scripts/bench_batch.py --------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchRow:
    """One (B, mode, k) run of kestrel.lab.batching.sweep: mode is "greedy" (k = 0) or an undo policy."""
    B: int
    mode: str
    k: int
    tokens_per_s: float               # the whole batch
    ms_per_token: float               # one sequence's time per output token (= the pass time for greedy)
    speedup: float                    # greedy's batch time at the same B over this run's
    bit_exact: bool
    moved_per_round: float | None     # recurrent-state bytes a sequence moves per round (None for greedy)
    held_bytes: int                   # recurrent-state bytes all B sequences hold
    passes: int
    tokens_per_round: float = 1.0
    plans_made: int | None = None     # plans lowered or graphs captured while timed (a GPU; None: not recorded)


@dataclass(frozen=True)
class BatchFloor:
    """One pass's weight bytes at the streaming-read bandwidth measured in the same run."""
    weight_bytes: int
    Bps: float
    kind: str
    ms: float


@dataclass(frozen=True)
class BatchPasses:
    """One round's passes at batch size B, each timed alone (kestrel.lab.batching.unit_costs), ms:
    a greedy pass, the checkpointed verify and select[n], the cached verify and fold[n]."""
    B: int
    k: int
    step: float
    verify_ckpt: float
    select: dict
    verify_cached: float
    fold: dict

    @classmethod
    def of(cls, u: dict) -> "BatchPasses":
        """From unit_costs' dict (n keyed by int, as measured, or by str, as a file holds it; unchecked:
        files go through read_batch_file)."""
        return cls(u["B"], u["k"], u["step"], u["verify_ckpt"], {int(n): v for n, v in u["select"].items()},
                   u["verify_cached"], {int(n): v for n, v in u["fold"].items()})

    def checkpointed_round(self, n: int) -> float:
        return self.verify_ckpt + self.select[n]

    def cached_round(self, n: int) -> float:
        return self.verify_cached + self.fold[n]


@dataclass(frozen=True)
class BatchFile:
    provenance: Provenance
    path: str
    model: str
    weights: str
    T: int
    profile: tuple
    pairing: str
    rows: tuple
    floor: BatchFloor | None
    passes: tuple = ()                # BatchPasses per B (files of runs that timed them)
    did_not_fit: tuple = ()           # (B, mode, k, error) of runs whose engine did not fit in memory
    partial: bool = False             # the run stopped before it finished (the file is written after each B)

    def greedy(self) -> dict:
        """B -> the greedy row."""
        return {r.B: r for r in self.rows if r.mode == "greedy"}

    def row(self, B: int, mode: str, k: int = 0) -> BatchRow:
        return next(r for r in self.rows if (r.B, r.mode, r.k) == (B, mode, k))

    def largest_policy_B(self) -> int:
        """The largest B an undo policy ran at (greedy may have run wider)."""
        return max(r.B for r in self.rows if r.mode != "greedy")

    def cached_over_checkpointed(self, B: int, k: int = 3) -> float:
        """The input cache's tokens/s over per-row checkpoints' at (B, k)."""
        return self.row(B, "input-cache", k).tokens_per_s / self.row(B, "checkpoint", k).tokens_per_s


BATCH_MODES = ("greedy", "replay", "flex-replay", "checkpoint", "input-cache")   # a row's mode


def read_batch_file(f: Field, path: str) -> BatchFile:
    rows = []
    for r in f["rows"].items():
        mode = r["mode"].one_of(BATCH_MODES)
        rows.append(BatchRow(r["B"].int(1), mode, r["k"].int(0), r["tokens_per_s"].num(), r["ms_per_token"].num(),
                             r["speedup"].num(), r["bit_exact"].bool(),
                             r["moved_per_round"].num() if r.has("moved_per_round") else None,
                             r["held_bytes"].int(0), r["passes"].int(1),
                             r["tokens_per_round"].num() if r.has("tokens_per_round") else 1.0,
                             r.opt("plans_lowered_or_captured_while_timed", "int")))
    if not any(r.mode == "greedy" for r in rows):
        raise ResultsFileError(f"{path}: rows: no greedy row (every speedup is against one)")
    floor = None
    if f.has("floor"):
        g = f["floor"]
        floor = BatchFloor(g["weight_bytes"].int(1), g["Bps"].num(), g["kind"].str(), g["ms"].num())
    passes = []
    if f.has("unit_costs"):
        for u in f["unit_costs"].items():
            k = u["k"].int(1)
            sel, fold = u["select"].table(), u["fold"].table()
            if sorted(sel) != list(range(1, k + 1)) or sorted(fold) != list(range(1, k + 1)):
                raise ResultsFileError(f"{path}: unit_costs: select and fold are timed for n = 1..{k}")
            passes.append(BatchPasses(u["B"].int(1), k, u["step"].num(), u["verify_ckpt"].num(), sel,
                                      u["verify_cached"].num(), fold))
    unfit = tuple((u["B"].int(1), u["mode"].one_of(BATCH_MODES), u["k"].int(0), u["error"].str())
                  for u in f["did_not_fit"].items()) if f.has("did_not_fit") else ()
    return BatchFile(read_provenance(f), path, f["model"].str(), f.opt("weights", "str") or "fp32", f["T"].int(1),
                     f["profile"].numbers(), f["pairing"].str(), tuple(rows), floor, tuple(passes), unfit,
                     f["partial"].bool() if f.has("partial") else False)
