"""The GDN state ring: the live slot, the slots a verify writes, the one a round keeps; the input cache."""
from __future__ import annotations

import math

from .common import _Canvas, DiagramError, _fmt_bytes, _int, K_MAX, _n_ok, _policy, ROLE_DOC
from kestrel.speculative import cached_row_bytes, recurrent_bytes


def _ring_stage(policy: str, nslots: int, live: int, k: int, n_ok):
    """One picture of the ring: (role per slot, label per slot). n_ok None: after the verify;
    else after the policy's finalise step."""
    roles, labels = ["unused"] * nslots, [""] * nslots
    if n_ok is None:
        roles[live] = "live"
        labels[live] = {"checkpoint": "live<br>(kept)", "input-cache": "live<br>(read)"}.get(
            policy, "live<br>(in place)")
        if policy == "checkpoint":
            for j in range(k):
                s = (live + 1 + j) % nslots
                roles[s], labels[s] = "written", f"row {j}<br>(after d{j + 1})"
        return roles, labels
    if policy == "checkpoint":
        sel = (live + n_ok) % nslots
        for j in range(k):
            s = (live + 1 + j) % nslots
            roles[s], labels[s] = "discarded", f"row {j}"
        if sel != live:
            roles[live], labels[live] = "discarded", "was live"
        roles[sel] = "selected"
        labels[sel] = "live<br>(the original)" if n_ok == 0 else f"live<br>(after d{n_ok})"
        return roles, labels
    roles[live] = "selected"
    if policy == "input-cache":
        labels[live] = f"live<br>+ {n_ok} folded" if n_ok else "live<br>(nothing folded)"
    else:
        labels[live] = "live<br>(as verified)" if n_ok == k else "live<br>(restored)"
    return roles, labels


def _finalise_text(policy: str, k: int, n_ok: int) -> str:
    adv = max(n_ok, 1)
    step = "; then one step of a_p" if n_ok == 0 else ""
    if policy == "checkpoint":
        return f"after select_checkpoint({n_ok}){step}"
    if policy == "input-cache":
        return f"after fold_cached({n_ok}){step}"
    if n_ok == k:
        return "all accepted: nothing to undo"
    replay = f"{adv} M=1 step{'s' * (adv > 1)}" if policy == "replay" or n_ok == 0 else f"one step_m of {n_ok}"
    return f"after rollback() + {replay}"


