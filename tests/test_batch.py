"""The batched engine (kestrel/batch.py): each sequence bit-identical to itself decoded alone,
whatever shares the pass; per-slot undo; bad input for one slot leaves every slot as it was.

The tests that take `tiny` or `model` run on the CPU and, where CuPy sees a GPU, on the CUDA
backend too (one batched launch plan a pass, kestrel/cuda/lower.py lower_batch): there every
slot is compared with a single-sequence Engine on the GPU, bit for bit. On the GPU `model` also
runs a bf16 model on the tensor-core GEMV (kernels/linear.cu gemv_tmb), whose passes of up to
20 rows span several row groups."""
import numpy as np
import pytest

import kestrel
from gpu import NDEV

POLICIES = ("replay", "checkpoint", "input-cache")
_GPU = [pytest.mark.gpu, pytest.mark.skipif(NDEV == 0, reason="no CUDA GPU visible to CuPy")]
DEVICES = ["cpu", pytest.param("cuda", marks=_GPU)]


@pytest.fixture(scope="module")
def tiny_cpu():
    return kestrel.load("tiny", device="cpu")


@pytest.fixture(scope="module", params=DEVICES)
def tiny(request, tiny_cpu):
    return tiny_cpu if request.param == "cpu" else kestrel.load("tiny", device="cuda")


def _seed() -> int:
    return int(np.random.SeedSequence().entropy % 2 ** 31)


@pytest.fixture(scope="module", params=["tiny", "test-b",
                                        pytest.param("tiny@cuda", marks=_GPU), pytest.param("test-b@cuda", marks=_GPU),
                                        pytest.param("test-b@cuda-bf16-tmb", marks=_GPU)])
def model(request, tiny_cpu):
    name = request.param
    if name == "tiny":
        return tiny_cpu
    if name == "test-b":
        return kestrel.load("test-b", device="cpu", seed=_seed())
    if name == "tiny@cuda":
        return kestrel.load("tiny", device="cuda")
    if name == "test-b@cuda":
        return kestrel.load("test-b", device="cuda", seed=_seed())
    return kestrel.load("test-b", device="cuda", dtype="bf16", seed=_seed(), kernels={"gemv": "tmb"})


def _prompt(rng, model, lo=2, hi=12):
    return [int(t) for t in rng.integers(0, model.cfg.vocab_size, int(rng.integers(lo, hi)))]


def _alone(model, prompt, T):
    """A single-sequence Engine's greedy stream, logits of every step, and final state."""
    eng = kestrel.Engine(model, max_seq=64, mmax=4)
    lg = eng.prefill(prompt).logits[-1]
    out, lgs = [], [lg]
    for _ in range(T):
        out.append(int(np.argmax(lg)))
        lg = eng.step(eng.cursor, out[-1]).logits
        lgs.append(lg)
    return out, lgs, eng


class Seq:
    """One sequence of a mixed batch: its prompt, what it emitted, the logits after its last
    consumed token, its undo strategy and k."""

    def __init__(self, prompt, T, policy, k, logits):
        self.prompt, self.T, self.policy, self.k = prompt, T, policy, k
        self.out, self.lg, self.replay = [], logits, None

    @property
    def done(self):
        return len(self.out) >= self.T


def test_greedy_mixed_batch_with_joins_and_leaves(model, rng):
    """Sequences join and leave at random while the others decode; each pass mixes slots at
    different positions, some stepping several known tokens at once: every slot's logits equal
    its own single-sequence run's, bit for bit, at every token."""
    be = kestrel.BatchEngine(model, slots=4, max_seq=64, mmax=4)
    waiting = [(_prompt(rng, model), int(rng.integers(3, 14))) for _ in range(7)]
    refs = {tuple(p): _alone(model, p, T) for p, T in waiting}
    running, passes = {}, 0
    while waiting or running:
        while waiting and len(running) < be.slots and (not running or rng.random() < 0.5):
            p, T = waiting.pop()
            s, st = be.join(p)
            assert np.array_equal(st.logits[-1], refs[tuple(p)][1][0])
            running[s] = Seq(p, T, None, 1, st.logits[-1])
        calls = {}
        for s, q in running.items():
            ref = refs[tuple(q.prompt)][0]
            m = min(int(rng.integers(1, 4)), q.T - len(q.out))    # teacher-forced rows of the reference
            calls[s] = ("step", be.cursor(s), ref[len(q.out):len(q.out) + m])
        out = be.forward(calls)
        passes += 1
        for s, st in out.items():
            q = running[s]
            ref, lgs = refs[tuple(q.prompt)][:2]
            n = len(calls[s][2])
            for j in range(n):
                assert np.array_equal(st.logits[j], lgs[len(q.out) + j + 1]), (s, len(q.out) + j)
            q.out += list(calls[s][2])
        for s in [s for s, q in running.items() if q.done]:
            be.leave(s)
            del running[s]
    assert passes >= 5


