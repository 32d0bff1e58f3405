"""kestrel's environment variables: the one module of the package that reads them.

Each is a documented default for scripts and notebooks; code that wants another value passes it
explicitly (a CUDA backend's KernelOptions, a results writer's commit). The README lists them.
"""
from __future__ import annotations

import os

# name -> (default, what it sets)
VARIABLES = {
    "KESTREL_BF16_GEMV": ("tmb", "the bf16 GEMV of a CUDA backend made without gemv= (tmb | fma)"),
    "KESTREL_GDN_RECUR": ("cluster", "the GDN recurrence kernel a CUDA backend prefers (cluster | regs | smem)"),
    "KESTREL_PDL": ("1", "0: no programmatic dependent launch in CUDA graphs"),
    "KESTREL_PDL_ORDER": ("", "a kernel's start under PDL (launch-first | wait-first; default: the GEMV's own)"),
    "KESTREL_TILED_ONLY": ("1", "0: a CUDA backend on the tmb GEMV keeps each projection's rows beside its tiled copy"),
    "KESTREL_DEVICE_NAME": ("", "the device name the laboratory's provenance lines print (default: detected)"),
    "KESTREL_COMMIT": ("", "the commit a results file records where the tree has no git history"),
}


def get(name: str) -> str:
    """The variable's value, or its default when unset."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of kestrel's variables ({', '.join(VARIABLES)})")
    return os.environ.get(name, VARIABLES[name][0])


KERNEL_SWITCHES = ("KESTREL_BF16_GEMV", "KESTREL_GDN_RECUR", "KESTREL_PDL", "KESTREL_PDL_ORDER", "KESTREL_TILED_ONLY")


def kernel_switches(env=None) -> dict:
    """The kernel variables that are set (in `env`, default this process's): a results file's
    command line names them, so the command reruns the same kernels."""
    env = os.environ if env is None else env
    return {k: env[k] for k in KERNEL_SWITCHES if k in env}
