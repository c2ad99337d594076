// A GEMM operand of the fused training step rounded to a reduced precision mode before cuBLAS multiplies it
// (engine/autodiff/cublas.py, Sgemm in tf32, float16 or bfloat16): src is an fp32 matrix stored column-major,
// rows x cols with leading dimension ld; dst is the same matrix compact (leading dimension rows) in the mode's
// format: tf32 as fp32 bit patterns with the low 13 bits zero, fp16 and bf16 as 16-bit patterns. The roundings are
// kernels/tile_gemm.cuh's (rnn_tf32_bits: nearest, ties away; rnn_bits16: nearest, ties to even), which
// engine/autodiff/cublas.py inlines before this file: engine/rounding.py's, so cuBLAS then multiplies exactly the
// values the NumPy emulation multiplies, whatever conversion its kernel would have made.
template <int MODE, typename OUT>
__device__ __forceinline__ void round_operand(const float* __restrict__ src, OUT* __restrict__ dst, const int rows,
                                              const int cols, const long ld)
{
    const long total = (long)rows * cols;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        const long c = idx / rows;
        const float v = src[c * ld + (idx - c * rows)];
        if constexpr (MODE == RNN_TF32) dst[idx] = __uint_as_float(rnn_tf32_bits(v));
        else dst[idx] = rnn_bits16<MODE>(v);
    }
}

// The entry points engine/autodiff/cublas.py OPERANDS names, one a mode.
#define ROUND_OPERAND_ENTRY(NAME, MODE, OUT)                                                                         \
    extern "C" __global__ void NAME(const float* __restrict__ src, OUT* __restrict__ dst, const int rows,         \
                                    const int cols, const long ld)                                                \
    {                                                                                                               \
        round_operand<MODE>(src, dst, rows, cols, ld);                                                              \
    }
ROUND_OPERAND_ENTRY(round_operand_tf32, RNN_TF32, float)
ROUND_OPERAND_ENTRY(round_operand_fp16, RNN_FP16, unsigned short)
ROUND_OPERAND_ENTRY(round_operand_bf16, RNN_BF16, unsigned short)
#undef ROUND_OPERAND_ENTRY

// A C-contiguous fp32 array of 4 n4 elements rounded the same way, 16 bytes a thread at a time (the schedules' input
// projections, engine/schedules/project.py round_activations): tf32 as fp32 bit patterns, fp16 and bf16 as 16-bit
// patterns. Element by element, a CuPy elementwise kernel moved x at 1.2 TB/s (41 us for one LSTM layer's x at
// B = 16, T = 1024, I = 512, H200, 2026-11-27).
template <int MODE>
__device__ __forceinline__ void round_contiguous(const float4* __restrict__ src, void* __restrict__ dst, const long n4)
{
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (long)gridDim.x * blockDim.x) {
        const float4 v = src[i];
        if constexpr (MODE == RNN_TF32) {
            reinterpret_cast<float4*>(dst)[i] = make_float4(__uint_as_float(rnn_tf32_bits(v.x)),
                                                            __uint_as_float(rnn_tf32_bits(v.y)),
                                                            __uint_as_float(rnn_tf32_bits(v.z)),
                                                            __uint_as_float(rnn_tf32_bits(v.w)));
        } else {
            reinterpret_cast<uint2*>(dst)[i] = make_uint2(rnn_bits16<MODE>(v.x) | ((unsigned)rnn_bits16<MODE>(v.y) << 16),
                                                          rnn_bits16<MODE>(v.z) | ((unsigned)rnn_bits16<MODE>(v.w) << 16));
        }
    }
}
#define ROUND_CONTIGUOUS_ENTRY(NAME, MODE)                                                                          \
    extern "C" __global__ void NAME(const float4* __restrict__ src, void* __restrict__ dst, const long n4)         \
    {                                                                                                               \
        round_contiguous<MODE>(src, dst, n4);                                                                       \
    }
ROUND_CONTIGUOUS_ENTRY(round_contiguous_tf32, RNN_TF32)
ROUND_CONTIGUOUS_ENTRY(round_contiguous_fp16, RNN_FP16)
ROUND_CONTIGUOUS_ENTRY(round_contiguous_bf16, RNN_BF16)
#undef ROUND_CONTIGUOUS_ENTRY

// A C-contiguous fp32 array of n elements rounded the same way into an fp32 array: the values the mode multiplies,
// held as floats (engine/rounding.py round_like on the GPU: the training step's interpreted matmuls, whose CuPy
// spelling took eight elementwise launches, 2-3 ms of a bf16 sLSTM step at B = 16, T = 1024). 16 bytes a thread,
// the last n % 4 elements one a thread.
template <int MODE>
__device__ __forceinline__ void round_values(const float* __restrict__ src, float* __restrict__ dst, const long n)
{
    const long n4 = n / 4, step = (long)gridDim.x * blockDim.x;
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += step) {
        const float4 v = reinterpret_cast<const float4*>(src)[i];
        reinterpret_cast<float4*>(dst)[i] = rnn_operand4<MODE>(v);
    }
    for (long i = 4 * n4 + (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = rnn_operand<MODE>(src[i]);
}
#define ROUND_VALUES_ENTRY(NAME, MODE)                                                                              \
    extern "C" __global__ void NAME(const float* __restrict__ src, float* __restrict__ dst, const long n)         \
    {                                                                                                               \
        round_values<MODE>(src, dst, n);                                                                            \
    }
ROUND_VALUES_ENTRY(round_values_tf32, RNN_TF32)
ROUND_VALUES_ENTRY(round_values_fp16, RNN_FP16)
ROUND_VALUES_ENTRY(round_values_bf16, RNN_BF16)
#undef ROUND_VALUES_ENTRY
