"""Hostile input: checkpoints, shard indexes and configs made to break the loader, and engine
calls made to break the engine.

Each gives a named kestrel error (the engine's state bit-identical after it) or exactly the
model the intact input gives. Nothing outside the model directory is ever opened (every
open and memory map is recorded), and a file that claims gigabytes costs none of them.
"""
import builtins
import io
import json
import math
import mmap
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kestrel
from kestrel import inputs
from kestrel.config import ConfigError, from_hf, load_config
from kestrel.errors import CheckpointError, CheckpointNotFoundError, KestrelError, TokenError
from kestrel.weights import INDEX_NAME, canonical_name, load_dir, random_weights, read_safetensors, save_dir, write_safetensors

PROPERTY = settings(max_examples=250, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SHARD = "model.safetensors"


# ---- helpers --------------------------------------------------------------------------------
def split(raw: bytes):
    """A safetensors file -> (header dict, data bytes)."""
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def join(header, data: bytes, text: bytes | None = None) -> bytes:
    """(header, data) -> a safetensors file; `text` overrides the JSON (for hand-made headers)."""
    h = text if text is not None else json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def tensor_names(header):
    return sorted(k for k in header if k != "__metadata__")


def same_tensors(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k]), k


def same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True), k
        else:
            assert a[k] == b[k], k


def fresh_seed() -> int:
    seed = int(np.random.SeedSequence().entropy % 10 ** 6)
    print(f"weights seed {seed}")
    return seed


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A valid test-a checkpoint (random weights) and what it loads to."""
    d = tmp_path_factory.mktemp("pristine") / "model"
    cfg = kestrel.preset("test-a")
    save_dir(d, cfg, random_weights(cfg, seed=fresh_seed()))
    cfg2, tensors = load_dir(d)
    return d, cfg2, tensors


class Workspace:
    """A fresh model directory per example (a copy of the pristine one), with an `outside`
    directory next to it that holds a valid copy of the checkpoint: the files a hostile
    name would like kestrel to read."""

    def __init__(self, base: Path, pristine_dir: Path, n: int):
        self.top = base / f"w{n}"
        self.model = self.top / "model"
        self.outside = self.top / "outside"
        shutil.copytree(pristine_dir, self.model)
        shutil.copytree(pristine_dir, self.outside)

    def shard(self) -> bytes:
        return (self.model / SHARD).read_bytes()

    def write(self, name: str, raw: bytes):
        (self.model / name).write_bytes(raw)


@pytest.fixture
def workspaces(tmp_path, pristine):
    counter = iter(range(10 ** 6))
    return lambda: Workspace(tmp_path, pristine[0], next(counter))


@pytest.fixture
def opened(monkeypatch):
    """Every path opened or memory-mapped while the test runs (realpath'd)."""
    paths = []
    real = {"os.open": os.open, "open": builtins.open, "io.open": io.open, "mmap": mmap.mmap,
            "memmap": np.memmap, "fromfile": np.fromfile}

    def note(p):
        if isinstance(p, int):
            try:
                p = os.readlink(f"/proc/self/fd/{p}")
            except OSError:
                return
        try:
            paths.append(os.path.realpath(os.fspath(p)))
        except TypeError:
            pass

    def wrap(key):
        def f(p, *a, **k):
            note(p)
            return real[key](p, *a, **k)
        return f

    monkeypatch.setattr(os, "open", wrap("os.open"))
    monkeypatch.setattr(builtins, "open", wrap("open"))
    monkeypatch.setattr(io, "open", wrap("io.open"))
    monkeypatch.setattr(mmap, "mmap", wrap("mmap"))
    monkeypatch.setattr(np, "memmap", wrap("memmap"))
    monkeypatch.setattr(np, "fromfile", wrap("fromfile"))
    return paths


def record_reads(monkeypatch) -> list:
    """The byte counts os.read/os.pread return while the test runs."""
    reads = []
    real_read, real_pread = os.read, os.pread

    def read(fd, n):
        b = real_read(fd, n)
        reads.append(len(b))
        return b

    def pread(fd, n, off):
        b = real_pread(fd, n, off)
        reads.append(len(b))
        return b

    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(os, "pread", pread)
    return reads


def never_outside(paths, ws):
    bad = [p for p in paths if p.startswith(str(ws.outside.resolve())) or p in ("/dev/zero", "/etc/passwd")]
    assert not bad, f"opened outside the model directory: {bad}"


def load_or_named_error(ws, names_in_message):
    """kestrel.load: the model, or a CheckpointError/ConfigError whose message names one of the
    given things. Any other exception fails the test."""
    try:
        return load_dir(ws.model)
    except (CheckpointError, ConfigError) as e:
        msg = str(e)
        assert any(n in msg for n in names_in_message), (msg, names_in_message)
        return e


# ---- reads outside the model directory ------------------------------------------------------
def _index_to(ws, name: str):
    header, _ = split(ws.shard())
    ws.write(INDEX_NAME, json.dumps({"metadata": {}, "weight_map": {k: name for k in tensor_names(header)}}).encode())
    os.remove(ws.model / SHARD)


@pytest.mark.parametrize("kind", ["parent", "absolute", "dotdot inside", "dev zero", "dot slash parent",
                                  "subdir symlink", "empty", "nul"])
def test_index_cannot_name_a_file_outside(workspaces, opened, kind):
    ws = workspaces()
    (ws.model / "sub").mkdir()
    os.symlink(ws.outside, ws.model / "link")
    name = {"parent": "../outside/model.safetensors", "absolute": str(ws.outside / SHARD),
            "dotdot inside": "sub/../../outside/model.safetensors", "dev zero": "/dev/zero",
            "dot slash parent": "./../outside/model.safetensors", "subdir symlink": "link/model.safetensors",
            "empty": "", "nul": "model\x00.safetensors"}[kind]
    _index_to(ws, name)
    opened.clear()                                  # from here on, only what loading opens
    with pytest.raises(CheckpointError, match="absolute path|contains '..'|outside the model directory|NUL|non-empty"):
        kestrel.load(ws.model, device="cpu")
    never_outside(opened, ws)


def test_dotdot_is_refused_even_when_it_stays_inside(workspaces):
    ws = workspaces()
    (ws.model / "sub").mkdir()
    _index_to(ws, "sub/../" + SHARD)
    (ws.model / SHARD).write_bytes((ws.outside / SHARD).read_bytes())
    with pytest.raises(CheckpointError, match=f"shard 'sub/../{SHARD}' contains '..'"):
        kestrel.load(ws.model, device="cpu")


@pytest.mark.parametrize("target", ["outside absolute", "outside relative", "dev zero"])
def test_shard_symlink_leaving_the_directory(workspaces, opened, target):
    ws = workspaces()
    os.remove(ws.model / SHARD)
    dest = {"outside absolute": ws.outside / SHARD, "outside relative": Path("../outside") / SHARD,
            "dev zero": Path("/dev/zero")}[target]
    os.symlink(dest, ws.model / SHARD)
    opened.clear()
    with pytest.raises(CheckpointError, match="outside the model directory"):
        kestrel.load(ws.model, device="cpu")
    never_outside(opened, ws)


def test_index_symlink_and_config_symlink_leaving(workspaces, opened):
    ws = workspaces()
    os.remove(ws.model / "config.json")
    os.symlink(ws.outside / "config.json", ws.model / "config.json")
    opened.clear()
    with pytest.raises(CheckpointError, match="config 'config.json' is a symlink .* outside"):
        kestrel.load(ws.model, device="cpu")
    never_outside(opened, ws)
    ws2 = workspaces()
    header, _ = split(ws2.shard())
    (ws2.outside / INDEX_NAME).write_text(json.dumps({"weight_map": {k: SHARD for k in tensor_names(header)}}))
    os.symlink(ws2.outside / INDEX_NAME, ws2.model / INDEX_NAME)
    opened.clear()
    with pytest.raises(CheckpointError, match="shard index .* outside"):
        kestrel.load(ws2.model, device="cpu")
    never_outside(opened, ws2)


def test_dev_zero_is_refused_before_any_read(workspaces, opened, monkeypatch):
    """The issue's case: an index entry /dev/zero was read without bound. Now it is refused by
    name: nothing is opened, nothing is read."""
    ws = workspaces()
    header, _ = split(ws.shard())
    wm = {k: SHARD for k in tensor_names(header)}
    wm[tensor_names(header)[0]] = "/dev/zero"
    ws.write(INDEX_NAME, json.dumps({"weight_map": wm}).encode())
    opened.clear()
    reads = record_reads(monkeypatch)
    with pytest.raises(CheckpointError, match="'/dev/zero' is an absolute path"):
        kestrel.load(ws.model, device="cpu")
    assert "/dev/zero" not in opened
    small = (ws.model / "config.json").stat().st_size + (ws.model / INDEX_NAME).stat().st_size
    assert sum(reads) == small        # the config and the index, nothing else


def test_fifo_and_directory_are_not_regular_files(workspaces):
    ws = workspaces()
    os.remove(ws.model / SHARD)
    os.mkfifo(ws.model / SHARD)
    old = signal.signal(signal.SIGALRM, lambda *a: pytest.fail("opening a FIFO blocked"))
    signal.alarm(10)
    try:
        with pytest.raises(CheckpointError, match="not a regular file"):
            kestrel.load(ws.model, device="cpu")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    ws2 = workspaces()
    os.remove(ws2.model / SHARD)
    (ws2.model / SHARD).mkdir()
    with pytest.raises(CheckpointError, match="not a regular file"):
        kestrel.load(ws2.model, device="cpu")


def test_links_inside_the_directory_load_and_source_is_the_directory_read(workspaces, pristine):
    ws = workspaces()
    (ws.model / "blobs").mkdir()
    os.rename(ws.model / SHARD, ws.model / "blobs" / "abc")
    os.symlink("blobs/abc", ws.model / SHARD)              # stays inside: allowed
    os.symlink(ws.model, ws.top / "alias")                  # the directory named through a link
    m = kestrel.load(ws.top / "alias", device="cpu")
    assert m.source == str(ws.model.resolve())
    same_tensors({n: np.asarray(a) for n, a in m.w.items()}, pristine[2])


def test_missing_directory_is_named_and_still_a_file_not_found(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="does not exist") as e:
        kestrel.load(tmp_path / "nope", device="cpu")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, KestrelError)


