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

#endif  // RNN_CELL_OPS_CUH
