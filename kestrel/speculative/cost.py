"""Cost model: predicted ms per round and per token from measured unit costs (the article's account).

    round = draft steps x c_draft + [mark] + verify(M=k) + [rollback | select] + [replay] + MTP sync + bookkeeping

The policy prices its own phases (Policy.cost: mark, verify, rollback, replay); the pairing
prices the draft (Pairing.mtp_steps MTP steps) and the sync (mtp_truncate). Under the trained
pairing the Pairing.rewrite_rows confirmed rows ride in the next chain's first pass: the draft
phase pays what they add to it (UnitCosts.rewrite_ms; an mtp_fill when k = 1 leaves no chain).
The rewrite is priced in the round that leaves it, with that round's k; the next round pays it
(the last round's is never paid, and a shrinking tail can pay it by mtp_fill): a run is priced
high by about one rewrite. Tail tokens (strict, fewer
than k left): step + argmax each. Greedy: step + argmax per token.

predict() takes an n_ok histogram, a sequence, or a per-depth profile; predict_result() prices
a measured run's own rounds; compare() puts that beside the measurement. The cost views'
acceptance axis is a flat per-depth alpha; equivalent_alpha() places a run or a profile on it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ScheduleError
from .inputs import check_size
from .pairing import Pairing
from .policy import POLICIES, Policy, recurrent_bytes
from .schedule import advance, check_hist, check_sequence, nok_distribution, parse_profile
from .stats import PHASES
from .units import UnitCosts
from ..program import param_count


@dataclass
class Prediction:
    """The cost model's ms per emitted token by phase, for one policy, pairing and k.
    A distribution (histogram, profile) is priced per expected round (tokens None); a
    sequence or a measured run's rounds are priced as they are (tokens: all of them)."""
    policy: Policy
    pairing: Pairing
    k: int
    phase_ms_per_token: dict
    greedy_ms_per_token: float
    advance_per_round: float
    round_ms: float                      # mean ms per round (rounds only)
    tail_ms_per_token: float = 0.0       # the strict tail's plain steps, per emitted token
    rounds: int | None = None
    tokens: int | None = None
    tail_tokens: int = 0

    @property
    def ms_per_token(self) -> float:
        return sum(self.phase_ms_per_token.values()) + self.tail_ms_per_token

    @property
    def speedup(self) -> float:
        return self.greedy_ms_per_token / self.ms_per_token

    @property
    def total_ms(self) -> float | None:
        return None if self.tokens is None else self.ms_per_token * self.tokens

    def to_dict(self) -> dict:
        return {"policy": self.policy.name, "pairing": self.pairing.value, "k": self.k,
                "phase_ms_per_token": dict(self.phase_ms_per_token), "tail_ms_per_token": self.tail_ms_per_token,
                "greedy_ms_per_token": self.greedy_ms_per_token, "advance_per_round": self.advance_per_round,
                "round_ms": self.round_ms, "rounds": self.rounds, "tokens": self.tokens,
                "tail_tokens": self.tail_tokens, "ms_per_token": self.ms_per_token, "speedup": self.speedup}


def round_cost(u: UnitCosts, policy, pairing, k: int, n: int) -> dict:
    """Predicted ms per phase for one round with k drafts that accepts n."""
    policy, pairing = Policy.parse(policy), Pairing.parse(pairing)
    k, n = check_size(k, "k"), check_size(n, "n_ok", lo=0)
    if not pairing.min_nok <= n <= k:
        raise ScheduleError(f"n_ok={n} outside [{pairing.min_nok}, k={k}] for the {pairing.value} pairing")
    c = {ph: 0.0 for ph in PHASES}
    c["draft"] = u.draft_ms(pairing.mtp_steps(k))
    c["bookkeeping"] = u.bookkeeping
    if "bookkeeping_unit" in u.meta and not policy.logits_are_a_verify_row(k, n):
        c["bookkeeping"] += u.argmax    # a_p' is not a verify row's argmax: one more argmax + read
    c["sync"] = u.truncate
    r = pairing.rewrite_rows(k, n)
    if r > 0 and u.chain_fill:      # the drafter writes them at its next draft (round.py, drafters.py)
        c["draft"] += u.rewrite_ms(r, chained=pairing.mtp_steps(k) > 0)
    elif r > 0:                     # unit costs measured when the sync wrote them
        c["sync"] += u.get("mtp", r)
    c.update(policy.cost(u, k, n))
    return c


