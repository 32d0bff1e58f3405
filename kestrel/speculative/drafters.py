"""Drafters: who proposes d_1..d_k, and how each keeps the MTP slot.

The MTP head has its own KV cache and cursor (an independent slot). At every round start it
must hold rows [0, p) written and its cursor at p, or (the 'mtp' drafter) rows [0, p - m)
with the other m rows held by the drafter to write in its next chain's first pass; the engine's
contiguity rule on mtp_step catches a drafter that gets this wrong. Each drafter fills rows
0..p-1 after prefill, from the prompt's hiddens, in one batched mtp_fill, and re-establishes the
invariant after each round in `sync`. Only draft steps run the whole head (one mtp_draft chain a
round): the prompt's rows, whose drafts nobody reads, go through mtp_fill, which writes the same
KV bits without the head's MLP, norm and lm_head; a round's rewrite (trained pairing) rides in
the next chain's first pass, or goes through mtp_fill where there is no chain (k = 1) or in the
negative control.

  mtp-article  the article's pairing (Pairing.ARTICLE). Rows pair (t_i, h_i). Draft:
            mtp_step(q=p, x=t_p, h=h_p) -> d_1, then chain x = d_j, h = the previous MTP output,
            q += 1: k MTP steps, rows p..p+k-1, in one Engine.mtp_draft (the chain runs on the
            device and its tokens are read back once). Sync: keep the draft rows and truncate to p'
            (those rows hold confirmed tokens, with draft-time hiddens).
  mtp       the pairing the MTP was trained for (Pairing.TRAINED): (x = t_{i+1}, h = h_i)
            predicts t_{i+2}. Rows pair (t_{i+1}, h_i). d_1 = argmax(logits_p) (free, always
            accepted); then mtp_step(q=p, x=d_1, h=h_p) -> d_2, chain: k-1 MTP steps, rows
            p..p+k-2. Sync: row p = (d_1, h_p) is exact, keep it; truncate to min(cursor, p+1);
            rows up to p'-1 must be rewritten from the verified main hiddens. They are written
            by the next round's chain, in its first pass (mtp_draft's fill rows: one MTP pass of
            m+1 rows costs about what one row does, where a separate mtp_fill is a pass of its
            own). Until then they are the drafter's `pending_rows`: the MTP cursor is at p' minus
            them. (k = 1 wrote no row in the round, so the rewrite starts at p; with no chain to
            carry them, they go through mtp_fill at the next draft.)
  replay    an oracle forcing a given n_ok per round (a Schedule): it copies the greedy
            reference stream and corrupts draft n_ok+1, but still runs the real MTP steps of its
            pairing (like mtp-article or like mtp) so their cost is paid.

Deliberately wrong inputs (the bit-exact proof's blind spot), MTPDrafter(feed=...):
  'article-pairing'  the first MTP step gets x = t_p instead of d_1 (the article's pairing fed
                     to a drafter that reads its output as d_2)
  'stale-hidden'     the first MTP step gets h_{p-1} instead of h_p
The stream stays bit-exact (the main model's argmax decides every token); acceptance drops.

Trusting mode (`trusting=True`, only for the negative control of chapter 3): the driver took
mark() before the draft and relies on rollback() to rewind the MTP cursor; after a rollback
the drafter re-appends the round's confirmed rows at whatever the MTP cursor is.
"""
from __future__ import annotations

from ..draft import DraftFeed
from .errors import SpecArgumentError
from .pairing import Pairing
from .schedule import Schedule

DRAFTERS = ("mtp-article", "mtp", "replay")
FEEDS = ("correct", "article-pairing", "stale-hidden")


class RoundCtx:
    """What the driver knows at a round start (anchor p)."""
    __slots__ = ("p", "t_p", "h_p", "h_prev", "a_p", "emitted", "P")

    def __init__(self, p, t_p, h_p, h_prev, a_p, emitted, P):
        self.p, self.t_p, self.h_p, self.h_prev, self.a_p, self.emitted, self.P = p, t_p, h_p, h_prev, a_p, emitted, P


def _stack_rows(be, first, rows, n):
    """[first] + rows[:n-1] as one [n, D] backend array (first: [D]; rows: [m, D])."""
    xp = be.xp
    if n == 1:
        return first.reshape(1, -1)
    return xp.concatenate([first.reshape(1, -1), rows[:n - 1]], axis=0)


def draft_tokens(drafts) -> list:
    """A round's drafts as ints: a list as it is, a DraftFeed read (after the verify, no wait)."""
    return drafts.host() if isinstance(drafts, DraftFeed) else list(drafts)