# ---- headers: one regression test per trusted field -------------------------------------------
def _two_same_size(header):
    """Two tensors of the same byte size, the one stored first first."""
    by_size = {}
    for k in sorted(tensor_names(header), key=lambda k: header[k]["data_offsets"][0]):
        a, b = header[k]["data_offsets"]
        by_size.setdefault(b - a, []).append(k)
    return next(v[:2] for v in by_size.values() if len(v) >= 2)


HEADER_CASES = {
    "negative offsets": (lambda h, t, u: h[t].update(data_offsets=[-8, h[t]["data_offsets"][1]]), "non-negative ints"),
    "overlapping offsets": (lambda h, t, u: h[u].update(data_offsets=list(h[t]["data_offsets"])), "overlap"),
    "shape -1": (lambda h, t, u: h[t].update(shape=[-1]), "non-negative ints"),
    "shape of floats": (lambda h, t, u: h[t].update(shape=[float(d) for d in h[t]["shape"]]), "non-negative ints"),
    "shape of bools": (lambda h, t, u: h[t].update(shape=[True] * len(h[t]["shape"])), "non-negative ints"),
    "offsets past the end": (lambda h, t, u: h[t].update(data_offsets=[h[t]["data_offsets"][0], 10 ** 12]),
                             "past the end"),
    "missing data_offsets": (lambda h, t, u: h[t].pop("data_offsets"), r"missing \['data_offsets'\]"),
    "unexpected key": (lambda h, t, u: h[t].update(offset=0), r"unexpected \['offset'\]"),
    "byte length not the shape's": (lambda h, t, u: h[t].update(shape=[h[t]["shape"][0] + 1] + h[t]["shape"][1:]),
                                    "bytes"),
    "unknown dtype": (lambda h, t, u: h[t].update(dtype="F8_E4M3"), "unsupported dtype"),
    "integer weights": (lambda h, t, u: h[t].update(dtype="I32"), "weights must be one of"),
    "one offset": (lambda h, t, u: h[t].update(data_offsets=[0]), "two non-negative ints"),
    "entry not an object": (lambda h, t, u: h.__setitem__(t, [1, 2]), "not an object"),
    "metadata not strings": (lambda h, t, u: h.__setitem__("__metadata__", {"format": 1}), "__metadata__"),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_header_field_is_validated(workspaces, case):
    ws = workspaces()
    header, data = split(ws.shard())
    t, u = _two_same_size(header)
    edit, match = HEADER_CASES[case]
    edit(header, t, u)
    ws.write(SHARD, join(header, data))
    with pytest.raises(CheckpointError, match=match) as e:
        kestrel.load(ws.model, device="cpu")
    assert SHARD in str(e.value)
    if case != "metadata not strings":
        assert repr(t) in str(e.value) or repr(u) in str(e.value)   # and the tensor


def test_duplicate_key_in_one_header(workspaces):
    ws = workspaces()
    header, data = split(ws.shard())
    t = tensor_names(header)[0]
    text = json.dumps(header)
    dup = text[:-1] + ", " + json.dumps(t) + ": " + json.dumps(header[t]) + "}"
    ws.write(SHARD, join(None, data, dup.encode()))
    with pytest.raises(CheckpointError, match=f"{SHARD}.*key {t!r} appears twice"):
        kestrel.load(ws.model, device="cpu")


@pytest.mark.parametrize("header_text", [b"[1, 2]", b'"text"', b"12", b"null", b"{", b"\xff\xfe{}",
                                         b'{"a": NaN}', b"[" * 100000])
def test_header_not_an_object(workspaces, header_text):
    ws = workspaces()
    _, data = split(ws.shard())
    ws.write(SHARD, join(None, data, header_text))
    with pytest.raises(CheckpointError, match=f"{SHARD}: (safetensors header is a JSON|corrupt safetensors header)"):
        kestrel.load(ws.model, device="cpu")


def test_gap_and_trailing_bytes(workspaces):
    ws = workspaces()
    raw = ws.shard()
    ws.write(SHARD, raw + b"\0" * 8)
    with pytest.raises(CheckpointError, match="cover it exactly"):
        kestrel.load(ws.model, device="cpu")
    header, data = split(raw)
    first = min(tensor_names(header), key=lambda k: header[k]["data_offsets"][0])
    for k in tensor_names(header):                  # shift everything 4 bytes: a gap at the start
        header[k]["data_offsets"] = [o + 4 for o in header[k]["data_offsets"]]
    ws.write(SHARD, join(header, b"\0" * 4 + data))
    with pytest.raises(CheckpointError, match=f"bytes \\[0, 4\\) before tensor {first!r}"):
        kestrel.load(ws.model, device="cpu")


def test_header_length_prefix(workspaces, monkeypatch):
    ws = workspaces()
    raw = ws.shard()
    for n, match in [(2 ** 63, "exceeds"), (len(raw), "corrupt safetensors header length"), (0, "corrupt")]:
        ws.write(SHARD, struct.pack("<Q", n) + raw[8:])
        with pytest.raises(CheckpointError, match=match):
            kestrel.load(ws.model, device="cpu")
    ws.write(SHARD, raw[:5])
    with pytest.raises(CheckpointError, match="too short"):
        kestrel.load(ws.model, device="cpu")
    with open(ws.model / SHARD, "wb") as f:          # a 150 MiB header inside a (sparse) 200 MiB file
        f.write(struct.pack("<Q", 150 << 20))
        f.truncate(200 << 20)
    reads = record_reads(monkeypatch)
    with pytest.raises(CheckpointError, match=f"{SHARD}: safetensors header length {150 << 20} exceeds"):
        kestrel.load(ws.model, device="cpu")
    assert sum(reads) < 1 << 16                       # refused from its length alone


def test_tensors_come_from_a_memory_map_not_a_whole_read(workspaces, pristine, monkeypatch):
    ws = workspaces()
    maps = []
    real_mmap = mmap.mmap
    monkeypatch.setattr(mmap, "mmap", lambda fd, n, **k: maps.append(n) or real_mmap(fd, n, **k))
    reads = record_reads(monkeypatch)
    _, tensors = load_dir(ws.model)
    size = (ws.model / SHARD).stat().st_size
    assert maps == [size]
    (hlen,) = struct.unpack("<Q", ws.shard()[:8])
    config_bytes = (ws.model / "config.json").stat().st_size
    assert sum(reads) == 8 + hlen + config_bytes     # the length, the header, the config: no tensor bytes
    same_tensors(tensors, pristine[2])
    assert all(a.flags.owndata and a.flags.writeable for a in tensors.values())  # copies, not views of the file


# ---- bounded memory: a file that claims 1.5 GiB -----------------------------------------------
HUGE = 3 * 2 ** 29   # 1.5 GiB


def _claim_huge(ws, sparse: bool):
    """A shard whose header adds a 1.5 GiB tensor. sparse: the file really is 1.5 GiB (a hole);
    otherwise the file is as small as before and the offsets run past its end."""
    header, data = split(ws.shard())
    header["model.layers.0.extra.weight"] = {"dtype": "F32", "shape": [HUGE // 4],
                                             "data_offsets": [len(data), len(data) + HUGE]}
    raw = join(header, data)
    with open(ws.model / SHARD, "wb") as f:
        f.write(raw)
        if sparse:
            f.truncate(len(raw) + HUGE)
    return "does not describe" if sparse else "past the end"


@pytest.mark.parametrize("sparse", [False, True])
def test_huge_claim_fails_before_reading(workspaces, monkeypatch, sparse):
    ws = workspaces()
    match = _claim_huge(ws, sparse)
    assert ((ws.model / SHARD).stat().st_size > HUGE) == sparse
    maps = []
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: maps.append(a) or pytest.fail("mapped before the checks"))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=match) as e:
            kestrel.load(ws.model, device="cpu")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "model.layers.0.extra.weight" in str(e.value) and SHARD in str(e.value)
    assert maps == [] and peak < 16 << 20, peak


