"""The KV cursors through a round, beside the MTP head's own slot."""
from __future__ import annotations

from .common import _Canvas, _int, K_MAX, legend_below, _n_ok, _pairing, ROLE_STYLE
from kestrel.speculative.schedule import advance


ROW_PITCH = 1.8        # y distance between two rows of cells (data units)
CELL_H = 0.8           # a cell's height
LABEL_GAP = 0.12       # a cursor label's bottom edge above its row's cells
LABEL_PT = 10          # the cursor labels' font size (px)


def _mtp_rows(pairing, k: int, n: int, m0: int, p: int):
    """The MTP slot through a round: (rows the draft writes {row: input token}, cursor after the
    draft, cursor after the sync, rows after the sync {row: (token, how)}: how is "kept" or
    "held" (the trained pairing's rows the next chain rewrites in its first pass))."""
    adv = advance(n)
    if pairing.offset == 0:                     # article: row m0+j holds (d_j or t_p, h)
        drafted = {m0 + j: ("t_p" if j == 0 else f"d{j}") for j in range(k)}
        after_draft = m0 + k
        kept = {m0 + i: (drafted[m0 + i], "kept") for i in range(adv)}
        return drafted, after_draft, m0 + adv, kept
    # trained: rows m0..p-1 are the ones the last round left to rewrite (written first, in this
    # chain's first pass, or by an mtp_fill when k = 1); row p+j holds (d_{j+1}, h)
    held, base = max(p - m0, 0), max(m0, p)     # base > p: a cursor off the invariant (the negative control)
    drafted = {p - held + i: "rw" for i in range(held)}
    drafted.update({base + j: f"d{j + 1}" for j in range(k - 1)})
    after_draft = base + k - 1
    c = min(after_draft, base + 1)
    kept = {r: (drafted[r], "kept") for r in range(base, c)}
    for r in range(c, base + adv):
        kept[r] = (f"d{r - base + 1}", "held")
    return drafted, after_draft, c, kept