def _round_calls(be, running, rng, refs):
    """One pass: each slot's verify of [g, d_1..d_{k-1}] (drafts from its reference, each
    corrupted with its own probability), or the replay of the rows its last round accepted."""
    calls = {}
    for s, q in running.items():
        if q.replay is not None:                  # replay: re-run the accepted rows after rollback
            calls[s] = ("step", be.cursor(s), q.replay)
            continue
        ref = refs[tuple(q.prompt)]
        i, V = len(q.out), be.model.cfg.vocab_size
        k = min(q.k, q.T - i)
        rows = [int(np.argmax(q.lg))]
        for j in range(1, k):
            t = ref[i + j] if i + j < len(ref) else 0
            rows.append(t if rng.random() < q.alpha else int((t + 1 + rng.integers(0, V - 1)) % V))
        if q.policy == "replay":
            be.slot(s).mark()
        kind = {"replay": "step", "checkpoint": "verify_checkpointed", "input-cache": "verify_cached"}[q.policy]
        calls[s] = (kind, be.cursor(s), rows)
    return calls


def _finish(be, s, q, call, st):
    """The slot's n_ok, its undo, what it emits; -> the select / fold count, if any."""
    kind, _, rows = call
    if q.replay is not None:                      # the replay pass: the accepted rows again
        q.out += rows
        q.lg, q.replay = st.logits[-1], None
        return None
    n_ok = 1
    while n_ok < len(rows) and int(np.argmax(st.logits[n_ok - 1])) == rows[n_ok]:
        n_ok += 1
    if q.policy == "replay":
        if n_ok == len(rows):                     # everything accepted: nothing to undo (the mark is dropped
            q.out += rows                         # by the next one)
            q.lg = st.logits[-1]
        else:
            be.slot(s).rollback()
            q.replay = rows[:n_ok]
        return None
    q.out += rows[:n_ok]
    q.lg = st.logits[n_ok - 1]
    return n_ok


@pytest.mark.parametrize("trial", range(3))
def test_speculative_mixed_batch_every_policy(model, rng, trial):
    """Slots with different undo strategies (replay, checkpoint, input-cache), k = 1..4 and
    acceptance rates share every verify pass; sequences join and leave. Each slot's stream is
    its own greedy stream, and its state at the end (live GDN state and conv window, KV cache
    up to its cursor) is bit-identical to a single-sequence Engine's after the same tokens."""
    be = kestrel.BatchEngine(model, slots=5, max_seq=64, mmax=4)
    waiting = []
    for _ in range(8):
        q = Seq(_prompt(rng, model), int(rng.integers(4, 16)), POLICIES[int(rng.integers(0, 3))],
                int(rng.integers(1, 5)), None)
        q.alpha = float(rng.choice([0.0, 0.5, 0.9, 1.0]))
        waiting.append(q)
    refs = {tuple(q.prompt): _alone(model, q.prompt, q.T + 4)[0] for q in waiting}
    running, seen = {}, set()
    while waiting or running:
        while waiting and len(running) < be.slots and (not running or rng.random() < 0.6):
            q = waiting.pop()
            s, st = be.join(q.prompt)
            q.lg = st.logits[-1]
            running[s] = q
        calls = _round_calls(be, running, rng, refs)
        out = be.forward(calls)
        seen.add(tuple(sorted(c[0] for c in calls.values())))
        sel, fold = {}, {}
        for s, st in out.items():
            n = _finish(be, s, running[s], calls[s], st)
            if n is not None:
                (sel if calls[s][0] == "verify_checkpointed" else fold)[s] = n
        if sel:
            be.select_checkpoint(sel)
        if fold:
            be.fold_cached(fold)
        for s in [s for s, q in running.items() if q.done and q.replay is None]:
            q = running.pop(s)
            assert q.out[:q.T] == refs[tuple(q.prompt)][:q.T], (q.policy, q.k)
            alone = kestrel.Engine(model, max_seq=64, mmax=4)
            alone.prefill(q.prompt)
            for t in q.out:
                alone.step(alone.cursor, t)
            mine = be.slot(s)
            assert mine.cursor == alone.cursor
            for a, b in zip(mine.live_state(), alone.live_state()):
                assert np.array_equal(a, b)
            c = alone.cursor
            assert np.array_equal(mine.state.kc[:, :c], alone.state.kc[:, :c])
            assert np.array_equal(mine.state.vc[:, :c], alone.state.vc[:, :c])
            be.leave(s)
    assert any(len(set(kinds)) > 1 for kinds in seen)        # passes did mix strategies


