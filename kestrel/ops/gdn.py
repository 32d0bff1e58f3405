"""Gated DeltaNet token step (NumPy twin and launchers of kernels/gdn.cu).

Per row t (one token), with C = 2*nk*dk + nv*dv conv channels laid out [q | k | v]:
  1. window = [hist | qkv_t]  ([C, K]);  x = silu(sum_i window[:, i] * w[:, i]);  hist' = window[:, 1:]
  2. q, k = l2norm(x_q), l2norm(x_k) per key head (q also * dk^-0.5); v = x_v
     beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
  3. per value head h (key head h // (nv/nk)), state S_h [dk, dv] fp32:
        S_h *= exp(g_h);  delta = beta_h * (v_h - S_h^T k);  S_h += k (x) delta;  o_h = S_h^T q
  4. y = norm_w * rmsnorm(o_h) * silu(z_h)   (plain-w gated norm over dv)
Rows run one after another (the recurrence is sequential). The state after each row goes
either back in place, or - for per-row checkpoints - into its own slot (the row reads the
previous row's slot), leaving the starting state untouched.
"""
from dataclasses import dataclass

import numpy as np

from .. import nvrtc as L
from ..program import GDN_MODES
from .norm import gated_rmsnorm, sigmoid, silu

L2_EPS = np.float32(1e-6)       # inside l2norm's square root (q and k)
GDN_CONV_THREADS = 128
GDN_CONV_KMAX = 8               # the conv window a thread keeps in registers
GDN_RECUR_THREADS = 512
GDN_RECUR_REGS_DK = GDN_RECUR_REGS_DV = 128   # the head dims gdn_recur_regs and _cluster are compiled for
GDN_CLUSTER = 4                 # gdn_recur_cluster: blocks per value head (a thread-block cluster)
GDN_CLUSTER_THREADS = 32 * (GDN_RECUR_THREADS // GDN_RECUR_REGS_DV)   # one warp per k-slice of gdn_recur_regs
GDN_RECUR_ROWS = 8              # gdn_recur_cluster: rows whose inputs are loaded at once
# The recurrence kernels (all three agree bit for bit, so the choice is speed alone): "cluster" and
# "regs" only for their compiled head dims ("cluster" also only on sm_90 and later), "smem"
# (gdn_recur) for any. A backend names the one it prefers (KernelOptions.gdn_recur);
# gdn_recur_variant takes it, or the next in this order that can run.
GDN_RECUR_VARIANTS = ("cluster", "regs", "smem")
GDN_RECUR_DEFAULT = "cluster"
CUDA_DEFINES = {"GDN_L2_EPS": float(L2_EPS), "GDN_CONV_THREADS": GDN_CONV_THREADS, "GDN_CONV_KMAX": GDN_CONV_KMAX,
                "GDN_RECUR_THREADS": GDN_RECUR_THREADS, "GDN_RECUR_REGS_DK": GDN_RECUR_REGS_DK,
                "GDN_RECUR_REGS_DV": GDN_RECUR_REGS_DV, "GDN_CLUSTER": GDN_CLUSTER,
                "GDN_CLUSTER_THREADS": GDN_CLUSTER_THREADS, "GDN_RECUR_ROWS": GDN_RECUR_ROWS, "GDN_IN_PLACE": GDN_MODES["in_place"],
                "GDN_CHECKPOINT": GDN_MODES["checkpoint"], "GDN_CACHE": GDN_MODES["cache"]}
L.register("gdn", CUDA_DEFINES)


@dataclass
class GDNShape:
    nk: int
    nv: int
    dk: int
    dv: int
    K: int
    eps: float

    @property
    def C(self):
        return 2 * self.nk * self.dk + self.nv * self.dv

    @classmethod
    def of(cls, cfg) -> "GDNShape":
        return cls(cfg.lin_num_key_heads, cfg.lin_num_value_heads, cfg.lin_key_head_dim, cfg.lin_value_head_dim,
                   cfg.conv_kernel, cfg.rms_norm_eps)


def split_in_proj(cfg, gin: np.ndarray):
    """The stacked in-projection's output [M, C + nv*dv + 2nv] -> qkv [M, C], z, b, a."""
    C, nvdv, nv = cfg.conv_dim, cfg.lin_num_value_heads * cfg.lin_value_head_dim, cfg.lin_num_value_heads
    return gin[:, :C], gin[:, C:C + nvdv], gin[:, C + nvdv:C + nvdv + nv], gin[:, C + nvdv + nv:]


def softplus(x):
    # torch.nn.functional.softplus with threshold 20
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def l2norm(x):
    return x * (np.float32(1.0) / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPS))


def conv_step(window: np.ndarray, w: np.ndarray) -> np.ndarray:
    """window [C, K] (oldest first), w [C, K] -> silu(sum over K), summed in a fixed order."""
    acc = window[:, 0] * w[:, 0]
    for i in range(1, w.shape[1]):
        acc = acc + window[:, i] * w[:, i]
    return silu(acc)


