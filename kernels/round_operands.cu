// A GEMM operand of the fused training step rounded to a reduced precision mode before cuBLAS multiplies it
// (engine/autodiff/cublas.py, Sgemm in tf32, float16 or bfloat16): src is an fp32 matrix stored column-major,
// rows x cols with leading dimension ld; dst is the same matrix compact (leading dimension rows) in the mode's
// format: tf32 as fp32 bit patterns with the low 13 bits zero (cvt.rna: nearest, ties away from zero), fp16 and
// bf16 as 16-bit patterns (cvt.rn: nearest, ties to even). The roundings are engine/rounding.py's, so cuBLAS then
// multiplies exactly the values the NumPy emulation multiplies, whatever conversion its kernel would have made.
__device__ __forceinline__ long round_operand_source(long idx, int rows, long ld)
{
    const long c = idx / rows;
    return c * ld + (idx - c * rows);
}

extern "C" __global__ void round_operand_tf32(const float* __restrict__ src, float* __restrict__ dst, const int rows,
                                              const int cols, const long ld)
{
    const long total = (long)rows * cols;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        unsigned bits;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(bits) : "f"(src[round_operand_source(idx, rows, ld)]));
        dst[idx] = __uint_as_float(bits);
    }
}

extern "C" __global__ void round_operand_fp16(const float* __restrict__ src, unsigned short* __restrict__ dst,
                                              const int rows, const int cols, const long ld)
{
    const long total = (long)rows * cols;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(src[round_operand_source(idx, rows, ld)]));
        dst[idx] = h;
    }
}

extern "C" __global__ void round_operand_bf16(const float* __restrict__ src, unsigned short* __restrict__ dst,
                                              const int rows, const int cols, const long ld)
{
    const long total = (long)rows * cols;
    for (long idx = (long)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (long)gridDim.x * blockDim.x) {
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(src[round_operand_source(idx, rows, ld)]));
        dst[idx] = h;
    }
}