def test_a_batch_too_large_for_memory_is_refused_whole(tiny, monkeypatch):
    """A BatchEngine whose slots' states do not all fit is refused with InsufficientMemoryError
    naming the batch, once its first slot has checked the arguments, not out of memory halfway
    through its slots; one that fits is made."""
    from kestrel import memory
    from kestrel.state import DeviceState
    one = DeviceState.bytes_needed(tiny.cfg, 32, 4, tiny.has_mtp)
    monkeypatch.setattr(memory, "available_bytes", lambda device: int(2.5 * one))
    made = []
    real = kestrel.batch.Engine
    monkeypatch.setattr(kestrel.batch, "Engine", lambda *a, **k: made.append(1) or real(*a, **k))
    with pytest.raises(kestrel.InsufficientMemoryError, match="BatchEngine of 4 slots"):
        kestrel.BatchEngine(tiny, slots=4, max_seq=32, mmax=3)
    assert len(made) == 1
    assert kestrel.BatchEngine(tiny, slots=3, max_seq=32, mmax=3).slots == 3
    with pytest.raises(kestrel.KestrelError, match="mmax"):
        kestrel.BatchEngine(tiny, slots=4, max_seq=32, mmax=0)


def test_bad_input_for_one_slot_changes_no_slot(tiny, rng):
    """A bad call for one slot (a wrong position, an out-of-range token, too many rows, a freed
    or unknown slot, an n past the pending verify) raises a named error and
    leaves every slot bit-identical; a full engine refuses a join."""
    be = kestrel.BatchEngine(tiny, slots=3, max_seq=32, mmax=3)
    a, _ = be.join(_prompt(rng, tiny))
    b, _ = be.join(_prompt(rng, tiny))
    c, _ = be.join(_prompt(rng, tiny))
    with pytest.raises(kestrel.SlotError, match="all 3 slots are in use"):
        be.join([1, 2])
    be.leave(c)
    good = ("step", be.cursor(a), [3])

    def same_after(call, err, match):
        before = be.snapshot_state()
        with pytest.raises(err, match=match):
            call()
        after = be.snapshot_state()
        assert before["live"] == after["live"]
        for i in range(be.slots):
            x, y = before[i], after[i]
            assert x.keys() == y.keys()
            for key in x:
                if isinstance(x[key], np.ndarray):
                    assert np.array_equal(x[key], y[key]), (i, key)
                else:
                    assert x[key] == y[key], (i, key)

    same_after(lambda: be.forward({a: good, b: ("step", be.cursor(b) + 1, [3])}), kestrel.CursorError, "slot 1")
    same_after(lambda: be.forward({a: good, b: ("step", be.cursor(b), [tiny.cfg.vocab_size])}), kestrel.TokenError, "slot 1")
    same_after(lambda: be.forward({a: good, b: ("verify_cached", be.cursor(b), [1, 2, 3, 4])}),
               kestrel.BatchWidthError, "M=4")
    same_after(lambda: be.forward({a: good, c: ("step", 0, [1])}), kestrel.SlotError, "slot 2 is not in use")
    same_after(lambda: be.forward({a: good, 7: ("step", 0, [1])}), kestrel.SlotError, "slot 7 does not exist")
    same_after(lambda: be.forward({a: good, b: ("rewind", 0, [1])}), kestrel.KestrelError, "kind one of")
    same_after(lambda: be.forward({}), kestrel.KestrelError, "non-empty")
    same_after(lambda: be.slot(c), kestrel.SlotError, "not in use")
    same_after(lambda: be.leave(c), kestrel.SlotError, "not in use")
    same_after(lambda: be.forward({"0": good}), kestrel.SlotError, "a slot is an int")
    be.forward({a: ("verify_checkpointed", be.cursor(a), [1, 2]), b: ("verify_cached", be.cursor(b), [4, 5, 6])})
    same_after(lambda: be.select_checkpoint({a: 3}), kestrel.BatchWidthError, "n")
    same_after(lambda: be.fold_cached({b: 1, a: 1}), kestrel.SnapshotError, "no cached verify is pending")
    same_after(lambda: be.forward({a: ("step", be.cursor(a), [1])}), kestrel.SnapshotError, "pending")
    be.select_checkpoint({a: 2})
    be.fold_cached({b: 0})
    with pytest.raises(kestrel.KestrelError, match="backend"):
        class Fake:
            name = "cuda"
        m = kestrel.load("test-a", device="cpu")
        m.be = Fake()
        kestrel.BatchEngine(m, slots=2)


