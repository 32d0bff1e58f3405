"""The results files as typed records: what each benchmark script writes, read field by field
(kestrel.lab.checks), so that a figure or widget only ever sees values of the kind it expects.

A record holds the fields some reader uses; a file may hold more (a benchmark's diagnostics),
which are left in the file. Older files lack some fields: those are optional (None)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from kestrel import speculative as spec
from kestrel.errors import KestrelError
from .checks import Field, ResultsFileError


@dataclass(frozen=True)
class Provenance:
    """Where and how a results file was measured; kernels: the kernel options the backend
    reported (None on the CPU backend, and in files written before they were recorded)."""
    device: str
    date: str
    command: str
    commit: str | None = None
    kernels: dict | None = None

    def line(self) -> str:
        """'measured on <device> at <date> by `<command>` (commit c; kernels gemv=..)'."""
        notes = ([f"commit {self.commit}"] if self.commit else []) + (
            ["kernels " + ", ".join(f"{k}={v}" for k, v in self.kernels.items())] if self.kernels else [])
        return (f"measured on {self.device} at {self.date} by `{self.command}`"
                + (f" ({'; '.join(notes)})" if notes else ""))

    def as_dict(self) -> dict:
        """The fields a writer stamps into a file (commit and kernels only where known)."""
        d = {"device": self.device, "date": self.date, "command": self.command}
        return {**d, **({} if self.commit is None else {"commit": self.commit}),
                **({} if self.kernels is None else {"kernels": dict(self.kernels)})}


def read_provenance(f: Field, date_key: str = "date") -> Provenance:
    kernels = None
    if f.get("kernels") is not None:
        kernels = {}
        for name, v in f["kernels"].entries():
            if isinstance(v.value, bool) or isinstance(v.value, str):
                kernels[name] = v.value
            else:
                kernels[name] = v.int()
    return Provenance(f["device"].str(), f[date_key].str(), f["command"].str(), f.opt("commit", "str"), kernels)


# ---- scripts/bench_spec.py ---------------------------------------------------------------------------
_TABLES = {"step_m", "ckpt", "mtp", "cached", "fold", "chain", "chain_fill"}


def read_units(f: Field) -> spec.UnitCosts:
    known = {x.name for x in fields(spec.UnitCosts)}
    for key, _ in f.entries():
        if key not in known:
            f[key].fail(f"no such unit cost (known: {sorted(known)})")
    kw = {}
    for name in known:
        if name in ("step", "step_m", "ckpt", "draft", "mtp", "mark", "rollback") or f.has(name):
            g = f[name]
            kw[name] = g.obj() if name == "meta" else g.table() if name in _TABLES else g.num()
    return spec.UnitCosts(**kw)


# Files written before the undo step's phase had its own name recorded it as "rollback".
LEGACY_PHASES = {"rollback": "undo"}


def read_run(f: Field, model: str, device: str) -> spec.RunSummary:
    """A run row (a RunSummary's dict plus a benchmark's additions, which are not kept)."""
    def parsed(key, parse):
        try:
            return parse(f[key].str())
        except KestrelError:
            f[key].fail("a known name")
    def phase_table(key) -> dict:
        out = {}
        for name, g in f[key].entries():
            name = LEGACY_PHASES.get(name, name)
            if name not in spec.PHASES:
                g.fail(f"a phase, one of {list(spec.PHASES)}")
            out[name] = g.num()
        return out
    phases = phase_table("phase_ms_per_token")
    pred_phases = phase_table("predicted_phase_ms_per_token") if f.has("predicted_phase_ms_per_token") else None
    hits = []
    for g in f["cond_hits"].items():
        g.obj()
        hits.append(spec.CondHit(j=g["j"].int(1), rate=g.opt("rate", "num"), hit=g.opt("hit", "int"),
                                 of=g.opt("of", "int")))
    return spec.RunSummary(
        policy=parsed("policy", spec.Policy.parse), pairing=parsed("pairing", spec.Pairing.parse),
        drafter=f["drafter"].str(), k=f["k"].int(1), T=f["T"].int(1), hist=f["hist"].counts(),
        cond_hits=hits, ms_per_token=f["ms_per_token"].num(), phase_ms_per_token=phases,
        greedy_ms_per_token=f.opt("greedy_ms_per_token", "num"), bit_exact=f.opt("bit_exact", "bool"),
        first_diff=f.opt("first_diff", "int"), model=f.opt("model", "str") or model,
        device=f.opt("device", "str") or device, runs=f.opt("runs", "int", 1) or 1,
        prompt_tokens=f.opt("prompt_tokens", "int"), tail_tokens=f.opt("tail_tokens", "int") or 0,
        tail_reason=f.opt("tail_reason", "str") or "", schedule=f.opt("schedule", "str"),
        variants=f["variants"].obj() if f.has("variants") else {},
        speedup_per_run=list(f["speedup_per_run"].numbers()) if f.has("speedup_per_run") else None,
        predicted_ms_per_token=f.opt("predicted_ms_per_token", "num"),
        predicted_speedup=f.opt("predicted_speedup", "num"), predicted_phase_ms_per_token=pred_phases)


@dataclass(frozen=True)
class SpecSection:
    """One section of a bench_spec file: 'tiny' (end to end, with the model's teacher-forced
    acceptance per pairing) or 'large' (the real shape, the replay drafter)."""
    name: str
    model: str
    device: str
    units: spec.UnitCosts
    runs: tuple                       # spec.RunSummary, one per row
    provenance: Provenance            # the file's, with the section's device
    path: str
    acceptance: dict                  # spec.Pairing -> (alpha_1, ...) (None: a depth never reached)
    T: int | None = None
    P: int | None = None
    repeats: int | None = None
    source: str | None = None         # the weights' source
    weights: str | None = None        # their dtype
    greedy_ms_per_token: float | None = None
    gdn_state_bytes: int | None = None
    conv_state_bytes: int | None = None

    def run(self, *, k: int, policy: str, schedule: str | None = None, pairing: str | None = None,
            drafter: str | None = None) -> spec.RunSummary:
        """The one run with these settings; ResultsFileError naming the file if there is none."""
        want = {"k": k, "policy": spec.Policy.parse(policy).name, "schedule": schedule,
                "pairing": None if pairing is None else spec.Pairing.parse(pairing).value, "drafter": drafter}
        for r in self.runs:
            got = {"k": r.k, "policy": r.policy.name, "schedule": r.schedule, "pairing": r.pairing.value,
                   "drafter": r.drafter}
            if all(v is None or got[key] == v for key, v in want.items()):
                return r
        raise ResultsFileError(f"{self.path}: {self.name}.runs: no run with "
                               + ", ".join(f"{key}={v}" for key, v in want.items() if v is not None))


def read_section(f: Field, name: str, prov: Provenance, path: str) -> SpecSection:
    model, device = f["model"].str(), f.opt("device", "str") or prov.device
    acc = {}
    if f.has("acceptance"):
        for pr, g in f["acceptance"].entries():
            try:
                pairing = spec.Pairing.parse(pr)
            except KestrelError:
                g.fail("an acceptance entry keyed by a pairing")
            acc[pairing] = tuple(None if a.value is None else a.num() for a in g["alpha"].items())
    return SpecSection(
        name=name, model=model, device=device, units=read_units(f["units"]),
        runs=tuple(read_run(r, model, device) for r in f["runs"].items()),
        provenance=replace(prov, device=device), path=path, acceptance=acc,
        T=f.opt("T", "int", 1), P=f.opt("P", "int", 1), repeats=f.opt("repeats", "int", 1),
        source=f.opt("source", "str"), weights=f.opt("weights", "str"),
        greedy_ms_per_token=f.opt("greedy_ms_per_token", "num"), gdn_state_bytes=f.opt("gdn_state_bytes", "int"),
        conv_state_bytes=f.opt("conv_state_bytes", "int"))


@dataclass(frozen=True)
class Roofline:
    bound: str                        # what bounds a step: "bandwidth" or "launch"
    dtype: str
    weight_bytes: int
    floor_share: float                # the weight read's share of a step
    verify_over_step: dict            # M -> verify_checkpointed(M) / step
    floor_ms: float | None = None     # weight bytes / the read bandwidth
    kernels_per_step: int | None = None
    launch_ms: float | None = None    # kernels per step x the cost of one launch
    step_ms: float | None = None      # the step measured
    draft_over_step: float | None = None


@dataclass(frozen=True)
class SweepRun:
    k: int
    policy: str
    pairing: str
    speedup: float                    # the median over the repeats
    speedup_range: tuple              # (min, max) over the repeats
    ms_per_token: float
    ms_per_token_range: tuple
    greedy_ms_per_token: float
    advance_per_round: float
    bit_exact: bool


@dataclass(frozen=True)
class SweepSize:
    preset: str
    weight_bytes: int
    greedy_ms_per_token: float
    runs: tuple                       # SweepRun, one per k
    roofline: Roofline


@dataclass(frozen=True)
class Sweep:
    """The size sweep (kestrel.lab.sweep.size_sweep): speedup at each k, per model size."""
    device: str
    ks: tuple
    sizes: tuple                      # SweepSize
    skipped: tuple = ()               # (preset, why) the machine could not run
    bandwidth_Bps: float | None = None
    bandwidth_kind: str | None = None
    launch_ms_per_kernel: float | None = None

    def best(self) -> dict:
        """preset -> the fastest k's run if it beat greedy (speedup > 1), else None."""
        out = {}
        for s in self.sizes:
            top = max(s.runs, key=lambda r: r.speedup)
            out[s.preset] = top if top.speedup > 1 else None
        return out


