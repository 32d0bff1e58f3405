"""Teacher-forced MTP acceptance (the article's E16) on a greedy reference stream.

For every anchor position i of the stream, with the MTP slot holding rows [0, i) built from
the verified stream (trained pairing: (t_{r+1}, h_r); the article's: (t_r, h_r)), chain the
MTP from the anchor exactly as the drafter would and compare each prediction with the
stream. With o = Pairing.offset (1 trained, 0 article):
  step 1 is (x = t_{i+o}, h = h_i) at q = i and should give t_{i+o+1}; depth j predicts
  t_{i+o+j}  (trained: d_1 = t_{i+1} itself is free)
the chain feeds its own prediction (x = pred, h = the MTP output), so it stops at the first miss.

Counts, as the article defines them (they reproduce E16's numbers exactly):
  N     anchors with a depth-1 target
  c_j   anchors where depths 1..j all hit
  e_j   anchors where depths 1..j-1 hit and a depth-j target exists
  alpha_j = c_j / e_j   (conditional hit rate of depth j)
  p_j     = c_j / N     (cumulative)
  E[len]  = 1 + sum_j p_j  (E16's token/round: the free token plus every hit depth)
  advance[k] = expected tokens per round with k drafts, E[max(n_ok, 1)] with n_ok = min(k, o + lead):
               1 + sum_{j = 2-o}^{k-o} p_j  (trained: 1 + p_1 + ... + p_{k-1}; article: 1 + p_2 + ... + p_k)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..engine import Engine, generate
from .errors import SpecArgumentError
from .inputs import check_length, check_size, check_tokens
from .pairing import Pairing


@dataclass
class Acceptance:
    pairing: Pairing
    depth: int
    N: int
    c: list                    # c[j-1] = c_j
    e: list                    # e[j-1] = e_j
    hits: list = field(default_factory=list)   # per anchor: list of 1/0 per evaluated depth
    anchors: list = field(default_factory=list)

    @property
    def alpha(self) -> list:
        return [(c / e) if e else None for c, e in zip(self.c, self.e)]

    @property
    def p(self) -> list:
        return [(c / self.N) if self.N else None for c in self.c]

    @property
    def E_len(self) -> float:
        return 1.0 + sum(x for x in self.p if x is not None)

    def advance(self, k: int) -> float:
        """Expected tokens per round with k drafts (see module doc)."""
        o = self.pairing.offset
        if self.pairing.judged_depths(k) > self.depth:
            raise SpecArgumentError(f"depth {self.depth} covers k <= {self.depth + o} for the {self.pairing.value} pairing")
        return self._advances()[k]

    def _advances(self) -> dict:
        """advance(k) for every k the depth covers, by one running sum (not one sum per k)."""
        p = [x or 0.0 for x in self.p]
        o, total, out = self.pairing.offset, 1.0, {}
        for k in range(1, self.depth + o + 1):
            if k - o - 1 >= max(1 - o, 0):
                total += p[k - o - 1]
            out[k] = total
        return out

    def profile(self) -> tuple:
        """alpha as a profile for the replay drafter (None -> 0)."""
        return tuple(a if a is not None else 0.0 for a in self.alpha)

    def line(self) -> str:
        parts = [f"alpha{j}={_f(a)} (p{j}={_f(p)})" for j, (a, p) in enumerate(zip(self.alpha, self.p), 1)]
        return f"[accept] pairing={self.pairing.value} N={self.N}: " + ", ".join(parts) + f"; E[len]={self.E_len:.3f} token/round"

    def to_dict(self) -> dict:
        return {"pairing": self.pairing.value, "depth": self.depth, "N": self.N, "c": list(self.c), "e": list(self.e),
                "alpha": self.alpha, "p": self.p, "E_len": self.E_len,
                "advance": self._advances()}


def _f(x):
    return "n/a" if x is None else f"{x:.3f}"


def teacher_forced(model, prompt, stream=None, T: int = 64, depth: int = 4, pairing=Pairing.TRAINED) -> Acceptance:
    """Per-depth MTP hit rates on the greedy stream after `prompt` (computed if not given).
    One prefill of prompt+stream, then per anchor a chain of up to `depth` MTP steps."""
    pairing = Pairing.parse(pairing)
    if not model.has_mtp:
        raise SpecArgumentError("teacher_forced: this model has no MTP head")
    prompt = check_tokens(prompt, model, "prompt")
    depth = check_size(depth, "depth")
    if stream is None:
        stream = generate(model, prompt, check_length(T, model, len(prompt)))
    stream = check_tokens(stream, model, "stream")
    check_length(len(stream), model, len(prompt))
    check_depth(depth, len(stream))
    toks = prompt + stream
    P, L = len(prompt), len(toks) - 1                 # L: last index with a token
    off = pairing.offset                              # depth j targets t_{i + off + j}
    first = P - 1
    last = L - off - 1                               # last anchor with a depth-1 target
    if last < first:
        raise SpecArgumentError("teacher_forced: the stream is too short for one anchor")
    be = model.be
    # MTP chains stop at the stream's end, so every position written lies below len(toks)
    eng = Engine(model, max_seq=min(len(toks) + depth + 2, model.cfg.max_position_embeddings), mmax=1, batch="flex")
    H = eng.prefill(toks).hidden

    def row(i):                                      # the verified MTP row i of this pairing
        return toks[i + off], H[i]

    if first >= 1:
        eng.mtp_fill(0, [toks[i + off] for i in range(first)], H[:first])
    c, e = [0] * depth, [0] * depth
    hits_all, anchors = [], []
    for i in range(first, last + 1):
        x, h, q = toks[i + off], H[i], i
        hits = []
        for j in range(1, depth + 1):
            tgt = i + off + j
            if tgt > L:
                break
            e[j - 1] += 1
            s = eng.mtp_step(q, x, h)
            pred = int(be.argmax(s.logits))
            ok = pred == toks[tgt]
            hits.append(int(ok))
            if not ok:
                break
            c[j - 1] += 1
            x, h, q = pred, s.hidden, q + 1
        hits_all.append(hits)
        anchors.append(i)
        eng.mtp_truncate(i)
        t, hh = row(i)
        eng.mtp_fill(i, t, hh)
    return Acceptance(pairing=pairing, depth=depth, N=len(anchors), c=c, e=e, hits=hits_all, anchors=anchors)


def check_depth(depth, T: int) -> int:
    """A chain of `depth` MTP steps predicts up to `depth` tokens past its anchor; beyond the
    stream's T tokens there is nothing to compare with, so depth <= T."""
    depth = check_size(depth, "depth")
    if depth > T:
        raise SpecArgumentError(f"depth={depth} exceeds the stream's T={T} tokens: no anchor has a target that deep")
    return depth


def combine(accs) -> Acceptance:
    """Counts over several streams (e.g. the six starts) add up."""
    accs = list(accs)
    if not accs:
        raise SpecArgumentError("combine: nothing to combine")
    a0 = accs[0]
    if any(a.pairing != a0.pairing or a.depth != a0.depth for a in accs):
        raise SpecArgumentError("combine: pairing and depth must match")
    return Acceptance(pairing=a0.pairing, depth=a0.depth, N=sum(a.N for a in accs),
                      c=[sum(a.c[j] for a in accs) for j in range(a0.depth)],
                      e=[sum(a.e[j] for a in accs) for j in range(a0.depth)],
                      hits=[h for a in accs for h in a.hits], anchors=[x for a in accs for x in a.anchors])


def implied_nok(acc: Acceptance, anchor: int, k: int) -> int:
    """n_ok a real round anchored at `anchor` with k drafts gets, per these hits: the free drafts
    (Pairing.offset) plus the leading MTP hits."""
    hits = acc.hits[acc.anchors.index(anchor)] if anchor in acc.anchors else []   # past the last anchor: no depth
    lead = 0
    for h in hits:
        if not h:
            break
        lead += 1
    return min(k, acc.pairing.offset + lead)
