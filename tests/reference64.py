"""An independent float64 reference of the Qwen3.5 hybrid model and its MTP head, written straight from the math.

It shares no code with kestrel.ops (plain loops and float64 NumPy), so a bug in an op
cannot hide in both. Used by test_ops.py and test_hf_parity.py.
"""
import math

import numpy as np


def f64(a):
    return np.asarray(a, dtype=np.float64)


def rmsnorm_zc(x, w, eps):
    x = f64(x)
    return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * (1.0 + f64(w))


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def linear(x, w):
    return f64(x) @ f64(w).T


def rope_row(x, pos, rot, theta):
    """x [heads, hd] at position pos, NeoX halves over the first rot channels."""
    x = f64(x).copy()
    half = rot // 2
    out = x.copy()
    for i in range(half):
        ang = pos / theta ** (2 * i / rot)
        c, s = math.cos(ang), math.sin(ang)
        out[:, i] = x[:, i] * c - x[:, i + half] * s
        out[:, i + half] = x[:, i + half] * c + x[:, i] * s
    return out


def gdn_token(cfg, w, p, xn, S, hist):
    """One token through a GDN mixer. S [nv, dk, dv], hist [C, K-1] updated in place (float64)."""
    nk, nv, dk, dv, K = (cfg.lin_num_key_heads, cfg.lin_num_value_heads, cfg.lin_key_head_dim,
                         cfg.lin_value_head_dim, cfg.conv_kernel)
    qkv = linear(xn[None], w[f"{p}.in_proj_qkv.weight"])[0]
    z = linear(xn[None], w[f"{p}.in_proj_z.weight"])[0].reshape(nv, dv)
    b = linear(xn[None], w[f"{p}.in_proj_b.weight"])[0]
    a = linear(xn[None], w[f"{p}.in_proj_a.weight"])[0]
    cw = f64(w[f"{p}.conv1d.weight"])[:, 0, :]               # [C, K]; column K-1 multiplies the current token
    win = np.concatenate([hist, qkv[:, None]], axis=1)
    x = silu((win * cw).sum(1))
    hist[...] = win[:, 1:]
    q = x[:nk * dk].reshape(nk, dk)
    k = x[nk * dk:2 * nk * dk].reshape(nk, dk)
    v = x[2 * nk * dk:].reshape(nv, dv)
    q = q / np.sqrt((q ** 2).sum(-1, keepdims=True) + 1e-6) * dk ** -0.5
    k = k / np.sqrt((k ** 2).sum(-1, keepdims=True) + 1e-6)
    beta = sigmoid(b)
    g = -np.exp(f64(w[f"{p}.A_log"])) * softplus(a + f64(w[f"{p}.dt_bias"]))
    r = nv // nk
    o = np.zeros((nv, dv))
    for h in range(nv):
        kh, qh = k[h // r], q[h // r]
        S[h] *= math.exp(g[h])
        delta = beta[h] * (v[h] - S[h].T @ kh)
        S[h] += np.outer(kh, delta)
        o[h] = S[h].T @ qh
    nw = f64(w[f"{p}.norm.weight"])
    y = nw * (o / np.sqrt((o ** 2).mean(-1, keepdims=True) + cfg.rms_norm_eps)) * silu(z)
    return linear(y.reshape(1, -1), w[f"{p}.out_proj.weight"])[0]


def attn_token(cfg, w, p, xn, kcache, vcache, pos):
    """One token through gated attention; kcache/vcache are python lists (appended)."""
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    qg = linear(xn[None], w[f"{p}.q_proj.weight"])[0].reshape(nh, 2 * hd)
    q, gate = qg[:, :hd], qg[:, hd:].reshape(-1)
    k = linear(xn[None], w[f"{p}.k_proj.weight"])[0].reshape(nkv, hd)
    v = linear(xn[None], w[f"{p}.v_proj.weight"])[0].reshape(nkv, hd)
    q = rope_row(rmsnorm_zc(q, w[f"{p}.q_norm.weight"], cfg.rms_norm_eps), pos, cfg.rot_dim, cfg.rope_theta)
    k = rope_row(rmsnorm_zc(k, w[f"{p}.k_norm.weight"], cfg.rms_norm_eps), pos, cfg.rot_dim, cfg.rope_theta)
    kcache.append(k)
    vcache.append(v)
    K, V = np.stack(kcache), np.stack(vcache)                  # [L, nkv, hd]
    out = np.zeros((nh, hd))
    for i in range(nh):
        kv = i // (nh // nkv)
        s = K[:, kv] @ q[i] * hd ** -0.5
        pr = np.exp(s - s.max())
        pr /= pr.sum()
        out[i] = pr @ V[:, kv]
    return linear((out.reshape(-1) * sigmoid(gate))[None], w[f"{p}.o_proj.weight"])[0]


def layer_token(cfg, w, p, kind, x, pos, st):
    xn = rmsnorm_zc(x, w[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps)
    if kind == "linear_attention":
        x = x + gdn_token(cfg, w, f"{p}.linear_attn", xn, *st)
    else:
        x = x + attn_token(cfg, w, f"{p}.self_attn", xn, *st, pos)
    xn = rmsnorm_zc(x, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
    act = silu(linear(xn[None], w[f"{p}.mlp.gate_proj.weight"])) * linear(xn[None], w[f"{p}.mlp.up_proj.weight"])
    return x + linear(act, w[f"{p}.mlp.down_proj.weight"])[0]


class Reference:
    """Token-by-token float64 model with its own state."""

    def __init__(self, cfg, w):
        self.cfg, self.w = cfg, w
        self.state = []
        for t in cfg.layer_types:
            if t == "linear_attention":
                self.state.append((np.zeros((cfg.lin_num_value_heads, cfg.lin_key_head_dim, cfg.lin_value_head_dim)),
                                   np.zeros((cfg.conv_dim, cfg.conv_kernel - 1))))
            else:
                self.state.append(([], []))
        self.mtp_state = ([], [])
        self.pos = 0
        self.head = w["embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]

    def step(self, token):
        cfg = self.cfg
        x = f64(self.w["embed_tokens.weight"][token])
        for i, kind in enumerate(cfg.layer_types):
            x = layer_token(cfg, self.w, f"layers.{i}", kind, x, self.pos, self.state[i])
        self.pos += 1
        h = rmsnorm_zc(x, self.w["norm.weight"], cfg.rms_norm_eps)
        return h, linear(h[None], self.head)[0]

    def mtp_step(self, token, hidden, pos):
        cfg, w = self.cfg, self.w
        e = rmsnorm_zc(f64(w["embed_tokens.weight"][token]), w["mtp.pre_fc_norm_embedding.weight"], cfg.rms_norm_eps)
        h = rmsnorm_zc(hidden, w["mtp.pre_fc_norm_hidden.weight"], cfg.rms_norm_eps)
        u = linear(np.concatenate([e, h])[None], w["mtp.fc.weight"])[0]
        u = layer_token(cfg, w, "mtp.layers.0", "full_attention", u, pos, self.mtp_state)
        hp = rmsnorm_zc(u, w["mtp.norm.weight"], cfg.rms_norm_eps)
        return hp, linear(hp[None], self.head)[0]
