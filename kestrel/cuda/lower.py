"""Lowering a model program (kestrel/program.py) into a plan of kernel launches.

One function per op kind turns the op into launches of its kernels (the launchers live in
kestrel/ops beside the NumPy twins) over the plan's activation buffers, the model's weights
and the engine's DeviceState:

    embed      embed_launch, tokens read from the plan's ctrl block
    rmsnorm    rmsnorm_launch (into a column range of its output for the MTP's concatenation)
    linear     one gemv_launch over the stacked matrix with the op's epilogue (stacked=True), or
               one per weight into column ranges of the output (+ swiglu_launch) (stacked=False);
               with the "tmb" kernel each matrix's tiled copy (CUDABackend.tiled)
    gdn        gdn_conv_launch + gdn_recur_launch on the state ring (in place, per-row slots, or
               read only, the in-projection then writing straight into DeviceState.gdn_in)
    attention  kv_append_launch + attn_decode_launch on the op's KV cache

Positions and the live slot are read from the ctrl block at run time, so a plan serves every
position. Every row is computed by the same arithmetic whatever M is (see each kernel's header).
lower_batch lowers one pass over several sequences (the batched engine): the same launches, the
ops with state given a segment table that hands each sequence its own state and position
(segments.py: the host rewrites the tables before each run, so one plan serves many mixes).
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..ops import attention as _attn
from ..ops import gdn as _gdn
from ..ops import head as _head
from ..ops import linear as _linear
from ..ops import mlp as _mlp
from ..ops import norm as _norm
from .. import nvrtc as L
from .cache import GRAPH_MAX_ROWS
from .segments import TableSpec
from .plan import Plan


class _Ctx:
    def __init__(self, be, model, prog, st, M: int, gdn_mode: str, batch=None):
        self.be, self.model, self.prog, self.st, self.M, self.gdn_mode = be, model, prog, st, M, gdn_mode
        self.batch = batch          # a batched pass: its BatchShape, else None (one sequence on st)
        self.cfg, self.w = model.cfg, model.w
        self.P = Plan(be, M, graphable=M <= GRAPH_MAX_ROWS or batch is not None)
        self.bufs = {name: self.P.buf(name, M, width) for name, width in prog.buffers
                     if not name.startswith("gdn_in.")}
        for g in range(st.gdn_in.shape[0]):     # the cached GDN inputs live in the engine's state
            self.bufs[f"gdn_in.{g}"] = st.gdn_in[g, :M]
        self.stacked = be.stacked(model) if be.stack_projections else {}
        self.redirect = {}                      # op index -> the buffer it writes instead of op.dst
        if gdn_mode == "cache":                 # each GDN in-projection writes its layer's cache rows
            for i, op in enumerate(prog.ops):
                if op.kind == "gdn":
                    self.redirect[i - 1] = self.redirect[i] = f"gdn_in.{op.state[1]}"

    def table(self, p0, p1=None, rows: str = "all"):
        """A segment table of the batched plan (kestrel/cuda/segments.py), its entries' P0 and P1
        given as views into this layout's DeviceState (st): the host fills it before each run."""
        spec = TableSpec(_where(self.st, p0), None if p1 is None else _where(self.st, p1), rows)
        self.P.seg_specs.append(spec)
        return self.P.seg_dev[len(self.P.seg_specs) - 1]

    def ld(self, name: str) -> int:
        if self.batch is not None or not name.startswith("gdn_in."):
            return self.prog.width(name)
        return int(self.st.gdn_in.shape[2])


def _embed(c: _Ctx, op):
    c.P.add(_head.embed_launch(c.w[op.weights[0].name], c.P.ctrl[L.CTRL_TOK:], c.bufs[op.dst], c.ld(op.dst), c.M))


def _rmsnorm(c: _Ctx, op):
    w = c.w[op.weights[0].name]
    n = op.weights[0].shape[0]
    dst = c.bufs[op.dst][:, op.col:]
    c.P.add(_norm.rmsnorm_launch(c.bufs[op.src], c.ld(op.src), w, dst, c.ld(op.dst), c.M, n, c.cfg.rms_norm_eps))


