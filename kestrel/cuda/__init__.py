"""The CUDA backend: kestrel's kernels (kernels/*.cu) through CuPy's NVRTC, decode as CUDA graphs.

    launch.py    compiling kernels (NVRTC, the -D constants), shared-memory opt-in, launching
    pdl.py       programmatic dependent launch (cuLaunchKernelEx through ctypes)
    plan.py      a plan: a fixed list of launches over fixed buffers, replayed as a CUDA graph
    cache.py     which plans the backend keeps (PLAN_CACHE per model, LRU), when one is lowered and captured
    lower.py     lowering a model program (kestrel/program.py) into a plan
    segments.py  a batched pass's segment tables, rewritten by the host before each run (NumPy)
    backend.py   CUDABackend: weights, buffers, clocks, `run`, random weights drawn on the GPU

The launchers themselves live beside their NumPy twins in kestrel/ops. Only launch.py,
cache.py and segments.py are importable without CuPy; the rest is imported when a CUDA backend is asked for.
"""


def __getattr__(name):
    if name == "CUDABackend":
        from . import backend
        return getattr(backend, name)
    raise AttributeError(name)