def gdn_rows(sh: GDNShape, qkv, z, b, a, conv_w, A_log, dt_bias, norm_w, S, hist,
             S_slots=None, hist_slots=None) -> np.ndarray:
    """qkv [M, C], z [M, nv*dv], b/a [M, nv]; conv_w [C, K];
    S [nv, dk, dv]; hist [C, K-1].

    S_slots/hist_slots None: update S/hist in place. Otherwise sequences
    of M arrays: row j's state is written to slot j (row j+1 starts from
    it); S/hist are only read.
    Returns y [M, nv*dv] (gated-normed, before out_proj).
    """
    M = qkv.shape[0]
    nk, nv, dk, dv = sh.nk, sh.nv, sh.dk, sh.dv
    head_map = np.arange(nv) // (nv // nk)
    scale = np.float32(dk ** -0.5)
    decay_rate = -np.exp(A_log.astype(np.float32))
    y = np.empty((M, nv * dv), np.float32)
    cur_S, cur_h = S, hist
    for j in range(M):
        window = np.concatenate([cur_h, qkv[j][:, None]], axis=1)
        x = conv_step(window, conv_w)
        q = l2norm(x[:nk * dk].reshape(nk, dk)) * scale
        k = l2norm(x[nk * dk:2 * nk * dk].reshape(nk, dk))
        v = x[2 * nk * dk:].reshape(nv, dv)
        beta = sigmoid(b[j])
        g = decay_rate * softplus(a[j] + dt_bias)
        qq, kk = q[head_map], k[head_map]                       # [nv, dk]
        S_new = cur_S * np.exp(g)[:, None, None]
        kv_mem = (kk[:, None, :] @ S_new)[:, 0, :]              # S^T k  [nv, dv]
        delta = beta[:, None] * (v - kv_mem)
        S_new = S_new + kk[:, :, None] * delta[:, None, :]
        o = (qq[:, None, :] @ S_new)[:, 0, :]                   # S^T q  [nv, dv]
        y[j] = gated_rmsnorm(o, z[j].reshape(nv, dv), norm_w, sh.eps).reshape(-1)
        if S_slots is None:
            cur_S[...] = S_new
            cur_h[...] = window[:, 1:]
        else:
            S_slots[j][...] = S_new
            hist_slots[j][...] = window[:, 1:]
            cur_S, cur_h = S_slots[j], hist_slots[j]
    return y


# ---- CUDA launchers ------------------------------------------------------------------------
def gdn_recur_in_registers(dk: int, dv: int) -> bool:
    """Whether the head dims are the ones gdn_recur_regs and gdn_recur_cluster (S in registers)
    are compiled for."""
    return (dk, dv) == (GDN_RECUR_REGS_DK, GDN_RECUR_REGS_DV)


def gdn_recur_runnable(dk: int, dv: int, cc: int | None = None) -> tuple:
    """The recurrence kernels that can run heads of dk x dv here, in GDN_RECUR_VARIANTS order: the
    register kernels only for their compiled head dims, gdn_recur_cluster only on sm_90 and later
    (thread-block clusters). cc: the GPU's compute capability (90 for sm_90), read from the
    current device when the dims make it matter."""
    if not gdn_recur_in_registers(dk, dv):
        return ("smem",)
    cc = L.compute_capability() if cc is None else cc
    return tuple(v for v in GDN_RECUR_VARIANTS if v != "cluster" or cc >= 90)


def gdn_recur_variant(dk: int, dv: int, prefer: str = GDN_RECUR_DEFAULT, cc: int | None = None) -> str:
    """Which recurrence kernel runs heads of dk x dv: `prefer`, or the first after it in
    GDN_RECUR_VARIANTS that can run here (gdn_recur_runnable)."""
    if prefer not in GDN_RECUR_VARIANTS:
        raise ValueError(f"GDN recurrence variant {prefer!r}: expected one of {', '.join(GDN_RECUR_VARIANTS)}")
    here = gdn_recur_runnable(dk, dv, cc)
    return next(v for v in GDN_RECUR_VARIANTS[GDN_RECUR_VARIANTS.index(prefer):] if v in here)


def check_gdn_recur_variant(dk: int, dv: int, variant: str, cc: int | None = None) -> str:
    """`variant` itself, refused where it cannot run heads of dk x dv here."""
    if variant not in GDN_RECUR_VARIANTS:
        raise ValueError(f"GDN recurrence variant {variant!r}: expected one of {', '.join(GDN_RECUR_VARIANTS)}")
    if variant != "smem" and not gdn_recur_in_registers(dk, dv):
        raise ValueError(f"gdn_recur_{variant} is compiled for dk, dv = {GDN_RECUR_REGS_DK}, "
                         f"{GDN_RECUR_REGS_DV}, not {dk}, {dv}")
    if variant not in gdn_recur_runnable(dk, dv, cc):
        cc = L.compute_capability() if cc is None else cc
        raise ValueError(f"gdn_recur_cluster needs thread-block clusters (sm_90 and later); this GPU is sm_{cc}")
    return variant


