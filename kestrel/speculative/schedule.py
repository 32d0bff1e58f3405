"""n_ok schedules: histograms, sequences and per-depth acceptance profiles, validated against k.

An n_ok histogram is a dict {n_ok: rounds}; the article writes it `0:24 1:6 2:11 3:4` (also
accepted: `n_ok=0:24 n_ok=1:6 ...`, commas instead of spaces).

A per-depth acceptance profile alpha_j is the conditional hit rate of the j-th MTP prediction
given that all earlier ones hit (the article's E16 on Qwen3.5-27B: 0.714, 0.364, 0.500, 0.750).
It applies from the first draft the MTP makes (Pairing.offset: from d_1 under the article's
pairing, from d_2 under the trained one, where d_1 is free).

Nothing is clamped, merged or truncated: n_ok outside [the pairing's minimum, k], a duplicate
entry, a count that is not a non-negative int, a histogram without rounds or with more than
MAX_ROUNDS (a histogram is expanded round by round: '0:2000000000' is 12 characters and two
billion list entries), a rate outside [0, 1] or a profile with fewer depths than k needs is a
ScheduleError.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..inputs import is_int
from .errors import ScheduleError
from .pairing import Pairing

MAX_ROUNDS = 1 << 20    # rounds a histogram may hold (and expand to): a round emits at least one token, so
                        # this is four times the positions of the largest preset (262144)
ARTICLE_HIST = {0: 24, 1: 6, 2: 11, 3: 4}        # the article's wall run: T=64, k=3, 45 rounds, 40 accepted
E16_PROFILE = (0.714, 0.364, 0.500, 0.750)       # the article's check "E16", teacher-forced, T=63


def _nok_key(n):
    if is_int(n) and n >= 0:
        return int(n)
    if isinstance(n, str) and re.fullmatch(r"\d+", n):        # a JSON round trip makes keys strings
        return int(n)
    raise ScheduleError(f"histogram key {n!r} is not an n_ok (a non-negative int)")


def parse_hist(h) -> dict:
    """'0:24 1:6 2:11 3:4' | 'n_ok=0:24 ...' | {0: 24, ...} -> {0: 24, 1: 6, 2: 11, 3: 4}."""
    out = {}
    if isinstance(h, dict):
        items = list(h.items())
    elif isinstance(h, str):
        items = []
        for part in re.split(r"[\s,;]+", h.strip()):
            if not part:
                continue
            m = re.fullmatch(r"(?:n_ok=)?(\d+):(\d+)", part)
            if not m:
                raise ScheduleError(f"histogram entry {part!r:.60} is not 'n_ok:count' with non-negative ints "
                                    f"(e.g. '0:24 1:6 2:11 3:4')")
            if max(len(m.group(1)), len(m.group(2))) > 12:      # int() of thousands of digits fails
                raise ScheduleError(f"histogram entry {part!r:.60} holds a number above {MAX_ROUNDS} "
                                    f"(the most rounds a histogram may hold)")
            items.append((int(m.group(1)), int(m.group(2))))
    else:
        raise ScheduleError(f"a histogram is an 'n_ok:count ...' string or a dict, got {type(h).__name__}")
    for n, c in items:
        n = _nok_key(n)
        if not is_int(c) or c < 0:
            raise ScheduleError(f"histogram count for n_ok={n} must be a non-negative int, got {c!r:.40}")
        if n in out:
            raise ScheduleError(f"histogram names n_ok={n} twice")
        out[n] = int(c)
    total = sum(out.values())
    if total == 0:
        raise ScheduleError(f"histogram has no rounds: {h!r:.60}")
    if total > MAX_ROUNDS:
        raise ScheduleError(f"histogram holds {total} rounds; at most {MAX_ROUNDS} (a round emits at least one "
                            f"token, and the largest preset has 262144 positions)")
    return dict(sorted(out.items()))


def check_hist(hist, k: int, pairing: Pairing) -> dict:
    """parse_hist, then every n_ok in [pairing.min_nok, k] (an n_ok below the minimum may appear with count 0)."""
    h = parse_hist(hist)
    over = [n for n in h if n > k]
    if over:
        raise ScheduleError(f"histogram has n_ok={over[0]} > k={k}")
    under = [n for n, c in h.items() if c and n < pairing.min_nok]
    if under:
        raise ScheduleError(f"histogram has rounds with n_ok={under[0]}: the {pairing.value} pairing's d_1 is free, "
                            f"n_ok >= {pairing.min_nok}")
    return h


def format_hist(hist: dict, k: int | None = None, *, labels: bool = True) -> str:
    """{0: 24, ...} -> 'n_ok=0:24 n_ok=1:6 n_ok=2:11 n_ok=3:4' (every n in 0..k when k is given);
    labels=False: '0:24 1:6 2:11 3:4' (the form parse_hist reads back)."""
    keys = range(0, (k if k is not None else max(hist)) + 1)
    pre = "n_ok=" if labels else ""
    return " ".join(f"{pre}{n}:{hist.get(n, 0)}" for n in keys)


def advance(n_ok: int) -> int:
    """Tokens one round emits (and the main model consumes): max(n_ok, 1)."""
    return max(int(n_ok), 1)


def hist_to_sequence(hist, order: str = "shuffle", seed: int = 0, fit_k: int | None = None) -> list:
    """Expand a histogram into a sequence of n_ok values.

    order: 'shuffle' (seeded permutation), 'sorted' (ascending), 'given' (n = 0, 1, ... blocks).
    fit_k: move one round with n_ok == fit_k to the end. A strict run of T = sum(max(n,1))
    tokens then ends exactly on a round: its last round starts with fit_k tokens left, so the
    tail (< k left) never starts and every requested round happens. (The article's T=64, k=3
    run: 45 rounds, 24+6+22+12 = 64 tokens.)
    """
    hist = parse_hist(hist)
    seq = [n for n, c in hist.items() for _ in range(c)]
    if order == "shuffle":
        seq = [int(x) for x in np.random.default_rng(seed).permutation(seq)]
    elif order == "sorted":
        seq = sorted(seq)
    elif order != "given":
        raise ScheduleError(f"order must be 'shuffle', 'sorted' or 'given', got {order!r}")
    if fit_k is not None and fit_k in seq:
        i = len(seq) - 1 - seq[::-1].index(fit_k)
        seq.append(seq.pop(i))
    return seq


def check_sequence(seq, k: int | None = None, pairing: Pairing = Pairing.ARTICLE) -> list:
    """A non-empty list of int n_ok values, each in [pairing.min_nok, k]."""
    if isinstance(seq, (str, bytes, dict)) or not hasattr(seq, "__iter__"):
        raise ScheduleError(f"an n_ok sequence is a list of ints, got {type(seq).__name__}")
    seq = list(seq)
    if not seq:
        raise ScheduleError("the n_ok sequence is empty")
    for n in seq:
        if not is_int(n) or n < 0:
            raise ScheduleError(f"an n_ok sequence holds non-negative ints, got {n!r}")
        if k is not None and n > k:
            raise ScheduleError(f"the n_ok sequence has n_ok={n} > k={k}")
        if n < pairing.min_nok:
            raise ScheduleError(f"the {pairing.value} pairing makes d_1 = argmax(logits_p) free: "
                                f"n_ok = {n} cannot be forced (n_ok >= {pairing.min_nok})")
    return [int(n) for n in seq]


def check_profile(profile, k: int | None = None, pairing: Pairing = Pairing.ARTICLE) -> tuple:
    """A non-empty list of finite rates in [0, 1]; with k, at least the depths a round of k judges."""
    if isinstance(profile, (str, bytes, dict)) or not hasattr(profile, "__iter__"):
        raise ScheduleError(f"an acceptance profile is a list of rates in [0, 1], got {profile!r}")
    prof = list(profile)
    for a in prof:
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer, np.floating)) \
                or not math.isfinite(a) or not 0.0 <= a <= 1.0:
            raise ScheduleError(f"an acceptance profile is a non-empty list of rates in [0, 1], got {profile!r}")
    if not prof:
        raise ScheduleError("the acceptance profile is empty")
    if k is not None and len(prof) < pairing.judged_depths(k):
        raise ScheduleError(f"the profile has {len(prof)} depth(s); k={k} with the {pairing.value} pairing "
                            f"judges {pairing.judged_depths(k)}")
    return tuple(float(a) for a in prof)


def parse_profile(s) -> tuple:
    """'0.714,0.364 0.5' or a list -> a checked profile tuple."""
    if isinstance(s, str):
        parts = [x for x in re.split(r"[\s,;]+", s.strip()) if x]
        try:
            vals = [float(x) for x in parts]
        except ValueError:
            raise ScheduleError(f"an acceptance profile is comma-separated rates in [0, 1], got {s!r}") from None
        return check_profile(vals)
    return check_profile(s)


def nok_distribution(profile, k: int, pairing=Pairing.ARTICLE) -> list:
    """P(n_ok = n) for n = 0..k under a per-depth profile (independent draws per depth)."""
    pairing = Pairing.parse(pairing)
    return nok_distribution_unchecked(check_profile(profile, k, pairing), k, pairing)


def nok_distribution_unchecked(prof, k: int, pairing: Pairing) -> list:
    """nok_distribution without its checks, for a profile already checked for k and a Pairing (the
    chooser of k = "auto" prices every k each round, and the checks would cost more than the sum)."""
    first = pairing.min_nok                          # n_ok reached before the MTP drafts are judged
    dist = [0.0] * (k + 1)
    reach = 1.0
    for j in range(pairing.judged_depths(k)):
        dist[first + j] += reach * (1.0 - prof[j])
        reach *= prof[j]
    dist[k] += reach
    return dist


def sample_nok(profile: tuple, k: int, pairing: Pairing, rng) -> int:
    """One draw of n_ok from a checked profile: walk the depths, stop at the first miss."""
    n = pairing.min_nok
    while n < k and rng.random() < profile[n - pairing.min_nok]:
        n += 1
    return n


class Schedule:
    """The n_ok the replay drafter forces, round by round.

    One of: seq (a list, cycled when it runs out), hist (expanded by hist_to_sequence and
    cycled), profile (one seeded draw per round). Checked when built (types, the pairing's
    minimum) and again against the run's k by `bind(k)`, which also expands a histogram (one
    round with n_ok == k moved last, see hist_to_sequence). `requested` records each round's
    value; a shrunk tail round of k_r < k drafts gets min(n, k_r). by="token" (with seq): seq[i]
    is the n_ok of a round that starts at emitted token i, so acceptance changes at a token of
    the run whatever k the rounds before took (k = "auto" studies).
    """

    def __init__(self, seq=None, hist=None, profile=None, pairing=Pairing.ARTICLE, seed: int = 0,
                 order: str = "shuffle", by: str = "round"):
        if sum(x is not None for x in (seq, hist, profile)) != 1:
            raise ScheduleError("a schedule needs exactly one of seq=, hist=, profile=")
        if by not in ("round", "token") or (by == "token" and seq is None):
            raise ScheduleError(f"by must be 'round', or 'token' with seq=; got by={by!r:.40}")
        self.by = by
        if not is_int(seed) or seed < 0:
            raise ScheduleError(f"the schedule's seed must be an int >= 0, got {seed!r:.40}")
        if order not in ("shuffle", "sorted", "given"):
            raise ScheduleError(f"order must be 'shuffle', 'sorted' or 'given', got {order!r:.40}")
        self.pairing, self.seed, self.order = Pairing.parse(pairing), int(seed), order
        self.profile = parse_profile(profile) if profile is not None else None
        self.hist = None
        if hist is not None:
            h = parse_hist(hist)
            self.hist = check_hist(h, max(h), self.pairing)
        self.given_seq = check_sequence(seq, None, self.pairing) if seq is not None else None
        self.k = None
        self.seq = self.given_seq
        if self.hist is not None:
            self.seq = hist_to_sequence(self.hist, order=order, seed=self.seed)
        self.reset()

    def bind(self, k: int) -> "Schedule":
        """Check against the run's k; expand a histogram for it."""
        self.bind_check(k)
        if self.hist is not None:
            self.seq = hist_to_sequence(self.hist, order=self.order, seed=self.seed, fit_k=k)
        self.k = k
        self.reset()
        return self

    def bind_check(self, k: int):
        """ScheduleError unless every round of k drafts can get what this schedule asks."""
        if self.hist is not None:
            check_hist(self.hist, k, self.pairing)
        elif self.given_seq is not None:
            check_sequence(self.given_seq, k, self.pairing)
        else:
            check_profile(self.profile, k, self.pairing)

    def reset(self):
        self.i = 0
        self.rng = np.random.default_rng(self.seed)
        self.requested = []

    def next(self, k_round: int, at: int = 0) -> int:
        """The n_ok of the next round, of k_round drafts, starting at emitted token `at`."""
        if self.k is None or k_round > self.k:
            self.bind_check(k_round)
        if self.seq is not None:
            n = self.seq[(at if self.by == "token" else self.i) % len(self.seq)]
        else:
            n = sample_nok(self.profile, k_round, self.pairing, self.rng)
        self.i += 1
        self.requested.append(n)
        return min(n, k_round)

    def describe(self) -> str:
        pr = self.pairing.value
        if self.profile is not None:
            return f"profile({', '.join(f'{a:.3f}' for a in self.profile)}; pairing={pr}, seed={self.seed})"
        if self.hist is not None:
            return f"hist({' '.join(f'{n}:{c}' for n, c in self.hist.items())}; pairing={pr})"
        return f"seq(len={len(self.seq)}{'; by token' if self.by == 'token' else ''}; pairing={pr})"
