"""SwiGLU MLP core: silu(gate) * up (the projections are ops.linear)."""
from .norm import silu


def swiglu(gate, up):
    return silu(gate) * up
