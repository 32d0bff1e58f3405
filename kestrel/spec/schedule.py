"""n_ok schedules: histograms, sequences and per-depth acceptance profiles.

An n_ok histogram is a dict {n_ok: rounds}; the seed writes it `0:24 1:6 2:11 3:4`
(also accepted: `n_ok=0:24 n_ok=1:6 ...`, commas instead of spaces).

A per-depth acceptance profile alpha_j is the conditional hit rate of the j-th MTP prediction
given that all earlier ones hit (the seed's E16 on Qwen3.5-27B: 0.714, 0.364, 0.500, 0.750).
Which draft it applies to depends on the pairing:
  pairing "seed"  every draft comes from the MTP: alpha_1 is d_1's hit rate, alpha_2 is d_2 | d_1, ...
  pairing "mtp"   d_1 = argmax(logits_p) is free (always accepted); alpha_1 is d_2 | d_1,
                  alpha_2 is d_3 | d_1 d_2, ... (the profile applies from d_2)
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import KestrelError

SEED_HIST = {0: 24, 1: 6, 2: 11, 3: 4}          # seed §3.4: T=64, k=3, 45 rounds, 40 accepted
SEED_HIST_STR = "0:24 1:6 2:11 3:4"
E16_PROFILE = (0.714, 0.364, 0.500, 0.750)       # seed §5 CPU/GPU check "E16", teacher-forced, T=63
PAIRINGS = ("seed", "mtp")


def parse_hist(h) -> dict:
    """'0:24 1:6 2:11 3:4' | 'n_ok=0:24 ...' | {0: 24, ...} -> {0: 24, 1: 6, 2: 11, 3: 4}."""
    if isinstance(h, dict):
        out = {int(n): int(c) for n, c in h.items()}
    elif isinstance(h, str):
        out = {}
        for part in re.split(r"[\s,;]+", h.strip()):
            if not part:
                continue
            m = re.fullmatch(r"(?:n_ok=)?(\d+):(\d+)", part)
            if not m:
                raise KestrelError(f"histogram entry {part!r} is not 'n:count' (e.g. '0:24 1:6 2:11 3:4')")
            out[int(m.group(1))] = out.get(int(m.group(1)), 0) + int(m.group(2))
    else:
        raise KestrelError(f"a histogram is a 'n:count ...' string or a dict, got {type(h).__name__}")
    if any(n < 0 or c < 0 for n, c in out.items()):
        raise KestrelError(f"histogram entries must be non-negative, got {out}")
    if sum(out.values()) == 0:
        raise KestrelError("histogram has no rounds")
    return dict(sorted(out.items()))


def format_hist(hist: dict, k: int | None = None) -> str:
    """{0: 24, ...} -> 'n_ok=0:24 n_ok=1:6 n_ok=2:11 n_ok=3:4' (every n in 0..k when k is given)."""
    keys = range(0, (k if k is not None else max(hist)) + 1)
    return " ".join(f"n_ok={n}:{hist.get(n, 0)}" for n in keys)


def advance(n_ok: int) -> int:
    """Tokens one round emits (and the main model consumes): max(n_ok, 1)."""
    return max(int(n_ok), 1)


def hist_to_sequence(hist, order: str = "shuffle", seed: int = 0, fit_k: int | None = None) -> list:
    """Expand a histogram into a sequence of n_ok values.

    order: 'shuffle' (seeded permutation), 'sorted' (ascending), 'given' (n = 0, 1, ... blocks).
    fit_k: move one round with n_ok == fit_k to the end. A strict run of T = sum(max(n,1))
    tokens then ends exactly on a round: its last round starts with fit_k tokens left, so the
    tail (< k left) never starts and every requested round happens. (The seed's T=64, k=3
    run: 45 rounds, 24+6+22+12 = 64 tokens.)
    """
    hist = parse_hist(hist)
    seq = [n for n, c in hist.items() for _ in range(c)]
    if order == "shuffle":
        seq = [int(x) for x in np.random.default_rng(seed).permutation(seq)]
    elif order == "sorted":
        seq = sorted(seq)
    elif order != "given":
        raise KestrelError(f"order must be 'shuffle', 'sorted' or 'given', got {order!r}")
    if fit_k is not None and fit_k in seq:
        i = len(seq) - 1 - seq[::-1].index(fit_k)
        seq.append(seq.pop(i))
    return seq


def check_profile(profile) -> tuple:
    prof = tuple(float(a) for a in profile)
    if not prof or any(not 0.0 <= a <= 1.0 for a in prof):
        raise KestrelError(f"an acceptance profile is a non-empty list of rates in [0, 1], got {profile!r}")
    return prof


def parse_profile(s) -> tuple:
    if isinstance(s, str):
        return check_profile(float(x) for x in re.split(r"[\s,;]+", s.strip()) if x)
    return check_profile(s)


def nok_distribution(profile, k: int, pairing: str = "seed") -> list:
    """P(n_ok = n) for n = 0..k under a per-depth profile (independent draws per depth)."""
    prof = check_profile(profile)
    if pairing not in PAIRINGS:
        raise KestrelError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    first = 0 if pairing == "seed" else 1            # n_ok reached before the MTP drafts are judged
    depths = k - first                                # MTP drafts judged by the verify
    if depths > len(prof):
        raise KestrelError(f"profile has {len(prof)} depths; k={k} with pairing {pairing!r} needs {depths}")
    dist = [0.0] * (k + 1)
    reach = 1.0
    for j in range(depths):
        dist[first + j] += reach * (1.0 - prof[j])
        reach *= prof[j]
    dist[k] += reach
    return dist


def sample_nok(profile, k: int, pairing: str, rng) -> int:
    """One draw of n_ok: walk the depths, stop at the first miss."""
    prof = check_profile(profile)
    n = 0 if pairing == "seed" else 1
    while n < k:
        j = n - (0 if pairing == "seed" else 1)
        if j >= len(prof):
            raise KestrelError(f"profile has {len(prof)} depths; k={k} with pairing {pairing!r} needs more")
        if rng.random() < prof[j]:
            n += 1
        else:
            break
    return n


class Schedule:
    """The n_ok the replay drafter forces, round by round.

    One of: seq (a list, cycled when it runs out), hist (expanded by hist_to_sequence and
    cycled), profile (one seeded draw per round). `requested` records each round's value.
    """

    def __init__(self, seq=None, hist=None, profile=None, pairing: str = "seed", seed: int = 0,
                 order: str = "shuffle", fit_k: int | None = None):
        given = [x is not None for x in (seq, hist, profile)]
        if sum(given) != 1:
            raise KestrelError("a schedule needs exactly one of seq=, hist=, profile=")
        if pairing not in PAIRINGS:
            raise KestrelError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
        self.pairing, self.seed = pairing, seed
        self.profile = parse_profile(profile) if profile is not None else None
        if hist is not None:
            self.hist = parse_hist(hist)
            seq = hist_to_sequence(self.hist, order=order, seed=seed, fit_k=fit_k)
        else:
            self.hist = None
        self.seq = None if seq is None else [int(n) for n in seq]
        if self.seq is not None:
            if not self.seq or any(n < 0 for n in self.seq):
                raise KestrelError(f"an n_ok sequence is a non-empty list of non-negative ints, got {seq!r}")
            if pairing == "mtp" and 0 in self.seq:
                raise KestrelError("pairing 'mtp' makes d_1 = argmax(logits_p) free: n_ok = 0 cannot be forced")
        self.reset()

    def reset(self):
        self.i = 0
        self.rng = np.random.default_rng(self.seed)
        self.requested = []

    def next(self, k: int) -> int:
        if self.seq is not None:
            n = self.seq[self.i % len(self.seq)]
        else:
            n = sample_nok(self.profile, k, self.pairing, self.rng)
        self.i += 1
        self.requested.append(n)
        return min(n, k)

    def describe(self) -> str:
        if self.profile is not None:
            return f"profile({', '.join(f'{a:.3f}' for a in self.profile)}; pairing={self.pairing}, seed={self.seed})"
        if self.hist is not None:
            return f"hist({' '.join(f'{n}:{c}' for n, c in self.hist.items())}; pairing={self.pairing})"
        return f"seq(len={len(self.seq)}; pairing={self.pairing})"
