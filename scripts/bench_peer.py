#!/usr/bin/env python3
"""kestrel beside a peer, same device, same weights, same run: results/bench_peer.json + .md.

    python3 scripts/bench_peer.py --out results                 # on a GPU that holds the 27B shape
    python3 scripts/bench_peer.py --preset test-a --quick       # CPU: the handover and the loop only

The peer is Hugging Face transformers' Qwen3.5 (Qwen3_5ForCausalLM) in bf16, running the
flash-linear-attention kernels for the Gated DeltaNet layers when that package is installed
(transformers picks them up by itself; its causal conv falls back to PyTorch without the
causal-conv1d package). Its weights are kestrel's own: the model is built on PyTorch's meta
device and every parameter is then *the same device memory* as kestrel's tensor of that name
(DLPack, no copy) for the bf16 projections, or a bf16 copy of kestrel's float32 norm, gate and
decay vectors. kestrel's tensor names are the checkpoint's names without "model.", in the same
layout, so the handover is by name.

Timed the same way for both (CUDA events around T decode steps after the prompt, the argmax
read back to the host every step as a chat loop does):
  kestrel       greedy_timed (the default engine, CUDA-graph plans)
  peer eager    transformers' default dynamic cache, no compilation
  peer static   a StaticCache, the forward under torch.compile(mode="reduce-overhead")
                (compilation plus CUDA graphs); if that setting fails, the error is recorded
Before timing, both models' logits for the prompt are compared (bf16 weights, different
accumulation orders: close, not equal) and the greedy streams' common prefix is reported, so
a handover that mapped a tensor wrongly shows at once.

SGLang's published figure for Qwen3.5-27B bf16 on one H200 with MTP is quoted in the table as a
labelled reference line (not measured here).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kestrel  # noqa: E402
from kestrel import speculative as spec  # noqa: E402
from kestrel.lab import results  # noqa: E402

SGLANG_REFERENCE = ("SGLang, Qwen3.5-27B bf16, one H200, MTP (3 steps, 4 draft tokens), random-token prompts: "
                    "5.89 ms per output token (its published benchmark; quoted, not measured here)")


def peer_model(model, torch, dtype=None):
    """transformers' Qwen3_5ForCausalLM holding kestrel `model`'s weights (bf16 projections shared
    through DLPack on a GPU; copies on the CPU). dtype: the peer's dtype (default bf16 on a GPU,
    float32 on the CPU)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    gpu = model.be.name != "cpu"
    dtype = dtype or (torch.bfloat16 if gpu else torch.float32)
    dev = torch.device("cuda" if gpu else "cpu")
    hf_cfg = Qwen3_5TextConfig(**{k: v for k, v in model.cfg.to_hf().items() if k not in ("architectures",)})
    hf_cfg.dtype = dtype
    with torch.device("meta"):
        peer = Qwen3_5ForCausalLM(hf_cfg)
    state, missing = {}, []
    for name, p in peer.named_parameters():
        w = model.w.get(kestrel.weights.canonical_name(name))
        if w is None:
            missing.append(name)
            continue
        state[name] = _as_torch(w, torch, dev, dtype, p.shape)
    if missing:
        raise RuntimeError(f"kestrel has no tensor for the peer's {missing[:5]}")
    peer.load_state_dict(state, strict=False, assign=True)
    if hf_cfg.tie_word_embeddings:
        peer.tie_weights()
    # buffers made on the meta device (the rotary frequencies) are built again on the device
    rot = peer.model.rotary_emb
    peer.model.rotary_emb = type(rot)(config=hf_cfg)
    for n, b in peer.named_buffers():
        if b.is_meta:
            raise RuntimeError(f"the peer's buffer {n} was left on the meta device")
    return peer.to(dev).eval()


def _as_torch(w, torch, dev, dtype, shape):
    if isinstance(w, np.ndarray):
        if w.dtype == np.uint16:     # bf16 bits
            t = torch.from_numpy(w.astype(np.uint32) << 16).view(torch.float32)
        else:
            t = torch.from_numpy(np.ascontiguousarray(w))
        return t.to(dev, dtype).reshape(shape)
    t = torch.from_dlpack(w)          # CuPy: the same memory
    if t.dtype == torch.uint16 or str(t.dtype) == "torch.uint16":
        t = t.view(torch.bfloat16)
    if t.dtype != dtype:
        t = t.to(dtype)
    return t.reshape(shape)


def peer_decode(peer, torch, prompt, T: int, cache=None, forward=None) -> tuple:
    """Greedy decoding of T tokens with the peer, the argmax read to the host every step.
    Returns (stream, decode_ms, prompt_logits)."""
    dev = next(peer.parameters()).device
    forward = forward or peer
    ids = torch.tensor([prompt], device=dev)
    gpu = dev.type == "cuda"
    with torch.no_grad():
        kw = {"past_key_values": cache} if cache is not None else {}
        pos = torch.arange(len(prompt), device=dev)
        out = peer(ids, use_cache=True, cache_position=pos, **kw)
        cache = out.past_key_values
        lg = out.logits[0, -1]
        first_logits = out.logits[0].float().cpu().numpy()
        e0 = _mark(torch, gpu)
        stream = []
        for i in range(T):
            t = int(torch.argmax(lg))
            stream.append(t)
            p = len(prompt) + i
            out = forward(torch.tensor([[t]], device=dev), past_key_values=cache, use_cache=True,
                          cache_position=torch.tensor([p], device=dev))
            lg = out.logits[0, -1]
        e1 = _mark(torch, gpu)
    return stream, _elapsed(torch, gpu, e0, e1), first_logits


