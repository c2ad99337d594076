// Double overloads of the device helpers of cell_ops.cuh, for the naive backend's float64 mode.
//
// The naive backend (engine/backends/naive.py) pastes cell_ops.cuh and then this file in front of
// each of its one-op kernels. The float helpers are defined once, in cell_ops.cuh; the naive
// backend also runs in float64 on the GPU, as the reference the benchmark measures divergence
// against, and needs these. Their meaning is the NumPy definition in engine/ops.py; the GPU tests
// check every op in float64 against it.
#ifndef ENGINE_NAIVE_OPS_CUH
#define ENGINE_NAIVE_OPS_CUH

// sigmoid(x) = 1 / (1 + exp(-x)); exp(-x) overflows to inf for very negative x, giving the limit 0.
__device__ __forceinline__ double sigmoidf_(double x) { return 1.0 / (1.0 + exp(-x)); }

// PyTorch's Hardsigmoid: relu6(x + 3) / 6 = clip(x / 6 + 1/2, 0, 1).
__device__ __forceinline__ double hard_sigmoidf_(double x) { return fmin(fmax(x / 6.0 + 0.5, 0.0), 1.0); }

#endif  // ENGINE_NAIVE_OPS_CUH
