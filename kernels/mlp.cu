// kernels/mlp.cu: SwiGLU core (NumPy twin and launcher: kestrel/ops/mlp.py), y = silu(gate) · up, elementwise.
//
// Math     y[i] = (g[i] / (1 + exp(-g[i]))) · u[i]   (fp32)
// Layout   flat contiguous arrays of n elements (the fused decode path does this in the
//          epilogue of the gate|up projection instead: linear.cu, EPI = 2, same formula).
// Launch   grid-stride loop, block = MLP_THREADS.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(MLP_THREADS) swiglu(const float* __restrict__ g, const float* __restrict__ u,
                                                         float* __restrict__ y, i64 n) {
    griddep_enter();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        y[i] = silu_f(g[i]) * u[i];
}
