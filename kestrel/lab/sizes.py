"""State and weight sizes of a config, derived from its shapes (chapter 1's tables), and how
often one decode step runs each projection (chapter 10's sums of the projection benchmark).

The point they make: a GDN layer's state is a fixed [nv, dk, dv] matrix per layer, whatever
the sequence length, updated in place; attention's KV cache grows by a row per token and is
"rolled back" by moving a cursor. What mark/rollback must copy is the former.
"""
from __future__ import annotations

from kestrel.config import PRESETS, Config
from kestrel.program import param_count

MiB = 2 ** 20


def state_sizes(cfg: Config, seq_len: int = 4096) -> dict:
    """Bytes of every piece of per-sequence state, fp32 state, bf16 projection weights."""
    c = cfg
    n_gdn, n_attn = len(c.gdn_layers), len(c.attn_layers)
    return {
        "model": c.name,
        "layers": c.num_layers,
        "gdn_layers": n_gdn,
        "attn_layers": n_attn,
        "gdn_S_bytes": c.gdn_state_bytes,                          # copied by mark and by rollback
        "gdn_hist_bytes": c.conv_state_bytes,                      # the conv window, copied too
        "snapshot_bytes": c.gdn_state_bytes + c.conv_state_bytes,  # one mark (or one rollback)
        "kv_bytes_per_token": c.kv_bytes_per_token(4),
        "kv_bytes_at_seq": c.kv_bytes_per_token(4) * seq_len,
        "mtp_kv_bytes_per_token": c.kv_bytes_per_token(4, mtp=True) - c.kv_bytes_per_token(4),
        "seq_len": seq_len,
        "params": param_count(c, mtp=False),
        "weight_bytes_bf16": 2 * param_count(c, mtp=False),
    }


def sizes_table(configs=None, seq_len: int = 4096) -> list:
    """state_sizes for each config (default: the tiny model if given plus the reference presets)."""
    if configs is None:
        configs = [PRESETS[n] for n in ("qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b")]
    return [state_sizes(c, seq_len) for c in configs]


# The projection shapes of one decode step, as dev/bench_projections.py labels them.
PROJECTIONS = ("gdn in_proj [qkv|z|b|a]", "attn [q|k|v]", "mlp [gate|up] + SwiGLU", "mlp down",
               "out_proj / o_proj", "lm_head")


def projection_uses(cfg: Config) -> dict:
    """How many times one decode step runs each projection: in_proj in every GDN layer, q|k|v in
    every attention layer, the MLP and the output projection in every layer, the head once."""
    g, a = len(cfg.gdn_layers), len(cfg.attn_layers)
    return dict(zip(PROJECTIONS, (g, a, g + a, g + a, g + a, 1)))


def projection_step_ms(shapes, kernel: str, cfg: Config | None = None) -> dict:
    """M -> ms of all the projections of one decode step with `kernel` ("fma", "tensor", "tmb",
    "cublas"), from the ProjectionShape records of a bench_projections file
    (kestrel.lab.results.load_projections(...).shapes): each shape's time × its uses (NaN where a
    shape lacks that kernel)."""
    uses = projection_uses(cfg or PRESETS["qwen3.5-27b"])
    Ms = sorted({M for s in shapes for M in s.us})
    return {M: sum(uses[s.shape] * s.us.get(M, {}).get(kernel, float("nan")) for s in shapes) / 1e3 for M in Ms}
