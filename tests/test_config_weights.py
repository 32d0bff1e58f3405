"""Config parsing, presets and their state sizes, safetensors round trips."""
import json
import re

import numpy as np
import pytest

import kestrel
from kestrel.config import ConfigError, from_hf
from kestrel.program import expected_shapes
from kestrel.weights import (CheckpointError, bf16_to_f32, f32_to_bf16, load_dir, random_weights, read_safetensors,
                             save_dir, write_safetensors)
from kestrel.program import param_count


def test_interval_rule_and_explicit_layer_types():
    base = kestrel.PRESETS["test-a"].to_hf()
    base.pop("layer_types")
    base["num_hidden_layers"] = 8
    assert from_hf(base).layer_types == ("linear_attention",) * 3 + ("full_attention",) + ("linear_attention",) * 3 + ("full_attention",)
    base["full_attention_interval"] = 2
    assert from_hf(base).attn_layers == (1, 3, 5, 7)
    base["layer_types"] = ["full_attention"] + ["linear_attention"] * 7
    assert from_hf(base).attn_layers == (0,)


def test_nested_text_config_and_rope_parameters():
    text = kestrel.PRESETS["test-b"].to_hf()
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 12345.0, "partial_rotary_factor": 0.5,
                               "mrope_section": [11, 11, 10]}
    cfg = from_hf({"model_type": "qwen3_5", "text_config": text, "vision_config": {}})
    assert cfg.rope_theta == 12345.0 and cfg.rot_dim == 16 and cfg.layer_types == kestrel.PRESETS["test-b"].layer_types


@pytest.mark.parametrize("key,val", [("attention_bias", True), ("hidden_act", "gelu"), ("model_type", "llama"),
                                     ("num_experts", 8), ("mtp_num_hidden_layers", 2),
                                     ("layer_types", ["linear_attention", "sliding_attention", "x", "y"]),
                                     ("layer_types", ["linear_attention"])])
def test_config_keys_of_consequence_are_refused(key, val):
    d = kestrel.PRESETS["test-a"].to_hf()
    d[key] = val
    with pytest.raises(ConfigError, match=key.split("_")[0] if key != "layer_types" else "layer"):
        from_hf(d)


def test_missing_required_key_is_named():
    d = kestrel.PRESETS["test-a"].to_hf()
    del d["linear_num_value_heads"]
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        from_hf(d)


def test_reference_presets_state_sizes():
    c27 = kestrel.preset("qwen3.5-27b")
    assert len(c27.gdn_layers) == 48 and len(c27.attn_layers) == 16
    assert c27.gdn_state_bytes == 48 * 48 * 128 * 128 * 4
    # the article's "S = 149.6 MB": S plus the conv history, in MiB
    assert round((c27.gdn_state_bytes + c27.conv_state_bytes) / 2 ** 20, 1) == 149.6
    for name, params in [("qwen3.5-0.8b", 0.75e9), ("qwen3.5-4b", 4.2e9), ("qwen3.5-9b", 8.9e9), ("qwen3.5-27b", 26.9e9)]:
        n = param_count(kestrel.preset(name), mtp=False)
        assert abs(n - params) / params < 0.12, (name, n)


def test_bf16_round_trip(rng):
    x = rng.standard_normal(1000).astype(np.float32)
    b = bf16_to_f32(f32_to_bf16(x))
    assert np.max(np.abs(b - x) / np.abs(x)) <= 2 ** -8
    assert np.array_equal(bf16_to_f32(f32_to_bf16(b)), b)  # bf16 values are fixed points


@pytest.mark.parametrize("bf16", [False, True])
def test_save_load_round_trip(tmp_path, bf16):
    cfg = kestrel.preset("test-b")
    w = random_weights(cfg, seed=3)
    save_dir(tmp_path, cfg, w, bf16=bf16)
    cfg2, w2 = load_dir(tmp_path)
    assert cfg2.to_hf() == cfg.to_hf()
    for n in w:
        want = bf16_to_f32(f32_to_bf16(w[n])) if bf16 else w[n]
        assert np.array_equal(w2[n], want), n


