"""The peer benchmark's weight handover (scripts/bench_peer.py): transformers' Qwen3.5 built on
kestrel's own tensors computes kestrel's function, so the peer's timings are of the same model."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import kestrel

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bench_peer", ROOT / "scripts" / "bench_peer.py")
bench_peer = importlib.util.module_from_spec(spec)
sys.modules["bench_peer"] = bench_peer
spec.loader.exec_module(bench_peer)


@pytest.mark.parametrize("preset", ["test-a", "test-b"])
def test_peer_holds_kestrels_weights(preset, rng):
    """Fresh random weights and prompt each run: the peer's prompt logits within float32 rounding
    of kestrel's, and the same greedy stream. A tensor handed over under the wrong name, or a
    norm's +1 shift applied twice, moves the logits by far more than the bound."""
    seed = int(rng.integers(0, 2 ** 31))
    model = kestrel.load(preset, device="cpu", seed=seed)
    prompt = [int(t) for t in rng.integers(0, model.cfg.vocab_size, 12)]
    peer = bench_peer.peer_model(model, torch)
    stream, _, logits = bench_peer.peer_decode(peer, torch, prompt, 6)
    eng = kestrel.Engine(model, max_seq=32, mmax=1)
    ref = eng.prefill(prompt).logits
    assert np.abs(logits - ref).max() < 1e-3 * max(1.0, np.abs(ref).max())
    assert stream == kestrel.generate(model, prompt, 6)


def test_peer_handover_is_checked(rng):
    """The negative control: a peer handed one wrong tensor (a norm weight shifted by 0.5, as a
    handover that added the +1 of a zero-centred norm twice would) is caught by the bound above."""
    model = kestrel.load("test-a", device="cpu", seed=int(rng.integers(0, 2 ** 31)))
    prompt = [int(t) for t in rng.integers(0, model.cfg.vocab_size, 12)]
    name = "layers.0.input_layernorm.weight"
    w = dict(model.w)
    w[name] = w[name] + np.float32(0.5)
    bad = kestrel.model.Model(model.cfg, w, model.be)
    peer = bench_peer.peer_model(bad, torch)
    _, _, logits = bench_peer.peer_decode(peer, torch, prompt, 1)
    ref = kestrel.Engine(model, max_seq=32, mmax=1).prefill(prompt).logits
    assert np.abs(logits - ref).max() > 1e-3 * max(1.0, np.abs(ref).max())


def test_quick_run_writes_a_file_the_reader_loads(tmp_path):
    """bench_peer's CPU run writes its results (every stage saves), the peer family's reader loads
    them, and a file whose first row is not kestrel's measured greedy decoding is refused."""
    import json
    from kestrel.lab import results
    from kestrel.lab.checks import ResultsFileError
    path = bench_peer.main(["--quick", "--preset", "test-a", "--no-compile", "--out", str(tmp_path)])
    rec = results.load(path)
    assert rec.kestrel_greedy.decoder == "kestrel" and rec.kestrel_greedy.ms_per_token > 0
    assert rec.peer_best() is not None and rec.peer_best().decoder == "transformers"
    assert any(r.bit_exact for r in rec.rows if r.setting.startswith("speculative"))
    d = json.loads(path.read_text())
    d["rows"] = d["rows"][1:]
    bad = tmp_path / "bench_peer_bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ResultsFileError, match="first row"):
        results.load(bad)
