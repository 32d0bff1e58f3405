"""The whole model and its MTP head (CPU backend, the programs of kestrel/program.py) against
the independent float64 reference (tests/reference64.py); the program's checkpoint layout."""
import numpy as np

import kestrel
from kestrel.program import expected_shapes, main_program, mtp_program, param_count, stacks
from reference64 import Reference


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def test_whole_model_and_mtp_vs_float64(model, rng):
    cfg = model.cfg
    toks = rng.integers(0, cfg.vocab_size, 12)
    eng = kestrel.Engine(model, max_seq=32, mmax=3)
    s = eng.prefill(toks[:7])
    ref = Reference(cfg, model.w)
    rh, rl = zip(*[ref.step(int(t)) for t in toks[:7]])
    assert rel(s.logits, np.stack(rl)) < 1e-4 and rel(s.hidden, np.stack(rh)) < 1e-4
    s2 = eng.step_m(7, toks[7:10])
    for j in range(3):
        h, lg = ref.step(int(toks[7 + j]))
        assert rel(s2.logits[j], lg) < 1e-4
    # MTP: rows 0..4 batched, then one more row, against the reference head
    hid = rng.standard_normal((6, cfg.hidden_size)).astype(np.float32)
    mt = eng.mtp_step(0, toks[1:6], hid[:5])
    m1 = eng.mtp_step(5, int(toks[6]), hid[5])
    got = np.concatenate([mt.logits, m1.logits[None]])
    want = np.stack([ref.mtp_step(int(toks[1 + j]), hid[j].astype(np.float64), j)[1] for j in range(6)])
    assert rel(got, want) < 1e-4


def test_program_reads_every_weight_once_per_use(model):
    """Every weight the programs name exists with its shape; the stacks partition their ops'
    weights; the parameter count is the sum of the shapes."""
    cfg = model.cfg
    shapes = expected_shapes(cfg)
    assert set(shapes) == set(model.w)
    for name, s in shapes.items():
        assert tuple(model.w[name].shape) == tuple(s), name
    stacked = [n for _, names in stacks(cfg) for n in names]
    assert len(stacked) == len(set(stacked)) and set(stacked) <= set(shapes)
    assert param_count(cfg) == sum(int(np.prod(s)) for s in shapes.values())
    main = main_program(cfg)
    assert sum(op.kind == "gdn" for op in main.ops) == len(cfg.gdn_layers)
    assert sum(op.kind == "attention" for op in main.ops) == len(cfg.attn_layers)
    assert [op.state for op in mtp_program(cfg).ops if op.state] == [("mtp_kv", 0)]
