"""Checkpoints: safetensors load/save/validate (never pickle), seeded random init.

Canonical names have no prefix ("layers.3.mlp.up_proj.weight", "mtp.fc.weight").
On disk (Hugging Face layout) the main model lives under `model.` (or
`model.language_model.` for the multimodal wrapper), the head is `lm_head.weight`
unless tied, and the MTP head is `mtp.*`.

The safetensors format is parsed here directly (8-byte header length, JSON header,
raw little-endian data) because NumPy has no bfloat16: bf16 tensors are widened to
float32 on load (exact), or kept as raw uint16 bits for the GPU.

A checkpoint is data from elsewhere, so loading trusts none of it:
  * every file opened is a regular file inside the model directory (kestrel.confined);
  * each header is validated completely (parse_header) before any tensor is read;
  * names, shapes and dtypes are checked against the config before any tensor is read,
    so a header that claims gigabytes the config does not describe costs nothing;
  * tensors are copied out of a read-only memory map, never read as one whole file.
Every failure is a CheckpointError naming the file and, where one is at fault, the tensor.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .confined import member, model_root, open_member, parse_json, read_member
from .config import Config, int_prod, load_config
from .errors import CheckpointError, CheckpointNotFoundError
from .memory import ensure_fits
from .program import expected_shapes

__all__ = ["CheckpointError", "read_safetensors", "write_safetensors", "parse_header", "SafetensorsFile",
           "checkpoint_files", "validate", "load_dir", "save_dir", "random_weights", "canonical_name",
           "disk_name", "bf16_to_f32", "f32_to_bf16"]

# safetensors dtype -> NumPy dtype (little-endian, as the format stores them). BF16 is read
# as its raw uint16 bits: NumPy has no bfloat16.
_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2"),
           "I64": np.dtype("<i8"), "I32": np.dtype("<i4")}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")   # what a weight may be stored as
MAX_HEADER_BYTES = 100 << 20    # a 27B checkpoint's header is ~100 KiB; absurd lengths are refused unread
MAX_INDEX_BYTES = 64 << 20      # likewise for the shard index
INDEX_NAME = "model.safetensors.index.json"
_ENTRY_KEYS = frozenset(("dtype", "shape", "data_offsets"))


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bits (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (0x7FFF + ((u >> 16) & 1))
    return (rounded >> 16).astype(np.uint16)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as a validated header describes it (offsets relative to the data section)."""
    name: str
    dtype: str
    shape: tuple
    begin: int
    end: int


def _is_json_int(x) -> bool:
    return type(x) is int   # a JSON integer: not a bool, not a float such as 4.0


