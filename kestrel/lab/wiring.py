"""Four ways to wire the MTP head wrong that inference engines have shipped (chapter 4).

Each keeps the stream bit-exact (the main model is untouched: every emitted token is still its
argmax) and each costs acceptance, so `memcmp = 0` cannot see any of them:

    pre-norm-hidden   the head reads the main model's last hidden state before the final norm
                      instead of after it
    cat-order         fc reads [hidden | embedding] where the head was trained on
                      [embedding | hidden]
    norm-shift-twice  the head's norms apply the zero-centred weight's +1 twice: x̂·(2 + w) where
                      the model means x̂·(1 + w) (weights stored with the +1 added, read by a
                      kernel that adds it again)
    chain-main-hidden each draft step after the first reads the main model's h_p again instead of
                      the previous step's output h' (the chain's own hidden)

How each is made here, with the engine unchanged:
  - cat-order and norm-shift-twice are weight-level: a Model sharing every main-model tensor
    with the right one, whose MTP tensors are changed so that the right program computes the
    wrong wiring. fc·[h | e] equals fc'·[e | h] with fc's two column halves swapped, and
    x̂·(1 + (w + 1)) is the doubled shift.
  - pre-norm-hidden: the drafter feeds h ⊘ (1 + w_norm) (w_norm: the final norm's weight) in
    place of h. The pre-norm residual x and the normed h = x̂·(1 + w_norm) differ by that
    weight and a per-row scale, and the head's own pre_fc_norm_hidden removes the per-row
    scale, so this is the wrong input up to the norm's epsilon.
  - chain-main-hidden: the drafter runs its chain one MTP row at a time (each an
    Engine.mtp_draft of k = 1, fed the previous row's argmax), every row reading h_p.

    res = wiring.run(model, "cat-order", prompt, T=64, k=3, policy="checkpoint", reference=ref)
    m, drafter = wiring.runner(model, "cat-order")      # to time it: spec.run_spec(m, ..., drafter=drafter)
"""
from __future__ import annotations

import numpy as np

import kestrel
from kestrel import speculative as spec
from kestrel.draft import DraftFeed
from kestrel.model import Model
from kestrel.speculative.drafters import MTPDrafter, RoundCtx

WIRINGS = ("correct", "pre-norm-hidden", "cat-order", "norm-shift-twice", "chain-main-hidden")
WHAT = {"correct": "[embedding | hidden], hidden after the final norm, h' chained",
        "pre-norm-hidden": "the hidden state before the final norm",
        "cat-order": "[hidden | embedding] concatenated",
        "norm-shift-twice": "the norms' +1 applied twice",
        "chain-main-hidden": "h_p chained instead of h'"}


def mistaken_model(model: Model, wiring: str) -> Model:
    """`model` with its MTP tensors changed so the right program computes `wiring` (the
    weight-level mistakes); the main model's tensors are the same objects."""
    if wiring not in ("cat-order", "norm-shift-twice"):
        raise ValueError(f"{wiring!r} is not a weight-level wiring (cat-order, norm-shift-twice)")
    be = model.be
    w = dict(model.w)
    if wiring == "cat-order":
        fc = be.to_numpy(model.w["mtp.fc.weight"])
        H = fc.shape[1] // 2
        w["mtp.fc.weight"] = np.ascontiguousarray(np.concatenate([fc[:, H:], fc[:, :H]], axis=1))
    else:
        for n in w:
            if n.startswith("mtp.") and n.endswith("norm.weight"):
                w[n] = be.to_numpy(model.w[n]) + np.float32(1.0)
    host = {n: (be.to_numpy(t) if n.startswith("mtp.") else t) for n, t in w.items()}
    m = Model(model.cfg, host, be, source=f"{model.source} [{wiring}]", weight_dtype=model.weight_dtype)
    m.tokenizer = getattr(model, "tokenizer", None)
    return m


class WiringDrafter(MTPDrafter):
    """The `mtp` drafter with a drafter-level wiring mistake (pre-norm-hidden, chain-main-hidden)."""

    def __init__(self, wiring: str):
        super().__init__()
        if wiring not in ("pre-norm-hidden", "chain-main-hidden"):
            raise ValueError(f"{wiring!r} is not a drafter-level wiring (pre-norm-hidden, chain-main-hidden)")
        self.wiring = wiring

    def describe(self):
        return f"mtp[wiring={self.wiring}]"

    def bind(self, model, reference):
        super().bind(model, reference)
        self.unnorm = 1.0 + model.w["norm.weight"]          # on the backend

    def _h(self, h):
        return h / self.unnorm if self.wiring == "pre-norm-hidden" else h

    def _ctx(self, ctx):
        return RoundCtx(ctx.p, ctx.t_p, self._h(ctx.h_p), self._h(ctx.h_prev), ctx.a_p, ctx.emitted, ctx.P)

    def start(self, eng, tokens, hidden):
        super().start(eng, tokens, self._h(hidden))

    def draft(self, eng, ctx, k, q0):
        return super().draft(eng, self._ctx(ctx), k, q0)

    def sync(self, eng, ctx, consumed, hid_rows, rolled_back, trusting):
        super().sync(eng, self._ctx(ctx), consumed, self._h(hid_rows), rolled_back, trusting)

    def skip(self, eng, ctx, token):
        super().skip(eng, self._ctx(ctx), token)

    def _chain(self, eng, drafts, x, h, q, j0, k, keep=False):
        if self.wiring != "chain-main-hidden" or k - j0 <= 1:
            return super()._chain(eng, drafts, x, h, q, j0, k, keep)
        out = [int(t) for t in (drafts.host() if isinstance(drafts, DraftFeed) else drafts)]
        for j in range(j0, k):                  # one row a call, every row reading h (= h_p)
            row = super()._chain(eng, [], x, h, q, j, j + 1)     # forced[j] when the replay oracle forces
            x = int(row.host()[-1] if isinstance(row, DraftFeed) else row[-1])
            out.append(x)
            q = eng.mtp_cursor
        return out


def runner(model: Model, wiring: str) -> tuple:
    """(the Model to run, the drafter) for `wiring`; `model` is the right one."""
    if wiring not in WIRINGS:
        raise ValueError(f"wiring must be one of {WIRINGS}, got {wiring!r}")
    if wiring in ("cat-order", "norm-shift-twice"):
        return mistaken_model(model, wiring), "mtp"
    return model, ("mtp" if wiring == "correct" else WiringDrafter(wiring))


def run(model: Model, wiring: str, prompt, T: int, k: int, policy: str = "checkpoint", reference=None,
        greedy: bool = False):
    """One speculative run of the trained pairing with `wiring`, checked against `reference`
    (the right model's greedy stream; computed when not given). greedy=True also times plain
    greedy decoding in the same call (the result's speedup)."""
    m, drafter = runner(model, wiring)
    ref = reference if reference is not None else kestrel.generate(model, prompt, T)
    return spec.run_spec(m, prompt, T=T, k=k, policy=policy, drafter=drafter, greedy=greedy, reference=ref)