def test_huge_claim_resident_memory_stays_small(workspaces):
    """Resident memory measured in a fresh process (its own peak): the sparse 1.5 GiB claim
    fails with less than 64 MiB of growth (it once peaked at 4.6 GB)."""
    ws = workspaces()
    _claim_huge(ws, sparse=True)
    code = textwrap.dedent(f"""
        import resource, kestrel
        kestrel.load("test-a", device="cpu")            # warm the imports and allocator
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            kestrel.load({str(ws.model)!r}, device="cpu")
            print("LOADED")
        except kestrel.CheckpointError as e:
            print("REFUSED", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
    """)
    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo, env=env)
    assert out.returncode == 0, out.stderr
    word, growth_kib = out.stdout.split()
    assert word == "REFUSED" and int(growth_kib) < 64 * 1024, out.stdout


# ---- property: mutated safetensors files ------------------------------------------------------
MUTATIONS = ["offset", "swap", "shape", "dtype", "drop key", "extra key", "rename", "duplicate",
             "length prefix", "truncate", "append", "metadata", "not object", "reorder"]


@PROPERTY
@given(data=st.data())
def test_mutated_shard_named_error_or_identical(workspaces, pristine, data):
    """A valid shard changed in one way: a CheckpointError naming the file (and the tensor), or
    the very tensors the change implies (metadata/reorder: the original; a swap of two equal
    byte ranges: those two tensors' bytes exchanged)."""
    ws = workspaces()
    raw = ws.shard()
    header, blob = split(raw)
    names = tensor_names(header)
    kind = data.draw(st.sampled_from(MUTATIONS), "mutation")
    t = data.draw(st.sampled_from(names), "tensor")
    expect = None                     # None: must fail; a dict: must load to exactly this
    text = None
    if kind == "offset":
        i = data.draw(st.integers(0, 1))
        delta = data.draw(st.integers(1, 64) | st.integers(-64, -1) | st.sampled_from([-2 ** 40, 2 ** 40]))
        header[t]["data_offsets"][i] += delta
    elif kind == "swap":
        u = data.draw(st.sampled_from(names))
        header[t]["data_offsets"], header[u]["data_offsets"] = header[u]["data_offsets"], header[t]["data_offsets"]
        a, b = header[t]["data_offsets"], header[u]["data_offsets"]
        if t == u:
            expect = pristine[2]
        elif a[1] - a[0] == b[1] - b[0]:   # equal sizes: a valid file with the two tensors' bytes exchanged
            tn, un = canonical_name(t), canonical_name(u)
            expect = dict(pristine[2])
            expect[tn] = pristine[2][un].reshape(pristine[2][tn].shape)
            expect[un] = pristine[2][tn].reshape(pristine[2][un].shape)
    elif kind == "shape":
        shape = header[t]["shape"]
        header[t]["shape"] = data.draw(st.sampled_from([shape + [1], [1] + shape, shape[::-1] if len(shape) > 1 else [-1],
                                                        [int(np.prod(shape))] if len(shape) > 1 else shape + [0],
                                                        [], [2 ** 62], [-s for s in shape], [s + 0.0 for s in shape]]))
        assume(header[t]["shape"] != shape)
    elif kind == "dtype":
        header[t]["dtype"] = data.draw(st.sampled_from(["F16", "BF16", "F64", "I32", "I64", "U8", "f32", "", None, 4]))
    elif kind == "drop key":
        header[t].pop(data.draw(st.sampled_from(["dtype", "shape", "data_offsets"])))
    elif kind == "extra key":
        header[t][data.draw(st.sampled_from(["offset", "DTYPE", "strides"]))] = 0
    elif kind == "rename":
        header[data.draw(st.sampled_from(["model.x", t + ".", t.upper(), "model.layers.99.mlp.up_proj.weight"]))] = header.pop(t)
    elif kind == "duplicate":
        text = (json.dumps(header)[:-1] + ", " + json.dumps(t) + ": " + json.dumps(header[t]) + "}").encode()
    elif kind == "length prefix":
        delta = data.draw(st.integers(1, 16) | st.integers(-16, -1))
        (n,) = struct.unpack("<Q", raw[:8])
        ws.write(SHARD, struct.pack("<Q", max(0, n + delta)) + raw[8:])
    elif kind == "truncate":
        cut = data.draw(st.integers(1, len(raw)))
        ws.write(SHARD, raw[:len(raw) - cut])
    elif kind == "append":
        ws.write(SHARD, raw + data.draw(st.binary(min_size=1, max_size=64)))
    elif kind == "metadata":
        header["__metadata__"] = data.draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5) | st.integers(),
                                                           max_size=3))
        if all(isinstance(v, str) for v in header["__metadata__"].values()):
            expect = pristine[2]
    elif kind == "not object":
        text = json.dumps(data.draw(st.sampled_from([[header], list(header), None, 3, "x"]))).encode()
    elif kind == "reorder":
        order = data.draw(st.permutations(list(header)))
        header = {k: header[k] for k in order}
        expect = pristine[2]
    if kind not in ("length prefix", "truncate", "append"):
        ws.write(SHARD, join(header, blob, text))
    got = load_or_named_error(ws, [SHARD])
    if expect is None:
        assert isinstance(got, CheckpointError), f"{kind} loaded"
    else:
        assert not isinstance(got, Exception), got
        same_tensors(got[1], expect)


