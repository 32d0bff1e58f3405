"""The book's deliberate mistakes (chapters 2-4), outside the protocol: a SpecRun whose choices at
the four places the protocol names (kestrel/speculative/round.py) are the wrong ones, switch by switch.

    run_spec(..., mistakes=Mistakes(emit_self=True), check=False)      # ghost tokens
"""
from __future__ import annotations

from dataclasses import dataclass

from ..draft import DraftFeed
from .round import SpecRun


@dataclass(frozen=True)
class Mistakes:
    """The deliberately wrong variants (for the book), all off by default.

    emit_self        also emit the self token: ghost (duplicated) tokens; the consumed == emitted
                     check raises unless check=False
    double_consume   verify [t_p, d_1..d_{k-1}] at p: position p consumed twice; the engine raises
                     CursorError
    mark_first       the negative control: mark() before the draft, and a driver that trusts
    mark_mtp_cursor  rollback() to rewind the MTP slot (drafts at the engine's MTP cursor). With
                     the MTP cursor in the snapshot (mark_mtp_cursor=True) the drafts equal the
                     standard run's; without it the MTP rows drift: other drafts, another
                     histogram (the stream stays bit-exact: the construction guarantee hides it)
    feed             the 'mtp' drafter's inputs: 'article-pairing' | 'stale-hidden' (bit-exact,
                     acceptance collapses)
    """
    emit_self: bool = False
    double_consume: bool = False
    mark_first: bool = False
    mark_mtp_cursor: bool = True
    feed: str = "correct"

    def on(self) -> dict:
        """The switches that differ from a correct run (recorded in the summary's variants)."""
        ref = Mistakes()
        return {k: v for k, v in vars(self).items() if v != getattr(ref, k)}


class MistakenRun(SpecRun):
    """A SpecRun with the switches of a Mistakes on (the driver makes one when any is)."""

    def __init__(self, *args, mistakes: Mistakes, **kw):
        super().__init__(*args, **kw)
        self.mistakes = mistakes
        self.trusting = mistakes.mark_first      # the negative control: the driver trusts the rewind

    def snapshot_before_draft(self, eng) -> bool:
        return self.mistakes.mark_first and self.policy.snapshot(eng, self.mistakes.mark_mtp_cursor)

    def verify_input(self, ctx, drafts, k: int) -> tuple:
        if self.mistakes.double_consume:      # the article's first verify: position p once more
            return ctx.p, drafts.after(ctx.t_p) if isinstance(drafts, DraftFeed) else [ctx.t_p] + drafts[:k - 1]
        return super().verify_input(ctx, drafts, k)

    def snapshot_before_verify(self, eng) -> bool:
        return not self.mistakes.mark_first and self.policy.snapshot(eng, self.mistakes.mark_mtp_cursor)

    def emitted(self, consumed: list, self_token) -> list:
        out = super().emitted(consumed, self_token)
        return out + [self_token] if self.mistakes.emit_self and self_token is not None else out   # the ghost token