def gdn_recur_smem(dk: int, dv: int, regs: bool = False) -> int:
    """Bytes of shared memory gdn_recur needs: S [dk, dv] (not in gdn_recur_regs), q, k [dk],
    v/delta [dv], one partial sum per thread, a block reduction's scratch (kernels/gdn.cu)."""
    state = 0 if regs else dk * dv
    return (state + 2 * dk + dv + GDN_RECUR_THREADS + L.RED_FLOATS) * 4


def check_cuda_shape(sh: GDNShape):
    """Refuse shapes the kernels cannot run, before any launch is built."""
    if sh.K > GDN_CONV_KMAX:
        raise ValueError(f"GDN conv kernel size {sh.K} > {GDN_CONV_KMAX} is not supported by kernels/gdn.cu")
    if sh.dv > GDN_RECUR_THREADS or gdn_recur_smem(sh.dk, sh.dv) > L.SMEM_MAX:
        raise ValueError(f"GDN head dims dk={sh.dk}, dv={sh.dv} are not supported by kernels/gdn.cu (shared memory)")


def gdn_conv_launch(QKV, ldq, conv_w, XC, ldx, hist_ring, slot_stride, nslots, mode: str, ctrl, M, C, K, seg=None):
    """Causal conv + SiLU of M rows; the conv window lives in slot ctrl[CTRL_SLOT] of hist_ring
    (mode in_place: updated; checkpoint: row j's window into slot live+1+j; cache: only read).
    seg: a segment table (kestrel/cuda/lower.py seg_table) over several sequences' rows, which then replaces hist_ring,
    nslots, mode, ctrl and M per sequence (kernels/common.cuh)."""
    args = (L.ptr(QKV), L.i32(ldq), L.ptr(conv_w), L.ptr(XC), L.i32(ldx), L.ptr(hist_ring), L.i64(slot_stride),
            L.i32(nslots), L.i32(GDN_MODES[mode]), L.ptr(ctrl), L.i32(M), L.i32(C), L.i32(K), L.ptr(seg))
    grid = (L.cdiv(C, GDN_CONV_THREADS),) if seg is None else (L.cdiv(C, GDN_CONV_THREADS), len(seg))
    return L.kernel("gdn", "gdn_conv"), grid, (GDN_CONV_THREADS,), args, 0


def gdn_move_inputs_launch(ROWS, ldr, ldc, n, seg, rows: int, to_cache: bool):
    """A batched pass's GDN input rows [n columns] and the sequences' input caches (seg, kestrel/
    cuda/lower.py seg_table: each one's rows and its layer's cache, P0): into the caches
    (to_cache, a cached verify) or out of them into the pass (a batched fold)."""
    grid = (L.cdiv(n, GDN_CONV_THREADS), rows, len(seg))
    args = (L.ptr(ROWS), L.i32(ldr), L.i32(ldc), L.i32(n), L.i32(int(to_cache)), L.ptr(seg))
    return L.kernel("gdn", "gdn_move_inputs"), grid, (GDN_CONV_THREADS,), args, 0


def gdn_recur_launch(XC, ldx, Z, ldz, B, ldb, A, lda, A_log, dt_bias, norm_w, Y, ldy, S_ring, slot_stride, nslots,
                     mode: str, ctrl, M, sh: GDNShape, variant: str, seg=None):
    """The delta-rule recurrence and gated norm of M rows; state in slot ctrl[CTRL_SLOT] of S_ring
    (mode in_place: updated; checkpoint: row j's state into slot live+1+j; cache: only read).
    variant: the kernel (the engine's: gdn_recur_variant of its backend's preference; tests run
    each, which must agree bit for bit). seg: a segment table, as gdn_conv_launch takes it."""
    check_cuda_shape(sh)
    variant = check_gdn_recur_variant(sh.dk, sh.dv, variant)
    args = (L.ptr(XC), L.i32(ldx), L.ptr(Z), L.i32(ldz), L.ptr(B), L.i32(ldb), L.ptr(A), L.i32(lda), L.ptr(A_log),
            L.ptr(dt_bias), L.ptr(norm_w), L.ptr(Y), L.i32(ldy), L.ptr(S_ring), L.i64(slot_stride), L.i32(nslots),
            L.i32(GDN_MODES[mode]), L.ptr(ctrl), L.i32(M), L.i32(sh.nk), L.i32(sh.nv), L.i32(sh.dk), L.i32(sh.dv),
            L.f32(np.float32(sh.dk ** -0.5)), L.f32(sh.eps), L.ptr(seg))
    nseg = () if seg is None else (len(seg),)
    if variant == "cluster":       # static shared memory only; the cluster dims are compiled in
        return L.kernel("gdn", "gdn_recur_cluster"), (sh.nv * GDN_CLUSTER, *nseg), (GDN_CLUSTER_THREADS,), args, 0
    regs = variant == "regs"
    fn = L.kernel("gdn", "gdn_recur_regs" if regs else "gdn_recur")
    sm = L.smem(fn, gdn_recur_smem(sh.dk, sh.dv, regs), f"GDN head dims dk={sh.dk}, dv={sh.dv}")
    return fn, (sh.nv, *nseg), (GDN_RECUR_THREADS,), args, sm