def parse_header(header, where: str, data_len: int) -> tuple:
    """Validate a decoded safetensors header completely: ({name: TensorEntry}, metadata).

    where: the file, for messages. data_len: the bytes after the header. The format's rules:
    a JSON object of tensor entries, each exactly {dtype, shape, data_offsets}, plus an
    optional __metadata__ of str -> str; a known dtype; a shape of non-negative ints;
    data_offsets [begin, end], begin <= end, holding prod(shape) * itemsize bytes; and the
    tensors tile the data section exactly (in some order), with no overlap and no gap."""
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: safetensors header is a JSON {type(header).__name__}, not an object")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{where}: __metadata__ must be an object of strings to strings, got {metadata!r:.200}")
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tensor = f"{where}: tensor {name!r}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{tensor}: header entry is a JSON {type(info).__name__}, not an object")
        if set(info) != _ENTRY_KEYS:
            missing, extra = sorted(_ENTRY_KEYS - set(info)), sorted(set(info) - _ENTRY_KEYS)
            raise CheckpointError(f"{tensor}: header entry must have exactly dtype, shape and data_offsets"
                                  + (f"; missing {missing}" if missing else "")
                                  + (f"; unexpected {extra}" if extra else ""))
        dt, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or dt not in _DTYPES:
            raise CheckpointError(f"{tensor} has unsupported dtype {dt!r:.40} (kestrel reads {sorted(_DTYPES)})")
        if not isinstance(shape, list) or not all(_is_json_int(d) and d >= 0 for d in shape):
            raise CheckpointError(f"{tensor}: shape {shape!r:.200} is not a list of non-negative ints")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_json_int(o) and o >= 0 for o in offsets)):
            raise CheckpointError(f"{tensor}: data_offsets {offsets!r:.200} are not two non-negative ints")
        begin, end = offsets
        if begin > end:
            raise CheckpointError(f"{tensor}: data_offsets [{begin}, {end}] end before they begin")
        if end > data_len:
            raise CheckpointError(f"{tensor}: data_offsets [{begin}, {end}] run past the end of the data "
                                  f"section ({data_len} bytes)")
        nbytes = int_prod(shape) * _DTYPES[dt].itemsize
        if end - begin != nbytes:
            raise CheckpointError(f"{tensor}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but "
                                  f"{dt} of shape {shape} is {nbytes} bytes")
        entries[name] = TensorEntry(name, dt, tuple(shape), begin, end)
    pos, prev = 0, None
    for e in sorted(entries.values(), key=lambda e: (e.begin, e.end, e.name)):
        if e.begin < pos:
            raise CheckpointError(f"{where}: tensors {prev.name!r} [{prev.begin}, {prev.end}] and {e.name!r} "
                                  f"[{e.begin}, {e.end}] overlap")
        if e.begin > pos:
            raise CheckpointError(f"{where}: bytes [{pos}, {e.begin}) before tensor {e.name!r} belong to no "
                                  f"tensor (the format requires the tensors to cover the data without gaps)")
        pos, prev = e.end, e
    if pos != data_len:
        raise CheckpointError(f"{where}: the data section has {data_len} bytes but the tensors cover {pos} "
                              f"(the format requires them to cover it exactly)")
    return entries, metadata


class SafetensorsFile:
    """One open safetensors file with a validated header. Tensors are read later, only when
    asked for, from a read-only memory map. Use as a context manager (closes the file).

    root, name: the model directory and the file's name in it (confined to root)."""

    def __init__(self, root, name: str, what: str = "shard"):
        self.root, self.name, self.where = Path(root), name, name
        self.fd = None
        self.fd, self.size = open_member(self.root, name, what)
        try:
            self._read_header()
        except BaseException:
            self.close()
            raise

    def _read_header(self):
        where, size = self.where, self.size
        if size < 8:
            raise CheckpointError(f"{where}: not a safetensors file ({size} bytes; too short for a header)")
        (n,) = struct.unpack("<Q", os.pread(self.fd, 8, 0))
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(f"{where}: safetensors header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
        if n > size - 8:
            raise CheckpointError(f"{where}: corrupt safetensors header length {n} (the file has {size - 8} "
                                  f"bytes after the length)")
        raw = os.pread(self.fd, n, 8)
        if len(raw) != n:
            raise CheckpointError(f"{where}: the file shrank while its header was read")
        header = parse_json(raw, f"{where}: corrupt safetensors header", allow_constants=False)
        self.data_start = 8 + n
        self.entries, self.metadata = parse_header(header, where, size - self.data_start)

    def read(self, names=None, keep_bf16: bool = False) -> dict:
        """name -> owned np.ndarray, copied out of the map (so a model never depends on the
        file staying unchanged); BF16 widened to float32 exactly, or ('bf16', uint16 bits)."""
        names = list(self.entries) if names is None else list(names)
        if not names:
            return {}
        try:
            mm = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) if self.size > self.data_start else None
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{self.where}: cannot be memory-mapped ({e})") from None
        out = {}
        try:
            for name in names:
                e = self.entries[name]
                dt = _DTYPES[e.dtype]
                count = int_prod(e.shape)
                if count == 0:
                    arr = np.zeros(e.shape, dt.newbyteorder("="))
                else:
                    view = np.frombuffer(mm, dtype=dt, count=count, offset=self.data_start + e.begin)
                    arr = view.reshape(e.shape).astype(dt.newbyteorder("="), copy=True)  # owned, native order
                    del view
                if e.dtype == "BF16":
                    arr = ("bf16", arr) if keep_bf16 else bf16_to_f32(arr)
                out[name] = arr
        finally:
            if mm is not None:
                try:
                    mm.close()
                except BufferError:  # a view outlived an error above; the map closes when it is freed
                    pass
        return out

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_safetensors(path, keep_bf16: bool = False) -> dict:
    """name -> np.ndarray. bf16 becomes float32 unless keep_bf16 (then ('bf16', uint16 bits)).

    The file must be a regular file inside its own directory (no symlink leaving it); the
    header is validated completely before a tensor is read."""
    path = Path(path)
    with SafetensorsFile(model_root(path.parent), path.name, "safetensors file") as f:
        return f.read(keep_bf16=keep_bf16)


