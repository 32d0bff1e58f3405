"""Model configuration: one dataclass, Hugging Face config.json parsing, named presets.

The model family is the Qwen3.5 dense text model: a stack of Gated DeltaNet
("linear_attention") and gated full-attention layers, plus an optional MTP head.

Every value kestrel reads has a type and a range, checked twice: by `from_hf` against the
JSON (messages name the JSON key and its value; a JSON boolean where a flag is expected, a
JSON integer where a size is expected, nothing coerced), and by `Config.validate`, which
every Config runs when it is built (presets, hand-built configs, `replace`), naming the
field. Keys that would change the computation but that kestrel does not implement are
refused by name rather than ignored.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .confined import model_root, parse_json, read_member
from .errors import ConfigError
from .hf_keys import refuse_unsupported, same as _same
from .inputs import is_int

LAYER_TYPES = ("linear_attention", "full_attention")
MAX_SIZE = 2 ** 31 - 1          # every size and count fits a signed 32-bit index
MAX_LAYERS = 4096               # far above any real model (27B: 64), low enough that a typo cannot build
                                # millions of layer entries
CONFIG_MAX_BYTES = 16 << 20     # a config.json is a few KiB; refuse anything absurd before parsing it

# Config field -> the config.json key it comes from (messages name both).
HF_KEYS = {
    "vocab_size": "vocab_size", "hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
    "intermediate_size": "intermediate_size", "lin_num_key_heads": "linear_num_key_heads",
    "lin_num_value_heads": "linear_num_value_heads", "lin_key_head_dim": "linear_key_head_dim",
    "lin_value_head_dim": "linear_value_head_dim", "conv_kernel": "linear_conv_kernel_dim",
    "layer_types": "layer_types", "rms_norm_eps": "rms_norm_eps", "rope_theta": "rope_parameters.rope_theta",
    "partial_rotary_factor": "rope_parameters.partial_rotary_factor",
    "tie_word_embeddings": "tie_word_embeddings", "mtp_layers": "mtp_num_hidden_layers",
    "max_position_embeddings": "max_position_embeddings",
}
# Integer fields: (lowest, highest) allowed value.
_INT_RANGES = {
    "vocab_size": (1, MAX_SIZE), "hidden_size": (1, MAX_SIZE), "num_layers": (1, MAX_LAYERS),
    "num_heads": (1, MAX_SIZE), "num_kv_heads": (1, MAX_SIZE), "head_dim": (1, MAX_SIZE),
    "intermediate_size": (1, MAX_SIZE), "lin_num_key_heads": (1, MAX_SIZE), "lin_num_value_heads": (1, MAX_SIZE),
    "lin_key_head_dim": (1, MAX_SIZE), "lin_value_head_dim": (1, MAX_SIZE), "conv_kernel": (2, MAX_SIZE),
    "mtp_layers": (0, 1), "max_position_embeddings": (1, MAX_SIZE),
}


def is_real(x) -> bool:
    """A real number: ints or floats (Python or NumPy); never a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def is_float_value(x) -> bool:
    """A real number that a float holds exactly and finitely: what a config's real fields may be
    (an int beyond 2**53 would load as another number; one beyond the float range not at all)."""
    if not is_real(x):
        return False
    try:
        f = float(x)
    except OverflowError:
        return False
    return math.isfinite(f) and f == x


_F32_TINY = float(np.finfo(np.float32).tiny)
_F32_MAX = float(np.finfo(np.float32).max)


def is_f32_positive(x) -> bool:
    """A float value (is_float_value) that stays finite and positive in float32, the precision
    the model computes in: rms_norm_eps=1e39 is finite in float64 and infinite in float32, and
    1e-50 becomes 0. Normal float32 range: [1.18e-38, 3.4e38]."""
    return is_float_value(x) and _F32_TINY <= float(x) <= _F32_MAX


