"""A CUDA backend's kernel options (kestrel/cuda/options.py) and the tiled-only weight marker
(kestrel/ops/linear.py TiledOnly): validated and resolved without a GPU."""
import numpy as np
import pytest

from kestrel.cuda.options import KernelOptions
from kestrel.errors import DeviceError
from kestrel.ops.linear import TiledOnly


@pytest.mark.parametrize("bad, match", [
    ({"gemv": "cublas"}, "gemv='cublas'"),
    ({"gdn_recur": "fast"}, "gdn_recur='fast'"),
    ({"pdl": 1}, "pdl=1"),
    ({"pdl_order": "first"}, "pdl_order='first'"),
    ({"tiled_only": "yes"}, "tiled_only='yes'"),
    ({"tiled_only": True, "gemv": "fma"}, "needs gemv='tmb'"),
    ({"tiled": True}, "unknown kernel option"),
])
def test_bad_kernel_options_are_named(bad, match):
    with pytest.raises(DeviceError, match=match):
        KernelOptions.of(bad)


def test_tiled_only_resolves_under_tmb_only(monkeypatch):
    """The default engine is the tensor-core one, holding its weights once (tiled only)."""
    monkeypatch.delenv("KESTREL_BF16_GEMV", raising=False)
    monkeypatch.delenv("KESTREL_TILED_ONLY", raising=False)
    default = KernelOptions().resolved(True)
    assert (default.gemv, default.tiled_only, default.pdl_order) == ("tmb", True, "wait-first")
    assert KernelOptions(gemv="tmb", tiled_only=False).resolved(True).tiled_only is False
    assert KernelOptions(gemv="fma").resolved(True).tiled_only is False      # a default for tmb only
    assert KernelOptions(gemv="fma").resolved(True).pdl_order == "launch-first"
    monkeypatch.setenv("KESTREL_TILED_ONLY", "0")
    assert KernelOptions(gemv="tmb").resolved(True).tiled_only is False
    assert KernelOptions(gemv="tmb", tiled_only=True).resolved(True).tiled_only is True
    monkeypatch.setenv("KESTREL_BF16_GEMV", "fma")
    with pytest.raises(DeviceError, match="needs gemv='tmb'"):
        KernelOptions(tiled_only=True).resolved(True)     # the GEMV from the environment is fma


def test_tiled_only_weight_refuses_reads():
    w = TiledOnly("layers.0.mlp.down_proj.weight", (5120, 17408))
    assert w.shape == (5120, 17408) and w.dtype == np.uint16 and w.ndim == 2
    for read in (np.asarray, lambda a: a[0], lambda a: np.array(a, dtype=np.float32)):
        with pytest.raises(ValueError, match="down_proj.*only as its tiled copy"):
            read(w)