def write_safetensors(path, tensors: dict, bf16: bool = False, metadata: dict | None = None):
    """Write float tensors as F32, or as BF16 (rounded) when bf16=True."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if bf16 and a.dtype.kind == "f":
            data, dt = f32_to_bf16(a.astype(np.float32)).tobytes(), "BF16"
        else:
            a = a.astype(np.float32) if a.dtype.kind == "f" else a
            dt = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}[a.dtype]
            data = a.tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def canonical_name(key: str) -> str | None:
    """Disk key -> canonical name; None for tensors kestrel ignores (vision tower)."""
    if key.startswith("model.visual.") or key.startswith("visual."):
        return None
    for prefix in ("model.language_model.", "model."):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key  # lm_head.weight, mtp.*


def disk_name(name: str) -> str:
    return name if name.startswith(("mtp.", "lm_head.")) else "model." + name


def _read_index(root: Path) -> dict:
    """The index's weight_map (tensor name -> shard name), validated."""
    raw = read_member(root, INDEX_NAME, "shard index", MAX_INDEX_BYTES)
    index = parse_json(raw, INDEX_NAME)
    if not isinstance(index, dict):
        raise CheckpointError(f"{INDEX_NAME}: must be a JSON object, got a {type(index).__name__}")
    if "weight_map" not in index:
        raise CheckpointError(f"{INDEX_NAME}: has no weight_map")
    wm = index["weight_map"]
    if not isinstance(wm, dict) or not wm:
        raise CheckpointError(f"{INDEX_NAME}: weight_map must be a non-empty object of tensor name -> shard file, "
                              f"got {wm!r:.200}")
    bad = [(k, v) for k, v in wm.items() if not isinstance(v, str)]
    if bad:
        raise CheckpointError(f"{INDEX_NAME}: weight_map entry {bad[0][0]!r} -> {bad[0][1]!r:.100} does not name a file")
    return wm


def _shards(root: Path) -> tuple:
    """(shard names relative to root, weight_map or None). Every name is checked (confined,
    existing, a regular file) before any shard is opened."""
    if os.path.lexists(root / INDEX_NAME):
        wm = _read_index(root)
        names = sorted(set(wm.values()))
        missing = []
        for n in names:
            try:
                member(root, n, f"{INDEX_NAME}: shard")
            except CheckpointNotFoundError:
                missing.append(n)
        if missing:
            raise CheckpointNotFoundError(f"{INDEX_NAME} names shard(s) that do not exist in {root}: {missing[:5]}")
        return names, wm
    names = sorted(p.name for p in root.iterdir() if p.name.endswith(".safetensors"))
    if not names:
        if any(p.suffix in (".bin", ".pt", ".pth", ".ckpt") for p in root.iterdir()):
            raise CheckpointError(f"{root}: only pickle checkpoints (.bin/.pt) found; kestrel loads safetensors only")
        raise CheckpointError(f"{root}: no *.safetensors files")
    for n in names:
        member(root, n, "shard")
    return names, None


