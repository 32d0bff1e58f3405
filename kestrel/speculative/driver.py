"""run_spec: speculative decoding of T tokens, checked and timed (the round itself is round.py).

    r = run_spec(model, prompt, T=64, k=3, policy="checkpoint", drafter="mtp")
    r.summary()          # RunSummary: histogram, hit rates, ms/token by phase, speedup vs greedy
    run_spec(model, prompt, 64, 3, "replay", "replay", schedule=Schedule(hist=ARTICLE_HIST))
    run_spec(..., mistakes=Mistakes(emit_self=True), check=False)      # the deliberately wrong variants
    run_spec(model, prompt, 64, k="auto", k_max=4, unit_costs=u)        # each round's k chosen (adaptive.py)

Every argument is checked before any engine state changes (validate_run); names (policy,
drafter, pairing) are parsed once into their types here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..engine import Engine
from ..model import Model
from .baseline import check_engine, greedy_need, greedy_timed
from .drafters import Drafter, make_drafter
from .errors import SpecArgumentError
from .inputs import check_length, check_size, check_tokens
from .policy import Policy
from .records import SpecResult
from .mistakes import MistakenRun, Mistakes
from .round import TAILS, SpecRun
from .adaptive import KChooser
from .units import measure_unit_costs
from .. import ASSETS


@dataclass
class RunArgs:
    """run_spec's arguments, checked and parsed."""
    prompt: list
    T: int
    k: int
    policy: Policy
    drafter: Drafter
    tail: str
    mistakes: Mistakes
    reference: list | None
    need: int                       # engine positions the run uses
    auto: bool = False              # k = "auto": k is k_max, each round's k chosen (adaptive.KChooser)


def validate_run(model, prompt, T, k, policy, drafter, *, schedule=None, reference=None, tail=None,
                 mistakes=None, k_max: int = 4) -> RunArgs:
    """Check and parse run_spec's arguments (named errors: SpecArgumentError, ScheduleError,
    TokenError). Touches no engine; the CLI calls it for every start before running any."""
    if not isinstance(model, Model):
        raise SpecArgumentError(f"model takes a kestrel Model (from kestrel.load), got {type(model).__name__}")
    if not model.has_mtp:
        raise SpecArgumentError("speculative decoding here drafts with the MTP head; this model has none")
    prompt = check_tokens(prompt, model, "prompt")
    T = check_length(T, model, len(prompt))
    auto = isinstance(k, str) and k == "auto"
    k = check_size(k_max, "k_max") if auto else check_size(k, "k")
    policy = Policy.parse(policy)
    if auto and policy.batch == "strict":
        raise SpecArgumentError(f"k='auto' varies the verify's rows round by round; the {policy} policy's strict "
                                f"batch takes M == mmax only (use flex-replay, checkpoint or input-cache)")
    mistakes = Mistakes() if mistakes is None else mistakes
    if not isinstance(mistakes, Mistakes):
        raise SpecArgumentError(f"mistakes= takes a spec.Mistakes, got {type(mistakes).__name__}")
    tail = tail or ("plain" if policy.batch == "strict" else "shrink")
    if tail not in TAILS:
        raise SpecArgumentError(f"tail must be one of {TAILS}, got {tail!r}")
    if auto and mistakes.on():
        raise SpecArgumentError("k='auto' runs the protocol; the deliberate mistakes take a fixed k")
    if mistakes.mark_first and not policy.uses_mark:
        raise SpecArgumentError(f"mark_first is the negative control of mark/rollback; the {policy} policy takes no mark")
    if reference is not None:
        reference = check_tokens(reference, model, "reference", allow_empty=True)
        if len(reference) != T:
            raise SpecArgumentError(f"reference has {len(reference)} tokens, T={T}")
    d = make_drafter(drafter, schedule=schedule, feed=mistakes.feed)
    if hasattr(d, "schedule"):
        d.schedule.bind(k)
    need = len(prompt) + T + k + 2
    if mistakes.mark_first:                      # the MTP slot may drift by up to k rows per round
        need += (T + 1) * (k + 1)
    need = min(need, model.cfg.max_position_embeddings)
    return RunArgs(prompt, T, k, policy, d, tail, mistakes, reference, need, auto)