def test_sharded_checkpoint_with_index(tmp_path):
    cfg = kestrel.preset("test-a")
    w = random_weights(cfg, seed=4)
    save_dir(tmp_path / "one", cfg, w)
    full = read_safetensors(tmp_path / "one" / "model.safetensors")
    names = sorted(full)
    d = tmp_path / "sharded"
    d.mkdir()
    (d / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate([names[:half], names[half:]]):
        fn = f"model-{i + 1:05d}-of-00002.safetensors"
        write_safetensors(d / fn, {n: full[n] for n in part})
        weight_map.update({n: fn for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _, w2 = load_dir(d)
    assert all(np.array_equal(w2[n], w[n]) for n in w)


def test_language_model_prefix(tmp_path):
    """The multimodal wrapper's keys (model.language_model.*) load too; vision keys are ignored."""
    cfg = kestrel.preset("test-a")
    w = random_weights(cfg, seed=5)
    t = {("mtp." + n[4:] if n.startswith("mtp.") else "model.language_model." + n): a for n, a in w.items()}
    t["model.visual.blocks.0.attn.qkv.weight"] = np.ones((2, 2), np.float32)
    write_safetensors(tmp_path / "model.safetensors", t)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": cfg.to_hf()}))
    _, w2 = load_dir(tmp_path)
    assert set(w2) == set(w)


def test_expected_shapes_cover_every_tensor():
    cfg = kestrel.preset("test-b")
    shapes = expected_shapes(cfg)
    assert "lm_head.weight" in shapes and "mtp.fc.weight" in shapes
    assert shapes["layers.0.linear_attn.in_proj_qkv.weight"] == (cfg.conv_dim, cfg.hidden_size)
    assert "lm_head.weight" not in expected_shapes(kestrel.preset("test-a"))  # tied


# ---- values the math uses are checked in float32; contradictions and unknown switches refused -------
def _tiny_hf() -> dict:
    return json.loads(open(kestrel.ASSETS / "tiny" / "config.json").read())


@pytest.mark.parametrize("key,value", [("rms_norm_eps", 1e39), ("rms_norm_eps", 1e-50), ("rms_norm_eps", 0),
                                       ("rope_theta", 1e39), ("rope_theta", 0), ("rope_theta", 1e-45)])
def test_float_fields_must_hold_in_float32(key, value):
    """1e39 is finite in float64 and infinite in float32; 1e-50 is 0 there: refused by name."""
    d = _tiny_hf()
    if key == "rope_theta":
        d["rope_parameters"][key] = value
    else:
        d[key] = value
    with pytest.raises(ConfigError, match=f"{key}={re.escape(repr(value))}.*float32"):
        from_hf(d)
    with pytest.raises(ConfigError, match=f"{key}.*float32"):
        kestrel.preset("test-a").replace(**{key: value})


def test_rope_theta_at_the_top_contradicting_rope_parameters():
    d = _tiny_hf()
    d["rope_theta"] = d["rope_parameters"]["rope_theta"]           # the same value twice: fine
    assert from_hf(d).rope_theta == 1e7
    d["rope_theta"] = 1e4
    with pytest.raises(ConfigError, match="rope_theta=10000.0 and rope_parameters.rope_theta=.*contradict"):
        from_hf(d)
    d["rope_theta"] = 0
    with pytest.raises(ConfigError, match="rope_theta=0"):
        from_hf(d)
    d = _tiny_hf()
    d["partial_rotary_factor"] = 0.5       # transformers writes its default here; rope_parameters' value is used
    assert from_hf(d).partial_rotary_factor == 0.25


@pytest.mark.parametrize("key,value", [("use_qk_norm", False), ("qk_layernorm", False), ("use_fancy_attention", True),
                                       ("enable_something", 1), ("my_new_flag", True), ("o_proj_bias", True),
                                       ("attention_bias", True)])
def test_unknown_switches_are_refused_by_name(key, value):
    for nested in (False, True):
        d = _tiny_hf()
        d[key] = value
        if nested:
            d = {"model_type": "qwen3_5", "text_config": d}
        with pytest.raises(ConfigError, match=key):
            from_hf(d)


def test_harmless_keys_of_real_configs_still_load():
    d = _tiny_hf()
    d.update(use_cache=False, output_attentions=False, return_dict=True, use_qk_norm=True, attention_dropout=0.0,
             initializer_range=0.02, bos_token_id=None, eos_token_id=248044, dtype="bfloat16")
    wrapped = {"model_type": "qwen3_5", "text_config": d, "vision_config": {"depth": 2}, "image_token_id": 248056,
               "tie_word_embeddings": True, "architectures": ["Qwen3_5ForConditionalGeneration"]}
    assert from_hf(d) == from_hf(wrapped) == from_hf(_tiny_hf())