def checkpoint_files(directory) -> list:
    """The shard files a checkpoint directory loads from (resolved, each inside it)."""
    root = model_root(directory)
    return [member(root, n, "shard") for n in _shards(root)[0]]


def _check_layout(cfg: Config, shapes: dict, where: dict | None = None, keys: dict | None = None,
                  dtypes: dict | None = None, source: str = "checkpoint"):
    """canonical name -> shape against the config: every expected tensor present with its
    shape, nothing unexpected, weights floating point. where/keys: the file and disk key of
    each tensor (for messages)."""
    where, keys, dtypes = where or {}, keys or {}, dtypes or {}
    at = lambda n: f"{where[n]}: " if n in where else ""  # noqa: E731
    key = lambda n: keys.get(n, disk_name(n))  # noqa: E731
    want = expected_shapes(cfg)
    for name, shape in want.items():
        if name not in shapes:
            raise CheckpointError(f"{source} is missing tensor {disk_name(name)!r} (expected shape {list(shape)})")
        if tuple(shapes[name]) != tuple(shape):
            raise CheckpointError(f"{at(name)}tensor {key(name)!r} has shape {list(shapes[name])}, "
                                  f"config says {list(shape)}")
        if name in dtypes and dtypes[name] not in FLOAT_DTYPES:
            raise CheckpointError(f"{at(name)}tensor {key(name)!r} has dtype {dtypes[name]}; "
                                  f"weights must be one of {list(FLOAT_DTYPES)}")
    extra = sorted(set(shapes) - set(want))
    if extra:
        raise CheckpointError(f"{at(extra[0])}{source} has tensor(s) the config does not describe: "
                              f"{[key(e) for e in extra[:5]]}")


def _check_finite(tensors: dict, where: dict | None = None, keys: dict | None = None):
    where, keys = where or {}, keys or {}
    for name, t in tensors.items():
        a = bf16_to_f32(t[1]) if isinstance(t, tuple) else t
        if not np.all(np.isfinite(a)):
            at = f"{where[name]}: " if name in where else ""
            raise CheckpointError(f"{at}tensor {keys.get(name, disk_name(name))!r} contains NaN or Inf")


def validate(cfg: Config, tensors: dict, need_mtp: bool | None = None):
    """Every expected tensor present with its shape; nothing unexpected; all finite. Raises naming the tensor."""
    shapes = {n: (t[1].shape if isinstance(t, tuple) else np.shape(t)) for n, t in tensors.items()}
    _check_layout(cfg, shapes)
    _check_finite(tensors)


def _files(shards: list) -> str:
    names = [s.name for s in shards]
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:2])} and {len(names) - 2} more shards"


def _plan(cfg: Config, root: Path, shards: list, weight_map: dict | None) -> dict:
    """canonical name -> (shard, disk key) of every tensor to read, checked against the
    index and the config from the headers alone."""
    if weight_map is not None:
        for key, shard_name in weight_map.items():
            shard = next(s for s in shards if s.name == shard_name)
            if key not in shard.entries:
                raise CheckpointError(f"{INDEX_NAME} maps tensor {key!r} to {shard_name}, which does not hold it")
        for s in shards:
            for key in s.entries:
                if weight_map.get(key) != s.name:
                    raise CheckpointError(f"{s.name}: holds tensor {key!r}, which {INDEX_NAME} "
                                          + (f"maps to {weight_map[key]}" if key in weight_map else "does not list"))
    plan = {}
    for s in shards:
        for key in s.entries:
            name = canonical_name(key)
            if name is None:
                continue
            if name in plan:
                other, okey = plan[name]
                raise CheckpointError(f"tensor {name!r} appears twice in the checkpoint: as {okey!r} in "
                                      f"{other.name} and as {key!r} in {s.name}")
            plan[name] = (s, key)
    if cfg.tie_word_embeddings:
        plan.pop("lm_head.weight", None)  # some exporters write the tied copy anyway; it is not read
    _check_layout(cfg, {n: s.entries[k].shape for n, (s, k) in plan.items()},
                  where={n: s.name for n, (s, _) in plan.items()}, keys={n: k for n, (_, k) in plan.items()},
                  dtypes={n: s.entries[k].dtype for n, (s, k) in plan.items()},
                  source=f"checkpoint {root.name} ({_files(shards)})")
    return plan


