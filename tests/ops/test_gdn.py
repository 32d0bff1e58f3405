"""Gated DeltaNet: the NumPy twin vs float64 (through the model program's ops), per-row slots
vs in-place steps, and kernels/gdn.cu vs its twin on a ring of state slots."""
import numpy as np
import pytest

from gpu import F32, cp, ctrl, dev, finite, go, host, needs_gpu, rel
from kestrel.ops import gdn
from kestrel.ops.gdn import GDNShape, gdn_rows
from kestrel.state import DeviceState
from reference64 import gdn_token


def _mixer_ops(model, g):
    """The program's ops of GDN layer g's mixer: in-projection, gdn, out-projection (+= x)."""
    ops = model.main_prog.ops
    i = next(n for n, op in enumerate(ops) if op.kind == "gdn" and op.state == ("gdn", g))
    return ops[i - 1:i + 2]


@pytest.mark.parametrize("m", [1, 4])
def test_gdn_mixer_vs_float64(model, rng, m):
    cfg, w = model.cfg, model.w
    g = int(rng.integers(0, len(cfg.gdn_layers)))
    p = f"layers.{cfg.gdn_layers[g]}.linear_attn"
    st = DeviceState.allocate(cfg, model.be, 8, 2, False)
    st.slot = 1
    S0 = (0.3 * rng.standard_normal(st.S.shape[2:])).astype(np.float32)
    h0 = rng.standard_normal(st.hist.shape[2:]).astype(np.float32)
    st.S[1, g], st.hist[1, g] = S0, h0
    xn = rng.standard_normal((m, cfg.hidden_size)).astype(np.float32)
    x0 = rng.standard_normal((m, cfg.hidden_size)).astype(np.float32)
    env = model.be.execute(model, model.main_prog, _mixer_ops(model, g), {"xn": xn, "x": x0.copy()}, st, 0)
    Sr, hr = S0.astype(np.float64), h0.astype(np.float64)
    ref = np.stack([gdn_token(cfg, w, p, xn[j].astype(np.float64), Sr, hr) for j in range(m)])
    assert rel(env["x"] - x0, ref) < 1e-4
    assert rel(st.S[1, g], Sr) < 1e-5 and rel(st.hist[1, g], hr) < 1e-6
    assert np.all(st.S[0] == 0)          # only the live slot was touched


def _case(rng, shape, m):
    nk, nv, dk, dv, K = shape
    sh = GDNShape(nk, nv, dk, dv, K, 1e-6)
    C = sh.C
    f = np.float32
    return sh, dict(qkv=rng.standard_normal((m, C)).astype(f), z=rng.standard_normal((m, nv * dv)).astype(f),
                    b=rng.standard_normal((m, nv)).astype(f), a=rng.standard_normal((m, nv)).astype(f),
                    cw=(rng.standard_normal((C, K)) / np.sqrt(K)).astype(f),
                    A_log=np.log(rng.uniform(1, 16, nv)).astype(f), dt=rng.uniform(-1, 1, nv).astype(f),
                    nw=(1 + 0.1 * rng.standard_normal(dv)).astype(f),
                    S0=(0.3 * rng.standard_normal((nv, dk, dv))).astype(f), h0=rng.standard_normal((C, K - 1)).astype(f))


def _twin(sh, d, S, h, S_to=None, h_to=None):
    return gdn_rows(sh, d["qkv"], d["z"], d["b"], d["a"], d["cw"], d["A_log"], d["dt"], d["nw"], S, h, S_to, h_to)


def test_gdn_slots_equal_in_place(rng):
    """Per-row checkpoint slots: slot j == the in-place state after row j; the source stays intact."""
    sh, d = _case(rng, (2, 4, 16, 16, 4), 3)
    S_slots = [np.full_like(d["S0"], np.nan) for _ in range(3)]
    h_slots = [np.full_like(d["h0"], np.nan) for _ in range(3)]
    S, h = d["S0"].copy(), d["h0"].copy()
    y_slots = _twin(sh, d, S, h, S_slots, h_slots)
    assert np.array_equal(S, d["S0"]) and np.array_equal(h, d["h0"])
    for j in range(3):
        one = {k: (v[j:j + 1] if k in ("qkv", "z", "b", "a") else v) for k, v in d.items()}
        y = _twin(sh, one, S, h)
        assert np.array_equal(y[0], y_slots[j])
        assert np.array_equal(S, S_slots[j]) and np.array_equal(h, h_slots[j])


