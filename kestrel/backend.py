"""Backends: NumPy (CPU, the reference) or CuPy (CUDA, kernels/*.cu), chosen once per model.

A backend runs a model's programs (kestrel/program.py) on the engine's DeviceState
(kestrel/state.py) through one method, `run`. The CPU backend below executes each op through
its NumPy twin in kestrel/ops; the CUDA backend (kestrel/cuda/) lowers the same program into
a fused launch plan of the kernels in kernels/. Both also hold weights (`put_weight`), make
zeroed buffers, time with their own clocks and argmax on their own arrays.
"""
from __future__ import annotations

import platform
import time
from dataclasses import dataclass

import numpy as np

from .draft import DraftFeed
from .errors import DeviceError
from .weights import bf16_to_f32, f32_to_bf16
from .ops import attention as _attn
from .ops import head as _head
from .ops import gdn as _gdn
from .ops import linear as _linear
from .ops import mlp as _mlp
from .ops import norm as _norm
from .ops import rope as _rope


def _single_threaded_blas():
    """Run BLAS on one thread (process-wide). kestrel's projections are small GEMMs (8 rows),
    where handing work to a second thread costs more than it saves, and OpenBLAS threads that
    spin-wait on a busy 2-core machine made a tiny-model token take tens of times longer
    than on one. Results do not depend on it: each output element's reduction order
    is the same on one thread or several."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


@dataclass(frozen=True)
class Segment:
    """One sequence's rows lo..hi-1 of a pass (hi None: to the end), at positions pos.. on its
    DeviceState st, its GDN layers in gdn_mode (kestrel/program.py GDN_MODES)."""
    st: object
    pos: int
    lo: int
    hi: int | None
    gdn_mode: str = "in_place"


class CPUBackend:
    name = "cpu"
    xp = np
    kernels = None          # one way to compute each op: nothing to choose

    def __init__(self):
        self.device_name = f"CPU ({platform.machine()}, NumPy {np.__version__})"
        self._rope_cache = {}
        _single_threaded_blas()

    # ---- memory ---------------------------------------------------------------------
    def put_weight(self, name: str, a: np.ndarray, dtype: str = "fp32"):
        """Weights live in float32. dtype='bf16' rounds the projection matrices through bf16
        first (RNE), so the CPU computes with exactly the weights a bf16 GPU run holds."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "bf16" and a.ndim == 2:
            a = bf16_to_f32(f32_to_bf16(a))
        return a

    def asarray(self, a, dtype=np.float32):
        return np.ascontiguousarray(a, dtype=dtype)

    def zeros(self, shape, dtype=np.float32):
        return np.zeros(shape, dtype)

    def to_numpy(self, a) -> np.ndarray:
        return np.asarray(a)

    def sync(self):
        pass

    def now(self):
        """A timestamp; elapsed_ms(a, b) gives ms between two. (CUDA: device events.)"""
        return time.perf_counter()

    def elapsed_ms(self, a, b) -> float:
        return (b - a) * 1e3

    # ---- the program, op by op --------------------------------------------------------
    def run(self, model, prog, st, tokens, pos: int, hid=None, gdn_mode: str = "in_place"):
        """Execute `prog` (kestrel/program.py) over M rows at positions pos..pos+M-1 on the
        engine's DeviceState `st`. Returns (hidden [M, D], logits [M, V]), None for a program
        that has none (mtp_fill)."""
        if isinstance(tokens, DraftFeed):
            tokens = tokens.host()
        env = {"tokens": np.asarray(tokens, dtype=np.int64)}
        if hid is not None:
            env["hid"] = np.ascontiguousarray(hid, dtype=np.float32)
        self.execute(model, prog, prog.ops, env, st, pos, gdn_mode)
        return env.get(prog.hidden), env.get(prog.logits)

    def mtp_chain(self, model, prog, st, token: int, hid, pos: int, k: int, forced=None, fill=None):
        """k rows of the MTP program, each fed by the one before (Model.mtp_draft): row j reads
        (x_j, h_j); x_{j+1} = argmax(logits_j) or forced[j], h_{j+1} = its hidden. fill =
        (tokens [m], hidden [m, D]): m rows before row 0, in row 0's pass (one M = m+1 run).
        -> (argmax tokens [k] int64, hiddens [k, D])."""
        return self.mtp_chain_batch(model, prog, [(st, token, hid, pos, k, forced, fill)])[0]

    def run_batch(self, model, prog, calls: list, hids: list | None = None, room: tuple = (1, 1)) -> list:
        """Several sequences' rows in one pass of `prog` (the batched engine, kestrel/batch.py):
        calls = [(DeviceState, tokens [m_i], pos_i, gdn_mode_i)]. The row-wise ops (embed, norms,
        projections) run once over every call's rows stacked; the ops with state (GDN,
        attention) run each call's rows on its own state at its own positions. A projection
        computes each row on its own (ops/linear.py: fixed 8-row blocks), so every call's rows
        come out bit-identical to the same call made alone. -> [(hidden [m_i, D], logits [m_i, V])].
        room (the most sequences and rows a sequence the caller's passes have) sizes the CUDA
        backend's plans; the CPU makes none and ignores it."""
        toks, segs, lo = [], [], 0
        for st, tokens, pos, gdn_mode in calls:
            t = np.asarray(tokens.host() if isinstance(tokens, DraftFeed) else tokens, dtype=np.int64)
            toks.append(t)
            segs.append(Segment(st, pos, lo, lo + len(t), gdn_mode))
            lo += len(t)
        env = {"tokens": np.concatenate(toks)}
        if hids is not None:           # the MTP program's main-model hidden rows, one block per call
            env["hid"] = np.ascontiguousarray(np.concatenate([np.asarray(h, np.float32).reshape(len(t), -1)
                                                              for h, t in zip(hids, toks)]))
        self.execute_segments(model, prog, prog.ops, env, segs)
        h, lg = env.get(prog.hidden), env.get(prog.logits)
        return [(h[s.lo:s.hi], lg[s.lo:s.hi]) for s in segs]

    def mtp_chain_batch(self, model, prog, chains: list, room: tuple = (1, 1)) -> list:
        """Several sequences' draft chains in lockstep, row j of every chain in one pass:
        chains = [(DeviceState, token, hid [1, D], pos, k, forced, fill)] as mtp_chain takes them
        -> [(tokens [k], hiddens [k, D])], each bit-identical to its mtp_chain alone."""
        outs, cur = [], []
        for st, token, hid, pos, k, forced, fill in chains:
            x, h = [token], np.asarray(hid, np.float32).reshape(1, -1)
            if fill is not None:
                x, h = [int(t) for t in fill[0]] + x, np.concatenate([np.asarray(fill[1], np.float32), h])
            outs.append((np.empty(k, np.int64), np.empty((k, model.cfg.hidden_size), np.float32)))
            cur.append([x, h, pos])
        for j in range(max(c[4] for c in chains)):
            live = [i for i, c in enumerate(chains) if j < c[4]]
            res = self.run_batch(model, prog, [(chains[i][0], cur[i][0], cur[i][2], "in_place") for i in live],
                                 hids=[cur[i][1] for i in live], room=room)
            for i, (h, lg) in zip(live, res):
                forced = chains[i][5]
                cur[i][2] += len(cur[i][0])
                t = self.argmax(lg[-1])
                outs[i][0][j], outs[i][1][j] = t, h[-1]
                cur[i][0], cur[i][1] = [int(t) if forced is None else int(forced[j])], h[-1:]
        return outs

    def fold(self, model, prog, st, n: int):
        """The fold program over the first n cached GDN input rows, in place."""
        env = {f"gdn_in.{g}": st.gdn_in[g, :n] for g in range(st.gdn_in.shape[0])}
        self.execute(model, prog, prog.ops, env, st, 0, "in_place")

    def fold_batch(self, model, prog, folds: list, room: tuple = (1, 1)):
        """Several sequences' folds: folds = [(n, DeviceState)], one after another."""
        for n, st in folds:
            self.fold(model, prog, st, n)

    def execute(self, model, prog, ops, env: dict, st, pos: int, gdn_mode: str = "in_place"):
        """Run `ops` (a slice of `prog`, e.g. one layer's mixer) on the buffers in `env`: one
        sequence's rows at positions pos.. on DeviceState st."""
        return self.execute_segments(model, prog, ops, env, [Segment(st, pos, 0, None, gdn_mode)])

    def execute_segments(self, model, prog, ops, env: dict, segs: list):
        """Run `ops` on the buffers in `env`, whose rows are the Segments' (one a sequence)."""
        for op in ops:
            self._OPS[op.kind](self, model, prog, op, env, segs)
        return env

    @staticmethod
    def _per_segment(env, op, segs, fn):
        """dst = fn(segment, its rows of src) for each segment, stacked in
        segment order."""
        src = env[op.src]
        if len(segs) == 1 and segs[0].lo == 0 and segs[0].hi in (None, src.shape[0]):
            env[op.dst] = fn(segs[0], src)
            return
        outs = [fn(s, src[s.lo:s.hi]) for s in segs]
        env[op.dst] = np.concatenate(outs)

    def _embed(self, model, prog, op, env, segs):
        env[op.dst] = _head.embed(model.w[op.weights[0].name], env[op.src])

    def _rmsnorm(self, model, prog, op, env, segs):
        x = env[op.src]
        y = _norm.rmsnorm(x, model.w[op.weights[0].name], model.cfg.rms_norm_eps)
        width = prog.width(op.dst)
        if width == y.shape[1]:
            env[op.dst] = y
            return
        if op.col == 0:        # the first part of a concatenation
            env[op.dst] = np.empty((x.shape[0], width), np.float32)
        env[op.dst][:, op.col:op.col + y.shape[1]] = y

    def _linear(self, model, prog, op, env, segs):
        x, w = env[op.src], model.w
        parts = [_linear.linear(x, w[wt.name]) for wt in op.weights]   # each weight on its own (see program.py)
        if op.epilogue == "swiglu":
            env[op.dst] = _mlp.swiglu(*parts)
            return
        y = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        env[op.dst] = env[op.dst] + y if op.epilogue == "add" else y

    def _gdn(self, model, prog, op, env, segs):
        c, w = model.cfg, model.w
        conv_w, A_log, dt_bias, norm_w = (w[wt.name] for wt in op.weights)
        g = op.state[1]

        def one(seg, rows):
            st, m = seg.st, rows.shape[0]
            if seg.gdn_mode == "cache":       # keep the rows' inputs for the fold
                st.gdn_in[g, :m] = rows
            S, hist, S_to, hist_to = st.gdn_slots(g, m, seg.gdn_mode)
            return _gdn.gdn_rows(_gdn.GDNShape.of(c), *_gdn.split_in_proj(c, rows), conv_w.reshape(conv_w.shape[0], -1),
                                 A_log, dt_bias, norm_w, S, hist, S_to, hist_to)
        self._per_segment(env, op, segs, one)

    def _attention(self, model, prog, op, env, segs):
        c, w = model.cfg, model.w

        def one(seg, ain):
            pos, m = seg.pos, ain.shape[0]
            kc, vc = seg.st.kv(op.state)
            cos, sin = self._rope(c, pos + m)
            qg, k, v = _attn.split_in_proj(ain, c.num_heads, c.num_kv_heads, c.head_dim)
            return _attn.attention_block(qg, k, v, w[op.weights[0].name], w[op.weights[1].name], cos[pos:pos + m],
                                         sin[pos:pos + m], kc, vc, pos, c.rms_norm_eps, c.head_dim ** -0.5)
        self._per_segment(env, op, segs, one)

    _OPS = {"embed": _embed, "rmsnorm": _rmsnorm, "linear": _linear, "gdn": _gdn, "attention": _attention}

    def _rope(self, cfg, n: int):
        key = (cfg.rot_dim, cfg.rope_theta)
        t = self._rope_cache.get(key)
        if t is None or t[0].shape[0] < n:
            m = max(n, 256, 2 * (t[0].shape[0] if t else 0))
            t = self._rope_cache[key] = _rope.rope_tables(cfg.rot_dim, cfg.rope_theta, m)
        return t

    def argmax(self, logits) -> np.ndarray:
        return _head.argmax(np.asarray(logits))


def cuda_available() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_backend(device: str = "auto", kernels=None):
    """The backend for `device`; kernels: the CUDA backend's KernelOptions (or a dict of them),
    refused for the CPU, which has one way to compute each op."""
    if device not in ("auto", "cpu", "cuda"):
        raise DeviceError(f"unknown device {device!r}; use 'auto', 'cpu' or 'cuda'")
    if device == "cpu" or (device == "auto" and not cuda_available()):
        if kernels:
            raise DeviceError(f"kernels={kernels!r}: kernel options choose CUDA kernels; the CPU backend has none")
        return CPUBackend()
    if not cuda_available():
        raise DeviceError("device='cuda' but no CUDA GPU is visible to CuPy (is cupy installed and a GPU present?)")
    from .cuda import CUDABackend  # noqa: PLC0415 (only on GPU machines)
    return CUDABackend(kernels=kernels)
