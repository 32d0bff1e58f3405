"""kestrel (CPU, float32) against transformers' Qwen3.5 on random tiny checkpoints."""
import numpy as np
import pytest

import kestrel
from kestrel.weights import read_safetensors, write_safetensors
from reference64 import Reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

SHAPES = {
    # nk < nv, tied, the interval rule (4)
    "nk<nv-tied-interval4": dict(vocab_size=101, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=32, intermediate_size=96, linear_num_key_heads=2,
                                 linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                                 tie_word_embeddings=True),
    # nk == nv, untied, explicit layer_types, dk != dv, other RoPE fraction/theta
    "nk=nv-untied-layer_types": dict(vocab_size=89, hidden_size=48, num_hidden_layers=5, num_attention_heads=2,
                                     num_key_value_heads=1, head_dim=24, intermediate_size=72, linear_num_key_heads=3,
                                     linear_num_value_heads=3, linear_key_head_dim=8, linear_value_head_dim=12,
                                     tie_word_embeddings=False,
                                     layer_types=["full_attention", "linear_attention", "linear_attention",
                                                  "full_attention", "linear_attention"],
                                     rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}),
    # nk < nv (r = 3), untied, interval 2, conv kernel 3
    "nk<nv-r3-interval2": dict(vocab_size=120, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=4, head_dim=16, intermediate_size=64, linear_num_key_heads=1,
                               linear_num_value_heads=3, linear_key_head_dim=16, linear_value_head_dim=8,
                               linear_conv_kernel_dim=3, tie_word_embeddings=False, full_attention_interval=2),
}


def _hf_model(kw, seed):
    torch.manual_seed(seed)
    kw = dict(kw)
    kw.setdefault("initializer_range", 0.2)  # larger than HF's 0.02 so greedy streams are not degenerate
    kw.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})
    m = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**kw)).eval()
    with torch.no_grad():  # move the norms and gates off their init values so every term is exercised
        for n, p in m.named_parameters():
            if "norm" in n or "dt_bias" in n:
                p.add_(0.2 * torch.randn_like(p))
    return m


@pytest.fixture(scope="module", params=sorted(SHAPES))
def hf_pair(request, tmp_path_factory):
    seed = int(np.random.SeedSequence().entropy % 10**6)
    m = _hf_model(SHAPES[request.param], seed)
    d = tmp_path_factory.mktemp(request.param)
    m.save_pretrained(d)
    return request.param, seed, m, d


def reference_logits(km, toks):
    """The float64 reference's logits for every position of toks."""
    ref = Reference(km.cfg, km.w)
    return np.stack([ref.step(int(t))[1] for t in toks])


def test_teacher_forced_logits(hf_pair, rng):
    """kestrel and transformers compute the same function. Both are float32 programs whose
    rounding grows with the random checkpoint's conditioning, so each is measured against the
    float64 reference (tests/reference64.py: the math written out in loops, sharing no op with
    kestrel; it reads the config and weights as kestrel loaded them, so a loading bug would be
    shared, and the transformers bound catches it). Over 150 random checkpoints per shape kestrel
    stayed within 4.3e-5 of it and transformers within 6.5e-5, while the two float32 programs
    drifted up to 1.1e-4 apart (bounded here at 3e-4). Wrong constants move the reference far
    more on these shapes: a tenfold norm epsilon by 0.2-0.6, one layer's decay (A_log) scaled by
    1.01 by 7e-3-4e-2."""
    name, seed, m, d = hf_pair
    km = kestrel.load(d, device="cpu")
    toks = rng.integers(0, km.cfg.vocab_size, 48)
    with torch.no_grad():
        hf = m(torch.tensor(toks)[None]).logits[0].double().numpy()
    eng = kestrel.Engine(km, max_seq=64, mmax=4)
    got = np.concatenate([eng.prefill(toks[:20]).logits] +
                         [eng.step_m(20 + 4 * i, toks[20 + 4 * i:24 + 4 * i]).logits for i in range(7)])
    want = reference_logits(km, toks)

    def err(x):
        return np.linalg.norm(x - want) / np.linalg.norm(want)

    assert err(hf) <= 5e-4, ("transformers against the float64 reference", name, seed, err(hf))
    assert err(got) <= 2e-4, ("kestrel against the float64 reference", name, seed, err(got))
    apart = np.linalg.norm(got - hf) / np.linalg.norm(hf)
    assert apart <= 3e-4, ("kestrel against transformers", name, seed, apart)