def state_ring(nslots: int = 4, live: int = 0, k: int = 3, n_ok: int | None = None, policy: str = "checkpoint",
               *, cfg=None, title: str | None = None, height: int | None = None):
    """The GDN state ring of `nslots` slots (the engine holds mmax + 1) with its live slot.

    'checkpoint': the k slots a checkpointed verify writes (row j -> slot (live + 1 + j) mod
    nslots) and, once n_ok is given, beside it the ring after select_checkpoint(n_ok): slot
    (live + n_ok) mod nslots is live (n_ok = 0: the original, untouched). 'input-cache': the live
    slot (the verify only reads it) and k cached input rows, the first n_ok of them folded into
    the live slot. 'replay' / 'flex-replay': the live slot, updated in place, and mark()'s one
    copy of it. To the right, what the policy keeps besides the live state, as bars: to scale in
    bytes when a Config is given (cfg=), schematic otherwise."""
    nslots = _int(nslots, "nslots", 2, K_MAX + 1)
    live = _int(live, "live", 0, nslots - 1)
    k = _int(k, "k", 1, nslots - 1)
    n_ok = _n_ok(n_ok, k, None, allow_none=True)
    pol = _policy(policy)
    if cfg is not None and not (hasattr(cfg, "gdn_state_bytes") and hasattr(cfg, "gdn_layers")):
        raise DiagramError(f"cfg must be a kestrel Config (model.cfg or kestrel.PRESETS[...]), got {type(cfg).__name__}")
    cv = _Canvas()
    R = max(1.35, nslots * 1.25 / (2 * math.pi))
    h = 0.46                                           # half a slot's side
    stages = [("after the verify", None)] + ([] if n_ok is None else [("after accept", n_ok)])
    heading = {None: "after the verify"}
    if n_ok is not None:
        heading[n_ok] = _finalise_text(pol.name, k, n_ok)
    cx = 0.0                                           # the first ring (after the verify) at x = 0
    for stage, n in stages:
        roles, labels = _ring_stage(pol.name, nslots, live, k, n)
        for i in range(nslots):
            a = math.pi / 2 - 2 * math.pi * i / nslots     # slot 0 on top, clockwise
            x, y = cx + R * math.cos(a), R * math.sin(a)
            cv.rect(x - h, y - h, x + h, y + h, roles[i], f"{stage}: slot {i} ({roles[i]})")
            cv.text(x, y + h + 0.04, f"slot {i}", size=11, color="#333", anchor="top center")
            if labels[i]:
                cv.text(x, y, labels[i], size=10)
        if pol.name in ("replay", "flex-replay"):
            snap = "snapshot" if n is None or n == k else "discarded"
            # the box sits inside the ring (inner slot edges at R - h >= 0.89); two short lines fit it
            cv.rect(cx - 0.66, -0.32, cx + 0.66, 0.32, snap, f"{stage}: the snapshot ({snap})")
            cv.text(cx, 0, "mark()'s<br>copy" if n is None or n == k else "copied back<br>(now invalid)", size=10)
        else:
            cv.text(cx, 0, f"{nslots} slots", size=11, color="#777")
        cv.text(cx, R + h + 0.55, heading[n], size=12, color="#222", anchor="top center")
        cx += 2 * (R + h) + 1.3
    # beside the rings: the live state and what the policy keeps, to scale (cfg) or schematic
    s_bytes = recurrent_bytes(cfg) if cfg is not None else None
    below = len(stages) > 1                            # two rings: the bytes go under them
    x0, W = (-R - h, cx - 1.3 - (-R - h) - 3.0) if below else (cx - R - h - 0.2, 3.0)
    if pol.name == "checkpoint":
        unit, per = 1.0, s_bytes
        kept = [f"row {j}: a whole state" for j in range(k)]
    elif pol.name == "input-cache":
        unit = (cached_row_bytes(cfg) / s_bytes) if cfg is not None else 0.08
        per = cached_row_bytes(cfg) if cfg is not None else None
        kept = [f"row {j} (d{j + 1})" for j in range(k)]
    else:
        unit, per = 1.0, s_bytes
        kept = ["mark(): one copy of the state"]
    n_bars = 1 + len(kept)
    bar_h, gap = min(0.34, 2.2 / n_bars), 0.14
    y = -R - h - 1.25 if below else R + h - 0.35
    cv.text(x0, y + 0.45, "kept beside the live state", size=12, anchor="top right")
    cv.rect(x0, y - bar_h, x0 + W, y, "live", "bytes: the live state")
    cv.text(x0, y + 0.03, "live state S + conv window" + (f": {_fmt_bytes(s_bytes)}" if s_bytes else ""), size=10,
            anchor="top right")
    y -= 0.2
    for i, lab in enumerate(kept):
        y -= bar_h + gap
        w = W * unit                                   # to scale against the live state's bar
        role = {"checkpoint": "written", "input-cache": "cached"}.get(pol.name, "snapshot")
        if n_ok is not None:
            if pol.name == "input-cache":
                role = "folded" if i < n_ok else "dropped"
            elif pol.name == "checkpoint":
                role = "selected" if i + 1 == n_ok else "discarded"
            elif n_ok < k:
                role = "discarded"
        cv.rect(x0, y - bar_h, x0 + w, y, role, f"bytes: {lab} ({role})", thin=w < 0.1)
        cv.text(x0 + w + 0.08, y - bar_h / 2, lab + (f": {_fmt_bytes(per)}" if per else ""), size=10,
                anchor="middle right")
    y -= bar_h + 0.45
    if cfg is not None:
        kept_total = pol.state_traffic(cfg, k, k)["kept"]
        note = f"{cfg.name}, to scale: {_fmt_bytes(kept_total)} kept, {kept_total / s_bytes:.2g}× the state"
        if pol.name == "input-cache":
            note += (f"<br>a row: q|k|v, z, b, a of each GDN layer, "
                     f"{_fmt_bytes(cached_row_bytes(cfg) / max(1, len(cfg.gdn_layers)))} a layer")
    else:
        note = "lengths schematic: pass cfg= (a Config) for bytes to scale"
    cv.text(x0, y, note, size=10, color="#666", anchor="middle right")
    right = cx - 1.3 if below else x0 + W + (3.9 if pol.name == "checkpoint" else 2.9)
    xr = (-R - h - 0.3, max(right, x0 + W + 2.6))
    yr = (min(-R - h - 0.3, y - 0.5), R + h + 0.75)
    if height is None:                                 # about as tall as a ~700 px wide page needs
        height = int(150 + 700 * (yr[1] - yr[0]) / (xr[1] - xr[0]))
    used = {c["role"] for c in cv.rects}
    roles_used = [r for r in ROLE_DOC if r in used]
    if title is None:
        what = {"checkpoint": "per-row checkpoints", "input-cache": "input cache",
                "replay": "snapshot + replay", "flex-replay": "snapshot + batched replay"}[pol.name]
        sel = (live + n_ok) % nslots if (n_ok is not None and pol.name == "checkpoint") else live
        # short enough for a page-wide figure (~80 characters were cut off at the right edge)
        title = f"{what[0].upper()}{what[1:]}: k = {k}, {nslots} GDN slots" + (
            "" if n_ok is None else f", n_ok = {n_ok}: slot {sel} live next")
    fig = cv.figure(title, height, xr, yr, roles_used)
    if pol.name == "checkpoint" and n_ok:
        # live -> selected, clockwise just outside the first ring (centred at 0, 0): a straight
        # arrow would cross the centre and the labels of the slots between them
        ra, gap = R + h + 0.2, math.radians(22)
        a0 = math.pi / 2 - 2 * math.pi * live / nslots - gap
        a1 = math.pi / 2 - 2 * math.pi * (live + n_ok) / nslots + gap
        arc = [a0 + (a1 - a0) * i / 40 for i in range(41)]
        fig.add_scatter(x=[ra * math.cos(a) for a in arc], y=[ra * math.sin(a) for a in arc], mode="lines",
                        line=dict(color="#d94801", width=2.5), hoverinfo="skip", showlegend=False,
                        name="select_checkpoint: live -> selected")
        tail = a1 + math.radians(6)
        fig.add_annotation(x=ra * math.cos(a1), y=ra * math.sin(a1), ax=ra * math.cos(tail), ay=ra * math.sin(tail),
                           xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True, arrowhead=3,
                           arrowsize=1.3, arrowwidth=2.5, arrowcolor="#d94801")
    fig.update_layout(meta={"policy": pol.name, "nslots": nslots, "live": live, "k": k, "n_ok": n_ok,
                            "selected": None if n_ok is None else
                            ((live + n_ok) % nslots if pol.name == "checkpoint" else live)})
    return fig


# ---- the KV cursors and the MTP slot -----------------------------------------------------------------
