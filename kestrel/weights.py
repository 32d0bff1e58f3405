"""Checkpoints: safetensors load/save/validate (never pickle), seeded random init.

Canonical names have no prefix ("layers.3.mlp.up_proj.weight", "mtp.fc.weight").
On disk (Hugging Face layout) the main model lives under `model.` (or
`model.language_model.` for the multimodal wrapper), the head is `lm_head.weight`
unless tied, and the MTP head is `mtp.*`.

The safetensors format is parsed here directly (8-byte header length, JSON header,
raw little-endian data) because NumPy has no bfloat16: bf16 tensors are widened to
float32 on load (exact), or kept as raw uint16 bits for the GPU.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .config import Config, expected_shapes, load_config


class CheckpointError(ValueError):
    """A checkpoint that does not match its config: names the tensor."""


_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32}


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even float32 -> bf16 bits (uint16)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + (0x7FFF + ((u >> 16) & 1))
    return (rounded >> 16).astype(np.uint16)


def read_safetensors(path, keep_bf16: bool = False) -> dict:
    """name -> np.ndarray. bf16 becomes float32 unless keep_bf16 (then ('bf16', uint16 bits))."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise CheckpointError(f"{path.name}: not a safetensors file (too short)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise CheckpointError(f"{path.name}: corrupt safetensors header length {n}")
    try:
        header = json.loads(raw[8:8 + n])
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path.name}: corrupt safetensors header ({e})") from None
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info.get("dtype")
        if dt not in _DTYPES:
            raise CheckpointError(f"{path.name}: tensor {name!r} has unsupported dtype {dt!r}")
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw[base + a:base + b], dtype=_DTYPES[dt]).reshape(info["shape"])
        if dt == "BF16":
            arr = ("bf16", arr.copy()) if keep_bf16 else bf16_to_f32(arr)
        else:
            arr = arr.copy()
        out[name] = arr
    return out


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


def checkpoint_files(directory: Path) -> list:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: unreadable index ({e})") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (directory / f).exists()]
        if missing:
            raise CheckpointError(f"{index.name} names shard(s) that do not exist: {missing}")
        return [directory / f for f in files]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        if list(directory.glob("*.bin")) or list(directory.glob("*.pt")):
            raise CheckpointError(f"{directory}: only pickle checkpoints (.bin/.pt) found; kestrel loads safetensors only")
        raise CheckpointError(f"{directory}: no *.safetensors files")
    return files


def validate(cfg: Config, tensors: dict, need_mtp: bool | None = None):
    """Every expected tensor present with its shape; nothing unexpected. Raises naming the tensor."""
    shapes = expected_shapes(cfg)
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointError(f"checkpoint is missing tensor {disk_name(name)!r} (expected shape {list(shape)})")
        t = tensors[name]
        got = tuple(t[1].shape if isinstance(t, tuple) else t.shape)
        if got != tuple(shape):
            raise CheckpointError(f"tensor {disk_name(name)!r} has shape {list(got)}, config says {list(shape)}")
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise CheckpointError(f"checkpoint has tensor(s) the config does not describe: {[disk_name(e) for e in extra[:5]]}")
    for name, t in tensors.items():
        a = bf16_to_f32(t[1]) if isinstance(t, tuple) else t
        if not np.all(np.isfinite(a)):
            raise CheckpointError(f"tensor {disk_name(name)!r} contains NaN or Inf")


def load_dir(path, keep_bf16: bool = False):
    """(Config, canonical tensors) from a HF-format directory, validated."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {directory} does not exist")
    cfg = load_config(directory)
    tensors = {}
    for f in checkpoint_files(directory):
        for key, arr in read_safetensors(f, keep_bf16=keep_bf16).items():
            name = canonical_name(key)
            if name is None:
                continue
            if name in tensors:
                raise CheckpointError(f"tensor {key!r} appears twice in the checkpoint")
            tensors[name] = arr
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # some exporters write the tied copy anyway
    validate(cfg, tensors)
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
    out = {}
    for name, shape in expected_shapes(cfg).items():
        if name.endswith("A_log"):
            a = np.log(rng.uniform(1.0, 16.0, shape))
        elif name.endswith("dt_bias"):
            a = rng.uniform(-1.0, 1.0, shape)
        elif name.endswith("linear_attn.norm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)     # plain-w gated norm
        elif name.endswith("norm.weight") or "layernorm" in name or "pre_fc_norm" in name:
            a = 0.1 * rng.standard_normal(shape)           # zero-centred norms
        elif name.endswith("conv1d.weight"):
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])
        elif name == "embed_tokens.weight":
            a = rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[-1])  # unit-gain projections
        out[name] = a.astype(np.float32)
    return out