def _items(k: int, pairing: Pairing, hist, profile, seq) -> tuple:
    """-> (list of (n, weight)), is_sequence."""
    if sum(x is not None for x in (hist, profile, seq)) != 1:
        raise ScheduleError("give exactly one of hist=, profile=, seq=")
    if hist is not None:
        return [(n, float(c)) for n, c in check_hist(hist, k, pairing).items() if c], False
    if profile is not None:
        return [(n, w) for n, w in enumerate(nok_distribution(parse_profile(profile), k, pairing)) if w > 0], False
    return [(n, 1.0) for n in check_sequence(seq, k, pairing)], True


def predict(u: UnitCosts, policy, pairing, k: int, *, hist=None, profile=None, seq=None, T: int | None = None,
            greedy_ms_per_token: float | None = None) -> Prediction:
    """Predicted ms/token and speedup for one of: an n_ok histogram (hist='0:24 1:6 2:11 3:4' or
    a dict), a per-depth acceptance profile (profile=(0.714, ...)), or an n_ok sequence (seq=[...]).
    With a sequence and T, the tokens the rounds leave are priced as the strict tail (plain
    steps). Greedy = step + argmax per token unless given."""
    policy, pairing = Policy.parse(policy), Pairing.parse(pairing)
    k = check_size(k, "k")
    T = None if T is None else check_size(T, "T")
    items, is_seq = _items(k, pairing, hist, profile, seq)
    W = sum(w for _, w in items)
    phases = {ph: 0.0 for ph in PHASES}
    adv = 0.0
    for n, w in items:
        for ph, v in round_cost(u, policy, pairing, k, n).items():
            phases[ph] += w * v
        adv += w * advance(n)
    greedy = u.greedy_ms_per_token if greedy_ms_per_token is None else greedy_ms_per_token
    round_ms = sum(phases.values()) / W
    if not is_seq:          # per expected round
        return Prediction(policy, pairing, k, {ph: v / adv for ph, v in phases.items()}, greedy, adv / W, round_ms)
    tail = 0 if T is None else T - int(adv)
    if tail < 0:
        raise ScheduleError(f"the sequence advances {int(adv)} tokens > T={T}")
    tokens = int(adv) + tail
    return Prediction(policy, pairing, k, {ph: v / tokens for ph, v in phases.items()}, greedy, adv / W, round_ms,
                      tail_ms_per_token=tail * u.greedy_ms_per_token / tokens, rounds=len(items), tokens=tokens,
                      tail_tokens=tail)


def predict_result(u: UnitCosts, result, greedy_ms_per_token: float | None = None) -> Prediction:
    """Prediction for a measured run's own rounds (each with its own k) and tail. A plain step of a
    k = "auto" run (k = 0) is priced as the run records it: the step as 'replay', the argmax of
    a_p' as 'bookkeeping'."""
    phases = {ph: 0.0 for ph in PHASES}
    for r in result.rounds:
        if r.k == 0:
            phases["replay"] += u.step
            phases["bookkeeping"] += u.argmax
            continue
        for ph, v in round_cost(u, result.policy, result.pairing, r.k, r.n_ok).items():
            phases[ph] += v
    greedy = u.greedy_ms_per_token if greedy_ms_per_token is None else greedy_ms_per_token
    n = len(result.rounds)
    adv = sum(advance(r.n_ok) for r in result.rounds)
    return Prediction(result.policy, result.pairing, result.k, {ph: v / result.T for ph, v in phases.items()},
                      greedy, adv / n if n else 0.0, sum(phases.values()) / n if n else 0.0,
                      tail_ms_per_token=result.tail_tokens * u.greedy_ms_per_token / result.T, rounds=n,
                      tokens=result.T, tail_tokens=result.tail_tokens)


