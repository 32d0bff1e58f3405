"""kestrel.speculative: the speculative round, its policies and drafters, instrumentation, cost model.

    from kestrel import speculative as spec
    r = spec.run_spec(model, prompt, T=64, k=3, policy="checkpoint", drafter="mtp")
    print("\\n".join(r.log_lines()))          # the article's [spec] lines; r.rounds: per-round records
    s = r.summary()                           # RunSummary: histogram, hit rates, ms/token, speedup vs greedy
    spec.aggregate([r1, r2, ...])             # one RunSummary over starts; .log_lines()

  policies   spec.POLICIES: 'replay' (the article's wall: strict batch, rollback + M=1 replay),
             'flex-replay' (rollback + one batched replay), 'checkpoint' (per-row GDN slots,
             select, no copy), 'input-cache' (keep the rows' GDN inputs, fold the accepted ones
             in); each a Policy carrying its finalise step, its cost formula and its byte account
  pairings   spec.Pairing.ARTICLE ('article': rows (t_i, h_i)), Pairing.TRAINED ('trained':
             rows (t_{i+1}, h_i), d_1 free)
  drafters   'mtp-article' (the article's pairing), 'mtp' (trained pairing, free d_1),
             'replay' (oracle: schedule=spec.Schedule(hist= | profile= | seq=, pairing=))
  wrong on purpose   mistakes=spec.Mistakes(emit_self=True) (ghost tokens), (double_consume=True)
             (CursorError), (mark_first=True, mark_mtp_cursor=False) (negative control),
             (feed='article-pairing' | 'stale-hidden') (drafter 'mtp': bit-exact, acceptance collapses)
  acceptance spec.teacher_forced(model, prompt, T=64, depth=4, pairing='trained'|'article') (E16)
  adaptive   spec.run_spec(model, prompt, 64, k="auto", k_max=4, unit_costs=u): each round's k (0: a plain
             step) chosen from the unit costs and the acceptance seen so far (KChooser, adaptive.py)
  batched    spec.batch_greedy(model, prompts, T, slots=B); spec.batch_spec(model, prompts, T, k, policy, drafter,
             slots=B, references=...): many sequences on a BatchEngine, their verifies in one pass
  costs      u = spec.measure_unit_costs(model); spec.predict(u, policy, pairing, k, hist=|profile=|seq=);
             spec.compare(u, results)  (prediction for the runs' own rounds beside the measurement)
"""
from .accept import Acceptance, check_depth, combine, implied_nok, teacher_forced
from .adaptive import Choice, KChooser
from .baseline import greedy_timed, reference_stream
from .batched import BatchResult, batch_greedy, batch_spec, verify_kind
from .control import mtp_cursor_control
from .cost import Prediction, compare, equivalent_alpha, mean_nok, predict, predict_result, round_cost
from .drafters import (DRAFTERS, FEEDS, Drafter, MTPArticleDrafter, MTPDrafter, ReplayDrafter, draft_tokens,
                       make_drafter)
from .driver import RunArgs, default_starts, run_spec, validate_run
from .errors import InvariantError, ScheduleError, SpecArgumentError
from .pairing import PAIRING_DOC, PAIRINGS, Pairing
from .policy import (CHECKPOINT, FLEX_REPLAY, INPUT_CACHE, POLICIES, REPLAY, Finalised, Policy, cached_row_bytes,
                     recurrent_bytes)
from .records import RoundRecord, RunSummary, SpecResult, aggregate, log_lines
from .mistakes import Mistakes
from .round import TAILS
from .schedule import (ARTICLE_HIST, E16_PROFILE, Schedule, check_hist, check_profile, check_sequence, format_hist,
                       hist_to_sequence, nok_distribution, parse_hist, parse_profile)
from .stats import PHASE_DOC, PHASES, CondHit, NokStats, conditional_hits, histogram, summarize_noks
from .inputs import check_length, check_size, check_tokens
from .units import K_VALUES, UnitCosts, check_measurement, edit_units, measure_unit_costs

__all__ = [
    # the round
    "run_spec", "validate_run", "KChooser", "Choice", "RunArgs", "greedy_timed", "reference_stream", "default_starts", "Mistakes",
    "TAILS", "mtp_cursor_control", "batch_greedy", "batch_spec", "BatchResult", "verify_kind",
    # types
    "Policy", "Finalised", "POLICIES", "REPLAY", "FLEX_REPLAY", "CHECKPOINT", "INPUT_CACHE", "recurrent_bytes",
    "cached_row_bytes", "Pairing", "PAIRINGS", "PAIRING_DOC",
    "RunSummary", "SpecResult", "RoundRecord", "aggregate", "log_lines",
    # errors
    "SpecArgumentError", "ScheduleError", "InvariantError",
    # drafters and schedules
    "make_drafter", "draft_tokens", "Drafter", "MTPArticleDrafter", "MTPDrafter", "ReplayDrafter", "DRAFTERS", "FEEDS", "Schedule",
    "ARTICLE_HIST", "E16_PROFILE", "parse_hist", "check_hist", "format_hist", "hist_to_sequence", "check_sequence",
    "parse_profile", "check_profile", "nok_distribution",
    # summaries
    "PHASES", "PHASE_DOC", "histogram", "conditional_hits", "summarize_noks", "CondHit", "NokStats",
    # acceptance and cost
    "teacher_forced", "check_depth", "combine", "implied_nok", "Acceptance",
    "UnitCosts", "K_VALUES", "measure_unit_costs", "check_measurement", "check_length", "check_size", "check_tokens", "edit_units", "Prediction", "predict", "predict_result", "compare",
    "round_cost", "mean_nok", "equivalent_alpha",
]
