"""The Qwen3.5 hybrid model as one declarative program, written once.

A program is a short list of ops over named activation buffers, named weights and explicit
state. Both backends run the same program: the CPU backend executes it op by op through the
NumPy twins in kestrel/ops; the CUDA backend lowers it into a fixed launch plan replayed as a
CUDA graph. The checkpoint layout (`expected_shapes`), the stacked projections and the
parameter count are all read off the program: nothing about the layer structure is written
a second time.

Main model, M rows at positions pos..pos+M-1:

    x = embed(tokens)
    for each layer:  x += mixer(input_layernorm(x));  x += mlp(post_attention_layernorm(x))
    hidden = norm(x);  logits = lm_head(hidden)      (lm_head tied to embed_tokens if configured)
    mixer = Gated DeltaNet (state S, hist: a ring of slots)  or  gated attention (KV cache)

MTP head, M rows at positions q.., tokens x, main-model hiddens h:

    u = fc([pre_fc_norm_embedding(embed(x)) | pre_fc_norm_hidden(h)]);  u = attention layer(u)
    hidden' = mtp.norm(u);  logits = lm_head(hidden')

MTP fill: the MTP head's ops up to and including its attention, so rows of its KV cache are
written exactly as the head would write them, and nothing after (no MLP, no norm, no lm_head).

Op kinds (each one family in kestrel/ops and one kernel file in kernels/):

    embed      dst = table[tokens]                                       ops/head.py
    rmsnorm    dst[:, col:col+n] = zero-centred RMSNorm(src) * (1 + w)    ops/norm.py
    linear     dst (=, +=) src · [W_1; W_2; ...]ᵀ, or SwiGLU over [gate; up]  ops/linear.py, ops/mlp.py
    gdn        dst = GatedDeltaNet(src = [qkv | z | b | a]) over state ("gdn", g)   ops/gdn.py
    attention  dst = gated attention(src = [q·gate | k | v]) over state ("kv", a) or ("mtp_kv", 0)
                                                                          ops/attention.py, ops/rope.py

A linear with several weights is a *stacked projection*: the CUDA backend stores the weights
as one matrix and streams it in one launch; the CPU backend multiplies each weight on its own
(the rows' bits are the same either way: each output element sums over K in one fixed order).
The epilogue "add" is the residual connection; "swiglu" takes [gate; up] and writes
silu(gate) * up.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .config import Config

EPILOGUES = ("store", "add", "swiglu")
# What a GDN op does with the recurrent state of its rows (the number is what kernels/gdn.cu reads):
#   in_place    update the live slot (plain steps)
#   checkpoint  row j's state into slot live+1+j, the live slot only read (policy "checkpoint")
#   cache       the live slot only read, nothing written; the rows' inputs (the in-projection's
#               output) stay in DeviceState.gdn_in, and the fold program later runs the first
#               n of them in place (policy "input-cache")
GDN_MODES = {"in_place": 0, "checkpoint": 1, "cache": 2}


@dataclass(frozen=True)
class Weight:
    name: str          # canonical checkpoint name, without the 'model.' prefix
    shape: tuple


@dataclass(frozen=True)
class Op:
    kind: str                   # embed | rmsnorm | linear | gdn | attention
    src: str                    # input buffer ("tokens" for embed)
    dst: str                    # output buffer
    weights: tuple = ()         # Weight, ...
    epilogue: str = "store"     # linear only: store | add | swiglu
    state: tuple | None = None  # ("gdn", g) | ("kv", a) | ("mtp_kv", 0)
    col: int = 0                # rmsnorm: first column of dst written (a concatenation)
    stack: str = ""             # linear with several weights: the stacked matrix's name

    @property
    def rows(self) -> int:
        """Output rows of a linear's (stacked) matrix."""
        return sum(w.shape[0] for w in self.weights)


@dataclass(frozen=True)
class Program:
    name: str                   # "main" | "mtp" | "mtp_fill" | "fold"
    buffers: tuple              # (name, width) of every activation buffer
    ops: tuple
    inputs: tuple               # "tokens", and "hid" for the MTP head
    hidden: str | None = "hidden"   # None: the program returns no hidden rows (mtp_fill, fold)
    logits: str | None = "logits"

    def width(self, buf: str) -> int:
        return dict(self.buffers)[buf]

    def weights(self):
        for op in self.ops:
            yield from op.weights