def _int_error(what: str, value, lo: int, hi: int) -> str:
    if lo == 0 and hi == 1:
        return f"{what} must be 0 or 1 (kestrel runs at most one MTP layer), got {value!r}"
    return f"{what} must be an int in [{lo}, {hi}], got {value!r}"


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
        # Normalise what is unambiguous (NumPy ints -> int, NumPy floats -> float, list -> tuple)
        # so the frozen fields hold plain Python values; everything else is validate()'s to refuse.
        setf = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        if not isinstance(self.name, str):
            raise ConfigError(f"config name must be a str, got {self.name!r}")
        for f in _INT_RANGES:
            v = getattr(self, f)
            if is_int(v):
                setf(f, int(v))
        for f in ("rms_norm_eps", "rope_theta", "partial_rotary_factor"):
            v = getattr(self, f)
            if is_float_value(v):
                setf(f, float(v))
        if isinstance(self.tie_word_embeddings, np.bool_):
            setf("tie_word_embeddings", bool(self.tie_word_embeddings))
        lt = self.layer_types
        if isinstance(lt, (str, bytes)) or not isinstance(lt, (tuple, list)):
            raise self._error("layer_types", lt, "must be a list or tuple of layer type names")
        if not lt and is_int(self.num_layers) and 1 <= self.num_layers <= MAX_LAYERS:
            lt = default_layer_types(self.num_layers, 4)
        setf("layer_types", tuple(lt))
        self.validate()

    # ---- derived sizes -------------------------------------------------------------
    @property
    def conv_dim(self) -> int:  # C: channels of the causal conv = q|k|v
        return 2 * self.lin_num_key_heads * self.lin_key_head_dim + self.lin_num_value_heads * self.lin_value_head_dim

    @property
    def gdn_in_width(self) -> int:  # a GDN layer's input row: its in-projection's output q|k|v | z | b | a
        return self.conv_dim + self.lin_num_value_heads * self.lin_value_head_dim + 2 * self.lin_num_value_heads

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
        """fp32 recurrent state S of every GDN layer: the article's 'S = 149.6 MB' at 27B."""
        nv, dk, dv = self.lin_num_value_heads, self.lin_key_head_dim, self.lin_value_head_dim
        return len(self.gdn_layers) * nv * dk * dv * 4

    @property
    def conv_state_bytes(self) -> int:
        """fp32 conv history ('hist') of every GDN layer: the last K-1 inputs of C channels."""
        return len(self.gdn_layers) * self.conv_dim * (self.conv_kernel - 1) * 4

    def kv_bytes_per_token(self, dtype_bytes: int = 4, mtp: bool = False) -> int:
        n = len(self.attn_layers) + (self.mtp_layers if mtp else 0)
        return n * 2 * self.num_kv_heads * self.head_dim * dtype_bytes

    # ---- checks ---------------------------------------------------------------------
    def _error(self, field_name: str, value, msg: str) -> ConfigError:
        key = HF_KEYS.get(field_name, field_name)
        where = field_name if key == field_name else f"{field_name} ({key})"
        return ConfigError(f"config {self.name!r}: {where}={value!r} {msg}")

    def validate(self):
        """Types, ranges and the relations between fields. Raises ConfigError naming the field."""
        for f, (lo, hi) in _INT_RANGES.items():
            v = getattr(self, f)
            if not (is_int(v) and lo <= v <= hi):
                raise ConfigError(f"config {self.name!r}: " + _int_error(
                    f if HF_KEYS[f] == f else f"{f} ({HF_KEYS[f]})", v, lo, hi))
        for f in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, f)
            if not is_f32_positive(v):
                raise self._error(f, v, _F32_RANGE)
        prf = self.partial_rotary_factor
        if not (is_float_value(prf) and 0 < prf <= 1):
            raise self._error("partial_rotary_factor", prf, "must be a number in (0, 1]")
        if not isinstance(self.tie_word_embeddings, bool):
            raise self._error("tie_word_embeddings", self.tie_word_embeddings, "must be a bool")
        if len(self.layer_types) != self.num_layers:
            raise self._error("layer_types", list(self.layer_types),
                              f"has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = [t for t in self.layer_types if not isinstance(t, str) or t not in LAYER_TYPES]
        if bad:
            raise self._error("layer_types", list(self.layer_types),
                              f"has unknown layer type(s) {bad[:3]}; known: {list(LAYER_TYPES)}")
        if self.num_heads % self.num_kv_heads:
            raise self._error("num_heads", self.num_heads, f"is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.lin_num_value_heads % self.lin_num_key_heads:
            raise self._error("lin_num_value_heads", self.lin_num_value_heads,
                              f"is not a multiple of lin_num_key_heads={self.lin_num_key_heads}")
        rot = self.rot_dim
        if rot % 2 or not 0 < rot <= self.head_dim:
            raise self._error("partial_rotary_factor", prf, f"gives rotary dim int(head_dim * factor) = {rot} "
                              f"with head_dim={self.head_dim}; it must be even and > 0")

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
    if not (is_int(interval) and interval >= 1):
        raise ConfigError(f"full_attention_interval must be an int >= 1, got {interval!r}")
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n))


_F32_RANGE = (f"must be a finite number > 0 that a float holds exactly and that float32 (the model's "
              f"precision) holds as a normal number, in [{_F32_TINY:.3g}, {_F32_MAX:.3g}]")
# rope_parameters keys kestrel understands. mrope_section/mrope_interleaved split the rotary
# channels between (time, height, width) positions; for text all three positions are the
# token index, so M-RoPE computes exactly the 1-D RoPE kestrel runs.
_ROPE_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
_DEFAULT_ROPE_THETA = 10000.0   # what transformers assumes when a config names none
_DEFAULT_HEAD_DIM = 256         # transformers' Qwen3.5 default


