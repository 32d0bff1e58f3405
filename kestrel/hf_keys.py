"""config.json keys kestrel does not read: refused when they would change the computation.

A Qwen3.5 config.json carries many keys kestrel has no use for (token ids, dtype, generation
defaults). Those that change the numbers are refused by name rather than ignored: the keys
listed in UNSUPPORTED unless they hold a value meaning "not used", and every other key that
looks like a switch (a boolean value, or a name such as use_*) unless it is one of
transformers' generic flags that change nothing kestrel computes.
"""
from __future__ import annotations

import re

from .errors import ConfigError

# Keys that change the computation but that kestrel does not implement: each maps to the
# values that mean "not used" (the first is what kestrel implements). Compared by type and
# value, so 0 does not pass for False nor 1 for True.
UNSUPPORTED = {
    "attention_bias": (False, None),
    "mlp_bias": (False, None),
    "hidden_act": ("silu", None),
    "num_experts": (None, 0),
    "mlp_only_layers": (None, []),
    "rope_scaling": (None, {}),          # transformers lets a non-empty rope_scaling override rope_parameters
    "use_sliding_window": (False, None),
    "attn_output_gate": (True, None),    # kestrel's attention is always output-gated
    "mtp_use_dedicated_embeddings": (False, None),
    "quantization_config": (None,),
    "dual_chunk_attention_config": (None,),
    "final_logit_softcapping": (None,),
    "attn_logit_softcapping": (None,),
    "use_qk_norm": (True, None),         # kestrel's attention always norms q and k
    "qk_layernorm": (True, None),
}
# Boolean keys of transformers' generic config that change no number kestrel computes.
HARMLESS_FLAGS = frozenset((
    "use_cache", "return_dict", "output_hidden_states", "output_attentions", "torchscript", "is_encoder_decoder",
    "is_decoder", "add_cross_attention", "tie_encoder_decoder", "output_router_logits", "use_bfloat16",
    "_attn_implementation_autoset", "return_dict_in_generate", "do_sample", "early_stopping",
    "remove_invalid_values", "tf_legacy_loss",
))
SWITCH_NAME = re.compile(r"(use|enable|apply|with|do|has|is)_.*|.*_(enabled|bias)")


def same(a, b) -> bool:
    """Equal in type and value: 0 does not pass for False nor 1 for True."""
    return type(a) is type(b) and a == b


def refuse_unsupported(d: dict, prefix: str, read):
    """ConfigError naming the first key of `d` (a config object; its keys shown after `prefix`)
    that would change the computation; `read`: the keys kestrel reads itself."""
    for key, ok in UNSUPPORTED.items():
        if key in d and not any(same(d[key], o) for o in ok):
            raise ConfigError(f"config key {prefix}{key}={d[key]!r:.60} is not supported "
                              f"(kestrel implements {key}={ok[0]!r})")
    for key, v in d.items():
        if key in UNSUPPORTED or key in HARMLESS_FLAGS or key in read:
            continue
        if isinstance(v, bool) or (isinstance(key, str) and SWITCH_NAME.fullmatch(key)):
            raise ConfigError(f"config key {prefix}{key}={v!r:.60} is a switch kestrel does not know; it may "
                              f"change the computation, so it is refused rather than ignored")
