"""CUDABackend: weights and buffers on the GPU, clocks (device events), and `run`, which
lowers a model program into a plan (kestrel/cuda/lower.py) once per (program, M, GDN mode,
DeviceState) and replays it as a CUDA graph.

Weights: 2-D projection matrices in bf16 when asked (raw uint16 bits on the device), everything
else fp32; the stacked projections (kestrel/program.py) are concatenated once and each weight
becomes a row view of its stack. `weight_f32(w)` widens a stored weight for inspection.

Both ways of running (stacked projections + graphs + programmatic dependent launch, or one
launch per weight, eagerly) give bit-identical results: the same kernels, the same per-row
reduction orders (tests/test_cuda.py checks it).
"""
from __future__ import annotations

import weakref

import cupy as cp
import numpy as np

from ..config import Config
from ..draft import DraftFeed
from ..ops import head as _head
from ..ops import linear as _linear
from ..ops import rope as _rope
from ..program import expected_shapes, param_count, stacks
from ..weights import f32_to_bf16, random_scale, random_tensor, random_weights
from .. import nvrtc as L
from . import segments
from .lower import BatchShape, lower, lower_batch
from .cache import BATCH_PLAN_CACHE, GRAPH_MAX_ROWS, PlanCache
from .options import KernelOptions
from .plan import Staging
from .tiled import drop_original

GPU_DRAW_MIN_PARAMS = 50_000_000              # random_model draws on the GPU from this size up

_STREAM = None


def _stream():
    """The one stream every CUDABackend launches on (graphs cannot be captured on the legacy
    default stream). It is made the current CuPy stream, so the engine's own CuPy work (resets,
    mark/rollback copies) is ordered with the kernels; it is a blocking stream, so work that
    other code puts on the legacy default stream is ordered with it too."""
    global _STREAM
    if _STREAM is None:
        _STREAM = cp.cuda.Stream(non_blocking=False)
    _STREAM.use()
    return _STREAM


