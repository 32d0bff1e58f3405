"""A draft chain's result, and verify tokens taken from it without a trip through the host.

A speculative round drafts k tokens and verifies them at once. If the host had to read the
drafts before it could launch the verify, the GPU would sit idle for that read and for all the
host work that follows it, once a round. So `Engine.mtp_draft` returns a Draft whose tokens stay
where the chain left them (on the device under CUDA), and a verify takes a DraftFeed: a few
tokens the host already knows (the free d_1 of the trained pairing) followed by the first n
tokens of a Draft. The CUDA backend copies those into the verify's control block on the device;
the host reads the drafts after the verify, right after the verify rows' argmax (the round waits
for the device once there, and once before the chain, where mtp_draft checks its hidden rows).
On the CPU backend the tokens are host arrays from the start and nothing changes.
"""
from __future__ import annotations

import numpy as np

from .errors import TokenError
from .inputs import count, is_int


def _host_ids(values, what: str) -> tuple:
    """A sequence of Python/NumPy ints (never bools) -> a tuple of Python ints; the range is the
    verify's to check (it knows the vocabulary)."""
    if isinstance(values, (str, bytes, bytearray, dict)) or not hasattr(values, "__iter__"):
        raise TokenError(f"{what} must be a sequence of int token ids, got {values!r:.40} ({type(values).__name__})")
    out = []
    for v in values:
        if isinstance(v, np.ndarray) and v.ndim == 0:
            v = v[()]
        if not is_int(v):
            kind = "the bool" if isinstance(v, (bool, np.bool_)) else "a"
            raise TokenError(f"{what}: token ids must be ints, got {kind} {v!r:.40} ({type(v).__name__})")
        out.append(int(v))
    return tuple(out)


class Draft:
    """mtp_draft's result: the k rows' argmax tokens (the MTP head's drafts; with forced tokens
    the chain is fed those, but each row's argmax is still what it drafted) and the rows' h'
    [k, D] (after mtp.norm, on the backend). `tokens` reads the tokens to the host on first use (a
    wait for the chain under CUDA) and keeps them."""

    def __init__(self, tokens, hidden, owner=None):
        self.hidden = hidden
        self.owner = owner                 # the Engine whose backend holds the tokens (None: host tokens)
        self.chained_by = None             # set by Engine.mtp_draft: the engine whose chain wrote them
        if isinstance(tokens, (list, tuple)):
            self._dev, self._host = None, list(_host_ids(tokens, "Draft: tokens"))
        else:
            self._dev, self._host = tokens, None

    def __len__(self) -> int:
        return len(self._host) if self._host is not None else int(self._dev.shape[0])

    def _fill(self, tokens, hidden):
        """Set the chain's outputs of a Draft made before its chain ran (a batched engine runs
        several sequences' chains together, after each round has been begun). tokens: a backend
        array, or ints the host has read already."""
        if isinstance(tokens, (list, tuple)):
            self._dev, self._host = None, [int(t) for t in tokens]
        else:
            self._dev, self._host = tokens, None
        self.hidden = hidden

    @property
    def tokens(self) -> list:
        if self._host is None:
            be = self.owner.be if self.owner is not None else None
            arr = be.to_numpy(self._dev) if be is not None else np.asarray(self._dev)
            self._host = [int(t) for t in arr.reshape(-1)]
        return self._host

    @property
    def device_tokens(self):
        """The tokens as the chain left them (a backend int array), None if built from a list."""
        return self._dev

    def feed(self, head=(), n: int | None = None) -> "DraftFeed":
        """Verify tokens: `head` (ints the host knows), then this draft's first n tokens (all)."""
        return DraftFeed(head, self, len(self) if n is None else n)     # ids' range checked by the verify

    def __repr__(self) -> str:
        toks = self._host if self._host is not None else "on the device"
        return f"Draft(k={len(self)}, tokens={toks})"


class DraftFeed:
    """Tokens for a verify: head (host ints) + the first n tokens of a Draft, in that order."""
    __slots__ = ("head", "draft", "n")

    def __init__(self, head, draft: Draft, n: int):
        if not isinstance(draft, Draft):
            raise TokenError(f"DraftFeed: draft must be a kestrel Draft, got {type(draft).__name__}")
        self.head = _host_ids(head, "DraftFeed: head")
        n = count(n, "DraftFeed: n", 0, None, error=TokenError)
        if n > len(draft):
            raise TokenError(f"DraftFeed: n={n} outside [0, {len(draft)}] (the draft's tokens)")
        self.n = n
        self.draft = draft

    def __len__(self) -> int:
        return len(self.head) + self.n

    def host(self) -> list:
        """The tokens as ints (reads the draft's tokens if they are still on the device)."""
        return list(self.head) + self.draft.tokens[:self.n]

    def after(self, token: int) -> "DraftFeed":
        """[token] + these tokens without the last: the same number of tokens, one place later."""
        head = _host_ids([token], "DraftFeed.after: token") + self.head
        if self.n >= 1:
            return DraftFeed(head, self.draft, self.n - 1)
        return DraftFeed(head[:len(self)], self.draft, 0)

    def __repr__(self) -> str:
        return f"DraftFeed(head={list(self.head)}, {self.n} of {self.draft!r})"
