"""Which (token, hidden) pair one MTP row holds: the article's pairing or the trained one.

  ARTICLE  rows pair (t_i, h_i). Every draft comes from the MTP: the first MTP step reads
           (t_p, h_p) and proposes d_1, which can miss. k drafts take k MTP steps.
  TRAINED  rows pair (t_{i+1}, h_i), the input the MTP head was trained on. d_1 =
           argmax(logits_p) is free (always accepted); the first MTP step reads (d_1, h_p) and
           proposes d_2. k drafts take k - 1 MTP steps.

Everything that depends on the pairing derives from one number, `offset`: how many drafts are
free (0 or 1), which is also how far the MTP's input token runs ahead of its hidden state.
"""
from __future__ import annotations

import enum

from .errors import SpecArgumentError


class Pairing(enum.Enum):
    ARTICLE = "article"
    TRAINED = "trained"

    @property
    def offset(self) -> int:
        """Free drafts per round (d_1 under TRAINED), and the MTP input token's lead over its hidden."""
        return 1 if self is Pairing.TRAINED else 0

    @property
    def min_nok(self) -> int:
        """The smallest n_ok a round can end with (the free drafts are always accepted)."""
        return self.offset

    def mtp_steps(self, k: int) -> int:
        """MTP steps one round's draft takes with k drafts."""
        return k - self.offset

    def judged_depths(self, k: int) -> int:
        """MTP predictions the verify judges in a round of k drafts (a profile needs this many rates)."""
        return k - self.offset

    def rewrite_rows(self, k: int, n_ok: int) -> int:
        """MTP rows the drafter must rewrite after a round (TRAINED: the rows past the first draft
        step's exact one; with k = 1 no draft step wrote a row, so all of them). It writes them at
        its next draft: in the chain's first pass, or by mtp_fill when there is no chain."""
        if self is Pairing.ARTICLE:
            return 0
        return n_ok - 1 if k >= 2 else n_ok

    @classmethod
    def parse(cls, x) -> "Pairing":
        if isinstance(x, Pairing):
            return x
        for p in cls:
            if x == p.value:
                return p
        raise SpecArgumentError(f"unknown pairing {x!r}; known: {PAIRINGS}")

    def __str__(self) -> str:
        return self.value


PAIRINGS = tuple(p.value for p in Pairing)
PAIRING_DOC = {
    Pairing.ARTICLE: "the article's pairing (t_i, h_i): every draft from the MTP, d_1 can miss",
    Pairing.TRAINED: "the trained pairing (t_{i+1}, h_i): d_1 = argmax(logits_p) free, the MTP drafts from d_2",
}
