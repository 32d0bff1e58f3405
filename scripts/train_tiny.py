#!/usr/bin/env python3
"""Train `kestrel-tiny`: a byte-level Qwen3.5 dense text model (hybrid Gated DeltaNet +
gated attention) with its one-layer MTP draft head, on the CPython standard library.

The main model is transformers' own `Qwen3_5ForCausalLM`, so the checkpoint is
Hugging Face format by construction; the MTP head (`mtp.*`) is built from transformers'
`Qwen3_5RMSNorm` and `Qwen3_5DecoderLayer` exactly as Qwen3.5 / vLLM lay it out:

    u  = mtp.fc(cat[mtp.pre_fc_norm_embedding(embed(t_{i+1})), mtp.pre_fc_norm_hidden(h_i)])
    u  = mtp.layers.0(u)          # causal attention over MTP rows 0..i, RoPE position i
    h' = mtp.norm(u);  logits = lm_head(h')      # trained to predict t_{i+2}

h_i is the main model's last hidden state after `model.norm`. Loss = CE_main + lam * CE_mtp.

Training stops by wall clock, then saves (checkpoint shards <= 16 MB each, resumable with
--resume), evaluates on held-out files (bits per byte, MTP hit rates, the chained MTP's
teacher-forced acceptance on greedy streams, "E16"), and writes greedy completions of the
six starts (kestrel/assets/tiny/starts.json).

    # on a GPU (what produced kestrel/assets/tiny, on one H200):
    python3 scripts/train_tiny.py --out OUTDIR --minutes 7.5
    # resume from a checkpoint folder (the files an earlier run wrote):
    python3 scripts/train_tiny.py --out OUTDIR --resume path/to/previous/out --minutes 5
    # CPU smoke test:
    python3 scripts/train_tiny.py --out _build/tiny-smoke --device cpu --batch 2 --seq 64 --max-steps 3 --small-eval
    # turn a training_record.json into TRAINING.md (+ samples.txt):
    python3 scripts/train_tiny.py --render kestrel/assets/tiny
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time

ASSET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kestrel", "assets", "tiny")
LN2 = math.log(2.0)


# ----------------------------------------------------------------------------- config
def tiny_config_dict() -> dict:
    return dict(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=8,
        layer_types=["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, rms_norm_eps=1e-6, hidden_act="silu",
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        tie_word_embeddings=True, max_position_embeddings=2048, attention_bias=False, attention_dropout=0.0,
        initializer_range=0.02, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def build_config():
    from transformers import Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(**tiny_config_dict())
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


# ----------------------------------------------------------------------------- model
def build(cfg, device):
    import torch
    from torch import nn
    from transformers import Qwen3_5ForCausalLM
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

    class MTPHead(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            H = cfg.hidden_size
            mcfg = copy.deepcopy(cfg)
            mcfg.num_hidden_layers = 1
            mcfg.layer_types = ["full_attention"]
            self.fc = nn.Linear(2 * H, H, bias=False)
            self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
            self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)
            self.layers = nn.ModuleList([Qwen3_5DecoderLayer(mcfg, 0)])
            self.norm = Qwen3_5RMSNorm(H, eps=cfg.rms_norm_eps)

        def forward(self, emb, hid, position_embeddings, attention_mask=None):
            """emb = embed(x) rows, hid = h rows, both [B, R, H] -> h' [B, R, H] (after mtp.norm)."""
            u = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hid)], dim=-1))
            u = self.layers[0](u, position_embeddings=position_embeddings, attention_mask=attention_mask)
            return self.norm(u)

    lm = Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="sdpa")
    mtp = MTPHead(cfg)
    mtp.layers[0].self_attn.config._attn_implementation = "sdpa"
    for m in mtp.modules():  # transformers' own init (normal(0, 0.02) linears, zeros for zero-centred norms)
        lm._init_weights(m)
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr(), "lm_head must be tied"
    return lm.to(device), mtp.to(device)


def rope(lm, x, pos):
    """cos/sin for 1-D positions pos [L] (Qwen3.5's text mrope with equal sections == 1-D RoPE)."""
    B = x.shape[0]
    p = pos.view(1, 1, -1).expand(3, B, -1)
    return lm.model.rotary_emb(x, p)


def main_forward(lm, ids):
    h = lm.model(input_ids=ids, use_cache=False).last_hidden_state  # after model.norm
    return h, lm.lm_head(h)


