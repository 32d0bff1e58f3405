"""kestrel: speculative decoding with an MTP draft head on hybrid (GDN + attention) models.

    model = kestrel.load("tiny")                 # the embedded model (CPU, or CUDA if present)
    eng = kestrel.Engine(model, max_seq=256, mmax=3, batch="strict")
    s = eng.prefill(tokens); s = eng.step(eng.cursor, t); ...
    kestrel.generate(model, prompt, 64)         # the greedy reference stream
"""
from __future__ import annotations

import os
from pathlib import Path

from . import inputs
from .backend import get_backend
from .batch import BatchEngine
from .config import PRESETS, Config, from_hf, int_prod, preset
from .draft import Draft, DraftFeed
from .engine import Engine, Step, generate
from .errors import (BatchWidthError, CheckpointError, CheckpointNotFoundError, ConfigError, CursorError, DeviceError,
                     InsufficientMemoryError, KestrelError, SlotError, SnapshotError, TokenError)
from .memory import ensure_fits
from .model import Model
from .program import expected_shapes
from .tokenizer import ByteTokenizer
from .weights import load_dir, random_weights

ASSETS = Path(__file__).resolve().parent / "assets"
WEIGHT_DTYPES = ("fp32", "bf16")

__all__ = ["load", "Engine", "BatchEngine", "Step", "Draft", "DraftFeed", "generate", "to_numpy", "Model", "Config", "PRESETS", "preset",
           "KestrelError", "CursorError", "BatchWidthError", "SnapshotError", "TokenError", "DeviceError",
           "CheckpointError", "ConfigError", "InsufficientMemoryError", "SlotError", "ByteTokenizer", "from_hf", "starts"]


def load(name_or_path="tiny", device: str = "auto", dtype: str = "fp32", seed: int = 0, kernels=None) -> Model:
    """Load a model.

    name_or_path: "tiny" (the embedded checkpoint), a preset name from kestrel.PRESETS
    (random weights drawn with `seed`), a Config (random weights), or a directory holding
    config.json + *.safetensors in the Hugging Face layout.
    device: "auto" (CUDA if CuPy sees a GPU, else CPU), "cpu" or "cuda".
    dtype: projection weights "fp32" or "bf16" (norms, gates and all state stay fp32).
    kernels: which CUDA kernels run (kestrel.cuda.options.KernelOptions or a dict of its fields,
    e.g. {"gemv": "tmb"}); chosen once, with the backend. None: the defaults.
    """
    source = _source(name_or_path)
    if not (isinstance(dtype, str) and dtype in WEIGHT_DTYPES):
        raise KestrelError(f"dtype must be one of {WEIGHT_DTYPES}, got {dtype!r:.40}")
    seed = inputs.count(seed, "seed", 0, 2 ** 64 - 1)
    if not isinstance(device, str):
        raise DeviceError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r:.40}")
    be = get_backend(device, kernels)
    tok = None
    if isinstance(source, Config):
        cfg = source
        _ensure_weights_fit(cfg, be, dtype)
        if hasattr(be, "random_weights"):          # CUDA: large shapes drawn on the GPU
            tensors, stacks, source = be.random_weights(cfg, seed=seed, dtype=dtype)
        else:
            tensors, stacks, source = random_weights(cfg, seed), {}, f"random(seed={seed})"
        model = Model(cfg, tensors, be, source=source, weight_dtype=dtype, stacks=stacks)
    else:
        path = source
        if path == ASSETS / "tiny" and not (path / "config.json").exists():
            raise FileNotFoundError(f"the embedded tiny model is missing from {path}")
        cfg, tensors = load_dir(path)
        if be.name != "cpu":     # on the CPU, load_dir has checked the tensors it read against host memory
            _ensure_weights_fit(cfg, be, dtype)
        model = Model(cfg, tensors, be, source=str(path.resolve()), weight_dtype=dtype)  # the directory read
        if cfg.vocab_size == 256:
            tok = ByteTokenizer()
    model.tokenizer = tok
    return model


def _source(name_or_path):
    """A Config (random weights; presets resolved to theirs) or the checkpoint directory's Path."""
    if isinstance(name_or_path, Config):
        return name_or_path
    if isinstance(name_or_path, str) and name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if isinstance(name_or_path, str) and name_or_path == "tiny":
        return ASSETS / "tiny"
    if not isinstance(name_or_path, (str, os.PathLike)) or isinstance(name_or_path, bytes):
        raise KestrelError(f"load takes 'tiny', a preset name ({', '.join(PRESETS)}), a Config or a checkpoint "
                           f"directory (a str or Path), got {name_or_path!r:.60} ({type(name_or_path).__name__})")
    path = os.fspath(name_or_path)
    if isinstance(path, bytes):
        raise KestrelError(f"load takes a checkpoint directory as a str or Path, got the bytes path {path!r:.60}")
    if "\0" in path:
        raise CheckpointNotFoundError(f"checkpoint directory {path!r:.80} holds a NUL byte; no file has that name")
    return Path(path)


def _ensure_weights_fit(cfg: Config, be, dtype: str):
    """Refuse a model whose weights cannot fit on the backend's device. Random weights on the CPU
    are drawn per tensor in float64 and kept in float32; on a GPU, projections are kept in bf16
    with dtype='bf16'."""
    shapes = expected_shapes(cfg)
    sizes = [int_prod(s) for s in shapes.values()]
    if be.name == "cpu":
        need = 4 * sum(sizes) + 12 * max(sizes)
    else:
        need = (2 if dtype == "bf16" else 4) * sum(sizes)
    ensure_fits(need, f"the weights of {cfg.name} ({sum(sizes):,} parameters, {dtype})", be.name)


def starts() -> list:
    """The six fixed start prompts (short Python snippets): the article's "six starts"."""
    import json
    return json.loads((ASSETS / "tiny" / "starts.json").read_text())


def to_numpy(x):
    """Any backend array (NumPy, CuPy) -> numpy.ndarray."""
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):
        return x.get()
    import numpy as np
    return np.asarray(x)
