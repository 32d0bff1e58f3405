"""spec_replay: live speculative decoding, round by round (ipywidgets; imported when built)."""
from __future__ import annotations

import time

from kestrel import speculative as spec
from kestrel.speculative.records import phase_totals
from . import cache
from .figures import hist_figure, phase_figure, round_figure
from .runs import hist_item
from ..plots import ms_label
from .view import AppBox, FigView, esc, side_by_side
import kestrel
from ..plots import stamp

# What the widget shows where it cannot be drawn (ipywidgets cuts a text form at 110 characters).
TEXT_FORM = "spec_replay: a live widget; run this cell in a live kernel to pick a run and press Run."

ARTICLE_HIST_TEXT = spec.format_hist(spec.ARTICLE_HIST, labels=False)


def spec_replay(model=None, *, device: str = "auto", k: int = 3, T: int = 64, start: int = 0,
                drafter: str = "mtp-article", policy: str = "replay", hist=None, pairing: str = "article",
                warmup: bool | None = None, min_interval: float = 0.25, run: bool = False):
    """Live speculative decoding, round by round, on the model's backend (ipywidgets VBox).

    Controls: model/shape ('tiny', the test shapes, and on a GPU the real-shape presets
    'qwen3.5-0.8b' ... 'qwen3.5-27b' with random weights), weights dtype, k (1-4), T, start
    (kestrel.starts()), drafter ('mtp-article', 'mtp', 'replay' with an n_ok histogram text
    box, pre-filled with the article's '0:24 1:6 2:11 3:4' or `hist` (a string, dict,
    SpecResult or RunSummary), and its pairing), policy ('replay', 'flex-replay',
    'checkpoint'), Run. Run times greedy decoding of the same T tokens (the speedup baseline
    and the reference stream), then run_spec with a per-round callback: the n_ok histogram,
    ms/token by phase against greedy, and the per-round cost update as the rounds come (at
    most every `min_interval` s). Models and engines are cached: changing k, T or the policy
    never reloads.

    model: a name (default 'tiny') or a loaded kestrel Model. warmup: one short untimed run
    (T <= 16) first, once per engine x policy x drafter (default: on CUDA only, where it
    compiles and captures the plans that combination uses, which must stay out of the timing).
    The returned box has `.app`: app.run(), app.controls, app.result (the last SpecResult),
    app.views (the figures), app.error (the last run's exception, if any).
    """
    return SpecReplay(model, device, k, T, start, drafter, policy, hist, pairing, warmup, min_interval, run).widget