class CUDABackend:
    name = "cuda"
    xp = cp

    def __init__(self, use_graphs: bool = True, stack_projections: bool = True, kernels=None):
        """kernels: KernelOptions (or a dict of its fields): which kernels this backend runs."""
        kernels = KernelOptions.of(kernels)
        self.stream = _stream()
        props = L.device_props()
        name = props["name"]
        self.device_name = f"{name} (CUDA, CuPy {cp.__version__})"
        self.device_props = {"name": name, "sm_count": int(props["multiProcessorCount"]),
                             "memory_bytes": int(props["totalGlobalMem"]), "cc": f"{props['major']}.{props['minor']}"}
        self.use_graphs = use_graphs
        self.stack_projections = stack_projections
        self.kernels = kernels.resolved(pdl_supported=int(props["major"]) >= 9)   # PDL: Hopper and newer
        self.pdl = self.kernels.pdl
        self._staging = Staging(self.stream)
        self._rope = {}
        self._plans = weakref.WeakKeyDictionary()     # model -> PlanCache (cache.py)
        self._batch_plans = weakref.WeakKeyDictionary()   # model -> PlanCache of batched passes
        self._stacks = weakref.WeakKeyDictionary()    # model -> {stack name: matrix}
        self._tiled = weakref.WeakKeyDictionary()     # model -> {matrix key: (matrix, tiled copy)}
        # plans_lowered counts the cached plans (M <= GRAPH_MAX_ROWS); wider ones (a prompt) are lowered per call
        self.stats = {"plans_lowered": 0, "graphs_captured": 0, "pdl_graphs": 0, "graph_replays": 0, "eager_runs": 0, "graph_errors": []}

    # ---- memory -------------------------------------------------------------------------
    def empty(self, shape, dtype=np.float32):
        """An uninitialised device buffer (NaN-filled while tests poison)."""
        a = cp.empty(shape, dtype)
        if L.POISON and a.dtype.kind == "f":
            a.fill(np.nan)
        return a

    def put_weight(self, name: str, a, dtype: str = "fp32"):
        """2-D matrices as bf16 bits (uint16) when dtype='bf16', everything else fp32."""
        if isinstance(a, cp.ndarray):
            if a.dtype == np.uint16:
                return a
            a = cp.ascontiguousarray(a, dtype=np.float32)
            if dtype == "bf16" and a.ndim == 2:
                out = cp.empty(a.shape, np.uint16)
                self.to_bf16(a, 1.0, out)
                return out
            return a
        a = np.ascontiguousarray(a, dtype=np.float32)
        if dtype == "bf16" and a.ndim == 2:
            return cp.asarray(f32_to_bf16(a))
        return cp.asarray(a)

    def weight_f32(self, w):
        """A stored weight as float32 (bf16 bits widened exactly)."""
        if w.dtype == np.uint16:
            return (w.astype(np.uint32) << 16).view(np.float32)
        return w

    def asarray(self, a, dtype=np.float32):
        if isinstance(a, cp.ndarray):
            return cp.ascontiguousarray(a, dtype=dtype)
        return cp.asarray(np.ascontiguousarray(a, dtype=dtype))

    def zeros(self, shape, dtype=np.float32):
        return cp.zeros(shape, dtype)

    def to_numpy(self, a) -> np.ndarray:
        if isinstance(a, cp.ndarray):
            return a.get()
        return np.asarray(a)

    def sync(self):
        self.stream.synchronize()

    def now(self):
        """A CUDA event recorded on the backend's stream; elapsed_ms(a, b) reads two of them."""
        ev = cp.cuda.Event()
        ev.record(self.stream)
        return ev

    def elapsed_ms(self, a, b) -> float:
        b.synchronize()
        return float(cp.cuda.get_elapsed_time(a, b))

    def to_bf16(self, src, scale, out):
        L.go(_head.to_bf16_launch(src, scale, out, src.size), self.stream)

    def argmax(self, logits):
        x = cp.ascontiguousarray(logits, dtype=np.float32)
        one = x.ndim == 1
        x2 = x.reshape(-1, x.shape[-1])
        out = cp.empty(x2.shape[0], np.int64)
        L.go(_head.argmax_launch(x2, x2.shape[1], x2.shape[0], x2.shape[1], out), self.stream)
        return out[0] if one else out.reshape(x.shape[:-1])

    # ---- the program, lowered ------------------------------------------------------------------
    def stacked(self, model) -> dict:
        """The stacked projection matrices of `model`; its w entries become row views of them."""
        f = self._stacks.get(model)
        if f is not None:
            return f
        f = getattr(model, "_drawn_stacks", None) or {}
        with self.stream:
            for key, names in stacks(model.cfg):
                if key in f:
                    continue
                parts = [model.w[n] for n in names]
                if len({p.dtype for p in parts}) != 1:
                    raise ValueError(f"{key}: mixed weight dtypes {[p.dtype for p in parts]}")
                buf = cp.concatenate(parts, axis=0)
                r0 = 0
                for n, p in zip(names, parts):
                    model.w[n] = buf[r0:r0 + p.shape[0]]
                    r0 += p.shape[0]
                f[key] = buf
        model.head = model.w["embed_tokens.weight" if model.cfg.tie_word_embeddings else "lm_head.weight"]
        self._stacks[model] = f
        return f

    def tiled(self, model, W, epilogue: str = "store", half: int = 0):
        """The tiled copy (linear.tmb_tiled, which gemv_tmb and gemv_tmr read) of one of `model`'s
        bf16 matrices, made once and kept with the model. The entry holds the matrix too, so its
        address cannot be reused while the copy is looked up by it. Under the kernel option
        tiled_only the original is dropped instead (tiled.drop_original), unless the embedding reads it."""
        d = self._tiled.setdefault(model, {})
        key = (W.data.ptr, W.shape, W.strides, half if epilogue == "swiglu" else -1)
        e = d.get(key)
        if e is None:
            with self.stream:
                e = d[key] = (W, _linear.tmb_tiled(W, W.shape[1], epilogue, half))
            if self.kernels.tiled_only and drop_original(model, self._stacks.get(model) or {}, W, e[1]):
                del d[key]          # nothing holds W now, so its address may be reused
        return e[1]

    def rope_device(self, cfg: Config, n: int):
        key = (cfg.rot_dim, cfg.rope_theta, n)
        t = self._rope.get(key)
        if t is None:
            cos, sin = _rope.rope_tables(cfg.rot_dim, cfg.rope_theta, n)
            t = self._rope[key] = (cp.asarray(cos), cp.asarray(sin))
        return t

    def plans(self, model) -> PlanCache:
        """The model's cached plans (benchmarks read their graphs)."""
        return self._plans.setdefault(model, PlanCache())

    def _plan(self, model, prog, st, M: int, gdn_mode: str):
        """The cached plan of (prog, M, gdn_mode, the state's buffers), lowered on first use."""
        if M > GRAPH_MAX_ROWS:
            return lower(self, model, prog, st, M, gdn_mode)
        key = (prog.name, M, gdn_mode, self.stack_projections, self.kernels,
               st.max_seq, st.nslots, *(a.data.ptr for a in st.buffers().values()))   # kernels chosen
        plans = self.plans(model)
        plan, made = plans.get_or_make(key, lambda: lower(self, model, prog, st, M, gdn_mode))
        self.stats["plans_lowered"] += made
        return plan

    def fold(self, model, prog, st, n: int):
        """The fold program over the first n cached GDN input rows, in place (one graph per n)."""
        with self.stream:
            plan = self._plan(model, prog, st, n, "in_place")
            self._staging.put(plan.ctrl, [0, st.slot, 0, 0])
            plan.run()

    def _put_tokens(self, plan, pos: int, slot: int, tokens):
        """The plan's ctrl block: position, live slot, the M tokens. A DraftFeed's drafted tokens
        go device to device (one small copy), so the host need not have read them."""
        if isinstance(tokens, DraftFeed) and tokens.draft.device_tokens is not None:
            h = len(tokens.head)
            self._staging.put(plan.ctrl, [pos, slot, 0, 0, *tokens.head])
            if tokens.n:
                plan.ctrl[L.CTRL_TOK + h:L.CTRL_TOK + h + tokens.n] = tokens.draft.device_tokens[:tokens.n]
            return
        if isinstance(tokens, DraftFeed):
            tokens = tokens.host()
        self._staging.put(plan.ctrl, [pos, slot, 0, 0, *[int(t) for t in tokens]])

    def run(self, model, prog, st, tokens, pos: int, hid=None, gdn_mode: str = "in_place"):
        """Run `prog` over M rows at positions pos.. on DeviceState `st`: (hidden [M,D], logits [M,V]),
        None for a program that has none (mtp_fill). tokens: ints, or a DraftFeed."""
        M = len(tokens)
        cache = M <= GRAPH_MAX_ROWS
        with self.stream:
            plan = self._plan(model, prog, st, M, gdn_mode)
            if hid is not None:
                plan.bufs["hid"][...] = hid
            self._put_tokens(plan, pos, st.slot, tokens)
            plan.run()
            out = plan.hidden, plan.logits
            if cache:      # the plan's buffers are reused by its next run
                return tuple(None if a is None else a.copy() for a in out)
            return out

    # ---- several sequences in one pass (the batched engine, kestrel/batch.py) -------------------
    def _batch_plan(self, model, prog, shape: list, room: tuple):
        """The cached plan for a batched pass over shape = [(DeviceState, rows, gdn_mode)]: made
        for the bounds of those rows and the caller's room (segments.bounds), so that a later
        pass of another mix of rows within them, or of other states of the same layout, reuses it."""
        st0 = shape[0][0]
        lay = BatchShape.layout(st0)
        for st, _, _ in shape:
            if BatchShape.layout(st) != lay:
                raise ValueError("a batched pass: every sequence's DeviceState needs one layout (max_seq, ring slots)")
        ms = [m for _, m, _ in shape]
        nseg, rows, total = segments.bounds(ms, any(op.kind == "linear" for op in prog.ops), int(st0.gdn_in.shape[1]),
                                           room)
        return self._batch_plan_at(model, prog, st0, frozenset(mode for _, _, mode in shape), nseg, rows, total)[0]

    def _batch_plan_at(self, model, prog, st0, modes: frozenset, nseg: int, rows: int, total: int) -> tuple:
        """(the cached plan of prog for st0's layout, these modes and bounds, whether made now)."""
        key = (prog.name, self.stack_projections, self.kernels, BatchShape.layout(st0), modes, nseg, rows, total)
        plans = self._batch_plans.setdefault(model, PlanCache(BATCH_PLAN_CACHE))
        plan, made = plans.get_or_make(key, lambda: lower_batch(self, model, prog,
                                                                BatchShape(st0, modes, nseg, rows, total)))
        self.stats["plans_lowered"] += made
        return plan, made

    def prepare_batch(self, model, st0, room: tuple, mode_sets: list, drafts: bool, folds: bool) -> int:
        """Make, before they are needed, every batched plan a batch of DeviceStates laid out as
        st0 can run within room = (sequences, rows a sequence): the main program for each GDN
        mode set at every total (segments.totals), the MTP head's (drafts) and the fold (folds).
        Each new plan runs twice with every segment empty (M = 0: the stateful kernels return at
        once and no state is read or written; the row-wise ops compute on the plan's own
        buffers), so it is lowered and its graph captured now. -> the plans made."""
        made = 0
        n = int(room[0]) * int(room[1])
        jobs = [(model.main_prog, frozenset(ms), t) for ms in mode_sets for t in segments.totals(n)]
        if drafts and model.mtp_prog is not None:
            jobs += [(model.mtp_prog, frozenset({"in_place"}), t) for t in segments.totals(n)]
        nseg, rows, _ = segments.bounds([1], True, None, room)
        with self.stream:
            for prog, modes, total in jobs:
                plan, new = self._batch_plan_at(model, prog, st0, modes, nseg, rows, total)
                made += self._warm(plan, new)
            if folds:
                fseg, frows, ftotal = segments.bounds([1], False, int(st0.gdn_in.shape[1]), room)
                plan, new = self._batch_plan_at(model, model.fold_prog, st0, frozenset({"in_place"}), fseg, frows, ftotal)
                made += self._warm(plan, new)
        return made

    def _warm(self, plan, new: bool) -> int:
        """Run a batched plan with empty segments until its graph is captured (prepare_batch)."""
        if not new and (plan.graph is not None or not plan.graphable):
            return 0
        if plan.seg_last is not None:            # a used plan: empty its tables first
            plan.seg_dev[...] = 0
            plan.seg_last = None
        plan.ctrl[...] = 0
        while plan.graph is None and plan.graphable and self.use_graphs and plan.calls < 2:
            plan.run()
        if plan.calls == 0:
            plan.run()
        return int(new)

    def _put_batch(self, plan, shape: list, tokens: list, pos: list):
        """Before a batched plan runs: its ctrl block (every row's token, each segment's position
        and live slot) and every segment table (segments.words), rewritten only when they change."""
        nseg, _, total = plan.bounds
        words = [0] * L.CTRL_TOK + list(tokens) + [0] * (total - len(tokens))
        for (st, _, _), p in zip(shape, pos):
            blk = [0] * L.CTRL_TOK
            blk[L.CTRL_POS], blk[L.CTRL_SLOT] = int(p), int(st.slot)
            words += blk
        self._staging.put(plan.ctrl, words)
        ctrl0 = int(plan.ctrl.data.ptr) + 4 * (L.CTRL_TOK + total)
        tab = segments.words(plan.seg_specs, [m for _, m, _ in shape], [mode for _, _, mode in shape],
                             [{n: int(a.data.ptr) for n, a in st.buffers().items() if a is not None} for st, _, _ in shape],
                             [ctrl0 + 4 * L.CTRL_TOK * i for i in range(len(shape))], shape[0][0].nslots, nseg)
        if plan.seg_specs and (plan.seg_last is None or not np.array_equal(tab, plan.seg_last)):
            self._staging.put_array(plan.seg_dev[:len(plan.seg_specs)], tab)
            plan.seg_last = tab

    def _run_batch(self, model, prog, calls: list, hids, room: tuple) -> tuple:
        """Run one batched pass -> (the plan, each call's row count). The plan's output buffers
        hold the pass's rows (first rows first; any past them are padding) until its next run."""
        toks = [[int(t) for t in (x.host() if isinstance(x, DraftFeed) else x)] for _, x, _, _ in calls]
        shape = [(st, len(t), mode) for (st, _, _, mode), t in zip(calls, toks)]
        with self.stream:
            plan = self._batch_plan(model, prog, shape, room)
            if hids is not None:
                n = sum(len(t) for t in toks)
                plan.bufs["hid"][:n] = cp.concatenate([cp.asarray(h, dtype=np.float32).reshape(len(t), -1)
                                                       for h, t in zip(hids, toks)])
            self._put_batch(plan, shape, [t for ts in toks for t in ts], [pos for _, _, pos, _ in calls])
            plan.run()
        return plan, [len(t) for t in toks]

    def fold_batch(self, model, prog, folds: list, room: tuple = (1, 1)):
        """Several sequences' folds in one pass: folds = [(n, DeviceState)]. Each GDN layer
        gathers every sequence's first n cached input rows into the pass and runs them in place
        on that sequence's live state (a segment table): each state as its fold alone leaves it."""
        if not folds:
            return
        shape = [(st, n, "in_place") for n, st in folds]
        with self.stream:
            plan = self._batch_plan(model, prog, shape, room)
            self._put_batch(plan, shape, [0] * sum(n for n, _ in folds), [0] * len(folds))
            plan.run()

    def run_batch(self, model, prog, calls: list, hids: list | None = None, room: tuple = (1, 1)) -> list:
        """Several sequences' rows in one pass of `prog` (the batched engine, kestrel/batch.py):
        calls = [(DeviceState, tokens [m_i], pos_i, gdn_mode_i)] -> [(hidden [m_i, D], logits
        [m_i, V])]. One launch of each op for all the rows (lower_batch): the projections read
        each weight once, the ops with state run each sequence on its own state through a
        segment table, and every row holds the bits of the same call made alone. room: the
        (sequences, rows a sequence) the caller's passes can have, which the plan is made for."""
        plan, ms = self._run_batch(model, prog, calls, hids, room)
        n = sum(ms)                    # the pass's rows: the plan's padding rows are not copied
        with self.stream:
            h = None if plan.hidden is None else plan.hidden[:n].copy()
            lg = None if plan.logits is None else plan.logits[:n].copy()
        out, lo = [], 0
        for m in ms:
            out.append((None if h is None else h[lo:lo + m], None if lg is None else lg[lo:lo + m]))
            lo += m
        return out

    def mtp_chain_batch(self, model, prog, chains: list, room: tuple = (1, 1)) -> list:
        """Several sequences' draft chains in lockstep, row j of every chain in one batched pass:
        chains = [(DeviceState, token, hid [1, D], pos, k, forced, fill)] as mtp_chain takes them
        -> [(tokens [k] as host ints, hiddens [k, D] on the device)], each bit-identical to its
        mtp_chain alone. The host reads each row's tokens (one copy a row for the whole batch) to
        feed the next, so it returns them as read: a round's drafts cost no further read."""
        D = model.cfg.hidden_size
        rows_tok, rows_h, cur = [[] for _ in chains], [[] for _ in chains], []
        for st, token, hid, pos, k, forced, fill in chains:
            x, h = [int(token)], cp.asarray(hid, dtype=np.float32).reshape(1, D)
            if fill is not None:
                x = [int(t) for t in fill[0]] + x
                h = cp.concatenate([cp.asarray(fill[1], dtype=np.float32).reshape(len(fill[0]), D), h])
            cur.append([x, h, int(pos)])
        for j in range(max(c[4] for c in chains)):
            live = [i for i, c in enumerate(chains) if j < c[4]]
            plan, ms = self._run_batch(model, prog, [(chains[i][0], cur[i][0], cur[i][2], "in_place") for i in live],
                                       [cur[i][1] for i in live], room)
            with self.stream:
                last = cp.asarray(np.cumsum(ms) - 1)             # each chain's row j: its last row of the pass
                hl = plan.hidden[last]
                toks = self.argmax(plan.logits[last])
            got = toks.get()
            for n, i in enumerate(live):
                forced = chains[i][5]
                cur[i][2] += len(cur[i][0])
                rows_tok[i].append(int(got[n]))
                rows_h[i].append(hl[n:n + 1])
                cur[i][0], cur[i][1] = [int(got[n]) if forced is None else int(forced[j])], hl[n:n + 1]
        with self.stream:
            return [(t, cp.concatenate(h)) for t, h in zip(rows_tok, rows_h)]

    def mtp_chain(self, model, prog, st, token: int, hid, pos: int, k: int, forced=None, fill=None):
        """The draft chain on the device (the CPU backend's mtp_chain, without the host in the
        loop): the M = 1 plan of the MTP program replays k times, and between replays the argmax
        kernel writes row j's token and small copies move it (or forced[j]) into the plan's ctrl
        block, row j's h' into its hid buffer and the position on by one. The host only enqueues;
        nothing waits for a token until the caller reads them. Each replay is the very graph
        mtp_step replays, so every row holds the bits of k separate mtp_step calls.
        fill = (tokens [m], hidden [m, D]): the first pass is the M = m+1 plan over the fill rows
        and row 0 (the rows are batch-invariant: each holds the bits of its own M = 1 pass, and
        the fill rows' K/V are the ones mtp_fill writes); the chain goes on at pos + m + 1.
        -> (argmax tokens [k] int64, hiddens [k, D]) on the device."""
        m = 0 if fill is None else len(fill[0])
        V = model.cfg.vocab_size
        with self.stream:
            plan = self._plan(model, prog, st, 1, "in_place")
            first = plan if m == 0 else self._plan(model, prog, st, m + 1, "in_place")
            toks = cp.empty(k, np.int64)
            hs = cp.empty((k, model.cfg.hidden_size), np.float32)
            feed = toks
            if forced is not None:
                feed = cp.empty(k, np.int32)
                self._staging.put(feed, [int(t) for t in forced])
            if m:
                first.bufs["hid"][:m] = fill[1]
            first.bufs["hid"][m:] = hid.reshape(1, -1)
            self._put_tokens(first, pos, st.slot, [*(fill[0] if m else ()), token])
            first.run()
            hs[0] = first.hidden[m]
            L.go(_head.argmax_launch(first.logits[m:], V, 1, V, toks[0:1]), self.stream)
            tok, at = plan.ctrl[L.CTRL_TOK:L.CTRL_TOK + 1], plan.ctrl[L.CTRL_POS:L.CTRL_POS + 1]
            if k > 1:
                if m:
                    self._staging.put(plan.ctrl, [pos + m + 1, st.slot, 0, 0, 0])
                    plan.bufs["hid"][...] = first.hidden[m:]
                else:
                    plan.bufs["hid"][...] = plan.hidden
                    at += 1
            for j in range(1, k):
                tok[...] = feed[j - 1:j]
                plan.run()
                hs[j] = plan.hidden[0]
                L.go(_head.argmax_launch(plan.logits, V, 1, V, toks[j:j + 1]), self.stream)
                if j + 1 < k:
                    plan.bufs["hid"][...] = plan.hidden
                    at += 1
        return toks, hs

    # ---- random weights drawn on the device ------------------------------------------------
    def random_weights(self, cfg: Config, seed: int = 0, dtype: str = "fp32", gpu_draw: bool | None = None):
        """(tensors, stacks, source): random weights of kestrel.weights.random_weights' families,
        for kestrel.load to build the Model from (Model(..., stacks=stacks)).

        Small configs (below GPU_DRAW_MIN_PARAMS, unless gpu_draw=True) draw on the host with
        random_weights itself, so the weights equal the CPU backend's bit for bit. Large ones
        draw the projection matrices on the GPU (cuRAND normal, scaled, rounded to bf16 in
        place), straight into their stacks (the tensors are row views of them): the same
        distributions, not the same numbers."""
        if gpu_draw is None:
            gpu_draw = param_count(cfg) >= GPU_DRAW_MIN_PARAMS
        if not gpu_draw:
            return random_weights(cfg, seed), {}, f"random(seed={seed})"
        rs = cp.random.RandomState(seed)
        rng = np.random.default_rng(seed)
        shapes = expected_shapes(cfg)
        wdt = np.uint16 if dtype == "bf16" else np.float32
        tensors, drawn = {}, {}
        with self.stream:
            for key, names in stacks(cfg):
                rows, K = sum(shapes[n][0] for n in names), shapes[names[0]][1]
                buf = cp.empty((rows, K), wdt)
                r0 = 0
                for n in names:
                    r = shapes[n][0]
                    tensors[n] = buf[r0:r0 + r]
                    self._fill_normal(rs, tensors[n], random_scale(n, shapes[n]))
                    r0 += r
                drawn[key] = buf
            for n, shape in shapes.items():
                if n in tensors:
                    continue
                if len(shape) == 2:
                    buf = cp.empty(shape, wdt)
                    self._fill_normal(rs, buf, random_scale(n, shape))
                    tensors[n] = buf
                else:
                    tensors[n] = cp.asarray(random_tensor(n, shape, rng))
        return tensors, drawn, f"random-gpu(seed={seed})"

    def _fill_normal(self, rs, out, scale: float, chunk: int = 1 << 26):
        flat = out.reshape(-1)
        n = flat.size
        for s in range(0, n, chunk):
            e = min(n, s + chunk)
            t = rs.standard_normal(e - s, dtype=np.float32)
            if out.dtype == np.uint16:
                self.to_bf16(t, scale, flat[s:e])
            else:
                cp.multiply(t, np.float32(scale), out=flat[s:e])
