"""Model configuration: one dataclass, Hugging Face config.json parsing, named presets.

The model family is the Qwen3.5 dense text model (SPEC §2): a stack of Gated DeltaNet
("linear_attention") and gated full-attention layers, plus an optional MTP head.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

LAYER_TYPES = ("linear_attention", "full_attention")


class ConfigError(ValueError):
    """A config.json that kestrel cannot run faithfully."""


@dataclass(frozen=True)
class Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int            # attention query heads (nh)
    num_kv_heads: int         # attention kv heads (nkv)
    head_dim: int             # attention head dim (hd)
    intermediate_size: int
    lin_num_key_heads: int    # GDN nk
    lin_num_value_heads: int  # GDN nv
    lin_key_head_dim: int     # GDN dk
    lin_value_head_dim: int   # GDN dv
    conv_kernel: int = 4      # GDN K
    layer_types: tuple = ()
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    mtp_layers: int = 1
    max_position_embeddings: int = 32768
    name: str = "custom"

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", default_layer_types(self.num_layers, 4))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self.validate()

    # ---- derived sizes -------------------------------------------------------------
    @property
    def conv_dim(self) -> int:  # C: channels of the causal conv = q|k|v
        return 2 * self.lin_num_key_heads * self.lin_key_head_dim + self.lin_num_value_heads * self.lin_value_head_dim

    @property
    def rot_dim(self) -> int:   # channels rotated by the partial NeoX RoPE
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gdn_layers(self) -> tuple:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def attn_layers(self) -> tuple:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_state_bytes(self) -> int:
        """fp32 recurrent state S of every GDN layer: the seed's 'S = 149.6 MB' at 27B."""
        nv, dk, dv = self.lin_num_value_heads, self.lin_key_head_dim, self.lin_value_head_dim
        return len(self.gdn_layers) * nv * dk * dv * 4

    @property
    def conv_state_bytes(self) -> int:
        """fp32 conv history ('hist') of every GDN layer: the last K-1 inputs of C channels."""
        return len(self.gdn_layers) * self.conv_dim * (self.conv_kernel - 1) * 4

    def kv_bytes_per_token(self, dtype_bytes: int = 4, mtp: bool = False) -> int:
        n = len(self.attn_layers) + (self.mtp_layers if mtp else 0)
        return n * 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    def param_count(self, mtp: bool = True) -> int:
        return sum(int_prod(s) for n, s in expected_shapes(self).items() if mtp or not n.startswith("mtp."))

    # ---- checks ---------------------------------------------------------------------
    def validate(self):
        def need(cond, msg):
            if not cond:
                raise ConfigError(f"config {self.name!r}: {msg}")
        for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "lin_num_key_heads", "lin_num_value_heads", "lin_key_head_dim",
                  "lin_value_head_dim", "conv_kernel"):
            need(isinstance(getattr(self, f), int) and getattr(self, f) > 0, f"{f} must be a positive int, got {getattr(self, f)!r}")
        need(len(self.layer_types) == self.num_layers,
             f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        need(not bad, f"unknown layer type(s) {sorted(set(bad))}; known: {LAYER_TYPES}")
        need(self.num_heads % self.num_kv_heads == 0, f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        need(self.lin_num_value_heads % self.lin_num_key_heads == 0,
             f"linear_num_value_heads {self.lin_num_value_heads} not a multiple of linear_num_key_heads {self.lin_num_key_heads}")
        need(self.rot_dim % 2 == 0 and 0 < self.rot_dim <= self.head_dim,
             f"rotary dim int(head_dim*partial_rotary_factor) = {self.rot_dim} must be even and in (0, head_dim]")
        need(self.conv_kernel >= 2, f"linear_conv_kernel_dim must be >= 2, got {self.conv_kernel}")
        need(self.mtp_layers in (0, 1), f"mtp_num_hidden_layers must be 0 or 1 (kestrel runs one MTP layer), got {self.mtp_layers}")

    # ---- HF config.json ------------------------------------------------------------
    def to_hf(self) -> dict:
        return {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "linear_num_key_heads": self.lin_num_key_heads,
            "linear_num_value_heads": self.lin_num_value_heads,
            "linear_key_head_dim": self.lin_key_head_dim,
            "linear_value_head_dim": self.lin_value_head_dim,
            "linear_conv_kernel_dim": self.conv_kernel,
            "layer_types": list(self.layer_types),
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor},
            "tie_word_embeddings": self.tie_word_embeddings,
            "mtp_num_hidden_layers": self.mtp_layers,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
        }

    def replace(self, **kw) -> "Config":
        return dataclasses.replace(self, **kw)


def int_prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def default_layer_types(n: int, interval: int) -> tuple:
    """Layer i is full attention iff (i+1) % interval == 0 (Qwen3.5's rule absent layer_types)."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n))


# Keys that change the computation but that kestrel does not implement: refuse, naming them.
_UNSUPPORTED = {
    "attention_bias": (False, None),
    "hidden_act": ("silu", None),
    "num_experts": (None, 0),
    "rope_scaling": (None,),
    "use_sliding_window": (False, None),
}


def from_hf(cfg: dict, name: str = "hf") -> Config:
    """Parse a Qwen3.5 config.json (flat text config, or nested under `text_config`)."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config must be a JSON object, got {type(cfg).__name__}")
    top_type = cfg.get("model_type")
    if "text_config" in cfg:
        cfg = dict(cfg["text_config"])
    mt = cfg.get("model_type", top_type)
    if mt is not None and mt not in ("qwen3_5", "qwen3_5_text"):
        raise ConfigError(f"model_type {mt!r} is not a Qwen3.5 dense text model (qwen3_5 / qwen3_5_text)")
    for key, ok in _UNSUPPORTED.items():
        if key in cfg and cfg[key] not in ok:
            raise ConfigError(f"config key {key}={cfg[key]!r} is not supported (kestrel implements {ok[0]!r})")
    rope = cfg.get("rope_parameters") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"rope_parameters.rope_type={rope_type!r} is not supported (only default 1-D RoPE)")

    def get(key, default=None, required=True):
        if key in cfg:
            return cfg[key]
        if required and default is None:
            raise ConfigError(f"config.json lacks required key {key!r}")
        return default

    n_layers = int(get("num_hidden_layers"))
    if cfg.get("layer_types") is not None:
        layer_types = tuple(cfg["layer_types"])
    else:
        layer_types = default_layer_types(n_layers, int(cfg.get("full_attention_interval", 4)))
    hidden = int(get("hidden_size"))
    nh = int(get("num_attention_heads"))
    return Config(
        vocab_size=int(get("vocab_size")),
        hidden_size=hidden,
        num_layers=n_layers,
        num_heads=nh,
        num_kv_heads=int(get("num_key_value_heads")),
        head_dim=int(cfg.get("head_dim") or hidden // nh),
        intermediate_size=int(get("intermediate_size")),
        lin_num_key_heads=int(get("linear_num_key_heads")),
        lin_num_value_heads=int(get("linear_num_value_heads")),
        lin_key_head_dim=int(get("linear_key_head_dim")),
        lin_value_head_dim=int(get("linear_value_head_dim")),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        layer_types=layer_types,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1e7))),
        partial_rotary_factor=float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        mtp_layers=int(cfg.get("mtp_num_hidden_layers", 0)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
        name=name,
    )