def _ensure_read_fits(plan: dict, keep_bf16: bool, root: Path):
    """Refuse before reading when the tensors (BF16 widened to float32 unless kept) exceed host memory:
    a sparse file can declare a vocabulary of billions in a few bytes."""
    need = 0
    for s, key in plan.values():
        e = s.entries[key]
        width = 2 if (e.dtype == "BF16" and keep_bf16) else max(_DTYPES[e.dtype].itemsize, 4)
        need += int_prod(e.shape) * width
    ensure_fits(need, f"checkpoint {root.name}'s tensors", "cpu")


def load_dir(path, keep_bf16: bool = False):
    """(Config, canonical tensors) from a HF-format directory, validated.

    Everything is checked from the config and the headers before a tensor is read; then
    each tensor is copied out of its file's memory map and checked for NaN/Inf."""
    root = model_root(path)
    cfg = load_config(root)
    names, weight_map = _shards(root)
    shards = []
    try:
        for n in names:
            shards.append(SafetensorsFile(root, n, "shard"))
        plan = _plan(cfg, root, shards, weight_map)
        _ensure_read_fits(plan, keep_bf16, root)
        tensors = {}
        for s in shards:
            mine = {k: n for n, (sh, k) in plan.items() if sh is s}
            for key, arr in s.read(mine, keep_bf16=keep_bf16).items():
                tensors[mine[key]] = arr
    finally:
        for s in shards:
            s.close()
    _check_finite(tensors, where={n: s.name for n, (s, _) in plan.items()}, keys={n: k for n, (_, k) in plan.items()})
    return cfg, tensors


def save_dir(path, cfg: Config, tensors: dict, bf16: bool = False, extra_config: dict | None = None):
    """Write config.json + model.safetensors in the Hugging Face layout (transformers loads it)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    validate(cfg, tensors)
    hf = cfg.to_hf()
    hf.update(extra_config or {})
    (directory / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    write_safetensors(directory / "model.safetensors", {disk_name(n): t for n, t in tensors.items()},
                      bf16=bf16, metadata={"format": "pt"})


def random_weights(cfg: Config, seed: int = 0) -> dict:
    """Seeded random float32 weights for any config (host NumPy; small shapes).

    Norm weights are drawn around 0 (zero-centred RMSNorm multiplies by 1 + w) and
    the GDN gates are drawn in their trained ranges, so tests exercise every term.
    """
    rng = np.random.default_rng(seed)
    return {name: random_tensor(name, shape, rng) for name, shape in expected_shapes(cfg).items()}


def random_scale(name: str, shape) -> float:
    """The standard deviation random_weights gives a projection matrix (unit gain)."""
    return 1.0 if name == "embed_tokens.weight" else 1.0 / float(np.sqrt(shape[-1]))


def random_tensor(name: str, shape, rng) -> np.ndarray:
    """One tensor of random_weights' families, drawn from `rng`."""
    if name.endswith("A_log"):
        a = np.log(rng.uniform(1.0, 16.0, shape))
    elif name.endswith("dt_bias"):
        a = rng.uniform(-1.0, 1.0, shape)
    elif name.endswith("linear_attn.norm.weight"):
        a = 1.0 + 0.1 * rng.standard_normal(shape)     # plain-w gated norm
    elif name.endswith("norm.weight") or "layernorm" in name or "pre_fc_norm" in name:
        a = 0.1 * rng.standard_normal(shape)           # zero-centred norms
    elif name == "embed_tokens.weight":
        a = rng.standard_normal(shape)
    else:
        a = rng.standard_normal(shape) / np.sqrt(shape[-1])          # conv taps, unit-gain projections
    return np.ascontiguousarray(a, dtype=np.float32)
