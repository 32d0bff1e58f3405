"""Counts over speculative rounds: n_ok histograms and conditional hit rates.

Attribution works on the distribution, not the mean (the article's correction): the same mean
acceptance 0.667 fits "0.67 every round" and "many zeros plus a few 2s". So every summary
carries the n_ok histogram, the first-draft hit rate and the conditional hit rates d_j | d_<j,
next to the means.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .schedule import advance

PHASES = ("draft", "mark", "verify", "undo", "replay", "sync", "bookkeeping")
PHASE_DOC = {
    "draft": "drafter: MTP steps (+ argmax of each); the trained pairing's rewrite of the confirmed rows rides in the chain's first pass",
    "mark": "mark(): copy every GDN S/hist (device to device), record cursors",
    "verify": "step_m(p+1, drafts) or verify_checkpointed(p+1, drafts)",
    "undo": "the policy's undo step: rollback() (copy S/hist back, restore cursors); checkpoint: "
            "select_checkpoint(n_ok) (no copy); input-cache: fold_cached(n_ok) (the accepted rows folded in)",
    "replay": "replay the accepted rows (M=1 steps or one batch), or the n_ok=0 step",
    "sync": "drafter keeps the MTP slot: truncate (the trained pairing holds the rows to rewrite for its next chain)",
    "bookkeeping": "accept/emit: argmax of the verify rows, checks, argmax(logits_p') unless it is a verify row's",
}


@dataclass
class CondHit:
    """Draft d_j judged `of` times (rounds with k_r >= j and n_ok >= j-1), accepted `hit` times.
    hit/of are None where only the rate was kept (older results files)."""
    j: int
    rate: float | None
    hit: int | None = None
    of: int | None = None

    @property
    def label(self) -> str:
        return "first-draft hit" if self.j == 1 else f"d{self.j}|" + "".join(f"d{i}" for i in range(1, self.j))


class NokCounts:
    """What follows from a histogram `hist` {n_ok: rounds} and `cond_hits` [CondHit]."""
    hist: dict
    cond_hits: list

    @property
    def rounds(self) -> int:
        return sum(self.hist.values())

    @property
    def accepted(self) -> int:
        return sum(n * c for n, c in self.hist.items())

    @property
    def advanced(self) -> int:
        return sum(advance(n) * c for n, c in self.hist.items())

    @property
    def zero_rounds(self) -> int:
        return self.hist.get(0, 0)

    @property
    def mean_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def advance_per_round(self) -> float:
        return self.advanced / self.rounds if self.rounds else 0.0

    @property
    def first_draft_hit(self) -> float | None:
        return self.cond_hits[0].rate if self.cond_hits else None


@dataclass
class NokStats(NokCounts):
    hist: dict
    cond_hits: list = field(default_factory=list)


def histogram(noks, k: int | None = None) -> dict:
    k = max(noks, default=0) if k is None else k
    h = {n: 0 for n in range(k + 1)}
    for n in noks:
        h[int(n)] = h.get(int(n), 0) + 1
    return h


def conditional_hits(noks, ks) -> list:
    """[CondHit] for j = 1..max(k): rounds that judged d_j (k_r >= j and n_ok >= j-1) and those
    where it hit. j = 1 is the first-draft hit rate."""
    out = []
    for j in range(1, max(ks, default=0) + 1):
        of = sum(1 for n, k in zip(noks, ks) if k >= j and n >= j - 1)
        hit = sum(1 for n, k in zip(noks, ks) if k >= j and n >= j)
        out.append(CondHit(j=j, rate=(hit / of) if of else None, hit=hit, of=of))
    return out


def summarize_noks(noks, ks=None, k: int | None = None) -> NokStats:
    """Histogram and conditional hits from n_ok values (and each round's k; default k for all)."""
    noks = [int(n) for n in noks]
    if ks is None:
        ks = [k if k is not None else max(noks, default=0)] * len(noks)
    kmax = max(ks, default=0) if k is None else k
    return NokStats(hist=histogram(noks, kmax), cond_hits=conditional_hits(noks, ks))
