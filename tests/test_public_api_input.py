"""The public entries outside the engine check their arguments and raise kestrel's named errors:
kestrel.load, Draft / DraftFeed, Engine.mark, run_spec and its objects, ByteTokenizer; and every
allocation a caller's input sizes is refused, by name and with the need stated, before it is tried."""
from __future__ import annotations

import mmap

import numpy as np
import pytest

import kestrel
from kestrel import memory
from kestrel import speculative as spec
from kestrel.errors import CheckpointError, InsufficientMemoryError, KestrelError, TokenError
from kestrel.weights import load_dir, save_dir


@pytest.fixture(scope="module")
def model():
    seed = int(np.random.SeedSequence().entropy % 10 ** 6)
    print(f"weights seed {seed}")
    return kestrel.load("test-a", device="cpu", seed=seed)


@pytest.mark.parametrize("arg", [123, None, b"/tmp", 2.5, ["tiny"], "a\0b", "/tmp/x\0"])
def test_load_refuses_what_is_not_a_model_name(arg):
    with pytest.raises(KestrelError, match="load takes|NUL"):
        kestrel.load(arg, device="cpu")


@pytest.mark.parametrize("seed", [-1, "x", True, None, 2.0, 2 ** 64])
def test_load_seed_must_be_a_non_negative_int(seed):
    with pytest.raises(KestrelError, match="seed"):
        kestrel.load("test-a", device="cpu", seed=seed)


def test_load_seed_of_numpy_types_is_its_value():
    a = kestrel.load("test-a", device="cpu", seed=np.uint8(7))
    b = kestrel.load("test-a", device="cpu", seed=7)
    assert all(np.array_equal(a.w[n], b.w[n]) for n in a.w)


@pytest.mark.parametrize("kw,match", [(dict(n=2.7), "n must be an int"), (dict(n=True), "n must be an int"),
                                      (dict(n="2"), "n must be an int"), (dict(n=-1), "n must be an int"),
                                      (dict(n=4), r"n=4 outside \[0, 3\]"), (dict(head=5), "head must be a sequence"),
                                      (dict(head="12"), "head must be a sequence"), (dict(head=[1.0]), "must be ints"),
                                      (dict(head=[np.True_]), "bool")])
def test_draft_feed_checks_its_arguments(kw, match):
    d = kestrel.Draft([1, 2, 3], None)
    with pytest.raises(TokenError, match=match):
        d.feed(**kw)


def test_draft_feed_takes_numpy_ints_as_values():
    f = kestrel.Draft([1, 2, 3], None).feed(head=[np.int8(5)], n=np.uint8(2))
    assert f.n == 2 and type(f.n) is int and f.head == (5,) and type(f.head[0]) is int and f.host() == [5, 1, 2]
    with pytest.raises(TokenError, match="Draft: tokens"):
        kestrel.Draft([1, "2"], None)


@pytest.mark.parametrize("flag", ["no", 1, None, 0.0])
def test_mark_flag_must_be_a_bool(model, flag):
    e = kestrel.Engine(model, max_seq=16)
    e.prefill([1, 2])
    before = e.snapshot_state()
    with pytest.raises(kestrel.SnapshotError, match="include_mtp_cursor"):
        e.mark(include_mtp_cursor=flag)
    assert e.snapshot_state()["snap"] is None and before["cursor"] == e.cursor


@pytest.mark.parametrize("kw,match", [(dict(engine=object()), "engine= takes a kestrel Engine"),
                                      (dict(greedy_engine=object()), "engine= takes a kestrel Engine"),
                                      (dict(greedy="yes"), "greedy= takes a bool"),
                                      (dict(check=1), "check= takes a bool"),
                                      (dict(on_round=5), "on_round=")])
def test_run_spec_checks_its_objects(model, kw, match):
    with pytest.raises(spec.SpecArgumentError, match=match):
        spec.run_spec(model, [1, 2, 3], 4, 2, **kw)


def test_run_spec_model_must_be_a_model():
    with pytest.raises(spec.SpecArgumentError, match="kestrel Model"):
        spec.run_spec(object(), [1, 2], 4, 2)


@pytest.mark.parametrize("ids,match", [([300], "out of range"), ([-1], "out of range"), ([True], "bool"),
                                       (["a"], "must be ints"), ([1.0], "must be ints"), ("ab", "str")])
def test_byte_tokenizer_decode(ids, match):
    with pytest.raises(TokenError, match=match):
        kestrel.ByteTokenizer().decode(ids)