def test_greedy_streams_agree(hf_pair, rng):
    """kestrel's greedy stream equals transformers' generate(), except past a float64 near-tie.
    A random tiny model can fall into a cycle of two or three tokens from some prompt; such a
    stream proves little, so prompts are drawn until one gives a varied stream (up to 6), and
    every stream drawn on the way is compared too."""
    name, seed, m, d = hf_pair
    km = kestrel.load(d, device="cpu")
    varied = []
    for _ in range(6):
        prompt = rng.integers(0, km.cfg.vocab_size, 6)
        with torch.no_grad():
            # an explicit all-ones mask: otherwise generate() treats prompt tokens equal to pad_token_id as padding
            out = m.generate(torch.tensor(prompt)[None], attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=32, do_sample=False, min_new_tokens=32, eos_token_id=None, pad_token_id=0)
        hf_stream = out[0, len(prompt):].tolist()
        ours = kestrel.generate(km, prompt.tolist(), 32)
        if ours != hf_stream:
            # Two float32 programs may part only where float64 can barely tell the two tokens apart:
            # at the first difference, the reference's logits of both must be within float32 rounding.
            j = next(i for i, (a, b) in enumerate(zip(ours, hf_stream)) if a != b)
            row = reference_logits(km, list(prompt) + hf_stream[:j])[-1]
            gap = abs(row[ours[j]] - row[hf_stream[j]]) / np.linalg.norm(row)
            assert gap <= 5e-4, ("streams differ where the float64 reference is decided", name, seed, j, gap)
        varied.append(len(set(hf_stream)) > 3)
        if varied[-1]:
            break
    assert any(varied), "every stream degenerate: the comparison would prove little"


def test_mtp_head_vs_float64(hf_pair, rng, tmp_path):
    """Add random mtp.* tensors to the transformers checkpoint; transformers still loads it,
    and kestrel's mtp_step matches the float64 reference of the MTP head's math."""
    name, seed, m, d = hf_pair
    t = read_safetensors(d / "model.safetensors")
    cfg0 = kestrel.load(d, device="cpu").cfg
    cfg = cfg0.replace(mtp_layers=1)
    from kestrel.program import expected_shapes
    from kestrel.weights import random_weights
    mtp = {n: a for n, a in random_weights(cfg, seed=int(rng.integers(1 << 30))).items() if n.startswith("mtp.")}
    t.update(mtp)
    write_safetensors(tmp_path / "model.safetensors", t)
    import json
    hfcfg = json.loads((d / "config.json").read_text())
    hfcfg["mtp_num_hidden_layers"] = 1
    (tmp_path / "config.json").write_text(json.dumps(hfcfg))
    Qwen3_5ForCausalLM.from_pretrained(tmp_path)  # transformers ignores mtp.* and loads the rest
    km = kestrel.load(tmp_path, device="cpu")
    assert set(km.w) == set(expected_shapes(cfg))
    eng = kestrel.Engine(km, max_seq=32)
    toks = rng.integers(0, cfg.vocab_size, 10)
    hs = eng.prefill(toks).hidden
    ref = Reference(cfg, km.w)
    got = [eng.mtp_step(0, toks[1:6], hs[:5]).logits]
    for j in range(5, 9):
        got.append(eng.mtp_step(j, int(toks[j + 1]), hs[j]).logits[None])
    got = np.concatenate(got)
    want = np.stack([ref.mtp_step(int(toks[j + 1]), hs[j].astype(np.float64), j)[1] for j in range(9)])
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-4
