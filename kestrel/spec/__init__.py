"""kestrel.spec: the speculative round, its policies and drafters, instrumentation, cost model.

    from kestrel import spec
    r = spec.run_spec(model, prompt, T=64, k=3, policy="checkpoint", drafter="mtp")
    print("\n".join(r.log_lines()))          # the seed's [spec] lines; r.rounds: per-round records
    r.summary()                               # histogram, hit rates, ms/token, speedup vs greedy (same call)
    spec.aggregate([r1, r2, ...])             # over starts; spec.log_lines(that)

  policies   'replay' (the seed's wall: strict batch, rollback + M=1 replay), 'flex-replay'
             (rollback + one batched replay), 'checkpoint' (per-row GDN slots, select, no copy)
  drafters   'mtp-seed' (the seed's pairing), 'mtp' (free d_1, trained pairing),
             'replay' (oracle: hist= / profile= / seq=, pairing= 'seed' | 'mtp')
  wrong on purpose   emit_self=True (ghost tokens), double_consume=True (CursorError),
             mark_first=True + mark_mtp_cursor=False (negative control), feed='seed-pairing' |
             'stale-hidden' (drafter 'mtp': bit-exact, acceptance collapses)
  acceptance spec.teacher_forced(model, prompt, T=64, depth=4, pairing='mtp'|'seed') (E16)
  costs      u = spec.measure_unit_costs(model); spec.predict(u, policy, pairing, k, hist=|profile=|seq=);
             spec.compare(u, results)  (prediction for the runs' own rounds beside the measurement)
"""
from .drafters import DRAFTERS, FEEDS, Drafter, MTPDrafter, MTPSeedDrafter, ReplayDrafter, make_drafter
from .driver import (POLICIES, POLICY_DOC, TAILS, InvariantError, RoundRecord, SpecResult, aggregate,
                     default_starts, greedy_timed, mtp_cursor_control, reference_stream, run_spec)
from .schedule import (E16_PROFILE, PAIRINGS, SEED_HIST, SEED_HIST_STR, Schedule, format_hist, hist_to_sequence,
                       nok_distribution, parse_hist, parse_profile)
from .stats import PHASE_DOC, PHASES, conditional_hits, histogram, log_lines, summarize_noks
from .accept import Acceptance, combine, implied_nok, teacher_forced
from .cost import UnitCosts, compare, measure_unit_costs, predict, predict_result, round_cost

__all__ = [
    # the round
    "run_spec", "greedy_timed", "reference_stream", "default_starts", "aggregate", "SpecResult", "RoundRecord",
    "InvariantError", "POLICIES", "POLICY_DOC", "TAILS", "mtp_cursor_control",
    # drafters and schedules
    "make_drafter", "Drafter", "MTPSeedDrafter", "MTPDrafter", "ReplayDrafter", "DRAFTERS", "FEEDS", "Schedule",
    "SEED_HIST", "SEED_HIST_STR", "E16_PROFILE", "PAIRINGS", "parse_hist", "format_hist", "hist_to_sequence",
    "parse_profile", "nok_distribution",
    # summaries
    "PHASES", "PHASE_DOC", "histogram", "conditional_hits", "summarize_noks", "log_lines",
    # acceptance and cost
    "teacher_forced", "combine", "implied_nok", "Acceptance",
    "UnitCosts", "measure_unit_costs", "predict", "predict_result", "compare", "round_cost",
]