def from_hf(cfg: dict, name: str = "hf") -> Config:
    """Parse a Qwen3.5 config.json (flat text config, or nested under `text_config`).

    Every failure is a ConfigError naming the key and its value."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config must be a JSON object, got {type(cfg).__name__}")
    top, where = cfg, ""
    if "text_config" in cfg:
        if not isinstance(cfg["text_config"], dict):
            raise ConfigError(f"config key text_config={cfg['text_config']!r} must be a JSON object")
        top_type = cfg.get("model_type")
        if top_type is not None and not _same(top_type, "qwen3_5"):
            raise ConfigError(f"config key model_type={top_type!r} is not a Qwen3.5 model (qwen3_5 with a text_config)")
        cfg, where = cfg["text_config"], "text_config."

    def fail(key, msg):
        return ConfigError(f"config key {where}{key}={cfg[key]!r} {msg}")

    read = [k for k in HF_KEYS.values() if "." not in k] + ["full_attention_interval", "model_type", "text_config",
                                                             "rope_parameters", "rope_theta", "partial_rotary_factor"]
    for d, prefix in ((top, ""), (cfg, where)) if cfg is not top else ((cfg, ""),):
        refuse_unsupported(d, prefix, read)
    mt = cfg.get("model_type", top.get("model_type"))
    if mt is not None and not (isinstance(mt, str) and mt in _MODEL_TYPES):
        raise ConfigError(f"config key {where}model_type={mt!r} is not a Qwen3.5 dense text model "
                          f"({' / '.join(_MODEL_TYPES)})")

    def integer(key, default=None, lo=1, hi=MAX_SIZE):
        if key not in cfg:
            if default is None:
                raise ConfigError(f"config lacks required key {where}{key!r}")
            return default
        v = cfg[key]
        if not (is_int(v) and lo <= v <= hi):
            raise ConfigError(f"config key {where}" + _int_error(key, v, lo, hi))
        return int(v)

    def positive_real(d, key, default, label=None):
        if key not in d:
            return default
        v = d[key]
        if not is_f32_positive(v):
            raise ConfigError(f"config key {label or where + key}={v!r} {_F32_RANGE}")
        return float(v)

    def agree(key, inner):
        """A key given both inside rope_parameters and at the top level must say the same. (Not
        partial_rotary_factor: transformers writes its class default at the top level beside the
        rope_parameters value it uses.)"""
        if inner is not None and key in cfg and not (is_float_value(cfg[key]) and float(cfg[key]) == inner):
            raise ConfigError(f"config keys {where}{key}={cfg[key]!r} and {where}rope_parameters.{key}={inner!r} "
                              f"contradict each other")

    def flag(d, key, default, label):
        if key not in d:
            return default
        v = d[key]
        if not isinstance(v, bool):
            raise ConfigError(f"config key {label}={v!r} must be a JSON boolean (true or false)")
        return v

    n_layers = integer("num_hidden_layers", hi=MAX_LAYERS)
    interval = integer("full_attention_interval", 4)  # checked even when layer_types makes it unused
    lt = cfg.get("layer_types")
    if lt is None:
        layer_types = default_layer_types(n_layers, interval)
    else:
        if not isinstance(lt, list):
            raise fail("layer_types", "must be a list of layer type names")
        bad = [t for t in lt if not (isinstance(t, str) and t in LAYER_TYPES)]
        if bad:
            raise fail("layer_types", f"has unknown layer type(s) {bad[:3]}; known: {list(LAYER_TYPES)}")
        if len(lt) != n_layers:
            raise fail("layer_types", f"has {len(lt)} entries for num_hidden_layers={n_layers}")
        layer_types = tuple(lt)

    rope = cfg.get("rope_parameters")
    if rope is None:
        rope = {}
    elif not isinstance(rope, dict):
        raise fail("rope_parameters", "must be a JSON object")
    unknown = sorted(set(rope) - set(_ROPE_KEYS))
    if unknown:
        raise ConfigError(f"config key {where}rope_parameters.{unknown[0]}={rope[unknown[0]]!r} is not supported "
                          f"(kestrel understands rope_parameters keys {list(_ROPE_KEYS)})")
    for k in ("rope_type", "type"):
        if k in rope and not (isinstance(rope[k], str) and rope[k] in ("default", "mrope")):
            raise ConfigError(f"config key {where}rope_parameters.{k}={rope[k]!r} is not supported "
                              f"(only default 1-D RoPE, or M-RoPE on text)")
    rope_theta = positive_real(rope, "rope_theta", None, f"{where}rope_parameters.rope_theta")
    top_theta = positive_real(cfg, "rope_theta", _DEFAULT_ROPE_THETA)
    agree("rope_theta", rope_theta)
    if rope_theta is None:
        rope_theta = top_theta
    if "partial_rotary_factor" in rope:
        prf_key, prf = f"{where}rope_parameters.partial_rotary_factor", rope["partial_rotary_factor"]
    else:
        prf_key, prf = f"{where}partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)
    if not (is_float_value(prf) and 0 < prf <= 1):
        raise ConfigError(f"config key {prf_key}={prf!r} must be a number in (0, 1]")

    tie = flag(cfg, "tie_word_embeddings", None, f"{where}tie_word_embeddings")
    if top is not cfg:  # the multimodal wrapper's own flag governs its lm_head
        tie_top = flag(top, "tie_word_embeddings", None, "tie_word_embeddings")
        if tie is not None and tie_top is not None and tie != tie_top:
            raise ConfigError(f"config keys tie_word_embeddings={tie_top!r} and text_config.tie_word_embeddings="
                              f"{tie!r} disagree")
        tie = tie if tie is not None else tie_top
    tie = bool(tie)

    hidden = integer("hidden_size")
    nh = integer("num_attention_heads")
    nkv = integer("num_key_value_heads")
    head_dim = integer("head_dim", _DEFAULT_HEAD_DIM)
    nk, nv = integer("linear_num_key_heads"), integer("linear_num_value_heads")
    if nh % nkv:
        raise fail("num_attention_heads", f"is not a multiple of num_key_value_heads={nkv}")
    if nv % nk:
        raise fail("linear_num_value_heads", f"is not a multiple of linear_num_key_heads={nk}")
    rot = int(head_dim * prf)
    if rot % 2 or rot <= 0:
        raise ConfigError(f"config key {prf_key}={prf!r} gives rotary dim int(head_dim * factor) = {rot} "
                          f"with head_dim={head_dim}; it must be even and > 0")
    eps = positive_real(cfg, "rms_norm_eps", 1e-6)
    return Config(
        vocab_size=integer("vocab_size"),
        hidden_size=hidden,
        num_layers=n_layers,
        num_heads=nh,
        num_kv_heads=nkv,
        head_dim=head_dim,
        intermediate_size=integer("intermediate_size"),
        lin_num_key_heads=nk,
        lin_num_value_heads=nv,
        lin_key_head_dim=integer("linear_key_head_dim"),
        lin_value_head_dim=integer("linear_value_head_dim"),
        conv_kernel=integer("linear_conv_kernel_dim", 4, lo=2),
        layer_types=layer_types,
        rms_norm_eps=eps,
        rope_theta=rope_theta,
        partial_rotary_factor=float(prf),
        tie_word_embeddings=tie,
        mtp_layers=integer("mtp_num_hidden_layers", 0, lo=0, hi=1),
        max_position_embeddings=integer("max_position_embeddings", 32768),
        name=name,
    )


def load_config(path) -> Config:
    """Config from a model directory (its config.json) or from a config file's path.

    The file must be a regular file inside its directory (see kestrel.confined)."""
    p = Path(path)
    if p.is_dir():
        root, fname, label = model_root(p), "config.json", p.name
    else:
        root, fname, label = model_root(p.parent), p.name, p.parent.name
    raw = read_member(root, fname, "config", CONFIG_MAX_BYTES)
    d = parse_json(raw, str(root / fname), error=ConfigError)
    return from_hf(d, name=label or root.name)


# ---- named presets ------------------------------------------------------------------
def _qwen(name, H, L, nh, nkv, inter, nk, nv, tie):
    return Config(vocab_size=248320, hidden_size=H, num_layers=L, num_heads=nh, num_kv_heads=nkv, head_dim=256,
                  intermediate_size=inter, lin_num_key_heads=nk, lin_num_value_heads=nv, lin_key_head_dim=128,
                  lin_value_head_dim=128, conv_kernel=4, layer_types=default_layer_types(L, 4), rms_norm_eps=1e-6,
                  rope_theta=1e7, partial_rotary_factor=0.25, tie_word_embeddings=tie, mtp_layers=1,
                  max_position_embeddings=262144, name=name)


PRESETS: dict[str, Config] = {
    # Reference shapes of the Qwen3.5 family (weights are random; generated on the device).
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


class UnknownPresetError(ConfigError, KeyError):
    """A preset name kestrel does not know (also a KeyError, as a failed lookup always was)."""
    __str__ = BaseException.__str__   # KeyError's own __str__ would quote the message


def preset(name: str) -> Config:
    if isinstance(name, str) and name in PRESETS:
        return PRESETS[name]
    raise UnknownPresetError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
