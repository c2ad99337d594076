// Device helpers named by the CUDA expressions of engine/ops.py ("sigmoidf_({x})", ...), for the
// kernels that engine/codegen generates. engine/codegen inlines this file into every generated
// module, so the source handed to NVRTC (CuPy) or nvcc (an exported program) stands alone.
//
// Their meaning is the NumPy definition in engine/ops.py; tests/gpu/test_fused.py checks every
// preset against the NumPy reference.
#ifndef RNN_CELL_OPS_CUH
#define RNN_CELL_OPS_CUH

// sigmoid(x) = 1 / (1 + exp(-x)). For x -> -inf, expf(-x) overflows to inf and the result is 0,
// the limit, so no branch is needed.
__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

// PyTorch's Hardsigmoid: relu6(x + 3) / 6 = clip(x / 6 + 1/2, 0, 1).
__device__ __forceinline__ float hard_sigmoidf_(float x) { return fminf(fmaxf(x / 6.0f + 0.5f, 0.0f), 1.0f); }

// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|): e^-|x| <= 1, so nothing overflows.
__device__ __forceinline__ float softplusf_(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }

// log(sigmoid(x)) = -softplus(-x) = min(x, 0) - log1p(e^-|x|).
__device__ __forceinline__ float log_sigmoidf_(float x) { return fminf(x, 0.0f) - log1pf(expf(-fabsf(x))); }

// SiLU: x * sigmoid(x), and its derivative s (1 + x (1 - s)) with s = sigmoid(x).
__device__ __forceinline__ float siluf_(float x) { return x * sigmoidf_(x); }
__device__ __forceinline__ float silu_gradf_(float x) { const float s = sigmoidf_(x); return s * (1.0f + x * (1.0f - s)); }

// GELU in its tanh form: x/2 (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); and its derivative
// (1 + t)/2 + x/2 (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), t = tanh(u).
__device__ __forceinline__ float geluf_(float x) {
  return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_gradf_(float x) {
  const float t = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

// max and min that keep a NaN of either operand (fmaxf and fminf drop it), as NumPy's maximum and minimum do:
// a NaN made in a cell reaches check_finite instead of vanishing.
__device__ __forceinline__ float maxf_(float a, float b) { return (a > b || a != a) ? a : b; }
__device__ __forceinline__ float minf_(float a, float b) { return (a < b || a != a) ? a : b; }

#endif  // RNN_CELL_OPS_CUH
