"""One module per op. Each holds the NumPy twin (the CPU reference, float32) of a CUDA
kernel in kernels/<op>.cu; the CuPy launcher sits beside it when the CUDA backend is built.

Every op works on row blocks [M, ...] and computes each row with the same arithmetic,
whatever M is: that is the batch invariance of SPEC §3.
"""
