"""Gated DeltaNet token step (NumPy twin of kernels/gdn.cu).

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

from .norm import gated_rmsnorm, sigmoid, silu

L2_EPS = np.float32(1e-6)


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
    """qkv [M, C], z [M, nv*dv], b/a [M, nv]; conv_w [C, K]; S [nv, dk, dv]; hist [C, K-1].

    S_slots/hist_slots None: update S/hist in place. Otherwise sequences of M arrays: row j's
    state is written to slot j (row j+1 starts from it); S/hist are only read.
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