def _gemv(c: _Ctx, W, X, Y, K: int, ldx: int, ldy: int, epilogue: str = "store", half: int = 0):
    """One projection; under the tiled tensor-core kernel its weights' tiled copy comes along."""
    gemv, tiled = c.be.kernels.gemv, None
    if isinstance(W, _linear.TiledOnly):       # the original is gone: only the tiled kernels can run
        if W.tiled is None or not _linear.tmb_eligible(W, K, X, ldx):
            raise ValueError(f"{W.name}: kept only as its tiled copy (tiled_only), but this launch cannot take "
                             f"the tiled kernel (K {K}, ldx {ldx}, activations at {X.data.ptr % 16} mod 16 bytes)")
        return _linear.gemv_launch(W, X, Y, c.M, K, ldx, ldy, epilogue, half, gemv=gemv, tiled=W.tiled)
    if gemv == "tmb" and _linear.tmb_eligible(W, K, X, ldx):
        tiled = c.be.tiled(c.model, W, epilogue, half)
    return _linear.gemv_launch(W, X, Y, c.M, K, ldx, ldy, epilogue, half, gemv=gemv, tiled=tiled)


def _linear_op(c: _Ctx, op, dst: str):
    X, Y, K = c.bufs[op.src], c.bufs[dst], op.weights[0].shape[1]
    ldx, ldy = c.ld(op.src), c.ld(dst)
    if op.stack and op.stack in c.stacked:
        half = op.weights[0].shape[0] if op.epilogue == "swiglu" else 0
        c.P.add(_gemv(c, c.stacked[op.stack], X, Y, K, ldx, ldy, op.epilogue, half))
        return
    if len(op.weights) == 1:
        c.P.add(_gemv(c, c.w[op.weights[0].name], X, Y, K, ldx, ldy, op.epilogue))
        return
    if op.epilogue == "swiglu":      # gate and up into scratch, then the elementwise kernel
        I = op.weights[0].shape[0]
        g, u = c.P.buf(f"{op.dst}.gate", c.M, I), c.P.buf(f"{op.dst}.up", c.M, I)
        c.P.add(_gemv(c, c.w[op.weights[0].name], X, g, K, ldx, I))
        c.P.add(_gemv(c, c.w[op.weights[1].name], X, u, K, ldx, I))
        c.P.add(_mlp.swiglu_launch(g, u, Y, c.M * I))
        return
    r0 = 0
    for wt in op.weights:            # each weight into its column range of the output
        c.P.add(_gemv(c, c.w[wt.name], X, Y[:, r0:], K, ldx, ldy, op.epilogue))
        r0 += wt.shape[0]


def _gdn_op(c: _Ctx, op, src: str):
    cfg, st, w = c.cfg, c.st, c.w
    sh = _gdn.GDNShape.of(cfg)
    _gdn.check_cuda_shape(sh)
    g = op.state[1]
    C, K, nvdv, nv = sh.C, sh.K, sh.nv * sh.dv, sh.nv
    gin, width = c.bufs[src], c.ld(src)
    xc = c.P.buf("gdn.conv_out", c.M, C)
    conv_w, A_log, dt_bias, norm_w = (w[wt.name] for wt in op.weights)
    cw = conv_w.reshape(C, K)
    c.P.keep.append(cw)
    ck = c.gdn_mode
    hist_seg = S_seg = None
    if c.batch is not None:       # one launch over every sequence: each its own ring, ctrl, rows and mode
        hist_seg, S_seg = c.table(st.hist[0, g]), c.table(st.S[0, g])
        fold = src.startswith("gdn_in.")          # the fold program: every sequence's cached rows
        if fold or "cache" in c.batch.modes:      # into the pass (a fold), or a cached verify's into its cache
            move = c.table(st.gdn_in[g], rows="all" if fold else "cache")
            c.P.add(_gdn.gdn_move_inputs_launch(gin, width, int(st.gdn_in.shape[2]), width, move, c.batch.rows,
                                                to_cache=not fold))
    c.P.add(_gdn.gdn_conv_launch(gin, width, cw, xc, C, st.hist[0, g], st.hist[0].size, st.nslots, ck, c.P.ctrl,
                                 c.M, C, K, seg=hist_seg))
    c.P.add(_gdn.gdn_recur_launch(xc, C, gin[:, C:], width, gin[:, C + nvdv:], width, gin[:, C + nvdv + nv:], width,
                                  A_log, dt_bias, norm_w, c.bufs[op.dst], c.ld(op.dst), st.S[0, g], st.S[0].size,
                                  st.nslots, ck, c.P.ctrl, c.M, sh,
                                  _gdn.gdn_recur_variant(sh.dk, sh.dv, c.be.kernels.gdn_recur), seg=S_seg))