# ---- property: mutated shard indexes ----------------------------------------------------------
def _sharded(ws, rng_order):
    """Split the checkpoint into two shards with an index (returns the weight map)."""
    full = read_safetensors(ws.model / SHARD)
    os.remove(ws.model / SHARD)
    names = sorted(full)
    half = len(names) // 2
    wm = {}
    for i, part in enumerate([names[:half], names[half:]]):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(ws.model / fn, {n: full[n] for n in part})
        wm.update({n: fn for n in part})
    return {k: wm[k] for k in rng_order(list(wm))}


@PROPERTY
@given(data=st.data())
def test_mutated_index_named_error_or_identical(workspaces, pristine, opened, data):
    ws = workspaces()
    wm = _sharded(ws, lambda ks: data.draw(st.permutations(ks), "order"))
    keys = list(wm)
    k = data.draw(st.sampled_from(keys), "tensor")
    kind = data.draw(st.sampled_from(["path", "value type", "drop", "add", "wrong shard", "top", "duplicate",
                                      "weight_map type", "none"]), "mutation")
    index = {"metadata": {"total_size": 0}, "weight_map": wm}
    text = None
    ok = False
    if kind == "path":
        wm[k] = data.draw(st.sampled_from([
            "../outside/model.safetensors", str(ws.outside / SHARD), "/dev/zero", "/etc/passwd",
            "sub/../" + wm[k], "./" + wm[k], wm[k] + "/", "", "missing.safetensors", "link/model.safetensors",
            "model-00001-of-00002.safetensors/../model-00002-of-00002.safetensors"]))
        os.symlink(ws.outside, ws.model / "link")   # ("./x" and "x/" name a shard twice: inconsistent too)
    elif kind == "value type":
        wm[k] = data.draw(st.sampled_from([None, 1, True, ["a"], {"a": "b"}]))
    elif kind == "drop":
        wm.pop(k)
    elif kind == "add":
        wm["model.extra.weight"] = wm[k]
    elif kind == "wrong shard":
        wm[k] = ({*wm.values()} - {wm[k]}).pop()
    elif kind == "top":
        index = data.draw(st.sampled_from([[wm], "x", None, {"weight_map": []}, {"weight_map": {}}, {"wm": wm}]))
    elif kind == "duplicate":
        text = json.dumps(index)[:-2] + ", " + json.dumps(k) + ": " + json.dumps(wm[k]) + "}}"
    elif kind == "weight_map type":
        index["weight_map"] = list(wm.items())
    elif kind == "none":
        ok = True
    ws.write(INDEX_NAME, (text or json.dumps(index)).encode())
    opened.clear()
    got = load_or_named_error(ws, [INDEX_NAME, "shard", "model-0000"])
    if ok:
        assert not isinstance(got, Exception), got
        same_tensors(got[1], pristine[2])
    else:
        assert isinstance(got, CheckpointError), f"{kind} loaded"
    never_outside(opened, ws)


