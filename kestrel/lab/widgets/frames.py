"""Figures with frames (a slider and a play button) that step in static HTML too."""
from __future__ import annotations

from kestrel import speculative as spec
from .figures import PHASE_COLORS, compact
from .runs import drafter_short


def add_player(fig, names, active, prefix, duration=300):
    """A slider over the frames (labels = frame names) and a play/pause button."""
    # every step keeps its frame; only about a dozen carry a label, so that labels never overlap
    every = max(1, -(-len(names) // 12))
    steps = [dict(method="animate", label=nm if (i % every == 0 or i == len(names) - 1) else "",
                  args=[[nm], dict(mode="immediate", frame=dict(duration=0, redraw=True), transition=dict(duration=0))])
             for i, nm in enumerate(names)]
    fig.update_layout(
        # the slider's value is written at its right end: at its left it sat under the buttons
        sliders=[dict(active=active, steps=steps, pad=dict(t=45), x=0.16, len=0.84,
                      currentvalue=dict(prefix=prefix, xanchor="right", font=dict(size=13)))],
        updatemenus=[dict(type="buttons", showactive=False, direction="left", x=0.0, y=0, xanchor="left",
                          yanchor="top", pad=dict(t=55, r=10),
                          buttons=[dict(label="▶", method="animate",
                                        args=[None, dict(frame=dict(duration=duration, redraw=True),
                                                         transition=dict(duration=0), fromcurrent=False,
                                                         mode="immediate")]),
                                   dict(label="❚❚", method="animate",
                                        args=[[None], dict(frame=dict(duration=0, redraw=False), mode="immediate")])])])
    # the slider and its labels sit in the bottom margin: keep it tall enough for them
    m = fig.layout.margin
    if m is None or m.b is None or m.b < 150:
        fig.update_layout(margin=dict(b=150))


def replay_frames_figure(result, *, title: str | None = None, height: int = 460, max_frames: int = 160,
                         show_requested: bool = True):
    """Kernel-free twin of spec_replay: a recorded SpecResult replayed round by round with a
    slider and a play button (plotly frames, so it steps in static HTML too). Left: the n_ok
    histogram so far (with the replay drafter's requested values). Right: ms per emitted token
    so far, stacked by phase, beside greedy's (timed in the same run). The last frame adds the
    strict tail, if any. Opens on the final state. Display with kestrel.lab.plots.show_animated."""
    from plotly.subplots import make_subplots
    rounds = list(result.rounds)
    k = result.k
    g = None if result.greedy_ms is None else result.greedy_ms / result.T
    xs = list(range(k + 1))
    req_on = show_requested and any(r.requested is not None for r in rounds)
    phases = list(spec.PHASES) + (["tail"] if result.tail_tokens else [])
    # cumulative states after rounds 1..N, then the end (+tail)
    states = []
    hist = [0] * (k + 1)
    req = [0] * (k + 1)
    ms = {ph: 0.0 for ph in phases}
    tokens = 0
    for r in rounds:
        hist[r.n_ok] += 1
        if r.requested is not None:
            req[min(r.requested, k)] += 1
        for ph, v in r.ms.items():
            ms[ph] = ms.get(ph, 0.0) + v
        tokens += len(r.emitted)
        states.append((f"{r.i + 1}", list(hist), list(req), dict(ms), tokens,
                       f"round {r.i + 1}/{len(rounds)}: n_ok={r.n_ok}, {tokens} tokens so far"))
    if result.tail_tokens or not rounds:
        ms["tail"] = result.tail_ms
        tokens += result.tail_tokens
        states.append(("+tail", list(hist), list(req), dict(ms), tokens,
                       f"end: {len(rounds)} rounds + {result.tail_tokens} tail tokens (plain M=1 steps)"))
    if len(states) > max_frames:             # keep the last state, thin the rest evenly
        idx = sorted({round(i * (len(states) - 1) / (max_frames - 1)) for i in range(max_frames)})
        states = [states[i] for i in idx]
    title = title or (f"{result.model}: policy {result.policy}, drafter {drafter_short(result.drafter)}, "
                      f"k={k}, T={result.T}")

    def ttl(st):
        name, h, rq, m, tok, what = st
        mpt = sum(m.values()) / tok if tok else 0.0
        sp = f", speedup {'' if st is states[-1] else 'so far '}{g / mpt:.2f}×" if g and mpt else ""
        return f"{title}<br><sup>{what}; {mpt:.3g} ms/token{sp}</sup>"

    def traces(st):
        name, h, rq, m, tok, what = st
        out = [dict(type="bar", x=xs, y=h, name="n_ok", marker=dict(color="#1f77b4"), showlegend=False,
                    text=[str(v) for v in h], textposition="outside", cliponaxis=False, xaxis="x", yaxis="y")]
        if req_on:
            out.append(dict(type="scatter", x=xs, y=rq, mode="markers", name="requested", xaxis="x", yaxis="y",
                            marker=dict(symbol="line-ew-open", size=26, color="#333", line=dict(width=3, color="#333"))))
        for ph in phases:
            out.append(dict(type="bar", x=["spec"], y=[compact(m.get(ph, 0.0) / tok if tok else 0.0)], name=ph,
                            marker=dict(color=PHASE_COLORS[ph]), xaxis="x2", yaxis="y2"))
        return out

    fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.12,
                        subplot_titles=("n_ok histogram", "ms per token"))
    for t in traces(states[-1]):
        fig.add_trace(t)
    if g is not None:
        fig.add_bar(x=["greedy"], y=[compact(g)], name="greedy", marker=dict(color="black"), xaxis="x2", yaxis="y2")
    hmax = max(states[-1][1]) if states else 1
    mmax = max([sum(st[3].values()) / st[4] for st in states if st[4]] + [g or 0.0, 1e-9])
    fig.update_layout(template="plotly_white", height=height, barmode="stack", title=ttl(states[-1]),
                      margin=dict(l=60, r=20, t=90, b=110), legend=dict(orientation="v", x=1.02, y=1),
                      xaxis=dict(title="n_ok", dtick=1, range=[-0.5, k + 0.5]),
                      yaxis=dict(title="rounds", range=[0, hmax * 1.18 + 1]),
                      yaxis2=dict(title="ms per token", range=[0, mmax * 1.1]))
    n = len(traces(states[-1]))
    fig.frames = [dict(name=st[0], data=traces(st), traces=list(range(n)), layout=dict(title=dict(text=ttl(st))))
                  for st in states]
    add_player(fig, [st[0] for st in states], active=len(states) - 1, prefix="round: ", duration=120)
    return fig
