"""What the figures take: runs (measured or predicted) and n_ok histograms, as typed objects.

A run is a spec.SpecResult, a spec.RunSummary (SpecResult.summary(), spec.aggregate(), or
a row of a results file through RunSummary.from_dict) or a spec.Prediction. A histogram is
a dict {n_ok: count}, an 'n_ok:count ...' string, a list of n_ok values, or anything carrying
one (SpecResult, RunSummary).
"""
from __future__ import annotations

from dataclasses import dataclass

from kestrel import speculative as spec

from ..checks import Field
from ..records import read_run
from kestrel.errors import KestrelError
from ..results import SpecSection, load_bench


@dataclass
class RunView:
    """One bar of a figure: a run, its label, and the SpecResult behind it if there is one."""
    run: object                       # spec.RunSummary | spec.Prediction
    label: str
    result: object = None             # spec.SpecResult

    @property
    def predicted(self) -> bool:
        return isinstance(self.run, spec.Prediction)

    @property
    def phase(self) -> dict:
        """ms per emitted token by phase (every spec.PHASES entry), plus 'tail' where there is one."""
        out = {ph: float(self.run.phase_ms_per_token.get(ph, 0.0)) for ph in spec.PHASES}
        if self.run.tail_ms_per_token > 0:
            out["tail"] = float(self.run.tail_ms_per_token)
        return out

    @property
    def mean_nok(self) -> float | None:
        return None if self.predicted else self.run.mean_per_round


def drafter_short(d: str) -> str:
    d = str(d or "?")
    return "replay" if d.startswith("replay") else d


def run_label(run) -> str:
    if isinstance(run, spec.Prediction):
        return f"{run.policy} · pairing {run.pairing} · k={run.k} (predicted)"
    what = drafter_short(run.drafter)
    if what == "replay" and run.schedule:           # results rows: which histogram/profile it replayed
        what = f"{run.schedule.split(',')[0]}/{run.pairing}"
    return f"{run.policy} · {what} · k={run.k}"


def as_run(x) -> tuple:
    """(RunSummary | Prediction, SpecResult or None) for one run."""
    if isinstance(x, spec.SpecResult):
        return x.summary(), x
    if isinstance(x, (spec.RunSummary, spec.Prediction)):
        return x, None
    if isinstance(x, dict):         # a results row: through the results files' validating reader
        return read_run(Field(x, "a results row"), x.get("model", ""), x.get("device", "")), None
    raise KestrelError(f"a run is a SpecResult, a RunSummary, a Prediction or a results row, got {type(x).__name__}")


def as_runs(runs, names=None) -> list:
    """[RunView] with distinct labels (plotly merges equal categories)."""
    if isinstance(runs, (dict, spec.SpecResult, spec.RunSummary, spec.Prediction)):
        runs = [runs]
    runs = list(runs)
    names = list(names) if names is not None else [None] * len(runs)
    if len(names) != len(runs):
        raise KestrelError(f"{len(names)} names for {len(runs)} runs")
    out = []
    seen = {}
    for x, name in zip(runs, names):
        run, result = as_run(x)
        label = name or run_label(run)
        c = seen.get(label, 0)
        seen[label] = c + 1
        out.append(RunView(run, f"{label} #{c + 1}" if c else label, result))
    return out


def hist_item(x) -> tuple:
    """(hist {n: count}, k or None, default name) from anything carrying an n_ok histogram."""
    if isinstance(x, spec.SpecResult):
        x = x.summary()
    if isinstance(x, spec.RunSummary):
        return dict(x.hist), x.k, run_label(x)
    if isinstance(x, (str, dict)):
        return spec.parse_hist(x), None, x if isinstance(x, str) else None
    if isinstance(x, (list, tuple)):
        return spec.histogram(spec.check_sequence(x)), None, None
    raise KestrelError(f"no n_ok histogram in a {type(x).__name__}")


def as_units(u):
    """spec.UnitCosts from UnitCosts, its dict, a results name or path (its unit costs), or a SpecSection."""
    if isinstance(u, spec.UnitCosts):
        return u
    if isinstance(u, SpecSection):
        return u.units
    if isinstance(u, dict):
        return spec.UnitCosts.from_dict(u)
    if isinstance(u, str) or hasattr(u, "__fspath__"):
        return load_bench(u).units
    raise KestrelError(f"unit costs: a spec.UnitCosts, its dict, or a results name/path, got {type(u).__name__}")


def pad_profile(profile, depths: int = 4) -> tuple:
    """A per-depth profile (list, string, or spec.Acceptance) padded to `depths` with its last rate
    (default: the article's E16). A depth no anchor reached (None) counts as 0."""
    if profile is None:
        profile = spec.E16_PROFILE
    if isinstance(profile, spec.Acceptance):
        profile = profile.profile()
    if not isinstance(profile, str):
        profile = [0.0 if a is None else a for a in profile]
    prof = list(spec.parse_profile(profile))
    return tuple(prof + [prof[-1]] * (depths - len(prof)))
