"""The Qwen3.5 hybrid model (SPEC §2) as row-block functions over explicit state.

    x = embed(tokens)
    for each layer:  x += mixer(input_layernorm(x));  x += mlp(post_attention_layernorm(x))
    h = norm(x);  logits = lm_head(h)            (lm_head tied to embed_tokens if configured)
    mixer = Gated DeltaNet (state S, hist)  or  gated attention (KV cache + cursor)

MTP head, one row at position q, token x, hidden h:
    u = fc([pre_fc_norm_embedding(embed(x)) | pre_fc_norm_hidden(h)]);  u = layer(u) at q
    h' = mtp.norm(u);  logits = lm_head(h')

The functions here do no validation and own no state: the Engine does both.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import Config
from .ops.gdn import GDNShape


@dataclass
class LayerState:
    """What one forward pass needs from the engine: views into its buffers."""
    S: list            # per GDN layer: live state [nv, dk, dv]
    hist: list         # per GDN layer: live conv history [C, K-1]
    kc: list           # per attention layer: [max_seq, nkv, hd]
    vc: list
    S_slots: list | None = None     # per GDN layer: M slot views (per-row checkpoints) or None
    hist_slots: list | None = None
    engine: object = None           # the Engine owning these buffers: a device backend may address its
                                    # whole state (ring of slots, caches) instead of the views above


class Model:
    def __init__(self, cfg: Config, tensors: dict, backend, source: str = "", weight_dtype: str = "fp32"):
        self.cfg, self.be, self.source, self.weight_dtype = cfg, backend, source, weight_dtype
        self.w = {n: backend.put_weight(n, t, weight_dtype) for n, t in tensors.items()}
        self.head = self.w["embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
        self.gdn_shape = GDNShape(cfg.lin_num_key_heads, cfg.lin_num_value_heads, cfg.lin_key_head_dim,
                                  cfg.lin_value_head_dim, cfg.conv_kernel, cfg.rms_norm_eps)
        self._rope_len = 0
        self.tokenizer = None

    @property
    def has_mtp(self) -> bool:
        return self.cfg.mtp_layers > 0

    def rope_rows(self, pos: int, m: int):
        if pos + m > self._rope_len:
            n = max(pos + m, 2 * self._rope_len, 256)
            cos, sin = self.be.rope_tables(self.cfg.rot_dim, self.cfg.rope_theta, n)
            self._cos, self._sin, self._rope_len = self.be.asarray(cos), self.be.asarray(sin), n
        return self._cos[pos:pos + m], self._sin[pos:pos + m]

    # ---- blocks --------------------------------------------------------------------------
    def gdn_mixer(self, p: str, xn, S, hist, S_slots=None, hist_slots=None):
        be, w = self.be, self.w
        qkv = be.linear(xn, w[f"{p}.in_proj_qkv.weight"])
        z = be.linear(xn, w[f"{p}.in_proj_z.weight"])
        b = be.linear(xn, w[f"{p}.in_proj_b.weight"])
        a = be.linear(xn, w[f"{p}.in_proj_a.weight"])
        y = be.gdn_core(self.gdn_shape, qkv, z, b, a, w[f"{p}.conv1d.weight"], w[f"{p}.A_log"],
                        w[f"{p}.dt_bias"], w[f"{p}.norm.weight"], S, hist, S_slots, hist_slots)
        return be.linear(y, w[f"{p}.out_proj.weight"])

    def attn_mixer(self, p: str, xn, kc, vc, pos: int):
        be, w, c = self.be, self.w, self.cfg
        m = xn.shape[0]
        qg = be.linear(xn, w[f"{p}.q_proj.weight"]).reshape(m, c.num_heads, 2 * c.head_dim)
        k = be.linear(xn, w[f"{p}.k_proj.weight"]).reshape(m, c.num_kv_heads, c.head_dim)
        v = be.linear(xn, w[f"{p}.v_proj.weight"]).reshape(m, c.num_kv_heads, c.head_dim)
        cos, sin = self.rope_rows(pos, m)
        o = be.attn_core(qg, k, v, w[f"{p}.q_norm.weight"], w[f"{p}.k_norm.weight"], cos, sin, kc, vc, pos,
                         c.rms_norm_eps, c.head_dim ** -0.5)
        return be.linear(o, w[f"{p}.o_proj.weight"])

    def mlp(self, p: str, xn):
        be, w = self.be, self.w
        act = be.swiglu(be.linear(xn, w[f"{p}.mlp.gate_proj.weight"]), be.linear(xn, w[f"{p}.mlp.up_proj.weight"]))
        return be.linear(act, w[f"{p}.mlp.down_proj.weight"])

    def decoder_layer(self, p: str, kind: str, x, pos: int, gdn=None, kv=None):
        be, w, eps = self.be, self.w, self.cfg.rms_norm_eps
        xn = be.rmsnorm(x, w[f"{p}.input_layernorm.weight"], eps)
        if kind == "linear_attention":
            x = be.add(x, self.gdn_mixer(f"{p}.linear_attn", xn, *gdn))
        else:
            x = be.add(x, self.attn_mixer(f"{p}.self_attn", xn, *kv, pos))
        return be.add(x, self.mlp(p, be.rmsnorm(x, w[f"{p}.post_attention_layernorm.weight"], eps)))

    # ---- whole passes --------------------------------------------------------------------
    def forward(self, tokens, pos: int, st: LayerState):
        """Main model over M rows at positions pos..pos+M-1. Returns (hidden [M,D], logits [M,V])."""
        run = getattr(self.be, "run_forward", None)     # a backend may run the whole pass (CUDA graphs)
        if run is not None:
            out = run(self, tokens, pos, st)
            if out is not None:
                return out
        be, cfg = self.be, self.cfg
        x = be.embed(self.w["embed_tokens.weight"], tokens)
        gi = ai = 0
        for i, kind in enumerate(cfg.layer_types):
            if kind == "linear_attention":
                slots = (None, None) if st.S_slots is None else (st.S_slots[gi], st.hist_slots[gi])
                x = self.decoder_layer(f"layers.{i}", kind, x, pos, gdn=(st.S[gi], st.hist[gi], *slots))
                gi += 1
            else:
                x = self.decoder_layer(f"layers.{i}", kind, x, pos, kv=(st.kc[ai], st.vc[ai]))
                ai += 1
        h = be.rmsnorm(x, self.w["norm.weight"], cfg.rms_norm_eps)
        return h, be.linear(h, self.head)

    def mtp_forward(self, tokens, hidden, pos: int, kc, vc):
        """MTP head over M rows at positions pos..: (h' [M,D], logits [M,V])."""
        run = getattr(self.be, "run_mtp_forward", None)
        if run is not None:
            out = run(self, tokens, hidden, pos, kc, vc)
            if out is not None:
                return out
        be, w, eps = self.be, self.w, self.cfg.rms_norm_eps
        e = be.rmsnorm(be.embed(w["embed_tokens.weight"], tokens), w["mtp.pre_fc_norm_embedding.weight"], eps)
        h = be.rmsnorm(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)
        u = be.linear(be.xp.concatenate([e, h], axis=1), w["mtp.fc.weight"])
        u = self.decoder_layer("mtp.layers.0", "full_attention", u, pos, kv=(kc, vc))
        hp = be.rmsnorm(u, w["mtp.norm.weight"], eps)
        return hp, be.linear(hp, self.head)

    def __repr__(self):
        c = self.cfg
        return (f"Model({c.name}: {c.num_layers} layers {len(c.gdn_layers)} GDN + {len(c.attn_layers)} attn, "
                f"H={c.hidden_size}, vocab={c.vocab_size}, mtp={c.mtp_layers}, backend={self.be.name})")


def numpy_param_count(tensors: dict) -> int:
    return int(sum(np.prod(t.shape) for t in tensors.values()))