def test_a_batch_dependent_order_breaks_it(tiny_cpu, rng):
    """The negative control: a projection whose summation order depends on how many rows share
    the pass (kestrel.lab.batching.order_depends_on_batch: K split into 1, 2 or 3 parts by the
    row count, as a GEMM picking its kernel by shape would) makes a slot's logits in a mixed pass
    differ from the same call alone; with the fixed order they are equal."""
    from kestrel.lab import batching
    tiny = tiny_cpu
    p1, p2 = _prompt(rng, tiny, 4, 8), _prompt(rng, tiny, 4, 8)

    def shared_and_alone():
        alone = kestrel.Engine(tiny, max_seq=32, mmax=3)
        alone.prefill(p1)
        be = kestrel.BatchEngine(tiny, slots=2, max_seq=32, mmax=3)
        a, _ = be.join(p1)
        b, _ = be.join(p2)
        got = be.forward({a: ("step", be.cursor(a), [7]), b: ("step", be.cursor(b), [1, 2])})[a].logits[0]
        return got, alone.step(alone.cursor, 7).logits

    with batching.order_depends_on_batch():
        got, ref = shared_and_alone()
    assert not np.array_equal(got, ref)
    got, ref = shared_and_alone()
    assert np.array_equal(got, ref)


# --------------------------------------------------------------------------- the batched drivers

def test_batch_greedy_equals_generate_with_joins(tiny, rng):
    """More prompts than slots (sequences join as others leave): every stream is its own
    kestrel.generate stream."""
    from kestrel import speculative as spec
    prompts = [_prompt(rng, tiny, 2, 20) for _ in range(int(rng.integers(3, 7)))]
    B = int(rng.integers(1, len(prompts) + 1))
    T = int(rng.integers(4, 24))
    g = spec.batch_greedy(tiny, prompts, T, slots=B)
    assert g.streams == [kestrel.generate(tiny, p, T) for p in prompts]
    assert g.slots == B and g.passes >= T - 1


@pytest.mark.parametrize("policy", ["replay", "flex-replay", "checkpoint", "input-cache"])
def test_batch_spec_is_each_sequence_alone(tiny, policy, rng):
    """Every drafter (mtp, mtp-article, and replay with an acceptance schedule of its own per
    sequence) at a random k: the batched run's streams are bit-exact, and each sequence's rounds
    (k and n_ok, round by round) are those of its run_spec alone."""
    from kestrel import speculative as spec
    prompts = [_prompt(rng, tiny, 3, 16) for _ in range(int(rng.integers(3, 6)))]
    T, k = int(rng.integers(8, 28)), int(rng.integers(1, 5))
    B = int(rng.integers(1, len(prompts) + 1))
    refs = [kestrel.generate(tiny, p, T) for p in prompts]
    for drafter in ("mtp", "mtp-article", "replay"):
        if drafter == "replay":
            pairing = "trained" if rng.random() < 0.5 else "article"
            lo = 1 if pairing == "trained" else 0
            sched = [spec.Schedule(seq=[int(x) for x in rng.integers(lo, k + 1, 8)], pairing=pairing)
                     for _ in prompts]
            alone_sched = [spec.Schedule(seq=list(s.seq), pairing=pairing) for s in sched]
        else:
            sched = alone_sched = [None] * len(prompts)
        r = spec.batch_spec(tiny, prompts, T, k=k, policy=policy, drafter=drafter, slots=B,
                            schedules=None if drafter != "replay" else sched, references=refs)
        assert r.bit_exact, (drafter, k, B)
        for p, ref, sch, got in zip(prompts, refs, alone_sched, r.runs):
            alone = spec.run_spec(tiny, p, T, k=k, policy=policy, drafter=drafter, schedule=sch,
                                  reference=ref, greedy=False)
            assert [(x.k, x.n_ok, x.drafts) for x in got.rounds] == \
                [(x.k, x.n_ok, x.drafts) for x in alone.rounds], (drafter, k)


