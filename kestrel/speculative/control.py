"""The negative control at primitive level: does rollback() rewind the MTP cursor?"""
from __future__ import annotations

from ..engine import Engine
from .drafters import MTPArticleDrafter, RoundCtx, draft_tokens
from .inputs import check_size, check_tokens


def mtp_cursor_control(model, prompt, k: int = 3, include_mtp_cursor: bool = True) -> dict:
    """mark(); draft k MTP rows from the anchor; rollback(); draft again at the engine's MTP
    cursor. With the MTP cursor in the snapshot the second draft starts at p again and repeats
    the first exactly; without it the cursor stays at p+k, the second draft lands on other
    positions, sees the stale rows, and differs."""
    prompt = check_tokens(prompt, model, "prompt")
    k = check_size(k, "k")
    P = len(prompt)
    be = model.be
    eng = Engine(model, max_seq=P + 3 * k + 4, mmax=k, batch="flex")
    s = eng.prefill(prompt)
    d = MTPArticleDrafter()
    d.bind(model, None)
    d.start(eng, prompt, s.hidden)
    ctx = RoundCtx(p=P - 1, t_p=prompt[-1], h_p=s.hidden[P - 1], h_prev=s.hidden[max(P - 2, 0)],
                   a_p=int(be.argmax(s.logits[P - 1])), emitted=0, P=P)
    eng.mark(include_mtp_cursor=include_mtp_cursor)
    c0 = eng.mtp_cursor
    first = draft_tokens(d.draft(eng, ctx, k, eng.mtp_cursor))
    c1 = eng.mtp_cursor
    eng.rollback()
    c2 = eng.mtp_cursor
    second = draft_tokens(d.draft(eng, ctx, k, eng.mtp_cursor))
    return {"include_mtp_cursor": include_mtp_cursor, "cursor_at_mark": c0, "cursor_after_draft": c1,
            "cursor_after_rollback": c2, "first": first, "second": second, "same": first == second}