class Drafter:
    name = "drafter"
    pairing = Pairing.ARTICLE

    def __init__(self):
        self.forced = None          # list of tokens replacing the MTP's argmax (replay oracle)
        self.q0 = None              # the MTP row the round's draft started at
        self.fill = None            # (tokens, hidden rows) confirmed rows the next chain writes first

    @property
    def pending_rows(self) -> int:
        """MTP rows up to p that are not written yet: the next draft's chain writes them first."""
        fill = getattr(self, "fill", None)          # a subclass that skipped __init__ holds none
        return 0 if fill is None else len(fill[0])

    def describe(self) -> str:
        return self.name

    # --- protocol -------------------------------------------------------------------------
    def bind(self, model, reference):
        self.model, self.be = model, model.be
        self.reference = reference

    def reset(self):
        pass

    def start(self, eng, tokens, hidden):
        """After prefill of `tokens` (positions 0..P-1, hiddens [P, D]): fill rows 0..P-2."""
        raise NotImplementedError

    def draft(self, eng, ctx: RoundCtx, k: int, q0: int):
        """d_1..d_k: a list of ints, or a DraftFeed whose drafted tokens are still on the device
        (a verify takes it as it is; draft_tokens() reads it)."""
        raise NotImplementedError

    def sync(self, eng, ctx: RoundCtx, consumed: list, hid_rows, rolled_back: bool, trusting: bool):
        """Re-establish the slot invariant: rows [0, p' - pending_rows) written, cursor there
        (p' = p + len(consumed)). hid_rows: [len(consumed), D] verified main hiddens of
        positions p+1..p'."""
        raise NotImplementedError

    def skip(self, eng, ctx: RoundCtx, token: int):
        """A round that drafted nothing (k = 0: a plain step consumed `token` at p+1). Row p of the
        slot pairs (t_{p+offset}, h_p): it is held like a round's rewrite, for the next chain's
        first pass (however many plain steps come first: a draft may never come again)."""
        x = int(token) if self.pairing.offset else int(ctx.t_p)
        toks, rows = self.fill if self.fill is not None else ([], [])
        rows = list(rows) if not isinstance(rows, list) else rows     # held as rows, stacked when written
        self.fill = (toks + [x], rows + [ctx.h_p.reshape(-1)])

    def _chain(self, eng, drafts: list, x, h, q: int, j0: int, k: int, keep: bool = False):
        """Drafts j = j0..k-1 by the MTP chain (one Engine.mtp_draft of k - j0 rows): row q reads
        (x, h), each next row the draft before it and that row's h'. The pending fill rows go
        first, in the chain's first pass (or through mtp_fill when there is no chain). keep:
        record the chain's inputs (the article pairing re-appends them in the negative control).
        -> the drafts: a list when all are known to the host (forced, or no chain), else a
        DraftFeed of `drafts` and the chain's tokens."""
        n = k - j0
        fill = self.fill
        if fill is not None and isinstance(fill[1], list):       # rows held one by one by skip()
            fill = (fill[0], self.be.xp.stack(fill[1]))
        m = 0 if fill is None else len(fill[0])
        if n <= 0:
            if fill is not None:
                eng.mtp_fill(q - m, fill[0], fill[1])
            self.fill = None                # written (a call that raised left them held)
            return drafts
        forced = None if self.forced is None else self.forced[j0:k]
        d = eng.mtp_draft(q - m, x, h, n, forced=forced, fill_tokens=None if fill is None else fill[0],
                          fill_hidden=None if fill is None else fill[1])
        self.fill = None
        if keep:
            self._chain_in = (x, h, d, forced)
        if forced is not None:
            return drafts + [int(t) for t in forced]
        return d.feed(drafts)


class MTPArticleDrafter(Drafter):
    name, pairing = "mtp-article", Pairing.ARTICLE

    def start(self, eng, tokens, hidden):
        P = len(tokens)
        self.fill = None
        if P >= 2:
            eng.mtp_fill(0, list(tokens[:P - 1]), hidden[:P - 1])

    def draft(self, eng, ctx, k, q0):
        self.q0 = q0
        return self._chain(eng, [], ctx.t_p, ctx.h_p, q0, 0, k, keep=True)

    def sync(self, eng, ctx, consumed, hid_rows, rolled_back, trusting):
        adv = len(consumed)
        if trusting and rolled_back:
            # trusts rollback() to have rewound the MTP cursor to the round's start: re-append
            # the confirmed rows (same inputs as drafted) at the cursor, no truncate
            x, h, d, forced = self._chain_in
            fed = d.tokens if forced is None else [int(t) for t in forced]
            xs = [x] + fed[:adv - 1]
            hs = self.be.xp.stack([h] + [d.hidden[i] for i in range(adv - 1)])
            eng.mtp_fill(eng.mtp_cursor, xs, hs)
        else:
            eng.mtp_truncate(self.q0 + adv)