@pytest.mark.parametrize("policy", POLICIES)
def test_prepare_makes_every_plan_a_decode_needs(tiny, policy, rng):
    """BatchEngine.prepare: it touches no slot's state (the plans it makes run with every segment
    empty), a second call makes nothing, and a whole speculative decode on the prepared engine
    (sequences finishing one by one, each its own acceptance) makes no batched plan and stays
    bit-exact. On the CPU, which makes no plans, it makes none."""
    from kestrel import speculative as spec
    n, k, T = int(rng.integers(2, 6)), int(rng.integers(1, 5)), int(rng.integers(8, 24))
    prompts = [_prompt(rng, tiny, 9, 16) for _ in range(n)]          # prompts past 8 rows: no cached plan
    refs = [kestrel.generate(tiny, p, T) for p in prompts]
    be = kestrel.BatchEngine(tiny, slots=n, max_seq=64, mmax=k, batch="strict" if policy == "replay" else "flex")
    for p in prompts[:2]:
        be.join(p)
    before = be.snapshot_state()
    with pytest.raises(kestrel.KestrelError, match="kinds"):
        be.prepare("step")
    plans = getattr(tiny.be, "_batch_plans", {}).get(tiny)
    earlier = set(plans or ())               # other tests' plans, some used once only (no graph yet)
    made = be.prepare((spec.verify_kind(policy),), drafts=True)
    after = be.snapshot_state()
    for i in range(be.slots):
        for key, x in before[i].items():
            assert np.array_equal(x, after[i][key]) if isinstance(x, np.ndarray) else x == after[i][key], (i, key)
    assert be.prepare((spec.verify_kind(policy),), drafts=True) == 0
    plans = getattr(tiny.be, "_batch_plans", {}).get(tiny)
    if tiny.be.name == "cpu":
        assert made == 0
    else:
        assert made > 0 and all(pl.graph is not None for key, pl in plans.items() if key not in earlier)
    for s in list(be.active):
        be.leave(s)
    keys = set(plans or ())
    sched = [spec.Schedule(seq=[int(x) for x in rng.integers(1, k + 1, 12)], pairing="trained") for _ in prompts]
    r = spec.batch_spec(tiny, prompts, T, k=k, policy=policy, drafter="replay", engine=be, schedules=sched,
                        references=refs)
    assert r.bit_exact
    assert not set(plans or ()) - keys         # no batched plan made while decoding


@pytest.mark.parametrize("policy", ["replay", "flex-replay", "input-cache"])
def test_a_batch_runs_its_replays_together(tiny_cpu, policy, rng, monkeypatch):
    """The model passes a round's undo needs (the replays after a rollback; under the article's
    pairing the step of a round that accepts nothing) go through the batch's shared passes
    (run_together): no sequence runs a pass of its own after its prompt, and the streams and
    each sequence's rounds stay those of the sequence alone."""
    from kestrel import speculative as spec
    n, k = int(rng.integers(2, 5)), int(rng.integers(2, 4))
    T = int(rng.integers(8, 20))
    prompts = [_prompt(rng, tiny_cpu, 3, 12) for _ in range(n)]
    refs = [kestrel.generate(tiny_cpu, p, T) for p in prompts]
    seqs = [[int(x) for x in rng.integers(0, k + 1, 12)] for _ in prompts]
    own = []
    real = tiny_cpu.forward
    monkeypatch.setattr(tiny_cpu, "forward", lambda *a, **kw: own.append(len(a[0])) or real(*a, **kw))
    r = spec.batch_spec(tiny_cpu, prompts, T, k=k, policy=policy, drafter="replay", references=refs,
                        schedules=[spec.Schedule(seq=list(q), pairing="article") for q in seqs])
    monkeypatch.undo()
    assert r.bit_exact
    tails = sum(run.tail_tokens for run in r.runs)   # a strict policy's plain tail: per slot, said so
    assert sorted(own) == sorted([len(p) for p in prompts] + [1] * tails)   # the prefills, the tails
    for p, ref, q, got in zip(prompts, refs, seqs, r.runs):
        alone = spec.run_spec(tiny_cpu, p, T, k=k, policy=policy, drafter="replay", reference=ref, greedy=False,
                              schedule=spec.Schedule(seq=list(q), pairing="article"))
        assert [(x.k, x.n_ok) for x in got.rounds] == [(x.k, x.n_ok) for x in alone.rounds]
    assert sum(x.n_ok < x.k for run in r.runs for x in run.rounds) > 0     # there were undos to run


def test_batch_drivers_refuse_bad_arguments(tiny):
    from kestrel import speculative as spec
    with pytest.raises(spec.SpecArgumentError, match="non-empty list"):
        spec.batch_greedy(tiny, [], 4)
    with pytest.raises(kestrel.KestrelError, match="slots"):
        spec.batch_greedy(tiny, [[1, 2]], 4, slots=2)
    with pytest.raises(spec.SpecArgumentError, match="one Schedule per prompt"):
        spec.batch_spec(tiny, [[1, 2], [3, 4]], 4, k=2, drafter="replay", schedules=[spec.Schedule(seq=[1])],
                        references=[[0] * 4, [0] * 4])
    with pytest.raises(kestrel.TokenError):
        spec.batch_spec(tiny, [[1, 2], [3, 999]], 4, k=2)
    with pytest.raises(spec.SpecArgumentError, match="k='auto'"):      # not silently k = k_max
        spec.batch_spec(tiny, [[1, 2], [3, 4]], 4, k="auto", policy="checkpoint")


