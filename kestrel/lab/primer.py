"""The primer's back-of-envelope speedup (book/ch00_primer.ipynb).

A speculative round advances the output by A tokens and costs a verify, a draft and an undo;
greedy decoding pays one step per token. With every cost in units of one greedy step:

    speedup = A / (verify/step + draft/step + undo/step)

The envelope leaves out the round's small phases (the MTP cursor sync, the argmax and
bookkeeping) and any host time between calls, so it reads a little high. The cost model in
kestrel.speculative.cost prices every phase; this is the version that fits on a napkin.
"""
from __future__ import annotations

from ..speculative import Pairing, SpecArgumentError, UnitCosts

TERMS = ("verify", "draft", "undo")


def envelope_speedup(advance: float, verify: float, draft: float, undo: float) -> float:
    """advance per round / (verify + draft + undo), each cost in greedy steps."""
    for name, v in (("advance", advance), ("verify", verify), ("draft", draft), ("undo", undo)):
        if not isinstance(v, (int, float)) or v != v or v < 0:
            raise SpecArgumentError(f"envelope_speedup: {name} must be a number >= 0, got {v!r}")
    if advance <= 0 or verify + draft + undo <= 0:
        raise SpecArgumentError("envelope_speedup: a round must advance and cost something "
                                f"(advance={advance}, costs={verify + draft + undo})")
    return advance / (verify + draft + undo)


def unit_terms(u: UnitCosts, k: int, pairing="trained") -> dict:
    """The checkpoint policy's three costs per round, in greedy steps, from unit costs: a
    checkpointed verify of k rows, the MTP chain the pairing drafts with, a select."""
    if not isinstance(u, UnitCosts):
        raise SpecArgumentError(f"unit_terms: expected UnitCosts (spec.measure_unit_costs), got {type(u).__name__}")
    step = u.greedy_ms_per_token
    draft = u.draft_ms(Pairing.parse(pairing).mtp_steps(k))
    return {"verify": u.get("ckpt", k) / step, "draft": draft / step, "undo": u.select / step}


def run_terms(summary) -> dict:
    """The same three costs per round, in greedy steps, as one run measured them (a RunSummary
    with its greedy baseline): each phase's ms per token x tokens per round / greedy ms per token.
    Undo is mark + rollback + replay (for the checkpoint policy: the select)."""
    if getattr(summary, "greedy_ms_per_token", None) is None:
        raise SpecArgumentError("run_terms: the run has no greedy baseline (run_spec(..., greedy=True))")
    ph, a, g = summary.phase_ms_per_token, summary.advance_per_round, summary.greedy_ms_per_token
    return {"verify": ph["verify"] * a / g, "draft": ph["draft"] * a / g,
            "undo": (ph["mark"] + ph["undo"] + ph["replay"]) * a / g}
