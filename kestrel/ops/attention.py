"""Gated attention over a KV cache with a cursor (NumPy twin and launchers of kernels/attention.cu).

Input row j of a batch starting at position pos is [q·gate | k | v]: per query head i the
query (hd) then its gate (hd); then nkv key heads; then nkv value heads. Row j:
    q = rope(rmsnorm_zc(q, q_norm)), k = rope(rmsnorm_zc(k, k_norm))    (ops/norm.py, ops/rope.py)
    K/V rows pos+j are appended to the cache, then row j attends to cache rows 0 .. pos+j
    (causal inside the batch); GQA: query head i reads kv head i // (nh / nkv); scores scaled
    by hd^-0.5, softmax in fp32; out = softmax · V * sigmoid(gate).
Rows at or past the cursor are never read. Each row is computed by the same calls whatever M is.
"""
import numpy as np

from .. import nvrtc as L
from . import norm as _norm
from . import rope as _rope

KV_APPEND_THREADS = 128
ATTN_DECODE_THREADS = 256
CUDA_DEFINES = {"KV_APPEND_THREADS": KV_APPEND_THREADS, "ATTN_DECODE_THREADS": ATTN_DECODE_THREADS}
L.register("attention", CUDA_DEFINES)


def split_in_proj(ain: np.ndarray, nh: int, nkv: int, hd: int):
    """[M, nh*2hd + 2*nkv*hd] -> qg [M, nh, 2hd], k [M, nkv, hd], v [M, nkv, hd]."""
    m = ain.shape[0]
    qd, kd = nh * 2 * hd, nkv * hd
    return (ain[:, :qd].reshape(m, nh, 2 * hd), ain[:, qd:qd + kd].reshape(m, nkv, hd),
            ain[:, qd + kd:].reshape(m, nkv, hd))


def attention_rows(q: np.ndarray, kc: np.ndarray, vc: np.ndarray, pos: int, scale: float) -> np.ndarray:
    """q [M, nh, hd] (normed, rotated); kc/vc [max_seq, nkv, hd] with rows < pos + M valid.
    Returns [M, nh * hd]."""
    M, nh, hd = q.shape
    nkv = kc.shape[1]
    g = nh // nkv
    out = np.empty((M, nh * hd), np.float32)
    for j in range(M):
        L_ = pos + j + 1
        K = np.ascontiguousarray(kc[:L_].transpose(1, 2, 0))     # [nkv, hd, L]
        V = np.ascontiguousarray(vc[:L_].transpose(1, 0, 2))     # [nkv, L, hd]
        s = (q[j].reshape(nkv, g, hd) @ K) * np.float32(scale)   # [nkv, g, L]
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        out[j] = (p @ V).reshape(-1)
    return out


def attention_block(qg, k, v, q_norm, k_norm, cos, sin, kc, vc, pos: int, eps: float, scale: float) -> np.ndarray:
    """qg [M, nh, 2hd] = [query | gate] per head; k/v [M, nkv, hd] raw projections; cos/sin the
    M rows of the RoPE tables. Appends K/V at rows pos.., returns [M, nh*hd]."""
    M, nh, hd2 = qg.shape
    hd = hd2 // 2
    q = _rope.apply_rope(_norm.rmsnorm(qg[..., :hd], q_norm, eps), cos, sin)
    k = _rope.apply_rope(_norm.rmsnorm(k, k_norm, eps), cos, sin)
    kc[pos:pos + M] = k
    vc[pos:pos + M] = v
    o = attention_rows(q, kc, vc, pos, scale)
    return o * _norm.sigmoid(np.ascontiguousarray(qg[..., hd:]).reshape(M, nh * hd))


def kv_append_launch(K_, ldk, V_, ldv, knw, cos, sin, rope_row0, kc, vc, ctrl, M, nkv, hd, rh, eps, seg=None):
    """Append M rows of normed, rotated K and raw V at rows ctrl[CTRL_POS].. of the caches.
    seg: a segment table (kestrel/cuda/lower.py seg_table) over several sequences' rows, each with
    its own caches (P0, P1), ctrl and rows; M is then the most rows of a segment."""
    fn = L.kernel("attention", "attn_kv_append")
    sm = L.smem(fn, (hd + L.RED_FLOATS) * 4, f"attention head_dim {hd}")
    args = (L.ptr(K_), L.i32(ldk), L.ptr(V_), L.i32(ldv), L.ptr(knw), L.ptr(cos), L.ptr(sin), L.i32(rope_row0),
            L.ptr(kc), L.ptr(vc), L.ptr(ctrl), L.i32(nkv), L.i32(hd), L.i32(rh), L.f32(eps), L.ptr(seg))
    return fn, (nkv, M) if seg is None else (nkv, M, len(seg)), (KV_APPEND_THREADS,), args, sm


def attn_decode_launch(Q, ldq, qnw, cos, sin, rope_row0, kc, vc, O, ldo, ctrl, M, nh, nkv, hd, rh, eps, scale, lmax,
                       seg=None):
    """O = gated attention of M query rows over cache rows < ctrl[CTRL_POS] + j + 1 (<= lmax).
    seg: a segment table, as kv_append_launch takes it."""
    fn = L.kernel("attention", "attn_decode")
    sm = L.smem(fn, (hd + L.RED_FLOATS + lmax) * 4, f"attention over {lmax} positions (max_seq)")
    args = (L.ptr(Q), L.i32(ldq), L.ptr(qnw), L.ptr(cos), L.ptr(sin), L.i32(rope_row0), L.ptr(kc), L.ptr(vc),
            L.ptr(O), L.i32(ldo), L.ptr(ctrl), L.i32(nh), L.i32(nkv), L.i32(hd), L.i32(rh), L.f32(eps), L.f32(scale),
            L.ptr(seg))
    return fn, (nh, M) if seg is None else (nh, M, len(seg)), (ATTN_DECODE_THREADS,), args, sm