def test_index_regressions(workspaces, pristine):
    ws = workspaces()
    wm = _sharded(ws, lambda ks: ks)
    ws.write(INDEX_NAME, json.dumps({"weight_map": wm}).encode())
    same_tensors(load_dir(ws.model)[1], pristine[2])            # the valid split loads exactly
    for index, match in [([1], "must be a JSON object"), ({"x": 1}, "has no weight_map"),
                         ({"weight_map": {"a": 3}}, "does not name a file")]:
        ws.write(INDEX_NAME, json.dumps(index).encode())
        with pytest.raises(CheckpointError, match=match):
            load_dir(ws.model)
    ws.write(INDEX_NAME, b"{not json")
    with pytest.raises(CheckpointError, match=f"{INDEX_NAME}: not valid JSON"):
        load_dir(ws.model)
    with open(ws.model / INDEX_NAME, "wb") as f:                 # bounded size: refused unread
        f.truncate((64 << 20) + 1)
    with pytest.raises(CheckpointError, match="more than the"):
        load_dir(ws.model)


# ---- configs ----------------------------------------------------------------------------------
def _hf(preset="test-a"):
    return kestrel.preset(preset).to_hf()


CONFIG_REGRESSIONS = [
    ("tie_word_embeddings", "false", "must be a JSON boolean"),
    ("tie_word_embeddings", 0, "must be a JSON boolean"),
    ("rms_norm_eps", 0, "finite number > 0"),
    ("rms_norm_eps", -1e-6, "finite number > 0"),
    ("rms_norm_eps", float("nan"), "finite number > 0"),
    ("rms_norm_eps", float("inf"), "finite number > 0"),
    ("rms_norm_eps", "1e-6", "finite number > 0"),
    ("hidden_size", 48.7, "must be an int"),
    ("hidden_size", "48", "must be an int"),
    ("hidden_size", True, "must be an int"),
    ("hidden_size", 64.0, "must be an int"),
    ("num_attention_heads", 0, "must be an int in \\[1, "),
    ("num_key_value_heads", 0, "must be an int in \\[1, "),
    ("linear_num_key_heads", 0, "must be an int in \\[1, "),
    ("full_attention_interval", 0, "must be an int in \\[1, "),
    ("vocab_size", -1, "must be an int in \\[1, "),
    ("vocab_size", 2 ** 40, "must be an int in \\[1, "),
    ("max_position_embeddings", 0, "must be an int in \\[1, "),
    ("intermediate_size", None, "must be an int"),
    ("head_dim", None, "must be an int"),
    ("linear_conv_kernel_dim", 1, "must be an int in \\[2, "),
    ("mtp_num_hidden_layers", 2, "must be 0 or 1"),
    ("num_key_value_heads", 3, "not a multiple"),
    ("linear_num_value_heads", 3, "not a multiple"),
    ("layer_types", ["linear_attention"] * 3, "entries for num_hidden_layers=4"),
    ("layer_types", "full_attention", "must be a list"),
    ("layer_types", ["linear_attention"] * 3 + [None], "unknown layer type"),
    ("model_type", "qwen3_next", "not a Qwen3.5"),
    ("mtp_use_dedicated_embeddings", True, "not supported"),
    ("attention_bias", 0, "not supported"),
    ("quantization_config", {"quant_method": "fp8"}, "not supported"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "not supported"),
]


@pytest.mark.parametrize("key,value,match", CONFIG_REGRESSIONS, ids=[f"{k}={v!r}" for k, v, _ in CONFIG_REGRESSIONS])
def test_config_value_is_refused_by_name(tmp_path, key, value, match):
    """Through the file, as a user meets it: a ConfigError naming the key and the value."""
    d = _hf()
    d[key] = value
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=match) as e:
        load_config(tmp_path)
    assert key in str(e.value) and (repr(value)[:20] in str(e.value) or key == "layer_types"), str(e.value)


@pytest.mark.parametrize("rope,match", [
    ({"rope_theta": 0}, "rope_theta=0 must be"), ({"rope_theta": -1e4}, "rope_theta"),
    ({"rope_theta": float("nan")}, "rope_theta"), ({"rope_theta": True}, "rope_theta"),
    ({"rope_theta": 1e4, "partial_rotary_factor": 0}, r"\(0, 1\]"),
    ({"rope_theta": 1e4, "partial_rotary_factor": 1.5}, r"\(0, 1\]"),
    ({"rope_theta": 1e4, "partial_rotary_factor": 0.0625}, "rotary dim .* = 1"),   # odd rotary dim
    ({"rope_theta": 1e4, "rope_type": "yarn"}, "rope_type='yarn'"),
    ({"rope_theta": 1e4, "factor": 8.0}, "rope_parameters.factor"),
    ({"full_attention": {"rope_theta": 1e4}}, "rope_parameters.full_attention"),
])
def test_rope_parameters_are_checked(rope, match):
    d = _hf()
    d["rope_parameters"] = rope
    with pytest.raises(ConfigError, match=match):
        from_hf(d)


@pytest.mark.parametrize("text,match", [("{", "not valid JSON"), ("[1, 2]", "JSON object"), ("", "not valid JSON"),
                                        ('{"vocab_size": 97, "vocab_size": 98}', "appears twice"),
                                        (b"\xff\xfe", "not UTF-8")])
def test_config_file_not_a_json_object(tmp_path, text, match):
    p = tmp_path / "config.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=match):
        load_config(tmp_path)