def export_state(lm, mtp) -> dict:
    """Tensors under the names Qwen3_5ForCausalLM.save_pretrained writes (tied lm_head omitted) + mtp.*"""
    out = {k: v for k, v in lm.state_dict().items() if k != "lm_head.weight"}
    out.update({"mtp." + k: v for k, v in mtp.state_dict().items()})
    return out


def named_params(lm, mtp):
    """(export name, parameter) for every trainable parameter, each once (tied lm_head is embed_tokens)."""
    seen, out = set(), []
    for prefix, mod in (("", lm), ("mtp.", mtp)):
        for k, p in mod.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            out.append((prefix + k, p))
    return out


def load_export_state(lm, mtp, tensors: dict):
    import torch
    params = dict(named_params(lm, mtp))
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    if missing or extra:
        raise KeyError(f"checkpoint mismatch: missing {missing[:5]} extra {extra[:5]}")
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(tensors[k].to(p.dtype))


# ----------------------------------------------------------------------------- data
def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


def load_corpus(root: str, held_mod: int = 50):
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
        for f in filenames:
            if f.endswith(".py"):
                files.append(os.path.relpath(os.path.join(dirpath, f), root))
    files.sort()
    train, held = [], []
    ntr = nhe = 0
    for rel in files:
        with open(os.path.join(root, rel), "rb") as fh:
            data = fh.read()
        if not data:
            continue
        is_held = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % held_mod == 0
        (held if is_held else train).append(data + b"\n")
        if is_held:
            nhe += 1
        else:
            ntr += 1
    tr, he = b"".join(train), b"".join(held)
    info = dict(stdlib=root, python=platform.python_version(), files_total=len(files),
                files_train=ntr, files_heldout=nhe, bytes_train=len(tr), bytes_heldout=len(he),
                split=f"file-level: held out iff int(sha256(relative path)[:8], 16) % {held_mod} == 0",
                joiner="files concatenated in sorted relative-path order, each followed by one b'\\n'",
                file_list_sha256=hashlib.sha256("\n".join(files).encode()).hexdigest())
    return tr, he, info


# ----------------------------------------------------------------------------- losses
def joint_loss(lm, mtp, ids):
    import torch
    import torch.nn.functional as F
    B, T = ids.shape
    h, logits = main_forward(lm, ids)
    V = logits.shape[-1]
    ce_main = F.cross_entropy(logits[:, :-1].float().reshape(-1, V), ids[:, 1:].reshape(-1))
    emb = lm.model.embed_tokens(ids[:, 1:])              # x = t_{i+1}, rows i = 0..T-2
    pos = torch.arange(T - 1, device=ids.device)
    hp = mtp(emb, h[:, :-1], rope(lm, emb, pos))
    lg = lm.lm_head(hp[:, :-1])                           # rows 0..T-3 have targets t_{i+2}
    ce_mtp = F.cross_entropy(lg.float().reshape(-1, V), ids[:, 2:].reshape(-1))
    return ce_main, ce_mtp


