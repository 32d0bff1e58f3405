"""Programmatic dependent launch: cuLaunchKernelEx (CUDA driver API, through ctypes) with the
programmatic-stream-serialization attribute, used only while a plan's CUDA graph is captured.

Each kernel may then begin while its predecessor drains (griddep_launch / griddep_wait in
kernels/common.cuh): it hides the launch gap, and a projection starts streaming its weights
early. The ctypes structures mirror cuda.h (sizes asserted).
"""
from __future__ import annotations

import ctypes

import numpy as np


class _LaunchAttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("i", ctypes.c_int)]


class _LaunchAttr(ctypes.Structure):       # CUlaunchAttribute (cuda.h): 72 bytes, value at 8
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _LaunchAttrValue)]


class _LaunchConfig(ctypes.Structure):     # CUlaunchConfig (cuda.h): 56 bytes
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_CTYPE = {np.dtype(np.uint64): ctypes.c_uint64, np.dtype(np.int64): ctypes.c_int64,
          np.dtype(np.int32): ctypes.c_int32, np.dtype(np.float32): ctypes.c_float}


class PDL:
    """cuLaunchKernelEx (driver API, through ctypes) with programmatic stream serialization, so a
    kernel may begin (griddep_launch / griddep_wait in kernels/common.cuh) while the previous one
    drains: it hides the launch gap and the start of the weight stream between dependent kernels.
    Used only while capturing a plan's CUDA graph."""

    def __init__(self):
        assert ctypes.sizeof(_LaunchAttr) == 72 and ctypes.sizeof(_LaunchConfig) == 56
        lib = ctypes.CDLL("libcuda.so.1")
        self.fn = lib.cuLaunchKernelEx
        self.fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.c_void_p]
        self.fn.restype = ctypes.c_int
        self.attr = _LaunchAttr()
        self.attr.id = _CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        self.attr.value.i = 1

    def launch(self, fn, grid, block, args, smem: int, stream_ptr: int):
        g, b = tuple(grid) + (1, 1), tuple(block) + (1, 1)
        cfg = _LaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], int(smem), stream_ptr, ctypes.pointer(self.attr), 1)
        vals = [_CTYPE[np.asarray(a).dtype](a.item()) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals])
        rc = self.fn(ctypes.byref(cfg), fn.kernel.ptr, params, None)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed (CUresult {rc})")


_DRIVER = None


def driver() -> "PDL":
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = PDL()
    return _DRIVER