def _range(f: Field) -> tuple:
    lo_hi = f.numbers()
    if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
        f.fail("[min, max]")
    return lo_hi


def read_sweep(f: Field) -> Sweep:
    sizes = []
    for s in f["sizes"].items():
        ro = s["roofline"]
        runs = [SweepRun(r["k"].int(1), r["policy"].str(), r["pairing"].str(), r["speedup"].num(),
                         _range(r["speedup_range"]), r["ms_per_token"].num(), _range(r["ms_per_token_range"]),
                         r["greedy_ms_per_token"].num(), r["advance_per_round"].num(), r["bit_exact"].bool())
                for r in s["runs"].items()]
        sizes.append(SweepSize(s["preset"].str(), s["weight_bytes"].int(), s["greedy_ms_per_token"].num(),
                               tuple(runs), Roofline(ro["bound"].str(), ro["dtype"].str(), ro["weight_bytes"].int(),
                                                     ro["floor_share"].num(), ro["verify_over_step"].table(),
                                                     ro.opt("floor_ms", "num"), ro.opt("kernels_per_step", "int"),
                                                     ro.opt("launch_ms", "num"), ro.opt("step_ms", "num"),
                                                     ro.opt("draft_over_step", "num"))))
    skipped = tuple((g["preset"].str(), g["why"].str()) for g in f["skipped"].items()) if f.has("skipped") else ()
    return Sweep(f["device"].str(), tuple(k.int(1) for k in f["ks"].items()), tuple(sizes), skipped,
                 f.opt("bandwidth_Bps", "num"), f.opt("bandwidth_kind", "str"), f.opt("launch_ms_per_kernel", "num"))


@dataclass(frozen=True)
class SpecFile:
    """results/bench_spec*.json: scripts/bench_spec.py's sections (each may be absent)."""
    provenance: Provenance
    path: str
    tiny: SpecSection | None
    large: SpecSection | None
    sweep: Sweep | None


def read_spec_file(f: Field, path: str) -> SpecFile:
    prov = read_provenance(f)
    return SpecFile(prov, path, *(read_section(f[n], n, prov, path) if f.has(n) else None for n in ("tiny", "large")),
                    read_sweep(f["sweep"]) if f.has("sweep") else None)