# ----------------------------------------------------------------------------- eval
def heldout_eval(lm, mtp, held, T, max_windows, device, bs=64):
    import torch
    import torch.nn.functional as F
    data = torch.frombuffer(bytearray(held), dtype=torch.uint8)
    n = min(max_windows, len(data) // T)
    wins = data[: n * T].view(n, T).long()
    s = dict(main_nll=0.0, main_n=0, main_hit=0, mtp_nll=0.0, mtp_n=0, mtp_hit=0, mtp_hit_main=0,
             article_hit=0, article_n=0)
    with torch.no_grad():
        for a in range(0, n, bs):
            ids = wins[a:a + bs].to(device)
            h, logits = main_forward(lm, ids)
            V = logits.shape[-1]
            lf = logits[:, :-1].float()
            s["main_nll"] += F.cross_entropy(lf.reshape(-1, V), ids[:, 1:].reshape(-1), reduction="sum").item()
            s["main_n"] += lf.shape[0] * lf.shape[1]
            s["main_hit"] += (lf.argmax(-1) == ids[:, 1:]).sum().item()
            pos = torch.arange(T - 1, device=device)
            emb = lm.model.embed_tokens(ids[:, 1:])
            hp = mtp(emb, h[:, :-1], rope(lm, emb, pos))
            lg = lm.lm_head(hp[:, :-1]).float()
            s["mtp_nll"] += F.cross_entropy(lg.reshape(-1, V), ids[:, 2:].reshape(-1), reduction="sum").item()
            s["mtp_n"] += lg.shape[0] * lg.shape[1]
            am = lg.argmax(-1)
            s["mtp_hit"] += (am == ids[:, 2:]).sum().item()
            # vs the main model's own prediction of t_{i+2} (what speculative acceptance compares against)
            s["mtp_hit_main"] += (am == logits[:, 1:-1].float().argmax(-1)).sum().item()
            # the article pairing (x = t_i, h = h_i) asked for t_{i+1}: not what the head was trained for
            pos2 = torch.arange(T, device=device)
            e2 = lm.model.embed_tokens(ids)
            hs = mtp(e2, h, rope(lm, e2, pos2))
            ls = lm.lm_head(hs[:, :-1]).float()
            s["article_hit"] += (ls.argmax(-1) == ids[:, 1:]).sum().item()
            s["article_n"] += ls.shape[0] * ls.shape[1]
    return dict(windows=n, window_bytes=T, bytes_scored_main=s["main_n"],
                main_bpb=s["main_nll"] / s["main_n"] / LN2, main_top1=s["main_hit"] / s["main_n"],
                mtp_bpb=s["mtp_nll"] / s["mtp_n"] / LN2, mtp_hit_text=s["mtp_hit"] / s["mtp_n"],
                mtp_hit_vs_main_argmax=s["mtp_hit_main"] / s["mtp_n"],
                article_pairing_hit_text=s["article_hit"] / s["article_n"])


def greedy_nocache(lm, prompts, n_new):
    """Batched greedy decoding by full recomputation (no cache): prompts [B, P] -> [B, P + n_new]."""
    import torch
    ids = prompts
    with torch.no_grad():
        for _ in range(n_new):
            _, logits = main_forward(lm, ids)
            ids = torch.cat([ids, logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
    return ids


def chain_predictions(lm, mtp, S, depth=3):
    """Batched chained MTP drafts on streams S [B, L]. Returns (logits_main, preds) where preds[j-1][b, i] is
    the token the MTP predicts at chain depth j for anchor i (the main model has consumed 0..i):
    depth 1 is the row at position i with (x = S[i+1], h = h_i) -> d_2; depth j > 1 is the row at position
    i+j-1 with (x = d_j, h = the depth j-1 output) -> d_{j+1}. Each draft row attends to the verified MTP rows
    0..i (pairs (S[r+1], h_r)) and to its own chain's earlier rows, exactly as the engine's MTP slot does in a
    round of the `mtp` drafter. All depths run as one sequence of the MTP layer with a block mask."""
    import torch
    dev = S.device
    B, L = S.shape
    h, logits = main_forward(lm, S)
    R = L - 1                                    # verified rows 0..L-2: (S[r+1], h_r)
    base_pos = torch.arange(R, device=dev)
    embs, hids, poss = [lm.model.embed_tokens(S[:, 1:])], [h[:, :-1]], [base_pos]
    NEG = torch.finfo(torch.float32).min
    r = torch.arange(R, device=dev)
    causal = torch.where(r[None, :] <= r[:, None], 0.0, NEG)
    same = torch.where(r[None, :] == r[:, None], 0.0, NEG)
    preds, out_prev = [], None
    for j in range(1, depth + 1):
        if j > 1:
            embs.append(lm.model.embed_tokens(preds[-1]))   # d_j for anchor i sits at index i
            hids.append(out_prev)
            poss.append(base_pos + (j - 1))
        n = len(embs)
        M = torch.full((n * R, n * R), NEG, device=dev)
        for a in range(n):
            M[a * R:(a + 1) * R, 0:R] = causal          # verified rows 0..i
            for b in range(1, a + 1):
                M[a * R:(a + 1) * R, b * R:(b + 1) * R] = same   # this anchor's earlier chain rows
        emb, hid, pos = torch.cat(embs, 1), torch.cat(hids, 1), torch.cat(poss, 0)
        out = mtp(emb, hid, rope(lm, emb, pos), attention_mask=M[None, None].to(emb.dtype))
        out_prev = out[:, (n - 1) * R:]
        preds.append(lm.lm_head(out_prev).float().argmax(-1))
    return logits, preds


def chained_acceptance(lm, mtp, S, P, depth=3):
    """Teacher-forced acceptance (E16) of the `mtp` drafter on greedy streams S [B, L] from prompts of length
    P: anchors i = P-1 .. L-2-depth; depth j hits iff preds[j-1][b, i] == S[b, i+j+1]."""
    import torch
    B, L = S.shape
    with torch.no_grad():
        logits, preds = chain_predictions(lm, mtp, S, depth)
        greedy_ok = (logits[:, P - 1:-1].float().argmax(-1) == S[:, P:]).float().mean().item()
        lo, hi = P - 1, L - 1 - depth
        hits = [pr[:, lo:hi] == S[:, lo + j + 1: hi + j + 1] for j, pr in enumerate(preds, start=1)]
        n_anchor = hits[0].numel()
        allok = torch.ones_like(hits[0])
        uncond, cond, cum = [], [], []
        for hj in hits:
            uncond.append(hj.float().mean().item())
            prev = allok.sum().item()
            allok = allok & hj
            cond.append(allok.sum().item() / max(prev, 1))
            cum.append(allok.float().mean().item())
    p = [1.0] + cum                               # d_1 is free: p_1 = 1 on a greedy stream
    e_len = {f"k={k}": sum(p[:k]) for k in range(1, depth + 2)}
    return dict(anchors=n_anchor, streams=B, greedy_consistency=greedy_ok,
                mtp_depth_hit_unconditional=uncond, alpha_conditional=cond, p_cumulative=cum,
                expected_n_ok_mtp_drafter=e_len,
                note="drafter 'mtp': d_1 = argmax main (always accepted on a greedy stream), d_2..d_4 from MTP "
                     "chain depths 1..3; alpha_j = P(depth j hit | depths < j hit); p_j = P(depths 1..j all hit); "
                     "E[n_ok] for k drafts = 1 + p_1 + ... + p_(k-1)")


def generate_starts(lm, starts, n_new, device):
    import torch
    out = []
    with torch.no_grad():
        for s in starts:
            ids = torch.tensor([list(s.encode())], device=device)
            g = lm.generate(ids, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                            eos_token_id=None, pad_token_id=0, use_cache=True)
            ref = greedy_nocache(lm, ids, n_new)
            cont = g[0, ids.shape[1]:].tolist()
            out.append(dict(start=s, completion=bytes(cont).decode("utf-8", errors="replace"),
                            completion_bytes=cont, hf_generate_equals_nocache_argmax=bool(torch.equal(g, ref))))
    return out


# ----------------------------------------------------------------------------- checkpoint
def save_all(out, lm, mtp, opt, state, cfg):
    """model.safetensors (bf16, the shipped weights) + ckpt_resid (fp32 master - bf16, as bf16) +
    ckpt_opt_m / ckpt_opt_v (Adam moments, bf16) + ckpt_state.json: every file well under 16 MB."""
    import torch
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    st = export_state(lm, mtp)
    ship = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in st.items()}
    save_file(ship, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    resid = {k: (v.detach().float().cpu() - ship[k].float()).to(torch.bfloat16).contiguous() for k, v in st.items()}
    save_file(resid, os.path.join(out, "ckpt_resid.safetensors"))
    if opt is not None:
        m, v = {}, {}
        for name, p in named_params(lm, mtp):
            s = opt.state.get(p, {})
            if "exp_avg" in s:
                m[name] = s["exp_avg"].detach().to(torch.bfloat16).cpu().contiguous()
                v[name] = s["exp_avg_sq"].detach().to(torch.bfloat16).cpu().contiguous()
        save_file(m, os.path.join(out, "ckpt_opt_m.safetensors"))
        save_file(v, os.path.join(out, "ckpt_opt_v.safetensors"))
    with open(os.path.join(out, "ckpt_state.json"), "w") as f:
        json.dump(state, f, indent=1)
    d = cfg.to_dict()
    d["architectures"] = ["Qwen3_5ForCausalLM"]
    d["dtype"] = "bfloat16"
    for k in ("transformers_version", "_name_or_path", "id2label", "label2id", "chunk_size_feed_forward",
              "problem_type", "output_attentions", "output_hidden_states", "return_dict", "is_encoder_decoder"):
        d.pop(k, None)
    d["transformers_version"] = __import__("transformers").__version__
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
        f.write("\n")


def load_ckpt(src, lm, mtp, opt, device):
    import torch
    from safetensors.torch import load_file
    ship = load_file(os.path.join(src, "model.safetensors"))
    rp = os.path.join(src, "ckpt_resid.safetensors")
    resid = load_file(rp) if os.path.exists(rp) else {}
    full = {k: v.float() + (resid[k].float() if k in resid else 0) for k, v in ship.items()}
    load_export_state(lm, mtp, full)
    state = {}
    sp = os.path.join(src, "ckpt_state.json")
    if os.path.exists(sp):
        with open(sp) as f:
            state = json.load(f)
    mp, vp = os.path.join(src, "ckpt_opt_m.safetensors"), os.path.join(src, "ckpt_opt_v.safetensors")
    if opt is not None and os.path.exists(mp) and os.path.exists(vp):
        m, v = load_file(mp), load_file(vp)
        step = float(state.get("step", 0))
        for name, p in named_params(lm, mtp):
            if name in m:
                opt.state[p] = {"step": torch.tensor(step, dtype=torch.float32),
                                "exp_avg": m[name].to(device=device, dtype=p.dtype),
                                "exp_avg_sq": v[name].to(device=device, dtype=p.dtype)}
    return state


# ----------------------------------------------------------------------------- render
def render(asset_dir):
    with open(os.path.join(asset_dir, "training_record.json")) as f:
        R = json.load(f)
    d, t, ev = R["data"], R["training"], R.get("heldout", {})
    L = []
    w = L.append
    w("# kestrel-tiny: how it was trained\n")
    w("Generated from `training_record.json` by `python3 scripts/train_tiny.py --render kestrel/assets/tiny`.\n")
    w("## Model\n")
    a = R["architecture"]
    w(f"Qwen3.5 dense text architecture (transformers `Qwen3_5ForCausalLM`, `model_type: qwen3_5_text`) "
      f"with one MTP layer. Byte-level: token id == byte value (vocab 256), no special tokens.\n")
    w(f"- hidden {a['hidden_size']}, {a['num_hidden_layers']} layers: `{'`, `'.join(a['layer_types'])}`")
    w(f"- attention: {a['num_attention_heads']} query heads / {a['num_key_value_heads']} KV heads, head_dim {a['head_dim']}, "
      f"partial RoPE factor {a['rope_parameters']['partial_rotary_factor']}, theta {a['rope_parameters']['rope_theta']:g}")
    w(f"- GDN: {a['linear_num_key_heads']} key / {a['linear_num_value_heads']} value heads, dk = dv = "
      f"{a['linear_key_head_dim']}, conv kernel {a['linear_conv_kernel_dim']}")
    w(f"- MLP intermediate {a['intermediate_size']}; tied embeddings; MTP: fc [H, 2H] + one full-attention layer")
    w(f"- parameters: {R['params']['total']:,} ({R['params']['main']:,} main + {R['params']['mtp']:,} MTP); "
      f"stored as {R['params']['stored_dtype']} ({R['params']['file_bytes']:,} bytes)\n")
    w("## Data\n")
    w(f"CPython {d['python']} standard library `*.py` sources (`{d['stdlib']}`, the stdlib of the Python that ran the training; "
      f"`site-packages`/`dist-packages` excluded): {d['files_total']} files, {d['files_train']} train "
      f"({d['bytes_train']:,} bytes), {d['files_heldout']} held out ({d['bytes_heldout']:,} bytes). "
      f"Split: {d['split']}. {d['joiner']}.\n")
    w("## Training\n")
    w(f"- device: {t['device_name']}; date {t['date']}; torch {t['torch']}, transformers {t['transformers']}")
    w(f"- command: `{t['command']}`")
    w(f"- steps: {t['steps']}, batch {t['batch']} x {t['seq']} bytes = {t['batch'] * t['seq']:,} tokens/step; "
      f"{t['tokens_seen']:,} tokens seen ({t['tokens_seen'] / max(d['bytes_train'], 1):.1f} passes over the train bytes)")
    w(f"- loss = CE_main + {t['lambda_mtp']} x CE_mtp; AdamW betas {t['betas']}, weight decay {t['weight_decay']} "
      f"(matrices only), grad clip {t['grad_clip']}")
    w(f"- lr: {t['lr_schedule']}")
    w(f"- precision: {t['precision']}")
    w(f"- training wall time {t['train_seconds']:.0f} s ({t['ms_per_step']:.0f} ms/step); runs: {t['runs']}\n")
    w("Train loss (nats/byte, mean over the logging interval):\n")
    w("| step | CE main | CE mtp | lr |")
    w("|---:|---:|---:|---:|")
    curve = t["loss_curve"]
    stride = max(1, len(curve) // 25)
    for row in curve[::stride] + ([curve[-1]] if (len(curve) - 1) % stride else []):
        w(f"| {row['step']} | {row['ce_main']:.4f} | {row['ce_mtp']:.4f} | {row['lr']:.2e} |")
    w("")
    if ev:
        w("## Held-out evaluation (shipped bf16 weights, fp32 compute)\n")
        w(f"- {ev['windows']} windows of {ev['window_bytes']} bytes from held-out files")
        w(f"- main model: **{ev['main_bpb']:.3f} bits/byte**, top-1 next-byte accuracy {ev['main_top1']:.3f}")
        w(f"- MTP head (predicting t_(i+2) from t_(i+1), h_i): {ev['mtp_bpb']:.3f} bits/byte; "
          f"teacher-forced first-step hit rate **{ev['mtp_hit_text']:.3f}** against the text, "
          f"{ev['mtp_hit_vs_main_argmax']:.3f} against the main model's own argmax")
        w(f"- the article pairing (x = t_i, h = h_i, asked for t_(i+1)): hit rate {ev['article_pairing_hit_text']:.3f}\n")
    acc = R.get("chained_acceptance")
    if acc:
        w("## Teacher-forced acceptance of the chained MTP on greedy streams (E16)\n")
        w(f"{acc['streams']} greedy streams (prompts: {R.get('stream_prompts', '')}), {acc['anchors']:,} anchors; "
          f"greedy consistency of the stream {acc['greedy_consistency']:.4f}. {acc['note']}.\n")
        w("| MTP depth | draft | hit (unconditional) | alpha (conditional) | p (cumulative) |")
        w("|---:|---:|---:|---:|---:|")
        for j, (u, c, p) in enumerate(zip(acc["mtp_depth_hit_unconditional"], acc["alpha_conditional"],
                                          acc["p_cumulative"]), start=1):
            w(f"| {j} | d_{j + 1} | {u:.3f} | {c:.3f} | {p:.3f} |")
        w("")
        w("Expected accepted drafts per round, `mtp` drafter: " +
          ", ".join(f"{k}: {v:.2f}" for k, v in acc["expected_n_ok_mtp_drafter"].items()) + "\n")
    if R.get("completions"):
        nb = len(R["completions"][0]["completion_bytes"])
        w(f"## Greedy completions of the six starts ({nb} bytes, transformers `generate`, fp32, "
          f"on {R['training']['device_name']})\n")
        for c in R["completions"]:
            w("```python")
            w(c["start"] + c["completion"])
            w("```")
            w(f"(start: `{json.dumps(c['start'])}`; generate == no-cache argmax loop: "
              f"{c['hf_generate_equals_nocache_argmax']})\n")
    if R.get("notes"):
        w("## Notes\n")
        for n in R["notes"]:
            w(f"- {n}")
        w("")
    if R.get("local_checks"):
        w("## Checks run on the CPU after the run\n")
        for n in R["local_checks"]:
            w(f"- {n}")
        w("")
    with open(os.path.join(asset_dir, "TRAINING.md"), "w") as f:
        f.write("\n".join(L))
    if R.get("completions"):
        with open(os.path.join(asset_dir, "samples.txt"), "w") as f:
            for c in R["completions"]:
                f.write("=== start: " + json.dumps(c["start"]) + "\n" + c["start"] + c["completion"] + "\n")


def _shown(arg: str, args) -> str:
    """An argument as the training record shows it: an output/resume folder outside the
    repository is written as OUTDIR / RESUMEDIR (its path says nothing about the model)."""
    inside = not os.path.isabs(arg) or os.path.abspath(arg).startswith(os.path.abspath(os.getcwd()) + os.sep)
    if not inside and arg == args.out:
        return "OUTDIR"
    if not inside and arg == args.resume:
        return "RESUMEDIR"
    return arg


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="_build/tiny-train", help="output folder (checkpoint, record, logs)")
    ap.add_argument("--resume", default=None, help="folder with model.safetensors + ckpt_* of an earlier run")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--minutes", type=float, default=7.5, help="training wall-clock budget (this run)")
    ap.add_argument("--max-steps", type=int, default=10 ** 9)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--lr-min-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--lam", type=float, default=0.5, help="MTP loss weight")
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdlib", default=None)
    ap.add_argument("--small-eval", action="store_true", help="tiny eval sizes (CPU smoke test)")
    ap.add_argument("--render", default=None, help="only write TRAINING.md from DIR/training_record.json")
    args = ap.parse_args()
    if args.render:
        render(args.render)
        return

    t_start = time.time()
    import torch
    import transformers
    dev = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    torch.manual_seed(args.seed)
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train.log"), "a")

    def log(*a):
        s = " ".join(str(x) for x in a)
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    root = args.stdlib or stdlib_dir()
    train_b, held_b, dinfo = load_corpus(root)
    log("data", json.dumps(dinfo))
    cfg = build_config()
    lm, mtp = build(cfg, dev)
    n_main = sum(p.numel() for p in lm.parameters())
    n_mtp = sum(p.numel() for p in mtp.parameters())
    log(f"params main {n_main:,} mtp {n_mtp:,} total {n_main + n_mtp:,} device {dev}")

    decay, no_decay = [], []
    for name, p in named_params(lm, mtp):
        (decay if p.ndim >= 2 and "embed_tokens" not in name else no_decay).append(p)
    betas = (0.9, 0.95)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=betas, eps=1e-8, fused=(dev == "cuda"))
    state = dict(step=0, train_seconds=0.0, tokens=0, loss_curve=[], runs=[], budget_seconds=0.0)
    if args.resume:
        state.update(load_ckpt(args.resume, lm, mtp, opt, dev))
        log(f"resumed from {args.resume} at step {state['step']}")
    prev_seconds = state["train_seconds"]
    budget_total = prev_seconds + args.minutes * 60.0   # the cosine runs over all runs' budgets together
    state["budget_seconds"] = budget_total

    data = torch.frombuffer(bytearray(train_b), dtype=torch.uint8).to(dev)
    N, T, B = data.numel(), args.seq, args.batch
    ar = torch.arange(T + 1, device=dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed * 1000003 + state["step"])

    def lr_at(step, frac):
        w = min(1.0, (step + 1) / args.warmup)
        c = args.lr_min_frac + (1 - args.lr_min_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        return args.lr * w * c

    lm.train()
    mtp.train()
    params = [p for _, p in named_params(lm, mtp)]
    acc_m = torch.zeros((), device=dev)
    acc_t = torch.zeros((), device=dev)
    acc_n = 0
    t0 = time.time()
    deadline = t0 + args.minutes * 60.0
    step0 = state["step"]
    lr = args.lr
    while state["step"] - step0 < args.max_steps:
        now = time.time()
        if now >= deadline:
            break
        frac = (prev_seconds + now - t0) / budget_total
        lr = lr_at(state["step"], frac)
        for g in opt.param_groups:
            g["lr"] = lr
        off = torch.randint(0, N - T - 1, (B,), device=dev, generator=gen)
        ids = data[off[:, None] + ar[None, :]].long()
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=(dev == "cuda")):
            ce_main, ce_mtp = joint_loss(lm, mtp, ids)
        loss = ce_main + args.lam * ce_mtp
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc_m += ce_main.detach()
        acc_t += ce_mtp.detach()
        acc_n += 1
        state["step"] += 1
        state["tokens"] += B * T
        if state["step"] % args.log_every == 0 or state["step"] == 1:
            row = dict(step=state["step"], ce_main=acc_m.item() / acc_n, ce_mtp=acc_t.item() / acc_n, lr=lr,
                       t=round(prev_seconds + time.time() - t0, 2))
            state["loss_curve"].append(row)
            log(json.dumps(row))
            acc_m.zero_()
            acc_t.zero_()
            acc_n = 0
    if dev == "cuda":
        torch.cuda.synchronize()
    run_seconds = time.time() - t0
    if acc_n:
        row = dict(step=state["step"], ce_main=acc_m.item() / acc_n, ce_mtp=acc_t.item() / acc_n, lr=lr,
                   t=round(prev_seconds + run_seconds, 2))
        state["loss_curve"].append(row)
        log(json.dumps(row))
    state["train_seconds"] = prev_seconds + run_seconds
    state["runs"].append(dict(steps=state["step"] - step0, seconds=round(run_seconds, 1), resumed=bool(args.resume),
                              device=torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu"))
    save_all(args.out, lm, mtp, opt, state, cfg)
    log(f"saved step {state['step']} after {run_seconds:.1f} s of training ({time.time() - t_start:.1f} s total)")
    del opt

    # ---- evaluate the shipped weights: reload the bf16 values into fp32 modules
    from safetensors.torch import load_file
    shipped = load_file(os.path.join(args.out, "model.safetensors"))
    load_export_state(lm, mtp, {k: v.float() for k, v in shipped.items()})
    lm.eval()
    mtp.eval()
    if dev == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    small = args.small_eval
    record = dict(
        name="kestrel-tiny",
        data=dinfo,
        architecture=tiny_config_dict(),
        params=dict(main=n_main, mtp=n_mtp, total=n_main + n_mtp, stored_dtype="bfloat16",
                    file_bytes=os.path.getsize(os.path.join(args.out, "model.safetensors"))),
        training=dict(
            device_name=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
            date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
            command="python3 " + " ".join([os.path.relpath(sys.argv[0])] + [_shown(a, args) for a in sys.argv[1:]]),
            steps=state["step"], batch=B, seq=T, tokens_seen=state["tokens"], lambda_mtp=args.lam,
            betas=list(betas), weight_decay=args.wd, grad_clip=1.0,
            lr_schedule=f"peak {args.lr:g}, linear warmup {args.warmup} steps, cosine over the wall-clock budget "
                        f"({budget_total:.0f} s) down to {args.lr_min_frac:g} x peak",
            precision="bf16 autocast on CUDA, fp32 master weights and Adam state; the GDN torch chunked "
                      "fallback keeps its state and decays in fp32 while autocast runs its matmuls in bf16; "
                      "attention via SDPA" if dev == "cuda" else "fp32 (CPU)",
            gdn_kernel="transformers torch_chunk_gated_delta_rule fallback (flash-linear-attention not installed)",
            train_seconds=state["train_seconds"], ms_per_step=1000 * state["train_seconds"] / max(state["step"], 1),
            runs=state["runs"], loss_curve=state["loss_curve"]),
    )
    rec_path = os.path.join(args.out, "training_record.json")

    def dump():
        with open(rec_path, "w") as f:
            json.dump(record, f, indent=1)

    dump()
    t_ev = time.time()
    try:
        record["heldout"] = heldout_eval(lm, mtp, held_b, T, 8 if small else 4096, dev, bs=4 if small else 64)
        log("heldout", json.dumps(record["heldout"]))
    except Exception as e:  # keep what we have
        log("heldout eval failed:", repr(e))
    dump()
    try:
        starts = json.load(open(os.path.join(ASSET_DIR, "starts.json")))
        record["completions"] = generate_starts(lm, starts, 8 if small else 64, dev)
        for c in record["completions"]:
            log("start", json.dumps(c["start"] + c["completion"]))
    except Exception as e:
        log("generation failed:", repr(e))
    dump()
    try:
        P, n_new, nb = (16, 16, 2) if small else (128, 256, 64)
        held = torch.frombuffer(bytearray(held_b), dtype=torch.uint8)
        stride = max(P, (len(held) - P) // nb)
        prompts = torch.stack([held[i * stride:i * stride + P] for i in range(nb)]).long().to(dev)
        S = greedy_nocache(lm, prompts, n_new)
        record["stream_prompts"] = f"{nb} prompts of {P} bytes taken at even strides from the held-out text, " \
                                   f"{n_new} greedy bytes each (no-cache argmax, fp32)"
        record["chained_acceptance"] = chained_acceptance(lm, mtp, S, P, depth=3)
        log("chained", json.dumps(record["chained_acceptance"]))
    except Exception as e:
        log("chained acceptance failed:", repr(e))
    record["eval_seconds"] = round(time.time() - t_ev, 1)
    record["total_seconds"] = round(time.time() - t_start, 1)
    dump()
    log(f"done in {time.time() - t_start:.1f} s")


if __name__ == "__main__":
    main()
