"""A plan: a fixed list of launches over fixed buffers, replayed as a CUDA graph.

The host writes a plan's ctrl block (positions, the live GDN slot, the tokens: kernels/
common.cuh) through pinned staging buffers before each run, so one captured graph serves
every position. The first run is eager (it also compiles the kernels); from the second on,
the launches are captured once (with programmatic dependent launch where the backend allows
it, else without) and the graph is replayed.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from .. import nvrtc as L
from .pdl import driver as pdl_driver


class Staging:
    """Pinned host buffers in a ring, each reused only after its last copy has completed, so
    the host can enqueue step after step without waiting for the GPU."""

    def __init__(self, stream, n: int = 64, words: int = 1024):
        self.stream = stream
        self.mem = [cp.cuda.alloc_pinned_memory(words * 4) for _ in range(n)]
        self.buf = [np.frombuffer(m, np.int32, words) for m in self.mem]
        self.ev = [None] * n
        self.i = 0
        self.held = []          # (event, pinned memory) of put_array copies still in flight

    def put(self, dev, values):
        k = len(values)
        if k > self.buf[0].size:
            dev[:k].set(np.asarray(values, np.int32))
            return
        i = self.i
        self.i = (i + 1) % len(self.buf)
        ev = self.ev[i]
        if ev is not None:
            ev.synchronize()
        else:
            ev = self.ev[i] = cp.cuda.Event(block=False, disable_timing=True)
        self.buf[i][:k] = values
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, self.buf[i].ctypes.data, k * 4,
                                    cp.cuda.runtime.memcpyHostToDevice, self.stream.ptr)
        ev.record(self.stream)


    def put_array(self, dev, host: np.ndarray):
        """dev[...] = host, any dtype and size (a batched plan's segment tables), through pinned
        memory of its own that is kept until its copy has completed."""
        while self.held and self.held[0][0].done:
            self.held.pop(0)
        mem = cp.cuda.alloc_pinned_memory(host.nbytes)
        buf = np.frombuffer(mem, host.dtype, host.size)
        buf[:] = host.reshape(-1)
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, buf.ctypes.data, host.nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                    self.stream.ptr)
        ev = cp.cuda.Event(block=False, disable_timing=True)
        ev.record(self.stream)
        self.held.append((ev, mem))


class Plan:
    """Launches over buffers a plan owns (`bufs`: activations, ctrl) or that outlive it (the
    engine's DeviceState, the model's weights: their addresses are part of the plan's key)."""

    def __init__(self, be, M: int, graphable: bool):
        self.be, self.M, self.graphable = be, M, graphable
        self.launches = []
        self.bufs = {}
        self.keep = []
        self.graph = None
        self.pdl = False
        self.calls = 0
        self.ctrl = cp.zeros(L.CTRL_TOK + M, np.int32)

    def add(self, launch):
        self.launches.append(launch)

    def buf(self, name: str, *shape):
        """The plan's activation buffer `name` (made on first use)."""
        b = self.bufs.get(name)
        if b is None:
            b = self.bufs[name] = self.be.empty(shape)
        return b

    def _issue(self, pdl: bool = False):
        if pdl:     # each kernel compiled for the engine's PDL order (griddep_enter in common.cuh)
            drv, sp, order = pdl_driver(), self.be.stream.ptr, self.be.kernels.pdl_order
            for fn, grid, block, args, sm in self.launches:
                drv.launch(L.in_pdl_order(fn, order), grid, block, args, sm, sp)
        else:
            for fn, grid, block, args, sm in self.launches:
                fn(grid, block, args, shared_mem=sm)

    def capture(self, pdl: bool):
        """A CUDA graph of the launches (not launched)."""
        st = self.be.stream
        with st:          # RawKernel launches go to the current stream: make sure it is the captured one
            st.begin_capture()
            try:
                self._issue(pdl)
            finally:
                g = st.end_capture()
        return g

    def run(self):
        be = self.be
        if self.graph is not None:
            self.graph.launch(be.stream)
            be.stats["graph_replays"] += 1
            return
        if self.graphable and be.use_graphs and self.calls >= 1:
            for pdl in ((True, False) if be.pdl else (False,)):
                try:
                    g = self.capture(pdl)
                except Exception as e:  # try without PDL, else keep working eagerly, but say so
                    be.stats["graph_errors"].append(f"capture(pdl={pdl}): {e!r}")
                    if pdl:
                        be.pdl = False
                    continue
                self.graph, self.pdl = g, pdl
                be.stats["graphs_captured"] += 1
                be.stats["pdl_graphs"] += int(pdl)
                g.launch(be.stream)
                be.stats["graph_replays"] += 1
                self.calls += 1
                return
            self.graphable = False
        with be.stream:
            self._issue()
        be.stats["eager_runs"] += 1
        self.calls += 1