def test_batch_spec_mixed_policies_and_k(tiny, rng):
    """One batch whose sequences each take their own flex policy, k and drafter: bit-exact, and
    each sequence round for round as alone. A strict policy cannot share a batch."""
    from kestrel import speculative as spec
    n = 6
    prompts = [_prompt(rng, tiny, 3, 16) for _ in range(n)]
    pols = [["flex-replay", "checkpoint", "input-cache"][int(rng.integers(0, 3))] for _ in range(n)]
    ks = [int(rng.integers(1, 5)) for _ in range(n)]
    drs = [["mtp", "mtp-article"][int(rng.integers(0, 2))] for _ in range(n)]
    T = 20
    refs = [kestrel.generate(tiny, p, T) for p in prompts]
    r = spec.batch_spec(tiny, prompts, T, k=ks, policy=pols, drafter=drs, slots=4, references=refs)
    assert r.bit_exact and r.kind in ("mixed", pols[0])
    for i, got in enumerate(r.runs):
        alone = spec.run_spec(tiny, prompts[i], T, k=ks[i], policy=pols[i], drafter=drs[i], reference=refs[i],
                              greedy=False)
        assert [(x.k, x.n_ok, x.drafts) for x in got.rounds] == [(x.k, x.n_ok, x.drafts) for x in alone.rounds]
    with pytest.raises(spec.SpecArgumentError, match="strict"):
        spec.batch_spec(tiny, prompts[:2], T, k=2, policy=["replay", "checkpoint"], references=refs[:2])
    with pytest.raises(spec.SpecArgumentError, match="one value per prompt"):
        spec.batch_spec(tiny, prompts[:2], T, k=[2, 3, 4], references=refs[:2])