def run_spec(model, prompt, T: int = 64, k: int = 3, policy="checkpoint", drafter="mtp", *, schedule=None,
             reference=None, greedy: bool = True, tail: str | None = None, mistakes: Mistakes | None = None,
             check: bool = True, check_rows: bool = False, on_round=None, engine=None,
             greedy_engine=None, k_max: int = 4, unit_costs=None, time_scaled: bool = True) -> SpecResult:
    """Speculative decoding of T tokens after `prompt` with k drafts per round.

    k: an int, or "auto": each round's k in 0..k_max chosen from unit_costs (a UnitCosts of this
    model on this device; measured here first when None) and the acceptance seen so far, 0 a
    plain step (kestrel/speculative/adaptive.py); time_scaled=False keeps the measured round
    times out of the decisions. Needs a flex-batch policy.

    policy: 'replay' | 'flex-replay' | 'checkpoint' (or a Policy). drafter: 'mtp-article' |
    'mtp' | 'replay' (with schedule=Schedule(hist= | profile= | seq=, pairing=)) | a Drafter.
    greedy=True times plain greedy decoding in the same call (the speedup baseline) and uses
    its stream as the reference; otherwise pass reference= (T tokens, e.g. kestrel.generate's).
    check=True: after every round consumed == emitted and the cursors are where the invariant
    says, else InvariantError. check_rows=True also checks, on replay, that each replayed row
    is bit-identical to its verify row (batch invariance, live).
    mistakes: the deliberately wrong variants (see Mistakes).
    on_round: called with each RoundRecord as soon as its round is done (live widgets).
    engine / greedy_engine: Engines to reuse (reset first) for the spec run / the greedy
    baseline; the spec engine needs mmax == k and the policy's batch mode. Benchmarks reuse
    them so that a GPU backend's captured plans (keyed on the engine's buffers) are reused.
    """
    a = validate_run(model, prompt, T, k, policy, drafter, schedule=schedule, reference=reference, tail=tail,
                     mistakes=mistakes, k_max=k_max)
    chooser = None
    if a.auto:
        if unit_costs is None:
            unit_costs = measure_unit_costs(model, k_max=a.k)
        if not isinstance(time_scaled, (bool, np.bool_)):
            raise SpecArgumentError(f"run_spec: time_scaled= takes a bool, got {time_scaled!r:.40}")
        chooser = KChooser(unit_costs, a.policy, a.drafter.pairing, a.k, time_scaled=bool(time_scaled))
    elif unit_costs is not None:
        raise SpecArgumentError("unit_costs= prices the rounds of k='auto'; a fixed k takes none")
    for name, flag in (("greedy", greedy), ("check", check), ("check_rows", check_rows)):
        if not isinstance(flag, (bool, np.bool_)):
            raise SpecArgumentError(f"run_spec: {name}= takes a bool, got {flag!r:.40}")
    if on_round is not None and not callable(on_round):
        raise SpecArgumentError(f"run_spec: on_round= takes a function of a RoundRecord, got {on_round!r:.40}")
    if engine is not None:
        check_engine(engine, model, a.need, "run_spec", mmax=a.k, batch=a.policy.batch)
    if greedy and greedy_engine is not None:
        check_engine(greedy_engine, model, greedy_need(model, len(a.prompt), a.T), "greedy_timed")

    reference, greedy_ms = a.reference, None
    if greedy:
        gstream, greedy_ms, _ = greedy_timed(model, a.prompt, a.T, engine=greedy_engine)
        reference = gstream if reference is None else reference
    d = a.drafter
    d.bind(model, reference)
    d.reset()
    if engine is not None:
        engine.reset()
        eng = engine
    else:
        eng = Engine(model, max_seq=a.need, mmax=a.k, batch=a.policy.batch)
    args = (model, eng, d, a.prompt, a.T, a.k, a.policy, a.tail, check, check_rows, on_round)
    run = (MistakenRun(*args, mistakes=a.mistakes) if a.mistakes.on() else SpecRun(*args, chooser=chooser)).go()
    be = model.be
    return SpecResult(model=model.cfg.name, device=getattr(be, "device_name", be.name), policy=a.policy,
                      drafter=d.describe(), pairing=d.pairing, k="auto" if a.auto else a.k, T=a.T, batch=a.policy.batch, tail_mode=a.tail,
                      prompt=a.prompt, stream=run.stream[:a.T], reference=reference, rounds=run.records,
                      tail_tokens=run.tail_tokens, tail_ms=run.tail_ms, tail_reason=run.tail_reason,
                      prefill_ms=run.prefill_ms, mtp_fill_ms=run.mtp_fill_ms, greedy_ms=greedy_ms,
                      variants=a.mistakes.on(), auto_k_max=a.k if a.auto else None,
                      choices=chooser.trace if a.auto else None)


def default_starts(model, n: int = 6, seed: int = 0) -> list:
    """(label, tokens) for the six starts: the tiny model's starts.json prompts (byte tokens) when
    the model has a byte tokenizer, else n seeded random prompts of 4..19 tokens."""
    path = ASSETS / "tiny" / "starts.json"
    tok = getattr(model, "tokenizer", None)
    if tok is not None and path.exists():
        texts = json.loads(Path(path).read_text())[:n]
        return [(t, tok.encode(t)) for t in texts]
    rng = np.random.default_rng(seed)
    V = model.cfg.vocab_size
    out = []
    for i in range(n):
        L = 4 + 3 * i
        toks = [int(x) for x in rng.integers(0, V, L)]
        out.append((f"random[{i}] len={L}", toks))
    return out