def load_config(path) -> Config:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise FileNotFoundError(f"no config.json at {p}")
    return from_hf(json.loads(p.read_text()), name=p.parent.name)


def expected_shapes(cfg: Config) -> dict:
    """Canonical tensor names (no 'model.' prefix) -> shape, for the whole checkpoint."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    nk, nv, dk, dv, K = cfg.lin_num_key_heads, cfg.lin_num_value_heads, cfg.lin_key_head_dim, cfg.lin_value_head_dim, cfg.conv_kernel
    C = cfg.conv_dim

    def layer(prefix, kind):
        s = {f"{prefix}.input_layernorm.weight": (H,), f"{prefix}.post_attention_layernorm.weight": (H,),
             f"{prefix}.mlp.gate_proj.weight": (I, H), f"{prefix}.mlp.up_proj.weight": (I, H),
             f"{prefix}.mlp.down_proj.weight": (H, I)}
        if kind == "linear_attention":
            a = f"{prefix}.linear_attn"
            s.update({f"{a}.in_proj_qkv.weight": (C, H), f"{a}.in_proj_z.weight": (nv * dv, H),
                      f"{a}.in_proj_b.weight": (nv, H), f"{a}.in_proj_a.weight": (nv, H),
                      f"{a}.conv1d.weight": (C, 1, K), f"{a}.A_log": (nv,), f"{a}.dt_bias": (nv,),
                      f"{a}.norm.weight": (dv,), f"{a}.out_proj.weight": (H, nv * dv)})
        else:
            a = f"{prefix}.self_attn"
            s.update({f"{a}.q_proj.weight": (nh * hd * 2, H), f"{a}.k_proj.weight": (nkv * hd, H),
                      f"{a}.v_proj.weight": (nkv * hd, H), f"{a}.o_proj.weight": (H, nh * hd),
                      f"{a}.q_norm.weight": (hd,), f"{a}.k_norm.weight": (hd,)})
        return s

    shapes = {"embed_tokens.weight": (cfg.vocab_size, H), "norm.weight": (H,)}
    for i, t in enumerate(cfg.layer_types):
        shapes.update(layer(f"layers.{i}", t))
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, H)
    if cfg.mtp_layers:
        shapes.update({"mtp.fc.weight": (H, 2 * H), "mtp.pre_fc_norm_embedding.weight": (H,),
                       "mtp.pre_fc_norm_hidden.weight": (H,), "mtp.norm.weight": (H,)})
        shapes.update(layer("mtp.layers.0", "full_attention"))
    return shapes


# ---- named presets ------------------------------------------------------------------
def _qwen(name, H, L, nh, nkv, inter, nk, nv, tie):
    return Config(vocab_size=248320, hidden_size=H, num_layers=L, num_heads=nh, num_kv_heads=nkv, head_dim=256,
                  intermediate_size=inter, lin_num_key_heads=nk, lin_num_value_heads=nv, lin_key_head_dim=128,
                  lin_value_head_dim=128, conv_kernel=4, layer_types=default_layer_types(L, 4), rms_norm_eps=1e-6,
                  rope_theta=1e7, partial_rotary_factor=0.25, tie_word_embeddings=tie, mtp_layers=1,
                  max_position_embeddings=262144, name=name)


PRESETS: dict[str, Config] = {
    # Reference shapes of SPEC §2 (weights are random; generated on the device).
    "qwen3.5-0.8b": _qwen("qwen3.5-0.8b", 1024, 24, 8, 2, 3584, 16, 16, True),
    "qwen3.5-4b": _qwen("qwen3.5-4b", 2560, 32, 16, 4, 9216, 16, 32, True),
    "qwen3.5-9b": _qwen("qwen3.5-9b", 4096, 32, 16, 4, 12288, 16, 32, False),
    "qwen3.5-27b": _qwen("qwen3.5-27b", 5120, 64, 24, 4, 17408, 16, 48, False),
    # Small shapes for tests: nk < nv, tied / untied, interval rule / explicit layer_types.
    "test-a": Config(vocab_size=97, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=96, lin_num_key_heads=2, lin_num_value_heads=4, lin_key_head_dim=16,
                     lin_value_head_dim=16, layer_types=default_layer_types(4, 4), tie_word_embeddings=True,
                     rope_theta=1e4, max_position_embeddings=512, name="test-a"),
    "test-b": Config(vocab_size=131, hidden_size=48, num_layers=5, num_heads=2, num_kv_heads=1, head_dim=32,
                     intermediate_size=80, lin_num_key_heads=2, lin_num_value_heads=2, lin_key_head_dim=8,
                     lin_value_head_dim=12, conv_kernel=3,
                     layer_types=("linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"),
                     tie_word_embeddings=False, rope_theta=1e6, partial_rotary_factor=0.5,
                     max_position_embeddings=512, name="test-b"),
}


def preset(name: str) -> Config:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {sorted(PRESETS)}") from None