def cursors(pos: int = 12, k: int = 3, n_ok: int = 1, mtp_cursor: int | None = None, *, pairing="article",
            title: str | None = None, height: int = 580):
    """The main model's KV cache rows and its cursor (the visible length) through one round, and
    the MTP head's own KV slot and cursor beside it.

    pos is the cursor at the round start (the anchor p = pos - 1 has been consumed). The verify
    appends rows pos..pos+k-1 (the drafts); after accepting n_ok the cursor is pos + max(n_ok, 1)
    (for n_ok = 0 the row at pos is rewritten by the step of a_p); rows past it are invisible and
    overwritten by the next append. The MTP cursor starts at p (mtp_cursor=None) and, after the
    draft and the sync, ends at p + max(n_ok, 1) under the article pairing. Under the trained
    pairing the sync keeps row p and leaves the rows up to p + n_ok - 1 to the next chain (its
    first pass rewrites them from the verified hiddens): the cursor ends at p + 1 (at p when
    k = 1: no chain row was written, all n_ok rows are left), and the next round starts with the
    MTP cursor that far below p'. pairing as in round_timeline."""
    pr = _pairing(pairing)
    pos = _int(pos, "pos", 1, 100000)
    k = _int(k, "k", 1, K_MAX)
    n = _n_ok(n_ok, k, pr)
    m0 = pos - 1 if mtp_cursor is None else _int(mtp_cursor, "mtp_cursor", 0, pos + 4 * K_MAX)
    adv = advance(n)
    after = pos + adv
    drafted, m_draft, m_after, m_kept = _mtp_rows(pr, k, n, m0, pos - 1)
    held_at_start = pr.offset == 1 and m0 < pos - 1       # rows the last round left to this chain
    lo = max(0, min(pos, m0) - 5)
    hi = max(pos + k, m_draft, m_after) + 2
    cv = _Canvas()
    rows = [("main KV: round start", "main", 0), ("main KV: after the verify", "main", 1),
            ("main KV: after accept", "main", 2), ("MTP KV: round start", "mtp", 3),
            ("MTP KV: after the draft", "mtp", 4), ("MTP KV: after the sync", "mtp", 5)]
    # a row's cursor label sits in the gap above its own cells: the pitch leaves room for one
    # line of label text between a row's boxes and the boxes of the row above
    ys = {i: -(i * ROW_PITCH + (0.5 if i >= 3 else 0.0)) for i in range(6)}
    cell_h = CELL_H

    def cell(i, x, role, text, color="#222"):
        y = ys[i]
        cv.rect(x + 0.05, y - cell_h / 2, x + 0.95, y + cell_h / 2, role, f"row {x} ({rows[i][0]})", row=x,
                stage=rows[i][0])
        if text:
            cv.text(x + 0.5, y, text, size=10, color=color)

    for x in range(lo, hi):
        # main model: consumed rows, the verify's draft rows, what accept keeps
        cell(0, x, "live" if x < pos else "unused", "")
        if x < pos:
            cell(1, x, "live", "")
            cell(2, x, "live", "")
        elif x < pos + k:
            d = f"d{x - pos + 1}"
            cell(1, x, "written", d)
            if x < pos + n:
                cell(2, x, "selected", d)
            elif n == 0 and x == pos:
                cell(2, x, "selected", "a_p")
            else:
                cell(2, x, "discarded", d, color="#999")
        else:
            cell(1, x, "unused", "")
            cell(2, x, "unused", "")
        # the MTP slot
        cell(3, x, "cached" if x < m0 else ("folded" if held_at_start and x < pos - 1 else "unused"), "")
        if x < m0:
            cell(4, x, "cached", "")
            cell(5, x, "cached", "")
        else:
            cell(4, x, "written" if x in drafted else "unused", drafted.get(x, ""))
            if x in m_kept:
                tok, how = m_kept[x]
                cell(5, x, "selected" if how == "kept" else "folded", tok)
            elif x in drafted and x < pos - 1:     # rewritten in the first pass, below p: kept
                cell(5, x, "cached", "")
            elif x in drafted:
                cell(5, x, "discarded", drafted[x], color="#999")
            else:
                cell(5, x, "unused", "")
    markers = [("cursor, round start", 0, pos), ("cursor, after the verify", 1, pos + k),
               ("cursor, after accept", 2, after), ("MTP cursor, round start", 3, m0),
               ("MTP cursor, after the draft", 4, m_draft), ("MTP cursor, after the sync", 5, m_after)]
    legend = ["live", "written", "selected", "discarded", "cached", "folded"]
    xr, yr = (lo - 0.2, hi + 0.2), (ys[5] - 0.7, 1.1)
    pairing_note = {"article": "article pairing: k MTP steps, rows keep the draft-time hiddens",
                    "trained": "trained pairing: d1 free, k-1 MTP steps, rows past p rewritten from verified hiddens "
                               "by the next chain's first pass"}
    title = title or (f"The cursors: verify at {pos}, k = {k}, n_ok = {n} → cursor {after}; "
                      f"MTP {m0} → {m_after}")
    fig = cv.figure(title, height, xr, yr, [], equal=False)
    legend_doc = {"live": "main KV row, visible", "written": "row a verify or draft wrote",
                  "selected": "row kept (visible after the round)", "discarded": "row past the cursor: invisible, "
                  "overwritten next", "cached": "MTP KV row, visible", "folded": "MTP row held for the next chain to rewrite"}
    for role in legend:
        fill, line, width, dash = ROLE_STYLE[role]
        fig.add_scatter(x=[None], y=[None], mode="markers", name=legend_doc[role], legendgroup=role,
                        marker=dict(symbol="square", size=14, color=fill, line=dict(color=line, width=2)))
    fig.update_layout(showlegend=True, margin=dict(t=70))
    legend_below(fig, 70, 56, left=170)
    for name, i, c in markers:
        y = ys[i]
        top = y + cell_h / 2 + LABEL_GAP
        fig.add_scatter(x=[c, c], y=[y - cell_h / 2 - LABEL_GAP, top], mode="lines", name=name,
                        showlegend=False, line=dict(color="#d62728" if i < 3 else "#6a51a3", width=4),
                        hovertemplate=f"{name}: {c}<extra></extra>", customdata=[c, c])
        fig.add_annotation(x=c, y=top, text=f"{'MTP ' * (i >= 3)}cursor {c}", showarrow=False,
                           yanchor="bottom", xanchor="left", name=f"label: {name}",
                           font=dict(size=LABEL_PT, color="#d62728" if i < 3 else "#6a51a3"))
    fig.update_xaxes(visible=True, showgrid=False, zeroline=False, tickmode="array",
                     tickvals=[x + 0.5 for x in range(lo, hi)], ticktext=[str(x) for x in range(lo, hi)],
                     title="position (row of the cache)")
    fig.update_yaxes(visible=True, showgrid=False, zeroline=False, tickmode="array",
                     tickvals=[ys[i] for i in range(6)], ticktext=[r[0] for r in rows])
    fig.add_annotation(text=pairing_note[pr.value] + ("" if mtp_cursor is None or m0 == pos - 1 or held_at_start else
                                                       f"; note: the round invariant wants the MTP cursor at p = {pos - 1}"),
                       xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom", showarrow=False,
                       font=dict(size=11, color="#777"))
    fig.update_layout(meta={"pos": pos, "k": k, "n_ok": n, "cursor_after": after, "mtp_start": m0,
                            "mtp_after_draft": m_draft, "mtp_after": m_after, "pairing": pr.value})
    return fig