class MTPDrafter(Drafter):
    name, pairing = "mtp", Pairing.TRAINED

    def __init__(self, feed: str = "correct"):
        super().__init__()
        if feed not in FEEDS:
            raise SpecArgumentError(f"feed must be one of {FEEDS}, got {feed!r}")
        self.feed = feed

    def describe(self):
        return self.name if self.feed == "correct" else f"{self.name}[feed={self.feed}]"

    def start(self, eng, tokens, hidden):
        P = len(tokens)
        self.fill = None
        if P >= 2:
            eng.mtp_fill(0, list(tokens[1:P]), hidden[:P - 1])

    def draft(self, eng, ctx, k, q0):
        d1 = self.forced[0] if self.forced is not None else ctx.a_p
        x = ctx.t_p if self.feed == "article-pairing" else d1
        h = ctx.h_prev if self.feed == "stale-hidden" else ctx.h_p
        self.q0 = q0
        return self._chain(eng, [d1], x, h, q0, 1, k)

    def sync(self, eng, ctx, consumed, hid_rows, rolled_back, trusting):
        adv = len(consumed)
        # rows p..p'-1 pair (t_{i+1}, h_i): tokens t_{p+1}..t_{p'}, hiddens h_p, h_{p+1}..h_{p'-1}
        if trusting and rolled_back:
            eng.mtp_fill(eng.mtp_cursor, list(consumed), _stack_rows(self.be, ctx.h_p, hid_rows, adv))
            return
        base = self.q0
        c = min(eng.mtp_cursor, base + 1)       # row p (the first draft step's) is exact: keep it
        eng.mtp_truncate(c)
        i = c - base
        if i < adv:
            rows = _stack_rows(self.be, ctx.h_p, hid_rows, adv)[i:adv]
            if trusting:        # the negative control drafts at the engine's cursor: write them now
                eng.mtp_fill(c, list(consumed[i:adv]), rows)
            else:               # the next chain writes them in its first pass
                self.fill = (list(consumed[i:adv]), rows)


class ReplayDrafter(Drafter):
    """Forces n_ok from a Schedule; runs the real MTP steps of its pairing."""
    name = "replay"

    def __init__(self, schedule: Schedule):
        super().__init__()
        if not isinstance(schedule, Schedule):
            raise SpecArgumentError(f"the replay drafter takes a spec.Schedule, got {type(schedule).__name__}")
        self.schedule = schedule
        self.pairing = schedule.pairing
        self.base = BASE_DRAFTER[self.pairing]()

    def describe(self):
        return f"replay[{self.schedule.describe()}]"

    def bind(self, model, reference):
        super().bind(model, reference)
        if reference is None:
            raise SpecArgumentError("the replay drafter needs the greedy reference stream "
                                    "(run with greedy=True or reference=...)")
        self.base.bind(model, reference)

    def reset(self):
        self.schedule.reset()

    @property
    def pending_rows(self) -> int:
        return self.base.pending_rows

    def start(self, eng, tokens, hidden):
        self.base.start(eng, tokens, hidden)

    def draft(self, eng, ctx, k, q0):
        ref, e = self.reference, ctx.emitted
        if e + k > len(ref):
            raise SpecArgumentError(f"replay drafter: reference has {len(ref)} tokens, round needs {e + k}")
        n = self.schedule.next(k, at=e)
        forced = [int(t) for t in ref[e:e + k]]
        if n < k:
            forced[n] = (forced[n] + 1) % self.model.cfg.vocab_size      # corrupt draft n+1
        if self.pairing.offset and forced[0] != ctx.a_p:
            raise SpecArgumentError(f"replay drafter ({self.pairing.value} pairing): reference token {forced[0]} != "
                                    f"argmax(logits_p) {ctx.a_p} (n_ok={n} forced; d_1 is free and cannot miss)")
        self.base.forced = forced
        drafts = self.base.draft(eng, ctx, k, q0)
        self.q0 = self.base.q0
        return drafts

    def sync(self, eng, ctx, consumed, hid_rows, rolled_back, trusting):
        self.base.sync(eng, ctx, consumed, hid_rows, rolled_back, trusting)

    def skip(self, eng, ctx, token):
        self.base.skip(eng, ctx, token)


BASE_DRAFTER = {Pairing.ARTICLE: MTPArticleDrafter, Pairing.TRAINED: MTPDrafter}


def make_drafter(name, *, schedule: Schedule | None = None, feed: str = "correct") -> Drafter:
    """'mtp-article' | 'mtp' | 'replay' (with schedule=) | a Drafter (returned as is)."""
    if isinstance(name, Drafter):
        if schedule is not None or feed != "correct":
            raise SpecArgumentError("schedule= and feed= configure a drafter by name; this one is built already")
        return name
    if name != "replay" and schedule is not None:
        raise SpecArgumentError(f"schedule= belongs to the replay drafter, not {name!r}")
    if name != "mtp" and feed != "correct":
        raise SpecArgumentError(f"feed= variants belong to the 'mtp' drafter, not {name!r}")
    if name == "mtp-article":
        return MTPArticleDrafter()
    if name == "mtp":
        return MTPDrafter(feed=feed)
    if name == "replay":
        if schedule is None:
            raise SpecArgumentError("the replay drafter needs schedule=spec.Schedule(hist=... | profile=... | seq=...)")
        return ReplayDrafter(schedule)
    raise SpecArgumentError(f"unknown drafter {name!r}; known: {DRAFTERS}")