class SpecReplay:
    T_MAX = 256

    def __init__(self, model, device, k, T, start, drafter, policy, hist, pairing, warmup, min_interval, run):
        import ipywidgets as W
        self.device, self.min_interval = device, min_interval
        self.result, self.error, self.records = None, None, []
        self.given = None
        names = cache.model_choices(device)
        notes = []
        if model is not None and not isinstance(model, str):
            self.given = model
            # one entry per model: the given one stands in for the preset of its name
            names = [f"{model.cfg.name} (given)"] + [n for n in names if n != model.cfg.name]
            initial = names[0]
        else:
            initial = model or "tiny"
            if initial not in names:
                if initial in cache.REAL_PRESETS:
                    notes.append(f"<b>{esc(initial)}</b> needs a CUDA GPU; using <b>tiny</b>.")
                else:
                    notes.append(f"unknown model {esc(initial)!r}; using <b>tiny</b>.")
                initial = "tiny"
        if not cache.gpu(device):
            notes.append("Real-shape presets (" + ", ".join(cache.REAL_PRESETS) + ") need a CUDA GPU: this kernel "
                         "runs the CPU backend, so only the tiny model and the test shapes are offered.")
        if hist is not None and not isinstance(hist, str):
            hist = spec.format_hist(hist_item(hist)[0], labels=False)
        policy = spec.Policy.parse(policy).name
        pairing = spec.Pairing.parse(pairing).value
        st = {"description_width": "70px"}
        c = self.controls = {
            "model": W.Dropdown(options=names, value=initial, description="model", style=st),
            "dtype": W.Dropdown(options=["fp32", "bf16"], value="bf16" if initial in cache.REAL_PRESETS else "fp32",
                                description="weights", style=st, layout=W.Layout(width="170px")),
            "k": W.IntSlider(value=k, min=1, max=4, description="k", style=st),
            "T": W.IntSlider(value=T, min=4, max=self.T_MAX, description="T (tokens)", style=st),
            "start": W.Dropdown(options=self._start_options(initial), value=start, description="start", style=st),
            "drafter": W.Dropdown(options=list(spec.DRAFTERS), value=drafter, description="drafter", style=st),
            "hist": W.Text(value=hist or ARTICLE_HIST_TEXT, description="n_ok hist", style=st,
                           placeholder=ARTICLE_HIST_TEXT, layout=W.Layout(width="300px")),
            "pairing": W.Dropdown(options=list(spec.PAIRINGS), value=pairing, description="pairing", style=st,
                                  layout=W.Layout(width="170px")),
            "policy": W.ToggleButtons(options=list(spec.POLICIES), value=policy, description="policy",
                                      tooltips=[p.doc for p in spec.POLICIES.values()], style=st),
        }
        self.fill = W.Button(description="← last run's n_ok", tooltip="fill the histogram with the last run's")
        self.fill.on_click(lambda _: self._fill_hist())
        self.button = W.Button(description="Run", button_style="primary", icon="play")
        self.button.on_click(lambda _: self.run())
        self.replay_box = W.HBox([c["hist"], c["pairing"], self.fill])
        c["drafter"].observe(lambda ch: self._show_replay(), names="value")
        c["model"].observe(lambda ch: self._model_changed(), names="value")
        self._show_replay()
        self.note = W.HTML("<br>".join(f"<small>{n}</small>" for n in notes))
        # four lines always reserved (numbers, controls, "changed"): the figures under it stay put
        self.status = W.HTML(layout=W.Layout(width="100%", min_height="6.5em"))
        self.log = W.HTML(layout=W.Layout(width="100%"))
        self.shown = None            # the controls of the run on screen (None before the first)
        self.head = ""               # its status line
        self.views = {"hist": FigView(note="Press <b>Run</b>: the run's n_ok histogram, ms per token by phase "
                                           "and rounds appear here."),
                      "phase": FigView(), "rounds": FigView()}
        self.warmup = warmup
        for w in c.values():
            w.observe(lambda ch: self._show_status(), names="value")
        self._show_status()
        controls = W.VBox([W.HBox([c["model"], c["dtype"]]), W.HBox([c["k"], c["T"]]), c["start"],
                           W.HBox([c["drafter"]]), self.replay_box, c["policy"], self.button, self.status,
                           self.note])
        figs = W.VBox([side_by_side(self.views["hist"], self.views["phase"], (45, 55)), self.views["rounds"].widget,
                       self.log])
        self.widget = AppBox.build([controls, figs], self, TEXT_FORM)
        if run:
            self.run()

    # ---- controls --------------------------------------------------------------------------
    def _start_options(self, name):
        given = self.given if name.endswith("(given)") else None
        if name == "tiny" or getattr(given, "tokenizer", None) is not None:      # the byte-level starts
            texts = kestrel.starts()
            return [(f"{i}: {t.strip().splitlines()[0][:40]!r}" if t.strip() else f"{i}: {t!r}", i)
                    for i, t in enumerate(texts)]
        return [(f"{i}: seeded random prompt ({4 + 3 * i} tokens)", i) for i in range(6)]

    def _show_replay(self):
        self.replay_box.layout.display = "" if self.controls["drafter"].value == "replay" else "none"

    def _model_changed(self):
        c = self.controls
        name = c["model"].value
        c["dtype"].value = "bf16" if name in cache.REAL_PRESETS else "fp32"
        v = c["start"].value
        c["start"].options = self._start_options(name)
        c["start"].value = v

    def _fill_hist(self):
        if self.result is not None:
            self.controls["hist"].value = spec.format_hist(spec.histogram(self.result.noks, self.result.k),
                                                           labels=False)

    def params(self) -> dict:
        """What the controls ask for, as the status line names it."""
        c = self.controls
        p = {"model": c["model"].value, "weights": c["dtype"].value, "k": c["k"].value, "T": c["T"].value,
             "start": c["start"].value, "drafter": c["drafter"].value, "policy": c["policy"].value}
        if p["drafter"] == "replay":
            p.update({"n_ok hist": c["hist"].value.strip(), "pairing": c["pairing"].value})
        return p

    @staticmethod
    def _describe(p: dict) -> str:
        return " · ".join(f"{esc(n)} {esc(v)}" if n in ("model", "start", "drafter", "policy", "pairing", "weights")
                          else f"{esc(n)} = {esc(v)}" for n, v in p.items())

    def _show_status(self):
        """The status line: the run on screen (its controls and numbers) and, when a control
        now differs from them, that Run has to be pressed to see it."""
        if self.shown is None:
            self.status.value = "Press <b>Run</b> to decode: " + self._describe(self.params()) + "."
            return
        changed = {n: v for n, v in self.params().items() if self.shown.get(n) != v}
        warn = ""
        if changed and not self.button.disabled:
            warn = ("<br><span style='color:#b35900'><b>changed — press Run</b> ("
                    + self._describe(changed) + ")</span>")
        self.status.value = self.head + warn

    def _model(self):
        name = self.controls["model"].value
        if name.endswith("(given)"):
            return self.given
        return cache.get_model(name, self.device, self.controls["dtype"].value)

    @staticmethod
    def _summary(recs, k, policy, drafter, greedy_ms_per_token, pairing=spec.Pairing.ARTICLE):
        """A RunSummary of the rounds so far (before the first: an empty one)."""
        noks, ks = [r.n_ok for r in recs], [r.k for r in recs]
        tok = sum(len(r.emitted) for r in recs)
        ph = phase_totals(recs)
        per = max(tok, 1)
        return spec.RunSummary(policy=spec.Policy.parse(policy), pairing=pairing, drafter=drafter, k=k, T=tok,
                               hist=spec.histogram(noks, k), cond_hits=spec.conditional_hits(noks, ks),
                               ms_per_token=sum(ph.values()) / per, phase_ms_per_token={p: v / per for p, v in ph.items()},
                               greedy_ms_per_token=greedy_ms_per_token)

    # ---- the run ---------------------------------------------------------------------------
    def run(self):
        """Run with the current controls (what the Run button does). Returns the SpecResult, or
        None after an error (shown in the status line; kept in self.error)."""
        c = self.controls
        self.button.disabled = True
        self.error, self.records = None, []
        self.shown, self.head = self.params(), ""
        try:
            k, T, policy, drafter = c["k"].value, c["T"].value, spec.Policy.parse(c["policy"].value), c["drafter"].value
            schedule = None
            if drafter == "replay":
                schedule = spec.Schedule(hist=c["hist"].value, pairing=c["pairing"].value)
            self._progress(f"loading {esc(c['model'].value)} …")
            model = self._model()
            be = model.be
            starts = spec.default_starts(model)
            label, prompt = starts[c["start"].value]
            P = len(prompt)
            cap = max(len(t) for _, t in starts) + self.T_MAX + 6
            a = spec.validate_run(model, prompt, T, k, policy, drafter, schedule=schedule)
            eng = cache.engine(model, k, policy.batch, a.need, cap)
            geng = cache.engine(model, 1, "flex", P + T + 1, cap)
            warm = self.warmup if self.warmup is not None else be.name != "cpu"
            combo = (eng, geng, policy, drafter, None if schedule is None else schedule.pairing)
            if warm and combo not in cache.WARMED:       # compile + capture this combination's plans, untimed
                self._progress("warm-up (untimed) …")
                spec.run_spec(model, prompt, min(T, 16), k, policy, drafter, schedule=schedule, engine=eng,
                              greedy_engine=geng)
                cache.WARMED.add(combo)
            self._progress(f"greedy decoding of {T} tokens (the baseline) …")
            ref, g_ms, _ = spec.greedy_timed(model, prompt, T, engine=geng)
            self.meta = {"k": k, "T": T, "policy": policy, "drafter": drafter, "g": g_ms / T, "model": model,
                         "label": label, "pairing": a.drafter.pairing}
            self._last_draw = 0.0
            r = spec.run_spec(model, prompt, T, k, policy, drafter, schedule=schedule, reference=ref, greedy=False,
                              on_round=self._on_round, engine=eng)
            r.greedy_ms = g_ms                     # greedy timed in the same run, as run_spec(greedy=True) does
            self.result = r
            self._draw(final=True)
            return r
        except Exception as e:                     # shown, not raised: a widget callback has nowhere to raise to
            self.error = e
            self.head = (f"<b>failed</b>: {self._describe(self.shown)}<br>"
                         f"<span style='color:#b00'><b>{type(e).__name__}</b>: {esc(e)}</span>")
            return None
        finally:
            self.button.disabled = False
            self._show_status()

    def _progress(self, what: str):
        self.status.value = f"<b>{what}</b><br>{self._describe(self.shown)}"

    def _on_round(self, rec):
        self.records.append(rec)
        now = time.perf_counter()
        if now - self._last_draw >= self.min_interval:
            self._draw(final=False)
            self._last_draw = time.perf_counter()

    def _draw(self, final: bool):
        m = self.meta
        recs = self.result.rounds if final else self.records
        k, g = m["k"], m["g"]
        s = self.result.summary() if final else self._summary(recs, k, m["policy"], m["drafter"], g, m["pairing"])
        req = None
        if m["drafter"] == "replay":
            req = [min(r.requested, r.k) for r in recs if r.requested is not None]
        rounds = plural(s.rounds, "round")
        self.views["hist"].update(hist_figure(s, k=k, names=["measured"], requested=req or None,
                                              title=f"n_ok histogram ({rounds})", height=340))
        self.views["phase"].update(phase_figure([self.result if final else s], names=["spec"], legend_above=True,
                                                title="ms per token, by phase", height=340))
        self.views["rounds"].update(round_figure(recs, greedy_ms_per_token=g, title="each round: ms by phase",
                                                 height=340))
        sp = s.speedup
        head = (f"<b>{'done' if final else 'running'}</b>: {rounds}, {plural(s.T, 'token')}, "
                f"{ms_label(s.ms_per_token)}/token vs greedy {ms_label(g)}/token → "
                f"<b>{'n/a' if sp is None else f'{sp:.2f}×'}</b>")
        if final:
            r = self.result
            head += f"; bit-exact: <b>{r.bit_exact}</b>"
            if r.tail_tokens:
                head += f"; tail: {plural(r.tail_tokens, 'plain step')}"
            line = stamp(device=m["model"], quiet=True)
            # pre-wrap: the log keeps its lines and wraps long ones at spaces, never inside a word
            self.log.value = ("<pre style='font-size:85%;line-height:1.25;white-space:pre-wrap;"
                              "word-break:normal;overflow-wrap:break-word'>"
                              + esc("\n".join([f"start {m['label']!r}"] + r.log_lines() + [line])) + "</pre>")
        self.head = head + "<br>" + self._describe(self.shown)
        self._show_status()


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
