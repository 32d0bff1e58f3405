"""The embedded model: loads offline, agrees with transformers, reproduces its training record."""
import json

import numpy as np
import pytest

import kestrel

TINY = kestrel.ASSETS / "tiny"


@pytest.fixture(scope="module")
def tiny():
    return kestrel.load("tiny", device="cpu")


def test_loads_offline_with_its_tokenizer(tiny):
    assert tiny.cfg.vocab_size == 256 and tiny.has_mtp
    assert len(tiny.cfg.gdn_layers) == 3 * len(tiny.cfg.attn_layers)  # the Qwen3.5 proportion
    assert tiny.tokenizer.decode(tiny.tokenizer.encode("def f(x):\n")) == "def f(x):\n"
    assert len(kestrel.starts()) == 6


def test_greedy_completions_match_the_training_record(tiny):
    """The six starts, 64 bytes each, exactly as transformers generated them on the GPU at training time."""
    record = json.loads((TINY / "training_record.json").read_text())
    assert [c["start"] for c in record["completions"]] == kestrel.starts()
    for c in record["completions"]:
        prompt = tiny.tokenizer.encode(c["start"])
        assert kestrel.generate(tiny, prompt, 64) == c["completion_bytes"], c["start"]


def test_transformers_agrees(tiny, rng):
    torch = pytest.importorskip("torch")
    from transformers import Qwen3_5ForCausalLM
    hf = Qwen3_5ForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    start = kestrel.starts()[int(rng.integers(6))]
    toks = tiny.tokenizer.encode(start) + [int(t) for t in rng.integers(32, 127, 40)]
    with torch.no_grad():
        ref = hf(torch.tensor(toks)[None]).logits[0].double().numpy()
    got = kestrel.Engine(tiny, max_seq=128).prefill(toks).logits
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 1e-4