def _mark(torch, gpu):
    if gpu:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e
    return time.perf_counter()


def _elapsed(torch, gpu, a, b) -> float:
    if gpu:
        b.synchronize()
        return a.elapsed_time(b)
    return (b - a) * 1e3


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def spec_cases() -> list:
    """(name, k, Schedule) of kestrel's speculative rows: the replay drafter forcing the article's
    E16 profile, 2.8 tokens a round (the cycled n_ok sequence), and a flat profile whose mean
    advance is 3.39 at k = 4 (SGLang's acceptance length for Qwen3.5 at 3 draft tokens)."""
    from kestrel.lab import sweep
    return [("E16 profile", 3, spec.Schedule(profile=spec.E16_PROFILE, pairing="trained")),
            ("2.8 tokens a round", 4, spec.Schedule(seq=list(sweep.SEQ_2P8), pairing="trained")),
            ("3.39 tokens a round", 4, spec.Schedule(profile=(sweep.ALPHA_3P39,) * 3, pairing="trained"))]


def render(d: dict) -> str:
    L = ["# kestrel beside transformers' Qwen3.5 (same weights, same device, same run)", "",
         f"- device: {d['device']}", f"- date: {d['date']}", f"- command: `{d['command']}`",
         f"- commit: {d.get('commit')}", f"- model: {d['model']} (random {d['dtype']} weights, seed {d['seed']}), "
         f"prompt {d['prompt_len']} tokens, T = {d['T']} decoded, {d['repeats']} repeats (median)",
         f"- peer: transformers {d['versions'].get('transformers')}, torch {d['versions'].get('torch')}, "
         f"flash-linear-attention {d['versions'].get('fla')}, causal-conv1d {d['versions'].get('causal_conv1d')}",
         (f"- handover check: prompt logits max |kestrel - peer| {d['check']['max_abs_logit_diff']:.4g} "
          f"(logit scale {d['check']['logit_std']:.3g}); greedy streams agree on the first "
          f"{d['check']['common_prefix']} of {d['T']} tokens; peer top-1 = kestrel top-1 at "
          f"{d['check']['top1_agree']:.0%} of prompt positions" if d.get("check")
          else "- handover check: not reached (the run ended before the peer was built)"), "",
         "`vs kestrel greedy`: kestrel greedy's ms/token ÷ the row's (above 1: faster than kestrel greedy). "
         "`peer's fastest ÷ row`: the peer's fastest greedy setting's ms/token ÷ the row's (how many times "
         "faster than the peer the row decodes).", "",
         "| decoder | setting | ms/token | vs kestrel greedy | peer's fastest ÷ row | bit-exact |",
         "|---|---|---|---|---|---|"]
    k = d["rows"][0]["ms_per_token"]
    best = (d.get("peer_best") or {}).get("ms_per_token")
    for r in d["rows"]:
        if r.get("error"):
            L.append(f"| {r['decoder']} | {r['setting']} | did not run: {r['error']} | | | |")
            continue
        vs_peer = f"{best / r['ms_per_token']:.2f}x" if best else ""
        L.append(f"| {r['decoder']} | {r['setting']} | {r['ms_per_token']:.3f} | {k / r['ms_per_token']:.2f}x | "
                 f"{vs_peer} | {r.get('bit_exact', '')} |")
    L += ["", f"Reference (not measured here): {SGLANG_REFERENCE}.", ""]
    if d.get("notes"):
        L += [f"- {n}" for n in d["notes"]]
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument("--preset", default="qwen3.5-27b")
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="CPU run of the handover and the loops (T = 8)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile setting")
    ap.add_argument("--no-spec", action="store_true", help="skip kestrel's speculative rows")
    a = ap.parse_args(argv)
    import torch
    T, repeats = (8, 1) if a.quick else (a.T, a.repeats)
    device = "cpu" if a.quick else "cuda"
    # tiled_only=False: the peer is handed the projections' rows, which the default engine drops once
    # tiled (the two copies fit an H200 at the 27B shape)
    model = kestrel.load(a.preset, device=device, dtype="bf16" if device == "cuda" else "fp32", seed=a.seed,
                         kernels={"tiled_only": False} if device == "cuda" else None)
    prompt = [int(t) for t in np.random.default_rng(a.seed).integers(0, model.cfg.vocab_size, 32)]
    print(f"{a.preset} on {model.be.device_name}")

    eng = kestrel.Engine(model, max_seq=len(prompt) + T + 8, mmax=1, batch="flex")
    spec.greedy_timed(model, prompt, min(T, 8), engine=eng)                  # warm-up: plans captured
    k_stream, _, _ = spec.greedy_timed(model, prompt, T, engine=eng)
    k_ms = [spec.greedy_timed(model, prompt, T, engine=eng)[1] / T for _ in range(repeats)]
    eng.reset()
    k_logits = kestrel.to_numpy(eng.prefill(prompt).logits)
    rows = [{"decoder": "kestrel", "setting": "greedy, default engine (CUDA graphs)" if device == "cuda"
             else "greedy, CPU", "ms_per_token": statistics.median(k_ms)}]
    del eng
    print(f"  kestrel {rows[0]['ms_per_token']:.3f} ms/token")
    notes, check = [], {}
    versions = {"torch": torch.__version__}
    for mod in ("transformers", "fla", "causal_conv1d"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = "not installed"

    def save():
        """Write what is measured so far (each stage saves: a run cut short keeps its rows)."""
        ok = [r for r in rows if r["decoder"] != "kestrel" and "ms_per_token" in r]
        best = min(ok, key=lambda r: r["ms_per_token"]) if ok else None
        prov = results.Provenance(model.be.device_name, _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                  results.recorded_command("scripts/bench_peer.py", argv if argv is not None else sys.argv[1:], {}),
                                  results.measured_commit(), results.backend_kernels(model.be))
        d = {"model": model.cfg.name, "dtype": model.weight_dtype, "seed": a.seed, "prompt_len": len(prompt), "T": T,
             "repeats": repeats, "versions": versions, "check": check, "rows": rows, "notes": notes,
             "peer_best": best and {"setting": best["setting"], "ms_per_token": best["ms_per_token"],
                                    "kestrel_speedup": best["ms_per_token"] / rows[0]["ms_per_token"]}}
        return results.write(a.out, "bench_peer_quick" if a.quick else "bench_peer", d, render, prov)

    # kestrel's speculative rows first: they are quick, and a peer setting cut short must not cost them
    if not a.no_spec:
        for name, k, sched in spec_cases():
            eng = kestrel.Engine(model, max_seq=len(prompt) + T + 8 + k, mmax=k, batch="flex")
            runs = [spec.run_spec(model, prompt, T, k=k, policy="checkpoint", drafter="replay", schedule=sched,
                                  reference=k_stream, greedy=False, engine=eng) for _ in range(repeats + 1)][1:]
            rows.append({"decoder": "kestrel", "setting": f"speculative: checkpoint, trained pairing, k = {k}, {name}",
                         "ms_per_token": statistics.median(r.spec_ms / T for r in runs),
                         "bit_exact": all(r.bit_exact for r in runs),
                         "tokens_per_round": statistics.median((T - r.tail_tokens) / max(1, len(r.rounds)) for r in runs)})
            print(f"  kestrel {rows[-1]['setting']}: {rows[-1]['ms_per_token']:.3f} ms/token, "
                  f"bit-exact {rows[-1]['bit_exact']}")
            del eng
            save()
    peer = peer_model(model, torch)
    p_stream, _, p_logits = peer_decode(peer, torch, prompt, T)
    diff = np.abs(p_logits.astype(np.float64) - k_logits)
    check.update({"max_abs_logit_diff": float(diff.max()), "logit_std": float(k_logits.std()),
                  "common_prefix": common_prefix(k_stream, p_stream),
                  "top1_agree": float(np.mean(p_logits.argmax(-1) == k_logits.argmax(-1)))})
    print(f"  handover check {check}")
    ms = [peer_decode(peer, torch, prompt, T)[1] / T for _ in range(repeats)]
    rows.append({"decoder": "transformers", "setting": "eager, dynamic cache", "ms_per_token": statistics.median(ms)})
    print(f"  peer eager {rows[-1]['ms_per_token']:.3f} ms/token")
    save()
    if not a.no_compile:
        row = {"decoder": "transformers", "setting": "StaticCache + torch.compile(mode='reduce-overhead')"}
        try:
            from transformers import StaticCache
            fwd = torch.compile(peer.forward, mode="reduce-overhead", fullgraph=False)
            def cache():
                return StaticCache(config=peer.config, max_cache_len=len(prompt) + T + 8)
            t0 = time.perf_counter()
            peer_decode(peer, torch, prompt, min(T, 8), cache=cache(), forward=fwd)   # compile, capture
            peer_decode(peer, torch, prompt, T, cache=cache(), forward=fwd)
            notes.append(f"torch.compile warm-up took {time.perf_counter() - t0:.0f} s")
            s_stream, _, _ = peer_decode(peer, torch, prompt, T, cache=cache(), forward=fwd)
            notes.append(f"the compiled peer's stream equals its eager stream: {s_stream == p_stream}")
            row["ms_per_token"] = statistics.median(
                [peer_decode(peer, torch, prompt, T, cache=cache(), forward=fwd)[1] / T for _ in range(repeats)])
            print(f"  peer static+compile {row['ms_per_token']:.3f} ms/token")
        except Exception as e:          # recorded: which setting did not work, and why
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            notes.append("static cache + torch.compile failed: " + traceback.format_exc().splitlines()[-1][:300])
            print(f"  peer static+compile failed: {row['error']}")
        rows.append(row)
        save()
    path = save()
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