def _bench_batch_script():
    """scripts/bench_batch.py as a module."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_batch.py"
    spec_ = importlib.util.spec_from_file_location("bench_batch", path)
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


def test_bench_batch_script_writes_its_table(tmp_path):
    """scripts/bench_batch.py on the embedded model, a small grid: a results file naming device,
    date, command and the weights' dtype, every stream bit-exact, one row per (B, greedy | policy,
    k), the rows and the passes in the order of B whatever order the batch sizes were run in."""
    import json
    from pathlib import Path
    mod = _bench_batch_script()
    out = mod.main(["--out", str(tmp_path), "--device", "cpu", "--B", "3", "1", "--k", "2",
                    "--policies", "checkpoint", "input-cache", "--T", "12"])
    d = json.loads(Path(out).read_text())
    assert d["device"].startswith("CPU") and d["date"] and "bench_batch.py" in d["command"]
    assert d["weights"] == "fp32"          # the embedded model's; a 27B run records bf16
    assert [(r["B"], r["mode"]) for r in d["rows"]] == [(1, "greedy"), (1, "checkpoint"), (1, "input-cache"),
                                                       (3, "greedy"), (3, "checkpoint"), (3, "input-cache")]
    assert all(r["bit_exact"] for r in d["rows"])
    md = (tmp_path / "bench_batch.md").read_text()
    assert "| 3 | input-cache | 2 |" in md
    # one round's passes at each B, at the largest k: a finite positive time for every pass and n
    assert [(u["B"], u["k"]) for u in d["unit_costs"]] == [(1, 2), (3, 2)]
    for u in d["unit_costs"]:
        times = [u["step"], u["verify_ckpt"], u["verify_cached"], *u["select"].values(), *u["fold"].values()]
        assert sorted(u["select"]) == sorted(u["fold"]) == ["1", "2"] and all(0 < t < 1e6 for t in times)
    assert "## One round's passes, each timed alone" in md and "| 3 | " in md.split("each timed alone")[1]


def test_unit_costs_leave_the_slots_where_they_began(tiny_cpu, monkeypatch):
    """batching.unit_costs times each pass between a mark and a rollback of every slot: after every
    timed call each slot's live state (its ring slot's S and conv window), cursors and attention
    lengths are bit-identical to what they were before the first, with nothing pending."""
    from kestrel.lab import batching
    made, checked = [], []
    real = kestrel.BatchEngine

    class Watched(real):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)
    monkeypatch.setattr(kestrel, "BatchEngine", Watched)
    real_rollback = kestrel.Engine.rollback

    def live(eng):
        d = eng.snapshot_state()
        return {"S": d["S"][d["slot"]].copy(), "hist": d["hist"][d["slot"]].copy(), "cursor": d["cursor"],
                "attn_len": d["attn_len"], "mtp_cursor": d["mtp_cursor"], "pending": d["pending"]}

    def rollback(eng):
        real_rollback(eng)
        be = made[-1]
        if eng is be.slot(be.active[-1]):      # the last slot rolled back: the whole batch is back
            checked.append([live(be.slot(s)) for s in be.active])
    monkeypatch.setattr(kestrel.Engine, "rollback", rollback)
    u = batching.unit_costs(tiny_cpu, 2, 2, reps=1)
    assert u["B"] == 2 and len(checked) == 3 * 7    # (2 warm-ups + 1) x (step, 2 verifies, 2 selects, 2 folds)
    first = checked[0]
    assert all(f["pending"] is None for f in first)
    for snap in checked[1:]:
        for a, b in zip(snap, first):
            assert a.keys() == b.keys()
            for name in a:
                assert np.array_equal(np.asarray(a[name]), np.asarray(b[name])) if name in ("S", "hist") \
                    else a[name] == b[name], name


def test_segment_tables_give_each_sequence_its_own_entry(rng):
    """kestrel/cuda/segments.py (pure NumPy): the tables a batched plan's host writes before each
    run hold, for every sequence and every table, exactly the entry a table made for that
    sequence alone would (its rows, its state at the table's offset, its ctrl block, slots and
    mode; only a cached verify's rows in the move-to-cache table), and M = 0 with null pointers
    past the pass's sequences; the bounds hold every mix they are asked for."""
    from kestrel import nvrtc as L
    from kestrel.cuda import segments as S
    from kestrel.program import GDN_MODES
    for _ in range(20):
        n = int(rng.integers(1, 20))
        ms = [int(m) for m in rng.integers(1, 6, n)]
        modes = [str(x) for x in rng.choice(list(GDN_MODES), n)]
        bases = [{name: int(rng.integers(1, 2 ** 40)) * 256 for name in S.BUFFERS} for _ in range(n)]
        ctrl = [int(rng.integers(1, 2 ** 40)) * 16 for _ in range(n)]
        specs = [S.TableSpec((str(rng.choice(S.BUFFERS)), int(rng.integers(0, 2 ** 20)) * 4),
                             None if rng.random() < 0.5 else (str(rng.choice(S.BUFFERS)), int(rng.integers(0, 2 ** 20))),
                             str(rng.choice(["all", "cache"]))) for _ in range(int(rng.integers(1, 8)))]
        nseg, rows, total = S.bounds(ms, has_projections=bool(rng.random() < 0.5))
        assert nseg >= n and rows >= max(ms) and total >= sum(ms)
        nslots = int(rng.integers(2, 6))
        got = S.words(specs, ms, modes, bases, ctrl, nslots, nseg)
        assert got.shape == (len(specs), nseg, L.SEG_WORDS) and got.dtype == np.int64
        for t, sp in enumerate(specs):
            lo = 0
            for i in range(n):
                e = got[t, i]
                want_m = ms[i] if sp.rows == "all" or modes[i] == "cache" else 0
                assert (e[L.SEG_LO], e[L.SEG_M], e[L.SEG_CTRL], e[L.SEG_NSLOTS], e[L.SEG_MODE]) == (
                    lo, want_m, ctrl[i], nslots, GDN_MODES[modes[i]])
                assert e[L.SEG_P0] == bases[i][sp.p0[0]] + sp.p0[1]
                assert e[L.SEG_P1] == (0 if sp.p1 is None else bases[i][sp.p1[0]] + sp.p1[1])
                lo += ms[i]
            assert not got[t, n:].any()             # the padding segments: M = 0, null pointers


def test_every_pass_of_a_batch_falls_in_its_prepared_plans(rng):
    """The passes a batch of B slots and widest call k + 1 makes, whatever the mix (draft chains
    with 0..k fill rows, verifies of 1..k+1 rows, folds of 1..k rows, sequences finishing one by
    one so that fewer slots share a pass), have bounds among the ones BatchEngine.prepare makes
    (segments.totals of the room): one nseg and one rows a batch, only the total varies, and the
    totals a batch can need fit the CUDA backend's plan cache."""
    from kestrel.cuda import segments as S
    from kestrel.cuda.cache import BATCH_PLAN_CACHE
    for B in (1, 2, 3, 4, 8, 16, 33, 64):
        for k in (1, 2, 3, 4):
            room = (B, k + 1)
            nseg, rows, _ = S.bounds([1], True, None, room)
            made = {(nseg, rows, t) for t in S.totals(B * (k + 1))}
            fold = S.bounds([1], False, k, room)
            assert 2 * len(made) + 1 <= BATCH_PLAN_CACHE      # main, the MTP head, the fold
            for _ in range(300):
                n = int(rng.integers(1, B + 1))                 # the slots still decoding
                ms = [int(m) for m in rng.integers(1, k + 2, n)]
                assert S.bounds(ms, True, None, room) in made, (B, k, ms)
                assert S.bounds([min(m, k) for m in ms], False, k, room) == fold
                assert nseg >= n and rows >= max(ms)


def test_batched_draft_chains_are_each_chain_alone(tiny, rng):
    """BatchEngine.mtp_draft: chains of different lengths, with and without fill rows and forced
    tokens, at different MTP cursors, in lockstep: each Draft's tokens and hiddens and each
    slot's MTP cache bit-identical to that slot's chain on an Engine alone; a bad call for one
    slot changes no slot."""
    be = kestrel.BatchEngine(tiny, slots=4, max_seq=64, mmax=4)
    alone, calls = {}, {}
    for i in range(4):
        p = _prompt(rng, tiny, 4, 14)
        s, st = be.join(p)
        e = kestrel.Engine(tiny, max_seq=64, mmax=4)
        e.prefill(p)
        P, m = len(p), int(rng.integers(0, 3))
        for eng in (be.slot(s), e):
            eng.mtp_fill(0, p[1:P - m], st.hidden[:P - 1 - m])
        k = int(rng.integers(1, 5))
        call = (P - 1 - m, int(np.argmax(st.logits[-1])), st.hidden[-1], k)
        if m:
            call += (None if rng.random() < 0.5 else [int(t) for t in rng.integers(0, 256, k)],
                     p[P - m:], st.hidden[P - 1 - m:P - 1])
        calls[s], alone[s] = call, e
    got = be.mtp_draft(calls)
    for s, e in alone.items():
        d = e.mtp_draft(*calls[s])
        assert got[s].tokens == d.tokens and np.array_equal(got[s].hidden, d.hidden)
        assert be.slot(s).mtp_cursor == e.mtp_cursor
        assert np.array_equal(be.slot(s).state.mtp_kc, e.state.mtp_kc)
    before = be.snapshot_state()
    bad = {s: (be.slot(s).mtp_cursor, 1, np.ones(tiny.cfg.hidden_size, np.float32), 2) for s in be.active}
    bad[max(bad)] = (0, 1, np.ones(tiny.cfg.hidden_size, np.float32), 2)          # not the MTP cursor
    with pytest.raises(kestrel.CursorError, match="MTP cursor"):
        be.mtp_draft(bad)
    after = be.snapshot_state()
    for i in range(be.slots):
        for key, v in before[i].items():
            assert (np.array_equal(v, after[i][key]) if isinstance(v, np.ndarray) else v == after[i][key]), (i, key)


def test_bench_batch_notes_runs_that_do_not_fit(tmp_path, monkeypatch):
    """A run whose engine does not fit in memory is left out of the table and named under it,
    and the sweep goes on; without the list to note it in, the sweep raises."""
    import json
    from pathlib import Path
    from kestrel.errors import InsufficientMemoryError
    from kestrel.lab import batching, results
    real = kestrel.BatchEngine

    def refusing(model, slots, max_seq=512, mmax=3, batch="flex"):
        if slots == 3 and mmax > 1:            # B = 3's speculative runs "need more than the device has"
            raise InsufficientMemoryError(f"a BatchEngine of {slots} slots: 9 GiB needed, 1 GiB available")
        return real(model, slots, max_seq=max_seq, mmax=mmax, batch=batch)

    monkeypatch.setattr(kestrel, "BatchEngine", refusing)
    mod = _bench_batch_script()
    out = mod.main(["--out", str(tmp_path), "--device", "cpu", "--B", "1", "3", "--k", "2",
                    "--policies", "input-cache", "--T", "8", "--no-unit-costs"])
    d = json.loads(Path(out).read_text())
    assert [(r["B"], r["mode"]) for r in d["rows"]] == [(1, "greedy"), (1, "input-cache"), (3, "greedy")]
    assert [(u["B"], u["mode"], u["k"]) for u in d["did_not_fit"]] == [(3, "input-cache", 2)]
    assert "9 GiB needed" in d["did_not_fit"][0]["error"]
    md = (tmp_path / "bench_batch.md").read_text()
    assert "did not fit in the device's memory: B = 3 input-cache k = 2 (a BatchEngine of 3 slots" in md
    f = results.load_batch("bench_batch", folder=tmp_path)
    assert f.did_not_fit == ((3, "input-cache", 2, d["did_not_fit"][0]["error"]),)
    assert "partial" not in d and not f.partial and "Partial" not in md
    assert "**Partial:** this run stopped" in mod.render({**d, "partial": True})   # written after each B
    with pytest.raises(InsufficientMemoryError, match="9 GiB needed"):
        batching.sweep(kestrel.load("tiny", device="cpu"), Bs=(3,), policies=("checkpoint",), ks=(2,), T=4)
