"""kestrel: speculative decoding with an MTP draft head on hybrid (GDN + attention) models.

    model = kestrel.load("tiny")                 # the embedded model (CPU, or CUDA if present)
    eng = kestrel.Engine(model, max_seq=256, mmax=3, batch="strict")
    s = eng.prefill(tokens); s = eng.step(eng.cursor, t); ...
    kestrel.generate(model, prompt, 64)         # the greedy reference stream
"""
from __future__ import annotations

from pathlib import Path

from .backend import get_backend
from .config import PRESETS, Config, from_hf, preset
from .draft import Draft, DraftFeed
from .engine import Engine, Step, generate
from .errors import (BatchWidthError, CheckpointError, ConfigError, CursorError, DeviceError, KestrelError,
                     SnapshotError, TokenError)
from .model import Model
from .tokenizer import ByteTokenizer
from .weights import load_dir, random_weights

ASSETS = Path(__file__).resolve().parent / "assets"
WEIGHT_DTYPES = ("fp32", "bf16")

__all__ = ["load", "Engine", "Step", "Draft", "DraftFeed", "generate", "to_numpy", "Model", "Config", "PRESETS", "preset",
           "KestrelError", "CursorError", "BatchWidthError", "SnapshotError", "TokenError", "DeviceError",
           "CheckpointError", "ConfigError", "ByteTokenizer", "from_hf", "starts"]


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
    if dtype not in WEIGHT_DTYPES:
        raise KestrelError(f"dtype must be one of {WEIGHT_DTYPES}, got {dtype!r}")
    be = get_backend(device, kernels)
    tok = None
    if isinstance(name_or_path, Config) or (isinstance(name_or_path, str) and name_or_path in PRESETS):
        cfg = name_or_path if isinstance(name_or_path, Config) else PRESETS[name_or_path]
        if hasattr(be, "random_weights"):          # CUDA: large shapes drawn on the GPU
            tensors, stacks, source = be.random_weights(cfg, seed=seed, dtype=dtype)
        else:
            tensors, stacks, source = random_weights(cfg, seed), {}, f"random(seed={seed})"
        model = Model(cfg, tensors, be, source=source, weight_dtype=dtype, stacks=stacks)
    else:
        path = ASSETS / "tiny" if name_or_path == "tiny" else Path(name_or_path)
        if name_or_path == "tiny" and not (path / "config.json").exists():
            raise FileNotFoundError(f"the embedded tiny model is missing from {path}")
        cfg, tensors = load_dir(path)
        model = Model(cfg, tensors, be, source=str(path.resolve()), weight_dtype=dtype)  # the directory read
        if cfg.vocab_size == 256:
            tok = ByteTokenizer()
    model.tokenizer = tok
    return model


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