def compare(u: UnitCosts, results) -> dict:
    """Predicted beside measured, for one SpecResult or a list (e.g. six starts)."""
    results = results if isinstance(results, (list, tuple)) else [results]
    T = sum(r.T for r in results)
    pred_total, pred_ph, meas_ph = 0.0, {ph: 0.0 for ph in PHASES}, {ph: 0.0 for ph in PHASES}
    meas_total, greedy_meas = 0.0, 0.0
    for r in results:
        p = predict_result(u, r)
        pred_total += p.total_ms
        for ph in PHASES:
            pred_ph[ph] += p.phase_ms_per_token[ph] * r.T
        for ph, v in r.phase_ms().items():
            meas_ph[ph] += v
        meas_total += r.spec_ms
        greedy_meas = None if (greedy_meas is None or r.greedy_ms is None) else greedy_meas + r.greedy_ms
    g_pred = u.greedy_ms_per_token
    out = {"T": T, "predicted_ms_per_token": pred_total / T, "measured_ms_per_token": meas_total / T,
           "predicted_phase_ms": pred_ph, "measured_phase_ms": meas_ph,
           "predicted_greedy_ms_per_token": g_pred, "predicted_speedup": g_pred / (pred_total / T),
           "measured_greedy_ms_per_token": None if greedy_meas is None else greedy_meas / T,
           "measured_speedup": None if greedy_meas is None else greedy_meas / meas_total}
    out["ratio"] = out["measured_ms_per_token"] / out["predicted_ms_per_token"] if pred_total else None
    return out


# ---- the flat-alpha axis of the cost views --------------------------------------------------------
def mean_nok(profile, k: int, pairing) -> float:
    """Expected n_ok of a round of k drafts under a per-depth profile."""
    return sum(n * p for n, p in enumerate(nok_distribution(profile, k, pairing)))


def equivalent_alpha(mean: float | None, k: int, pairing=Pairing.ARTICLE) -> float | None:
    """The flat per-depth acceptance alpha whose expected n_ok at this k equals `mean` (where a
    measured run or a profile sits on the cost views' alpha axis). None where alpha changes
    nothing (the trained pairing with k = 1: n_ok is always 1)."""
    if mean is None:
        return None
    pairing = Pairing.parse(pairing)
    depths = max(pairing.judged_depths(k), 1)
    lo_v, hi_v = mean_nok((0.0,) * depths, k, pairing), mean_nok((1.0,) * depths, k, pairing)
    if hi_v - lo_v < 1e-12:
        return None
    if mean <= lo_v:
        return 0.0
    if mean >= hi_v:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if mean_nok((mid,) * depths, k, pairing) < mean:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def serving_projection(cfg, k: int, n: float, batches=(1, 4, 16, 64, 256), contexts=(4096, 32768, 131072),
                       kv_dtype_bytes: int = 2, weight_bytes: int | None = None,
                       read_bytes: int | None = None) -> list:
    """A projection of the byte formulas (Policy.state_traffic), not a measurement: for B
    sequences decoding together at context length L, the memory each policy holds and the bytes
    one round moves, k drafts accepting n each (n may be a mean: the formula is linear in n
    between integers, so it is interpolated).

    memory = weights held + B x (live recurrent state + what the policy keeps + KV cache of L tokens)
    bytes  = weights read once + B x (recurrent-state traffic of the round + KV cache read once per row)

    weight_bytes: the weights held (default: every main-model parameter in bf16); read_bytes:
    what a step reads of them (default the same; less where an untied embedding table is held
    whole but read one row a token).
    """
    w = weight_bytes if weight_bytes is not None else 2 * param_count(cfg, mtp=False)
    wr = read_bytes if read_bytes is not None else w
    lo, f = int(n), n - int(n)
    rows = []
    for pol in POLICIES.values():
        a = pol.state_traffic(cfg, k, lo)
        b = pol.state_traffic(cfg, k, min(lo + 1, k)) if f else a
        t = {key: (1 - f) * a[key] + f * b[key] for key in ("read", "written", "kept")}
        for L in contexts:
            kv = L * cfg.kv_bytes_per_token(kv_dtype_bytes)
            for B in batches:
                rows.append({"policy": pol.name, "batch": B, "context": L,
                             "memory_bytes": w + B * (recurrent_bytes(cfg) + t["kept"] + kv),
                             "round_bytes": wr + B * (t["read"] + t["written"] + k * kv),
                             "state_bytes": B * (t["read"] + t["written"]), "kept_bytes": B * t["kept"]})
    return rows