def _decoder_layer(cfg: Config, p: str, kind: str, state: tuple) -> list:
    """x += mixer(input_layernorm(x)); x += mlp(post_attention_layernorm(x))."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    ops = [Op("rmsnorm", "x", "xn", (Weight(f"{p}.input_layernorm.weight", (H,)),))]
    if kind == "linear_attention":
        a = f"{p}.linear_attn"
        nv, dv, C, K = cfg.lin_num_value_heads, cfg.lin_value_head_dim, cfg.conv_dim, cfg.conv_kernel
        ops += [
            Op("linear", "xn", "gin", (Weight(f"{a}.in_proj_qkv.weight", (C, H)), Weight(f"{a}.in_proj_z.weight", (nv * dv, H)),
                                       Weight(f"{a}.in_proj_b.weight", (nv, H)), Weight(f"{a}.in_proj_a.weight", (nv, H))),
               stack=f"{a}.in"),
            Op("gdn", "gin", "gy", (Weight(f"{a}.conv1d.weight", (C, 1, K)), Weight(f"{a}.A_log", (nv,)),
                                    Weight(f"{a}.dt_bias", (nv,)), Weight(f"{a}.norm.weight", (dv,))), state=state),
            Op("linear", "gy", "x", (Weight(f"{a}.out_proj.weight", (H, nv * dv)),), epilogue="add"),
        ]
    else:
        a = f"{p}.self_attn"
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        ops += [
            Op("linear", "xn", "ain", (Weight(f"{a}.q_proj.weight", (nh * hd * 2, H)), Weight(f"{a}.k_proj.weight", (nkv * hd, H)),
                                       Weight(f"{a}.v_proj.weight", (nkv * hd, H))), stack=f"{a}.qkv"),
            Op("attention", "ain", "ao", (Weight(f"{a}.q_norm.weight", (hd,)), Weight(f"{a}.k_norm.weight", (hd,))), state=state),
            Op("linear", "ao", "x", (Weight(f"{a}.o_proj.weight", (H, nh * hd)),), epilogue="add"),
        ]
    ops += [
        Op("rmsnorm", "x", "xn", (Weight(f"{p}.post_attention_layernorm.weight", (H,)),)),
        Op("linear", "xn", "act", (Weight(f"{p}.mlp.gate_proj.weight", (I, H)), Weight(f"{p}.mlp.up_proj.weight", (I, H))),
           epilogue="swiglu", stack=f"{p}.mlp.gate_up"),
        Op("linear", "act", "x", (Weight(f"{p}.mlp.down_proj.weight", (H, I)),), epilogue="add"),
    ]
    return ops


def _buffers(cfg: Config, extra=()) -> tuple:
    H, V = cfg.hidden_size, cfg.vocab_size
    nv, dv, nh, nkv, hd = (cfg.lin_num_value_heads, cfg.lin_value_head_dim, cfg.num_heads, cfg.num_kv_heads,
                           cfg.head_dim)
    b = [("x", H), ("xn", H), ("act", cfg.intermediate_size), ("hidden", H), ("logits", V)]
    if cfg.gdn_layers:
        b += [("gin", cfg.gdn_in_width), ("gy", nv * dv)]
    b += [("ain", nh * hd * 2 + 2 * nkv * hd), ("ao", nh * hd)]
    return tuple(b) + tuple(extra)


def _head(cfg: Config) -> Weight:
    H, V = cfg.hidden_size, cfg.vocab_size
    return Weight("embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight", (V, H))


@lru_cache(maxsize=64)
def main_program(cfg: Config) -> Program:
    H, V = cfg.hidden_size, cfg.vocab_size
    ops = [Op("embed", "tokens", "x", (Weight("embed_tokens.weight", (V, H)),))]
    g = a = 0
    for i, kind in enumerate(cfg.layer_types):
        if kind == "linear_attention":
            ops += _decoder_layer(cfg, f"layers.{i}", kind, ("gdn", g))
            g += 1
        else:
            ops += _decoder_layer(cfg, f"layers.{i}", kind, ("kv", a))
            a += 1
    ops += [Op("rmsnorm", "x", "hidden", (Weight("norm.weight", (H,)),)),
            Op("linear", "hidden", "logits", (_head(cfg),))]
    return Program("main", _buffers(cfg), tuple(ops), ("tokens",))


@lru_cache(maxsize=64)
def mtp_program(cfg: Config) -> Program | None:
    if not cfg.mtp_layers:
        return None
    H, V = cfg.hidden_size, cfg.vocab_size
    ops = [Op("embed", "tokens", "e", (Weight("embed_tokens.weight", (V, H)),)),
           Op("rmsnorm", "e", "cat", (Weight("mtp.pre_fc_norm_embedding.weight", (H,)),), col=0),
           Op("rmsnorm", "hid", "cat", (Weight("mtp.pre_fc_norm_hidden.weight", (H,)),), col=H),
           Op("linear", "cat", "x", (Weight("mtp.fc.weight", (H, 2 * H)),))]
    ops += _decoder_layer(cfg, "mtp.layers.0", "full_attention", ("mtp_kv", 0))
    ops += [Op("rmsnorm", "x", "hidden", (Weight("mtp.norm.weight", (H,)),)),
            Op("linear", "hidden", "logits", (_head(cfg),))]
    return Program("mtp", _buffers(cfg, (("hid", H), ("e", H), ("cat", 2 * H))), tuple(ops), ("tokens", "hid"))


@lru_cache(maxsize=64)
def mtp_fill_program(cfg: Config) -> Program | None:
    """The MTP program cut after its attention op: it writes the head's K/V rows (the only state
    the head has) with the very ops, in the very order, of a full MTP pass, so the rows hold the
    same bits, and skips the o_proj, the MLP, the norm and the lm_head, which at the 27B shape
    are most of an MTP step's weight bytes. The drafters keep the MTP slot with it where nobody
    reads the head's logits: the prompt's rows, and the trained pairing's rewrite when no draft
    chain follows to carry it (k = 1, the negative control).
    The attention's output is still computed and dropped: one small launch, where a KV-only op
    would be a new op kind on both backends."""
    mtp = mtp_program(cfg)
    if mtp is None:
        return None
    last = max(i for i, op in enumerate(mtp.ops) if op.kind == "attention")
    ops = mtp.ops[:last + 1]
    used = {b for op in ops for b in (op.src, op.dst)}       # no act, hidden or logits rows to allocate
    return Program("mtp_fill", tuple(b for b in mtp.buffers if b[0] in used), ops, mtp.inputs, hidden=None, logits=None)


@lru_cache(maxsize=64)
def fold_program(cfg: Config) -> Program:
    """The main program's GDN ops alone, each reading its layer's cached inputs ("gdn_in", g)
    and updating the live state in place: n rows of it leave S and hist exactly as n plain
    steps would (the same ops in the same order on the same inputs)."""
    ops = tuple(Op("gdn", f"gdn_in.{op.state[1]}", "gy", op.weights, state=op.state)
                for op in main_program(cfg).ops if op.kind == "gdn")
    width = dict(main_program(cfg).buffers).get("gin", 0)
    bufs = tuple((f"gdn_in.{g}", width) for g in range(len(ops))) + (("gy", cfg.lin_num_value_heads * cfg.lin_value_head_dim),)
    return Program("fold", bufs, ops, (), hidden=None, logits=None)


def programs(cfg: Config) -> tuple:
    return tuple(p for p in (main_program(cfg), mtp_program(cfg)) if p is not None)


def expected_shapes(cfg: Config) -> dict:
    """Canonical tensor names (no 'model.' prefix) -> shape: every weight the programs read."""
    shapes = {}
    for prog in programs(cfg):
        for w in prog.weights():
            shapes.setdefault(w.name, w.shape)
    return shapes


def stacks(cfg: Config) -> list:
    """(stacked matrix name, [weight names]) of every stacked projection, in program order."""
    out, seen = [], set()
    for prog in programs(cfg):
        for op in prog.ops:
            if op.stack and op.stack not in seen:
                seen.add(op.stack)
                out.append((op.stack, [w.name for w in op.weights]))
    return out


def param_count(cfg: Config, mtp: bool = True) -> int:
    n = 0
    for name, shape in expected_shapes(cfg).items():
        if mtp or not name.startswith("mtp."):
            p = 1
            for s in shape:
                p *= s
            n += p
    return n