def test_byte_tokenizer_encode_and_round_trip(rng):
    tok = kestrel.ByteTokenizer()
    for bad in (5, b"abc", None, ["a"]):
        with pytest.raises(TokenError, match="takes a str"):
            tok.encode(bad)
    with pytest.raises(TokenError, match="cannot encode"):
        tok.encode("a\udcff")
    text = "".join(chr(c) for c in rng.integers(32, 0x2000, 20))
    assert tok.decode(np.asarray(tok.encode(text), dtype=np.uint16)) == text and tok.decode([]) == ""


# ---- memory: refused by name, with the need, before the attempt -------------------------------------
@pytest.fixture
def little_memory(monkeypatch):
    """A machine with 200 KB available (whatever this one has)."""
    monkeypatch.setattr(memory, "_cpu_available", lambda: 200_000)


def test_engine_buffers_beyond_memory(model, little_memory):
    cfg = model.cfg
    need = kestrel.state.DeviceState.bytes_needed(cfg, cfg.max_position_embeddings, 4, True)
    assert need > 200_000 > kestrel.state.DeviceState.bytes_needed(cfg, 8, 4, True)
    with pytest.raises(InsufficientMemoryError, match=f"max_seq={cfg.max_position_embeddings}.*{need} bytes.*available"):
        kestrel.Engine(model, max_seq=cfg.max_position_embeddings)
    kestrel.Engine(model, max_seq=8)          # small enough: built


def test_random_weights_beyond_memory(little_memory):
    with pytest.raises(InsufficientMemoryError, match="weights of qwen3.5-0.8b .* parameters.*needed") as e:
        kestrel.load("qwen3.5-0.8b", device="cpu")
    assert isinstance(e.value, MemoryError)


def test_checkpoint_beyond_memory_is_refused_before_a_read(tmp_path, model, monkeypatch):
    """A checkpoint whose header declares more than the host has (a sparse file can declare a vocabulary
    of billions) is refused from the headers, before any tensor is mapped."""
    save_dir(tmp_path, model.cfg, {n: kestrel.to_numpy(a) for n, a in model.w.items()})
    assert load_dir(tmp_path)[0].replace(name=model.cfg.name) == model.cfg
    monkeypatch.setattr(memory, "_cpu_available", lambda: 1000)
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: pytest.fail("mapped before the memory check"))
    with pytest.raises(InsufficientMemoryError, match=f"checkpoint {tmp_path.name}'s tensors") as e:
        kestrel.load(tmp_path, device="cpu")
    assert not isinstance(e.value, CheckpointError)


def test_available_memory_is_read():
    assert memory.available_bytes("cpu") is None or memory.available_bytes("cpu") > 0


# ---- the speculative package's sizes ----------------------------------------------------------------
@pytest.mark.parametrize("kw,match", [(dict(hist="0:3", seed=-1), "seed"), (dict(hist="0:3", seed=True), "seed"),
                                      (dict(hist="0:3", order="random"), "order"),
                                      (dict(hist="0:2000000000"), "at most 1048576"),
                                      (dict(hist={0: 600000, 1: 600000}), "1200000 rounds"),
                                      (dict(hist="1:" + "7" * 4400), "above 1048576")])
def test_schedule_arguments(kw, match):
    with pytest.raises(spec.ScheduleError, match=match):
        spec.Schedule(**kw)


def test_prediction_sizes_are_checked():
    u = spec.UnitCosts(step=1.0, draft=0.5, mark=0.1, rollback=0.1, select=0.01, argmax=0.01,
                       step_m={1: 1.0, 2: 1.1, 3: 1.2}, ckpt={1: 1.0, 2: 1.1, 3: 1.2}, mtp={1: 0.5, 2: 0.6, 3: 0.7})
    for k in (True, 0, 2.0, "3"):
        with pytest.raises(spec.SpecArgumentError, match="k must be an int"):
            spec.predict(u, "checkpoint", "article", k, hist="0:1")
    assert spec.predict(u, "checkpoint", "article", np.uint8(3), hist="0:1").k == 3


def test_acceptance_depth_is_bounded_by_the_stream(model, rng):
    """depth=30000 once built an O(depth^2) table for minutes; a depth beyond the stream has no target."""
    prompt = rng.integers(0, model.cfg.vocab_size, 3).tolist()
    with pytest.raises(spec.SpecArgumentError, match="depth=30000 exceeds the stream's T=6"):
        spec.teacher_forced(model, prompt, T=6, depth=30000)
    a = spec.teacher_forced(model, prompt, T=6, depth=np.int8(6), pairing="article")
    assert a.depth == 6 and type(a.depth) is int
    assert a.to_dict()["advance"] == {k: a.advance(k) for k in range(1, 7)}
