"""Which kernels a CUDA backend runs: chosen once, when the backend (and so the model) is made.

    kestrel.load("qwen3.5-27b", device="cuda", dtype="bf16", kernels={"gemv": "fma"})
    CUDABackend(kernels=KernelOptions(gemv="fma"))

gemv picks the reduction order of every bf16 projection (kestrel/ops/linear.py: "tmb", the default,
or "fma"; they differ in the last bits, so one engine uses one throughout). gdn_recur names the
recurrence kernel the backend prefers (kestrel/ops/gdn.py; all three give the same bits). pdl turns
programmatic dependent launch in CUDA graphs on or off (None: on where the GPU has it, sm_90 and
later); pdl_order is the order of a kernel's two PDL calls (kernels/common.cuh, griddep_enter),
"launch-first" or "wait-first", by default the one its GEMV runs fastest with (PDL_ORDER_OF_GEMV;
scheduling only, never the bits). tiled_only (under gemv="tmb" only; on by default) keeps each
projection matrix only as its tiled copy: the originals are dropped once tiled, so the weights take
their size once instead of twice (the 27B shape then fits an 80 GB card), and reading a projection
back from model.w is refused (CUDABackend.tiled; the tied embedding keeps its rows);
tiled_only=False keeps the rows too, for code that reads them (scripts/bench_peer.py hands them to
transformers). Unset fields take the defaults kestrel.settings reads (KESTREL_BF16_GEMV,
KESTREL_TILED_ONLY). Plans, lowering and results files read the options from the backend: nothing
else in the process decides a kernel.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .. import settings
from ..errors import DeviceError
from ..ops.gdn import GDN_RECUR_VARIANTS
from ..nvrtc import PDL_ORDERS
from ..ops.linear import GEMVS

# The PDL order each GEMV runs fastest with (results/cuda_notes.md, "PDL order"): the tiled
# tensor-core GEMV's blocks are large, so it wants at most one kernel launched ahead.
PDL_ORDER_OF_GEMV = {"fma": "launch-first", "tmb": "wait-first"}


@dataclass(frozen=True)
class KernelOptions:
    gemv: str | None = None
    gdn_recur: str | None = None
    pdl: bool | None = None
    pdl_order: str | None = None
    tiled_only: bool | None = None

    def __post_init__(self):
        if self.gemv is not None and self.gemv not in GEMVS:
            raise DeviceError(f"kernel option gemv={self.gemv!r}: expected one of {', '.join(GEMVS)}")
        if self.gdn_recur is not None and self.gdn_recur not in GDN_RECUR_VARIANTS:
            raise DeviceError(f"kernel option gdn_recur={self.gdn_recur!r}: expected one of "
                              f"{', '.join(GDN_RECUR_VARIANTS)}")
        if self.pdl is not None and not isinstance(self.pdl, bool):
            raise DeviceError(f"kernel option pdl={self.pdl!r}: expected True, False or None")
        if self.pdl_order is not None and self.pdl_order not in PDL_ORDERS:
            raise DeviceError(f"kernel option pdl_order={self.pdl_order!r}: expected one of {', '.join(PDL_ORDERS)}")
        if self.tiled_only is not None and not isinstance(self.tiled_only, bool):
            raise DeviceError(f"kernel option tiled_only={self.tiled_only!r}: expected True, False or None")
        if self.gemv is not None:
            self._check_tiled_only(self.gemv)

    def _check_tiled_only(self, gemv: str):
        if self.tiled_only and gemv != "tmb":
            raise DeviceError(f"kernel option tiled_only=True needs gemv='tmb' (the tiled copy is its kernel's "
                              f"layout), not gemv={gemv!r}")

    @classmethod
    def of(cls, kernels) -> "KernelOptions":
        """KernelOptions from None, a dict of its fields, or KernelOptions itself."""
        if kernels is None:
            return cls()
        if isinstance(kernels, cls):
            return kernels
        if isinstance(kernels, dict):
            names = {f.name for f in fields(cls)}
            unknown = sorted(set(kernels) - names)
            if unknown:
                raise DeviceError(f"unknown kernel option(s) {unknown}: expected {sorted(names)}")
            return cls(**kernels)
        raise DeviceError(f"kernels must be None, a dict or KernelOptions, got {type(kernels).__name__}")

    def resolved(self, pdl_supported: bool) -> "KernelOptions":
        """Every field set: the given ones, else the defaults kestrel.settings reads;
        pdl only where the GPU supports it."""
        gemv = self.gemv or settings.get("KESTREL_BF16_GEMV")
        recur = self.gdn_recur or settings.get("KESTREL_GDN_RECUR")
        pdl = self.pdl if self.pdl is not None else settings.get("KESTREL_PDL") != "0"
        order = self.pdl_order or settings.get("KESTREL_PDL_ORDER") or PDL_ORDER_OF_GEMV.get(gemv, "launch-first")
        self._check_tiled_only(gemv)     # the GEMV may have come from the defaults
        tiled_only = self.tiled_only if self.tiled_only is not None else (
            gemv == "tmb" and settings.get("KESTREL_TILED_ONLY") != "0")
        return KernelOptions(gemv=gemv, gdn_recur=recur, pdl=bool(pdl) and pdl_supported, pdl_order=order,
                             tiled_only=bool(tiled_only))

    def as_dict(self) -> dict:
        return asdict(self)
