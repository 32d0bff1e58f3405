"""Summaries of speculative rounds and the seed's log lines (SPEC §5).

Attribution works on the distribution, not the mean (the seed's §4.3 correction): the same
mean acceptance 0.667 fits "0.67 every round" and "many zeros plus a few 2s". So every
summary carries the n_ok histogram, the first-draft hit rate and the conditional hit rates
d_j | d_<j, next to the means.
"""
from __future__ import annotations

from .schedule import advance, format_hist

PHASES = ("draft", "mark", "verify", "rollback", "replay", "sync", "book")
PHASE_DOC = {
    "draft": "drafter: MTP steps (+ argmax of each)",
    "mark": "mark(): copy every GDN S/hist (device to device), record cursors",
    "verify": "step_m(p+1, drafts) or verify_checkpointed(p+1, drafts)",
    "rollback": "rollback(): copy S/hist back, restore cursors; checkpoint: select_checkpoint(n_ok) (no copy)",
    "replay": "replay the accepted rows (M=1 steps or one batch), or the n_ok=0 step",
    "sync": "drafter keeps the MTP slot: truncate (+ batched rewrite for 'mtp')",
    "book": "accept/emit: argmax of the verify rows, checks, argmax(logits_p')",
}


def histogram(noks, k: int | None = None) -> dict:
    k = max(noks, default=0) if k is None else k
    h = {n: 0 for n in range(k + 1)}
    for n in noks:
        h[int(n)] = h.get(int(n), 0) + 1
    return h


def conditional_hits(noks, ks) -> list:
    """For j = 1..max(k): rounds that judged d_j (k_r >= j and n_ok >= j-1) and those where it hit.
    Returns [{'j', 'hit', 'of', 'rate'}]. j = 1 is the first-draft hit rate."""
    out = []
    for j in range(1, max(ks, default=0) + 1):
        of = sum(1 for n, k in zip(noks, ks) if k >= j and n >= j - 1)
        hit = sum(1 for n, k in zip(noks, ks) if k >= j and n >= j)
        out.append({"j": j, "hit": hit, "of": of, "rate": (hit / of) if of else None})
    return out


def summarize_noks(noks, ks=None, k: int | None = None) -> dict:
    """The count-only part of a summary, from n_ok values (and each round's k)."""
    noks = [int(n) for n in noks]
    if ks is None:
        ks = [k if k is not None else max(noks, default=0)] * len(noks)
    kmax = max(ks, default=0) if k is None else k
    rounds = len(noks)
    acc = sum(noks)
    adv = sum(advance(n) for n in noks)
    cond = conditional_hits(noks, ks)
    return {
        "rounds": rounds, "accepted": acc, "advanced": adv,
        "mean_per_round": acc / rounds if rounds else 0.0,
        "advance_per_round": adv / rounds if rounds else 0.0,
        "zero_rounds": sum(1 for n in noks if n == 0),
        "hist": histogram(noks, kmax),
        "first_draft_hit": cond[0]["rate"] if cond else None,
        "cond_hits": cond,
    }


def _f(x, nd=3):
    return "n/a" if x is None else f"{x:.{nd}f}"


def cond_line(cond) -> str:
    parts = []
    for c in cond:
        j = c["j"]
        label = "first-draft hit" if j == 1 else f"d{j}|" + "".join(f"d{i}" for i in range(1, j))
        parts.append(f"{label} {c['hit']}/{c['of']}={_f(c['rate'])}")
    return "[spec] " + "; ".join(parts)


def log_lines(s: dict) -> list:
    """The seed's log lines (§3.4) for a summary dict (from SpecResult.summary() or aggregate())."""
    lines = []
    T = s.get("T")
    if s.get("greedy_ms") is not None:
        lines.append(f"[spec] A (greedy, MTP off) {T} tokens: {s['greedy_ms']:.1f} ms "
                     f"({s['greedy_ms_per_token']:.3f} ms/token)")
    if s.get("spec_ms") is not None:
        sp = f" => speedup {s['speedup']:.3f}x" if s.get("speedup") is not None else ""
        lines.append(f"[spec] B (spec, k={s.get('k')}, policy={s.get('policy')}, drafter={s.get('drafter')}) "
                     f"{T} tokens: {s['spec_ms']:.1f} ms ({s['ms_per_token']:.3f} ms/token){sp}")
    lines.append(f"[spec] rounds={s['rounds']} accepted={s['accepted']} mean/round={s['mean_per_round']:.3f} "
                 f"=> advance/round={s['advance_per_round']:.3f} (n_ok=0 rounds={s['zero_rounds']})")
    lines.append(f"[spec] n_ok histogram: {format_hist(s['hist'])}")
    if s.get("cond_hits"):
        lines.append(cond_line(s["cond_hits"]))
    if s.get("tail_tokens"):
        lines.append(f"[spec] tail: {s['tail_tokens']} token(s) by plain M=1 steps ({s.get('tail_reason', '')})")
    if s.get("bit_exact") is not None:
        if s["bit_exact"]:
            lines.append("[spec] token stream memcmp=0 => PASS (byte-identical to greedy)")
        else:
            lines.append(f"[spec] token stream memcmp!=0 => FAIL (first difference at token {s.get('first_diff')})")
    return lines