def _attention_op(c: _Ctx, op):
    cfg, w = c.cfg, c.w
    nh, nkv, hd, rh, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rot_dim // 2, cfg.rms_norm_eps
    qd, kd = nh * 2 * hd, nkv * hd
    ain, width = c.bufs[op.src], c.ld(op.src)
    kc, vc = c.st.kv(op.state)
    cos, sin = c.be.rope_device(cfg, max(c.st.max_seq, 1))
    q_norm, k_norm = (w[wt.name] for wt in op.weights)
    rows, seg = c.M, None
    if c.batch is not None:       # one launch over every sequence: each its own caches, ctrl and rows
        seg = c.table(kc, vc)
        rows = c.batch.rows
    c.P.add(_attn.kv_append_launch(ain[:, qd:], width, ain[:, qd + kd:], width, k_norm, cos, sin, 0, kc, vc, c.P.ctrl,
                                   rows, nkv, hd, rh, eps, seg=seg))
    c.P.add(_attn.attn_decode_launch(ain, width, q_norm, cos, sin, 0, kc, vc, c.bufs[op.dst], c.ld(op.dst), c.P.ctrl,
                                     rows, nh, nkv, hd, rh, eps, hd ** -0.5, c.st.max_seq, seg=seg))


def _where(st, view) -> tuple:
    """(name of the DeviceState buffer holding `view`, its byte offset in it)."""
    p = int(view.data.ptr)
    for name, a in st.buffers().items():
        if a is not None and a.data.ptr <= p < a.data.ptr + a.nbytes:
            return name, p - int(a.data.ptr)
    raise ValueError("a segment table's state pointer is not in the DeviceState")


class BatchShape:
    """What a batched plan is made for (kestrel/cuda/segments.py): one DeviceState layout, the
    GDN modes its sequences may take, and its bounds: nseg segments, `rows` rows a segment,
    `total` rows a pass."""

    def __init__(self, st, modes, nseg: int, rows: int, total: int):
        self.st, self.modes, self.nseg, self.rows, self.total = st, frozenset(modes), nseg, rows, total

    @staticmethod
    def layout(st) -> tuple:
        return (st.max_seq, st.nslots, tuple(st.S.shape), tuple(st.hist.shape), tuple(st.gdn_in.shape),
                st.mtp_kc is not None)


def lower_batch(be, model, prog, shape: BatchShape) -> Plan:
    """The plan of `prog` over several sequences' rows in one pass, for the bounds of `shape`.
    The row-wise ops (embedding, norms, projections) launch once over all `total` rows; each op
    with state launches once with a segment table whose entries give every sequence its own
    rows, state, mode and ctrl block. The plan's ctrl block holds the tokens of every row (the
    embedding reads them) and then one CTRL_TOK-word block a segment (position, live slot). The
    host writes the ctrl block and every table before each run (CUDABackend._run_batch), so the
    plan serves any sequences of the layout with any rows within its bounds; the launches'
    strides are the layout's (shape.st, any one of its states)."""
    st0, total = shape.st, shape.total
    c = _Ctx(be, model, prog, st0, total, "in_place", batch=shape)
    for name, width in prog.buffers:      # the fold's inputs: gathered into the pass (_gdn_op)
        if name.startswith("gdn_in."):
            c.bufs[name] = c.P.buf(name, total, width)
    c.P.ctrl = cp.zeros(L.CTRL_TOK + total + L.CTRL_TOK * shape.nseg, np.int32)
    n_tables = sum(3 if op.kind == "gdn" else 1 for op in prog.ops if op.kind in ("gdn", "attention"))
    c.P.seg_dev = cp.zeros((max(n_tables, 1), shape.nseg, L.SEG_WORDS), np.int64)
    c.P.seg_specs, c.P.seg_last = [], None
    for op in prog.ops:
        if op.kind == "linear":
            _linear_op(c, op, op.dst)
        elif op.kind == "gdn":
            _gdn_op(c, op, op.src)
        else:
            {"embed": _embed, "rmsnorm": _rmsnorm, "attention": _attention_op}[op.kind](c, op)
    c.P.hidden, c.P.logits = c.bufs.get(prog.hidden), c.bufs.get(prog.logits)
    c.P.bounds = (shape.nseg, shape.rows, shape.total)   # not the state: a plan outlives its engine
    return c.P


def lower(be, model, prog, st, M: int, gdn_mode: str) -> Plan:
    """The plan of `prog` over M rows on DeviceState `st` (gdn_mode: kestrel/program.py)."""
    c = _Ctx(be, model, prog, st, M, gdn_mode)
    for i, op in enumerate(prog.ops):
        if op.kind == "linear":
            _linear_op(c, op, c.redirect.get(i, op.dst))
        elif op.kind == "gdn":
            _gdn_op(c, op, c.redirect.get(i, op.src))
        else:
            {"embed": _embed, "rmsnorm": _rmsnorm, "attention": _attention_op}[op.kind](c, op)
    c.P.hidden, c.P.logits = c.bufs.get(prog.hidden), c.bufs.get(prog.logits)
    return c.P
