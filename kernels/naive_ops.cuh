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

__device__ __forceinline__ double softplusf_(double x) { return fmax(x, 0.0) + log1p(exp(-fabs(x))); }
__device__ __forceinline__ double log_sigmoidf_(double x) { return fmin(x, 0.0) - log1p(exp(-fabs(x))); }
__device__ __forceinline__ double siluf_(double x) { return x * sigmoidf_(x); }
__device__ __forceinline__ double silu_gradf_(double x) { const double s = sigmoidf_(x); return s * (1.0 + x * (1.0 - s)); }
__device__ __forceinline__ double geluf_(double x) {
  return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
__device__ __forceinline__ double gelu_gradf_(double x) {
  const double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
__device__ __forceinline__ double maxf_(double a, double b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ double minf_(double a, double b) { return (a < b || a != a) ? a : b; }

#endif  // ENGINE_NAIVE_OPS_CUH
