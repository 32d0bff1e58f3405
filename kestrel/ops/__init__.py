"""One module per op. Each holds the NumPy twin (the CPU reference, float32) of a CUDA
kernel in kernels/<op>.cu; the CuPy launcher sits beside it when the CUDA backend is built.

Every op works on row blocks [M, ...] and computes each row with the same arithmetic,
whatever M is: row j of an M-row call is bit-identical to the same row alone (batch invariance).
"""
