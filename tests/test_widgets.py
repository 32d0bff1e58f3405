"""kestrel.lab.widgets: the plain figures (static book) and the two live widgets, headless, on the
tiny model on the CPU backend. Small T throughout: the whole file runs in seconds."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")

import kestrel  # noqa: E402
from kestrel.lab import plots, results, widgets
from kestrel import speculative as spec  # noqa: E402

T = 16
ARTICLE_HIST_TEXT = "0:24 1:6 2:11 3:4"


@pytest.fixture(scope="module")
def tiny():
    return widgets.get_model("tiny", device="cpu")


@pytest.fixture(scope="module")
def prompt(tiny):
    return spec.default_starts(tiny)[0][1]


@pytest.fixture(scope="module")
def runs(tiny, prompt):
    """replay (strict: has a tail at T=16, k=3), flex-replay and checkpoint, one drafter each."""
    return [spec.run_spec(tiny, prompt, T=T, k=3, policy="replay", drafter="mtp-article"),
            spec.run_spec(tiny, prompt, T=T, k=3, policy="flex-replay", drafter="mtp"),
            spec.run_spec(tiny, prompt, T=T, k=2, policy="checkpoint", drafter="mtp")]


@pytest.fixture(scope="module")
def replayed(tiny, prompt):
    return spec.run_spec(tiny, prompt, T=T, k=3, policy="replay", drafter="replay",
                         schedule=spec.Schedule(hist=spec.ARTICLE_HIST))


@pytest.fixture(scope="module")
def units(tiny):
    return spec.measure_unit_costs(tiny, k_max=4, ctx=24, reps=2, warmup=1)


def _bench_row(r, units):
    """A results row as scripts/bench_spec.py writes it, through a JSON round trip (string keys)."""
    s = dataclasses.replace(spec.aggregate([r]), predicted_speedup=spec.compare(units, [r])["predicted_speedup"])
    return json.loads(json.dumps({**s.to_dict(), "log": s.log_lines()}))


# --------------------------------------------------------------------------- import

def test_import_is_lazy():
    code = ("import sys, kestrel; assert 'kestrel.lab.widgets' not in sys.modules; "
            "import kestrel.lab.widgets; "
            "bad = [m for m in ('ipywidgets', 'plotly', 'IPython', 'anywidget') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- plain figures

def test_hist_figure(runs, replayed):
    fig = widgets.hist_figure(runs[:2])
    assert [t.type for t in fig.data] == ["bar", "bar"]
    for t, r in zip(fig.data, runs[:2]):
        assert list(t.y) == [spec.histogram(r.noks, 3)[n] for n in range(4)]
    # every accepted input kind; normalized; the replay schedule's requested values
    fig = widgets.hist_figure([replayed, ARTICLE_HIST_TEXT, {"0": 1, "1": 3}, [0, 1, 1, 2]], normalize=True,
                              requested=[r.requested for r in replayed.rounds])
    assert len(fig.data) == 5 and fig.data[-1].type == "scatter"
    assert abs(sum(fig.data[1].y) - 1.0) < 1e-12 and fig.data[1].y[0] == pytest.approx(24 / 45)
    assert list(fig.data[-1].y) == list(fig.data[0].y)        # the oracle got what it asked for
    assert len(widgets.hist_figure([0, 2, 2]).data) == 1       # a single n_ok list is one run


def test_phase_figure(runs, units):
    pred = spec.predict(units, "checkpoint", "trained", 2, profile=spec.E16_PROFILE)
    fig = widgets.phase_figure(runs + [pred])
    bars = [t for t in fig.data if t.type == "bar"]
    names = [t.name for t in bars]
    assert names == list(spec.PHASES) + ["tail"]               # the strict replay run has a tail at T=16, k=3
    assert runs[0].tail_tokens > 0
    labels = list(bars[0].x)
    assert len(labels) == 4 and len(set(labels)) == 4 and labels[-1].endswith("(predicted)")
    for j, r in enumerate(runs):                                # stacked phases add up to the measured ms/token
        assert sum(t.y[j] for t in bars) == pytest.approx(r.summary().ms_per_token, rel=1e-9)
    assert sum(t.y[3] for t in bars) == pytest.approx(pred.ms_per_token, rel=1e-9)
    greedy = next(t for t in fig.data if t.name == "greedy ms/token")
    assert list(greedy.y[:3]) == pytest.approx([r.summary().greedy_ms_per_token for r in runs])
    # bench rows (JSON) and summaries give the same bars as the SpecResult
    a = widgets.phase_figure([runs[0], runs[0].summary(), _bench_row(runs[0], units)], names=["a", "b", "c"])
    for t in a.data:
        if t.type == "bar":
            assert t.y[0] == pytest.approx(t.y[1], rel=1e-9) and t.y[0] == pytest.approx(t.y[2], rel=1e-9)


def test_speedup_and_round_figures(runs, replayed, units):
    fig = widgets.speedup_figure(runs, predicted=units)
    assert list(fig.data[0].y) == pytest.approx([r.summary().speedup for r in runs])
    assert list(fig.data[1].y) == pytest.approx([spec.predict_result(units, r).speedup for r in runs])
    assert any(s.y0 == 1.0 for s in fig.layout.shapes)         # the greedy (1x) reference line
    rows = [_bench_row(r, units) for r in runs]
    fig = widgets.speedup_figure(rows)
    assert list(fig.data[1].y) == pytest.approx([r["predicted_speedup"] for r in rows])
    fig = widgets.round_figure(replayed)
    assert [t.name for t in fig.data] == list(spec.PHASES) + ["greedy, same tokens"]
    assert len(fig.data[0].x) == len(replayed.rounds)


def test_replay_frames_figure(replayed):
    r = replayed
    fig = widgets.replay_frames_figure(r)
    n = len(r.rounds) + (1 if r.tail_tokens else 0)
    assert len(fig.frames) == n
    assert len(fig.layout.sliders[0].steps) == n and fig.layout.sliders[0].active == n - 1
    hist = [spec.histogram(r.noks, r.k)[i] for i in range(r.k + 1)]
    assert list(fig.data[0].y) == hist                         # opens on the final state
    assert list(fig.frames[-1].data[0].y) == hist
    assert sum(fig.frames[0].data[0].y) == 1                   # grows round by round
    assert [sum(f.data[0].y) for f in fig.frames[:len(r.rounds)]] == list(range(1, len(r.rounds) + 1))
    assert "speedup" in fig.layout.title.text
    # thinned to max_frames, keeping the final state
    few = widgets.replay_frames_figure(r, max_frames=5)
    assert len(few.frames) == 5 and list(few.frames[-1].data[0].y) == hist
    # static HTML: frames travel, nothing auto-plays, no CDN
    b = plots.animated_bundle(fig)
    assert len(b[plots.PLOTLY_MIME]["frames"]) == n
    assert "Plotly.addFrames" in b["text/html"] and "Plotly.animate(" not in b["text/html"]
    assert "cdn" not in b["text/html"].lower()


def test_cost_surface_figure(runs, units):
    alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
    fig = widgets.cost_surface_figure(units, "checkpoint", "trained", measured=runs, alphas=alphas,
                                      profile=spec.E16_PROFILE, k=2)
    heat, breakeven, prof, measured = fig.data
    assert heat.type == "heatmap" and list(heat.x) == [1, 2, 3, 4] and len(heat.z) == len(alphas)
    want = spec.predict(units, "checkpoint", "trained", 3, profile=(0.5,) * 3).speedup
    assert heat.z[2][2] == pytest.approx(want, rel=1e-3)
    # measured: the two trained-pairing runs, of which one used checkpoint (k=2), at its equivalent alpha
    mine = [r for r in runs if r.policy is spec.CHECKPOINT and r.pairing is spec.Pairing.TRAINED]
    assert len(measured.x) == len(mine) == 1
    s = mine[0].summary()
    assert measured.y[0] == pytest.approx(spec.equivalent_alpha(s.mean_per_round, 2, "trained"))
    assert measured.marker.color[0] == pytest.approx(s.speedup)
    assert len(prof.x) == 3                                    # trained, k=1: alpha changes nothing
    for kk, a in ((3, 0.3), (2, 0.8), (1, 0.6)):
        mean = sum(n * p for n, p in enumerate(spec.nok_distribution((a,) * kk, kk, "article")))
        assert spec.equivalent_alpha(mean, kk, "article") == pytest.approx(a, abs=1e-9)
    assert spec.equivalent_alpha(1.0, 1, "trained") is None


def test_cost_explorer_static(runs, units):
    alphas = [0.0, 0.5, 1.0]
    fig = widgets.cost_explorer_static(units, measured=runs, alphas=alphas, alpha0=0.5)
    n = len(spec.POLICIES) * len(spec.Pairing)
    assert len(fig.data) == n + 1 and fig.data[-1].name.startswith("measured")
    assert len(fig.data[-1].x) == len(runs)
    assert len(fig.frames) == 3 and fig.layout.sliders[0].active == 1
    assert [f.name for f in fig.frames] == ["0.00", "0.50", "1.00"]
    y = fig.frames[2].data[0].y                                # replay / article pairing at alpha = 1
    assert list(y) == pytest.approx([spec.predict(units, "replay", "article", k, profile=(1.0,) * k).speedup
                                     for k in (1, 2, 3, 4)], rel=1e-3)
    assert list(fig.data[0].y) == list(fig.frames[1].data[0].y)


def test_load_bench_and_edit_units(tmp_path, runs, units):
    d = {"date": "2026-01-01", "device": "cpu", "command": "python3 scripts/bench_spec.py",
         "tiny": {"model": "tiny", "device": "cpu", "units": units.to_dict(),
                  "runs": [_bench_row(r, units) for r in runs]}}
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(d))
    b = results.load_bench(p)
    assert b.name == "tiny" and b.units.step_m == units.step_m and len(b.runs) == 3
    assert [r.summary().hist for r in runs] == [x.hist for x in b.runs]
    assert [r.pairing for r in runs] == [x.pairing for x in b.runs]
    assert len(widgets.hist_figure(b.runs).data) == 3
    with pytest.raises(kestrel.KestrelError):
        results.load_bench(p, section="large")
    e = spec.edit_units(units, step=2 * units.step, draft=3 * units.draft, mark=0.0)
    assert e.step_m[3] == pytest.approx(2 * units.step_m[3]) and e.ckpt[2] == pytest.approx(2 * units.ckpt[2])
    assert e.mtp[2] == pytest.approx(3 * units.mtp[2]) and e.mark == 0.0 and e.rollback == units.rollback


# --------------------------------------------------------------------------- the live widgets

def test_spec_replay_runs_round_by_round(tiny):
    w = widgets.spec_replay(tiny, device="cpu", T=T, k=3, policy="replay", drafter="mtp-article", min_interval=0)
    app = w.app
    assert w is app.widget and type(w).__name__ == "VBox"
    seen = []
    assert type(app.views["hist"].widget).__name__ == "Output"
    # before the first run: one line saying to press Run, no empty figures
    assert all(v.figure is None for v in app.views.values()) and "Press <b>Run</b>" in app.status.value
    assert "Press <b>Run</b>" in app.views["hist"].widget.outputs[0]["data"]["text/html"]
    app.button.click()                                         # what pressing Run does
    r = app.result
    assert app.error is None and r is not None and r.bit_exact
    assert r.greedy_ms is not None and r.summary().speedup > 0
    seen.append(app.views["hist"].updates)
    assert seen[0] >= len(r.rounds)                            # redrawn every round (min_interval=0), and at the end
    hist = app.views["hist"].figure
    assert list(hist.data[0].y) == [spec.histogram(r.noks, 3)[n] for n in range(4)]
    rounds = app.views["rounds"].figure
    assert len(rounds.data[0].x) == len(r.rounds)
    phase = app.views["phase"].figure
    assert "tail" in [t.name for t in phase.data]
    assert "bit-exact: <b>True</b>" in app.status.value and "×" in app.status.value
    assert "[spec] rounds=" in app.log.value and "measured on" in app.log.value
    # the status names the run on screen and its numbers are the figures' numbers
    s = r.summary()
    assert f"{s.rounds} rounds, {s.T} tokens" in app.status.value and "k = 3" in app.status.value
    total = next(t for t in phase.data if t.name == "total")
    assert f"{total.text[0]}/token" in app.status.value
    assert f"({s.rounds} rounds)" in hist.layout.title.text
    # the figure is the Output's own state: what a reloaded page draws
    shown = app.views["hist"].widget.outputs[0]["data"][plots.PLOTLY_MIME]["data"][0]["y"]
    assert list(shown) == list(hist.data[0].y)
    # a control moved after the run: the status says so and still shows the run's numbers
    app.controls["T"].value = T + 1
    assert "changed — press Run" in app.status.value and f"T = {T + 1}" in app.status.value
    assert f"{s.rounds} rounds" in app.status.value
    app.controls["T"].value = T
    assert "changed" not in app.status.value


def test_spec_replay_menu_and_plurals(tiny):
    """A given model is one entry of the menu (not also its preset's name); 1 round, not 1 rounds."""
    w = widgets.spec_replay(tiny, device="cpu", T=4, k=4, min_interval=10.0)
    opts = list(w.app.controls["model"].options)
    assert opts[0] == "tiny (given)" and "tiny" not in opts and len(opts) == len(set(opts))
    r = w.app.run()
    assert w.app.error is None
    if len(r.rounds) == 1:
        assert "1 round," in w.app.status.value
    from kestrel.lab.widgets.spec_replay import plural
    assert [plural(n, "round") for n in (0, 1, 2)] == ["0 rounds", "1 round", "2 rounds"]


def test_spec_replay_controls(tiny):
    w = widgets.spec_replay(device="cpu", T=T, min_interval=10.0)
    app, c = w.app, w.app.controls
    opts = list(c["model"].options)
    assert opts[:3] == ["tiny", "test-a", "test-b"]
    if not widgets.cache.gpu("cpu"):
        assert not any(o.startswith("qwen") for o in opts) and "need a CUDA GPU" in app.note.value
    assert app.replay_box.layout.display == "none"
    r1 = app.run()
    assert app.error is None and r1.k == 3
    n_models = len(widgets.cache.MODELS)
    c["k"].value, c["policy"].value = 2, "checkpoint"          # no reload: the cached Model is reused
    r2 = app.run()
    assert app.error is None and r2.k == 2 and r2.policy is spec.CHECKPOINT and len(widgets.cache.MODELS) == n_models
    assert app._model() is widgets.get_model("tiny", "cpu") is tiny
    # the replay drafter: shown, pre-filled with the article's histogram, fills from the last run
    c["drafter"].value = "replay"
    assert app.replay_box.layout.display == "" and c["hist"].value == ARTICLE_HIST_TEXT
    c["k"].value, c["policy"].value = 3, "flex-replay"
    r3 = app.run()
    assert app.error is None and r3.drafter.startswith("replay[hist(0:24 1:6 2:11 3:4")
    assert [x.requested for x in r3.rounds][:3] == [x.n_ok for x in r3.rounds][:3]
    assert app.views["hist"].figure.data[-1].name.startswith("requested")
    app._fill_hist()
    assert spec.parse_hist(c["hist"].value) == spec.histogram(r3.noks, 3)
    # a bad histogram is shown, not raised
    c["hist"].value = "0:x"
    assert app.run() is None and isinstance(app.error, kestrel.KestrelError) and "0:x" in app.status.value
    # the random-weight test shape, its random starts
    c["hist"].value, c["drafter"].value, c["model"].value = ARTICLE_HIST_TEXT, "mtp", "test-a"
    assert "random" in c["start"].options[0][0]
    r4 = app.run()
    assert app.error is None and r4.model == "test-a" and r4.bit_exact


def test_spec_replay_real_shapes_need_a_gpu():
    if widgets.cache.gpu("auto"):
        pytest.skip("a GPU is present: the presets are offered")
    w = widgets.spec_replay(model="qwen3.5-27b", device="auto", T=T)
    assert w.app.controls["model"].value == "tiny" and "qwen3.5-27b" in w.app.note.value
    assert widgets.model_choices("auto") == ["tiny", "test-a", "test-b"]


def test_cost_explorer(units, runs):
    w = widgets.cost_explorer(units, measured=runs, k=3, policy="replay", pairing="article")
    app, c = w.app, w.app.controls
    n0 = app.views["surface"].updates
    c["a1"].value = 0.95
    c["k"].value = 2
    c["policy"].value = "checkpoint"
    assert app.views["surface"].updates == n0 + 3
    fig = app.views["surface"].figure
    assert fig.layout.title.text == "Predicted speedup<br><sup>policy checkpoint, pairing article</sup>"
    prof = app.profile()
    assert prof[0] == 0.95
    pred = spec.predict(units, "checkpoint", "article", 2, profile=prof)
    assert f"{pred.speedup:.3f}×" in app.table.value
    c["step"].value = 2 * units.step                          # unit costs: the surface follows
    u2 = app.units()
    assert u2.step_m[2] == pytest.approx(2 * units.step_m[2])
    pred2 = spec.predict(u2, "checkpoint", "article", 2, profile=prof)
    assert f"{pred2.speedup:.3f}×" in app.table.value
    app._reset()
    assert app.units().step == pytest.approx(round(units.step, 6))
    phase = app.views["phase"].figure
    assert [t.name for t in phase.data if t.type == "bar"] == list(spec.PHASES)
    assert [x.replace("<br>", "") for x in phase.data[0].x] == list(spec.POLICIES)
    assert "k = 2" in phase.layout.title.text


def test_cost_explorer_defaults(capsys):
    """unit_costs=None measures them on the tiny model; the figures are Output widgets."""
    w = widgets.cost_explorer(device="cpu", profile=[0.8, 0.5])
    app = w.app
    assert type(app.views["surface"].widget).__name__ == "Output"
    assert app.profile() == (0.8, 0.5, 0.5, 0.5)
    assert "measured now on tiny" in app.note.value
    app.controls["pairing"].value = "trained"
    assert app.views["surface"].figure.layout.title.text.endswith("pairing trained</sup>")
    capsys.readouterr()


def test_spec_replay_warmup_once_per_combination(tiny):
    """warmup=True (the CUDA default): one untimed run per engine x policy x drafter, then none."""
    w = widgets.spec_replay(tiny, device="cpu", T=8, k=2, policy="flex-replay", warmup=True, min_interval=10.0)
    n = len(widgets.cache.WARMED)
    w.app.run()
    assert len(widgets.cache.WARMED) == n + 1
    w.app.run()
    assert len(widgets.cache.WARMED) == n + 1
    w.app.controls["policy"].value = "checkpoint"             # same engine, other plans: warmed again
    w.app.run()
    assert len(widgets.cache.WARMED) == n + 2 and w.app.error is None


# --------------------------------------------------------------------------- the committed results

def test_committed_results_load_as_run_summaries():
    """results/bench_spec.json reads back through RunSummary.from_dict, and the book's figures over it build."""
    bench = json.loads((results.RESULTS / "bench_spec.json").read_text())
    for name in ("tiny", "large"):
        b = results.load_bench("bench_spec", section=name)
        assert len(b.runs) == len(bench[name]["runs"]) > 0
        for row, r in zip(bench[name]["runs"], b.runs):
            assert (r.policy.name, r.pairing.value, r.k) == (row["policy"], row["pairing"], row["k"])
            # every row's speedup is greedy / spec of its times (for repeats: of the median times,
            # sweep.over_repeats), which is what the summary computes back
            assert r.speedup == pytest.approx(row["speedup"], rel=1e-12)
            if row.get("repeats", 1) > 1:
                lo, hi = row["speedup_range"]
                assert lo <= row["speedup"] <= hi, (row["schedule"], row["policy"])
            assert r.bit_exact is True and set(r.phase_ms_per_token) == set(spec.PHASES)
    large = bench["large"]
    wall = next(r for r in large["runs"] if r["schedule"] == "article histogram" and r["policy"] == "replay")
    fig = widgets.phase_figure([wall, {**wall, "phase_ms_per_token": wall["predicted_phase_ms_per_token"]}],
                               names=["measured", "cost model"])
    assert [t.name for t in fig.data if t.type == "bar"] == list(spec.PHASES)
    fig = widgets.speedup_figure(large["runs"])
    assert list(fig.data[0].y) == pytest.approx([r["greedy_ms_per_token"] / r["ms_per_token"] for r in large["runs"]])
    assert list(fig.data[1].y) == pytest.approx([r["predicted_speedup"] for r in large["runs"]])
    fig = widgets.cost_explorer_static(spec.UnitCosts.from_dict(large["units"]), measured=large["runs"],
                                       greedy_ms_per_token=large["greedy_ms_per_token"], alphas=[0.5, 1.0])
    assert len(fig.data[-1].x) == len(large["runs"])


def test_batch_explorer(tiny):
    """Chapter 9's widget: 'press Run' before the first run; Run measures greedy and the chosen
    policy at B (every stream bit-exact), the status names that run and its numbers are the
    figure's; a control changed afterwards is announced; a second run adds its points."""
    w = widgets.batch_explorer(tiny, device="cpu", B=2, k=2, policy="checkpoint", T=8)
    app = w.app
    assert repr(w).startswith("batch_explorer: a live widget") and "live kernel" in repr(w)
    assert app.views["batch"].figure is None and "press <b>Run</b>" in app.status.value
    app.button.click()
    assert app.error is None and [r["mode"] for r in app.rows] == ["greedy", "checkpoint"]
    assert all(r["bit_exact"] for r in app.rows) and "bit-exact: True" in app.status.value
    fig = app.views["batch"].figure
    ys = {t.name: list(t.y) for t in fig.data}
    assert f"{ys['greedy'][0]:.0f} tokens/s" in app.status.value
    assert f"checkpoint {ys['checkpoint, k = 2'][0]:.0f} tokens/s" in app.status.value
    app.controls["B"].value = 4
    assert "changed — press Run" in app.status.value and "B = 2" in app.status.value
    app.button.click()
    assert sorted((r["B"], r["mode"]) for r in app.rows) == [(2, "checkpoint"), (2, "greedy"),
                                                             (4, "checkpoint"), (4, "greedy")]
    assert "changed" not in app.status.value and "B = 4" in app.status.value
    assert len(app.views["batch"].figure.data[0].x) == 2