def _kernel(be, sh, d, S_ring, h_ring, slot: int, mode: str, rows=slice(None), variant=None):
    """gdn_conv + gdn_recur exactly as the lowered plan launches them: one stacked input row
    [qkv | z | b | a], the state in a ring of slots, the live slot from the ctrl block."""
    gin = np.concatenate([d["qkv"][rows], d["z"][rows], d["b"][rows], d["a"][rows]], axis=1)
    m, width, C, K, nvdv, nv = gin.shape[0], gin.shape[1], sh.C, sh.K, sh.nv * sh.dv, sh.nv
    G = dev(gin)
    xc, y = be.empty((m, C)), be.empty((m, nvdv))
    c = ctrl(0, slot)
    n = S_ring.shape[0]
    go(be, gdn.gdn_conv_launch(G, width, dev(d["cw"]), xc, C, h_ring, h_ring[0].size, n, mode, c, m, C, K))
    go(be, gdn.gdn_recur_launch(xc, C, G[:, C:], width, G[:, C + nvdv:], width, G[:, C + nvdv + nv:], width,
                                dev(d["A_log"]), dev(d["dt"]), dev(d["nw"]), y, nvdv, S_ring, S_ring[0].size, n,
                                mode, c, m, sh, variant=variant or gdn.gdn_recur_variant(sh.dk, sh.dv)))
    return host(y)


@pytest.mark.parametrize("shape", [(2, 4, 16, 16, 4), (2, 2, 8, 12, 3), (2, 4, 128, 128, 4), (1, 3, 64, 32, 2)])
@pytest.mark.parametrize("m", [1, 3, 4])
@pytest.mark.parametrize("mode", ["in_place", "checkpoint", "cache"])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gdn_kernel(be, rng, shape, m, mode):
    """conv + gates + l2norm + delta rule + gated norm for M rows on a ring of m+1 slots whose
    live slot is drawn at random: in place, row j's state into slot live+1+j, or read only."""
    checkpoint = mode == "checkpoint"
    sh, d = _case(rng, shape, m)
    n = m + 1
    slot = int(rng.integers(0, n))
    S_ring = cp.full((n,) + d["S0"].shape, np.nan, np.float32)
    h_ring = cp.full((n,) + d["h0"].shape, np.nan, np.float32)
    S_ring[slot], h_ring[slot] = dev(d["S0"]), dev(d["h0"])
    S_c, h_c = d["S0"].copy(), d["h0"].copy()
    Ss_c = [np.full_like(S_c, np.nan) for _ in range(m)] if checkpoint else None
    hs_c = [np.full_like(h_c, np.nan) for _ in range(m)] if checkpoint else None
    want = _twin(sh, d, S_c, h_c, Ss_c, hs_c)
    got = _kernel(be, sh, d, S_ring, h_ring, slot, mode)
    assert np.all(np.isfinite(got)) and rel(got, want) < F32
    Sg, hg = host(S_ring), host(h_ring)
    if checkpoint:
        assert np.array_equal(Sg[slot], d["S0"]) and np.array_equal(hg[slot], d["h0"])   # live slot only read
        for j in range(m):
            r = (slot + 1 + j) % n
            assert finite(Sg[r]) and rel(Sg[r], Ss_c[j]) < F32, j
            assert rel(hg[r], hs_c[j]) < F32, j
        # the state after row j (slot live+1+j) == the state after j+1 single-row in-place calls
        S1 = cp.full_like(S_ring, np.nan)
        h1 = cp.full_like(h_ring, np.nan)
        S1[0], h1[0] = dev(d["S0"]), dev(d["h0"])
        for j in range(m):
            r1 = _kernel(be, sh, d, S1, h1, 0, "in_place", rows=slice(j, j + 1))
            assert np.array_equal(r1[0], got[j])
            r = (slot + 1 + j) % n
            assert np.array_equal(host(S1[0]), Sg[r]) and np.array_equal(host(h1[0]), hg[r])
    elif mode == "cache":              # the rows computed on a private copy: nothing written back
        assert np.array_equal(Sg[slot], d["S0"]) and np.array_equal(hg[slot], d["h0"])
        others = [s for s in range(n) if s != slot]
        assert np.all(np.isnan(Sg[others])) and np.all(np.isnan(hg[others]))
        S1, h1 = cp.full_like(S_ring, np.nan), cp.full_like(h_ring, np.nan)
        S1[0], h1[0] = dev(d["S0"]), dev(d["h0"])
        assert np.array_equal(_kernel(be, sh, d, S1, h1, 0, "in_place"), got)       # the same rows, bit for bit
    else:
        assert rel(Sg[slot], S_c) < F32 and rel(hg[slot], h_c) < F32
        others = [s for s in range(n) if s != slot]
        assert np.all(np.isnan(Sg[others])) and np.all(np.isnan(hg[others]))            # no other slot written


