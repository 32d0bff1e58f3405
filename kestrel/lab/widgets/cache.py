"""Models and engines the live widgets keep between runs (changing k or the policy never reloads weights;
a GPU backend's captured plans are keyed on an engine's buffers, so reusing the engine keeps them)."""
from __future__ import annotations
from kestrel.backend import cuda_available
import kestrel

REAL_PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b")   # random weights, GPU only
SMALL_MODELS = ("tiny", "test-a", "test-b")

MODELS: dict = {}
ENGINES: dict = {}
WARMED: set = set()          # (engine, greedy engine, policy, drafter, pairing) warmed up on a GPU


def gpu(device: str) -> bool:
    if device == "cpu":
        return False
    return cuda_available()


def model_choices(device: str = "auto") -> list:
    """Model names spec_replay offers: the tiny model and the test shapes, plus the real-shape
    presets (random weights) where a CUDA GPU is present."""
    return list(SMALL_MODELS) + (list(REAL_PRESETS) if gpu(device) else [])


def get_model(name: str = "tiny", device: str = "auto", dtype: str | None = None):
    """kestrel.load(name, device, dtype), cached. dtype defaults to 'bf16' for the real-shape
    presets and 'fp32' otherwise. Loading a real-shape preset first drops the other real-shape
    presets from the cache (GPU memory)."""
    dtype = dtype or ("bf16" if name in REAL_PRESETS else "fp32")
    key = (name, device, dtype)
    if key not in MODELS:
        if name in REAL_PRESETS:
            for kk in [kk for kk in MODELS if kk[0] in REAL_PRESETS]:
                _drop(kk)
        MODELS[key] = kestrel.load(name, device=device, dtype=dtype)
    return MODELS[key]


def _drop(key):
    m = MODELS.pop(key, None)
    for ek in [ek for ek in ENGINES if ek[0] is m]:
        eng = ENGINES.pop(ek)
        for w in [w for w in WARMED if eng in w[:2]]:
            WARMED.discard(w)
    del m
    import gc
    gc.collect()
    import sys
    cp = sys.modules.get("cupy")
    if cp is not None:
        cp.get_default_memory_pool().free_all_blocks()


def clear_cache():
    """Forget every cached model and engine."""
    for key in list(MODELS):
        _drop(key)
    ENGINES.clear()
    WARMED.clear()


def engine(model, k: int, batch: str, need: int, cap: int):
    """A cached Engine (mmax=k, batch) with max_seq >= need (allocated at max(need, cap), at most
    the model's max_position_embeddings, so that longer runs reuse it)."""
    key = (model, k, batch)
    eng = ENGINES.get(key)
    if eng is None or eng.max_seq < need:
        size = min(max(need, cap), model.cfg.max_position_embeddings)
        ENGINES[key] = eng = kestrel.Engine(model, max_seq=size, mmax=k, batch=batch)
    return eng