def test_tie_string_no_longer_drops_lm_head(tmp_path):
    """The issue's case: "false" (a string) was truthy, the model was tied and the checkpoint's
    lm_head silently dropped. Now the config is refused."""
    cfg = kestrel.preset("test-b")                  # untied: has an lm_head
    save_dir(tmp_path, cfg, random_weights(cfg, seed=fresh_seed()))
    d = json.loads((tmp_path / "config.json").read_text())
    d["tie_word_embeddings"] = "false"
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="tie_word_embeddings='false' must be a JSON boolean"):
        kestrel.load(tmp_path, device="cpu")


def test_nested_config_tie_flags():
    text = _hf("test-b")
    text.pop("tie_word_embeddings")
    assert from_hf({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True}).tie_word_embeddings
    text["tie_word_embeddings"] = False
    with pytest.raises(ConfigError, match="disagree"):
        from_hf({"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True})
    with pytest.raises(ConfigError, match="text_config"):
        from_hf({"model_type": "qwen3_5", "text_config": [text]})


def test_config_dataclass_runs_the_same_checks():
    base = kestrel.preset("test-a")
    for kw, match in [({"num_heads": 0}, "num_heads"), ({"num_kv_heads": 3}, "not a multiple"),
                      ({"rms_norm_eps": float("nan")}, "rms_norm_eps"), ({"rope_theta": 0.0}, "rope_theta"),
                      ({"hidden_size": True}, "hidden_size"), ({"hidden_size": 64.0}, "hidden_size"),
                      ({"tie_word_embeddings": "false"}, "tie_word_embeddings"), ({"layer_types": "abc"}, "layer_types"),
                      ({"partial_rotary_factor": 2.0}, "partial_rotary_factor"), ({"mtp_layers": 2}, "mtp_layers"),
                      ({"max_position_embeddings": 0}, "max_position_embeddings"), ({"conv_kernel": 1}, "conv_kernel")]:
        with pytest.raises(ConfigError, match=match):
            base.replace(**kw)
    c = base.replace(hidden_size=np.int64(64), rms_norm_eps=np.float32(1e-5), tie_word_embeddings=np.bool_(True))
    assert type(c.hidden_size) is int and type(c.rms_norm_eps) is float and c.tie_word_embeddings is True
    assert json.loads(json.dumps(c.to_hf()))["hidden_size"] == 64
    with pytest.raises(ConfigError, match="unknown preset") as e:
        kestrel.preset("qwen9")
    assert isinstance(e.value, KeyError) and str(e.value).startswith("unknown preset")


INT_KEYS = {"vocab_size": (1, None), "hidden_size": (1, None), "num_hidden_layers": (1, 4096),
            "num_attention_heads": (1, None), "num_key_value_heads": (1, None), "head_dim": (1, None),
            "intermediate_size": (1, None), "linear_num_key_heads": (1, None), "linear_num_value_heads": (1, None),
            "linear_key_head_dim": (1, None), "linear_value_head_dim": (1, None), "linear_conv_kernel_dim": (2, None),
            "mtp_num_hidden_layers": (0, 1), "max_position_embeddings": (1, None), "full_attention_interval": (1, None)}
REAL_KEYS = {"rms_norm_eps": (0, math.inf)}
ROPE_KEYS = {"rope_theta": (0, math.inf), "partial_rotary_factor": (0, 1)}
HOSTILE = (st.integers(-3, 40) | st.integers(2 ** 31 - 2, 2 ** 70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.booleans() | st.none() | st.sampled_from(["48", "false", "", "1e-6"]) | st.lists(st.integers(0, 3), max_size=2)
           | st.just({"a": 1}))


def _type_ok(key, v):
    if key in INT_KEYS:
        lo, hi = INT_KEYS[key]
        return type(v) is int and lo <= v <= (hi if hi is not None else 2 ** 31 - 1)
    lo, hi = {**REAL_KEYS, **ROPE_KEYS}[key]
    return type(v) in (int, float) and math.isfinite(v) and float(v) == v and lo < v <= hi


@PROPERTY
@given(key=st.sampled_from(sorted(INT_KEYS) + sorted(REAL_KEYS) + sorted(ROPE_KEYS)), value=HOSTILE,
       preset=st.sampled_from(["test-a", "test-b"]))
def test_config_schema_property(key, value, preset):
    """Any value at any key: a Config holding exactly that value, or a ConfigError naming the key
    (and, when the value itself is wrong, the value). Never another exception."""
    d = _hf(preset)
    if key in ROPE_KEYS:
        d["rope_parameters"][key] = value
    else:
        d[key] = value
    if key == "full_attention_interval" or key == "num_hidden_layers":
        d.pop("layer_types")                          # so the interval rule is what decides
    try:
        cfg = from_hf(d)
    except ConfigError as e:
        msg = str(e)
        assert key in msg, msg
        if not _type_ok(key, value):
            assert repr(value) in msg, msg
        return
    assert _type_ok(key, value), f"{key}={value!r} accepted"
    field = {"num_hidden_layers": "num_layers", "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
             "linear_num_key_heads": "lin_num_key_heads", "linear_num_value_heads": "lin_num_value_heads",
             "linear_key_head_dim": "lin_key_head_dim", "linear_value_head_dim": "lin_value_head_dim",
             "linear_conv_kernel_dim": "conv_kernel", "mtp_num_hidden_layers": "mtp_layers"}.get(key, key)
    if key == "full_attention_interval":
        assert cfg.attn_layers == tuple(i for i in range(cfg.num_layers) if (i + 1) % value == 0)
    else:
        assert getattr(cfg, field) == value and type(getattr(cfg, field)) is (float if key in REAL_KEYS or key in ROPE_KEYS else int)


@PROPERTY
@given(data=st.data())
def test_config_file_mutations(tmp_path_factory, data):
    """The config file cut short, a key dropped or duplicated: a ConfigError naming the problem,
    or (an optional key dropped) the config with that key's default."""
    d = _hf(data.draw(st.sampled_from(["test-a", "test-b"])))
    text = json.dumps(d)
    kind = data.draw(st.sampled_from(["cut", "drop", "duplicate"]))
    key = data.draw(st.sampled_from(sorted(d)))
    if kind == "cut":
        text = text[:data.draw(st.integers(0, len(text) - 1))]
    elif kind == "drop":
        d.pop(key)
        text = json.dumps(d)
    else:
        text = text[:-1] + ", " + json.dumps(key) + ": " + json.dumps(d[key]) + "}"
    p = tmp_path_factory.mktemp("cfg")
    (p / "config.json").write_text(text)
    try:
        cfg = load_config(p)
    except ConfigError as e:
        if kind == "cut":
            assert "not valid JSON" in str(e)
        elif kind == "duplicate":
            assert f"key {key!r} appears twice" in str(e)
        else:
            assert key in str(e)
        return
    assert kind == "drop" and key in ("architectures", "model_type", "layer_types", "rms_norm_eps", "rope_parameters",
                                      "tie_word_embeddings", "mtp_num_hidden_layers", "max_position_embeddings",
                                      "hidden_act", "attention_bias", "head_dim", "linear_conv_kernel_dim"), key
    assert cfg.num_layers == d["num_hidden_layers"]


# ---- engine inputs ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return kestrel.load("test-a", device="cpu", seed=fresh_seed())


def busy(model, rng):
    """An engine mid-sequence (prefill + MTP rows + a live mark), and its twin in the same state."""
    V, D = model.cfg.vocab_size, model.cfg.hidden_size
    toks = rng.integers(0, V, 6).tolist()
    engines = []
    for _ in range(2):
        e = kestrel.Engine(model, max_seq=32, mmax=3, batch="flex")
        s = e.prefill(toks)
        e.mtp_step(0, toks, s.hidden)
        e.mark()
        engines.append(e)
    same_state(engines[0].snapshot_state(), engines[1].snapshot_state())
    return engines


def refused_unchanged(e, call, exc=TokenError, match=None):
    before = e.snapshot_state()
    with pytest.raises(exc, match=match):
        call()
    same_state(before, e.snapshot_state())


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "complex", "bool", "object", "int", "float64 overflow",
                                 "list with a bool", "list of ints", "string"])
def test_hidden_must_be_finite_real_floats(model, rng, bad):
    """The issue's case: NaN hidden rows were written into the MTP cache and poisoned every later
    row. Now refused, the state unchanged, and the next valid row exactly as if never tried."""
    e, twin = busy(model, rng)
    D = model.cfg.hidden_size
    h = rng.standard_normal((2, D)).astype(np.float32)
    j = int(rng.integers(D))
    hostile = {"nan": lambda: np.where(np.arange(D) == j, np.nan, h), "inf": lambda: np.where(np.arange(D) == j, np.inf, h),
               "-inf": lambda: np.where(np.arange(D) == j, -np.inf, h), "complex": lambda: h.astype(np.complex64),
               "bool": lambda: h > 0, "object": lambda: h.astype(object), "int": lambda: (h * 10).astype(np.int32),
               "float64 overflow": lambda: np.where(np.arange(D) == j, 1e300, h.astype(np.float64)),
               "list with a bool": lambda: [[True] + row[1:].tolist() for row in h],
               "list of ints": lambda: [[int(v) for v in row * 10] for row in h],
               "string": lambda: "0.5"}[bad]()
    refused_unchanged(e, lambda: e.mtp_step(6, [1, 2], hostile),
                      match="NaN or Inf|must be real floats|must hold real floats|must be a float array")
    a = e.mtp_step(6, [1, 2], h)
    b = twin.mtp_step(6, [1, 2], h)
    assert np.array_equal(a.logits, b.logits) and np.all(np.isfinite(a.logits))
    same_state(e.snapshot_state(), twin.snapshot_state())


@pytest.mark.parametrize("tokens", [[1, True, 2], [True], np.array([1, 0], dtype=bool), [1, np.bool_(True)], True,
                                    np.bool_(False), [2 ** 70], 2 ** 70, np.array([2 ** 64 - 1], dtype=np.uint64),
                                    np.array([1, 2 ** 70], dtype=object), [1.0], [1, 2.5], "ab", b"ab", [[1, 2]],
                                    [1, "2"], [1, None], np.array([1.0]), [], np.array([], dtype=np.int64), {1, 2},
                                    (x for x in [1])])
def test_tokens_hostile(model, rng, tokens):
    e, _ = busy(model, rng)
    for call in (lambda: e.step_m(6, tokens), lambda: e.verify_checkpointed(6, tokens)):
        refused_unchanged(e, call, TokenError, "token|tokens")
    refused_unchanged(e, lambda: e.mtp_step(6, tokens, np.ones((1, model.cfg.hidden_size), np.float32)),
                      TokenError, "token|tokens|hidden")
    with pytest.raises(TokenError):
        kestrel.generate(model, tokens if not isinstance(tokens, (bool, np.bool_, int)) else [tokens], 2)


def test_numpy_integers_are_tokens_everywhere(model, rng):
    """np.int64/np.uint8/object arrays of ints give bit-identical results to plain ints."""
    V = model.cfg.vocab_size
    toks = rng.integers(0, V, 3)
    e, twin = busy(model, rng)
    for a, b in [(e.step_m(6, toks.astype(np.uint8)), twin.step_m(6, [int(t) for t in toks])),
                 (e.step(9, np.int16(toks[0])), twin.step(9, int(toks[0]))),
                 (e.step(10, np.array(toks[1])), twin.step(10, int(toks[1]))),
                 (e.step_m(np.int64(11), toks.astype(object)), twin.step_m(11, toks.tolist()))]:
        assert np.array_equal(a.logits, b.logits)
    same_state(e.snapshot_state(), twin.snapshot_state())
    assert kestrel.generate(model, toks, np.int64(3)) == kestrel.generate(model, toks.tolist(), 3)


TOKEN_ITEMS = (st.integers(0, 96) | st.integers(97, 2 ** 80) | st.integers(-2 ** 70, -1) | st.booleans()
               | st.floats(-5, 100) | st.integers(0, 96).map(np.int64) | st.integers(0, 96).map(np.uint16)
               | st.just(np.bool_(True)) | st.text(max_size=2) | st.none())


@PROPERTY
@given(items=st.lists(TOKEN_ITEMS, max_size=4), as_array=st.booleans())
def test_tokens_property(model, items, as_array):
    """Any sequence: accepted (bit-identical to the same plain ints) iff it is 1..3 ints in range."""
    rng = np.random.default_rng(len(items))
    e, twin = busy(model, rng)
    x = items
    if as_array:
        try:
            x = np.array(items)
        except (OverflowError, ValueError):
            x = np.array(items, dtype=object)
    def int_like(v):
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
    if as_array and x.dtype.kind in "iu":      # judged as the array NumPy made (it may have turned True into 1)
        elems = x.tolist()
    elif as_array and x.dtype.kind == "O":
        elems = list(x)
    elif as_array:
        elems = None                            # floats, strings, bools: refused
    else:
        elems = items
    valid = (elems is not None and 1 <= len(elems) <= 3 and all(int_like(v) for v in elems)
             and all(0 <= int(v) < 97 for v in elems))
    if valid:
        a = e.step_m(6, x)
        b = twin.step_m(6, [int(v) for v in elems])
        assert np.array_equal(a.logits, b.logits)
        same_state(e.snapshot_state(), twin.snapshot_state())
    else:
        refused_unchanged(e, lambda: e.step_m(6, x), KestrelError)


HIDDEN_DTYPES = ["float16", "float32", "float64", "complex64", "bool", "int32", "uint8", "object"]


@PROPERTY
@given(dtype=st.sampled_from(HIDDEN_DTYPES), m=st.integers(1, 3), extra=st.sampled_from([(), (1,), "short"]),
       poison=st.sampled_from([None, np.nan, np.inf, -np.inf, 1e300]), seed=st.integers(0, 2 ** 32 - 1))
def test_hidden_property(model, dtype, m, extra, poison, seed):
    rng = np.random.default_rng(seed)
    e, twin = busy(model, rng)
    D = model.cfg.hidden_size
    shape = (m, D - 1) if extra == "short" else (m, D) + extra
    h = rng.standard_normal(shape)
    if poison is not None:
        h.flat[int(rng.integers(h.size))] = poison
    with np.errstate(all="ignore"):
        x = h.astype(dtype) if dtype != "object" else h.astype(object)
    with np.errstate(over="ignore"):
        valid = (dtype.startswith("float") and shape == (m, D)
                 and bool(np.all(np.isfinite(np.asarray(x, dtype=np.float64).astype(np.float32)))))
    toks = rng.integers(0, 97, m)
    if valid:
        a = e.mtp_step(6, toks, x)
        b = twin.mtp_step(6, toks.tolist(), np.asarray(x, dtype=np.float32))
        assert np.array_equal(a.logits, b.logits)
        same_state(e.snapshot_state(), twin.snapshot_state())
    else:
        refused_unchanged(e, lambda: e.mtp_step(6, toks, x))


@pytest.mark.parametrize("n", [10 ** 6, 513, 0, -1, True, 2.0, "64", np.float64(8), None])
def test_engine_max_seq_bounded_and_typed(model, n):
    """The issue's case: Engine(max_seq=10**6) allocated 3 GB. Now sizes above
    max_position_embeddings are refused before anything is allocated."""
    tracemalloc.start()
    try:
        with pytest.raises(KestrelError, match="max_seq must be an int") as e:
            kestrel.Engine(model, max_seq=n)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    if isinstance(n, int) and not isinstance(n, bool) and n > 512:
        assert "max_position_embeddings" in str(e.value)
    assert kestrel.Engine(model, max_seq=np.int32(512)).max_seq == 512   # the bound itself, NumPy int accepted


def test_generate_sizes_bounded(model, rng):
    prompt = rng.integers(0, 97, 4).tolist()
    for n, match in [(509, "n_tokens must be an int in \\[0, 508\\]"), (-1, "n_tokens"), (True, "n_tokens"),
                     (2.0, "n_tokens"), (10 ** 9, "max_position_embeddings")]:
        with pytest.raises(KestrelError, match=match):
            kestrel.generate(model, prompt, n)
    with pytest.raises(KestrelError, match="max_seq"):
        kestrel.generate(model, prompt, 4, max_seq=7)          # too small for prompt + n
    with pytest.raises(KestrelError, match="prompt length"):
        kestrel.generate(model, [1] * 513, 0)
    with pytest.raises(KestrelError, match="kestrel Model"):
        kestrel.generate("tiny", prompt, 2)
    assert kestrel.generate(model, prompt, np.uint8(5)) == kestrel.generate(model, prompt, 5)


def test_prefill_bounded_by_max_seq(model, rng):
    e = kestrel.Engine(model, max_seq=8)
    refused_unchanged(e, lambda: e.prefill(rng.integers(0, 97, 9)), kestrel.CursorError, "exceeds max_seq=8")
    refused_unchanged(e, lambda: e.step(2 ** 70, 1), kestrel.CursorError, "max_seq")


def test_inputs_count_and_is_int():
    assert inputs.count(np.int64(3), "k", 1, 4) == 3 and type(inputs.count(np.uint8(3), "k")) is int
    assert inputs.count(np.array(2), "k") == 2
    for bad in (True, np.bool_(True), 1.0, "1", None, [1], np.array([1])):
        with pytest.raises(KestrelError, match="k must be an int"):
            inputs.count(bad, "k")
    with pytest.raises(KestrelError, match=r"in \[1, 4\] \(4 = the limit\), got 5"):
        inputs.count(5, "k", 1, 4, "the limit")
    assert not inputs.is_int(True) and not inputs.is_int(np.bool_(False)) and inputs.is_int(np.int8(1))


# ---- one base class ---------------------------------------------------------------------------
def test_every_error_is_a_kestrel_error():
    for cls in (kestrel.ConfigError, kestrel.CheckpointError, kestrel.DeviceError, kestrel.TokenError,
                kestrel.CursorError, kestrel.BatchWidthError, kestrel.SnapshotError):
        assert issubclass(cls, kestrel.KestrelError) and issubclass(cls, ValueError), cls
    assert issubclass(kestrel.DeviceError, RuntimeError)
    with pytest.raises(kestrel.KestrelError, match="unknown device"):
        kestrel.load("test-a", device="tpu")
    import kestrel.config as config_module
    assert config_module.ConfigError is kestrel.ConfigError          # still importable from kestrel.config
    import kestrel.weights as weights_module
    assert weights_module.CheckpointError is kestrel.CheckpointError


@pytest.mark.parametrize("value", [2 ** 53 + 1, 10 ** 400])
@pytest.mark.parametrize("key", ["rms_norm_eps", "rope_theta", "partial_rotary_factor"])
def test_config_real_that_no_float_holds(key, value):
    """An int a float cannot hold exactly would load as another number (2**53 + 1 -> 2**53), or
    overflow the conversion (10**400): refused by name, never rounded or an OverflowError."""
    d = _hf("test-a")
    d[key] = value
    d.pop("rope_parameters", None)
    with pytest.raises(ConfigError, match=key):
        from_hf(d)