@pytest.mark.parametrize("shape,m", [((2, 4, 128, 128, 4), 1), ((2, 4, 128, 128, 4), 2), ((2, 4, 128, 128, 4), 4),
                                     ((2, 4, 128, 128, 4), 11), ((16, 48, 128, 128, 4), 5)])
@pytest.mark.parametrize("mode", ["in_place", "checkpoint", "cache"])
@pytest.mark.usefixtures("poison")
@needs_gpu
def test_gdn_recur_variants_are_bit_identical(be, rng, shape, m, mode):
    """gdn_recur (S in shared memory), gdn_recur_regs (S in registers, a head per block) and
    gdn_recur_cluster (a head's columns over a cluster of blocks; rows in chunks of
    GDN_RECUR_ROWS, so m = 11 crosses a chunk): the same outputs and the same state in every
    slot, bit for bit. The 27B shape (16 key heads, 48 value heads) runs 48 clusters."""
    sh, d = _case(rng, shape, m)
    assert gdn.gdn_recur_in_registers(sh.dk, sh.dv)
    n = m + 1
    slot = int(rng.integers(0, n))
    out = []
    variants = gdn.gdn_recur_runnable(sh.dk, sh.dv)
    for variant in variants:
        S_ring = cp.full((n,) + d["S0"].shape, np.nan, np.float32)
        h_ring = cp.full((n,) + d["h0"].shape, np.nan, np.float32)
        S_ring[slot], h_ring[slot] = dev(d["S0"]), dev(d["h0"])
        y = _kernel(be, sh, d, S_ring, h_ring, slot, mode, variant=variant)
        out.append((y, host(S_ring), host(h_ring)))
    y0, S0, h0 = out[0]
    assert finite(y0)
    for variant, (y1, S1, h1) in zip(variants[1:], out[1:]):
        assert np.array_equal(y0, y1), variant
        assert np.array_equal(S0, S1, equal_nan=True) and np.array_equal(h0, h1, equal_nan=True), variant


def test_gdn_recur_variant_choice():
    """The register kernels only for their compiled head dims; anything else runs gdn_recur. A
    backend's preference is taken where it can run, else the next kernel that can; a kernel named
    for one launch is refused where it cannot run."""
    assert gdn.gdn_recur_in_registers(128, 128) and not gdn.gdn_recur_in_registers(64, 32)
    assert gdn.gdn_recur_smem(128, 128, regs=True) < gdn.gdn_recur_smem(128, 128)
    assert gdn.gdn_recur_variant(64, 32, cc=90) == "smem"
    assert gdn.gdn_recur_variant(128, 128, cc=90) == gdn.GDN_RECUR_DEFAULT == "cluster"
    for v in gdn.GDN_RECUR_VARIANTS:
        assert gdn.gdn_recur_variant(128, 128, v, cc=90) == v == gdn.check_gdn_recur_variant(128, 128, v, cc=90)
        assert gdn.gdn_recur_variant(64, 32, v, cc=90) == "smem"
    for v in ("cluster", "regs"):
        with pytest.raises(ValueError, match="compiled for dk, dv = 128, 128, not 64, 32"):
            gdn.check_gdn_recur_variant(64, 32, v, cc=90)
    for choose in (gdn.gdn_recur_variant, gdn.check_gdn_recur_variant):
        with pytest.raises(ValueError, match="variant 'fast'"):
            choose(128, 128, "fast", cc=90)
    # before sm_90 (no thread-block clusters): the preference falls back to the one-block kernel,
    # and a launch naming the cluster kernel is refused
    assert gdn.gdn_recur_variant(128, 128, cc=80) == "regs"
    with pytest.raises(ValueError, match="needs thread-block clusters .* this GPU is sm_80"):
        gdn.check_gdn_recur_variant(128, 128, "cluster", cc=80)
    assert gdn.gdn_recur_runnable(128, 128, cc=90) == gdn.GDN_RECUR_VARIANTS
    assert gdn.gdn_recur_runnable(128, 128, cc=80) == ("regs", "smem")
    assert gdn.gdn_recur_runnable(64, 32) == ("smem",)            # no device asked: nothing depends on it
