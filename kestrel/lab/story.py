"""The book's story in one measured decomposition at the 27B shape (intro, chapters 5 and 7).

    steps = story.decomposition(results.load_bench("bench_spec"), k=3)
    grid = story.pairing_by_undo(section, k=3)

Five runs of one results file (same device, same session, the E16 acceptance profile, k drafts),
each one change from the one before:

    1. the article's setup       replay (strict batch, rollback, M = 1 re-runs), article pairing
    2. flex replay               the accepted rows re-run in one batched call
    3. per-row checkpoints       no rollback, no re-run: select the accepted row's state
    4. trained pairing alone     back to the article's replay, but the head fed as it was trained
                                 (its first draft is a_p, free)
    5. both                      per-row checkpoints and the trained pairing

Each step's ms per token is split by phase, and its `replay` phase is split further into the
two things it holds: the rows recomputed after a rollback, and the plain step of rounds that
accept nothing (the article's pairing has many; a step consumes a_p, whatever the undo
strategy). The plain steps are priced at the run's own greedy ms per token (one step each):
that is an estimate, said as such; the rest of `replay` is the recomputation.

`pairing_by_undo` is the 2 x 2 of the two fixes (pairing x undo) from the same file: neither
fix alone tells the story, and their product is not the sum of their parts.
"""
from __future__ import annotations

from dataclasses import dataclass

STEPS = (("the article's setup", "replay", "article"),
         ("flex replay", "flex-replay", "article"),
         ("per-row checkpoints", "checkpoint", "article"),
         ("trained pairing alone", "replay", "trained"),
         ("both", "checkpoint", "trained"))
PROFILE = "E16 profile"


@dataclass(frozen=True)
class Step:
    """One run of the decomposition, per token: its ms split by phase and its replay split."""
    name: str
    policy: str
    pairing: str
    k: int
    speedup: float
    ms_per_token: float
    greedy_ms_per_token: float
    phases: dict                    # phase -> ms per token
    plain_step_ms: float            # of `replay`: the n_ok = 0 rounds' plain step (estimated)
    recompute_ms: float             # of `replay`: rows recomputed after a rollback
    zero_rounds: int
    rounds: int


def replay_split(run) -> tuple:
    """(plain_step_ms, recompute_ms) per token of a run's `replay` phase: the plain step that each
    round accepting nothing takes for a_p (priced at the run's greedy ms per token, an estimate),
    and the rest, the rows recomputed after a rollback. `run`: a results run (hist, T, phases)."""
    replay = dict(run.phase_ms_per_token).get("replay", 0.0)
    plain = min(replay, int(run.hist.get(0, 0)) * run.greedy_ms_per_token / run.T)
    return plain, replay - plain


def _step(section, name, policy, pairing, k, profile) -> Step:
    r = section.run(k=k, policy=policy, pairing=pairing, schedule=profile)
    plain, recompute = replay_split(r)
    return Step(name, policy, pairing, k, r.speedup, r.ms_per_token, r.greedy_ms_per_token,
                dict(r.phase_ms_per_token), plain, recompute, int(r.hist.get(0, 0)), sum(r.hist.values()))


def decomposition(section, k: int = 3, profile: str = PROFILE) -> list:
    """The five steps above, from one section of a bench_spec results file."""
    return [_step(section, name, pol, pair, k, profile) for name, pol, pair in STEPS]


def pairing_by_undo(section, k: int = 3, profile: str = PROFILE) -> dict:
    """(pairing, policy) -> speedup over greedy, for the article's and the trained pairing under
    replay and per-row checkpoints."""
    return {(pair, pol): section.run(k=k, policy=pol, pairing=pair, schedule=profile).speedup
            for pair in ("article", "trained") for pol in ("replay", "checkpoint")}


def interaction(grid: dict) -> float:
    """How much more the two fixes give together than their effects multiplied: (both / article
    replay) over (checkpoints alone / article replay) x (pairing alone / article replay). 1 means
    they simply compound; above 1, each makes the other worth more."""
    base = grid[("article", "replay")]
    return (grid[("trained", "checkpoint")] / base) / ((grid[("article", "checkpoint")] / base)
                                                        * (grid[("trained", "replay")] / base))


def rows(steps: list) -> list:
    """Table rows: step, policy, pairing, speedup, ms/token, verify, draft, recomputed rows,
    plain steps of n_ok = 0 rounds, the other phases. ms/token is the run's median over its
    repeats; the phases are the rounds' (a strict policy's tail of plain steps is in the first,
    not the second), so the columns need not add up to it exactly."""
    out = []
    for s in steps:
        other = sum(v for ph, v in s.phases.items() if ph not in ("verify", "draft", "replay"))
        out.append([s.name, s.policy, s.pairing, f"{s.speedup:.2f}x", f"{s.ms_per_token:.2f}",
                    f"{s.phases.get('verify', 0):.2f}", f"{s.phases.get('draft', 0):.2f}", f"{s.recompute_ms:.2f}",
                    f"{s.plain_step_ms:.2f} ({s.zero_rounds} of {s.rounds})", f"{other:.2f}"])
    return out


HEAD = ["step", "undo", "pairing", "vs greedy", "ms/token", "verify", "draft", "rows recomputed",
        "plain steps (n_ok = 0)", "other"]        # other: mark, undo, sync, bookkeeping
